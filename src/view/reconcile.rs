//! The tree's queries as the facade and the overlay ask them: the overlay reconciled
//! with the store before the tree reads it.
//!
//! The tree reads the overlay and never writes it. Where it meets a directory the
//! overlay is stale about (another mount, or a tool, changed the store), the query
//! fails with [`ViewError::Stale`], saying what it met ([`Reconcile`]); the overlay,
//! [`Overlay::in_tree`], brings itself up to date and asks again (a read-only view has
//! no overlay to be stale: `View::in_tree` just asks). Each reconciliation
//! changes the overlay so that the same directory is no more stale: an answer comes
//! after a round or two. Resolution must see the overlay reconciled while it walks:
//! `resolve("z/zarr.json")` after `z`'s metadata came back needs `z` no more unlinked
//! before it asks whether `zarr.json` is shown (applied after the query, it would
//! answer `ENOENT`).
//!
//! Queries asked through here are those that may meet a store directory for the first
//! time: resolution (`resolve`, `child`, `stored_child`, `classify_dir`), listings
//! (`readdir`) and the v2 view's `.zmetadata` (`consolidated`).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::v2::PlainKeys;
use crate::store::EntryMeta;

use super::node::ShardedArray;
use super::unlinked::remove_unlinked_meta;
use super::{DirEntry, MetaFile, Node, Overlay, Result, TreeRead, View, ViewError, ViewFormat};

/// What the tree met that the overlay is stale about, at store directory `rel`.
#[derive(Debug)]
pub enum Reconcile {
    /// An array whose metadata this mount holds unlinked, whose directory changed
    /// (`chmod`, a new name): the overlay's copy takes the directory's attributes now.
    HeadlessDirMeta { rel: PathBuf, dir_meta: EntryMeta },
    /// An array whose metadata this mount holds unlinked, with metadata in the store
    /// again (written back through this mount, being taken in, or by another): the
    /// document kept at the unlink goes (a failure leaves it unlinked, to be tried
    /// again), and the array is its metadata's again.
    MetaBack { rel: PathBuf },
    /// An array whose metadata this mount holds unlinked, with neither metadata nor the
    /// kept document in the store: another mount removed the array (or made a plain
    /// directory there); this mount's unlinked array goes too.
    HeadlessGone { rel: PathBuf },
    /// An array whose metadata this mount holds unlinked, whose kept document is
    /// another now (`array`, read from it): held from now on (the attributes of its
    /// `.zattrs` as they were), the chunks staged for the one held let go if it is
    /// another array (see [`Reconcile::Replaced`]).
    HeadlessChanged { array: Arc<ShardedArray> },
    /// Another mount made another array at `rel`: the chunks this mount staged for the
    /// one it replaced are not stored (see `Overlay::array_to_flush`).
    Replaced { rel: PathBuf },
    /// An array whose metadata a writable mount unlinked (its document kept), met for
    /// the first time: this mount holds it unlinked too.
    Unlinked { array: Arc<ShardedArray> },
    /// An unsharded array of the v2 view whose `.zarray` a writable mount unlinked (its
    /// document kept), met for the first time: this mount holds it unlinked too, with the
    /// key translation and document kept.
    UnlinkedPlain {
        rel: PathBuf,
        keys: PlainKeys,
        doc: serde_json::Map<String, serde_json::Value>,
    },
    /// An unsharded array whose `.zarray` this mount holds unlinked, with metadata in the
    /// store again (written back by another mount): the kept document goes, and the
    /// array is its metadata's again.
    PlainMetaBack { rel: PathBuf },
    /// An unsharded array whose `.zarray` this mount holds unlinked, with neither
    /// metadata nor the kept document in the store: it goes here too.
    PlainGone { rel: PathBuf },
    /// Several, met by one listing (all of a directory's children are looked at before
    /// the listing is asked again).
    Many(Vec<Reconcile>),
}

impl Reconcile {
    /// The store directories it is about, for telling a reconciliation that changed
    /// nothing (the same asked again and again) from progress.
    fn dirs(&self) -> Vec<PathBuf> {
        match self {
            Reconcile::HeadlessDirMeta { rel, .. }
            | Reconcile::MetaBack { rel }
            | Reconcile::HeadlessGone { rel }
            | Reconcile::Replaced { rel }
            | Reconcile::UnlinkedPlain { rel, .. }
            | Reconcile::PlainMetaBack { rel }
            | Reconcile::PlainGone { rel } => vec![rel.clone()],
            Reconcile::HeadlessChanged { array } | Reconcile::Unlinked { array } => {
                vec![array.rel.clone()]
            }
            Reconcile::Many(all) => all.iter().flat_map(Reconcile::dirs).collect(),
        }
    }
}

