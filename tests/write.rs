//! Writes through the mount: the patterns real clients use, metadata writes, new arrays,
//! concurrency, and the real clients themselves (zarr-python 3, tensorstore).

mod common;

use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::mount::mount_rw;
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

/// Run `tests/py/write_interop.py` with `args`; fail the test with its output if it fails.
fn run_write_interop(python: &Path, args: &[&std::ffi::OsStr]) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/write_interop.py");
    let out = Command::new(python)
        .arg(&script)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn zarr_python_and_tensorstore_write_through_the_mount() {
    if !common::can_mount() {
        return;
    }
    let Some(python) = common::venv_python(".venv") else {
        return;
    };
    let tmp = store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let expect = tmp.path().join("expect.npz");
    {
        let (mnt, m) = mount_rw(&store);
        run_write_interop(
            &python,
            &[
                "write".as_ref(),
                "--mount".as_ref(),
                mnt.path().as_os_str(),
                "--expect".as_ref(),
                expect.as_os_str(),
            ],
        );
        m.unmount().unwrap();
    }
    run_write_interop(
        &python,
        &[
            "check".as_ref(),
            "--store".as_ref(),
            store.as_os_str(),
            "--expect".as_ref(),
            expect.as_os_str(),
        ],
    );
    let (mnt, _m) = mount_rw(&store);
    run_write_interop(
        &python,
        &[
            "view".as_ref(),
            "--mount".as_ref(),
            mnt.path().as_os_str(),
            "--expect".as_ref(),
            expect.as_os_str(),
        ],
    );
}

#[test]
fn two_mounts_of_one_store_keep_each_others_updates() {
    if !common::can_mount() {
        return;
    }
    let tmp = store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let (m1, g1) = mount_rw(&store);
    let (m2, g2) = mount_rw(&store);
    // Both write chunks of the same shard (c/0/0 covers chunk rows 0-1, columns 0-1)
    // and of others, interleaved, each flushing (fsync) after every write.
    let keys = ["c/0/0", "c/0/1", "c/1/0", "c/1/1", "c/2/2", "c/3/3"];
    for (i, key) in keys.iter().enumerate() {
        let mnt = if i % 2 == 0 { &m1 } else { &m2 };
        let path = mnt.path().join("u16_default_sparse").join(key);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let f = fs::File::create(&path).unwrap();
        std::io::Write::write_all(&mut &f, &[i as u8 + 10; 24]).unwrap();
        f.sync_all().unwrap();
    }
    g1.unmount().unwrap();
    g2.unmount().unwrap();
    let (mnt, _g) = mount_rw(&store);
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(
            fs::read(mnt.path().join("u16_default_sparse").join(key)).unwrap(),
            vec![i as u8 + 10; 24],
            "{key}"
        );
    }
    assert!(
        shardfs::maint::verify(&store, false, false)
            .unwrap()
            .problems
            .is_empty()
    );
}

