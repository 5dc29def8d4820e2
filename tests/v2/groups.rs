//! Groups through the v2 view: OME-Zarr 0.4 tools on 0.5 images, consolidated metadata
//! (`.zmetadata`) made from the hierarchy, and a group's `.zgroup`, `.zattrs` and
//! `.zmetadata` unlinked and written again.

use super::*;

/// OME-Zarr 0.4 readers open a sharded OME-Zarr 0.5 image through the v2 view (ome-zarr
/// 0.10 with zarr 2: both levels, the label image, scales, axes, channels), and a 0.4
/// image with labels that ome-zarr 0.10 writes through a writable v2 view is stored as
/// 0.5, which ome-zarr-models validates and zarr-python 3 reads. A 0.5 plate opens as a
/// 0.4 plate, its wells side by side.
#[test]
fn ome_zarr_0_4_tools_read_and_write_0_5_images_through_the_v2_view() {
    if !common::can_mount() {
        return;
    }
    let (Some(py2), Some(py3)) = (
        common::venv_python(".venv-zarr2"),
        common::venv_python(".venv"),
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("image");
    let source = tmp.path().join("source.npz");
    ome(&py3, &["make", "--store", s(&store), "--out", s(&source)]);
    {
        let mnt = tempfile::tempdir().unwrap();
        let mount = Mount::new(&store, mnt.path(), &v2_options(true)).unwrap();
        let out = ome(
            &py2,
            &["read", "--mount", s(mnt.path()), "--want", s(&source)],
        );
        assert!(out.contains(" 15 passed"), "{out}");
        mount.unmount().unwrap();
    }
    // ome-zarr writes through fsspec: metadata and chunks written in place, metadata read
    // back at once. Also through a mount that lets the kernel open files (-o
    // kernel_opens), which hears of no close: what is written is committed at the write
    // that completes a document, when idle, and at unmount.
    for kernel_opens in [false, true] {
        let written = tmp.path().join(format!("written-{kernel_opens}"));
        std::fs::create_dir(&written).unwrap();
        let want = tmp.path().join(format!("written-{kernel_opens}.npz"));
        {
            let mnt = tempfile::tempdir().unwrap();
            let opts = MountOptions {
                open_checks: !kernel_opens,
                ..v2_options(false)
            };
            let mount = Mount::new(&written, mnt.path(), &opts).unwrap();
            ome(
                &py2,
                &["write", "--mount", s(mnt.path()), "--out", s(&want)],
            );
            mount.unmount().unwrap();
        }
        let out = ome(&py3, &["check", "--store", s(&written), "--want", s(&want)]);
        assert!(
            out.contains(" 11 passed"),
            "kernel opens {kernel_opens}: {out}"
        );
    }
    // High-content screening: a 0.5 plate of two wells opens as a 0.4 plate.
    let plate = tmp.path().join("plate");
    let fields = tmp.path().join("plate.npz");
    ome(
        &py3,
        &["make-plate", "--store", s(&plate), "--out", s(&fields)],
    );
    let mnt = tempfile::tempdir().unwrap();
    let mount = Mount::new(&plate, mnt.path(), &v2_options(true)).unwrap();
    let out = ome(
        &py2,
        &["read-plate", "--mount", s(mnt.path()), "--want", s(&fields)],
    );
    assert!(out.contains(" 4 passed"), "{out}");
    mount.unmount().unwrap();
}

/// The translation without Python, in the order zarr 2 does not use: a 0.4 image's group
/// attributes written before its array. The group is stored as 0.5, the array created
/// afterwards gets the axes as `dimension_names`, the v2 view shows 0.4 and the v3 view
/// shows the store's 0.5 unchanged.
#[test]
fn ome_zarr_attributes_before_the_arrays_and_the_v3_view_unchanged() {
    if !common::can_mount() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let attrs = serde_json::json!({
        "multiscales": [{
            "version": "0.4",
            "axes": [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}],
            "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1.0, 1.0]}]}]
        }],
        "mine": 1
    });
    let zarray = br#"{"zarr_format": 2, "shape": [8, 8], "chunks": [4, 4], "dtype": "<u2",
        "compressor": null, "fill_value": 0, "order": "C", "filters": null}"#;
    {
        let mnt = tempfile::tempdir().unwrap();
        let mount = Mount::new(&store, mnt.path(), &v2_options(false)).unwrap();
        let m = mnt.path();
        std::fs::create_dir(m.join("img")).unwrap();
        write_and_close(m.join("img/.zgroup"), br#"{"zarr_format": 2}"#).unwrap();
        write_and_close(m.join("img/.zattrs"), attrs.to_string()).unwrap();
        std::fs::create_dir(m.join("img/0")).unwrap();
        write_and_close(m.join("img/0/.zarray"), zarray).unwrap();
        write_and_close(m.join("img/0/0.0"), [7u8; 32]).unwrap();
        let shown: serde_json::Value =
            serde_json::from_slice(&std::fs::read(m.join("img/.zattrs")).unwrap()).unwrap();
        assert_eq!(shown, attrs, "the v2 view shows what was written");
        mount.unmount().unwrap();
    }
    let group = common::json_file(&store.join("img/zarr.json"));
    let stored = &group["attributes"];
    assert_eq!(stored["mine"], 1);
    assert_eq!(stored["ome"]["version"], "0.5");
    assert!(stored.get("multiscales").is_none(), "{stored}");
    assert!(
        stored["ome"]["multiscales"][0].get("version").is_none(),
        "{stored}"
    );
    assert_eq!(stored["ome"]["multiscales"][0]["datasets"][0]["path"], "0");
    let array = common::json_file(&store.join("img/0/zarr.json"));
    assert_eq!(array["dimension_names"], serde_json::json!(["y", "x"]));
    // The v3 view shows the store's 0.5 as it is.
    let mnt = tempfile::tempdir().unwrap();
    let opts = MountOptions {
        read_only: true,
        ..MountOptions::default()
    };
    let mount = Mount::new(&store, mnt.path(), &opts).unwrap();
    let v3 = common::json_file(&mnt.path().join("img/zarr.json"));
    assert_eq!(v3["attributes"], group["attributes"]);
    mount.unmount().unwrap();
}

