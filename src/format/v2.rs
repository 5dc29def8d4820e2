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
//! extension data types) has no exact v2 equivalent: [`zarray`] says why.
//!
//! `dimension_names` appear in `.zattrs` as `_ARRAY_DIMENSIONS` (the xarray convention)
//! and go back the same way.

use serde_json::{Map, Value, json};

use super::key::{ChunkKeyEncoding, KeyKind};
use super::metadata::codec_name;

/// The attribute xarray keeps dimension names in.
pub const ARRAY_DIMENSIONS: &str = "_ARRAY_DIMENSIONS";

/// The v2 names of the metadata files.
pub const ZARRAY: &str = ".zarray";
pub const ZATTRS: &str = ".zattrs";
pub const ZGROUP: &str = ".zgroup";
/// zarr 2's consolidated metadata of a group and all below it.
pub const ZMETADATA: &str = ".zmetadata";

/// The `data_type` of v3 metadata `doc` as one string: its name, or for
/// `fixed_length_utf32` (numpy's `U`) `fixed_length_utf32:<length_bytes>`.
pub(crate) fn data_type_name(doc: &Map<String, Value>) -> Result<String, String> {
    match doc.get("data_type") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Object(o))
            if o.get("name").and_then(Value::as_str) == Some("fixed_length_utf32") =>
        {
            let n = o
                .get("configuration")
                .and_then(|c| c.get("length_bytes"))
                .and_then(Value::as_u64)
                .filter(|n| n % 4 == 0 && *n > 0)
                .ok_or("fixed_length_utf32 without a length_bytes that is a multiple of 4")?;
            Ok(format!("fixed_length_utf32:{n}"))
        }
        Some(other) => Err(format!("data type {other} has no Zarr v2 equivalent")),
        None => Err("no data_type".into()),
    }
}

/// `data_type` ([`data_type_name`]) → (numpy kind, item size; characters for `U`).
fn v2_kind(data_type: &str) -> Option<(char, u32)> {
    if let Some(n) = data_type.strip_prefix("fixed_length_utf32:") {
        return Some(('U', n.parse::<u32>().ok()? / 4));
    }
    Some(match data_type {
        "bool" => ('b', 1),
        "int8" => ('i', 1),
        "int16" => ('i', 2),
        "int32" => ('i', 4),
        "int64" => ('i', 8),
        "uint8" => ('u', 1),
        "uint16" => ('u', 2),
        "uint32" => ('u', 4),
        "uint64" => ('u', 8),
        "float16" => ('f', 2),
        "float32" => ('f', 4),
        "float64" => ('f', 8),
        "complex64" => ('c', 8),
        "complex128" => ('c', 16),
        // Variable-length: numpy object arrays.
        "string" | "bytes" | "variable_length_bytes" => ('O', 0),
        _ => return None,
    })
}

/// (numpy kind, item size) → `data_type`.
fn v3_data_type(kind: char, size: u32) -> Option<&'static str> {
    Some(match (kind, size) {
        ('b', 1) => "bool",
        ('i', 1) => "int8",
        ('i', 2) => "int16",
        ('i', 4) => "int32",
        ('i', 8) => "int64",
        ('u', 1) => "uint8",
        ('u', 2) => "uint16",
        ('u', 4) => "uint32",
        ('u', 8) => "uint64",
        ('f', 2) => "float16",
        ('f', 4) => "float32",
        ('f', 8) => "float64",
        ('c', 8) => "complex64",
        ('c', 16) => "complex128",
        _ => return None,
    })
}

/// The `.zarray` of a v3 array with innermost chunk shape `chunks`, inner codec chain
/// `codecs`, whose keys the view shows with `keys`; `Err` says why there is none.
pub fn zarray(
    doc: &Map<String, Value>,
    shape: &[u64],
    chunks: &[u64],
    codecs: &[Value],
    keys: ChunkKeyEncoding,
) -> Result<Value, String> {
    Ok(zarray_fill(doc, shape, chunks, codecs, keys)?.0)
}

