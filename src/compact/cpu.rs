//! CPU compaction: the baseline every other [`Compactor`] must match byte for byte.
//!
//! Owns the size scan and the gather on the host. The permutation comes from
//! [`super::plan`]. Large batches can be gathered by several scoped threads, each
//! writing a disjoint byte range of the output (split at chunk boundaries), and with
//! non-temporal stores once the output outgrows the caches (`cpu_stream`).

use std::mem::MaybeUninit;
use std::ops::Range;

use super::cpu_stream::{copy_streaming, fence};
use super::{CompactError, Compactor, Packed, StagedBatch, plan};

/// Below this many payload bytes a single thread gathers (spawning costs more).
const PARALLEL_MIN_BYTES: u64 = 4 << 20;

/// Default gather threads (capped by the core count): on the 2-core reference machine
/// two threads nearly double large gathers (benches/compact.rs).
const DEFAULT_THREADS: usize = 2;

/// From this payload size on the gather uses non-temporal stores (the packed output
/// will not stay in cache anyway; streaming skips the write-allocate reads).
const DEFAULT_STREAM_MIN_BYTES: u64 = 32 << 20;

/// Compacts on the host with memcpy-class copies.
#[derive(Debug, Clone)]
pub struct CpuCompactor {
    threads: usize,
    stream_min_bytes: u64,
}

impl CpuCompactor {
    /// The tuned defaults: up to two gather threads, streaming stores from 32 MiB.
    pub fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_threads(cores.min(DEFAULT_THREADS))
    }

    /// `threads` gather threads for batches of 4 MiB and more (`0` is taken as 1).
    pub fn with_threads(threads: usize) -> Self {
        Self {
            threads: threads.max(1),
            stream_min_bytes: DEFAULT_STREAM_MIN_BYTES,
        }
    }

    /// Use non-temporal stores for batches of at least `bytes` payload
    /// (`u64::MAX`: never).
    pub fn streaming_from(self, bytes: u64) -> Self {
        Self {
            stream_min_bytes: bytes,
            ..self
        }
    }
}

impl Default for CpuCompactor {
    fn default() -> Self {
        Self::new()
    }
}

impl Compactor for CpuCompactor {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn packs_on_device(&self, _payload_bytes: u64) -> bool {
        false
    }

    fn compact(&self, batch: &StagedBatch<'_>, out: &mut Packed) -> Result<(), CompactError> {
        let total = plan::plan(batch, out)?;
        plan::scan_sizes(batch.sizes, &out.order, &mut out.offsets);
        debug_assert_eq!(out.offsets.last().copied(), Some(total));
        let gather = Gather {
            batch,
            order: &out.order,
            offsets: &out.offsets,
            streaming: total >= self.stream_min_bytes,
        };
        gather.run(&mut out.data, self.threads);
        Ok(())
    }
}

/// One gather: every packed position `j` gets chunk `order[j]`'s bytes at `offsets[j]`.
#[derive(Clone, Copy)]
struct Gather<'a> {
    batch: &'a StagedBatch<'a>,
    order: &'a [u32],
    offsets: &'a [u64],
    streaming: bool,
}

impl Gather<'_> {
    /// Replaces `data` with the packed bytes, using up to `threads` threads.
    fn run(self, data: &mut Vec<u8>, threads: usize) {
        let n = self.order.len();
        let total = self.offsets[n];
        let total_len = total as usize; // `plan` checked total <= isize::MAX
        data.clear();
        data.reserve(total_len);
        let dst = &mut data.spare_capacity_mut()[..total_len];
        if threads <= 1 || total < PARALLEL_MIN_BYTES {
            self.copy_positions(0..n, dst);
        } else {
            std::thread::scope(|scope| {
                let mut rest = dst;
                let mut first = 0usize;
                for t in 1..=threads {
                    // Split at the first chunk starting at or after t/threads of the bytes.
                    let end = if t == threads {
                        n
                    } else {
                        let cut = total / threads as u64 * t as u64;
                        self.offsets[..n].partition_point(|&o| o < cut).max(first)
                    };
                    let bytes = (self.offsets[end] - self.offsets[first]) as usize;
                    let (mine, tail) = rest.split_at_mut(bytes);
                    rest = tail;
                    if t == threads {
                        self.copy_positions(first..end, mine);
                    } else {
                        scope.spawn(move || self.copy_positions(first..end, mine));
                    }
                    first = end;
                }
            });
        }
        // SAFETY: `offsets` is the exclusive scan of the sizes of all `n` packed chunks,
        // so the ranges `offsets[j]..offsets[j+1]` tile `0..total` exactly, and
        // `copy_positions` initialised each of them (all threads have joined above,
        // each after fencing its streaming stores).
        unsafe { data.set_len(total_len) };
    }

    /// Copies packed positions `range` into `dst`, which starts at `offsets[range.start]`.
    fn copy_positions(self, range: Range<usize>, dst: &mut [MaybeUninit<u8>]) {
        let base = self.offsets[range.start];
        for j in range {
            let i = self.order[j] as usize;
            let src = self.batch.src_offsets[i] as usize;
            let len = self.batch.sizes[i] as usize;
            let at = (self.offsets[j] - base) as usize;
            let (to, from) = (&mut dst[at..at + len], &self.batch.data[src..src + len]);
            if self.streaming {
                copy_streaming(to, from);
            } else {
                to.write_copy_of_slice(from);
            }
        }
        if self.streaming {
            fence();
        }
    }
}
