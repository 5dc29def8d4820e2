//! Writes through the mount: the patterns real clients use, metadata writes, new arrays,
//! concurrency, and the real clients themselves (zarr-python 3, tensorstore).

#[path = "write/clients.rs"]
mod clients;
mod common;

use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::mount::{mount_rw, shardfs};
use common::store_copy;
use shardfs::{Mount, MountOptions};

fn errno_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.unwrap_err().raw_os_error().unwrap()
}

#[test]
fn plain_tool_patterns_land_in_the_shards() {
    if !common::can_mount() {
        return;
    }
    let tmp = store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let shard = store.join("u16_default_sparse/c/0/0");
    let before = fs::read(&shard).unwrap();
    let a = "u16_default_sparse";
    let mut expect: Vec<(String, Option<Vec<u8>>)> = Vec::new();
    {
        let (mnt, _m) = mount_rw(&store);
        let p = |rel: &str| mnt.path().join(a).join(rel);
        // cat > key (new chunk in an existing shard).
        fs::write(p("c/0/1"), vec![1u8; 24]).unwrap();
        expect.push(("c/0/1".into(), Some(vec![1; 24])));
        // O_TRUNC overwrite of an existing chunk, then a write at an offset.
        fs::write(p("c/1/1"), vec![2u8; 24]).unwrap();
        let mut f = OpenOptions::new().write(true).open(p("c/1/1")).unwrap();
        f.seek(SeekFrom::Start(4)).unwrap();
        f.write_all(&[9, 9]).unwrap();
        drop(f);
        let mut v = vec![2u8; 24];
        v[4] = 9;
        v[5] = 9;
        assert_eq!(fs::read(p("c/1/1")).unwrap(), v, "read-your-writes");
        expect.push(("c/1/1".into(), Some(v)));
        // truncate(1) to a length no chunk of this uncompressed array can have: refused
        // at the commit (its fsync), and the chunk keeps its bytes (issue 33, finding 5).
        let f = OpenOptions::new().write(true).open(p("c/0/0")).unwrap();
        f.set_len(10).unwrap();
        assert_eq!(
            errno_of(f.sync_all()),
            libc::EINVAL,
            "a 10-byte uint16 chunk of 12"
        );
        drop(f);
        let t = fs::read(
            common::fixtures()
                .join("zarr_basic.twin")
                .join(a)
                .join("c/0/0"),
        )
        .unwrap();
        assert_eq!(
            fs::read(p("c/0/0")).unwrap(),
            t,
            "the refused truncate left it"
        );
        // truncate(1) to nothing, then the whole chunk written through the same descriptor.
        let mut f = OpenOptions::new().write(true).open(p("c/0/0")).unwrap();
        f.set_len(0).unwrap();
        f.write_all(&[7u8; 24]).unwrap();
        drop(f);
        expect.push(("c/0/0".into(), Some(vec![7; 24])));
        // zarr-python: mkdir -p, temp file, rename onto the key.
        fs::create_dir_all(p("c/3")).unwrap();
        fs::write(
            p("c/3/2.0123456789abcdef0123456789abcdef.partial"),
            vec![3u8; 24],
        )
        .unwrap();
        fs::rename(
            p("c/3/2.0123456789abcdef0123456789abcdef.partial"),
            p("c/3/2"),
        )
        .unwrap();
        expect.push(("c/3/2".into(), Some(vec![3; 24])));
        // zarr-python set-if-not-exists: link then unlink.
        fs::write(p("c/3/0.tmp"), vec![4u8; 24]).unwrap();
        fs::hard_link(p("c/3/0.tmp"), p("c/3/0")).unwrap();
        fs::remove_file(p("c/3/0.tmp")).unwrap();
        expect.push(("c/3/0".into(), Some(vec![4; 24])));
        assert_eq!(
            errno_of(fs::hard_link(p("c/3/2"), p("c/3/0"))),
            libc::EEXIST
        );
        // rm key: the chunk becomes empty.
        fs::remove_file(p("c/4/0")).unwrap();
        expect.push(("c/4/0".into(), None));
        assert_eq!(errno_of(fs::metadata(p("c/4/0"))), libc::ENOENT);
        // A chunk key outside the grid is refused when created (its bytes could never
        // be stored); scratch files under any other name are fine, and renames onto
        // invalid keys are refused.
        assert_eq!(
            errno_of(fs::write(p("c/3/99"), b"outside")),
            libc::EINVAL,
            "column 99 lies outside the 5x5 grid"
        );
        assert_eq!(errno_of(fs::metadata(p("c/3/99"))), libc::ENOENT);
        fs::write(p("c/3/99.tmp"), b"outside").unwrap();
        assert_eq!(
            errno_of(fs::rename(p("c/3/99.tmp"), p("c/3/5"))),
            libc::EINVAL,
            "column 5 lies outside the 5x5 grid"
        );
        assert_eq!(
            errno_of(fs::rename(p("c/3/99.tmp"), p("c/9"))),
            libc::EINVAL,
            "a key directory name is no chunk"
        );
        fs::rename(p("c/3/99.tmp"), p("c/3/04")).unwrap(); // not a key (leading zero): a scratch name
        assert_eq!(fs::read(p("c/3/04")).unwrap(), b"outside");
        assert_eq!(errno_of(fs::create_dir(p("c/junk"))), libc::EINVAL);
        // Listings show staged chunks and hide deleted ones.
        let listed: Vec<String> = fs::read_dir(p("c/3"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            listed.contains(&"2".to_string()) && listed.contains(&"0".to_string()),
            "{listed:?}"
        );
        // fsync makes it durable: the shard on disk has it before unmount.
        let f = fs::File::open(p("c/3/2")).unwrap();
        f.sync_all().unwrap();
        // Read the store directly, as a second, read-only reader would, while still mounted.
        let stored = shardfs::store::LocalStore::open(&store).unwrap();
        let view =
            shardfs::view::View::new(std::sync::Arc::new(stored), Default::default()).unwrap();
        let mut ino = shardfs::view::ROOT_INO;
        for part in ["u16_default_sparse", "c", "3", "2"] {
            ino = view
                .lookup(ino, std::ffi::OsStr::new(part))
                .unwrap_or_else(|e| panic!("c/3/2 not in the store after fsync: {e}"))
                .ino;
        }
        let o = view.open(ino, false, false).unwrap();
        assert_eq!(
            view.read(o.fh, 0, 1024).unwrap(),
            vec![3u8; 24],
            "fsync made c/3/2 durable"
        );
    }
    // Append-only: the old bytes of the shard are an unchanged prefix.
    let after = fs::read(&shard).unwrap();
    assert!(
        after.len() > before.len() && after[..before.len()] == before[..],
        "append-only prefix"
    );
    // After a remount, every change is there.
    let (mnt, _m) = mount_rw(&store);
    for (key, want) in &expect {
        let got = fs::read(mnt.path().join(a).join(key));
        match want {
            Some(bytes) => assert_eq!(&got.unwrap(), bytes, "{key}"),
            None => assert_eq!(errno_of(got), libc::ENOENT, "{key}"),
        }
    }
}

#[test]
fn metadata_writes_keep_the_sharding_and_refuse_layout_changes() {
    if !common::can_mount() {
        return;
    }
    let tmp = store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let (mnt, m) = mount_rw(&store);
    let meta_path = mnt.path().join("index_nocrc/zarr.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
    meta["attributes"]["units"] = "nm".into();
    meta["shape"] = serde_json::json!([30, 13]);
    fs::write(
        mnt.path().join("index_nocrc/zarr.json.partial"),
        serde_json::to_vec(&meta).unwrap(),
    )
    .unwrap();
    fs::rename(mnt.path().join("index_nocrc/zarr.json.partial"), &meta_path).unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
    assert_eq!(shown["shape"], serde_json::json!([30, 13]));
    let mut bad = meta.clone();
    bad["data_type"] = "int64".into();
    let bad = serde_json::to_vec(&bad).unwrap();
    // Written in place, the kernel opening files itself (the default): the refusal is
    // the error of the write that makes the document whole.
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&meta_path)
        .unwrap();
    assert_eq!(errno_of(f.write_all(&bad)), libc::EINVAL);
    drop(f);
    let shown: serde_json::Value = serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
    assert_eq!(
        shown["data_type"], "uint16",
        "a refused write changes nothing"
    );
    // With `open_checks` (every open and close heard of): the refusal arrives at fsync
    // (and at close), and meanwhile every other reader sees the stored document, whole.
    {
        let strict = tempfile::tempdir().unwrap();
        let opts = MountOptions {
            open_checks: true,
            ..MountOptions::default()
        };
        let _s = Mount::new(&store, strict.path(), &opts).unwrap();
        let meta_path = strict.path().join("index_nocrc/zarr.json");
        let mut f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&meta_path)
            .unwrap();
        f.write_all(&bad).unwrap();
        let during: serde_json::Value = serde_json::from_slice(&fs::read(&meta_path).unwrap())
            .expect("the stored document, not a cut one");
        assert_eq!(during["data_type"], "uint16", "a pending write is not seen");
        assert_eq!(errno_of(f.sync_all()), libc::EINVAL);
        drop(f);
        let shown: serde_json::Value =
            serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
        assert_eq!(
            shown["data_type"], "uint16",
            "a refused write changes nothing"
        );
    }
    let mut inner = meta.clone();
    inner["chunk_grid"]["configuration"]["chunk_shape"] = serde_json::json!([2, 3]);
    fs::write(
        mnt.path().join("index_nocrc/x.partial"),
        serde_json::to_vec(&inner).unwrap(),
    )
    .unwrap();
    assert_eq!(
        errno_of(fs::rename(
            mnt.path().join("index_nocrc/x.partial"),
            &meta_path
        )),
        libc::EINVAL
    );
    m.unmount().unwrap();
    let stored: serde_json::Value =
        serde_json::from_slice(&fs::read(store.join("index_nocrc/zarr.json")).unwrap()).unwrap();
    assert_eq!(stored["attributes"]["units"], "nm");
    assert_eq!(stored["shape"], serde_json::json!([30, 13]));
    assert_eq!(stored["data_type"], "uint16");
    assert_eq!(
        stored["codecs"][0]["name"], "sharding_indexed",
        "still sharded"
    );
}

