//! Checking one shard's bytes, read through a [`ByteSource`], at every nesting level: its
//! index decodes, live chunks overlap neither each other nor the index, fixed-size chunks
//! have their size; unusual but readable entries are warnings. The bytes are parsed by
//! [`crate::format::shard_read`]; this module owns what is reported of them. No locks and
//! no repair ([`mod@super::verify`]).

use std::io;

use crate::format::shard_read::{self, ByteSource, ReadError};
use crate::format::{ChunkRange, ShardIndex, ShardLayout};

/// The findings of checking one shard as it is (or as if it ended at `len`).
pub(super) struct Checked {
    /// The outermost index itself does not read (the case a torn tail shows).
    pub(super) outer_unreadable: bool,
    pub(super) problems: Vec<String>,
    pub(super) warnings: Vec<String>,
    /// Stored chunks at the outermost level.
    pub(super) stored: usize,
}

/// Check the shard in `file` as if it were `len` bytes long, at every nesting level.
pub(super) fn check<S: ByteSource + ?Sized>(file: &S, len: u64, layout: &ShardLayout) -> Checked {
    let mut c = Checked {
        outer_unreadable: false,
        problems: Vec::new(),
        warnings: Vec::new(),
        stored: 0,
    };
    let whole = ChunkRange {
        offset: 0,
        nbytes: len,
    };
    match check_block(file, layout, 0, whole, "", &mut c) {
        Ok(Some(index)) => c.stored = index.stored(),
        Ok(None) => c.outer_unreadable = true,
        Err(e) => c.problems.push(format!("I/O error: {e}")),
    }
    c
}

/// Check the block at `block` (relative to the outermost shard) as a shard of level `l`
/// (and below); `None` when its index does not read.
fn check_block<S: ByteSource + ?Sized>(
    file: &S,
    layout: &ShardLayout,
    l: usize,
    block: ChunkRange,
    at: &str,
    c: &mut Checked,
) -> io::Result<Option<ShardIndex>> {
    let index = match shard_read::read_nested_index(file, &layout.levels[l], block) {
        Ok(index) => index,
        Err(ReadError::Index(e)) => {
            c.problems.push(format!("{at}index: {e}"));
            return Ok(None);
        }
        Err(ReadError::Io(e)) => return Err(e),
    };
    if let Some((a, b)) = shard_read::overlapping_chunks(&index) {
        c.problems
            .push(format!("{at}inner chunks {a} and {b} overlap"));
    }
    c.warnings
        .extend(unusual(&index).into_iter().map(|w| format!("{at}{w}")));
    if l + 1 == layout.levels.len()
        && let Some(want) = layout.fixed_chunk_len
    {
        for (slot, r) in index.entries().iter().enumerate() {
            if let Some(r) = r
                && r.nbytes != want
            {
                c.problems.push(format!(
                    "{at}inner chunk {slot} is {} bytes; the array's codecs (no \
                     compression) make every chunk {want} bytes: Zarr readers cannot \
                     decode it",
                    r.nbytes
                ));
            }
        }
    }
    if l + 1 < layout.levels.len() {
        for (slot, r) in index.entries().iter().enumerate() {
            if let Some(r) = r {
                let at = format!("{at}nested shard {slot} (level {}): ", l + 1);
                let nested = shard_read::nested_range(block, *r);
                check_block(file, layout, l + 1, nested, &at, c)?;
            }
        }
    }
    Ok(Some(index))
}

/// Readable but unusual entries: slots that share one chunk's bytes, and chunks of
/// length 0 (not the empty marker: a reader decodes zero bytes for them).
fn unusual(index: &ShardIndex) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen: std::collections::HashMap<(u64, u64), usize> = Default::default();
    for (slot, r) in index.entries().iter().enumerate() {
        let Some(r) = r else { continue };
        if r.nbytes == 0 {
            out.push(format!(
                "inner chunk {slot} has length 0 at offset {} (stored, but empty)",
                r.offset
            ));
        } else if let Some(first) = seen.insert((r.offset, r.nbytes), slot) {
            out.push(format!(
                "inner chunks {first} and {slot} share the same bytes (a duplicate index entry)"
            ));
        }
    }
    out
}

/// No findings (a shard that is not there to check).
pub(super) fn check_nothing() -> Checked {
    Checked {
        outer_unreadable: false,
        problems: Vec::new(),
        warnings: Vec::new(),
        stored: 0,
    }
}
