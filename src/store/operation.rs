//! The operation a thread is serving (one FUSE request), and how long it may still wait
//! for the backing store: an operation fails once none of its requests has succeeded
//! for the store's limit (`--s3-timeout`), however many requests it makes in a row and
//! whatever the endpoint does (issue 34: a stalled endpoint held a cold read for 4× the
//! timeout, a lookup, an open and a read each taking it in turn). An operation that
//! goes on getting answers is not cut short (a listing of many pages, a commit that
//! loses races to other writers).
//!
//! Threads outside an operation (the flusher, loads ahead) give each request the whole
//! limit.

use std::cell::Cell;
use std::time::{Duration, Instant};

thread_local! {
    /// When the operation this thread serves began or last got an answer; `None` outside
    /// an operation.
    static PROGRESS: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// An operation being served on this thread, from [`begin`] until dropped.
#[must_use = "the operation ends when this is dropped"]
pub struct Operation {
    outer: Option<Instant>,
}

/// Begin an operation on this thread (nested: the inner one counts on its own, and the
/// outer one is back when it ends).
pub fn begin() -> Operation {
    Operation {
        outer: PROGRESS.with(|p| p.replace(Some(Instant::now()))),
    }
}

/// The operation this thread serves, to carry into threads it waits for
/// ([`adopt`]): `None` outside an operation.
pub fn current() -> Option<Instant> {
    PROGRESS.with(|p| p.get())
}

/// Serve `current` (of the thread that waits for this one) on this thread: its
/// requests get what is left of that operation's time, not the whole limit.
pub fn adopt(current: Option<Instant>) -> Operation {
    Operation {
        outer: PROGRESS.with(|p| p.replace(current)),
    }
}

impl Drop for Operation {
    fn drop(&mut self) {
        PROGRESS.with(|p| p.set(self.outer));
    }
}

/// How long a request may take now, given the store's `limit`: what is left of it since
/// the operation last got an answer (zero when spent), or all of it outside an operation.
pub fn allowance(limit: Duration) -> Duration {
    PROGRESS.with(|p| match p.get() {
        Some(since) => limit.saturating_sub(since.elapsed()),
        None => limit,
    })
}

/// A request of this thread's operation got an answer: its time starts again.
pub fn progressed() {
    PROGRESS.with(|p| {
        if p.get().is_some() {
            p.set(Some(Instant::now()));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_has_the_limit_less_the_time_since_its_last_answer() {
        let limit = Duration::from_secs(3600);
        assert_eq!(allowance(limit), limit, "outside an operation: all of it");
        {
            let _op = begin();
            std::thread::sleep(Duration::from_millis(20));
            let left = allowance(limit);
            assert!(left <= limit - Duration::from_millis(20), "{left:?}");
            assert_eq!(allowance(Duration::from_millis(10)), Duration::ZERO);
            progressed();
            assert!(allowance(limit) > left, "an answer starts the time again");
            {
                let _inner = begin();
                assert!(allowance(limit) > left);
            }
            // Carried into a thread: the same time left there (none of 10 ms, 20 ms
            // after the last answer); a thread that does not adopt it has all of it.
            std::thread::sleep(Duration::from_millis(20));
            let since = current();
            let short = Duration::from_millis(10);
            let there = std::thread::spawn(move || {
                let _op = adopt(since);
                allowance(short)
            });
            assert_eq!(there.join().unwrap(), Duration::ZERO);
            let apart = std::thread::spawn(move || allowance(short));
            assert_eq!(apart.join().unwrap(), short);
        }
        assert_eq!(allowance(limit), limit, "ended");
        progressed();
        assert_eq!(allowance(limit), limit, "no operation began");
    }
}
