//! Writes through descriptors the kernel opened (the default writable mount): committed
//! at `fsync`, when idle and at unmount; files of their own kept; what no
//! request waits to hear of is named, never lost silently. Times set on such files are
//! `set_times.rs`.

use super::*;

/// What no request waits to hear of is not lost without a word. With the kernel opening
/// files, a chunk written through a descriptor opened before a shape shrink left its key
/// outside the grid is refused: its `fsync` returns `EINVAL`, and without one the idle
/// commit's refusal is kept in `shardfs stats` (`refused`); metadata written but not a
/// whole document is listed (`pending_metadata`), and the unmount refuses it. `shardfs
/// unmount` names both; the store keeps what it had.
#[test]
fn refusals_no_request_waits_for_are_named_at_unmount() {
    use std::os::unix::fs::FileExt;
    if !common::can_mount() {
        return;
    }
    let store = common::store_copy("zarr_basic");
    let root = store.path().join("s");
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    let mount = CliMount::logged(&root, &mnt, &dir.path().join("log"), &[]);
    let a = mnt.join("u16_default_sparse");
    let stored = |rel: &str| std::fs::read(root.join(rel)).unwrap();
    let before = stored("index_start/zarr.json");
    let open = |key: &str| {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(a.join(key))
            .unwrap();
        f.write_at(b"EARLY", 0).unwrap();
        f
    };
    let (synced, idle) = (open("c/4/1"), open("c/4/2"));
    // The shape shrinks from 18 rows (5 rows of chunks) to 8: chunk row 4 leaves the grid.
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join("zarr.json")).unwrap()).unwrap();
    doc["shape"][0] = 8.into();
    std::fs::write(a.join("zarr.json"), serde_json::to_vec(&doc).unwrap()).unwrap();
    synced.write_at(b"DATA", 0).unwrap();
    let err = synced.sync_all().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    idle.write_at(b"DATA", 0).unwrap();
    drop((synced, idle));
    // A document never finished: the unmount refuses it.
    std::fs::write(mnt.join("index_start/zarr.json"), b"{broken").unwrap();
    let stats = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(mnt.join(".shardfs-stats")).unwrap()).unwrap()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while stats()["refused"].as_array().unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no refusal: {}",
            stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let s = stats();
    assert_eq!(s["refused"].as_array().unwrap().len(), 1, "{s}");
    assert_eq!(s["refused"][0]["path"], "u16_default_sparse/c/4/2", "{s}");
    assert_eq!(
        s["pending_metadata"],
        serde_json::json!(["index_start/zarr.json"]),
        "{s}"
    );
    let err = mount.unmount().stderr;
    assert!(!is_mounted(&mnt));
    assert!(
        err.contains("u16_default_sparse/c/4/2 was refused"),
        "{err}"
    );
    assert!(
        err.contains("index_start/zarr.json was written but is not a whole JSON document"),
        "{err}"
    );
    assert_eq!(stored("index_start/zarr.json"), before);
    // Nothing of row 4 was stored: a mount of the grown array shows no such chunks.
    doc["shape"][0] = 18.into();
    std::fs::write(
        root.join("u16_default_sparse/zarr.json"),
        serde_json::to_vec(&doc).unwrap(),
    )
    .unwrap();
    let again = tempfile::tempdir().unwrap();
    let _m = Mount::new(&root, again.path(), &MountOptions::default()).unwrap();
    for key in ["c/4/1", "c/4/2"] {
        assert!(
            !again.path().join("u16_default_sparse").join(key).exists(),
            "{key}"
        );
    }
}

