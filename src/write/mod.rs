//! The write path: open-file buffers, per-shard staging, flush policy, compaction, and
//! crash-safe shard updates.

pub mod append;
pub mod flush;
pub mod recover;
pub mod staging;
