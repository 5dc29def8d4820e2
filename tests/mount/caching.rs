//! What a reader sees when: the kernel's caches (opens, pages, attributes, negative
//! entries) against changes made outside the mount, with and without `open_checks`.

use super::*;

/// Read `path` until it holds `after` (a change made elsewhere, seen once a 0.2 s TTL has
/// passed), at most 10 s; every read is `before` or `after`, never a mix.
fn wait_for_change(path: &Path, before: &[u8], after: &[u8]) {
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = std::fs::read(path).unwrap();
        assert!(got == before || got == after, "a mix of versions: {got:?}");
        if got == after {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the change was not seen 10 s after it was made (TTL 0.2 s)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A copy of the `zarr_basic` fixture, mounted; the mount is dropped (unmounted) first.
struct BasicMount {
    _mount: Mount,
    dir: tempfile::TempDir,
    store: PathBuf,
    _copy: tempfile::TempDir,
}

impl BasicMount {
    fn new(opts: &MountOptions) -> Self {
        Self::of("zarr_basic", opts)
    }

    /// A copy of fixture store `fixture`, mounted.
    fn of(fixture: &str, opts: &MountOptions) -> Self {
        let copy = common::store_copy(fixture);
        let store = copy.path().join("s");
        let dir = tempfile::tempdir().unwrap();
        BasicMount {
            _mount: Mount::new(&store, dir.path(), opts).unwrap(),
            dir,
            store,
            _copy: copy,
        }
    }
}

/// A read-only mount lets the kernel open files without asking the daemon (FUSE no-open):
/// no `FUSE_OPEN` per file, and a change made to the store outside the mount shows once
/// the attribute TTL has passed. With `open_checks`, every open asks the daemon again.
#[test]
fn read_only_mounts_open_in_the_kernel_and_see_outside_changes_after_the_ttl() {
    use std::time::Duration;
    if !common::can_mount() {
        return;
    }
    let key = "u16_default_sparse/c/1/1";
    let ro = MountOptions {
        ttl: Some(Duration::from_millis(200)),
        ..read_only()
    };
    let m = BasicMount::new(&ro);
    let (store, dir) = (m.store.clone(), &m.dir);
    let before = std::fs::read(dir.path().join(key)).unwrap();
    assert_eq!(before.len(), 24);
    for _ in 0..3 {
        assert_eq!(std::fs::read(dir.path().join(key)).unwrap(), before);
    }
    let s = stats_of(dir.path());
    assert_eq!(s["chunk_opens"], 0, "opens never reached the daemon: {s}");
    assert!(s["chunk_reads"].as_u64().unwrap() >= 1, "{s}");

    // Another writer changes the chunk before the read-only mount looks again.
    let after = vec![7u8; 24];
    write_elsewhere(&store, key, &after);
    wait_for_change(&dir.path().join(key), &before, &after);

    // With open checks, each open reaches the daemon.
    let checked = MountOptions {
        open_checks: true,
        ..read_only()
    };
    let dir2 = tempfile::tempdir().unwrap();
    let _m2 = Mount::new(&store, dir2.path(), &checked).unwrap();
    for _ in 0..3 {
        assert_eq!(std::fs::read(dir2.path().join(key)).unwrap(), after);
    }
    let s = stats_of(dir2.path());
    assert_eq!(s["chunk_opens"], 3, "{s}");
}

/// A writable mount with `open_checks` asks the daemon at every open (close-to-open;
/// docs/SEMANTICS.md, "Reads on a writable mount"), but the bytes of a chunk whose shard
/// is unchanged come from the kernel's page cache: opens reach the daemon, reads do not.
#[test]
fn a_writable_mount_with_open_checks_asks_at_every_open_and_reads_cached_pages() {
    if !common::can_mount() {
        return;
    }
    let key = "u16_default_sparse/c/1/1";
    let m = BasicMount::new(&open_checks());
    let dir = &m.dir;
    let first = std::fs::read(dir.path().join(key)).unwrap();
    assert_eq!(first.len(), 24);
    let before = stats_of(dir.path());
    for _ in 0..3 {
        assert_eq!(std::fs::read(dir.path().join(key)).unwrap(), first);
    }
    let after = stats_of(dir.path());
    let n = |s: &serde_json::Value, k: &str| s[k].as_u64().unwrap();
    assert_eq!(
        n(&after, "chunk_opens") - n(&before, "chunk_opens"),
        3,
        "every open asks: {before} -> {after}"
    );
    assert_eq!(
        n(&after, "chunk_reads"),
        n(&before, "chunk_reads"),
        "no read reached the daemon: {before} -> {after}"
    );
}

/// A writable mount with `kernel_opens` reads as a read-only mount does: the kernel
/// opens files itself (no request at open) and serves cached pages (no request at all),
/// and a change made outside the mount is seen once the attribute TTL has passed.
#[test]
fn a_writable_mount_reads_without_asking_and_sees_outside_changes_within_the_ttl() {
    use std::time::Duration;
    if !common::can_mount() {
        return;
    }
    let key = "u16_default_sparse/c/1/1";
    let opts = MountOptions {
        ttl: Some(Duration::from_millis(200)),
        ..MountOptions::default()
    };
    let m = BasicMount::new(&opts);
    let (store, dir) = (m.store.clone(), &m.dir);
    let first = std::fs::read(dir.path().join(key)).unwrap();
    assert_eq!(first.len(), 24);
    let before = stats_of(dir.path());
    for _ in 0..3 {
        assert_eq!(std::fs::read(dir.path().join(key)).unwrap(), first);
    }
    let after = stats_of(dir.path());
    assert_eq!(
        after["chunk_opens"], 0,
        "no open reached the daemon: {after}"
    );
    assert_eq!(
        after["chunk_reads"], before["chunk_reads"],
        "no read reached the daemon: {before} -> {after}"
    );

    let changed = vec![7u8; 24];
    write_elsewhere(&store, key, &changed);
    wait_for_change(&dir.path().join(key), &first, &changed);
}

/// A chunk that another program adds to a shard the mount has looked at (and found
/// missing) shows up within the negative-entry TTL (1 s), however long `--ttl` is: a
/// lookup that misses checks the shard on disk, and the kernel keeps the miss for at
/// most 1 s.
#[test]
fn a_chunk_added_outside_a_writable_mount_shows_up_within_a_second() {
    use std::time::{Duration, Instant};
    if !common::can_mount() {
        return;
    }
    // c/0/2 is empty, in a shard (c/0/1) that does not exist yet.
    let (present, missing) = ("u16_default_sparse/c/0/0", "u16_default_sparse/c/0/2");
    let opts = MountOptions {
        ttl: Some(Duration::from_secs(60)),
        ..MountOptions::default()
    };
    let m = BasicMount::new(&opts);
    let (store, dir) = (m.store.clone(), &m.dir);
    assert_eq!(std::fs::read(dir.path().join(present)).unwrap().len(), 24);
    let err = std::fs::metadata(dir.path().join(missing)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);

    let added: Vec<u8> = (100..124).collect();
    write_elsewhere(&store, missing, &added);
    let made = Instant::now();
    loop {
        match std::fs::read(dir.path().join(missing)) {
            Ok(got) => {
                assert_eq!(got, added);
                break;
            }
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}"),
        }
        assert!(
            made.elapsed() < Duration::from_secs(5),
            "the added chunk was not seen 5 s after it was made (negative TTL 1 s, --ttl 60 s)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        std::fs::read(dir.path().join(present)).unwrap().len(),
        24,
        "the chunk beside it still reads"
    );
}

/// A writable mount with `open_checks` checks a chunk at every open (close-to-open): a
/// chunk that another
/// writer made longer reads whole at the next open, even while the kernel still caches
/// the old size (a long TTL here).
#[test]
fn with_open_checks_an_open_sees_a_chunk_grown_outside_the_mount_whole_despite_cached_attributes() {
    use std::io::Read;
    use std::time::Duration;
    if !common::can_mount() {
        return;
    }
    // A compressed array: its chunks have lengths of their own (an uncompressed one's
    // are all of one length, and another is refused).
    let key = "inner_zstd/c/1/1";
    let opts = MountOptions {
        ttl: Some(Duration::from_secs(60)),
        ..open_checks()
    };
    let m = BasicMount::of("zarr_codecs", &opts);
    let (store, dir) = (m.store.clone(), &m.dir);
    let old = std::fs::read(dir.path().join(key)).unwrap().len() as u64;
    let grown: Vec<u8> = (0..2 * old).map(|i| i as u8).collect();
    write_elsewhere(&store, key, &grown);
    let mut got = Vec::new();
    assert_eq!(
        std::fs::metadata(dir.path().join(key)).unwrap().len(),
        old,
        "the kernel still has the old size (TTL 60 s)"
    );
    std::fs::File::open(dir.path().join(key))
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    assert_eq!(got, grown, "read stopped at the size the kernel had cached");
    assert_eq!(
        std::fs::metadata(dir.path().join(key)).unwrap().len(),
        2 * old,
        "stat after the open"
    );
}

/// An array's `zarr.json` changed in the store outside the mount (rewritten in place, then
/// replaced by a rename) is seen once the TTL has passed: the view compares it with the
/// one the array was read from and reads it again when it differs.
#[test]
fn an_array_metadata_changed_outside_the_mount_is_seen_after_the_ttl() {
    use std::time::{Duration, Instant};
    if !common::can_mount() {
        return;
    }
    let ro = MountOptions {
        ttl: Some(Duration::from_millis(200)),
        ..read_only()
    };
    let m = BasicMount::new(&ro);
    let shown = m.dir.path().join("u16_default_sparse/zarr.json");
    let stored = m.store.join("u16_default_sparse/zarr.json");
    let attrs = || -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&shown).unwrap()).unwrap();
        v["attributes"].clone()
    };
    assert!(attrs().get("note").is_none());
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&stored).unwrap()).unwrap();
    for (note, by_rename) in [("in place", false), ("renamed", true)] {
        doc["attributes"]["note"] = note.into();
        let bytes = serde_json::to_vec(&doc).unwrap();
        if by_rename {
            let tmp = stored.with_extension("tmp");
            std::fs::write(&tmp, &bytes).unwrap();
            std::fs::rename(&tmp, &stored).unwrap();
        } else {
            std::fs::write(&stored, &bytes).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while attrs()["note"] != note {
            assert!(
                Instant::now() < deadline,
                "{note}: not seen 10 s after the change (TTL 0.2 s)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
