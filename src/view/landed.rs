//! Metadata landing in a store directory (closed, renamed or copied there): a
//! `zarr.json` may make a new array (`adopt.rs`); in the v2 view `.zarray`, `.zgroup` and
//! `.zattrs` are taken into the directory's `zarr.json`; consolidated metadata above it
//! goes stale, and OME-Zarr axis names name the arrays' dimensions.

use std::path::Path;

use serde_json::Value;

use super::Overlay;
use super::{MetaFile, Result, ViewError, ViewFormat};
use crate::format;

impl Overlay<'_> {
    /// A metadata file just landed (closed, renamed or copied) in the store directory
    /// `dir`. A `zarr.json` may make a new array; in the v2 view `.zarray`, `.zgroup` and
    /// `.zattrs` are taken into the directory's `zarr.json` and removed.
    pub(super) fn metadata_landed(&self, dir: &Path, file: MetaFile) -> Result<()> {
        self.unconsolidate_above(dir);
        match (file, self.tree.format) {
            (MetaFile::ZarrJson, _) => {
                self.store_consolidated(dir);
                self.adopt_new_array(dir)
            }
            (_, ViewFormat::V3) => Ok(()),
            (_, ViewFormat::V2) => {
                let path = dir.join(file.name());
                let data = self
                    .tree
                    .store
                    .read_all(&path)?
                    .ok_or(ViewError::NotFound)?;
                // Shown as written while it is the document shown (`TreeRead::as_written`).
                let written = self.remember_as_written((dir.join("zarr.json"), file), &data);
                let taken = self.take_in_v2(dir, file, &data);
                if taken.is_err() {
                    self.forget_as_written(written);
                }
                self.tree.store.remove_file(&path)?;
                if let Err(e) = &taken {
                    log::warn!("{}: refused: {e}", dir.join(file.name()).display());
                }
                self.refresh_subtree(dir);
                taken
            }
        }
    }

    /// Apply a v2 metadata document written in store directory `dir` to its `zarr.json`.
    fn take_in_v2(&self, dir: &Path, file: MetaFile, data: &[u8]) -> Result<()> {
        self.take_in_v2_doc(dir, file, data)?;
        let w = self.w;
        match file {
            // Written again after its unlink: listed again.
            MetaFile::Zattrs => w.unlinked.zattrs_shown(dir),
            // A group or an array again: no `.zmetadata` left by an old `.zgroup`.
            MetaFile::Zgroup | MetaFile::Zarray => {
                w.unlinked.forget_zmetadata(dir);
                w.unlinked.zmetadata_made(dir);
                // A group now where an unsharded array's `.zarray` was unlinked: shown
                // as one (before, its `.zgroup` was stored but not found until a
                // remount: found by an adversarial tester).
                if file == MetaFile::Zgroup {
                    w.unlinked.forget_plain(dir);
                }
            }
            MetaFile::ZarrJson => {}
        }
        Ok(())
    }

    fn take_in_v2_doc(&self, dir: &Path, file: MetaFile, data: &[u8]) -> Result<()> {
        // An unsharded array whose `.zarray` this mount holds unlinked: reconciled with
        // the store first (another mount may have written the metadata back, or removed
        // the array), as a sharded one's is (`Overlay::hold_headless_attrs`).
        if self.w.unlinked.is_plain_headless(dir)
            && let Some(dir_meta) = self.tree.store.stat(dir)?
        {
            self.classify_dir(dir.to_path_buf(), dir_meta)?;
        }
        let headless_plain = self
            .w
            .unlinked
            .plain_keys(dir)
            .zip(self.w.unlinked.plain_doc(dir));
        if let (MetaFile::Zattrs, Some((keys, doc))) = (file, headless_plain.clone())
            && self.hold_plain_headless_attrs(dir, &keys, doc, data)?
        {
            return Ok(());
        }
        if let Some(taken) = self.take_in_plain(dir, file, data) {
            return taken;
        }
        if !self.store_v3_of_v2(dir, file, data, headless_plain.as_ref())? {
            return Ok(());
        }
        match file {
            MetaFile::Zarray => {
                self.plain_written_back(dir);
                self.adopt_new_array(dir)?
            }
            MetaFile::Zattrs => self.name_ome_dimensions(dir),
            _ => {}
        }
        Ok(())
    }

    /// `unlink` of a group's `.zgroup` (the group goes) or `.zattrs` (its attributes go).
    pub(super) fn unlink_group_meta(&self, dir: &Path, file: MetaFile) -> Result<()> {
        if let Some(done) = self.unlink_plain_meta(dir, file) {
            self.refresh_subtree(dir);
            return done;
        }
        match file {
            MetaFile::Zattrs => {
                self.tree
                    .store
                    .write_atomically(&dir.join(file.name()), b"{}")?;
                self.metadata_landed(dir, file)?;
                // Not listed until written again, as on a plain directory (`tar -x`
                // and `cp --remove-destination` create it anew with `O_EXCL`).
                self.w.unlinked.zattrs_unlinked(dir);
                self.refresh_subtree(dir);
                return Ok(());
            }
            MetaFile::Zgroup => {
                // Kept, not removed (`GroupDocs::kept`): its `.zattrs` stays, and the
                // `.zgroup` written back makes the group again with its attributes.
                // Before, the unlink took the attributes along, and `tar -x` of a group
                // (its `.zattrs` first, then `.zgroup`: `EEXIST`, unlink, create) lost
                // them, exiting 0 (found by an adversarial tester).
                self.tree.store.rename(
                    &dir.join("zarr.json"),
                    &dir.join(crate::store::UNLINKED_META),
                )?;
                // (not one unlinked before: it stays gone, and `rm -rf` of the group
                // ends; found by an adversarial tester)
                if self.tree.format == ViewFormat::V2 && !self.w.unlinked.zmetadata_hidden(dir) {
                    self.w.unlinked.leave_zmetadata(dir);
                }
            }
            _ => return Err(ViewError::NotFound),
        }
        self.refresh_subtree(dir);
        Ok(())
    }
}

