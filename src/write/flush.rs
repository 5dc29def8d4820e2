//! Flushing an array: its staged chunks are ordered shard-major by the [`Compactor`] (the
//! seed's aggregate-by-shard step), then each touched shard gets one crash-safe update
//! (`append::apply`): its chunks' bytes plus a fresh index. On the GPU the
//! compactor packs a copy of the batch and the shards are written from its result; on
//! the host only the layout is planned and each shard's write gathers the bytes straight
//! from the staged buffers, so a flush copies every byte once (into the page cache).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use super::append;
use super::staging::{Staged, Staging};
use crate::compact::{self, Compactor, Packed, ShardGrid, StagedBatch};
use crate::view::ShardedArray;

/// Why a flush failed. The staged chunks are kept and retried by the next flush.
#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    #[error("compacting {array}: {err}")]
    Compact { array: PathBuf, err: String },
    #[error("{0}")]
    Write(#[from] append::WriteError),
}

/// Counters of flush work, for `shardfs stats` and benchmarks.
#[derive(Debug, Default)]
pub struct FlushCounters {
    pub flushes: AtomicU64,
    pub chunks: AtomicU64,
    pub bytes: AtomicU64,
    pub shards: AtomicU64,
    pub compact_ns: AtomicU64,
    pub flush_ns: AtomicU64,
}

/// Flushes arrays of one store; one flush per array at a time.
pub struct Flusher {
    root: PathBuf,
    compactor: Arc<dyn Compactor>,
    locks: Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>,
    packed: Mutex<Packed>,
    pub counters: FlushCounters,
}

impl Flusher {
    pub fn new(root: PathBuf, compactor: Arc<dyn Compactor>) -> Self {
        Flusher {
            root,
            compactor,
            locks: Mutex::new(HashMap::new()),
            packed: Mutex::new(Packed::default()),
            counters: FlushCounters::default(),
        }
    }

    pub fn compactor_name(&self) -> &'static str {
        self.compactor.name()
    }

    /// Make `array`'s staged chunks durable. Returns the store paths of the shards
    /// written, for cache invalidation.
    pub fn flush_array(
        &self,
        staging: &Staging,
        array: &ShardedArray,
    ) -> Result<Vec<PathBuf>, FlushError> {
        let lock = self
            .locks
            .lock()
            .entry(array.rel.clone())
            .or_default()
            .clone();
        let _serial = lock.lock();
        let taken = staging.take(&array.rel);
        if taken.is_empty() {
            return Ok(Vec::new());
        }
        let started = Instant::now();
        match self.write(array, &taken) {
            Ok(shards) => {
                staging.done(&array.rel, &taken);
                let c = &self.counters;
                c.flushes.fetch_add(1, Ordering::Relaxed);
                c.chunks.fetch_add(taken.len() as u64, Ordering::Relaxed);
                c.shards.fetch_add(shards.len() as u64, Ordering::Relaxed);
                c.flush_ns
                    .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                Ok(shards)
            }
            Err(e) => {
                log::error!("flush of {} failed, will retry: {e}", array.rel.display());
                staging.restore(&array.rel, taken);
                Err(e)
            }
        }
    }

    fn write(
        &self,
        array: &ShardedArray,
        taken: &[(Vec<u64>, Staged)],
    ) -> Result<Vec<PathBuf>, FlushError> {
        let layout = &array.layout;
        // Chunks outside the (possibly resized) grid cannot be placed: drop them loudly.
        let (placed, outside): (Vec<_>, Vec<_>) =
            taken.iter().partition(|(c, _)| layout.chunk_in_grid(c));
        for (c, _) in outside {
            log::warn!(
                "{}: chunk {c:?} lies outside the array's grid; not written",
                array.rel.display()
            );
        }
        let writes: Vec<(&Vec<u64>, &Arc<Vec<u8>>)> = placed
            .iter()
            .filter_map(|(c, s)| s.as_ref().map(|b| (c, b)))
            .collect();
        let mut coords = Vec::with_capacity(writes.len() * layout.ndim());
        let mut sizes = Vec::with_capacity(writes.len());
        for (c, b) in &writes {
            coords.extend_from_slice(c);
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
            // The device packs a copy of the batch; the shards get slices of its result.
            let mut data = Vec::with_capacity(payload as usize);
            let mut src_offsets = Vec::with_capacity(writes.len());
            for (_, b) in &writes {
                src_offsets.push(data.len() as u64);
                data.extend_from_slice(b);
            }
            let batch = StagedBatch {
                grid: &grid,
                coords: &coords,
                data: &data,
                src_offsets: &src_offsets,
                sizes: &sizes,
            };
            self.compactor.compact(&batch, &mut packed)
        } else {
            // On the host the gather would be one more copy of every byte: plan only, and
            // let each shard's write gather from the staged buffers (`pwritev`).
            compact::plan_layout(&grid, &coords, &sizes, &mut packed)
        };
        compacted.map_err(|e| FlushError::Compact {
            array: array.rel.clone(),
            err: e.to_string(),
        })?;
        self.counters
            .compact_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.counters.bytes.fetch_add(payload, Ordering::Relaxed);
        // The bytes of the chunk at packed position `j`.
        let chunk = |j: usize| -> &[u8] {
            if on_device {
                packed.chunk_bytes(j)
            } else {
                writes[packed.order[j] as usize].1
            }
        };

        // Per shard: the packed run (if any) and the deletions.
        let mut per_shard: BTreeMap<Vec<u64>, (Option<usize>, Vec<usize>)> = BTreeMap::new();
        for (r, run) in packed.shards.iter().enumerate() {
            per_shard.entry(run.shard_coords.clone()).or_default().0 = Some(r);
        }
        for (c, s) in &placed {
            if s.is_none() {
                let loc = layout.locate(c).expect("in grid");
                per_shard
                    .entry(loc.shard)
                    .or_default()
                    .1
                    .push(loc.slots[0] as usize);
            }
        }
        let level = &layout.levels[0];
        let mut written = Vec::with_capacity(per_shard.len());
        for (shard, (run, deletes)) in per_shard {
            let mut updates: Vec<(usize, Option<&[u8]>)> =
                deletes.into_iter().map(|slot| (slot, None)).collect();
            if let Some(r) = run {
                for j in packed.shards[r].positions() {
                    updates.push((packed.slots[j] as usize, Some(chunk(j))));
                }
            }
            let rel = array.shard_rel(&shard);
            append::apply(&self.root, &rel, level, &updates)?;
            written.push(rel);
        }
        Ok(written)
    }
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
