//! Writes through the view: scratch files, commits of chunks and metadata, new arrays,
//! and the operations that change the tree (create, mkdir, unlink, rmdir, rename, link).
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
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::writer::{Scratch, Target, Writer};
use super::{ChunkData, Handle, Kind, MetaFile, Node, Result, ShardedArray, View, ViewError};
use crate::format::KeyPath;
use crate::store::{OpenMode, StoreFileRw};

impl View {
    pub(super) fn writer(&self) -> Result<&Writer> {
        self.writer.as_ref().ok_or(ViewError::ReadOnly)
    }

    pub fn write_side(&self) -> Option<&Writer> {
        self.writer.as_ref()
    }

    /// The newest metadata of `array` (it may have been rewritten since the node was made).
    pub(super) fn current(&self, array: &Arc<ShardedArray>) -> Arc<ShardedArray> {
        self.arrays.get(&array.rel).unwrap_or_else(|| array.clone())
    }

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

    /// The key directory a path's parent is, for scratch nodes: `None` = array directory.
    pub(super) fn parent_key(&self, path: &Path) -> Option<Vec<u64>> {
        let parent = path.parent()?;
        match self.inodes.peek(parent).and_then(|i| self.inodes.get(i)) {
            Some((_, Node::KeyDir { coords, .. })) => Some(coords),
            _ => None,
        }
    }

    pub(super) fn open_for_write(
        &self,
        ino: u64,
        path: &Path,
        node: &Node,
        truncate: bool,
    ) -> Result<Handle> {
        let w = self.writer()?;
        let scratch_node = |array: &Arc<ShardedArray>| Node::Scratch {
            path: path.to_path_buf(),
            array: self.current(array),
            parent: self.parent_key(path),
        };
        let (file, node) = match node {
            Node::Stats | Node::Container(_) => return Err(ViewError::ReadOnly),
            // Accepted and let go: the view makes `.zmetadata` from the hierarchy.
            Node::Consolidated { dir } => return Ok(Handle::Discard(dir.clone())),
            Node::PlainFill { rel, data, .. } => {
                // Made in the store as the chunk it reads as (a partial write keeps the
                // rest of it), then written as the store file it now is.
                if let Some(dir) = rel.parent() {
                    self.make_plain_dirs(dir)?;
                }
                self.store
                    .write_atomically(rel, if truncate { &[] } else { data.as_slice() })?;
                self.inodes.update(ino, Node::File { rel: rel.clone() });
                let f = self.open_store_file(rel, false)?;
                return Ok(Handle::StoreRw(Arc::from(f), rel.clone()));
            }
            Node::File { rel } => {
                let f = self.open_store_file(rel, truncate)?;
                return Ok(Handle::StoreRw(Arc::from(f), rel.clone()));
            }
            Node::Chunk { array, coords } => {
                let array = self.current(array);
                self.writable(&array)?;
                let data = if truncate {
                    Vec::new()
                } else {
                    self.chunk_bytes(&array, coords)?
                };
                (
                    w.new_scratch(path, data, truncate, 1)?,
                    scratch_node(&array),
                )
            }
            Node::ArrayMeta { array, file } => {
                let data = if truncate {
                    Vec::new()
                } else {
                    self.current(array).meta_bytes(*file).to_vec()
                };
                (w.new_scratch(path, data, truncate, 1)?, scratch_node(array))
            }
            Node::GroupMeta { dir, file } => {
                // Written as a store file, taken in when it is closed.
                let data = if truncate {
                    Vec::new()
                } else {
                    self.group_meta(dir, *file)?
                };
                let rel = dir.join(file.name());
                let f = self.store.open_rw(&rel, OpenMode::Create, true)?;
                f.write_all_at(&data, 0)?;
                self.inodes.update(ino, Node::File { rel: rel.clone() });
                return Ok(Handle::StoreRw(Arc::from(f), rel));
            }
            Node::Scratch { path: p, .. } => {
                let Some(file) = w.open_scratch(p) else {
                    return self.open_for_write(ino, path, &self.settled(ino)?, truncate);
                };
                if truncate {
                    let mut f = file.lock();
                    w.unreserve(f.data.len() as u64);
                    f.data.clear();
                    f.dirty = true;
                }
                (file, node.clone())
            }
            Node::Dir { .. }
            | Node::ArrayDir { .. }
            | Node::KeyDir { .. }
            | Node::DraftGroup { .. }
            | Node::PlainFillDir { .. } => {
                return Err(ViewError::IsDir);
            }
            Node::Symlink { .. } => {
                return Err(ViewError::Io(std::io::Error::from_raw_os_error(
                    libc::ELOOP,
                )));
            }
        };
        self.inodes.update(ino, node.clone());
        Ok(Handle::Scratch { ino, node, file })
    }

