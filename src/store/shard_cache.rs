//! The cache of loaded shards ([`ShardCache`]): bounded by shards and bytes, split into
//! segments, with one load per shard however many readers miss it together, loads ahead
//! of readers ([`ShardCache::prefetch`]), the hook that recovers an interrupted
//! update before a load ([`LoadHook`]), and this mount's commits cached as they left the
//! shard ([`ShardCache::committed`]), so that the index a commit wrote is not read again.

use std::hash::{BuildHasher, Hash};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use super::Store;
use super::shard::{Shard, ShardError};
use crate::format::ShardLayout;

const SEGMENTS: usize = 16;

/// Runs before a [`ShardCache`] reads a shard's index from the store: on a miss and on
/// the reload of a revalidation, never on a hit. A writable mount installs one that
/// recovers an interrupted update of the shard first (`store::local::recover::LazyRecovery`),
/// which is how this layer stays ignorant of the write side.
pub trait LoadHook: Send + Sync {
    /// Called with the shard's store-relative path and no lock of the cache held. An
    /// error fails this load: the caller gets a shard whose every chunk fails with it
    /// (`EIO`), and nothing is cached, so the next read tries again. `Some` reads the
    /// shard as a prefix of its file (see [`Truncated`]).
    fn before_load(&self, rel: &Path) -> Result<Option<Truncated>, ShardError>;
}

/// Read a shard as its first `len` bytes (its state before an interrupted append), as
/// long as its file is still `file_len` bytes long; a file of any other length has
/// changed since and is read whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truncated {
    pub len: u64,
    pub file_len: u64,
}

/// A bounded cache of loaded shards, split into segments so that readers of different
/// shards do not contend on one lock.
pub struct ShardCache {
    segments: Vec<Mutex<Segment>>,
    max_bytes_per_segment: usize,
    hasher: std::collections::hash_map::RandomState,
    hook: Option<Arc<dyn LoadHook>>,
    /// Lookups answered from the cache / that loaded the shard's index.
    pub hits: std::sync::atomic::AtomicU64,
    pub misses: std::sync::atomic::AtomicU64,
    /// Shards loaded ahead of their reader ([`ShardCache::prefetch`]).
    pub prefetches: std::sync::atomic::AtomicU64,
    /// Shards being loaded now; a reader of one waits for that load ([`Self::loaded`]).
    loading: Mutex<std::collections::HashSet<PathBuf>>,
    loaded: parking_lot::Condvar,
    /// Loads ahead under way.
    ahead_now: std::sync::atomic::AtomicUsize,
    /// Readers waiting for another's load now (for tests).
    waiting: std::sync::atomic::AtomicUsize,
}

/// At most this many shards are loaded ahead at once.
const PREFETCHES: usize = 4;

/// How long a shard whose read failed ([`Shard::failed_read`]) is used again.
pub use crate::freshness::FAILED_READ_KEPT;

/// How long a reader waits for a shard another thread is loading before loading it
/// itself (as it did before loads were shared; a load of a stalled object store can
/// take longer, `--s3-timeout` per request).
const LOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

struct Segment {
    lru: LruCache<PathBuf, (Arc<Shard>, usize)>,
    bytes: usize,
    /// Bumped by every [`ShardCache::invalidate`] of a shard of this segment: a load
    /// across one is not kept.
    generation: u64,
}

impl ShardCache {
    /// A cache holding at most `max_shards` shards and about `max_bytes` of indices.
    pub fn new(max_shards: usize, max_bytes: usize) -> Self {
        let per = NonZeroUsize::new(max_shards.div_ceil(SEGMENTS).max(1)).expect("non-zero");
        ShardCache {
            segments: (0..SEGMENTS)
                .map(|_| {
                    Mutex::new(Segment {
                        lru: LruCache::new(per),
                        bytes: 0,
                        generation: 0,
                    })
                })
                .collect(),
            max_bytes_per_segment: (max_bytes / SEGMENTS).max(1),
            hasher: Default::default(),
            hook: None,
            hits: Default::default(),
            misses: Default::default(),
            prefetches: Default::default(),
            loading: Default::default(),
            loaded: Default::default(),
            ahead_now: Default::default(),
            waiting: Default::default(),
        }
    }

    /// Run `hook` before every load of a shard's index from now on.
    pub fn set_load_hook(&mut self, hook: Arc<dyn LoadHook>) {
        self.hook = Some(hook);
    }

    fn segment(&self, rel: &Path) -> &Mutex<Segment> {
        let mut h = self.hasher.build_hasher();
        rel.hash(&mut h);
        &self.segments[(std::hash::Hasher::finish(&h) as usize) % SEGMENTS]
    }

