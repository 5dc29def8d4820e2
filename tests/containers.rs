//! The seed's blosc containers through the mount (issue 36): bcolz carrays and ctables
//! (bcolz-zipline 1.13) and bloscpack files (bloscpack 0.16), made by their own producers
//! in `scripts/make_containers.py`, read through the v3 view by zarr-python 3 and through
//! the v2 view by zarr 2.18, each also with dask and xarray, equal to what bcolz and
//! bloscpack read themselves; writes into them refused with EROFS; `cp -r` of one into
//! a writable mount makes a sharded v3 array of the same values; broken containers and
//! chunks are EIO with a log line, never a panic; `shardfs info` lists them. The mounts are
//! daemons of the `shardfs` binary (a Python child must not inherit this process's FUSE
//! descriptors), each unmounted when its guard drops, also when a test fails.

mod common;

use common::mount::{CliMount, shardfs};
use common::repo;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The venv's python, where it has bcolz and bloscpack; else why not (a failure in CI).
fn producers() -> Option<PathBuf> {
    let py = common::venv_python(".venv")?;
    let out = Command::new(&py)
        .args(["-c", "import bcolz, numpy"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: .venv has no bcolz-zipline/bloscpack: run scripts/setup-venv\n{}",
        common::test_name(),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(py)
}

fn script(py: &Path, args: &[&str]) -> String {
    let out = Command::new(py)
        .arg(repo().join("scripts/make_containers.py"))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "make_containers.py {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Containers made by their producers in `<dir>/s`, what the producers read back in
/// `<dir>/expected`, and a root group document so that xarray opens the store.
fn made() -> Option<(tempfile::TempDir, PathBuf)> {
    if !common::can_mount() {
        return None;
    }
    let py = producers()?;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s");
    let expected = dir.path().join("expected");
    script(&py, &["make", s(&store), s(&expected)]);
    std::fs::write(
        store.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "group", "attributes": {}}"#,
    )
    .unwrap();
    Some((dir, py))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn zarr3_dask_and_xarray_read_the_v3_view_as_bcolz_and_bloscpack_read_the_containers() {
    let Some((dir, py)) = made() else { return };
    let mount = CliMount::new(&dir.path().join("s"), &dir.path().join("m"), &["-o", "ro"]);
    let out = script(
        &py,
        &["read", s(mount.path()), s(&dir.path().join("expected"))],
    );
    println!("{out}");
    assert!(out.contains("0 mismatches"), "{out}");
    mount.unmount();
}

#[test]
fn zarr2_dask_and_xarray_read_the_v2_view_as_bcolz_and_bloscpack_read_the_containers() {
    let Some((dir, _)) = made() else { return };
    let Some(py2) = common::venv_python(".venv-zarr2") else {
        return;
    };
    let mount = CliMount::new(
        &dir.path().join("s"),
        &dir.path().join("m"),
        &["-o", "ro,format=v2"],
    );
    let out = script(
        &py2,
        &["read", s(mount.path()), s(&dir.path().join("expected"))],
    );
    println!("{out}");
    assert!(
        out.contains("zarr 2.18") && out.contains("0 mismatches"),
        "{out}"
    );
    mount.unmount();
}

fn errno(r: std::io::Result<impl Sized>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

#[test]
fn writes_into_containers_are_refused_with_erofs_on_a_writable_mount() {
    let Some((dir, _)) = made() else { return };
    let mount = CliMount::new(&dir.path().join("s"), &dir.path().join("m"), &[]);
    let m = mount.path().to_path_buf();
    let erofs = Some(libc::EROFS);
    for d in ["c_lz4_1d_short", "p_crc32.blp", "t_table", "t_table/x"] {
        let d = m.join(d);
        assert_eq!(errno(std::fs::write(d.join("new"), b"x")), erofs, "{d:?}");
        assert_eq!(errno(std::fs::create_dir(d.join("sub"))), erofs, "{d:?}");
        assert_eq!(
            errno(std::fs::write(d.join("zarr.json"), b"{}")),
            erofs,
            "{d:?}"
        );
        assert_eq!(errno(std::fs::remove_dir(&d)), erofs, "{d:?}");
        assert_eq!(errno(std::fs::rename(&d, m.join("moved"))), erofs, "{d:?}");
    }
    let chunk = m.join("c_lz4_1d_short/c.0");
    // The kernel serves opens itself (without `open_checks`): the first write is refused.
    match std::fs::OpenOptions::new().write(true).open(&chunk) {
        Ok(mut f) => {
            use std::io::Write;
            let res = f.write_all(b"x").and_then(|_| f.sync_all());
            assert_eq!(errno(res), erofs);
        }
        Err(e) => assert_eq!(e.raw_os_error(), erofs),
    }
    assert_eq!(errno(std::fs::write(&chunk, b"x")), erofs);
    assert_eq!(errno(std::fs::remove_file(&chunk)), erofs);
    use std::os::unix::fs::PermissionsExt;
    let perm = std::fs::Permissions::from_mode(0o666);
    assert_eq!(errno(std::fs::set_permissions(&chunk, perm)), erofs);
    // The rest of the store stays writable.
    std::fs::write(m.join("notes.txt"), b"ok").unwrap();
    mount.unmount();
    assert_eq!(
        std::fs::read(dir.path().join("s/notes.txt")).unwrap(),
        b"ok"
    );
    assert!(dir.path().join("s/c_lz4_1d_short/data/__0.blp").exists());
}

#[test]
fn cp_r_of_a_container_into_a_writable_mount_makes_a_sharded_array_of_the_same_values() {
    let Some((dir, py)) = made() else { return };
    let src = CliMount::new(&dir.path().join("s"), &dir.path().join("m"), &["-o", "ro"]);
    let dst_store = dir.path().join("w");
    std::fs::create_dir(&dst_store).unwrap();
    let dst = CliMount::new(
        &dst_store,
        &dir.path().join("wm"),
        &["--chunks-per-shard", "4"],
    );
    let names = [
        "c_lz4_1d_short",
        "c_zlib_2d",
        "p_fortran.blp",
        "p_bytes.blp",
    ];
    for n in names {
        let st = Command::new("cp")
            .arg("-r")
            .arg(src.path().join(n))
            .arg(dst.path())
            .status()
            .unwrap();
        assert!(st.success(), "cp -r {n}");
    }
    dst.unmount();
    src.unmount();
    let expected = dir.path().join("expected");
    let mut args = vec!["copied", s(&dst_store), s(&expected)];
    args.extend(names);
    let out = script(&py, &args);
    println!("{out}");
    assert!(out.contains("sharded and equal: 4"), "{out}");
}

/// Copies of good containers, each broken one way.
fn break_containers(store: &Path) -> Vec<&'static str> {
    use shardfs::format::bloscpack;
    let read = |n: &str| std::fs::read(store.join(n)).unwrap();
    let good = read("p_crc32.blp");
    let p = bloscpack::parse_prefix(&good, good.len() as u64).unwrap();
    let slots = p.offsets.as_ref().unwrap().len() as u64 + p.header.max_app_chunks;
    let table = (p.data_start - 8 * slots) as usize;
    // Truncated; a wrong magic (no container: a plain file); offsets past the end; a
    // header whose chunk size disagrees with the frames; a chunk whose checksum fails.
    std::fs::write(store.join("b_truncated.blp"), &good[..good.len() / 2]).unwrap();
    let mut bad = good.clone();
    bad[..4].copy_from_slice(b"xxxx");
    std::fs::write(store.join("b_magic.blp"), &bad).unwrap();
    let mut bad = good.clone();
    bad[table + 8..table + 16].copy_from_slice(&(1i64 << 40).to_le_bytes());
    std::fs::write(store.join("b_offsets.blp"), &bad).unwrap();
    let mut bad = good.clone();
    bad[8..12].copy_from_slice(&1000i32.to_le_bytes());
    std::fs::write(store.join("b_sizes.blp"), &bad).unwrap();
    let mut bad = good.clone();
    let second = p.offsets.as_ref().unwrap()[1] as usize;
    bad[second + 40] ^= 0xff;
    std::fs::write(store.join("b_checksum.blp"), &bad).unwrap();
    // Malformed JSON in a carray; a cut chunk file of another.
    common::copy_tree(&store.join("c_blosclz_1d"), &store.join("b_json"));
    std::fs::write(store.join("b_json/meta/storage"), b"{\"dtype\": ").unwrap();
    common::copy_tree(&store.join("c_lz4_1d_short"), &store.join("b_chunk"));
    let cut = read("b_chunk/data/__2.blp");
    std::fs::write(store.join("b_chunk/data/__2.blp"), &cut[..cut.len() - 5]).unwrap();
    vec!["b_truncated.blp", "b_offsets.blp", "b_sizes.blp", "b_json"]
}

#[test]
fn broken_containers_and_chunks_are_eio_with_a_log_line_and_the_rest_reads() {
    let Some((dir, _)) = made() else { return };
    let store = dir.path().join("s");
    let unreadable = break_containers(&store);
    let mount = CliMount::logged(
        &store,
        &dir.path().join("m"),
        &dir.path().join("log"),
        &["-o", "ro"],
    );
    let m = mount.path().to_path_buf();
    let eio = Some(libc::EIO);
    for n in &unreadable {
        assert_eq!(errno(std::fs::metadata(m.join(n))), eio, "{n}");
    }
    // No container: passes through byte for byte.
    assert_eq!(
        std::fs::read(m.join("b_magic.blp")).unwrap(),
        std::fs::read(store.join("b_magic.blp")).unwrap()
    );
    // One chunk broken: that chunk is EIO, never other bytes; the others read.
    assert_eq!(errno(std::fs::read(m.join("b_checksum.blp/c.1.0"))), eio);
    assert!(std::fs::read(m.join("b_checksum.blp/c.0.0")).is_ok());
    assert_eq!(errno(std::fs::read(m.join("b_chunk/c.2"))), eio);
    assert!(std::fs::read(m.join("b_chunk/c.3")).is_ok());
    // The daemon is alive and well.
    assert!(std::fs::read(m.join("c_zlib_2d/zarr.json")).is_ok());
    let log = mount.unmount().log;
    for n in unreadable.iter().chain(&["b_checksum.blp", "b_chunk"]) {
        let lines = log.lines().filter(|l| l.contains(n)).count();
        assert!(lines >= 1, "no log line names {n}:\n{log}");
    }
    assert!(!log.contains("panicked"), "{log}");
    // `shardfs info` lists every container and says which cannot be shown.
    let out = shardfs().arg("info").arg(&store).output().unwrap();
    let info = String::from_utf8_lossy(&out.stdout);
    assert!(info.contains("c_zlib_2d  [bcolz carray]"), "{info}");
    assert!(info.contains("t_table/x  [bcolz ctable column]"), "{info}");
    assert!(info.contains("p_md5.blp  [bloscpack file]"), "{info}");
    assert!(info.contains("b_json  [container (unreadable)]"), "{info}");
    assert!(!info.contains("b_magic.blp"), "{info}");
}
