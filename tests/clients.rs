//! What clients do to the tree (issue 20): the file-system behaviour that zarr-python's
//! and zarr 2's own test suites, pytest and shell tools rely on, beyond reading and
//! writing chunks.

mod common;
#[path = "clients/posix.rs"]
mod posix;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::mount::mount_rw;
use shardfs::{Mount, MountOptions};

/// A new 3-D uint8 array `name` made through the mount (as a legacy tool makes one: an
/// unsharded `zarr.json`, then chunk files), shape 4×4×4 in 2×2×2 chunks, every chunk
/// written with its own fill.
fn make_3d_array(mnt: &Path, name: &str) {
    let dir = mnt.join(name);
    fs::create_dir(&dir).unwrap();
    let meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [4, 4, 4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2, 2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
    });
    fs::write(dir.join("zarr.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
    for i in 0..2u8 {
        for j in 0..2u8 {
            fs::create_dir_all(dir.join(format!("c/{i}/{j}"))).unwrap();
            for k in 0..2u8 {
                fs::write(
                    dir.join(format!("c/{i}/{j}/{k}")),
                    [1 + i * 4 + j * 2 + k; 8],
                )
                .unwrap();
            }
        }
    }
}

fn shard_files(store: &Path, array: &str) -> Vec<String> {
    let dir = store.join(array);
    if !dir.exists() {
        return Vec::new();
    }
    common::files_under(&dir)
        .into_iter()
        .filter(|f| f != "zarr.json")
        .collect()
}

#[test]
fn rm_rf_removes_an_array_of_any_rank() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    {
        let (mnt, _m) = mount_rw(store.path());
        make_3d_array(mnt.path(), "a3");
        File::open(mnt.path()).unwrap().sync_all().unwrap();
        assert!(!shard_files(store.path(), "a3").is_empty(), "chunks stored");
        // Emptying the last-level directories one by one leaves the parents in place
        // (as on any file system) until they are removed themselves.
        let c0 = mnt.path().join("a3/c/0");
        for j in 0..2 {
            for k in 0..2 {
                fs::remove_file(c0.join(format!("{j}/{k}"))).unwrap();
            }
        }
        let mut left: Vec<_> = fs::read_dir(&c0)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["0", "1"],
            "emptied key directories stay until removed"
        );
        fs::remove_dir(c0.join("0")).unwrap();
        fs::remove_dir(c0.join("1")).unwrap();
        assert_eq!(fs::read_dir(&c0).unwrap().count(), 0);
        // `rm -rf` of the whole array, as shutil.rmtree and zarr's `rmdir` do it.
        let st = std::process::Command::new("rm")
            .arg("-rf")
            .arg(mnt.path().join("a3"))
            .status()
            .unwrap();
        assert!(st.success(), "rm -rf of a 3-D array");
        assert!(!mnt.path().join("a3").exists());
    }
    assert_eq!(shard_files(store.path(), "a3"), Vec::<String>::new());
    assert!(
        !store.path().join("a3").exists(),
        "nothing left in the store"
    );
}

