//! `shardfs info`: what a store holds — every array with its shapes, codecs, shards,
//! stored inner chunks and bytes. Reads each shard's index, never its chunks.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::format::metadata::codec_name;
use crate::format::{self, ArrayMeta, KeyPath, Node, Presentation, ShardLayout};
use crate::store::shard::Shard;
use crate::store::{EntryKind, Store};

/// One array of a store.
#[derive(Debug, Serialize)]
pub struct ArrayInfo {
    pub path: String,
    /// `sharded`, `plain`, or `passthrough` (a sharded array the view cannot present);
    /// for the seed's blosc containers `bcolz carray`, `bcolz ctable column`, `bloscpack
    /// file`, or `container (unreadable)` with the reason.
    pub status: String,
    /// Why the array passes through, for `passthrough`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub shape: Vec<u64>,
    pub data_type: String,
    /// The chunk grid's chunk shape (the shard shape for sharded arrays).
    pub chunk_shape: Vec<u64>,
    /// Innermost chunk shape (what the view shows); equals `chunk_shape` when not sharded.
    pub inner_chunk_shape: Vec<u64>,
    /// Codec names of the view's chain (innermost for sharded arrays).
    pub codecs: Vec<String>,
    pub nesting_levels: usize,
    pub shards: u64,
    pub stored_chunks: u64,
    /// Bytes of all shard files.
    pub bytes: u64,
    /// Bytes of live inner chunks.
    pub live_bytes: u64,
    /// Bytes no index points at (overwritten chunks, old indices): `shardfs compact`
    /// reclaims them.
    pub dead_bytes: u64,
    /// Shards whose index cannot be read, with the reason.
    pub corrupt_shards: Vec<(String, String)>,
    /// `shown` when `--format v2` shows the array, else why it is left out.
    pub v2_view: String,
    /// The store's layout: `v3`, or `draft` (the 2022 sharding storage transformer).
    pub layout: String,
}

