//! CPU compactor unit tests: hand-checked examples, every rank class, and every input
//! error as a typed `CompactError` (no panics).

use super::testkit::{OwnedBatch, Rng, Scenario, assert_same, random_batch, reference};
use super::{CompactError, Compactor, CpuCompactor, Packed, ShardGrid, ShardRun, StagedBatch};

fn run(batch: &StagedBatch<'_>) -> Result<Packed, CompactError> {
    let mut out = Packed::default();
    CpuCompactor::new().compact(batch, &mut out)?;
    Ok(out)
}

fn run_owned(b: &OwnedBatch) -> Packed {
    run(&b.view()).expect("valid batch")
}

fn run_err(batch: &StagedBatch<'_>) -> CompactError {
    run(batch).expect_err("invalid batch must be rejected")
}

fn run_spans(s: &[(usize, usize)]) -> Vec<ShardRun> {
    s.iter()
        .map(|&(first, end)| ShardRun {
            shard_coords: vec![],
            first,
            end,
        })
        .collect()
}

/// Grid 3×5 chunks, 2×2 chunks per shard ⇒ 2×3 shards, edge shards along both dims
/// (slots per shard = 4).
///
/// | i | coord | shard s | within w | slot | key = ravel(s)·4 + slot | bytes |
/// |---|-------|---------|----------|------|-------------------------|-------|
/// | 0 | (0,3) | (0,1)   | (0,1)    | 1    | 1·4+1 = 5               | "aaa" |
/// | 1 | (2,4) | (1,2)   | (0,0)    | 0    | 5·4+0 = 20              | "b"   |
/// | 2 | (1,0) | (0,0)   | (1,0)    | 2    | 0·4+2 = 2               | "cc"  |
/// | 3 | (0,0) | (0,0)   | (0,0)    | 0    | 0                       | ""    |
/// | 4 | (1,2) | (0,1)   | (1,0)    | 2    | 1·4+2 = 6               | "dddd"|
/// | 5 | (2,1) | (1,0)   | (0,1)    | 1    | 3·4+1 = 13              | "ee"  |
///
/// Sorted by key: order = [3, 2, 0, 4, 5, 1]; permuted sizes [0,2,3,4,2,1] ⇒
/// offsets = [0,0,2,5,9,11,12]; data = "" "cc" "aaa" "dddd" "ee" "b";
/// slots = [0,2,1,2,1,0]; shards (0,0):0..2, (0,1):2..4, (1,0):4..5, (1,2):5..6.
#[test]
fn hand_checked_2d_with_edge_shards() {
    let grid = ShardGrid::new(vec![3, 5], vec![2, 2]);
    let data = b"?aaa?b?cc?dddd?ee";
    let batch = StagedBatch {
        grid: &grid,
        coords: &[0, 3, 2, 4, 1, 0, 0, 0, 1, 2, 2, 1],
        data,
        src_offsets: &[1, 5, 7, 0, 10, 15],
        sizes: &[3, 1, 2, 0, 4, 2],
    };
    let out = run(&batch).unwrap();
    assert_eq!(out.order, [3, 2, 0, 4, 5, 1]);
    assert_eq!(out.offsets, [0, 0, 2, 5, 9, 11, 12]);
    assert_eq!(out.data, b"ccaaaddddeeb");
    assert_eq!(out.slots, [0, 2, 1, 2, 1, 0]);
    let coords: Vec<_> = out.shards.iter().map(|r| r.shard_coords.clone()).collect();
    assert_eq!(coords, [[0, 0], [0, 1], [1, 0], [1, 2]]);
    let spans: Vec<_> = out.shards.iter().map(|r| (r.first, r.end)).collect();
    assert_eq!(spans, [(0, 2), (2, 4), (4, 5), (5, 6)]);
    assert_eq!(out.run_bytes(&out.shards[1]), b"aaadddd");
    assert_eq!(out.chunk_bytes(3), b"dddd");
    assert_same(&out, &reference(&batch), "hand example vs reference");
}

#[test]
fn rank_0_is_one_chunk_in_one_shard() {
    let grid = ShardGrid::new(vec![], vec![]);
    let batch = StagedBatch {
        grid: &grid,
        coords: &[],
        data: b"scalar",
        src_offsets: &[0],
        sizes: &[6],
    };
    let out = run(&batch).unwrap();
    assert_eq!(out.order, [0]);
    assert_eq!(out.offsets, [0, 6]);
    assert_eq!(out.slots, [0]);
    assert_eq!(out.shards, run_spans(&[(0, 1)]));
    assert_eq!(out.data, b"scalar");

    let two = StagedBatch {
        src_offsets: &[0, 1],
        sizes: &[1, 1],
        ..batch
    };
    assert!(matches!(
        run_err(&two),
        CompactError::DuplicateChunk {
            first: 0,
            second: 1
        }
    ));
}

