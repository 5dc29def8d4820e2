//! The README's code examples run as written (issue 37): its Rust example is the code of
//! the test below, word for word; its quick start and its v2 view example run in bash
//! with `/data/brain.zarr` and `/mnt/brain` replaced by a store and a mount point of the
//! test's own, `shardfs` being this build and `python` the venv's (zarr-python 3, and
//! 2.18 for the v2 view). Elsewhere: the Python example runs in `scripts/wheel-test`
//! (examples/python/test_with_zarr.py), the fstab lines in `scripts/system-mount-test`,
//! the S3 lines (an endpoint of the test's own) in tests/s3.rs.

mod common;

use common::mount::CliMount;

use std::path::Path;
use std::process::Command;

const README: &str = include_str!("../README.md");

/// The code blocks of the README that open with ```` ```LANG ````.
fn blocks(lang: &str) -> Vec<&'static str> {
    let fence = format!("```{lang}\n");
    README
        .split(fence.as_str())
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap())
        .collect()
}

/// Run `block` in bash with the README's paths replaced, `shardfs` and `python` first on
/// the PATH; it must exit 0. Returns its output.
fn run_block(block: &str, store: &Path, mnt: &Path, python: &Path) -> String {
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_shardfs"), bin.path().join("shardfs")).unwrap();
    // A script, not a link: a venv's python finds its venv from the path it is run by.
    let wrapper = bin.path().join("python");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec '{}' \"$@\"\n", python.display()),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let script = block
        .replace("/data/brain.zarr", store.to_str().unwrap())
        .replace("/mnt/brain", mnt.to_str().unwrap());
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-e", "-c", &script])
        .env("PATH", path)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{script}\n{said}");
    said
}

/// A store like the README's `/data/brain.zarr`: a sharded array `raw` (its inner chunk
/// c/0/3 exists), made by zarr-python 3.
fn brain_store(python: &Path, store: &Path) {
    let out = Command::new(python)
        .arg("-c")
        .arg(
            "import sys, numpy as np, zarr\n\
             a = zarr.create_array(sys.argv[1] + '/raw', shape=(16, 16), chunks=(4, 4), \
             shards=(8, 8), dtype='uint8')\n\
             a[:] = np.arange(256, dtype='uint8').reshape(16, 16)",
        )
        .arg(store)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_readme_quick_start_and_v2_view_examples_run_as_written() {
    if !common::can_mount() {
        return;
    }
    let (Some(py3), Some(py2)) = (
        common::venv_python(".venv"),
        common::venv_python(".venv-zarr2"),
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (store, mnt) = (tmp.path().join("brain.zarr"), tmp.path().join("brain"));
    std::fs::create_dir(&mnt).unwrap();
    brain_store(&py3, &store);
    let _guard = CliMount::guard(&mnt);
    // The first block: mount, ls, zarr-python 3 reads, unmount.
    let quick = blocks("")[0];
    assert!(
        quick.starts_with("shardfs mount /data/brain.zarr /mnt/brain"),
        "{quick}"
    );
    let said = run_block(quick, &store, &mnt, &py3);
    assert!(
        said.contains("[[  0   1   2"),
        "zarr read the array: {said}"
    );
    assert!(!shardfs::mount::is_mount_point(
        &mnt.canonicalize().unwrap()
    ));
    // The v2 view: zarr-python 2.18 reads the same values; the block leaves it mounted.
    let v2 = blocks("")
        .into_iter()
        .find(|b| b.starts_with("shardfs mount --format v2"))
        .expect("the README's v2 view example");
    let said = run_block(v2, &store, &mnt, &py2);
    assert!(
        said.starts_with("2.18"),
        "zarr-python 2 printed its version: {said}"
    );
    assert!(said.contains("[[  0   1   2"), "{said}");
    let st = Command::new(env!("CARGO_BIN_EXE_shardfs"))
        .arg("unmount")
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success());
}

/// The README's Rust example, word for word (the test fails if the two differ), run.
#[test]
fn the_readme_rust_example_runs_as_written() -> Result<(), Box<dyn std::error::Error>> {
    if !common::can_mount() {
        return Ok(());
    }
    let example = r#"let dir = tempfile::tempdir()?;
let mount = shardfs::Mount::new("tests/fixtures/zarr_basic", dir.path(), &Default::default())?;
let chunk = std::fs::read(dir.path().join("index_start/c/0/0"))?; // one inner chunk
drop(mount); // unmounts, also when the test panics
"#;
    assert_eq!(
        blocks("rust"),
        vec![example],
        "the README's Rust example changed"
    );
    let dir = tempfile::tempdir()?;
    let mount = shardfs::Mount::new("tests/fixtures/zarr_basic", dir.path(), &Default::default())?;
    let chunk = std::fs::read(dir.path().join("index_start/c/0/0"))?; // one inner chunk
    drop(mount); // unmounts, also when the test panics
    assert!(!chunk.is_empty());
    assert!(!shardfs::mount::is_mount_point(&dir.path().canonicalize()?));
    Ok(())
}
