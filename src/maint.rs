//! `shardfs verify` and `shardfs compact`: store-wide maintenance over every sharded
//! array (the arrays the view presents), one shard at a time under its directory's lock
//! (`store::local::recover`), so both can run beside live mounts.
//!
//! * `verify` checks every shard's index at every nesting level: it decodes, its
//!   checksum matches, live chunks lie inside their block and overlap neither each other
//!   nor the index; leftovers of interrupted updates are reported. `--repair` recovers
//!   those, and cuts a torn tail (no record) back to the last complete state of an
//!   append-only shard, found by a backwards search ([`scan`]).
//! * `compact` rewrites shards whose dead space (bytes no index entry points at) exceeds
//!   a fraction of the file, keeping every chunk's bytes, the index codecs and location.
//!
//! Not owned here: the index layout (`format`), the update protocol (`store::local::append`).

mod scan;
#[cfg(test)]
mod tests;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use rustix::fs::OFlags;
use serde::Serialize;

use crate::format::{self, Presentation, ShardIndex, ShardLayout};
use crate::info::{for_each_array_or_bad, shard_coords};
use crate::store::local::FileRef;
use crate::store::local::append::{self, CommitError, Current, ReadError, Source};
use crate::store::local::recover::{self, APPEND_SUFFIX, Lock, ShardDir, TEMP_SUFFIX, io_at};
use crate::store::{LocalStore, Store, StoreFile};

/// One finding about one shard (store-relative path).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub shard: PathBuf,
    pub what: String,
}

/// What `verify` found (and, with `repair`, fixed).
#[derive(Debug, Default, Serialize)]
pub struct VerifyReport {
    pub store: PathBuf,
    pub arrays: u64,
    pub shards_checked: u64,
    pub problem_count: u64,
    pub repaired_count: u64,
    /// Problems left (after repair, when repairing).
    pub problems: Vec<Problem>,
    /// What repair did: recoveries of interrupted updates, torn tails cut back.
    pub repaired: Vec<Problem>,
    /// Sharded arrays whose shards cannot be checked (the view passes them through).
    pub unchecked_arrays: Vec<Problem>,
    /// Unusual but readable: index entries that share one chunk's bytes, chunks of
    /// length 0 (the spec allows both; other writers rarely make them).
    pub warnings: Vec<Problem>,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Dead space of one array, and what `compact` reclaimed of it.
#[derive(Debug, Default, Serialize)]
pub struct ArrayCompaction {
    pub path: PathBuf,
    pub shards: u64,
    /// Bytes of its shard files before compaction.
    pub bytes: u64,
    /// Dead bytes before compaction.
    pub dead_bytes: u64,
    pub shards_rewritten: u64,
    pub bytes_reclaimed: u64,
}

/// What `compact` did.
#[derive(Debug, Default, Serialize)]
pub struct CompactReport {
    pub store: PathBuf,
    pub min_garbage: f64,
    pub shards_checked: u64,
    pub shards_rewritten: u64,
    pub bytes_reclaimed: u64,
    pub arrays: Vec<ArrayCompaction>,
    /// Shards left alone because their index is corrupt (see `verify`).
    pub skipped: Vec<Problem>,
    /// Interrupted updates recovered on the way.
    pub recovered: Vec<Problem>,
}

/// A sharded array of the store, and its shard files.
struct Array {
    rel: PathBuf,
    layout: ShardLayout,
    shards: Vec<PathBuf>,
}

/// Every presentable sharded array under the store root (path order); the others that
/// hold `sharding_indexed` go to `unchecked`.
fn sharded_arrays(
    store: &dyn Store,
    unchecked: &mut Vec<Problem>,
    problems: &mut Vec<Problem>,
) -> io::Result<Vec<Array>> {
    let mut out = Vec::new();
    let mut bad = |rel: PathBuf, why: String| {
        problems.push(Problem {
            shard: rel,
            what: format!(
                "metadata that is not a valid document ({why}): Zarr readers cannot open this node"
            ),
        })
    };
    for_each_array_or_bad(
        store,
        PathBuf::new(),
        &mut |dir, meta| {
            match &meta.presentation {
                Presentation::Sharded(layout) => {
                    let shards = shard_coords(store, &dir, meta.key_encoding, layout)
                        .iter()
                        .map(|c| dir.join(meta.key_encoding.encode(c)))
                        .collect();
                    out.push(Array {
                        rel: dir,
                        layout: layout.clone(),
                        shards,
                    });
                }
                Presentation::Unsupported(why) => unchecked.push(Problem {
                    shard: dir,
                    what: why.clone(),
                }),
                Presentation::Plain => {}
            }
            Ok(())
        },
        &mut bad,
    )?;
    Ok(out)
}

fn progress_bar(show: bool, len: usize, what: &'static str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg} {wide_bar} {pos}/{len} shards, {eta} left")
            .expect("valid template"),
    );
    bar.set_message(what);
    bar
}

