//! An object open for reading: ranged GETs of the version it was opened at, and the
//! read-ahead policy (windows while reads go forward, the whole object once a second
//! chunk of it is read), within a memory budget shared by every open object.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::path::Path as ObjPath;
use object_store::{GetOptions, GetRange, ObjectStore};
use parking_lot::Mutex;

use super::client::{Deadline, meta_of, timed, to_io};
use super::disk_cache::DiskCache;
use super::meta::MetaCache;
use crate::store::{EntryMeta, StoreFile};

/// An object open for reading: ranged GETs of the version it was opened at, with
/// read-ahead once reads go forward through it.
pub(super) struct ObjectFile {
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) handle: tokio::runtime::Handle,
    pub(super) key: ObjPath,
    pub(super) meta: object_store::ObjectMeta,
    pub(super) ahead: Mutex<ReadAhead>,
    /// Signalled when a window fetch ends (readers waiting for the window in flight).
    pub(super) ahead_done: parking_lot::Condvar,
    pub(super) budget: Arc<Budget>,
    pub(super) counters: Arc<Counters>,
    /// To forget this name when it turns out changed.
    pub(super) meta_cache: Arc<MetaCache>,
    pub(super) rel: PathBuf,
    pub(super) deadline: Deadline,
    /// The local cache (`--cache`), and this object's name in it (`s3://bucket/key`).
    pub(super) disk: Option<(Arc<DiskCache>, String)>,
    /// Whether the local cache held all of this version when it was opened: its chunks
    /// are then read from there as asked for, never fetched whole into memory (found at
    /// the open, so that no read asks the cache's files under the `ahead` lock).
    pub(super) disk_whole: bool,
}

/// The first and the largest read-ahead window; each window is 4 times the last. On
/// object storage a request costs about the same whatever its size up to a few MiB, so
/// reading forward through a shard should take few of them: a 4 MiB shard read chunk by
/// chunk takes its index, two chunks and the rest.
pub(super) const MIN_WINDOW: u64 = 4 << 20;
pub(super) const MAX_WINDOW: u64 = 8 << 20;
/// A read that starts at most this far past where the last one ended still counts as
/// going forward (chunks a reader skipped, an index between blocks).
pub(super) const FORWARD_GAP: u64 = 64 << 10;
/// An object of at most this size is fetched whole (less the chunk read before) once a
/// second chunk of it is read, in whatever order: zarr-python lays a shard's chunks in
/// Morton order, so a reader of the chunk files in key order jumps about inside each
/// shard, and read-ahead by file offsets never started (issue 34: 261 GETs in series
/// for a 4-shard array, where 9 do).
pub(super) const WHOLE_MAX: u64 = 16 << 20;

/// Read-ahead state of one open object: where the last read's chunk ended, the window the
/// next forward read fetches, and the bytes fetched ahead.
#[derive(Default)]
pub(super) struct ReadAhead {
    /// The end of the last read's chunk (of the read, outside chunks).
    pub(super) next: Option<u64>,
    /// The chunk (or the read, outside chunks) the last read was part of.
    pub(super) unit: Option<std::ops::Range<u64>>,
    /// Forward steps in a row, counted when a read misses the window held (then at
    /// least `seq`): two or more and a window is fetched.
    pub(super) streak: u32,
    /// Forward steps (chunks, or reads outside chunks) in a row, whatever served them:
    /// one or more (two chunks in a row) and the file is being read through
    /// ([`StoreFile::streaming`]).
    pub(super) seq: u32,
    /// Bytes the window held has served: once it has served as many as it holds, its
    /// reader has most likely gone through it, and it is dropped (a shard stays cached
    /// long after it was read; the window it held would keep the budget from the next).
    pub(super) served: u64,
    pub(super) window: u64,
    /// Distinct chunks read (steps inside chunks): at two, the object is fetched whole
    /// ([`WHOLE_MAX`]) and the file says it is being read through.
    pub(super) chunks: u32,
    /// The first chunk read, left out of the whole fetch (its reader has it).
    pub(super) first_chunk: Option<std::ops::Range<u64>>,
    /// Whether the object was fetched whole (or that was tried): once per open file.
    pub(super) whole: bool,
    /// Bytes read outside chunks (a shard's index): a whole fetch holds them again,
    /// and its reader will not ask for them again, so they count as served.
    pub(super) outside: u64,
    pub(super) held: Option<Held>,
    /// The window being fetched now: a reader inside it waits for it rather than
    /// fetching the same bytes again (zarr-python reads the chunks of a shard side by
    /// side).
    pub(super) pending: Option<std::ops::Range<u64>>,
    /// Bytes the local cache holds that the kernel is to read from its disk once the
    /// read under way is served (and no lock is held): of a shard loaded ahead, whose
    /// index (the read under way) waited behind the whole shard's disk reads when they
    /// were asked for first; of a shard a reader went on to a second chunk of.
    pub(super) will_need: Option<std::ops::Range<u64>>,
}

