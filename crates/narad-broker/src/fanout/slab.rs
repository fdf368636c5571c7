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
//!   the same partition. The one exception is a reroute, below: keyless
//!   records move out of a group that has not committed into a sibling's.
//!
//! # Back-off and reroutes ([`ChildHealth`])
//! Per cursor and child partition: a partition whose commit did not land
//! (or that has no owner) is tried again after [`FANOUT_COMMIT_BACKOFF_MIN`],
//! doubling with each miss in a row up to [`FANOUT_COMMIT_BACKOFF_MAX`];
//! a commit resets it.
//!
//! The dispatcher's reroute rule, for keyless records only: a partition
//! *reroutes* while it has no owner, while membership marks its owner
//! dead, or once its commits have failed for [`FANOUT_REROUTE_GRACE`]
//! until its next try is due (that try, with the keyless records of the
//! slab then pending, is the trial that finds a recovered partition). Its
//! group's keyless records then move to the next partition up (wrapping)
//! whose owner is assigned and alive and that is neither failing nor
//! backing off. Keyed records never move: they wait for their partition,
//! and so does the rest of the cursor (it reads no further meanwhile).

use std::sync::Arc;
use std::time::Duration;

use narad_log::LogRecord;
use narad_meta::Topic;

use crate::dispatch::core::OwnerId;
use crate::limits::{FANOUT_COMMIT_BACKOFF_MAX, FANOUT_COMMIT_BACKOFF_MIN, FANOUT_REROUTE_GRACE};
use crate::owner::{BatchRecord, CommitBatch};
use crate::partition::keyed_partition;

/// The owner of each child partition and whether membership reports it
/// alive (`None`: not assigned), indexed by partition.
pub type Owners = [Option<(OwnerId, bool)>];

/// A slab read from the parent, grouped for one child, not all committed
/// yet.
#[derive(Debug)]
pub struct PendingSlab {
    /// The parent offset after the slab: the cursor's position once every
    /// group has committed.
    pub next_offset: u64,
    /// Records in the slab (for the metrics, once it is all committed).
    pub records: u64,
    /// Payload bytes in the slab.
    pub bytes: u64,
    /// The parent commit time of its first record (for the due lag).
    pub first_commit_time_ms: Option<u64>,
    /// The child incarnation it was grouped for.
    child_incarnation: u64,
    /// The child's name.
    topic: Arc<str>,
    /// Per child partition: the records still to commit there (`None`:
    /// committed, or none).
    groups: Vec<Option<CommitBatch>>,
}

/// What one pass over a pending slab does.
#[derive(Debug, Default)]
pub struct Plan {
    /// The groups to commit now: (child partition, its owner, the group).
    pub tries: Vec<(u32, OwnerId, CommitBatch)>,
    /// Child partitions with records to commit and no owner: they wait.
    pub unowned: Vec<u32>,
    /// Keyless records moved: (from partition, to partition, records).
    pub rerouted: Vec<(u32, u32, u64)>,
}

