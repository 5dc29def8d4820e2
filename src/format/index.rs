//! The shard index of the `sharding_indexed` codec: decode, validate, encode. No I/O.
//!
//! Spec: <https://zarr-specs.readthedocs.io/en/latest/v3/codecs/sharding-indexed/index.html>
//! ("Binary shard format") and the `crc32c` codec
//! (<https://zarr-specs.readthedocs.io/en/latest/v3/codecs/crc32c/index.html>).
//!
//! ```text
//! index_location = end (default)          index_location = start
//! +--------------------+                  +-------+--------------------+
//! | chunk bytes ...    |                  | index | chunk bytes ...    |
//! +--------------------+-------+          +-------+--------------------+
//!                      | index |
//!                      +-------+
//! index = n x (offset: u64, nbytes: u64)   n = product(chunks_per_shard), row-major
//!         [+ crc32c: u32 little-endian]    when the index codecs end with `crc32c`
//! ```
//!
//! * The `bytes` index codec chooses the endianness of the u64 words; the checksum, when
//!   present, is CRC-32C (Castagnoli) of the encoded words, appended little-endian.
//! * An empty inner chunk has `offset == nbytes == 2^64-1` ([`EMPTY`]).
//! * Offsets are relative to the first byte of the shard (for a nested shard: of the
//!   enclosing chunk's byte range).
//!
//! This module does not own where the index lives in a file beyond the start/end rule, nor
//! how shards are read or laid out; see [`super::shard_read`] and [`super::shard_write`]
//! (and `store` for where they come from and go).

use thiserror::Error;

/// Sentinel for an empty inner chunk, used for both `offset` and `nbytes`.
pub const EMPTY: u64 = u64::MAX;
/// Bytes of one index entry: two u64 words.
pub const ENTRY_BYTES: u64 = 16;
/// Bytes of the crc32c checksum appended by the `crc32c` codec.
pub const CRC32C_BYTES: u64 = 4;

/// Byte order of the index words, from the `bytes` index codec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endian {
    Little,
    Big,
}

/// Where the index lies in the shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexLocation {
    Start,
    End,
}

/// The index codec chain shardfs understands: `bytes` optionally followed by `crc32c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexCodecs {
    pub endian: Endian,
    pub crc32c: bool,
}

impl IndexCodecs {
    /// Encoded size of an index of `n_chunks` entries, `None` on overflow.
    pub fn encoded_len(&self, n_chunks: u64) -> Option<u64> {
        let words = n_chunks.checked_mul(ENTRY_BYTES)?;
        words.checked_add(if self.crc32c { CRC32C_BYTES } else { 0 })
    }
}

/// Byte range of one stored inner chunk, relative to the start of its shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkRange {
    pub offset: u64,
    pub nbytes: u64,
}

impl ChunkRange {
    /// One past the last byte. Validated ranges never overflow.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.nbytes)
    }
}

/// A corrupt or unreadable index. Every variant names what was wrong, so the one log
/// line for a bad shard says why.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum IndexError {
    #[error("shard is {len} bytes, shorter than its {need}-byte index")]
    Truncated { len: u64, need: u64 },
    #[error("index checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("inner chunk {slot}: half-empty entry (offset {offset:#x}, nbytes {nbytes:#x})")]
    HalfEmpty { slot: u64, offset: u64, nbytes: u64 },
    #[error("inner chunk {slot}: bytes {offset}+{nbytes} lie beyond the shard's {len} bytes")]
    OutOfRange {
        slot: u64,
        offset: u64,
        nbytes: u64,
        len: u64,
    },
    #[error(
        "inner chunk {slot}: bytes {offset}..{end} overlap the index at {index_start}..{index_end}"
    )]
    OverlapsIndex {
        slot: u64,
        offset: u64,
        end: u64,
        index_start: u64,
        index_end: u64,
    },
    #[error("index of {n_chunks} entries does not fit in 64 bits")]
    TooLarge { n_chunks: u64 },
}

/// A decoded shard index: one optional [`ChunkRange`] per inner chunk slot, row-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardIndex {
    entries: Vec<Option<ChunkRange>>,
}

impl ShardIndex {
    /// An index with every slot empty.
    pub fn empty(n_chunks: usize) -> Self {
        ShardIndex {
            entries: vec![None; n_chunks],
        }
    }

    pub fn from_entries(entries: Vec<Option<ChunkRange>>) -> Self {
        ShardIndex { entries }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, slot: u64) -> Option<ChunkRange> {
        usize::try_from(slot)
            .ok()
            .and_then(|s| self.entries.get(s).copied().flatten())
    }

    pub fn set(&mut self, slot: usize, range: Option<ChunkRange>) {
        self.entries[slot] = range;
    }

    pub fn entries(&self) -> &[Option<ChunkRange>] {
        &self.entries
    }

    /// Number of non-empty slots.
    pub fn stored(&self) -> usize {
        self.entries.iter().filter(|e| e.is_some()).count()
    }

