//! The backing store: the directory a mount shows. Finding entries, listing, reading
//! files by range; nothing here knows about the mount's paths or FUSE.
//!
//! [`Store`] is a trait so that the view runs over three backends: [`LocalStore`], an
//! in-memory store for crash-injection tests ([`MemoryStore`]), and object storage
//! ([`BucketStore`], where `open` + `read_at` are ranged GETs). [`LocalStore`] is the
//! local directory: every path is resolved with `openat2(RESOLVE_BENEATH)` against a
//! descriptor of the root, so no symlink or `..` can lead a lookup outside the store, and
//! a final symlink is never followed (the view shows it as a symlink). [`faulty`] is a
//! test tool: a wrapper of any store that makes chosen calls fail with an errno.
//!
//! Where a caller must do things differently for a kind of store (fewer reads where a
//! read is a request, flushing behind the writer where commits append, renaming
//! directories), it asks the store's [`Capabilities`] once and holds them.
//!
//! Shards are read with `pread`, not `mmap`: a shard truncated by another process would
//! turn a mapped read into `SIGBUS` and kill the daemon, while `pread` returns a short
//! read the view reports as `EIO`.

mod capabilities;
pub mod commit;
pub mod faulty;
pub mod limits;
pub mod local;
pub mod memory;
pub mod object;
pub mod operation;
pub mod rewrite;
pub mod shard;
mod shard_cache;

pub(crate) use local::FileRef;

use std::io;
use std::path::Path;
use std::time::SystemTime;

pub use capabilities::{Capabilities, Commits, DirRenames, Reads};
pub use commit::{CommitError, CommitOutcome, Merge, ShardSnapshot, SlotChange, StoredShard};
pub use local::{LocalStore, ReadLock};
pub use memory::MemoryStore;
pub use object::BucketStore;

/// Kind of a store entry, as `lstat` sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// Devices, sockets, FIFOs: listed, never opened.
    Other,
}

/// What the view needs of a store entry's metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryMeta {
    pub kind: EntryKind,
    pub len: u64,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// Permission bits (`0o7777`).
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    /// Backing inode number: with `len` and `mtime`, tells when a file was replaced.
    pub ino: u64,
    /// `ino` names the contents themselves (an object's ETag), not a place that other
    /// contents may take: [`Self::version`] leaves the time out.
    pub content_id: bool,
}

impl EntryMeta {
    /// Identity of a file's contents for cache validation: its inode, length and mtime;
    /// where the inode names the contents (an object's ETag), those and the length. So
    /// an object's version is known from its ETag alone: from a HEAD, a listing, a GET
    /// and the answer to this mount's own PUT, which names no time.
    pub fn version(&self) -> (u64, u64, SystemTime) {
        let time = if self.content_id {
            SystemTime::UNIX_EPOCH
        } else {
            self.mtime
        };
        (self.ino, self.len, time)
    }
}

/// Every entry of an array's key namespace under store directory `dir` (chunk keys and
/// key directories, as `enc` names them for `ndim` dimensions), descending into the key
/// directories: `visit(key, kind, path)`, each directory before what is in it. Entries
/// whose names are no keys are passed over; a directory that cannot be listed is empty.
pub fn walk_keys(
    store: &dyn Store,
    dir: &Path,
    enc: crate::format::ChunkKeyEncoding,
    ndim: usize,
    visit: &mut dyn FnMut(&crate::format::KeyPath, EntryKind, std::path::PathBuf),
) {
    use crate::format::KeyPath;
    let mut stack = vec![(dir.to_path_buf(), None::<Vec<u64>>)];
    while let Some((d, prefix)) = stack.pop() {
        for e in store.list(&d).unwrap_or_default() {
            let Some(key) = e
                .name
                .to_str()
                .and_then(|n| enc.child(ndim, prefix.as_deref(), n))
            else {
                continue;
            };
            let path = d.join(&e.name);
            if let (KeyPath::Dir(c), EntryKind::Dir) = (&key, e.kind) {
                stack.push((path.clone(), Some(c.clone())));
            }
            visit(&key, e.kind, path);
        }
    }
}

