//! Staged chunks: committed by a writer, visible to every reader of the mount, not yet in
//! a shard. Grouped by array; a flush takes an array's staged chunks into `flushing`
//! (still visible) and drops them once their shards are durable.
//!
//! Every staged chunk carries its *close time*: when the close (or rename, fsync,
//! unlink) that staged it happened, read from the wall clock and kept strictly
//! increasing within the mount. The merge rule (`write::merge`) compares it with the
//! times recorded in the shard, so that across mounts the write closed last wins.
//!
//! Memory is bounded: [`Staging::wait_for_room`] blocks a writer while the staged bytes
//! exceed the limit, until a flush frees them.
//!
//! Write-behind: an array whose staged bytes grow past [`Staging::set_write_behind`]'s
//! threshold is *due*, and [`Staging::wait_due`] hands it to a thread that flushes it
//! while its writer goes on, so that the disk writes while the writer writes (a final
//! `fsync` then has only the rest to make durable).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};

/// Bytes of a staged chunk; `None` stages a deletion.
pub type Staged = Option<Arc<Vec<u8>>>;

/// A staged chunk and its close time (ns since the epoch).
type Entry = (Staged, u64);

/// One chunk taken for a flush.
#[derive(Clone, Debug)]
pub struct StagedChunk {
    pub coords: Vec<u64>,
    pub data: Staged,
    /// Close time, nanoseconds since the Unix epoch.
    pub closed: u64,
}

#[derive(Default)]
struct ArrayStage {
    staged: BTreeMap<Vec<u64>, Entry>,
    flushing: BTreeMap<Vec<u64>, Entry>,
    /// When the oldest chunk now staged was staged.
    since: Option<Instant>,
    /// Bytes (weights) of `staged`.
    staged_bytes: u64,
}

#[derive(Default)]
struct Inner {
    arrays: HashMap<PathBuf, ArrayStage>,
    bytes: u64,
    /// Arrays past the write-behind threshold, for [`Staging::wait_due`].
    due: Vec<PathBuf>,
    /// [`Staging::wake`] was called: `wait_due` returns at once.
    woken: bool,
}

/// All staged chunks of a mount.
pub struct Staging {
    inner: Mutex<Inner>,
    limit: u64,
    room: Condvar,
    /// The last close time handed out.
    clock: AtomicU64,
    /// Staged bytes of one array that make it due for a flush behind its writer; 0: never.
    behind: AtomicU64,
    due_cv: Condvar,
}

/// Now, in nanoseconds since the Unix epoch (at least 1).
pub fn wall_clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .max(1)
}

fn weight(s: &Staged) -> u64 {
    s.as_ref().map_or(0, |b| b.len() as u64) + 64
}

impl Staging {
    /// Staging that holds about `limit` bytes before writers wait.
    pub fn new(limit: u64) -> Self {
        Staging {
            inner: Mutex::new(Inner::default()),
            limit,
            room: Condvar::new(),
            clock: AtomicU64::new(0),
            behind: AtomicU64::new(0),
            due_cv: Condvar::new(),
        }
    }

    /// Flush an array behind its writer once it has `bytes` staged (0: only when idle, at
    /// `fsync`, unmount or a full buffer). Each crossing of the threshold counts once: an
    /// array whose flush failed (its chunks back in staging) is not due again until a
    /// flush has taken its chunks.
    pub fn set_write_behind(&self, bytes: u64) {
        self.behind.store(bytes, Ordering::Relaxed);
    }

    /// Arrays due for a flush behind their writers, once there is one, within `max`, or
    /// after [`Staging::wake`]. Each is handed out once per crossing of the threshold.
    pub fn wait_due(&self, max: Duration) -> Vec<PathBuf> {
        let deadline = Instant::now() + max;
        let mut inner = self.inner.lock();
        while inner.due.is_empty() && !inner.woken {
            if self.due_cv.wait_until(&mut inner, deadline).timed_out() {
                break;
            }
        }
        inner.woken = false;
        std::mem::take(&mut inner.due)
    }

    /// Make a [`Staging::wait_due`] under way return now (the mount is stopping).
    pub fn wake(&self) {
        self.inner.lock().woken = true;
        self.due_cv.notify_all();
    }