/// [`zarray`], and whether the view serves a chunk of the v3 fill value at keys the store
/// has no chunk for (false: none needed, the fill values mean the same; see
/// [`super::fill`] and [`fill_chunk`]).
pub fn zarray_fill(
    doc: &Map<String, Value>,
    shape: &[u64],
    chunks: &[u64],
    codecs: &[Value],
    keys: ChunkKeyEncoding,
) -> Result<(Value, bool), String> {
    let data_type = &data_type_name(doc)?;
    let (kind, size) =
        v2_kind(data_type).ok_or(format!("data type {data_type:?} has no Zarr v2 equivalent"))?;
    let ndim = shape.len();
    let mut rest = codecs;
    let mut order = "C";
    if let Some(first) = rest.first()
        && codec_name(first) == "transpose"
    {
        let perm: Option<Vec<u64>> = first
            .get("configuration")
            .and_then(|c| c.get("order"))
            .and_then(Value::as_array)
            .and_then(|o| o.iter().map(Value::as_u64).collect());
        let perm = perm.ok_or("transpose has no order")?;
        let identity: Vec<u64> = (0..ndim as u64).collect();
        let reversed: Vec<u64> = identity.iter().rev().copied().collect();
        // A 1-D array's transpose `[0]` changes nothing but remembers `order: "F"`.
        if perm == reversed && ndim >= 1 {
            order = "F";
        } else if perm == identity {
        } else {
            return Err(format!("transpose order {perm:?} is neither C nor F order"));
        }
        rest = &rest[1..];
    }
    let Some((bytes, rest)) = rest.split_first() else {
        return Err("the codec chain has no bytes codec".into());
    };
    let mut v2_codecs = Vec::new();
    let dtype = match (kind, codec_name(bytes)) {
        // Variable-length strings and bytes: numcodecs' VLenUTF8 and VLenBytes filters
        // lay out a chunk byte for byte as the v3 codecs do, for dtype `|O`.
        ('O', "vlen-utf8") if data_type == "string" => {
            v2_codecs.push(json!({"id": "vlen-utf8"}));
            "|O".to_string()
        }
        ('O', "vlen-bytes") if data_type != "string" => {
            v2_codecs.push(json!({"id": "vlen-bytes"}));
            "|O".to_string()
        }
        (_, "bytes") if kind != 'O' => {
            let endian = bytes
                .get("configuration")
                .and_then(|c| c.get("endian"))
                .and_then(Value::as_str);
            let byte_order = match (size, endian) {
                (1, _) if kind != 'U' => '|',
                (_, Some("little")) => '<',
                (_, Some("big")) => '>',
                _ => return Err("the bytes codec names no endianness".into()),
            };
            format!("{byte_order}{kind}{size}")
        }
        (_, other) => return Err(format!("codec {other:?} has no Zarr v2 equivalent")),
    };
    for c in rest {
        v2_codecs.push(to_numcodecs(c)?);
    }
    let compressor = v2_codecs.pop().unwrap_or(Value::Null);
    let filters = if v2_codecs.is_empty() {
        Value::Null
    } else {
        Value::Array(v2_codecs)
    };
    // The fill value as xarray on zarr 2 reads it (the CF `_FillValue`, `null` for none),
    // and the chunk of the v3 fill value that keeps missing chunks reading the same.
    let v3_fill = doc.get("fill_value").unwrap_or(&Value::Null);
    let wanted = match super::fill::attr_fill(doc, data_type) {
        Some(v) => v,
        // Only xarray masks the fill value, and it reads only arrays with dimension
        // names: those show `null` (nothing masked), the others the v3 fill value.
        None if has_dimension_names(doc) => Value::Null,
        None => v3_fill.clone(),
    };
    let (shown, chunk) = if super::fill::same_fill(data_type, &wanted, v3_fill) {
        (wanted, false)
    } else if super::fill::encodable(data_type, v3_fill, codecs) {
        (wanted, true)
    } else {
        // Missing chunks could not read as zarr 3 reads them: the v3 fill value.
        (v3_fill.clone(), false)
    };
    let fill = if shown.is_null() {
        Value::Null
    } else {
        v2_fill_value(&shown, kind, size)?
    };
    // `.zarray` as zarr-python 2 writes it: keys sorted.
    let zarray = json!({
        "chunks": chunks,
        "compressor": compressor,
        "dimension_separator": keys.separator.to_string(),
        "dtype": dtype,
        "fill_value": fill,
        "filters": filters,
        "order": order,
        "shape": shape,
        "zarr_format": 2,
    });
    Ok((zarray, chunk))
}