#[test]
fn rank_1_groups_by_shard_with_short_last_shard() {
    // 10 chunks, 4 per shard ⇒ shards [0..4), [4..8), [8..10).
    let grid = ShardGrid::new(vec![10], vec![4]);
    let data: Vec<u8> = (0..10).collect();
    let batch = StagedBatch {
        grid: &grid,
        coords: &[9, 0, 5, 4, 3],
        data: &data,
        src_offsets: &[9, 0, 5, 4, 3],
        sizes: &[1, 1, 1, 1, 1],
    };
    let out = run(&batch).unwrap();
    assert_eq!(out.order, [1, 4, 3, 2, 0]);
    assert_eq!(out.data, [0, 3, 4, 5, 9]);
    assert_eq!(out.slots, [0, 3, 0, 1, 1]);
    let spans: Vec<_> = out
        .shards
        .iter()
        .map(|r| (r.shard_coords[0], r.first, r.end))
        .collect();
    assert_eq!(spans, [(0, 0, 2), (1, 2, 4), (2, 4, 5)]);
}

#[test]
fn rank_3_matches_reference() {
    let mut rng = Rng::new(3);
    for scenario in Scenario::ALL {
        for _ in 0..5 {
            let b = random_batch(&mut rng, 3, scenario);
            assert_same(&run_owned(&b), &reference(&b.view()), "rank 3");
        }
    }
}

#[test]
fn empty_chunks_and_empty_batch() {
    let grid = ShardGrid::new(vec![4, 4], vec![2, 2]);
    let batch = StagedBatch {
        grid: &grid,
        coords: &[3, 3, 0, 0, 2, 1],
        data: &[],
        src_offsets: &[0, 0, 0],
        sizes: &[0, 0, 0],
    };
    let out = run(&batch).unwrap();
    assert_eq!(out.order, [1, 2, 0]);
    assert_eq!(out.offsets, [0, 0, 0, 0]);
    assert!(out.data.is_empty());
    assert_eq!(out.shards.len(), 3);

    let none = StagedBatch {
        coords: &[],
        src_offsets: &[],
        sizes: &[],
        ..batch
    };
    let out = run(&none).unwrap();
    assert_eq!(out.offsets, [0]);
    assert!(out.order.is_empty() && out.shards.is_empty() && out.data.is_empty());
}

#[test]
fn one_chunk() {
    let grid = ShardGrid::new(vec![7, 7, 7], vec![3, 3, 3]);
    let batch = StagedBatch {
        grid: &grid,
        coords: &[6, 5, 4],
        data: b"xyz",
        src_offsets: &[1],
        sizes: &[2],
    };
    let out = run(&batch).unwrap();
    assert_eq!(out.data, b"yz");
    assert_eq!(out.shards[0].shard_coords, [2, 1, 1]);
    // within (0, 2, 1) over 3×3×3 ⇒ 0·9 + 2·3 + 1
    assert_eq!(out.slots, [7]);
}

#[test]
fn thousands_of_chunks_fill_every_slot() {
    // A dense 64×64 grid, 8×8 per shard, staged in random order.
    let mut rng = Rng::new(7);
    let grid = ShardGrid::new(vec![64, 64], vec![8, 8]);
    let mut cells: Vec<(u64, u64)> = (0..64).flat_map(|a| (0..64).map(move |b| (a, b))).collect();
    rng.shuffle(&mut cells);
    let coords: Vec<u64> = cells.iter().flat_map(|&(a, b)| [a, b]).collect();
    let sizes: Vec<u64> = (0..cells.len()).map(|_| rng.range(0, 40)).collect();
    let mut src_offsets = Vec::new();
    let mut at = 0;
    for s in &sizes {
        src_offsets.push(at);
        at += s;
    }
    let mut data = vec![0; at as usize];
    rng.fill(&mut data);
    let b = OwnedBatch {
        grid,
        coords,
        data,
        src_offsets,
        sizes,
    };
    let out = run_owned(&b);
    assert_eq!(out.shards.len(), 64);
    for run in &out.shards {
        assert_eq!(run.end - run.first, 64);
        let slots: Vec<u64> = out.slots[run.positions()].to_vec();
        assert_eq!(slots, (0..64).collect::<Vec<_>>());
    }
    assert_same(&out, &reference(&b.view()), "dense 64x64");
}

