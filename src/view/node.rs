//! What a path of the mount is: the node kinds of the virtual tree and the sharded array
//! they hang off.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use crate::format::{ArrayMeta, ChunkKeyEncoding, ShardLayout};
use crate::store::EntryMeta;

/// The `.zarray` and `.zattrs` the v2 view serves for an array.
pub type V2Docs = (Arc<Vec<u8>>, Arc<Vec<u8>>);

/// A sharded array the view presents unsharded.
#[derive(Clone, Debug)]
pub struct ShardedArray {
    /// The array's directory in the view; in a store of the final layout also its
    /// directory in the store.
    pub rel: PathBuf,
    /// Where the shards are: `rel`, or `data/root/<path>` in the draft layout.
    pub data_rel: PathBuf,
    /// The store file of its metadata: `rel/zarr.json`, or `meta/root/<path>.array.json`.
    pub meta_rel: PathBuf,
    /// Keys of the shards in the store.
    pub store_keys: ChunkKeyEncoding,
    /// Keys of the inner chunks in the view.
    pub shown_keys: ChunkKeyEncoding,
    /// From a store of the 2022 draft layout (read-only).
    pub draft: bool,
    pub meta: ArrayMeta,
    pub layout: ShardLayout,
    /// The unsharded `zarr.json` the view serves.
    pub json: Arc<Vec<u8>>,
    /// `.zarray` and `.zattrs` (the v2 view only).
    pub v2: Option<V2Docs>,
    /// The v2 view: the chunk served at keys of the grid that the store has no chunk
    /// for, where `.zarray` shows another fill value than the v3 one
    /// ([`crate::format::fill`]).
    pub v2_fill: Option<Arc<Vec<u8>>>,
    /// The array directory's store metadata: owner, mode and times of virtual entries.
    pub dir_meta: EntryMeta,
    /// The stored `zarr.json`'s metadata.
    pub json_meta: EntryMeta,
}

impl ShardedArray {
    /// Whether `now`, the array the store now describes at this one's path, is another
    /// array than the one chunks were staged for: one of another layout (chunks that
    /// would land in other slots or shards, or be encoded otherwise: all but the shape
    /// must agree), or one in another directory (removed and made again: a disk gives the
    /// new one another inode).
    pub(super) fn replaced_by(&self, now: &ShardedArray) -> bool {
        let (a, b) = (&self.layout, &now.layout);
        let same_placement = a.shard_shape == b.shard_shape
            && a.levels == b.levels
            && a.inner_codecs == b.inner_codecs
            && a.fixed_chunk_len == b.fixed_chunk_len;
        let (i, j) = (self.dir_meta.ino, now.dir_meta.ino);
        !same_placement || (i != 0 && j != 0 && i != j)
    }

    /// The array as it is after its directory (or one above it), store path `from`,
    /// moved to `to`; `None` for an array of the draft layout (never moved) or one not
    /// below `from`.
    pub fn moved(&self, from: &std::path::Path, to: &std::path::Path) -> Option<ShardedArray> {
        if self.draft {
            return None;
        }
        let rel = to.join(self.rel.strip_prefix(from).ok()?);
        Some(ShardedArray {
            data_rel: rel.clone(),
            meta_rel: rel.join("zarr.json"),
            rel,
            ..self.clone()
        })
    }

    /// The encoding of the chunk keys the view shows.
    pub fn encoding(&self) -> ChunkKeyEncoding {
        self.shown_keys
    }

    /// The bytes of one of its metadata files.
    pub fn meta_bytes(&self, file: MetaFile) -> Arc<Vec<u8>> {
        match (file, &self.v2) {
            (MetaFile::Zarray, Some((z, _))) => z.clone(),
            (MetaFile::Zattrs, Some((_, a))) => a.clone(),
            _ => self.json.clone(),
        }
    }

    /// Store path of the shard at shard-grid coordinates `shard`.
    pub fn shard_rel(&self, shard: &[u64]) -> PathBuf {
        self.data_rel.join(self.store_keys.encode(shard))
    }

