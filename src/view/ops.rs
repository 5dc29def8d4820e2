//! The operations that change the tree through the view: create, write, truncate,
//! mkdir, unlink, rmdir, rename and link. Inside arrays they work on scratch files and
//! staged chunks (`write`); elsewhere they pass through to the store.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::{
    Attr, Handle, MetaFile, Node, Opened, Renamed, Result, ShardedArray, View, ViewError, container,
};
use crate::format::KeyPath;

use super::writer::Target;
use crate::store::{OpenMode, StoreFileRw};

impl View {
    /// Create and open `name` in `parent`.
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        exclusive: bool,
        truncate: bool,
    ) -> Result<(Attr, Opened)> {
        let _making = self.writer.as_ref().map(|w| w.tree.read());
        refuse_internal(name)?;
        let (ppath, pnode) = self.fresh_parent(parent)?;
        container::refuse_writes(&[Some(&pnode)])?;
        let path = ppath.join(name);
        let existing = match self.child(&ppath, &pnode, name)? {
            // Served where nothing is stored: `O_EXCL` makes the file (`tar x`, which
            // retries after an unlink, would otherwise never get it).
            Some(n) if exclusive && self.is_fill(&path, &n)? => None,
            found => found,
        };
        if let Some(existing) = existing {
            if exclusive {
                return Err(ViewError::Exists);
            }
            let ino = self.inodes.intern(path.clone(), existing.clone());
            let handle = self.open_for_write(ino, &path, &existing, truncate)?;
            return Ok((self.getattr(ino)?, self.add_handle(ino, handle, false)));
        }
        let (node, handle) = match &pnode {
            Node::Dir { rel } => {
                self.writer()?;
                let rel = self.new_child_rel(rel, name)?;
                // A metadata document is stored once whole, not made empty now.
                let f: Box<dyn crate::store::StoreFileRw> = if super::pending_doc::is_doc(&rel) {
                    let w = self.writer()?;
                    Box::new(w.docs.open(&self.store, &rel, true, true)?)
                } else {
                    self.store.open_rw(&rel, OpenMode::CreateNew, false)?
                };
                (
                    Node::File { rel: rel.clone() },
                    Handle::StoreRw(std::sync::Arc::from(f), rel),
                )
            }
            Node::ArrayDir { array } | Node::KeyDir { array, .. } => {
                let array = self.current(array);
                self.writable(&array)?;
                let parent = match &pnode {
                    Node::KeyDir { coords, .. } => Some(coords.clone()),
                    _ => None,
                };
                // A file at a chunk key outside the grid (or at a key directory's name)
                // could never be committed: its bytes would be dropped at unmount.
                if let Target::Invalid(why) = self.target(&array, parent.as_deref(), name)? {
                    log::warn!("{}: refused: {why}", path.display());
                    return Err(ViewError::Invalid(why));
                }
                let file = self.writer()?.new_scratch(&path, Vec::new(), true, 1)?;
                let node = Node::Scratch {
                    path: path.clone(),
                    array,
                    parent,
                };
                (node.clone(), Handle::Scratch { ino: 0, node, file })
            }
            _ => return Err(ViewError::NotDir),
        };
        let ino = self.inodes.intern(path, node);
        let handle = match handle {
            Handle::Scratch { node, file, .. } => Handle::Scratch { ino, node, file },
            h => h,
        };
        Ok((self.getattr(ino)?, self.add_handle(ino, handle, false)))
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        match self.handle(fh)? {
            Handle::StoreRw(f, rel) => {
                f.write_all_at(data, offset)?;
                if self.kernel_opens() {
                    self.land_at_write(fh, &rel)?;
                }
            }
            Handle::Scratch { file, node, .. } => {
                let w = self.writer()?;
                let mut f = file.lock();
                let start = usize::try_from(offset).map_err(|_| ViewError::NoSpace)?;
                let end = start.checked_add(data.len()).ok_or(ViewError::NoSpace)?;
                let len = f.data.len();
                if end > len {
                    w.reserve_growth(end as u64, (end - len) as u64)?;
                }
                // Bytes past the end are appended, not zero-filled and then overwritten
                // (a 1 MiB chunk arrives in one request: the fill was a second pass).
                if start > len {
                    f.data.resize(start, 0);
                }
                let overlap = end.min(len).saturating_sub(start);
                f.data[start..start + overlap].copy_from_slice(&data[..overlap]);
                f.data.extend_from_slice(&data[overlap..]);
                f.dirty = true;
                let kernel = self.kernel_opens();
                if kernel {
                    f.written = w.staging.close_time();
                }
                let whole = kernel
                    && self.pending_meta(&node).is_some()
                    && super::pending_doc::whole_json(&f.data);
                drop(f);
                if whole {
                    // An array's metadata, with kernel opens: committed at the write that
                    // makes it a whole document (as `View::land_at_write` takes in store
                    // files), so the writer's next step (chunks of a grown grid) finds
                    // it applied; a refusal is this write's error.
                    w.landed_at_write.lock().insert(fh);
                    self.commit_scratch(&node, &file)?;
                }
            }
            Handle::Discard(_) => {}
            _ => {
                return Err(ViewError::Io(std::io::Error::from_raw_os_error(
                    libc::EBADF,
                )));
            }
        }
        Ok(data.len() as u32)
    }

    /// Truncate (or extend) a file.
    /// `chmod`/`chown`: applied to what is a file or directory of the store (files
    /// outside arrays, directories, an array's directory); the files the view makes up
    /// (chunks, key directories, metadata shown) take their mode and owner from the
    /// array's `zarr.json` in the store, and a change to one of them is accepted and
    /// changes nothing (`cp -p`, `rsync -a` and `tar` set them on every file they write).
    pub fn set_mode_owner(
        &self,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<Attr> {
        let (_, node) = self.node(ino)?;
        container::refuse_writes(&[Some(&node)])?;
        let rel = match &node {
            Node::File { rel } | Node::Dir { rel } => Some(rel),
            Node::ArrayDir { array } => Some(&array.rel),
            _ => None,
        };
        if let Some(rel) = rel {
            self.writer()?;
            match self.pending_doc(rel) {
                Some(doc) => doc.set_mode_owner(mode, uid, gid)?,
                None => self.store.set_mode_owner(rel, mode, uid, gid)?,
            }
            if let Node::ArrayDir { array } = &node {
                // The array's directory attributes are kept with the array.
                self.reload_array(&array.rel)?;
            }
        }
        self.getattr(ino)
    }

    /// `utimensat`: times that `stat` returns while the file is unchanged, for the
    /// mount's lifetime (chunks have no times of their own in a shard; see
    /// docs/SEMANTICS.md). `None` keeps that time.
    pub fn set_times(
        &self,
        ino: u64,
        atime: Option<std::time::SystemTime>,
        mtime: Option<std::time::SystemTime>,
    ) -> Result<Attr> {
        let w = self.writer()?;
        let (path, node) = self.node(ino)?;
        container::refuse_writes(&[Some(&node)])?;
        let now = self.getattr(ino)?;
        let base = {
            let times = w.times.lock();
            times
                .get(&path)
                .filter(|t| t.base == now.mtime || t.mtime == now.mtime)
                .map_or(now.mtime, |t| t.base)
        };
        w.times.lock().insert(
            path,
            super::writer::SetTimes {
                base,
                atime: atime.unwrap_or(now.atime),
                mtime: mtime.unwrap_or(now.mtime),
            },
        );
        self.getattr(ino)
    }

    pub fn set_size(&self, ino: u64, size: u64) -> Result<Attr> {
        let (path, node) = self.node(ino)?;
        self.names_its_file(ino, &path, &node)?;
        let w = self.writer()?;
        match &node {
            Node::Stats | Node::Container(_) => return Err(ViewError::ReadOnly),
            // Accepted and let go: the view makes `.zmetadata` from the hierarchy.
            Node::Consolidated { .. } => {}
            Node::PlainFill { .. } => {
                // Made in the store first, then truncated as the file it now is.
                if let Handle::StoreRw(f, _) = self.open_for_write(ino, &path, &node, false)? {
                    f.set_len(size)?;
                }
            }
            Node::File { rel } if super::pending_doc::is_doc(rel) => {
                // A metadata document: truncated as a whole document or refused, checked
                // while this handle still holds it (the last one lets it go).
                self.note_unsharded(rel);
                let f = w.docs.open(&self.store, rel, false, false)?;
                f.set_len(size)?;
                if !f.whole() {
                    return Err(not_whole(rel));
                }
            }
            Node::File { rel } => self.open_store_file(rel, false)?.set_len(size)?,
            Node::Scratch { path, .. } => {
                let file = w.scratch(path).ok_or(ViewError::NotFound)?;
                let mut f = file.lock();
                let size = usize::try_from(size).map_err(|_| ViewError::TooBig(u64::MAX))?;
                if size > f.data.len() {
                    w.reserve_growth(size as u64, (size - f.data.len()) as u64)?;
                } else {
                    w.unreserve((f.data.len() - size) as u64);
                }
                f.data.resize(size, 0);
                f.dirty = true;
                if self.kernel_opens() {
                    f.written = w.staging.close_time();
                }
            }
            Node::Chunk { array, coords } => {
                let array = self.current(array);
                self.writable(&array)?;
                // Never more than a file may hold while staged (`truncate -s 1T` of a
                // chunk must not try to allocate a terabyte).
                if size > w.scratch_limit {
                    return Err(ViewError::TooBig(w.scratch_limit));
                }
                let mut data = self.chunk_bytes(&array, coords)?;
                data.resize(size as usize, 0);
                self.commit_chunk(&array, coords.clone(), Some(data))?;
            }
            Node::ArrayMeta { .. } => {
                if size > w.scratch_limit {
                    return Err(ViewError::TooBig(w.scratch_limit));
                }
                let h = self.open_for_write(ino, &path, &node, false)?;
                if let Handle::Scratch { file, node, .. } = h {
                    file.lock().data.resize(size as usize, 0);
                    file.lock().dirty = true;
                    self.release_scratch(ino, &node, &file)?;
                }
            }
            Node::GroupMeta { .. } => {
                // Now a store file, taken in when a handle of it closes.
                if let Handle::StoreRw(f, _) = self.open_for_write(ino, &path, &node, false)? {
                    f.set_len(size)?;
                }
            }
            Node::Dir { .. }
            | Node::ArrayDir { .. }
            | Node::KeyDir { .. }
            | Node::DraftGroup { .. }
            | Node::PlainFillDir { .. } => {
                return Err(ViewError::IsDir);
            }
            Node::Symlink { .. } => return Err(ViewError::Invalid("a symlink".into())),
        }
        self.getattr(ino)
    }

    pub fn mkdir(&self, parent: u64, name: &OsStr) -> Result<Attr> {
        let _making = self.writer.as_ref().map(|w| w.tree.read());
        refuse_internal(name)?;
        let (ppath, pnode) = self.fresh_parent(parent)?;
        container::refuse_writes(&[Some(&pnode)])?;
        if self.stored_child(&ppath, &pnode, name)?.is_some() {
            return Err(ViewError::Exists);
        }
        let node = match &pnode {
            Node::Dir { rel } => {
                self.writer()?;
                let rel = self.new_child_rel(rel, name)?;
                self.store.create_dir(&rel)?;
                let meta = self.stat_rel(&rel)?;
                self.classify_dir(rel, meta)?
            }
            Node::ArrayDir { array } | Node::KeyDir { array, .. } => {
                let array = self.current(array);
                let prefix = match &pnode {
                    Node::KeyDir { coords, .. } => Some(coords.as_slice()),
                    _ => None,
                };
                let kp = name
                    .to_str()
                    .and_then(|n| array.encoding().child(array.layout.ndim(), prefix, n));
                match kp {
                    Some(KeyPath::Dir(coords))
                        if coords
                            .iter()
                            .zip(array.layout.chunk_counts())
                            .all(|(c, n)| c < n) =>
                    {
                        self.writer()?
                            .vdirs
                            .lock()
                            .insert((array.rel.clone(), coords.clone()));
                        Node::KeyDir { array, coords }
                    }
                    // A name outside the key namespace of the array's own directory: a
                    // store directory, as any other file there passes through (a store
                    // nested in an array's directory, as zarr-python's tests make).
                    None if prefix.is_none()
                        && !array.draft
                        && !self.hidden_in_array(&array, name) =>
                    {
                        self.writer()?;
                        let rel = array.rel.join(name);
                        self.store.create_dir(&rel)?;
                        let meta = self.stat_rel(&rel)?;
                        self.classify_dir(rel, meta)?
                    }
                    _ => {
                        let why = format!(
                            "{}: not a chunk key directory of this array",
                            ppath.join(name).display()
                        );
                        log::warn!("mkdir refused: {why}");
                        return Err(ViewError::Invalid(why));
                    }
                }
            }
            _ => return Err(ViewError::NotDir),
        };
        let ino = self.inodes.intern(ppath.join(name), node);
        self.getattr(ino)
    }

    /// Whether `name` in directory `pnode` is a chunk key of an array (inside its grid
    /// or not).
    fn is_chunk_key(&self, pnode: &Node, name: &OsStr) -> bool {
        let (array, prefix) = match pnode {
            Node::ArrayDir { array } => (self.current(array), None),
            Node::KeyDir { array, coords } => (self.current(array), Some(coords.as_slice())),
            _ => return false,
        };
        let ndim = array.layout.ndim();
        matches!(
            name.to_str()
                .and_then(|n| array.encoding().child(ndim, prefix, n)),
            Some(KeyPath::Chunk(_))
        )
    }

    /// The parent's path, the child's path and the child's node; `NotFound` if absent.
    fn existing_child(&self, parent: u64, name: &OsStr) -> Result<(PathBuf, PathBuf, Node)> {
        let (ppath, pnode) = self.node(parent)?;
        let node = self
            .stored_child(&ppath, &pnode, name)?
            .ok_or(ViewError::NotFound)?;
        let path = ppath.join(name);
        Ok((ppath, path, node))
    }

    pub fn unlink(&self, dir: u64, name: &OsStr) -> Result<()> {
        let parent = dir;
        if self.only_fill(parent, name)? {
            return Ok(());
        }
        let (ppath, path, node) = match self.existing_child(parent, name) {
            Err(ViewError::NotFound | ViewError::StaleInode(_))
                if let Some((ppath, pnode)) = self.inodes.get_any(parent)
                    && self.is_chunk_key(&pnode, name)
                    && self.inodes.known(&ppath.join(name))
                    // Not one the v2 view serves as the fill value: that one is not
                    // stored, and was not deleted.
                    && matches!(self.child(&ppath, &pnode, name), Ok(None)) =>
            {
                // The kernel still knows the name (an unlink comes without a lookup when
                // the dentry is cached) but the chunk is gone: deleted by the mount
                // itself just now (a shape shrink, which retires the inodes of chunks and
                // key directories outside the new grid), its invalidation still on the
                // way. Deleting what is not there is done; the stale entry goes.
                self.writer()?;
                self.inodes.detach(&ppath.join(name));
                return Ok(());
            }
            other => other?,
        };
        let w = self.writer()?;
        match &node {
            Node::Stats | Node::Container(_) => return Err(ViewError::ReadOnly),
            // Left to `only_fill` above.
            Node::PlainFill { .. } => return Ok(()),
            // Made from the hierarchy, never stored: gone where the group is.
            Node::Consolidated { dir } => {
                w.zmetadata_left.lock().remove(dir);
            }
            Node::Scratch {
                path,
                array,
                parent,
            } => {
                let metadata = self.pending_meta(&node).is_some();
                self.unname_scratch(path, array, parent.as_deref())?;
                if metadata {
                    // A write of the array's metadata not yet taken in (cut short): it
                    // goes, and so does the metadata under it, as the unlink says.
                    return self.unlink(dir, name);
                }
            }
            Node::Chunk { array, coords } => {
                let array = self.current(array);
                self.writable(&array)?;
                self.commit_chunk(&array, coords.clone(), None)?;
                // The key directory stays, empty, until it is removed itself (as on
                // any file system: `rm -rf` removes a directory after its last file).
                if let Some((_, parent)) = coords.split_last() {
                    w.vdirs.lock().insert((array.rel.clone(), parent.to_vec()));
                }
            }
            Node::ArrayMeta {
                array,
                file: MetaFile::Zattrs,
            } => {
                if let Some(h) = w.headless.lock().get_mut(&array.rel) {
                    h.zattrs = false;
                } else {
                    self.update_array_meta(array, MetaFile::Zattrs, b"{}")?;
                }
                self.inodes.detach(&path);
                return Ok(());
            }
            Node::ArrayMeta {
                array,
                file: MetaFile::Zarray,
            } => {
                // zarr 2 removes an array recursively from a listing taken first, where
                // `.zarray` comes before `.zattrs` and the chunks: the metadata leaves
                // the store now, the other names stay until each is removed, and the
                // directory goes with `rmdir`.
                let array = self.current(array);
                self.flush_array(&array)?;
                self.store.remove_file(&array.meta_rel)?;
                w.headless.lock().insert(
                    array.rel.clone(),
                    super::writer::Headless {
                        array: array.clone(),
                        zattrs: true,
                    },
                );
                self.inodes.detach(&path);
                return Ok(());
            }
            Node::GroupMeta { dir, file } => {
                self.unlink_group_meta(dir, *file)?;
                return Ok(());
            }
            Node::ArrayMeta { array, .. } => {
                // The array stops being one: make its chunks durable, then remove the
                // metadata; the directory then shows the store as it is.
                let array = self.current(array);
                self.flush_array(&array)?;
                self.store.remove_file(&array.meta_rel)?;
                self.arrays.remove(&array.rel);
                w.staging.discard(&array.rel);
                w.vdirs.lock().retain(|(a, _)| a != &array.rel);
                self.inodes.update_path(
                    &ppath,
                    Node::Dir {
                        rel: array.rel.clone(),
                    },
                );
                self.inodes.detach(&path);
                self.refresh_subtree(&array.rel);
                return Ok(());
            }
            Node::File { rel } | Node::Symlink { rel } => {
                self.remove_store_file(rel)?;
                // A key directory that held it stays, as any directory does when a file
                // in it goes (it may have nothing else below it now).
                if let Ok((_, Node::KeyDir { array, coords })) = self.node(parent) {
                    w.vdirs.lock().insert((array.rel.clone(), coords));
                }
            }
            Node::Dir { .. }
            | Node::ArrayDir { .. }
            | Node::KeyDir { .. }
            | Node::DraftGroup { .. }
            | Node::PlainFillDir { .. } => {
                return Err(ViewError::IsDir);
            }
        }
        self.inodes.detach(&path);
        if MetaFile::from_name(name).is_some() {
            self.unconsolidate_above(&ppath);
        }
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> Result<()> {
        if self.only_fill(parent, name)? {
            return Ok(());
        }
        let (_, path, node) = self.existing_child(parent, name)?;
        container::refuse_writes(&[Some(&node)])?;
        let w = self.writer()?;
        match &node {
            Node::Dir { rel } => {
                match self.rmdir_plain(rel) {
                    Some(done) => done?,
                    None => self.store.remove_dir(rel)?,
                }
                w.raw.lock().remove(rel);
                w.zmetadata_left.lock().remove(rel);
            }
            Node::ArrayDir { array } if w.headless.lock().contains_key(&array.rel) => {
                let ino = self.inodes.intern(path.clone(), node.clone());
                let empty = self.readdir(ino).map(|e| e.is_empty());
                self.inodes.forget(ino, 1);
                if !empty? {
                    return Err(ViewError::NotEmpty);
                }
                self.flush_array(array)?;
                // What is left are emptied key directories (and shards of nothing).
                self.store.remove_tree(&array.rel)?;
                w.headless.lock().remove(&array.rel);
                self.arrays.remove(&array.rel);
                w.staging.discard(&array.rel);
                w.vdirs.lock().retain(|(a, _)| a != &array.rel);
            }
            Node::ArrayDir { array } => {
                self.flush_array(array)?;
                // Empty directories the view does not show (shard directories a shrink
                // emptied) go with it.
                self.remove_empty_dirs(&array.rel)?;
                self.store.remove_dir(&array.rel)?;
            }
            Node::KeyDir { array, coords } => {
                let array = self.current(array);
                self.flush_array(&array)?;
                let ino = self.inodes.intern(path.clone(), node.clone());
                let empty = self.readdir(ino).map(|e| e.is_empty());
                self.inodes.forget(ino, 1);
                if !empty? {
                    return Err(ViewError::NotEmpty);
                }
                {
                    let mut vdirs = w.vdirs.lock();
                    vdirs.retain(|(a, c)| !(a == &array.rel && c.starts_with(coords)));
                    // The parent stays until it is removed itself.
                    if let Some((_, parent)) = coords.split_last() {
                        vdirs.insert((array.rel.clone(), parent.to_vec()));
                    }
                }
                let store_dir = array.shard_dir_rel(&array.shard_prefix(coords));
                // The store directory goes only when no shard is left in it; so does the
                // one at the key directory's own path, where files of their own lay
                // (`super::kept`), once they were removed.
                for dir in [store_dir, path.clone()] {
                    self.remove_empty_dirs(&dir)?;
                    if self.store.list(&dir).is_ok_and(|d| d.is_empty()) {
                        self.store.remove_dir(&dir)?;
                    }
                }
            }
            _ => return Err(ViewError::NotDir),
        }
        self.inodes.detach(&path);
        self.unconsolidate_above(&path);
        Ok(())
    }

    /// The inode number this mount gave `name` in directory `parent`, if any.
    pub fn ino_at(&self, parent: u64, name: &OsStr) -> Option<u64> {
        let (path, _) = self.node(parent).ok()?;
        self.inodes.peek(&path.join(name))
    }

    /// Rename; `noreplace` fails if the target exists.
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        noreplace: bool,
    ) -> Result<Renamed> {
        refuse_internal(newname)?;
        let (ppath, pnode) = self.node(parent)?;
        let (npath, nnode) = self.node(newparent)?;
        let nnode = self.made_dir(newparent, nnode)?;
        let src = self
            .stored_child(&ppath, &pnode, name)?
            .ok_or(ViewError::NotFound)?;
        let (from, to) = (ppath.join(name), npath.join(newname));
        let target = self.stored_child(&npath, &nnode, newname)?;
        container::refuse_writes(&[Some(&src), Some(&nnode), target.as_ref()])?;
        if target.is_some() && noreplace {
            return Err(ViewError::Exists);
        }
        self.writer()?;
        if let (Some(Node::Consolidated { dir }), Node::File { rel }) = (&target, &src) {
            // zarr 2's `consolidate_metadata` (a temporary file renamed onto the name):
            // accepted and let go, as the view makes `.zmetadata` from the hierarchy.
            self.remove_store_file(rel)?;
            self.inodes
                .rename(&from, to, Node::Consolidated { dir: dir.clone() });
            return Ok(Renamed::Other);
        }
        let mut renamed = Renamed::Other;
        let node = match (&src, &nnode) {
            (Node::File { rel } | Node::Symlink { rel }, Node::Dir { rel: dst_dir }) => {
                let dst = self.new_child_rel(dst_dir, newname)?;
                self.only_whole_docs(&src, &dst)?;
                if let Some(w) = &self.writer {
                    w.docs.unlinked(&dst);
                }
                if super::pending_doc::is_doc(&dst) {
                    self.note_unsharded(&dst);
                }
                self.store.rename(rel, &dst)?;
                // The inode moves with its file before metadata lands: the refresh of
                // the directory that the landing makes finds it at its new name (at the
                // old one it would resolve to nothing, and be retired).
                let moved = match &src {
                    Node::Symlink { .. } => Node::Symlink { rel: dst.clone() },
                    _ => Node::File { rel: dst.clone() },
                };
                self.inodes.rename(&from, to.clone(), moved);
                if let Some(file) = MetaFile::from_name(newname) {
                    self.metadata_landed(dst_dir, file)?;
                }
                let node = self.resolve(&to)?.ok_or(ViewError::NotFound)?;
                self.inodes.update_path(&to, node);
                return Ok(Renamed::Other);
            }
            (Node::Dir { .. } | Node::ArrayDir { .. }, Node::Dir { rel: dst_dir }) => {
                let dst = self.new_child_rel(dst_dir, newname)?;
                return self.rename_dir(&src, &from, &to, &dst);
            }
            (
                Node::Dir { .. }
                | Node::ArrayDir { .. }
                | Node::KeyDir { .. }
                | Node::DraftGroup { .. }
                | Node::PlainFillDir { .. },
                _,
            ) => {
                return Err(ViewError::CrossDevice(
                    "renaming directories into arrays is not supported; copy instead".into(),
                ));
            }
            (Node::Scratch { path, .. }, _)
                if let Some(node) = self.move_scratch_to_chunk(path, &nnode, newname)? =>
            {
                renamed = Renamed::AsWritten;
                node
            }
            // A file of its own of the store renamed to another such name in an array's
            // directories: one rename in the store, never a copy held in memory meanwhile.
            (Node::File { rel }, Node::ArrayDir { array } | Node::KeyDir { array, .. })
                if matches!(
                    self.target(
                        array,
                        match &nnode {
                            Node::KeyDir { coords, .. } => Some(coords.as_slice()),
                            _ => None,
                        },
                        newname
                    )?,
                    Target::Scratch
                ) =>
            {
                if let Some(dir) = to.parent() {
                    self.make_store_dirs(dir)?;
                }
                // Whatever had the name in memory is replaced.
                self.writer()?.remove_scratch(&to);
                self.unkeep_file(&to)?;
                self.store.rename(rel, &to)?;
                Node::File { rel: to.clone() }
            }
            _ => {
                let data = self.content(&src)?;
                let node = self.put_at(&nnode, newname, &to, data)?;
                self.remove_source(&src, &node)?;
                node
            }
        };
        self.inodes.rename(&from, to, node);
        Ok(renamed)
    }

    /// Hard link: a copy at the new name (chunks have no inode of their own to share).
    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> Result<Attr> {
        let (_, src) = self.node(ino)?;
        let (npath, nnode) = self.node(newparent)?;
        let nnode = self.made_dir(newparent, nnode)?;
        let to = npath.join(newname);
        container::refuse_writes(&[Some(&src), Some(&nnode)])?;
        if self.stored_child(&npath, &nnode, newname)?.is_some() {
            return Err(ViewError::Exists);
        }
        let node = match (&src, &nnode) {
            (Node::File { rel }, Node::Dir { rel: dst_dir }) => {
                self.writer()?;
                let dst = self.new_child_rel(dst_dir, newname)?;
                self.only_whole_docs(&src, &dst)?;
                self.store.hard_link(rel, &dst)?;
                Node::File { rel: dst }
            }
            _ => {
                let data = self.content(&src)?;
                self.put_at(&nnode, newname, &to, data)?
            }
        };
        let ino = self.inodes.intern(to, node);
        self.getattr(ino)
    }

    pub(super) fn content(&self, node: &Node) -> Result<Vec<u8>> {
        match node {
            Node::File { rel } => Ok(self.store.read_all(rel)?.ok_or(ViewError::NotFound)?),
            Node::Scratch { path, .. } => Ok(self
                .writer()?
                .scratch(path)
                .ok_or(ViewError::NotFound)?
                .lock()
                .data
                .clone()),
            Node::Chunk { array, coords } => self.chunk_bytes(&self.current(array), coords),
            Node::ArrayMeta { array, file } => Ok(self.current(array).meta_bytes(*file).to_vec()),
            Node::GroupMeta { dir, file } => self.group_meta(dir, *file),
            _ => Err(ViewError::CrossDevice("not a regular file".into())),
        }
    }

    pub(super) fn put_at(
        &self,
        dir: &Node,
        name: &OsStr,
        path: &Path,
        data: Vec<u8>,
    ) -> Result<Node> {
        match dir {
            Node::Dir { rel } => {
                self.writer()?;
                let rel = self.new_child_rel(rel, name)?;
                if super::pending_doc::is_doc(&rel) && !super::pending_doc::whole_json(&data) {
                    return Err(not_whole(&rel));
                }
                if let Some(w) = &self.writer {
                    w.docs.unlinked(&rel);
                }
                if super::pending_doc::is_doc(&rel) {
                    self.note_unsharded(&rel);
                }
                self.store.write_atomically(&rel, &data)?;
                if let Some(file) = MetaFile::from_name(name) {
                    self.metadata_landed(rel.parent().unwrap_or(Path::new("")), file)?;
                    return self.resolve(path)?.ok_or(ViewError::NotFound);
                }
                Ok(Node::File { rel })
            }
            Node::ArrayDir { array } => self.put(array, None, name, path, data, None),
            Node::KeyDir { array, coords } => self.put(array, Some(coords), name, path, data, None),
            _ => Err(ViewError::NotDir),
        }
    }

    /// The name of scratch file `path` goes (unlink, or renamed away): open handles keep
    /// it, and a chunk being rewritten there is deleted too, so that the name does not
    /// show the stored chunk again. Its key directory stays until removed.
    fn unname_scratch(
        &self,
        path: &Path,
        array: &Arc<ShardedArray>,
        parent: Option<&[u64]>,
    ) -> Result<()> {
        let w = self.writer()?;
        w.remove_scratch(path);
        self.unkeep_file(path)?;
        let name = path.file_name().unwrap_or_default();
        if let Target::Chunk(coords) = self.target(array, parent, name)? {
            let array = self.current(array);
            self.commit_chunk(&array, coords.clone(), None)?;
            if let Some((_, parent)) = coords.split_last() {
                w.vdirs.lock().insert((array.rel.clone(), parent.to_vec()));
            }
        }
        Ok(())
    }

    pub(super) fn remove_source(&self, src: &Node, now_at_target: &Node) -> Result<()> {
        self.writer()?;
        match src {
            Node::Scratch {
                path,
                array,
                parent,
            } => {
                self.unname_scratch(path, array, parent.as_deref())?;
            }
            Node::Chunk { array, coords } => {
                let same = matches!(now_at_target, Node::Chunk { array: a, coords: c } if a.rel == array.rel && c == coords);
                if !same {
                    self.commit_chunk(&self.current(array), coords.clone(), None)?;
                    // Its key directory stays, as when the chunk is unlinked.
                    if let Some((_, parent)) = coords.split_last() {
                        self.writer()?
                            .vdirs
                            .lock()
                            .insert((array.rel.clone(), parent.to_vec()));
                    }
                }
            }
            Node::File { rel } => self.remove_store_file(rel)?,
            Node::ArrayMeta { .. } | Node::GroupMeta { .. } => {
                return Err(ViewError::CrossDevice("moving metadata away".into()));
            }
            _ => {}
        }
        Ok(())
    }
}

