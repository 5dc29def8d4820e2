//! `verify` and `compact` on stores written by zarr-python/tensorstore (the fixtures) and
//! by `apply`, with one corruption per check.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::*;
use crate::format::index::{EMPTY, index_region};
use crate::format::shard_write::dense_shard;
use crate::format::{
    self, ChunkRange, CloseTimes, Endian, IndexLocation, Location, Node, Presentation, ShardIndex,
    ShardLayout,
};
use crate::store::local::append::{ChunkUpdate, apply};
use crate::store::local::recover::{AppendRecord, RECORD_LEN};
use crate::store::shard::Shard;
use crate::store::{LocalStore, Store};

/// `compact`'s tests (the helpers here are theirs too).
mod compact;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A store with one 1-d uint8 array `a`: 4 shards of 4 inner chunks, compressed (gzip),
/// so that chunks of any length are what these tests write.
fn store(
    location: IndexLocation,
    crc32c: bool,
    endian: Endian,
) -> (tempfile::TempDir, ShardLayout) {
    store_with(
        location,
        crc32c,
        endian,
        json!([{"name": "bytes"}, {"name": "gzip", "configuration": {"level": 1}}]),
    )
}

fn store_with(
    location: IndexLocation,
    crc32c: bool,
    endian: Endian,
    inner_codecs: serde_json::Value,
) -> (tempfile::TempDir, ShardLayout) {
    let dir = tempfile::tempdir().unwrap();
    let mut index_codecs = vec![json!({"name": "bytes", "configuration": {"endian":
        if endian == Endian::Big { "big" } else { "little" }}})];
    if crc32c {
        index_codecs.push(json!({"name": "crc32c"}));
    }
    let doc = json!({
        "zarr_format": 3, "node_type": "array", "shape": [32], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [2], "codecs": inner_codecs, "index_codecs": index_codecs,
            "index_location": if location == IndexLocation::Start { "start" } else { "end" }}}],
    });
    let bytes = serde_json::to_vec(&doc).unwrap();
    std::fs::create_dir(dir.path().join("a")).unwrap();
    std::fs::write(dir.path().join("a/zarr.json"), &bytes).unwrap();
    let Ok(Node::Array(meta)) = format::metadata::parse(&bytes) else {
        panic!()
    };
    let Presentation::Sharded(layout) = meta.presentation else {
        panic!()
    };
    (dir, layout)
}

fn put(root: &Path, rel: &str, layout: &ShardLayout, chunks: &[(usize, &[u8])]) {
    let updates: Vec<ChunkUpdate> = chunks.iter().map(|&(s, b)| (s, Some(b))).collect();
    apply(root, Path::new(rel), &layout.levels[0], &updates).unwrap();
}

fn chunk(root: &Path, rel: &str, layout: &ShardLayout, slot: u64) -> Option<Vec<u8>> {
    let store = LocalStore::open(root).unwrap();
    let shard = Shard::load(&store, Path::new(rel), layout);
    let loc = Location {
        shard: vec![],
        slots: vec![slot],
    };
    let r = shard.chunk(layout, &loc).unwrap()?;
    Some(shard.read(r, 0, r.nbytes as u32).unwrap())
}

/// The shards `a/c/1`, `a/c/2` and `a/c/3` of the store at `root` made a directory, a
/// FIFO and a symbolic link to the shard moved into the returned directory.
fn shard_paths_that_are_not_files(root: &Path) -> tempfile::TempDir {
    std::fs::remove_file(root.join("a/c/1")).unwrap();
    std::fs::create_dir(root.join("a/c/1")).unwrap();
    std::fs::remove_file(root.join("a/c/2")).unwrap();
    let fifo =
        std::ffi::CString::new(root.join("a/c/2").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let outside = tempfile::tempdir().unwrap();
    std::fs::rename(root.join("a/c/3"), outside.path().join("shard")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("shard"), root.join("a/c/3")).unwrap();
    outside
}

fn problems_of(report: &VerifyReport) -> Vec<(String, String)> {
    (report.problems.iter())
        .map(|p| (p.shard.display().to_string(), p.what.clone()))
        .collect()
}

#[test]
fn fixtures_verify_clean_and_the_corrupt_one_does_not() {
    let mut checked = 0;
    for e in std::fs::read_dir(fixtures()).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !path.is_dir() || name.ends_with(".twin") || name == "corrupt" {
            continue;
        }
        let report = verify(&path, false, false).unwrap();
        assert!(report.is_clean(), "{name}: {report}");
        checked += report.shards_checked;
    }
    assert!(checked > 20, "only {checked} shards checked");
    let report = verify(&fixtures().join("corrupt"), false, false).unwrap();
    let found = problems_of(&report);
    assert_eq!(found.len(), 3, "{report}");
    let why = |k: &str| &found.iter().find(|(s, _)| s == k).unwrap().1;
    assert!(why("u8/c/0/0").contains("checksum"), "{found:?}");
    assert!(why("u8/c/0/1").contains("shorter"), "{found:?}");
    assert!(why("u8/c/1/0").contains("beyond"), "{found:?}");
    assert_eq!(report.problem_count, 3);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["shards_checked"], 4);
}

