//! Lookups and attributes: `lookup`, `forget`, `getattr`, `readlink`, `statfs`, and the
//! attributes of each kind of node (with the times set through the mount). Attributes
//! of an open file, also once unlinked, are `handles.rs`.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};

use super::Tree;
use super::TreeRead;
use super::*;

impl View {
    /// Resolve `name` in directory `parent` and count a kernel lookup of the result.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr> {
        let (path, node) = self.tree.node(parent)?;
        let child = self.child(&path, &node, name)?.ok_or(ViewError::NotFound)?;
        let attr_node = child.clone();
        let ino = self.tree.inodes.intern(path.join(name), child);
        match self.attr(ino, &attr_node) {
            Ok(a) => Ok(a),
            Err(e) => {
                self.tree.inodes.forget(ino, 1);
                Err(e)
            }
        }
    }

    pub fn forget(&self, ino: u64, n: u64) {
        self.tree.inodes.forget(ino, n);
        if self.tree.inodes.get(ino).is_none() {
            self.tree.cache.forget(ino);
        }
    }

    /// A handle of `ino` was released; an inode the kernel forgot before goes with it.
    pub(super) fn let_go(&self, ino: u64) {
        if self.tree.inodes.let_go(ino) {
            self.tree.cache.forget(ino);
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let (_, node) = self.tree.node(ino)?;
        self.attr(ino, &node)
    }

    pub fn readlink(&self, ino: u64) -> Result<PathBuf> {
        match self.tree.node(ino)?.1 {
            Node::Symlink { rel } => Ok(self.tree.store.read_link(&rel)?),
            _ => Err(ViewError::Io(io::Error::from_raw_os_error(libc::EINVAL))),
        }
    }

    pub fn statfs(&self) -> Result<SpaceInfo> {
        Ok(self.tree.store.space()?)
    }

    /// The attributes of `ino`, with times set through the mount ([`View::set_times`]).
    pub(super) fn attr(&self, ino: u64, node: &Node) -> Result<Attr> {
        if let Node::Stats = node {
            return self.stats_attr(ino);
        }
        match self.overlay_opt() {
            Some(o) => Ok(o.with_times_set(ino, node, o.attr_of(ino, node)?)),
            // A read-only view has no scratch files and no times set.
            None => {
                let tree = self.tree_read();
                let attr =
                    tree.attr_of(ino, node, self.open_policy(), |dir| tree.consolidated(dir))?;
                attr.ok_or(ViewError::NotFound)
            }
        }
    }

    /// The stats file's attributes: its size is that of the JSON made now.
    fn stats_attr(&self, ino: u64) -> Result<Attr> {
        let mut m = self.tree.stat_rel(Path::new(""))?;
        m.perm = 0o444;
        m.mtime = std::time::SystemTime::now();
        Ok(Attr {
            volatile: true,
            ..Attr::from_meta(ino, Kind::File, self.stats_json().len() as u64, &m)
        })
    }
}

