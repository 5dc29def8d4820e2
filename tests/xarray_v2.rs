//! xarray on zarr 2 through the v2 view (`--format v2`), issue 38: the datasets xarray on
//! zarr 3 writes must read through the view with the values and dtypes xarray on zarr 3
//! reads directly; xarray on zarr 2 writes through the view (strings, fill values,
//! consolidated metadata) and zarr 3 reads the store; dask region writes from several
//! processes, through one mount and through two mounts of one store, keep every region.
//! Runs `tests/py/xarray_v2.py` under both venvs from `scripts/setup-venv` (xarray, dask
//! and pandas are in both requirements files), against the `shardfs` binary: the Python
//! processes then talk to a mount daemon of its own, as users' do (a mount served from
//! threads of this test program would share its descriptors with every child it forks).

mod common;

use common::mount::CliMount;
use common::repo;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The venv python at `.venv*/bin/python`, or why the test cannot run: a missing venv
/// skips with the reason (a failure under CI, where `scripts/test` makes both); a venv
/// without xarray and dask is out of date, and fails with what to run.
fn python(venv: &str) -> Option<PathBuf> {
    let p = common::venv_python(venv)?;
    let setup = common::venv_setup(venv);
    let out = Command::new(&p)
        .args(["-c", "import xarray, dask, pandas"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {venv} has no xarray/dask/pandas: run {setup}\n{}",
        common::test_name(),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(p)
}

fn venvs() -> Option<(PathBuf, PathBuf)> {
    let py2 = python(".venv-zarr2")?;
    let py3 = python(".venv")?;
    Some((py2, py3))
}

/// Runs the steps of one test and collects their failures, so that one failing step
/// does not hide the next ones' results (each step prints every check it made).
#[derive(Default)]
struct Steps {
    failed: Vec<String>,
}

impl Steps {
    /// `tests/py/xarray_v2.py ARGS` under `python`; a non-zero exit (a failed check or a
    /// crash) is recorded with the lines that say why.
    fn run(&mut self, python: &Path, args: &[&str]) {
        let out = Command::new(python)
            .arg(repo().join("tests/py/xarray_v2.py"))
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let venv = python
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .file_name()
            .unwrap();
        let step = format!("{} xarray_v2.py {}", venv.to_string_lossy(), args.join(" "));
        println!("== {step}\n{stdout}");
        if !out.status.success() {
            let fails: Vec<&str> = stdout
                .lines()
                .filter(|l| l.starts_with("FAIL") || l.starts_with("xarray_v2:"))
                .collect();
            let tail: Vec<&str> = stderr.lines().rev().take(6).collect();
            self.failed.push(format!(
                "{step}:\n  {}\n  stderr (last lines): {}",
                fails.join("\n  "),
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ));
        }
    }

    fn assert_none_failed(self) {
        assert!(
            self.failed.is_empty(),
            "{}: {} step(s) failed\n{}",
            common::test_name(),
            self.failed.len(),
            self.failed.join("\n")
        );
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// xarray on zarr 3 writes `dataset_v3()` to `dir/store` (a plain directory), and what it
/// reads back from there is saved to `dir/truth.pkl`: (store, truth).
fn written_by_xarray_on_zarr3(steps: &mut Steps, py3: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    let (store, truth) = (dir.join("store"), dir.join("truth.pkl"));
    steps.run(py3, &["write", s(&store)]);
    steps.run(py3, &["expect", s(&store), s(&truth)]);
    (store, truth)
}

/// A dataset that xarray on zarr 3 writes (sharded and unsharded variables; CF time;
/// bool; int32 with all-zero chunks zarr 3 does not store; int64 coordinates; `string`
/// and `<U` strings; NaN and int `_FillValue`s; a variable with no chunk stored) reads
/// through a read-only v2 view, with xarray on zarr 2 and consolidated True, None and
/// False, as xarray on zarr 3 reads the store: every variable, dims, dtype, values
/// (NaN and NaT included) and attributes.
#[test]
fn xarray_on_zarr2_reads_through_the_v2_view_what_xarray_on_zarr3_wrote() {
    if !common::can_mount() {
        return;
    }
    let Some((py2, py3)) = venvs() else {
        return;
    };
    let (tmp, mut steps) = (tempfile::tempdir().unwrap(), Steps::default());
    let (store, truth) = written_by_xarray_on_zarr3(&mut steps, &py3, tmp.path());
    let mnt = tempfile::tempdir().unwrap();
    let mount = CliMount::new(&store, mnt.path(), &["-o", "ro,format=v2"]);
    steps.run(&py2, &["read-v2", s(mount.path()), s(&truth)]);
    mount.unmount();
    steps.assert_none_failed();
}

/// xarray on zarr 2 writes a dataset (object and `<U` strings, a float with a NaN
/// `_FillValue`, a packed int with -1, ints and bool with zarr 2's null fill, CF time)
/// through a writable v2 view and reads it back there, consolidated True, None and
/// False, also after an attribute was set without consolidating again (`.zmetadata` is
/// made from the hierarchy, never stale). Then zarr 3 reads the store directly (every
/// array sharded v3, no v2 file kept, `.zmetadata` included), and xarray on zarr 2 reads
/// it again through a fresh read-only mount.
#[test]
fn xarray_on_zarr2_writes_through_the_v2_view_and_zarr3_reads_the_store() {
    if !common::can_mount() {
        return;
    }
    let Some((py2, py3)) = venvs() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let want = tmp.path().join("written.pkl");
    let mut steps = Steps::default();
    {
        let mnt = tempfile::tempdir().unwrap();
        let mount = CliMount::new(&store, mnt.path(), &["-o", "rw,format=v2"]);
        let ds = mount.path().join("ds");
        steps.run(&py2, &["write-v2", s(&ds), s(&want)]);
        mount.unmount();
    }
    steps.run(&py3, &["check-v3", s(&store.join("ds")), s(&want)]);
    {
        let mnt = tempfile::tempdir().unwrap();
        let mount = CliMount::new(&store, mnt.path(), &["-o", "ro,format=v2"]);
        steps.run(&py2, &["read-v2", s(&mount.path().join("ds")), s(&want)]);
        mount.unmount();
    }
    steps.assert_none_failed();
}

/// The xarray pattern for writing one dataset from many processes: a template written
/// with `compute=False`, then each process `to_zarr(region=...)` of its own rows (dask
/// arrays; the regions share shards in the store). Through one mount, and through two
/// mounts of one store with the processes split between them (the pattern that loses
/// data in zarr-python #3682). Every region is checked through the mount it was written
/// through (one mount), in the store with zarr 3, and through a fresh v2 mount.
#[test]
fn dask_region_writes_from_several_processes_keep_every_region() {
    if !common::can_mount() {
        return;
    }
    let Some((py2, py3)) = venvs() else {
        return;
    };
    let regions = "8";
    let mut steps = Steps::default();
    for nmounts in [1, 2] {
        let tmp = tempfile::tempdir().unwrap();
        let store = tmp.path().join("store");
        std::fs::create_dir(&store).unwrap();
        {
            let dirs: Vec<_> = (0..nmounts).map(|_| tempfile::tempdir().unwrap()).collect();
            let mounts: Vec<CliMount> = dirs
                .iter()
                .map(|d| CliMount::new(&store, d.path(), &["-o", "rw,format=v2"]))
                .collect();
            let targets: Vec<PathBuf> = mounts.iter().map(|m| m.path().join("r")).collect();
            let mut args = vec!["dask-regions", regions];
            args.extend(targets.iter().map(|t| s(t)));
            steps.run(&py2, &args);
            if nmounts == 1 {
                steps.run(&py2, &["regions-check", regions, s(&targets[0])]);
            }
            for m in mounts {
                m.unmount();
            }
        }
        steps.run(&py3, &["regions-check", regions, s(&store.join("r"))]);
        let mnt = tempfile::tempdir().unwrap();
        let mount = CliMount::new(&store, mnt.path(), &["-o", "ro,format=v2"]);
        steps.run(
            &py2,
            &["regions-check", regions, s(&mount.path().join("r"))],
        );
        mount.unmount();
    }
    steps.assert_none_failed();
}

/// xarray on zarr 3 keeps its consolidated metadata in the root `zarr.json`, and zarr 3
/// reads that instead of the hierarchy. xarray on zarr 2 appending through the v2 view
/// (`to_zarr(mode="a", append_dim="time")`) changes the hierarchy below it: the mount
/// drops it, so zarr 3's default open sees the appended steps (before, it saw the old
/// length and silently missed them).
#[test]
fn an_append_through_the_v2_view_reaches_zarr3_default_open() {
    if !common::can_mount() {
        return;
    }
    let Some((py2, py3)) = venvs() else {
        return;
    };
    let (tmp, mut steps) = (tempfile::tempdir().unwrap(), Steps::default());
    let (store, truth) = written_by_xarray_on_zarr3(&mut steps, &py3, tmp.path());
    let mnt = tempfile::tempdir().unwrap();
    let mount = CliMount::new(&store, mnt.path(), &["-o", "format=v2"]);
    steps.run(&py2, &["append-v2", s(mount.path())]);
    mount.unmount();
    steps.run(&py3, &["check-append", s(&store), s(&truth)]);
    steps.assert_none_failed();
}

/// xarray on zarr 3 keeps consolidated metadata in the root `zarr.json`, describing the
/// arrays as stored (sharded). The v3 view shows them unsharded, so it shows that
/// metadata with their entries unsharded too (before, zarr 3's default open of the view
/// read chunk files as shards: "Stored and computed checksum do not match"); and what
/// xarray on zarr 3 consolidates through the view is stored describing the shards, so
/// zarr 3's default open of the store reads it.
#[test]
fn xarray_on_zarr3_reads_and_writes_consolidated_datasets_through_the_v3_view() {
    if !common::can_mount() {
        return;
    }
    let Some((_, py3)) = venvs() else {
        return;
    };
    let (tmp, mut steps) = (tempfile::tempdir().unwrap(), Steps::default());
    let (store, truth) = written_by_xarray_on_zarr3(&mut steps, &py3, tmp.path());
    let mnt = tempfile::tempdir().unwrap();
    let mount = CliMount::new(&store, mnt.path(), &["-o", "ro"]);
    steps.run(&py3, &["read-v3", s(mount.path()), s(&truth)]);
    mount.unmount();
    // Written through a writable v3 view: new arrays are stored sharded.
    let store2 = tmp.path().join("store2");
    std::fs::create_dir(&store2).unwrap();
    let written = tmp.path().join("written.pkl");
    let mount = CliMount::new(&store2, mnt.path(), &["-o", "rw"]);
    steps.run(
        &py3,
        &["write-v3", s(&mount.path().join("ds")), s(&written)],
    );
    mount.unmount();
    steps.run(&py3, &["read-v3", s(&store2.join("ds")), s(&written)]);
    steps.assert_none_failed();
}
