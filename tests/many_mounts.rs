//! Many mounts, one store (docs/SEMANTICS.md): writes to different chunks are never
//! lost; for one chunk the write closed last wins, whatever order the mounts flush in;
//! a failed or torn commit loses nothing acknowledged and half-applies nothing.
//!
//! The write core (staging, flush, the merge rule) is tested on both stores without
//! FUSE — the in-memory store (errno faults from `FaultyStore` wrapped around it, torn
//! writes from its own `cut_commit`) and a local directory — and the same promises then
//! through two real mounts of one directory.

#[path = "many_mounts/changed_by_another.rs"]
mod changed_by_another;
mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::mount::{flush_on_demand, mount_with};
use serde_json::json;
use shardfs::compact::CpuCompactor;
use shardfs::format::{self, Location, Node, Presentation, ShardLayout};
use shardfs::store::faulty::{Fault, FaultyStore, Op};
use shardfs::store::shard::Shard;
use shardfs::store::{LocalStore, MemoryStore, Store};
use shardfs::write::flush::{ArrayTarget, Flushed, Flusher};
use shardfs::write::staging::Staging;
use shardfs::{Mount, MountOptions};

/// 1-d uint8 array `a`: 64 elements, shards of 16, inner chunks of 4 (4 per shard).
fn array_doc() -> Vec<u8> {
    let doc = common::sharded_u8_array(
        64,
        16,
        4,
        json!([{"name": "bytes"}]),
        common::index_codecs_crc32c(),
        "end",
    );
    serde_json::to_vec(&doc).unwrap()
}

fn layout() -> ShardLayout {
    match format::metadata::parse(&array_doc()).unwrap() {
        Node::Array(a) => match a.presentation {
            Presentation::Sharded(l) => l,
            other => panic!("{other:?}"),
        },
        Node::Group => panic!("a group"),
    }
}

/// One mount's write side over a shared store: its own staging and flusher.
struct Side {
    staging: Staging,
    flusher: Flusher,
}

impl Side {
    fn new() -> Self {
        Side {
            staging: Staging::new(1 << 30),
            flusher: Flusher::new(Arc::new(CpuCompactor::new())),
        }
    }

    /// Close chunk `c` (with `data`, or its deletion).
    fn close(&self, c: u64, data: Option<&[u8]>) {
        self.staging
            .put(Path::new("a"), vec![c], data.map(|d| Arc::new(d.to_vec())));
    }

    fn flush(&self, store: &dyn Store) -> Flushed {
        let layout = layout();
        let shard_rel = |s: &[u64]| PathBuf::from(format!("a/c/{}", s[0]));
        let target = ArrayTarget {
            rel: Path::new("a"),
            layout: &layout,
            shard_rel: &shard_rel,
        };
        self.flusher.flush_array(store, &self.staging, &target)
    }
}

/// Chunk `c` as stored (`None`: empty).
fn stored(store: &dyn Store, c: u64) -> Option<Vec<u8>> {
    let layout = layout();
    let rel = PathBuf::from(format!("a/c/{}", c / 4));
    let shard = Shard::load(store, &rel, &layout);
    let loc = Location {
        shard: vec![c / 4],
        slots: vec![c % 4],
    };
    let r = shard.chunk(&layout, &loc).expect("chunk reads")?;
    Some(shard.read(r, 0, r.nbytes as u32).unwrap())
}

fn stores() -> Vec<(tempfile::TempDir, Box<dyn Store>)> {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("a")).unwrap();
    fs::write(dir.path().join("a/zarr.json"), array_doc()).unwrap();
    let local = LocalStore::open(dir.path()).unwrap();
    let memory = MemoryStore::new();
    memory.put("a/zarr.json", array_doc());
    vec![
        (tempfile::tempdir().unwrap(), Box::new(memory)),
        (dir, Box::new(local)),
    ]
}

