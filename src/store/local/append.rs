//! Crash-safe updates of one shard: a batch of inner-chunk changes becomes durable as a
//! whole or not at all (protocol in `docs/FORMAT.md`, "Writes: the append protocol").
//!
//! * Index at the end and the shard exists: **append** (ZEP 2, "Append-only"). The new
//!   chunk bytes and a fresh index go after the last byte; the old bytes stay as dead
//!   space, the prefix of the file never changes. A recovery record
//!   (`<shard>.shardfs-append`, see [`super::recover`]) is made durable first, so that
//!   a torn tail can be told apart from a finished append and cut off.
//! * New shard, or index at the start: **rewrite** the whole shard into
//!   `<shard>.shardfs-tmp` and rename it over the shard.
//! * No chunk left: the shard file is removed.
//!
//! Everything happens under the exclusive lock of the shard's directory, after recovery
//! of a crashed earlier update, on the shard as it is on disk (never a cached index).
//! This module does not own staging or when to flush (the rest of `write`), nor the
//! index byte layout (`format::index`).

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufWriter, IoSlice, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use rustix::fs::OFlags;

use super::recover::{
    self, APPEND_SUFFIX, AppendRecord, Lock, ShardDir, TEMP_SUFFIX, io_at, sibling,
};
use crate::format::CloseTimes;
use crate::format::index::IndexLocation;
use crate::format::shard_read::{self, ReadError};
use crate::format::shard_write::Packer;
use crate::format::{ChunkRange, ShardIndex, ShardLevel};
use crate::store::FileRef;
pub use crate::store::commit::{CommitError, CommitOutcome};
use crate::store::commit::{Merge, ShardSnapshot, SlotChange, StoredShard};

/// One inner-chunk slot change of a shard: its new bytes, or deletion (`None`).
pub type ChunkUpdate<'a> = (usize, Option<&'a [u8]>);

/// Where the bytes of one slot of a shard being written come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source<'a> {
    /// A chunk of the current shard file.
    Old(ChunkRange),
    /// The caller's bytes.
    New(&'a [u8]),
}

/// Apply `updates` (row-major slot in the outermost level's index, new bytes or `None`
/// to delete) to the shard file `root/rel`, unconditionally and with no close time (as
/// maintenance and tests do). Later updates of a slot win. See [`commit`].
pub fn apply(
    root: &Path,
    rel: &Path,
    level: &ShardLevel,
    updates: &[ChunkUpdate],
) -> Result<CommitOutcome, CommitError> {
    let changes: Vec<SlotChange> = updates
        .iter()
        .map(|&(slot, data)| SlotChange {
            slot,
            data,
            closed: 0,
        })
        .collect();
    commit(root, rel, level, &mut |_| changes.clone())
}

/// Commit changes to the shard file `root/rel` (outermost sharding level `level`),
/// creating it (and its directories) if absent: under the directory's lock, recover an
/// interrupted earlier update, read the shard as it is on disk (index and close times),
/// let `merge` decide the changes, and make them durable: the new bytes go to the shard
/// in slot order with one vectored write from the caller's buffers, with the close times
/// of every slot beside them. Later changes of a slot win. On `Ok` the new state is
/// durable; on `Err` the shard is unchanged.
pub fn commit(
    root: &Path,
    rel: &Path,
    level: &ShardLevel,
    merge: &mut Merge<'_, '_>,
) -> Result<CommitOutcome, CommitError> {
    let (dir_rel, name) = recover::split_rel(rel)?;
    let n = usize::try_from(level.n_chunks())
        .map_err(|_| CommitError::BadUpdate("index too large".into()))?;
    // Read and merge under the directory's lock. A missing directory is read unlocked
    // (nothing to lock); if the merge then writes, the directory is made and locked and
    // the shard read and merged again, since another writer may have got there first.
    let mut dir = ShardDir::open(root, dir_rel, false, Lock::Exclusive)?;
    let (dir, cur, sources, times, outcome) = loop {
        let (recovered, cur) = match &dir {
            Some(d) => (
                recover::recover_locked(d, name)?,
                Current::read(d, name, level)?,
            ),
            None => (Vec::new(), Current::absent(n)),
        };
        let updates = merge(&ShardSnapshot {
            index: &cur.index,
            times: &cur.times,
            exists: cur.file.is_some(),
        });
        if let Some(bad) = updates.iter().find(|u| u.slot >= n) {
            return Err(CommitError::BadUpdate(format!(
                "slot {} of a shard with {n} chunks",
                bad.slot
            )));
        }
        let outcome = CommitOutcome {
            index: cur.index.clone(),
            stored: None,
            old_len: cur.len,
            new_len: cur.len,
            bytes_written: 0,
            removed: cur.file.is_none(),
            rewritten: false,
            applied: updates.len(),
            recovered,
        };
        let mut sources: Vec<Option<Source>> = cur
            .index
            .entries()
            .iter()
            .map(|e| e.map(Source::Old))
            .collect();
        let mut times = cur.times.clone();
        let mut changed = false;
        for u in &updates {
            changed |= u.data.is_some() || sources[u.slot].is_some();
            sources[u.slot] = u.data.map(Source::New);
            times.set(u.slot, u.closed);
        }
        if !changed {
            return Ok(outcome);
        }
        match dir {
            Some(d) => break (d, cur, sources, times, outcome),
            None => {
                dir = Some(
                    ShardDir::open(root, dir_rel, true, Lock::Exclusive)?
                        .ok_or_else(|| CommitError::BadPath(rel.to_path_buf()))?,
                )
            }
        }
    };
    write_changes(&dir, name, level, &cur, &sources, &times, outcome)
}

