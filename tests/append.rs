//! The crash-safe shard update (`write::append::apply`) and its recovery: round trips over
//! every index option, the states a `kill -9` (or a power cut) can leave behind and what
//! recovery makes of them, a real `kill -9` loop, and many threads and processes updating
//! one shard at once.
//!
//! The process tests re-run this test binary as a worker: `worker_process` does nothing
//! unless `SHARDFS_APPEND_WORKER` is set.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use shardfs::format::{self, Endian, IndexLocation, Location, Node, Presentation, ShardLayout};
use shardfs::maint;
use shardfs::store::LocalStore;
use shardfs::store::local::append::{CommitError, CommitOutcome, apply};
use shardfs::store::local::recover::{AppendRecord, Recovery, recover_shard, recover_store};
use shardfs::store::shard::Shard;

const SLOTS: usize = 16;
const SHARD: &str = "a/c/0";

/// A store holding one 1-d uint8 array `a` of 2 shards of 16 inner chunks each,
/// compressed (gzip), so that chunks of any length are what these tests write.
fn gzip_array_store(
    root: &Path,
    location: IndexLocation,
    crc32c: bool,
    endian: Endian,
) -> ShardLayout {
    let mut index_codecs = vec![json!({"name": "bytes", "configuration": {"endian":
        if endian == Endian::Big { "big" } else { "little" }}})];
    if crc32c {
        index_codecs.push(json!({"name": "crc32c"}));
    }
    let doc = common::sharded_u8_array(
        32,
        16,
        1,
        json!([{"name": "bytes"}, {"name": "gzip", "configuration": {"level": 1}}]),
        json!(index_codecs),
        if location == IndexLocation::Start {
            "start"
        } else {
            "end"
        },
    );
    std::fs::create_dir_all(root.join("a")).unwrap();
    std::fs::write(root.join("a/zarr.json"), serde_json::to_vec(&doc).unwrap()).unwrap();
    layout_of(root)
}

fn layout_of(root: &Path) -> ShardLayout {
    let bytes = std::fs::read(root.join("a/zarr.json")).unwrap();
    match format::metadata::parse(&bytes).unwrap() {
        Node::Array(a) => match a.presentation {
            Presentation::Sharded(l) => l,
            other => panic!("{other:?}"),
        },
        Node::Group => panic!("a group"),
    }
}

/// Apply writes (`Some`) and deletions (`None`) of slots.
fn put(root: &Path, layout: &ShardLayout, changes: &[(usize, Option<&[u8]>)]) -> CommitOutcome {
    try_put(root, layout, changes).unwrap()
}

fn try_put(
    root: &Path,
    layout: &ShardLayout,
    changes: &[(usize, Option<&[u8]>)],
) -> Result<CommitOutcome, CommitError> {
    apply(root, Path::new(SHARD), &layout.levels[0], changes)
}

/// Every slot's bytes as the read path sees them; panics on a corrupt shard.
fn read_all(root: &Path, layout: &ShardLayout) -> Vec<Option<Vec<u8>>> {
    let store = LocalStore::open(root).unwrap();
    let shard = Shard::load(&store, Path::new(SHARD), layout);
    shard.index().expect("shard reads");
    (0..SLOTS as u64)
        .map(|slot| {
            let loc = Location {
                shard: vec![0],
                slots: vec![slot],
            };
            let r = shard.chunk(layout, &loc).unwrap()?;
            Some(shard.read(r, 0, r.nbytes as u32).unwrap())
        })
        .collect()
}

fn shard_bytes(root: &Path) -> Option<Vec<u8>> {
    std::fs::read(root.join(SHARD)).ok()
}

