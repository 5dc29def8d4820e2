//! The operations that make and change names through the view: create, write,
//! truncate, modes and times, mkdir (removing names is `remove.rs`, moving them
//! `rename.rs`). Inside arrays they work on scratch files and staged chunks (`write`);
//! elsewhere they pass through to the store.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::Overlay;
use super::Tree;
use super::{Attr, Handle, Node, Opened, Result, View, ViewError, container};
use crate::format::KeyPath;

use super::node::Target;
use crate::store::{OpenMode, StoreFileRw};

impl View {
    /// The parent's path, the child's path and the child's node; `NotFound` if absent.
    pub(super) fn existing_child(
        &self,
        parent: u64,
        name: &OsStr,
    ) -> Result<(PathBuf, PathBuf, Node)> {
        let (ppath, pnode) = self.tree.node(parent)?;
        let node = self
            .stored_child(&ppath, &pnode, name)?
            .ok_or(ViewError::NotFound)?;
        let path = ppath.join(name);
        Ok((ppath, path, node))
    }

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
        let o = self.overlay()?;
        let (ppath, pnode) = o.fresh_parent(parent)?;
        container::refuse_writes(&[Some(&pnode)])?;
        let path = ppath.join(name);
        let existing = match self.child(&ppath, &pnode, name)? {
            // Served where nothing is stored: `O_EXCL` makes the file (`tar x`, which
            // retries after an unlink, would otherwise never get it).
            Some(n) if exclusive && self.tree_read().is_fill(&path, &n)? => None,
            found => found,
        };
        if let Some(existing) = existing {
            if exclusive {
                return Err(ViewError::Exists);
            }
            let ino = self.tree.inodes.intern(path.clone(), existing.clone());
            let handle = o.open_for_write(ino, &path, &existing, truncate)?;
            return Ok((self.getattr(ino)?, self.add_handle(ino, handle, false)));
        }
        let (node, handle) = match &pnode {
            // A group's `.zmetadata` unlinked and made again (`tar -x`): the view's own
            // again, what is written to it let go.
            Node::Dir { rel } if o.remakes_zmetadata(rel, name)? => (
                Node::Consolidated { dir: rel.clone() },
                Handle::Discard(rel.clone()),
            ),
            Node::Dir { rel } => o.create_store_file(rel, name)?,
            Node::ArrayDir { array } | Node::KeyDir { array, .. } => {
                let parent = match &pnode {
                    Node::KeyDir { coords, .. } => Some(coords.clone()),
                    _ => None,
                };
                let (node, file) = o.create_scratch(&path, array, parent, name)?;
                let ino = self.tree.inodes.intern(path, node.clone());
                let handle = Handle::Scratch {
                    ino,
                    node,
                    file,
                    writes: true,
                };
                return Ok((self.getattr(ino)?, self.add_handle(ino, handle, false)));
            }
            _ => return Err(ViewError::NotDir),
        };
        let ino = self.tree.inodes.intern(path, node);
        Ok((self.getattr(ino)?, self.add_handle(ino, handle, false)))
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        match self.handle(fh)? {
            Handle::StoreRw(f, rel) => {
                f.write_all_at(data, offset)?;
                if self.open_policy().lands_metadata_at_write() {
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
                    w.scratch.reserve_growth(end as u64, (end - len) as u64)?;
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
                f.modified = std::time::SystemTime::now();
                self.open_policy().stamp_write(&mut f, w);
                let whole = self.open_policy().lands_metadata_at_write()
                    && self.tree.pending_meta(&node).is_some()
                    && super::pending_doc::whole_json(&f.data);
                drop(f);
                if whole {
                    // An array's metadata, with kernel opens: committed at the write that
                    // makes it a whole document (as `View::land_at_write` takes in store
                    // files), so the writer's next step (chunks of a grown grid) finds
                    // it applied; a refusal is this write's error.
                    self.open.handles.mark_landed(fh);
                    self.overlay()?.commit_scratch(&node, &file)?;
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
        let (_, node) = self.tree.node(ino)?;
        container::refuse_writes(&[Some(&node)])?;
        // Only the store's files and directories have a mode and owner of their own.
        if matches!(
            node,
            Node::File { .. } | Node::Dir { .. } | Node::ArrayDir { .. }
        ) {
            self.overlay()?.set_mode_owner(&node, mode, uid, gid)?;
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
        self.writer()?;
        let (path, node) = self.tree.node(ino)?;
        container::refuse_writes(&[Some(&node)])?;
        // What was written before (with the kernel opening files, gathered and committed
        // a moment later) is committed first, as its close would have: the commit then
        // changes nothing the times were set on. Before, it gave the file a new mtime,
        // and the times `cp -p` and `rsync -a` set went with it (found by an adversarial
        // tester).
        if self.open_policy().gathers_writes() && self.open.implicit.fh(ino).is_some() {
            self.commit_earlier_writer(ino);
        }
        let now = self.getattr(ino)?;
        let set = super::set_times::SetTimes {
            base: now.mtime,
            atime: atime.unwrap_or(now.atime),
            mtime: mtime.unwrap_or(now.mtime),
        };
        self.overlay()?.set_times(ino, &path, &node, set);
        self.getattr(ino)
    }

    pub fn set_size(&self, ino: u64, size: u64) -> Result<Attr> {
        let (path, node) = self.tree.node(ino)?;
        self.names_its_file(ino, &path, &node)?;
        self.overlay()?.truncate(ino, &path, &node, size)?;
        self.getattr(ino)
    }

    pub fn mkdir(&self, parent: u64, name: &OsStr) -> Result<Attr> {
        refuse_internal(name)?;
        let ino = self.overlay()?.make_dir(parent, name)?;
        self.getattr(ino)
    }
}

impl Overlay<'_> {
    /// Times `set` through the mount on the file `node` (inode `ino`, at `path`), shown
    /// against its own mtime (`set.base` where it has none).
    fn set_times(&self, ino: u64, path: &Path, node: &Node, set: super::set_times::SetTimes) {
        let base = self.own_mtime(ino, node).unwrap_or(set.base);
        self.w
            .times
            .set(path, super::set_times::SetTimes { base, ..set });
    }

    /// `chmod`/`chown` of a store file or directory (`node`), or of an array's directory.
    fn set_mode_owner(
        &self,
        node: &Node,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<()> {
        let rel = match node {
            Node::File { rel } | Node::Dir { rel } => rel,
            Node::ArrayDir { array } => &array.rel,
            _ => return Ok(()),
        };
        match self.w.docs.get(rel) {
            Some(doc) => doc.set_mode_owner(mode, uid, gid)?,
            None => self.tree.store.set_mode_owner(rel, mode, uid, gid)?,
        }
        if let Node::ArrayDir { array } = node {
            // The array's directory attributes are kept with the array.
            self.reload_array(&array.rel)?;
        }
        Ok(())
    }

    /// `mkdir` of `name` in directory `parent`: a store directory, or a key directory
    /// of an array (shown until a chunk is written below it). Returns its inode.
    fn make_dir(&self, parent: u64, name: &OsStr) -> Result<u64> {
        let _making = self.w.tree.read();
        let (ppath, pnode) = self.fresh_parent(parent)?;
        container::refuse_writes(&[Some(&pnode)])?;
        if self.stored_child(&ppath, &pnode, name)?.is_some() {
            return Err(ViewError::Exists);
        }
        let node = match &pnode {
            Node::Dir { rel } => {
                let rel = self.new_child_rel(rel, name)?;
                self.tree.store.create_dir(&rel)?;
                let meta = self.tree.stat_rel(&rel)?;
                self.classify_dir(rel, meta)?
            }
            Node::ArrayDir { array } | Node::KeyDir { array, .. } => {
                let array = self.tree.current(array);
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
                        self.w.vdirs.made(&array.rel, coords.clone());
                        Node::KeyDir { array, coords }
                    }
                    // A name outside the key namespace of the array's own directory: a
                    // store directory, as any other file there passes through (a store
                    // nested in an array's directory, as zarr-python's tests make).
                    None if prefix.is_none()
                        && !array.draft
                        && !self.tree.hidden_in_array(&array, name) =>
                    {
                        let rel = array.rel.join(name);
                        self.tree.store.create_dir(&rel)?;
                        let meta = self.tree.stat_rel(&rel)?;
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
        Ok(self.tree.inodes.intern(ppath.join(name), node))
    }

    /// Resize the scratch file `file` to `size` bytes, its room in the write buffer
    /// taken or given back.
    pub(super) fn resize_scratch(
        &self,
        file: &parking_lot::Mutex<super::scratch::Scratch>,
        size: usize,
    ) -> Result<()> {
        let w = self.w;
        let mut f = file.lock();
        if size > f.data.len() {
            w.scratch
                .reserve_growth(size as u64, (size - f.data.len()) as u64)?;
        } else {
            w.scratch.unreserve((f.data.len() - size) as u64);
        }
        f.data.resize(size, 0);
        f.dirty = true;
        f.modified = std::time::SystemTime::now();
        self.policy.stamp_write(&mut f, w);
        Ok(())
    }
}

impl Overlay<'_> {
    /// `create` of a store file `name` in store directory `dir`.
    fn create_store_file(&self, dir: &Path, name: &OsStr) -> Result<(Node, Handle)> {
        let rel = self.new_child_rel(dir, name)?;
        // A metadata document is stored once whole, not made empty now.
        let f: Box<dyn crate::store::StoreFileRw> = if super::pending_doc::is_doc(&rel) {
            Box::new(self.w.docs.open(&self.tree.store, &rel, true, true)?)
        } else {
            self.tree.store.open_rw(&rel, OpenMode::CreateNew, false)?
        };
        Ok((
            Node::File { rel: rel.clone() },
            Handle::StoreRw(std::sync::Arc::from(f), rel),
        ))
    }

    /// `create` of `name` (view path `path`) in a directory of `array` (the key
    /// directory of coordinates `parent`, or the array's own): a new scratch file.
    fn create_scratch(
        &self,
        path: &Path,
        array: &std::sync::Arc<super::ShardedArray>,
        parent: Option<Vec<u64>>,
        name: &OsStr,
    ) -> Result<(
        Node,
        std::sync::Arc<parking_lot::Mutex<super::scratch::Scratch>>,
    )> {
        let array = self.tree.current(array);
        self.writable(&array)?;
        // A file at a chunk key outside the grid (or at a key directory's name) could
        // never be committed: its bytes would be dropped at unmount.
        if let Target::Invalid(why) = self.tree.target(&array, parent.as_deref(), name)? {
            log::warn!("{}: refused: {why}", path.display());
            return Err(ViewError::Invalid(why));
        }
        let file = self.w.scratch.create(path, Vec::new(), true, 1)?;
        let node = Node::Scratch {
            path: path.to_path_buf(),
            array,
            parent,
        };
        Ok((node, file))
    }
}

impl Tree {
    /// Whether `name` in directory `pnode` is a chunk key of an array (inside its grid
    /// or not).
    pub(super) fn is_chunk_key(&self, pnode: &Node, name: &OsStr) -> bool {
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
}

impl Overlay<'_> {
    /// The parent directory `parent` of a name being made, as it is now: an adoption
    /// that finished since the kernel looked it up may have made a store directory a
    /// key directory of a new array (the inode is updated too).
    fn fresh_parent(&self, parent: u64) -> Result<(PathBuf, Node)> {
        let (path, node) = self.tree.node(parent)?;
        let node = self.made_dir(parent, node)?;
        if !matches!(node, Node::Dir { .. }) {
            return Ok((path, node));
        }
        // Only an array at or above it changes what it is (an in-memory look, no I/O:
        // a plain tree costs nothing here).
        if !path.ancestors().any(|a| self.tree.arrays.get(a).is_some()) {
            return Ok((path, node));
        }
        match self.resolve(&path)? {
            Some(now) if now.kind() == node.kind() => {
                if !matches!(now, Node::Dir { .. }) {
                    self.tree.inodes.update(parent, now.clone());
                }
                Ok((path, now))
            }
            _ => Ok((path, node)),
        }
    }
}

impl View {
    /// Whether `name` in `parent` is there only as the v2 view's fill value
    /// ([`super::TreeRead::is_fill`]): nothing is stored to remove, and it still reads as the fill
    /// value after an `unlink` or `rmdir`, which succeed (as a deleted chunk reads).
    pub(super) fn only_fill(&self, parent: u64, name: &OsStr) -> Result<bool> {
        // A stale directory is its caller's to answer.
        let Ok((ppath, pnode)) = self.tree.node(parent) else {
            return Ok(false);
        };
        let fill = match self.child(&ppath, &pnode, name) {
            Ok(Some(n)) => self.tree_read().is_fill(&ppath.join(name), &n)?,
            _ => false,
        };
        if fill {
            self.writer()?;
        }
        Ok(fill)
    }
}

impl Overlay<'_> {
    /// Directory `node` (inode `ino`) as a name is made in it: a key directory where the
    /// v2 view serves the fill value ([`Node::PlainFillDir`]) is made in the store first.
    pub(super) fn made_dir(&self, ino: u64, node: Node) -> Result<Node> {
        let Node::PlainFillDir { rel, .. } = node else {
            return Ok(node);
        };
        self.make_plain_dirs(&rel)?;
        let now = Node::Dir { rel };
        self.tree.inodes.update(ino, now.clone());
        Ok(now)
    }
}

/// Names shardfs keeps for its own files beside the shards cannot be made.
pub(super) fn refuse_internal(name: &OsStr) -> Result<()> {
    if crate::store::is_internal(name) {
        return Err(ViewError::Invalid(format!(
            "{}: a name shardfs keeps for its own files",
            name.to_string_lossy()
        )));
    }
    Ok(())
}

/// The refusal of a metadata document that is not whole where only whole ones may land.
pub(super) fn not_whole(rel: &Path) -> ViewError {
    let why = format!(
        "{}: not a whole JSON document: refused (the store keeps the document it had)",
        rel.display()
    );
    log::warn!("{why}");
    ViewError::Invalid(why)
}

impl Overlay<'_> {
    /// `truncate` of the file `ino` at `path` (node `node`) to `size` bytes.
    fn truncate(&self, ino: u64, path: &Path, node: &Node, size: u64) -> Result<()> {
        let w = self.w;
        match node {
            Node::Stats | Node::Container(_) => return Err(ViewError::ReadOnly),
            // Accepted and let go: the view makes `.zmetadata` from the hierarchy.
            Node::Consolidated { .. } => {}
            Node::PlainFill { .. } => {
                // Made in the store first, then truncated as the file it now is.
                if let Handle::StoreRw(f, _) = self.open_for_write(ino, path, node, false)? {
                    f.set_len(size)?;
                }
            }
            Node::File { rel } if super::pending_doc::is_doc(rel) => {
                // A metadata document: truncated as a whole document or refused, checked
                // while this handle still holds it (the last one lets it go).
                self.note_unsharded(rel);
                let f = w.docs.open(&self.tree.store, rel, false, false)?;
                f.set_len(size)?;
                if !f.whole() {
                    return Err(not_whole(rel));
                }
            }
            Node::File { rel } => self.open_store_file(rel, false)?.set_len(size)?,
            Node::Scratch { path, .. } => {
                let size = usize::try_from(size).map_err(|_| ViewError::TooBig(u64::MAX))?;
                // Under the table's lock: a file of its own stored meanwhile (`kept.rs`)
                // is truncated as the stored file it is now (before, the truncate went
                // to the copy let go, and was lost).
                let table = w.scratch.lock();
                let Some(file) = table.get(path) else {
                    drop(table);
                    // Settled meanwhile (committed, or stored as a file of its own).
                    return match self.tree.node(ino)? {
                        (_, Node::Scratch { .. }) => Err(ViewError::NotFound),
                        (now_path, now) => self.truncate(ino, &now_path, &now, size as u64),
                    };
                };
                self.resize_scratch(&file, size)?;
            }
            Node::Chunk { array, coords } => {
                let array = self.tree.current(array);
                self.writable(&array)?;
                // Never more than a file may hold while staged (`truncate -s 1T` of a
                // chunk must not try to allocate a terabyte).
                if size > w.scratch.limit() {
                    return Err(ViewError::TooBig(w.scratch.limit()));
                }
                let mut data = self.tree_read().chunk_bytes(&array, coords)?;
                data.resize(size as usize, 0);
                self.commit_chunk(&array, coords.clone(), Some(data))?;
            }
            Node::ArrayMeta { .. } => {
                if size > w.scratch.limit() {
                    return Err(ViewError::TooBig(w.scratch.limit()));
                }
                let h = self.open_for_write(ino, path, node, false)?;
                if let Handle::Scratch { file, node, .. } = h {
                    file.lock().data.resize(size as usize, 0);
                    file.lock().dirty = true;
                    self.release_scratch(ino, &node, &file)?;
                }
            }
            Node::GroupMeta { .. } => {
                // Now a store file, taken in when a handle of it closes.
                if let Handle::StoreRw(f, _) = self.open_for_write(ino, path, node, false)? {
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
        Ok(())
    }
}
