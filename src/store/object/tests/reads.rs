//! Reads from object storage: what is fetched and when (ahead, within the budget, from
//! the local cache), the metadata cache and listings, and reads during an outage.

use super::*;

/// Reading a 4 MiB object forward in 64 KiB pieces takes a handful of GETs and moves
/// each byte once; a jump back fetches only what it asks for; without budget every
/// read is its own GET; the budget is given back when the files go.
#[test]
fn forward_reads_are_fetched_ahead_within_the_budget() {
    use std::sync::atomic::Ordering::Relaxed;
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    for (cap, max_gets) in [(DEFAULT_READ_AHEAD, 8), (0, 64)] {
        let mut s = store();
        s.budget = Arc::new(Budget::new(cap));
        s.write_atomically(Path::new("a/shard"), &data).unwrap();
        let f = s.open(Path::new("a/shard")).unwrap().unwrap();
        let mut buf = vec![0u8; 64 << 10];
        for at in (0..data.len()).step_by(buf.len()) {
            assert_eq!(f.read_at(&mut buf, at as u64).unwrap(), buf.len());
            assert_eq!(buf, data[at..at + buf.len()], "at {at}");
        }
        let gets = s.counters().gets.load(Relaxed);
        assert!(
            (cap == 0 && gets == 64) || (cap > 0 && gets <= max_gets),
            "{gets} GETs with a budget of {cap}"
        );
        assert_eq!(s.counters().get_bytes.load(Relaxed), data.len() as u64);
        assert!(s.read_ahead().0 <= cap);
        // A jump back: exactly the bytes asked for.
        let before = s.counters().get_bytes.load(Relaxed);
        let mut small = [0u8; 100];
        f.read_at(&mut small, 1000).unwrap();
        assert_eq!(small[..], data[1000..1100]);
        assert_eq!(s.counters().get_bytes.load(Relaxed) - before, 100);
        drop(f);
        assert_eq!(s.read_ahead().0, 0, "the budget is given back");
    }
}

/// An answer asked for before this mount forgot a name (a listing in flight while a
/// shard below it was written here) is not kept: it would bring the old ETag back.
#[test]
fn an_answer_from_before_a_forget_is_not_kept() {
    let m = MetaCache::new(Duration::from_secs(600));
    let before = m.generation();
    m.forget(Path::new("a/c/0"));
    m.keep(&m.children, Path::new("a"), true, before);
    assert_eq!(m.fresh(&m.children, Path::new("a")), None);
    m.keep(&m.children, Path::new("a"), true, m.generation());
    assert_eq!(m.fresh(&m.children, Path::new("a")), Some(true));
}

