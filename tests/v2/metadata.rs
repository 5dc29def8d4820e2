//! v2 metadata written through the v2 view: refused when bad (nothing left behind),
//! written by shell redirection, and shape changes that leave chunks outside the grid.

use super::*;

/// Bad metadata written through the v2 view is refused with `EINVAL` and leaves nothing
/// behind: no v2 file in the store, no array half made, the existing array unchanged.
/// With `open_checks` the refusal comes at close; with the kernel opening files (the
/// default) at the write that makes the document whole, or at `fsync` for one that never
/// becomes whole JSON.
#[test]
fn bad_v2_metadata_is_refused_and_leaves_nothing_behind() {
    if !common::can_mount() {
        return;
    }
    for open_checks in [false, true] {
        bad_v2_metadata_is_refused(open_checks);
    }
}

fn bad_v2_metadata_is_refused(open_checks: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let status = Command::new("cp")
        .arg("-r")
        .arg(common::fixtures().join("zarr_codecs"))
        .arg(&store)
        .status()
        .unwrap();
    assert!(status.success());
    let before = std::fs::read(store.join("inner_gzip/zarr.json")).unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let opts = MountOptions {
        open_checks,
        ..v2_options(false)
    };
    let mount = Mount::new(&store, mnt.path(), &opts).unwrap();
    let m = mnt.path();
    let einval = |r: std::io::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EINVAL),
            "{what} (open_checks {open_checks}): {e}"
        );
    };
    let write_and_close = |path: PathBuf, data: &[u8]| {
        if open_checks {
            write_and_close(path, data)
        } else {
            write_fsync_close(path, data)
        }
    };
    // A new array whose .zarray is not JSON, or asks for a codec or dtype v3 lacks (each
    // in a directory of its own: see the note on repeated refusals in the README).
    let jpeg = br#"{"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<u2",
        "compressor": {"id": "imagecodecs_jpeg"}, "fill_value": 0, "order": "C", "filters": null}"#;
    let object = br#"{"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "|O",
        "compressor": null, "fill_value": 0, "order": "C", "filters": null}"#;
    for (i, (bad, what)) in [
        (&b"{not json"[..], "not JSON"),
        (&jpeg[..], "a codec v3 has no name for"),
        (&object[..], "object dtype"),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = m.join(format!("bad{i}"));
        std::fs::create_dir(&dir).unwrap();
        einval(write_and_close(dir.join(".zarray"), bad), what);
        assert!(!dir.join(".zarray").exists(), "{what}");
    }
    // An existing array: only its shape may change.
    let shown = std::fs::read_to_string(m.join("inner_gzip/.zarray")).unwrap();
    let other_dtype = shown.replace("<i4", "<i8");
    assert_ne!(shown, other_dtype);
    einval(
        write_and_close(m.join("inner_gzip/.zarray"), other_dtype.as_bytes()),
        "dtype change",
    );
    einval(
        write_and_close(m.join("inner_gzip/.zattrs"), &b"[1, 2]"[..]),
        "attributes not an object",
    );
    // A chunk outside the grid.
    write_and_close(m.join("inner_gzip/tmp.partial"), &b"x"[..]).unwrap();
    einval(
        std::fs::rename(m.join("inner_gzip/tmp.partial"), m.join("inner_gzip/0/99")),
        "chunk outside the grid",
    );
    mount.unmount().unwrap();
    let files = common::files_under(&store);
    assert!(
        !files
            .iter()
            .any(|f| f.starts_with("bad/") || f.contains(".z")),
        "{files:?}"
    );
    assert_eq!(
        std::fs::read(store.join("inner_gzip/zarr.json")).unwrap(),
        before
    );
}

