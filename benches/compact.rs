//! Compaction benchmark: CPU vs GPU on the same batches, printed as markdown tables.
//!
//! For batch payloads of 1, 4, 16, 64, 256 MiB and 1 GiB (capped by `--max-mib N` or
//! `SHARDFS_BENCH_MAX_MIB`; 256 MiB by default on machines with < 32 GiB RAM), builds
//! one batch of 64 KiB–1 MiB chunks (odd sizes, so nothing is 16-byte aligned) staged
//! contiguously in random order on a 3-D grid with edge shards, then compacts it
//! repeatedly. Reports per size the median host-to-host throughput and host CPU
//! seconds per GiB (getrusage user+sys over all threads) of:
//!
//! * the CPU gather on every core, and on one thread;
//! * the GPU with the batch staged in mapped page-locked memory and the result written
//!   into mapped memory (`GpuCompactor::compact_host`: no host copy; issue 18's goal);
//! * the GPU from and to ordinary memory (`compact`, mapped transfers: one parallel
//!   copy in, one out), and with copy transfers (the first design) and its kernels alone;
//! * the flush's two ways: planning the layout only (the host path, whose writes gather
//!   from the staged buffers) and the GPU's `pack_chunks` (parallel copy into mapped
//!   memory, gather into mapped memory);
//!
//! then what `AutoCompactor` measured at its calibration and picks for each size.
//!
//! Run: `cargo bench --bench compact -- [--max-mib N] [--reps N]`

use std::time::{Duration, Instant};

use shardfs::compact::{
    AutoCompactor, Compactor, CpuCompactor, GpuCompactor, GpuTransfer, HostBuffer, OwnedBatch,
    Packed, ShardGrid, StagedBatch, plan_layout,
};

const MIB: u64 = 1 << 20;
const GIB: f64 = (1u64 << 30) as f64;
const SIZES_MIB: [u64; 6] = [1, 4, 16, 64, 256, 1024];

/// SplitMix64, so every run benchmarks the same batches.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// `payload` bytes in 64 KiB–1 MiB chunks of a 30×30×30 grid (4×4×4 per shard, so
/// the last shard along each dim is an edge shard), staged in random order.
fn batch(payload: u64, seed: u64) -> OwnedBatch {
    let mut rng = Rng(seed);
    let grid = ShardGrid::new(vec![30, 30, 30], vec![4, 4, 4]);
    let mut sizes = Vec::new();
    let mut left = payload;
    while left > 0 {
        let s = rng.range(64 << 10, MIB).min(left);
        sizes.push(s);
        left -= s;
    }
    let mut cells: Vec<u64> = (0..27_000).collect();
    for i in (1..cells.len()).rev() {
        cells.swap(i, rng.range(0, i as u64) as usize);
    }
    let coords = cells[..sizes.len()]
        .iter()
        .flat_map(|&c| [c / 900, c / 30 % 30, c % 30])
        .collect();
    let mut src_offsets = Vec::with_capacity(sizes.len());
    let mut at = 0;
    for s in &sizes {
        src_offsets.push(at);
        at += s;
    }
    let mut data = vec![0u8; at as usize];
    for (i, word) in data.chunks_mut(8).enumerate() {
        let v = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes();
        word.copy_from_slice(&v[..word.len()]);
    }
    OwnedBatch {
        grid,
        coords,
        data,
        src_offsets,
        sizes,
    }
}

