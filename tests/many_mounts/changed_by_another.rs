//! Another mount changes what this one holds writes for: a chunk it removed can be
//! made again here at once; a chunk staged or written here for an array it moved,
//! removed or replaced (also while this mount holds the array's metadata unlinked) is
//! refused and named, never stored where the array was nor into the new one; one staged
//! before it grew the array is stored.

use super::*;

/// Array `a` made again, unsharded, written through a mount: the mount stores it with
/// shards of its own choosing (one shard of all 16 chunks), another layout than
/// [`array_doc`]'s 4 chunks a shard.
fn other_array_doc() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "zarr_format": 3, "node_type": "array", "shape": [64], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
    }))
    .unwrap()
}

/// A chunk another mount removed, whose entry this mount's kernel still caches (within
/// the 10 s TTL), is stale here, not missing: `mkdir -p` of its directory and
/// `open(O_CREAT|O_TRUNC)` by name make it anew (the kernel looks the name up again)
/// instead of failing with `ENOENT`.
#[test]
fn a_chunk_removed_by_another_mount_can_be_made_again_at_once() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    fs::create_dir(store.path().join("a")).unwrap();
    fs::write(store.path().join("a/zarr.json"), array_doc()).unwrap();
    let opts = MountOptions {
        flush_interval: Duration::from_secs(3600),
        ..MountOptions::default()
    };
    let (ma, mb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let _a = Mount::new(store.path(), ma.path(), &opts).unwrap();
    let _b = Mount::new(store.path(), mb.path(), &opts).unwrap();
    let key = |m: &Path| {
        // As writers do it: `mkdir -p` of the key's directory first.
        fs::create_dir_all(m.join("a/c")).unwrap();
        m.join("a/c/1")
    };
    // Not read back: B's kernel keeps the entry, with attributes its write made stale.
    write_close(&key(mb.path()), b"BBBB", true);
    // A overwrites the chunk, removes it, and flushes: it is gone from the store.
    write_close(&key(ma.path()), b"AAAA", false);
    fs::remove_file(key(ma.path())).unwrap();
    flush(ma.path());
    // B makes it again through the entry its kernel still has.
    write_close(&key(mb.path()), b"CCCC", true);
    assert_eq!(fs::read(key(mb.path())).unwrap(), b"CCCC");
    let fresh = tempfile::tempdir().unwrap();
    let _c = Mount::new(store.path(), fresh.path(), &opts).unwrap();
    assert_eq!(fs::read(key(fresh.path())).unwrap(), b"CCCC");
}

/// A chunk staged in mount B whose array mount A then moved (`mv a a2`) or removed
/// (`rm -rf a`): B's flush stores nothing where the array was, and says so (its
/// `fsync` of the chunk is `ESTALE`; the unmount succeeds, naming it in `refused`).
/// Before, B's flush made a shard file at the old path with no metadata beside it,
/// which a later mount showed as a file at a chunk key of a plain directory (found by
/// an adversarial tester).
#[test]
fn a_chunk_staged_for_an_array_another_mount_moved_or_removed_is_not_stored_there() {
    if !common::can_mount() {
        return;
    }
    for moved in [true, false] {
        let store = tempfile::tempdir().unwrap();
        fs::create_dir(store.path().join("a")).unwrap();
        fs::write(store.path().join("a/zarr.json"), array_doc()).unwrap();
        let (ma, a) = mount_unflushed(store.path());
        let (mb, b) = mount_unflushed_with(store.path(), false);
        fs::create_dir_all(mb.path().join("a/c")).unwrap();
        write_close(&mb.path().join("a/c/1"), b"BBBB", false);
        if moved {
            fs::rename(ma.path().join("a"), ma.path().join("a2")).unwrap();
        } else {
            fs::remove_dir_all(ma.path().join("a")).unwrap();
        }
        a.unmount().unwrap();
        let e = fs::File::open(mb.path().join("a/c/1"))
            .and_then(|f| f.sync_all())
            .expect_err("the chunk's fsync says it was not stored");
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
        let stats: serde_json::Value =
            serde_json::from_slice(&fs::read(mb.path().join(".shardfs-stats")).unwrap()).unwrap();
        assert!(
            stats["refused"].to_string().contains("gone from the store"),
            "{stats}"
        );
        b.unmount().unwrap();
        assert!(
            !store.path().join("a").exists(),
            "moved {moved}: nothing made where the array was"
        );
    }
}