/// Make the merged changes of a commit durable in the shard `name` of the locked `dir`
/// (`cur` as read under that lock): remove the shard where no slot holds a chunk, append
/// where its index is at the end, else rewrite it whole. `outcome` is completed.
fn write_changes(
    dir: &ShardDir,
    name: &OsStr,
    level: &ShardLevel,
    cur: &Current,
    sources: &[Option<Source>],
    times: &CloseTimes,
    mut outcome: CommitOutcome,
) -> Result<CommitOutcome, CommitError> {
    if sources.iter().all(Option::is_none) {
        dir.remove(name)?;
        dir.sync()?;
        outcome.index = ShardIndex::empty(sources.len());
        outcome.new_len = 0;
        outcome.removed = true;
        outcome.stored = Some(StoredShard::removed());
        return Ok(outcome);
    }
    outcome.removed = false;
    match (&cur.file, level.index_location) {
        (Some(file), IndexLocation::End) => {
            let (index, new_len) = append(dir, name, file, cur.len, level, sources, times)?;
            outcome.bytes_written = new_len - cur.len;
            outcome.index = index;
            outcome.new_len = new_len;
        }
        (old, _) => {
            let (index, new_len) = rewrite(dir, name, level, old.as_ref(), sources, times)?;
            outcome.bytes_written = new_len;
            outcome.index = index;
            outcome.new_len = new_len;
            outcome.rewritten = true;
        }
    }
    outcome.stored = reopen(dir, name);
    Ok(outcome)
}

/// The shard as this commit left it, opened again (read-only, as a load opens it) while
/// its directory's lock is still held: this commit's version, no later writer's. `None`
/// if that fails (the committing mount then reads the index again, as before).
fn reopen(dir: &ShardDir, name: &OsStr) -> Option<StoredShard> {
    let file = dir.open_file(name, OFlags::RDONLY, 0).ok()??;
    super::stored_shard(file).ok()
}

/// A shard as it is on disk, read under its directory's lock.
pub(crate) struct Current {
    pub file: Option<File>,
    pub len: u64,
    pub index: ShardIndex,
    pub times: CloseTimes,
}

impl Current {
    fn absent(n: usize) -> Current {
        Current {
            file: None,
            len: 0,
            index: ShardIndex::empty(n),
            times: CloseTimes::unknown(n),
        }
    }

    /// Absent file: an all-empty index. A corrupt index is [`CommitError::Corrupt`].
    pub(crate) fn read(
        dir: &ShardDir,
        name: &OsStr,
        level: &ShardLevel,
    ) -> Result<Current, CommitError> {
        let path = dir.path_of(name);
        let n = level.n_chunks() as usize;
        let Some(file) = dir.open_file(name, OFlags::RDWR, 0)? else {
            return Ok(Current::absent(n));
        };
        let meta = file.metadata().map_err(io_at(&path))?;
        if !meta.is_file() {
            return Err(CommitError::NotAFile(path));
        }
        let len = meta.len();
        match shard_read::read_index_and_times(&FileRef(&file), level, len) {
            Ok((index, times)) => Ok(Current {
                file: Some(file),
                len,
                index,
                times,
            }),
            Err(ReadError::Io(e)) => Err(io_at(path)(e)),
            Err(ReadError::Index(err)) => Err(CommitError::Corrupt { path, err }),
        }
    }
}

