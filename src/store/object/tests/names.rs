//! Names and what is known of them: keys as other clients write them, listings, what
//! a HEAD or a listing found kept for the TTL, metadata documents, and what answers
//! during an outage.

use super::*;

/// Names with characters object_store escapes in keys (`~`, `#`, `%`, a space) are
/// listed as they were made, and found after a listing (a listing showed
/// `notes%7E`, and `stat` of `notes~` after it said there was none).
#[test]
fn names_with_escaped_characters_are_listed_and_found_as_made() {
    let mut s = store();
    s.meta = Arc::new(MetaCache::new(Duration::from_secs(600)));
    let names = ["notes~", "b#c", "50%", "with space"];
    for n in names {
        s.write_atomically(&Path::new("a").join(n), n.as_bytes())
            .unwrap();
    }
    s.create_dir(Path::new("a/d~")).unwrap();
    s.write_atomically(Path::new("a/d~/x"), b"x").unwrap();
    let mut listed: Vec<String> = s
        .list(Path::new("a"))
        .unwrap()
        .into_iter()
        .map(|e| e.name.into_string().unwrap())
        .collect();
    listed.sort();
    let mut want: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    want.push("d~".into());
    want.sort();
    assert_eq!(listed, want);
    for n in names {
        let m = s.stat(&Path::new("a").join(n)).unwrap();
        assert_eq!(m.map(|m| m.len), Some(n.len() as u64), "{n}");
    }
    let d = s.stat(Path::new("a/d~")).unwrap().unwrap();
    assert_eq!(d.kind, EntryKind::Dir);
    assert_eq!(s.list(Path::new("a/d~")).unwrap().len(), 1);
}

/// Keys another tool wrote are listed as they are (`x%2Fy`, `%2E`, `raw~`), the listing
/// stays whole, and nothing about them is kept under another name (`.` decoded from
/// `%2E` once made `a` itself look like a file).
#[test]
fn foreign_keys_that_decode_to_no_name_are_listed_as_they_are() {
    let mem = Arc::new(object_store::memory::InMemory::new());
    let mut s = BucketStore::new(mem.clone(), "", "memory://foreign").unwrap();
    s.meta = Arc::new(MetaCache::new(Duration::from_secs(600)));
    let put = |key: ObjPath| {
        s.block_on(mem.put(&key, PutPayload::from(b"x".to_vec())))
            .unwrap();
    };
    put(ObjPath::from("a").join("x/y")); // stored as a/x%2Fy
    put(ObjPath::from("a").join(".")); // stored as a/%2E
    put(ObjPath::parse("a/raw~").unwrap()); // as boto3 writes it
    let mut listed: Vec<String> = s
        .list(Path::new("a"))
        .unwrap()
        .into_iter()
        .map(|e| e.name.into_string().unwrap())
        .collect();
    listed.sort();
    assert_eq!(listed, ["%2E", "raw~", "x%2Fy"]);
    assert_eq!(
        s.stat(Path::new("a")).unwrap().unwrap().kind,
        EntryKind::Dir
    );
}

