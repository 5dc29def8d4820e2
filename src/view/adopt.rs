//! New arrays: a `zarr.json` of an unsharded array that lands in a store directory makes
//! a sharded array there, with the writer's chunks as inner chunks; chunk files copied
//! in before the metadata are taken into the shards. (Where metadata lands, and what
//! else it does there: `landed.rs`.)

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::Overlay;
use super::{MetaFile, Result, ViewError};
use crate::format::{self, KeyPath};
use crate::store::{EntryKind, Store};
use crate::write::flush::default_chunks_per_shard;

impl Overlay<'_> {
    /// A `zarr.json` just landed in the store directory `dir`: if it describes an
    /// unsharded array, make it a sharded one and take in chunk files already there.
    pub(super) fn adopt_new_array(&self, dir: &Path) -> Result<()> {
        if self.policy.gathers_writes() {
            // Files written here before the metadata (`cp -r` order) whose handles the
            // daemon still holds (no close was heard of) are let go first: taken in
            // below, their held handles would write into files that are gone. One being
            // written now is not waited for, as with a mount that asks at open.
            self.gathered.commit_settled()?;
        }
        let json_path = dir.join("zarr.json");
        let bytes = self
            .tree
            .store
            .read_all(&json_path)?
            .ok_or(ViewError::NotFound)?;
        let Ok(format::Node::Array(meta)) = format::metadata::parse(&bytes) else {
            return Ok(());
        };
        let Some(sharded) = self.sharded_document(dir, &meta)? else {
            return Ok(());
        };
        let store = self.tree.store.as_ref();
        // No name is made in the directory while it becomes an array (see `Writer::tree`).
        let _adopting = self.w.tree.write();
        let key_dirs = collect_key_dirs(store, dir, &meta);
        // A directory with something in it at a chunk key stands where a shard may go,
        // and is not ours to remove: refused, and not left behind.
        if let Some((_, path)) = key_dirs.iter().find(|(coords, path)| {
            coords.is_none() && store.list(path).is_ok_and(|l| !l.is_empty())
        }) {
            return Err(self.refuse_new_array(
                dir,
                format!(
                    "{} is a directory with files in it, at a chunk key of the new array \
                     (where its shards go): move it away first",
                    path.display()
                ),
            ));
        }
        // Chunk files copied in before the metadata (`cp -r` order) would collide with
        // the shard files; moved aside, staged, flushed, then dropped.
        let aside = dir.join(".shardfs-ingest");
        let moved = move_chunk_files_aside(store, dir, &meta, &aside)?;
        let key_dirs = self.keep_key_dirs(dir, key_dirs);
        // Shown as its writer wrote it while it describes the array stored.
        let written = self.remember_as_written((json_path.clone(), MetaFile::ZarrJson), &bytes);
        store
            .write_atomically(&json_path, &sharded)
            .inspect_err(|_| self.forget_as_written(written))?;
        let array = self.reload_array(dir)?;
        self.drop_key_dirs(&array, key_dirs);
        log::info!(
            "{}: new array stored sharded, shards {:?}",
            dir.display(),
            array.layout.shard_shape
        );
        self.take_in_moved(&array, &moved, &aside)
    }
}

