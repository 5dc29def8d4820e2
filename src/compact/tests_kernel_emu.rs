//! Runs `gpu_kernel.cu` on the CPU through the `gpu_kernel_emu.cpp` harness (compiled
//! with the system C++ compiler) and compares offsets and bytes with the CPU
//! compactor. This checks the kernels' logic where no GPU exists; it says SKIPPED when
//! no `c++` is installed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::gpu::launch::gather_grid;
use super::testkit::{OwnedBatch, Rng, Scenario, alignment_matrix_batch, random_batch};
use super::{Compactor, CpuCompactor, Packed, ShardGrid};

/// The harness and the kernels it includes, built into the test binary so that a
/// binary copied to another machine (the GPU device) needs no source tree.
const HARNESS_SOURCE: &str = include_str!("gpu_kernel_emu.cpp");
const KERNEL_SOURCE: &str = include_str!("gpu_kernel.cu");

/// Builds the harness once per test process; `Err` = why it cannot run here.
fn harness() -> Result<&'static Path, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir =
                std::env::temp_dir().join(format!("shardfs-kernel-emu-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| format!("temp dir: {e}"))?;
            for (name, text) in [
                ("gpu_kernel_emu.cpp", HARNESS_SOURCE),
                ("gpu_kernel.cu", KERNEL_SOURCE),
            ] {
                std::fs::write(dir.join(name), text).map_err(|e| format!("write {name}: {e}"))?;
            }
            let exe = dir.join("harness");
            let status = Command::new("c++")
                .args([
                    "-std=c++20",
                    "-O2",
                    "-fno-strict-aliasing",
                    "-pthread",
                    "-o",
                ])
                .arg(&exe)
                .arg(dir.join("gpu_kernel_emu.cpp"))
                .status()
                .map_err(|e| format!("no C++ compiler (c++): {e}"))?;
            if status.success() {
                Ok(exe)
            } else {
                Err(format!("c++ failed: {status}"))
            }
        })
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(Clone::clone)
}

/// The kernels' (offsets, packed bytes) for `b`, given the CPU's permutation.
fn emulate(exe: &Path, b: &OwnedBatch, cpu: &Packed) -> (Vec<u64>, Vec<u8>) {
    let n = b.sizes.len();
    let mut perm = vec![0u32; n];
    for (j, &i) in cpu.order.iter().enumerate() {
        perm[i as usize] = j as u32;
    }
    let total = cpu.offsets[n];
    let grid_y = u64::from(gather_grid(n.max(1), &b.sizes).grid_dim.1);
    let mut input = Vec::new();
    for v in [n as u64, b.data.len() as u64, total, grid_y] {
        input.extend_from_slice(&v.to_ne_bytes());
    }
    b.src_offsets
        .iter()
        .chain(&b.sizes)
        .for_each(|v| input.extend_from_slice(&v.to_ne_bytes()));
    perm.iter()
        .for_each(|v| input.extend_from_slice(&v.to_ne_bytes()));
    input.extend_from_slice(&b.data);

    let mut child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run kernel harness");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let output = child.wait_with_output().expect("kernel harness output");
    writer
        .join()
        .expect("writer thread")
        .expect("write harness input");
    assert!(output.status.success(), "harness failed: {}", output.status);
    let (head, data) = output.stdout.split_at((n + 1) * 8);
    let offsets = head
        .chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")))
        .collect();
    (offsets, data.to_vec())
}

fn check(exe: &Path, b: &OwnedBatch, what: &str) {
    let mut cpu = Packed::default();
    CpuCompactor::new().compact(&b.view(), &mut cpu).unwrap();
    let (offsets, data) = emulate(exe, b, &cpu);
    assert_eq!(offsets.len(), cpu.offsets.len(), "{what}: offsets length");
    if let Some(j) = offsets.iter().zip(&cpu.offsets).position(|(a, b)| a != b) {
        panic!(
            "{what}: offsets[{j}] = {} but CPU says {}",
            offsets[j], cpu.offsets[j]
        );
    }
    assert_eq!(data.len(), cpu.data.len(), "{what}: data length");
    if let Some(pos) = data.iter().zip(&cpu.data).position(|(a, b)| a != b) {
        panic!("{what}: kernel bytes differ first at {pos}");
    }
}

#[test]
fn emulated_kernels_match_cpu_or_report_skip() {
    let exe = match harness() {
        Ok(exe) => exe,
        Err(why) => {
            eprintln!("SKIPPED: cannot emulate the kernels: {why}");
            return;
        }
    };
    let mut rng = Rng::new(0xE3);
    for rank in 0..=3 {
        for scenario in [Scenario::ManyTiny, Scenario::Mixed] {
            let b = random_batch(&mut rng, rank, scenario);
            check(exe, &b, &format!("rank {rank} {scenario:?}"));
        }
    }
    let matrix = alignment_matrix_batch(&mut rng, &[1, 15, 16, 17, 47, 100]);
    check(exe, &matrix, "alignment matrix");
    // A chunk split over several gather blocks (grid y > 1), odd offsets.
    let mut data = vec![0u8; (1 << 20) + 9];
    rng.fill(&mut data);
    let big = OwnedBatch {
        grid: ShardGrid::new(vec![3], vec![2]),
        coords: vec![2, 0],
        src_offsets: vec![5, 0],
        sizes: vec![(1 << 20) + 1, 3],
        data,
    };
    check(exe, &big, "1 MiB chunk split over blocks");
    // More chunks than one scan tile (4096) so the carry between tiles is exercised.
    let mut b = random_batch(&mut rng, 2, Scenario::ManyTiny);
    b.grid = ShardGrid::new(vec![100, 100], vec![8, 8]);
    let mut cells: Vec<u64> = (0..10_000).collect();
    rng.shuffle(&mut cells);
    b.coords = cells.iter().flat_map(|&c| [c / 100, c % 100]).collect();
    b.sizes = (0..cells.len()).map(|_| rng.range(0, 40)).collect();
    b.src_offsets = b.sizes.iter().map(|&s| rng.range(0, 512 - s)).collect();
    b.data = vec![0; 512];
    rng.fill(&mut b.data);
    check(exe, &b, "10000 chunks");
    if let Some(dir) = exe.parent() {
        std::fs::remove_dir_all(dir).ok();
    }
}
