//! The FUSE floor: the least a FUSE file system can do, for `scripts/bench` to measure
//! what the kernel round trips alone cost on this machine.
//!
//! `fuse_floor [--no-open] MIRROR MOUNTPOINT` mounts (in the foreground, until unmounted
//! from outside) a tree with the names and sizes of the directory MIRROR, held in memory.
//! A read of a file that came from MIRROR returns its bytes (read from MIRROR at that
//! offset, so zarr-python and `cp` work through the floor); files written through the
//! floor keep no bytes (a read returns zeros, a write only moves the size). Every other
//! request is one hash lookup under one lock. The session is set up as shardfs sets up a
//! mount (worker threads, cloned fds, `default_permissions`), and replies as shardfs
//! does where it matters for speed: the same TTLs (10 s, misses 1 s), opens with
//! `FOPEN_KEEP_CACHE` (a warm read is served from the page cache), and no flush request
//! at close. So a case through this mount costs what any FUSE file system that asks its
//! daemon at `open` would pay at best (the floor of a writable shardfs mount);
//! shardfs's own work is the difference.
//!
//! `--no-open` is the floor of a read-only shardfs mount: as there, the daemon asks for
//! `FUSE_NO_OPEN_SUPPORT` (and `FUSE_AUTO_INVAL_DATA`) at init and answers the first
//! `open` and `flush` with `ENOSYS`, so the kernel opens and closes files without
//! asking it. `--no-open --answer-flush` answers flushes: what a writable mount that let
//! the kernel open files would pay at best, as it must still learn of every close (the
//! kernel sends no release for files it opened itself, and a flush at every close).
//!
//! Two switches make it a plain in-memory file system, to tell the kernel's own behaviour
//! from shardfs's: `--keep-bytes` keeps what is written (a read returns it), and
//! `--drop-cache` opens without `FOPEN_KEEP_CACHE`, as a writable shardfs mount opens a
//! file it cannot vouch for (see docs/SEMANTICS.md, "A reader beside a writer in the same
//! mount", which `tests/py/torn_read.py` measures).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request,
    SessionACL, TimeOrNow, WriteFlags,
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
    /// What was written, with `--keep-bytes`.
    bytes: Vec<u8>,
    /// The file of MIRROR this node shows, for its bytes.
    src: Option<PathBuf>,
}

#[derive(Default)]
struct Tree {
    nodes: HashMap<u64, Node>,
    names: HashMap<(u64, OsString), u64>,
    /// The names ever given in each directory, in order (a name gone from `names` since
    /// is skipped by readdir).
    children: HashMap<u64, Vec<OsString>>,
    next: u64,
}

impl Tree {
    fn add(&mut self, parent: u64, name: &OsStr, dir: bool, size: u64) -> u64 {
        self.next += 1;
        let ino = self.next;
        self.nodes.insert(
            ino,
            Node {
                dir,
                size,
                bytes: Vec::new(),
                src: None,
            },
        );
        self.link(parent, name, ino);
        ino
    }

    fn link(&mut self, parent: u64, name: &OsStr, ino: u64) {
        if self.names.insert((parent, name.to_owned()), ino).is_none() {
            self.children
                .entry(parent)
                .or_default()
                .push(name.to_owned());
        }
    }

