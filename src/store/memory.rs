//! [`MemoryStore`]: a store held in memory, for tests of the filesystem core without a
//! disk. It can *cut* a shard commit ([`MemoryStore::cut_commit`]): the write stops
//! after some bytes and the commit fails with `EIO`. On object storage an atomic PUT
//! turns that into "nothing changed". The cut lives here, not in
//! [`super::faulty::FaultyStore`], because how much of a torn write lands depends on how
//! this store writes a shard. Other faults (a commit, read or listing that fails with
//! an errno) come from wrapping the store in a `FaultyStore`.
//!
//! Shard commits here work as on object storage ([`super::rewrite`]): read the whole
//! shard, merge, write it again densely (no dead space) with its close times, and
//! replace it in one step. A commit holds the store's lock, so the version it read
//! cannot change under it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::commit::{CommitError, CommitOutcome, Merge, StoredShard};
use super::rewrite::{BytesFile, bytes_meta, rewrite_shard};
use super::{
    Capabilities, Commits, DirRenames, EntryKind, EntryMeta, ListEntry, Reads, SpaceInfo, Store,
    StoreFile,
};
use crate::format::ShardLevel;

/// A commit to cut off: the `nth` one from when it was set (0: the next one), after
/// `keep` bytes of the new shard.
#[derive(Clone, Copy, Debug)]
struct Cut {
    nth: usize,
    keep: usize,
}

#[derive(Default)]
struct Inner {
    files: BTreeMap<PathBuf, MemFile>,
    /// Files written so far: the version of the next one ([`MemFile::version`]).
    writes: u64,
    dirs: std::collections::BTreeSet<PathBuf>,
    cuts: Vec<Cut>,
    commits: usize,
    /// Bytes written by commits (whole shards), for tests of write amplification.
    bytes_written: u64,
    /// Shard writes that were cut off (the bytes that got through), for inspection.
    torn: Vec<(PathBuf, Vec<u8>)>,
}

/// An in-memory store.
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
}

/// A stored file: its bytes, and a number no other file this store wrote has (shown as
/// its `ino`): a file replaced by one of the same length is another version, as a file
/// renamed over another is another inode on a disk. Before, every file here had inode
/// 0, so a cached index of a shard replaced by another of its length looked fresh.
#[derive(Clone)]
struct MemFile {
    data: Arc<Vec<u8>>,
    version: u64,
}

impl MemFile {
    fn new(inner: &mut Inner, data: Arc<Vec<u8>>) -> MemFile {
        inner.writes += 1;
        MemFile {
            data,
            version: inner.writes,
        }
    }

    fn meta(&self) -> EntryMeta {
        EntryMeta {
            ino: self.version,
            ..bytes_meta(self.data.len() as u64)
        }
    }
}

impl StoreFile for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        BytesFile(&self.data).read_at(buf, offset)
    }

    fn meta(&self) -> io::Result<EntryMeta> {
        Ok(MemFile::meta(self))
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// An independent copy of the store as it is now (cuts and counters not copied).
    pub fn deep_copy(&self) -> MemoryStore {
        let inner = self.inner.lock();
        MemoryStore {
            inner: Arc::new(Mutex::new(Inner {
                files: inner.files.clone(),
                writes: inner.writes,
                dirs: inner.dirs.clone(),
                ..Inner::default()
            })),
        }
    }

    /// Put a file (and its directories).
    pub fn put(&self, rel: impl AsRef<Path>, bytes: Vec<u8>) {
        let rel = rel.as_ref();
        let mut inner = self.inner.lock();
        for dir in rel.ancestors().skip(1) {
            inner.dirs.insert(dir.to_path_buf());
        }
        let file = MemFile::new(&mut inner, Arc::new(bytes));
        inner.files.insert(rel.to_path_buf(), file);
    }

    pub fn get(&self, rel: impl AsRef<Path>) -> Option<Vec<u8>> {
        self.inner
            .lock()
            .files
            .get(rel.as_ref())
            .map(|f| f.data.as_ref().clone())
    }

    /// Cut off the `nth` shard commit from now (0: the next one) after `keep` bytes of
    /// the new shard. That commit fails with `EIO` and the shard stays as it was.
    pub fn cut_commit(&self, nth: usize, keep: usize) {
        self.inner.lock().cuts.push(Cut { nth, keep });
    }

    /// Shard commits attempted so far.
    pub fn commits(&self) -> usize {
        self.inner.lock().commits
    }

    /// Writes that were cut off by [`MemoryStore::cut_commit`].
    pub fn torn_writes(&self) -> usize {
        self.inner.lock().torn.len()
    }

    /// The cut for the commit now starting (counted from when it was set), if any.
    fn cut_now(inner: &mut Inner) -> Option<Cut> {
        let mut hit = None;
        let mut left = Vec::new();
        for mut cut in std::mem::take(&mut inner.cuts) {
            if cut.nth == 0 && hit.is_none() {
                hit = Some(cut);
            } else {
                cut.nth = cut.nth.saturating_sub(1);
                left.push(cut);
            }
        }
        inner.cuts = left;
        hit
    }
}