/// A chunk written in mount B (staged, or still gathered by default) for an array that
/// mount A then replaced (`rm -rf` and made again, here with other shards) is not
/// stored into the new array: it is refused and named (`shardfs stats` `refused`). The
/// new array keeps only what was written to it. Before, B's chunk was packed into the
/// new array by the old layout (found by an adversarial tester: the new array could no
/// longer be read, or a value A had fsynced was replaced).
#[test]
fn a_chunk_written_for_an_array_another_mount_replaced_is_not_stored_in_the_new_one() {
    if !common::can_mount() {
        return;
    }
    let other = other_array_doc();
    for kernel_opens in [false, true] {
        let store = tempfile::tempdir().unwrap();
        fs::create_dir(store.path().join("a")).unwrap();
        fs::write(store.path().join("a/zarr.json"), array_doc()).unwrap();
        let (ma, a) = mount_unflushed(store.path());
        let (mb, b) = mount_unflushed_with(store.path(), kernel_opens);
        fs::create_dir_all(mb.path().join("a/c")).unwrap();
        write_close(&mb.path().join("a/c/1"), b"BBBB", false);
        fs::remove_dir_all(ma.path().join("a")).unwrap();
        fs::create_dir(ma.path().join("a")).unwrap();
        fs::write(ma.path().join("a/zarr.json"), &other).unwrap();
        fs::create_dir_all(ma.path().join("a/c")).unwrap();
        write_close(&ma.path().join("a/c/2"), b"AAAA", true);
        // B looks at the array again (its TTL passed, or its directory is opened anew)
        // and makes everything it holds durable.
        std::thread::sleep(Duration::from_millis(300));
        let _ = fs::read_dir(mb.path().join("a")).map(|d| d.count());
        let _ = fs::File::open(mb.path()).and_then(|f| f.sync_all());
        let stats: serde_json::Value =
            serde_json::from_slice(&fs::read(mb.path().join(".shardfs-stats")).unwrap()).unwrap();
        assert!(
            stats["refused"].to_string().contains("replaced")
                || stats["refused"].to_string().contains("another array"),
            "kernel_opens {kernel_opens}: {stats}"
        );
        b.unmount().unwrap();
        a.unmount().unwrap();
        let fresh = tempfile::tempdir().unwrap();
        let _c = Mount::new(store.path(), fresh.path(), &MountOptions::default()).unwrap();
        assert_eq!(fs::read(fresh.path().join("a/c/2")).unwrap(), b"AAAA");
        assert!(
            !fresh.path().join("a/c/1").exists(),
            "kernel_opens {kernel_opens}: B's chunk is not in the new array"
        );
    }
}