impl Overlay<'_> {
    /// `a`, the attributes of `node` (inode `ino`), with the times set on it through the
    /// mount while it is unchanged ([`View::set_times`]).
    fn with_times_set(&self, ino: u64, node: &Node, mut a: Attr) -> Attr {
        let w = self.w;
        // Nothing set (the common case): no look at the inode table or the file.
        if w.times.is_empty() {
            return a;
        }
        let own = match node {
            Node::Scratch { path, .. } => w.scratch.stat_at(path).map_or(a.mtime, |(_, m)| m),
            _ => a.mtime,
        };
        if let Some((path, _)) = self.tree.inodes.get(ino)
            && let Some(t) = w.times.shown(&path, own)
        {
            a.atime = t.atime;
            a.mtime = t.mtime;
        }
        a
    }

    /// The attributes of `node` as this mount shows it, before times set through the
    /// mount ([`TreeRead::attr_of`], with `.zmetadata` made from the reconciled overlay).
    /// The stats file is the facade's: `NotFound` here.
    fn attr_of(&self, ino: u64, node: &Node) -> Result<Attr> {
        let attr = self
            .tree_read()
            .attr_of(ino, node, self.policy, |dir| self.consolidated(dir))?;
        match attr {
            Some(a) => Ok(a),
            None if matches!(node, Node::Scratch { .. }) => self.attr_of(ino, &self.settled(ino)?),
            None => Err(ViewError::NotFound),
        }
    }

    /// The node `ino` is now, for a caller that held it as a scratch node whose file was
    /// gone: it settled meanwhile (its last handle closed) into a chunk or metadata.
    /// `NotFound` if it is still a scratch node (the file was unlinked).
    pub(super) fn settled(&self, ino: u64) -> Result<Node> {
        let (path, node) = self.tree.node(ino)?;
        if !matches!(node, Node::Scratch { .. }) {
            return Ok(node);
        }
        // A lookup racing the settle may have put the scratch node back: ask the path.
        match self.resolve(&path)? {
            Some(now) if !matches!(now, Node::Scratch { .. }) => {
                self.tree.inodes.update(ino, now.clone());
                Ok(now)
            }
            _ => Err(ViewError::NotFound),
        }
    }

    /// The times set through the mount on `path` that `stat` shows now (the file
    /// unchanged since they were set).
    pub(super) fn set_times_shown(&self, path: &Path) -> Option<super::set_times::SetTimes> {
        let set = self.w.times.get(path)?;
        (Some(set.base) == self.mtime_at(path)).then_some(set)
    }

    /// Shows `set` on `path` while the file there keeps the mtime it has now: after a
    /// change of where the file lives that changes no byte of it (a rename, a file of
    /// its own stored).
    pub(super) fn show_set_times(&self, path: &Path, set: super::set_times::SetTimes) {
        let Some(base) = self.mtime_at(path) else {
            return;
        };
        self.w
            .times
            .set(path, super::set_times::SetTimes { base, ..set });
    }

    /// [`Overlay::own_mtime`] of the file at `path`. By path: the kernel may have
    /// forgotten its inode meanwhile (then the inode table no longer knows the name;
    /// found by the reference test).
    fn mtime_at(&self, path: &Path) -> Option<std::time::SystemTime> {
        let (ino, node) = match self.tree.inodes.peek(path) {
            Some(ino) => (ino, self.tree.node(ino).ok()?.1),
            None => (0, self.resolve(path).ok()??),
        };
        self.own_mtime(ino, &node)
    }

    /// The modification time that times set through the mount are shown against (while
    /// it stays, the file is unchanged): its mtime, but for a file of its own held in
    /// memory, which shows its array directory's times: when its bytes last changed.
    /// Before, a write of the array's metadata (the directory changed) reset times set
    /// on such a file (found by the reference test). The stats file has none (its mtime
    /// is always now).
    pub(super) fn own_mtime(&self, ino: u64, node: &Node) -> Option<std::time::SystemTime> {
        if let Node::Scratch { path, .. } = node
            && let Some((_, m)) = self.w.scratch.stat_at(path)
        {
            return Some(m);
        }
        Some(self.attr_of(ino, node).ok()?.mtime)
    }
}