#[test]
fn parallel_and_streaming_gathers_match_reference() {
    let mut rng = Rng::new(11);
    for threads in [1, 2, 3, 5] {
        for stream_from in [0, u64::MAX] {
            for _ in 0..3 {
                let b = random_batch(&mut rng, 2, Scenario::FewLarge);
                let cpu = CpuCompactor::with_threads(threads).streaming_from(stream_from);
                let mut out = Packed::default();
                cpu.compact(&b.view(), &mut out).unwrap();
                assert_same(&out, &reference(&b.view()), "threaded/streaming gather");
            }
        }
    }
}

#[test]
fn reused_output_equals_fresh_output() {
    let mut rng = Rng::new(5);
    let big = random_batch(&mut rng, 3, Scenario::ManyTiny);
    let small = random_batch(&mut rng, 1, Scenario::Mixed);
    let mut out = Packed::default();
    let cpu = CpuCompactor::new();
    cpu.compact(&big.view(), &mut out).unwrap();
    cpu.compact(&small.view(), &mut out).unwrap();
    assert_eq!(out, run_owned(&small));
}

#[test]
fn duplicate_coordinates_are_rejected() {
    let grid = ShardGrid::new(vec![4, 4], vec![2, 2]);
    let batch = StagedBatch {
        grid: &grid,
        coords: &[1, 1, 3, 0, 1, 1],
        data: b"abc",
        src_offsets: &[0, 1, 2],
        sizes: &[1, 1, 1],
    };
    assert!(matches!(
        run_err(&batch),
        CompactError::DuplicateChunk {
            first: 0,
            second: 2
        }
    ));
}

#[test]
fn out_of_grid_coordinates_are_rejected() {
    let grid = ShardGrid::new(vec![4, 5], vec![2, 2]);
    let batch = StagedBatch {
        grid: &grid,
        coords: &[0, 0, 3, 5],
        data: b"ab",
        src_offsets: &[0, 1],
        sizes: &[1, 1],
    };
    assert!(matches!(
        run_err(&batch),
        CompactError::ChunkOutOfGrid {
            index: 1,
            dim: 1,
            coord: 5,
            count: 5
        }
    ));
    let coords = [u64::MAX, 0];
    let huge = StagedBatch {
        coords: &coords,
        src_offsets: &[0],
        sizes: &[1],
        ..batch
    };
    assert!(matches!(
        run_err(&huge),
        CompactError::ChunkOutOfGrid {
            index: 0,
            dim: 0,
            ..
        }
    ));
}

#[test]
fn inconsistent_lengths_are_rejected() {
    let grid = ShardGrid::new(vec![4, 4], vec![2, 2]);
    let ok = StagedBatch {
        grid: &grid,
        coords: &[0, 0, 1, 1],
        data: b"ab",
        src_offsets: &[0, 1],
        sizes: &[1, 1],
    };
    assert!(run(&ok).is_ok());
    let e = run_err(&StagedBatch {
        src_offsets: &[0],
        ..ok
    });
    assert!(matches!(
        e,
        CompactError::LengthMismatch {
            what: "src_offsets",
            expected: 2,
            got: 1
        }
    ));
    let e = run_err(&StagedBatch {
        coords: &[0, 0, 1],
        ..ok
    });
    assert!(matches!(
        e,
        CompactError::LengthMismatch {
            what: "coords",
            expected: 4,
            got: 3
        }
    ));
    let e = run_err(&StagedBatch {
        src_offsets: &[0, 2],
        ..ok
    });
    assert!(matches!(
        e,
        CompactError::SourceOutOfBounds {
            index: 1,
            offset: 2,
            size: 1,
            data_len: 2
        }
    ));
    let e = run_err(&StagedBatch {
        src_offsets: &[0, u64::MAX],
        ..ok
    });
    assert!(matches!(
        e,
        CompactError::SourceOutOfBounds { index: 1, .. }
    ));
}