    /// A close time for a commit happening now: the wall clock, but always later than
    /// the last one this mount handed out (a clock stepped back cannot reorder two
    /// closes of one mount).
    pub fn close_time(&self) -> u64 {
        let now = wall_clock_ns();
        let prev = self
            .clock
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
                Some(now.max(last + 1))
            })
            .expect("always Some");
        now.max(prev + 1)
    }

    /// The staged state of a chunk: `Some(Some(bytes))` written, `Some(None)` deleted,
    /// `None` not staged (read the shard).
    pub fn get(&self, array: &Path, coords: &[u64]) -> Option<Staged> {
        let inner = self.inner.lock();
        let a = inner.arrays.get(array)?;
        a.staged
            .get(coords)
            .or_else(|| a.flushing.get(coords))
            .map(|(s, _)| s.clone())
    }

    /// Stage a chunk (or its deletion), closed now.
    pub fn put(&self, array: &Path, coords: Vec<u64>, data: Staged) {
        let closed = self.close_time();
        self.put_closed(array, coords, data, closed);
    }

    /// Stage a chunk (or its deletion) closed at `closed` (ns since the epoch).
    pub fn put_closed(&self, array: &Path, coords: Vec<u64>, data: Staged, closed: u64) {
        let mut inner = self.inner.lock();
        let w = weight(&data);
        inner.bytes += w;
        let a = inner.arrays.entry(array.to_path_buf()).or_default();
        a.since.get_or_insert_with(Instant::now);
        let before = a.staged_bytes;
        a.staged_bytes += w;
        let old = a.staged.insert(coords, (data, closed));
        let old_w = old.map_or(0, |(old, _)| weight(&old));
        a.staged_bytes -= old_w;
        let now = a.staged_bytes;
        inner.bytes -= old_w;
        let behind = self.behind.load(Ordering::Relaxed);
        if behind > 0 && before < behind && now >= behind {
            inner.due.push(array.to_path_buf());
            self.due_cv.notify_one();
        }
    }

    /// Bytes staged or being flushed.
    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }

    pub fn over_limit(&self) -> bool {
        self.bytes() > self.limit
    }

    /// Block while staging is over its limit (a flush in another thread frees room), for
    /// at most `max`. Returns whether there is room.
    pub fn wait_for_room(&self, max: Duration) -> bool {
        let deadline = Instant::now() + max;
        let mut inner = self.inner.lock();
        while inner.bytes > self.limit {
            if self.room.wait_until(&mut inner, deadline).timed_out() {
                return inner.bytes <= self.limit;
            }
        }
        true
    }

    /// Staged entries under the coordinate prefix `prefix` (for listings).
    pub fn under(&self, array: &Path, prefix: &[u64]) -> Vec<(Vec<u64>, bool)> {
        let inner = self.inner.lock();
        let Some(a) = inner.arrays.get(array) else {
            return Vec::new();
        };
        let mut out: BTreeMap<Vec<u64>, bool> = BTreeMap::new();
        for (c, (s, _)) in a.flushing.iter().chain(a.staged.iter()) {
            if c.starts_with(prefix) {
                out.insert(c.clone(), s.is_some());
            }
        }
        out.into_iter().collect()
    }

    /// Arrays with chunks not yet durable: staged, or taken by a flush under way (a
    /// flush of every array, as at `fsync` of the root, must wait for that one: its
    /// chunks may yet come back, if it fails). With `idle`, only those with chunks
    /// staged at least that long ago.
    pub fn arrays(&self, idle: Option<Duration>) -> Vec<PathBuf> {
        let inner = self.inner.lock();
        inner
            .arrays
            .iter()
            .filter(|(_, a)| match idle {
                None => !a.staged.is_empty() || !a.flushing.is_empty(),
                Some(_) => !a.staged.is_empty(),
            })
            .filter(|(_, a)| idle.is_none_or(|d| a.since.is_some_and(|t| t.elapsed() >= d)))
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Whether `array` has chunks staged (not yet taken by a flush).
    pub fn holds(&self, array: &Path) -> bool {
        self.inner
            .lock()
            .arrays
            .get(array)
            .is_some_and(|a| !a.staged.is_empty())
    }

    /// Move an array's staged chunks to `flushing` and return them for a flush.
    pub fn take(&self, array: &Path) -> Vec<StagedChunk> {
        let mut inner = self.inner.lock();
        let Some(a) = inner.arrays.get_mut(array) else {
            return Vec::new();
        };
        let staged = std::mem::take(&mut a.staged);
        a.since = None;
        a.staged_bytes = 0;
        let out: Vec<_> = staged
            .iter()
            .map(|(c, (s, t))| StagedChunk {
                coords: c.clone(),
                data: s.clone(),
                closed: *t,
            })
            .collect();
        a.flushing.extend(staged);
        out
    }

    /// The chunks `taken` are durable in their shards: forget them (unless staged again).
    pub fn done(&self, array: &Path, taken: &[StagedChunk]) {
        let mut inner = self.inner.lock();
        let mut freed = 0;
        if let Some(a) = inner.arrays.get_mut(array) {
            for t in taken {
                if a.flushing.get(&t.coords).is_some_and(|f| same(f, t)) {
                    a.flushing.remove(&t.coords);
                    freed += weight(&t.data);
                }
            }
            if a.staged.is_empty() && a.flushing.is_empty() {
                inner.arrays.remove(array);
            }
        }
        inner.bytes -= freed;
        self.room.notify_all();
    }

    /// A flush failed: put `taken` back so that a later flush retries them.
    pub fn restore(&self, array: &Path, taken: Vec<StagedChunk>) {
        let mut inner = self.inner.lock();
        let a = inner.arrays.entry(array.to_path_buf()).or_default();
        let mut freed = 0;
        for t in taken {
            if a.flushing.get(&t.coords).is_some_and(|f| same(f, &t)) {
                a.flushing.remove(&t.coords);
                match a.staged.entry(t.coords) {
                    std::collections::btree_map::Entry::Vacant(e) => {
                        a.staged_bytes += weight(&t.data);
                        e.insert((t.data, t.closed));
                    }
                    // Written again meanwhile: the newer write stays; this one is gone.
                    std::collections::btree_map::Entry::Occupied(_) => freed += weight(&t.data),
                }
            }
        }
        a.since.get_or_insert_with(Instant::now);
        inner.bytes -= freed;
        if freed > 0 {
            self.room.notify_all();
        }
    }

    /// Drop everything staged for `array` (the array was removed).
    pub fn discard(&self, array: &Path) {
        let mut inner = self.inner.lock();
        if let Some(a) = inner.arrays.remove(array) {
            let freed: u64 = a
                .staged
                .values()
                .chain(a.flushing.values())
                .map(|(s, _)| weight(s))
                .sum();
            inner.bytes -= freed;
        }
        self.room.notify_all();
    }
}

