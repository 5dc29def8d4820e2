//! Tests of the shard cache ([`super::ShardCache`]).

use super::*;
use crate::format::index::{Endian, IndexCodecs};
use crate::format::{IndexLocation, ShardLevel};
use crate::store::memory::MemoryStore;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

fn layout() -> ShardLayout {
    let level = ShardLevel {
        chunk_shape: vec![2],
        chunks_per_shard: vec![2],
        index_codecs: IndexCodecs {
            endian: Endian::Little,
            crc32c: true,
        },
        index_location: IndexLocation::End,
    };
    ShardLayout::new(vec![8], vec![4], vec![level], vec![]).unwrap()
}

/// Holds every load until opened; counts the loads.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: parking_lot::Condvar,
    loads: AtomicUsize,
}

impl LoadHook for Gate {
    fn before_load(&self, _rel: &Path) -> Result<Option<Truncated>, ShardError> {
        self.loads.fetch_add(1, SeqCst);
        let mut open = self.open.lock();
        while !*open {
            self.opened.wait(&mut open);
        }
        Ok(None)
    }
}

/// An empty store, and a cache whose loads wait at the gate.
fn gated() -> (Arc<dyn Store>, Arc<Gate>, Arc<ShardCache>) {
    let gate = Arc::new(Gate::default());
    let mut cache = ShardCache::new(16, 1 << 20);
    cache.set_load_hook(gate.clone());
    (Arc::new(MemoryStore::new()), gate, Arc::new(cache))
}

impl Gate {
    fn open(&self) {
        *self.open.lock() = true;
        self.opened.notify_all();
    }
}

/// A reader of a shard being loaded ahead waits for that load and gets its shard (one
/// load, not two); a shard whose load ahead was overtaken by an invalidation (this
/// mount's commit) is not kept.
#[test]
fn a_load_ahead_is_waited_for_and_not_kept_across_an_invalidation() {
    let (store, gate, cache) = gated();
    let rel = Path::new("a/c/0");
    cache.prefetch(store.clone(), rel.to_path_buf(), layout());
    let reader = {
        let (cache, store) = (cache.clone(), store.clone());
        std::thread::spawn(move || cache.get(store.as_ref(), Path::new("a/c/0"), &layout(), false))
    };
    while cache.waiting.load(SeqCst) < 1 {
        std::thread::yield_now(); // the reader waits for the load ahead
    }
    assert!(!reader.is_finished());
    gate.open();
    let shard = reader.join().unwrap();
    assert_eq!(gate.loads.load(SeqCst), 1, "one load");
    assert!(Arc::ptr_eq(&shard, &cache.peek(rel).unwrap()));
    assert_eq!(cache.prefetches.load(SeqCst), 1);

    // Overtaken by an invalidation: dropped.
    *gate.open.lock() = false;
    let rel = Path::new("a/c/1");
    cache.prefetch(store.clone(), rel.to_path_buf(), layout());
    while gate.loads.load(SeqCst) < 2 {
        std::thread::yield_now();
    }
    cache.invalidate(rel);
    gate.open();
    cache.wait_for_load(rel);
    assert!(
        cache.peek(rel).is_none(),
        "a load from before the invalidation"
    );
}

/// Readers that miss one shard together make one load of it (zarr-python's threads
/// reading chunks of a shard side by side: one index read, not one each).
#[test]
fn readers_that_miss_together_load_once() {
    let (store, gate, cache) = gated();
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (cache, store) = (cache.clone(), store.clone());
            std::thread::spawn(move || {
                cache.get(store.as_ref(), Path::new("a/c/0"), &layout(), false)
            })
        })
        .collect();
    // One load under way (held at the gate), the three others waiting for it.
    while gate.loads.load(SeqCst) < 1 || cache.waiting.load(SeqCst) < 3 {
        std::thread::yield_now();
    }
    gate.open();
    let shards: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    assert_eq!(gate.loads.load(SeqCst), 1, "one load for four readers");
    assert!(shards.iter().all(|s| Arc::ptr_eq(s, &shards[0])));
    assert!(cache.loading.lock().is_empty());
}

