//! [`MemoryStore`]: a store held in memory, for tests of the filesystem core without a
//! disk, with fault injection where faults happen ([`Fault`]): the N-th shard commit
//! fails with an errno (ENOSPC, EDQUOT, EIO, ...) before anything changes, or is *cut*:
//! the write is torn off and the commit fails, which an object store's atomic PUT turns
//! into "nothing changed".
//!
//! Shard commits here work as on object storage: read the whole shard, merge, write it
//! again densely (no dead space) with its close times, and replace it in one step. A
//! commit holds the store's lock, so the version it read cannot change under it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;

use super::commit::{CommitError, CommitOutcome, Merge, ShardSnapshot};
use super::shard::{ReadIndexError, read_index, read_times};
use super::{EntryKind, EntryMeta, ListEntry, SpaceInfo, Store, StoreFile};
use crate::format::index::IndexLocation;
use crate::format::{ChunkRange, CloseTimes, ShardIndex, ShardLevel};

/// A fault to inject into shard commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The `nth` commit from now (0: the next) fails with `errno`, changing nothing.
    Fail { nth: usize, errno: i32 },
    /// The `nth` commit from now is cut off after `keep` bytes of the new shard: the
    /// commit fails with `EIO` and the shard stays as it was.
    Cut { nth: usize, keep: usize },
}

#[derive(Default)]
struct Inner {
    files: BTreeMap<PathBuf, Arc<Vec<u8>>>,
    dirs: std::collections::BTreeSet<PathBuf>,
    faults: Vec<Fault>,
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

struct MemFile {
    data: Arc<Vec<u8>>,
}

impl StoreFile for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.data.len());
        let n = buf.len().min(self.data.len() - start);
        buf[..n].copy_from_slice(&self.data[start..start + n]);
        Ok(n)
    }

    fn meta(&self) -> io::Result<EntryMeta> {
        Ok(file_meta(self.data.len() as u64))
    }
}

