//! Path resolution: what node a name is (store entries, arrays, key directories,
//! chunks, metadata, the v2 view's fill value, draft groups), the node at a path, and
//! where a chunk's bytes are now (staged, or in its shard). The arrays met so far are
//! kept in the array registry ([`ArrayRegistry`]); what a store directory is, is
//! `array_load.rs`; group metadata the view shows is `group_docs.rs`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::{self, KeyPath};
use crate::store::EntryKind;

use super::Tree;
use super::TreeRead;
use super::*;

/// The array registry: the current metadata of every sharded array met so far, by store
/// path. Nodes carry the array as it was when looked up and refresh it from here.
#[derive(Default)]
pub(super) struct ArrayRegistry {
    arrays: parking_lot::RwLock<std::collections::HashMap<PathBuf, Arc<ShardedArray>>>,
    /// Arrays whose refusal was logged, so that it is logged once.
    warned: Mutex<HashSet<PathBuf>>,
}

impl ArrayRegistry {
    /// The current metadata of the array at store path `rel`.
    pub(super) fn get(&self, rel: &Path) -> Option<Arc<ShardedArray>> {
        self.arrays.read().get(rel).cloned()
    }

    pub(super) fn insert(&self, array: Arc<ShardedArray>) {
        self.arrays.write().insert(array.rel.clone(), array);
    }

    pub(super) fn remove(&self, rel: &Path) {
        self.arrays.write().remove(rel);
    }

    /// Forget every array at or below store path `rel` (it was renamed).
    pub(super) fn remove_under(&self, rel: &Path) {
        self.arrays.write().retain(|a, _| !a.starts_with(rel));
    }

    /// Whether this is the first refusal of `rel` (to be logged).
    pub(super) fn first_warning(&self, rel: &Path) -> bool {
        self.warned.lock().insert(rel.to_path_buf())
    }
}

