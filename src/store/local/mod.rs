//! [`LocalStore`]: a store in a local directory, every path resolved beneath its root.
//! Shard commits are appends (or whole rewrites) under the shard directory's `flock`
//! ([`append`]), with recovery of interrupted ones ([`recover`]).

pub mod append;
pub mod recover;

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags, Stat};

use super::shard::LoadHook;
use super::{
    Capabilities, Commits, DirRenames, EntryKind, EntryMeta, ListEntry, Reads, SpaceInfo, Store,
    StoreFile,
};

/// A store rooted at a local directory.
#[derive(Debug)]
pub struct LocalStore {
    root: OwnedFd,
    path: PathBuf,
}

impl LocalStore {
    /// Open the directory `path` as a store.
    pub fn open(path: &Path) -> io::Result<LocalStore> {
        let root = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            io::Error::new(
                io::Error::from(e).kind(),
                format!("{}: {e}", path.display()),
            )
        })?;
        Ok(LocalStore {
            root,
            // As `shardfs stats` and messages name it: absolute, as given otherwise.
            path: std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Open `rel` beneath the root. Symlinks inside the store that stay inside resolve;
    /// anything escaping fails with `EXDEV`; magic links never resolve.
    fn open_beneath(&self, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        let rel: &Path = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        rustix::fs::openat2(
            self.root.as_fd(),
            rel,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(io::Error::from)
    }
}

/// The records an append cut short leaves beside its shard in the local store at `root`
/// ([`append`]): what a view settles or reads around before it reads a shard's index (a
/// [`LocalStore`]'s [`Commits::Append`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRecords {
    root: PathBuf,
}

impl AppendRecords {
    /// The hook the view's shard cache runs before it reads a shard's index. A writable
    /// view recovers an interrupted update first ([`recover::LazyRecovery`], straight on
    /// the directory at `root`). A read-only view changes nothing: it reads the shard as
    /// it was before the update ([`recover::ReadOnlyRecords`]), its records read through
    /// `store`, the store the view reads (so that a wrapper's faults reach them too).
    pub fn load_hook(
        &self,
        writable: bool,
        store: Arc<dyn Store>,
    ) -> io::Result<Arc<dyn LoadHook>> {
        Ok(if writable {
            Arc::new(recover::LazyRecovery::new(&self.root)?)
        } else {
            Arc::new(recover::ReadOnlyRecords::new(store))
        })
    }
}

/// The shared side of a store directory's `flock` ([`Store::read_lock`]), held until
/// this drops.
#[derive(Debug)]
pub struct ReadLock {
    _dir: OwnedFd,
}

fn is_absent(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    let d = Duration::new(sec.unsigned_abs(), nsec.clamp(0, 999_999_999) as u32);
    if sec >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH - d
    }
}

fn meta_of(st: &Stat) -> EntryMeta {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    EntryMeta {
        kind,
        len: st.st_size as u64,
        mtime: time(st.st_mtime, st.st_mtime_nsec as i64),
        ctime: time(st.st_ctime, st.st_ctime_nsec as i64),
        perm: (st.st_mode & 0o7777) as u16,
        uid: st.st_uid,
        gid: st.st_gid,
        ino: st.st_ino,
        content_id: false,
    }
}

struct LocalFile(File);

/// Suffix of the temporary file of [`Store::write_atomically`] (see [`meta_temp_name`]).
pub const META_TEMP_SUFFIX: &str = ".shardfs-new";

/// A name for one [`Store::write_atomically`]'s temporary file, unique to that call: the
/// process (a random tag, the pid), a counter and the time; short whatever the target's
/// name is. Before, every write of a name staged through `.<name>.shardfs-new`: two
/// mounts of one store writing the same `zarr.json` at once wrote one file together,
/// which left the store's document torn (the short one with the long one's tail) and
/// failed renames with `ENOENT`; and a name of over 242 bytes could not be staged at
/// all (`ENAMETOOLONG`), so a file of its own with such a name, accepted at its close,
/// could never be stored (found by an adversarial tester). A temporary file a crash left
/// is removed by the recovery walk once it is an hour old ([`STALE_META_TEMP`]).
pub fn meta_temp_name() -> std::ffi::OsString {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static TAG: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let tag = TAG.get_or_init(|| {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        ".{tag:016x}-{:x}-{n:x}-{nanos:x}{META_TEMP_SUFFIX}",
        std::process::id()
    )
    .into()
}

/// How old a temporary file of [`Store::write_atomically`] must be for the recovery walk
/// to take it for one a crash left (a write takes milliseconds).
pub const STALE_META_TEMP: Duration = Duration::from_secs(3600);

impl super::StoreFileRw for LocalFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(&self.0, buf, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync(&self) -> io::Result<()> {
        self.0.sync_all()
    }
}

/// `rel`'s parent directory (opened beneath the root) and its last component.
fn split(rel: &Path) -> io::Result<(&Path, &OsStr)> {
    let name = rel
        .file_name()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok((rel.parent().unwrap_or(Path::new("")), name))
}

impl StoreFile for LocalFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }

    fn meta(&self) -> io::Result<EntryMeta> {
        Ok(meta_of(&rustix::fs::fstat(&self.0)?))
    }
}

