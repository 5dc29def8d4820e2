//! The containers through the view core, on the in-memory store, without a mount: names,
//! listings, chunk bytes, the re-encoded last chunk, and EIO for what is broken.
//! (tests/containers.rs reads containers made by bcolz and bloscpack through a mount.)

use std::ffi::OsStr;
use std::sync::Arc;

use super::*;
use crate::format::blosc;
use crate::format::bloscpack::tests::build;
use crate::store::memory::MemoryStore;

fn view(store: MemoryStore, format: ViewFormat) -> View {
    let config = ViewConfig {
        format,
        ..ViewConfig::default()
    };
    View::new(Arc::new(store), config).unwrap()
}

fn names(view: &View, ino: u64) -> Vec<String> {
    let entries = view.readdir(ino).unwrap();
    entries
        .iter()
        .map(|e| e.name.to_string_lossy().into_owned())
        .collect()
}

fn read_all(view: &View, ino: u64) -> Result<Vec<u8>> {
    let fh = view.open(ino, false, false)?.fh;
    let out = view.read(fh, 0, 1 << 24);
    view.release(fh)?;
    out
}

fn path_ino(view: &View, path: &str) -> Result<u64> {
    let mut ino = ROOT_INO;
    for part in path.split('/') {
        ino = view.lookup(ino, OsStr::new(part))?.ino;
    }
    Ok(ino)
}

fn words(n: u32) -> Vec<u8> {
    (0..n).flat_map(|i| i.to_le_bytes()).collect()
}

#[test]
fn a_bloscpack_file_is_a_directory_of_one_array_with_its_frames_as_chunks() {
    let data = words(1000);
    let meta =
        serde_json::json!({"dtype": "'<u4'", "shape": [1000], "order": "C", "container": "numpy"});
    let file = build(&data, 1200, true, Some(&meta), Checksum::Crc32).file;
    let store = MemoryStore::new();
    store.put("a.blp", file.clone());
    store.put("plain.blp", b"not a bloscpack file".to_vec());
    let v = view(store, ViewFormat::V3);
    assert_eq!(names(&v, ROOT_INO), ["a.blp", "plain.blp"]);
    let dir = v.lookup(ROOT_INO, OsStr::new("a.blp")).unwrap();
    assert_eq!(dir.kind, Kind::Dir);
    assert_eq!(dir.perm & 0o222, 0);
    assert_eq!(
        names(&v, dir.ino),
        ["c.0", "c.1", "c.2", "c.3", "zarr.json"]
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&read_all(&v, path_ino(&v, "a.blp/zarr.json").unwrap()).unwrap())
            .unwrap();
    assert_eq!(doc["data_type"], "uint32");
    assert_eq!(doc["chunk_grid"]["configuration"]["chunk_shape"][0], 300);
    // A whole chunk: the stored frame, byte for byte.
    let c0 = read_all(&v, path_ino(&v, "a.blp/c.0").unwrap()).unwrap();
    assert_eq!(blosc::decode(&c0, 1200).unwrap(), data[..1200]);
    assert!(file.windows(c0.len()).any(|w| w == c0));
    // The short last chunk: 400 bytes decoded, padded to a whole chunk, encoded again.
    let c3 = read_all(&v, path_ino(&v, "a.blp/c.3").unwrap()).unwrap();
    let whole = blosc::decode(&c3, 1200).unwrap();
    assert_eq!(whole[..400], data[3600..]);
    assert!(whole[400..].iter().all(|&b| b == 0));
    // Not a container: passes through.
    let plain = v.lookup(ROOT_INO, OsStr::new("plain.blp")).unwrap();
    assert_eq!(plain.kind, Kind::File);
    // The v2 view: .zarray, .zattrs, keys without `c.`.
    let store = MemoryStore::new();
    store.put("a.blp", file);
    let v2 = view(store, ViewFormat::V2);
    let dir = v2.lookup(ROOT_INO, OsStr::new("a.blp")).unwrap();
    assert_eq!(
        names(&v2, dir.ino),
        [".zarray", ".zattrs", "0", "1", "2", "3"]
    );
}

#[test]
fn a_chunk_whose_checksum_fails_is_eio_and_the_others_read() {
    let data = words(1000);
    let mut file = build(&data, 1200, true, None, Checksum::Sha256).file;
    let p = bloscpack::parse_prefix(&file, file.len() as u64).unwrap();
    let second = p.offsets.unwrap()[1] as usize;
    file[second + 30] ^= 1;
    let store = MemoryStore::new();
    store.put("a.blp", file);
    let v = view(store, ViewFormat::V3);
    let err = read_all(&v, path_ino(&v, "a.blp/c.1").unwrap()).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    assert!(read_all(&v, path_ino(&v, "a.blp/c.0").unwrap()).is_ok());
    // Truncated: the file is EIO at lookup.
    let store = MemoryStore::new();
    let good = build(&data, 1200, true, None, Checksum::Sha256).file;
    store.put("cut.blp", good[..good.len() - 10].to_vec());
    let v = view(store, ViewFormat::V3);
    let err = v.lookup(ROOT_INO, OsStr::new("cut.blp")).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
}

