//! The overlay reconciled with the store as the tree meets it (`src/view/reconcile.rs`),
//! through the view's API, over a local store that the tests change as another mount
//! would: listings that meet many stale directories, and what another mount kept or
//! replaced while this one holds an array's metadata unlinked. Written by a reviewer of
//! the facade (each failed before its fix).
mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::view::writable_view_of as view;
use shardfs::view::{ROOT_INO, View, ViewFormat};

/// The kept document's name (`store::UNLINKED_META`).
const KEPT: &str = "zarr.json.shardfs-unlinked";

fn sharded(inner: u64) -> String {
    format!(
        r#"{{"zarr_format": 3, "node_type": "array", "shape": [8], "data_type": "uint8",
        "chunk_grid": {{"name": "regular", "configuration": {{"chunk_shape": [8]}}}},
        "chunk_key_encoding": {{"name": "default", "configuration": {{"separator": "."}}}},
        "fill_value": 0, "codecs": [{{"name": "sharding_indexed", "configuration": {{"chunk_shape": [{inner}],
        "codecs": [{{"name": "bytes"}}], "index_codecs": [{{"name": "bytes"}}]}}}}], "attributes": {{"a": 1}}}}"#
    )
}

/// A store whose root group holds array `x` (metadata `doc`), a writable view of it in
/// `format`, `x`'s store directory and its inode.
fn array_x(doc: &str, format: ViewFormat) -> (tempfile::TempDir, View, PathBuf, u64) {
    let dir = tempfile::tempdir().unwrap();
    root_group(dir.path());
    let a = dir.path().join("x");
    std::fs::create_dir(&a).unwrap();
    std::fs::write(a.join("zarr.json"), doc).unwrap();
    let v = view(dir.path(), format);
    let x = v.lookup(ROOT_INO, OsStr::new("x")).unwrap().ino;
    (dir, v, a, x)
}

/// Write file `name` in directory `parent` whole, as `open(O_CREAT|O_TRUNC)`, `write`
/// and `close` do: the close's answer.
fn write_close(v: &View, parent: u64, name: &str, bytes: &[u8]) -> Result<(), i32> {
    let (_, o) = v.create(parent, OsStr::new(name), false, true).unwrap();
    v.write(o.fh, 0, bytes).unwrap();
    let flushed = v.flush_handle(o.fh).map_err(|e| e.errno());
    let released = v.release(o.fh).map_err(|e| e.errno());
    flushed.and(released)
}

/// The store's file mtimes are a coarse clock's: a document rewritten at once may keep
/// its time. Waited for between another mount's write and this one's look.
fn next_tick() {
    std::thread::sleep(Duration::from_millis(20));
}

fn kept_doc(a: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(a.join(KEPT)).unwrap()).unwrap()
}

fn root_group(dir: &Path) {
    std::fs::write(
        dir.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "group", "attributes": {}}"#,
    )
    .unwrap();
}

fn list_root(v: &View) -> Result<usize, i32> {
    let fh = v.opendir(ROOT_INO).map_err(|e| e.errno())?;
    let n = v.dir_entries(fh).unwrap().len();
    v.releasedir(fh);
    Ok(n)
}

/// A fresh writable v2 mount over a store where a previous mount left `n` arrays with
/// their metadata unlinked (kept documents): one readdir of the parent.
fn kept_left(n: usize) -> Result<usize, i32> {
    let dir = tempfile::tempdir().unwrap();
    root_group(dir.path());
    for i in 0..n {
        let a = dir.path().join(format!("a{i:03}"));
        std::fs::create_dir(&a).unwrap();
        std::fs::write(a.join(KEPT), sharded(2)).unwrap();
    }
    let v = view(dir.path(), ViewFormat::V2);
    list_root(&v)
}

#[test]
fn a_listing_meets_a_few_arrays_a_mount_left_unlinked() {
    assert_eq!(kept_left(10), Ok(15));
}

#[test]
fn a_listing_meets_any_number_of_arrays_a_mount_left_unlinked() {
    assert_eq!(kept_left(70), Ok(75));
}

