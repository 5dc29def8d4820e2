//! Recovery of torn shard updates, and the two files an interrupted update can leave
//! beside a shard (byte layout mirrored in `docs/FORMAT.md`, "Writes: the append protocol"):
//!
//! ```text
//! <shard>.shardfs-append   recovery record of an append in progress, 40 bytes:
//!   0..16   magic  b"SHARDFS-APPEND\x00\x01"   (the last byte is the record version)
//!  16..24   old_len   u64 LE   shard length before the append
//!  24..32   new_len   u64 LE   shard length after it (chunk bytes + new index appended)
//!  32..36   tail_crc  u32 LE   CRC-32C of the appended bytes old_len..new_len
//!  36..40   crc       u32 LE   CRC-32C of bytes 0..36
//! <shard>.shardfs-tmp      a whole new shard being written; renamed over <shard> when done
//! ```
//!
//! Both live in the shard's directory and are only created, read and removed under that
//! directory's exclusive `flock` ([`ShardDir`]), the lock every shard update holds. This
//! module also owns that lock. It does not own what an update writes (`append`), nor the
//! checks of a shard's index (`maint::verify`).
//!
//! Who recovers: every update its own shard first (`append::apply`); a writable mount each
//! shard before it first reads its index ([`LazyRecovery`]) and the whole store in a
//! background walk once it is mounted ([`recover_store`]); `verify --repair` the whole
//! store. All of them settle a record only under the directory's lock and after looking
//! at it again, so any two of them, in any order, do the work once. A read-only mount
//! settles nothing: it reads a shard with an interrupted append as recovery would leave
//! it ([`ReadOnlyRecords`]).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, ResolveFlags};

use crate::store::Store;
use crate::store::commit::CommitError;
use crate::store::shard::{LoadHook, ShardError, Truncated};

/// Suffix of the recovery record of an append in progress.
pub const APPEND_SUFFIX: &str = ".shardfs-append";
/// Suffix of a whole-shard rewrite in progress.
pub const TEMP_SUFFIX: &str = ".shardfs-tmp";
/// First bytes of a recovery record; the last byte is the record version.
pub const RECORD_MAGIC: [u8; 16] = *b"SHARDFS-APPEND\x00\x01";
/// Size of a recovery record.
pub const RECORD_LEN: usize = RECORD_MAGIC.len() + 8 + 8 + 4 + 4;
const CRC_AT: usize = RECORD_LEN - 4;

/// What an append is about to do to a shard, written (and fsynced) before it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendRecord {
    pub old_len: u64,
    pub new_len: u64,
    /// CRC-32C of the bytes `old_len..new_len` the append writes.
    pub tail_crc: u32,
}

