//! Moving names through the view: `rename` and `link` of files (a directory's rename
//! is `rename_dir.rs`), what a moved file holds, and how it lands at its new name.

use std::ffi::OsStr;
use std::path::Path;

use super::Overlay;
use super::node::Target;
use super::ops::{not_whole, refuse_internal};
use super::*;

impl View {
    /// The inode number this mount gave `name` in directory `parent`, if any.
    pub fn ino_at(&self, parent: u64, name: &OsStr) -> Option<u64> {
        let (path, _) = self.tree.node(parent).ok()?;
        self.tree.inodes.peek(&path.join(name))
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
        let set = self
            .tree
            .inodes
            .get(parent)
            .and_then(|(dir, _)| self.overlay_opt()?.set_times_shown(&dir.join(name)));
        // A file open for writing at the target (a chunk or metadata being written through
        // another descriptor) loses its name before anything lands there: its writes go on
        // to a file of no name, and no close of it commits over what the rename puts
        // there, as on a plain directory. Before, with `open_checks`, that close stored
        // the old descriptor's bytes at the name, and the rename was undone (tests/mount.rs
        // `with_open_checks_a_rename_onto_a_chunk_open_for_writing_replaces_it`).
        let to = (self.tree.inodes.get(newparent))
            .map(|(dir, _)| dir.join(newname))
            .filter(|to| {
                self.tree
                    .inodes
                    .get(parent)
                    .is_none_or(|(p, _)| p.join(name) != *to)
            });
        let replaced = match (&to, &self.writer) {
            (Some(to), Some(w)) if !noreplace => w.scratch.take_name(to),
            _ => None,
        };
        let renamed = self.rename_entry(parent, name, newparent, newname, noreplace);
        if let (Some(file), Some(to), Some(w)) = (replaced, &to, &self.writer) {
            match renamed {
                Ok(_) => w.scratch.name_taken(file),
                Err(_) => w.scratch.give_name_back(to, file),
            }
        }
        let renamed = renamed?;
        if let Some(o) = self.overlay_opt() {
            o.carry_set_times(set, parent, name, newparent, newname);
        }
        Ok(renamed)
    }