/// Key directories made before the array's metadata (`mkdir -p a/c/0` and then
/// `zarr.json`, as `rsync` and scripts may order it) become key directories of the new
/// array: listed, written into, and removed by `rm -rf` with nothing left in the store,
/// in 1-D (where such a directory stands at a chunk key, the shard's path) and 2-D. One
/// with files in it at a chunk key makes the metadata refused.
#[test]
fn key_directories_made_before_the_metadata_join_the_new_array() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let meta = |shape: &[u64], chunks: &[u64]| {
        serde_json::to_vec(&serde_json::json!({
            "zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
        }))
        .unwrap()
    };
    {
        let (mnt, _m) = mount_rw(store.path());
        let m = mnt.path();
        fs::create_dir_all(m.join("a2/c/0")).unwrap();
        fs::create_dir_all(m.join("a2/c/3")).unwrap();
        fs::write(m.join("a2/zarr.json"), meta(&[8, 8], &[2, 2])).unwrap();
        fs::create_dir_all(m.join("a1/c/0")).unwrap();
        fs::create_dir_all(m.join("a1/c/1")).unwrap();
        fs::write(m.join("a1/zarr.json"), meta(&[8], &[2])).unwrap();
        let names = |p: &Path| {
            let mut v: Vec<String> = fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&m.join("a2")), ["c", "zarr.json"]);
        assert_eq!(names(&m.join("a2/c")), ["0", "3"]);
        // In 1-D, `c/0` is a chunk key: the directory made there is gone, the key is free.
        for (key, fill) in [
            ("a2/c/0/1", 5u8),
            ("a2/c/3/3", 6),
            ("a1/c/0", 7),
            ("a1/c/3", 8),
        ] {
            let tmp = m.join(format!("{key}.partial"));
            fs::create_dir_all(tmp.parent().unwrap()).unwrap();
            fs::write(&tmp, vec![fill; if key.starts_with("a2") { 4 } else { 2 }]).unwrap();
            fs::rename(&tmp, m.join(key)).unwrap();
        }
        File::open(m).unwrap().sync_all().unwrap();
        assert_eq!(fs::read(m.join("a1/c/0")).unwrap(), [7, 7]);
        assert_eq!(fs::read(m.join("a2/c/3/3")).unwrap(), [6; 4]);
        for a in ["a1", "a2"] {
            let st = std::process::Command::new("rm")
                .arg("-rf")
                .arg(m.join(a))
                .status()
                .unwrap();
            assert!(st.success(), "rm -rf {a}");
            assert!(!m.join(a).exists(), "{a}");
        }
    }
    for a in ["a1", "a2"] {
        assert!(
            !store.path().join(a).exists(),
            "{a}: nothing left in the store"
        );
    }
    // A directory with a file in it where a chunk's file (and a shard) would go: the
    // metadata is refused (EINVAL) and leaves nothing behind; the directory stays.
    let (mnt, _m) = mount_rw(store.path());
    let m = mnt.path();
    fs::create_dir_all(m.join("j/c/0")).unwrap();
    fs::write(m.join("j/c/0/junk.txt"), b"hi").unwrap();
    let mut f = File::create(m.join("j/zarr.json")).unwrap();
    let err = f.write_all(&meta(&[8], &[2])).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    drop(f);
    assert_eq!(fs::read(m.join("j/c/0/junk.txt")).unwrap(), b"hi");
    assert!(!store.path().join("j/zarr.json").exists());
    fs::remove_dir_all(m.join("j")).unwrap();
    assert!(!store.path().join("j").exists());
}

#[test]
fn an_empty_key_directory_is_not_listed_after_a_remount() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    {
        let (mnt, _m) = mount_rw(store.path());
        make_3d_array(mnt.path(), "a3");
        for j in 0..2 {
            for k in 0..2 {
                fs::remove_file(mnt.path().join(format!("a3/c/1/{j}/{k}"))).unwrap();
            }
        }
    }
    let (mnt, _m) = mount_rw(store.path());
    let names: Vec<_> = fs::read_dir(mnt.path().join("a3/c"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["0"], "c/1 holds no chunk: it is not shown");
    assert!(!mnt.path().join("a3/c/1").exists());
    assert!(!mnt.path().join("a3/c/1/0").exists());
    assert_eq!(fs::read(mnt.path().join("a3/c/0/1/1")).unwrap(), [4u8; 8]);
}

#[test]
fn a_shrink_then_removing_the_chunks_outside_succeeds() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let (mnt, _m) = mount_rw(store.path());
    make_3d_array(mnt.path(), "a3");
    let a = mnt.path().join("a3");
    let outside: Vec<_> = (0..2)
        .flat_map(|j| (0..2).map(move |k| format!("c/1/{j}/{k}")))
        .collect();
    for o in &outside {
        assert!(a.join(o).is_file(), "{o} before the shrink");
    }
    // zarr 2's and zarr-python 3's resize: the smaller metadata first, then delete each
    // chunk outside the new shape if it is (still) there. The mount deleted them with
    // the metadata change; a name the kernel still had cached must not fail the delete.
    let meta = fs::read(a.join("zarr.json")).unwrap();
    let mut shrunk: serde_json::Value = serde_json::from_slice(&meta).unwrap();
    shrunk["shape"] = serde_json::json!([2, 4, 4]);
    fs::write(a.join("zarr.json"), serde_json::to_vec(&shrunk).unwrap()).unwrap();
    for o in &outside {
        if a.join(o).is_file() {
            fs::remove_file(a.join(o)).unwrap_or_else(|e| panic!("remove {o}: {e}"));
        }
    }
    fs::write(a.join("zarr.json"), meta).unwrap();
    for o in &outside {
        assert!(!a.join(o).exists(), "{o}: not back after the grow");
    }
    assert_eq!(fs::read(a.join("c/0/1/1")).unwrap(), [4u8; 8]);
}

