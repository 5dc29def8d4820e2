//! A `.zarray` written through the view as a v3 `zarr.json` (v2 → v3), and the
//! comparisons made through that form (the same array but for its shape; the shape asked
//! for). Not `.zarray` of a v3 array ([`mod@super::zarray`]).

use serde_json::{Map, Value, json};

use super::codecs::{codec_chain, from_numcodecs};
use super::dtype::{data_type_name, numpy_dtype};
use crate::format::fill;
use crate::format::metadata::codec_name;

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
    let (data_type, codecs, kind) = data_type_and_codecs(&z, dtype, shape.len())?;
    let (fill, attributes) = v3_fill(&z, &data_type, kind);
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

/// The v3 `data_type` (`Value`: a name, or `fixed_length_utf32` with its length), codec
/// chain and numpy kind of `.zarray` `z` of numpy type `dtype` and `ndim` dimensions.
fn data_type_and_codecs(
    z: &Map<String, Value>,
    dtype: &str,
    ndim: usize,
) -> Result<(Value, Vec<Value>, char), String> {
    let bare = dtype.trim_start_matches(['<', '>', '|', '=']);
    Ok(if bare == "O" {
        let (t, c, k) = object_codecs(z)?;
        (Value::from(t), c, k)
    } else if let Some(n) = bare.strip_prefix('S') {
        // numpy's fixed-length bytes: zarr-python 3's `null_terminated_bytes`, laid out
        // by the bytes codec with no byte order, as zarr-python 3 writes it.
        let n: u64 = n
            .parse()
            .ok()
            .filter(|&n| n > 0 && n <= u64::from(u32::MAX))
            .ok_or(format!("dtype {dtype:?} is not a numpy type"))?;
        let mut codecs = codec_chain(z, "order", ndim, "little", |c| from_numcodecs(c, n as u32))?;
        for c in &mut codecs {
            if codec_name(c) == "bytes" {
                *c = json!({"name": "bytes"});
            }
        }
        let t = json!({"name": "null_terminated_bytes", "configuration": {"length_bytes": n}});
        (t, codecs, 'S')
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
        let codecs = codec_chain(z, "order", ndim, endian, |c| from_numcodecs(c, 4))?;
        let t = json!({"name": "fixed_length_utf32", "configuration": {"length_bytes": chars * 4}});
        (t, codecs, 'U')
    } else {
        let (data_type, endian, size) = numpy_dtype(dtype)?;
        let kind = dtype
            .trim_start_matches(['<', '>', '|', '='])
            .chars()
            .next()
            .unwrap_or(' ');
        let codecs = codec_chain(z, "order", ndim, endian, |c| from_numcodecs(c, size))?;
        (Value::from(data_type), codecs, kind)
    })
}

/// The v3 `fill_value` of `.zarray` `z` (v3 `data_type`, numpy `kind`), and the
/// attributes that keep what zarr 2 and xarray made of it.
fn v3_fill(z: &Map<String, Value>, data_type: &Value, kind: char) -> (Value, Map<String, Value>) {
    // `null` (xarray on zarr 2: nothing is masked) is stored as the v3 default; any other
    // fill value is also kept as the `_FillValue` attribute, as xarray on zarr 3 keeps
    // it, so that the view shows it again and xarray on zarr 3 masks what zarr 2 did.
    // `null` is kept as a `null` `_FillValue` until the array has dimension names
    // ([`apply_zattrs`]: xarray's arrays show `null` without it, and xarray on zarr 3
    // would take it for a value).
    let mut attributes = Map::new();
    if matches!(z.get("fill_value"), None | Some(Value::Null)) {
        attributes.insert(fill::FILL_VALUE_ATTR.into(), Value::Null);
    }
    let fill = match (z.get("fill_value"), kind) {
        (None | Some(Value::Null), 'b') => json!(false),
        (None | Some(Value::Null), 'c') => json!([0.0, 0.0]),
        (None | Some(Value::Null), 'f') => json!(0.0),
        (None | Some(Value::Null), 'O' | 'U' | 'S') => json!(""),
        // zarr 2's default fill value of object arrays is `0`, which no v3 string or
        // bytes array can have: none.
        (Some(v), 'O' | 'U' | 'S') if !v.is_string() => json!(""),
        (None | Some(Value::Null), _) => json!(0),
        (Some(v), _) => {
            attributes.insert(
                fill::FILL_VALUE_ATTR.into(),
                fill::attr_for(data_type.as_str().unwrap_or(""), v),
            );
            v.clone()
        }
    };
    (fill, attributes)
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
            attrs.remove(fill::FILL_VALUE_ATTR);
        }
        let element = data_type_name(&doc)
            .ok()
            .and_then(|t| fill::element(&t, &fill));
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
