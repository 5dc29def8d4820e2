//! The `shardfs` command: parse, build a validated configuration, run. Filesystem logic
//! lives in the library.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;
use shardfs::cli::{self, Cli, Command, MountArgs};
use shardfs::{daemon, info, mount};

fn main() -> ExitCode {
    let args = cli::normalize_args(std::env::args_os().collect());
    let cli = Cli::parse_from(&args);
    match run(cli, &args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("shardfs: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(default: &str) {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format_timestamp_millis()
        .init();
}

/// A daemonized mount without `--log-file`: warnings and errors (`RUST_LOG` changes
/// that) to the system log; stderr (nowhere) if there is none.
fn init_syslog(default: &str) {
    use std::io::Write;
    let Some(w) = daemon::syslog_writer() else {
        return init_logging(default);
    };
    let pid = std::process::id();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format(move |buf, record| {
            let pri = daemon::syslog_priority(record.level());
            writeln!(buf, "<{pri}>shardfs[{pid}]: {}", record.args())
        })
        .target(env_logger::Target::Pipe(Box::new(w)))
        .init();
}

/// A live mount's counters, from its stats file.
fn stats_of(mountpoint: &std::path::Path) -> Option<serde_json::Value> {
    let bytes = std::fs::read(mountpoint.join(shardfs::view::STATS_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// What a mount refused to store with no request waiting to hear it (written with the
/// kernel opening files: committed when idle), and metadata written but not yet a whole
/// document (the unmount will refuse it), from its stats file: one line each.
fn refusals(mountpoint: &std::path::Path) -> Vec<String> {
    let Some(v) = stats_of(mountpoint) else {
        return Vec::new();
    };
    let mut out: Vec<String> = v["refused"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            format!(
                "what was written to {} was refused ({}): the store keeps what it had",
                r["path"].as_str().unwrap_or("?"),
                r["why"].as_str().unwrap_or("?")
            )
        })
        .collect();
    // Held for commit and not finished: the unmount refuses them.
    for (key, what) in [
        (
            "pending_metadata",
            "is not a whole JSON document: the unmount refuses it, and the store keeps \
             the document it had",
        ),
        (
            "pending_chunks",
            "is not a length its array's chunks can have: the unmount refuses it, and the \
             store keeps the chunk it had",
        ),
    ] {
        let paths = v[key].as_array().into_iter().flatten();
        out.extend(
            paths
                .filter_map(|p| p.as_str())
                .map(|p| format!("{p} was written but {what}")),
        );
    }
    out
}

/// What a mount has staged and not stored, from its stats file, for a message.
fn unstored(mountpoint: &std::path::Path) -> String {
    let Some(v) = stats_of(mountpoint) else {
        return String::new();
    };
    let mut out = String::new();
    for a in v["staged"].as_array().into_iter().flatten() {
        let keys: Vec<&str> = a["first_keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|k| k.as_str())
            .collect();
        let n = a["chunks"].as_u64().unwrap_or(0);
        out += &format!(
            "\nNot stored: {n} chunk{} of array {:?} ({}{})",
            if n == 1 { "" } else { "s" },
            a["array"].as_str().unwrap_or(""),
            keys.join(", "),
            if n as usize > keys.len() { ", ..." } else { "" }
        );
    }
    out
}

fn run(cli: Cli, args: &[std::ffi::OsString]) -> Result<ExitCode> {
    match cli.command {
        Command::Mount(m) => run_mount(*m, args),
        Command::Unmount { mountpoint, lazy } => run_unmount(mountpoint, lazy),
        Command::Info { store: path, json } => run_info(path, json),
        Command::Verify {
            store,
            repair,
            json,
        } => run_verify(store, repair, json),
        Command::Compact {
            store,
            min_garbage,
            json,
        } => run_compact(store, min_garbage, json),
        Command::Stats { mountpoint, json } => run_stats(mountpoint, json),
        Command::Demo => {
            init_logging("warn");
            shardfs::demo::run(&mut std::io::stdout()).map_err(anyhow::Error::msg)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `shardfs unmount`: make what the mount holds durable, unmount, wait for its daemon.
fn run_unmount(mountpoint: std::path::PathBuf, lazy: bool) -> Result<ExitCode> {
    let abs = std::path::absolute(&mountpoint)?;
    if !mount::is_mount_point(&abs)
        && !std::fs::canonicalize(&abs).is_ok_and(|c| mount::is_mount_point(&c))
    {
        match std::fs::symlink_metadata(&abs) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("{}: no such directory", mountpoint.display())
            }
            _ => bail!("nothing is mounted at {}", mountpoint.display()),
        }
    }
    let daemons = mount::daemon_pids(&abs);
    // fsync of the mount's root makes everything staged durable first, so that
    // nothing depends on the daemon finishing after the unmount.
    let synced = std::fs::File::open(&mountpoint).and_then(|d| d.sync_all());
    // ENOTCONN: the daemon is gone (killed); there is nothing left to flush.
    let unstored_kept = synced.is_err();
    if let Err(e) = synced
        && !lazy
        && e.raw_os_error() != Some(libc::ENOTCONN)
    {
        bail!(
            "flushing {0} before unmounting failed ({e}); not unmounted.{1}\n\
                 Fix the cause (free space, permissions) and run `shardfs unmount {0}` \
                 again; `shardfs unmount --lazy {0}` unmounts and discards what is not stored.",
            mountpoint.display(),
            unstored(&mountpoint)
        );
    }
    for line in refusals(&mountpoint) {
        eprintln!("shardfs: warning: {line}");
    }
    match mount::unmount_path(&mountpoint, lazy) {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => bail!(
            "{} is busy: a process has a file or its working directory there \
                 (`fuser -vm {0}` or `lsof {0}` names it); `shardfs unmount --lazy {0}` \
                 detaches it now, and it goes once no longer used",
            mountpoint.display()
        ),
        other => other.with_context(|| format!("unmounting {}", mountpoint.display()))?,
    }
    if lazy && unstored_kept {
        // What could not be stored is given up, as said: a daemon unmounted from outside
        // otherwise stays, trying to store it (`daemon::store_before_exit`).
        for pid in &daemons {
            // SAFETY: a plain kill(2) of a daemon of this mount found in /proc.
            unsafe { libc::kill(*pid as libc::pid_t, libc::SIGTERM) };
        }
    }
    // The daemon flushes and exits after the unmount: wait for it, so that a new
    // mount at this path cannot be taken down by the old daemon.
    if !lazy && !mount::wait_for_exit(&daemons, std::time::Duration::from_secs(30)) {
        eprintln!(
            "shardfs: unmounted {}, but its daemon (pid {daemons:?}) has not exited yet",
            mountpoint.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `shardfs info`: the arrays of a store and how they are shown.
fn run_info(path: std::path::PathBuf, json: bool) -> Result<ExitCode> {
    init_logging("warn");
    let name = mount::StoreName::of(&path);
    let s = mount::open_store(name, &Default::default())?;
    let arrays = info::inspect(s.as_ref())?;
    // Nothing at all below an object storage prefix: most likely a mistyped one
    // (asked only when no array was found: one LIST).
    if arrays.is_empty()
        && let Some(url) = name.url()
        && s.list(std::path::Path::new(""))?.is_empty()
    {
        bail!("{url} holds no objects (is the prefix right?)");
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&arrays)?);
    } else {
        print!("{}", info::render(&arrays));
    }
    Ok(ExitCode::SUCCESS)
}

/// `shardfs verify`: check (and with `--repair` mend) every shard of a store.
fn run_verify(store: std::path::PathBuf, repair: bool, json: bool) -> Result<ExitCode> {
    init_logging("warn");
    let progress = !json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let name = mount::StoreName::of(&store);
    let report = if let mount::StoreName::Bucket(_) = name {
        if repair {
            bail!(
                "--repair works on a local directory only: {} is object storage, \
                     where a shard is replaced whole by one PUT, never left half done",
                store.display()
            );
        }
        let s = mount::open_store(name, &Default::default())?;
        shardfs::maint::verify_store(s.as_ref(), &store, progress)?
    } else {
        shardfs::maint::verify(&store, repair, progress)?
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `shardfs compact`: rewrite shards whose dead bytes pass `min_garbage`.
fn run_compact(store: std::path::PathBuf, min_garbage: f64, json: bool) -> Result<ExitCode> {
    init_logging("warn");
    let progress = !json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let name = mount::StoreName::of(&store);
    let report = if let mount::StoreName::Bucket(_) = name {
        let s = mount::open_store(name, &Default::default())?;
        shardfs::maint::compact_store(s.as_ref(), &store, min_garbage, progress)?
    } else {
        shardfs::maint::compact(&store, min_garbage, progress)?
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `shardfs stats`: a mount's counters (its `.shardfs-stats` file).
fn run_stats(mountpoint: std::path::PathBuf, json: bool) -> Result<ExitCode> {
    let path = mountpoint.join(shardfs::view::STATS_FILE);
    let bytes = std::fs::read(&path).with_context(|| {
        format!(
            "{} is not a shardfs mount (no {})",
            mountpoint.display(),
            path.display()
        )
    })?;
    if json {
        // The file is padded with blanks to a whole page.
        println!("{}", String::from_utf8_lossy(&bytes).trim_end());
    } else {
        let v: serde_json::Value = serde_json::from_slice(&bytes)?;
        for (k, val) in v.as_object().into_iter().flatten() {
            println!("{k:<24} {}", val.to_string().trim_matches('"'));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_mount(m: MountArgs, args: &[std::ffi::OsString]) -> Result<ExitCode> {
    let opts = cli::mount_options(&m).map_err(anyhow::Error::msg)?;
    let name = mount::StoreName::of(&m.store);
    if !m.foreground {
        return run_detached(&m, name, args);
    }
    init_mount_logging(&m)?;
    if let mount::StoreName::Local(_) = name
        && let Some(why) = mount::not_zarr_warning(&m.store)
    {
        log::warn!("{why}");
    }
    daemon::block_signals();
    match mount::Mount::new(&m.store, &m.mountpoint, &opts) {
        Ok(mnt) => {
            let mut ready = String::from("ok");
            for note in mount_notes(name, &mnt) {
                log::warn!("{note}");
                if m.notify_fd.is_some() {
                    ready.push_str(&format!("\nnote: {note}"));
                } else {
                    eprintln!("shardfs: note: {note}");
                }
            }
            daemon::notify(m.notify_fd, &ready);
            daemon::serve(mnt)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            daemon::notify(m.notify_fd, &e.to_string());
            Err(e.into())
        }
    }
}

/// `shardfs mount` without `--foreground`: what can be checked before detaching is
/// checked here (a clear message on this terminal), then the daemon is spawned and its
/// mount waited for.
fn run_detached(
    m: &MountArgs,
    name: mount::StoreName,
    args: &[std::ffi::OsString],
) -> Result<ExitCode> {
    // Check what can be checked before detaching, for a clear message here.
    if let mount::StoreName::Local(_) = name {
        match std::fs::metadata(&m.store) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("store {} does not exist", m.store.display())
            }
            Err(e) => bail!("store {}: {e}", m.store.display()),
            Ok(md) if !md.is_dir() => {
                bail!("store {} is not a directory", m.store.display())
            }
            Ok(_) => {}
        }
        if let Some(why) = mount::not_zarr_warning(&m.store) {
            eprintln!("shardfs: warning: {why}");
        }
    }
    match daemon::spawn_daemon(args, m.log_file.as_deref())? {
        Ok(notes) => {
            for note in notes {
                eprintln!("shardfs: note: {note}");
            }
            // Once the mount stands (never before a real error): the daemon's
            // warnings (a refused write no request waits for, a flush that failed
            // when idle) would reach no one.
            if m.log_file.is_none() && daemon::syslog_writer().is_none() {
                eprintln!(
                    "shardfs: warning: no system log (/dev/log) to send the daemon's \
                     warnings and errors to: they are lost; --log-file PATH keeps them"
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(msg) => bail!("{msg}"),
    }
}

/// Where a mount's log goes: the system log (a daemon without `--log-file`), the log
/// file, or standard error.
fn init_mount_logging(m: &MountArgs) -> Result<()> {
    if m.notify_fd.is_some() && m.log_file.is_none() {
        init_syslog("warn");
    } else if let (None, Some(path)) = (m.notify_fd, &m.log_file) {
        // In the foreground too, `--log-file` is where the log goes (a daemonized
        // mount's stderr is that file already).
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening the log file {}", path.display()))?;
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
            .format_timestamp_millis()
            .target(env_logger::Target::Pipe(Box::new(file)))
            .init();
    } else {
        init_logging("info");
    }
    Ok(())
}

/// What whoever mounted should hear about a mount that stands: an object storage prefix
/// with nothing below it (a mistyped prefix mounts as a new, empty, writable store).
fn mount_notes(store: mount::StoreName, mnt: &mount::Mount) -> Vec<String> {
    let mut notes = Vec::new();
    // The store's own listing of the prefix (one LIST): the view's listing of the root
    // would look into an array there (a LIST per level and a shard's index, 4 round trips
    // before the mount was ready).
    if let Some(url) = store.url()
        && mnt
            .view()
            .store()
            .list(std::path::Path::new(""))
            .is_ok_and(|entries| {
                entries
                    .iter()
                    .all(|e| e.name.to_string_lossy().starts_with(".shardfs"))
            })
    {
        notes.push(format!(
            "{url} holds no objects: mounted as a new, empty store (is the prefix right?)"
        ));
    }
    notes
}
