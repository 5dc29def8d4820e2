//! The command line: argument definitions, the `mount.fuse3` calling form, and `-o`
//! option lists. Parsing only; `main.rs` acts on the result.
//!
//! Laid out as `args` (the clap definitions) and `options` (flags and `-o` lists made
//! into mount options); this file rewrites the `mount.fuse3` calling form.

mod args;
mod options;
#[cfg(test)]
mod tests;

use std::ffi::OsString;

pub use args::{Cli, Command, CompactorArg, FormatArg, MountArgs};
pub use options::{OBJECT_STORE_THREADS, mount_options};

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