    /// A store file opened for writing. A v2 metadata file is taken in (and removed
    /// from the store) when it is closed, while the kernel may still hold its entry for
    /// the next writer (whose `O_TRUNC` may come as a truncate first): it is made again.
    pub(super) fn open_store_file(
        &self,
        rel: &Path,
        truncate: bool,
    ) -> Result<Box<dyn StoreFileRw>> {
        let w = self.writer()?;
        if super::pending_doc::is_doc(rel) {
            self.note_unsharded(rel);
            return Ok(Box::new(w.docs.open(&self.store, rel, truncate, false)?));
        }
        let v2_meta = self.format == super::ViewFormat::V2
            && rel.file_name().and_then(MetaFile::from_name).is_some();
        let mode = if v2_meta {
            OpenMode::Create
        } else {
            OpenMode::Existing
        };
        Ok(self.store.open_rw(rel, mode, truncate)?)
    }

    pub(super) fn chunk_bytes(&self, array: &ShardedArray, coords: &[u64]) -> Result<Vec<u8>> {
        match self.chunk_or_fill(array, coords, true)? {
            ChunkData::Staged(b) => Ok(b.to_vec()),
            ChunkData::Shard(shard, range) => {
                let len = u32::try_from(range.nbytes).map_err(|_| ViewError::NoSpace)?;
                shard.read(range, 0, len).map_err(|err| ViewError::Shard {
                    shard: shard.rel().to_path_buf(),
                    err,
                })
            }
        }
    }

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
        let target = self.target(array, parent.as_deref(), name)?;
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
                self.writer()?.remove_scratch(path);
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
            // With kernel opens no close is heard of: the last write stands for it, so a
            // write fsynced by another mount after this one's close is not replaced by it
            // when this one is committed later.
            let closed = (self.kernel_opens() && f.written != 0).then_some(f.written);
            (f.data.clone(), closed)
        };
        let put = self.put(array, parent.as_deref(), name, path, data, closed);
        if put.is_ok() {
            // Stored: an earlier refusal of the same file is no longer true.
            let shown = path.display().to_string();
            self.counters.refused.lock().retain(|(p, _)| *p != shown);
        }
        if let (Err(ViewError::Invalid(_)), Target::Meta(meta)) = (&put, target) {
            // A refused metadata write is rolled back: the file holds the stored
            // document again, for its writer and every later reader.
            let mut f = file.lock();
            let stored = self.current(array).meta_bytes(meta).to_vec();
            let w = self.writer()?;
            let (old, new) = (f.data.len() as u64, stored.len() as u64);
            if new > old {
                w.reserve(new - old)?;
            } else {
                w.unreserve(old - new);
            }
            f.data = stored;
        }
        put.map(|_| ())
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
        let Some(file) = self.lands_on_close(rel) else {
            return Ok(());
        };
        let w = self.writer()?;
        if w.landed_at_write.lock().contains(&fh) {
            return Ok(());
        }
        let whole = match self.pending_doc(rel) {
            // Stored by the write that made it whole.
            Some(doc) => doc.whole(),
            None => self
                .store
                .read_all(rel)?
                .is_some_and(|b| super::pending_doc::whole_json(&b)),
        };
        if !whole {
            return Ok(()); // not whole yet
        }
        w.landed_at_write.lock().insert(fh);
        self.metadata_landed(rel.parent().unwrap_or(Path::new("")), file)
    }

    /// `close` of a file handle (FUSE `flush`): commits a written chunk or metadata, and
    /// adopts a new array whose `zarr.json` was written in place. This runs before
    /// `close` returns — `release` comes later, asynchronously, and a writer like
    /// `cp -r` would already be creating the chunk files.
    pub fn flush_handle(&self, fh: u64) -> Result<()> {
        let handle = self.handles.get(fh).ok();
        match handle {
            Some(Handle::Scratch { node, file, .. }) => {
                if self.kernel_opens()
                    && let Some(w) = self.write_side()
                {
                    w.landed_at_write.lock().remove(&fh);
                }
                self.commit_scratch(&node, &file)
            }
            // A shell's redirection (`echo ... > zarr.json`) closes a duplicate of the
            // still-empty file before it writes: that close waits for the one that
            // brings the document.
            Some(Handle::StoreRw(_, rel))
                if self
                    .pending_doc(&rel)
                    .is_some_and(|d| d.is_empty() && d.opens() > 1) =>
            {
                Ok(())
            }
            Some(Handle::StoreRw(_, rel)) if self.pending_doc(&rel).is_some_and(|d| !d.whole()) => {
                self.doc_finished(&rel)
            }
            Some(Handle::StoreRw(_, rel)) => match self.lands_on_close(&rel) {
                // Taken in at a write already (`View::land_at_write`).
                Some(_)
                    if self
                        .write_side()
                        .is_some_and(|w| w.landed_at_write.lock().remove(&fh)) =>
                {
                    Ok(())
                }
                // A shell's redirection (`echo ... > .zattrs`) closes a duplicate of the
                // still-empty file before it writes: v2 metadata with nothing in it yet
                // waits for the close that brings it (or for `release`).
                Some(file)
                    if file != MetaFile::ZarrJson
                        && self.store.stat(&rel)?.is_some_and(|m| m.len == 0) =>
                {
                    Ok(())
                }
                Some(file) => self.metadata_landed(rel.parent().unwrap_or(Path::new("")), file),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// The last handle of v2 metadata written as a store file went: what no close took in
    /// (it was empty then) is taken in now, or refused and removed.
    pub(super) fn release_store_file(&self, rel: &Path) {
        // Not while another writer has it open: its release comes after the close of
        // this one (asynchronously), and the file may be that writer's, still being
        // written (zarr 2 writing a group's `.zattrs` twice through fsspec: the second
        // close found it taken in and gone, `ENOENT`).
        if self.handles.writes_to(rel) {
            return;
        }
        if let Some(file) = self.lands_on_close(rel)
            && file != MetaFile::ZarrJson
            && matches!(self.store.stat(rel), Ok(Some(_)))
            && let Err(e) = self.metadata_landed(rel.parent().unwrap_or(Path::new("")), file)
        {
            log::warn!("{}: not taken in at release: {e}", rel.display());
        }
    }

    /// Whether [`View::flush_handle`] may do anything for `handle`: a scratch file at a
    /// chunk key or metadata (a commit), a store metadata file open for writing (a new
    /// array, or v2 metadata to take in). Every other close needs no flush request — most of all the read-only opens
    /// of chunks, and the temporary files of tmp+rename writers.
    pub(super) fn commits_on_close(&self, handle: &Handle) -> bool {
        match handle {
            Handle::Scratch { node, .. } => self.commits(node).unwrap_or(true),
            Handle::StoreRw(_, rel) => self.lands_on_close(rel).is_some(),
            Handle::Store(_) | Handle::Bytes(_) | Handle::Chunk { .. } | Handle::Discard(_) => {
                false
            }
        }
    }

    /// Whether closing a written scratch file commits it: it sits at a chunk key or at
    /// the array's metadata.
    fn commits(&self, node: &Node) -> Result<bool> {
        let Node::Scratch {
            path,
            array,
            parent,
        } = node
        else {
            return Ok(false);
        };
        let name = path.file_name().unwrap_or_default();
        Ok(matches!(
            self.target(array, parent.as_deref(), name)?,
            Target::Meta(_) | Target::Chunk(_)
        ))
    }

    /// The metadata file a written store file is, if closing it changes the tree:
    /// `zarr.json` (a new array) and, in the v2 view, `.zarray`, `.zattrs`, `.zgroup`.
    pub(super) fn lands_on_close(&self, rel: &Path) -> Option<MetaFile> {
        match rel.file_name().and_then(MetaFile::from_name)? {
            MetaFile::ZarrJson => Some(MetaFile::ZarrJson),
            f if self.format == super::ViewFormat::V2 => Some(f),
            _ => None,
        }
    }

    /// The last handle of a scratch file closed: anything still uncommitted is
    /// committed, and a scratch file at a chunk key or `zarr.json` goes back to being
    /// that chunk or metadata; other scratch files stay, waiting for a rename.
    pub(super) fn release_scratch(
        &self,
        ino: u64,
        node: &Node,
        file: &Arc<Mutex<Scratch>>,
    ) -> Result<()> {
        let Node::Scratch {
            path,
            array,
            parent,
        } = node
        else {
            return Ok(());
        };
        let (last, orphan) = {
            let mut f = file.lock();
            f.opens = f.opens.saturating_sub(1);
            (f.opens == 0, f.orphan)
        };
        if !last {
            return Ok(());
        }
        if orphan {
            let mut f = file.lock();
            self.writer()?.unreserve(f.data.len() as u64);
            f.data = Vec::new();
            return Ok(());
        }
        let committed = self.commit_scratch(node, file);
        self.settle_scratch(ino, path, array, parent.as_deref())?;
        committed
    }

    /// A scratch file at a chunk key or `zarr.json` whose last handle closed goes back.
    pub(super) fn settle_scratch(
        &self,
        ino: u64,
        path: &Path,
        array: &Arc<ShardedArray>,
        parent: Option<&[u64]>,
    ) -> Result<()> {
        let w = self.writer()?;
        let name = path.file_name().unwrap_or_default();
        let back = match self.target(array, parent, name)? {
            Target::Meta(file) => Node::ArrayMeta {
                array: self.current(array),
                file,
            },
            Target::Chunk(coords) => Node::Chunk {
                array: self.current(array),
                coords,
            },
            Target::Scratch | Target::Invalid(_) => return Ok(()),
        };
        // The inode becomes the chunk before the scratch file goes, under the scratch
        // table's lock: whoever still holds the scratch node and finds its file gone
        // looks again and finds the chunk (`View::settled`), never a name with nothing.
        let mut map = w.scratch.lock();
        let closed = map.get(path).is_some_and(|f| f.lock().opens == 0);
        if closed {
            self.inodes.update(ino, back);
            if let Some(file) = map.remove(path) {
                w.unreserve(file.lock().data.len() as u64);
            }
        }
        Ok(())
    }

    /// The node `ino` is now, for a caller that held it as a scratch node whose file was
    /// gone: it settled meanwhile (its last handle closed) into a chunk or metadata.
    /// `NotFound` if it is still a scratch node (the file was unlinked).
    pub(super) fn settled(&self, ino: u64) -> Result<Node> {
        let (path, node) = self.node(ino)?;
        if !matches!(node, Node::Scratch { .. }) {
            return Ok(node);
        }
        // A lookup racing the settle may have put the scratch node back: ask the path.
        match self.resolve(&path)? {
            Some(now) if !matches!(now, Node::Scratch { .. }) => {
                self.inodes.update(ino, now.clone());
                Ok(now)
            }
            _ => Err(ViewError::NotFound),
        }
    }

    /// What a name in an array's namespace is, for a write.
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
        match self.target(array, parent, name)? {
            Target::Meta(file) => {
                let key = (self.current(array).meta_rel.clone(), file);
                let written = self.remember_as_written(key, &data);
                let array = self
                    .update_array_meta(array, file, &data)
                    .inspect_err(|_| self.forget_as_written(written))?;
                Ok(Node::ArrayMeta { array, file })
            }
            Target::Chunk(coords) => {
                let array = self.current(array);
                self.writable(&array)?;
                self.commit_chunk_closed(&array, coords.clone(), Some(data), closed)?;
                Ok(Node::Chunk { array, coords })
            }
            Target::Invalid(why) => {
                log::warn!("{}: refused: {why}", path.display());
                Err(ViewError::Invalid(why))
            }
            Target::Scratch => {
                let w = self.writer()?;
                // A file of its own of the store at that name is replaced: its stored
                // copy is this file's from now on (overwritten when this one is stored,
                // removed with its name).
                if self
                    .store
                    .stat(path)?
                    .is_some_and(|m| m.kind == crate::store::EntryKind::File)
                {
                    w.kept_paths.lock().insert(path.to_path_buf());
                }
                let file = w.new_scratch(path, data, false, 0)?;
                drop(file);
                Ok(Node::Scratch {
                    path: path.to_path_buf(),
                    array: self.current(array),
                    parent: parent.map(<[u64]>::to_vec),
                })
            }
        }
    }

    /// Rename a closed scratch file (a writer's temporary file) onto a chunk key: its
    /// bytes are moved into staging, not copied. `None` when that is not the case (the
    /// target is no chunk key, or a handle still has the file open); the caller then
    /// copies. Refusals are those of [`View::put`], made before anything moves.
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
        let Target::Chunk(coords) = self.target(array, parent, name)? else {
            return Ok(None);
        };
        let array = self.current(array);
        self.writable(&array)?;
        // A length no chunk of the array can have is refused before anything moves:
        // the file stays as it was.
        if let (Some(want), Some(len)) = (
            array.layout.fixed_chunk_len,
            self.writer()?.scratch_len(path),
        ) && len != want
        {
            let why = format!(
                "{}: {len} bytes; the array's codecs (no compression) make every chunk \
                 exactly {want} bytes: refused",
                path.display()
            );
            log::warn!("{why}");
            return Err(ViewError::Invalid(why));
        }
        let Some(data) = self.writer()?.take_scratch_if_closed(path) else {
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

    /// [`View::commit_chunk`], as closed at `closed` (ns since the epoch) instead of now.
    pub(super) fn commit_chunk_closed(
        &self,
        array: &ShardedArray,
        coords: Vec<u64>,
        data: Option<Vec<u8>>,
        closed: Option<u64>,
    ) -> Result<()> {
        let w = self.writer()?;
        // Not while a directory is renamed (`View::rename_dir`): then the array may have
        // moved, and a chunk staged under its old path would be stored nowhere.
        let _committing = w.tree.read();
        if self.arrays.get(&array.rel).is_none() {
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

    /// The node at a view path, walking from the root.
    pub(super) fn resolve(&self, path: &Path) -> Result<Option<Node>> {
        let (_, mut node) = self.node(super::ROOT_INO)?;
        let mut cur = PathBuf::new();
        for part in path.iter() {
            match self.child(&cur, &node, part)? {
                Some(n) => node = n,
                None => return Ok(None),
            }
            cur.push(part);
        }
        Ok(Some(node))
    }

    /// Entries that exist only in memory: scratch files, key directories made by mkdir,
    /// staged chunks in shards that do not exist yet.
    pub(super) fn written_entries(&self, path: &Path, node: &Node) -> Vec<super::DirEntry> {
        let Some(w) = &self.writer else {
            return Vec::new();
        };
        let (array, prefix) = match node {
            Node::ArrayDir { array } => (self.current(array), None),
            Node::KeyDir { array, coords } => (self.current(array), Some(coords.clone())),
            _ => return Vec::new(),
        };
        let entry = |name: String, kind| super::DirEntry {
            ino: 0,
            name: name.into(),
            kind,
        };
        let mut out: Vec<_> = w
            .scratch
            .lock()
            .keys()
            .filter(|p| p.parent() == Some(path))
            .filter_map(|p| {
                p.file_name()
                    .map(|n| entry(n.to_string_lossy().into_owned(), Kind::File))
            })
            .collect();
        let enc = array.encoding();
        let ndim = array.layout.ndim();
        let k = prefix.as_ref().map_or(0, Vec::len);
        let p = prefix.clone().unwrap_or_default();
        let counts = array.layout.chunk_counts();
        let mut keys: Vec<(Vec<u64>, bool)> = w
            .vdirs
            .lock()
            .iter()
            .filter(|(a, _)| a == &array.rel)
            // One a shrink left outside the grid is no key directory now (a lookup finds
            // none): not listed.
            .filter(|(_, c)| c.iter().zip(counts).all(|(c, n)| c < n))
            .map(|(_, c)| (c.clone(), false))
            .collect();
        keys.extend(
            w.staging
                .under(&array.rel, &p)
                .into_iter()
                .filter(|(_, exists)| *exists)
                .map(|(c, _)| (c, true)),
        );
        for (c, is_chunk) in keys {
            if !c.starts_with(&p) {
                continue;
            }
            if prefix.is_none()
                && let Some(root) = enc.root_component(ndim)
            {
                out.push(entry(root.to_string(), Kind::Dir));
            } else if !enc.nested() || ndim == 0 {
                if is_chunk {
                    out.push(entry(enc.encode(&c), Kind::File));
                }
            } else if c.len() > k {
                let last = k + 1 == ndim;
                if !last || is_chunk {
                    out.push(entry(
                        c[k].to_string(),
                        if last { Kind::File } else { Kind::Dir },
                    ));
                }
            }
        }
        out
    }
}
