//! Commits of writes through the view: what a written name in an array's namespace is
//! ([`Target`]), committing a written scratch file (or rolling back refused metadata),
//! a closed scratch file moved onto a chunk key, staging a chunk (with back-pressure),
//! metadata written as a store file taken in at the write that makes it whole, and the
//! write side's accessors. Opening for writing is `open.rs`, what a close commits
//! `close.rs`; the operations that change the tree are `ops.rs`, `remove.rs`,
//! `rename.rs` and `rename_dir.rs`, new arrays `adopt.rs`.
//!
//! * In an array's directories every created file is a *scratch* file, held in memory
//!   (bounded). Closing a written file at a valid in-grid chunk key, or renaming or
//!   linking a file onto one, *commits* it: the bytes are staged and visible at once.
//!   A name that is no valid key stays a scratch file; renaming onto an invalid key is
//!   refused (`EINVAL`).
//! * Writing `zarr.json` of a sharded array may change attributes, shape and dimension
//!   names; anything else (data type, chunk shape, codecs, ...) is refused (`EINVAL`).
//! * Outside arrays, files pass through to the store. A `zarr.json` that lands in a
//!   store directory and describes an unsharded array makes it a sharded one (inner
//!   chunks = the writer's chunks); chunk files already there are taken in.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::Overlay;
use super::Tree;
use super::node::Target;
use super::scratch::Scratch;
use super::writer::Writer;
use super::{MetaFile, Node, Result, ShardedArray, View, ViewError};
use crate::format::KeyPath;

impl View {
    pub(super) fn writer(&self) -> Result<&Writer> {
        self.writer.as_ref().ok_or(ViewError::ReadOnly)
    }

    pub fn write_side(&self) -> Option<&Writer> {
        self.writer.as_ref()
    }

    /// Metadata written as a store file (`zarr.json` in a store directory; `.zarray`,
    /// `.zattrs`, `.zgroup` in the v2 view), on a writable mount with kernel opens:
    /// taken in (a new array adopted, v2 metadata applied) at the write that makes it a
    /// whole JSON document, not at its release, which comes after `close` returns: a
    /// writer that goes on to make the array's key directories and chunks (`cp -r`, a
    /// script writing `zarr.json` and then each chunk) or reads the store finds the
    /// metadata taken in, as after the `flush` of a mount that asks at open. A refusal is
    /// this write's error.
    pub(super) fn land_at_write(&self, fh: u64, rel: &Path) -> Result<()> {
        let Some(file) = self.tree.lands_on_close(rel) else {
            return Ok(());
        };
        self.writer()?;
        if self.open.handles.landed(fh) {
            return Ok(());
        }
        let whole = match self.pending_doc(rel) {
            // Stored by the write that made it whole.
            Some(doc) => doc.whole(),
            None => self
                .tree
                .store
                .read_all(rel)?
                .is_some_and(|b| super::pending_doc::whole_json(&b)),
        };
        if !whole {
            return Ok(()); // not whole yet
        }
        self.open.handles.mark_landed(fh);
        self.overlay()?
            .metadata_landed(rel.parent().unwrap_or(Path::new("")), file)
    }
}

