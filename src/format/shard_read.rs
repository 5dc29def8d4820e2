//! The read half of the shard codec: a shard's bytes, read through a [`ByteSource`]
//! (a store file, or bytes in memory), made into what the rest of shardfs uses. It owns
//! where the index of a block lies and reading it (decoded and validated, at any nesting
//! level), the absolute range of a nested chunk, the close-time block, overlapping
//! chunks, and the dead space `compact` reclaims and `info` reports.
//!
//! Opens nothing: every byte comes from the caller's source. Not owned here: the byte
//! layouts themselves ([`super::index`], [`super::times`]), laying shards out
//! ([`super::shard_write`]), caching indices and retrying reads
//! (`store::shard`), and what `verify` reports of what it reads (`maint::check`).

use std::io;

use super::index::{IndexLocation, index_region};
use super::times;
use super::{ChunkRange, CloseTimes, IndexError, ShardIndex, ShardLevel};

/// Bytes that can be read by range: a shard's file, or a shard held in memory.
pub trait ByteSource {
    /// Fill `buf` with the bytes at `offset`, or fail with `UnexpectedEof` when the
    /// source ends first.
    fn read_into(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl ByteSource for [u8] {
    fn read_into(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let bytes = usize::try_from(offset)
            .ok()
            .and_then(|start| self.get(start..start.checked_add(buf.len())?));
        match bytes {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

/// Why an index could not be read: the source, or the index bytes.
#[derive(Debug)]
pub enum ReadError {
    Io(io::Error),
    Index(IndexError),
}

/// Read, decode and validate the `level` index of the block `base..base+len` of `src`
/// (`base` 0 and `len` the shard's length for the outermost index). A source that ends
/// before the index does is [`IndexError::Truncated`].
pub fn read_index<S: ByteSource + ?Sized>(
    src: &S,
    level: &ShardLevel,
    base: u64,
    len: u64,
) -> Result<ShardIndex, ReadError> {
    let n = level.n_chunks();
    let index_len = level
        .index_codecs
        .encoded_len(n)
        .ok_or(ReadError::Index(IndexError::TooLarge { n_chunks: n }))?;
    let (start, end) =
        index_region(level.index_location, len, index_len).map_err(ReadError::Index)?;
    let mut buf = vec![0; index_len as usize];
    src.read_into(&mut buf, base + start).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ReadError::Index(IndexError::Truncated {
                len,
                need: index_len,
            })
        } else {
            ReadError::Io(e)
        }
    })?;
    let index = ShardIndex::decode(&buf, level.index_codecs, n).map_err(ReadError::Index)?;
    index.validate(len, start, end).map_err(ReadError::Index)?;
    Ok(index)
}

/// Read the `level` index of the nested shard that is the chunk at `block` (a range
/// relative to the start of the outermost shard).
pub fn read_nested_index<S: ByteSource + ?Sized>(
    src: &S,
    level: &ShardLevel,
    block: ChunkRange,
) -> Result<ShardIndex, ReadError> {
    read_index(src, level, block.offset, block.nbytes)
}

/// The range, relative to the outermost shard, of the chunk at `inner` (relative to its
/// nested shard) of the nested shard at `block`. Both come from validated indices, so
/// the sum does not overflow.
pub fn nested_range(block: ChunkRange, inner: ChunkRange) -> ChunkRange {
    ChunkRange {
        offset: block.offset + inner.offset,
        nbytes: inner.nbytes,
    }
}

/// The bytes of the chunk at `range` (from a validated index) of the shard `data`.
pub fn chunk_bytes(data: &[u8], range: ChunkRange) -> &[u8] {
    &data[range.offset as usize..range.end() as usize]
}

/// The close times recorded in the first `len` bytes of a shard whose (valid) index is
/// `index`, if it holds a block that checks out ([`super::times`]).
pub fn read_times<S: ByteSource + ?Sized>(
    src: &S,
    level: &ShardLevel,
    len: u64,
    index: &ShardIndex,
) -> io::Result<Option<CloseTimes>> {
    let n = level.n_chunks();
    let Some(end) = times::trailer_end(level.index_location, len, level.index_len()) else {
        return Ok(None);
    };
    let mut trailer = [0u8; times::TRAILER_LEN as usize];
    let at = end - times::TRAILER_LEN;
    src.read_into(&mut trailer, at)?;
    let Some((start, stop, crc)) = times::decode_trailer(&trailer, n, at) else {
        return Ok(None);
    };
    let floor = match level.index_location {
        IndexLocation::Start => level.index_len(),
        IndexLocation::End => 0,
    };
    if start < floor {
        return Ok(None);
    }
    let mut bytes = vec![0u8; (stop - start) as usize];
    src.read_into(&mut bytes, start)?;
    Ok(times::decode_times(&bytes, crc, index, start, stop))
}

/// The outermost index of the first `len` bytes of a shard and its close times (none
/// recorded, for every slot, where no block checks out).
pub fn read_index_and_times<S: ByteSource + ?Sized>(
    src: &S,
    level: &ShardLevel,
    len: u64,
) -> Result<(ShardIndex, CloseTimes), ReadError> {
    let index = read_index(src, level, 0, len)?;
    let times = read_times(src, level, len, &index)
        .map_err(ReadError::Io)?
        .unwrap_or_else(|| CloseTimes::unknown(level.n_chunks() as usize));
    Ok((index, times))
}

/// The bytes of a shard of `len` bytes with (valid) index `index` and close times
/// `times` that nothing uses: neither a live chunk, nor the index, nor a close-time
/// block (which orders writes across mounts, and which a compacted shard keeps). What
/// `shardfs compact` reclaims and `shardfs info` calls dead.
pub fn dead_space(
    level: &ShardLevel,
    len: u64,
    index: &ShardIndex,
    times: Option<&CloseTimes>,
) -> u64 {
    let times_len = match times {
        Some(t) if t.any() => CloseTimes::encoded_len(level.n_chunks()),
        _ => 0,
    };
    len.saturating_sub(index.live_bytes() + level.index_len() + times_len)
}

/// [`dead_space`] of a shard of `len` bytes with (valid) index `index`, its close times
/// read from `src`.
pub fn read_dead_space<S: ByteSource + ?Sized>(
    src: &S,
    level: &ShardLevel,
    len: u64,
    index: &ShardIndex,
) -> io::Result<u64> {
    let times = read_times(src, level, len, index)?;
    Ok(dead_space(level, len, index, times.as_ref()))
}

/// Two stored chunks whose bytes overlap (the lower slot first). Identical ranges (one
/// chunk's bytes shared by two slots) read correctly and are allowed; zero-length chunks
/// overlap nothing.
pub fn overlapping_chunks(index: &ShardIndex) -> Option<(usize, usize)> {
    let mut live: Vec<(u64, u64, usize)> = (index.entries().iter().enumerate())
        .filter_map(|(slot, r)| {
            r.filter(|r| r.nbytes > 0)
                .map(|r| (r.offset, r.end(), slot))
        })
        .collect();
    live.sort_unstable();
    let mut reach: Option<(u64, u64, usize)> = None;
    for cur in live {
        if let Some(prev) = reach {
            if cur.0 < prev.1 && (cur.0, cur.1) != (prev.0, prev.1) {
                return Some((prev.2.min(cur.2), prev.2.max(cur.2)));
            }
            if cur.1 <= prev.1 {
                continue;
            }
        }
        reach = Some(cur);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::index::{Endian, IndexCodecs};
    use crate::format::shard_write::dense_shard;

    fn level(index_location: IndexLocation) -> ShardLevel {
        ShardLevel {
            chunk_shape: vec![1],
            chunks_per_shard: vec![3],
            index_codecs: IndexCodecs {
                endian: Endian::Little,
                crc32c: true,
            },
            index_location,
        }
    }

    #[test]
    fn bytes_read_by_range_end_with_unexpected_eof() {
        let data: &[u8] = b"abcdef";
        let mut buf = [0u8; 3];
        data.read_into(&mut buf, 3).unwrap();
        assert_eq!(&buf, b"def");
        let err = data.read_into(&mut buf, 4).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(data.read_into(&mut buf, u64::MAX).is_err());
        data.read_into(&mut [], 100).unwrap();
    }

    #[test]
    fn an_index_reads_at_either_end_and_a_short_shard_is_truncated() {
        for location in [IndexLocation::Start, IndexLocation::End] {
            let l = level(location);
            let chunks: [(usize, &[u8]); 2] = [(2, b"abc"), (0, b"xy")];
            let (shard, _) = dense_shard(&l, chunks, &CloseTimes::unknown(3));
            let len = shard.len() as u64;
            let (index, times) = read_index_and_times(&shard[..], &l, len).unwrap();
            assert_eq!(chunk_bytes(&shard, index.get(2).unwrap()), b"abc");
            assert_eq!(index.get(1), None);
            assert_eq!(times, CloseTimes::unknown(3));
            assert_eq!(dead_space(&l, len, &index, Some(&times)), 0);
            assert_eq!(read_dead_space(&shard[..], &l, len, &index).unwrap(), 0);
            // A source shorter than the length asked for: the index is cut short.
            let err = read_index(&shard[..5], &l, 0, len).unwrap_err();
            assert!(matches!(
                err,
                ReadError::Index(IndexError::Truncated { need: 52, .. })
            ));
        }
    }

    #[test]
    fn a_nested_range_is_relative_to_the_outer_shard() {
        let block = ChunkRange {
            offset: 100,
            nbytes: 60,
        };
        let inner = ChunkRange {
            offset: 8,
            nbytes: 4,
        };
        assert_eq!(
            nested_range(block, inner),
            ChunkRange {
                offset: 108,
                nbytes: 4
            }
        );
    }

    #[test]
    fn recorded_close_times_are_live_not_dead() {
        let l = level(IndexLocation::End);
        let times = CloseTimes::from_vec(vec![0, 7, 0]);
        let index = ShardIndex::from_entries(vec![
            None,
            Some(ChunkRange {
                offset: 0,
                nbytes: 4,
            }),
            None,
        ]);
        let shard = [
            b"dataDEAD".to_vec(),
            times.encode(),
            index.encode(l.index_codecs),
        ]
        .concat();
        let len = shard.len() as u64;
        let (read, read_times) = read_index_and_times(&shard[..], &l, len).unwrap();
        assert_eq!((&read, &read_times), (&index, &times));
        assert_eq!(dead_space(&l, len, &index, Some(&times)), 4);
        assert_eq!(dead_space(&l, len, &index, None), 4 + 24 + 32);
        assert_eq!(read_dead_space(&shard[..], &l, len, &index).unwrap(), 4);
    }

    #[test]
    fn overlap_finds_partial_overlaps_only() {
        let idx = |e: &[(u64, u64)]| {
            ShardIndex::from_entries(
                e.iter()
                    .map(|&(offset, nbytes)| Some(ChunkRange { offset, nbytes }))
                    .collect(),
            )
        };
        assert_eq!(
            overlapping_chunks(&idx(&[(0, 4), (4, 4), (8, 0), (2, 0)])),
            None
        );
        assert_eq!(overlapping_chunks(&idx(&[(0, 4), (0, 4)])), None);
        assert_eq!(overlapping_chunks(&idx(&[(10, 4), (0, 20)])), Some((0, 1)));
        assert_eq!(
            overlapping_chunks(&idx(&[(0, 4), (4, 4), (6, 4)])),
            Some((1, 2))
        );
        assert_eq!(
            overlapping_chunks(&idx(&[(0, 10), (12, 3), (5, 2)])),
            Some((0, 2))
        );
    }
}
