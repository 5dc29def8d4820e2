//! Reading shards: the index (decoded lazily, once; cached in `shard_cache.rs`), nested
//! indices, and the byte range of one inner chunk. Only the index and the requested range
//! are read, except that a shard loaded ahead of its reader ([`ShardCache::prefetch`])
//! has its file's start fetched with its index, on stores that fetch ahead
//! ([`StoreFile::warm`]: up to 8 MiB on object storage; nothing on a local disk).
//!
//! A corrupt shard is loaded as a [`Shard`] whose index is an error: the error is logged
//! once (naming the shard and the reason) and every chunk of that shard then fails alone.
//!
//! The shard's bytes are parsed by [`crate::format::shard_read`] (index location, index,
//! nested ranges, close times, dead space); this module owns the loading, retrying and
//! caching around it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{EntryKind, EntryMeta, Prefetch, Store, StoreFile};
use crate::format::shard_read::{self, ReadError};
use crate::format::{
    ChunkRange, IndexError, IndexLocation, Location, ShardIndex, ShardLayout, ShardLevel,
};

/// Why a shard (or one nested block of it) cannot be read.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShardError {
    #[error("I/O error: {0}")]
    Io(String),
    /// What lies at the shard's path is no regular file (a directory, a FIFO, a
    /// symlink): so it stays until the path changes.
    #[error("{0}")]
    NotAFile(String),
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
    pub(super) file: Option<Box<dyn StoreFile>>,
    meta: Option<EntryMeta>,
    /// The version of what stood at the shard's path when it was loaded, for a
    /// revalidation: the file's, or that of what could not be opened as one (a
    /// directory, a FIFO), so that such a path is not loaded, and logged, at every look.
    pub(super) seen: Option<(u64, u64, std::time::SystemTime)>,
    pub(super) index: Result<ShardIndex, ShardError>,
    nested: Mutex<HashMap<NestedKey, Result<Arc<ShardIndex>, ShardError>>>,
    /// Whether the shards after this one were asked to be loaded ahead, and in which
    /// pass over its file ([`Shard::claim_next`]): the pass plus one (0: never).
    next_claimed: std::sync::atomic::AtomicU64,
    /// Where the first chunk opened lies, plus one (0: none yet), for
    /// [`Shard::opened_another`].
    first_opened: std::sync::atomic::AtomicU64,
    /// When it was loaded (a failed read is used again only for a moment:
    /// [`Shard::failed_read`]).
    pub(super) loaded: std::time::Instant,
}