/// The chunk coordinates of the arrays `make_3d_array` makes (2 × 2 × 2 chunks).
/// The 2x2x2-chunk array `name` is stored as shards: no chunk file of it is left.
fn assert_stored_sharded(store: &Path, name: &str) {
    assert!(
        !shard_files(store, name).is_empty(),
        "{name}: stored sharded"
    );
    assert!(
        !store.join(name).join("c/1/1/1").exists(),
        "{name}: no chunk file left in the store"
    );
}

fn chunks_2x2x2() -> impl Iterator<Item = (u8, u8, u8)> {
    (0..2u8).flat_map(|i| (0..2u8).flat_map(move |j| (0..2u8).map(move |k| (i, j, k))))
}

/// A writable mount with `kernel_opens` (the kernel opens files itself; the daemon hears
/// of a close only at the release of a file it created): an array made file by file, as
/// a legacy tool makes one (an unsharded `zarr.json` written in place, then key
/// directories and chunk files), is adopted at the write of its `zarr.json`, reads back
/// at once, and is stored sharded; metadata rewritten in place reads back whole.
#[test]
fn an_array_made_file_by_file_through_the_mount_is_stored_sharded() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let want = |i: u8, j: u8, k: u8| [1 + i * 4 + j * 2 + k; 8];
    {
        let mnt = tempfile::tempdir().unwrap();
        let opts = MountOptions::default();
        let m = Mount::new(store.path(), mnt.path(), &opts).unwrap();
        make_3d_array(mnt.path(), "a3");
        for (i, j, k) in chunks_2x2x2() {
            let p = mnt.path().join(format!("a3/c/{i}/{j}/{k}"));
            assert_eq!(fs::read(&p).unwrap(), want(i, j, k), "{}", p.display());
        }
        // (The reads above made the kernel open files itself: from now on no close is
        // heard of.) In `cp -r` order: the chunk files first (plain files, as the
        // directory is no array yet), then `zarr.json`, whose write adopts them.
        let b3 = mnt.path().join("b3");
        for (i, j, k) in chunks_2x2x2() {
            fs::create_dir_all(b3.join(format!("c/{i}/{j}"))).unwrap();
            fs::write(b3.join(format!("c/{i}/{j}/{k}")), want(i, j, k)).unwrap();
        }
        // Compact, as zarr-python writes it (the view shows its documents indented).
        let doc: serde_json::Value =
            serde_json::from_slice(&fs::read(mnt.path().join("a3/zarr.json")).unwrap()).unwrap();
        let b3_doc = serde_json::to_vec(&doc).unwrap();
        fs::write(b3.join("zarr.json"), &b3_doc).unwrap();
        // The new array's metadata reads back as its writer wrote it.
        assert_eq!(
            String::from_utf8(fs::read(b3.join("zarr.json")).unwrap()).unwrap(),
            String::from_utf8(b3_doc).unwrap(),
            "b3/zarr.json as written"
        );
        // Rewritten in place after the adoption: the write reaches the chunk, not the
        // plain file the adoption took in (whose handle the daemon held until then).
        fs::write(b3.join("c/0/0/0"), [99u8; 8]).unwrap();
        // The array's metadata rewritten in place, again and again (attributes of
        // several lengths): every read right after a write is the document written,
        // byte for byte. (Before, the view showed its own indented rendering at once:
        // the kernel kept the writer's length until the invalidation after the write
        // reached it, and one loaded run in 14 read a cut rendering.)
        let meta = mnt.path().join("a3/zarr.json");
        for n in 0..20 {
            let mut doc: serde_json::Value =
                serde_json::from_slice(&fs::read(&meta).unwrap()).unwrap();
            doc["attributes"] = serde_json::json!({ "note": "x".repeat(n % 7), "n": n });
            let written = serde_json::to_vec(&doc).unwrap();
            fs::write(&meta, &written).unwrap();
            let shown = fs::read(&meta).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&shown),
                String::from_utf8_lossy(&written),
                "write {n}: read back as written"
            );
        }
        // A slow writer: truncated at open, written after the idle commit has run.
        let mut doc: serde_json::Value = serde_json::from_slice(&fs::read(&meta).unwrap()).unwrap();
        doc["attributes"] = serde_json::json!({ "n": 100 });
        let mut f = File::create(&meta).unwrap();
        std::thread::sleep(shardfs::view::KERNEL_WRITE_IDLE * 3);
        f.write_all(&serde_json::to_vec(&doc).unwrap()).unwrap();
        drop(f);
        let shown: serde_json::Value = serde_json::from_slice(&fs::read(&meta).unwrap()).unwrap();
        assert_eq!(shown["attributes"]["n"], 100, "a slow writer's document");
        m.unmount().unwrap();
    }
    assert_stored_sharded(store.path(), "a3");
    let (mnt, _m) = mount_rw(store.path());
    for (i, j, k) in chunks_2x2x2() {
        let p = mnt.path().join(format!("a3/c/{i}/{j}/{k}"));
        assert_eq!(
            fs::read(&p).unwrap(),
            want(i, j, k),
            "after a remount: {}",
            p.display()
        );
    }
    let doc: serde_json::Value =
        serde_json::from_slice(&fs::read(mnt.path().join("a3/zarr.json")).unwrap()).unwrap();
    assert_eq!(doc["attributes"]["n"], 100);
    assert_stored_sharded(store.path(), "b3");
    for (i, j, k) in chunks_2x2x2() {
        let p = mnt.path().join(format!("b3/c/{i}/{j}/{k}"));
        assert_eq!(
            fs::read(&p).unwrap(),
            if (i, j, k) == (0, 0, 0) {
                [99; 8]
            } else {
                want(i, j, k)
            },
            "after a remount: {}",
            p.display()
        );
    }
}

