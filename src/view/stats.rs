//! What `shardfs stats` reads: the JSON of the hidden stats file at the mount's root
//! ([`super::STATS_FILE`]), made of the view's counters (`Counters`, kept in the
//! [`View`]) and of the write side's (staging, flushes, compaction). The counters
//! are counted where the reads, opens and commits happen; only their sum is made here.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Overlay;
use super::{View, Writer};

/// Commits that no request waited for and that were refused (when idle, before a rename,
/// a full buffer; chunks staged for an array another mount replaced): the file's path and
/// why, the latest [`super::REFUSALS_KEPT`], for `shardfs stats` and the unmount's report.
#[derive(Default)]
pub(super) struct Refusals(parking_lot::Mutex<std::collections::VecDeque<(String, String)>>);

impl Refusals {
    /// `path` was refused for `why` (the oldest refusal goes if there are too many).
    pub(super) fn push(&self, path: String, why: String) {
        let mut kept = self.0.lock();
        if kept.len() == super::REFUSALS_KEPT {
            kept.pop_front();
        }
        kept.push_back((path, why));
    }

    /// `path` was stored since: an earlier refusal of it is no longer true.
    pub(super) fn forget(&self, path: &str) {
        let mut kept = self.0.lock();
        if !kept.is_empty() {
            kept.retain(|(p, _)| p != path);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.lock().is_empty()
    }

    fn to_json(&self) -> Vec<serde_json::Value> {
        let kept = self.0.lock();
        kept.iter()
            .map(|(path, why)| serde_json::json!({"path": path, "why": why}))
            .collect()
    }
}

/// The stats file's size is a multiple of this.
const STATS_PAGE: usize = 4096;

impl View {
    /// The counters `shardfs stats` shows, as JSON.
    pub fn stats_json(&self) -> Vec<u8> {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut v = serde_json::json!({
            "store": self.tree.store.describe(),
            "inodes": self.tree.inodes.len(),
            "read_requests": get(&c.read_requests),
            "refused": c.refused.to_json(),
            "pending_metadata": self.open.partial_metadata_paths(self.tree_read()),
            "pending_chunks": self.open.partial_chunk_paths(self.tree_read()),
            "chunk_opens": get(&c.chunk_opens),
            "chunk_reads": get(&c.chunk_reads),
            "chunk_bytes_read": get(&c.chunk_bytes_read),
            "index_cache_hits": get(&self.tree.shards.hits),
            "index_cache_misses": get(&self.tree.shards.misses),
            "shards_loaded_ahead": get(&self.tree.shards.prefetches),
            "chunks_committed": get(&c.chunks_committed),
            "chunks_deleted": get(&c.chunks_deleted),
        });
        let requests = self.tree.store.requests();
        if !requests.is_empty() {
            v["store_requests"] = requests
                .into_iter()
                .map(|(k, n)| (k.to_string(), n.into()))
                .collect::<serde_json::Map<_, _>>()
                .into();
        }
        if let Some(w) = &self.writer {
            self.write_side_stats(w, &mut v);
        } else {
            v["writable"] = false.into();
        }
        let mut out = serde_json::to_vec_pretty(&v).expect("JSON of a JSON value");
        // Padded with blanks to a whole number of pages: the size the kernel learns from
        // one look stays right for the next one's content, whatever the counters say.
        out.resize((out.len() + 1).next_multiple_of(STATS_PAGE) - 1, b' ');
        out.push(b'\n');
        out
    }

    /// The write side's part of [`View::stats_json`]: staging, flushes, compaction.
    fn write_side_stats(&self, w: &Writer, v: &mut serde_json::Value) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let f = &w.flusher().counters;
        let flushes = get(&f.flushes);
        v["writable"] = true.into();
        v["compactor"] = w.compactor_name().into();
        v["staged_bytes"] = w.staged_bytes().into();
        v["flushes"] = flushes.into();
        v["chunks_flushed"] = get(&f.chunks).into();
        v["bytes_flushed"] = (get(&f.host_bytes) + get(&f.device_bytes)).into();
        v["shard_updates"] = get(&f.shards).into();
        v["chunks_superseded"] = get(&f.superseded).into();
        v["staged"] = self
            .overlay_opt()
            .map_or(serde_json::Value::Null, |o| o.staged_by_array());
        v["kernel_write_handles"] = self.kernel_write_handles().into();
        v["invalidations_late"] = w.late_invalidations().into();
        v["compaction_seconds"] = ((get(&f.host_ns) + get(&f.device_ns)) as f64 / 1e9).into();
        // Per way of laying out a flush: batches, payload, time, rate.
        let way = |batches: &AtomicU64, bytes: &AtomicU64, ns: &AtomicU64| {
            let (bytes, secs) = (get(bytes), get(ns) as f64 / 1e9);
            serde_json::json!({
                "batches": get(batches),
                "bytes": bytes,
                "seconds": secs,
                "gib_per_s": if secs > 0.0 {
                    (bytes as f64 / (1u64 << 30) as f64 / secs * 100.0).round() / 100.0
                } else {
                    0.0
                },
            })
        };
        v["compaction"] = serde_json::json!({
            "host_planned": way(&f.host_batches, &f.host_bytes, &f.host_ns),
            "device_packed": way(&f.device_batches, &f.device_bytes, &f.device_ns),
            "auto": w.flusher().compactor_description(),
        });
        v["flush_seconds"] = (get(&f.flush_ns) as f64 / 1e9).into();
        v["mean_flush_latency_ms"] = if flushes > 0 {
            (get(&f.flush_ns) as f64 / 1e6 / flushes as f64).into()
        } else {
            0.0.into()
        };
    }
}

impl Overlay<'_> {
    /// What is staged and not yet in the store, by array: what an unmount that cannot
    /// flush names (`shardfs unmount`).
    fn staged_by_array(&self) -> serde_json::Value {
        let w = self.w;
        w.staging
            .arrays(None)
            .into_iter()
            .filter_map(|rel| {
                let array = self.tree.arrays.get(&rel)?;
                let chunks = w.staging.under(&rel, &[]);
                let enc = array.encoding();
                let keys: Vec<String> = chunks.iter().take(8).map(|(c, _)| enc.encode(c)).collect();
                Some(serde_json::json!({
                    "array": rel.display().to_string(),
                    "chunks": chunks.len(),
                    "first_keys": keys,
                }))
            })
            .collect::<Vec<_>>()
            .into()
    }
}
