//! Chunk keys: the `default` and `v2` chunk key encodings of Zarr v3. No I/O.
//!
//! Spec: <https://zarr-specs.readthedocs.io/en/latest/v3/core/index.html#chunk-key-encoding>
//!
//! | encoding  | separator | key of (1, 23)  | key of a 0-d array |
//! |-----------|-----------|-----------------|--------------------|
//! | `default` | `/`       | `c/1/23`        | `c`                |
//! | `default` | `.`       | `c.1.23`        | `c`                |
//! | `v2`      | `.`       | `1.23`          | `0`                |
//! | `v2`      | `/`       | `1/23`          | `0`                |
//! | draft     | `/`       | `c1/23`         | `c0`               |
//! | draft     | `.`       | `c1.23`         | `c0`               |
//!
//! The draft encoding is the one of the 2022 sharding storage-transformer layout
//! (zarr-python 2.13–2.18, `data/root/<path>/c1/23`); it names shards only.
//!
//! The same encoding names shards in the store (coordinates in the shard grid) and inner
//! chunks in the view (coordinates in the inner chunk grid). With separator `/` a key is a
//! path: its leading components are directories ([`KeyPath::Dir`]).

use serde_json::Value;

/// A parsed `chunk_key_encoding`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkKeyEncoding {
    pub kind: KeyKind,
    pub separator: char,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Default,
    V2,
    /// The 2022 draft layout: `c` glued to the first coordinate.
    Draft,
}

/// What a path under an array directory is, in the key namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyPath {
    /// A directory holding keys whose leading coordinates are these (`c/` is `Dir([])`).
    Dir(Vec<u64>),
    /// A whole key.
    Chunk(Vec<u64>),
}

impl ChunkKeyEncoding {
    pub const DEFAULT: ChunkKeyEncoding = ChunkKeyEncoding {
        kind: KeyKind::Default,
        separator: '/',
    };

    /// Parse the `chunk_key_encoding` member; `None` (absent) means `default` with `/`.
    pub fn from_json(v: Option<&Value>) -> Result<Self, String> {
        let Some(v) = v else {
            return Ok(Self::DEFAULT);
        };
        let (name, config) = match v {
            Value::String(s) => (s.as_str(), None),
            Value::Object(o) => (
                o.get("name")
                    .and_then(Value::as_str)
                    .ok_or("chunk_key_encoding has no name")?,
                o.get("configuration"),
            ),
            _ => return Err("chunk_key_encoding is neither a string nor an object".into()),
        };
        let kind = match name {
            "default" => KeyKind::Default,
            "v2" => KeyKind::V2,
            other => return Err(format!("unsupported chunk_key_encoding {other:?}")),
        };
        let separator = match config.and_then(|c| c.get("separator")) {
            None => match kind {
                KeyKind::Default | KeyKind::Draft => '/',
                KeyKind::V2 => '.',
            },
            Some(Value::String(s)) if s == "/" => '/',
            Some(Value::String(s)) if s == "." => '.',
            Some(other) => return Err(format!("unsupported chunk key separator {other}")),
        };
        Ok(ChunkKeyEncoding { kind, separator })
    }

    /// The `chunk_key_encoding` member that [`Self::from_json`] reads back as `self`
    /// (the draft layout's has none: `default`).
    pub fn to_json(&self) -> Value {
        let name = match self.kind {
            KeyKind::V2 => "v2",
            KeyKind::Default | KeyKind::Draft => "default",
        };
        serde_json::json!({
            "name": name,
            "configuration": {"separator": self.separator.to_string()},
        })
    }

    /// The key of the chunk at `coords`.
    pub fn encode(&self, coords: &[u64]) -> String {
        let sep = self.separator.to_string();
        let parts = coords.iter().map(u64::to_string).collect::<Vec<_>>();
        match (self.kind, coords.is_empty()) {
            (KeyKind::Default, true) => "c".to_string(),
            (KeyKind::Default, false) => format!("c{sep}{}", parts.join(&sep)),
            (KeyKind::V2, true) => "0".to_string(),
            (KeyKind::V2, false) => parts.join(&sep),
            (KeyKind::Draft, true) => "c0".to_string(),
            (KeyKind::Draft, false) => format!("c{}", parts.join(&sep)),
        }
    }

    /// Whether keys are nested paths (separator `/`), i.e. have directories.
    pub fn nested(&self) -> bool {
        self.separator == '/'
    }

