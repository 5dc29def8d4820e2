//! An object open for reading: ranged GETs of the version it was opened at, and the
//! read-ahead policy (windows while reads go forward, the whole object once a second
//! chunk of it is read), within a memory budget shared by every open object.
//!
//! Laid out as this file (the open object and its read-ahead policy) over `fetch` (the
//! ranged GETs), `claim` and `flow` (the rest of an object claimed and held as it
//! comes) and `budget` (the memory read-ahead may hold).

mod budget;
mod claim;
mod fetch;
mod flow;

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path as ObjPath;
use parking_lot::{Mutex, MutexGuard};

use super::client::{Deadline, meta_of};
use super::disk_cache::DiskCache;
use super::meta::MetaCache;
use crate::store::{EntryMeta, StoreFile};
pub use budget::{Budget, Counters};
use budget::{Held, Reserved};

/// An object open for reading: ranged GETs of the version it was opened at, with
/// read-ahead once reads go forward through it.
pub(super) struct ObjectFile {
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) handle: tokio::runtime::Handle,
    pub(super) key: ObjPath,
    pub(super) meta: object_store::ObjectMeta,
    pub(super) ahead: Arc<Mutex<ReadAhead>>,
    /// Signalled when a window fetch ends (readers waiting for the window in flight).
    pub(super) ahead_done: Arc<parking_lot::Condvar>,
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
    /// Whether the object was fetched whole (or that was tried): once per pass
    /// ([`ReadAhead::let_go_held`]).
    pub(super) whole: bool,
    /// Bytes read outside chunks (a shard's index): a whole fetch holds them again,
    /// and its reader will not ask for them again, so they count as served.
    pub(super) outside: u64,
    pub(super) held: Option<Held>,
    /// The window being fetched now: a reader inside it waits for it rather than
    /// fetching the same bytes again (zarr-python reads the chunks of a shard side by
    /// side).
    pub(super) pending: Option<std::ops::Range<u64>>,
    /// The chunk a whole fetch in flight leaves out ([`StoreFile::claim_rest`]: its
    /// reader fetches it alone, side by side): a read inside it waits for nothing.
    pub(super) pending_skip: Option<std::ops::Range<u64>>,
    /// Whether the rest of the object was claimed ([`StoreFile::claim_rest`]).
    pub(super) claimed_rest: bool,
    /// Fetches whose answers are held as they come ([`ObjectFile::flow`]) under way:
    /// the window held is not let go meanwhile (its reader may be ahead of what came).
    pub(super) flowing: u32,
    /// Bytes the local cache holds that the kernel is to read from its disk once the
    /// read under way is served (and no lock is held): of a shard loaded ahead, whose
    /// index (the read under way) waited behind the whole shard's disk reads when they
    /// were asked for first; of a shard a reader went on to a second chunk of.
    pub(super) will_need: Option<std::ops::Range<u64>>,
    /// Passes over the object read through so far ([`ReadAhead::let_go_held`]).
    pub(super) pass: u64,
    /// What is held is the object whole (from a fetch or a claim of all of it, but the
    /// chunk a first reader fetched alone): once all of it is served, a pass over the
    /// object ends. Not for a window or the rest of a chunk.
    pub(super) whole_held: bool,
}

/// A window being fetched: on drop, its in-flight mark is cleared (if still its own),
/// what it reserved of the budget and does not hold is given back, and its waiters wake.
pub(super) struct InFlight<'a> {
    pub(super) file: &'a ObjectFile,
    pub(super) range: std::ops::Range<u64>,
    pub(super) reserved: u64,
    /// Whether what came joins the window held rather than replacing it: the rest of
    /// an object claimed ahead ([`StoreFile::claim_rest`]) and the first chunk fetched
    /// beside it, whichever comes first.
    pub(super) merge: bool,
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
        let mut held = held;
        let len = held.len();
        let mut ra = f.ahead.lock();
        match &mut ra.held {
            Some(h) if self.merge => {
                // Moved over: `held` goes empty (gives nothing back), `h` holds them.
                h.pieces.append(&mut held.pieces);
                h.pieces.sort_by_key(|(start, _)| *start);
                ra.served = ra.served.saturating_add(served);
            }
            _ => {
                ra.held = Some(held);
                ra.served = served;
                ra.whole_held = self.range == (0..f.meta.size);
            }
        }
        // All of it served already (a chunk fetched alone that came after the rest it
        // joins was read and let go): nothing to keep. Before, it stayed held for good,
        // and the object never looked cold again.
        if ra.flowing == 0 && ra.held.as_ref().is_some_and(|h| ra.served >= h.len()) {
            ra.let_go_held();
        }
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
            ra.pending_skip = None;
        }
        f.budget.release(self.reserved);
        f.ahead_done.notify_all();
    }
}

