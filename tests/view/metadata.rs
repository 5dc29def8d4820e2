//! Metadata written through the view: read back as written while it is the document
//! shown, refused renames and releases that change nothing, temporaries left nowhere.

use super::*;

/// v2 view with open checks (the daemon hears every close): a group's `.zattrs` written
/// twice in a row, the first writer's release arriving (asynchronously, as the kernel
/// sends it) while the second writer has the file open. The late release took the
/// second writer's file in, half written, and removed it: the second close failed with
/// `ENOENT`, and zarr 2 then read `KeyError: '.zattrs'` (issue 33, finding 6: the race
/// behind the intermittent `ome_zarr_0_4_tools_read_and_write_0_5_images_through_the_v2_view`).
#[test]
fn a_late_release_never_takes_in_another_writers_v2_metadata() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "group", "attributes": {}}"#,
    )
    .unwrap();
    let view = writable_view_of(dir.path(), ViewFormat::V2);
    let zattrs = OsStr::new(".zattrs");
    let write = |doc: &[u8]| {
        let ino = view.lookup(ROOT_INO, zattrs).unwrap().ino;
        let o = view.open(ino, true, true).unwrap();
        view.write(o.fh, 0, doc).unwrap();
        o.fh
    };
    let first = write(br#"{"a": 1}"#);
    view.flush_handle(first).unwrap(); // its close: taken in
    let ino = view.lookup(ROOT_INO, zattrs).unwrap().ino;
    let second = view.open(ino, true, true).unwrap().fh;
    view.write(second, 0, br#"{"b":"#).unwrap();
    view.release(first).unwrap(); // the first writer's release, late
    view.write(second, 5, br#" 2}"#).unwrap();
    view.flush_handle(second)
        .expect("the second writer's close");
    view.release(second).unwrap();
    let stored: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("zarr.json")).unwrap()).unwrap();
    assert_eq!(stored["attributes"], serde_json::json!({"b": 2}));
}

/// Metadata written through the view reads back as its writer wrote it (`getattr`'s size
/// too: the kernel keeps the writer's length), while the view's rendering of the stored
/// document is the same JSON value; a refused rewrite leaves the last accepted bytes
/// shown; another view of the store (a later mount) shows its own rendering.
#[test]
fn metadata_reads_back_as_written_while_it_is_the_document_shown() {
    let store = tempfile::tempdir().unwrap();
    let view = writable_view_of(store.path(), ViewFormat::V3);
    let b = view.mkdir(ROOT_INO, OsStr::new("b")).unwrap().ino;
    let mut meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [4, 4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {"n": 0}
    });
    let compact = |m: &serde_json::Value| serde_json::to_vec(m).unwrap();
    let written = compact(&meta);
    let ino = write_file(&view, b, "zarr.json", &written);
    assert_eq!(read(&view, "b/zarr.json").unwrap(), written, "a new array");
    let rewrite = |bytes: &[u8]| -> Result<(), ViewError> {
        let fh = view.open(ino, true, true)?.fh;
        view.write(fh, 0, bytes)?;
        let flushed = view.flush_handle(fh);
        view.release(fh)?;
        flushed
    };
    meta["attributes"] = serde_json::json!({"n": 1, "note": "in place"});
    let written = compact(&meta);
    rewrite(&written).unwrap();
    assert_eq!(read(&view, "b/zarr.json").unwrap(), written, "a rewrite");
    let mut refused = meta.clone();
    refused["data_type"] = "uint16".into();
    assert_eq!(
        rewrite(&compact(&refused)).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(
        read(&view, "b/zarr.json").unwrap(),
        written,
        "after a refused rewrite"
    );
    // The array is looked at again (its directory changed: key directories, a chunk):
    // still the last accepted bytes (the refusal put them back).
    let c = view.mkdir(b, OsStr::new("c")).unwrap().ino;
    let c0 = view.mkdir(c, OsStr::new("0")).unwrap().ino;
    write_file(&view, c0, "1", &[5u8; 4]);
    view.flush_all().unwrap();
    assert_eq!(read(&view, "b/c/0/1").unwrap(), [5u8; 4]);
    assert_eq!(
        read(&view, "b/zarr.json").unwrap(),
        written,
        "after a refused rewrite and a chunk"
    );
    drop(view);
    let later = view_of(store.path());
    let shown = read(&later, "b/zarr.json").unwrap();
    assert_ne!(shown, written, "a later view renders the stored document");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&shown).unwrap(),
        meta,
        "the same document"
    );
}

