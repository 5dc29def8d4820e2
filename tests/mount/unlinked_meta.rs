//! An array's metadata unlinked while its chunks stay: written back (changed, by a
//! later mount), the directory chmodded, renamed onto or moved meanwhile.

use super::*;

/// `rm z/zarr.json` and a changed document written back (`tar -x` of a newer archive,
/// `git checkout` of another version): the mount shows the new document at once, as the
/// store holds it. Before, it showed the old one until a remount (found by the
/// reference test's metadata-unlink ops).
#[test]
fn an_arrays_metadata_unlinked_and_written_back_changed_shows_the_new_one() {
    if !common::can_mount() {
        return;
    }
    let store = zstd_array_z();
    let (mnt, m) = common::mount::mount_rw(store.path());
    let json = mnt.path().join("z/zarr.json");
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    doc["attributes"] = serde_json::json!({"version": 2});
    std::fs::remove_file(&json).unwrap();
    std::fs::write(&json, serde_json::to_vec(&doc).unwrap()).unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(shown["attributes"], serde_json::json!({"version": 2}));
    m.unmount().unwrap();
}

/// `chmod` of an array's directory while its metadata is unlinked: `stat` shows the new
/// mode at once, as on a plain directory, and the store has it. Before, the mount showed
/// the mode of the unlink until the metadata came back, while the store had the new one
/// (found by the reference test, v3 seeds 4007 and 4106).
#[test]
fn an_arrays_directory_chmodded_while_its_metadata_is_gone_shows_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    if !common::can_mount() {
        return;
    }
    let store = zstd_array_z();
    let (mnt, m) = common::mount::mount_rw(store.path());
    let z = mnt.path().join("z");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    std::fs::remove_file(z.join("zarr.json")).unwrap();
    for want in [0o700, 0o750] {
        std::fs::set_permissions(&z, std::fs::Permissions::from_mode(want)).unwrap();
        assert_eq!(mode(&z), want, "shown at once");
        assert_eq!(mode(&store.path().join("z")), want, "stored");
    }
    m.unmount().unwrap();
    assert_eq!(mode(&store.path().join("z")), 0o750);
}

/// An empty directory renamed onto an array's directory that shows nothing (its
/// metadata unlinked, its chunks removed) replaces it, as on a plain directory (before,
/// `ENOTEMPTY`: the kept metadata was still in the store; found by an adversarial tester).
#[test]
fn an_empty_directory_renamed_onto_an_emptied_array_whose_metadata_is_gone_replaces_it() {
    if !common::can_mount() {
        return;
    }
    let store = zstd_array_z();
    let (mnt, m) = common::mount::mount_rw(store.path());
    let z = mnt.path().join("z");
    std::fs::create_dir(z.join("c")).unwrap();
    std::fs::write(z.join("c/0"), b"chunk").unwrap();
    std::fs::remove_file(z.join("zarr.json")).unwrap();
    std::fs::remove_file(z.join("c/0")).unwrap();
    std::fs::remove_dir(z.join("c")).unwrap();
    assert_eq!(std::fs::read_dir(&z).unwrap().count(), 0);
    std::fs::create_dir(mnt.path().join("y")).unwrap();
    std::fs::rename(mnt.path().join("y"), &z).unwrap();
    assert_eq!(std::fs::read_dir(&z).unwrap().count(), 0);
    m.unmount().unwrap();
    assert_eq!(
        common::files_under(&store.path().join("z")).len(),
        0,
        "nothing of shardfs's own left"
    );
}