impl From<Reconcile> for ViewError {
    fn from(r: Reconcile) -> Self {
        ViewError::Stale(Box::new(r))
    }
}

/// Why chunks staged for an array another mount replaced are let go.
const REPLACED: &str = "another mount made another array at its path: the chunks staged for \
                        the one it replaced are not stored";

/// Times one query may find the same directory stale before it fails: each
/// reconciliation makes its directory current, so more means the store keeps changing
/// under the query. (A query may meet any number of stale directories: a listing of a
/// directory of many arrays that a mount left unlinked. Before, 64 reconciliations in
/// all were allowed, and such a listing failed with EIO: a reviewer's finding.)
const SAME_DIR_ROUNDS: usize = 8;

impl View {
    /// Answer tree query `query`: on a writable view, with the overlay reconciled with
    /// the store wherever the query finds it stale ([`Overlay::in_tree`]); a read-only
    /// view has no overlay to be stale.
    pub(super) fn in_tree<T>(&self, query: impl Fn(TreeRead<'_>) -> Result<T>) -> Result<T> {
        match self.overlay_opt() {
            Some(o) => o.in_tree(query),
            None => query(self.tree_read()),
        }
    }

    /// The child node `name` of `node`, `None` if there is none.
    pub(super) fn child(&self, path: &Path, node: &Node, name: &OsStr) -> Result<Option<Node>> {
        self.in_tree(|t| t.child(path, node, name))
    }

    /// [`TreeRead::stored_child`]: the child, less what is there only as the v2 view's
    /// fill value.
    pub(super) fn stored_child(
        &self,
        path: &Path,
        node: &Node,
        name: &OsStr,
    ) -> Result<Option<Node>> {
        self.in_tree(|t| t.stored_child(path, node, name))
    }

    /// What a store directory is: a presentable sharded array, or a plain directory.
    pub(super) fn classify_dir(&self, rel: PathBuf, dir_meta: EntryMeta) -> Result<Node> {
        self.in_tree(|t| t.classify_dir(rel.clone(), dir_meta))
    }

    /// Every entry of directory `ino` (without `.` and `..`), sorted by name.
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>> {
        self.in_tree(|t| t.readdir(ino))
    }

    /// `.zmetadata` of the group at `dir` (the v2 view; [`TreeRead::consolidated`]).
    pub(super) fn consolidated(&self, dir: &Path) -> Result<Vec<u8>> {
        self.in_tree(|t| t.consolidated(dir))
    }
}

impl<'a> Overlay<'a> {
    /// `.zmetadata` of the group at `dir`, the overlay reconciled ([`View::consolidated`]).
    pub(super) fn consolidated(&self, dir: &Path) -> Result<Vec<u8>> {
        self.in_tree(|t| t.consolidated(dir))
    }