/// Every array under the store's root, in path order.
pub fn inspect(store: &dyn Store) -> std::io::Result<Vec<ArrayInfo>> {
    let mut out = Vec::new();
    let entry = store.read_all(Path::new("zarr.json"))?;
    if entry.is_some_and(|b| format::draft::is_entry_point(&b)) {
        walk_draft(store, PathBuf::new(), &mut out)?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        return Ok(out);
    }
    walk(store, PathBuf::new(), &mut out)?;
    walk_containers(store, PathBuf::new(), &mut out)?;
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The blosc containers (bcolz rootdirs, bloscpack files) outside arrays, each shown as
/// the view shows it: a carray or bloscpack file as an array, a ctable's columns.
fn walk_containers(
    store: &dyn Store,
    dir: PathBuf,
    out: &mut Vec<ArrayInfo>,
) -> std::io::Result<()> {
    use crate::view::container::{self, ContainerNode};
    let mut entries = store.list(&dir)?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in entries {
        let rel = dir.join(&e.name);
        let Some(m) = store.stat(&rel)? else { continue };
        match container::inspect(store, &rel, &m)? {
            Some(Ok(ContainerNode::Group(g))) => {
                for col in &g.columns {
                    let crel = rel.join(col);
                    let shown = match store.stat(&crel)? {
                        Some(cm) => container::inspect(store, &crel, &cm)?,
                        None => None,
                    };
                    let shown = shown.unwrap_or_else(|| Err("no carray rootdir".into()));
                    out.push(container_info(&crel, "bcolz ctable column", shown));
                }
            }
            Some(shown) => out.push(container_info(&rel, "", shown)),
            None if e.kind == EntryKind::Dir => {
                // Arrays are not walked into; groups and plain directories are.
                let array = store
                    .read_all(&rel.join("zarr.json"))
                    .ok()
                    .flatten()
                    .is_some_and(|b| matches!(format::metadata::parse(&b), Ok(Node::Array(_))));
                if !array {
                    walk_containers(store, rel, out)?;
                }
            }
            None => {}
        }
    }
    Ok(())
}

fn container_info(
    rel: &Path,
    status: &str,
    shown: Result<crate::view::container::ContainerNode, String>,
) -> ArrayInfo {
    use crate::view::container::ContainerNode;
    let mut info = ArrayInfo {
        path: rel.to_string_lossy().into_owned(),
        status: "container (unreadable)".into(),
        reason: None,
        shape: vec![],
        data_type: String::new(),
        chunk_shape: vec![],
        inner_chunk_shape: vec![],
        codecs: vec![],
        nesting_levels: 0,
        shards: 0,
        stored_chunks: 0,
        bytes: 0,
        live_bytes: 0,
        dead_bytes: 0,
        corrupt_shards: vec![],
        v2_view: "shown".into(),
        layout: "v3".into(),
    };
    match shown {
        Ok(ContainerNode::Array(a)) => {
            let z = &a.array;
            info.status = if status.is_empty() { a.what } else { status }.into();
            info.shape = z.shape.clone();
            info.data_type = z.dtype.v3_name();
            info.chunk_shape = z.chunk_shape();
            info.inner_chunk_shape = z.chunk_shape();
            info.codecs = vec![format!(
                "blosc ({}, level {}, shuffle {}, typesize {})",
                z.codec.cname, z.codec.clevel, z.codec.shuffle, z.codec.typesize
            )];
            info.stored_chunks = z.nchunks();
        }
        Ok(_) => info.reason = Some("not an array".into()),
        Err(why) => {
            info.reason = Some(why);
            info.v2_view = "left out (EIO)".into();
        }
    }
    info
}

fn walk(store: &dyn Store, dir: PathBuf, out: &mut Vec<ArrayInfo>) -> std::io::Result<()> {
    for_each_array(store, dir, &mut |dir, meta| {
        out.push(array_info(store, &dir, &dir, &meta, meta.key_encoding));
        Ok(())
    })
}

/// Visit every array of the (v3) hierarchy at and below `dir`, directories in name
/// order: a directory whose `zarr.json` is an array is visited and not descended into;
/// a group, a directory without `zarr.json` or one whose `zarr.json` does not parse
/// (logged) is descended into.
pub(crate) fn for_each_array(
    store: &dyn Store,
    dir: PathBuf,
    visit: &mut dyn FnMut(PathBuf, ArrayMeta) -> std::io::Result<()>,
) -> std::io::Result<()> {
    for_each_array_or_bad(store, dir, visit, &mut |rel, e| {
        log::warn!("{}: {e}", rel.display())
    })
}

/// [`for_each_array`], with each `zarr.json` that is no valid document passed to `bad`
/// (its path, and why).
pub(crate) fn for_each_array_or_bad(
    store: &dyn Store,
    dir: PathBuf,
    visit: &mut dyn FnMut(PathBuf, ArrayMeta) -> std::io::Result<()>,
    bad: &mut dyn FnMut(PathBuf, String),
) -> std::io::Result<()> {
    match store.read_all(&dir.join("zarr.json")) {
        Ok(Some(bytes)) => match format::metadata::parse(&bytes) {
            Ok(Node::Array(meta)) => return visit(dir, *meta),
            Ok(Node::Group) => {}
            Err(e) => bad(dir.join("zarr.json"), e.to_string()),
        },
        // An array whose metadata a writable mount unlinked while its other names stay
        // (`store::UNLINKED_META`): its shards are walked with the document kept (before,
        // `verify` and `info` left them out: found by an adversarial tester).
        Ok(None) => {
            if let Ok(Some(bytes)) = store.read_all(&dir.join(crate::store::UNLINKED_META))
                && let Ok(Node::Array(meta)) = format::metadata::parse(&bytes)
            {
                return visit(dir, *meta);
            }
        }
        // A zarr.json that cannot be read (a directory, say): this one node is left
        // out, the rest of the store is still walked.
        Err(e) => log::warn!("{}/zarr.json: {e}", dir.display()),
    }
    let mut entries = store.list(&dir)?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in entries {
        if e.kind == EntryKind::Dir {
            for_each_array_or_bad(store, dir.join(&e.name), visit, bad)?;
        }
    }
    Ok(())
}

/// The arrays of a store of the 2022 draft layout, below `meta/root/<path>`.
fn walk_draft(store: &dyn Store, path: PathBuf, out: &mut Vec<ArrayInfo>) -> std::io::Result<()> {
    use format::draft;
    let meta_dir = Path::new(draft::META_ROOT).join(&path);
    for e in store.list(&meta_dir).unwrap_or_default() {
        let Some(name) = e.name.to_str() else {
            continue;
        };
        if e.kind == EntryKind::Dir {
            walk_draft(store, path.join(name), out)?;
            continue;
        }
        let Some(stem) = name.strip_suffix(draft::ARRAY_SUFFIX) else {
            continue;
        };
        let Some(bytes) = store.read_all(&meta_dir.join(name))? else {
            continue;
        };
        let parsed = draft::array(&bytes).and_then(|(doc, keys)| {
            let b =
                serde_json::to_vec(&serde_json::Value::Object(doc)).map_err(|e| e.to_string())?;
            match format::metadata::parse(&b).map_err(|e| e.to_string())? {
                Node::Array(meta) => Ok((meta, keys)),
                Node::Group => Err("not an array".into()),
            }
        });
        match parsed {
            Ok((meta, keys)) => {
                let data = Path::new(draft::DATA_ROOT).join(path.join(stem));
                let mut info = array_info(store, &path.join(stem), &data, &meta, keys);
                info.layout = "draft".into();
                out.push(info);
            }
            Err(why) => log::warn!("{}: {why}", meta_dir.join(name).display()),
        }
    }
    Ok(())
}

/// Whether the v2 view shows an array, or why not.
fn v2_status(meta: &ArrayMeta, keys: format::ChunkKeyEncoding) -> String {
    match &meta.presentation {
        Presentation::Sharded(l) => match format::v2::zarray(
            &meta.doc,
            &l.shape,
            l.inner_chunk_shape(),
            &l.inner_codecs,
            format::v2::shown_keys(keys),
        ) {
            Ok(_) => "shown".into(),
            Err(why) => format!("left out: {why}"),
        },
        Presentation::Plain => match format::v2::plain_zarray(&meta.doc) {
            Ok(_) => "shown (not sharded: its chunk files pass through at v2 keys)".into(),
            Err(why) => format!("left out: {why}"),
        },
        Presentation::Unsupported(why) => format!("left out: {why}"),
    }
}

fn array_info(
    store: &dyn Store,
    dir: &Path,
    data_dir: &Path,
    meta: &ArrayMeta,
    keys: format::ChunkKeyEncoding,
) -> ArrayInfo {
    let grid_shape: Vec<u64> = meta.doc["chunk_grid"]["configuration"]["chunk_shape"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
        .unwrap_or_default();
    let names = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().map(|c| codec_name(c).to_string()).collect())
            .unwrap_or_default()
    };
    let mut info = ArrayInfo {
        path: dir.display().to_string(),
        status: "plain".into(),
        reason: None,
        shape: meta.shape.clone(),
        data_type: meta
            .doc
            .get("data_type")
            .map(|d| d.to_string().trim_matches('"').to_string())
            .unwrap_or_default(),
        chunk_shape: grid_shape.clone(),
        inner_chunk_shape: grid_shape,
        codecs: names(&meta.doc["codecs"]),
        nesting_levels: 0,
        shards: 0,
        stored_chunks: 0,
        bytes: 0,
        live_bytes: 0,
        dead_bytes: 0,
        corrupt_shards: Vec::new(),
        v2_view: v2_status(meta, keys),
        layout: "v3".into(),
    };
    match &meta.presentation {
        Presentation::Plain => {
            // Its chunk files, one per stored chunk (all of their bytes are live).
            let chunk = info.chunk_shape.clone();
            let (n, bytes) = plain_chunk_files(store, data_dir, keys, &meta.shape, &chunk);
            info.stored_chunks = n;
            info.bytes = bytes;
            info.live_bytes = bytes;
        }
        Presentation::Unsupported(why) => {
            info.status = "passthrough".into();
            info.reason = Some(why.clone());
        }
        Presentation::Sharded(layout) => {
            info.status = "sharded".into();
            info.inner_chunk_shape = layout.inner_chunk_shape().to_vec();
            info.codecs = names(&serde_json::Value::Array(layout.inner_codecs.clone()));
            info.nesting_levels = layout.levels.len();
            add_shards(&mut info, store, data_dir, keys, layout);
        }
    }
    info
}

