//! Opening files: `open`, what a handle of each node kind reads from
//! ([`View::reader`]), loading the next shards ahead of a reader going forward, and the
//! check that a store file's inode still has its name (opening for writing is
//! `write.rs`). The handle table itself is `handles.rs`; reads through a handle are
//! `read.rs`, closes `close.rs`.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::store::EntryMeta;
use crate::store::shard::Shard;

use super::*;

/// How many shards after one read forward are loaded ahead.
const SHARDS_AHEAD: usize = 3;

impl View {
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
}
