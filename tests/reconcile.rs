//! The overlay reconciled with the store as the tree meets it (`src/view/reconcile.rs`),
//! through the view's API, over a local store that the tests change as another mount
//! would: listings that meet many stale directories, and what another mount kept or
//! replaced while this one holds an array's metadata unlinked. Written by a reviewer of
//! the facade (each failed before its fix).
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

use shardfs::store::{LocalStore, Store};
use shardfs::view::{ROOT_INO, View, ViewConfig, ViewFormat};

fn sharded(inner: u64) -> String {
    format!(
        r#"{{"zarr_format": 3, "node_type": "array", "shape": [8], "data_type": "uint8",
        "chunk_grid": {{"name": "regular", "configuration": {{"chunk_shape": [8]}}}},
        "chunk_key_encoding": {{"name": "default", "configuration": {{"separator": "."}}}},
        "fill_value": 0, "codecs": [{{"name": "sharding_indexed", "configuration": {{"chunk_shape": [{inner}],
        "codecs": [{{"name": "bytes"}}], "index_codecs": [{{"name": "bytes"}}]}}}}], "attributes": {{"a": 1}}}}"#
    )
}

fn view(dir: &Path, format: ViewFormat) -> View {
    use shardfs::compact::CpuCompactor;
    use shardfs::view::write_api::{WriteConfig, Writer};
    let store: Arc<dyn Store> = Arc::new(LocalStore::open(dir).unwrap());
    let writer = Writer::new(WriteConfig {
        write_buffer: 1 << 20,
        chunks_per_shard: None,
        shard_target_bytes: 64 << 20,
        compactor: Arc::new(CpuCompactor::new()),
    });
    let config = ViewConfig {
        format,
        ..ViewConfig::default()
    };
    View::with_writer(store, config, Some(writer)).unwrap()
}

fn root_group(dir: &Path) {
    std::fs::write(
        dir.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "group", "attributes": {}}"#,
    )
    .unwrap();
}