impl Overlay<'_> {
    /// OME-Zarr 0.5 wants every array of a multiscale image to carry the axis names as
    /// `dimension_names`; zarr 2 writes none. After a group's attributes were written
    /// through the v2 view, the image's arrays that have none get them (the arrays that are
    /// written later get them at creation, from [`Overlay::ome_axis_names`]).
    fn name_ome_dimensions(&self, dir: &Path) {
        let Ok(Some(group)) = self.tree.group_docs.stored(dir) else {
            return;
        };
        let Some(Value::Object(ome)) = group.get("attributes").and_then(|a| a.get("ome")) else {
            return;
        };
        let Some(Value::Array(multiscales)) = ome.get("multiscales") else {
            return;
        };
        let paths = multiscales
            .iter()
            .filter_map(|m| m.get("datasets")?.as_array())
            .flatten()
            .filter_map(|d| d.get("path")?.as_str());
        for path in paths {
            let Some(names) = format::ome::axis_names_of(ome, path) else {
                continue;
            };
            let rel = dir.join(path);
            if let Some((mut doc, keys)) = self.tree.plain_array(&rel) {
                // An unsharded array: its zarr.json gets the names directly.
                if !doc.contains_key("dimension_names") && keys.ndim == names.len() {
                    doc.insert("dimension_names".into(), names.into());
                    let mut bytes =
                        serde_json::to_vec_pretty(&Value::Object(doc)).unwrap_or_default();
                    bytes.push(b'\n');
                    if let Err(e) = self
                        .tree
                        .store
                        .write_atomically(&rel.join("zarr.json"), &bytes)
                    {
                        log::warn!("{}: dimension names not set: {e}", rel.display());
                    }
                }
                continue;
            }
            let Ok(array) = self.reload_array(&rel) else {
                continue;
            };
            if array.meta.doc.contains_key("dimension_names") || array.layout.ndim() != names.len()
            {
                continue;
            }
            let Ok(Value::Object(mut doc)) = serde_json::from_slice::<Value>(&array.json) else {
                continue;
            };
            doc.insert("dimension_names".into(), names.into());
            let bytes = serde_json::to_vec(&Value::Object(doc)).unwrap_or_default();
            if let Err(e) = self.update_metadata(&array, &bytes) {
                log::warn!(
                    "{}: dimension names from OME-Zarr axes not set: {e}",
                    rel.display()
                );
            }
        }
    }
}

