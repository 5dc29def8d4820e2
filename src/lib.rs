//! shardfs: mount a sharded Zarr v3 store and see it unsharded.
//!
//! Layers, each testable on its own (see `docs/`):
//! `format` (bytes, no I/O) → `store` (the backing directory) → `view` (the virtual tree,
//! no FUSE types) → `fuse` (a thin adapter) → `mount` (sessions, the unmount guard; what it
//! opens and checks first is `mount_target`, its mount point and daemon `mountpoint`).
//! How long each cache of those layers uses an answer again is one policy, decided at
//! mount: `freshness`.

pub mod cli;
pub mod compact;
pub mod daemon;
pub mod demo;
pub mod format;
pub mod freshness;
pub mod fuse;
pub mod info;
pub mod maint;
pub mod mount;
mod mount_target;
mod mountpoint;
pub mod sample;
pub mod store;
pub mod view;
pub mod write;

pub use mount::{Mount, MountOptions};
