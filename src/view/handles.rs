//! The handle table: open files and open directories by file handle, adding a handle,
//! attributes and truncation of an open file (also once unlinked), and open directories.
//! Opening a file is `open.rs`, reading through it `read.rs`, closing it `close.rs`; who
//! opens files, and so whether a call comes by handle or by inode, `open_policy.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

/// The open files, the view's third part (beside the tree and the overlay): the handle
/// table, and the handles held for writes through descriptors the kernel opened, with
/// what they hold (`kernel_held.rs`). What it asks of the tree is passed in
/// ([`TreeRead`]).
#[derive(Default)]
pub(super) struct OpenFiles {
    pub(super) handles: HandleTable,
    /// Handles of writes through descriptors the kernel opened, by inode.
    pub(super) implicit: super::kernel_writes::Implicits,
}

/// The handle table: open files and open directories, by file handle.
#[derive(Default)]
pub(super) struct HandleTable {
    /// Open files: the inode each was opened as, and what it reads from.
    files: Mutex<HashMap<u64, (u64, Handle)>>,
    /// Listings of open directories, so that `readdir` offsets stay consistent.
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    next_fh: AtomicU64,
    /// Handles of metadata taken in at a write (a writable mount with kernel opens hears
    /// of no close, and the writer may go on to write the array's chunks at once): not
    /// taken in again when the handle is let go. By handle: another handle of the same
    /// name, opened since, writes a document of its own.
    landed_at_write: Mutex<std::collections::HashSet<u64>>,
    /// Who opens files: the daemon or the kernel, set once (`open_policy.rs`).
    pub(super) policy: super::open_policy::PolicyCell,
}

impl HandleTable {
    fn next(&self) -> u64 {
        // Handle 0 means "no handle" (reads of a kernel that opens without asking).
        self.next_fh.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn insert(&self, ino: u64, handle: Handle) -> u64 {
        let fh = self.next();
        self.files.lock().insert(fh, (ino, handle));
        fh
    }

    /// The metadata handle `fh` writes was taken in at a write.
    pub(super) fn mark_landed(&self, fh: u64) {
        self.landed_at_write.lock().insert(fh);
    }

    /// Whether the metadata handle `fh` writes was taken in at a write.
    pub(super) fn landed(&self, fh: u64) -> bool {
        self.landed_at_write.lock().contains(&fh)
    }

    /// [`Self::landed`], forgetting it.
    pub(super) fn take_landed(&self, fh: u64) -> bool {
        self.landed_at_write.lock().remove(&fh)
    }

    /// The inode handle `fh` was opened as.
    pub(super) fn ino_of(&self, fh: u64) -> Result<u64> {
        let ino = self.files.lock().get(&fh).map(|(ino, _)| *ino);
        ino.ok_or(ViewError::StaleHandle(fh))
    }

    /// Handle `fh` reads from `handle` from now on (if it is still open).
    pub(super) fn replace(&self, fh: u64, handle: Handle) {
        if let Some((_, h)) = self.files.lock().get_mut(&fh) {
            *h = handle;
        }
    }

    /// The handles of scratch file `file` show it as `node` from now on (renamed).
    pub(super) fn retarget(&self, file: &Arc<Mutex<scratch::Scratch>>, node: &Node) {
        for (_, h) in self.files.lock().values_mut() {
            if let Handle::Scratch {
                node: n, file: f, ..
            } = h
                && Arc::ptr_eq(f, file)
            {
                *n = node.clone();
            }
        }
    }

    /// A copy of handle `fh`, taken out of the table's lock.
    pub(super) fn get(&self, fh: u64) -> Result<Handle> {
        let handle = self.files.lock().get(&fh).map(|(_, h)| h.clone());
        handle.ok_or(ViewError::StaleHandle(fh))
    }

    /// A handle open on inode `ino`, if any (the kernel's `getattr` of an open file
    /// carries no handle).
    fn any_of(&self, ino: u64) -> Option<Handle> {
        let files = self.files.lock();
        files
            .values()
            .find_map(|(i, h)| (*i == ino).then(|| h.clone()))
    }

    /// Whether a handle open for writing on store file `rel` is in the table.
    pub(super) fn writes_to(&self, rel: &Path) -> bool {
        self.files
            .lock()
            .values()
            .any(|(_, h)| matches!(h, Handle::StoreRw(_, r) if r == rel))
    }

    pub(super) fn remove(&self, fh: u64) -> Option<(u64, Handle)> {
        self.landed_at_write.lock().remove(&fh);
        self.files.lock().remove(&fh)
    }

    fn insert_dir(&self, entries: Vec<DirEntry>) -> u64 {
        let fh = self.next();
        self.dirs.lock().insert(fh, Arc::new(entries));
        fh
    }

    fn dir(&self, fh: u64) -> Result<Arc<Vec<DirEntry>>> {
        let dir = self.dirs.lock().get(&fh).cloned();
        dir.ok_or(ViewError::StaleHandle(fh))
    }

    fn remove_dir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }
}

