//! Writes through the view: scratch files, commits of chunks and metadata, new arrays,
//! and the operations that change the tree (create, mkdir, unlink, rmdir, rename, link).
//!
//! * In an array's directories every created file is a *scratch* file, held in memory
//!   (bounded). Closing a written file at a valid in-grid chunk key, or renaming or
//!   linking a file onto one, *commits* it: the bytes are staged and visible at once.
//!   A name that is no valid key stays a scratch file; renaming onto an invalid key is
//!   refused (`EINVAL`).
//! * Writing `zarr.json` of a sharded array may change attributes, shape and dimension
//!   names; anything else (data type, chunk shape, codecs, ...) is refused (`EINVAL`).
//! * Outside arrays, files pass through to the store. A `zarr.json` that lands in a
//!   store directory and describes an unsharded array makes it a sharded one (inner
//!   chunks = the writer's chunks); chunk files already there are taken in.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde_json::Value;

use super::{Attr, ChunkData, Handle, Kind, Node, Opened, Result, ShardedArray, View, ViewError};
use crate::compact::Compactor;
use crate::format::{self, KeyPath};
use crate::write::flush::{Flusher, default_chunks_per_shard};
use crate::write::staging::Staging;

/// Members of an array's `zarr.json` that a write through the view may not change.
const PROTECTED: [&str; 7] = [
    "zarr_format",
    "node_type",
    "data_type",
    "chunk_grid",
    "chunk_key_encoding",
    "codecs",
    "fill_value",
];

/// How a writable view writes.
pub struct WriteConfig {
    /// The store's directory (writes go to files beneath it).
    pub root: PathBuf,
    /// Bytes staged before writers wait for a flush; scratch files get as much again.
    pub write_buffer: u64,
    /// Inner chunks per shard of arrays created through the view (`None`: about
    /// `shard_target_bytes` of uncompressed chunks per shard).
    pub chunks_per_shard: Option<Vec<u64>>,
    pub shard_target_bytes: u64,
    pub compactor: Arc<dyn Compactor>,
}

/// An in-memory file.
#[derive(Debug, Default)]
pub struct Scratch {
    pub(super) data: Vec<u8>,
    pub(super) opens: u32,
    /// Written since it was opened or created: commit it on the last close.
    pub(super) dirty: bool,
}

/// The write side of a view.
pub struct Writer {
    root: PathBuf,
    pub(super) staging: Staging,
    flusher: Flusher,
    scratch: Mutex<HashMap<PathBuf, Arc<Mutex<Scratch>>>>,
    scratch_bytes: AtomicU64,
    scratch_limit: u64,
    /// Key directories made by `mkdir` that hold no chunk yet: (array, prefix).
    vdirs: Mutex<HashSet<(PathBuf, Vec<u64>)>>,
    chunks_per_shard: Option<Vec<u64>>,
    shard_target: u64,
    /// Kernel cache invalidations, sent from a thread of the mount (never from inside
    /// a request, where the kernel may hold the directory's lock).
    invalidations: Mutex<Option<std::sync::mpsc::Sender<Invalidation>>>,
}

/// A kernel cache entry to drop.
#[derive(Debug, Clone)]
pub enum Invalidation {
    Inode(u64),
    Entry {
        parent: u64,
        name: std::ffi::OsString,
    },
}

impl Writer {
    pub fn new(config: WriteConfig) -> Self {
        Writer {
            flusher: Flusher::new(config.root.clone(), config.compactor),
            root: config.root,
            staging: Staging::new(config.write_buffer),
            scratch: Mutex::new(HashMap::new()),
            scratch_bytes: AtomicU64::new(0),
            scratch_limit: config.write_buffer.max(1 << 20),
            vdirs: Mutex::new(HashSet::new()),
            chunks_per_shard: config.chunks_per_shard,
            shard_target: config.shard_target_bytes,
            invalidations: Mutex::new(None),
        }
    }

    pub fn compactor_name(&self) -> &'static str {
        self.flusher.compactor_name()
    }

    pub fn flusher(&self) -> &Flusher {
        &self.flusher
    }

    pub fn staged_bytes(&self) -> u64 {
        self.staging.bytes()
    }

    /// Where kernel invalidations go (set by the mount once its session runs).
    pub fn set_invalidations(&self, tx: std::sync::mpsc::Sender<Invalidation>) {
        *self.invalidations.lock() = Some(tx);
    }

    fn invalidate(&self, i: Invalidation) {
        if let Some(tx) = self.invalidations.lock().as_ref() {
            let _ = tx.send(i);
        }
    }

    pub(super) fn scratch(&self, path: &Path) -> Option<Arc<Mutex<Scratch>>> {
        self.scratch.lock().get(path).cloned()
    }

    pub(super) fn scratch_len(&self, path: &Path) -> Option<u64> {
        self.scratch(path).map(|s| s.lock().data.len() as u64)
    }

    fn new_scratch(&self, path: &Path, data: Vec<u8>, dirty: bool) -> Result<Arc<Mutex<Scratch>>> {
        self.reserve(data.len() as u64)?;
        let file = Arc::new(Mutex::new(Scratch {
            data,
            opens: 0,
            dirty,
        }));
        if let Some(old) = self.scratch.lock().insert(path.to_path_buf(), file.clone()) {
            self.unreserve(old.lock().data.len() as u64);
        }
        Ok(file)
    }

    fn remove_scratch(&self, path: &Path) -> Option<Vec<u8>> {
        let file = self.scratch.lock().remove(path)?;
        let data = std::mem::take(&mut file.lock().data);
        self.unreserve(data.len() as u64);
        Some(data)
    }

    fn reserve(&self, n: u64) -> Result<()> {
        let now = self.scratch_bytes.fetch_add(n, Ordering::Relaxed) + n;
        if now > self.scratch_limit {
            self.scratch_bytes.fetch_sub(n, Ordering::Relaxed);
            return Err(ViewError::NoSpace);
        }
        Ok(())
    }

    fn unreserve(&self, n: u64) {
        self.scratch_bytes.fetch_sub(n, Ordering::Relaxed);
    }

    /// Whether a key directory of `array` with leading coordinates `prefix` exists only
    /// in memory (made by mkdir, or holding staged chunks).
    pub(super) fn has_keys_under(&self, array: &ShardedArray, prefix: &[u64]) -> bool {
        self.vdirs
            .lock()
            .iter()
            .any(|(a, c)| a == &array.rel && c.starts_with(prefix))
            || self
                .staging
                .under(&array.rel, prefix)
                .iter()
                .any(|(_, exists)| *exists)
    }
}

