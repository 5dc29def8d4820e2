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
//!
//! Laid out as `verify` and `compact` over `check` (one shard's bytes), `walk` (the
//! arrays and their shards) and `report` (what both report).

mod check;
mod compact;
mod report;
mod scan;
#[cfg(test)]
mod tests;
mod verify;
mod walk;

pub use compact::{compact, compact_store};
pub use report::{ArrayCompaction, CompactReport, Problem, VerifyReport};
pub use verify::{verify, verify_store};
