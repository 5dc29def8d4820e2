//! The overlay as the tree reads it: [`OverlayRead`], a borrowed [`Writer`] with its
//! queries only. The tree ([`super::TreeRead`]) holds this and not the `Writer`, so that
//! it cannot change what the mount changed: the [`super::Overlay`] does (`reconcile.rs`).

use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::writer::Writer;
use super::{MetaFile, ShardedArray};
use crate::format::v2::PlainKeys;
use crate::write::staging::Staged;

/// What this mount changed, read only (issue 35: the tree reads the overlay and never
/// writes it). Each method asks one of the `Writer`'s owners.
#[derive(Clone, Copy)]
pub(crate) struct OverlayRead<'a>(&'a Writer);

impl<'a> OverlayRead<'a> {
    pub(super) fn new(w: &'a Writer) -> Self {
        Self(w)
    }

    /// Whether the array directory `dir` is shown as stored (`path_sets.rs`).
    pub(super) fn shown_as_stored(&self, dir: &Path) -> bool {
        self.0.choices.shown_as_stored(dir)
    }

    /// The array at `rel` whose metadata this mount holds unlinked (`unlinked.rs`).
    pub(super) fn headless_array(&self, rel: &Path) -> Option<Arc<ShardedArray>> {
        self.0.unlinked.headless_array(rel)
    }

    /// Whether metadata file `file` of the array at `rel` is shown (`unlinked.rs`).
    pub(super) fn meta_shown(&self, rel: &Path, file: MetaFile) -> bool {
        self.0.unlinked.meta_shown(rel, file)
    }

    /// Whether the `.zattrs` at `rel` was unlinked and is not shown until written again.
    pub(super) fn zattrs_hidden(&self, rel: &Path) -> bool {
        self.0.unlinked.zattrs_hidden(rel)
    }

    /// Whether the `.zmetadata` of the group at `rel` is shown though its `.zgroup` went.
    pub(super) fn zmetadata_left(&self, rel: &Path) -> bool {
        self.0.unlinked.zmetadata_left(rel)
    }

    /// Whether the `.zmetadata` of the group at `rel` was unlinked.
    pub(super) fn zmetadata_hidden(&self, rel: &Path) -> bool {
        self.0.unlinked.zmetadata_hidden(rel)
    }

    /// Whether `rel` is an unsharded array of the v2 view whose `.zarray` this mount
    /// holds unlinked.
    pub(super) fn is_plain_headless(&self, rel: &Path) -> bool {
        self.0.unlinked.is_plain_headless(rel)
    }

    /// The key translation of the headless unsharded array at `rel`.
    pub(super) fn plain_keys(&self, rel: &Path) -> Option<PlainKeys> {
        self.0.unlinked.plain_keys(rel)
    }

    /// For a headless unsharded array at `rel`: whether its `.zattrs` is still listed.
    pub(super) fn plain_zattrs(&self, rel: &Path) -> Option<bool> {
        self.0.unlinked.plain_zattrs(rel)
    }

    /// The document the headless unsharded array at `rel` had.
    pub(super) fn plain_doc(&self, rel: &Path) -> Option<Map<String, Value>> {
        self.0.unlinked.plain_doc(rel)
    }

    /// The chunk staged at `coords` of the array at `array`: `Some(None)` for one
    /// removed.
    pub(super) fn staged(&self, array: &Path, coords: &[u64]) -> Option<Staged> {
        self.0.staging.get(array, coords)
    }

    /// The chunks staged below key prefix `prefix` of the array at `array`, and whether
    /// each exists (`false`: removed).
    pub(super) fn staged_under(&self, array: &Path, prefix: &[u64]) -> Vec<(Vec<u64>, bool)> {
        self.0.staging.under(array, prefix)
    }

    /// Whether chunks of the array at `array` are staged.
    pub(super) fn holds_staged(&self, array: &Path) -> bool {
        self.0.staging.holds(array)
    }

    /// Whether a key directory made here or a staged chunk lies below `prefix`.
    pub(super) fn has_keys_under(&self, array: &ShardedArray, prefix: &[u64]) -> bool {
        self.0.has_keys_under(array, prefix)
    }

    /// The key directories made by `mkdir` in the array at `array` (`key_dirs.rs`).
    pub(super) fn key_dirs_of(&self, array: &Path, counts: &[u64]) -> Vec<Vec<u64>> {
        self.0.vdirs.of_array(array, counts)
    }

    /// The size of the in-memory file at view path `path`, if it is one.
    pub(super) fn scratch_len(&self, path: &Path) -> Option<u64> {
        self.0.scratch.len_at(path)
    }

    /// The names of the in-memory files in view directory `dir`.
    pub(super) fn scratch_names_in(&self, dir: &Path) -> Vec<OsString> {
        self.0.scratch.names_in(dir)
    }

    /// The document being written at store path `rel` (`pending_doc.rs`), if one is.
    pub(super) fn pending_doc(&self, rel: &Path) -> Option<Arc<super::pending_doc::PendingDoc>> {
        self.0.docs.get(rel)
    }

    /// Whether a document is being written at store path `rel` (`pending_doc.rs`).
    pub(super) fn doc_pending(&self, rel: &Path) -> bool {
        self.0.docs.get(rel).is_some()
    }

    /// Whether the document being written at store path `rel` is whole (`None`: none is
    /// being written there).
    pub(super) fn doc_whole(&self, rel: &Path) -> Option<bool> {
        self.0.docs.get(rel).map(|doc| doc.whole())
    }

    /// The store paths of documents being written that are not yet whole.
    pub(super) fn unfinished_docs(&self) -> Vec<std::path::PathBuf> {
        self.0.docs.unfinished()
    }

    /// The names of documents being written in store directory `dir`, not yet stored.
    pub(super) fn new_docs_in(&self, dir: &Path) -> Vec<OsString> {
        self.0.docs.new_in(dir)
    }

    /// Document `file` of the array or group whose metadata is at `meta_rel`, as a
    /// writer of this mount wrote it (`as_written.rs`).
    pub(super) fn as_written(&self, meta_rel: &Path, file: MetaFile) -> Option<Arc<Vec<u8>>> {
        self.0.as_written.lock().doc(meta_rel, file)
    }
}