    fn rename_entry(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        noreplace: bool,
    ) -> Result<Renamed> {
        refuse_internal(newname)?;
        let (ppath, pnode) = self.tree.node(parent)?;
        let (npath, nnode) = self.tree.node(newparent)?;
        let o = self.overlay()?;
        let nnode = o.made_dir(newparent, nnode)?;
        let src = self
            .stored_child(&ppath, &pnode, name)?
            .ok_or(ViewError::NotFound)?;
        let (from, to) = (ppath.join(name), npath.join(newname));
        let target = self.stored_child(&npath, &nnode, newname)?;
        container::refuse_writes(&[Some(&src), Some(&nnode), target.as_ref()])?;
        o.refuse_rename(&src, target.as_ref(), &to, noreplace)?;
        if let (Some(Node::Consolidated { dir }), Node::File { rel }) = (&target, &src) {
            return o.rename_onto_consolidated(rel, dir, &from, to);
        }
        if let (None, Node::File { rel }, Node::Dir { rel: dir }) = (&target, &src, &nnode)
            && o.remakes_zmetadata(dir, newname)?
        {
            return o.rename_onto_consolidated(rel, dir, &from, to);
        }
        let mut renamed = Renamed::Other;
        // A file of an array open for writing (a daemon's handle: `open_checks`): its
        // descriptors follow it to the new name ([`View::follow_rename`]).
        let open_src = match &src {
            Node::Scratch { path, .. } => self.writer()?.scratch.open_file_at(path),
            _ => None,
        };
        let node = match (&src, &nnode) {
            (Node::File { rel } | Node::Symlink { rel }, Node::Dir { rel: dst_dir }) => {
                return o.rename_store_file(&src, rel, dst_dir, newname, &from, &to);
            }
            (Node::Dir { .. } | Node::ArrayDir { .. }, Node::Dir { rel: dst_dir }) => {
                let dst = o.new_child_rel(dst_dir, newname)?;
                return o.rename_dir(&src, &from, &to, &dst);
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
                if let Some(node) = o.move_scratch_to_chunk(path, &nnode, newname)? =>
            {
                renamed = Renamed::AsWritten;
                node
            }
            // A file of its own of the store renamed to another such name in an array's
            // directories.
            (Node::File { rel }, _) if o.names_own_file(&nnode, newname)? => {
                o.move_own_file(rel, &to)?
            }
            _ => self.copy_onto(src, &ppath, &pnode, name, &nnode, newname, &to)?,
        };
        let node = match open_src {
            Some(file) => self.follow_rename(file, &to, &nnode, node),
            None => node,
        };
        self.tree.inodes.rename(&from, to, node);
        Ok(renamed)
    }

    /// A rename as a copy: the source's bytes put at the new name, the source removed
    /// (a chunk, metadata, or a file moving into or out of an array's key namespace).
    #[allow(clippy::too_many_arguments)]
    fn copy_onto(
        &self,
        src: Node,
        ppath: &Path,
        pnode: &Node,
        name: &OsStr,
        nnode: &Node,
        newname: &OsStr,
        to: &Path,
    ) -> Result<Node> {
        let o = self.overlay()?;
        let (src, data) = match o.content(&src) {
            // A scratch file stored as a file of its own meanwhile (`kept.rs`: an
            // `fsync` of a directory, the idle timer): it is that file now. Before,
            // the rename failed with `ENOENT` (found by an adversarial tester).
            Err(ViewError::NotFound) if matches!(src, Node::Scratch { .. }) => {
                let now = self
                    .stored_child(ppath, pnode, name)?
                    .ok_or(ViewError::NotFound)?;
                let data = o.content(&now)?;
                (now, data)
            }
            data => (src, data?),
        };
        let node = o.put_at(nnode, newname, to, data)?;
        o.remove_source(&src, &node)?;
        Ok(node)
    }

    /// Hard link: a copy at the new name (chunks have no inode of their own to share).
    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> Result<Attr> {
        super::ops::refuse_internal(newname)?;
        let (_, src) = self.tree.node(ino)?;
        let (npath, nnode) = self.tree.node(newparent)?;
        let o = self.overlay()?;
        let nnode = o.made_dir(newparent, nnode)?;
        let to = npath.join(newname);
        container::refuse_writes(&[Some(&src), Some(&nnode)])?;
        if self.stored_child(&npath, &nnode, newname)?.is_some() {
            return Err(ViewError::Exists);
        }
        let node = match (&src, &nnode) {
            (Node::File { rel }, Node::Dir { rel: dst_dir }) => {
                self.writer()?;
                let dst = o.new_child_rel(dst_dir, newname)?;
                o.only_whole_docs(&src, &dst)?;
                self.tree.store.hard_link(rel, &dst)?;
                Node::File { rel: dst }
            }
            _ => {
                let data = o.content(&src)?;
                o.put_at(&nnode, newname, &to, data)?
            }
        };
        let ino = self.tree.inodes.intern(to, node);
        self.getattr(ino)
    }

    /// A file open for writing, renamed from an array's directories to `to` (in `dir`),
    /// where the rename put its bytes so far (`at_to`): its descriptors write on at the
    /// new name, as on any file system, and their close commits there. Before, with
    /// `open_checks`, what they wrote after the rename went to a file of no name, and
    /// their `fsync` and close returned 0 (found by an adversarial tester). The new node
    /// of the name.
    ///
    /// Only within arrays, onto a chunk key or a file of its own: renamed out of the
    /// arrays (a store file now) or onto metadata, the file keeps no name; a descriptor
    /// that writes to it after that gets `ESTALE` at its `fsync` and close, as what it
    /// wrote is stored nowhere.
    pub(super) fn follow_rename(
        &self,
        file: Arc<Mutex<super::scratch::Scratch>>,
        to: &Path,
        dir: &Node,
        at_to: Node,
    ) -> Node {
        let Some(w) = &self.writer else { return at_to };
        let (array, parent) = match (dir, &at_to) {
            (Node::ArrayDir { array }, Node::Chunk { .. } | Node::Scratch { .. }) => (array, None),
            (Node::KeyDir { array, coords }, Node::Chunk { .. } | Node::Scratch { .. }) => {
                (array, Some(coords.clone()))
            }
            _ => {
                let mut f = file.lock();
                // What it held is at the new name; what comes now is stored nowhere.
                f.dirty = false;
                f.renamed_away = true;
                return at_to;
            }
        };
        let node = Node::Scratch {
            path: to.to_path_buf(),
            array: self.tree.current(array),
            parent,
        };
        // The copy the rename made at the name (a file of its own): this file is it.
        w.scratch.lock().put_renamed(to, &file);
        self.open.handles.retarget(&file, &node);
        node
    }
}

impl Overlay<'_> {
    /// A store file (or symbolic link) renamed into the store directory `dst_dir`: one
    /// rename in the store; metadata landing there is taken in.
    fn rename_store_file(
        &self,
        src: &Node,
        rel: &Path,
        dst_dir: &Path,
        newname: &OsStr,
        from: &Path,
        to: &Path,
    ) -> Result<Renamed> {
        let dst = self.new_child_rel(dst_dir, newname)?;
        self.only_whole_docs(src, &dst)?;
        self.w.docs.unlinked(&dst);
        if super::pending_doc::is_doc(&dst) {
            self.note_unsharded(&dst);
        }
        self.tree.store.rename(rel, &dst)?;
        // The inode moves with its file before metadata lands: the refresh of
        // the directory that the landing makes finds it at its new name (at the
        // old one it would resolve to nothing, and be retired).
        let moved = match src {
            Node::Symlink { .. } => Node::Symlink { rel: dst.clone() },
            _ => Node::File { rel: dst.clone() },
        };
        self.tree.inodes.rename(from, to.to_path_buf(), moved);
        if let Some(file) = MetaFile::from_name(newname) {
            self.metadata_landed(dst_dir, file)?;
        }
        let node = self.resolve(to)?.ok_or(ViewError::NotFound)?;
        self.tree.inodes.update_path(to, node);
        Ok(Renamed::Other)
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
                let rel = self.new_child_rel(rel, name)?;
                if super::pending_doc::is_doc(&rel) && !super::pending_doc::whole_json(&data) {
                    return Err(not_whole(&rel));
                }
                self.w.docs.unlinked(&rel);
                if super::pending_doc::is_doc(&rel) {
                    self.note_unsharded(&rel);
                }
                self.tree.store.write_atomically(&rel, &data)?;
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
}

impl Overlay<'_> {
    /// Times set on a file through the mount go with it to its new name (a rename
    /// changes no file), shown while it is unchanged there. Before, they stayed with the
    /// old name, so `rsync -a` (times set on its temporary file, then renamed into
    /// place) lost every file's times, and copied every file again at its next run
    /// (found by an adversarial tester).
    fn carry_set_times(
        &self,
        set: Option<super::set_times::SetTimes>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
    ) {
        let w = self.w;
        let (Some((from, _)), Some((to, _))) = (
            self.tree.inodes.get(parent),
            self.tree.inodes.get(newparent),
        ) else {
            return;
        };
        let (from, to) = (from.join(name), to.join(newname));
        w.times.forget(&from);
        w.times.forget(&to);
        if let Some(set) = set {
            self.show_set_times(&to, set);
        }
    }
}