fn assert_clean(root: &Path) {
    let report = maint::verify(root, false, false).unwrap();
    assert!(report.is_clean(), "{report}");
    let leftovers: Vec<_> = std::fs::read_dir(root.join("a/c"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("shardfs"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

const OPTIONS: [(IndexLocation, bool, Endian); 4] = [
    (IndexLocation::End, true, Endian::Little),
    (IndexLocation::End, false, Endian::Big),
    (IndexLocation::Start, true, Endian::Big),
    (IndexLocation::Start, false, Endian::Little),
];

#[test]
fn updates_round_trip_with_every_index_option() {
    for (location, crc, endian) in OPTIONS {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let layout = gzip_array_store(root, location, crc, endian);
        let created = put(
            root,
            &layout,
            &[(0, Some(b"zero")), (1, Some(b"one")), (5, Some(b""))],
        );
        assert!(created.rewritten && !created.removed);
        let old = shard_bytes(root).unwrap();
        let out = put(
            root,
            &layout,
            &[
                (1, Some(b"ONE!")),
                (2, Some(b"two")),
                (2, Some(b"TWO")),
                (0, None),
                (15, Some(b"f")),
            ],
        );
        let got = read_all(root, &layout);
        let mut want: Vec<Option<Vec<u8>>> = vec![None; SLOTS];
        want[1] = Some(b"ONE!".to_vec());
        want[2] = Some(b"TWO".to_vec()); // the later update of a slot wins
        want[5] = Some(Vec::new());
        want[15] = Some(b"f".to_vec());
        assert_eq!(got, want, "{location:?} crc {crc} {endian:?}");
        let new = shard_bytes(root).unwrap();
        assert_eq!(out.new_len, new.len() as u64);
        assert_eq!(out.old_len, old.len() as u64);
        let index_len = layout.levels[0].index_len();
        match location {
            IndexLocation::End => {
                // Append-only: the old file is a byte-identical prefix of the new one.
                assert!(!out.rewritten);
                assert_eq!(&new[..old.len()], &old[..]);
                assert_eq!(out.bytes_written, new.len() as u64 - old.len() as u64);
            }
            IndexLocation::Start => {
                assert!(out.rewritten);
                assert_eq!(new.len() as u64, out.index.live_bytes() + index_len);
            }
        }
        assert_clean(root);
    }
}

#[test]
fn deleting_the_last_chunk_removes_the_shard() {
    for (location, crc, endian) in OPTIONS {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let layout = gzip_array_store(root, location, crc, endian);
        put(root, &layout, &[(3, Some(b"three")), (4, Some(b"four"))]);
        put(root, &layout, &[(3, None)]);
        assert!(shard_bytes(root).is_some());
        let out = put(root, &layout, &[(4, None)]);
        assert!(out.removed && out.new_len == 0 && out.index.stored() == 0);
        assert!(shard_bytes(root).is_none());
        assert_clean(root);
        // Deleting from a shard that does not exist creates nothing.
        let out = put(root, &layout, &[(4, None)]);
        assert!(out.removed && out.bytes_written == 0);
        assert!(!root.join("a/c/0").exists());
    }
}

#[test]
fn a_corrupt_shard_is_refused_and_left_byte_identical() {
    for (location, crc, endian) in OPTIONS {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let layout = gzip_array_store(root, location, crc, endian);
        put(root, &layout, &[(0, Some(b"data"))]);
        let path = root.join(SHARD);
        let mut bytes = std::fs::read(&path).unwrap();
        // Slot 0's nbytes word becomes huge: out of range with or without a checksum.
        let at = match location {
            IndexLocation::Start => 8,
            IndexLocation::End => bytes.len() - layout.levels[0].index_len() as usize + 8,
        };
        bytes[at..at + 8].copy_from_slice(&[0x7f; 8]);
        std::fs::write(&path, &bytes).unwrap();
        let err = try_put(root, &layout, &[(1, Some(b"more"))]).unwrap_err();
        assert!(matches!(err, CommitError::Corrupt { .. }), "{err}");
        assert_eq!(err.errno(), libc::EIO);
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        let names: Vec<_> = std::fs::read_dir(root.join("a/c")).unwrap().collect();
        assert_eq!(names.len(), 1, "no record or temp file is left");
    }
}

/// A deterministic byte source for picking cut points.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// An append's before and after: the old shard, the new one, and the record it writes.
struct Append {
    old: Vec<u8>,
    new: Vec<u8>,
    record: [u8; 40],
}

fn one_append(location: IndexLocation, crc: bool) -> (tempfile::TempDir, ShardLayout, Append) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let layout = gzip_array_store(root, location, crc, Endian::Little);
    put(
        root,
        &layout,
        &[(0, Some(b"old zero")), (7, Some(b"old seven"))],
    );
    let old = shard_bytes(root).unwrap();
    // The real append, in a copy; its result is the state a finished append leaves.
    let copy = tempfile::tempdir().unwrap();
    gzip_array_store(copy.path(), location, crc, Endian::Little);
    std::fs::create_dir_all(copy.path().join("a/c")).unwrap();
    std::fs::write(copy.path().join(SHARD), &old).unwrap();
    put(
        copy.path(),
        &layout,
        &[(7, Some(b"new seven!")), (9, Some(b"nine"))],
    );
    let new = shard_bytes(copy.path()).unwrap();
    let record = AppendRecord {
        old_len: old.len() as u64,
        new_len: new.len() as u64,
        tail_crc: crc32c::crc32c(&new[old.len()..]),
    }
    .encode();
    (dir, layout, Append { old, new, record })
}

/// Lay down `shard`, `record` and `temp` as a crash left them, recover, and check that the
/// shard is exactly `want` (read, verified) and that recovery did `did`.
fn crash_and_recover(
    root: &Path,
    layout: &ShardLayout,
    shard: Option<&[u8]>,
    record: Option<&[u8]>,
    temp: Option<&[u8]>,
    want: Option<&[u8]>,
    did: &dyn Fn(&Recovery) -> bool,
) {
    let path = root.join(SHARD);
    let _ = std::fs::remove_file(&path);
    if let Some(s) = shard {
        std::fs::write(&path, s).unwrap();
    }
    if let Some(r) = record {
        std::fs::write(root.join("a/c/0.shardfs-append"), r).unwrap();
    }
    if let Some(t) = temp {
        std::fs::write(root.join("a/c/0.shardfs-tmp"), t).unwrap();
    }
    let done = recover_store(root).unwrap();
    assert!(done.iter().all(|(p, _)| p == Path::new(SHARD)), "{done:?}");
    assert!(done.iter().any(|(_, r)| did(r)), "{done:?}");
    assert_eq!(shard_bytes(root).as_deref(), want);
    if want.is_some() {
        read_all(root, layout);
    }
    assert_clean(root);
    assert!(
        recover_store(root).unwrap().is_empty(),
        "recovery is idempotent"
    );
}

#[test]
fn recovery_restores_the_old_or_the_new_state_after_any_append_crash() {
    for crc in [true, false] {
        let (dir, layout, a) = one_append(IndexLocation::End, crc);
        let root = dir.path();
        let (old, new, rec) = (&a.old[..], &a.new[..], &a.record[..]);
        let index_start = new.len() - layout.levels[0].index_len() as usize;
        let rolled = |r: &Recovery| matches!(r, Recovery::RolledBack { .. });
        // Record durable, shard not yet touched.
        crash_and_recover(
            root,
            &layout,
            Some(old),
            Some(rec),
            None,
            Some(old),
            &rolled,
        );
        // Record durable, the append cut anywhere: in the chunk bytes, in the index.
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut cuts = vec![old.len() + 1, index_start, index_start + 1, new.len() - 1];
        cuts.extend(
            (0..12).map(|_| old.len() + 1 + rng.below((new.len() - old.len() - 1) as u64) as usize),
        );
        for cut in cuts {
            crash_and_recover(
                root,
                &layout,
                Some(&new[..cut]),
                Some(rec),
                None,
                Some(old),
                &rolled,
            );
        }
        // The whole tail written but garbage on disk (power cut before fsync completed).
        let mut garbled = new.to_vec();
        garbled[old.len() + 2] ^= 0xff;
        crash_and_recover(
            root,
            &layout,
            Some(&garbled),
            Some(rec),
            None,
            Some(old),
            &rolled,
        );
        // Append complete and fsynced, record not yet removed.
        let completed = |r: &Recovery| matches!(r, Recovery::Completed { .. });
        crash_and_recover(
            root,
            &layout,
            Some(new),
            Some(rec),
            None,
            Some(new),
            &completed,
        );
        // The record itself torn: the shard was never touched.
        let torn = |r: &Recovery| *r == Recovery::TornRecord;
        for cut in [0, 1, 15, 16, 30, 39] {
            crash_and_recover(
                root,
                &layout,
                Some(old),
                Some(&rec[..cut]),
                None,
                Some(old),
                &torn,
            );
        }
        let mut flipped = a.record;
        flipped[20] ^= 1;
        crash_and_recover(
            root,
            &layout,
            Some(old),
            Some(&flipped),
            None,
            Some(old),
            &torn,
        );
        // A shard someone else shortened: left alone, record dropped.
        let short = &old[..old.len() - 1];
        std::fs::write(root.join(SHARD), short).unwrap();
        std::fs::write(root.join("a/c/0.shardfs-append"), rec).unwrap();
        let done = recover_store(root).unwrap();
        assert!(
            matches!(done[..], [(_, Recovery::Stale { .. })]),
            "{done:?}"
        );
        assert_eq!(shard_bytes(root).unwrap(), short);
        assert!(!root.join("a/c/0.shardfs-append").exists());
        // The next update after a crash recovers first and then succeeds.
        std::fs::write(root.join(SHARD), &new[..index_start + 3]).unwrap();
        std::fs::write(root.join("a/c/0.shardfs-append"), rec).unwrap();
        let out = put(root, &layout, &[(1, Some(b"after"))]);
        assert!(
            matches!(out.recovered[..], [Recovery::RolledBack { .. }]),
            "{out:?}"
        );
        assert_eq!(&shard_bytes(root).unwrap()[..old.len()], old);
        assert_eq!(read_all(root, &layout)[1].as_deref(), Some(&b"after"[..]));
        assert_clean(root);
    }
}

#[test]
fn recovery_removes_the_temp_file_of_an_unfinished_rewrite() {
    for location in [IndexLocation::Start, IndexLocation::End] {
        let (dir, layout, a) = one_append(location, true);
        let root = dir.path();
        let temp = |r: &Recovery| *r == Recovery::RemovedTemp;
        // The old shard stays whatever the temp file holds.
        let old = &a.old[..];
        for t in [&b""[..], &a.new[..a.new.len() / 2], &a.new[..]] {
            crash_and_recover(root, &layout, Some(old), None, Some(t), Some(old), &temp);
        }
        // A new shard that never got renamed into place does not exist.
        crash_and_recover(root, &layout, None, None, Some(&a.new), None, &temp);
        assert!(recover_shard(root, Path::new(SHARD)).unwrap().is_empty());
    }
}

// ---- processes ----------------------------------------------------------------------

const WORKER_ENV: &str = "SHARDFS_APPEND_WORKER";

/// Start this test binary as a worker: `mode` `slots` `iterations` against `root`.
fn spawn_worker(root: &Path, mode: &str, slots: &[usize], iterations: usize) -> Child {
    let slots: Vec<String> = slots.iter().map(usize::to_string).collect();
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "worker_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            WORKER_ENV,
            format!("{mode} {} {iterations} {}", slots.join(","), root.display()),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// Bytes of the `i`th write of `slot` by a worker: distinct per write, varying length.
fn version(slot: usize, i: usize) -> Vec<u8> {
    format!("slot {slot} write {i} {}", "#".repeat(i % 13)).into_bytes()
}

/// The worker side: does nothing in a normal test run.
#[test]
fn worker_process() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return;
    };
    let mut parts = spec.splitn(4, ' ');
    let (mode, slots, iterations) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let root = PathBuf::from(parts.next().unwrap());
    let slots: Vec<usize> = slots.split(',').map(|s| s.parse().unwrap()).collect();
    let iterations: usize = iterations.parse().unwrap();
    let layout = layout_of(&root);
    match mode {
        // Each iteration writes every slot of this worker in one update.
        "writer" => {
            for i in 0..iterations {
                let data: Vec<Vec<u8>> = slots.iter().map(|&s| version(s, i)).collect();
                let changes: Vec<(usize, Option<&[u8]>)> = slots
                    .iter()
                    .zip(&data)
                    .map(|(&s, d)| (s, Some(&d[..])))
                    .collect();
                put(&root, &layout, &changes);
            }
        }
        other => panic!("unknown worker mode {other}"),
    }
}

/// Writers on disjoint slots of one shard, `threads` threads here and `processes`
/// workers; afterwards every slot holds its writer's last bytes.
fn hammer(location: IndexLocation, threads: usize, processes: usize, iterations: usize) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let layout = gzip_array_store(&root, location, true, Endian::Little);
    let owners = threads + processes;
    let slots_of = |w: usize| (0..SLOTS).filter(|s| s % owners == w).collect::<Vec<_>>();
    let children: Vec<Child> = (0..processes)
        .map(|p| spawn_worker(&root, "writer", &slots_of(threads + p), iterations))
        .collect();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (root, layout, slots) = (&root, &layout, slots_of(t));
            scope.spawn(move || {
                for i in 0..iterations {
                    // One slot per update here, all of them in turn.
                    for &s in &slots {
                        put(root, layout, &[(s, Some(&version(s, i)))]);
                    }
                }
            });
        }
    });
    for mut c in children {
        assert!(c.wait().unwrap().success(), "worker failed");
    }
    let got = read_all(&root, &layout);
    for (slot, bytes) in got.iter().enumerate() {
        assert_eq!(
            bytes.as_deref(),
            Some(&version(slot, iterations - 1)[..]),
            "slot {slot}: lost update"
        );
    }
    assert_clean(&root);
}

