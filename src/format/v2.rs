//! Zarr v2 metadata for the v2 view: `.zarray`, `.zattrs` and `.zgroup` made from a v3
//! array's innermost chunks, and the way back (a `.zarray` written through the view
//! becomes a v3 `zarr.json`). No I/O.
//!
//! Spec: <https://zarr-specs.readthedocs.io/en/latest/v2/v2.0.html>; codec ids and
//! configurations as numcodecs names them.
//!
//! The chunk bytes are served as stored, so a v3 array has a v2 form only when its inner
//! codec chain means the same bytes in v2:
//!
//! | v3 inner chain                                 | v2                                   |
//! |------------------------------------------------|--------------------------------------|
//! | `bytes` (endian)                               | `dtype` byte order (`<`, `>`, `\|`)   |
//! | `transpose` with order `[n-1, .., 0]` first    | `order: "F"` (no transpose: `"C"`; 1-D: `[0]` is `"F"`) |
//! | bytes→bytes codecs `b1 .. bn`                  | `filters: [b1 .. bn-1]`, `compressor: bn` |
//! | `gzip`, `zstd`, `blosc`, `crc32c`              | numcodecs `gzip`, `zstd`, `blosc`, `crc32c` |
//! | `numcodecs.zlib`, `.bz2`, `.lzma`, `.lz4`      | numcodecs `zlib`, `bz2`, `lzma`, `lz4` |
//!
//! The `numcodecs.*` names are how zarr-python 3 (with numcodecs ≥ 0.14) writes and reads
//! the numcodecs compressors that have no v3 codec of their own; the configuration is
//! numcodecs's own, less `id`. Other v3 readers (tensorstore, zarrs) may not know them:
//! `shardfs info` says so.
//!
//! Anything else (another transpose, `vlen-*`, `sharding_indexed` inside, string or
//! extension data types) has no exact v2 equivalent: [`zarray()`] says why.
//!
//! `dimension_names` appear in `.zattrs` as `_ARRAY_DIMENSIONS` (the xarray convention)
//! and go back the same way.
//!
//! Split by direction: [`mod@zarray`] (v3 → `.zarray`), [`from_zarray`] (`.zarray` → v3),
//! [`attrs`] (`.zattrs`, `.zgroup`), [`plain`] (unsharded arrays and their keys), over
//! [`dtype`] and [`codecs`]; this file names the metadata files and writes JSON as
//! zarr-python 2 does.

mod attrs;
mod codecs;
mod dtype;
mod from_zarray;
mod plain;
mod zarray;

use serde_json::Value;

pub use attrs::{ARRAY_DIMENSIONS, apply_zattrs, zattrs, zgroup};
pub use codecs::NUMCODECS;
pub(crate) use codecs::{codec_chain, v3_codec};
pub(crate) use dtype::numpy_dtype;
pub use from_zarray::{same_but_shape, v3_from_zarray, zarray_shape};
pub use plain::{PlainEntry, PlainKeys, PlainName, plain_zarray, plain_zarray_fill};
pub use zarray::{fill_chunk, shown_keys, zarray, zarray_fill};

/// The v2 names of the metadata files.
pub const ZARRAY: &str = ".zarray";
pub const ZATTRS: &str = ".zattrs";
pub const ZGROUP: &str = ".zgroup";
/// zarr 2's consolidated metadata of a group and all below it.
pub const ZMETADATA: &str = ".zmetadata";

/// JSON as zarr-python 2 writes it (sorted keys, four-space indent, trailing newline).
pub fn to_bytes(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    serde::Serialize::serialize(&sorted(v), &mut ser).expect("JSON of a JSON value");
    out.push(b'\n');
    out
}

fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<_> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&m[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
#[path = "v2_tests.rs"]
mod tests;