    /// Sum of the stored chunks' sizes (live bytes).
    pub fn live_bytes(&self) -> u64 {
        self.entries.iter().flatten().map(|r| r.nbytes).sum()
    }

    /// Decode the encoded index `bytes` (exactly `codecs.encoded_len(n_chunks)` long)
    /// and check its checksum. Does not check ranges; see [`ShardIndex::validate`].
    pub fn decode(bytes: &[u8], codecs: IndexCodecs, n_chunks: u64) -> Result<Self, IndexError> {
        let need = codecs
            .encoded_len(n_chunks)
            .ok_or(IndexError::TooLarge { n_chunks })?;
        if (bytes.len() as u64) < need {
            return Err(IndexError::Truncated {
                len: bytes.len() as u64,
                need,
            });
        }
        let words_len = (n_chunks * ENTRY_BYTES) as usize;
        let words = &bytes[..words_len];
        if codecs.crc32c {
            let stored = u32::from_le_bytes(
                bytes[words_len..words_len + 4]
                    .try_into()
                    .expect("4-byte slice"),
            );
            let computed = crc32c::crc32c(words);
            if stored != computed {
                return Err(IndexError::Checksum { stored, computed });
            }
        }
        let read = |w: &[u8]| {
            let w: [u8; 8] = w.try_into().expect("8-byte word");
            match codecs.endian {
                Endian::Little => u64::from_le_bytes(w),
                Endian::Big => u64::from_be_bytes(w),
            }
        };
        let mut entries = Vec::with_capacity(n_chunks as usize);
        for (slot, e) in words.chunks_exact(ENTRY_BYTES as usize).enumerate() {
            let (offset, nbytes) = (read(&e[..8]), read(&e[8..]));
            entries.push(match (offset, nbytes) {
                (EMPTY, EMPTY) => None,
                (EMPTY, _) | (_, EMPTY) => {
                    return Err(IndexError::HalfEmpty {
                        slot: slot as u64,
                        offset,
                        nbytes,
                    });
                }
                _ => Some(ChunkRange { offset, nbytes }),
            });
        }
        Ok(ShardIndex { entries })
    }

    /// Check every stored range against a shard of `len` bytes whose index occupies
    /// `index_start..index_end`: inside the shard, no overflow, not overlapping the index.
    pub fn validate(&self, len: u64, index_start: u64, index_end: u64) -> Result<(), IndexError> {
        for (slot, r) in self.entries.iter().enumerate() {
            let Some(r) = r else { continue };
            let slot = slot as u64;
            let end = match r.offset.checked_add(r.nbytes) {
                Some(end) if end <= len => end,
                _ => {
                    return Err(IndexError::OutOfRange {
                        slot,
                        offset: r.offset,
                        nbytes: r.nbytes,
                        len,
                    });
                }
            };
            if r.nbytes > 0 && r.offset < index_end && end > index_start {
                return Err(IndexError::OverlapsIndex {
                    slot,
                    offset: r.offset,
                    end,
                    index_start,
                    index_end,
                });
            }
        }
        Ok(())
    }

    /// Encode with `codecs` (words in the codec's byte order, then the crc32c if any).
    pub fn encode(&self, codecs: IndexCodecs) -> Vec<u8> {
        let n = self.entries.len() as u64;
        let mut out = Vec::with_capacity(codecs.encoded_len(n).unwrap_or(0) as usize);
        let put = |out: &mut Vec<u8>, v: u64| match codecs.endian {
            Endian::Little => out.extend_from_slice(&v.to_le_bytes()),
            Endian::Big => out.extend_from_slice(&v.to_be_bytes()),
        };
        for e in &self.entries {
            let (o, n) = e.map_or((EMPTY, EMPTY), |r| (r.offset, r.nbytes));
            put(&mut out, o);
            put(&mut out, n);
        }
        if codecs.crc32c {
            let crc = crc32c::crc32c(&out);
            out.extend_from_slice(&crc.to_le_bytes());
        }
        out
    }
}

