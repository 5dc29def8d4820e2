//! The open policy: who opens files on this mount, the daemon or the kernel, decided
//! once at FUSE `init` ([`View::set_open_policy`]), and everything that differs between
//! the two. The rest of the view and the FUSE adapter ask here, by a method named for
//! the behaviour, and test no flag of their own.
//!
//! | | the daemon opens ([`OpenPolicy::DaemonOpens`]) | the kernel opens ([`OpenPolicy::KernelOpens`]) |
//! |---|---|---|
//! | when | `-o open_checks`, a kernel without `FUSE_NO_OPEN_SUPPORT`, any view before `init` | the default mount, once `init` got `FUSE_NO_OPEN_SUPPORT` |
//! | `open`, `flush` | answered: a handle per open; a close commits (`flush_handle`) | `ENOSYS` ([`OpenPolicy::answers_opens`]): none come after |
//! | read, write, truncate | through the handle `open` returned | by inode, file handle 0: writes gather in a handle the daemon holds per inode (`kernel_writes.rs`) |
//! | `release` | of a handle `open` returned | only of a file created before the first `ENOSYS` ([`View::release_created`]), and it also does what a flush would ([`OpenPolicy::release_flushes`]) |
//! | a created file | its handle, closed by `flush` and `release` | kept as the handle the inode's writes gather in ([`View::adopt_created`]) |
//! | before a rename, a link, an adoption, a `utimensat` | nothing to commit: closes did | the writes gathered are committed first ([`OpenPolicy::gathers_writes`]) |
//! | a commit's close time | the commit's own | the last write's or truncate's ([`OpenPolicy::stamp_write`], [`OpenPolicy::close_time`]) |
//! | metadata written | taken in at its close | at the write that makes it a whole document ([`OpenPolicy::lands_metadata_at_write`]) |
//! | metadata being written, to other readers | the stored document until the close | what the writer wrote: they share the kernel's pages ([`OpenPolicy::shows_pending_writes`]) |
//! | a chunk changed outside the mount | seen at the next open: its shard checked, its size compared with the one last reported ([`OpenPolicy::compares_size_at_open`]) | seen at `getattr`, after the TTL: its shard checked there ([`OpenPolicy::checks_shard_at_getattr`]) |
//! | the kernel's pages of a file | each open says whether they stay (`keep_cache`) | kept across opens: dropped by a notice after the release of a written file and a rename that shows other bytes ([`OpenPolicy::kernel_keeps_pages`]) |
//!
//! `fsync`, the `fsync` of a directory, the idle timer and the unmount commit what is
//! gathered ([`View::commit_kernel_writes`]) under either policy: with the daemon opening,
//! nothing is. See docs/SEMANTICS.md, "Reads on a writable mount".

use std::sync::OnceLock;

use super::*;

/// Who opens files on a mount; see the module documentation for what differs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OpenPolicy {
    /// Every `open` asks the daemon, which returns a handle that reads, writes and the
    /// close (`flush`, `release`) come with.
    #[default]
    DaemonOpens,
    /// The kernel opens and closes files itself (`FUSE_NO_OPEN_SUPPORT`, after `open`
    /// answered `ENOSYS`): reads and writes come by inode with file handle 0, and no
    /// close is heard of.
    KernelOpens,
}

impl OpenPolicy {
    /// Scratch file `f` was written or resized now: with kernel opens this stands for
    /// its close, whose time it keeps ([`OpenPolicy::close_time`]).
    pub(super) fn stamp_write(self, f: &mut scratch::Scratch, w: &Writer) {
        match self {
            OpenPolicy::DaemonOpens => {}
            OpenPolicy::KernelOpens => f.written = w.staging.close_time(),
        }
    }

    /// The daemon answers `open` and `flush`. With kernel opens both are answered
    /// `ENOSYS`: for `open` taken as success (from then on the kernel opens and releases
    /// files itself), for `flush` as "send no more" (one at every close of every
    /// descriptor would cost the round trip the open saved).
    pub fn answers_opens(self) -> bool {
        matches!(self, OpenPolicy::DaemonOpens)
    }

    /// Writes gather per inode in a handle the daemon holds (no close tells when a
    /// writer is done): before an operation that must find them committed (a rename or
    /// link of the file, an array adopted over it, times set on it), they are committed
    /// as that close would have committed them.
    pub fn gathers_writes(self) -> bool {
        matches!(self, OpenPolicy::KernelOpens)
    }

    /// A `release` does what the `flush` the kernel no longer sends would have done
    /// (commit, take in) before letting the handle go; with the daemon opening, the
    /// close's own `flush` did.
    pub(super) fn release_flushes(self) -> bool {
        matches!(self, OpenPolicy::KernelOpens)
    }

    /// Metadata is taken in at the write that makes it a whole document, not at its
    /// close (which is not heard of): a writer that goes on to write chunks finds it
    /// applied, and a refusal is that write's error.
    pub(super) fn lands_metadata_at_write(self) -> bool {
        matches!(self, OpenPolicy::KernelOpens)
    }

    /// The close time a commit of bytes last written (or resized) at `written` (a close
    /// time stamped by [`OpenPolicy::stamp_write`]; 0: never) carries: with kernel opens the
    /// last write stands for the unheard close, so a write another mount fsynced after
    /// this one's close is not replaced when this one is committed later. `None`: the
    /// commit's own time.
    pub(super) fn close_time(self, written: u64) -> Option<u64> {
        match self {
            OpenPolicy::DaemonOpens => None,
            OpenPolicy::KernelOpens => (written != 0).then_some(written),
        }
    }

