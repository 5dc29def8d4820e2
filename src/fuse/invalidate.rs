//! What the kernel is told to drop around a reply, so that what it caches (entries,
//! attributes, pages) stays true after a request changed the tree: the waits for the
//! invalidations a view call queued (the view's write side only queues them, under no
//! lock), and the inode invalidations of an open, a write that landed metadata, and a
//! rename. The requests themselves are served in `fuse.rs`.

use fuser::INodeNo;

use super::ShardFs;
use crate::view::Renamed;

impl ShardFs {
    /// Before replying to a close or fsync: let the kernel drop what this request's
    /// changes made stale (chunks a shrink deleted, nodes whose kind changed), so the
    /// writer's next lookup sees the change. Safe here, as these requests hold no
    /// directory lock (the kernel takes the parent's to drop an entry); bounded, so a
    /// stuck kernel cannot hang the close.
    pub(super) fn settle(&self) {
        if let Some(w) = self.view.write_side() {
            w.settle_invalidations(std::time::Duration::from_secs(1));
        }
    }

    /// An open found the file's size changed since the kernel learnt it: before the
    /// reply, as the kernel's cached size is wrong and a read would stop there. Offset
    /// -1: attributes only (the pages go with keep-cache off). A kernel that no longer
    /// knows the inode is fine.
    pub(super) fn drop_stale_size(&self, ino: INodeNo) {
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(ino, -1, 0);
        }
    }

    /// A write landed a metadata document. Before the reply, as for a rename onto
    /// metadata: the chunks a shrink deleted no longer pass for files through attributes
    /// the kernel caches (the writer's next step may be zarr 2's `isfile`, then
    /// `os.remove`).
    pub(super) fn before_landed_reply(&self) {
        if let Some(w) = self.view.write_side() {
            w.settle_inode_invalidations(std::time::Duration::from_secs(1));
        }
    }

    /// Whether an invalidation of `ino` is on the way to the kernel.
    pub(super) fn invalidation_pending(&self, ino: INodeNo) -> bool {
        self.view
            .write_side()
            .is_some_and(|w| w.inode_invalidation_pending(ino.0))
    }

    /// After the reply to a `write`: the kernel held the written pages locked until it
    /// had it. They and the file's attributes go, where the write landed a metadata
    /// document (its pages are the writer's bytes; the view now shows the document as
    /// taken in) or asked for their invalidation meanwhile
    /// ([`crate::view::write_api::Writing`]). After a landing, what the change made stale
    /// (chunks a shrink deleted) is dropped too, before this thread serves more.
    pub(super) fn after_write_reply(&self, ino: INodeNo, landed: bool) {
        if let Some(notifier) = self.notifier.get() {
            let _ = notifier.inval_inode(ino, 0, 0);
            if landed {
                self.settle();
            }
        }
    }

    /// A rename (of `moved`, if known) succeeded; before its reply.
    pub(super) fn before_rename_reply(&self, moved: Option<u64>, renamed: Renamed) {
        if let Some(w) = self.view.write_side() {
            // Metadata renamed into place may have shrunk its array: the chunks
            // it deleted must not pass for files through attributes the kernel
            // still caches (zarr 2's resize: `isfile` then `os.remove` of each
            // chunk outside the new shape). Their entries can only be dropped
            // after this reply (the kernel holds the directory's lock), their
            // attributes now.
            w.settle_inode_invalidations(std::time::Duration::from_secs(1));
        }
        if self.view.open_policy().kernel_keeps_pages()
            && renamed == Renamed::Other
            && let (Some(ino), Some(n)) = (moved, self.notifier.get())
        {
            // The kernel keeps the moved file's pages and size, which are its
            // writer's bytes; at the new name the view may show other bytes (v2
            // metadata is shown as generated from `zarr.json`), and no open will
            // drop them. Before the reply, so the writer's next read is right.
            // (A temporary file moved onto a chunk key is shown as written: its
            // pages stay, and a read of the new chunk is served from them.)
            let _ = n.inval_inode(INodeNo(ino), 0, 0);
        }
    }
}
