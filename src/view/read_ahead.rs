//! Loading ahead of readers: the next shards of a reader going forward through an
//! array (their indexes and bytes, in the background), and on object storage the indexes
//! of the shards a listing is about to read. A part of the tree that owns this policy
//! over the shard cache; the view tells it of each chunk opened and each listing
//! (issue 35: as mountpoint-s3 keeps its prefetcher apart).

use std::sync::Arc;

use crate::format::ChunkRange;
use crate::store::shard::{Shard, ShardCache};
use crate::store::{Reads, Store};

use super::ShardedArray;

/// How many shards after one read forward are loaded ahead.
const SHARDS_AHEAD: usize = 3;

/// The read-ahead policy of a view.
pub(super) struct ReadAhead {
    store: Arc<dyn Store>,
    shards: Arc<ShardCache>,
    /// The store answers by request (object storage): listings load indexes ahead, and
    /// an array's first chunk starts a pass.
    by_request: bool,
}

impl ReadAhead {
    pub(super) fn new(store: Arc<dyn Store>, shards: Arc<ShardCache>) -> ReadAhead {
        ReadAhead {
            by_request: store.capabilities().reads == Reads::Requests,
            store,
            shards,
        }
    }

    /// A reader going forward through a shard's file (a second chunk of it opened, at
    /// `offset`, or object storage's read-ahead says so) most likely goes on into the next shards in C
    /// order, as readers of chunk files in key order and zarr-python do: the
    /// [`SHARDS_AHEAD`] shards after this one are loaded in the background, side by
    /// side, each its index and (up to 8 MiB of) its bytes in one request, while this
    /// one is read (a reader of chunk files in key order goes through a row of every
    /// shard of a row of shards before it comes back to this one).
    ///
    /// The array's first chunk (all its coordinates 0) opened on object storage counts
    /// as such a reader's start (`cp -r`, zarr-python 2 and readers of the chunk files
    /// in key order start there): the rest of its shard is fetched in the background,
    /// beside the chunk its reader fetches, and the next shards are loaded ahead at once,
    /// not at the second chunk's open (issue 34: a round trip less in series before the
    /// data flows). So does the first chunk opened of a shard whose shard before was read
    /// through ([`ReadAhead::after_read_through`]). Bounded: at most [`SHARDS_AHEAD`] + 1
    /// shards, within the half of the read-ahead budget kept for loads ahead, once per
    /// pass over the shard (a second pass over an array once the kernel dropped its
    /// pages loads ahead as the first did). The cost: after a whole pass, a reader that
    /// goes on to read a few chunks here and there has their shards claimed and loaded
    /// ahead as a reader going through would (a shard before them was read through),
    /// within the same bounds.
    pub(super) fn after_open(
        &self,
        array: &Arc<ShardedArray>,
        coords: &[u64],
        shard: &Arc<Shard>,
        range: ChunkRange,
    ) {
        // The claim's flag first: after the first time in a pass over the shard, this
        // is an atomic load and a lock of its file's read-ahead per open.
        if shard.claimed_this_pass() {
            return;
        }
        let requests = self.by_request;
        let start =
            requests && (coords.iter().all(|&c| c == 0) || self.after_read_through(array, coords));
        if !(start || (requests && shard.opened_another(range.offset)) || shard.streaming())
            || !shard.claim_next()
        {
            return;
        }
        if start {
            self.shards
                .fetch_rest(shard, range.offset..range.offset + range.nbytes);
        }
        let Some(loc) = array.layout.locate(coords) else {
            return;
        };
        let counts = array.layout.shard_counts();
        let mut next = loc.shard;
        'ahead: for _ in 0..SHARDS_AHEAD {
            let mut d = next.len();
            loop {
                let Some(prev) = d.checked_sub(1) else {
                    break 'ahead; // past the last shard
                };
                d = prev;
                next[d] += 1;
                if next[d] < counts[d] {
                    break;
                }
                next[d] = 0;
            }
            let rel = array.shard_rel(&next);
            // Read through more often than this one: its reader went through it in
            // this sweep already (backwards, or in another order), so it is not loaded
            // again (a reader of the array in reverse key order moved 1.5 times its
            // bytes; found by an adversarial tester).
            if self
                .shards
                .peek(&rel)
                .is_some_and(|s| s.pass() > shard.pass())
            {
                continue;
            }
            self.shards
                .prefetch(self.store.clone(), rel, array.layout.clone());
        }
    }

    /// Whether the shard before that of chunk `coords` (in C order) is cached and was
    /// read through (it claimed the next shards): a reader that went through it (zarr-python
    /// opening the chunks of several shards side by side) loaded this one itself, by its
    /// index alone, before the load ahead came for it; its first chunk's open then starts
    /// the rest of it, as the array's first chunk does, not the second chunk's read.
    fn after_read_through(&self, array: &ShardedArray, coords: &[u64]) -> bool {
        let Some(loc) = array.layout.locate(coords) else {
            return false;
        };
        let counts = array.layout.shard_counts();
        let mut prev = loc.shard;
        let mut d = prev.len();
        loop {
            let Some(p) = d.checked_sub(1) else {
                return false; // the first shard
            };
            d = p;
            if prev[d] > 0 {
                prev[d] -= 1;
                break;
            }
            prev[d] = counts[d].saturating_sub(1);
        }
        self.shards
            .peek(&array.shard_rel(&prev))
            .is_some_and(|s| s.next_claimed())
    }

    /// On object storage, the indexes of the `shards` a listing is about to read (when
    /// more than one) are loaded side by side in the background, so that the listing's
    /// reads of them one after another mostly wait for requests already in flight
    /// (`ls -l` and `cp -r` of an array at 30 ms a request: one round trip or two per
    /// shard, one after another, otherwise). Their chunks are not fetched.
    pub(super) fn indexes(&self, array: &ShardedArray, shards: Vec<Vec<u64>>) {
        if shards.len() < 2 || !self.by_request {
            return;
        }
        for s in shards {
            self.shards.prefetch_index(
                self.store.clone(),
                array.shard_rel(&s),
                array.layout.clone(),
            );
        }
    }
}
