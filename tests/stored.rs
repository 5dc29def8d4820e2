//! What is stored (issue 33): every kind of name a tool can make in the tree is stored
//! or refused with an errno, never accepted and dropped. One test per finding of the
//! issue's adversarial pass: files beside the chunks, metadata cut short, directory
//! renames.

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;

use shardfs::{Mount, MountOptions};

fn mount(store: &Path, opts: &MountOptions) -> (tempfile::TempDir, Mount) {
    let mnt = tempfile::tempdir().unwrap();
    let mount = Mount::new(store, mnt.path(), opts).unwrap();
    (mnt, mount)
}

fn errno_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.unwrap_err().raw_os_error().unwrap()
}

fn fsync(path: &Path) -> std::io::Result<()> {
    OpenOptions::new().write(true).open(path)?.sync_all()
}

fn assert_verify_clean(store: &Path) {
    let report = shardfs::maint::verify(store, false, false).unwrap();
    assert!(report.is_clean(), "{report}");
}

/// Finding 1: a file that is neither a chunk nor metadata, written into a sharded array's
/// directory or one of its key directories, is stored as a file at its path (durable at
/// its `fsync`, and at unmount without one); a later mount shows it; unlinked or renamed,
/// its stored copy goes with the name. Before the fix it lived in memory only and was
/// gone after the unmount.
#[test]
fn files_beside_the_chunks_are_stored_as_files() {
    for open_checks in [false, true] {
        if !common::can_mount() {
            return;
        }
        let tmp = common::store_copy("zarr_basic");
        let store = tmp.path().join("s");
        let a = "u16_default_sparse";
        let opts = MountOptions {
            open_checks,
            ..MountOptions::default()
        };
        {
            let (mnt, _m) = mount(&store, &opts);
            let p = |rel: &str| mnt.path().join(a).join(rel);
            fs::write(p("notes.txt"), b"notes").unwrap();
            fsync(&p("notes.txt")).unwrap();
            assert_eq!(
                fs::read(store.join(a).join("notes.txt")).unwrap(),
                b"notes",
                "durable at its fsync, before the unmount"
            );
            fs::write(p("c/README"), b"key dir").unwrap();
            fs::create_dir_all(p("c/3")).unwrap();
            fs::write(p("c/3/README"), b"deeper").unwrap();
            fs::write(p(".zattrs"), b"{}").unwrap();
            fs::write(p("gone.txt"), b"unlinked").unwrap();
            fsync(&p("gone.txt")).unwrap();
            fs::remove_file(p("gone.txt")).unwrap();
            fs::write(p("old.txt"), b"renamed").unwrap();
            fsync(&p("old.txt")).unwrap();
            fs::rename(p("old.txt"), p("new.txt")).unwrap();
            // Names shardfs keeps for its own files beside the shards cannot be made.
            assert_eq!(
                errno_of(fs::write(p("c/0.shardfs-append"), b"x")),
                libc::EINVAL
            );
            // A temporary file renamed onto a chunk key leaves nothing beside the shards.
            fs::write(p("c/3/2.partial"), vec![3u8; 24]).unwrap();
            fs::rename(p("c/3/2.partial"), p("c/3/2")).unwrap();
        }
        let kept = common::files_under(&store.join(a));
        for name in ["notes.txt", "c/README", "c/3/README", ".zattrs", "new.txt"] {
            assert!(kept.contains(name), "{name} not stored: {kept:?}");
        }
        for name in ["gone.txt", "old.txt", "c/3/2.partial"] {
            assert!(!kept.contains(name), "{name} stored: {kept:?}");
        }
        assert_verify_clean(&store);
        let (mnt, _m) = mount(&store, &opts);
        let p = |rel: &str| mnt.path().join(a).join(rel);
        assert_eq!(fs::read(p("notes.txt")).unwrap(), b"notes");
        assert_eq!(fs::read(p("c/README")).unwrap(), b"key dir");
        assert_eq!(fs::read(p("c/3/README")).unwrap(), b"deeper");
        assert_eq!(fs::read(p("new.txt")).unwrap(), b"renamed");
        assert_eq!(fs::read(p("c/3/2")).unwrap(), vec![3u8; 24]);
        let listed: Vec<String> = fs::read_dir(p("c/3"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(listed.contains(&"README".to_string()), "{listed:?}");
        // A stored one is a file of the store now: removed there when unlinked.
        fs::remove_file(p("c/README")).unwrap();
        assert!(!store.join(a).join("c/README").exists());
    }
}

/// Finding 2: metadata outside sharded arrays (a group's `zarr.json`, a new array's)
/// reaches the store only as a whole document. Cut short, the store keeps what it had,
/// and the commit that finds it unfinished (`fsync`, a rename onto the name) is refused
/// with `EINVAL`. Before the fix the half document was stored, and zarr could no longer
/// open the group.
#[test]
fn metadata_cut_short_never_reaches_the_store() {
    if !common::can_mount() {
        return;
    }
    let tmp = common::store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let before = fs::read(store.join("zarr.json")).unwrap();
    let half = br#"{"zarr_format": 3, "node_ty"#;
    let group = br#"{"zarr_format": 3, "node_type": "group", "attributes": {"k": 1}}"#;
    {
        let (mnt, _m) = mount(&store, &MountOptions::default());
        let m = mnt.path();
        // In place, cut short: never stored; its fsync says so.
        let mut f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(m.join("zarr.json"))
            .unwrap();
        f.write_all(half).unwrap();
        assert_eq!(fs::read(store.join("zarr.json")).unwrap(), before);
        assert_eq!(errno_of(f.sync_all()), libc::EINVAL);
        drop(f);
        assert_eq!(fs::read(store.join("zarr.json")).unwrap(), before);
        // A new group: nothing in the store until its document is whole.
        fs::create_dir(m.join("g")).unwrap();
        let mut f = fs::File::create(m.join("g/zarr.json")).unwrap();
        f.write_all(&group[..20]).unwrap();
        assert!(
            !store.join("g/zarr.json").exists(),
            "a new document cut short"
        );
        assert_eq!(fs::metadata(m.join("g/zarr.json")).unwrap().len(), 20);
        f.write_all(&group[20..]).unwrap();
        drop(f);
        assert_eq!(fs::read(store.join("g/zarr.json")).unwrap(), group);
        // A temporary file cut short is not renamed onto metadata.
        fs::write(m.join("g/.zarr.json.tmp"), half).unwrap();
        assert_eq!(
            errno_of(fs::rename(
                m.join("g/.zarr.json.tmp"),
                m.join("g/zarr.json")
            )),
            libc::EINVAL
        );
        assert_eq!(fs::read(m.join("g/zarr.json")).unwrap(), group);
        // Written in two pieces through two descriptors (`printf a > f; printf b >> f`):
        // the first close leaves it pending, the second completes it.
        fs::create_dir(m.join("p")).unwrap();
        fs::write(m.join("p/zarr.json"), &group[..20]).unwrap();
        assert_eq!(fs::read(m.join("p/zarr.json")).unwrap(), &group[..20]);
        OpenOptions::new()
            .append(true)
            .open(m.join("p/zarr.json"))
            .unwrap()
            .write_all(&group[20..])
            .unwrap();
        assert_eq!(fs::read(store.join("p/zarr.json")).unwrap(), group);
        // A sharded array whose metadata is rewritten cut short is still removed whole
        // by `rm -rf` (the pending write goes with the unlink, and the metadata under it).
        fs::write(m.join("index_start/zarr.json"), half).unwrap();
        let st = std::process::Command::new("rm")
            .arg("-rf")
            .arg(m.join("index_start"))
            .status()
            .unwrap();
        assert!(st.success(), "rm -rf of an array with metadata cut short");
        assert!(!store.join("index_start").exists());
        // A new group left cut short at the unmount.
        fs::create_dir(m.join("h")).unwrap();
        fs::write(m.join("h/zarr.json"), half).unwrap();
    }
    assert_eq!(fs::read(store.join("zarr.json")).unwrap(), before);
    assert_eq!(fs::read(store.join("g/zarr.json")).unwrap(), group);
    assert!(!store.join("h/zarr.json").exists());
    assert_eq!(fs::read(store.join("p/zarr.json")).unwrap(), group);
    assert_verify_clean(&store);
}

/// Finding 7: renaming a group's or an array's directory on a local store is one rename
/// in the store: what was written below it and not yet flushed lands at the new path,
/// and a later mount finds everything there. Before the fix it was `EXDEV` (`mv`
/// copied and deleted; zarr 2's `store.rename` and `group.move` failed).
#[test]
fn directories_of_groups_and_arrays_are_renamed() {
    if !common::can_mount() {
        return;
    }
    let tmp = common::store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let files = common::files_under(&store.join("u16_default_sparse"));
    let (mnt, m) = mount(&store, &MountOptions::default());
    let p = |rel: &str| mnt.path().join(rel);
    let chunk = fs::read(p("u16_default_sparse/c/0/0")).unwrap();
    // A chunk staged, and a file beside the chunks, not yet stored when it moves.
    fs::write(p("u16_default_sparse/c/2/2"), vec![5u8; 24]).unwrap();
    fs::write(p("u16_default_sparse/notes.txt"), b"n").unwrap();
    fs::create_dir(p("grp")).unwrap();
    fs::rename(p("u16_default_sparse"), p("grp/moved")).unwrap();
    assert!(!p("u16_default_sparse").exists());
    assert_eq!(fs::read(p("grp/moved/c/0/0")).unwrap(), chunk);
    assert_eq!(fs::read(p("grp/moved/c/2/2")).unwrap(), vec![5u8; 24]);
    assert_eq!(fs::read(p("grp/moved/notes.txt")).unwrap(), b"n");
    // A group with an array in it, renamed again.
    fs::rename(p("grp"), p("grp2")).unwrap();
    assert_eq!(fs::read(p("grp2/moved/c/2/2")).unwrap(), vec![5u8; 24]);
    // Into an array's key namespace: refused as before.
    assert_eq!(
        errno_of(fs::rename(p("grp2"), p("index_start/c/grp2"))),
        libc::EXDEV
    );
    drop(m);
    drop(mnt);
    assert!(!store.join("u16_default_sparse").exists());
    let moved = common::files_under(&store.join("grp2/moved"));
    for f in &files {
        assert!(moved.contains(f), "{f} not moved: {moved:?}");
    }
    assert!(moved.contains("notes.txt"));
    assert_verify_clean(&store);
    let (mnt, _m) = mount(&store, &MountOptions::default());
    assert_eq!(
        fs::read(mnt.path().join("grp2/moved/c/2/2")).unwrap(),
        vec![5u8; 24]
    );
    assert_eq!(
        fs::read(mnt.path().join("grp2/moved/c/0/0")).unwrap(),
        chunk
    );
}

fn run_python(python: &Path, code: &str, dir: &Path) {
    let out = std::process::Command::new(python)
        .arg("-c")
        .arg(code)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Finding 3: `rsync -a`, `cp -a` and `tar x` of unsharded arrays (v3 through the v3
/// view, v2 through the v2 view, 1- to 4-D, both v2 separators) into the mount as new
/// arrays exit 0 and store every chunk. rsync's generator makes the key directories
/// while its receiver renames `zarr.json` (or `.zarray`) into place; before the fix the
/// adoption of the new array left out directories made meanwhile (and dropped its own
/// for a moment), so `mkdir` returned 0 and the directory was gone: 6 of 6 rsync runs of
/// a 16³ array lost chunks, and rsync exited 23.
#[test]
fn rsync_cp_and_tar_of_unsharded_arrays_store_every_chunk() {
    if !common::can_mount() {
        return;
    }
    let (Some(py2), Some(py3)) = (
        common::venv_python(".venv-zarr2"),
        common::venv_python(".venv"),
    ) else {
        return;
    };
    let src = tempfile::tempdir().unwrap();
    let shapes = "{1: (64,), 2: (16, 16), 3: (8, 8, 8), 4: (4, 4, 4, 8)}";
    let chunks = "{1: (4,), 2: (4, 4), 3: (2, 2, 2), 4: (2, 2, 2, 2)}";
    let values = "lambda s: (np.arange(int(np.prod(s))) % 65521).astype('uint16').reshape(s)";
    run_python(
        &py3,
        &format!(
            "import zarr, numpy as np\nshapes = {shapes}\nchunks = {chunks}\nvalues = {values}\n\
             for d in shapes:\n    a = zarr.create_array(f'v3_{{d}}', shape=shapes[d], chunks=chunks[d], \
             dtype='uint16', compressors=None, fill_value=0)\n    a[:] = values(shapes[d])\n"
        ),
        src.path(),
    );
    run_python(
        &py2,
        &format!(
            "import zarr, numpy as np\nshapes = {shapes}\nchunks = {chunks}\nvalues = {values}\n\
             for d in shapes:\n    for name, sep in (('dot', '.'), ('slash', '/')):\n        \
             a = zarr.open_array(f'v2{{name}}_{{d}}', mode='w', shape=shapes[d], chunks=chunks[d], \
             dtype='uint16', compressor=None, fill_value=0, dimension_separator=sep)\n        \
             a[:] = values(shapes[d])\n"
        ),
        src.path(),
    );
    let store = tempfile::tempdir().unwrap();
    for (view, prefixes) in [
        (shardfs::view::ViewFormat::V3, &["v3_"][..]),
        (shardfs::view::ViewFormat::V2, &["v2dot_", "v2slash_"][..]),
    ] {
        for d in 1..=4usize {
            let opts = MountOptions {
                view: shardfs::view::ViewConfig {
                    format: view,
                    ..Default::default()
                },
                chunks_per_shard: Some(vec![2; d]),
                ..MountOptions::default()
            };
            let (mnt, m) = mount(store.path(), &opts);
            for prefix in prefixes {
                let name = format!("{prefix}{d}");
                let from = src.path().join(&name);
                for tool in ["rsync", "cp", "tar"] {
                    let to = mnt.path().join(format!("{name}_{tool}"));
                    let out = match tool {
                        "rsync" => std::process::Command::new("rsync")
                            .arg("-a")
                            .arg(format!("{}/", from.display()))
                            .arg(format!("{}/", to.display()))
                            .output(),
                        "cp" => std::process::Command::new("cp")
                            .arg("-a")
                            .arg(&from)
                            .arg(&to)
                            .output(),
                        _ => {
                            fs::create_dir(&to).unwrap();
                            std::process::Command::new("sh")
                                .arg("-c")
                                .arg("tar -C \"$1\" -cf - . | tar -C \"$2\" -xf -")
                                .arg("sh")
                                .arg(&from)
                                .arg(&to)
                                .output()
                        }
                    }
                    .unwrap_or_else(|e| panic!("{tool}: {e}"));
                    assert!(
                        out.status.success(),
                        "{tool} of {name} ({view:?}): {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
            drop(m);
            drop(mnt);
        }
    }
    assert_verify_clean(store.path());
    // Every array, read from the store by zarr-python 3, holds the values written.
    run_python(
        &py3,
        &format!(
            "import json, os, zarr, numpy as np\nvalues = {values}\nnames = sorted(os.listdir('.'))\n\
             assert len(names) == 36, names\n\
             for n in names:\n    a = zarr.open_array(n)\n    \
             codecs = json.load(open(n + '/zarr.json'))['codecs']\n    \
             assert codecs[0]['name'] == 'sharding_indexed', (n, codecs)\n    \
             got = a[:]\n    want = values(a.shape)\n    \
             assert (got == want).all(), (n, int((got != want).sum()))\n"
        ),
        store.path(),
    );
}

/// An unsharded array of the store whose `zarr.json` is rewritten through the mount (an
/// attribute added) stays unsharded: its chunk files, and files among them that are no
/// chunks, stay where they are. Before, the rewrite took it for a new array and sharded
/// it (found by the reference test: every chunk rewritten, files among them moved).
#[test]
fn an_unsharded_array_stays_unsharded_when_its_metadata_is_rewritten() {
    if !common::can_mount() {
        return;
    }
    let tmp = common::store_copy("zarr_basic.twin");
    let store = tmp.path().join("s");
    let a = "u16_default_sparse";
    let before = common::files_under(&store.join(a));
    assert!(before.iter().any(|f| f.starts_with("c/")), "{before:?}");
    {
        let (mnt, _m) = mount(&store, &MountOptions::default());
        let json = mnt.path().join(a).join("zarr.json");
        let mut doc: serde_json::Value = serde_json::from_slice(&fs::read(&json).unwrap()).unwrap();
        doc["attributes"]["note"] = "changed".into();
        fs::write(&json, serde_json::to_vec(&doc).unwrap()).unwrap();
        fs::write(mnt.path().join(a).join("c/notes.txt"), b"n").unwrap();
    }
    let after = common::files_under(&store.join(a));
    for f in &before {
        assert!(after.contains(f), "{f} moved: {after:?}");
    }
    let doc = common::json_file(&store.join(a).join("zarr.json"));
    assert_eq!(doc["attributes"]["note"], "changed");
    assert_ne!(doc["codecs"][0]["name"], "sharding_indexed", "{doc}");
}

/// A file of its own in a key directory that a shape shrink then leaves outside the grid
/// is still stored at unmount, and a later mount shows that directory as a plain one, to
/// be read and removed (`rm -rf` of the array empties the store). Before, the directory
/// was listed but not found, and `rm -rf` of the array failed (found by the reference
/// test).
#[test]
fn a_file_below_a_key_directory_a_shrink_left_outside_the_grid_is_kept() {
    if !common::can_mount() {
        return;
    }
    let tmp = common::store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let a = "u16_default_sparse";
    let resize = |mnt: &Path, rows: u64| {
        let json = mnt.join(a).join("zarr.json");
        let mut doc: serde_json::Value = serde_json::from_slice(&fs::read(&json).unwrap()).unwrap();
        doc["shape"][0] = rows.into();
        fs::write(&json, serde_json::to_vec(&doc).unwrap()).unwrap();
    };
    let rows = common::json_file(&store.join(a).join("zarr.json"))["shape"][0]
        .as_u64()
        .unwrap();
    {
        let (mnt, _m) = mount(&store, &MountOptions::default());
        fs::write(mnt.path().join(a).join("c/4/README"), b"first").unwrap();
        resize(mnt.path(), 2);
        // Outside the grid now, and still there as a plain directory, as in a plain
        // directory tree: the file written before the shrink (in memory until then) was
        // stored with it, and a rewrite through its path lands (before the fix the
        // directory vanished, and a rewrite while it was seen kept the older bytes:
        // seed 106 of the reference soak).
        let readme = mnt.path().join(a).join("c/4/README");
        assert_eq!(fs::read(&readme).unwrap(), b"first");
        fs::write(&readme, b"kept").unwrap();
        assert_eq!(fs::read(&readme).unwrap(), b"kept");
    }
    assert_eq!(fs::read(store.join(a).join("c/4/README")).unwrap(), b"kept");
    let (mnt, _m) = mount(&store, &MountOptions::default());
    let listed: Vec<String> = fs::read_dir(mnt.path().join(a).join("c"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(listed.contains(&"4".to_string()), "{listed:?}");
    assert_eq!(
        fs::read(mnt.path().join(a).join("c/4/README")).unwrap(),
        b"kept"
    );
    resize(mnt.path(), rows);
    assert_eq!(
        fs::read(mnt.path().join(a).join("c/4/README")).unwrap(),
        b"kept"
    );
    let st = std::process::Command::new("rm")
        .arg("-rf")
        .arg(mnt.path().join(a))
        .status()
        .unwrap();
    assert!(st.success());
    assert!(!store.join(a).exists(), "rm -rf emptied the store");
}

/// Finding 5: a chunk whose length no chunk of an uncompressed array can have is refused
/// at its commit (`EINVAL`): by a rename onto the key (the temporary file stays as it
/// was), by its `fsync` (written in place, `O_APPEND`); the chunk keeps its bytes. A
/// stored file of its own renamed to another such name moves in the store.
#[test]
fn chunks_of_a_length_the_codecs_cannot_decode_are_refused() {
    if !common::can_mount() {
        return;
    }
    let tmp = common::store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let a = "u16_default_sparse";
    let (mnt, m) = mount(&store, &MountOptions::default());
    let p = |rel: &str| mnt.path().join(a).join(rel);
    let before = fs::read(p("c/0/0")).unwrap();
    fs::write(p("c/0/0.partial"), vec![1u8; before.len() + 2]).unwrap();
    assert_eq!(
        errno_of(fs::rename(p("c/0/0.partial"), p("c/0/0"))),
        libc::EINVAL
    );
    assert_eq!(
        fs::read(p("c/0/0.partial")).unwrap().len(),
        before.len() + 2
    );
    // Written in place: refused at its fsync; the chunk keeps its bytes.
    let c01 = fs::read(p("c/0/1")).unwrap();
    let mut f = OpenOptions::new().append(true).open(p("c/0/1")).unwrap();
    f.write_all(&[9, 9]).unwrap();
    assert_eq!(errno_of(f.sync_all()), libc::EINVAL);
    drop(f);
    assert_eq!(fs::read(p("c/0/1")).unwrap(), c01);
    // A chunk file made, then a directory's fsync before its bytes come: not committed
    // (and refused, as an empty chunk) by that fsync, so the write that follows lands.
    let f = fs::File::create(p("c/1/0")).unwrap();
    fs::File::open(mnt.path().join(a))
        .unwrap()
        .sync_all()
        .unwrap();
    (&f).write_all(&vec![4u8; before.len()]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    // A stored file of its own, renamed within the array: moved in the store.
    fs::write(p("notes.txt"), b"n").unwrap();
    fsync(&p("notes.txt")).unwrap();
    fs::rename(p("notes.txt"), p("c/notes.txt")).unwrap();
    assert!(!store.join(a).join("notes.txt").exists());
    assert_eq!(fs::read(store.join(a).join("c/notes.txt")).unwrap(), b"n");
    // Rewritten whole and closed, then truncated to a length no chunk has through
    // another descriptor (`truncate -s`): the truncate is refused at its fsync, and the
    // chunk keeps the rewrite its close acknowledged (with kernel opens the close is
    // unheard; before the fix the refusal took the rewrite along: seed 302 of the
    // reference soak).
    fs::write(p("c/1/1"), vec![6u8; before.len()]).unwrap();
    let f = OpenOptions::new().write(true).open(p("c/1/1")).unwrap();
    f.set_len(before.len() as u64 + 4).unwrap();
    assert_eq!(errno_of(f.sync_all()), libc::EINVAL);
    drop(f);
    assert_eq!(fs::read(p("c/1/1")).unwrap(), vec![6u8; before.len()]);
    drop(m);
    drop(mnt);
    assert_verify_clean(&store);
    let (mnt, _m) = mount(&store, &MountOptions::default());
    let p = |rel: &str| mnt.path().join(a).join(rel);
    assert_eq!(fs::read(p("c/1/0")).unwrap(), vec![4u8; before.len()]);
    assert_eq!(
        fs::read(p("c/0/0")).unwrap(),
        before,
        "the refused rename stored nothing"
    );
    assert_eq!(
        fs::read(p("c/0/1")).unwrap(),
        c01,
        "the refused append stored nothing"
    );
    assert_eq!(
        fs::read(p("c/1/1")).unwrap(),
        vec![6u8; before.len()],
        "the refused truncate kept the rewrite before it"
    );
}
