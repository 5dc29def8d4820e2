//! The virtual tree: which node a path is, its attributes, listings and reads. Knows
//! nothing of FUSE; the adapter in `fuse` calls one method per request.
//!
//! * Store directories and files pass through unchanged, byte for byte.
//! * A directory whose `zarr.json` is a presentable sharded array becomes an array
//!   directory: `zarr.json` is the rewritten unsharded metadata, the key namespace
//!   (`c/...`, or `0.1` keys for `v2`, ...) shows inner chunks instead of shards, other
//!   files pass through.
//! * Key directories are listed from the shard files that exist (the draft spec's
//!   `list_dir` rule): a prefix may be listed whose chunks turn out empty. The last level
//!   (files) reads the indices of the shards of that one directory only.

mod adopt;
mod draft;
mod durable;
mod inode;
mod listing;
pub mod node;
mod ops;
mod write;

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::format::{self, ChunkRange, KeyPath, Node as MetaNode, Presentation};
use crate::store::shard::{Shard, ShardCache, ShardError};
use crate::store::{EntryKind, EntryMeta, SpaceInfo, Store, StoreFile};
pub use inode::ROOT_INO;
pub use node::{Attr, DirEntry, Kind, MetaFile, Node, ShardedArray, ViewFormat};
pub use write::{WriteConfig, Writer};
/// The write side's types, for the mount.
pub mod write_api {
    pub use super::write::{Invalidation, WriteConfig, Writer};
}

/// The hidden file at the mount's root that `shardfs stats` reads.
pub const STATS_FILE: &str = ".shardfs-stats";
/// The stats file's size is a multiple of this.
const STATS_PAGE: usize = 4096;

/// Largest `zarr.json` the view parses; a bigger one passes through unparsed.
const MAX_METADATA_BYTES: u64 = 16 << 20;

/// Errors of the view; [`ViewError::errno`] is the one place they become errno values.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("no such entry")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("read-only file system")]
    ReadOnly,
    #[error("unknown inode {0}")]
    StaleInode(u64),
    #[error("unknown file handle {0}")]
    StaleHandle(u64),
    #[error("shard {shard}: {err}")]
    Shard { shard: PathBuf, err: ShardError },
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Invalid(String),
    #[error("directory not empty")]
    NotEmpty,
    #[error("already exists")]
    Exists,
    #[error("{0}")]
    Unsupported(String),
    #[error("write buffer full")]
    NoSpace,
    #[error("flush failed: {0}")]
    Flush(#[from] crate::write::flush::FlushError),
}

impl ViewError {
    pub fn errno(&self) -> i32 {
        match self {
            ViewError::NotFound => libc::ENOENT,
            ViewError::NotDir => libc::ENOTDIR,
            ViewError::IsDir => libc::EISDIR,
            ViewError::ReadOnly => libc::EROFS,
            ViewError::StaleInode(_) | ViewError::StaleHandle(_) => libc::ESTALE,
            ViewError::Shard { .. } => libc::EIO,
            ViewError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            ViewError::Invalid(_) => libc::EINVAL,
            ViewError::NotEmpty => libc::ENOTEMPTY,
            ViewError::Exists => libc::EEXIST,
            ViewError::Unsupported(_) => libc::EXDEV,
            ViewError::NoSpace => libc::ENOSPC,
            ViewError::Flush(e) => e.errno(),
        }
    }
}

pub type Result<T> = std::result::Result<T, ViewError>;

/// Tunables of a view.
#[derive(Clone, Debug)]
pub struct ViewConfig {
    /// Most shards whose index is kept decoded.
    pub max_cached_shards: usize,
    /// About this many bytes of decoded indices are kept.
    pub index_cache_bytes: usize,
    /// Zarr v3 or Zarr v2.
    pub format: ViewFormat,
}

impl Default for ViewConfig {
    fn default() -> Self {
        ViewConfig {
            max_cached_shards: 4096,
            index_cache_bytes: 64 << 20,
            format: ViewFormat::V3,
        }
    }
}

/// What a chunk inode served at its last open: its range and the shard file's version.
type Served = (ChunkRange, Option<(u64, u64, std::time::SystemTime)>);

/// An open file. Cheap to clone: reads and writes clone it out of the handle table, so
/// that no I/O happens under the table's lock.
#[derive(Clone)]
enum Handle {
    Store(Arc<dyn StoreFile>),
    /// A store file open for writing (outside arrays' key namespaces).
    StoreRw(Arc<dyn crate::store::StoreFileRw>, PathBuf),
    Bytes(Arc<Vec<u8>>),
    Chunk {
        shard: Arc<Shard>,
        range: ChunkRange,
    },
    /// An in-memory file.
    Scratch {
        ino: u64,
        node: Node,
        file: Arc<Mutex<write::Scratch>>,
    },
}

/// Where a chunk's bytes are now.
enum ChunkData {
    Shard(Arc<Shard>, ChunkRange),
    Staged(Arc<Vec<u8>>),
}

