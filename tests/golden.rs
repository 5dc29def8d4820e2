//! Golden bytes: the shard indices of files written by zarr-python 3 and tensorstore
//! decode to the values an independent reader recorded in the manifest, and encoding
//! them again reproduces the stored index bytes exactly.

mod common;

use std::path::Path;

use shardfs::format::index::index_region;
use shardfs::format::{self, Node, Presentation, ShardLayout};
use shardfs::store::shard::Shard;
use shardfs::store::{LocalStore, Store};

fn layout_of(store: &LocalStore, array: &str) -> ShardLayout {
    let bytes = store
        .read_all(&Path::new(array).join("zarr.json"))
        .unwrap()
        .unwrap();
    match format::metadata::parse(&bytes).unwrap() {
        Node::Array(a) => match a.presentation {
            Presentation::Sharded(l) => l,
            other => panic!("{array}: {other:?}"),
        },
        Node::Group => panic!("{array} is a group"),
    }
}

#[test]
fn indices_decode_to_the_manifest_and_reencode_byte_for_byte() {
    let mut checked = 0;
    for entry in common::manifest() {
        let Some(indices) = entry["shard_index"].as_object() else {
            continue;
        };
        if entry["sharded"] != true || entry["store"] == "corrupt" {
            continue;
        }
        let store_dir = common::fixtures().join(entry["store"].as_str().unwrap());
        let array = entry["array"].as_str().unwrap();
        let store = LocalStore::open(&store_dir).unwrap();
        let layout = layout_of(&store, array);
        let level = &layout.levels[0];
        for (key, pairs) in indices {
            let rel = Path::new(array).join(key);
            let shard = Shard::load(&store, &rel, &layout);
            let index = shard
                .index()
                .unwrap_or_else(|e| panic!("{}: {e}", rel.display()));
            let expected: Vec<(u64, u64)> = pairs
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap(), p[1].as_u64().unwrap()))
                .collect();
            let got: Vec<(u64, u64)> = index
                .entries()
                .iter()
                .map(|e| e.map_or((u64::MAX, u64::MAX), |r| (r.offset, r.nbytes)))
                .collect();
            assert_eq!(got, expected, "{}", rel.display());

            let file = std::fs::read(store_dir.join(&rel)).unwrap();
            let (start, end) =
                index_region(level.index_location, file.len() as u64, level.index_len()).unwrap();
            assert_eq!(
                index.encode(level.index_codecs),
                &file[start as usize..end as usize],
                "re-encoded index of {} differs from the stored bytes",
                rel.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} shards checked");
}

#[test]
fn corrupt_shards_give_typed_errors() {
    let entry = common::manifest()
        .into_iter()
        .find(|e| e["store"] == "corrupt")
        .unwrap();
    let store = LocalStore::open(&common::fixtures().join("corrupt")).unwrap();
    let array = entry["array"].as_str().unwrap();
    let layout = layout_of(&store, array);
    for (key, why) in entry["corrupt"].as_object().unwrap() {
        let shard = Shard::load(&store, &Path::new(array).join(key), &layout);
        let err = shard.index().expect_err(key).to_string();
        let expected = match why.as_str().unwrap() {
            "checksum" => "checksum mismatch",
            "truncated" => "shorter than its",
            "out_of_bounds" => "beyond the shard",
            other => panic!("unknown corruption {other}"),
        };
        assert!(err.contains(expected), "{key}: {err}");
    }
}