/// One mount: `n` arrays whose `.zarray` was unlinked and `.zattrs` written since.
fn zattrs_held(n: usize) -> Result<usize, i32> {
    let dir = tempfile::tempdir().unwrap();
    root_group(dir.path());
    for i in 0..n {
        let a = dir.path().join(format!("a{i:03}"));
        std::fs::create_dir(&a).unwrap();
        std::fs::write(a.join("zarr.json"), sharded(2)).unwrap();
    }
    let v = view(dir.path(), ViewFormat::V2);
    for i in 0..n {
        let a = v
            .lookup(ROOT_INO, OsStr::new(&format!("a{i:03}")))
            .unwrap()
            .ino;
        v.unlink(a, OsStr::new(".zarray")).unwrap();
        assert_eq!(write_close(&v, a, ".zattrs", br#"{"b": 2}"#), Ok(()));
    }
    assert_eq!(kept_doc(&dir.path().join("a000"))["attributes"]["b"], 2);
    list_root(&v)
}

#[test]
fn a_listing_after_a_few_zattrs_written_into_unlinked_arrays() {
    assert_eq!(zattrs_held(10), Ok(15));
}

#[test]
fn a_listing_after_many_zattrs_written_into_unlinked_arrays() {
    assert_eq!(zattrs_held(70), Ok(75));
}

/// Another mount wrote the metadata back (and removed the kept document) while this
/// one holds the array unlinked; a `.zattrs` written here then.
#[test]
fn a_zattrs_written_after_another_mount_wrote_the_metadata_back_leaves_no_kept_document() {
    let (dir, v, a, x) = array_x(&sharded(2), ViewFormat::V2);
    v.unlink(x, OsStr::new(".zarray")).unwrap();
    assert!(a.join(KEPT).exists() && !a.join("zarr.json").exists());
    // another mount: metadata back, kept document removed
    next_tick();
    std::fs::write(a.join("zarr.json"), sharded(2)).unwrap();
    std::fs::remove_file(a.join(KEPT)).unwrap();
    next_tick();
    // Taken in as the array's attributes, the array whole again.
    assert_eq!(write_close(&v, x, ".zattrs", br#"{"b": 2}"#), Ok(()));
    assert!(
        !a.join(KEPT).exists(),
        "a kept document beside the metadata"
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("zarr.json")).unwrap()).unwrap();
    assert_eq!(doc["attributes"]["b"], 2, "{doc}");
    drop(v);
    // and a later mount finds nothing to take either
    let later = view(dir.path(), ViewFormat::V2);
    assert!(later.lookup(ROOT_INO, OsStr::new("x")).is_ok());
    assert!(!a.join(KEPT).exists());
}

/// A chunk staged for array x; another mount replaced x by y (another layout) and
/// unlinked y's metadata. A lookup of x here, then a flush.
#[test]
fn chunks_staged_for_an_array_another_mount_replaced_and_unlinked_are_not_stored_in_it() {
    let (_dir, v, a, x) = array_x(&sharded(2), ViewFormat::V3);
    assert_eq!(write_close(&v, x, "c.0", &[7, 7]), Ok(()));
    assert!(!a.join("c.0").exists(), "staged, not flushed yet");
    // another mount: rm -rf x; a new x of another layout; its zarr.json unlinked
    std::fs::remove_dir_all(&a).unwrap();
    std::fs::create_dir(&a).unwrap();
    std::fs::write(a.join(KEPT), sharded(4)).unwrap();
    assert!(v.lookup(ROOT_INO, OsStr::new("x")).is_ok());
    assert!(v.flush_all().is_ok());
    let shard = a.join("c.0");
    assert!(
        !shard.exists(),
        "the chunk staged for the old x was stored into the new x: {:?}",
        std::fs::read(&shard).ok()
    );
}

/// Another mount replaced the array (another layout) and unlinked the new one's metadata
/// while this one holds the old one unlinked; a `.zattrs` written here then.
#[test]
fn a_zattrs_written_here_does_not_overwrite_another_mounts_kept_document() {
    let (_dir, v, a, x) = array_x(&sharded(2), ViewFormat::V2);
    v.unlink(x, OsStr::new(".zarray")).unwrap();
    // another mount: the array replaced by one of another layout, its metadata unlinked
    next_tick();
    std::fs::write(a.join(KEPT), sharded(4)).unwrap();
    // This mount looks again at the write: it holds the other array now, and the
    // attributes go into its document.
    assert_eq!(write_close(&v, x, ".zattrs", br#"{"b": 2}"#), Ok(()));
    let kept = kept_doc(&a);
    let inner = &kept["codecs"][0]["configuration"]["chunk_shape"];
    assert_eq!(
        inner,
        &serde_json::json!([4]),
        "the other mount's kept array was overwritten: {kept}"
    );
    assert_eq!(kept["attributes"]["b"], 2, "{kept}");
}

/// The same for an unsharded array of the v2 view: another mount wrote the metadata
/// back, made another unsharded array there (another data type) and unlinked its
/// `.zarray`; a `.zattrs` written here then goes into that array's kept document, whose
/// data type stays. Before, the document held here was written over it.
#[test]
fn a_zattrs_written_into_an_unsharded_array_takes_the_document_kept_by_another_mount() {
    let unsharded = |dtype: &str| {
        format!(
            r#"{{"zarr_format": 3, "node_type": "array", "shape": [8], "data_type": "{dtype}",
            "chunk_grid": {{"name": "regular", "configuration": {{"chunk_shape": [4]}}}},
            "chunk_key_encoding": {{"name": "default", "configuration": {{"separator": "/"}}}},
            "fill_value": 0, "codecs": [{{"name": "bytes", "configuration": {{"endian": "little"}}}}],
            "attributes": {{}}}}"#
        )
    };
    let (_dir, v, a, x) = array_x(&unsharded("uint8"), ViewFormat::V2);
    v.unlink(x, OsStr::new(".zarray")).unwrap();
    assert!(a.join(KEPT).exists());
    // another mount: another array there, its `.zarray` unlinked in turn
    std::fs::write(a.join(KEPT), unsharded("uint16")).unwrap();
    assert_eq!(write_close(&v, x, ".zattrs", br#"{"b": 2}"#), Ok(()));
    let kept = kept_doc(&a);
    assert_eq!(kept["data_type"], "uint16", "{kept}");
    assert_eq!(kept["attributes"]["b"], 2, "{kept}");
}

/// Where the document kept there since is none this view can take (here an array whose
/// codecs it cannot present), a `.zattrs` written here is refused with `ESTALE`, and
/// that document stays as the other mount wrote it.
#[test]
fn a_zattrs_written_over_a_kept_document_this_view_cannot_take_is_estale() {
    let unsharded = r#"{"zarr_format": 3, "node_type": "array", "shape": [8],
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}}"#;
    let (_dir, v, a, x) = array_x(unsharded, ViewFormat::V2);
    v.unlink(x, OsStr::new(".zarray")).unwrap();
    let other = unsharded.replace(r#"[{"name": "bytes"}]"#, r#"[{"name": "no-such-codec"}]"#);
    std::fs::write(a.join(KEPT), &other).unwrap();
    assert_eq!(
        write_close(&v, x, ".zattrs", br#"{"b": 2}"#),
        Err(libc::ESTALE)
    );
    assert_eq!(std::fs::read_to_string(a.join(KEPT)).unwrap(), other);
}
