//! The bcolz rootdir (seed 003, "Chunked format"; bcolz `carray_ext.pyx`, as
//! bcolz-zipline 1.13 writes it): the JSON files of a carray and a ctable, the chunk
//! files, and the Zarr array a carray is shown as. No I/O.
//!
//! ```text
//! D/meta/sizes      {"shape": [n, ...], "nbytes": .., "cbytes": ..}
//! D/meta/storage    {"dtype": "float64", "cparams": {"clevel": 5, "shuffle": 1, "cname": "lz4"},
//!                    "chunklen": 16384, "expectedlen": .., "dflt": 0.0}
//! D/__attrs__       the user's attributes (JSON object; may be missing)
//! D/data/__<i>.blp  chunk i (i < ceil(n / chunklen)): a 16-byte bloscpack header of
//!                   format 1 (`blpk`, version, 3 reserved, nchunks = 1 as i64), then one
//!                   blosc1 frame of `chunklen` rows (the last one holds the rest)
//! T/__rootdirs__    a ctable: {"names": [...]}, each column a carray rootdir T/<name>
//! T/__attrs__       the table's attributes
//! ```

use serde_json::{Map, Value};

use super::blosc::{self, FrameHeader};
use super::container::{self, BloscCodec, Dtype, Order, ShownArray};

/// Length of the bloscpack header of a chunk file.
pub const CHUNK_HEADER_LEN: usize = 16;
/// Largest JSON file of a rootdir that is read.
pub const MAX_JSON: u64 = 1 << 20;

pub const SIZES: &str = "meta/sizes";
pub const STORAGE: &str = "meta/storage";
pub const ATTRS: &str = "__attrs__";
pub const ROOTDIRS: &str = "__rootdirs__";
pub const DATA: &str = "data";

/// The file of chunk `i`, relative to the rootdir.
pub fn chunk_file(i: u64) -> String {
    format!("data/__{i}.blp")
}

/// What a carray's `meta/sizes` and `meta/storage` say.
#[derive(Debug, Clone, PartialEq)]
pub struct CarrayMeta {
    pub shape: Vec<u64>,
    pub dtype: Dtype,
    pub chunklen: u64,
    pub clevel: u8,
    pub dflt: Value,
}

impl CarrayMeta {
    pub fn parse(sizes: &[u8], storage: &[u8]) -> Result<CarrayMeta, String> {
        let sizes: Value = serde_json::from_slice(sizes).map_err(|e| format!("meta/sizes: {e}"))?;
        let storage: Value =
            serde_json::from_slice(storage).map_err(|e| format!("meta/storage: {e}"))?;
        let shape: Vec<u64> = sizes
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|s| s.iter().map(Value::as_u64).collect())
            .filter(|s: &Vec<u64>| !s.is_empty())
            .ok_or("meta/sizes: no shape")?;
        let dtype = storage
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or("meta/storage: no dtype")?;
        let dtype =
            Dtype::parse(dtype).ok_or_else(|| format!("dtype {dtype} is no plain number type"))?;
        let chunklen = storage
            .get("chunklen")
            .and_then(Value::as_u64)
            .filter(|&c| c > 0)
            .ok_or("meta/storage: no chunklen")?;
        let clevel = storage
            .pointer("/cparams/clevel")
            .and_then(Value::as_u64)
            .map_or(5, |c| c.min(9) as u8);
        let row = shape[1..]
            .iter()
            .try_fold(u64::from(dtype.size), |a, &n| a.checked_mul(n));
        if row
            .and_then(|r| r.checked_mul(chunklen))
            .is_none_or(|b| b > blosc::MAX_BUFFER)
        {
            return Err("chunks too large for blosc".into());
        }
        Ok(CarrayMeta {
            shape,
            dtype,
            chunklen,
            clevel,
            dflt: storage.get("dflt").cloned().unwrap_or(Value::Null),
        })
    }

    /// Number of chunk files.
    pub fn nchunks(&self) -> u64 {
        self.shape[0].div_ceil(self.chunklen)
    }

    /// Rows in the last chunk.
    pub fn last_rows(&self) -> u64 {
        match self.shape[0] % self.chunklen {
            0 => self.chunklen,
            r => r,
        }
    }

    /// The Zarr array, with the codec of frame `first` (the first chunk's) and the
    /// attributes of `__attrs__`.
    pub fn shown(&self, first: Option<&FrameHeader>, attributes: Map<String, Value>) -> ShownArray {
        ShownArray {
            dtype: self.dtype,
            shape: self.shape.clone(),
            order: Order::C,
            chunk_len: self.chunklen,
            fill: container::v3_fill(self.dtype, &self.dflt),
            codec: BloscCodec {
                cname: first.map_or("blosclz", |f| f.cname()),
                clevel: self.clevel,
                shuffle: first.map_or(0, |f| f.shuffle()),
                typesize: first.map_or(self.dtype.size, |f| f.typesize),
            },
            attributes,
            dimension_names: None,
        }
    }
}

