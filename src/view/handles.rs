//! The handle table: opening files for reading, what reads are served from, reads,
//! releases, and open directories.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::format::ChunkRange;
use crate::store::EntryMeta;
use crate::store::shard::Shard;

use super::*;

/// How often a chunk read from its start is made again when its shard keeps changing
/// under it (each time, another writer committed in between).
const CHUNK_READ_ATTEMPTS: u32 = 8;
/// The handle table: open files and open directories, by file handle.
#[derive(Default)]
pub(super) struct HandleTable {
    /// Open files: the inode each was opened as, and what it reads from.
    files: Mutex<HashMap<u64, (u64, Handle)>>,
    /// Listings of open directories, so that `readdir` offsets stay consistent.
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    next_fh: AtomicU64,
    /// Writes through descriptors the kernel opened without asking (a writable mount
    /// with kernel opens): the handle each written inode's bytes gather in, by inode.
    implicit: Mutex<HashMap<u64, Implicit>>,
}

/// A handle the daemon opened for writes that came without one ([`View::write_ino`]).
struct Implicit {
    fh: u64,
    /// Requests using `fh` now: it is never released under one (a write into a scratch
    /// file after its commit took the bytes would be lost).
    users: u32,
    /// When the last request using it ended.
    last: std::time::Instant,
}

/// Which writes gathered with kernel opens [`View::commit_kernel_writes`] commits.
#[derive(Clone, Copy, Debug)]
pub enum KernelCommit {
    /// One file's (its `fsync`, a rename or link of it, its release); a write to it in
    /// flight is waited for.
    Of(u64),
    /// Every file's (unmount); writes in flight are waited for, metadata that is not a
    /// whole document is committed (and refused) too.
    All,
    /// Every file's but `except`, those being written now, unlinked ones and metadata
    /// that is not yet a whole document (`fsync` of a directory, before a new array is
    /// adopted, a full write buffer); nothing is waited for.
    Settled { except: Option<u64> },
    /// As `Settled`, unlinked files too (their bytes go back to the write buffer; their
    /// descriptors read `ENOENT` after): a write the full buffer refused.
    Full { except: Option<u64> },
    /// As `Settled`, of files idle for [`KERNEL_WRITE_IDLE`] (unlinked ones: for
    /// [`KERNEL_UNLINKED_IDLE`]); the timer's.
    Idle,
}

