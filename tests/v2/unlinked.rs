//! An array's `.zarray` or `.zattrs` unlinked while its chunks stay (sharded and
//! unsharded): what is held meanwhile, what outlives the mount, and the metadata written
//! back taking the chunks back.

use super::*;

/// An array copied into the v2 view file by file with `O_EXCL` creates, `.zarray` first
/// (GNU `tar -x` of an archive made from a listing of the view): `.zattrs`, which the
/// view shows once `.zarray` landed, is `EEXIST`; unlinked, it is gone until written
/// again, so the copier's next create makes it, and the attributes written are the
/// array's, also after a remount. Before, the unlink changed nothing visible and `tar`
/// retried forever (found by an adversarial tester).
#[test]
fn an_unlinked_zattrs_is_gone_until_written_again() {
    use std::io::Write;
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let zarray = common::ZARRAY_U1_4;
    let excl = |p: &Path| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(p)
    };
    for round in 0..2 {
        let mnt = tempfile::tempdir().unwrap();
        let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
        let a = mnt.path().join(format!("a{round}"));
        std::fs::create_dir(&a).unwrap();
        excl(&a.join(".zarray")).unwrap().write_all(zarray).unwrap();
        let zattrs = a.join(".zattrs");
        let e = excl(&zattrs).expect_err("the view shows .zattrs once .zarray landed");
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        std::fs::remove_file(&zattrs).unwrap();
        assert!(!zattrs.exists(), "unlinked: gone until written again");
        excl(&zattrs).unwrap().write_all(br#"{"u": 1}"#).unwrap();
        let shown: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&zattrs).unwrap()).unwrap();
        assert_eq!(shown, serde_json::json!({"u": 1}));
        m.unmount().unwrap();
    }
    let mnt = tempfile::tempdir().unwrap();
    let _m = Mount::new(store.path(), mnt.path(), &v2_options(true)).unwrap();
    for round in 0..2 {
        let shown: serde_json::Value = serde_json::from_slice(
            &std::fs::read(mnt.path().join(format!("a{round}/.zattrs"))).unwrap(),
        )
        .unwrap();
        assert_eq!(shown, serde_json::json!({"u": 1}), "a{round}");
    }
}