#[test]
fn verify_names_each_kind_of_corruption() {
    let (dir, layout) = store(IndexLocation::End, true, Endian::Little);
    let root = dir.path();
    let level = &layout.levels[0];
    let codecs = level.index_codecs;
    for s in 0..4 {
        put(
            root,
            &format!("a/c/{s}"),
            &layout,
            &[(0, b"0000"), (2, b"2222")],
        );
    }
    // A shard with `entries` over 8 data bytes, index at the end.
    let craft = |entries: &[(u64, u64)]| {
        let idx = ShardIndex::from_entries(
            (0..4)
                .map(|i| {
                    entries
                        .get(i)
                        .map(|&(offset, nbytes)| ChunkRange { offset, nbytes })
                })
                .collect(),
        );
        [b"abcdefgh".to_vec(), idx.encode(codecs)].concat()
    };
    let s0 = root.join("a/c/0");
    let mut bytes = std::fs::read(&s0).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&s0, bytes).unwrap();
    let s1 = root.join("a/c/1");
    let len = std::fs::metadata(&s1).unwrap().len();
    std::fs::File::options()
        .write(true)
        .open(&s1)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    std::fs::write(root.join("a/c/2"), craft(&[(0, 4), (2, 4)])).unwrap();
    std::fs::write(root.join("a/c/3"), craft(&[(0, 4), (6, 4)])).unwrap();
    let report = verify(root, false, false).unwrap();
    let found = problems_of(&report);
    assert_eq!(found.len(), 4, "{report}");
    assert!(
        found[0].0 == "a/c/0" && found[0].1.contains("checksum"),
        "{found:?}"
    );
    assert!(
        found[1].0 == "a/c/1" && found[1].1.contains("checksum"),
        "{found:?}"
    );
    assert!(
        found[2].0 == "a/c/2" && found[2].1.contains("chunks 0 and 1 overlap"),
        "{found:?}"
    );
    assert!(
        found[3].0 == "a/c/3" && found[3].1.contains("overlap the index"),
        "{found:?}"
    );

    std::fs::write(root.join("a/c/0"), craft(&[(0, 4), (4, 999)])).unwrap();
    std::fs::write(root.join("a/c/1"), &craft(&[(0, 4)])[..10]).unwrap();
    // Shared identical ranges and zero-length chunks read fine: warnings, not problems.
    std::fs::write(root.join("a/c/2"), craft(&[(0, 4), (0, 4), (2, 0)])).unwrap();
    std::fs::write(root.join("a/c/3"), craft(&[(EMPTY - 1, 4)])).unwrap();
    let report = verify(root, false, false).unwrap();
    let warned: Vec<_> = report.warnings.iter().map(|w| w.what.clone()).collect();
    assert_eq!(warned.len(), 2, "{warned:?}");
    assert!(
        warned[0].contains("0 and 1 share the same bytes"),
        "{warned:?}"
    );
    assert!(
        warned[1].contains("inner chunk 2 has length 0"),
        "{warned:?}"
    );
    assert!(report.to_string().contains("warning  a/c/2"), "{report}");
    let found = problems_of(&report);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(
        found[0].0 == "a/c/0" && found[0].1.contains("beyond"),
        "{found:?}"
    );
    assert!(
        found[1].0 == "a/c/1" && found[1].1.contains("shorter"),
        "{found:?}"
    );
    assert!(
        found[2].0 == "a/c/3" && found[2].1.contains("beyond"),
        "{found:?}"
    );
}

