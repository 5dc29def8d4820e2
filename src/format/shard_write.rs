//! The write half of the shard codec, beside [`super::shard_read`]: where each chunk of a
//! shard being written goes, and the bytes around the chunks (the index, at the start or
//! the end, and the close-time block of [`super::times`]). Every shard shardfs writes is
//! laid out here: the local store's appends and rewrites, the in-memory and object
//! stores' whole shards, `compact`, `sample` and the tests.
//!
//! ```text
//! dense, index at end:    head = []      chunks (in the order placed)   tail = times? | index
//! dense, index at start:  head = index   chunks (in the order placed)   tail = times?
//! append (index at end):  the shard as it was | new chunks              tail = times? | index
//! ```
//!
//! `times?`: the close-time block, only when some slot has a recorded time (else a shard is
//! byte for byte what it was before close times existed). Chunks follow each other with no
//! gap; an append leaves the old bytes (and the old index) where they were, as dead space.
//!
//! No I/O: the caller writes `head`, the chunks in the order it placed them, then `tail`
//! (the local store streams them to a file without holding the chunks together; the
//! in-memory and object stores concatenate them: [`dense_shard`]). Not owned here: the
//! encodings themselves ([`super::index`], [`super::times`]), and how a write is made
//! durable (`store::local::append`, `store::rewrite`).

use super::index::IndexLocation;
use super::{ChunkRange, CloseTimes, ShardIndex, ShardLevel};

/// Where the chunks of a shard being written go: each placed chunk right after the one
/// placed before, from the first free byte. Slots neither placed nor kept are empty.
#[derive(Clone, Debug)]
pub struct Packer {
    index: ShardIndex,
    /// Where the next chunk placed goes.
    next: u64,
}

/// A shard's layout, worked out: its index, and the bytes that go before the chunks
/// (`head`) and after them (`tail`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Framed {
    pub index: ShardIndex,
    /// Written first: the encoded index when it is at the start; else nothing (and
    /// nothing for an append, which starts at the old shard's end).
    pub head: Vec<u8>,
    /// Written after the chunks: the close-time block if any, then the encoded index when
    /// it is at the end.
    pub tail: Vec<u8>,
    /// The shard's length once written.
    pub len: u64,
}

impl Packer {
    /// A dense shard of `level`: the first chunk right after an index at the start, or
    /// at byte 0.
    pub fn dense(level: &ShardLevel) -> Packer {
        Packer {
            index: ShardIndex::empty(level.n_chunks() as usize),
            next: match level.index_location {
                IndexLocation::Start => level.index_len(),
                IndexLocation::End => 0,
            },
        }
    }

    /// Chunks appended to a shard of `len` bytes of `level` (ZEP 2, "Append-only"): new
    /// chunks go after its last byte, the slots it keeps are [`Packer::keep`]t. `None`
    /// when the index is at the start: such a shard is never appended to (its index
    /// would have to move).
    pub fn append(level: &ShardLevel, len: u64) -> Option<Packer> {
        (level.index_location == IndexLocation::End).then(|| Packer {
            index: ShardIndex::empty(level.n_chunks() as usize),
            next: len,
        })
    }

    /// Place a chunk of `nbytes` in `slot` after the chunks placed so far: its range.
    pub fn place(&mut self, slot: usize, nbytes: u64) -> ChunkRange {
        let range = ChunkRange {
            offset: self.next,
            nbytes,
        };
        self.next += nbytes;
        self.index.set(slot, Some(range));
        range
    }

    /// Keep the chunk of `slot` where it already lies (an append's unchanged slots).
    pub fn keep(&mut self, slot: usize, range: ChunkRange) {
        self.index.set(slot, Some(range));
    }

    /// The index of what was placed and kept, and the bytes around the chunks, with the
    /// close times `times` (per slot; no block when none is recorded).
    pub fn finish(self, level: &ShardLevel, times: &CloseTimes) -> Framed {
        let encoded = self.index.encode(level.index_codecs);
        let mut tail = if times.any() {
            times.encode()
        } else {
            Vec::new()
        };
        let head = match level.index_location {
            IndexLocation::Start => encoded,
            IndexLocation::End => {
                tail.extend_from_slice(&encoded);
                Vec::new()
            }
        };
        Framed {
            len: self.next + tail.len() as u64,
            index: self.index,
            head,
            tail,
        }
    }
}

/// A whole dense shard of `level` and its index: `chunks` (slot, bytes) packed in the
/// order given (a shard need not hold its chunks in slot order), with the close times
/// `times`. Slots not given are empty.
pub fn dense_shard<'a>(
    level: &ShardLevel,
    chunks: impl IntoIterator<Item = (usize, &'a [u8])>,
    times: &CloseTimes,
) -> (Vec<u8>, ShardIndex) {
    let mut packer = Packer::dense(level);
    let mut body = Vec::new();
    for (slot, bytes) in chunks {
        packer.place(slot, bytes.len() as u64);
        body.extend_from_slice(bytes);
    }
    let framed = packer.finish(level, times);
    let bytes = [framed.head, body, framed.tail].concat();
    debug_assert_eq!(bytes.len() as u64, framed.len);
    (bytes, framed.index)
}

