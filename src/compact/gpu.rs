//! GPU compaction with `cudarc`: the three aggregate-by-shard kernels of
//! `gpu_kernel.cu`, compiled by NVRTC at start-up, fed through pinned host buffers.
//!
//! Owns the device lifecycle (probe, context, stream, module), the copy schedule and
//! the kernel launches. The permutation, shard runs and slots come from
//! [`super::plan`] on the host, exactly as for the CPU, so the output is byte-identical.
//!
//! Per call, on one stream:
//! 1. metadata (`src_offsets`, `sizes`, `P`) and then the whole `data` slice are copied
//!    into pinned staging in [`PIECE_BYTES`] pieces, each piece's H2D copy queued as soon
//!    as it is staged (host memcpy overlaps DMA);
//! 2. `permute_sizes`, `exclusive_scan`, `gather_chunks`;
//! 3. offsets and packed bytes come back D2H in pieces into pinned result memory, an
//!    event after each, and the host copies each piece out as soon as its event fires.
//!
//! A missing or broken driver is [`GpuUnavailable`] from [`GpuCompactor::new`]; a device
//! error (or a `cudarc` panic) during a call is [`CompactError::Gpu`].

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaStream, DevicePtr, DriverError, LaunchConfig, PushKernelArg, sys,
};
use parking_lot::Mutex;

mod transfer;

use super::gpu_buffers::{DeviceBuf, PinnedBuf};
use super::gpu_nvrtc::{Kernels, load_kernels};
use super::gpu_probe::{self, driver_error_text};
use super::{CompactError, Compactor, Packed, StagedBatch, plan};

/// Host↔device copies are issued in pieces of this size so the host's memcpy into
/// (out of) pinned memory overlaps the DMA of the previous (next) piece.
const PIECE_BYTES: usize = 4 << 20;

/// The gather splits a chunk's body over several blocks once it exceeds this, so a
/// few huge chunks still spread over the SMs.
const GATHER_SPLIT_BYTES: u64 = 256 << 10;

/// `data` sits this many bytes into the device source buffer, which has as many spare
/// bytes after it: the gather's aligned loads reach up to 3 bytes before a chunk and
/// 4 after it.
const SRC_PAD: usize = 16;

const GATHER_THREADS: u32 = 256;
const PERMUTE_THREADS: u32 = 256;
/// Must match SCAN_THREADS in gpu_kernel.cu.
const SCAN_THREADS: u32 = 1024;

/// Why no GPU compactor could be created (no driver, no NVRTC, no device, compile
/// failure, ...). Callers fall back to the CPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no usable GPU: {0}")]
pub struct GpuUnavailable(pub String);

/// Wall time of one profiled call's phases (see [`GpuCompactor::compact_profiled`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuPhaseTimes {
    /// Host permutation, staging and H2D, until the stream drained.
    pub upload: Duration,
    /// The three kernels alone (stream synchronised before and after).
    pub kernels: Duration,
    /// D2H and the copy out of pinned memory.
    pub download: Duration,
}

/// Compacts on a CUDA device. All calls are serialised by one lock around the
/// stream and the reused buffers.
pub struct GpuCompactor {
    state: Mutex<GpuState>,
    device: String,
}

struct GpuState {
    /// The device's name, read during (panic-guarded) initialisation.
    device: String,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    staging: PinnedBuf,
    result: PinnedBuf,
    d_meta: DeviceBuf,
    d_src: DeviceBuf,
    d_scan: DeviceBuf,
    d_dst: DeviceBuf,
    /// One blocking-sync event per download piece, created on demand and kept.
    events: Vec<CudaEvent>,
    /// `perm[i]` = packed position of batch chunk `i` (the seed's `P`).
    perm: Vec<u32>,
    /// Set when a call panicked inside `cudarc`: the stream state is unknown.
    broken: Option<String>,
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".to_owned()
    }
}

