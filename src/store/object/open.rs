//! Opening an object for reading ([`BucketStore::open_fetching`]): its HEAD, or its
//! first or last bytes in the same request; a small metadata document's body kept for
//! an open again within the TTL; the local cache's part; the open object's read-ahead
//! state.

use std::io;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use super::read::{ObjectFile, ReadAhead};
use super::{BucketStore, client, meta};
use crate::store::{Prefetch, StoreFile};

impl BucketStore {
    /// [`crate::store::Store::open`], with `with` of its bytes fetched in the same request when its
    /// HEAD is not known (else a HEAD, and the bytes when read): with a local cache too
    /// (its HEAD's ETag finds the bytes kept there), nor during an outage. The start of
    /// a shard loaded ahead only while the budget has room for it in its half kept for
    /// loads ahead ([`ObjectFile::warm`](super::read)).
    pub(super) fn open_fetching(
        &self,
        rel: &Path,
        with: Option<Prefetch>,
    ) -> io::Result<Option<Box<dyn StoreFile>>> {
        let with = with.filter(|_| {
            self.disk.is_none()
                && self.meta.fresh(&self.meta.heads, rel).is_none()
                && !self.listed_absent(rel)
                && !self.deadline.outage()
        });
        // The start of a shard loaded ahead: reserved in the budget's half for loads
        // ahead before it is asked for (given back if it does not come).
        let mut reserved = None;
        let range = with.and_then(|w| match w {
            Prefetch::Start(n) if n > client::METADATA_PREFIX => {
                reserved = Some(self.budget.reserve_ahead(n)?);
                Some(object_store::GetRange::Bounded(0..n))
            }
            Prefetch::Start(n) => Some(object_store::GetRange::Bounded(0..n)),
            Prefetch::End(n) => Some(object_store::GetRange::Suffix(n)),
        });
        let generation = self.meta.generation();
        let mut start = match range {
            Some(range) => match self.get_range(rel, range) {
                Ok(Some(got)) => Some(got),
                Ok(None) => return Ok(None),
                // An empty object has no range to give (416): asked as any other.
                Err(_) => None,
            },
            None => None,
        };
        let meta = match &start {
            Some((meta, _)) => meta.clone(),
            None => match self.head(rel)? {
                Some(meta) => meta,
                None => return Ok(None),
            },
        };
        if client::is_metadata(rel) {
            start = self.metadata_body(rel, start, &meta, generation);
        }
        let file = self.object_file(rel, meta)?;
        if let Some((meta, bytes)) = start {
            let at = match with {
                Some(Prefetch::End(_)) => meta.size.saturating_sub(bytes.len() as u64),
                _ => 0,
            };
            match reserved {
                Some(reserved) => file.hold_reserved(at, bytes, reserved),
                None => file.hold_piece(at, bytes),
            }
        }
        Ok(Some(Box::new(file)))
    }

    /// A metadata document's bytes at its open: a small one fetched whole (`start`) is
    /// kept for an open again within the TTL; one opened again while its HEAD answer is
    /// fresh is served from what was kept, if it is the same version, with no GET.
    fn metadata_body(
        &self,
        rel: &Path,
        mut start: Option<(object_store::ObjectMeta, bytes::Bytes)>,
        meta: &object_store::ObjectMeta,
        generation: u64,
    ) -> Option<(object_store::ObjectMeta, bytes::Bytes)> {
        match &start {
            // A small document fetched whole: kept for an open again within the TTL.
            Some((m, bytes)) if bytes.len() as u64 == m.size && bytes.len() <= meta::BODY_BYTES => {
                if self.meta.bodies.lock().len() >= meta::BODIES {
                    self.meta.bodies.lock().clear();
                }
                let body = (m.e_tag.clone(), bytes.clone());
                self.meta.keep(&self.meta.bodies, rel, body, generation);
            }
            // Opened again while its HEAD answer is fresh: the same version's bytes,
            // if kept, need no GET.
            None => {
                start = self
                    .meta
                    .usable(&self.meta.bodies, rel, self.deadline.outage())
                    .filter(|(etag, b)| *etag == meta.e_tag && b.len() as u64 == meta.size)
                    .map(|(_, b)| (meta.clone(), b));
            }
            _ => {}
        }
        start
    }

    /// The file of the version `meta` of object `rel`, holding nothing yet.
    pub(super) fn object_file(
        &self,
        rel: &Path,
        meta: object_store::ObjectMeta,
    ) -> io::Result<ObjectFile> {
        let key = self.key(rel)?;
        let disk = self
            .disk
            .clone()
            .map(|d| (d, format!("{}/{key}", self.scope)));
        let disk_whole = match (&disk, &meta.e_tag) {
            (Some((d, name)), Some(etag)) => d.holds(name, etag, 0..meta.size),
            _ => false,
        };
        Ok(ObjectFile {
            disk,
            disk_whole,
            store: self.inner.clone(),
            handle: self.rt.handle().clone(),
            key,
            meta,
            ahead: Arc::new(Mutex::new(ReadAhead::default())),
            ahead_done: Arc::new(parking_lot::Condvar::new()),
            budget: self.budget.clone(),
            counters: self.counters.clone(),
            meta_cache: self.meta.clone(),
            rel: rel.to_path_buf(),
            deadline: self.deadline.clone(),
        })
    }
}
