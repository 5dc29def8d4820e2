//! Metadata documents of the store written through the mount: a group's or an unsharded
//! array's `zarr.json`, and the `zarr.json` of an array being made. Sharded arrays'
//! metadata has its own path (`commit.rs`); these are store files.
//!
//! Their bytes gather in memory, shared by every handle of the file, and reach the store
//! only whole: the write (or truncate) that makes them one whole JSON document replaces
//! the stored file at once ([`Store::write_atomically`]). A document cut short never
//! reaches the store, which keeps what it had (nothing, for a new file); the commit that
//! finds it unfinished (its `fsync`, its last close, the unmount) is refused with
//! `EINVAL`. While a document is being written, readers of this mount see its bytes, as
//! on a local file system.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::SystemTime;

use parking_lot::Mutex;

use crate::store::{EntryKind, EntryMeta, Store, StoreFile, StoreFileRw};

/// The file name of the documents kept here.
const DOC_NAME: &str = "zarr.json";

/// The largest document held: a write or truncate past it is `EFBIG` (`truncate -s 1T
/// zarr.json` must not try to allocate a terabyte).
const MAX_DOC_BYTES: usize = 64 << 20;

fn too_big() -> io::Error {
    io::Error::from_raw_os_error(libc::EFBIG)
}

/// Whether `b` is one whole JSON document (cheaply refused unless it ends in `}`).
pub(super) fn whole_json(b: &[u8]) -> bool {
    b.iter().rev().find(|c| !c.is_ascii_whitespace()) == Some(&b'}')
        && serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok()
}

/// Whether store path `rel` names a metadata document written only whole.
pub(super) fn is_doc(rel: &Path) -> bool {
    rel.file_name().is_some_and(|n| n == DOC_NAME)
}

/// One document being written.
pub(super) struct PendingDoc {
    rel: PathBuf,
    store: Arc<dyn Store>,
    /// Handles open on it ([`DocFile`]s alive). Atomic, as is `gone`: the table's lock
    /// is never held waiting for `state`, which a store of the document holds.
    opens: AtomicU32,
    /// Its name was taken away (unlinked): it is never stored again.
    gone: AtomicBool,
    state: Mutex<DocState>,
}

struct DocState {
    data: Vec<u8>,
    /// `data` is what the store holds (nothing to store).
    stored: bool,
    mtime: SystemTime,
    /// Mode and owner the stored file gets (a new file replaces it at every store): the
    /// stored one's, or what `chmod`/`chown` set meanwhile.
    mode: Option<u32>,
    owner: (Option<u32>, Option<u32>),
}

impl PendingDoc {
    /// Whether its bytes are one whole JSON document.
    pub(super) fn whole(&self) -> bool {
        whole_json(&self.state.lock().data)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.state.lock().data.is_empty()
    }

    /// Handles open on it now.
    pub(super) fn opens(&self) -> u32 {
        self.opens.load(Ordering::SeqCst)
    }

    pub(super) fn bytes(&self) -> Vec<u8> {
        self.state.lock().data.clone()
    }

    /// Its attributes: the stored file's (or, for a new one, its directory's, as a file),
    /// with its own length and time.
    pub(super) fn meta(&self) -> io::Result<EntryMeta> {
        let st = self.state.lock();
        let base = match self.store.stat(&self.rel)? {
            Some(m) => m,
            None => {
                let dir = self.rel.parent().unwrap_or(Path::new(""));
                let mut m = self.store.stat(dir)?.ok_or(io::ErrorKind::NotFound)?;
                m.perm &= 0o666;
                m
            }
        };
        Ok(EntryMeta {
            kind: EntryKind::File,
            len: st.data.len() as u64,
            mtime: st.mtime.max(base.mtime),
            // Not the stored document's contents: told apart by length and time.
            content_id: false,
            ..base
        })
    }

