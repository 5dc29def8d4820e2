//! Reading shards: the index (decoded lazily, once, into a bounded cache), nested
//! indices, and the byte range of one inner chunk. Only the index and the requested range
//! are read, except that a shard loaded ahead of its reader ([`ShardCache::prefetch`])
//! has its file's start fetched with its index, on stores that fetch ahead
//! ([`StoreFile::warm`]: up to 8 MiB on object storage; nothing on a local disk).
//!
//! A corrupt shard is loaded as a [`Shard`] whose index is an error: the error is logged
//! once (naming the shard and the reason) and every chunk of that shard then fails alone.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use super::{EntryMeta, Prefetch, Store, StoreFile};
use crate::format::index::index_region;
use crate::format::{
    ChunkRange, IndexError, IndexLocation, Location, ShardIndex, ShardLayout, ShardLevel,
};

/// Why a shard (or one nested block of it) cannot be read.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShardError {
    #[error("I/O error: {0}")]
    Io(String),
    /// The shard's file changed while it was read (`ESTALE`: object storage's
    /// conditional GET found another version); loading it again reads the new one.
    #[error("changed while read: {0}")]
    Changed(String),
    #[error("corrupt index: {0}")]
    Index(#[from] IndexError),
    #[error("corrupt nested index (level {level}, bytes {start}..{end}): {err}")]
    Nested {
        level: usize,
        start: u64,
        end: u64,
        err: IndexError,
    },
    /// The [`LoadHook`] refused the load (a writable mount could not recover an
    /// interrupted update of the shard); the index was not read.
    #[error("{0}")]
    NotLoaded(String),
}

impl From<std::io::Error> for ShardError {
    fn from(e: std::io::Error) -> Self {
        if e.raw_os_error() == Some(libc::ESTALE) {
            ShardError::Changed(e.to_string())
        } else {
            ShardError::Io(e.to_string())
        }
    }
}

/// How often a shard whose file changed while it was loaded (another writer's PUT landed
/// between the HEAD and the GET of its index) is loaded again before the reader gets the
/// error: each time means another writer committed in between.
const LOAD_ATTEMPTS: u32 = 8;

type NestedKey = (usize, u64, u64);

/// The bytes of a shard loaded ahead fetched with its open: all of a shard of up to 8 MiB
/// (on object storage, as [`StoreFile::warm`] fetches).
const WARM_BYTES: u64 = 8 << 20;

/// One shard as last read: its file (if it exists) and its decoded outer index.
pub struct Shard {
    rel: PathBuf,
    file: Option<Box<dyn StoreFile>>,
    meta: Option<EntryMeta>,
    /// The version of what stood at the shard's path when it was loaded, for a
    /// revalidation: the file's, or that of what could not be opened as one (a
    /// directory, a FIFO), so that such a path is not loaded, and logged, at every look.
    seen: Option<(u64, u64, std::time::SystemTime)>,
    index: Result<ShardIndex, ShardError>,
    nested: Mutex<HashMap<NestedKey, Result<Arc<ShardIndex>, ShardError>>>,
    /// Whether the shard after this one was asked to be loaded ahead ([`Shard::claim_next`]).
    next_claimed: std::sync::atomic::AtomicBool,
    /// Where the first chunk opened lies, plus one (0: none yet), for
    /// [`Shard::opened_another`].
    first_opened: std::sync::atomic::AtomicU64,
}

impl Shard {
    /// Open and decode the shard at `rel`; never fails: errors are kept in the shard and
    /// logged once. A shard that reads as corrupt is read again under the shared lock of
    /// its directory: it may have been caught in the middle of an append.
    pub fn load(store: &dyn Store, rel: &Path, layout: &ShardLayout) -> Shard {
        Self::load_prefix(store, rel, layout, None)
    }

    /// [`Shard::load`], reading the index of the shard's first `prefix.len` bytes while
    /// its file is `prefix.file_len` long.
    pub fn load_prefix(
        store: &dyn Store,
        rel: &Path,
        layout: &ShardLayout,
        prefix: Option<Truncated>,
    ) -> Shard {
        Self::load_with(store, rel, layout, prefix, false)
    }

