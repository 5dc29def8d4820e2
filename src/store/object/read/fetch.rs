//! Ranged GETs of the version an object was opened at: what the local cache holds of it
//! first, the rest all in flight at once, each answer counted and kept in the local
//! cache. Not what to fetch (the read-ahead policy, `read`).

use std::io;
use std::path::Path;

use object_store::{GetOptions, GetRange};

use super::ObjectFile;
use crate::store::object::client::{timed, to_io};

impl ObjectFile {
    /// `range` of the object, as the version this file was opened at.
    pub(in crate::store::object) fn fetch(
        &self,
        range: std::ops::Range<u64>,
    ) -> io::Result<bytes::Bytes> {
        let start = range.start;
        let mut got = self.fetch_pieces(std::slice::from_ref(&range))?;
        Ok(got.pop().map_or_else(bytes::Bytes::new, |(s, b)| {
            debug_assert_eq!(s, start);
            b
        }))
    }

    /// `ranges` of the object, as the version this file was opened at: one GET each, all
    /// in flight at once.
    pub(in crate::store::object) fn fetch_pieces(
        &self,
        ranges: &[std::ops::Range<u64>],
    ) -> io::Result<Vec<(u64, bytes::Bytes)>> {
        use std::sync::atomic::Ordering::Relaxed;
        // What the local cache holds of this version needs no request.
        let cache = self.disk.as_ref().zip(self.meta.e_tag.as_deref());
        let mut pieces = Vec::with_capacity(ranges.len());
        let mut wanted = Vec::with_capacity(ranges.len());
        for range in ranges {
            match cache.and_then(|((disk, name), etag)| disk.get(name, etag, range.clone())) {
                Some(bytes) => pieces.push((range.start, bytes)),
                None => wanted.push(range.clone()),
            }
        }
        if wanted.is_empty() {
            return Ok(pieces);
        }
        let ranges = &wanted[..];
        let got = self.get_all(ranges);
        let mut failed = None;
        for (range, got) in ranges.iter().zip(got) {
            let got = got.unwrap_or_else(|join| {
                Err(object_store::Error::Generic {
                    store: "S3",
                    source: Box::new(join),
                })
            });
            self.deadline.note(&got);
            match got {
                Ok(bytes) => {
                    self.counters.gets.fetch_add(1, Relaxed);
                    self.counters
                        .get_bytes
                        .fetch_add(bytes.len() as u64, Relaxed);
                    if let Some(((disk, name), etag)) = cache {
                        disk.put(name, etag, range.start, &bytes);
                    }
                    pieces.push((range.start, bytes));
                }
                Err(e) => {
                    if let object_store::Error::Precondition { .. }
                    | object_store::Error::NotFound { .. } = &e
                    {
                        self.meta_cache.forget(&self.rel);
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(to_io(Path::new(self.key.as_ref()), e)),
            None => {
                pieces.sort_by_key(|(start, _)| *start);
                Ok(pieces)
            }
        }
    }

    /// One GET of each of `ranges`, all in flight at once (each within the deadline's
    /// allowance); the answers in the order of `ranges`.
    fn get_all(
        &self,
        ranges: &[std::ops::Range<u64>],
    ) -> Vec<Result<object_store::Result<bytes::Bytes>, tokio::task::JoinError>> {
        let allowed = self.deadline.allowance();
        let gets: Vec<_> = ranges
            .iter()
            .map(|range| {
                let (store, key) = (self.store.clone(), self.key.clone());
                let opts = GetOptions {
                    range: Some(GetRange::Bounded(range.clone())),
                    if_match: self.meta.e_tag.clone(),
                    ..Default::default()
                };
                let (limit, allowed) = (self.deadline.limit, allowed);
                log::debug!("GET {} bytes {}..{}", self.key, range.start, range.end);
                self.handle.spawn(async move {
                    let get = async { store.get_opts(&key, opts).await?.bytes().await };
                    timed(limit, allowed, get).await
                })
            })
            .collect();
        self.handle.block_on(async {
            let mut out = Vec::with_capacity(gets.len());
            for get in gets {
                out.push(get.await);
            }
            out
        })
    }
}
