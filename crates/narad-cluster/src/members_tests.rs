//! Membership driven by tokio's paused time and a [`ManualClock`], over a
//! direct-apply metastore on a simulated disk: several `Membership`s on one
//! store stand for nodes sharing one replicated metastore.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use narad_clock::{ClockRef, ManualClock};
use narad_fs::SimFs;
use narad_meta::{CreateTopicRequest, MetaStoreOptions, PartitionAssignment, TopicDefaults};
use prometheus_client::encoding::text::encode;

use super::*;
use narad_meta::MemberStatus::Alive;

const T0_S: i64 = 1_700_000_000;

#[derive(Debug, Default)]
struct Leads(AtomicBool);

impl LeaderView for Leads {
    fn is_leader(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

fn leads(yes: bool) -> Arc<Leads> {
    Arc::new(Leads(AtomicBool::new(yes)))
}

struct Node {
    meta: Arc<MetaStore>,
    clock: ManualClock,
    errors: Family<ErrorLabels, Counter>,
}

impl Node {
    fn new() -> Node {
        let clock = ManualClock::new(T0_S as u64 * 1000);
        let options = MetaStoreOptions {
            defaults: TopicDefaults::default(),
            clock: Arc::new(clock.clone()),
            rng_seed: Some(7),
        };
        let meta = MetaStore::open(&SimFs::new(1), Path::new("/d"), options).unwrap();
        Node { meta: Arc::new(meta), clock, errors: Family::default() }
    }

    fn start(&self, id: &str, leader: Arc<Leads>, registry: &mut Registry) -> Membership {
        let clock: ClockRef = Arc::new(self.clock.clone());
        let me = member(id, 0, MemberStatus::Dead); // stamped at each beat
        Membership::start(self.meta.clone(), me, leader, clock, registry, self.errors.clone())
    }

    /// Moves the wall clock and tokio's paused time forward together.
    async fn pass(&self, by: Duration) {
        self.clock.advance(by);
        tokio::time::sleep(by).await;
    }

    fn status(&self, id: &str) -> Option<MemberStatus> {
        self.meta.snapshot().member(id).map(|m| m.status)
    }

    fn errors(&self, kind: &str) -> u64 {
        let labels = ErrorLabels { component: "cluster".into(), kind: kind.into() };
        self.errors.get_or_create(&labels).get()
    }
}

fn member(id: &str, last_heartbeat: i64, status: MemberStatus) -> Member {
    Member {
        id: id.into(),
        addr: format!("{id}.local:7942"),
        cluster_addr: Some(format!("{id}.local:7943")),
        status,
        last_heartbeat,
    }
}

/// Lets the runtime run (paused time advances by itself while every task
/// waits) until `done`, for at most two minutes of virtual time.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..1200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never happened: {what}");
}

fn metrics(registry: &Registry) -> String {
    let mut out = String::new();
    encode(&mut out, registry).unwrap();
    out
}

#[tokio::test(start_paused = true)]
async fn the_leader_marks_a_member_silent_for_31_s_dead_a_follower_does_not_and_a_heartbeat_revives_it()
 {
    let node = Node::new();
    node.meta.member_join(member("n2", T0_S - 31, MemberStatus::Alive)).unwrap();
    let leader = leads(false);
    let mut registry = Registry::with_prefix("narad");
    let n1 = node.start("n1", leader.clone(), &mut registry);
    eventually("n1 heartbeats at start", || node.status("n1") == Some(MemberStatus::Alive)).await;
    assert_eq!(node.meta.snapshot().member("n1").unwrap().last_heartbeat, T0_S);

    // Not the leader: controller ticks pass and n2 stays alive.
    tokio::time::sleep(3 * CONTROLLER_INTERVAL).await;
    assert_eq!(node.status("n2"), Some(MemberStatus::Alive), "a follower marked n2 dead");
    let text = metrics(&registry);
    assert!(text.contains("narad_cluster_members{status=\"alive\"} 2"), "{text}");

    // Leader: the next tick marks it dead; n1 (heartbeating) stays alive.
    leader.0.store(true, Ordering::SeqCst);
    eventually("n2 marked dead", || node.status("n2") == Some(MemberStatus::Dead)).await;
    assert_eq!(node.status("n1"), Some(MemberStatus::Alive));
    eventually("the gauge follows", || {
        let text = metrics(&registry);
        text.contains("narad_cluster_members{status=\"alive\"} 1")
            && text.contains("narad_cluster_members{status=\"dead\"} 1")
    })
    .await;

    // n2 heartbeats again: alive, and it stays so across the leader's ticks.
    let n2 = node.start("n2", leads(false), &mut Registry::default());
    eventually("n2 alive again", || node.status("n2") == Some(MemberStatus::Alive)).await;
    tokio::time::sleep(3 * CONTROLLER_INTERVAL).await;
    assert_eq!(node.status("n2"), Some(MemberStatus::Alive));

    // Two minutes pass: both keep heartbeating, both stay alive throughout.
    for _ in 0..120 {
        node.pass(Duration::from_secs(1)).await;
        assert_eq!((node.status("n1"), node.status("n2")), (Some(Alive), Some(Alive)));
    }
    let state = node.meta.snapshot();
    for id in ["n1", "n2"] {
        let age = T0_S + 120 - state.member(id).unwrap().last_heartbeat;
        assert!(age <= HEARTBEAT_INTERVAL.as_secs() as i64, "{id} last beat {age} s ago");
    }

    // n2 stops: once silent for over 30 s it is dead, at the next tick.
    tokio::time::timeout(Duration::from_secs(1), n2.stop()).await.expect("stop is prompt");
    // A beat already on its blocking thread lands (paused time waits for it).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopped_at = node.meta.snapshot().member("n2").unwrap().last_heartbeat;
    let mut seconds = 0;
    while node.status("n2") == Some(Alive) {
        node.pass(Duration::from_secs(1)).await;
        seconds += 1;
        assert!(seconds < 60, "n2 still alive after {seconds} s of silence");
    }
    let silent = T0_S + 120 + seconds - stopped_at;
    let tick = CONTROLLER_INTERVAL.as_secs() as i64;
    assert!((31..=31 + tick).contains(&silent), "marked dead after {silent} s of silence");
    assert_eq!(node.status("n1"), Some(Alive));
    tokio::time::timeout(Duration::from_secs(1), n1.stop()).await.expect("stop is prompt");
    assert_eq!((node.errors("heartbeat"), node.errors("controller")), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn the_leader_assigns_a_child_partition_left_unassigned_at_create_on_its_next_tick() {
    let node = Node::new();
    node.meta.member_join(member("n2", T0_S, MemberStatus::Alive)).unwrap();
    let create = |name: &str, parent: &str| {
        let request = CreateTopicRequest {
            name: name.into(),
            parent: parent.into(),
            partitions: 3,
            ..Default::default()
        };
        node.meta.create_topic(request).unwrap()
    };
    // The parent got only partition 0's owner; the child nothing.
    let parent = create("p", "");
    let first = vec![PartitionAssignment { partition: 0, owner_id: "n2".into(), target_id: None }];
    node.meta.assign_partitions("p", parent.incarnation(), first).unwrap();
    create("c", "p");

    let n1 = node.start("n1", leads(true), &mut Registry::default());
    let assigned = |name: &str| node.meta.snapshot().assignments(name).map_or(0, |a| a.len());
    eventually("every partition assigned", || assigned("p") == 3 && assigned("c") == 3).await;
    let state = node.meta.snapshot();
    assert_eq!(state.assignment("p", 0).unwrap().owner_id, "n2", "sticky");
    for p in 0..3 {
        let (parent, child) =
            (state.assignment("p", p).unwrap(), state.assignment("c", p).unwrap());
        assert_ne!(parent.owner_id, child.owner_id, "child partition {p} beside its parent's");
    }
    assert_eq!(crate::controller::plan(&state, T0_S), Vec::new(), "nothing left to do");
    n1.stop().await;
    assert_eq!(node.errors("controller"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_failing_heartbeat_is_counted_and_the_heartbeat_keeps_trying() {
    let node = Node::new();
    let clock: ClockRef = Arc::new(node.clock.clone());
    // The metastore refuses a member without an address.
    let me = Member { addr: String::new(), ..member("n1", 0, MemberStatus::Alive) };
    let n1 = Membership::start(
        node.meta.clone(),
        me,
        leads(false),
        clock,
        &mut Registry::default(),
        node.errors.clone(),
    );
    eventually("three failed heartbeats", || node.errors("heartbeat") >= 3).await;
    assert_eq!(node.status("n1"), None);
    n1.stop().await;
}
