//! The virtual tree: which node a path is, its attributes, listings and reads. Knows
//! nothing of FUSE; the adapter in `fuse` calls one method per request.
//!
//! * Store directories and files pass through unchanged, byte for byte.
//! * A directory whose `zarr.json` is a presentable sharded array becomes an array
//!   directory: `zarr.json` is the rewritten unsharded metadata, the key namespace
//!   (`c/...`, or `0.1` keys for `v2`, ...) shows inner chunks instead of shards, other
//!   files pass through.
//! * Key directories are listed from the shard files that exist (the draft spec's
//!   `list_dir` rule): a prefix may be listed whose chunks turn out empty. The last level
//!   (files) reads the indices of the shards of that one directory only.
//!
//! # Files
//!
//! This file holds the [`View`], its configuration and the open-file [`Handle`]; its
//! errors, and their errno values, are `error.rs`. Parts that own their state and their logic, which the view asks by
//! method: `InodeTable`, `ArrayRegistry`, `ShardCache`, `Containers` (`container.rs`),
//! `GroupDocs` (`group_docs.rs`), `PlainFills` (`plain.rs`), `OwnFiles` (`own_files.rs`: the
//! store's directories and files of their own in key directories), `ReadAhead`
//! (`read_ahead.rs`), `CachePolicy`; the overlay's
//! `Writer` and its owners (`Unlinked`, `KeptPaths`, `ArrayChoices`, `KeyDirs`,
//! `TimesSet`, `AsWritten`, `PendingDocs`, `ScratchFiles`, `Staging`); the open files'
//! `OpenFiles` (`handles.rs`: the `HandleTable` and the handles held for writes through
//! descriptors the kernel opened). `View` holds three parts: the [`Tree`] (the tree's
//! state, above), the overlay (`writer`) and the open files (`open`). A file's methods
//! sit in up to five blocks, by what they need:
//! * `impl Tree`: the tree's state alone (`self.tree.current(array)`);
//! * `impl TreeRead`: the tree and the overlay, read only ([`TreeRead`], made per call by
//!   `View::tree_read`; it holds the overlay as an `OverlayRead`, the `Writer`'s queries
//!   only, so the tree cannot change it): resolution, chunk lookups, listings, what
//!   metadata a directory shows, the attributes of each node (`TreeRead::attr_of`, with
//!   the open policy passed in). Where a query meets a directory the overlay is stale about (an unlinked
//!   array whose metadata came back, or that another mount removed; chunks staged for
//!   an array another mount replaced), it fails with `ViewError::Stale`, and the
//!   overlay (`reconcile.rs`: `Overlay::in_tree`) reconciles itself and asks again;
//! * `impl Overlay`: what changes the overlay, with the tree ([`Overlay`], made per call
//!   by `View::overlay` on a writable view): flushes and their policy (`durable.rs`),
//!   commits, metadata written, landed and taken in, new arrays adopted, files of their
//!   own stored, files opened for writing (the handle they get is the facade's to add),
//!   truncates, times set through the mount, removals and renames in the store,
//!   reconciliation. It holds a copy of the open policy (decided once at `init`). It
//!   cannot reach the open files but for one request through [`GatheredWrites`]: commit
//!   the writes gathered from descriptors the kernel opened, before a change that moves
//!   or replaces what they were written to;
//! * `impl OpenFiles`: what the open files hold, with the tree read passed in
//!   (`kernel_held.rs`);
//! * `impl View`, the facade: the requests (one method per FUSE operation: the checks a
//!   read-only view answers, then the part that owns the rest), the stats file, and what
//!   needs the open files with the overlay: opens, reads, writes, closes, `fsync`, and
//!   the writes gathered from descriptors the kernel opened (`kernel_writes.rs`).
//!
//! The files, by the part they belong to:
//! * the tree's queries as the facade and the overlay ask them: `reconcile.rs` (the
//!   overlay reconciled with the store before the tree reads it);
//! * the tree, what a name is: `resolve.rs` (resolution, the array registry),
//!   `array_load.rs` (what a store directory is), `group_docs.rs`, `attr.rs` (lookups,
//!   attributes), `readdir.rs`, `listing.rs` and `key_listing.rs` (listings), `inode.rs`, `node.rs`,
//!   `plain.rs`, `draft.rs`, `container.rs`, `cache.rs`, `stats.rs`;
//! * the overlay, what this mount changed: `writer.rs` (its state), `overlay_read.rs`
//!   (the overlay as the tree reads it), `path_sets.rs` (files
//!   kept as files of their own, arrays shown as stored or kept unsharded), `scratch.rs` (the
//!   in-memory files and the room they take), `key_dirs.rs`
//!   (key directories shown without chunks), `set_times.rs`, `commit.rs`
//!   (commits), `ops.rs`, `remove.rs`, `rename.rs`, `rename_dir.rs`, `meta.rs`,
//!   `landed.rs`, `adopt.rs`, `kept.rs`, `pending_doc.rs`, `as_written.rs`, `durable.rs`,
//!   `unlinked.rs` (metadata unlinked while the names beside it stay);
//! * open files: `open_policy.rs` (who opens files, the daemon or the kernel, decided
//!   once at `init`, and all that differs between the two), `handles.rs` (the handle
//!   table), `open.rs`, `read.rs`, `close.rs`, `kernel_writes.rs`, `kernel_held.rs`.
//!
//! # Locks
//!
//! Locks that nest, outermost first, as the code takes them (issue 35). Take them only
//! in this order; hold none across store I/O or a wait, but for the exceptions below.
//!
//! 1. `Writer::tree` (RwLock): shared in `create`, `make_dir` (`mkdir`), `commit_chunk_closed`,
//!    exclusive in `adopt_new_array`, `rename_dir`: nothing is made or staged while a
//!    directory becomes an array or moves. parking_lot's RwLock is fair: never take it
//!    twice in one thread (a writer queued in between would deadlock it).
//! 2. `OpenFiles::implicit` (handles of writes through descriptors the kernel
//!    opened) or `Writer::kept_paths` (`KeptPaths::hold`: files of their own being
//!    stored), never both.
//! 3. The `Flusher::locks` per-array serial lock, then `Flusher::packed` or
//!    `Staging::inner`.
//! 4. `PendingDocs::docs` (documents being written) and a `PendingDoc::state`: never one
//!    under the other (a store of a document holds its state).
//! 5. `ScratchFiles::table` (`Writer::scratch`; held by a `scratch::Table`), then a
//!    file's `Arc<Mutex<Scratch>>`, then
//!    `ArrayRegistry::arrays` (read: `current`, `pending_meta`); `Writer::scratch` or
//!    `Writer::times`, then `InodeTable::inner`.
//! 6. Leaves, nothing taken under them: `InodeTable::inner`, `ArrayRegistry::arrays`,
//!    `HandleTable::files`/`dirs`/`landed_at_write`, `Staging::inner`, the `Writer`'s
//!    sets and maps (`vdirs`, `choices`, `unlinked`'s tables, `as_written`, ...),
//!    `Writer::invalidations`, `GroupDocs::shown`, `PlainFills::chunks`,
//!    `Containers::known`/`checked`, `ShardCache` segments
//!    and `loading` (never both), `Shard::nested`, `ObjectFile::ahead`.
//!
//! Held across store I/O (the exceptions):
//! * `Writer::tree`: all of adopt.rs:`adopt_new_array` and rename_dir.rs:`rename_dir`
//!   (flushes too), the store calls of ops.rs:`create`/`make_dir`, and the `flush_all` of
//!   commit.rs:`commit_chunk_closed` when the write buffer is full.
//! * `OpenFiles::implicit`: kernel_writes.rs:`implicit_begin` opens the file under it
//!   (store reads, shard loads); kernel_writes.rs:`commit_kernel_writes` reads and stats
//!   store files under it (`partial_metadata`, `unlinked`).
//! * `Writer::kept_paths` (`KeptPaths::hold`): kept.rs:`keep_file`, until the file is
//!   stored.
//! * The serial lock and `Flusher::packed`: each shard commit in flush.rs:`write` (one
//!   `packed` per mount: the flushes of all arrays take turns).
//! * `PendingDocs::docs`: pending_doc.rs:`PendingDocs::open` (reads a new document);
//!   `PendingDoc::state`: `change` (stores it, on purpose), `set_mode_owner`, `meta`.
//! * A shard's load claim (its path in `ShardCache::loading`, waited for up to 60 s)
//!   lasts the load, with the store's directory `flock`s (`read_lock`, the recovery
//!   hook's) inside it; no view lock is taken under these.
//!
//! Nothing waits for the kernel under a lock: `Writer::invalidate` only queues, and
//! `fuse` calls the `Writer::settle_*` waits after the view's call returned. Locks
//! inside the store backends and the compactor are not covered (not verified).

