//! Tests of `v2` (kept beside it to keep that file about the code).
use serde_json::{Map, Value, json};

use super::codecs::to_numcodecs;
use super::*;
use crate::format::key::{ChunkKeyEncoding, KeyKind};

fn doc(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

const SLASH: ChunkKeyEncoding = ChunkKeyEncoding::DEFAULT;

#[test]
fn dtypes_orders_and_codecs_map_to_numcodecs() {
    let d = doc(json!({"data_type": "uint16", "fill_value": 3, "attributes": {"_FillValue": 3}}));
    let codecs = [
        json!({"name": "transpose", "configuration": {"order": [1, 0]}}),
        json!({"name": "bytes", "configuration": {"endian": "big"}}),
        json!({"name": "gzip", "configuration": {"level": 5}}),
        json!({"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "bitshuffle", "typesize": 2, "blocksize": 0}}),
    ];
    let z = zarray(&d, &[10, 7], &[2, 3], &codecs, shown_keys(SLASH)).unwrap();
    assert_eq!(z["dtype"], ">u2");
    assert_eq!(z["order"], "F");
    assert_eq!(z["filters"], json!([{"id": "gzip", "level": 5}]));
    assert_eq!(
        z["compressor"],
        json!({"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 2, "blocksize": 0})
    );
    assert_eq!(z["dimension_separator"], "/");
    assert_eq!(z["fill_value"], 3);
    // And back: the same .zarray again.
    let back = v3_from_zarray(&to_bytes(&z)).unwrap();
    let z2 = zarray(
        &back,
        &[10, 7],
        &[2, 3],
        back["codecs"].as_array().unwrap(),
        shown_keys(SLASH),
    )
    .unwrap();
    assert_eq!(z, z2);
}

#[test]
fn one_byte_types_have_no_byte_order_and_bool_maps() {
    let bytes = [json!({"name": "bytes"})];
    for (dt, want) in [("uint8", "|u1"), ("int8", "|i1"), ("bool", "|b1")] {
        let d = doc(json!({"data_type": dt, "fill_value": 0}));
        let z = zarray(&d, &[4], &[2], &bytes, shown_keys(SLASH)).unwrap();
        assert_eq!(z["dtype"], want);
        assert_eq!(z["compressor"], Value::Null);
        assert_eq!(z["filters"], Value::Null);
    }
    let d = doc(json!({"data_type": "uint16", "fill_value": 0}));
    assert!(zarray(&d, &[4], &[2], &bytes, shown_keys(SLASH)).is_err());
}

#[test]
fn fill_values_follow_v2_conventions() {
    let le = [json!({"name": "bytes", "configuration": {"endian": "little"}})];
    for (dt, fill, want) in [
        ("float32", json!("NaN"), json!("NaN")),
        ("float64", json!("-Infinity"), json!("-Infinity")),
        ("float32", json!("0x7fc00000"), json!("NaN")),
        ("float64", json!("0x3ff0000000000000"), json!(1.0)),
        ("float16", json!("0x7c00"), json!("Infinity")),
        ("float16", json!("0x3c00"), json!(1.0)),
        ("complex64", json!([1.0, "NaN"]), json!([1.0, "NaN"])),
        ("bool", json!(true), json!(true)),
    ] {
        // Shown where the array keeps it as its CF `_FillValue` (xarray's convention).
        let d = doc(
            json!({"data_type": dt, "fill_value": fill, "node_type": "array", "attributes": {"_FillValue": fill}}),
        );
        let (z, chunk) = zarray_fill(&d, &[4], &[2], &le, shown_keys(SLASH)).unwrap();
        assert_eq!(z["fill_value"], want, "{dt} {fill}");
        assert!(!chunk, "the same fill: missing chunks read the same");
        assert!(!zattrs(&d).as_object().unwrap().contains_key("_FillValue"));
    }
}

/// Issue 38: without a `_FillValue` attribute nothing is masked (`null`), and missing
/// chunks are served as chunks of the v3 fill value; with one that differs from the v3
/// fill value, it is shown, and missing chunks still read as the v3 fill value.
#[test]
fn fill_value_null_unless_the_array_keeps_a_cf_fill_value() {
    let le = [json!({"name": "bytes", "configuration": {"endian": "little"}})];
    let d = doc(json!({"data_type": "int32", "fill_value": 0, "node_type": "array"}));
    let (z, chunk) = zarray_fill(&d, &[4], &[2], &le, shown_keys(SLASH)).unwrap();
    assert_eq!(
        z["fill_value"], 0,
        "no dimension names: no xarray reader, the v3 fill"
    );
    assert!(!chunk);
    let d = doc(
        json!({"data_type": "int32", "fill_value": 0, "node_type": "array",
                       "dimension_names": ["x"]}),
    );
    let (z, chunk) = zarray_fill(&d, &[4], &[2], &le, shown_keys(SLASH)).unwrap();
    assert_eq!(z["fill_value"], Value::Null);
    assert!(chunk);
    assert_eq!(fill_chunk(&d, &[2], &le).unwrap(), vec![0u8; 8]);
    let nan = "AAAAAAAA+H8="; // xarray's base64 of the little-endian double NaN
    let d = doc(
        json!({"data_type": "float32", "fill_value": 0.0, "node_type": "array",
                       "attributes": {"_FillValue": nan, "units": "K"}}),
    );
    let (z, chunk) = zarray_fill(&d, &[4], &[2], &le, shown_keys(SLASH)).unwrap();
    assert_eq!(z["fill_value"], "NaN");
    assert!(chunk);
    assert_eq!(fill_chunk(&d, &[2], &le).unwrap(), vec![0u8; 8]);
    assert_eq!(zattrs(&d), json!({"units": "K"}));
    // A compressor the view cannot encode a chunk with: the v3 fill value, no chunks.
    let lz4 = [
        le[0].clone(),
        json!({"name": "numcodecs.lz4", "configuration": {}}),
    ];
    let (z, chunk) = zarray_fill(&d, &[4], &[2], &lz4, shown_keys(SLASH)).unwrap();
    assert_eq!(z["fill_value"], 0.0);
    assert!(!chunk);
    // A `.zattrs` written back keeps the attribute `.zattrs` does not show.
    let mut back = d.clone();
    apply_zattrs(&mut back, &to_bytes(&json!({"units": "C"})), Some(1), "t").unwrap();
    assert_eq!(back["attributes"], json!({"units": "C", "_FillValue": nan}));
    // And a v2 `.zarray` round trip, with and without dimension names (xarray writes
    // `.zattrs` right after): null stays null, a fill value is kept.
    for (fill, dims) in [
        (Value::Null, false),
        (Value::Null, true),
        (json!(-9), false),
    ] {
        let z = json!({"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<i4",
                       "fill_value": fill, "compressor": null, "filters": null, "order": "C"});
        let mut v3 = v3_from_zarray(&to_bytes(&z)).unwrap();
        if dims {
            let zattrs = to_bytes(&json!({"_ARRAY_DIMENSIONS": ["x"]}));
            apply_zattrs(&mut v3, &zattrs, Some(1), "a").unwrap();
            assert_eq!(
                v3["attributes"],
                json!({}),
                "no null _FillValue left for xarray on zarr 3"
            );
        }
        let codecs = v3["codecs"].as_array().unwrap().clone();
        let (shown, _) = zarray_fill(&v3, &[4], &[2], &codecs, shown_keys(SLASH)).unwrap();
        assert_eq!(shown["fill_value"], fill);
    }
}

/// Issue 38: v3 strings (`vlen-utf8`) are v2 objects with the `vlen-utf8` filter, both ways.
#[test]
fn strings_are_v2_objects_with_the_vlen_utf8_filter() {
    let codecs = [
        json!({"name": "vlen-utf8"}),
        json!({"name": "zstd", "configuration": {"level": 0, "checksum": false}}),
    ];
    let d = doc(
        json!({"data_type": "string", "fill_value": "", "node_type": "array",
                       "dimension_names": ["x"]}),
    );
    let (z, chunk) = zarray_fill(&d, &[3], &[2], &codecs, shown_keys(SLASH)).unwrap();
    assert_eq!(z["dtype"], "|O");
    assert_eq!(z["filters"], json!([{"id": "vlen-utf8"}]));
    assert_eq!(z["compressor"], json!({"id": "zstd", "level": 0}));
    assert_eq!(z["fill_value"], Value::Null);
    assert!(chunk);
    let chunk = zstd::decode_all(fill_chunk(&d, &[2], &codecs).unwrap().as_slice()).unwrap();
    assert_eq!(chunk, [2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let back = v3_from_zarray(&to_bytes(&z)).unwrap();
    assert_eq!(back["data_type"], "string");
    assert_eq!(back["fill_value"], "");
    assert_eq!(back["codecs"], json!(codecs));
}

#[test]
fn arrays_without_a_v2_form_say_why() {
    let le = json!({"name": "bytes", "configuration": {"endian": "little"}});
    let cases = [
        (json!({"data_type": "string"}), vec![le.clone()], "bytes"),
        (
            json!({"data_type": "float8"}),
            vec![le.clone()],
            "data type",
        ),
        (
            json!({"data_type": "uint16"}),
            vec![
                json!({"name": "transpose", "configuration": {"order": [1, 0, 2]}}),
                le.clone(),
            ],
            "transpose",
        ),
        (
            json!({"data_type": "uint16"}),
            vec![le.clone(), json!({"name": "lz4hc"})],
            "lz4hc",
        ),
        (
            json!({"data_type": "uint16"}),
            vec![json!({"name": "vlen-bytes"})],
            "vlen-bytes",
        ),
    ];
    for (d, codecs, why) in cases {
        let err = zarray(&doc(d), &[4, 4, 4], &[2, 2, 2], &codecs, shown_keys(SLASH)).unwrap_err();
        assert!(err.contains(why), "{err}");
    }
}

#[test]
fn zattrs_carry_dimension_names_both_ways() {
    let d = doc(json!({"attributes": {"a": 1}, "dimension_names": ["y", "x"]}));
    let z = zattrs(&d);
    assert_eq!(z, json!({"a": 1, "_ARRAY_DIMENSIONS": ["y", "x"]}));
    let mut back = doc(json!({"attributes": {}}));
    apply_zattrs(
        &mut back,
        &to_bytes(&json!({"b": 2, "_ARRAY_DIMENSIONS": ["t", "z"]})),
        Some(2),
        "a",
    )
    .unwrap();
    assert_eq!(back["attributes"], json!({"b": 2}));
    assert_eq!(back["dimension_names"], json!(["t", "z"]));
    // Wrong rank: kept as an attribute.
    let mut g = doc(json!({}));
    apply_zattrs(&mut g, br#"{"_ARRAY_DIMENSIONS": ["t"]}"#, Some(2), "g").unwrap();
    assert_eq!(g["attributes"], json!({"_ARRAY_DIMENSIONS": ["t"]}));
    assert!(apply_zattrs(&mut g, b"[1]", None, "g").is_err());
}

#[test]
fn zarray_from_zarr_python_2_becomes_a_v3_array() {
    let z = br#"{"chunks": [2, 3], "compressor": {"id": "zstd", "level": 3, "checksum": false},
        "dimension_separator": ".", "dtype": "<f8", "fill_value": "NaN", "filters": null,
        "order": "C", "shape": [10, 7], "zarr_format": 2}"#;
    let d = v3_from_zarray(z).unwrap();
    assert_eq!(d["data_type"], "float64");
    assert_eq!(d["fill_value"], "NaN");
    assert_eq!(
        d["chunk_key_encoding"],
        json!({"name": "v2", "configuration": {"separator": "."}})
    );
    assert_eq!(
        d["codecs"][1],
        json!({"name": "zstd", "configuration": {"level": 3, "checksum": false}})
    );
    for bad in [
        &br#"{"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "|O", "order": "C"}"#[..],
        br#"{"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<u2", "compressor": {"id": "imagecodecs_jpeg"}}"#,
        br#"{"zarr_format": 2, "shape": [4], "chunks": [0], "dtype": "<u2"}"#,
        br#"{"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": [["a", "<u2"]]}"#,
        b"{]",
    ] {
        assert!(v3_from_zarray(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
    // numcodecs compressors without a v3 name of their own: `numcodecs.<id>`, both ways.
    for (id, config) in [("zlib", json!({"level": 4})), ("bz2", json!({"level": 9}))] {
        let mut c = config.clone();
        c["id"] = id.into();
        let zarray = json!({"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<u2",
            "compressor": c, "fill_value": 0, "order": "C", "filters": null});
        let d = v3_from_zarray(zarray.to_string().as_bytes()).unwrap();
        let want = json!({"name": format!("numcodecs.{id}"), "configuration": config});
        assert_eq!(d["codecs"][1], want);
        assert_eq!(to_numcodecs(&want).unwrap(), c);
    }
    // A 1-D array keeps order F through a transpose [0].
    let f1 =
        br#"{"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<u2", "compressor": null,
        "fill_value": 0, "order": "F", "filters": null}"#;
    let d = v3_from_zarray(f1).unwrap();
    assert_eq!(
        d["codecs"][0],
        json!({"name": "transpose", "configuration": {"order": [0]}})
    );
    let codecs = d["codecs"].as_array().unwrap().clone();
    let back = zarray(&d, &[4], &[2], &codecs, shown_keys(SLASH));
    assert_eq!(back.unwrap()["order"], "F");
    let resized = z.to_vec();
    let resized = String::from_utf8(resized)
        .unwrap()
        .replace("[10, 7]", "[20, 7]");
    assert!(same_but_shape(z, resized.as_bytes()).unwrap());
    assert_eq!(zarray_shape(resized.as_bytes()).unwrap(), [20, 7]);
    let other = String::from_utf8(z.to_vec()).unwrap().replace("<f8", "<f4");
    assert!(!same_but_shape(z, other.as_bytes()).unwrap());
}

#[test]
fn unsharded_arrays_translate_keys_both_ways() {
    use crate::format::v2::{PlainEntry as E, PlainKeys, PlainName as N};
    let enc = |name: &str, sep: char| ChunkKeyEncoding {
        kind: if name == "v2" {
            KeyKind::V2
        } else {
            KeyKind::Default
        },
        separator: sep,
    };
    // default, nested: c/i/j <-> i/j
    let k = PlainKeys {
        store: enc("default", '/'),
        ndim: 2,
    };
    assert_eq!(k.store_name("3"), N::Key("c/3".into()));
    assert_eq!(k.store_name("c"), N::Hidden);
    assert_eq!(k.store_name("zarr.json"), N::Hidden);
    assert_eq!(k.store_name("3.abc.partial"), N::AsIs);
    assert_eq!(k.v2_name("c"), E::Expand);
    assert_eq!(k.v2_name("zarr.json"), E::Hidden);
    assert_eq!(k.v2_name("notes.txt"), E::AsIs);
    assert_eq!(k.v2_name_in_c("12"), Some("12".into()));
    assert_eq!(k.v2_name_in_c("x"), None);
    // 1-D nested: a key, not a directory.
    let k = PlainKeys {
        store: enc("default", '/'),
        ndim: 1,
    };
    assert_eq!(k.store_name("7"), N::Key("c/7".into()));
    // default, flat: c.i.j <-> i.j
    let k = PlainKeys {
        store: enc("default", '.'),
        ndim: 2,
    };
    assert_eq!(k.store_name("1.2"), N::Key("c.1.2".into()));
    assert_eq!(k.store_name("c.1.2"), N::Hidden);
    assert_eq!(k.store_name("1.2.abc.partial"), N::AsIs);
    assert_eq!(k.v2_name("c.1.2"), E::Shown("1.2".into()));
    // A store file that looks like a v2 key would be shadowed: not shown.
    assert_eq!(k.v2_name("1.2"), E::Hidden);
    // 0-d: c <-> 0
    let k = PlainKeys {
        store: enc("default", '/'),
        ndim: 0,
    };
    assert_eq!(k.store_name("0"), N::Key("c".into()));
    assert_eq!(k.v2_name("c"), E::Shown("0".into()));
    // v2 keys in the store: the same names.
    let k = PlainKeys {
        store: enc("v2", '.'),
        ndim: 2,
    };
    assert_eq!(k.store_name("1.2"), N::Key("1.2".into()));
    assert_eq!(k.v2_name("1.2"), E::Shown("1.2".into()));
    let k = PlainKeys {
        store: enc("v2", '/'),
        ndim: 2,
    };
    assert_eq!(k.store_name("4"), N::Key("4".into()));
    assert_eq!(k.v2_name("4"), E::Shown("4".into()));
}

#[test]
fn an_unsharded_array_has_a_zarray() {
    let d = doc(json!({
        "zarr_format": 3, "node_type": "array", "shape": [10, 7], "data_type": "uint16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 4]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                   {"name": "zstd", "configuration": {"level": 0, "checksum": false}}]
    }));
    let (z, keys) = crate::format::v2::plain_zarray(&d).unwrap();
    assert_eq!(z["chunks"], json!([4, 4]));
    assert_eq!(z["dtype"], "<u2");
    assert_eq!(z["dimension_separator"], "/");
    assert_eq!(z["compressor"]["id"], "zstd");
    assert_eq!(keys.ndim, 2);
    let mut odd = d.clone();
    odd.insert("data_type".into(), json!("string"));
    assert!(crate::format::v2::plain_zarray(&odd).is_err());
}

/// A resize through the view writes back the `.zarray` it read: a float fill value shown
/// as `0.0` and written as `0` is the same fill value.
#[test]
fn a_resize_compares_fill_values_by_meaning() {
    let a = json!({"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<f4",
                   "fill_value": 0.0, "compressor": null, "filters": null, "order": "C"});
    let mut b = a.clone();
    b["fill_value"] = json!(0);
    b["shape"] = json!([6]);
    assert!(same_but_shape(&to_bytes(&a), &to_bytes(&b)).unwrap());
    b["fill_value"] = json!(1);
    assert!(!same_but_shape(&to_bytes(&a), &to_bytes(&b)).unwrap());
}

/// Issue 38: variable-length bytes (`vlen-bytes`) and numpy's fixed-width unicode
/// (`fixed_length_utf32`) have their v2 forms too, both ways.
#[test]
fn vlen_bytes_and_fixed_width_unicode_map_both_ways() {
    let zstd = json!({"name": "zstd", "configuration": {"level": 0, "checksum": false}});
    let d =
        doc(json!({"data_type": "variable_length_bytes", "fill_value": "", "node_type": "array"}));
    let codecs = [json!({"name": "vlen-bytes"}), zstd.clone()];
    let z = zarray(&d, &[3], &[2], &codecs, shown_keys(SLASH)).unwrap();
    assert_eq!(z["dtype"], "|O");
    assert_eq!(z["filters"], json!([{"id": "vlen-bytes"}]));
    let back = v3_from_zarray(&to_bytes(&z)).unwrap();
    assert_eq!(back["data_type"], "variable_length_bytes");
    assert_eq!(back["codecs"], json!(codecs));
    let u = json!({"name": "fixed_length_utf32", "configuration": {"length_bytes": 12}});
    let d = doc(
        json!({"data_type": u, "fill_value": "", "node_type": "array", "dimension_names": ["y"]}),
    );
    let le = json!({"name": "bytes", "configuration": {"endian": "little"}});
    let codecs = [le, zstd];
    let (z, fills) = zarray_fill(&d, &[4], &[4], &codecs, shown_keys(SLASH)).unwrap();
    assert_eq!(z["dtype"], "<U3");
    assert_eq!(z["fill_value"], Value::Null);
    assert!(fills);
    let chunk = zstd::decode_all(fill_chunk(&d, &[4], &codecs).unwrap().as_slice()).unwrap();
    assert_eq!(chunk, vec![0u8; 48]);
    let back = v3_from_zarray(&to_bytes(&z)).unwrap();
    assert_eq!(back["data_type"], u);
    assert_eq!(back["codecs"], json!(codecs));
}

/// numpy's fixed-length bytes (`|S`n, which xarray writes for a variable of short byte
/// strings) is zarr-python 3's `null_terminated_bytes` of `n` bytes, both ways: the same
/// chunk bytes, the fill value base64 in both (zarr-python 2 and 3 write it so), a chunk
/// of it for keys the store has no chunk for. Before, the v2 view refused it.
#[test]
fn fixed_length_bytes_map_both_ways() {
    let t = json!({"name": "null_terminated_bytes", "configuration": {"length_bytes": 5}});
    let zstd = json!({"name": "zstd", "configuration": {"level": 0, "checksum": false}});
    // zarr-python 3 writes the bytes codec without an endianness for it.
    let codecs = [json!({"name": "bytes"}), zstd];
    let d = doc(json!({"data_type": t, "fill_value": "YWI=", "node_type": "array"}));
    let (z, fills) = zarray_fill(&d, &[4], &[2], &codecs, shown_keys(SLASH)).unwrap();
    assert_eq!(z["dtype"], "|S5");
    assert_eq!(z["fill_value"], "YWI=");
    assert!(
        !fills,
        "the fill value shown is the v3 one: no chunk of it is needed"
    );
    let chunk = zstd::decode_all(fill_chunk(&d, &[2], &codecs).unwrap().as_slice()).unwrap();
    assert_eq!(chunk, b"ab\0\0\0ab\0\0\0");
    let back = v3_from_zarray(&to_bytes(&z)).unwrap();
    assert_eq!(back["data_type"], t);
    assert_eq!(back["fill_value"], "YWI=");
    assert_eq!(back["codecs"], json!(codecs));
    // zarr 2's own `.zarray` of `|S5` (blosc, fill value b"ab"), and one with no fill.
    let z2 = json!({"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "|S5",
        "fill_value": "YWI=", "order": "C", "filters": null,
        "compressor": {"id": "zlib", "level": 1}});
    let v3 = v3_from_zarray(&to_bytes(&z2)).unwrap();
    assert_eq!(v3["data_type"], t);
    assert_eq!(v3["fill_value"], "YWI=");
    let mut z2 = z2;
    z2["fill_value"] = Value::Null;
    assert_eq!(v3_from_zarray(&to_bytes(&z2)).unwrap()["fill_value"], "");
    // Longer than its length: no value of the type.
    let d = doc(json!({"data_type": t, "fill_value": "YWJjZGVmZw==", "node_type": "array"}));
    assert!(fill_chunk(&d, &[2], &codecs).is_err());
}

/// A `_FillValue` that means no value of the array's type (a converter's, not xarray's:
/// `-1` of a `uint8`, `300` of an `int8`, `"abc"` of an `int32`, bad base64) is not
/// taken: `.zarray` shows what it would without it and `.zattrs` keeps the attribute.
/// zarr 2's default fill `0` of object arrays is stored as the v3 `""`.
#[test]
fn fill_value_attributes_of_no_value_of_the_type_are_left_as_attributes() {
    let le = [json!({"name": "bytes", "configuration": {"endian": "little"}})];
    for (dt, attr) in [
        ("uint8", json!(-1)),
        ("int8", json!(300)),
        ("int32", json!("abc")),
        ("float32", json!("not base64!")),
        ("int16", json!([1, 2])),
    ] {
        let d = doc(
            json!({"data_type": dt, "fill_value": 0, "node_type": "array",
                           "attributes": {"_FillValue": attr}}),
        );
        let z = zarray(&d, &[4], &[2], &le, shown_keys(SLASH)).unwrap();
        assert_eq!(z["fill_value"], json!(0), "{dt} {attr}");
        assert_eq!(zattrs(&d)["_FillValue"], attr, "{dt}");
    }
    let z = json!({"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "|O",
                   "fill_value": 0, "compressor": null, "filters": [{"id": "vlen-utf8"}],
                   "order": "C"});
    let v3 = v3_from_zarray(&to_bytes(&z)).unwrap();
    assert_eq!(v3["fill_value"], "");
    assert_eq!(v3["attributes"], json!({}));
}