/// Whether the entry `e` is still the chunk `t` that was taken (not staged again since).
fn same(e: &Entry, t: &StagedChunk) -> bool {
    e.1 == t.closed
        && match (&e.0, &t.data) {
            (Some(x), Some(y)) => Arc::ptr_eq(x, y),
            (None, None) => true,
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_chunks_stay_visible_while_flushing() {
        let s = Staging::new(1 << 20);
        let a = Path::new("arr");
        s.put(a, vec![0, 1], Some(Arc::new(vec![1, 2, 3])));
        s.put(a, vec![0, 2], None);
        let taken = s.take(a);
        assert_eq!(taken.len(), 2);
        assert_eq!(s.get(a, &[0, 1]).unwrap().unwrap().as_slice(), [1, 2, 3]);
        assert_eq!(s.get(a, &[0, 2]), Some(None));
        // A write while flushing wins over the flushed one, and survives `done`.
        s.put(a, vec![0, 1], Some(Arc::new(vec![9])));
        s.done(a, &taken);
        assert_eq!(s.get(a, &[0, 1]).unwrap().unwrap().as_slice(), [9]);
        assert_eq!(s.get(a, &[0, 2]), None);
        assert_eq!(s.arrays(None), vec![PathBuf::from("arr")]);
        let again = s.take(a);
        s.done(a, &again);
        assert_eq!(s.bytes(), 0);
        assert!(s.arrays(None).is_empty());
    }

    #[test]
    fn a_failed_flush_restores_its_chunks() {
        let s = Staging::new(1 << 20);
        let a = Path::new("arr");
        s.put(a, vec![3], Some(Arc::new(vec![7; 10])));
        let taken = s.take(a);
        // While the flush is under way the array is still listed (a flush of every
        // array waits for this one), but not as idle.
        assert_eq!(s.arrays(None), vec![PathBuf::from("arr")]);
        assert!(s.arrays(Some(Duration::ZERO)).is_empty());
        s.restore(a, taken);
        assert_eq!(s.take(a).len(), 1);
    }

    #[test]
    fn a_failed_flush_of_a_chunk_written_again_frees_the_old_bytes() {
        let s = Staging::new(1 << 20);
        let a = Path::new("arr");
        s.put(a, vec![3], Some(Arc::new(vec![7; 10])));
        let taken = s.take(a);
        s.put(a, vec![3], Some(Arc::new(vec![8; 20])));
        s.restore(a, taken.clone());
        s.done(a, &taken);
        assert_eq!(s.bytes(), 20 + 64, "only the newer write is held");
        let again = s.take(a);
        assert_eq!(again[0].data.as_deref().unwrap(), &vec![8; 20]);
        s.done(a, &again);
        assert_eq!(s.bytes(), 0);
    }

    #[test]
    fn an_array_is_due_behind_its_writer_once_per_crossing() {
        let s = Staging::new(1 << 20);
        let a = Path::new("arr");
        s.put(a, vec![0], Some(Arc::new(vec![0; 100])));
        assert!(s.wait_due(Duration::ZERO).is_empty(), "write-behind is off");
        s.set_write_behind(400); // three chunks: each weighs 100 + 64
        s.put(a, vec![1], Some(Arc::new(vec![0; 100])));
        assert!(s.wait_due(Duration::ZERO).is_empty(), "under the threshold");
        // Rewriting a chunk does not count twice.
        s.put(a, vec![1], Some(Arc::new(vec![0; 100])));
        assert!(
            s.wait_due(Duration::ZERO).is_empty(),
            "a rewrite is not growth"
        );
        s.put(a, vec![2], Some(Arc::new(vec![0; 100])));
        assert_eq!(s.wait_due(Duration::ZERO), vec![PathBuf::from("arr")]);
        s.put(a, vec![3], Some(Arc::new(vec![0; 100])));
        assert!(s.wait_due(Duration::ZERO).is_empty(), "once per crossing");
        // A failed flush puts the chunks back: not due again until a flush took them.
        let taken = s.take(a);
        s.restore(a, taken);
        s.put(a, vec![4], Some(Arc::new(vec![0; 100])));
        assert!(s.wait_due(Duration::ZERO).is_empty(), "not after a failure");
        let taken = s.take(a);
        s.done(a, &taken);
        for c in 5..8 {
            s.put(a, vec![c], Some(Arc::new(vec![0; 100])));
        }
        assert_eq!(s.wait_due(Duration::ZERO), vec![PathBuf::from("arr")]);
        // A waiter is woken by a crossing in another thread, and by `wake`.
        let s = Arc::new(s);
        let waiter = || {
            let s2 = s.clone();
            let t = std::thread::spawn(move || s2.wait_due(Duration::from_secs(30)));
            std::thread::sleep(Duration::from_millis(20));
            t
        };
        let t = waiter();
        let taken = s.take(a);
        s.done(a, &taken);
        for c in 8..11 {
            s.put(a, vec![c], Some(Arc::new(vec![0; 100])));
        }
        assert_eq!(t.join().unwrap(), vec![PathBuf::from("arr")]);
        let t = waiter();
        s.wake();
        assert!(t.join().unwrap().is_empty());
    }

    #[test]
    fn writers_wait_for_room_until_a_flush_frees_it() {
        let s = Arc::new(Staging::new(100));
        let a = Path::new("arr");
        s.put(a, vec![0], Some(Arc::new(vec![0; 200])));
        assert!(!s.wait_for_room(Duration::from_millis(10)));
        let s2 = s.clone();
        let flusher = std::thread::spawn(move || {
            let taken = s2.take(Path::new("arr"));
            s2.done(Path::new("arr"), &taken);
        });
        assert!(s.wait_for_room(Duration::from_secs(10)));
        flusher.join().unwrap();
    }
}