/// User + system CPU time of this process (all threads).
fn cpu_time() -> Duration {
    // SAFETY: `rusage` is plain old data, so all-zero is a valid value to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF is a valid `who`, and `ru` is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Median wall time per call and host CPU seconds per call over `reps` calls.
struct Measured {
    wall: Duration,
    cpu: Duration,
}

fn measure(reps: usize, mut call: impl FnMut()) -> Measured {
    call(); // warm-up: grows the reused buffers
    let cpu0 = cpu_time();
    let walls = (0..reps)
        .map(|_| {
            let t = Instant::now();
            call();
            t.elapsed()
        })
        .collect();
    Measured {
        wall: median(walls),
        cpu: (cpu_time() - cpu0) / reps as u32,
    }
}

fn gib_per_s(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / GIB / t.as_secs_f64()
}

fn cpu_s_per_gib(bytes: u64, cpu: Duration) -> f64 {
    cpu.as_secs_f64() / (bytes as f64 / GIB)
}

fn mem_total_gib() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: f64 = info
        .lines()
        .find(|l| l.starts_with("MemTotal:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / (1 << 20) as f64)
}

struct Args {
    max_mib: u64,
    reps: Option<usize>,
}

fn parse_args() -> Args {
    let mut max_mib = std::env::var("SHARDFS_BENCH_MAX_MIB")
        .ok()
        .and_then(|v| v.parse().ok());
    let mut reps = None;
    // `cargo test --all-targets` runs this program without `--bench`: a smoke run (1 MiB,
    // 2 repetitions) that checks it still works, not a measurement.
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "smoke run (no --bench): 1 MiB batches only; use `cargo bench --bench compact` to measure"
        );
        max_mib = max_mib.or(Some(1));
        reps = Some(2);
    }
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--max-mib" => max_mib = args.next().and_then(|v| v.parse().ok()),
            "--reps" => reps = args.next().and_then(|v| v.parse().ok()),
            _ => {} // cargo bench passes `--bench`
        }
    }
    let ram = mem_total_gib();
    let max_mib = max_mib.unwrap_or_else(|| match ram {
        Some(gib) if gib < 32.0 => {
            println!(
                "note: {gib:.0} GiB RAM < 32 GiB, capping batches at 256 MiB \
                 (override: --max-mib N or SHARDFS_BENCH_MAX_MIB)"
            );
            256
        }
        _ => 1024,
    });
    Args { max_mib, reps }
}

