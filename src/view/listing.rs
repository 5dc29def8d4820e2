//! Listings of array and key directories, from the shard files that exist.
//!
//! A key directory exists while a chunk lies below it (stored, or staged by this mount) or
//! while it is one that `mkdir` made: so `rm -rf` of an array of any rank empties and
//! removes every level, and a listing never shows a directory with nothing in it. A key
//! directory with more levels below lists the in-grid prefixes of the shard directories
//! found that have a chunk beneath; that reads shard indices only until the first chunk
//! is found, which in a dense array is the first index. The last level lists files, so
//! it reads the indices of the shards in that one directory and lists the stored chunks.
//! A shard whose index is corrupt lists all its in-grid chunks: reading them fails with
//! `EIO`, so a copy of the tree fails loudly instead of silently filling them in.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;

use super::Tree;
use super::TreeRead;
use super::{DirEntry, Kind, Node, Result, ShardedArray, ViewError};
use crate::store::shard::Shard;
use crate::store::{EntryKind, Reads};

/// Store listings a listing of key directories makes side by side.
pub(super) const LISTS_IN_FLIGHT: usize = 16;

/// The most keys one LIST of everything below an array's key directory may find to
/// answer for the listings of its shard directories ([`crate::store::Store::list_tree`]): under one
/// page of an S3 LIST (1,000 keys), so that it is one request.
pub(super) const TREE_LIST_MAX: usize = 999;

