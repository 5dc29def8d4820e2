//! Group metadata as the view shows it: the v3 view's group `zarr.json` whose stored
//! `consolidated_metadata` describes sharded arrays, shown with their entries unsharded
//! ([`GroupDocs::shown`], kept by the stored file's version), a stored group's
//! document, and the group files the view makes (v2 `.zgroup` and `.zattrs`, a draft
//! store's `zarr.json`). Which names these files have is `resolve.rs`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::{self, Node as MetaNode};
use crate::store::EntryMeta;

use super::TreeRead;
use super::resolve::read_small;
use super::*;

/// A group document as the v3 view shows it (`None`: as stored), with the version of the
/// stored file it was made from.
type ShownGroupDoc = ((u64, u64, std::time::SystemTime), Option<Arc<Vec<u8>>>);

/// Group documents of the store, as read and as the v3 view shows them: a part of the
/// tree that owns its cache (issue 35).
pub(super) struct GroupDocs {
    store: Arc<dyn Store>,
    format: ViewFormat,
    /// The v3 view: group documents whose stored `consolidated_metadata` is shown with
    /// the sharded arrays' entries unsharded, by path, with the stored file's version
    /// they were made from ([`GroupDocs::shown`]).
    shown: Mutex<HashMap<PathBuf, ShownGroupDoc>>,
}

impl GroupDocs {
    pub(super) fn new(store: Arc<dyn Store>, format: ViewFormat) -> GroupDocs {
        GroupDocs {
            store,
            format,
            shown: Mutex::default(),
        }
    }

    /// The v3 view: the `zarr.json` at store path `rel`, where it is a group's whose
    /// stored `consolidated_metadata` (zarr-python 3 and xarray write it, and read it
    /// instead of the hierarchy) describes sharded arrays, with their entries as the view
    /// shows those arrays: unsharded. `None`: shown as stored.
    /// `meta`: the file's, where the caller has it (else it is looked up).
    pub(super) fn shown(&self, rel: &Path, meta: Option<&EntryMeta>) -> Option<Arc<Vec<u8>>> {
        if self.format != ViewFormat::V3 || rel.file_name()? != "zarr.json" {
            return None;
        }
        let version = match meta {
            Some(m) => m.version(),
            None => self.store.stat(rel).ok()??.version(),
        };
        if let Some((v, doc)) = self.shown.lock().get(rel)
            && *v == version
        {
            return doc.clone();
        }
        let bytes = read_small(self.store.as_ref(), rel).ok()??;
        let doc =
            format::metadata::map_consolidated(&bytes, |_, e| format::metadata::unsharded_entry(e))
                .map(Arc::new);
        let mut cache = self.shown.lock();
        if cache.len() >= 256 {
            cache.clear();
        }
        cache.insert(rel.to_path_buf(), (version, doc.clone()));
        doc
    }

    /// The document of the group at store directory `rel` whose `.zgroup` a writable
    /// mount of the v2 view unlinked (kept at [`crate::store::UNLINKED_META`]): its
    /// `.zattrs` stays, as on a plain directory, and the `.zgroup` written back makes the
    /// group again with its attributes. `None` where there is none, or the store has a
    /// `zarr.json` there.
    pub(super) fn kept(
        &self,
        rel: &Path,
    ) -> Result<Option<serde_json::Map<String, serde_json::Value>>> {
        if self.format != ViewFormat::V2 {
            return Ok(None);
        }
        let kept = rel.join(crate::store::UNLINKED_META);
        if self.store.stat(&kept)?.is_none() || self.store.stat(&rel.join("zarr.json"))?.is_some() {
            return Ok(None);
        }
        let Some(bytes) = read_small(self.store.as_ref(), &kept)? else {
            return Ok(None);
        };
        if !matches!(format::metadata::parse(&bytes), Ok(MetaNode::Group)) {
            return Ok(None);
        }
        Ok(serde_json::from_slice(&bytes).ok())
    }

    /// Whether the group at `rel` whose `.zgroup` was unlinked shows its `.zattrs`: where
    /// it has attributes (a plain directory has no `.zattrs` where none was written,
    /// while the view shows one for every group).
    pub(super) fn kept_zattrs(&self, rel: &Path) -> Result<bool> {
        Ok(self.kept(rel)?.is_some_and(|doc| {
            doc.get("attributes")
                .and_then(serde_json::Value::as_object)
                .is_some_and(|a| !a.is_empty())
        }))
    }

    /// The document of the group whose `zarr.json` is in store directory `rel`.
    pub(super) fn stored(
        &self,
        rel: &Path,
    ) -> Result<Option<serde_json::Map<String, serde_json::Value>>> {
        let Some(bytes) = read_small(self.store.as_ref(), &rel.join("zarr.json"))? else {
            return Ok(None);
        };
        if !matches!(format::metadata::parse(&bytes), Ok(MetaNode::Group)) {
            return Ok(None);
        }
        Ok(serde_json::from_slice(&bytes).ok())
    }
}

impl TreeRead<'_> {
    /// The bytes of a group's metadata file made by the view.
    pub(super) fn group_meta(&self, dir: &Path, file: MetaFile) -> Result<Vec<u8>> {
        use format::v2;
        if let Some(tree) = self.tree.draft_tree() {
            let group = tree.groups.get(dir).ok_or(ViewError::NotFound)?;
            return Ok(match file {
                MetaFile::ZarrJson => tree.group_json(dir).ok_or(ViewError::NotFound)?,
                MetaFile::Zgroup => v2::to_bytes(&v2::zgroup()),
                MetaFile::Zattrs => v2::to_bytes(&serde_json::Value::Object(format::ome::to_v04(
                    group.attrs.clone(),
                ))),
                MetaFile::Zarray => return Err(ViewError::NotFound),
            });
        }
        if let Some(bytes) = self.plain_meta(dir, file) {
            return bytes;
        }
        let doc = match self.tree.group_docs.stored(dir)? {
            Some(doc) => doc,
            // Its `.zgroup` unlinked: its `.zattrs` stays (`GroupDocs::kept`).
            None if file == MetaFile::Zattrs && !self.zattrs_hidden(dir) => {
                self.tree.group_docs.kept(dir)?.ok_or(ViewError::NotFound)?
            }
            None => return Err(ViewError::NotFound),
        };
        let rendered = match file {
            MetaFile::Zgroup => v2::to_bytes(&v2::zgroup()),
            MetaFile::Zattrs => v2::to_bytes(&v2::zattrs(&doc)),
            MetaFile::ZarrJson | MetaFile::Zarray => return Err(ViewError::NotFound),
        };
        // As its writer wrote it, while that is the document shown.
        let json = dir.join("zarr.json");
        Ok(Arc::unwrap_or_clone(self.as_written(
            &json,
            file,
            Arc::new(rendered),
        )))
    }
}