impl Overlay<'_> {
    /// The refusals of a rename of `src` onto `target` (at view path `to`) that come
    /// before anything changes.
    fn refuse_rename(
        &self,
        src: &Node,
        target: Option<&Node>,
        to: &Path,
        noreplace: bool,
    ) -> Result<()> {
        if target.is_some() && noreplace {
            return Err(ViewError::Exists);
        }
        if let Some(t @ (Node::Dir { .. } | Node::ArrayDir { .. })) = target
            && matches!(src, Node::Dir { .. } | Node::ArrayDir { .. })
        {
            if !self.shows_empty(to, t)? {
                // What the view shows in it counts, as on a plain directory (a
                // `.zmetadata` left by an unlinked `.zgroup` has no file in the store).
                return Err(ViewError::NotEmpty);
            }
            // Empty as shown: metadata kept at an unlink there (`store::UNLINKED_META`)
            // goes, as the directory does (before, the rename was `ENOTEMPTY`: found by
            // an adversarial tester).
            let rel = match t {
                Node::ArrayDir { array } => &array.rel,
                Node::Dir { rel } => rel,
                _ => unreachable!("matched above"),
            };
            super::unlinked::remove_unlinked_meta(self.tree.store.as_ref(), rel)?;
            self.w.unlinked.forget_headless(rel);
        }
        if matches!(src, Node::ArrayMeta { .. } | Node::GroupMeta { .. }) {
            // Refused before anything changed (`mv` then copies and unlinks): the copy
            // at the new name was once made first, and stayed, though the rename failed.
            return Err(ViewError::CrossDevice("moving metadata away".into()));
        }
        Ok(())
    }

    /// Whether the directory `node` at view path `path` lists nothing.
    pub(super) fn shows_empty(&self, path: &Path, node: &Node) -> Result<bool> {
        let ino = self.tree.inodes.intern(path.to_path_buf(), node.clone());
        let empty = self.readdir(ino).map(|e| e.is_empty());
        self.tree.inodes.forget(ino, 1);
        empty
    }
}

