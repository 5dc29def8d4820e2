//! Writes through descriptors the kernel opened (a writable mount with kernel opens):
//! the daemon hears of no open or close of them, so their bytes gather in a handle it
//! holds per inode (`OpenFiles::implicit`, [`Implicits`]), committed as a close
//! would commit them at `fsync`, before a rename or link, at unmount, or when idle
//! ([`KernelCommit`]).

use super::*;
use std::collections::{HashMap, HashSet};

/// Which writes gathered with kernel opens [`View::commit_kernel_writes`] commits.
#[derive(Clone, Copy, Debug)]
pub enum KernelCommit {
    /// One file's (its `fsync`, a rename or link of it, its release); a write to it in
    /// flight is waited for.
    Of(u64),
    /// Every file's (unmount); writes in flight are waited for, metadata that is not a
    /// whole document is committed (and refused) too.
    All,
    /// Every file's but `except`, those being written now, unlinked ones and metadata
    /// that is not yet a whole document (`fsync` of a directory, before a new array is
    /// adopted, a full write buffer); nothing is waited for.
    Settled { except: Option<u64> },
    /// As `Settled`, unlinked files too (their bytes go back to the write buffer; their
    /// descriptors read `ENOENT` after): a write the full buffer refused.
    Full { except: Option<u64> },
    /// As `Settled`, of files idle for [`KERNEL_WRITE_IDLE`] (unlinked ones: for
    /// [`KERNEL_UNLINKED_IDLE`]); the timer's.
    Idle,
}

/// How long after its last write an inode written through a descriptor the kernel
/// opened is committed, when no `fsync`, rename or unmount commits it first (the
/// daemon hears of no close of such a descriptor).
pub const KERNEL_WRITE_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a file unlinked while open (`tempfile.TemporaryFile`, pytest's capture) is
/// kept for its descriptors after its last write, with kernel opens: no close of it is
/// heard of, and once it is let go its descriptors read `ENOENT`.
pub const KERNEL_UNLINKED_IDLE: std::time::Duration = std::time::Duration::from_secs(600);

/// At most this many files unlinked after writes through descriptors the kernel opened
/// are kept for [`KERNEL_UNLINKED_IDLE`]; beyond, the idle commit lets the oldest go
/// (their descriptors then read `ENOENT`). Each holds an inode and a handle of the
/// daemon: a tool making and removing files by the thousand a second (an adversarial
/// tester: 1,500 a second) grew the daemon by about 1 KiB a file, for 10 minutes.
pub const KERNEL_UNLINKED_KEPT: usize = 1024;

/// A handle the daemon opened for writes that came without one ([`View::write_ino`]).
pub(super) struct Implicit {
    fh: u64,
    /// Requests using `fh` now: it is never released under one (a write into a scratch
    /// file after its commit took the bytes would be lost).
    users: u32,
    /// When the last request using it ended.
    last: std::time::Instant,
}

/// Writes through descriptors the kernel opened without asking (a writable mount with
/// kernel opens): the handle each written inode's bytes gather in, by inode
/// (`OpenFiles::implicit`).
///
/// With the table's length as last left, read by `shardfs stats` without the table's
/// lock, which is held across store I/O: a stats read must answer during an outage.
#[derive(Default)]
pub(super) struct Implicits(Mutex<Table>, std::sync::atomic::AtomicUsize);

/// The handles held, and the files a commit took the handle of and is committing now.
#[derive(Default)]
struct Table {
    held: HashMap<u64, Implicit>,
    /// By inode, how many of its handles are being committed. Until they are, nothing
    /// of that inode is taken by another commit, and a commit that must find its bytes
    /// staged (a rename onto it, an `fsync`, the unmount) and a new write to it wait:
    /// before, a rename onto a chunk whose earlier bytes the idle timer or a directory's
    /// `fsync` was committing could be followed by those bytes, and the chunk read (and
    /// stored) its previous version (found by an adversarial tester).
    committing: HashMap<u64, u32>,
}

thread_local! {
    /// This thread is committing a held handle (a commit under way may take in
    /// metadata, which commits held writes again): it waits for no commit under way,
    /// which could be its own.
    static IN_COMMIT: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Files taken to be committed: inode, handle, and the mark that they are being committed.
type Taken<'a> = Vec<(u64, u64, Committing<'a>)>;

/// A held handle of `ino` taken by a commit: counted in [`Table::committing`] until
/// dropped (also on a panic of the commit, so that nothing waits for it for good).
struct Committing<'a> {
    table: &'a Implicits,
    ino: u64,
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        let mut t = self.table.0.lock();
        if let Some(n) = t.committing.get_mut(&self.ino) {
            *n -= 1;
            if *n == 0 {
                t.committing.remove(&self.ino);
            }
        }
    }
}

