//! Store faults under a real `View`, without FUSE: `FaultyStore` makes one kind of store
//! call fail with an errno, over the in-memory store and over a local directory. Each
//! test checks a promise of docs/SEMANTICS.md's *Failures*. The error reaches the call
//! that needed the store, only that call fails, and once the fault is cleared the same
//! calls work: nothing wrong was cached and nothing staged was lost.

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

use common::view::writable_view;
use serde_json::json;
use shardfs::store::faulty::{Fault, FaultyStore, Op};
use shardfs::store::{LocalStore, MemoryStore, Store};
use shardfs::view::{ROOT_INO, View, ViewConfig, ViewError, ViewFormat};

/// 1-d uint8 array `a`: 64 elements, shards of 16 (store files `a/c/0`..`a/c/3`),
/// inner chunks of 4 (view keys `a/c/0`..`a/c/15`, four per shard).
fn array_doc() -> Vec<u8> {
    let doc = common::sharded_u8_array(
        64,
        16,
        4,
        json!([{"name": "bytes"}]),
        common::index_codecs_crc32c(),
        "end",
    );
    serde_json::to_vec(&doc).unwrap()
}

fn group_doc(version: u32) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "zarr_format": 3, "node_type": "group", "attributes": {"version": version}
    }))
    .unwrap()
}

