//! The memory read-ahead may hold: the store-wide [`Budget`] every open object's windows
//! count against, bytes of it [`Reserved`] before a fetch, the bytes [`Held`] ahead, and
//! the request [`Counters`]. Not when to read ahead (the read-ahead policy, `read`).

use std::sync::Arc;

/// Bytes fetched ahead: pieces `(start, bytes)` of the object, in order and apart (a
/// window is one; a whole object less a chunk read before, two), counted against the
/// store's budget while held.
pub(in crate::store::object) struct Held {
    pub(in crate::store::object) pieces: Vec<(u64, bytes::Bytes)>,
    pub(in crate::store::object) budget: Arc<Budget>,
}

impl Held {
    pub(super) fn len(&self) -> u64 {
        self.pieces.iter().map(|(_, b)| b.len() as u64).sum()
    }

    /// Where the last piece ends.
    pub(super) fn end(&self) -> u64 {
        self.pieces
            .last()
            .map_or(0, |(start, b)| start + b.len() as u64)
    }

    /// Bytes `offset..offset + buf.len()` of the object into `buf`, if the pieces hold
    /// them all (one piece, or pieces one after another: a window held as it came).
    pub(super) fn copy_to(&self, offset: u64, buf: &mut [u8]) -> bool {
        let end = offset + buf.len() as u64;
        let mut at = offset;
        for (start, b) in &self.pieces {
            if at >= end {
                break;
            }
            let piece_end = start + b.len() as u64;
            if *start > at {
                break; // in order: nothing later holds `at`
            }
            if piece_end > at {
                let n = (piece_end.min(end) - at) as usize;
                let from = (at - start) as usize;
                let into = (at - offset) as usize;
                buf[into..into + n].copy_from_slice(&b[from..from + n]);
                at += n as u64;
            }
        }
        at >= end
    }

    /// Add a piece, keeping them in order of their starts.
    pub(super) fn insert(&mut self, start: u64, bytes: bytes::Bytes) {
        let at = self.pieces.partition_point(|(s, _)| *s <= start);
        self.pieces.insert(at, (start, bytes));
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
    pub(in crate::store::object) cap: u64,
    pub(in crate::store::object) used: std::sync::atomic::AtomicU64,
}

impl Budget {
    pub fn new(cap: u64) -> Self {
        Budget {
            cap,
            used: Default::default(),
        }
    }

    pub(super) fn reserve(&self, n: u64) -> bool {
        self.reserve_within(n, self.cap)
    }

    /// Reserve `n` bytes if that leaves at most `limit` in use.
    pub(super) fn reserve_within(&self, n: u64, limit: u64) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.used
            .fetch_update(SeqCst, SeqCst, |u| {
                u.checked_add(n)
                    .filter(|&total| total <= limit.min(self.cap))
            })
            .is_ok()
    }

    pub(super) fn release(&self, n: u64) {
        self.used.fetch_sub(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Bytes of the budget reserved before a fetch: given back when dropped, but for what
/// `ObjectFile::hold_reserved` holds.
pub(in crate::store::object) struct Reserved {
    budget: Arc<Budget>,
    pub(super) n: u64,
}

impl Budget {
    /// `n` bytes for a load ahead, while that leaves the budget at most half used (the
    /// other half is the readers': `ObjectFile::warm`).
    pub(in crate::store::object) fn reserve_ahead(self: &Arc<Self>, n: u64) -> Option<Reserved> {
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
