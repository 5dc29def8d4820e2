//! [`AutoCompactor`]: the CPU or the GPU per batch, whichever measured faster.
//!
//! Owns the choice and the measurements it rests on. Each way of laying out a batch
//! has an [`Estimate`] (seconds = fixed + bytes × per-byte): the CPU gather and the
//! GPU's `compact` for [`Compactor::compact`]; for a flush ([`Compactor::packs_on_device`]),
//! the host path that only plans the layout (the shard writes then gather from the
//! staged buffers) against the GPU's `pack_chunks`. The estimates come from a
//! calibration on synthetic batches of 1 and 32 MiB, run on a thread of its own, at
//! the lowest CPU priority, once the first batch of at least [`CONSIDER_BYTES`] is done
//! (for a flush: once its shards are written, [`Compactor::observe_flush`]; so a
//! read-only mount, or one that never flushes much, never brings up the GPU, and the
//! calibration never competes with the batch that started it: a calibration overlapping
//! a 1 GiB flush made that flush 7 % slower on an H200, and one overlapping its shard
//! writes 10 % on an H100), and every
//! batch run afterwards refines the estimate of the way it took. Until the calibration
//! is done, and on a machine without a usable GPU, everything goes to the CPU.

use std::sync::{Arc, Once, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{
    CompactError, Compactor, CpuCompactor, GpuCompactor, OwnedBatch, Packed, PackedBytes,
    ShardGrid, StagedBatch, pack_by_compact, plan_layout,
};

/// Batches below this many payload bytes always stay on the CPU (a GPU call's fixed
/// cost alone is tens of microseconds), and do not start the calibration.
pub const CONSIDER_BYTES: u64 = 1 << 20;

/// Batches below this size do not refine an estimate's per-byte cost (their time is
/// mostly the fixed part).
const REFINE_MIN_BYTES: u64 = 4 << 20;

/// Weight of a new batch in an estimate's per-byte cost.
const REFINE_WEIGHT: f64 = 0.25;

const CALIBRATION_BYTES: [u64; 2] = [1 << 20, 32 << 20];
const CALIBRATION_CHUNK: u64 = 64 << 10;

/// Time to lay out a batch as a linear function of its payload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub fixed_s: f64,
    pub s_per_byte: f64,
    /// Batches measured since the calibration.
    pub batches: u64,
}

impl Estimate {
    /// The line through two measurements (`b1 < b2`); a slope of at least 1 ps per
    /// byte and a fixed part of at least 0, so noise never makes a way look free.
    pub fn from_two(b1: u64, t1: Duration, b2: u64, t2: Duration) -> Self {
        let (t1, t2) = (t1.as_secs_f64(), t2.as_secs_f64());
        let s_per_byte = ((t2 - t1) / (b2 - b1) as f64).max(1e-12);
        let fixed_s = (t1 - b1 as f64 * s_per_byte).max(0.0);
        Self {
            fixed_s,
            s_per_byte,
            batches: 0,
        }
    }

    pub fn seconds(&self, bytes: u64) -> f64 {
        self.fixed_s + bytes as f64 * self.s_per_byte
    }

    /// Folds one measured batch into the per-byte cost.
    pub fn refine(&mut self, bytes: u64, took: Duration) {
        self.batches += 1;
        if bytes < REFINE_MIN_BYTES {
            return;
        }
        let per_byte = ((took.as_secs_f64() - self.fixed_s) / bytes as f64).max(1e-12);
        self.s_per_byte += REFINE_WEIGHT * (per_byte - self.s_per_byte);
    }

    fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "fixed_us": (self.fixed_s * 1e6 * 10.0).round() / 10.0,
            "gib_per_s": (1.0 / self.s_per_byte / (1u64 << 30) as f64 * 100.0).round() / 100.0,
            "batches": self.batches,
        })
    }
}

/// The four ways, measured.
#[derive(Debug, Clone, Copy)]
struct Estimates {
    cpu_gather: Estimate,
    gpu_compact: Estimate,
    host_plan: Estimate,
    gpu_pack: Estimate,
}

/// One of the four ways.
#[derive(Debug, Clone, Copy)]
enum Way {
    CpuGather,
    GpuCompact,
    HostPlan,
    GpuPack,
}