/// Append the new chunk bytes (in slot order) and index to `file`: record, write,
/// fsync, drop record.
fn append(
    dir: &ShardDir,
    name: &OsStr,
    file: &File,
    old_len: u64,
    level: &ShardLevel,
    sources: &[Option<Source>],
    times: &CloseTimes,
) -> Result<(ShardIndex, u64), CommitError> {
    let mut packer = Packer::append(level, old_len).expect("appends only to an index at the end");
    let mut tail: Vec<&[u8]> = Vec::new();
    for (slot, s) in sources.iter().enumerate() {
        match s {
            None => {}
            Some(Source::Old(r)) => packer.keep(slot, *r),
            Some(Source::New(b)) => {
                packer.place(slot, b.len() as u64);
                tail.push(b);
            }
        }
    }
    let framed = packer.finish(level, times);
    tail.push(&framed.tail);
    let new_len = framed.len;
    let record = AppendRecord {
        old_len,
        new_len,
        tail_crc: tail.iter().fold(0, |crc, b| crc32c::crc32c_append(crc, b)),
    };
    let rec_name = sibling(name, APPEND_SUFFIX);
    let path = dir.path_of(name);
    let rec_path = dir.path_of(&rec_name);

    // 1. The record is durable before the shard is touched.
    let rec_file = dir
        .open_file(
            &rec_name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC,
            0o644,
        )?
        .expect("created");
    let wrote = rec_file
        .write_all_at(&record.encode(), 0)
        .and_then(|()| rec_file.sync_all())
        .map_err(io_at(&rec_path))
        .and_then(|()| dir.sync());
    drop(rec_file);
    if let Err(e) = wrote {
        let _ = dir.remove(&rec_name);
        return Err(e);
    }

    // 2. Chunk bytes, then the index, after the last byte; fsync. This is the commit.
    let wrote = write_all_vectored_at(file, &tail, old_len).and_then(|()| file.sync_all());
    if let Err(e) = wrote {
        // Undo now rather than at the next recovery; if that fails too, the record stays
        // and recovery rolls back later.
        let undone = file
            .set_len(old_len)
            .and_then(|()| file.sync_all())
            .map_err(io_at(&path))
            .and_then(|()| dir.remove(&rec_name))
            .and_then(|_| dir.sync());
        if let Err(u) = undone {
            log::error!(
                "{}: append failed and was not undone yet: {u}",
                path.display()
            );
        }
        return Err(io_at(path)(e));
    }

    // 3. The record goes. Failing here loses nothing: the append is durable, and recovery
    //    finds a record whose append completed.
    if let Err(e) = dir.remove(&rec_name).and_then(|_| dir.sync()) {
        log::warn!("{}: append done, record not removed: {e}", path.display());
    }
    Ok((framed.index, new_len))
}