/// `value` against a goal, for the tables.
fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn main() {
    let args = parse_args();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = CpuCompactor::new();
    let cpu1 = CpuCompactor::with_threads(1);
    let gpus = gpus();
    println!(
        "host: {cores} cores, {:.1} GiB RAM; CpuCompactor::new() gathers with up to {cores} threads \
         (one per 4 MiB)\n",
        mem_total_gib().unwrap_or(0.0),
    );
    println!(
        "| batch | chunks | CPU GiB/s | CPU 1-thread GiB/s | CPU host s/GiB \
         | GPU host buffers GiB/s | its host s/GiB | GPU compact() GiB/s \
         | GPU copy transfers GiB/s | their kernels GiB/s | GPU host buffers / CPU |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut want = Packed::default();
    let mut got = Packed::default();
    let mut flush_rows = Vec::new();
    let mut goal_rows = Vec::new();
    let mut buffers: Option<(HostBuffer, HostBuffer)> = None;
    for mib in SIZES_MIB.into_iter().filter(|&m| m <= args.max_mib) {
        let bytes = mib * MIB;
        let batch = batch(bytes, mib);
        let view = batch.view();
        let reps = args.reps.unwrap_or((4096 / mib).clamp(5, 30) as usize);
        let run = |c: &dyn Compactor, out: &mut Packed| {
            c.compact(&view, out).expect("benchmark batch is valid")
        };
        let m_cpu = measure(reps, || run(&cpu, &mut want));
        let m_cpu1 = measure(reps, || run(&cpu1, &mut got));
        let cpu_rate = gib_per_s(bytes, m_cpu.wall);
        let mut row = format!(
            "| {mib} MiB | {} | {cpu_rate:.2} | {:.2} | {:.3} |",
            batch.sizes.len(),
            gib_per_s(bytes, m_cpu1.wall),
            cpu_s_per_gib(bytes, m_cpu.cpu),
        );
        if cores >= 16 && mib >= 256 {
            goal_rows.push(format!(
                "| {mib} MiB | CPU gather on {cores} cores ≥ 25 GiB/s | {cpu_rate:.2} | {} |",
                verdict(cpu_rate >= 25.0)
            ));
        }
        let m_plan = measure(reps, || {
            plan_layout(view.grid, view.coords, view.sizes, &mut got).expect("valid")
        });
        match &gpus {
            Some((gpu, copy)) => {
                let cols = gpu_columns(
                    gpu,
                    copy,
                    &mut buffers,
                    (&batch, mib),
                    reps,
                    (&mut want, &mut got),
                );
                row += &cols.cells(bytes, cpu_rate);
                if mib >= 256 {
                    goal_rows.extend(cols.goals(bytes, mib));
                }
                flush_rows.push(cols.flush_row(bytes, mib, &m_plan));
            }
            None => {
                row += " – | – | – | – | – | – |";
                flush_rows.push(format!(
                    "| {mib} MiB | {:.1} | – | – |",
                    m_plan.wall.as_secs_f64() * 1e6
                ));
            }
        }
        println!("{row}");
    }
    print_flush_and_goals(&flush_rows, &goal_rows);
    drop(buffers);
    print_auto_calibration(&args, &mut got);
}

/// The GPU compactors (mapped and copy transfers), `None` (and why, printed) without a
/// GPU.
fn gpus() -> Option<(GpuCompactor, GpuCompactor)> {
    match (
        GpuCompactor::new(),
        GpuCompactor::with_transfer(GpuTransfer::Copy),
    ) {
        (Ok(mapped), Ok(copy)) => {
            println!("GPU: {}", mapped.device_name());
            Some((mapped, copy))
        }
        (Err(why), _) | (_, Err(why)) => {
            println!("GPU columns absent: {why}");
            None
        }
    }
}

/// The GPU's columns of one batch's row, measured: `compact_host` from mapped buffers
/// (kept in `buffers` for the next batch), `compact`, `compact` with copy transfers and
/// its kernels alone, and `pack_chunks` (a flush's way). Outputs that differ from the
/// CPU's (`want`) are printed.
struct GpuColumns {
    host: Measured,
    compact: Measured,
    copy: Measured,
    kernels: Duration,
    pack: Measured,
}

impl GpuColumns {
    /// The row's GPU cells, for a batch of `bytes` whose CPU gather ran at `cpu_rate`.
    fn cells(&self, bytes: u64, cpu_rate: f64) -> String {
        let host_rate = gib_per_s(bytes, self.host.wall);
        format!(
            " {host_rate:.2} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} |",
            cpu_s_per_gib(bytes, self.host.cpu),
            gib_per_s(bytes, self.compact.wall),
            gib_per_s(bytes, self.copy.wall),
            gib_per_s(bytes, self.kernels),
            host_rate / cpu_rate,
        )
    }

    /// The GPU goals' rows (issue 18) for a batch of `mib`.
    fn goals(&self, bytes: u64, mib: u64) -> [String; 2] {
        let host_rate = gib_per_s(bytes, self.host.wall);
        let host_cpu = cpu_s_per_gib(bytes, self.host.cpu);
        [
            format!(
                "| {mib} MiB | GPU host-to-host ≥ 30 GiB/s | {host_rate:.2} | {} |",
                verdict(host_rate >= 30.0)
            ),
            format!(
                "| {mib} MiB | GPU host CPU ≤ 0.05 s/GiB | {host_cpu:.3} | {} |",
                verdict(host_cpu <= 0.05)
            ),
        ]
    }

    /// The flush table's row: the host's plan against the GPU's pack.
    fn flush_row(&self, bytes: u64, mib: u64, plan: &Measured) -> String {
        format!(
            "| {mib} MiB | {:.1} | {:.2} | {:.3} |",
            plan.wall.as_secs_f64() * 1e6,
            self.pack.wall.as_secs_f64() * 1e3,
            cpu_s_per_gib(bytes, self.pack.cpu),
        )
    }
}

fn gpu_columns(
    gpu: &GpuCompactor,
    copy: &GpuCompactor,
    buffers: &mut Option<(HostBuffer, HostBuffer)>,
    (batch, mib): (&OwnedBatch, u64),
    reps: usize,
    (want, got): (&mut Packed, &mut Packed),
) -> GpuColumns {
    let view = batch.view();
    let run = |c: &dyn Compactor, out: &mut Packed| {
        c.compact(&view, out).expect("benchmark batch is valid")
    };
    // The batch staged in mapped memory, once, as a mount's staging would.
    let (mut input, mut result) = match buffers.take() {
        Some((i, r)) if i.len() >= batch.data.len() => (i, r),
        old => {
            drop(old);
            let i = gpu.host_buffer(batch.data.len()).expect("pinned memory");
            let r = gpu.host_buffer(batch.data.len()).expect("pinned memory");
            (i, r)
        }
    };
    input[..batch.data.len()].copy_from_slice(&batch.data);
    let staged = StagedBatch {
        data: &input[..batch.data.len()],
        ..view
    };
    let host = measure(reps, || {
        gpu.compact_host(&staged, &input, got, &mut result)
            .expect("valid")
    });
    if result[..want.data.len()] != want.data[..] || got.offsets != want.offsets {
        println!("!! GPU (host buffers) output differs from CPU output at {mib} MiB");
    }
    *buffers = Some((input, result));
    let compact = measure(reps, || run(gpu, got));
    if got != want {
        println!("!! GPU output differs from CPU output at {mib} MiB");
    }
    let copied = measure(reps, || run(copy, got));
    if got != want {
        println!("!! GPU (copy transfers) output differs from CPU output at {mib} MiB");
    }
    let kernels = median(
        (0..reps)
            .map(|_| copy.compact_profiled(&view, got).expect("valid").kernels)
            .collect(),
    );
    let chunks = batch.chunks();
    let pack = measure(reps, || {
        drop(
            gpu.pack_chunks(view.grid, view.coords, &chunks, got)
                .expect("valid"),
        )
    });
    GpuColumns {
        host,
        compact,
        copy: copied,
        kernels,
        pack,
    }
}

/// The flush's table (host plan against GPU pack) and the goals' verdicts.
fn print_flush_and_goals(flush_rows: &[String], goal_rows: &[String]) {
    println!(
        "\nA flush's two ways: the host plans the layout only and the shard \
         writes gather from the staged buffers; the GPU packs into mapped memory and the \
         writes read from there. Both then write the same bytes.\n"
    );
    println!("| batch | host plan µs | GPU pack_chunks ms | GPU pack host s/GiB |");
    println!("|---:|---:|---:|---:|");
    for r in flush_rows {
        println!("{r}");
    }
    if !goal_rows.is_empty() {
        println!("\nGoals (issue 18):\n");
        println!("| batch | goal | measured | verdict |");
        println!("|---:|---|---:|---|");
        for r in goal_rows {
            println!("{r}");
        }
    } else {
        println!(
            "\nGoals (issue 18) need batches of 256 MiB and more, a GPU for the GPU goals \
             and 16 cores for the CPU one: none applies here."
        );
    }
}

/// Which way the calibrated `AutoCompactor` takes for each batch size.
fn print_auto_calibration(args: &Args, got: &mut Packed) {
    let auto = AutoCompactor::calibrated();
    match auto.describe() {
        Some(d) if !d["estimates"].is_null() => {
            println!("\nAutoCompactor calibration: {d}\n");
            println!("| batch | compact() picks | a flush picks |");
            println!("|---:|---|---|");
            for mib in SIZES_MIB.into_iter().filter(|&m| m <= args.max_mib) {
                let batch = batch(mib * MIB, mib);
                let picks = |gpu: bool| if gpu { "GPU" } else { "CPU" };
                // Which way `compact` takes shows in the estimate it refines.
                let before = auto.describe().expect("auto");
                auto.compact(&batch.view(), got).expect("valid");
                let after = auto.describe().expect("auto");
                let on_gpu = after["estimates"]["gpu_compact"]["batches"]
                    != before["estimates"]["gpu_compact"]["batches"];
                println!(
                    "| {mib} MiB | {} | {} |",
                    picks(on_gpu),
                    picks(auto.packs_on_device(mib * MIB))
                );
            }
        }
        d => println!("\nAutoCompactor: {d:?} (no GPU: everything on the CPU)"),
    }
}