    /// [`Shard::load_prefix`]; with `warm`, the file's start is fetched ahead
    /// ([`StoreFile::warm`]) before its index is read.
    fn load_with(
        store: &dyn Store,
        rel: &Path,
        layout: &ShardLayout,
        prefix: Option<Truncated>,
        warm: bool,
    ) -> Shard {
        let mut shard = Self::load_quiet(store, rel, layout, prefix, warm);
        for _ in 1..LOAD_ATTEMPTS {
            if !matches!(shard.index, Err(ShardError::Changed(_))) {
                break;
            }
            shard = Self::load_quiet(store, rel, layout, prefix, warm);
        }
        let shard = match (&shard.index, shard.exists()) {
            (Err(_), true) => {
                let _guard = store.read_lock(rel.parent().unwrap_or(Path::new("")));
                Self::load_quiet(store, rel, layout, prefix, false)
            }
            _ => shard,
        };
        if let Err(e) = &shard.index {
            log::error!("shard {} of {}: {e}", rel.display(), store.describe());
        }
        shard
    }

    /// A shard that was not read because of `err`; every chunk of it fails with `err`.
    fn failed(rel: &Path, err: ShardError) -> Shard {
        Shard {
            rel: rel.to_path_buf(),
            file: None,
            meta: None,
            seen: None,
            index: Err(err),
            nested: Mutex::new(HashMap::new()),
            next_claimed: Default::default(),
            first_opened: Default::default(),
        }
    }

    fn load_quiet(
        store: &dyn Store,
        rel: &Path,
        layout: &ShardLayout,
        prefix: Option<Truncated>,
        warm: bool,
    ) -> Shard {
        let level = &layout.levels[0];
        // The bytes the load reads first, fetched with the open where that saves a
        // request (object storage): the start of a shard loaded ahead (its index with
        // it, up to 8 MiB), else the index alone.
        let with = match level.index_location {
            _ if warm && prefix.is_none() => Prefetch::Start(WARM_BYTES),
            IndexLocation::End if prefix.is_none() => Prefetch::End(
                level
                    .index_codecs
                    .encoded_len(level.n_chunks())
                    .unwrap_or(0),
            ),
            _ => Prefetch::Start(
                level
                    .index_codecs
                    .encoded_len(level.n_chunks())
                    .unwrap_or(0),
            ),
        };
        let (file, meta, index) = match store.open_with(rel, with) {
            Ok(None) => (None, None, Ok(ShardIndex::empty(level.n_chunks() as usize))),
            Ok(Some(f)) => match f.meta() {
                Ok(meta) if warm && prefix.is_none() => {
                    f.warm();
                    let index = read_index(f.as_ref(), level, 0, meta.len);
                    (Some(f), Some(meta), index.map_err(ShardError::from))
                }
                Ok(meta) => {
                    let len = match prefix {
                        Some(p) if p.file_len == meta.len => p.len.min(meta.len),
                        _ => meta.len,
                    };
                    let index = read_index(f.as_ref(), level, 0, len).map_err(ShardError::from);
                    (Some(f), Some(meta), index)
                }
                Err(e) => (Some(f), None, Err(e.into())),
            },
            Err(e) => (None, None, Err(e.into())),
        };
        let seen = match &meta {
            Some(m) => Some(m.version()),
            None if file.is_none() && index.is_err() => {
                store.stat(rel).ok().flatten().map(|m| m.version())
            }
            None => None,
        };
        Shard {
            rel: rel.to_path_buf(),
            file,
            meta,
            seen,
            index,
            nested: Mutex::new(HashMap::new()),
            next_claimed: Default::default(),
            first_opened: Default::default(),
        }
    }

    pub fn rel(&self) -> &Path {
        &self.rel
    }

    /// Whether its reader is going forward through the shard's file, so that the next
    /// shard is likely read next ([`StoreFile::streaming`]).
    pub fn streaming(&self) -> bool {
        self.file.as_ref().is_some_and(|f| f.streaming())
    }

