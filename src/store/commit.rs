//! What a shard commit is, for every store: the shard as the commit found it
//! ([`ShardSnapshot`]), the slot changes the caller's merge decided on ([`SlotChange`]),
//! what was done ([`CommitOutcome`]) and why it failed ([`CommitError`]).
//!
//! A commit reads the shard's current state, asks the caller's merge function which
//! changes stand (`write::merge`: last close wins), and makes exactly those durable as
//! one atomic step, only if the shard did not change meanwhile: a local directory holds
//! the shard directory's lock across the three steps; an object store would re-read and
//! merge again when its conditional PUT finds another version.

use std::fmt;
use std::io;
use std::path::PathBuf;

use serde::Serialize;

use super::{EntryMeta, StoreFile};
use crate::format::{CloseTimes, IndexError, ShardIndex};

/// A shard as a commit found it.
#[derive(Clone, Copy, Debug)]
pub struct ShardSnapshot<'s> {
    pub index: &'s ShardIndex,
    /// Close times recorded in the shard (`0`: none).
    pub times: &'s CloseTimes,
    pub exists: bool,
}

/// One slot change to commit: new bytes, or deletion (`None`), closed at `closed`
/// (nanoseconds since the epoch; `0`: no close time, as for maintenance rewrites).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotChange<'a> {
    pub slot: usize,
    pub data: Option<&'a [u8]>,
    pub closed: u64,
}

/// Decides, from the shard as found, which changes a commit makes.
pub type Merge<'m, 'a> = dyn FnMut(&ShardSnapshot<'_>) -> Vec<SlotChange<'a>> + 'm;

/// What a shard commit did.
#[derive(Debug)]
pub struct CommitOutcome {
    /// The index now stored (all empty when the shard was removed).
    pub index: ShardIndex,
    /// The shard as the commit left it, where the store learned that surely with the
    /// commit: the committing mount caches it with `index` rather than reading the index
    /// again. `None` where it did not (the caller then drops what it cached): a commit
    /// that changed nothing, and object storage (see `store::object::write`).
    pub stored: Option<StoredShard>,
    pub old_len: u64,
    pub new_len: u64,
    /// Bytes written to the shard (appended, or the whole rewritten shard).
    pub bytes_written: u64,
    /// No shard exists any more: it holds no chunk.
    pub removed: bool,
    /// The shard was written whole (new shard, index at start, object store).
    pub rewritten: bool,
    /// Slot changes the merge decided on (the rest of the caller's were superseded).
    pub applied: usize,
    /// What recovery of an earlier, interrupted commit of this shard did first.
    pub recovered: Vec<Recovery>,
}

/// A shard as a commit left it: its file open for reading at the version the commit
/// wrote, and that version's metadata, whose [`EntryMeta::version`] a shard cache
/// compares with the store's to tell what it holds fresh. Learned under the commit's
/// lock (a local directory's) or from the bytes written (the in-memory store), never by
/// a look afterwards, which could find another writer's version.
pub struct StoredShard {
    /// `None`: the commit removed the shard.
    pub file: Option<Box<dyn StoreFile>>,
    pub meta: Option<EntryMeta>,
}

impl StoredShard {
    /// No shard: the commit removed it.
    pub fn removed() -> Self {
        StoredShard {
            file: None,
            meta: None,
        }
    }
}

impl fmt::Debug for StoredShard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredShard")
            .field("file", &self.file.is_some())
            .field("meta", &self.meta)
            .finish()
    }
}

/// Why a shard commit (or a maintenance command) failed. A failed commit leaves the
/// shard as it was.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// The shard's current index does not read; shardfs does not build on it.
    #[error("{}: refusing to change a shard whose index is corrupt: {err}", path.display())]
    Corrupt { path: PathBuf, err: IndexError },
    /// The shard's path is not a regular file (a directory, a FIFO, ...).
    #[error("{}: not a regular file", .0.display())]
    NotAFile(PathBuf),
    #[error("invalid chunk update: {0}")]
    BadUpdate(String),
    #[error("{}: not a relative path of plain components", .0.display())]
    BadPath(PathBuf),
}

impl CommitError {
    /// The errno a file system call failing with this error reports.
    pub fn errno(&self) -> i32 {
        match self {
            CommitError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            CommitError::Corrupt { .. } | CommitError::NotAFile(_) => libc::EIO,
            CommitError::BadUpdate(_) | CommitError::BadPath(_) => libc::EINVAL,
        }
    }
}

/// What recovery did for one shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Recovery {
    /// The record was torn, so the append had not touched the shard: record removed.
    TornRecord,
    /// The append had finished (length and CRC match): only the record was left; removed.
    Completed { new_len: u64 },
    /// The append was cut short: the shard was truncated back to `old_len`.
    RolledBack { old_len: u64, found_len: u64 },
    /// The shard is missing or shorter than the record's `old_len`: something other than
    /// shardfs changed it. The shard is left alone; the record is removed.
    Stale {
        old_len: u64,
        found_len: Option<u64>,
    },
    /// A rewrite never reached its rename; the old shard is intact. Temp file removed.
    RemovedTemp,
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Recovery::TornRecord => write!(f, "removed a torn append record (shard untouched)"),
            Recovery::Completed { new_len } => {
                write!(
                    f,
                    "append had completed ({new_len} bytes); removed its record"
                )
            }
            Recovery::RolledBack { old_len, found_len } => write!(
                f,
                "rolled back an interrupted append: truncated {found_len} to {old_len} bytes"
            ),
            Recovery::Stale { old_len, found_len } => write!(
                f,
                "removed a stale append record (shard is {}, record expected at least {old_len} \
                 bytes); shard left alone",
                found_len.map_or("missing".into(), |l| format!("{l} bytes"))
            ),
            Recovery::RemovedTemp => {
                write!(f, "removed the temporary file of an unfinished rewrite")
            }
        }
    }
}
