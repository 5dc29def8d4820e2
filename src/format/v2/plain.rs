//! Unsharded v3 arrays in the v2 view: their `.zarray`, and the translation between the
//! v2 keys shown and the store's chunk keys. Not sharded arrays (their `.zarray` is
//! [`super::zarray()`]'s from the innermost chunks).

use serde_json::{Map, Value};

use super::zarray::{shown_keys, zarray, zarray_fill};
use crate::format::key::{ChunkKeyEncoding, KeyKind};

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
        use crate::format::key::KeyPath;
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
        use crate::format::key::KeyPath;
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
