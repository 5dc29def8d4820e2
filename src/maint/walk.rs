//! The sharded arrays `verify` and `compact` walk (every presentable one under the store
//! root, with its shard files), and their progress bar. Not what is done to each shard.

use std::io;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

use super::report::Problem;
use crate::format::{Presentation, ShardLayout};
use crate::info::{for_each_array_or_bad, shard_coords};
use crate::store::Store;

/// A sharded array of the store, and its shard files.
pub(super) struct Array {
    pub(super) rel: PathBuf,
    pub(super) layout: ShardLayout,
    pub(super) shards: Vec<PathBuf>,
}

/// Every presentable sharded array under the store root (path order); the others that
/// hold `sharding_indexed` go to `unchecked`.
pub(super) fn sharded_arrays(
    store: &dyn Store,
    unchecked: &mut Vec<Problem>,
    problems: &mut Vec<Problem>,
) -> io::Result<Vec<Array>> {
    let mut out = Vec::new();
    let mut bad = |rel: PathBuf, why: String| {
        problems.push(Problem {
            shard: rel,
            what: format!(
                "metadata that is not a valid document ({why}): Zarr readers cannot open this node"
            ),
        })
    };
    for_each_array_or_bad(
        store,
        PathBuf::new(),
        &mut |dir, meta| {
            match &meta.presentation {
                Presentation::Sharded(layout) => {
                    let shards = shard_coords(store, &dir, meta.key_encoding, layout)
                        .iter()
                        .map(|c| dir.join(meta.key_encoding.encode(c)))
                        .collect();
                    out.push(Array {
                        rel: dir,
                        layout: layout.clone(),
                        shards,
                    });
                }
                Presentation::Unsupported(why) => unchecked.push(Problem {
                    shard: dir,
                    what: why.clone(),
                }),
                Presentation::Plain => {}
            }
            Ok(())
        },
        &mut bad,
    )?;
    Ok(out)
}

pub(super) fn progress_bar(show: bool, len: usize, what: &'static str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg} {wide_bar} {pos}/{len} shards, {eta} left")
            .expect("valid template"),
    );
    bar.set_message(what);
    bar
}

/// What the shard path `rel` of the local store at `root` is, when it is not a regular
/// file (`verify` reports it, `compact` skips it): never opened, as a FIFO would block
/// and a symbolic link may lead out of the store. `None`: a regular file, or nothing.
pub(super) fn not_a_file(root: &Path, rel: &Path) -> Option<&'static str> {
    let m = std::fs::symlink_metadata(root.join(rel)).ok()?;
    Some(if m.file_type().is_file() {
        return None;
    } else if m.is_dir() {
        "a directory"
    } else if m.file_type().is_symlink() {
        "a symbolic link (never followed)"
    } else {
        "a special file (FIFO, socket or device)"
    })
}
