//! How long a mount uses again what it learned before it asks once more: one policy for
//! every cache of the mount, decided once at mount from `--ttl`, `ro` and `open_checks`
//! ([`Freshness::of`]), and handed to the caches that keep answers for a time.
//!
//! | What is kept | Where | Used again | Then |
//! |---|---|---|---|
//! | Entries and attributes, in the kernel | `view/cache.rs` | [`Freshness::ttl`]; attributes of a file being written not at all | the kernel asks again |
//! | The absence of a name, in the kernel | `view/cache.rs` | [`Freshness::negative`]: the TTL, at most [`NEGATIVE_TTL`] | the kernel looks the name up |
//! | A chunk's pages, in the kernel | `view/cache.rs` | at an open, while the chunk is served from the same range of the same shard version | dropped at that open |
//! | HEAD and LIST answers of object storage | `store/object/meta.rs` | [`Freshness::store_meta`]: the TTL on a read-only mount, at most [`WRITABLE_STORE_META`] on a writable one; during an outage, as long as it lasts | asked again |
//! | A shard's index | `store/shard_cache.rs` | until a lookup or an open finds the shard file's version changed (a stat); reads through an open file never ask; a read that failed for [`FAILED_READ_KEPT`] | loaded again |
//! | An array's `zarr.json` | `view/array_load.rs` | while its directory and `zarr.json` have the version they had when it was read | read again |
//! | A draft store's hierarchy | `view/draft.rs` | [`Freshness::ttl`] | read again |
//! | Shard ranges in `--cache DIR` | `store/object/disk_cache.rs` | while the object has the ETag they were stored under | fetched again |
//!
//! The version of a file is its [`crate::store::EntryMeta::version`]: on a disk its
//! inode, length and mtime; on object storage its ETag and length, which a HEAD, a
//! listing, a GET and the answer to this mount's own PUT all name (so a shard this
//! mount committed is cached with the index it wrote, not read again).

use std::time::Duration;

/// The entry and attribute TTL unless told otherwise. A pass over an array's chunk
/// files that takes longer than the TTL looks every file up again (a request each,
/// several times the cost of a cached read), so it is long: what it delays is small.
/// A mount sees a file changed outside it within the TTL (with `open_checks`: at the
/// next open, close-to-open); names that appear are seen within [`NEGATIVE_TTL`]. NFS
/// keeps the attributes of unchanged files for up to 60 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// The TTL with `open_checks`, unless told otherwise: a mount that asks at every open is
/// asked for freshness.
pub const OPEN_CHECKS_TTL: Duration = Duration::from_secs(1);

/// The longest the kernel caches the absence of a name: a chunk or file that another
/// program adds to the store is seen within it, whatever the TTL is.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(1);

/// The longest a writable mount uses a HEAD or listing of object storage again: what it
/// writes itself it knows, and another mount's writes are merged at the next commit of
/// the same shard.
pub const WRITABLE_STORE_META: Duration = Duration::from_secs(1);

/// How long a shard whose read failed is used again: long enough for the readers that
/// waited for that load to get its failure (they wake at once) rather than each loading
/// again in turn (during an outage, one timeout after another); a reader after that
/// tries again. Before, such a shard was kept like a corrupt one, until its file
/// changed, and on a read-only mount (which does not revalidate) for good: one failed
/// read failed the shard's chunks from then on (found by `tests/store_faults.rs`). A
/// corrupt index and a path that is no regular file are kept until the file changes,
/// which revalidation sees.
pub const FAILED_READ_KEPT: Duration = Duration::from_secs(1);

/// The times a mount uses an answer again (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Freshness {
    /// Entries and attributes, in the kernel.
    pub ttl: Duration,
    /// The absence of a name, in the kernel.
    pub negative: Duration,
    /// HEAD and LIST answers of object storage.
    pub store_meta: Duration,
}

impl Freshness {
    /// The policy of a mount: `ttl` as asked (`None`: [`DEFAULT_TTL`], or
    /// [`OPEN_CHECKS_TTL`] with `open_checks`), on a read-only mount or not.
    pub fn of(ttl: Option<Duration>, read_only: bool, open_checks: bool) -> Freshness {
        let ttl = ttl.unwrap_or(if open_checks {
            OPEN_CHECKS_TTL
        } else {
            DEFAULT_TTL
        });
        Freshness::with_ttl(ttl, read_only)
    }

    /// The policy of a mount whose TTL is `ttl`.
    pub fn with_ttl(ttl: Duration, read_only: bool) -> Freshness {
        Freshness {
            ttl,
            negative: ttl.min(NEGATIVE_TTL),
            // The kernel keeps attributes for the TTL on a read-only mount anyway.
            store_meta: if read_only {
                ttl
            } else {
                ttl.min(WRITABLE_STORE_META)
            },
        }
    }
}

impl Default for Freshness {
    /// A writable mount's with a TTL of 1 s (the view's tests).
    fn default() -> Self {
        Freshness::with_ttl(Duration::from_secs(1), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_policy_from_the_mount_options() {
        let s = Duration::from_secs;
        let f = Freshness::of(None, true, false);
        assert_eq!(
            (f.ttl, f.negative, f.store_meta),
            (DEFAULT_TTL, NEGATIVE_TTL, DEFAULT_TTL)
        );
        let f = Freshness::of(None, false, false);
        assert_eq!(f.store_meta, WRITABLE_STORE_META);
        let f = Freshness::of(None, false, true);
        assert_eq!((f.ttl, f.store_meta), (OPEN_CHECKS_TTL, OPEN_CHECKS_TTL));
        let f = Freshness::of(Some(s(60)), true, true);
        assert_eq!(
            (f.ttl, f.negative, f.store_meta),
            (s(60), NEGATIVE_TTL, s(60))
        );
        // A TTL of 0 caches nothing anywhere.
        let f = Freshness::of(Some(Duration::ZERO), false, false);
        assert_eq!(
            (f.ttl, f.negative, f.store_meta),
            (Duration::ZERO, Duration::ZERO, Duration::ZERO)
        );
    }
}
