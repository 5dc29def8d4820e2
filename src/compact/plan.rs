//! The shard-major permutation shared by every compactor.
//!
//! Owns validation of a [`StagedBatch`] and the lifted-stride keys: fills
//! `Packed::{order, slots, shards}` and returns the payload size. Does not touch
//! `Packed::{data, offsets}` (the size scan and the gather are the implementations'
//! work, on the CPU or the GPU), except in [`plan_layout`], the whole compaction but
//! the gather, for callers that write each chunk from its own buffer.

use super::{CompactError, Packed, ShardGrid, ShardRun, StagedBatch};

/// Grid facts derived once per batch.
struct Lifted {
    shard_counts: Vec<u64>,
    /// Product of `chunks_per_shard`: slots per shard.
    slots_per_shard: u64,
    /// Upper bound (exclusive) of every key: shards × slots per shard.
    key_space: u64,
}

/// Whether `grid` can be compacted at all (see [`ShardGrid::check`]).
pub(crate) fn check_grid(grid: &ShardGrid) -> Result<(), CompactError> {
    lift(grid).map(|_| ())
}

fn lift(grid: &ShardGrid) -> Result<Lifted, CompactError> {
    if grid.chunk_counts.len() != grid.chunks_per_shard.len() {
        return Err(CompactError::GridRankMismatch {
            chunk_counts: grid.chunk_counts.len(),
            chunks_per_shard: grid.chunks_per_shard.len(),
        });
    }
    if let Some(dim) = grid.chunks_per_shard.iter().position(|&c| c == 0) {
        return Err(CompactError::ZeroChunksPerShard { dim });
    }
    let shard_counts = grid.shard_counts().ok_or(CompactError::GridTooLarge)?;
    let product = |v: &[u64]| {
        v.iter()
            .try_fold(1u64, |a, &x| a.checked_mul(x))
            .ok_or(CompactError::GridTooLarge)
    };
    let slots_per_shard = product(&grid.chunks_per_shard)?;
    let key_space = product(&shard_counts)?
        .checked_mul(slots_per_shard)
        .ok_or(CompactError::GridTooLarge)?;
    Ok(Lifted {
        shard_counts,
        slots_per_shard,
        key_space,
    })
}

/// Checks lengths and source ranges; returns the payload size in bytes.
fn check_shapes(batch: &StagedBatch<'_>) -> Result<u64, CompactError> {
    let n = batch.sizes.len();
    if batch.src_offsets.len() != n {
        return Err(CompactError::LengthMismatch {
            what: "src_offsets",
            expected: n,
            got: batch.src_offsets.len(),
        });
    }
    check_counts(batch.grid, batch.coords, n)?;
    let data_len = batch.data.len();
    for (index, (&offset, &size)) in batch.src_offsets.iter().zip(batch.sizes).enumerate() {
        let end = offset.checked_add(size);
        if end.is_none_or(|e| e > data_len as u64) {
            return Err(CompactError::SourceOutOfBounds {
                index,
                offset,
                size,
                data_len,
            });
        }
    }
    payload(batch.sizes)
}

/// `n` chunks: `n` coordinates of the grid's rank, and few enough for the `u32` order.
fn check_counts(grid: &ShardGrid, coords: &[u64], n: usize) -> Result<(), CompactError> {
    let want_coords = n
        .checked_mul(grid.rank())
        .ok_or(CompactError::TooManyChunks { n })?;
    if coords.len() != want_coords {
        return Err(CompactError::LengthMismatch {
            what: "coords",
            expected: want_coords,
            got: coords.len(),
        });
    }
    if u32::try_from(n).is_err() {
        return Err(CompactError::TooManyChunks { n });
    }
    Ok(())
}

/// The sum of `sizes`, if the packed bytes could be held in memory.
fn payload(sizes: &[u64]) -> Result<u64, CompactError> {
    // Saturating: sources may overlap, so the sum may exceed any one buffer.
    let total = sizes.iter().fold(0u64, |a, &s| a.saturating_add(s));
    if total > isize::MAX as u64 {
        return Err(CompactError::PayloadTooLarge { total });
    }
    Ok(total)
}

/// Validates `batch`, fills `out.order`, `out.slots` and `out.shards`, and returns
/// the payload size (the future `offsets[n]`).
pub(crate) fn plan(batch: &StagedBatch<'_>, out: &mut Packed) -> Result<u64, CompactError> {
    let lifted = lift(batch.grid)?;
    let total = check_shapes(batch)?;
    arrange(batch.grid, batch.coords, batch.sizes.len(), &lifted, out)?;
    Ok(total)
}

/// [`plan`] for chunks given by coordinates and sizes alone (no source buffer), plus the
/// size scan: everything of a compaction but the gather. `out.data` is left empty.
pub(crate) fn plan_layout(
    grid: &ShardGrid,
    coords: &[u64],
    sizes: &[u64],
    out: &mut Packed,
) -> Result<(), CompactError> {
    let lifted = lift(grid)?;
    check_counts(grid, coords, sizes.len())?;
    payload(sizes)?;
    arrange(grid, coords, sizes.len(), &lifted, out)?;
    scan_sizes(sizes, &out.order, &mut out.offsets);
    out.data.clear();
    Ok(())
}

