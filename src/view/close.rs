//! Closing an open file: `release` of a handle (its last close), which commits what was
//! written through it and lets its inode go. The handle table is `handles.rs`.

use super::*;

impl View {
    /// Close a file; a written chunk is committed (staged) when its last handle closes.
    pub fn release(&self, fh: u64) -> Result<()> {
        // A writable mount with kernel opens hears of no `flush`: letting a handle go
        // (`View::commit_kernel_writes`, a rare kernel release) does what it would do.
        let flushed = if self.kernel_opens() && self.writer.is_some() {
            self.flush_handle(fh)
        } else {
            Ok(())
        };
        let Some((ino, handle)) = self.handles.remove(fh) else {
            return flushed;
        };
        self.let_go(ino);
        // A file whose close commits nothing (a writer's temporary file) is shown as
        // written: the kernel's pages of it stay right.
        let written = matches!(handle, Handle::Scratch { .. } | Handle::StoreRw(..))
            && self.commits_on_close(&handle);
        let released = match handle {
            Handle::Scratch { ino, node, file } => self.release_scratch(ino, &node, &file),
            Handle::StoreRw(f, rel) => {
                // Without kernel opens the close (`flush_handle`) refused it already.
                let finished = if self.kernel_opens() {
                    Ok(())
                } else {
                    self.doc_finished(&rel)
                };
                drop(f);
                self.release_store_file(&rel);
                finished
            }
            _ => Ok(()),
        };
        if written
            && self.kernel_opens()
            && let Some(w) = &self.writer
        {
            // The kernel keeps a file's pages across opens here: what it holds of a
            // written file is the writer's bytes, which the commit may have refused
            // (metadata rolled back) or shown otherwise (a new array's `zarr.json`).
            w.invalidate(write_api::Invalidation::Inode(ino));
        }
        flushed.and(released)
    }
}
