//! The bloscpack file (seed 003, "Monolithic format"; bloscpack 0.16 `headers.py`, format
//! version 3): its header, metadata section, offsets table and the table of its chunks,
//! and the Zarr array it is shown as. No I/O: the caller hands in the file's first bytes
//! (and more when [`BloscpackError::NeedMore`] asks) and the frame headers it reads.
//!
//! ```text
//! | header (32) | metadata header (32) | metadata | pad | meta checksum | offsets | chunk | checksum | chunk | ...
//! ```
//!
//! Header (little-endian):
//!
//! | bytes | field | |
//! | --- | --- | --- |
//! | 0..4 | magic | `blpk` |
//! | 4 | version | 3 |
//! | 5 | options | bit 0: offsets present, bit 1: metadata present |
//! | 6 | checksum | 0 none, 1 adler32, 2 crc32, 3 md5, 4 sha1, 5 sha224, 6 sha256, 7 sha384, 8 sha512 |
//! | 7 | typesize | |
//! | 8..12 | chunk-size | i32, bytes of every chunk but the last; -1 unknown |
//! | 12..16 | last-chunk | i32; -1 unknown |
//! | 16..24 | nchunks | i64; -1 unknown |
//! | 24..32 | max-app-chunks | i64: spare offset slots for appends |
//!
//! Metadata header: `magic_format` (8, `JSON` padded with NULs), `meta_options` (1),
//! `meta_checksum` (1, as above), `meta_codec` (1: 0 none, 1 zlib), `meta_level` (1),
//! `meta_size`, `max_meta_size`, `meta_comp_size` (u32 each), `user_codec` (8). Then
//! `meta_comp_size` bytes of (compressed) JSON, zeros up to `max_meta_size`, and the
//! checksum of the stored bytes. The offsets table holds `nchunks + max-app-chunks` i64
//! (-1 unused). Each chunk is one blosc1 frame followed by the checksum of its bytes.

use serde_json::{Map, Value};

use super::blosc::{self, FrameHeader};
use super::container::{BloscCodec, Dtype, Order, ShownArray};

pub const MAGIC: &[u8; 4] = b"blpk";
pub const HEADER_LEN: usize = 32;
pub const META_HEADER_LEN: usize = 32;
/// The format version this module reads.
pub const VERSION: u8 = 3;
/// Largest metadata section read.
pub const MAX_META: u64 = 16 << 20;
/// Most chunks in one file this module lists.
pub const MAX_CHUNKS: u64 = 1 << 24;
/// The level shown for the codec: frames do not record the one they were made with.
pub const DEFAULT_CLEVEL: u8 = 5;

/// Why a bloscpack file cannot be shown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BloscpackError {
    /// Not an error: the first `0` bytes of the file are needed to go on.
    #[error("needs the first {0} bytes")]
    NeedMore(u64),
    #[error("no bloscpack magic")]
    Magic,
    #[error("bloscpack format version {0} (3 is read)")]
    Version(u8),
    #[error("truncated: {0}")]
    Truncated(String),
    #[error("bad header: {0}")]
    Header(String),
    #[error("metadata: {0}")]
    Metadata(String),
    #[error("chunk {chunk}: {why}")]
    Chunk { chunk: u64, why: String },
    #[error("reading the file: {0}")]
    Read(String),
}

/// The checksum after each chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksum {
    None,
    Adler32,
    Crc32,
    Md5,
    Sha1,
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

impl Checksum {
    pub fn from_code(c: u8) -> Option<Checksum> {
        use Checksum::*;
        [
            None, Adler32, Crc32, Md5, Sha1, Sha224, Sha256, Sha384, Sha512,
        ]
        .get(c as usize)
        .copied()
    }

