//! `shardfs verify`: every shard of every sharded array checked ([`super::check`]) under
//! its directory's shared lock, leftovers of interrupted updates reported; `--repair`
//! recovers those and cuts torn tails back ([`super::scan`]). Object storage is checked
//! through the store, with nothing to recover. Not `compact`.

use std::io;
use std::path::Path;

use rustix::fs::OFlags;

use super::check::{Checked, check, check_nothing};
use super::report::{Problem, VerifyReport};
use super::scan;
use super::walk::{progress_bar, sharded_arrays};
use crate::format::{self, ShardLayout};
use crate::store::local::FileRef;
use crate::store::local::append::CommitError;
use crate::store::local::recover::{self, APPEND_SUFFIX, Lock, ShardDir, TEMP_SUFFIX, io_at};
use crate::store::{LocalStore, Store};

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
    if let Some(what) = super::walk::not_a_file(root, rel) {
        let mut c = check_nothing();
        c.problems.push(format!(
            "the shard path is {what}, not a regular file: its chunks read as EIO"
        ));
        return Ok(c);
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