/// Whether `.zarray` shows the `_FillValue` attribute of v3 array metadata `doc` as its
/// `fill_value` (and `.zattrs` hides it): one that means a value of the data type.
fn shows_attr_fill(doc: &Map<String, Value>) -> bool {
    data_type_name(doc)
        .ok()
        .and_then(|t| super::fill::attr_fill(doc, &t))
        .is_some()
}

/// Whether v3 metadata `doc` names its dimensions (`dimension_names`, or xarray's
/// `_ARRAY_DIMENSIONS` attribute): an array xarray reads.
fn has_dimension_names(doc: &Map<String, Value>) -> bool {
    let named = |v: Option<&Value>| {
        v.and_then(Value::as_array)
            .is_some_and(|n| !n.is_empty() && n.iter().all(Value::is_string))
    };
    named(doc.get("dimension_names"))
        || named(doc.get("attributes").and_then(|a| a.get(ARRAY_DIMENSIONS)))
}

/// The chunk of its v3 fill value an array of v3 metadata `doc`, chunks of `chunks`
/// elements encoded with `codecs`, is served with at keys the store has no chunk for,
/// where [`zarray_fill`] says so.
pub fn fill_chunk(
    doc: &Map<String, Value>,
    chunks: &[u64],
    codecs: &[Value],
) -> Result<Vec<u8>, String> {
    let data_type = data_type_name(doc)?;
    let fill = doc.get("fill_value").unwrap_or(&Value::Null);
    super::fill::fill_chunk(&data_type, fill, chunks, codecs)
}

/// The v2 key encoding the view shows for an array whose shards have `store` keys: the
/// same separator, so key directories mirror shard directories.
pub fn shown_keys(store: ChunkKeyEncoding) -> ChunkKeyEncoding {
    ChunkKeyEncoding {
        kind: KeyKind::V2,
        separator: store.separator,
    }
}