/// The refusal of a metadata document that is not whole where only whole ones may land.
fn not_whole(rel: &Path) -> ViewError {
    let why = format!(
        "{}: not a whole JSON document: refused (the store keeps the document it had)",
        rel.display()
    );
    log::warn!("{why}");
    ViewError::Invalid(why)
}

impl View {
    /// Remove a store file (or symlink); a metadata document being written there is let
    /// go, and one not stored yet has nothing in the store to remove.
    fn remove_store_file(&self, rel: &Path) -> Result<()> {
        let pending = self.writer.as_ref().is_some_and(|w| w.docs.unlinked(rel));
        if let (Some(w), Some(dir)) = (&self.writer, rel.parent())
            && super::pending_doc::is_doc(rel)
        {
            w.keep_unsharded.lock().remove(dir);
        }
        match self.store.remove_file(rel) {
            Err(e) if pending && e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            res => Ok(res?),
        }
    }

    /// A file renamed or linked onto a metadata document's name must be a whole one
    /// (`rsync`'s and zarr's temporary files are, once complete): a document cut short
    /// never reaches the store.
    fn only_whole_docs(&self, src: &Node, dst: &Path) -> Result<()> {
        if !super::pending_doc::is_doc(dst) {
            return Ok(());
        }
        let data = match src {
            Node::File { rel } => match self.pending_doc(rel) {
                Some(doc) => doc.bytes(),
                None => self.store.read_all(rel)?.unwrap_or_default(),
            },
            _ => Vec::new(),
        };
        if super::pending_doc::whole_json(&data) {
            Ok(())
        } else {
            Err(not_whole(dst))
        }
    }
}

