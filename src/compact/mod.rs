//! Compaction: packs a batch of staged inner chunks into shard-major order.
//!
//! Owns the "aggregate-by-shard" step of the flush path: given the chunks of one
//! array that were staged in memory (each with its inner-chunk grid coordinates and
//! its encoded bytes), produce one dense buffer in which every shard's chunks are
//! contiguous, plus the bookkeeping the shard writer needs (which batch chunk sits at
//! which packed position, the byte offsets, and each chunk's slot in its shard index).
//! It does **not** own the shard files, the shard index encoding, CRCs or staging
//! itself; the caller appends each [`ShardRun`]'s bytes to its shard file and writes
//! the index entries.
//!
//! # Order
//!
//! Chunk coordinate `t_d` lifts to `(s_d, w_d) = (t_d / cps_d, t_d % cps_d)` and the
//! lifted coordinate `(s_0..s_{D-1}, w_0..w_{D-1})` is ravelled row-major over
//! `(shard_counts.., chunks_per_shard..)`. The packed order sorts the batch by that
//! key: shards in row-major order of their shard coordinates, and within a shard the
//! chunks in row-major order of their within-shard coordinates. A chunk's `slot` is
//! `ravel(w)` over `chunks_per_shard`, i.e. its entry in the shard index. Edge shards
//! (grid not a multiple of `chunks_per_shard`) and rank 0 (one chunk, one shard)
//! follow from the same rule.
//!
//! # Algorithm (all implementations, byte-identical output)
//!
//! 1. permutation: keys of the staged chunks, sorted on the host (a batch is sparse,
//!    so `P[i]` is the rank of chunk `i`'s key among the batch's keys);
//! 2. permute sizes into packed order, exclusive scan into `offsets`;
//! 3. gather each chunk's bytes to `data[offsets[P[i]]..]`.
//!
//! [`CpuCompactor`] does 2–3 on the host: memcpy-class copies, one thread per 4 MiB up
//! to every core, non-temporal stores from 32 MiB. [`GpuCompactor`] does them with
//! three NVRTC-compiled kernels via `cudarc` (driver loaded at run time; no or broken
//! driver ⇒ [`GpuUnavailable`], never a panic); its gather reads the batch from, and
//! writes the result into, page-locked host memory mapped into the device
//! ([`HostBuffer`]), so PCIe carries both directions at once and the host copies
//! nothing it does not have to. A caller that only writes the packed bytes to files
//! can skip the host gather altogether: [`plan_layout`] gives the layout, and the
//! write gathers (`pwritev`) from the chunks' own buffers; [`Compactor::packs_on_device`]
//! says when to. [`AutoCompactor`] picks per batch from measured speeds: a calibration
//! when it is first needed, then the batches it runs.
//!
//! # Output layout
//!
//! [`Packed`] holds parallel arrays indexed by packed position `j` (`order`, `slots`,
//! `offsets[..n]`) plus one [`ShardRun`] per shard touched, a range of positions.
//! Chunk `j` of shard `run` goes at byte `offsets[j] - offsets[run.first]` of the
//! run's bytes, and its shard index entry is `slots[j]`; empty chunks (size 0) keep
//! their position and slot, so the caller decides how to record them.
//!
//! # Calling it from a flush path
//!
//! ```
//! use shardfs::compact::{Compactor, CpuCompactor, Packed, ShardGrid, StagedBatch};
//! let grid = ShardGrid::new(vec![4, 4], vec![2, 2]);
//! let data = b"aaabbc";
//! let batch = StagedBatch {
//!     grid: &grid,
//!     coords: &[3, 3, 0, 1, 0, 0], // chunks (3,3), (0,1), (0,0)
//!     data,
//!     src_offsets: &[0, 3, 5],
//!     sizes: &[3, 2, 1],
//! };
//! let mut packed = Packed::default(); // reuse across flushes: keeps capacity
//! CpuCompactor::new().compact(&batch, &mut packed).unwrap();
//! assert_eq!(packed.data, b"cbbaaa");
//! for run in &packed.shards {
//!     let _bytes = packed.run_bytes(run); // append to shard file `run.shard_coords`
//!     for j in run.positions() {
//!         let (_slot, _offset_in_run, _len) = (
//!             packed.slots[j],
//!             packed.offsets[j] - packed.offsets[run.first],
//!             packed.chunk_len(j),
//!         );
//!     }
//! }
//! ```