impl Overlay<'_> {
    /// The sharded `zarr.json` that makes the array `meta` just written at `dir` a
    /// sharded array, or `None` where it stays as written (a sharded array's own shard
    /// files, one taken in already, an unsharded array of the store, one that cannot be
    /// sharded). Refused (and its document removed) where its chunks could never be
    /// stored.
    fn sharded_document(&self, dir: &Path, meta: &format::ArrayMeta) -> Result<Option<Vec<u8>>> {
        let w = self.w;
        if matches!(meta.presentation, format::Presentation::Sharded(_))
            && self.tree.arrays.get(dir).is_some()
        {
            // Taken in already (the same document landing twice: at its close, and
            // again at its release once the kernel opens files itself): it is the
            // sharded array this mount made, not a client's shard files.
            return Ok(None);
        }
        if !matches!(meta.presentation, format::Presentation::Plain) {
            // A client writing a sharded array writes its shard files itself, at the
            // shard keys, and reads them back (partial shard writes): it is shown the
            // store as it is for the rest of this mount. Later mounts show it unsharded.
            if matches!(meta.presentation, format::Presentation::Sharded(_)) {
                w.choices.show_as_stored(dir);
                self.tree.arrays.remove(dir);
                self.refresh_subtree(dir);
            }
            return Ok(None);
        }
        if w.choices.forget_as_stored(dir) {
            self.refresh_subtree(dir);
        }
        if w.choices.take_keep_unsharded(dir) {
            // An unsharded array of the store whose metadata was rewritten (an attribute,
            // a resize) stays as it is: sharding it would rewrite all its chunks, and
            // move what else lies among them.
            return Ok(None);
        }
        let Some(sharded) = shard_document(meta, w.chunks_per_shard.as_deref(), w.shard_target)
        else {
            log::warn!(
                "{}: cannot shard this array (irregular grid or odd codecs); kept as written",
                dir.display()
            );
            return Ok(None);
        };
        if let Ok(format::Node::Array(m)) = format::metadata::parse(&sharded)
            && let format::Presentation::Sharded(layout) = &m.presentation
            && let Err(e) = crate::write::flush::storable(layout)
        {
            return Err(
                self.refuse_new_array(dir, format!("its chunks could never be stored: {e}"))
            );
        }
        Ok(Some(sharded))
    }

    /// A new array at `dir` refused for `why`, and not left behind: a reader must not
    /// find its `zarr.json`, nor the document being written there.
    fn refuse_new_array(&self, dir: &Path, why: String) -> ViewError {
        let json_path = dir.join("zarr.json");
        log::warn!("{}: refused: {why}", json_path.display());
        if let Err(e) = self.tree.store.remove_file(&json_path) {
            return e.into();
        }
        self.w.docs.unlinked(&json_path);
        self.refresh_subtree(dir);
        ViewError::Invalid(why)
    }
}

impl Overlay<'_> {
    /// The key directories found in `dir` before its metadata (`mkdir -p a/c/0` first,
    /// as `rsync` and `cp -r` may) stay key directories of the new array, as a `mkdir`
    /// after it would make; the returned store directories go once the array is in place
    /// ([`Overlay::drop_key_dirs`]). A directory made at a chunk's key (in 1-D, where a
    /// shard goes) is no key directory: it goes now.
    fn keep_key_dirs(
        &self,
        dir: &Path,
        key_dirs: Vec<(Option<Vec<u64>>, PathBuf)>,
    ) -> Vec<(Option<Vec<u64>>, PathBuf)> {
        let store = self.tree.store.as_ref();
        let (key_dirs, at_chunks): (Vec<_>, Vec<_>) = key_dirs
            .into_iter()
            .partition(|(coords, _)| coords.is_some());
        for (_, path) in at_chunks.into_iter().rev() {
            if store.remove_dir(&path).is_err() {
                log::warn!(
                    "{}: a directory at a chunk key of the new array is left in the store",
                    path.display()
                );
            }
            self.tree.shards.invalidate(&path);
        }
        self.w.vdirs.made_all(
            dir,
            key_dirs.iter().filter_map(|(coords, _)| coords.clone()),
        );
        key_dirs
    }

    /// Once the new array is in place (its inodes looked at again), the emptied store
    /// directories of its key directories go: as store directories they would stand
    /// where shards go and keep `rmdir` of the array from emptying it; until then a
    /// writer that holds one (`rsync` setting its times) still finds it. One that holds
    /// a file that is no chunk (`rsync`'s temporary file) stays in the store, and the
    /// file is shown in it. Key directories outside the grid are no longer kept.
    fn drop_key_dirs(
        &self,
        array: &super::ShardedArray,
        key_dirs: Vec<(Option<Vec<u64>>, PathBuf)>,
    ) {
        let store = self.tree.store.as_ref();
        for (_, path) in key_dirs.into_iter().rev() {
            let _ = store.remove_dir(&path);
            self.tree.shards.invalidate(&path);
        }
        self.w
            .vdirs
            .keep_in_grid(&array.rel, array.layout.chunk_counts());
    }

    /// The chunk files moved aside before the new array's metadata was stored, staged
    /// into its shards and flushed; then the directory they were moved to goes.
    fn take_in_moved(
        &self,
        array: &super::ShardedArray,
        moved: &[(Vec<u64>, PathBuf)],
        aside: &Path,
    ) -> Result<()> {
        let (w, store) = (self.w, self.tree.store.as_ref());
        if !moved.is_empty() {
            for (coords, file) in moved {
                w.staging.put(
                    &array.rel,
                    coords.clone(),
                    Some(Arc::new(store.read_all(file)?.ok_or(ViewError::NotFound)?)),
                );
            }
            self.flush_array(array)?;
            crate::store::remove_tree(store, aside)?;
        }
        Ok(())
    }
}

