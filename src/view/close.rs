//! Closing an open file: `close` (FUSE `flush`, [`View::flush_handle`]) commits what
//! was written through the handle before it returns; `release` lets the handle and its
//! inode go, and at a file's last release a scratch file at a chunk key or metadata
//! settles back into that node ([`Overlay::settled`]) and v2 metadata written as a store
//! file is taken in. Whether a close commits anything decides `FOPEN_NOFLUSH`. The
//! commits themselves are `commit.rs`; the handle table is `handles.rs`.

use super::Overlay;
use super::Tree;
use super::node::Target;
use super::scratch::Scratch;
use super::*;

impl View {
    /// Close a file; a written chunk is committed (staged) when its last handle closes.
    pub fn release(&self, fh: u64) -> Result<()> {
        // A writable mount with kernel opens hears of no `flush`: letting a handle go
        // (`View::commit_kernel_writes`, a rare kernel release) does what it would do.
        let policy = self.open_policy();
        let flushed = if policy.release_flushes() && self.writer.is_some() {
            self.flush_handle(fh)
        } else {
            Ok(())
        };
        let Some((ino, handle)) = self.open.handles.remove(fh) else {
            return flushed;
        };
        self.let_go(ino);
        // A file whose close commits nothing (a writer's temporary file) is shown as
        // written: the kernel's pages of it stay right.
        let written = matches!(handle, Handle::Scratch { .. } | Handle::StoreRw(..))
            && self.commits_on_close(&handle);
        let released = match handle {
            Handle::Scratch {
                ino, node, file, ..
            } => self
                .overlay()
                .and_then(|o| o.release_scratch(ino, &node, &file)),
            Handle::StoreRw(f, rel) => {
                // Where the release flushed (above), that flush finished it.
                let finished = if policy.release_flushes() {
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
            && policy.kernel_keeps_pages()
            && let Some(w) = &self.writer
        {
            // The kernel keeps a file's pages across opens here: what it holds of a
            // written file is the writer's bytes, which the commit may have refused
            // (metadata rolled back) or shown otherwise (a new array's `zarr.json`).
            w.invalidate(write_api::Invalidation::Inode(ino));
        }
        flushed.and(released)
    }

    /// `close` of a file handle (FUSE `flush`): commits a written chunk or metadata, and
    /// adopts a new array whose `zarr.json` was written in place. This runs before
    /// `close` returns — `release` comes later, asynchronously, and a writer like
    /// `cp -r` would already be creating the chunk files.
    pub fn flush_handle(&self, fh: u64) -> Result<()> {
        let handle = self.open.handles.get(fh).ok();
        match handle {
            Some(Handle::Scratch {
                node,
                file,
                writes: true,
                ..
            }) => {
                if self.open_policy().lands_metadata_at_write() {
                    self.open.handles.take_landed(fh);
                }
                self.overlay()?.commit_scratch(&node, &file)
            }
            // A shell's redirection (`echo ... > zarr.json`) closes a duplicate of the
            // still-empty file before it writes: that close waits for the one that
            // brings the document.
            Some(Handle::StoreRw(_, rel))
                if self
                    .pending_doc(&rel)
                    .is_some_and(|d| d.is_empty() && d.opens() > 1) =>
            {
                Ok(())
            }
            Some(Handle::StoreRw(_, rel)) if self.pending_doc(&rel).is_some_and(|d| !d.whole()) => {
                self.doc_finished(&rel)
            }
            Some(Handle::StoreRw(_, rel)) => match self.tree.lands_on_close(&rel) {
                // Taken in at a write already (`View::land_at_write`).
                Some(_) if self.open.handles.take_landed(fh) => Ok(()),
                // A shell's redirection (`echo ... > .zattrs`) closes a duplicate of the
                // still-empty file before it writes: v2 metadata with nothing in it yet
                // waits for the close that brings it (or for `release`).
                Some(file)
                    if file != MetaFile::ZarrJson
                        && self.tree.store.stat(&rel)?.is_some_and(|m| m.len == 0) =>
                {
                    Ok(())
                }
                Some(file) => self
                    .overlay()?
                    .metadata_landed(rel.parent().unwrap_or(Path::new("")), file),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// The last handle of v2 metadata written as a store file went: what no close took in
    /// (it was empty then) is taken in now, or refused and removed.
    pub(super) fn release_store_file(&self, rel: &Path) {
        // Not while another writer has it open: its release comes after the close of
        // this one (asynchronously), and the file may be that writer's, still being
        // written (zarr 2 writing a group's `.zattrs` twice through fsspec: the second
        // close found it taken in and gone, `ENOENT`).
        if self.open.handles.writes_to(rel) {
            return;
        }
        if let Some(file) = self.tree.lands_on_close(rel)
            && file != MetaFile::ZarrJson
            && matches!(self.tree.store.stat(rel), Ok(Some(_)))
            && let Some(o) = self.overlay_opt()
            && let Err(e) = o.metadata_landed(rel.parent().unwrap_or(Path::new("")), file)
        {
            log::warn!("{}: not taken in at release: {e}", rel.display());
        }
    }

    /// Whether [`View::flush_handle`] may do anything for `handle`: a scratch file at a
    /// chunk key or metadata (a commit), a store metadata file open for writing (a new
    /// array, or v2 metadata to take in). Every other close needs no flush request — most of all the read-only opens
    /// of chunks, and the temporary files of tmp+rename writers.
    pub(super) fn commits_on_close(&self, handle: &Handle) -> bool {
        match handle {
            Handle::Scratch {
                node, writes: true, ..
            } => self.commits(node).unwrap_or(true),
            Handle::Scratch { writes: false, .. } => false,
            Handle::StoreRw(_, rel) => self.tree.lands_on_close(rel).is_some(),
            Handle::Store(_) | Handle::Bytes(_) | Handle::Chunk { .. } | Handle::Discard(_) => {
                false
            }
        }
    }

    /// Whether closing a written scratch file commits it: it sits at a chunk key or at
    /// the array's metadata.
    fn commits(&self, node: &Node) -> Result<bool> {
        let Node::Scratch {
            path,
            array,
            parent,
        } = node
        else {
            return Ok(false);
        };
        let name = path.file_name().unwrap_or_default();
        Ok(matches!(
            self.tree.target(array, parent.as_deref(), name)?,
            Target::Meta(_) | Target::Chunk(_)
        ))
    }
}

impl Overlay<'_> {
    /// The last handle of a scratch file closed: anything still uncommitted is
    /// committed, and a scratch file at a chunk key or `zarr.json` goes back to being
    /// that chunk or metadata; other scratch files stay, waiting for a rename.
    pub(super) fn release_scratch(
        &self,
        ino: u64,
        node: &Node,
        file: &Arc<Mutex<Scratch>>,
    ) -> Result<()> {
        let Node::Scratch {
            path,
            array,
            parent,
        } = node
        else {
            return Ok(());
        };
        let (last, orphan) = {
            let mut f = file.lock();
            f.opens = f.opens.saturating_sub(1);
            (f.opens == 0, f.orphan)
        };
        if !last {
            return Ok(());
        }
        if orphan {
            let mut f = file.lock();
            self.w.scratch.unreserve(f.data.len() as u64);
            f.data = Vec::new();
            return Ok(());
        }
        let committed = self.commit_scratch(node, file);
        self.settle_scratch(ino, path, array, parent.as_deref())?;
        committed
    }

    /// A scratch file at a chunk key or `zarr.json` whose last handle closed goes back.
    pub(super) fn settle_scratch(
        &self,
        ino: u64,
        path: &Path,
        array: &Arc<ShardedArray>,
        parent: Option<&[u64]>,
    ) -> Result<()> {
        let name = path.file_name().unwrap_or_default();
        let back = match self.tree.target(array, parent, name)? {
            Target::Meta(file) => Node::ArrayMeta {
                array: self.tree.current(array),
                file,
            },
            Target::Chunk(coords) => Node::Chunk {
                array: self.tree.current(array),
                coords,
            },
            Target::Scratch | Target::Invalid(_) => return Ok(()),
        };
        // The inode becomes the chunk before the scratch file goes, under the scratch
        // table's lock: whoever still holds the scratch node and finds its file gone
        // looks again and finds the chunk (`Overlay::settled`), never a name with nothing.
        let mut table = self.w.scratch.lock();
        if table.is_closed(path) {
            self.tree.inodes.update(ino, back);
            table.remove(path);
        }
        Ok(())
    }
}

impl Tree {
    /// The metadata file a written store file is, if closing it changes the tree:
    /// `zarr.json` (a new array) and, in the v2 view, `.zarray`, `.zattrs`, `.zgroup`.
    pub(super) fn lands_on_close(&self, rel: &Path) -> Option<MetaFile> {
        match rel.file_name().and_then(MetaFile::from_name)? {
            MetaFile::ZarrJson => Some(MetaFile::ZarrJson),
            f if self.format == super::ViewFormat::V2 => Some(f),
            _ => None,
        }
    }
}
