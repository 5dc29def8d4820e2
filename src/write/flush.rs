//! Flushing an array: its staged chunks are ordered shard-major by the [`Compactor`] (the
//! seed's aggregate-by-shard step), then each touched shard gets one crash-safe update
//! (`append::apply`): its chunks' bytes plus a fresh index. On the GPU the
//! compactor packs the batch into page-locked memory and the shards are written from
//! there; on the host only the layout is planned and each shard's write gathers the
//! bytes straight from the staged buffers, so a flush copies every byte once (into the
//! page cache). `--compactor auto` takes whichever measured faster
//! ([`crate::compact::AutoCompactor`]).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use super::merge;
use super::staging::{StagedChunk, Staging};
use crate::compact::{self, Compactor, Packed, ShardGrid};
use crate::format::ShardLayout;
use crate::store::shard::{Shard, ShardCache};
use crate::store::{CommitError, SlotChange, Store};

/// Why a flush failed. The chunks that could not be stored stay staged and are retried
/// by the next flush; the rest of the flush stands.
#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    #[error("compacting {}: {err}", array.display())]
    Compact { array: PathBuf, err: String },
    #[error("shard {} of {}: {err}", shard.display(), array.display())]
    Commit {
        array: PathBuf,
        shard: PathBuf,
        #[source]
        err: CommitError,
    },
}

impl FlushError {
    /// Whether this failure concerns the shard `rel` (a failed compaction concerns all).
    pub fn concerns(&self, rel: &std::path::Path) -> bool {
        match self {
            FlushError::Compact { .. } => true,
            FlushError::Commit { shard, .. } => shard == rel,
        }
    }

    /// The errno an `fsync` (or the write that had to flush) reports for this failure.
    pub fn errno(&self) -> i32 {
        match self {
            FlushError::Compact { .. } => libc::EIO,
            FlushError::Commit { err, .. } => err.errno(),
        }
    }
}

/// Counters of flush work, for `shardfs stats` and benchmarks.
#[derive(Debug, Default)]
pub struct FlushCounters {
    pub flushes: AtomicU64,
    pub chunks: AtomicU64,
    pub shards: AtomicU64,
    /// Staged changes dropped at commit because the shard held a change closed later.
    pub superseded: AtomicU64,
    pub flush_ns: AtomicU64,
    /// Batches whose layout was only planned on the host (the shard writes gather
    /// from the staged buffers): count, payload bytes, time. The bytes flushed and the
    /// compaction time are the sums of the two ways'.
    pub host_batches: AtomicU64,
    pub host_bytes: AtomicU64,
    pub host_ns: AtomicU64,
    /// Batches packed on the device (the GPU): count, payload bytes, time.
    pub device_batches: AtomicU64,
    pub device_bytes: AtomicU64,
    pub device_ns: AtomicU64,
}

impl FlushCounters {
    /// One batch laid out (packed on the device, or planned on the host) in `took`.
    fn packed(&self, on_device: bool, payload: u64, took: std::time::Duration) {
        let (batches, bytes, ns) = if on_device {
            (&self.device_batches, &self.device_bytes, &self.device_ns)
        } else {
            (&self.host_batches, &self.host_bytes, &self.host_ns)
        };
        batches.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(payload, Ordering::Relaxed);
        ns.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// What one flush of an array did.
#[derive(Debug, Default)]
pub struct Flushed {
    /// Store paths of the shards committed (for cache invalidation, where the flush
    /// did not keep a cache up to date: [`Flusher::flush_array_cached`]).
    pub shards: Vec<PathBuf>,
    /// Why shards failed (their chunks stay staged): one error per shard, or one
    /// for the whole array when it could not be compacted.
    pub failed: Vec<FlushError>,
}

/// The array a flush writes: the key its chunks are staged under, its layout, and where
/// each shard lives in the store.
pub struct ArrayTarget<'a> {
    pub rel: &'a std::path::Path,
    pub layout: &'a ShardLayout,
    pub shard_rel: &'a dyn Fn(&[u64]) -> PathBuf,
}

/// Flushes arrays of one store; one flush per array at a time.
pub struct Flusher {
    compactor: Arc<dyn Compactor>,
    locks: Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>,
    packed: Mutex<Packed>,
    pub counters: FlushCounters,
}

impl Flusher {
    pub fn new(compactor: Arc<dyn Compactor>) -> Self {
        Flusher {
            compactor,
            locks: Mutex::new(HashMap::new()),
            packed: Mutex::new(Packed::default()),
            counters: FlushCounters::default(),
        }
    }

