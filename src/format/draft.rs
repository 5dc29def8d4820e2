//! The 2022 draft layout: Zarr v3 as zarr-python 2.13–2.18 wrote it (with
//! `ZARR_V3_EXPERIMENTAL_API=1`), sharded by the draft "sharding storage transformer"
//! (`indexed`, `chunks_per_shard`). No I/O.
//!
//! ```text
//! zarr.json                              entry point: zarr_format / metadata_encoding URLs
//! meta/root.group.json                   the root group (optional)
//! meta/root/<path>.group.json            a group: {"attributes": ..}
//! meta/root/<path>.array.json            an array (below)
//! data/root/<path>/c<i>/<j>              a shard (separator `/`; `c<i>.<j>` with `.`)
//! ```
//!
//! The shard format equals `sharding_indexed` with the index at the end, little-endian
//! uint64 (offset, nbytes) pairs, no checksum, `2^64-1` pairs for empty chunks. So a
//! draft array is translated into the final v3 document with one `sharding_indexed`
//! codec, and the view presents it like any other sharded array; only the shard keys
//! ([`KeyKind::Draft`]) and the places of metadata and data differ.

use serde_json::{Map, Value, json};

use super::key::{ChunkKeyEncoding, KeyKind};
use super::v2;

/// Where metadata documents and chunk data live.
pub const META_ROOT: &str = "meta/root";
pub const DATA_ROOT: &str = "data/root";
pub const ARRAY_SUFFIX: &str = ".array.json";
pub const GROUP_SUFFIX: &str = ".group.json";

/// Whether a store's root `zarr.json` is the draft's entry-point document.
pub fn is_entry_point(bytes: &[u8]) -> bool {
    let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(bytes) else {
        return false;
    };
    doc.contains_key("metadata_encoding")
        || doc
            .get("zarr_format")
            .and_then(Value::as_str)
            .is_some_and(|f| f.contains("zarr/spec/protocol/core/3.0"))
}

/// A group document's attributes.
pub fn group_attributes(bytes: &[u8]) -> Result<Map<String, Value>, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON: {e}"))?;
    let Value::Object(doc) = v else {
        return Err("not a JSON object".into());
    };
    Ok(doc
        .get("attributes")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default())
}

/// A draft array document as the final v3 `zarr.json` of the same sharded array, and the
/// encoding of its shard keys.
pub fn array(bytes: &[u8]) -> Result<(Map<String, Value>, ChunkKeyEncoding), String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON: {e}"))?;
    let Value::Object(d) = v else {
        return Err("not a JSON object".into());
    };
    let list = |v: Option<&Value>, what: &str| -> Result<Vec<u64>, String> {
        v.and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_u64).collect())
            .ok_or(format!("{what} is missing or not a list of integers"))
    };
    let shape = list(d.get("shape"), "shape")?;
    let grid = d.get("chunk_grid").ok_or("chunk_grid is missing")?;
    if grid.get("type").and_then(Value::as_str) != Some("regular") {
        return Err("chunk_grid is not regular".into());
    }
    let chunks = list(grid.get("chunk_shape"), "chunk_grid.chunk_shape")?;
    let separator = match grid.get("separator").and_then(Value::as_str) {
        None | Some("/") => '/',
        Some(".") => '.',
        Some(s) => return Err(format!("chunk separator {s:?}")),
    };
    let cps = chunks_per_shard(&d)?;
    if chunks.len() != shape.len()
        || cps.len() != shape.len()
        || chunks.contains(&0)
        || cps.contains(&0)
    {
        return Err(format!(
            "chunk shape {chunks:?} and chunks_per_shard {cps:?} do not fit shape {shape:?}"
        ));
    }
    let dtype = d
        .get("data_type")
        .and_then(Value::as_str)
        .ok_or("data_type is missing")?;
    let (data_type, endian, itemsize) = v2::numpy_dtype(dtype)?;
    let codecs = v2::codec_chain(&d, "chunk_memory_layout", shape.len(), endian, |c| {
        codec(c, itemsize)
    })?;
    let shard: Vec<u64> = chunks.iter().zip(&cps).map(|(c, n)| c * n).collect();
    let doc = json!({
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": shard}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": separator.to_string()}},
        "fill_value": d.get("fill_value").cloned().unwrap_or(Value::Null),
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": chunks,
            "codecs": codecs,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_location": "end"}}],
        "attributes": d.get("attributes").cloned().unwrap_or(json!({})),
    });
    let Value::Object(doc) = doc else {
        unreachable!("a JSON object literal")
    };
    Ok((
        doc,
        ChunkKeyEncoding {
            kind: KeyKind::Draft,
            separator,
        },
    ))
}

