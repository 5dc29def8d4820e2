//! Writes with `-o open_checks` (the daemon answers every open): what a close commits,
//! renames onto and of open files, a refused chunk made again.

use super::*;

/// With `open_checks`, the close of a descriptor opened only to read a chunk that
/// another descriptor is writing commits nothing and cannot fail: the writer's close
/// commits. Before, a reader's close committed the writer's bytes so far, and got
/// `EINVAL` for a cut-short uncompressed chunk (found by `tests/py/torn_read.py`).
#[test]
fn with_open_checks_a_readers_close_commits_nothing_of_a_writers_chunk() {
    use std::io::{Read, Write};
    if !common::can_mount() {
        return;
    }
    let store = uncompressed_array_u(64, 32);
    {
        let (mnt, m) = common::mount::mount_with(store.path(), &open_checks());
        std::fs::create_dir(mnt.path().join("u/c")).unwrap();
        let p = mnt.path().join("u/c/1");
        std::fs::write(&p, [5u8; 8]).unwrap();
        let mut w = std::fs::File::create(&p).unwrap();
        w.write_all(&[1u8; 4]).unwrap();
        let mut r = std::fs::File::open(&p).unwrap();
        let mut seen = Vec::new();
        r.read_to_end(&mut seen).unwrap();
        assert_eq!(seen, [1u8; 4], "the reader reads the bytes written so far");
        close_checked(r, "the reader's close");
        let stats: serde_json::Value =
            serde_json::from_slice(&std::fs::read(mnt.path().join(".shardfs-stats")).unwrap())
                .unwrap();
        assert_eq!(stats["refused"], serde_json::json!([]), "{stats}");
        w.write_all(&[2u8; 4]).unwrap();
        close_checked(w, "the writer's close");
        assert_eq!(std::fs::read(&p).unwrap(), [1, 1, 1, 1, 2, 2, 2, 2]);
        m.unmount().unwrap();
    }
    let (mnt, _m) = common::mount::mount_rw(store.path());
    assert_eq!(
        std::fs::read(mnt.path().join("u/c/1")).unwrap(),
        [1, 1, 1, 1, 2, 2, 2, 2]
    );
}

/// With `open_checks`, a rename onto a chunk that another descriptor has open for
/// writing replaces it, as on a plain directory: that descriptor's later writes, `fsync`
/// and close go to a file of no name, and the chunk keeps what the rename put there.
/// Before, the old descriptor's `fsync` or close stored its bytes at the name, and the
/// rename was undone.
#[test]
fn with_open_checks_a_rename_onto_a_chunk_open_for_writing_replaces_it() {
    use std::io::Write;
    if !common::can_mount() {
        return;
    }
    let store = zstd_array_z();
    let opts = open_checks();
    {
        let (mnt, m) = common::mount::mount_with(store.path(), &opts);
        std::fs::create_dir(mnt.path().join("z/c")).unwrap();
        for (key, sync) in [("z/c/0", true), ("z/c/2", false)] {
            let p = mnt.path().join(key);
            let mut old = std::fs::File::create(&p).unwrap();
            old.write_all(&[1u8; 100]).unwrap();
            let new = mnt.path().join("z/c/new");
            std::fs::write(&new, [2u8; 50]).unwrap();
            std::fs::rename(&new, &p).unwrap();
            old.write_all(&[3u8; 10]).unwrap();
            if sync {
                old.sync_all().unwrap();
            }
            close_checked(old, "the old descriptor's close");
            assert_eq!(std::fs::read(&p).unwrap(), [2u8; 50], "{key}");
        }
        m.unmount().unwrap();
    }
    let (mnt, _m) = common::mount::mount_with(store.path(), &opts);
    for key in ["z/c/0", "z/c/2"] {
        assert_eq!(
            std::fs::read(mnt.path().join(key)).unwrap(),
            [2u8; 50],
            "{key}"
        );
    }
    assert!(!mnt.path().join("z/c/new").exists());
}