impl View {
    /// The parent directory `parent` of a name being made, as it is now: an adoption
    /// that finished since the kernel looked it up may have made a store directory a
    /// key directory of a new array (the inode is updated too).
    fn fresh_parent(&self, parent: u64) -> Result<(PathBuf, Node)> {
        let (path, node) = self.node(parent)?;
        let node = self.made_dir(parent, node)?;
        if !matches!(node, Node::Dir { .. }) || self.writer.is_none() {
            return Ok((path, node));
        }
        // Only an array at or above it changes what it is (an in-memory look, no I/O:
        // a plain tree costs nothing here).
        if !path.ancestors().any(|a| self.arrays.get(a).is_some()) {
            return Ok((path, node));
        }
        match self.resolve(&path)? {
            Some(now) if now.kind() == node.kind() => {
                if !matches!(now, Node::Dir { .. }) {
                    self.inodes.update(parent, now.clone());
                }
                Ok((path, now))
            }
            _ => Ok((path, node)),
        }
    }
}

impl View {
    /// Whether `name` in `parent` is there only as the v2 view's fill value
    /// ([`View::is_fill`]): nothing is stored to remove, and it still reads as the fill
    /// value after an `unlink` or `rmdir`, which succeed (as a deleted chunk reads).
    fn only_fill(&self, parent: u64, name: &OsStr) -> Result<bool> {
        // A stale directory is its caller's to answer.
        let Ok((ppath, pnode)) = self.node(parent) else {
            return Ok(false);
        };
        let fill = match self.child(&ppath, &pnode, name) {
            Ok(Some(n)) => self.is_fill(&ppath.join(name), &n)?,
            _ => false,
        };
        if fill {
            self.writer()?;
        }
        Ok(fill)
    }

    /// Directory `node` (inode `ino`) as a name is made in it: a key directory where the
    /// v2 view serves the fill value ([`Node::PlainFillDir`]) is made in the store first.
    pub(super) fn made_dir(&self, ino: u64, node: Node) -> Result<Node> {
        let Node::PlainFillDir { rel, .. } = node else {
            return Ok(node);
        };
        self.make_plain_dirs(&rel)?;
        let now = Node::Dir { rel };
        self.inodes.update(ino, now.clone());
        Ok(now)
    }
}

/// Names shardfs keeps for its own files beside the shards cannot be made.
fn refuse_internal(name: &OsStr) -> Result<()> {
    if crate::store::is_internal(name) {
        return Err(ViewError::Invalid(format!(
            "{}: a name shardfs keeps for its own files",
            name.to_string_lossy()
        )));
    }
    Ok(())
}
