//! GPU compaction with `cudarc`: the three aggregate-by-shard kernels of
//! `gpu_kernel.cu`, compiled by NVRTC at start-up.
//!
//! Owns the device lifecycle (probe, context, stream, module), the transfers and the
//! kernel launches. The permutation, shard runs and slots come from [`super::plan`] on
//! the host, exactly as for the CPU, so the output is byte-identical.
//!
//! Two ways to move the bytes ([`GpuTransfer`]):
//!
//! * **Mapped** (the default): the batch sits in page-locked host memory mapped into
//!   the device ([`HostBuffer`]), and the gather kernel reads it and writes the packed
//!   result into another mapped host buffer, across PCIe in both directions at once.
//!   No device copy of the data exists, so host-to-device traffic, the gather and
//!   device-to-host traffic overlap by construction, and the host only plans,
//!   launches and waits (on a blocking-sync event, so it sleeps). A caller that stages
//!   its chunks in a [`HostBuffer`] ([`GpuCompactor::compact_host`]) or hands them over
//!   as slices ([`Compactor::pack_chunks`], one parallel copy into mapped memory) and
//!   writes from the result copies nothing else; [`Compactor::compact`] from and to
//!   ordinary memory adds one parallel copy in and one out.
//! * **Copy**: the data is copied into device memory in [`PIECE_BYTES`] pieces
//!   through pinned staging, gathered there and copied back: the first design, kept
//!   for comparison (`benches/compact.rs` prints both).
//!
//! A missing or broken driver is [`GpuUnavailable`] from [`GpuCompactor::new`]; a device
//! error (or a `cudarc` panic) during a call is [`CompactError::Gpu`].
//!
//! This file owns the compactor and its state's lifecycle and call flow; the buffers'
//! byte layout is `layout`, the copies `transfer`, the kernel launches `launch`.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, sys};
use parking_lot::{Mutex, MutexGuard};

pub(super) mod launch;
mod layout;
mod transfer;

pub use super::gpu_buffers::HostBuffer;
use super::gpu_buffers::{DeviceBuf, MappedBuf, PinnedBuf};
use super::gpu_nvrtc::{Kernels, load_kernels};
use super::gpu_probe::{self, driver_error_text};
use super::{
    CompactError, Compactor, Packed, PackedBytes, ShardGrid, StagedBatch, host_copy, plan,
};
use layout::Layout;

/// Host↔device copies are issued in pieces of this size so the host's memcpy into
/// (out of) pinned memory overlaps the DMA of the previous (next) piece.
const PIECE_BYTES: usize = 4 << 20;

/// Why no GPU compactor could be created (no driver, no NVRTC, no device, compile
/// failure, ...). Callers fall back to the CPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no usable GPU: {0}")]
pub struct GpuUnavailable(pub String);

/// How a [`GpuCompactor`] moves a batch's bytes (see the module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuTransfer {
    /// The device gathers straight from and into mapped page-locked host memory.
    #[default]
    Mapped,
    /// Copies into device memory and back, in pieces, through pinned staging.
    Copy,
}

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
    transfer: GpuTransfer,
}

struct GpuState {
    transfer: GpuTransfer,
    /// Mapped host buffers for batches handed over in ordinary memory.
    mapped_in: MappedBuf,
    mapped_out: MappedBuf,
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

    /// Brings up device 0: context, stream, kernels (NVRTC), with mapped transfers.
    /// Never panics: a missing or broken driver, NVRTC or device is
    /// `Err(GpuUnavailable(reason))`.
    pub fn new() -> Result<Self, GpuUnavailable> {
        Self::with_transfer(GpuTransfer::Mapped)
    }

