//! Fetches whose answers are held as they come: a load ahead (a shard's bytes, up to
//! 8 MiB) or the rest of a shard claimed beside its first chunk is one GET (or two) on
//! the store's runtime, its body held in the file's window piece by piece as it
//! arrives, so that readers of its first chunks are served while the rest is still on
//! its way (issue 34: a reader of 4 shards of 7 MiB at 30 ms waited for the whole of
//! each before its first chunk, and its own work came after the transfer, not beside it).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

use object_store::{GetOptions, GetRange};
use parking_lot::{Condvar, Mutex};

use super::budget::{Budget, Counters, Held};
use super::{ObjectFile, ReadAhead};
use crate::store::object::client::timed;

/// Bytes of an answer held at a time (the window's pieces; a reader is woken by each).
const FLOW_PIECE: usize = 256 << 10;

/// The mark of a fetch in flight that its GETs share: when the last ends, the mark goes
/// (if still its own), the budget it reserved and did not hold is given back, the window
/// may be let go once served, and waiters wake.
pub(super) struct FlowMark {
    ahead: Arc<Mutex<ReadAhead>>,
    done: Arc<Condvar>,
    budget: Arc<Budget>,
    counters: Arc<Counters>,
    mark: Range<u64>,
    reserved: AtomicU64,
    /// Bytes read outside chunks before the fetch began (the index): it holds them
    /// again, and its readers will not ask for them again, so they count as served.
    served_before: u64,
    /// Whether it fetches the object whole ([`ReadAhead::whole_held`]).
    whole: bool,
}

impl FlowMark {
    /// `bytes`, the object's from `start`, came: held (moved from what was reserved to
    /// what the window holds), and the readers waiting told.
    fn publish(&self, start: u64, bytes: bytes::Bytes) {
        let len = bytes.len() as u64;
        if len == 0 {
            return;
        }
        // Never more than was reserved (an answer is at most its range): what is held is
        // given back when the window goes.
        let took = self
            .reserved
            .fetch_update(SeqCst, SeqCst, |r| Some(r.saturating_sub(len)))
            .unwrap_or(0);
        if took < len && !self.budget.reserve(len - took) {
            return;
        }
        self.counters.get_bytes.fetch_add(len, Relaxed);
        let mut ra = self.ahead.lock();
        match &mut ra.held {
            // The first chunk, fetched alone beside it, came first.
            Some(h) => {
                h.insert(start, bytes);
                ra.whole_held |= self.whole;
            }
            None => {
                ra.held = Some(Held {
                    pieces: vec![(start, bytes)],
                    budget: self.budget.clone(),
                });
                ra.served = self.served_before;
                ra.whole_held = self.whole;
            }
        }
        drop(ra);
        self.done.notify_all();
    }
}

impl Drop for FlowMark {
    fn drop(&mut self) {
        let mut ra = self.ahead.lock();
        ra.flowing = ra.flowing.saturating_sub(1);
        if ra.pending.as_ref() == Some(&self.mark) {
            ra.pending = None;
            ra.pending_skip = None;
        }
        if ra.flowing == 0 && ra.held.as_ref().is_some_and(|h| ra.served >= h.len()) {
            ra.let_go_held();
        }
        self.budget.release(self.reserved.swap(0, SeqCst));
        drop(ra);
        self.done.notify_all();
    }
}

impl ObjectFile {
    /// GET each of `ranges` on the runtime, side by side (the caller does not wait), each
    /// answer held in the window as it comes. The caller marked `mark` in flight and
    /// counted the flow (`ReadAhead::flowing`) under the lock, and reserved `reserved`
    /// of the budget for them; `served_before`: `ReadAhead::outside` then. A failed GET holds what came of it (the version this file
    /// was opened at: each GET is conditional on its ETag); readers of the rest fetch it
    /// themselves once the mark goes.
    pub(super) fn flow(
        &self,
        ranges: Vec<Range<u64>>,
        mark: Range<u64>,
        reserved: u64,
        served_before: u64,
    ) {
        let mark = Arc::new(FlowMark {
            served_before,
            whole: mark == (0..self.meta.size),
            ahead: self.ahead.clone(),
            done: self.ahead_done.clone(),
            budget: self.budget.clone(),
            counters: self.counters.clone(),
            mark,
            reserved: AtomicU64::new(reserved),
        });
        let allowed = self.deadline.allowance();
        for range in ranges {
            let mark = mark.clone();
            let (store, key) = (self.store.clone(), self.key.clone());
            let opts = GetOptions {
                range: Some(GetRange::Bounded(range.clone())),
                if_match: self.meta.e_tag.clone(),
                ..Default::default()
            };
            let deadline = self.deadline.clone();
            let (meta_cache, rel) = (self.meta_cache.clone(), self.rel.clone());
            log::debug!(
                "GET {} bytes {}..{} (held as it comes)",
                self.key,
                range.start,
                range.end
            );
            self.counters.gets.fetch_add(1, Relaxed);
            self.handle.spawn(async move {
                let get = async {
                    let r = store.get_opts(&key, opts).await?;
                    let mut stream = r.into_stream();
                    let mut at = range.start;
                    let mut buf = bytes::BytesMut::new();
                    while let Some(b) =
                        std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await
                    {
                        let b = b?;
                        let room =
                            (range.end.saturating_sub(at) as usize).saturating_sub(buf.len());
                        buf.extend_from_slice(&b[..b.len().min(room)]);
                        if buf.len() >= FLOW_PIECE {
                            let piece = buf.split().freeze();
                            let n = piece.len() as u64;
                            mark.publish(at, piece);
                            at += n;
                        }
                    }
                    if !buf.is_empty() {
                        mark.publish(at, buf.freeze());
                    }
                    Ok(())
                };
                let got = timed(deadline.limit, allowed, get).await;
                deadline.note(&got);
                if let Err(e) = got {
                    if let object_store::Error::Precondition { .. }
                    | object_store::Error::NotFound { .. } = &e
                    {
                        meta_cache.forget(&rel);
                    }
                    log::debug!("{}: a fetch ahead failed: {e}", rel.display());
                }
                drop(mark);
            });
        }
    }
}
