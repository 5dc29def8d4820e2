//! Times set through the mount on files written through descriptors the kernel opened:
//! kept across the commit of the writes, a rename and the storing of a file of its own.

use super::*;

/// Times set through the mount after a file was written (`cp -p`), and on a temporary
/// file then renamed into place (`rsync -a`), are what `stat` shows afterwards: the
/// commit of the writes (here the `fsync`; else a moment later) and the rename change
/// no file. Before, the commit came after the times and reset them, and a rename left
/// them at the old name (found by an adversarial tester: every `rsync -a` copied every
/// file again).
#[test]
fn times_set_after_writes_survive_their_commit_and_a_rename() {
    if !common::can_mount() {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let (mnt, _m) = common::mount::mount_rw(store.path());
    // The kernel's first open: from now on it opens files itself.
    std::fs::read(mnt.path().join(".shardfs-stats")).unwrap();
    let set = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_115_269_505);
    let times = std::fs::FileTimes::new()
        .set_modified(set)
        .set_accessed(set);
    // cp -p: write, set the times, (the commit).
    let p = mnt.path().join("f");
    std::fs::write(&p, b"hi").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_times(times)
        .unwrap();
    std::fs::File::open(&p).unwrap().sync_all().unwrap();
    assert_eq!(
        std::fs::metadata(&p).unwrap().modified().unwrap(),
        set,
        "cp -p"
    );
    // rsync -a: a temporary written, its times set, renamed into place.
    let tmp = mnt.path().join(".g.XXXXXX");
    std::fs::write(&tmp, b"there").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&tmp)
        .unwrap()
        .set_times(times)
        .unwrap();
    std::fs::rename(&tmp, mnt.path().join("g")).unwrap();
    let g = mnt.path().join("g");
    std::fs::File::open(&g).unwrap().sync_all().unwrap();
    assert_eq!(
        std::fs::metadata(&g).unwrap().modified().unwrap(),
        set,
        "rsync -a"
    );
}

/// Times set on a file of its own in an array's directories stay shown while it is
/// unchanged, through a write of the array's metadata and its storing (an `fsync` of its
/// directory) after the kernel forgot its inode. Before, the metadata write reset them
/// (the file, held in memory, shows its array directory's times, and they were kept
/// against those), and once stored after a forget, the stored file's mtime hid them
/// (found by the reference test, seed 2, v2).
#[test]
fn times_of_a_file_of_its_own_in_an_array_are_its_own() {
    if !common::can_mount() {
        return;
    }
    let store = uncompressed_array_u(64, 32);
    let (mnt, _m) = common::mount::mount_rw(store.path());
    let dir = mnt.path().join("u/c");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("notes.txt");
    let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    std::fs::write(&p, b"made by hand").unwrap();
    let set = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_115_269_505);
    let times = std::fs::FileTimes::new()
        .set_modified(set)
        .set_accessed(set);
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_times(times)
        .unwrap();
    assert_eq!(mtime(&p), set);
    // The array's metadata rewritten (its attributes): the directory changes, not the file.
    let meta = mnt.path().join("u/zarr.json");
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    doc["attributes"] = serde_json::json!({"k": 1});
    let tmp = mnt.path().join("u/zarr.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(&doc).unwrap()).unwrap();
    std::fs::rename(&tmp, &meta).unwrap();
    assert_eq!(mtime(&p), set, "after a write of the array's metadata");
    // The kernel forgets what it can (root only), then the file is stored.
    if let Err(e) = std::fs::write("/proc/sys/vm/drop_caches", "2\n") {
        eprintln!(
            "times_of_a_file_of_its_own_in_an_array_are_its_own: cannot drop the kernel's caches ({e}); stored without a forget before"
        );
    }
    std::fs::File::open(&dir).unwrap().sync_all().unwrap();
    assert_eq!(mtime(&p), set, "after it was stored");
    assert_eq!(std::fs::read(&p).unwrap(), b"made by hand");
    assert!(
        store.path().join("u/c/notes.txt").is_file(),
        "stored as a file"
    );
}