/// The shards of the sharded array `layout` (its data directory `data_dir`) counted into
/// `info`: stored chunks, bytes, live and dead bytes, corrupt shards.
fn add_shards(
    info: &mut ArrayInfo,
    store: &dyn Store,
    data_dir: &Path,
    keys: format::ChunkKeyEncoding,
    layout: &ShardLayout,
) {
    for shard in shard_coords(store, data_dir, keys, layout) {
        let key = keys.encode(&shard);
        let s = Shard::load(store, &data_dir.join(&key), layout);
        info.shards += 1;
        info.bytes += s.meta().map_or(0, |m| m.len);
        match s.index() {
            Ok(index) => {
                info.stored_chunks += layout
                    .chunks_of_shard(&shard)
                    .iter()
                    .filter(|c| {
                        matches!(
                            s.chunk(layout, &layout.locate(c).expect("in grid")),
                            Ok(Some(_))
                        )
                    })
                    .count() as u64;
                info.live_bytes += index.live_bytes();
                // Dead as `shardfs compact` counts it (the close times are live).
                match s.dead_bytes(&layout.levels[0]) {
                    Some(Ok(dead)) => info.dead_bytes += dead,
                    Some(Err(e)) => info.corrupt_shards.push((key, e.to_string())),
                    None => {}
                }
            }
            Err(e) => info.corrupt_shards.push((key, e.to_string())),
        }
    }
}