    /// The error of a commit that finds it unfinished.
    pub(super) fn unfinished_error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: not a whole JSON document: not stored (the store keeps the document \
                 it had)",
                self.rel.display()
            ),
        )
    }

    fn change(&self, f: impl FnOnce(&mut Vec<u8>)) -> io::Result<()> {
        let mut st = self.state.lock();
        f(&mut st.data);
        st.stored = false;
        st.mtime = SystemTime::now();
        if self.gone.load(Ordering::SeqCst) || !whole_json(&st.data) {
            return Ok(());
        }
        // Stored under the lock: two writers' documents land in the order they were made.
        self.store.write_atomically(&self.rel, &st.data)?;
        st.stored = true;
        if st.mode.is_some() || st.owner != (None, None) {
            self.store
                .set_mode_owner(&self.rel, st.mode, st.owner.0, st.owner.1)?;
        }
        Ok(())
    }

    /// `chmod`/`chown` of the document: kept for the file it is stored as, and applied
    /// to the stored file now if there is one.
    pub(super) fn set_mode_owner(
        &self,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> io::Result<()> {
        let mut st = self.state.lock();
        st.mode = mode.or(st.mode);
        st.owner = (uid.or(st.owner.0), gid.or(st.owner.1));
        match self.store.set_mode_owner(&self.rel, mode, uid, gid) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            res => res,
        }
    }
}

/// The documents being written, by store path.
#[derive(Default)]
pub(super) struct PendingDocs {
    docs: Mutex<HashMap<PathBuf, Arc<PendingDoc>>>,
}

impl PendingDocs {
    /// The document being written at `rel`, if any.
    pub(super) fn get(&self, rel: &Path) -> Option<Arc<PendingDoc>> {
        self.docs.lock().get(rel).cloned()
    }

    /// Names of documents being written in store directory `dir` that the store does
    /// not hold yet.
    pub(super) fn new_in(&self, dir: &Path) -> Vec<std::ffi::OsString> {
        self.docs
            .lock()
            .values()
            .filter(|d| d.rel.parent() == Some(dir))
            .filter(|d| !d.gone.load(Ordering::SeqCst))
            .filter_map(|d| d.rel.file_name().map(ToOwned::to_owned))
            .collect()
    }

    /// A handle of the document at `rel`: the one being written, or one read from the
    /// store (`truncate`: emptied). `create`: it may be new; else it must exist.
    pub(super) fn open(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        rel: &Path,
        truncate: bool,
        create: bool,
    ) -> io::Result<DocFile> {
        let mut docs = self.docs.lock();
        let doc = match docs.get(rel) {
            Some(d) => d.clone(),
            None => {
                let stored = store.read_all(rel)?;
                if stored.is_none() && !create {
                    return Err(io::ErrorKind::NotFound.into());
                }
                let meta = store.stat(rel)?;
                let d = Arc::new(PendingDoc {
                    rel: rel.to_path_buf(),
                    store: store.clone(),
                    opens: AtomicU32::new(0),
                    gone: AtomicBool::new(false),
                    state: Mutex::new(DocState {
                        stored: stored.is_some(),
                        data: stored.unwrap_or_default(),
                        mtime: SystemTime::UNIX_EPOCH,
                        mode: meta.map(|m| u32::from(m.perm)),
                        owner: (meta.map(|m| m.uid), meta.map(|m| m.gid)),
                    }),
                });
                docs.insert(rel.to_path_buf(), d.clone());
                d
            }
        };
        doc.opens.fetch_add(1, Ordering::SeqCst);
        drop(docs);
        let file = DocFile {
            doc,
            docs: self.clone(),
        };
        if truncate {
            file.set_len(0)?;
        }
        Ok(file)
    }

    /// Whether a document is open for writing at or below store path `rel`.
    pub(super) fn any_under(&self, rel: &Path) -> bool {
        self.docs
            .lock()
            .iter()
            .any(|(p, d)| p.starts_with(rel) && d.opens.load(Ordering::SeqCst) > 0)
    }

