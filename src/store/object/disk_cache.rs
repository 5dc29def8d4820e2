//! The local cache of object bytes (`--cache DIR`): ranges of objects as fetched,
//! kept on a local disk under the object's ETag, so that a second mount (or the same
//! one, after the read-ahead let them go) reads them without a request. Valid across
//! mounts and processes: an object is found only at the version (ETag) the mount sees,
//! and a replaced object is simply another entry.
//!
//! One entry per object version: `DIR/shardfs-cache-v1/HH/HASH.data`, a sparse file
//! of the object's bytes at their offsets, and `HASH.map`, a log of the ranges written
//! into it in blocks of 64 KiB at their offsets, each with its CRC-32C (a read of one
//! chunk checks the blocks it lies in). A fetch's records are appended (one `write` with
//! `O_APPEND`, atomic on a local file system) after its bytes are written, and the bytes
//! are checked against them at every read: a record whose bytes did not reach the disk (a crash
//! between the two writes), or that another version of shardfs wrote differently, is a
//! miss, never wrong bytes. The map's first line names the object and its ETag, so a
//! hash collision is a miss too.
//!
//! Bounded by `--cache-size` for the whole directory (counted at start and as this
//! process writes; another mount sharing the directory counts its own): past it, whole
//! entries go, least recently used first (by the map's mtime, touched at each use). No
//! entry is written while the disk has less than 5% or 1 GiB free. Failures of the cache
//! (a full disk, a removed directory) are logged once and make misses: the object store
//! is always the answer.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::{self, Write};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

/// What the directory's layout is called: another layout, another name.
const LAYOUT: &str = "shardfs-cache-v1";

/// The size of the blocks bytes are recorded in, each with its CRC-32C: a read reads and
/// checks the blocks it lies in.
const BLOCK: u64 = 64 << 10;

/// The least free space an entry is written with: 5% of the disk, and at least this.
const MIN_FREE: u64 = 1 << 30;

/// The free space an entry leaves on a disk of `total` bytes: 5%, and at least
/// [`MIN_FREE`].
fn leave_free(total: u64) -> u64 {
    MIN_FREE.max(total / 20)
}

/// A local directory of object ranges.
pub struct DiskCache {
    root: PathBuf,
    cap: u64,
    /// The free space to leave on a disk of the given size ([`leave_free`]; tests that
    /// must not depend on the machine's free space leave none).
    min_free: fn(u64) -> u64,
    /// Bytes of the directory's entries, as counted at start and since.
    used: AtomicU64,
    /// Entries open in this process: their ranges as read from their maps.
    open: Mutex<HashMap<PathBuf, Arc<Entry>>>,
    /// Whether a failure was logged (once per process).
    said: AtomicBool,
    /// Ranges served from the cache, and bytes (for `stats`).
    pub hits: AtomicU64,
    pub hit_bytes: AtomicU64,
}

/// One object version's ranges.
struct Entry {
    data: File,
    map: Mutex<File>,
    /// The ranges the map lists, with their CRC-32C.
    ranges: Mutex<Vec<(Range<u64>, u32)>>,
    /// When this process last marked the entry used.
    touched: Mutex<Option<std::time::Instant>>,
}

impl DiskCache {
    /// The cache in `dir` (made if missing), holding at most `cap` bytes.
    pub fn open(dir: &Path, cap: u64) -> io::Result<DiskCache> {
        let root = dir.join(LAYOUT);
        std::fs::create_dir_all(&root)?;
        let cache = DiskCache {
            used: AtomicU64::new(du(&root)),
            root,
            cap,
            min_free: leave_free,
            open: Mutex::default(),
            said: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            hit_bytes: AtomicU64::new(0),
        };
        cache.evict(0);
        Ok(cache)
    }

    /// The directory the cache lives in (what `--cache` named).
    /// The cache in `dir` leaving no free space, for tests (which must not depend on how
    /// full the machine's disk is: at 96% they failed, the cache rightly writing nothing).
    #[cfg(test)]
    pub(super) fn open_anywhere(dir: &Path, cap: u64) -> DiskCache {
        DiskCache {
            min_free: |_| 0,
            ..DiskCache::open(dir, cap).unwrap()
        }
    }

