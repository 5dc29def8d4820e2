//! Fill values across the v2 view: which `fill_value` a v3 array's `.zarray` shows, and
//! the encoded chunk of the v3 fill value the view serves where the store has no chunk
//! and the two differ. No I/O.
//!
//! Zarr v3 requires a fill value: it is what a missing chunk reads as, nothing more.
//! xarray on zarr 3 therefore keeps the CF `_FillValue` (the value it masks as missing)
//! in an attribute of that name, and writes none where it masks nothing. Zarr v2 has one
//! `fill_value` for both meanings: xarray on zarr 2 masks whatever it is, and `null`
//! masks nothing. So the v2 view shows, as `fill_value`,
//!
//! * the `_FillValue` attribute where there is one (decoded as xarray encodes it for v3:
//!   floats as base64 of a little-endian double, other types as JSON), and hides the
//!   attribute from `.zattrs`;
//! * `null` where there is none.
//!
//! zarr 2 reads a missing chunk of a `null` array as uninitialised memory, and one of
//! another fill as that fill, not the v3 one; wherever the shown fill differs from the
//! v3 fill value, the view therefore serves, at every key of the grid the store has no
//! chunk for, a chunk of the v3 fill value encoded with the array's codecs
//! ([`fill_chunk`]): zarr 2 reads the values zarr 3 reads. Codecs the view cannot encode
//! (`numcodecs.bz2`, `.lzma`, `.lz4`) keep the v3 fill value as `fill_value`.

use std::io::Write;

use base64::Engine;
use serde_json::Value;

use super::metadata::codec_name;

/// The attribute xarray keeps a variable's CF fill value in.
pub const FILL_VALUE_ATTR: &str = "_FillValue";

/// One element of fill value `v` of v3 `data_type`, little-endian; `None` for types and
/// spellings the view does not know. Strings are their UTF-8 bytes. NaNs are the one
/// canonical NaN, so that fill values compare by meaning.
pub fn element(data_type: &str, v: &Value) -> Option<Vec<u8>> {
    let float = |v: &Value, size: u32| -> Option<f64> {
        Some(match v {
            Value::Number(n) => n.as_f64()?,
            Value::String(s) => match s.as_str() {
                "NaN" => f64::NAN,
                "Infinity" => f64::INFINITY,
                "-Infinity" => f64::NEG_INFINITY,
                hex => {
                    let bits = u64::from_str_radix(hex.strip_prefix("0x")?, 16).ok()?;
                    match size {
                        2 => half_to_f64(bits as u16),
                        4 => f64::from(f32::from_bits(bits as u32)),
                        8 => f64::from_bits(bits),
                        _ => return None,
                    }
                }
            },
            _ => return None,
        })
    };
    let float_bytes = |x: f64, size: u32| -> Option<Vec<u8>> {
        let x = if x.is_nan() { f64::NAN } else { x };
        Some(match size {
            2 => f64_to_half(x).to_le_bytes().to_vec(),
            4 => (x as f32).to_le_bytes().to_vec(),
            8 => x.to_le_bytes().to_vec(),
            _ => return None,
        })
    };
    // An integer that the type holds (`300` is no `int8`).
    let int = |v: &Value, size: usize, signed: bool| -> Option<Vec<u8>> {
        let bits = 8 * size as u32;
        let bytes = if signed {
            let x = v.as_i64()?;
            let fits = bits == 64 || (-(1i64 << (bits - 1))..(1i64 << (bits - 1))).contains(&x);
            fits.then_some(x.to_le_bytes())?
        } else {
            let x = v.as_u64()?;
            (bits == 64 || x < (1u64 << bits)).then_some(x.to_le_bytes())?
        };
        Some(bytes[..size].to_vec())
    };
    Some(match data_type {
        "bool" => vec![u8::from(v.as_bool()?)],
        "int8" => int(v, 1, true)?,
        "int16" => int(v, 2, true)?,
        "int32" => int(v, 4, true)?,
        "int64" => int(v, 8, true)?,
        "uint8" => int(v, 1, false)?,
        "uint16" => int(v, 2, false)?,
        "uint32" => int(v, 4, false)?,
        "uint64" => int(v, 8, false)?,
        "float16" => float_bytes(float(v, 2)?, 2)?,
        "float32" => float_bytes(float(v, 4)?, 4)?,
        "float64" => float_bytes(float(v, 8)?, 8)?,
        "complex64" | "complex128" => {
            let size = if data_type == "complex64" { 4 } else { 8 };
            let parts = v.as_array().filter(|p| p.len() == 2)?;
            let mut out = float_bytes(float(&parts[0], size)?, size)?;
            out.extend(float_bytes(float(&parts[1], size)?, size)?);
            out
        }
        "string" => v.as_str()?.as_bytes().to_vec(),
        t if t.starts_with("null_terminated_bytes:") => {
            // numpy's `S`: the bytes (base64 in v2 and v3 metadata alike), padded with
            // zeros to the length.
            let len: usize = t.strip_prefix("null_terminated_bytes:")?.parse().ok()?;
            let mut out = base64::engine::general_purpose::STANDARD
                .decode(v.as_str()?)
                .ok()?;
            if out.len() > len {
                return None;
            }
            out.resize(len, 0);
            out
        }
        t => {
            // numpy's `U`: UTF-32 code units, padded with zeros to the length.
            let len: usize = t.strip_prefix("fixed_length_utf32:")?.parse().ok()?;
            let mut out: Vec<u8> = v
                .as_str()?
                .chars()
                .flat_map(|c| u32::from(c).to_le_bytes())
                .collect();
            if out.len() > len {
                return None;
            }
            out.resize(len, 0);
            out
        }
    })
}

