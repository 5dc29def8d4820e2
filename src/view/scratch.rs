//! The scratch files: this mount's in-memory files (chunks and metadata being written,
//! files of their own not stored yet), by view path, and the room they take of the write
//! buffer. One owner: the table and its byte count change together, here only; other
//! files reach the table through [`ScratchFiles`]' methods, or hold its lock through a
//! [`Table`] where they must change something else (an inode) under it.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use super::{Result, ViewError};

/// An in-memory file.
#[derive(Debug)]
pub struct Scratch {
    pub(super) data: Vec<u8>,
    pub(super) opens: u32,
    /// Written since it was opened or created: commit it on the last close.
    pub(super) dirty: bool,
    /// Its name was taken away (unlinked, or replaced) while it was open: its handles
    /// keep working, and the last close drops it without committing anything.
    pub(super) orphan: bool,
    /// Renamed to where its descriptors cannot follow it ([`super::View::follow_rename`]):
    /// what they write from then on is refused at their `fsync` and close (`ESTALE`).
    pub(super) renamed_away: bool,
    /// When it was last written or resized (a close time, ns since the epoch; 0: not
    /// since it was made). A mount that hears of a close only later (kernel opens)
    /// commits it as closed then, the last moment it knows the writer was still there.
    pub(super) written: u64,
    /// When its bytes last changed (made, written, resized): what times set on it are
    /// shown against ([`super::Overlay::own_mtime`]); it shows its array directory's.
    pub(super) modified: std::time::SystemTime,
    /// The checksum of the bytes last stored as a file of its own ([`super::kept`]).
    pub(super) kept: Option<u32>,
    /// The idle timer's last look at it: its checksum then, and since when it has had
    /// those bytes (stored once they stood for the flush interval).
    pub(super) seen: Option<(u32, std::time::Instant)>,
}

impl Scratch {
    /// Taken out of the name table: the bytes to unreserve now (none while it is open;
    /// the last close gives them back).
    fn unnamed(&mut self) -> u64 {
        if self.opens > 0 {
            self.orphan = true;
            0
        } else {
            self.data.len() as u64
        }
    }
}

type Files = HashMap<PathBuf, Arc<Mutex<Scratch>>>;

/// The scratch files by view path, and the bytes they hold (at most `limit`: the write
/// buffer's size again, beside what is staged).
pub(super) struct ScratchFiles {
    table: Mutex<Files>,
    bytes: AtomicU64,
    limit: u64,
}

/// The table of scratch files, locked: for a caller that changes something else (an
/// inode, a file's own state) while no file can come or go.
pub(super) struct Table<'a> {
    map: MutexGuard<'a, Files>,
    files: &'a ScratchFiles,
}

impl Table<'_> {
    pub(super) fn get(&self, path: &Path) -> Option<Arc<Mutex<Scratch>>> {
        self.map.get(path).cloned()
    }

    /// Whether `file` is the one at `path`.
    pub(super) fn is(&self, path: &Path, file: &Arc<Mutex<Scratch>>) -> bool {
        self.map.get(path).is_some_and(|f| Arc::ptr_eq(f, file))
    }

    /// Whether a file is at `path` and no handle has it open.
    pub(super) fn is_closed(&self, path: &Path) -> bool {
        self.map.get(path).is_some_and(|f| f.lock().opens == 0)
    }

    /// Drop the name `path`; its room goes back once no handle has it open.
    pub(super) fn remove(&mut self, path: &Path) {
        if let Some(file) = self.map.remove(path) {
            self.files.unreserve(file.lock().unnamed());
        }
    }

    /// `file` (renamed, its room already counted) named `path`: a copy made there
    /// meanwhile (the rename storing it as a file of its own) gives its room back.
    pub(super) fn put_renamed(&mut self, path: &Path, file: &Arc<Mutex<Scratch>>) {
        file.lock().orphan = false;
        if let Some(made) = self.map.insert(path.to_path_buf(), file.clone())
            && !Arc::ptr_eq(&made, file)
        {
            self.files.unreserve(made.lock().data.len() as u64);
        }
    }
}

