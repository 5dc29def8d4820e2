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

use crate::compact::{AutoCompactor, Compactor, CpuCompactor, GpuCompactor};
use crate::freshness::Freshness;
use crate::fuse::ShardFs;
use crate::store::{Commits, Store};
use crate::view::write_api::{Invalidation, WriteConfig, Writer};
use crate::view::{KernelCommit, OpenPolicy, View, ViewConfig};

use crate::mount_target::check_mountpoint;
pub use crate::mount_target::{MountError, StoreName, not_zarr_warning, open_store};
use crate::mountpoint::unmount_busy_retry;
pub use crate::mountpoint::{daemon_pids, is_mount_point, unmount_path, wait_for_exit};
use fuser::INodeNo;

/// Everything a mount can be told.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// `allow_other`: users other than the mounting one may use the mount.
    pub allow_other: bool,
    /// Kernel flags passed through (`dev`/`nodev`, `suid`/`nosuid`, `exec`/`noexec`,
    /// `atime`/`noatime`, `sync`/`async`, `dirsync`).
    pub flags: Vec<MountOption>,
    /// How long the kernel caches entries and attributes; `None`: [`DEFAULT_TTL`], or
    /// [`OPEN_CHECKS_TTL`] with `open_checks` (see [`MountOptions::ttl`]). Negative
    /// entries are cached for at most [`crate::freshness::NEGATIVE_TTL`].
    pub ttl: Option<Duration>,
    /// FUSE worker threads.
    pub threads: usize,
    pub view: ViewConfig,
    /// Refuse writes (`-o ro`).
    pub read_only: bool,
    /// Bytes of written chunks held in memory before writers wait for a flush.
    pub write_buffer: u64,
    /// Staged chunks older than this are flushed by a timer.
    pub flush_interval: Duration,
    /// An array with this many bytes of written chunks staged is flushed at once, behind
    /// its writer, on a local disk (`--write-behind`; 0: off). Default
    /// [`DEFAULT_WRITE_BEHIND`].
    pub write_behind: u64,
    /// Inner chunks per shard of arrays created through the mount.
    pub chunks_per_shard: Option<Vec<u64>>,
    pub compactor: CompactorChoice,
    /// Ask the daemon at every open (`-o open_checks`): a change made to the store
    /// outside the mount is then seen at the next open (close-to-open), not up to `ttl`
    /// later, the TTL defaults to [`OPEN_CHECKS_TTL`], and a writable mount hears of
    /// every close (a close commits and reports). Otherwise the kernel opens files
    /// itself: reads cost no request, and writes are committed by
    /// [`crate::view::View::commit_kernel_writes`] (see docs/SEMANTICS.md).
    pub open_checks: bool,
    /// Mount on a directory that holds files (`-o nonempty`), hiding them while mounted.
    pub nonempty: bool,
    /// Object storage: request timeouts, read-ahead memory.
    pub s3: crate::store::object::S3Options,
}

pub use crate::freshness::{DEFAULT_TTL, OPEN_CHECKS_TTL};

/// Staged bytes of one array that start its flush behind the writer: the disk then
/// writes while the writer writes, as the kernel's writeback does for plain files, and a
/// final `fsync` has at most this much left to write. Small enough to overlap most of
/// a 64 MiB shard's writing, large enough that each flush's fixed cost (an index, a
/// record, an `fsync`) stays small against its bytes.
pub const DEFAULT_WRITE_BEHIND: u64 = 16 << 20;

impl MountOptions {
    /// The entry and attribute TTL a mount with these options uses.
    pub fn ttl(&self) -> Duration {
        self.freshness().ttl
    }

    /// How long a mount with these options uses what it learned ([`crate::freshness`]).
    pub fn freshness(&self) -> Freshness {
        Freshness::of(self.ttl, self.read_only, self.open_checks)
    }
}

