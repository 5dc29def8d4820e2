//! What the store knows of names: HEAD answers and listings, kept for the TTL (the
//! mount's `--ttl`; at most 1 s on a writable mount), and listed keys as names. The
//! LIST itself is a request ([`super::client`]).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path as ObjPath;
use parking_lot::Mutex;

use super::BucketStore;
use crate::store::ListEntry;

/// What HEADs and listings found, used again for a while: one lookup and read of a chunk
/// asks about its shard several times (its attributes, its key directory, the open), and
/// a pass over many chunks asks about one shard for each. This store's own writes and
/// deletes update it at once, and a read that finds its object changed (412) drops the
/// name, so only other writers' changes wait up to the TTL.
pub(super) struct MetaCache {
    pub(super) ttl: Duration,
    pub(super) heads: Timed<Option<object_store::ObjectMeta>>,
    pub(super) children: Timed<bool>,
    pub(super) listings: Timed<Arc<Vec<ListEntry>>>,
    /// Small metadata documents as fetched whole, with their ETag: a document opened
    /// again while its HEAD answer is fresh is read from here (a mount read the root
    /// `zarr.json` twice: for the draft layout, then for the array).
    pub(super) bodies: Timed<(Option<String>, bytes::Bytes)>,
    /// Bumped by every `forget`: an answer asked for before a forget (a listing in
    /// flight while this mount wrote below it) is not kept, so it cannot bring back what
    /// the forget dropped.
    pub(super) forgets: std::sync::atomic::AtomicU64,
}

/// Answers per name, with when they were had.
pub(super) type Timed<T> = Mutex<HashMap<PathBuf, (std::time::Instant, T)>>;

/// Entries kept at most; past that the cache starts again empty.
pub(super) const META_CACHE_ENTRIES: usize = 100_000;
/// Metadata documents kept whole at most, and the largest kept ([`MetaCache::bodies`]).
pub(super) const BODIES: usize = 256;
pub(super) const BODY_BYTES: usize = 64 << 10;
/// HEAD answers taken from one listing at most (a listing of a huge directory would
/// otherwise push everything else out of the cache).
pub(super) const LISTED_HEADS: usize = 10_000;

impl MetaCache {
    pub(super) fn new(ttl: Duration) -> Self {
        MetaCache {
            ttl,
            heads: Mutex::default(),
            children: Mutex::default(),
            listings: Mutex::default(),
            bodies: Mutex::default(),
            forgets: Default::default(),
        }
    }

    /// Take before asking the store; give to [`MetaCache::keep`] with the answer.
    pub(super) fn generation(&self) -> u64 {
        self.forgets.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(super) fn fresh<T: Clone>(&self, map: &Timed<T>, rel: &Path) -> Option<T> {
        if self.ttl.is_zero() {
            return None;
        }
        let map = map.lock();
        let (at, v) = map.get(rel)?;
        (at.elapsed() < self.ttl).then(|| v.clone())
    }

    /// What was known of `rel`, however long ago (while the endpoint does not answer,
    /// better than nothing: [`BucketStore::head`]).
    pub(super) fn held<T: Clone>(&self, map: &Timed<T>, rel: &Path) -> Option<T> {
        map.lock().get(rel).map(|(_, v)| v.clone())
    }

    /// What may be answered for `rel` without asking: the fresh answer, or during an
    /// `outage` whatever was known (issue 34: what needs no request answers at once).
    pub(super) fn usable<T: Clone>(&self, map: &Timed<T>, rel: &Path, outage: bool) -> Option<T> {
        if outage {
            self.held(map, rel)
        } else {
            self.fresh(map, rel)
        }
    }

    /// Keep `v`, asked for at `generation`, unless something was forgotten since.
    pub(super) fn keep<T>(&self, map: &Timed<T>, rel: &Path, v: T, generation: u64) {
        if self.ttl.is_zero() {
            return;
        }
        let mut map = map.lock();
        // Checked under the map's lock, and `forget` bumps before it takes the lock: an
        // answer kept here before the bump is removed by that forget.
        if self.generation() != generation {
            return;
        }
        if map.len() >= META_CACHE_ENTRIES {
            map.clear();
        }
        map.insert(rel.to_path_buf(), (std::time::Instant::now(), v));
    }

    /// `rel` was written or deleted here (or found changed): forget what was known of it
    /// and of its parents' listings.
    pub(super) fn forget(&self, rel: &Path) {
        self.forgets
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.heads.lock().remove(rel);
        self.bodies.lock().remove(rel);
        let mut children = self.children.lock();
        let mut listings = self.listings.lock();
        for d in rel.ancestors() {
            children.remove(d);
            listings.remove(d);
        }
    }
}

impl BucketStore {
    /// The objects and common prefixes right below `rel`: a listing kept for the TTL,
    /// or a LIST.
    pub(super) fn listing(&self, rel: &Path) -> io::Result<Arc<Vec<ListEntry>>> {
        if let Some(known) = self
            .meta
            .usable(&self.meta.listings, rel, self.deadline.outage())
        {
            return Ok(known);
        }
        if self.listed_absent(rel) {
            return Ok(Arc::default());
        }
        let (listed, generation) = match self.list_objects(rel) {
            Ok(listed) => listed,
            // No answer: what was listed before, however old.
            Err(e) if self.deadline.outage() => {
                return self.meta.held(&self.meta.listings, rel).ok_or(e);
            }
            Err(e) => return Err(e),
        };
        let listed = Arc::new(listed);
        self.meta
            .keep(&self.meta.listings, rel, listed.clone(), generation);
        Ok(listed)
    }

