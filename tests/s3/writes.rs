//! Writes through S3 mounts: conditional PUTs that merge two mounts' writes, unlinks and
//! kept documents in the bucket, `rm -rf`, a new array landing sharded.

use super::*;

/// Two mounts of one bucket prefix (two hosts) write chunks of the same shard: different
/// chunks both survive, and for the same chunk the write closed last wins, though the
/// mount that closed first flushes last. The shards stay valid Zarr (verify), and
/// nothing but whole shards is in the bucket.
#[test]
fn two_mounts_of_one_prefix_merge_with_conditional_puts() {
    let Some(s3) = S3Test::start() else { return };
    s3.upload_fixture("zarr_basic", "bucket/data");
    // Long flush intervals: each mount flushes only at fsync or unmount.
    let opts = ["--flush-interval", "600"];
    let (a, ma) = s3.mount_dir("s3://bucket/data", "a", &opts);
    let (b, mb) = s3.mount_dir("s3://bucket/data", "b", &opts);
    let arr = "index_start/c";
    let chunk_len = std::fs::read(a.join(arr).join("0/0")).unwrap().len();
    let fill = |v: u8| vec![v; chunk_len];
    // Different chunks of one shard, from both mounts, both fsync'd.
    write_fsync(&a.join(arr).join("0/0"), &fill(1));
    write_fsync(&b.join(arr).join("0/1"), &fill(2));
    // One chunk: A closes first (v3, not fsync'd), B closes later (v4) and fsyncs;
    // A's flush comes last, at its unmount, and must not replace B's write.
    std::fs::write(a.join(arr).join("1/0"), fill(3)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    write_fsync(&b.join(arr).join("1/0"), &fill(4));
    mb.unmount();
    ma.unmount();
    let (ro, m) = s3.mount_dir("s3://bucket/data", "ro", &["-o", "ro"]);
    assert_eq!(std::fs::read(ro.join(arr).join("0/0")).unwrap(), fill(1));
    assert_eq!(std::fs::read(ro.join(arr).join("0/1")).unwrap(), fill(2));
    assert_eq!(
        std::fs::read(ro.join(arr).join("1/0")).unwrap(),
        fill(4),
        "the write closed last wins"
    );
    m.unmount();
    // The objects are valid sharded Zarr: verify, and zarr-python 3 reads them.
    let local = s3.tmp().join("downloaded");
    s3.tool(&["download", "--from", "bucket/data", local.to_str().unwrap()]);
    let out = s3.shardfs().arg("verify").arg(&local).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = Command::new(&s3.python)
        .arg("-c")
        .arg(format!(
            "import zarr, numpy as np; a = zarr.open_array({:?}, mode='r'); \
             print(a.shards is not None, int(a[0:4, 0:3].max()), int(a[0:4, 3:6].max()))",
            local.join("index_start").to_str().unwrap()
        ))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // uint16 chunks of bytes 1 and 2: 0x0101 and 0x0202.
    assert_eq!(said.trim(), "True 257 514", "{said}");
    let keys = s3.tool(&["keys", "--from", "bucket/data"]);
    assert!(
        !keys.contains(".partial") && !keys.contains(".shardfs"),
        "{keys}"
    );
}

/// A chunk opened for writing in place (`r+b`: the open reads it first) whose shard
/// another mount changed since this one loaded it is read again from the shard as it is
/// now, and written: no `ESTALE` (SEMANTICS: no spurious errors while other mounts write
/// the same shards), and both mounts' chunks are stored. Before, the write failed with
/// `ESTALE` for a while after the other mount's `fsync` (found by an adversarial
/// tester: 8 of 8 right after it).
#[test]
fn a_chunk_opened_for_writing_after_another_mount_changed_its_shard_is_written() {
    use std::io::Write;
    let Some(s3) = S3Test::start() else { return };
    s3.upload_fixture("zarr_basic", "bucket/data");
    let (a, ma) = s3.mount_dir("s3://bucket/data", "a", &[]);
    let (b, mb) = s3.mount_dir("s3://bucket/data", "b", &[]);
    let arr = "index_start/c";
    // A loads the shard; B changes another chunk of it.
    let len = std::fs::read(a.join(arr).join("0/0")).unwrap().len();
    write_fsync(&b.join(arr).join("0/1"), &vec![2; len]);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(a.join(arr).join("0/0"))
        .unwrap();
    f.write_all(&vec![1; len]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    mb.unmount();
    ma.unmount();
    let (ro, m) = s3.mount_dir("s3://bucket/data", "ro", &["-o", "ro"]);
    assert_eq!(
        std::fs::read(ro.join(arr).join("0/0")).unwrap(),
        vec![1; len]
    );
    assert_eq!(
        std::fs::read(ro.join(arr).join("0/1")).unwrap(),
        vec![2; len]
    );
    m.unmount();
}

/// Files written and unlinked through a mount stay unlinked in the bucket: written and
/// removed at once (the daemon commits writes through descriptors the kernel opened a
/// moment after the last one, or at unmount), and unlinked while open and then closed.
/// Both came back before (found by an adversarial tester): the file's close PUT it
/// again at its name.
#[test]
fn files_unlinked_through_the_mount_stay_unlinked_in_the_bucket() {
    use std::io::Write;
    let Some(s3) = S3Test::start() else { return };
    s3.upload_fixture("zarr_basic", "bucket/data");
    for opts in [&[][..], &["-o", "open_checks"][..]] {
        let (w, mw) = s3.mount_dir("s3://bucket/data", "w", opts);
        std::fs::write(w.join("x.txt"), b"hello").unwrap();
        std::fs::remove_file(w.join("x.txt")).unwrap();
        let mut f = std::fs::File::create(w.join("y.txt")).unwrap();
        f.write_all(b"lock").unwrap();
        std::fs::remove_file(w.join("y.txt")).unwrap();
        assert!(!w.join("y.txt").exists(), "{opts:?}: unlinked while open");
        drop(f);
        // Renamed while open: stored at its new name only, whole.
        let mut g = std::fs::File::create(w.join("a.tmp")).unwrap();
        g.write_all(b"12").unwrap();
        std::fs::rename(w.join("a.tmp"), w.join("a.txt")).unwrap();
        g.write_all(b"34").unwrap();
        drop(g);
        mw.unmount();
        let keys = s3.tool(&["keys", "--from", "bucket/data"]);
        for gone in ["x.txt", "y.txt", "a.tmp"] {
            assert!(!keys.contains(gone), "{opts:?}: {gone} came back: {keys}");
        }
        let (r, mr) = s3.mount_dir("s3://bucket/data", "r", &["-o", "ro"]);
        assert_eq!(std::fs::read(r.join("a.txt")).unwrap(), b"1234", "{opts:?}");
        mr.unmount();
        let (w, mw) = s3.mount_dir("s3://bucket/data", "w", &[]);
        std::fs::remove_file(w.join("a.txt")).unwrap();
        mw.unmount();
    }
}

/// v2 view on object storage: a `.zattrs` written while a sharded array's `.zarray` is
/// unlinked is stored in the document the unlink keeps (a copy on object storage, so
/// another version than the metadata it came from), and a later mount shows it and
/// stores it with the `.zarray` written back (as `tests/v2.rs`
/// `a_zattrs_written_while_a_sharded_arrays_zarray_is_unlinked_outlives_the_mount` on a
/// disk).
#[test]
fn a_zattrs_held_with_an_unlinked_zarray_is_stored_in_the_bucket() {
    let Some(s3) = S3Test::start() else { return };
    let zarray = common::ZARRAY_U1_4;
    let v2 = ["--format", "v2"];
    let (w, mw) = s3.mount_dir("s3://bucket/v2", "w", &v2);
    let a = w.join("a");
    std::fs::create_dir(&a).unwrap();
    std::fs::write(a.join(".zarray"), zarray).unwrap();
    std::fs::write(a.join("0"), [1u8, 2]).unwrap();
    let shown = std::fs::read(a.join(".zarray")).unwrap();
    std::fs::remove_file(a.join(".zarray")).unwrap();
    std::fs::write(a.join(".zattrs"), br#"{"k": 1}"#).unwrap();
    std::fs::write(a.join(".zattrs"), br#"{"k": 2}"#).unwrap();
    assert_eq!(common::names(&a), [".zattrs", "0"]);
    mw.unmount();
    let keys = s3.tool(&["keys", "--from", "bucket/v2"]);
    assert!(
        keys.contains("a/zarr.json.shardfs-unlinked") && !keys.contains("a/zarr.json\n"),
        "{keys}"
    );
    let (w, mw) = s3.mount_dir("s3://bucket/v2", "w2", &v2);
    let a = w.join("a");
    assert_eq!(common::names(&a), [".zattrs", "0"], "a later mount");
    let attrs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join(".zattrs")).unwrap()).unwrap();
    assert_eq!(attrs, serde_json::json!({"k": 2}));
    assert_eq!(std::fs::read(a.join("0")).unwrap(), [1, 2]);
    std::fs::write(a.join(".zarray"), &shown).unwrap();
    mw.unmount();
    let local = s3.tmp().join("downloaded");
    s3.tool(&["download", "--from", "bucket/v2", local.to_str().unwrap()]);
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(local.join("a/zarr.json")).unwrap()).unwrap();
    assert_eq!(doc["attributes"]["k"], 2, "{doc}");
    assert!(!local.join("a/zarr.json.shardfs-unlinked").exists());
}

/// `rm -rf` of a sharded array through an S3 mount leaves nothing of it in the bucket,
/// and a directory emptied by unlinks stays until its `rmdir` (so `rm -r` of plain
/// directories works too). Before, the array's emptied shards stayed as index-only
/// objects, shown as plain files once `zarr.json` was gone, and the last `rmdir` was
/// `ENOTEMPTY`; and a plain directory vanished with its last object, failing the `rmdir`
/// after it with `ENOENT` (found by the reference test's S3 mode).
#[test]
fn rm_rf_through_an_s3_mount_leaves_nothing_behind() {
    let Some(s3) = S3Test::start() else { return };
    s3.upload_fixture("zarr_basic", "bucket/data");
    let (w, mw) = s3.mount_dir("s3://bucket/data", "w", &[]);
    std::fs::create_dir_all(w.join("notes/sub")).unwrap();
    std::fs::write(w.join("notes/sub/a.txt"), b"a").unwrap();
    std::fs::write(w.join("notes/b.txt"), b"b").unwrap();
    std::fs::remove_dir_all(w.join("notes")).unwrap();
    std::fs::remove_dir_all(w.join("index_start")).unwrap();
    assert!(!w.join("index_start").exists());
    mw.unmount();
    let keys = s3.tool(&["keys", "--from", "bucket/data"]);
    assert!(
        !keys.contains("index_start/") && !keys.contains("notes/"),
        "{keys}"
    );
}

/// An array that zarr-python 3 writes through an s3 mount (a legacy, unsharded writer)
/// lands in the bucket sharded, with no temporary object left, and zarr-python 3 and
/// tensorstore read the stored shards back equal.
#[test]
fn a_new_array_written_through_an_s3_mount_lands_sharded() {
    let Some(s3) = S3Test::start() else { return };
    let mnt = s3.dir("mnt");
    // A prefix with nothing below: mounted, with a note (a mistyped prefix would be
    // a new, empty store without a word).
    let out = s3
        .shardfs()
        .args(["mount", "s3://bucket/new"])
        .arg(&mnt)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let m = CliMount::guard(&mnt);
    assert!(
        said.contains("note: s3://bucket/new holds no objects"),
        "{said}"
    );
    let write = "import zarr, numpy as np, sys\n\
        g = zarr.open_group(sys.argv[1], mode='w')\n\
        a = g.create_array('img', shape=(64, 48), chunks=(16, 16), dtype='uint16')\n\
        a[...] = np.arange(64 * 48, dtype='uint16').reshape(64, 48)\n\
        assert (a[...] == np.arange(64 * 48).reshape(64, 48)).all()\n";
    let out = Command::new(&s3.python)
        .args(["-c", write])
        .arg(mnt.join("g"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    m.unmount();
    let keys = s3.tool(&["keys", "--from", "bucket/new"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert!(
        keys.contains(&"g/img/zarr.json") && keys.contains(&"g/zarr.json"),
        "{keys:?}"
    );
    assert!(
        keys.iter().filter(|k| k.starts_with("g/img/c/")).count() < 12,
        "12 chunks went into fewer shards: {keys:?}"
    );
    let local = s3.tmp().join("downloaded");
    s3.tool(&["download", "--from", "bucket/new", local.to_str().unwrap()]);
    let read = "import zarr, numpy as np, sys, tensorstore as ts\n\
        want = np.arange(64 * 48, dtype='uint16').reshape(64, 48)\n\
        a = zarr.open_array(sys.argv[1] + '/g/img', mode='r')\n\
        assert a.shards is not None, a.metadata\n\
        assert (a[...] == want).all()\n\
        t = ts.open({'driver': 'zarr3', 'kvstore': {'driver': 'file', 'path': sys.argv[1] + '/g/img'}}).result()\n\
        assert (t.read().result() == want).all()\n\
        print('ok')\n";
    let out = Command::new(&s3.python)
        .args(["-c", read])
        .arg(&local)
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
