//! Stores of the 2022 draft layout (`meta/root/...`, `data/root/...`): the hierarchy is
//! read from the metadata documents at mount, and read again when a name is not found
//! or a group is listed, at most once per `--ttl` (so arrays and groups that zarr 2 adds
//! to the store later are seen); it is shown as directories, and each array is
//! presented like a final sharded array. Such a view is read-only.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value};

use super::Tree;
use super::TreeRead;
use super::{Kind, ShardedArray};
use crate::format::{self, Presentation, draft};
use crate::store::{EntryKind, EntryMeta};

/// A group of a draft store.
#[derive(Debug, Default)]
pub(super) struct DraftGroup {
    pub attrs: Map<String, Value>,
    pub children: BTreeMap<OsString, Kind>,
}

/// The hierarchy of a draft store, by view path (`""` is the root group).
#[derive(Debug, Default)]
pub(super) struct DraftTree {
    pub groups: HashMap<PathBuf, DraftGroup>,
    pub arrays: HashMap<PathBuf, Arc<ShardedArray>>,
    /// Attributes of every directory and metadata file the view makes.
    pub dir_meta: Option<EntryMeta>,
    pub file_meta: Option<EntryMeta>,
}

impl DraftTree {
    pub fn group_json(&self, path: &Path) -> Option<Vec<u8>> {
        let attrs = &self.groups.get(path)?.attrs;
        let doc = serde_json::json!({"zarr_format": 3, "node_type": "group", "attributes": attrs});
        let mut out = serde_json::to_vec_pretty(&doc).expect("JSON of a JSON value");
        out.push(b'\n');
        Some(out)
    }
}

/// The hierarchy as last read, and when.
pub(super) struct DraftState {
    tree: parking_lot::RwLock<Arc<DraftTree>>,
    /// When `tree` was read; held while it is read again.
    read_at: parking_lot::Mutex<Instant>,
}

impl DraftState {
    pub fn new(tree: DraftTree) -> Self {
        DraftState {
            tree: parking_lot::RwLock::new(Arc::new(tree)),
            read_at: parking_lot::Mutex::new(Instant::now()),
        }
    }
}

impl TreeRead<'_> {
    /// Read the draft hierarchy again if it was read longer than `--ttl` ago (and no
    /// other thread is reading it now). Whether it was read.
    pub(super) fn refresh_draft(&self) -> bool {
        let Some(state) = &self.tree.draft else {
            return false;
        };
        let Some(mut read_at) = state.read_at.try_lock() else {
            return false;
        };
        if read_at.elapsed() < self.tree.cache.ttl() {
            return false;
        }
        let tree = self.load_draft_tree();
        *state.tree.write() = Arc::new(tree);
        *read_at = Instant::now();
        true
    }

    /// Read the hierarchy of a draft store.
    pub(super) fn load_draft_tree(&self) -> DraftTree {
        let mut tree = DraftTree {
            dir_meta: self.tree.store.stat(Path::new("")).ok().flatten(),
            file_meta: self.tree.store.stat(Path::new("zarr.json")).ok().flatten(),
            ..Default::default()
        };
        let mut root = DraftGroup::default();
        if let Some(attrs) = self
            .tree
            .draft_group_attrs(Path::new("meta/root.group.json"))
        {
            root.attrs = attrs;
        }
        tree.groups.insert(PathBuf::new(), root);
        self.walk_draft(&mut tree, Path::new(""));
        tree
    }

    /// Add the children of the group at view path `path` (and below) to `tree`.
    fn walk_draft(&self, tree: &mut DraftTree, path: &Path) {
        let meta_dir = Path::new(draft::META_ROOT).join(path);
        let Ok(entries) = self.tree.store.list(&meta_dir) else {
            return;
        };
        let mut children = BTreeMap::new();
        for e in entries {
            let Some(name) = e.name.to_str() else {
                continue;
            };
            if e.kind == EntryKind::Dir {
                let child = path.join(name);
                tree.groups.entry(child.clone()).or_default();
                children.insert(OsString::from(name), Kind::Dir);
                self.walk_draft(tree, &child);
            } else if let Some(stem) = name.strip_suffix(draft::GROUP_SUFFIX) {
                let child = path.join(stem);
                let attrs = self
                    .tree
                    .draft_group_attrs(&meta_dir.join(name))
                    .unwrap_or_default();
                tree.groups.entry(child).or_default().attrs = attrs;
                children.insert(OsString::from(stem), Kind::Dir);
            } else if let Some(stem) = name.strip_suffix(draft::ARRAY_SUFFIX) {
                let child = path.join(stem);
                match self.load_draft_array(&child, &meta_dir.join(name)) {
                    Ok(array) => {
                        tree.arrays.insert(child, Arc::new(array));
                        children.insert(OsString::from(stem), Kind::Dir);
                    }
                    Err(why) => {
                        let meta = meta_dir.join(name);
                        if self.tree.arrays.first_warning(&meta) {
                            log::warn!("{}: array left out: {why}", meta.display())
                        }
                    }
                }
            }
        }
        tree.groups.entry(path.to_path_buf()).or_default().children = children;
    }

    fn load_draft_array(&self, path: &Path, meta_rel: &Path) -> Result<ShardedArray, String> {
        let bytes = self
            .tree
            .read_small(meta_rel)
            .map_err(|e| e.to_string())?
            .ok_or("vanished")?;
        let json_meta = self
            .tree
            .store
            .stat(meta_rel)
            .map_err(|e| e.to_string())?
            .ok_or("vanished")?;
        let (doc, store_keys) = draft::array(&bytes)?;
        let doc_bytes = serde_json::to_vec(&Value::Object(doc)).map_err(|e| e.to_string())?;
        let format::Node::Array(meta) =
            format::metadata::parse(&doc_bytes).map_err(|e| e.to_string())?
        else {
            return Err("not an array".into());
        };
        let layout = match &meta.presentation {
            Presentation::Sharded(l) => l.clone(),
            Presentation::Plain | Presentation::Unsupported(_) => {
                return Err(format!("cannot present it: {:?}", meta.presentation));
            }
        };
        let dir_meta = self
            .tree
            .store
            .stat(Path::new(""))
            .map_err(|e| e.to_string())?
            .ok_or("store root vanished")?;
        self.build_array(
            super::ArraySource {
                rel: path.to_path_buf(),
                data_rel: Path::new(draft::DATA_ROOT).join(path),
                meta_rel: meta_rel.to_path_buf(),
                store_keys,
                draft: true,
            },
            *meta,
            layout,
            dir_meta,
            json_meta,
        )
    }
}

impl Tree {
    /// The hierarchy of a draft store, as last read; `None` for other stores.
    pub(super) fn draft_tree(&self) -> Option<Arc<DraftTree>> {
        self.draft.as_ref().map(|d| d.tree.read().clone())
    }

    fn draft_group_attrs(&self, rel: &Path) -> Option<Map<String, Value>> {
        let bytes = self.read_small(rel).ok()??;
        match draft::group_attributes(&bytes) {
            Ok(a) => Some(a),
            Err(why) => {
                log::warn!("{}: group attributes not read: {why}", rel.display());
                Some(Map::new())
            }
        }
    }
}
