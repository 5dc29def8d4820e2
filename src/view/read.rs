//! Reads through an open file: by handle, or by inode where the kernel opened the file
//! itself ([`View::read_ino`]), read again from its start when another writer replaced
//! the chunk's shard. What a handle reads from is decided at its open (`open.rs`).

use std::sync::atomic::Ordering;

use crate::format::ChunkRange;
use crate::store::shard::Shard;

use super::*;

/// How often a chunk read from its start is made again when its shard keeps changing
/// under it (each time, another writer committed in between).
pub(super) const CHUNK_READ_ATTEMPTS: u32 = 8;

impl View {
    /// Read through the handle `open` returned.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let mut handle = self.handle(fh)?;
        for attempt in 1.. {
            match self.read_from(&handle, offset, size) {
                Err(e) if attempt < CHUNK_READ_ATTEMPTS && Self::read_again(&e, offset) => {
                    let ino = self.open.handles.ino_of(fh)?;
                    handle = self.reader_anew(ino, &e)?;
                    self.open.handles.replace(fh, handle.clone());
                }
                res => return res,
            }
        }
        unreachable!("the last attempt returns")
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
            self.tree.shards.invalidate(shard);
        }
        let (_, node) = self.tree.node(ino)?;
        Ok(self.reader(ino, node, false)?.0)
    }

    /// Read file `ino` without a handle: the kernel opened it without asking
    /// ([`OpenPolicy::KernelOpens`]). A chunk is read where its shard's index, as last
    /// checked, puts it.
    pub fn read_ino(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        if self.writer.is_some()
            && let Some(fh) = self.open.implicit.fh(ino)
        {
            // This mount's writes through a descriptor the kernel opened, not yet
            // committed. Committed meanwhile: read what they became.
            match self.read(fh, offset, size) {
                Err(ViewError::StaleHandle(_)) => {}
                res => return res,
            }
        }
        let (path, node) = self.tree.node(ino)?;
        if self.writer.is_some() && self.tree.inodes.peek(&path) != Some(ino) {
            // Unlinked or replaced, and no handle of it held: not what has its name now.
            return Err(ViewError::NotFound);
        }
        let handle = match node {
            // A file being written (metadata too: the kernel's pages of it are the
            // writer's): read as it is, without counting an open (no release will come
            // for it).
            Node::Scratch { ref path, .. } => match self.writer()?.scratch.get(path) {
                Some(file) => Handle::Scratch {
                    ino,
                    node: node.clone(),
                    file,
                    writes: false,
                },
                None => self.reader(ino, self.overlay()?.settled(ino)?, false)?.0,
            },
            node => self.reader(ino, node, false)?.0,
        };
        let mut handle = handle;
        for attempt in 1.. {
            let known = self.kernel_size_holds(ino, &handle)?;
            match self.read_from(&handle, offset, size) {
                Err(e) if attempt < CHUNK_READ_ATTEMPTS && Self::read_again(&e, offset) => {
                    handle = self.reader_anew(ino, &e)?;
                }
                Ok(data) => {
                    let end = offset + data.len() as u64;
                    if data.len() < size as usize && known.is_some_and(|k| end < k) {
                        // The kernel takes a short read for the end: so must the check.
                        self.tree.cache.read_short(ino, end);
                    }
                    return Ok(data);
                }
                res => return res,
            }
        }
        unreachable!("the last attempt returns")
    }

    /// On a read-only mount where the kernel opens files, whether a chunk read of `ino`
    /// may be served: not when the chunk is now longer than the size the kernel holds
    /// for it (another mount replaced it, and this mount loaded its shard anew since
    /// the kernel asked): the kernel would cut it to the old length, and its reader
    /// would get the first bytes of the new chunk as the whole (found by an adversarial
    /// tester: 500 such reads in 43 passes while another mount rewrote chunks). It gets
    /// `ESTALE` instead, and the kernel drops its attributes, so that the next read
    /// asks the size again and reads the new chunk whole. (A chunk now shorter is
    /// served: the kernel takes the short read as the new end.) A writable mount does
    /// not track what the kernel holds: its own writes change it.
    /// Returns the size the kernel holds, where this is such a chunk read (`u64::MAX`
    /// if it was never told one).
    fn kernel_size_holds(&self, ino: u64, handle: &Handle) -> Result<Option<u64>> {
        let Handle::Chunk { range, .. } = handle else {
            return Ok(None);
        };
        if self.writer.is_some() {
            return Ok(None);
        }
        let known = self.tree.cache.reported_size(ino).unwrap_or(u64::MAX);
        if range.nbytes > known {
            return Err(ViewError::SizeStale(ino));
        }
        Ok(Some(known))
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
}
