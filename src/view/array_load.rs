//! Loading arrays: what a store directory is (a presentable sharded array, or a plain
//! directory: [`View::classify`]), reading an array's `zarr.json`
//! ([`View::load_array`]) and making the array the view shows ([`View::build_array`]),
//! kept in the array registry. The registry itself, and which node a name is, are
//! `resolve.rs`; a draft store's arrays are found in `draft.rs`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::{self, Node as MetaNode, Presentation};
use crate::store::EntryMeta;

use super::Tree;
use super::TreeRead;
use super::resolve::read_metadata;
use super::*;

/// Why a store directory is not shown as a sharded array.
pub(super) enum NotShown {
    /// Not an array, or not sharded: a plain directory.
    Plain,
    /// No `zarr.json` at all: a plain directory, unless a writable mount unlinked the
    /// metadata of the sharded array there ([`View::unlinked_array`]).
    NoMetadata,
    /// An array the view cannot present; the reason is logged once.
    Unsupported(String),
    /// Its metadata could not be read now (the store failed: an outage): nothing is
    /// decided, and the operation fails with the error (issue 34: an array whose
    /// `zarr.json` read failed once was shown as a plain directory from then on).
    Io(io::Error),
}

impl View {
    /// What a store directory is: a presentable sharded array, or a plain directory.
    pub(super) fn classify_dir(&self, rel: PathBuf, dir_meta: EntryMeta) -> Result<Node> {
        Ok(self
            .classify(rel.clone(), dir_meta)?
            .unwrap_or(Node::Dir { rel }))
    }

    /// Like [`View::classify_dir`]; `None` for an array the v2 view leaves out.
    pub(super) fn classify(&self, rel: PathBuf, dir_meta: EntryMeta) -> Result<Option<Node>> {
        if let Some(w) = &self.writer {
            if w.choices.shown_as_stored(&rel) {
                return Ok(Some(Node::Dir { rel }));
            }
            if let Some(array) = w.unlinked.headless_array_now(&rel, &dir_meta) {
                let kept = rel.join(crate::store::UNLINKED_META);
                if self.tree.store.stat(&rel.join("zarr.json"))?.is_none() {
                    if self.tree.store.stat(&kept)?.is_some() {
                        return Ok(Some(Node::ArrayDir { array }));
                    }
                    // Neither: another mount removed the array (or made a plain directory
                    // there): this mount's unlinked array goes too.
                    w.unlinked.forget_headless(&rel);
                } else {
                    // Its metadata is back in the store (written back through this mount,
                    // being taken in now, or by another): the array's again, loaded below.
                    // The document kept at the unlink goes first (a failure leaves the
                    // array unlinked here, to be tried again).
                    remove_unlinked_meta(self.tree.store.as_ref(), &rel)?;
                    let file = match self.tree.format {
                        ViewFormat::V2 => MetaFile::Zarray,
                        ViewFormat::V3 => MetaFile::ZarrJson,
                    };
                    w.unlinked.meta_written(&rel, file);
                }
            }
        }
        // The array known here, while its directory and `zarr.json` are as they were
        // when it was read (the same ETag on object storage; inode, size and times on a
        // disk): not read again. A revalidation of the array directory read its
        // `zarr.json` each time, and failed while an endpoint did not answer.
        if let Some(known) = self.tree.arrays.get(&rel)
            && !known.draft
            && known.dir_meta == dir_meta
            && self.tree.store.stat(&rel.join("zarr.json")).ok().flatten() == Some(known.json_meta)
        {
            return Ok(Some(Node::ArrayDir { array: known }));
        }
        let loaded = self.tree_read().load_array(&rel, dir_meta);
        // A document kept at an unlink (`store::UNLINKED_META`) beside metadata written
        // by another route (a tool writing the store, another mount that had not looked
        // again) would show the old array if this metadata went again: it goes now
        // (found by a reviewer and an adversarial tester).
        // Only one older than that metadata: on object storage an unlink puts the kept
        // document before it deletes `zarr.json`, and a lookup between the two must not
        // take it (a reviewer's finding). Best effort: a failure is logged, and the
        // lookup goes on.
        if self.writer.is_some() && !matches!(loaded, Err(NotShown::NoMetadata | NotShown::Io(_))) {
            let kept = rel.join(crate::store::UNLINKED_META);
            if let (Ok(Some(k)), Ok(Some(j))) = (
                self.tree.kept_meta(&rel),
                self.tree.store.stat(&rel.join("zarr.json")),
            ) && j.mtime > k.mtime
                && let Err(e) = remove_unlinked_meta(self.tree.store.as_ref(), &rel)
            {
                log::warn!("{}: left as it was: {e}", kept.display());
            }
        }
        Ok(match loaded {
            Ok(array) => {
                let array = Arc::new(array);
                // Another mount made another array here: chunks staged for the one it
                // replaced must not go into it (see `View::array_to_flush`).
                if let Some(old) = self.tree.arrays.get(&rel)
                    && old.replaced_by(&array)
                    && self.writer.as_ref().is_some_and(|w| w.staging.holds(&rel))
                {
                    self.let_go_staged(
                        &rel,
                        "another mount made another array at its path: the chunks staged \
                         for the one it replaced are not stored",
                    );
                }
                self.tree.arrays.insert(array.clone());
                Some(Node::ArrayDir { array })
            }
            Err(NotShown::Plain) => Some(Node::Dir { rel }),
            Err(NotShown::NoMetadata) => match self.unlinked_array(&rel, dir_meta)? {
                Some(array) => Some(array),
                None => Some(Node::Dir { rel }),
            },
            Err(NotShown::Io(e)) => return Err(e.into()),
            Err(NotShown::Unsupported(why)) => {
                let v2 = self.tree.format == ViewFormat::V2;
                if self.tree.arrays.first_warning(&rel) {
                    if v2 {
                        log::warn!("{}: left out of the v2 view: {why}", rel.display());
                    } else {
                        log::warn!(
                            "{}/zarr.json passes through unchanged: {why}",
                            rel.display()
                        );
                    }
                }
                (!v2).then_some(Node::Dir { rel })
            }
        })
    }

