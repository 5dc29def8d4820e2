//! The Zarr array a blosc container (a bcolz carray, a bloscpack file) is shown as: data
//! type, shape, chunks along one axis, the `blosc` codec, and the documents made from
//! them (`zarr.json`, `.zarray`, `.zattrs`, a ctable's group documents). The containers'
//! own layouts are in [`super::bcolz`] and [`super::bloscpack`]. No I/O.
//!
//! Every chunk is one blosc1 frame; chunks are cut along one axis only (the first for C
//! order, the last for F order, which the `transpose` codec, or v2's `order: "F"`, lays
//! out as stored), so chunk `i` has the key `i` on that axis and `0` on every other one.

use serde_json::{Map, Value, json};

/// A numpy data type as the containers name it (`float64`, `<f8`, `'<i4'`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dtype {
    /// `b` bool, `i` signed, `u` unsigned, `f` float, `c` complex.
    pub kind: char,
    pub size: u8,
    pub big_endian: bool,
}

impl Dtype {
    /// Bytes in one uint8 element: the type of a container with no (usable) metadata.
    pub const BYTES: Dtype = Dtype {
        kind: 'u',
        size: 1,
        big_endian: false,
    };

    /// The type numpy spells `s` (`str(dtype)` or `dtype.str`, maybe quoted as by
    /// `repr`); `None` for types Zarr has no plain number type for (strings, records,
    /// dates).
    pub fn parse(s: &str) -> Option<Dtype> {
        let s = s.trim().trim_matches(|c| c == '\'' || c == '"');
        let named = [
            ("bool", 'b', 1),
            ("int8", 'i', 1),
            ("int16", 'i', 2),
            ("int32", 'i', 4),
            ("int64", 'i', 8),
            ("uint8", 'u', 1),
            ("uint16", 'u', 2),
            ("uint32", 'u', 4),
            ("uint64", 'u', 8),
            ("float16", 'f', 2),
            ("float32", 'f', 4),
            ("float64", 'f', 8),
            ("complex64", 'c', 8),
            ("complex128", 'c', 16),
        ];
        if let Some((_, kind, size)) = named.iter().find(|(n, ..)| *n == s) {
            return Some(Dtype {
                kind: *kind,
                size: *size,
                big_endian: false,
            });
        }
        let (big_endian, rest) = match s.as_bytes().first()? {
            b'<' | b'|' | b'=' => (false, &s[1..]),
            b'>' => (true, &s[1..]),
            _ => (false, s),
        };
        let mut chars = rest.chars();
        let kind = chars.next()?;
        let size: u8 = chars.as_str().parse().ok()?;
        let ok = match kind {
            'b' => size == 1,
            'i' | 'u' => matches!(size, 1 | 2 | 4 | 8),
            'f' => matches!(size, 2 | 4 | 8),
            'c' => matches!(size, 8 | 16),
            _ => false,
        };
        ok.then_some(Dtype {
            kind,
            size,
            big_endian: big_endian && size > 1,
        })
    }

    /// Zarr v3's `data_type`.
    pub fn v3_name(&self) -> String {
        match self.kind {
            'b' => "bool".into(),
            'i' => format!("int{}", 8 * self.size as u32),
            'u' => format!("uint{}", 8 * self.size as u32),
            'f' => format!("float{}", 8 * self.size as u32),
            _ => format!("complex{}", 8 * self.size as u32),
        }
    }

    /// Zarr v2's `dtype` (numpy's type string).
    pub fn v2_name(&self) -> String {
        let order = if self.size == 1 {
            '|'
        } else if self.big_endian {
            '>'
        } else {
            '<'
        };
        format!("{order}{}{}", self.kind, self.size)
    }

    /// One element of fill value `v` in this type's byte order; zeros where it is no
    /// value of the type.
    pub fn element(&self, v: &Value) -> Vec<u8> {
        let mut e = super::fill::element(&self.v3_name(), v)
            .filter(|e| e.len() == self.size as usize)
            .unwrap_or_else(|| vec![0; self.size as usize]);
        if self.big_endian {
            let half = if self.kind == 'c' {
                e.len() / 2
            } else {
                e.len()
            };
            for part in e.chunks_mut(half.max(1)) {
                part.reverse();
            }
        }
        e
    }
}

/// Axis order of the stored data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    C,
    F,
}

/// The `blosc` codec an array is shown with: the frames' codec, shuffle and typesize,
/// and the level its producer was given (frames do not record it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BloscCodec {
    pub cname: &'static str,
    pub clevel: u8,
    /// 0 none, 1 byte, 2 bit (numcodecs' numbering).
    pub shuffle: u8,
    pub typesize: u8,
}

/// A blosc container as a Zarr array.
#[derive(Debug, Clone, PartialEq)]
pub struct ShownArray {
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub order: Order,
    /// Elements of a chunk along the chunked axis.
    pub chunk_len: u64,
    /// The fill value as Zarr v3 writes it (a number, a bool, `"NaN"`).
    pub fill: Value,
    pub codec: BloscCodec,
    pub attributes: Map<String, Value>,
    /// v3's `dimension_names`, v2's `_ARRAY_DIMENSIONS` attribute (xarray reads them).
    pub dimension_names: Option<Vec<String>>,
}