impl View {
    pub(super) fn writer(&self) -> Result<&Writer> {
        self.writer.as_ref().ok_or(ViewError::ReadOnly)
    }

    pub fn write_side(&self) -> Option<&Writer> {
        self.writer.as_ref()
    }

    /// The newest metadata of `array` (it may have been rewritten since the node was made).
    pub(super) fn current(&self, array: &Arc<ShardedArray>) -> Arc<ShardedArray> {
        self.arrays
            .read()
            .get(&array.rel)
            .cloned()
            .unwrap_or_else(|| array.clone())
    }

    fn root_path(&self, rel: &Path) -> Result<PathBuf> {
        Ok(self.writer()?.root.join(rel))
    }

    fn writable(&self, array: &ShardedArray) -> Result<()> {
        if array.layout.levels.len() > 1 {
            log::warn!(
                "{}: writes to nested sharded arrays are not supported",
                array.rel.display()
            );
            return Err(ViewError::ReadOnly);
        }
        Ok(())
    }

    /// The key directory a path's parent is, for scratch nodes: `None` = array directory.
    fn parent_key(&self, path: &Path) -> Option<Vec<u64>> {
        let parent = path.parent()?;
        match self.inodes.peek(parent).and_then(|i| self.inodes.get(i)) {
            Some((_, Node::KeyDir { coords, .. })) => Some(coords),
            _ => None,
        }
    }

    pub(super) fn open_for_write(
        &self,
        ino: u64,
        path: &Path,
        node: &Node,
        truncate: bool,
    ) -> Result<Handle> {
        let w = self.writer()?;
        let scratch_node = |array: &Arc<ShardedArray>| Node::Scratch {
            path: path.to_path_buf(),
            array: self.current(array),
            parent: self.parent_key(path),
        };
        let (file, node) = match node {
            Node::Stats => return Err(ViewError::ReadOnly),
            Node::File { rel } => {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .truncate(truncate)
                    .open(w.root.join(rel))?;
                return Ok(Handle::StoreRw(f, rel.clone()));
            }
            Node::Chunk { array, coords } => {
                let array = self.current(array);
                self.writable(&array)?;
                let data = if truncate {
                    Vec::new()
                } else {
                    self.chunk_bytes(&array, coords)?
                };
                (w.new_scratch(path, data, truncate)?, scratch_node(&array))
            }
            Node::ArrayMeta { array } => {
                let data = if truncate {
                    Vec::new()
                } else {
                    self.current(array).json.to_vec()
                };
                (w.new_scratch(path, data, truncate)?, scratch_node(array))
            }
            Node::Scratch { path: p, .. } => {
                let file = w.scratch(p).ok_or(ViewError::NotFound)?;
                if truncate {
                    let mut f = file.lock();
                    w.unreserve(f.data.len() as u64);
                    f.data.clear();
                    f.dirty = true;
                }
                (file, node.clone())
            }
            Node::Dir { .. } | Node::ArrayDir { .. } | Node::KeyDir { .. } => {
                return Err(ViewError::IsDir);
            }
            Node::Symlink { .. } => {
                return Err(ViewError::Io(std::io::Error::from_raw_os_error(
                    libc::ELOOP,
                )));
            }
        };
        file.lock().opens += 1;
        self.inodes.update(ino, node.clone());
        Ok(Handle::Scratch { ino, node, file })
    }

    fn chunk_bytes(&self, array: &ShardedArray, coords: &[u64]) -> Result<Vec<u8>> {
        match self.chunk(array, coords, true)? {
            ChunkData::Staged(b) => Ok(b.to_vec()),
            ChunkData::Shard(shard, range) => {
                let len = u32::try_from(range.nbytes).map_err(|_| ViewError::NoSpace)?;
                shard.read(range, 0, len).map_err(|err| ViewError::Shard {
                    shard: shard.rel().to_path_buf(),
                    err,
                })
            }
        }
    }

