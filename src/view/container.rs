//! The seed's blosc containers in the tree, read-only: a bcolz carray rootdir shown as a
//! Zarr array at its own path, a ctable rootdir as a group of its columns, a bloscpack
//! file `F.blp` as a directory `F.blp` that is one Zarr array. Their chunk files are the
//! containers' own blosc frames; the short last chunk is decoded and re-encoded whole by
//! c-blosc ([`format::blosc`]). What is loaded is kept by store path and refreshed when
//! the files it came from change. Parsing is in `format` (`bcolz`, `bloscpack`,
//! `container`); writes into containers are refused (`EROFS`) by the write side.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::bcolz;
use crate::format::bloscpack::{self, Checksum, ChunkEntry};
use crate::format::container::{self, ShownArray};
use crate::store::Reads;

use super::*;

#[path = "container_load.rs"]
mod load;
#[cfg(test)]
#[path = "container_tests.rs"]
mod tests;

pub use load::inspect;
use load::{bloscpack_named, load_bloscpack, load_carray, load_ctable, stored_frame};

/// Names of files checked for being bloscpack files.
const BLOSCPACK_SUFFIXES: &[&str] = &[".blp", ".bp"];
/// Containers kept at most; the whole set is dropped when more are met.
const KEPT: usize = 4096;
/// Chunks kept read and checked, the latest: a reader of a chunk larger than one read
/// request (the kernel asks for 128 KiB at a time, by inode) checks it once, not at each
/// request.
const CHECKED_CHUNKS: usize = 32;
/// Larger chunks are read again at each request.
const MAX_CHECKED_CHUNK: usize = 16 << 20;

/// A container shown as a Zarr array.
#[derive(Debug)]
pub struct ContainerArray {
    /// Its path in the store and in the view.
    pub rel: PathBuf,
    /// `bcolz carray` or `bloscpack file`.
    pub what: &'static str,
    pub array: ShownArray,
    source: Source,
    /// The short last chunk re-encoded whole (set once loaded).
    last: LastChunk,
    /// Owner, mode and times of its directory (read-only).
    pub meta: EntryMeta,
    zarr_json: Arc<Vec<u8>>,
    zarray: Arc<Vec<u8>>,
    zattrs: Arc<Vec<u8>>,
}

/// Where the chunks' bytes are.
#[derive(Debug)]
enum Source {
    /// One chunk file each (`data/__i.blp`).
    Bcolz,
    /// Ranges of one file, each followed by its checksum.
    Bloscpack {
        chunks: Vec<ChunkEntry>,
        checksum: Checksum,
    },
}

/// The short last chunk re-encoded whole, or why it cannot be.
type LastChunk = Option<std::result::Result<Arc<Vec<u8>>, String>>;

/// A bcolz ctable shown as a group.
#[derive(Debug)]
pub struct ContainerGroup {
    pub rel: PathBuf,
    pub columns: Vec<String>,
    pub meta: EntryMeta,
    attributes: serde_json::Map<String, serde_json::Value>,
}

/// A node of a container.
#[derive(Clone, Debug)]
pub enum ContainerNode {
    Array(Arc<ContainerArray>),
    Group(Arc<ContainerGroup>),
    ArrayMeta(Arc<ContainerArray>, MetaFile),
    GroupMeta(Arc<ContainerGroup>, MetaFile),
    Chunk(Arc<ContainerArray>, u64),
}

impl ContainerNode {
    pub fn is_dir(&self) -> bool {
        matches!(self, ContainerNode::Array(..) | ContainerNode::Group(_))
    }
}

/// The containers of the tree: which store directories and files are containers, what
/// they show (children, listings, attributes, reads), and what was loaded, by store path,
/// with the version of the file it was loaded from. A part of the tree that owns its
/// state and logic: the view asks it by node (issue 35).
pub(super) struct Containers {
    store: Arc<dyn Store>,
    /// The store answers by request (object storage): a directory is listed once rather
    /// than looked up three times.
    by_request: bool,
    format: ViewFormat,
    known: Mutex<HashMap<PathBuf, (Vec<Version>, Loaded)>>,
    /// Chunks read and checked lately, by container and chunk.
    checked: Mutex<std::collections::VecDeque<(CheckedKey, Arc<Vec<u8>>)>>,
}

/// A store file's version ([`EntryMeta::version`]).
type Version = (u64, u64, std::time::SystemTime);
/// A chunk of a container, and the version of the container.
type CheckedKey = (PathBuf, u64, Version);

