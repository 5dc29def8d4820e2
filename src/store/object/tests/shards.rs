//! Shards read from object storage: a shard replaced while loaded or read (loaded
//! again, `ESTALE` for the rest claimed, never new bytes mixed in), the rest of an
//! object claimed in the background, and passes over objects read ahead again.

use super::*;

/// A shard that another writer replaces between its HEAD and the GET of its index,
/// several times in a row, is loaded again until it reads, never failed (issue 34:
/// 8 of 464,000 reads got EIO while two other mounts wrote the same shards); only a
/// shard that keeps changing past the attempts fails, as changed.
#[test]
fn a_shard_changed_while_loaded_is_loaded_again() {
    use crate::format::ShardLayout;
    use crate::store::commit::SlotChange;
    use crate::store::shard::{Shard, ShardError};
    let racing = Arc::new(Racing {
        inner: object_store::memory::InMemory::new(),
        changes: Default::default(),
        down: Default::default(),
    });
    let mut s = BucketStore::new(racing.clone(), "", "memory://racing").unwrap();
    s.meta = Arc::new(MetaCache::new(Duration::from_secs(600)));
    let rel = Path::new("a/c/0");
    let data = [5u8; 4];
    s.commit_shard(rel, &level(), &mut |_| {
        vec![SlotChange {
            slot: 1,
            data: Some(&data[..]),
            closed: 1,
        }]
    })
    .unwrap();
    let layout = ShardLayout::new(vec![16], vec![16], vec![level()], Vec::new()).unwrap();
    // Its HEAD known (a listing, a stat): the load opens it without a request and reads
    // the index with If-Match, which finds it changed; loaded again, it is opened with
    // one GET of its index (meta and bytes of one version: nothing to race).
    assert!(s.stat(rel).unwrap().is_some());
    racing.changes.store(1, std::sync::atomic::Ordering::SeqCst);
    let shard = Shard::load(&s, rel, &layout);
    let loc = layout.locate(&[1]).unwrap();
    let range = shard.chunk(&layout, &loc).unwrap().unwrap();
    assert_eq!(shard.read(range, 0, 4).unwrap(), data);
    assert_eq!(racing.changes.load(std::sync::atomic::Ordering::SeqCst), 0);
    // Changed once more after it was loaded: the chunk's read says so, and a load again
    // reads it (the view does both: `CHUNK_READ_ATTEMPTS`).
    racing.changes.store(1, std::sync::atomic::Ordering::SeqCst);
    let err = shard.read(range, 0, 4).unwrap_err();
    assert!(matches!(err, ShardError::Changed(_)), "{err:?}");
    let shard = Shard::load(&s, rel, &layout);
    let range = shard.chunk(&layout, &loc).unwrap().unwrap();
    assert_eq!(shard.read(range, 0, 4).unwrap(), data);
    // Changed at every request: the error says so.
    racing
        .changes
        .store(100, std::sync::atomic::Ordering::SeqCst);
    let shard = Shard::load(&s, rel, &layout);
    let err = match shard.chunk(&layout, &loc) {
        Ok(Some(range)) => shard.read(range, 0, 4).unwrap_err(),
        other => other.map(|_| ()).unwrap_err(),
    };
    assert!(matches!(err, ShardError::Changed(_)), "{err:?}");
}

/// The first chunk at the very start of the object (zarr-python's chunk 0, read first
/// in key order): the rest comes in one piece, and every later read, the first chunk
/// again included, is answered (a read that waited on the rest's in-flight mark, left
/// behind when the mark and the fetch named different ranges, hung for good).
#[test]
fn the_first_chunk_read_again_after_the_rest_came_is_served() {
    let chunk = 64u64 << 10;
    let n = 8u64;
    let index = 16 * n + 4;
    let data: Vec<u8> = (0..(chunk * n + index) as u32)
        .map(|i| (i % 239) as u8)
        .collect();
    let s = store();
    s.write_atomically(Path::new("shard"), &data).unwrap();
    let f: Arc<dyn StoreFile> = Arc::from(s.open(Path::new("shard")).unwrap().unwrap());
    let (done, finished) = std::sync::mpsc::channel();
    let reader = {
        let (f, data) = (f.clone(), data.clone());
        std::thread::spawn(move || {
            let mut idx = vec![0u8; index as usize];
            f.read_at(&mut idx, chunk * n).unwrap();
            let mut buf = vec![0u8; chunk as usize];
            // Chunk 0, chunk 1 (the rest, one piece), chunk 0 again, every chunk, and
            // chunk 0 once more after the window was let go.
            for c in [0, 1, 0, 2, 3, 4, 5, 6, 7, 0] {
                let range = c * chunk..(c + 1) * chunk;
                f.read_chunk_at(&mut buf, range.start, range.clone())
                    .unwrap();
                assert!(
                    buf[..] == data[range.start as usize..range.end as usize],
                    "{c}"
                );
            }
            done.send(()).unwrap();
        })
    };
    // A guard against a hang, not a timing: in-memory reads take microseconds.
    finished
        .recv_timeout(Duration::from_secs(120))
        .expect("a read hung");
    reader.join().unwrap();
}