/// The findings of checking one shard as it is (or as if it ended at `len`).
struct Checked {
    /// The outermost index itself does not read (the case a torn tail shows).
    outer_unreadable: bool,
    problems: Vec<String>,
    warnings: Vec<String>,
    /// Stored chunks at the outermost level.
    stored: usize,
}

/// Check the shard in `file` as if it were `len` bytes long, at every nesting level.
fn check(file: &dyn StoreFile, len: u64, layout: &ShardLayout) -> Checked {
    let mut c = Checked {
        outer_unreadable: false,
        problems: Vec::new(),
        warnings: Vec::new(),
        stored: 0,
    };
    match check_block(file, layout, 0, 0, len, "", &mut c) {
        Ok(Some(index)) => c.stored = index.stored(),
        Ok(None) => c.outer_unreadable = true,
        Err(e) => c.problems.push(format!("I/O error: {e}")),
    }
    c
}

/// Check the block `base..base+len` as a shard of level `l` (and below); `None` when its
/// index does not read.
fn check_block(
    file: &dyn StoreFile,
    layout: &ShardLayout,
    l: usize,
    base: u64,
    len: u64,
    at: &str,
    c: &mut Checked,
) -> io::Result<Option<ShardIndex>> {
    let index = match crate::store::shard::read_index(file, &layout.levels[l], base, len) {
        Ok(index) => index,
        Err(ReadError::Index(e)) => {
            c.problems.push(format!("{at}index: {e}"));
            return Ok(None);
        }
        Err(ReadError::Io(e)) => return Err(e),
    };
    if let Some((a, b)) = overlap(&index) {
        c.problems
            .push(format!("{at}inner chunks {a} and {b} overlap"));
    }
    c.warnings
        .extend(unusual(&index).into_iter().map(|w| format!("{at}{w}")));
    if l + 1 == layout.levels.len()
        && let Some(want) = layout.fixed_chunk_len
    {
        for (slot, r) in index.entries().iter().enumerate() {
            if let Some(r) = r
                && r.nbytes != want
            {
                c.problems.push(format!(
                    "{at}inner chunk {slot} is {} bytes; the array's codecs (no \
                     compression) make every chunk {want} bytes: Zarr readers cannot \
                     decode it",
                    r.nbytes
                ));
            }
        }
    }
    if l + 1 < layout.levels.len() {
        for (slot, r) in index.entries().iter().enumerate() {
            if let Some(r) = r {
                let at = format!("{at}nested shard {slot} (level {}): ", l + 1);
                check_block(file, layout, l + 1, base + r.offset, r.nbytes, &at, c)?;
            }
        }
    }
    Ok(Some(index))
}

/// Readable but unusual entries: slots that share one chunk's bytes, and chunks of
/// length 0 (not the empty marker: a reader decodes zero bytes for them).
fn unusual(index: &ShardIndex) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen: std::collections::HashMap<(u64, u64), usize> = Default::default();
    for (slot, r) in index.entries().iter().enumerate() {
        let Some(r) = r else { continue };
        if r.nbytes == 0 {
            out.push(format!(
                "inner chunk {slot} has length 0 at offset {} (stored, but empty)",
                r.offset
            ));
        } else if let Some(first) = seen.insert((r.offset, r.nbytes), slot) {
            out.push(format!(
                "inner chunks {first} and {slot} share the same bytes (a duplicate index entry)"
            ));
        }
    }
    out
}