/// Permute sizes into packed order and exclusive-scan them: `offsets` gets `n + 1`
/// entries. Cannot overflow: [`payload`] bounded the sum.
pub(crate) fn scan_sizes(sizes: &[u64], order: &[u32], offsets: &mut Vec<u64>) {
    offsets.clear();
    offsets.reserve(order.len() + 1);
    let mut acc = 0u64;
    offsets.push(acc);
    for &i in order {
        acc += sizes[i as usize];
        offsets.push(acc);
    }
}

/// Keys, order, slots and shard runs of `n` chunks at `coords` (already checked).
fn arrange(
    grid: &ShardGrid,
    coords: &[u64],
    n: usize,
    lifted: &Lifted,
    out: &mut Packed,
) -> Result<(), CompactError> {
    let keys = &mut out.keys;
    compute_keys(grid, coords, n, lifted, keys)?;
    fill_order(keys, lifted.key_space, &mut out.sort_buf, &mut out.order)?;

    // Walk the sorted keys: a new run starts wherever the shard changes.
    out.slots.clear();
    let mut runs = 0usize;
    let mut current = u64::MAX;
    for (j, &i) in out.order.iter().enumerate() {
        let key = keys[i as usize];
        let (shard, slot) = (key / lifted.slots_per_shard, key % lifted.slots_per_shard);
        out.slots.push(slot);
        if shard != current || j == 0 {
            if runs > 0 {
                out.shards[runs - 1].end = j;
            }
            if runs == out.shards.len() {
                out.shards.push(ShardRun::default());
            }
            let run = &mut out.shards[runs];
            run.first = j;
            unravel(shard, &lifted.shard_counts, &mut run.shard_coords);
            runs += 1;
            current = shard;
        }
    }
    if runs > 0 {
        out.shards[runs - 1].end = out.order.len();
    }
    out.shards.truncate(runs);
    Ok(())
}

/// `keys[i]` = ravel(s_0..s_{D-1}, w_0..w_{D-1}) over (shard_counts.., chunks_per_shard..),
/// computed as `ravel(s) * slots_per_shard + ravel(w)`.
fn compute_keys(
    grid: &ShardGrid,
    coords: &[u64],
    n: usize,
    lifted: &Lifted,
    keys: &mut Vec<u64>,
) -> Result<(), CompactError> {
    let rank = grid.rank();
    keys.clear();
    keys.reserve(n);
    for index in 0..n {
        let coords = &coords[index * rank..(index + 1) * rank];
        let (mut shard, mut slot) = (0u64, 0u64);
        for (dim, &t) in coords.iter().enumerate() {
            let count = grid.chunk_counts[dim];
            if t >= count {
                return Err(CompactError::ChunkOutOfGrid {
                    index,
                    dim,
                    coord: t,
                    count,
                });
            }
            let per = grid.chunks_per_shard[dim];
            // No overflow: both ravels stay below key_space, checked in `lift`.
            shard = shard * lifted.shard_counts[dim] + t / per;
            slot = slot * per + t % per;
        }
        keys.push(shard * lifted.slots_per_shard + slot);
    }
    Ok(())
}

/// Sorts batch indices by key into `order`, rejecting duplicate keys.
fn fill_order(
    keys: &[u64],
    key_space: u64,
    sort_buf: &mut Vec<u64>,
    order: &mut Vec<u32>,
) -> Result<(), CompactError> {
    order.clear();
    // Callers often stage in order already: then the sort is a scan.
    if keys.windows(2).all(|w| w[0] < w[1]) {
        order.extend(0..keys.len() as u32);
        return Ok(());
    }
    if key_space <= 1 << 32 {
        // Pack (key, index) into one u64 so the sort moves 8-byte words and breaks
        // ties by index, which the duplicate check below reports deterministically.
        sort_buf.clear();
        sort_buf.extend(keys.iter().enumerate().map(|(i, &k)| (k << 32) | i as u64));
        sort_buf.sort_unstable();
        order.extend(sort_buf.iter().map(|&p| p as u32));
    } else {
        order.extend(0..keys.len() as u32);
        order.sort_unstable_by_key(|&i| (keys[i as usize], i));
    }
    for w in order.windows(2) {
        if keys[w[0] as usize] == keys[w[1] as usize] {
            return Err(CompactError::DuplicateChunk {
                first: w[0] as usize,
                second: w[1] as usize,
            });
        }
    }
    Ok(())
}

/// Row-major unravel of `linear` over `shape` into `coords`.
fn unravel(mut linear: u64, shape: &[u64], coords: &mut Vec<u64>) {
    coords.clear();
    coords.resize(shape.len(), 0);
    for (c, &extent) in coords.iter_mut().zip(shape).rev() {
        *c = linear % extent;
        linear /= extent;
    }
}