impl Overlay<'_> {
    /// The hierarchy changed at store directory `dir` (metadata written or removed, a
    /// node made, removed or moved): the `consolidated_metadata` that groups above it
    /// keep in their `zarr.json` (zarr-python 3 and xarray write it) no longer describes
    /// it, and zarr 3 reads it instead of the hierarchy. It is dropped, so that readers
    /// read the hierarchy as it is (`zarr.consolidate_metadata` writes it again). Best
    /// effort: a failure is logged, and fails nothing.
    pub(super) fn unconsolidate_above(&self, dir: &Path) {
        for group in dir.ancestors().skip(1) {
            let json = group.join("zarr.json");
            let Ok(Some(bytes)) = self.tree.read_small(&json) else {
                continue;
            };
            let Ok(Value::Object(mut doc)) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            if doc.get("node_type").and_then(Value::as_str) != Some("group")
                || doc.get("consolidated_metadata").is_none_or(Value::is_null)
            {
                continue;
            }
            doc.remove("consolidated_metadata");
            let out = serde_json::to_vec_pretty(&Value::Object(doc)).unwrap_or_default();
            match self.tree.store.write_atomically(&json, &out) {
                Ok(()) => log::info!(
                    "{}: consolidated metadata dropped (the hierarchy below changed)",
                    json.display()
                ),
                Err(e) => log::warn!("{}: consolidated metadata not dropped: {e}", json.display()),
            }
        }
    }

    /// A group's `zarr.json` written through the v3 view (`zarr.consolidate_metadata`):
    /// its `consolidated_metadata` describes the arrays as the view shows them,
    /// unsharded; each sharded array's entry is stored as the array is stored, so that
    /// readers of the store read its shards as shards. Best effort, as in
    /// [`Self::unconsolidate_above`].
    fn store_consolidated(&self, dir: &Path) {
        let json = dir.join("zarr.json");
        let Ok(Some(bytes)) = self.tree.read_small(&json) else {
            return;
        };
        let stored = crate::format::metadata::map_consolidated(&bytes, |key, _| {
            let own = self
                .tree
                .read_small(&dir.join(key).join("zarr.json"))
                .ok()??;
            match crate::format::metadata::parse(&own) {
                Ok(crate::format::Node::Array(a))
                    if matches!(a.presentation, crate::format::Presentation::Sharded(_)) =>
                {
                    serde_json::from_slice(&own).ok()
                }
                _ => None,
            }
        });
        if let Some(out) = stored
            && let Err(e) = self.tree.store.write_atomically(&json, &out)
        {
            log::warn!(
                "{}: consolidated metadata stored as written: {e}",
                json.display()
            );
        }
    }

    /// `Ok` if the document kept at the unlink of the `.zarray` of the unsharded array at
    /// `dir` is the one this mount holds (`held`), attributes aside; `ESTALE` if the store
    /// has kept another since (another mount's, to change: a sharded array's is checked
    /// the same way, `Overlay::kept_as_held`).
    pub(super) fn plain_kept_as_held(
        &self,
        dir: &Path,
        held: &serde_json::Map<String, Value>,
    ) -> Result<()> {
        let kept = dir.join(crate::store::UNLINKED_META);
        let same = self
            .tree
            .plain_array_in(&kept)
            .is_some_and(|(doc, _)| crate::format::metadata::same_but_attributes(&doc, held));
        if !same {
            log::warn!(
                "{}/.zattrs: not stored: the array's kept document changed meanwhile",
                dir.display()
            );
            return Err(std::io::Error::from_raw_os_error(libc::ESTALE).into());
        }
        Ok(())
    }

    /// The group document stored at `dir` (`zarr.json`), if any; `EINVAL` where it is an
    /// array's, or no JSON.
    fn stored_group_doc(&self, dir: &Path) -> Result<Option<serde_json::Map<String, Value>>> {
        let Some(b) = self.tree.store.read_all(&dir.join("zarr.json"))? else {
            return Ok(None);
        };
        let doc: serde_json::Map<String, Value> = serde_json::from_slice(&b)
            .map_err(|e| ViewError::Invalid(format!("zarr.json: {e}")))?;
        if doc.get("node_type") != Some(&"group".into()) {
            return Err(ViewError::Invalid(format!(
                "{} is already an array",
                dir.display()
            )));
        }
        Ok(Some(doc))
    }

    /// The `zarr.json` of the array whose `.zarray` (`data`) was written in store
    /// directory `dir`, over the group document `group` that was there (its attributes
    /// kept); `headless_plain`: the unsharded array there whose `.zarray` was unlinked.
    fn v3_of_zarray(
        &self,
        dir: &Path,
        data: &[u8],
        headless_plain: Option<&(format::v2::PlainKeys, serde_json::Map<String, Value>)>,
        mut group: serde_json::Map<String, Value>,
    ) -> Result<serde_json::Map<String, Value>> {
        let mut doc = format::v2::v3_from_zarray(data).map_err(ViewError::Invalid)?;
        // The `.zarray` of an unsharded array written back after its unlink (`tar -x`,
        // `cp --remove-destination`): the array is the store's again, its chunks where
        // they are, at the store's keys, and unsharded. Before, it took the `.zarray`'s
        // own keys (no `c/`), and its chunks were shown gone and read as the fill value
        // until a remount (found by the reference test's metadata-unlink ops).
        if let Some((keys, old)) = headless_plain {
            doc.insert("chunk_key_encoding".into(), keys.store.to_json());
            // Its attributes, as its `.zattrs` showed them, and its dimension names where
            // the `.zarray` written has as many dimensions.
            if let Some(v) = old.get("attributes") {
                doc.insert("attributes".into(), v.clone());
            }
            let ndim = |d: &serde_json::Map<String, Value>, k: &str| {
                d.get(k).and_then(Value::as_array).map(Vec::len)
            };
            if let Some(v) = old.get("dimension_names")
                && ndim(old, "dimension_names") == ndim(&doc, "shape")
            {
                doc.insert("dimension_names".into(), v.clone());
            }
            self.w.choices.keep_unsharded(dir);
        }
        if let Some(attrs) = group.remove("attributes") {
            doc.insert("attributes".into(), attrs);
        }
        if let Some(names) = self.ome_axis_names(dir)
            && doc.get("shape").and_then(Value::as_array).map(Vec::len) == Some(names.len())
        {
            doc.insert("dimension_names".into(), names.into());
        }
        Ok(doc)
    }

    /// The axis names that the OME-Zarr multiscale image in the parent group of store
    /// directory `dir` gives the array there, if it lists it.
    fn ome_axis_names(&self, dir: &Path) -> Option<Vec<String>> {
        let parent = self.tree.group_docs.stored(dir.parent()?).ok()??;
        let attrs = parent.get("attributes")?.as_object()?;
        format::ome::axis_names_of(attrs, &node_name(dir))
    }
}