    /// [`GpuCompactor::new`] with the given way of moving the bytes.
    pub fn with_transfer(transfer: GpuTransfer) -> Result<Self, GpuUnavailable> {
        Self::available().map_err(GpuUnavailable)?;
        let state = match catch_unwind(|| GpuState::init(transfer)) {
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
            transfer,
        })
    }

    /// How this compactor moves the bytes.
    pub fn transfer(&self) -> GpuTransfer {
        self.transfer
    }

    /// `len` bytes of page-locked host memory mapped into this compactor's device,
    /// zeroed: stage a batch here and [`GpuCompactor::compact_host`] packs it without a
    /// host copy; or pass it as the result buffer.
    pub fn host_buffer(&self, len: usize) -> Result<HostBuffer, CompactError> {
        let state = self.state.lock();
        catch_unwind(AssertUnwindSafe(|| HostBuffer::alloc(&state.ctx, len)))
            .map_err(|p| CompactError::Gpu {
                stage: "pinned alloc",
                reason: format!("cudarc panicked: {}", panic_message(&*p)),
            })?
            .map_err(at("pinned alloc"))
    }

    /// Packs `batch`, whose `data` must lie inside `input`, into `result` (grown when
    /// too small): `out` gets everything but the bytes (`out.data` is left empty), and
    /// `result[..out.offsets[n]]` the packed bytes. The device reads `input` and writes
    /// `result` in place: no host copy, whatever [`GpuTransfer`] this compactor uses.
    pub fn compact_host(
        &self,
        batch: &StagedBatch<'_>,
        input: &HostBuffer,
        out: &mut Packed,
        result: &mut HostBuffer,
    ) -> Result<(), CompactError> {
        let Some(at_input) = input.offset_of(batch.data) else {
            return Err(CompactError::Gpu {
                stage: "arguments",
                reason: "the batch's data does not lie in the input HostBuffer".to_owned(),
            });
        };
        let src = input.device_addr() + at_input as u64;
        let (_state, done) = self.locked(|state| state.compact_mapped(batch, src, result, out));
        done
    }

    /// Runs `f` on the state under the lock, turning a `cudarc` panic into an error
    /// and a failed call into a drained stream (or a broken compactor). Returns the
    /// lock with the result, for callers that hand out the state's buffers.
    fn locked<R>(
        &self,
        f: impl FnOnce(&mut GpuState) -> Result<R, CompactError>,
    ) -> (MutexGuard<'_, GpuState>, Result<R, CompactError>) {
        let mut state = self.state.lock();
        if let Some(why) = &state.broken {
            let err = CompactError::Gpu {
                stage: "earlier failure",
                reason: why.clone(),
            };
            return (state, Err(err));
        }
        let result = catch_unwind(AssertUnwindSafe(|| f(&mut state)));
        let result = match result {
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
        };
        (state, result)
    }

    /// Gives back the page-locked and device buffers (they are made again when a
    /// batch needs them): for a compactor that measured slower and sits unused.
    pub fn release_buffers(&self) {
        let mut state = self.state.lock();
        if let Err(e) = state.stream.synchronize() {
            log::warn!("GPU compactor: {}", driver_error_text(&e));
        }
        state.mapped_in = MappedBuf::default();
        state.mapped_out = MappedBuf::default();
        state.staging = PinnedBuf::default();
        state.result = PinnedBuf::default();
        state.d_meta = DeviceBuf::default();
        state.d_src = DeviceBuf::default();
        state.d_scan = DeviceBuf::default();
        state.d_dst = DeviceBuf::default();
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
        self.locked(|state| state.compact(batch, out, profile)).1
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

    /// Mapped transfers: allocates (and pins) the mapped input and result buffers for
    /// batches of `payload_bytes` now. A failure is logged; the buffers then grow at
    /// the first batch that needs them.
    fn reserve(&self, payload_bytes: u64) {
        if self.transfer != GpuTransfer::Mapped {
            return;
        }
        // Pinned memory cannot be swapped: both buffers together take at most a quarter
        // of the machine's memory; larger batches grow them when they come.
        let cap = host_copy::physical_memory().map_or(u64::MAX, |m| m / 8);
        if payload_bytes > cap {
            log::info!(
                "GPU compactor: reserving {} MiB per buffer, not {} (an eighth of the memory)",
                cap >> 20,
                payload_bytes >> 20
            );
        }
        let len = usize::try_from(payload_bytes.min(cap)).unwrap_or(usize::MAX);
        let started = Instant::now();
        let (_state, done) = self.locked(|state| {
            let ctx = state.ctx.clone();
            state
                .mapped_in
                .ensure(&ctx, len)
                .map_err(at("pinned alloc"))?;
            if let Err(e) = state.mapped_out.ensure(&ctx, len) {
                // Half a reservation only holds memory: give it back.
                state.mapped_in = MappedBuf::default();
                return Err(at("pinned alloc")(e));
            }
            Ok(())
        });
        match done {
            Ok(()) => log::info!(
                "GPU compactor: 2 × {} MiB of mapped page-locked memory in {:.2} s",
                len >> 20,
                started.elapsed().as_secs_f64()
            ),
            Err(e) => log::warn!("GPU compactor: cannot reserve {} MiB: {e}", len >> 20),
        }
    }

    /// Mapped transfers: the chunks are copied (in parallel) into the compactor's
    /// mapped input buffer, packed by the device into its mapped result buffer, and
    /// handed out from there; the compactor stays locked while the bytes are held.
    fn pack_chunks<'a>(
        &'a self,
        grid: &ShardGrid,
        coords: &[u64],
        chunks: &[&[u8]],
        out: &mut Packed,
    ) -> Result<PackedBytes<'a>, CompactError> {
        if self.transfer == GpuTransfer::Copy {
            return super::pack_by_compact(self, grid, coords, chunks, out);
        }
        let mut starts = Vec::with_capacity(chunks.len() + 1);
        starts.push(0u64);
        let mut sizes = Vec::with_capacity(chunks.len());
        for c in chunks {
            sizes.push(c.len() as u64);
            starts.push(starts[starts.len() - 1] + c.len() as u64);
        }
        let total = starts[chunks.len()] as usize;
        let (state, done) = self.locked(|state| {
            state.with_mapped(total, total, |state, input, output| {
                host_copy::copy_pieces(input, &starts, chunks, host_copy::cores());
                let batch = StagedBatch {
                    grid,
                    coords,
                    data: &input[..total],
                    src_offsets: &starts[..chunks.len()],
                    sizes: &sizes,
                };
                state.compact_mapped(&batch, input.device_addr(), output, out)
            })
        });
        done?;
        let bytes = MutexGuard::map(state, |s| match s.mapped_out.get_mut() {
            Some(buf) => &mut buf[..total],
            None => &mut [],
        });
        Ok(PackedBytes::pinned(bytes))
    }
}

