//! A small sample sharded store, written with the format module: the data of
//! `shardfs demo` and of tests that need a store without Python.
//!
//! It holds a group with three arrays that between them cover the index at the end
//! (with crc32c) and at the start (without), `default` and `v2` chunk keys, empty inner
//! chunks, a missing shard, edge shards, and a non-sharded array that passes through.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use serde_json::json;

use crate::format::shard_write::dense_shard;
use crate::format::{
    ChunkKeyEncoding, CloseTimes, Endian, IndexCodecs, IndexLocation, ShardLayout, ShardLevel,
};

/// What the sample store holds, for checking a mount of it.
#[derive(Debug, Default)]
pub struct Sample {
    /// Path in the mount of every inner chunk file → its exact bytes.
    pub chunks: BTreeMap<String, Vec<u8>>,
    /// Array paths, sharded ones first.
    pub arrays: Vec<String>,
    pub shards: usize,
}

struct Spec {
    path: &'static str,
    shape: Vec<u64>,
    shard: Vec<u64>,
    inner: Vec<u64>,
    dtype: &'static str,
    itemsize: usize,
    index: IndexCodecs,
    location: IndexLocation,
    keys: serde_json::Value,
}

/// Element value of the sample arrays at flat element position `i`: varied, not zero.
fn value(coords: &[u64]) -> u64 {
    coords.iter().fold(7, |acc, &c| acc * 1009 + c)
}

/// Encode an inner chunk: its elements row-major, little-endian; positions outside the
/// array hold the fill value 0, as every Zarr writer stores edge chunks.
fn chunk_bytes(spec: &Spec, coords: &[u64]) -> Vec<u8> {
    let n: u64 = spec.inner.iter().product();
    let mut out = Vec::with_capacity(n as usize * spec.itemsize);
    for flat in 0..n {
        let mut rem = flat;
        let mut elem = vec![0u64; spec.inner.len()];
        for d in (0..spec.inner.len()).rev() {
            elem[d] = coords[d] * spec.inner[d] + rem % spec.inner[d];
            rem /= spec.inner[d];
        }
        let inside = elem.iter().zip(&spec.shape).all(|(e, s)| e < s);
        let v = if inside { value(&elem) } else { 0 };
        out.extend_from_slice(&v.to_le_bytes()[..spec.itemsize]);
    }
    out
}

/// Write the sample store into the empty directory `dir`.
pub fn write_sample_store(dir: &Path) -> io::Result<Sample> {
    let le_crc = IndexCodecs {
        endian: Endian::Little,
        crc32c: true,
    };
    let le = IndexCodecs {
        endian: Endian::Little,
        crc32c: false,
    };
    let specs = [
        Spec {
            path: "raw",
            shape: vec![100, 70],
            shard: vec![32, 32],
            inner: vec![8, 8],
            dtype: "uint16",
            itemsize: 2,
            index: le_crc,
            location: IndexLocation::End,
            keys: json!({"name": "default", "configuration": {"separator": "/"}}),
        },
        Spec {
            path: "labels/seg",
            shape: vec![20, 20, 20],
            shard: vec![10, 10, 10],
            inner: vec![5, 5, 5],
            dtype: "uint8",
            itemsize: 1,
            index: le,
            location: IndexLocation::Start,
            keys: json!({"name": "v2", "configuration": {"separator": "."}}),
        },
    ];
    write_json(
        dir,
        "",
        &json!({"zarr_format": 3, "node_type": "group", "attributes": {"about": "shardfs sample"}}),
    )?;
    write_json(
        dir,
        "labels",
        &json!({"zarr_format": 3, "node_type": "group", "attributes": {}}),
    )?;
    let mut sample = Sample::default();
    for spec in &specs {
        write_array(dir, spec, &mut sample)?;
    }
    // A plain array: no sharding, passes through unchanged.
    write_json(
        dir,
        "plain",
        &json!({
            "zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
        }),
    )?;
    std::fs::create_dir_all(dir.join("plain/c"))?;
    std::fs::write(dir.join("plain/c/0"), [1, 2, 3, 4])?;
    sample.arrays.push("plain".into());
    Ok(sample)
}

fn write_json(dir: &Path, rel: &str, v: &serde_json::Value) -> io::Result<()> {
    std::fs::create_dir_all(dir.join(rel))?;
    std::fs::write(
        dir.join(rel).join("zarr.json"),
        serde_json::to_vec_pretty(v)?,
    )
}

fn write_array(dir: &Path, spec: &Spec, sample: &mut Sample) -> io::Result<()> {
    let cps: Vec<u64> = spec
        .shard
        .iter()
        .zip(&spec.inner)
        .map(|(s, i)| s / i)
        .collect();
    let level = ShardLevel {
        chunk_shape: spec.inner.clone(),
        chunks_per_shard: cps,
        index_codecs: spec.index,
        index_location: spec.location,
    };
    let n_chunks = level.n_chunks() as usize;
    let layout = ShardLayout::new(spec.shape.clone(), spec.shard.clone(), vec![level], vec![])
        .map_err(io::Error::other)?;
    let location = match spec.location {
        IndexLocation::Start => "start",
        IndexLocation::End => "end",
    };
    let endian = json!({"name": "bytes", "configuration": {"endian": "little"}});
    let mut index_codecs = vec![endian.clone()];
    if spec.index.crc32c {
        index_codecs.push(json!({"name": "crc32c"}));
    }
    write_json(
        dir,
        spec.path,
        &json!({
            "zarr_format": 3, "node_type": "array", "shape": spec.shape, "data_type": spec.dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": spec.shard}},
            "chunk_key_encoding": spec.keys, "fill_value": 0,
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": spec.inner, "codecs": [endian],
                "index_codecs": index_codecs, "index_location": location}}],
            "attributes": {"sample": true}
        }),
    )?;
    let enc = ChunkKeyEncoding::from_json(Some(&spec.keys)).map_err(io::Error::other)?;
    let shards = all_coords(layout.shard_counts());
    for (s_i, shard) in shards.iter().enumerate() {
        // The second shard is never written: its chunks are all empty.
        if s_i == 1 {
            continue;
        }
        let mut chunks = Vec::new();
        for coords in layout.chunks_of_shard(shard) {
            // Every seventh inner chunk is empty (never written).
            if coords.iter().sum::<u64>() % 7 == 3 {
                continue;
            }
            let loc = layout.locate(&coords).expect("in grid");
            let bytes = chunk_bytes(spec, &coords);
            sample.chunks.insert(
                format!("{}/{}", spec.path, enc.encode(&coords)),
                bytes.clone(),
            );
            chunks.push((loc.slots[0] as usize, bytes));
        }
        // Written in reverse slot order: shards need not be in index order.
        chunks.reverse();
        let refs = chunks.iter().map(|(s, b)| (*s, b.as_slice()));
        let (bytes, _) = dense_shard(&layout.levels[0], refs, &CloseTimes::unknown(n_chunks));
        let path = dir.join(spec.path).join(enc.encode(shard));
        std::fs::create_dir_all(path.parent().expect("under the array"))?;
        std::fs::write(path, bytes)?;
        sample.shards += 1;
    }
    sample.arrays.push(spec.path.into());
    Ok(())
}

/// Every coordinate of a grid of `extents`, row-major.
fn all_coords(extents: &[u64]) -> Vec<Vec<u64>> {
    let mut out = vec![vec![]];
    for &n in extents {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                (0..n).map(move |i| {
                    let mut c = prefix.clone();
                    c.push(i);
                    c
                })
            })
            .collect();
    }
    out
}
