//! `zarr.json`: which nodes are sharded arrays the view can present, their shard layout,
//! and the rewritten (unsharded) metadata the view serves. No I/O.
//!
//! Spec: <https://zarr-specs.readthedocs.io/en/latest/v3/core/index.html#array-metadata>
//! and the `sharding_indexed` codec's configuration (`chunk_shape`, `codecs`,
//! `index_codecs`, `index_location`).
//!
//! An array is presented unsharded when its codec chain is exactly one
//! `sharding_indexed` codec (no array→array codec before it, no bytes→bytes codec after
//! it) on a `regular` chunk grid. Nested sharding (the inner chain is again exactly one
//! `sharding_indexed`) is followed down to the innermost chunks. Anything else is
//! [`Presentation::Unsupported`] with a reason, and the view passes it through.
//!
//! The rewrite replaces only `chunk_grid.configuration.chunk_shape` (innermost chunk
//! shape) and `codecs` (innermost codec chain); every other member, known or not, and the
//! member order are kept.

use serde_json::{Map, Value};

use super::index::{Endian, IndexCodecs, IndexLocation};
use super::key::ChunkKeyEncoding;
use super::layout::{ShardLayout, ShardLevel};

/// What a `zarr.json` describes.
#[derive(Clone, Debug)]
pub enum Node {
    Group,
    Array(Box<ArrayMeta>),
}

/// An array's metadata as far as the view needs it.
#[derive(Clone, Debug)]
pub struct ArrayMeta {
    /// The whole document, member order preserved.
    pub doc: Map<String, Value>,
    pub shape: Vec<u64>,
    pub key_encoding: ChunkKeyEncoding,
    pub presentation: Presentation,
}

#[derive(Clone, Debug)]
pub enum Presentation {
    /// Sharded and presentable: the view shows inner chunks.
    Sharded(ShardLayout),
    /// Not sharded: passes through unchanged.
    Plain,
    /// Sharded (or odd) in a way the view cannot present: passes through, with a warning.
    Unsupported(String),
}

/// Why a `zarr.json` could not be understood at all (it then passes through unchanged).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct MetadataError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, MetadataError> {
    Err(MetadataError(msg.into()))
}

/// Parse a `zarr.json` document.
pub fn parse(bytes: &[u8]) -> Result<Node, MetadataError> {
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| MetadataError(format!("invalid JSON: {e}")))?;
    let Value::Object(doc) = v else {
        return err("zarr.json is not a JSON object");
    };
    match doc.get("zarr_format") {
        Some(Value::Number(n)) if n.as_u64() == Some(3) => {}
        Some(other) => return err(format!("zarr_format is {other}, not 3")),
        None => return err("zarr_format is missing"),
    }
    match doc.get("node_type").and_then(Value::as_str) {
        Some("group") => Ok(Node::Group),
        Some("array") => parse_array(doc).map(|a| Node::Array(Box::new(a))),
        Some(other) => err(format!("unknown node_type {other:?}")),
        None => err("node_type is missing"),
    }
}

fn parse_array(doc: Map<String, Value>) -> Result<ArrayMeta, MetadataError> {
    let shape = u64_list(doc.get("shape"), "shape")?;
    let key_encoding =
        ChunkKeyEncoding::from_json(doc.get("chunk_key_encoding")).map_err(MetadataError)?;
    let presentation = presentation(&doc, &shape);
    Ok(ArrayMeta {
        doc,
        shape,
        key_encoding,
        presentation,
    })
}

fn presentation(doc: &Map<String, Value>, shape: &[u64]) -> Presentation {
    let codecs = match doc.get("codecs") {
        Some(Value::Array(c)) => c,
        _ => return Presentation::Unsupported("codecs is missing or not a list".into()),
    };
    let names: Vec<&str> = codecs.iter().map(codec_name).collect();
    if !names.contains(&"sharding_indexed") {
        return Presentation::Plain;
    }
    if codecs.len() != 1 {
        return Presentation::Unsupported(format!(
            "codec chain {names:?} has codecs around sharding_indexed"
        ));
    }
    match doc.get("storage_transformers") {
        None => {}
        Some(Value::Array(t)) if t.is_empty() => {}
        Some(_) => return Presentation::Unsupported("storage_transformers are set".into()),
    }
    match sharded_layout(doc, shape, &codecs[0]) {
        Ok(l) => Presentation::Sharded(l),
        Err(MetadataError(why)) => Presentation::Unsupported(why),
    }
}

