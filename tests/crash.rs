//! Crash safety: write through a mount with fsync while the daemon is killed (`kill -9`)
//! at random moments; after each crash, remount and check that every chunk whose fsync
//! returned is there, byte for byte, and that `verify` finds nothing wrong.
//!
//! Cycles: `SHARDFS_CRASH_CYCLES` (default 4, what CI runs); `scripts/crash-loop` runs
//! many more.

mod common;

use common::Lcg;
use common::mount::{is_mounted, shardfs, wait_until_mounted};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SIDE: u64 = 64; // chunks per side: 4096 chunks, each written at most once

/// Kills the daemon and detaches its mount even when an assertion fails.
struct Daemon {
    child: std::process::Child,
    mnt: PathBuf,
}
impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if is_mounted(&self.mnt) {
            let _ = shardfs::mount::unmount_path(&self.mnt, true);
        }
    }
}

fn start(store: &Path, mnt: &Path) -> Daemon {
    let child = shardfs()
        .args([
            "mount",
            "--foreground",
            "--flush-interval",
            "0.05",
            "--write-buffer",
            "1",
            "--chunks-per-shard",
            "16,16",
        ])
        .arg(store)
        .arg(mnt)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let d = Daemon {
        child,
        mnt: mnt.to_path_buf(),
    };
    wait_until_mounted(mnt, Duration::from_secs(20));
    d
}

fn chunk_bytes(n: u64, cycle: u64) -> Vec<u8> {
    // 16 uint8 values; varied sizes are not needed, varied content is.
    (0..16)
        .map(|i| (n.wrapping_mul(31) ^ (cycle << 4) ^ i) as u8)
        .collect()
}

#[test]
fn kill_9_at_random_moments_loses_nothing_acknowledged() {
    if !common::can_mount() {
        return;
    }
    let cycles: u64 = std::env::var("SHARDFS_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let mnt = tmp.path().join("mnt");
    fs::create_dir_all(&store).unwrap();
    fs::create_dir_all(&mnt).unwrap();
    fs::write(
        store.join("zarr.json"),
        br#"{"zarr_format": 3, "node_type": "group"}"#,
    )
    .unwrap();
    {
        // The array is created through the mount (stored sharded, 16x16 chunks per shard).
        let _d = start(&store, &mnt);
        fs::create_dir(mnt.join("a")).unwrap();
        let meta = format!(
            r#"{{"zarr_format": 3, "node_type": "array", "shape": [{s}, {s}], "data_type": "uint8",
            "chunk_grid": {{"name": "regular", "configuration": {{"chunk_shape": [4, 4]}}}},
            "chunk_key_encoding": {{"name": "default"}}, "fill_value": 0, "codecs": [{{"name": "bytes"}}]}}"#,
            s = SIDE * 4
        );
        let f = fs::File::create(mnt.join("a/zarr.json")).unwrap();
        std::io::Write::write_all(&mut &f, meta.as_bytes()).unwrap();
        f.sync_all().unwrap();
        drop(f);
        shardfs().arg("unmount").arg(&mnt).status().unwrap();
    }
    let acked: Arc<Mutex<BTreeMap<u64, Vec<u8>>>> = Arc::default();
    let mut rng = Lcg(0x5eed ^ std::process::id() as u64);
    let mut next_chunk = 0u64;
    let mut kills_mid_write = 0;
    for cycle in 0..cycles {
        let mut daemon = start(&store, &mnt);
        let stop = Arc::new(AtomicBool::new(false));
        let first = next_chunk;
        let writer = {
            let (mnt, acked, stop) = (mnt.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = first;
                while !stop.load(Ordering::Relaxed) && n < SIDE * SIDE {
                    let (y, x) = (n / SIDE, n % SIDE);
                    let dir = mnt.join(format!("a/c/{y}"));
                    let data = chunk_bytes(n, cycle);
                    let ok = fs::create_dir_all(&dir)
                        .and_then(|_| fs::write(dir.join(format!("{x}.partial")), &data))
                        .and_then(|_| {
                            fs::rename(dir.join(format!("{x}.partial")), dir.join(x.to_string()))
                        })
                        .and_then(|_| fs::File::open(dir.join(x.to_string()))?.sync_all());
                    n += 1;
                    if ok.is_err() {
                        break; // the daemon is gone
                    }
                    acked.lock().unwrap().insert(n - 1, data);
                }
                n
            })
        };
        std::thread::sleep(Duration::from_millis(20 + rng.next() % 300));
        // SAFETY: kill(2) on the daemon's pid, a child of this process.
        unsafe { libc::kill(daemon.child.id() as i32, libc::SIGKILL) };
        let _ = daemon.child.wait();
        stop.store(true, Ordering::Relaxed);
        next_chunk = writer.join().unwrap();
        if next_chunk > first + 1 {
            kills_mid_write += 1;
        }
        drop(daemon); // detaches the dead mount

        // Remount (a shard is recovered before it is read; the walk, awaited by the
        // unmount, recovers the rest) and check every acknowledged chunk.
        let check = tempfile::tempdir().unwrap();
        let m =
            shardfs::Mount::new(&store, check.path(), &shardfs::MountOptions::default()).unwrap();
        for (n, want) in acked.lock().unwrap().iter() {
            let (y, x) = (n / SIDE, n % SIDE);
            let got = fs::read(check.path().join(format!("a/c/{y}/{x}")));
            assert_eq!(
                got.as_ref().ok(),
                Some(want),
                "cycle {cycle}: acknowledged chunk {y}/{x} lost: {got:?}"
            );
        }
        m.unmount().unwrap();
        let report = shardfs::maint::verify(&store, false, false).unwrap();
        assert!(
            report.problems.is_empty(),
            "cycle {cycle}: verify found {:?}",
            report.problems
        );
        println!(
            "cycle {cycle}: {} chunks acknowledged so far, verify clean",
            acked.lock().unwrap().len()
        );
    }
    assert!(
        kills_mid_write > 0,
        "no kill landed while writing: the test tested nothing"
    );
    assert!(!acked.lock().unwrap().is_empty());
}