/// With `open_checks`, a file of an array open for writing and renamed within the array
/// (a chunk to another key, a file of its own to a chunk key or another name) is
/// followed by its descriptor, as on any file system: what it writes after the rename,
/// its `fsync` and close land at the new name. Renamed out of the array, its later
/// writes are stored nowhere, and its `fsync` and close say so (`ESTALE`). Before,
/// writes after the rename went to a file of no name with every call returning 0.
#[test]
fn with_open_checks_an_open_file_renamed_in_its_array_is_written_at_its_new_name() {
    use std::io::Write;
    if !common::can_mount() {
        return;
    }
    let store = zstd_array_z();
    let opts = open_checks();
    let moves = [
        ("z/c/0", "z/c/1"),
        ("z/notes.txt", "z/c/2"),
        ("z/c/3", "z/moved.txt"),
        ("z/a.txt", "z/b.txt"),
    ];
    {
        let (mnt, m) = common::mount::mount_with(store.path(), &opts);
        std::fs::create_dir(mnt.path().join("z/c")).unwrap();
        for (from, to) in moves {
            let mut f = std::fs::File::create(mnt.path().join(from)).unwrap();
            f.write_all(b"part1-").unwrap();
            std::fs::rename(mnt.path().join(from), mnt.path().join(to)).unwrap();
            f.write_all(b"part2").unwrap();
            f.sync_all().unwrap();
            close_checked(f, &format!("{from} -> {to}: close"));
            assert_eq!(
                std::fs::read(mnt.path().join(to)).unwrap(),
                b"part1-part2",
                "{to}"
            );
            assert!(!mnt.path().join(from).exists(), "{from}");
        }
        // Out of the array: the descriptor cannot follow.
        let mut f = std::fs::File::create(mnt.path().join("z/out.txt")).unwrap();
        f.write_all(b"part1-").unwrap();
        std::fs::rename(mnt.path().join("z/out.txt"), mnt.path().join("out.txt")).unwrap();
        f.write_all(b"part2").unwrap();
        let e = f.sync_all().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
        drop(f);
        assert_eq!(
            std::fs::read(mnt.path().join("out.txt")).unwrap(),
            b"part1-"
        );
        m.unmount().unwrap();
    }
    let (mnt, _m) = common::mount::mount_with(store.path(), &opts);
    for (_, to) in moves {
        assert_eq!(
            std::fs::read(mnt.path().join(to)).unwrap(),
            b"part1-part2",
            "{to}"
        );
    }
}

/// With `open_checks`, a new chunk refused at its `fsync` (a length its uncompressed
/// array cannot have) leaves its name free: the writer's next `open(O_CREAT)` of it
/// makes the chunk. Before, the kernel still held the refused file's entry, the daemon
/// answered its open with `ENOENT`, and the chunk could not be made (found by the
/// reference test with `--open-checks`).
#[test]
fn with_open_checks_a_chunk_refused_at_its_fsync_can_be_made_again() {
    use std::io::Write;
    if !common::can_mount() {
        return;
    }
    let store = uncompressed_array_u(64, 32);
    let opts = open_checks();
    let (mnt, m) = common::mount::mount_with(store.path(), &opts);
    std::fs::create_dir_all(mnt.path().join("u/c")).unwrap();
    let p = mnt.path().join("u/c/1");
    let mut f = std::fs::File::create(&p).unwrap();
    f.write_all(&[9u8; 9]).unwrap();
    let e = f.sync_all().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    drop(f);
    let mut f = std::fs::File::create(&p).expect("the name is free again");
    f.write_all(&[7u8; 8]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(std::fs::read(&p).unwrap(), [7u8; 8]);
    m.unmount().unwrap();
    let (mnt, _m) = common::mount::mount_with(store.path(), &opts);
    assert_eq!(std::fs::read(mnt.path().join("u/c/1")).unwrap(), [7u8; 8]);
}