/// Maps a driver error to the stage it happened in.
fn at(stage: &'static str) -> impl FnOnce(DriverError) -> CompactError {
    move |e| CompactError::Gpu {
        stage,
        reason: driver_error_text(&e),
    }
}

impl GpuCompactor {
    /// Cheap probe: the driver and NVRTC libraries load and report at least one device.
    /// Does not create a context or compile anything.
    pub fn available() -> Result<(), String> {
        gpu_probe::probe_libraries()?;
        match catch_unwind(CudaContext::device_count) {
            Ok(Ok(n)) if n > 0 => Ok(()),
            Ok(Ok(_)) => Err("the CUDA driver reports no device".to_owned()),
            Ok(Err(e)) => Err(format!(
                "CUDA driver initialisation failed: {}",
                driver_error_text(&e)
            )),
            Err(p) => Err(format!(
                "CUDA driver probe panicked: {}",
                panic_message(&*p)
            )),
        }
    }

    /// Brings up device 0: context, stream, kernels (NVRTC). Never panics: a missing
    /// or broken driver, NVRTC or device is `Err(GpuUnavailable(reason))`.
    pub fn new() -> Result<Self, GpuUnavailable> {
        Self::available().map_err(GpuUnavailable)?;
        let state = match catch_unwind(GpuState::init) {
            Ok(Ok(state)) => state,
            Ok(Err(reason)) => return Err(GpuUnavailable(reason)),
            Err(p) => {
                let why = panic_message(&*p);
                return Err(GpuUnavailable(format!(
                    "CUDA initialisation panicked: {why}"
                )));
            }
        };
        let device = state.device.clone();
        log::info!("GPU compactor ready on {device}");
        Ok(Self {
            state: Mutex::new(state),
            device,
        })
    }

    /// The device's name, for logs and benchmark output.
    pub fn device_name(&self) -> &str {
        &self.device
    }

    /// [`Compactor::compact`], additionally timing the phases. The stream is drained
    /// before and after the kernels, so this is slightly slower than `compact`.
    pub fn compact_profiled(
        &self,
        batch: &StagedBatch<'_>,
        out: &mut Packed,
    ) -> Result<GpuPhaseTimes, CompactError> {
        self.run(batch, out, true)
    }

    fn run(
        &self,
        batch: &StagedBatch<'_>,
        out: &mut Packed,
        profile: bool,
    ) -> Result<GpuPhaseTimes, CompactError> {
        let mut state = self.state.lock();
        if let Some(why) = &state.broken {
            return Err(CompactError::Gpu {
                stage: "earlier failure",
                reason: why.clone(),
            });
        }
        let result = catch_unwind(AssertUnwindSafe(|| state.compact(batch, out, profile)));
        match result {
            Ok(Err(CompactError::Gpu { stage, reason })) => {
                // Drain whatever was queued before the buffers are reused; if even that
                // fails the context is gone (sticky error) and stays unusable.
                if let Err(e) = state.stream.synchronize() {
                    let e = driver_error_text(&e);
                    state.broken = Some(format!("{stage}: {reason}; then {e}"));
                }
                Err(CompactError::Gpu { stage, reason })
            }
            Ok(done) => done,
            Err(p) => {
                let why = format!("cudarc panicked: {}", panic_message(&*p));
                state.broken = Some(why.clone());
                Err(CompactError::Gpu {
                    stage: "panic",
                    reason: why,
                })
            }
        }
    }
}

impl Compactor for GpuCompactor {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn packs_on_device(&self, _payload_bytes: u64) -> bool {
        true
    }

    fn compact(&self, batch: &StagedBatch<'_>, out: &mut Packed) -> Result<(), CompactError> {
        self.run(batch, out, false).map(|_| ())
    }
}

