//! Tests of `recover` (kept beside it to keep that file about the code).
use super::*;

#[test]
fn metadata_write_temporaries_a_crash_left_go_once_old_and_fresh_ones_stay() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("a")).unwrap();
    let old = root.path().join("a").join(super::super::meta_temp_name());
    let fresh = root.path().join("a").join(super::super::meta_temp_name());
    for p in [&old, &fresh] {
        std::fs::write(p, b"{").unwrap();
    }
    let long_ago = std::time::SystemTime::now() - super::super::STALE_META_TEMP * 2;
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(long_ago)
        .unwrap();
    assert_eq!(
        pending(root.path()).unwrap().len(),
        1,
        "the old one is pending"
    );
    recover_store(root.path()).unwrap();
    assert!(!old.exists(), "a crash's leftover is removed");
    assert!(
        fresh.exists(),
        "a write in flight (another mount's) is left alone"
    );
}

#[test]
fn record_round_trips_and_is_pinned() {
    let rec = AppendRecord {
        old_len: 0x0102,
        new_len: 0x0304_0506,
        tail_crc: 0xdead_beef,
    };
    let bytes = rec.encode();
    assert_eq!(bytes.len(), 40);
    assert_eq!(&bytes[..16], b"SHARDFS-APPEND\x00\x01");
    assert_eq!(&bytes[16..24], &[2, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&bytes[24..32], &[6, 5, 4, 3, 0, 0, 0, 0]);
    assert_eq!(&bytes[32..36], &[0xef, 0xbe, 0xad, 0xde]);
    let crc = u32::from_le_bytes(bytes[36..].try_into().unwrap());
    assert_eq!(crc, crc32c::crc32c(&bytes[..36]));
    assert_eq!(AppendRecord::decode(&bytes), Some(rec));
}

#[test]
fn torn_or_flipped_records_do_not_decode() {
    let bytes = AppendRecord {
        old_len: 10,
        new_len: 99,
        tail_crc: 7,
    }
    .encode();
    for cut in 0..bytes.len() {
        assert_eq!(AppendRecord::decode(&bytes[..cut]), None, "cut at {cut}");
    }
    for i in 0..bytes.len() {
        let mut b = bytes;
        b[i] ^= 0x10;
        assert_eq!(AppendRecord::decode(&b), None, "flip at {i}");
    }
    let mut long = bytes.to_vec();
    long.push(0);
    assert_eq!(AppendRecord::decode(&long), None);
    // A record that does not grow the shard is no record shardfs writes.
    let odd = AppendRecord {
        old_len: 99,
        new_len: 99,
        tail_crc: 0,
    }
    .encode();
    assert_eq!(AppendRecord::decode(&odd), None);
}

#[test]
fn paths_must_stay_inside_the_store() {
    assert!(split_rel(Path::new("a/c/0/1")).is_ok());
    assert_eq!(split_rel(Path::new("c")).unwrap().0, Path::new(""));
    for bad in ["", "/abs/c", "a/../c", "./c", ".."] {
        assert!(
            matches!(split_rel(Path::new(bad)), Err(CommitError::BadPath(_))),
            "{bad}"
        );
    }
}

#[test]
fn shard_dir_never_resolves_outside_the_root() {
    let outside = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("escape")).unwrap();
    assert!(ShardDir::open(root.path(), Path::new("escape"), true, Lock::Exclusive).is_err());
    assert!(
        ShardDir::open(
            root.path(),
            Path::new("escape/deeper"),
            true,
            Lock::Exclusive
        )
        .is_err()
    );
    assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    let d = ShardDir::open(root.path(), Path::new("a/b"), true, Lock::Exclusive).unwrap();
    assert!(d.is_some() && root.path().join("a/b").is_dir());
    assert!(
        ShardDir::open(root.path(), Path::new("x"), false, Lock::Shared)
            .unwrap()
            .is_none()
    );
}

#[test]
fn lazy_recovery_looks_for_the_record_only() {
    let root = tempfile::tempdir().unwrap();
    let p = root.path();
    std::fs::create_dir_all(p.join("a/c")).unwrap();
    std::fs::write(p.join("a/c/0"), b"shard").unwrap();
    std::fs::write(p.join("a/c/0.shardfs-tmp"), b"x").unwrap();
    std::fs::write(p.join("a/c/1"), b"shard").unwrap();
    std::fs::write(p.join("a/c/1.shardfs-append"), b"torn").unwrap();
    let lazy = LazyRecovery::new(p).unwrap();
    assert!(!lazy.has_record(Path::new("a/c/0")));
    assert!(lazy.recover(Path::new("a/c/0")).unwrap().is_empty());
    assert!(p.join("a/c/0.shardfs-tmp").exists(), "left to the walk");
    assert!(lazy.has_record(Path::new("a/c/1")));
    assert_eq!(
        lazy.recover(Path::new("a/c/1")).unwrap(),
        [Recovery::TornRecord]
    );
    assert!(!lazy.has_record(Path::new("a/c/1")));
    assert_eq!(std::fs::read(p.join("a/c/1")).unwrap(), b"shard");
    assert!(!lazy.has_record(Path::new("x/y/z")));
    assert!(lazy.before_load(Path::new("x/y/z")).is_ok());
}

#[test]
fn walk_finds_leftovers_only() {
    let root = tempfile::tempdir().unwrap();
    let p = root.path();
    std::fs::create_dir_all(p.join("a/c/0")).unwrap();
    std::fs::write(p.join("a/c/0/1"), b"shard").unwrap();
    std::fs::write(p.join("a/c/0/1.shardfs-append"), b"x").unwrap();
    std::fs::write(p.join("a/c/0/2.shardfs-tmp"), b"x").unwrap();
    std::fs::write(p.join("a/.shardfs-tmp"), b"no stem, not ours").unwrap();
    std::fs::write(p.join("c.shardfs-append"), b"x").unwrap();
    let (found, _) = leftovers(p).unwrap();
    let flat: Vec<(PathBuf, Vec<OsString>)> = found
        .into_iter()
        .map(|(d, m)| (d, m.into_keys().collect()))
        .collect();
    assert_eq!(
        flat,
        vec![
            (PathBuf::new(), vec!["c".into()]),
            (PathBuf::from("a/c/0"), vec!["1".into(), "2".into()]),
        ]
    );
    let mut pend = pending(p).unwrap();
    pend.sort();
    assert_eq!(pend.len(), 3);
    // The torn record and the temp file go; the shard itself is left alone.
    let done = recover_store(p).unwrap();
    assert_eq!(done.len(), 3);
    assert!(
        done.iter()
            .any(|(r, x)| r == Path::new("a/c/0/2") && *x == Recovery::RemovedTemp)
    );
    assert_eq!(std::fs::read(p.join("a/c/0/1")).unwrap(), b"shard");
    assert!(pending(p).unwrap().is_empty());
    assert!(recover_store(p).unwrap().is_empty());
}
