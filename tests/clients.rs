//! What clients do to the tree (issue 20): the file-system behaviour that zarr-python's
//! and zarr 2's own test suites, pytest and shell tools rely on, beyond reading and
//! writing chunks.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::mount::mount_rw;
use shardfs::{Mount, MountOptions};

/// A new 3-D uint8 array `name` made through the mount (as a legacy tool makes one: an
/// unsharded `zarr.json`, then chunk files), shape 4×4×4 in 2×2×2 chunks, every chunk
/// written with its own fill.
fn make_3d_array(mnt: &Path, name: &str) {
    let dir = mnt.join(name);
    fs::create_dir(&dir).unwrap();
    let meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [4, 4, 4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2, 2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
    });
    fs::write(dir.join("zarr.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
    for i in 0..2u8 {
        for j in 0..2u8 {
            fs::create_dir_all(dir.join(format!("c/{i}/{j}"))).unwrap();
            for k in 0..2u8 {
                fs::write(
                    dir.join(format!("c/{i}/{j}/{k}")),
                    [1 + i * 4 + j * 2 + k; 8],
                )
                .unwrap();
            }
        }
    }
}

fn shard_files(store: &Path, array: &str) -> Vec<String> {
    let dir = store.join(array);
    if !dir.exists() {
        return Vec::new();
    }
    common::files_under(&dir)
        .into_iter()
        .filter(|f| f != "zarr.json")
        .collect()
}

#[test]
fn rm_rf_removes_an_array_of_any_rank() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    {
        let (mnt, _m) = mount_rw(store.path());
        make_3d_array(mnt.path(), "a3");
        File::open(mnt.path()).unwrap().sync_all().unwrap();
        assert!(!shard_files(store.path(), "a3").is_empty(), "chunks stored");
        // Emptying the last-level directories one by one leaves the parents in place
        // (as on any file system) until they are removed themselves.
        let c0 = mnt.path().join("a3/c/0");
        for j in 0..2 {
            for k in 0..2 {
                fs::remove_file(c0.join(format!("{j}/{k}"))).unwrap();
            }
        }
        let mut left: Vec<_> = fs::read_dir(&c0)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["0", "1"],
            "emptied key directories stay until removed"
        );
        fs::remove_dir(c0.join("0")).unwrap();
        fs::remove_dir(c0.join("1")).unwrap();
        assert_eq!(fs::read_dir(&c0).unwrap().count(), 0);
        // `rm -rf` of the whole array, as shutil.rmtree and zarr's `rmdir` do it.
        let st = std::process::Command::new("rm")
            .arg("-rf")
            .arg(mnt.path().join("a3"))
            .status()
            .unwrap();
        assert!(st.success(), "rm -rf of a 3-D array");
        assert!(!mnt.path().join("a3").exists());
    }
    assert_eq!(shard_files(store.path(), "a3"), Vec::<String>::new());
    assert!(
        !store.path().join("a3").exists(),
        "nothing left in the store"
    );
}