impl ChunkData {
    fn len(&self) -> u64 {
        match self {
            ChunkData::Shard(_, r) => r.nbytes,
            ChunkData::Staged(b) => b.len() as u64,
        }
    }
}

/// What `open` tells the adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    pub fh: u64,
    /// The kernel may keep cached pages of this file from an earlier open.
    pub keep_cache: bool,
    /// Closing this handle commits nothing ([`View::flush_handle`] would do nothing), so
    /// the kernel need not send a flush at every `close` (`FOPEN_NOFLUSH`).
    pub no_flush: bool,
    /// The file's size differs from the one in the attributes the kernel holds (changed
    /// outside the mount since): they must be invalidated before the open returns, or
    /// reads would stop at the old size.
    pub stale_size: bool,
}

/// The virtual tree over a store.
pub struct View {
    store: Arc<dyn Store>,
    inodes: inode::InodeTable,
    shards: ShardCache,
    handles: Mutex<std::collections::HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    /// What each chunk inode served at its last open: unchanged means keep the page cache.
    served: Mutex<std::collections::HashMap<u64, Served>>,
    /// The size each chunk inode had in the attributes last given to the kernel, which
    /// caches them for the TTL: an open that finds another size says so.
    reported: Mutex<std::collections::HashMap<u64, u64>>,
    warned: Mutex<HashSet<PathBuf>>,
    /// Listings of open directories, so that `readdir` offsets stay consistent.
    dirs: Mutex<std::collections::HashMap<u64, Arc<Vec<DirEntry>>>>,
    /// The current metadata of every sharded array met so far, by store path: nodes
    /// carry the array as it was when looked up and refresh it from here.
    arrays: parking_lot::RwLock<std::collections::HashMap<PathBuf, Arc<ShardedArray>>>,
    /// The write side; `None` for a read-only view.
    writer: Option<Writer>,
    counters: ReadCounters,
    format: ViewFormat,
    /// The hierarchy of a store of the 2022 draft layout.
    draft: Option<draft::DraftTree>,
    /// The kernel opens and closes files without asking (FUSE no-open, read-only mounts):
    /// reads come with no handle, and a chunk's shard is checked when the kernel
    /// revalidates its attributes instead of at every open. See [`View::set_kernel_opens`].
    kernel_opens: std::sync::atomic::AtomicBool,
}

/// Where an array lives in the store.
pub(crate) struct ArraySource {
    rel: PathBuf,
    data_rel: PathBuf,
    meta_rel: PathBuf,
    store_keys: format::ChunkKeyEncoding,
    draft: bool,
}

/// Why a store directory is not shown as a sharded array.
enum NotShown {
    /// Not an array, or not sharded: a plain directory.
    Plain,
    /// An array the view cannot present; the reason is logged once.
    Unsupported(String),
}

/// What the read side did, for `shardfs stats`.
#[derive(Default)]
struct ReadCounters {
    chunk_opens: AtomicU64,
    chunk_reads: AtomicU64,
    chunk_bytes_read: AtomicU64,
    chunks_committed: AtomicU64,
    chunks_deleted: AtomicU64,
}

impl View {
    pub fn new(store: Arc<dyn Store>, config: ViewConfig) -> io::Result<View> {
        Self::with_writer(store, config, None)
    }

