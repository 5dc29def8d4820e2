//! Shards written whole: a commit worked out on a shard's bytes as they are, and the new
//! shard made densely (every stored chunk in slot order, no dead space, its close times
//! kept) by the write half of the shard codec ([`crate::format::shard_write`]). Object storage commits this way (one PUT of the whole shard), and so does the
//! in-memory test store; `compact` of an object store makes a shard dense with it.
//!
//! The shard's bytes are parsed where they lie, by the read half of the shard codec
//! ([`crate::format::shard_read`]): once, never copied to be parsed. [`BytesFile`] shows
//! bytes in memory as a store file (the in-memory store's files).

use std::io;
use std::path::Path;
use std::time::SystemTime;

use super::commit::{CommitError, CommitOutcome, Merge, ShardSnapshot};
use super::{EntryKind, EntryMeta, StoreFile};
use crate::format::shard_read::{self, ReadError};
use crate::format::shard_write::dense_shard_by_slot;
use crate::format::{CloseTimes, ShardIndex, ShardLevel};

/// Bytes in memory read as a store file (a shard fetched whole).
pub(crate) struct BytesFile<'a>(pub &'a [u8]);

impl StoreFile for BytesFile<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.0.len());
        let n = buf.len().min(self.0.len() - start);
        buf[..n].copy_from_slice(&self.0[start..start + n]);
        Ok(n)
    }

    fn meta(&self) -> io::Result<EntryMeta> {
        Ok(bytes_meta(self.0.len() as u64))
    }
}

/// What `stat` says of `len` bytes in memory: a file, of no time, owner or inode.
pub(crate) fn bytes_meta(len: u64) -> EntryMeta {
    EntryMeta {
        kind: EntryKind::File,
        len,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        perm: 0o644,
        uid: 0,
        gid: 0,
        ino: 0,
        content_id: false,
    }
}

/// A shard commit worked out on the shard's bytes as they are (`None`: no shard): the
/// new shard written whole and densely.
pub(crate) struct Rewrite {
    /// What the commit does; `removed` when no chunk is left.
    pub outcome: CommitOutcome,
    /// The new shard (empty when removed); `None` when nothing changes.
    pub bytes: Option<Vec<u8>>,
    /// The close times after the commit, per slot.
    pub times: CloseTimes,
}

/// The index and close times of shard `data`.
fn parse(
    rel: &Path,
    level: &ShardLevel,
    data: &[u8],
) -> Result<(ShardIndex, CloseTimes), CommitError> {
    shard_read::read_index_and_times(data, level, data.len() as u64).map_err(|e| match e {
        ReadError::Io(source) => CommitError::Io {
            path: rel.to_path_buf(),
            source,
        },
        ReadError::Index(err) => CommitError::Corrupt {
            path: rel.to_path_buf(),
            err,
        },
    })
}

/// The shard `data` without dead space: every stored chunk's bytes in slot order, the
/// same index codecs and location, its close times kept.
pub(crate) fn densify(rel: &Path, level: &ShardLevel, data: &[u8]) -> Result<Vec<u8>, CommitError> {
    // A level whose slots do not fit in memory is refused before anything is read.
    usize::try_from(level.n_chunks())
        .map_err(|_| CommitError::BadUpdate("index too large".into()))?;
    let (index, times) = parse(rel, level, data)?;
    let chunks: Vec<Option<&[u8]>> = index
        .entries()
        .iter()
        .map(|e| e.map(|r| shard_read::chunk_bytes(data, r)))
        .collect();
    Ok(dense_shard_by_slot(level, &chunks, &times).0)
}

