//! `mount`'s flags and `-o` option lists made into [`MountOptions`]: each option checked
//! and applied, a later kernel flag winning over an earlier conflicting one, an unknown
//! option refused with the nearest known one. Not the argument definitions
//! ([`super::args`]).

use std::path::PathBuf;
use std::time::Duration;

use fuser::MountOption;

use super::args::{CompactorArg, MountArgs};
use crate::mount::{CompactorChoice, MountOptions};
use crate::view::ViewFormat;

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