    /// The shard at `rel`, loading it on a miss. With `revalidate`, a cached shard whose
    /// file changed (or appeared, or vanished) since it was loaded is loaded again.
    pub fn get(
        &self,
        store: &dyn Store,
        rel: &Path,
        layout: &ShardLayout,
        revalidate: bool,
    ) -> Arc<Shard> {
        let seg = self.segment(rel);
        let until = std::time::Instant::now() + LOAD_WAIT;
        // One load of a shard at a time: readers that miss it together (zarr-python's
        // threads, a load ahead) wait for the first instead of each reading the index.
        let mut claimed = None;
        // A cached shard found stale once is not asked about again.
        let mut stale: Option<Arc<Shard>> = None;
        loop {
            // Clone out and unlock before any I/O: the stat of a revalidation must not
            // hold the segment against other readers.
            let cached = seg.lock().lru.get(rel).map(|(s, _)| s.clone());
            if let Some(shard) = cached
                && !stale.as_ref().is_some_and(|s| Arc::ptr_eq(s, &shard))
            {
                let fresh = if shard.failed_read() {
                    // Readers that waited for the load that failed get its failure; a
                    // reader after that tries again.
                    shard.loaded.elapsed() < FAILED_READ_KEPT
                } else {
                    !revalidate || {
                        let now = store.stat(rel).ok().flatten().map(|m| m.version());
                        now == shard.seen
                    }
                };
                if fresh {
                    self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return shard; // (a claim taken is given back)
                }
                stale = Some(shard);
            }
            if claimed.is_some() {
                break; // claimed, and the cache looked at once more after the claim
            }
            let mut loading = self.loading.lock();
            if loading.insert(rel.to_path_buf()) {
                // Looked at the cache once more before loading: a load may have ended
                // between the look above and the claim.
                claimed = Some(Loaded {
                    cache: self,
                    rel,
                    ahead: false,
                });
                continue;
            }
            self.waiting
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut timed_out = false;
            while loading.contains(rel) && !timed_out {
                timed_out = self.loaded.wait_until(&mut loading, until).timed_out();
            }
            self.waiting
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            if timed_out {
                break; // load it unclaimed
            }
        }
        self.misses
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let shard = self.load(store, rel, layout, false, false);
        drop(claimed);
        shard
    }

    /// Load the shard at `rel` (running the hook first) and cache it, unless a shard of
    /// its segment was invalidated meanwhile (this mount's commit: what was loaded may be
    /// from before it; the caller still gets it, as a read side by side with the commit).
    /// Loaded `ahead` (in the background, for no reader), nothing is kept either when
    /// the load failed or a reader loaded the shard meanwhile (it may be newer). `warm`:
    /// its file's start is fetched with the index ([`Shard::load_with`]).
    fn load(
        &self,
        store: &dyn Store,
        rel: &Path,
        layout: &ShardLayout,
        ahead: bool,
        warm: bool,
    ) -> Arc<Shard> {
        let generation = self.segment(rel).lock().generation;
        let prefix = match self.hook.as_ref().map(|h| h.before_load(rel)) {
            Some(Err(err)) => return Arc::new(Shard::failed(rel, err)),
            Some(Ok(prefix)) => prefix,
            None => None,
        };
        let shard = Arc::new(Shard::load_with(store, rel, layout, prefix, warm));
        let weight = shard.weight();
        let mut seg = self.segment(rel).lock();
        if seg.generation != generation
            || (ahead && (shard.index.is_err() || seg.lru.contains(rel)))
        {
            return shard;
        }
        if let Some((_, (_, w))) = seg.lru.push(rel.to_path_buf(), (shard.clone(), weight)) {
            seg.bytes -= w;
        }
        seg.bytes += weight;
        while seg.bytes > self.max_bytes_per_segment && seg.lru.len() > 1 {
            if let Some((_, (_, w))) = seg.lru.pop_lru() {
                seg.bytes -= w;
            }
        }
        shard
    }

    /// Load the shard at `rel` in the background, its file's start fetched in the same
    /// request as its index (all of a shard of up to 8 MiB on object storage), unless it
    /// is cached or being loaded, or [`PREFETCHES`] are under way. A reader that comes
    /// for it meanwhile waits for this load rather than making its own requests. Nothing
    /// is kept from a load the cache was invalidated during, or that failed (the reader
    /// then loads it, and meets the error, itself).
    pub fn prefetch(self: &Arc<Self>, store: Arc<dyn Store>, rel: PathBuf, layout: ShardLayout) {
        self.prefetch_with(store, rel, layout, true);
    }

    /// [`ShardCache::prefetch`] of the index alone: for a listing that needs the indexes
    /// of several shards (on object storage, their requests side by side rather than one
    /// after another), moving none of their chunks.
    pub fn prefetch_index(
        self: &Arc<Self>,
        store: Arc<dyn Store>,
        rel: PathBuf,
        layout: ShardLayout,
    ) {
        self.prefetch_with(store, rel, layout, false);
    }