impl Shard {
    /// Open and decode the shard at `rel`; never fails: errors are kept in the shard and
    /// logged (by a cache, once per load: a corrupt index once, a failed read at most
    /// once a second while it fails; see `ShardCache`). A shard that reads as corrupt is read again under the shared lock of
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
    pub(super) fn load_with(
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

    /// The shard at `rel` as this mount's commit left it (`stored`, whose index is
    /// `index`): what a load right after the commit would have read, without reading it.
    pub fn committed(rel: &Path, stored: super::StoredShard, index: ShardIndex) -> Shard {
        Shard {
            rel: rel.to_path_buf(),
            file: stored.file,
            seen: stored.meta.as_ref().map(EntryMeta::version),
            meta: stored.meta,
            index: Ok(index),
            nested: Mutex::new(HashMap::new()),
            next_claimed: Default::default(),
            first_opened: Default::default(),
            loaded: std::time::Instant::now(),
        }
    }

    /// A shard that was not read because of `err`; every chunk of it fails with `err`.
    pub(super) fn failed(rel: &Path, err: ShardError) -> Shard {
        Shard {
            rel: rel.to_path_buf(),
            file: None,
            meta: None,
            seen: None,
            index: Err(err),
            nested: Mutex::new(HashMap::new()),
            next_claimed: Default::default(),
            first_opened: Default::default(),
            loaded: std::time::Instant::now(),
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
                    let index = shard_read::read_index(f.as_ref(), level, 0, meta.len);
                    (Some(f), Some(meta), index.map_err(ShardError::from))
                }
                Ok(meta) => {
                    let len = match prefix {
                        Some(p) if p.file_len == meta.len => p.len.min(meta.len),
                        _ => meta.len,
                    };
                    let index =
                        shard_read::read_index(f.as_ref(), level, 0, len).map_err(ShardError::from);
                    (Some(f), Some(meta), index)
                }
                Err(e) => (Some(f), None, Err(e.into())),
            },
            Err(e) => (None, None, Err(e.into())),
        };
        let (seen, index) = match &meta {
            Some(m) => (Some(m.version()), index),
            None if file.is_none() && index.is_err() => {
                let there = store.stat(rel).ok().flatten();
                let index = match (index, &there) {
                    (Err(ShardError::Io(e)), Some(m)) if m.kind != EntryKind::File => {
                        Err(ShardError::NotAFile(e))
                    }
                    (index, _) => index,
                };
                (there.map(|m| m.version()), index)
            }
            None => (None, index),
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
            loaded: std::time::Instant::now(),
        }
    }

    /// Whether its read failed (an I/O error, or its file changed while read): that says
    /// nothing of the shard, and a read a moment later may work. Not so a corrupt index,
    /// nor a path that is no regular file, which stay so until the file changes.
    pub(super) fn failed_read(&self) -> bool {
        matches!(self.index, Err(ShardError::Io(_) | ShardError::Changed(_)))
    }

    pub fn rel(&self) -> &Path {
        &self.rel
    }

    /// Whether its reader is going forward through the shard's file, so that the next
    /// shard is likely read next ([`StoreFile::streaming`]).
    pub fn streaming(&self) -> bool {
        self.file.as_ref().is_some_and(|f| f.streaming())
    }

    /// Whether [`Shard::claim_next`] was done, in any pass (a reader went through it).
    pub fn next_claimed(&self) -> bool {
        self.next_claimed.load(std::sync::atomic::Ordering::Relaxed) != 0
    }

    /// Whether [`Shard::claim_next`] was done in the pass over its file now under way
    /// ([`StoreFile::pass`]).
    pub fn claimed_this_pass(&self) -> bool {
        self.next_claimed.load(std::sync::atomic::Ordering::Relaxed) == self.pass() + 1
    }

    /// Passes over its file read through so far ([`StoreFile::pass`]).
    pub fn pass(&self) -> u64 {
        self.file.as_ref().map_or(0, |f| f.pass())
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

    /// True once per pass over this shard's file as loaded ([`StoreFile::pass`]: once
    /// its reader went through what was held of it, the next pass loads ahead again):
    /// the caller loads the next shards ahead.
    pub fn claim_next(&self) -> bool {
        let this = self.pass() + 1;
        self.next_claimed
            .swap(this, std::sync::atomic::Ordering::Relaxed)
            != this
    }

    /// Whether a shard file exists.
    pub fn exists(&self) -> bool {
        self.file.is_some()
    }

    pub fn meta(&self) -> Option<&EntryMeta> {
        self.meta.as_ref()
    }

    /// Its bytes that nothing uses ([`shard_read::dead_space`]), read through the file it
    /// was loaded from; 0 for a shard with no file, `None` for one whose index could not
    /// be read.
    pub fn dead_bytes(&self, level: &ShardLevel) -> Option<std::io::Result<u64>> {
        let index = self.index.as_ref().ok()?;
        Some(match (&self.file, &self.meta) {
            (Some(file), Some(meta)) => {
                shard_read::read_dead_space(file.as_ref(), level, meta.len, index)
            }
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
            range = shard_read::nested_range(range, r);
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
        let loaded = match shard_read::read_nested_index(file, level, block) {
            Ok(i) => Ok(Arc::new(i)),
            Err(ReadError::Io(e)) => Err(ShardError::Io(e.to_string())),
            Err(ReadError::Index(err)) => {
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
    pub(super) fn weight(&self) -> usize {
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

impl From<ReadError> for ShardError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Io(e) => e.into(),
            ReadError::Index(e) => ShardError::Index(e),
        }
    }
}

pub use super::shard_cache::{CommitTicket, FAILED_READ_KEPT, LoadHook, ShardCache, Truncated};
