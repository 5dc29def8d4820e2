//! `shardfs demo`: build the sample store in a temporary directory, mount it, read every
//! chunk through the mount and compare it with the data written, check the listings and
//! the rewritten metadata, print what was done, unmount.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use crate::mount::{Mount, MountOptions};
use crate::sample::write_sample_store;

/// Run the demo, reporting to `out`. Every mismatch is an error naming the file.
pub fn run(out: &mut dyn Write) -> Result<(), String> {
    let e = |e: std::io::Error| e.to_string();
    let tmp = tempfile::tempdir().map_err(e)?;
    let store = tmp.path().join("sample.zarr");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).map_err(e)?;
    let sample = write_sample_store(&store).map_err(e)?;
    writeln!(
        out,
        "wrote sample store {} ({} shards, {} inner chunks)",
        store.display(),
        sample.shards,
        sample.chunks.len()
    )
    .map_err(|x| x.to_string())?;

    let started = Instant::now();
    let mount = Mount::new(&store, &mnt, &MountOptions::default()).map_err(|x| x.to_string())?;
    let mounted_in = started.elapsed();
    let result = check(&mnt, &sample);
    mount.unmount().map_err(e)?;
    let (bytes, listed) = result?;
    let w = |out: &mut dyn Write, s: String| writeln!(out, "{s}").map_err(|x| x.to_string());
    w(
        out,
        format!(
            "mounted at {} in {:.1} ms",
            mnt.display(),
            mounted_in.as_secs_f64() * 1e3
        ),
    )?;
    w(
        out,
        format!(
            "read {} chunk files ({bytes} bytes) through the mount: all equal to the data written",
            sample.chunks.len()
        ),
    )?;
    w(
        out,
        format!("listed {listed} chunk files: exactly the non-empty inner chunks"),
    )?;
    w(
        out,
        format!(
            "checked the rewritten zarr.json of {} sharded arrays and the pass-through of 'plain'",
            sample.arrays.len() - 1
        ),
    )?;
    w(out, "unmounted; demo passed".into())
}

fn check(mnt: &Path, sample: &crate::sample::Sample) -> Result<(u64, usize), String> {
    let mut bytes = 0;
    for (rel, expected) in &sample.chunks {
        let got = std::fs::read(mnt.join(rel)).map_err(|e| format!("{rel}: {e}"))?;
        if &got != expected {
            return Err(format!(
                "{rel}: {} bytes read differ from the {} bytes written",
                got.len(),
                expected.len()
            ));
        }
        bytes += got.len() as u64;
    }
    let mut listed = BTreeSet::new();
    for array in &sample.arrays[..sample.arrays.len() - 1] {
        walk(&mnt.join(array), array, &mut listed)?;
        let meta: serde_json::Value = serde_json::from_slice(
            &std::fs::read(mnt.join(array).join("zarr.json")).map_err(|e| e.to_string())?,
        )
        .map_err(|e| format!("{array}/zarr.json: {e}"))?;
        if meta["codecs"].to_string().contains("sharding_indexed") {
            return Err(format!("{array}/zarr.json still names sharding_indexed"));
        }
    }
    let expected: BTreeSet<_> = sample.chunks.keys().cloned().collect();
    if listed != expected {
        let extra: Vec<_> = listed.difference(&expected).take(5).collect();
        let missing: Vec<_> = expected.difference(&listed).take(5).collect();
        return Err(format!(
            "listing differs: extra {extra:?}, missing {missing:?}"
        ));
    }
    let plain = std::fs::read(mnt.join("plain/c/0")).map_err(|e| format!("plain/c/0: {e}"))?;
    if plain != [1, 2, 3, 4] {
        return Err("plain/c/0 did not pass through unchanged".into());
    }
    Ok((bytes, listed.len()))
}

/// Collect every file under `dir` except `zarr.json`, as `prefix/relative path`.
fn walk(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) -> Result<(), String> {
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = format!("{prefix}/{name}");
        if entry.file_type().map_err(|e| e.to_string())?.is_dir() {
            walk(&entry.path(), &rel, out)?;
        } else if name != "zarr.json" {
            out.insert(rel);
        }
    }
    Ok(())
}