/// The `_FillValue` attribute of a v3 array, as the JSON value it means for `data_type`
/// (xarray's encoding for Zarr v3 decoded: a float is base64 of a little-endian double;
/// a plain number or `"NaN"` is taken as it is; `null`, which shardfs stores for a v2
/// `fill_value: null` written through the view, is `null`). `None`: no such attribute.
///
/// An attribute that means no value of the data type (`-1` of a `uint8`, `"abc"` of an
/// `int32`: a converter's, not xarray's) is not taken: `None`, and `.zattrs` shows it.
pub fn attr_fill(doc: &serde_json::Map<String, Value>, data_type: &str) -> Option<Value> {
    let v = decoded_attr(doc, data_type)?;
    (v.is_null() || element(data_type, &v).is_some()).then_some(v)
}

fn decoded_attr(doc: &serde_json::Map<String, Value>, data_type: &str) -> Option<Value> {
    let v = doc.get("attributes")?.get(FILL_VALUE_ATTR)?;
    if data_type.starts_with("float")
        && let Some(s) = v.as_str()
        && !matches!(s, "NaN" | "Infinity" | "-Infinity")
        && !s.starts_with("0x")
        && let Ok(b) = base64::engine::general_purpose::STANDARD.decode(s)
        && let Ok(b) = <[u8; 8]>::try_from(b.as_slice())
    {
        let x = f64::from_le_bytes(b);
        return Some(if x.is_nan() {
            "NaN".into()
        } else if x.is_infinite() {
            if x > 0.0 { "Infinity" } else { "-Infinity" }.into()
        } else {
            serde_json::json!(x)
        });
    }
    Some(v.clone())
}

/// The `_FillValue` attribute that keeps v2 `fill_value` `v` (written through the view)
/// for `data_type`, as xarray on zarr 3 writes it.
pub fn attr_for(data_type: &str, v: &Value) -> Value {
    if data_type.starts_with("float")
        && let Some(e) = element("float64", v)
    {
        return base64::engine::general_purpose::STANDARD.encode(e).into();
    }
    v.clone()
}

/// Whether v2 fill value `shown` (`null`: none) means what v3 fill value `v3` does for
/// missing chunks.
pub fn same_fill(data_type: &str, shown: &Value, v3: &Value) -> bool {
    !shown.is_null() && element(data_type, shown).is_some_and(|s| element(data_type, v3) == Some(s))
}

/// The bytes→bytes codecs [`fill_chunk`] encodes with.
const ENCODES: &[&str] = &["crc32c", "gzip", "numcodecs.zlib", "zstd", "blosc"];

/// Whether [`fill_chunk`] can encode a chunk of `fill` with `codecs` (cheap: no chunk is
/// made).
pub fn encodable(data_type: &str, fill: &Value, codecs: &[Value]) -> bool {
    element(data_type, fill).is_some()
        && codecs.iter().all(|c| {
            let name = codec_name(c);
            matches!(name, "transpose" | "bytes" | "vlen-utf8" | "vlen-bytes")
                || ENCODES.contains(&name)
        })
}

/// A chunk of `chunk_shape` elements of fill value `fill` of `data_type`, encoded with
/// the v3 codec chain `codecs` (array→bytes, then bytes→bytes); `Err` says which codec
/// the view cannot encode.
pub fn fill_chunk(
    data_type: &str,
    fill: &Value,
    chunk_shape: &[u64],
    codecs: &[Value],
) -> Result<Vec<u8>, String> {
    let n = chunk_shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .and_then(|n| usize::try_from(n).ok())
        .ok_or("the chunk is too large")?;
    let elem = element(data_type, fill).ok_or(format!(
        "fill value {fill} of data type {data_type:?} is not understood"
    ))?;
    let mut data: Option<Vec<u8>> = None;
    for codec in codecs {
        let name = codec_name(codec);
        let config = codec.get("configuration");
        if name == "transpose" && data.is_none() {
            continue; // every element is the same
        }
        data = Some(match data {
            None => fill_bytes(name, config, data_type, &elem, n)?,
            Some(d) => encode_bytes(name, config, d)?,
        });
    }
    data.ok_or_else(|| "the codec chain has no array-to-bytes codec".into())
}