    pub fn name(self) -> &'static str {
        use Checksum::*;
        match self {
            None => "none",
            Adler32 => "adler32",
            Crc32 => "crc32",
            Md5 => "md5",
            Sha1 => "sha1",
            Sha224 => "sha224",
            Sha256 => "sha256",
            Sha384 => "sha384",
            Sha512 => "sha512",
        }
    }

    /// Bytes of the digest.
    pub fn digest_len(self) -> u64 {
        use Checksum::*;
        match self {
            None => 0,
            Adler32 | Crc32 => 4,
            Md5 => 16,
            Sha1 => 20,
            Sha224 => 28,
            Sha256 => 32,
            Sha384 => 48,
            Sha512 => 64,
        }
    }

    /// The digest of `data` as bloscpack stores it (zlib's two as little-endian u32).
    pub fn digest(self, data: &[u8]) -> Vec<u8> {
        use sha2::Digest;
        match self {
            Checksum::None => Vec::new(),
            Checksum::Adler32 => {
                let mut a = adler2::Adler32::new();
                a.write_slice(data);
                a.checksum().to_le_bytes().to_vec()
            }
            Checksum::Crc32 => crc32fast::hash(data).to_le_bytes().to_vec(),
            Checksum::Md5 => md5::Md5::digest(data).to_vec(),
            Checksum::Sha1 => sha1::Sha1::digest(data).to_vec(),
            Checksum::Sha224 => sha2::Sha224::digest(data).to_vec(),
            Checksum::Sha256 => sha2::Sha256::digest(data).to_vec(),
            Checksum::Sha384 => sha2::Sha384::digest(data).to_vec(),
            Checksum::Sha512 => sha2::Sha512::digest(data).to_vec(),
        }
    }
}

/// The 32-byte header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub offsets: bool,
    pub metadata: bool,
    pub checksum: Checksum,
    pub typesize: u8,
    /// `None`: unknown (-1).
    pub chunk_size: Option<u32>,
    pub last_chunk: Option<u32>,
    pub nchunks: Option<u64>,
    pub max_app_chunks: u64,
}

impl Header {
    pub fn parse(b: &[u8]) -> Result<Header, BloscpackError> {
        if b.len() < 4 || &b[..4] != MAGIC {
            return Err(if b.len() < 4 {
                BloscpackError::Truncated(format!("{} bytes", b.len()))
            } else {
                BloscpackError::Magic
            });
        }
        let Some(h) = b.get(..HEADER_LEN) else {
            return Err(BloscpackError::Truncated(format!(
                "{} bytes, fewer than the header",
                b.len()
            )));
        };
        if h[4] != VERSION {
            return Err(BloscpackError::Version(h[4]));
        }
        let i32_at = |i: usize| i32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        let i64_at = |i: usize| i64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));
        let size = |v: i32, what: &str| match v {
            -1 => Ok(None),
            v if v >= 0 => Ok(Some(v as u32)),
            v => Err(BloscpackError::Header(format!("{what} {v}"))),
        };
        let checksum = Checksum::from_code(h[6])
            .ok_or_else(|| BloscpackError::Header(format!("checksum code {}", h[6])))?;
        let nchunks = match i64_at(16) {
            -1 => None,
            n if (0..=MAX_CHUNKS as i64).contains(&n) => Some(n as u64),
            n => return Err(BloscpackError::Header(format!("nchunks {n}"))),
        };
        let max_app_chunks = match i64_at(24) {
            n if (0..=MAX_CHUNKS as i64).contains(&n) => n as u64,
            n => return Err(BloscpackError::Header(format!("max-app-chunks {n}"))),
        };
        Ok(Header {
            offsets: h[5] & 1 != 0,
            metadata: h[5] & 2 != 0,
            checksum,
            typesize: h[7],
            chunk_size: size(i32_at(8), "chunk-size")?,
            last_chunk: size(i32_at(12), "last-chunk")?,
            nchunks,
            max_app_chunks,
        })
    }
}

/// Header, metadata and offsets: everything before the first chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct Prefix {
    pub header: Header,
    /// The metadata document, where there is one.
    pub metadata: Option<Value>,
    /// The offsets table (`nchunks` entries; -1 unknown), where there is one.
    pub offsets: Option<Vec<i64>>,
    /// Where the first chunk starts when the frames are walked.
    pub data_start: u64,
}