mod adopt;
mod array_load;
mod as_written;
mod attr;
pub mod cache;
mod close;
mod commit;
pub mod container;
mod draft;
mod durable;
mod error;
mod group_docs;
mod handles;
mod inode;
mod kept;
mod kernel_held;
mod kernel_writes;
mod key_dirs;
mod key_listing;
mod landed;
mod listing;
mod meta;
pub mod node;
mod open;
mod open_policy;
mod ops;
mod overlay_read;
mod own_files;
mod path_sets;
mod pending_doc;
mod plain;
mod read;
mod read_ahead;
mod readdir;
mod reconcile;
mod remove;
mod rename;
mod rename_dir;
mod resolve;
mod scratch;
mod set_times;
mod stats;
mod unlinked;
mod writer;

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;

use crate::format::{self, ChunkRange};
use crate::store::shard::{Shard, ShardCache};
use crate::store::{Capabilities, Commits, EntryKind, EntryMeta, SpaceInfo, Store, StoreFile};
pub use error::{Result, ViewError};
pub use inode::ROOT_INO;
pub use kernel_writes::{
    KERNEL_UNLINKED_IDLE, KERNEL_UNLINKED_KEPT, KERNEL_WRITE_IDLE, KernelCommit,
};
pub use node::{Attr, DirEntry, Kind, MetaFile, Node, ShardedArray, ViewFormat};
pub use open_policy::OpenPolicy;
pub use writer::{WriteConfig, Writer};
/// The write side's types, for the mount.
pub mod write_api {
    pub use super::writer::{Invalidation, WriteConfig, Writer, Writing};
}