    pub fn describe(&self) -> String {
        self.root
            .parent()
            .unwrap_or(&self.root)
            .display()
            .to_string()
    }

    /// Bytes held now, as counted.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn failed(&self, what: &str, e: &io::Error) {
        if !self.said.swap(true, Ordering::Relaxed) {
            log::warn!(
                "the cache in {}: {what}: {e}; reads go to the store",
                self.describe()
            );
        }
    }

    /// The path stem of `object` at `etag`, and its first map line.
    fn stem(&self, object: &str, etag: &str) -> (PathBuf, String) {
        let name = format!("{object}\n{etag}\n");
        let mut h1 = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut h1);
        let h2 = crc32c::crc32c(name.as_bytes());
        let hash = format!("{:016x}{:08x}", h1.finish(), h2);
        (self.root.join(&hash[..2]).join(&hash), name)
    }

    /// The entry of `object` at `etag`, opened (made when `make`).
    fn entry(&self, object: &str, etag: &str, make: bool) -> Option<Arc<Entry>> {
        let (stem, name) = self.stem(object, etag);
        if let Some(e) = self.open.lock().get(&stem) {
            return Some(e.clone());
        }
        let map_path = stem.with_extension("map");
        let data_path = stem.with_extension("data");
        let opened = (|| -> io::Result<Option<Entry>> {
            let exists = map_path.exists();
            if !exists && !make {
                return Ok(None);
            }
            if !exists {
                std::fs::create_dir_all(stem.parent().unwrap_or(&self.root))?;
            }
            let mut map = OpenOptions::new()
                .create(true)
                .append(true)
                .read(true)
                .open(&map_path)?;
            let data = OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&data_path)?;
            let text = std::fs::read_to_string(&map_path)?;
            let ranges = if text.is_empty() {
                map.write_all(name.as_bytes())?;
                Vec::new()
            } else if let Some(records) = text.strip_prefix(&name) {
                parse_records(records)
            } else {
                // Another object that hashes alike: not this one's.
                return Ok(None);
            };
            Ok(Some(Entry {
                data,
                map: Mutex::new(map),
                ranges: Mutex::new(ranges),
                touched: Mutex::new(None),
            }))
        })();
        match opened {
            Ok(Some(e)) => {
                let e = Arc::new(e);
                let mut open = self.open.lock();
                if open.len() >= 1024 {
                    open.clear();
                }
                Some(open.entry(stem).or_insert(e).clone())
            }
            Ok(None) => None,
            Err(e) => {
                self.failed("opening an entry", &e);
                None
            }
        }
    }

    /// Bytes `range` of `object` at `etag`, if the cache holds them all, checked.
    pub fn get(&self, object: &str, etag: &str, range: Range<u64>) -> Option<bytes::Bytes> {
        let entry = self.entry(object, etag, false)?;
        // The records that cover it, in order, each checked whole.
        let records: Vec<_> = {
            let ranges = entry.ranges.lock();
            covering(&ranges, &range)?
        };
        let mut out = vec![0u8; (range.end - range.start) as usize];
        for (r, crc) in records {
            let mut buf = vec![0u8; (r.end - r.start) as usize];
            if entry.data.read_exact_at(&mut buf, r.start).is_err() || crc32c::crc32c(&buf) != crc {
                // Not what was recorded: forget it (a later fetch records it again).
                entry.ranges.lock().retain(|(x, _)| *x != r);
                return None;
            }
            let from = r.start.max(range.start);
            let to = r.end.min(range.end);
            out[(from - range.start) as usize..(to - range.start) as usize]
                .copy_from_slice(&buf[(from - r.start) as usize..(to - r.start) as usize]);
        }
        // Used: the entry is the most recent (its map's mtime), said at most once a
        // minute (an open and a utimes per chunk read cost more than the read).
        let mut touched = entry.touched.lock();
        if touched.is_none_or(|t| t.elapsed() > std::time::Duration::from_secs(60)) {
            *touched = Some(std::time::Instant::now());
            let _ = entry.map.lock().set_modified(std::time::SystemTime::now());
        }
        drop(touched);
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.hit_bytes
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        Some(out.into())
    }

    /// Whether the cache holds all of bytes `range` of `object` at `etag` (as recorded:
    /// a read checks them).
    pub fn holds(&self, object: &str, etag: &str, range: Range<u64>) -> bool {
        self.entry(object, etag, false)
            .is_some_and(|e| covering(&e.ranges.lock(), &range).is_some())
    }

    /// Ask the kernel to read bytes `range` of `object` at `etag` from the disk in the
    /// background (`POSIX_FADV_WILLNEED`), so that the reads that follow find them in the
    /// page cache: a shard loaded ahead from the cache costs no memory of the budget and
    /// keeps no reader waiting for its whole read.
    pub fn will_need(&self, object: &str, etag: &str, range: Range<u64>) {
        if let Some(e) = self.entry(object, etag, false) {
            let len = std::num::NonZeroU64::new(range.end.saturating_sub(range.start));
            let _ = rustix::fs::fadvise(&e.data, range.start, len, rustix::fs::Advice::WillNeed);
        }
    }

    /// Keep `bytes`, fetched at `start` of `object` at `etag`: recorded in blocks of
    /// [`BLOCK`] at their offsets, each with its CRC, so that a later read of one chunk
    /// reads and checks the blocks it lies in, not all that was fetched with it (a whole
    /// shard loaded ahead).
    pub fn put(&self, object: &str, etag: &str, start: u64, bytes: &[u8]) {
        if bytes.is_empty() || bytes.len() as u64 > self.cap / 4 || !self.room(bytes.len() as u64) {
            return;
        }
        let Some(entry) = self.entry(object, etag, true) else {
            return;
        };
        let range = start..start + bytes.len() as u64;
        if covering(&entry.ranges.lock(), &range).is_some() {
            return;
        }
        let mut records = String::new();
        let mut blocks = Vec::new();
        let mut at = range.start;
        while at < range.end {
            let end = ((at / BLOCK + 1) * BLOCK).min(range.end);
            let piece = &bytes[(at - start) as usize..(end - start) as usize];
            let crc = crc32c::crc32c(piece);
            records.push_str(&format!("{at} {end} {crc:08x}\n"));
            blocks.push((at..end, crc));
            at = end;
        }
        // The bytes first, then their records in one append: a record never names bytes
        // that were not written (but for a crash, which the CRC catches).
        let written = entry
            .data
            .write_all_at(bytes, start)
            .and_then(|()| entry.map.lock().write_all(records.as_bytes()));
        match written {
            Ok(()) => {
                entry.ranges.lock().extend(blocks);
                self.used
                    .fetch_add(bytes.len() as u64 + records.len() as u64, Ordering::Relaxed);
            }
            Err(e) => self.failed("writing", &e),
        }
    }

    /// Whether `n` more bytes may be written: within the cap (making room by eviction)
    /// and leaving the disk its free space.
    fn room(&self, n: u64) -> bool {
        if self.used() + n > self.cap {
            self.evict(n);
        }
        let free = match rustix::fs::statvfs(&self.root) {
            Ok(s) => {
                let free = s.f_bavail.saturating_mul(s.f_frsize);
                let total = s.f_blocks.saturating_mul(s.f_frsize);
                free.saturating_sub(n) >= (self.min_free)(total)
            }
            Err(_) => false,
        };
        free && self.used() + n <= self.cap
    }

    /// Remove entries, least recently used first, until `n` more bytes fit in the cap.
    fn evict(&self, n: u64) {
        if self.used() + n <= self.cap {
            return;
        }
        let mut entries = Vec::new();
        for sub in std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
        {
            for f in std::fs::read_dir(sub.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let p = f.path();
                if p.extension().is_some_and(|e| e == "map")
                    && let Ok(m) = f.metadata()
                {
                    let data = p.with_extension("data");
                    let size = m.len() + std::fs::metadata(&data).map_or(0, |d| allocated(&d));
                    entries.push((m.modified().ok(), p, size));
                }
            }
        }
        entries.sort_by_key(|(t, _, _)| *t);
        let mut used: u64 = entries.iter().map(|(_, _, s)| s).sum();
        for (_, map, size) in entries {
            if used + n <= self.cap {
                break;
            }
            let stem = map.with_extension("");
            self.open.lock().remove(&stem);
            let _ = std::fs::remove_file(&map);
            let _ = std::fs::remove_file(map.with_extension("data"));
            used = used.saturating_sub(size);
        }
        self.used.store(used, Ordering::Relaxed);
    }
}