    pub fn compactor_name(&self) -> &'static str {
        self.compactor.name()
    }

    /// What the compactor says of itself, for `shardfs stats`.
    pub fn compactor_description(&self) -> Option<serde_json::Value> {
        self.compactor.describe()
    }

    /// Commit `array`'s staged chunks to `store`, one shard commit each, under the merge
    /// rule. Shards that commit are done; the chunks of a shard that fails stay staged
    /// (and `failed` says why), so one bad shard never holds back the others.
    pub fn flush_array(
        &self,
        store: &dyn Store,
        staging: &Staging,
        array: &ArrayTarget,
    ) -> Flushed {
        self.flush_array_cached(store, staging, array, None)
    }

    /// [`Flusher::flush_array`], keeping `shards` (the mount's cache of shard indices) up
    /// to date with each commit as it is made, under this array's flush lock: the shard
    /// as the commit left it is cached with its new index where the store could say what
    /// it left ([`crate::store::StoredShard`]), else what was cached is dropped. Either
    /// way the caller has nothing left to invalidate.
    pub fn flush_array_cached(
        &self,
        store: &dyn Store,
        staging: &Staging,
        array: &ArrayTarget,
        shards: Option<&ShardCache>,
    ) -> Flushed {
        let lock = self
            .locks
            .lock()
            .entry(array.rel.to_path_buf())
            .or_default()
            .clone();
        let _serial = lock.lock();
        let taken = staging.take(array.rel);
        if taken.is_empty() {
            return Flushed::default();
        }
        let started = Instant::now();
        let (written, failed, kept) = match self.write(store, array, &taken, shards) {
            Ok(done) => done,
            Err(e) => (Vec::new(), vec![e], taken.clone()),
        };
        for e in &failed {
            log::error!("flush of {}: {e}", array.rel.display());
        }
        if !kept.is_empty() {
            log::error!(
                "flush of {}: {} chunk(s) stay staged and are retried",
                array.rel.display(),
                kept.len()
            );
        }
        let committed = taken.len() - kept.len();
        // Back to staging first, then forget the rest of what was taken.
        staging.restore(array.rel, kept);
        staging.done(array.rel, &taken);
        let c = &self.counters;
        c.flushes.fetch_add(1, Ordering::Relaxed);
        c.chunks.fetch_add(committed as u64, Ordering::Relaxed);
        c.shards.fetch_add(written.len() as u64, Ordering::Relaxed);
        c.flush_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Flushed {
            shards: written,
            failed,
        }
    }

