//! Test support: a deterministic RNG, random batches with owned buffers, and the
//! naive reference compactor every implementation is checked against.
//!
//! The reference never computes a key: it sorts chunks by the tuple
//! `(shard coords, within-shard coords)` (lexicographic = row-major) and concatenates.

pub(crate) use super::OwnedBatch;
use super::{Packed, ShardGrid, ShardRun, StagedBatch};

/// SplitMix64: tiny, deterministic, good enough for test data.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        let mut words = buf.chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let tail = words.into_remainder();
        let last = self.next_u64().to_le_bytes();
        tail.copy_from_slice(&last[..tail.len()]);
    }

    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.range(0, i as u64) as usize;
            v.swap(i, j);
        }
    }
}

/// Shapes of random batches.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scenario {
    /// Up to ~3000 chunks of 0–80 bytes.
    ManyTiny,
    /// Up to ~150 chunks of 0–96 KiB.
    Mixed,
    /// 1–4 chunks of up to 4 MiB.
    FewLarge,
}

impl Scenario {
    pub(crate) const ALL: [Scenario; 3] = [Self::ManyTiny, Self::Mixed, Self::FewLarge];

    fn chunks_and_size(self) -> (u64, u64) {
        match self {
            Self::ManyTiny => (3000, 80),
            Self::Mixed => (150, 96 << 10),
            Self::FewLarge => (4, 4 << 20),
        }
    }
}

/// A random grid of `rank` dims (edge shards likely) and a random sparse batch on it:
/// unique coordinates in random order, ~10 % empty chunks, sources placed with
/// random 0–17 byte gaps (so every alignment mod 16 occurs) and sometimes overlapping.
pub(crate) fn random_batch(rng: &mut Rng, rank: usize, scenario: Scenario) -> OwnedBatch {
    let (max_chunks, max_size) = scenario.chunks_and_size();
    let mut chunk_counts = Vec::with_capacity(rank);
    let mut chunks_per_shard = Vec::with_capacity(rank);
    for _ in 0..rank {
        chunk_counts.push(rng.range(1, 24));
        chunks_per_shard.push(rng.range(1, 6));
    }
    let grid = ShardGrid::new(chunk_counts, chunks_per_shard);
    let grid_chunks: u64 = grid.chunk_counts.iter().product();
    let n = rng.range(1, max_chunks.min(grid_chunks));

    // Distinct linear grid indices: a shuffled prefix of a partial Fisher-Yates.
    let mut linear: Vec<u64> = if grid_chunks <= 200_000 {
        let mut all: Vec<u64> = (0..grid_chunks).collect();
        rng.shuffle(&mut all);
        all.truncate(n as usize);
        all
    } else {
        let mut seen = std::collections::HashSet::new();
        while seen.len() < n as usize {
            seen.insert(rng.range(0, grid_chunks - 1));
        }
        seen.into_iter().collect()
    };
    if rng.chance(20) {
        linear.sort_unstable(); // exercise the already-sorted fast path
    }
    let mut coords = Vec::with_capacity(linear.len() * rank);
    for &l in &linear {
        let mut rest = l;
        let mut c = vec![0; rank];
        for d in (0..rank).rev() {
            c[d] = rest % grid.chunk_counts[d];
            rest /= grid.chunk_counts[d];
        }
        coords.extend(c);
    }

    let sizes: Vec<u64> = (0..n)
        .map(|_| {
            if rng.chance(10) {
                0
            } else {
                rng.range(0, max_size)
            }
        })
        .collect();
    let mut src_offsets = vec![0u64; n as usize];
    let mut placement: Vec<usize> = (0..n as usize).collect();
    rng.shuffle(&mut placement);
    let mut cursor = rng.range(0, 17);
    for &i in &placement {
        if i > 0 && rng.chance(5) && sizes[i] <= sizes[i - 1] {
            src_offsets[i] = src_offsets[i - 1]; // overlaps an earlier range
        } else {
            src_offsets[i] = cursor;
        }
        cursor = cursor.max(src_offsets[i] + sizes[i]) + rng.range(0, 17);
    }
    let mut data = vec![0u8; cursor as usize];
    rng.fill(&mut data);
    OwnedBatch {
        grid,
        coords,
        data,
        src_offsets,
        sizes,
    }
}

/// The obviously-correct compactor: sort by (shard coords, within coords), concatenate.
pub(crate) fn reference(batch: &StagedBatch<'_>) -> Packed {
    let rank = batch.grid.rank();
    let cps = &batch.grid.chunks_per_shard;
    let mut keyed: Vec<(Vec<u64>, Vec<u64>, usize)> = (0..batch.len())
        .map(|i| {
            let t = &batch.coords[i * rank..(i + 1) * rank];
            let s = t.iter().zip(cps).map(|(t, p)| t / p).collect();
            let w = t.iter().zip(cps).map(|(t, p)| t % p).collect();
            (s, w, i)
        })
        .collect();
    keyed.sort();
    let mut out = Packed::default();
    out.offsets.push(0);
    for (j, (s, w, i)) in keyed.iter().enumerate() {
        let start = batch.src_offsets[*i] as usize;
        let len = batch.sizes[*i] as usize;
        out.data.extend_from_slice(&batch.data[start..start + len]);
        out.order.push(*i as u32);
        out.offsets.push(out.data.len() as u64);
        out.slots
            .push(w.iter().zip(cps).fold(0, |acc, (w, p)| acc * p + w));
        match out.shards.last_mut() {
            Some(run) if run.shard_coords == *s => run.end = j + 1,
            _ => out.shards.push(ShardRun {
                shard_coords: s.clone(),
                first: j,
                end: j + 1,
            }),
        }
    }
    out
}

/// Field-by-field comparison with a readable failure (never dumps megabytes).
pub(crate) fn assert_same(got: &Packed, want: &Packed, what: &str) {
    assert_eq!(got.order, want.order, "{what}: order");
    assert_eq!(got.offsets, want.offsets, "{what}: offsets");
    assert_eq!(got.slots, want.slots, "{what}: slots");
    assert_eq!(got.shards, want.shards, "{what}: shards");
    assert_eq!(got.data.len(), want.data.len(), "{what}: data length");
    if let Some(pos) = got.data.iter().zip(&want.data).position(|(a, b)| a != b) {
        panic!("{what}: data differs first at byte {pos}");
    }
}

/// One 1-D batch covering every (source mod 16, destination mod 16, length) triple:
/// each test chunk follows a spacer chunk (0–15 bytes) that brings its packed
/// destination offset to the wanted alignment; its source starts at the wanted
/// alignment in `data`. Coordinates are in packed order.
pub(crate) fn alignment_matrix_batch(rng: &mut Rng, lens: &[u64]) -> OwnedBatch {
    let (mut sizes, mut src_offsets) = (Vec::new(), Vec::new());
    let (mut dst, mut src) = (0u64, 0u64);
    for src_mis in 0..16 {
        for dst_mis in 0..16 {
            for &len in lens {
                let spacer = (dst_mis + 16 - dst % 16) % 16;
                sizes.push(spacer);
                src_offsets.push(src);
                src += spacer;
                dst += spacer;
                src += (src_mis + 16 - src % 16) % 16;
                sizes.push(len);
                src_offsets.push(src);
                src += len;
                dst += len;
            }
        }
    }
    let n = sizes.len() as u64;
    let mut data = vec![0u8; src as usize];
    rng.fill(&mut data);
    OwnedBatch {
        grid: ShardGrid::new(vec![n], vec![7]),
        coords: (0..n).collect(),
        data,
        src_offsets,
        sizes,
    }
}