impl Overlay<'_> {
    /// Commit a written scratch file that sits at a chunk key or at `zarr.json` (on
    /// `close` — `flush` — so that a refusal reaches the writer — and on `fsync`).
    pub(super) fn commit_scratch(&self, node: &Node, file: &Arc<Mutex<Scratch>>) -> Result<()> {
        let Node::Scratch {
            path,
            array,
            parent,
        } = node
        else {
            return Ok(());
        };
        let name = path.file_name().unwrap_or_default();
        let target = self.tree.target(array, parent.as_deref(), name)?;
        if let Some(refused) = self.stale_commit(path, array, &target, file) {
            return refused;
        }
        match target {
            Target::Meta(_) | Target::Chunk(_) => {}
            // A temporary file: kept as written, nothing to commit.
            Target::Scratch => return Ok(()),
            // A chunk written through a descriptor opened before its key left the grid
            // (a shape shrink since): its bytes can never be stored there. Refused, and
            // let go, so that a later grow does not show them as if stored.
            Target::Invalid(why) => {
                let written = {
                    let f = file.lock();
                    f.dirty && !f.orphan
                };
                if !written {
                    return Ok(());
                }
                self.w.scratch.remove(path);
                return Err(ViewError::Invalid(format!(
                    "{}: {why} (the array's shape changed after it was opened): what \
                     was written to it is not stored",
                    path.display()
                )));
            }
        }
        let (data, closed) = {
            let mut f = file.lock();
            if !f.dirty || f.orphan {
                return Ok(());
            }
            f.dirty = false;
            // With kernel opens the last write stands for the unheard close.
            let closed = self.policy.close_time(f.written);
            (f.data.clone(), closed)
        };
        let put = self.put(array, parent.as_deref(), name, path, data, closed);
        if put.is_ok() {
            // Stored: an earlier refusal of the same file is no longer true.
            self.counters.refused.forget(&path.display().to_string());
        }
        if let (Err(ViewError::Invalid(_)), Target::Meta(meta)) = (&put, target) {
            self.roll_back_refused_meta(path, array, meta, file)?;
        }
        put.map(|_| ())
    }

    /// Write `data` at `name` in an array's namespace (commit a chunk, update the
    /// metadata, or keep a scratch file). Returns the node now at that path.
    pub(super) fn put(
        &self,
        array: &Arc<ShardedArray>,
        parent: Option<&[u64]>,
        name: &OsStr,
        path: &Path,
        data: Vec<u8>,
        closed: Option<u64>,
    ) -> Result<Node> {
        match self.tree.target(array, parent, name)? {
            Target::Meta(file) => {
                let key = (self.tree.current(array).meta_rel.clone(), file);
                let written = self.remember_as_written(key, &data);
                // The v2 view: a `.zattrs` written while `.zarray` is unlinked is held.
                let held = match file {
                    MetaFile::Zattrs => self.hold_headless_attrs(array, Some(&data)),
                    _ => Ok(None),
                };
                let array = match held {
                    Ok(Some(array)) => return Ok(Node::ArrayMeta { array, file }),
                    Ok(None) => self.update_array_meta(array, file, &data),
                    Err(e) => Err(e),
                }
                .inspect_err(|_| self.forget_as_written(written))?;
                // An array whose metadata was unlinked has it again: shown whole again
                // (the load after the write found it in the store, and the overlay let the
                // unlinked array go: `reconcile.rs`). Before, the v2 view left `.zarray` written
                // back unlisted until a remount, and `rm zarr.json` and a changed one
                // written back showed the old one (found by the reference test).
                self.w.unlinked.meta_written(&array.rel, file);
                Ok(Node::ArrayMeta { array, file })
            }
            Target::Chunk(coords) => {
                let array = self.tree.current(array);
                self.writable(&array)?;
                self.commit_chunk_closed(&array, coords.clone(), Some(data), closed)?;
                Ok(Node::Chunk { array, coords })
            }
            Target::Invalid(why) => {
                log::warn!("{}: refused: {why}", path.display());
                Err(ViewError::Invalid(why))
            }
            Target::Scratch => {
                let w = self.w;
                // A file of its own of the store at that name is replaced: its stored
                // copy is this file's from now on (overwritten when this one is stored,
                // removed with its name).
                if self
                    .tree
                    .store
                    .stat(path)?
                    .is_some_and(|m| m.kind == crate::store::EntryKind::File)
                {
                    w.kept_paths.insert(path);
                }
                let file = w.scratch.create(path, data, false, 0)?;
                drop(file);
                Ok(Node::Scratch {
                    path: path.to_path_buf(),
                    array: self.tree.current(array),
                    parent: parent.map(<[u64]>::to_vec),
                })
            }
        }
    }
}

impl Overlay<'_> {
    pub(super) fn writable(&self, array: &ShardedArray) -> Result<()> {
        if array.layout.levels.len() > 1 {
            log::warn!(
                "{}: writes to nested sharded arrays are not supported",
                array.rel.display()
            );
            return Err(ViewError::ReadOnly);
        }
        if let Err(e) = crate::write::flush::storable(&array.layout) {
            log::warn!("{}: cannot be written: {e}", array.rel.display());
            return Err(ViewError::ReadOnly);
        }
        Ok(())
    }
}

