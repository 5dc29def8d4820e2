//! Metadata writes to sharded arrays: `zarr.json` (or v2 `.zarray`/`.zattrs`) written
//! through the view may change attributes, shape and dimension names; a change that the
//! store's sharding cannot take (data type, codecs, chunk shape ...) is refused
//! (`EINVAL`); and the tree is re-read where an array's kind changed.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::Overlay;
use super::{MetaFile, Node, Result, ShardedArray, ViewError};
use crate::format;

/// Members of an array's `zarr.json` that a write through the view may not change.
const PROTECTED: [&str; 7] = [
    "zarr_format",
    "node_type",
    "data_type",
    "chunk_grid",
    "chunk_key_encoding",
    "codecs",
    "fill_value",
];

impl Overlay<'_> {
    /// One of an array's metadata files, as a writer of the view wrote it.
    pub(super) fn update_array_meta(
        &self,
        array: &Arc<ShardedArray>,
        file: MetaFile,
        bytes: &[u8],
    ) -> Result<Arc<ShardedArray>> {
        use crate::format::v2;
        let array = self.tree.current(array);
        let invalid = |why: String| {
            log::warn!("{}/{}: refused: {why}", array.rel.display(), file.name());
            ViewError::Invalid(why)
        };
        let Value::Object(mut doc) =
            serde_json::from_slice(&array.json).map_err(|e| invalid(e.to_string()))?
        else {
            return Err(invalid("metadata is not an object".into()));
        };
        match file {
            MetaFile::ZarrJson | MetaFile::Zgroup => return self.update_metadata(&array, bytes),
            MetaFile::Zarray => {
                let shown = array.meta_bytes(MetaFile::Zarray);
                if !v2::same_but_shape(&shown, bytes).map_err(invalid)? {
                    return Err(invalid(
                        "only the shape of an array may change through .zarray".into(),
                    ));
                }
                doc.insert(
                    "shape".into(),
                    v2::zarray_shape(bytes).map_err(invalid)?.into(),
                );
            }
            MetaFile::Zattrs => {
                let name = array.rel.file_name().unwrap_or_default().to_string_lossy();
                v2::apply_zattrs(&mut doc, bytes, Some(array.layout.ndim()), &name)
                    .map_err(invalid)?
            }
        }
        let bytes = serde_json::to_vec(&Value::Object(doc)).map_err(|e| invalid(e.to_string()))?;
        self.update_metadata(&array, &bytes)
    }

    /// A new `zarr.json` for a sharded array, as a reader of the view wrote it.
    pub(super) fn update_metadata(
        &self,
        array: &Arc<ShardedArray>,
        bytes: &[u8],
    ) -> Result<Arc<ShardedArray>> {
        let array = self.tree.current(array);
        let invalid = |why: String| {
            log::warn!("{}/zarr.json: refused: {why}", array.rel.display());
            ViewError::Invalid(why)
        };
        let new: Value =
            serde_json::from_slice(bytes).map_err(|e| invalid(format!("not JSON: {e}")))?;
        let Value::Object(new) = new else {
            return Err(invalid("not a JSON object".into()));
        };
        let shown: Value =
            serde_json::from_slice(&array.json).map_err(|e| invalid(e.to_string()))?;
        for key in PROTECTED {
            if new.get(key) != shown.get(key) {
                return Err(invalid(format!(
                    "changing {key} of a sharded array is not supported (only attributes, shape, dimension names)"
                )));
            }
        }
        let mut doc = array.meta.doc.clone();
        doc.retain(|k, _| PROTECTED.contains(&k.as_str()) || new.contains_key(k));
        for (k, v) in new {
            if !PROTECTED.contains(&k.as_str()) {
                doc.insert(k, v);
            }
        }
        let mut out =
            serde_json::to_vec_pretty(&Value::Object(doc)).map_err(|e| invalid(e.to_string()))?;
        out.push(b'\n');
        if let Ok(format::Node::Array(new)) = format::metadata::parse(&out)
            && let format::Presentation::Sharded(layout) = &new.presentation
            && let Err(e) = crate::write::flush::storable(layout)
        {
            return Err(invalid(format!("its chunks could never be stored: {e}")));
        }
        if let Ok(format::Node::Array(new)) = format::metadata::parse(&out)
            && let format::Presentation::Sharded(layout) = &new.presentation
        {
            self.delete_outside(&array, layout.chunk_counts())?;
        }
        self.flush_array(&array)?;
        self.tree.store.write_atomically(&array.meta_rel, &out)?;
        self.unconsolidate_above(&array.rel);
        self.reload_array(&array.rel)
    }

    /// A shrink: the chunks that `array` stores outside a grid of `counts` chunks are
    /// deleted with the metadata change (as zarr-python's `resize` and zarr 2's do), so
    /// that a later grow does not bring their old bytes back. Their deletes are staged
    /// under the old layout and committed by the flush that precedes the new metadata.
    fn delete_outside(&self, array: &ShardedArray, counts: &[u64]) -> Result<()> {
        let layout = &array.layout;
        let outside = |c: &[u64]| c.iter().zip(counts).any(|(c, n)| c >= n);
        let shrinks = counts.len() == layout.ndim()
            && layout
                .chunk_counts()
                .iter()
                .zip(counts)
                .any(|(old, new)| new < old);
        if !shrinks {
            return Ok(());
        }
        // Files of their own still in memory are stored first: one in a key directory
        // the shrink leaves outside the grid would no longer resolve (its directory is
        // shown as the store's plain directory from now on, holding what is stored).
        self.keep_files(super::kept::Keep::Under(&array.rel))?;
        let mut gone = Vec::new();
        self.tree
            .any_shard_below(array, &mut Vec::new(), &mut |view, shard| {
                let index = view.refresh_shard(array, shard);
                for c in layout.chunks_of_shard(shard) {
                    if outside(&c)
                        && layout
                            .locate(&c)
                            .is_some_and(|loc| !matches!(index.chunk(layout, &loc), Ok(None)))
                    {
                        gone.push(c);
                    }
                }
                Ok(false)
            })?;
        for (c, exists) in self.w.staging.under(&array.rel, &[]) {
            if exists && outside(&c) {
                gone.push(c);
            }
        }
        for c in gone {
            self.commit_chunk(array, c, None)?;
        }
        Ok(())
    }
}