/// Where a sharded array's `zarr.json` goes when a writable mount unlinks it while the
/// array's other names stay (`rm zarr.json`, `tar -x`, zarr 2's recursive removal): in
/// the array's directory, under a name no Zarr reader looks for, so that the metadata
/// written back, by this mount or a later one, takes the shards back as the array's
/// (not as chunks of a new one). Removed with the metadata written back or the directory.
pub const UNLINKED_META: &str = "zarr.json.shardfs-unlinked";

/// Whether `name` is one of shardfs's own files beside the shards (a recovery record, a
/// shard rewrite's or a metadata write's temporary file, the directory a new array's
/// chunk files wait in, an unlinked array's metadata): never shown as a file of the
/// tree, and refused as a name to make.
pub fn is_internal(name: &std::ffi::OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    name == ".shardfs-ingest"
        || [
            ".shardfs-append",
            ".shardfs-tmp",
            ".shardfs-new",
            ".shardfs-unlinked",
        ]
        .iter()
        .any(|s| name.ends_with(s))
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListEntry {
    pub name: std::ffi::OsString,
    pub kind: EntryKind,
}

/// Space figures for `statfs`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SpaceInfo {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
}

/// An open file of the store, read by range.
pub trait StoreFile: Send + Sync {
    /// Read up to `buf.len()` bytes at `offset`; fewer only at end of file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    fn meta(&self) -> io::Result<EntryMeta>;

    /// Read up to `buf.len()` bytes at `offset`, which lies in the inner chunk at
    /// `chunk` of this (shard) file: a store that fetches ahead may fetch the rest of
    /// the chunk with it.
    fn read_chunk_at(
        &self,
        buf: &mut [u8],
        offset: u64,
        chunk: std::ops::Range<u64>,
    ) -> io::Result<usize> {
        let _ = chunk;
        self.read_at(buf, offset)
    }

    /// Whether reads are going forward through the file, one after another (object
    /// storage's read-ahead says so; a local file never does): the view then loads the
    /// next shard ahead of the reader.
    fn streaming(&self) -> bool {
        false
    }

    /// Whether [`StoreFile::warm`] would fetch anything: nothing of the file's bytes is
    /// held or being fetched ahead (a local file: never).
    fn cold(&self) -> bool {
        false
    }

    /// Passes over the file that read through what it held ahead (object storage; a
    /// local file: 0): at each, the file is cold again, and the view loads ahead for the
    /// next pass as for the first ([`crate::store::shard::Shard::claim_next`]).
    fn pass(&self) -> u64 {
        0
    }

    /// Fetch the start of the file ahead, before anything reads it (a shard loaded
    /// ahead of its reader, so that its index and chunks come in one request). Best
    /// effort: an error here is met again, and reported, by the read that needs the bytes.
    fn warm(&self) {}

    /// Start fetching all of the file but `skip` (the chunk its reader opened, which that
    /// reader fetches itself) in the background, without waiting for it: reads of it
    /// from now on wait for their bytes of that fetch rather than making their own. A
    /// reader that opened the first chunk of an array (in key order) is most likely
    /// going through it. `false`: nothing started (nothing to fetch, no room, read
    /// already, or a store that does not fetch so).
    fn claim_rest(&self, skip: std::ops::Range<u64>) -> bool {
        let _ = skip;
        false
    }

    /// Read exactly `buf.len()` bytes at `offset`, or fail with `UnexpectedEof`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        read_exact_with(buf, offset, |b, at| self.read_at(b, at))
    }
}

/// A store file is a source the shard reader ([`crate::format::shard_read`]) reads
/// through: with the file's own [`StoreFile::read_exact_at`].
impl<F: StoreFile + ?Sized> crate::format::shard_read::ByteSource for F {
    fn read_into(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_exact_at(buf, offset)
    }
}

