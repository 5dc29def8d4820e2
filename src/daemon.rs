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
pub fn serve(mount: Mount) -> io::Result<Option<i32>> {
    let tick = Duration::from_millis(200);
    loop {
        if mount.is_finished() {
            mount.unmount()?;
            return Ok(None);
        }
        // SAFETY: sigtimedwait on a local, initialised set; the info struct is written by
        // the kernel and unused.
        let sig = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: tick.as_nanos() as i64,
            };
            libc::sigtimedwait(&set, std::ptr::null_mut(), &ts)
        };
        if sig > 0 {
            log::info!("signal {sig}: unmounting {}", mount.mountpoint().display());
            mount.unmount()?;
            return Ok(Some(sig));
        }
    }
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