    fn prefetch_with(
        self: &Arc<Self>,
        store: Arc<dyn Store>,
        rel: PathBuf,
        layout: ShardLayout,
        warm: bool,
    ) {
        let cached = self.peek(&rel);
        // Cached by its index alone (a listing read it): its bytes are fetched ahead.
        let was_cached = cached.is_some();
        let cold = cached.filter(|s| warm && s.file.as_ref().is_some_and(|f| f.cold()));
        if was_cached && cold.is_none() {
            return;
        }
        {
            use std::sync::atomic::Ordering::SeqCst;
            let mut loading = self.loading.lock();
            if self.ahead_now.load(SeqCst) >= PREFETCHES || !loading.insert(rel.clone()) {
                return;
            }
            self.ahead_now.fetch_add(1, SeqCst);
        }
        let cache = self.clone();
        let done = rel.clone();
        let spawned = std::thread::Builder::new()
            .name("shardfs-ahead".into())
            .spawn(move || {
                let _done = Loaded {
                    cache: &cache,
                    rel: &rel,
                    ahead: true,
                };
                cache
                    .prefetches
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                match cold.as_ref().and_then(|s| s.file.as_ref()) {
                    Some(file) => file.warm(),
                    None => {
                        cache.load(store.as_ref(), &rel, &layout, true, warm);
                    }
                }
            });
        if spawned.is_err() {
            drop(Loaded {
                cache: self,
                rel: &done,
                ahead: true,
            });
        }
    }

    /// Fetch all of `shard`'s file but `skip` (the chunk its reader opened and fetches
    /// itself) in the background ([`crate::store::StoreFile::claim_rest`]), if its file takes it.
    pub fn fetch_rest(&self, shard: &Arc<Shard>, skip: std::ops::Range<u64>) {
        if let Some(file) = shard.file.as_ref()
            && file.claim_rest(skip)
        {
            self.prefetches
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Wait while the shard at `rel` is being loaded.
    #[cfg(test)]
    fn wait_for_load(&self, rel: &Path) {
        let mut loading = self.loading.lock();
        while loading.contains(rel) {
            self.loaded.wait(&mut loading);
        }
    }

    /// The cached shard at `rel`, as it was loaded (no revalidation, no I/O).
    pub fn peek(&self, rel: &Path) -> Option<Arc<Shard>> {
        self.segment(rel)
            .lock()
            .lru
            .peek(rel)
            .map(|(s, _)| s.clone())
    }

    /// Drop every cached shard at or below `prefix` (a directory renamed away).
    pub fn invalidate_under(&self, prefix: &Path) {
        for seg in &self.segments {
            let mut seg = seg.lock();
            let gone: Vec<PathBuf> = seg
                .lru
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(k, _)| k.clone())
                .collect();
            if !gone.is_empty() {
                seg.generation += 1;
            }
            for k in gone {
                if let Some((_, w)) = seg.lru.pop(&k) {
                    seg.bytes -= w;
                }
            }
        }
    }

    /// What to show [`ShardCache::committed`] after a commit of `rel`: taken before the
    /// commit starts.
    pub fn before_commit(&self, rel: &Path) -> CommitTicket {
        CommitTicket(self.segment(rel).lock().generation)
    }

    /// After this mount's commit of `rel` (`ticket` taken before it): cache `shard`, the
    /// shard as the commit left it, in place of what was cached, so that the next reader
    /// does not read the index again. Nothing is kept, and what was cached is dropped (as
    /// [`ShardCache::invalidate`] does), when `shard` is `None` (the store could not say
    /// what it left) or when a shard of its segment was invalidated, or another commit
    /// cached, since the ticket: that change may be later than this commit's. A load
    /// under way across this is not kept either (it may have read the shard from before).
    pub fn committed(&self, rel: &Path, ticket: CommitTicket, shard: Option<Shard>) {
        let shard = shard.map(Arc::new);
        let mut seg = self.segment(rel).lock();
        let unchanged = seg.generation == ticket.0;
        seg.generation += 1;
        if let Some((_, w)) = seg.lru.pop(rel) {
            seg.bytes -= w;
        }
        let Some(shard) = shard.filter(|_| unchanged) else {
            return;
        };
        let weight = shard.weight();
        if let Some((_, (_, w))) = seg.lru.push(rel.to_path_buf(), (shard, weight)) {
            seg.bytes -= w;
        }
        seg.bytes += weight;
        while seg.bytes > self.max_bytes_per_segment && seg.lru.len() > 1 {
            if let Some((_, (_, w))) = seg.lru.pop_lru() {
                seg.bytes -= w;
            }
        }
    }

    /// Drop a cached shard (the write path calls this after changing it).
    pub fn invalidate(&self, rel: &Path) {
        let mut seg = self.segment(rel).lock();
        seg.generation += 1;
        if let Some((_, w)) = seg.lru.pop(rel) {
            seg.bytes -= w;
        }
    }
}

/// A shard's segment generation before a commit of it ([`ShardCache::before_commit`]).
#[derive(Clone, Copy, Debug)]
pub struct CommitTicket(u64);

/// The end of a load, however it ends (a panic in the store included): its mark goes
/// and the readers waiting for it wake.
struct Loaded<'a> {
    cache: &'a ShardCache,
    rel: &'a Path,
    /// A load ahead: one fewer under way.
    ahead: bool,
}

impl Drop for Loaded<'_> {
    fn drop(&mut self) {
        self.cache.loading.lock().remove(self.rel);
        if self.ahead {
            self.cache
                .ahead_now
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.cache.loaded.notify_all();
    }
}

#[cfg(test)]
#[path = "shard_cache_tests.rs"]
mod tests;
