//! The FUSE floor: the least a FUSE file system can do, for `scripts/bench` to measure
//! what the kernel round trips alone cost on this machine.
//!
//! `fuse_floor MIRROR MOUNTPOINT` mounts (in the foreground, until unmounted from
//! outside) a tree with the names and sizes of the directory MIRROR, held in memory.
//! No bytes are kept: a read returns zeros, a write only moves the size. Every request
//! is one hash lookup under one lock. The session is set up as shardfs sets up a
//! writable mount (worker threads, cloned fds, `default_permissions`), and replies as
//! shardfs does where it matters for speed: the same TTLs (10 s, misses 1 s), opens
//! with `FOPEN_KEEP_CACHE` (a warm read is served from the page cache), and no flush
//! request at close. So a case through this mount costs what any FUSE file system that
//! asks its daemon at `open` would pay at best; shardfs's own work is the difference.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyWrite, Request, SessionACL, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

const TTL: Duration = Duration::from_secs(10);
const NEGATIVE_TTL: Duration = Duration::from_secs(1);
const ROOT: u64 = 1;
/// Zeros for reads: a read is at most `max_read`, which is at most 1 MiB here.
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

struct Node {
    dir: bool,
    size: u64,
}

#[derive(Default)]
struct Tree {
    nodes: HashMap<u64, Node>,
    names: HashMap<(u64, OsString), u64>,
    next: u64,
}

impl Tree {
    fn add(&mut self, parent: u64, name: &OsStr, dir: bool, size: u64) -> u64 {
        self.next += 1;
        let ino = self.next;
        self.nodes.insert(ino, Node { dir, size });
        self.names.insert((parent, name.to_owned()), ino);
        ino
    }

    fn mirror(&mut self, parent: u64, dir: &Path) -> std::io::Result<()> {
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let meta = e.metadata()?;
            let ino = self.add(parent, &e.file_name(), meta.is_dir(), meta.len());
            if meta.is_dir() {
                self.mirror(ino, &e.path())?;
            }
        }
        Ok(())
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let n = self.nodes.get(&ino)?;
        Some(FileAttr {
            ino: INodeNo(ino),
            size: n.size,
            blocks: n.size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: if n.dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: if n.dir { 0o755 } else { 0o644 },
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }
}

struct Floor(Mutex<Tree>);

fn negative() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn cached_open() -> FopenFlags {
    FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH
}

impl Filesystem for Floor {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let t = self.0.lock();
        match t.names.get(&(parent.0, name.to_owned())) {
            Some(&ino) => reply.entry(&TTL, &t.attr(ino).expect("named"), Generation(0)),
            None => reply.entry(&NEGATIVE_TTL, &negative(), Generation(0)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.lock().attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut t = self.0.lock();
        if let (Some(size), Some(n)) = (size, t.nodes.get_mut(&ino.0)) {
            n.size = size;
        }
        match t.attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
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
        let mut t = self.0.lock();
        if t.names.contains_key(&(parent.0, name.to_owned())) {
            return reply.error(Errno::EEXIST);
        }
        let ino = t.add(parent.0, name, true, 0);
        reply.entry(&TTL, &t.attr(ino).expect("added"), Generation(0));
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut t = self.0.lock();
        let ino = match t.names.get(&(parent.0, name.to_owned())) {
            Some(&ino) => ino,
            None => t.add(parent.0, name, false, 0),
        };
        let a = t.attr(ino).expect("added");
        reply.created(&TTL, &a, Generation(0), FileHandle(ino), cached_open());
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(ino.0), cached_open());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let len = self.0.lock().nodes.get(&ino.0).map_or(0, |n| n.size);
        let n = len.saturating_sub(offset).min(size as u64) as usize;
        reply.data(&ZEROS[..n.min(ZEROS.len())]);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if let Some(n) = self.0.lock().nodes.get_mut(&ino.0) {
            n.size = n.size.max(offset + data.len() as u64);
        }
        reply.written(data.len() as u32);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut t = self.0.lock();
        match t.names.remove(&(parent.0, name.to_owned())) {
            Some(ino) => {
                t.names.insert((newparent.0, newname.to_owned()), ino);
                reply.ok();
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.0.lock().names.remove(&(parent.0, name.to_owned())) {
            Some(_) => reply.ok(),
            None => reply.error(Errno::ENOENT),
        }
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let [mirror, mountpoint] = &args[..] else {
        eprintln!("usage: fuse_floor MIRROR MOUNTPOINT");
        std::process::exit(2);
    };
    let mut tree = Tree {
        next: ROOT,
        ..Tree::default()
    };
    tree.nodes.insert(ROOT, Node { dir: true, size: 0 });
    tree.mirror(ROOT, Path::new(mirror))?;
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("fuse_floor".into()),
        MountOption::DefaultPermissions,
    ];
    config.acl = SessionACL::Owner;
    config.n_threads = Some(
        std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(2, 16),
    );
    config.clone_fd = true;
    fuser::mount(Floor(Mutex::new(tree)), mountpoint, &config)
}