    /// Commit a written scratch file that sits at a chunk key or at `zarr.json` (on
    /// `close` — `flush` — so that a refusal reaches the writer — and on `fsync`).
    fn commit_scratch(&self, node: &Node, file: &Arc<Mutex<Scratch>>) -> Result<()> {
        let Node::Scratch {
            path,
            array,
            parent,
        } = node
        else {
            return Ok(());
        };
        let name = path.file_name().unwrap_or_default();
        if !matches!(
            self.target(array, parent.as_deref(), name)?,
            Target::Meta | Target::Chunk(_)
        ) {
            return Ok(());
        }
        let data = {
            let mut f = file.lock();
            if !f.dirty {
                return Ok(());
            }
            f.dirty = false;
            f.data.clone()
        };
        self.put(array, parent.as_deref(), name, path, data)
            .map(|_| ())
    }

    /// `close` of a file handle (FUSE `flush`): commits a written chunk or metadata, and
    /// adopts a new array whose `zarr.json` was written in place. This runs before
    /// `close` returns — `release` comes later, asynchronously, and a writer like
    /// `cp -r` would already be creating the chunk files.
    pub fn flush_handle(&self, fh: u64) -> Result<()> {
        enum Pending {
            Scratch(Node, Arc<Mutex<Scratch>>),
            Metadata(PathBuf),
        }
        let pending = match self.handles.lock().get(&fh) {
            Some(Handle::Scratch { node, file, .. }) => {
                Some(Pending::Scratch(node.clone(), file.clone()))
            }
            Some(Handle::StoreRw(_, rel)) if rel.file_name() == Some(OsStr::new("zarr.json")) => {
                Some(Pending::Metadata(
                    rel.parent().unwrap_or(Path::new("")).to_path_buf(),
                ))
            }
            _ => None,
        };
        match pending {
            Some(Pending::Scratch(node, file)) => self.commit_scratch(&node, &file),
            Some(Pending::Metadata(dir)) => self.adopt_new_array(&dir),
            None => Ok(()),
        }
    }

    /// The last handle of a scratch file closed: anything still uncommitted is
    /// committed, and a scratch file at a chunk key or `zarr.json` goes back to being
    /// that chunk or metadata; other scratch files stay, waiting for a rename.
    pub(super) fn release_scratch(
        &self,
        ino: u64,
        node: &Node,
        file: &Arc<Mutex<Scratch>>,
    ) -> Result<()> {
        let Node::Scratch {
            path,
            array,
            parent,
        } = node
        else {
            return Ok(());
        };
        let last = {
            let mut f = file.lock();
            f.opens = f.opens.saturating_sub(1);
            f.opens == 0
        };
        if !last {
            return Ok(());
        }
        let committed = self.commit_scratch(node, file);
        self.settle_scratch(ino, path, array, parent.as_deref())?;
        committed
    }

    /// A scratch file at a chunk key or `zarr.json` whose last handle closed goes back.
    fn settle_scratch(
        &self,
        ino: u64,
        path: &Path,
        array: &Arc<ShardedArray>,
        parent: Option<&[u64]>,
    ) -> Result<()> {
        let w = self.writer()?;
        let Some(file) = w.scratch(path) else {
            return Ok(());
        };
        if file.lock().opens > 0 {
            return Ok(());
        }
        let name = path.file_name().unwrap_or_default();
        let back = match self.target(array, parent, name)? {
            Target::Meta => Node::ArrayMeta {
                array: self.current(array),
            },
            Target::Chunk(coords) => Node::Chunk {
                array: self.current(array),
                coords,
            },
            Target::Scratch | Target::Invalid(_) => return Ok(()),
        };
        w.remove_scratch(path);
        self.inodes.update(ino, back);
        Ok(())
    }

    /// What a name in an array's namespace is, for a write.
    fn target(
        &self,
        array: &Arc<ShardedArray>,
        parent: Option<&[u64]>,
        name: &OsStr,
    ) -> Result<Target> {
        let array = self.current(array);
        if parent.is_none() && name == "zarr.json" {
            return Ok(Target::Meta);
        }
        let Some(kp) = name
            .to_str()
            .and_then(|n| array.encoding().child(array.layout.ndim(), parent, n))
        else {
            return Ok(Target::Scratch);
        };
        Ok(match kp {
            KeyPath::Chunk(c) if array.layout.chunk_in_grid(&c) => Target::Chunk(c),
            KeyPath::Chunk(c) => Target::Invalid(format!(
                "chunk {c:?} lies outside the grid {:?}",
                array.layout.chunk_counts()
            )),
            KeyPath::Dir(_) => Target::Invalid("a chunk key directory, not a chunk".into()),
        })
    }

    /// Write `data` at `name` in an array's namespace (commit a chunk, update the
    /// metadata, or keep a scratch file). Returns the node now at that path.
    fn put(
        &self,
        array: &Arc<ShardedArray>,
        parent: Option<&[u64]>,
        name: &OsStr,
        path: &Path,
        data: Vec<u8>,
    ) -> Result<Node> {
        match self.target(array, parent, name)? {
            Target::Meta => {
                let array = self.update_metadata(array, &data)?;
                Ok(Node::ArrayMeta { array })
            }
            Target::Chunk(coords) => {
                let array = self.current(array);
                self.writable(&array)?;
                self.commit_chunk(&array, coords.clone(), Some(data))?;
                Ok(Node::Chunk { array, coords })
            }
            Target::Invalid(why) => {
                log::warn!("{}: refused: {why}", path.display());
                Err(ViewError::Invalid(why))
            }
            Target::Scratch => {
                let file = self.writer()?.new_scratch(path, data, false)?;
                drop(file);
                Ok(Node::Scratch {
                    path: path.to_path_buf(),
                    array: self.current(array),
                    parent: parent.map(<[u64]>::to_vec),
                })
            }
        }
    }