/// Key directories made before the array's metadata (`mkdir -p a/c/0` and then
/// `zarr.json`, as `rsync` and scripts may order it) become key directories of the new
/// array: listed, written into, and removed by `rm -rf` with nothing left in the store,
/// in 1-D (where such a directory stands at a chunk key, the shard's path) and 2-D. One
/// with files in it at a chunk key makes the metadata refused.
#[test]
fn key_directories_made_before_the_metadata_join_the_new_array() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let meta = |shape: &[u64], chunks: &[u64]| {
        serde_json::to_vec(&serde_json::json!({
            "zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
        }))
        .unwrap()
    };
    {
        let (mnt, _m) = mount_rw(store.path());
        let m = mnt.path();
        fs::create_dir_all(m.join("a2/c/0")).unwrap();
        fs::create_dir_all(m.join("a2/c/3")).unwrap();
        fs::write(m.join("a2/zarr.json"), meta(&[8, 8], &[2, 2])).unwrap();
        fs::create_dir_all(m.join("a1/c/0")).unwrap();
        fs::create_dir_all(m.join("a1/c/1")).unwrap();
        fs::write(m.join("a1/zarr.json"), meta(&[8], &[2])).unwrap();
        let names = |p: &Path| {
            let mut v: Vec<String> = fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&m.join("a2")), ["c", "zarr.json"]);
        assert_eq!(names(&m.join("a2/c")), ["0", "3"]);
        // In 1-D, `c/0` is a chunk key: the directory made there is gone, the key is free.
        for (key, fill) in [
            ("a2/c/0/1", 5u8),
            ("a2/c/3/3", 6),
            ("a1/c/0", 7),
            ("a1/c/3", 8),
        ] {
            let tmp = m.join(format!("{key}.partial"));
            fs::create_dir_all(tmp.parent().unwrap()).unwrap();
            fs::write(&tmp, vec![fill; if key.starts_with("a2") { 4 } else { 2 }]).unwrap();
            fs::rename(&tmp, m.join(key)).unwrap();
        }
        File::open(m).unwrap().sync_all().unwrap();
        assert_eq!(fs::read(m.join("a1/c/0")).unwrap(), [7, 7]);
        assert_eq!(fs::read(m.join("a2/c/3/3")).unwrap(), [6; 4]);
        for a in ["a1", "a2"] {
            let st = std::process::Command::new("rm")
                .arg("-rf")
                .arg(m.join(a))
                .status()
                .unwrap();
            assert!(st.success(), "rm -rf {a}");
            assert!(!m.join(a).exists(), "{a}");
        }
    }
    for a in ["a1", "a2"] {
        assert!(
            !store.path().join(a).exists(),
            "{a}: nothing left in the store"
        );
    }
    // A directory with a file in it where a chunk's file (and a shard) would go: the
    // metadata is refused (EINVAL) and leaves nothing behind; the directory stays.
    let (mnt, _m) = mount_rw(store.path());
    let m = mnt.path();
    fs::create_dir_all(m.join("j/c/0")).unwrap();
    fs::write(m.join("j/c/0/junk.txt"), b"hi").unwrap();
    let mut f = File::create(m.join("j/zarr.json")).unwrap();
    let err = f.write_all(&meta(&[8], &[2])).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    drop(f);
    assert_eq!(fs::read(m.join("j/c/0/junk.txt")).unwrap(), b"hi");
    assert!(!store.path().join("j/zarr.json").exists());
    fs::remove_dir_all(m.join("j")).unwrap();
    assert!(!store.path().join("j").exists());
}

#[test]
fn an_empty_key_directory_is_not_listed_after_a_remount() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    {
        let (mnt, _m) = mount_rw(store.path());
        make_3d_array(mnt.path(), "a3");
        for j in 0..2 {
            for k in 0..2 {
                fs::remove_file(mnt.path().join(format!("a3/c/1/{j}/{k}"))).unwrap();
            }
        }
    }
    let (mnt, _m) = mount_rw(store.path());
    let names: Vec<_> = fs::read_dir(mnt.path().join("a3/c"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["0"], "c/1 holds no chunk: it is not shown");
    assert!(!mnt.path().join("a3/c/1").exists());
    assert!(!mnt.path().join("a3/c/1/0").exists());
    assert_eq!(fs::read(mnt.path().join("a3/c/0/1/1")).unwrap(), [4u8; 8]);
}

/// `tempfile.TemporaryFile` (and pytest's output capture with it): create, unlink, then
/// use the descriptor.
fn use_unlinked(dir: &Path) {
    let p = dir.join("tmp-unlinked");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap();
    fs::remove_file(&p).unwrap();
    assert!(!p.exists(), "{}: the name is gone", p.display());
    f.write_all(b"hello world").unwrap();
    let m = f.metadata().unwrap();
    assert_eq!((m.len(), m.nlink()), (11, 0), "{}: fstat", p.display());
    f.set_len(5).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 5, "{}: ftruncate", p.display());
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut back = String::new();
    f.read_to_string(&mut back).unwrap();
    assert_eq!(back, "hello");
    drop(f);
    assert!(
        !p.exists(),
        "{}: closing does not bring it back",
        p.display()
    );
}