/// With `kernel_opens` the daemon hears of no close of a descriptor the kernel opened:
/// writes through one are seen at once by this mount, and committed at `fsync`, when
/// idle for [`shardfs::view::KERNEL_WRITE_IDLE`], or at unmount; nothing is lost.
#[test]
fn writes_through_descriptors_the_kernel_opened_are_committed_at_fsync_when_idle_and_at_unmount() {
    use std::fs::OpenOptions;
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    use std::time::{Duration, Instant};
    if !common::can_mount() {
        return;
    }
    let copy = common::store_copy("zarr_basic");
    let store = copy.path().join("s");
    let opts = MountOptions {
        // Flushes only when the test says (fsync, unmount).
        flush_interval: Duration::from_secs(3600),
        ..MountOptions::default()
    };
    let arr = "u16_default_sparse";
    let (idle, part, last) = (
        format!("{arr}/c/0/0"),
        format!("{arr}/c/1/0"),
        format!("{arr}/c/4/4"),
    );
    let mut expect_part;
    {
        let dir = tempfile::tempdir().unwrap();
        let m = Mount::new(&store, dir.path(), &opts).unwrap();
        let p = |k: &str| dir.path().join(k);
        let committed = |d: &Path| stats_of(d)["chunks_committed"].as_u64().unwrap();

        // A file created and unlinked while open (tempfile.TemporaryFile) outlives the
        // idle commit below: its descriptor still reads what was written to it.
        let tmp = p(&format!("{arr}/tmp-unlinked"));
        let mut unlinked = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .unwrap();
        std::fs::remove_file(&tmp).unwrap();
        unlinked.write_all(b"hello").unwrap();

        // Rewritten in place (O_TRUNC): this mount reads the new bytes at once.
        let c0 = committed(dir.path());
        let mut f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(p(&idle))
            .unwrap();
        f.write_all(&[7; 24]).unwrap();
        assert_eq!(std::fs::read(p(&idle)).unwrap(), [7; 24]);
        drop(f);
        // No close is heard of: the write is committed once it has been idle.
        let deadline = Instant::now() + Duration::from_secs(10);
        while committed(dir.path()) == c0 {
            assert!(
                Instant::now() < deadline,
                "not committed 10 s after its last write (idle limit {:?})",
                shardfs::view::KERNEL_WRITE_IDLE
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut back = [0; 5];
        unlinked.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(
            &back, b"hello",
            "an unlinked file read after the idle commit"
        );
        drop(unlinked);

        // Part of a chunk written in place: committed when fsync returns.
        expect_part = std::fs::read(p(&part)).unwrap();
        expect_part[4..6].copy_from_slice(&[9, 9]);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(p(&part))
            .unwrap();
        f.write_all_at(&[9, 9], 4).unwrap();
        let c1 = committed(dir.path());
        f.sync_all().unwrap();
        assert_eq!(committed(dir.path()), c1 + 1, "fsync committed the chunk");
        drop(f);
        assert_eq!(std::fs::read(p(&part)).unwrap(), expect_part);

        // A descriptor of a chunk unlinked and made again: the daemon holds no handle of
        // the old file (nothing was written to it), so writes through it fail, and never
        // reach the file that has its name now.
        let again = format!("{arr}/c/4/1");
        let old = OpenOptions::new().write(true).open(p(&again)).unwrap();
        std::fs::remove_file(p(&again)).unwrap();
        std::fs::write(p(&again), [3; 24]).unwrap();
        let err = old.write_all_at(&[4; 24], 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
        assert_eq!(std::fs::read(p(&again)).unwrap(), [3; 24]);
        drop(old);

        // Written in place and unmounted at once: the unmount commits it.
        let mut f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(p(&last))
            .unwrap();
        f.write_all(&[5; 24]).unwrap();
        drop(f);
        m.unmount().unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let _m = Mount::new(&store, dir.path(), &read_only()).unwrap();
    let p = |k: &str| dir.path().join(k);
    assert_eq!(std::fs::read(p(&idle)).unwrap(), [7; 24]);
    assert_eq!(std::fs::read(p(&part)).unwrap(), expect_part);
    assert_eq!(std::fs::read(p(&last)).unwrap(), [5; 24]);
    assert_eq!(std::fs::read(p(&format!("{arr}/c/4/1"))).unwrap(), [3; 24]);
}

/// Files written and unlinked through descriptors the kernel opened are kept for their
/// descriptors (10 min), but at most [`shardfs::view::KERNEL_UNLINKED_KEPT`] of them:
/// beyond, the oldest go at the idle commit. Before, a tool making and removing files
/// by the thousand held every one, growing the daemon for 10 minutes.
#[test]
fn files_unlinked_after_writes_are_kept_for_their_descriptors_within_a_bound() {
    use std::io::{Read, Seek, Write};
    if !common::can_mount() {
        return;
    }
    let store = uncompressed_array_u(1 << 20, 64);
    let (mnt, _m) = common::mount::mount_rw(store.path());
    let kept = shardfs::view::KERNEL_UNLINKED_KEPT;
    std::fs::create_dir(mnt.path().join("u/c")).unwrap();
    let stats = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(mnt.path().join(".shardfs-stats")).unwrap()).unwrap()
    };
    // An open of an existing file: the kernel's first, answered "open it yourself";
    // from then on it sends no open and no close of what it opens.
    std::fs::read(mnt.path().join("u/zarr.json")).unwrap();
    // Chunks of an array, and files of their own beside them.
    for i in 0..kept + 200 {
        for p in [format!("u/c/{i}"), format!("u/notes{i}")] {
            let p = mnt.path().join(p);
            std::fs::write(&p, [1u8; 8]).unwrap();
            std::fs::remove_file(&p).unwrap();
        }
    }
    // The newest, unlinked while open: kept, its descriptor reads it.
    let p = mnt.path().join("newest");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap();
    f.write_all(b"still here").unwrap();
    std::fs::remove_file(&p).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let held = stats()["kernel_write_handles"].as_u64().unwrap() as usize;
        if held <= kept {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{held} handles held, more than {kept}, 2 min on"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    f.rewind().unwrap();
    let mut back = String::new();
    f.read_to_string(&mut back).unwrap();
    assert_eq!(back, "still here");
}

/// Chunks written in place and renamed into place (zarr-python's temporary file) while
/// another thread `fsync`s the mount's root over and over (each `fsync` commits what the
/// kernel's descriptors left gathered): every chunk reads back, right away and after a
/// remount, as last written, and no rename fails. Before, a rename onto a chunk whose
/// earlier bytes another commit was staging could be followed by those bytes (the chunk
/// read, and was stored as, its previous version), and a rename of a temporary the
/// `fsync` was storing as a file of its own failed with `ENOENT` (found by an
/// adversarial tester; a few of each in 20,000 operations). A stress test: without the
/// fix it fails in most runs, not in every one; with it, never.
#[test]
fn chunks_renamed_into_place_while_the_root_is_fsynced_keep_their_new_bytes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    if !common::can_mount() {
        return;
    }
    let store = uncompressed_array_u(64, 32);
    let mut last = std::collections::BTreeMap::new();
    {
        let (mnt, m) = common::mount::mount_rw(store.path());
        // The kernel's first open: from now on it opens files itself.
        std::fs::read(mnt.path().join("u/zarr.json")).unwrap();
        let dir = mnt.path().join("u/c");
        std::fs::create_dir(&dir).unwrap();
        let stop = AtomicBool::new(false);
        let failures = std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    std::fs::File::open(mnt.path()).unwrap().sync_all().unwrap();
                }
            });
            let mut failures = Vec::new();
            for i in 0..6000u32 {
                let k = i % 8;
                let chunk = dir.join(k.to_string());
                let data = [(i % 251) as u8, (i / 251) as u8, 1, 2, 3, 4, 5, k as u8];
                let done = if i % 3 == 0 {
                    std::fs::write(&chunk, data)
                } else {
                    let tmp = dir.join(".t");
                    std::fs::write(&tmp, data)
                        .map_err(|e| std::io::Error::new(e.kind(), format!("write: {e}")))
                        .and_then(|()| {
                            std::fs::rename(&tmp, &chunk)
                                .map_err(|e| std::io::Error::new(e.kind(), format!("rename: {e}")))
                        })
                };
                if let Err(e) = done {
                    failures.push(format!("op {i}: {e}"));
                    continue;
                }
                last.insert(k, data);
                match std::fs::read(&chunk) {
                    Ok(got) if got == data => {}
                    got => failures.push(format!("op {i}: chunk {k} read {got:?}, not {data:?}")),
                }
            }
            stop.store(true, Ordering::Relaxed);
            failures
        });
        assert!(
            failures.is_empty(),
            "{} failures: {:?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
        m.unmount().unwrap();
    }
    let (mnt, _m) = common::mount::mount_rw(store.path());
    for (k, data) in last {
        assert_eq!(
            std::fs::read(mnt.path().join(format!("u/c/{k}"))).unwrap(),
            data,
            "chunk {k} after a remount"
        );
    }
}