/// What a read fetches ([`ObjectFile::plan_read`]), once it was not served from bytes
/// fetched ahead.
struct Fetch {
    /// Whether what comes joins the window held ([`InFlight::merge`]).
    merge: bool,
    /// The ranges to GET.
    ranges: Vec<std::ops::Range<u64>>,
    /// What of the budget they took (0: only what was asked for, nothing held after).
    reserved: u64,
    /// The range marked in flight (the one its waiters wait for, cleared by the
    /// `InFlight` of the fetch: the same range).
    in_flight: std::ops::Range<u64>,
    /// Bytes of it the reader had before (a whole fetch holds them again).
    served_before: u64,
}

/// A read planned under the `ahead` lock: served already, or a fetch to make.
enum Planned {
    Served(usize),
    Fetch(Fetch),
}

impl ReadAhead {
    /// What was held was all served and goes. If it was the object whole
    /// ([`ReadAhead::whole_held`]: a whole fetch, a claim of the rest, a load ahead of
    /// all of it), its reader went through
    /// it, and the next read starts a new pass over the object, read ahead as the first
    /// was (a claim takes the rest, a second chunk fetches it whole, a load ahead warms
    /// it). Before, all that was once per open file, and a shard stays open as long as
    /// it is cached: a second pass over an array whose pages the kernel had dropped
    /// (memory pressure, a dataset read once per epoch) fetched it one chunk per GET, in
    /// series (array A of `scripts/bench-s3 latency` at 30 ms: 2.7 s, against 0.25 s the
    /// first time). A new pass forgets what decides a whole fetch (the chunks counted,
    /// the fetch or claim done); where reads go on forward (a sequential reader's window
    /// and streak) stays, as does what is in flight, and so do the bytes read outside
    /// chunks (the index: parsed once, never asked for again, so whatever holds them
    /// again counts them as served).
    pub(super) fn let_go_held(&mut self) {
        self.held = None;
        self.served = 0;
        if std::mem::take(&mut self.whole_held) {
            self.pass += 1;
            self.chunks = 0;
            self.first_chunk = None;
            self.whole = false;
            self.claimed_rest = false;
        }
    }

    /// What is held gives way to a fetch that replaces it (a whole fetch, a window):
    /// no pass ends (and the budget it held goes back with it).
    fn replace_held(&mut self) {
        self.held = None;
        self.whole_held = false;
    }

    /// A new chunk read (a step inside a chunk) of an object of `size` bytes: counted,
    /// and whether the object is now to be fetched whole (its second chunk, up to
    /// [`WHOLE_MAX`], once per pass over the file; never where the local cache holds it
    /// all).
    fn count_chunk(&mut self, unit: &std::ops::Range<u64>, size: u64, disk_whole: bool) -> bool {
        self.chunks = self.chunks.saturating_add(1);
        let first = self.first_chunk.get_or_insert_with(|| unit.clone()).clone();
        let mut whole = self.chunks >= 2 && !self.whole && size <= WHOLE_MAX && first != *unit;
        // The local cache holds it all: its chunks are read from there as asked
        // for (the kernel reads the disk ahead), nobody waits for the whole.
        if whole && disk_whole {
            self.whole = true;
            whole = false;
            self.will_need = Some(0..size);
        }
        whole
    }