/// The `chunks_per_shard` of a draft array document's one storage transformer, indexed
/// sharding; `Err` where it has another, none, or more than one.
fn chunks_per_shard(d: &Map<String, Value>) -> Result<Vec<u64>, String> {
    match d.get("storage_transformers").and_then(Value::as_array) {
        Some(t) if t.len() == 1 => {
            let t = &t[0];
            let is_sharding = t
                .get("extension")
                .and_then(Value::as_str)
                .is_some_and(|e| e.contains("storage_transformers/sharding/1.0"));
            if !is_sharding || t.get("type").and_then(Value::as_str) != Some("indexed") {
                return Err(format!("storage transformer {t} is not indexed sharding"));
            }
            t.get("configuration")
                .and_then(|c| c.get("chunks_per_shard"))
                .and_then(Value::as_array)
                .and_then(|a| a.iter().map(Value::as_u64).collect())
                .ok_or("chunks_per_shard is missing or not a list of integers".into())
        }
        Some(t) if t.is_empty() => Err("not sharded".into()),
        None => Err("not sharded".into()),
        Some(_) => Err("more than one storage transformer".into()),
    }
}

/// A draft codec (`{"codec": <URL>, "configuration": ..}`) as a final v3 codec.
fn codec(c: &Value, itemsize: u32) -> Result<Value, String> {
    let url = c.get("codec").and_then(Value::as_str).unwrap_or("");
    // https://purl.org/zarr/spec/codec/<name>/<version>
    let name = url
        .trim_end_matches('/')
        .rsplit('/')
        .nth(1)
        .unwrap_or_default();
    let config = c.get("configuration");
    v2::v3_codec(name, |k| config.and_then(|c| c.get(k)).cloned(), itemsize)
        .map_err(|e| format!("{e} ({url})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::metadata::{self, Node, Presentation};

    /// As zarr-python 2.18 writes it.
    const VOL: &str = r#"{"attributes": {"unit": "m"},
        "chunk_grid": {"chunk_shape": [2, 3], "separator": "/", "type": "regular"},
        "chunk_memory_layout": "F",
        "compressor": {"codec": "https://purl.org/zarr/spec/codec/blosc/1.0",
                       "configuration": {"blocksize": 0, "clevel": 5, "cname": "lz4", "shuffle": 1}},
        "data_type": ">u2", "extensions": [], "fill_value": 7, "shape": [10, 7],
        "storage_transformers": [{"configuration": {"chunks_per_shard": [2, 2]},
            "extension": "https://purl.org/zarr/spec/storage_transformers/sharding/1.0",
            "type": "indexed"}]}"#;

    #[test]
    fn a_draft_array_becomes_a_final_sharded_array() {
        let (doc, keys) = array(VOL.as_bytes()).unwrap();
        assert_eq!(keys.kind, KeyKind::Draft);
        assert_eq!(keys.encode(&[3, 1]), "c3/1");
        let bytes = serde_json::to_vec(&doc).unwrap();
        let Ok(Node::Array(meta)) = metadata::parse(&bytes) else {
            panic!("not an array")
        };
        let Presentation::Sharded(layout) = &meta.presentation else {
            panic!("{:?}", meta.presentation)
        };
        assert_eq!(layout.shard_shape, [4, 6]);
        assert_eq!(layout.inner_chunk_shape(), [2, 3]);
        assert!(!layout.levels[0].index_codecs.crc32c);
        assert_eq!(layout.inner_codecs[0]["name"], "transpose");
        assert_eq!(layout.inner_codecs[1]["configuration"]["endian"], "big");
        assert_eq!(
            layout.inner_codecs[2]["configuration"]["shuffle"],
            "shuffle"
        );
        assert_eq!(layout.inner_codecs[2]["configuration"]["typesize"], 2);
        assert_eq!(doc["attributes"]["unit"], "m");
    }

    #[test]
    fn entry_points_and_bad_documents() {
        assert!(is_entry_point(
            br#"{"zarr_format": "https://purl.org/zarr/spec/protocol/core/3.0", "metadata_encoding": "x"}"#
        ));
        assert!(!is_entry_point(
            br#"{"zarr_format": 3, "node_type": "group"}"#
        ));
        assert!(!is_entry_point(b"nonsense"));
        for bad in [
            "{",
            "[]",
            r#"{"shape": [4], "chunk_grid": {"type": "regular", "chunk_shape": [2]}, "data_type": "<u2"}"#,
            &VOL.replace(
                r#""chunks_per_shard": [2, 2]"#,
                r#""chunks_per_shard": [2]"#,
            ),
            &VOL.replace("lz4\"", "x\"").replace("blosc/1.0", "lzma/1.0"),
            &VOL.replace(">u2", "|O"),
        ] {
            assert!(array(bad.as_bytes()).is_err(), "{bad}");
        }
        assert_eq!(
            group_attributes(br#"{"attributes": {"a": 1}}"#).unwrap()["a"],
            1
        );
    }
}
