//! CPU compaction: the baseline every other [`Compactor`] must match byte for byte.
//!
//! Owns the size scan and the gather on the host. The permutation comes from
//! [`super::plan`]. Large batches are gathered by scoped threads, one per 4 MiB up to
//! every core of the machine, each writing a disjoint byte range of the output (split
//! at chunk boundaries, `host_copy`), and with non-temporal stores once the output
//! outgrows the caches (`cpu_stream`).

use std::mem::MaybeUninit;
use std::ops::Range;

use super::cpu_stream::{copy_streaming, fence};
use super::{CompactError, Compactor, Packed, StagedBatch, host_copy, plan};

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
    /// The tuned defaults: up to one gather thread per core (one per 4 MiB of the
    /// batch), streaming stores from 32 MiB.
    pub fn new() -> Self {
        Self::with_threads(host_copy::cores())
    }

    /// At most `threads` gather threads, one per 4 MiB of a batch (`0` is taken as 1).
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
        let threads = host_copy::threads_for(total, threads);
        if threads <= 1 {
            self.copy_positions(0..n, dst);
        } else {
            host_copy::for_each_run(dst, self.offsets, threads, |run, part| {
                self.copy_positions(run, part)
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