/// A fresh listing answers for the names in it and for those not in it: `stat` of a
/// directory listed, and `stat`, `list` and `open` of a name the listing lacks, ask
/// nothing more (`ls -lR` of an array asked a LIST and a HEAD per key directory);
/// a write here is seen at once.
#[test]
fn a_listing_answers_for_the_names_below_it() {
    use std::sync::atomic::Ordering::Relaxed;
    let mem = Arc::new(object_store::memory::InMemory::new());
    let mut s = BucketStore::new(mem, "p", "memory://test").unwrap();
    s.meta = Arc::new(MetaCache::new(Duration::from_secs(600)));
    s.write_atomically(Path::new("a/c/0/0"), b"shard").unwrap();
    s.write_atomically(Path::new("a/c/1/0"), b"shard").unwrap();
    let asked =
        |s: &BucketStore| s.counters().heads.load(Relaxed) + s.counters().lists.load(Relaxed);
    assert_eq!(s.list(Path::new("a/c")).unwrap().len(), 2);
    let before = asked(&s);
    assert_eq!(
        s.stat(Path::new("a/c/0")).unwrap().unwrap().kind,
        EntryKind::Dir
    );
    assert!(s.stat(Path::new("a/c/7")).unwrap().is_none());
    let err = s.list(Path::new("a/c/7")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    assert!(s.open(Path::new("a/c/7")).unwrap().is_none());
    assert_eq!(asked(&s), before, "answered from the listing");
    // Made here: seen at once.
    s.write_atomically(Path::new("a/c/7/0"), b"new").unwrap();
    assert_eq!(
        s.stat(Path::new("a/c/7")).unwrap().unwrap().kind,
        EntryKind::Dir
    );
    assert_eq!(s.list(Path::new("a/c/7")).unwrap().len(), 1);
}

/// With a TTL, what a HEAD or listing found is used again; this store's own writes
/// and deletes are seen at once; another writer's change is seen after the TTL, or
/// at once by the open after a read found the object changed (ESTALE).
#[test]
fn heads_and_listings_are_kept_for_the_ttl_and_own_writes_are_seen_at_once() {
    use std::sync::atomic::Ordering::Relaxed;
    let mem = Arc::new(object_store::memory::InMemory::new());
    let mut s = BucketStore::new(mem.clone(), "p", "memory://test").unwrap();
    s.meta = Arc::new(MetaCache::new(Duration::from_secs(600)));
    let rel = Path::new("a/c/0");
    s.write_atomically(rel, b"one").unwrap();
    let asked =
        |s: &BucketStore| s.counters().heads.load(Relaxed) + s.counters().lists.load(Relaxed);
    assert_eq!(s.stat(rel).unwrap().unwrap().len, 3);
    s.list(Path::new("a/c")).unwrap();
    let before = asked(&s);
    for _ in 0..5 {
        assert_eq!(s.stat(rel).unwrap().unwrap().len, 3);
        assert_eq!(s.list(Path::new("a/c")).unwrap().len(), 1);
        assert!(s.open(rel).unwrap().is_some());
    }
    assert_eq!(asked(&s), before, "answered from the cache");
    // Our own write and delete: seen at once.
    s.write_atomically(rel, b"four").unwrap();
    assert_eq!(s.stat(rel).unwrap().unwrap().len, 4);
    s.write_atomically(Path::new("a/c/1"), b"x").unwrap();
    assert_eq!(s.list(Path::new("a/c")).unwrap().len(), 2);
    s.remove_file(Path::new("a/c/1")).unwrap();
    assert_eq!(s.list(Path::new("a/c")).unwrap().len(), 1);
    assert!(s.stat(Path::new("a/c/1")).unwrap().is_none());
    // Another writer: an open file of the old version reads ESTALE, and the next
    // open sees the new version without waiting for the TTL.
    let f = s.open(rel).unwrap().unwrap();
    let key = ObjPath::from("p/a/c/0");
    s.block_on(mem.put(&key, PutPayload::from(b"other!".to_vec())))
        .unwrap();
    let mut buf = [0u8; 4];
    let err = f.read_at(&mut buf, 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ESTALE));
    assert_eq!(s.stat(rel).unwrap().unwrap().len, 6);
    // A change nobody here read: seen once the TTL has passed.
    s.block_on(mem.put(&key, PutPayload::from(b"seventh".to_vec())))
        .unwrap();
    assert_eq!(s.stat(rel).unwrap().unwrap().len, 6, "within the TTL");
    s.meta = Arc::new(MetaCache::new(Duration::from_millis(50)));
    assert_eq!(s.stat(rel).unwrap().unwrap().len, 7);
    s.block_on(mem.put(&key, PutPayload::from(b"eighth!!".to_vec())))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(s.stat(rel).unwrap().unwrap().len, 8, "after the TTL");
}

/// Nothing lies below a directory that a fresh listing of its parent found absent: a
/// writer's names in a key directory it just made (`mkdir -p c/0`, then
/// `c/0/0.<hex>.partial`) are answered with no request (issue 34: a HEAD and a LIST each,
/// 64 chunks written at 30 ms took 2.2 s), and once this mount stores something there it
/// is found at once.
#[test]
fn names_below_a_directory_listed_absent_ask_nothing_until_this_mount_writes_there() {
    use std::sync::atomic::Ordering::Relaxed;
    let mem = Arc::new(object_store::memory::InMemory::new());
    let mut s = BucketStore::new(mem, "p", "memory://test").unwrap();
    s.meta = Arc::new(MetaCache::new(Duration::from_secs(600)));
    s.write_atomically(Path::new("a/zarr.json"), b"{}").unwrap();
    let asked = |s: &BucketStore| {
        s.counters().heads.load(Relaxed)
            + s.counters().lists.load(Relaxed)
            + s.counters().gets.load(Relaxed)
    };
    assert!(
        s.list(Path::new("a"))
            .unwrap()
            .iter()
            .all(|e| e.name != "c")
    );
    let before = asked(&s);
    for name in [
        "a/c/0/0.1f2e.partial",
        "a/c/0/1.3a4b.partial",
        "a/c/0",
        "a/c/0/0",
    ] {
        assert!(s.stat(Path::new(name)).unwrap().is_none(), "{name}");
    }
    assert!(s.open(Path::new("a/c/0/0")).unwrap().is_none());
    assert_eq!(asked(&s), before, "answered from the listing of a/");
    // This mount's own write is seen at once, below the listing it makes stale.
    s.write_atomically(Path::new("a/c/0/0"), b"shard").unwrap();
    assert_eq!(s.stat(Path::new("a/c/0/0")).unwrap().unwrap().len, 5);
    assert!(
        s.stat(Path::new("a/c/0"))
            .unwrap()
            .is_some_and(|m| m.kind == EntryKind::Dir)
    );
}