/// v2 view: an array's `.zattrs` unlinked, then a document cut short written at its name
/// and refused at its `fsync` (`EINVAL`): rolled back to none, as the store has none, so
/// the name is gone at once (not only from listings), and a whole document written next
/// is taken in. Before, the file stayed, unlisted, and `cat` read `{}` through the
/// kernel's entry until it expired (found by an adversarial tester).
#[test]
fn a_zattrs_unlinked_then_written_cut_short_is_gone_when_refused() {
    use std::io::Write;
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let zarray = common::ZARRAY_U1_4;
    let mnt = tempfile::tempdir().unwrap();
    let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
    let a = mnt.path().join("a");
    std::fs::create_dir(&a).unwrap();
    std::fs::write(a.join(".zarray"), zarray).unwrap();
    let zattrs = a.join(".zattrs");
    std::fs::remove_file(&zattrs).unwrap();
    let mut f = std::fs::File::create(&zattrs).unwrap();
    f.write_all(br#"{"a":"#).unwrap();
    let e = f.sync_all().expect_err("a document cut short is refused");
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    drop(f);
    let e = std::fs::read(&zattrs).expect_err("gone, as the store has none");
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    let names: Vec<String> = std::fs::read_dir(&a)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!names.contains(&".zattrs".to_string()), "{names:?}");
    std::fs::write(&zattrs, br#"{"b": 1}"#).unwrap();
    assert_eq!(std::fs::read(&zattrs).unwrap(), br#"{"b": 1}"#);
    m.unmount().unwrap();
}

/// v2 view, an unsharded array of the store: `.zarray` unlinked and written back (`tar
/// -x`, `cp --remove-destination`) keeps the array the store's, unsharded, its chunks
/// where they are: listed and read at their v2 names at once, and stored at the store's
/// keys, its attributes kept. Before, the array took the keys of the `.zarray` written
/// (no `c/`): its chunks were shown gone, zarr 2 read the fill value, and the store's
/// `c` showed beside the v2 names, until a remount; and its attributes were lost (found
/// by the reference test's metadata-unlink ops).
#[test]
fn an_unsharded_arrays_zarray_unlinked_and_written_back_keeps_its_chunks() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let a = store.path().join("plain");
    std::fs::create_dir_all(&a).unwrap();
    std::fs::write(
        a.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "array", "shape": [4, 4], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": [{"name": "bytes"}]}"#,
    )
    .unwrap();
    let chunk = |i: u8, j: u8| vec![10 * i + j + 1; 4];
    for i in 0..2u8 {
        for j in 0..2u8 {
            let dir = a.join(format!("c/{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(j.to_string()), chunk(i, j)).unwrap();
        }
    }
    let mnt = tempfile::tempdir().unwrap();
    let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
    let p = mnt.path().join("plain");
    let listing = || {
        let mut names: Vec<String> = std::fs::read_dir(&p)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(listing(), [".zarray", ".zattrs", "0", "1"]);
    let attrs = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p.join(".zattrs")).unwrap()).unwrap()
    };
    std::fs::write(p.join(".zattrs"), br#"{"k": 1}"#).unwrap();
    let zarray = std::fs::read(p.join(".zarray")).unwrap();
    std::fs::remove_file(p.join(".zarray")).unwrap();
    assert_eq!(listing(), [".zattrs", "0", "1"], "the other names stay");
    // Its attributes too (before: `{}`, and lost for good), and one written meanwhile
    // is kept with it (before: it made the directory a group's).
    assert_eq!(attrs(), serde_json::json!({"k": 1}));
    std::fs::write(p.join(".zattrs"), br#"{"k": 2}"#).unwrap();
    assert_eq!(attrs(), serde_json::json!({"k": 2}));
    // As written, and a file's mode (before: reformatted, and 0755 as the directory).
    assert_eq!(std::fs::read(p.join(".zattrs")).unwrap(), br#"{"k": 2}"#);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(p.join(".zattrs")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o111, 0, "{mode:o}");
    // Held until `.zarray` comes back, and stored meanwhile in the document kept at the
    // unlink (before, only in this mount's memory: lost if the mount ended first).
    let kept = a.join("zarr.json.shardfs-unlinked");
    let kept_doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&kept).unwrap()).unwrap();
    assert_eq!(kept_doc["attributes"], serde_json::json!({"k": 2}));
    std::fs::write(p.join(".zarray"), &zarray).unwrap();
    assert!(!kept.exists(), "stored with the .zarray");
    assert_eq!(attrs(), serde_json::json!({"k": 2}), "written back");
    assert_eq!(listing(), [".zarray", ".zattrs", "0", "1"], "written back");
    for i in 0..2u8 {
        for j in 0..2u8 {
            assert_eq!(
                std::fs::read(p.join(format!("{i}/{j}"))).unwrap(),
                chunk(i, j)
            );
        }
    }
    m.unmount().unwrap();
    for i in 0..2u8 {
        for j in 0..2u8 {
            assert_eq!(
                std::fs::read(a.join(format!("c/{i}/{j}"))).unwrap(),
                chunk(i, j),
                "stored where it was, unsharded"
            );
        }
    }
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("zarr.json")).unwrap()).unwrap();
    assert_eq!(doc["attributes"], serde_json::json!({"k": 2}));
    // `.zattrs` unlinked while `.zarray` is gone stays gone with it written back, as on
    // a plain directory, its attributes stored empty (before: shown again, and stored).
    let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
    std::fs::remove_file(p.join(".zarray")).unwrap();
    std::fs::remove_file(p.join(".zattrs")).unwrap();
    assert_eq!(listing(), ["0", "1"]);
    std::fs::write(p.join(".zarray"), &zarray).unwrap();
    assert_eq!(listing(), [".zarray", "0", "1"]);
    assert_eq!(std::fs::read(p.join("1/1")).unwrap(), chunk(1, 1));
    m.unmount().unwrap();
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("zarr.json")).unwrap()).unwrap();
    assert_eq!(doc["attributes"], serde_json::json!({}));
    // A `.zgroup` written there instead makes it a group, shown at once (before, stored
    // but not found until a remount: found by an adversarial tester).
    let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
    std::fs::remove_file(p.join(".zarray")).unwrap();
    std::fs::write(p.join(".zgroup"), br#"{"zarr_format": 2}"#).unwrap();
    assert!(
        listing().contains(&".zgroup".to_string()),
        "{:?}",
        listing()
    );
    assert_eq!(
        std::fs::read(p.join(".zgroup")).unwrap(),
        br#"{"zarr_format": 2}"#
    );
    m.unmount().unwrap();
}