/// A shard file a commit opened again under its directory's lock, as a load would have
/// opened it: read through [`LocalFile`], its metadata from `fstat`.
pub(crate) fn stored_shard(file: File) -> io::Result<super::StoredShard> {
    let meta = meta_of(&rustix::fs::fstat(&file)?);
    if meta.kind != EntryKind::File {
        return Err(io::Error::other("not a regular file"));
    }
    Ok(super::StoredShard {
        file: Some(Box::new(LocalFile(file))),
        meta: Some(meta),
    })
}

/// A file the caller opened itself, read as a store file (the write side and `verify`
/// read shard indices through it with [`crate::format::shard_read::read_index`]).
pub(crate) struct FileRef<'a>(pub &'a File);

impl StoreFile for FileRef<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }

    fn meta(&self) -> io::Result<EntryMeta> {
        Ok(meta_of(&rustix::fs::fstat(self.0)?))
    }
}

impl Store for LocalStore {
    fn stat(&self, rel: &Path) -> io::Result<Option<EntryMeta>> {
        match self.open_beneath(rel, OFlags::PATH | OFlags::NOFOLLOW) {
            Ok(fd) => Ok(Some(meta_of(&rustix::fs::fstat(&fd)?))),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn list(&self, rel: &Path) -> io::Result<Vec<ListEntry>> {
        let fd = self.open_beneath(rel, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let dir = rustix::fs::Dir::read_from(&fd)?;
        let mut out = Vec::new();
        for entry in dir {
            let entry = entry?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            let kind = match entry.file_type() {
                FileType::RegularFile => EntryKind::File,
                FileType::Directory => EntryKind::Dir,
                FileType::Symlink => EntryKind::Symlink,
                FileType::Unknown => {
                    match rustix::fs::statat(&fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(st) => meta_of(&st).kind,
                        Err(_) => continue, // vanished meanwhile
                    }
                }
                _ => EntryKind::Other,
            };
            out.push(ListEntry {
                name: name.to_os_string(),
                kind,
            });
        }
        Ok(out)
    }

    fn open(&self, rel: &Path) -> io::Result<Option<Box<dyn StoreFile>>> {
        // NONBLOCK: opening a FIFO must not block (no effect on regular files).
        match self.open_beneath(rel, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK) {
            Ok(fd) => {
                let f = File::from(fd);
                if !f.metadata()?.is_file() {
                    return Err(io::Error::other(
                        "not a regular file (a directory, FIFO, socket or device)",
                    ));
                }
                Ok(Some(Box::new(LocalFile(f))))
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(io::Error::other(
                "a symbolic link, not a regular file (never followed)",
            )),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        let parent = rel.parent().unwrap_or(Path::new(""));
        let name = rel.file_name().ok_or(io::ErrorKind::InvalidInput)?;
        let dir = self.open_beneath(parent, OFlags::PATH | OFlags::DIRECTORY)?;
        let target = rustix::fs::readlinkat(&dir, name, Vec::new())?;
        Ok(PathBuf::from(OsStr::from_bytes(target.as_bytes())))
    }

    fn space(&self) -> io::Result<SpaceInfo> {
        let st = rustix::fs::fstatvfs(&self.root)?;
        Ok(SpaceInfo {
            blocks: st.f_blocks,
            bfree: st.f_bfree,
            bavail: st.f_bavail,
            files: st.f_files,
            ffree: st.f_ffree,
            bsize: st.f_bsize as u32,
            namelen: st.f_namemax as u32,
        })
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reads: Reads::Local,
            commits: Commits::Append(AppendRecords {
                root: self.path.clone(),
            }),
            dir_renames: DirRenames::OneStep,
        }
    }

    fn commit_shard(
        &self,
        rel: &Path,
        level: &crate::format::ShardLevel,
        merge: &mut super::Merge<'_, '_>,
    ) -> Result<super::CommitOutcome, super::CommitError> {
        append::commit(&self.path, rel, level, merge)
    }

    fn open_rw(
        &self,
        rel: &Path,
        mode: super::OpenMode,
        truncate: bool,
    ) -> io::Result<Box<dyn super::StoreFileRw>> {
        let (parent, name) = split(rel)?;
        let dir = self.open_beneath(parent, OFlags::PATH | OFlags::DIRECTORY)?;
        let mut flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        flags |= match mode {
            super::OpenMode::Existing => OFlags::empty(),
            super::OpenMode::Create => OFlags::CREATE,
            super::OpenMode::CreateNew => OFlags::CREATE | OFlags::EXCL,
        };
        if truncate {
            flags |= OFlags::TRUNC;
        }
        let fd = rustix::fs::openat(&dir, name, flags, Mode::from_raw_mode(0o666))?;
        let f = File::from(fd);
        if !f.metadata()?.is_file() {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        Ok(Box::new(LocalFile(f)))
    }

    fn write_atomically(&self, rel: &Path, data: &[u8]) -> io::Result<()> {
        let (parent, name) = split(rel)?;
        let dir = self.open_beneath(parent, OFlags::RDONLY | OFlags::DIRECTORY)?;
        // Not `<name>.shardfs-tmp`: that is a shard rewrite's temporary file, which
        // recovery (the background walk of every writable mount) removes on sight.
        let tmp = meta_temp_name();
        let written = (|| {
            let fd = rustix::fs::openat(
                &dir,
                &tmp,
                OFlags::WRONLY
                    | OFlags::CREATE
                    | OFlags::TRUNC
                    | OFlags::NOFOLLOW
                    | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o666),
            )?;
            let f = File::from(fd);
            FileExt::write_all_at(&f, data, 0)?;
            f.sync_all()?;
            rustix::fs::renameat(&dir, &tmp, &dir, name)?;
            rustix::fs::fsync(&dir)?;
            Ok(())
        })();
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&dir, &tmp, rustix::fs::AtFlags::empty());
        }
        written
    }

    fn create_dir(&self, rel: &Path) -> io::Result<()> {
        let (parent, name) = split(rel)?;
        let dir = self.open_beneath(parent, OFlags::PATH | OFlags::DIRECTORY)?;
        Ok(rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o777))?)
    }

