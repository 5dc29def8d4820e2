//! Writes through the view, without the kernel: inodes across renames, unlinks and
//! adoptions, times of a moved directory, a full write buffer, files of their own, and
//! the index cache across commits.

use super::*;

/// A directory moved onto an empty one (`mv -T d1 d2`, `os.replace`) replaces it whole:
/// what this mount noted of the one replaced goes with it (here the times `touch -d` set
/// on it), and `stat` shows the moved directory's own, as on a local file system.
#[test]
fn a_directory_moved_onto_an_empty_one_shows_its_own_times() {
    use std::time::{Duration, UNIX_EPOCH};
    let dir = tempfile::tempdir().unwrap();
    let view = writable_view_of(dir.path(), ViewFormat::V3);
    view.mkdir(ROOT_INO, OsStr::new("d1")).unwrap();
    let d2 = view.mkdir(ROOT_INO, OsStr::new("d2")).unwrap();
    let old = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    view.set_times(d2.ino, None, Some(old)).unwrap();
    assert_eq!(lookup(&view, "d2").unwrap().mtime, old);
    view.rename(
        ROOT_INO,
        OsStr::new("d1"),
        ROOT_INO,
        OsStr::new("d2"),
        false,
    )
    .unwrap();
    assert_ne!(
        lookup(&view, "d2").unwrap().mtime,
        old,
        "the replaced directory's times went with it"
    );
}

/// `cp -r` of an unsharded array into a writable mount writes the chunk files before
/// `zarr.json`; when the metadata lands they are taken into a shard, which is stored at
/// the first chunk's path (`c/0/0/0` is both an inner chunk key and the shard key). The
/// kernel may still hold the plain file's inode (a cached entry, an open descriptor):
/// whatever it does with it is refused as stale (`ESTALE`: the kernel looks the name up
/// again), never applied to the store file now at that path — a truncate through it once
/// left the shard with 8 bytes and every chunk unreadable.
#[test]
fn an_inode_of_a_chunk_file_taken_into_a_new_array_is_stale() {
    let store = tempfile::tempdir().unwrap();
    let want = |i: u64, j: u64, k: u64| vec![(1 + i * 4 + j * 2 + k) as u8; 8];
    let view = writable_view_of(store.path(), ViewFormat::V3);
    let b3 = view.mkdir(ROOT_INO, OsStr::new("b3")).unwrap().ino;
    let c = view.mkdir(b3, OsStr::new("c")).unwrap().ino;
    let mut old = Vec::new();
    for i in 0..2 {
        let ci = view.mkdir(c, OsStr::new(&i.to_string())).unwrap().ino;
        for j in 0..2 {
            let cj = view.mkdir(ci, OsStr::new(&j.to_string())).unwrap().ino;
            for k in 0..2 {
                old.push(write_file(&view, cj, &k.to_string(), &want(i, j, k)));
            }
        }
    }
    let meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [4, 4, 4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2, 2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
    });
    // A descriptor of a chunk file open across the adoption (`fstat` must answer).
    let held = view.open(old[2], false, false).unwrap().fh;
    write_file(&view, b3, "zarr.json", &serde_json::to_vec(&meta).unwrap());
    assert!(
        store.path().join("b3/c/0/0/0").is_file(),
        "the shard is stored at the first chunk's path"
    );
    for &ino in &old {
        assert_eq!(view.getattr(ino).unwrap_err().errno(), libc::ESTALE);
        assert_eq!(
            view.open(ino, true, true).unwrap_err().errno(),
            libc::ESTALE
        );
        assert_eq!(view.set_size(ino, 0).unwrap_err().errno(), libc::ESTALE);
    }
    // What still holds an old inode: `fsync` makes everything durable; `fstat` through
    // a handle opened before the adoption still answers.
    view.fsync(old[1]).unwrap();
    assert_eq!(view.getattr_open(old[2], Some(held)).unwrap().size, 8);
    view.release(held).unwrap();
    // Looked up again: the chunks, in the shard.
    let first = lookup(&view, "b3/c/0/0/0").unwrap();
    assert!(!old.contains(&first.ino), "a new inode for the chunk");
    for (i, j, k) in (0..2).flat_map(|i| (0..2).flat_map(move |j| (0..2).map(move |k| (i, j, k)))) {
        assert_eq!(
            read(&view, &format!("b3/c/{i}/{j}/{k}")).unwrap(),
            want(i, j, k)
        );
    }
    // The stale inodes live until the kernel forgets them.
    let live = view.live_inodes();
    for &ino in &old {
        view.forget(ino, 1);
    }
    assert_eq!(view.live_inodes(), live - old.len());
    view.flush_all().unwrap();
    drop(view);
    let again = view_of(store.path());
    for (i, j, k) in (0..2).flat_map(|i| (0..2).flat_map(move |j| (0..2).map(move |k| (i, j, k)))) {
        assert_eq!(
            read(&again, &format!("b3/c/{i}/{j}/{k}")).unwrap(),
            want(i, j, k),
            "after the view is gone"
        );
    }
}