/// Two stored chunks whose bytes overlap. Identical ranges (one chunk's bytes shared by
/// two slots) read correctly and are allowed; zero-length chunks overlap nothing.
fn overlap(index: &ShardIndex) -> Option<(usize, usize)> {
    let mut live: Vec<(u64, u64, usize)> = (index.entries().iter().enumerate())
        .filter_map(|(slot, r)| {
            r.filter(|r| r.nbytes > 0)
                .map(|r| (r.offset, r.end(), slot))
        })
        .collect();
    live.sort_unstable();
    let mut reach: Option<(u64, u64, usize)> = None;
    for cur in live {
        if let Some(prev) = reach {
            if cur.0 < prev.1 && (cur.0, cur.1) != (prev.0, prev.1) {
                return Some((prev.2.min(cur.2), prev.2.max(cur.2)));
            }
            if cur.1 <= prev.1 {
                continue;
            }
        }
        reach = Some(cur);
    }
    None
}

/// Check every shard of every sharded array under `root`. With `repair`, first recover
/// interrupted updates, then cut torn tails back to the last complete state.
pub fn verify(root: &Path, repair: bool, progress: bool) -> Result<VerifyReport, CommitError> {
    let mut report = VerifyReport {
        store: std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf()),
        ..Default::default()
    };
    if repair {
        for (shard, r) in recover::recover_store(root)? {
            report.repaired.push(Problem {
                shard,
                what: r.to_string(),
            });
        }
    } else {
        for file in recover::pending(root)? {
            let name = file.to_string_lossy();
            let (shard, kind) = match name.strip_suffix(APPEND_SUFFIX) {
                Some(s) => (s.to_string(), "append record of an interrupted append"),
                None => (
                    name.strip_suffix(TEMP_SUFFIX).unwrap_or(&name).to_string(),
                    "temp file of an interrupted rewrite",
                ),
            };
            report.problems.push(Problem {
                shard: shard.into(),
                what: format!("leftover {kind}; mount or `verify --repair` recovers it"),
            });
        }
    }
    let store = LocalStore::open(root).map_err(io_at(root))?;
    let arrays = sharded_arrays(&store, &mut report.unchecked_arrays, &mut report.problems)
        .map_err(io_at(root))?;
    report.arrays = arrays.len() as u64;
    let bar = progress_bar(
        progress,
        arrays.iter().map(|a| a.shards.len()).sum(),
        "verify",
    );
    for array in &arrays {
        for rel in &array.shards {
            bar.inc(1);
            report.shards_checked += 1;
            let mut found = verify_shard(root, rel, &array.layout)?;
            if repair
                && found.outer_unreadable
                && let Some(what) = repair_tail(root, rel, &array.layout)?
            {
                report.repaired.push(Problem {
                    shard: rel.clone(),
                    what,
                });
                found = verify_shard(root, rel, &array.layout)?;
            }
            for what in found.problems {
                report.problems.push(Problem {
                    shard: rel.clone(),
                    what,
                });
            }
            for what in found.warnings {
                report.warnings.push(Problem {
                    shard: rel.clone(),
                    what,
                });
            }
        }
    }
    bar.finish_and_clear();
    report.problem_count = report.problems.len() as u64;
    report.repaired_count = report.repaired.len() as u64;
    Ok(report)
}