    /// Commit `taken` (keeping `shards` up to date, if given). Returns the shards
    /// committed, the first failure, and the chunks that were not stored (to stage again).
    #[allow(clippy::type_complexity)]
    fn write(
        &self,
        store: &dyn Store,
        array: &ArrayTarget,
        taken: &[StagedChunk],
        shards: Option<&ShardCache>,
    ) -> Result<(Vec<PathBuf>, Vec<FlushError>, Vec<StagedChunk>), FlushError> {
        let layout = array.layout;
        let placed = in_grid(array, taken);
        let writes: Vec<(&StagedChunk, &Arc<Vec<u8>>)> = placed
            .iter()
            .filter_map(|t| t.data.as_ref().map(|b| (*t, b)))
            .collect();
        let mut coords = Vec::with_capacity(writes.len() * layout.ndim());
        let mut sizes = Vec::with_capacity(writes.len());
        for (t, b) in &writes {
            coords.extend_from_slice(&t.coords);
            sizes.push(b.len() as u64);
        }
        let payload: u64 = sizes.iter().sum();
        let grid = ShardGrid::new(
            layout.chunk_counts().to_vec(),
            layout.inner_per_shard().to_vec(),
        );
        let mut packed = self.packed.lock();
        let t = Instant::now();
        let on_device = self.compactor.packs_on_device(payload);
        let compacted = if on_device {
            // The device packs the batch; the shards are written from its result (in
            // the GPU's page-locked result buffer, held until the commits are done).
            let chunks: Vec<&[u8]> = writes.iter().map(|(_, b)| b.as_slice()).collect();
            self.compactor
                .pack_chunks(&grid, &coords, &chunks, &mut packed)
                .map(Some)
        } else {
            // On the host the gather would be one more copy of every byte: plan only, and
            // let each shard's write gather from the staged buffers (`pwritev`).
            compact::plan_layout(&grid, &coords, &sizes, &mut packed).map(|()| None)
        };
        let packed_bytes = compacted.map_err(|e| FlushError::Compact {
            array: array.rel.to_path_buf(),
            err: e.to_string(),
        })?;
        let took = t.elapsed();
        self.counters.packed(on_device, payload, took);
        // The bytes of the chunk at packed position `j`.
        let chunk = |j: usize| -> &[u8] {
            match &packed_bytes {
                Some(bytes) => &bytes[packed.offsets[j] as usize..packed.offsets[j + 1] as usize],
                None => writes[packed.order[j] as usize].1,
            }
        };

        let mut per_shard: BTreeMap<Vec<u64>, ShardWork> = BTreeMap::new();
        for run in &packed.shards {
            let work = per_shard.entry(run.shard_coords.clone()).or_default();
            for j in run.positions() {
                let (t, _) = writes[packed.order[j] as usize];
                work.changes.push(SlotChange {
                    slot: packed.slots[j] as usize,
                    data: Some(chunk(j)),
                    closed: t.closed,
                });
                work.chunks.push(t.clone());
            }
        }
        add_deletions(layout, &placed, &mut per_shard);
        let (written, failed, kept) = self.commit_shards(store, array, per_shard, shards);
        drop(packed_bytes);
        // Once the shards are written and durable: the first large batch starts `auto`'s
        // calibration, which must not compete with the shard writes of its own flush
        // (started after the layout, it made a 1 GiB flush 10 % slower on an H100).
        self.compactor.observe_flush(on_device, payload, took);
        Ok((written, failed, kept))
    }

    /// Commit each shard's slot changes (merged with what the store holds by close
    /// time), keeping `shards` (the mount's cache) up to date if given. Returns the
    /// shards committed, one failure per shard that failed, and its chunks (to stage
    /// again).
    fn commit_shards(
        &self,
        store: &dyn Store,
        array: &ArrayTarget,
        per_shard: BTreeMap<Vec<u64>, ShardWork<'_>>,
        shards: Option<&ShardCache>,
    ) -> (Vec<PathBuf>, Vec<FlushError>, Vec<StagedChunk>) {
        let level = &array.layout.levels[0];
        let mut written = Vec::with_capacity(per_shard.len());
        let mut failed = Vec::new();
        let mut kept = Vec::new();
        for (shard, work) in per_shard {
            let rel = (array.shard_rel)(&shard);
            let ticket = shards.map(|c| c.before_commit(&rel));
            let outcome = store.commit_shard(&rel, level, &mut |found| {
                merge::last_close_wins(found, &work.changes)
            });
            match outcome {
                Ok(o) => {
                    if let (Some(cache), Some(ticket)) = (shards, ticket) {
                        let now = o.stored.map(|s| Shard::committed(&rel, s, o.index));
                        cache.committed(&rel, ticket, now);
                    }
                    let superseded = work.changes.len().saturating_sub(o.applied);
                    if superseded > 0 {
                        log::info!(
                            "{}: {superseded} staged chunk(s) superseded by later writes in the store",
                            rel.display()
                        );
                        self.counters
                            .superseded
                            .fetch_add(superseded as u64, Ordering::Relaxed);
                    }
                    written.push(rel);
                }
                Err(err) => {
                    kept.extend(work.chunks);
                    failed.push(FlushError::Commit {
                        array: array.rel.to_path_buf(),
                        shard: rel,
                        err,
                    });
                }
            }
        }
        (written, failed, kept)
    }
}

