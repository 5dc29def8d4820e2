//! The whole path through the kernel: mounts in temporary directories, always unmounted
//! by the `Mount` guard (also when an assertion fails), and the command line.

#[path = "mount/caching.rs"]
mod caching;
#[path = "mount/cli.rs"]
mod cli;
mod common;
#[path = "mount/kernel_writes.rs"]
mod kernel_writes;
#[path = "mount/open_checks.rs"]
mod open_checks;
#[path = "mount/set_times.rs"]
mod set_times;
#[path = "mount/unlinked_meta.rs"]
mod unlinked_meta;

use common::mount::{CliMount, is_mounted, shardfs};

use std::path::{Path, PathBuf};
use std::process::Command;

use shardfs::{Mount, MountOptions};

/// Fixtures are mounted read-only: no test may change them.
fn read_only() -> MountOptions {
    MountOptions {
        read_only: true,
        ..MountOptions::default()
    }
}

/// A writable mount that asks the daemon at every open (`-o open_checks`).
fn open_checks() -> MountOptions {
    MountOptions {
        open_checks: true,
        ..MountOptions::default()
    }
}

/// `close(2)` of `f`, which must succeed (a std `File`'s drop ignores the error).
fn close_checked(f: std::fs::File, what: &str) {
    let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
    // SAFETY: `fd` was just taken out of `f`, which no longer owns it.
    let rc = unsafe { libc::close(fd) };
    assert_eq!(rc, 0, "{what}: {}", std::io::Error::last_os_error());
}

fn mounted(store: &Path) -> (tempfile::TempDir, Mount) {
    let dir = tempfile::tempdir().unwrap();
    let mount = Mount::new(store, dir.path(), &read_only()).unwrap();
    (dir, mount)
}

#[test]
fn fixture_mounts_equal_their_unsharded_twins() {
    if !common::can_mount() {
        return;
    }
    for store in common::stores_with_twins() {
        let (dir, _mount) = mounted(&common::fixtures().join(&store));
        let twin = common::fixtures().join(format!("{store}.twin"));
        let listed = common::files_under(dir.path());
        assert_eq!(listed, common::files_under(&twin), "{store}: listing");
        for rel in &listed {
            let got = std::fs::read(dir.path().join(rel)).unwrap();
            let want = std::fs::read(twin.join(rel)).unwrap();
            let size = std::fs::metadata(dir.path().join(rel)).unwrap().len();
            assert_eq!(
                size,
                got.len() as u64,
                "{store}/{rel}: stat size equals bytes read"
            );
            if rel.ends_with("zarr.json") {
                assert_eq!(
                    serde_json::from_slice::<serde_json::Value>(&got).unwrap(),
                    serde_json::from_slice::<serde_json::Value>(&want).unwrap(),
                    "{store}/{rel}"
                );
            } else {
                assert_eq!(got, want, "{store}/{rel}");
            }
        }
    }
}

#[test]
fn chunk_reads_at_offsets_return_exactly_the_shard_slice() {
    use std::io::{Read, Seek, SeekFrom};
    if !common::can_mount() {
        return;
    }
    let (dir, _mount) = mounted(&common::fixtures().join("zarr_codecs"));
    let twin = common::fixtures().join("zarr_codecs.twin/inner_gzip/c/0/0");
    let want = std::fs::read(&twin).unwrap();
    let mut f = std::fs::File::open(dir.path().join("inner_gzip/c/0/0")).unwrap();
    let end = f.seek(SeekFrom::End(0)).unwrap();
    assert_eq!(
        end,
        want.len() as u64,
        "readers seek to the end for the size"
    );
    f.seek(SeekFrom::Start(3)).unwrap();
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).unwrap();
    assert_eq!(buf, want[3..]);
}