#[test]
fn malformed_grids_are_rejected() {
    let batch = |grid: &ShardGrid| {
        run(&StagedBatch {
            grid,
            coords: &[0, 0],
            data: b"a",
            src_offsets: &[0],
            sizes: &[1],
        })
    };
    let e = batch(&ShardGrid::new(vec![4, 4], vec![2])).unwrap_err();
    assert!(matches!(
        e,
        CompactError::GridRankMismatch {
            chunk_counts: 2,
            chunks_per_shard: 1
        }
    ));
    let e = batch(&ShardGrid::new(vec![4, 4], vec![2, 0])).unwrap_err();
    assert!(matches!(e, CompactError::ZeroChunksPerShard { dim: 1 }));
    let e = batch(&ShardGrid::new(vec![u64::MAX, u64::MAX], vec![1, 1])).unwrap_err();
    assert!(matches!(e, CompactError::GridTooLarge));
    // Huge but representable grids work (keys above 2^32 take the wide sort).
    let wide = ShardGrid::new(vec![1 << 40, 1 << 20], vec![3, 5]);
    let out = run(&StagedBatch {
        grid: &wide,
        coords: &[(1 << 40) - 1, 7, 0, 0],
        data: b"ab",
        src_offsets: &[0, 1],
        sizes: &[1, 1],
    })
    .unwrap();
    assert_eq!(out.data, b"ba");
}

#[test]
fn no_panic_on_random_garbage() {
    let mut rng = Rng::new(13);
    for _ in 0..2000 {
        let rank = rng.range(0, 3) as usize;
        let grid = ShardGrid::new(
            (0..rank).map(|_| rng.range(0, 5)).collect(),
            (0..rng.range(0, 3)).map(|_| rng.range(0, 3)).collect(),
        );
        let n = rng.range(0, 6) as usize;
        let coords: Vec<u64> = (0..rng.range(0, 12)).map(|_| rng.range(0, 6)).collect();
        let src_offsets: Vec<u64> = (0..n).map(|_| rng.range(0, 9)).collect();
        let sizes: Vec<u64> = (0..rng.range(0, 6)).map(|_| rng.range(0, 9)).collect();
        let data = vec![7u8; rng.range(0, 12) as usize];
        let batch = StagedBatch {
            grid: &grid,
            coords: &coords,
            data: &data,
            src_offsets: &src_offsets,
            sizes: &sizes,
        };
        if let Ok(out) = run(&batch) {
            assert_same(
                &out,
                &reference(&batch),
                "garbage that happened to be valid",
            );
        }
    }
}

#[test]
fn alignment_matrix_matches_reference() {
    let b = super::testkit::alignment_matrix_batch(&mut Rng::new(9), &[1, 15, 16, 17, 100]);
    let out = run_owned(&b);
    assert_same(&out, &reference(&b.view()), "alignment matrix");
    // The construction really yields every (src % 16, dst % 16) pair.
    let mut pairs = std::collections::HashSet::new();
    for j in (1..out.len()).step_by(2) {
        let i = out.order[j] as usize;
        pairs.insert((b.src_offsets[i] % 16, out.offsets[j] % 16));
    }
    assert_eq!(pairs.len(), 256);
}

#[test]
fn plan_layout_is_compact_without_the_bytes() {
    let mut rng = Rng::new(11);
    for rank in 0..4 {
        for scenario in Scenario::ALL {
            let b = random_batch(&mut rng, rank, scenario);
            let v = b.view();
            // A reused output: the stale bytes must go.
            let mut planned = Packed {
                data: vec![1; 7],
                ..Packed::default()
            };
            super::plan_layout(v.grid, v.coords, v.sizes, &mut planned).unwrap();
            let mut want = run_owned(&b);
            assert!(planned.data.is_empty());
            want.data.clear();
            assert_same(&planned, &want, "plan_layout");
        }
    }
    // The same errors as `compact`, from the same checks.
    let grid = ShardGrid::new(vec![4, 4], vec![2, 2]);
    let mut out = Packed::default();
    assert!(matches!(
        super::plan_layout(&grid, &[1, 1, 3, 0, 1, 1], &[1, 1, 1], &mut out),
        Err(CompactError::DuplicateChunk {
            first: 0,
            second: 2
        })
    ));
    assert!(matches!(
        super::plan_layout(&grid, &[0, 0, 4, 0], &[1, 1], &mut out),
        Err(CompactError::ChunkOutOfGrid { index: 1, .. })
    ));
    assert!(matches!(
        super::plan_layout(&grid, &[0, 0, 1], &[1, 1], &mut out),
        Err(CompactError::LengthMismatch { what: "coords", .. })
    ));
    assert!(matches!(
        super::plan_layout(&grid, &[0, 0, 1, 1], &[u64::MAX, u64::MAX], &mut out),
        Err(CompactError::PayloadTooLarge { .. })
    ));
}