/// A v3 bytes→bytes codec as numcodecs configures it.
fn to_numcodecs(codec: &Value) -> Result<Value, String> {
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

/// A numcodecs configuration as a v3 bytes→bytes codec (`itemsize` for blosc's typesize).
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

fn from_numcodecs(codec: &Value, itemsize: u32) -> Result<Value, String> {
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

/// A numpy type string (`<u2`, `>f8`, `|u1`, `u1`, `bool`): the v3 `data_type`, the
/// `bytes` codec's endianness, the item size.
pub(crate) fn numpy_dtype(dtype: &str) -> Result<(&'static str, &'static str, u32), String> {
    if dtype == "bool" {
        return Ok(("bool", "little", 1));
    }
    // numpy spells one-byte types without a byte order ("u1"), others with one ("<u2").
    let full = if dtype.starts_with(['<', '>', '|', '=']) {
        dtype.to_string()
    } else {
        format!("|{dtype}")
    };
    let mut cs = full.chars();
    let (order, kind) = (cs.next().unwrap_or(' '), cs.next().unwrap_or(' '));
    let size: u32 = cs
        .as_str()
        .parse()
        .map_err(|_| format!("dtype {dtype:?} is not a numeric numpy type"))?;
    let name = v3_data_type(kind, size).ok_or(format!(
        "dtype {dtype:?} has no Zarr v3 equivalent the view can use"
    ))?;
    let endian = match order {
        '<' | '|' | '=' => "little",
        _ => "big",
    };
    Ok((name, endian, size))
}

/// A v3 `fill_value` as v2 writes it (`"NaN"`, `"Infinity"`, `"-Infinity"` strings for
/// non-finite floats, `[re, im]` for complex numbers).
fn v2_fill_value(v: &Value, kind: char, size: u32) -> Result<Value, String> {
    match kind {
        'f' => float_fill(v, size),
        'c' => match v {
            Value::Array(parts) if parts.len() == 2 => Ok(Value::Array(vec![
                float_fill(&parts[0], size / 2)?,
                float_fill(&parts[1], size / 2)?,
            ])),
            other => Err(format!("complex fill_value {other} is not [re, im]")),
        },
        _ => Ok(v.clone()),
    }
}

fn float_fill(v: &Value, size: u32) -> Result<Value, String> {
    let x = match v {
        Value::Number(_) => return Ok(v.clone()),
        Value::String(s) if matches!(s.as_str(), "NaN" | "Infinity" | "-Infinity") => {
            return Ok(v.clone());
        }
        Value::String(s) if s.starts_with("0x") => {
            let bits = u64::from_str_radix(&s[2..], 16)
                .map_err(|_| format!("fill_value {s:?} is not hexadecimal"))?;
            match size {
                2 => super::fill::half_to_f64(bits as u16),
                4 => f64::from(f32::from_bits(bits as u32)),
                8 => f64::from_bits(bits),
                _ => return Err(format!("fill_value {s:?} for a {size}-byte float")),
            }
        }
        other => return Err(format!("float fill_value {other} is not understood")),
    };
    Ok(if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        json!(x)
    })
}

/// `.zattrs` of a v3 node: its attributes (OME-Zarr 0.5 in its 0.4 form, see
/// [`super::ome`]), with `dimension_names` as `_ARRAY_DIMENSIONS`.
pub fn zattrs(doc: &Map<String, Value>) -> Value {
    let mut attrs = super::ome::to_v04(
        doc.get("attributes")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
    );
    if let Some(Value::Array(names)) = doc.get("dimension_names")
        && !names.is_empty()
        && names.iter().all(Value::is_string)
        && !attrs.contains_key(ARRAY_DIMENSIONS)
    {
        attrs.insert(ARRAY_DIMENSIONS.into(), Value::Array(names.clone()));
    }
    if doc.get("node_type").and_then(Value::as_str) == Some("array") && shows_attr_fill(doc) {
        // Shown as `fill_value` in `.zarray` ([`super::fill`]).
        attrs.remove(super::fill::FILL_VALUE_ATTR);
    }
    Value::Object(attrs)
}

/// `.zgroup`.
pub fn zgroup() -> Value {
    json!({"zarr_format": 2})
}

/// Apply a `.zattrs` written through the view to a v3 document: the attributes are
/// replaced (OME-Zarr 0.4 becomes 0.5, see [`super::ome`]; `name` is the node's directory
/// name); `_ARRAY_DIMENSIONS` of the array's rank becomes `dimension_names`.
pub fn apply_zattrs(
    doc: &mut Map<String, Value>,
    zattrs: &[u8],
    ndim: Option<usize>,
    name: &str,
) -> Result<(), String> {
    let v: Value = serde_json::from_slice(zattrs).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(attrs) = v else {
        return Err(".zattrs is not a JSON object".into());
    };
    let mut attrs = super::ome::to_v05(attrs, name);
    // The fill value `.zattrs` does not show (it is `.zarray`'s `fill_value`) stays.
    if ndim.is_some()
        && shows_attr_fill(doc)
        && !attrs.contains_key(super::fill::FILL_VALUE_ATTR)
        && let Some(v) = doc
            .get("attributes")
            .and_then(|a| a.get(super::fill::FILL_VALUE_ATTR))
    {
        attrs.insert(super::fill::FILL_VALUE_ATTR.into(), v.clone());
    }
    if let Some(ndim) = ndim
        && let Some(Value::Array(names)) = attrs.get(ARRAY_DIMENSIONS)
        && names.len() == ndim
        && names.iter().all(Value::is_string)
    {
        doc.insert("dimension_names".into(), Value::Array(names.clone()));
        attrs.remove(ARRAY_DIMENSIONS);
    }
    // A `null` fill value is kept as a `null` `_FillValue` only while the array has no
    // dimension names: with them the view shows `null` anyway, and xarray on zarr 3
    // would read the attribute as a fill value.
    if doc.contains_key("dimension_names")
        && attrs.get(super::fill::FILL_VALUE_ATTR) == Some(&Value::Null)
    {
        attrs.remove(super::fill::FILL_VALUE_ATTR);
    }
    doc.insert("attributes".into(), Value::Object(attrs));
    Ok(())
}

/// The v3 `zarr.json` (an unsharded array) for a `.zarray` written through the view.
pub fn v3_from_zarray(zarray: &[u8]) -> Result<Map<String, Value>, String> {
    let v: Value = serde_json::from_slice(zarray).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(z) = v else {
        return Err(".zarray is not a JSON object".into());
    };
    if z.get("zarr_format").and_then(Value::as_u64) != Some(2) {
        return Err("zarr_format is not 2".into());
    }
    let list = |k: &str| -> Result<Vec<u64>, String> {
        z.get(k)
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_u64).collect())
            .ok_or(format!("{k} is missing or not a list of integers"))
    };
    let shape = list("shape")?;
    let chunks = list("chunks")?;
    if chunks.len() != shape.len() || chunks.contains(&0) {
        return Err(format!("chunks {chunks:?} do not fit shape {shape:?}"));
    }
    let dtype = z
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or("dtype is not a plain string (structured dtypes have no v3 equivalent)")?;
    let bare = dtype.trim_start_matches(['<', '>', '|', '=']);
    let (data_type, codecs, kind) = if bare == "O" {
        let (t, c, k) = object_codecs(&z)?;
        (Value::from(t), c, k)
    } else if let Some(chars) = bare.strip_prefix('U') {
        // numpy's fixed-width unicode: UTF-32 code units, `chars` of them.
        let chars: u64 = chars
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or(format!("dtype {dtype:?} is not a numpy type"))?;
        let endian = if dtype.starts_with('>') {
            "big"
        } else {
            "little"
        };
        let codecs = codec_chain(&z, "order", shape.len(), endian, |c| from_numcodecs(c, 4))?;
        let t = json!({"name": "fixed_length_utf32", "configuration": {"length_bytes": chars * 4}});
        (t, codecs, 'U')
    } else {
        let (data_type, endian, size) = numpy_dtype(dtype)?;
        let kind = dtype
            .trim_start_matches(['<', '>', '|', '='])
            .chars()
            .next()
            .unwrap_or(' ');
        let codecs = codec_chain(&z, "order", shape.len(), endian, |c| {
            from_numcodecs(c, size)
        })?;
        (Value::from(data_type), codecs, kind)
    };
    // `null` (xarray on zarr 2: nothing is masked) is stored as the v3 default; any other
    // fill value is also kept as the `_FillValue` attribute, as xarray on zarr 3 keeps
    // it, so that the view shows it again and xarray on zarr 3 masks what zarr 2 did.
    // `null` is kept as a `null` `_FillValue` until the array has dimension names
    // ([`apply_zattrs`]: xarray's arrays show `null` without it, and xarray on zarr 3
    // would take it for a value).
    let mut attributes = Map::new();
    if matches!(z.get("fill_value"), None | Some(Value::Null)) {
        attributes.insert(super::fill::FILL_VALUE_ATTR.into(), Value::Null);
    }
    let fill = match (z.get("fill_value"), kind) {
        (None | Some(Value::Null), 'b') => json!(false),
        (None | Some(Value::Null), 'c') => json!([0.0, 0.0]),
        (None | Some(Value::Null), 'f') => json!(0.0),
        (None | Some(Value::Null), 'O' | 'U') => json!(""),
        // zarr 2's default fill value of object arrays is `0`, which no v3 string or
        // bytes array can have: none.
        (Some(v), 'O' | 'U') if !v.is_string() => json!(""),
        (None | Some(Value::Null), _) => json!(0),
        (Some(v), _) => {
            attributes.insert(
                super::fill::FILL_VALUE_ATTR.into(),
                super::fill::attr_for(data_type.as_str().unwrap_or(""), v),
            );
            v.clone()
        }
    };
    let separator = match z.get("dimension_separator").and_then(Value::as_str) {
        None | Some(".") => ".",
        Some("/") => "/",
        Some(s) => return Err(format!("dimension_separator {s:?}")),
    };
    let doc = json!({
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "v2", "configuration": {"separator": separator}},
        "fill_value": fill,
        "codecs": codecs,
        "attributes": attributes,
    });
    let Value::Object(doc) = doc else {
        unreachable!("a JSON object literal")
    };
    Ok(doc)
}

