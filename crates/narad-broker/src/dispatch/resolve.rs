//! Resolving a WAL record to its destination on one node.

use std::sync::Arc;

use narad_meta::MetaStore;
use narad_wal::WalRecord;
use tracing::warn;

use super::core::{Dest, OwnerId, Target, Topology};
use super::driver::Resolver;

/// Resolves WAL records against this node's metastore replica. On one node
/// the local metastore is the authority, so a missing topic or another
/// incarnation is a confirmed deletion.
#[derive(Debug)]
pub struct LocalResolver {
    meta: Arc<MetaStore>,
}

impl LocalResolver {
    /// A resolver reading `meta`.
    pub fn new(meta: Arc<MetaStore>) -> Self {
        LocalResolver { meta }
    }
}

impl Topology for LocalResolver {
    fn owner_of(&self, topic: &str, partition: u32) -> Option<(OwnerId, bool)> {
        let t = self.meta.topic(topic)?;
        (partition < t.partitions()).then_some((0, true))
    }
}

impl Resolver for LocalResolver {
    fn resolve(&self, record: &WalRecord, topic: &Arc<str>) -> Target {
        let Some(t) = self.meta.topic(topic) else { return Target::Discard };
        if record.incarnation.is_some_and(|id| id != t.incarnation()) {
            warn!(
                topic = %topic,
                topic_id = record.incarnation,
                partition = record.partition,
                seq = record.seq,
                "discarding undispatched record of a deleted topic incarnation"
            );
            return Target::Discard;
        }
        let partitions = t.partitions();
        Target::Commit {
            dest: Dest { topic: topic.clone(), partition: record.partition % partitions },
            owner: 0,
            alive: true,
            partitions,
        }
    }
}

/// Member ids as the dispatcher's [`OwnerId`]s: this node is 0 (so a
/// destination on it commits through the local owner, as on a single node),
/// every other member gets the next number the first time it is seen. The
/// numbers live only in memory and are never reused.
#[derive(Debug)]
pub struct OwnerIds {
    inner: std::sync::Mutex<OwnerIdTable>,
}

#[derive(Debug)]
struct OwnerIdTable {
    by_name: foldhash::HashMap<String, OwnerId>,
    names: Vec<String>,
}

