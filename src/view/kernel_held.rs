//! What the handles gathering writes through descriptors the kernel opened hold
//! (`kernel_writes.rs`): whether a commit now would refuse them (a chunk or document
//! not yet whole), whether they were touched or unlinked, and their paths for messages.
//! Looks, never commits.

use super::Tree;
use super::handles::OpenFiles;
use super::*;

impl OpenFiles {
    /// What a commit would refuse as it stands, while its writer may not have finished:
    /// metadata not yet a whole document ([`OpenFiles::partial_metadata`]), or a chunk of a
    /// length its array's codecs cannot decode ([`OpenFiles::partial_chunk`]). Only its own
    /// `fsync` (`EINVAL` then), and the unmount (refused, and named), commit it: the idle
    /// commit once took a chunk half written by a slow writer, refused it and let its
    /// bytes go, and the writer's next write landed on the stored chunk, its `fsync`
    /// returning success over a mix of old and new bytes.
    pub(super) fn unfinished(&self, t: TreeRead<'_>, fh: u64) -> bool {
        self.partial_metadata(t, fh) || self.partial_chunk(t, fh)
    }

    /// A chunk whose bytes are not a length its array's codecs can decode (uncompressed
    /// chunks have one length): a commit now would refuse it.
    pub(super) fn partial_chunk(&self, t: TreeRead<'_>, fh: u64) -> bool {
        let Ok(Handle::Scratch { node, file, .. }) = self.handles.get(fh) else {
            return false;
        };
        let Some(want) = t.tree.fixed_chunk_len(&node) else {
            return false;
        };
        let f = file.lock();
        !f.orphan && f.dirty && f.data.len() as u64 != want
    }

    /// Metadata (an array's, or a store file taken in when closed) whose bytes are not
    /// yet a whole JSON document: a commit would refuse it and roll it back under its
    /// writer, who has not finished. Only its own `fsync`, and the unmount, commit it.
    pub(super) fn partial_metadata(&self, t: TreeRead<'_>, fh: u64) -> bool {
        match self.handles.get(fh) {
            Ok(Handle::Scratch { node, file, .. }) => {
                let f = file.lock();
                // Unlinked since: nothing of it will be committed.
                !f.orphan
                    && t.tree.pending_meta(&node).is_some()
                    && !super::pending_doc::whole_json(&f.data)
            }
            Ok(Handle::StoreRw(_, rel)) => match t.overlay.and_then(|w| w.doc_whole(&rel)) {
                Some(whole) => !whole,
                None => {
                    t.tree.lands_on_close(&rel).is_some()
                        && !matches!(t.tree.store.read_all(&rel), Ok(Some(b)) if super::pending_doc::whole_json(&b))
                }
            },
            _ => false,
        }
    }

    /// The path of the file of `handle` of `ino`, for a message: its inode's, or the
    /// one the handle was opened at (an inode retired since).
    pub(super) fn handle_path(&self, t: TreeRead<'_>, ino: u64, handle: Option<&Handle>) -> String {
        if let Some((path, _)) = t.tree.inodes.get(ino) {
            return path.display().to_string();
        }
        match handle {
            Some(Handle::Scratch {
                node: Node::Scratch { path, .. },
                ..
            }) => path.display().to_string(),
            Some(Handle::StoreRw(_, rel)) => rel.display().to_string(),
            _ => format!("inode {ino}"),
        }
    }

    /// The paths of files held for commit (writes through descriptors the kernel
    /// opened) for which `pick` holds, by handle.
    pub(super) fn held_paths(&self, t: TreeRead<'_>, pick: impl Fn(u64) -> bool) -> Vec<String> {
        let mut out: Vec<String> = self
            .implicit
            .held()
            .into_iter()
            .filter(|&(_, fh)| pick(fh))
            .filter_map(|(ino, _)| t.tree.inodes.get(ino))
            .map(|(p, _)| p.display().to_string())
            .collect();
        out.sort();
        out
    }