#[test]
fn verify_checks_nested_indices() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixtures().join("zarr_nested");
    copy_tree(&src, dir.path());
    let report = verify(dir.path(), false, false).unwrap();
    assert!(report.is_clean() && report.shards_checked == 2, "{report}");
    // Point the first stored nested entry of shard c/0/0/0 beyond its block.
    let rel = "nested_3d/c/0/0/0";
    let path = dir.path().join(rel);
    let mut bytes = std::fs::read(&path).unwrap();
    let store = LocalStore::open(dir.path()).unwrap();
    let Ok(Some(Node::Array(meta))) = store
        .read_all(Path::new("nested_3d/zarr.json"))
        .map(|b| b.map(|b| format::metadata::parse(&b).unwrap()))
    else {
        panic!()
    };
    let Presentation::Sharded(layout) = &meta.presentation else {
        panic!()
    };
    let shard = Shard::load(&store, Path::new(rel), layout);
    let (slot, outer) = (shard.index().unwrap().entries().iter().enumerate())
        .find_map(|(i, e)| e.map(|r| (i, r)))
        .unwrap();
    let at = outer.offset as usize; // the nested index is at the start of the block
    bytes[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    bytes[at + 8..at + 16].copy_from_slice(&1u64.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let found = problems_of(&verify(dir.path(), false, false).unwrap());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].1.starts_with(&format!(
        "nested shard {slot} (level 1): index: inner chunk 0"
    )));
    // Not repairable (the outer index is fine): nothing is cut.
    let report = verify(dir.path(), true, false).unwrap();
    assert_eq!((report.problem_count, report.repaired_count), (1, 0));
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

fn copy_tree(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

#[test]
fn repair_cuts_a_torn_tail_back_to_the_last_complete_state() {
    let (dir, layout) = store(IndexLocation::End, true, Endian::Little);
    let root = dir.path();
    let path = root.join("a/c/1");
    put(root, "a/c/1", &layout, &[(0, b"first-0"), (1, b"first-1")]);
    let s0 = std::fs::read(&path).unwrap();
    put(root, "a/c/1", &layout, &[(1, b"second-1")]);
    let s1 = std::fs::read(&path).unwrap();
    put(root, "a/c/1", &layout, &[(2, b"third-2"), (0, b"third-0")]);
    let s2 = std::fs::read(&path).unwrap();
    assert!(s1.starts_with(&s0) && s2.starts_with(&s1));
    let cuts: Vec<(usize, &Vec<u8>)> = vec![
        (1, &s1),
        (4, &s1),
        (s2.len() - s1.len() - 1, &s1),
        (s2.len() - s1.len() + 1, &s0),
        (s2.len() - s0.len() - 1, &s0),
    ];
    for (cut, want) in cuts {
        std::fs::write(&path, &s2[..s2.len() - cut]).unwrap();
        let report = verify(root, true, false).unwrap();
        assert_eq!(report.repaired_count, 1, "cut {cut}: {report}");
        assert!(report.is_clean(), "cut {cut}: {report}");
        assert_eq!(&std::fs::read(&path).unwrap(), want, "cut {cut}");
    }
    assert_eq!(chunk(root, "a/c/1", &layout, 1).unwrap(), b"first-1");
    // Nothing earlier is complete: refuse to cut.
    std::fs::write(&path, &s0[..s0.len() - 2]).unwrap();
    let report = verify(root, true, false).unwrap();
    assert_eq!(
        (report.problem_count, report.repaired_count),
        (1, 0),
        "{report}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), &s0[..s0.len() - 2]);
}

#[test]
fn repair_leaves_shards_without_a_recoverable_state_alone() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixtures().join("corrupt"), dir.path());
    let before = snapshot(dir.path());
    let report = verify(dir.path(), true, false).unwrap();
    assert_eq!(
        (report.problem_count, report.repaired_count),
        (3, 0),
        "{report}"
    );
    assert_eq!(snapshot(dir.path()), before);
    // Without crc32c a torn tail cannot be told from data: no repair either.
    let (dir, layout) = store(IndexLocation::End, false, Endian::Big);
    put(dir.path(), "a/c/0", &layout, &[(0, b"aaaa")]);
    put(dir.path(), "a/c/0", &layout, &[(1, b"bbbb")]);
    let path = dir.path().join("a/c/0");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    let report = verify(dir.path(), true, false).unwrap();
    assert_eq!(
        (report.problem_count, report.repaired_count),
        (1, 0),
        "{report}"
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len - 1);
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn leftovers_are_reported_then_recovered_by_repair() {
    let (dir, layout) = store(IndexLocation::End, true, Endian::Little);
    let root = dir.path();
    put(root, "a/c/2", &layout, &[(3, b"old")]);
    let old = std::fs::read(root.join("a/c/2")).unwrap();
    // A crash half-way through an append: record durable, half the tail written.
    let tail = b"new-bytes-and-index".to_vec();
    let rec = AppendRecord {
        old_len: old.len() as u64,
        new_len: (old.len() + tail.len()) as u64,
        tail_crc: crc32c::crc32c(&tail),
    };
    std::fs::write(root.join("a/c/2.shardfs-append"), rec.encode()).unwrap();
    std::fs::write(root.join("a/c/2"), [&old[..], &tail[..7]].concat()).unwrap();
    std::fs::write(root.join("a/c/3.shardfs-tmp"), b"half a shard").unwrap();
    let report = verify(root, false, false).unwrap();
    let found = problems_of(&report);
    assert_eq!(found.len(), 3, "{report}");
    assert!(
        found
            .iter()
            .any(|(s, w)| s == "a/c/2" && w.contains("append record"))
    );
    assert!(
        found
            .iter()
            .any(|(s, w)| s == "a/c/3" && w.contains("temp file"))
    );
    assert!(
        found
            .iter()
            .any(|(s, w)| s == "a/c/2" && w.contains("index"))
    );
    assert_eq!(RECORD_LEN, 40);
    let report = verify(root, true, false).unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.repaired_count, 2, "{report}");
    assert_eq!(std::fs::read(root.join("a/c/2")).unwrap(), old);
    assert!(!root.join("a/c/3.shardfs-tmp").exists());
    assert!(!root.join("a/c/2.shardfs-append").exists());
}