/// The v3 data type and codecs of a `.zarray` of dtype `|O`: its first filter says what
/// the objects are (`vlen-utf8`: strings, `vlen-bytes`: bytes), and is the v3 codec that
/// lays them out as it does; the other filters and the compressor follow.
fn object_codecs(z: &Map<String, Value>) -> Result<(&'static str, Vec<Value>, char), String> {
    let filters: &[Value] = match z.get("filters") {
        Some(Value::Array(f)) => f,
        _ => &[],
    };
    let first = filters
        .first()
        .and_then(|f| f.get("id"))
        .and_then(Value::as_str);
    let (data_type, codec) = match first {
        Some("vlen-utf8") => ("string", "vlen-utf8"),
        Some("vlen-bytes") => ("variable_length_bytes", "vlen-bytes"),
        other => {
            return Err(format!(
                "dtype |O with first filter {other:?}: only vlen-utf8 and vlen-bytes objects have a v3 equivalent"
            ));
        }
    };
    let mut codecs = vec![json!({"name": codec})];
    for f in &filters[1..] {
        codecs.push(from_numcodecs(f, 1)?);
    }
    match z.get("compressor") {
        None | Some(Value::Null) => {}
        Some(c) => codecs.push(from_numcodecs(c, 1)?),
    }
    Ok((data_type, codecs, 'O'))
}