/// Readers of one open object side by side (zarr-python reads a shard's chunks from
/// several threads) all get the right bytes, wait for a window in flight instead of
/// hanging or fetching it again, and give the budget back.
#[test]
fn readers_side_by_side_share_the_windows() {
    use std::sync::atomic::Ordering::Relaxed;
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 253) as u8).collect();
    let s = store();
    s.write_atomically(Path::new("shard"), &data).unwrap();
    let f: Arc<dyn StoreFile> = Arc::from(s.open(Path::new("shard")).unwrap().unwrap());
    let chunk = 64 << 10;
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (f, data) = (f.clone(), data.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; chunk];
                for i in (t..data.len() / chunk).step_by(4) {
                    let at = i * chunk;
                    assert_eq!(f.read_at(&mut buf, at as u64).unwrap(), chunk);
                    assert!(buf == data[at..at + chunk], "at {at}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let moved = s.counters().get_bytes.load(Relaxed);
    assert!(moved >= data.len() as u64, "{moved}");
    drop(f);
    assert_eq!(s.read_ahead().0, 0, "the budget is given back");
}

/// A chunk the kernel asks for in pieces is fetched once, whole, and no more; the
/// pieces of one chunk are one step forward, and three chunks in a row make the file
/// say it is being read through (the view then loads the next shards ahead).
#[test]
fn a_chunk_read_in_pieces_is_one_get_and_chunks_in_a_row_stream() {
    use std::sync::atomic::Ordering::Relaxed;
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 249) as u8).collect();
    let s = store();
    s.write_atomically(Path::new("shard"), &data).unwrap();
    let f = s.open(Path::new("shard")).unwrap().unwrap();
    let chunk = (3u64 << 20)..(4u64 << 20);
    let mut buf = vec![0u8; 128 << 10];
    for at in (chunk.start..chunk.end).step_by(buf.len()) {
        assert_eq!(
            f.read_chunk_at(&mut buf, at, chunk.clone()).unwrap(),
            buf.len()
        );
        assert!(
            buf[..] == data[at as usize..at as usize + buf.len()],
            "at {at}"
        );
        assert!(!f.streaming(), "the pieces of one chunk are one step");
    }
    assert_eq!(s.counters().gets.load(Relaxed), 1);
    assert_eq!(s.counters().get_bytes.load(Relaxed), 1 << 20);
    assert_eq!(s.read_ahead().0, 0, "a chunk read through is not held");
    // Three small chunks in a row after it.
    let mut small = vec![0u8; 64 << 10];
    for k in 0..3u64 {
        let len = small.len() as u64;
        let at = chunk.end + k * len;
        f.read_chunk_at(&mut small, at, at..at + len).unwrap();
        assert!(small[..] == data[at as usize..at as usize + small.len()]);
    }
    assert!(f.streaming());
}

/// Chunks read in an order that jumps about (zarr-python lays a shard's chunks in
/// Morton order; a reader in key order jumps inside it): the first chunk is fetched
/// alone, the second brings the rest of the object in one go, and every other chunk
/// reads from that; the file says it is being read through (the view then loads the
/// next shards ahead); each byte moves once; the budget is given back.
#[test]
fn a_second_chunk_in_any_order_fetches_the_rest_of_the_object() {
    use std::sync::atomic::Ordering::Relaxed;
    let chunk = 96u64 << 10;
    let n = 64u64;
    let index = 16 * n + 4; // after the chunks, as zarr-python writes it
    let data: Vec<u8> = (0..(chunk * n + index) as u32)
        .map(|i| (i % 241) as u8)
        .collect();
    let s = store();
    s.write_atomically(Path::new("shard"), &data).unwrap();
    let f = s.open(Path::new("shard")).unwrap().unwrap();
    let mut idx = vec![0u8; index as usize];
    f.read_at(&mut idx, chunk * n).unwrap(); // a shard is loaded by its index
    assert!(idx[..] == data[(chunk * n) as usize..]);
    // Not forward: each chunk a stride of 7 from the last (mod 64), starting inside.
    let order: Vec<u64> = (0..n).map(|i| (5 + 7 * i) % n).collect();
    let mut buf = vec![0u8; 64 << 10]; // the kernel asks in pieces
    for (k, &c) in order.iter().enumerate() {
        let range = c * chunk..(c + 1) * chunk;
        for at in (range.start..range.end).step_by(buf.len()) {
            let len = (range.end - at).min(buf.len() as u64) as usize;
            let got = f.read_chunk_at(&mut buf[..len], at, range.clone()).unwrap();
            assert_eq!(got, len);
            assert!(
                buf[..len] == data[at as usize..at as usize + len],
                "at {at}"
            );
        }
        if k == 0 {
            assert!(!f.streaming(), "one chunk is not a reader going through");
            let moved = s.counters().get_bytes.load(Relaxed);
            assert_eq!(moved, index + chunk, "the index, then a cold chunk");
        }
        if k == 1 {
            assert!(
                f.streaming(),
                "a second chunk: read through (pass {})",
                f.pass()
            );
        }
    }
    // Every chunk read: a pass over it done, the next starts afresh.
    assert_eq!(f.pass(), 1);
    // The index, the first chunk, then the object before it and after it (the index
    // again: a few bytes) side by side.
    assert_eq!(s.counters().gets.load(Relaxed), 4);
    assert_eq!(
        s.counters().get_bytes.load(Relaxed),
        data.len() as u64 + index
    );
    // Every chunk read: the window is let go, though its reader never asked again
    // for the index in it (else the budget stayed taken until the shard left the
    // cache, and later shards found none).
    assert_eq!(s.read_ahead().0, 0, "read through: let go");
    drop(f);
    // Beyond the budget: chunk by chunk, as before, and the budget stays whole.
    let mut s = store();
    s.budget = Arc::new(Budget::new(1 << 20));
    s.write_atomically(Path::new("shard"), &data).unwrap();
    let f = s.open(Path::new("shard")).unwrap().unwrap();
    let mut one = vec![0u8; chunk as usize];
    for &c in &order[..4] {
        let range = c * chunk..(c + 1) * chunk;
        f.read_chunk_at(&mut one, range.start, range.clone())
            .unwrap();
        assert!(one[..] == data[range.start as usize..range.end as usize]);
    }
    assert_eq!(s.counters().gets.load(Relaxed), 4);
    assert_eq!(s.read_ahead().0, 0);
}

