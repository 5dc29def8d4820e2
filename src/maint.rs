//! `shardfs verify` and `shardfs compact` (being written).
