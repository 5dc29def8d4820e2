//! Opening files: `open`, what a handle of each node kind reads from
//! ([`View::reader`]) or writes to ([`Overlay::open_for_write`]: a scratch file in an
//! array, a store file elsewhere), and the check that a store file's inode still has
//! its name (loading ahead of a reader going forward is `read_ahead.rs`). The handle
//! table itself is `handles.rs`; reads through a handle are `read.rs`, closes
//! `close.rs`, writes `ops.rs`.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::store::{EntryMeta, OpenMode, StoreFileRw};

use super::Overlay;
use super::TreeRead;
use super::*;

impl View {
    /// Open a file for reading. `write` asks for write access.
    pub fn open(&self, ino: u64, write: bool, truncate: bool) -> Result<Opened> {
        let chunk = |n: &Node| matches!(n, Node::Chunk { .. } | Node::Scratch { .. });
        match self.open_node(ino, write, truncate) {
            // A chunk inode with no chunk behind it any more (a new chunk refused at its
            // `fsync`, deleted by another mount, ...): the kernel's entry for its name is
            // stale. `ESTALE` has the kernel look the name up again and so create the
            // file (`O_CREAT`) or say `ENOENT`; before, an `open(O_CREAT)` of the name
            // got `ENOENT` while the kernel held the entry (found by the reference test
            // with `--open-checks`).
            Err(ViewError::NotFound) if self.tree.node(ino).is_ok_and(|(_, n)| chunk(&n)) => {
                Err(ViewError::StaleInode(ino))
            }
            res => res,
        }
    }