#[test]
fn the_write_closed_last_wins_whatever_order_the_mounts_flush_in() {
    for (_dir, store) in stores() {
        let store = store.as_ref();
        for a_flushes_first in [true, false] {
            let (a, b) = (Side::new(), Side::new());
            // The scenario: A closes v1 (no fsync), then B closes v2.
            a.close(1, Some(b"v1-A"));
            b.close(1, Some(b"v2-B"));
            // Different chunks of the same shard from both: never lost.
            a.close(2, Some(b"only-A"));
            b.close(3, Some(b"only-B"));
            // A delete closed after a write wins over it, and a write after a delete.
            // (Chunk 4 keeps their shard from emptying: a delete that empties a shard
            // removes it, and its close time with it; SEMANTICS.md says so.)
            a.close(4, Some(b"stay"));
            a.close(5, Some(b"gone"));
            b.close(5, None);
            b.close(6, None);
            a.close(6, Some(b"back"));
            let order = if a_flushes_first { [&a, &b] } else { [&b, &a] };
            for side in order {
                let f = side.flush(store);
                assert!(f.failed.is_empty(), "{:?}", f.failed);
            }
            let what = format!(
                "{} flushing {} first",
                store.describe(),
                if a_flushes_first { "A" } else { "B" }
            );
            assert_eq!(stored(store, 1).as_deref(), Some(&b"v2-B"[..]), "{what}");
            assert_eq!(stored(store, 2).as_deref(), Some(&b"only-A"[..]), "{what}");
            assert_eq!(stored(store, 3).as_deref(), Some(&b"only-B"[..]), "{what}");
            assert_eq!(stored(store, 5), None, "{what}");
            assert_eq!(stored(store, 6).as_deref(), Some(&b"back"[..]), "{what}");
            assert_eq!(
                a.staging.bytes() + b.staging.bytes(),
                0,
                "{what}: all settled"
            );
        }
    }
}

#[test]
fn a_failed_commit_keeps_its_chunks_and_its_errno_and_holds_back_no_other_shard() {
    for errno in [libc::ENOSPC, libc::EDQUOT, libc::EIO] {
        let store = FaultyStore::new(Arc::new(MemoryStore::new()));
        let side = Side::new();
        side.close(0, Some(b"shard0")); // shard 0, whose first commit fails
        side.close(4, Some(b"shard1")); // shard 1
        let fault = store.inject(Fault::new(Op::Commit, errno).under("a/c/0").nth(0));
        let f = side.flush(&store);
        let err = f.failed.first().expect("shard 0's commit fails");
        assert_eq!(err.errno(), errno, "{err}");
        assert_eq!(store.fired(fault), 1);
        assert_eq!(
            f.shards,
            [PathBuf::from("a/c/1")],
            "the other shard committed"
        );
        assert_eq!(stored(&store, 0), None);
        assert_eq!(stored(&store, 4).as_deref(), Some(&b"shard1"[..]));
        // The failed chunk is still staged (and readable), and the next flush stores it.
        assert_eq!(
            side.staging
                .get(Path::new("a"), &[0])
                .unwrap()
                .unwrap()
                .as_slice(),
            b"shard0"
        );
        assert!(side.flush(&store).failed.is_empty());
        assert_eq!(stored(&store, 0).as_deref(), Some(&b"shard0"[..]));
        assert_eq!(side.staging.bytes(), 0);
    }
}

#[test]
fn a_commit_cut_at_any_byte_loses_nothing_acknowledged_and_half_applies_nothing() {
    // Acknowledged state: chunk 0..4 of shard 0, flushed. Then a second batch whose
    // commit is cut after `keep` bytes, for every `keep` up to the whole new shard.
    let base = MemoryStore::new();
    let side = Side::new();
    for c in 0..4u64 {
        side.close(c, Some(&[c as u8; 3]));
    }
    assert!(side.flush(&base).failed.is_empty());
    let acknowledged: Vec<_> = (0..4).map(|c| stored(&base, c)).collect();
    let shard_len = base.get("a/c/0").unwrap().len();
    for keep in 0..shard_len + 8 {
        let store = base.deep_copy();
        let side = Side::new();
        side.close(1, Some(b"new-1"));
        side.close(2, None);
        store.cut_commit(0, keep);
        let f = side.flush(&store);
        assert_eq!(f.failed.first().expect("cut").errno(), libc::EIO);
        assert_eq!(store.torn_writes(), 1);
        // Nothing half-applied: the shard is the acknowledged one, byte for byte.
        assert_eq!(store.get("a/c/0"), base.get("a/c/0"), "cut at {keep}");
        for c in 0..4 {
            assert_eq!(stored(&store, c), acknowledged[c as usize], "cut at {keep}");
        }
        // Nothing lost: the retry stores the batch whole.
        assert!(side.flush(&store).failed.is_empty());
        assert_eq!(stored(&store, 1).as_deref(), Some(&b"new-1"[..]));
        assert_eq!(stored(&store, 2), None);
        assert_eq!(stored(&store, 3), acknowledged[3]);
    }
}

