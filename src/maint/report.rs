//! What `verify` and `compact` report: one finding per shard ([`Problem`]), the reports
//! as JSON (`Serialize`) and as the lines the command prints (`Display`). Not how they
//! are found ([`mod@super::verify`], [`mod@super::compact`]).

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

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
