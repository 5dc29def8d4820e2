//! Recovery of interrupted shard updates by a writable mount, which does not walk the
//! store before mounting: a shard is recovered just before its index is first read
//! (`write::recover::LazyRecovery`, the view's shard-cache hook), and a walk in the
//! background cleans the leftovers of shards nobody reads. A read-only view reads a torn
//! shard as it was before the update. And the flush that makes these updates writes the
//! same shards from the staged buffers as from a compactor's packed copy.

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use shardfs::compact::{CompactError, Compactor, CpuCompactor, Packed, StagedBatch};
use shardfs::format::{self, Node, Presentation, ShardLayout};
use shardfs::store::local::append::{ChunkUpdate, apply};
use shardfs::store::local::recover::AppendRecord;
use shardfs::store::shard::Shard;
use shardfs::store::{LocalStore, Store};
use shardfs::view::write_api::{WriteConfig, Writer};
use shardfs::view::{ROOT_INO, View, ViewConfig, ViewError};
use shardfs::{Mount, MountOptions, maint};

/// Inner chunks (4 uint8 each) per shard; the array has 4 shards.
const SLOTS: usize = 4;

/// A store holding one 1-d uint8 array `a`: shape 64, shards of 16, inner chunks of 4,
/// index at the end with crc32c. The view shows chunk `i` as `a/c/i`; shard `s` (file
/// `a/c/s`) holds chunks `4s..4s+4`.
fn group_of_one_array(root: &Path) -> ShardLayout {
    let doc = common::sharded_u8_array(
        64,
        16,
        4,
        json!([{"name": "bytes"}]),
        common::index_codecs_crc32c(),
        "end",
    );
    std::fs::write(
        root.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "group"}"#,
    )
    .unwrap();
    std::fs::create_dir_all(root.join("a")).unwrap();
    std::fs::write(root.join("a/zarr.json"), serde_json::to_vec(&doc).unwrap()).unwrap();
    match format::metadata::parse(&serde_json::to_vec(&doc).unwrap()).unwrap() {
        Node::Array(a) => match a.presentation {
            Presentation::Sharded(l) => l,
            other => panic!("{other:?}"),
        },
        Node::Group => panic!("a group"),
    }
}

/// Write `chunks` (slot, 4 bytes) into shard `s` with the crash-safe update.
fn put(root: &Path, layout: &ShardLayout, s: u64, chunks: &[(usize, &[u8; 4])]) {
    let updates: Vec<ChunkUpdate> = chunks
        .iter()
        .map(|&(slot, b)| (slot, Some(b.as_slice())))
        .collect();
    let rel = format!("a/c/{s}");
    apply(root, Path::new(&rel), &layout.levels[0], &updates).unwrap();
}

fn old_chunk(s: u64, slot: usize) -> [u8; 4] {
    [b'o', b'0' + s as u8, b'0' + slot as u8, b'.']
}

/// Shard `s` holding its old chunks, then an append of new bytes for slots 1 and 2 that
/// a crash cut 5 bytes short of its end (inside the new index), with its intact record:
/// the state `kill -9` leaves in the middle of step 2 of the append protocol. Returns the
/// old shard's bytes.
fn torn_shard(root: &Path, layout: &ShardLayout, s: u64) -> Vec<u8> {
    let olds: Vec<[u8; 4]> = (0..SLOTS).map(|slot| old_chunk(s, slot)).collect();
    let chunks: Vec<(usize, &[u8; 4])> = olds.iter().enumerate().collect();
    put(root, layout, s, &chunks);
    let rel = format!("a/c/{s}");
    let old = std::fs::read(root.join(&rel)).unwrap();
    // The same append, finished, in a copy: the torn shard is a prefix of its result.
    let copy = tempfile::tempdir().unwrap();
    group_of_one_array(copy.path());
    std::fs::create_dir_all(copy.path().join("a/c")).unwrap();
    std::fs::write(copy.path().join(&rel), &old).unwrap();
    put(copy.path(), layout, s, &[(1, b"NEW1"), (2, b"NEW2")]);
    let new = std::fs::read(copy.path().join(&rel)).unwrap();
    assert!(new.len() > old.len() + 5);
    let record = AppendRecord {
        old_len: old.len() as u64,
        new_len: new.len() as u64,
        tail_crc: crc32c::crc32c(&new[old.len()..]),
    };
    std::fs::write(root.join(format!("{rel}.shardfs-append")), record.encode()).unwrap();
    std::fs::write(root.join(&rel), &new[..new.len() - 5]).unwrap();
    old
}

