//! Durability: flushing staged chunks to their shards (one array, all, the idle timer)
//! and what `fsync` of a file or a directory makes durable.

use std::sync::Arc;

use super::Overlay;
use super::{Node, Result, ShardedArray, View, ViewError};

impl View {
    /// Make the staged chunks of `array` durable.
    pub fn flush_array(&self, array: &ShardedArray) -> Result<()> {
        self.overlay_opt().map_or(Ok(()), |o| o.flush_array(array))
    }

    /// Make everything staged durable (and a full write buffer's back-pressure).
    pub fn flush_all(&self) -> Result<()> {
        self.overlay_opt().map_or(Ok(()), |o| o.flush_all())
    }

    /// The write-behind flush ([`Overlay::flush_behind`]): the mount's timer thread calls
    /// it between its ticks.
    pub fn flush_behind(&self, max: std::time::Duration) {
        if let Some(o) = self.overlay_opt() {
            o.flush_behind(max);
        }
    }

    /// Flush arrays whose oldest staged chunk is at least `idle` old, and store the
    /// files of their own that stood unchanged and closed as long (the timer).
    pub fn flush_idle(&self, idle: std::time::Duration) {
        let Some(o) = self.overlay_opt() else { return };
        let _ = o.keep_files(super::kept::Keep::Closed(idle));
        o.flush_idle(idle);
    }

    /// Make everything this mount holds durable: staged chunks and the files of their
    /// own in arrays' directories (`fsync` of the mount's root or a group, unmount).
    pub fn sync_all(&self) -> Result<()> {
        let kept = self
            .overlay_opt()
            .map_or(Ok(()), |o| o.keep_files(super::kept::Keep::All));
        let flushed = self.flush_all();
        kept.and(flushed)
    }

    /// `fsync` through handle `fh` of `ino`: as [`View::fsync`], but a file renamed to
    /// where its descriptors could not follow it ([`View::follow_rename`]) and written
    /// since answers `ESTALE` (what was written is stored nowhere).
    pub fn fsync_file(&self, ino: u64, fh: u64) -> Result<()> {
        if let Ok(super::Handle::Scratch { node, file, .. }) = self.open.handles.get(fh)
            && file.lock().renamed_away
        {
            self.overlay()?.commit_scratch(&node, &file)?;
        }
        self.fsync(ino)
    }

    /// `fsync` of a file: durable when it returns. A chunk still open for writing is
    /// committed with what it holds now (later writes commit again on close).
    pub fn fsync(&self, ino: u64) -> Result<()> {
        let (_, node) = match self.tree.node(ino) {
            // Retired while open (a chunk file taken into a new array, whose adoption
            // flushed it): whatever it became is made durable with everything else.
            Err(ViewError::StaleInode(_)) if self.tree.inodes.get_any(ino).is_some() => {
                return self.sync_all();
            }
            res => res?,
        };
        if let Node::Scratch { path, .. } = &node
            && let Some(file) = self.writer()?.scratch.get(path)
        {
            let o = self.overlay()?;
            o.commit_scratch(&node, &file)?;
            o.keep_file(path, &file)?;
        }
        // A written chunk not yet settled (a handle of it is still open, or its release
        // has not come yet): its fsync reports its own shard, as a settled chunk's does.
        let node = match node {
            Node::Scratch {
                ref path,
                ref array,
                ref parent,
            } => match self.tree.target(
                array,
                parent.as_deref(),
                path.file_name().unwrap_or_default(),
            ) {
                Ok(super::node::Target::Chunk(coords)) => Node::Chunk {
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
                let o = self.overlay_opt();
                o.map_or(Ok(()), |o| o.flush_array_for(&array, shard.as_deref()))
            }
            Node::Scratch { array, .. } | Node::ArrayMeta { array, .. } => self.flush_array(&array),
            Node::File { rel } => {
                self.doc_finished(&rel)?;
                Ok(self.tree.store.sync_file(&rel)?)
            }
            _ => Ok(()),
        }
    }

    /// `fsync` of a directory: an array's directory flushes the array; any other
    /// directory (the mount's root, a group) flushes everything.
    pub fn fsyncdir(&self, ino: u64) -> Result<()> {
        let (path, node) = self.tree.node(ino)?;
        match node {
            Node::ArrayDir { array } | Node::KeyDir { array, .. } => {
                if let Some(o) = self.overlay_opt() {
                    o.keep_files(super::kept::Keep::Under(&path))?;
                }
                self.flush_array(&array)
            }
            _ => self.sync_all(),
        }
    }
}

impl Overlay<'_> {
    /// Make the staged chunks of `array` durable.
    pub(super) fn flush_array(&self, array: &ShardedArray) -> Result<()> {
        self.flush_array_for(array, None)
    }

    /// Flush `array`; with `shard`, fail only if that shard (store path) could not be
    /// committed: a chunk's `fsync` reports its own shard, not its neighbours'.
    fn flush_array_for(&self, array: &ShardedArray, shard: Option<&std::path::Path>) -> Result<()> {
        let w = self.w;
        let array = self.tree.arrays.get(&array.rel);
        let Some(array) = array else { return Ok(()) };
        let Some(array) = self.array_to_flush(array) else {
            return match shard {
                Some(_) => Err(ViewError::Io(std::io::Error::from_raw_os_error(
                    libc::ESTALE,
                ))),
                None => Ok(()),
            };
        };
        let shard_rel = |s: &[u64]| array.shard_rel(s);
        let target = crate::write::flush::ArrayTarget {
            rel: &array.rel,
            layout: &array.layout,
            shard_rel: &shard_rel,
        };
        // Each shard committed is cached as the commit left it (or dropped from the
        // cache): a read of it next does not read its index again.
        let flushed = w.flusher.flush_array_cached(
            self.tree.store.as_ref(),
            &w.staging,
            &target,
            Some(&self.tree.shards),
        );
        let mut failed = flushed.failed.into_iter();
        let failure = match shard {
            None => failed.next(),
            Some(rel) => failed.find(|e| e.concerns(rel)),
        };
        failure.map_or(Ok(()), |e| Err(ViewError::Flush(e)))
    }

