//! Real clients and tools writing through the mount: zarr-python and tensorstore, two
//! mounts of one store, write-behind flushes, renames into place, `chmod` and `chown`,
//! and the counters `shardfs stats` shows.

use super::*;

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
    let out = shardfs()
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