/// The array-to-bytes codec `name` (with `config`) applied to `n` elements whose bytes
/// are each `elem` (native order), of `data_type`.
fn fill_bytes(
    name: &str,
    config: Option<&Value>,
    data_type: &str,
    elem: &[u8],
    n: usize,
) -> Result<Vec<u8>, String> {
    let get = |k: &str| config.and_then(|c| c.get(k));
    Ok(match name {
        "bytes" => {
            let mut e = elem.to_vec();
            if get("endian").and_then(Value::as_str) == Some("big") {
                let size = if data_type.starts_with("complex") {
                    e.len() / 2
                } else if data_type.starts_with("fixed_length_utf32") {
                    4
                } else {
                    e.len()
                };
                for part in e.chunks_mut(size.max(1)) {
                    part.reverse();
                }
            }
            e.repeat(n)
        }
        "vlen-utf8" | "vlen-bytes" => {
            // numcodecs' VLenUTF8 layout, which the v3 codec shares: the item count, then
            // each item's length and bytes (lengths and count u32 little-endian).
            let len = u32::try_from(elem.len()).map_err(|_| "fill value too long")?;
            let count = u32::try_from(n).map_err(|_| "the chunk is too large")?;
            let mut out = Vec::with_capacity(4 + n * (4 + elem.len()));
            out.extend(count.to_le_bytes());
            for _ in 0..n {
                out.extend(len.to_le_bytes());
                out.extend(elem);
            }
            out
        }
        other => return Err(format!("codec {other:?} cannot encode a fill chunk here")),
    })
}

/// The bytes-to-bytes codec `name` (with `config`) applied to `d`.
fn encode_bytes(name: &str, config: Option<&Value>, mut d: Vec<u8>) -> Result<Vec<u8>, String> {
    let get = |k: &str| config.and_then(|c| c.get(k));
    Ok(match name {
        "crc32c" => {
            let sum = crc32c::crc32c(&d);
            d.extend(sum.to_le_bytes());
            d
        }
        "gzip" | "numcodecs.zlib" => {
            use std::io::Read;
            let level = get("level").and_then(Value::as_u64).unwrap_or(1).min(9) as u32;
            let level = flate2::Compression::new(level);
            let mut out = Vec::new();
            if name == "gzip" {
                flate2::read::GzEncoder::new(d.as_slice(), level).read_to_end(&mut out)
            } else {
                flate2::read::ZlibEncoder::new(d.as_slice(), level).read_to_end(&mut out)
            }
            .map_err(|e| e.to_string())?;
            out
        }
        "zstd" => {
            let level = get("level").and_then(Value::as_i64).unwrap_or(0) as i32;
            let mut e = zstd::stream::Encoder::new(Vec::new(), level).map_err(|e| e.to_string())?;
            e.include_checksum(get("checksum").and_then(Value::as_bool) == Some(true))
                .map_err(|e| e.to_string())?;
            e.include_contentsize(true).map_err(|e| e.to_string())?;
            e.set_pledged_src_size(Some(d.len() as u64))
                .map_err(|e| e.to_string())?;
            e.write_all(&d).map_err(|e| e.to_string())?;
            e.finish().map_err(|e| e.to_string())?
        }
        "blosc" => {
            let typesize = get("typesize").and_then(Value::as_u64).unwrap_or(1);
            blosc_memcpyed(&d, typesize)?
        }
        other => return Err(format!("codec {other:?} cannot encode a fill chunk here")),
    })
}

/// A blosc1 frame holding `data` uncompressed (the "memcpyed" flag of its header): what
/// blosc itself writes for data it cannot shrink, and decodes by copying.
fn blosc_memcpyed(data: &[u8], typesize: u64) -> Result<Vec<u8>, String> {
    const HEADER: usize = 16;
    let nbytes = u32::try_from(data.len())
        .ok()
        .filter(|&n| n as usize <= i32::MAX as usize - HEADER)
        .ok_or("the chunk is too large for one blosc frame")?;
    let mut out = Vec::with_capacity(HEADER + data.len());
    out.push(2); // format version
    out.push(1); // version of the compressor's format
    out.push(0x02); // flags: memcpyed, no shuffle
    out.push(u8::try_from(typesize.clamp(1, 255)).unwrap_or(1));
    out.extend(nbytes.to_le_bytes());
    out.extend(nbytes.to_le_bytes()); // blocksize: one block
    out.extend((nbytes + HEADER as u32).to_le_bytes());
    out.extend(data);
    Ok(out)
}

