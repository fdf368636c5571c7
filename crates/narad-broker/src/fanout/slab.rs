//! The slab a fan-out cursor is sending, and how the child's partitions
//! fare for that cursor (issue 34).
//!
//! A cursor reads a slab of parent records once and groups it by child
//! partition once, when it reads it ([`PendingSlab::new`]): a keyed record
//! goes to the partition its key hashes to, a keyless one to the next
//! partition of the cursor's spread. Until every group has committed, the
//! cursor keeps the slab and does not read the parent again. Each pass
//! ([`PendingSlab::plan`]) tries every group still to commit whose child
//! partition is due, all of them, so a failing partition holds back only
//! its own group; a group that committed is never sent again. Only when
//! the last group has committed does the cursor store its position past
//! the slab, so a record reaches the child twice only if the node stops
//! or crashes between a group's commit and that store (or a commit that
//! failed at the sender had landed: the seam every produce commit has).
//!
//! # Invariants
//! * Until its group commits, every record of the slab is in exactly one
//!   group; a group leaves the slab only once its commit answered `Ok`.
//! * A keyed record stays in its key's partition.
//! * The grouping is made once per slab: a retry sends the same group to
//!   the same partition.
//!
//! # Back-off ([`ChildHealth`])
//! Per cursor and child partition: a partition whose commit did not land
//! (or that has no owner) is tried again after [`FANOUT_COMMIT_BACKOFF_MIN`],
//! doubling with each miss in a row up to [`FANOUT_COMMIT_BACKOFF_MAX`];
//! a commit resets it.

use std::sync::Arc;
use std::time::Duration;

use narad_log::LogRecord;
use narad_meta::Topic;

use crate::dispatch::core::OwnerId;
use crate::limits::{FANOUT_COMMIT_BACKOFF_MAX, FANOUT_COMMIT_BACKOFF_MIN};
use crate::owner::{BatchRecord, CommitBatch};
use crate::partition::keyed_partition;

/// The owner of each child partition and whether membership reports it
/// alive (`None`: not assigned), indexed by partition.
pub(crate) type Owners = [Option<(OwnerId, bool)>];

/// A slab read from the parent, grouped for one child, not all committed
/// yet.
#[derive(Debug)]
pub(crate) struct PendingSlab {
    /// The parent offset after the slab: the cursor's position once every
    /// group has committed.
    pub(crate) next_offset: u64,
    /// Records in the slab (for the metrics, once it is all committed).
    pub(crate) records: u64,
    /// Payload bytes in the slab.
    pub(crate) bytes: u64,
    /// The parent commit time of its first record (for the due lag).
    pub(crate) first_commit_time_ms: Option<u64>,
    /// The child incarnation it was grouped for.
    child_incarnation: u64,
    /// Per child partition: the records still to commit there (`None`:
    /// committed, or none).
    groups: Vec<Option<CommitBatch>>,
}

/// What one pass over a pending slab does.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// The groups to commit now: (child partition, its owner, the group).
    pub(crate) tries: Vec<(u32, OwnerId, CommitBatch)>,
    /// Child partitions with records to commit and no owner: they wait.
    pub(crate) unowned: Vec<u32>,
}

impl PendingSlab {
    /// Groups `records` (read from the parent, up to `next_offset`) for
    /// `child`; keyless records take the next partitions of `spread`.
    pub(crate) fn new(
        child: &Topic,
        records: &[LogRecord],
        next_offset: u64,
        spread: &mut u64,
    ) -> PendingSlab {
        let n = child.partitions().max(1);
        let topic: Arc<str> = child.name().into();
        let mut groups: Vec<Option<CommitBatch>> = vec![None; n as usize];
        for r in records {
            let p = match &r.key {
                Some(k) => keyed_partition(k, n),
                None => {
                    *spread = spread.wrapping_add(1);
                    (*spread % u64::from(n)) as u32
                }
            };
            let group = groups[p as usize].get_or_insert_with(|| CommitBatch {
                topic: topic.clone(),
                partition: p,
                records: Vec::new(),
            });
            group.records.push(BatchRecord {
                incarnation: Some(child.incarnation()),
                key: r.key.clone(),
                payload: r.payload.clone(),
                accepted_at_ms: r.commit_time_ms,
            });
        }
        PendingSlab {
            next_offset,
            records: records.len() as u64,
            bytes: records.iter().map(|r| r.payload.len() as u64).sum(),
            first_commit_time_ms: records.first().map(|r| r.commit_time_ms),
            child_incarnation: child.incarnation(),
            groups,
        }
    }

    /// Whether the slab was grouped for `child` as it is now (same
    /// incarnation, same partition count); if not, it must be read and
    /// grouped again.
    pub(crate) fn fits(&self, child: &Topic) -> bool {
        self.child_incarnation == child.incarnation()
            && self.groups.len() == child.partitions().max(1) as usize
    }

