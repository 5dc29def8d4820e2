//! Finding the earlier complete states of an append-only shard whose tail is torn: every
//! offset `p` where the `index_len` bytes before `p` end with a valid CRC-32C of the
//! bytes before them (a crc32c index ends exactly there). One pass over the file with a
//! rolling CRC, so a shard of any size (even one of zeros) costs `O(len)`, not
//! `O(len * index_len)`. Whether a candidate is a real state is decided by the caller.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// CRC-32C (Castagnoli), reflected polynomial.
const POLY: u32 = 0x82f6_3b78;

const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 == 1 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// The raw (no pre/post inversion) CRC register after one more byte. The register is
/// linear in (register, bytes), which is what makes the window roll.
fn step(c: u32, b: u8) -> u32 {
    TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8)
}

/// Raw register after `bytes`, from register `c`: `crc32c_append` without inversions.
fn raw(c: u32, bytes: &[u8]) -> u32 {
    !crc32c::crc32c_append(!c, bytes)
}

/// CRC-32C of a window of `w` bytes that slides one byte at a time.
///
/// With `r = raw(0, window)`: `crc32c(window) = !(raw(!0, 0^w) ^ r)`, and sliding out
/// byte `a` and in byte `b` is `r' = step(r ^ out[a], b)` where
/// `out[a] = raw(0, [a] ++ 0^(w-1))`.
pub(crate) struct RollingCrc {
    out: [u32; 256],
    zeros: u32,
}

impl RollingCrc {
    pub(crate) fn new(w: usize) -> RollingCrc {
        assert!(w > 0, "empty window");
        let pad = vec![0u8; w - 1];
        let basis: Vec<u32> = (0..8).map(|bit| raw(step(0, 1 << bit), &pad)).collect();
        let mut out = [0u32; 256];
        for (a, o) in out.iter_mut().enumerate() {
            *o = (0..8)
                .filter(|bit| a & (1 << bit) != 0)
                .fold(0, |x, bit| x ^ basis[bit]);
        }
        RollingCrc {
            out,
            zeros: raw(!0, &vec![0u8; w]),
        }
    }

    /// `r` for a first window.
    pub(crate) fn start(&self, window: &[u8]) -> u32 {
        raw(0, window)
    }

    pub(crate) fn slide(&self, r: u32, gone: u8, enter: u8) -> u32 {
        step(r ^ self.out[usize::from(gone)], enter)
    }

    pub(crate) fn crc(&self, r: u32) -> u32 {
        !(self.zeros ^ r)
    }
}

/// Reads a file front to back in blocks.
struct Sequential<'a> {
    file: &'a File,
    buf: Vec<u8>,
    pos: usize,
    next_at: u64,
}

impl<'a> Sequential<'a> {
    fn new(file: &'a File) -> Self {
        Sequential {
            file,
            buf: Vec::new(),
            pos: 0,
            next_at: 0,
        }
    }

    fn byte(&mut self) -> io::Result<u8> {
        if self.pos == self.buf.len() {
            self.buf.resize(1 << 20, 0);
            let n = self.file.read_at(&mut self.buf, self.next_at)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.truncate(n);
            self.next_at += n as u64;
            self.pos = 0;
        }
        self.pos += 1;
        Ok(self.buf[self.pos - 1])
    }
}

/// Every `p` with `index_len <= p < len` where bytes `p-4..p` (little-endian) are the
/// CRC-32C of bytes `p-index_len..p-4`, in increasing order.
pub(crate) fn crc_candidates(file: &File, len: u64, index_len: u64) -> io::Result<Vec<u64>> {
    let mut out = Vec::new();
    if index_len <= 4 || len <= index_len {
        return Ok(out);
    }
    let w = (index_len - 4) as usize;
    let roll = RollingCrc::new(w);
    let (mut lead, mut trail) = (Sequential::new(file), Sequential::new(file));
    let mut first = vec![0u8; w];
    for b in &mut first {
        *b = lead.byte()?;
    }
    let mut r = roll.start(&first);
    drop(first);
    let mut last4 = 0u32;
    for _ in 0..4 {
        last4 = (last4 >> 8) | (u32::from(lead.byte()?) << 24);
    }
    // Invariant: r = raw(0, file[p-index_len .. p-4]), last4 = file[p-4 .. p] (LE).
    let mut p = index_len;
    while p < len {
        if roll.crc(r) == last4 {
            out.push(p);
        }
        r = roll.slide(r, trail.byte()?, last4 as u8);
        last4 = (last4 >> 8) | (u32::from(lead.byte()?) << 24);
        p += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn noise(n: usize, mut seed: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    }

    #[test]
    fn rolling_crc_equals_crc32c_at_every_position() {
        let data = noise(600, 42);
        for w in [1usize, 4, 16, 68, 300] {
            let roll = RollingCrc::new(w);
            let mut r = roll.start(&data[..w]);
            for s in 0..data.len() - w {
                assert_eq!(roll.crc(r), crc32c::crc32c(&data[s..s + w]), "w {w} at {s}");
                r = roll.slide(r, data[s], data[s + w]);
            }
        }
    }

    #[test]
    fn finds_every_embedded_checksummed_block() {
        let index_len = 36u64; // 2 entries + crc
        let mut data = noise(1000, 7);
        let mut plant = |at: usize| {
            let crc = crc32c::crc32c(&data[at..at + 32]);
            data[at + 32..at + 36].copy_from_slice(&crc.to_le_bytes());
            at as u64 + index_len
        };
        let want = vec![plant(0), plant(100), plant(500)];
        let tail = plant(1000 - 36);
        // Long runs of zeros cost no more than noise, and match nothing.
        data.extend(vec![0u8; 5000]);
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        // The block ending at `len` is the current tail: never a candidate.
        assert_eq!(crc_candidates(&f, tail, index_len).unwrap(), want);
        let all = crc_candidates(&f, data.len() as u64, index_len).unwrap();
        assert_eq!(all, [want, vec![tail]].concat());
        assert!(crc_candidates(&f, 20, index_len).unwrap().is_empty());
    }
}
