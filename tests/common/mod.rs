//! The harness of the integration tests: fixtures and stores, the guards that skip a
//! test where this machine cannot run it, and (in `mount`) mounts that are always
//! unmounted. Each test program compiles it as its own module and uses part of it.
#![allow(dead_code)]

pub mod mount;
pub mod view;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// The `.zarray` of a small v2 array: 4 `uint8` elements in chunks of 2, uncompressed.
pub const ZARRAY_U1_4: &[u8] = br#"{"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "|u1",
    "compressor": null, "fill_value": 0, "order": "C", "filters": null}"#;

/// The root of this checkout.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixtures() -> PathBuf {
    repo().join("tests/fixtures")
}

/// A copy of fixture store `fixture` at `<returned dir>/s`, for tests that change it.
/// Copied in-process: a child forked while another test thread holds a file of its
/// mount open inherits that descriptor, and the two then wait on each other at exit.
pub fn store_copy(fixture: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixtures().join(fixture), &dir.path().join("s"));
    dir
}

/// Copy directory `from` to `to` (files, directories and symbolic links).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let t = e.file_type().unwrap();
        if t.is_dir() {
            copy_tree(&src, &dst);
        } else if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// The fixture manifest written by `scripts/make_fixtures.py`.
pub fn manifest() -> Vec<Value> {
    let bytes =
        std::fs::read(fixtures().join("MANIFEST.json")).expect("tests/fixtures/MANIFEST.json");
    serde_json::from_slice::<Vec<Value>>(&bytes).expect("manifest is a JSON list")
}

/// The name of the running test: libtest runs each test in a thread named after it
/// (also under `--test-threads 1`), so guards need not be told. Called from a thread
/// the test started, it says so instead.
pub fn test_name() -> String {
    match std::thread::current().name() {
        Some(name) => name.to_string(),
        None => "(a test's unnamed thread)".to_string(),
    }
}

/// Whether this machine can mount FUSE file systems. Where it cannot, the test prints
/// why and returns; under CI (`CI` set) that is a failure instead, so a CI machine that
/// lost `/dev/fuse` cannot go green by skipping.
pub fn can_mount() -> bool {
    let why = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => return true,
        Err(e) => format!("cannot open /dev/fuse: {e}"),
    };
    if std::env::var_os("CI").is_some() {
        panic!("{}: {why} (CI must be able to mount)", test_name());
    }
    skipped(&why);
    false
}

/// Say on both streams that the running test is skipped, and why: cargo shows stdout
/// only for failures, so stderr carries it to the log of a passing run.
pub fn skipped(why: &str) {
    let test = test_name();
    println!("SKIPPED {test}: {why}");
    eprintln!("SKIPPED {test}: {why}");
}

/// The Python of venv `venv` (`.venv`, `.venv-zarr2`) of this checkout, made by
/// scripts/setup-venv; where there is none the test prints why and gets `None` (under
/// CI that is a failure).
pub fn venv_python(venv: &str) -> Option<PathBuf> {
    let p = repo().join(venv).join("bin/python");
    if p.exists() {
        return Some(p);
    }
    let why = format!("no {venv}: run {} (scripts/test does)", venv_setup(venv));
    if std::env::var_os("CI").is_some() {
        panic!("{}: {why}", test_name());
    }
    skipped(&why);
    None
}

/// The command that makes venv `venv`: `.venv` by `scripts/setup-venv`, `.venv-NAME`
/// by `scripts/setup-venv NAME`.
pub fn venv_setup(venv: &str) -> String {
    match venv.strip_prefix(".venv-") {
        Some(name) => format!("scripts/setup-venv {name}"),
        None => "scripts/setup-venv".to_string(),
    }
}

/// The names in directory `dir` (a listing through a mount), sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Every regular file under `dir`, as `/`-separated paths relative to `dir`.
pub fn files_under(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    walk(dir, "", &mut out);
    out
}

fn walk(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            walk(&e.path(), &rel, out);
        } else {
            out.insert(rel);
        }
    }
}

/// Stores of the fixture set that have an unsharded twin.
pub fn stores_with_twins() -> Vec<String> {
    let mut stores: Vec<String> = manifest()
        .iter()
        .filter(|e| e["twin"].is_string())
        .map(|e| e["store"].as_str().unwrap().to_string())
        .collect();
    stores.sort();
    stores.dedup();
    stores
}

/// The `zarr.json` of a 1-d uint8 array of `len` elements in shards of `shard`, each of
/// inner chunks of `chunk` stored through `codecs`, the index through `index_codecs` at
/// `index_location` (`"start"`, `"end"`).
pub fn sharded_u8_array(
    len: usize,
    shard: usize,
    chunk: usize,
    codecs: Value,
    index_codecs: Value,
    index_location: &str,
) -> Value {
    json!({
        "zarr_format": 3, "node_type": "array", "shape": [len], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [shard]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [chunk], "codecs": codecs,
            "index_codecs": index_codecs,
            "index_location": index_location}}],
    })
}

/// The usual index codecs: little-endian offsets and lengths, then a crc32c.
pub fn index_codecs_crc32c() -> Value {
    json!([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}])
}

pub fn json_file(path: &Path) -> Value {
    serde_json::from_slice(
        &std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A small deterministic generator, so a failing sequence can be replayed by its seed.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