/// An array's directory moved while its metadata is gone (`rm z/zarr.json; mv z y; mv
/// y z`, or away for good): the chunk files move with it, as on a plain directory, and
/// the metadata written back (at either name) has them all, also after a remount.
/// Before, the move let go of what the mount held of the array: the moved directory
/// showed the shard files at their keys, and the metadata written back took them in as
/// chunks, so the store held shards as chunks (found by the reference test's
/// metadata-unlink ops).
#[test]
fn an_array_moved_while_its_metadata_is_gone_keeps_every_chunk() {
    if !common::can_mount() {
        return;
    }
    let store = zstd_array_z();
    let chunk = |i: u8| vec![i; usize::from(i) + 1];
    {
        let (mnt, m) = common::mount::mount_rw(store.path());
        std::fs::create_dir(mnt.path().join("z/c")).unwrap();
        for i in 0..8 {
            std::fs::write(mnt.path().join(format!("z/c/{i}")), chunk(i)).unwrap();
        }
        m.unmount().unwrap();
    }
    let chunks_of = |dir: &Path| -> Vec<Vec<u8>> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        let keys: Vec<String> = (0..8).map(|i| i.to_string()).collect();
        assert_eq!(names, keys, "{}", dir.display());
        (0..8)
            .map(|i| std::fs::read(dir.join(i.to_string())).unwrap())
            .collect()
    };
    let mut all: Vec<Vec<u8>> = (0..8).map(chunk).collect();
    {
        let (mnt, m) = common::mount::mount_rw(store.path());
        let (z, y) = (mnt.path().join("z"), mnt.path().join("y"));
        let meta = std::fs::read(z.join("zarr.json")).unwrap();
        std::fs::remove_file(z.join("zarr.json")).unwrap();
        std::fs::rename(&z, &y).unwrap();
        assert_eq!(chunks_of(&y.join("c")), all, "moved away");
        std::fs::rename(&y, &z).unwrap();
        assert_eq!(chunks_of(&z.join("c")), all, "and back");
        std::fs::write(z.join("zarr.json"), &meta).unwrap();
        assert_eq!(chunks_of(&z.join("c")), all, "written back");
        std::fs::remove_file(z.join("zarr.json")).unwrap();
        std::fs::rename(&z, &y).unwrap();
        // A chunk written after the move, and fsynced, while the metadata is gone (before:
        // ESTALE at its fsync, and the unmount failed on it).
        let f = std::fs::File::create(y.join("c/2")).unwrap();
        drop(f);
        std::fs::write(y.join("c/2"), b"written after the move").unwrap();
        std::fs::File::open(y.join("c/2"))
            .unwrap()
            .sync_all()
            .unwrap();
        all[2] = b"written after the move".to_vec();
        assert_eq!(chunks_of(&y.join("c")), all, "before the metadata is back");
        std::fs::write(y.join("zarr.json"), &meta).unwrap();
        assert_eq!(chunks_of(&y.join("c")), all, "written back at the new name");
        m.unmount().unwrap();
    }
    let (mnt, _m) = common::mount::mount_rw(store.path());
    assert_eq!(chunks_of(&mnt.path().join("y/c")), all, "after a remount");
}