#[derive(Clone)]
enum Loaded {
    Node(ContainerNode),
    Broken(String),
}

impl ContainerArray {
    fn new(
        rel: PathBuf,
        what: &'static str,
        array: ShownArray,
        source: Source,
        meta: EntryMeta,
    ) -> ContainerArray {
        let mut array = array;
        // Named after the container, so that xarray can open a group of several.
        let stem = rel
            .file_name()
            .map_or("dim".into(), |n| n.to_string_lossy().into_owned());
        array.dimension_names = Some(
            (0..array.shape.len())
                .map(|k| format!("{stem}_{k}"))
                .collect(),
        );
        ContainerArray {
            zarr_json: Arc::new(array.zarr_json()),
            zarray: Arc::new(array.zarray()),
            zattrs: Arc::new(array.zattrs()),
            rel,
            what,
            array,
            source,
            last: None,
            meta,
        }
    }

    pub fn doc(&self, file: MetaFile) -> Option<Arc<Vec<u8>>> {
        match file {
            MetaFile::ZarrJson => Some(self.zarr_json.clone()),
            MetaFile::Zarray => Some(self.zarray.clone()),
            MetaFile::Zattrs => Some(self.zattrs.clone()),
            MetaFile::Zgroup => None,
        }
    }

    /// Whether chunk `i` is the short last one, shown re-encoded.
    fn is_short(&self, i: u64) -> bool {
        i + 1 == self.array.nchunks() && {
            let axis = self.array.chunk_axis();
            !self.array.shape[axis].is_multiple_of(self.array.chunk_len)
        }
    }
}

impl ContainerGroup {
    pub fn doc(&self, file: MetaFile) -> Option<Arc<Vec<u8>>> {
        Some(Arc::new(match file {
            MetaFile::ZarrJson => container::group_json(&self.attributes),
            MetaFile::Zgroup => container::zgroup(),
            MetaFile::Zattrs => {
                let mut out =
                    serde_json::to_vec_pretty(&self.attributes).expect("JSON of a JSON map");
                out.push(b'\n');
                out
            }
            MetaFile::Zarray => return None,
        }))
    }
}

/// A directory's mode as a read-only one: read and search where it could be read.
fn read_only_dir(mut m: EntryMeta) -> EntryMeta {
    let r = m.perm & 0o444;
    m.perm = r | (r >> 2);
    m
}

impl Containers {
    pub(super) fn new(store: Arc<dyn Store>, format: ViewFormat) -> Containers {
        Containers {
            by_request: store.capabilities().reads == Reads::Requests,
            store,
            format,
            known: Mutex::default(),
            checked: Mutex::default(),
        }
    }

    /// A store directory shown as a container: a carray or a ctable rootdir. `Ok(None)`:
    /// it is none. Broken: `EIO`, logged once.
    pub(super) fn dir(&self, rel: &Path, m: &EntryMeta) -> Result<Option<Node>> {
        if self.by_request {
            // Object storage: one listing (kept by the store's listing cache) rather than
            // three lookups of names that are mostly not there, each a HEAD and a LIST.
            let may_be = self.store.list(rel)?.iter().any(|e| {
                (e.name == bcolz::ROOTDIRS && e.kind == EntryKind::File)
                    || (e.name == "meta" && e.kind == EntryKind::Dir)
            });
            if !may_be {
                return Ok(None);
            }
        }
        let marks = [
            rel.join(bcolz::ROOTDIRS),
            rel.join(bcolz::SIZES),
            rel.join(bcolz::STORAGE),
        ];
        let mut versions = Vec::new();
        for mark in &marks {
            if let Some(m) = self.store.stat(mark)?
                && m.kind == EntryKind::File
            {
                versions.push(m.version());
            } else {
                versions.push((0, 0, std::time::UNIX_EPOCH));
            }
        }
        let ctable = versions[0].0 != 0 || versions[0].1 != 0;
        let carray = versions[1..].iter().all(|v| v.0 != 0 || v.1 != 0);
        if !ctable && !carray {
            return Ok(None);
        }
        versions.push(m.version());
        self.known(rel, versions, || {
            if ctable {
                load_ctable(self.store.as_ref(), rel, m)
            } else {
                load_carray(self.store.as_ref(), rel, m)
            }
        })
        .map(Some)
    }

