//! Bytes and documents of sharded Zarr: shard indices, chunk keys, `zarr.json` and the
//! rewritten unsharded metadata, the grid arithmetic that ties them together; the seed's
//! blosc containers (bcolz rootdirs, bloscpack files) and the Zarr arrays they are shown as.
//!
//! Pure functions only: nothing here opens a file (`shard_read` reads a shard through
//! the caller's [`shard_read::ByteSource`]). The byte layout is mirrored in
//! `docs/FORMAT.md`.

pub mod bcolz;
pub mod blosc;
pub mod bloscpack;
pub mod container;
pub mod draft;
pub mod fill;
#[cfg(test)]
mod fuzz_tests;
pub mod index;
pub mod key;
pub mod layout;
pub mod metadata;
pub mod ome;
pub mod shard_read;
pub mod shard_write;
pub mod times;
pub mod v2;

pub use index::{ChunkRange, Endian, IndexCodecs, IndexError, IndexLocation, ShardIndex};
pub use key::{ChunkKeyEncoding, KeyKind, KeyPath};
pub use layout::{Location, ShardLayout, ShardLevel};
pub use metadata::{ArrayMeta, MetadataError, Node, Presentation};
pub use times::CloseTimes;