#[test]
fn corrupt_shard_gives_eio_for_its_chunks_only() {
    if !common::can_mount() {
        return;
    }
    let entry = common::manifest()
        .into_iter()
        .find(|e| e["store"] == "corrupt")
        .unwrap();
    let (dir, _mount) = mounted(&common::fixtures().join("corrupt"));
    let ok: Vec<&str> = entry["ok_chunk_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    let mut eio = 0;
    for key in entry["chunk_keys"].as_array().unwrap() {
        let key = key.as_str().unwrap();
        let res = std::fs::read(dir.path().join("u8").join(key));
        if ok.contains(&key) {
            assert_eq!(res.unwrap().len(), 4, "{key}");
        } else if let Err(e) = res {
            assert_eq!(e.raw_os_error(), Some(libc::EIO), "{key}: {e}");
            eio += 1;
        }
    }
    assert!(eio >= 8, "{eio}");
    assert!(std::fs::read(dir.path().join("u8/zarr.json")).is_ok());
}

#[test]
fn v2_probes_are_enoent_and_the_mount_is_read_only() {
    if !common::can_mount() {
        return;
    }
    let (dir, _mount) = mounted(&common::fixtures().join("zarr_basic"));
    for probe in [
        ".zgroup",
        ".zattrs",
        "index_start/.zarray",
        "index_start/.zattrs",
    ] {
        let e = std::fs::metadata(dir.path().join(probe)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{probe}");
    }
    let e = std::fs::write(dir.path().join("index_start/c/0/0"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
}

#[test]
fn symlinks_never_lead_outside_the_store() {
    if !common::can_mount() {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"s").unwrap();
    let store = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), store.path().join("escape")).unwrap();
    std::fs::write(store.path().join("file"), b"in").unwrap();
    std::os::unix::fs::symlink("file", store.path().join("link")).unwrap();
    let (dir, _mount) = mounted(store.path());
    // The link is shown as a link; the kernel resolves it within the mount's namespace.
    assert_eq!(
        std::fs::read_link(dir.path().join("escape")).unwrap(),
        outside.path()
    );
    assert_eq!(std::fs::read(dir.path().join("link")).unwrap(), b"in");
    assert!(
        std::fs::symlink_metadata(dir.path().join("escape"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn guard_unmounts_on_drop_even_after_a_panic() {
    if !common::can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let result = std::panic::catch_unwind(|| {
        let _m = Mount::new(
            common::fixtures().join("zarr_basic"),
            &path,
            &MountOptions::default(),
        )
        .unwrap();
        assert!(is_mounted(&path));
        panic!("a failing test");
    });
    assert!(result.is_err());
    assert!(!is_mounted(&path), "the guard unmounted");
}

/// The counters of a live mount, read as `shardfs stats` does.
fn stats_of(mnt: &Path) -> serde_json::Value {
    let bytes = std::fs::read(mnt.join(shardfs::view::STATS_FILE)).unwrap();
    assert_eq!(
        bytes.len() % 4096,
        0,
        "the stats file is padded to whole pages"
    );
    serde_json::from_slice(&bytes).unwrap()
}

/// Another writer of `store`: chunk `key` written through a writable mount of its own,
/// unmounted (so flushed into the shard) before this returns.
fn write_elsewhere(store: &Path, key: &str, bytes: &[u8]) {
    let w = tempfile::tempdir().unwrap();
    let _rw = Mount::new(store, w.path(), &MountOptions::default()).unwrap();
    std::fs::write(w.path().join(key), bytes).unwrap();
}

/// A store with one 1-d uint8 array `u` of `len` elements, shards of `shard`, inner
/// chunks of 8 bytes, no compression (every chunk exactly 8 bytes).
fn uncompressed_array_u(len: usize, shard: usize) -> tempfile::TempDir {
    store_with_u8_array("u", len, shard, serde_json::json!([{"name": "bytes"}]))
}

/// A store with one 1-d uint8 array `name`: `len` elements, shards of `shard`, inner
/// chunks of 8, `codecs` inside the shards.
fn store_with_u8_array(
    name: &str,
    len: usize,
    shard: usize,
    codecs: serde_json::Value,
) -> tempfile::TempDir {
    let store = tempfile::tempdir().unwrap();
    let meta =
        common::sharded_u8_array(len, shard, 8, codecs, common::index_codecs_crc32c(), "end");
    std::fs::create_dir(store.path().join(name)).unwrap();
    std::fs::write(
        store.path().join(name).join("zarr.json"),
        serde_json::to_vec(&meta).unwrap(),
    )
    .unwrap();
    store
}

/// A store with one 1-d uint8 array `z` of 64 elements, shards of 32, inner chunks of 8,
/// zstd-compressed (chunks of any length).
fn zstd_array_z() -> tempfile::TempDir {
    store_with_u8_array(
        "z",
        64,
        32,
        serde_json::json!([{"name": "bytes"}, {"name": "zstd", "configuration": {"level": 1, "checksum": false}}]),
    )
}
