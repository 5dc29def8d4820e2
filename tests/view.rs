//! The filesystem core without FUSE: a `View` over fixture stores, driven the way the
//! kernel drives it (lookup by lookup, open/read/release, opendir/readdir).

mod common;
#[path = "view/metadata.rs"]
mod metadata;
#[path = "view/writes.rs"]
mod writes;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

use common::view::{writable_view, writable_view_of};
use shardfs::store::{LocalStore, Store};
use shardfs::view::{Attr, Kind, ROOT_INO, View, ViewConfig, ViewError, ViewFormat};

fn view_of(dir: &Path) -> View {
    let store: Arc<dyn Store> = Arc::new(LocalStore::open(dir).unwrap());
    View::new(store, ViewConfig::default()).unwrap()
}

fn lookup(view: &View, path: &str) -> Result<Attr, ViewError> {
    let mut ino = ROOT_INO;
    let mut attr = view.getattr(ROOT_INO)?;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        attr = view.lookup(ino, OsStr::new(part))?;
        ino = attr.ino;
    }
    Ok(attr)
}

fn read(view: &View, path: &str) -> Result<Vec<u8>, ViewError> {
    let attr = lookup(view, path)?;
    let opened = view.open(attr.ino, false, false)?;
    assert!(
        opened.no_flush,
        "{path}: a read-only open needs no flush at close"
    );
    let mut out = Vec::new();
    loop {
        let chunk = view.read(opened.fh, out.len() as u64, 7)?; // odd size: many reads
        if chunk.is_empty() {
            break;
        }
        out.extend(chunk);
    }
    view.release(opened.fh)?;
    assert_eq!(
        out.len() as u64,
        attr.size,
        "{path}: size in getattr equals bytes read"
    );
    Ok(out)
}

/// Every file of the view, walked with opendir/readdir.
fn files(view: &View, ino: u64, prefix: &str, out: &mut BTreeSet<String>) {
    let fh = view.opendir(ino).unwrap();
    let entries = view.dir_entries(fh).unwrap();
    view.releasedir(fh);
    for e in entries.iter().filter(|e| e.name != "." && e.name != "..") {
        let name = e.name.to_str().unwrap();
        let rel = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        };
        let attr = match view.lookup(ino, &e.name) {
            Ok(a) => a,
            // Chunks of a corrupt shard are listed, and fail when used.
            Err(err) if err.errno() == libc::EIO && e.kind == Kind::File => {
                out.insert(rel);
                continue;
            }
            Err(err) => panic!("{rel}: {err}"),
        };
        assert_eq!(
            attr.kind, e.kind,
            "{rel}: readdir and lookup agree on the kind"
        );
        match e.kind {
            Kind::Dir => files(view, attr.ino, &rel, out),
            _ => {
                out.insert(rel);
            }
        }
    }
}

#[test]
fn every_fixture_view_equals_its_unsharded_twin() {
    for store in common::stores_with_twins() {
        let dir = common::fixtures().join(&store);
        let twin = common::fixtures().join(format!("{store}.twin"));
        let view = view_of(&dir);
        let mut listed = BTreeSet::new();
        files(&view, ROOT_INO, "", &mut listed);
        assert_eq!(
            listed,
            common::files_under(&twin),
            "{store}: the view lists exactly the twin's files"
        );
        for rel in &listed {
            let got = read(&view, rel).unwrap_or_else(|e| panic!("{store}/{rel}: {e}"));
            let want = std::fs::read(twin.join(rel)).unwrap();
            if rel.ends_with("zarr.json") {
                let (g, w): (serde_json::Value, serde_json::Value) = (
                    serde_json::from_slice(&got).unwrap(),
                    serde_json::from_slice(&want).unwrap(),
                );
                assert_eq!(g, w, "{store}/{rel}");
            } else {
                assert_eq!(got, want, "{store}/{rel}");
            }
        }
    }
}

#[test]
fn chunk_keys_equal_the_manifest() {
    for entry in common::manifest() {
        if entry["sharded"] != true || entry["store"] == "corrupt" {
            continue;
        }
        let view = view_of(&common::fixtures().join(entry["store"].as_str().unwrap()));
        let array = entry["array"].as_str().unwrap();
        for key in entry["chunk_keys"].as_array().unwrap() {
            let path = format!("{array}/{}", key.as_str().unwrap());
            let attr = lookup(&view, &path).unwrap_or_else(|e| panic!("{path}: {e}"));
            assert_eq!(attr.kind, Kind::File);
        }
    }
}

