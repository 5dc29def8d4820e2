//! Metadata this mount unlinked while the other names beside it stay, as on a plain
//! directory: an array whose `zarr.json` (or `.zarray`) went, a `.zattrs` unlinked and
//! not written again, an unsharded v2 array without its `.zarray`, a group's
//! `.zmetadata` left after its `.zgroup`. zarr 2, `rm -rf`, `tar -x` and `git checkout`
//! unlink one name and then the others, or make the name anew; the view must show what
//! a plain directory would meanwhile. One owner of those tables; each is a leaf lock.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{MetaFile, ShardedArray};
use crate::format::v2::PlainKeys;

/// An array whose metadata was unlinked while its other names are still shown.
struct Headless {
    /// The array as it was, with the attributes of a `.zattrs` written or unlinked
    /// since (the v2 view): stored with the `.zarray` written back.
    array: Arc<ShardedArray>,
    /// `.zattrs` is still listed.
    zattrs: bool,
}

/// The same for an unsharded array of the v2 view (see `view/plain.rs`), with the
/// document it had: its `.zattrs` is still shown from it, a `.zattrs` written
/// meanwhile goes into it, and its attributes go into the `.zarray` written back.
struct PlainHeadless {
    keys: PlainKeys,
    zattrs: bool,
    doc: serde_json::Map<String, serde_json::Value>,
}

/// What this mount unlinked of arrays' and groups' metadata, by store path.
#[derive(Default)]
pub(super) struct Unlinked {
    /// Arrays whose metadata was unlinked: the store no longer holds it, but the names
    /// listed with it (`.zattrs`, chunks) stay until each is removed, and the directory
    /// until `rmdir`, or until the metadata is written again (`View::unlink`).
    headless: Mutex<HashMap<PathBuf, Headless>>,
    /// Arrays and groups whose `.zattrs` was unlinked in the v2 view: not listed until
    /// written again. Before, the generated `.zattrs` stayed, and `tar -x` (an `O_EXCL`
    /// create, `EEXIST`, unlink, create again) looped forever (found by an adversarial
    /// tester; for groups and unsharded arrays, by the reference test).
    zattrs: Mutex<HashSet<PathBuf>>,
    /// Unsharded arrays of the v2 view whose `.zarray` was unlinked.
    plain: Mutex<HashMap<PathBuf, PlainHeadless>>,
    /// Groups of the v2 view whose `.zgroup` was unlinked: their `.zmetadata` is still
    /// there until it is unlinked too, or the directory goes (`rm -rf` lists it after
    /// `.zgroup`).
    zmetadata: Mutex<HashSet<PathBuf>>,
    /// Groups of the v2 view whose `.zmetadata` (made from the hierarchy) was unlinked:
    /// not shown until it is made again (`create`, a rename onto it) or the group's
    /// `.zgroup` is written. Before, unlinking it changed nothing, and `tar -x` (an
    /// `O_EXCL` create, `EEXIST`, unlink, create again) looped forever, as `git checkout`
    /// failed (found by an adversarial tester).
    zmetadata_gone: Mutex<HashSet<PathBuf>>,
}

impl Unlinked {
    /// The array at `rel` whose metadata was unlinked, if it is one.
    pub(super) fn headless_array(&self, rel: &Path) -> Option<Arc<ShardedArray>> {
        self.headless.lock().get(rel).map(|h| h.array.clone())
    }

    /// The array at `rel` whose metadata was unlinked, if it is one, with the attributes
    /// its directory has now (`dir_meta`): `chmod`, `chown` and new names reach the
    /// directory in the store meanwhile, and `stat` shows them, as on a plain directory.
    /// Before, it showed those of the unlink (found by the reference test).
    pub(super) fn headless_array_now(
        &self,
        rel: &Path,
        dir_meta: &crate::store::EntryMeta,
    ) -> Option<Arc<ShardedArray>> {
        let mut headless = self.headless.lock();
        let h = headless.get_mut(rel)?;
        if h.array.dir_meta != *dir_meta {
            h.array = Arc::new(ShardedArray {
                dir_meta: *dir_meta,
                ..(*h.array).clone()
            });
        }
        Some(h.array.clone())
    }

    /// The headless array at `array.rel` is `array` now (its kept document changed in
    /// the store); whether its `.zattrs` is listed stays as it was.
    pub(super) fn headless_changed(&self, array: &Arc<ShardedArray>) {
        if let Some(h) = self.headless.lock().get_mut(&array.rel) {
            h.array = array.clone();
        }
    }

    /// The arrays at or below store path `dir` whose metadata was unlinked.
    pub(super) fn headless_under(&self, dir: &Path) -> Vec<Arc<ShardedArray>> {
        let headless = self.headless.lock();
        headless
            .iter()
            .filter(|(rel, _)| rel.starts_with(dir))
            .map(|(_, h)| h.array.clone())
            .collect()
    }

