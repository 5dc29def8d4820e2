//! The FUSE adapter: each `fuser::Filesystem` callback makes one call into the
//! [`View`] and replies with its result or its errno. No logic about shards or keys lives
//! here; anything worth a test belongs in `view`.
//!
//! This file holds [`ShardFs`] and its `fuser::Filesystem` callbacks: one method each,
//! a table of requests, left whole (a trait's methods stay in one `impl`). What the
//! kernel is told to drop around a reply is `fuse/invalidate.rs`; the conversions to
//! `fuser`'s types (attributes, open flags, errnos) are `fuse/reply.rs`.

mod invalidate;
mod reply;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fuser::{
    BsdFileFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, Notifier, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::time::SystemTime;

use crate::store::operation;
use crate::view::{Attr, KernelCommit, OpenPolicy, View, ViewError};
use reply::{done, errno, file_attr, file_type, negative_attr, open_flags};

/// The filesystem handed to `fuser`.
pub struct ShardFs {
    view: Arc<View>,
    /// The open policy the mount asks for: [`OpenPolicy::KernelOpens`] is taken at `init`
    /// where the kernel offers it.
    wanted: OpenPolicy,
    /// Set once the session runs: for invalidations that must precede a reply.
    notifier: Arc<OnceLock<Notifier>>,
}

impl ShardFs {
    /// `wanted`: [`OpenPolicy::KernelOpens`] lets the kernel open and close files
    /// without a request (`FUSE_NO_OPEN_SUPPORT`) when it offers that; see [`OpenPolicy`].
    pub fn new(view: Arc<View>, wanted: OpenPolicy) -> Self {
        ShardFs {
            view,
            wanted,
            notifier: Arc::default(),
        }
    }

    /// Before a rename or link of `ino`, if it names a file: see
    /// [`View::commit_before_move`].
    fn commit_before_move(&self, ino: Option<u64>) {
        if let Some(ino) = ino {
            self.view.commit_before_move(ino);
        }
    }

    /// Where the mount puts the session's notifier once the session runs.
    pub fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        self.notifier.clone()
    }

    /// The TTL for these attributes: the view's cache policy decides.
    fn ttl(&self, a: &Attr) -> Duration {
        self.view.cache().attr_ttl(a)
    }
}

