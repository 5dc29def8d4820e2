//! `.zattrs` and `.zgroup` of a v3 node, and the way back: a `.zattrs` written through the
//! view applied to the v3 document (`dimension_names` as xarray's `_ARRAY_DIMENSIONS`,
//! OME-Zarr 0.5 in its 0.4 form, the `_FillValue` that `.zarray` shows). Not `.zarray`
//! ([`mod@super::zarray`], [`super::from_zarray`]).

use serde_json::{Map, Value, json};

use super::dtype::data_type_name;
use crate::format::{fill, ome};

/// The attribute xarray keeps dimension names in.
pub const ARRAY_DIMENSIONS: &str = "_ARRAY_DIMENSIONS";

/// Whether `.zarray` shows the `_FillValue` attribute of v3 array metadata `doc` as its
/// `fill_value` (and `.zattrs` hides it): one that means a value of the data type.
pub(super) fn shows_attr_fill(doc: &Map<String, Value>) -> bool {
    data_type_name(doc)
        .ok()
        .and_then(|t| fill::attr_fill(doc, &t))
        .is_some()
}

/// Whether v3 metadata `doc` names its dimensions (`dimension_names`, or xarray's
/// `_ARRAY_DIMENSIONS` attribute): an array xarray reads.
pub(super) fn has_dimension_names(doc: &Map<String, Value>) -> bool {
    let named = |v: Option<&Value>| {
        v.and_then(Value::as_array)
            .is_some_and(|n| !n.is_empty() && n.iter().all(Value::is_string))
    };
    named(doc.get("dimension_names"))
        || named(doc.get("attributes").and_then(|a| a.get(ARRAY_DIMENSIONS)))
}

/// `.zattrs` of a v3 node: its attributes (OME-Zarr 0.5 in its 0.4 form, see
/// [`ome`]), with `dimension_names` as `_ARRAY_DIMENSIONS`.
pub fn zattrs(doc: &Map<String, Value>) -> Value {
    let mut attrs = ome::to_v04(
        doc.get("attributes")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
    );
    if let Some(Value::Array(names)) = doc.get("dimension_names")
        && !names.is_empty()
        && names.iter().all(Value::is_string)
        && !attrs.contains_key(ARRAY_DIMENSIONS)
    {
        attrs.insert(ARRAY_DIMENSIONS.into(), Value::Array(names.clone()));
    }
    if doc.get("node_type").and_then(Value::as_str) == Some("array") && shows_attr_fill(doc) {
        // Shown as `fill_value` in `.zarray` ([`fill`]).
        attrs.remove(fill::FILL_VALUE_ATTR);
    }
    Value::Object(attrs)
}

/// `.zgroup`.
pub fn zgroup() -> Value {
    json!({"zarr_format": 2})
}

/// Apply a `.zattrs` written through the view to a v3 document: the attributes are
/// replaced (OME-Zarr 0.4 becomes 0.5, see [`ome`]; `name` is the node's directory
/// name); `_ARRAY_DIMENSIONS` of the array's rank becomes `dimension_names`.
pub fn apply_zattrs(
    doc: &mut Map<String, Value>,
    zattrs: &[u8],
    ndim: Option<usize>,
    name: &str,
) -> Result<(), String> {
    let v: Value = serde_json::from_slice(zattrs).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(attrs) = v else {
        return Err(".zattrs is not a JSON object".into());
    };
    let mut attrs = ome::to_v05(attrs, name);
    // The fill value `.zattrs` does not show (it is `.zarray`'s `fill_value`) stays.
    if ndim.is_some()
        && shows_attr_fill(doc)
        && !attrs.contains_key(fill::FILL_VALUE_ATTR)
        && let Some(v) = doc
            .get("attributes")
            .and_then(|a| a.get(fill::FILL_VALUE_ATTR))
    {
        attrs.insert(fill::FILL_VALUE_ATTR.into(), v.clone());
    }
    if let Some(ndim) = ndim
        && let Some(Value::Array(names)) = attrs.get(ARRAY_DIMENSIONS)
        && names.len() == ndim
        && names.iter().all(Value::is_string)
    {
        doc.insert("dimension_names".into(), Value::Array(names.clone()));
        attrs.remove(ARRAY_DIMENSIONS);
    }
    // A `null` fill value is kept as a `null` `_FillValue` only while the array has no
    // dimension names: with them the view shows `null` anyway, and xarray on zarr 3
    // would read the attribute as a fill value.
    if doc.contains_key("dimension_names") && attrs.get(fill::FILL_VALUE_ATTR) == Some(&Value::Null)
    {
        attrs.remove(fill::FILL_VALUE_ATTR);
    }
    doc.insert("attributes".into(), Value::Object(attrs));
    Ok(())
}