mod auto;
mod cpu;
mod cpu_stream;
mod gpu;
mod gpu_buffers;
mod gpu_nvrtc;
mod gpu_probe;
mod host_copy;
mod plan;

#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests_cpu;
#[cfg(test)]
mod tests_gpu;
#[cfg(test)]
mod tests_kernel_emu;
#[cfg(test)]
mod tests_model;

use std::ops::Range;

pub use auto::AutoCompactor;
pub use cpu::CpuCompactor;
pub use gpu::{GpuCompactor, GpuPhaseTimes, GpuTransfer, GpuUnavailable, HostBuffer};

/// Chunk grid of one array as the compactor needs it, per dimension slowest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardGrid {
    /// Inner chunks along the array: `ceil(shape / inner_chunk_shape)`.
    pub chunk_counts: Vec<u64>,
    /// Inner chunks per shard (`shard_shape / inner_chunk_shape`); each must be ≥ 1.
    pub chunks_per_shard: Vec<u64>,
}

impl ShardGrid {
    pub fn new(chunk_counts: Vec<u64>, chunks_per_shard: Vec<u64>) -> Self {
        Self {
            chunk_counts,
            chunks_per_shard,
        }
    }

    /// Rank `D` (0 for a scalar array).
    pub fn rank(&self) -> usize {
        self.chunk_counts.len()
    }

    /// `ceil(chunk_counts[d] / chunks_per_shard[d])`; `None` if a `chunks_per_shard` is 0.
    pub fn shard_counts(&self) -> Option<Vec<u64>> {
        self.chunk_counts
            .iter()
            .zip(&self.chunks_per_shard)
            .map(|(&c, &p)| (p != 0).then(|| c.div_ceil(p)))
            .collect()
    }

    /// Whether batches of this grid can be compacted at all (its shard-major keys fit
    /// in 64 bits): checked when an array is created or resized, so that no chunk is
    /// ever staged that could never be stored.
    pub fn check(&self) -> Result<(), CompactError> {
        plan::check_grid(self)
    }
}

/// A batch of staged inner chunks of one array.
///
/// Chunk `i` has grid coordinates `coords[i*D..(i+1)*D]` and bytes
/// `data[src_offsets[i]..src_offsets[i]+sizes[i]]` (sizes may be 0, ranges may be in
/// any order and may overlap). Coordinates must be unique within a batch (the caller
/// deduplicates); a duplicate, an out-of-grid coordinate or inconsistent lengths are a
/// [`CompactError`], never a panic.
#[derive(Debug, Clone, Copy)]
pub struct StagedBatch<'a> {
    pub grid: &'a ShardGrid,
    pub coords: &'a [u64],
    pub data: &'a [u8],
    pub src_offsets: &'a [u64],
    pub sizes: &'a [u64],
}

impl StagedBatch<'_> {
    /// Number of staged chunks.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// Sum of the chunk sizes (saturating): what [`AutoCompactor`] estimates by.
    pub fn payload_bytes(&self) -> u64 {
        self.sizes.iter().fold(0u64, |a, &s| a.saturating_add(s))
    }
}

/// A batch that owns its buffers (the calibration's synthetic batches, the tests', the
/// benchmark's).
#[derive(Debug, Clone)]
pub struct OwnedBatch {
    pub grid: ShardGrid,
    pub coords: Vec<u64>,
    pub data: Vec<u8>,
    pub src_offsets: Vec<u64>,
    pub sizes: Vec<u64>,
}

impl OwnedBatch {
    pub fn view(&self) -> StagedBatch<'_> {
        StagedBatch {
            grid: &self.grid,
            coords: &self.coords,
            data: &self.data,
            src_offsets: &self.src_offsets,
            sizes: &self.sizes,
        }
    }

    /// Chunk `i`'s bytes, for each `i`.
    pub fn chunks(&self) -> Vec<&[u8]> {
        (0..self.sizes.len())
            .map(|i| {
                let from = self.src_offsets[i] as usize;
                &self.data[from..from + self.sizes[i] as usize]
            })
            .collect()
    }
}

/// The packed chunks of one shard: packed positions `first..end`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardRun {
    /// Shard grid coordinates (`s_d`), length `D`.
    pub shard_coords: Vec<u64>,
    pub first: usize,
    pub end: usize,
}