/// During an outage (a request got no answer), what the store knew answers at once,
/// however old: HEAD answers, listings, whether a directory holds anything; what it
/// never knew is EIO; the first answer ends the outage.
#[test]
fn during_an_outage_what_was_known_answers_at_once_however_old() {
    use std::sync::atomic::Ordering::{Relaxed, SeqCst};
    let racing = Arc::new(Racing {
        inner: object_store::memory::InMemory::new(),
        changes: Default::default(),
        down: Default::default(),
    });
    let mut s = BucketStore::new(racing.clone(), "", "memory://down").unwrap();
    // Every answer kept, and none fresh: each is asked again while the endpoint answers.
    s.meta = Arc::new(MetaCache::new(Duration::from_nanos(1)));
    s.write_atomically(Path::new("a/c/0"), b"one").unwrap();
    let names = |s: &BucketStore| -> Vec<_> {
        s.list(Path::new("a/c"))
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect()
    };
    let listed = names(&s);
    assert_eq!(s.stat(Path::new("a/c/0")).unwrap().unwrap().len, 3);
    assert_eq!(
        s.stat(Path::new("a")).unwrap().unwrap().kind,
        EntryKind::Dir
    );
    racing.down.store(true, SeqCst);
    // The first request gets no answer: the outage begins, and the old answer stands.
    assert_eq!(s.stat(Path::new("a/c/0")).unwrap().unwrap().len, 3);
    let asked = |s: &BucketStore| {
        let c = s.counters();
        c.heads.load(Relaxed) + c.lists.load(Relaxed) + c.gets.load(Relaxed)
    };
    let before = asked(&s);
    assert_eq!(names(&s), listed);
    assert_eq!(s.stat(Path::new("a/c/0")).unwrap().unwrap().len, 3);
    assert_eq!(
        s.stat(Path::new("a")).unwrap().unwrap().kind,
        EntryKind::Dir
    );
    assert_eq!(
        asked(&s),
        before,
        "nothing asked while the endpoint is down"
    );
    // A name the listing held lacks is not there; one below a directory never listed
    // needs the endpoint.
    assert!(s.stat(Path::new("a/never")).unwrap().is_none());
    let err = s.stat(Path::new("b/never")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "never known: {err}");
    assert!(s.deadline.outage());
    // Back: the next request is answered, and ends the outage.
    racing.down.store(false, SeqCst);
    assert!(s.stat(Path::new("b/never")).unwrap().is_none());
    assert!(!s.deadline.outage());
}

/// A small metadata document opened again while its HEAD answer is fresh is read from
/// the bytes its first open fetched (a mount read the root `zarr.json` twice, for the
/// draft layout and for the array: a round trip more at every mount); a version written
/// since is fetched anew.
#[test]
fn a_metadata_document_opened_again_within_the_ttl_is_not_fetched_again() {
    use std::sync::atomic::Ordering::Relaxed;
    let mem = Arc::new(object_store::memory::InMemory::new());
    let mut s = BucketStore::new(mem.clone(), "p", "memory://t").unwrap();
    s.meta = Arc::new(MetaCache::new(Duration::from_secs(600)));
    let key = ObjPath::from("p/zarr.json");
    let doc = br#"{"zarr_format": 3, "node_type": "group", "attributes": {}}"#;
    s.block_on(mem.put(&key, PutPayload::from(doc.to_vec())))
        .unwrap();
    let s = Arc::new(s);
    let _view = crate::view::View::new(s.clone(), crate::view::ViewConfig::default()).unwrap();
    assert_eq!(s.counters().gets.load(Relaxed), 1, "one GET of zarr.json");
    let read = |s: &BucketStore| {
        let f = s.open(Path::new("zarr.json")).unwrap().unwrap();
        let mut buf = vec![0u8; f.meta().unwrap().len as usize];
        f.read_exact_at(&mut buf, 0).unwrap();
        buf
    };
    assert_eq!(read(&s), doc);
    assert_eq!(s.counters().gets.load(Relaxed), 1, "opened again: no GET");
    let new = br#"{"zarr_format": 3, "node_type": "group", "attributes": {"a": 1}}"#;
    s.write_atomically(Path::new("zarr.json"), new).unwrap();
    assert_eq!(
        read(&s),
        new,
        "this store's write is read, not the bytes kept"
    );
}