impl ShownArray {
    /// The axis chunks are cut along.
    pub fn chunk_axis(&self) -> usize {
        match self.order {
            Order::C => 0,
            Order::F => self.shape.len().saturating_sub(1),
        }
    }

    pub fn chunk_shape(&self) -> Vec<u64> {
        let mut s = self.shape.clone();
        if let Some(a) = s.get_mut(self.chunk_axis()) {
            *a = self.chunk_len;
        }
        s
    }

    /// Number of chunks.
    pub fn nchunks(&self) -> u64 {
        let len = self.shape.get(self.chunk_axis()).copied().unwrap_or(1);
        len.div_ceil(self.chunk_len.max(1))
    }

    /// Bytes of one whole chunk, decoded.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_shape()
            .iter()
            .fold(u64::from(self.dtype.size), |a, &n| a.saturating_mul(n))
    }

    /// The coordinates of chunk `i`.
    pub fn coords(&self, i: u64) -> Vec<u64> {
        let mut c = vec![0; self.shape.len()];
        if let Some(x) = c.get_mut(self.chunk_axis()) {
            *x = i;
        }
        c
    }

    /// The chunk a key's coordinates name, if they name one.
    pub fn chunk_of(&self, coords: &[u64]) -> Option<u64> {
        if coords.len() != self.shape.len() {
            return None;
        }
        let axis = self.chunk_axis();
        let i = *coords.get(axis)?;
        let others_zero = coords.iter().enumerate().all(|(a, &c)| a == axis || c == 0);
        (others_zero && i < self.nchunks()).then_some(i)
    }

    /// The v3 `zarr.json`.
    pub fn zarr_json(&self) -> Vec<u8> {
        let shuffle = ["noshuffle", "shuffle", "bitshuffle"][self.codec.shuffle.min(2) as usize];
        let mut codecs = Vec::new();
        if self.order == Order::F && self.shape.len() > 1 {
            let order: Vec<usize> = (0..self.shape.len()).rev().collect();
            codecs.push(json!({"name": "transpose", "configuration": {"order": order}}));
        }
        codecs.push(if self.dtype.size == 1 {
            json!({"name": "bytes"})
        } else {
            let endian = if self.dtype.big_endian {
                "big"
            } else {
                "little"
            };
            json!({"name": "bytes", "configuration": {"endian": endian}})
        });
        codecs.push(json!({"name": "blosc", "configuration": {
            "cname": self.codec.cname,
            "clevel": self.codec.clevel,
            "shuffle": shuffle,
            "typesize": self.codec.typesize,
            "blocksize": 0,
        }}));
        let doc = json!({
            "zarr_format": 3,
            "node_type": "array",
            "shape": self.shape,
            "data_type": self.dtype.v3_name(),
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": self.chunk_shape()}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
            "fill_value": self.fill,
            "codecs": codecs,
            "attributes": self.attributes,
        });
        let mut doc = doc;
        if let Some(names) = &self.dimension_names {
            doc["dimension_names"] = json!(names);
        }
        pretty(&doc)
    }

    /// The v2 `.zarray`. Its `fill_value` is `null`, as the v2 view shows an array with
    /// no `_FillValue` ([`super::fill`]): zarr 2 and xarray would mask values equal to
    /// any other, and every chunk of a container exists, so none is ever read as fill.
    pub fn zarray(&self) -> Vec<u8> {
        let doc = json!({
            "zarr_format": 2,
            "shape": self.shape,
            "chunks": self.chunk_shape(),
            "dtype": self.dtype.v2_name(),
            "compressor": {
                "id": "blosc",
                "cname": self.codec.cname,
                "clevel": self.codec.clevel,
                "shuffle": self.codec.shuffle,
                "blocksize": 0,
            },
            "fill_value": null,
            "order": if self.order == Order::F { "F" } else { "C" },
            "filters": null,
            "dimension_separator": ".",
        });
        pretty(&doc)
    }

    /// The v2 `.zattrs`.
    pub fn zattrs(&self) -> Vec<u8> {
        let mut attrs = self.attributes.clone();
        if let Some(names) = &self.dimension_names
            && !attrs.contains_key("_ARRAY_DIMENSIONS")
        {
            attrs.insert("_ARRAY_DIMENSIONS".into(), json!(names));
        }
        pretty(&Value::Object(attrs))
    }

    /// The name of chunk `i` in the v3 view (`c.3.0`) or the v2 view (`3.0`).
    pub fn key(&self, i: u64, v2: bool) -> String {
        let parts: Vec<String> = self.coords(i).iter().map(u64::to_string).collect();
        match (v2, parts.is_empty()) {
            (true, true) => "0".into(),
            (true, false) => parts.join("."),
            (false, true) => "c".into(),
            (false, false) => format!("c.{}", parts.join(".")),
        }
    }

    /// The chunk a file name of the view names.
    pub fn parse_key(&self, name: &str, v2: bool) -> Option<u64> {
        let rest = if v2 { name } else { name.strip_prefix("c.")? };
        let coords: Option<Vec<u64>> = rest
            .split('.')
            .map(|p| {
                let canonical = p == "0" || (!p.starts_with('0') && !p.starts_with('+'));
                canonical.then(|| p.parse().ok()).flatten()
            })
            .collect();
        self.chunk_of(&coords?)
    }

    /// The padding element of a short chunk: the fill value in the array's type.
    pub fn fill_element(&self) -> Vec<u8> {
        self.dtype.element(&self.fill)
    }
}