/// A store with shard 0 torn and shard 1 intact, and its layout.
fn store_with_torn_shard() -> (tempfile::TempDir, ShardLayout, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let layout = group_of_one_array(dir.path());
    let old = torn_shard(dir.path(), &layout, 0);
    put(dir.path(), &layout, 1, &[(0, &old_chunk(1, 0))]);
    (dir, layout, old)
}

fn view_of(root: &Path, writable: bool) -> View {
    view_with(root, writable.then(|| Arc::new(CpuCompactor::new()) as _))
}

/// A view of the store at `root`, writable through `compactor` if one is given.
fn view_with(root: &Path, compactor: Option<Arc<dyn Compactor>>) -> View {
    let store: Arc<dyn Store> = Arc::new(LocalStore::open(root).unwrap());
    let writer = compactor.map(|compactor| {
        Writer::new(WriteConfig {
            write_buffer: 1 << 20,
            chunks_per_shard: None,
            shard_target_bytes: 64 << 20,
            compactor,
        })
    });
    View::with_writer(store, ViewConfig::default(), writer).unwrap()
}

/// Read a file of the view the way the kernel does: lookups, open, read, release.
fn view_read(view: &View, path: &str) -> Result<Vec<u8>, ViewError> {
    let mut ino = ROOT_INO;
    for part in path.split('/') {
        ino = view.lookup(ino, OsStr::new(part))?.ino;
    }
    let opened = view.open(ino, false, false)?;
    let bytes = view.read(opened.fh, 0, 1 << 16);
    view.release(opened.fh)?;
    bytes
}

fn leftovers(root: &Path) -> Vec<String> {
    common::files_under(root)
        .into_iter()
        .filter(|f| f.contains(".shardfs-"))
        .collect()
}

/// The shard reads (index validates) with the store API, and verify finds nothing.
fn assert_valid(root: &Path, layout: &ShardLayout, rel: &str) {
    let store = LocalStore::open(root).unwrap();
    let shard = Shard::load(&store, Path::new(rel), layout);
    assert!(shard.index().is_ok(), "{rel}: {:?}", shard.index().err());
    let report = maint::verify(root, false, false).unwrap();
    assert!(report.is_clean(), "{report}");
}

#[test]
fn a_writable_view_recovers_a_torn_shard_before_reading_it() {
    let (dir, layout, old) = store_with_torn_shard();
    let root = dir.path();
    // The shard is really torn: its index does not read.
    let store = LocalStore::open(root).unwrap();
    assert!(
        Shard::load(&store, Path::new("a/c/0"), &layout)
            .index()
            .is_err()
    );
    // A writable view has no mount and no walk: only its load hook can recover the shard.
    let view = view_of(root, true);
    assert!(
        root.join("a/c/0.shardfs-append").exists(),
        "nothing is recovered before a read"
    );
    for slot in 0..SLOTS {
        assert_eq!(
            view_read(&view, &format!("a/c/{slot}")).unwrap(),
            old_chunk(0, slot),
            "chunk {slot}: the state before the interrupted update"
        );
    }
    assert_eq!(view_read(&view, "a/c/4").unwrap(), old_chunk(1, 0));
    assert!(leftovers(root).is_empty(), "{:?}", leftovers(root));
    assert_eq!(
        std::fs::read(root.join("a/c/0")).unwrap(),
        old,
        "rolled back"
    );
    assert_valid(root, &layout, "a/c/0");
}