    /// The array `array`'s staged chunks are flushed into: `array` while its metadata in
    /// the store is the one it was read from (or this mount unlinked it: see
    /// `unlink_array_meta`), the array as the store now describes it where another mount
    /// (or a tool) changed only its shape (out-of-grid chunks are then dropped by the new
    /// shape, not placed by the old one). `None` where another mount removed or moved the
    /// array, or made one of another layout at its path (other chunks, shards, codecs or
    /// keys): the chunks staged for it are let go and named (log, `shardfs stats`
    /// `refused`, the unmount). Flushed, they made a shard file where the array was with
    /// no metadata beside it, or went into the new array packed by the old layout (an
    /// array zarr-python could no longer read, or values another mount had fsynced
    /// replaced) (found by adversarial testers: `mv a a2`, `rm -rf a`, or
    /// `create_array(overwrite=True)` in one mount while a chunk of `a` was staged in
    /// another).
    fn array_to_flush(&self, array: Arc<ShardedArray>) -> Option<Arc<ShardedArray>> {
        // Nothing staged (a directory's `fsync`, a flush before an unlink): nothing to
        // place, no store request, nothing to name. An array whose metadata this mount
        // holds unlinked is looked at as any other (the document kept at the unlink says
        // what it is now): before, its chunks were placed by the layout held, whatever
        // another mount had made there since.
        if !self.w.staging.holds(&array.rel) {
            return Some(array);
        }
        let why = match self.tree.store.stat(&array.meta_rel) {
            Ok(Some(m)) if m.version() == array.json_meta.version() => return Some(array),
            Ok(Some(_)) => match self.store_array_now(&array) {
                Some(now) if !array.replaced_by(&now) => return Some(now),
                Some(_) => {
                    "another mount made another array at its path: the chunks staged for \
                     the one it replaced are not stored"
                }
                None => return Some(array),
            },
            // Another mount unlinked its metadata while its names stay: they are still
            // the array's (`store::UNLINKED_META`), and so are the chunks staged here,
            // unless the document kept is another array's (one made there since).
            Ok(None) => match self.kept_array_now(&array) {
                Some(Some(now)) if !array.replaced_by(&now) => return Some(array),
                Some(Some(_)) => {
                    "another mount made another array at its path: the chunks staged for \
                     the one it replaced are not stored"
                }
                // Not told (a read failed): kept, as for a failing stat below.
                None => return Some(array),
                Some(None) => {
                    "its metadata is gone from the store (another mount removed or moved \
                     the array): the chunks staged for it are not stored"
                }
            },
            Err(_) => return Some(array),
        };
        self.let_go_staged(&array.rel, why);
        None
    }

    /// The chunks staged for the array at `rel` can be stored nowhere (`why`): let go,
    /// and named in the log, `shardfs stats` (`refused`) and the unmount's report.
    pub(super) fn let_go_staged(&self, rel: &std::path::Path, why: &str) {
        self.w.staging.discard(rel);
        log::error!("{}: {why}", rel.display());
        self.counters
            .refused
            .push(rel.display().to_string(), why.to_string());
    }

    /// The array whose metadata another mount unlinked at `array`'s path, from the
    /// document kept there: `Some(None)` where there is none (the array is gone), `None`
    /// where that cannot be told (a store error).
    fn kept_array_now(&self, array: &ShardedArray) -> Option<Option<Arc<ShardedArray>>> {
        let kept = array.rel.join(crate::store::UNLINKED_META);
        if self.tree.store.stat(&kept).ok()?.is_none() {
            return Some(None);
        }
        let dir_meta = self.tree.store.stat(&array.rel).ok()??;
        match self
            .tree_read()
            .load_array_from(&array.rel, &kept, dir_meta)
        {
            Ok(now) => Some(Some(Arc::new(now))),
            Err(super::array_load::NotShown::Io(_)) => None,
            Err(_) => Some(None),
        }
    }

    /// `array` as the store describes it now (`None` where that cannot be told: a read
    /// failed, or the directory is no array now, which a later flush tells).
    fn store_array_now(&self, array: &ShardedArray) -> Option<Arc<ShardedArray>> {
        let dir_meta = self.tree.store.stat(&array.rel).ok()??;
        self.tree_read()
            .load_array(&array.rel, dir_meta)
            .ok()
            .map(Arc::new)
    }

    /// Make everything staged durable (and a full write buffer's back-pressure).
    pub(super) fn flush_all(&self) -> Result<()> {
        let mut first_err = None;
        for rel in self.w.staging.arrays(None) {
            let array = self.tree.arrays.get(&rel);
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
    pub(super) fn flush_behind(&self, max: std::time::Duration) {
        for rel in self.w.staging.wait_due(max) {
            if let Some(array) = self.tree.arrays.get(&rel) {
                let _ = self.flush_array(&array);
            }
        }
    }

    /// Flush arrays whose oldest staged chunk is at least `idle` old.
    fn flush_idle(&self, idle: std::time::Duration) {
        for rel in self.w.staging.arrays(Some(idle)) {
            if let Some(array) = self.tree.arrays.get(&rel) {
                let _ = self.flush_array(&array);
            }
        }
    }
}