    /// The child partitions with records still to commit.
    pub(crate) fn waiting(&self) -> impl Iterator<Item = u32> + '_ {
        self.groups.iter().enumerate().filter(|(_, g)| g.is_some()).map(|(p, _)| p as u32)
    }

    /// The groups to try now: every group still to commit whose partition
    /// is due and has an owner (`owners`, indexed by partition); due ones
    /// without an owner are listed apart.
    pub(crate) fn plan(&mut self, health: &ChildHealth, owners: &Owners, now: Duration) -> Plan {
        let mut plan = Plan::default();
        for (p, group) in self.groups.iter().enumerate() {
            let Some(group) = group.as_ref().filter(|_| health.due(p, now)) else { continue };
            match owners.get(p).copied().flatten() {
                None => plan.unowned.push(p as u32),
                Some((owner, _)) => plan.tries.push((p as u32, owner, group.clone())),
            }
        }
        plan
    }

    /// The group of `partition` committed: it is never sent again.
    pub(crate) fn committed(&mut self, partition: u32) {
        if let Some(g) = self.groups.get_mut(partition as usize) {
            *g = None;
        }
    }

    /// How long until the next group is due (zero: one is due now); `None`
    /// when every group has committed.
    pub(crate) fn next_due(&self, health: &ChildHealth, now: Duration) -> Option<Duration> {
        self.waiting().map(|p| health.retry_at(p as usize).saturating_sub(now)).min()
    }
}

/// One child partition, as one cursor has found it.
#[derive(Debug, Clone, Copy, Default)]
struct PartitionHealth {
    /// Not tried again before this (monotonic time).
    retry_at: Duration,
    /// The back-off its last miss set (zero: none since its last commit).
    backoff: Duration,
}

/// How each partition of one child fares for one cursor: when each may be
/// tried again.
#[derive(Debug, Default)]
pub(crate) struct ChildHealth {
    /// The child incarnation and partition count it tracks.
    child: (u64, u32),
    parts: Vec<PartitionHealth>,
}

impl ChildHealth {
    /// Starts over when `child` is not the one it tracks (another
    /// incarnation, another partition count).
    pub(crate) fn track(&mut self, child: &Topic) {
        let id = (child.incarnation(), child.partitions().max(1));
        if self.child != id {
            self.child = id;
            self.parts = vec![PartitionHealth::default(); id.1 as usize];
        }
    }

    fn retry_at(&self, p: usize) -> Duration {
        self.parts.get(p).map_or(Duration::ZERO, |h| h.retry_at)
    }

    /// Whether partition `p` may be tried at `now`.
    fn due(&self, p: usize, now: Duration) -> bool {
        now >= self.retry_at(p)
    }

    /// A commit into `partition` landed.
    pub(crate) fn committed(&mut self, partition: u32) {
        if let Some(h) = self.parts.get_mut(partition as usize) {
            *h = PartitionHealth::default();
        }
    }

