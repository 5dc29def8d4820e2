//! Recovery of torn shard updates (being written).