impl Estimates {
    fn way_mut(&mut self, way: Way) -> &mut Estimate {
        match way {
            Way::CpuGather => &mut self.cpu_gather,
            Way::GpuCompact => &mut self.gpu_compact,
            Way::HostPlan => &mut self.host_plan,
            Way::GpuPack => &mut self.gpu_pack,
        }
    }
}

struct Inner {
    cpu: CpuCompactor,
    /// The GPU, once the calibration thread tried to bring it up.
    gpu: OnceLock<Result<GpuCompactor, String>>,
    /// `None` until calibrated (or for good without a GPU).
    estimates: Mutex<Option<Estimates>>,
    calibration: Once,
}

/// Picks the CPU or the GPU per batch from measured speeds (see the module header);
/// CPU only when no GPU could be brought up, and CPU again for a batch whose GPU run
/// hit a device error ([`CompactError::Gpu`]).
pub struct AutoCompactor {
    inner: Arc<Inner>,
}

impl AutoCompactor {
    /// Calibrates lazily, on a thread of its own, when a large batch first asks.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                cpu: CpuCompactor::new(),
                gpu: OnceLock::new(),
                estimates: Mutex::new(None),
                calibration: Once::new(),
            }),
        }
    }

    /// Brings up the GPU and calibrates now, on this thread (benchmarks, tests).
    pub fn calibrated() -> Self {
        let auto = Self::new();
        let inner = auto.inner.clone();
        auto.inner.calibration.call_once(|| inner.calibrate());
        auto
    }

    /// Whether a GPU was brought up (false before the calibration ran).
    pub fn has_gpu(&self) -> bool {
        self.gpu().is_some()
    }

    fn gpu(&self) -> Option<&GpuCompactor> {
        self.inner.gpu.get()?.as_ref().ok()
    }

    /// The estimates, once calibrated with a GPU, for a batch large enough to be
    /// worth asking.
    fn estimates(&self, bytes: u64) -> Option<Estimates> {
        if bytes < CONSIDER_BYTES {
            return None;
        }
        *self.inner.estimates.lock()
    }

    /// After a batch of `bytes`: folds its time into the way it took, or, the first
    /// time a large batch is done, starts the calibration.
    fn after_batch(&self, bytes: u64, way: Way, took: Duration) {
        if bytes < CONSIDER_BYTES {
            return;
        }
        if let Some(e) = self.inner.estimates.lock().as_mut() {
            e.way_mut(way).refine(bytes, took);
            return;
        }
        let inner = self.inner.clone();
        self.inner.calibration.call_once(|| {
            let spawned = std::thread::Builder::new()
                .name("shardfs-calibrate".to_owned())
                .spawn({
                    let inner = inner.clone();
                    move || {
                        lowest_priority();
                        inner.calibrate()
                    }
                });
            if let Err(e) = spawned {
                log::warn!("cannot start the compactor calibration ({e}): CPU only");
            }
        });
    }
}

impl Default for AutoCompactor {
    fn default() -> Self {
        Self::new()
    }
}

/// Gives the calling thread the lowest CPU priority (nice 19), so that a calibration
/// yields to the mount's own work.
fn lowest_priority() {
    // SAFETY: gettid has no preconditions; setpriority with PRIO_PROCESS and a thread
    // id changes only that thread's nice value on Linux. Failure just keeps the default.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}

/// Median wall time of `reps` calls after one warm-up call.
fn timed(reps: usize, mut call: impl FnMut() -> Result<(), CompactError>) -> Option<Duration> {
    call().ok()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        call().ok()?;
        times.push(t.elapsed());
    }
    times.sort();
    Some(times[reps / 2])
}

/// A synthetic batch of `bytes` in 64 KiB chunks, staged in a scrambled order.
fn synthetic(bytes: u64) -> OwnedBatch {
    let n = bytes.div_ceil(CALIBRATION_CHUNK);
    OwnedBatch {
        grid: ShardGrid::new(vec![16, 16, 16], vec![4, 4, 4]),
        // An odd multiplier modulo 4096 is a permutation of the cells.
        coords: (0..n)
            .map(|i| (i * 2_654_435_761) % 4096)
            .flat_map(|c| [c / 256, c / 16 % 16, c % 16])
            .collect(),
        data: (0..n * CALIBRATION_CHUNK)
            .map(|i| (i * 7 + 3) as u8)
            .collect(),
        src_offsets: (0..n).map(|i| i * CALIBRATION_CHUNK).collect(),
        sizes: vec![CALIBRATION_CHUNK; n as usize],
    }
}