    /// The first path component of every key of an array of rank `ndim` when keys are
    /// nested under a fixed prefix (`c` for `default` with `/`); `None` otherwise.
    pub fn root_component(&self, ndim: usize) -> Option<&'static str> {
        (self.kind == KeyKind::Default && self.nested() && ndim > 0).then_some("c")
    }

    /// Resolve the child `name` of `parent` (`None` = the array directory itself) in an
    /// array of rank `ndim`. Returns `None` when `name` is no part of any valid key.
    /// Coordinates are canonical decimals (no sign, no leading zeros); bounds are the
    /// caller's business.
    pub fn child(&self, ndim: usize, parent: Option<&[u64]>, name: &str) -> Option<KeyPath> {
        match parent {
            None => self.child_of_array(ndim, name),
            Some(prefix) => {
                if !self.nested() || prefix.len() >= ndim {
                    return None;
                }
                let c = self.parse_component(prefix.len(), name)?;
                let mut coords = prefix.to_vec();
                coords.push(c);
                Some(if coords.len() == ndim {
                    KeyPath::Chunk(coords)
                } else {
                    KeyPath::Dir(coords)
                })
            }
        }
    }

    fn child_of_array(&self, ndim: usize, name: &str) -> Option<KeyPath> {
        if ndim == 0 {
            let scalar_key = self.encode(&[]);
            return (name == scalar_key).then(|| KeyPath::Chunk(vec![]));
        }
        match (self.kind, self.nested()) {
            (KeyKind::Default, true) => (name == "c").then(|| KeyPath::Dir(vec![])),
            (KeyKind::V2, true) => self.child(ndim, Some(&[]), name),
            (KeyKind::Default, false) => {
                let rest = name.strip_prefix("c.")?;
                parse_flat(rest, ndim).map(KeyPath::Chunk)
            }
            (KeyKind::V2, false) => parse_flat(name, ndim).map(KeyPath::Chunk),
            (KeyKind::Draft, true) => self.child(ndim, Some(&[]), name),
            (KeyKind::Draft, false) => {
                parse_flat(name.strip_prefix('c')?, ndim).map(KeyPath::Chunk)
            }
        }
    }

    /// The coordinate a path component at depth `level` of a nested key names.
    pub fn parse_component(&self, level: usize, name: &str) -> Option<u64> {
        match (self.kind, level) {
            (KeyKind::Draft, 0) => parse_coord(name.strip_prefix('c')?),
            _ => parse_coord(name),
        }
    }

    /// Path components of the directory holding the keys with leading `prefix`
    /// coordinates (separator `/` only; flat encodings keep every key in the array dir).
    pub fn dir_components(&self, ndim: usize, prefix: &[u64]) -> Vec<String> {
        if !self.nested() {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(prefix.len() + 1);
        if let Some(root) = self.root_component(ndim) {
            out.push(root.to_string());
        }
        out.extend(prefix.iter().enumerate().map(|(i, c)| {
            if self.kind == KeyKind::Draft && i == 0 {
                format!("c{c}")
            } else {
                c.to_string()
            }
        }));
        out
    }
}

fn parse_flat(s: &str, ndim: usize) -> Option<Vec<u64>> {
    let coords = s.split('.').map(parse_coord).collect::<Option<Vec<_>>>()?;
    (coords.len() == ndim).then_some(coords)
}

