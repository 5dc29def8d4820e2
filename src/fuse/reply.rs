//! Replies in `fuser`'s types: the attributes of a view node as the kernel takes them
//! (also the negative entry that caches an absence), open flags, and a view error as
//! its errno (logged at debug level, a missing name at trace). Which reply a request
//! gets is `fuse.rs`.

use std::time::UNIX_EPOCH;

use fuser::{Errno, FileAttr, FileType, FopenFlags, INodeNo, ReplyEmpty};

use crate::view::{Attr, Kind, Opened, ViewError};

/// A view error as the errno of its reply.
pub(super) fn errno(e: &ViewError) -> Errno {
    match e {
        ViewError::NotFound => log::trace!("reply: {e}"),
        _ => log::debug!("reply: {e} (errno {})", e.errno()),
    }
    Errno::from_i32(e.errno())
}

/// Reply to a request that returns nothing but success or an errno.
pub(super) fn done(reply: ReplyEmpty, res: Result<(), ViewError>) {
    match res {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

pub(super) fn file_type(k: Kind) -> FileType {
    match k {
        Kind::Dir => FileType::Directory,
        Kind::File => FileType::RegularFile,
        Kind::Symlink => FileType::Symlink,
    }
}

pub(super) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: UNIX_EPOCH,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

pub(super) fn open_flags(o: &Opened) -> FopenFlags {
    let mut f = FopenFlags::empty();
    f.set(FopenFlags::FOPEN_KEEP_CACHE, o.keep_cache);
    f.set(FopenFlags::FOPEN_NOFLUSH, o.no_flush);
    f
}

/// A negative entry: inode 0 tells the kernel to cache the absence for the TTL given,
/// so repeated probes (`.zarray`, `.zattrs`, ...) do not reach the daemon.
pub(super) fn negative_attr() -> FileAttr {
    file_attr(&Attr {
        ino: 0,
        kind: Kind::File,
        size: 0,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        volatile: false,
    })
}