impl Overlay<'_> {
    /// A commit of `file` (at `path`, written for `array`, at `target`) that must not
    /// happen: `Some` with what to answer. A file renamed to where its descriptors could
    /// not follow ([`View::follow_rename`]) and written since: `ESTALE`. A chunk written
    /// for an array that another mount has since replaced (removed and made again, or of
    /// another layout): not a chunk of the array there now, refused (found by an
    /// adversarial tester: it was stored into the new array).
    fn stale_commit(
        &self,
        path: &Path,
        array: &Arc<ShardedArray>,
        target: &Target,
        file: &Arc<Mutex<Scratch>>,
    ) -> Option<Result<()>> {
        let mut f = file.lock();
        if f.renamed_away && f.dirty {
            f.dirty = false;
            log::warn!(
                "{}: written after it was renamed out of the array's files: not stored",
                path.display()
            );
            return Some(Err(ViewError::Io(std::io::Error::from_raw_os_error(
                libc::ESTALE,
            ))));
        }
        drop(f);
        if !matches!(target, Target::Chunk(_)) || !array.replaced_by(&self.tree.current(array)) {
            return None;
        }
        let mut f = file.lock();
        if !f.dirty || f.orphan {
            return Some(Ok(()));
        }
        f.dirty = false;
        let why = format!(
            "{}: written for an array another mount replaced since: not stored",
            path.display()
        );
        log::warn!("{why}");
        Some(Err(ViewError::Invalid(why)))
    }

    /// A metadata write of scratch file `path` (document `meta` of `array`) that was
    /// refused: rolled back to what the store has.
    fn roll_back_refused_meta(
        &self,
        path: &Path,
        array: &Arc<ShardedArray>,
        meta: MetaFile,
        file: &Arc<Mutex<Scratch>>,
    ) -> Result<()> {
        let array = self.tree.current(array);
        if !self.tree_read().meta_shown(&array, meta) {
            // Unlinked before (`rm .zattrs`, then a document cut short written):
            // rolled back to none, as the store has none. Before, the file stayed,
            // unlisted, and read as the rendering of no attributes (`{}`) through
            // the kernel's entry until it expired (found by an adversarial tester).
            let w = self.w;
            w.scratch.remove(path);
            if let (Some(parent), Some(name)) = (
                path.parent().and_then(|p| self.tree.inodes.peek(p)),
                path.file_name(),
            ) {
                w.invalidate(super::write_api::Invalidation::Entry {
                    parent,
                    name: name.to_os_string(),
                });
            }
            return Ok(());
        }
        // A refused metadata write is rolled back: the file holds the stored
        // document again, for its writer and every later reader.
        let mut f = file.lock();
        let stored = array.meta_bytes(meta).to_vec();
        let w = self.w;
        let (old, new) = (f.data.len() as u64, stored.len() as u64);
        if new > old {
            w.scratch.reserve(new - old)?;
        } else {
            w.scratch.unreserve(old - new);
        }
        f.data = stored;
        f.modified = std::time::SystemTime::now();
        Ok(())
    }

    /// Rename a closed scratch file (a writer's temporary file) onto a chunk key: its
    /// bytes are moved into staging, not copied. `None` when that is not the case (the
    /// target is no chunk key, or a handle still has the file open); the caller then
    /// copies. Refusals are those of [`Overlay::put`], made before anything moves.
    pub(super) fn move_scratch_to_chunk(
        &self,
        path: &Path,
        dir: &Node,
        name: &OsStr,
    ) -> Result<Option<Node>> {
        let (array, parent) = match dir {
            Node::ArrayDir { array } => (array, None),
            Node::KeyDir { array, coords } => (array, Some(coords.as_slice())),
            _ => return Ok(None),
        };
        let Target::Chunk(coords) = self.tree.target(array, parent, name)? else {
            return Ok(None);
        };
        let array = self.tree.current(array);
        self.writable(&array)?;
        // A length no chunk of the array can have is refused before anything moves:
        // the file stays as it was.
        if let (Some(want), Some(len)) = (array.layout.fixed_chunk_len, self.w.scratch.len_at(path))
            && len != want
        {
            let why = format!(
                "{}: {len} bytes; the array's codecs (no compression) make every chunk \
                 exactly {want} bytes: refused",
                path.display()
            );
            log::warn!("{why}");
            return Err(ViewError::Invalid(why));
        }
        let Some(data) = self.w.scratch.take_if_closed(path) else {
            return Ok(None);
        };
        self.unkeep_file(path)?;
        self.commit_chunk(&array, coords.clone(), Some(data))?;
        Ok(Some(Node::Chunk { array, coords }))
    }

    pub(super) fn commit_chunk(
        &self,
        array: &ShardedArray,
        coords: Vec<u64>,
        data: Option<Vec<u8>>,
    ) -> Result<()> {
        self.commit_chunk_closed(array, coords, data, None)
    }

    /// [`Overlay::commit_chunk`], as closed at `closed` (ns since the epoch) instead of now.
    pub(super) fn commit_chunk_closed(
        &self,
        array: &ShardedArray,
        coords: Vec<u64>,
        data: Option<Vec<u8>>,
        closed: Option<u64>,
    ) -> Result<()> {
        let w = self.w;
        // Not while a directory is renamed (`Overlay::rename_dir`): then the array may have
        // moved, and a chunk staged under its old path would be stored nowhere.
        let _committing = w.tree.read();
        if self.tree.arrays.get(&array.rel).is_none() {
            log::warn!(
                "{}: chunk {coords:?} not committed: the array is no longer there (its \
                 directory was renamed or its metadata removed)",
                array.rel.display()
            );
            return Err(ViewError::Io(std::io::Error::from_raw_os_error(
                libc::ESTALE,
            )));
        }
        if let (Some(d), Some(want)) = (&data, array.layout.fixed_chunk_len)
            && d.len() as u64 != want
        {
            let why = format!(
                "{}: chunk {coords:?} is {} bytes; the array's codecs (no compression) \
                 make every chunk exactly {want} bytes: refused, not stored",
                array.rel.display(),
                d.len()
            );
            log::warn!("{why}");
            return Err(ViewError::Invalid(why));
        }
        let counter = if data.is_some() {
            &self.counters.chunks_committed
        } else {
            &self.counters.chunks_deleted
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let closed = closed.unwrap_or_else(|| w.staging.close_time());
        w.staging
            .put_closed(&array.rel, coords, data.map(Arc::new), closed);
        if w.staging.over_limit() {
            // Back-pressure: the writer that filled the buffer flushes it.
            self.flush_all()?;
        }
        Ok(())
    }
}