fn sharded_layout(
    doc: &Map<String, Value>,
    shape: &[u64],
    sharding: &Value,
) -> Result<ShardLayout, MetadataError> {
    let grid = doc
        .get("chunk_grid")
        .ok_or(MetadataError("chunk_grid is missing".into()))?;
    if codec_name(grid) != "regular" {
        return err(format!("chunk grid {:?} is not regular", codec_name(grid)));
    }
    let shard_shape = u64_list(
        grid.get("configuration").and_then(|c| c.get("chunk_shape")),
        "chunk_grid.configuration.chunk_shape",
    )?;
    if shard_shape.len() != shape.len() {
        return err(format!(
            "chunk shape {shard_shape:?} has a different rank than shape {shape:?}"
        ));
    }
    let mut levels = Vec::new();
    let mut outer = shard_shape.clone();
    let mut codec = sharding;
    loop {
        let (level, inner_codecs) = sharding_level(codec, &outer)?;
        outer = level.chunk_shape.clone();
        levels.push(level);
        let names: Vec<&str> = inner_codecs.iter().map(codec_name).collect();
        if names == ["sharding_indexed"] {
            codec = &inner_codecs[0];
            continue;
        }
        if names.contains(&"sharding_indexed") {
            return err(format!(
                "inner codec chain {names:?} has codecs around a nested sharding_indexed"
            ));
        }
        return ShardLayout::new(shape.to_vec(), shard_shape, levels, inner_codecs.to_vec())
            .map(|l| l.with_data_type(doc.get("data_type")))
            .map_err(MetadataError);
    }
}

/// One `sharding_indexed` codec whose shards have shape `outer`.
fn sharding_level<'a>(
    codec: &'a Value,
    outer: &[u64],
) -> Result<(ShardLevel, &'a Vec<Value>), MetadataError> {
    let config = codec.get("configuration").ok_or(MetadataError(
        "sharding_indexed has no configuration".into(),
    ))?;
    let chunk_shape = u64_list(config.get("chunk_shape"), "sharding chunk_shape")?;
    if chunk_shape.len() != outer.len() {
        return err(format!(
            "inner chunk shape {chunk_shape:?} has a different rank than shard shape {outer:?}"
        ));
    }
    let mut chunks_per_shard = Vec::with_capacity(outer.len());
    for (&o, &c) in outer.iter().zip(&chunk_shape) {
        if c == 0 || o % c != 0 {
            return err(format!(
                "inner chunk shape {chunk_shape:?} does not divide shard shape {outer:?}"
            ));
        }
        chunks_per_shard.push(o / c);
    }
    let Some(Value::Array(inner_codecs)) = config.get("codecs") else {
        return err("sharding_indexed has no codecs list");
    };
    let index_codecs = index_codecs(config.get("index_codecs"))?;
    let index_location = match config.get("index_location").map(|v| v.as_str()) {
        None | Some(Some("end")) => IndexLocation::End,
        Some(Some("start")) => IndexLocation::Start,
        Some(_) => return err("index_location is neither \"start\" nor \"end\""),
    };
    Ok((
        ShardLevel {
            chunk_shape,
            chunks_per_shard,
            index_codecs,
            index_location,
        },
        inner_codecs,
    ))
}

fn index_codecs(v: Option<&Value>) -> Result<IndexCodecs, MetadataError> {
    let Some(Value::Array(list)) = v else {
        return err("sharding_indexed has no index_codecs list");
    };
    let names: Vec<&str> = list.iter().map(codec_name).collect();
    let crc32c = match names.as_slice() {
        ["bytes"] => false,
        ["bytes", "crc32c"] => true,
        _ => return err(format!("unsupported index codecs {names:?}")),
    };
    let endian = match list[0].get("configuration").and_then(|c| c.get("endian")) {
        Some(Value::String(e)) if e == "little" => Endian::Little,
        Some(Value::String(e)) if e == "big" => Endian::Big,
        // The index words are uint64, so the endianness is required; accept the
        // common omission as little-endian, which every writer we know uses.
        None => Endian::Little,
        Some(other) => return err(format!("unsupported index endian {other}")),
    };
    Ok(IndexCodecs { endian, crc32c })
}

/// A codec's (or chunk grid's) name: `{"name": ..}` or the short string form.
pub fn codec_name(v: &Value) -> &str {
    match v {
        Value::String(s) => s,
        Value::Object(o) => o.get("name").and_then(Value::as_str).unwrap_or(""),
        _ => "",
    }
}

fn u64_list(v: Option<&Value>, what: &str) -> Result<Vec<u64>, MetadataError> {
    let Some(Value::Array(items)) = v else {
        return err(format!("{what} is missing or not a list"));
    };
    items
        .iter()
        .map(|i| i.as_u64())
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| {
            MetadataError(format!(
                "{what} has an entry that is not an unsigned integer"
            ))
        })
}