#[test]
fn a_read_only_view_reads_a_torn_shard_as_before_the_update_and_changes_nothing() {
    let (dir, _layout, _old) = store_with_torn_shard();
    let root = dir.path();
    let torn = std::fs::read(root.join("a/c/0")).unwrap();
    let ro = view_of(root, false);
    for slot in 0..SLOTS {
        assert_eq!(
            view_read(&ro, &format!("a/c/{slot}")).unwrap(),
            old_chunk(0, slot),
            "chunk {slot}: the state before the interrupted update"
        );
    }
    assert_eq!(view_read(&ro, "a/c/4").unwrap(), old_chunk(1, 0));
    // Not a byte changed: the torn tail and its record wait for a writable mount.
    assert_eq!(std::fs::read(root.join("a/c/0")).unwrap(), torn);
    assert_eq!(leftovers(root), ["a/c/0.shardfs-append"]);
}

#[test]
fn a_read_only_view_reads_a_finished_append_or_a_stale_record_as_the_shard_is() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let layout = group_of_one_array(root);
    // Shard 0: an append that finished, its record not yet removed (a crash between
    // steps 2 and 3 of the protocol). Recovery would keep it: so does the read.
    put(
        root,
        &layout,
        0,
        &[(0, &old_chunk(0, 0)), (1, &old_chunk(0, 1))],
    );
    let before = std::fs::metadata(root.join("a/c/0")).unwrap().len();
    put(root, &layout, 0, &[(1, b"NEW1")]);
    let after = std::fs::read(root.join("a/c/0")).unwrap();
    let record = AppendRecord {
        old_len: before,
        new_len: after.len() as u64,
        tail_crc: crc32c::crc32c(&after[before as usize..]),
    };
    std::fs::write(root.join("a/c/0.shardfs-append"), record.encode()).unwrap();
    // Shard 1: a record that asks for more bytes than the shard has (something else
    // rewrote it): stale, the shard reads as it is.
    put(root, &layout, 1, &[(2, &old_chunk(1, 2))]);
    let stale = AppendRecord {
        old_len: 1 << 20,
        new_len: 2 << 20,
        tail_crc: 0,
    };
    std::fs::write(root.join("a/c/1.shardfs-append"), stale.encode()).unwrap();
    let ro = view_of(root, false);
    assert_eq!(view_read(&ro, "a/c/0").unwrap(), old_chunk(0, 0));
    assert_eq!(view_read(&ro, "a/c/1").unwrap(), *b"NEW1");
    assert_eq!(view_read(&ro, "a/c/6").unwrap(), old_chunk(1, 2));
    assert_eq!(leftovers(root).len(), 2, "a read-only view removes nothing");
}

/// The CPU compactor, claiming to pack on a device: the flush then writes the shards
/// from its packed copy, as it does from a GPU's.
struct PacksOnDevice(CpuCompactor);

impl Compactor for PacksOnDevice {
    fn name(&self) -> &'static str {
        "device-like"
    }

    fn compact(&self, batch: &StagedBatch<'_>, out: &mut Packed) -> Result<(), CompactError> {
        self.0.compact(batch, out)
    }

    fn packs_on_device(&self, _payload_bytes: u64) -> bool {
        true
    }
}