impl GpuState {
    fn init() -> Result<Self, String> {
        let text = |what: &str, e: DriverError| format!("{what}: {}", driver_error_text(&e));
        let ctx = CudaContext::new(0).map_err(|e| text("cannot open CUDA device 0", e))?;
        // SAFETY: every buffer of this compactor is used on the one stream created below,
        // and each call synchronises that stream before returning, so no cross-stream
        // hazard exists for event tracking to guard against.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| text("cannot create a CUDA stream", e))?;
        let kernels = load_kernels(&ctx)?;
        let device = ctx
            .name()
            .unwrap_or_else(|e| format!("device 0 ({})", driver_error_text(&e)));
        Ok(Self {
            device,
            ctx,
            stream,
            kernels,
            staging: PinnedBuf::default(),
            result: PinnedBuf::default(),
            d_meta: DeviceBuf::default(),
            d_src: DeviceBuf::default(),
            d_scan: DeviceBuf::default(),
            d_dst: DeviceBuf::default(),
            events: Vec::new(),
            perm: Vec::new(),
            broken: None,
        })
    }

    fn compact(
        &mut self,
        batch: &StagedBatch<'_>,
        out: &mut Packed,
        profile: bool,
    ) -> Result<GpuPhaseTimes, CompactError> {
        let start = Instant::now();
        let total = plan::plan(batch, out)?;
        let n = out.order.len();
        self.perm.clear();
        self.perm.resize(n, 0);
        for (j, &i) in out.order.iter().enumerate() {
            self.perm[i as usize] = j as u32;
        }
        if n == 0 {
            out.offsets.clear();
            out.offsets.push(0);
            out.data.clear();
            return Ok(GpuPhaseTimes::default());
        }
        self.ctx.bind_to_thread().map_err(at("bind context"))?;
        let layout = Layout::new(n, batch.data.len(), total);
        self.upload(batch, &layout)?;
        let mut times = GpuPhaseTimes::default();
        if profile {
            self.stream.synchronize().map_err(at("upload"))?;
            times.upload = start.elapsed();
        }
        let kernels_start = Instant::now();
        self.launch(batch, &layout)?;
        if profile {
            self.stream.synchronize().map_err(at("kernels"))?;
            times.kernels = kernels_start.elapsed();
        }
        let download_start = Instant::now();
        self.download(&layout, out)?;
        times.download = download_start.elapsed();
        Ok(times)
    }
}

/// Byte layout of one call's buffers, computed once.
struct Layout {
    n: usize,
    data_len: usize,
    total: usize,
    /// In `d_meta` and staging: src_offsets at 0, sizes at `sizes_at`, perm at `perm_at`.
    sizes_at: usize,
    perm_at: usize,
    /// Metadata bytes, rounded up to 16; the data follows in staging.
    meta_len: usize,
    /// In `d_scan`: psizes at 0, offsets (n + 1) at `offsets_at`.
    offsets_at: usize,
    /// In the result buffer: offsets at 0, packed data at `result_data_at`.
    result_data_at: usize,
}

impl Layout {
    /// Bytes of the device source buffer: `data` with `SRC_PAD` on both sides.
    fn src_len(&self) -> usize {
        self.data_len + 2 * SRC_PAD
    }

    fn new(n: usize, data_len: usize, total: u64) -> Self {
        let sizes_at = n * 8;
        let perm_at = 2 * n * 8;
        let meta_len = (perm_at + n * 4).next_multiple_of(16);
        let offsets_len = (n + 1) * 8;
        Self {
            n,
            data_len,
            total: total as usize, // `plan` checked total <= isize::MAX
            sizes_at,
            perm_at,
            meta_len,
            offsets_at: n * 8,
            result_data_at: offsets_len.next_multiple_of(16),
        }
    }
}

/// A device pointer `offset` bytes into `buf`, as a kernel argument.
fn dev_addr(buf: &cudarc::driver::CudaSlice<u8>, stream: &CudaStream, offset: usize) -> u64 {
    let (base, _no_tracking) = buf.device_ptr(stream);
    base + offset as u64
}

