//! The cache policy: what the kernel may keep, and for how long. The FUSE adapter asks
//! here for every TTL and keep-cache decision; nothing about caching is decided in
//! `fuse.rs`.
//!
//! - Entries and attributes are cached for the mount's `--ttl`, except attributes marked
//!   volatile (files being written), which are not cached at all.
//! - The absence of a name is cached for at most [`NEGATIVE_TTL`], so a chunk or file
//!   that another program adds to the store is seen within it, whatever `--ttl` is.
//!
//! The times come from the mount's [`Freshness`], the one policy of every cache.
//! - At an open, the kernel keeps the pages it cached for a chunk only if the chunk is
//!   served from the same range of the same shard version as at the inode's last open.
//! - An open that finds a chunk of another size than the one last reported asks the
//!   kernel to drop its cached attributes.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use crate::format::ChunkRange;

use super::Attr;

use crate::freshness::Freshness;
pub use crate::freshness::NEGATIVE_TTL;

/// Segments of the map of reported sizes.
const SEGMENTS: usize = 16;

/// What a chunk inode served at its last open: its range and the shard file's version.
type Served = (ChunkRange, Option<(u64, u64, SystemTime)>);

/// See the module documentation.
#[derive(Default)]
pub struct CachePolicy {
    ttl: Duration,
    negative: Duration,
    /// What each chunk inode served at its last open: unchanged means keep the page cache.
    served: Mutex<HashMap<u64, Served>>,
    /// The size each chunk inode had in the attributes last given to the kernel, which
    /// caches them for the TTL: an open that finds another size says so.
    /// In segments by inode: a read-only mount looks here at every chunk read
    /// ([`CachePolicy::reported_size`]), from many FUSE threads at once.
    reported: [Mutex<HashMap<u64, u64>>; SEGMENTS],
}

impl CachePolicy {
    pub fn new(freshness: Freshness) -> Self {
        CachePolicy {
            ttl: freshness.ttl,
            negative: freshness.negative,
            ..Default::default()
        }
    }

    fn reported(&self, ino: u64) -> &Mutex<HashMap<u64, u64>> {
        &self.reported[ino as usize % SEGMENTS]
    }

    /// The mount's `--ttl`.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How long the kernel may cache these attributes (and the entry that carries them).
    pub fn attr_ttl(&self, a: &Attr) -> Duration {
        if a.volatile { Duration::ZERO } else { self.ttl }
    }

    /// How long the kernel may cache the absence of a name.
    pub fn negative_ttl(&self) -> Duration {
        self.negative
    }

    /// An open of chunk inode `ino` serves `now`: whether the kernel may keep the pages
    /// it cached at the inode's last open.
    pub(super) fn keep_pages(&self, ino: u64, now: Served) -> bool {
        self.served.lock().insert(ino, now) == Some(now)
    }

    /// Chunk inode `ino` is served from somewhere that is not a shard (staged bytes):
    /// its next open must not keep pages.
    pub(super) fn not_served(&self, ino: u64) {
        self.served.lock().remove(&ino);
    }

    /// Chunk inode `ino` has `len` bytes in the attributes given to the kernel now;
    /// whether that differs from the size reported before.
    pub(super) fn report_size(&self, ino: u64, len: u64) -> bool {
        self.reported(ino)
            .lock()
            .insert(ino, len)
            .is_some_and(|was| was != len)
    }

    /// A read of chunk inode `ino` ended short at `end`: the kernel takes that for the
    /// file's end (it shrinks the size it holds, and no attribute reply says so).
    pub(super) fn read_short(&self, ino: u64, end: u64) {
        let mut reported = self.reported(ino).lock();
        let known = reported.entry(ino).or_insert(end);
        *known = (*known).min(end);
    }

    /// The size last given to the kernel for chunk inode `ino`, if any.
    pub(super) fn reported_size(&self, ino: u64) -> Option<u64> {
        self.reported(ino).lock().get(&ino).copied()
    }

    /// The kernel forgot inode `ino`.
    pub(super) fn forget(&self, ino: u64) {
        self.served.lock().remove(&ino);
        self.reported(ino).lock().remove(&ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(volatile: bool) -> Attr {
        Attr {
            ino: 2,
            kind: super::super::Kind::File,
            size: 1,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            volatile,
        }
    }

    #[test]
    fn ttls() {
        let with = |ttl| CachePolicy::new(Freshness::with_ttl(ttl, true));
        let p = with(Duration::from_secs(5));
        assert_eq!(p.attr_ttl(&attr(false)), Duration::from_secs(5));
        assert_eq!(p.attr_ttl(&attr(true)), Duration::ZERO);
        assert_eq!(p.negative_ttl(), NEGATIVE_TTL);
        assert_eq!(with(Duration::ZERO).negative_ttl(), Duration::ZERO);
    }

    #[test]
    fn pages_kept_only_for_the_same_range_and_version() {
        let p = CachePolicy::new(Freshness::default());
        let r = ChunkRange {
            offset: 0,
            nbytes: 8,
        };
        let v = Some((1, 8, SystemTime::UNIX_EPOCH));
        assert!(!p.keep_pages(3, (r, v)), "first open keeps nothing");
        assert!(p.keep_pages(3, (r, v)));
        assert!(!p.keep_pages(3, (r, Some((1, 9, SystemTime::UNIX_EPOCH)))));
        p.not_served(3);
        assert!(!p.keep_pages(3, (r, v)));
        assert!(!p.report_size(3, 8));
        assert!(!p.report_size(3, 8));
        assert!(p.report_size(3, 9));
        p.forget(3);
        assert!(!p.report_size(3, 1));
    }
}