/// While alive, this thread is committing ([`IN_COMMIT`]).
struct InCommit;

impl InCommit {
    fn enter() -> InCommit {
        IN_COMMIT.with(|c| c.set(c.get() + 1));
        InCommit
    }

    fn here() -> bool {
        IN_COMMIT.with(|c| c.get() > 0)
    }
}

impl Drop for InCommit {
    fn drop(&mut self) {
        IN_COMMIT.with(|c| c.set(c.get() - 1));
    }
}

impl Implicits {
    /// The table's length is `held`'s now.
    fn counted(&self, held: &HashMap<u64, Implicit>) {
        self.1
            .store(held.len(), std::sync::atomic::Ordering::Relaxed);
    }

    /// The files held now: (inode, handle).
    pub(super) fn held(&self) -> Vec<(u64, u64)> {
        let t = self.0.lock();
        t.held.iter().map(|(ino, h)| (*ino, h.fh)).collect()
    }

    /// The handle writes without one to `ino` gather in, if any.
    pub(super) fn fh(&self, ino: u64) -> Option<u64> {
        self.0.lock().held.get(&ino).map(|i| i.fh)
    }

    /// A request using the handle of [`View::write_ino`] for `ino` ended.
    fn end(&self, ino: u64) {
        if let Some(i) = self.0.lock().held.get_mut(&ino) {
            i.users -= 1;
            i.last = std::time::Instant::now();
        }
    }
}

impl View {
    /// A write on a writable mount with kernel opens, through any descriptor: the bytes
    /// gather in the handle the daemon holds for the inode (opened at its first write or
    /// truncate, or the one `create` made), and are committed as a close would commit
    /// them by [`View::commit_kernel_writes`] (at `fsync`, before a rename or link, at
    /// unmount, or [`KERNEL_WRITE_IDLE`] after the last write: [`KernelCommit`]).
    ///
    /// Metadata taken in at this write ([`View::land_at_write`]) is committed with it,
    /// as at a close (its store file is gone: a later write opens the file anew);
    /// `Ok((n, true))` then, and the kernel's pages of the file, which hold the
    /// writer's bytes and not the document the view now shows, are the caller's to drop.
    pub fn write_ino(&self, ino: u64, offset: u64, data: &[u8]) -> Result<(u32, bool)> {
        let end = offset.saturating_add(data.len() as u64);
        if let Some(fh) = self.open.implicit.fh(ino)
            && self.whole_chunk_outgrown(fh, end)
        {
            self.commit_earlier_writer(ino);
        }
        let mut res = self.write_held(ino, offset, data);
        if matches!(res, Err(ViewError::NoSpace)) {
            // The write buffer holds what other files' writers left (no close tells
            // when they are done): commit those, let unlinked ones go (their bytes are
            // the room), and try once more.
            self.commit_kernel_writes(KernelCommit::Full { except: Some(ino) })?;
            self.make_room();
            res = self.write_held(ino, offset, data);
        }
        let (n, fh) = res?;
        // A write of `.zmetadata` of the v2 view is let go at once: the kernel's pages
        // and size of it are the writer's bytes, not the document the view makes.
        let landed = matches!(self.open.handles.get(fh), Ok(Handle::Discard(_)))
            || self.open.handles.landed(fh);
        if landed {
            self.commit_kernel_writes(KernelCommit::Of(ino))?;
        }
        Ok((n, landed))
    }

    /// A write into the handle `ino`'s writes gather in; its file handle.
    fn write_held(&self, ino: u64, offset: u64, data: &[u8]) -> Result<(u32, u64)> {
        let fh = self.implicit_begin(ino, false)?;
        let res = self.write(fh, offset, data);
        self.open.implicit.end(ino);
        res.map(|n| (n, fh))
    }

    /// What an earlier writer of `ino` left gathered (its close unheard) committed, as
    /// that close would have committed it, before a write or truncate that would change
    /// it into something a commit refuses: a refusal of the new bytes must not take the
    /// earlier ones along. A refusal here is that earlier writer's, which no request
    /// waits for: kept for `shardfs stats` and the unmount.
    pub(super) fn commit_earlier_writer(&self, ino: u64) {
        if let Err(e) = self.commit_kernel_writes(KernelCommit::Of(ino)) {
            let path = self.open.handle_path(self.tree_read(), ino, None);
            self.counters.refused.push(path, e.to_string());
        }
    }

