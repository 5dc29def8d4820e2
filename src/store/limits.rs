//! How many files a mount may keep open. Every shard in the index cache holds its file
//! open, so the cache must stay below the process's `RLIMIT_NOFILE`: with the common
//! soft limit of 1024 and a cache of 4096 shards, reading a store of more than about a
//! thousand shards failed with `EMFILE`, which the view reports as `EIO`.

/// Descriptors left for everything but cached shards: the FUSE channels, open store
/// files and directories, listings, shard updates.
const RESERVED: u64 = 256;

/// Raise the soft `RLIMIT_NOFILE` to the hard limit (as long-running servers that need
/// many descriptors do) and return the soft limit now in force.
pub fn raise_open_files() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the local struct only.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// The most shards the index cache may hold open under a descriptor limit of `limit`:
/// three quarters of what is left after [`RESERVED`], and at least 16.
pub fn cached_shards_within(limit: u64) -> usize {
    let usable = limit.saturating_sub(RESERVED) / 4 * 3;
    usize::try_from(usable).unwrap_or(usize::MAX).max(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_stays_under_the_descriptor_limit() {
        assert_eq!(cached_shards_within(1024), 576);
        assert!(cached_shards_within(1 << 20) > 4096);
        assert_eq!(cached_shards_within(100), 16);
        assert!(cached_shards_within(u64::MAX) >= 1 << 30);
    }

    #[test]
    fn raising_never_lowers_the_limit() {
        let before = {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: as above.
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
            lim.rlim_cur
        };
        assert!(raise_open_files() >= before);
    }
}
