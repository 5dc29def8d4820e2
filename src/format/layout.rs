//! Grid arithmetic of a sharded array: which shard and which index slot (at every nesting
//! level) hold an inner chunk, and which inner chunks a shard covers. No I/O.
//!
//! Terms, per dimension `d` (slowest first):
//! * `shape[d]`: array extent in elements; `shard_shape[d]`: the chunk grid's chunk shape.
//! * level `l` splits a block of shape `S_l` (`S_0` = shard shape) into chunks of
//!   `S_{l+1}`; `chunks_per_shard = S_l / S_{l+1}` (exact, the spec requires it).
//! * the innermost chunk shape is the last level's `chunk_shape`; the view's chunk grid
//!   has `chunk_counts[d] = ceil(shape[d] / inner[d])` chunks.
//! * `span[l][d] = S_l[d] / inner[d]`: innermost chunks along `d` in a level-`l` block.
//!
//! For inner chunk `c`: shard = `c / span[0]`; slot at level `l` = row-major ravel of
//! `(c % span[l]) / span[l+1]` over `chunks_per_shard[l]` (with `span[L] = 1`).

use serde_json::Value;

use super::index::{IndexCodecs, IndexLocation};

/// One `sharding_indexed` level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardLevel {
    /// Shape of the chunks this level's shards are split into.
    pub chunk_shape: Vec<u64>,
    pub chunks_per_shard: Vec<u64>,
    pub index_codecs: IndexCodecs,
    pub index_location: IndexLocation,
}

impl ShardLevel {
    /// Entries in this level's index; `u64::MAX` where the product overflows (such a
    /// level is refused by [`ShardLayout::new`]: its index could never be encoded).
    pub fn n_chunks(&self) -> u64 {
        self.chunks_per_shard
            .iter()
            .try_fold(1u64, |n, &c| n.checked_mul(c))
            .unwrap_or(u64::MAX)
    }

    /// Encoded index size in bytes.
    pub fn index_len(&self) -> u64 {
        self.index_codecs
            .encoded_len(self.n_chunks())
            .unwrap_or(u64::MAX)
    }
}

/// The shard layout of one presentable sharded array.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardLayout {
    pub shape: Vec<u64>,
    pub shard_shape: Vec<u64>,
    pub levels: Vec<ShardLevel>,
    /// The innermost codec chain: what the view's `zarr.json` lists as `codecs`.
    pub inner_codecs: Vec<Value>,
    /// The encoded length of every inner chunk, where the codecs fix it (no
    /// compression: `bytes`, `transpose`, `crc32c`): a chunk of another length can never
    /// be decoded. Set by [`ShardLayout::with_data_type`].
    pub fixed_chunk_len: Option<u64>,
    chunk_counts: Vec<u64>,
    shard_counts: Vec<u64>,
    /// `span[l]` per level, plus `[1; ndim]` at the end.
    span: Vec<Vec<u64>>,
}

/// Where an inner chunk is stored.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    pub shard: Vec<u64>,
    /// Index slot at each level, outermost first.
    pub slots: Vec<u64>,
}

impl ShardLayout {
    pub fn new(
        shape: Vec<u64>,
        shard_shape: Vec<u64>,
        levels: Vec<ShardLevel>,
        inner_codecs: Vec<Value>,
    ) -> Result<Self, String> {
        let ndim = shape.len();
        if levels.is_empty() || shard_shape.len() != ndim {
            return Err("no sharding level, or shard rank differs from array rank".into());
        }
        if shard_shape.contains(&0) {
            return Err(format!("shard shape {shard_shape:?} has a zero extent"));
        }
        let inner = levels.last().expect("non-empty").chunk_shape.clone();
        let mut span = Vec::with_capacity(levels.len() + 1);
        let mut outer = &shard_shape;
        for level in &levels {
            if level.n_chunks() == 0 || level.index_codecs.encoded_len(level.n_chunks()).is_none() {
                return Err(format!(
                    "chunks per shard {:?} is out of range",
                    level.chunks_per_shard
                ));
            }
            span.push(outer.iter().zip(&inner).map(|(o, i)| o / i).collect());
            outer = &level.chunk_shape;
        }
        span.push(vec![1; ndim]);
        let chunk_counts: Vec<u64> = shape
            .iter()
            .zip(&inner)
            .map(|(s, i)| s.div_ceil(*i))
            .collect();
        let shard_counts = chunk_counts
            .iter()
            .zip(&span[0])
            .map(|(c, s)| c.div_ceil(*s))
            .collect();
        Ok(ShardLayout {
            shape,
            shard_shape,
            levels,
            inner_codecs,
            fixed_chunk_len: None,
            chunk_counts,
            shard_counts,
            span,
        })
    }