/// The hidden file at the mount's root that `shardfs stats` reads.
pub const STATS_FILE: &str = ".shardfs-stats";

/// Largest `zarr.json` the view parses; a bigger one passes through unparsed.
const MAX_METADATA_BYTES: u64 = 16 << 20;

/// Tunables of a view.
#[derive(Clone, Debug)]
pub struct ViewConfig {
    /// Most shards whose index is kept decoded.
    pub max_cached_shards: usize,
    /// About this many bytes of decoded indices are kept.
    pub index_cache_bytes: usize,
    /// Zarr v3 or Zarr v2.
    pub format: ViewFormat,
    /// How long the kernel may cache entries and attributes, and the view its answers
    /// ([`crate::freshness`]).
    pub freshness: crate::freshness::Freshness,
}

impl Default for ViewConfig {
    fn default() -> Self {
        ViewConfig {
            max_cached_shards: 4096,
            index_cache_bytes: 64 << 20,
            format: ViewFormat::V3,
            freshness: Default::default(),
        }
    }
}

/// An open file. Cheap to clone: reads and writes clone it out of the handle table, so
/// that no I/O happens under the table's lock.
#[derive(Clone)]
enum Handle {
    Store(Arc<dyn StoreFile>),
    /// A store file open for writing (outside arrays' key namespaces).
    StoreRw(Arc<dyn crate::store::StoreFileRw>, PathBuf),
    Bytes(Arc<Vec<u8>>),
    Chunk {
        shard: Arc<Shard>,
        range: ChunkRange,
    },
    /// An in-memory file. `writes`: opened for writing (or created); the close of a
    /// handle opened only to read commits nothing, as a plain file's would not.
    Scratch {
        ino: u64,
        node: Node,
        file: Arc<Mutex<scratch::Scratch>>,
        writes: bool,
    },
    /// Writes accepted and let go: `.zmetadata` of the v2 view, which the view makes
    /// from the hierarchy below this directory (and reads serve).
    Discard(PathBuf),
}