impl AppendRecord {
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        out[..16].copy_from_slice(&RECORD_MAGIC);
        out[16..24].copy_from_slice(&self.old_len.to_le_bytes());
        out[24..32].copy_from_slice(&self.new_len.to_le_bytes());
        out[32..CRC_AT].copy_from_slice(&self.tail_crc.to_le_bytes());
        let crc = crc32c::crc32c(&out[..CRC_AT]);
        out[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// `None` for anything but a whole, intact record: a torn or foreign file.
    pub fn decode(bytes: &[u8]) -> Option<AppendRecord> {
        let bytes: &[u8; RECORD_LEN] = bytes.try_into().ok()?;
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        let stored = u32::from_le_bytes(bytes[CRC_AT..].try_into().expect("4"));
        if bytes[..16] != RECORD_MAGIC || stored != crc32c::crc32c(&bytes[..CRC_AT]) {
            return None;
        }
        let rec = AppendRecord {
            old_len: word(16),
            new_len: word(24),
            tail_crc: u32::from_le_bytes(bytes[32..CRC_AT].try_into().expect("4")),
        };
        (rec.new_len > rec.old_len).then_some(rec)
    }
}

impl AppendRecord {
    /// What recovery makes of this (intact) record for a shard now `len` bytes long
    /// (`None`: missing): [`Recovery::Stale`], [`Recovery::Completed`] (length and the
    /// CRC of the tail match; `tail_crc(start, end)` computes the CRC-32C of the shard's
    /// bytes `start..end`, asked only then) or [`Recovery::RolledBack`]. Decides only:
    /// recovery acts on it, a read-only view reads around it ([`ReadOnlyRecords`]).
    pub fn fate(
        &self,
        len: Option<u64>,
        tail_crc: impl FnOnce(u64, u64) -> io::Result<u32>,
    ) -> io::Result<Recovery> {
        Ok(match len {
            Some(len) if len < self.old_len => Recovery::Stale {
                old_len: self.old_len,
                found_len: Some(len),
            },
            None => Recovery::Stale {
                old_len: self.old_len,
                found_len: None,
            },
            Some(len)
                if len == self.new_len
                    && tail_crc(self.old_len, self.new_len)? == self.tail_crc =>
            {
                Recovery::Completed { new_len: len }
            }
            Some(len) => Recovery::RolledBack {
                old_len: self.old_len,
                found_len: len,
            },
        })
    }
}

pub use crate::store::commit::Recovery;

pub(crate) fn io_at(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> CommitError {
    let path = path.into();
    move |source| CommitError::Io { path, source }
}

/// `name` + `suffix`.
pub(crate) fn sibling(name: &OsStr, suffix: &str) -> OsString {
    let mut s = name.to_os_string();
    s.push(suffix);
    s
}

/// Split a shard's store-relative path into its directory and file name; only plain
/// components are accepted (no `..`, no root), so nothing is written outside the store.
pub(crate) fn split_rel(rel: &Path) -> Result<(&Path, &OsStr), CommitError> {
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    match (plain, rel.parent(), rel.file_name()) {
        (true, Some(dir), Some(name)) => Ok((dir, name)),
        _ => Err(CommitError::BadPath(rel.to_path_buf())),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lock {
    Exclusive,
    Shared,
}

/// A directory of the store, opened beneath the store root (no symlink leads outside)
/// and `flock`ed for as long as this value lives. Every shard update holds the exclusive
/// lock of its shard's directory: that serializes updates across threads (each open has
/// its own lock) and processes, and survives the rename of a shard, which a lock on the
/// shard file itself would not. Closing the descriptor releases the lock.
pub(crate) struct ShardDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl ShardDir {
    /// Open and lock `root/rel_dir`; `Ok(None)` when it does not exist and `!create`.
    pub(crate) fn open(
        root: &Path,
        rel_dir: &Path,
        create: bool,
        lock: Lock,
    ) -> Result<Option<ShardDir>, CommitError> {
        let path = root.join(rel_dir);
        let io = |e: rustix::io::Errno| io_at(&path)(e.into());
        let root_fd = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_at(root)(e.into()))?;
        let beneath = |base: &OwnedFd, p: &Path| {
            let p = if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            };
            rustix::fs::openat2(
                base,
                p,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
            )
        };
        let fd = match beneath(&root_fd, rel_dir) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) if create => {
                let mut cur = beneath(&root_fd, Path::new("")).map_err(io)?;
                for c in rel_dir.components() {
                    match rustix::fs::mkdirat(&cur, c.as_os_str(), Mode::from_raw_mode(0o777)) {
                        // The new entry must survive a crash before a shard lands inside.
                        Ok(()) => rustix::fs::fsync(&cur).map_err(io)?,
                        Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(io(e)),
                    }
                    cur = beneath(&cur, Path::new(c.as_os_str())).map_err(io)?;
                }
                cur
            }
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        let op = match lock {
            Lock::Exclusive => FlockOperation::LockExclusive,
            Lock::Shared => FlockOperation::LockShared,
        };
        loop {
            match rustix::fs::flock(&fd, op) {
                Ok(()) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(io(e)),
            }
        }
        Ok(Some(ShardDir { fd, path }))
    }

    /// Path of `name` in this directory, for messages.
    pub(crate) fn path_of(&self, name: &OsStr) -> PathBuf {
        self.path.join(name)
    }

    /// Open `name` (never through a symlink); `Ok(None)` when absent and not created.
    pub(crate) fn open_file(
        &self,
        name: &OsStr,
        flags: OFlags,
        mode: u32,
    ) -> Result<Option<File>, CommitError> {
        // NONBLOCK: a FIFO at a shard's path must not block the opener (it changes
        // nothing for regular files).
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        match rustix::fs::openat(&self.fd, name, flags, Mode::from_raw_mode(mode)) {
            Ok(fd) => Ok(Some(File::from(fd))),
            Err(rustix::io::Errno::NOENT) if !flags.contains(OFlags::CREATE) => Ok(None),
            Err(e) => Err(io_at(self.path_of(name))(e.into())),
        }
    }

    /// Unlink `name`; `Ok(false)` when it was not there. Not durable until [`Self::sync`].
    pub(crate) fn remove(&self, name: &OsStr) -> Result<bool, CommitError> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(io_at(self.path_of(name))(e.into())),
        }
    }

    pub(crate) fn rename(&self, from: &OsStr, to: &OsStr) -> Result<(), CommitError> {
        rustix::fs::renameat(&self.fd, from, &self.fd, to)
            .map_err(|e| io_at(self.path_of(to))(e.into()))
    }

    /// Make the directory's entries (created, renamed, removed files) durable.
    pub(crate) fn sync(&self) -> Result<(), CommitError> {
        rustix::fs::fsync(&self.fd).map_err(|e| io_at(&self.path)(e.into()))
    }
}

