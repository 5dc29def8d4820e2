//! Host copies spread over the machine's cores: the CPU gather and the GPU path's
//! copies into and out of page-locked memory.
//!
//! Owns one decision, how many threads a copy of `total` bytes gets, and one split: a
//! list of pieces (chunks, given by their byte offsets in the destination) cut into
//! contiguous runs of about equal bytes, one per thread. Each thread writes a disjoint
//! part of the destination, so no locking is needed.

use std::ops::Range;

/// Each extra thread must have at least this many bytes to copy: below it, spawning
/// (tens of microseconds) costs more than the copy it saves.
pub(crate) const BYTES_PER_THREAD: u64 = 4 << 20;

/// The machine's cores, as the process may use them.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The machine's memory in bytes (`MemTotal`), if it can be read.
pub(crate) fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// Threads for a copy of `total` bytes: one per [`BYTES_PER_THREAD`], at least one, at
/// most `max_threads`.
pub(crate) fn threads_for(total: u64, max_threads: usize) -> usize {
    let by_size = (total / BYTES_PER_THREAD).max(1);
    (by_size.min(max_threads.max(1) as u64)) as usize
}

/// Cuts pieces `0..n` (piece `j` starts at byte `starts[j]` of the destination;
/// `starts` has `n + 1` entries, the last the total, non-decreasing) into at most
/// `threads` runs of consecutive pieces with about equal bytes. The runs tile `0..n`
/// in order; none is empty unless `n` is 0.
pub(crate) fn split(starts: &[u64], threads: usize) -> Vec<Range<usize>> {
    let n = starts.len().saturating_sub(1);
    let total = starts.last().copied().unwrap_or(0);
    let threads = threads.max(1);
    let mut runs = Vec::with_capacity(threads);
    let mut first = 0usize;
    for t in 1..=threads {
        let end = if t == threads {
            n
        } else {
            // The first piece starting at or after t/threads of the bytes.
            let cut = total / threads as u64 * t as u64;
            starts[..n].partition_point(|&o| o < cut).max(first)
        };
        if end > first {
            runs.push(first..end);
        }
        first = end;
    }
    if runs.is_empty() && n > 0 {
        runs.push(0..n);
    }
    runs
}

/// Runs `work(run, dst_part)` for each run of [`split`], the last on this thread and
/// the others on scoped threads; `dst_part` is the run's bytes of `dst` (which starts
/// at `starts[0]`).
pub(crate) fn for_each_run<T: Send>(
    dst: &mut [T],
    starts: &[u64],
    threads: usize,
    work: impl Fn(Range<usize>, &mut [T]) + Sync,
) {
    let runs = split(starts, threads);
    let work = &work;
    std::thread::scope(|scope| {
        let mut rest = dst;
        let last = runs.len().saturating_sub(1);
        for (k, run) in runs.into_iter().enumerate() {
            let bytes = (starts[run.end] - starts[run.start]) as usize;
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(bytes);
            rest = tail;
            if k == last {
                work(run, mine);
            } else {
                scope.spawn(move || work(run, mine));
            }
        }
    });
}

/// Copies `src` into `dst` (equal lengths) on up to `max_threads` threads.
pub(crate) fn copy(dst: &mut [u8], src: &[u8], max_threads: usize) {
    assert_eq!(dst.len(), src.len(), "copy of unequal lengths");
    let total = src.len() as u64;
    let threads = threads_for(total, max_threads);
    if threads <= 1 {
        dst.copy_from_slice(src);
        return;
    }
    let step = total.div_ceil(threads as u64);
    let starts: Vec<u64> = (0..=threads as u64)
        .map(|k| (k * step).min(total))
        .collect();
    for_each_run(dst, &starts, threads, |run, part| {
        let from = starts[run.start] as usize;
        part.copy_from_slice(&src[from..from + part.len()]);
    });
}

/// Copies `pieces[j]` to `dst[starts[j]..starts[j + 1]]` for every `j` on up to
/// `max_threads` threads (`starts` as in [`split`], from 0, each gap the piece's length).
pub(crate) fn copy_pieces(dst: &mut [u8], starts: &[u64], pieces: &[&[u8]], max_threads: usize) {
    debug_assert_eq!(starts.first(), Some(&0), "starts begin at byte 0 of dst");
    let total = starts.last().copied().unwrap_or(0);
    let threads = threads_for(total, max_threads);
    for_each_run(&mut dst[..total as usize], starts, threads, |run, part| {
        let base = starts[run.start];
        for j in run {
            let at = (starts[j] - base) as usize;
            part[at..at + pieces[j].len()].copy_from_slice(pieces[j]);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_tile_the_pieces_with_about_equal_bytes() {
        let starts: Vec<u64> = (0..=100u64).map(|j| j * 10).collect();
        for threads in 1..8 {
            let runs = split(&starts, threads);
            assert_eq!(runs.len(), threads);
            assert_eq!(runs.first().unwrap().start, 0);
            assert_eq!(runs.last().unwrap().end, 100);
            for w in runs.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
            for r in &runs {
                let bytes = starts[r.end] - starts[r.start];
                assert!(bytes.abs_diff(1000 / threads as u64) <= 10 + 1000 % threads as u64);
            }
        }
        // One huge piece: one run, never an empty one.
        assert_eq!(split(&[0, 1 << 30], 4), vec![0..1]);
        assert!(split(&[0], 4).is_empty());
        // Empty pieces at the end belong to the last run.
        assert_eq!(split(&[0, 5, 10, 10, 10], 2), vec![0..1, 1..4]);
    }

    #[test]
    fn parallel_copies_equal_the_serial_ones() {
        let src: Vec<u8> = (0..(40u32 << 20) / 4)
            .flat_map(|w| w.wrapping_mul(2_654_435_761).to_le_bytes())
            .collect();
        let mut dst = vec![0u8; src.len()];
        copy(&mut dst, &src, 8);
        assert!(dst == src);

        let pieces: Vec<&[u8]> = src.chunks(3 << 20).rev().collect();
        let mut starts = vec![0u64];
        for p in &pieces {
            starts.push(starts.last().unwrap() + p.len() as u64);
        }
        let mut packed = vec![0u8; src.len() + 7];
        copy_pieces(&mut packed, &starts, &pieces, 8);
        let want: Vec<u8> = pieces.concat();
        assert!(packed[..src.len()] == want[..]);
        assert_eq!(&packed[src.len()..], &[0; 7]);
    }

    #[test]
    fn the_memory_is_read_from_meminfo() {
        let bytes = physical_memory().expect("/proc/meminfo has MemTotal");
        assert!(bytes > 64 << 20, "{bytes}");
    }

    #[test]
    fn small_copies_stay_on_one_thread() {
        assert_eq!(threads_for(0, 16), 1);
        assert_eq!(threads_for(BYTES_PER_THREAD - 1, 16), 1);
        assert_eq!(threads_for(64 * BYTES_PER_THREAD, 16), 16);
        assert_eq!(threads_for(3 * BYTES_PER_THREAD, 16), 3);
        assert_eq!(threads_for(3 * BYTES_PER_THREAD, 0), 1);
    }
}