// ---- through two real mounts ----------------------------------------------------------

/// A writable mount as mounted by default (the kernel opens files) that flushes only
/// when the test says.
fn mount_unflushed(store: &Path) -> (tempfile::TempDir, Mount) {
    mount_unflushed_with(store, true)
}

/// A writable mount that flushes only when the test says (fsync, unmount); with
/// `kernel_opens` (the default), one that lets the kernel open files (its closes are
/// heard of late or not at all) and sees others' changes within 0.2 s; without, one
/// with `open_checks` (every open and close heard of).
fn mount_unflushed_with(store: &Path, kernel_opens: bool) -> (tempfile::TempDir, Mount) {
    let opts = MountOptions {
        open_checks: !kernel_opens,
        ttl: kernel_opens.then(|| Duration::from_millis(200)),
        ..flush_on_demand()
    };
    mount_with(store, &opts)
}

fn write_close(path: &Path, bytes: &[u8], fsync: bool) {
    let mut f = fs::File::create(path).unwrap();
    f.write_all(bytes).unwrap();
    if fsync {
        f.sync_all().unwrap();
    }
}

/// fsync of a mount's root: flushes everything the mount has staged.
fn flush(mnt: &Path) {
    fs::File::open(mnt).unwrap().sync_all().unwrap();
}