/// A warmed object serves its reads from one GET made before them; a warm takes at
/// most half the read-ahead budget.
#[test]
fn a_warmed_object_is_read_from_one_get() {
    use std::sync::atomic::Ordering::Relaxed;
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 247) as u8).collect();
    let s = store();
    s.write_atomically(Path::new("shard"), &data).unwrap();
    let f = s.open(Path::new("shard")).unwrap().unwrap();
    f.warm();
    let mut buf = vec![0u8; 64 << 10];
    for at in (0..data.len()).step_by(buf.len()).rev() {
        f.read_at(&mut buf, at as u64).unwrap();
        assert!(buf[..] == data[at..at + buf.len()], "at {at}");
    }
    assert_eq!(s.counters().gets.load(Relaxed), 1);
    assert_eq!(settled_read_ahead(&s), 0, "read through: let go");
    // A warm that would take more than half the budget fetches nothing.
    let mut s = store();
    s.budget = Arc::new(Budget::new(3 << 19)); // 1.5 MiB: half is less than the object
    s.write_atomically(Path::new("shard"), &data).unwrap();
    let f = s.open(Path::new("shard")).unwrap().unwrap();
    f.warm();
    assert_eq!(s.counters().gets.load(Relaxed), 0);
    assert_eq!(s.read_ahead().0, 0);
}

/// A shard opened for a load ahead comes with its start in one GET, no HEAD, held within
/// the budget's half for loads ahead: a second one that would pass that half is opened
/// with a HEAD and fetches nothing ahead; reading it releases it all.
#[test]
fn an_open_for_a_load_ahead_fetches_its_start_within_half_the_budget() {
    use std::sync::atomic::Ordering::Relaxed;
    let data: Vec<u8> = (0..3u32 << 19).map(|i| (i % 241) as u8).collect(); // 1.5 MiB
    let mut s = store();
    s.budget = Arc::new(Budget::new(4 << 20));
    for name in ["a", "b"] {
        s.write_atomically(Path::new(name), &data).unwrap();
    }
    let want = Prefetch::Start(2 << 20);
    let a = s.open_with(Path::new("a"), want).unwrap().unwrap();
    let c = s.counters();
    assert_eq!((c.gets.load(Relaxed), c.heads.load(Relaxed)), (1, 0));
    assert_eq!(
        s.read_ahead().0,
        data.len() as u64,
        "held: what came, not what was asked"
    );
    let b = s.open_with(Path::new("b"), want).unwrap().unwrap();
    assert_eq!((c.gets.load(Relaxed), c.heads.load(Relaxed)), (1, 1));
    assert!(s.read_ahead().0 <= 2 << 20);
    let mut buf = vec![0u8; data.len()];
    a.read_at(&mut buf, 0).unwrap();
    assert!(buf == data);
    assert_eq!(c.gets.load(Relaxed), 1, "read from what the open fetched");
    drop((a, b));
    assert_eq!(s.read_ahead().0, 0, "the budget is given back");
    // The end of an object (a shard's index): one GET, placed at the object's end.
    let e = s
        .open_with(Path::new("b"), Prefetch::End(100))
        .unwrap()
        .unwrap();
    let mut tail = vec![0u8; 100];
    e.read_at(&mut tail, data.len() as u64 - 100).unwrap();
    assert!(tail[..] == data[data.len() - 100..]);
    assert_eq!(c.gets.load(Relaxed), 2);
}