impl Inner {
    fn calibrate(&self) {
        let gpu = self.gpu.get_or_init(|| {
            GpuCompactor::new().map_err(|why| {
                log::info!("compaction on CPU only: {why}");
                why.0
            })
        });
        let Ok(gpu) = gpu else { return };
        let started = Instant::now();
        let mut points = Vec::new();
        for bytes in CALIBRATION_BYTES {
            let batch = synthetic(bytes);
            let view = batch.view();
            let chunks = batch.chunks();
            let mut out = Packed::default();
            let measured = (|| {
                Some([
                    timed(3, || self.cpu.compact(&view, &mut out))?,
                    timed(3, || gpu.compact(&view, &mut out))?,
                    timed(3, || {
                        plan_layout(view.grid, view.coords, view.sizes, &mut out)
                    })?,
                    timed(3, || {
                        gpu.pack_chunks(view.grid, view.coords, &chunks, &mut out)
                            .map(drop)
                    })?,
                ])
            })();
            match measured {
                Some(times) => points.push((bytes, times)),
                None => {
                    log::warn!("compactor calibration failed on the GPU: CPU only");
                    return;
                }
            }
        }
        let [(b1, t1), (b2, t2)] = [points[0], points[1]];
        let line = |k: usize| Estimate::from_two(b1, t1[k], b2, t2[k]);
        let estimates = Estimates {
            cpu_gather: line(0),
            gpu_compact: line(1),
            host_plan: line(2),
            gpu_pack: line(3),
        };
        log::info!(
            "compactor calibration on {} in {:.0} ms: {estimates:?}",
            gpu.device_name(),
            started.elapsed().as_secs_f64() * 1e3
        );
        // The GPU's pinned buffers are made again if a batch ever goes its way; until
        // then a mount should not hold them.
        gpu.release_buffers();
        *self.estimates.lock() = Some(estimates);
    }
}