/// Check every shard of every sharded array of `store`, which has no interrupted updates
/// to look for (object storage: a PUT is atomic), reading each shard through the store
/// (ranged reads of its index and nested indices, never the chunks). `name` is what the
/// report calls the store.
pub fn verify_store(store: &dyn Store, name: &Path, progress: bool) -> io::Result<VerifyReport> {
    let mut report = VerifyReport {
        store: name.to_path_buf(),
        ..Default::default()
    };
    let arrays = sharded_arrays(store, &mut report.unchecked_arrays, &mut report.problems)?;
    report.arrays = arrays.len() as u64;
    let bar = progress_bar(
        progress,
        arrays.iter().map(|a| a.shards.len()).sum(),
        "verify",
    );
    for array in &arrays {
        for rel in &array.shards {
            bar.inc(1);
            report.shards_checked += 1;
            let Some(file) = store.open(rel)? else {
                continue; // listed a moment ago, gone now
            };
            let found = check(file.as_ref(), file.meta()?.len, &array.layout);
            for what in found.problems {
                report.problems.push(Problem {
                    shard: rel.clone(),
                    what,
                });
            }
            for what in found.warnings {
                report.warnings.push(Problem {
                    shard: rel.clone(),
                    what,
                });
            }
        }
    }
    bar.finish_and_clear();
    report.problem_count = report.problems.len() as u64;
    Ok(report)
}

/// Check one shard under its directory's shared lock (no update is half-way).
fn verify_shard(root: &Path, rel: &Path, layout: &ShardLayout) -> Result<Checked, CommitError> {
    // Never opened unless a regular file: a FIFO would block, a symbolic link may lead
    // out of the store, and a mount reads the chunks of either as EIO.
    match std::fs::symlink_metadata(root.join(rel)) {
        Ok(m) if !m.file_type().is_file() => {
            let what = if m.is_dir() {
                "a directory"
            } else if m.file_type().is_symlink() {
                "a symbolic link (never followed)"
            } else {
                "a special file (FIFO, socket or device)"
            };
            let mut c = check_nothing();
            c.problems.push(format!(
                "the shard path is {what}, not a regular file: its chunks read as EIO"
            ));
            return Ok(c);
        }
        _ => {}
    }
    let (dir_rel, name) = recover::split_rel(rel)?;
    let file = match ShardDir::open(root, dir_rel, false, Lock::Shared)? {
        Some(dir) => dir.open_file(name, OFlags::RDONLY, 0)?,
        None => None,
    };
    let Some(file) = file else {
        // Listed a moment ago, gone now: removed by an update, which is no problem.
        return Ok(check_nothing());
    };
    let len = file.metadata().map_err(io_at(root.join(rel)))?.len();
    Ok(check(&FileRef(&file), len, layout))
}

fn check_nothing() -> Checked {
    Checked {
        outer_unreadable: false,
        problems: Vec::new(),
        warnings: Vec::new(),
        stored: 0,
    }
}

/// Cut the torn tail of an append-only shard (index at the end, with crc32c) back to the
/// most recent earlier complete state: the largest `p` such that the shard's first `p`
/// bytes pass every check and hold a chunk. Never truncates without finding one.
fn repair_tail(
    root: &Path,
    rel: &Path,
    layout: &ShardLayout,
) -> Result<Option<String>, CommitError> {
    let level = &layout.levels[0];
    if level.index_location != format::IndexLocation::End || !level.index_codecs.crc32c {
        return Ok(None);
    }
    let (dir_rel, name) = recover::split_rel(rel)?;
    let Some(dir) = ShardDir::open(root, dir_rel, false, Lock::Exclusive)? else {
        return Ok(None);
    };
    recover::recover_locked(&dir, name)?;
    let Some(file) = dir.open_file(name, OFlags::RDWR, 0)? else {
        return Ok(None);
    };
    let path = dir.path_of(name);
    let len = file.metadata().map_err(io_at(&path))?.len();
    if !check(&FileRef(&file), len, layout).outer_unreadable {
        return Ok(None); // changed since it was checked
    }
    let candidates = scan::crc_candidates(&file, len, level.index_len()).map_err(io_at(&path))?;
    for &p in candidates.iter().rev() {
        let c = check(&FileRef(&file), p, layout);
        if c.problems.is_empty() && c.stored > 0 {
            file.set_len(p).map_err(io_at(&path))?;
            file.sync_all().map_err(io_at(&path))?;
            log::warn!("{}: torn tail cut from {len} to {p} bytes", path.display());
            return Ok(Some(format!(
                "torn tail: truncated from {len} to {p} bytes, its last complete state"
            )));
        }
    }
    Ok(None)
}