/// Fill `buf` from `offset` with `read` (a `read_at`), or fail with `UnexpectedEof`.
pub(crate) fn read_exact_with(
    mut buf: &mut [u8],
    mut offset: u64,
    mut read: impl FnMut(&mut [u8], u64) -> io::Result<usize>,
) -> io::Result<()> {
    while !buf.is_empty() {
        match read(buf, offset) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A store file open for reading and writing: the files outside arrays' key namespaces
/// (and group metadata being written), which pass through to the store.
pub trait StoreFileRw: StoreFile {
    /// Write all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Make the file's contents durable.
    fn sync(&self) -> io::Result<()>;
}

/// Bytes of a file fetched with its open ([`Store::open_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    /// The first this many bytes.
    Start(u64),
    /// The last this many bytes (all of a shorter file).
    End(u64),
}

/// How [`Store::open_rw`] opens a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// It must exist.
    Existing,
    /// Made if missing.
    Create,
    /// It must not exist yet.
    CreateNew,
}

fn read_only<T>() -> io::Result<T> {
    Err(io::Error::from_raw_os_error(libc::EROFS))
}

/// The backing store. Paths are relative to its root, `/`-separated components that
/// are never `.` or `..` (the view builds them from names the kernel looked up).
///
/// A method without a body is one every store answers its own way; a default body is
/// the answer of each store that has nothing else to say (no listing ahead, no request
/// counters, no directory locks, no rewrite of its own, and `EROFS` for the changes of a
/// store that keeps only shards, the in-memory one). What kind of store it is, where a
/// caller does things differently for it, is one value: [`Store::capabilities`].
pub trait Store: Send + Sync {
    /// `lstat`; `Ok(None)` when nothing is there.
    fn stat(&self, rel: &Path) -> io::Result<Option<EntryMeta>>;
    /// The entries of a directory, without `.` and `..`.
    fn list(&self, rel: &Path) -> io::Result<Vec<ListEntry>>;
    /// Ask for everything below directory `rel` at once, where that is one request for
    /// at most `max` names: its [`Store::list`] and those of the directories below it
    /// then answer from what it found, for as long as a listing's answer is used again
    /// (object storage: one LIST without delimiter rather than one per directory, in
    /// series level by level). `false`: nothing kept (the default: a store whose
    /// listings cost no request).
    fn list_tree(&self, rel: &Path, max: usize) -> io::Result<bool> {
        let _ = (rel, max);
        Ok(false)
    }
    /// Open a regular file for reading; `Ok(None)` when nothing is there.
    fn open(&self, rel: &Path) -> io::Result<Option<Box<dyn StoreFile>>>;
    /// [`Store::open`], fetching `with` of the file's bytes in the same request where
    /// an open costs one (object storage: one ranged GET, not a HEAD and then a GET, for
    /// a shard's index or the start of a shard loaded ahead); elsewhere `open`.
    fn open_with(&self, rel: &Path, with: Prefetch) -> io::Result<Option<Box<dyn StoreFile>>> {
        let _ = with;
        self.open(rel)
    }
    fn read_link(&self, rel: &Path) -> io::Result<std::path::PathBuf>;
    fn space(&self) -> io::Result<SpaceInfo>;
    /// A name for log lines and `fsname`.
    fn describe(&self) -> String;

    /// What this store is (how its reads, commits and directory renames work): the same
    /// answer every time, asked once by whoever does things differently for it.
    fn capabilities(&self) -> Capabilities;