/// Chunk files of the new array `meta` at `dir` already in the store (copied in before
/// the metadata), moved to `aside` under numbered names, with their coordinates.
fn move_chunk_files_aside(
    store: &dyn Store,
    dir: &Path,
    meta: &format::ArrayMeta,
    aside: &Path,
) -> Result<Vec<(Vec<u64>, PathBuf)>> {
    let ingest = collect_chunk_files(store, dir, meta);
    let mut moved = Vec::new();
    if !ingest.is_empty() {
        if store.stat(aside)?.is_none() {
            store.create_dir(aside)?;
        }
        for (i, (coords, file)) in ingest.into_iter().enumerate() {
            let to = aside.join(i.to_string());
            store.rename(&file, &to)?;
            moved.push((coords, to));
        }
    }
    Ok(moved)
}

/// The sharded `zarr.json` for an unsharded array a writer created.
fn shard_document(meta: &format::ArrayMeta, cps: Option<&[u64]>, target: u64) -> Option<Vec<u8>> {
    let mut doc = meta.doc.clone();
    if format::metadata::codec_name(doc.get("chunk_grid")?) != "regular" {
        return None;
    }
    let inner: Vec<u64> = doc["chunk_grid"]["configuration"]["chunk_shape"]
        .as_array()?
        .iter()
        .map(Value::as_u64)
        .collect::<Option<_>>()?;
    if inner.len() != meta.shape.len() || inner.contains(&0) {
        return None;
    }
    let codecs = doc.get("codecs")?.as_array()?.clone();
    let itemsize = itemsize(doc.get("data_type").and_then(Value::as_str).unwrap_or(""));
    let cps = match cps {
        Some(c) if c.len() == inner.len() && !c.contains(&0) => c.to_vec(),
        _ => default_chunks_per_shard(&meta.shape, &inner, itemsize, target),
    };
    let shard: Vec<u64> = inner.iter().zip(&cps).map(|(i, c)| i * c).collect();
    doc["chunk_grid"]["configuration"]["chunk_shape"] = serde_json::json!(shard);
    doc.insert(
        "codecs".into(),
        serde_json::json!([{"name": "sharding_indexed", "configuration": {
            "chunk_shape": inner, "codecs": codecs,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end"}}]),
    );
    let mut out = serde_json::to_vec_pretty(&Value::Object(doc)).ok()?;
    out.push(b'\n');
    Some(out)
}

fn itemsize(data_type: &str) -> u64 {
    match data_type {
        "bool" | "int8" | "uint8" => 1,
        "int16" | "uint16" | "float16" => 2,
        "int32" | "uint32" | "float32" => 4,
        "complex128" => 16,
        _ => 8,
    }
}

/// Files under the store directory `dir` of an array that are chunk keys of its grid
/// (an unsharded copy), as store paths.
fn collect_chunk_files(
    store: &dyn Store,
    dir: &Path,
    meta: &format::ArrayMeta,
) -> Vec<(Vec<u64>, PathBuf)> {
    let mut out = Vec::new();
    crate::store::walk_keys(
        store,
        dir,
        meta.key_encoding,
        meta.shape.len(),
        &mut |key, kind, path| {
            if let (KeyPath::Chunk(c), EntryKind::File) = (key, kind) {
                out.push((c.clone(), path));
            }
        },
    );
    out
}

/// The store directories in the key namespace of an array with metadata `meta` in store
/// directory `dir`, parents before their children: key directories (with their leading
/// coordinates) and directories at chunk keys (`None`).
fn collect_key_dirs(
    store: &dyn Store,
    dir: &Path,
    meta: &format::ArrayMeta,
) -> Vec<(Option<Vec<u64>>, PathBuf)> {
    let mut out = Vec::new();
    crate::store::walk_keys(
        store,
        dir,
        meta.key_encoding,
        meta.shape.len(),
        &mut |key, kind, path| match (key, kind) {
            (KeyPath::Dir(c), EntryKind::Dir) => out.push((Some(c.clone()), path)),
            (KeyPath::Chunk(_), EntryKind::Dir) => out.push((None, path)),
            _ => {}
        },
    );
    out
}

impl Overlay<'_> {
    /// A `zarr.json` at store path `json` is about to be written: if it is an unsharded
    /// array's now, the array stays unsharded ([`Overlay::adopt_new_array`]).
    pub(super) fn note_unsharded(&self, json: &Path) {
        let Ok(Some(bytes)) = self.tree.read_small(json) else {
            return;
        };
        if let Ok(format::Node::Array(meta)) = format::metadata::parse(&bytes)
            && matches!(meta.presentation, format::Presentation::Plain)
            && let Some(dir) = json.parent()
        {
            self.w.choices.keep_unsharded(dir);
        }
    }
}