#[test]
fn copying_an_unsharded_array_into_the_mount_shards_it() {
    if !common::can_mount() {
        return;
    }
    let tmp = store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let twin = common::fixtures().join("zarr_basic.twin/u16_default_sparse");
    {
        let (mnt, _m) = mount_rw(&store);
        let st = Command::new("cp")
            .arg("-r")
            .arg(&twin)
            .arg(mnt.path().join("copied"))
            .status()
            .unwrap();
        assert!(st.success());
        for rel in common::files_under(&twin) {
            let got = fs::read(mnt.path().join("copied").join(&rel)).unwrap();
            let want = fs::read(twin.join(&rel)).unwrap();
            if rel == "zarr.json" {
                let (g, w): (serde_json::Value, serde_json::Value) = (
                    serde_json::from_slice(&got).unwrap(),
                    serde_json::from_slice(&want).unwrap(),
                );
                assert_eq!(g, w);
            } else {
                assert_eq!(got, want, "{rel}");
            }
        }
    }
    {
        // The chunk files first, the metadata last: they are taken into shards.
        let (mnt, _m) = mount_rw(&store);
        let dst = mnt.path().join("chunks_first");
        fs::create_dir(&dst).unwrap();
        let st = Command::new("cp")
            .arg("-r")
            .arg(twin.join("c"))
            .arg(dst.join("c"))
            .status()
            .unwrap();
        assert!(st.success());
        fs::copy(twin.join("zarr.json"), dst.join("zarr.json")).unwrap();
        assert_eq!(common::files_under(&dst), common::files_under(&twin));
    }
    for name in ["copied", "chunks_first"] {
        let stored: serde_json::Value =
            serde_json::from_slice(&fs::read(store.join(name).join("zarr.json")).unwrap()).unwrap();
        assert_eq!(stored["codecs"][0]["name"], "sharding_indexed", "{name}");
        assert!(!store.join(name).join(".shardfs-ingest").exists(), "{name}");
    }
    // The store now holds shards (and nothing else), read back through a fresh mount.
    let (mnt, _m) = mount_rw(&store);
    for name in ["copied", "chunks_first"] {
        assert_eq!(
            common::files_under(&mnt.path().join(name)),
            common::files_under(&twin),
            "{name}"
        );
        for rel in common::files_under(&twin)
            .iter()
            .filter(|r| r.starts_with("c/"))
        {
            assert_eq!(
                fs::read(mnt.path().join(name).join(rel)).unwrap(),
                fs::read(twin.join(rel)).unwrap(),
                "{name}/{rel}"
            );
        }
    }
    let stored_files: Vec<String> = common::files_under(&store.join("copied"))
        .into_iter()
        .collect();
    assert_eq!(
        stored_files,
        ["c/0/0", "zarr.json"],
        "one shard in the store"
    );
}