/// Another writer replaced a shard after this mount loaded its index (a conditional GET
/// of a chunk then finds another version, 412): a read of the chunk from its start is
/// made again from the new version, as a new open would (issue 34: such reads failed
/// with EIO while other mounts wrote); a read further into it fails with ESTALE, since
/// it would mix two versions of the chunk.
#[test]
fn a_chunk_of_a_shard_replaced_since_it_was_loaded_is_read_from_the_new_one() {
    use crate::view::{ROOT_INO, View, ViewConfig};
    use std::ffi::OsStr;
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mem = Arc::new(object_store::memory::InMemory::new());
    let s = BucketStore::new(mem.clone(), "", "memory://replaced").unwrap();
    let array = fixtures.join("zarr_basic/index_start");
    for rel in ["zarr.json", "c/0/0", "c/2/0"] {
        let bytes = std::fs::read(array.join(rel)).unwrap();
        let key = ObjPath::from(format!("index_start/{rel}"));
        s.block_on(mem.put(&key, PutPayload::from(bytes))).unwrap();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let view = View::new(Arc::new(s), ViewConfig::default()).unwrap();
    let mut ino = ROOT_INO;
    for name in ["index_start", "c", "0", "0"] {
        ino = view.lookup(ino, OsStr::new(name)).unwrap().ino;
    }
    let twin = fixtures.join("zarr_basic.twin/index_start/c");
    assert_eq!(
        view.read_ino(ino, 0, 1 << 16).unwrap(),
        std::fs::read(twin.join("0/0")).unwrap()
    );
    // Another writer puts another shard there: its first chunk is twin's c/4/0.
    let replace = |from: &str| {
        let bytes = std::fs::read(array.join(from)).unwrap();
        rt.block_on(mem.put(&ObjPath::from("index_start/c/0/0"), PutPayload::from(bytes)))
            .unwrap();
    };
    replace("c/2/0");
    assert_eq!(
        view.read_ino(ino, 0, 1 << 16).unwrap(),
        std::fs::read(twin.join("4/0")).unwrap(),
        "read from the new version"
    );
    replace("c/0/0");
    let err = view.read_ino(ino, 1, 1 << 16).unwrap_err();
    assert_eq!(err.errno(), libc::ESTALE, "{err}");
}

/// A shard-like object of `n` chunks of `chunk` bytes with an index after them (as
/// zarr-python writes it), its bytes a pattern mod `m`, stored and opened, and its index
/// read as a shard's load reads it: the store, the file, its bytes, the index's length.
fn opened_shard(chunk: u64, n: u64, m: u32) -> (BucketStore, Arc<dyn StoreFile>, Vec<u8>, u64) {
    let index = 16 * n + 4;
    let data: Vec<u8> = (0..(chunk * n + index) as u32)
        .map(|i| (i % m) as u8)
        .collect();
    let s = store();
    s.write_atomically(Path::new("shard"), &data).unwrap();
    let f: Arc<dyn StoreFile> = s.open(Path::new("shard")).unwrap().unwrap().into();
    let mut idx = vec![0u8; index as usize];
    f.read_at(&mut idx, chunk * n).unwrap();
    (s, f, data, index)
}

/// The rest of an object claimed beside its first chunk (`claim_rest`, the array's first
/// chunk opened): fetched on the runtime at once (two GETs: before and after the chunk),
/// held as it comes; the chunk's reader fetches its chunk alone, in pieces, not waiting
/// for the rest, and joins it to what is held; readers of other chunks, side by side,
/// are served from the rest; each byte moves once, the budget is given back, and a
/// second claim of the same file takes nothing.
#[test]
fn the_rest_claimed_beside_the_first_chunk_comes_in_the_background() {
    use std::sync::atomic::Ordering::Relaxed;
    let chunk = 96u64 << 10;
    let n = 16u64;
    let (s, f, data, index) = opened_shard(chunk, n, 239);
    let first = chunk..2 * chunk; // the first chunk need not lie first
    assert!(f.claim_rest(first.clone()));
    assert!(!f.claim_rest(first.clone()), "once per pass");
    assert_eq!(
        s.counters().gets.load(Relaxed),
        3,
        "the index, the rest in two"
    );
    // Other readers, side by side, served from the rest.
    let readers: Vec<_> = (0..2u64)
        .map(|k| {
            let (f, data) = (f.clone(), data.clone());
            std::thread::spawn(move || {
                let mut b = vec![0u8; chunk as usize];
                for c in (0..n).rev().filter(|&c| c != 1 && c % 2 == k) {
                    let r = c * chunk..(c + 1) * chunk;
                    f.read_chunk_at(&mut b, r.start, r.clone()).unwrap();
                    assert!(b[..] == data[r.start as usize..r.end as usize], "chunk {c}");
                }
            })
        })
        .collect();
    // The first chunk, in pieces: one GET of it.
    let mut buf = vec![0u8; 32 << 10];
    for at in (first.start..first.end).step_by(buf.len()) {
        let got = f.read_chunk_at(&mut buf, at, first.clone()).unwrap();
        assert_eq!(got, buf.len());
        assert!(buf[..] == data[at as usize..at as usize + buf.len()]);
    }
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(s.counters().gets.load(Relaxed), 4, "and the chunk in one");
    assert_eq!(
        s.counters().get_bytes.load(Relaxed),
        data.len() as u64 + index,
        "each byte once (the index twice)"
    );
    assert_eq!(settled_read_ahead(&s), 0, "read through: let go");
    // Beyond the half of the budget kept for loads ahead: nothing claimed, nothing held.
    let mut s = store();
    s.budget = Arc::new(Budget::new(1 << 20));
    s.write_atomically(Path::new("shard"), &data).unwrap();
    let f = s.open(Path::new("shard")).unwrap().unwrap();
    assert!(!f.claim_rest(0..chunk));
    assert_eq!(s.read_ahead().0, 0);
}

/// The rest of an object claimed after another writer replaced it: its conditional GETs
/// fail (412), nothing of the new version is held as the old one's, and a read of the
/// old version's chunks then fails with ESTALE (the view loads the shard again), at
/// once: no reader waits for what never comes.
#[test]
fn the_rest_claimed_of_a_replaced_object_is_estale_not_new_bytes() {
    let chunk = 64u64 << 10;
    let n = 8u64;
    let data: Vec<u8> = (0..(chunk * n) as u32).map(|i| (i % 233) as u8).collect();
    let s = store();
    s.write_atomically(Path::new("shard"), &data).unwrap();
    let f = s.open(Path::new("shard")).unwrap().unwrap();
    let newer: Vec<u8> = data.iter().map(|b| b ^ 0xff).collect();
    s.block_on(
        s.inner
            .put(&s.key(Path::new("shard")).unwrap(), PutPayload::from(newer)),
    )
    .unwrap();
    assert!(f.claim_rest(0..chunk));
    let start = std::time::Instant::now();
    let mut b = vec![0u8; chunk as usize];
    let r = 3 * chunk..4 * chunk;
    let err = f.read_chunk_at(&mut b, r.start, r.clone()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ESTALE), "{err}");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(
        settled_read_ahead(&s),
        0,
        "nothing held, the budget given back"
    );
}