    /// Whether `fh` holds a whole chunk of fixed length written since it was opened
    /// (uncompressed: one length only) that a write ending at `end` would make longer
    /// than any chunk of its array: an append (`>>`, `O_APPEND`) after its writer closed
    /// it, unheard. Committed first ([`View::commit_earlier_writer`]); before, the
    /// append's refusal let the whole chunk go, though its close had returned 0 (found
    /// by the reference test).
    fn whole_chunk_outgrown(&self, fh: u64, end: u64) -> bool {
        let Ok(Handle::Scratch { node, file, .. }) = self.open.handles.get(fh) else {
            return false;
        };
        // The cheap part first, on every write: only a write past the end of bytes
        // written since the open asks what length the array fixes.
        let len = {
            let f = file.lock();
            if f.orphan || !f.dirty || end <= f.data.len() as u64 {
                return false;
            }
            f.data.len() as u64
        };
        self.tree.fixed_chunk_len(&node) == Some(len)
    }

    /// `truncate` or `ftruncate` without a handle of ours (`O_TRUNC` of a descriptor the
    /// kernel opened comes as one): a chunk or metadata file is truncated in the handle
    /// its writes will gather in, so the writer's bytes are committed with it, never an
    /// empty chunk first.
    pub fn set_size_ino(&self, ino: u64, size: u64) -> Result<Attr> {
        let gathers = self.writer.is_some()
            && match self.tree.node(ino).map(|(_, n)| n) {
                Ok(
                    Node::Chunk { .. }
                    | Node::ArrayMeta { .. }
                    | Node::GroupMeta { .. }
                    | Node::Scratch { .. },
                ) => true,
                // A metadata document: `O_TRUNC` and the writes after it make one
                // document, stored once whole.
                Ok(Node::File { rel }) => super::pending_doc::is_doc(&rel),
                _ => false,
            };
        if !gathers {
            return self.set_size_open(ino, size, None);
        }
        if self
            .open
            .implicit
            .fh(ino)
            .is_some_and(|fh| size == 0 || self.open.gathered_whole(self.tree_read(), fh, size))
        {
            // What was written before this truncate to nothing (`O_TRUNC` of a new
            // open: the writer before it closed its file, unheard), or before a
            // truncate that changes a whole chunk or document (`truncate -s`, which may
            // be another process's), is committed as that close would have committed
            // it, not merged with what comes next.
            self.commit_earlier_writer(ino);
        }
        let fh = self.implicit_begin(ino, size == 0)?;
        let res = self.set_size_open(ino, size, Some(fh));
        self.open.implicit.end(ino);
        res
    }

    /// A file created through this mount with kernel opens (`create` still asks the
    /// daemon): its handle is where every later write to the inode gathers, through
    /// any descriptor, and it is committed as those are (the kernel may send no release
    /// for it: none comes for files created once it opens files itself).
    pub fn adopt_created(&self, ino: u64, fh: u64) {
        let mut t = self.open.implicit.0.lock();
        if t.held.contains_key(&ino) {
            // An existing file (`O_CREAT` without `O_EXCL`) already being written: its
            // writes gather in the handle they gather in; this one shares its bytes.
            // Let go without what a close does (commit, take in): the writes go on.
            drop(t);
            if let Some((ino, handle)) = self.open.handles.remove(fh) {
                self.let_go(ino);
                if let Handle::Scratch { file, .. } = handle {
                    let mut f = file.lock();
                    f.opens = f.opens.saturating_sub(1);
                }
            }
            return;
        }
        t.held.insert(
            ino,
            Implicit {
                fh,
                users: 0,
                last: std::time::Instant::now(),
            },
        );
        self.open.implicit.counted(&t.held);
    }

    /// The kernel released handle `fh` of `ino` (with kernel opens: a file created before
    /// the kernel began to open files itself, the only ones it sends a release for):
    /// committed as the daemon's own are.
    pub fn release_created(&self, ino: u64, fh: u64) -> Result<()> {
        let ours = self.open.implicit.fh(ino) == Some(fh);
        if ours {
            self.commit_kernel_writes(KernelCommit::Of(ino))
        } else {
            self.release(fh)
        }
    }

