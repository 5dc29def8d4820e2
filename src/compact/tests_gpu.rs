//! GPU tests. Without a usable GPU they check that bring-up fails cleanly and print
//! `SKIPPED: no usable GPU: <reason>`; with one they demand byte identity with the CPU.

use std::panic::catch_unwind;

use super::gpu_nvrtc::{compile_cubin, compile_ptx};
use super::gpu_probe::{probe_libraries, probe_library};
use super::testkit::{
    OwnedBatch, Rng, Scenario, alignment_matrix_batch, assert_same, random_batch,
};
use super::{
    Compactor, CpuCompactor, GpuCompactor, GpuTransfer, GpuUnavailable, Packed, ShardGrid,
    StagedBatch,
};

fn gpu_or_skip(test: &str) -> Option<GpuCompactor> {
    gpu_with_or_skip(test, GpuTransfer::Mapped)
}

fn gpu_with_or_skip(test: &str, transfer: GpuTransfer) -> Option<GpuCompactor> {
    match GpuCompactor::with_transfer(transfer) {
        Ok(gpu) => Some(gpu),
        Err(GpuUnavailable(reason)) => {
            eprintln!("{test}: SKIPPED: no usable GPU: {reason}");
            None
        }
    }
}

/// Every batch shape of the identity tests, through the paths that do not go by
/// `Compactor::compact`: a batch staged in a mapped `HostBuffer` (`compact_host`, at an
/// odd offset into it) and a batch handed over as slices (`pack_chunks`).
fn assert_host_paths_match_cpu(gpu: &GpuCompactor, b: &OwnedBatch, what: &str) {
    let mut want = Packed::default();
    CpuCompactor::new().compact(&b.view(), &mut want).unwrap();
    let at = 5;
    let mut input = gpu.host_buffer(b.data.len() + at).unwrap();
    input[at..].copy_from_slice(&b.data);
    let mut result = gpu.host_buffer(1).unwrap(); // grown by the call
    let mut out = Packed::default();
    let batch = StagedBatch {
        data: &input[at..],
        ..b.view()
    };
    gpu.compact_host(&batch, &input, &mut out, &mut result)
        .unwrap_or_else(|e| panic!("{what}: compact_host: {e}"));
    let total = want.data.len();
    out.data = result[..total].to_vec();
    assert_same(&out, &want, &format!("{what} (compact_host)"));

    let chunks = b.chunks();
    let mut out = Packed::default();
    let bytes = gpu
        .pack_chunks(&b.grid, &b.coords, &chunks, &mut out)
        .unwrap_or_else(|e| panic!("{what}: pack_chunks: {e}"));
    assert_eq!(bytes.is_pinned(), gpu.transfer() == GpuTransfer::Mapped);
    out.data = bytes.to_vec();
    drop(bytes);
    assert_same(&out, &want, &format!("{what} (pack_chunks)"));
}

#[test]
fn gpu_new_is_err_not_panic_without_driver() {
    let made = catch_unwind(GpuCompactor::new).expect("GpuCompactor::new must never panic");
    match probe_libraries() {
        Err(missing) => {
            let Err(GpuUnavailable(reason)) = made else {
                panic!("libraries are missing ({missing}) yet GpuCompactor::new succeeded");
            };
            assert_eq!(reason, missing);
            assert!(GpuCompactor::available().is_err());
            println!("GpuCompactor::new() -> Err: {reason}");
        }
        Ok(()) => match made {
            Ok(gpu) => println!("GPU present: {}", gpu.device_name()),
            Err(why) => println!("driver libraries load but: {why}"),
        },
    }
}

#[test]
fn gpu_available_agrees_with_new() {
    let available = catch_unwind(GpuCompactor::available).expect("available() must not panic");
    if let Err(why) = available {
        assert!(
            GpuCompactor::new().is_err(),
            "available() said no ({why}) but new() worked"
        );
    }
}

/// Compiles the kernel source with the real NVRTC where libnvrtc loads (a toolkit, or
/// `pip install nvidia-cuda-nvrtc` plus LD_LIBRARY_PATH), even with no driver or GPU.
#[test]
fn kernel_source_compiles_with_nvrtc_or_reports_skip() {
    if let Err(why) = probe_library("nvrtc") {
        eprintln!("SKIPPED: no NVRTC to compile the kernels: {why}");
        return;
    }
    for arch in [None, Some("compute_80"), Some("compute_90")] {
        let ptx = catch_unwind(|| compile_ptx(arch))
            .expect("NVRTC must not panic")
            .unwrap_or_else(|e| panic!("arch {arch:?}: {e}"))
            .to_src();
        for entry in ["permute_sizes", "exclusive_scan", "gather_chunks"] {
            assert!(
                ptx.contains(&format!(".entry {entry}(")),
                "{entry} missing for {arch:?}"
            );
        }
    }
    for sm in ["sm_80", "sm_90"] {
        let cubin = compile_cubin(sm).unwrap_or_else(|e| panic!("{sm}: {e}"));
        assert!(
            cubin.starts_with(b"\x7fELF"),
            "{sm}: a cubin is an ELF image"
        );
    }
    println!(
        "NVRTC compiled the kernels: PTX for its default, compute_80 and compute_90, \
         cubins for sm_80 and sm_90"
    );
}

