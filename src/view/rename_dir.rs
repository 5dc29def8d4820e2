//! Renaming a directory of the store through the view: a group's, an array's, any plain
//! directory's. On a store that can rename a directory in one step (a local directory:
//! `rename(2)`, atomic) it is one rename in the store, after everything written below it
//! through this mount is committed and stored; elsewhere (object storage, where a
//! directory is a prefix of many objects) it is `EXDEV`, and `mv` copies and deletes.
//!
//! While it runs, nothing is made or committed anywhere in the mount (`Writer::tree`,
//! held exclusively): a chunk committed meanwhile would be staged under the old path,
//! for an array no longer there.

use std::path::Path;

use super::Overlay;
use super::kept::Keep;
use super::{Node, Renamed, Result, ViewError};
use crate::store::DirRenames;

impl Overlay<'_> {
    /// Rename the directory `src` (view path `from`) to `to`, store path `dst`.
    pub(super) fn rename_dir(
        &self,
        src: &Node,
        from: &Path,
        to: &Path,
        dst: &Path,
    ) -> Result<Renamed> {
        let w = self.w;
        let one_step = self.tree.caps.dir_renames == DirRenames::OneStep;
        let rel = match src {
            Node::Dir { rel } if one_step => rel.clone(),
            Node::ArrayDir { array } if one_step && !array.draft => array.rel.clone(),
            _ => {
                return Err(ViewError::CrossDevice(
                    "this store cannot rename a directory in one step (object storage), \
                     nor key directories or a draft-layout store's: copy instead"
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
        // What this mount holds below it is committed first (this may commit chunks,
        // which the lock below would wait for), then stored under the lock, so that
        // nothing it writes later goes to the old paths.
        self.gathered.commit_settled()?;
        let _renaming = w.tree.write();
        let open_below = w.scratch.any_open_under(from);
        if open_below || w.docs.any_under(&rel) {
            log::warn!("{}: files below it are open for writing", from.display());
            return Err(ViewError::Io(std::io::Error::from_raw_os_error(
                libc::EBUSY,
            )));
        }
        w.docs.drop_unfinished_under(&rel);
        for array in w.staging.arrays(None) {
            if array.starts_with(&rel)
                && let Some(a) = self.tree.arrays.get(&array)
            {
                self.flush_array(&a)?;
            }
        }
        self.keep_files(Keep::Under(from))?;
        self.tree.store.rename(&rel, dst)?;
        // This mount's state follows the directory to its new path.
        w.dir_moved(from, to, &rel, dst);
        self.tree.arrays.remove_under(&rel);
        // Arrays below it whose metadata is unlinked are arrays at their new path still:
        // what is written into them is staged and stored there. Before, a chunk written
        // into one after the move was refused (`ESTALE` at `fsync`, and an unmount that
        // failed on it; found by the reference test).
        for array in w.unlinked.headless_under(dst) {
            self.tree.arrays.insert(array);
        }
        self.tree.shards.invalidate_under(&rel);
        // Its inodes move with it, and are looked at again there.
        self.tree.inodes.move_tree(from, to);
        self.refresh_subtree(to);
        self.unconsolidate_above(from);
        self.unconsolidate_above(to);
        Ok(Renamed::Other)
    }
}