/// Rewrite every shard whose dead space exceeds `min_garbage` of its file (0 rewrites any
/// shard with dead bytes), without dead space: the same bytes per slot, chunks in slot
/// order, the same index codecs and location. Corrupt shards are skipped and reported.
pub fn compact(
    root: &Path,
    min_garbage: f64,
    progress: bool,
) -> Result<CompactReport, CommitError> {
    if !(0.0..1.0).contains(&min_garbage) {
        return Err(CommitError::BadUpdate(format!(
            "min_garbage {min_garbage} is not a fraction in [0, 1)"
        )));
    }
    let mut report = CompactReport {
        store: std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf()),
        min_garbage,
        ..Default::default()
    };
    let store = LocalStore::open(root).map_err(io_at(root))?;
    let arrays = sharded_arrays(&store, &mut Vec::new(), &mut Vec::new()).map_err(io_at(root))?;
    let bar = progress_bar(
        progress,
        arrays.iter().map(|a| a.shards.len()).sum(),
        "compact",
    );
    for array in &arrays {
        let mut stats = ArrayCompaction {
            path: array.rel.clone(),
            ..Default::default()
        };
        let level = &array.layout.levels[0];
        for rel in &array.shards {
            bar.inc(1);
            report.shards_checked += 1;
            let (dir_rel, name) = recover::split_rel(rel)?;
            let Some(dir) = ShardDir::open(root, dir_rel, false, Lock::Exclusive)? else {
                continue;
            };
            for r in recover::recover_locked(&dir, name)? {
                report.recovered.push(Problem {
                    shard: rel.clone(),
                    what: r.to_string(),
                });
            }
            let cur = match Current::read(&dir, name, level) {
                Ok(cur) => cur,
                Err(CommitError::Corrupt { err, .. }) => {
                    report.skipped.push(Problem {
                        shard: rel.clone(),
                        what: format!("corrupt index, not compacted: {err}"),
                    });
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Some(file) = &cur.file else { continue };
            // The close-time block is live too: a compacted shard keeps it.
            let times_len = if cur.times.any() {
                crate::format::CloseTimes::encoded_len(level.n_chunks())
            } else {
                0
            };
            let used = cur.index.live_bytes() + level.index_len() + times_len;
            let dead = cur.len.saturating_sub(used);
            stats.shards += 1;
            stats.bytes += cur.len;
            stats.dead_bytes += dead;
            if dead == 0 || dead as f64 / cur.len as f64 <= min_garbage {
                continue;
            }
            let sources: Vec<_> = cur
                .index
                .entries()
                .iter()
                .map(|e| e.map(Source::Old))
                .collect();
            let (_, new_len) =
                append::rewrite(&dir, name, level, Some(file), &sources, &cur.times)?;
            stats.shards_rewritten += 1;
            stats.bytes_reclaimed += cur.len.saturating_sub(new_len);
        }
        report.shards_rewritten += stats.shards_rewritten;
        report.bytes_reclaimed += stats.bytes_reclaimed;
        report.arrays.push(stats);
    }
    bar.finish_and_clear();
    Ok(report)
}

/// [`compact`] for a store that rewrites a shard as one conditional replacement
/// (object storage): each shard whose dead space exceeds `min_garbage` of its length is
/// read whole and PUT back dense, if it did not change meanwhile (else read and redone).
/// Corrupt shards are skipped and reported. `name` is what the report calls the store.
pub fn compact_store(
    store: &dyn Store,
    name: &Path,
    min_garbage: f64,
    progress: bool,
) -> Result<CompactReport, crate::store::CommitError> {
    use crate::store::CommitError;
    if !(0.0..1.0).contains(&min_garbage) {
        return Err(CommitError::BadUpdate(format!(
            "min_garbage {min_garbage} is not a fraction in [0, 1)"
        )));
    }
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: io::Error| CommitError::Io { path, source }
    };
    let mut report = CompactReport {
        store: name.to_path_buf(),
        min_garbage,
        ..Default::default()
    };
    let arrays = sharded_arrays(store, &mut Vec::new(), &mut Vec::new()).map_err(io_err(name))?;
    let bar = progress_bar(
        progress,
        arrays.iter().map(|a| a.shards.len()).sum(),
        "compact",
    );
    for array in &arrays {
        let mut stats = ArrayCompaction {
            path: array.rel.clone(),
            ..Default::default()
        };
        let level = &array.layout.levels[0];
        for rel in &array.shards {
            bar.inc(1);
            report.shards_checked += 1;
            let Some(file) = store.open(rel).map_err(io_err(rel))? else {
                continue;
            };
            let len = file.meta().map_err(io_err(rel))?.len;
            let index = match crate::store::shard::read_index(file.as_ref(), level, 0, len) {
                Ok(index) => index,
                Err(crate::store::shard::ReadIndexError::Index(e)) => {
                    report.skipped.push(Problem {
                        shard: rel.clone(),
                        what: format!("corrupt index, not compacted: {e}"),
                    });
                    continue;
                }
                Err(crate::store::shard::ReadIndexError::Io(e)) => return Err(io_err(rel)(e)),
            };
            let dead = crate::store::shard::dead_bytes(file.as_ref(), level, len, &index)
                .map_err(io_err(rel))?;
            stats.shards += 1;
            stats.bytes += len;
            stats.dead_bytes += dead;
            if dead == 0 || dead as f64 / len as f64 <= min_garbage {
                continue;
            }
            match store.rewrite_dense(rel, level)? {
                Some((old, new)) => {
                    stats.shards_rewritten += 1;
                    stats.bytes_reclaimed += old.saturating_sub(new);
                }
                None => report.skipped.push(Problem {
                    shard: rel.clone(),
                    what: "this store cannot rewrite shards here".into(),
                }),
            }
        }
        report.shards_rewritten += stats.shards_rewritten;
        report.bytes_reclaimed += stats.bytes_reclaimed;
        report.arrays.push(stats);
    }
    bar.finish_and_clear();
    Ok(report)
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.repaired {
            writeln!(f, "REPAIRED {}: {}", p.shard.display(), p.what)?;
        }
        for p in &self.problems {
            writeln!(f, "PROBLEM  {}: {}", p.shard.display(), p.what)?;
        }
        for p in &self.unchecked_arrays {
            writeln!(f, "skipped array {}: {}", p.shard.display(), p.what)?;
        }
        for p in &self.warnings {
            writeln!(f, "warning  {}: {}", p.shard.display(), p.what)?;
        }
        writeln!(
            f,
            "{} array{}, {} shards checked: {} problem{}, {} repaired",
            self.arrays,
            if self.arrays == 1 { "" } else { "s" },
            self.shards_checked,
            self.problem_count,
            if self.problem_count == 1 { "" } else { "s" },
            self.repaired_count
        )
    }
}

impl fmt::Display for CompactReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in self.recovered.iter().chain(&self.skipped) {
            writeln!(f, "{}: {}", p.shard.display(), p.what)?;
        }
        for a in &self.arrays {
            let path = a.path.display().to_string();
            writeln!(
                f,
                "{}: {} shards, {} bytes, {} dead before; {} shards rewritten, {} bytes reclaimed",
                if path.is_empty() { "/" } else { &path },
                a.shards,
                a.bytes,
                a.dead_bytes,
                a.shards_rewritten,
                a.bytes_reclaimed
            )?;
        }
        writeln!(
            f,
            "{} shards checked, {} rewritten, {} bytes reclaimed (threshold {} dead)",
            self.shards_checked, self.shards_rewritten, self.bytes_reclaimed, self.min_garbage
        )
    }
}