#[test]
fn verify_reports_shard_paths_that_are_not_files_and_carries_on_past_a_broken_zarr_json() {
    let (dir, layout) = store(IndexLocation::End, true, Endian::Little);
    let root = dir.path();
    for s in 0..4 {
        put(root, &format!("a/c/{s}"), &layout, &[(0, b"0000")]);
    }
    // Kept until the end: the symbolic link's target.
    let _outside = shard_paths_that_are_not_files(root);
    // A zarr.json that is a directory, beside the array: left out, the walk goes on.
    std::fs::create_dir_all(root.join("b/zarr.json")).unwrap();
    let report = verify(root, false, false).unwrap();
    let found = problems_of(&report);
    assert_eq!(found.len(), 3, "{report}");
    assert!(
        found[0].0 == "a/c/1" && found[0].1.contains("a directory"),
        "{found:?}"
    );
    assert!(
        found[1].0 == "a/c/2" && found[1].1.contains("special file"),
        "{found:?}"
    );
    assert!(
        found[2].0 == "a/c/3" && found[2].1.contains("symbolic link"),
        "{found:?}"
    );
    assert_eq!(report.shards_checked, 4);
}

#[test]
fn verify_reports_chunks_whose_length_the_codecs_cannot_decode() {
    // Uncompressed uint8 chunks of 2 elements are 2 bytes (6 with crc32c); a chunk of
    // another length is stored data no Zarr reader decodes (issue 33, finding 5).
    let (dir, layout) = store_with(
        IndexLocation::End,
        true,
        Endian::Little,
        json!([{"name": "bytes"}, {"name": "crc32c"}]),
    );
    assert_eq!(layout.fixed_chunk_len, Some(2 + 4));
    let root = dir.path();
    put(root, "a/c/0", &layout, &[(0, b"abcd"), (1, b"abcdef")]);
    let found = problems_of(&verify(root, false, false).unwrap());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "a/c/0");
    assert!(found[0].1.contains("inner chunk 0 is 4 bytes"), "{found:?}");
}

#[test]
fn verify_reports_metadata_that_is_no_whole_document() {
    // A `zarr.json` cut short: zarr cannot open that node (issue 33, finding 2).
    let (dir, _) = store(IndexLocation::End, false, Endian::Little);
    let root = dir.path();
    std::fs::create_dir(root.join("g")).unwrap();
    std::fs::write(root.join("g/zarr.json"), br#"{"zarr_format": 3, "node_ty"#).unwrap();
    let report = verify(root, false, false).unwrap();
    assert!(!report.is_clean());
    let found = problems_of(&report);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "g/zarr.json");
    assert!(found[0].1.contains("not a valid document"), "{found:?}");
}
