//! `shardfs compact` on a local store: dead space reclaimed, every chunk kept, the
//! threshold and the index location respected, paths that are no files skipped.

use super::*;

/// Slot bytes of every shard of `a`, read through the index.
fn all_chunks(root: &Path, layout: &ShardLayout) -> Vec<Option<Vec<u8>>> {
    (0..4)
        .flat_map(|s| (0..4).map(move |slot| (s, slot)))
        .map(|(s, slot)| chunk(root, &format!("a/c/{s}"), layout, slot))
        .collect()
}

#[test]
fn compact_reclaims_dead_space_and_keeps_every_chunk() {
    for (location, crc, endian) in [
        (IndexLocation::End, true, Endian::Little),
        (IndexLocation::End, false, Endian::Big),
    ] {
        let (dir, layout) = store(location, crc, endian);
        let root = dir.path();
        let level = &layout.levels[0];
        for round in 0..4u8 {
            for s in 0..3 {
                let body = vec![b'a' + round; 10 + s];
                put(
                    root,
                    &format!("a/c/{s}"),
                    &layout,
                    &[(round as usize % 4, &body), (3, &body[..3])],
                );
            }
        }
        let before = all_chunks(root, &layout);
        let lens = |root: &Path| {
            (0..3)
                .map(|s| {
                    std::fs::metadata(root.join(format!("a/c/{s}")))
                        .unwrap()
                        .len()
                })
                .collect::<Vec<_>>()
        };
        let old_lens = lens(root);
        // Nothing reaches a 99% threshold.
        let report = compact(root, 0.99, false).unwrap();
        assert_eq!((report.shards_checked, report.shards_rewritten), (3, 0));
        assert_eq!(lens(root), old_lens);
        let dead = report.arrays[0].dead_bytes;
        assert!(dead > 0);
        let report = compact(root, 0.0, false).unwrap();
        assert_eq!(report.shards_rewritten, 3, "{report}");
        assert_eq!(report.bytes_reclaimed, dead);
        assert_eq!(
            old_lens.iter().sum::<u64>() - lens(root).iter().sum::<u64>(),
            dead
        );
        assert_eq!(all_chunks(root, &layout), before);
        for s in 0..3 {
            let bytes = std::fs::read(root.join(format!("a/c/{s}"))).unwrap();
            let (start, end) =
                index_region(location, bytes.len() as u64, level.index_len()).unwrap();
            let idx =
                ShardIndex::decode(&bytes[start as usize..end as usize], level.index_codecs, 4)
                    .unwrap();
            assert_eq!(bytes.len() as u64, idx.live_bytes() + level.index_len());
        }
        assert!(verify(root, false, false).unwrap().is_clean());
        let again = compact(root, 0.0, false).unwrap();
        assert_eq!((again.shards_rewritten, again.arrays[0].dead_bytes), (0, 0));
    }
}

#[test]
fn compact_respects_the_threshold_and_the_index_location() {
    let (dir, layout) = store(IndexLocation::Start, true, Endian::Little);
    let root = dir.path();
    let level = &layout.levels[0];
    // Index at the start, 30 bytes of garbage, then chunks: dead = 30 of 30 + 8 + 68.
    let chunks: [(usize, &[u8]); 2] = [(1, b"1111"), (2, b"2222")];
    let clean = dense_shard(level, chunks, &CloseTimes::unknown(4)).0;
    let mut idx = ShardIndex::empty(4);
    idx.set(
        1,
        Some(ChunkRange {
            offset: 68 + 30,
            nbytes: 4,
        }),
    );
    idx.set(
        2,
        Some(ChunkRange {
            offset: 68 + 34,
            nbytes: 4,
        }),
    );
    let dirty = [
        idx.encode(level.index_codecs),
        vec![7u8; 30],
        b"11112222".to_vec(),
    ]
    .concat();
    std::fs::create_dir_all(root.join("a/c")).unwrap();
    std::fs::write(root.join("a/c/0"), &dirty).unwrap();
    let ratio = 30.0 / dirty.len() as f64;
    let report = compact(root, ratio + 0.01, false).unwrap();
    assert_eq!(report.shards_rewritten, 0);
    assert_eq!(std::fs::read(root.join("a/c/0")).unwrap(), dirty);
    let report = compact(root, ratio - 0.01, false).unwrap();
    assert_eq!(
        (report.shards_rewritten, report.bytes_reclaimed),
        (1, 30),
        "{report}"
    );
    assert_eq!(std::fs::read(root.join("a/c/0")).unwrap(), clean);
    assert!(compact(root, 1.0, false).is_err());
    assert!(compact(root, f64::NAN, false).is_err());
    // A corrupt shard is skipped, byte for byte.
    std::fs::write(root.join("a/c/1"), &dirty[..50]).unwrap();
    let report = compact(root, 0.0, false).unwrap();
    assert_eq!(report.skipped.len(), 1, "{report}");
    assert_eq!(std::fs::read(root.join("a/c/1")).unwrap(), &dirty[..50]);
}

/// A shard path that is a directory, a FIFO or a symbolic link is skipped and reported,
/// and the run goes on to the other shards. Before, the whole run stopped at it.
#[test]
fn compact_skips_shard_paths_that_are_not_files_and_goes_on() {
    let (dir, layout) = store(IndexLocation::End, true, Endian::Little);
    let root = dir.path();
    for s in 0..4 {
        // Dead space: a first chunk written, then replaced (an append leaves the old one).
        put(root, &format!("a/c/{s}"), &layout, &[(0, b"0000")]);
        put(root, &format!("a/c/{s}"), &layout, &[(0, b"1111")]);
    }
    let len0 = std::fs::metadata(root.join("a/c/0")).unwrap().len();
    let outside = shard_paths_that_are_not_files(root);
    let outside_before = std::fs::read(outside.path().join("shard")).unwrap();
    let report = compact(root, 0.0, false).unwrap();
    let skipped: Vec<_> = report
        .skipped
        .iter()
        .map(|p| (p.shard.to_str().unwrap().to_string(), p.what.clone()))
        .collect();
    assert_eq!(skipped.len(), 3, "{report}");
    assert!(
        skipped[0].0 == "a/c/1" && skipped[0].1.contains("a directory"),
        "{skipped:?}"
    );
    assert!(
        skipped[1].0 == "a/c/2" && skipped[1].1.contains("special file"),
        "{skipped:?}"
    );
    assert!(
        skipped[2].0 == "a/c/3" && skipped[2].1.contains("symbolic link"),
        "{skipped:?}"
    );
    assert_eq!(
        report.shards_rewritten, 1,
        "the regular shard, after them: {report}"
    );
    assert!(std::fs::metadata(root.join("a/c/0")).unwrap().len() < len0);
    assert_eq!(
        std::fs::read(outside.path().join("shard")).unwrap(),
        outside_before
    );
}