impl PendingSlab {
    /// Groups `records` (read from the parent, up to `next_offset`) for
    /// `child`; keyless records take the next partitions of `spread`.
    pub fn new(
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
            topic,
            groups,
        }
    }

    /// Whether the slab was grouped for `child` as it is now (same
    /// incarnation, same partition count); if not, it must be read and
    /// grouped again.
    pub fn fits(&self, child: &Topic) -> bool {
        self.child_incarnation == child.incarnation()
            && self.groups.len() == child.partitions().max(1) as usize
    }

    /// Moves the keyless records of each partition that reroutes (see the
    /// module docs) to its sibling, then lists the groups to try now: every
    /// group still to commit whose partition is due and has an owner
    /// (`owners`, indexed by partition); due ones without an owner are
    /// listed apart.
    pub fn plan(&mut self, health: &ChildHealth, owners: &Owners, now: Duration) -> Plan {
        let mut plan = Plan { rerouted: self.reroute(health, owners, now), ..Plan::default() };
        for (p, group) in self.groups.iter().enumerate() {
            let Some(group) = group.as_ref().filter(|_| health.due(p, now)) else { continue };
            match owner_at(owners, p) {
                None => plan.unowned.push(p as u32),
                Some((owner, _)) => plan.tries.push((p as u32, owner, group.clone())),
            }
        }
        plan
    }

    /// Moves the keyless records of each partition that reroutes at `now`
    /// (see the module docs) to its sibling: (from, to, records) for each
    /// move.
    pub fn reroute(
        &mut self,
        health: &ChildHealth,
        owners: &Owners,
        now: Duration,
    ) -> Vec<(u32, u32, u64)> {
        let mut moves = Vec::new();
        for p in 0..self.groups.len() {
            if self.groups[p].is_none() || !health.reroutes(p, owner_at(owners, p), now) {
                continue;
            }
            let Some(to) = health.sibling(p, owners, now) else { continue };
            let moved = self.move_keyless(p, to);
            if moved > 0 {
                moves.push((p as u32, to as u32, moved));
            }
        }
        moves
    }

    /// Moves the keyless records of partition `from`'s group (not committed)
    /// to the end of partition `to`'s; how many.
    fn move_keyless(&mut self, from: usize, to: usize) -> u64 {
        if from == to || to >= self.groups.len() {
            return 0;
        }
        let Some(mut group) = self.groups.get_mut(from).and_then(Option::take) else { return 0 };
        let (keyless, keyed): (Vec<BatchRecord>, Vec<BatchRecord>) =
            group.records.drain(..).partition(|r| r.key.is_none());
        group.records = keyed;
        if !group.records.is_empty() {
            self.groups[from] = Some(group);
        }
        let moved = keyless.len() as u64;
        if moved > 0 {
            let target = self.groups[to].get_or_insert_with(|| CommitBatch {
                topic: self.topic.clone(),
                partition: to as u32,
                records: Vec::new(),
            });
            target.records.extend(keyless);
        }
        moved
    }

    /// The groups not committed yet: (child partition, its records).
    pub fn uncommitted(&self) -> impl Iterator<Item = (u32, &CommitBatch)> {
        self.groups.iter().enumerate().filter_map(|(p, g)| Some((p as u32, g.as_ref()?)))
    }

    /// The group of `partition` committed: it is never sent again.
    pub fn committed(&mut self, partition: u32) {
        if let Some(g) = self.groups.get_mut(partition as usize) {
            *g = None;
        }
    }

    /// How long until the next pass has something to do (zero: now): a
    /// group falls due, or a failing partition's keyless records start to
    /// reroute (a reroute already due was made by [`PendingSlab::reroute`],
    /// or has no sibling to go to: it waits for the group's next try). `None`
    /// when every group has committed.
    pub fn next_due(&self, health: &ChildHealth, now: Duration) -> Option<Duration> {
        let mut next: Option<Duration> = None;
        for (p, group) in self.groups.iter().enumerate() {
            let Some(group) = group else { continue };
            let mut at = health.retry_at(p);
            if let Some(reroute_at) = health.reroute_at(p).filter(|&at| at > now)
                && group.records.iter().any(|r| r.key.is_none())
            {
                at = at.min(reroute_at);
            }
            let wait = at.saturating_sub(now);
            next = Some(next.map_or(wait, |n| n.min(wait)));
        }
        next
    }
}

/// The owner of partition `p` in `owners`, if assigned.
fn owner_at(owners: &Owners, p: usize) -> Option<(OwnerId, bool)> {
    owners.get(p).copied().flatten()
}

/// One child partition, as one cursor has found it.
#[derive(Debug, Clone, Copy, Default)]
struct PartitionHealth {
    /// When its current run of failed commits began (a refusal or a
    /// missing owner is not a failure).
    failing_since: Option<Duration>,
    /// Not tried again before this (monotonic time).
    retry_at: Duration,
    /// The back-off its last miss set (zero: none since its last commit).
    backoff: Duration,
}

/// How each partition of one child fares for one cursor: when each may be
/// tried again.
#[derive(Debug, Default)]
pub struct ChildHealth {
    /// The child incarnation and partition count it tracks.
    child: (u64, u32),
    parts: Vec<PartitionHealth>,
}

