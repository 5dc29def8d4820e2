//! Files in an array's directories that are neither chunks nor metadata (`a/notes.txt`,
//! `a/c/README`, a writer's temporary file that was never renamed): created as scratch
//! files in memory (most of them are temporary files, renamed onto a chunk key a moment
//! later), and **stored as files** at their path in the store, where Zarr readers pass
//! them over: at their own `fsync`, the `fsync` of their array's directory or of the
//! mount's root, at unmount, and by the idle timer once they stood unchanged, with no
//! handle open, for the flush interval (temporary files are renamed long before). Renamed
//! or unlinked, their stored copy goes with the name.
//!
//! A later mount shows them as the store's files they are, in the array's directory and
//! in its key directories alike.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::node::Target;
use super::scratch::Scratch;
use super::{Node, Result, View, ViewError};
use crate::format::KeyPath;

/// Which scratch files [`View::keep_files`] stores.
#[derive(Clone, Copy, Debug)]
pub(super) enum Keep<'a> {
    /// Every one (unmount, `fsync` of the root).
    All,
    /// Those below a view directory (`fsync` of an array's directory).
    Under(&'a Path),
    /// Those no handle has open and whose bytes stood unchanged (and unrenamed) for the
    /// given time (the idle timer: a temporary file is renamed long before).
    Closed(std::time::Duration),
    /// Every one no handle has open, now: a write found the write buffer full
    /// ([`View::make_room`]).
    Room,
}

