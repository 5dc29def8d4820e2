//! Close times: shardfs's own per-chunk record of when each chunk of a shard was last
//! written or deleted, kept *inside* the shard so that one append (or one PUT) commits
//! the chunks and their times together. The merge rule of `write::merge` (last close
//! wins) compares these. Layout mirrored in `docs/FORMAT.md`, "Close times".
//!
//! ZEP 2 lets a shard hold bytes no index entry points to; the block is such bytes, so
//! every other reader sees a plain valid shard. It sits just before the index (index at
//! the end) or at the very end of the file (index at the start):
//!
//! ```text
//!   ... chunks ... | times: n × u64 LE | trailer (32 bytes) | index (index at end)
//!   index | ... chunks ... | times: n × u64 LE | trailer (32 bytes)     (index at start)
//!
//! trailer:
//!    0..16  magic     b"SHARDFS-TIMES\x00\x00\x01"   (the last byte is the version)
//!   16..24  n         u64 LE   slots (the outermost index's chunk count)
//!   24..28  times_crc u32 LE   CRC-32C of the n × 8 bytes of times
//!   28..32  crc       u32 LE   CRC-32C of trailer bytes 0..28
//! ```
//!
//! A time is nanoseconds since the Unix epoch at the close (or fsync, rename, unlink)
//! that committed the slot's current state; `0` means none recorded (a chunk written by
//! another tool, or before close times existed). An empty slot with a time is a delete.
//! A block that does not check out (magic, CRCs, `n`, or overlapping a live chunk) is no
//! block: the shard simply has no recorded times.

use super::index::IndexLocation;
use super::{ChunkRange, ShardIndex};

/// First bytes of the trailer; the last byte is the version.
pub const TIMES_MAGIC: [u8; 16] = *b"SHARDFS-TIMES\x00\x00\x01";
/// Bytes of the trailer after the times.
pub const TRAILER_LEN: u64 = 32;

/// Per-slot close times of one shard (`0`: none recorded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloseTimes(Vec<u64>);

impl CloseTimes {
    /// No recorded time for any of `n` slots.
    pub fn unknown(n: usize) -> Self {
        CloseTimes(vec![0; n])
    }

    pub fn from_vec(times: Vec<u64>) -> Self {
        CloseTimes(times)
    }

    pub fn get(&self, slot: usize) -> u64 {
        self.0.get(slot).copied().unwrap_or(0)
    }

    pub fn set(&mut self, slot: usize, time: u64) {
        self.0[slot] = time;
    }

    pub fn as_slice(&self) -> &[u64] {
        &self.0
    }

    /// Whether any slot has a recorded time (else no block is written at all, and a
    /// shard stays byte for byte what it was before close times existed).
    pub fn any(&self) -> bool {
        self.0.iter().any(|&t| t != 0)
    }

    /// The times and the trailer, to be written as one piece.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.0.len() * 8 + TRAILER_LEN as usize);
        for t in &self.0 {
            out.extend_from_slice(&t.to_le_bytes());
        }
        let times_crc = crc32c::crc32c(&out);
        let mut trailer = [0u8; TRAILER_LEN as usize];
        trailer[..16].copy_from_slice(&TIMES_MAGIC);
        trailer[16..24].copy_from_slice(&(self.0.len() as u64).to_le_bytes());
        trailer[24..28].copy_from_slice(&times_crc.to_le_bytes());
        let crc = crc32c::crc32c(&trailer[..28]);
        trailer[28..].copy_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&trailer);
        out
    }

    /// Length of [`CloseTimes::encode`]'s output for `n` slots.
    pub fn encoded_len(n: u64) -> u64 {
        n * 8 + TRAILER_LEN
    }
}

/// Where the trailer would end in a shard of `len` bytes whose index is `index_len` bytes
/// at `location`; `None` if the file is too short to hold one.
pub fn trailer_end(location: IndexLocation, len: u64, index_len: u64) -> Option<u64> {
    let end = match location {
        IndexLocation::End => len.checked_sub(index_len)?,
        IndexLocation::Start => len,
    };
    (end >= TRAILER_LEN
        + if location == IndexLocation::Start {
            index_len
        } else {
            0
        })
    .then_some(end)
}