/// Coordinates of every shard file of an array, found by listing (never guessing).
pub fn shard_coords(
    store: &dyn Store,
    dir: &Path,
    enc: format::ChunkKeyEncoding,
    layout: &ShardLayout,
) -> Vec<Vec<u64>> {
    let ndim = layout.ndim();
    let mut out = Vec::new();
    if ndim == 0 || !enc.nested() {
        for e in store.list(dir).unwrap_or_default() {
            let parsed = e.name.to_str().and_then(|n| enc.child(ndim, None, n));
            // Any kind: a shard path that is not a regular file is reported, not skipped.
            if let Some(KeyPath::Chunk(c)) = parsed
                && layout.shard_in_grid(&c)
            {
                out.push(c);
            }
        }
    } else {
        let mut base = dir.to_path_buf();
        if let Some(root) = enc.root_component(ndim) {
            base.push(root);
        }
        descend(store, &base, enc, ndim, &mut Vec::new(), layout, &mut out);
    }
    out.sort();
    out
}

fn descend(
    store: &dyn Store,
    dir: &Path,
    enc: format::ChunkKeyEncoding,
    ndim: usize,
    prefix: &mut Vec<u64>,
    layout: &ShardLayout,
    out: &mut Vec<Vec<u64>>,
) {
    let last = prefix.len() + 1 == ndim;
    for e in store.list(dir).unwrap_or_default() {
        let Some(c) = e
            .name
            .to_str()
            .and_then(|n| enc.parse_component(prefix.len(), n))
        else {
            continue;
        };
        if c >= layout.shard_counts()[prefix.len()] {
            continue;
        }
        prefix.push(c);
        match (last, e.kind) {
            // Any kind at the shard level: a shard path that is not a regular file is
            // reported by `verify` (and read as EIO by a mount), never silently skipped.
            (true, _) => out.push(prefix.clone()),
            (false, EntryKind::Dir) => {
                descend(store, &dir.join(&e.name), enc, ndim, prefix, layout, out)
            }
            _ => {}
        }
        prefix.pop();
    }
}