#[test]
fn a_flush_writes_the_same_shards_from_staged_buffers_as_from_a_packed_copy() {
    let mut compactors = vec![
        Arc::new(CpuCompactor::new()) as Arc<dyn Compactor>,
        Arc::new(PacksOnDevice(CpuCompactor::new())),
    ];
    // Where a GPU is usable, its flush (packed in mapped page-locked memory, written
    // from there) must write the same shards too.
    match shardfs::compact::GpuCompactor::new() {
        Ok(gpu) => compactors.push(Arc::new(gpu)),
        Err(why) => println!("GPU flush: SKIPPED: {why}"),
    }
    let stores: Vec<_> = compactors
        .into_iter()
        .map(|compactor| {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path();
            let layout = group_of_one_array(root);
            let olds: Vec<[u8; 4]> = (0..SLOTS).map(|slot| old_chunk(0, slot)).collect();
            put(
                root,
                &layout,
                0,
                &olds.iter().enumerate().collect::<Vec<_>>(),
            );
            let view = view_with(root, Some(compactor));
            let a = view.lookup(ROOT_INO, OsStr::new("a")).unwrap().ino;
            let c = view.lookup(a, OsStr::new("c")).unwrap().ino;
            // Shard 0 gets an append (one chunk replaced, one deleted); shard 2 is new,
            // its chunks written out of slot order.
            for (name, bytes) in [("9", b"NNN9"), ("1", b"NEW1"), ("8", b"NNN8")] {
                let (_, opened) = view.create(c, OsStr::new(name), false, true).unwrap();
                view.write(opened.fh, 0, bytes).unwrap();
                view.flush_handle(opened.fh).unwrap();
                view.release(opened.fh).unwrap();
            }
            view.unlink(c, OsStr::new("2")).unwrap();
            view.flush_all().unwrap();
            drop(view);
            assert_valid(root, &layout, "a/c/0");
            assert_valid(root, &layout, "a/c/2");
            let ro = view_of(root, false);
            assert_eq!(view_read(&ro, "a/c/0").unwrap(), old_chunk(0, 0));
            assert_eq!(view_read(&ro, "a/c/1").unwrap(), *b"NEW1");
            assert_eq!(view_read(&ro, "a/c/2").unwrap_err().errno(), libc::ENOENT);
            assert_eq!(view_read(&ro, "a/c/8").unwrap(), *b"NNN8");
            assert_eq!(view_read(&ro, "a/c/9").unwrap(), *b"NNN9");
            dir
        })
        .collect();
    // Close times differ from run to run; everything else must be byte-identical.
    for shard in ["a/c/0", "a/c/2"] {
        for other in &stores[1..] {
            assert_eq!(
                without_close_times(std::fs::read(stores[0].path().join(shard)).unwrap()),
                without_close_times(std::fs::read(other.path().join(shard)).unwrap()),
                "{shard}: the host path and a packed path wrote different bytes"
            );
        }
    }
}

#[test]
fn a_recovery_that_fails_fails_that_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let layout = group_of_one_array(root);
    put(root, &layout, 0, &[(1, &old_chunk(0, 1))]);
    put(root, &layout, 1, &[(0, &old_chunk(1, 0))]);
    // A "record" recovery cannot read: it is a directory.
    let bogus = root.join("a/c/0.shardfs-append");
    std::fs::create_dir(&bogus).unwrap();
    let view = view_of(root, true);
    let err = view_read(&view, "a/c/1").unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    // Other shards are unaffected.
    assert_eq!(view_read(&view, "a/c/4").unwrap(), old_chunk(1, 0));
    // The failure was not cached: once recovery can proceed, the same read works.
    std::fs::remove_dir(&bogus).unwrap();
    assert_eq!(view_read(&view, "a/c/1").unwrap(), old_chunk(0, 1));
}