/// Decode a trailer (the 32 bytes ending at [`trailer_end`]): the byte range of the times
/// it describes, or `None` if these bytes are not a trailer for `n` slots.
pub fn decode_trailer(trailer: &[u8], n: u64, trailer_at: u64) -> Option<(u64, u64, u32)> {
    let t: &[u8; TRAILER_LEN as usize] = trailer.try_into().ok()?;
    let crc = u32::from_le_bytes(t[28..].try_into().ok()?);
    if t[..16] != TIMES_MAGIC || crc != crc32c::crc32c(&t[..28]) {
        return None;
    }
    if u64::from_le_bytes(t[16..24].try_into().ok()?) != n {
        return None;
    }
    let start = trailer_at.checked_sub(n.checked_mul(8)?)?;
    Some((
        start,
        trailer_at,
        u32::from_le_bytes(t[24..28].try_into().ok()?),
    ))
}

/// The times in `bytes` (the range [`decode_trailer`] named), if their CRC is `crc` and
/// the block `start..end` overlaps no live chunk of `index` (else the bytes are chunk data
/// that happen to look like a trailer).
pub fn decode_times(
    bytes: &[u8],
    crc: u32,
    index: &ShardIndex,
    start: u64,
    end: u64,
) -> Option<CloseTimes> {
    if crc32c::crc32c(bytes) != crc || bytes.len() as u64 != end - start {
        return None;
    }
    let overlaps = |r: &ChunkRange| r.nbytes > 0 && r.offset < end + TRAILER_LEN && start < r.end();
    if index.entries().iter().flatten().any(overlaps) {
        return None;
    }
    Some(CloseTimes(
        bytes
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8")))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_and_reject_every_flipped_byte() {
        let times = CloseTimes::from_vec(vec![0, 17, u64::MAX, 5]);
        let enc = times.encode();
        assert_eq!(enc.len() as u64, CloseTimes::encoded_len(4));
        let at = enc.len() as u64 - TRAILER_LEN;
        let index = ShardIndex::empty(4);
        let (s, e, crc) = decode_trailer(&enc[at as usize..], 4, at).unwrap();
        assert_eq!((s, e), (0, at));
        assert_eq!(
            decode_times(&enc[..at as usize], crc, &index, s, e),
            Some(times.clone())
        );
        // Another slot count is not this block.
        assert!(decode_trailer(&enc[at as usize..], 5, at).is_none());
        for i in 0..enc.len() {
            let mut bad = enc.clone();
            bad[i] ^= 0x40;
            let decoded = decode_trailer(&bad[at as usize..], 4, at)
                .and_then(|(s, e, crc)| decode_times(&bad[..at as usize], crc, &index, s, e));
            assert!(decoded.is_none(), "flipped byte {i} accepted");
        }
    }

    #[test]
    fn a_block_overlapping_a_live_chunk_is_chunk_data() {
        let enc = CloseTimes::from_vec(vec![1, 2]).encode();
        let at = enc.len() as u64 - TRAILER_LEN;
        let (s, e, crc) = decode_trailer(&enc[at as usize..], 2, at).unwrap();
        let index = ShardIndex::from_entries(vec![
            Some(ChunkRange {
                offset: 4,
                nbytes: 8,
            }),
            None,
        ]);
        assert!(decode_times(&enc[..at as usize], crc, &index, s, e).is_none());
    }

    #[test]
    fn the_trailer_sits_before_an_end_index_or_at_the_end() {
        assert_eq!(trailer_end(IndexLocation::End, 100, 36), Some(64));
        assert_eq!(trailer_end(IndexLocation::End, 40, 36), None);
        assert_eq!(trailer_end(IndexLocation::Start, 100, 36), Some(100));
        assert_eq!(trailer_end(IndexLocation::Start, 60, 36), None);
    }
}
