//! Removing names through the view: `unlink` and `rmdir` (inside arrays: chunks,
//! metadata and key directories; elsewhere passed through to the store).

use std::ffi::OsStr;

use super::Overlay;
use super::*;

impl View {
    pub fn unlink(&self, dir: u64, name: &OsStr) -> Result<()> {
        let parent = dir;
        if self.only_fill(parent, name)? {
            return Ok(());
        }
        let (ppath, path, node) = match self.existing_child(parent, name) {
            Err(e @ (ViewError::NotFound | ViewError::StaleInode(_))) => {
                let Some(stale) = self.overlay()?.chunk_deleted_here(parent, name) else {
                    return Err(e);
                };
                // Deleting what is not there is done; the stale entry goes.
                self.writer()?;
                self.tree.inodes.detach(&stale);
                return Ok(());
            }
            other => other?,
        };
        // A write of an array's metadata not yet taken in (cut short) goes, and so does
        // the metadata under it, as the unlink says.
        if self
            .overlay()?
            .unlink_node(dir, name, &ppath, &path, &node)?
        {
            return self.unlink(dir, name);
        }
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> Result<()> {
        if self.only_fill(parent, name)? {
            return Ok(());
        }
        let (_, path, node) = self.existing_child(parent, name)?;
        container::refuse_writes(&[Some(&node)])?;
        self.overlay()?.remove_dir(&path, &node)
    }
}

impl Overlay<'_> {
    /// `unlink` of `node`, the entry `name` (at view path `path`) of directory `dir`
    /// (at `ppath`). `true`: a write of an array's metadata cut short went, and the name
    /// now shows the metadata under it, to be unlinked too.
    fn unlink_node(
        &self,
        dir: u64,
        name: &OsStr,
        ppath: &Path,
        path: &Path,
        node: &Node,
    ) -> Result<bool> {
        let w = self.w;
        match node {
            Node::Stats | Node::Container(_) => return Err(ViewError::ReadOnly),
            // Left to `only_fill` above.
            Node::PlainFill { .. } => return Ok(false),
            // Made from the hierarchy, never stored: not shown until made again.
            Node::Consolidated { dir } => {
                w.unlinked.forget_zmetadata(dir);
                w.unlinked.zmetadata_unlinked(dir);
            }
            Node::Scratch {
                path,
                array,
                parent,
            } => {
                let metadata = self.tree.pending_meta(node).is_some();
                self.unname_scratch(path, array, parent.as_deref())?;
                if metadata {
                    return Ok(true);
                }
            }
            Node::Chunk { array, coords } => {
                let array = self.tree.current(array);
                self.writable(&array)?;
                self.commit_chunk(&array, coords.clone(), None)?;
                // The key directory stays, empty, until it is removed itself (as on
                // any file system: `rm -rf` removes a directory after its last file).
                w.vdirs.chunk_gone(&array.rel, coords);
            }
            Node::ArrayMeta { array, file } => {
                self.unlink_array_meta(array, *file, ppath, path)?;
                return Ok(false);
            }
            Node::GroupMeta { dir, file } => {
                self.unlink_group_meta(dir, *file)?;
                return Ok(false);
            }
            Node::File { rel } | Node::Symlink { rel } => {
                self.remove_store_file(rel)?;
                // A key directory that held it stays, as any directory does when a file
                // in it goes (it may have nothing else below it now).
                if let Ok((_, Node::KeyDir { array, coords })) = self.tree.node(dir) {
                    w.vdirs.made(&array.rel, coords);
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
        self.tree.inodes.detach(path);
        if MetaFile::from_name(name).is_some() {
            self.unconsolidate_above(ppath);
        }
        Ok(false)
    }

    /// `rmdir` of the directory `node` at view path `path`.
    fn remove_dir(&self, path: &Path, node: &Node) -> Result<()> {
        let w = self.w;
        match node {
            Node::Dir { rel } => self.rmdir_store_dir(rel)?,
            Node::ArrayDir { array } if w.unlinked.is_headless(&array.rel) => {
                if !self.shows_empty(path, node)? {
                    return Err(ViewError::NotEmpty);
                }
                self.flush_array(array)?;
                // What is left are emptied key directories (and shards of nothing).
                crate::store::remove_tree(&*self.tree.store, &array.rel)?;
                w.unlinked.forget_headless(&array.rel);
                w.unlinked.zattrs_shown(&array.rel);
                w.unlinked.forget_zmetadata(&array.rel);
                self.tree.arrays.remove(&array.rel);
                w.staging.discard(&array.rel);
                w.vdirs.forget_array(&array.rel);
            }
            Node::ArrayDir { array } => {
                self.flush_array(array)?;
                // Empty directories the view does not show (shard directories a shrink
                // emptied) go with it.
                self.tree.own.remove_empty_dirs(&array.rel)?;
                self.tree.store.remove_dir(&array.rel)?;
            }
            Node::KeyDir { array, coords } => self.rmdir_key_dir(path, node, array, coords)?,
            _ => return Err(ViewError::NotDir),
        }
        self.tree.inodes.detach(path);
        self.unconsolidate_above(path);
        Ok(())
    }

    /// `unlink` of an array's metadata file `file` (at `path`, in `ppath`).
    fn unlink_array_meta(
        &self,
        array: &Arc<ShardedArray>,
        file: MetaFile,
        ppath: &Path,
        path: &Path,
    ) -> Result<()> {
        let w = self.w;
        match file {
            MetaFile::Zattrs => {
                if self.hold_headless_attrs(array, None)?.is_none() {
                    self.update_array_meta(array, MetaFile::Zattrs, b"{}")?;
                    w.unlinked.zattrs_unlinked(&array.rel);
                }
                self.tree.inodes.detach(path);
                Ok(())
            }
            MetaFile::Zarray | MetaFile::ZarrJson => {
                // zarr 2 removes an array recursively from a listing taken first, where
                // `.zarray` comes before `.zattrs` and the chunks: the metadata leaves
                // the store now, the other names stay until each is removed, and the
                // directory goes with `rmdir`. So in the v3 view, as on a plain
                // directory: the chunk files stay, and the array's metadata written
                // again takes them back (`tar -x` and `git checkout` unlink a file and
                // make it anew). Before, the directory then showed the shard files at
                // their keys, and a `zarr.json` written back made them the chunks of a
                // new array: chunks lost, shards stored as chunks (found by an
                // adversarial tester). What this mount's descriptors wrote a moment ago
                // is committed first, so that it is stored with the array.
                self.gathered.commit_settled()?;
                let array = self.tree.current(array);
                self.flush_array(&array)?;
                // Kept under a hidden name, not removed: a later mount shows the array as
                // this one does, and the metadata written back there takes the shards
                // back. Before, a later mount showed the shard files, and the same
                // metadata written back took them in as the chunks of a new array (found
                // by an adversarial tester).
                let kept = array.rel.join(crate::store::UNLINKED_META);
                self.tree.store.rename(&array.meta_rel, &kept)?;
                w.unlinked.make_headless(&array, file);
                self.tree.inodes.detach(path);
                Ok(())
            }
            _ => {
                // The array stops being one: make its chunks durable, then remove the
                // metadata; the directory then shows the store as it is.
                let array = self.tree.current(array);
                self.flush_array(&array)?;
                self.tree.store.remove_file(&array.meta_rel)?;
                self.tree.arrays.remove(&array.rel);
                w.staging.discard(&array.rel);
                w.vdirs.forget_array(&array.rel);
                self.tree.inodes.update_path(
                    ppath,
                    Node::Dir {
                        rel: array.rel.clone(),
                    },
                );
                self.tree.inodes.detach(path);
                self.refresh_subtree(&array.rel);
                Ok(())
            }
        }
    }
}

impl Overlay<'_> {
    /// The kernel still knows the name `name` in `parent` (an unlink comes without a
    /// lookup when the dentry is cached) but the chunk is gone: deleted by the mount
    /// itself just now (a shape shrink, which retires the inodes of chunks and key
    /// directories outside the new grid), its invalidation still on the way. Its path,
    /// then. Not one the v2 view serves as the fill value: that one is not stored, and
    /// was not deleted.
    fn chunk_deleted_here(&self, parent: u64, name: &OsStr) -> Option<PathBuf> {
        let (ppath, pnode) = self.tree.inodes.get_any(parent)?;
        let path = ppath.join(name);
        (self.tree.is_chunk_key(&pnode, name)
            && self.tree.inodes.known(&path)
            && matches!(self.child(&ppath, &pnode, name), Ok(None)))
        .then_some(path)
    }

    /// `rmdir` of key directory `coords` of `array` (at view path `path`).
    fn rmdir_key_dir(
        &self,
        path: &Path,
        node: &Node,
        array: &Arc<ShardedArray>,
        coords: &[u64],
    ) -> Result<()> {
        let array = self.tree.current(array);
        self.flush_array(&array)?;
        if !self.shows_empty(path, node)? {
            return Err(ViewError::NotEmpty);
        }
        // The parent stays until it is removed itself.
        self.w.vdirs.removed(&array.rel, coords);
        let store_dir = array.shard_dir_rel(&array.shard_prefix(coords));
        self.remove_emptied_shards(&array, &store_dir)?;
        // The store directory goes only when no shard is left in it; so does the one at
        // the key directory's own path, where files of their own lay (`super::kept`), once
        // they were removed.
        for dir in [store_dir, path.to_path_buf()] {
            self.tree.own.remove_empty_dirs(&dir)?;
            if self.tree.store.list(&dir).is_ok_and(|d| d.is_empty()) {
                self.tree.store.remove_dir(&dir)?;
            }
        }
        Ok(())
    }
}

impl Overlay<'_> {
    /// Shards in store directory `dir` (and below) that hold no chunk, removed with the
    /// key directory being removed. Object storage keeps an emptied shard (its deletion
    /// times order other mounts' later commits of its chunks); a removed directory wants
    /// nothing left. Before, `rm -rf` of a sharded array on S3 left them, shown as plain
    /// files once `zarr.json` was gone, and its last `rmdir` was `ENOTEMPTY` (found by
    /// the reference test). A local store has none: it removes an emptied shard's file.
    fn remove_emptied_shards(&self, array: &ShardedArray, dir: &std::path::Path) -> Result<()> {
        let Ok(entries) = self.tree.store.list(dir) else {
            return Ok(());
        };
        for e in entries {
            if crate::store::is_internal(&e.name) {
                continue;
            }
            let rel = dir.join(&e.name);
            match e.kind {
                crate::store::EntryKind::Dir => self.remove_emptied_shards(array, &rel)?,
                crate::store::EntryKind::File => {
                    let shard =
                        self.tree
                            .shards
                            .get(self.tree.store.as_ref(), &rel, &array.layout, true);
                    if shard.exists() && shard.index().is_ok_and(|i| i.stored() == 0) {
                        self.tree.store.remove_file(&rel)?;
                        self.tree.shards.invalidate(&rel);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `rmdir` of a store directory (no array's).
    fn rmdir_store_dir(&self, rel: &Path) -> Result<()> {
        let w = self.w;
        if w.unlinked.zmetadata_left(rel)
            || (self.tree.format == ViewFormat::V2 && self.tree_read().has_zmetadata(rel)?)
            || (!self.tree_read().zattrs_hidden(rel) && self.tree.group_docs.kept_zattrs(rel)?)
        {
            // It shows the `.zmetadata` or `.zattrs` its `.zgroup` left, as a plain
            // directory would hold them (`rm -rf` unlinks them first).
            return Err(ViewError::NotEmpty);
        }
        match self.rmdir_plain(rel) {
            Some(done) => done?,
            None => {
                // A document kept at an unlink that reads as no array's goes with its
                // directory, which shows nothing else.
                let kept = rel.join(crate::store::UNLINKED_META);
                if self.tree.store.stat(&kept)?.is_some() && self.tree.store.list(rel)?.len() == 1 {
                    self.tree.store.remove_file(&kept)?;
                }
                self.tree.store.remove_dir(rel)?
            }
        }
        w.choices.forget_as_stored(rel);
        w.unlinked.forget_zmetadata(rel);
        w.unlinked.zmetadata_made(rel);
        w.unlinked.zattrs_shown(rel);
        Ok(())
    }
}