impl ChildHealth {
    /// Starts over when `child` is not the one it tracks (another
    /// incarnation, another partition count).
    pub fn track(&mut self, child: &Topic) {
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

    /// When a failing partition `p` starts rerouting its keyless records.
    fn reroute_at(&self, p: usize) -> Option<Duration> {
        Some(self.parts.get(p)?.failing_since? + FANOUT_REROUTE_GRACE)
    }

    /// Whether partition `p`, owned by `owner`, sends its keyless records
    /// to a sibling at `now` (the dispatcher's rule, see the module docs).
    fn reroutes(&self, p: usize, owner: Option<(OwnerId, bool)>, now: Duration) -> bool {
        match owner {
            None | Some((_, false)) => true,
            Some((_, true)) => self.reroute_at(p).is_some_and(|at| now >= at) && !self.due(p, now),
        }
    }

    /// The sibling that takes `p`'s keyless records: the next partition up
    /// (wrapping) whose owner is assigned and alive, not failing and not
    /// backing off.
    fn sibling(&self, p: usize, owners: &Owners, now: Duration) -> Option<usize> {
        let n = self.parts.len();
        (1..n).map(|step| (p + step) % n).find(|&s| {
            matches!(owner_at(owners, s), Some((_, true)))
                && self.parts[s].failing_since.is_none()
                && self.due(s, now)
        })
    }

    /// A commit into `partition` landed.
    pub fn committed(&mut self, partition: u32) {
        if let Some(h) = self.parts.get_mut(partition as usize) {
            *h = PartitionHealth::default();
        }
    }

    /// A try of `partition` at `now` did not land (`failed`: the commit
    /// failed, rather than was refused or found no owner): it is not tried
    /// again before the back-off this returns.
    pub fn missed(&mut self, partition: u32, now: Duration, failed: bool) -> Duration {
        let Some(h) = self.parts.get_mut(partition as usize) else {
            return FANOUT_COMMIT_BACKOFF_MIN;
        };
        if failed {
            h.failing_since.get_or_insert(now);
        }
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
    use crate::limits::{
        FANOUT_COMMIT_BACKOFF_MAX, FANOUT_COMMIT_BACKOFF_MIN, FANOUT_REROUTE_GRACE,
    };
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
        let wait = health.missed(1, t0, true);
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
        let waits: Vec<Duration> = (0..10).map(|_| health.missed(2, now, true)).collect();
        assert_eq!(waits[0], FANOUT_COMMIT_BACKOFF_MIN);
        assert_eq!(waits[1], FANOUT_COMMIT_BACKOFF_MIN * 2);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*waits.last().unwrap(), FANOUT_COMMIT_BACKOFF_MAX);
        assert!(!health.due(2, now + FANOUT_COMMIT_BACKOFF_MAX / 2));
        assert!(health.due(0, now), "the others are not held back");
        health.committed(2);
        assert!(health.due(2, now));
        assert_eq!(health.missed(2, now, true), FANOUT_COMMIT_BACKOFF_MIN);
        // A partition out of range (a child that shrank under a stale
        // slab) is never a panic.
        assert_eq!(health.missed(99, now, true), FANOUT_COMMIT_BACKOFF_MIN);
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
        let owners: &Owners = &[Some((0, true)), None, Some((7, true))];
        let plan = slab.plan(&health, owners, Duration::ZERO);
        assert_eq!(plan.unowned, vec![1]);
        let tried: Vec<(u32, u64)> = plan.tries.iter().map(|t| (t.0, t.1)).collect();
        assert_eq!(tried, vec![(0, 0), (2, 7)], "each to its own owner");
        // Owners listed for fewer partitions than the slab has: the rest
        // count as unowned; partition 2's group (keyless only) goes whole
        // to partition 0, partition 1's keyed records wait.
        let plan = slab.plan(&health, &[Some((0, true))], Duration::ZERO);
        assert_eq!(plan.unowned, vec![1]);
        assert_eq!(plan.tries.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0]);
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
        health.missed(2, Duration::ZERO, true);
        health.track(&c3);
        assert!(!health.due(2, Duration::ZERO), "the same child keeps its health");
        health.track(&c4);
        assert!(health.due(2, Duration::ZERO), "another shape starts over");
    }

    /// (partition, keyed records, keyless records) of each group a plan
    /// tries.
    fn shape(plan: &super::Plan) -> Vec<(u32, usize, usize)> {
        let mut out: Vec<(u32, usize, usize)> = plan
            .tries
            .iter()
            .map(|(p, _, b)| {
                let keyed = b.records.iter().filter(|r| r.key.is_some()).count();
                (*p, keyed, b.records.len() - keyed)
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Keyed records aimed at each of 3 partitions (from [`records`]).
    fn keyed_at(recs: &[LogRecord]) -> [usize; 3] {
        let mut n = [0; 3];
        for r in recs.iter().filter(|r| r.key.is_some()) {
            n[keyed_partition(r.key.as_ref().unwrap(), 3) as usize] += 1;
        }
        n
    }

    /// A partition whose owner is dead sends its keyless records to the
    /// next partition up with a live owner (wrapping); its keyed records
    /// stay and are still tried (membership may lag a restart). Without a
    /// owner at all, the keyless ones go too and the keyed ones wait.
    #[test]
    fn keyless_records_of_a_dead_or_unowned_partition_go_to_the_next_live_one_keyed_stay() {
        let c = child(3);
        let recs = records(60);
        let keyed = keyed_at(&recs);
        assert!(keyed.iter().all(|&n| n > 0), "every partition has keyed records: {keyed:?}");
        let mut health = ChildHealth::default();
        health.track(&c);
        let now = Duration::from_secs(1);

        let mut spread = 0;
        let mut slab = PendingSlab::new(&c, &recs, 60, &mut spread);
        let dead_1: &Owners = &[Some((0, true)), Some((1, false)), Some((2, true))];
        let plan = slab.plan(&health, dead_1, now);
        assert_eq!(plan.rerouted.len(), 1);
        let (from, to, moved) = plan.rerouted[0];
        assert_eq!((from, to), (1, 2), "the next partition up");
        let groups = shape(&plan);
        assert_eq!(groups[1], (1, keyed[1], 0), "the dead partition keeps only its keyed records");
        assert_eq!(groups.iter().map(|s| s.1 + s.2).sum::<usize>(), 60, "nothing lost or doubled");
        assert!(moved > 0);
        assert_eq!(groups[0].2 + groups[2].2, 60 - keyed.iter().sum::<usize>(), "all keyless");

        // Partitions 1 and 2 dead: wrapping, partition 0 takes both.
        let mut spread = 0;
        let mut slab = PendingSlab::new(&c, &recs, 60, &mut spread);
        let dead_12: &Owners = &[Some((0, true)), Some((1, false)), Some((2, false))];
        let plan = slab.plan(&health, dead_12, now);
        let mut moves: Vec<(u32, u32)> = plan.rerouted.iter().map(|m| (m.0, m.1)).collect();
        moves.sort_unstable();
        assert_eq!(moves, vec![(1, 0), (2, 0)]);
        let keyless = 60 - keyed.iter().sum::<usize>();
        assert_eq!(shape(&plan), vec![(0, keyed[0], keyless), (1, keyed[1], 0), (2, keyed[2], 0)]);

        // Partition 1 unassigned: its keyless records go, its keyed wait.
        let mut spread = 0;
        let mut slab = PendingSlab::new(&c, &recs, 60, &mut spread);
        let unowned_1: &Owners = &[Some((0, true)), None, Some((2, true))];
        let plan = slab.plan(&health, unowned_1, now);
        assert_eq!(plan.unowned, vec![1]);
        assert_eq!(plan.rerouted.iter().map(|m| (m.0, m.1)).collect::<Vec<_>>(), vec![(1, 2)]);
        assert!(plan.tries.iter().all(|t| t.0 != 1));

        // Every owner dead: nowhere to go, nothing moves.
        let mut spread = 0;
        let mut slab = PendingSlab::new(&c, &recs, 60, &mut spread);
        let all_dead: &Owners = &[Some((0, false)), Some((1, false)), Some((2, false))];
        assert!(slab.plan(&health, all_dead, now).rerouted.is_empty());
    }

    /// A partition whose owner is alive but whose commits fail keeps its
    /// keyless records for the grace, then gives them to a sibling while it
    /// backs off; when its next try is due it is tried with the keyless
    /// records then pending (a trial), and a commit ends it all. A partition
    /// with nowhere to send them never makes the cursor spin.
    #[test]
    fn a_failing_partition_reroutes_keyless_records_after_the_grace_and_is_tried_again() {
        let c = child(3);
        let recs = records(60);
        let keyed = keyed_at(&recs);
        let owners: &Owners = &[Some((0, true)), Some((0, true)), Some((0, true))];
        let mut health = ChildHealth::default();
        health.track(&c);
        let t0 = Duration::from_secs(10);
        let mut spread = 0;
        let mut slab = PendingSlab::new(&c, &recs, 60, &mut spread);
        let plan = slab.plan(&health, owners, t0);
        let keyless_1 = shape(&plan)[1].2;
        assert!(keyless_1 > 0);
        slab.committed(0);
        health.committed(0);
        slab.committed(2);
        health.committed(2);
        health.missed(1, t0, true);
        // Within the grace: nothing moves; the next pass is due at the
        // retry, well before the grace ends.
        let t1 = t0 + FANOUT_COMMIT_BACKOFF_MIN;
        assert!(slab.reroute(&health, owners, t1 - Duration::from_millis(1)).is_empty());
        let plan = slab.plan(&health, owners, t1);
        assert_eq!(shape(&plan), vec![(1, keyed[1], keyless_1)], "retried whole, keyless too");
        // Failing for the grace, backing off: the keyless records go.
        let t2 = t0 + FANOUT_REROUTE_GRACE;
        health.missed(1, t2 - Duration::from_millis(1), true);
        assert_eq!(
            slab.next_due(&health, t0 + Duration::from_secs(1)),
            Some(FANOUT_REROUTE_GRACE - Duration::from_secs(1)),
            "the pass wakes when the grace ends"
        );
        let moves = slab.reroute(&health, owners, t2);
        assert_eq!(moves, vec![(1, 2, keyless_1 as u64)]);
        let plan = slab.plan(&health, owners, t2);
        assert_eq!(shape(&plan), vec![(2, 0, keyless_1)], "the sibling is tried at once");
        slab.committed(2);
        health.committed(2);
        // A new slab while partition 1 still backs off: its keyless records
        // go to the sibling at once; when its try is due, a trial.
        let mut slab = PendingSlab::new(&c, &recs, 120, &mut spread);
        let plan = slab.plan(&health, owners, t2);
        assert_eq!(plan.rerouted.len(), 1);
        let retry = t2 + FANOUT_COMMIT_BACKOFF_MAX;
        let mut slab = PendingSlab::new(&c, &recs, 180, &mut spread);
        let plan = slab.plan(&health, owners, retry);
        assert!(plan.rerouted.is_empty(), "a due try keeps its keyless records: a trial");
        assert!(shape(&plan).iter().any(|s| s.0 == 1 && s.2 > 0));
        health.committed(1);
        assert!(!health.reroutes(1, owners[1], retry), "a commit ends the reroute");

        // Every sibling failing too: nothing moves, and the next pass waits
        // for a retry (never zero: no spin).
        let mut health = ChildHealth::default();
        health.track(&c);
        for p in 0..3 {
            health.missed(p, t0, true);
        }
        let mut slab = PendingSlab::new(&c, &recs, 60, &mut spread);
        let late = t0 + FANOUT_REROUTE_GRACE;
        for p in 0..3 {
            health.missed(p, late - Duration::from_millis(1), true);
        }
        assert!(slab.reroute(&health, owners, late).is_empty());
        let wait = slab.next_due(&health, late).unwrap();
        assert!(wait > Duration::ZERO, "no busy loop: {wait:?}");
    }
}