    /// Answer tree query `query`, reconciling the overlay with the store wherever the
    /// query finds it stale, and asking again.
    fn in_tree<T>(&self, query: impl Fn(TreeRead<'a>) -> Result<T>) -> Result<T> {
        let mut seen: std::collections::HashMap<PathBuf, usize> = Default::default();
        loop {
            let answer = query(self.tree_read());
            self.drop_stale_kept();
            let Err(ViewError::Stale(what)) = answer else {
                return answer;
            };
            for dir in what.dirs() {
                let n = seen.entry(dir.clone()).or_default();
                *n += 1;
                if *n > SAME_DIR_ROUNDS {
                    return Err(ViewError::Io(std::io::Error::other(format!(
                        "{}: the store kept changing under a lookup ({SAME_DIR_ROUNDS} \
                         reconciliations)",
                        dir.display()
                    ))));
                }
            }
            self.reconcile(*what)?;
        }
    }

    fn reconcile(&self, what: Reconcile) -> Result<()> {
        if let Reconcile::Many(all) = what {
            return all.into_iter().try_for_each(|r| self.reconcile(r));
        }
        log::debug!("reconciling the overlay: {what:?}");
        let w = self.w;
        let meta_file = match self.tree.format {
            ViewFormat::V2 => MetaFile::Zarray,
            ViewFormat::V3 => MetaFile::ZarrJson,
        };
        match what {
            Reconcile::HeadlessDirMeta { rel, dir_meta } => {
                w.unlinked.headless_array_now(&rel, &dir_meta);
            }
            Reconcile::MetaBack { rel } => {
                remove_unlinked_meta(self.tree.store.as_ref(), &rel)?;
                w.unlinked.meta_written(&rel, meta_file);
            }
            Reconcile::HeadlessGone { rel } => w.unlinked.forget_headless(&rel),
            Reconcile::HeadlessChanged { array } => {
                if let Some(held) = w.unlinked.headless_array(&array.rel)
                    && held.replaced_by(&array)
                    && w.staging.holds(&array.rel)
                {
                    self.let_go_staged(&array.rel, REPLACED);
                }
                w.unlinked.headless_changed(&array);
                self.tree.arrays.insert(array);
            }
            Reconcile::Replaced { rel } => self.let_go_staged(&rel, REPLACED),
            Reconcile::UnlinkedPlain { rel, keys, doc } => {
                w.unlinked.make_plain_headless(&rel, keys, doc);
            }
            Reconcile::PlainMetaBack { rel } => {
                remove_unlinked_meta(self.tree.store.as_ref(), &rel)?;
                w.unlinked.plain_written_back(&rel);
            }
            Reconcile::PlainGone { rel } => w.unlinked.forget_plain(&rel),
            // (taken apart above)
            Reconcile::Many(_) => {}
            Reconcile::Unlinked { array } => {
                // Chunks staged for another array this mount knew at that path (another
                // mount replaced it and unlinked the new one's metadata) are not the new
                // one's (a reviewer's finding: they were packed into its shards).
                if let Some(old) = self.tree.arrays.get(&array.rel)
                    && old.replaced_by(&array)
                    && w.staging.holds(&array.rel)
                {
                    self.let_go_staged(&array.rel, REPLACED);
                }
                w.unlinked.make_headless(&array, meta_file);
                // Known to the chunk paths as any array is (before, a chunk written,
                // fsynced or removed in it got `ESTALE`: found by a reviewer).
                self.tree.arrays.insert(array);
            }
        }
        Ok(())
    }

    /// Remove the documents kept at an unlink that the tree found older than the
    /// metadata beside them (`TreeRead::classify`), each if it still is that document,
    /// still older than the metadata, and no array this mount holds unlinked (another
    /// unlink since, here or in another mount, kept a document of its own there: a
    /// reviewer's finding). Best effort: a failure is logged, and the query's answer
    /// stands.
    fn drop_stale_kept(&self) {
        let stale = std::mem::take(&mut *self.tree.stale_kept.lock());
        let store = self.tree.store.as_ref();
        for (rel, version) in stale {
            let kept = rel.join(crate::store::UNLINKED_META);
            let still = match (store.stat(&kept), store.stat(&rel.join("zarr.json"))) {
                (Ok(Some(k)), Ok(Some(j))) => k.version() == version && j.mtime > k.mtime,
                _ => false,
            };
            let held = self.w.unlinked.is_headless(&rel) || self.w.unlinked.is_plain_headless(&rel);
            if still
                && !held
                && let Err(e) = remove_unlinked_meta(store, &rel)
            {
                log::warn!("{}: left as it was: {e}", kept.display());
            }
        }
    }

    /// The node at a view path, walking from the root.
    pub(super) fn resolve(&self, path: &Path) -> Result<Option<Node>> {
        self.in_tree(|t| t.resolve(path))
    }

    /// The child node `name` of `node`, `None` if there is none.
    pub(super) fn child(&self, path: &Path, node: &Node, name: &OsStr) -> Result<Option<Node>> {
        self.in_tree(|t| t.child(path, node, name))
    }

    /// What a store directory is: a presentable sharded array, or a plain directory.
    pub(super) fn classify_dir(&self, rel: PathBuf, dir_meta: EntryMeta) -> Result<Node> {
        self.in_tree(|t| t.classify_dir(rel.clone(), dir_meta))
    }

    /// [`TreeRead::stored_child`], the overlay reconciled.
    pub(super) fn stored_child(
        &self,
        path: &Path,
        node: &Node,
        name: &OsStr,
    ) -> Result<Option<Node>> {
        self.in_tree(|t| t.stored_child(path, node, name))
    }

    /// Every entry of directory `ino` (without `.` and `..`), sorted by name.
    pub(super) fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>> {
        self.in_tree(|t| t.readdir(ino))
    }
}
