//! The v2 view (`--format v2`) and stores of the 2022 draft layout, against real
//! clients: zarr-python 2.18 (`.venv-zarr2`) reads and writes through the mount;
//! zarr-python 3 and tensorstore (`.venv`) are the ground truth on the shards.
//! Runs `tests/py/v2_interop.py`; both venvs come from `scripts/setup-venv`.

mod common;
#[path = "v2/groups.rs"]
mod groups;
#[path = "v2/metadata.rs"]
mod metadata;
#[path = "v2/unlinked.rs"]
mod unlinked;

use common::repo;

use std::path::{Path, PathBuf};
use std::process::Command;

use shardfs::view::ViewFormat;
use shardfs::{Mount, MountOptions};

/// Run `tests/py/SCRIPT` with `args` under `python`; it must exit 0 (the scripts exit 1
/// on any failed check).
fn run_script(script: &str, python: &Path, args: &[&str]) -> String {
    let out = Command::new(python)
        .arg(repo().join("tests/py").join(script))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!(
        "{} {script} {}:\n{stdout}",
        python.display(),
        args.join(" ")
    );
    assert!(
        out.status.success(),
        "{script} {args:?} failed\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `tests/py/v2_interop.py`.
fn interop(python: &Path, args: &[&str]) -> String {
    run_script("v2_interop.py", python, args)
}

/// `tests/py/ome_interop.py`.
fn ome(python: &Path, args: &[&str]) -> String {
    run_script("ome_interop.py", python, args)
}

/// `tests/py/v2_plain.py`.
fn plain(python: &Path, args: &[&str]) -> String {
    run_script("v2_plain.py", python, args)
}

/// The arrays in `got` equal those in `want`, and `got` holds exactly `expect`.
fn compare(python: &Path, want: &Path, got: &Path, expect: &str) {
    let out = interop(
        python,
        &[
            "compare",
            "--want",
            s(want),
            "--got",
            s(got),
            "--expect",
            expect,
        ],
    );
    assert!(out.contains(" 0 failed"), "{out}");
}

fn v2_options(read_only: bool) -> MountOptions {
    let mut opts = MountOptions {
        read_only,
        ..MountOptions::default()
    };
    opts.view.format = ViewFormat::V2;
    opts
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn zarr2_reads_the_v2_view_of_every_fixture_like_zarr3_reads_the_store() {
    if !common::can_mount() {
        return;
    }
    let (Some(py2), Some(py3)) = (
        common::venv_python(".venv-zarr2"),
        common::venv_python(".venv"),
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let sample = tmp.path().join("sample");
    shardfs::sample::write_sample_store(&sample).unwrap();
    // The sharded stores, and their unsharded twins (every array passed through).
    let mut stores: Vec<PathBuf> = common::stores_with_twins()
        .iter()
        .flat_map(|s| [s.clone(), format!("{s}.twin")])
        .map(|s| common::fixtures().join(s))
        .collect();
    stores.push(sample);
    for store in stores {
        let name = store.file_name().unwrap().to_string_lossy().into_owned();
        // Which arrays the v2 view must show: `shardfs info` says, per array.
        let local = shardfs::store::LocalStore::open(&store).unwrap();
        let arrays = shardfs::info::inspect(&local).unwrap();
        let shown: Vec<&str> = arrays
            .iter()
            .filter(|a| a.v2_view.starts_with("shown"))
            .map(|a| a.path.as_str())
            .collect();
        assert!(!shown.is_empty(), "{name}: no array has a v2 form");
        let want = tmp.path().join(format!("{name}-v3.npz"));
        let got = tmp.path().join(format!("{name}-v2.npz"));
        interop(&py3, &["read", "--root", s(&store), "--out", s(&want)]);
        let mnt = tempfile::tempdir().unwrap();
        let _mount = Mount::new(&store, mnt.path(), &v2_options(true)).unwrap();
        // Nothing of Zarr v3 shows through.
        let files = common::files_under(mnt.path());
        assert!(
            !files.iter().any(|f| f.ends_with("zarr.json")),
            "{name}: zarr.json in the v2 view"
        );
        interop(&py2, &["read", "--root", s(mnt.path()), "--out", s(&got)]);
        let expect = shown.join(",");
        compare(&py3, &want, &got, &expect);
    }
}

#[test]
fn draft_layout_stores_read_through_both_views_like_zarr2_reads_them() {
    if !common::can_mount() {
        return;
    }
    let (Some(py2), Some(py3)) = (
        common::venv_python(".venv-zarr2"),
        common::venv_python(".venv"),
    ) else {
        return;
    };
    let store = repo().join("tests/fixtures-draft/draft");
    let tmp = tempfile::tempdir().unwrap();
    let truth = tmp.path().join("draft.npz");
    interop(
        &py2,
        &["read", "--draft", "--root", s(&store), "--out", s(&truth)],
    );
    let expect = "bl,grp/sub/gz,grp/vol,u8,zs";

    // The v3 view: final Zarr v3 that zarr-python 3 opens (it cannot read the draft).
    let v3 = tempfile::tempdir().unwrap();
    {
        // Mounted read-write on purpose: a draft store mounts read-only by itself.
        let _mount = Mount::new(&store, v3.path(), &MountOptions::default()).unwrap();
        let meta = common::json_file(&v3.path().join("grp/vol/zarr.json"));
        assert_eq!(meta["node_type"], "array");
        assert_eq!(meta["chunk_key_encoding"]["name"], "default");
        assert!(v3.path().join("grp/vol/c/0/0").is_file());
        let refused = std::fs::write(v3.path().join("grp/vol/c/0/0"), b"x").unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
        let got = tmp.path().join("v3.npz");
        interop(&py3, &["read", "--root", s(v3.path()), "--out", s(&got)]);
        compare(&py3, &truth, &got, expect);
    }

    // The v2 view: zarr-python 2 opens it as plain Zarr v2.
    let v2 = tempfile::tempdir().unwrap();
    let _mount = Mount::new(&store, v2.path(), &v2_options(true)).unwrap();
    assert!(v2.path().join("grp/vol/.zarray").is_file());
    assert!(v2.path().join("grp/sub/gz/0.0").is_file());
    let got = tmp.path().join("v2.npz");
    interop(&py2, &["read", "--root", s(v2.path()), "--out", s(&got)]);
    compare(&py3, &truth, &got, expect);
}

#[test]
fn zarr2_writes_through_the_v2_view_and_tensorstore_reads_the_shards() {
    if !common::can_mount() {
        return;
    }
    let (Some(py2), Some(py3)) = (
        common::venv_python(".venv-zarr2"),
        common::venv_python(".venv"),
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let status = Command::new("cp")
        .arg("-r")
        .arg(common::fixtures().join("zarr_codecs"))
        .arg(&store)
        .status()
        .unwrap();
    assert!(status.success());
    let want = tmp.path().join("written.npz");
    {
        let mnt = tempfile::tempdir().unwrap();
        let mount = Mount::new(&store, mnt.path(), &v2_options(false)).unwrap();
        interop(
            &py2,
            &["write", "--mount", s(mnt.path()), "--out", s(&want)],
        );
        // Read back through the mount before it goes: read-your-writes.
        let back = tmp.path().join("back.npz");
        interop(&py2, &["read", "--root", s(mnt.path()), "--out", s(&back)]);
        let out = interop(
            &py3,
            &["compare", "--want", s(&want), "--got", s(&back), "--subset"],
        );
        assert!(
            out.contains(" 0 failed") && out.contains(" 11 passed"),
            "{out}"
        );
        mount.unmount().unwrap();
    }
    // No v2 metadata file was left in the store.
    let files = common::files_under(&store);
    assert!(
        !files
            .iter()
            .any(|f| f.ends_with(".zarray") || f.ends_with(".zgroup") || f.ends_with(".zattrs")),
        "{files:?}"
    );
    let out = interop(&py3, &["check", "--store", s(&store), "--want", s(&want)]);
    assert!(out.contains(" 0 failed"), "{out}");
    let group = common::json_file(&store.join("w_grp/zarr.json"));
    assert_eq!(group["node_type"], "group");
    assert_eq!(group["attributes"]["made_by"], "zarr 2");
}

/// Write a file and close it, reporting what `close` says (FUSE `flush` errors reach
/// the writer there; `std::fs::write` drops them).
/// Write `data` to `path`, `fsync` it, close it: the first error.
fn write_fsync_close(path: PathBuf, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

fn write_and_close(path: PathBuf, data: impl AsRef<[u8]>) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::fd::IntoRawFd;
    let mut f = std::fs::File::create(path)?;
    f.write_all(data.as_ref())?;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was just taken out of the File, nothing else owns it.
    if unsafe { libc::close(fd) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Arrays and groups that are added to a draft-layout store after it was mounted (as
/// zarr 2.18 adds them) are seen by the mount within twice `--ttl`, by a lookup of their
/// name and in listings, with their chunks.
#[test]
fn draft_arrays_added_after_the_mount_are_seen() {
    if !common::can_mount() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("draft");
    common::copy_tree(&repo().join("tests/fixtures-draft/draft"), &store);
    let mnt = tempfile::tempdir().unwrap();
    let mut opts = v2_options(true);
    opts.ttl = Some(std::time::Duration::from_millis(200));
    let mount = Mount::new(&store, mnt.path(), &opts).unwrap();
    let m = mnt.path();
    assert!(m.join("u8/.zarray").is_file());
    assert!(!m.join("u8b").exists());
    // Another writer adds an array (a copy of u8) and a group to the store.
    let meta = store.join("meta/root");
    std::fs::copy(meta.join("u8.array.json"), meta.join("u8b.array.json")).unwrap();
    common::copy_tree(&store.join("data/root/u8"), &store.join("data/root/u8b"));
    std::fs::copy(meta.join("grp.group.json"), meta.join("grp2.group.json")).unwrap();
    // Seen by a lookup of its name (no listing first), then listed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !m.join("u8b/.zarray").is_file() {
        assert!(
            std::time::Instant::now() < deadline,
            "u8b not seen after 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let names = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    while !names(m).contains(&"grp2".to_string()) {
        assert!(
            std::time::Instant::now() < deadline,
            "grp2 not listed after 10 s: {:?}",
            names(m)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(names(m).contains(&"u8b".to_string()), "{:?}", names(m));
    assert!(m.join("grp2/.zgroup").is_file());
    assert_eq!(
        std::fs::read(m.join("u8b/.zarray")).unwrap(),
        std::fs::read(m.join("u8/.zarray")).unwrap()
    );
    let chunks = common::files_under(&m.join("u8"));
    assert!(chunks.iter().any(|c| !c.starts_with('.')), "{chunks:?}");
    assert_eq!(common::files_under(&m.join("u8b")), chunks);
    for c in &chunks {
        assert_eq!(
            std::fs::read(m.join("u8b").join(c)).unwrap(),
            std::fs::read(m.join("u8").join(c)).unwrap(),
            "{c}"
        );
    }
    mount.unmount().unwrap();
}

/// Unsharded v3 arrays of every key encoding are in the v2 view, their chunk files
/// passed through at v2 keys: zarr 2.18 reads them, writes, resizes, sets attributes,
/// deletes one and replaces one through the mount, and zarr-python 3 reads every change
/// from the store, whose arrays stay unsharded with their own keys.
#[test]
fn zarr2_reads_and_writes_unsharded_v3_arrays_through_the_v2_view() {
    if !common::can_mount() {
        return;
    }
    let (Some(py2), Some(py3)) = (
        common::venv_python(".venv-zarr2"),
        common::venv_python(".venv"),
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    plain(&py3, &["make", "--store", s(&store)]);
    {
        let mnt = tempfile::tempdir().unwrap();
        let mount = Mount::new(&store, mnt.path(), &v2_options(false)).unwrap();
        let m = mnt.path();
        // The v2 names, and nothing of v3.
        assert!(m.join("nested/.zarray").is_file());
        assert!(m.join("nested/0/1").is_file());
        assert!(!m.join("nested/c").exists());
        assert!(!m.join("nested/zarr.json").exists());
        assert!(m.join("flat/1").is_file());
        assert!(!m.join("flat/c.1").exists());
        assert!(m.join("scalar/0").is_file());
        assert!(m.join("v2keys/2.1").is_file());
        // Byte for byte the store's chunk files.
        assert_eq!(
            std::fs::read(m.join("nested/1/0")).unwrap(),
            std::fs::read(store.join("nested/c/1/0")).unwrap()
        );
        let out = plain(&py2, &["write", "--mount", s(m)]);
        assert!(out.contains(" 9 passed"), "{out}");
        mount.unmount().unwrap();
    }
    assert!(
        store.join("nested/c/2/1").is_file(),
        "the grown array's new chunk"
    );
    assert!(
        !store.join("flat/c.2").exists(),
        "the shrink deleted the chunk past it"
    );
    assert!(
        !store.join("g/three").exists(),
        "the deleted array left nothing"
    );
    let files = common::files_under(&store);
    assert!(
        !files
            .iter()
            .any(|f| f.ends_with(".zarray") || f.ends_with(".zattrs") || f.contains(".partial")),
        "{files:?}"
    );
    let out = plain(&py3, &["check", "--store", s(&store)]);
    assert!(out.contains(" 9 passed"), "{out}");
}

/// Issue 38: in an array with dimension names (xarray's) and no `_FillValue` attribute,
/// `.zarray` shows `fill_value: null` (xarray on zarr 2 masks nothing), and a chunk the
/// store does not have reads, by its key, as a chunk of the v3 fill value: zarr 2 never
/// reads uninitialised memory. Not listed; `unlink` changes nothing; a write stores it.
/// Sharded (inner chunks) and unsharded (passed-through chunk files) alike.
#[test]
fn missing_chunks_of_xarray_arrays_read_as_the_fill_value() {
    if !common::can_mount() {
        return;
    }
    let tmp = common::store_copy("zarr_basic");
    let store = tmp.path().join("s");
    // A sharded one of the fixtures, named as xarray names dimensions; fill value 9.
    let sharded = store.join("u16_default_sparse/zarr.json");
    let mut doc = common::json_file(&sharded);
    doc["dimension_names"] = serde_json::json!(["y", "x"]);
    doc["fill_value"] = 9.into();
    std::fs::write(&sharded, serde_json::to_vec(&doc).unwrap()).unwrap();
    // An unsharded one: uint8, chunks of 2, fill 7, chunk 0 stored.
    std::fs::create_dir_all(store.join("p/c")).unwrap();
    std::fs::write(
        store.join("p/zarr.json"),
        br#"{"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "uint8",
             "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
             "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
             "fill_value": 7, "codecs": [{"name": "bytes"}], "dimension_names": ["x"],
             "attributes": {}}"#,
    )
    .unwrap();
    std::fs::write(store.join("p/c/0"), [1u8, 2]).unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let mount = Mount::new(&store, mnt.path(), &v2_options(false)).unwrap();
    let m = mnt.path();
    let zarray = |a: &str| common::json_file(&m.join(a).join(".zarray"));
    let listed = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(zarray("p")["fill_value"], serde_json::Value::Null);
    assert_eq!(listed(&m.join("p")), [".zarray", ".zattrs", "0"]);
    assert_eq!(std::fs::read(m.join("p/1")).unwrap(), [7, 7]);
    std::fs::remove_file(m.join("p/1")).unwrap();
    assert_eq!(
        std::fs::read(m.join("p/1")).unwrap(),
        [7, 7],
        "still the fill"
    );
    assert!(!m.join("p/2").exists(), "outside the grid");
    // It exists for the kernel: a link onto it is EEXIST; it is no rename source.
    write_and_close(m.join("p/tmp"), [5u8, 5]).unwrap();
    let errno = |r: std::io::Result<()>| r.unwrap_err().raw_os_error();
    assert_eq!(
        errno(std::fs::hard_link(m.join("p/tmp"), m.join("p/1"))),
        Some(libc::EEXIST)
    );
    assert_eq!(
        errno(std::fs::rename(m.join("p/1"), m.join("p/moved"))),
        Some(libc::ENOENT)
    );
    std::fs::remove_file(m.join("p/tmp")).unwrap();
    write_and_close(m.join("p/1"), [3u8, 4]).unwrap();
    // Sharded: every key of the grid reads; the ones not listed as the fill value.
    let a = m.join("u16_default_sparse");
    assert_eq!(
        zarray("u16_default_sparse")["fill_value"],
        serde_json::Value::Null
    );
    let fill: Vec<u8> = 9u16.to_le_bytes().repeat(4 * 3);
    let mut served = 0;
    for i in 0..18u64.div_ceil(4) {
        let row = listed(&a.join(i.to_string()))
            .into_iter()
            .collect::<Vec<_>>();
        for j in 0..13u64.div_ceil(3) {
            let key = a.join(format!("{i}/{j}"));
            let bytes = std::fs::read(&key).unwrap();
            if !row.contains(&j.to_string()) {
                assert_eq!(bytes, fill, "{}", key.display());
                served += 1;
            }
        }
    }
    assert!(served > 0, "the fixture is sparse");
    mount.unmount().unwrap();
    assert_eq!(std::fs::read(store.join("p/c/1")).unwrap(), [3, 4]);
    assert!(!store.join("p/c/2").exists());
}