    /// A store file shown as a container: a bloscpack file, named `*.blp` or `*.bp`.
    /// `Ok(None)`: it is none (another name, or no bloscpack magic).
    pub(super) fn file(&self, rel: &Path, m: &EntryMeta) -> Result<Option<Node>> {
        if !bloscpack_named(rel) || m.len < 4 {
            return Ok(None);
        }
        if let Some((v, loaded)) = self.known.lock().get(rel)
            && v == &[m.version()]
        {
            return shown(rel, loaded.clone()).map(Some);
        }
        let Some(file) = self.store.open(rel)? else {
            return Ok(None);
        };
        let mut magic = [0u8; 4];
        file.read_exact_at(&mut magic, 0)?;
        if &magic != bloscpack::MAGIC {
            return Ok(None);
        }
        self.known(rel, vec![m.version()], || {
            load_bloscpack(self.store.as_ref(), rel, file.as_ref(), m)
        })
        .map(Some)
    }

    /// The kind a listed store entry is shown as: a bloscpack file is a directory.
    pub(super) fn listed_kind(&self, dir: &Path, name: &OsStr, kind: Kind) -> Kind {
        if kind != Kind::File
            || !name
                .to_str()
                .is_some_and(|n| BLOSCPACK_SUFFIXES.iter().any(|s| n.ends_with(s)))
        {
            return kind;
        }
        let rel = dir.join(name);
        match self.store.stat(&rel) {
            Ok(Some(m)) => match self.file(&rel, &m) {
                Ok(Some(_)) => Kind::Dir,
                _ => kind,
            },
            _ => kind,
        }
    }

    fn known(
        &self,
        rel: &Path,
        version: Vec<Version>,
        load: impl FnOnce() -> std::result::Result<ContainerNode, String>,
    ) -> Result<Node> {
        if let Some((v, loaded)) = self.known.lock().get(rel)
            && *v == version
        {
            return shown(rel, loaded.clone());
        }
        let loaded = match load() {
            Ok(node) => Loaded::Node(node),
            Err(why) => {
                log::warn!("{}: {why}", rel.display());
                Loaded::Broken(why)
            }
        };
        let mut known = self.known.lock();
        if known.len() >= KEPT {
            known.clear();
        }
        known.insert(rel.to_path_buf(), (version, loaded.clone()));
        drop(known);
        shown(rel, loaded)
    }

    /// The bytes of a chunk file of the view: the stored frame, or the short last
    /// chunk re-encoded. Broken: `EIO` and one log line.
    pub(super) fn chunk(&self, a: &ContainerArray, i: u64) -> Result<Arc<Vec<u8>>> {
        // With the version of the container's file or directory: a replaced one is read anew.
        let key = (a.rel.clone(), i, a.meta.version());
        let res = if a.is_short(i) {
            match &a.last {
                Some(r) => r.clone(),
                None => Err("no last chunk".to_string()),
            }
        } else if let Some((_, b)) = self.checked.lock().iter().find(|(k, _)| *k == key) {
            Ok(b.clone())
        } else {
            let res = stored_frame(self.store.as_ref(), a, i).map(Arc::new);
            if let Ok(b) = &res
                && b.len() <= MAX_CHECKED_CHUNK
            {
                let mut checked = self.checked.lock();
                if checked.len() >= CHECKED_CHUNKS {
                    checked.pop_front();
                }
                checked.push_back((key, b.clone()));
            }
            res
        };
        res.map_err(|why| {
            log::warn!("{} ({}): chunk {i}: {why}", a.rel.display(), a.what);
            ViewError::Container {
                path: a.rel.clone(),
                why,
            }
        })
    }

    /// The size of a chunk file of the view (bcolz: the chunk file's, less its header).
    fn chunk_len(&self, a: &ContainerArray, i: u64) -> Result<u64> {
        if a.is_short(i) {
            return Ok(match &a.last {
                Some(Ok(b)) => b.len() as u64,
                _ => 0,
            });
        }
        match &a.source {
            Source::Bcolz => {
                let m = (self.store.stat(&a.rel.join(bcolz::chunk_file(i))))?
                    .ok_or(ViewError::NotFound)?;
                Ok(m.len.saturating_sub(bcolz::CHUNK_HEADER_LEN as u64))
            }
            Source::Bloscpack { chunks, .. } => {
                Ok(chunks.get(i as usize).map_or(0, ChunkEntry::frame_len))
            }
        }
    }