    /// A store directory whose sharded array's metadata a writable mount unlinked while
    /// the array's other names stayed (kept at [`crate::store::UNLINKED_META`]): shown
    /// by this writable mount as that one showed it, an array whose metadata is unlinked
    /// ([`super::unlinked::Unlinked`]), so that the metadata written back takes the
    /// shards back. `None`: it is none (a read-only mount shows the shard files).
    fn unlinked_array(&self, rel: &Path, dir_meta: EntryMeta) -> Result<Option<Node>> {
        let Some(w) = &self.writer else {
            return Ok(None);
        };
        let kept = rel.join(crate::store::UNLINKED_META);
        if self.tree.kept_meta(rel)?.is_none() {
            return Ok(None);
        }
        let array = match self.tree_read().load_array_from(rel, &kept, dir_meta) {
            Ok(array) => Arc::new(array),
            Err(NotShown::Io(e)) => return Err(e.into()),
            Err(_) => return Ok(None),
        };
        let file = match self.tree.format {
            ViewFormat::V2 => MetaFile::Zarray,
            ViewFormat::V3 => MetaFile::ZarrJson,
        };
        w.unlinked.make_headless(&array, file);
        // Known to the chunk paths as any array is (before, a chunk written, fsynced or
        // removed in it got `ESTALE`: found by a reviewer).
        self.tree.arrays.insert(array.clone());
        Ok(Some(Node::ArrayDir { array }))
    }
}

