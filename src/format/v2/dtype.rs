//! Data types between Zarr v3 and numpy as Zarr v2 spells them: a v3 `data_type` as one
//! string, its numpy kind and item size, and a numpy type string back to a v3
//! `data_type`. Not the codecs ([`super::codecs`]) nor the documents that use these.

use serde_json::{Map, Value};

/// The `data_type` of v3 metadata `doc` as one string: its name, or for
/// `fixed_length_utf32` (numpy's `U`) `fixed_length_utf32:<length_bytes>`, for
/// `null_terminated_bytes` (numpy's `S`, zarr-python 3's name)
/// `null_terminated_bytes:<length_bytes>`.
pub(crate) fn data_type_name(doc: &Map<String, Value>) -> Result<String, String> {
    let length = |o: &Map<String, Value>| {
        o.get("configuration")
            .and_then(|c| c.get("length_bytes"))
            .and_then(Value::as_u64)
    };
    match doc.get("data_type") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Object(o))
            if o.get("name").and_then(Value::as_str) == Some("fixed_length_utf32") =>
        {
            let n = length(o)
                .filter(|n| n % 4 == 0 && *n > 0)
                .ok_or("fixed_length_utf32 without a length_bytes that is a multiple of 4")?;
            Ok(format!("fixed_length_utf32:{n}"))
        }
        Some(Value::Object(o))
            if o.get("name").and_then(Value::as_str) == Some("null_terminated_bytes") =>
        {
            let n = length(o)
                .filter(|n| *n > 0 && *n <= u64::from(u32::MAX))
                .ok_or("null_terminated_bytes without a length_bytes")?;
            Ok(format!("null_terminated_bytes:{n}"))
        }
        Some(other) => Err(format!("data type {other} has no Zarr v2 equivalent")),
        None => Err("no data_type".into()),
    }
}

/// `data_type` ([`data_type_name`]) → (numpy kind, item size; characters for `U`).
pub(super) fn v2_kind(data_type: &str) -> Option<(char, u32)> {
    if let Some(n) = data_type.strip_prefix("fixed_length_utf32:") {
        return Some(('U', n.parse::<u32>().ok()? / 4));
    }
    if let Some(n) = data_type.strip_prefix("null_terminated_bytes:") {
        return Some(('S', n.parse::<u32>().ok()?));
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
