//! OME-Zarr metadata between its 0.5 form (Zarr v3, the store) and its 0.4 form (Zarr v2,
//! the v2 view). No I/O.
//!
//! Specs: <https://ngff.openmicroscopy.org/0.5/> and <https://ngff.openmicroscopy.org/0.4/>.
//! The two versions carry the same objects; only where they sit differs:
//!
//! | 0.5 (`zarr.json` attributes)               | 0.4 (`.zattrs`)                                   |
//! |--------------------------------------------|---------------------------------------------------|
//! | `ome.version: "0.5"`                        | `version: "0.4"` inside each `multiscales` entry, `image-label`, `plate` and `well` |
//! | `ome.multiscales`, `ome.omero`, `ome.labels`, `ome.image-label`, `ome.plate`, `ome.well`, `ome["bioformats2raw.layout"]` | the same keys at the top level |
//!
//! Axes, datasets, coordinate transformations, `omero` channels and the rest are the same
//! objects in both and are moved, never rewritten. Attributes that are not OME's are kept
//! where they are.

use serde_json::{Map, Value};

/// The keys OME-Zarr 0.5 keeps under `ome` and 0.4 at the top level.
const KEYS: [&str; 7] = [
    "multiscales",
    "omero",
    "labels",
    "image-label",
    "plate",
    "well",
    "bioformats2raw.layout",
];

/// The objects that carry their own `version` in 0.4.
const VERSIONED: [&str; 3] = ["image-label", "plate", "well"];

const V04: &str = "0.4";
const V05: &str = "0.5";

/// The 0.4 form of a node's attributes, for `.zattrs` in the v2 view: the members of an
/// `ome` object of version 0.5 move to the top level, with `version: "0.4"` where 0.4
/// wants it. Attributes with no `ome` object, an `ome` of another version, or a top-level
/// key that the move would overwrite are returned as they are.
pub fn to_v04(mut attrs: Map<String, Value>) -> Map<String, Value> {
    let Some(Value::Object(ome)) = attrs.get("ome") else {
        return attrs;
    };
    if ome.get("version").and_then(Value::as_str) != Some(V05)
        || ome
            .keys()
            .any(|k| k != "version" && (attrs.contains_key(k) || !KEYS.contains(&k.as_str())))
    {
        return attrs;
    }
    let Some(Value::Object(ome)) = attrs.remove("ome") else {
        unreachable!("checked above")
    };
    for (key, mut value) in ome {
        if key == "version" {
            continue;
        }
        if key == "multiscales"
            && let Value::Array(entries) = &mut value
        {
            for entry in entries.iter_mut().filter_map(Value::as_object_mut) {
                entry.insert("version".into(), V04.into());
            }
        } else if VERSIONED.contains(&key.as_str())
            && let Value::Object(object) = &mut value
        {
            object.insert("version".into(), V04.into());
        }
        attrs.insert(key, value);
    }
    attrs
}