impl TreeRead<'_> {
    pub(super) fn load_array(
        &self,
        rel: &Path,
        dir_meta: EntryMeta,
    ) -> std::result::Result<ShardedArray, NotShown> {
        self.load_array_from(rel, &rel.join("zarr.json"), dir_meta)
    }

    /// [`View::load_array`] from the document at `json_rel` (the array's metadata is
    /// stored at `rel/zarr.json` all the same).
    pub(super) fn load_array_from(
        &self,
        rel: &Path,
        from: &Path,
        dir_meta: EntryMeta,
    ) -> std::result::Result<ShardedArray, NotShown> {
        let json_rel = rel.join("zarr.json");
        let unsupported = |e: String| NotShown::Unsupported(e);
        // A failing store (an errno, a short read of a file that changed) decides
        // nothing; metadata that is too large does.
        let failed = |e: io::Error| {
            if e.raw_os_error().is_some() || e.kind() == io::ErrorKind::UnexpectedEof {
                NotShown::Io(e)
            } else {
                unsupported(e.to_string())
            }
        };
        let Some(file) = self.tree.store.open(from).map_err(failed)? else {
            return Err(NotShown::NoMetadata);
        };
        let (bytes, json_meta) = read_metadata(file.as_ref()).map_err(failed)?;
        let meta = match format::metadata::parse(&bytes).map_err(|e| unsupported(e.to_string()))? {
            MetaNode::Group => return Err(NotShown::Plain),
            MetaNode::Array(a) => a,
        };
        let layout = match &meta.presentation {
            Presentation::Sharded(l) => l.clone(),
            Presentation::Plain if self.tree.format == ViewFormat::V2 => {
                // Shown with its chunk files passed through at v2 keys (`plain.rs`).
                return match format::v2::plain_zarray(&meta.doc) {
                    Ok(_) => Err(NotShown::Plain),
                    Err(why) => Err(unsupported(why)),
                };
            }
            Presentation::Plain => return Err(NotShown::Plain),
            Presentation::Unsupported(why) => {
                return Err(unsupported(format!(
                    "cannot present this sharded array: {why}"
                )));
            }
        };
        let store_keys = meta.key_encoding;
        self.build_array(
            ArraySource {
                rel: rel.to_path_buf(),
                data_rel: rel.to_path_buf(),
                meta_rel: json_rel,
                store_keys,
                draft: false,
            },
            *meta,
            layout,
            dir_meta,
            json_meta,
        )
        .map_err(unsupported)
    }

    /// The array as this view shows it.
    pub(super) fn build_array(
        &self,
        src: ArraySource,
        meta: format::ArrayMeta,
        layout: format::ShardLayout,
        dir_meta: EntryMeta,
        json_meta: EntryMeta,
    ) -> std::result::Result<ShardedArray, String> {
        let json = self.as_written(
            &src.meta_rel,
            MetaFile::ZarrJson,
            Arc::new(meta.unsharded_json(&layout)),
        );
        let mut v2_fill = None;
        let (shown_keys, v2) = match self.tree.format {
            ViewFormat::V3 if src.draft => (
                format::ChunkKeyEncoding {
                    kind: format::KeyKind::Default,
                    separator: src.store_keys.separator,
                },
                None,
            ),
            ViewFormat::V3 => (src.store_keys, None),
            ViewFormat::V2 => {
                let keys = format::v2::shown_keys(src.store_keys);
                let (zarray, fill) = format::v2::zarray_fill(
                    &meta.doc,
                    &layout.shape,
                    layout.inner_chunk_shape(),
                    &layout.inner_codecs,
                    keys,
                )?;
                if fill {
                    v2_fill = Some(Arc::new(format::v2::fill_chunk(
                        &meta.doc,
                        layout.inner_chunk_shape(),
                        &layout.inner_codecs,
                    )?));
                }
                let zattrs = format::v2::zattrs(&meta.doc);
                (
                    keys,
                    Some((
                        self.as_written(
                            &src.meta_rel,
                            MetaFile::Zarray,
                            Arc::new(format::v2::to_bytes(&zarray)),
                        ),
                        self.as_written(
                            &src.meta_rel,
                            MetaFile::Zattrs,
                            Arc::new(format::v2::to_bytes(&zattrs)),
                        ),
                    )),
                )
            }
        };
        Ok(ShardedArray {
            rel: src.rel,
            data_rel: src.data_rel,
            meta_rel: src.meta_rel,
            store_keys: src.store_keys,
            shown_keys,
            draft: src.draft,
            meta,
            layout,
            json,
            v2,
            v2_fill,
            dir_meta,
            json_meta,
        })
    }
}

/// Remove the document kept at an unlink in store directory `dir`
/// (`store::UNLINKED_META`); gone already is fine.
pub(super) fn remove_unlinked_meta(store: &dyn crate::store::Store, dir: &Path) -> Result<()> {
    match store.remove_file(&dir.join(crate::store::UNLINKED_META)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

impl Tree {
    /// The document kept at an unlink in store directory `rel`
    /// ([`crate::store::UNLINKED_META`]), if any: opened, not `stat`ed. On object
    /// storage a stat of an absent name is a HEAD and then a LIST (is it a directory?),
    /// two round trips in series for every array a writable mount meets and every
    /// directory without metadata; an open is one GET. Measured at 30 ms a request
    /// (s3s-fs behind `scripts/s3_proxy.py`), `find` of a bucket of two arrays: 582 ms
    /// on a writable mount against 272 ms read-only, 2 HEADs and 4 LISTs more.
    pub(super) fn kept_meta(&self, rel: &Path) -> io::Result<Option<EntryMeta>> {
        match self.store.open(&rel.join(crate::store::UNLINKED_META))? {
            Some(file) => file.meta().map(Some),
            None => Ok(None),
        }
    }
}
