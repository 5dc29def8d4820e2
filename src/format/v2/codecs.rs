//! Codecs between Zarr v3 and numcodecs: a v3 bytes→bytes codec as numcodecs configures
//! it, a numcodecs configuration (or the 2022 draft's) as a v3 codec, and the v3 codec
//! chain of v2-style metadata. Not the data types ([`super::dtype`]) nor the documents.

use serde_json::{Map, Value, json};

use crate::format::metadata::codec_name;

/// A v3 bytes→bytes codec as numcodecs configures it.
pub(super) fn to_numcodecs(codec: &Value) -> Result<Value, String> {
    let name = codec_name(codec);
    let empty = Map::new();
    let config = codec
        .get("configuration")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let get = |k: &str| config.get(k).cloned().unwrap_or(Value::Null);
    Ok(match name {
        "gzip" => json!({"id": "gzip", "level": get("level")}),
        "zstd" => {
            let mut c = json!({"id": "zstd", "level": get("level")});
            if config.get("checksum") == Some(&Value::Bool(true)) {
                c["checksum"] = true.into();
            }
            c
        }
        "blosc" => {
            let shuffle = match config.get("shuffle").and_then(Value::as_str) {
                Some("noshuffle") | None => 0,
                Some("shuffle") => 1,
                Some("bitshuffle") => 2,
                Some(other) => return Err(format!("blosc shuffle {other:?} is unknown")),
            };
            json!({"id": "blosc", "cname": get("cname"), "clevel": get("clevel"),
                   "shuffle": shuffle, "blocksize": config.get("blocksize").cloned().unwrap_or(0.into())})
        }
        "crc32c" => json!({"id": "crc32c"}),
        other => match other.strip_prefix(NUMCODECS) {
            Some(id) if NUMCODECS_COMPRESSORS.contains(&id) => {
                let mut c = config.clone();
                c.insert("id".into(), id.into());
                Value::Object(c)
            }
            _ => return Err(format!("codec {other:?} has no Zarr v2 equivalent")),
        },
    })
}

/// The v3 codec chain of v2-style metadata `meta` (a `.zarray`, or a 2022 draft array):
/// a `transpose` for Fortran order (member `order_key`, `"C"` or `"F"`), `bytes` in
/// `endian`, then the `filters` and the `compressor`, each converted by `codec`.
pub(crate) fn codec_chain(
    meta: &serde_json::Map<String, Value>,
    order_key: &str,
    ndim: usize,
    endian: &str,
    codec: impl Fn(&Value) -> Result<Value, String>,
) -> Result<Vec<Value>, String> {
    let mut codecs = Vec::new();
    match meta.get(order_key).and_then(Value::as_str) {
        Some("C") | None => {}
        Some("F") => {
            if ndim >= 1 {
                // Also for one dimension, where it changes nothing: so that the
                // array's `order` reads back as written.
                let rev: Vec<u64> = (0..ndim as u64).rev().collect();
                codecs.push(json!({"name": "transpose", "configuration": {"order": rev}}));
            }
        }
        Some(o) => return Err(format!("{order_key} {o:?} is neither C nor F")),
    }
    codecs.push(json!({"name": "bytes", "configuration": {"endian": endian}}));
    if let Some(Value::Array(filters)) = meta.get("filters") {
        for f in filters {
            codecs.push(codec(f)?);
        }
    }
    match meta.get("compressor") {
        None | Some(Value::Null) => {}
        Some(c) => codecs.push(codec(c)?),
    }
    Ok(codecs)
}

/// The prefix zarr-python 3 gives numcodecs codecs that have no v3 name of their own.
pub const NUMCODECS: &str = "numcodecs.";

/// numcodecs compressors (bytes→bytes) stored under their `numcodecs.<id>` v3 name.
const NUMCODECS_COMPRESSORS: &[&str] = &["zlib", "bz2", "lzma", "lz4"];

/// A numcodecs configuration as a v3 bytes→bytes codec (`itemsize` for blosc's typesize).
pub(super) fn from_numcodecs(codec: &Value, itemsize: u32) -> Result<Value, String> {
    let id = codec.get("id").and_then(Value::as_str).unwrap_or("");
    if NUMCODECS_COMPRESSORS.contains(&id) {
        let mut config = codec.as_object().cloned().unwrap_or_default();
        config.remove("id");
        return Ok(json!({"name": format!("{NUMCODECS}{id}"), "configuration": config}));
    }
    v3_codec(id, |k| codec.get(k).cloned(), itemsize).map_err(|e| format!("numcodecs {e}"))
}

/// The v3 bytes→bytes codec `name` whose numcodecs-style settings `get` returns (for
/// `.zarray` compressors and filters, and the codecs of the 2022 draft layout).
pub(crate) fn v3_codec(
    name: &str,
    get: impl Fn(&str) -> Option<Value>,
    itemsize: u32,
) -> Result<Value, String> {
    Ok(match name {
        "gzip" => {
            json!({"name": "gzip", "configuration": {"level": get("level").unwrap_or(1.into())}})
        }
        "zstd" => json!({"name": "zstd", "configuration": {
            "level": get("level").unwrap_or(0.into()),
            "checksum": get("checksum").and_then(|c| c.as_bool()).unwrap_or(false)}}),
        "blosc" => {
            let shuffle = match get("shuffle").and_then(|s| s.as_i64()).unwrap_or(1) {
                0 => "noshuffle",
                1 => "shuffle",
                2 => "bitshuffle",
                // AUTOSHUFFLE: bit-shuffle for 1-byte items, byte-shuffle otherwise.
                -1 if itemsize == 1 => "bitshuffle",
                -1 => "shuffle",
                s => return Err(format!("blosc shuffle {s} is unknown")),
            };
            json!({"name": "blosc", "configuration": {
                "cname": get("cname").unwrap_or("lz4".into()),
                "clevel": get("clevel").unwrap_or(5.into()),
                "shuffle": shuffle, "typesize": itemsize,
                "blocksize": get("blocksize").unwrap_or(0.into())}})
        }
        "crc32c" => json!({"name": "crc32c"}),
        "" => return Err("codec without a name".into()),
        other => return Err(format!("codec {other:?} has no exact Zarr v3 equivalent")),
    })
}