    fn open_node(&self, ino: u64, write: bool, truncate: bool) -> Result<Opened> {
        let (path, node) = self.tree.node(ino)?;
        self.names_its_file(ino, &path, &node)?;
        if write {
            let handle = self
                .overlay()?
                .open_for_write(ino, &path, &node, truncate)?;
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
        let stale_size = len.is_some_and(|len| self.tree.cache.report_size(ino, len));
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
            Node::Container(ref c) => (self.tree.containers.reader(c)?, false),
            Node::Consolidated { dir } => {
                (Handle::Bytes(Arc::new(self.consolidated(&dir)?)), false)
            }
            Node::File { rel } if let Some(doc) = self.pending_doc(&rel) => {
                (Handle::Bytes(Arc::new(doc.bytes())), false)
            }
            Node::File { rel } if let Some(doc) = self.tree.group_docs.shown(&rel, None) => {
                (Handle::Bytes(doc), false)
            }
            Node::File { rel } => (
                Handle::Store(
                    self.tree
                        .store
                        .open(&rel)?
                        .ok_or(ViewError::NotFound)?
                        .into(),
                ),
                false,
            ),
            Node::ArrayMeta { array, file } => (
                Handle::Bytes(self.tree.current(&array).meta_bytes(file)),
                false,
            ),
            Node::GroupMeta { ref dir, file } => (
                Handle::Bytes(Arc::new(self.tree_read().group_meta(dir, file)?)),
                false,
            ),
            Node::Chunk { array, coords } => {
                let array = self.tree.current(&array);
                match self.tree_read().chunk_or_fill(&array, &coords, at_open)? {
                    ChunkData::Shard(shard, range) => {
                        self.tree.ahead.after_open(&array, &coords, &shard, range);
                        let now = (range, shard.meta().map(EntryMeta::version));
                        let keep = at_open && self.tree.cache.keep_pages(ino, now);
                        (Handle::Chunk { shard, range }, keep)
                    }
                    ChunkData::Staged(bytes) => {
                        self.tree.cache.not_served(ino);
                        (Handle::Bytes(bytes), false)
                    }
                }
            }
            Node::Scratch { .. } if let Some((array, file)) = self.tree.pending_meta(&node) => {
                (Handle::Bytes(array.meta_bytes(file)), false)
            }
            Node::Scratch { ref path, .. } => {
                let Some(file) = self.writer()?.scratch.open(path) else {
                    return self.reader(ino, self.overlay()?.settled(ino)?, at_open);
                };
                (
                    Handle::Scratch {
                        ino,
                        node: node.clone(),
                        file,
                        writes: false,
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
            && self.tree.inodes.peek(path) != Some(ino)
        {
            return Err(ViewError::NotFound);
        }
        Ok(())
    }
}

impl Overlay<'_> {
    pub(super) fn open_for_write(
        &self,
        ino: u64,
        path: &Path,
        node: &Node,
        truncate: bool,
    ) -> Result<Handle> {
        let w = self.w;
        let scratch_node = |array: &Arc<ShardedArray>| Node::Scratch {
            path: path.to_path_buf(),
            array: self.tree.current(array),
            parent: self.tree.parent_key(path),
        };
        let (file, node) = match node {
            Node::Stats | Node::Container(_) => return Err(ViewError::ReadOnly),
            // Accepted and let go: the view makes `.zmetadata` from the hierarchy.
            Node::Consolidated { dir } => return Ok(Handle::Discard(dir.clone())),
            Node::PlainFill { rel, data, .. } => {
                return self.open_plain_fill_for_write(ino, rel, data, truncate);
            }
            Node::File { rel } => {
                let f = self.open_store_file(rel, truncate)?;
                return Ok(Handle::StoreRw(Arc::from(f), rel.clone()));
            }
            Node::Chunk { array, coords } => {
                let array = self.tree.current(array);
                self.writable(&array)?;
                let data = match truncate {
                    true => Vec::new(),
                    false => self.tree_read().chunk_bytes(&array, coords)?,
                };
                let file = w.scratch.create(path, data, truncate, 1)?;
                (file, scratch_node(&array))
            }
            Node::ArrayMeta { array, file } => {
                let data = match truncate {
                    true => Vec::new(),
                    false => self.tree.current(array).meta_bytes(*file).to_vec(),
                };
                let file = w.scratch.create(path, data, truncate, 1)?;
                (file, scratch_node(array))
            }
            Node::GroupMeta { dir, file } => {
                return self.open_group_meta_for_write(ino, dir, *file, truncate);
            }
            Node::Scratch { path: p, .. } => {
                let Some(file) = w.scratch.open(p) else {
                    return self.open_for_write(ino, path, &self.settled(ino)?, truncate);
                };
                if truncate {
                    let mut f = file.lock();
                    w.scratch.unreserve(f.data.len() as u64);
                    f.data.clear();
                    f.dirty = true;
                }
                (file, node.clone())
            }
            Node::Dir { .. }
            | Node::ArrayDir { .. }
            | Node::KeyDir { .. }
            | Node::DraftGroup { .. }
            | Node::PlainFillDir { .. } => {
                return Err(ViewError::IsDir);
            }
            Node::Symlink { .. } => {
                return Err(std::io::Error::from_raw_os_error(libc::ELOOP).into());
            }
        };
        self.tree.inodes.update(ino, node.clone());
        Ok(Handle::Scratch {
            ino,
            node,
            file,
            writes: true,
        })
    }

    /// A chunk the v2 view serves of the fill value, opened for writing: made in the
    /// store as the chunk it reads as (a partial write keeps the rest of it), then
    /// written as the store file it now is.
    fn open_plain_fill_for_write(
        &self,
        ino: u64,
        rel: &Path,
        data: &[u8],
        truncate: bool,
    ) -> Result<Handle> {
        if let Some(dir) = rel.parent() {
            self.make_plain_dirs(dir)?;
        }
        self.tree
            .store
            .write_atomically(rel, if truncate { &[] } else { data })?;
        self.tree.inodes.update(
            ino,
            Node::File {
                rel: rel.to_path_buf(),
            },
        );
        let f = self.open_store_file(rel, false)?;
        Ok(Handle::StoreRw(Arc::from(f), rel.to_path_buf()))
    }

    /// A group metadata file the view makes, opened for writing: written as a store
    /// file (what the view showed, unless truncated), taken in when it is closed.
    fn open_group_meta_for_write(
        &self,
        ino: u64,
        dir: &Path,
        file: MetaFile,
        truncate: bool,
    ) -> Result<Handle> {
        let data = if truncate {
            Vec::new()
        } else {
            self.tree_read().group_meta(dir, file)?
        };
        let rel = dir.join(file.name());
        let f = self.tree.store.open_rw(&rel, OpenMode::Create, true)?;
        f.write_all_at(&data, 0)?;
        self.tree
            .inodes
            .update(ino, Node::File { rel: rel.clone() });
        Ok(Handle::StoreRw(Arc::from(f), rel))
    }

    /// A store file opened for writing. A v2 metadata file is taken in (and removed
    /// from the store) when it is closed, while the kernel may still hold its entry for
    /// the next writer (whose `O_TRUNC` may come as a truncate first): it is made again.
    pub(super) fn open_store_file(
        &self,
        rel: &Path,
        truncate: bool,
    ) -> Result<Box<dyn StoreFileRw>> {
        if super::pending_doc::is_doc(rel) {
            self.note_unsharded(rel);
            return Ok(Box::new(self.w.docs.open(
                &self.tree.store,
                rel,
                truncate,
                false,
            )?));
        }
        let v2_meta = self.tree.format == super::ViewFormat::V2
            && rel.file_name().and_then(MetaFile::from_name).is_some();
        let mode = if v2_meta {
            OpenMode::Create
        } else {
            OpenMode::Existing
        };
        Ok(self.tree.store.open_rw(rel, mode, truncate)?)
    }
}

impl TreeRead<'_> {
    pub(super) fn chunk_bytes(&self, array: &ShardedArray, coords: &[u64]) -> Result<Vec<u8>> {
        for attempt in 1.. {
            let (shard, range) = match self.chunk_or_fill(array, coords, true)? {
                ChunkData::Staged(b) => return Ok(b.to_vec()),
                ChunkData::Shard(shard, range) => (shard, range),
            };
            let len = u32::try_from(range.nbytes).map_err(|_| ViewError::NoSpace)?;
            match shard.read(range, 0, len) {
                // Another mount replaced the shard since it was loaded (object storage:
                // the GET's `If-Match` failed): the whole chunk is read again from the
                // shard as it is now, as a read from its start is. Before, an open for
                // writing of a chunk (`r+b`) failed with `ESTALE` for a while after
                // another mount changed its shard (found by an adversarial tester).
                Err(crate::store::shard::ShardError::Changed(_))
                    if attempt < super::read::CHUNK_READ_ATTEMPTS =>
                {
                    log::debug!(
                        "{}: changed by another writer; read again",
                        shard.rel().display()
                    );
                    self.tree.shards.invalidate(shard.rel());
                }
                res => {
                    return res.map_err(|err| ViewError::Shard {
                        shard: shard.rel().to_path_buf(),
                        err,
                    });
                }
            }
        }
        unreachable!("the attempts end with a return")
    }
}