/// A shell's redirection (`echo ... > .zattrs`, which closes a duplicate of the still
/// empty file before writing) stores v2 metadata like any other write: attributes of an
/// unsharded array and of a group, a new group, and a resize through `.zarray`. And 0.4
/// multiscales written over existing unsharded arrays give them `dimension_names`.
#[test]
fn shell_redirection_into_v2_metadata_and_ome_names_on_unsharded_arrays() {
    if !common::can_mount() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    std::fs::create_dir_all(store.join("img/0")).unwrap();
    std::fs::write(
        store.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "group", "attributes": {}}"#,
    )
    .unwrap();
    std::fs::write(
        store.join("img/zarr.json"),
        br#"{"zarr_format": 3, "node_type": "group", "attributes": {}}"#,
    )
    .unwrap();
    let array = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [4, 4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {"k": 1}
    });
    std::fs::write(store.join("img/0/zarr.json"), array.to_string()).unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let mount = Mount::new(&store, mnt.path(), &v2_options(false)).unwrap();
    let m = mnt.path();
    let sh = |script: &str| {
        let st = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(m)
            .status()
            .unwrap();
        assert!(st.success(), "{script}");
    };
    sh(r#"echo '{"k": 2}' > img/0/.zattrs"#);
    let zattrs = std::fs::read_to_string(m.join("img/0/.zattrs")).unwrap();
    assert_eq!(zattrs, "{\"k\": 2}\n", "read back as written");
    sh(r#"mkdir newgrp && echo '{"zarr_format": 2}' > newgrp/.zgroup"#);
    let zarray = std::fs::read_to_string(m.join("img/0/.zarray")).unwrap();
    let grown = zarray.replacen("4,", "6,", 1);
    assert_ne!(grown, zarray);
    std::fs::write(tmp.path().join("za"), &grown).unwrap();
    sh(&format!(
        "cat {} > img/0/.zarray",
        tmp.path().join("za").display()
    ));
    let zarray = std::fs::read_to_string(m.join("img/0/.zarray")).unwrap();
    assert_eq!(zarray, grown, "read back as written");
    let multiscales = r#"{"multiscales": [{"version": "0.4", "axes": [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}], "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1.0, 1.0]}]}]}]}"#;
    sh(&format!("echo '{multiscales}' > img/.zattrs"));
    let zattrs = std::fs::read_to_string(m.join("img/.zattrs")).unwrap();
    assert_eq!(zattrs, format!("{multiscales}\n"), "read back as written");
    mount.unmount().unwrap();
    let stored = common::json_file(&store.join("img/0/zarr.json"));
    assert_eq!(stored["attributes"]["k"], 2, "{stored}");
    assert_eq!(stored["shape"][0], 6, "{stored}");
    assert_eq!(
        stored["dimension_names"],
        serde_json::json!(["y", "x"]),
        "{stored}"
    );
    assert!(
        stored["codecs"].to_string().contains("bytes"),
        "still unsharded"
    );
    assert_eq!(
        common::json_file(&store.join("newgrp/zarr.json"))["node_type"],
        "group"
    );
    let img = common::json_file(&store.join("img/zarr.json"));
    assert_eq!(img["attributes"]["ome"]["version"], "0.5", "{img}");
}

/// zarr 2's `resize` through the v2 view of an array with flat keys (`1.0.1`, separator
/// `.`): the shrink deletes the chunks stored outside the new grid, so a later grow does
/// not bring their old bytes back (found by the reference test, seed 551126 in v2: the
/// walk of an array's shards went by directory levels, and flat keys have none, so only
/// chunks not yet committed were deleted).
#[test]
fn a_shrink_deletes_stored_chunks_outside_the_grid_also_with_flat_keys() {
    if !common::can_mount() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    std::fs::create_dir(&store).unwrap();
    std::fs::write(
        store.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "group", "attributes": {}}"#,
    )
    .unwrap();
    let zarray = |shape: &str| {
        format!(
            r#"{{"zarr_format": 2, "shape": {shape}, "chunks": [3, 2, 3], "dtype": "|u1",
            "compressor": null, "fill_value": 0, "order": "C", "filters": null,
            "dimension_separator": "."}}"#
        )
    };
    let mnt = tempfile::tempdir().unwrap();
    let a = mnt.path().join("a");
    {
        let _mount = Mount::new(&store, mnt.path(), &v2_options(false)).unwrap();
        std::fs::create_dir(&a).unwrap();
        write_and_close(a.join(".zarray"), zarray("[4, 4, 6]")).unwrap();
        write_fsync_close(a.join("0.0.0"), &[1; 18]).unwrap();
        write_fsync_close(a.join("1.0.1"), &[2; 18]).unwrap();
        // Stored in the shard now (fsync), not staged.
        write_and_close(a.join(".zarray"), zarray("[1, 2, 4]")).unwrap();
        assert!(!a.join("1.0.1").exists(), "outside the grid");
        write_and_close(a.join(".zarray"), zarray("[5, 1, 6]")).unwrap();
        assert_eq!(
            std::fs::metadata(a.join("1.0.1"))
                .map_err(|e| e.kind())
                .err(),
            Some(std::io::ErrorKind::NotFound),
            "the grow brought back a chunk the shrink should have deleted"
        );
        assert_eq!(std::fs::read(a.join("0.0.0")).unwrap(), [1; 18]);
    }
    // And in the store, after the unmount: a fresh mount finds the same.
    let _mount = Mount::new(&store, mnt.path(), &v2_options(true)).unwrap();
    assert!(!a.join("1.0.1").exists());
    assert_eq!(std::fs::read(a.join("0.0.0")).unwrap(), [1; 18]);
}