    fn commit_chunk(
        &self,
        array: &ShardedArray,
        coords: Vec<u64>,
        data: Option<Vec<u8>>,
    ) -> Result<()> {
        let w = self.writer()?;
        let counter = if data.is_some() {
            &self.counters.chunks_committed
        } else {
            &self.counters.chunks_deleted
        };
        counter.fetch_add(1, Ordering::Relaxed);
        w.staging.put(&array.rel, coords, data.map(Arc::new));
        if w.staging.over_limit() {
            // Back-pressure: the writer that filled the buffer flushes it.
            self.flush_all()?;
        }
        Ok(())
    }

    /// A new `zarr.json` for a sharded array, as a reader of the view wrote it.
    fn update_metadata(
        &self,
        array: &Arc<ShardedArray>,
        bytes: &[u8],
    ) -> Result<Arc<ShardedArray>> {
        let array = self.current(array);
        let invalid = |why: String| {
            log::warn!("{}/zarr.json: refused: {why}", array.rel.display());
            ViewError::Invalid(why)
        };
        let new: Value =
            serde_json::from_slice(bytes).map_err(|e| invalid(format!("not JSON: {e}")))?;
        let Value::Object(new) = new else {
            return Err(invalid("not a JSON object".into()));
        };
        let shown: Value =
            serde_json::from_slice(&array.json).map_err(|e| invalid(e.to_string()))?;
        for key in PROTECTED {
            if new.get(key) != shown.get(key) {
                return Err(invalid(format!(
                    "changing {key} of a sharded array is not supported (only attributes, shape, dimension names)"
                )));
            }
        }
        let mut doc = array.meta.doc.clone();
        doc.retain(|k, _| PROTECTED.contains(&k.as_str()) || new.contains_key(k));
        for (k, v) in new {
            if !PROTECTED.contains(&k.as_str()) {
                doc.insert(k, v);
            }
        }
        let mut out =
            serde_json::to_vec_pretty(&Value::Object(doc)).map_err(|e| invalid(e.to_string()))?;
        out.push(b'\n');
        self.flush_array(&array)?;
        write_atomically(&self.root_path(&array.rel.join("zarr.json"))?, &out)?;
        self.reload_array(&array.rel)
    }

    fn reload_array(&self, rel: &Path) -> Result<Arc<ShardedArray>> {
        let dir_meta = self.stat_rel(rel)?;
        let node = self.classify_dir(rel.to_path_buf(), dir_meta);
        let Node::ArrayDir { array } = node else {
            return Err(ViewError::Invalid(format!(
                "{} is no longer a sharded array",
                rel.display()
            )));
        };
        self.refresh_subtree(rel);
        Ok(array)
    }

    /// Re-resolve every known inode at or below the store directory `rel` (the view path
    /// equals the store path there) after the kind of that directory changed.
    fn refresh_subtree(&self, rel: &Path) {
        let w = self.writer.as_ref();
        for (ino, path) in self.inodes.under(rel) {
            if let Ok(Some(node)) = self.resolve(&path) {
                self.inodes.update(ino, node);
            }
            if let Some(w) = w {
                w.invalidate(Invalidation::Inode(ino));
                // The directory itself keeps its inode and dentry (dropping that dentry
                // would fail operations already under way in it); its children change.
                if path.as_path() != rel
                    && let (Some(parent), Some(name)) = (path.parent(), path.file_name())
                    && let Some(pino) = self.inodes.peek(parent)
                {
                    w.invalidate(Invalidation::Entry {
                        parent: pino,
                        name: name.to_os_string(),
                    });
                }
            }
        }
    }