/// Recover the shard at `root/rel`: resolve a leftover append record and remove a
/// leftover temp file. Takes the directory's exclusive lock, so it waits for an update
/// in progress (whose record is then gone). Idempotent; an empty list when nothing was
/// left over.
pub fn recover_shard(root: &Path, rel: &Path) -> Result<Vec<Recovery>, CommitError> {
    let (dir_rel, name) = split_rel(rel)?;
    match ShardDir::open(root, dir_rel, false, Lock::Exclusive)? {
        Some(dir) => recover_locked(&dir, name),
        None => Ok(Vec::new()),
    }
}

/// [`recover_shard`] with the lock of `dir` already held (by `apply`, `compact`, repair).
pub(crate) fn recover_locked(dir: &ShardDir, name: &OsStr) -> Result<Vec<Recovery>, CommitError> {
    let mut out = Vec::new();
    let rec_name = sibling(name, APPEND_SUFFIX);
    if let Some(rec_file) = dir.open_file(&rec_name, OFlags::RDONLY, 0)? {
        let mut bytes = Vec::with_capacity(RECORD_LEN + 1);
        rec_file
            .take(RECORD_LEN as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(io_at(dir.path_of(&rec_name)))?;
        let done = match AppendRecord::decode(&bytes) {
            None => Recovery::TornRecord,
            Some(rec) => settle(dir, name, rec)?,
        };
        // The shard is settled (and fsynced) before its record goes: a crash in between
        // repeats the same decision.
        dir.remove(&rec_name)?;
        dir.sync()?;
        out.push(done);
    }
    if dir.remove(&sibling(name, TEMP_SUFFIX))? {
        dir.sync()?;
        out.push(Recovery::RemovedTemp);
    }
    for r in &out {
        log::warn!("recovered shard {}: {r}", dir.path_of(name).display());
    }
    Ok(out)
}

/// Decide an append's fate from its intact record ([`AppendRecord::fate`]) and act on
/// it: a cut-short append is truncated back (and fsynced).
fn settle(dir: &ShardDir, name: &OsStr, rec: AppendRecord) -> Result<Recovery, CommitError> {
    let path = dir.path_of(name);
    let shard = dir.open_file(name, OFlags::RDWR, 0)?;
    let len = match &shard {
        Some(f) => Some(f.metadata().map_err(io_at(&path))?.len()),
        None => None,
    };
    let fate = rec
        .fate(len, |start, end| {
            let f = shard.as_ref().expect("a length");
            crc_of(|buf, at| f.read_exact_at(buf, at), start, end)
        })
        .map_err(io_at(&path))?;
    if let (Recovery::RolledBack { old_len, .. }, Some(f)) = (&fate, &shard) {
        f.set_len(*old_len).map_err(io_at(&path))?;
        f.sync_all().map_err(io_at(&path))?;
    }
    Ok(fate)
}

/// CRC-32C of the bytes `start..end` of a file, read in pieces of up to 1 MiB with
/// `read_exact_at`.
fn crc_of(
    read_exact_at: impl Fn(&mut [u8], u64) -> io::Result<()>,
    start: u64,
    end: u64,
) -> io::Result<u32> {
    let mut buf = vec![0u8; (end - start).min(1 << 20) as usize];
    let (mut crc, mut at) = (0u32, start);
    while at < end {
        let n = (end - at).min(buf.len() as u64) as usize;
        read_exact_at(&mut buf[..n], at)?;
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        at += n as u64;
    }
    Ok(crc)
}

/// Recovery of one shard at a time, just before a writable mount reads its index (the
/// [`LoadHook`] of the view's shard cache). One `fstatat` beneath the store root looks for
/// the shard's append record; only when there is one does [`recover_shard`] take the
/// directory's lock and settle it: an update in progress (this mount's flusher, another
/// process) is waited for and its record is then gone; a crashed one is rolled back or
/// completed, so the index read next is a complete one. A temp file of an unfinished
/// rewrite does not change what a read sees (the old shard is intact) and is left to the
/// background [`recover_store`].
pub struct LazyRecovery {
    root: PathBuf,
    root_fd: OwnedFd,
}

impl LazyRecovery {
    /// For the store at `root` (the directory an update's [`ShardDir`] is opened under).
    pub fn new(root: &Path) -> io::Result<LazyRecovery> {
        let root_fd = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(LazyRecovery {
            root: root.to_path_buf(),
            root_fd,
        })
    }

    /// Whether `<rel>.shardfs-append` may exist: `false` only when the `fstatat` says it
    /// does not; any other failure is left for [`recover_shard`] to report.
    pub fn has_record(&self, rel: &Path) -> bool {
        let record = sibling(rel.as_os_str(), APPEND_SUFFIX);
        !matches!(
            rustix::fs::statat(&self.root_fd, &record, AtFlags::SYMLINK_NOFOLLOW),
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR)
        )
    }

    /// Recover the shard at `rel` if it has an append record; the recoveries done.
    pub fn recover(&self, rel: &Path) -> Result<Vec<Recovery>, CommitError> {
        if !self.has_record(rel) {
            return Ok(Vec::new());
        }
        recover_shard(&self.root, rel)
    }
}