impl TreeRead<'_> {
    /// The node at a view path, walking from the root.
    pub(super) fn resolve(&self, path: &Path) -> Result<Option<Node>> {
        let (_, mut node) = self.tree.node(super::ROOT_INO)?;
        let mut cur = PathBuf::new();
        for part in path.iter() {
            match self.child(&cur, &node, part)? {
                Some(n) => node = n,
                None => return Ok(None),
            }
            cur.push(part);
        }
        Ok(Some(node))
    }

    /// The child node `name` of `node`, `None` if there is none.
    pub(super) fn child(&self, path: &Path, node: &Node, name: &OsStr) -> Result<Option<Node>> {
        if path.as_os_str().is_empty() && name == STATS_FILE {
            return Ok(Some(Node::Stats));
        }
        if let (Some(w), Node::ArrayDir { array } | Node::KeyDir { array, .. }) =
            (&self.overlay, node)
        {
            let child = path.join(name);
            if w.scratch_len(&child).is_some() {
                let parent = match node {
                    Node::KeyDir { coords, .. } => Some(coords.clone()),
                    _ => None,
                };
                return Ok(Some(Node::Scratch {
                    path: child,
                    array: self.tree.current(array),
                    parent,
                }));
            }
        }
        match node {
            Node::Stats | Node::PlainFill { .. } | Node::Consolidated { .. } => {
                Err(ViewError::NotDir)
            }
            Node::PlainFillDir { rel, .. } => Ok(self.plain_fill_at(&rel.join(name))),
            Node::Container(c) => self.tree.containers.child(c, name),
            Node::Dir { rel } if self.tree.format == ViewFormat::V2 => self.v2_dir_child(rel, name),
            Node::Dir { rel } => self.store_child(rel, name),
            Node::DraftGroup { path } => Ok(self.draft_child(path, name)),
            Node::ArrayDir { array } => {
                let array = &self.tree.current(array);
                if let Some(file) = MetaFile::from_name(name)
                    && self.tree.format.array_files().contains(&file)
                {
                    return Ok(self.meta_shown(array, file).then(|| Node::ArrayMeta {
                        array: array.clone(),
                        file,
                    }));
                }
                let ndim = array.layout.ndim();
                match name
                    .to_str()
                    .and_then(|n| array.encoding().child(ndim, None, n))
                {
                    Some(kp) => self.key_node(array, kp),
                    None if array.draft || self.tree.hidden_in_array(array, name) => Ok(None),
                    None => self.store_child(&array.rel, name),
                }
            }
            Node::KeyDir { array, coords } => {
                let array = &self.tree.current(array);
                let kp = name
                    .to_str()
                    .and_then(|n| array.encoding().child(array.layout.ndim(), Some(coords), n));
                match kp {
                    Some(kp) => self.key_node(array, kp),
                    // A file of its own stored there (`super::kept`).
                    None if crate::store::is_internal(name) => Ok(None),
                    None => Ok(match self.tree.store.stat(&path.join(name))? {
                        Some(m) if m.kind == EntryKind::File => Some(Node::File {
                            rel: path.join(name),
                        }),
                        _ => None,
                    }),
                }
            }
            Node::File { .. }
            | Node::Symlink { .. }
            | Node::ArrayMeta { .. }
            | Node::GroupMeta { .. }
            | Node::Chunk { .. }
            | Node::Scratch { .. } => Err(ViewError::NotDir),
        }
    }

    /// A child of a store directory in the v2 view: `zarr.json` is hidden; a group has
    /// `.zgroup` and `.zattrs`; arrays without a v2 form are left out.
    pub(super) fn v2_dir_child(&self, rel: &Path, name: &OsStr) -> Result<Option<Node>> {
        if let Some(child) = self.plain_child(rel, name) {
            return child;
        }
        if name == format::v2::ZMETADATA {
            // Made for every group, whatever the store holds under that name.
            return Ok(self.has_zmetadata(rel)?.then(|| Node::Consolidated {
                dir: rel.to_path_buf(),
            }));
        }
        match MetaFile::from_name(name) {
            Some(MetaFile::ZarrJson) => return Ok(None),
            Some(file) => {
                // A v2 writer's own file (taken in when it is closed) wins.
                if let Some(m) = self.tree.store.stat(&rel.join(name))?
                    && m.kind == EntryKind::File
                {
                    return Ok(Some(Node::File {
                        rel: rel.join(name),
                    }));
                }
                let hidden = file == MetaFile::Zattrs && self.zattrs_hidden(rel);
                let is_group = file != MetaFile::Zarray
                    && !hidden
                    && (self.tree.group_docs.stored(rel)?.is_some()
                        // its `.zgroup` unlinked: its `.zattrs` stays
                        || (file == MetaFile::Zattrs && self.tree.group_docs.kept_zattrs(rel)?));
                return Ok(is_group.then(|| Node::GroupMeta {
                    dir: rel.to_path_buf(),
                    file,
                }));
            }
            None => {}
        }
        match self.store_child(rel, name)? {
            // A chunk (or key directory) of an unsharded array's grid the store has none
            // of, where the view serves chunks of the fill value.
            None => Ok(self.plain_fill_at(&rel.join(name))),
            found => Ok(found),
        }
    }

    /// A child of a group of a draft store. One not known is looked for again in the
    /// store's metadata, where that was read longer than `--ttl` ago.
    pub(super) fn draft_child(&self, path: &Path, name: &OsStr) -> Option<Node> {
        self.tree.known_draft_child(path, name).or_else(|| {
            self.refresh_draft()
                .then(|| self.tree.known_draft_child(path, name))
                .flatten()
        })
    }

    pub(super) fn store_child(&self, dir: &Path, name: &OsStr) -> Result<Option<Node>> {
        // shardfs's own files are never found, as they are never listed (before, an
        // unlinked array's kept metadata could be renamed away through its directory:
        // found by an adversarial tester).
        if crate::store::is_internal(name) {
            return Ok(None);
        }
        let rel = dir.join(name);
        if self.overlay.is_some_and(|w| w.doc_pending(&rel)) {
            return Ok(Some(Node::File { rel }));
        }
        let Some(m) = self.tree.store.stat(&rel)? else {
            return Ok(None);
        };
        Ok(match m.kind {
            // A directory that is no Zarr node may be a bcolz rootdir.
            EntryKind::Dir => match self.classify(rel, m)? {
                Some(Node::Dir { rel }) => Some(
                    self.tree
                        .containers
                        .dir(&rel, &m)?
                        .unwrap_or(Node::Dir { rel }),
                ),
                node => node,
            },
            EntryKind::File => Some(
                self.tree
                    .containers
                    .file(&rel, &m)?
                    .unwrap_or(Node::File { rel }),
            ),
            EntryKind::Symlink => Some(Node::Symlink { rel }),
            EntryKind::Other => None,
        })
    }

    /// [`Self::child`], less what is there only as the v2 view's fill value
    /// ([`Self::is_fill`]).
    pub(super) fn stored_child(
        &self,
        path: &Path,
        node: &Node,
        name: &OsStr,
    ) -> Result<Option<Node>> {
        match self.child(path, node, name)? {
            Some(n) if self.is_fill(&path.join(name), &n)? => Ok(None),
            found => Ok(found),
        }
    }

    /// Whether the `.zattrs` of the group (or unsharded array) at `rel` was unlinked and
    /// is not shown until written again.
    pub(super) fn zattrs_hidden(&self, rel: &Path) -> bool {
        self.overlay.as_ref().is_some_and(|w| w.zattrs_hidden(rel))
    }

    /// Whether store directory `rel` has a `.zmetadata` in the v2 view: a group (but for
    /// one whose `.zmetadata` was unlinked and not made again), or one whose `.zgroup` was
    /// unlinked and whose `.zmetadata` was not yet.
    pub(super) fn has_zmetadata(&self, rel: &Path) -> Result<bool> {
        if let Some(w) = &self.overlay {
            if w.zmetadata_left(rel) {
                return Ok(true);
            }
            if w.zmetadata_hidden(rel) {
                return Ok(false);
            }
        }
        // (one whose `.zgroup` was unlinked, also in a later mount: `GroupDocs::kept`)
        Ok(
            self.tree.group_docs.stored(rel)?.is_some()
                || self.tree.group_docs.kept(rel)?.is_some(),
        )
    }

    /// A key path under an array: a key directory that has shards, or a stored chunk.
    pub(super) fn key_node(&self, array: &Arc<ShardedArray>, kp: KeyPath) -> Result<Option<Node>> {
        match kp {
            KeyPath::Dir(coords) => {
                let in_grid = coords
                    .iter()
                    .zip(array.layout.chunk_counts())
                    .all(|(c, n)| c < n);
                let mut rel = array.rel.clone();
                for c in array
                    .shown_keys
                    .dir_components(array.layout.ndim(), &coords)
                {
                    rel.push(c);
                }
                if !in_grid {
                    // Outside the grid (a shrink since): no chunk lies there, but files of
                    // their own stored there (`super::kept`) are shown in a plain
                    // directory, to be read and removed (`rm -rf` of the array).
                    return Ok(self.tree.own.has_files(&rel)?.then_some(Node::Dir { rel }));
                }
                // With no chunk below, it is there while files of its own lie in it, and
                // where the v2 view serves chunks of the fill value (found, not listed).
                let exists =
                    array.v2_fill.is_some() || self.stored_key_dir(array, &coords, &rel)?;
                Ok(exists.then(|| Node::KeyDir {
                    array: array.clone(),
                    coords,
                }))
            }
            // A miss is checked against the shard on disk (one `stat`): a chunk that
            // another program added to a shard whose index is cached is found.
            KeyPath::Chunk(coords) => match self.chunk(array, &coords, false).or_else(|e| match e {
                ViewError::NotFound => self.chunk_or_fill(array, &coords, true),
                e => Err(e),
            }) {
                Ok(_) => Ok(Some(Node::Chunk {
                    array: array.clone(),
                    coords,
                })),
                Err(ViewError::NotFound) => Ok(None),
                Err(e) => Err(e),
            },
        }
    }

    /// Whether key directory `coords` of `array` (at view path `rel`) holds anything:
    /// chunks (staged, stored, or made by `mkdir`), or files of their own.
    fn stored_key_dir(&self, array: &ShardedArray, coords: &[u64], rel: &Path) -> Result<bool> {
        Ok(self.has_chunks_under(array, coords, true)?
            || self.tree.own.holds_kept_files(array, coords, rel)?)
    }

    /// Whether `node` is there only as the v2 view's fill value: a chunk of an array's
    /// grid, or a key directory, that nothing is stored at ([`ShardedArray::v2_fill`],
    /// [`Node::PlainFill`]). Found by name for reading; for whatever makes or removes a
    /// name (create with `O_EXCL`, `mkdir`, `link`, `rename`, `unlink`, `rmdir`) it is
    /// not there.
    pub(super) fn is_fill(&self, path: &Path, node: &Node) -> Result<bool> {
        Ok(match node {
            Node::PlainFill { .. } | Node::PlainFillDir { .. } => true,
            Node::Chunk { array, coords } => {
                let array = self.tree.current(array);
                array.v2_fill.is_some()
                    && matches!(self.chunk(&array, coords, false), Err(ViewError::NotFound))
            }
            Node::KeyDir { array, coords } => {
                let array = self.tree.current(array);
                array.v2_fill.is_some() && !self.stored_key_dir(&array, coords, path)?
            }
            _ => false,
        })
    }

    /// The shard and absolute byte range of a stored chunk; `NotFound` when empty.
    pub(super) fn chunk(
        &self,
        array: &ShardedArray,
        coords: &[u64],
        revalidate: bool,
    ) -> Result<ChunkData> {
        if let Some(staged) = self
            .overlay
            .as_ref()
            .and_then(|w| w.staged(&array.rel, coords))
        {
            return staged.map(ChunkData::Staged).ok_or(ViewError::NotFound);
        }
        let loc = array.layout.locate(coords).ok_or(ViewError::NotFound)?;
        let rel = array.shard_rel(&loc.shard);
        let shard = self
            .tree
            .shards
            .get(self.tree.store.as_ref(), &rel, &array.layout, revalidate);
        match shard.chunk(&array.layout, &loc) {
            Ok(Some(range)) => Ok(ChunkData::Shard(shard, range)),
            Ok(None) => Err(ViewError::NotFound),
            Err(err) => Err(ViewError::Shard { shard: rel, err }),
        }
    }

    /// [`Self::chunk`], or where the store has none, the chunk of the fill value the v2
    /// view serves for the array ([`ShardedArray::v2_fill`]) at keys of its grid: found
    /// by name, never listed (a listing shows what is stored).
    pub(super) fn chunk_or_fill(
        &self,
        array: &ShardedArray,
        coords: &[u64],
        revalidate: bool,
    ) -> Result<ChunkData> {
        match self.chunk(array, coords, revalidate) {
            Err(ViewError::NotFound)
                if let Some(fill) = &array.v2_fill
                    && array.layout.locate(coords).is_some() =>
            {
                Ok(ChunkData::Staged(fill.clone()))
            }
            res => res,
        }
    }

    /// Whether metadata file `file` of `array` is shown: not after `.zarray` was unlinked
    /// (then `.zattrs` only until it is unlinked too), nor `.zattrs` after it was unlinked
    /// until it is written again.
    pub(super) fn meta_shown(&self, array: &ShardedArray, file: MetaFile) -> bool {
        let Some(w) = &self.overlay else { return true };
        w.meta_shown(&array.rel, file)
    }
}

