//! Key directories this mount shows though they may hold no chunk ([`KeyDirs`]): made by
//! `mkdir`, or emptied by `unlink`/`rmdir` below them, until they are removed (as on any
//! file system, a directory stays when its last file goes). Part of the overlay: what
//! this mount changed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

/// The key directories shown without a chunk below them: (array directory, key prefix).
/// Owns its lock; a leaf (nothing is taken under it).
#[derive(Default)]
pub(super) struct KeyDirs(Mutex<HashSet<(PathBuf, Vec<u64>)>>);

/// Whether `coords` lie in a grid of `counts` chunks.
fn in_grid(coords: &[u64], counts: &[u64]) -> bool {
    coords.iter().zip(counts).all(|(c, n)| c < n)
}

impl KeyDirs {
    /// The key directory `prefix` of `array` exists (made, or left emptied).
    pub(super) fn made(&self, array: &Path, prefix: Vec<u64>) {
        self.0.lock().insert((array.to_path_buf(), prefix));
    }

    /// Every one of `prefixes` of `array` exists.
    pub(super) fn made_all(&self, array: &Path, prefixes: impl IntoIterator<Item = Vec<u64>>) {
        let mut set = self.0.lock();
        set.extend(prefixes.into_iter().map(|p| (array.to_path_buf(), p)));
    }

    /// The chunk at `coords` of `array` went (unlinked, renamed away): its key directory
    /// stays, empty, until it is removed itself.
    pub(super) fn chunk_gone(&self, array: &Path, coords: &[u64]) {
        if let Some((_, parent)) = coords.split_last() {
            self.made(array, parent.to_vec());
        }
    }

    /// `rmdir` of the key directory `prefix` of `array`: it and those below it go; its
    /// parent stays until it is removed itself.
    pub(super) fn removed(&self, array: &Path, prefix: &[u64]) {
        let mut set = self.0.lock();
        set.retain(|(a, c)| !(a == array && c.starts_with(prefix)));
        if let Some((_, parent)) = prefix.split_last() {
            set.insert((array.to_path_buf(), parent.to_vec()));
        }
    }

    /// `array` is no array any more (removed, its metadata unlinked): none of its go on.
    pub(super) fn forget_array(&self, array: &Path) {
        self.0.lock().retain(|(a, _)| a != array);
    }

    /// `array` now has a grid of `counts` chunks: those outside it are no key
    /// directories any more.
    pub(super) fn keep_in_grid(&self, array: &Path, counts: &[u64]) {
        self.0
            .lock()
            .retain(|(a, c)| a != array || in_grid(c, counts));
    }

    /// The key directories of `array` inside a grid of `counts` chunks (one a shrink left
    /// outside is no key directory now: a lookup finds none).
    pub(super) fn of_array(&self, array: &Path, counts: &[u64]) -> Vec<Vec<u64>> {
        self.0
            .lock()
            .iter()
            .filter(|(a, c)| a == array && in_grid(c, counts))
            .map(|(_, c)| c.clone())
            .collect()
    }

    /// Whether a key directory of `array` with leading coordinates `prefix` is here.
    pub(super) fn any_under(&self, array: &Path, prefix: &[u64]) -> bool {
        self.0
            .lock()
            .iter()
            .any(|(a, c)| a == array && c.starts_with(prefix))
    }

    /// The store directory `from` moved to `to` (replacing what was there): arrays
    /// below it follow.
    pub(super) fn rebase(&self, from: &Path, to: &Path) {
        let mut set = self.0.lock();
        set.retain(|(a, _)| !a.starts_with(to));
        *set = set
            .drain()
            .map(|(a, c)| match a.strip_prefix(from) {
                Ok(rest) => (to.join(rest), c),
                Err(_) => (a, c),
            })
            .collect();
    }
}