fn list_root(v: &View) -> Result<usize, i32> {
    let fh = v.opendir(ROOT_INO).map_err(|e| {
        eprintln!("opendir: {e}");
        e.errno()
    })?;
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
        std::fs::write(a.join("zarr.json.shardfs-unlinked"), sharded(2)).unwrap();
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
        let (_, o) = v.create(a, OsStr::new(".zattrs"), false, true).unwrap();
        v.write(o.fh, 0, br#"{"b": 2}"#).unwrap();
        v.flush_handle(o.fh).unwrap();
        v.release(o.fh).unwrap();
    }
    let a0 = dir.path().join("a000");
    assert!(a0.join("zarr.json.shardfs-unlinked").exists());
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
    let dir = tempfile::tempdir().unwrap();
    root_group(dir.path());
    let a = dir.path().join("x");
    std::fs::create_dir(&a).unwrap();
    std::fs::write(a.join("zarr.json"), sharded(2)).unwrap();
    let v = view(dir.path(), ViewFormat::V2);
    let x = v.lookup(ROOT_INO, OsStr::new("x")).unwrap().ino;
    v.unlink(x, OsStr::new(".zarray")).unwrap();
    assert!(a.join("zarr.json.shardfs-unlinked").exists());
    assert!(!a.join("zarr.json").exists());
    // another mount: metadata back, kept document removed
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(a.join("zarr.json"), sharded(2)).unwrap();
    std::fs::remove_file(a.join("zarr.json.shardfs-unlinked")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (_, o) = v.create(x, OsStr::new(".zattrs"), false, true).unwrap();
    v.write(o.fh, 0, br#"{"b": 2}"#).unwrap();
    let r = v.flush_handle(o.fh);
    let _ = v.release(o.fh);
    eprintln!("flush: {r:?}");
    let both = a.join("zarr.json").exists() && a.join("zarr.json.shardfs-unlinked").exists();
    eprintln!(
        "zarr.json: {:?}",
        std::fs::read_to_string(a.join("zarr.json")).ok()
    );
    eprintln!(
        "kept: {:?}",
        std::fs::read_to_string(a.join("zarr.json.shardfs-unlinked")).ok()
    );
    drop(v);
    // a later mount
    let v2 = view(dir.path(), ViewFormat::V2);
    let _ = v2.lookup(ROOT_INO, OsStr::new("x"));
    drop(v2);
    let still = a.join("zarr.json.shardfs-unlinked").exists();
    assert!(
        !both && !still,
        "kept document left beside metadata (both={both}, after a later mount's lookup={still})"
    );
}

/// A chunk staged for array x; another mount replaced x by y (another layout) and
/// unlinked y's metadata. A lookup of x here, then a flush.
#[test]
fn chunks_staged_for_an_array_another_mount_replaced_and_unlinked_are_not_stored_in_it() {
    let dir = tempfile::tempdir().unwrap();
    root_group(dir.path());
    let a = dir.path().join("x");
    std::fs::create_dir(&a).unwrap();
    std::fs::write(a.join("zarr.json"), sharded(2)).unwrap();
    let v = view(dir.path(), ViewFormat::V3);
    let x = v.lookup(ROOT_INO, OsStr::new("x")).unwrap().ino;
    let (_, o) = v.create(x, OsStr::new("c.0"), false, true).unwrap();
    v.write(o.fh, 0, &[7, 7]).unwrap();
    v.flush_handle(o.fh).unwrap();
    v.release(o.fh).unwrap();
    assert!(!a.join("c.0").exists(), "staged, not flushed yet");
    // another mount: rm -rf x; a new x of another layout; its zarr.json unlinked
    std::fs::remove_dir_all(&a).unwrap();
    std::fs::create_dir(&a).unwrap();
    std::fs::write(a.join("zarr.json.shardfs-unlinked"), sharded(4)).unwrap();
    let _ = v.lookup(ROOT_INO, OsStr::new("x"));
    let r = v.flush_all();
    eprintln!("flush_all: {r:?}");
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
    let dir = tempfile::tempdir().unwrap();
    root_group(dir.path());
    let a = dir.path().join("x");
    std::fs::create_dir(&a).unwrap();
    std::fs::write(a.join("zarr.json"), sharded(2)).unwrap();
    let v = view(dir.path(), ViewFormat::V2);
    let x = v.lookup(ROOT_INO, OsStr::new("x")).unwrap().ino;
    v.unlink(x, OsStr::new(".zarray")).unwrap();
    // another mount: the array replaced by one of another layout, its metadata unlinked
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(a.join("zarr.json.shardfs-unlinked"), sharded(4)).unwrap();
    let (_, o) = v.create(x, OsStr::new(".zattrs"), false, true).unwrap();
    v.write(o.fh, 0, br#"{"b": 2}"#).unwrap();
    let r = v.flush_handle(o.fh);
    let _ = v.release(o.fh);
    eprintln!("flush: {r:?}");
    let kept: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("zarr.json.shardfs-unlinked")).unwrap())
            .unwrap();
    let inner = &kept["codecs"][0]["configuration"]["chunk_shape"];
    assert_eq!(
        inner,
        &serde_json::json!([4]),
        "the other mount's kept array was overwritten: {kept}"
    );
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
    let dir = tempfile::tempdir().unwrap();
    root_group(dir.path());
    let a = dir.path().join("x");
    std::fs::create_dir(&a).unwrap();
    std::fs::write(a.join("zarr.json"), unsharded("uint8")).unwrap();
    let v = view(dir.path(), ViewFormat::V2);
    let x = v.lookup(ROOT_INO, OsStr::new("x")).unwrap().ino;
    v.unlink(x, OsStr::new(".zarray")).unwrap();
    assert!(a.join("zarr.json.shardfs-unlinked").exists());
    // another mount: another array there, its `.zarray` unlinked in turn
    std::fs::write(a.join("zarr.json.shardfs-unlinked"), unsharded("uint16")).unwrap();
    let x = v.lookup(ROOT_INO, OsStr::new("x")).unwrap().ino;
    let (_, o) = v.create(x, OsStr::new(".zattrs"), false, true).unwrap();
    v.write(o.fh, 0, br#"{"b": 2}"#).unwrap();
    let r = v.flush_handle(o.fh);
    let _ = v.release(o.fh);
    assert!(r.is_ok(), "{r:?}");
    let kept: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("zarr.json.shardfs-unlinked")).unwrap())
            .unwrap();
    assert_eq!(kept["data_type"], "uint16", "{kept}");
    assert_eq!(kept["attributes"]["b"], 2, "{kept}");
}
