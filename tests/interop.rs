//! Real clients: zarr-python 3 and tensorstore open every fixture store through the
//! mount (an unsharded array to them) and directly (sharded), and must read the same
//! values. Runs `tests/py/interop.py` in the venv that `scripts/setup-venv` makes.

mod common;

use std::path::PathBuf;
use std::process::Command;

use shardfs::{Mount, MountOptions};

#[test]
fn zarr_python_and_tensorstore_read_the_mount_like_the_store() {
    if !common::can_mount() {
        return;
    }
    let Some(python) = common::venv_python(".venv") else {
        return;
    };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/interop.py");
    let mut stores = common::stores_with_twins();
    stores.push("sample".into());
    let sample_dir = tempfile::tempdir().unwrap();
    shardfs::sample::write_sample_store(sample_dir.path()).unwrap();
    for store in stores {
        let store_dir = if store == "sample" {
            sample_dir.path().to_path_buf()
        } else {
            common::fixtures().join(&store)
        };
        let mnt = tempfile::tempdir().unwrap();
        let opts = MountOptions {
            read_only: true,
            ..MountOptions::default()
        };
        let _mount = Mount::new(&store_dir, mnt.path(), &opts).unwrap();
        let out = Command::new(&python)
            .arg(&script)
            .arg("--store")
            .arg(&store_dir)
            .arg("--mount")
            .arg(mnt.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!("{store}:\n{stdout}");
        assert!(
            out.status.success(),
            "{store}: interop failed\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(" 0 failed"), "{store}: {stdout}");
    }
}