/// `rm z/zarr.json`, the mount ends, and a later mount writes the same `zarr.json` back
/// (a `tar -x` interrupted, `rm` now and `cp` later): the array has every chunk again.
/// Meanwhile the store holds no `zarr.json` (no Zarr reader sees an array there), a
/// read-only mount shows the shard files as they are, and a writable one shows the array
/// as the mount that unlinked its metadata did (its chunks, waiting for the metadata).
/// Before, a later mount showed the shard files, and the metadata written back took them
/// in as the chunks of a new array: shards stored as chunks, unreadable (found by an
/// adversarial tester).
#[test]
fn an_arrays_metadata_unlinked_and_written_back_by_a_later_mount_keeps_every_chunk() {
    if !common::can_mount() {
        return;
    }
    let store = zstd_array_z();
    let chunk = |i: u8| vec![i; usize::from(i) + 3];
    let names = common::names;
    let meta = {
        let (mnt, m) = common::mount::mount_rw(store.path());
        let z = mnt.path().join("z");
        std::fs::create_dir(z.join("c")).unwrap();
        for i in 0..8 {
            std::fs::write(z.join(format!("c/{i}")), chunk(i)).unwrap();
        }
        let meta = std::fs::read(z.join("zarr.json")).unwrap();
        std::fs::remove_file(z.join("zarr.json")).unwrap();
        m.unmount().unwrap();
        meta
    };
    assert!(!store.path().join("z/zarr.json").exists());
    // `verify` checks its shards with the document kept (before, it left them out).
    let report = shardfs::maint::verify(store.path(), false, false).unwrap();
    assert_eq!((report.arrays, report.shards_checked), (1, 2), "{report:?}");
    {
        let ro = MountOptions {
            read_only: true,
            ..MountOptions::default()
        };
        let (mnt, m) = common::mount::mount_with(store.path(), &ro);
        let c = mnt.path().join("z/c");
        assert_eq!(names(&c), ["0", "1"], "read-only: the shard files");
        m.unmount().unwrap();
    }
    let keys: Vec<String> = (0..8).map(|i| i.to_string()).collect();
    let (mnt, m) = common::mount::mount_rw(store.path());
    let z = mnt.path().join("z");
    assert_eq!(names(&z), ["c"], "no metadata, no file of shardfs's own");
    assert_eq!(names(&z.join("c")), keys, "the chunks");
    // shardfs's own file is not found, nor made by a link (before, it could be renamed
    // away, and the loss came back: found by an adversarial tester).
    let own = z.join("zarr.json.shardfs-unlinked");
    assert!(!own.exists());
    std::fs::write(mnt.path().join("notes.txt"), b"x").unwrap();
    assert!(std::fs::hard_link(mnt.path().join("notes.txt"), &own).is_err());
    std::fs::remove_file(mnt.path().join("notes.txt")).unwrap();
    // Its chunks written and removed meanwhile, as any array's (before the array was
    // known to the chunk paths: ESTALE, and nothing stored; found by a reviewer).
    let mut all: Vec<Option<Vec<u8>>> = (0..8).map(|i| Some(chunk(i))).collect();
    std::fs::write(z.join("c/2"), b"written meanwhile").unwrap();
    std::fs::File::open(z.join("c/2"))
        .unwrap()
        .sync_all()
        .unwrap();
    all[2] = Some(b"written meanwhile".to_vec());
    std::fs::remove_file(z.join("c/1")).unwrap();
    all[1] = None;
    std::fs::write(z.join("zarr.json"), &meta).unwrap();
    assert_eq!(names(&z), ["c", "zarr.json"]);
    let check = |z: &Path, when: &str| {
        for (i, want) in all.iter().enumerate() {
            match want {
                Some(b) => assert_eq!(
                    &std::fs::read(z.join(format!("c/{i}"))).unwrap(),
                    b,
                    "{when}"
                ),
                None => assert!(!z.join(format!("c/{i}")).exists(), "{when}"),
            }
        }
    };
    check(&z, "written back");
    m.unmount().unwrap();
    assert_eq!(
        common::files_under(&store.path().join("z"))
            .into_iter()
            .filter(|f| f.contains("shardfs"))
            .count(),
        0,
        "nothing of shardfs's own left"
    );
    let (mnt, m) = common::mount::mount_rw(store.path());
    let z = mnt.path().join("z");
    check(&z, "after a remount");
    // Unlinked again, and removed (`rm -rf`) by a later mount: nothing stays.
    std::fs::remove_file(z.join("zarr.json")).unwrap();
    m.unmount().unwrap();
    let (mnt, m) = common::mount::mount_rw(store.path());
    let st = std::process::Command::new("rm")
        .arg("-rf")
        .arg(mnt.path().join("z"))
        .status()
        .unwrap();
    assert!(st.success());
    m.unmount().unwrap();
    assert!(!store.path().join("z").exists(), "rm -rf emptied the store");
    // The kept document beside metadata written by another route (a tool writing the
    // store) goes when a writable mount meets that metadata: were it left, a later
    // unlink of that metadata would bring the old array back over other files (found by
    // a reviewer and an adversarial tester).
    let z = store.path().join("z");
    std::fs::create_dir(&z).unwrap();
    std::fs::write(z.join("zarr.json.shardfs-unlinked"), &meta).unwrap();
    // (kept at an unlink long before the metadata now there was written)
    std::fs::File::options()
        .write(true)
        .open(z.join("zarr.json.shardfs-unlinked"))
        .unwrap()
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(3600))
        .unwrap();
    std::fs::write(
        z.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "group"}"#,
    )
    .unwrap();
    let (mnt, m) = common::mount::mount_rw(store.path());
    assert_eq!(names(&mnt.path().join("z")), ["zarr.json"]);
    m.unmount().unwrap();
    assert!(!z.join("zarr.json.shardfs-unlinked").exists());
    // Only one older than that metadata: on object storage an unlink puts the kept
    // document before it deletes `zarr.json`, and a lookup between the two must not take
    // it (a reviewer's finding).
    std::fs::write(z.join("zarr.json.shardfs-unlinked"), &meta).unwrap();
    std::fs::File::options()
        .write(true)
        .open(z.join("zarr.json"))
        .unwrap()
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(3600))
        .unwrap();
    let (mnt, m) = common::mount::mount_rw(store.path());
    assert_eq!(names(&mnt.path().join("z")), ["zarr.json"]);
    m.unmount().unwrap();
    assert!(
        z.join("zarr.json.shardfs-unlinked").exists(),
        "a kept document newer than the metadata stays"
    );
}