/// The same, where B holds the array's metadata unlinked (`rm a/zarr.json` in B before
/// its chunk) and A replaced it, its new metadata in the store or unlinked in turn: B's
/// chunk is refused and named, not packed into the new array by the old layout, and B
/// shows the new array once its TTL has passed. Before, a mount holding an array
/// unlinked flushed its chunks by the layout it held, whatever the store now had there,
/// and showed that layout until it ended (a reviewer's finding).
#[test]
fn a_chunk_written_into_an_unlinked_array_another_mount_replaced_is_not_stored_in_the_new_one() {
    if !common::can_mount() {
        return;
    }
    let other = other_array_doc();
    for unlinked_again in [false, true] {
        let store = tempfile::tempdir().unwrap();
        fs::create_dir(store.path().join("a")).unwrap();
        fs::write(store.path().join("a/zarr.json"), array_doc()).unwrap();
        let (ma, a) = mount_unflushed(store.path());
        let (mb, b) = mount_unflushed_with(store.path(), false);
        fs::create_dir_all(mb.path().join("a/c")).unwrap();
        fs::remove_file(mb.path().join("a/zarr.json")).unwrap();
        write_close(&mb.path().join("a/c/1"), b"BBBB", false);
        std::thread::sleep(Duration::from_millis(300));
        let st = std::process::Command::new("rm")
            .arg("-rf")
            .arg(ma.path().join("a"))
            .status()
            .unwrap();
        assert!(st.success());
        fs::create_dir(ma.path().join("a")).unwrap();
        fs::write(ma.path().join("a/zarr.json"), &other).unwrap();
        fs::create_dir_all(ma.path().join("a/c")).unwrap();
        write_close(&ma.path().join("a/c/2"), b"AAAA", true);
        if unlinked_again {
            fs::remove_file(ma.path().join("a/zarr.json")).unwrap();
        }
        flush(ma.path());
        let _ = fs::File::open(mb.path()).and_then(|f| f.sync_all());
        let stats: serde_json::Value =
            serde_json::from_slice(&fs::read(mb.path().join(".shardfs-stats")).unwrap()).unwrap();
        assert!(
            stats["refused"].to_string().contains("another array"),
            "unlinked again {unlinked_again}: {stats}"
        );
        if unlinked_again {
            // B shows the array as the document kept now describes it, once its TTL
            // (1 s with open_checks) has passed: A's chunk, by the new layout.
            std::thread::sleep(Duration::from_millis(1100));
            assert_eq!(fs::read(mb.path().join("a/c/2")).unwrap(), b"AAAA");
        }
        b.unmount().unwrap();
        a.unmount().unwrap();
        if unlinked_again {
            fs::rename(
                store.path().join("a/zarr.json.shardfs-unlinked"),
                store.path().join("a/zarr.json"),
            )
            .unwrap();
        }
        let fresh = tempfile::tempdir().unwrap();
        let _c = Mount::new(store.path(), fresh.path(), &MountOptions::default()).unwrap();
        assert_eq!(
            fs::read(fresh.path().join("a/c/2")).unwrap(),
            b"AAAA",
            "unlinked again {unlinked_again}"
        );
        assert!(
            !fresh.path().join("a/c/1").exists(),
            "unlinked again {unlinked_again}: B's chunk is not in the new array"
        );
    }
}

/// The other side of the two tests above: another mount changing only the array's
/// shape (a grow) replaces nothing. A chunk staged in B before A's grow is stored, in
/// the array as it is now.
#[test]
fn a_chunk_staged_before_another_mount_grew_the_array_is_stored() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    fs::create_dir(store.path().join("a")).unwrap();
    fs::write(store.path().join("a/zarr.json"), array_doc()).unwrap();
    let (ma, a) = mount_unflushed(store.path());
    let (mb, b) = mount_unflushed_with(store.path(), false);
    fs::create_dir_all(mb.path().join("a/c")).unwrap();
    write_close(&mb.path().join("a/c/1"), b"BBBB", false);
    let shown: serde_json::Value =
        serde_json::from_slice(&fs::read(ma.path().join("a/zarr.json")).unwrap()).unwrap();
    let mut grown = shown.clone();
    grown["shape"] = json!([128]);
    fs::write(
        ma.path().join("a/zarr.json"),
        serde_json::to_vec(&grown).unwrap(),
    )
    .unwrap();
    a.unmount().unwrap();
    flush(mb.path());
    let stats: serde_json::Value =
        serde_json::from_slice(&fs::read(mb.path().join(".shardfs-stats")).unwrap()).unwrap();
    assert_eq!(stats["refused"], json!([]), "{stats}");
    b.unmount().unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let _c = Mount::new(store.path(), fresh.path(), &MountOptions::default()).unwrap();
    let now: serde_json::Value =
        serde_json::from_slice(&fs::read(fresh.path().join("a/zarr.json")).unwrap()).unwrap();
    assert_eq!(now["shape"], json!([128]));
    assert_eq!(fs::read(fresh.path().join("a/c/1")).unwrap(), b"BBBB");
}