/// An append to a whole uncompressed chunk whose writer closed it (unheard, with the
/// kernel opening files) is refused at its `fsync` (a length no chunk can have), and the
/// chunk keeps what its writer wrote: the earlier bytes are committed first, as that
/// close would have. Before, the refusal took the whole chunk along (`ENOENT` after),
/// though its close had returned 0 (found by the reference test on S3 and local stores).
#[test]
fn a_refused_append_to_a_chunk_keeps_what_its_writer_closed() {
    use std::io::Write;
    if !common::can_mount() {
        return;
    }
    let store = uncompressed_array_u(64, 32);
    {
        let (mnt, m) = common::mount::mount_rw(store.path());
        // The kernel's first open: from now on it opens files itself.
        std::fs::read(mnt.path().join("u/zarr.json")).unwrap();
        std::fs::create_dir(mnt.path().join("u/c")).unwrap();
        let p = mnt.path().join("u/c/1");
        std::fs::write(&p, [4u8; 8]).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"xyz").unwrap();
        let refused = f.sync_all().unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EINVAL), "{refused}");
        drop(f);
        assert_eq!(
            std::fs::read(&p).unwrap(),
            [4u8; 8],
            "what its writer closed"
        );
        m.unmount().unwrap();
    }
    let (mnt, _m) = common::mount::mount_rw(store.path());
    assert_eq!(std::fs::read(mnt.path().join("u/c/1")).unwrap(), [4u8; 8]);
}