/// Read the shard `current`, let `merge` decide, and make the new shard's bytes.
pub(crate) fn rewrite_shard(
    rel: &Path,
    level: &ShardLevel,
    current: Option<&[u8]>,
    merge: &mut Merge<'_, '_>,
) -> Result<Rewrite, CommitError> {
    let n = usize::try_from(level.n_chunks())
        .map_err(|_| CommitError::BadUpdate("index too large".into()))?;
    let (index, times, old_len) = match current {
        None => (ShardIndex::empty(n), CloseTimes::unknown(n), 0),
        Some(data) => {
            let (index, times) = parse(rel, level, data)?;
            (index, times, data.len() as u64)
        }
    };
    let updates = merge(&ShardSnapshot {
        index: &index,
        times: &times,
        exists: current.is_some(),
    });
    if let Some(bad) = updates.iter().find(|u| u.slot >= n) {
        return Err(CommitError::BadUpdate(format!(
            "slot {} of a shard with {n} chunks",
            bad.slot
        )));
    }
    let old = current.unwrap_or(&[]);
    let mut chunks: Vec<Option<&[u8]>> = index
        .entries()
        .iter()
        .map(|e| e.map(|r| shard_read::chunk_bytes(old, r)))
        .collect();
    let mut new_times = times.clone();
    let mut changed = false;
    for u in &updates {
        changed |= u.data.is_some() || chunks[u.slot].is_some();
        chunks[u.slot] = u.data;
        new_times.set(u.slot, u.closed);
    }
    let mut outcome = CommitOutcome {
        index: index.clone(),
        stored: None,
        old_len,
        new_len: old_len,
        bytes_written: 0,
        removed: current.is_none(),
        rewritten: false,
        applied: updates.len(),
        recovered: Vec::new(),
    };
    if !changed {
        return Ok(Rewrite {
            outcome,
            bytes: None,
            times: new_times,
        });
    }
    if chunks.iter().all(Option::is_none) {
        outcome.index = ShardIndex::empty(n);
        outcome.new_len = 0;
        outcome.removed = true;
        return Ok(Rewrite {
            outcome,
            bytes: Some(Vec::new()),
            times: new_times,
        });
    }
    let (bytes, new_index) = dense_shard_by_slot(level, &chunks, &new_times);
    outcome.index = new_index;
    outcome.new_len = bytes.len() as u64;
    outcome.bytes_written = outcome.new_len;
    outcome.removed = false;
    outcome.rewritten = true;
    Ok(Rewrite {
        outcome,
        bytes: Some(bytes),
        times: new_times,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::index::{Endian, IndexCodecs, IndexLocation};

    fn level(index_location: IndexLocation) -> ShardLevel {
        ShardLevel {
            chunk_shape: vec![4],
            chunks_per_shard: vec![4],
            index_codecs: IndexCodecs {
                endian: Endian::Little,
                crc32c: true,
            },
            index_location,
        }
    }

    /// The index a dense shard is made with is the one its bytes hold, at either end,
    /// and a rewrite of it with no change keeps every chunk where it was read.
    #[test]
    fn a_dense_shard_holds_the_index_it_was_made_with() {
        for location in [IndexLocation::Start, IndexLocation::End] {
            let level = level(location);
            let n = level.n_chunks() as usize;
            let a = vec![1u8; 10];
            let c = vec![3u8; 7];
            let mut chunks: Vec<Option<&[u8]>> = vec![None; n];
            chunks[0] = Some(&a);
            chunks[2] = Some(&c);
            let (bytes, index) = dense_shard_by_slot(&level, &chunks, &CloseTimes::unknown(n));
            let (read, _) = parse(Path::new("s"), &level, &bytes).unwrap();
            assert_eq!(read.entries(), index.entries(), "{location:?}");
            let r = index.entries()[2].unwrap();
            assert_eq!(&bytes[r.offset as usize..r.end() as usize], &c[..]);
            let same =
                rewrite_shard(Path::new("s"), &level, Some(&bytes), &mut |_| Vec::new()).unwrap();
            assert!(same.bytes.is_none(), "nothing changed, nothing written");
            assert_eq!(same.outcome.index.entries(), index.entries());
        }
    }
}