/// Grid for the gather: one block row per chunk (x), the largest chunk's body split
/// over y blocks, bounded so the grid stays a few million blocks.
pub(crate) fn gather_grid(n: usize, sizes: &[u64]) -> LaunchConfig {
    let x = n.min(1 << 30) as u32;
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let want_y = largest.div_ceil(GATHER_SPLIT_BYTES).clamp(1, 1024) as u32;
    let y = want_y.min(((1u32 << 22) / x).max(1));
    LaunchConfig {
        grid_dim: (x, y, 1),
        block_dim: (GATHER_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Blocking-sync events: waiting on one yields the CPU instead of spinning.
fn new_event(ctx: &Arc<CudaContext>) -> Result<CudaEvent, DriverError> {
    ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
}

impl GpuState {
    /// Pass 1–3 on the stream, after the upload.
    fn launch(&mut self, batch: &StagedBatch<'_>, layout: &Layout) -> Result<(), CompactError> {
        let n = layout.n;
        let n32 = n as u32; // `plan` checked n <= u32::MAX
        let stream = &self.stream;
        let d_scan = self
            .d_scan
            .ensure(stream, layout.offsets_at + (n + 1) * 8)
            .map_err(at("device alloc"))?;
        let psizes = dev_addr(d_scan, stream, 0);
        let offsets = dev_addr(d_scan, stream, layout.offsets_at);
        let d_meta = self
            .d_meta
            .ensure(stream, layout.meta_len)
            .map_err(at("device alloc"))?;
        let src_offsets = dev_addr(d_meta, stream, 0);
        let sizes = dev_addr(d_meta, stream, layout.sizes_at);
        let perm = dev_addr(d_meta, stream, layout.perm_at);
        let src = self
            .d_src
            .ensure(stream, layout.src_len())
            .map(|b| dev_addr(b, stream, SRC_PAD))
            .map_err(at("device alloc"))?;
        let dst = self
            .d_dst
            .ensure(stream, layout.total)
            .map(|b| dev_addr(b, stream, 0))
            .map_err(at("device alloc"))?;

        let permute_cfg = LaunchConfig {
            grid_dim: (n32.div_ceil(PERMUTE_THREADS).min(65_535), 1, 1),
            block_dim: (PERMUTE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types and order match `permute_sizes` in gpu_kernel.cu; the
        // three pointers address n u64 / n u32 / n u64 elements of live buffers on this
        // stream (sized by `Layout`), and `perm` is a permutation of 0..n, so every
        // write lands inside `psizes`.
        unsafe {
            stream
                .launch_builder(&self.kernels.permute)
                .arg(&sizes)
                .arg(&perm)
                .arg(&psizes)
                .arg(&n32)
                .launch(permute_cfg)
        }
        .map_err(at("permute_sizes"))?;

        let scan_cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (SCAN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `exclusive_scan(psizes, offsets, n)`; `psizes` holds n u64 and
        // `offsets` n + 1 u64 in `d_scan`; launched with exactly SCAN_THREADS threads as
        // the kernel requires.
        unsafe {
            stream
                .launch_builder(&self.kernels.scan)
                .arg(&psizes)
                .arg(&offsets)
                .arg(&n32)
                .launch(scan_cfg)
        }
        .map_err(at("exclusive_scan"))?;

        // SAFETY: matches `gather_chunks(src, src_offsets, sizes, perm, offsets, dst, n)`.
        // `plan` checked every src range lies in `data` (uploaded to `src`, with SRC_PAD
        // bytes either side for the kernel's aligned over-read), and the scanned offsets place chunk
        // i at offsets[perm[i]] .. + sizes[i] <= total bytes of `dst`.
        unsafe {
            stream
                .launch_builder(&self.kernels.gather)
                .arg(&src)
                .arg(&src_offsets)
                .arg(&sizes)
                .arg(&perm)
                .arg(&offsets)
                .arg(&dst)
                .arg(&n32)
                .launch(gather_grid(n, batch.sizes))
        }
        .map_err(at("gather_chunks"))?;
        Ok(())
    }
}
