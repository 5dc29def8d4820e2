//! Writes: files open for writing (held in memory, PUT whole at sync and close) and
//! shard commits (read, merge, PUT conditional on the version read; again on a lost race).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};
use parking_lot::Mutex;

use super::BucketStore;
use super::client::{self, Deadline, dir_meta, to_io};
use super::meta::MetaCache;
use crate::format::ShardLevel;
use crate::format::shard_write::dense_shard_by_slot;
use crate::store::commit::{CommitError, CommitOutcome, Merge, StoredShard};
use crate::store::rewrite::{densify, rewrite_shard};
use crate::store::{EntryKind, EntryMeta, StoreFile, StoreFileRw};

/// How often a shard commit tries again when another writer changed the shard first.
pub(super) const COMMIT_ATTEMPTS: u32 = 12;

/// A file open for writing: its bytes in memory (and whether they changed since the last
/// PUT), PUT whole when synced or closed, to where the file is now.
pub(super) struct RwState {
    pub(super) data: Mutex<(Vec<u8>, bool)>,
    /// Its name and key now: the name it was opened at, or the one a rename gave it
    /// since; `None` once unlinked, when its bytes go nowhere, as an unlinked file's on
    /// a disk. Before, a file unlinked while open (or before the idle commit of its
    /// writes) was PUT again at its close, and came back (found by an adversarial tester).
    pub(super) at: Mutex<Option<(PathBuf, ObjPath)>>,
    /// When its bytes last changed (its mtime while open).
    pub(super) changed: Mutex<SystemTime>,
}

/// A file open for writing, read through another open of its name: its bytes as
/// written so far, as `stat` shows their length. Before, such a read fetched the stored
/// object (empty from its creation until the first PUT, older after), so a file written
/// and `fsync`ed read back empty while still open with `open_checks` (found by an
/// adversarial tester; a `mv` of its directory then copied it empty).
pub(super) struct OpenForWritingReader(pub(super) Arc<RwState>);

impl StoreFile for OpenForWritingReader {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        read_state(&self.0, buf, offset)
    }

    fn meta(&self) -> io::Result<EntryMeta> {
        Ok(self.0.meta())
    }
}

fn read_state(state: &RwState, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let d = state.data.lock();
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(d.0.len());
    let n = buf.len().min(d.0.len() - start);
    buf[..n].copy_from_slice(&d.0[start..start + n]);
    Ok(n)
}

impl RwState {
    /// What `stat` says of it: its length so far, and as mtime the time of its last
    /// change, so that the kernel drops pages it holds of the file once it changed.
    pub(super) fn meta(&self) -> EntryMeta {
        let mut m = dir_meta();
        m.kind = EntryKind::File;
        m.perm = 0o644;
        m.len = self.data.lock().0.len() as u64;
        m.mtime = *self.changed.lock();
        m.ctime = m.mtime;
        m
    }

    fn touch(&self) {
        *self.changed.lock() = SystemTime::now();
    }

    /// The file was unlinked: what it holds is stored nowhere.
    pub(super) fn unlinked(&self) {
        *self.at.lock() = None;
    }

    /// The file was renamed to `rel` (key `key`): what it holds goes there.
    pub(super) fn renamed(&self, rel: &Path, key: ObjPath) {
        let mut at = self.at.lock();
        if at.is_some() {
            *at = Some((rel.to_path_buf(), key));
        }
    }
}

/// The files open for writing, by name: each file open at a name (several, where the
/// daemon opened one twice), so that an unlink or rename reaches every one of them.
#[derive(Default)]
pub(super) struct OpenForWriting(Mutex<HashMap<PathBuf, Vec<Weak<RwState>>>>);

impl OpenForWriting {
    pub(super) fn add(&self, rel: &Path, state: &Arc<RwState>) {
        let mut map = self.0.lock();
        let open = map.entry(rel.to_path_buf()).or_default();
        open.retain(|w| w.strong_count() > 0);
        open.push(Arc::downgrade(state));
    }

