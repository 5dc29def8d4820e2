//! What POSIX tools count on: a file unlinked while open lives on for its descriptor,
//! times set are what `stat` returns, inode numbers stay with their paths, `EFBIG` past
//! the write buffer, and what an array's directory may hold.

use super::*;

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