#[test]
fn stats_count_what_the_mount_did() {
    if !common::can_mount() {
        return;
    }
    let tmp = store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let (mnt, _m) = mount_rw(&store);
    for key in ["c/0/0", "c/0/1", "c/1/0"] {
        fs::read(mnt.path().join("u16_default_sparse").join(key)).unwrap();
    }
    fs::write(mnt.path().join("u16_default_sparse/c/2/2"), [7u8; 24]).unwrap();
    fs::File::open(mnt.path()).unwrap().sync_all().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shardfs"))
        .arg("stats")
        .arg(mnt.path())
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The kernel opens files itself (no `chunk_opens`); the reads reach the daemon once.
    assert!(s["chunk_reads"].as_u64().unwrap() >= 3, "{s}");
    assert!(s["chunk_bytes_read"].as_u64().unwrap() >= 3 * 24, "{s}");
    assert_eq!(s["chunks_committed"], 1, "{s}");
    assert!(s["flushes"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["chunks_flushed"], 1, "{s}");
    assert_eq!(s["staged_bytes"], 0, "{s}");
    // Which way the flush laid the batch out: on the host (the default `auto` keeps a
    // 24-byte batch there, and brings up no GPU for it).
    let c = &s["compaction"];
    assert!(c["host_planned"]["batches"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(c["host_planned"]["bytes"], 24, "{s}");
    assert_eq!(c["device_packed"]["batches"], 0, "{s}");
    assert!(
        c["auto"]["gpu"]
            .as_str()
            .unwrap()
            .starts_with("not brought up"),
        "{s}"
    );
    assert!(c["auto"]["estimates"].is_null(), "{s}");
    // Hidden: not in the listing.
    assert!(
        fs::read_dir(mnt.path())
            .unwrap()
            .all(|e| e.unwrap().file_name() != ".shardfs-stats")
    );
}

/// Write-behind: an array with `write_behind` bytes of chunks staged is flushed at once,
/// behind its writer (no `fsync`, no idle flush: the interval is an hour); with it off,
/// nothing is flushed before the `fsync`. Either way every chunk is stored.
#[test]
fn an_array_is_flushed_behind_its_writer() {
    if !common::can_mount() {
        return;
    }
    for behind in [1u64 << 20, 0] {
        let store = tempfile::tempdir().unwrap();
        let chunk = |i: usize| vec![(i * 7 + 1) as u8; 64 << 10];
        {
            let mnt = tempfile::tempdir().unwrap();
            let opts = MountOptions {
                write_behind: behind,
                flush_interval: std::time::Duration::from_secs(3600),
                ..MountOptions::default()
            };
            let m = Mount::new(store.path(), mnt.path(), &opts).unwrap();
            let flushes = || {
                let s: serde_json::Value = serde_json::from_slice(&m.view().stats_json()).unwrap();
                s["flushes"].as_u64().unwrap()
            };
            let a = mnt.path().join("a");
            fs::create_dir(&a).unwrap();
            let meta = serde_json::json!({
                "zarr_format": 3, "node_type": "array", "shape": [2048, 1024],
                "data_type": "uint8",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [64, 1024]}},
                "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
            });
            fs::write(a.join("zarr.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
            fs::create_dir_all(a.join("c")).unwrap();
            for i in 0..32 {
                fs::create_dir_all(a.join(format!("c/{i}"))).unwrap();
                let tmp = a.join(format!("c/{i}/0.partial"));
                fs::write(&tmp, chunk(i)).unwrap();
                fs::rename(&tmp, a.join(format!("c/{i}/0"))).unwrap();
            }
            if behind > 0 {
                // 2 MiB written: the array crossed 1 MiB once, so at least one flush
                // runs without being asked.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                while flushes() == 0 {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "no flush behind the writer within 30 s"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            } else {
                assert_eq!(
                    flushes(),
                    0,
                    "write-behind off: nothing flushed before fsync"
                );
            }
            fs::File::open(&a).unwrap().sync_all().unwrap();
            assert!(flushes() >= 1);
            m.unmount().unwrap();
        }
        let mnt = tempfile::tempdir().unwrap();
        let opts = MountOptions {
            read_only: true,
            ..MountOptions::default()
        };
        let _m = Mount::new(store.path(), mnt.path(), &opts).unwrap();
        for i in 0..32 {
            assert_eq!(
                fs::read(mnt.path().join(format!("a/c/{i}/0"))).unwrap(),
                chunk(i),
                "write_behind {behind}: chunk {i}"
            );
        }
    }
}

/// A temporary file renamed onto a chunk key is shown as written: the kernel keeps the
/// pages its writer filled (whole pages: a partial last page is read again), so reading
/// the new chunks back asks the daemon for nothing (docs/SEMANTICS.md, "Reads on a
/// writable mount"); they read right after the flush and from a new mount too.
#[test]
fn chunks_renamed_into_place_are_read_back_from_the_kernels_pages() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let chunk = |i: usize| {
        (0..16 << 10)
            .map(|b: usize| (b * 31 + i * 7) as u8)
            .collect::<Vec<u8>>()
    };
    let mnt = tempfile::tempdir().unwrap();
    let opts = MountOptions {
        // Nothing flushed behind the test's back: a flush gives the chunks their shard's
        // time, which drops their pages at the kernel's next check.
        flush_interval: std::time::Duration::from_secs(3600),
        ..MountOptions::default()
    };
    let m = Mount::new(store.path(), mnt.path(), &opts).unwrap();
    let a = mnt.path().join("a");
    fs::create_dir(&a).unwrap();
    let meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [1024, 128],
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [128, 128]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
    });
    fs::write(a.join("zarr.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
    for i in 0..8 {
        fs::create_dir_all(a.join(format!("c/{i}"))).unwrap();
        let tmp = a.join(format!("c/{i}/0.0123456789abcdef.partial"));
        fs::write(&tmp, chunk(i)).unwrap();
        fs::rename(&tmp, a.join(format!("c/{i}/0"))).unwrap();
    }
    let requests = || {
        let s: serde_json::Value = serde_json::from_slice(&m.view().stats_json()).unwrap();
        s["read_requests"].as_u64().unwrap()
    };
    let before = requests();
    for i in 0..8 {
        assert_eq!(
            fs::read(a.join(format!("c/{i}/0"))).unwrap(),
            chunk(i),
            "{i}"
        );
    }
    assert_eq!(
        requests(),
        before,
        "the chunks just renamed into place were read from the kernel's pages"
    );
    fs::File::open(&a).unwrap().sync_all().unwrap();
    for i in 0..8 {
        assert_eq!(
            fs::read(a.join(format!("c/{i}/0"))).unwrap(),
            chunk(i),
            "{i}, flushed"
        );
    }
    m.unmount().unwrap();
    let mnt2 = tempfile::tempdir().unwrap();
    let _m2 = Mount::new(store.path(), mnt2.path(), &MountOptions::default()).unwrap();
    for i in 0..8 {
        assert_eq!(
            fs::read(mnt2.path().join(format!("a/c/{i}/0"))).unwrap(),
            chunk(i),
            "{i}, remounted"
        );
    }
}

/// `chmod` and `chown` set the mode and owner of the store's own files and directories
/// (a file outside arrays, a directory, an array's directory); the files the view makes
/// up (chunks, metadata) keep the mode of their array's `zarr.json`, and a change to
/// one is accepted and changes nothing.
#[test]
fn chmod_and_chown_reach_the_stores_files_and_directories() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !common::can_mount() {
        return;
    }
    let tmp = store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let (mnt, _m) = mount_rw(&store);
    let m = mnt.path();
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let chmod =
        |p: &Path, mode: u32| fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    fs::write(m.join("notes.txt"), b"hi").unwrap();
    fs::create_dir(m.join("docs")).unwrap();
    chmod(&m.join("notes.txt"), 0o600);
    chmod(&m.join("docs"), 0o750);
    chmod(&m.join("u16_default_sparse"), 0o700);
    for (rel, want) in [
        ("notes.txt", 0o600),
        ("docs", 0o750),
        ("u16_default_sparse", 0o700),
    ] {
        assert_eq!(mode(&store.join(rel)), want, "{rel} in the store");
        assert_eq!(mode(&m.join(rel)), want, "{rel} through the mount");
    }
    let is_root = unsafe { libc::geteuid() } == 0;
    if is_root {
        std::os::unix::fs::chown(m.join("notes.txt"), Some(1234), Some(4321)).unwrap();
        let md = fs::metadata(store.join("notes.txt")).unwrap();
        assert_eq!((md.uid(), md.gid()), (1234, 4321));
        let md = fs::metadata(m.join("notes.txt")).unwrap();
        assert_eq!((md.uid(), md.gid()), (1234, 4321));
    } else {
        println!("chown part skipped: not root");
    }
    // A chunk's mode is its zarr.json's: accepted, unchanged.
    let chunk = m.join("u16_default_sparse/c/0/0");
    let before = mode(&chunk);
    chmod(&chunk, 0o600);
    assert_eq!(mode(&chunk), before);
    assert_eq!(
        before,
        mode(&store.join("u16_default_sparse/zarr.json")) & 0o7777
    );
}