/// A reader's load that an invalidation (this mount's commit) overtook gives the
/// reader what it read, and keeps nothing: the next reader loads the shard again.
#[test]
fn a_load_across_an_invalidation_is_not_kept() {
    let (store, gate, cache) = gated();
    let reader = {
        let (cache, store) = (cache.clone(), store.clone());
        std::thread::spawn(move || cache.get(store.as_ref(), Path::new("a/c/0"), &layout(), false))
    };
    while gate.loads.load(SeqCst) < 1 {
        std::thread::yield_now();
    }
    cache.invalidate(Path::new("a/c/0"));
    gate.open();
    let shard = reader.join().unwrap();
    assert!(shard.index().is_ok());
    assert!(cache.peek(Path::new("a/c/0")).is_none());
    cache.get(store.as_ref(), Path::new("a/c/0"), &layout(), false);
    assert_eq!(gate.loads.load(SeqCst), 2);
    assert!(cache.peek(Path::new("a/c/0")).is_some());
}

/// A commit's shard is cached in place of what was loaded before, and hits; one whose
/// ticket an invalidation overtook (a change this mount made or saw during the
/// commit, which may be later than it) is not, nor one the store could not say, and
/// what was cached goes.
#[test]
fn a_committed_shard_is_cached_unless_overtaken() {
    use crate::format::ShardIndex;
    use crate::store::StoredShard;
    let store = MemoryStore::new();
    let cache = ShardCache::new(16, 1 << 20);
    let rel = Path::new("a/c/0");
    let committed = || Shard::committed(rel, StoredShard::removed(), ShardIndex::empty(2));
    let loaded = cache.get(&store, rel, &layout(), true);
    let ticket = cache.before_commit(rel);
    cache.committed(rel, ticket, Some(committed()));
    let cached = cache.peek(rel).expect("cached");
    assert!(!Arc::ptr_eq(&cached, &loaded));
    assert!(Arc::ptr_eq(
        &cache.get(&store, rel, &layout(), true),
        &cached
    ));
    assert_eq!((cache.misses.load(SeqCst), cache.hits.load(SeqCst)), (1, 1));
    let ticket = cache.before_commit(rel);
    cache.invalidate(rel);
    cache.get(&store, rel, &layout(), true);
    cache.committed(rel, ticket, Some(committed()));
    assert!(cache.peek(rel).is_none(), "overtaken by an invalidation");
    cache.get(&store, rel, &layout(), true);
    let ticket = cache.before_commit(rel);
    cache.committed(rel, ticket, None);
    assert!(cache.peek(rel).is_none(), "the store could not say");
}

/// A shard path that is not a regular file (a directory) is loaded, and logged, once:
/// a revalidation finds the same thing there and keeps it, until it changes.
#[test]
fn a_shard_path_that_is_a_directory_is_loaded_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("a/c/0")).unwrap();
    let store = crate::store::LocalStore::open(dir.path()).unwrap();
    let gate = Arc::new(Gate::default());
    gate.open();
    let mut cache = ShardCache::new(16, 1 << 20);
    cache.set_load_hook(gate.clone());
    let rel = Path::new("a/c/0");
    for _ in 0..5 {
        let shard = cache.get(&store, rel, &layout(), true);
        assert!(shard.index().is_err());
    }
    assert_eq!(gate.loads.load(SeqCst), 1, "loaded once");
    // Replaced by a file: loaded again.
    std::fs::remove_dir(dir.path().join("a/c/0")).unwrap();
    std::fs::write(dir.path().join("a/c/0"), b"not a shard").unwrap();
    assert!(cache.get(&store, rel, &layout(), true).index().is_err());
    assert_eq!(gate.loads.load(SeqCst), 2);
}