/// `mv a/zarr.json a/zarr.json~` (an editor's backup): refused with `EXDEV` (moving a
/// sharded array's metadata away is not supported; `mv` then copies and unlinks), and
/// nothing changed: before, the copy at the new name was made first and stayed, listed
/// but not found, and stored at unmount (found by an adversarial tester).
#[test]
fn a_refused_rename_of_array_metadata_changes_nothing() {
    let store = tempfile::tempdir().unwrap();
    let view = writable_view_of(store.path(), ViewFormat::V3);
    let b = view.mkdir(ROOT_INO, OsStr::new("b")).unwrap().ino;
    let meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
        "codecs": [{"name": "bytes"}], "attributes": {}
    });
    write_file(&view, b, "zarr.json", &serde_json::to_vec(&meta).unwrap());
    view.mkdir(ROOT_INO, OsStr::new("plain")).unwrap();
    let plain = lookup(&view, "plain").unwrap().ino;
    for (dir, name) in [(b, "zarr.json~"), (plain, "zarr.json.bak")] {
        let err = view
            .rename(b, OsStr::new("zarr.json"), dir, OsStr::new(name), false)
            .unwrap_err();
        assert_eq!(err.errno(), libc::EXDEV, "{name}");
        let listed: Vec<String> = view
            .readdir(dir)
            .unwrap()
            .iter()
            .map(|e| e.name.to_string_lossy().into_owned())
            .collect();
        assert!(
            !listed.iter().any(|n| n == name),
            "{name} listed: {listed:?}"
        );
        assert_eq!(
            view.lookup(dir, OsStr::new(name)).unwrap_err().errno(),
            libc::ENOENT
        );
    }
    view.flush_all().unwrap();
    drop(view);
    let mut stored: Vec<_> = walkdir_files(store.path());
    stored.sort();
    assert_eq!(stored, ["b/zarr.json"], "nothing else in the store");
    assert!(lookup(&view_of(store.path()), "b/zarr.json").is_ok());
}

/// A new array's `zarr.json` replaced the way atomic writers do it (a temporary file
/// written beside it, then renamed onto it), with a shape that changes the grid: the
/// temporary's name is gone, from the mount and from the store. Before, the metadata's
/// change stored the temporary (a file of its own in the array's directory) on the way,
/// and the rename left that copy behind (found by the reference test).
#[test]
fn a_temporary_renamed_onto_a_new_arrays_metadata_leaves_nothing_behind() {
    let store = tempfile::tempdir().unwrap();
    let view = writable_view_of(store.path(), ViewFormat::V3);
    let a = view.mkdir(ROOT_INO, OsStr::new("a")).unwrap().ino;
    let mut meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [7, 7], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [3, 3]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
        "codecs": [{"name": "bytes"}], "attributes": {}
    });
    write_file(&view, a, "zarr.json", &serde_json::to_vec(&meta).unwrap());
    meta["shape"] = serde_json::json!([2, 2]);
    let tmp = "zarr.json.1234.partial";
    write_file(&view, a, tmp, &serde_json::to_vec(&meta).unwrap());
    view.rename(a, OsStr::new(tmp), a, OsStr::new("zarr.json"), false)
        .unwrap();
    let listed: Vec<String> = view
        .readdir(a)
        .unwrap()
        .iter()
        .map(|e| e.name.to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed, ["zarr.json"]);
    view.flush_all().unwrap();
    drop(view);
    assert_eq!(
        walkdir_files(store.path()),
        ["a/zarr.json"],
        "nothing else stored"
    );
    let shown: serde_json::Value =
        serde_json::from_slice(&read(&view_of(store.path()), "a/zarr.json").unwrap()).unwrap();
    assert_eq!(shown["shape"], serde_json::json!([2, 2]));
}