/// A canonical decimal coordinate: digits only, no leading zero unless it is `0`.
pub fn parse_coord(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if canonical { s.parse().ok() } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn enc(v: Value) -> ChunkKeyEncoding {
        ChunkKeyEncoding::from_json(Some(&v)).unwrap()
    }

    #[test]
    fn encodes_every_kind() {
        let d = enc(json!({"name": "default"}));
        let dd = enc(json!({"name": "default", "configuration": {"separator": "."}}));
        let v = enc(json!({"name": "v2"}));
        let vs = enc(json!({"name": "v2", "configuration": {"separator": "/"}}));
        assert_eq!(d.encode(&[1, 23]), "c/1/23");
        assert_eq!(dd.encode(&[1, 23]), "c.1.23");
        assert_eq!(v.encode(&[1, 23]), "1.23");
        assert_eq!(vs.encode(&[1, 23]), "1/23");
        assert_eq!(d.encode(&[]), "c");
        assert_eq!(v.encode(&[]), "0");
        assert_eq!(ChunkKeyEncoding::from_json(None).unwrap(), d);
    }

    #[test]
    fn rejects_unknown_encodings() {
        assert!(ChunkKeyEncoding::from_json(Some(&json!({"name": "x"}))).is_err());
        assert!(
            ChunkKeyEncoding::from_json(Some(
                &json!({"name": "v2", "configuration": {"separator": "-"}})
            ))
            .is_err()
        );
        assert!(ChunkKeyEncoding::from_json(Some(&json!(3))).is_err());
    }

    #[test]
    fn resolves_paths_for_every_kind() {
        let d = ChunkKeyEncoding::DEFAULT;
        assert_eq!(d.child(2, None, "c"), Some(KeyPath::Dir(vec![])));
        assert_eq!(d.child(2, Some(&[]), "3"), Some(KeyPath::Dir(vec![3])));
        assert_eq!(
            d.child(2, Some(&[3]), "7"),
            Some(KeyPath::Chunk(vec![3, 7]))
        );
        assert_eq!(d.child(2, Some(&[3, 7]), "1"), None);
        assert_eq!(d.child(2, None, "zarr.json"), None);
        assert_eq!(d.child(0, None, "c"), Some(KeyPath::Chunk(vec![])));

        let dd = enc(json!({"name": "default", "configuration": {"separator": "."}}));
        assert_eq!(dd.child(2, None, "c.3.7"), Some(KeyPath::Chunk(vec![3, 7])));
        assert_eq!(dd.child(2, None, "c.3"), None);
        assert_eq!(dd.child(2, None, "c"), None);

        let v = enc(json!({"name": "v2"}));
        assert_eq!(
            v.child(3, None, "0.3.7"),
            Some(KeyPath::Chunk(vec![0, 3, 7]))
        );
        assert_eq!(v.child(3, None, ".zarray"), None);
        assert_eq!(v.child(0, None, "0"), Some(KeyPath::Chunk(vec![])));

        let vs = enc(json!({"name": "v2", "configuration": {"separator": "/"}}));
        assert_eq!(vs.child(2, None, "4"), Some(KeyPath::Dir(vec![4])));
        assert_eq!(vs.child(1, None, "4"), Some(KeyPath::Chunk(vec![4])));
    }

    #[test]
    fn coordinates_must_be_canonical() {
        for bad in ["", "01", "+1", "-1", "1a", " 1", "99999999999999999999999"] {
            assert_eq!(parse_coord(bad), None, "{bad:?}");
        }
        assert_eq!(parse_coord("0"), Some(0));
        assert_eq!(parse_coord("120"), Some(120));
    }

    #[test]
    fn dir_components_follow_the_encoding() {
        let d = ChunkKeyEncoding::DEFAULT;
        assert_eq!(d.dir_components(3, &[1, 2]), ["c", "1", "2"]);
        let vs = enc(json!({"name": "v2", "configuration": {"separator": "/"}}));
        assert_eq!(vs.dir_components(3, &[1]), ["1"]);
        let v = enc(json!({"name": "v2"}));
        assert!(v.dir_components(3, &[1]).is_empty());
    }

    #[test]
    fn draft_keys_glue_c_to_the_first_coordinate() {
        let nested = ChunkKeyEncoding {
            kind: KeyKind::Draft,
            separator: '/',
        };
        assert_eq!(nested.encode(&[3, 1]), "c3/1");
        assert_eq!(nested.encode(&[]), "c0");
        assert_eq!(nested.child(2, None, "c3"), Some(KeyPath::Dir(vec![3])));
        assert_eq!(
            nested.child(2, Some(&[3]), "1"),
            Some(KeyPath::Chunk(vec![3, 1]))
        );
        assert_eq!(nested.child(2, None, "3"), None);
        assert_eq!(nested.child(2, None, "c03"), None);
        assert_eq!(nested.dir_components(3, &[3, 1]), ["c3", "1"]);
        assert!(nested.dir_components(3, &[]).is_empty());
        assert_eq!(nested.parse_component(0, "c7"), Some(7));
        assert_eq!(nested.parse_component(1, "c7"), None);
        let flat = ChunkKeyEncoding {
            kind: KeyKind::Draft,
            separator: '.',
        };
        assert_eq!(flat.encode(&[3, 1]), "c3.1");
        assert_eq!(
            flat.child(2, None, "c3.1"),
            Some(KeyPath::Chunk(vec![3, 1]))
        );
        assert_eq!(flat.child(2, None, "c3"), None);
    }
}