/// `rm a/zarr.json` then the same `zarr.json` written again (what `tar -x`, `git
/// checkout` and `cp --remove-destination` do over an array): as on a plain directory,
/// the chunk files and files of its own stay while the metadata is gone, with their
/// bytes, and the array written back has them all, also after a remount. A chunk written
/// in place just before the unlink is stored with them. Before, the directory showed the
/// shard files at their keys once `zarr.json` was gone, and the metadata written back
/// made them the chunks of a new array (chunks lost, shards stored as chunks), a chunk
/// closed a moment before the unlink was never stored, and a file of its own vanished,
/// to come back over a newer one at unmount (found by an adversarial tester).
#[test]
fn an_arrays_metadata_unlinked_and_written_again_keeps_every_chunk() {
    use std::io::Write;
    if !common::can_mount() {
        return;
    }
    let store = zstd_array_z();
    let chunk = |i: u8| vec![i; usize::from(i) + 1];
    {
        let (mnt, m) = common::mount::mount_rw(store.path());
        std::fs::create_dir(mnt.path().join("z/c")).unwrap();
        for i in 0..8 {
            std::fs::write(mnt.path().join(format!("z/c/{i}")), chunk(i)).unwrap();
        }
        std::fs::write(mnt.path().join("z/notes.txt"), b"old notes").unwrap();
        m.unmount().unwrap();
    }
    let listing = |dir: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    let keys: Vec<String> = (0..8).map(|i| i.to_string()).collect();
    {
        let (mnt, m) = common::mount::mount_rw(store.path());
        let z = mnt.path().join("z");
        let meta = std::fs::read(z.join("zarr.json")).unwrap();
        // A chunk written in place, closed, and the metadata unlinked at once.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(z.join("c/3"))
            .unwrap();
        f.write_all(b"rewritten").unwrap();
        drop(f);
        std::fs::remove_file(z.join("zarr.json")).unwrap();
        assert!(!z.join("zarr.json").exists());
        assert_eq!(listing(&z.join("c")), keys, "the chunk files stay");
        assert_eq!(std::fs::read(z.join("c/3")).unwrap(), b"rewritten");
        assert_eq!(std::fs::read(z.join("c/5")).unwrap(), chunk(5));
        assert_eq!(std::fs::read(z.join("notes.txt")).unwrap(), b"old notes");
        std::fs::write(z.join("notes.txt"), b"new notes").unwrap();
        std::fs::File::open(z.join("notes.txt"))
            .unwrap()
            .sync_all()
            .unwrap();
        std::fs::write(z.join("zarr.json"), &meta).unwrap();
        assert_eq!(listing(&z.join("c")), keys);
        assert_eq!(std::fs::read(z.join("c/3")).unwrap(), b"rewritten");
        m.unmount().unwrap();
    }
    let (mnt, _m) = common::mount::mount_rw(store.path());
    let z = mnt.path().join("z");
    assert_eq!(listing(&z.join("c")), keys);
    for i in 0..8u8 {
        let want = if i == 3 {
            b"rewritten".to_vec()
        } else {
            chunk(i)
        };
        assert_eq!(
            std::fs::read(z.join(format!("c/{i}"))).unwrap(),
            want,
            "c/{i}"
        );
    }
    assert_eq!(std::fs::read(z.join("notes.txt")).unwrap(), b"new notes");
    assert!(z.join("zarr.json").exists());
}
