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

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use super::Overlay;
use super::Tree;
use super::node::Target;
use super::scratch::Scratch;
use super::{Node, Result, View};
use crate::format::KeyPath;

/// Which scratch files [`Overlay::keep_files`] stores.
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
    /// A write found the write buffer full: the files of their own that no descriptor
    /// has open are stored now, and their memory goes back to the buffer, before the
    /// write is tried again. Before, such files waited for the idle timer, and a writer
    /// of many of them (`rsync`, `cp -r` of a directory of notes into an array's
    /// directory) got `ENOSPC` with the disk empty (found by an adversarial tester).
    /// Errors are logged; the write's retry says what is left.
    pub(super) fn make_room(&self) {
        if let Some(o) = self.overlay_opt() {
            let _ = o.keep_files(Keep::Room);
        }
    }
}

impl Overlay<'_> {
    /// Store the scratch files that are files of their own (not chunks, not metadata)
    /// whose bytes the store does not hold yet. Returns the first error.
    pub(super) fn keep_files(&self, which: Keep) -> Result<()> {
        let files = self.w.scratch.files_under(match which {
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

    /// Store the scratch file at `path` if it is a file of its own (see the module
    /// comment) and the store does not hold its bytes yet.
    pub(super) fn keep_file(&self, path: &Path, file: &Arc<Mutex<Scratch>>) -> Result<()> {
        let w = self.w;
        // Held until the file is stored and listed as such: a rename or unlink of it
        // meanwhile waits, and then removes what was stored ([`Overlay::unkeep_file`]).
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
            self.tree.own.make_store_dirs(dir)?;
        }
        self.tree.store.write_atomically(path, &data)?;
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
                if let Some(ino) = self.tree.inodes.peek(path) {
                    self.tree.inodes.update(
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
}

impl Overlay<'_> {
    /// Whether the scratch file at `path` is stored as a file of its own (not a chunk, not
    /// metadata: those are committed).
    fn kept_as_file(&self, path: &Path) -> Result<bool> {
        // A file at a chunk key or at metadata is committed, not kept. One whose key
        // directory a shrink left outside the grid no longer resolves: still a file.
        let name = path.file_name().unwrap_or_default();
        match self.resolve(path)? {
            Some(Node::Scratch { array, parent, .. }) => {
                if !matches!(
                    self.tree.target(&array, parent.as_deref(), name)?,
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
                let node = self
                    .tree
                    .inodes
                    .peek(path)
                    .and_then(|i| self.tree.inodes.get_any(i));
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
                // Also where the kernel holds no inode of it (written through a
                // descriptor the kernel opened): a chunk written just before a shrink
                // left its key outside the grid was stored as a file of its own there,
                // shown again by the grow after (found by the reference test, v2 seed
                // 5000); it is refused at its commit instead, and named.
                if self.tree.names_a_chunk_key(path) {
                    return Ok(false);
                }
            }
            // It settled meanwhile into what its name is (a chunk, committed at its
            // close): nothing to keep.
            Some(_) => return Ok(false),
        }
        Ok(true)
    }
}

impl Overlay<'_> {
    /// The name `path` of a scratch file went (unlinked, renamed): so does its copy in
    /// the store, if one was stored.
    pub(super) fn unkeep_file(&self, path: &Path) -> Result<()> {
        if !self.w.kept_paths.remove(path) {
            return Ok(());
        }
        match self.tree.store.remove_file(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            res => Ok(res?),
        }
    }
}

impl Tree {
    /// Whether view path `path` is a chunk key of an array known above it (in its grid
    /// or not): never a file of its own.
    fn names_a_chunk_key(&self, path: &Path) -> bool {
        let Some((array, rest)) = path
            .ancestors()
            .skip(1)
            .find_map(|a| Some((self.arrays.get(a)?, path.strip_prefix(a).ok()?)))
        else {
            return false;
        };
        let (enc, ndim) = (array.encoding(), array.layout.ndim());
        let mut parent: Option<Vec<u64>> = None;
        let mut names = rest.iter().peekable();
        while let Some(n) = names.next() {
            let last = names.peek().is_none();
            match n
                .to_str()
                .and_then(|n| enc.child(ndim, parent.as_deref(), n))
            {
                Some(KeyPath::Dir(c)) if !last => parent = Some(c),
                Some(KeyPath::Chunk(_)) => return last,
                _ => return false,
            }
        }
        false
    }
}