/// A store directory `s` under `dir` holding an empty root group.
fn group_store(dir: &Path) -> PathBuf {
    let store = dir.join("s");
    fs::create_dir(&store).unwrap();
    fs::write(
        store.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "group"}"#,
    )
    .unwrap();
    store
}

/// Array `a` (64 x 64 uint8 in 4 x 4 chunks, no compression) made through mount `mnt`.
fn make_64x64_array(mnt: &Path) -> PathBuf {
    let arr = mnt.join("a");
    fs::create_dir(&arr).unwrap();
    fs::write(
        arr.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "array", "shape": [64, 64], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 4]}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
            "codecs": [{"name": "bytes"}]}"#,
    )
    .unwrap();
    arr
}

#[test]
fn concurrent_writers_to_one_shard_lose_nothing() {
    if !common::can_mount() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let store = group_store(tmp.path());
    let opts = MountOptions {
        chunks_per_shard: Some(vec![16, 16]),
        flush_interval: std::time::Duration::from_millis(50),
        write_buffer: 64 << 10, // small: flushes run while others write
        ..MountOptions::default()
    };
    let mnt = tempfile::tempdir().unwrap();
    let m = Mount::new(&store, mnt.path(), &opts).unwrap();
    let arr = make_64x64_array(mnt.path());
    let threads = 7;
    let per = 32; // 7 threads x 32 = rows 0..13 of the one 16x16-chunk shard
    std::thread::scope(|s| {
        for t in 0..threads {
            let arr = arr.clone();
            s.spawn(move || {
                for i in 0..per {
                    let n = t * per + i;
                    let (y, x) = (n / 16, n % 16);
                    let dir = arr.join(format!("c/{y}"));
                    fs::create_dir_all(&dir).unwrap();
                    let tmp = dir.join(format!("{x}.{t}.partial"));
                    fs::write(&tmp, vec![(n % 251) as u8 + 1; 16]).unwrap();
                    fs::rename(&tmp, dir.join(x.to_string())).unwrap();
                }
            });
        }
        // A second process writes rows 14 and 15 of the same shard meanwhile.
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!("for y in 14 15; do mkdir -p {0}/c/$y; for x in $(seq 0 15); do printf 'pppppppppppppppp' > {0}/c/$y/$x.p && mv {0}/c/$y/$x.p {0}/c/$y/$x; done; done", arr.display()))
            .status()
            .unwrap();
        assert!(status.success());
    });
    m.unmount().unwrap();
    let (mnt, _m) = mount_rw(&store);
    for n in 0..threads * per {
        let (y, x) = (n / 16, n % 16);
        let got = fs::read(mnt.path().join(format!("a/c/{y}/{x}")))
            .unwrap_or_else(|e| panic!("chunk {y}/{x}: {e}"));
        assert_eq!(got, vec![(n % 251) as u8 + 1; 16], "chunk {y}/{x}");
    }
    for y in 14..16 {
        for x in 0..16 {
            assert_eq!(
                fs::read(mnt.path().join(format!("a/c/{y}/{x}"))).unwrap(),
                b"pppppppppppppppp"
            );
        }
    }
}

