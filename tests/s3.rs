//! Object storage: `shardfs mount s3://BUCKET/PREFIX` against a real S3 API server on
//! 127.0.0.1 (moto from PyPI, in `.venv`, started and stopped here by
//! `scripts/s3_local.py serve`). moto is served one request at a time: its threaded
//! server checks `If-Match` without a lock, so two racing conditional PUTs could both
//! succeed there, which S3 never allows.
//!
//! Credentials, region and endpoint reach the `shardfs` command through the `AWS_*`
//! environment, as for the AWS CLI.

mod common;
#[path = "s3/endpoints.rs"]
mod endpoints;
#[path = "s3/reads.rs"]
mod reads;
#[path = "s3/writes.rs"]
mod writes;

use common::mount::{CliMount, is_mounted};
use common::repo;

use std::io::{BufRead, BufReader};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Start `cmd` (a server of ours) and wait for its first line, `ready ENDPOINT`.
fn spawn_ready(cmd: &mut Command, what: &str) -> (Child, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let endpoint = line
        .strip_prefix("ready ")
        .unwrap_or_else(|| panic!("{what} did not start: {line:?}"))
        .trim()
        .to_string();
    (child, endpoint)
}

/// One test's S3 world: a moto server with bucket `bucket` and a temporary directory for
/// the test's mount points and local copies. Tests mount through it (`mount_dir`, or the
/// server's `mount`) and hold each mount's `CliMount`, declared after this, so that the
/// mounts are unmounted (also when the test panics) before the server stops and the
/// directory goes. It derefs to its `S3Server`.
struct S3Test {
    server: S3Server,
    tmp: tempfile::TempDir,
}

impl S3Test {
    /// For a test that mounts: `None` where this machine cannot mount or has no venv
    /// (the guards say why).
    fn start() -> Option<S3Test> {
        if !common::can_mount() {
            return None;
        }
        Self::launch(false)
    }

    /// For a test that only runs `shardfs` commands: needs the venv, not FUSE.
    fn start_without_mounts() -> Option<S3Test> {
        Self::launch(false)
    }

    /// As `start`, the server run with `--outage-file` at `outage_file()`: while that
    /// file exists, the server answers no request.
    fn start_with_outage_file() -> Option<S3Test> {
        if !common::can_mount() {
            return None;
        }
        Self::launch(true)
    }

    fn launch(outage_file: bool) -> Option<S3Test> {
        let python = common::venv_python(".venv")?;
        let tmp = tempfile::tempdir().unwrap();
        let outage = tmp.path().join("outage");
        let args = match outage_file {
            true => vec!["--outage-file", outage.to_str().unwrap()],
            false => vec![],
        };
        let server = S3Server::start(&python, &args);
        Some(S3Test { server, tmp })
    }

    fn outage_file(&self) -> PathBuf {
        self.tmp().join("outage")
    }

    /// The test's temporary directory.
    fn tmp(&self) -> &Path {
        self.tmp.path()
    }

    /// A new directory `name` in the test's temporary directory.
    fn dir(&self, name: &str) -> PathBuf {
        let dir = self.tmp().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Fixture store `fixture` (tests/fixtures) uploaded to `to` (`bucket/PREFIX`).
    fn upload_fixture(&self, fixture: &str, to: &str) {
        let from = common::fixtures().join(fixture);
        self.tool(&["upload", "--to", to, from.to_str().unwrap()]);
    }

    /// `url` mounted with `opts` at directory `name` (made if missing) of the test's
    /// temporary directory: the mount point and the mount's guard.
    fn mount_dir(&self, url: &str, name: &str, opts: &[&str]) -> (PathBuf, CliMount) {
        let mnt = self.dir(name);
        let m = self.mount(url, &mnt, opts);
        (mnt, m)
    }
}

impl Deref for S3Test {
    type Target = S3Server;

    fn deref(&self) -> &S3Server {
        &self.server
    }
}

/// A moto S3 server with bucket `bucket`; killed when dropped.
struct S3Server {
    child: Child,
    endpoint: String,
    python: PathBuf,
}

impl S3Server {
    /// `scripts/s3_local.py serve` under `python`, with more arguments `args`
    /// (`--outage-file PATH`).
    fn start(python: &Path, args: &[&str]) -> S3Server {
        let (child, endpoint) = spawn_ready(
            Command::new(python)
                .arg(repo().join("scripts/s3_local.py"))
                .args(["serve", "--bucket", "bucket"])
                .args(args),
            "moto",
        );
        S3Server {
            child,
            endpoint,
            python: python.to_path_buf(),
        }
    }