/// The stores every test runs on, each holding array `a`, group `g` (`version: 1`) and
/// a plain directory `d` with one file. The temporary directory lives as long as the
/// local store.
fn stores() -> Vec<(Option<tempfile::TempDir>, Arc<dyn Store>)> {
    let memory = MemoryStore::new();
    memory.put("a/zarr.json", array_doc());
    memory.put("g/zarr.json", group_doc(1));
    memory.put("d/notes.txt", b"notes".to_vec());
    let dir = tempfile::tempdir().unwrap();
    for (rel, bytes) in [
        ("a/zarr.json", array_doc()),
        ("g/zarr.json", group_doc(1)),
        ("d/notes.txt", b"notes".to_vec()),
    ] {
        let path = dir.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    let local = LocalStore::open(dir.path()).unwrap();
    vec![(None, Arc::new(memory)), (Some(dir), Arc::new(local))]
}

fn lookup(view: &View, path: &str) -> Result<u64, ViewError> {
    let mut ino = ROOT_INO;
    for part in path.split('/') {
        ino = view.lookup(ino, OsStr::new(part))?.ino;
    }
    Ok(ino)
}

fn read(view: &View, path: &str) -> Result<Vec<u8>, ViewError> {
    let opened = view.open(lookup(view, path)?, false, false)?;
    let data = view.read(opened.fh, 0, 1 << 20);
    view.release(opened.fh)?;
    data
}

/// Write a whole file as `open(O_CREAT|O_TRUNC)`, `write`, `close` do, making missing
/// directories: the error of the first step that fails.
fn write(view: &View, path: &str, bytes: &[u8]) -> Result<u64, ViewError> {
    let (dir, name) = path.rsplit_once('/').unwrap();
    let mut parent = ROOT_INO;
    for part in dir.split('/') {
        parent = match view.lookup(parent, OsStr::new(part)) {
            Ok(a) => a.ino,
            Err(_) => view.mkdir(parent, OsStr::new(part))?.ino,
        };
    }
    let (attr, opened) = view.create(parent, OsStr::new(name), false, true)?;
    let written = view.write(opened.fh, 0, bytes);
    let flushed = view.flush_handle(opened.fh);
    view.release(opened.fh)?;
    written?;
    flushed?;
    Ok(attr.ino)
}

/// Chunks 1 and 2 (shard `a/c/0`) and 5 (shard `a/c/1`) stored through a view without
/// faults.
fn store_three_chunks(store: &Arc<dyn Store>) {
    let view = writable_view(store.clone(), ViewFormat::V3);
    for c in [1, 2, 5] {
        write(&view, &format!("a/c/{c}"), &[c as u8; 4]).unwrap();
    }
    view.sync_all().unwrap();
}

#[test]
fn a_failed_shard_commit_keeps_the_chunk_staged_and_readable_and_a_later_fsync_stores_it() {
    for errno in [libc::ENOSPC, libc::EIO] {
        for (_dir, inner) in stores() {
            let what = inner.describe();
            let store = Arc::new(FaultyStore::new(inner.clone()));
            let view = writable_view(store.clone(), ViewFormat::V3);
            let fault = store.inject(Fault::new(Op::Commit, errno).under("a/c/0"));
            let c1 = write(&view, "a/c/1", b"new1").unwrap();
            write(&view, "a/c/5", b"new5").unwrap();
            let err = view.fsync(c1).unwrap_err();
            assert_eq!(err.errno(), errno, "{what}: {err}");
            assert!(store.fired(fault) >= 1, "{what}");
            // Its own shard is unchanged; the other shard of the array is stored.
            assert_eq!(inner.stat(Path::new("a/c/0")).unwrap(), None, "{what}");
            let fresh = writable_view(inner.clone(), ViewFormat::V3);
            assert_eq!(read(&fresh, "a/c/5").unwrap(), b"new5", "{what}");
            // Still staged, and read back from the mount.
            assert_eq!(read(&view, "a/c/1").unwrap(), b"new1", "{what}");
            // Every retry fails alike while the store does; then one stores it.
            assert_eq!(view.fsync(c1).unwrap_err().errno(), errno, "{what}");
            store.clear();
            view.fsync(c1).unwrap();
            let fresh = writable_view(inner.clone(), ViewFormat::V3);
            assert_eq!(read(&fresh, "a/c/1").unwrap(), b"new1", "{what}");
        }
    }
}

#[test]
fn a_failing_shard_read_fails_only_that_shards_chunks() {
    for (_dir, inner) in stores() {
        let what = inner.describe();
        store_three_chunks(&inner);
        // Cold: the shard's index cannot be read. Warm: its index was read before, and
        // now its chunk data cannot be; once the store reads again, so does the chunk.
        for warm in [false, true] {
            let store = Arc::new(FaultyStore::new(inner.clone()));
            let view = View::new(store.clone(), ViewConfig::default()).unwrap();
            if warm {
                assert_eq!(read(&view, "a/c/2").unwrap(), [2; 4], "{what}");
            }
            let fault = store.inject(Fault::new(Op::Read, libc::EIO).under("a/c/0"));
            let err = read(&view, "a/c/1").unwrap_err();
            assert_eq!(err.errno(), libc::EIO, "{what}, warm {warm}: {err}");
            assert!(store.fired(fault) >= 1, "{what}, warm {warm}");
            // Another shard of the same array reads, and so do plain files.
            assert_eq!(read(&view, "a/c/5").unwrap(), [5; 4], "{what}, warm {warm}");
            assert_eq!(read(&view, "d/notes.txt").unwrap(), b"notes", "{what}");
            if warm {
                store.clear();
                assert_eq!(read(&view, "a/c/1").unwrap(), [1; 4], "{what}");
            }
        }
    }
}

/// The cold case of the test above, once the store reads again. The failed load was
/// cached like a corrupt index, with the shard file's version, so revalidation kept it
/// until the file changed (and a read-only view, which does not revalidate, for good).
/// Now it is used again only for `FAILED_READ_KEPT` (so that readers waiting for that
/// load get its failure, not a timeout each in turn).
#[test]
fn a_shard_whose_index_read_failed_reads_again_once_the_store_does() {
    for (_dir, inner) in stores() {
        let what = inner.describe();
        store_three_chunks(&inner);
        let store = Arc::new(FaultyStore::new(inner.clone()));
        let view = View::new(store.clone(), ViewConfig::default()).unwrap();
        let fault = store.inject(Fault::new(Op::Read, libc::EIO).under("a/c/0"));
        assert_eq!(
            read(&view, "a/c/1").unwrap_err().errno(),
            libc::EIO,
            "{what}"
        );
        assert!(store.fired(fault) >= 1, "{what}");
        store.clear();
        let fresh = View::new(store.clone(), ViewConfig::default()).unwrap();
        assert_eq!(
            read(&fresh, "a/c/1").unwrap(),
            [1; 4],
            "{what}: a fresh view"
        );
        std::thread::sleep(shardfs::store::shard::FAILED_READ_KEPT);
        let again = read(&view, "a/c/1").map_err(|e| e.to_string());
        assert_eq!(again, Ok(vec![1; 4]), "{what}: the view that met the fault");
    }
}

#[test]
fn a_failing_listing_is_an_error_and_the_next_listing_is_whole() {
    for (_dir, inner) in stores() {
        let what = inner.describe();
        store_three_chunks(&inner);
        let store = Arc::new(FaultyStore::new(inner.clone()));
        let view = View::new(store.clone(), ViewConfig::default()).unwrap();
        let names = |path: &str| -> Result<Vec<String>, ViewError> {
            let mut names: Vec<String> = view
                .readdir(lookup(&view, path)?)?
                .iter()
                .map(|e| e.name.to_string_lossy().into_owned())
                .filter(|n| n != "." && n != "..")
                .collect();
            names.sort();
            Ok(names)
        };
        for (dir, want) in [("d", vec!["notes.txt"]), ("a/c", vec!["1", "2", "5"])] {
            // Looked up first, so that only the listing meets the fault.
            lookup(&view, dir).unwrap();
            let fault = store.inject(Fault::new(Op::List, libc::EIO).under(dir));
            let got = names(dir);
            assert!(store.fired(fault) >= 1, "{what}: {dir}: the listing asked");
            assert_eq!(
                got.map_err(|e| e.errno()),
                Err(libc::EIO),
                "{what}: {dir}: a listing that failed is no (empty) listing"
            );
            store.clear();
            assert_eq!(names(dir).unwrap(), want, "{what}: {dir}");
        }
    }
}

#[test]
fn a_failed_metadata_store_is_the_writes_error_and_the_store_keeps_the_old_document() {
    // The in-memory store cannot write files other than shards.
    for (_dir, inner) in stores().into_iter().filter(|(d, _)| d.is_some()) {
        let store = Arc::new(FaultyStore::new(inner.clone()));
        let view = writable_view(store.clone(), ViewFormat::V3);
        let fault = store.inject(Fault::new(Op::WriteAtomically, libc::ENOSPC).under("g"));
        let err = write(&view, "g/zarr.json", &group_doc(2)).unwrap_err();
        assert_eq!(err.errno(), libc::ENOSPC, "{err}");
        assert!(store.fired(fault) >= 1);
        let stored = inner.read_all(Path::new("g/zarr.json")).unwrap();
        assert_eq!(
            stored,
            Some(group_doc(1)),
            "the store keeps the old document"
        );
        assert_eq!(
            read(&view, "g/zarr.json").unwrap(),
            group_doc(1),
            "and shows it"
        );
        store.clear();
        write(&view, "g/zarr.json", &group_doc(3)).unwrap();
        let stored = inner.read_all(Path::new("g/zarr.json")).unwrap();
        assert_eq!(stored, Some(group_doc(3)));
    }
}

/// The wrapper itself: which calls a rule fails, and what it counts.
#[test]
fn a_rule_fails_the_calls_it_names_and_counts_them() {
    let memory = MemoryStore::new();
    memory.put("g/zarr.json", group_doc(1));
    memory.put("a/zarr.json", array_doc());
    let store = FaultyStore::new(Arc::new(memory));
    let stat = |rel: &str| store.stat(Path::new(rel)).map_err(|e| e.raw_os_error());
    let second_on = store.inject(
        Fault::new(Op::Stat, libc::EIO)
            .containing("zarr")
            .from_nth(1),
    );
    let only_third = store.inject(Fault::new(Op::Stat, libc::EACCES).under("g").nth(2));
    assert!(stat("g/zarr.json").unwrap().is_some()); // second_on: 0, only_third: 0
    assert_eq!(stat("a/zarr.json"), Err(Some(libc::EIO))); // second_on: 1
    assert!(stat("g").unwrap().is_some()); // no "zarr": only_third: 1
    // Both are due: both count the call as failed, with the first-injected one's errno.
    assert_eq!(stat("g/zarr.json"), Err(Some(libc::EIO)));
    assert!(stat("g").unwrap().is_some()); // only_third's turn is over
    assert_eq!((store.seen(second_on), store.fired(second_on)), (3, 2));
    assert_eq!((store.seen(only_third), store.fired(only_third)), (4, 1));
    // Other operations pass; so does everything once the rules are removed.
    assert!(store.list(Path::new("g")).is_ok());
    store.remove(second_on);
    assert!(stat("a/zarr.json").unwrap().is_some());
    store.clear();
    assert!(stat("g/zarr.json").unwrap().is_some());
    assert_eq!(store.seen(second_on), 3, "counters stay readable");
    // Files opened through the wrapper obey rules injected later.
    let file = store.open(Path::new("g/zarr.json")).unwrap().unwrap();
    let mut buf = [0; 4];
    assert_eq!(file.read_at(&mut buf, 0).unwrap(), 4);
    store.inject(Fault::new(Op::Read, libc::EIO).under("g/zarr.json"));
    let err = file.read_at(&mut buf, 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
}
