//! Loading arrays: what a store directory is (a presentable sharded array, or a plain
//! directory: [`TreeRead::classify`]), reading an array's `zarr.json`
//! ([`TreeRead::load_array`]) and making the array the view shows
//! ([`TreeRead::build_array`]),
//! kept in the array registry. The registry itself, and which node a name is, are
//! `resolve.rs`; a draft store's arrays are found in `draft.rs`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::{self, Node as MetaNode, Presentation};
use crate::store::EntryMeta;

use super::Tree;
use super::TreeRead;
use super::reconcile::Reconcile;
use super::resolve::read_metadata;
use super::*;

/// Why a store directory is not shown as a sharded array.
pub(super) enum NotShown {
    /// Not an array, or not sharded: a plain directory.
    Plain,
    /// No `zarr.json` at all: a plain directory, unless a writable mount unlinked the
    /// metadata of the sharded array there ([`TreeRead::unlinked_array`]).
    NoMetadata,
    /// An array the view cannot present; the reason is logged once.
    Unsupported(String),
    /// Its metadata could not be read now (the store failed: an outage): nothing is
    /// decided, and the operation fails with the error (issue 34: an array whose
    /// `zarr.json` read failed once was shown as a plain directory from then on).
    Io(io::Error),
}

impl TreeRead<'_> {
    /// What a store directory is: a presentable sharded array, or a plain directory.
    pub(super) fn classify_dir(&self, rel: PathBuf, dir_meta: EntryMeta) -> Result<Node> {
        Ok(self
            .classify(rel.clone(), dir_meta)?
            .unwrap_or(Node::Dir { rel }))
    }

    /// Like [`Self::classify_dir`]; `None` for an array the v2 view leaves out.
    ///
    /// Where the overlay is stale about `rel` (an array whose metadata it holds unlinked
    /// and the store has back, or has no more; chunks staged for an array another mount
    /// replaced; an unlinked array it has not met), this fails with
    /// [`ViewError::Stale`]: the overlay reconciles itself and asks again
    /// (`Overlay::in_tree`, `reconcile.rs`).
    pub(super) fn classify(&self, rel: PathBuf, dir_meta: EntryMeta) -> Result<Option<Node>> {
        if let Some(w) = self.overlay {
            if w.shown_as_stored(&rel) {
                return Ok(Some(Node::Dir { rel }));
            }
            if let Some(array) = w.headless_array(&rel) {
                return self.headless(array, rel, dir_meta);
            }
            if w.is_plain_headless(&rel) {
                return self.plain_headless(rel);
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
        let loaded = self.load_array(&rel, dir_meta);
        // A document kept at an unlink (`store::UNLINKED_META`) beside metadata written
        // by another route (a tool writing the store, another mount that had not looked
        // again) would show the old array if this metadata went again: it goes, once
        // this query is answered (`Tree::stale_kept`; found by a reviewer and an
        // adversarial tester).
        // Only one older than that metadata: on object storage an unlink puts the kept
        // document before it deletes `zarr.json`, and a lookup between the two must not
        // take it (a reviewer's finding).
        if self.overlay.is_some()
            && !matches!(loaded, Err(NotShown::NoMetadata | NotShown::Io(_)))
            && let (Ok(Some(k)), Ok(Some(j))) = (
                self.tree.kept_meta(&rel),
                self.tree.store.stat(&rel.join("zarr.json")),
            )
            && j.mtime > k.mtime
        {
            self.tree.stale_kept.lock().push((rel.clone(), k.version()));
        }
        Ok(match loaded {
            Ok(array) => {
                let array = Arc::new(array);
                // Another mount made another array here: chunks staged for the one it
                // replaced must not go into it (see `Overlay::array_to_flush`).
                if let Some(old) = self.tree.arrays.get(&rel)
                    && old.replaced_by(&array)
                    && self.overlay.is_some_and(|w| w.holds_staged(&rel))
                {
                    return Err(Reconcile::Replaced { rel }.into());
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

    /// Store directory `rel`, whose array's metadata this mount holds unlinked (`array`):
    /// that array while the store has the document kept at the unlink, as it was read,
    /// and no metadata; else the overlay is stale ([`Reconcile`]).
    fn headless(
        &self,
        array: Arc<ShardedArray>,
        rel: PathBuf,
        dir_meta: EntryMeta,
    ) -> Result<Option<Node>> {
        if array.dir_meta != dir_meta {
            return Err(Reconcile::HeadlessDirMeta { rel, dir_meta }.into());
        }
        if self.tree.store.stat(&rel.join("zarr.json"))?.is_some() {
            return Err(Reconcile::MetaBack { rel }.into());
        }
        let kept = rel.join(crate::store::UNLINKED_META);
        let Some(k) = self.tree.store.stat(&kept)? else {
            return Err(Reconcile::HeadlessGone { rel }.into());
        };
        // Another document kept there since the one held was read (another mount wrote
        // the metadata back, replaced the array, and unlinked it again): the array is
        // that one now. Before, this mount kept showing, and flushing by, the one it held.
        if k.version() != array.json_meta.version() {
            match self.load_array_from(&rel, &kept, dir_meta) {
                Ok(now) if now.json_meta.version() != array.json_meta.version() => {
                    return Err(Reconcile::HeadlessChanged {
                        array: Arc::new(now),
                    }
                    .into());
                }
                Err(NotShown::Io(e)) => return Err(e.into()),
                // The same document, or one that is no array's: the one held stays.
                Ok(_) | Err(_) => {}
            }
        }
        Ok(Some(Node::ArrayDir { array }))
    }

    /// A store directory whose sharded array's metadata a writable mount unlinked while
    /// the array's other names stayed (kept at [`crate::store::UNLINKED_META`]): shown
    /// by this writable mount as that one showed it, an array whose metadata is unlinked
    /// ([`super::unlinked::Unlinked`]), so that the metadata written back takes the
    /// shards back: the overlay takes it in ([`Reconcile::Unlinked`]). `None`: it is
    /// none (a read-only mount shows the shard files).
    fn unlinked_array(&self, rel: &Path, dir_meta: EntryMeta) -> Result<Option<Node>> {
        if self.overlay.is_none() {
            return Ok(None);
        }
        let kept = rel.join(crate::store::UNLINKED_META);
        if self.tree.kept_meta(rel)?.is_none() {
            return Ok(None);
        }
        match self.load_array_from(rel, &kept, dir_meta) {
            Ok(array) => Err(Reconcile::Unlinked {
                array: Arc::new(array),
            }
            .into()),
            Err(NotShown::Io(e)) => Err(e.into()),
            // An unsharded array of the v2 view whose `.zarray` was unlinked.
            Err(NotShown::Plain) => match self.tree.plain_array_in(&kept) {
                Some((doc, keys)) => Err(Reconcile::UnlinkedPlain {
                    rel: rel.to_path_buf(),
                    keys,
                    doc,
                }
                .into()),
                None => Ok(None),
            },
            Err(_) => Ok(None),
        }
    }

    /// Store directory `rel`, an unsharded array of the v2 view whose `.zarray` this
    /// mount holds unlinked: a plain directory that the v2 view shows with the array's
    /// names (`plain.rs`), while the store has the document kept at the unlink and no
    /// metadata; else the overlay is stale ([`Reconcile`]).
    fn plain_headless(&self, rel: PathBuf) -> Result<Option<Node>> {
        if self.tree.store.stat(&rel.join("zarr.json"))?.is_some() {
            return Err(Reconcile::PlainMetaBack { rel }.into());
        }
        let kept = rel.join(crate::store::UNLINKED_META);
        if self.tree.store.stat(&kept)?.is_none() {
            return Err(Reconcile::PlainGone { rel }.into());
        }
        // Another array's document kept there since (another mount wrote the metadata
        // back, made another array, unlinked its `.zarray`): that one is held now.
        let held = self.overlay.and_then(|w| w.plain_doc(&rel));
        if let Some((doc, keys)) = self.tree.plain_array_in(&kept)
            && held.is_some_and(|held| !crate::format::metadata::same_but_attributes(&held, &doc))
        {
            return Err(Reconcile::UnlinkedPlain { rel, keys, doc }.into());
        }
        Ok(Some(Node::Dir { rel }))
    }
    pub(super) fn load_array(
        &self,
        rel: &Path,
        dir_meta: EntryMeta,
    ) -> std::result::Result<ShardedArray, NotShown> {
        self.load_array_from(rel, &rel.join("zarr.json"), dir_meta)
    }

    /// [`Self::load_array`] from the document at `json_rel` (the array's metadata is
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
