//! The store's own directories as the tree meets them: files of their own in an array's
//! key directories (`a/c/README`, which a listing shows beside the keys, and which keep a
//! key directory with no chunk listed), the store directories a file of its own needs,
//! and the empty ones a removal leaves. A part of the tree that reads (and makes) store
//! directories only; which scratch files are stored as files of their own is `kept.rs`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Result, ViewError};
use crate::format::KeyPath;
use crate::store::Store;

/// The store's directories and files of their own, read through the store.
pub(super) struct OwnFiles {
    store: Arc<dyn Store>,
}

impl OwnFiles {
    pub(super) fn new(store: Arc<dyn Store>) -> OwnFiles {
        OwnFiles { store }
    }

    /// Make the store directories of view directory `dir` that are missing (a key
    /// directory has none until a shard or a file lies in it).
    pub(super) fn make_store_dirs(&self, dir: &Path) -> Result<()> {
        let mut at = PathBuf::new();
        for part in dir.iter() {
            at.push(part);
            match self.store.stat(&at)? {
                Some(m) if m.kind == crate::store::EntryKind::Dir => {}
                Some(_) => {
                    return Err(ViewError::Io(std::io::Error::from_raw_os_error(
                        libc::ENOTDIR,
                    )));
                }
                None => match self.store.create_dir(&at) {
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    res => res?,
                },
            }
        }
        Ok(())
    }

    /// Files of the store in the store directory at a key directory's view path `path`
    /// whose names are no keys (stored by `Overlay::keep_file`): `a/c/README`.
    pub(super) fn kept_in_key_dir(
        &self,
        path: &Path,
        is_key: impl Fn(&str) -> bool,
    ) -> Result<Vec<super::DirEntry>> {
        let listed = self.own_entries(path)?;
        Ok(listed
            .into_iter()
            .filter_map(|e| {
                let kind = match e.kind {
                    crate::store::EntryKind::File => super::Kind::File,
                    crate::store::EntryKind::Dir => super::Kind::Dir,
                    _ => return None,
                };
                let key = e.name.to_str().is_some_and(&is_key);
                (!key).then_some(super::DirEntry {
                    ino: 0,
                    name: e.name,
                    kind,
                })
            })
            .collect())
    }

    /// Whether the store directory `rel` of key directory `coords` of `array` holds
    /// files of their own (names that are no keys there), or a directory outside the grid
    /// with files; key directories below it are not looked into.
    pub(super) fn holds_kept_files(
        &self,
        array: &super::ShardedArray,
        coords: &[u64],
        rel: &Path,
    ) -> Result<bool> {
        let (enc, ndim) = (array.encoding(), array.layout.ndim());
        let listed = self.own_entries(rel)?;
        for e in listed {
            let Some(name) = e.name.to_str() else {
                return Ok(true);
            };
            match enc.child(ndim, Some(coords), name) {
                None => return Ok(true),
                Some(KeyPath::Chunk(_)) => {}
                // A key directory in the grid holds files of its own if one lies
                // anywhere below it: this is asked of key directories with no chunk
                // below (a listing shows the others anyway), so the walk meets no shard
                // with a chunk. Before, only one level was looked at, and a later
                // mount did not list a key directory whose files of their own lay two
                // levels down (`0/0/0.x.partial` of a 3-d array: found by the
                // reference test), though the store kept them. One outside the grid is
                // a plain directory, there if it holds files.
                Some(KeyPath::Dir(c)) if e.kind == crate::store::EntryKind::Dir => {
                    if self.key_dir_holds_files(array, &c, &rel.join(name))? {
                        return Ok(true);
                    }
                }
                Some(KeyPath::Dir(_)) => return Ok(true),
            }
        }
        Ok(false)
    }

    /// Whether the key directory `coords` of `array` (store directory `rel`), which no
    /// chunk lies below, is shown for files of their own: in the grid, while such files
    /// lie in it; outside the grid (a shrink left it there), as a plain directory while
    /// it holds files.
    pub(super) fn key_dir_holds_files(
        &self,
        array: &super::ShardedArray,
        coords: &[u64],
        rel: &Path,
    ) -> Result<bool> {
        let counts = array.layout.chunk_counts();
        if coords.iter().zip(counts).all(|(c, n)| c < n) {
            self.holds_kept_files(array, coords, rel)
        } else {
            self.has_files(rel)
        }
    }

    /// Whether store directory `rel` holds anything but directories, at any depth.
    pub(super) fn has_files(&self, rel: &Path) -> Result<bool> {
        let listed = self.own_entries(rel)?;
        for e in listed {
            if e.kind != crate::store::EntryKind::Dir || self.has_files(&rel.join(&e.name))? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Remove the directories below store directory `rel` that hold no file at any depth
    /// (not `rel` itself). Best effort: one that cannot go (a recovery record of
    /// shardfs's own in it) stays, and the caller's `rmdir` says `ENOTEMPTY`.
    pub(super) fn remove_empty_dirs(&self, rel: &Path) -> Result<()> {
        for e in self.own_entries(rel)? {
            let below = rel.join(&e.name);
            if e.kind == crate::store::EntryKind::Dir && !self.has_files(&below)? {
                self.remove_empty_dirs(&below)?;
                let _ = self.store.remove_dir(&below);
            }
        }
        Ok(())
    }

    /// The entries of store directory `rel` but shardfs's own files; none where it is
    /// no directory (a key directory with nothing of its own in the store).
    fn own_entries(&self, rel: &Path) -> Result<Vec<crate::store::ListEntry>> {
        match self.store.list(rel) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                Ok(Vec::new())
            }
            other => Ok(other?
                .into_iter()
                .filter(|e| !crate::store::is_internal(&e.name))
                .collect()),
        }
    }
}