/// Bytes fetched ahead: pieces `(start, bytes)` of the object, in order and apart (a
/// window is one; a whole object less a chunk read before, two), counted against the
/// store's budget while held.
pub(super) struct Held {
    pub(super) pieces: Vec<(u64, bytes::Bytes)>,
    pub(super) budget: Arc<Budget>,
}

impl Held {
    fn len(&self) -> u64 {
        self.pieces.iter().map(|(_, b)| b.len() as u64).sum()
    }

    /// Where the last piece ends.
    fn end(&self) -> u64 {
        self.pieces
            .last()
            .map_or(0, |(start, b)| start + b.len() as u64)
    }

    /// Bytes `offset..end` of the object, if one piece holds them all.
    fn slice(&self, offset: u64, end: u64) -> Option<&[u8]> {
        self.pieces.iter().find_map(|(start, b)| {
            (*start <= offset && end <= start + b.len() as u64)
                .then(|| &b[(offset - start) as usize..(end - start) as usize])
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.release(self.len());
    }
}

/// The memory all open objects of a store may hold fetched ahead (`--s3-cache`): a
/// forward read that would exceed it fetches only what was asked for.
pub struct Budget {
    pub(super) cap: u64,
    pub(super) used: std::sync::atomic::AtomicU64,
}

impl Budget {
    pub fn new(cap: u64) -> Self {
        Budget {
            cap,
            used: Default::default(),
        }
    }

    fn reserve(&self, n: u64) -> bool {
        self.reserve_within(n, self.cap)
    }

    /// Reserve `n` bytes if that leaves at most `limit` in use.
    fn reserve_within(&self, n: u64, limit: u64) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.used
            .fetch_update(SeqCst, SeqCst, |u| {
                u.checked_add(n)
                    .filter(|&total| total <= limit.min(self.cap))
            })
            .is_ok()
    }

    fn release(&self, n: u64) {
        self.used.fetch_sub(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Bytes of the budget reserved before a fetch: given back when dropped, but for what
/// [`ObjectFile::hold_reserved`] holds.
pub(super) struct Reserved {
    budget: Arc<Budget>,
    n: u64,
}

impl Budget {
    /// `n` bytes for a load ahead, while that leaves the budget at most half used (the
    /// other half is the readers': [`ObjectFile::warm`]).
    pub(super) fn reserve_ahead(self: &Arc<Self>, n: u64) -> Option<Reserved> {
        self.reserve_within(n, self.cap / 2).then(|| Reserved {
            budget: self.clone(),
            n,
        })
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.budget.release(self.n);
    }
}

/// Requests this store made, and the bytes its GETs brought (for tests and `stats`).
#[derive(Default)]
pub struct Counters {
    pub gets: std::sync::atomic::AtomicU64,
    pub get_bytes: std::sync::atomic::AtomicU64,
    pub heads: std::sync::atomic::AtomicU64,
    pub lists: std::sync::atomic::AtomicU64,
}

impl ObjectFile {
    /// `range` of the object, as the version this file was opened at.
    pub(super) fn fetch(&self, range: std::ops::Range<u64>) -> io::Result<bytes::Bytes> {
        let start = range.start;
        let mut got = self.fetch_pieces(std::slice::from_ref(&range))?;
        Ok(got.pop().map_or_else(bytes::Bytes::new, |(s, b)| {
            debug_assert_eq!(s, start);
            b
        }))
    }

    /// `ranges` of the object, as the version this file was opened at: one GET each, all
    /// in flight at once.
    pub(super) fn fetch_pieces(
        &self,
        ranges: &[std::ops::Range<u64>],
    ) -> io::Result<Vec<(u64, bytes::Bytes)>> {
        use std::sync::atomic::Ordering::Relaxed;
        // What the local cache holds of this version needs no request.
        let cache = self.disk.as_ref().zip(self.meta.e_tag.as_deref());
        let mut pieces = Vec::with_capacity(ranges.len());
        let mut wanted = Vec::with_capacity(ranges.len());
        for range in ranges {
            match cache.and_then(|((disk, name), etag)| disk.get(name, etag, range.clone())) {
                Some(bytes) => pieces.push((range.start, bytes)),
                None => wanted.push(range.clone()),
            }
        }
        if wanted.is_empty() {
            return Ok(pieces);
        }
        let ranges = &wanted[..];
        let allowed = self.deadline.allowance();
        let gets: Vec<_> = ranges
            .iter()
            .map(|range| {
                let (store, key) = (self.store.clone(), self.key.clone());
                let opts = GetOptions {
                    range: Some(GetRange::Bounded(range.clone())),
                    if_match: self.meta.e_tag.clone(),
                    ..Default::default()
                };
                let (limit, allowed) = (self.deadline.limit, allowed);
                log::debug!("GET {} bytes {}..{}", self.key, range.start, range.end);
                self.handle.spawn(async move {
                    let get = async { store.get_opts(&key, opts).await?.bytes().await };
                    timed(limit, allowed, get).await
                })
            })
            .collect();
        let got = self.handle.block_on(async {
            let mut out = Vec::with_capacity(gets.len());
            for get in gets {
                out.push(get.await);
            }
            out
        });
        let mut failed = None;
        for (range, got) in ranges.iter().zip(got) {
            let got = got.unwrap_or_else(|join| {
                Err(object_store::Error::Generic {
                    store: "S3",
                    source: Box::new(join),
                })
            });
            self.deadline.note(&got);
            match got {
                Ok(bytes) => {
                    self.counters.gets.fetch_add(1, Relaxed);
                    self.counters
                        .get_bytes
                        .fetch_add(bytes.len() as u64, Relaxed);
                    if let Some(((disk, name), etag)) = cache {
                        disk.put(name, etag, range.start, &bytes);
                    }
                    pieces.push((range.start, bytes));
                }
                Err(e) => {
                    if let object_store::Error::Precondition { .. }
                    | object_store::Error::NotFound { .. } = &e
                    {
                        self.meta_cache.forget(&self.rel);
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(to_io(Path::new(self.key.as_ref()), e)),
            None => {
                pieces.sort_by_key(|(start, _)| *start);
                Ok(pieces)
            }
        }
    }
}

/// A window being fetched: on drop, its in-flight mark is cleared (if still its own),
/// what it reserved of the budget and does not hold is given back, and its waiters wake.
pub(super) struct InFlight<'a> {
    pub(super) file: &'a ObjectFile,
    pub(super) range: std::ops::Range<u64>,
    pub(super) reserved: u64,
}

impl InFlight<'_> {
    /// The window came, in `pieces`: hold it (what it holds stays reserved until it is
    /// dropped). `served`: bytes of it the reader that fetched it has taken.
    fn hold(mut self, pieces: Vec<(u64, bytes::Bytes)>, served: u64) {
        let f = self.file;
        let held = Held {
            pieces,
            budget: f.budget.clone(),
        };
        let len = held.len();
        let mut ra = f.ahead.lock();
        ra.held = Some(held);
        ra.served = served;
        drop(ra);
        self.reserved = self.reserved.saturating_sub(len);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let f = self.file;
        let mut ra = f.ahead.lock();
        if ra.pending.as_ref() == Some(&self.range) {
            ra.pending = None;
        }
        f.budget.release(self.reserved);
        f.ahead_done.notify_all();
    }
}

impl ObjectFile {
    /// A read served from bytes fetched ahead, or ranged GETs: of what was asked for
    /// (to the end of its chunk, when it is part of one: the kernel asks for a large
    /// chunk in pieces, and a cold read of one chunk moves that chunk only) when reads
    /// jump around, of a window that grows up to [`MAX_WINDOW`] while they go forward,
    /// and of the whole object (up to [`WHOLE_MAX`], less the first chunk read) once a
    /// second chunk of it is read, in whatever order. Forward is counted in chunks: the
    /// pieces of one chunk are one step.
    pub(super) fn read_in(
        &self,
        buf: &mut [u8],
        offset: u64,
        chunk: Option<std::ops::Range<u64>>,
    ) -> io::Result<usize> {
        let size = self.meta.size;
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let end = size.min(offset + buf.len() as u64);
        let want = (end - offset) as usize;
        // What this read is part of: its chunk, or itself.
        let (unit, in_chunk) = match chunk {
            Some(c) if c.start <= offset && end <= c.end => (c.start..c.end.min(size), true),
            _ => (offset..end, false),
        };
        // Forward: from where the last read's chunk ended, or from the end of the window
        // held (readers of one file side by side, as zarr-python's, take turns in it).
        let after = |n: u64| unit.start >= n && unit.start - n <= FORWARD_GAP;
        // What to fetch, what of the budget it took, the range marked in flight (the
        // one its waiters wait for, cleared by the `InFlight` below: the same range),
        // and what the reader had of it before.
        let (fetch, reserved, in_flight, served_before) = {
            let mut ra = self.ahead.lock();
            if !in_chunk {
                ra.outside = ra.outside.saturating_add(want as u64);
            }
            // The next piece of the chunk the last read was in is no new step.
            let step = ra.unit != Some(unit.clone());
            if step {
                ra.seq = if ra.next.is_some_and(after) {
                    ra.seq.saturating_add(1)
                } else {
                    0
                };
            }
            loop {
                if let Some(h) = &ra.held
                    && let Some(bytes) = h.slice(offset, end)
                {
                    buf[..want].copy_from_slice(bytes);
                    let held = h.len();
                    ra.next = Some(unit.end);
                    ra.unit = Some(unit.clone());
                    ra.served += want as u64;
                    if ra.served >= held {
                        ra.held = None;
                    }
                    return Ok(want);
                }
                match &ra.pending {
                    Some(p) if p.start <= offset && end <= p.end => self.ahead_done.wait(&mut ra),
                    _ => break,
                }
            }
            let mut whole = false;
            if step && in_chunk {
                ra.chunks = ra.chunks.saturating_add(1);
                let first = ra.first_chunk.get_or_insert_with(|| unit.clone()).clone();
                whole = ra.chunks >= 2 && !ra.whole && size <= WHOLE_MAX && first != unit;
                // The local cache holds it all: its chunks are read from there as asked
                // for (the kernel reads the disk ahead), nobody waits for the whole.
                if whole && self.disk_whole {
                    ra.whole = true;
                    whole = false;
                    ra.will_need = Some(0..size);
                }
            }
            if step {
                let forward =
                    ra.next.is_some_and(after) || ra.held.as_ref().is_some_and(|h| after(h.end()));
                // Two forward steps in a row before fetching ahead: the first chunk
                // after an index at the start of a shard is forward too, and a cold read
                // of one chunk must move only that chunk. Steps the window held served
                // count.
                ra.streak = if forward {
                    ra.streak.saturating_add(1).max(ra.seq)
                } else {
                    0
                };
                ra.window = if ra.streak >= 2 {
                    (ra.window * 4).clamp(MIN_WINDOW, MAX_WINDOW)
                } else {
                    0
                };
            }
            ra.next = Some(unit.end);
            ra.unit = Some(unit.clone());
            // A second chunk: the whole object but the first chunk, whose reader has it
            // (a shard's chunks lie apart, so this one is in one of the two pieces).
            let whole = whole.then(|| {
                ra.whole = true;
                let first = ra.first_chunk.clone().unwrap_or(0..0);
                let pieces: Vec<_> = [0..first.start, first.end..size]
                    .into_iter()
                    .filter(|r| !r.is_empty())
                    .collect();
                let need: u64 = pieces.iter().map(|r| r.end - r.start).sum();
                (pieces, need)
            });
            if let Some((pieces, need)) = whole.filter(|(pieces, need)| {
                pieces.iter().any(|r| r.start <= offset && end <= r.end)
                    && self.budget.reserve(*need)
            }) {
                ra.held = None;
                ra.pending = Some(0..size);
                (pieces, need, 0..size, ra.outside)
            } else {
                // A window when going forward: the window held gives way to it (and its
                // budget with it). Else the rest of the chunk (its next pieces will be
                // asked for next), unless a window is held: a read elsewhere leaves that
                // for the readers still inside it (side by side, or a shard loaded ahead
                // whole).
                let window = if step { ra.window } else { 0 };
                let rest = if ra.held.is_none() {
                    unit.end.min(offset + MAX_WINDOW)
                } else {
                    end
                };
                let ahead_end = size.min(offset + window).max(rest);
                if window > 0 && ahead_end > end {
                    ra.held = None;
                }
                if ahead_end > end && self.budget.reserve(ahead_end - offset) {
                    ra.pending = Some(offset..ahead_end);
                    (
                        std::iter::once(offset..ahead_end).collect(),
                        ahead_end - offset,
                        offset..ahead_end,
                        0,
                    )
                } else {
                    (std::iter::once(offset..end).collect(), 0, offset..end, 0)
                }
            }
        };
        // However the fetch of a window ends (an error, a panic), its in-flight mark goes
        // and its waiters wake: none waits for ever.
        let mut window = (reserved > 0).then(|| InFlight {
            file: self,
            range: in_flight,
            reserved,
        });
        let started = std::time::Instant::now();
        let pieces = match self.fetch_pieces(&fetch) {
            Ok(pieces) => pieces,
            // The read ahead failed, not for want of time (an outage would fail the read
            // alone too, after as long again) nor because the object changed or went
            // (ESTALE, ENOENT: so would the read): its waiters go their own way, and this
            // read fetches what it asked for alone.
            Err(e)
                if window.is_some()
                    && e.raw_os_error() == Some(libc::EIO)
                    && started.elapsed() < self.deadline.limit / 2 =>
            {
                window = None;
                vec![(offset, self.fetch(offset..end)?)]
            }
            Err(e) => return Err(e),
        };
        // The piece this read lies in (what came of it, if the object ended early).
        let got = pieces
            .iter()
            .find(|(start, b)| *start <= offset && offset < start + b.len() as u64)
            .map_or(&[][..], |(start, b)| &b[(offset - start) as usize..]);
        let n = got.len().min(want);
        buf[..n].copy_from_slice(&got[..n]);
        if let Some(w) = window {
            w.hold(pieces, n as u64 + served_before);
        }
        Ok(n)
    }
}

impl StoreFile for ObjectFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let read = self.read_in(buf, offset, None);
        self.after_read();
        read
    }

    fn read_chunk_at(
        &self,
        buf: &mut [u8],
        offset: u64,
        chunk: std::ops::Range<u64>,
    ) -> io::Result<usize> {
        let read = self.read_in(buf, offset, Some(chunk));
        self.after_read();
        read
    }

    fn meta(&self) -> io::Result<EntryMeta> {
        Ok(meta_of(&self.meta))
    }

    fn streaming(&self) -> bool {
        let ra = self.ahead.lock();
        ra.seq >= 1 || ra.chunks >= 2
    }

    fn cold(&self) -> bool {
        let ra = self.ahead.lock();
        ra.held.is_none() && ra.pending.is_none() && !ra.whole && ra.chunks == 0
    }

    /// One GET of the object's first [`MAX_WINDOW`] bytes (all of a shard of up to 8
    /// MiB: its index and its chunks), held as a window, while it leaves half the budget
    /// free (a shard loaded ahead and never read through keeps its window until the shard
    /// leaves the cache: the readers' own windows always have the other half).
    fn warm(&self) {
        let len = self.meta.size.min(MAX_WINDOW);
        if len > 0 && self.disk_whole {
            self.ahead.lock().will_need = Some(0..len);
            return;
        }
        {
            let mut ra = self.ahead.lock();
            if len == 0
                || ra.held.is_some()
                || ra.pending.is_some()
                || !self.budget.reserve_within(len, self.budget.cap / 2)
            {
                return;
            }
            ra.pending = Some(0..len);
        }
        let window = InFlight {
            file: self,
            range: 0..len,
            reserved: len,
        };
        if let Ok(bytes) = self.fetch(0..len) {
            window.hold(vec![(0, bytes)], 0);
        }
    }
}

impl ObjectFile {
    /// What a load ahead left for the kernel to read from the local cache, asked for
    /// once the first read (the shard's index) is served.
    fn after_read(&self) {
        // Only a file the local cache holds whole is ever left anything: no lock taken
        // on the read path of the others.
        if !self.disk_whole {
            return;
        }
        let range = self.ahead.lock().will_need.take();
        if let Some(range) = range {
            self.disk_will_need(range);
        }
    }

    /// Have the kernel read bytes `range` of this version from the local cache ahead.
    fn disk_will_need(&self, range: std::ops::Range<u64>) {
        if let (Some((disk, name)), Some(etag)) = (&self.disk, &self.meta.e_tag) {
            disk.will_need(name, etag, range);
        }
    }

    /// Hold `bytes`, the object's bytes from `start` fetched at its open for a load
    /// ahead, as a window, within what was `reserved` for them.
    pub(super) fn hold_reserved(&self, start: u64, bytes: bytes::Bytes, mut reserved: Reserved) {
        let len = bytes.len() as u64;
        if len == 0 || len > reserved.n {
            return;
        }
        reserved.n -= len; // what the window holds stays reserved until it goes
        self.ahead.lock().held = Some(Held {
            pieces: vec![(start, bytes)],
            budget: self.budget.clone(),
        });
    }

    /// Hold `bytes`, the object's bytes from `start` fetched at its open, as a window (if
    /// the budget has room: else its reads fetch them again).
    pub(super) fn hold_piece(&self, start: u64, bytes: bytes::Bytes) {
        let len = bytes.len() as u64;
        if len == 0 || !self.budget.reserve(len) {
            return;
        }
        self.ahead.lock().held = Some(Held {
            pieces: vec![(start, bytes)],
            budget: self.budget.clone(),
        });
    }
}