impl Tree {
    /// The newest metadata of `array` (it may have been rewritten since the node was made).
    pub(super) fn current(&self, array: &Arc<ShardedArray>) -> Arc<ShardedArray> {
        self.arrays.get(&array.rel).unwrap_or_else(|| array.clone())
    }

    /// Store entries of an array directory the view does not pass through: shard keys,
    /// and the metadata files of the other Zarr version.
    pub(super) fn hidden_in_array(&self, array: &ShardedArray, name: &OsStr) -> bool {
        let ndim = array.layout.ndim();
        let meta = match MetaFile::from_name(name) {
            Some(MetaFile::ZarrJson) => true,
            Some(_) => self.format == ViewFormat::V2,
            None => false,
        };
        meta || crate::store::is_internal(name)
            || name
                .to_str()
                .and_then(|n| array.store_keys.child(ndim, None, n))
                .is_some()
    }

    fn known_draft_child(&self, path: &Path, name: &OsStr) -> Option<Node> {
        let tree = self.draft_tree()?;
        if let Some(file) = MetaFile::from_name(name)
            && self.format.group_files().contains(&file)
        {
            return Some(Node::GroupMeta {
                dir: path.to_path_buf(),
                file,
            });
        }
        let child = path.join(name);
        if let Some(array) = tree.arrays.get(&child) {
            return Some(Node::ArrayDir {
                array: array.clone(),
            });
        }
        tree.groups
            .contains_key(&child)
            .then_some(Node::DraftGroup { path: child })
    }
}

/// A small store file (metadata), `None` if absent.
pub(super) fn read_small(store: &dyn Store, rel: &Path) -> io::Result<Option<Vec<u8>>> {
    match store.open(rel)? {
        Some(file) => Ok(Some(read_metadata(file.as_ref())?.0)),
        None => Ok(None),
    }
}

/// The bytes and the metadata of an open metadata file (at most `MAX_METADATA_BYTES`).
pub(super) fn read_metadata(file: &dyn StoreFile) -> io::Result<(Vec<u8>, EntryMeta)> {
    let meta = file.meta()?;
    if meta.len > MAX_METADATA_BYTES {
        return Err(io::Error::other(format!(
            "{} bytes is too large for metadata",
            meta.len
        )));
    }
    let mut bytes = vec![0; meta.len as usize];
    file.read_exact_at(&mut bytes, 0)?;
    Ok((bytes, meta))
}