    /// Other readers of metadata being written see the writer's bytes: they share the
    /// kernel's pages of the file with its writer, as on any local file system. With the
    /// daemon opening they see the stored document until the close that accepts it.
    pub(super) fn shows_pending_writes(self) -> bool {
        matches!(self, OpenPolicy::KernelOpens)
    }

    /// A chunk's attributes check its shard (a `stat`) at `getattr`: with no open to
    /// check it, this is where a change made outside the mount becomes visible, up to the
    /// attribute TTL later.
    pub(super) fn checks_shard_at_getattr(self) -> bool {
        matches!(self, OpenPolicy::KernelOpens)
    }

    /// A chunk's size given to the kernel at `getattr` is kept, for the next open to
    /// compare with what it finds (the kernel caches attributes for the TTL: an open that
    /// finds another size asks it to drop them). Without opens nobody compares.
    pub(super) fn compares_size_at_open(self) -> bool {
        matches!(self, OpenPolicy::DaemonOpens)
    }

    /// The kernel keeps a file's pages across opens, and no open says whether they
    /// stay: where the view shows other bytes than the writer's pages hold (a written
    /// file's commit refused or shown otherwise, a rename onto v2 metadata) the daemon
    /// must drop them with a notice.
    pub fn kernel_keeps_pages(self) -> bool {
        matches!(self, OpenPolicy::KernelOpens)
    }
}

/// A view's open policy: set once, [`OpenPolicy::DaemonOpens`] until it is.
#[derive(Default)]
pub(super) struct PolicyCell(OnceLock<OpenPolicy>);

impl PolicyCell {
    pub(super) fn get(&self) -> OpenPolicy {
        self.0.get().copied().unwrap_or_default()
    }

    /// Whether the policy is `policy` now (false: another one was set before).
    fn set(&self, policy: OpenPolicy) -> bool {
        self.0.set(policy).is_ok() || self.get() == policy
    }
}

impl View {
    /// Who opens files on this view: decided once (FUSE `init`), see [`OpenPolicy`].
    pub fn open_policy(&self) -> OpenPolicy {
        self.open.handles.policy.get()
    }

    /// Decide who opens files, once: FUSE `init` sets [`OpenPolicy::KernelOpens`] when
    /// the kernel offers `FUSE_NO_OPEN_SUPPORT` and the mount wants it; until then (and
    /// for good, without it) the daemon opens. A later call that would change the policy
    /// is refused, and logged.
    pub fn set_open_policy(&self, policy: OpenPolicy) {
        if !self.open.handles.policy.set(policy) {
            log::warn!(
                "open policy {policy:?} refused: the view's is {:?}",
                self.open_policy()
            );
        }
    }

    /// A read of file `ino` through handle `fh`, whichever opened it: by inode when the
    /// kernel opens files itself (a created file's handle too: the daemon may have
    /// committed and closed it since), else by the handle.
    pub fn read_file(&self, ino: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        match self.open_policy() {
            OpenPolicy::DaemonOpens => self.read(fh, offset, size),
            OpenPolicy::KernelOpens => self.read_ino(ino, offset, size),
        }
    }

    /// A write to file `ino` through handle `fh`, whichever opened it (see
    /// [`View::read_file`]); with it, whether a metadata document landed.
    pub fn write_file(&self, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<(u32, bool)> {
        match self.open_policy() {
            OpenPolicy::DaemonOpens => match self.write(fh, offset, data) {
                Err(ViewError::NoSpace) => {
                    self.make_room();
                    self.write(fh, offset, data).map(|n| (n, false))
                }
                res => res.map(|n| (n, false)),
            },
            OpenPolicy::KernelOpens => self.write_ino(ino, offset, data),
        }
    }

    /// The last close of handle `fh` of file `ino`, whichever opened it: with kernel
    /// opens only a created file's handle is released (the kernel opened the rest).
    pub fn release_file(&self, ino: u64, fh: u64) -> Result<()> {
        match self.open_policy() {
            OpenPolicy::DaemonOpens => self.release(fh),
            OpenPolicy::KernelOpens => self.release_created(ino, fh),
        }
    }

    /// `truncate` of file `ino` to `size`, through handle `fh` if one was given,
    /// whichever opened it.
    pub fn set_size_file(&self, ino: u64, size: u64, fh: Option<u64>) -> Result<Attr> {
        match self.open_policy() {
            OpenPolicy::DaemonOpens => self.set_size_open(ino, size, fh),
            OpenPolicy::KernelOpens => self.set_size_ino(ino, size),
        }
    }

    /// A file `create` made and opened as handle `fh`: with kernel opens, its writes
    /// come by inode from now on ([`View::adopt_created`]); with the daemon opening, by
    /// the handle, which its close lets go.
    pub fn created(&self, ino: u64, fh: u64) {
        match self.open_policy() {
            OpenPolicy::DaemonOpens => {}
            OpenPolicy::KernelOpens => self.adopt_created(ino, fh),
        }
    }

    /// Before a rename or link of `ino`: what was written to it and gathered
    /// ([`OpenPolicy::gathers_writes`]) is committed, as its close would have, so the
    /// operation moves the file as its writer left it. Errors are the writer's and were
    /// logged; the operation goes on.
    pub fn commit_before_move(&self, ino: u64) {
        if self.open_policy().gathers_writes() {
            let _ = self.commit_kernel_writes(KernelCommit::Of(ino));
        }
    }
}
