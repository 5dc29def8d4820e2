//! The merge rule, the one place it lives: **last close wins, per chunk**. Every store's
//! shard commit calls it with the shard as the commit found it (`store::ShardSnapshot`),
//! so the rule holds whatever order mounts flush in and whichever store they share.
//!
//! A staged change of a slot stands if it was closed no earlier than the change the
//! shard records for that slot (its close time, `format::times`); otherwise a write
//! closed later already reached the shard, from this mount or another one, and the staged
//! change is dropped. A slot with no recorded time (written by another tool, or before
//! close times existed) counts as older than any staged change. Deletions are changes
//! like writes: a delete closed later than a write wins over it, and the other way round.

use crate::store::{ShardSnapshot, SlotChange};

/// The changes of `staged` that stand against the shard `found`.
pub fn last_close_wins<'a>(
    found: &ShardSnapshot<'_>,
    staged: &[SlotChange<'a>],
) -> Vec<SlotChange<'a>> {
    staged
        .iter()
        .filter(|c| c.closed >= found.times.get(c.slot))
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{CloseTimes, ShardIndex};

    fn change(slot: usize, data: Option<&'static [u8]>, closed: u64) -> SlotChange<'static> {
        SlotChange { slot, data, closed }
    }

    #[test]
    fn a_change_closed_before_the_stored_one_is_dropped() {
        let index = ShardIndex::empty(4);
        let times = CloseTimes::from_vec(vec![0, 10, 20, 30]);
        let found = ShardSnapshot {
            index: &index,
            times: &times,
            exists: true,
        };
        let staged = [
            change(0, Some(b"a"), 5),  // nothing recorded: stands
            change(1, Some(b"b"), 11), // later: stands
            change(2, Some(b"c"), 19), // earlier: dropped
            change(3, None, 30),       // the same instant: stands (the retry of a commit)
        ];
        let kept = last_close_wins(&found, &staged);
        assert_eq!(kept, [staged[0], staged[1], staged[3]]);
    }
}