impl ScratchFiles {
    /// Room for `write_buffer` bytes (at least 1 MiB).
    pub(super) fn new(write_buffer: u64) -> Self {
        ScratchFiles {
            table: Mutex::new(HashMap::new()),
            bytes: AtomicU64::new(0),
            limit: write_buffer.max(1 << 20),
        }
    }

    pub(super) fn lock(&self) -> Table<'_> {
        Table {
            map: self.table.lock(),
            files: self,
        }
    }

    /// The most one file may hold.
    pub(super) fn limit(&self) -> u64 {
        self.limit
    }

    /// The names of the files directly in directory `dir`.
    pub(super) fn names_in(&self, dir: &Path) -> Vec<OsString> {
        let map = self.table.lock();
        map.keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().map(|n| n.to_os_string()))
            .collect()
    }

    /// Whether a handle has a file below `dir` open.
    pub(super) fn any_open_under(&self, dir: &Path) -> bool {
        let map = self.table.lock();
        map.iter()
            .any(|(p, f)| p.starts_with(dir) && f.lock().opens > 0)
    }

    /// The files below `dir` (all: `None`), with their paths.
    pub(super) fn files_under(&self, dir: Option<&Path>) -> Vec<(PathBuf, Arc<Mutex<Scratch>>)> {
        let map = self.table.lock();
        map.iter()
            .filter(|(p, _)| dir.is_none_or(|d| p.starts_with(d)))
            .map(|(p, f)| (p.clone(), f.clone()))
            .collect()
    }

    /// Let go of the files below `dir` (moved, and stored before the move), with the
    /// room they held.
    pub(super) fn let_go_under(&self, dir: &Path) {
        let mut map = self.table.lock();
        map.retain(|p, f| {
            let keep = !p.starts_with(dir);
            if !keep {
                self.unreserve(f.lock().data.len() as u64);
            }
            keep
        });
    }

    pub(super) fn get(&self, path: &Path) -> Option<Arc<Mutex<Scratch>>> {
        self.table.lock().get(path).cloned()
    }

    // The looks at a scratch file by its name below hold the table's lock while they
    // look: a file of its own stored meanwhile (`kept.rs`) leaves the table under that
    // lock, so they see it whole in the table or not at all. Before, a rename that
    // looked at it while it was being stored found it empty (`EINVAL`: a chunk of 0
    // bytes) or gone (`ENOENT`; found by an adversarial tester).

    pub(super) fn len_at(&self, path: &Path) -> Option<u64> {
        let map = self.table.lock();
        map.get(path).map(|s| s.lock().data.len() as u64)
    }

    /// The length of the scratch file at `path` and when its bytes last changed.
    pub(super) fn stat_at(&self, path: &Path) -> Option<(u64, std::time::SystemTime)> {
        let map = self.table.lock();
        map.get(path).map(|s| {
            let f = s.lock();
            (f.data.len() as u64, f.modified)
        })
    }

    /// The bytes of the scratch file at `path`.
    pub(super) fn bytes_at(&self, path: &Path) -> Option<Vec<u8>> {
        let map = self.table.lock();
        map.get(path).map(|s| s.lock().data.clone())
    }

    /// A new scratch file at `path` (replacing any), already counted as open `opens`
    /// times. Open counts change only under the map's lock ([`ScratchFiles::open`],
    /// `Overlay::settle_scratch`), so a file being opened is never taken away.
    pub(super) fn create(
        &self,
        path: &Path,
        data: Vec<u8>,
        dirty: bool,
        opens: u32,
    ) -> Result<Arc<Mutex<Scratch>>> {
        self.reserve(data.len() as u64)?;
        let file = Arc::new(Mutex::new(Scratch {
            data,
            opens,
            dirty,
            orphan: false,
            renamed_away: false,
            written: 0,
            modified: std::time::SystemTime::now(),
            kept: None,
            seen: None,
        }));
        if let Some(old) = self.table.lock().insert(path.to_path_buf(), file.clone()) {
            self.unreserve(old.lock().unnamed());
        }
        Ok(file)
    }

    /// The scratch file at `path` if a handle has it open (not counted as opened).
    pub(super) fn open_file_at(&self, path: &Path) -> Option<Arc<Mutex<Scratch>>> {
        let file = self.table.lock().get(path)?.clone();
        let open = file.lock().opens > 0;
        open.then_some(file)
    }

    /// The scratch file at `path`, counted as opened once more.
    pub(super) fn open(&self, path: &Path) -> Option<Arc<Mutex<Scratch>>> {
        let map = self.table.lock();
        let file = map.get(path)?.clone();
        file.lock().opens += 1;
        Some(file)
    }

    /// Drop the name `path` (unlink, rename away). Handles still open keep reading the
    /// data they have.
    pub(super) fn remove(&self, path: &Path) {
        if let Some(file) = self.table.lock().remove(path) {
            self.unreserve(file.lock().unnamed());
        }
    }

    /// A rename onto `path` is under way: the file there, if any, loses its name now,
    /// orphaned while open, so that no close of it commits over what the rename puts
    /// there. [`ScratchFiles::name_taken`] once the rename succeeded, or
    /// [`ScratchFiles::give_name_back`] if it failed.
    pub(super) fn take_name(&self, path: &Path) -> Option<Arc<Mutex<Scratch>>> {
        let file = self.table.lock().remove(path)?;
        file.lock().orphan = true;
        Some(file)
    }

    /// The rename that took `file`'s name succeeded: its bytes go with its last handle
    /// (now, if it has none).
    pub(super) fn name_taken(&self, file: Arc<Mutex<Scratch>>) {
        let mut f = file.lock();
        if f.opens == 0 {
            let len = std::mem::take(&mut f.data).len() as u64;
            drop(f);
            self.unreserve(len);
        }
    }

    /// The rename that took `file`'s name at `path` failed: it has its name again,
    /// unless the rename made another file there. (A last close of it while its name
    /// was away let its bytes go, as an unlinked file's: that close raced a rename
    /// onto its name that then failed.)
    pub(super) fn give_name_back(&self, path: &Path, file: Arc<Mutex<Scratch>>) {
        let mut map = self.table.lock();
        if map.contains_key(path) {
            drop(map);
            self.name_taken(file);
            return;
        }
        file.lock().orphan = false;
        map.insert(path.to_path_buf(), file);
    }

    /// Drop the name `path` and take its bytes, if no handle has the file open.
    pub(super) fn take_if_closed(&self, path: &Path) -> Option<Vec<u8>> {
        let mut map = self.table.lock();
        let mut f = map.get(path)?.lock();
        if f.opens > 0 {
            return None;
        }
        let data = std::mem::take(&mut f.data);
        drop(f);
        map.remove(path);
        self.unreserve(data.len() as u64);
        Some(data)
    }

    /// Room for a file growing to `size` bytes by `n`: `EFBIG` when one file of that
    /// size could never be staged (larger than the whole write buffer), `ENOSPC` while
    /// the buffer is full of other files.
    pub(super) fn reserve_growth(&self, size: u64, n: u64) -> Result<()> {
        if size > self.limit {
            return Err(ViewError::TooBig(self.limit));
        }
        self.reserve(n)
    }

    pub(super) fn reserve(&self, n: u64) -> Result<()> {
        let now = self.bytes.fetch_add(n, Ordering::Relaxed) + n;
        if now > self.limit {
            self.bytes.fetch_sub(n, Ordering::Relaxed);
            return Err(ViewError::NoSpace);
        }
        Ok(())
    }

    pub(super) fn unreserve(&self, n: u64) {
        self.bytes.fetch_sub(n, Ordering::Relaxed);
    }
}