impl Filesystem for ShardFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if self.wanted == OpenPolicy::DaemonOpens {
            return Ok(());
        }
        // Without opens, a change of a file is seen when its attributes are revalidated
        // (after the TTL): AUTO_INVAL_DATA makes the kernel drop cached pages when the
        // mtime it gets then differs, not only when the size does.
        let want = InitFlags::FUSE_NO_OPEN_SUPPORT | InitFlags::FUSE_AUTO_INVAL_DATA;
        match config.add_capabilities(want) {
            Ok(()) => {
                self.view.set_open_policy(OpenPolicy::KernelOpens);
                log::info!("the kernel opens files without asking the daemon");
            }
            Err(missing) => log::info!("the kernel lacks {missing:?}: every open asks the daemon"),
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _op = operation::begin();
        match self.view.lookup(parent.0, name) {
            Ok(a) => reply.entry(&self.ttl(&a), &file_attr(&a), Generation(0)),
            Err(ViewError::NotFound) => reply.entry(
                &self.view.cache().negative_ttl(),
                &negative_attr(),
                Generation(0),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.view.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _op = operation::begin();
        match self.view.getattr_open(ino.0, fh.map(|f| f.0)) {
            Ok(a) => reply.attr(&self.ttl(&a), &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _op = operation::begin();
        match self.view.readlink(ino.0) {
            Ok(p) => reply.data(p.as_os_str().as_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _op = operation::begin();
        if !self.view.open_policy().answers_opens() {
            // Taken as success: from now on the kernel opens and releases files itself,
            // and reads come with file handle 0.
            return reply.error(Errno::ENOSYS);
        }
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        let truncate = flags.0 & libc::O_TRUNC != 0;
        match self.view.open(ino.0, write, truncate) {
            Ok(o) => {
                if o.stale_size {
                    self.drop_stale_size(ino);
                }
                reply.opened(FileHandle(o.fh), open_flags(&o))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _op = operation::begin();
        match self.view.read_file(ino.0, fh.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => {
                reply.error(errno(&e));
                if matches!(e, ViewError::SizeStale(_)) {
                    // After the reply: the kernel's read holds the page lock.
                    self.drop_stale_size(ino);
                }
            }
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _op = operation::begin();
        if !self.view.open_policy().answers_opens() {
            // The kernel stops sending flushes: it would send one at every close of every
            // descriptor it opened, a round trip as dear as the open saved. What a flush
            // would commit is committed by `View::commit_kernel_writes`.
            return reply.error(Errno::ENOSYS);
        }
        let r = self.view.flush_handle(fh.0);
        self.settle();
        done(reply, r)
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _op = operation::begin();
        let r = self.view.release_file(ino.0, fh.0);
        self.settle();
        done(reply, r)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _op = operation::begin();
        match self.view.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _op = operation::begin();
        match self.view.dir_entries(fh.0) {
            Ok(entries) => {
                for (i, e) in entries.iter().enumerate().skip(offset as usize) {
                    let next = i as u64 + 1;
                    if reply.add(INodeNo(e.ino), next, file_type(e.kind), &e.name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _op = operation::begin();
        self.view.releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _op = operation::begin();
        match self.view.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn destroy(&mut self) {
        if let Err(e) = self.view.commit_kernel_writes(KernelCommit::All) {
            log::error!("commit at unmount failed: {e}");
        }
        if let Err(e) = self.view.sync_all() {
            log::error!("flush at unmount failed: {e}");
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _op = operation::begin();
        let (excl, trunc) = (flags & libc::O_EXCL != 0, flags & libc::O_TRUNC != 0);
        match self.view.create(parent.0, name, excl, trunc) {
            Ok((a, o)) => {
                self.view.created(a.ino, o.fh);
                reply.created(
                    &self.ttl(&a),
                    &file_attr(&a),
                    Generation(0),
                    FileHandle(o.fh),
                    open_flags(&o),
                )
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _op = operation::begin();
        let writing = crate::view::write_api::Writing::enter(ino.0);
        let written = self.view.write_file(ino.0, fh.0, offset, data);
        // An invalidation of this file asked for meanwhile is sent after the reply: the
        // kernel holds its written pages locked until then.
        let deferred = writing.end();
        let landed = matches!(written, Ok((_, true)));
        // Not while an invalidation of this very file is on the way: the kernel delivers
        // it only once this write's reply unlocks the file's pages, so the wait could only
        // run out its bound (1 s). The reply goes first, and the invalidations follow.
        if landed && !self.invalidation_pending(ino) {
            self.before_landed_reply();
        }
        match written {
            Ok((n, _)) => reply.written(n),
            Err(e) => {
                // A refusal may have taken the file's name away (new v2 metadata that
                // cannot be taken in): the kernel drops its entry before the writer hears.
                if let Some(w) = self.view.write_side() {
                    w.settle_entry_invalidations(std::time::Duration::from_secs(1));
                }
                reply.error(errno(&e));
            }
        }
        if landed || deferred {
            self.after_write_reply(ino, landed);
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _op = operation::begin();
        // Modes and owners are the store's: set on its files and directories, and
        // derived (a change accepted and dropped) for the files the view makes up.
        let fh = fh.map(|f| f.0);
        let mut res = match size {
            Some(size) => self.view.set_size_file(ino.0, size, fh),
            None => self.view.getattr_open(ino.0, fh),
        };
        if res.is_ok() && (mode.is_some() || uid.is_some() || gid.is_some()) {
            res = self.view.set_mode_owner(ino.0, mode, uid, gid);
        }
        if res.is_ok() && (atime.is_some() || mtime.is_some()) {
            let time = |t: Option<TimeOrNow>| {
                t.map(|t| match t {
                    TimeOrNow::SpecificTime(t) => t,
                    TimeOrNow::Now => SystemTime::now(),
                })
            };
            res = self.view.set_times(ino.0, time(atime), time(mtime));
        }
        match res {
            Ok(a) => reply.attr(&self.ttl(&a), &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let _op = operation::begin();
        match self.view.mkdir(parent.0, name) {
            Ok(a) => reply.entry(&self.ttl(&a), &file_attr(&a), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Sockets, FIFOs and device nodes have no place in a Zarr store: `EPERM`, which
    /// mknod(2) documents for a file system that does not support the type (regular
    /// files come through `create`).
    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        log::debug!("mknod {name:?} (mode {mode:o}) refused: EPERM");
        reply.error(Errno::EPERM);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _op = operation::begin();
        done(reply, self.view.unlink(parent.0, name))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _op = operation::begin();
        done(reply, self.view.rmdir(parent.0, name))
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _op = operation::begin();
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let moved = self.view.ino_at(parent.0, name);
        self.commit_before_move(moved);
        self.commit_before_move(self.view.ino_at(newparent.0, newname));
        match self
            .view
            .rename(parent.0, name, newparent.0, newname, noreplace)
        {
            Ok(renamed) => {
                self.before_rename_reply(moved, renamed);
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _op = operation::begin();
        self.commit_before_move(Some(ino.0));
        match self.view.link(ino.0, newparent.0, newname) {
            Ok(a) => reply.entry(&self.ttl(&a), &file_attr(&a), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _op = operation::begin();
        let r = self
            .view
            .commit_kernel_writes(KernelCommit::Of(ino.0))
            .and_then(|()| self.view.fsync_file(ino.0, fh.0));
        self.settle();
        done(reply, r)
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _op = operation::begin();
        let r = self
            .view
            .commit_kernel_writes(KernelCommit::Settled { except: None })
            .and_then(|()| self.view.fsyncdir(ino.0));
        done(reply, r)
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    // The calls below are not served. Each is answered without fuser's default warning
    // (a `cp` into the mount logged five lines of "[Not Implemented] copy_file_range"):
    // ENOSYS tells the kernel to stop asking and do without (copy through read and
    // write, seek by size, EOPNOTSUPP to the application for xattrs and fallocate).

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }

    /// Symbolic links cannot be made in a mount: EPERM, as symlink(2) says for a file
    /// system that does not support them (fuser's default answered ENOSYS, with a warning).
    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // No extended attributes; ENOSYS tells the kernel to stop asking.
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Permissions are checked by the kernel (`default_permissions`).
        reply.ok();
    }
}