/// A second pass over an object whose held bytes were all read and let go (the kernel
/// dropped the pages of a shard read before, and its reader comes again) is read ahead
/// as the first was: a claim beside its first chunk takes the rest again, and without a
/// claim a second chunk fetches it whole. Before, both were once per open file, and a
/// shard stays open while it is cached: the second pass fetched chunk by chunk (256 GETs
/// in series for array A of `scripts/bench-s3 latency`).
#[test]
fn a_second_pass_over_an_object_read_through_is_read_ahead_again() {
    use std::sync::atomic::Ordering::Relaxed;
    let chunk = 96u64 << 10;
    let n = 16u64;
    let (s, f, data, index) = opened_shard(chunk, n, 233);
    let mut idx = vec![0u8; index as usize];
    let read_all = |f: &Arc<dyn StoreFile>| {
        let mut b = vec![0u8; chunk as usize];
        // Not in file order: each chunk a stride of 5 from the last (mod 16).
        for c in (0..n).map(|i| (5 * i) % n) {
            let r = c * chunk..(c + 1) * chunk;
            f.read_chunk_at(&mut b, r.start, r.clone()).unwrap();
            assert!(b[..] == data[r.start as usize..r.end as usize], "chunk {c}");
        }
    };
    for pass in 0..3u64 {
        let gets = s.counters().gets.load(Relaxed);
        assert_eq!(f.pass(), pass);
        assert!(f.cold(), "pass {pass} starts cold");
        if pass == 1 {
            // Without a claim: the first chunk alone, then the rest whole (two pieces).
            read_all(&f);
        } else {
            // With one: the rest in two pieces beside the first chunk, in one.
            assert!(f.claim_rest(0..chunk), "pass {pass}");
            read_all(&f);
        }
        assert_eq!(
            settled_read_ahead(&s),
            0,
            "pass {pass}: read through, let go"
        );
        let took = s.counters().gets.load(Relaxed) - gets;
        assert!(took <= 3, "pass {pass}: {took} GETs");
    }
    assert_eq!(f.pass(), 3);
    // A shard loaded ahead: its index read at its load, then warmed (the whole object
    // held, the index again with it), then read through: let go (the index counts as
    // served), and the next pass is read ahead again. Before, the window stayed until
    // the shard left the cache, and kept the budget from the shards after it.
    let f: Arc<dyn StoreFile> = s.open(Path::new("shard")).unwrap().unwrap().into();
    f.read_at(&mut idx, chunk * n).unwrap();
    let gets = s.counters().gets.load(Relaxed);
    f.warm();
    read_all(&f);
    assert_eq!(
        s.counters().gets.load(Relaxed) - gets,
        1,
        "one GET warmed it all"
    );
    assert_eq!(
        settled_read_ahead(&s),
        0,
        "a warmed object read through is let go"
    );
    assert!(f.cold());
    let gets = s.counters().gets.load(Relaxed);
    assert!(f.claim_rest(0..chunk));
    read_all(&f);
    assert!(s.counters().gets.load(Relaxed) - gets <= 3);
    // A shard loaded ahead by its open (all of it fetched with the open, as a load
    // ahead does): read through, it ends a pass too, and is cold again. Before, its
    // window went with no pass ended, and its next pass had no load ahead from it.
    drop(f);
    let size = data.len() as u64;
    let f: Arc<dyn StoreFile> = s
        .open_with(Path::new("shard"), Prefetch::Start(size))
        .unwrap()
        .unwrap()
        .into();
    let gets = s.counters().gets.load(Relaxed);
    f.read_at(&mut idx, chunk * n).unwrap();
    read_all(&f);
    assert_eq!(
        s.counters().gets.load(Relaxed),
        gets,
        "all of it came with the open"
    );
    assert_eq!(f.pass(), 1);
    assert!(f.cold());
    assert_eq!(settled_read_ahead(&s), 0);
}