impl ArrayMeta {
    /// The unsharded `zarr.json` the view serves for a sharded array.
    pub fn unsharded_json(&self, layout: &ShardLayout) -> Vec<u8> {
        let mut doc = self.doc.clone();
        let shape: Vec<Value> = layout
            .inner_chunk_shape()
            .iter()
            .map(|&n| n.into())
            .collect();
        if let Some(Value::Object(grid)) = doc.get_mut("chunk_grid") {
            let config = grid
                .entry("configuration")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(c) = config {
                c.insert("chunk_shape".into(), Value::Array(shape));
            }
        }
        doc.insert("codecs".into(), Value::Array(layout.inner_codecs.clone()));
        let mut out = serde_json::to_vec_pretty(&Value::Object(doc)).expect("JSON of a JSON value");
        out.push(b'\n');
        out
    }
}

/// The `consolidated_metadata` of group document `group` (zarr-python 3 keeps every
/// node's metadata below the group there, and reads it instead of the hierarchy) with
/// each sharded array's entry passed through `each` (the view's unsharded form, or the
/// stored form back). `None`: the document has no such array entry and stays as it is.
pub fn map_consolidated(
    group: &[u8],
    each: impl Fn(&str, &Map<String, Value>) -> Option<Value>,
) -> Option<Vec<u8>> {
    let Ok(Value::Object(mut doc)) = serde_json::from_slice::<Value>(group) else {
        return None;
    };
    if doc.get("node_type").and_then(Value::as_str) != Some("group") {
        return None;
    }
    let entries = doc
        .get_mut("consolidated_metadata")?
        .get_mut("metadata")?
        .as_object_mut()?;
    let mut changed = false;
    for (key, entry) in entries.iter_mut() {
        let Value::Object(e) = entry else { continue };
        if e.get("node_type").and_then(Value::as_str) != Some("array") {
            continue;
        }
        if let Some(new) = each(key, e)
            && new != *entry
        {
            *entry = new;
            changed = true;
        }
    }
    if !changed {
        return None;
    }
    let mut out = serde_json::to_vec_pretty(&Value::Object(doc)).ok()?;
    out.push(b'\n');
    Some(out)
}

/// A consolidated entry of a sharded array as the v3 view shows that array: unsharded.
pub fn unsharded_entry(entry: &Map<String, Value>) -> Option<Value> {
    let bytes = serde_json::to_vec(entry).ok()?;
    let Ok(Node::Array(meta)) = parse(&bytes) else {
        return None;
    };
    let Presentation::Sharded(layout) = &meta.presentation else {
        return None;
    };
    serde_json::from_slice(&meta.unsharded_json(layout)).ok()
}

