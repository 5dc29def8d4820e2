//! Listings of the key directories of a sharded array with `/`-separated keys
//! (`a/c/0/1`): the levels above the last list the in-grid prefixes of the shard
//! directories that have a chunk beneath; the last level lists the chunk files of the
//! shards in that directory, stored or staged. The array's own directory, flat keys and
//! the reasoning behind what a listing shows are in `listing.rs`.

use std::collections::HashMap;
use std::path::Path;

use super::TreeRead;
use super::listing::{LISTS_IN_FLIGHT, TREE_LIST_MAX, file};
use super::{DirEntry, Kind, Result, ShardedArray, ViewError};
use crate::store::{EntryKind, Reads};

impl TreeRead<'_> {
    /// The children of the key directory with leading inner coordinates `prefix`.
    pub(super) fn list_keys(&self, array: &ShardedArray, prefix: &[u64]) -> Result<Vec<DirEntry>> {
        let layout = &array.layout;
        let ndim = layout.ndim();
        let k = prefix.len();
        if k >= ndim {
            return Err(ViewError::NotDir);
        }
        let shard_prefix = array.shard_prefix(prefix);
        let dir = array.shard_dir_rel(&shard_prefix);
        let last = k + 1 == ndim;
        if k == 0 {
            self.list_tree_ahead(array, &dir);
        }
        // A key directory may exist only in memory (made by mkdir, or holding staged
        // chunks): no store directory is then no shard.
        let listed = match self.tree.store.list(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            other => other?,
        };
        let mut shard_coords: Vec<u64> = listed
            .into_iter()
            // Any kind at the shard level: a shard path that is not a regular file
            // lists its chunks, which read as EIO (never vanish silently).
            .filter(|e| last || e.kind == EntryKind::Dir)
            .filter_map(|e| {
                e.name
                    .to_str()
                    .and_then(|n| array.store_keys.parse_component(k, n))
            })
            .filter(|&s| s < layout.shard_counts()[k])
            .collect();
        shard_coords.sort_unstable();
        if last {
            self.list_chunk_files(array, prefix, &shard_prefix, shard_coords)
        } else {
            self.list_key_dirs(array, prefix, &shard_prefix, shard_coords)
        }
    }

    /// The array's key directory (`c`, store directory `dir`) listed, on a read-only
    /// mount of object storage: its shard directories are listed next, level by level (a
    /// LIST each, in series with the one before: `cp -r` waited 2 round trips before it
    /// learnt of a shard). Where the grid has fewer shards than a LIST's page holds, one
    /// LIST of every key below answers for all of them.
    fn list_tree_ahead(&self, array: &ShardedArray, dir: &Path) {
        let layout = &array.layout;
        if layout.ndim() >= 2 && self.overlay.is_none() && self.tree.caps.reads == Reads::Requests {
            let shards = layout
                .shard_counts()
                .iter()
                .try_fold(1u64, |n, &c| n.checked_mul(c));
            if shards.is_some_and(|n| n < TREE_LIST_MAX as u64) {
                // Best effort: a failure is met again by the listing that follows.
                let _ = self.tree.store.list_tree(dir, TREE_LIST_MAX);
            }
        }
    }

    /// The key directories at level `prefix.len()` (not the last) below `prefix`: those of
    /// the shards `shard_coords` (below `shard_prefix`) with a chunk under them.
    fn list_key_dirs(
        &self,
        array: &ShardedArray,
        prefix: &[u64],
        shard_prefix: &[u64],
        shard_coords: Vec<u64>,
    ) -> Result<Vec<DirEntry>> {
        let layout = &array.layout;
        let k = prefix.len();
        let ndim = layout.ndim();
        let mut out = Vec::new();
        if k + 2 == ndim && self.tree.caps.reads == Reads::Requests {
            // The shards one level down, whose indexes say which key directories
            // hold chunks.
            // Their directories listed side by side (at 30 ms a request, `ls c` of
            // a 2-shard-row array waited 2 LISTs in series; `has_chunks_under`
            // below finds these listings kept).
            let mut shards = Vec::new();
            for group in shard_coords.chunks(LISTS_IN_FLIGHT) {
                let listed = self.tree.list_side_by_side(array, shard_prefix, group);
                for (sp, listed) in listed {
                    let Ok(listed) = listed else { continue };
                    shards.extend(listed.iter().filter_map(|e| {
                        let t = e.name.to_str()?;
                        let t = array.store_keys.parse_component(k + 1, t)?;
                        Some([sp.as_slice(), &[t]].concat())
                    }));
                }
            }
            self.tree.ahead.indexes(array, shards);
        }
        let mut below = prefix.to_vec();
        below.push(0);
        for s in shard_coords {
            for i in layout.inner_range(k, s) {
                below[k] = i;
                if self.has_chunks_under(array, &below, false)? {
                    out.push(DirEntry {
                        ino: 0,
                        name: i.to_string().into(),
                        kind: Kind::Dir,
                    });
                }
            }
        }
        Ok(out)
    }

    /// The chunk files at the last level below `prefix`: those of the shards
    /// `shard_coords` (below `shard_prefix`) that are stored or staged.
    fn list_chunk_files(
        &self,
        array: &ShardedArray,
        prefix: &[u64],
        shard_prefix: &[u64],
        shard_coords: Vec<u64>,
    ) -> Result<Vec<DirEntry>> {
        let layout = &array.layout;
        let k = prefix.len();
        let mut out = Vec::new();
        // The last level: every chunk's state comes from the staged chunks under this
        // prefix (read once) or else from its shard's index (looked up once per shard),
        // not from a lookup per chunk.
        let staged: HashMap<Vec<u64>, bool> = match &self.overlay {
            Some(w) => w.staged_under(&array.rel, prefix).into_iter().collect(),
            None => HashMap::new(),
        };
        let mut coords = prefix.to_vec();
        coords.push(0);
        self.tree.ahead.indexes(
            array,
            shard_coords
                .iter()
                .map(|&s| [shard_prefix, &[s]].concat())
                .collect(),
        );
        for s in shard_coords {
            let mut shard = shard_prefix.to_vec();
            shard.push(s);
            let shard = self.tree.refresh_shard(array, &shard);
            for i in layout.inner_range(k, s) {
                coords[k] = i;
                let stored = match staged.get(&coords) {
                    Some(&exists) => exists,
                    None => layout
                        .locate(&coords)
                        .is_some_and(|loc| !matches!(shard.chunk(layout, &loc), Ok(None))),
                };
                if stored {
                    out.push(file(i.to_string().into()));
                }
            }
        }
        Ok(out)
    }
}