    /// The child `name` of a container directory.
    pub(super) fn child(&self, c: &ContainerNode, name: &OsStr) -> Result<Option<Node>> {
        let v2 = self.format == ViewFormat::V2;
        Ok(match c {
            ContainerNode::Array(a) => {
                if let Some(file) = MetaFile::from_name(name)
                    && self.format.array_files().contains(&file)
                {
                    return Ok(Some(Node::Container(ContainerNode::ArrayMeta(
                        a.clone(),
                        file,
                    ))));
                }
                name.to_str()
                    .and_then(|n| a.array.parse_key(n, v2))
                    .map(|i| Node::Container(ContainerNode::Chunk(a.clone(), i)))
            }
            ContainerNode::Group(g) => {
                if let Some(file) = MetaFile::from_name(name)
                    && self.format.group_files().contains(&file)
                {
                    return Ok(Some(Node::Container(ContainerNode::GroupMeta(
                        g.clone(),
                        file,
                    ))));
                }
                if !g.columns.iter().any(|c| OsStr::new(c) == name) {
                    return Ok(None);
                }
                let rel = g.rel.join(name);
                match self.store.stat(&rel)? {
                    Some(m) if m.kind == EntryKind::Dir => self.dir(&rel, &m)?,
                    _ => None,
                }
            }
            _ => return Err(ViewError::NotDir),
        })
    }

    /// The entries of a container directory.
    pub(super) fn list(&self, c: &ContainerNode) -> Result<Vec<DirEntry>> {
        let entry = |name: String, kind| DirEntry {
            ino: 0,
            name: name.into(),
            kind,
        };
        let v2 = self.format == ViewFormat::V2;
        Ok(match c {
            ContainerNode::Array(a) => self
                .format
                .array_files()
                .iter()
                .map(|f| entry(f.name().into(), Kind::File))
                .chain((0..a.array.nchunks()).map(|i| entry(a.array.key(i, v2), Kind::File)))
                .collect(),
            ContainerNode::Group(g) => self
                .format
                .group_files()
                .iter()
                .map(|f| entry(f.name().into(), Kind::File))
                .chain(g.columns.iter().map(|c| entry(c.clone(), Kind::Dir)))
                .collect(),
            _ => return Err(ViewError::NotDir),
        })
    }

    /// The attributes of a container node.
    pub(super) fn attr(&self, ino: u64, c: &ContainerNode) -> Result<Attr> {
        let file_meta = |m: &EntryMeta| EntryMeta {
            perm: m.perm & 0o444,
            ..*m
        };
        Ok(match c {
            ContainerNode::Array(a) => Attr::from_meta(ino, Kind::Dir, 0, &a.meta),
            ContainerNode::Group(g) => Attr::from_meta(ino, Kind::Dir, 0, &g.meta),
            ContainerNode::ArrayMeta(a, f) => {
                let len = a.doc(*f).map_or(0, |d| d.len() as u64);
                Attr::from_meta(ino, Kind::File, len, &file_meta(&a.meta))
            }
            ContainerNode::GroupMeta(g, f) => {
                let len = g.doc(*f).map_or(0, |d| d.len() as u64);
                Attr::from_meta(ino, Kind::File, len, &file_meta(&g.meta))
            }
            ContainerNode::Chunk(a, i) => {
                let len = self.chunk_len(a, *i)?;
                Attr::from_meta(ino, Kind::File, len, &file_meta(&a.meta))
            }
        })
    }

    /// What reads of a container node are served from.
    pub(super) fn reader(&self, c: &ContainerNode) -> Result<Handle> {
        Ok(match c {
            ContainerNode::Array(_) | ContainerNode::Group(_) => return Err(ViewError::IsDir),
            ContainerNode::ArrayMeta(a, f) => Handle::Bytes(a.doc(*f).ok_or(ViewError::NotFound)?),
            ContainerNode::GroupMeta(g, f) => Handle::Bytes(g.doc(*f).ok_or(ViewError::NotFound)?),
            ContainerNode::Chunk(a, i) => Handle::Bytes(self.chunk(a, *i)?),
        })
    }
}

/// A loaded container as a node, or why it cannot be read (`EIO`).
fn shown(rel: &Path, loaded: Loaded) -> Result<Node> {
    match loaded {
        Loaded::Node(n) => Ok(Node::Container(n)),
        Loaded::Broken(why) => Err(ViewError::Container {
            path: rel.to_path_buf(),
            why,
        }),
    }
}

/// `EROFS` where any of `nodes` is in a container: they are shown read-only.
pub(super) fn refuse_writes(nodes: &[Option<&Node>]) -> Result<()> {
    if nodes
        .iter()
        .flatten()
        .any(|n| matches!(n, Node::Container(_)))
    {
        return Err(ViewError::ReadOnly);
    }
    Ok(())
}