    /// The node at a view path, walking from the root.
    fn resolve(&self, path: &Path) -> Result<Option<Node>> {
        let (_, mut node) = self.node(super::ROOT_INO)?;
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

    /// Entries that exist only in memory: scratch files, key directories made by mkdir,
    /// staged chunks in shards that do not exist yet.
    pub(super) fn written_entries(&self, path: &Path, node: &Node) -> Vec<super::DirEntry> {
        let Some(w) = &self.writer else {
            return Vec::new();
        };
        let (array, prefix) = match node {
            Node::ArrayDir { array } => (self.current(array), None),
            Node::KeyDir { array, coords } => (self.current(array), Some(coords.clone())),
            _ => return Vec::new(),
        };
        let entry = |name: String, kind| super::DirEntry {
            ino: 0,
            name: name.into(),
            kind,
        };
        let mut out: Vec<_> = w
            .scratch
            .lock()
            .keys()
            .filter(|p| p.parent() == Some(path))
            .filter_map(|p| {
                p.file_name()
                    .map(|n| entry(n.to_string_lossy().into_owned(), Kind::File))
            })
            .collect();
        let enc = array.encoding();
        let ndim = array.layout.ndim();
        let k = prefix.as_ref().map_or(0, Vec::len);
        let p = prefix.clone().unwrap_or_default();
        let mut keys: Vec<(Vec<u64>, bool)> = w
            .vdirs
            .lock()
            .iter()
            .filter(|(a, _)| a == &array.rel)
            .map(|(_, c)| (c.clone(), false))
            .collect();
        keys.extend(
            w.staging
                .under(&array.rel, &p)
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

    // ----- operations ------------------------------------------------------------------

    /// Create and open `name` in `parent`.
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        exclusive: bool,
        truncate: bool,
    ) -> Result<(Attr, Opened)> {
        let (ppath, pnode) = self.node(parent)?;
        let path = ppath.join(name);
        if let Some(existing) = self.child(&ppath, &pnode, name)? {
            if exclusive {
                return Err(ViewError::Exists);
            }
            let ino = self.inodes.intern(path.clone(), existing.clone());
            let handle = self.open_for_write(ino, &path, &existing, truncate)?;
            return Ok((self.getattr(ino)?, self.add_handle(handle, false)));
        }
        let (node, handle) = match &pnode {
            Node::Dir { rel } => {
                let rel = rel.join(name);
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(self.root_path(&rel)?)?;
                (Node::File { rel: rel.clone() }, Handle::StoreRw(f, rel))
            }
            Node::ArrayDir { array } | Node::KeyDir { array, .. } => {
                let array = self.current(array);
                self.writable(&array)?;
                let file = self.writer()?.new_scratch(&path, Vec::new(), true)?;
                file.lock().opens += 1;
                let parent = match &pnode {
                    Node::KeyDir { coords, .. } => Some(coords.clone()),
                    _ => None,
                };
                let node = Node::Scratch {
                    path: path.clone(),
                    array,
                    parent,
                };
                (node.clone(), Handle::Scratch { ino: 0, node, file })
            }
            _ => return Err(ViewError::NotDir),
        };
        let ino = self.inodes.intern(path, node);
        let handle = match handle {
            Handle::Scratch { node, file, .. } => Handle::Scratch { ino, node, file },
            h => h,
        };
        Ok((self.getattr(ino)?, self.add_handle(handle, false)))
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let handles = self.handles.lock();
        match handles.get(&fh).ok_or(ViewError::StaleHandle(fh))? {
            Handle::StoreRw(f, _) => {
                f.write_all_at(data, offset)?;
            }
            Handle::Scratch { file, .. } => {
                let file = file.clone();
                drop(handles);
                let w = self.writer()?;
                let mut f = file.lock();
                let end = usize::try_from(offset).map_err(|_| ViewError::NoSpace)? + data.len();
                if end > f.data.len() {
                    w.reserve((end - f.data.len()) as u64)?;
                    f.data.resize(end, 0);
                }
                f.data[offset as usize..end].copy_from_slice(data);
                f.dirty = true;
            }
            _ => {
                return Err(ViewError::Io(std::io::Error::from_raw_os_error(
                    libc::EBADF,
                )));
            }
        }
        Ok(data.len() as u32)
    }

    /// Truncate (or extend) a file.
    pub fn set_size(&self, ino: u64, size: u64) -> Result<Attr> {
        let (path, node) = self.node(ino)?;
        let w = self.writer()?;
        match &node {
            Node::Stats => return Err(ViewError::ReadOnly),
            Node::File { rel } => std::fs::OpenOptions::new()
                .write(true)
                .open(w.root.join(rel))?
                .set_len(size)?,
            Node::Scratch { path, .. } => {
                let file = w.scratch(path).ok_or(ViewError::NotFound)?;
                let mut f = file.lock();
                let size = usize::try_from(size).map_err(|_| ViewError::NoSpace)?;
                if size > f.data.len() {
                    w.reserve((size - f.data.len()) as u64)?;
                } else {
                    w.unreserve((f.data.len() - size) as u64);
                }
                f.data.resize(size, 0);
                f.dirty = true;
            }
            Node::Chunk { array, coords } => {
                let array = self.current(array);
                self.writable(&array)?;
                let mut data = self.chunk_bytes(&array, coords)?;
                data.resize(usize::try_from(size).map_err(|_| ViewError::NoSpace)?, 0);
                self.commit_chunk(&array, coords.clone(), Some(data))?;
            }
            Node::ArrayMeta { .. } => {
                let h = self.open_for_write(ino, &path, &node, false)?;
                if let Handle::Scratch { file, node, .. } = h {
                    file.lock().data.resize(size as usize, 0);
                    file.lock().dirty = true;
                    self.release_scratch(ino, &node, &file)?;
                }
            }
            Node::Dir { .. } | Node::ArrayDir { .. } | Node::KeyDir { .. } => {
                return Err(ViewError::IsDir);
            }
            Node::Symlink { .. } => return Err(ViewError::Invalid("a symlink".into())),
        }
        self.getattr(ino)
    }

    pub fn mkdir(&self, parent: u64, name: &OsStr) -> Result<Attr> {
        let (ppath, pnode) = self.node(parent)?;
        if self.child(&ppath, &pnode, name)?.is_some() {
            return Err(ViewError::Exists);
        }
        let node = match &pnode {
            Node::Dir { rel } => {
                let rel = rel.join(name);
                std::fs::create_dir(self.root_path(&rel)?)?;
                let meta = self.stat_rel(&rel)?;
                self.classify_dir(rel, meta)
            }
            Node::ArrayDir { array } | Node::KeyDir { array, .. } => {
                let array = self.current(array);
                let prefix = match &pnode {
                    Node::KeyDir { coords, .. } => Some(coords.as_slice()),
                    _ => None,
                };
                let kp = name
                    .to_str()
                    .and_then(|n| array.encoding().child(array.layout.ndim(), prefix, n));
                match kp {
                    Some(KeyPath::Dir(coords))
                        if coords
                            .iter()
                            .zip(array.layout.chunk_counts())
                            .all(|(c, n)| c < n) =>
                    {
                        self.writer()?
                            .vdirs
                            .lock()
                            .insert((array.rel.clone(), coords.clone()));
                        Node::KeyDir { array, coords }
                    }
                    _ => {
                        let why = format!(
                            "{}: not a chunk key directory of this array",
                            ppath.join(name).display()
                        );
                        log::warn!("mkdir refused: {why}");
                        return Err(ViewError::Invalid(why));
                    }
                }
            }
            _ => return Err(ViewError::NotDir),
        };
        let ino = self.inodes.intern(ppath.join(name), node);
        self.getattr(ino)
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> Result<()> {
        let (ppath, pnode) = self.node(parent)?;
        let path = ppath.join(name);
        let node = self
            .child(&ppath, &pnode, name)?
            .ok_or(ViewError::NotFound)?;
        let w = self.writer()?;
        match &node {
            Node::Stats => return Err(ViewError::ReadOnly),
            Node::Scratch { path, .. } => {
                w.remove_scratch(path);
            }
            Node::Chunk { array, coords } => {
                let array = self.current(array);
                self.writable(&array)?;
                self.commit_chunk(&array, coords.clone(), None)?;
            }
            Node::ArrayMeta { array } => {
                // The array stops being one: make its chunks durable, then remove the
                // metadata; the directory then shows the store as it is.
                let array = self.current(array);
                self.flush_array(&array)?;
                std::fs::remove_file(w.root.join(&array.rel).join("zarr.json"))?;
                self.arrays.write().remove(&array.rel);
                w.staging.discard(&array.rel);
                w.vdirs.lock().retain(|(a, _)| a != &array.rel);
                self.inodes.update_path(
                    &ppath,
                    Node::Dir {
                        rel: array.rel.clone(),
                    },
                );
                self.inodes.detach(&path);
                self.refresh_subtree(&array.rel);
                return Ok(());
            }
            Node::File { rel } | Node::Symlink { rel } => std::fs::remove_file(w.root.join(rel))?,
            Node::Dir { .. } | Node::ArrayDir { .. } | Node::KeyDir { .. } => {
                return Err(ViewError::IsDir);
            }
        }
        self.inodes.detach(&path);
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> Result<()> {
        let (ppath, pnode) = self.node(parent)?;
        let path = ppath.join(name);
        let node = self
            .child(&ppath, &pnode, name)?
            .ok_or(ViewError::NotFound)?;
        let w = self.writer()?;
        match &node {
            Node::Dir { rel } => std::fs::remove_dir(w.root.join(rel))?,
            Node::ArrayDir { array } => {
                self.flush_array(array)?;
                std::fs::remove_dir(w.root.join(&array.rel))?;
            }
            Node::KeyDir { array, coords } => {
                let array = self.current(array);
                self.flush_array(&array)?;
                let ino = self.inodes.intern(path.clone(), node.clone());
                let empty = self.readdir(ino).map(|e| e.is_empty());
                self.inodes.forget(ino, 1);
                if !empty? {
                    return Err(ViewError::NotEmpty);
                }
                w.vdirs
                    .lock()
                    .retain(|(a, c)| !(a == &array.rel && c.starts_with(coords)));
                let store_dir = w
                    .root
                    .join(array.shard_dir_rel(&array.shard_prefix(coords)));
                // The store directory goes only when no shard is left in it.
                if std::fs::read_dir(&store_dir).is_ok_and(|mut d| d.next().is_none()) {
                    std::fs::remove_dir(&store_dir)?;
                }
            }
            _ => return Err(ViewError::NotDir),
        }
        self.inodes.detach(&path);
        Ok(())
    }

    /// Rename; `noreplace` fails if the target exists.
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        noreplace: bool,
    ) -> Result<()> {
        let (ppath, pnode) = self.node(parent)?;
        let (npath, nnode) = self.node(newparent)?;
        let src = self
            .child(&ppath, &pnode, name)?
            .ok_or(ViewError::NotFound)?;
        let (from, to) = (ppath.join(name), npath.join(newname));
        if self.child(&npath, &nnode, newname)?.is_some() && noreplace {
            return Err(ViewError::Exists);
        }
        let w = self.writer()?;
        let node = match (&src, &nnode) {
            (Node::File { rel } | Node::Symlink { rel }, Node::Dir { rel: dst_dir }) => {
                let dst = dst_dir.join(newname);
                std::fs::rename(w.root.join(rel), w.root.join(&dst))?;
                if newname == "zarr.json" {
                    self.adopt_new_array(dst_dir)?;
                }
                self.resolve(&to)?.ok_or(ViewError::NotFound)?
            }
            (Node::Dir { .. } | Node::ArrayDir { .. } | Node::KeyDir { .. }, _) => {
                return Err(ViewError::Unsupported(
                    "renaming directories is not supported; copy instead".into(),
                ));
            }
            _ => {
                let data = self.content(&src)?;
                let node = self.put_at(&nnode, newname, &to, data)?;
                self.remove_source(&src, &node)?;
                node
            }
        };
        self.inodes.rename(&from, to, node);
        Ok(())
    }

    /// Hard link: a copy at the new name (chunks have no inode of their own to share).
    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> Result<Attr> {
        let (_, src) = self.node(ino)?;
        let (npath, nnode) = self.node(newparent)?;
        let to = npath.join(newname);
        if self.child(&npath, &nnode, newname)?.is_some() {
            return Err(ViewError::Exists);
        }
        let node = match (&src, &nnode) {
            (Node::File { rel }, Node::Dir { rel: dst_dir }) => {
                std::fs::hard_link(
                    self.root_path(rel)?,
                    self.root_path(&dst_dir.join(newname))?,
                )?;
                Node::File {
                    rel: dst_dir.join(newname),
                }
            }
            _ => {
                let data = self.content(&src)?;
                self.put_at(&nnode, newname, &to, data)?
            }
        };
        let ino = self.inodes.intern(to, node);
        self.getattr(ino)
    }

    fn content(&self, node: &Node) -> Result<Vec<u8>> {
        match node {
            Node::File { rel } => Ok(std::fs::read(self.root_path(rel)?)?),
            Node::Scratch { path, .. } => Ok(self
                .writer()?
                .scratch(path)
                .ok_or(ViewError::NotFound)?
                .lock()
                .data
                .clone()),
            Node::Chunk { array, coords } => self.chunk_bytes(&self.current(array), coords),
            Node::ArrayMeta { array } => Ok(self.current(array).json.to_vec()),
            _ => Err(ViewError::Unsupported("not a regular file".into())),
        }
    }

    fn put_at(&self, dir: &Node, name: &OsStr, path: &Path, data: Vec<u8>) -> Result<Node> {
        match dir {
            Node::Dir { rel } => {
                let rel = rel.join(name);
                write_atomically(&self.root_path(&rel)?, &data)?;
                if name == "zarr.json" {
                    self.adopt_new_array(rel.parent().unwrap_or(Path::new("")))?;
                    return self.resolve(path)?.ok_or(ViewError::NotFound);
                }
                Ok(Node::File { rel })
            }
            Node::ArrayDir { array } => self.put(array, None, name, path, data),
            Node::KeyDir { array, coords } => self.put(array, Some(coords), name, path, data),
            _ => Err(ViewError::NotDir),
        }
    }

    fn remove_source(&self, src: &Node, now_at_target: &Node) -> Result<()> {
        let w = self.writer()?;
        match src {
            Node::Scratch { path, .. } => {
                w.remove_scratch(path);
            }
            Node::Chunk { array, coords } => {
                let same = matches!(now_at_target, Node::Chunk { array: a, coords: c } if a.rel == array.rel && c == coords);
                if !same {
                    self.commit_chunk(&self.current(array), coords.clone(), None)?;
                }
            }
            Node::File { rel } => std::fs::remove_file(w.root.join(rel))?,
            Node::ArrayMeta { .. } => {
                return Err(ViewError::Unsupported(
                    "moving an array's zarr.json away".into(),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// A `zarr.json` just landed in the store directory `dir`: if it describes an
    /// unsharded array, make it a sharded one and take in chunk files already there.
    pub(super) fn adopt_new_array(&self, dir: &Path) -> Result<()> {
        let w = self.writer()?;
        let json_path = w.root.join(dir).join("zarr.json");
        let bytes = std::fs::read(&json_path)?;
        let Ok(format::Node::Array(meta)) = format::metadata::parse(&bytes) else {
            return Ok(());
        };
        if !matches!(meta.presentation, format::Presentation::Plain) {
            return Ok(());
        }
        let Some(sharded) = shard_document(&meta, w.chunks_per_shard.as_deref(), w.shard_target)
        else {
            log::warn!(
                "{}: cannot shard this array (irregular grid or odd codecs); kept as written",
                dir.display()
            );
            return Ok(());
        };
        // Chunk files copied in before the metadata (`cp -r` order) would collide with
        // the shard files; move them aside, stage them, flush, then drop them.
        let ingest = collect_chunk_files(&w.root.join(dir), &meta);
        let aside = w.root.join(dir).join(".shardfs-ingest");
        let mut moved = Vec::new();
        if !ingest.is_empty() {
            std::fs::create_dir_all(&aside)?;
            for (i, (coords, file)) in ingest.into_iter().enumerate() {
                let to = aside.join(i.to_string());
                std::fs::rename(&file, &to)?;
                moved.push((coords, to));
            }
            remove_empty_dirs(&w.root.join(dir), &aside);
        }
        write_atomically(&json_path, &sharded)?;
        let array = self.reload_array(dir)?;
        log::info!(
            "{}: new array stored sharded, shards {:?}",
            dir.display(),
            array.layout.shard_shape
        );
        if !moved.is_empty() {
            for (coords, file) in &moved {
                w.staging.put(
                    &array.rel,
                    coords.clone(),
                    Some(Arc::new(std::fs::read(file)?)),
                );
            }
            self.flush_array(&array)?;
            std::fs::remove_dir_all(&aside)?;
        }
        Ok(())
    }

    // ----- durability ------------------------------------------------------------------

    /// Make the staged chunks of `array` durable.
    pub fn flush_array(&self, array: &ShardedArray) -> Result<()> {
        let Some(w) = &self.writer else { return Ok(()) };
        let array = self.arrays.read().get(&array.rel).cloned();
        let Some(array) = array else { return Ok(()) };
        let shards = w
            .flusher
            .flush_array(&w.staging, &array)
            .map_err(|e| ViewError::Flush(e.to_string()))?;
        for rel in shards {
            self.shards.invalidate(&rel);
        }
        Ok(())
    }

    /// Make everything staged durable (fsync of the mount's root, unmount, full buffer).
    pub fn flush_all(&self) -> Result<()> {
        let Some(w) = &self.writer else { return Ok(()) };
        let mut first_err = None;
        for rel in w.staging.arrays(None) {
            let array = self.arrays.read().get(&rel).cloned();
            if let Some(array) = array
                && let Err(e) = self.flush_array(&array)
            {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Flush arrays whose oldest staged chunk is at least `idle` old (the timer).
    pub fn flush_idle(&self, idle: std::time::Duration) {
        let Some(w) = &self.writer else { return };
        for rel in w.staging.arrays(Some(idle)) {
            let array = self.arrays.read().get(&rel).cloned();
            if let Some(array) = array {
                let _ = self.flush_array(&array);
            }
        }
    }

    /// `fsync` of a file: durable when it returns. A chunk still open for writing is
    /// committed with what it holds now (later writes commit again on close).
    pub fn fsync(&self, ino: u64) -> Result<()> {
        let (_, node) = self.node(ino)?;
        if let Node::Scratch { path, .. } = &node
            && let Some(file) = self.writer()?.scratch(path)
        {
            self.commit_scratch(&node, &file)?;
        }
        match node {
            Node::Chunk { array, .. } | Node::Scratch { array, .. } | Node::ArrayMeta { array } => {
                self.flush_array(&array)
            }
            Node::File { rel } => Ok(std::fs::File::open(self.root_path(&rel)?)?.sync_all()?),
            _ => Ok(()),
        }
    }

    /// `fsync` of a directory: an array's directory flushes the array; any other
    /// directory (the mount's root, a group) flushes everything.
    pub fn fsyncdir(&self, ino: u64) -> Result<()> {
        match self.node(ino)?.1 {
            Node::ArrayDir { array } | Node::KeyDir { array, .. } => self.flush_array(&array),
            _ => self.flush_all(),
        }
    }
}

enum Target {
    Meta,
    Chunk(Vec<u64>),
    Scratch,
    Invalid(String),
}

/// Write a file so that readers see the old or the new content, never a mix.
fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_file_name(format!(
        ".{}.shardfs-tmp",
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    {
        let f = std::fs::File::create(&tmp)?;
        f.write_all_at(data, 0)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The sharded `zarr.json` for an unsharded array a writer created.
fn shard_document(meta: &format::ArrayMeta, cps: Option<&[u64]>, target: u64) -> Option<Vec<u8>> {
    let mut doc = meta.doc.clone();
    if format::metadata::codec_name(doc.get("chunk_grid")?) != "regular" {
        return None;
    }
    let inner: Vec<u64> = doc["chunk_grid"]["configuration"]["chunk_shape"]
        .as_array()?
        .iter()
        .map(Value::as_u64)
        .collect::<Option<_>>()?;
    if inner.len() != meta.shape.len() || inner.contains(&0) {
        return None;
    }
    let codecs = doc.get("codecs")?.as_array()?.clone();
    let itemsize = itemsize(doc.get("data_type").and_then(Value::as_str).unwrap_or(""));
    let cps = match cps {
        Some(c) if c.len() == inner.len() && !c.contains(&0) => c.to_vec(),
        _ => default_chunks_per_shard(&meta.shape, &inner, itemsize, target),
    };
    let shard: Vec<u64> = inner.iter().zip(&cps).map(|(i, c)| i * c).collect();
    doc["chunk_grid"]["configuration"]["chunk_shape"] = serde_json::json!(shard);
    doc.insert(
        "codecs".into(),
        serde_json::json!([{"name": "sharding_indexed", "configuration": {
            "chunk_shape": inner, "codecs": codecs,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end"}}]),
    );
    let mut out = serde_json::to_vec_pretty(&Value::Object(doc)).ok()?;
    out.push(b'\n');
    Some(out)
}

fn itemsize(data_type: &str) -> u64 {
    match data_type {
        "bool" | "int8" | "uint8" => 1,
        "int16" | "uint16" | "float16" => 2,
        "int32" | "uint32" | "float32" => 4,
        "complex128" => 16,
        _ => 8,
    }
}

/// Files under an array directory that are chunk keys of its grid (an unsharded copy).
fn collect_chunk_files(dir: &Path, meta: &format::ArrayMeta) -> Vec<(Vec<u64>, PathBuf)> {
    let enc = meta.key_encoding;
    let ndim = meta.shape.len();
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), None::<Vec<u64>>)];
    while let Some((d, prefix)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(kp) = name
                .to_str()
                .and_then(|n| enc.child(ndim, prefix.as_deref(), n))
            else {
                continue;
            };
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            match kp {
                KeyPath::Dir(c) if is_dir => stack.push((e.path(), Some(c))),
                KeyPath::Chunk(c) if !is_dir => out.push((c, e.path())),
                _ => {}
            }
        }
    }
    out
}

/// Remove now-empty directories under `dir` (but not `dir` or `keep`).
fn remove_empty_dirs(dir: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p != keep && e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_empty_dirs(&p, keep);
            let _ = std::fs::remove_dir(&p);
        }
    }
}