/// Wait (bounded) until `done` holds; `false` if it never did.
fn eventually(timeout: Duration, done: impl Fn() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

#[test]
fn a_torn_shard_reads_as_before_the_update_right_after_a_writable_mount() {
    if !common::can_mount() {
        return;
    }
    let (dir, layout, old) = store_with_torn_shard();
    let root = dir.path();
    let mnt = tempfile::tempdir().unwrap();
    let m = Mount::new(root, mnt.path(), &MountOptions::default()).unwrap();
    // At once, racing the background walk: whoever gets to the shard first recovers it.
    for slot in 0..SLOTS {
        let got = std::fs::read(mnt.path().join(format!("a/c/{slot}")));
        assert_eq!(
            got.as_ref().ok().map(Vec::as_slice),
            Some(&old_chunk(0, slot)[..]),
            "chunk {slot}: {got:?}"
        );
    }
    assert!(!root.join("a/c/0.shardfs-append").exists());
    assert_eq!(
        std::fs::read(root.join("a/c/0")).unwrap(),
        old,
        "rolled back"
    );
    // And the mount writes to the recovered shard as to any other.
    std::fs::write(mnt.path().join("a/c/2"), b"W2W2").unwrap();
    m.unmount().unwrap();
    assert_valid(root, &layout, "a/c/0");
    let ro = view_of(root, false);
    assert_eq!(view_read(&ro, "a/c/2").unwrap(), b"W2W2");
    assert_eq!(view_read(&ro, "a/c/1").unwrap(), old_chunk(0, 1));
}

#[test]
fn a_read_only_mount_serves_a_torn_shard_as_before_the_update() {
    if !common::can_mount() {
        return;
    }
    let (dir, _layout, _old) = store_with_torn_shard();
    let root = dir.path();
    let torn = std::fs::read(root.join("a/c/0")).unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let opts = MountOptions {
        read_only: true,
        ..MountOptions::default()
    };
    let m = Mount::new(root, mnt.path(), &opts).unwrap();
    for slot in 0..SLOTS {
        let path = mnt.path().join(format!("a/c/{slot}"));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4, "chunk {slot}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            old_chunk(0, slot),
            "chunk {slot}"
        );
    }
    m.unmount().unwrap();
    assert_eq!(std::fs::read(root.join("a/c/0")).unwrap(), torn);
    assert!(root.join("a/c/0.shardfs-append").exists());
}

#[test]
fn the_background_walk_recovers_shards_nobody_reads() {
    if !common::can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let layout = group_of_one_array(root);
    let old = torn_shard(root, &layout, 2);
    put(root, &layout, 3, &[(0, &old_chunk(3, 0))]);
    let intact = std::fs::read(root.join("a/c/3")).unwrap();
    std::fs::write(root.join("a/c/3.shardfs-tmp"), b"half a rewrite").unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let m = Mount::new(root, mnt.path(), &MountOptions::default()).unwrap();
    let cleaned = eventually(Duration::from_secs(30), || leftovers(root).is_empty());
    assert!(cleaned, "still there: {:?}", leftovers(root));
    assert_eq!(
        std::fs::read(root.join("a/c/2")).unwrap(),
        old,
        "rolled back"
    );
    assert_eq!(std::fs::read(root.join("a/c/3")).unwrap(), intact);
    assert!(!m.is_finished());
    m.unmount().unwrap();
    assert_valid(root, &layout, "a/c/2");
}

#[test]
fn an_unmount_right_after_the_mount_waits_for_the_walk() {
    if !common::can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let layout = group_of_one_array(root);
    let olds: Vec<Vec<u8>> = (0..4).map(|s| torn_shard(root, &layout, s)).collect();
    let mnt = tempfile::tempdir().unwrap();
    Mount::new(root, mnt.path(), &MountOptions::default())
        .unwrap()
        .unmount()
        .unwrap();
    // Nothing of the mount touches the store after its unmount: the walk has ended, so
    // it ran to completion.
    assert!(leftovers(root).is_empty(), "{:?}", leftovers(root));
    for (s, old) in olds.iter().enumerate() {
        assert_eq!(&std::fs::read(root.join(format!("a/c/{s}"))).unwrap(), old);
    }
    assert_valid(root, &layout, "a/c/3");
}

/// `shard` with every close-time block's times and CRCs zeroed (`format::times`).
fn without_close_times(mut shard: Vec<u8>) -> Vec<u8> {
    use shardfs::format::times::TIMES_MAGIC;
    let mut at = 0;
    while let Some(p) = shard[at..]
        .windows(TIMES_MAGIC.len())
        .position(|w| w == TIMES_MAGIC)
        .map(|p| p + at)
    {
        let n = u64::from_le_bytes(shard[p + 16..p + 24].try_into().unwrap()) as usize;
        assert!(n * 8 <= p, "a close-time block inside the shard");
        shard[p - n * 8..p].fill(0);
        shard[p + 24..p + 32].fill(0);
        at = p + 32;
    }
    shard
}
