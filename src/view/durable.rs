//! Durability: flushing staged chunks to their shards (one array, all, the idle timer)
//! and what `fsync` of a file or a directory makes durable.

use super::{Node, Result, ShardedArray, View, ViewError};

impl View {
    /// Make the staged chunks of `array` durable.
    pub fn flush_array(&self, array: &ShardedArray) -> Result<()> {
        self.flush_array_for(array, None)
    }

    /// Flush `array`; with `shard`, fail only if that shard (store path) could not be
    /// committed: a chunk's `fsync` reports its own shard, not its neighbours'.
    fn flush_array_for(&self, array: &ShardedArray, shard: Option<&std::path::Path>) -> Result<()> {
        let Some(w) = &self.writer else { return Ok(()) };
        let array = self.arrays.get(&array.rel);
        let Some(array) = array else { return Ok(()) };
        if self.array_gone_from_store(&array) {
            return match shard {
                Some(_) => Err(ViewError::Io(std::io::Error::from_raw_os_error(
                    libc::ESTALE,
                ))),
                None => Ok(()),
            };
        }
        let shard_rel = |s: &[u64]| array.shard_rel(s);
        let target = crate::write::flush::ArrayTarget {
            rel: &array.rel,
            layout: &array.layout,
            shard_rel: &shard_rel,
        };
        // Each shard committed is cached as the commit left it (or dropped from the
        // cache): a read of it next does not read its index again.
        let flushed = w.flusher.flush_array_cached(
            self.store.as_ref(),
            &w.staging,
            &target,
            Some(&self.shards),
        );
        let mut failed = flushed.failed.into_iter();
        let failure = match shard {
            None => failed.next(),
            Some(rel) => failed.find(|e| e.concerns(rel)),
        };
        failure.map_or(Ok(()), |e| Err(ViewError::Flush(e)))
    }

    /// Whether `array`'s metadata is gone from the store, removed or moved away by
    /// another mount (or a tool) since this mount staged chunks of it, and not by this
    /// mount (whose unlinked metadata is written back: see `unlink_array_meta`). Then
    /// the chunks staged for it are let go, named (log, `shardfs stats` `refused`, the
    /// unmount): flushed, they would have made a shard file where the array was, with no
    /// metadata beside it, which a later mount showed as a file at a chunk key (found by
    /// an adversarial tester: `mv a a2` or `rm -rf a` in one mount while a chunk of `a`
    /// was staged in another).
    fn array_gone_from_store(&self, array: &ShardedArray) -> bool {
        let Some(w) = &self.writer else { return false };
        if w.headless.lock().contains_key(&array.rel)
            || !matches!(self.store.stat(&array.meta_rel), Ok(None))
        {
            return false;
        }
        w.staging.discard(&array.rel);
        let why = "its metadata is gone from the store (another mount removed or moved the \
                   array): the chunks staged for it are not stored";
        log::error!("{}: {why}", array.rel.display());
        let mut refused = self.counters.refused.lock();
        if refused.len() == super::REFUSALS_KEPT {
            refused.pop_front();
        }
        refused.push_back((array.rel.display().to_string(), why.to_string()));
        true
    }

    /// Make everything this mount holds durable: staged chunks and the files of their
    /// own in arrays' directories (`fsync` of the mount's root or a group, unmount).
    pub fn sync_all(&self) -> Result<()> {
        let kept = self.keep_files(super::kept::Keep::All);
        let flushed = self.flush_all();
        kept.and(flushed)
    }