/// [`dense_shard`] of the chunks of every slot that has one (`chunks[slot]`), in slot
/// order.
pub fn dense_shard_by_slot(
    level: &ShardLevel,
    chunks: &[Option<&[u8]>],
    times: &CloseTimes,
) -> (Vec<u8>, ShardIndex) {
    let given = chunks
        .iter()
        .enumerate()
        .filter_map(|(slot, c)| c.map(|b| (slot, b)));
    dense_shard(level, given, times)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::index::{Endian, IndexCodecs, index_region};
    use crate::format::shard_read::{self, chunk_bytes};

    fn level(location: IndexLocation, endian: Endian, crc32c: bool) -> ShardLevel {
        ShardLevel {
            chunk_shape: vec![2],
            chunks_per_shard: vec![4],
            index_codecs: IndexCodecs { endian, crc32c },
            index_location: location,
        }
    }

    fn every_level() -> Vec<ShardLevel> {
        let mut out = Vec::new();
        for location in [IndexLocation::Start, IndexLocation::End] {
            for endian in [Endian::Little, Endian::Big] {
                for crc32c in [true, false] {
                    out.push(level(location, endian, crc32c));
                }
            }
        }
        out
    }

    const CHUNKS: [(usize, &[u8]); 3] = [(3, b"cdef"), (0, b"ab"), (2, b"")];

    /// Every layout reads back through the read half: each chunk where the index says,
    /// the close times when recorded, no dead space.
    #[test]
    fn dense_shards_read_back_at_either_end_with_and_without_times() {
        for l in every_level() {
            for times in [
                CloseTimes::unknown(4),
                CloseTimes::from_vec(vec![1, 0, 3, 4]),
            ] {
                let (shard, index) = dense_shard(&l, CHUNKS, &times);
                let len = shard.len() as u64;
                let (read, read_times) = shard_read::read_index_and_times(&shard[..], &l, len)
                    .unwrap_or_else(|e| panic!("{l:?}: {e:?}"));
                assert_eq!(read, index, "{l:?}");
                assert_eq!(read_times, times, "{l:?}");
                for (slot, bytes) in CHUNKS {
                    assert_eq!(chunk_bytes(&shard, index.get(slot as u64).unwrap()), bytes);
                }
                assert_eq!(index.get(1), None);
                let dead = shard_read::read_dead_space(&shard[..], &l, len, &index).unwrap();
                assert_eq!(dead, 0, "{l:?}");
                // In the order given: slot 3's chunk first.
                let first = index.get(3).unwrap().offset;
                assert_eq!(
                    first,
                    if l.index_location == IndexLocation::Start {
                        l.index_len()
                    } else {
                        0
                    }
                );
            }
        }
    }

    /// An append's tail after the old shard reads as a whole shard: kept slots where they
    /// were, new chunks after the old end, the old index dead space.
    #[test]
    fn an_append_keeps_old_ranges_and_places_new_chunks_after_the_end() {
        let l = level(IndexLocation::End, Endian::Little, true);
        assert!(Packer::append(&level(IndexLocation::Start, Endian::Little, true), 9).is_none());
        let (old, old_index) = dense_shard(&l, [(0, b"ab".as_slice())], &CloseTimes::unknown(4));
        let mut p = Packer::append(&l, old.len() as u64).unwrap();
        p.keep(0, old_index.get(0).unwrap());
        let r = p.place(2, 3);
        assert_eq!(r.offset, old.len() as u64);
        let times = CloseTimes::from_vec(vec![0, 0, 9, 0]);
        let framed = p.finish(&l, &times);
        assert!(framed.head.is_empty());
        let shard = [old.clone(), b"xyz".to_vec(), framed.tail].concat();
        assert_eq!(shard.len() as u64, framed.len);
        let (read, read_times) =
            shard_read::read_index_and_times(&shard[..], &l, framed.len).unwrap();
        assert_eq!((&read, &read_times), (&framed.index, &times));
        assert_eq!(chunk_bytes(&shard, read.get(0).unwrap()), b"ab");
        assert_eq!(chunk_bytes(&shard, read.get(2).unwrap()), b"xyz");
        let (s, e) = index_region(IndexLocation::End, framed.len, l.index_len()).unwrap();
        assert_eq!(e, framed.len);
        assert!(s > old.len() as u64);
    }

    /// Golden bytes: what the three builders this replaced wrote (`format::index::
    /// assemble_shard`, `store::rewrite::dense_shard`, `store::local::append::
    /// packed_index`; checked equal over every level, with and without close times,
    /// before they went), for chunks `ab`, none, empty and `cdef`.
    #[test]
    fn the_bytes_of_the_builders_it_replaced() {
        let by_slot: [Option<&[u8]>; 4] = [Some(b"ab"), None, Some(b""), Some(b"cdef")];
        let times = CloseTimes::from_vec(vec![1, 0, 3, 4]);
        let block = "0100000000000000000000000000000003000000000000000400000000000000\
                     534841524446532d54494d45530000010400000000000000ff04d285fe8cd641";
        let cases = [
            (
                level(IndexLocation::End, Endian::Little, true),
                &times,
                format!(
                    "616263646566{block}00000000000000000200000000000000\
                     ffffffffffffffffffffffffffffffff0200000000000000\
                     0000000000000000020000000000000004000000000000007afecb62"
                ),
            ),
            (
                level(IndexLocation::Start, Endian::Little, true),
                &times,
                format!(
                    "44000000000000000200000000000000ffffffffffffffffffffffffffffffff\
                     4600000000000000000000000000000046000000000000000400000000000000\
                     0a090be0616263646566{block}"
                ),
            ),
            (
                level(IndexLocation::Start, Endian::Big, false),
                &CloseTimes::unknown(4),
                "00000000000000400000000000000002ffffffffffffffffffffffffffffffff\
                 0000000000000042000000000000000000000000000000420000000000000004\
                 616263646566"
                    .to_string(),
            ),
        ];
        for (l, times, hex) in cases {
            let (bytes, _) = dense_shard_by_slot(&l, &by_slot, times);
            let got: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(got, hex.replace(' ', ""), "{l:?}");
        }
    }
}
