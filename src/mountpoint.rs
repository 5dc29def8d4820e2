//! The mount point and its daemon: whether a path is a mount point, which shardfs
//! daemons serve it, waiting for them to exit, and unmounting (`shardfs unmount`, and
//! [`crate::Mount`]'s drop).

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Whether `path` (canonical) is the mount point of a mount of this process's namespace.
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|p| Path::new(&unescape_mount_path(p)) == path)
}

/// The device (`major:minor`, as /proc/self/mountinfo writes it) of the topmost mount at
/// `path` (canonical), if any. A mount records its own at mount time: a path that shows
/// another device later is no longer its mount (detached lazily, then mounted anew), and
/// is not unmounted by it.
pub fn device_at(path: &Path) -> io::Result<Option<String>> {
    // As bytes: a mount point anywhere whose name is no UTF-8 must not make this fail.
    let info = std::fs::read("/proc/self/mountinfo")?;
    Ok(device_in(&String::from_utf8_lossy(&info), path))
}

/// [`device_at`] in the text of a mountinfo file. Mounts are listed in the order they
/// were made: the last one at a path is on top.
fn device_in(info: &str, path: &Path) -> Option<String> {
    info.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let dev = f.nth(2)?;
        let at = f.nth(1)?;
        (Path::new(&unescape_mount_path(at)) == path).then(|| dev.to_string())
    })
}

/// /proc/self/mountinfo writes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mount_path(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(digits) = std::str::from_utf8(&b[i + 1..i + 4])
            && let Ok(v) = u8::from_str_radix(digits, 8)
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmount `path`, waiting out a moment of `EBUSY`: a `fork` in another thread of this
/// process (a test suite running a subprocess) holds copies of every open descriptor,
/// files of this mount too, until its `exec` closes them. That made unmounts in the test
/// suites fail about one run in fifteen.
pub(crate) fn unmount_busy_retry(path: &Path) -> io::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        match unmount_path(path, false) {
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// The shardfs daemons (`shardfs mount ... --foreground`, as `shardfs mount` starts them)
/// serving `mountpoint` (absolute), found in /proc: `shardfs unmount` waits for them to
/// exit, so that a new mount at the same path is never taken down by the old daemon.
pub fn daemon_pids(mountpoint: &Path) -> Vec<u32> {
    let lexical = |p: &Path| -> PathBuf { p.components().collect() };
    let want = [
        lexical(mountpoint),
        std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf()),
    ];
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let is_daemon = args.first().is_some_and(|a| a.ends_with(b"shardfs"))
            && args.iter().any(|a| *a == b"--foreground")
            && args.iter().any(|a| *a == b"mount");
        if !is_daemon {
            continue;
        }
        let cwd = std::fs::read_link(e.path().join("cwd")).unwrap_or_default();
        let serves = args.iter().any(|a| {
            let p = Path::new(std::ffi::OsStr::from_bytes(a));
            want.contains(&lexical(&cwd.join(p)))
        });
        if serves {
            out.push(pid);
        }
    }
    out
}

/// Whether process `pid` is still running: it exists and is not a zombie (a daemon
/// started as a child of the program that unmounts it stays a zombie until that program
/// reaps it, which it may do only after `shardfs unmount` returns).
fn process_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')' (comm may hold any bytes).
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_none_or(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// Wait up to `limit` for processes `pids` to exit; whether they all did.
pub fn wait_for_exit(pids: &[u32], limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let alive = pids.iter().any(|&pid| process_running(pid));
        if !alive {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
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

#[cfg(test)]
mod mountpoint_tests {
    use super::*;

    #[test]
    fn the_device_at_a_path_is_its_topmost_mounts() {
        let info = "22 1 0:21 / /proc rw - proc proc rw\n\
                    36 25 0:40 / /tmp/a\\040b rw - fuse.shardfs /s rw\n\
                    37 25 0:41 / /tmp/c rw - fuse.shardfs /s rw\n\
                    38 36 0:42 / /tmp/a\\040b rw - fuse.shardfs /t rw\n";
        assert_eq!(
            device_in(info, Path::new("/tmp/a b")).as_deref(),
            Some("0:42")
        );
        assert_eq!(
            device_in(info, Path::new("/tmp/c")).as_deref(),
            Some("0:41")
        );
        assert_eq!(device_in(info, Path::new("/tmp/d")), None);
    }

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mount_path(r"/a\040b\011c"), "/a b\tc");
        assert_eq!(unescape_mount_path(r"/x\"), r"/x\");
        assert_eq!(unescape_mount_path("/é\\134"), "/é\\");
    }

    /// `shardfs unmount` waits for the daemon to exit; a daemon that is the child of the
    /// program unmounting it is a zombie until reaped, and counts as exited (it used to
    /// hold every such unmount for the whole 30 s limit).
    #[test]
    fn a_zombie_has_exited_and_a_sleeper_has_not() {
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut quick = std::process::Command::new("true").spawn().unwrap();
        let started = std::time::Instant::now();
        // `true` exits at once and stays a zombie: nothing reaps it before the wait.
        assert!(wait_for_exit(&[quick.id()], Duration::from_secs(10)));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(process_running(sleeper.id()));
        assert!(!wait_for_exit(&[sleeper.id()], Duration::from_millis(100)));
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        quick.wait().unwrap();
        assert!(!process_running(sleeper.id()));
    }
}