/// Whether two `.zarray` documents describe the same array but for its shape (each is
/// taken through the v3 form, so that spellings of the same codec compare equal).
pub fn same_but_shape(a: &[u8], b: &[u8]) -> Result<bool, String> {
    // The fill value by what it means (`0` and `0.0` of a float array are the same).
    type Norm = (Map<String, Value>, Option<Vec<u8>>);
    let norm = |z: &[u8]| -> Result<Norm, String> {
        let mut doc = v3_from_zarray(z)?;
        doc.remove("shape");
        let fill = doc.remove("fill_value").unwrap_or(Value::Null);
        if let Some(Value::Object(attrs)) = doc.get_mut("attributes") {
            attrs.remove(super::fill::FILL_VALUE_ATTR);
        }
        let element = data_type_name(&doc)
            .ok()
            .and_then(|t| super::fill::element(&t, &fill));
        Ok((doc, element))
    };
    Ok(norm(a)? == norm(b)?)
}

/// The shape a `.zarray` asks for.
pub fn zarray_shape(zarray: &[u8]) -> Result<Vec<u64>, String> {
    let doc = v3_from_zarray(zarray)?;
    Ok(doc["shape"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default())
}

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

/// An unsharded v3 array in the v2 view: its chunk files pass through, byte for byte, at
/// v2 keys. What the view needs to know of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlainKeys {
    /// The store's chunk key encoding.
    pub store: ChunkKeyEncoding,
    pub ndim: usize,
}

/// Where a name in an unsharded array's directory of the v2 view is in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlainName {
    /// A v2 chunk key (or nested key directory): this path, relative to the array dir.
    Key(String),
    /// A store name the view does not show (`zarr.json`, a v3 key, the `c` directory).
    Hidden,
    /// Any other name (a writer's temporary file): the same name in the store.
    AsIs,
}

/// What a store entry of an unsharded array's directory is in the v2 view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlainEntry {
    /// Shown under this v2 name.
    Shown(String),
    /// The `c` directory of a nested `default` encoding: its entries are the v2 names.
    Expand,
    Hidden,
    AsIs,
}