/// Header, metadata and offsets from the first bytes `b` of a file of `file_len` bytes:
/// [`BloscpackError::NeedMore`] when `b` is too short to hold them.
pub fn parse_prefix(b: &[u8], file_len: u64) -> Result<Prefix, BloscpackError> {
    if (b.len() as u64) < file_len.min(HEADER_LEN as u64) {
        return Err(BloscpackError::NeedMore(HEADER_LEN as u64));
    }
    let header = Header::parse(b)?;
    let mut pos = HEADER_LEN as u64;
    let need = |end: u64| -> Result<(), BloscpackError> {
        if end > file_len {
            Err(BloscpackError::Truncated(format!(
                "{end} bytes of header, metadata and offsets in a file of {file_len}"
            )))
        } else if end > b.len() as u64 {
            Err(BloscpackError::NeedMore(end))
        } else {
            Ok(())
        }
    };
    let mut metadata = None;
    if header.metadata {
        need(pos + META_HEADER_LEN as u64)?;
        let m = &b[pos as usize..pos as usize + META_HEADER_LEN];
        let u32_at = |i: usize| u32::from_le_bytes(m[i..i + 4].try_into().expect("4 bytes"));
        let magic = &m[..8];
        let checksum = Checksum::from_code(m[9])
            .ok_or_else(|| BloscpackError::Metadata(format!("checksum code {}", m[9])))?;
        let (codec, size, max_size, comp_size) = (m[10], u32_at(12), u32_at(16), u32_at(20));
        if magic.split(|&c| c == 0).next() != Some(b"JSON".as_slice()) {
            return Err(BloscpackError::Metadata("not JSON".into()));
        }
        if comp_size > max_size || u64::from(max_size) > MAX_META || u64::from(size) > MAX_META {
            return Err(BloscpackError::Metadata(format!(
                "sizes {size}, {comp_size} of {max_size}"
            )));
        }
        let start = pos + META_HEADER_LEN as u64;
        let end = start + u64::from(max_size) + checksum.digest_len();
        need(end)?;
        let stored = &b[start as usize..start as usize + comp_size as usize];
        let digest = &b[(start + u64::from(max_size)) as usize..end as usize];
        if checksum.digest(stored) != digest {
            return Err(BloscpackError::Metadata(format!(
                "{} checksum mismatch",
                checksum.name()
            )));
        }
        let json = match codec {
            0 => stored.to_vec(),
            1 => inflate(stored, size as usize)?,
            c => return Err(BloscpackError::Metadata(format!("codec {c}"))),
        };
        metadata = Some(
            serde_json::from_slice(&json).map_err(|e| BloscpackError::Metadata(e.to_string()))?,
        );
        pos = end;
    }
    let mut offsets = None;
    if header.offsets {
        let n = header.nchunks.ok_or_else(|| {
            BloscpackError::Header("an offsets table with an unknown number of chunks".into())
        })?;
        let slots = n + header.max_app_chunks;
        let end = pos + 8 * slots;
        need(end)?;
        let table = &b[pos as usize..pos as usize + 8 * n as usize];
        offsets = Some(
            table
                .chunks_exact(8)
                .map(|w| i64::from_le_bytes(w.try_into().expect("8 bytes")))
                .collect(),
        );
        pos = end;
    }
    Ok(Prefix {
        header,
        metadata,
        offsets,
        data_start: pos,
    })
}

fn inflate(data: &[u8], size: usize) -> Result<Vec<u8>, BloscpackError> {
    use std::io::Read;
    let mut out = Vec::with_capacity(size);
    flate2::read::ZlibDecoder::new(data)
        .take(size as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| BloscpackError::Metadata(format!("zlib: {e}")))?;
    if out.len() != size {
        return Err(BloscpackError::Metadata(format!(
            "{} bytes decompressed, {size} said",
            out.len()
        )));
    }
    Ok(out)
}