/// A slow writer of an uncompressed chunk (one length only): what it wrote before a
/// pause longer than the idle commit's is not committed half written. The idle commit
/// once took the half, refused it (a length no chunk can have) and let its bytes go; the
/// writer's next write then landed on the stored chunk, and its `fsync` returned success
/// over a mix of old and new bytes (found by an adversarial tester). Now the half waits
/// for its writer (named by `shardfs stats` as `pending_chunks`); one never finished is
/// refused at unmount, and the store keeps the chunk it had.
#[test]
fn a_slow_writer_of_an_uncompressed_chunk_loses_nothing() {
    use std::io::Write;
    if !common::can_mount() {
        return;
    }
    let store = uncompressed_array_u(64, 32);
    let idle = shardfs::view::KERNEL_WRITE_IDLE;
    {
        let (mnt, m) = common::mount::mount_rw(store.path());
        let stats = || -> serde_json::Value {
            serde_json::from_slice(&std::fs::read(mnt.path().join(".shardfs-stats")).unwrap())
                .unwrap()
        };
        std::fs::create_dir(mnt.path().join("u/c")).unwrap();
        for key in ["u/c/1", "u/c/2"] {
            let p = mnt.path().join(key);
            std::fs::write(&p, [5u8; 8]).unwrap();
            std::fs::File::open(&p).unwrap().sync_all().unwrap();
        }
        // c/1: half, a pause, the other half, fsync.
        let p = mnt.path().join("u/c/1");
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(&[1u8; 4]).unwrap();
        std::thread::sleep(idle * 3);
        assert_eq!(stats()["pending_chunks"], serde_json::json!(["u/c/1"]));
        f.write_all(&[2u8; 4]).unwrap();
        f.sync_all().unwrap();
        drop(f);
        assert_eq!(std::fs::read(&p).unwrap(), [1, 1, 1, 1, 2, 2, 2, 2]);
        assert_eq!(stats()["pending_chunks"], serde_json::json!([]));
        // c/2: half, and its writer stops.
        let mut f = std::fs::File::create(mnt.path().join("u/c/2")).unwrap();
        f.write_all(&[3u8; 3]).unwrap();
        drop(f);
        std::thread::sleep(idle * 3);
        assert_eq!(stats()["pending_chunks"], serde_json::json!(["u/c/2"]));
        m.unmount().unwrap();
    }
    let (mnt, _m) = common::mount::mount_rw(store.path());
    assert_eq!(
        std::fs::read(mnt.path().join("u/c/1")).unwrap(),
        [1, 1, 1, 1, 2, 2, 2, 2],
        "the slow writer's chunk"
    );
    assert_eq!(
        std::fs::read(mnt.path().join("u/c/2")).unwrap(),
        [5u8; 8],
        "a chunk never finished: refused at unmount, the store keeps what it had"
    );
}

