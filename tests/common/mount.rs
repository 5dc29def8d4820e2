//! Mounts for the tests: in-process mounts (`Mount`, unmounted when dropped) and mounts
//! made with the `shardfs` command line (`CliMount`, unmounted when dropped; daemonized
//! or in the foreground, with a log file read back at unmount), so that a test that
//! fails leaves no mount behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// Wait until `at` is a mount point (a mount started in the foreground, whose command
/// returns only when the mount ends, is live); fail the test if it is not within `limit`.
pub fn wait_until_mounted(at: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !is_mounted(at) {
        assert!(
            Instant::now() < deadline,
            "{} not mounted within {limit:?}",
            at.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A mount made with the command line, unmounted (`--lazy`) when dropped if it is still
/// there, also when the test panics.
pub struct CliMount {
    at: PathBuf,
    /// The daemon's `--log-file`, read by `unmount`.
    log: Option<PathBuf>,
    /// The command of a mount in the foreground, which runs until the mount ends.
    foreground: Option<Child>,
}

/// What is left to check once a `CliMount` is unmounted: the daemon has exited, so its
/// log is whole.
pub struct Unmounted {
    /// What `shardfs unmount` said on stderr.
    pub stderr: String,
    /// The daemon's log file (empty for a mount made without one).
    pub log: String,
    /// What the command of a mount in the foreground said on stderr (it exited 0).
    pub foreground_stderr: String,
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

    /// `shardfs mount STORE AT --log-file LOG ARGS...`, which must succeed: the daemon
    /// logs from `info` up to `log`, which `unmount` reads. Makes `at` if missing.
    pub fn logged(store: &Path, at: &Path, log: &Path, args: &[&str]) -> CliMount {
        let log_file = ["--log-file", log.to_str().unwrap()];
        let mut mount = CliMount::new(store, at, &[&log_file[..], args].concat());
        mount.log = Some(log.to_path_buf());
        mount
    }

    /// The same in the foreground: `shardfs mount STORE AT --foreground --log-file LOG
    /// ARGS...` runs as the test's child (its stderr kept) until the mount ends; returns
    /// once `at` is mounted (within 30 s). `unmount` checks that the command exits 0.
    pub fn logged_in_foreground(store: &Path, at: &Path, log: &Path, args: &[&str]) -> CliMount {
        std::fs::create_dir_all(at).unwrap();
        let child = shardfs()
            .arg("mount")
            .arg(store)
            .arg(at)
            .arg("--foreground")
            .arg("--log-file")
            .arg(log)
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mount = CliMount {
            at: at.to_path_buf(),
            log: Some(log.to_path_buf()),
            foreground: Some(child),
        };
        wait_until_mounted(at, Duration::from_secs(30));
        mount
    }

    /// The guard of whatever gets mounted at `at` by a command the test runs itself (to
    /// check what the command says, or that it fails).
    pub fn guard(at: &Path) -> CliMount {
        CliMount {
            at: at.to_path_buf(),
            log: None,
            foreground: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.at
    }

    /// `shardfs unmount`, which must succeed: it returns once the daemon has written
    /// everything and exited (a mount in the foreground: its command, which must exit 0).
    pub fn unmount(mut self) -> Unmounted {
        let out = shardfs().arg("unmount").arg(&self.at).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "shardfs unmount {}: {stderr}",
            self.at.display()
        );
        let foreground_stderr = match self.foreground.take() {
            Some(child) => {
                let out = child.wait_with_output().unwrap();
                let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                assert!(
                    out.status.success(),
                    "shardfs mount --foreground {}: {stderr}",
                    self.at.display()
                );
                stderr
            }
            None => String::new(),
        };
        let log = match &self.log {
            Some(log) => std::fs::read_to_string(log)
                .unwrap_or_else(|e| panic!("the log file {}: {e}", log.display())),
            None => String::new(),
        };
        Unmounted {
            stderr,
            log,
            foreground_stderr,
        }
    }
}

impl Drop for CliMount {
    fn drop(&mut self) {
        if is_mounted(&self.at) {
            let _ = shardfs().args(["unmount", "--lazy"]).arg(&self.at).output();
        }
    }
}