/// The inode of a file renamed onto `zarr.json` (zarr-python's and zarr 2's tmp + rename)
/// lives on at the new name, as the array's metadata, when the rename makes an array:
/// the refresh of the directory must not find it at its old name and retire it.
#[test]
fn a_file_renamed_onto_new_metadata_keeps_its_inode() {
    let store = tempfile::tempdir().unwrap();
    let view = writable_view_of(store.path(), ViewFormat::V3);
    let b4 = view.mkdir(ROOT_INO, OsStr::new("b4")).unwrap().ino;
    let meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [4, 4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
    });
    let tmp = write_file(
        &view,
        b4,
        "zarr.json.1a2b.partial",
        &serde_json::to_vec(&meta).unwrap(),
    );
    view.rename(
        b4,
        OsStr::new("zarr.json.1a2b.partial"),
        b4,
        OsStr::new("zarr.json"),
        false,
    )
    .unwrap();
    let attr = view
        .getattr(tmp)
        .expect("the renamed inode is the array's zarr.json, not stale");
    assert_eq!(attr.ino, tmp);
    let shown = read(&view, "b4/zarr.json").unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&shown).unwrap();
    assert_eq!(doc["shape"], serde_json::json!([4, 4]));
    assert_eq!(lookup(&view, "b4/zarr.json").unwrap().ino, tmp);
}

/// An inode of a store file that was unlinked, with another file made at its name since,
/// never reaches the new file: opening it again (`/proc/self/fd/N`) or truncating it
/// without a handle is `ENOENT`.
#[test]
fn an_unlinked_store_file_inode_never_reaches_the_file_at_its_name_now() {
    let store = tempfile::tempdir().unwrap();
    let view = writable_view_of(store.path(), ViewFormat::V3);
    let d = view.mkdir(ROOT_INO, OsStr::new("plain")).unwrap().ino;
    let old = write_file(&view, d, "x", b"old");
    view.unlink(d, OsStr::new("x")).unwrap();
    let new = write_file(&view, d, "x", b"new bytes");
    assert_ne!(old, new);
    assert_eq!(
        view.open(old, true, true).unwrap_err().errno(),
        libc::ENOENT
    );
    assert_eq!(
        view.open(old, false, false).unwrap_err().errno(),
        libc::ENOENT
    );
    assert_eq!(view.set_size(old, 0).unwrap_err().errno(), libc::ENOENT);
    assert_eq!(read(&view, "plain/x").unwrap(), b"new bytes");
    assert_eq!(
        std::fs::read(store.path().join("plain/x")).unwrap(),
        b"new bytes"
    );
}

/// zarr's resize writes the smaller metadata, then deletes each chunk outside the new
/// shape. The shrink deleted them already and retired their inodes and key directories;
/// an unlink that comes through names the kernel still caches (no lookup first) is done,
/// not `ESTALE` or `ENOENT`.
#[test]
fn unlinking_a_chunk_a_shrink_deleted_through_a_cached_name_succeeds() {
    let store = tempfile::tempdir().unwrap();
    let view = writable_view_of(store.path(), ViewFormat::V3);
    let arr = view.mkdir(ROOT_INO, OsStr::new("b")).unwrap().ino;
    let meta = |rows: u64| {
        serde_json::to_vec(&serde_json::json!({
            "zarr_format": 3, "node_type": "array", "shape": [rows, 4], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
        }))
        .unwrap()
    };
    write_file(&view, arr, "zarr.json", &meta(4));
    let c = view.mkdir(arr, OsStr::new("c")).unwrap().ino;
    let c1 = view.mkdir(c, OsStr::new("1")).unwrap().ino;
    write_file(&view, c1, "0", &[5; 4]);
    assert_eq!(read(&view, "b/c/1/0").unwrap(), [5; 4]);
    write_file(&view, arr, "zarr.json", &meta(2));
    assert_eq!(
        view.getattr(c1).unwrap_err().errno(),
        libc::ESTALE,
        "the key directory outside the grid is retired"
    );
    view.unlink(c1, OsStr::new("0")).unwrap();
    assert!(lookup(&view, "b/c/1/0").is_err());
}