/// Where a chunk's bytes are now.
enum ChunkData {
    Shard(Arc<Shard>, ChunkRange),
    Staged(Arc<Vec<u8>>),
}

impl ChunkData {
    fn len(&self) -> u64 {
        match self {
            ChunkData::Shard(_, r) => r.nbytes,
            ChunkData::Staged(b) => b.len() as u64,
        }
    }
}

/// What `open` tells the adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    pub fh: u64,
    /// The kernel may keep cached pages of this file from an earlier open.
    pub keep_cache: bool,
    /// Closing this handle commits nothing ([`View::flush_handle`] would do nothing), so
    /// the kernel need not send a flush at every `close` (`FOPEN_NOFLUSH`).
    pub no_flush: bool,
    /// The file's size differs from the one in the attributes the kernel holds (changed
    /// outside the mount since): they must be invalidated before the open returns, or
    /// reads would stop at the old size.
    pub stale_size: bool,
}

/// How many refused commits `shardfs stats` keeps (`refused`), the latest.
pub const REFUSALS_KEPT: usize = 16;

/// What a [`View::rename`] shows at the new name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renamed {
    /// Exactly the bytes of the file that was moved (a temporary file moved onto a chunk
    /// key): pages the kernel holds of it stay right.
    AsWritten,
    /// Maybe other bytes (metadata is taken in, and the v2 view generates its own).
    Other,
}

/// The virtual tree over a store: a facade over its three parts, the [`Tree`] (what a
/// name is), the overlay (`writer`: what this mount changed) and the open files
/// (`open`).
pub struct View {
    /// What a name is: inodes, resolution, the array registry, listings, caches.
    tree: Tree,
    /// The open files: handles, and those held for writes through descriptors the
    /// kernel opened.
    open: handles::OpenFiles,
    /// The overlay, what this mount changed; `None` for a read-only view.
    writer: Option<Writer>,
    counters: Counters,
}

/// The tree: what a name is. It reads the overlay (passed in where needed) and never
/// writes it; its parts own their state behind methods.
pub(crate) struct Tree {
    store: Arc<dyn Store>,
    /// What the store is ([`Store::capabilities`]), asked once.
    caps: Capabilities,
    /// Path resolution: inode numbers and the nodes they stand for.
    inodes: inode::InodeTable,
    /// The array registry (see [`resolve::ArrayRegistry`]).
    arrays: resolve::ArrayRegistry,
    /// Decoded shard indices.
    shards: Arc<ShardCache>,
    /// Loading ahead of readers (the next shards, a listing's indexes).
    ahead: read_ahead::ReadAhead,
    /// What the kernel may cache, and for how long.
    cache: cache::CachePolicy,
    format: ViewFormat,
    /// The hierarchy of a store of the 2022 draft layout.
    draft: Option<draft::DraftState>,
    /// The v2 view: chunks of the fill value of unsharded arrays.
    plain_fills: plain::PlainFills,
    /// Group documents as stored and as the v3 view shows them.
    group_docs: group_docs::GroupDocs,
    /// The blosc containers met so far (`container`).
    containers: container::Containers,
    /// The store's directories and files of their own in arrays' key directories.
    own: own_files::OwnFiles,
    /// Store directories whose kept document (`store::UNLINKED_META`) a query found
    /// older than the metadata beside it, with that document's version: removed by the
    /// overlay once the query is answered, if it is still so (`Overlay::in_tree`).
    stale_kept: Mutex<Vec<(PathBuf, Version)>>,
}