impl Overlay<'_> {
    /// `.zattrs` written (`Some(bytes)`) or unlinked (`None`) in the v2 view while the
    /// sharded array's `.zarray` is unlinked: its attributes are held with it, stored
    /// with the `.zarray` written back; no `zarr.json` reaches the store now, as a plain
    /// directory keeps `.zarray` gone. They are stored at once in the document kept at the
    /// unlink (`store::UNLINKED_META`), where a later mount takes them from (before, they
    /// lived only in memory, and a mount that ended first lost them: named by `shardfs
    /// unmount`, but lost); unlinked, stored empty. `None` when the array is not headless.
    pub(super) fn hold_headless_attrs(
        &self,
        array: &ShardedArray,
        zattrs: Option<&[u8]>,
    ) -> Result<Option<Arc<ShardedArray>>> {
        use crate::format::v2;
        let w = self.w;
        if !w.unlinked.is_headless(&array.rel) {
            return Ok(None);
        }
        // The overlay reconciled with the store first: another mount may have written
        // the metadata back, removed the array, or kept another array's document there
        // (a reviewer's finding: that document was overwritten by the one held here).
        if let Some(dir_meta) = self.tree.store.stat(&array.rel)? {
            self.classify_dir(array.rel.clone(), dir_meta)?;
        }
        let Some(held) = w.unlinked.headless_array(&array.rel) else {
            return Ok(None);
        };
        let invalid = |why: String| {
            log::warn!("{}/.zattrs: refused: {why}", held.rel.display());
            ViewError::Invalid(why)
        };
        let mut doc = held.meta.doc.clone();
        let name = super::landed::node_name(&held.rel);
        v2::apply_zattrs(
            &mut doc,
            zattrs.unwrap_or(b"{}"),
            Some(held.layout.ndim()),
            &name,
        )
        .map_err(invalid)?;
        let bytes =
            serde_json::to_vec(&Value::Object(doc.clone())).map_err(|e| invalid(e.to_string()))?;
        let Ok(format::Node::Array(meta)) = format::metadata::parse(&bytes) else {
            return Err(invalid("its metadata would no longer be an array's".into()));
        };
        let kept_at = held.rel.join(crate::store::UNLINKED_META);
        self.kept_as_held(&held, &kept_at)?;
        super::landed::write_doc(self.tree.store.as_ref(), &kept_at, doc)?;
        // Held as read from the document now kept (else the next look would take it for
        // another one, and read it again).
        let json_meta = self.tree.store.stat(&kept_at)?.unwrap_or(held.json_meta);
        let src = super::ArraySource {
            rel: held.rel.clone(),
            data_rel: held.data_rel.clone(),
            meta_rel: held.meta_rel.clone(),
            store_keys: held.store_keys,
            draft: held.draft,
        };
        let new = Arc::new(
            self.tree_read()
                .build_array(src, *meta, held.layout.clone(), held.dir_meta, json_meta)
                .map_err(invalid)?,
        );
        if !w
            .unlinked
            .set_headless_attrs(&held.rel, new.clone(), zattrs.is_some())
        {
            // No more headless meanwhile (its metadata written back, or the array
            // removed): the document just kept must not stay beside it.
            if let Err(e) =
                super::unlinked::remove_unlinked_meta(self.tree.store.as_ref(), &held.rel)
            {
                log::warn!("{}: left as it was: {e}", held.rel.display());
            }
            return Ok(None);
        }
        self.tree.arrays.insert(new.clone());
        Ok(Some(new))
    }

    pub(super) fn reload_array(&self, rel: &Path) -> Result<Arc<ShardedArray>> {
        let dir_meta = self.tree.stat_rel(rel)?;
        let node = self.classify_dir(rel.to_path_buf(), dir_meta)?;
        let Node::ArrayDir { array } = node else {
            return Err(ViewError::Invalid(format!(
                "{} is no longer a sharded array",
                rel.display()
            )));
        };
        self.refresh_subtree(rel);
        Ok(array)
    }

    /// Re-resolve every known inode at or below the store directory `rel` (the view path
    /// equals the store path there) after the kind of that directory changed.
    pub(super) fn refresh_subtree(&self, rel: &Path) {
        let (mut gone, mut kept, mut entries) = (Vec::new(), Vec::new(), Vec::new());
        for (ino, path) in self.tree.inodes.under(rel) {
            let retired = match (self.resolve(&path), self.tree.inodes.get(ino)) {
                // Still there, as the same kind of file.
                (Ok(Some(node)), Some((_, old))) if node.kind() == old.kind() => {
                    self.tree.inodes.update(ino, node);
                    false
                }
                // Gone, or now another kind: whatever the kernel does with the inode it
                // holds (a cached entry, an open descriptor's `truncate`) must not reach
                // the store file its node names, which may now be something else (the
                // shard stored at a plain chunk file's path).
                (Ok(_), Some(_)) => {
                    self.tree.inodes.retire(ino);
                    true
                }
                // Not known now (a store error): left as it was.
                _ => false,
            };
            if retired { &mut gone } else { &mut kept }.push(ino);
            // The directory itself keeps its inode and dentry (dropping that dentry would
            // fail operations already under way in it); its children change.
            if path.as_path() != rel
                && let (Some(parent), Some(name)) = (path.parent(), path.file_name())
                && let Some(pino) = self.tree.inodes.peek(parent)
            {
                entries.push((pino, name.to_os_string()));
            }
        }
        self.w.invalidate_inodes_first(gone, kept, entries);
    }
}

impl Overlay<'_> {
    /// `Ok` if the document kept at `kept_at` is the one the array `held` (unlinked
    /// here) was read from; `ESTALE` if the store has kept another since (between a look
    /// and now): that one is another mount's to change.
    fn kept_as_held(&self, held: &ShardedArray, kept_at: &Path) -> Result<()> {
        match self.tree.store.stat(kept_at)? {
            Some(k) if k.version() == held.json_meta.version() => Ok(()),
            _ => {
                log::warn!(
                    "{}/.zattrs: not stored: the array's kept document changed meanwhile",
                    held.rel.display()
                );
                Err(std::io::Error::from_raw_os_error(libc::ESTALE).into())
            }
        }
    }
}