#[test]
fn corrupt_shards_fail_alone() {
    let entry = common::manifest()
        .into_iter()
        .find(|e| e["store"] == "corrupt")
        .unwrap();
    let view = view_of(&common::fixtures().join("corrupt"));
    let array = entry["array"].as_str().unwrap();
    let ok: BTreeSet<&str> = entry["ok_chunk_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    let mut failed = 0;
    for key in entry["chunk_keys"].as_array().unwrap() {
        let key = key.as_str().unwrap();
        let res = read(&view, &format!("{array}/{key}"));
        if ok.contains(key) {
            assert!(res.is_ok(), "{key}: {:?}", res.err());
        } else if let Err(e) = res {
            assert_eq!(e.errno(), libc::EIO, "{key}: {e}");
            failed += 1;
        }
    }
    assert!(failed >= 8, "only {failed} chunks failed");
    // The metadata and the listing still work.
    read(&view, &format!("{array}/zarr.json")).unwrap();
    let mut listed = BTreeSet::new();
    files(&view, ROOT_INO, "", &mut listed);
    for key in ok {
        assert!(listed.contains(&format!("{array}/{key}")));
    }
}

#[test]
fn probes_and_invalid_keys_are_not_found() {
    let view = view_of(&common::fixtures().join("zarr_basic"));
    for path in [
        "u16_default_sparse/.zarray",
        "u16_default_sparse/.zattrs",
        ".zgroup",
        "u16_default_sparse/c/01/0",  // not canonical
        "u16_default_sparse/c/0/99",  // outside the grid
        "u16_default_sparse/c/999",   // outside the grid
        "u16_default_sparse/c/0/0/0", // too deep
        "u16_default_sparse/c/-1/0",
    ] {
        let err = lookup(&view, path).expect_err(path);
        assert!(
            matches!(err.errno(), libc::ENOENT | libc::ENOTDIR),
            "{path}: {err}"
        );
    }
    // Shards themselves are not visible: c/0/0 is the inner chunk (0, 0), not the shard.
    let attr = lookup(&view, "u16_default_sparse/c/0/0").unwrap();
    assert!(
        attr.size < 100,
        "inner chunk, not a shard: {} bytes",
        attr.size
    );
}

fn write_store(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (rel, bytes) in files {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    dir
}

#[test]
fn unpresentable_and_malformed_metadata_pass_through() {
    let after = br#"{"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
        "fill_value": 0, "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [2],
        "codecs": [{"name": "bytes"}], "index_codecs": [{"name": "bytes"}]}}, {"name": "gzip"}]}"#;
    let dir = write_store(&[
        ("zarr.json", br#"{"zarr_format": 3, "node_type": "group"}"#),
        ("after/zarr.json", after),
        ("after/c/0", b"shard bytes"),
        ("broken/zarr.json", b"{ not json"),
        ("broken/c/0", b"xyz"),
    ]);
    let view = view_of(dir.path());
    assert_eq!(read(&view, "after/zarr.json").unwrap(), after);
    assert_eq!(read(&view, "after/c/0").unwrap(), b"shard bytes");
    assert_eq!(read(&view, "broken/zarr.json").unwrap(), b"{ not json");
    assert_eq!(read(&view, "broken/c/0").unwrap(), b"xyz");
}

#[test]
fn sample_store_reads_back_through_the_core() {
    let dir = tempfile::tempdir().unwrap();
    let sample = shardfs::sample::write_sample_store(dir.path()).unwrap();
    let view = view_of(dir.path());
    for (rel, bytes) in &sample.chunks {
        assert_eq!(&read(&view, rel).unwrap(), bytes, "{rel}");
    }
    let mut listed = BTreeSet::new();
    files(&view, ROOT_INO, "", &mut listed);
    let chunks: BTreeSet<String> = listed
        .into_iter()
        .filter(|p| !p.ends_with("zarr.json") && !p.starts_with("plain"))
        .collect();
    assert_eq!(chunks, sample.chunks.keys().cloned().collect());
}

#[test]
fn forgotten_inodes_are_released() {
    let view = view_of(&common::fixtures().join("zarr_basic"));
    let before = view.live_inodes();
    let attr = lookup(&view, "u16_default_sparse/c/0/0").unwrap();
    assert_eq!(view.live_inodes(), before + 4);
    view.forget(attr.ino, 1);
    assert_eq!(view.live_inodes(), before + 3);
    assert!(matches!(
        view.getattr(attr.ino),
        Err(ViewError::StaleInode(_))
    ));
}

#[test]
fn writes_are_refused_read_only() {
    let view = view_of(&common::fixtures().join("zarr_basic"));
    let attr = lookup(&view, "u16_default_sparse/zarr.json").unwrap();
    assert_eq!(
        view.open(attr.ino, true, false).unwrap_err().errno(),
        libc::EROFS
    );
}

/// Write a whole file through `view` as the kernel does for `open(O_CREAT|O_TRUNC)`,
/// `write`, `close`: `parent` is the directory's inode.
fn write_file(view: &View, parent: u64, name: &str, bytes: &[u8]) -> u64 {
    let (attr, opened) = view.create(parent, OsStr::new(name), false, true).unwrap();
    assert_eq!(
        view.write(opened.fh, 0, bytes).unwrap() as usize,
        bytes.len()
    );
    view.flush_handle(opened.fh).unwrap();
    view.release(opened.fh).unwrap();
    attr.ino
}

/// Every file below `root`, as paths relative to it.
fn walkdir_files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                dirs.push(e.path());
            } else {
                let rel = e
                    .path()
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push(rel);
            }
        }
    }
    out
}