/// A key directory that a shard only partly covers (row 3 of a shard of rows 0-15) is
/// not there until a chunk or a `mkdir` puts it there, whether the shard's index is
/// cached or not. A lookup that guessed "yes" from the shard file alone made `mkdir -p`
/// fail now and then: mkdir said EEXIST, then `stat` said ENOENT (seen with 7 threads
/// in `concurrent_writers_to_one_shard_lose_nothing`, and tensorstore).
#[test]
fn a_key_directory_a_shard_only_partly_covers_is_there_only_when_made() {
    if !common::can_mount() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let store = group_store(tmp.path());
    let opts = MountOptions {
        chunks_per_shard: Some(vec![16, 16]),
        ..MountOptions::default()
    };
    {
        let mnt = tempfile::tempdir().unwrap();
        let m = Mount::new(&store, mnt.path(), &opts).unwrap();
        let arr = make_64x64_array(mnt.path());
        fs::create_dir_all(arr.join("c/0")).unwrap();
        fs::write(arr.join("c/0/0"), [1u8; 16]).unwrap();
        m.unmount().unwrap();
    }
    // A fresh mount: no index cached.
    let (mnt, _m) = mount_rw(&store);
    let arr = mnt.path().join("a");
    assert!(fs::metadata(arr.join("c/0")).unwrap().is_dir());
    let err = fs::metadata(arr.join("c/3")).unwrap_err();
    assert_eq!(
        err.kind(),
        std::io::ErrorKind::NotFound,
        "c/3 holds no chunk"
    );
    fs::create_dir(arr.join("c/3")).unwrap();
    assert!(fs::metadata(arr.join("c/3")).unwrap().is_dir());
    fs::write(arr.join("c/3/5"), [3u8; 16]).unwrap();
    assert_eq!(fs::read(arr.join("c/3/5")).unwrap(), [3u8; 16]);
}