/// How long after its last write an inode written through a descriptor the kernel
/// opened is committed, when no `fsync`, rename or unmount commits it first (the
/// daemon hears of no close of such a descriptor).
pub const KERNEL_WRITE_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a file unlinked while open (`tempfile.TemporaryFile`, pytest's capture) is
/// kept for its descriptors after its last write, with kernel opens: no close of it is
/// heard of, and once it is let go its descriptors read `ENOENT`.
pub const KERNEL_UNLINKED_IDLE: std::time::Duration = std::time::Duration::from_secs(600);

impl HandleTable {
    fn next(&self) -> u64 {
        // Handle 0 means "no handle" (reads of a kernel that opens without asking).
        self.next_fh.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn insert(&self, ino: u64, handle: Handle) -> u64 {
        let fh = self.next();
        self.files.lock().insert(fh, (ino, handle));
        fh
    }

    /// The inode handle `fh` was opened as.
    pub(super) fn ino_of(&self, fh: u64) -> Result<u64> {
        let ino = self.files.lock().get(&fh).map(|(ino, _)| *ino);
        ino.ok_or(ViewError::StaleHandle(fh))
    }

    /// Handle `fh` reads from `handle` from now on (if it is still open).
    pub(super) fn replace(&self, fh: u64, handle: Handle) {
        if let Some((_, h)) = self.files.lock().get_mut(&fh) {
            *h = handle;
        }
    }

    /// A copy of handle `fh`, taken out of the table's lock.
    pub(super) fn get(&self, fh: u64) -> Result<Handle> {
        let handle = self.files.lock().get(&fh).map(|(_, h)| h.clone());
        handle.ok_or(ViewError::StaleHandle(fh))
    }

    /// A handle open on inode `ino`, if any (the kernel's `getattr` of an open file
    /// carries no handle).
    fn any_of(&self, ino: u64) -> Option<Handle> {
        let files = self.files.lock();
        files
            .values()
            .find_map(|(i, h)| (*i == ino).then(|| h.clone()))
    }

    /// Whether a handle open for writing on store file `rel` is in the table.
    pub(super) fn writes_to(&self, rel: &Path) -> bool {
        self.files
            .lock()
            .values()
            .any(|(_, h)| matches!(h, Handle::StoreRw(_, r) if r == rel))
    }

    /// The handle writes without one to `ino` gather in, if any.
    fn implicit_fh(&self, ino: u64) -> Option<u64> {
        self.implicit.lock().get(&ino).map(|i| i.fh)
    }

    /// A request using the handle of [`View::write_ino`] for `ino` ended.
    fn implicit_end(&self, ino: u64) {
        if let Some(i) = self.implicit.lock().get_mut(&ino) {
            i.users -= 1;
            i.last = std::time::Instant::now();
        }
    }

    fn remove(&self, fh: u64) -> Option<(u64, Handle)> {
        self.files.lock().remove(&fh)
    }

    fn insert_dir(&self, entries: Vec<DirEntry>) -> u64 {
        let fh = self.next();
        self.dirs.lock().insert(fh, Arc::new(entries));
        fh
    }

    fn dir(&self, fh: u64) -> Result<Arc<Vec<DirEntry>>> {
        let dir = self.dirs.lock().get(&fh).cloned();
        dir.ok_or(ViewError::StaleHandle(fh))
    }

    fn remove_dir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }
}

/// How many shards after one read forward are loaded ahead.
const SHARDS_AHEAD: usize = 3;

impl View {
    // ----- files -----------------------------------------------------------------------

    /// Open a file for reading. `write` asks for write access.
    pub fn open(&self, ino: u64, write: bool, truncate: bool) -> Result<Opened> {
        let (path, node) = self.node(ino)?;
        self.names_its_file(ino, &path, &node)?;
        if write {
            let handle = self.open_for_write(ino, &path, &node, truncate)?;
            return Ok(self.add_handle(ino, handle, false));
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
        let stale_size = len.is_some_and(|len| self.cache.report_size(ino, len));
        Ok(Opened {
            stale_size: stale_size || meta,
            ..self.add_handle(ino, handle, keep_cache)
        })
    }

    /// What reads of `node` are served from, and whether the kernel may keep the pages it
    /// cached at an earlier open. `at_open`: a chunk's shard is checked for changes now,
    /// and what the inode serves is remembered for the next open's keep-cache decision.
    pub(super) fn reader(&self, ino: u64, node: Node, at_open: bool) -> Result<(Handle, bool)> {
        Ok(match node {
            Node::Stats => (Handle::Bytes(Arc::new(self.stats_json())), false),
            Node::PlainFill { data, .. } => (Handle::Bytes(data), false),
            Node::Container(ref c) => (self.container_reader(c)?, false),
            Node::Consolidated { dir } => {
                (Handle::Bytes(Arc::new(self.consolidated(&dir)?)), false)
            }
            Node::File { rel } if let Some(doc) = self.pending_doc(&rel) => {
                (Handle::Bytes(Arc::new(doc.bytes())), false)
            }
            Node::File { rel } if let Some(doc) = self.shown_group_doc(&rel, None) => {
                (Handle::Bytes(doc), false)
            }
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
                let array = self.current(&array);
                match self.chunk_or_fill(&array, &coords, at_open)? {
                    ChunkData::Shard(shard, range) => {
                        self.load_next_ahead(&array, &coords, &shard, range.offset);
                        let now = (range, shard.meta().map(EntryMeta::version));
                        let keep = at_open && self.cache.keep_pages(ino, now);
                        (Handle::Chunk { shard, range }, keep)
                    }
                    ChunkData::Staged(bytes) => {
                        self.cache.not_served(ino);
                        (Handle::Bytes(bytes), false)
                    }
                }
            }
            Node::Scratch { .. } if let Some((array, file)) = self.pending_meta(&node) => {
                (Handle::Bytes(array.meta_bytes(file)), false)
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
            | Node::DraftGroup { .. }
            | Node::PlainFillDir { .. } => {
                return Err(ViewError::IsDir);
            }
            Node::Symlink { .. } => {
                return Err(ViewError::Io(io::Error::from_raw_os_error(libc::ELOOP)));
            }
        })
    }

    /// A reader going forward through a shard's file (a second chunk of it opened, at
    /// `offset`, or object storage's read-ahead says so) most likely goes on into the next shards in C
    /// order, as readers of chunk files in key order and zarr-python do: the
    /// [`SHARDS_AHEAD`] shards after this one are loaded in the background, side by
    /// side, each its index and (up to 8 MiB of) its bytes in one request, while this
    /// one is read (a reader of chunk files in key order goes through a row of every
    /// shard of a row of shards before it comes back to this one).
    fn load_next_ahead(
        &self,
        array: &Arc<ShardedArray>,
        coords: &[u64],
        shard: &Shard,
        offset: u64,
    ) {
        // The claim's flag first: after the first time this is one atomic load per open.
        if shard.next_claimed()
            || !((self.store.reads_are_requests() && shard.opened_another(offset))
                || shard.streaming())
            || !shard.claim_next()
        {
            return;
        }
        let Some(loc) = array.layout.locate(coords) else {
            return;
        };
        let counts = array.layout.shard_counts();
        let mut next = loc.shard;
        'ahead: for _ in 0..SHARDS_AHEAD {
            let mut d = next.len();
            loop {
                let Some(prev) = d.checked_sub(1) else {
                    break 'ahead; // past the last shard
                };
                d = prev;
                next[d] += 1;
                if next[d] < counts[d] {
                    break;
                }
                next[d] = 0;
            }
            self.shards.prefetch(
                self.store.clone(),
                array.shard_rel(&next),
                array.layout.clone(),
            );
        }
    }

    pub(super) fn add_handle(&self, ino: u64, handle: Handle, keep_cache: bool) -> Opened {
        let no_flush = !self.commits_on_close(&handle);
        let fh = self.handles.insert(ino, handle);
        self.inodes.hold(ino);
        Opened {
            fh,
            keep_cache,
            no_flush,
            stale_size: false,
        }
    }

    /// Read through the handle `open` returned.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let mut handle = self.handle(fh)?;
        for attempt in 1.. {
            match self.read_from(&handle, offset, size) {
                Err(e) if attempt < CHUNK_READ_ATTEMPTS && Self::read_again(&e, offset) => {
                    let ino = self.handles.ino_of(fh)?;
                    handle = self.reader_anew(ino, &e)?;
                    self.handles.replace(fh, handle.clone());
                }
                res => return res,
            }
        }
        unreachable!("the last attempt returns")
    }

    /// A read of file `ino` through handle `fh`, whichever opened it: by inode when the
    /// kernel opens files itself ([`View::set_kernel_opens`]; a created file's handle
    /// too: the daemon may have committed and closed it since), else by the handle.
    pub fn read_file(&self, ino: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        if self.kernel_opens() {
            self.read_ino(ino, offset, size)
        } else {
            self.read(fh, offset, size)
        }
    }

    /// A write to file `ino` through handle `fh`, whichever opened it (see
    /// [`View::read_file`]); with it, whether a metadata document landed.
    pub fn write_file(&self, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<(u32, bool)> {
        if self.kernel_opens() {
            self.write_ino(ino, offset, data)
        } else {
            self.write(fh, offset, data).map(|n| (n, false))
        }
    }

    /// The last close of handle `fh` of file `ino`, whichever opened it: with kernel
    /// opens only a created file's handle is released (the kernel opened the rest).
    pub fn release_file(&self, ino: u64, fh: u64) -> Result<()> {
        if self.kernel_opens() {
            self.release_created(ino, fh)
        } else {
            self.release(fh)
        }
    }

    /// `truncate` of file `ino` to `size`, through handle `fh` if one was given,
    /// whichever opened it.
    pub fn set_size_file(&self, ino: u64, size: u64, fh: Option<u64>) -> Result<Attr> {
        if self.kernel_opens() {
            self.set_size_ino(ino, size)
        } else {
            self.set_size_open(ino, size, fh)
        }
    }

    /// A file `create` made and opened as handle `fh`: with kernel opens, its writes
    /// come by inode from now on ([`View::adopt_created`]).
    pub fn created(&self, ino: u64, fh: u64) {
        if self.kernel_opens() {
            self.adopt_created(ino, fh);
        }
    }

    /// Whether a read that failed with `e` is made again from a new load of its shard: a
    /// chunk whose shard another writer replaced since this mount loaded it (object
    /// storage: the conditional GET found another version, `ESTALE`), read from its
    /// start, so that its reader has none of its bytes yet (as after a new open). A read
    /// further into it fails with `ESTALE`: it would mix two versions of the chunk
    /// (issue 34: 8 of 464,000 reads failed with EIO while other mounts wrote).
    fn read_again(e: &ViewError, offset: u64) -> bool {
        offset == 0
            && matches!(
                e,
                ViewError::Shard {
                    err: crate::store::shard::ShardError::Changed(_),
                    ..
                }
            )
    }

    /// What `ino` reads from now, its shard loaded anew after `e`.
    fn reader_anew(&self, ino: u64, e: &ViewError) -> Result<Handle> {
        if let ViewError::Shard { shard, .. } = e {
            log::debug!("{}: changed by another writer; read again", shard.display());
            self.shards.invalidate(shard);
        }
        let (_, node) = self.node(ino)?;
        Ok(self.reader(ino, node, false)?.0)
    }

    /// A copy of handle `fh`, taken out of the table's lock.
    pub(super) fn handle(&self, fh: u64) -> Result<Handle> {
        self.handles.get(fh)
    }

    /// Read file `ino` without a handle: the kernel opened it without asking
    /// ([`View::set_kernel_opens`]). A chunk is read where its shard's index, as last
    /// checked, puts it.
    pub fn read_ino(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        if self.writer.is_some()
            && let Some(fh) = self.handles.implicit_fh(ino)
        {
            // This mount's writes through a descriptor the kernel opened, not yet
            // committed. Committed meanwhile: read what they became.
            match self.read(fh, offset, size) {
                Err(ViewError::StaleHandle(_)) => {}
                res => return res,
            }
        }
        let (path, node) = self.node(ino)?;
        if self.writer.is_some() && self.inodes.peek(&path) != Some(ino) {
            // Unlinked or replaced, and no handle of it held: not what has its name now.
            return Err(ViewError::NotFound);
        }
        let handle = match node {
            // A file being written (metadata too: the kernel's pages of it are the
            // writer's): read as it is, without counting an open (no release will come
            // for it).
            Node::Scratch { ref path, .. } => match self.writer()?.scratch(path) {
                Some(file) => Handle::Scratch {
                    ino,
                    node: node.clone(),
                    file,
                },
                None => self.reader(ino, self.settled(ino)?, false)?.0,
            },
            node => self.reader(ino, node, false)?.0,
        };
        let mut handle = handle;
        for attempt in 1.. {
            match self.read_from(&handle, offset, size) {
                Err(e) if attempt < CHUNK_READ_ATTEMPTS && Self::read_again(&e, offset) => {
                    handle = self.reader_anew(ino, &e)?;
                }
                res => return res,
            }
        }
        unreachable!("the last attempt returns")
    }

    pub(super) fn read_from(&self, handle: &Handle, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.counters.read_requests.fetch_add(1, Ordering::Relaxed);
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
            Handle::Discard(dir) => {
                let b = self.consolidated(dir)?;
                let start = (offset.min(b.len() as u64)) as usize;
                let end = (start + size as usize).min(b.len());
                Ok(b[start..end].to_vec())
            }
        }
    }

    pub(super) fn read_chunk(
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

    /// A store file's inode reaches the store by its path: only while that path still
    /// names it. One unlinked or replaced (opened again through `/proc/self/fd`, or
    /// truncated through a descriptor the kernel opened) would reach the file that has
    /// its name now: `ENOENT` (what it was lives on only in handles of it).
    pub(super) fn names_its_file(
        &self,
        ino: u64,
        path: &std::path::Path,
        node: &Node,
    ) -> Result<()> {
        if self.writer.is_some()
            && matches!(node, Node::File { .. } | Node::Symlink { .. })
            && self.inodes.peek(path) != Some(ino)
        {
            return Err(ViewError::NotFound);
        }
        Ok(())
    }

    /// Attributes of `ino`, also when it was unlinked while open (`fstat`): such a file
    /// lives on for its handles, with no link, as on any POSIX file system. `fh`: the
    /// handle the request came with, if any (the kernel sends none for `fstat`).
    pub fn getattr_open(&self, ino: u64, fh: Option<u64>) -> Result<Attr> {
        match self.getattr(ino) {
            // Unlinked, or retired (taken into a new array) while open.
            Err(e @ (ViewError::NotFound | ViewError::StaleInode(_))) => {
                let handle = fh.and_then(|fh| self.handles.get(fh).ok());
                match handle.or_else(|| self.handles.any_of(ino)) {
                    Some(handle) => self.unlinked_attr(ino, &handle),
                    // The file this inode still names here is gone (removed by another
                    // mount or program): stale, so that a call by path (`open(O_CREAT)`,
                    // `stat`) has the kernel look the name up again instead of failing
                    // through an entry it still caches. One this mount unlinked (its name
                    // let go here: `fstat` of a descriptor the kernel opened) is `ENOENT`.
                    None => Err(match e {
                        ViewError::NotFound
                            if self
                                .inodes
                                .get(ino)
                                .is_some_and(|(path, _)| self.inodes.peek(&path) == Some(ino)) =>
                        {
                            ViewError::StaleInode(ino)
                        }
                        e => e,
                    }),
                }
            }
            res => res,
        }
    }

    fn unlinked_attr(&self, ino: u64, handle: &Handle) -> Result<Attr> {
        let (m, len) = match handle {
            Handle::Store(f) => (f.meta()?, None),
            Handle::StoreRw(f, _) => (f.meta()?, None),
            Handle::Scratch {
                node: Node::Scratch { array, .. },
                file,
                ..
            } => {
                let mut m = array.dir_meta;
                m.perm = array.json_meta.perm;
                (m, Some(file.lock().data.len() as u64))
            }
            _ => return Err(ViewError::NotFound),
        };
        Ok(Attr {
            nlink: 0,
            ..Attr::from_meta(ino, Kind::File, len.unwrap_or(m.len), &m)
        })
    }

    /// `ftruncate` through handle `fh` (or `truncate` of the name, without one).
    pub fn set_size_open(&self, ino: u64, size: u64, fh: Option<u64>) -> Result<Attr> {
        let handle = fh
            .and_then(|fh| self.handles.get(fh).ok())
            .or_else(|| self.handles.any_of(ino));
        if let Some(Handle::StoreRw(f, _)) = &handle {
            // The open file itself, whatever its name is now.
            f.set_len(size)?;
            return self.getattr_open(ino, fh);
        }
        match (self.set_size(ino, size), handle) {
            (Err(ViewError::NotFound), Some(Handle::Scratch { file, .. })) => {
                let w = self.writer()?;
                let size = usize::try_from(size).map_err(|_| ViewError::NoSpace)?;
                let mut f = file.lock();
                if size > f.data.len() {
                    w.reserve_growth(size as u64, (size - f.data.len()) as u64)?;
                } else {
                    w.unreserve((f.data.len() - size) as u64);
                }
                f.data.resize(size, 0);
                if self.kernel_opens() {
                    f.written = w.staging.close_time();
                }
                drop(f);
                self.getattr_open(ino, fh)
            }
            (res, _) => res,
        }
    }

    /// Close a file; a written chunk is committed (staged) when its last handle closes.
    pub fn release(&self, fh: u64) -> Result<()> {
        // A writable mount with kernel opens hears of no `flush`: letting a handle go
        // (`View::commit_kernel_writes`, a rare kernel release) does what it would do.
        let flushed = if self.kernel_opens() && self.writer.is_some() {
            self.flush_handle(fh)
        } else {
            Ok(())
        };
        let Some((ino, handle)) = self.handles.remove(fh) else {
            return flushed;
        };
        self.let_go(ino);
        // A file whose close commits nothing (a writer's temporary file) is shown as
        // written: the kernel's pages of it stay right.
        let written = matches!(handle, Handle::Scratch { .. } | Handle::StoreRw(..))
            && self.commits_on_close(&handle);
        let released = match handle {
            Handle::Scratch { ino, node, file } => self.release_scratch(ino, &node, &file),
            Handle::StoreRw(f, rel) => {
                // Without kernel opens the close (`flush_handle`) refused it already.
                let finished = if self.kernel_opens() {
                    Ok(())
                } else {
                    self.doc_finished(&rel)
                };
                drop(f);
                self.release_store_file(&rel);
                finished
            }
            _ => Ok(()),
        };
        if written
            && self.kernel_opens()
            && let Some(w) = &self.writer
        {
            // The kernel keeps a file's pages across opens here: what it holds of a
            // written file is the writer's bytes, which the commit may have refused
            // (metadata rolled back) or shown otherwise (a new array's `zarr.json`).
            w.invalidate(write_api::Invalidation::Inode(ino));
        }
        flushed.and(released)
    }

    // ----- writes through descriptors the kernel opened --------------------------------

    /// A write on a writable mount with kernel opens, through any descriptor: the bytes
    /// gather in the handle the daemon holds for the inode (opened at its first write or
    /// truncate, or the one `create` made), and are committed as a close would commit
    /// them by [`View::commit_kernel_writes`] (at `fsync`, before a rename or link, at
    /// unmount, or [`KERNEL_WRITE_IDLE`] after the last write: [`KernelCommit`]).
    ///
    /// Metadata taken in at this write ([`View::land_at_write`]) is committed with it,
    /// as at a close (its store file is gone: a later write opens the file anew);
    /// `Ok((n, true))` then, and the kernel's pages of the file, which hold the
    /// writer's bytes and not the document the view now shows, are the caller's to drop.
    pub fn write_ino(&self, ino: u64, offset: u64, data: &[u8]) -> Result<(u32, bool)> {
        let mut res = self.write_held(ino, offset, data);
        if matches!(res, Err(ViewError::NoSpace)) {
            // The write buffer holds what other files' writers left (no close tells
            // when they are done): commit those, let unlinked ones go (their bytes are
            // the room), and try once more.
            self.commit_kernel_writes(KernelCommit::Full { except: Some(ino) })?;
            res = self.write_held(ino, offset, data);
        }
        let (n, fh) = res?;
        // A write of `.zmetadata` of the v2 view is let go at once: the kernel's pages
        // and size of it are the writer's bytes, not the document the view makes.
        let landed = matches!(self.handles.get(fh), Ok(Handle::Discard(_)))
            || self
                .writer
                .as_ref()
                .is_some_and(|w| w.landed_at_write.lock().contains(&fh));
        if landed {
            self.commit_kernel_writes(KernelCommit::Of(ino))?;
        }
        Ok((n, landed))
    }

    /// A write into the handle `ino`'s writes gather in; its file handle.
    fn write_held(&self, ino: u64, offset: u64, data: &[u8]) -> Result<(u32, u64)> {
        let fh = self.implicit_begin(ino, false)?;
        let res = self.write(fh, offset, data);
        self.handles.implicit_end(ino);
        res.map(|n| (n, fh))
    }

    /// `truncate` or `ftruncate` without a handle of ours (`O_TRUNC` of a descriptor the
    /// kernel opened comes as one): a chunk or metadata file is truncated in the handle
    /// its writes will gather in, so the writer's bytes are committed with it, never an
    /// empty chunk first.
    pub fn set_size_ino(&self, ino: u64, size: u64) -> Result<Attr> {
        let gathers = self.writer.is_some()
            && match self.node(ino).map(|(_, n)| n) {
                Ok(
                    Node::Chunk { .. }
                    | Node::ArrayMeta { .. }
                    | Node::GroupMeta { .. }
                    | Node::Scratch { .. },
                ) => true,
                // A metadata document: `O_TRUNC` and the writes after it make one
                // document, stored once whole.
                Ok(Node::File { rel }) => super::pending_doc::is_doc(&rel),
                _ => false,
            };
        if !gathers {
            return self.set_size_open(ino, size, None);
        }
        if self
            .handles
            .implicit_fh(ino)
            .is_some_and(|fh| size == 0 || self.gathered_whole(fh, size))
            && let Err(e) = self.commit_kernel_writes(KernelCommit::Of(ino))
        {
            // What was written before this truncate to nothing (`O_TRUNC` of a new
            // open: the writer before it closed its file, unheard), or before a
            // truncate that changes a whole chunk or document (`truncate -s`, which may
            // be another process's), is committed as that close would have committed
            // it, not merged with what comes next (a refusal of the truncated bytes
            // would take it along). Its refusal is that earlier writer's, which no
            // request waits for: kept for stats and the unmount.
            let path = self.handle_path(ino, None);
            let mut refused = self.counters.refused.lock();
            if refused.len() == REFUSALS_KEPT {
                refused.pop_front();
            }
            refused.push_back((path, e.to_string()));
        }
        let fh = self.implicit_begin(ino, size == 0)?;
        let res = self.set_size_open(ino, size, Some(fh));
        self.handles.implicit_end(ino);
        res
    }

    /// A file created through this mount with kernel opens (`create` still asks the
    /// daemon): its handle is where every later write to the inode gathers, through
    /// any descriptor, and it is committed as those are (the kernel may send no release
    /// for it: none comes for files created once it opens files itself).
    pub fn adopt_created(&self, ino: u64, fh: u64) {
        let mut map = self.handles.implicit.lock();
        if map.contains_key(&ino) {
            // An existing file (`O_CREAT` without `O_EXCL`) already being written: its
            // writes gather in the handle they gather in; this one shares its bytes.
            // Let go without what a close does (commit, take in): the writes go on.
            drop(map);
            if let Some((ino, handle)) = self.handles.remove(fh) {
                self.let_go(ino);
                if let Handle::Scratch { file, .. } = handle {
                    let mut f = file.lock();
                    f.opens = f.opens.saturating_sub(1);
                }
            }
            return;
        }
        map.insert(
            ino,
            Implicit {
                fh,
                users: 0,
                last: std::time::Instant::now(),
            },
        );
    }

    /// The kernel released handle `fh` of `ino` (with kernel opens: a file created before
    /// the kernel began to open files itself, the only ones it sends a release for):
    /// committed as the daemon's own are.
    pub fn release_created(&self, ino: u64, fh: u64) -> Result<()> {
        let ours = self.handles.implicit_fh(ino) == Some(fh);
        if ours {
            self.commit_kernel_writes(KernelCommit::Of(ino))
        } else {
            self.release(fh)
        }
    }

    /// The handle writes without one to `ino` gather in, counted as in use until
    /// [`HandleTable::implicit_end`]; opened now if there is none.
    fn implicit_begin(&self, ino: u64, truncate: bool) -> Result<u64> {
        // Opened under the table's lock: two first writes must not open two handles
        // (the second open of a chunk would replace the first one's scratch file).
        let mut map = self.handles.implicit.lock();
        if let Some(i) = map.get_mut(&ino) {
            i.users += 1;
            return Ok(i.fh);
        }
        // A descriptor of a file unlinked or replaced since, whose handle is gone: not
        // whatever now has that name.
        let (path, _) = self.node(ino)?;
        if self.inodes.peek(&path) != Some(ino) {
            return Err(ViewError::NotFound);
        }
        let fh = self.open(ino, true, truncate)?.fh;
        map.insert(
            ino,
            Implicit {
                fh,
                users: 1,
                last: std::time::Instant::now(),
            },
        );
        Ok(fh)
    }

    /// Commit writes gathered in handles the daemon holds (kernel opens), as a close
    /// would: release those handles. Returns the first error (also logged).
    pub fn commit_kernel_writes(&self, which: KernelCommit) -> Result<()> {
        let mut first_err = Ok(());
        // The files to commit are those held now: a steady writer cannot keep a commit
        // that waits going.
        let mut targets: Option<Vec<u64>> = None;
        loop {
            let (taken, busy) = {
                let mut map = self.handles.implicit.lock();
                if map.is_empty() {
                    return first_err;
                }
                let snapshot = targets.get_or_insert_with(|| match which {
                    KernelCommit::Of(ino) => vec![ino],
                    _ => map.keys().copied().collect(),
                });
                let waits = matches!(which, KernelCommit::Of(_) | KernelCommit::All);
                let mut taken = Vec::new();
                let mut busy = false;
                snapshot.retain(|ino| {
                    let Some(h) = map.get(ino) else {
                        return false;
                    };
                    if h.users > 0 {
                        busy |= waits;
                        return waits;
                    }
                    let due = match which {
                        KernelCommit::Of(_) | KernelCommit::All => true,
                        // An unlinked file has nothing to commit, and its descriptors
                        // still use it (pytest's capture files while a test adopts an
                        // array): only the idle timer and the unmount let it go.
                        KernelCommit::Settled { except } => {
                            except != Some(*ino)
                                && !self.partial_metadata(h.fh)
                                && !self.untouched(h.fh)
                                && !self.unlinked(h.fh)
                        }
                        KernelCommit::Full { except } => {
                            except != Some(*ino)
                                && !self.partial_metadata(h.fh)
                                && !self.untouched(h.fh)
                        }
                        KernelCommit::Idle => {
                            let e = h.last.elapsed();
                            e >= KERNEL_WRITE_IDLE
                                && !self.partial_metadata(h.fh)
                                && !self.untouched(h.fh)
                                && (e >= KERNEL_UNLINKED_IDLE || !self.unlinked(h.fh))
                        }
                    };
                    if due {
                        taken.push((*ino, h.fh));
                        map.remove(ino);
                    }
                    false
                });
                (taken, busy)
            };
            for (ino, fh) in taken {
                // Kept for a message only: a path is made only if the commit fails.
                let held = self.handles.get(fh).ok();
                let released = self.release(fh);
                if released.is_ok() && !self.counters.refused.lock().is_empty() {
                    // Committed now: an earlier refusal of the same file is no longer true.
                    let path = self.handle_path(ino, held.as_ref());
                    self.counters.refused.lock().retain(|(p, _)| *p != path);
                }
                if let Err(e) = released {
                    let path = self.handle_path(ino, held.as_ref());
                    log::warn!("{path}: a commit of a file written with kernel opens: {e}");
                    if !matches!(which, KernelCommit::Of(_)) {
                        // No request waits for this one (its file's `fsync` would hear
                        // of it): kept for `shardfs stats` and `shardfs unmount`.
                        let mut refused = self.counters.refused.lock();
                        if refused.len() == REFUSALS_KEPT {
                            refused.pop_front();
                        }
                        refused.push_back((path, e.to_string()));
                    }
                    // A refusal (`EINVAL`) is that file's, kept for stats and the
                    // unmount: it fails no `fsync` of a directory (nor the unmount).
                    let refusal = matches!(e, ViewError::Invalid(_));
                    if first_err.is_ok() && (matches!(which, KernelCommit::Of(_)) || !refusal) {
                        first_err = Err(e);
                    }
                }
            }
            if !busy {
                return first_err;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// Metadata (an array's, or a store file taken in when closed) whose bytes are not
    /// yet a whole JSON document: a commit would refuse it and roll it back under its
    /// writer, who has not finished. Only its own `fsync`, and the unmount, commit it.
    fn partial_metadata(&self, fh: u64) -> bool {
        match self.handles.get(fh) {
            Ok(Handle::Scratch { node, file, .. }) => {
                let f = file.lock();
                // Unlinked since: nothing of it will be committed.
                !f.orphan
                    && self.pending_meta(&node).is_some()
                    && !super::pending_doc::whole_json(&f.data)
            }
            Ok(Handle::StoreRw(_, rel)) => match self.pending_doc(&rel) {
                Some(doc) => !doc.whole(),
                None => {
                    self.lands_on_close(&rel).is_some()
                        && !matches!(self.store.read_all(&rel), Ok(Some(b)) if super::pending_doc::whole_json(&b))
                }
            },
            _ => false,
        }
    }

    /// The path of the file of `handle` of `ino`, for a message: its inode's, or the
    /// one the handle was opened at (an inode retired since).
    fn handle_path(&self, ino: u64, handle: Option<&Handle>) -> String {
        if let Some((path, _)) = self.inodes.get(ino) {
            return path.display().to_string();
        }
        match handle {
            Some(Handle::Scratch {
                node: Node::Scratch { path, .. },
                ..
            }) => path.display().to_string(),
            Some(Handle::StoreRw(_, rel)) => rel.display().to_string(),
            _ => format!("inode {ino}"),
        }
    }

    /// The paths of files held for commit whose metadata is not yet a whole JSON
    /// document (what the unmount will commit, and refuse, unless it is finished).
    pub(super) fn partial_metadata_paths(&self) -> Vec<String> {
        let held: Vec<(u64, u64)> = self
            .handles
            .implicit
            .lock()
            .iter()
            .map(|(ino, h)| (*ino, h.fh))
            .collect();
        let mut out: Vec<String> = held
            .into_iter()
            .filter(|&(_, fh)| self.partial_metadata(fh))
            .filter_map(|(ino, _)| self.inodes.get(ino))
            .map(|(p, _)| p.display().to_string())
            .collect();
        if let Some(w) = &self.writer {
            out.extend(
                w.docs
                    .unfinished()
                    .into_iter()
                    .map(|p| p.display().to_string()),
            );
        }
        out.sort();
        out.dedup();
        out
    }

    /// A file made (or truncated) and not written since: its writer has not begun, and
    /// only its own `fsync`, a rename of it or the unmount commit it (committed by
    /// another file's, an empty chunk was refused, and the write that came next found
    /// the file gone).
    fn untouched(&self, fh: u64) -> bool {
        match self.handles.get(fh) {
            Ok(Handle::Scratch { file, .. }) => {
                let f = file.lock();
                f.data.is_empty() && f.written == 0
            }
            _ => false,
        }
    }

    /// Bytes gathered in `fh` that a commit would take as they stand (a chunk of a
    /// length its array's codecs can decode, a whole metadata document), which a
    /// truncate to `size` would change.
    fn gathered_whole(&self, fh: u64, size: u64) -> bool {
        let Ok(Handle::Scratch { node, file, .. }) = self.handles.get(fh) else {
            return false;
        };
        let f = file.lock();
        if f.orphan || f.data.len() as u64 == size || (f.data.is_empty() && f.written == 0) {
            return false;
        }
        let decodes = |array: &Arc<ShardedArray>| {
            self.current(array)
                .layout
                .fixed_chunk_len
                .is_none_or(|want| f.data.len() as u64 == want)
        };
        match &node {
            Node::Chunk { array, .. } => decodes(array),
            // A chunk key written as a file of its own first (before its array's
            // metadata, or opened for writing).
            Node::Scratch {
                path,
                array,
                parent,
            } => {
                path.file_name().is_some_and(|name| {
                    matches!(
                        self.target(array, parent.as_deref(), name),
                        Ok(super::writer::Target::Chunk(_))
                    )
                }) && decodes(array)
            }
            Node::ArrayMeta { .. } | Node::GroupMeta { .. } => {
                super::pending_doc::whole_json(&f.data)
            }
            _ => false,
        }
    }

    /// An unlinked file: nothing to commit; it lives on only in its handle.
    fn unlinked(&self, fh: u64) -> bool {
        match self.handles.get(fh) {
            Ok(Handle::Scratch { file, .. }) => file.lock().orphan,
            Ok(Handle::StoreRw(_, rel)) => matches!(self.store.stat(&rel), Ok(None)),
            _ => false,
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
        Ok(self.handles.insert_dir(entries))
    }

    /// The listing of an open directory; `readdir` continues it at its offset.
    pub fn dir_entries(&self, fh: u64) -> Result<Arc<Vec<DirEntry>>> {
        self.handles.dir(fh)
    }

    pub fn releasedir(&self, fh: u64) {
        self.handles.remove_dir(fh);
    }
}
