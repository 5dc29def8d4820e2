//! [`Capabilities`]: what a store is, in the few ways its callers do things differently
//! for it, said once by the store ([`super::Store::capabilities`]) and held by the
//! caller (the view, the mount's writer setup), rather than asked again call by call.

use super::local::AppendRecords;

/// What a store is: how its reads, its shard commits and its directory renames work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    pub reads: Reads,
    pub commits: Commits,
    pub dir_renames: DirRenames,
}

/// What a read of a store file costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reads {
    /// A system call or a copy from memory (a local directory, the in-memory store).
    Local,
    /// A request to a server (object storage): worth avoiding reads of an index only to
    /// answer a lookup, and worth loading what comes next ahead.
    Requests,
}

/// How a shard commit ([`super::Store::commit_shard`]) changes a shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Commits {
    /// What changed is appended to the shard in place, under the shard directory's lock
    /// (a local directory, see `store::local::append`): flushing an array in several
    /// parts, behind its writer, costs no more bytes than flushing it once. An append
    /// cut short leaves a record beside the shard, which [`AppendRecords`] settles
    /// (writable) or reads around (read-only) before a shard's index is read; readers
    /// take the lock's shared side ([`super::Store::read_lock`]) to read between updates.
    Append(AppendRecords),
    /// The whole shard is written again, in one step that cannot be cut halfway (object
    /// storage's PUT, the in-memory store): each flush of a shard writes all of it.
    Whole,
}

/// Whether a store renames a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirRenames {
    /// [`super::Store::rename`] renames a directory and everything in it, in one step
    /// that readers see whole (a local directory: `rename(2)`).
    OneStep,
    /// Not at all: a rename of a directory is refused with `EXDEV` before it reaches the
    /// store (object storage: a directory is a prefix of many objects).
    Refused,
}