impl View {
    /// Store the scratch files that are files of their own (not chunks, not metadata)
    /// whose bytes the store does not hold yet. Returns the first error.
    pub(super) fn keep_files(&self, which: Keep) -> Result<()> {
        let Some(w) = &self.writer else {
            return Ok(());
        };
        let files = w.scratch.files_under(match which {
            Keep::Under(dir) => Some(dir),
            _ => None,
        });
        let mut first_err = Ok(());
        for (path, file) in files {
            {
                let mut f = file.lock();
                if f.orphan {
                    continue;
                }
                if matches!(which, Keep::Room) && f.opens > 0 {
                    continue;
                }
                if let Keep::Closed(idle) = which {
                    if f.opens > 0 {
                        continue;
                    }
                    let sum = crc32c::crc32c(&f.data);
                    if f.kept == Some(sum) {
                        continue;
                    }
                    match f.seen {
                        Some((s, since)) if s == sum && since.elapsed() >= idle => {}
                        Some((s, _)) if s == sum => continue,
                        _ => {
                            f.seen = Some((sum, std::time::Instant::now()));
                            continue;
                        }
                    }
                }
            }
            if let Err(e) = self.keep_file(&path, &file) {
                log::warn!("{}: not stored: {e}", path.display());
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
        }
        first_err
    }

    /// A write found the write buffer full: the files of their own that no descriptor
    /// has open are stored now, and their memory goes back to the buffer, before the
    /// write is tried again. Before, such files waited for the idle timer, and a writer
    /// of many of them (`rsync`, `cp -r` of a directory of notes into an array's
    /// directory) got `ENOSPC` with the disk empty (found by an adversarial tester).
    /// Errors are logged; the write's retry says what is left.
    pub(super) fn make_room(&self) {
        let _ = self.keep_files(Keep::Room);
    }

    /// Store the scratch file at `path` if it is a file of its own (see the module
    /// comment) and the store does not hold its bytes yet.
    pub(super) fn keep_file(&self, path: &Path, file: &Arc<Mutex<Scratch>>) -> Result<()> {
        let w = self.writer()?;
        // Held until the file is stored and listed as such: a rename or unlink of it
        // meanwhile waits, and then removes what was stored ([`View::unkeep_file`]).
        let mut kept = w.kept_paths.hold();
        if !w.scratch.get(path).is_some_and(|f| Arc::ptr_eq(&f, file)) {
            return Ok(()); // renamed or unlinked meanwhile
        }
        if !self.kept_as_file(path)? {
            return Ok(());
        }
        let (data, sum) = {
            let f = file.lock();
            let sum = crc32c::crc32c(&f.data);
            if f.orphan || f.kept == Some(sum) {
                return Ok(());
            }
            (f.data.clone(), sum)
        };
        // Times set on it stay shown: storing it changes none of its bytes (before, the
        // stored file's new mtime hid them; found by the reference test).
        let set = self.set_times_shown(path);
        // The view path is the store path (the view shows the store's directories).
        if let Some(dir) = path.parent() {
            self.make_store_dirs(dir)?;
        }
        self.store.write_atomically(path, &data)?;
        kept.insert(path.to_path_buf());
        // Stored and closed: the store file is the file from now on, as for a later
        // mount; its memory goes back to the write buffer. (Open, it stays in memory
        // for its writer and is stored again when changed.)
        {
            let mut table = w.scratch.lock();
            let mut f = file.lock();
            if crc32c::crc32c(&f.data) != sum {
                return Ok(());
            }
            f.kept = Some(sum);
            if f.opens == 0 && table.is(path, file) {
                // Its bytes are let go with the last reference to it: a read that took
                // it from the table a moment ago still reads them whole. (Its room
                // goes back as the name goes: it is closed.)
                drop(f);
                table.remove(path);
                kept.remove(path);
                if let Some(ino) = self.inodes.peek(path) {
                    self.inodes.update(
                        ino,
                        Node::File {
                            rel: path.to_path_buf(),
                        },
                    );
                }
            }
        }
        if let Some(set) = set {
            self.show_set_times(path, set);
        }
        Ok(())
    }

    /// Whether the scratch file at `path` is stored as a file of its own (not a chunk, not
    /// metadata: those are committed).
    fn kept_as_file(&self, path: &Path) -> Result<bool> {
        // A file at a chunk key or at metadata is committed, not kept. One whose key
        // directory a shrink left outside the grid no longer resolves: still a file.
        let name = path.file_name().unwrap_or_default();
        match self.resolve(path)? {
            Some(Node::Scratch { array, parent, .. }) => {
                if !matches!(
                    self.target(&array, parent.as_deref(), name)?,
                    Target::Scratch
                ) {
                    return Ok(false);
                }
            }
            // Its directory no longer resolves (a key directory a shrink left outside
            // the grid: nothing, or the copy stored before, is found at its path): still
            // a file, unless its name is a chunk key (a chunk opened before the shrink
            // and never written), which is never stored as a file, where a shard may go.
            None | Some(Node::File { .. }) => {
                let node = self.inodes.peek(path).and_then(|i| self.inodes.get_any(i));
                if let Some((_, Node::Scratch { array, parent, .. })) = node
                    && name
                        .to_str()
                        .and_then(|n| {
                            array
                                .encoding()
                                .child(array.layout.ndim(), parent.as_deref(), n)
                        })
                        .is_some()
                {
                    return Ok(false);
                }
            }
            // It settled meanwhile into what its name is (a chunk, committed at its
            // close): nothing to keep.
            Some(_) => return Ok(false),
        }
        Ok(true)
    }

    /// The name `path` of a scratch file went (unlinked, renamed): so does its copy in
    /// the store, if one was stored.
    pub(super) fn unkeep_file(&self, path: &Path) -> Result<()> {
        let Some(w) = &self.writer else {
            return Ok(());
        };
        if !w.kept_paths.remove(path) {
            return Ok(());
        }
        match self.store.remove_file(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            res => Ok(res?),
        }
    }

    /// Make the store directories of view directory `dir` that are missing (a key
    /// directory has none until a shard or a file lies in it).
    pub(super) fn make_store_dirs(&self, dir: &Path) -> Result<()> {
        let mut at = PathBuf::new();
        for part in dir.iter() {
            at.push(part);
            match self.store.stat(&at)? {
                Some(m) if m.kind == crate::store::EntryKind::Dir => {}
                Some(_) => {
                    return Err(ViewError::Io(std::io::Error::from_raw_os_error(
                        libc::ENOTDIR,
                    )));
                }
                None => match self.store.create_dir(&at) {
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    res => res?,
                },
            }
        }
        Ok(())
    }

    /// Files of the store in the store directory at a key directory's view path `path`
    /// whose names are no keys (stored by [`View::keep_file`]): `a/c/README`.
    pub(super) fn kept_in_key_dir(
        &self,
        path: &Path,
        is_key: impl Fn(&str) -> bool,
    ) -> Result<Vec<super::DirEntry>> {
        let listed = self.own_entries(path)?;
        Ok(listed
            .into_iter()
            .filter_map(|e| {
                let kind = match e.kind {
                    crate::store::EntryKind::File => super::Kind::File,
                    crate::store::EntryKind::Dir => super::Kind::Dir,
                    _ => return None,
                };
                let key = e.name.to_str().is_some_and(&is_key);
                (!key).then_some(super::DirEntry {
                    ino: 0,
                    name: e.name,
                    kind,
                })
            })
            .collect())
    }

    /// Whether the store directory `rel` of key directory `coords` of `array` holds
    /// files of their own (names that are no keys there), or a directory outside the grid
    /// with files; key directories below it are not looked into.
    pub(super) fn holds_kept_files(
        &self,
        array: &super::ShardedArray,
        coords: &[u64],
        rel: &Path,
    ) -> Result<bool> {
        let (enc, ndim) = (array.encoding(), array.layout.ndim());
        let listed = self.own_entries(rel)?;
        for e in listed {
            let Some(name) = e.name.to_str() else {
                return Ok(true);
            };
            match enc.child(ndim, Some(coords), name) {
                None => return Ok(true),
                Some(KeyPath::Chunk(_)) => {}
                // A key directory in the grid holds files of its own if one lies
                // anywhere below it: this is asked of key directories with no chunk
                // below (a listing shows the others anyway), so the walk meets no shard
                // with a chunk. Before, only one level was looked at, and a later
                // mount did not list a key directory whose files of their own lay two
                // levels down (`0/0/0.x.partial` of a 3-d array: found by the
                // reference test), though the store kept them. One outside the grid is
                // a plain directory, there if it holds files.
                Some(KeyPath::Dir(c)) if e.kind == crate::store::EntryKind::Dir => {
                    if self.key_dir_holds_files(array, &c, &rel.join(name))? {
                        return Ok(true);
                    }
                }
                Some(KeyPath::Dir(_)) => return Ok(true),
            }
        }
        Ok(false)
    }

    /// Whether store directory `rel` holds anything but directories, at any depth.
    /// Whether the key directory `coords` of `array` (store directory `rel`), which no
    /// chunk lies below, is shown for files of their own: in the grid, while such files
    /// lie in it; outside the grid (a shrink left it there), as a plain directory while
    /// it holds files.
    pub(super) fn key_dir_holds_files(
        &self,
        array: &super::ShardedArray,
        coords: &[u64],
        rel: &Path,
    ) -> Result<bool> {
        let counts = array.layout.chunk_counts();
        if coords.iter().zip(counts).all(|(c, n)| c < n) {
            self.holds_kept_files(array, coords, rel)
        } else {
            self.has_files(rel)
        }
    }

    pub(super) fn has_files(&self, rel: &Path) -> Result<bool> {
        let listed = self.own_entries(rel)?;
        for e in listed {
            if e.kind != crate::store::EntryKind::Dir || self.has_files(&rel.join(&e.name))? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Remove the directories below store directory `rel` that hold no file at any depth
    /// (not `rel` itself). Best effort: one that cannot go (a recovery record of
    /// shardfs's own in it) stays, and the caller's `rmdir` says `ENOTEMPTY`.
    pub(super) fn remove_empty_dirs(&self, rel: &Path) -> Result<()> {
        for e in self.own_entries(rel)? {
            let below = rel.join(&e.name);
            if e.kind == crate::store::EntryKind::Dir && !self.has_files(&below)? {
                self.remove_empty_dirs(&below)?;
                let _ = self.store.remove_dir(&below);
            }
        }
        Ok(())
    }

    /// The entries of store directory `rel` but shardfs's own files; none where it is
    /// no directory (a key directory with nothing of its own in the store).
    fn own_entries(&self, rel: &Path) -> Result<Vec<crate::store::ListEntry>> {
        match self.store.list(rel) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                Ok(Vec::new())
            }
            other => Ok(other?
                .into_iter()
                .filter(|e| !crate::store::is_internal(&e.name))
                .collect()),
        }
    }
}