impl PlainKeys {
    /// The v2 key encoding shown.
    pub fn shown(&self) -> ChunkKeyEncoding {
        shown_keys(self.store)
    }

    /// The store path (relative to the array dir) of `name` in the array's v2 directory.
    pub fn store_name(&self, name: &str) -> PlainName {
        use super::key::KeyPath;
        if let Some(kp) = self.shown().child(self.ndim, None, name) {
            return PlainName::Key(match kp {
                KeyPath::Chunk(c) => self.store.encode(&c),
                KeyPath::Dir(c) => self.store.dir_components(self.ndim, &c).join("/"),
            });
        }
        if name == "zarr.json" || self.store.child(self.ndim, None, name).is_some() {
            PlainName::Hidden
        } else {
            PlainName::AsIs
        }
    }

    /// The v2 name of store entry `name` of the array dir.
    pub fn v2_name(&self, name: &str) -> PlainEntry {
        use super::key::KeyPath;
        if name == "zarr.json" {
            return PlainEntry::Hidden;
        }
        match self.store.child(self.ndim, None, name) {
            Some(KeyPath::Chunk(c)) => PlainEntry::Shown(self.shown().encode(&c)),
            Some(KeyPath::Dir(c)) if c.is_empty() => PlainEntry::Expand,
            Some(KeyPath::Dir(c)) => PlainEntry::Shown(c[0].to_string()),
            None if self.shown().child(self.ndim, None, name).is_some() => PlainEntry::Hidden,
            None => PlainEntry::AsIs,
        }
    }

    /// The v2 name of entry `name` of the `c` directory ([`PlainEntry::Expand`]).
    pub fn v2_name_in_c(&self, name: &str) -> Option<String> {
        self.store
            .child(self.ndim, Some(&[]), name)
            .map(|_| name.to_string())
    }
}

/// The `.zarray` of an unsharded v3 array, and whether the view serves chunks of the fill
/// value at keys the store has no chunk for ([`zarray_fill`]).
pub fn plain_zarray_fill(doc: &Map<String, Value>) -> Result<(Value, bool), String> {
    let (shape, chunks, codecs, keys) = plain_parts(doc)?;
    zarray_fill(doc, &shape, &chunks, codecs, keys.shown())
}

/// The `.zarray` of an unsharded v3 array, and its key translation; `Err` says why it has
/// no v2 form.
pub fn plain_zarray(doc: &Map<String, Value>) -> Result<(Value, PlainKeys), String> {
    let (shape, chunks, codecs, keys) = plain_parts(doc)?;
    let zarray = zarray(doc, &shape, &chunks, codecs, keys.shown())?;
    Ok((zarray, keys))
}

/// Shape, chunk shape, codecs and key translation of an unsharded v3 array.
type PlainParts<'a> = (Vec<u64>, Vec<u64>, &'a [Value], PlainKeys);

fn plain_parts(doc: &Map<String, Value>) -> Result<PlainParts<'_>, String> {
    let shape = doc
        .get("shape")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>())
        .ok_or("shape is not a list of integers")?;
    let grid = doc.get("chunk_grid").ok_or("no chunk_grid")?;
    if grid.get("name").and_then(Value::as_str) != Some("regular") {
        return Err("the chunk grid is not regular".into());
    }
    let chunks = grid
        .get("configuration")
        .and_then(|c| c.get("chunk_shape"))
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>())
        .ok_or("chunk_shape is not a list of integers")?;
    if chunks.len() != shape.len() {
        return Err("chunk_shape and shape differ in rank".into());
    }
    let codecs = doc
        .get("codecs")
        .and_then(Value::as_array)
        .ok_or("codecs is not a list")?;
    let store = ChunkKeyEncoding::from_json(doc.get("chunk_key_encoding"))?;
    if store.kind == KeyKind::Draft {
        return Err("draft chunk keys".into());
    }
    let keys = PlainKeys {
        store,
        ndim: shape.len(),
    };
    Ok((shape, chunks, codecs, keys))
}