    /// Requests made to a remote store so far, by kind, for `shardfs stats` (object
    /// storage: `get`, `get_bytes`, `head`, `list`); empty for a local one.
    fn requests(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// Hold the shared side of the lock shard updates take on directory `dir` (see
    /// `store::local::append`) until the returned guard drops, so that a shard is read
    /// between updates, never during one. `None` where the backend has no such lock (a
    /// store whose commits are no [`Commits::Append`]) or it could not be taken.
    fn read_lock(&self, dir: &Path) -> Option<ReadLock> {
        let _ = dir;
        None
    }

    /// Rewrite the shard at `rel` without dead space (the same bytes per slot, in slot
    /// order, the same index codecs and location, its close times kept), replacing it
    /// atomically and only if it did not change meanwhile (read again and redone if it
    /// did). `Ok(None)`: this store does not do it here (a local directory's `compact`
    /// works under its directory locks, `maint::compact`). `Some((old_len, new_len))`.
    fn rewrite_dense(
        &self,
        rel: &Path,
        level: &crate::format::ShardLevel,
    ) -> Result<Option<(u64, u64)>, CommitError> {
        let _ = (rel, level);
        Ok(None)
    }

    /// Commit one shard: read its current state (index and close times), let `merge`
    /// decide the changes, and make them durable atomically, only on the state `merge`
    /// saw (see [`commit`]). `merge` may be called more than once (when the shard changed
    /// under a first attempt); each call sees the shard afresh.
    fn commit_shard(
        &self,
        rel: &Path,
        level: &crate::format::ShardLevel,
        merge: &mut Merge<'_, '_>,
    ) -> Result<CommitOutcome, CommitError>;

    /// Open a regular file for reading and writing (never through a final symlink).
    fn open_rw(
        &self,
        rel: &Path,
        mode: OpenMode,
        truncate: bool,
    ) -> io::Result<Box<dyn StoreFileRw>> {
        let _ = (rel, mode, truncate);
        read_only()
    }

    /// Replace the file `rel` with `data` so that readers see the old or the new
    /// content, never a mix, durably (a temporary file renamed into place).
    fn write_atomically(&self, rel: &Path, data: &[u8]) -> io::Result<()> {
        let _ = (rel, data);
        read_only()
    }

    fn create_dir(&self, rel: &Path) -> io::Result<()> {
        let _ = rel;
        read_only()
    }

    /// Remove a file or symlink.
    fn remove_file(&self, rel: &Path) -> io::Result<()> {
        let _ = rel;
        read_only()
    }

    /// Remove an empty directory.
    fn remove_dir(&self, rel: &Path) -> io::Result<()> {
        let _ = rel;
        read_only()
    }

    /// Rename a file or symlink; where the store's [`DirRenames::OneStep`] says so, a
    /// directory too, with everything in it, in one step that readers see whole (POSIX's
    /// rules for what may stand at `to`: nothing, or an empty directory). Callers never
    /// ask it to rename a directory elsewhere.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let _ = (from, to);
        read_only()
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let _ = (from, to);
        read_only()
    }

    /// Set the permission bits and owner of a file or directory (`chmod`, `chown`), what
    /// is `Some`. A store that keeps no modes or owners (object storage) ignores it.
    fn set_mode_owner(
        &self,
        rel: &Path,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> io::Result<()> {
        let _ = (rel, mode, uid, gid);
        Ok(())
    }

    /// Make a file's contents durable.
    fn sync_file(&self, rel: &Path) -> io::Result<()> {
        let _ = rel;
        Ok(())
    }

    /// Read a whole (small) file, e.g. `zarr.json`; `Ok(None)` when absent.
    fn read_all(&self, rel: &Path) -> io::Result<Option<Vec<u8>>> {
        let Some(f) = self.open(rel)? else {
            return Ok(None);
        };
        let len = f.meta()?.len;
        let mut buf = vec![0; usize::try_from(len).map_err(|_| io::ErrorKind::OutOfMemory)?];
        f.read_exact_at(&mut buf, 0)?;
        Ok(Some(buf))
    }
}

/// Remove `rel` and everything beneath it (never following a symlink), one `stat`,
/// `list` and removal of `store` at a time (so a [`faulty`] wrapper's faults reach each).
pub fn remove_tree(store: &dyn Store, rel: &Path) -> io::Result<()> {
    match store.stat(rel)? {
        None => Ok(()),
        Some(m) if m.kind == EntryKind::Dir => {
            for e in store.list(rel)? {
                remove_tree(store, &rel.join(&e.name))?;
            }
            store.remove_dir(rel)
        }
        Some(_) => store.remove_file(rel),
    }
}