impl LoadHook for LazyRecovery {
    fn before_load(&self, rel: &Path) -> Result<Option<Truncated>, ShardError> {
        self.recover(rel).map(|_| None).map_err(|e| {
            log::error!(
                "shard {}: cannot recover an interrupted update, not reading it: {e}",
                self.root.join(rel).display()
            );
            ShardError::NotLoaded(format!("recovering an interrupted update: {e}"))
        })
    }
}

/// What a read-only view reads of a shard whose append was interrupted (the view's
/// [`LoadHook`] when it has no writer): the shard as it was before the append, which is
/// what recovery would roll it back to, without changing a byte of the store. Recovery is
/// left to a writable mount or `verify --repair`; until then each load of the shard logs
/// a warning. A shard without a record (one `stat`), with a torn or stale record, or whose
/// append had completed, reads as it is. The record is read under the shared lock of the
/// shard's directory, so an update in progress is waited for rather than read around.
pub struct ReadOnlyRecords {
    store: Arc<dyn Store>,
}

impl ReadOnlyRecords {
    pub fn new(store: Arc<dyn Store>) -> ReadOnlyRecords {
        ReadOnlyRecords { store }
    }

    fn check(&self, rel: &Path) -> io::Result<Option<Truncated>> {
        let record = PathBuf::from(sibling(rel.as_os_str(), APPEND_SUFFIX));
        if self.store.stat(&record)?.is_none() {
            return Ok(None);
        }
        let _shared = self.store.read_lock(rel.parent().unwrap_or(Path::new("")));
        let Some(rec_file) = self.store.open(&record)? else {
            return Ok(None); // settled meanwhile
        };
        let mut bytes = [0; RECORD_LEN + 1];
        let mut n = 0;
        while n < bytes.len() {
            match rec_file.read_at(&mut bytes[n..], n as u64)? {
                0 => break,
                k => n += k,
            }
        }
        let Some(rec) = AppendRecord::decode(&bytes[..n]) else {
            return Ok(None); // a torn record: the append had not touched the shard
        };
        let Some(shard) = self.store.open(rel)? else {
            return Ok(None);
        };
        let len = shard.meta()?.len;
        let fate = rec.fate(Some(len), |start, end| {
            crc_of(|buf, at| shard.read_exact_at(buf, at), start, end)
        })?;
        Ok(match fate {
            Recovery::RolledBack { old_len, found_len } => {
                log::warn!(
                    "shard {} of {}: an append was interrupted ({} bytes of {} written); this \
                     read-only mount shows the shard as it was before it; mount the store \
                     writable or run `shardfs verify --repair` to settle it",
                    rel.display(),
                    self.store.describe(),
                    found_len.saturating_sub(old_len),
                    rec.new_len - old_len,
                );
                Some(Truncated {
                    len: old_len,
                    file_len: found_len,
                })
            }
            _ => None,
        })
    }
}

impl LoadHook for ReadOnlyRecords {
    fn before_load(&self, rel: &Path) -> Result<Option<Truncated>, ShardError> {
        self.check(rel).map_err(|e| {
            log::error!(
                "shard {} of {}: cannot read its append record, not reading it: {e}",
                rel.display(),
                self.store.describe()
            );
            ShardError::NotLoaded(format!("reading an append record: {e}"))
        })
    }
}