    /// The handle writes without one to `ino` gather in, counted as in use until
    /// [`Implicits::end`]; opened now if there is none.
    fn implicit_begin(&self, ino: u64, truncate: bool) -> Result<u64> {
        // Opened under the table's lock: two first writes must not open two handles
        // (the second open of a chunk would replace the first one's scratch file).
        let mut t = loop {
            let mut t = self.open.implicit.0.lock();
            if let Some(i) = t.held.get_mut(&ino) {
                i.users += 1;
                return Ok(i.fh);
            }
            // Its earlier bytes are being committed: opened once they are staged, so
            // that this write lands on them, not on what was there before them.
            if !t.committing.contains_key(&ino) || InCommit::here() {
                break t;
            }
            drop(t);
            std::thread::sleep(std::time::Duration::from_micros(200));
        };
        // A descriptor of a file unlinked or replaced since, whose handle is gone: not
        // whatever now has that name.
        let (path, _) = self.tree.node(ino)?;
        if self.tree.inodes.peek(&path) != Some(ino) {
            return Err(ViewError::NotFound);
        }
        let fh = self.open(ino, true, truncate)?.fh;
        t.held.insert(
            ino,
            Implicit {
                fh,
                users: 1,
                last: std::time::Instant::now(),
            },
        );
        self.open.implicit.counted(&t.held);
        Ok(fh)
    }

