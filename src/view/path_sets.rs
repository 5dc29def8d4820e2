//! Two sets of paths the overlay keeps, each behind its methods, with no lock outside:
//! the scratch files stored as files of their own ([`KeptPaths`], which kept.rs stores
//! and unstores) and what this mount decided for arrays whose metadata it saw written
//! ([`ArrayChoices`], which adopt.rs reads). Leaves: nothing of the view is imported.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

/// A directory moved from `from` to `to`, replacing what was there (an empty directory):
/// the entries of `map` at or below `to` go, and those at or below `from` follow to the
/// new path, their values passed through `moved` (`None`: let go). Every table of the
/// overlay keyed by path follows a move this one way.
pub(super) fn move_entries<V>(
    map: &mut HashMap<PathBuf, V>,
    from: &Path,
    to: &Path,
    mut moved: impl FnMut(V) -> Option<V>,
) {
    map.retain(|p, _| !p.starts_with(to));
    let below: Vec<PathBuf> = map
        .keys()
        .filter(|p| p.starts_with(from))
        .cloned()
        .collect();
    for old in below {
        let value = map.remove(&old).expect("listed above");
        let rest = old.strip_prefix(from).expect("filtered above");
        if let Some(value) = moved(value) {
            map.insert(to.join(rest), value);
        }
    }
}

/// [`move_entries`] for a set of paths.
pub(super) fn move_paths(set: &mut HashSet<PathBuf>, from: &Path, to: &Path) {
    set.retain(|p| !p.starts_with(to));
    *set = set
        .drain()
        .map(|p| match p.strip_prefix(from) {
            Ok(rest) => to.join(rest),
            Err(_) => p,
        })
        .collect();
}

/// View paths of scratch files stored as files of their own: their stored copy goes
/// with their name. Held by `Overlay::keep_file` (kept.rs) while it stores one, so that a rename
/// or unlink of it waits, and then removes what was stored (`Overlay::unkeep_file`).
#[derive(Default)]
pub(super) struct KeptPaths(Mutex<HashSet<PathBuf>>);

impl KeptPaths {
    /// The set, held: a file stored meanwhile is entered through the guard.
    pub(super) fn hold(&self) -> parking_lot::MutexGuard<'_, HashSet<PathBuf>> {
        self.0.lock()
    }

    /// `path` has a stored copy (a file of its own of the store it replaced).
    pub(super) fn insert(&self, path: &Path) {
        self.0.lock().insert(path.to_path_buf());
    }

    /// `path`'s name went; whether a copy of it was stored.
    pub(super) fn remove(&self, path: &Path) -> bool {
        self.0.lock().remove(path)
    }

    /// The files below view directory `dir`, which moved, were stored before the move.
    pub(super) fn let_go_under(&self, dir: &Path) {
        self.0.lock().retain(|p| !p.starts_with(dir));
    }
}

/// What this mount decided for arrays whose metadata it saw written, which
/// `Overlay::adopt_new_array` (adopt.rs) reads: arrays a client writes sharded itself (shown as
/// stored), and unsharded arrays of the store whose `zarr.json` is being rewritten (kept
/// unsharded). By store directory; both follow a directory moved through the mount.
#[derive(Default)]
pub(super) struct ArrayChoices {
    /// Arrays whose sharded `zarr.json` was written through this mount (zarr-python 3
    /// or tensorstore creating a sharded array): shown as stored, shard files at their
    /// keys, for the rest of the mount, so that their writer reads back what it wrote.
    as_stored: Mutex<HashSet<PathBuf>>,
    /// Store directories of unsharded arrays whose `zarr.json` is being rewritten (an
    /// attribute, a resize): they stay unsharded, as they are in the store. Only a new
    /// array is stored sharded.
    unsharded: Mutex<HashSet<PathBuf>>,
}

impl ArrayChoices {
    /// Show the array at `dir` as stored from now on.
    pub(super) fn show_as_stored(&self, dir: &Path) {
        self.as_stored.lock().insert(dir.to_path_buf());
    }

    pub(super) fn shown_as_stored(&self, dir: &Path) -> bool {
        self.as_stored.lock().contains(dir)
    }

    /// `dir` is no array shown as stored any more (removed, or its metadata replaced by
    /// an unsharded array's); whether it was one.
    pub(super) fn forget_as_stored(&self, dir: &Path) -> bool {
        self.as_stored.lock().remove(dir)
    }

    /// The `zarr.json` at `dir` is an unsharded array's that is being rewritten.
    pub(super) fn keep_unsharded(&self, dir: &Path) {
        self.unsharded.lock().insert(dir.to_path_buf());
    }

    /// Whether the metadata that landed at `dir` rewrote an unsharded array's (which
    /// stays unsharded); asked once per landing.
    pub(super) fn take_keep_unsharded(&self, dir: &Path) -> bool {
        self.unsharded.lock().remove(dir)
    }

    /// The directory at store path `from` moved to `to` (replacing what was there).
    pub(super) fn rebase(&self, from: &Path, to: &Path) {
        for set in [&self.as_stored, &self.unsharded] {
            move_paths(&mut set.lock(), from, to);
        }
    }
}