impl Overlay<'_> {
    /// zarr 2's `consolidate_metadata` (a temporary file `rel` renamed onto `.zmetadata`
    /// of `dir`): accepted and let go, as the view makes `.zmetadata` from the hierarchy.
    fn rename_onto_consolidated(
        &self,
        rel: &Path,
        dir: &Path,
        from: &Path,
        to: PathBuf,
    ) -> Result<Renamed> {
        self.remove_store_file(rel)?;
        self.tree.inodes.rename(
            from,
            to,
            Node::Consolidated {
                dir: dir.to_path_buf(),
            },
        );
        Ok(Renamed::Other)
    }

    /// Whether `name` in store directory `dir` is the v2 view's `.zmetadata` of a group
    /// whose `.zmetadata` was unlinked: made again now (the view's own again; what was
    /// written to it is let go), not a file of the store.
    pub(super) fn remakes_zmetadata(&self, dir: &Path, name: &OsStr) -> Result<bool> {
        let remade = self.tree.format == super::ViewFormat::V2
            && name == crate::format::v2::ZMETADATA
            && self.w.unlinked.zmetadata_hidden(dir)
            && self.tree.group_docs.stored(dir)?.is_some();
        if remade {
            self.w.unlinked.zmetadata_made(dir);
        }
        Ok(remade)
    }

    /// Whether `newname` in directory node `nnode` of an array names a file of its own
    /// (neither chunk nor metadata).
    fn names_own_file(&self, nnode: &Node, newname: &OsStr) -> Result<bool> {
        let (array, coords) = match nnode {
            Node::ArrayDir { array } => (array, None),
            Node::KeyDir { array, coords } => (array, Some(coords.as_slice())),
            _ => return Ok(false),
        };
        Ok(matches!(
            self.tree.target(array, coords, newname)?,
            Target::Scratch
        ))
    }

    /// A file of its own of the store renamed to another such name `to` in an array's
    /// directories: one rename in the store, never a copy held in memory meanwhile.
    fn move_own_file(&self, rel: &Path, to: &Path) -> Result<Node> {
        if let Some(dir) = to.parent() {
            self.tree.own.make_store_dirs(dir)?;
        }
        // Whatever had the name in memory is replaced.
        self.w.scratch.remove(to);
        self.unkeep_file(to)?;
        self.tree.store.rename(rel, to)?;
        Ok(Node::File {
            rel: to.to_path_buf(),
        })
    }

    pub(super) fn content(&self, node: &Node) -> Result<Vec<u8>> {
        match node {
            Node::File { rel } => Ok(self.tree.store.read_all(rel)?.ok_or(ViewError::NotFound)?),
            Node::Scratch { path, .. } => self.w.scratch.bytes_at(path).ok_or(ViewError::NotFound),
            Node::Chunk { array, coords } => self
                .tree_read()
                .chunk_bytes(&self.tree.current(array), coords),
            Node::ArrayMeta { array, file } => {
                Ok(self.tree.current(array).meta_bytes(*file).to_vec())
            }
            Node::GroupMeta { dir, file } => self.tree_read().group_meta(dir, *file),
            _ => Err(ViewError::CrossDevice("not a regular file".into())),
        }
    }

    /// The name of scratch file `path` goes (unlink, or renamed away): open handles keep
    /// it, and a chunk being rewritten there is deleted too, so that the name does not
    /// show the stored chunk again. Its key directory stays until removed.
    pub(super) fn unname_scratch(
        &self,
        path: &Path,
        array: &Arc<ShardedArray>,
        parent: Option<&[u64]>,
    ) -> Result<()> {
        let w = self.w;
        w.scratch.remove(path);
        self.unkeep_file(path)?;
        let name = path.file_name().unwrap_or_default();
        if let Target::Chunk(coords) = self.tree.target(array, parent, name)? {
            let array = self.tree.current(array);
            self.commit_chunk(&array, coords.clone(), None)?;
            w.vdirs.chunk_gone(&array.rel, &coords);
        }
        Ok(())
    }

    pub(super) fn remove_source(&self, src: &Node, now_at_target: &Node) -> Result<()> {
        match src {
            Node::Scratch {
                path,
                array,
                parent,
            } => {
                self.unname_scratch(path, array, parent.as_deref())?;
                // A file of its own that the metadata just put at the target stored on
                // the way (a new array's changed shape keeps its directory's files in
                // the store): its stored copy goes too. Before, it stayed, listed and in
                // the store, after a temporary renamed onto `zarr.json` (found by the
                // reference test).
                let name = path.file_name().unwrap_or_default();
                if matches!(
                    self.tree.target(array, parent.as_deref(), name),
                    Ok(Target::Scratch)
                ) && self
                    .tree
                    .store
                    .stat(path)?
                    .is_some_and(|m| m.kind == crate::store::EntryKind::File)
                {
                    self.remove_store_file(path)?;
                }
            }
            Node::Chunk { array, coords } => {
                let same = matches!(now_at_target, Node::Chunk { array: a, coords: c } if a.rel == array.rel && c == coords);
                if !same {
                    self.commit_chunk(&self.tree.current(array), coords.clone(), None)?;
                    // Its key directory stays, as when the chunk is unlinked.
                    self.w.vdirs.chunk_gone(&array.rel, coords);
                }
            }
            Node::File { rel } => self.remove_store_file(rel)?,
            // `rename` refuses these before it puts anything at the new name.
            Node::ArrayMeta { .. } | Node::GroupMeta { .. } => {
                return Err(ViewError::CrossDevice("moving metadata away".into()));
            }
            _ => {}
        }
        Ok(())
    }
}

impl Overlay<'_> {
    /// Remove a store file (or symlink); a metadata document being written there is let
    /// go, and one not stored yet has nothing in the store to remove.
    pub(super) fn remove_store_file(&self, rel: &Path) -> Result<()> {
        let pending = self.w.docs.unlinked(rel);
        if let Some(dir) = rel.parent()
            && super::pending_doc::is_doc(rel)
        {
            self.w.choices.take_keep_unsharded(dir);
        }
        match self.tree.store.remove_file(rel) {
            Err(e) if pending && e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            res => Ok(res?),
        }
    }
}

impl Overlay<'_> {
    /// A file renamed or linked onto a metadata document's name must be a whole one
    /// (`rsync`'s and zarr's temporary files are, once complete): a document cut short
    /// never reaches the store.
    fn only_whole_docs(&self, src: &Node, dst: &Path) -> Result<()> {
        if !super::pending_doc::is_doc(dst) {
            return Ok(());
        }
        let data = match src {
            Node::File { rel } => match self.w.docs.get(rel) {
                Some(doc) => doc.bytes(),
                None => self.tree.store.read_all(rel)?.unwrap_or_default(),
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
