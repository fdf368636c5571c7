//! What this node has seen of other owners' offsets: per partition of a
//! topic incarnation, the highest offset another node assigned (a commit's
//! answer: [`crate::remote_owner`]) or served (an ack forwarded to it),
//! plus one. Node RPC op 40 (KnownOffsets) answers it; `narad cluster
//! remove --force` asks every live member and starts each partition of the
//! removed member above the highest answer (docs/CLUSTER.md, "Removing a
//! node that is gone for good").
//!
//! It is a lower bound of the partition's high watermark on its owner, and
//! only that: records the owner committed that no other node saw (those it
//! accepted itself, from its own WAL) are above it, and a node forgets
//! everything when it restarts. Kept in memory only.
//!
//! One map per process ([`global`]): nodes sharing a process (tests) share
//! it, which only ever raises a bound with offsets that were really
//! assigned.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Serialize};

/// One partition's bound (op 40's answer entries).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownOffset {
    /// The topic.
    pub topic: String,
    /// Its incarnation.
    pub incarnation: u64,
    /// The partition.
    pub partition: u32,
    /// The highest offset seen, plus one.
    pub next_offset: u64,
}

/// Op 40's 200 body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownOffsets {
    /// Every partition this node saw an offset of.
    pub partitions: Vec<KnownOffset>,
}

/// The bounds this process has seen.
#[derive(Debug, Default)]
pub struct OffsetsSeen {
    next: Mutex<BTreeMap<(String, u64, u32), u64>>,
}

impl OffsetsSeen {
    /// `offset` of partition `partition` of `(topic, incarnation)` was
    /// assigned or served by its owner.
    pub fn saw(&self, topic: &str, incarnation: u64, partition: u32, offset: u64) {
        let mut m = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let next = m.entry((topic.to_owned(), incarnation, partition)).or_default();
        *next = (*next).max(offset.saturating_add(1));
    }

    /// Everything seen, in (topic, incarnation, partition) order.
    pub fn known(&self) -> KnownOffsets {
        let m = self.next.lock().unwrap_or_else(|p| p.into_inner());
        KnownOffsets {
            partitions: m
                .iter()
                .map(|((topic, incarnation, partition), next)| KnownOffset {
                    topic: topic.clone(),
                    incarnation: *incarnation,
                    partition: *partition,
                    next_offset: *next,
                })
                .collect(),
        }
    }
}

/// This process's map.
pub fn global() -> &'static OffsetsSeen {
    static SEEN: OnceLock<OffsetsSeen> = OnceLock::new();
    SEEN.get_or_init(OffsetsSeen::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_offset_seen_plus_one_is_kept_per_partition_and_incarnation() {
        let s = OffsetsSeen::default();
        s.saw("t", 3, 0, 10);
        s.saw("t", 3, 0, 4);
        s.saw("t", 3, 1, 0);
        s.saw("t", 9, 0, 2);
        let json = serde_json::to_string(&s.known()).unwrap();
        assert_eq!(
            json,
            r#"{"partitions":[{"topic":"t","incarnation":3,"partition":0,"next_offset":11},{"topic":"t","incarnation":3,"partition":1,"next_offset":1},{"topic":"t","incarnation":9,"partition":0,"next_offset":3}]}"#
        );
        assert_eq!(serde_json::from_str::<KnownOffsets>(&json).unwrap(), s.known());
    }
}