/// The 0.5 form of attributes written as `.zattrs` through the v2 view, for `zarr.json`:
/// where they are OME-Zarr 0.4, the OME keys move under `ome` (version 0.5) and lose
/// their own `version`. `name` is the node's directory name: a 0.4 `labels` group
/// (`{"labels": [...]}`, no version of its own) is recognised by its name, `labels`, as
/// the spec requires it.
///
/// The attributes are OME-Zarr 0.4 when a `multiscales` entry, `image-label`, `plate` or
/// `well` says `version: "0.4"`, when `bioformats2raw.layout` is there, or for the
/// `labels` list of a group named `labels`. Anything else (no OME keys, an `ome` object
/// already, another version) is stored as written.
pub fn to_v05(mut attrs: Map<String, Value>, name: &str) -> Map<String, Value> {
    if attrs.contains_key("ome") {
        return attrs;
    }
    let mut versions = Vec::new();
    if let Some(Value::Array(entries)) = attrs.get("multiscales") {
        versions.extend(entries.iter().map(|e| e.get("version")));
    }
    for key in VERSIONED {
        if let Some(object) = attrs.get(key) {
            versions.push(object.get("version"));
        }
    }
    let all_04 = versions
        .iter()
        .all(|v| v.and_then(Value::as_str) == Some(V04));
    let marked = !versions.is_empty() && all_04;
    let layout = attrs.contains_key("bioformats2raw.layout") && all_04;
    let labels = name == "labels"
        && versions.is_empty()
        && matches!(attrs.get("labels"), Some(Value::Array(l)) if l.iter().all(Value::is_string));
    if !(marked || layout || labels) {
        return attrs;
    }
    let mut ome = Map::new();
    ome.insert("version".into(), V05.into());
    for key in KEYS {
        let Some(mut value) = attrs.remove(key) else {
            continue;
        };
        if key == "multiscales"
            && let Value::Array(entries) = &mut value
        {
            for entry in entries.iter_mut().filter_map(Value::as_object_mut) {
                entry.remove("version");
            }
        } else if VERSIONED.contains(&key)
            && let Value::Object(object) = &mut value
        {
            object.remove("version");
        }
        ome.insert(key.into(), value);
    }
    attrs.insert("ome".into(), Value::Object(ome));
    attrs
}