    /// A new step: whether it goes forward (`after` the last read's chunk, or the window
    /// held) sets the streak, and the streak the window the next fetch takes.
    fn count_forward(&mut self, after: impl Fn(u64) -> bool) {
        let forward =
            self.next.is_some_and(&after) || self.held.as_ref().is_some_and(|h| after(h.end()));
        // Two forward steps in a row before fetching ahead: the first chunk
        // after an index at the start of a shard is forward too, and a cold read
        // of one chunk must move only that chunk. Steps the window held served
        // count.
        self.streak = if forward {
            self.streak.saturating_add(1).max(self.seq)
        } else {
            0
        };
        self.window = if self.streak >= 2 {
            (self.window * 4).clamp(MIN_WINDOW, MAX_WINDOW)
        } else {
            0
        };
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
        // What this read is part of: its chunk, or itself.
        let (unit, in_chunk) = match chunk {
            Some(c) if c.start <= offset && end <= c.end => (c.start..c.end.min(size), true),
            _ => (offset..end, false),
        };
        match self.plan_read(buf, offset, end, unit, in_chunk) {
            Planned::Served(n) => Ok(n),
            Planned::Fetch(fetch) => self.read_fetched(buf, offset, end, fetch),
        }
    }

    /// Under the `ahead` lock: the read `offset..end` (part of `unit`) counted as a step
    /// or not, served from the window held (or the one in flight, waited for) if that
    /// holds it, else what to fetch for it: the whole object, a window, the rest of its
    /// chunk, or what was asked for.
    fn plan_read(
        &self,
        buf: &mut [u8],
        offset: u64,
        end: u64,
        unit: std::ops::Range<u64>,
        in_chunk: bool,
    ) -> Planned {
        let size = self.meta.size;
        let want = (end - offset) as usize;
        // Forward: from where the last read's chunk ended, or from the end of the window
        // held (readers of one file side by side, as zarr-python's, take turns in it).
        let after = |n: u64| unit.start >= n && unit.start - n <= FORWARD_GAP;
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
        if let Some(n) = self.serve_held(&mut ra, buf, offset, end, &unit) {
            return Planned::Served(n);
        }
        let mut whole = false;
        if step && in_chunk {
            // Not while a fetch held as it comes is under way: it would fetch it again.
            whole = ra.count_chunk(&unit, size, self.disk_whole) && ra.flowing == 0;
        }
        if step {
            ra.count_forward(after);
        }
        ra.next = Some(unit.end);
        ra.unit = Some(unit.clone());
        Planned::Fetch(self.plan_fetch(&mut ra, whole, step, &unit, offset, end))
    }

    /// The read `offset..end` (part of `unit`) served from the window held, if that holds
    /// it all, after waiting for a window in flight that will; `None` when neither does.
    fn serve_held(
        &self,
        ra: &mut MutexGuard<'_, ReadAhead>,
        buf: &mut [u8],
        offset: u64,
        end: u64,
        unit: &std::ops::Range<u64>,
    ) -> Option<usize> {
        let want = (end - offset) as usize;
        loop {
            if let Some(h) = &ra.held
                && h.copy_to(offset, &mut buf[..want])
            {
                let held = h.len();
                ra.next = Some(unit.end);
                ra.unit = Some(unit.clone());
                ra.served += want as u64;
                if ra.served >= held && ra.flowing == 0 {
                    ra.let_go_held();
                }
                return Some(want);
            }
            let skipped = ra
                .pending_skip
                .as_ref()
                .is_some_and(|s| s.start <= offset && end <= s.end);
            match &ra.pending {
                Some(p) if p.start <= offset && end <= p.end && !skipped => {
                    self.ahead_done.wait(ra)
                }
                _ => return None,
            }
        }
    }