/// v2 view, a sharded array: a `.zattrs` written while `.zarray` is unlinked is held with
/// the array (and stored in the document kept at the unlink), `.zarray` stays gone
/// meanwhile, and the
/// `.zarray` written back stores it; a `.zattrs` unlinked meanwhile stays gone with the
/// `.zarray` written back, its attributes stored empty. Before, a `.zattrs` written there
/// stored the old metadata again: `.zarray` was back, where a plain directory keeps it gone
/// (found by the reference test: `new-v2-zattrs-brings-back-zarray`).
#[test]
fn a_zattrs_written_while_a_sharded_arrays_zarray_is_unlinked_is_held_with_it() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let zarray = common::ZARRAY_U1_4;
    let mnt = tempfile::tempdir().unwrap();
    let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
    let a = mnt.path().join("a");
    std::fs::create_dir(&a).unwrap();
    std::fs::write(a.join(".zarray"), zarray).unwrap();
    std::fs::write(a.join("0"), [1u8, 2]).unwrap();
    std::fs::write(a.join("1"), [3u8, 4]).unwrap();
    let doc = std::fs::read_to_string(store.path().join("a/zarr.json")).unwrap();
    assert!(
        doc.contains("sharding_indexed"),
        "sharded in the store: {doc}"
    );
    let names = || common::names(&a);
    let attrs = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(a.join(".zattrs")).unwrap()).unwrap()
    };
    let shown = std::fs::read(a.join(".zarray")).unwrap();
    std::fs::remove_file(a.join(".zarray")).unwrap();
    std::fs::write(a.join(".zattrs"), br#"{"k": 1}"#).unwrap();
    assert_eq!(names(), [".zattrs", "0", "1"], ".zarray stays gone");
    // No group there: refused, not stored as a file of its own that the next mount
    // would not show (zarr 2's `open_group(mode="a")`; found by an adversarial tester).
    let e = std::fs::write(a.join(".zgroup"), br#"{"zarr_format": 2}"#).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    assert!(
        !store.path().join("a/zarr.json").exists(),
        "nothing stored meanwhile"
    );
    assert_eq!(attrs(), serde_json::json!({"k": 1}));
    // Stored at once, in the document kept at the unlink: nothing held only in memory.
    let kept: serde_json::Value = serde_json::from_slice(
        &std::fs::read(store.path().join("a/zarr.json.shardfs-unlinked")).unwrap(),
    )
    .unwrap();
    assert_eq!(kept["attributes"]["k"], 1, "in the kept document");
    std::fs::write(a.join(".zarray"), &shown).unwrap();
    assert_eq!(names(), [".zarray", ".zattrs", "0", "1"]);
    assert_eq!(attrs(), serde_json::json!({"k": 1}));
    let stored = |key: &str| -> serde_json::Value {
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(store.path().join("a/zarr.json")).unwrap())
                .unwrap();
        doc[key].clone()
    };
    assert_eq!(stored("attributes")["k"], 1, "stored with the .zarray");
    // Unlinked while `.zarray` is gone: gone with it written back, as on a plain directory.
    std::fs::remove_file(a.join(".zarray")).unwrap();
    std::fs::remove_file(a.join(".zattrs")).unwrap();
    assert_eq!(names(), ["0", "1"]);
    std::fs::write(a.join(".zarray"), &shown).unwrap();
    assert_eq!(names(), [".zarray", "0", "1"]);
    assert_eq!(std::fs::read(a.join("1")).unwrap(), [3, 4]);
    assert_eq!(stored("attributes").get("k"), None, "stored empty");
    // One written after both were unlinked (`.zattrs` first) is listed, and stored with
    // the `.zarray` written back (before, it stayed hidden, and zarr 2 wrote attributes
    // over it: found by an adversarial tester).
    std::fs::remove_file(a.join(".zarray")).unwrap();
    std::fs::write(a.join(".zattrs"), br#"{"y": 2}"#).unwrap();
    assert_eq!(names(), [".zattrs", "0", "1"]);
    std::fs::write(a.join(".zarray"), &shown).unwrap();
    assert_eq!(names(), [".zarray", ".zattrs", "0", "1"]);
    assert_eq!(attrs(), serde_json::json!({"y": 2}));
    m.unmount().unwrap();
    assert_eq!(stored("attributes")["y"], 2);
    let mnt = tempfile::tempdir().unwrap();
    let _m = Mount::new(store.path(), mnt.path(), &v2_options(true)).unwrap();
    assert_eq!(std::fs::read(mnt.path().join("a/0")).unwrap(), [1, 2]);
    assert_eq!(std::fs::read(mnt.path().join("a/1")).unwrap(), [3, 4]);
}