    /// The paths of chunks held for commit whose bytes are not a length their array's
    /// codecs can decode (what the unmount will commit, and refuse, unless finished).
    pub(super) fn partial_chunk_paths(&self, t: TreeRead<'_>) -> Vec<String> {
        self.held_paths(t, |fh| self.partial_chunk(t, fh))
    }

    /// The paths of files held for commit whose metadata is not yet a whole JSON
    /// document (what the unmount will commit, and refuse, unless it is finished).
    pub(super) fn partial_metadata_paths(&self, t: TreeRead<'_>) -> Vec<String> {
        let mut out = self.held_paths(t, |fh| self.partial_metadata(t, fh));
        if let Some(w) = t.overlay {
            out.extend(
                w.unfinished_docs()
                    .into_iter()
                    .map(|p| p.display().to_string()),
            );
        }
        out.sort();
        out.dedup();
        out
    }

    /// A file made (or truncated) and not written since: its writer has not begun, and
    /// only its own `fsync`, a rename of it or the unmount commit it (committed by
    /// another file's, an empty chunk was refused, and the write that came next found
    /// the file gone).
    pub(super) fn untouched(&self, fh: u64) -> bool {
        match self.handles.get(fh) {
            Ok(Handle::Scratch { file, .. }) => {
                let f = file.lock();
                f.data.is_empty() && f.written == 0
            }
            _ => false,
        }
    }

    /// Bytes gathered in `fh` that a commit would take as they stand (a chunk of a
    /// length its array's codecs can decode, a whole metadata document), which a
    /// truncate to `size` would change.
    pub(super) fn gathered_whole(&self, t: TreeRead<'_>, fh: u64, size: u64) -> bool {
        let Ok(Handle::Scratch { node, file, .. }) = self.handles.get(fh) else {
            return false;
        };
        let f = file.lock();
        if f.orphan || f.data.len() as u64 == size || (f.data.is_empty() && f.written == 0) {
            return false;
        }
        let decodes = |array: &Arc<ShardedArray>| {
            t.tree
                .current(array)
                .layout
                .fixed_chunk_len
                .is_none_or(|want| f.data.len() as u64 == want)
        };
        match &node {
            Node::Chunk { array, .. } => decodes(array),
            // A chunk key written as a file of its own first (before its array's
            // metadata, or opened for writing).
            Node::Scratch {
                path,
                array,
                parent,
            } => {
                path.file_name().is_some_and(|name| {
                    matches!(
                        t.tree.target(array, parent.as_deref(), name),
                        Ok(super::node::Target::Chunk(_))
                    )
                }) && decodes(array)
            }
            Node::ArrayMeta { .. } | Node::GroupMeta { .. } => {
                super::pending_doc::whole_json(&f.data)
            }
            _ => false,
        }
    }

    /// An unlinked file: nothing to commit; it lives on only in its handle.
    pub(super) fn unlinked(&self, t: TreeRead<'_>, fh: u64) -> bool {
        match self.handles.get(fh) {
            Ok(Handle::Scratch { file, .. }) => file.lock().orphan,
            Ok(Handle::StoreRw(_, rel)) => matches!(t.tree.store.stat(&rel), Ok(None)),
            _ => false,
        }
    }
}

impl Tree {
    /// The one length every chunk of its array has, where `node` is a chunk (a chunk
    /// key, or one written as a file of its own first, or made by `create`) of an array
    /// whose codecs fix it (no compression).
    pub(super) fn fixed_chunk_len(&self, node: &Node) -> Option<u64> {
        let array = match node {
            Node::Chunk { array, .. } => array,
            Node::Scratch {
                path,
                array,
                parent,
            } => {
                let name = path.file_name().unwrap_or_default();
                let Ok(super::node::Target::Chunk(_)) = self.target(array, parent.as_deref(), name)
                else {
                    return None;
                };
                array
            }
            _ => return None,
        };
        self.current(array).layout.fixed_chunk_len
    }
}