/// A group's v3 `zarr.json` with `attributes`.
pub fn group_json(attributes: &Map<String, Value>) -> Vec<u8> {
    pretty(&json!({"zarr_format": 3, "node_type": "group", "attributes": attributes}))
}

/// A group's v2 `.zgroup`.
pub fn zgroup() -> Vec<u8> {
    pretty(&json!({"zarr_format": 2}))
}

/// A fill value as a container's JSON holds it, as Zarr v3 writes it: the first element
/// of a list (a default row), NaN and the infinities as strings.
pub fn v3_fill(dtype: Dtype, v: &Value) -> Value {
    let v = match v {
        Value::Array(items) => items.first().cloned().unwrap_or(Value::Null),
        v => v.clone(),
    };
    match (dtype.kind, &v) {
        ('b', Value::Bool(_)) => v,
        ('b', Value::Number(n)) => Value::Bool(n.as_f64().is_some_and(|x| x != 0.0)),
        ('i' | 'u', Value::Number(n)) if n.is_i64() || n.is_u64() => v,
        ('f', Value::Number(n)) => n.as_f64().map_or(json!(0.0), |x| json!(x)),
        ('f', Value::String(s)) if ["NaN", "Infinity", "-Infinity"].contains(&s.as_str()) => v,
        ('c', Value::Number(n)) => json!([n.as_f64().unwrap_or(0.0), 0.0]),
        ('b', _) => json!(false),
        ('i' | 'u', _) => json!(0),
        ('c', _) => json!([0.0, 0.0]),
        _ => json!(0.0),
    }
}

fn pretty(v: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(v).expect("JSON of a JSON value");
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(shape: Vec<u64>, order: Order) -> ShownArray {
        ShownArray {
            dtype: Dtype::parse("float64").unwrap(),
            shape,
            order,
            chunk_len: 4,
            fill: json!(0.0),
            codec: BloscCodec {
                cname: "lz4",
                clevel: 5,
                shuffle: 1,
                typesize: 8,
            },
            attributes: Map::new(),
            dimension_names: None,
        }
    }

    #[test]
    fn dtypes_as_numpy_spells_them() {
        let d = Dtype::parse("'<f8'").unwrap();
        assert_eq!((d.v3_name(), d.v2_name()), ("float64".into(), "<f8".into()));
        let d = Dtype::parse(">i2").unwrap();
        assert_eq!((d.v3_name(), d.v2_name()), ("int16".into(), ">i2".into()));
        assert_eq!(d.element(&json!(1)), vec![0, 1]);
        assert_eq!(Dtype::parse("|b1").unwrap().v3_name(), "bool");
        assert_eq!(Dtype::parse("uint8").unwrap().v2_name(), "|u1");
        for bad in ["|S10", "<M8[ns]", "[('a', '<i4')]", "", "<f3", "object"] {
            assert_eq!(Dtype::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn keys_along_the_chunked_axis() {
        let c = array(vec![10, 3], Order::C);
        assert_eq!((c.nchunks(), c.chunk_shape()), (3, vec![4, 3]));
        assert_eq!(
            (c.key(2, false), c.key(2, true)),
            ("c.2.0".into(), "2.0".into())
        );
        assert_eq!(c.parse_key("c.2.0", false), Some(2));
        for bad in ["c.3.0", "c.2.1", "c.02.0", "2.0", "c.2", "c.+1.0"] {
            assert_eq!(c.parse_key(bad, false), None, "{bad}");
        }
        let f = array(vec![3, 10], Order::F);
        assert_eq!(
            (f.chunk_shape(), f.key(1, true)),
            (vec![3, 4], "0.1".into())
        );
        let doc: Value = serde_json::from_slice(&f.zarr_json()).unwrap();
        assert_eq!(doc["codecs"][0]["name"], "transpose");
        let z: Value = serde_json::from_slice(&f.zarray()).unwrap();
        assert_eq!(z["order"], "F");
    }

    #[test]
    fn fill_values_as_v3_writes_them() {
        let f8 = Dtype::parse("float64").unwrap();
        assert_eq!(v3_fill(f8, &json!([1.5, 1.5])), json!(1.5));
        assert_eq!(v3_fill(f8, &json!(2)), json!(2.0));
        assert_eq!(
            v3_fill(Dtype::parse("bool").unwrap(), &json!(0)),
            json!(false)
        );
        assert_eq!(
            v3_fill(Dtype::parse("int8").unwrap(), &json!("x")),
            json!(0)
        );
    }
}