fn assert_matches_cpu(c: &dyn Compactor, b: &OwnedBatch, out: &mut Packed, what: &str) {
    let mut want = Packed::default();
    CpuCompactor::new().compact(&b.view(), &mut want).unwrap();
    c.compact(&b.view(), out)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_same(out, &want, what);
}

#[test]
fn gpu_matches_cpu_or_reports_skip() {
    for transfer in [GpuTransfer::Mapped, GpuTransfer::Copy] {
        let Some(gpu) = gpu_with_or_skip("gpu_matches_cpu_or_reports_skip", transfer) else {
            return;
        };
        let mut rng = Rng::new(0x5eed);
        let mut out = Packed::default(); // reused on purpose: growth and shrinkage
        for round in 0..4 {
            for rank in 0..=4 {
                for scenario in Scenario::ALL {
                    let b = random_batch(&mut rng, rank, scenario);
                    let what = format!("{transfer:?} round {round} rank {rank} {scenario:?}");
                    assert_matches_cpu(&gpu, &b, &mut out, &what);
                    if round == 0 {
                        assert_host_paths_match_cpu(&gpu, &b, &what);
                    }
                }
            }
        }
        let matrix = alignment_matrix_batch(&mut rng, &[1, 15, 16, 17, 31, 100, 4099]);
        assert_matches_cpu(&gpu, &matrix, &mut out, "alignment matrix");
        assert_host_paths_match_cpu(&gpu, &matrix, "alignment matrix");
    }
}

#[test]
fn compact_host_refuses_data_outside_its_input_buffer_or_reports_skip() {
    let Some(gpu) = gpu_or_skip("compact_host_refuses_data_outside_its_input_buffer") else {
        return;
    };
    let b = random_batch(&mut Rng::new(3), 2, Scenario::Mixed);
    let input = gpu.host_buffer(16).unwrap();
    let mut result = gpu.host_buffer(16).unwrap();
    let err = gpu
        .compact_host(&b.view(), &input, &mut Packed::default(), &mut result)
        .unwrap_err();
    assert!(
        err.to_string().contains("does not lie in the input"),
        "{err}"
    );
    // The compactor is still usable afterwards.
    assert_matches_cpu(&gpu, &b, &mut Packed::default(), "after a refused call");
}

#[test]
fn gpu_edge_cases_or_reports_skip() {
    let Some(gpu) = gpu_or_skip("gpu_edge_cases_or_reports_skip") else {
        return;
    };
    let mut rng = Rng::new(42);
    let mut out = Packed::default();
    let grid = ShardGrid::new(vec![5, 3], vec![2, 2]);
    let empty = OwnedBatch {
        grid: grid.clone(),
        coords: vec![],
        data: vec![],
        src_offsets: vec![],
        sizes: vec![],
    };
    assert_matches_cpu(&gpu, &empty, &mut out, "empty batch");
    let zeros = OwnedBatch {
        coords: vec![4, 2, 0, 0, 2, 1],
        src_offsets: vec![0; 3],
        sizes: vec![0; 3],
        ..empty.clone()
    };
    assert_matches_cpu(&gpu, &zeros, &mut out, "only empty chunks");
    // One chunk far larger than the gather's split size, odd length and offset.
    let mut data = vec![0u8; (9 << 20) + 7];
    rng.fill(&mut data);
    let big = OwnedBatch {
        coords: vec![3, 1],
        src_offsets: vec![3],
        sizes: vec![(9 << 20) + 3],
        data,
        ..empty.clone()
    };
    assert_matches_cpu(&gpu, &big, &mut out, "one 9 MiB chunk");
    // Many chunks: a dense 128×128 grid of 0–300 byte chunks.
    let mut b = random_batch(&mut rng, 2, Scenario::ManyTiny);
    b.grid = ShardGrid::new(vec![128, 128], vec![16, 8]);
    let mut cells: Vec<u64> = (0..128 * 128).collect();
    rng.shuffle(&mut cells);
    b.coords = cells.iter().flat_map(|&c| [c / 128, c % 128]).collect();
    b.sizes = (0..cells.len()).map(|_| rng.range(0, 300)).collect();
    b.src_offsets = b.sizes.iter().map(|&s| rng.range(0, 4096 - s)).collect();
    b.data = vec![0; 4096];
    rng.fill(&mut b.data);
    assert_matches_cpu(&gpu, &b, &mut out, "16384 chunks");
    assert_host_paths_match_cpu(&gpu, &b, "16384 chunks");
    assert_host_paths_match_cpu(&gpu, &big, "one 9 MiB chunk");
    assert_host_paths_match_cpu(&gpu, &zeros, "only empty chunks");
    assert_host_paths_match_cpu(&gpu, &empty, "empty batch");
    let times = gpu.compact_profiled(&b.view(), &mut out).unwrap();
    assert!(times.kernels > std::time::Duration::ZERO);
}

