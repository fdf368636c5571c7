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
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// The labels the server's error family uses (`component`, `kind`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TestErrorLabels {
    component: String,
    kind: String,
}
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
    errors: Family<TestErrorLabels, Counter>,
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
        Membership::start(self.meta.clone(), me, leader, clock, registry, self.sink())
    }

    /// Membership's error sink, counting into `errors`.
    fn sink(&self) -> ErrorSink {
        let errors = self.errors.clone();
        Arc::new(move |component: &str, kind: &str| {
            let labels = TestErrorLabels { component: component.into(), kind: kind.into() };
            errors.get_or_create(&labels).inc();
        })
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
        let labels = TestErrorLabels { component: "cluster".into(), kind: kind.into() };
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
        draining: false,
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

    // Leader: it has not heard n2 since it leads, so n2 is marked dead once
    // silent for over 30 s by the leader's own clock (its record's age by
    // the leader's wall clock is not evidence: clocks differ); n1
    // (heartbeating) stays alive.
    leader.0.store(true, Ordering::SeqCst);
    tokio::time::sleep(CONTROLLER_INTERVAL).await;
    for _ in 0..30 {
        node.pass(Duration::from_secs(1)).await;
    }
    assert_eq!(node.status("n2"), Some(MemberStatus::Alive), "dead within 30 s of leading");
    for _ in 0..2 * CONTROLLER_INTERVAL.as_secs() {
        if node.status("n2") == Some(MemberStatus::Dead) {
            break;
        }
        node.pass(Duration::from_secs(1)).await;
    }
    assert_eq!(node.status("n2"), Some(MemberStatus::Dead), "n2 marked dead");
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
        let age = T0_S + 150 - state.member(id).unwrap().last_heartbeat;
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
    let silent = T0_S + 150 + seconds - stopped_at;
    // The leader sees a beat at its next tick (up to one tick late) and
    // marks the member at the first tick over 30 s after that.
    let tick = CONTROLLER_INTERVAL.as_secs() as i64;
    assert!((31..=31 + 2 * tick).contains(&silent), "marked dead after {silent} s of silence");
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
        node.sink(),
    );
    eventually("three failed heartbeats", || node.errors("heartbeat") >= 3).await;
    assert_eq!(node.status("n1"), None);
    n1.stop().await;
}

/// A node whose wall clock is `skew_s` off the leader's, sharing its
/// monotonic time (tokio's paused time drives both).
fn skewed(node: &Node, id: &str, skew_s: i64) -> (ManualClock, Membership) {
    let clock = ManualClock::new((T0_S + skew_s) as u64 * 1000);
    let me = member(id, 0, MemberStatus::Dead);
    let m = Membership::start(
        node.meta.clone(),
        me,
        leads(false),
        Arc::new(clock.clone()),
        &mut Registry::default(),
        node.sink(),
    );
    (clock, m)
}

/// Issue 35 (clock skew): dead-marking uses the leader's own clock for how
/// long a member has been silent, never the member's clock. A member 100 s
/// behind stays alive while it beats (it was marked dead at every tick
/// when its stamp was compared with the leader's clock); one 100 s ahead
/// is marked dead about 30 s after it stops (it stayed alive for its skew
/// on top).
#[tokio::test(start_paused = true)]
async fn a_members_clock_skew_neither_marks_it_dead_while_it_beats_nor_keeps_it_alive_once_silent()
{
    let node = Node::new();
    let mut registry = Registry::with_prefix("narad");
    let n1 = node.start("n1", leads(true), &mut registry);
    let (behind_clock, behind) = skewed(&node, "behind", -100);
    let (ahead_clock, ahead) = skewed(&node, "ahead", 100);
    let pass = |by: Duration| {
        node.clock.advance(by);
        behind_clock.advance(by);
        ahead_clock.advance(by);
        tokio::time::sleep(by)
    };
    eventually("both beat", || {
        node.status("behind") == Some(Alive) && node.status("ahead") == Some(Alive)
    })
    .await;
    for s in 0..90 {
        pass(Duration::from_secs(1)).await;
        assert_eq!(
            (node.status("behind"), node.status("ahead")),
            (Some(Alive), Some(Alive)),
            "a beating member marked dead after {s} s"
        );
    }

    // "ahead" stops: dead after 30 s of silence (plus at most a tick and a
    // beat interval), not 30 s plus its 100 s of skew.
    tokio::time::timeout(Duration::from_secs(1), ahead.stop()).await.expect("stop is prompt");
    let mut seconds = 0u64;
    while node.status("ahead") == Some(Alive) {
        pass(Duration::from_secs(1)).await;
        seconds += 1;
        assert!(
            seconds < 100,
            "a stopped member ahead of the leader still alive after {seconds} s"
        );
    }
    // Its last beat came up to a beat interval before it stopped, the
    // leader saw it up to a tick later, and marks it at the first tick
    // over 30 s after that.
    let bound = 31 + 2 * CONTROLLER_INTERVAL.as_secs() + HEARTBEAT_INTERVAL.as_secs();
    assert!((25..=bound).contains(&seconds), "marked dead {seconds} s after it stopped");
    assert_eq!(node.status("behind"), Some(Alive));
    for m in [behind, n1] {
        tokio::time::timeout(Duration::from_secs(1), m.stop()).await.expect("stop is prompt");
    }
    assert_eq!(node.errors("controller"), 0);
}

#[test]
fn a_heartbeat_value_never_repeats_even_when_the_clock_steps_back() {
    use crate::members::beat_value;
    assert_eq!(beat_value(100, None), 100);
    assert_eq!(beat_value(105, Some(100)), 105);
    // Stepped back 50 s: each beat still one above the last sent.
    let mut last = Some(105);
    let mut sent = vec![105];
    for now in [60, 65, 70, 110, 115, 116] {
        let v = beat_value(now, last);
        assert!(v > *sent.last().unwrap(), "{v} after {sent:?}");
        sent.push(v);
        last = Some(v);
    }
    assert_eq!(sent, [105, 106, 107, 108, 110, 115, 116]);
}
