//! The command line: argument definitions, the `mount.fuse3` calling form, and `-o`
//! option lists. Parsing only; `main.rs` acts on the result.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fuser::MountOption;

use crate::mount::{CompactorChoice, MountOptions};
use crate::view::ViewFormat;

#[derive(Debug, Parser)]
#[command(
    name = "shardfs",
    version,
    about = "Mount a sharded Zarr v3 store and see it unsharded: one file per inner chunk.",
    after_help = "Also callable as mount.fuse3 calls helpers: shardfs STORE MOUNTPOINT -o OPTS\n\
                  (so `mount -t fuse.shardfs STORE DIR -o ro` and /etc/fstab lines work).\n\
                  Logging: RUST_LOG=debug|info|warn|error."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mount STORE at MOUNTPOINT; returns once the mount is live and serves in the background.
    Mount(Box<MountArgs>),
    /// Unmount a shardfs mount.
    Unmount {
        /// Where the store is mounted.
        mountpoint: PathBuf,
        /// Detach now even if the mount is busy (it goes away when no longer used), and
        /// even if what it holds cannot be stored: that is then given up.
        #[arg(long, short = 'z')]
        lazy: bool,
    },
    /// Show every array of a store: shapes, codecs, shards, stored chunks, bytes; and the
    /// bcolz rootdirs and bloscpack files the mount shows as Zarr arrays.
    Info {
        /// The store: a directory with a Zarr v3 hierarchy (or the 2022 draft layout), or
        /// s3://BUCKET/PREFIX.
        store: PathBuf,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Check every shard: index decodes, checksums match, chunks lie inside the file and
    /// overlap neither each other nor the index. Exits non-zero listing each problem.
    Verify {
        /// The store: a directory with a Zarr v3 hierarchy, or s3://BUCKET/PREFIX.
        store: PathBuf,
        /// Recover interrupted updates and cut torn tails back to the last complete state
        /// (local directories: object storage has no half-done updates).
        #[arg(long)]
        repair: bool,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Rewrite shards whose dead space (overwritten or deleted chunks) exceeds a ratio.
    Compact {
        /// The store: a directory with a Zarr v3 hierarchy (unmounted, or mounted
        /// read-only), or s3://BUCKET/PREFIX (mounted or not: a shard is replaced only if
        /// it did not change meanwhile).
        store: PathBuf,
        /// Rewrite shards with more than this fraction of dead bytes.
        #[arg(long, default_value_t = 0.25, value_name = "RATIO")]
        min_garbage: f64,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Counters of a live mount: chunks and bytes read, index cache hits, chunks staged
    /// and flushed, compaction and flush time.
    Stats {
        /// Where a store is mounted.
        mountpoint: PathBuf,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Build a sample sharded store, mount it, read and check every chunk, unmount.
    Demo,
}

#[derive(Debug, Args, Clone)]
pub struct MountArgs {
    /// The store: a directory with a Zarr v3 hierarchy (bcolz rootdirs and *.blp
    /// bloscpack files in it are shown read-only as Zarr arrays), or object storage
    /// (s3://BUCKET/PREFIX; credentials, region and endpoint from the AWS_* environment, as
    /// for the AWS CLI; AWS_ALLOW_HTTP=true for a plain-http endpoint).
    pub store: PathBuf,
    /// An existing empty directory.
    pub mountpoint: PathBuf,
    /// Mount options, comma-separated: ro, rw, format=v2|v3, open_checks, kernel_opens, nonempty,
    /// s3_timeout=SECS, s3_cache=MIB, cache=DIR, cache_size=MIB, write_behind=MIB, allow_other, dev, nodev, suid, nosuid, exec, noexec, atime, noatime, sync, async, dirsync;
    /// _netdev, nofail, auto, noauto, user(s), defaults and x-* are ignored.
    #[arg(short = 'o', value_name = "OPTS")]
    pub options: Vec<String>,
    /// Stay attached to the terminal; Ctrl-C unmounts.
    #[arg(short = 'f', long)]
    pub foreground: bool,
    /// Let other users use the mount (root, or user_allow_other in /etc/fuse.conf).
    #[arg(long)]
    pub allow_other: bool,
    /// Mount read-only (as `-o ro`).
    #[arg(long)]
    pub read_only: bool,
    /// Memory for written chunks before writers wait for a flush, in MiB.
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub write_buffer: u64,
    /// Staged chunks are flushed to their shards after this many idle seconds.
    #[arg(long, default_value_t = 5.0, value_name = "SECS")]
    pub flush_interval: f64,
    /// An array with this many MiB of written chunks waiting is flushed at once, while its
    /// writer goes on (local stores; 0: only when idle, at fsync, unmount or a full
    /// buffer; also `-o write_behind=MIB`).
    #[arg(long, default_value_t = 16, value_name = "MIB")]
    pub write_behind: u64,
    /// Inner chunks per shard, per dimension, of arrays created through the mount
    /// (default: shards of about 64 MiB of uncompressed inner chunks).
    #[arg(long, value_name = "N,N,...", value_delimiter = ',')]
    pub chunks_per_shard: Option<Vec<u64>>,
    /// Which compactor packs staged chunks into shard order.
    #[arg(long, value_enum, default_value_t = CompactorArg::Auto)]
    pub compactor: CompactorArg,
    /// Which Zarr version the mount shows: v3 (`zarr.json`) or v2 (`.zarray`, `.zattrs`,
    /// `.zgroup`, v2 chunk keys) for tools that speak only Zarr v2 (also `-o format=v2`).
    #[arg(long, value_enum, default_value_t = FormatArg::V3)]
    pub format: FormatArg,
    /// Write the daemon's log here, also with --foreground (level info; otherwise a
    /// daemonized mount logs warnings and errors to the system log, /dev/log, and says at
    /// mount when there is none; `RUST_LOG` sets the level).
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// Seconds the kernel may cache entries and attributes [default: 10, or 1 with
    /// --open-checks]. This is also how long a change made to the store outside the mount
    /// may go unseen (with --open-checks: until the next open). A file added outside the
    /// mount is seen within 1 s.
    #[arg(long, value_name = "SECS")]
    pub ttl: Option<f64>,
    /// Ask the daemon at every open (also `-o open_checks`): a change made to the store
    /// outside the mount is seen at the next open (close-to-open, as NFS), the TTL is 1 s
    /// unless given, and on a writable mount every close is heard of: a close commits
    /// what was written through its descriptor and returns a refusal (EINVAL) or failure
    /// of that commit. By default the kernel opens files itself, several times faster
    /// for many small chunks: changes made outside the mount are seen within --ttl, and
    /// what is written is committed at fsync, before a rename or link, at unmount, or 1 s
    /// after its last write (errors no request waits for are only logged), metadata at
    /// the write that completes it. See docs/SEMANTICS.md.
    #[arg(long)]
    pub open_checks: bool,
    /// The default since the kernel opens files itself on every mount unless
    /// --open-checks; accepted (also `-o kernel_opens`) for command lines and fstab
    /// entries that name it.
    #[arg(long, hide = true, conflicts_with = "open_checks")]
    pub kernel_opens: bool,
    /// Object storage (`s3://`): how long an operation (a lookup, an open, a read, an
    /// fsync) waits for an answer, its retries and an answer that never comes included,
    /// before it gives up with EIO (also `-o s3_timeout=SECS`); while the endpoint is
    /// known not to answer, 1 s more at most. A chunk whose commit gave up stays staged
    /// and is tried again at the next flush.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    pub s3_timeout: f64,
    /// Object storage (`s3://`): memory, in MiB, that all open shards together may hold
    /// read ahead (the rest of a shard once a second chunk of it is read, windows while
    /// reads go forward), half of it at most for the next shards loaded ahead of such a
    /// reader (also `-o s3_cache=MIB`). A cold read of one chunk fetches only that chunk.
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub s3_cache: u64,
    /// Object storage (`s3://`): a local directory that keeps the bytes read, under each
    /// object's ETag, for this mount and later ones (also `-o cache=DIR`; made if
    /// missing; mounts may share one). A shard replaced in the bucket has another ETag:
    /// its old bytes are never served for it.
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// The most the --cache directory may hold, in MiB (also `-o cache_size=MIB`); the
    /// least recently used objects go first. Nothing is kept while its disk has less
    /// than 5% (at least 1 GiB) free.
    #[arg(long, default_value_t = 10240, value_name = "MIB")]
    pub cache_size: u64,
    /// FUSE worker threads (default: the number of CPUs, 2 to 16; on object storage
    /// (`s3://`) at least 32: each thread waits for its request's round trip, so the
    /// threads are the requests in flight).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Internal: the daemon reports readiness on this descriptor.
    #[arg(long, hide = true)]
    pub notify_fd: Option<i32>,
}

/// `--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    V3,
    V2,
}

impl From<FormatArg> for ViewFormat {
    fn from(f: FormatArg) -> ViewFormat {
        match f {
            FormatArg::V3 => ViewFormat::V3,
            FormatArg::V2 => ViewFormat::V2,
        }
    }
}

/// `--compactor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompactorArg {
    /// Whichever way measured faster (a calibration after the first large flush brings
    /// up the GPU, where usable). A flush's CPU way copies nothing, so it has won on
    /// every machine measured.
    Auto,
    Cpu,
    /// The GPU; the mount fails without a usable one.
    Gpu,
}

const SUBCOMMANDS: [&str; 9] = [
    "mount", "unmount", "info", "demo", "help", "umount", "verify", "compact", "stats",
];

/// Rewrite the `mount.fuse3` calling form `shardfs STORE DIR -o OPTS` into
/// `shardfs mount STORE DIR -o OPTS`, and drop the legacy `shardfs#` source prefix.
pub fn normalize_args(args: Vec<OsString>) -> Vec<OsString> {
    let mut args = args;
    if args.get(1).and_then(|a| a.to_str()) == Some("umount") {
        args[1] = "unmount".into();
    }
    let first = args.get(1).and_then(|a| a.to_str()).unwrap_or("-");
    if !first.starts_with('-') && !SUBCOMMANDS.contains(&first) && args.len() >= 3 {
        args.insert(1, "mount".into());
    }
    let legacy_source = args
        .get(2)
        .and_then(|a| a.to_str())
        .and_then(|s| s.strip_prefix("shardfs#"))
        .map(OsString::from);
    if let (Some(src), Some("mount")) = (legacy_source, args.get(1).and_then(|a| a.to_str())) {
        args[2] = src;
    }
    args
}

/// `secs` as a duration, if it is a positive number.
fn positive_secs(option: &str, secs: f64) -> Result<Duration, String> {
    if secs.is_finite() && secs > 0.0 {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err(format!(
            "{option} {secs} is not a positive number of seconds"
        ))
    }
}

/// The least FUSE threads of a mount of object storage without `--threads`: a FUSE
/// thread is held by its request for a round trip (10-30 ms on S3), so 2 threads (a
/// 2-core machine's default) let 16 readers have 2 GETs in flight; `--threads 16` read a
/// 4-shard array 2.8 times as fast at 30 ms (issue 34). Idle threads cost a stack each.
pub const OBJECT_STORE_THREADS: usize = 32;

/// The mount options shardfs takes (`-o`), as the error for an unknown one lists them.
const MOUNT_OPTIONS: &[&str] = &[
    "ro",
    "rw",
    "format=v2",
    "format=v3",
    "open_checks",
    "kernel_opens",
    "nonempty",
    "s3_timeout=SECS",
    "s3_cache=MIB",
    "cache=DIR",
    "cache_size=MIB",
    "write_behind=MIB",
    "allow_other",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "atime",
    "noatime",
    "sync",
    "async",
    "dirsync",
];

/// The error for an unknown `-o` option: the nearest known one, if one is near, and
/// the list.
fn unknown_option(given: &str) -> String {
    let key = |o: &str| o.split('=').next().unwrap_or(o).to_ascii_lowercase();
    let g = key(given);
    let near = match g.as_str() {
        "readonly" | "read_only" | "read-only" => Some("ro"),
        "readwrite" | "read_write" | "read-write" => Some("rw"),
        // `s3_timout=3` against `s3_timeout`; `format_v2` against `format=v2`.
        _ => MOUNT_OPTIONS
            .iter()
            .filter_map(|o| {
                let (d, len) = if o.chars().any(|c| c.is_ascii_uppercase()) {
                    (edit_distance(&g, &key(o)), key(o).len())
                } else {
                    (edit_distance(&given.to_ascii_lowercase(), o), o.len())
                };
                (d <= (len / 3).max(1)).then_some((d, *o))
            })
            .min()
            .map(|(_, o)| o),
    };
    let hint = near.map_or(String::new(), |o| format!(" (did you mean {o:?}?)"));
    format!(
        "unknown mount option {given:?}{hint}; the options are: {}; fstab's own \
         (defaults, _netdev, nofail, auto, noauto, user, users, x-*) are accepted and ignored",
        MOUNT_OPTIONS.join(", ")
    )
}

/// Levenshtein distance, for [`unknown_option`]'s suggestion.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            let next = (row[j] + 1).min(row[j + 1] + 1).min(prev + cost);
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// Turn the arguments into mount options. Errors name the offending option.
pub fn mount_options(args: &MountArgs) -> Result<MountOptions, String> {
    let mut opts = MountOptions {
        allow_other: args.allow_other,
        read_only: args.read_only,
        write_buffer: args.write_buffer.saturating_mul(1 << 20),
        write_behind: args.write_behind.saturating_mul(1 << 20),
        chunks_per_shard: args.chunks_per_shard.clone(),
        compactor: match args.compactor {
            CompactorArg::Auto => CompactorChoice::Auto,
            CompactorArg::Cpu => CompactorChoice::Cpu,
            CompactorArg::Gpu => CompactorChoice::Gpu,
        },
        open_checks: args.open_checks,
        ..MountOptions::default()
    };
    opts.view.format = args.format.into();
    if !(args.flush_interval.is_finite() && args.flush_interval > 0.0) {
        return Err(format!(
            "--flush-interval {} is not a positive number of seconds",
            args.flush_interval
        ));
    }
    opts.flush_interval = Duration::from_secs_f64(args.flush_interval);
    if args
        .chunks_per_shard
        .as_ref()
        .is_some_and(|c| c.contains(&0))
    {
        return Err("--chunks-per-shard needs positive numbers".into());
    }
    opts.s3.timeout = positive_secs("--s3-timeout", args.s3_timeout)?;
    opts.s3.read_ahead = args.s3_cache.saturating_mul(1 << 20);
    if let Some(ttl) = args.ttl {
        if !(ttl.is_finite() && ttl >= 0.0) {
            return Err(format!("--ttl {ttl} is not a number of seconds"));
        }
        opts.ttl = Some(Duration::from_secs_f64(ttl));
    }
    match args.threads {
        Some(t) => opts.threads = t.max(1),
        None if crate::mount::StoreName::of(&args.store).url().is_some() => {
            opts.threads = opts.threads.max(OBJECT_STORE_THREADS);
        }
        None => {}
    }
    let mut more = Unflagged {
        kernel_opens: args.kernel_opens,
        cache: args.cache.clone(),
        cache_size: args.cache_size,
    };
    for opt in args
        .options
        .iter()
        .flat_map(|o| o.split(','))
        .map(str::trim)
    {
        if let Some(flag) = mount_option(opt, &mut opts, &mut more)? {
            // A later option wins over an earlier conflicting one, as with mount(8).
            opts.flags.retain(|f| !conflicts(f, &flag));
            opts.flags.push(flag);
        }
    }
    let Unflagged {
        kernel_opens,
        cache,
        cache_size,
    } = more;
    if opts.open_checks && kernel_opens {
        return Err("open_checks and kernel_opens say the opposite: give one".into());
    }
    if let Some(dir) = cache {
        // Absolute: the daemon does not run where the command was typed.
        let dir =
            std::path::absolute(&dir).map_err(|e| format!("--cache {}: {e}", dir.display()))?;
        opts.s3.cache = Some((dir, cache_size.saturating_mul(1 << 20)));
    }
    Ok(opts)
}

/// What `-o` options set beyond [`MountOptions`], settled once all are read.
struct Unflagged {
    kernel_opens: bool,
    cache: Option<PathBuf>,
    cache_size: u64,
}

/// Apply one `-o` option to `opts` (and `more`); the kernel mount flag it stands for, if
/// it is one. Options of fstab that mean nothing to a FUSE mount are taken and ignored.
fn mount_option(
    opt: &str,
    opts: &mut MountOptions,
    more: &mut Unflagged,
) -> Result<Option<MountOption>, String> {
    let flag = match opt {
        "ro" => {
            opts.read_only = true;
            return Ok(None);
        }
        "rw" => {
            opts.read_only = false;
            return Ok(None);
        }
        "open_checks" => {
            opts.open_checks = true;
            return Ok(None);
        }
        "kernel_opens" => {
            more.kernel_opens = true;
            return Ok(None);
        }
        "nonempty" => {
            opts.nonempty = true;
            return Ok(None);
        }
        o if o.starts_with("s3_timeout=") => {
            let v = &o["s3_timeout=".len()..];
            let secs = v
                .parse::<f64>()
                .map_err(|_| format!("-o {o}: {v:?} is not a number of seconds"))?;
            opts.s3.timeout = positive_secs("-o s3_timeout", secs)?;
            return Ok(None);
        }
        o if o.starts_with("write_behind=") => {
            let v = &o["write_behind=".len()..];
            let mib = v
                .parse::<u64>()
                .map_err(|_| format!("-o {o}: {v:?} is not a number of MiB"))?;
            opts.write_behind = mib.saturating_mul(1 << 20);
            return Ok(None);
        }
        o if o.starts_with("cache=") => {
            more.cache = Some(PathBuf::from(&o["cache=".len()..]));
            return Ok(None);
        }
        o if o.starts_with("cache_size=") => {
            let v = &o["cache_size=".len()..];
            more.cache_size = v
                .parse::<u64>()
                .map_err(|_| format!("-o {o}: {v:?} is not a number of MiB"))?;
            return Ok(None);
        }
        o if o.starts_with("s3_cache=") => {
            let v = &o["s3_cache=".len()..];
            let mib = v
                .parse::<u64>()
                .map_err(|_| format!("-o {o}: {v:?} is not a number of MiB"))?;
            opts.s3.read_ahead = mib.saturating_mul(1 << 20);
            return Ok(None);
        }
        "format=v2" => {
            opts.view.format = ViewFormat::V2;
            return Ok(None);
        }
        "format=v3" => {
            opts.view.format = ViewFormat::V3;
            return Ok(None);
        }
        other if other.starts_with("format=") => {
            return Err(format!(
                "unknown format {:?} in -o {other}: the views are format=v3 (the default) and format=v2",
                &other["format=".len()..]
            ));
        }
        ""
        | "defaults"
        | "_netdev"
        | "nofail"
        | "auto"
        | "noauto"
        | "user"
        | "users"
        | "nouser"
        | "owner"
        | "relatime"
        | "norelatime"
        | "strictatime"
        | "lazytime"
        | "default_permissions" => return Ok(None),
        o if o.starts_with("x-") || o.starts_with("comment=") => return Ok(None),
        "allow_other" | "allow_root" => {
            opts.allow_other = true;
            return Ok(None);
        }
        "dev" => MountOption::Dev,
        "nodev" => MountOption::NoDev,
        "suid" => MountOption::Suid,
        "nosuid" => MountOption::NoSuid,
        "exec" => MountOption::Exec,
        "noexec" => MountOption::NoExec,
        "atime" => MountOption::Atime,
        "noatime" => MountOption::NoAtime,
        "sync" => MountOption::Sync,
        "async" => MountOption::Async,
        "dirsync" => MountOption::DirSync,
        other => return Err(unknown_option(other)),
    };
    Ok(Some(flag))
}

fn conflicts(a: &MountOption, b: &MountOption) -> bool {
    use MountOption::*;
    let pair = |x: &MountOption| match x {
        Dev | NoDev => 1,
        Suid | NoSuid => 2,
        Exec | NoExec => 3,
        Atime | NoAtime => 4,
        Sync | Async => 5,
        _ => 0,
    };
    a == b || (pair(a) != 0 && pair(a) == pair(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(normalize_args(args.iter().map(OsString::from).collect())).unwrap()
    }

    fn mount_args(cli: Cli) -> MountArgs {
        match cli.command {
            Command::Mount(m) => *m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn mount_fuse3_calling_form_is_a_mount() {
        let m = mount_args(parse(&[
            "shardfs",
            "shardfs#/data/s.zarr",
            "/mnt/s",
            "-o",
            "ro,nofail,_netdev,x-systemd.automount,nodev",
        ]));
        assert_eq!(m.store, PathBuf::from("/data/s.zarr"));
        assert_eq!(m.mountpoint, PathBuf::from("/mnt/s"));
        let opts = mount_options(&m).unwrap();
        assert_eq!(opts.flags, vec![MountOption::NoDev]);
        assert!(!m.foreground);
    }

    /// Object storage gets enough FUSE threads for requests in flight; `--threads` wins.
    #[test]
    fn object_storage_mounts_get_threads_for_requests_in_flight() {
        let threads = |args: &[&str]| mount_options(&mount_args(parse(args))).unwrap().threads;
        assert!(threads(&["shardfs", "mount", "s3://b/p", "/m"]) >= OBJECT_STORE_THREADS);
        assert_eq!(
            threads(&["shardfs", "mount", "s3://b/p", "/m", "--threads", "3"]),
            3
        );
        assert!(threads(&["shardfs", "mount", "/data/s.zarr", "/m"]) <= 16);
    }

    #[test]
    fn subcommands_and_options() {
        let m = mount_args(parse(&[
            "shardfs",
            "mount",
            "a",
            "b",
            "-o",
            "allow_other,dev",
            "-o",
            "nodev,noexec",
            "-f",
        ]));
        assert!(m.foreground);
        let opts = mount_options(&m).unwrap();
        assert!(opts.allow_other);
        assert_eq!(opts.flags, vec![MountOption::NoDev, MountOption::NoExec]);
        assert!(matches!(
            parse(&["shardfs", "umount", "/mnt"]).command,
            Command::Unmount { .. }
        ));
        assert!(matches!(
            parse(&["shardfs", "info", "s", "--json"]).command,
            Command::Info { json: true, .. }
        ));
        assert!(matches!(parse(&["shardfs", "demo"]).command, Command::Demo));
    }

    #[test]
    fn the_s3_timeout_is_an_option_in_both_forms() {
        let secs = |args: &[&str]| mount_options(&mount_args(parse(args))).map(|o| o.s3.timeout);
        assert_eq!(
            secs(&["shardfs", "mount", "a", "b"]).unwrap(),
            crate::store::object::DEFAULT_TIMEOUT
        );
        assert_eq!(
            secs(&["shardfs", "mount", "a", "b", "-o", "ro,s3_timeout=2.5"]).unwrap(),
            Duration::from_millis(2500)
        );
        assert_eq!(
            secs(&["shardfs", "mount", "a", "b", "--s3-timeout", "4"]).unwrap(),
            Duration::from_secs(4)
        );
        assert!(secs(&["shardfs", "mount", "a", "b", "-o", "s3_timeout=x"]).is_err());
        assert!(secs(&["shardfs", "mount", "a", "b", "--s3-timeout", "0"]).is_err());
        let cache =
            |args: &[&str]| mount_options(&mount_args(parse(args))).map(|o| o.s3.read_ahead);
        assert_eq!(cache(&["shardfs", "mount", "a", "b"]).unwrap(), 256 << 20);
        assert_eq!(
            cache(&["shardfs", "mount", "a", "b", "-o", "s3_cache=8"]).unwrap(),
            8 << 20
        );
        assert_eq!(
            cache(&["shardfs", "mount", "a", "b", "--s3-cache", "0"]).unwrap(),
            0
        );
    }

    #[test]
    fn write_behind_is_an_option_in_both_forms() {
        let mib = |args: &[&str]| mount_options(&mount_args(parse(args))).map(|o| o.write_behind);
        assert_eq!(
            mib(&["shardfs", "mount", "a", "b"]).unwrap(),
            crate::mount::DEFAULT_WRITE_BEHIND
        );
        assert_eq!(
            mib(&["shardfs", "mount", "a", "b", "-o", "write_behind=4"]).unwrap(),
            4 << 20
        );
        assert_eq!(
            mib(&["shardfs", "mount", "a", "b", "--write-behind", "0"]).unwrap(),
            0
        );
        assert!(mib(&["shardfs", "mount", "a", "b", "-o", "write_behind=x"]).is_err());
    }

    #[test]
    fn unknown_options_are_refused_by_name() {
        let m = mount_args(parse(&["shardfs", "mount", "a", "b", "-o", "ro,bogus"]));
        let err = mount_options(&m).unwrap_err();
        assert!(err.starts_with("unknown mount option \"bogus\"; "), "{err}");
        assert!(err.contains("the options are: ro, rw, format=v2"), "{err}");
        // The nearest, where one is near.
        for (typo, meant) in [
            ("nosiud", "nosuid"),
            ("readonly", "ro"),
            ("format_v2", "format=v2"),
            ("s3_timout=3", "s3_timeout=SECS"),
            ("allowother", "allow_other"),
        ] {
            let m = mount_args(parse(&["shardfs", "mount", "a", "b", "-o", typo]));
            let err = mount_options(&m).unwrap_err();
            assert!(
                err.contains(&format!("(did you mean {meant:?}?)")),
                "{typo}: {err}"
            );
        }
        let m = mount_args(parse(&["shardfs", "mount", "a", "b", "--ttl=NaN"]));
        assert!(mount_options(&m).is_err());
    }

    #[test]
    fn open_checks_cache_shorter_unless_told() {
        use crate::mount::{DEFAULT_TTL, OPEN_CHECKS_TTL};
        let ttl = |args: &[&str]| mount_options(&mount_args(parse(args))).unwrap().ttl();
        assert_eq!(ttl(&["shardfs", "mount", "a", "b"]), DEFAULT_TTL);
        assert_eq!(
            ttl(&["shardfs", "mount", "a", "b", "-o", "ro"]),
            DEFAULT_TTL
        );
        assert_eq!(
            ttl(&["shardfs", "mount", "a", "b", "-o", "ro", "--ttl", "2"]),
            Duration::from_secs(2)
        );
        assert_eq!(
            ttl(&["shardfs", "mount", "a", "b", "-o", "ro,open_checks"]),
            OPEN_CHECKS_TTL
        );
        assert_eq!(
            ttl(&[
                "shardfs",
                "mount",
                "a",
                "b",
                "--open-checks",
                "--ttl",
                "0.5"
            ]),
            Duration::from_millis(500)
        );
    }
}