impl GpuState {
    fn init(transfer: GpuTransfer) -> Result<Self, String> {
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
            transfer,
            mapped_in: MappedBuf::default(),
            mapped_out: MappedBuf::default(),
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

    /// Plans `batch` into `out` and sets `self.perm`; `None` when the batch is empty
    /// (then `out` is complete), else the layout of the call's buffers.
    fn prepare(
        &mut self,
        batch: &StagedBatch<'_>,
        out: &mut Packed,
    ) -> Result<Option<Layout>, CompactError> {
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
            return Ok(None);
        }
        self.ctx.bind_to_thread().map_err(at("bind context"))?;
        Ok(Some(Layout::new(n, batch.data.len(), total)))
    }

    /// From ordinary memory to `out.data`, with this compactor's transfer.
    fn compact(
        &mut self,
        batch: &StagedBatch<'_>,
        out: &mut Packed,
        profile: bool,
    ) -> Result<GpuPhaseTimes, CompactError> {
        let start = Instant::now();
        let Some(layout) = self.prepare(batch, out)? else {
            return Ok(GpuPhaseTimes::default());
        };
        let mut times = GpuPhaseTimes::default();
        if self.transfer == GpuTransfer::Mapped {
            return self.with_mapped(layout.data_len, layout.total, |state, input, output| {
                host_copy::copy(
                    &mut input[..layout.data_len],
                    batch.data,
                    host_copy::cores(),
                );
                times.upload = start.elapsed();
                let kernels_start = Instant::now();
                let (src, dst) = (input.device_addr(), output.device_addr());
                state.gather_mapped(batch, &layout, src, dst, out)?;
                times.kernels = kernels_start.elapsed();
                let download_start = Instant::now();
                // Reuse `out.data`'s length where it has one: no zero-fill to overwrite.
                out.data.truncate(layout.total);
                out.data.resize(layout.total, 0);
                host_copy::copy(&mut out.data, &output[..layout.total], host_copy::cores());
                times.download = download_start.elapsed();
                Ok(times)
            });
        }
        self.upload(batch, &layout)?;
        if profile {
            self.stream.synchronize().map_err(at("upload"))?;
            times.upload = start.elapsed();
        }
        let kernels_start = Instant::now();
        self.launch(batch, &layout, None, None)?;
        if profile {
            self.stream.synchronize().map_err(at("kernels"))?;
            times.kernels = kernels_start.elapsed();
        }
        let download_start = Instant::now();
        self.download(&layout, out)?;
        times.download = download_start.elapsed();
        Ok(times)
    }

    /// Runs `f` with the mapped input and result buffers, grown to `input_len` and
    /// `output_len` bytes. They are out of the state meanwhile (so `f` may use the
    /// state too) and put back after, also when `f` fails.
    fn with_mapped<R>(
        &mut self,
        input_len: usize,
        output_len: usize,
        f: impl FnOnce(&mut Self, &mut HostBuffer, &mut HostBuffer) -> Result<R, CompactError>,
    ) -> Result<R, CompactError> {
        let ctx = self.ctx.clone();
        let mut input = std::mem::take(&mut self.mapped_in);
        let mut output = std::mem::take(&mut self.mapped_out);
        let done = (|| {
            let inb = input.ensure(&ctx, input_len).map_err(at("pinned alloc"))?;
            let outb = output
                .ensure(&ctx, output_len)
                .map_err(at("pinned alloc"))?;
            f(self, inb, outb)
        })();
        self.mapped_in = input;
        self.mapped_out = output;
        done
    }

    /// Packs `batch`, whose data the device reads at `src` (mapped host memory), into
    /// `result`; `out` gets everything but the bytes.
    fn compact_mapped(
        &mut self,
        batch: &StagedBatch<'_>,
        src: u64,
        result: &mut HostBuffer,
        out: &mut Packed,
    ) -> Result<(), CompactError> {
        let layout = self.prepare(batch, out)?;
        out.data.clear();
        let Some(layout) = layout else {
            return Ok(());
        };
        result.grow(layout.total).map_err(at("pinned alloc"))?;
        self.gather_mapped(batch, &layout, src, result.device_addr(), out)
    }

    /// The kernels from mapped memory at `src` into mapped memory at `dst`; returns
    /// once the device is done, with `out.offsets` read back.
    fn gather_mapped(
        &mut self,
        batch: &StagedBatch<'_>,
        layout: &Layout,
        src: u64,
        dst: u64,
        out: &mut Packed,
    ) -> Result<(), CompactError> {
        self.upload_meta(batch, layout)?;
        self.launch(batch, layout, Some(src), Some(dst))?;
        self.download_offsets(layout, out)
    }
}

/// Blocking-sync events: waiting on one yields the CPU instead of spinning.
fn new_event(ctx: &Arc<CudaContext>) -> Result<CudaEvent, DriverError> {
    ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
}