    /// The newest file open at `rel`: what `stat` and reads of the name see.
    pub(super) fn newest(&self, rel: &Path) -> Option<Arc<RwState>> {
        self.0.lock().get(rel)?.iter().rev().find_map(Weak::upgrade)
    }

    /// Every file open at `rel`, oldest first.
    pub(super) fn all(&self, rel: &Path) -> Vec<Arc<RwState>> {
        self.0
            .lock()
            .get(rel)
            .map_or_else(Vec::new, |v| v.iter().filter_map(Weak::upgrade).collect())
    }

    /// Every file open at `rel`, taken out of the table.
    pub(super) fn take(&self, rel: &Path) -> Vec<Arc<RwState>> {
        self.0
            .lock()
            .remove(rel)
            .map_or_else(Vec::new, |v| v.iter().filter_map(Weak::upgrade).collect())
    }

    /// The files open at `from` are at `to` now; those that were at `to` are gone.
    pub(super) fn moved(&self, from: &Path, to: &Path) {
        let mut map = self.0.lock();
        match map.remove(from) {
            Some(open) => {
                map.insert(to.to_path_buf(), open);
            }
            None => {
                map.remove(to);
            }
        }
    }
}

impl BucketStore {
    /// The shard as this mount's PUT of `len` bytes left it, from the PUT's answer: the
    /// version its ETag names, which is what a cached index is checked against
    /// ([`EntryMeta::version`] of an object: its ETag and length), so the committing
    /// mount keeps the index it wrote instead of reading it again (before: one GET of
    /// it after every commit). Learned from the answer, never by a HEAD afterwards, which
    /// could find a later writer's version. The answer names no Last-Modified: its
    /// chunks show this machine's time of the PUT until the shard is loaded again.
    /// `None` where the answer names no ETag: the index is read again.
    fn stored_as_put(
        &self,
        rel: &Path,
        len: u64,
        answer: object_store::PutResult,
    ) -> Option<StoredShard> {
        let e_tag = answer.e_tag.filter(|e| client::names_contents(e))?;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .ok()?;
        let meta = object_store::ObjectMeta {
            location: self.key(rel).ok()?,
            last_modified: chrono::DateTime::from_timestamp(
                i64::try_from(now.as_secs()).ok()?,
                now.subsec_nanos(),
            )?,
            size: len,
            e_tag: Some(e_tag),
            version: answer.version,
        };
        let entry = client::meta_of(&meta);
        let file = self.object_file(rel, meta).ok()?;
        Some(StoredShard {
            file: Some(Box::new(file)),
            meta: Some(entry),
        })
    }
}

pub(super) struct ObjectFileRw {
    pub(super) store: Arc<PutTarget>,
    pub(super) state: Arc<RwState>,
}

/// What an open-for-writing file needs of its store: PUT and the runtime.
pub(super) struct PutTarget {
    pub(super) inner: Arc<dyn ObjectStore>,
    pub(super) handle: tokio::runtime::Handle,
    pub(super) meta: Arc<MetaCache>,
    pub(super) deadline: Deadline,
}

impl ObjectFileRw {
    /// Where the file is now, for messages.
    fn rel(&self) -> PathBuf {
        self.state
            .at
            .lock()
            .as_ref()
            .map_or_else(|| PathBuf::from("(unlinked)"), |(rel, _)| rel.clone())
    }

    fn flush(&self) -> io::Result<()> {
        let mut d = self.state.data.lock();
        if !d.1 {
            return Ok(());
        }
        // Held across the PUT: an unlink or rename of the file waits for it, so that
        // neither lands between the name read here and the PUT to it.
        let at = self.state.at.lock();
        let Some((rel, key)) = at.as_ref() else {
            d.1 = false;
            return Ok(());
        };
        let store = &self.store;
        let payload = PutPayload::from(d.0.clone());
        let put = store
            .deadline
            .run(&store.handle, store.inner.put(key, payload));
        store.meta.forget(rel);
        put.map_err(|e| to_io(rel, e))?;
        d.1 = false;
        Ok(())
    }
}

