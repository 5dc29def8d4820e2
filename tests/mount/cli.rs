//! The command line: `shardfs mount` (daemonized, in the foreground, in fstab's and
//! mount.fuse3's calling forms), `unmount` (also `--lazy`), `info`, `demo`, and what
//! they say when something fails.

use super::*;

#[test]
fn cli_mount_daemonizes_and_unmount_ends_it() {
    if !common::can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    let mount = CliMount::logged(
        &common::fixtures().join("zarr_keys"),
        &mnt,
        &dir.path().join("log"),
        &[],
    );
    assert!(is_mounted(&mnt), "live when mount returns");
    assert!(mnt.join("v2_dot/zarr.json").exists());
    let log = mount.unmount().log;
    assert!(!is_mounted(&mnt));
    assert!(
        log.contains("mounted"),
        "the daemon logs to --log-file: {log}"
    );
}

/// A daemonized mount with no system log to reach and no `--log-file` says at mount
/// that its log goes nowhere; with `--log-file` it says nothing of it.
#[test]
fn cli_mount_says_when_its_log_goes_nowhere() {
    if !common::can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    for log_file in [false, true] {
        let mut cmd = shardfs();
        cmd.args([
            "mount",
            common::fixtures().join("zarr_keys").to_str().unwrap(),
        ])
        .arg(&mnt)
        .env("SHARDFS_SYSLOG_SOCKET", dir.path().join("no-such-socket"));
        if log_file {
            cmd.arg("--log-file").arg(dir.path().join("log"));
        }
        let out = cmd.output().unwrap();
        let _guard = CliMount::guard(&mnt);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert_eq!(err.contains("no system log"), !log_file, "{err}");
        assert!(
            shardfs()
                .arg("unmount")
                .arg(&mnt)
                .status()
                .unwrap()
                .success()
        );
    }
    // A mount that fails says why, and nothing of the log (issue 37: the note came
    // first, before the real error).
    std::fs::write(mnt.join("file"), b"x").unwrap(); // not empty: refused
    let out = shardfs()
        .args([
            "mount",
            common::fixtures().join("zarr_keys").to_str().unwrap(),
        ])
        .arg(&mnt)
        .env("SHARDFS_SYSLOG_SOCKET", dir.path().join("no-such-socket"))
        .output()
        .unwrap();
    let _guard = CliMount::guard(&mnt);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(!err.contains("no system log"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// `--log-file` is where the log goes in the foreground too (it went to stderr).
#[test]
fn cli_foreground_mount_logs_to_its_log_file() {
    if !common::can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mount = CliMount::logged_in_foreground(
        &common::fixtures().join("zarr_keys"),
        &dir.path().join("mnt"),
        &dir.path().join("log"),
        &[],
    );
    let unmounted = mount.unmount();
    let log = unmounted.log;
    assert!(log.contains("mounted"), "the log file: {log}");
    // The line that says the store is whole after an unmount (a plain umount returns
    // before the daemon has stored what is staged).
    assert!(
        log.contains("unmounted; everything written through it is stored"),
        "the log file: {log}"
    );
    let stderr = unmounted.foreground_stderr;
    assert!(!stderr.contains("mounted"), "stderr: {stderr}");
}

/// Daemons serving `mnt` (`shardfs mount ... MNT` processes).
fn daemons_of(mnt: &Path) -> Vec<u32> {
    let needle = mnt.as_os_str().as_encoded_bytes();
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        if args.contains(&b"mount".as_slice()) && args.contains(&needle) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn cli_remount_at_the_same_path_outlives_the_old_daemon() {
    if !common::can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mount = || CliMount::new(&common::fixtures().join("zarr_keys"), &mnt, &["-o", "ro"]);
    let first = mount();
    let old = daemons_of(&mnt);
    assert_eq!(old.len(), 1, "one daemon: {old:?}");
    first.unmount();
    // Mount again at once: the old daemon is still exiting.
    let again = mount();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while daemons_of(&mnt).contains(&old[0]) {
        assert!(
            std::time::Instant::now() < deadline,
            "the old daemon never exited"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        is_mounted(&mnt),
        "the old daemon took the new mount down as it exited"
    );
    assert!(mnt.join("v2_dot/zarr.json").exists());
    again.unmount();
}

/// A busy mount detached with `shardfs unmount --lazy` lives on (its daemon serves the
/// files still open) while a new mount takes its path. When the old daemon ends (a
/// signal: `--lazy` sends one when what it held could not be stored), it must not
/// unmount the path, which is the new mount's now. It did: `Mount::finish` unmounted by
/// path whenever its own session had not ended.
#[test]
fn a_lazily_detached_mount_ending_leaves_the_next_mount_at_its_path() {
    if !common::can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mount = || CliMount::new(&common::fixtures().join("zarr_keys"), &mnt, &["-o", "ro"]);
    let _first = mount();
    let old = daemons_of(&mnt);
    assert_eq!(old.len(), 1, "one daemon: {old:?}");
    let held = std::fs::File::open(mnt.join("v2_dot/zarr.json")).unwrap();
    let out = shardfs()
        .args(["unmount", "--lazy"])
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&mnt), "detached from its path");
    let again = mount();
    assert!(is_mounted(&mnt));
    // The old daemon still serves the open file; a signal ends it.
    // SAFETY: kill(2) of the daemon this test started.
    unsafe { libc::kill(old[0] as libc::pid_t, libc::SIGTERM) };
    assert!(
        shardfs::mount::wait_for_exit(&old, std::time::Duration::from_secs(60)),
        "the old daemon exits at SIGTERM"
    );
    drop(held);
    assert!(
        is_mounted(&mnt),
        "the old daemon, ending, took down the new mount at its path"
    );
    assert!(mnt.join("v2_dot/zarr.json").exists());
    again.unmount();
}

#[test]
fn cli_mount_fuse3_calling_form_with_generic_options() {
    if !common::can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = common::fixtures().join("zarr_mixed");
    let out = shardfs()
        .arg(&store)
        .arg(dir.path())
        .args([
            "-o",
            "ro,nodev,nosuid,noexec,_netdev,nofail,x-systemd.automount",
        ])
        .output()
        .unwrap();
    let _guard = CliMount::guard(dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(dir.path().to_str().unwrap()))
        .map(str::to_string)
        .expect("mounted");
    // fsname is the store; the type is fuse.shardfs (the subtype is a kernel option).
    assert_eq!(
        line.split(' ').next(),
        store.canonicalize().unwrap().to_str(),
        "{line}"
    );
    assert_eq!(line.split(' ').nth(2), Some("fuse.shardfs"), "{line}");
    for flag in ["ro", "nodev", "nosuid", "noexec"] {
        assert!(
            line.split(' ')
                .nth(3)
                .unwrap()
                .split(',')
                .any(|f| f == flag),
            "{flag} in {line}"
        );
    }
    assert!(dir.path().join("grp/sub/f32_nan/zarr.json").exists());
    assert!(
        shardfs()
            .arg("unmount")
            .arg(dir.path())
            .status()
            .unwrap()
            .success()
    );
}

#[test]
fn cli_mount_failures_are_clear_and_nonzero() {
    let dir = tempfile::tempdir().unwrap();
    let out = shardfs()
        .args(["mount", "/nonexistent/store"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/store"));
    let out = shardfs()
        .args(["mount"])
        .arg(common::fixtures().join("zarr_basic"))
        .arg(dir.path().join("missing"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("missing"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = shardfs()
        .args(["mount", "-o", "bogus"])
        .arg(common::fixtures().join("zarr_basic"))
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus"));
}

/// A store name that is not a directory says why once, in words, and one that looks
/// like a URL says which URLs are stores (issue 37: the reason came twice, and `s3:/x`
/// or `http://...` read as missing local paths).
#[test]
fn a_store_that_cannot_be_opened_says_why_once() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("garbage.bin");
    std::fs::write(&file, b"not a store").unwrap();
    let said = |store: &std::path::Path| -> String {
        let out = shardfs().arg("info").arg(store).output().unwrap();
        assert!(!out.status.success(), "{}", store.display());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = said(&file);
    assert!(err.contains("not a directory"), "{err}");
    assert_eq!(err.matches("garbage.bin").count(), 1, "{err}");
    for url in ["s3:/typo/x", "http://example.org/x"] {
        let err = said(std::path::Path::new(url));
        assert!(
            err.contains("only") || err.contains("s3://BUCKET/PREFIX"),
            "{err}"
        );
        assert!(err.contains("not an object storage URL"), "{err}");
    }
    let err = said(&tmp.path().join("nothere"));
    assert!(err.contains("no such directory"), "{err}");
}

#[test]
fn cli_info_reports_arrays_as_json() {
    let info = |fixture: &str| -> serde_json::Value {
        let out = shardfs()
            .arg("info")
            .arg(common::fixtures().join(fixture))
            .arg("--json")
            .output()
            .unwrap();
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = info("zarr_nested");
    let a = &v.as_array().unwrap()[0];
    assert_eq!(a["path"], "nested_3d");
    assert_eq!(a["status"], "sharded");
    assert_eq!(a["inner_chunk_shape"], serde_json::json!([2, 2, 2]));
    assert_eq!(a["nesting_levels"], 2);
    let entry = common::manifest()
        .into_iter()
        .find(|e| e["store"] == "zarr_nested")
        .unwrap();
    assert_eq!(
        a["stored_chunks"].as_u64().unwrap() as usize,
        entry["chunk_keys"].as_array().unwrap().len()
    );
    assert_eq!(
        a["shards"].as_u64().unwrap() as usize,
        entry["shard_keys"].as_array().unwrap().len()
    );
    // An unsharded array: its chunk files, counted and summed.
    let v = info("zarr_mixed");
    let a = v
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["path"] == "plain_u8")
        .unwrap();
    assert_eq!(a["status"], "plain");
    let dir = common::fixtures().join("zarr_mixed/plain_u8");
    let files: Vec<u64> = common::files_under(&dir)
        .iter()
        .filter(|f| f.starts_with("c/"))
        .map(|f| std::fs::metadata(dir.join(f)).unwrap().len())
        .collect();
    assert!(!files.is_empty());
    assert_eq!(
        a["stored_chunks"].as_u64().unwrap() as usize,
        files.len(),
        "{a}"
    );
    assert_eq!(
        a["bytes"].as_u64().unwrap(),
        files.iter().sum::<u64>(),
        "{a}"
    );
}

#[test]
fn cli_demo_passes() {
    if !common::can_mount() {
        return;
    }
    let out = shardfs().arg("demo").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("demo passed"));
}

#[test]
fn compactor_gpu_without_a_gpu_fails_at_mount_time() {
    let dir = tempfile::tempdir().unwrap();
    let out = shardfs()
        .args(["mount", "--compactor", "gpu"])
        .arg(common::fixtures().join("zarr_basic"))
        .arg(dir.path())
        .args(["-o", "ro"])
        .output()
        .unwrap();
    let _guard = CliMount::guard(dir.path());
    match shardfs::compact::GpuCompactor::available() {
        Err(why) => {
            println!("no GPU here ({why}): checking the refusal");
            assert!(!out.status.success());
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("GPU") || err.contains("gpu"), "{err}");
        }
        Ok(()) => {
            println!("a GPU is present: --compactor gpu must mount");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                shardfs()
                    .arg("unmount")
                    .arg(dir.path())
                    .status()
                    .unwrap()
                    .success()
            );
        }
    }
}

#[test]
fn mount_fuse3_helper_mounts_shardfs() {
    if !common::can_mount() {
        return;
    }
    let helper = ["/sbin/mount.fuse3", "/usr/sbin/mount.fuse3"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(helper) = helper else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs fuse3 (scripts/setup-system)"
        );
        common::skipped("no mount.fuse3 (apt-get install fuse3)");
        return;
    };
    // What `mount -t fuse.shardfs STORE DIR -o ...` and an fstab line run, with the
    // program named by path instead of looked up on PATH.
    let dir = tempfile::tempdir().unwrap();
    let source = format!(
        "{}#{}",
        env!("CARGO_BIN_EXE_shardfs"),
        common::fixtures().join("zarr_basic").display()
    );
    let out = Command::new(helper)
        .arg(&source)
        .arg(dir.path())
        .args(["-o", "ro,nofail,_netdev,x-systemd.automount"])
        .output()
        .unwrap();
    let _guard = CliMount::guard(dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(is_mounted(dir.path()));
    assert!(dir.path().join("u16_default_sparse/c/0/0").exists());
    assert!(
        shardfs()
            .arg("unmount")
            .arg(dir.path())
            .status()
            .unwrap()
            .success()
    );
    assert!(!is_mounted(dir.path()));
}