    /// What to fetch for the read `offset..end` (part of `unit`; `step`: a new step;
    /// `whole`: the object is to be fetched whole), with what of the budget it takes,
    /// marked in flight in `ra`.
    fn plan_fetch(
        &self,
        ra: &mut ReadAhead,
        whole: bool,
        step: bool,
        unit: &std::ops::Range<u64>,
        offset: u64,
        end: u64,
    ) -> Fetch {
        let size = self.meta.size;
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
            pieces.iter().any(|r| r.start <= offset && end <= r.end) && self.budget.reserve(*need)
        }) {
            ra.replace_held();
            ra.pending = Some(0..size);
            return Fetch {
                merge: false,
                ranges: pieces,
                reserved: need,
                in_flight: 0..size,
                served_before: ra.outside,
            };
        }
        self.plan_ahead(ra, step, unit, offset, end)
    }

    /// [`ObjectFile::plan_fetch`] of no whole object: a window ahead, the rest of the
    /// chunk, or the read alone.
    fn plan_ahead(
        &self,
        ra: &mut ReadAhead,
        step: bool,
        unit: &std::ops::Range<u64>,
        offset: u64,
        end: u64,
    ) -> Fetch {
        let size = self.meta.size;
        // A window when going forward: the window held gives way to it (and its
        // budget with it). Else the rest of the chunk (its next pieces will be
        // asked for next), unless a window is held: a read elsewhere leaves that
        // for the readers still inside it (side by side, or a shard loaded ahead
        // whole).
        // The rest of the object claimed and in flight ([`StoreFile::claim_rest`])
        // but for this chunk: the rest of this chunk joins it, and its mark stays.
        // So too while a fetch held as it comes is under way ([`ObjectFile::flow`]):
        // what came of it stays, and so does its mark.
        // And the chunk a claim left out, whenever it is read: its rest joins what
        // came of the claim (else, once that came, each piece of it was a GET).
        let claimed = ra.pending_skip.is_some()
            || ra.flowing > 0
            || (ra.whole
                && ra.pending_skip.is_none()
                && ra.first_chunk.as_ref() == Some(unit)
                && ra.claimed_rest);
        let window = if step && !claimed { ra.window } else { 0 };
        let rest = if ra.held.is_none() || claimed {
            unit.end.min(offset + MAX_WINDOW)
        } else {
            end
        };
        let ahead_end = size.min(offset + window).max(rest);
        if window > 0 && ahead_end > end {
            ra.replace_held();
        }
        if ahead_end > end && self.budget.reserve(ahead_end - offset) {
            if !claimed {
                ra.pending = Some(offset..ahead_end);
            }
            Fetch {
                merge: claimed,
                ranges: std::iter::once(offset..ahead_end).collect(),
                reserved: ahead_end - offset,
                in_flight: offset..ahead_end,
                served_before: 0,
            }
        } else {
            Fetch {
                merge: false,
                ranges: std::iter::once(offset..end).collect(),
                reserved: 0,
                in_flight: offset..end,
                served_before: 0,
            }
        }
    }

    /// Make `fetch` for the read `offset..end` into `buf`, and hold what it brought
    /// beyond the read as the window (a failed window fetched again as the read alone).
    fn read_fetched(
        &self,
        buf: &mut [u8],
        offset: u64,
        end: u64,
        fetch: Fetch,
    ) -> io::Result<usize> {
        let want = (end - offset) as usize;
        let Fetch {
            merge,
            ranges: fetch,
            reserved,
            in_flight,
            served_before,
        } = fetch;
        // However the fetch of a window ends (an error, a panic), its in-flight mark goes
        // and its waiters wake: none waits for ever.
        let mut window = (reserved > 0).then(|| InFlight {
            file: self,
            range: in_flight,
            reserved,
            merge,
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

    fn claim_rest(&self, skip: std::ops::Range<u64>) -> bool {
        self.claim(skip)
    }

    fn cold(&self) -> bool {
        let ra = self.ahead.lock();
        ra.held.is_none() && ra.pending.is_none() && !ra.whole && ra.chunks == 0
    }

    fn pass(&self) -> u64 {
        self.ahead.lock().pass
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
        // Bytes read outside chunks before (the index, at the shard's load): held again
        // and never asked for again, so counted as served (else the window was never
        // read through, and a second pass over the shard was not read ahead).
        let served_before = {
            let mut ra = self.ahead.lock();
            if len == 0
                || ra.held.is_some()
                || ra.pending.is_some()
                || !self.budget.reserve_within(len, self.budget.cap / 2)
            {
                return;
            }
            ra.pending = Some(0..len);
            ra.outside
        };
        let window = InFlight {
            file: self,
            range: 0..len,
            reserved: len,
            merge: false,
        };
        if let Ok(bytes) = self.fetch(0..len) {
            window.hold(vec![(0, bytes)], served_before);
        }
    }
}