impl TreeRead<'_> {
    pub(super) fn list_array(&self, array: &ShardedArray) -> Result<Vec<DirEntry>> {
        let enc = array.encoding();
        let ndim = array.layout.ndim();
        // Pass-through entries: everything outside the key namespaces but metadata.
        let mut out = if array.draft {
            Vec::new()
        } else {
            self.list_store(&array.rel, |name| {
                !self.tree.hidden_in_array(array, name)
                    && name
                        .to_str()
                        .and_then(|n| enc.child(ndim, None, n))
                        .is_none()
            })?
        };
        out.extend(
            self.tree
                .format
                .array_files()
                .iter()
                .filter(|&&f| self.meta_shown(array, f))
                .map(|f| file(f.name().into())),
        );
        if ndim == 0 {
            if self.stored(array, &[])? {
                out.push(file(enc.encode(&[]).into()));
            }
        } else if let Some(root) = enc.root_component(ndim) {
            if self.lists_root_key_dir(array, root)? {
                out.push(DirEntry {
                    ino: 0,
                    name: root.into(),
                    kind: Kind::Dir,
                });
            }
        } else if enc.nested() {
            let keys = self.list_keys(array, &[])?;
            let listed: std::collections::HashSet<std::ffi::OsString> =
                keys.iter().map(|e| e.name.clone()).collect();
            out.extend(keys);
            out.extend(self.tree.kept_key_dirs(array, &listed)?);
        } else {
            out.extend(self.list_flat(array)?);
        }
        Ok(out)
    }

    /// Whether an array's listing shows its top key directory `root` (`c`).
    fn lists_root_key_dir(&self, array: &ShardedArray, root: &str) -> Result<bool> {
        if self.overlay.is_none() && self.tree.caps.reads == Reads::Requests && !array.draft {
            // Read-only object storage (see `has_chunks_under`): the top key directory
            // is listed where the store lists it, from the listing above.
            return Ok(self
                .tree
                .store
                .list(&array.rel)?
                .iter()
                .any(|e| e.kind == EntryKind::Dir && e.name == root));
        }
        Ok(self.has_chunks_under(array, &[], false)?
            || self
                .tree
                .own
                .holds_kept_files(array, &[], &array.rel.join(root))?)
    }

    /// Flat encodings (separator `.`): every stored chunk of every shard in the array
    /// directory. This reads every shard index of the array: with a flat encoding all
    /// keys live in one directory, so listing it means listing every chunk.
    fn list_flat(&self, array: &ShardedArray) -> Result<Vec<DirEntry>> {
        let enc = array.encoding();
        let layout = &array.layout;
        let mut out = Vec::new();
        let listed = match self.tree.store.list(&array.data_rel) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && array.draft => Vec::new(),
            other => other?,
        };
        for e in listed {
            let shard = match e
                .name
                .to_str()
                .and_then(|n| array.store_keys.child(layout.ndim(), None, n))
            {
                Some(crate::format::KeyPath::Chunk(c)) if layout.shard_in_grid(&c) => c,
                _ => continue,
            };
            self.tree.refresh_shard(array, &shard);
            for coords in layout.chunks_of_shard(&shard) {
                if self.stored(array, &coords)? {
                    out.push(file(enc.encode(&coords).into()));
                }
            }
        }
        Ok(out)
    }

    /// Whether the key directory with leading inner coordinates `prefix` has anything
    /// below it: a chunk staged by this mount, a directory made by `mkdir`, or a chunk
    /// stored in a shard (staged deletions count as gone). Stops at the first found.
    ///
    /// A `lookup` does not read a shard's index only to know this when the shard lies
    /// wholly inside the key directory (every chunk of it has the leading coordinates
    /// `prefix`, as `c` and every shard, or `c/3` and the shards of row 3 when shards are
    /// one chunk high): the shard file exists, so a chunk of it does (a lookup of `c`
    /// would otherwise read the first shard's index, a GET on object storage, before the
    /// chunk asked for). The answer is the same whether the index is cached or not, so
    /// a directory never comes and goes with the cache. Where the shard reaches past the
    /// directory (`c/3` in a shard of rows 0-15), only its index can tell: a lookup
    /// that said yes there would make `mkdir c/3` fail with EEXIST and a `stat` right
    /// after say ENOENT (os.makedirs, tensorstore). A read-only view of object storage,
    /// where nothing is made and an index costs a request, says yes there too (the answer
    /// is still the same whatever is cached), so a cold read of a chunk reads no index
    /// but its own shard's: a key directory a shard covers may then be looked up,
    /// although nothing of it is stored, and be empty. A listing reads the indices.
    pub(super) fn has_chunks_under(
        &self,
        array: &ShardedArray,
        prefix: &[u64],
        lookup: bool,
    ) -> Result<bool> {
        let staged: HashMap<Vec<u64>, bool> = match &self.overlay {
            Some(w) if w.has_keys_under(array, prefix) => return Ok(true),
            Some(w) => w.staged_under(&array.rel, prefix).into_iter().collect(),
            None => HashMap::new(),
        };
        // The lookup of a key directory in the grid (the caller checked) on a read-only
        // mount of object storage: there. The lookup of a chunk below it finds what is
        // stored (its shard's open, one GET of the index); walking the shard directories
        // down to a first shard cost a LIST per level for every cold chunk, and a LIST
        // per row of shards in series with a reader in key order (issue 34). A key
        // directory with nothing below is then found, empty, and not listed in its
        // parent (as the v2 view's key directories of the fill value).
        //
        // A read-only mount of object storage answers listings as lookups (below): a key
        // directory above the chunk files is listed where a stored shard covers it,
        // reading no index (`ls c` of a 4-shard array cost a LIST, then a HEAD and a GET
        // per shard, 3 round trips before `cp -r` read a byte), and so a listing shows
        // what a lookup finds.
        let ro_requests = self.overlay.is_none() && self.tree.caps.reads == Reads::Requests;
        let quick = lookup || ro_requests;
        if lookup && ro_requests {
            return Ok(true);
        }
        let layout = &array.layout;
        let mut shard = array.shard_prefix(prefix);
        self.tree
            .any_shard_below(array, &mut shard, &mut |view, shard| {
                let inside = (0..prefix.len()).all(|d| {
                    let r = layout.inner_range(d, shard[d]);
                    r.start == prefix[d] && r.end == prefix[d] + 1
                });
                if quick && staged.is_empty() && (inside || ro_requests) {
                    return Ok(true);
                }
                let index = view.refresh_shard(array, shard);
                Ok(layout.chunks_of_shard(shard).into_iter().any(|c| {
                    c.starts_with(prefix)
                        && !staged.contains_key(&c)
                        && layout
                            .locate(&c)
                            .is_some_and(|loc| !matches!(index.chunk(layout, &loc), Ok(None)))
                }))
            })
    }

    /// Whether the chunk at `coords` is listed: stored, or in a shard that cannot be read.
    fn stored(&self, array: &ShardedArray, coords: &[u64]) -> Result<bool> {
        match self.chunk(array, coords, false) {
            Ok(_) => Ok(true),
            Err(ViewError::NotFound) => Ok(false),
            Err(ViewError::Shard { .. }) => Ok(true),
            Err(e) => Err(e),
        }
    }
}

