//! What a path of the mount is: the node kinds of the virtual tree and the sharded array
//! they hang off.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use crate::format::{ArrayMeta, ChunkKeyEncoding, ShardLayout};
use crate::store::EntryMeta;

/// A sharded array the view presents unsharded.
#[derive(Debug)]
pub struct ShardedArray {
    /// The array's directory in the store.
    pub rel: PathBuf,
    pub meta: ArrayMeta,
    pub layout: ShardLayout,
    /// The unsharded `zarr.json` the view serves.
    pub json: Arc<Vec<u8>>,
    /// The array directory's store metadata: owner, mode and times of virtual entries.
    pub dir_meta: EntryMeta,
    /// The stored `zarr.json`'s metadata.
    pub json_meta: EntryMeta,
}

impl ShardedArray {
    pub fn encoding(&self) -> ChunkKeyEncoding {
        self.meta.key_encoding
    }

    /// Store path of the shard at shard-grid coordinates `shard`.
    pub fn shard_rel(&self, shard: &[u64]) -> PathBuf {
        self.rel.join(self.encoding().encode(shard))
    }

    /// Store path of the directory holding shards whose leading coordinates are `prefix`.
    pub fn shard_dir_rel(&self, prefix: &[u64]) -> PathBuf {
        let mut p = self.rel.clone();
        for c in self.encoding().dir_components(self.layout.ndim(), prefix) {
            p.push(c);
        }
        p
    }

    /// Leading shard coordinates of the inner-chunk prefix `prefix`.
    pub fn shard_prefix(&self, prefix: &[u64]) -> Vec<u64> {
        prefix
            .iter()
            .zip(self.layout.inner_per_shard())
            .map(|(c, s)| c / s)
            .collect()
    }
}

/// A node of the virtual tree.
#[derive(Clone, Debug)]
pub enum Node {
    /// A store directory shown as it is (groups, plain arrays, anything).
    Dir {
        rel: PathBuf,
    },
    /// A store file shown byte for byte.
    File {
        rel: PathBuf,
    },
    Symlink {
        rel: PathBuf,
    },
    /// A sharded array's directory.
    ArrayDir {
        array: Arc<ShardedArray>,
    },
    /// The rewritten `zarr.json` of a sharded array.
    ArrayMeta {
        array: Arc<ShardedArray>,
    },
    /// A directory of chunk keys (`c/`, `c/3/`): the keys' leading coordinates.
    KeyDir {
        array: Arc<ShardedArray>,
        coords: Vec<u64>,
    },
    /// One stored (or staged) inner chunk.
    Chunk {
        array: Arc<ShardedArray>,
        coords: Vec<u64>,
    },
    /// `/.shardfs-stats`: the daemon's counters as JSON (not listed).
    Stats,
    /// An in-memory file in an array's namespace (a writer's temporary file, or a chunk
    /// open for writing): `parent` is the key directory it is in (`None`: the array dir).
    Scratch {
        path: PathBuf,
        array: Arc<ShardedArray>,
        parent: Option<Vec<u64>>,
    },
}

/// File type as the mount reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
}

impl Node {
    pub fn kind(&self) -> Kind {
        match self {
            Node::Dir { .. } | Node::ArrayDir { .. } | Node::KeyDir { .. } => Kind::Dir,
            Node::File { .. }
            | Node::ArrayMeta { .. }
            | Node::Chunk { .. }
            | Node::Scratch { .. }
            | Node::Stats => Kind::File,
            Node::Symlink { .. } => Kind::Symlink,
        }
    }
}

/// Attributes of a node, free of FUSE types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

impl Attr {
    pub(crate) fn from_meta(ino: u64, kind: Kind, size: u64, m: &EntryMeta) -> Attr {
        Attr {
            ino,
            kind,
            size,
            perm: m.perm,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            uid: m.uid,
            gid: m.gid,
            mtime: m.mtime,
            ctime: m.ctime,
        }
    }
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub name: std::ffi::OsString,
    pub kind: Kind,
}
