//! The command line's argument definitions: subcommands and `mount`'s flags, as clap
//! derives them (long by nature: one field per flag, its help text beside it). Not the
//! `mount.fuse3` calling form ([`super::normalize_args`]) nor `-o` lists
//! ([`super::options`]).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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