    /// Store path of the directory holding shards whose leading coordinates are `prefix`.
    pub fn shard_dir_rel(&self, prefix: &[u64]) -> PathBuf {
        let mut p = self.data_rel.clone();
        for c in self.store_keys.dir_components(self.layout.ndim(), prefix) {
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
    /// The rewritten `zarr.json` of a sharded array (`.zarray`, `.zattrs` in the v2 view).
    ArrayMeta {
        array: Arc<ShardedArray>,
        file: MetaFile,
    },
    /// A metadata file made for a group: `.zgroup` and `.zattrs` in the v2 view, and
    /// every group's `zarr.json` in a store of the draft layout. `dir` is its directory
    /// in the view.
    GroupMeta {
        dir: PathBuf,
        file: MetaFile,
    },
    /// A group of a store of the draft layout: a directory of the view only.
    DraftGroup {
        path: PathBuf,
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
    /// The v2 view of an unsharded array whose `.zarray` shows another fill value than
    /// the v3 one ([`crate::format::fill`]): a chunk key of its grid that the store has no
    /// file for, served as a chunk of the v3 fill value; found by name, never listed.
    /// `rel` is the store path the chunk would have (a write makes it there).
    PlainFill {
        rel: PathBuf,
        array: PathBuf,
        data: Arc<Vec<u8>>,
    },
    /// Likewise a key directory (nested keys) the store has no directory for: found by
    /// name, empty when listed, made in the store by the first file made in it.
    PlainFillDir {
        rel: PathBuf,
        array: PathBuf,
    },
    /// A node of a blosc container (bcolz rootdir, bloscpack file) shown read-only as
    /// Zarr (`super::container`).
    Container(super::container::ContainerNode),
    /// `.zmetadata` of a group in the v2 view: zarr 2's consolidated metadata, made from
    /// the hierarchy below `dir` as it is now, never stored (`TreeRead::consolidated`).
    Consolidated {
        dir: PathBuf,
    },
}

/// The metadata files the view makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetaFile {
    ZarrJson,
    Zarray,
    Zattrs,
    Zgroup,
}

impl MetaFile {
    pub fn name(self) -> &'static str {
        match self {
            MetaFile::ZarrJson => "zarr.json",
            MetaFile::Zarray => crate::format::v2::ZARRAY,
            MetaFile::Zattrs => crate::format::v2::ZATTRS,
            MetaFile::Zgroup => crate::format::v2::ZGROUP,
        }
    }

    pub fn from_name(name: &std::ffi::OsStr) -> Option<MetaFile> {
        [
            MetaFile::ZarrJson,
            MetaFile::Zarray,
            MetaFile::Zattrs,
            MetaFile::Zgroup,
        ]
        .into_iter()
        .find(|f| name == f.name())
    }
}

/// Which Zarr version the view shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ViewFormat {
    /// Zarr v3: `zarr.json`, the arrays' own chunk key encodings.
    #[default]
    V3,
    /// Zarr v2: `.zarray`, `.zattrs`, `.zgroup`, v2 chunk keys.
    V2,
}

impl ViewFormat {
    /// The metadata files of an array in this view.
    pub fn array_files(self) -> &'static [MetaFile] {
        match self {
            ViewFormat::V3 => &[MetaFile::ZarrJson],
            ViewFormat::V2 => &[MetaFile::Zarray, MetaFile::Zattrs],
        }
    }

    /// The metadata files of a group in this view.
    pub fn group_files(self) -> &'static [MetaFile] {
        match self {
            ViewFormat::V3 => &[MetaFile::ZarrJson],
            ViewFormat::V2 => &[MetaFile::Zgroup, MetaFile::Zattrs],
        }
    }
}

/// File type as the mount reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Dir,
    File,
    Symlink,
}

impl Node {
    pub fn kind(&self) -> Kind {
        match self {
            Node::Dir { .. }
            | Node::ArrayDir { .. }
            | Node::KeyDir { .. }
            | Node::DraftGroup { .. }
            | Node::PlainFillDir { .. } => Kind::Dir,
            Node::File { .. }
            | Node::PlainFill { .. }
            | Node::Consolidated { .. }
            | Node::ArrayMeta { .. }
            | Node::GroupMeta { .. }
            | Node::Chunk { .. }
            | Node::Scratch { .. }
            | Node::Stats => Kind::File,
            Node::Symlink { .. } => Kind::Symlink,
            Node::Container(c) if c.is_dir() => Kind::Dir,
            Node::Container(_) => Kind::File,
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
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// Changes at every look (the stats file): the kernel must not cache these
    /// attributes, so that each read sees the size and time of now.
    pub volatile: bool,
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
            atime: m.mtime,
            mtime: m.mtime,
            ctime: m.ctime,
            volatile: false,
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

/// What a name written inside an array is (`Tree::target`, commit.rs): a metadata
/// document, a chunk at its coordinates, a file of its own (scratch), or refused (why).
pub(super) enum Target {
    Meta(MetaFile),
    Chunk(Vec<u64>),
    Scratch,
    Invalid(String),
}