    /// Commit writes gathered in handles the daemon holds (kernel opens), as a close
    /// would: release those handles. Returns the first error (also logged).
    pub fn commit_kernel_writes(&self, which: KernelCommit) -> Result<()> {
        let mut first_err = Ok(());
        let waits = matches!(which, KernelCommit::Of(_) | KernelCommit::All);
        // Commits under way in other threads are waited for, but by the idle timer (see
        // `Table::committing`).
        let waits_in_flight = !matches!(which, KernelCommit::Idle) && !InCommit::here();
        // The files to commit are those held now: a steady writer cannot keep a commit
        // that waits going.
        let mut targets: Option<Vec<u64>> = None;
        loop {
            let Some((taken, busy)) = self.take_due(which, &mut targets, waits, waits_in_flight)
            else {
                return first_err;
            };
            for (ino, fh, mark) in taken {
                let in_commit = InCommit::enter();
                let res = self.commit_kernel_write(which, ino, fh);
                drop(in_commit);
                drop(mark);
                if let Err(e) = res
                    && first_err.is_ok()
                {
                    first_err = Err(e);
                }
            }
            if !busy {
                return first_err;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// The files held for writes through descriptors the kernel opened that a commit of
    /// `which` commits now, taken out of the table and marked as being committed (the
    /// marks let go when dropped), and whether any it waits for was busy (in use, or
    /// being committed by another thread). `targets`: the files it asks about, the held
    /// ones at its first call. `None` when nothing is held or being committed.
    fn take_due<'a>(
        &'a self,
        which: KernelCommit,
        targets: &mut Option<Vec<u64>>,
        waits: bool,
        waits_in_flight: bool,
    ) -> Option<(Taken<'a>, bool)> {
        let mut t = self.open.implicit.0.lock();
        if t.held.is_empty() && (t.committing.is_empty() || !waits_in_flight) {
            return None;
        }
        let snapshot = targets.get_or_insert_with(|| match which {
            KernelCommit::Of(ino) => vec![ino],
            _ => {
                let all: std::collections::BTreeSet<u64> =
                    t.held.keys().chain(t.committing.keys()).copied().collect();
                all.into_iter().collect()
            }
        });
        // Beyond the limit, each file is asked once whether it is unlinked (on
        // object storage a HEAD, under this lock).
        let (unlinked_now, over) = match which {
            KernelCommit::Idle => self.unlinked_over_the_limit(&t.held),
            _ => (None, HashSet::new()),
        };
        let mut taken = Vec::new();
        let mut busy = false;
        let Table { held, committing } = &mut *t;
        snapshot.retain(|ino| {
            if committing.contains_key(ino) {
                // Never taken while its earlier bytes are being committed.
                busy |= waits_in_flight;
                return waits_in_flight;
            }
            let Some(h) = held.get(ino) else {
                return false;
            };
            if h.users > 0 {
                busy |= waits;
                return waits;
            }
            if self.commit_due(which, *ino, h, unlinked_now.as_ref(), &over) {
                taken.push((*ino, h.fh));
            }
            false
        });
        let taken: Vec<_> = taken
            .into_iter()
            .map(|(ino, fh)| {
                held.remove(&ino);
                *committing.entry(ino).or_default() += 1;
                let mark = Committing {
                    table: &self.open.implicit,
                    ino,
                };
                (ino, fh, mark)
            })
            .collect();
        self.open.implicit.counted(held);
        Some((taken, busy))
    }

    /// Whether the file `ino` held in `h` is committed now by a commit of `which`.
    /// `unlinked_now`: the files known unlinked (asked once, beyond the limit), else each
    /// is asked; `over`: files released because the limit is passed.
    fn commit_due(
        &self,
        which: KernelCommit,
        ino: u64,
        h: &Implicit,
        unlinked_now: Option<&HashSet<u64>>,
        over: &HashSet<u64>,
    ) -> bool {
        let unlinked = |fh: u64| match unlinked_now {
            Some(set) => set.contains(&ino),
            None => self.open.unlinked(self.tree_read(), fh),
        };
        match which {
            KernelCommit::Of(_) | KernelCommit::All => true,
            // An unlinked file has nothing to commit, and its descriptors still use it
            // (pytest's capture files while a test adopts an array): only the idle timer
            // and the unmount let it go.
            KernelCommit::Settled { except } => {
                except != Some(ino)
                    && !self.open.unfinished(self.tree_read(), h.fh)
                    && !self.open.untouched(h.fh)
                    && !self.open.unlinked(self.tree_read(), h.fh)
            }
            KernelCommit::Full { except } => {
                except != Some(ino)
                    && !self.open.unfinished(self.tree_read(), h.fh)
                    && !self.open.untouched(h.fh)
            }
            KernelCommit::Idle => {
                let e = h.last.elapsed();
                // A chunk left unfinished that long: its writer is gone (killed
                // mid-chunk); refused, named (`refused`), its room in the write buffer
                // given back.
                e >= KERNEL_WRITE_IDLE
                    && (!self.open.unfinished(self.tree_read(), h.fh)
                        || (e >= KERNEL_UNLINKED_IDLE
                            && !self.open.partial_metadata(self.tree_read(), h.fh)))
                    && !self.open.untouched(h.fh)
                    && (e >= KERNEL_UNLINKED_IDLE || !unlinked(h.fh))
                    || over.contains(&ino)
            }
        }
    }

    /// Release the handle `fh` that gathered the writes to `ino`, as its close would. A
    /// failure is logged, and kept for `shardfs stats` and the unmount where no request
    /// waits for it; returned unless it is a refusal of that one file (`EINVAL`) that
    /// no request asked for.
    fn commit_kernel_write(&self, which: KernelCommit, ino: u64, fh: u64) -> Result<()> {
        // Kept for a message only: a path is made only if the commit fails.
        let held = self.open.handles.get(fh).ok();
        let released = self.release(fh);
        if released.is_ok() && !self.counters.refused.is_empty() {
            // Committed now: an earlier refusal of the same file is no longer true.
            let path = self.open.handle_path(self.tree_read(), ino, held.as_ref());
            self.counters.refused.forget(&path);
        }
        if let Err(e) = released {
            let path = self.open.handle_path(self.tree_read(), ino, held.as_ref());
            log::warn!("{path}: a commit of a file written with kernel opens: {e}");
            if !matches!(which, KernelCommit::Of(_)) {
                // No request waits for this one (its file's `fsync` would hear
                // of it): kept for `shardfs stats` and `shardfs unmount`.
                self.counters.refused.push(path, e.to_string());
            }
            // A refusal (`EINVAL`) is that file's, kept for stats and the
            // unmount: it fails no `fsync` of a directory (nor the unmount).
            let refusal = matches!(e, ViewError::Invalid(_));
            if matches!(which, KernelCommit::Of(_)) || !refusal {
                return Err(e);
            }
        }
        Ok(())
    }

    /// With more than [`KERNEL_UNLINKED_KEPT`] files held: which of those not in use are
    /// unlinked (each asked once), and the inodes of the oldest idle ones beyond the
    /// limit. `(None, empty)` within it.
    fn unlinked_over_the_limit(
        &self,
        map: &HashMap<u64, Implicit>,
    ) -> (Option<HashSet<u64>>, HashSet<u64>) {
        if map.len() <= KERNEL_UNLINKED_KEPT {
            return (None, HashSet::new());
        }
        let unlinked: HashSet<u64> = map
            .iter()
            .filter(|(_, h)| h.users == 0 && self.open.unlinked(self.tree_read(), h.fh))
            .map(|(ino, _)| *ino)
            .collect();
        let mut idle: Vec<(std::time::Instant, u64)> = unlinked
            .iter()
            .filter_map(|ino| map.get(ino).map(|h| (h.last, *ino)))
            .filter(|(last, _)| last.elapsed() >= KERNEL_WRITE_IDLE)
            .collect();
        let over = idle.len().saturating_sub(KERNEL_UNLINKED_KEPT);
        idle.sort_unstable();
        let over = idle.into_iter().take(over).map(|(_, ino)| ino).collect();
        (Some(unlinked), over)
    }

    /// Handles the daemon holds for writes through descriptors the kernel opened
    /// (`shardfs stats`: `kernel_write_handles`).
    pub(super) fn kernel_write_handles(&self) -> usize {
        self.open
            .implicit
            .1
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}