/// v2 view, an unsharded array of the store: `.zarray` unlinked by one mount (the
/// document kept under shardfs's own name, with a `.zattrs` written since) and written
/// back through a later one takes the chunks at the store's keys back, with the
/// attributes. Before, the document lived only in the first mount's memory: the later
/// mount showed a plain directory (the store's `c/...`), and the `.zarray` written back
/// made an array of the fill value, its chunks unread and its attributes lost.
#[test]
fn an_unsharded_arrays_zarray_unlinked_by_a_mount_is_taken_back_by_a_later_one() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let a = store.path().join("plain");
    std::fs::create_dir_all(a.join("c/1")).unwrap();
    std::fs::write(
        a.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {"x": 1}}"#,
    )
    .unwrap();
    std::fs::write(a.join("c/0"), [1u8, 2]).unwrap();
    std::fs::write(a.join("c/1/x.txt"), b"not a chunk").unwrap();
    let zarray = {
        let mnt = tempfile::tempdir().unwrap();
        let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
        let p = mnt.path().join("plain");
        let zarray = std::fs::read(p.join(".zarray")).unwrap();
        std::fs::remove_file(p.join(".zarray")).unwrap();
        std::fs::write(p.join(".zattrs"), br#"{"y": 2}"#).unwrap();
        m.unmount().unwrap();
        zarray
    };
    assert!(!a.join("zarr.json").exists(), "no metadata meanwhile");
    let mnt = tempfile::tempdir().unwrap();
    let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
    let p = mnt.path().join("plain");
    assert_eq!(common::names(&p), [".zattrs", "0", "1"], "a later mount");
    let attrs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(p.join(".zattrs")).unwrap()).unwrap();
    assert_eq!(attrs, serde_json::json!({"y": 2}));
    std::fs::write(p.join(".zarray"), &zarray).unwrap();
    assert_eq!(common::names(&p), [".zarray", ".zattrs", "0", "1"]);
    assert_eq!(std::fs::read(p.join("0")).unwrap(), [1, 2]);
    m.unmount().unwrap();
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("zarr.json")).unwrap()).unwrap();
    assert_eq!(doc["attributes"], serde_json::json!({"y": 2}));
    assert_eq!(doc["chunk_key_encoding"]["name"], "default", "{doc}");
    assert_eq!(std::fs::read(a.join("c/0")).unwrap(), [1, 2]);
    assert!(!a.join("zarr.json.shardfs-unlinked").exists());
}