/// The axis names of the multiscale image in a group's attributes (either form) whose
/// datasets include `path`: what OME-Zarr 0.5 requires as that array's `dimension_names`.
pub fn axis_names_of(attrs: &Map<String, Value>, path: &str) -> Option<Vec<String>> {
    let multiscales = match attrs.get("ome") {
        Some(ome) => ome.get("multiscales"),
        None => attrs.get("multiscales"),
    }?;
    multiscales.as_array()?.iter().find_map(|m| {
        let listed = m
            .get("datasets")?
            .as_array()?
            .iter()
            .any(|d| d.get("path").and_then(Value::as_str) == Some(path));
        if !listed {
            return None;
        }
        m.get("axes")?
            .as_array()?
            .iter()
            .map(|a| a.get("name").and_then(Value::as_str).map(str::to_owned))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        let Value::Object(m) = v else {
            panic!("not an object")
        };
        m
    }

    fn image_05() -> Value {
        json!({
            "note": "kept",
            "ome": {
                "version": "0.5",
                "multiscales": [{
                    "name": "img",
                    "axes": [{"name": "c", "type": "channel"},
                             {"name": "y", "type": "space", "unit": "micrometer"},
                             {"name": "x", "type": "space", "unit": "micrometer"}],
                    "datasets": [
                        {"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1.0, 0.5, 0.5]}]},
                        {"path": "1", "coordinateTransformations": [{"type": "scale", "scale": [1.0, 1.0, 1.0]}]}
                    ],
                    "coordinateTransformations": [{"type": "scale", "scale": [1.0, 1.0, 1.0]}],
                    "type": "mean"
                }],
                "omero": {"channels": [{"label": "DAPI", "color": "0000FF", "window": {"start": 0, "end": 100, "min": 0, "max": 255}}]}
            }
        })
    }

    fn image_04() -> Value {
        json!({
            "note": "kept",
            "multiscales": [{
                "version": "0.4",
                "name": "img",
                "axes": [{"name": "c", "type": "channel"},
                         {"name": "y", "type": "space", "unit": "micrometer"},
                         {"name": "x", "type": "space", "unit": "micrometer"}],
                "datasets": [
                    {"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1.0, 0.5, 0.5]}]},
                    {"path": "1", "coordinateTransformations": [{"type": "scale", "scale": [1.0, 1.0, 1.0]}]}
                ],
                "coordinateTransformations": [{"type": "scale", "scale": [1.0, 1.0, 1.0]}],
                "type": "mean"
            }],
            "omero": {"channels": [{"label": "DAPI", "color": "0000FF", "window": {"start": 0, "end": 100, "min": 0, "max": 255}}]}
        })
    }

    #[test]
    fn an_image_goes_both_ways() {
        assert_eq!(Value::Object(to_v04(obj(image_05()))), image_04());
        assert_eq!(Value::Object(to_v05(obj(image_04()), "img")), image_05());
    }

    #[test]
    fn labels_plates_wells_and_layouts_go_both_ways() {
        let cases = [
            (
                "labels",
                json!({"ome": {"version": "0.5", "labels": ["cells", "nuclei"]}}),
                json!({"labels": ["cells", "nuclei"]}),
            ),
            (
                "cells",
                json!({"ome": {"version": "0.5", "image-label": {"colors": [{"label-value": 1, "rgba": [255, 0, 0, 255]}], "source": {"image": "../../"}}}}),
                json!({"image-label": {"version": "0.4", "colors": [{"label-value": 1, "rgba": [255, 0, 0, 255]}], "source": {"image": "../../"}}}),
            ),
            (
                "plate",
                json!({"ome": {"version": "0.5", "plate": {"columns": [{"name": "1"}], "rows": [{"name": "A"}], "wells": [{"path": "A/1", "rowIndex": 0, "columnIndex": 0}]}}}),
                json!({"plate": {"version": "0.4", "columns": [{"name": "1"}], "rows": [{"name": "A"}], "wells": [{"path": "A/1", "rowIndex": 0, "columnIndex": 0}]}}),
            ),
            (
                "1",
                json!({"ome": {"version": "0.5", "well": {"images": [{"path": "0"}]}}}),
                json!({"well": {"version": "0.4", "images": [{"path": "0"}]}}),
            ),
            (
                "root",
                json!({"ome": {"version": "0.5", "bioformats2raw.layout": 3}}),
                json!({"bioformats2raw.layout": 3}),
            ),
        ];
        for (name, v05, v04) in cases {
            assert_eq!(Value::Object(to_v04(obj(v05.clone()))), v04, "{name}");
            assert_eq!(Value::Object(to_v05(obj(v04), name)), v05, "{name}");
        }
    }

    #[test]
    fn what_is_not_ome_zarr_of_the_other_version_stays_as_it_is() {
        let same_04 = [
            json!({"a": 1}),
            // another version of the ome object
            json!({"ome": {"version": "0.6", "multiscales": []}}),
            // a key the move would overwrite
            json!({"multiscales": "mine", "ome": {"version": "0.5", "multiscales": []}}),
            // a key that is not OME's
            json!({"ome": {"version": "0.5", "mine": 1}}),
            json!({"ome": "not an object"}),
        ];
        for v in same_04 {
            assert_eq!(Value::Object(to_v04(obj(v.clone()))), v);
        }
        let same_05 = [
            (json!({"a": 1}), "img"),
            // OME-Zarr 0.3 or older, or a mix of versions
            (
                json!({"multiscales": [{"version": "0.3", "datasets": []}]}),
                "img",
            ),
            (
                json!({"multiscales": [{"version": "0.4"}], "plate": {"version": "0.3"}}),
                "img",
            ),
            (json!({"multiscales": [{}]}), "img"),
            // a labels list outside a group named labels
            (json!({"labels": ["a"]}), "other"),
            (json!({"labels": [1]}), "labels"),
            // already 0.5
            (
                json!({"ome": {"version": "0.5"}, "multiscales": [{"version": "0.4"}]}),
                "img",
            ),
        ];
        for (v, name) in same_05 {
            assert_eq!(Value::Object(to_v05(obj(v.clone()), name)), v);
        }
    }

    #[test]
    fn axis_names_are_found_for_listed_datasets_in_either_form() {
        for attrs in [image_05(), image_04()] {
            let attrs = obj(attrs);
            assert_eq!(
                axis_names_of(&attrs, "1"),
                Some(vec!["c".into(), "y".into(), "x".into()])
            );
            assert_eq!(axis_names_of(&attrs, "2"), None);
        }
        assert_eq!(axis_names_of(&obj(json!({"a": 1})), "0"), None);
    }
}
