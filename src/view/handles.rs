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
}

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

    pub(super) fn remove(&self, fh: u64) -> Option<(u64, Handle)> {
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
            && let Some(fh) = self.implicit.fh(ino)
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