impl OwnerIds {
    /// The table of a node whose member id is `me` (owner 0).
    pub fn new(me: &str) -> Self {
        let mut by_name = foldhash::HashMap::default();
        by_name.insert(me.to_owned(), LOCAL_OWNER);
        OwnerIds { inner: std::sync::Mutex::new(OwnerIdTable { by_name, names: vec![me.into()] }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OwnerIdTable> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The id of member `name`.
    pub fn id(&self, name: &str) -> OwnerId {
        let mut t = self.lock();
        if let Some(&id) = t.by_name.get(name) {
            return id;
        }
        let id = t.names.len() as OwnerId;
        t.names.push(name.to_owned());
        t.by_name.insert(name.to_owned(), id);
        id
    }

    /// The member behind `id`, if it was ever handed out.
    pub fn name(&self, id: OwnerId) -> Option<String> {
        self.lock().names.get(usize::try_from(id).ok()?).cloned()
    }
}

/// The owner id of this node in an [`OwnerIds`] table (and the only owner
/// a [`LocalResolver`] names).
pub const LOCAL_OWNER: OwnerId = 0;

/// What the group's leader says of a topic name, after confirming its
/// leadership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaderTopic {
    /// No topic by that name.
    Absent,
    /// The live incarnation.
    Present(u64),
}

/// The leader's word on a topic (SPEC §7.1): the only ground on which a
/// cluster node discards a 202'd record. Implemented by the cluster's
/// control plane.
pub trait DeleteConfirmer: Send + Sync + std::fmt::Debug {
    /// The leader's view of `topic`, asked only once this replica has caught
    /// up and from a leader that confirmed its leadership; `Err` when no
    /// such answer can be had now (no leader, not caught up, unreachable).
    fn leader_topic(
        &self,
        topic: &str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<LeaderTopic, String>> + Send>>;
}

/// How long an unconfirmed delete is remembered before the leader is asked
/// again (the v3 page: an unconfirmed answer is remembered for a second).
pub const DELETE_UNCONFIRMED_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// Topics whose confirmations are remembered at most (then forgotten all
/// at once; asking again costs one leader round trip per topic).
const CONFIRMED_KEPT: usize = 10_000;

/// What the leader confirmed of one topic name.
#[derive(Debug, Clone, Copy, Default)]
struct Confirmed {
    /// Every incarnation up to this one is gone. Incarnation ids are the
    /// metastore index that created them, so they only grow, and one name
    /// has one live incarnation at a time: the leader naming live
    /// incarnation L says every id below L is gone; the leader saying the
    /// name is absent says every id this replica could know of when it
    /// asked (up to its applied index then, and the asked id) is gone.
    gone_up_to: u64,
    /// The name was absent when asked: records without an incarnation id
    /// (an older release's, accepted before the delete) are gone.
    name_gone: bool,
    /// A question is on its way.
    asking: bool,
    /// Not confirmed: ask again no earlier than this (monotonic).
    not_before: std::time::Duration,
}

impl Confirmed {
    fn covers(&self, incarnation: Option<u64>) -> bool {
        match incarnation {
            Some(id) => id <= self.gone_up_to,
            None => self.name_gone,
        }
    }
}

/// Resolves WAL records on a cluster node: owners and liveness from the
/// replicated assignments and membership; a record whose topic (or
/// incarnation) this replica does not hold is discarded only once the
/// leader confirms it is gone, and kept in the WAL until then.
#[derive(Debug)]
pub struct ClusterResolver {
    meta: Arc<MetaStore>,
    ids: Arc<OwnerIds>,
    confirmer: Arc<dyn DeleteConfirmer>,
    clock: narad_clock::ClockRef,
    confirmed: Arc<std::sync::Mutex<foldhash::HashMap<Arc<str>, Confirmed>>>,
}

impl ClusterResolver {
    /// A resolver over `meta`'s replica, naming owners through `ids`.
    pub fn new(
        meta: Arc<MetaStore>,
        ids: Arc<OwnerIds>,
        confirmer: Arc<dyn DeleteConfirmer>,
        clock: narad_clock::ClockRef,
    ) -> Self {
        ClusterResolver { meta, ids, confirmer, clock, confirmed: Default::default() }
    }

    /// Discard if the leader confirmed this incarnation gone; otherwise ask
    /// (one question per topic at a time, and not again within
    /// [`DELETE_UNCONFIRMED_TTL`] of an answer that confirmed nothing new)
    /// and keep the record in the WAL.
    fn gone_or_wait(&self, record: &WalRecord, topic: &Arc<str>) -> Target {
        let now = self.clock.mono();
        let mut table = self.confirmed.lock().unwrap_or_else(|p| p.into_inner());
        if table.len() >= CONFIRMED_KEPT && !table.contains_key(topic) {
            table.retain(|_, c| c.asking);
        }
        let c = table.entry(topic.clone()).or_default();
        if c.covers(record.incarnation) {
            warn!(
                topic = %topic, topic_id = record.incarnation, partition = record.partition,
                seq = record.seq, "discarding undispatched record of a deleted topic incarnation"
            );
            return Target::Discard;
        }
        if c.asking || c.not_before > now {
            return Target::Wait;
        }
        c.asking = true;
        drop(table);
        let applied = self.meta.snapshot().applied_index();
        let question = self.confirmer.leader_topic(topic);
        let (table, clock, topic, asked) =
            (self.confirmed.clone(), self.clock.clone(), topic.clone(), record.incarnation);
        tokio::spawn(async move {
            let answer = question.await;
            let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
            let c = t.entry(topic.clone()).or_default();
            c.asking = false;
            match answer {
                Ok(LeaderTopic::Absent) => {
                    c.name_gone = true;
                    c.gone_up_to = c.gone_up_to.max(asked.unwrap_or(0)).max(applied);
                }
                Ok(LeaderTopic::Present(live)) => {
                    c.gone_up_to = c.gone_up_to.max(live.saturating_sub(1));
                }
                Err(why) => {
                    tracing::info!(topic = %topic, topic_id = asked, reason = %why,
                        "keeping undispatched records of a topic this replica does not hold until the leader confirms it is gone");
                }
            }
            if !c.covers(asked) {
                c.not_before = clock.mono() + DELETE_UNCONFIRMED_TTL;
            }
        });
        Target::Wait
    }
}
impl Topology for ClusterResolver {
    fn owner_of(&self, topic: &str, partition: u32) -> Option<(OwnerId, bool)> {
        let snap = self.meta.snapshot();
        let owner = crate::ownership::partition_owner(&snap, topic, partition);
        let name = owner.owner_node?;
        Some((self.ids.id(&name), owner.liveness == crate::ownership::OwnerLiveness::Alive))
    }
}

impl Resolver for ClusterResolver {
    fn resolve(&self, record: &WalRecord, topic: &Arc<str>) -> Target {
        let snap = self.meta.snapshot();
        let Some(t) = snap.topic(topic) else { return self.gone_or_wait(record, topic) };
        if record.incarnation.is_some_and(|id| id != t.incarnation()) {
            return self.gone_or_wait(record, topic);
        }
        let partitions = t.partitions();
        let partition = record.partition % partitions;
        let owner = crate::ownership::partition_owner(&snap, topic, partition);
        let Some(name) = owner.owner_node else { return Target::Wait };
        Target::Commit {
            dest: Dest { topic: topic.clone(), partition },
            owner: self.ids.id(&name),
            alive: owner.liveness == crate::ownership::OwnerLiveness::Alive,
            partitions,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use bytes::Bytes;
    use narad_clock::ManualClock;
    use narad_meta::{CreateTopicRequest, Member, MemberStatus, PartitionAssignment};
    use narad_wal::{RecordRef, record};

    use super::*;
    use crate::test_support::sim_store;

    /// A leader whose answers the test sets; counts the questions.
    #[derive(Debug, Default)]
    struct Leader {
        answer: Mutex<Option<Result<LeaderTopic, String>>>,
        asked: AtomicUsize,
    }

    impl DeleteConfirmer for Arc<Leader> {
        fn leader_topic(
            &self,
            _topic: &str,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<LeaderTopic, String>> + Send>>
        {
            self.asked.fetch_add(1, Ordering::SeqCst);
            let answer = self.answer.lock().unwrap().clone();
            Box::pin(async move { answer.unwrap_or_else(|| Err("no leader".into())) })
        }
    }

    fn rec(seq: u64, topic: &str, incarnation: Option<u64>, partition: u32) -> WalRecord {
        let r = RecordRef {
            topic,
            incarnation,
            key: None,
            partition,
            accepted_at_ms: 0,
            payload: b"x",
        };
        let mut buf = Vec::new();
        r.encode_into(&mut buf);
        record::decode(seq, &Bytes::from(buf)).unwrap()
    }

    fn member(meta: &MetaStore, id: &str) {
        let m = Member {
            id: id.into(),
            addr: format!("{id}:1"),
            cluster_addr: None,
            status: MemberStatus::Alive,
            last_heartbeat: 1,
            draining: false,
        };
        meta.member_join(m).unwrap();
    }

    fn setup() -> (Arc<MetaStore>, ClusterResolver, Arc<Leader>, ManualClock) {
        let meta = Arc::new(sim_store());
        let leader = Arc::new(Leader::default());
        let clock = ManualClock::new(1_700_000_000_000);
        let r = ClusterResolver::new(
            meta.clone(),
            Arc::new(OwnerIds::new("me")),
            Arc::new(leader.clone()),
            Arc::new(clock.clone()),
        );
        (meta, r, leader, clock)
    }

    /// Lets the spawned question finish.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn owners_come_from_the_assignments_and_an_unassigned_partition_waits() {
        let (meta, r, _, _) = setup();
        member(&meta, "me");
        member(&meta, "n2");
        let t = meta
            .create_topic(CreateTopicRequest {
                name: "t".into(),
                partitions: 3,
                ..Default::default()
            })
            .unwrap();
        let topic: Arc<str> = "t".into();
        let record = rec(1, "t", Some(t.incarnation()), 4);
        assert!(matches!(r.resolve(&record, &topic), Target::Wait), "not placed yet");
        let assign = |p: u32, owner: &str| PartitionAssignment {
            partition: p,
            owner_id: owner.into(),
            target_id: None,
        };
        meta.assign_partitions("t", t.incarnation(), vec![assign(0, "me"), assign(1, "n2")])
            .unwrap();
        // 4 % 3 = partition 1, owned by n2 (alive): another node.
        match r.resolve(&record, &topic) {
            Target::Commit { dest, owner, alive, partitions } => {
                assert_eq!((dest.partition, alive, partitions), (1, true, 3));
                assert_ne!(owner, LOCAL_OWNER);
                assert_eq!(r.ids.name(owner).as_deref(), Some("n2"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r.owner_of("t", 0), Some((LOCAL_OWNER, true)));
        meta.member_dead("n2").unwrap();
        assert!(matches!(r.owner_of("t", 1), Some((_, false))), "dead by membership");
        assert_eq!(r.owner_of("t", 2), None);
    }

    #[tokio::test]
    async fn a_record_of_a_topic_this_replica_lacks_is_discarded_only_on_the_leaders_word() {
        let (_meta, r, leader, clock) = setup();
        let topic: Arc<str> = "gone".into();
        let old = rec(1, "gone", Some(5), 0);
        // No leader: kept, and not asked again within a second.
        assert!(matches!(r.resolve(&old, &topic), Target::Wait));
        settle().await;
        assert!(matches!(r.resolve(&old, &topic), Target::Wait));
        settle().await;
        assert_eq!(leader.asked.load(Ordering::SeqCst), 1, "an unconfirmed answer is remembered");
        clock.advance(Duration::from_millis(1100));
        // The leader names a live incarnation 5: not gone (this replica lags).
        *leader.answer.lock().unwrap() = Some(Ok(LeaderTopic::Present(5)));
        assert!(matches!(r.resolve(&old, &topic), Target::Wait));
        settle().await;
        assert!(matches!(r.resolve(&old, &topic), Target::Wait), "the live incarnation is kept");
        assert_eq!(leader.asked.load(Ordering::SeqCst), 2);
        // Later: the leader says 9 is live, so 5 (and every id below 9) is
        // gone; one answer covers them all.
        clock.advance(Duration::from_millis(1100));
        *leader.answer.lock().unwrap() = Some(Ok(LeaderTopic::Present(9)));
        assert!(matches!(r.resolve(&old, &topic), Target::Wait));
        settle().await;
        assert!(matches!(r.resolve(&old, &topic), Target::Discard));
        assert!(matches!(r.resolve(&rec(2, "gone", Some(8), 1), &topic), Target::Discard));
        assert!(matches!(r.resolve(&rec(3, "gone", Some(9), 1), &topic), Target::Wait));
        settle().await;
        assert_eq!(leader.asked.load(Ordering::SeqCst), 4, "9 asked about once more");
        // A record without an id goes only when the name is absent.
        assert!(matches!(r.resolve(&rec(4, "gone", None, 0), &topic), Target::Wait));
        clock.advance(Duration::from_millis(1100));
        *leader.answer.lock().unwrap() = Some(Ok(LeaderTopic::Absent));
        assert!(matches!(r.resolve(&rec(4, "gone", None, 0), &topic), Target::Wait));
        settle().await;
        assert!(matches!(r.resolve(&rec(4, "gone", None, 0), &topic), Target::Discard));
        // 9, live when last asked, is asked about again: gone with the name.
        assert!(matches!(r.resolve(&rec(5, "gone", Some(9), 0), &topic), Target::Wait));
        settle().await;
        assert!(matches!(r.resolve(&rec(5, "gone", Some(9), 0), &topic), Target::Discard));
        assert_eq!(leader.asked.load(Ordering::SeqCst), 6);
    }

    #[tokio::test]
    async fn a_record_of_a_replaced_incarnation_waits_for_the_leader_while_the_live_one_commits() {
        let (meta, r, leader, _) = setup();
        member(&meta, "me");
        let req = || CreateTopicRequest { name: "t".into(), partitions: 3, ..Default::default() };
        let old = meta.create_topic(req()).unwrap();
        meta.delete_topic("t").unwrap();
        let new = meta.create_topic(req()).unwrap();
        let a = (0..3)
            .map(|p| PartitionAssignment { partition: p, owner_id: "me".into(), target_id: None })
            .collect();
        meta.assign_partitions("t", new.incarnation(), a).unwrap();
        let topic: Arc<str> = "t".into();
        let stale = rec(1, "t", Some(old.incarnation()), 0);
        assert!(matches!(r.resolve(&stale, &topic), Target::Wait), "never into the new topic");
        assert!(matches!(
            r.resolve(&rec(2, "t", Some(new.incarnation()), 0), &topic),
            Target::Commit { .. }
        ));
        *leader.answer.lock().unwrap() = Some(Ok(LeaderTopic::Present(new.incarnation())));
        settle().await;
        // The first question got "no leader"; the next one, a second later.
        assert!(matches!(r.resolve(&stale, &topic), Target::Wait));
        assert_eq!(leader.asked.load(Ordering::SeqCst), 1);
    }
}