/// An object the local cache holds whole is read from it as asked for: a load ahead
/// takes none of the memory budget, a second chunk does not fetch the whole object into
/// memory, and nothing is asked of the object store but the open's HEAD.
#[test]
fn an_object_the_local_cache_holds_is_read_from_it_without_filling_the_budget() {
    use std::sync::atomic::Ordering::Relaxed;
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3u32 << 20).map(|i| (i % 239) as u8).collect(); // 3 MiB
    let mut s = store();
    s.set_disk_cache(Arc::new(super::disk_cache::DiskCache::open_anywhere(
        dir.path(),
        64 << 20,
    )));
    s.write_atomically(Path::new("shard"), &data).unwrap();
    // A first mount's reads fill the cache.
    let f = s.open(Path::new("shard")).unwrap().unwrap();
    let mut buf = vec![0u8; data.len()];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), data.len());
    drop(f);
    let gets = s.counters().gets.load(Relaxed);
    // Later: a load ahead, then two chunks of 1 MiB, in pieces as the kernel asks.
    let f = s.open(Path::new("shard")).unwrap().unwrap();
    f.warm();
    assert_eq!(s.read_ahead().0, 0, "a load ahead held nothing in memory");
    for chunk in [1u64 << 20..2 << 20, 0..1 << 20] {
        for at in chunk.clone().step_by(128 << 10) {
            let mut piece = vec![0u8; 128 << 10];
            assert_eq!(
                f.read_chunk_at(&mut piece, at, chunk.clone()).unwrap(),
                piece.len()
            );
            assert!(piece[..] == data[at as usize..at as usize + piece.len()]);
        }
    }
    assert_eq!(
        s.counters().gets.load(Relaxed),
        gets,
        "no GET: all from the cache"
    );
    assert!(
        s.read_ahead().0 <= 1 << 20,
        "no whole object held: {}",
        s.read_ahead().0
    );
}

/// The first read of a freshly opened object moves only what it asks for (a cold
/// chunk read: the chunk, not a window).
#[test]
fn a_cold_read_fetches_only_what_it_asks_for() {
    use std::sync::atomic::Ordering::Relaxed;
    let s = store();
    s.write_atomically(Path::new("shard"), &vec![7u8; 1 << 20])
        .unwrap();
    let f = s.open(Path::new("shard")).unwrap().unwrap();
    let mut buf = vec![0u8; 4096];
    f.read_at(&mut buf, (1 << 20) - 4096).unwrap(); // an index at the end
    f.read_at(&mut buf, 8192).unwrap();
    assert_eq!(s.counters().gets.load(Relaxed), 2);
    assert_eq!(s.counters().get_bytes.load(Relaxed), 8192);
    // An index at the start, then the chunk right after it.
    let f = s.open(Path::new("shard")).unwrap().unwrap();
    f.read_at(&mut buf, 0).unwrap();
    f.read_at(&mut buf, 4096).unwrap();
    assert_eq!(s.counters().get_bytes.load(Relaxed), 4 * 4096);
}