/// `.zmetadata` (zarr 2's consolidated metadata) in the v2 view is made from the
/// hierarchy as it is now, for every group (issue 38): never stale, never stored. One
/// written through the view (directly, or as zarr 2 writes it: a temporary file renamed
/// onto the name) is accepted and let go; `rm -rf` of a group passes over it.
#[test]
fn consolidated_metadata_is_made_from_the_hierarchy() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let stale = br#"{"metadata": {".zgroup": {"zarr_format": 2}, "gone/.zarray": {}}, "zarr_consolidated_format": 1}"#;
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    {
        let mnt = tempfile::tempdir().unwrap();
        let mount = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
        let g = mnt.path().join("g");
        std::fs::create_dir(&g).unwrap();
        write_and_close(g.join(".zgroup"), br#"{"zarr_format": 2}"#).unwrap();
        std::fs::create_dir(g.join("a")).unwrap();
        write_and_close(
            g.join("a/.zarray"),
            br#"{"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<i2", "fill_value": null, "compressor": null, "filters": null, "order": "C"}"#,
        )
        .unwrap();
        // Written directly, and as zarr 2 writes it: both accepted, neither kept. Read
        // right after the direct write (zarr 2's `consolidate_metadata` re-reads it):
        // the document the view makes, whole (it read nothing for a second).
        write_and_close(g.join(".zmetadata"), stale).unwrap();
        let made = read(&g.join(".zmetadata"));
        assert!(made["metadata"].get("a/.zarray").is_some(), "{made}");
        write_and_close(g.join(".zmetadata.1234.partial"), stale).unwrap();
        std::fs::rename(g.join(".zmetadata.1234.partial"), g.join(".zmetadata")).unwrap();
        let names: Vec<String> = std::fs::read_dir(&g)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.contains(&".zmetadata".to_string()), "{names:?}");
        assert!(!names.iter().any(|n| n.ends_with(".partial")), "{names:?}");
        let made = read(&g.join(".zmetadata"));
        assert_eq!(made["zarr_consolidated_format"], 1);
        let meta = made["metadata"].as_object().unwrap();
        assert_eq!(meta[".zgroup"], serde_json::json!({"zarr_format": 2}));
        assert_eq!(meta["a/.zarray"]["shape"], serde_json::json!([4]));
        assert_eq!(
            meta["a/.zarray"],
            read(&g.join("a/.zarray")),
            "as its file reads"
        );
        assert!(
            !meta.contains_key("gone/.zarray"),
            "not what was written: {made}"
        );
        // Never stale: a change below shows at once.
        write_and_close(g.join("a/.zattrs"), br#"{"note": "later"}"#).unwrap();
        let made = read(&g.join(".zmetadata"));
        assert_eq!(made["metadata"]["a/.zattrs"]["note"], "later", "{made}");
        mount.unmount().unwrap();
    }
    assert!(!store.path().join("g/.zmetadata").exists(), "never stored");
    assert!(!store.path().join("g/.zmetadata.1234.partial").exists());
    assert_eq!(
        common::json_file(&store.path().join("g/zarr.json"))["node_type"],
        "group"
    );
    let mnt = tempfile::tempdir().unwrap();
    let mount = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
    let made = read(&mnt.path().join("g/.zmetadata"));
    assert_eq!(made["metadata"]["a/.zattrs"]["note"], "later", "{made}");
    let st = std::process::Command::new("rm")
        .arg("-rf")
        .arg(mnt.path().join("g"))
        .status()
        .unwrap();
    assert!(st.success());
    mount.unmount().unwrap();
    assert!(!store.path().join("g").exists(), "rm -rf emptied the store");
}