    /// A view that accepts writes through `writer`.
    pub fn with_writer(
        store: Arc<dyn Store>,
        config: ViewConfig,
        writer: Option<Writer>,
    ) -> io::Result<View> {
        let root_meta = store
            .stat(Path::new(""))?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "store root vanished"))?;
        let mut view = View {
            shards: ShardCache::new(config.max_cached_shards, config.index_cache_bytes),
            inodes: inode::InodeTable::new(Node::Dir {
                rel: PathBuf::new(),
            }),
            store,
            handles: Mutex::new(Default::default()),
            next_fh: AtomicU64::new(1),
            served: Mutex::new(Default::default()),
            reported: Mutex::new(Default::default()),
            warned: Mutex::new(HashSet::new()),
            dirs: Mutex::new(Default::default()),
            arrays: Default::default(),
            writer,
            counters: ReadCounters::default(),
            format: config.format,
            draft: None,
            kernel_opens: Default::default(),
        };
        let entry = view.read_small(Path::new("zarr.json")).ok().flatten();
        if entry.is_some_and(|b| format::draft::is_entry_point(&b)) {
            if view.writer.take().is_some() {
                log::warn!(
                    "the store has the 2022 draft layout: it is mounted read-only (writes fail with EROFS)"
                );
            }
            view.draft = Some(view.load_draft_tree());
            view.inodes.update(
                ROOT_INO,
                Node::DraftGroup {
                    path: PathBuf::new(),
                },
            );
            return Ok(view);
        }
        // A writable view recovers a shard's interrupted update before it reads the index
        // (the mount walks the store for leftovers only in the background). A read-only
        // view changes nothing: it reads a torn shard as it was before the update.
        let store = view.store.clone();
        if let Some(hook) = view.store.recovery_hook(view.writer.is_some(), store)? {
            view.shards.set_load_hook(hook);
        }
        let root = view.classify_dir(PathBuf::new(), root_meta);
        view.inodes.update(ROOT_INO, root);
        Ok(view)
    }

    /// Whether the store has the 2022 draft layout.
    pub fn is_draft(&self) -> bool {
        self.draft.is_some()
    }

    /// Whether the view refuses writes (a read-only mount, or a draft store).
    pub fn is_read_only(&self) -> bool {
        self.writer.is_none()
    }

    /// Serve a kernel that opens files without asking (`FUSE_NO_OPEN_SUPPORT`, after
    /// `open` answered `ENOSYS`): reads arrive with file handle 0 and are served by inode
    /// ([`View::read_ino`]), and the attributes of a chunk are taken from its shard as it
    /// is now (a `stat` of the shard), which is where a change made outside the mount
    /// becomes visible, up to the attribute TTL later. Only for read-only views: without
    /// opens there is no handle to hold written bytes.
    pub fn set_kernel_opens(&self, on: bool) {
        debug_assert!(!on || self.is_read_only());
        self.kernel_opens.store(on, Ordering::Relaxed);
    }

    /// See [`View::set_kernel_opens`].
    pub fn kernel_opens(&self) -> bool {
        self.kernel_opens.load(Ordering::Relaxed)
    }

    /// A small store file (metadata), `None` if absent.
    fn read_small(&self, rel: &Path) -> io::Result<Option<Vec<u8>>> {
        match self.store.open(rel)? {
            Some(file) => Ok(Some(read_metadata(file.as_ref())?.0)),
            None => Ok(None),
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn node(&self, ino: u64) -> Result<(PathBuf, Node)> {
        self.inodes.get(ino).ok_or(ViewError::StaleInode(ino))
    }

    /// The counters `shardfs stats` shows, as JSON.
    pub fn stats_json(&self) -> Vec<u8> {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut v = serde_json::json!({
            "store": self.store.describe(),
            "inodes": self.inodes.len(),
            "chunk_opens": get(&c.chunk_opens),
            "chunk_reads": get(&c.chunk_reads),
            "chunk_bytes_read": get(&c.chunk_bytes_read),
            "index_cache_hits": get(&self.shards.hits),
            "index_cache_misses": get(&self.shards.misses),
            "chunks_committed": get(&c.chunks_committed),
            "chunks_deleted": get(&c.chunks_deleted),
        });
        if let Some(w) = &self.writer {
            let f = &w.flusher().counters;
            let flushes = get(&f.flushes);
            v["writable"] = true.into();
            v["compactor"] = w.compactor_name().into();
            v["staged_bytes"] = w.staged_bytes().into();
            v["flushes"] = flushes.into();
            v["chunks_flushed"] = get(&f.chunks).into();
            v["bytes_flushed"] = get(&f.bytes).into();
            v["shard_updates"] = get(&f.shards).into();
            v["chunks_superseded"] = get(&f.superseded).into();
            v["compaction_seconds"] = (get(&f.compact_ns) as f64 / 1e9).into();
            v["flush_seconds"] = (get(&f.flush_ns) as f64 / 1e9).into();
            v["mean_flush_latency_ms"] = if flushes > 0 {
                (get(&f.flush_ns) as f64 / 1e6 / flushes as f64).into()
            } else {
                0.0.into()
            };
        } else {
            v["writable"] = false.into();
        }
        let mut out = serde_json::to_vec_pretty(&v).expect("JSON of a JSON value");
        // Padded with blanks to a whole number of pages: the size the kernel learns from
        // one look stays right for the next one's content, whatever the counters say.
        out.resize((out.len() + 1).next_multiple_of(STATS_PAGE) - 1, b' ');
        out.push(b'\n');
        out
    }

    /// Number of inodes the kernel currently holds.
    pub fn live_inodes(&self) -> usize {
        self.inodes.len()
    }

    // ----- lookup and attributes -------------------------------------------------------

    /// Resolve `name` in directory `parent` and count a kernel lookup of the result.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr> {
        let (path, node) = self.node(parent)?;
        let child = self.child(&path, &node, name)?.ok_or(ViewError::NotFound)?;
        let attr_node = child.clone();
        let ino = self.inodes.intern(path.join(name), child);
        match self.attr(ino, &attr_node) {
            Ok(a) => Ok(a),
            Err(e) => {
                self.inodes.forget(ino, 1);
                Err(e)
            }
        }
    }

    pub fn forget(&self, ino: u64, n: u64) {
        self.inodes.forget(ino, n);
        if self.inodes.get(ino).is_none() {
            self.served.lock().remove(&ino);
            self.reported.lock().remove(&ino);
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let (_, node) = self.node(ino)?;
        self.attr(ino, &node)
    }

    pub fn readlink(&self, ino: u64) -> Result<PathBuf> {
        match self.node(ino)?.1 {
            Node::Symlink { rel } => Ok(self.store.read_link(&rel)?),
            _ => Err(ViewError::Io(io::Error::from_raw_os_error(libc::EINVAL))),
        }
    }

    pub fn statfs(&self) -> Result<SpaceInfo> {
        Ok(self.store.space()?)
    }

    fn stat_rel(&self, rel: &Path) -> Result<EntryMeta> {
        self.store.stat(rel)?.ok_or(ViewError::NotFound)
    }

    fn attr(&self, ino: u64, node: &Node) -> Result<Attr> {
        Ok(match node {
            Node::Stats => {
                let mut m = self.stat_rel(Path::new(""))?;
                m.perm = 0o444;
                m.mtime = std::time::SystemTime::now();
                Attr {
                    volatile: true,
                    ..Attr::from_meta(ino, Kind::File, self.stats_json().len() as u64, &m)
                }
            }
            Node::Dir { rel } | Node::File { rel } | Node::Symlink { rel } => {
                let m = self.stat_rel(rel)?;
                Attr::from_meta(ino, node.kind(), m.len, &m)
            }
            Node::ArrayDir { array } | Node::KeyDir { array, .. } => {
                Attr::from_meta(ino, Kind::Dir, 0, &array.dir_meta)
            }
            Node::ArrayMeta { array, file } => {
                let array = self.current(array);
                let len = array.meta_bytes(*file).len() as u64;
                Attr::from_meta(ino, Kind::File, len, &array.json_meta)
            }
            Node::GroupMeta { dir, file } => {
                let len = self.group_meta(dir, *file)?.len() as u64;
                let m = match &self.draft {
                    Some(tree) => tree.file_meta,
                    None => self.store.stat(&dir.join("zarr.json"))?,
                };
                Attr::from_meta(ino, Kind::File, len, &m.ok_or(ViewError::NotFound)?)
            }
            Node::DraftGroup { .. } => {
                let m = self.draft.as_ref().and_then(|t| t.dir_meta);
                Attr::from_meta(ino, Kind::Dir, 0, &m.ok_or(ViewError::NotFound)?)
            }
            Node::Chunk { array, coords } => {
                let array = self.current(array);
                let data = self.chunk(&array, coords, self.kernel_opens())?;
                let mut m = match &data {
                    ChunkData::Shard(shard, _) => *shard.meta().unwrap_or(&array.dir_meta),
                    ChunkData::Staged(_) => array.dir_meta,
                };
                m.perm = array.json_meta.perm;
                if !self.kernel_opens() {
                    // Only opens compare with it; without opens this is a lock for nothing.
                    self.reported.lock().insert(ino, data.len());
                }
                Attr::from_meta(ino, Kind::File, data.len(), &m)
            }
            Node::Scratch { path, array, .. } => {
                let Some(len) = self.writer()?.scratch_len(path) else {
                    return self.attr(ino, &self.settled(ino)?);
                };
                let mut m = array.dir_meta;
                m.perm = array.json_meta.perm;
                Attr::from_meta(ino, Kind::File, len, &m)
            }
        })
    }

    /// The child node `name` of `node`, `None` if there is none.
    fn child(&self, path: &Path, node: &Node, name: &OsStr) -> Result<Option<Node>> {
        if path.as_os_str().is_empty() && name == STATS_FILE {
            return Ok(Some(Node::Stats));
        }
        if let (Some(w), Node::ArrayDir { array } | Node::KeyDir { array, .. }) =
            (&self.writer, node)
        {
            let child = path.join(name);
            if w.scratch_len(&child).is_some() {
                let parent = match node {
                    Node::KeyDir { coords, .. } => Some(coords.clone()),
                    _ => None,
                };
                return Ok(Some(Node::Scratch {
                    path: child,
                    array: self.current(array),
                    parent,
                }));
            }
        }
        match node {
            Node::Stats => Err(ViewError::NotDir),
            Node::Dir { rel } if self.format == ViewFormat::V2 => self.v2_dir_child(rel, name),
            Node::Dir { rel } => self.store_child(rel, name),
            Node::DraftGroup { path } => Ok(self.draft_child(path, name)),
            Node::ArrayDir { array } => {
                let array = &self.current(array);
                if let Some(file) = MetaFile::from_name(name)
                    && self.format.array_files().contains(&file)
                {
                    return Ok(Some(Node::ArrayMeta {
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
                    None if array.draft || self.hidden_in_array(array, name) => Ok(None),
                    None => self.store_child(&array.rel, name),
                }
            }
            Node::KeyDir { array, coords } => {
                let array = &self.current(array);
                let kp = name
                    .to_str()
                    .and_then(|n| array.encoding().child(array.layout.ndim(), Some(coords), n));
                match kp {
                    Some(kp) => self.key_node(array, kp),
                    None => Ok(None),
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

    /// Store entries of an array directory the view does not pass through: shard keys,
    /// and the metadata files of the other Zarr version.
    fn hidden_in_array(&self, array: &ShardedArray, name: &OsStr) -> bool {
        let ndim = array.layout.ndim();
        let meta = match MetaFile::from_name(name) {
            Some(MetaFile::ZarrJson) => true,
            Some(_) => self.format == ViewFormat::V2,
            None => false,
        };
        meta || name
            .to_str()
            .and_then(|n| array.store_keys.child(ndim, None, n))
            .is_some()
    }

    /// A child of a store directory in the v2 view: `zarr.json` is hidden; a group has
    /// `.zgroup` and `.zattrs`; arrays without a v2 form are left out.
    fn v2_dir_child(&self, rel: &Path, name: &OsStr) -> Result<Option<Node>> {
        match MetaFile::from_name(name) {
            Some(MetaFile::ZarrJson) => return Ok(None),
            Some(file) => {
                // A v2 writer's own file (taken in when it is closed) wins.
                if let Some(m) = self.store.stat(&rel.join(name))?
                    && m.kind == EntryKind::File
                {
                    return Ok(Some(Node::File {
                        rel: rel.join(name),
                    }));
                }
                let is_group = file != MetaFile::Zarray && self.store_group(rel)?.is_some();
                return Ok(is_group.then(|| Node::GroupMeta {
                    dir: rel.to_path_buf(),
                    file,
                }));
            }
            None => {}
        }
        self.store_child(rel, name)
    }

    /// The document of the group whose `zarr.json` is in store directory `rel`.
    fn store_group(
        &self,
        rel: &Path,
    ) -> Result<Option<serde_json::Map<String, serde_json::Value>>> {
        let Some(bytes) = self.read_small(&rel.join("zarr.json"))? else {
            return Ok(None);
        };
        if !matches!(format::metadata::parse(&bytes), Ok(MetaNode::Group)) {
            return Ok(None);
        }
        Ok(serde_json::from_slice(&bytes).ok())
    }

    /// The bytes of a group's metadata file made by the view.
    fn group_meta(&self, dir: &Path, file: MetaFile) -> Result<Vec<u8>> {
        use format::v2;
        if let Some(tree) = &self.draft {
            let group = tree.groups.get(dir).ok_or(ViewError::NotFound)?;
            return Ok(match file {
                MetaFile::ZarrJson => tree.group_json(dir).ok_or(ViewError::NotFound)?,
                MetaFile::Zgroup => v2::to_bytes(&v2::zgroup()),
                MetaFile::Zattrs => v2::to_bytes(&serde_json::Value::Object(group.attrs.clone())),
                MetaFile::Zarray => return Err(ViewError::NotFound),
            });
        }
        let doc = self.store_group(dir)?.ok_or(ViewError::NotFound)?;
        Ok(match file {
            MetaFile::Zgroup => v2::to_bytes(&v2::zgroup()),
            MetaFile::Zattrs => v2::to_bytes(&v2::zattrs(&doc)),
            MetaFile::ZarrJson | MetaFile::Zarray => return Err(ViewError::NotFound),
        })
    }

    /// A child of a group of a draft store.
    fn draft_child(&self, path: &Path, name: &OsStr) -> Option<Node> {
        let tree = self.draft.as_ref()?;
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

    fn store_child(&self, dir: &Path, name: &OsStr) -> Result<Option<Node>> {
        let rel = dir.join(name);
        let Some(m) = self.store.stat(&rel)? else {
            return Ok(None);
        };
        Ok(match m.kind {
            EntryKind::Dir => self.classify(rel, m),
            EntryKind::File => Some(Node::File { rel }),
            EntryKind::Symlink => Some(Node::Symlink { rel }),
            EntryKind::Other => None,
        })
    }

    /// A key path under an array: a key directory that has shards, or a stored chunk.
    fn key_node(&self, array: &Arc<ShardedArray>, kp: KeyPath) -> Result<Option<Node>> {
        match kp {
            KeyPath::Dir(coords) => {
                let in_grid = coords
                    .iter()
                    .zip(array.layout.chunk_counts())
                    .all(|(c, n)| c < n);
                let shard_dir = array.shard_dir_rel(&array.shard_prefix(&coords));
                let exists = in_grid
                    && (matches!(self.store.stat(&shard_dir)?, Some(m) if m.kind == EntryKind::Dir)
                        || self
                            .writer
                            .as_ref()
                            .is_some_and(|w| w.has_keys_under(array, &coords)));
                Ok(exists.then(|| Node::KeyDir {
                    array: array.clone(),
                    coords,
                }))
            }
            // A miss is checked against the shard on disk (one `stat`): a chunk that
            // another program added to a shard whose index is cached is found.
            KeyPath::Chunk(coords) => match self.chunk(array, &coords, false).or_else(|e| match e {
                ViewError::NotFound => self.chunk(array, &coords, true),
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

    /// The shard and absolute byte range of a stored chunk; `NotFound` when empty.
    fn chunk(&self, array: &ShardedArray, coords: &[u64], revalidate: bool) -> Result<ChunkData> {
        if let Some(staged) = self
            .writer
            .as_ref()
            .and_then(|w| w.staging.get(&array.rel, coords))
        {
            return staged.map(ChunkData::Staged).ok_or(ViewError::NotFound);
        }
        let loc = array.layout.locate(coords).ok_or(ViewError::NotFound)?;
        let rel = array.shard_rel(&loc.shard);
        let shard = self
            .shards
            .get(self.store.as_ref(), &rel, &array.layout, revalidate);
        match shard.chunk(&array.layout, &loc) {
            Ok(Some(range)) => Ok(ChunkData::Shard(shard, range)),
            Ok(None) => Err(ViewError::NotFound),
            Err(err) => Err(ViewError::Shard { shard: rel, err }),
        }
    }

    /// What a store directory is: a presentable sharded array, or a plain directory.
    fn classify_dir(&self, rel: PathBuf, dir_meta: EntryMeta) -> Node {
        self.classify(rel.clone(), dir_meta)
            .unwrap_or(Node::Dir { rel })
    }

    /// Like [`View::classify_dir`]; `None` for an array the v2 view leaves out.
    fn classify(&self, rel: PathBuf, dir_meta: EntryMeta) -> Option<Node> {
        match self.load_array(&rel, dir_meta) {
            Ok(array) => {
                let array = Arc::new(array);
                self.arrays.write().insert(rel, array.clone());
                Some(Node::ArrayDir { array })
            }
            Err(NotShown::Plain) => Some(Node::Dir { rel }),
            Err(NotShown::Unsupported(why)) => {
                let v2 = self.format == ViewFormat::V2;
                if self.warned.lock().insert(rel.clone()) {
                    if v2 {
                        log::warn!("{}: left out of the v2 view: {why}", rel.display());
                    } else {
                        log::warn!(
                            "{}/zarr.json passes through unchanged: {why}",
                            rel.display()
                        );
                    }
                }
                (!v2).then_some(Node::Dir { rel })
            }
        }
    }

    fn load_array(
        &self,
        rel: &Path,
        dir_meta: EntryMeta,
    ) -> std::result::Result<ShardedArray, NotShown> {
        let json_rel = rel.join("zarr.json");
        let unsupported = |e: String| NotShown::Unsupported(e);
        let Some(file) = self
            .store
            .open(&json_rel)
            .map_err(|e| unsupported(e.to_string()))?
        else {
            return Err(NotShown::Plain);
        };
        let (bytes, json_meta) =
            read_metadata(file.as_ref()).map_err(|e| unsupported(e.to_string()))?;
        let meta = match format::metadata::parse(&bytes).map_err(|e| unsupported(e.to_string()))? {
            MetaNode::Group => return Err(NotShown::Plain),
            MetaNode::Array(a) => a,
        };
        let layout = match &meta.presentation {
            Presentation::Sharded(l) => l.clone(),
            Presentation::Plain if self.format == ViewFormat::V2 => {
                return Err(unsupported(
                    "not sharded (the v2 view shows sharded arrays only)".into(),
                ));
            }
            Presentation::Plain => return Err(NotShown::Plain),
            Presentation::Unsupported(why) => {
                return Err(unsupported(format!(
                    "cannot present this sharded array: {why}"
                )));
            }
        };
        let store_keys = meta.key_encoding;
        self.build_array(
            ArraySource {
                rel: rel.to_path_buf(),
                data_rel: rel.to_path_buf(),
                meta_rel: json_rel,
                store_keys,
                draft: false,
            },
            *meta,
            layout,
            dir_meta,
            json_meta,
        )
        .map_err(unsupported)
    }

    /// The array as this view shows it.
    fn build_array(
        &self,
        src: ArraySource,
        meta: format::ArrayMeta,
        layout: format::ShardLayout,
        dir_meta: EntryMeta,
        json_meta: EntryMeta,
    ) -> std::result::Result<ShardedArray, String> {
        let json = Arc::new(meta.unsharded_json(&layout));
        let (shown_keys, v2) = match self.format {
            ViewFormat::V3 if src.draft => (
                format::ChunkKeyEncoding {
                    kind: format::KeyKind::Default,
                    separator: src.store_keys.separator,
                },
                None,
            ),
            ViewFormat::V3 => (src.store_keys, None),
            ViewFormat::V2 => {
                let keys = format::v2::shown_keys(src.store_keys);
                let zarray = format::v2::zarray(
                    &meta.doc,
                    &layout.shape,
                    layout.inner_chunk_shape(),
                    &layout.inner_codecs,
                    keys,
                )?;
                let zattrs = format::v2::zattrs(&meta.doc);
                (
                    keys,
                    Some((
                        Arc::new(format::v2::to_bytes(&zarray)),
                        Arc::new(format::v2::to_bytes(&zattrs)),
                    )),
                )
            }
        };
        Ok(ShardedArray {
            rel: src.rel,
            data_rel: src.data_rel,
            meta_rel: src.meta_rel,
            store_keys: src.store_keys,
            shown_keys,
            draft: src.draft,
            meta,
            layout,
            json,
            v2,
            dir_meta,
            json_meta,
        })
    }

    // ----- files -----------------------------------------------------------------------

    /// Open a file for reading. `write` asks for write access.
    pub fn open(&self, ino: u64, write: bool, truncate: bool) -> Result<Opened> {
        let (path, node) = self.node(ino)?;
        if write {
            let handle = self.open_for_write(ino, &path, &node, truncate)?;
            return Ok(self.add_handle(handle, false));
        }
        let chunk = matches!(node, Node::Chunk { .. });
        // Metadata of a writable view may have been written (or a write of it refused
        // and rolled back) since the kernel learnt its size: have it asked again.
        let meta = self.writer.is_some()
            && matches!(
                node,
                Node::ArrayMeta { .. } | Node::GroupMeta { .. } | Node::Scratch { .. }
            );
        if chunk {
            self.counters.chunk_opens.fetch_add(1, Ordering::Relaxed);
        }
        let (handle, keep_cache) = self.reader(ino, node, true)?;
        let len = match &handle {
            Handle::Chunk { range, .. } if chunk => Some(range.nbytes),
            Handle::Bytes(b) if chunk => Some(b.len() as u64),
            _ => None,
        };
        let stale_size = len.is_some_and(|len| {
            let mut reported = self.reported.lock();
            reported.insert(ino, len).is_some_and(|was| was != len)
        });
        Ok(Opened {
            stale_size: stale_size || meta,
            ..self.add_handle(handle, keep_cache)
        })
    }

    /// What reads of `node` are served from, and whether the kernel may keep the pages it
    /// cached at an earlier open. `at_open`: a chunk's shard is checked for changes now,
    /// and what the inode serves is remembered for the next open's keep-cache decision.
    fn reader(&self, ino: u64, node: Node, at_open: bool) -> Result<(Handle, bool)> {
        Ok(match node {
            Node::Stats => (Handle::Bytes(Arc::new(self.stats_json())), false),
            Node::File { rel } => (
                Handle::Store(self.store.open(&rel)?.ok_or(ViewError::NotFound)?.into()),
                false,
            ),
            Node::ArrayMeta { array, file } => {
                (Handle::Bytes(self.current(&array).meta_bytes(file)), false)
            }
            Node::GroupMeta { ref dir, file } => {
                (Handle::Bytes(Arc::new(self.group_meta(dir, file)?)), false)
            }
            Node::Chunk { array, coords } => {
                match self.chunk(&self.current(&array), &coords, at_open)? {
                    ChunkData::Shard(shard, range) => {
                        let now = (range, shard.meta().map(EntryMeta::version));
                        let keep = at_open && self.served.lock().insert(ino, now) == Some(now);
                        (Handle::Chunk { shard, range }, keep)
                    }
                    ChunkData::Staged(bytes) => {
                        self.served.lock().remove(&ino);
                        (Handle::Bytes(bytes), false)
                    }
                }
            }
            Node::Scratch { ref path, .. } => {
                let Some(file) = self.writer()?.open_scratch(path) else {
                    return self.reader(ino, self.settled(ino)?, at_open);
                };
                (
                    Handle::Scratch {
                        ino,
                        node: node.clone(),
                        file,
                    },
                    false,
                )
            }
            Node::Dir { .. }
            | Node::ArrayDir { .. }
            | Node::KeyDir { .. }
            | Node::DraftGroup { .. } => {
                return Err(ViewError::IsDir);
            }
            Node::Symlink { .. } => {
                return Err(ViewError::Io(io::Error::from_raw_os_error(libc::ELOOP)));
            }
        })
    }

    fn add_handle(&self, handle: Handle, keep_cache: bool) -> Opened {
        let no_flush = !self.commits_on_close(&handle);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, handle);
        Opened {
            fh,
            keep_cache,
            no_flush,
            stale_size: false,
        }
    }

    /// Read through the handle `open` returned.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let handle = self.handle(fh)?;
        self.read_from(&handle, offset, size)
    }

    /// A copy of handle `fh`, taken out of the table's lock.
    fn handle(&self, fh: u64) -> Result<Handle> {
        let handle = self.handles.lock().get(&fh).cloned();
        handle.ok_or(ViewError::StaleHandle(fh))
    }

    /// Read file `ino` without a handle: the kernel opened it without asking
    /// ([`View::set_kernel_opens`]). A chunk is read where its shard's index, as last
    /// checked, puts it.
    pub fn read_ino(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let (_, node) = self.node(ino)?;
        let (handle, _) = self.reader(ino, node, false)?;
        self.read_from(&handle, offset, size)
    }

    fn read_from(&self, handle: &Handle, offset: u64, size: u32) -> Result<Vec<u8>> {
        match handle {
            Handle::Bytes(b) => {
                let start = (offset.min(b.len() as u64)) as usize;
                let end = (start + size as usize).min(b.len());
                Ok(b[start..end].to_vec())
            }
            Handle::Store(f) => {
                let mut buf = vec![0; size as usize];
                let mut n = 0;
                while n < buf.len() {
                    match f.read_at(&mut buf[n..], offset + n as u64)? {
                        0 => break,
                        k => n += k,
                    }
                }
                buf.truncate(n);
                Ok(buf)
            }
            Handle::Chunk { shard, range } => self.read_chunk(shard, *range, offset, size),
            Handle::StoreRw(f, _) => {
                let mut buf = vec![0; size as usize];
                let n = f.read_at(&mut buf, offset)?;
                buf.truncate(n);
                Ok(buf)
            }
            Handle::Scratch { file, .. } => {
                let f = file.lock();
                let start = (offset.min(f.data.len() as u64)) as usize;
                let end = (start + size as usize).min(f.data.len());
                Ok(f.data[start..end].to_vec())
            }
        }
    }

    fn read_chunk(
        &self,
        shard: &Shard,
        range: ChunkRange,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>> {
        let c = &self.counters;
        c.chunk_reads.fetch_add(1, Ordering::Relaxed);
        let n = u64::from(size).min(range.nbytes.saturating_sub(offset));
        c.chunk_bytes_read.fetch_add(n, Ordering::Relaxed);
        shard
            .read(range, offset, size)
            .map_err(|err| ViewError::Shard {
                shard: shard.rel().to_path_buf(),
                err,
            })
    }

    /// Close a file; a written chunk is committed (staged) when its last handle closes.
    pub fn release(&self, fh: u64) -> Result<()> {
        let handle = self.handles.lock().remove(&fh);
        match handle {
            Some(Handle::Scratch { ino, node, file }) => self.release_scratch(ino, &node, &file),
            Some(Handle::StoreRw(f, _)) => {
                drop(f);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    // ----- directories -----------------------------------------------------------------

    /// Open directory `ino`: its listing, with `.` and `..`, is taken now.
    pub fn opendir(&self, ino: u64) -> Result<u64> {
        let mut entries = vec![
            DirEntry {
                ino,
                name: ".".into(),
                kind: Kind::Dir,
            },
            DirEntry {
                ino: ROOT_INO,
                name: "..".into(),
                kind: Kind::Dir,
            },
        ];
        entries.extend(self.readdir(ino)?);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs.lock().insert(fh, Arc::new(entries));
        Ok(fh)
    }

    /// The listing of an open directory; `readdir` continues it at its offset.
    pub fn dir_entries(&self, fh: u64) -> Result<Arc<Vec<DirEntry>>> {
        self.dirs
            .lock()
            .get(&fh)
            .cloned()
            .ok_or(ViewError::StaleHandle(fh))
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }

    /// Every entry of directory `ino` (without `.` and `..`), sorted by name.
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>> {
        let (path, node) = self.node(ino)?;
        let mut entries = match &node {
            Node::Dir { rel } if self.format == ViewFormat::V2 => self.list_v2_dir(rel)?,
            Node::Dir { rel } => self.list_store(rel, |_| true)?,
            Node::DraftGroup { path } => self.list_draft_group(path),
            Node::ArrayDir { array } => self.list_array(array)?,
            Node::KeyDir { array, coords } => self.list_keys(array, coords)?,
            _ => return Err(ViewError::NotDir),
        };
        if self.writer.is_some() {
            entries.extend(self.written_entries(&path, &node));
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        entries.dedup_by(|a, b| a.name == b.name);
        for e in &mut entries {
            let child = path.join(&e.name);
            e.ino = self
                .inodes
                .peek(&child)
                .unwrap_or_else(|| synthetic_ino(&child));
        }
        Ok(entries)
    }

    /// Pass-through entries of a store directory that `keep` accepts.
    fn list_store(&self, rel: &Path, keep: impl Fn(&OsStr) -> bool) -> Result<Vec<DirEntry>> {
        Ok(self
            .store
            .list(rel)?
            .into_iter()
            .filter(|e| keep(&e.name))
            .filter_map(|e| {
                let kind = match e.kind {
                    EntryKind::Dir => Kind::Dir,
                    EntryKind::File => Kind::File,
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
}

/// The bytes and the metadata of an open metadata file (at most `MAX_METADATA_BYTES`).
fn read_metadata(file: &dyn StoreFile) -> io::Result<(Vec<u8>, EntryMeta)> {
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

/// A `d_ino` for a listed entry the kernel has not looked up yet: a hash of its path
/// with the top bit set, so it never equals an interned inode.
fn synthetic_ino(path: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    h.finish() | (1 << 63)
}