/// zarr 2's `resize` writes the smaller `.zarray` by rename, then checks each chunk
/// outside the new shape with `os.path.isfile` and removes it. The shrink deleted those
/// chunks with the rename; the kernel may still cache their attributes (here for 60 s),
/// and their entries can only be dropped after the rename's reply (the kernel holds the
/// directory's lock). So the rename returns only once their attributes are dropped: a
/// `stat` right after it asks the daemon, and finds nothing (before: `isfile` true, then
/// `os.remove` `ENOENT`, one run in two of zarr 2's `test_resize_2d` through a mount).
#[test]
fn chunks_a_renamed_shrink_deleted_are_gone_when_the_rename_returns() {
    if !common::can_mount() {
        return;
    }
    let keys = || (0..16u8).flat_map(|i| (0..16u8).map(move |j| (i, j)));
    for round in 0..5 {
        let store = tempfile::tempdir().unwrap();
        let mnt = tempfile::tempdir().unwrap();
        let opts = MountOptions {
            ttl: Some(std::time::Duration::from_secs(60)),
            ..MountOptions::default()
        };
        let _m = Mount::new(store.path(), mnt.path(), &opts).unwrap();
        // 256 chunk keys beside `zarr.json` (v2 key encoding), as in zarr 2's arrays.
        let dir = mnt.path().join("a");
        fs::create_dir(&dir).unwrap();
        let mut meta = serde_json::json!({
            "zarr_format": 3, "node_type": "array", "shape": [32, 32], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
            "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}},
            "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
        });
        fs::write(dir.join("zarr.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
        for (i, j) in keys() {
            fs::write(dir.join(format!("{i}.{j}")), [1 + i; 4]).unwrap();
        }
        File::open(&dir).unwrap().sync_all().unwrap();
        for (i, j) in keys() {
            assert!(dir.join(format!("{i}.{j}")).is_file());
        }
        meta["shape"] = serde_json::json!([2, 32]);
        fs::write(
            dir.join("zarr.json.tmp"),
            serde_json::to_vec(&meta).unwrap(),
        )
        .unwrap();
        fs::rename(dir.join("zarr.json.tmp"), dir.join("zarr.json")).unwrap();
        // From the last chunk back: the kernel is told of the entries after the reply.
        let mut stale = Vec::new();
        for (i, j) in keys().collect::<Vec<_>>().into_iter().rev() {
            let p = dir.join(format!("{i}.{j}"));
            if p.is_file() != (i == 0) {
                stale.push(format!("{i}.{j}"));
            }
        }
        assert!(stale.is_empty(), "round {round}: {stale:?}");
    }
}