    /// Whether [`Shard::claim_next`] was done.
    pub fn next_claimed(&self) -> bool {
        self.next_claimed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Note the open of the chunk at byte `offset` of the shard: whether another chunk of
    /// it was opened before (its reader goes through the shard: the view loads the next
    /// shards ahead then, not after that second chunk's read).
    pub fn opened_another(&self, offset: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let mark = offset.saturating_add(1);
        match self
            .first_opened
            .compare_exchange(0, mark, Relaxed, Relaxed)
        {
            Ok(_) => false,
            Err(first) => first != mark,
        }
    }

    /// True once for this shard as loaded: the caller loads the next one ahead.
    pub fn claim_next(&self) -> bool {
        !self
            .next_claimed
            .swap(true, std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a shard file exists.
    pub fn exists(&self) -> bool {
        self.file.is_some()
    }

    pub fn meta(&self) -> Option<&EntryMeta> {
        self.meta.as_ref()
    }

    /// Its bytes that nothing uses ([`dead_bytes`]), read through the file it was loaded
    /// from; 0 for a shard with no file, `None` for one whose index could not be read.
    pub fn dead_bytes(&self, level: &ShardLevel) -> Option<std::io::Result<u64>> {
        let index = self.index.as_ref().ok()?;
        Some(match (&self.file, &self.meta) {
            (Some(file), Some(meta)) => dead_bytes(file.as_ref(), level, meta.len, index),
            _ => Ok(0),
        })
    }

    /// The outer index, or why it cannot be read.
    pub fn index(&self) -> Result<&ShardIndex, &ShardError> {
        self.index.as_ref()
    }

    /// Absolute byte range of the inner chunk at `loc`, `None` when it is empty.
    pub fn chunk(
        &self,
        layout: &ShardLayout,
        loc: &Location,
    ) -> Result<Option<ChunkRange>, ShardError> {
        let index = self.index.as_ref().map_err(Clone::clone)?;
        let Some(mut range) = index.get(loc.slots[0]) else {
            return Ok(None);
        };
        for (l, level) in layout.levels.iter().enumerate().skip(1) {
            let nested = self.nested_index(l, level, range)?;
            let Some(r) = nested.get(loc.slots[l]) else {
                return Ok(None);
            };
            range = ChunkRange {
                offset: range.offset + r.offset,
                nbytes: r.nbytes,
            };
        }
        Ok(Some(range))
    }

    fn nested_index(
        &self,
        l: usize,
        level: &ShardLevel,
        block: ChunkRange,
    ) -> Result<Arc<ShardIndex>, ShardError> {
        let key = (l, block.offset, block.nbytes);
        if let Some(hit) = self.nested.lock().get(&key) {
            return hit.clone();
        }
        let file = self
            .file
            .as_deref()
            .ok_or(ShardError::Io("shard vanished".into()))?;
        let loaded = match read_index(file, level, block.offset, block.nbytes) {
            Ok(i) => Ok(Arc::new(i)),
            Err(ReadIndexError::Io(e)) => Err(ShardError::Io(e.to_string())),
            Err(ReadIndexError::Index(err)) => {
                let e = ShardError::Nested {
                    level: l,
                    start: block.offset,
                    end: block.end(),
                    err,
                };
                log::error!("shard {}: {e}", self.rel.display());
                Err(e)
            }
        };
        self.nested.lock().insert(key, loaded.clone());
        loaded
    }

    /// Read `size` bytes at `offset` within the chunk at `range` (clipped to the chunk).
    pub fn read(&self, range: ChunkRange, offset: u64, size: u32) -> Result<Vec<u8>, ShardError> {
        let file = self
            .file
            .as_deref()
            .ok_or(ShardError::Io("shard vanished".into()))?;
        let start = offset.min(range.nbytes);
        let len = (range.nbytes - start).min(u64::from(size)) as usize;
        let mut buf = vec![0; len];
        let chunk = range.offset..range.end();
        super::read_exact_with(&mut buf, range.offset + start, |b, at| {
            file.read_chunk_at(b, at, chunk.clone())
        })
        .map_err(|e| match ShardError::from(e) {
            ShardError::Changed(e) => {
                ShardError::Changed(format!("reading {}: {e}", self.rel.display()))
            }
            other => ShardError::Io(format!("reading {}: {other}", self.rel.display())),
        })?;
        Ok(buf)
    }

    /// Approximate memory held, for the cache budget.
    fn weight(&self) -> usize {
        let outer = self.index.as_ref().map_or(0, ShardIndex::len);
        let nested: usize = self
            .nested
            .lock()
            .values()
            .map(|n| n.as_ref().map_or(0, |i| i.len()))
            .sum();
        256 + 16 * (outer + nested)
    }
}

/// Why an index could not be read: the file, or the index bytes.
pub(crate) enum ReadIndexError {
    Io(std::io::Error),
    Index(IndexError),
}

impl From<ReadIndexError> for ShardError {
    fn from(e: ReadIndexError) -> Self {
        match e {
            ReadIndexError::Io(e) => e.into(),
            ReadIndexError::Index(e) => ShardError::Index(e),
        }
    }
}

/// The close times recorded in the first `len` bytes of a shard whose (valid) index is
/// `index`, if it holds a block that checks out (`format::times`).
pub fn read_times(
    file: &dyn StoreFile,
    level: &ShardLevel,
    len: u64,
    index: &ShardIndex,
) -> std::io::Result<Option<crate::format::CloseTimes>> {
    use crate::format::index::IndexLocation;
    use crate::format::times;
    let n = level.n_chunks();
    let Some(end) = times::trailer_end(level.index_location, len, level.index_len()) else {
        return Ok(None);
    };
    let mut trailer = [0u8; times::TRAILER_LEN as usize];
    let at = end - times::TRAILER_LEN;
    file.read_exact_at(&mut trailer, at)?;
    let Some((start, stop, crc)) = times::decode_trailer(&trailer, n, at) else {
        return Ok(None);
    };
    let floor = match level.index_location {
        IndexLocation::Start => level.index_len(),
        IndexLocation::End => 0,
    };
    if start < floor {
        return Ok(None);
    }
    let mut bytes = vec![0u8; (stop - start) as usize];
    file.read_exact_at(&mut bytes, start)?;
    Ok(times::decode_times(&bytes, crc, index, start, stop))
}

/// The bytes of a shard of `len` bytes with (valid) index `index` that nothing uses:
/// neither a live chunk, nor the index, nor a close-time block (which orders writes
/// across mounts, and which a compacted shard keeps). What `shardfs compact` reclaims
/// and `shardfs info` calls dead.
pub fn dead_bytes(
    file: &dyn StoreFile,
    level: &ShardLevel,
    len: u64,
    index: &ShardIndex,
) -> std::io::Result<u64> {
    let times_len = match read_times(file, level, len, index)? {
        Some(t) if t.any() => crate::format::CloseTimes::encoded_len(level.n_chunks()),
        _ => 0,
    };
    Ok(len.saturating_sub(index.live_bytes() + level.index_len() + times_len))
}

/// Read, decode and validate the index of the block `base..base+len` of `file`.
pub(crate) fn read_index(
    file: &dyn StoreFile,
    level: &ShardLevel,
    base: u64,
    len: u64,
) -> Result<ShardIndex, ReadIndexError> {
    let n = level.n_chunks();
    let index_len = level
        .index_codecs
        .encoded_len(n)
        .ok_or(ReadIndexError::Index(IndexError::TooLarge { n_chunks: n }))?;
    let (start, end) =
        index_region(level.index_location, len, index_len).map_err(ReadIndexError::Index)?;
    let mut buf = vec![0; index_len as usize];
    file.read_exact_at(&mut buf, base + start).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            ReadIndexError::Index(IndexError::Truncated {
                len,
                need: index_len,
            })
        } else {
            ReadIndexError::Io(e)
        }
    })?;
    let index = ShardIndex::decode(&buf, level.index_codecs, n).map_err(ReadIndexError::Index)?;
    index
        .validate(len, start, end)
        .map_err(ReadIndexError::Index)?;
    Ok(index)
}

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
                let fresh = !revalidate || {
                    let now = store.stat(rel).ok().flatten().map(|m| m.version());
                    now == shard.seen
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

    /// Drop a cached shard (the write path calls this after changing it).
    pub fn invalidate(&self, rel: &Path) {
        let mut seg = self.segment(rel).lock();
        seg.generation += 1;
        if let Some((_, w)) = seg.lru.pop(rel) {
            seg.bytes -= w;
        }
    }
}

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
mod tests {
    use super::*;
    use crate::format::IndexLocation;
    use crate::format::index::{Endian, IndexCodecs};
    use crate::store::memory::MemoryStore;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    fn layout() -> ShardLayout {
        let level = ShardLevel {
            chunk_shape: vec![2],
            chunks_per_shard: vec![2],
            index_codecs: IndexCodecs {
                endian: Endian::Little,
                crc32c: true,
            },
            index_location: IndexLocation::End,
        };
        ShardLayout::new(vec![8], vec![4], vec![level], vec![]).unwrap()
    }