/// Write the shard of `sources` (chunks in slot order, no dead space) to
/// `<name>.shardfs-tmp`, fsync it and rename it over `name`. The old shard stays intact
/// until the rename. Returns the new index and length.
pub(crate) fn rewrite(
    dir: &ShardDir,
    name: &OsStr,
    level: &ShardLevel,
    old: Option<&File>,
    sources: &[Option<Source>],
    times: &CloseTimes,
) -> Result<(ShardIndex, u64), CommitError> {
    let size = |s: &Source| match s {
        Source::Old(r) => r.nbytes,
        Source::New(b) => b.len() as u64,
    };
    let mut packer = Packer::dense(level);
    for (slot, s) in sources.iter().enumerate() {
        if let Some(s) = s {
            packer.place(slot, size(s));
        }
    }
    let framed = packer.finish(level, times);
    let tmp_name = sibling(name, TEMP_SUFFIX);
    let tmp_path = dir.path_of(&tmp_name);
    let tmp = dir
        .open_file(
            &tmp_name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            0o666,
        )?
        .expect("created");
    let written = (|| -> io::Result<()> {
        if let Some(old) = old {
            use std::os::unix::fs::PermissionsExt;
            let mode = old.metadata()?.permissions().mode() & 0o7777;
            tmp.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        let mut out = BufWriter::with_capacity(1 << 20, &tmp);
        out.write_all(&framed.head)?;
        let mut buf = Vec::new();
        for s in sources.iter().flatten() {
            match s {
                Source::New(b) => out.write_all(b)?,
                Source::Old(r) => {
                    let old = old.ok_or(io::ErrorKind::NotFound)?;
                    let mut at = r.offset;
                    while at < r.end() {
                        buf.resize((r.end() - at).min(1 << 20) as usize, 0);
                        old.read_exact_at(&mut buf, at)?;
                        out.write_all(&buf)?;
                        at += buf.len() as u64;
                    }
                }
            }
        }
        out.write_all(&framed.tail)?;
        out.flush()?;
        drop(out);
        tmp.sync_all()
    })()
    .map_err(io_at(&tmp_path))
    .and_then(|()| dir.rename(&tmp_name, name))
    .and_then(|()| dir.sync());
    if let Err(e) = written {
        let _ = dir.remove(&tmp_name);
        return Err(e);
    }
    Ok((framed.index, framed.len))
}

/// All of `bufs`, in order, at `offset` of `file`: `pwritev`, resumed after a short
/// write, at most `IOV_MAX` buffers a call.
fn write_all_vectored_at(file: &File, bufs: &[&[u8]], mut offset: u64) -> io::Result<()> {
    const IOV_MAX: usize = 1024; // Linux's UIO_MAXIOV
    let mut bufs: Vec<&[u8]> = bufs.iter().copied().filter(|b| !b.is_empty()).collect();
    let mut first = 0;
    while first < bufs.len() {
        let iov: Vec<IoSlice> = bufs[first..]
            .iter()
            .take(IOV_MAX)
            .map(|b| IoSlice::new(b))
            .collect();
        let mut n = match rustix::io::pwritev(file, &iov, offset) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        offset += n as u64;
        while n > 0 {
            let b = bufs[first];
            if n >= b.len() {
                n -= b.len();
                first += 1;
            } else {
                bufs[first] = &b[n..];
                n = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Endian, IndexCodecs};

    fn level(location: IndexLocation, crc32c: bool) -> ShardLevel {
        ShardLevel {
            chunk_shape: vec![2],
            chunks_per_shard: vec![4],
            index_codecs: IndexCodecs {
                endian: Endian::Little,
                crc32c,
            },
            index_location: location,
        }
    }

    /// The files the local store writes are the write half's layouts byte for byte: a
    /// new shard (or any shard with its index at the start) as [`dense_shard`] makes it,
    /// an append as the old file, the new chunks and the [`Packer::append`] tail.
    #[test]
    fn local_shards_are_the_codec_layouts_byte_for_byte() {
        use crate::format::shard_write::dense_shard;
        for location in [IndexLocation::Start, IndexLocation::End] {
            let root = tempfile::tempdir().unwrap();
            let l = level(location, true);
            let rel = Path::new("c/0");
            let first: [(usize, &[u8]); 2] = [(0, b"ab"), (3, b"cdef")];
            let updates: Vec<ChunkUpdate> = first.iter().map(|&(s, b)| (s, Some(b))).collect();
            apply(root.path(), rel, &l, &updates).unwrap();
            let file = std::fs::read(root.path().join(rel)).unwrap();
            assert_eq!(file, dense_shard(&l, first, &CloseTimes::unknown(4)).0);
            apply(
                root.path(),
                rel,
                &l,
                &[(2, Some(b"xyz".as_slice())), (0, None)],
            )
            .unwrap();
            let after = std::fs::read(root.path().join(rel)).unwrap();
            let expected = match location {
                IndexLocation::Start => {
                    let chunks: [(usize, &[u8]); 2] = [(2, b"xyz"), (3, b"cdef")];
                    dense_shard(&l, chunks, &CloseTimes::unknown(4)).0
                }
                IndexLocation::End => {
                    let mut p = Packer::append(&l, file.len() as u64).unwrap();
                    p.keep(
                        3,
                        ChunkRange {
                            offset: 2,
                            nbytes: 4,
                        },
                    );
                    p.place(2, 3);
                    let tail = p.finish(&l, &CloseTimes::unknown(4)).tail;
                    [file.clone(), b"xyz".to_vec(), tail].concat()
                }
            };
            assert_eq!(after, expected, "{location:?}");
        }
    }

    #[test]
    fn bad_updates_change_nothing() {
        let root = tempfile::tempdir().unwrap();
        let l = level(IndexLocation::End, true);
        let rel = Path::new("c/0");
        let err = apply(root.path(), rel, &l, &[(4, Some(b"a".as_slice()))]).unwrap_err();
        assert!(matches!(err, CommitError::BadUpdate(_)), "{err}");
        assert_eq!(err.errno(), libc::EINVAL);
        assert!(matches!(
            apply(root.path(), Path::new("../x"), &l, &[]),
            Err(CommitError::BadPath(_))
        ));
        assert!(!root.path().join("c").exists());
    }

    #[test]
    fn append_leaves_no_record_and_reports_lengths() {
        let root = tempfile::tempdir().unwrap();
        let l = level(IndexLocation::End, true);
        let rel = Path::new("a/c/0");
        let first = apply(root.path(), rel, &l, &[(1, Some(b"xyz".as_slice()))]).unwrap();
        assert!(first.rewritten && !first.removed);
        assert_eq!(first.new_len, 3 + 68);
        let second = apply(root.path(), rel, &l, &[(2, Some(b"hello".as_slice()))]).unwrap();
        assert!(!second.rewritten);
        assert_eq!((second.old_len, second.new_len), (71, 71 + 5 + 68));
        assert_eq!(second.bytes_written, 5 + 68);
        assert_eq!(
            second.index.get(2),
            Some(ChunkRange {
                offset: 71,
                nbytes: 5
            })
        );
        assert_eq!(second.index.get(1), first.index.get(1));
        let names: Vec<_> = std::fs::read_dir(root.path().join("a/c"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["0"]);
        // Deleting an empty slot changes nothing at all.
        let before = std::fs::read(root.path().join(rel)).unwrap();
        let noop = apply(root.path(), rel, &l, &[(0, None)]).unwrap();
        assert_eq!(noop.bytes_written, 0);
        assert_eq!(std::fs::read(root.path().join(rel)).unwrap(), before);
    }

    #[test]
    fn a_vectored_append_of_more_buffers_than_one_call_takes() {
        // 1500 new chunks (more than IOV_MAX buffers, some empty) in one append, from
        // separate buffers: every slot reads back its own bytes, the record is gone.
        // It takes more than one `pwritev`, so it fails if the loop does not resume
        // where a call stopped (checked by making the loop stop after one call; rustix
        // also caps a call at IOV_MAX, so the cap in `write_all_vectored_at` alone is not
        // what this test sees).
        let root = tempfile::tempdir().unwrap();
        let l = ShardLevel {
            chunk_shape: vec![1],
            chunks_per_shard: vec![2000],
            index_codecs: IndexCodecs {
                endian: Endian::Little,
                crc32c: true,
            },
            index_location: IndexLocation::End,
        };
        let rel = Path::new("c/0");
        apply(root.path(), rel, &l, &[(1999, Some(b"last".as_slice()))]).unwrap();
        let chunks: Vec<Vec<u8>> = (0..1500u32)
            .map(|i| i.to_le_bytes()[..(i % 4) as usize].to_vec())
            .collect();
        let updates: Vec<(usize, Option<&[u8]>)> = chunks
            .iter()
            .enumerate()
            .map(|(i, c)| (i, Some(c.as_slice())))
            .collect();
        let out = apply(root.path(), rel, &l, &updates).unwrap();
        assert!(!out.rewritten);
        let payload: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        assert_eq!(out.bytes_written, payload + l.index_len());
        let file = std::fs::read(root.path().join(rel)).unwrap();
        assert_eq!(file.len() as u64, out.new_len);
        let slot = |i: u64| {
            let r = out.index.get(i).unwrap();
            &file[r.offset as usize..r.end() as usize]
        };
        for (i, c) in chunks.iter().enumerate() {
            assert_eq!(slot(i as u64), &c[..], "slot {i}");
        }
        assert_eq!(slot(1999), b"last");
        assert_eq!(std::fs::read_dir(root.path().join("c")).unwrap().count(), 1);
    }
}