/// Files of their own in an array's directories, closed, fill the write buffer: the next
/// write stores them (their memory goes back to the buffer) and goes on, in both open
/// policies. Before, it was `ENOSPC` with the disk empty until the idle timer stored
/// them (`rsync` or `cp -r` of a directory of notes into an array's directory; found by
/// an adversarial tester).
#[test]
fn closed_files_of_their_own_make_room_in_a_full_write_buffer() {
    if !common::can_mount() {
        return;
    }
    for open_checks in [false, true] {
        let store = zstd_array_z();
        let opts = MountOptions {
            open_checks,
            write_buffer: 1 << 20,
            flush_interval: std::time::Duration::from_secs(600),
            write_behind: 0,
            ..MountOptions::default()
        };
        let file = |i: u32| vec![u8::try_from(i).unwrap(); 100_000];
        {
            let (mnt, m) = common::mount::mount_with(store.path(), &opts);
            for i in 0..30 {
                std::fs::write(mnt.path().join(format!("z/own{i}.bin")), file(i))
                    .unwrap_or_else(|e| panic!("own{i}.bin (open_checks {open_checks}): {e}"));
            }
            m.unmount().unwrap();
        }
        let (mnt, _m) = common::mount::mount_rw(store.path());
        for i in 0..30 {
            assert_eq!(
                std::fs::read(mnt.path().join(format!("z/own{i}.bin"))).unwrap(),
                file(i),
                "own{i}.bin"
            );
        }
    }
}

/// A write that lands metadata (the v2 view's `.zarray` of a new array, written in two
/// pieces as zarr 2 writes it through fsspec) waits for no invalidation of its own file.
/// The kernel holds that file's written pages locked until the reply, so such a wait
/// could only end at its bound (1 s): every new array made so cost a second, and every
/// invalidation queued behind it was late too (a loaded run of the reference test then
/// read `ESTALE` from a file that a refused write had left gone, as the `fsync`'s
/// invalidation of it came after the read). `shardfs stats` counts the replies that
/// stopped waiting (`invalidations_late`).
#[test]
fn a_write_that_lands_metadata_waits_for_no_invalidation_of_its_own_file() {
    use std::io::Write;
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    std::fs::write(
        store.path().join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "group"}"#,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = MountOptions {
        view: shardfs::view::ViewConfig {
            format: shardfs::view::ViewFormat::V2,
            ..Default::default()
        },
        ..MountOptions::default()
    };
    let mount = Mount::new(store.path(), dir.path(), &options).unwrap();
    let zarray = serde_json::to_vec(&serde_json::json!({
        "zarr_format": 2, "shape": [8, 8], "chunks": [4, 4], "dtype": "|u1",
        "compressor": null, "fill_value": 0, "order": "C", "filters": null,
        "dimension_separator": "."
    }))
    .unwrap();
    let (head, tail) = zarray.split_at(zarray.len() / 2);
    for i in 0..3 {
        let a = dir.path().join(format!("a{i}"));
        std::fs::create_dir(&a).unwrap();
        let mut f = std::fs::File::create(a.join(".zarray")).unwrap();
        f.write_all(head).unwrap();
        f.write_all(tail).unwrap();
        close_checked(f, ".zarray");
        assert!(
            store.path().join(format!("a{i}/zarr.json")).is_file(),
            "a{i} is an array in the store"
        );
        std::fs::write(a.join("0.0"), [7u8; 16]).unwrap();
    }
    let stats = stats_of(dir.path());
    assert_eq!(stats["invalidations_late"], 0, "{stats:#}");
    drop(mount);
    // Every array and chunk is in the store: a later mount reads them.
    let later = tempfile::tempdir().unwrap();
    let options = MountOptions {
        read_only: true,
        ..options
    };
    let _mount = Mount::new(store.path(), later.path(), &options).unwrap();
    for i in 0..3 {
        let chunk = later.path().join(format!("a{i}/0.0"));
        assert_eq!(
            std::fs::read(&chunk).unwrap(),
            [7u8; 16],
            "{}",
            chunk.display()
        );
    }
}