    /// The layout of an array of data type `data_type` (its `zarr.json` value): sets
    /// [`ShardLayout::fixed_chunk_len`] where the inner codecs fix the encoded length.
    pub fn with_data_type(mut self, data_type: Option<&Value>) -> Self {
        self.fixed_chunk_len = fixed_len(&self.inner_codecs, self.inner_chunk_shape(), data_type);
        self
    }

    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    pub fn inner_chunk_shape(&self) -> &[u64] {
        &self.levels.last().expect("non-empty").chunk_shape
    }

    /// Inner chunks along each dimension of the array.
    pub fn chunk_counts(&self) -> &[u64] {
        &self.chunk_counts
    }

    /// Shards along each dimension of the array.
    pub fn shard_counts(&self) -> &[u64] {
        &self.shard_counts
    }

    /// Inner chunks along each dimension of one shard.
    pub fn inner_per_shard(&self) -> &[u64] {
        &self.span[0]
    }

    pub fn chunk_in_grid(&self, coords: &[u64]) -> bool {
        coords.len() == self.ndim() && coords.iter().zip(&self.chunk_counts).all(|(c, n)| c < n)
    }

    pub fn shard_in_grid(&self, coords: &[u64]) -> bool {
        coords.len() == self.ndim() && coords.iter().zip(&self.shard_counts).all(|(c, n)| c < n)
    }

    /// The shard and slots of inner chunk `coords`; `None` outside the grid.
    pub fn locate(&self, coords: &[u64]) -> Option<Location> {
        if !self.chunk_in_grid(coords) {
            return None;
        }
        let shard = coords
            .iter()
            .zip(&self.span[0])
            .map(|(c, s)| c / s)
            .collect();
        let slots = self
            .levels
            .iter()
            .enumerate()
            .map(|(l, level)| {
                let (this, next) = (&self.span[l], &self.span[l + 1]);
                let within = coords
                    .iter()
                    .zip(this)
                    .zip(next)
                    .map(|((c, s), n)| (c % s) / n);
                ravel(within, &level.chunks_per_shard)
            })
            .collect();
        Some(Location { shard, slots })
    }

    /// Range of inner chunk coordinates along dimension `d` covered by shard coordinate
    /// `s`, clipped to the grid.
    pub fn inner_range(&self, d: usize, s: u64) -> std::ops::Range<u64> {
        let per = self.span[0][d];
        let start = s.saturating_mul(per).min(self.chunk_counts[d]);
        let end = s
            .saturating_add(1)
            .saturating_mul(per)
            .min(self.chunk_counts[d]);
        start..end
    }

    /// Every in-grid inner chunk of shard `shard`, in row-major order.
    pub fn chunks_of_shard(&self, shard: &[u64]) -> Vec<Vec<u64>> {
        let ranges: Vec<_> = (0..self.ndim())
            .map(|d| self.inner_range(d, shard[d]))
            .collect();
        let mut out = Vec::new();
        if ranges.iter().any(|r| r.is_empty()) {
            return out;
        }
        let mut cur: Vec<u64> = ranges.iter().map(|r| r.start).collect();
        loop {
            out.push(cur.clone());
            // Advance like an odometer, last dimension fastest.
            let mut d = self.ndim();
            loop {
                if d == 0 {
                    return out;
                }
                d -= 1;
                cur[d] += 1;
                if cur[d] < ranges[d].end {
                    break;
                }
                cur[d] = ranges[d].start;
            }
        }
    }
}

/// Row-major flat index of `coords` in a grid of `extents`.
pub fn ravel(coords: impl IntoIterator<Item = u64>, extents: &[u64]) -> u64 {
    coords
        .into_iter()
        .zip(extents)
        .fold(0u64, |acc, (c, n)| acc * n + c)
}