    /// A try of `partition` at `now` did not land (or it has no owner): it
    /// is not tried again before the back-off this returns.
    pub(crate) fn missed(&mut self, partition: u32, now: Duration) -> Duration {
        let Some(h) = self.parts.get_mut(partition as usize) else {
            return FANOUT_COMMIT_BACKOFF_MIN;
        };
        h.backoff = match h.backoff {
            Duration::ZERO => FANOUT_COMMIT_BACKOFF_MIN,
            b => b.saturating_mul(2).min(FANOUT_COMMIT_BACKOFF_MAX),
        };
        h.retry_at = now + h.backoff;
        h.backoff
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use narad_log::LogRecord;
    use narad_meta::{CreateTopicRequest, Topic};

    use super::{ChildHealth, Owners, PendingSlab};
    use crate::limits::{FANOUT_COMMIT_BACKOFF_MAX, FANOUT_COMMIT_BACKOFF_MIN};
    use crate::partition::keyed_partition;

    fn child(partitions: i64) -> std::sync::Arc<Topic> {
        let meta = crate::test_support::sim_store();
        let req = CreateTopicRequest { name: "c".into(), partitions, ..Default::default() };
        meta.create_topic(req).unwrap()
    }

    /// `n` parent records, one in four keyed.
    fn records(n: u64) -> Vec<LogRecord> {
        (0..n)
            .map(|i| LogRecord {
                offset: i,
                key: (i % 4 == 0).then(|| Bytes::from(format!("k{i}"))),
                commit_time_ms: 1_000 + i,
                payload: Bytes::from(format!("r{i}")),
            })
            .collect()
    }

    fn payloads(recs: &[crate::owner::BatchRecord]) -> Vec<Bytes> {
        recs.iter().map(|r| r.payload.clone()).collect()
    }

    const ALL_OWNED: &Owners = &[Some((0, true)), Some((0, true)), Some((0, true))];

    /// A retry sends exactly the group that did not commit, with the same
    /// records (keyless ones are not spread again), and only once its
    /// back-off has passed; the groups that committed are never sent again.
    #[test]
    fn a_retry_sends_only_the_group_that_failed_with_the_same_records() {
        let c = child(3);
        let mut spread = 0;
        let mut slab = PendingSlab::new(&c, &records(30), 30, &mut spread);
        assert_eq!(spread, 22, "one step of the spread per keyless record, once");
        let mut health = ChildHealth::default();
        health.track(&c);
        let t0 = Duration::from_secs(100);
        let first = slab.plan(&health, ALL_OWNED, t0);
        assert_eq!(first.tries.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        let total: usize = first.tries.iter().map(|t| t.2.records.len()).sum();
        assert_eq!(total, 30, "every record in exactly one group");
        for (p, _, batch) in &first.tries {
            for r in batch.records.iter().filter(|r| r.key.is_some()) {
                assert_eq!(keyed_partition(r.key.as_ref().unwrap(), 3), *p);
            }
        }
        let failed = first.tries[1].2.records.clone();
        slab.committed(0);
        health.committed(0);
        slab.committed(2);
        health.committed(2);
        let wait = health.missed(1, t0);
        assert_eq!(wait, FANOUT_COMMIT_BACKOFF_MIN);
        assert_eq!(slab.next_due(&health, t0), Some(wait));
        assert!(slab.plan(&health, ALL_OWNED, t0).tries.is_empty(), "not before its back-off");
        let again = slab.plan(&health, ALL_OWNED, t0 + wait);
        assert_eq!(again.tries.len(), 1);
        assert_eq!(again.tries[0].0, 1);
        assert_eq!(payloads(&again.tries[0].2.records), payloads(&failed), "the same group");
        assert_eq!(spread, 22, "a retry does not spread again");
        slab.committed(1);
        assert_eq!(slab.next_due(&health, t0 + wait), None, "done");
    }

    /// The back-off doubles with each miss in a row up to the cap, and a
    /// commit resets it.
    #[test]
    fn a_missed_partition_backs_off_doubling_to_the_cap_and_a_commit_resets_it() {
        let c = child(3);
        let mut health = ChildHealth::default();
        health.track(&c);
        let now = Duration::from_secs(5);
        let waits: Vec<Duration> = (0..10).map(|_| health.missed(2, now)).collect();
        assert_eq!(waits[0], FANOUT_COMMIT_BACKOFF_MIN);
        assert_eq!(waits[1], FANOUT_COMMIT_BACKOFF_MIN * 2);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*waits.last().unwrap(), FANOUT_COMMIT_BACKOFF_MAX);
        assert!(!health.due(2, now + FANOUT_COMMIT_BACKOFF_MAX / 2));
        assert!(health.due(0, now), "the others are not held back");
        health.committed(2);
        assert!(health.due(2, now));
        assert_eq!(health.missed(2, now), FANOUT_COMMIT_BACKOFF_MIN);
        // A partition out of range (a child that shrank under a stale
        // slab) is never a panic.
        assert_eq!(health.missed(99, now), FANOUT_COMMIT_BACKOFF_MIN);
        health.committed(99);
    }

    /// A group whose partition has no owner waits (listed apart, not
    /// tried); the others are tried.
    #[test]
    fn a_group_without_an_owner_waits_and_the_others_are_tried() {
        let c = child(3);
        let mut spread = 0;
        let mut slab = PendingSlab::new(&c, &records(12), 12, &mut spread);
        let mut health = ChildHealth::default();
        health.track(&c);
        let owners: &Owners = &[Some((0, true)), None, Some((7, false))];
        let plan = slab.plan(&health, owners, Duration::ZERO);
        assert_eq!(plan.unowned, vec![1]);
        let tried: Vec<(u32, u64)> = plan.tries.iter().map(|t| (t.0, t.1)).collect();
        assert_eq!(tried, vec![(0, 0), (2, 7)], "a dead owner's keyed group is still tried");
        // Owners listed for fewer partitions than the slab has: the rest
        // count as unowned.
        let plan = slab.plan(&health, &[Some((0, true))], Duration::ZERO);
        assert_eq!(plan.unowned, vec![1, 2]);
    }

    /// A slab is resent from the stored position when the child changed
    /// shape or incarnation under it; the health starts over likewise.
    #[test]
    fn a_slab_grouped_for_another_shape_of_the_child_does_not_fit() {
        let c3 = child(3);
        let c4 = child(4);
        let mut spread = 0;
        let slab = PendingSlab::new(&c3, &records(8), 8, &mut spread);
        assert!(slab.fits(&c3));
        assert!(!slab.fits(&c4));
        let mut health = ChildHealth::default();
        health.track(&c3);
        health.missed(2, Duration::ZERO);
        health.track(&c3);
        assert!(!health.due(2, Duration::ZERO), "the same child keeps its health");
        health.track(&c4);
        assert!(health.due(2, Duration::ZERO), "another shape starts over");
    }
}