    pub(super) fn is_headless(&self, rel: &Path) -> bool {
        self.headless.lock().contains_key(rel)
    }

    /// `array`'s metadata left the store (`file`, `.zarray` or `zarr.json`, was
    /// unlinked): its other names stay; `.zattrs` too after `.zarray`.
    pub(super) fn make_headless(&self, array: &Arc<ShardedArray>, file: MetaFile) {
        // (not a `.zattrs` unlinked before)
        let zattrs = file == MetaFile::Zarray && !self.zattrs.lock().contains(&array.rel);
        self.headless.lock().insert(
            array.rel.clone(),
            Headless {
                array: array.clone(),
                zattrs,
            },
        );
    }

    /// `.zattrs` of the headless array at `rel` written (`shown`) or unlinked: `array`
    /// is the array with its attributes now, held until `.zarray` is written back. Before,
    /// a `.zattrs` written there stored the old metadata again, and `.zarray` was back
    /// where a plain directory keeps it gone (found by the reference test). `false`:
    /// `rel` is no headless array (any more).
    pub(super) fn set_headless_attrs(
        &self,
        rel: &Path,
        array: Arc<ShardedArray>,
        shown: bool,
    ) -> bool {
        match self.headless.lock().get_mut(rel) {
            Some(h) => {
                h.array = array;
                h.zattrs = shown;
            }
            None => return false,
        }
        // Written: listed, also where it was unlinked before the `.zarray` was (before,
        // it stayed hidden, and zarr 2 wrote attributes over the ones it was told were
        // stored: found by an adversarial tester).
        if shown {
            self.zattrs.lock().remove(rel);
        }
        true
    }

    /// `.zattrs` of the array at `rel` unlinked (its store document emptied): not
    /// listed until written again.
    pub(super) fn zattrs_unlinked(&self, rel: &Path) {
        self.zattrs.lock().insert(rel.to_path_buf());
    }

    /// Whether the `.zattrs` of the group or unsharded array at `rel` was unlinked (and
    /// not written since): not shown.
    pub(super) fn zattrs_hidden(&self, rel: &Path) -> bool {
        self.zattrs.lock().contains(rel)
    }

    /// The `.zattrs` at `rel` was written again, or its directory removed: shown again.
    pub(super) fn zattrs_shown(&self, rel: &Path) {
        self.zattrs.lock().remove(rel);
    }

    /// Whether metadata file `file` of the array at `rel` is shown: not after `.zarray`
    /// was unlinked (then `.zattrs` only until it is unlinked too), nor `.zattrs` after
    /// it was unlinked until it is written again.
    pub(super) fn meta_shown(&self, rel: &Path, file: MetaFile) -> bool {
        if file == MetaFile::Zattrs && self.zattrs.lock().contains(rel) {
            return false;
        }
        match self.headless.lock().get(rel) {
            Some(h) => file == MetaFile::Zattrs && h.zattrs,
            None => true,
        }
    }

    /// Metadata file `file` of the array at `rel` was written: shown whole again, but
    /// for a `.zattrs` unlinked while `.zarray` was gone (as a plain directory keeps it
    /// gone; its attributes are stored empty).
    pub(super) fn meta_written(&self, rel: &Path, file: MetaFile) {
        let headless = self.headless.lock().remove(rel);
        match file {
            MetaFile::Zattrs => {
                self.zattrs.lock().remove(rel);
            }
            MetaFile::Zarray if let Some(h) = headless => {
                let mut hidden = self.zattrs.lock();
                if h.zattrs {
                    hidden.remove(rel);
                } else {
                    hidden.insert(rel.to_path_buf());
                }
            }
            _ => {}
        }
    }

    /// The headless array at `rel` was removed (`rmdir`).
    pub(super) fn forget_headless(&self, rel: &Path) {
        self.headless.lock().remove(rel);
    }

    /// The key translation of the headless unsharded array at `rel`.
    pub(super) fn plain_keys(&self, rel: &Path) -> Option<PlainKeys> {
        self.plain.lock().get(rel).map(|h| h.keys.clone())
    }

    /// For a headless unsharded array at `rel`: whether its `.zattrs` is still listed.
    pub(super) fn plain_zattrs(&self, rel: &Path) -> Option<bool> {
        self.plain.lock().get(rel).map(|h| h.zattrs)
    }

    pub(super) fn is_plain_headless(&self, rel: &Path) -> bool {
        self.plain.lock().contains_key(rel)
    }