fn file_meta(len: u64) -> EntryMeta {
    EntryMeta {
        kind: EntryKind::File,
        len,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        perm: 0o644,
        uid: 0,
        gid: 0,
        ino: 0,
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// An independent copy of the store as it is now (faults and counters not copied).
    pub fn deep_copy(&self) -> MemoryStore {
        let inner = self.inner.lock();
        MemoryStore {
            inner: Arc::new(Mutex::new(Inner {
                files: inner.files.clone(),
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
        inner.files.insert(rel.to_path_buf(), Arc::new(bytes));
    }

    pub fn get(&self, rel: impl AsRef<Path>) -> Option<Vec<u8>> {
        self.inner
            .lock()
            .files
            .get(rel.as_ref())
            .map(|b| b.as_ref().clone())
    }

    /// Inject `fault` into a later commit.
    pub fn inject(&self, fault: Fault) {
        self.inner.lock().faults.push(fault);
    }

    /// Shard commits attempted so far.
    pub fn commits(&self) -> usize {
        self.inner.lock().commits
    }

    /// Writes that were cut off by a [`Fault::Cut`].
    pub fn torn_writes(&self) -> usize {
        self.inner.lock().torn.len()
    }

    /// The fault for the commit now starting (numbered from the injection), if any.
    fn fault_now(inner: &mut Inner) -> Option<Fault> {
        let mut hit = None;
        let mut left = Vec::new();
        for mut f in std::mem::take(&mut inner.faults) {
            let nth = match &mut f {
                Fault::Fail { nth, .. } | Fault::Cut { nth, .. } => nth,
            };
            if *nth == 0 && hit.is_none() {
                hit = Some(f);
            } else {
                *nth = nth.saturating_sub(1);
                left.push(f);
            }
        }
        inner.faults = left;
        hit
    }
}

/// A dense shard of `chunks` (per slot) with `times`, index at `level.index_location`.
pub(crate) fn dense_shard(
    level: &ShardLevel,
    chunks: &[Option<&[u8]>],
    times: &CloseTimes,
) -> Vec<u8> {
    let index_len = level.index_len();
    let mut at = match level.index_location {
        IndexLocation::Start => index_len,
        IndexLocation::End => 0,
    };
    let mut body = Vec::new();
    let entries = chunks
        .iter()
        .map(|c| {
            c.map(|b| {
                body.extend_from_slice(b);
                let r = ChunkRange {
                    offset: at,
                    nbytes: b.len() as u64,
                };
                at += r.nbytes;
                r
            })
        })
        .collect();
    let index = ShardIndex::from_entries(entries).encode(level.index_codecs);
    let block = if times.any() {
        times.encode()
    } else {
        Vec::new()
    };
    match level.index_location {
        IndexLocation::Start => [index, body, block].concat(),
        IndexLocation::End => [body, block, index].concat(),
    }
}

impl Store for MemoryStore {
    fn stat(&self, rel: &Path) -> io::Result<Option<EntryMeta>> {
        let inner = self.inner.lock();
        if let Some(f) = inner.files.get(rel) {
            return Ok(Some(file_meta(f.len() as u64)));
        }
        if rel.as_os_str().is_empty() || inner.dirs.contains(rel) {
            let mut m = file_meta(0);
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
            .map(|data| Box::new(MemFile { data: data.clone() }) as Box<dyn StoreFile>))
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

    fn commit_shard(
        &self,
        rel: &Path,
        level: &ShardLevel,
        merge: &mut Merge<'_, '_>,
    ) -> Result<CommitOutcome, CommitError> {
        let mut inner = self.inner.lock();
        inner.commits += 1;
        let fault = Self::fault_now(&mut inner);
        let current = inner.files.get(rel).cloned();
        let io_err = |e: io::Error| CommitError::Io {
            path: rel.to_path_buf(),
            source: e,
        };
        let rewrite = rewrite_shard(rel, level, current.as_deref().map(Vec::as_slice), merge)?;
        let Some(bytes) = rewrite.bytes else {
            return Ok(rewrite.outcome);
        };
        match fault {
            Some(Fault::Fail { errno, .. }) => {
                return Err(io_err(io::Error::from_raw_os_error(errno)));
            }
            Some(Fault::Cut { keep, .. }) => {
                let torn = bytes[..keep.min(bytes.len())].to_vec();
                inner.torn.push((rel.to_path_buf(), torn));
                return Err(io_err(io::Error::from_raw_os_error(libc::EIO)));
            }
            None => {}
        }
        if rewrite.outcome.removed {
            inner.files.remove(rel);
            return Ok(rewrite.outcome);
        }
        inner.bytes_written += rewrite.outcome.new_len;
        for dir in rel.ancestors().skip(1) {
            inner.dirs.insert(dir.to_path_buf());
        }
        inner.files.insert(rel.to_path_buf(), Arc::new(bytes));
        Ok(rewrite.outcome)
    }
}

/// A shard commit worked out on the shard's bytes as they are (`None`: no shard), as an
/// object store makes it: the new shard written whole and densely.
pub(crate) struct Rewrite {
    /// What the commit does; `removed` when no chunk is left.
    pub outcome: CommitOutcome,
    /// The new shard (empty when removed); `None` when nothing changes.
    pub bytes: Option<Vec<u8>>,
    /// The close times after the commit, per slot.
    pub times: CloseTimes,
}

/// The shard `data` without dead space: every stored chunk's bytes in slot order, the
/// same index codecs and location, its close times kept.
pub(crate) fn densify(rel: &Path, level: &ShardLevel, data: &[u8]) -> Result<Vec<u8>, CommitError> {
    let f = MemFile {
        data: Arc::new(data.to_vec()),
    };
    let len = data.len() as u64;
    let index = read_index(&f, level, 0, len).map_err(|e| match e {
        ReadIndexError::Io(source) => CommitError::Io {
            path: rel.to_path_buf(),
            source,
        },
        ReadIndexError::Index(err) => CommitError::Corrupt {
            path: rel.to_path_buf(),
            err,
        },
    })?;
    let n = index.entries().len();
    let times = read_times(&f, level, len, &index)
        .map_err(|source| CommitError::Io {
            path: rel.to_path_buf(),
            source,
        })?
        .unwrap_or_else(|| CloseTimes::unknown(n));
    let chunks: Vec<Option<&[u8]>> = index
        .entries()
        .iter()
        .map(|e| e.map(|r| &data[r.offset as usize..r.end() as usize]))
        .collect();
    Ok(dense_shard(level, &chunks, &times))
}

/// Read the shard `current`, let `merge` decide, and make the new shard's bytes.
pub(crate) fn rewrite_shard(
    rel: &Path,
    level: &ShardLevel,
    current: Option<&[u8]>,
    merge: &mut Merge<'_, '_>,
) -> Result<Rewrite, CommitError> {
    let n = usize::try_from(level.n_chunks())
        .map_err(|_| CommitError::BadUpdate("index too large".into()))?;
    let io_err = |e: io::Error| CommitError::Io {
        path: rel.to_path_buf(),
        source: e,
    };
    let index_of = |data: &[u8]| -> Result<ShardIndex, CommitError> {
        let f = MemFile {
            data: Arc::new(data.to_vec()),
        };
        read_index(&f, level, 0, data.len() as u64).map_err(|e| match e {
            ReadIndexError::Io(e) => io_err(e),
            ReadIndexError::Index(err) => CommitError::Corrupt {
                path: rel.to_path_buf(),
                err,
            },
        })
    };
    let (index, times, old_len) = match current {
        None => (ShardIndex::empty(n), CloseTimes::unknown(n), 0),
        Some(data) => {
            let f = MemFile {
                data: Arc::new(data.to_vec()),
            };
            let len = data.len() as u64;
            let index = index_of(data)?;
            let times = read_times(&f, level, len, &index)
                .map_err(io_err)?
                .unwrap_or_else(|| CloseTimes::unknown(n));
            (index, times, len)
        }
    };
    let updates = merge(&ShardSnapshot {
        index: &index,
        times: &times,
        exists: current.is_some(),
    });
    if let Some(bad) = updates.iter().find(|u| u.slot >= n) {
        return Err(CommitError::BadUpdate(format!(
            "slot {} of a shard with {n} chunks",
            bad.slot
        )));
    }
    let old = current.unwrap_or(&[]);
    let mut chunks: Vec<Option<&[u8]>> = index
        .entries()
        .iter()
        .map(|e| e.map(|r| &old[r.offset as usize..r.end() as usize]))
        .collect();
    let mut new_times = times.clone();
    let mut changed = false;
    for u in &updates {
        changed |= u.data.is_some() || chunks[u.slot].is_some();
        chunks[u.slot] = u.data;
        new_times.set(u.slot, u.closed);
    }
    let mut outcome = CommitOutcome {
        index: index.clone(),
        old_len,
        new_len: old_len,
        bytes_written: 0,
        removed: current.is_none(),
        rewritten: false,
        applied: updates.len(),
        recovered: Vec::new(),
    };
    if !changed {
        return Ok(Rewrite {
            outcome,
            bytes: None,
            times: new_times,
        });
    }
    if chunks.iter().all(Option::is_none) {
        outcome.index = ShardIndex::empty(n);
        outcome.new_len = 0;
        outcome.removed = true;
        return Ok(Rewrite {
            outcome,
            bytes: Some(Vec::new()),
            times: new_times,
        });
    }
    let bytes = dense_shard(level, &chunks, &new_times);
    outcome.index = index_of(&bytes)?;
    outcome.new_len = bytes.len() as u64;
    outcome.bytes_written = outcome.new_len;
    outcome.removed = false;
    outcome.rewritten = true;
    Ok(Rewrite {
        outcome,
        bytes: Some(bytes),
        times: new_times,
    })
}