/// tensorstore writes a key through a lock file (`c/1/0.__lock`: created, written,
/// renamed onto the key), and an attempt that loses a race unlinks its lock file and
/// closes it. The kernel then sends the forget of that inode before its release (forgets
/// jump the queue), and a retry creates the lock file again in between. The new file
/// must get another inode number: given the forgotten one's (its path's stable number,
/// free again), the late release was taken for the new file's and its writes were lost
/// (a 24-byte chunk read back empty, seen in `zarr_python_and_tensorstore_write_through_the_mount`
/// with kernel opens).
#[test]
fn a_file_created_while_a_forgotten_one_awaits_its_release_gets_another_inode() {
    let store = tempfile::tempdir().unwrap();
    let view = writable_view_of(store.path(), ViewFormat::V3);
    view.set_open_policy(shardfs::view::OpenPolicy::KernelOpens);
    let name = OsStr::new("x.__lock");
    let (old, o1) = view.create(ROOT_INO, name, false, false).unwrap();
    view.adopt_created(old.ino, o1.fh);
    view.unlink(ROOT_INO, name).unwrap();
    view.forget(old.ino, 1);
    let (new, o2) = view.create(ROOT_INO, name, false, false).unwrap();
    view.adopt_created(new.ino, o2.fh);
    assert_ne!(new.ino, old.ino, "the forgotten inode still has a handle");
    // Released, the forgotten inode is gone.
    let live = view.live_inodes();
    view.release_created(old.ino, o1.fh).unwrap();
    assert_eq!(view.live_inodes(), live - 1);
    assert_eq!(view.write_ino(new.ino, 0, &[7; 24]).unwrap().0, 24);
    view.fsync(new.ino).unwrap();
    assert_eq!(view.getattr_open(new.ino, None).unwrap().size, 24);
    view.rename(ROOT_INO, name, ROOT_INO, OsStr::new("x"), false)
        .unwrap();
    assert_eq!(read(&view, "x").unwrap(), [7; 24]);
}

/// With kernel opens no close of an unlinked file is heard of, so the daemon keeps its
/// bytes for its descriptors (pytest's capture files), also across an adoption. A write
/// that finds the write buffer full lets such files go: their bytes are the room.
#[test]
fn a_full_write_buffer_lets_unlinked_files_go() {
    let store = tempfile::tempdir().unwrap();
    let view = writable_view_of(store.path(), ViewFormat::V3); // a 1 MiB write buffer
    // Scratch files (held in the write buffer) are the files in an array's directory.
    let dir = view.mkdir(ROOT_INO, OsStr::new("a")).unwrap().ino;
    let meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}
    });
    write_file(&view, dir, "zarr.json", &serde_json::to_vec(&meta).unwrap());
    view.set_open_policy(shardfs::view::OpenPolicy::KernelOpens);
    let name = OsStr::new("tmp-unlinked");
    let (old, o1) = view.create(dir, name, false, false).unwrap();
    view.adopt_created(old.ino, o1.fh);
    assert_eq!(
        view.write_ino(old.ino, 0, &vec![1; 700 << 10]).unwrap().0,
        700 << 10
    );
    view.unlink(dir, name).unwrap();
    // Held across a commit of every settled file (an `fsync` of a directory).
    view.commit_kernel_writes(shardfs::view::KernelCommit::Settled { except: None })
        .unwrap();
    assert_eq!(view.read_ino(old.ino, 0, 4).unwrap(), [1; 4]);
    // A second file needs the room.
    let (new, o2) = view.create(dir, OsStr::new("other"), false, false).unwrap();
    view.adopt_created(new.ino, o2.fh);
    assert_eq!(
        view.write_ino(new.ino, 0, &vec![2; 700 << 10]).unwrap().0,
        700 << 10
    );
    assert_eq!(
        view.read_ino(old.ino, 0, 4).unwrap_err().errno(),
        libc::ENOENT,
        "let go"
    );
}