/// A group's `.zmetadata` unlinked is gone until made again, as on a plain directory: an
/// `O_EXCL` create then works, and so `tar -x` of a group over itself ends, and a rename
/// onto the name makes it too; it is the view's own again (made from the hierarchy, never
/// stored). Before, unlinking it changed nothing, and `tar -x` looped forever on
/// `EEXIST`, unlink, `EEXIST` (found by an adversarial tester).
#[test]
fn a_groups_zmetadata_unlinked_is_gone_until_made_again() {
    use std::os::unix::fs::OpenOptionsExt;
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let mount = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
    let g = mnt.path().join("g");
    std::fs::create_dir(&g).unwrap();
    write_and_close(g.join(".zgroup"), br#"{"zarr_format": 2}"#).unwrap();
    let names = || common::names(&g);
    let excl = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(g.join(".zmetadata"))
    };
    assert_eq!(names(), [".zattrs", ".zgroup", ".zmetadata"]);
    assert_eq!(
        excl().unwrap_err().kind(),
        std::io::ErrorKind::AlreadyExists
    );
    std::fs::remove_file(g.join(".zmetadata")).unwrap();
    assert_eq!(names(), [".zattrs", ".zgroup"], "gone");
    assert!(!g.join(".zmetadata").exists());
    // Made again by an `O_EXCL` create: the view's own again, what is written let go.
    std::io::Write::write_all(&mut excl().unwrap(), b"{}").unwrap();
    assert_eq!(names(), [".zattrs", ".zgroup", ".zmetadata"]);
    let made: serde_json::Value =
        serde_json::from_slice(&std::fs::read(g.join(".zmetadata")).unwrap()).unwrap();
    assert_eq!(made["zarr_consolidated_format"], 1, "{made}");
    // ... or by a rename onto it (zarr 2's `consolidate_metadata`).
    std::fs::remove_file(g.join(".zmetadata")).unwrap();
    write_and_close(g.join(".zmetadata.tmp"), b"{}").unwrap();
    std::fs::rename(g.join(".zmetadata.tmp"), g.join(".zmetadata")).unwrap();
    assert_eq!(names(), [".zattrs", ".zgroup", ".zmetadata"]);
    // `tar -x` of the group over itself ends, and changes nothing.
    let tar = store.path().join("g.tar");
    let st = std::process::Command::new("tar")
        .arg("-C")
        .arg(mnt.path())
        .arg("-cf")
        .arg(&tar)
        .arg("g")
        .status()
        .unwrap();
    assert!(st.success());
    let mut child = std::process::Command::new("tar")
        .arg("-C")
        .arg(mnt.path())
        .arg("-xf")
        .arg(&tar)
        .spawn()
        .unwrap();
    // (a generous bound, only so that a loop fails the test instead of hanging it)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.is_some_and(|s| s.success()), "tar -x: {status:?}");
    assert_eq!(names(), [".zattrs", ".zgroup", ".zmetadata"]);
    // Unlinked, then the group removed (`rm -rf` after it): it stays gone with the
    // `.zgroup` (before, the `.zgroup`'s unlink brought it back, and `rm -rf` said
    // ENOTEMPTY: found by an adversarial tester).
    std::fs::remove_file(g.join(".zmetadata")).unwrap();
    let st = std::process::Command::new("rm")
        .arg("-rf")
        .arg(&g)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(!g.exists());
    mount.unmount().unwrap();
    assert!(!store.path().join("g").exists(), "rm -rf emptied the store");
}