impl ShardRun {
    /// Packed positions of this shard's chunks.
    pub fn positions(&self) -> Range<usize> {
        self.first..self.end
    }
}

/// Compaction output. Reuse one across calls: every `Vec` keeps its capacity.
///
/// `order`, `slots` and `offsets[..n]` are indexed by packed position `j`.
#[derive(Debug, Clone, Default)]
pub struct Packed {
    /// All chunk bytes in shard-major order, densely packed.
    pub data: Vec<u8>,
    /// `order[j]` = index into the batch of the chunk at packed position `j`.
    pub order: Vec<u32>,
    /// Length `n + 1`: exclusive scan of the permuted sizes; `offsets[n]` = total bytes.
    pub offsets: Vec<u64>,
    /// `slots[j]` = row-major index of chunk `j` within its shard (its shard index entry).
    pub slots: Vec<u64>,
    /// One per shard touched, in shard-major order; runs tile `0..n`.
    pub shards: Vec<ShardRun>,
    /// Scratch for the permutation (keys, sort buffer), kept for its capacity.
    keys: Vec<u64>,
    sort_buf: Vec<u64>,
}

/// Equality of the output only (scratch capacity is not part of the value).
impl PartialEq for Packed {
    fn eq(&self, other: &Self) -> bool {
        self.data == other.data
            && self.order == other.order
            && self.offsets == other.offsets
            && self.slots == other.slots
            && self.shards == other.shards
    }
}

impl Eq for Packed {}

impl Packed {
    /// Number of packed chunks.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Bytes of the chunk at packed position `j`.
    pub fn chunk_bytes(&self, j: usize) -> &[u8] {
        &self.data[self.offsets[j] as usize..self.offsets[j + 1] as usize]
    }

    /// Size of the chunk at packed position `j`.
    pub fn chunk_len(&self, j: usize) -> u64 {
        self.offsets[j + 1] - self.offsets[j]
    }

    /// All bytes of one shard's run, ready to append to that shard file.
    pub fn run_bytes(&self, run: &ShardRun) -> &[u8] {
        &self.data[self.offsets[run.first] as usize..self.offsets[run.end] as usize]
    }
}

/// Why a batch could not be compacted. Input errors are detected before any output
/// is written; `out` is then left in an unspecified but valid state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompactError {
    #[error(
        "grid rank mismatch: {chunk_counts} chunk counts but {chunks_per_shard} chunks-per-shard"
    )]
    GridRankMismatch {
        chunk_counts: usize,
        chunks_per_shard: usize,
    },
    #[error("chunks_per_shard[{dim}] is 0")]
    ZeroChunksPerShard { dim: usize },
    #[error("chunk grid too large: shard-major keys do not fit in 64 bits")]
    GridTooLarge,
    #[error("{what} has length {got}, expected {expected}")]
    LengthMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("batch has {n} chunks, more than the u32 order table can index")]
    TooManyChunks { n: usize },
    #[error(
        "chunk {index}: coordinate {coord} along dim {dim} is outside the grid ({count} chunks)"
    )]
    ChunkOutOfGrid {
        index: usize,
        dim: usize,
        coord: u64,
        count: u64,
    },
    #[error("chunks {first} and {second} have the same coordinates")]
    DuplicateChunk { first: usize, second: usize },
    #[error("chunk {index}: bytes {offset}+{size} lie outside the {data_len}-byte staging buffer")]
    SourceOutOfBounds {
        index: usize,
        offset: u64,
        size: u64,
        data_len: usize,
    },
    #[error("batch payload of {total} bytes does not fit in memory")]
    PayloadTooLarge { total: u64 },
    #[error("GPU compaction failed during {stage}: {reason}")]
    Gpu { stage: &'static str, reason: String },
}