/// One chunk of a bloscpack file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkEntry {
    /// Where its frame starts in the file.
    pub offset: u64,
    /// The frame's header.
    pub frame: FrameHeader,
}

impl ChunkEntry {
    /// Bytes of the frame.
    pub fn frame_len(&self) -> u64 {
        u64::from(self.frame.ctbytes)
    }
}

/// The chunks of a file of `file_len` bytes with prefix `p`: their offsets (the table's,
/// or found by walking the frames where there is none) checked against the frames'
/// headers, which `frame_at` reads (16 bytes at an offset). A frame that overruns the
/// file, or whose size disagrees with the header's chunk sizes or the offsets table, is
/// an error.
pub fn chunk_table(
    p: &Prefix,
    file_len: u64,
    mut frame_at: impl FnMut(u64) -> std::io::Result<[u8; blosc::HEADER_LEN]>,
) -> Result<Vec<ChunkEntry>, BloscpackError> {
    let h = &p.header;
    let cks = h.checksum.digest_len();
    let mut chunks = Vec::new();
    let mut pos = p.data_start;
    let mut i = 0u64;
    loop {
        match h.nchunks {
            Some(n) if i >= n => break,
            None if pos >= file_len => break,
            _ => {}
        }
        if i >= MAX_CHUNKS {
            return Err(BloscpackError::Header("too many chunks".into()));
        }
        let err = |why: String| BloscpackError::Chunk { chunk: i, why };
        let listed = p.offsets.as_ref().and_then(|o| o.get(i as usize).copied());
        let offset = match listed {
            Some(o) if o >= 0 => {
                let o = o as u64;
                if o < p.data_start || o > file_len {
                    return Err(err(format!(
                        "offset {o} outside the chunks (file of {file_len})"
                    )));
                }
                o
            }
            Some(-1) | None => pos,
            Some(o) => return Err(err(format!("offset {o}"))),
        };
        if offset + blosc::HEADER_LEN as u64 > file_len {
            return Err(BloscpackError::Truncated(format!(
                "chunk {i} at {offset} in a file of {file_len}"
            )));
        }
        let raw = frame_at(offset).map_err(|e| BloscpackError::Read(e.to_string()))?;
        let frame = FrameHeader::parse(&raw).map_err(|e| err(e.to_string()))?;
        let end = offset + u64::from(frame.ctbytes) + cks;
        if end > file_len {
            return Err(BloscpackError::Truncated(format!(
                "chunk {i} ends at {end}, the file at {file_len}"
            )));
        }
        chunks.push(ChunkEntry { offset, frame });
        pos = end;
        i += 1;
    }
    check_sizes(h, &chunks)?;
    Ok(chunks)
}

/// Every chunk but the last holds `chunk-size` bytes, the last `last-chunk`, as the
/// header says (where it says).
fn check_sizes(h: &Header, chunks: &[ChunkEntry]) -> Result<(), BloscpackError> {
    let n = chunks.len();
    for (i, c) in chunks.iter().enumerate() {
        let want = if i + 1 == n {
            h.last_chunk
        } else {
            h.chunk_size
        };
        if let Some(want) = want
            && c.frame.nbytes != want
        {
            return Err(BloscpackError::Chunk {
                chunk: i as u64,
                why: format!(
                    "its frame holds {} bytes, the header says {want}",
                    c.frame.nbytes
                ),
            });
        }
    }
    let full = chunks.first().map(|c| c.frame.nbytes);
    if let Some((_, rest)) = chunks.split_last()
        && rest.iter().any(|c| Some(c.frame.nbytes) != full)
    {
        return Err(BloscpackError::Header("chunks of different sizes".into()));
    }
    if n > 1 && chunks[n - 1].frame.nbytes > chunks[0].frame.nbytes {
        return Err(BloscpackError::Header(
            "a last chunk larger than the others".into(),
        ));
    }
    Ok(())
}

/// Whether the digest stored after a chunk's frame is the frame's.
pub fn verify(checksum: Checksum, frame: &[u8], stored: &[u8]) -> bool {
    checksum.digest(frame) == stored
}