/// The records of a map after its first line: `START END CRC` a line; a line cut short
/// (a crash while it was appended) or malformed is left out.
fn parse_records(text: &str) -> Vec<(Range<u64>, u32)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let start = f.next()?.parse().ok()?;
            let end: u64 = f.next()?.parse().ok()?;
            let crc = u32::from_str_radix(f.next()?, 16).ok()?;
            (start < end && f.next().is_none()).then_some((start..end, crc))
        })
        .collect()
}

/// Records that together cover `want`, in order; `None` when there is a gap.
fn covering(ranges: &[(Range<u64>, u32)], want: &Range<u64>) -> Option<Vec<(Range<u64>, u32)>> {
    let mut out = Vec::new();
    let mut at = want.start;
    while at < want.end {
        // The record reaching furthest among those that hold `at`.
        let best = ranges
            .iter()
            .filter(|(r, _)| r.start <= at && at < r.end)
            .max_by_key(|(r, _)| r.end)?;
        at = best.0.end;
        out.push(best.clone());
    }
    Some(out)
}

/// Bytes a file takes on disk (a sparse data file: what was written).
fn allocated(m: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    m.blocks() * 512
}

/// Bytes the entries under `root` take.
fn du(root: &Path) -> u64 {
    let mut total = 0;
    for sub in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(sub.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(m) = f.metadata() {
                total += if f.path().extension().is_some_and(|e| e == "data") {
                    allocated(&m)
                } else {
                    m.len()
                };
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_anywhere(dir: &Path, cap: u64) -> DiskCache {
        DiskCache::open_anywhere(dir, cap)
    }

    #[test]
    fn nothing_is_written_that_would_leave_the_disk_less_than_its_free_space() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache {
            min_free: |_| u64::MAX,
            ..DiskCache::open(dir.path(), 64 << 20).unwrap()
        };
        c.put("s3://b/k", "e1", 0, b"0123456789");
        assert!(c.get("s3://b/k", "e1", 0..10).is_none());
        assert_eq!(c.used(), 0);
        let c = open_anywhere(dir.path(), 64 << 20);
        c.put("s3://b/k", "e1", 0, b"0123456789");
        assert_eq!(&c.get("s3://b/k", "e1", 0..10).unwrap()[..], b"0123456789");
        // 5% of a large disk; at least 1 GiB of a small one.
        assert_eq!(leave_free(100 << 30), 5 << 30);
        assert_eq!(leave_free(4 << 30), 1 << 30);
    }

    #[test]
    fn a_read_checks_the_blocks_it_lies_in_not_all_that_was_fetched_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let c = open_anywhere(dir.path(), 64 << 20);
        // A whole shard fetched at once (a load ahead): 4 blocks and a half.
        let len = 4 * BLOCK + BLOCK / 2;
        let bytes: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        c.put("s3://b/k", "e1", 0, &bytes);
        assert!(c.holds("s3://b/k", "e1", 0..len));
        assert!(!c.holds("s3://b/k", "e1", 0..len + 1), "past what was kept");
        assert!(!c.holds("s3://b/k", "e2", 0..1), "another version");
        // The same bytes again add nothing.
        let used = c.used();
        c.put(
            "s3://b/k",
            "e1",
            BLOCK,
            &bytes[BLOCK as usize..2 * BLOCK as usize],
        );
        assert_eq!(c.used(), used);
        // One block's bytes go bad: a read inside another block still hits, one that
        // touches the bad block misses.
        let (stem, _) = c.stem("s3://b/k", "e1");
        let data = OpenOptions::new()
            .write(true)
            .open(stem.with_extension("data"))
            .unwrap();
        data.write_all_at(b"XX", 3 * BLOCK + 7).unwrap();
        let again = open_anywhere(dir.path(), 64 << 20);
        let chunk = BLOCK + 100..2 * BLOCK + 100;
        assert_eq!(
            &again.get("s3://b/k", "e1", chunk.clone()).unwrap()[..],
            &bytes[chunk.start as usize..chunk.end as usize]
        );
        assert!(
            again
                .get("s3://b/k", "e1", 3 * BLOCK - 1..3 * BLOCK + 1)
                .is_none()
        );
        assert_eq!(
            &again.get("s3://b/k", "e1", 4 * BLOCK..len).unwrap()[..],
            &bytes[4 * BLOCK as usize..]
        );
        // The map holds one record per block.
        let map = std::fs::read_to_string(stem.with_extension("map")).unwrap();
        assert_eq!(parse_records(map.split_once("e1\n").unwrap().1).len(), 5);
    }

    #[test]
    fn ranges_are_kept_by_version_checked_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let c = open_anywhere(dir.path(), 64 << 20);
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        assert!(c.get("s3://b/k", "e1", 0..100).is_none(), "empty");
        c.put("s3://b/k", "e1", 0, &bytes[..4000]);
        c.put("s3://b/k", "e1", 4000, &bytes[4000..]);
        assert_eq!(
            &c.get("s3://b/k", "e1", 3000..5000).unwrap()[..],
            &bytes[3000..5000]
        );
        assert!(c.get("s3://b/k", "e2", 0..100).is_none(), "another version");
        assert!(
            c.get("s3://b/other", "e1", 0..100).is_none(),
            "another object"
        );
        assert!(
            c.get("s3://b/k", "e1", 9000..10_001).is_none(),
            "past what was kept"
        );
        // Another process (a fresh cache over the same directory) finds them.
        let again = open_anywhere(dir.path(), 64 << 20);
        assert_eq!(
            &again.get("s3://b/k", "e1", 0..10_000).unwrap()[..],
            &bytes[..]
        );
        // Bytes that are not what was recorded are a miss, and stay one.
        let (stem, _) = again.stem("s3://b/k", "e1");
        let data = OpenOptions::new()
            .write(true)
            .open(stem.with_extension("data"))
            .unwrap();
        data.write_all_at(b"XX", 10).unwrap();
        let third = open_anywhere(dir.path(), 64 << 20);
        assert!(
            third.get("s3://b/k", "e1", 0..100).is_none(),
            "corrupt: a miss"
        );
        assert_eq!(
            &third.get("s3://b/k", "e1", 5000..6000).unwrap()[..],
            &bytes[5000..6000]
        );
        // A map cut short in its last line keeps the lines before.
        assert_eq!(parse_records("0 10 0000000a\n10 2"), vec![(0..10, 10)]);
    }

    #[test]
    fn the_least_recently_used_entries_go_first_past_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let chunk = vec![7u8; 256 << 10];
        let c = open_anywhere(dir.path(), 2 << 20);
        for i in 0..6 {
            c.put(&format!("s3://b/{i}"), "e", 0, &chunk);
            // A distinct use time for each (file times have a coarse grain somewhere).
            let (stem, _) = c.stem(&format!("s3://b/{i}"), "e");
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i);
            File::options()
                .write(true)
                .open(stem.with_extension("map"))
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        for i in 6..12 {
            c.put(&format!("s3://b/{i}"), "e", 0, &chunk);
        }
        assert!(c.used() <= 2 << 20, "{}", c.used());
        assert!(c.get("s3://b/0", "e", 0..10).is_none(), "the oldest went");
        assert!(c.get("s3://b/11", "e", 0..10).is_some(), "the newest stays");
    }
}