/// Without room in the budget for a whole fetch, a second chunk reads the rest of its
/// chunk alone, and that window, once served, ends no pass: the chunks counted stay, and
/// each chunk moves once. (A pass ended at each such window restarted the count, and a
/// later whole fetch moved the chunks already read again; found by a reviewer.)
#[test]
fn a_chunk_read_alone_for_want_of_budget_ends_no_pass() {
    use std::sync::atomic::Ordering::Relaxed;
    let chunk = 96u64 << 10;
    let n = 16u64;
    let (mut s, _, data, index) = opened_shard(chunk, n, 229);
    s.budget = Arc::new(Budget::new(1 << 20)); // less than the object
    let f = s.open(Path::new("shard")).unwrap().unwrap();
    let before = s.counters().get_bytes.load(Relaxed);
    let mut idx = vec![0u8; index as usize];
    f.read_at(&mut idx, chunk * n).unwrap();
    let mut buf = vec![0u8; 64 << 10]; // the kernel asks in pieces
    for c in (0..n).map(|i| (7 * i) % n) {
        let r = c * chunk..(c + 1) * chunk;
        for at in (r.start..r.end).step_by(buf.len()) {
            let len = (r.end - at).min(buf.len() as u64) as usize;
            assert_eq!(
                f.read_chunk_at(&mut buf[..len], at, r.clone()).unwrap(),
                len
            );
            assert!(
                buf[..len] == data[at as usize..at as usize + len],
                "at {at}"
            );
        }
    }
    assert_eq!(f.pass(), 0, "no pass ended");
    assert_eq!(
        s.counters().get_bytes.load(Relaxed) - before,
        data.len() as u64,
        "each byte once"
    );
}