/// Stub libcuda builds: one whose `cuInit` fails, one without `cuInit` at all (so
/// `cudarc` panics while resolving it). An empty libnvrtc lets the probe pass.
const STUB_DRIVERS: [(&str, &str); 2] = [
    (
        "init-fails",
        "int cuInit(unsigned f) { (void)f; return 100; }\n",
    ),
    ("no-symbols", "int shardfs_stub(void) { return 0; }\n"),
];

/// Re-runs `gpu_new_is_err_not_panic_without_driver` in a child process whose loader
/// path holds a stub driver: `GpuCompactor::new` must return `Err`, not panic.
#[test]
fn broken_drivers_give_err_not_panic() {
    if std::env::var_os("SHARDFS_STUB_DRIVER_CHILD").is_some() {
        return; // we are the child; the parent does the checking
    }
    let root = std::env::temp_dir().join(format!("shardfs-stub-cuda-{}", std::process::id()));
    for (name, source) in STUB_DRIVERS {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let c = dir.join("stub.c");
        std::fs::write(&c, source).expect("write stub source");
        let empty = dir.join("empty.c");
        std::fs::write(&empty, "int shardfs_empty;\n").expect("write stub source");
        let built = [("libcuda.so.1", &c), ("libnvrtc.so", &empty)]
            .iter()
            .all(|(lib, src)| {
                std::process::Command::new("cc")
                    .args(["-shared", "-fPIC", "-o"])
                    .arg(dir.join(lib))
                    .arg(src)
                    .status()
                    .is_ok_and(|s| s.success())
            });
        if !built {
            eprintln!("SKIPPED: no C compiler (cc) to build stub drivers");
            return;
        }
        let exe = std::env::current_exe().expect("test binary path");
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "compact::tests_gpu::gpu_new_is_err_not_panic_without_driver",
            ])
            .args(["--nocapture", "--test-threads=1"])
            .env("LD_LIBRARY_PATH", &dir)
            .env("SHARDFS_STUB_DRIVER_CHILD", "1")
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("run child test");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "stub {name}: child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("driver libraries load but"),
            "stub {name}: {stdout}"
        );
    }
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn auto_compactor_matches_cpu_with_or_without_gpu() {
    use super::AutoCompactor;
    let auto = AutoCompactor::calibrated();
    assert_eq!(auto.name(), "auto");
    assert_eq!(auto.has_gpu(), GpuCompactor::available().is_ok());
    let described = auto.describe().expect("auto describes itself");
    println!("auto compactor after calibration: {described}");
    // With a GPU the calibration measured all four ways; without one there is nothing
    // to choose between.
    assert_eq!(
        described["estimates"].is_object(),
        auto.has_gpu(),
        "{described}"
    );
    let mut rng = Rng::new(77);
    for scenario in Scenario::ALL {
        let b = random_batch(&mut rng, 3, scenario);
        let mut out = Packed::default();
        assert_matches_cpu(&auto, &b, &mut out, &format!("auto {scenario:?}"));
    }
    // Large enough to be decided by the estimates, whichever way they go.
    let mut b = random_batch(&mut rng, 2, Scenario::FewLarge);
    b.sizes.iter_mut().for_each(|s| *s = (*s).max(1 << 20));
    b.src_offsets = b
        .sizes
        .iter()
        .scan(0, |at, s| Some(std::mem::replace(at, *at + s)))
        .collect();
    b.data = vec![0; b.sizes.iter().sum::<u64>() as usize];
    rng.fill(&mut b.data);
    assert_matches_cpu(&auto, &b, &mut Packed::default(), "auto, large batch");
}
