//! Property tests with arbitrary input for every parser of bytes that come from a store
//! (issue 15, fuzzing): shard indices, close-time trailers, `zarr.json`, `.zarray`, the
//! 2022 draft metadata, chunk keys, and the seed's blosc containers (bloscpack files,
//! bcolz JSON and chunk files, blosc frame headers). Each must return an error, never panic. CI runs
//! the default number of cases; `scripts/fuzz` runs each for minutes.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::index::{Endian, IndexCodecs, ShardIndex};
use super::key::{ChunkKeyEncoding, KeyKind};
use super::{bcolz, blosc, bloscpack, draft, metadata, times, v2};

/// Arbitrary JSON, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::from)),
        "[a-z_.0-9<>|]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid sharded `zarr.json` with one member replaced by arbitrary JSON, at any depth
/// of the member names a reader looks at.
fn mutated_zarr_json() -> impl Strategy<Value = Vec<u8>> {
    let paths = prop_oneof![
        Just(vec!["shape"]),
        Just(vec!["data_type"]),
        Just(vec!["chunk_grid"]),
        Just(vec!["chunk_grid", "configuration", "chunk_shape"]),
        Just(vec!["chunk_key_encoding"]),
        Just(vec!["chunk_key_encoding", "configuration", "separator"]),
        Just(vec!["fill_value"]),
        Just(vec!["codecs"]),
        Just(vec!["node_type"]),
        Just(vec!["zarr_format"]),
    ];
    (paths, json_value()).prop_map(|(path, v)| {
        let mut doc = json!({
            "zarr_format": 3, "node_type": "array", "shape": [100, 80], "data_type": "uint16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [20, 16]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0,
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": [5, 4], "codecs": [{"name": "bytes"}],
                "index_codecs": [{"name": "bytes"}, {"name": "crc32c"}]}}]
        });
        let mut at = &mut doc;
        for (i, key) in path.iter().enumerate() {
            if i + 1 == path.len() {
                at[*key] = v.clone();
            } else {
                at = &mut at[*key];
            }
        }
        serde_json::to_vec(&doc).unwrap()
    })
}