    /// The `.zarray` of the unsharded array at `rel` (whose document was `doc`)
    /// unlinked: its other names stay.
    pub(super) fn make_plain_headless(
        &self,
        rel: &Path,
        keys: PlainKeys,
        doc: serde_json::Map<String, serde_json::Value>,
    ) {
        self.plain.lock().insert(
            rel.to_path_buf(),
            PlainHeadless {
                keys,
                zattrs: true,
                doc,
            },
        );
    }

    /// The document the headless unsharded array at `rel` had (with the attributes
    /// written since).
    pub(super) fn plain_doc(
        &self,
        rel: &Path,
    ) -> Option<serde_json::Map<String, serde_json::Value>> {
        self.plain.lock().get(rel).map(|h| h.doc.clone())
    }

    /// A `.zattrs` written into the headless unsharded array at `rel`: kept in its
    /// document (`doc` now), and listed.
    pub(super) fn set_plain_doc(
        &self,
        rel: &Path,
        doc: serde_json::Map<String, serde_json::Value>,
    ) -> bool {
        match self.plain.lock().get_mut(rel) {
            Some(h) => {
                h.doc = doc;
                h.zattrs = true;
                true
            }
            None => false,
        }
    }

    /// `.zattrs` of the headless unsharded array at `rel` unlinked: `doc` is its
    /// document with the attributes emptied (stored so with the `.zarray` written back).
    pub(super) fn hide_plain_zattrs(
        &self,
        rel: &Path,
        doc: serde_json::Map<String, serde_json::Value>,
    ) {
        if let Some(h) = self.plain.lock().get_mut(rel) {
            h.zattrs = false;
            h.doc = doc;
        }
    }

    /// `rel` is no headless unsharded array any more (removed).
    pub(super) fn forget_plain(&self, rel: &Path) {
        self.plain.lock().remove(rel);
    }

    /// The `.zarray` of the array at `rel` was written: no headless unsharded array
    /// any more, and a `.zattrs` unlinked meanwhile stays gone, as on a plain directory.
    pub(super) fn plain_written_back(&self, rel: &Path) {
        if self.plain.lock().remove(rel).is_some_and(|h| !h.zattrs) {
            self.zattrs.lock().insert(rel.to_path_buf());
        }
    }

    /// Whether the group at `rel` still has the `.zmetadata` its `.zgroup` left.
    pub(super) fn zmetadata_left(&self, rel: &Path) -> bool {
        self.zmetadata.lock().contains(rel)
    }

    /// The `.zgroup` of the group at `rel` unlinked: its `.zmetadata` stays.
    pub(super) fn leave_zmetadata(&self, rel: &Path) {
        self.zmetadata.lock().insert(rel.to_path_buf());
    }

    /// The `.zmetadata` of the group at `rel` was unlinked: not shown until made again.
    pub(super) fn zmetadata_unlinked(&self, rel: &Path) {
        self.zmetadata_gone.lock().insert(rel.to_path_buf());
    }

    /// Whether the `.zmetadata` of the group at `rel` was unlinked (and not made since).
    pub(super) fn zmetadata_hidden(&self, rel: &Path) -> bool {
        self.zmetadata_gone.lock().contains(rel)
    }

    /// The `.zmetadata` of the group at `rel` was made again (or its `.zgroup` written):
    /// shown.
    pub(super) fn zmetadata_made(&self, rel: &Path) {
        self.zmetadata_gone.lock().remove(rel);
    }

    /// The `.zmetadata` left at `rel` is gone (unlinked, or its directory).
    pub(super) fn forget_zmetadata(&self, rel: &Path) {
        self.zmetadata.lock().remove(rel);
    }

    /// The directory at store path `rel` moved to `dst` (replacing what was there, an
    /// empty directory): what it holds below it moves with it, as a plain directory's
    /// names would. Before, arrays whose metadata was unlinked were let go, and their
    /// other names became the store's files at the new path: the shard files, which a
    /// `zarr.json` written back then took in as chunks (the reference test found it); and
    /// a `.zmetadata` left by its `.zgroup` stayed at the old path.
    pub(super) fn dir_moved(&self, rel: &Path, dst: &Path) {
        use super::path_sets::{move_entries, move_paths};
        move_entries(&mut self.headless.lock(), rel, dst, |h| {
            let array = Arc::new(h.array.moved(rel, dst)?);
            Some(Headless { array, ..h })
        });
        move_entries(&mut self.plain.lock(), rel, dst, Some);
        for set in [&self.zattrs, &self.zmetadata, &self.zmetadata_gone] {
            move_paths(&mut set.lock(), rel, dst);
        }
    }
}

/// Remove the document kept at an unlink in store directory `dir`
/// (`store::UNLINKED_META`); gone already is fine.
pub(super) fn remove_unlinked_meta(
    store: &dyn crate::store::Store,
    dir: &Path,
) -> super::Result<()> {
    match store.remove_file(&dir.join(crate::store::UNLINKED_META)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}
