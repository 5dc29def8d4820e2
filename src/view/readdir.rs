//! A directory's listing (`readdir`): by the kind of its node, from the store, the
//! array and key directories (`listing.rs`), the v2 view (`plain.rs`), containers and
//! draft groups, with the entries of files of their own in key directories, of what is
//! only in this mount's memory and of documents being written; sorted, with inode
//! numbers. Open directories keep their listing in the handle table (`handles.rs`).

use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::Path;

use crate::format;
use crate::store::EntryKind;

use super::TreeRead;
use super::*;

impl TreeRead<'_> {
    /// Every entry of directory `ino` (without `.` and `..`), sorted by name.
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>> {
        let (path, node) = self.tree.node(ino)?;
        let mut entries = match &node {
            Node::Dir { rel } if self.tree.format == ViewFormat::V2 => self.list_v2_dir(rel)?,
            Node::Dir { rel } => self.list_store(rel, |_| true)?,
            Node::DraftGroup { path } => self.list_draft_group(path),
            Node::ArrayDir { array } => self.list_array(array)?,
            Node::Container(c) => self.tree.containers.list(c)?,
            Node::KeyDir { array, coords } => {
                let mut keys = self.list_keys(array, coords)?;
                let (enc, ndim) = (array.encoding(), array.layout.ndim());
                let listed: HashSet<std::ffi::OsString> =
                    keys.iter().map(|e| e.name.clone()).collect();
                // Keys are listed above; a key directory with no chunk below is listed
                // while files of their own lie in it, and one outside the grid is a plain
                // directory, listed while it holds files.
                keys.extend(self.tree.own.kept_in_key_dir(&path, |n| {
                    match enc.child(ndim, Some(coords), n) {
                        Some(format::KeyPath::Dir(_)) if listed.contains(OsStr::new(n)) => true,
                        Some(format::KeyPath::Dir(c)) => !self
                            .tree
                            .own
                            .key_dir_holds_files(array, &c, &path.join(n))
                            .unwrap_or(false),
                        Some(format::KeyPath::Chunk(_)) => true,
                        None => false,
                    }
                })?);
                keys
            }
            _ => return Err(ViewError::NotDir),
        };
        if let Some(w) = &self.overlay {
            entries.extend(self.written_entries(&path, &node));
            if let Node::Dir { rel } = &node {
                entries.extend(w.new_docs_in(rel).into_iter().map(|name| DirEntry {
                    ino: 0,
                    name,
                    kind: Kind::File,
                }));
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        entries.dedup_by(|a, b| a.name == b.name);
        for e in &mut entries {
            let child = path.join(&e.name);
            e.ino = self.tree.inodes.number(&child, e.kind);
        }
        Ok(entries)
    }

    /// Pass-through entries of a store directory that `keep` accepts.
    pub(super) fn list_store(
        &self,
        rel: &Path,
        keep: impl Fn(&OsStr) -> bool,
    ) -> Result<Vec<DirEntry>> {
        Ok(self
            .tree
            .store
            .list(rel)?
            .into_iter()
            // shardfs's own files (`store::is_internal`) are never shown, as no lookup
            // finds them.
            .filter(|e| keep(&e.name) && !crate::store::is_internal(&e.name))
            .filter_map(|e| {
                let kind = match e.kind {
                    EntryKind::Dir => Kind::Dir,
                    // A bloscpack file is shown as a directory.
                    EntryKind::File => self.tree.containers.listed_kind(rel, &e.name, Kind::File),
                    EntryKind::Symlink => Kind::Symlink,
                    EntryKind::Other => return None,
                };
                Some(DirEntry {
                    ino: 0,
                    name: e.name,
                    kind,
                })
            })
            .collect())
    }

    /// Entries that exist only in memory: scratch files, key directories made by mkdir,
    /// staged chunks in shards that do not exist yet.
    pub(super) fn written_entries(&self, path: &Path, node: &Node) -> Vec<super::DirEntry> {
        let Some(w) = &self.overlay else {
            return Vec::new();
        };
        let (array, prefix) = match node {
            Node::ArrayDir { array } => (self.tree.current(array), None),
            Node::KeyDir { array, coords } => (self.tree.current(array), Some(coords.clone())),
            _ => return Vec::new(),
        };
        let entry = |name: String, kind| super::DirEntry {
            ino: 0,
            name: name.into(),
            kind,
        };
        let mut out: Vec<_> = w
            .scratch_names_in(path)
            .into_iter()
            .map(|n| entry(n.to_string_lossy().into_owned(), Kind::File))
            .collect();
        let enc = array.encoding();
        let ndim = array.layout.ndim();
        let k = prefix.as_ref().map_or(0, Vec::len);
        let p = prefix.clone().unwrap_or_default();
        let counts = array.layout.chunk_counts();
        let mut keys: Vec<(Vec<u64>, bool)> = w
            .key_dirs_of(&array.rel, counts)
            .into_iter()
            .map(|c| (c, false))
            .collect();
        keys.extend(
            w.staged_under(&array.rel, &p)
                .into_iter()
                .filter(|(_, exists)| *exists)
                .map(|(c, _)| (c, true)),
        );
        for (c, is_chunk) in keys {
            if !c.starts_with(&p) {
                continue;
            }
            if prefix.is_none()
                && let Some(root) = enc.root_component(ndim)
            {
                out.push(entry(root.to_string(), Kind::Dir));
            } else if !enc.nested() || ndim == 0 {
                if is_chunk {
                    out.push(entry(enc.encode(&c), Kind::File));
                }
            } else if c.len() > k {
                let last = k + 1 == ndim;
                if !last || is_chunk {
                    out.push(entry(
                        c[k].to_string(),
                        if last { Kind::File } else { Kind::Dir },
                    ));
                }
            }
        }
        out
    }
}
