//! `shardfs compact`: shards whose dead space exceeds a fraction of the file rewritten
//! dense, under their directory's exclusive lock on a local store, or as one conditional
//! replacement on object storage. Not `verify`, and not the parsing of a shard's bytes
//! (index, close times, dead space: [`crate::format::shard_read`]).

use std::io;
use std::path::Path;

use super::report::{ArrayCompaction, CompactReport, Problem};
use super::walk::{progress_bar, sharded_arrays};
use crate::format::ShardLevel;
use crate::format::shard_read::{self, ReadError};
use crate::store::local::append::{self, CommitError, Current, Source};
use crate::store::local::recover::{self, Lock, ShardDir, io_at};
use crate::store::{LocalStore, Store};

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
            compact_shard(root, rel, level, min_garbage, &mut stats, &mut report)?;
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
            compact_stored_shard(store, rel, level, min_garbage, &mut stats, &mut report)?;
        }
        report.shards_rewritten += stats.shards_rewritten;
        report.bytes_reclaimed += stats.bytes_reclaimed;
        report.arrays.push(stats);
    }
    bar.finish_and_clear();
    Ok(report)
}

/// Compact shard `rel` of a local store (top index level `level`) under its directory's
/// exclusive lock, if its dead space exceeds `min_garbage`: recovered updates and a
/// corrupt index go to `report`, its sizes to `stats`.
fn compact_shard(
    root: &Path,
    rel: &Path,
    level: &ShardLevel,
    min_garbage: f64,
    stats: &mut ArrayCompaction,
    report: &mut CompactReport,
) -> Result<(), CommitError> {
    // Skipped and reported, as `verify` reports it: before, the whole run stopped there
    // (found by an adversarial tester).
    if let Some(what) = super::walk::not_a_file(root, rel) {
        report.skipped.push(Problem {
            shard: rel.to_path_buf(),
            what: format!("the shard path is {what}, not a regular file: not compacted"),
        });
        return Ok(());
    }
    let (dir_rel, name) = recover::split_rel(rel)?;
    let Some(dir) = ShardDir::open(root, dir_rel, false, Lock::Exclusive)? else {
        return Ok(());
    };
    for r in recover::recover_locked(&dir, name)? {
        report.recovered.push(Problem {
            shard: rel.to_path_buf(),
            what: r.to_string(),
        });
    }
    let cur = match Current::read(&dir, name, level) {
        Ok(cur) => cur,
        Err(CommitError::Corrupt { err, .. }) => {
            report.skipped.push(Problem {
                shard: rel.to_path_buf(),
                what: format!("corrupt index, not compacted: {err}"),
            });
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let Some(file) = &cur.file else { return Ok(()) };
    // The close-time block is live too: a compacted shard keeps it.
    let dead = shard_read::dead_space(level, cur.len, &cur.index, Some(&cur.times));
    stats.shards += 1;
    stats.bytes += cur.len;
    stats.dead_bytes += dead;
    if dead == 0 || dead as f64 / cur.len as f64 <= min_garbage {
        return Ok(());
    }
    let sources: Vec<_> = cur
        .index
        .entries()
        .iter()
        .map(|e| e.map(Source::Old))
        .collect();
    let (_, new_len) = append::rewrite(&dir, name, level, Some(file), &sources, &cur.times)?;
    stats.shards_rewritten += 1;
    stats.bytes_reclaimed += cur.len.saturating_sub(new_len);
    Ok(())
}

/// Compact shard `rel` of `store` (top index level `level`) by one conditional
/// replacement, if its dead space exceeds `min_garbage`: a corrupt index, or a store that
/// cannot rewrite it, goes to `report`, its sizes to `stats`.
fn compact_stored_shard(
    store: &dyn Store,
    rel: &Path,
    level: &ShardLevel,
    min_garbage: f64,
    stats: &mut ArrayCompaction,
    report: &mut CompactReport,
) -> Result<(), CommitError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: io::Error| CommitError::Io { path, source }
    };
    let Some(file) = store.open(rel).map_err(io_err(rel))? else {
        return Ok(());
    };
    let len = file.meta().map_err(io_err(rel))?.len;
    let index = match shard_read::read_index(file.as_ref(), level, 0, len) {
        Ok(index) => index,
        Err(ReadError::Index(e)) => {
            report.skipped.push(Problem {
                shard: rel.to_path_buf(),
                what: format!("corrupt index, not compacted: {e}"),
            });
            return Ok(());
        }
        Err(ReadError::Io(e)) => return Err(io_err(rel)(e)),
    };
    let dead =
        shard_read::read_dead_space(file.as_ref(), level, len, &index).map_err(io_err(rel))?;
    stats.shards += 1;
    stats.bytes += len;
    stats.dead_bytes += dead;
    if dead == 0 || dead as f64 / len as f64 <= min_garbage {
        return Ok(());
    }
    match store.rewrite_dense(rel, level)? {
        Some((old, new)) => {
            stats.shards_rewritten += 1;
            stats.bytes_reclaimed += old.saturating_sub(new);
        }
        None => report.skipped.push(Problem {
            shard: rel.to_path_buf(),
            what: "this store cannot rewrite shards here".into(),
        }),
    }
    Ok(())
}