/// Which compactor packs staged chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CompactorChoice {
    /// The GPU where one is usable and the batch is large enough to gain, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// The GPU; mounting fails without a usable one.
    Gpu,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            allow_other: false,
            flags: Vec::new(),
            ttl: None,
            threads: std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .clamp(2, 16),
            view: ViewConfig::default(),
            read_only: false,
            write_buffer: 256 << 20,
            flush_interval: Duration::from_secs(5),
            write_behind: DEFAULT_WRITE_BEHIND,
            chunks_per_shard: None,
            compactor: CompactorChoice::Auto,
            open_checks: false,
            nonempty: false,
            s3: Default::default(),
        }
    }
}

/// A live mount; unmounts when dropped.
pub struct Mount {
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    view: Arc<View>,
    /// Stops the flush timer when dropped.
    timer: Option<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
    /// The background recovery walk of a writable mount.
    recovery: Option<std::thread::JoinHandle<()>>,
    /// The mount point, canonical, and this mount's device there (`major:minor`), read
    /// once it was live: the path is unmounted only while it still shows this device.
    here: Option<(PathBuf, String)>,
    /// What could not be stored was given up (`daemon::serve`, at a signal): the
    /// unmount does not try once more.
    discard: bool,
}

impl Mount {
    /// Mount the store at `store` on `mountpoint` and return once the mount is live.
    pub fn new(
        store: impl AsRef<Path>,
        mountpoint: impl AsRef<Path>,
        opts: &MountOptions,
    ) -> Result<Mount, MountError> {
        let (store, mountpoint) = (store.as_ref(), mountpoint.as_ref());
        let name = StoreName::of(store);
        let freshness = opts.freshness();
        let s3 = crate::store::object::S3Options {
            meta_ttl: freshness.store_meta,
            ..opts.s3.clone()
        };
        let store = open_store(name, &s3)?;
        check_mountpoint(name, mountpoint, opts.nonempty)?;
        let canonical = std::fs::canonicalize(mountpoint).ok();
        let fsname = match name {
            StoreName::Bucket(url) => PathBuf::from(url),
            StoreName::Local(dir) => std::fs::canonicalize(dir).unwrap_or_else(|_| dir.into()),
        };
        let local = name.local().is_some();
        let writer = make_writer(opts, store.as_ref())?;
        // Every cached shard holds its file open: the cache must fit the fd limit.
        let mut view_config = opts.view.clone();
        view_config.freshness = freshness;
        view_config.max_cached_shards =
            view_config
                .max_cached_shards
                .min(crate::store::limits::cached_shards_within(
                    crate::store::limits::raise_open_files(),
                ));
        let view = Arc::new(View::with_writer(store, view_config, writer).map_err(|e| {
            MountError::Store {
                path: fsname.clone(),
                why: e.to_string(),
            }
        })?);
        let (config, wanted) = fuse_config(opts, &fsname, &view);
        let fs = ShardFs::new(view.clone(), wanted);
        let notifier = fs.notifier_slot();
        let session =
            fuser::spawn_mount(fs, mountpoint, &config).map_err(|source| MountError::Fuse {
                path: mountpoint.to_path_buf(),
                source,
            })?;
        let _ = notifier.set(session.notifier());
        let here = canonical.and_then(|p| Some((crate::mountpoint::device_at(&p).ok()??, p)));
        let here = here.map(|(dev, p)| (p, dev));
        log::info!("mounted {} at {}", fsname.display(), mountpoint.display());
        // Object storage has no half-done commits to recover (a PUT is atomic).
        let recovery = view
            .write_side()
            .filter(|_| local)
            .and_then(|_| recovery_walk(fsname.clone()));
        let timer = view
            .write_side()
            .map(|w| start_timers(&view, w, &session, opts.flush_interval));
        Ok(Mount {
            session: Some(session),
            mountpoint: mountpoint.to_path_buf(),
            view,
            timer,
            recovery,
            here,
            discard: false,
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

    /// Unmount without trying once more to store what could not be stored: a termination
    /// signal gave it up (`daemon::serve`). Whatever is not stored is lost.
    pub(crate) fn unmount_discarding(mut self) -> io::Result<()> {
        self.discard = true;
        self.finish()
    }

    /// Stop the flush timer (its idle flushes and their log lines): the daemon retrying
    /// after an unmount from outside flushes on its own schedule.
    pub(crate) fn stop_timer(&mut self) {
        if let Some((stop, handle)) = self.timer.take() {
            drop(stop);
            if let Some(w) = self.view.write_side() {
                w.wake_write_behind();
            }
            let _ = handle.join();
        }
    }

    /// Whether the mount point still shows this mount. Not so once it was detached
    /// lazily (busy), and maybe mounted anew: that mount is not ours to unmount. Taken as
    /// so where /proc/self/mountinfo could not tell.
    fn still_here(&self) -> bool {
        self.here
            .as_ref()
            .is_none_or(|(path, dev)| match crate::mountpoint::device_at(path) {
                Ok(now) => now.as_ref() == Some(dev),
                Err(_) => true,
            })
    }

    /// Everything staged made durable before the mount goes away, unless discarding.
    fn store_before_unmount(&self) -> io::Result<()> {
        // Everything staged is made durable before the mount goes away (the session's
        // `destroy` flushes again whatever arrives meanwhile), with the writes that came
        // through descriptors the kernel opened (kernel opens), whose closes were not
        // heard of: committed first.
        // Keep the errno's kind (a full store says so), with what failed.
        if self.discard {
            return Ok(());
        }
        let committed = self.view.commit_kernel_writes(KernelCommit::All);
        committed.and(self.view.sync_all()).map_err(|e| {
            io::Error::new(
                io::Error::from_raw_os_error(e.errno()).kind(),
                e.to_string(),
            )
        })
    }

    fn finish(&mut self) -> io::Result<()> {
        self.stop_timer();
        // The walk holds nothing of the session or the view. Let it end (at most the rest
        // of one walk) so that nothing of this mount touches the store after it is gone.
        if let Some(walk) = self.recovery.take()
            && walk.join().is_err()
        {
            log::error!(
                "the recovery walk of {} panicked",
                self.mountpoint.display()
            );
        }
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let flushed = self.store_before_unmount();
        if !session.guard.is_finished() && !self.still_here() {
            // Detached lazily while busy (and maybe the path mounted anew): not unmounted
            // by its path, which would take down whatever is mounted there now. The
            // session is left running: a daemon exits next, which closes its /dev/fuse
            // descriptor and ends it; a program using `Mount` as a library keeps it (a
            // thread and a descriptor) until it exits.
            log::warn!(
                "{}: detached from its path while in use; it ends with this process",
                self.mountpoint.display()
            );
            std::mem::forget(session);
            return flushed;
        }
        if !session.guard.is_finished()
            && let Err(e) = unmount_busy_retry(&self.mountpoint)
        {
            // Last resort, here and not in `Drop`: a second `finish` would find no
            // session and leave a dead mount behind.
            log::error!(
                "unmounting {}: {e}; detaching it lazily",
                self.mountpoint.display()
            );
            let _ = unmount_path(&self.mountpoint, true);
            return Err(e);
        }
        let ended = join_unmounted(session);
        flushed?;
        if self.discard {
            // Not "stored": a signal gave up what could not be stored.
            log::warn!(
                "{}: unmounted; what could not be stored was given up",
                self.mountpoint.display()
            );
            return ended;
        }
        // After a plain umount(8) the daemon still stores what is staged: this line says
        // when the store is whole (reading it directly is safe from here on).
        log::info!(
            "{}: unmounted; everything written through it is stored",
            self.mountpoint.display()
        );
        ended
    }
}

/// The FUSE session of a mount already unmounted (here, or from outside: `shardfs
/// unmount`, umount(8)), its thread joined: what it ended with. Joining or dropping the
/// session would drop its mount handle, and that unmounts the path once more: by then
/// possibly a new mount made at the same path. So only the thread is joined; the handle
/// (a path and the dead /dev/fuse descriptor) is left to process exit.
fn join_unmounted(session: BackgroundSession) -> io::Result<()> {
    let session = std::mem::ManuallyDrop::new(session);
    // SAFETY: `guard` is moved out exactly once and `session` is never dropped, so
    // nothing is dropped twice; the other fields are leaked, not used.
    let guard = unsafe { std::ptr::read(&session.guard) };
    guard
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the FUSE session thread panicked")))
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

/// The FUSE session's configuration, and the open policy the mount asks for (the kernel
/// opens files itself unless `open_checks`).
fn fuse_config(opts: &MountOptions, fsname: &Path, view: &View) -> (Config, OpenPolicy) {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(fsname.display().to_string()),
        // A kernel option (fuser hands `Subtype` only to fusermount): /proc/mounts then
        // shows the type as `fuse.shardfs`.
        MountOption::CUSTOM("subtype=shardfs".into()),
        MountOption::DefaultPermissions,
    ];
    if opts.read_only || view.is_draft() {
        config.mount_options.push(MountOption::RO);
    }
    config.mount_options.extend(opts.flags.iter().cloned());
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    let wanted = if opts.open_checks {
        OpenPolicy::DaemonOpens
    } else {
        OpenPolicy::KernelOpens
    };
    if wanted.kernel_keeps_pages() && !view.is_read_only() {
        // A write or rename drops the kernel's pages of its file from the request's
        // thread; a reader's page it waits for needs another thread to be served.
        config.n_threads = Some(opts.threads.max(2));
    }
    (config, wanted)
}

/// The threads of a writable mount: the kernel cache invalidations its writes ask for
/// (entries on a thread of their own), and the timer that commits idle kernel writes,
/// flushes idle arrays every `interval` and flushes behind writers between its ticks.
/// The sender stops the timer.
fn start_timers(
    view: &Arc<View>,
    w: &Writer,
    session: &BackgroundSession,
    interval: Duration,
) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::channel::<Invalidation>();
    w.set_invalidations(tx);
    let done = w.invalidations_done();
    let dispatched = w.invalidations_dispatched();
    let pending = w.pending_inodes();
    let notifier = session.notifier();
    // Entries on a thread of their own: dropping one waits for its directory's
    // lock, which a request may hold while it waits for inode invalidations
    // queued behind it (`Writer::settle_inode_invalidations`).
    let (entry_tx, entry_rx) = std::sync::mpsc::channel::<(u64, std::ffi::OsString)>();
    let entry_notifier = session.notifier();
    let entry_done = done.clone();
    let entries_done = w.entry_invalidations_done();
    let entries_lost = entries_done.clone();
    std::thread::spawn(move || {
        for (parent, name) in entry_rx {
            // The kernel may not know the entry any more; that is fine.
            let _ = entry_notifier.inval_entry(INodeNo(parent), &name);
            entry_done.bump();
            entries_done.bump();
        }
    });
    std::thread::spawn(move || {
        for i in rx {
            match i {
                Invalidation::Inode(ino) => {
                    // The kernel may not know the inode any more; that is fine.
                    let _ = notifier.inval_inode(INodeNo(ino), 0, 0);
                    pending.done(ino);
                    done.bump();
                }
                Invalidation::Entry { parent, name } => {
                    if entry_tx.send((parent, name)).is_err() {
                        done.bump();
                        entries_lost.bump();
                    }
                }
            }
            dispatched.bump();
        }
    });
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let weak = Arc::downgrade(view);
    let tick = (interval / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    // Between its ticks the thread flushes arrays behind their writers
    // (`View::flush_behind`): `finish` wakes it to stop.
    let handle = std::thread::spawn(move || {
        let mut next_tick = std::time::Instant::now() + tick;
        while let Err(std::sync::mpsc::TryRecvError::Empty) = stop_rx.try_recv() {
            let Some(v) = weak.upgrade() else { return };
            let now = std::time::Instant::now();
            if now < next_tick {
                v.flush_behind(next_tick - now);
                continue;
            }
            let _ = v.commit_kernel_writes(KernelCommit::Idle);
            v.flush_idle(interval);
            next_tick = std::time::Instant::now() + tick;
        }
    });
    (stop_tx, handle)
}

/// The write side of a mount: none for a read-only one. The compactor is chosen (and
/// `gpu` checked) even for a read-only mount, so that a wrong choice is reported where
/// it was made.
///
/// A crash may have left shard updates half done. A writable mount does not look for
/// them before mounting (that walk grows with the store): the view recovers each shard
/// before it reads the shard's index, and a walk once the session is up cleans the rest
/// (`recovery_walk`). A read-only mount changes nothing.
fn make_writer(opts: &MountOptions, store: &dyn Store) -> Result<Option<Writer>, MountError> {
    let compactor = make_compactor(opts.compactor)?;
    if opts.read_only {
        return Ok(None);
    }
    log::info!("compactor: {}", compactor.name());
    if opts.compactor == CompactorChoice::Gpu {
        // Pin the GPU's staging and result memory for a full write buffer now, beside the
        // mount coming up, not in the first large flush.
        let gpu = compactor.clone();
        let bytes = opts.write_buffer;
        let spawned = std::thread::Builder::new()
            .name("shardfs-gpu-reserve".to_owned())
            .spawn(move || gpu.reserve(bytes));
        if let Err(e) = spawned {
            log::warn!("cannot reserve GPU memory ahead ({e}): the first flush will");
        }
    }
    let w = Writer::new(WriteConfig {
        write_buffer: opts.write_buffer,
        chunks_per_shard: opts.chunks_per_shard.clone(),
        shard_target_bytes: 64 << 20,
        compactor,
    });
    // Flushing behind the writer only where a flush appends (a local disk): on object
    // storage each flush of a shard writes the whole shard again.
    if matches!(store.capabilities().commits, Commits::Append(_)) {
        w.set_write_behind(opts.write_behind);
    }
    Ok(Some(w))
}

/// Recover the leftovers of interrupted shard updates anywhere in the store at `root`, on a
/// thread of its own: the mount is live meanwhile, and a shard read before the walk gets
/// to it is recovered by the view first. Both settle a record only under the directory's
/// lock and after looking again, so they never undo each other's work or a live update.
/// `None` (logged) when no thread could be started: reads still recover their shards.
fn recovery_walk(root: PathBuf) -> Option<std::thread::JoinHandle<()>> {
    let spawned = std::thread::Builder::new()
        .name("shardfs-recover".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            match crate::store::local::recover::recover_store(&root) {
                Ok(done) => {
                    for (shard, what) in &done {
                        log::warn!("recovered {}: {what:?}", shard.display());
                    }
                    log::info!(
                        "recovery walk of {}: {} leftovers recovered in {:.3} s",
                        root.display(),
                        done.len(),
                        started.elapsed().as_secs_f64()
                    );
                }
                Err(e) => log::error!(
                    "recovery walk of {}: {e} (shards are still recovered as they are read)",
                    root.display()
                ),
            }
        });
    match spawned {
        Ok(handle) => Some(handle),
        Err(e) => {
            log::error!("cannot start the recovery walk: {e}");
            None
        }
    }
}

fn make_compactor(choice: CompactorChoice) -> Result<Arc<dyn Compactor>, MountError> {
    Ok(match choice {
        CompactorChoice::Cpu => Arc::new(CpuCompactor::new()),
        CompactorChoice::Gpu => {
            Arc::new(GpuCompactor::new().map_err(|e| MountError::NoGpu(e.to_string()))?)
        }
        CompactorChoice::Auto => Arc::new(AutoCompactor::new()),
    })
}