impl Overlay<'_> {
    /// The attributes of an unsharded array whose `.zarray` was unlinked: kept with it
    /// (in memory, and in the document kept in the store) until `.zarray` is written
    /// back (before, they made the directory a group's). `false` where its `.zarray` came
    /// back meanwhile: taken in as any array's.
    fn hold_plain_headless_attrs(
        &self,
        dir: &Path,
        keys: &crate::format::v2::PlainKeys,
        mut doc: serde_json::Map<String, Value>,
        data: &[u8],
    ) -> Result<bool> {
        let name = node_name(dir);
        crate::format::v2::apply_zattrs(&mut doc, data, Some(keys.ndim), &name)
            .map_err(ViewError::Invalid)?;
        let w = self.w;
        if let Some(held) = w.unlinked.plain_doc(dir) {
            self.plain_kept_as_held(dir, &held)?;
            let kept = dir.join(crate::store::UNLINKED_META);
            write_doc(self.tree.store.as_ref(), &kept, doc.clone())?;
        }
        Ok(w.unlinked.set_plain_doc(dir, doc))
    }

    /// Store the v3 document of v2 metadata `file` written at `dir` (`data`): the
    /// group's `zarr.json` (`.zgroup`, `.zattrs`) or the array's (`.zarray`, of an
    /// unsharded array: `headless_plain` where its `.zarray` was unlinked). `false` where
    /// only a document kept at an unlink took it (a `.zattrs` of a group whose `.zgroup`
    /// is unlinked).
    fn store_v3_of_v2(
        &self,
        dir: &Path,
        file: MetaFile,
        data: &[u8],
        headless_plain: Option<&(crate::format::v2::PlainKeys, serde_json::Map<String, Value>)>,
    ) -> Result<bool> {
        use crate::format::v2;
        let json_path = dir.join("zarr.json");
        let invalid = |why: String| ViewError::Invalid(why);
        let current = self.stored_group_doc(dir)?;
        // A group whose `.zgroup` was unlinked (`GroupDocs::kept`): a `.zattrs` written
        // goes into the kept document (the directory stays no group, as on a plain
        // directory), and the `.zgroup` written back makes the group again with it.
        let kept = match current {
            None => self.tree.group_docs.kept(dir)?,
            Some(_) => None,
        };
        if let (MetaFile::Zattrs, Some(mut doc)) = (file, kept.clone()) {
            v2::apply_zattrs(&mut doc, data, None, &node_name(dir)).map_err(invalid)?;
            let kept_at = dir.join(crate::store::UNLINKED_META);
            write_doc(self.tree.store.as_ref(), &kept_at, doc)?;
            return Ok(false);
        }
        let had_kept = kept.is_some();
        let mut group = current.or(kept).unwrap_or_else(|| {
            let Value::Object(m) = serde_json::json!({"zarr_format": 3, "node_type": "group"})
            else {
                unreachable!()
            };
            m
        });
        let out = match file {
            MetaFile::Zgroup => {
                let v: Value =
                    serde_json::from_slice(data).map_err(|e| invalid(format!("not JSON: {e}")))?;
                if v.get("zarr_format").and_then(Value::as_u64) != Some(2) {
                    return Err(invalid(".zgroup: zarr_format is not 2".into()));
                }
                group
            }
            MetaFile::Zattrs => {
                v2::apply_zattrs(&mut group, data, None, &node_name(dir)).map_err(invalid)?;
                group
            }
            MetaFile::Zarray => self.v3_of_zarray(dir, data, headless_plain, group)?,
            MetaFile::ZarrJson => return Err(invalid("zarr.json is adopted, not taken in".into())),
        };
        write_doc(self.tree.store.as_ref(), &json_path, out)?;
        // The document kept at the unlink of a group's `.zgroup` or of an unsharded
        // array's `.zarray` is what was just written, or superseded by it.
        if had_kept || headless_plain.is_some() {
            super::unlinked::remove_unlinked_meta(self.tree.store.as_ref(), dir)?;
        }
        Ok(true)
    }
}

/// The last component of a store directory (empty for the root).
pub(super) fn node_name(dir: &Path) -> String {
    dir.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

/// Store JSON document `doc` at store path `path` (written whole, in one step), as
/// shardfs writes the documents it makes: indented, with a final newline.
pub(super) fn write_doc(
    store: &dyn crate::store::Store,
    path: &Path,
    doc: serde_json::Map<String, Value>,
) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(&Value::Object(doc))
        .map_err(|e| ViewError::Invalid(e.to_string()))?;
    bytes.push(b'\n');
    store.write_atomically(path, &bytes)?;
    Ok(())
}