/// Whether metadata documents `a` and `b` are the same but for their attributes.
pub fn same_but_attributes(
    a: &serde_json::Map<String, serde_json::Value>,
    b: &serde_json::Map<String, serde_json::Value>,
) -> bool {
    let without = |doc: &serde_json::Map<String, serde_json::Value>| {
        let mut doc = doc.clone();
        doc.remove("attributes");
        doc
    };
    without(a) == without(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sharded(inner: Value, extra: Value) -> Value {
        let mut doc = json!({
            "zarr_format": 3, "node_type": "array", "shape": [10, 7], "data_type": "uint16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 4]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0,
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": [2, 2], "codecs": inner,
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                 {"name": "crc32c"}],
                "index_location": "end"}}],
            "attributes": {"a": 1}, "dimension_names": ["y", "x"], "my_extension": {"must_understand": false}
        });
        if let (Value::Object(d), Value::Object(e)) = (&mut doc, extra) {
            d.extend(e);
        }
        doc
    }

    fn array(v: &Value) -> ArrayMeta {
        match parse(&serde_json::to_vec(v).unwrap()).unwrap() {
            Node::Array(a) => *a,
            Node::Group => panic!("group"),
        }
    }

    fn bytes_codec() -> Value {
        json!([{"name": "bytes", "configuration": {"endian": "little"}}])
    }

    /// A group's consolidated metadata (zarr-python 3's) with a sharded array's entry
    /// shown unsharded; a group with none, or only unsharded entries, stays as it is.
    #[test]
    fn consolidated_entries_of_sharded_arrays_map() {
        let s = sharded(bytes_codec(), json!({}));
        let plain = json!({"zarr_format": 3, "node_type": "array", "shape": [2],
                           "data_type": "uint8", "codecs": bytes_codec()});
        let group = json!({"zarr_format": 3, "node_type": "group", "attributes": {},
            "consolidated_metadata": {"kind": "inline", "must_understand": false,
                "metadata": {"s": s, "p": plain, "g": {"zarr_format": 3, "node_type": "group"}}}});
        let out = map_consolidated(&serde_json::to_vec(&group).unwrap(), |_, e| {
            unsharded_entry(e)
        })
        .unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        let m = &out["consolidated_metadata"]["metadata"];
        assert_eq!(
            m["s"]["chunk_grid"]["configuration"]["chunk_shape"],
            json!([2, 2])
        );
        assert_eq!(m["s"]["codecs"], bytes_codec());
        assert_eq!(m["p"], plain);
        assert_eq!(m["g"], group["consolidated_metadata"]["metadata"]["g"]);
        let without = json!({"zarr_format": 3, "node_type": "group", "attributes": {}});
        assert!(
            map_consolidated(&serde_json::to_vec(&without).unwrap(), |_, e| {
                unsharded_entry(e)
            })
            .is_none()
        );
        let only_plain = json!({"zarr_format": 3, "node_type": "group",
            "consolidated_metadata": {"metadata": {"p": plain}}});
        assert!(
            map_consolidated(&serde_json::to_vec(&only_plain).unwrap(), |_, e| {
                unsharded_entry(e)
            })
            .is_none()
        );
    }

    #[test]
    fn presents_a_sharded_array() {
        let a = array(&sharded(bytes_codec(), json!({})));
        let Presentation::Sharded(l) = &a.presentation else {
            panic!("{:?}", a.presentation)
        };
        assert_eq!(l.inner_chunk_shape(), [2, 2]);
        assert_eq!(l.levels[0].chunks_per_shard, [2, 2]);
        let rewritten: Value = serde_json::from_slice(&a.unsharded_json(l)).unwrap();
        let mut expected = sharded(bytes_codec(), json!({}));
        expected["chunk_grid"]["configuration"]["chunk_shape"] = json!([2, 2]);
        expected["codecs"] = bytes_codec();
        assert_eq!(rewritten, expected);
        // Member order is kept.
        let keys: Vec<_> = rewritten.as_object().unwrap().keys().cloned().collect();
        let orig: Vec<_> = expected.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, orig);
    }

    #[test]
    fn follows_nested_sharding_to_the_innermost_chunks() {
        let nested = json!([{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [1, 2], "codecs": bytes_codec(),
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "big"}}],
            "index_location": "start"}}]);
        let a = array(&sharded(nested, json!({})));
        let Presentation::Sharded(l) = &a.presentation else {
            panic!("{:?}", a.presentation)
        };
        assert_eq!(l.levels.len(), 2);
        assert_eq!(l.inner_chunk_shape(), [1, 2]);
        assert_eq!(l.levels[1].index_location, IndexLocation::Start);
        assert_eq!(l.levels[1].index_codecs.endian, Endian::Big);
        assert!(!l.levels[1].index_codecs.crc32c);
    }

    #[test]
    fn plain_and_unsupported_arrays() {
        let mut plain = sharded(bytes_codec(), json!({}));
        plain["codecs"] = bytes_codec();
        assert!(matches!(array(&plain).presentation, Presentation::Plain));

        let mut after = sharded(bytes_codec(), json!({}));
        after["codecs"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "gzip"}));
        assert!(matches!(
            array(&after).presentation,
            Presentation::Unsupported(_)
        ));

        let mut bad_div = sharded(bytes_codec(), json!({}));
        bad_div["codecs"][0]["configuration"]["chunk_shape"] = json!([3, 2]);
        assert!(matches!(
            array(&bad_div).presentation,
            Presentation::Unsupported(_)
        ));

        let mut gz_index = sharded(bytes_codec(), json!({}));
        gz_index["codecs"][0]["configuration"]["index_codecs"] = json!([{"name": "gzip"}]);
        assert!(matches!(
            array(&gz_index).presentation,
            Presentation::Unsupported(_)
        ));

        let mut rect = sharded(bytes_codec(), json!({}));
        rect["chunk_grid"]["name"] = json!("rectilinear");
        assert!(matches!(
            array(&rect).presentation,
            Presentation::Unsupported(_)
        ));
    }

    #[test]
    fn malformed_documents_are_errors_not_panics() {
        for bad in [
            &b"not json"[..],
            b"[]",
            b"{\"zarr_format\": 2}",
            b"{\"zarr_format\": 3}",
            b"{\"zarr_format\": 3, \"node_type\": \"array\"}",
            b"{\"zarr_format\": 3, \"node_type\": \"array\", \"shape\": [-1]}",
            b"{\"zarr_format\": 3, \"node_type\": \"thing\"}",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(matches!(
            parse(br#"{"zarr_format": 3, "node_type": "group"}"#),
            Ok(Node::Group)
        ));
    }
}
