//! Times set through the mount (`touch -d`, `rsync -a`, `futimens`): shown while the file
//! is unchanged, for the mount's lifetime, never stored (docs/SEMANTICS.md, "The tree, as
//! clients use it"). Part of the overlay: what this mount changed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use parking_lot::Mutex;

/// Times set on a file: shown while its own modification time is still `base`
/// ([`super::Overlay::own_mtime`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct SetTimes {
    pub(super) base: SystemTime,
    pub(super) atime: SystemTime,
    pub(super) mtime: SystemTime,
}

/// The times set on files, by view path. Owns its lock; a leaf (nothing is taken under
/// it).
#[derive(Default)]
pub(super) struct TimesSet(Mutex<HashMap<PathBuf, SetTimes>>);

impl TimesSet {
    /// Nothing was set on any file (a getattr then looks no further).
    pub(super) fn is_empty(&self) -> bool {
        self.0.lock().is_empty()
    }

    /// What was set on `path`, whether or not it is still shown.
    pub(super) fn get(&self, path: &Path) -> Option<SetTimes> {
        self.0.lock().get(path).copied()
    }

    /// What was set on `path`, if its own modification time is still `own`.
    pub(super) fn shown(&self, path: &Path, own: SystemTime) -> Option<SetTimes> {
        self.0.lock().get(path).copied().filter(|t| t.base == own)
    }

    pub(super) fn set(&self, path: &Path, times: SetTimes) {
        self.0.lock().insert(path.to_path_buf(), times);
    }

    /// Nothing set is shown at `path` any more.
    pub(super) fn forget(&self, path: &Path) {
        self.0.lock().remove(path);
    }

    /// The directory at view path `from` moved to `to` (replacing what was there): what
    /// was set below it follows.
    pub(super) fn rebase(&self, from: &Path, to: &Path) {
        super::path_sets::move_entries(&mut self.0.lock(), from, to, Some);
    }
}