/// The encoded length of a chunk of `shape` elements of `data_type` through `codecs`,
/// where it is fixed: `bytes` and `transpose` keep it, `crc32c` adds 4; any other codec
/// (compression), or a data type of no fixed size, leaves it open.
fn fixed_len(codecs: &[Value], shape: &[u64], data_type: Option<&Value>) -> Option<u64> {
    let item: u64 = match data_type?.as_str()? {
        "bool" | "int8" | "uint8" => 1,
        "int16" | "uint16" | "float16" => 2,
        "int32" | "uint32" | "float32" => 4,
        "int64" | "uint64" | "float64" | "complex64" => 8,
        "complex128" => 16,
        raw => {
            let bits: u64 = raw.strip_prefix('r')?.parse().ok()?;
            (bits.is_multiple_of(8) && bits > 0).then_some(bits / 8)?
        }
    };
    let mut len = shape.iter().try_fold(item, |n, &d| n.checked_mul(d))?;
    for c in codecs {
        let name = c
            .get("name")
            .and_then(Value::as_str)
            .or_else(|| c.as_str())?;
        match name {
            "bytes" | "transpose" => {}
            "crc32c" => len = len.checked_add(4)?,
            _ => return None,
        }
    }
    Some(len)
}

#[cfg(test)]
mod tests {
    #[test]
    fn chunks_per_shard_whose_product_overflows_are_refused_not_a_panic() {
        // Found by the metadata fuzz test: `n_chunks` multiplied without a check.
        let level = ShardLevel {
            chunk_shape: vec![1, 1],
            chunks_per_shard: vec![u64::MAX / 2, 3],
            index_codecs: super::super::IndexCodecs {
                endian: super::super::Endian::Little,
                crc32c: true,
            },
            index_location: super::super::IndexLocation::End,
        };
        assert_eq!(level.n_chunks(), u64::MAX);
        assert!(ShardLayout::new(vec![4, 4], vec![4, 4], vec![level], vec![]).is_err());
    }

    use super::*;
    use crate::format::index::Endian;

    fn level(chunk_shape: &[u64], cps: &[u64]) -> ShardLevel {
        ShardLevel {
            chunk_shape: chunk_shape.to_vec(),
            chunks_per_shard: cps.to_vec(),
            index_codecs: IndexCodecs {
                endian: Endian::Little,
                crc32c: true,
            },
            index_location: IndexLocation::End,
        }
    }

    #[test]
    fn locates_chunks_with_edge_shards() {
        // shape 10x7, shards 4x4, inner 2x2 -> 5x4 inner chunks, 3x2 shards.
        let l = ShardLayout::new(
            vec![10, 7],
            vec![4, 4],
            vec![level(&[2, 2], &[2, 2])],
            vec![],
        )
        .unwrap();
        assert_eq!(l.chunk_counts(), [5, 4]);
        assert_eq!(l.shard_counts(), [3, 2]);
        let loc = l.locate(&[4, 3]).unwrap();
        assert_eq!(loc.shard, [2, 1]);
        assert_eq!(loc.slots, [1]); // within (0, 1) of 2x2
        assert_eq!(l.locate(&[5, 0]), None);
        // Shard (2, 1) holds only row 4 of the grid: its second row lies outside.
        assert_eq!(l.chunks_of_shard(&[2, 1]), vec![vec![4, 2], vec![4, 3]]);
        assert_eq!(l.chunks_of_shard(&[0, 0]).len(), 4);
    }

    #[test]
    fn locates_through_nested_levels() {
        // shard 8, middle 4, inner 2 along one dimension.
        let l = ShardLayout::new(
            vec![16],
            vec![8],
            vec![level(&[4], &[2]), level(&[2], &[2])],
            vec![],
        )
        .unwrap();
        assert_eq!(l.inner_chunk_shape(), [2]);
        let loc = l.locate(&[7]).unwrap();
        assert_eq!(loc.shard, [1]);
        assert_eq!(loc.slots, [1, 1]);
        assert_eq!(l.locate(&[4]).unwrap().slots, [0, 0]);
    }

    #[test]
    fn zero_dimensional_arrays_have_one_chunk() {
        let l = ShardLayout::new(vec![], vec![], vec![level(&[], &[])], vec![]).unwrap();
        assert_eq!(
            l.locate(&[]).unwrap(),
            Location {
                shard: vec![],
                slots: vec![0]
            }
        );
        assert_eq!(l.chunks_of_shard(&[]), vec![Vec::<u64>::new()]);
    }

    #[test]
    fn empty_extent_has_no_chunks() {
        let l = ShardLayout::new(
            vec![0, 4],
            vec![2, 2],
            vec![level(&[1, 1], &[2, 2])],
            vec![],
        )
        .unwrap();
        assert_eq!(l.chunk_counts(), [0, 4]);
        assert_eq!(l.locate(&[0, 0]), None);
    }

    #[test]
    fn ravel_is_row_major() {
        assert_eq!(ravel([1, 2, 3], &[4, 5, 6]), 30 + 2 * 6 + 3);
        assert_eq!(ravel([], &[]), 0);
    }
}
