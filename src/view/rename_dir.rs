//! Renaming a directory of the store through the view: a group's, an array's, any plain
//! directory's. On a store that can rename a directory in one step (a local directory:
//! `rename(2)`, atomic) it is one rename in the store, after everything written below it
//! through this mount is committed and stored; elsewhere (object storage, where a
//! directory is a prefix of many objects) it is `EXDEV`, and `mv` copies and deletes.

use std::path::Path;

use super::handles::KernelCommit;
use super::kept::Keep;
use super::{Node, Renamed, Result, View, ViewError};

impl View {
    /// Rename the directory `src` (view path `from`) to `to`, store path `dst`.
    pub(super) fn rename_dir(
        &self,
        src: &Node,
        from: &Path,
        to: &Path,
        dst: &Path,
    ) -> Result<Renamed> {
        let w = self.writer()?;
        let rel = match src {
            Node::Dir { rel } => rel.clone(),
            Node::ArrayDir { array } if !array.draft => array.rel.clone(),
            _ => {
                return Err(ViewError::Unsupported(
                    "renaming key directories or directories of a draft-layout store is not \
                     supported"
                        .into(),
                ));
            }
        };
        if dst.starts_with(&rel) {
            return Err(ViewError::Invalid(format!(
                "{} cannot move into itself",
                from.display()
            )));
        }
        // What this mount holds below it is stored first, so that nothing it writes
        // later goes to the old paths.
        self.commit_kernel_writes(KernelCommit::Settled { except: None })?;
        let open_below = w
            .scratch
            .lock()
            .iter()
            .any(|(p, f)| p.starts_with(from) && f.lock().opens > 0);
        if open_below || w.docs.any_under(&rel) {
            log::warn!("{}: files below it are open for writing", from.display());
            return Err(ViewError::Io(std::io::Error::from_raw_os_error(
                libc::EBUSY,
            )));
        }
        for array in w.staging.arrays(None) {
            if array.starts_with(&rel)
                && let Some(a) = self.arrays.get(&array)
            {
                self.flush_array(&a)?;
            }
        }
        self.keep_files(Keep::Under(from))?;
        self.store.rename_dir(&rel, dst)?;
        // Nothing of this mount's state names the old paths any more.
        w.scratch.lock().retain(|p, _| !p.starts_with(from));
        w.kept_paths.lock().retain(|p| !p.starts_with(from));
        w.vdirs.lock().retain(|(a, _)| !a.starts_with(&rel));
        w.raw.lock().retain(|a| !a.starts_with(&rel));
        w.headless.lock().retain(|a, _| !a.starts_with(&rel));
        w.plain_headless.lock().retain(|a, _| !a.starts_with(&rel));
        w.times.lock().retain(|p, _| !p.starts_with(from));
        self.arrays.remove_under(&rel);
        // Its inodes move with it, and are looked at again there.
        self.inodes.move_tree(from, to);
        self.refresh_subtree(to);
        Ok(Renamed::Other)
    }
}