impl Store for MemoryStore {
    fn stat(&self, rel: &Path) -> io::Result<Option<EntryMeta>> {
        let inner = self.inner.lock();
        if let Some(f) = inner.files.get(rel) {
            return Ok(Some(f.meta()));
        }
        if rel.as_os_str().is_empty() || inner.dirs.contains(rel) {
            let mut m = bytes_meta(0);
            m.kind = EntryKind::Dir;
            m.perm = 0o755;
            return Ok(Some(m));
        }
        Ok(None)
    }

    fn list(&self, rel: &Path) -> io::Result<Vec<ListEntry>> {
        let inner = self.inner.lock();
        let mut out = Vec::new();
        let children = |p: &PathBuf| p.parent() == Some(rel) && p.as_os_str() != rel.as_os_str();
        for d in inner.dirs.iter().filter(|p| children(p)) {
            out.push(ListEntry {
                name: d.file_name().map(OsString::from).unwrap_or_default(),
                kind: EntryKind::Dir,
            });
        }
        for f in inner.files.keys().filter(|p| children(p)) {
            out.push(ListEntry {
                name: f.file_name().map(OsString::from).unwrap_or_default(),
                kind: EntryKind::File,
            });
        }
        Ok(out)
    }

    fn open(&self, rel: &Path) -> io::Result<Option<Box<dyn StoreFile>>> {
        Ok(self
            .inner
            .lock()
            .files
            .get(rel)
            .map(|file| Box::new(file.clone()) as Box<dyn StoreFile>))
    }

    fn read_link(&self, _rel: &Path) -> io::Result<PathBuf> {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn space(&self) -> io::Result<SpaceInfo> {
        Ok(SpaceInfo::default())
    }

    fn describe(&self) -> String {
        "memory".into()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reads: Reads::Local,
            commits: Commits::Whole,
            dir_renames: DirRenames::Refused,
        }
    }

    fn commit_shard(
        &self,
        rel: &Path,
        level: &ShardLevel,
        merge: &mut Merge<'_, '_>,
    ) -> Result<CommitOutcome, CommitError> {
        let mut inner = self.inner.lock();
        inner.commits += 1;
        let cut = Self::cut_now(&mut inner);
        let current = inner.files.get(rel).map(|f| f.data.clone());
        let io_err = |e: io::Error| CommitError::Io {
            path: rel.to_path_buf(),
            source: e,
        };
        let rewrite = rewrite_shard(rel, level, current.as_deref().map(Vec::as_slice), merge)?;
        let Some(bytes) = rewrite.bytes else {
            return Ok(rewrite.outcome);
        };
        if let Some(Cut { keep, .. }) = cut {
            let torn = bytes[..keep.min(bytes.len())].to_vec();
            inner.torn.push((rel.to_path_buf(), torn));
            return Err(io_err(io::Error::from_raw_os_error(libc::EIO)));
        }
        let mut outcome = rewrite.outcome;
        if outcome.removed {
            inner.files.remove(rel);
            outcome.stored = Some(StoredShard::removed());
            return Ok(outcome);
        }
        inner.bytes_written += outcome.new_len;
        for dir in rel.ancestors().skip(1) {
            inner.dirs.insert(dir.to_path_buf());
        }
        // What a load would find, from the bytes written (under the store's lock).
        let file = MemFile::new(&mut inner, Arc::new(bytes));
        inner.files.insert(rel.to_path_buf(), file.clone());
        outcome.stored = Some(StoredShard {
            meta: Some(file.meta()),
            file: Some(Box::new(file)),
        });
        Ok(outcome)
    }
}