    /// `scripts/s3_local.py CMD ...` against this server.
    fn tool(&self, args: &[&str]) -> String {
        let out = Command::new(&self.python)
            .arg(repo().join("scripts/s3_local.py"))
            .arg(args[0])
            .args(["--endpoint", &self.endpoint])
            .args(&args[1..])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "s3_local {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `shardfs` with this server's endpoint and dummy credentials in its environment.
    fn shardfs(&self) -> Command {
        self.with_env(Command::new(env!("CARGO_BIN_EXE_shardfs")))
    }

    /// `c` with this server's endpoint and dummy credentials in its environment.
    fn with_env(&self, c: Command) -> Command {
        self.with_env_at(c, &self.endpoint)
    }

    /// `c` with `endpoint` (a proxy in front of this server) and dummy credentials.
    fn with_env_at(&self, mut c: Command, endpoint: &str) -> Command {
        c.env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE");
        c
    }

    fn mount(&self, url: &str, mnt: &Path, opts: &[&str]) -> CliMount {
        self.mount_at(&self.endpoint, url, mnt, opts)
    }

    /// A mount that talks to `endpoint` (a proxy in front of this server).
    fn mount_at(&self, endpoint: &str, url: &str, mnt: &Path, opts: &[&str]) -> CliMount {
        let out = self
            .with_env_at(Command::new(env!("CARGO_BIN_EXE_shardfs")), endpoint)
            .arg("mount")
            .arg(url)
            .arg(mnt)
            .args(opts)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        CliMount::guard(mnt)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `scripts/s3_proxy.py` in front of a server: fails every request as the fault file
/// says while it exists (stall, reset, 503, down); killed when dropped.
struct FaultProxy {
    child: Child,
    endpoint: String,
    fault: PathBuf,
}

impl FaultProxy {
    fn start(to: &S3Server, fault: PathBuf) -> FaultProxy {
        let (child, endpoint) = spawn_ready(
            Command::new(&to.python)
                .arg(repo().join("scripts/s3_proxy.py"))
                .args(["--to", to.endpoint.trim_start_matches("http://")])
                .arg("--fault-file")
                .arg(&fault),
            "the proxy",
        );
        FaultProxy {
            child,
            endpoint,
            fault,
        }
    }

    /// Every request from now on meets `fault`; `None`: none does.
    fn set(&self, fault: Option<&str>) {
        match fault {
            Some(f) => std::fs::write(&self.fault, f).unwrap(),
            None => std::fs::remove_file(&self.fault).unwrap(),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the mount at `mnt` has asked its store (`shardfs stats --json`,
/// `store_requests`).
fn store_requests(mnt: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_shardfs"))
        .args(["stats", "--json"])
        .arg(mnt)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["store_requests"].clone()
}

/// GETs, HEADs and LISTs together.
fn round_trips(requests: &serde_json::Value) -> u64 {
    ["get", "head", "list"]
        .iter()
        .map(|k| requests[k].as_u64().unwrap())
        .sum()
}

/// Write `data` to `path` and fsync it, reporting close errors (FUSE `flush`).
fn write_fsync(path: &Path, data: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

/// The files under `dir` equal those of the unsharded twin (zarr.json as JSON).
fn assert_equals_twin(dir: &Path, twin: &Path) {
    let listed = common::files_under(dir);
    assert_eq!(listed, common::files_under(twin), "listing");
    for rel in &listed {
        let got = std::fs::read(dir.join(rel)).unwrap();
        let want = std::fs::read(twin.join(rel)).unwrap();
        if rel.ends_with("zarr.json") {
            assert_eq!(
                serde_json::from_slice::<serde_json::Value>(&got).unwrap(),
                serde_json::from_slice::<serde_json::Value>(&want).unwrap(),
                "{rel}"
            );
        } else {
            assert_eq!(got, want, "{rel}");
        }
    }
}

/// A bucket prefix mounted read-only shows every chunk as the unsharded twin has it, and
/// `info` reads the store; so does the `mount.fuse3` (fstab) form.
#[test]
fn an_s3_prefix_mounts_and_reads_like_its_unsharded_twin() {
    let Some(s3) = S3Test::start() else { return };
    s3.upload_fixture("zarr_basic", "bucket/data");
    let (mnt, m) = s3.mount_dir("s3://bucket/data", "mnt", &["-o", "ro"]);
    assert_equals_twin(&mnt, &common::fixtures().join("zarr_basic.twin"));
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        mounts.contains("s3://bucket/data"),
        "the store is the fsname"
    );
    m.unmount();
    let out = s3
        .shardfs()
        .args(["info", "s3://bucket/data"])
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && info.contains("u16_default_sparse"),
        "{info}"
    );
    // A prefix with nothing below (mistyped): said, exit 1.
    let out = s3
        .shardfs()
        .args(["info", "s3://bucket/dtaa"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("s3://bucket/dtaa holds no objects"), "{err}");
    // mount.fuse3, as an fstab line `shardfs#s3://bucket/data /mnt fuse ro 0 0` runs it.
    if let Some(helper) = ["/sbin/mount.fuse3", "/usr/sbin/mount.fuse3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    {
        let source = format!("{}#s3://bucket/data", env!("CARGO_BIN_EXE_shardfs"));
        let out = s3
            .with_env(Command::new(helper))
            .arg(&source)
            .arg(&mnt)
            .args(["-o", "ro"])
            .output()
            .unwrap();
        let m = CliMount::guard(&mnt);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(mnt.join("u16_default_sparse/c/0/0").exists());
        m.unmount();
    } else {
        assert!(std::env::var_os("CI").is_none(), "CI installs fuse3");
        println!("SKIPPED the mount.fuse3 form: no mount.fuse3 (apt-get install fuse3)");
    }
}

/// `shardfs verify s3://...` checks every shard through ranged reads: a clean prefix
/// passes, a shard whose index checksum is wrong is named; `--repair` says that it is
/// for local directories; `compact` skips the corrupt shard and says so.
#[test]
fn verify_checks_an_s3_prefix() {
    let Some(s3) = S3Test::start_without_mounts() else {
        return;
    };
    let copy = s3.tmp().join("copy");
    let fixture = common::fixtures().join("zarr_basic");
    let st = Command::new("cp")
        .arg("-r")
        .arg(&fixture)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(st.success());
    s3.tool(&["upload", "--to", "bucket/good", copy.to_str().unwrap()]);
    let shard = copy.join("index_bigendian/c/0/0");
    let mut bytes = std::fs::read(&shard).unwrap();
    *bytes.last_mut().unwrap() ^= 0xff; // the index's crc32c (index at the end)
    std::fs::write(&shard, &bytes).unwrap();
    s3.tool(&["upload", "--to", "bucket/bad", copy.to_str().unwrap()]);
    let verify = |args: &[&str]| {
        let out = s3.shardfs().arg("verify").args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stdout, stderr) = verify(&["--json", "s3://bucket/good"]);
    assert!(ok, "{stdout}{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let local: serde_json::Value = serde_json::from_slice(
        &s3.shardfs()
            .args(["verify", "--json"])
            .arg(&fixture)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(
        report["shards_checked"], local["shards_checked"],
        "{stdout}"
    );
    assert!(report["shards_checked"].as_u64().unwrap() > 10, "{stdout}");
    let (ok, stdout, _) = verify(&["s3://bucket/bad"]);
    assert!(!ok, "a corrupt shard passed: {stdout}");
    assert!(stdout.contains("index_bigendian/c/0/0"), "{stdout}");
    assert_eq!(stdout.matches("index_bigendian/c/").count(), 1, "{stdout}");
    let (ok, _, stderr) = verify(&["--repair", "s3://bucket/bad"]);
    assert!(!ok && stderr.contains("local directory only"), "{stderr}");
    // compact leaves the corrupt shard alone and says so.
    let out = s3
        .shardfs()
        .args(["compact", "--json", "s3://bucket/bad"])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["skipped"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
}

/// `shardfs compact s3://...` rewrites a shard with dead space (here made by a local
/// mount's append, then uploaded) densely with a conditional PUT: the chunks read the same
/// afterwards, `verify` is clean, and a second pass finds nothing to do.
#[test]
fn compact_rewrites_an_s3_shard_with_dead_space() {
    let Some(s3) = S3Test::start() else { return };
    let local = s3.tmp().join("local");
    let st = Command::new("cp")
        .arg("-r")
        .arg(common::fixtures().join("zarr_basic"))
        .arg(&local)
        .status()
        .unwrap();
    assert!(st.success());
    let mnt = s3.dir("mnt");
    let shard = local.join("u16_default_sparse/c/0/0");
    let before = std::fs::metadata(&shard).unwrap().len();
    let m = s3.mount(local.to_str().unwrap(), &mnt, &[]);
    let chunk = mnt.join("u16_default_sparse/c/0/0");
    let len = std::fs::read(&chunk).unwrap().len();
    write_fsync(&chunk, &vec![5u8; len]);
    m.unmount();
    assert!(
        std::fs::metadata(&shard).unwrap().len() > before,
        "the local store appended"
    );
    s3.tool(&["upload", "--to", "bucket/dead", local.to_str().unwrap()]);
    let compact = || -> serde_json::Value {
        let out = s3
            .shardfs()
            .args([
                "compact",
                "--json",
                "--min-garbage",
                "0",
                "s3://bucket/dead",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let first = compact();
    assert!(first["shards_rewritten"].as_u64().unwrap() >= 1, "{first}");
    assert!(first["bytes_reclaimed"].as_u64().unwrap() > 0, "{first}");
    let second = compact();
    assert_eq!(second["shards_rewritten"], 0, "{second}");
    let out = s3
        .shardfs()
        .args(["verify", "s3://bucket/dead"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The compacted prefix reads as the local store does.
    let (a, ma) = s3.mount_dir("s3://bucket/dead", "a", &["-o", "ro"]);
    let (b, mb) = s3.mount_dir(local.to_str().unwrap(), "b", &["-o", "ro"]);
    assert_equals_twin(&a, &b);
    assert_eq!(
        std::fs::read(a.join("u16_default_sparse/c/0/0")).unwrap(),
        vec![5u8; len]
    );
    ma.unmount();
    mb.unmount();
}