/// v2 view: a group's `.zgroup` unlinked leaves its `.zattrs`, as on a plain directory,
/// also for a later mount; a `.zattrs` written meanwhile is kept, and the `.zgroup`
/// written back makes the group again with those attributes. So `tar -x` of a group over
/// itself (its `.zattrs` first, then `.zgroup`: `EEXIST`, unlink, create) keeps them.
/// Before, the unlink took the attributes along and `tar` exited 0 (found by an
/// adversarial tester).
#[test]
fn a_groups_zgroup_unlinked_keeps_its_attributes() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let attrs = |g: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(g.join(".zattrs")).unwrap()).unwrap()
    };
    let names = common::names;
    let stored = |key: &str| -> serde_json::Value {
        common::json_file(&store.path().join("g/zarr.json"))["attributes"][key].clone()
    };
    {
        let mnt = tempfile::tempdir().unwrap();
        let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
        let g = mnt.path().join("g");
        std::fs::create_dir(&g).unwrap();
        write_and_close(g.join(".zgroup"), br#"{"zarr_format": 2}"#).unwrap();
        write_and_close(g.join(".zattrs"), br#"{"level": 1}"#).unwrap();
        // tar -x of the group over itself.
        let tar = store.path().join("../g.tar");
        let tar = tar.as_path();
        let run = |args: &[&str]| {
            let st = std::process::Command::new("tar")
                .args(args)
                .status()
                .unwrap();
            assert!(st.success(), "tar {args:?}");
        };
        run(&["-C", s(mnt.path()), "-cf", s(tar), "g/.zattrs", "g/.zgroup"]);
        run(&["-C", s(mnt.path()), "-xf", s(tar)]);
        std::fs::remove_file(tar).unwrap();
        assert_eq!(
            attrs(&g),
            serde_json::json!({"level": 1}),
            "tar -x kept them"
        );
        assert_eq!(stored("level"), 1);
        // `.zgroup` unlinked: `.zattrs` stays; one written meanwhile is kept.
        std::fs::remove_file(g.join(".zgroup")).unwrap();
        std::fs::remove_file(g.join(".zmetadata")).unwrap();
        assert_eq!(names(&g), [".zattrs"]);
        write_and_close(g.join(".zattrs"), br#"{"level": 2}"#).unwrap();
        assert_eq!(attrs(&g), serde_json::json!({"level": 2}));
        assert!(
            !store.path().join("g/zarr.json").exists(),
            "no group meanwhile"
        );
        m.unmount().unwrap();
    }
    let mnt = tempfile::tempdir().unwrap();
    let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
    let g = mnt.path().join("g");
    // (its `.zmetadata` too: the unlink of one is not stored, SEMANTICS `.zmetadata`)
    assert_eq!(names(&g), [".zattrs", ".zmetadata"], "a later mount");
    assert_eq!(attrs(&g), serde_json::json!({"level": 2}));
    write_and_close(g.join(".zgroup"), br#"{"zarr_format": 2}"#).unwrap();
    assert_eq!(names(&g), [".zattrs", ".zgroup", ".zmetadata"]);
    assert_eq!(
        attrs(&g),
        serde_json::json!({"level": 2}),
        "made again with them"
    );
    m.unmount().unwrap();
    assert_eq!(stored("level"), 2);
    assert_eq!(
        common::files_under(&store.path().join("g")),
        ["zarr.json".to_string()].into_iter().collect(),
        "nothing of shardfs's own left"
    );
}

/// v2 view: a group's `.zgroup` unlinked leaves its `.zmetadata` until that is
/// unlinked too (`rm -rf` lists the directory after `.zgroup`); the directory moved
/// meanwhile takes it along, as a plain directory would, and a new directory made at the
/// old name has none. Before, it stayed at the old path: the moved directory had no
/// `.zmetadata` and the new one showed it.
#[test]
fn a_zmetadata_left_by_its_zgroup_moves_with_its_directory() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
    let (g, g2) = (mnt.path().join("g"), mnt.path().join("g2"));
    std::fs::create_dir(&g).unwrap();
    std::fs::write(g.join(".zgroup"), br#"{"zarr_format": 2}"#).unwrap();
    assert!(
        g.join(".zmetadata").exists(),
        "a group of the v2 view has .zmetadata"
    );
    std::fs::remove_file(g.join(".zgroup")).unwrap();
    assert!(g.join(".zmetadata").exists(), "left by its .zgroup");
    std::fs::rename(&g, &g2).unwrap();
    assert!(g2.join(".zmetadata").exists(), "moved with its directory");
    std::fs::create_dir(&g).unwrap();
    let names: Vec<_> = std::fs::read_dir(&g)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        names.is_empty(),
        "a new directory at the old name is empty: {names:?}"
    );
    // Not empty while it shows .zmetadata (nothing of it is in the store): a directory
    // moved onto it is refused, as on a plain directory.
    let e = std::fs::rename(&g, &g2).expect_err("g2 is not empty");
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    assert!(g2.join(".zmetadata").exists());
    // And so is its rmdir, until the .zmetadata is unlinked (`rm -rf` unlinks it first).
    let e = std::fs::remove_dir(&g2).expect_err("g2 is not empty");
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    std::fs::remove_file(g2.join(".zmetadata")).unwrap();
    assert!(!g2.join(".zmetadata").exists(), "unlinked, gone");
    m.unmount().unwrap();
}

/// v2 view: the `.zattrs` of a group or of an unsharded array, unlinked, is gone until
/// written again (as for sharded arrays, above): `tar -x` and `cp --remove-destination`
/// (an `O_EXCL` create, `EEXIST`, unlink, create again) make it anew, and the attributes
/// written are kept, also after a remount. Before, the name stayed listed, reading
/// `{}`, and the create after the unlink was `EEXIST` again (found by the reference
/// test's metadata-unlink ops).
#[test]
fn a_groups_or_unsharded_arrays_zattrs_unlinked_is_gone_until_written_again() {
    use std::io::Write;
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let sub = store.path().join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(
        sub.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "group", "attributes": {"old": 1}}"#,
    )
    .unwrap();
    let plain = store.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    std::fs::write(
        plain.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
            "codecs": [{"name": "bytes"}], "attributes": {"old": 1}}"#,
    )
    .unwrap();
    let excl = |p: &Path| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(p)
    };
    let mnt = tempfile::tempdir().unwrap();
    let m = Mount::new(store.path(), mnt.path(), &v2_options(false)).unwrap();
    for dir in ["sub", "plain"] {
        let zattrs = mnt.path().join(dir).join(".zattrs");
        let e = excl(&zattrs).expect_err("shown");
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{dir}");
        std::fs::remove_file(&zattrs).unwrap();
        assert!(
            !zattrs.exists(),
            "{dir}: unlinked, gone until written again"
        );
        let names: Vec<String> = std::fs::read_dir(mnt.path().join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(!names.contains(&".zattrs".to_string()), "{dir}: {names:?}");
        excl(&zattrs).unwrap().write_all(br#"{"new": 2}"#).unwrap();
        let shown: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&zattrs).unwrap()).unwrap();
        assert_eq!(shown, serde_json::json!({"new": 2}), "{dir}");
    }
    m.unmount().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let _m = Mount::new(store.path(), mnt.path(), &v2_options(true)).unwrap();
    for dir in ["sub", "plain"] {
        let shown: serde_json::Value =
            serde_json::from_slice(&std::fs::read(mnt.path().join(dir).join(".zattrs")).unwrap())
                .unwrap();
        assert_eq!(
            shown,
            serde_json::json!({"new": 2}),
            "{dir} after a remount"
        );
    }
}
