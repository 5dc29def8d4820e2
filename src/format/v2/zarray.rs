//! `.zarray` of a v3 array (v3 → v2): its data type, order, filters and compressor from
//! the inner codec chain, its fill value as zarr 2 and xarray read it, the chunk of the
//! fill value served where the store has none, and the v2 keys shown. Not the way back
//! ([`super::from_zarray`]).

use serde_json::{Map, Value, json};

use super::attrs::has_dimension_names;
use super::codecs::to_numcodecs;
use super::dtype::{data_type_name, v2_kind};
use crate::format::fill;
use crate::format::key::{ChunkKeyEncoding, KeyKind};
use crate::format::metadata::codec_name;

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
/// [`fill`] and [`fill_chunk`]).
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
    let (order, rest) = order_of(codecs, shape.len())?;
    let Some((bytes, rest)) = rest.split_first() else {
        return Err("the codec chain has no bytes codec".into());
    };
    let mut v2_codecs = Vec::new();
    let dtype = v2_dtype(data_type, kind, size, bytes, &mut v2_codecs)?;
    for c in rest {
        v2_codecs.push(to_numcodecs(c)?);
    }
    let compressor = v2_codecs.pop().unwrap_or(Value::Null);
    let filters = if v2_codecs.is_empty() {
        Value::Null
    } else {
        Value::Array(v2_codecs)
    };
    let (fill, chunk) = shown_fill(doc, data_type, codecs, kind, size)?;
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

/// The v2 `order` of inner codec chain `codecs` of an `ndim`-dimensional array (`"F"` for
/// a leading reversing `transpose`, `"C"` for none or the identity), and the codecs after
/// the transpose.
fn order_of(codecs: &[Value], ndim: usize) -> Result<(&'static str, &[Value]), String> {
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
    Ok((order, rest))
}

/// The v2 `dtype` of v3 `data_type` (numpy `kind`, item `size`) laid out by array→bytes
/// codec `bytes`; a `vlen-*` codec goes first into `v2_codecs`, as the filter that lays
/// out the objects the same way.
fn v2_dtype(
    data_type: &str,
    kind: char,
    size: u32,
    bytes: &Value,
    v2_codecs: &mut Vec<Value>,
) -> Result<String, String> {
    Ok(match (kind, codec_name(bytes)) {
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
                // Bytes have no order (zarr-python 3 names none for them).
                _ if kind == 'S' => '|',
                (1, _) if kind != 'U' => '|',
                (_, Some("little")) => '<',
                (_, Some("big")) => '>',
                _ => return Err("the bytes codec names no endianness".into()),
            };
            format!("{byte_order}{kind}{size}")
        }
        (_, other) => return Err(format!("codec {other:?} has no Zarr v2 equivalent")),
    })
}

/// The `fill_value` `.zarray` shows for v3 metadata `doc`, and whether the view serves a
/// chunk of the v3 fill value at keys the store has no chunk for ([`zarray_fill`]).
fn shown_fill(
    doc: &Map<String, Value>,
    data_type: &str,
    codecs: &[Value],
    kind: char,
    size: u32,
) -> Result<(Value, bool), String> {
    // The fill value as xarray on zarr 2 reads it (the CF `_FillValue`, `null` for none),
    // and the chunk of the v3 fill value that keeps missing chunks reading the same.
    let v3_fill = doc.get("fill_value").unwrap_or(&Value::Null);
    let wanted = match fill::attr_fill(doc, data_type) {
        Some(v) => v,
        // Only xarray masks the fill value, and it reads only arrays with dimension
        // names: those show `null` (nothing masked), the others the v3 fill value.
        None if has_dimension_names(doc) => Value::Null,
        None => v3_fill.clone(),
    };
    let (shown, chunk) = if fill::same_fill(data_type, &wanted, v3_fill) {
        (wanted, false)
    } else if fill::encodable(data_type, v3_fill, codecs) {
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
    Ok((fill, chunk))
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
    fill::fill_chunk(&data_type, fill, chunks, codecs)
}

/// The v2 key encoding the view shows for an array whose shards have `store` keys: the
/// same separator, so key directories mirror shard directories.
pub fn shown_keys(store: ChunkKeyEncoding) -> ChunkKeyEncoding {
    ChunkKeyEncoding {
        kind: KeyKind::V2,
        separator: store.separator,
    }
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
                2 => fill::half_to_f64(bits as u16),
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