/// A bcolz chunk file of `data`.
fn chunk_file(data: &[u8], typesize: usize) -> Vec<u8> {
    let mut f = b"blpk\x01\0\0\0\x01\0\0\0\0\0\0\0".to_vec();
    f.extend_from_slice(&blosc::encode_uncompressed(data, typesize, 1).unwrap());
    f
}

fn carray(store: &MemoryStore, dir: &str, rows: u32, chunklen: u32) -> Vec<u8> {
    let data = words(rows * 2);
    store.put(
        format!("{dir}/meta/sizes"),
        format!(r#"{{"shape": [{rows}, 2], "nbytes": 0, "cbytes": 0}}"#).into_bytes(),
    );
    store.put(
        format!("{dir}/meta/storage"),
        format!(r#"{{"dtype": "uint32", "cparams": {{"clevel": 3}}, "chunklen": {chunklen}, "dflt": 7}}"#)
            .into_bytes(),
    );
    store.put(format!("{dir}/__attrs__"), br#"{"a": 1}"#.to_vec());
    for (i, c) in data.chunks(8 * chunklen as usize).enumerate() {
        store.put(format!("{dir}/data/__{i}.blp"), chunk_file(c, 4));
    }
    data
}

#[test]
fn a_carray_is_an_array_and_a_ctable_a_group_of_its_columns() {
    let store = MemoryStore::new();
    let data = carray(&store, "c", 25, 10);
    carray(&store, "t/x", 5, 10);
    carray(&store, "t/y", 5, 10);
    store.put("t/__rootdirs__", br#"{"names": ["x", "y"]}"#.to_vec());
    store.put("t/__attrs__", br#"{"title": "t"}"#.to_vec());
    let v = view(store, ViewFormat::V3);
    let c = v.lookup(ROOT_INO, OsStr::new("c")).unwrap();
    assert_eq!(names(&v, c.ino), ["c.0.0", "c.1.0", "c.2.0", "zarr.json"]);
    let doc: serde_json::Value =
        serde_json::from_slice(&read_all(&v, path_ino(&v, "c/zarr.json").unwrap()).unwrap())
            .unwrap();
    assert_eq!(doc["fill_value"], 7);
    assert_eq!(doc["attributes"]["a"], 1);
    assert_eq!(doc["codecs"][1]["configuration"]["clevel"], 3);
    // The last chunk (5 of 10 rows) padded with the fill value.
    let last = read_all(&v, path_ino(&v, "c/c.2.0").unwrap()).unwrap();
    let whole = blosc::decode(&last, 80).unwrap();
    assert_eq!(whole[..40], data[160..]);
    assert_eq!(whole[40..44], 7u32.to_le_bytes());
    let t = v.lookup(ROOT_INO, OsStr::new("t")).unwrap();
    assert_eq!(names(&v, t.ino), ["x", "y", "zarr.json"]);
    assert_eq!(v.lookup(t.ino, OsStr::new("x")).unwrap().kind, Kind::Dir);
    assert!(v.lookup(t.ino, OsStr::new("__rootdirs__")).is_err());
}

#[test]
fn a_broken_carray_is_eio_and_a_missing_chunk_file_fails_alone() {
    let store = MemoryStore::new();
    carray(&store, "bad", 25, 10);
    store.put("bad/meta/storage", b"{\"dtype\": ".to_vec());
    carray(&store, "gap", 30, 10);
    store.put("gap/data/__1.blp", b"blpk".to_vec());
    let v = view(store, ViewFormat::V3);
    let err = v.lookup(ROOT_INO, OsStr::new("bad")).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    let err = read_all(&v, path_ino(&v, "gap/c.1.0").unwrap()).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    assert!(read_all(&v, path_ino(&v, "gap/c.2.0").unwrap()).is_ok());
    // The store's listing is still whole, and the info walk names both.
    let infos = crate::info::inspect(v.store().as_ref()).unwrap();
    let status: Vec<(&str, &str)> = infos
        .iter()
        .map(|i| (i.path.as_str(), i.status.as_str()))
        .collect();
    assert_eq!(
        status,
        [("bad", "container (unreadable)"), ("gap", "bcolz carray")]
    );
}