impl Compactor for AutoCompactor {
    fn name(&self) -> &'static str {
        "auto"
    }

    fn packs_on_device(&self, payload_bytes: u64) -> bool {
        self.estimates(payload_bytes)
            .is_some_and(|e| e.gpu_pack.seconds(payload_bytes) < e.host_plan.seconds(payload_bytes))
    }

    fn compact(&self, batch: &StagedBatch<'_>, out: &mut Packed) -> Result<(), CompactError> {
        let bytes = batch.payload_bytes();
        let on_gpu = self
            .estimates(bytes)
            .is_some_and(|e| e.gpu_compact.seconds(bytes) < e.cpu_gather.seconds(bytes));
        let started = Instant::now();
        if on_gpu && let Some(gpu) = self.gpu() {
            match gpu.compact(batch, out) {
                Err(CompactError::Gpu { stage, reason }) => {
                    // A device fault must not fail the flush: the CPU gives the same bytes.
                    log::warn!("GPU compaction failed during {stage} ({reason}); using CPU");
                }
                done => {
                    if done.is_ok() {
                        self.after_batch(bytes, Way::GpuCompact, started.elapsed());
                    }
                    return done;
                }
            }
        }
        let started = Instant::now();
        let done = self.inner.cpu.compact(batch, out);
        if done.is_ok() {
            self.after_batch(bytes, Way::CpuGather, started.elapsed());
        }
        done
    }

    fn pack_chunks<'a>(
        &'a self,
        grid: &ShardGrid,
        coords: &[u64],
        chunks: &[&[u8]],
        out: &mut Packed,
    ) -> Result<PackedBytes<'a>, CompactError> {
        if let Some(gpu) = self.gpu() {
            match gpu.pack_chunks(grid, coords, chunks, out) {
                Err(CompactError::Gpu { stage, reason }) => {
                    log::warn!("GPU compaction failed during {stage} ({reason}); using CPU");
                }
                done => return done,
            }
        }
        pack_by_compact(&self.inner.cpu, grid, coords, chunks, out)
    }

    fn observe_flush(&self, on_device: bool, bytes: u64, elapsed: Duration) {
        let way = if on_device {
            Way::GpuPack
        } else {
            Way::HostPlan
        };
        self.after_batch(bytes, way, elapsed);
    }

    fn describe(&self) -> Option<serde_json::Value> {
        let gpu = match self.inner.gpu.get() {
            None => serde_json::Value::from("not brought up (no batch of 1 MiB or more done yet)"),
            Some(Ok(gpu)) => gpu.device_name().into(),
            Some(Err(why)) => format!("unusable: {why}").into(),
        };
        let estimates = match *self.inner.estimates.lock() {
            None => serde_json::Value::Null,
            Some(e) => serde_json::json!({
                "cpu_gather": e.cpu_gather.to_json(),
                "gpu_compact": e.gpu_compact.to_json(),
                "flush_host_plan": e.host_plan.to_json(),
                "flush_gpu_pack": e.gpu_pack.to_json(),
            }),
        };
        Some(serde_json::json!({ "gpu": gpu, "estimates": estimates }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1e3)
    }

    #[test]
    fn an_estimate_is_the_line_through_its_two_points_and_never_free() {
        let e = Estimate::from_two(1 << 20, ms(0.15), 33 << 20, ms(3.35));
        assert!((e.s_per_byte * (1u64 << 20) as f64 - 1e-4).abs() < 1e-9);
        assert!((e.fixed_s - 5e-5).abs() < 1e-9);
        assert!((e.seconds(65 << 20) - 6.55e-3).abs() < 1e-9);
        // Noise: the big batch measured faster than the small one.
        let e = Estimate::from_two(1 << 20, ms(2.0), 33 << 20, ms(1.0));
        assert!(e.s_per_byte > 0.0 && e.fixed_s >= 0.0);
    }

    #[test]
    fn refining_moves_the_per_byte_cost_towards_what_batches_take() {
        let mut e = Estimate::from_two(1 << 20, ms(0.1), 33 << 20, ms(3.3));
        let before = e.s_per_byte;
        for _ in 0..40 {
            e.refine(64 << 20, ms(64.0)); // 1 ms per MiB: ten times slower
        }
        assert!(e.s_per_byte > 9.0 * before, "{} vs {before}", e.s_per_byte);
        let settled = e.s_per_byte;
        e.refine(1 << 20, ms(500.0)); // small batches do not move it
        assert_eq!(e.s_per_byte, settled);
        assert_eq!(e.batches, 41);
    }

    #[test]
    fn the_choice_follows_the_estimates() {
        let auto = AutoCompactor::new();
        // Pretend a calibration ran (no GPU is needed to test the rule).
        auto.inner.calibration.call_once(|| {});
        let slow = Estimate::from_two(1 << 20, ms(1.0), 33 << 20, ms(33.0));
        let fast = Estimate::from_two(1 << 20, ms(0.1), 33 << 20, ms(3.3));
        *auto.inner.estimates.lock() = Some(Estimates {
            cpu_gather: slow,
            gpu_compact: fast,
            host_plan: fast,
            gpu_pack: slow,
        });
        assert!(
            !auto.packs_on_device(64 << 20),
            "the host plan measured faster"
        );
        assert!(
            !auto.packs_on_device(1000),
            "small batches never go to the device"
        );
        auto.observe_flush(false, 64 << 20, ms(6400.0)); // the host way got very slow
        for _ in 0..20 {
            auto.observe_flush(false, 64 << 20, ms(6400.0));
        }
        assert!(auto.packs_on_device(64 << 20), "now the device is faster");
        let d = auto.describe().unwrap();
        assert!(d["estimates"]["flush_host_plan"]["batches"] == 21, "{d}");
    }

    #[test]
    fn without_a_calibration_everything_stays_on_the_cpu() {
        let auto = AutoCompactor::new();
        auto.inner.calibration.call_once(|| {}); // never calibrates
        assert!(!auto.packs_on_device(1 << 30));
        let d = auto.describe().unwrap();
        assert!(d["estimates"].is_null(), "{d}");
    }
}