    /// A listing gives each object's size and ETag, as a HEAD would: keep them as the
    /// HEAD answers of those objects, so opening a shard just listed asks nothing more.
    pub(super) fn keep_listed_heads(
        &self,
        rel: &Path,
        key: &ObjPath,
        objects: &[object_store::ObjectMeta],
        generation: u64,
    ) {
        for o in objects.iter().take(LISTED_HEADS) {
            if let Some((name, true)) = name_of(&o.location)
                && o.location != *key
                && o.e_tag.is_some()
            {
                self.meta.keep(
                    &self.meta.heads,
                    &rel.join(name),
                    Some(o.clone()),
                    generation,
                );
            }
        }
    }

    /// Whether a fresh listing of `rel`'s parent has no entry of its name: then no
    /// object has that name and none lies below it (a view of an array asks for files of
    /// their own at every key directory it lists: without this, a LIST and a HEAD each).
    pub(super) fn listed_absent(&self, rel: &Path) -> bool {
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            return false;
        };
        match self
            .meta
            .usable(&self.meta.listings, parent, self.deadline.outage())
        {
            Some(l) => l
                .binary_search_by(|e| e.name.as_os_str().cmp(name))
                .is_err(),
            // Nothing lies below a parent a fresh listing found absent: a writer's files
            // in a key directory it just made (`mkdir -p c/0`, then `c/0/0.<hex>.partial`)
            // need no HEAD and no LIST each.
            None => !parent.as_os_str().is_empty() && self.listed_absent(parent),
        }
    }

    /// Whether any object lies below `rel`.
    pub(super) fn has_children(&self, rel: &Path) -> io::Result<bool> {
        if let Some(known) = self
            .meta
            .usable(&self.meta.children, rel, self.deadline.outage())
        {
            return Ok(known);
        }
        Ok(!self.listing(rel)?.is_empty())
    }
}

/// The key part of the name `n`: the name itself, as other S3 clients (zarr-python,
/// boto3, the AWS CLI) write and read keys. object_store's `PathPart::from` would
/// percent-encode non-ASCII letters and `~`, `#`, `%`, `[`, ... (`ärr` became
/// `%C3%A4rr`): a store made through the mount was then unreadable to other clients,
/// and one they made had names the mount listed but could not find (found by an
/// adversarial tester). A name that can be no key part (one with an ASCII control
/// character) is `None`: refused (`EINVAL`), as no other client would find it.
pub(super) fn key_part(n: &str) -> Option<object_store::path::PathPart<'_>> {
    object_store::path::PathPart::parse(n).ok()
}

/// The last part of a listed `path` as a name, and whether this store reaches the object
/// by that name ([`BucketStore::key`] makes the listed key from it): a key part is shown
/// as it is; one that is no file name (`.`, `..`) is left out.
pub(super) fn name_of(path: &ObjPath) -> Option<(String, bool)> {
    let part = path.filename()?;
    is_file_name(part).then(|| {
        let reached = key_part(part).is_some_and(|k| k.as_ref() == part);
        (part.to_string(), reached)
    })
}

/// Whether `n` can be a name in a directory.
pub(super) fn is_file_name(n: &str) -> bool {
    !n.is_empty() && n != "." && n != ".." && !n.contains(['/', '\0'])
}