/// v2 view: a key directory that a shrink leaves outside the grid, holding a file of its
/// own, is listed as a plain directory (by this mount and a later one), and is a key
/// directory again once the array grows back over it, as in the v3 view. Before, its file
/// was stored but the directory was never listed: the v2 view's keys start in the array's
/// own directory, whose listing left it out (found by the reference test:
/// `new-v2-file-outside-grid-hidden`).
#[test]
fn a_key_directory_a_shrink_leaves_outside_the_grid_is_listed_while_it_holds_files() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let zarray = |rows: u64| {
        format!(
            r#"{{"zarr_format": 2, "shape": [{rows}, 4], "chunks": [2, 2], "dtype": "|u1",
            "compressor": null, "fill_value": 0, "order": "C", "filters": null,
            "dimension_separator": "/"}}"#
        )
    };
    let names = common::names;
    {
        let mnt = tempfile::tempdir().unwrap();
        let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
        let a = mnt.path().join("a");
        std::fs::create_dir(&a).unwrap();
        std::fs::write(a.join(".zarray"), zarray(4)).unwrap();
        std::fs::create_dir_all(a.join("0")).unwrap();
        std::fs::write(a.join("0/0"), [1u8; 4]).unwrap();
        std::fs::create_dir_all(a.join("1")).unwrap();
        std::fs::write(a.join("1/notes.txt"), b"mine").unwrap();
        std::fs::write(a.join(".zarray"), zarray(2)).unwrap();
        assert_eq!(names(&a), [".zarray", ".zattrs", "0", "1"]);
        assert_eq!(names(&a.join("1")), ["notes.txt"]);
        m.unmount().unwrap();
    }
    let mnt = tempfile::tempdir().unwrap();
    let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
    let a = mnt.path().join("a");
    assert_eq!(names(&a), [".zarray", ".zattrs", "0", "1"], "a later mount");
    assert_eq!(std::fs::read(a.join("1/notes.txt")).unwrap(), b"mine");
    std::fs::write(a.join(".zarray"), zarray(4)).unwrap();
    assert_eq!(names(&a), [".zarray", ".zattrs", "0", "1"], "grown back");
    assert_eq!(names(&a.join("1")), ["notes.txt"]);
    assert_eq!(std::fs::read(a.join("0/0")).unwrap(), [1u8; 4]);
    m.unmount().unwrap();
}