    /// Holds every load until opened; counts the loads.
    #[derive(Default)]
    struct Gate {
        open: Mutex<bool>,
        opened: parking_lot::Condvar,
        loads: AtomicUsize,
    }

    impl LoadHook for Gate {
        fn before_load(&self, _rel: &Path) -> Result<Option<Truncated>, ShardError> {
            self.loads.fetch_add(1, SeqCst);
            let mut open = self.open.lock();
            while !*open {
                self.opened.wait(&mut open);
            }
            Ok(None)
        }
    }

    /// An empty store, and a cache whose loads wait at the gate.
    fn gated() -> (Arc<dyn Store>, Arc<Gate>, Arc<ShardCache>) {
        let gate = Arc::new(Gate::default());
        let mut cache = ShardCache::new(16, 1 << 20);
        cache.set_load_hook(gate.clone());
        (Arc::new(MemoryStore::new()), gate, Arc::new(cache))
    }

    impl Gate {
        fn open(&self) {
            *self.open.lock() = true;
            self.opened.notify_all();
        }
    }

    /// A reader of a shard being loaded ahead waits for that load and gets its shard (one
    /// load, not two); a shard whose load ahead was overtaken by an invalidation (this
    /// mount's commit) is not kept.
    #[test]
    fn a_load_ahead_is_waited_for_and_not_kept_across_an_invalidation() {
        let (store, gate, cache) = gated();
        let rel = Path::new("a/c/0");
        cache.prefetch(store.clone(), rel.to_path_buf(), layout());
        let reader = {
            let (cache, store) = (cache.clone(), store.clone());
            std::thread::spawn(move || {
                cache.get(store.as_ref(), Path::new("a/c/0"), &layout(), false)
            })
        };
        while cache.waiting.load(SeqCst) < 1 {
            std::thread::yield_now(); // the reader waits for the load ahead
        }
        assert!(!reader.is_finished());
        gate.open();
        let shard = reader.join().unwrap();
        assert_eq!(gate.loads.load(SeqCst), 1, "one load");
        assert!(Arc::ptr_eq(&shard, &cache.peek(rel).unwrap()));
        assert_eq!(cache.prefetches.load(SeqCst), 1);

        // Overtaken by an invalidation: dropped.
        *gate.open.lock() = false;
        let rel = Path::new("a/c/1");
        cache.prefetch(store.clone(), rel.to_path_buf(), layout());
        while gate.loads.load(SeqCst) < 2 {
            std::thread::yield_now();
        }
        cache.invalidate(rel);
        gate.open();
        cache.wait_for_load(rel);
        assert!(
            cache.peek(rel).is_none(),
            "a load from before the invalidation"
        );
    }

