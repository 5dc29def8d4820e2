//! The blosc1 frame, as the seed's containers (bloscpack, bcolz) hold it: its 16-byte
//! header read here, and the frame decoded and encoded by c-blosc itself (the `blosc-src`
//! crate, built from c-blosc's own sources) — never by a decompressor of our own. No I/O.
//!
//! Layout (c-blosc `README_HEADER.rst`; all little-endian):
//!
//! | byte | field | meaning |
//! | --- | --- | --- |
//! | 0 | version | blosc format version (2 for c-blosc 1.x) |
//! | 1 | versionlz | the codec's format version |
//! | 2 | flags | bit 0 byte shuffle, bit 1 memcpyed, bit 2 bit shuffle, bits 5-7 codec |
//! | 3 | typesize | bytes of one element (for the shuffle) |
//! | 4..8 | nbytes | uncompressed size |
//! | 8..12 | blocksize | |
//! | 12..16 | ctbytes | size of the whole frame, header included |

use std::ffi::c_void;

/// Length of a blosc1 frame header.
pub const HEADER_LEN: usize = 16;
/// The largest frame c-blosc makes or reads (`BLOSC_MAX_BUFFERSIZE`).
pub const MAX_BUFFER: u64 = blosc_src::BLOSC_MAX_BUFFERSIZE as u64;

/// A blosc frame that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BloscError {
    #[error("blosc frame header: {0}")]
    Header(String),
    #[error("blosc could not decode the frame ({0})")]
    Decode(i32),
    #[error("blosc could not encode {0} bytes")]
    Encode(usize),
}

/// The header of a blosc1 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub version: u8,
    pub flags: u8,
    pub typesize: u8,
    pub nbytes: u32,
    pub blocksize: u32,
    pub ctbytes: u32,
}

impl FrameHeader {
    /// The header at the start of `b`; checks only what makes the sizes meaningful.
    pub fn parse(b: &[u8]) -> Result<FrameHeader, BloscError> {
        let Some(h) = b.get(..HEADER_LEN) else {
            return Err(BloscError::Header(format!(
                "{} bytes, fewer than a header",
                b.len()
            )));
        };
        let word = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        let hdr = FrameHeader {
            version: h[0],
            flags: h[2],
            typesize: h[3],
            nbytes: word(4),
            blocksize: word(8),
            ctbytes: word(12),
        };
        if hdr.version == 0 || hdr.version > 3 {
            return Err(BloscError::Header(format!("version {}", hdr.version)));
        }
        if (hdr.ctbytes as usize) < HEADER_LEN || u64::from(hdr.ctbytes) > MAX_BUFFER + 16 {
            return Err(BloscError::Header(format!("frame size {}", hdr.ctbytes)));
        }
        if u64::from(hdr.nbytes) > MAX_BUFFER {
            return Err(BloscError::Header(format!("data size {}", hdr.nbytes)));
        }
        Ok(hdr)
    }

    /// The codec's name as Zarr's `blosc` codec spells it (`cname`).
    pub fn cname(&self) -> &'static str {
        match self.flags >> 5 {
            0 => "blosclz",
            1 => "lz4",
            2 => "snappy",
            3 => "zlib",
            4 => "zstd",
            _ => "blosclz",
        }
    }

    /// The shuffle: 0 none, 1 byte shuffle, 2 bit shuffle (the numcodecs numbering).
    pub fn shuffle(&self) -> u8 {
        if self.flags & 0x04 != 0 && self.flags & 0x01 == 0 {
            2
        } else {
            self.flags & 0x01
        }
    }
}

/// The data of frame `frame`, decoded by c-blosc; the frame must say it holds `nbytes`.
pub fn decode(frame: &[u8], nbytes: usize) -> Result<Vec<u8>, BloscError> {
    let hdr = FrameHeader::parse(frame)?;
    if hdr.nbytes as usize != nbytes || (hdr.ctbytes as usize) > frame.len() {
        return Err(BloscError::Header(format!(
            "holds {} of {} bytes in {} of {} bytes",
            hdr.nbytes,
            nbytes,
            hdr.ctbytes,
            frame.len()
        )));
    }
    let frame = &frame[..hdr.ctbytes as usize];
    let mut checked = 0usize;
    // SAFETY: `frame` is a live buffer of `frame.len()` bytes and `checked` a live usize;
    // c-blosc reads no further than the length given.
    let ok = unsafe {
        blosc_src::blosc_cbuffer_validate(
            frame.as_ptr() as *const c_void,
            frame.len(),
            &mut checked,
        )
    };
    if ok != 0 || checked != nbytes {
        return Err(BloscError::Decode(ok));
    }
    let mut out = vec![0u8; nbytes];
    if nbytes == 0 {
        return Ok(out);
    }
    // SAFETY: validated above (c-blosc's check that decoding is memory-safe); `out` has
    // exactly `nbytes` writable bytes and c-blosc writes no more than `destsize`.
    let n = unsafe {
        blosc_src::blosc_decompress_ctx(
            frame.as_ptr() as *const c_void,
            out.as_mut_ptr() as *mut c_void,
            out.len(),
            1,
        )
    };
    if n < 0 || n as usize != nbytes {
        return Err(BloscError::Decode(n));
    }
    Ok(out)
}

/// `data` as a frame that c-blosc writes without compressing (level 0: the data copied
/// behind the header), with `shuffle` (0, 1, 2) and `typesize` as given.
pub fn encode_uncompressed(
    data: &[u8],
    typesize: usize,
    shuffle: u8,
) -> Result<Vec<u8>, BloscError> {
    if data.len() as u64 > MAX_BUFFER {
        return Err(BloscError::Encode(data.len()));
    }
    let mut out = vec![0u8; data.len() + HEADER_LEN];
    let cname = c"blosclz";
    // SAFETY: `data` and `out` are live, do not overlap, and `out` has `destsize` bytes
    // (nbytes + BLOSC_MAX_OVERHEAD, which c-blosc guarantees is enough); `cname` is a
    // NUL-terminated string.
    let n = unsafe {
        blosc_src::blosc_compress_ctx(
            0,
            i32::from(shuffle.min(2)),
            typesize.clamp(1, 255),
            data.len(),
            data.as_ptr() as *const c_void,
            out.as_mut_ptr() as *mut c_void,
            out.len(),
            cname.as_ptr(),
            0,
            1,
        )
    };
    if n <= 0 {
        return Err(BloscError::Encode(data.len()));
    }
    out.truncate(n as usize);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncompressed_frames_round_trip_through_c_blosc() {
        let data: Vec<u8> = (0..4000u32)
            .flat_map(|i| (i as f64).to_le_bytes())
            .collect();
        for shuffle in 0..3 {
            let f = encode_uncompressed(&data, 8, shuffle).unwrap();
            let h = FrameHeader::parse(&f).unwrap();
            assert_eq!(h.nbytes as usize, data.len());
            assert_eq!(h.ctbytes as usize, f.len());
            assert_eq!(decode(&f, data.len()).unwrap(), data);
        }
    }

    #[test]
    fn broken_frames_are_errors() {
        let data = vec![7u8; 1000];
        let f = encode_uncompressed(&data, 1, 0).unwrap();
        assert!(FrameHeader::parse(&f[..10]).is_err());
        assert!(decode(&f, 999).is_err());
        assert!(decode(&f[..f.len() - 1], 1000).is_err());
        let mut bad = f.clone();
        bad[12..16].copy_from_slice(&3u32.to_le_bytes());
        assert!(decode(&bad, 1000).is_err());
        let mut bad = f.clone();
        bad[0] = 0;
        assert!(decode(&bad, 1000).is_err());
    }
}