/// The chunk files of an unsharded array of `shape` and chunk `chunk` whose keys start
/// in store directory `dir`, within its grid: how many, and their bytes.
fn plain_chunk_files(
    store: &dyn Store,
    dir: &Path,
    enc: format::ChunkKeyEncoding,
    shape: &[u64],
    chunk: &[u64],
) -> (u64, u64) {
    let ndim = shape.len();
    if chunk.len() != ndim || chunk.contains(&0) {
        return (0, 0);
    }
    let in_grid = |c: &[u64]| {
        c.iter()
            .zip(shape.iter().zip(chunk))
            .all(|(c, (s, k))| *c < s.div_ceil(*k).max(1))
    };
    let (mut n, mut bytes) = (0, 0);
    crate::store::walk_keys(store, dir, enc, ndim, &mut |key, kind, path| {
        if let (KeyPath::Chunk(c), EntryKind::File) = (key, kind)
            && in_grid(c)
        {
            n += 1;
            bytes += store.stat(&path).ok().flatten().map_or(0, |m| m.len);
        }
    });
    (n, bytes)
}

/// The human-readable report of `shardfs info`.
pub fn render(arrays: &[ArrayInfo]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    if arrays.is_empty() {
        s.push_str("no arrays found\n");
    }
    for a in arrays {
        let path = if a.path.is_empty() { "/" } else { &a.path };
        let layout = if a.layout == "draft" {
            ", 2022 draft layout"
        } else {
            ""
        };
        let _ = writeln!(s, "{path}  [{}{layout}]", a.status);
        if a.status.starts_with("container") {
            let why = a.reason.as_deref().unwrap_or("");
            let _ = writeln!(s, "  cannot be shown (EIO): {why}");
            continue;
        }
        if let Some(r) = &a.reason {
            let _ = writeln!(s, "  passes through unchanged: {r}");
        }
        let _ = writeln!(s, "  shape {:?} {}", a.shape, a.data_type);
        if a.status == "sharded" {
            let _ = writeln!(
                s,
                "  shards {:?} of inner chunks {:?} ({} level{})",
                a.chunk_shape,
                a.inner_chunk_shape,
                a.nesting_levels,
                if a.nesting_levels == 1 { "" } else { "s" }
            );
            let _ = writeln!(s, "  inner codecs {}", a.codecs.join(", "));
            if a.codecs
                .iter()
                .any(|c| c.starts_with(crate::format::v2::NUMCODECS))
            {
                let _ = writeln!(
                    s,
                    "  numcodecs.* codecs: zarr-python 3 (with numcodecs) and zarr 2 through the v2 view read this array; tensorstore and zarrs may not"
                );
            }
            let _ = writeln!(
                s,
                "  {} shards, {} stored inner chunks, {} bytes ({} live, {} dead)",
                a.shards, a.stored_chunks, a.bytes, a.live_bytes, a.dead_bytes
            );
            for (k, why) in &a.corrupt_shards {
                let _ = writeln!(s, "  CORRUPT shard {k}: {why}");
            }
        } else {
            let _ = writeln!(
                s,
                "  chunks {:?}, codecs {}",
                a.chunk_shape,
                a.codecs.join(", ")
            );
            if a.status == "plain" {
                let _ = writeln!(s, "  {} chunk files, {} bytes", a.stored_chunks, a.bytes);
            }
            if a.status.starts_with("b") {
                let _ = writeln!(
                    s,
                    "  shown read-only as a Zarr array of {} chunk files (its blosc frames)",
                    a.stored_chunks
                );
            }
        }
        let _ = writeln!(s, "  v2 view: {}", a.v2_view);
    }
    s
}