impl Tree {
    /// The tree of `store`, its caches empty, its root not yet classified.
    fn new(
        store: Arc<dyn Store>,
        config: &ViewConfig,
        caps: Capabilities,
        shards: Arc<ShardCache>,
    ) -> Tree {
        Tree {
            caps,
            ahead: read_ahead::ReadAhead::new(store.clone(), shards.clone()),
            shards,
            inodes: inode::InodeTable::new(Node::Dir {
                rel: PathBuf::new(),
            }),
            cache: cache::CachePolicy::new(config.freshness),
            arrays: Default::default(),
            format: config.format,
            draft: None,
            plain_fills: Default::default(),
            group_docs: group_docs::GroupDocs::new(store.clone(), config.format),
            containers: container::Containers::new(store.clone(), config.format),
            own: own_files::OwnFiles::new(store.clone()),
            stale_kept: Mutex::new(Vec::new()),
            store,
        }
    }
}

/// A store file's version ([`crate::store::EntryMeta::version`]).
type Version = (u64, u64, std::time::SystemTime);

/// The tree as this mount shows it: the [`Tree`] and the overlay, read (a tree query
/// never changes what the mount changed). Made per call by [`View::tree_read`].
#[derive(Clone, Copy)]
pub(crate) struct TreeRead<'a> {
    tree: &'a Tree,
    /// What this mount changed, read only; `None` on a read-only mount.
    overlay: Option<overlay_read::OverlayRead<'a>>,
}

/// The overlay at work: what this mount changed (the [`Writer`] and its owners), with the
/// tree as this mount shows it. Made per call by [`View::overlay`], on a writable view
/// only. Its methods change the overlay (and the tree's caches and inodes that a change
/// makes stale), reconciling it with the store where a tree query finds it stale
/// ([`Overlay::in_tree`]); they cannot reach the open files (but to have the writes they
/// gathered committed: [`GatheredWrites`]): where an operation needs them, the facade
/// (`View`) does that part and asks the overlay for the rest.
#[derive(Clone, Copy)]
pub(crate) struct Overlay<'a> {
    tree: &'a Tree,
    w: &'a Writer,
    counters: &'a Counters,
    /// Who opens files, decided at the mount's `init` (a copy per call).
    policy: OpenPolicy,
    /// The writes the open files gathered, committed on demand (the facade).
    gathered: &'a dyn GatheredWrites,
}

/// The one thing the overlay asks of the open files, through the facade that has them:
/// commit the writes gathered from descriptors the kernel opened that are settled
/// (`View::commit_kernel_writes`), before a change that moves or replaces what they
/// were written to (a directory becoming an array, a directory renamed, an array's
/// metadata unlinked). The overlay cannot reach the open files otherwise.
pub(crate) trait GatheredWrites {
    fn commit_settled(&self) -> Result<()>;
}

impl GatheredWrites for View {
    fn commit_settled(&self) -> Result<()> {
        self.commit_kernel_writes(KernelCommit::Settled { except: None })
    }
}

/// Where an array lives in the store.
pub(crate) struct ArraySource {
    rel: PathBuf,
    data_rel: PathBuf,
    meta_rel: PathBuf,
    store_keys: format::ChunkKeyEncoding,
    draft: bool,
}

/// What the view did, for `shardfs stats`.
#[derive(Default)]
struct Counters {
    /// Commits that no request waited for and that were refused.
    refused: stats::Refusals,
    /// File reads the daemon answered (chunks, staged or stored, metadata, files).
    read_requests: AtomicU64,
    chunk_opens: AtomicU64,
    chunk_reads: AtomicU64,
    chunk_bytes_read: AtomicU64,
    chunks_committed: AtomicU64,
    chunks_deleted: AtomicU64,
}

impl View {
    pub fn new(store: Arc<dyn Store>, config: ViewConfig) -> io::Result<View> {
        Self::with_writer(store, config, None)
    }

