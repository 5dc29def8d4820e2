//! A reference-model test of the filesystem core (no FUSE): random sequences of create,
//! write, rename, link, unlink, truncate, fsync, read and "remount" against an in-memory
//! map of what every chunk key should hold, on the sample store's two arrays (index at
//! the end with `/` keys; index at the start with `v2` `.` keys).

mod common;

use common::Lcg;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

use shardfs::compact::CpuCompactor;
use shardfs::store::{LocalStore, Store};
use shardfs::view::{Kind, ROOT_INO, View, ViewConfig, WriteConfig, Writer};

fn open_view(dir: &Path) -> View {
    let store: Arc<dyn Store> = Arc::new(LocalStore::open(dir).unwrap());
    let writer = Writer::new(WriteConfig {
        write_buffer: 4096, // tiny: flushes happen in the middle of sequences
        chunks_per_shard: None,
        shard_target_bytes: 64 << 20,
        compactor: Arc::new(CpuCompactor::new()),
    });
    View::with_writer(store, ViewConfig::default(), Some(writer)).unwrap()
}

/// The directory inode of `path`, making missing key directories on the way.
fn dir_ino(view: &View, path: &str) -> u64 {
    let mut ino = ROOT_INO;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        ino = match view.lookup(ino, OsStr::new(part)) {
            Ok(a) => a.ino,
            Err(_) => view.mkdir(ino, OsStr::new(part)).unwrap().ino,
        };
    }
    ino
}

fn split(key: &str) -> (&str, &str) {
    key.rsplit_once('/').unwrap()
}

fn read(view: &View, key: &str) -> Option<Vec<u8>> {
    let (dir, name) = split(key);
    let attr = view.lookup(dir_ino(view, dir), OsStr::new(name)).ok()?;
    let o = view.open(attr.ino, false, false).unwrap();
    let data = view.read(o.fh, 0, 1 << 20).unwrap();
    view.release(o.fh).unwrap();
    assert_eq!(data.len() as u64, attr.size, "{key}: size");
    Some(data)
}

fn write_direct(view: &View, key: &str, data: &[u8]) {
    let (dir, name) = split(key);
    let (_, o) = view
        .create(dir_ino(view, dir), OsStr::new(name), false, true)
        .unwrap();
    view.write(o.fh, 0, data).unwrap();
    // As the kernel does: a flush at close only where the open asked for one.
    assert!(!o.no_flush, "{key}: a file at a chunk key commits at close");
    view.flush_handle(o.fh).unwrap();
    view.release(o.fh).unwrap();
}

fn write_via_rename(view: &View, key: &str, data: &[u8], link: bool) {
    let (dir, name) = split(key);
    let d = dir_ino(view, dir);
    let tmp = format!("{name}.tmp.partial");
    let (attr, o) = view.create(d, OsStr::new(&tmp), true, false).unwrap();
    view.write(o.fh, 0, data).unwrap();
    // The kernel sends no flush for a temporary file (FOPEN_NOFLUSH): the model neither.
    assert!(o.no_flush, "{tmp}: nothing to commit at close");
    view.release(o.fh).unwrap();
    if link {
        // zarr-python's set-if-not-exists: link, then unlink the temporary.
        match view.link(attr.ino, d, OsStr::new(name)) {
            Ok(_) => {}
            Err(e) => assert_eq!(e.errno(), libc::EEXIST),
        }
        view.unlink(d, OsStr::new(&tmp)).unwrap();
    } else {
        view.rename(d, OsStr::new(&tmp), d, OsStr::new(name), false)
            .unwrap();
    }
}

fn listed(view: &View, ino: u64, prefix: &str, out: &mut BTreeMap<String, ()>) {
    let fh = view.opendir(ino).unwrap();
    let entries = view.dir_entries(fh).unwrap();
    view.releasedir(fh);
    for e in entries.iter().filter(|e| e.name != "." && e.name != "..") {
        let name = e.name.to_str().unwrap();
        let path = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        };
        let Ok(attr) = view.lookup(ino, &e.name) else {
            continue;
        };
        match e.kind {
            Kind::Dir => listed(view, attr.ino, &path, out),
            _ => {
                out.insert(path, ());
            }
        }
    }
}