/// A name is its key, as other S3 clients write and read it: non-ASCII letters, `~`,
/// `#`, `%`, `[`, `]` are not percent-encoded (`ärr` was stored as `%C3%A4rr`, which
/// zarr-python reading the bucket could not find; and an array `ärr` that zarr-python
/// wrote was listed by the mount but not found). A key part that is no name is not
/// shown; a name that can be no key part (an ASCII control character) is refused.
#[test]
fn names_are_their_keys_as_other_clients_write_them() {
    let mem = Arc::new(object_store::memory::InMemory::new());
    let s = BucketStore::new(mem.clone(), "pré fix", "memory://keys").unwrap();
    let names = ["ärr_日本", "notes~", "b#c", "50%", "br[1]", "e\u{301}clair"];
    for n in names {
        s.write_atomically(&Path::new("a").join(n), n.as_bytes())
            .unwrap();
    }
    for n in names {
        // The key as another client names it, unencoded.
        let key = ObjPath::parse(format!("pré fix/a/{n}")).unwrap();
        assert_eq!(key.as_ref(), format!("pré fix/a/{n}"));
        let head = s.block_on(mem.head(&key));
        assert!(head.is_ok(), "{n}: no object at the key {key}: {head:?}");
    }
    // Written by another client, as it names them: found by those names.
    for n in ["ñame", "x]y"] {
        let key = ObjPath::parse(format!("pré fix/a/{n}")).unwrap();
        s.block_on(mem.put(&key, PutPayload::from(n.as_bytes().to_vec())))
            .unwrap();
        let m = s.stat(&Path::new("a").join(n)).unwrap();
        assert_eq!(m.map(|m| m.len), Some(n.len() as u64), "{n}");
    }
    assert!(
        s.list(Path::new("a"))
            .unwrap()
            .iter()
            .any(|e| e.name == "ñame")
    );
    // A control character cannot be in a key part: refused (EINVAL), nothing stored.
    let err = s
        .write_atomically(Path::new("a/tab\there"), b"t")
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
}

/// One LIST of everything below a directory (`list_tree`) answers, for the TTL, for the
/// listings of it and of every directory below it and for the HEADs of what they hold,
/// as their own LISTs would; more names than asked for, or no TTL, keep nothing.
#[test]
fn a_tree_listing_answers_for_every_directory_below_it() {
    use std::sync::atomic::Ordering::Relaxed;
    let mem = Arc::new(object_store::memory::InMemory::new());
    let mut s = BucketStore::new(mem, "p", "memory://test").unwrap();
    s.write_atomically(Path::new("a/c/0/0"), b"shard").unwrap();
    assert!(
        !s.list_tree(Path::new("a/c"), 10).unwrap(),
        "no TTL: nothing kept"
    );
    assert_eq!(s.counters().lists.load(Relaxed), 0, "nor asked");
    s.meta = Arc::new(MetaCache::new(Duration::from_secs(600)));
    s.write_atomically(Path::new("a/c/0/1"), b"shard!").unwrap();
    s.write_atomically(Path::new("a/c/1/0"), b"shard").unwrap();
    s.write_atomically(Path::new("a/c/1/x/0"), b"deeper")
        .unwrap();
    s.write_atomically(Path::new("a/zarr.json"), b"{}").unwrap();
    assert!(
        !s.list_tree(Path::new("a/c"), 3).unwrap(),
        "4 keys: too many"
    );
    assert!(s.list_tree(Path::new("a/c"), 4).unwrap());
    let asked = |s: &BucketStore| {
        s.counters().heads.load(Relaxed)
            + s.counters().lists.load(Relaxed)
            + s.counters().gets.load(Relaxed)
    };
    let before = asked(&s);
    let names = |rel: &str| -> Vec<(String, EntryKind)> {
        s.list(Path::new(rel))
            .unwrap()
            .into_iter()
            .map(|e| (e.name.into_string().unwrap(), e.kind))
            .collect()
    };
    use EntryKind::{Dir, File};
    assert_eq!(names("a/c"), [("0".into(), Dir), ("1".into(), Dir)]);
    assert_eq!(names("a/c/0"), [("0".into(), File), ("1".into(), File)]);
    assert_eq!(names("a/c/1"), [("0".into(), File), ("x".into(), Dir)]);
    assert_eq!(names("a/c/1/x"), [("0".into(), File)]);
    assert_eq!(s.stat(Path::new("a/c/0/1")).unwrap().unwrap().len, 6);
    assert_eq!(s.stat(Path::new("a/c/1/x")).unwrap().unwrap().kind, Dir);
    assert!(s.stat(Path::new("a/c/2")).unwrap().is_none());
    assert_eq!(asked(&s), before, "answered from the one LIST");
    // This store's own write below is seen at once.
    s.write_atomically(Path::new("a/c/0/2"), b"new").unwrap();
    assert_eq!(names("a/c/0").len(), 3);
}