/// v2 view: a `.zattrs` written (or unlinked) while a sharded array's `.zarray` is
/// unlinked is in the store when the mount ends: a later mount shows it, and the
/// `.zarray` written back there stores it. Before, it lived only in that mount's memory
/// (named by `shardfs unmount`, and lost).
#[test]
fn a_zattrs_written_while_a_sharded_arrays_zarray_is_unlinked_outlives_the_mount() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let zarray = common::ZARRAY_U1_4;
    let stored_attrs = || -> serde_json::Value {
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(store.path().join("a/zarr.json")).unwrap())
                .unwrap();
        doc["attributes"].clone()
    };
    let shown = {
        let mnt = tempfile::tempdir().unwrap();
        let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
        let a = mnt.path().join("a");
        std::fs::create_dir(&a).unwrap();
        std::fs::write(a.join(".zarray"), zarray).unwrap();
        std::fs::write(a.join("0"), [1u8, 2]).unwrap();
        let shown = std::fs::read(a.join(".zarray")).unwrap();
        std::fs::remove_file(a.join(".zarray")).unwrap();
        std::fs::write(a.join(".zattrs"), br#"{"k": 1}"#).unwrap();
        m.unmount().unwrap();
        shown
    };
    assert!(
        !store.path().join("a/zarr.json").exists(),
        ".zarray stays gone"
    );
    {
        let mnt = tempfile::tempdir().unwrap();
        let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
        let a = mnt.path().join("a");
        assert_eq!(common::names(&a), [".zattrs", "0"], "a later mount");
        let attrs: serde_json::Value =
            serde_json::from_slice(&std::fs::read(a.join(".zattrs")).unwrap()).unwrap();
        assert_eq!(attrs, serde_json::json!({"k": 1}), "a later mount");
        assert_eq!(std::fs::read(a.join("0")).unwrap(), [1, 2]);
        std::fs::write(a.join(".zarray"), &shown).unwrap();
        assert_eq!(
            stored_attrs()["k"],
            1,
            "stored with the .zarray written back"
        );
        // Unlinked, both: stored empty. A later mount shows an empty `.zattrs`, as the
        // v2 view shows one for every array at mount.
        std::fs::remove_file(a.join(".zarray")).unwrap();
        std::fs::remove_file(a.join(".zattrs")).unwrap();
        assert_eq!(common::names(&a), ["0"]);
        m.unmount().unwrap();
    }
    let mnt = tempfile::tempdir().unwrap();
    let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
    let a = mnt.path().join("a");
    assert_eq!(common::names(&a), [".zattrs", "0"], "a later mount");
    let attrs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join(".zattrs")).unwrap()).unwrap();
    assert_eq!(attrs, serde_json::json!({}));
    std::fs::write(a.join(".zarray"), &shown).unwrap();
    assert_eq!(common::names(&a), [".zarray", ".zattrs", "0"]);
    assert_eq!(std::fs::read(a.join("0")).unwrap(), [1, 2]);
    assert_eq!(stored_attrs().get("k"), None, "stored without them");
    m.unmount().unwrap();
}

/// v2 view: `.zarray` unlinked and written back (`tar -x`, `cp --remove-destination`):
/// the chunk files stay meanwhile, and the array written back has them, listed with its
/// `.zarray`, also after a remount. Before, `.zarray` written back stayed unlisted until
/// a remount.
#[test]
fn a_zarray_unlinked_and_written_back_keeps_the_chunks() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let zarray = common::ZARRAY_U1_4;
    {
        let mnt = tempfile::tempdir().unwrap();
        let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
        let a = mnt.path().join("a");
        std::fs::create_dir(&a).unwrap();
        std::fs::write(a.join(".zarray"), zarray).unwrap();
        std::fs::write(a.join("0"), [1u8, 2]).unwrap();
        std::fs::write(a.join("1"), [3u8, 4]).unwrap();
        m.unmount().unwrap();
    }
    let names = |a: &Path| {
        let mut n: Vec<String> = std::fs::read_dir(a)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        n.sort();
        n
    };
    {
        let mnt = tempfile::tempdir().unwrap();
        let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
        let a = mnt.path().join("a");
        let shown = std::fs::read(a.join(".zarray")).unwrap();
        std::fs::remove_file(a.join(".zarray")).unwrap();
        assert_eq!(names(&a), [".zattrs", "0", "1"]);
        assert_eq!(std::fs::read(a.join("1")).unwrap(), [3, 4]);
        std::fs::write(a.join(".zarray"), &shown).unwrap();
        assert_eq!(names(&a), [".zarray", ".zattrs", "0", "1"]);
        assert_eq!(std::fs::read(a.join("0")).unwrap(), [1, 2]);
        m.unmount().unwrap();
    }
    let mnt = tempfile::tempdir().unwrap();
    let _m = Mount::new(store.path(), mnt.path(), &v2_options(true)).unwrap();
    let a = mnt.path().join("a");
    assert_eq!(names(&a), [".zarray", ".zattrs", "0", "1"]);
    assert_eq!(std::fs::read(a.join("0")).unwrap(), [1, 2]);
    assert_eq!(std::fs::read(a.join("1")).unwrap(), [3, 4]);
}
