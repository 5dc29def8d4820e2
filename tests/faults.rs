//! Faults of the store seen through a real mount: a full disk reaches the writer as
//! `ENOSPC` at `fsync`, the data stays staged, and is stored once there is room again
//! (docs/SEMANTICS.md, "Failures"); and (command_line.rs) mount points and commands
//! refused with the reason, and the system log of a daemonized mount.

#[path = "faults/command_line.rs"]
mod command_line;
mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::mount::{CliMount, flush_on_demand, mount_with, shardfs};
use serde_json::json;
use shardfs::{Mount, MountOptions};

/// A small tmpfs of our own, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn new(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "shardfs-test"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    /// Unmounted, waiting while it is busy (a lazily detached shardfs daemon over the
    /// store in it may still be closing its files), and detached lazily if it stays
    /// busy: never left mounted. Before, one `umount` that met a busy tmpfs left it
    /// mounted (seen once in a loaded run of the whole suite).
    fn drop(&mut self) {
        let umount = |lazy: bool| {
            let mut cmd = Command::new("umount");
            if lazy {
                cmd.arg("-l");
            }
            cmd.arg(self.dir.path())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        for _ in 0..200 {
            if umount(false) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        if !umount(true) {
            eprintln!(
                "faults: could not unmount the tmpfs at {}",
                self.dir.path().display()
            );
        }
    }
}

const CHUNK: usize = 256 << 10;

/// A store `root/s` holding one 1-d uint8 array `a` of 2 shards of 4 inner chunks of
/// 256 KiB (index at the end, with crc32c): chunks large enough that a small tmpfs
/// runs out of room for one.
fn large_chunk_store(root: &Path) -> PathBuf {
    let store = root.join("s");
    fs::create_dir_all(store.join("a")).unwrap();
    let doc = common::sharded_u8_array(
        CHUNK * 8,
        CHUNK * 4,
        CHUNK,
        json!([{"name": "bytes"}]),
        common::index_codecs_crc32c(),
        "end",
    );
    fs::write(store.join("a/zarr.json"), serde_json::to_vec(&doc).unwrap()).unwrap();
    store
}

#[test]
fn a_full_disk_is_enospc_at_fsync_and_the_chunk_is_stored_once_there_is_room() {
    if !common::can_mount() {
        return;
    }
    let tmpfs = match Tmpfs::new("2m") {
        Ok(t) => t,
        Err(why) if std::env::var_os("CI").is_none() => {
            common::skipped(&format!("cannot mount a tmpfs: {why}"));
            return;
        }
        Err(why) => panic!(
            "{}: {why} (CI runs as root and must be able to)",
            common::test_name()
        ),
    };
    let store = large_chunk_store(tmpfs.path());
    // Fill the tmpfs but for less than one chunk.
    let filler = tmpfs.path().join("filler");
    let mut f = fs::File::create(&filler).unwrap();
    let block = vec![7u8; 64 << 10];
    while f.write_all(&block).is_ok() {}
    drop(f);
    let free_after_fill = fs::metadata(&filler).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&filler)
        .unwrap()
        .set_len(free_after_fill - (CHUNK as u64 / 2))
        .unwrap();

    let opts = flush_on_demand();
    let (mnt, mount) = mount_with(&store, &opts);
    let chunk = mnt.path().join("a/c/1");
    let data: Vec<u8> = (0..CHUNK).map(|i| (i % 251) as u8).collect();
    fs::create_dir_all(chunk.parent().unwrap()).unwrap();
    let mut f = fs::File::create(&chunk).unwrap();
    f.write_all(&data).unwrap();
    let err = f.sync_all().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    drop(f);
    // Not lost: the mount still reads it, and nothing half-written is in the store.
    assert_eq!(fs::read(&chunk).unwrap(), data);
    let leftovers: Vec<_> = fs::read_dir(store.join("a"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "zarr.json")
        .collect();
    assert!(
        fs::read_dir(store.join("a/c")).map_or(true, |d| d.count() == 0),
        "no shard or temp file left: {leftovers:?}"
    );
    // Room again: the next fsync stores it.
    fs::remove_file(&filler).unwrap();
    fs::File::open(&chunk).unwrap().sync_all().unwrap();
    mount.unmount().unwrap();
    let report = shardfs::maint::verify(&store, false, false).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let again = tempfile::tempdir().unwrap();
    {
        let _m = Mount::new(&store, again.path(), &opts).unwrap();
        assert_eq!(fs::read(again.path().join("a/c/1")).unwrap(), data);
    }

    // `shardfs unmount` of a daemonized mount that cannot store what it holds refuses,
    // names the chunks and the way to discard them; once there is room it unmounts.
    // The store full again, a daemonized mount, a chunk written to `key` and staged.
    let daemon_with_a_staged_chunk = |key: &str| -> (CliMount, Vec<u32>) {
        let mut f = fs::File::create(&filler).unwrap();
        while f.write_all(&block).is_ok() {}
        drop(f);
        let mount = CliMount::new(&store, again.path(), &["--flush-interval", "3600"]);
        fs::write(again.path().join(key), &data).unwrap();
        let daemons = shardfs::mount::daemon_pids(again.path());
        assert_eq!(daemons.len(), 1, "{daemons:?}");
        (mount, daemons)
    };
    let (refusing, _) = daemon_with_a_staged_chunk("a/c/0");
    let out = shardfs().arg("unmount").arg(again.path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let refused = !out.status.success();
    fs::remove_file(&filler).unwrap();
    refusing.unmount();
    assert!(refused, "unmount of a mount that cannot flush");
    assert!(
        err.contains("No space left")
            && err.contains("1 chunk of array \"a\" (c/0)")
            && err.contains("--lazy"),
        "{err}"
    );
    let report = shardfs::maint::verify(&store, false, false).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);

    // A plain umount(8) (or `fusermount3 -u`) with the store full: nothing refuses, and
    // the daemon holds the only copy of what it staged. It stays, trying again, and
    // stores it once there is room (it used to exit at once, the chunk lost).
    let (_umounted, daemons) = daemon_with_a_staged_chunk("a/c/2");
    shardfs::mount::unmount_path(again.path(), false).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(
        !shardfs::mount::wait_for_exit(&daemons, std::time::Duration::ZERO),
        "the daemon stays while what it holds cannot be stored"
    );
    fs::remove_file(&filler).unwrap();
    assert!(
        shardfs::mount::wait_for_exit(&daemons, std::time::Duration::from_secs(120)),
        "the daemon exits once it stored what it held"
    );
    {
        let _m = Mount::new(&store, again.path(), &opts).unwrap();
        assert_eq!(
            fs::read(again.path().join("a/c/2")).unwrap(),
            data,
            "stored after the umount"
        );
    }
    // `shardfs unmount --lazy` gives it up, as it says: the daemon exits.
    let (_given_up, daemons) = daemon_with_a_staged_chunk("a/c/3");
    let out = shardfs()
        .args(["unmount", "--lazy"])
        .arg(again.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        shardfs::mount::wait_for_exit(&daemons, std::time::Duration::from_secs(120)),
        "--lazy gives up what cannot be stored"
    );
    fs::remove_file(&filler).unwrap();
    let report = shardfs::maint::verify(&store, false, false).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

fn write_file(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = fs::File::create(path).unwrap();
    f.write_all(bytes).unwrap();
}

fn fsync(path: &Path) -> std::io::Result<()> {
    fs::File::open(path)?.sync_all()
}

#[test]
fn a_shard_that_cannot_be_committed_fails_only_its_own_chunks() {
    if !common::can_mount() {
        return;
    }
    let tmp = common::store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let (mnt, g) = mount_with(&store, &flush_on_demand());
    let arr = mnt.path().join("u16_default_sparse");
    // c/0/0 lies in shard c/0/0, c/2/2 in shard c/1/1; index_nocrc is another array.
    write_file(&arr.join("c/0/0"), &[1; 24]);
    write_file(&arr.join("c/2/2"), &[2; 24]);
    // The shard of c/0/0 is corrupted after its chunk was staged.
    let shard = store.join("u16_default_sparse/c/0/0");
    let good = fs::read(&shard).unwrap();
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 1] ^= 0xff; // the index's crc32c
    fs::write(&shard, &bad).unwrap();
    let other = mnt.path().join("index_nocrc/c/0/0");
    let other_before = fs::read(&other).unwrap();
    write_file(&other, &other_before);

    assert_eq!(
        fsync(&arr.join("c/0/0")).unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
    // Its neighbour in another shard, and another array, are stored.
    fsync(&arr.join("c/2/2")).unwrap();
    fsync(&other).unwrap();
    // The failed chunk is kept (the mount still reads it) and the shard untouched.
    assert_eq!(fs::read(arr.join("c/0/0")).unwrap(), [1; 24]);
    assert_eq!(fs::read(&shard).unwrap(), bad);
    // Repaired, the next fsync stores it.
    fs::write(&shard, &good).unwrap();
    fsync(&arr.join("c/0/0")).unwrap();
    g.unmount().unwrap();
    let (again, _g) = mount_with(&store, &flush_on_demand());
    let arr = again.path().join("u16_default_sparse");
    assert_eq!(fs::read(arr.join("c/0/0")).unwrap(), [1; 24]);
    assert_eq!(fs::read(arr.join("c/2/2")).unwrap(), [2; 24]);
}

#[test]
fn metadata_whose_chunks_could_never_be_stored_is_refused_when_written() {
    if !common::can_mount() {
        return;
    }
    let doc = json!({
        "zarr_format": 3, "node_type": "array", "shape": [1u64 << 40, 1u64 << 40],
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, 1]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes"}],
    });
    for open_checks in [false, true] {
        let tmp = common::store_copy("zarr_basic");
        let store = tmp.path().join("s");
        let mnt = tempfile::tempdir().unwrap();
        let opts = MountOptions {
            open_checks,
            ..MountOptions::default()
        };
        let _g = Mount::new(&store, mnt.path(), &opts).unwrap();
        let dir = mnt.path().join("huge");
        fs::create_dir(&dir).unwrap();
        let mut f = fs::File::create(dir.join("zarr.json")).unwrap();
        let written = f.write_all(&serde_json::to_vec(&doc).unwrap());
        let closed = nix_close(f);
        let refused = if open_checks {
            // close(2) reports the refusal (FUSE flush).
            written.unwrap();
            closed
        } else {
            // The kernel opened the file itself: the write that makes the document
            // whole is refused.
            closed.unwrap();
            written
        };
        assert_eq!(
            refused.unwrap_err().raw_os_error(),
            Some(libc::EINVAL),
            "open_checks {open_checks}"
        );
        // Nothing of it is left to read.
        assert!(!store.join("huge/zarr.json").exists());
        assert!(fs::read(dir.join("zarr.json")).is_err());
        // The mount is not jammed: everything else flushes.
        write_file(&mnt.path().join("u16_default_sparse/c/0/0"), &[3; 24]);
        fsync(mnt.path()).unwrap();
    }
}

/// Close `f` and return what close(2) said (std's drop ignores it).
fn nix_close(f: fs::File) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was just taken from a `File`, so it is open and owned here.
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn a_shard_path_that_is_not_a_regular_file_fails_its_chunks_with_eio() {
    if !common::can_mount() {
        return;
    }
    let tmp = common::store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let c = store.join("u16_default_sparse/c");
    // Shard c/1/2 becomes a directory, c/2/0 a FIFO, c/2/2 a symbolic link out of the
    // store (to a valid shard, which must not be followed).
    fs::remove_file(c.join("1/2")).unwrap();
    fs::create_dir(c.join("1/2")).unwrap();
    fs::remove_file(c.join("2/0")).unwrap();
    let fifo = std::ffi::CString::new(c.join("2/0").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let outside = tempfile::tempdir().unwrap();
    fs::rename(c.join("2/2"), outside.path().join("shard")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("shard"), c.join("2/2")).unwrap();
    for read_only in [true, false] {
        let mnt = tempfile::tempdir().unwrap();
        let opts = MountOptions {
            read_only,
            ..MountOptions::default()
        };
        let _m = Mount::new(&store, mnt.path(), &opts).unwrap();
        let arr = mnt.path().join("u16_default_sparse");
        // Listed (not vanished), and EIO to read; the chunks of regular shards read.
        let mut eio = 0;
        for dir in fs::read_dir(arr.join("c")).unwrap() {
            for chunk in fs::read_dir(dir.unwrap().path()).unwrap() {
                let p = chunk.unwrap().path();
                match fs::read(&p) {
                    Ok(_) => {}
                    Err(e) => {
                        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{}", p.display());
                        eio += 1;
                    }
                }
            }
        }
        assert!(
            eio >= 3,
            "chunks of the three odd shards read as EIO ({eio})"
        );
        assert!(fs::read(arr.join("c/0/0")).is_ok(), "a regular shard reads");
    }
    assert!(
        outside.path().join("shard").exists(),
        "the link's target untouched"
    );
}

#[test]
fn the_daemon_never_follows_a_symbolic_link_out_of_the_store() {
    if !common::can_mount() {
        return;
    }
    let tmp = common::store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let outside = tempfile::tempdir().unwrap();
    // A sharded array whose zarr.json is a link to a valid document outside the store.
    let arr = store.join("u16_default_sparse");
    fs::rename(arr.join("zarr.json"), outside.path().join("zarr.json")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("zarr.json"), arr.join("zarr.json")).unwrap();
    // A plain link beside it.
    std::os::unix::fs::symlink("../index_nocrc/zarr.json", store.join("link")).unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let _m = Mount::new(&store, mnt.path(), &MountOptions::default()).unwrap();
    // Links are shown as links, with their stored target (the kernel resolves them, as
    // on any file system, inside the mount).
    assert_eq!(
        fs::read_link(mnt.path().join("link")).unwrap(),
        Path::new("../index_nocrc/zarr.json")
    );
    // The daemon does not read through the link: the directory is not shown as an
    // unsharded array (its shard files pass through as they are).
    let shown = mnt.path().join("u16_default_sparse");
    assert!(
        fs::symlink_metadata(shown.join("zarr.json"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "zarr.json is shown as the link it is"
    );
    assert!(
        fs::metadata(shown.join("c/0/0")).unwrap().is_file(),
        "the shard, as stored"
    );
}