/// The attributes in `__attrs__` (an object; anything else is none).
pub fn attributes(bytes: Option<&[u8]>) -> Map<String, Value> {
    match bytes.map(serde_json::from_slice::<Value>) {
        Some(Ok(Value::Object(m))) => m,
        _ => Map::new(),
    }
}

/// The column names of a ctable's `__rootdirs__`: names that are one path component.
pub fn columns(bytes: &[u8]) -> Result<Vec<String>, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("__rootdirs__: {e}"))?;
    let names = v
        .get("names")
        .and_then(Value::as_array)
        .ok_or("__rootdirs__: no names")?;
    names
        .iter()
        .map(|n| match n.as_str() {
            Some(s) if !s.is_empty() && s != "." && s != ".." && !s.contains('/') => {
                Ok(s.to_string())
            }
            _ => Err(format!("__rootdirs__: column name {n}")),
        })
        .collect()
}

/// The blosc frame of a chunk file `file` (its whole bytes), checked: the bloscpack
/// header, and a frame that fills the rest of the file.
pub fn chunk_frame(file: &[u8]) -> Result<(&[u8], FrameHeader), String> {
    let Some(head) = file.get(..CHUNK_HEADER_LEN) else {
        return Err(format!(
            "{} bytes, fewer than a chunk file's header",
            file.len()
        ));
    };
    if &head[..4] != super::bloscpack::MAGIC {
        return Err("no bloscpack magic".into());
    }
    let frame = &file[CHUNK_HEADER_LEN..];
    let h = FrameHeader::parse(frame).map_err(|e| e.to_string())?;
    if h.ctbytes as usize != frame.len() {
        return Err(format!(
            "its frame says {} bytes, the file holds {}",
            h.ctbytes,
            frame.len()
        ));
    }
    Ok((frame, h))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZES_2D: &[u8] = br#"{"shape": [1000, 3], "nbytes": 12000, "cbytes": 3714}"#;
    const STORAGE_2D: &[u8] = br#"{"dtype": "int32", "cparams": {"clevel": 3, "shuffle": 1, "cname": "zstd", "quantize": 0}, "chunklen": 128, "expectedlen": 1000, "dflt": 0}"#;

    #[test]
    fn a_carray_of_bcolz_zipline() {
        let m = CarrayMeta::parse(SIZES_2D, STORAGE_2D).unwrap();
        assert_eq!((m.nchunks(), m.last_rows(), m.clevel), (8, 104, 3));
        let a = m.shown(None, attributes(Some(br#"{"units": "m"}"#)));
        assert_eq!(a.chunk_shape(), vec![128, 3]);
        assert_eq!(a.attributes["units"], "m");
        assert_eq!(chunk_file(7), "data/__7.blp");
    }

    #[test]
    fn broken_rootdirs_are_errors() {
        for (sizes, storage) in [
            (&b"{"[..], STORAGE_2D),
            (SIZES_2D, &b"[]"[..]),
            (br#"{"shape": []}"#, STORAGE_2D),
            (br#"{"shape": [-1]}"#, STORAGE_2D),
            (SIZES_2D, br#"{"dtype": "|S4", "chunklen": 1}"#),
            (SIZES_2D, br#"{"dtype": "int8", "chunklen": 0}"#),
            (
                br#"{"shape": [1, 4294967296]}"#,
                br#"{"dtype": "int64", "chunklen": 1024}"#,
            ),
        ] {
            assert!(CarrayMeta::parse(sizes, storage).is_err());
        }
        assert!(attributes(Some(b"[1]")).is_empty());
        assert_eq!(columns(br#"{"names": ["x", "y"]}"#).unwrap(), ["x", "y"]);
        assert!(columns(br#"{"names": ["../x"]}"#).is_err());
        assert!(columns(b"{").is_err());
    }

    #[test]
    fn chunk_files_are_checked() {
        let frame = blosc::encode_uncompressed(&[1u8; 64], 1, 0).unwrap();
        let mut file = b"blpk\x01\0\0\0\x01\0\0\0\0\0\0\0".to_vec();
        file.extend_from_slice(&frame);
        assert_eq!(chunk_frame(&file).unwrap().0, &frame[..]);
        assert!(chunk_frame(&file[..file.len() - 1]).is_err());
        assert!(chunk_frame(&file[..10]).is_err());
        let mut bad = file.clone();
        bad[0] = b'x';
        assert!(chunk_frame(&bad).is_err());
    }
}