    /// A view that accepts writes through `writer`.
    pub fn with_writer(
        store: Arc<dyn Store>,
        config: ViewConfig,
        writer: Option<Writer>,
    ) -> io::Result<View> {
        let root_meta = store
            .stat(Path::new(""))?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "store root vanished"))?;
        let entry = resolve::read_small(store.as_ref(), Path::new("zarr.json"))
            .ok()
            .flatten();
        let draft = entry.is_some_and(|b| format::draft::is_entry_point(&b));
        let mut writer = writer;
        if draft && writer.take().is_some() {
            log::warn!(
                "the store has the 2022 draft layout: it is mounted read-only (writes fail with EROFS)"
            );
        }
        let caps = store.capabilities();
        let mut shards = ShardCache::new(config.max_cached_shards, config.index_cache_bytes);
        // A writable view recovers a shard's interrupted update before it reads the index
        // (the mount walks the store for leftovers only in the background). A read-only
        // view changes nothing: it reads a torn shard as it was before the update.
        if !draft && let Commits::Append(records) = &caps.commits {
            shards.set_load_hook(records.load_hook(writer.is_some(), store.clone())?);
        }
        let shards = Arc::new(shards);
        let mut view = View {
            tree: Tree::new(store, &config, caps, shards),
            open: Default::default(),
            writer,
            counters: Counters::default(),
        };
        if draft {
            let tree = view.tree_read().load_draft_tree();
            log::info!(
                "store of the 2022 draft layout: {} arrays, {} groups (read-only)",
                tree.arrays.len(),
                tree.groups.len()
            );
            view.tree.draft = Some(draft::DraftState::new(tree));
            view.tree.inodes.update(
                ROOT_INO,
                Node::DraftGroup {
                    path: PathBuf::new(),
                },
            );
            return Ok(view);
        }
        let root = match view
            .classify_dir(PathBuf::new(), root_meta)
            .map_err(|e| io::Error::from_raw_os_error(e.errno()))?
        {
            // The store itself a bcolz rootdir.
            Node::Dir { rel } => view
                .tree
                .containers
                .dir(&rel, &root_meta)
                .ok()
                .flatten()
                .unwrap_or(Node::Dir { rel }),
            root => root,
        };
        view.tree.inodes.update(ROOT_INO, root);
        Ok(view)
    }

    /// The tree with the overlay, for the queries that read both.
    fn tree_read(&self) -> TreeRead<'_> {
        TreeRead {
            tree: &self.tree,
            overlay: self.writer.as_ref().map(overlay_read::OverlayRead::new),
        }
    }

    /// The overlay, with the tree as this mount shows it (`ReadOnly` on a read-only view).
    fn overlay(&self) -> Result<Overlay<'_>> {
        self.overlay_opt().ok_or(ViewError::ReadOnly)
    }

    /// The overlay, `None` on a read-only view.
    fn overlay_opt(&self) -> Option<Overlay<'_>> {
        Some(Overlay {
            tree: &self.tree,
            w: self.writer.as_ref()?,
            counters: &self.counters,
            policy: self.open_policy(),
            gathered: self,
        })
    }

    /// Whether the store has the 2022 draft layout.
    pub fn is_draft(&self) -> bool {
        self.tree.draft.is_some()
    }

    /// Whether the view refuses writes (a read-only mount, or a draft store).
    pub fn is_read_only(&self) -> bool {
        self.writer.is_none()
    }

    /// What the kernel may cache, and for how long.
    pub fn cache(&self) -> &cache::CachePolicy {
        &self.tree.cache
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.tree.store
    }

    /// Number of inodes the kernel currently holds.
    pub fn live_inodes(&self) -> usize {
        self.tree.inodes.len()
    }
}

impl<'a> Overlay<'a> {
    /// The tree with the overlay, for the tree's queries.
    fn tree_read(&self) -> TreeRead<'a> {
        TreeRead {
            tree: self.tree,
            overlay: Some(overlay_read::OverlayRead::new(self.w)),
        }
    }
}

impl Tree {
    /// A small store file (metadata), `None` if absent.
    fn read_small(&self, rel: &Path) -> io::Result<Option<Vec<u8>>> {
        resolve::read_small(self.store.as_ref(), rel)
    }

    fn node(&self, ino: u64) -> Result<(PathBuf, Node)> {
        self.inodes.get(ino).ok_or(ViewError::StaleInode(ino))
    }
}