/// One shard's part of a flush: its slot changes (packed writes, then deletions) and the
/// staged chunks they came from.
#[derive(Default)]
struct ShardWork<'a> {
    changes: Vec<SlotChange<'a>>,
    chunks: Vec<StagedChunk>,
}
/// The chunks of `taken` inside `array`'s grid. Those outside the (possibly resized)
/// grid cannot be placed: dropped, loudly.
fn in_grid<'t>(array: &ArrayTarget, taken: &'t [StagedChunk]) -> Vec<&'t StagedChunk> {
    let (placed, outside): (Vec<_>, Vec<_>) = taken
        .iter()
        .partition(|t| array.layout.chunk_in_grid(&t.coords));
    for t in outside {
        log::warn!(
            "{}: chunk {:?} lies outside the array's grid; not written",
            array.rel.display(),
            t.coords
        );
    }
    placed
}

/// The staged deletions among `placed`, added to their shards' work.
fn add_deletions(
    layout: &ShardLayout,
    placed: &[&StagedChunk],
    per_shard: &mut BTreeMap<Vec<u64>, ShardWork<'_>>,
) {
    for t in placed {
        if t.data.is_none() {
            let loc = layout.locate(&t.coords).expect("in grid");
            let work = per_shard.entry(loc.shard).or_default();
            work.changes.push(SlotChange {
                slot: loc.slots[0] as usize,
                data: None,
                closed: t.closed,
            });
            work.chunks.push((*t).clone());
        }
    }
}

/// Whether chunks of an array of `layout` can be flushed at all (the compactor's keys
/// fit); `Err` says why not. Checked before metadata that would make such an array is
/// stored, and before a chunk of one is staged.
pub fn storable(layout: &ShardLayout) -> Result<(), compact::CompactError> {
    ShardGrid::new(
        layout.chunk_counts().to_vec(),
        layout.inner_per_shard().to_vec(),
    )
    .check()
}

/// The default chunks per shard for a new array: shards of about `target` bytes of
/// uncompressed inner chunks, filled from the fastest dimension, never more chunks along
/// a dimension than the array has.
pub fn default_chunks_per_shard(
    shape: &[u64],
    inner: &[u64],
    itemsize: u64,
    target: u64,
) -> Vec<u64> {
    let chunk_bytes = inner.iter().product::<u64>().max(1) * itemsize.max(1);
    let mut budget = (target / chunk_bytes).max(1);
    let mut cps = vec![1; shape.len()];
    for d in (0..shape.len()).rev() {
        let count = shape[d].div_ceil(inner[d].max(1)).max(1);
        cps[d] = budget.min(count).max(1);
        budget /= cps[d];
        if budget <= 1 {
            break;
        }
    }
    cps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_shards_hold_about_the_target() {
        // 1 MiB chunks, 64 MiB target: 64 chunks, from the last dimension first.
        assert_eq!(
            default_chunks_per_shard(&[1000, 1000, 1000], &[64, 64, 128], 2, 64 << 20),
            [1, 8, 8]
        );
        // Small arrays: never more than the array has.
        assert_eq!(
            default_chunks_per_shard(&[10, 10], &[5, 5], 1, 64 << 20),
            [2, 2]
        );
        assert_eq!(
            default_chunks_per_shard(&[], &[], 8, 64 << 20),
            Vec::<u64>::new()
        );
    }
}