fn f64_to_half(x: f64) -> u16 {
    let f = x as f32;
    let bits = f.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    if f.is_nan() {
        return sign | 0x7e00;
    }
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    let mant = bits & 0x7f_ffff;
    if exp >= 0x1f {
        sign | 0x7c00
    } else if exp <= 0 {
        if exp < -10 {
            sign
        } else {
            let m = (mant | 0x80_0000) >> (1 - exp + 13);
            sign | m as u16
        }
    } else {
        sign | ((exp as u16) << 10) | (mant >> 13) as u16
    }
}

/// An IEEE 754 half-precision float's value.
pub(super) fn half_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f64::from(h & 0x3ff);
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn xarray_float_fill_attributes_decode() {
        // xarray on zarr 3: base64 of the little-endian double.
        let nan = base64::engine::general_purpose::STANDARD.encode(f64::NAN.to_le_bytes());
        let doc = json!({"attributes": {"_FillValue": nan}});
        assert_eq!(
            attr_fill(doc.as_object().unwrap(), "float32"),
            Some(json!("NaN"))
        );
        let doc = json!({"attributes": {"_FillValue": -9999}});
        assert_eq!(
            attr_fill(doc.as_object().unwrap(), "int32"),
            Some(json!(-9999))
        );
        assert_eq!(attr_fill(json!({}).as_object().unwrap(), "int32"), None);
        assert_eq!(attr_for("float64", &json!("NaN")), json!(nan));
        assert_eq!(attr_for("int16", &json!(7)), json!(7));
    }

    #[test]
    fn fills_compare_by_meaning() {
        assert!(same_fill("float32", &json!("NaN"), &json!("0x7fc00000")));
        assert!(!same_fill("float32", &json!("NaN"), &json!(0.0)));
        assert!(!same_fill("int32", &Value::Null, &json!(0)));
        assert!(same_fill("int32", &json!(0), &json!(0)));
    }

    #[test]
    fn fill_chunks_decode_as_the_fill() {
        let bytes = json!({"name": "bytes", "configuration": {"endian": "big"}});
        let c = fill_chunk("uint16", &json!(258), &[3], std::slice::from_ref(&bytes)).unwrap();
        assert_eq!(c, [1, 2, 1, 2, 1, 2]);
        let c = fill_chunk(
            "int8",
            &json!(-1),
            &[2, 2],
            &[bytes.clone(), json!({"name": "crc32c"})],
        )
        .unwrap();
        assert_eq!(&c[..4], &[0xff; 4]);
        assert_eq!(
            u32::from_le_bytes(c[4..].try_into().unwrap()),
            crc32c::crc32c(&[0xff; 4])
        );
        let zstd = json!({"name": "zstd", "configuration": {"level": 3, "checksum": true}});
        let c = fill_chunk("float32", &json!(1.5), &[64, 64], &[bytes.clone(), zstd]).unwrap();
        let d = zstd::decode_all(c.as_slice()).unwrap();
        assert_eq!(d, 1.5f32.to_be_bytes().repeat(64 * 64));
        let gz = json!({"name": "gzip", "configuration": {"level": 5}});
        let c = fill_chunk("uint8", &json!(9), &[100], &[bytes.clone(), gz]).unwrap();
        let mut d = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(c.as_slice()), &mut d)
            .unwrap();
        assert_eq!(d, vec![9u8; 100]);
        let zlib = json!({"name": "numcodecs.zlib", "configuration": {"level": 1}});
        let c = fill_chunk("uint8", &json!(3), &[50], &[json!({"name": "bytes"}), zlib]).unwrap();
        let mut d = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::ZlibDecoder::new(c.as_slice()), &mut d)
            .unwrap();
        assert_eq!(d, vec![3u8; 50]);
        let blosc = json!({"name": "blosc", "configuration": {"typesize": 2}});
        let c = fill_chunk("uint16", &json!(1), &[4], &[bytes, blosc]).unwrap();
        assert_eq!(c.len(), 16 + 8);
        assert_eq!(c[2], 0x02);
        let s = fill_chunk(
            "string",
            &json!("ab"),
            &[2],
            &[json!({"name": "vlen-utf8"})],
        )
        .unwrap();
        assert_eq!(
            s,
            [2, 0, 0, 0, 2, 0, 0, 0, b'a', b'b', 2, 0, 0, 0, b'a', b'b']
        );
        let lz4 = json!({"name": "numcodecs.lz4"});
        assert!(fill_chunk("uint8", &json!(0), &[1], &[json!({"name": "bytes"}), lz4]).is_err());
    }
}
