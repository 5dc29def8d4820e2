//! Crash-safe shard updates (being written).