proptest! {
    // No failure file in the source tree (a failure prints its seed and minimal case).
    #![proptest_config(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn shard_indices_of_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..600),
                                        n in 0u64..80, big in any::<bool>(), crc in any::<bool>()) {
        let codecs = IndexCodecs { endian: if big { Endian::Big } else { Endian::Little }, crc32c: crc };
        let _ = ShardIndex::decode(&bytes, codecs, n);
        let _ = ShardIndex::decode(&bytes, codecs, u64::MAX);
    }

    #[test]
    fn close_time_trailers_of_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..64),
                                              n in any::<u64>(), at in any::<u64>()) {
        let _ = times::decode_trailer(&bytes, n, at);
    }

    #[test]
    fn zarr_json_of_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let _ = metadata::parse(&bytes);
        let _ = v2::v3_from_zarray(&bytes);
        let _ = draft::array(&bytes);
    }

    #[test]
    fn zarr_json_with_one_arbitrary_member(doc in mutated_zarr_json()) {
        if let Ok(metadata::Node::Array(meta)) = metadata::parse(&doc)
            && let metadata::Presentation::Sharded(layout) = &meta.presentation
        {
            // What the view does with an accepted layout must not panic either.
            let _ = layout.chunk_counts();
            let _ = layout.locate(&vec![0; layout.ndim()]);
            let _ = layout.chunks_of_shard(&vec![0; layout.ndim()]);
        }
    }

    #[test]
    fn zarray_of_arbitrary_json(v in json_value(), shape in json_value(), chunks in json_value(),
                                dtype in json_value(), compressor in json_value()) {
        let _ = v2::v3_from_zarray(&serde_json::to_vec(&v).unwrap());
        let z = json!({"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype,
                       "compressor": compressor, "fill_value": 0, "order": "C", "filters": null});
        let _ = v2::v3_from_zarray(&serde_json::to_vec(&z).unwrap());
    }

    #[test]
    fn chunk_keys_of_arbitrary_names(name in "\\PC{0,24}", ndim in 0usize..5) {
        for kind in [KeyKind::Default, KeyKind::V2, KeyKind::Draft] {
            for separator in ['/', '.'] {
            let enc = ChunkKeyEncoding { kind, separator };
            let _ = enc.child(ndim, None, &name);
            let _ = enc.child(ndim, Some(&[1, 2]), &name);
            for level in 0..ndim {
                let _ = enc.parse_component(level, &name);
            }
            }
        }
    }

    #[test]
    fn bloscpack_files_of_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..600),
                                          magic in any::<bool>()) {
        let mut bytes = bytes;
        if magic && bytes.len() >= 5 {
            bytes[..5].copy_from_slice(b"blpk\x03");
        }
        check_bloscpack(&bytes);
    }

    #[test]
    fn bloscpack_files_with_bytes_changed(at in prop::collection::vec((any::<u16>(), any::<u8>()), 1..6),
                                          cut in any::<u16>(), offsets in any::<bool>(), meta in any::<bool>(),
                                          ck in 0u8..9) {
        let data: Vec<u8> = (0..600u32).flat_map(|i| i.to_le_bytes()).collect();
        let m = json!({"dtype": "'<u4'", "shape": [600], "order": "C", "container": "numpy"});
        let mut f = bloscpack::tests::build(&data, 500, offsets, meta.then_some(&m),
                                            bloscpack::Checksum::from_code(ck).unwrap()).file;
        for (i, b) in at {
            let n = f.len();
            f[i as usize % n] = b;
        }
        let keep = f.len() - (cut as usize % 64).min(f.len());
        f.truncate(keep);
        check_bloscpack(&f);
    }

    #[test]
    fn bcolz_json_of_arbitrary_members(shape in json_value(), dtype in json_value(), chunklen in json_value(),
                                       dflt in json_value(), raw in prop::collection::vec(any::<u8>(), 0..200)) {
        let sizes = serde_json::to_vec(&json!({"shape": shape})).unwrap();
        let storage = serde_json::to_vec(&json!({"dtype": dtype, "chunklen": chunklen, "dflt": dflt,
                                                 "cparams": {"clevel": 5}})).unwrap();
        for (a, b) in [(&sizes[..], &storage[..]), (&raw[..], &storage[..]), (&sizes[..], &raw[..])] {
            if let Ok(meta) = bcolz::CarrayMeta::parse(a, b) {
                let shown = meta.shown(None, bcolz::attributes(Some(&raw)));
                let _ = (meta.nchunks(), meta.last_rows(), shown.zarr_json(), shown.zarray());
                let _ = (shown.fill_element(), shown.key(shown.nchunks(), false), shown.parse_key("c.0", false));
            }
        }
        let _ = bcolz::columns(&raw);
        let _ = bcolz::chunk_frame(&raw);
        let _ = super::container::Dtype::parse(&String::from_utf8_lossy(&raw));
    }

    #[test]
    fn blosc_frames_of_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300),
                                       nbytes in 0usize..4096) {
        if let Ok(h) = blosc::FrameHeader::parse(&bytes) {
            let _ = (h.cname(), h.shuffle());
            let _ = blosc::decode(&bytes, (h.nbytes as usize).min(1 << 20));
        }
        let _ = blosc::decode(&bytes, nbytes);
    }
}

/// Everything the view does with a bloscpack file's bytes, on `bytes`.
fn check_bloscpack(bytes: &[u8]) {
    let Ok(p) = bloscpack::parse_prefix(bytes, bytes.len() as u64) else {
        return;
    };
    let table = bloscpack::chunk_table(&p, bytes.len() as u64, |off| {
        let mut h = [0; blosc::HEADER_LEN];
        let s = bytes
            .get(off as usize..off as usize + blosc::HEADER_LEN)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        h.copy_from_slice(s);
        Ok(h)
    });
    let Ok(chunks) = table else { return };
    if let Ok(a) = bloscpack::shown_array(&p, &chunks) {
        let _ = (
            a.zarr_json(),
            a.zarray(),
            a.zattrs(),
            a.nchunks(),
            a.chunk_bytes(),
        );
        let _ = (a.key(0, true), a.parse_key("0", true), a.fill_element());
    }
    for c in &chunks {
        let end = (c.offset + c.frame_len()) as usize;
        if let Some(frame) = bytes.get(c.offset as usize..end) {
            let _ = blosc::decode(frame, c.frame.nbytes as usize);
            let _ = bloscpack::verify(p.header.checksum, frame, &[]);
        }
    }
}