/// Packs staged chunks into shard-major order. Implementations produce identical
/// [`Packed`] values for the same batch.
pub trait Compactor: Send + Sync {
    /// `"cpu"`, `"gpu"` or `"auto"`.
    fn name(&self) -> &'static str;
    /// Replaces the contents of `out` with the packed batch.
    fn compact(&self, batch: &StagedBatch<'_>, out: &mut Packed) -> Result<(), CompactError>;
    /// Whether a caller about to write the chunks to files should pack a batch of
    /// `payload_bytes` with [`Compactor::pack_chunks`] (on a device, the GPU). When not,
    /// the host gather is one copy of every byte, which such a caller skips:
    /// [`plan_layout`], then a scatter write from the chunks' own buffers.
    fn packs_on_device(&self, payload_bytes: u64) -> bool;

    /// Packs chunks given as separate slices (chunk `i` at grid coordinates
    /// `coords[i*D..]`): `out` gets the layout, the returned bytes the packed data
    /// (`out.data` may be left empty). The default concatenates and calls `compact`;
    /// the GPU packs from and into mapped page-locked memory.
    fn pack_chunks<'a>(
        &'a self,
        grid: &ShardGrid,
        coords: &[u64],
        chunks: &[&[u8]],
        out: &mut Packed,
    ) -> Result<PackedBytes<'a>, CompactError> {
        pack_by_compact(self, grid, coords, chunks, out)
    }

    /// Makes room ahead of time for batches of up to `payload_bytes` (the GPU's mapped
    /// page-locked buffers), so that the first large flush does not pay for pinning
    /// memory. Blocks while it allocates; the default does nothing.
    fn reserve(&self, _payload_bytes: u64) {}

    /// What a flush took to lay out `bytes` of payload, packed on the device or only
    /// planned on the host, told once the flush's shards are written: [`AutoCompactor`]
    /// learns its choice from it.
    fn observe_flush(&self, _on_device: bool, _bytes: u64, _elapsed: std::time::Duration) {}

    /// For `shardfs stats`: what this compactor knows of its own speed (the device,
    /// its calibration, the estimates it decides by); `None` for a fixed choice.
    fn describe(&self) -> Option<serde_json::Value> {
        None
    }
}

/// Everything [`Compactor::compact`] produces but the packed bytes: `order`, `offsets`,
/// `slots` and `shards` of `out` for chunks given by grid coordinates and sizes (as in
/// [`StagedBatch`]), with `out.data` left empty. The chunk at packed position `j` is
/// the caller's chunk `order[j]`; it would start at byte `offsets[j]` of the packed
/// bytes. Same validation and errors as `compact`, less the source-range checks.
pub fn plan_layout(
    grid: &ShardGrid,
    coords: &[u64],
    sizes: &[u64],
    out: &mut Packed,
) -> Result<(), CompactError> {
    plan::plan_layout(grid, coords, sizes, out)
}

/// What [`Compactor::pack_chunks`] hands back: the packed bytes, in ordinary memory
/// or in the GPU compactor's mapped result buffer (the compactor stays locked while
/// they are held).
pub struct PackedBytes<'a>(Bytes<'a>);

enum Bytes<'a> {
    Owned(Vec<u8>),
    Pinned(parking_lot::MappedMutexGuard<'a, [u8]>),
}

impl<'a> PackedBytes<'a> {
    pub(crate) fn pinned(guard: parking_lot::MappedMutexGuard<'a, [u8]>) -> Self {
        Self(Bytes::Pinned(guard))
    }

    /// Whether the bytes sit in page-locked memory of the GPU compactor.
    pub fn is_pinned(&self) -> bool {
        matches!(self.0, Bytes::Pinned(_))
    }
}

impl std::ops::Deref for PackedBytes<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Bytes::Owned(v) => v,
            Bytes::Pinned(g) => g,
        }
    }
}

/// [`Compactor::pack_chunks`] by concatenating the chunks and calling `compact`.
pub(crate) fn pack_by_compact<'a>(
    c: &(impl Compactor + ?Sized),
    grid: &ShardGrid,
    coords: &[u64],
    chunks: &[&[u8]],
    out: &mut Packed,
) -> Result<PackedBytes<'a>, CompactError> {
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    let mut data = Vec::with_capacity(total);
    let mut src_offsets = Vec::with_capacity(chunks.len());
    let mut sizes = Vec::with_capacity(chunks.len());
    for c in chunks {
        src_offsets.push(data.len() as u64);
        sizes.push(c.len() as u64);
        data.extend_from_slice(c);
    }
    let batch = StagedBatch {
        grid,
        coords,
        data: &data,
        src_offsets: &src_offsets,
        sizes: &sizes,
    };
    c.compact(&batch, out)?;
    Ok(PackedBytes(Bytes::Owned(std::mem::take(&mut out.data))))
}
