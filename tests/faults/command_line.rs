//! Mount points and the command line: a mount point that would hang, stack or hide
//! files is refused, by the library and by `shardfs mount`; the command line says what
//! is wrong, and `shardfs unmount` returns once the daemon has exited; a daemonized
//! mount logs its warnings to the system log.

use super::*;

#[test]
fn mount_points_that_would_hang_stack_or_hide_are_refused() {
    if !common::can_mount() {
        return;
    }
    let tmp = common::store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let opts = MountOptions::default();
    let refused = |mnt: &Path, opts: &MountOptions, what: &str| {
        let err = match Mount::new(&store, mnt, opts) {
            Ok(_) => panic!("{what}: mounted"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(what), "{err}");
    };
    // Inside the store: the first `ls` used to hang in D state.
    fs::create_dir(store.join("mnt")).unwrap();
    refused(&store.join("mnt"), &opts, "inside the store");
    // The store inside the mount point.
    refused(tmp.path(), &opts, "lies inside it");
    // Not empty: refused, unless asked for.
    let full = tempfile::tempdir().unwrap();
    fs::write(full.path().join("keep"), b"mine").unwrap();
    refused(full.path(), &opts, "not empty");
    let allowed = MountOptions {
        nonempty: true,
        ..MountOptions::default()
    };
    let m = Mount::new(&store, full.path(), &allowed).unwrap();
    drop(m);
    assert_eq!(fs::read(full.path().join("keep")).unwrap(), b"mine");
    // Already a mount point: a second mount would stack on it.
    let mnt = tempfile::tempdir().unwrap();
    let first = Mount::new(&store, mnt.path(), &opts).unwrap();
    refused(mnt.path(), &opts, "already a mount point");
    refused(mnt.path(), &allowed, "already a mount point");
    drop(first);
    // The command line says the same, and fails.
    let out = shardfs()
        .arg("mount")
        .arg(&store)
        .arg(store.join("mnt"))
        .output()
        .unwrap();
    let _guard = CliMount::guard(&store.join("mnt"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("inside the store"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_command_line_says_what_is_wrong_and_unmount_waits_for_the_daemon() {
    if !common::can_mount() {
        return;
    }
    let shardfs = |args: &[&std::ffi::OsStr]| {
        let out = common::mount::shardfs().args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let tmp = common::store_copy("zarr_basic");
    let store = tmp.path().join("s");
    let mnt = tempfile::tempdir().unwrap();
    let _guard = CliMount::guard(mnt.path());
    let (m, s) = (mnt.path().as_os_str(), store.as_os_str());
    let (ok, err) = shardfs(&["unmount".as_ref(), m]);
    assert!(!ok && err.contains("nothing is mounted at"), "{err}");
    let missing = tmp.path().join("nowhere");
    let (ok, err) = shardfs(&["unmount".as_ref(), missing.as_os_str()]);
    assert!(!ok && err.contains("no such directory"), "{err}");
    let (ok, err) = shardfs(&["mount".as_ref(), s, m, "-o".as_ref(), "format=v4".as_ref()]);
    assert!(
        !ok && err.contains("format=v3") && err.contains("format=v2"),
        "{err}"
    );

    let (ok, err) = shardfs(&["mount".as_ref(), s, m]);
    assert!(ok, "{err}");
    let daemons = shardfs::mount::daemon_pids(mnt.path());
    assert_eq!(daemons.len(), 1, "the daemon serving the mount is found");
    let held = fs::File::open(mnt.path().join("u16_default_sparse")).unwrap();
    let (ok, err) = shardfs(&["unmount".as_ref(), m]);
    assert!(
        !ok && err.contains("busy") && err.contains("--lazy"),
        "{err}"
    );
    drop(held);
    let (ok, err) = shardfs(&["unmount".as_ref(), m]);
    assert!(ok, "{err}");
    // `unmount` returned after the daemon exited: gone, or a zombie its parent (here
    // PID 1, the daemon detached itself) has not reaped yet.
    for pid in daemons {
        let state = fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')')?.1.trim_start().chars().next());
        assert!(
            matches!(state, None | Some('Z' | 'X')),
            "daemon {pid} still running (state {state:?})"
        );
    }

    // A directory with files but no Zarr metadata: mounted, with a warning.
    let plain = tempfile::tempdir().unwrap();
    fs::write(plain.path().join("notes.txt"), b"x").unwrap();
    let mnt2 = tempfile::tempdir().unwrap();
    let _guard2 = CliMount::guard(mnt2.path());
    let (ok, err) = shardfs(&[
        "mount".as_ref(),
        plain.path().as_os_str(),
        mnt2.path().as_os_str(),
    ]);
    assert!(ok && err.contains("is it a Zarr store"), "{err}");
    let (ok, err) = shardfs(&["unmount".as_ref(), mnt2.path().as_os_str()]);
    assert!(ok, "{err}");
}

#[test]
fn a_daemonized_mount_logs_warnings_to_the_system_log() {
    if !common::can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log_socket = dir.path().join("log");
    let log = std::os::unix::net::UnixDatagram::bind(&log_socket).unwrap();
    log.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // A store with files but no Zarr metadata: the daemon warns about it.
    let plain = tempfile::tempdir().unwrap();
    fs::write(plain.path().join("notes.txt"), b"x").unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let st = shardfs()
        .arg("mount")
        .arg(plain.path())
        .arg(mnt.path())
        .env("SHARDFS_SYSLOG_SOCKET", &log_socket)
        .env_remove("RUST_LOG")
        .status()
        .unwrap();
    let mount = CliMount::guard(mnt.path());
    assert!(st.success());
    let mut buf = [0u8; 4096];
    let got = log.recv(&mut buf);
    mount.unmount();
    let n = got.expect("a datagram on the system log socket");
    let line = String::from_utf8_lossy(&buf[..n]);
    // Facility daemon (3), severity warning (4): <28>.
    assert!(line.starts_with("<28>shardfs["), "{line}");
    assert!(line.contains("is it a Zarr store"), "{line}");
}