impl TreeRead<'_> {
    /// The attributes of `node` as this mount shows it, before times set through the
    /// mount; `consolidated` makes a group's `.zmetadata` (on a writable mount, with
    /// the overlay reconciled). `None` for what the tree cannot say: the stats file
    /// (the view's), and a scratch file no longer held (committed meanwhile: its inode
    /// is settled and asked again).
    fn attr_of(
        &self,
        ino: u64,
        node: &Node,
        policy: OpenPolicy,
        consolidated: impl FnOnce(&Path) -> Result<Vec<u8>>,
    ) -> Result<Option<Attr>> {
        let tree = self.tree;
        Ok(Some(match node {
            Node::Stats => return Ok(None),
            Node::File { rel } if let Some(doc) = self.overlay.and_then(|o| o.pending_doc(rel)) => {
                let m = doc.meta()?;
                Attr::from_meta(ino, Kind::File, m.len, &m)
            }
            Node::Dir { rel } | Node::File { rel } | Node::Symlink { rel } => {
                let m = tree.stat_rel(rel)?;
                // A group document the v3 view shows changed (one `stat` for both).
                let len = match node {
                    Node::File { .. } => tree
                        .group_docs
                        .shown(rel, Some(&m))
                        .map_or(m.len, |d| d.len() as u64),
                    _ => m.len,
                };
                Attr::from_meta(ino, node.kind(), len, &m)
            }
            // Owner and times of the array's directory; a chunk's mode is its `.zarray`'s.
            Node::PlainFill { array, data, .. } => {
                let mut m = tree.stat_rel(array)?;
                m.perm &= 0o666;
                Attr::from_meta(ino, Kind::File, data.len() as u64, &m)
            }
            Node::Consolidated { dir } => {
                let mut m = tree.stat_rel(dir)?;
                m.perm &= 0o666;
                m.mtime = std::time::SystemTime::now();
                Attr {
                    volatile: true,
                    ..Attr::from_meta(ino, Kind::File, consolidated(dir)?.len() as u64, &m)
                }
            }
            Node::PlainFillDir { array, .. } => {
                let m = tree.stat_rel(array)?;
                Attr::from_meta(ino, Kind::Dir, 0, &m)
            }
            Node::Container(c) => tree.containers.attr(ino, c)?,
            Node::ArrayDir { array } | Node::KeyDir { array, .. } => {
                Attr::from_meta(ino, Kind::Dir, 0, &array.dir_meta)
            }
            Node::ArrayMeta { array, file } => {
                let array = tree.current(array);
                let len = array.meta_bytes(*file).len() as u64;
                Attr::from_meta(ino, Kind::File, len, &array.json_meta)
            }
            Node::GroupMeta { dir, file } => self.group_meta_attr(ino, dir, *file)?,
            Node::DraftGroup { .. } => {
                let m = tree.draft_tree().and_then(|t| t.dir_meta);
                Attr::from_meta(ino, Kind::Dir, 0, &m.ok_or(ViewError::NotFound)?)
            }
            Node::Chunk { array, coords } => self.chunk_attr(ino, array, coords, policy)?,
            Node::Scratch { .. } => return Ok(self.scratch_attr(ino, node, policy)),
        }))
    }

    /// A scratch file's attributes, `None` if it is no longer held. Others read the
    /// stored document while a write of it is pending, unless they share the kernel's
    /// pages of the file with its writer (kernel opens): then they see what those hold,
    /// as in any local file system.
    fn scratch_attr(&self, ino: u64, node: &Node, policy: OpenPolicy) -> Option<Attr> {
        if !policy.shows_pending_writes()
            && let Some((array, file)) = self.tree.pending_meta(node)
        {
            let len = array.meta_bytes(file).len() as u64;
            return Some(Attr::from_meta(ino, Kind::File, len, &array.json_meta));
        }
        let Node::Scratch { path, array, .. } = node else {
            return None;
        };
        let len = self.overlay?.scratch_len(path)?;
        // Owner, mode and times of the array's (times set on it aside: see
        // `Overlay::own_mtime`). Renamed onto a chunk key, it shows the same times as
        // the staged chunk it becomes, so the kernel keeps the pages its writer filled
        // (docs/SEMANTICS.md, "Reads on a writable mount").
        let mut m = array.dir_meta;
        m.perm = array.json_meta.perm;
        Some(Attr::from_meta(ino, Kind::File, len, &m))
    }

    /// A chunk's attributes: its bytes as stored or staged (or the v2 view's fill
    /// value), with the times of its shard and the mode of the array's metadata.
    fn chunk_attr(
        &self,
        ino: u64,
        array: &Arc<ShardedArray>,
        coords: &[u64],
        policy: OpenPolicy,
    ) -> Result<Attr> {
        let array = self.tree.current(array);
        let data = self.chunk_or_fill(&array, coords, policy.checks_shard_at_getattr())?;
        let mut m = match &data {
            ChunkData::Shard(shard, _) => *shard.meta().unwrap_or(&array.dir_meta),
            ChunkData::Staged(_) => array.dir_meta,
        };
        m.perm = array.json_meta.perm;
        // Kept for the next open to compare (daemon opens), or the next read (a read-only
        // mount where the kernel opens: `View::kernel_size_holds`).
        if policy.compares_size_at_open() || self.overlay.is_none() {
            self.tree.cache.report_size(ino, data.len());
        }
        Ok(Attr::from_meta(ino, Kind::File, data.len(), &m))
    }

    /// A group metadata file the view makes: its owner, mode and times are those of the
    /// group's `zarr.json` (in a draft store, of the root `zarr.json`; with none, where
    /// the directory is an unsharded array of the v2 view, of the directory).
    fn group_meta_attr(&self, ino: u64, dir: &Path, file: MetaFile) -> Result<Attr> {
        let len = self.group_meta(dir, file)?.len() as u64;
        let m = match self.tree.draft_tree() {
            Some(tree) => tree.file_meta,
            None => match self.tree.store.stat(&dir.join("zarr.json"))? {
                // A headless unsharded array's `.zattrs`: the directory's owner and
                // times, a file's mode (before, the directory's `x` bits too).
                None if self.plain_keys(dir).is_some() => {
                    self.tree.store.stat(dir)?.map(|m| EntryMeta {
                        perm: m.perm & 0o666,
                        ..m
                    })
                }
                // A group's `.zattrs` left by its `.zgroup` (`GroupDocs::kept`): the
                // kept document's.
                None => self
                    .tree
                    .store
                    .stat(&dir.join(crate::store::UNLINKED_META))?
                    .map(|m| EntryMeta {
                        perm: m.perm & 0o666,
                        ..m
                    }),
                m => m,
            },
        };
        Ok(Attr::from_meta(
            ino,
            Kind::File,
            len,
            &m.ok_or(ViewError::NotFound)?,
        ))
    }
}

impl Tree {
    pub(super) fn stat_rel(&self, rel: &Path) -> Result<EntryMeta> {
        self.store.stat(rel)?.ok_or(ViewError::NotFound)
    }
}