impl View {
    // ----- files -----------------------------------------------------------------------

    /// A new handle of `ino` reading from or writing to `handle`.
    pub(super) fn add_handle(&self, ino: u64, handle: Handle, keep_cache: bool) -> Opened {
        let no_flush = !self.commits_on_close(&handle);
        let fh = self.open.handles.insert(ino, handle);
        self.tree.inodes.hold(ino);
        Opened {
            fh,
            keep_cache,
            no_flush,
            stale_size: false,
        }
    }

    /// A copy of handle `fh`, taken out of the table's lock.
    pub(super) fn handle(&self, fh: u64) -> Result<Handle> {
        self.open.handles.get(fh)
    }

    /// Attributes of `ino`, also when it was unlinked while open (`fstat`): such a file
    /// lives on for its handles, with no link, as on any POSIX file system. `fh`: the
    /// handle the request came with, if any (the kernel sends none for `fstat`).
    pub fn getattr_open(&self, ino: u64, fh: Option<u64>) -> Result<Attr> {
        match self.getattr(ino) {
            // Unlinked, or retired (taken into a new array) while open.
            Err(e @ (ViewError::NotFound | ViewError::StaleInode(_))) => {
                let handle = fh.and_then(|fh| self.open.handles.get(fh).ok());
                match handle.or_else(|| self.open.handles.any_of(ino)) {
                    Some(handle) => self.unlinked_attr(ino, &handle),
                    // The file this inode still names here is gone (removed by another
                    // mount or program): stale, so that a call by path (`open(O_CREAT)`,
                    // `stat`) has the kernel look the name up again instead of failing
                    // through an entry it still caches. One this mount unlinked (its name
                    // let go here: `fstat` of a descriptor the kernel opened) is `ENOENT`.
                    None => Err(match e {
                        ViewError::NotFound
                            if self.tree.inodes.get(ino).is_some_and(|(path, _)| {
                                self.tree.inodes.peek(&path) == Some(ino)
                            }) =>
                        {
                            ViewError::StaleInode(ino)
                        }
                        e => e,
                    }),
                }
            }
            res => res,
        }
    }

    fn unlinked_attr(&self, ino: u64, handle: &Handle) -> Result<Attr> {
        let (m, len) = match handle {
            Handle::Store(f) => (f.meta()?, None),
            Handle::StoreRw(f, _) => (f.meta()?, None),
            Handle::Scratch {
                node: Node::Scratch { array, .. },
                file,
                ..
            } => {
                let mut m = array.dir_meta;
                m.perm = array.json_meta.perm;
                (m, Some(file.lock().data.len() as u64))
            }
            _ => return Err(ViewError::NotFound),
        };
        Ok(Attr {
            nlink: 0,
            ..Attr::from_meta(ino, Kind::File, len.unwrap_or(m.len), &m)
        })
    }

    /// `ftruncate` through handle `fh` (or `truncate` of the name, without one).
    pub fn set_size_open(&self, ino: u64, size: u64, fh: Option<u64>) -> Result<Attr> {
        let handle = fh
            .and_then(|fh| self.open.handles.get(fh).ok())
            .or_else(|| self.open.handles.any_of(ino));
        if let Some(Handle::StoreRw(f, _)) = &handle {
            // The open file itself, whatever its name is now.
            f.set_len(size)?;
            return self.getattr_open(ino, fh);
        }
        match (self.set_size(ino, size), handle) {
            // Its name gone (unlinked while open): the file its handles still hold.
            (Err(ViewError::NotFound), Some(Handle::Scratch { file, .. })) => {
                let size = usize::try_from(size).map_err(|_| ViewError::NoSpace)?;
                self.overlay()?.resize_scratch(&file, size)?;
                self.getattr_open(ino, fh)
            }
            (res, _) => res,
        }
    }

    // ----- directories -----------------------------------------------------------------

    /// Open directory `ino`: its listing, with `.` and `..`, is taken now.
    pub fn opendir(&self, ino: u64) -> Result<u64> {
        let mut entries = vec![
            DirEntry {
                ino,
                name: ".".into(),
                kind: Kind::Dir,
            },
            DirEntry {
                ino: ROOT_INO,
                name: "..".into(),
                kind: Kind::Dir,
            },
        ];
        entries.extend(self.readdir(ino)?);
        Ok(self.open.handles.insert_dir(entries))
    }

    /// The listing of an open directory; `readdir` continues it at its offset.
    pub fn dir_entries(&self, fh: u64) -> Result<Arc<Vec<DirEntry>>> {
        self.open.handles.dir(fh)
    }

    pub fn releasedir(&self, fh: u64) {
        self.open.handles.remove_dir(fh);
    }
}
