//! The view's errors: [`ViewError`], and the one place they become errno values
//! ([`ViewError::errno`]), as the application sees them.

use std::io;
use std::path::PathBuf;

use crate::store::shard::ShardError;

/// Errors of the view; [`ViewError::errno`] is the one place they become errno values.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("no such entry")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("read-only file system")]
    ReadOnly,
    #[error("unknown inode {0}")]
    StaleInode(u64),
    #[error("unknown file handle {0}")]
    StaleHandle(u64),
    /// A chunk read of inode `0` found it longer than the size the kernel holds for it
    /// (another writer replaced it since): served, the kernel would cut the new chunk to
    /// the old length (`ESTALE`; the kernel is told to drop its attributes).
    #[error("inode {0}: longer than the size the kernel holds")]
    SizeStale(u64),
    #[error("shard {shard}: {err}")]
    Shard { shard: PathBuf, err: ShardError },
    #[error("{0}")]
    Io(#[from] io::Error),
    /// A tree query met a directory the overlay is stale about: never an answer, the
    /// overlay reconciles itself and asks again (`Overlay::in_tree`, `reconcile.rs`).
    #[error("the overlay is stale: {0:?}")]
    Stale(Box<super::reconcile::Reconcile>),
    #[error("{0}")]
    Invalid(String),
    #[error("directory not empty")]
    NotEmpty,
    #[error("already exists")]
    Exists,
    /// A rename this view cannot make in one step (`EXDEV`: `mv` then copies and
    /// removes, file by file).
    #[error("{0}")]
    CrossDevice(String),
    #[error("write buffer full")]
    NoSpace,
    #[error("a file larger than the write buffer ({0} bytes, --write-buffer) cannot be staged")]
    TooBig(u64),
    #[error("flush failed: {0}")]
    Flush(#[from] crate::write::flush::FlushError),
    /// A blosc container (or one of its chunks) that cannot be read.
    #[error("{}: {why}", path.display())]
    Container { path: PathBuf, why: String },
}

impl ViewError {
    pub fn errno(&self) -> i32 {
        match self {
            ViewError::NotFound => libc::ENOENT,
            ViewError::NotDir => libc::ENOTDIR,
            ViewError::IsDir => libc::EISDIR,
            ViewError::ReadOnly => libc::EROFS,
            ViewError::StaleInode(_) | ViewError::StaleHandle(_) | ViewError::SizeStale(_) => {
                libc::ESTALE
            }
            // Read further into a chunk whose shard another writer replaced.
            ViewError::Shard {
                err: crate::store::shard::ShardError::Changed(_),
                ..
            } => libc::ESTALE,
            ViewError::Shard { .. } => libc::EIO,
            ViewError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            ViewError::Invalid(_) => libc::EINVAL,
            ViewError::NotEmpty => libc::ENOTEMPTY,
            ViewError::Exists => libc::EEXIST,
            ViewError::CrossDevice(_) => libc::EXDEV,
            ViewError::NoSpace => libc::ENOSPC,
            ViewError::TooBig(_) => libc::EFBIG,
            ViewError::Flush(e) => e.errno(),
            ViewError::Container { .. } => libc::EIO,
            ViewError::Stale(_) => libc::EIO,
        }
    }
}

pub type Result<T> = std::result::Result<T, ViewError>;