impl Tree {
    /// Key directories of a nested encoding's first level that hold no chunk (not in
    /// `listed`) but files of their own (the store directory at their path:
    /// `super::kept`), and those outside the grid that hold files. Before, one a shrink
    /// left outside the grid was not listed here, though it was in a key directory
    /// below: in the v2 view, whose keys start in the array's directory, its files were
    /// stored and never listed (found by the reference test).
    fn kept_key_dirs(
        &self,
        array: &ShardedArray,
        listed: &std::collections::HashSet<std::ffi::OsString>,
    ) -> Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        if array.draft {
            return Ok(out);
        }
        let (enc, ndim) = (array.encoding(), array.layout.ndim());
        for e in self.store.list(&array.rel).unwrap_or_default() {
            let Some(name) = e.name.to_str() else {
                continue;
            };
            if e.kind != EntryKind::Dir || listed.contains(&e.name) {
                continue;
            }
            if let Some(crate::format::KeyPath::Dir(c)) = enc.child(ndim, None, name)
                && self
                    .own
                    .key_dir_holds_files(array, &c, &array.rel.join(name))?
            {
                out.push(DirEntry {
                    ino: 0,
                    name: e.name,
                    kind: Kind::Dir,
                });
            }
        }
        Ok(out)
    }

    /// The store's listings of the shard directories `prefix` + `s` for each `s` of
    /// `group`, side by side. Each thread serves this operation (its requests get what
    /// is left of `--s3-timeout`, 1 s during an outage), and an answer to any of them
    /// counts for the operation as an answer to its own request would. Where no thread
    /// can be started, the listing is made here.
    pub(super) fn list_side_by_side(
        &self,
        array: &ShardedArray,
        prefix: &[u64],
        group: &[u64],
    ) -> Vec<(Vec<u64>, std::io::Result<Vec<crate::store::ListEntry>>)> {
        use crate::store::operation;
        let op = operation::current();
        let list = |sp: Vec<u64>| {
            let listed = self.store.list(&array.shard_dir_rel(&sp));
            (sp, listed)
        };
        let listed: Vec<_> = std::thread::scope(|scope| {
            let lists: Vec<_> = group
                .iter()
                .map(|&s| {
                    let sp = [prefix, &[s]].concat();
                    std::thread::Builder::new()
                        .spawn_scoped(scope, move || {
                            let _op = operation::adopt(op);
                            list(sp.clone())
                        })
                        .map_err(|_| [prefix, &[s]].concat())
                })
                .collect();
            lists
                .into_iter()
                .map(|l| match l {
                    Ok(thread) => thread.join().unwrap_or_else(|_| {
                        (
                            Vec::new(),
                            Err(std::io::Error::other("listing thread panicked")),
                        )
                    }),
                    Err(sp) => list(sp),
                })
                .collect()
        });
        if listed.iter().any(|(_, l)| l.is_ok()) {
            operation::progressed();
        }
        listed
    }

    /// Whether `found` holds for a shard whose leading coordinates are `shard`, walking
    /// the store's shard directories depth first; stops at the first (a `found` that never holds visits them all).
    pub(super) fn any_shard_below(
        &self,
        array: &ShardedArray,
        shard: &mut Vec<u64>,
        found: &mut dyn FnMut(&Tree, &[u64]) -> Result<bool>,
    ) -> Result<bool> {
        let layout = &array.layout;
        let k = shard.len();
        if k == layout.ndim() {
            return found(self, shard);
        }
        // Flat store keys (`0.1.1`, separator `.`): every shard is a file of the array's
        // data directory, at no level of directories (a walk by levels found none, and a
        // shrink deleted no stored chunk outside its grid: a grow brought them back).
        if k == 0 && !array.store_keys.nested() && layout.ndim() > 1 {
            let listed = match self.store.list(&array.data_rel) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
                other => other?,
            };
            for e in listed {
                let Some(crate::format::KeyPath::Chunk(c)) = e
                    .name
                    .to_str()
                    .and_then(|n| array.store_keys.child(layout.ndim(), None, n))
                else {
                    continue;
                };
                if layout.shard_in_grid(&c) && found(self, &c)? {
                    return Ok(true);
                }
            }
            return Ok(false);
        }
        let dir = array.shard_dir_rel(shard);
        let last = k + 1 == layout.ndim();
        let listed = match self.store.list(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            other => other?,
        };
        for e in listed {
            let s = match e.name.to_str() {
                Some(n) if last || e.kind == EntryKind::Dir => {
                    array.store_keys.parse_component(k, n)
                }
                _ => None,
            };
            let Some(s) = s.filter(|&s| s < layout.shard_counts()[k]) else {
                continue;
            };
            shard.push(s);
            let hit = self.any_shard_below(array, shard, found)?;
            shard.pop();
            if hit {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Reload a shard's index if its file changed since it was cached (a listing is where
    /// a reader first meets chunks written by someone else).
    pub(super) fn refresh_shard(&self, array: &ShardedArray, shard: &[u64]) -> Arc<Shard> {
        let rel = array.shard_rel(shard);
        self.shards
            .get(self.store.as_ref(), &rel, &array.layout, true)
    }
}

impl TreeRead<'_> {
    /// A store directory in the v2 view: `zarr.json` hidden, `.zgroup` and `.zattrs` for
    /// a group, arrays without a v2 form left out.
    pub(super) fn list_v2_dir(&self, rel: &Path) -> Result<Vec<DirEntry>> {
        if let Some(listing) = self.list_plain(rel) {
            return listing;
        }
        let mut out = Vec::new();
        // Children the overlay is stale about, reconciled all at once before the listing
        // is asked again (see `reconcile.rs`).
        let mut stale = Vec::new();
        for e in self.list_store(rel, |n| {
            n != "zarr.json" && n != crate::format::v2::ZMETADATA
        })? {
            if e.kind == Kind::Dir {
                let child = rel.join(&e.name);
                let shown = match self.tree.store.stat(&child)? {
                    Some(m) => match self.classify(child, m) {
                        Ok(node) => node.is_some(),
                        Err(ViewError::Stale(r)) => {
                            stale.push(*r);
                            continue;
                        }
                        Err(e) => return Err(e),
                    },
                    None => false,
                };
                if !shown {
                    continue;
                }
            }
            out.push(e);
        }
        if !stale.is_empty() {
            return Err(super::reconcile::Reconcile::Many(stale).into());
        }
        if self.has_zmetadata(rel)? {
            out.push(file(crate::format::v2::ZMETADATA.into()));
        }
        let hidden = self.zattrs_hidden(rel);
        if self.tree.group_docs.stored(rel)?.is_some() {
            out.extend(
                self.tree
                    .format
                    .group_files()
                    .iter()
                    .filter(|f| !(hidden && **f == super::MetaFile::Zattrs))
                    .map(|f| file(f.name().into())),
            );
        } else if !hidden && self.tree.group_docs.kept_zattrs(rel)? {
            // Its `.zgroup` unlinked: its `.zattrs` stays, as on a plain directory.
            out.push(file(super::MetaFile::Zattrs.name().into()));
        }
        Ok(out)
    }

    /// `.zmetadata` of the group at `dir` (the v2 view): every metadata document of the
    /// group and of the groups and arrays below it, as the view shows them now, in zarr
    /// 2's consolidated format (`zarr.consolidate_metadata` writes the same).
    pub(super) fn consolidated(&self, dir: &Path) -> Result<Vec<u8>> {
        use crate::format::v2;
        let mut meta = serde_json::Map::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(at) = todo.pop() {
            let prefix = at
                .strip_prefix(dir)
                .unwrap_or(&at)
                .to_string_lossy()
                .into_owned();
            let key = |f: &str| {
                if prefix.is_empty() {
                    f.to_string()
                } else {
                    format!("{prefix}/{f}")
                }
            };
            let mut array = false;
            for f in [v2::ZGROUP, v2::ZARRAY, v2::ZATTRS] {
                let Some(bytes) = self.view_doc(&at.join(f))? else {
                    continue;
                };
                array |= f == v2::ZARRAY;
                // A document that is no JSON (a writer's, cut short) is left out, as zarr
                // 2 would fail on it.
                if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                    meta.insert(key(f), doc);
                }
            }
            if array {
                continue;
            }
            let Some(Node::Dir { rel }) = self.resolve(&at)? else {
                continue;
            };
            for e in self.list_v2_dir(&rel)? {
                if e.kind == Kind::Dir {
                    todo.push(at.join(&e.name));
                }
            }
        }
        let doc = serde_json::json!({"metadata": meta, "zarr_consolidated_format": 1});
        Ok(v2::to_bytes(&doc))
    }

    /// The bytes of metadata file `path` of the view, if it is one.
    fn view_doc(&self, path: &Path) -> Result<Option<Vec<u8>>> {
        Ok(match self.resolve(path)? {
            Some(Node::ArrayMeta { array, file }) => {
                Some(self.tree.current(&array).meta_bytes(file).to_vec())
            }
            Some(Node::GroupMeta { dir, file }) => Some(self.group_meta(&dir, file)?),
            Some(Node::File { rel }) => self.tree.read_small(&rel)?,
            _ => None,
        })
    }

    /// A group of a draft store: its metadata files, its groups and arrays.
    pub(super) fn list_draft_group(&self, path: &Path) -> Vec<DirEntry> {
        self.refresh_draft();
        let Some(tree) = self.tree.draft_tree() else {
            return Vec::new();
        };
        let Some(group) = tree.groups.get(path) else {
            return Vec::new();
        };
        let mut out: Vec<DirEntry> = self
            .tree
            .format
            .group_files()
            .iter()
            .map(|f| file(f.name().into()))
            .collect();
        out.extend(group.children.iter().map(|(name, kind)| DirEntry {
            ino: 0,
            name: name.clone(),
            kind: *kind,
        }));
        out
    }
}

pub(super) fn file(name: OsString) -> DirEntry {
    DirEntry {
        ino: 0,
        name,
        kind: Kind::File,
    }
}
