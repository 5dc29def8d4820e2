//! Running a mount as a daemon: detaching from the terminal with a readiness report back
//! to the parent, and serving until unmounted or signalled.
//!
//! `shardfs mount` re-executes itself with `--foreground --notify-fd N` in a new session;
//! the child mounts and writes `ok` (or the error) to the pipe; the parent prints the
//! error or exits 0 once the mount is live. Re-executing rather than `fork()`ing keeps the
//! daemon free of a forked copy of a multi-threaded process.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::mount::Mount;

/// Start the daemon (this program with `args` plus `--notify-fd`) and wait until it
/// reports the mount live (`Ok`, with the notes it has for whoever mounted) or failed
/// (`Err` with its message).
pub fn spawn_daemon(
    args: &[OsString],
    log_file: Option<&Path>,
) -> io::Result<Result<Vec<String>, String>> {
    let (read_end, write_end) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    // The child must inherit the write end: clear close-on-exec on it alone.
    rustix::io::fcntl_setfd(&write_end, rustix::io::FdFlags::empty())?;
    let write_fd = std::os::fd::AsRawFd::as_raw_fd(&write_end);
    let stderr = match log_file {
        Some(p) => Stdio::from(File::options().create(true).append(true).open(p)?),
        None => Stdio::null(),
    };
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(&args[1..])
        .arg("--foreground")
        .arg("--notify-fd")
        .arg(write_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    // SAFETY: setsid() is async-signal-safe and touches no memory of the parent; it
    // detaches the daemon from the terminal's session so hang-ups do not reach it.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    drop(write_end);
    let mut msg = String::new();
    File::from(read_end).read_to_string(&mut msg)?;
    let msg = msg.trim();
    let mut lines = msg.lines();
    if lines.next() == Some("ok") {
        return Ok(Ok(lines
            .filter_map(|l| l.strip_prefix("note: "))
            .map(str::to_string)
            .collect()));
    }
    let status = child.wait()?;
    Ok(Err(if msg.is_empty() {
        format!("the daemon exited before mounting ({status})")
    } else {
        msg.to_string()
    }))
}

/// Report readiness (or failure) to the parent on `fd`, then close it: `ok`, then a
/// line `note: ...` per note for whoever mounted, or the error.
pub fn notify(fd: Option<i32>, msg: &str) {
    if let Some(fd) = fd {
        // SAFETY: the parent passed this descriptor for exactly this use and nothing else
        // in the daemon owns it; it is closed when the File drops.
        let mut f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let _ = f.write_all(msg.as_bytes());
    }
}

/// Block the termination signals in this thread (and the threads it spawns afterwards),
/// so that [`serve`] can wait for them.
pub fn block_signals() {
    // SAFETY: plain libc calls on a local, initialised signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Serve until the mount is unmounted from outside or a termination signal arrives
/// (then unmount). Returns the signal, if one ended it.
pub fn serve(mut mount: Mount) -> io::Result<Option<i32>> {
    let tick = Duration::from_millis(200);
    loop {
        if mount.is_finished() {
            mount.stop_timer();
            return match store_before_exit(&mount) {
                // Given up at a signal: the unmount does not try once more (on an
                // object store, another wait for the timeout).
                Some(sig) => {
                    mount.unmount_discarding()?;
                    Ok(Some(sig))
                }
                None => mount.unmount().map(|()| None),
            };
        }
        if let Some(sig) = wait_for_signal(tick) {
            log::info!("signal {sig}: unmounting {}", mount.mountpoint().display());
            mount.unmount()?;
            return Ok(Some(sig));
        }
    }
}

/// How long a daemon whose mount was unmounted from outside (`umount`, `fusermount3 -u`)
/// goes on trying to store what it still holds, when the store cannot take it.
const STORE_BEFORE_EXIT: Duration = Duration::from_secs(3600);

/// The mount was unmounted from outside, with no `shardfs unmount` to refuse while the
/// store cannot take what it holds (a full disk, a lost connection): the chunks staged
/// and the files kept in memory are the only copy. The daemon stays, trying again (every
/// second at first, then every 30 s) until they are stored, for an hour at most, or until
/// a termination signal (`shardfs unmount --lazy` sends one) gives them up; each outcome
/// is logged. Before, the daemon tried twice within a moment and exited, and what it
/// held was lost with only a log line. The signal, if one came.
fn store_before_exit(mount: &Mount) -> Option<i32> {
    let view = mount.view();
    let until = std::time::Instant::now() + STORE_BEFORE_EXIT;
    let mut wait = Duration::from_secs(1);
    let mut said = false;
    loop {
        let stored = view
            .commit_kernel_writes(crate::view::KernelCommit::All)
            .and(view.sync_all());
        let e = match stored {
            Ok(()) => {
                if said {
                    log::warn!(
                        "{}: what the mount held is stored now",
                        mount.mountpoint().display()
                    );
                }
                return None;
            }
            // A shard that cannot be read (corrupt) stays so: not waited for.
            Err(crate::view::ViewError::Shard { .. }) => return None,
            Err(e) if retried(e.errno()) && std::time::Instant::now() < until => e,
            Err(e) => {
                if said {
                    log::error!(
                        "{}: what it holds could not be stored within {:?} ({e}): given up",
                        mount.mountpoint().display(),
                        STORE_BEFORE_EXIT
                    );
                }
                // Named again by the unmount that follows.
                return None;
            }
        };
        if !said {
            log::error!(
                "{}: unmounted, but what it holds cannot be stored ({e}): trying again \
                 until it is, for an hour at most (SIGTERM gives it up: it is then lost)",
                mount.mountpoint().display()
            );
            said = true;
        }
        if let Some(sig) = wait_for_signal(wait) {
            log::error!(
                "{}: signal {sig}: what was not stored is given up ({e})",
                mount.mountpoint().display()
            );
            return Some(sig);
        }
        wait = (wait * 2).min(Duration::from_secs(30));
    }
}

/// Errors that may pass: the store's room, its connection, its disk.
fn retried(errno: i32) -> bool {
    [
        libc::ENOSPC,
        libc::EDQUOT,
        libc::EIO,
        libc::EROFS,
        libc::EAGAIN,
        libc::ETIMEDOUT,
        libc::ECONNREFUSED,
        libc::ECONNRESET,
        libc::ENETUNREACH,
        libc::EHOSTUNREACH,
    ]
    .contains(&errno)
}

/// Wait up to `limit` for a termination signal (blocked by [`block_signals`]).
fn wait_for_signal(limit: Duration) -> Option<i32> {
    // SAFETY: sigtimedwait on a local, initialised set; the info struct is written by the
    // kernel and unused.
    let sig = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        let ts = libc::timespec {
            tv_sec: limit.as_secs() as libc::time_t,
            tv_nsec: limit.subsec_nanos() as i64,
        };
        libc::sigtimedwait(&set, std::ptr::null_mut(), &ts)
    };
    (sig > 0).then_some(sig)
}

/// Where a daemonized mount without `--log-file` logs: the system log, as mountpoint-s3
/// does (RFC 3164 datagrams to `/dev/log`, facility daemon; journald reads them too).
/// `SHARDFS_SYSLOG_SOCKET` names another socket (tests). `None` when there is no system
/// log to reach.
pub fn syslog_writer() -> Option<SyslogWriter> {
    let path = std::env::var_os("SHARDFS_SYSLOG_SOCKET").unwrap_or_else(|| "/dev/log".into());
    let socket = std::os::unix::net::UnixDatagram::unbound().ok()?;
    socket.connect(&path).ok()?;
    Some(SyslogWriter { socket })
}

/// One log record per write, sent as one datagram.
pub struct SyslogWriter {
    socket: std::os::unix::net::UnixDatagram,
}

impl std::io::Write for SyslogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // A log line must never fail or block the daemon: a full or gone log is ignored.
        let _ = self.socket.send(buf.strip_suffix(b"\n").unwrap_or(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The syslog priority of a record of `level` (facility daemon, 3).
pub fn syslog_priority(level: log::Level) -> u8 {
    let severity = match level {
        log::Level::Error => 3,
        log::Level::Warn => 4,
        log::Level::Info => 6,
        log::Level::Debug | log::Level::Trace => 7,
    };
    3 * 8 + severity
}