    /// The name of the document at `rel` was taken away: it is never stored again.
    /// Whether one was being written.
    pub(super) fn unlinked(&self, rel: &Path) -> bool {
        match self.docs.lock().remove(rel) {
            Some(d) => {
                d.gone.store(true, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    fn closed(&self, doc: &Arc<PendingDoc>) {
        if doc.opens.fetch_sub(1, Ordering::SeqCst) > 1 {
            return;
        }
        // A document not yet whole stays, with no handle: its writer may write the rest
        // through another descriptor (`printf a > zarr.json; printf b >> zarr.json`).
        // It is completed then, unlinked, or refused by the unmount.
        if !doc.whole() {
            return;
        }
        let mut docs = self.docs.lock();
        // Opened again meanwhile (`open` counts under the table's lock): it stays.
        if doc.opens.load(Ordering::SeqCst) == 0
            && let Some(d) = docs.get(&doc.rel)
            && Arc::ptr_eq(d, doc)
        {
            docs.remove(&doc.rel);
        }
    }

    /// Documents not whole that no handle has open (what the unmount refuses).
    pub(super) fn unfinished(&self) -> Vec<PathBuf> {
        // Out of the table's lock before a document's state is looked at: a store of the
        // document holds its state (the table is never held waiting for it).
        let idle: Vec<Arc<PendingDoc>> = self
            .docs
            .lock()
            .values()
            .filter(|d| d.opens.load(Ordering::SeqCst) == 0 && !d.gone.load(Ordering::SeqCst))
            .cloned()
            .collect();
        idle.into_iter()
            .filter(|d| !d.whole())
            .map(|d| d.rel.clone())
            .collect()
    }

    /// Let go of the documents not whole that no handle has open at or below `rel` (a
    /// directory renamed away): as the unmount would, the store keeps what it had.
    pub(super) fn drop_unfinished_under(&self, rel: &Path) {
        self.docs.lock().retain(|p, d| {
            let drop = p.starts_with(rel) && d.opens.load(Ordering::SeqCst) == 0;
            if drop {
                d.gone.store(true, Ordering::SeqCst);
                log::warn!("{}", d.unfinished_error());
            }
            !drop
        });
    }
}

/// An open handle of a document being written: what the view's store-file handle holds.
/// Dropping the last clone of it closes the handle.
pub(super) struct DocFile {
    doc: Arc<PendingDoc>,
    /// The table it was opened from.
    docs: Arc<PendingDocs>,
}

impl DocFile {
    /// Whether the document is one whole JSON document now.
    pub(super) fn whole(&self) -> bool {
        self.doc.whole()
    }
}

impl Drop for DocFile {
    fn drop(&mut self) {
        self.docs.closed(&self.doc);
    }
}

impl StoreFile for DocFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let st = self.doc.state.lock();
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(st.data.len());
        let n = buf.len().min(st.data.len() - start);
        buf[..n].copy_from_slice(&st.data[start..start + n]);
        Ok(n)
    }

    fn meta(&self) -> io::Result<EntryMeta> {
        self.doc.meta()
    }
}

impl StoreFileRw for DocFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| too_big())?;
        let end = start
            .checked_add(buf.len())
            .filter(|&e| e <= MAX_DOC_BYTES)
            .ok_or_else(too_big)?;
        self.doc.change(|data| {
            if data.len() < end {
                data.resize(end, 0);
            }
            data[start..end].copy_from_slice(buf);
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= MAX_DOC_BYTES)
            .ok_or_else(too_big)?;
        self.doc.change(|data| data.resize(len, 0))
    }

    /// Durable once whole (it was stored at the write that made it whole); refused
    /// while it is not.
    fn sync(&self) -> io::Result<()> {
        if !self.doc.whole() {
            log::warn!("{}", self.doc.unfinished_error());
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        self.doc.store.sync_file(&self.doc.rel)
    }
}

impl super::View {
    /// The metadata document being written at store path `rel`, if any.
    pub(super) fn pending_doc(&self, rel: &Path) -> Option<Arc<PendingDoc>> {
        self.writer.as_ref()?.docs.get(rel)
    }

    /// `Err` when the document being written at `rel` is not whole: what a commit of it
    /// (a close, `fsync`, the unmount) answers.
    pub(super) fn doc_finished(&self, rel: &Path) -> super::Result<()> {
        match self.pending_doc(rel) {
            Some(doc) if !doc.whole() => {
                let e = doc.unfinished_error();
                log::warn!("{e}");
                Err(super::ViewError::Invalid(e.to_string()))
            }
            _ => Ok(()),
        }
    }
}
