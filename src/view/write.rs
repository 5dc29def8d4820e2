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
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde_json::Value;

use super::{ChunkData, Handle, Kind, MetaFile, Node, Result, ShardedArray, View, ViewError};
use crate::compact::Compactor;
use crate::format::{self, KeyPath};
use crate::store::{OpenMode, StoreFileRw};
use crate::write::flush::Flusher;
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
    pub(super) staging: Staging,
    pub(super) flusher: Flusher,
    pub(super) scratch: Mutex<HashMap<PathBuf, Arc<Mutex<Scratch>>>>,
    pub(super) scratch_bytes: AtomicU64,
    pub(super) scratch_limit: u64,
    /// Key directories made by `mkdir` that hold no chunk yet: (array, prefix).
    pub(super) vdirs: Mutex<HashSet<(PathBuf, Vec<u64>)>>,
    pub(super) chunks_per_shard: Option<Vec<u64>>,
    pub(super) shard_target: u64,
    /// Kernel cache invalidations, sent from a thread of the mount (never from inside
    /// a request, where the kernel may hold the directory's lock).
    pub(super) invalidations: Mutex<Option<std::sync::mpsc::Sender<Invalidation>>>,
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
            flusher: Flusher::new(config.compactor),
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

    pub(super) fn invalidate(&self, i: Invalidation) {
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

    /// A new scratch file at `path` (replacing any), already counted as open `opens`
    /// times. Open counts change only under the map's lock ([`Writer::open_scratch`],
    /// `View::settle_scratch`), so a file being opened is never taken away.
    pub(super) fn new_scratch(
        &self,
        path: &Path,
        data: Vec<u8>,
        dirty: bool,
        opens: u32,
    ) -> Result<Arc<Mutex<Scratch>>> {
        self.reserve(data.len() as u64)?;
        let file = Arc::new(Mutex::new(Scratch { data, opens, dirty }));
        if let Some(old) = self.scratch.lock().insert(path.to_path_buf(), file.clone()) {
            self.unreserve(old.lock().data.len() as u64);
        }
        Ok(file)
    }

    /// The scratch file at `path`, counted as opened once more.
    pub(super) fn open_scratch(&self, path: &Path) -> Option<Arc<Mutex<Scratch>>> {
        let map = self.scratch.lock();
        let file = map.get(path)?.clone();
        file.lock().opens += 1;
        Some(file)
    }

    /// Drop the name `path` (unlink, rename away). Handles still open keep reading the
    /// data they have.
    pub(super) fn remove_scratch(&self, path: &Path) {
        if let Some(file) = self.scratch.lock().remove(path) {
            self.unreserve(file.lock().data.len() as u64);
        }
    }

    /// Drop the name `path` and take its bytes, if no handle has the file open.
    pub(super) fn take_scratch_if_closed(&self, path: &Path) -> Option<Vec<u8>> {
        let mut map = self.scratch.lock();
        let mut f = map.get(path)?.lock();
        if f.opens > 0 {
            return None;
        }
        let data = std::mem::take(&mut f.data);
        drop(f);
        map.remove(path);
        self.unreserve(data.len() as u64);
        Some(data)
    }

    pub(super) fn reserve(&self, n: u64) -> Result<()> {
        let now = self.scratch_bytes.fetch_add(n, Ordering::Relaxed) + n;
        if now > self.scratch_limit {
            self.scratch_bytes.fetch_sub(n, Ordering::Relaxed);
            return Err(ViewError::NoSpace);
        }
        Ok(())
    }

    pub(super) fn unreserve(&self, n: u64) {
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

    pub(super) fn writable(&self, array: &ShardedArray) -> Result<()> {
        if array.layout.levels.len() > 1 {
            log::warn!(
                "{}: writes to nested sharded arrays are not supported",
                array.rel.display()
            );
            return Err(ViewError::ReadOnly);
        }
        if let Err(e) = crate::write::flush::storable(&array.layout) {
            log::warn!("{}: cannot be written: {e}", array.rel.display());
            return Err(ViewError::ReadOnly);
        }
        Ok(())
    }

    /// The key directory a path's parent is, for scratch nodes: `None` = array directory.
    pub(super) fn parent_key(&self, path: &Path) -> Option<Vec<u64>> {
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
                let f = self.open_store_file(rel, truncate)?;
                return Ok(Handle::StoreRw(Arc::from(f), rel.clone()));
            }
            Node::Chunk { array, coords } => {
                let array = self.current(array);
                self.writable(&array)?;
                let data = if truncate {
                    Vec::new()
                } else {
                    self.chunk_bytes(&array, coords)?
                };
                (
                    w.new_scratch(path, data, truncate, 1)?,
                    scratch_node(&array),
                )
            }
            Node::ArrayMeta { array, file } => {
                let data = if truncate {
                    Vec::new()
                } else {
                    self.current(array).meta_bytes(*file).to_vec()
                };
                (w.new_scratch(path, data, truncate, 1)?, scratch_node(array))
            }
            Node::GroupMeta { dir, file } => {
                // Written as a store file, taken in when it is closed.
                let data = if truncate {
                    Vec::new()
                } else {
                    self.group_meta(dir, *file)?
                };
                let rel = dir.join(file.name());
                let f = self.store.open_rw(&rel, OpenMode::Create, true)?;
                f.write_all_at(&data, 0)?;
                self.inodes.update(ino, Node::File { rel: rel.clone() });
                return Ok(Handle::StoreRw(Arc::from(f), rel));
            }
            Node::Scratch { path: p, .. } => {
                let Some(file) = w.open_scratch(p) else {
                    return self.open_for_write(ino, path, &self.settled(ino)?, truncate);
                };
                if truncate {
                    let mut f = file.lock();
                    w.unreserve(f.data.len() as u64);
                    f.data.clear();
                    f.dirty = true;
                }
                (file, node.clone())
            }
            Node::Dir { .. }
            | Node::ArrayDir { .. }
            | Node::KeyDir { .. }
            | Node::DraftGroup { .. } => {
                return Err(ViewError::IsDir);
            }
            Node::Symlink { .. } => {
                return Err(ViewError::Io(std::io::Error::from_raw_os_error(
                    libc::ELOOP,
                )));
            }
        };
        self.inodes.update(ino, node.clone());
        Ok(Handle::Scratch { ino, node, file })
    }

    /// A store file opened for writing. A v2 metadata file is taken in (and removed
    /// from the store) when it is closed, while the kernel may still hold its entry for
    /// the next writer (whose `O_TRUNC` may come as a truncate first): it is made again.
    pub(super) fn open_store_file(
        &self,
        rel: &Path,
        truncate: bool,
    ) -> Result<Box<dyn StoreFileRw>> {
        self.writer()?;
        let v2_meta = self.format == super::ViewFormat::V2
            && rel.file_name().and_then(MetaFile::from_name).is_some();
        let mode = if v2_meta {
            OpenMode::Create
        } else {
            OpenMode::Existing
        };
        Ok(self.store.open_rw(rel, mode, truncate)?)
    }

    pub(super) fn chunk_bytes(&self, array: &ShardedArray, coords: &[u64]) -> Result<Vec<u8>> {
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
    pub(super) fn commit_scratch(&self, node: &Node, file: &Arc<Mutex<Scratch>>) -> Result<()> {
        let Node::Scratch {
            path,
            array,
            parent,
        } = node
        else {
            return Ok(());
        };
        if !self.commits(node)? {
            return Ok(());
        }
        let name = path.file_name().unwrap_or_default();
        let data = {
            let mut f = file.lock();
            if !f.dirty {
                return Ok(());
            }
            f.dirty = false;
            f.data.clone()
        };
        let put = self.put(array, parent.as_deref(), name, path, data);
        if let (Err(ViewError::Invalid(_)), Ok(Target::Meta(meta))) =
            (&put, self.target(array, parent.as_deref(), name))
        {
            // A refused metadata write is rolled back: the file holds the stored
            // document again, for its writer and every later reader.
            let mut f = file.lock();
            let stored = self.current(array).meta_bytes(meta).to_vec();
            let w = self.writer()?;
            let (old, new) = (f.data.len() as u64, stored.len() as u64);
            if new > old {
                w.reserve(new - old)?;
            } else {
                w.unreserve(old - new);
            }
            f.data = stored;
        }
        put.map(|_| ())
    }

    /// `close` of a file handle (FUSE `flush`): commits a written chunk or metadata, and
    /// adopts a new array whose `zarr.json` was written in place. This runs before
    /// `close` returns — `release` comes later, asynchronously, and a writer like
    /// `cp -r` would already be creating the chunk files.
    pub fn flush_handle(&self, fh: u64) -> Result<()> {
        let handle = self.handles.lock().get(&fh).cloned();
        match handle {
            Some(Handle::Scratch { node, file, .. }) => self.commit_scratch(&node, &file),
            Some(Handle::StoreRw(_, rel)) => match self.lands_on_close(&rel) {
                Some(file) => self.metadata_landed(rel.parent().unwrap_or(Path::new("")), file),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// Whether [`View::flush_handle`] may do anything for `handle`: a scratch file at a
    /// chunk key or metadata (a commit), a store metadata file open for writing (a new
    /// array, or v2 metadata to take in). Every other close needs no flush request — most of all the read-only opens
    /// of chunks, and the temporary files of tmp+rename writers.
    pub(super) fn commits_on_close(&self, handle: &Handle) -> bool {
        match handle {
            Handle::Scratch { node, .. } => self.commits(node).unwrap_or(true),
            Handle::StoreRw(_, rel) => self.lands_on_close(rel).is_some(),
            Handle::Store(_) | Handle::Bytes(_) | Handle::Chunk { .. } => false,
        }
    }

    /// Whether closing a written scratch file commits it: it sits at a chunk key or at
    /// the array's metadata.
    fn commits(&self, node: &Node) -> Result<bool> {
        let Node::Scratch {
            path,
            array,
            parent,
        } = node
        else {
            return Ok(false);
        };
        let name = path.file_name().unwrap_or_default();
        Ok(matches!(
            self.target(array, parent.as_deref(), name)?,
            Target::Meta(_) | Target::Chunk(_)
        ))
    }

    /// The metadata file a written store file is, if closing it changes the tree:
    /// `zarr.json` (a new array) and, in the v2 view, `.zarray`, `.zattrs`, `.zgroup`.
    fn lands_on_close(&self, rel: &Path) -> Option<MetaFile> {
        match rel.file_name().and_then(MetaFile::from_name)? {
            MetaFile::ZarrJson => Some(MetaFile::ZarrJson),
            f if self.format == super::ViewFormat::V2 => Some(f),
            _ => None,
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
    pub(super) fn settle_scratch(
        &self,
        ino: u64,
        path: &Path,
        array: &Arc<ShardedArray>,
        parent: Option<&[u64]>,
    ) -> Result<()> {
        let w = self.writer()?;
        let name = path.file_name().unwrap_or_default();
        let back = match self.target(array, parent, name)? {
            Target::Meta(file) => Node::ArrayMeta {
                array: self.current(array),
                file,
            },
            Target::Chunk(coords) => Node::Chunk {
                array: self.current(array),
                coords,
            },
            Target::Scratch | Target::Invalid(_) => return Ok(()),
        };
        // The inode becomes the chunk before the scratch file goes, under the scratch
        // table's lock: whoever still holds the scratch node and finds its file gone
        // looks again and finds the chunk (`View::settled`), never a name with nothing.
        let mut map = w.scratch.lock();
        let closed = map.get(path).is_some_and(|f| f.lock().opens == 0);
        if closed {
            self.inodes.update(ino, back);
            if let Some(file) = map.remove(path) {
                w.unreserve(file.lock().data.len() as u64);
            }
        }
        Ok(())
    }

    /// The node `ino` is now, for a caller that held it as a scratch node whose file was
    /// gone: it settled meanwhile (its last handle closed) into a chunk or metadata.
    /// `NotFound` if it is still a scratch node (the file was unlinked).
    pub(super) fn settled(&self, ino: u64) -> Result<Node> {
        let (path, node) = self.node(ino)?;
        if !matches!(node, Node::Scratch { .. }) {
            return Ok(node);
        }
        // A lookup racing the settle may have put the scratch node back: ask the path.
        match self.resolve(&path)? {
            Some(now) if !matches!(now, Node::Scratch { .. }) => {
                self.inodes.update(ino, now.clone());
                Ok(now)
            }
            _ => Err(ViewError::NotFound),
        }
    }

    /// What a name in an array's namespace is, for a write.
    pub(super) fn target(
        &self,
        array: &Arc<ShardedArray>,
        parent: Option<&[u64]>,
        name: &OsStr,
    ) -> Result<Target> {
        let array = self.current(array);
        if parent.is_none()
            && let Some(file) = MetaFile::from_name(name)
            && self.format.array_files().contains(&file)
        {
            return Ok(Target::Meta(file));
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
    pub(super) fn put(
        &self,
        array: &Arc<ShardedArray>,
        parent: Option<&[u64]>,
        name: &OsStr,
        path: &Path,
        data: Vec<u8>,
    ) -> Result<Node> {
        match self.target(array, parent, name)? {
            Target::Meta(file) => {
                let array = self.update_array_meta(array, file, &data)?;
                Ok(Node::ArrayMeta { array, file })
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
                let file = self.writer()?.new_scratch(path, data, false, 0)?;
                drop(file);
                Ok(Node::Scratch {
                    path: path.to_path_buf(),
                    array: self.current(array),
                    parent: parent.map(<[u64]>::to_vec),
                })
            }
        }
    }

    /// Rename a closed scratch file (a writer's temporary file) onto a chunk key: its
    /// bytes are moved into staging, not copied. `None` when that is not the case (the
    /// target is no chunk key, or a handle still has the file open); the caller then
    /// copies. Refusals are those of [`View::put`], made before anything moves.
    pub(super) fn move_scratch_to_chunk(
        &self,
        path: &Path,
        dir: &Node,
        name: &OsStr,
    ) -> Result<Option<Node>> {
        let (array, parent) = match dir {
            Node::ArrayDir { array } => (array, None),
            Node::KeyDir { array, coords } => (array, Some(coords.as_slice())),
            _ => return Ok(None),
        };
        let Target::Chunk(coords) = self.target(array, parent, name)? else {
            return Ok(None);
        };
        let array = self.current(array);
        self.writable(&array)?;
        let Some(data) = self.writer()?.take_scratch_if_closed(path) else {
            return Ok(None);
        };
        self.commit_chunk(&array, coords.clone(), Some(data))?;
        Ok(Some(Node::Chunk { array, coords }))
    }

    pub(super) fn commit_chunk(
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

    /// One of an array's metadata files, as a writer of the view wrote it.
    pub(super) fn update_array_meta(
        &self,
        array: &Arc<ShardedArray>,
        file: MetaFile,
        bytes: &[u8],
    ) -> Result<Arc<ShardedArray>> {
        use crate::format::v2;
        let array = self.current(array);
        let invalid = |why: String| {
            log::warn!("{}/{}: refused: {why}", array.rel.display(), file.name());
            ViewError::Invalid(why)
        };
        let Value::Object(mut doc) =
            serde_json::from_slice(&array.json).map_err(|e| invalid(e.to_string()))?
        else {
            return Err(invalid("metadata is not an object".into()));
        };
        match file {
            MetaFile::ZarrJson | MetaFile::Zgroup => return self.update_metadata(&array, bytes),
            MetaFile::Zarray => {
                let shown = array.meta_bytes(MetaFile::Zarray);
                if !v2::same_but_shape(&shown, bytes).map_err(invalid)? {
                    return Err(invalid(
                        "only the shape of an array may change through .zarray".into(),
                    ));
                }
                doc.insert(
                    "shape".into(),
                    v2::zarray_shape(bytes).map_err(invalid)?.into(),
                );
            }
            MetaFile::Zattrs => {
                v2::apply_zattrs(&mut doc, bytes, Some(array.layout.ndim())).map_err(invalid)?
            }
        }
        let bytes = serde_json::to_vec(&Value::Object(doc)).map_err(|e| invalid(e.to_string()))?;
        self.update_metadata(&array, &bytes)
    }

    /// A new `zarr.json` for a sharded array, as a reader of the view wrote it.
    pub(super) fn update_metadata(
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
        if let Ok(format::Node::Array(new)) = format::metadata::parse(&out)
            && let format::Presentation::Sharded(layout) = &new.presentation
            && let Err(e) = crate::write::flush::storable(layout)
        {
            return Err(invalid(format!("its chunks could never be stored: {e}")));
        }
        self.flush_array(&array)?;
        self.store.write_atomically(&array.meta_rel, &out)?;
        self.reload_array(&array.rel)
    }

    pub(super) fn reload_array(&self, rel: &Path) -> Result<Arc<ShardedArray>> {
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
    pub(super) fn refresh_subtree(&self, rel: &Path) {
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
    pub(super) fn resolve(&self, path: &Path) -> Result<Option<Node>> {
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
}

pub(super) enum Target {
    Meta(MetaFile),
    Chunk(Vec<u64>),
    Scratch,
    Invalid(String),
}
