//! What a mount opens, checked before it mounts: the store its argument names (a local
//! directory or an object storage prefix: [`StoreName`], decided once), opened
//! ([`open_store`]), the mount point checked, and why a mount failed ([`MountError`]).
//! Not the mount itself ([`crate::mount`]) nor the mount point's daemon
//! ([`crate::mountpoint`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::mountpoint::is_mount_point;
use crate::store::{LocalStore, Store};

/// Why a mount failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// `why` is said in words of its own (not an error chain): the cause, said once.
    #[error("cannot open store {path}: {why}")]
    Store { path: PathBuf, why: String },
    #[error("mount point {path}: {why}")]
    MountPoint { path: PathBuf, why: String },
    #[error("cannot mount at {path}: {source}")]
    Fuse { path: PathBuf, source: io::Error },
    #[error("--compactor gpu: {0}")]
    NoGpu(String),
    #[error("cannot open store {0}")]
    ObjectStore(String),
}

/// What a store argument names, decided once from its text (every later choice between
/// the two kinds matches on this): a local directory, or an object storage prefix
/// (`s3://BUCKET/PREFIX`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreName<'a> {
    Local(&'a Path),
    Bucket(&'a str),
}

impl<'a> StoreName<'a> {
    pub fn of(store: &'a Path) -> Self {
        match store.to_str().filter(|s| s.starts_with("s3://")) {
            Some(url) => StoreName::Bucket(url),
            None => StoreName::Local(store),
        }
    }

    /// The object storage URL, where it is one.
    pub fn url(self) -> Option<&'a str> {
        match self {
            StoreName::Bucket(url) => Some(url),
            StoreName::Local(_) => None,
        }
    }

    /// The directory, where it is a local store.
    pub fn local(self) -> Option<&'a Path> {
        match self {
            StoreName::Local(dir) => Some(dir),
            StoreName::Bucket(_) => None,
        }
    }
}

/// The store `name` names: a local directory, or object storage (`s3://`) as `s3` says.
pub fn open_store(
    name: StoreName,
    s3: &crate::store::object::S3Options,
) -> Result<Arc<dyn Store>, MountError> {
    let store = match name {
        StoreName::Bucket(url) => {
            let s = crate::store::BucketStore::open_url(url, s3)
                .map_err(|e| MountError::ObjectStore(e.to_string()))?;
            return Ok(Arc::new(s));
        }
        StoreName::Local(dir) => dir,
    };
    if let Some((dir, _)) = &s3.cache {
        return Err(MountError::Store {
            path: store.to_path_buf(),
            why: format!(
                "--cache {} is for object storage (s3://): a local store is read directly",
                dir.display()
            ),
        });
    }
    let local = LocalStore::open(store).map_err(|e| MountError::Store {
        path: store.to_path_buf(),
        why: local_open_error(store, &e),
    })?;
    Ok(Arc::new(local))
}

/// Why a local store could not be opened, in words for whoever typed its name: once (the
/// error's own text names the path again), and for a name that looks like a URL, which
/// URLs are stores.
fn local_open_error(store: &Path, e: &io::Error) -> String {
    let name = store.to_string_lossy();
    if name.contains("://") || name.starts_with("s3:") {
        return "not a directory, and not an object storage URL: shardfs mounts a local \
                directory or s3://BUCKET/PREFIX"
            .into();
    }
    match e.kind() {
        io::ErrorKind::NotFound => "no such directory".into(),
        io::ErrorKind::NotADirectory => {
            "not a directory (a store is a directory with a zarr.json, or s3://BUCKET/PREFIX)"
                .into()
        }
        io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// Refuse a mount point that would hang or hide things: inside the store (the daemon
/// would serve its own mount: the first `ls` deadlocks in the kernel), the store inside
/// the mount point, a directory that is already a mount point (a second mount stacks on
/// it), and a non-empty directory (its files would be hidden) unless `nonempty`.
pub(crate) fn check_mountpoint(
    store: StoreName,
    mountpoint: &Path,
    nonempty: bool,
) -> Result<(), MountError> {
    let refuse = |why: String| MountError::MountPoint {
        path: mountpoint.to_path_buf(),
        why,
    };
    let meta = std::fs::metadata(mountpoint).map_err(|e| {
        refuse(match e.kind() {
            io::ErrorKind::NotFound => "no such directory (make it first: mkdir)".into(),
            _ => e.to_string(),
        })
    })?;
    if !meta.is_dir() {
        return Err(refuse("not a directory".into()));
    }
    let canon = |p: &Path| std::fs::canonicalize(p).map_err(|e| refuse(e.to_string()));
    let m = canon(mountpoint)?;
    // Object storage can neither contain the mount point nor lie inside it.
    if let Some(store) = store.local() {
        let s = canon(store)?;
        if m.starts_with(&s) {
            return Err(refuse(format!(
                "it lies inside the store {}; mount elsewhere",
                s.display()
            )));
        }
        if s.starts_with(&m) {
            return Err(refuse(format!(
                "the store {} lies inside it; mount elsewhere",
                s.display()
            )));
        }
    }
    if is_mount_point(&m) {
        return Err(refuse(
            "already a mount point; unmount it first (shardfs unmount, umount)".into(),
        ));
    }
    let has_entries = std::fs::read_dir(&m)
        .map_err(|e| refuse(e.to_string()))?
        .next()
        .is_some();
    if has_entries && !nonempty {
        return Err(refuse(
            "not empty: its files would be hidden while mounted (-o nonempty allows it)".into(),
        ));
    }
    Ok(())
}

/// Why `store` does not look like a Zarr store (files, but no `zarr.json`, `.zgroup` or
/// `.zarray` at its top or one level down, nor a bcolz rootdir's `meta/storage` or
/// `__rootdirs__`, nor a `*.blp` file), for a warning at mount; `None` if it does or is
/// empty (a new store).
pub fn not_zarr_warning(store: &Path) -> Option<String> {
    const META: [&str; 5] = [
        "zarr.json",
        ".zgroup",
        ".zarray",
        "meta/storage",
        "__rootdirs__",
    ];
    let has_meta = |dir: &Path| META.iter().any(|m| dir.join(m).exists());
    if has_meta(store) {
        return None;
    }
    let entries: Vec<_> = std::fs::read_dir(store).ok()?.flatten().collect();
    let blp = |e: &std::fs::DirEntry| e.file_name().to_string_lossy().ends_with(".blp");
    if entries.is_empty() || entries.iter().any(|e| has_meta(&e.path()) || blp(e)) {
        return None;
    }
    Some(format!(
        "{} holds no zarr.json (nor v2 metadata) at its top or one level down: is it a Zarr store? \
         Its files pass through unchanged",
        store.display()
    ))
}