/// Files created and unlinked while open (`tempfile.TemporaryFile`) work on every mount.
/// A chunk opened for writing, unlinked, then written: with `open_checks` the write goes
/// to the unlinked file, as on any POSIX file system; with the kernel opening files (the
/// default) the daemon holds nothing of a descriptor it never heard of, and the write
/// gets `ENOENT` (docs/SEMANTICS.md). Either way the chunk stays deleted.
#[test]
fn a_file_unlinked_while_open_lives_on_for_its_descriptor() {
    if !common::can_mount() {
        return;
    }
    for open_checks in [false, true] {
        unlinked_while_open(open_checks);
    }
}

fn unlinked_while_open(open_checks: bool) {
    let store = tempfile::tempdir().unwrap();
    {
        let mnt = tempfile::tempdir().unwrap();
        let opts = MountOptions {
            open_checks,
            ..MountOptions::default()
        };
        let _m = Mount::new(store.path(), mnt.path(), &opts).unwrap();
        // pytest's capture file, held across a test that makes an array (an adoption
        // commits every settled write; an unlinked file has none and stays).
        let held = mnt.path().join("capture");
        let mut capture = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&held)
            .unwrap();
        fs::remove_file(&held).unwrap();
        capture.write_all(b"captured").unwrap();
        make_3d_array(mnt.path(), "a3");
        File::open(mnt.path()).unwrap().sync_all().unwrap();
        capture.seek(SeekFrom::Start(0)).unwrap();
        let mut back = String::new();
        capture.read_to_string(&mut back).unwrap();
        assert_eq!(back, "captured", "open_checks {open_checks}");
        use_unlinked(mnt.path());
        use_unlinked(&mnt.path().join("a3"));
        let chunk = mnt.path().join("a3/c/0/0/0");
        let mut f = OpenOptions::new().write(true).open(&chunk).unwrap();
        fs::remove_file(&chunk).unwrap();
        let written = f.write_all(&[9; 8]);
        if open_checks {
            written.unwrap();
            assert_eq!(f.metadata().unwrap().nlink(), 0);
        } else {
            assert_eq!(written.unwrap_err().raw_os_error(), Some(libc::ENOENT));
        }
        drop(f);
        assert!(!chunk.exists(), "open_checks {open_checks}");
        File::open(mnt.path()).unwrap().sync_all().unwrap();
    }
    let (mnt, _m) = mount_rw(store.path());
    assert!(
        !mnt.path().join("a3/c/0/0/0").exists(),
        "deleted in the store"
    );
    assert_eq!(fs::read(mnt.path().join("a3/c/0/0/1")).unwrap(), [2u8; 8]);
    let names: Vec<_> = fs::read_dir(mnt.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["a3"], "no temporary file left behind");
}

#[test]
fn times_set_through_the_mount_are_what_stat_returns() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let (mnt, _m) = mount_rw(store.path());
    make_3d_array(mnt.path(), "a3");
    fs::write(mnt.path().join("notes.txt"), b"x").unwrap();
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_500_000_000);
    for rel in ["a3/c/0/1/1", "a3/zarr.json", "notes.txt"] {
        let p = mnt.path().join(rel);
        // `touch -d` (utimensat on the name), as rsync -a does after copying.
        let st = std::process::Command::new("touch")
            .arg("-d")
            .arg("@1500000000")
            .arg(&p)
            .status()
            .unwrap();
        assert!(st.success(), "touch -d {rel}");
        let m = fs::metadata(&p).unwrap();
        assert_eq!(m.modified().unwrap(), when, "{rel}: mtime");
        assert_eq!(m.accessed().unwrap(), when, "{rel}: atime");
    }
    // A chunk written after its time was set shows the time of the write again.
    let chunk = mnt.path().join("a3/c/0/1/1");
    fs::write(&chunk, [7u8; 8]).unwrap();
    File::open(mnt.path()).unwrap().sync_all().unwrap();
    let m = fs::metadata(&chunk).unwrap();
    assert!(m.modified().unwrap() > when, "rewritten: a new mtime");
    // `utimensat` through an open descriptor (futimens).
    let f = File::options()
        .write(true)
        .open(mnt.path().join("notes.txt"))
        .unwrap();
    f.set_modified(when + std::time::Duration::from_secs(60))
        .unwrap();
    assert_eq!(
        f.metadata().unwrap().modified().unwrap(),
        when + std::time::Duration::from_secs(60)
    );
}