/// Where the index of a shard of `shard_len` bytes lies, for an index of `index_len` bytes.
pub fn index_region(
    location: IndexLocation,
    shard_len: u64,
    index_len: u64,
) -> Result<(u64, u64), IndexError> {
    if shard_len < index_len {
        return Err(IndexError::Truncated {
            len: shard_len,
            need: index_len,
        });
    }
    Ok(match location {
        IndexLocation::Start => (0, index_len),
        IndexLocation::End => (shard_len - index_len, shard_len),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_CODECS: [IndexCodecs; 4] = [
        IndexCodecs {
            endian: Endian::Little,
            crc32c: true,
        },
        IndexCodecs {
            endian: Endian::Little,
            crc32c: false,
        },
        IndexCodecs {
            endian: Endian::Big,
            crc32c: true,
        },
        IndexCodecs {
            endian: Endian::Big,
            crc32c: false,
        },
    ];

    fn sample() -> ShardIndex {
        ShardIndex::from_entries(vec![
            Some(ChunkRange {
                offset: 0,
                nbytes: 10,
            }),
            None,
            Some(ChunkRange {
                offset: 10,
                nbytes: 0,
            }),
            Some(ChunkRange {
                offset: 10,
                nbytes: 7,
            }),
        ])
    }

    #[test]
    fn round_trip_every_codec_chain() {
        for codecs in ALL_CODECS {
            let idx = sample();
            let bytes = idx.encode(codecs);
            assert_eq!(bytes.len() as u64, codecs.encoded_len(4).unwrap());
            assert_eq!(ShardIndex::decode(&bytes, codecs, 4).unwrap(), idx);
        }
    }

    #[test]
    fn round_trip_empty_and_single() {
        for codecs in ALL_CODECS {
            for n in [0usize, 1, 17] {
                let idx = ShardIndex::empty(n);
                let bytes = idx.encode(codecs);
                assert_eq!(ShardIndex::decode(&bytes, codecs, n as u64).unwrap(), idx);
            }
        }
    }

    #[test]
    fn spec_example_size_is_68_bytes() {
        // ZEP 2: 4 chunks per shard, little endian + crc32c = 16 * 4 + 4 bytes.
        let c = ALL_CODECS[0];
        assert_eq!(c.encoded_len(4), Some(68));
    }

    #[test]
    fn byte_order_is_pinned() {
        let idx = ShardIndex::from_entries(vec![Some(ChunkRange {
            offset: 1,
            nbytes: 2,
        })]);
        let le = idx.encode(ALL_CODECS[1]);
        assert_eq!(le, [1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        let be = idx.encode(ALL_CODECS[3]);
        assert_eq!(be, [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]);
        let empty = ShardIndex::empty(1).encode(ALL_CODECS[1]);
        assert_eq!(empty, [0xff; 16]);
        // crc32c("") is 0; the checksum of 16 bytes of 0xff, little-endian, is pinned so
        // that a change of polynomial or byte order cannot go unnoticed.
        let with_crc = ShardIndex::empty(1).encode(ALL_CODECS[0]);
        let crc = u32::from_le_bytes(with_crc[16..].try_into().unwrap());
        assert_eq!(crc, crc32c::crc32c(&[0xff; 16]));
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn flipped_byte_fails_checksum() {
        let codecs = ALL_CODECS[0];
        let mut bytes = sample().encode(codecs);
        for i in 0..bytes.len() {
            bytes[i] ^= 0x40;
            let err = ShardIndex::decode(&bytes, codecs, 4).unwrap_err();
            assert!(
                matches!(err, IndexError::Checksum { .. }),
                "byte {i}: {err}"
            );
            bytes[i] ^= 0x40;
        }
    }

    #[test]
    fn short_index_is_truncated() {
        let codecs = ALL_CODECS[0];
        let bytes = sample().encode(codecs);
        let err = ShardIndex::decode(&bytes[..bytes.len() - 1], codecs, 4).unwrap_err();
        assert_eq!(err, IndexError::Truncated { len: 67, need: 68 });
        assert!(matches!(
            index_region(IndexLocation::End, 10, 68),
            Err(IndexError::Truncated { .. })
        ));
    }

    #[test]
    fn half_empty_entry_is_rejected() {
        let codecs = ALL_CODECS[1];
        let mut bytes = ShardIndex::empty(1).encode(codecs);
        bytes[8..].copy_from_slice(&5u64.to_le_bytes());
        assert!(matches!(
            ShardIndex::decode(&bytes, codecs, 1),
            Err(IndexError::HalfEmpty { slot: 0, .. })
        ));
    }

    #[test]
    fn huge_chunk_count_does_not_overflow() {
        assert!(matches!(
            ShardIndex::decode(&[], ALL_CODECS[0], u64::MAX / 8),
            Err(IndexError::TooLarge { .. })
        ));
    }

    #[test]
    fn validate_catches_out_of_range_overflow_and_overlap() {
        let r =
            |offset, nbytes| ShardIndex::from_entries(vec![Some(ChunkRange { offset, nbytes })]);
        // The shard is 100 bytes with the index at 84..100.
        assert!(r(0, 84).validate(100, 84, 100).is_ok());
        assert!(matches!(
            r(90, 20).validate(100, 84, 100),
            Err(IndexError::OutOfRange { .. })
        ));
        assert!(matches!(
            r(u64::MAX - 1, 5).validate(100, 84, 100),
            Err(IndexError::OutOfRange { .. })
        ));
        assert!(matches!(
            r(80, 10).validate(100, 84, 100),
            Err(IndexError::OverlapsIndex { .. })
        ));
        // Index at the start: a chunk at offset 0 overlaps it.
        assert!(matches!(
            r(0, 4).validate(100, 0, 16),
            Err(IndexError::OverlapsIndex { .. })
        ));
        // A zero-length chunk overlaps nothing.
        assert!(r(90, 0).validate(100, 84, 100).is_ok());
    }
}