/// Recover every shard of the store that has a leftover record or temp file. One walk
/// of the directory tree reading no file; a writable mount runs it in the background
/// once it is mounted. Each directory with leftovers is locked and re-checked, so a
/// concurrent update (of this process or another) is waited for, not undone.
pub fn recover_store(root: &Path) -> Result<Vec<(PathBuf, Recovery)>, CommitError> {
    let mut out = Vec::new();
    let (found, stale) = leftovers(root)?;
    for rel in stale {
        match std::fs::remove_file(root.join(&rel)) {
            Ok(()) => log::info!(
                "{}: a metadata write's temporary file a crash left, removed",
                rel.display()
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => log::warn!("{}: not removed: {e}", rel.display()),
        }
    }
    for (rel_dir, names) in found {
        let Some(dir) = ShardDir::open(root, &rel_dir, false, Lock::Exclusive)? else {
            continue;
        };
        for name in names.keys() {
            for r in recover_locked(&dir, name)? {
                out.push((rel_dir.join(name), r));
            }
        }
    }
    Ok(out)
}

/// Leftover records and temp files (store-relative paths) that are not part of an update
/// in progress (checked under each directory's shared lock). Changes nothing.
pub fn pending(root: &Path) -> Result<Vec<PathBuf>, CommitError> {
    let (found, mut out) = leftovers(root)?;
    for (rel_dir, names) in found {
        let Some(dir) = ShardDir::open(root, &rel_dir, false, Lock::Shared)? else {
            continue;
        };
        for files in names.values() {
            for f in files {
                if dir.open_file(f, OFlags::PATH, 0)?.is_some() {
                    out.push(rel_dir.join(f));
                }
            }
        }
    }
    Ok(out)
}

/// Shard names of one directory → the leftover files seen for them.
type Leftovers = BTreeMap<OsString, Vec<OsString>>;

/// Every directory under `root` (not following symlinks) holding leftovers, and the
/// temporary files of metadata writes ([`super::meta_temp_name`]) old enough to be a
/// crash's ([`super::STALE_META_TEMP`]).
type Found = (Vec<(PathBuf, Leftovers)>, Vec<PathBuf>);

fn leftovers(root: &Path) -> Result<Found, CommitError> {
    let fd = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_at(root)(e.into()))?;
    let mut out = (Vec::new(), Vec::new());
    walk(fd, PathBuf::new(), root, &mut out).map_err(io_at(root))?;
    Ok(out)
}

/// Whether `name` in `dir` is a metadata write's temporary file a crash left.
fn stale_meta_temp(dir: &rustix::fs::Dir, name: &OsStr) -> bool {
    if !name
        .as_bytes()
        .ends_with(super::META_TEMP_SUFFIX.as_bytes())
    {
        return false;
    }
    let Ok(fd) = dir.fd() else { return false };
    let Ok(st) = rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW) else {
        return false;
    };
    let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_secs(st.st_mtime.max(0) as u64);
    mtime
        .elapsed()
        .is_ok_and(|age| age >= super::STALE_META_TEMP)
}

fn walk(fd: OwnedFd, rel: PathBuf, root: &Path, out: &mut Found) -> io::Result<()> {
    let mut dir = rustix::fs::Dir::new(fd)?;
    let mut found = Leftovers::new();
    let mut subdirs = Vec::new();
    while let Some(entry) = dir.next() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let mut kind = entry.file_type();
        if kind == FileType::Unknown {
            kind = match rustix::fs::statat(dir.fd()?, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => FileType::from_raw_mode(st.st_mode),
                Err(_) => continue, // vanished meanwhile
            };
        }
        if kind == FileType::Directory {
            subdirs.push(name.to_os_string());
        } else if stale_meta_temp(&dir, name) {
            out.1.push(rel.join(name));
        } else if let Some(stem) = [APPEND_SUFFIX, TEMP_SUFFIX]
            .iter()
            .find_map(|s| name.as_bytes().strip_suffix(s.as_bytes()))
            .filter(|stem| !stem.is_empty())
        {
            found
                .entry(OsString::from_vec(stem.to_vec()))
                .or_default()
                .push(name.to_os_string());
        }
    }
    if !found.is_empty() {
        out.0.push((rel.clone(), found));
    }
    for sub in subdirs {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(dir.fd()?, sub.as_os_str(), flags, Mode::empty()) {
            Ok(fd) => walk(fd, rel.join(&sub), root, out)?,
            Err(e) => log::warn!(
                "recovery skips {}: {e}",
                root.join(&rel).join(&sub).display()
            ),
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "recover_tests.rs"]
mod tests;