#[test]
fn two_mounts_an_fsynced_write_is_never_replaced_by_an_earlier_close() {
    if !common::can_mount() {
        return;
    }
    // With kernel opens on A, the daemon hears of no close of A's descriptor: A's write
    // counts as closed at its last write, before B's, whenever A commits it.
    for (a_flushes_first, kernel_opens) in
        [(false, false), (true, false), (false, true), (true, true)]
    {
        let tmp = common::store_copy("zarr_basic");
        let store = tmp.path().join("s");
        let (ma, ga) = mount_unflushed_with(&store, kernel_opens);
        let (mb, gb) = mount_unflushed(&store);
        let key = "u16_default_sparse/c/0/0";
        let before = fs::read(mb.path().join(key)).ok();
        // A closes v1 without fsync; B then writes v2 and fsyncs (fsync returns 0).
        write_close(&ma.path().join(key), &[1; 24], false);
        // A close is not a flush: B does not see A's write yet, A does.
        assert_eq!(fs::read(mb.path().join(key)).ok(), before);
        assert_eq!(fs::read(ma.path().join(key)).unwrap(), [1; 24]);
        std::thread::sleep(Duration::from_millis(2));
        write_close(&mb.path().join(key), &[2; 24], !a_flushes_first);
        if a_flushes_first {
            flush(ma.path());
            flush(mb.path());
        } else {
            flush(ma.path()); // A's timed flush, after B's fsync
        }
        // Each mount sees the winner at its next open (close-to-open); with kernel
        // opens, within the TTL.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let got = fs::read(ma.path().join(key)).unwrap();
            if got == [2; 24] {
                break;
            }
            assert!(kernel_opens, "A read {got:?} after the flushes");
            assert!(
                std::time::Instant::now() < deadline,
                "A still reads {got:?} 10 s after the flushes (TTL 0.2 s)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(fs::read(mb.path().join(key)).unwrap(), [2; 24]);
        ga.unmount().unwrap();
        gb.unmount().unwrap();
        let (mnt, _g) = mount_unflushed(&store);
        assert_eq!(
            fs::read(mnt.path().join(key)).unwrap(),
            [2; 24],
            "after remount ({}, kernel opens on A: {kernel_opens})",
            if a_flushes_first {
                "A flushed first"
            } else {
                "B fsynced first"
            }
        );
    }
}

#[test]
fn two_mounts_two_writers_each_end_in_the_last_close_of_every_chunk() {
    if !common::can_mount() {
        return;
    }
    use parking_lot::Mutex;
    let tmp = common::store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let (ma, ga) = mount_unflushed(&store);
    let (mb, gb) = mount_unflushed(&store);
    let mounts = [ma.path().to_path_buf(), mb.path().to_path_buf()];
    // Overlapping chunks of the same shards (c/0/0..c/1/1 share shard 0; 2,2 another).
    let keys = ["c/0/0", "c/0/1", "c/1/0", "c/1/1", "c/2/2", "c/2/3"];
    // The model: per chunk, the bytes of the last close. A writer holds the chunk's lock
    // from open to close, so the closes of one chunk are ordered as the model sees them.
    let model: Vec<Mutex<Option<Vec<u8>>>> = keys.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for w in 0..4u64 {
            let (mounts, model, keys) = (&mounts, &model, &keys);
            s.spawn(move || {
                let mut rng = w.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mnt = &mounts[(w % 2) as usize];
                for i in 0..40u64 {
                    let k = (next() % keys.len() as u64) as usize;
                    let bytes = [(w * 64 + i) as u8; 24];
                    let mut slot = model[k].lock();
                    let path = mnt.join("u16_default_sparse").join(keys[k]);
                    fs::create_dir_all(path.parent().unwrap()).unwrap();
                    write_close(&path, &bytes, next() % 4 == 0);
                    *slot = Some(bytes.to_vec());
                    drop(slot);
                    if next() % 8 == 0 {
                        flush(mnt);
                    }
                }
            });
        }
    });
    ga.unmount().unwrap();
    gb.unmount().unwrap();
    let (mnt, _g) = mount_unflushed(&store);
    for (k, key) in keys.iter().enumerate() {
        let want = model[k].lock().clone().expect("every chunk was written");
        assert_eq!(
            fs::read(mnt.path().join("u16_default_sparse").join(key)).unwrap(),
            want,
            "{key}"
        );
    }
    let report = shardfs::maint::verify(&store, false, false).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn compaction_keeps_the_close_times_so_a_stale_write_still_loses() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("a")).unwrap();
    fs::write(dir.path().join("a/zarr.json"), array_doc()).unwrap();
    let store = LocalStore::open(dir.path()).unwrap();
    let (old, new) = (Side::new(), Side::new());
    old.close(1, Some(b"old"));
    new.close(1, Some(b"new"));
    new.close(2, Some(b"x"));
    assert!(new.flush(&store).failed.is_empty());
    new.close(2, Some(b"y")); // dead space in the shard, for compact to reclaim
    assert!(new.flush(&store).failed.is_empty());
    let before = fs::metadata(dir.path().join("a/c/0")).unwrap().len();
    // `info` counts dead bytes as `compact` does: the close-time block is live.
    let info_dead = |store: &LocalStore| shardfs::info::inspect(store).unwrap()[0].dead_bytes;
    let dead = info_dead(&store);
    assert!(dead > 0);
    let report = shardfs::maint::compact(dir.path(), 0.0, false).unwrap();
    assert_eq!(report.shards_rewritten, 1, "{report:?}");
    assert_eq!(report.arrays[0].dead_bytes, dead, "{report:?}");
    assert_eq!(report.bytes_reclaimed, dead, "{report:?}");
    assert!(fs::metadata(dir.path().join("a/c/0")).unwrap().len() < before);
    assert_eq!(info_dead(&LocalStore::open(dir.path()).unwrap()), 0);
    // The write closed before "new" still loses after the rewrite.
    assert!(old.flush(&store).failed.is_empty());
    assert_eq!(stored(&store, 1).as_deref(), Some(&b"new"[..]));
    assert_eq!(stored(&store, 2).as_deref(), Some(&b"y"[..]));
}
