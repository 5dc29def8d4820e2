//! The rest of an object claimed at an open ([`StoreFile::claim_rest`]) and what is held
//! as it comes: marked in flight, fetched on the runtime, its pieces kept within the
//! budget.

use super::*;

impl ObjectFile {
    /// [`StoreFile::claim_rest`]: the object but `skip` (up to [`WHOLE_MAX`], within the
    /// budget's half kept for loads ahead), marked in flight now, so that a read of it
    /// from now on waits for its bytes rather than fetching them again, and fetched on
    /// the runtime, held as it comes ([`ObjectFile::flow`]): the open that claims it
    /// does not wait, nor does a thread have to start before the GETs go. Not with a
    /// local cache (its reads are served from there; a second chunk fetches the rest).
    pub(super) fn claim(&self, skip: std::ops::Range<u64>) -> bool {
        let size = self.meta.size;
        if size == 0 || size > WHOLE_MAX || self.disk.is_some() {
            return false;
        }
        let skip = skip.start.min(size)..skip.end.min(size);
        let pieces: Vec<_> = [0..skip.start, skip.end..size]
            .into_iter()
            .filter(|r| !r.is_empty())
            .collect();
        let need: u64 = pieces.iter().map(|r| r.end - r.start).sum();
        let mut ra = self.ahead.lock();
        if need == 0
            || ra.whole
            || ra.held.is_some()
            || ra.pending.is_some()
            || ra.chunks > 1
            || ra.first_chunk.as_ref().is_some_and(|f| *f != skip)
            || !self.budget.reserve_within(need, self.budget.cap / 2)
        {
            return false;
        }
        // As a whole fetch at a second chunk: once per pass over the file, the first chunk left
        // to its reader.
        ra.whole = true;
        ra.first_chunk = Some(skip.clone());
        ra.pending = Some(0..size);
        ra.pending_skip = Some(skip);
        ra.claimed_rest = true;
        ra.flowing += 1;
        let served_before = ra.outside;
        drop(ra);
        self.flow(pieces, 0..size, need, served_before);
        true
    }

    /// What a load ahead left for the kernel to read from the local cache, asked for
    /// once the first read (the shard's index) is served.
    pub(super) fn after_read(&self) {
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
    pub(super) fn disk_will_need(&self, range: std::ops::Range<u64>) {
        if let (Some((disk, name)), Some(etag)) = (&self.disk, &self.meta.e_tag) {
            disk.will_need(name, etag, range);
        }
    }

    /// Hold `bytes`, the object's bytes from `start` fetched at its open for a load
    /// ahead, as a window, within what was `reserved` for them.
    pub(in crate::store::object) fn hold_reserved(
        &self,
        start: u64,
        bytes: bytes::Bytes,
        mut reserved: Reserved,
    ) {
        let len = bytes.len() as u64;
        if len == 0 || len > reserved.n {
            return;
        }
        reserved.n -= len; // what the window holds stays reserved until it goes
        self.hold_opened(start, bytes);
    }

    /// Hold the bytes fetched at the open: a pass over the object ends once they are
    /// served, if they are all of it.
    fn hold_opened(&self, start: u64, bytes: bytes::Bytes) {
        let whole = start == 0 && bytes.len() as u64 == self.meta.size;
        let mut ra = self.ahead.lock();
        ra.held = Some(Held {
            pieces: vec![(start, bytes)],
            budget: self.budget.clone(),
        });
        ra.whole_held = whole;
    }

    /// Hold `bytes`, the object's bytes from `start` fetched at its open, as a window (if
    /// the budget has room: else its reads fetch them again).
    pub(in crate::store::object) fn hold_piece(&self, start: u64, bytes: bytes::Bytes) {
        let len = bytes.len() as u64;
        if len == 0 || !self.budget.reserve(len) {
            return;
        }
        self.hold_opened(start, bytes);
    }
}