    fn remove_file(&self, rel: &Path) -> io::Result<()> {
        let (parent, name) = split(rel)?;
        let dir = self.open_beneath(parent, OFlags::PATH | OFlags::DIRECTORY)?;
        Ok(rustix::fs::unlinkat(
            &dir,
            name,
            rustix::fs::AtFlags::empty(),
        )?)
    }

    fn remove_dir(&self, rel: &Path) -> io::Result<()> {
        let (parent, name) = split(rel)?;
        let dir = self.open_beneath(parent, OFlags::PATH | OFlags::DIRECTORY)?;
        Ok(rustix::fs::unlinkat(
            &dir,
            name,
            rustix::fs::AtFlags::REMOVEDIR,
        )?)
    }

    /// `rename(2)`: atomic, of a directory too, and POSIX's rules for what may stand at
    /// `to` (nothing, or an empty directory).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (fp, fname) = split(from)?;
        let (tp, tname) = split(to)?;
        let fdir = self.open_beneath(fp, OFlags::PATH | OFlags::DIRECTORY)?;
        let tdir = self.open_beneath(tp, OFlags::PATH | OFlags::DIRECTORY)?;
        Ok(rustix::fs::renameat(&fdir, fname, &tdir, tname)?)
    }

    fn set_mode_owner(
        &self,
        rel: &Path,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> io::Result<()> {
        // Opened, never followed (a symbolic link gives ELOOP), and changed through the
        // descriptor: nothing outside the store is reached.
        let fd = self.open_beneath(rel, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK)?;
        if uid.is_some() || gid.is_some() {
            rustix::fs::fchown(
                &fd,
                uid.map(rustix::fs::Uid::from_raw),
                gid.map(rustix::fs::Gid::from_raw),
            )?;
        }
        if let Some(mode) = mode {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o7777))?;
        }
        Ok(())
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (fp, fname) = split(from)?;
        let (tp, tname) = split(to)?;
        let fdir = self.open_beneath(fp, OFlags::PATH | OFlags::DIRECTORY)?;
        let tdir = self.open_beneath(tp, OFlags::PATH | OFlags::DIRECTORY)?;
        Ok(rustix::fs::linkat(
            &fdir,
            fname,
            &tdir,
            tname,
            rustix::fs::AtFlags::empty(),
        )?)
    }

    fn sync_file(&self, rel: &Path) -> io::Result<()> {
        let fd = self.open_beneath(rel, OFlags::RDONLY | OFlags::NOFOLLOW)?;
        Ok(rustix::fs::fsync(&fd)?)
    }

    fn read_lock(&self, dir: &Path) -> Option<ReadLock> {
        let fd = self
            .open_beneath(dir, OFlags::RDONLY | OFlags::DIRECTORY)
            .ok()?;
        rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockShared).ok()?;
        Some(ReadLock { _dir: fd })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn metadata_writes_survive_a_concurrent_recovery_walk() {
        // The walk removes shard-rewrite leftovers; a metadata write's temporary file
        // once had that suffix, and a walk racing it made the write fail with ENOENT.
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("a")).unwrap();
        let store = LocalStore::open(root.path()).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    recover::recover_store(root.path()).unwrap();
                }
            });
            for i in 0..300 {
                store
                    .write_atomically(Path::new("a/zarr.json"), format!("{i}").as_bytes())
                    .unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        assert_eq!(
            std::fs::read(root.path().join("a/zarr.json")).unwrap(),
            b"299"
        );
    }

    #[test]
    fn concurrent_metadata_writes_of_one_name_each_land_whole() {
        // Two writers of one name (two mounts of one store storing the same
        // `zarr.json`): each write succeeds and the name holds one of them, whole.
        // Before, both staged through `.zarr.json.shardfs-new`: renames failed with
        // ENOENT and the document was left torn.
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("a")).unwrap();
        let stores = [
            LocalStore::open(root.path()).unwrap(),
            LocalStore::open(root.path()).unwrap(),
        ];
        let docs = [vec![b'x'; 4000], vec![b'y'; 10]];
        let (root_path, docs_ref) = (root.path(), &docs);
        std::thread::scope(|s| {
            for (store, doc) in stores.iter().zip(docs_ref) {
                s.spawn(move || {
                    for _ in 0..300 {
                        store
                            .write_atomically(Path::new("a/zarr.json"), doc)
                            .unwrap();
                        let now = std::fs::read(root_path.join("a/zarr.json")).unwrap();
                        assert!(docs_ref.contains(&now), "torn: {} bytes", now.len());
                    }
                });
            }
        });
        let left: Vec<_> = std::fs::read_dir(root.path().join("a"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["zarr.json"], "no temporary file left");
    }

    #[test]
    fn a_name_of_255_bytes_is_written_atomically() {
        let root = tempfile::tempdir().unwrap();
        let store = LocalStore::open(root.path()).unwrap();
        let name = "n".repeat(255);
        store.write_atomically(Path::new(&name), b"long").unwrap();
        assert_eq!(std::fs::read(root.path().join(&name)).unwrap(), b"long");
    }

    #[test]
    fn never_resolves_outside_the_root() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"x").unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::write(root.path().join("d/f"), b"hello").unwrap();
        symlink(outside.path(), root.path().join("escape")).unwrap();
        symlink("d/f", root.path().join("inside")).unwrap();
        let store = LocalStore::open(root.path()).unwrap();

        assert!(store.open(Path::new("escape/secret")).is_err());
        assert!(store.stat(Path::new("escape/secret")).is_err());
        assert!(store.list(Path::new("escape")).is_err());
        assert!(store.open(Path::new("../secret")).is_err());
        // A final symlink is reported, never followed.
        assert_eq!(
            store.stat(Path::new("inside")).unwrap().unwrap().kind,
            EntryKind::Symlink
        );
        assert!(store.open(Path::new("inside")).is_err());
        assert_eq!(
            store.read_link(Path::new("inside")).unwrap(),
            Path::new("d/f")
        );
        // Ordinary access works.
        let f = store.open(Path::new("d/f")).unwrap().unwrap();
        let mut buf = [0u8; 3];
        f.read_exact_at(&mut buf, 1).unwrap();
        assert_eq!(&buf, b"ell");
        assert!(store.stat(Path::new("nope")).unwrap().is_none());
        assert!(store.open(Path::new("nope/deeper")).unwrap().is_none());
        let mut names: Vec<_> = store
            .list(Path::new(""))
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        names.sort();
        assert_eq!(names, ["d", "escape", "inside"]);
    }
}