#[test]
fn an_array_directory_holds_other_directories_and_refuses_sockets_and_links() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let (mnt, _m) = mount_rw(store.path());
    make_3d_array(mnt.path(), "a3");
    // A directory outside the key namespace of an array's directory passes through (a
    // zarr store nested in another's root, as zarr-python's own tests make one).
    let nested = mnt.path().join("a3/store2");
    fs::create_dir(&nested).unwrap();
    fs::write(nested.join("x"), b"y").unwrap();
    assert_eq!(fs::read(store.path().join("a3/store2/x")).unwrap(), b"y");
    fs::remove_dir_all(&nested).unwrap();
    fs::create_dir(&nested).unwrap();
    // ... but not inside the key namespace.
    let e = fs::create_dir(mnt.path().join("a3/c/0/zz")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    // A socket (multiprocessing's forkserver binds one in TMPDIR): EPERM, as mknod(2)
    // says for a file system that does not support the type.
    let e = std::os::unix::net::UnixListener::bind(mnt.path().join("sock")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    // A symbolic link: EPERM too, as symlink(2) says (was ENOSYS).
    let e = std::os::unix::fs::symlink("a3", mnt.path().join("link")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    // Extended attributes and preallocation are not served: EOPNOTSUPP, as the kernel
    // says once a file system answered ENOSYS (no warning in the log for each call).
    fs::write(mnt.path().join("f"), b"x").unwrap();
    let f = fs::OpenOptions::new()
        .write(true)
        .open(mnt.path().join("f"))
        .unwrap();
    use std::os::unix::io::AsRawFd;
    // SAFETY: fallocate on a descriptor we own.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 4096) };
    let err = std::io::Error::last_os_error().raw_os_error();
    assert!(
        r != 0 && err == Some(libc::EOPNOTSUPP),
        "fallocate: {r} {err:?}"
    );
    let name = std::ffi::CString::new("user.x").unwrap();
    // SAFETY: fsetxattr on a descriptor we own, with a valid name and value.
    let r = unsafe { libc::fsetxattr(f.as_raw_fd(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    let err = std::io::Error::last_os_error().raw_os_error();
    assert!(
        r != 0 && err == Some(libc::EOPNOTSUPP),
        "setxattr: {r} {err:?}"
    );
}

#[test]
fn a_shrink_then_removing_the_chunks_outside_succeeds() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let (mnt, _m) = mount_rw(store.path());
    make_3d_array(mnt.path(), "a3");
    let a = mnt.path().join("a3");
    let outside: Vec<_> = (0..2)
        .flat_map(|j| (0..2).map(move |k| format!("c/1/{j}/{k}")))
        .collect();
    for o in &outside {
        assert!(a.join(o).is_file(), "{o} before the shrink");
    }
    // zarr 2's and zarr-python 3's resize: the smaller metadata first, then delete each
    // chunk outside the new shape if it is (still) there. The mount deleted them with
    // the metadata change; a name the kernel still had cached must not fail the delete.
    let meta = fs::read(a.join("zarr.json")).unwrap();
    let mut shrunk: serde_json::Value = serde_json::from_slice(&meta).unwrap();
    shrunk["shape"] = serde_json::json!([2, 4, 4]);
    fs::write(a.join("zarr.json"), serde_json::to_vec(&shrunk).unwrap()).unwrap();
    for o in &outside {
        if a.join(o).is_file() {
            fs::remove_file(a.join(o)).unwrap_or_else(|e| panic!("remove {o}: {e}"));
        }
    }
    fs::write(a.join("zarr.json"), meta).unwrap();
    for o in &outside {
        assert!(!a.join(o).exists(), "{o}: not back after the grow");
    }
    assert_eq!(fs::read(a.join("c/0/1/1")).unwrap(), [4u8; 8]);
}

#[test]
fn a_file_larger_than_the_write_buffer_is_efbig() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let opts = MountOptions {
        write_buffer: 4 << 20,
        ..MountOptions::default()
    };
    let _m = Mount::new(store.path(), mnt.path(), &opts).unwrap();
    make_3d_array(mnt.path(), "a3");
    let chunk = mnt.path().join("a3/c/0/0/0");
    // A truncate far past what one staged file may hold, and a write past it: EFBIG
    // (ENOSPC would say the buffer is busy; the truncate must not allocate 1 TiB).
    let e = OpenOptions::new()
        .write(true)
        .open(&chunk)
        .unwrap()
        .set_len(1 << 40)
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
    assert_eq!(fs::read(&chunk).unwrap().len(), 8, "the chunk is as it was");
    let mut f = OpenOptions::new().write(true).open(&chunk).unwrap();
    let e = f.write_all(&vec![1u8; 5 << 20]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
    drop(f);
    // What was written up to the limit stays, as with any file-size limit.
    assert!(fs::read(&chunk).unwrap().len() <= 4 << 20);
}

/// Inode numbers belong to paths: `readdir`'s `d_ino` is what `stat` returns, and a path
/// keeps its number after the kernel forgot it (Python's `shutil.rmtree` compares `lstat`
/// with `fstat` of the opened directory, and the kernel may forget in between).
#[test]
fn inode_numbers_stay_with_their_paths() {
    use std::os::unix::fs::DirEntryExt;
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let (mnt, _m) = mount_rw(store.path());
    make_3d_array(mnt.path(), "a3");
    File::open(mnt.path()).unwrap().sync_all().unwrap();
    let paths = [
        "a3",
        "a3/zarr.json",
        "a3/c",
        "a3/c/1",
        "a3/c/1/0",
        "a3/c/1/0/1",
    ];
    // Listed before any lookup of the children, then stat'ed: the same numbers.
    for dir in ["a3/c/1/0", "a3/c/1", "a3"] {
        for e in fs::read_dir(mnt.path().join(dir)).unwrap() {
            let e = e.unwrap();
            let st = fs::symlink_metadata(e.path()).unwrap();
            assert_eq!(e.ino(), st.ino(), "{:?}: d_ino and st_ino", e.path());
        }
    }
    let before: Vec<u64> = paths
        .iter()
        .map(|p| fs::symlink_metadata(mnt.path().join(p)).unwrap().ino())
        .collect();
    let distinct: std::collections::HashSet<_> = before.iter().collect();
    assert_eq!(distinct.len(), paths.len(), "{before:?}");
    // Make the kernel forget what it can (root only; CI runs as root).
    match fs::write("/proc/sys/vm/drop_caches", "2\n") {
        Ok(()) => {}
        Err(e) => eprintln!(
            "inode_numbers_stay_with_their_paths: cannot drop the kernel's caches ({e}); \
             the numbers are compared without a forget in between"
        ),
    }
    let after: Vec<u64> = paths
        .iter()
        .map(|p| fs::symlink_metadata(mnt.path().join(p)).unwrap().ino())
        .collect();
    assert_eq!(before, after);
}

/// The chunk coordinates of the arrays `make_3d_array` makes (2 × 2 × 2 chunks).
/// The 2x2x2-chunk array `name` is stored as shards: no chunk file of it is left.
fn assert_stored_sharded(store: &Path, name: &str) {
    assert!(
        !shard_files(store, name).is_empty(),
        "{name}: stored sharded"
    );
    assert!(
        !store.join(name).join("c/1/1/1").exists(),
        "{name}: no chunk file left in the store"
    );
}

fn chunks_2x2x2() -> impl Iterator<Item = (u8, u8, u8)> {
    (0..2u8).flat_map(|i| (0..2u8).flat_map(move |j| (0..2u8).map(move |k| (i, j, k))))
}

/// A writable mount with `kernel_opens` (the kernel opens files itself; the daemon hears
/// of a close only at the release of a file it created): an array made file by file, as
/// a legacy tool makes one (an unsharded `zarr.json` written in place, then key
/// directories and chunk files), is adopted at the write of its `zarr.json`, reads back
/// at once, and is stored sharded; metadata rewritten in place reads back whole.
#[test]
fn an_array_made_file_by_file_through_the_mount_is_stored_sharded() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let want = |i: u8, j: u8, k: u8| [1 + i * 4 + j * 2 + k; 8];
    {
        let mnt = tempfile::tempdir().unwrap();
        let opts = MountOptions::default();
        let m = Mount::new(store.path(), mnt.path(), &opts).unwrap();
        make_3d_array(mnt.path(), "a3");
        for (i, j, k) in chunks_2x2x2() {
            let p = mnt.path().join(format!("a3/c/{i}/{j}/{k}"));
            assert_eq!(fs::read(&p).unwrap(), want(i, j, k), "{}", p.display());
        }
        // (The reads above made the kernel open files itself: from now on no close is
        // heard of.) In `cp -r` order: the chunk files first (plain files, as the
        // directory is no array yet), then `zarr.json`, whose write adopts them.
        let b3 = mnt.path().join("b3");
        for (i, j, k) in chunks_2x2x2() {
            fs::create_dir_all(b3.join(format!("c/{i}/{j}"))).unwrap();
            fs::write(b3.join(format!("c/{i}/{j}/{k}")), want(i, j, k)).unwrap();
        }
        // Compact, as zarr-python writes it (the view shows its documents indented).
        let doc: serde_json::Value =
            serde_json::from_slice(&fs::read(mnt.path().join("a3/zarr.json")).unwrap()).unwrap();
        let b3_doc = serde_json::to_vec(&doc).unwrap();
        fs::write(b3.join("zarr.json"), &b3_doc).unwrap();
        // The new array's metadata reads back as its writer wrote it.
        assert_eq!(
            String::from_utf8(fs::read(b3.join("zarr.json")).unwrap()).unwrap(),
            String::from_utf8(b3_doc).unwrap(),
            "b3/zarr.json as written"
        );
        // Rewritten in place after the adoption: the write reaches the chunk, not the
        // plain file the adoption took in (whose handle the daemon held until then).
        fs::write(b3.join("c/0/0/0"), [99u8; 8]).unwrap();
        // The array's metadata rewritten in place, again and again (attributes of
        // several lengths): every read right after a write is the document written,
        // byte for byte. (Before, the view showed its own indented rendering at once:
        // the kernel kept the writer's length until the invalidation after the write
        // reached it, and one loaded run in 14 read a cut rendering.)
        let meta = mnt.path().join("a3/zarr.json");
        for n in 0..20 {
            let mut doc: serde_json::Value =
                serde_json::from_slice(&fs::read(&meta).unwrap()).unwrap();
            doc["attributes"] = serde_json::json!({ "note": "x".repeat(n % 7), "n": n });
            let written = serde_json::to_vec(&doc).unwrap();
            fs::write(&meta, &written).unwrap();
            let shown = fs::read(&meta).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&shown),
                String::from_utf8_lossy(&written),
                "write {n}: read back as written"
            );
        }
        // A slow writer: truncated at open, written after the idle commit has run.
        let mut doc: serde_json::Value = serde_json::from_slice(&fs::read(&meta).unwrap()).unwrap();
        doc["attributes"] = serde_json::json!({ "n": 100 });
        let mut f = File::create(&meta).unwrap();
        std::thread::sleep(shardfs::view::KERNEL_WRITE_IDLE * 3);
        f.write_all(&serde_json::to_vec(&doc).unwrap()).unwrap();
        drop(f);
        let shown: serde_json::Value = serde_json::from_slice(&fs::read(&meta).unwrap()).unwrap();
        assert_eq!(shown["attributes"]["n"], 100, "a slow writer's document");
        m.unmount().unwrap();
    }
    assert_stored_sharded(store.path(), "a3");
    let (mnt, _m) = mount_rw(store.path());
    for (i, j, k) in chunks_2x2x2() {
        let p = mnt.path().join(format!("a3/c/{i}/{j}/{k}"));
        assert_eq!(
            fs::read(&p).unwrap(),
            want(i, j, k),
            "after a remount: {}",
            p.display()
        );
    }
    let doc: serde_json::Value =
        serde_json::from_slice(&fs::read(mnt.path().join("a3/zarr.json")).unwrap()).unwrap();
    assert_eq!(doc["attributes"]["n"], 100);
    assert_stored_sharded(store.path(), "b3");
    for (i, j, k) in chunks_2x2x2() {
        let p = mnt.path().join(format!("b3/c/{i}/{j}/{k}"));
        assert_eq!(
            fs::read(&p).unwrap(),
            if (i, j, k) == (0, 0, 0) {
                [99; 8]
            } else {
                want(i, j, k)
            },
            "after a remount: {}",
            p.display()
        );
    }
}

/// zarr 2's `resize` writes the smaller `.zarray` by rename, then checks each chunk
/// outside the new shape with `os.path.isfile` and removes it. The shrink deleted those
/// chunks with the rename; the kernel may still cache their attributes (here for 60 s),
/// and their entries can only be dropped after the rename's reply (the kernel holds the
/// directory's lock). So the rename returns only once their attributes are dropped: a
/// `stat` right after it asks the daemon, and finds nothing (before: `isfile` true, then
/// `os.remove` `ENOENT`, one run in two of zarr 2's `test_resize_2d` through a mount).
#[test]
fn chunks_a_renamed_shrink_deleted_are_gone_when_the_rename_returns() {
    if !common::can_mount() {
        return;
    }
    let keys = || (0..16u8).flat_map(|i| (0..16u8).map(move |j| (i, j)));
    for round in 0..5 {
        let store = tempfile::tempdir().unwrap();
        let mnt = tempfile::tempdir().unwrap();
        let opts = MountOptions {
            ttl: Some(std::time::Duration::from_secs(60)),
            ..MountOptions::default()
        };
        let _m = Mount::new(store.path(), mnt.path(), &opts).unwrap();
        // 256 chunk keys beside `zarr.json` (v2 key encoding), as in zarr 2's arrays.
        let dir = mnt.path().join("a");
        fs::create_dir(&dir).unwrap();
        let mut meta = serde_json::json!({
            "zarr_format": 3, "node_type": "array", "shape": [32, 32], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
            "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}},
            "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
        });
        fs::write(dir.join("zarr.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
        for (i, j) in keys() {
            fs::write(dir.join(format!("{i}.{j}")), [1 + i; 4]).unwrap();
        }
        File::open(&dir).unwrap().sync_all().unwrap();
        for (i, j) in keys() {
            assert!(dir.join(format!("{i}.{j}")).is_file());
        }
        meta["shape"] = serde_json::json!([2, 32]);
        fs::write(
            dir.join("zarr.json.tmp"),
            serde_json::to_vec(&meta).unwrap(),
        )
        .unwrap();
        fs::rename(dir.join("zarr.json.tmp"), dir.join("zarr.json")).unwrap();
        // From the last chunk back: the kernel is told of the entries after the reply.
        let mut stale = Vec::new();
        for (i, j) in keys().collect::<Vec<_>>().into_iter().rev() {
            let p = dir.join(format!("{i}.{j}"));
            if p.is_file() != (i == 0) {
                stale.push(format!("{i}.{j}"));
            }
        }
        assert!(stale.is_empty(), "round {round}: {stale:?}");
    }
}