    /// Readers that miss one shard together make one load of it (zarr-python's threads
    /// reading chunks of a shard side by side: one index read, not one each).
    #[test]
    fn readers_that_miss_together_load_once() {
        let (store, gate, cache) = gated();
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let (cache, store) = (cache.clone(), store.clone());
                std::thread::spawn(move || {
                    cache.get(store.as_ref(), Path::new("a/c/0"), &layout(), false)
                })
            })
            .collect();
        // One load under way (held at the gate), the three others waiting for it.
        while gate.loads.load(SeqCst) < 1 || cache.waiting.load(SeqCst) < 3 {
            std::thread::yield_now();
        }
        gate.open();
        let shards: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
        assert_eq!(gate.loads.load(SeqCst), 1, "one load for four readers");
        assert!(shards.iter().all(|s| Arc::ptr_eq(s, &shards[0])));
        assert!(cache.loading.lock().is_empty());
    }

    /// A reader's load that an invalidation (this mount's commit) overtook gives the
    /// reader what it read, and keeps nothing: the next reader loads the shard again.
    #[test]
    fn a_load_across_an_invalidation_is_not_kept() {
        let (store, gate, cache) = gated();
        let reader = {
            let (cache, store) = (cache.clone(), store.clone());
            std::thread::spawn(move || {
                cache.get(store.as_ref(), Path::new("a/c/0"), &layout(), false)
            })
        };
        while gate.loads.load(SeqCst) < 1 {
            std::thread::yield_now();
        }
        cache.invalidate(Path::new("a/c/0"));
        gate.open();
        let shard = reader.join().unwrap();
        assert!(shard.index().is_ok());
        assert!(cache.peek(Path::new("a/c/0")).is_none());
        cache.get(store.as_ref(), Path::new("a/c/0"), &layout(), false);
        assert_eq!(gate.loads.load(SeqCst), 2);
        assert!(cache.peek(Path::new("a/c/0")).is_some());
    }

    /// A shard path that is not a regular file (a directory) is loaded, and logged, once:
    /// a revalidation finds the same thing there and keeps it, until it changes.
    #[test]
    fn a_shard_path_that_is_a_directory_is_loaded_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/c/0")).unwrap();
        let store = crate::store::LocalStore::open(dir.path()).unwrap();
        let gate = Arc::new(Gate::default());
        gate.open();
        let mut cache = ShardCache::new(16, 1 << 20);
        cache.set_load_hook(gate.clone());
        let rel = Path::new("a/c/0");
        for _ in 0..5 {
            let shard = cache.get(&store, rel, &layout(), true);
            assert!(shard.index().is_err());
        }
        assert_eq!(gate.loads.load(SeqCst), 1, "loaded once");
        // Replaced by a file: loaded again.
        std::fs::remove_dir(dir.path().join("a/c/0")).unwrap();
        std::fs::write(dir.path().join("a/c/0"), b"not a shard").unwrap();
        assert!(cache.get(&store, rel, &layout(), true).index().is_err());
        assert_eq!(gate.loads.load(SeqCst), 2);
    }
}