#[test]
fn concurrent_threads_and_processes_lose_no_update_when_appending() {
    hammer(IndexLocation::End, 4, 2, 40);
}

#[test]
fn concurrent_threads_and_processes_lose_no_update_when_rewriting() {
    hammer(IndexLocation::Start, 3, 2, 25);
}

#[test]
fn recovery_after_real_kill_9_gives_a_consistent_state() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let layout = gzip_array_store(root, IndexLocation::End, true, Endian::Little);
    let slots: Vec<usize> = (0..SLOTS).collect();
    let mut rng = Rng(12345);
    let mut checked = 0;
    for round in 0..6 {
        let _ = std::fs::remove_file(root.join(SHARD));
        let mut child = spawn_worker(root, "writer", &slots, 100_000);
        // Let it get going (process start, then appends), then kill it mid-flight.
        std::thread::sleep(Duration::from_millis(150 + rng.below(300)));
        child.kill().unwrap();
        child.wait().unwrap();
        recover_store(root).unwrap();
        if shard_bytes(root).is_none() {
            continue; // killed before the first shard was renamed into place
        }
        // Each update wrote version i of every slot: all slots must agree on one i.
        let got = read_all(root, &layout);
        let i = (0..100_000)
            .find(|&i| got[0].as_deref() == Some(&version(0, i)[..]))
            .expect("slot 0 holds some version");
        for (slot, bytes) in got.iter().enumerate() {
            assert_eq!(
                bytes.as_deref(),
                Some(&version(slot, i)[..]),
                "round {round} slot {slot}"
            );
        }
        assert_clean(root);
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} rounds got as far as a shard");
}