/// A file of its own two levels down in a sharded array's key directories (a writer's
/// temporary, `c/0/0/x.partial` of a 3-d array), with no chunk anywhere, is listed by a
/// later mount all the way down. Before, a key directory was looked into one level only
/// for such files, so the later mount listed no `c` at all, though the store kept the
/// file (found by the reference test).
#[test]
fn files_of_their_own_deep_in_key_directories_are_listed_by_a_later_mount() {
    let store = tempfile::tempdir().unwrap();
    let view = writable_view_of(store.path(), ViewFormat::V3);
    let a = view.mkdir(ROOT_INO, OsStr::new("a")).unwrap().ino;
    let meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [7, 7, 5], "data_type": "int32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [3, 2, 2]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
        "codecs": [{"name": "bytes"}], "attributes": {}
    });
    write_file(&view, a, "zarr.json", &serde_json::to_vec(&meta).unwrap());
    let c = view.mkdir(a, OsStr::new("c")).unwrap().ino;
    let c0 = view.mkdir(c, OsStr::new("0")).unwrap().ino;
    let c00 = view.mkdir(c0, OsStr::new("0")).unwrap().ino;
    write_file(&view, c00, "0.x.partial", b"temporary");
    view.sync_all().unwrap();
    drop(view);
    let later = view_of(store.path());
    let names = |path: &str| -> Vec<String> {
        let ino = lookup(&later, path).unwrap().ino;
        later
            .readdir(ino)
            .unwrap()
            .iter()
            .map(|e| e.name.to_string_lossy().into_owned())
            .collect()
    };
    assert!(names("a").contains(&"c".to_string()), "{:?}", names("a"));
    assert_eq!(names("a/c"), ["0"]);
    assert_eq!(names("a/c/0"), ["0"]);
    assert_eq!(names("a/c/0/0"), ["0.x.partial"]);
    assert_eq!(read(&later, "a/c/0/0/0.x.partial").unwrap(), b"temporary");
}

/// The index-cache loads a view has made so far (`shardfs stats`: `index_cache_misses`).
fn index_loads(view: &View) -> u64 {
    let stats: serde_json::Value = serde_json::from_slice(&view.stats_json()).unwrap();
    stats["index_cache_misses"].as_u64().unwrap()
}

/// A shard this mount committed is cached as the commit left it (issue 35): the chunk
/// read back after its `fsync` reads no index, on a local directory and in memory. The
/// cached shard carries the identity its freshness is checked by, so another mount's
/// later commit of the shard (the same length, in memory) is still seen.
#[test]
fn a_committed_index_is_cached_and_another_mounts_commit_is_still_seen() {
    use shardfs::store::MemoryStore;
    let doc = common::sharded_u8_array(
        64,
        16,
        4,
        serde_json::json!([{"name": "bytes"}]),
        common::index_codecs_crc32c(),
        "end",
    );
    let doc = serde_json::to_vec(&doc).unwrap();
    let memory = MemoryStore::new();
    memory.put("a/zarr.json", doc.clone());
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("a")).unwrap();
    std::fs::write(dir.path().join("a/zarr.json"), &doc).unwrap();
    let local: Arc<dyn Store> = Arc::new(LocalStore::open(dir.path()).unwrap());
    for store in [Arc::new(memory) as Arc<dyn Store>, local] {
        let what = store.describe();
        let (view, other) = (
            writable_view(store.clone(), ViewFormat::V3),
            writable_view(store.clone(), ViewFormat::V3),
        );
        let keys = view
            .mkdir(lookup(&view, "a").unwrap().ino, OsStr::new("c"))
            .unwrap()
            .ino;
        let c1 = write_file(&view, keys, "1", b"aaaa");
        view.fsync(c1).unwrap();
        let loads = index_loads(&view);
        assert_eq!(read(&view, "a/c/1").unwrap(), b"aaaa", "{what}");
        assert_eq!(
            index_loads(&view),
            loads,
            "{what}: the index was read again"
        );
        // Another mount replaces the chunk: read back as it now is.
        let theirs = lookup(&other, "a/c").unwrap().ino;
        let o1 = write_file(&other, theirs, "1", b"bbbb");
        other.fsync(o1).unwrap();
        assert_eq!(read(&view, "a/c/1").unwrap(), b"bbbb", "{what}");
        assert_eq!(index_loads(&view), loads + 1, "{what}");
        // And this mount's next commit, on top of theirs, is cached again.
        let c2 = write_file(&view, keys, "2", b"cccc");
        view.fsync(c2).unwrap();
        assert_eq!(read(&view, "a/c/2").unwrap(), b"cccc", "{what}");
        assert_eq!(read(&view, "a/c/1").unwrap(), b"bbbb", "{what}");
        assert_eq!(index_loads(&view), loads + 1, "{what}");
    }
}
