//! Mounts for the tests: in-process mounts (`Mount`, unmounted when dropped) and mounts
//! made with the `shardfs` command line (`CliMount`, unmounted when dropped), so that a
//! test that fails leaves no mount behind.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use shardfs::{Mount, MountOptions};

/// `store` mounted writable with the default options in a new temporary directory.
pub fn mount_rw(store: &Path) -> (tempfile::TempDir, Mount) {
    mount_with(store, &MountOptions::default())
}

/// `store` mounted with `opts` in a new temporary directory. Callers bind the pair as
/// `let (mnt, m) = ...`: locals drop in reverse order, so the mount goes before its
/// directory.
pub fn mount_with(store: &Path, opts: &MountOptions) -> (tempfile::TempDir, Mount) {
    let mnt = tempfile::tempdir().unwrap();
    let mount = Mount::new(store, mnt.path(), opts).unwrap();
    (mnt, mount)
}

/// Writable options that flush only when the test says (fsync, unmount): the flush
/// interval is an hour, longer than any test.
pub fn flush_on_demand() -> MountOptions {
    MountOptions {
        flush_interval: Duration::from_secs(3600),
        ..MountOptions::default()
    }
}

/// Whether `path` is a mount point. The kernel lists mount points by their canonical
/// path; a path that cannot be resolved (a mount whose daemon died answers ENOTCONN) is
/// looked up as given.
pub fn is_mounted(path: &Path) -> bool {
    let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    shardfs::mount::is_mount_point(&canon)
}

/// The `shardfs` binary of this build.
pub fn shardfs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shardfs"))
}

/// A mount made with the command line, unmounted (`--lazy`) when dropped if it is still
/// there, also when the test panics.
pub struct CliMount {
    at: PathBuf,
}

impl CliMount {
    /// `shardfs mount STORE AT ARGS...`, which must succeed; makes `at` if missing.
    pub fn new(store: &Path, at: &Path, args: &[&str]) -> CliMount {
        std::fs::create_dir_all(at).unwrap();
        let out = shardfs()
            .arg("mount")
            .arg(store)
            .arg(at)
            .args(args)
            .output()
            .unwrap();
        let mount = CliMount::guard(at);
        assert!(
            out.status.success(),
            "shardfs mount {} {} {args:?}: {}",
            store.display(),
            at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        mount
    }

    /// The guard of whatever gets mounted at `at` by a command the test runs itself (to
    /// check what the command says, or that it fails).
    pub fn guard(at: &Path) -> CliMount {
        CliMount {
            at: at.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.at
    }

    /// `shardfs unmount`, which must succeed: it returns once the daemon has written
    /// everything and exited.
    pub fn unmount(self) {
        let out = shardfs().arg("unmount").arg(&self.at).output().unwrap();
        assert!(
            out.status.success(),
            "shardfs unmount {}: {}",
            self.at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for CliMount {
    fn drop(&mut self) {
        if is_mounted(&self.at) {
            let _ = shardfs().args(["unmount", "--lazy"]).arg(&self.at).output();
        }
    }
}