    /// Make everything staged durable (and a full write buffer's back-pressure).
    pub fn flush_all(&self) -> Result<()> {
        let Some(w) = &self.writer else { return Ok(()) };
        let mut first_err = None;
        for rel in w.staging.arrays(None) {
            let array = self.arrays.get(&rel);
            if let Some(array) = array
                && let Err(e) = self.flush_array(&array)
            {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Flush the arrays whose staged bytes grew past the write-behind threshold
    /// ([`crate::view::write_api::Writer::set_write_behind`]), waiting up to `max` for
    /// one: the mount's timer thread calls it between its ticks. The disk then writes
    /// while the writer goes on writing; the flush of the rest at its `fsync` is short. A
    /// failure stays in the log (and the chunks stay staged): it is reported by the
    /// `fsync` or unmount that retries them.
    pub fn flush_behind(&self, max: std::time::Duration) {
        let Some(w) = &self.writer else { return };
        for rel in w.staging.wait_due(max) {
            if let Some(array) = self.arrays.get(&rel) {
                let _ = self.flush_array(&array);
            }
        }
    }

    /// Flush arrays whose oldest staged chunk is at least `idle` old (the timer).
    pub fn flush_idle(&self, idle: std::time::Duration) {
        let Some(w) = &self.writer else { return };
        let _ = self.keep_files(super::kept::Keep::Closed(idle));
        for rel in w.staging.arrays(Some(idle)) {
            let array = self.arrays.get(&rel);
            if let Some(array) = array {
                let _ = self.flush_array(&array);
            }
        }
    }

    /// `fsync` of a file: durable when it returns. A chunk still open for writing is
    /// committed with what it holds now (later writes commit again on close).
    /// `fsync` through handle `fh` of `ino`: as [`View::fsync`], but a file renamed to
    /// where its descriptors could not follow it ([`View::follow_rename`]) and written
    /// since answers `ESTALE` (what was written is stored nowhere).
    pub fn fsync_file(&self, ino: u64, fh: u64) -> Result<()> {
        if let Ok(super::Handle::Scratch { node, file, .. }) = self.handles.get(fh)
            && file.lock().renamed_away
        {
            self.commit_scratch(&node, &file)?;
        }
        self.fsync(ino)
    }

    pub fn fsync(&self, ino: u64) -> Result<()> {
        let (_, node) = match self.node(ino) {
            // Retired while open (a chunk file taken into a new array, whose adoption
            // flushed it): whatever it became is made durable with everything else.
            Err(ViewError::StaleInode(_)) if self.inodes.get_any(ino).is_some() => {
                return self.sync_all();
            }
            res => res?,
        };
        if let Node::Scratch { path, .. } = &node
            && let Some(file) = self.writer()?.scratch(path)
        {
            self.commit_scratch(&node, &file)?;
            self.keep_file(path, &file)?;
        }
        // A written chunk not yet settled (a handle of it is still open, or its release
        // has not come yet): its fsync reports its own shard, as a settled chunk's does.
        let node = match node {
            Node::Scratch {
                ref path,
                ref array,
                ref parent,
            } => match self.target(
                array,
                parent.as_deref(),
                path.file_name().unwrap_or_default(),
            ) {
                Ok(super::writer::Target::Chunk(coords)) => Node::Chunk {
                    array: array.clone(),
                    coords,
                },
                _ => node,
            },
            node => node,
        };
        match node {
            Node::Chunk { array, coords } => {
                let shard = array
                    .layout
                    .locate(&coords)
                    .map(|l| array.shard_rel(&l.shard));
                self.flush_array_for(&array, shard.as_deref())
            }
            Node::Scratch { array, .. } | Node::ArrayMeta { array, .. } => self.flush_array(&array),
            Node::File { rel } => {
                self.doc_finished(&rel)?;
                Ok(self.store.sync_file(&rel)?)
            }
            _ => Ok(()),
        }
    }

    /// `fsync` of a directory: an array's directory flushes the array; any other
    /// directory (the mount's root, a group) flushes everything.
    pub fn fsyncdir(&self, ino: u64) -> Result<()> {
        let (path, node) = self.node(ino)?;
        match node {
            Node::ArrayDir { array } | Node::KeyDir { array, .. } => {
                self.keep_files(super::kept::Keep::Under(&path))?;
                self.flush_array(&array)
            }
            _ => self.sync_all(),
        }
    }
}