impl StoreFile for ObjectFileRw {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        read_state(&self.state, buf, offset)
    }

    fn meta(&self) -> io::Result<EntryMeta> {
        Ok(self.state.meta())
    }
}

impl StoreFileRw for ObjectFileRw {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut d = self.state.data.lock();
        let at = usize::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let end = at
            .checked_add(buf.len())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFBIG))?;
        if d.0.len() < end {
            d.0.resize(end, 0);
        }
        d.0[at..end].copy_from_slice(buf);
        d.1 = true;
        self.state.touch();
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let mut d = self.state.data.lock();
        d.0.resize(len, 0);
        d.1 = true;
        self.state.touch();
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.flush()
    }
}

impl Drop for ObjectFileRw {
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            log::error!("{}: not stored at close: {e}", self.rel().display());
        }
    }
}

impl BucketStore {
    pub(super) fn rewrite_dense_shard(
        &self,
        rel: &Path,
        level: &ShardLevel,
    ) -> Result<Option<(u64, u64)>, CommitError> {
        let io_err = |e: io::Error| CommitError::Io {
            path: rel.to_path_buf(),
            source: e,
        };
        let mut backoff = Duration::from_millis(10);
        for attempt in 1..=COMMIT_ATTEMPTS {
            let Some((current, version)) = self.get_versioned(rel).map_err(io_err)? else {
                return Ok(None);
            };
            let dense = densify(rel, level, &current)?;
            let lens = (current.len() as u64, dense.len() as u64);
            match self.put(rel, dense, PutMode::Update(version)) {
                Ok(()) => return Ok(Some(lens)),
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) && attempt < COMMIT_ATTEMPTS => {
                    std::thread::sleep(backoff + jitter(backoff));
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(io_err(e)),
            }
        }
        Err(io_err(io::Error::other(
            "the shard kept changing under this rewrite",
        )))
    }

    pub(super) fn commit(
        &self,
        rel: &Path,
        level: &ShardLevel,
        merge: &mut Merge<'_, '_>,
    ) -> Result<CommitOutcome, CommitError> {
        let io_err = |e: io::Error| CommitError::Io {
            path: rel.to_path_buf(),
            source: e,
        };
        let mut backoff = Duration::from_millis(10);
        for attempt in 1..=COMMIT_ATTEMPTS {
            let current = self.get_versioned(rel).map_err(io_err)?;
            let rewrite = rewrite_shard(rel, level, current.as_ref().map(|(b, _)| &b[..]), merge)?;
            let Some(mut bytes) = rewrite.bytes else {
                return Ok(rewrite.outcome);
            };
            let mut outcome = rewrite.outcome;
            if outcome.removed {
                if current.is_none() {
                    return Ok(outcome);
                }
                // No conditional DELETE: an index-only shard that keeps the deletions'
                // close times, so that an older write from another mount cannot win.
                let n = rewrite.times.as_slice().len();
                bytes = dense_shard_by_slot(level, &vec![None; n], &rewrite.times).0;
                outcome.removed = false;
                outcome.rewritten = true;
                outcome.new_len = bytes.len() as u64;
                outcome.bytes_written = outcome.new_len;
            }
            let mode = match current {
                None => PutMode::Create,
                Some((_, version)) => PutMode::Update(version),
            };
            let len = bytes.len() as u64;
            match self.put_answered(rel, bytes, mode) {
                Ok(answer) => {
                    outcome.stored = self.stored_as_put(rel, len, answer);
                    return Ok(outcome);
                }
                Err(e)
                    if matches!(e.raw_os_error(), Some(libc::EEXIST | libc::ESTALE))
                        && attempt < COMMIT_ATTEMPTS =>
                {
                    log::debug!(
                        "{}: changed by another writer; merging again (attempt {attempt})",
                        rel.display()
                    );
                    std::thread::sleep(backoff + jitter(backoff));
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(io_err(e)),
            }
        }
        Err(io_err(io::Error::other(
            "the shard kept changing under this commit",
        )))
    }
}

/// Up to a quarter of `d`, so that racing writers spread out.
pub(super) fn jitter(d: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    d / 4 * (nanos % 1000) / 1000
}
