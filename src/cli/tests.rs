//! Tests of the command line: the `mount.fuse3` calling form, subcommands, flags and `-o`
//! options as they reach [`MountOptions`](crate::mount::MountOptions).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use fuser::MountOption;

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
    let cache = |args: &[&str]| mount_options(&mount_args(parse(args))).map(|o| o.s3.read_ahead);
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
