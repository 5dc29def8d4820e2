//! The write path: staged chunks and their close times, the flush policy, and the merge
//! rule (last close wins) every store's shard commit applies. Where bytes live and how a
//! shard update is made durable is the store's (`store::local::append` for a directory).

pub mod flush;
pub mod merge;
pub mod staging;