/// The Zarr array a file is shown as: from numpy metadata (`dtype`, `shape`, `order`)
/// where the chunks fall on whole rows (of the order's leading axis), else 1-D in the
/// stored order; 1-D bytes where there is no usable metadata.
pub fn shown_array(p: &Prefix, chunks: &[ChunkEntry]) -> Result<ShownArray, String> {
    let total: u64 = chunks.iter().map(|c| u64::from(c.frame.nbytes)).sum();
    let chunk_bytes = chunks.first().map_or(0, |c| u64::from(c.frame.nbytes));
    let first = chunks.first().map(|c| c.frame);
    let codec = BloscCodec {
        cname: first.map_or("blosclz", |f| f.cname()),
        clevel: DEFAULT_CLEVEL,
        shuffle: first.map_or(0, |f| f.shuffle()),
        typesize: first.map_or(p.header.typesize, |f| f.typesize),
    };
    let mut attributes = Map::new();
    let numpy = match &p.metadata {
        Some(m) if m.get("container").and_then(Value::as_str) == Some("numpy") => Some(m),
        Some(m) => {
            attributes.insert("bloscpack_metadata".into(), m.clone());
            None
        }
        None => None,
    };
    let bytes = |attributes| ShownArray {
        dtype: Dtype::BYTES,
        shape: vec![total],
        order: Order::C,
        chunk_len: chunk_bytes.max(1),
        fill: Value::from(0),
        codec: codec.clone(),
        attributes,
        dimension_names: None,
    };
    let Some(m) = numpy else {
        return Ok(bytes(attributes));
    };
    let (dtype, shape, order) = numpy_meta(m)?;
    let elements = shape
        .iter()
        .try_fold(1u64, |a, &n| a.checked_mul(n))
        .ok_or("shape too large")?;
    let size = u64::from(dtype.size);
    if elements.checked_mul(size) != Some(total) {
        return Err(format!(
            "the shape holds {elements} elements of {size} bytes, the chunks {total} bytes"
        ));
    }
    let mut a = ShownArray {
        dtype,
        shape: shape.clone(),
        order,
        chunk_len: 1,
        fill: super::container::v3_fill(dtype, &Value::from(0)),
        codec: codec.clone(),
        attributes,
        dimension_names: None,
    };
    if shape.is_empty() {
        a.shape = vec![elements];
    }
    let axis = a.chunk_axis();
    let row_bytes = a
        .shape
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != axis)
        .fold(size, |acc, (_, &n)| acc.saturating_mul(n));
    if chunks.is_empty() {
        a.chunk_len = a.shape[axis].max(1);
    } else if row_bytes > 0 && chunk_bytes.is_multiple_of(row_bytes) && chunk_bytes > 0 {
        a.chunk_len = chunk_bytes / row_bytes;
    } else if chunk_bytes.is_multiple_of(size) && chunk_bytes > 0 {
        a.shape = vec![elements];
        a.chunk_len = chunk_bytes / size;
        a.order = Order::C;
    } else {
        return Ok(bytes(a.attributes));
    }
    Ok(a)
}

/// The `dtype`, `shape` and `order` of a bloscpack file's numpy metadata.
fn numpy_meta(m: &Value) -> Result<(Dtype, Vec<u64>, Order), String> {
    let dtype = m
        .get("dtype")
        .and_then(Value::as_str)
        .and_then(Dtype::parse)
        .ok_or_else(|| format!("dtype {} is no plain number type", m["dtype"]))?;
    let shape: Vec<u64> = m
        .get("shape")
        .and_then(Value::as_array)
        .and_then(|s| s.iter().map(Value::as_u64).collect())
        .ok_or("no shape")?;
    let order = match m.get("order").and_then(Value::as_str) {
        Some("F") => Order::F,
        _ => Order::C,
    };
    Ok((dtype, shape, order))
}

#[cfg(test)]
#[path = "bloscpack_tests.rs"]
pub(crate) mod tests;