    fn mirror(&mut self, parent: u64, dir: &Path) -> std::io::Result<()> {
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let meta = e.metadata()?;
            let ino = self.add(parent, &e.file_name(), meta.is_dir(), meta.len());
            if meta.is_dir() {
                self.mirror(ino, &e.path())?;
            } else if let Some(n) = self.nodes.get_mut(&ino) {
                n.src = Some(e.path());
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

struct Floor {
    tree: Mutex<Tree>,
    /// `--no-open`: the kernel opens files itself, as on a read-only shardfs mount.
    no_open: bool,
    /// `--answer-flush`: flushes are answered (else `ENOSYS`: the kernel stops sending).
    answer_flush: bool,
    /// `--keep-bytes`: written bytes are kept and read back (else a write moves the size).
    keep_bytes: bool,
    /// `--drop-cache`: opens let the kernel drop the pages it cached.
    drop_cache: bool,
}

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

impl Floor {
    fn open_flags(&self) -> FopenFlags {
        match self.drop_cache {
            true => FopenFlags::FOPEN_NOFLUSH,
            false => FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
        }
    }
}

impl Filesystem for Floor {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if self.no_open {
            let want = InitFlags::FUSE_NO_OPEN_SUPPORT | InitFlags::FUSE_AUTO_INVAL_DATA;
            if let Err(missing) = config.add_capabilities(want) {
                eprintln!("fuse_floor: the kernel lacks {missing:?}: every open asks");
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let t = self.tree.lock();
        match t.names.get(&(parent.0, name.to_owned())) {
            Some(&ino) => reply.entry(&TTL, &t.attr(ino).expect("named"), Generation(0)),
            None => reply.entry(&NEGATIVE_TTL, &negative(), Generation(0)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.tree.lock().attr(ino.0) {
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
        let mut t = self.tree.lock();
        if let (Some(size), Some(n)) = (size, t.nodes.get_mut(&ino.0)) {
            n.size = size;
            if self.keep_bytes {
                n.bytes.resize(size as usize, 0);
            }
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
        let mut t = self.tree.lock();
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
        let mut t = self.tree.lock();
        let ino = match t.names.get(&(parent.0, name.to_owned())) {
            Some(&ino) => ino,
            None => t.add(parent.0, name, false, 0),
        };
        let a = t.attr(ino).expect("added");
        reply.created(&TTL, &a, Generation(0), FileHandle(ino), self.open_flags());
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_open {
            return reply.error(Errno::ENOSYS);
        }
        reply.opened(FileHandle(ino.0), self.open_flags());
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Only asked with --no-open (opens say FOPEN_NOFLUSH otherwise).
        if self.answer_flush {
            return reply.ok();
        }
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let t = self.tree.lock();
        let names = t.children.get(&ino.0).map_or(&[][..], |v| &v[..]);
        for (i, name) in names.iter().enumerate().skip(offset as usize) {
            let Some(&child) = t.names.get(&(ino.0, name.clone())) else {
                continue;
            };
            let kind = if t.nodes.get(&child).is_some_and(|n| n.dir) {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
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
        let t = self.tree.lock();
        let (len, src) = match t.nodes.get(&ino.0) {
            Some(n) => (n.size, n.src.clone()),
            None => (0, None),
        };
        let n = (len.saturating_sub(offset).min(size as u64) as usize).min(ZEROS.len());
        if self.keep_bytes
            && src.is_none()
            && let Some(node) = t.nodes.get(&ino.0)
        {
            let at = (offset as usize).min(node.bytes.len());
            return reply.data(&node.bytes[at..(at + n).min(node.bytes.len())]);
        }
        drop(t);
        let Some(src) = src else {
            return reply.data(&ZEROS[..n]);
        };
        let mut buf = vec![0; n];
        match std::fs::File::open(src).and_then(|f| f.read_at(&mut buf, offset)) {
            Ok(k) => reply.data(&buf[..k]),
            Err(e) => reply.error(Errno::from(e)),
        }
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
        if let Some(n) = self.tree.lock().nodes.get_mut(&ino.0) {
            n.size = n.size.max(offset + data.len() as u64);
            if self.keep_bytes {
                let (at, end) = (offset as usize, offset as usize + data.len());
                if n.bytes.len() < end {
                    n.bytes.resize(end, 0);
                }
                n.bytes[at..end].copy_from_slice(data);
            }
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
        let mut t = self.tree.lock();
        match t.names.remove(&(parent.0, name.to_owned())) {
            Some(ino) => {
                t.link(newparent.0, newname, ino);
                reply.ok();
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.tree.lock().names.remove(&(parent.0, name.to_owned())) {
            Some(_) => reply.ok(),
            None => reply.error(Errno::ENOENT),
        }
    }
}

fn main() -> std::io::Result<()> {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut flag = |name: &str| match args.iter().position(|a| a == name) {
        Some(i) => {
            args.remove(i);
            true
        }
        None => false,
    };
    let no_open = flag("--no-open");
    let answer_flush = flag("--answer-flush");
    let keep_bytes = flag("--keep-bytes");
    let drop_cache = flag("--drop-cache");
    let [mirror, mountpoint] = &args[..] else {
        eprintln!(
            "usage: fuse_floor [--no-open [--answer-flush]] [--keep-bytes] [--drop-cache] MIRROR MOUNTPOINT"
        );
        std::process::exit(2);
    };
    let mut tree = Tree {
        next: ROOT,
        ..Tree::default()
    };
    tree.nodes.insert(
        ROOT,
        Node {
            dir: true,
            size: 0,
            bytes: Vec::new(),
            src: None,
        },
    );
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
    let floor = Floor {
        tree: Mutex::new(tree),
        no_open,
        answer_flush,
        keep_bytes,
        drop_cache,
    };
    fuser::mount(floor, mountpoint, &config)
}