fn check(view: &View, model: &BTreeMap<String, Vec<u8>>, keys: &[String], step: usize) {
    for key in keys {
        assert_eq!(
            read(view, key).as_ref(),
            model.get(key),
            "step {step}: {key}"
        );
    }
    let mut all = BTreeMap::new();
    listed(view, ROOT_INO, "", &mut all);
    let chunks: Vec<&String> = all.keys().filter(|p| keys.contains(p)).collect();
    let expected: Vec<&String> = model.keys().collect();
    assert_eq!(chunks, expected, "step {step}: listing");
}

#[test]
fn random_operation_sequences_match_the_reference() {
    for seed in [1u64, 2, 3] {
        let dir = tempfile::tempdir().unwrap();
        let sample = shardfs::sample::write_sample_store(dir.path()).unwrap();
        let mut model: BTreeMap<String, Vec<u8>> = sample.chunks.clone().into_iter().collect();
        // Every key of both grids: "raw" is 13x9 chunks of 8x8 (`c/i/j`), "labels/seg"
        // is 4x4x4 chunks of 5x5x5 (`i.j.k`).
        let mut keys: Vec<String> = Vec::new();
        for i in 0..13 {
            for j in 0..9 {
                keys.push(format!("raw/c/{i}/{j}"));
            }
        }
        for i in 0..4 {
            for j in 0..4 {
                for k in 0..4 {
                    keys.push(format!("labels/seg/{i}.{j}.{k}"));
                }
            }
        }
        let mut rng = Lcg(seed);
        let mut view = open_view(dir.path());
        for step in 0..400 {
            let key = keys[rng.below(keys.len() as u64) as usize].clone();
            let len = if key.starts_with("raw") { 128 } else { 125 };
            let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            match rng.below(10) {
                0..=2 => write_direct(&view, &key, &data),
                3..=4 => write_via_rename(&view, &key, &data, false),
                5 => {
                    write_via_rename(&view, &key, &data, true);
                    if model.contains_key(&key) {
                        continue; // set-if-not-exists kept the old chunk
                    }
                }
                6 => {
                    let (d, name) = split(&key);
                    let res = view.unlink(dir_ino(&view, d), OsStr::new(name));
                    assert_eq!(
                        res.is_ok(),
                        model.remove(&key).is_some(),
                        "step {step}: unlink {key}"
                    );
                    continue;
                }
                7 => {
                    // truncate an existing chunk to half its size: no chunk of these
                    // uncompressed arrays has that length, so it is refused and the
                    // chunk stays as it was (issue 33, finding 5)
                    let (d, name) = split(&key);
                    if let Ok(a) = view.lookup(dir_ino(&view, d), OsStr::new(name)) {
                        let res = view.set_size(a.ino, len as u64 / 2);
                        assert_eq!(
                            res.map(|_| ()).map_err(|e| e.errno()),
                            Err(libc::EINVAL),
                            "step {step}: truncate {key}"
                        );
                    }
                    continue;
                }
                8 => {
                    let (d, _) = split(&key);
                    let ino = dir_ino(&view, d);
                    view.fsyncdir(ino).unwrap();
                    continue;
                }
                _ => {
                    // remount: everything durable, a fresh view over the same store
                    view.flush_all().unwrap();
                    drop(view);
                    let report = shardfs::maint::verify(dir.path(), false, false).unwrap();
                    assert!(
                        report.problems.is_empty(),
                        "step {step}: {:?}",
                        report.problems
                    );
                    view = open_view(dir.path());
                    check(&view, &model, &keys, step);
                    continue;
                }
            }
            model.insert(key, data);
            if step % 50 == 0 {
                check(&view, &model, &keys, step);
            }
        }
        view.flush_all().unwrap();
        drop(view);
        let view = open_view(dir.path());
        check(&view, &model, &keys, 400);
    }
}