impl Tree {
    /// The array metadata file that scratch node `node` is a pending write of: until its
    /// last close accepts it, every other reader sees the stored document (a refused
    /// write is never seen; an accepted one is seen from its close on).
    pub(super) fn pending_meta(&self, node: &Node) -> Option<(Arc<ShardedArray>, MetaFile)> {
        let Node::Scratch {
            path,
            array,
            parent: None,
        } = node
        else {
            return None;
        };
        match self.target(array, None, path.file_name()?) {
            Ok(Target::Meta(file)) => Some((self.current(array), file)),
            _ => None,
        }
    }

    /// The key directory a path's parent is, for scratch nodes: `None` = array directory.
    pub(super) fn parent_key(&self, path: &Path) -> Option<Vec<u64>> {
        let parent = path.parent()?;
        match self.inodes.peek(parent).and_then(|i| self.inodes.get(i)) {
            Some((_, Node::KeyDir { coords, .. })) => Some(coords),
            _ => None,
        }
    }

    /// What a name in an array's namespace is, for a write.
    pub(super) fn target(
        &self,
        array: &Arc<ShardedArray>,
        parent: Option<&[u64]>,
        name: &OsStr,
    ) -> Result<Target> {
        let array = self.current(array);
        if parent.is_none()
            && let Some(file) = MetaFile::from_name(name)
            && self.format.array_files().contains(&file)
        {
            return Ok(Target::Meta(file));
        }
        // The v2 view: an array's directory (also one whose `.zarray` is unlinked: its
        // shards are still there) is no group. Before, a `.zgroup` written there (zarr 2's
        // `open_group(mode="a")`) was stored as a file of its own, and the group and what
        // was written into it were gone at the next mount (found by an adversarial tester).
        if self.format == super::ViewFormat::V2
            && parent.is_none()
            && name == MetaFile::Zgroup.name()
        {
            return Ok(Target::Invalid(
                "an array's directory is no group (remove the array first)".into(),
            ));
        }
        let Some(kp) = name
            .to_str()
            .and_then(|n| array.encoding().child(array.layout.ndim(), parent, n))
        else {
            return Ok(Target::Scratch);
        };
        Ok(match kp {
            KeyPath::Chunk(c) if array.layout.chunk_in_grid(&c) => Target::Chunk(c),
            KeyPath::Chunk(c) => Target::Invalid(format!(
                "chunk {c:?} lies outside the grid {:?}",
                array.layout.chunk_counts()
            )),
            KeyPath::Dir(_) => Target::Invalid("a chunk key directory, not a chunk".into()),
        })
    }
}
