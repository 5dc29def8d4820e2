//! Mounting: the options a mount takes, and [`Mount`], a guard that mounts a store at a
//! directory and unmounts on drop — for the daemon and for other projects' test suites:
//!
//! ```no_run
//! let dir = tempfile::tempdir()?;
//! let mount = shardfs::Mount::new("/data/brain.zarr", dir.path(), &Default::default())?;
//! let meta = std::fs::read(dir.path().join("raw/zarr.json"))?;
//! drop(mount); // unmounted here, also when a test panics
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuser::{BackgroundSession, Config, MountOption, SessionACL};

use crate::fuse::ShardFs;
use crate::store::{LocalStore, Store};
use crate::view::{View, ViewConfig};

/// Everything a mount can be told.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// `allow_other`: users other than the mounting one may use the mount.
    pub allow_other: bool,
    /// Kernel flags passed through (`dev`/`nodev`, `suid`/`nosuid`, `exec`/`noexec`,
    /// `atime`/`noatime`, `sync`/`async`, `dirsync`).
    pub flags: Vec<MountOption>,
    /// How long the kernel caches entries and attributes.
    pub ttl: Duration,
    /// FUSE worker threads.
    pub threads: usize,
    pub view: ViewConfig,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            allow_other: false,
            flags: Vec::new(),
            ttl: Duration::from_secs(1),
            threads: std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .clamp(2, 16),
            view: ViewConfig::default(),
        }
    }
}

/// Why a mount failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("cannot open store {path}: {source}")]
    Store { path: PathBuf, source: io::Error },
    #[error("mount point {path}: {why}")]
    MountPoint { path: PathBuf, why: String },
    #[error("cannot mount at {path}: {source}")]
    Fuse { path: PathBuf, source: io::Error },
}

/// A live mount; unmounts when dropped.
pub struct Mount {
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    view: Arc<View>,
}

impl Mount {
    /// Mount the store at `store` on `mountpoint` and return once the mount is live.
    pub fn new(
        store: impl AsRef<Path>,
        mountpoint: impl AsRef<Path>,
        opts: &MountOptions,
    ) -> Result<Mount, MountError> {
        let (store, mountpoint) = (store.as_ref(), mountpoint.as_ref());
        let local = LocalStore::open(store).map_err(|source| MountError::Store {
            path: store.to_path_buf(),
            source,
        })?;
        let meta = std::fs::metadata(mountpoint).map_err(|e| MountError::MountPoint {
            path: mountpoint.to_path_buf(),
            why: e.to_string(),
        })?;
        if !meta.is_dir() {
            return Err(MountError::MountPoint {
                path: mountpoint.to_path_buf(),
                why: "not a directory".into(),
            });
        }
        let fsname = std::fs::canonicalize(store).unwrap_or_else(|_| store.to_path_buf());
        let store: Arc<dyn Store> = Arc::new(local);
        let view =
            Arc::new(
                View::new(store, opts.view.clone()).map_err(|source| MountError::Store {
                    path: fsname.clone(),
                    source,
                })?,
            );
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName(fsname.display().to_string()),
            MountOption::Subtype("shardfs".into()),
            MountOption::DefaultPermissions,
            // Writes arrive with the write path; until then the mount is read-only.
            MountOption::RO,
        ];
        config.mount_options.extend(opts.flags.iter().cloned());
        config.acl = if opts.allow_other {
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        config.n_threads = Some(opts.threads.max(1));
        config.clone_fd = true;
        let fs = ShardFs::new(view.clone(), opts.ttl);
        let session =
            fuser::spawn_mount(fs, mountpoint, &config).map_err(|source| MountError::Fuse {
                path: mountpoint.to_path_buf(),
                source,
            })?;
        log::info!("mounted {} at {}", fsname.display(), mountpoint.display());
        Ok(Mount {
            session: Some(session),
            mountpoint: mountpoint.to_path_buf(),
            view,
        })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn view(&self) -> &Arc<View> {
        &self.view
    }

    /// Whether the session ended (someone unmounted it from outside).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// Unmount now and wait for the session to end.
    pub fn unmount(mut self) -> io::Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        if session.guard.is_finished() {
            return session.join();
        }
        session.umount_and_join()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            log::error!("unmounting {}: {e}", self.mountpoint.display());
            // Last resort, so that a failed test never leaves a mount behind.
            let _ = unmount_path(&self.mountpoint, true);
        }
    }
}

/// Unmount whatever is mounted at `path` (`shardfs unmount`). `lazy` detaches a busy
/// mount instead of failing.
pub fn unmount_path(path: &Path, lazy: bool) -> io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EPERM) {
        return Err(err);
    }
    // Not root: the setuid helper unmounts mounts the user made.
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let status = cmd.arg(path).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "fusermount3 -u {} failed: {status}",
            path.display()
        )))
    }
}
