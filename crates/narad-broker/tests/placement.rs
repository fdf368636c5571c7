//! Where a create puts partitions: over the live members of the metastore
//! (alive and heard from within the dead timeout), sorted by id; on a
//! single node, on that node, also once its start-up heartbeat is old.

use std::sync::Arc;
use std::time::Duration;

use narad_broker::Broker;
use narad_broker::limits::MEMBER_DEAD_AFTER;
use narad_broker::metrics::BrokerMetrics;
use narad_clock::ManualClock;
use narad_fs::SimFs;
use narad_meta::{AlterTopicRequest, CreateTopicRequest, Member, MemberStatus};
use prometheus_client::registry::Registry;

mod common;

const T0_MS: u64 = 1_700_000_000_000;
const T0_S: i64 = (T0_MS / 1000) as i64;

async fn broker(clock: &ManualClock) -> Arc<Broker> {
    let metrics = Arc::new(BrokerMetrics::new(&mut Registry::default()));
    let fs = SimFs::new(5).shared();
    Broker::open(common::config(), fs, Arc::new(clock.clone()), metrics).await.unwrap()
}

async fn create(b: &Broker, name: &str, parent: &str, partitions: i64) {
    let req = CreateTopicRequest {
        name: name.into(),
        parent: parent.into(),
        partitions,
        ..Default::default()
    };
    b.create_topic(req).await.unwrap();
}

fn owners(b: &Broker, topic: &str) -> Vec<String> {
    let state = b.meta().snapshot();
    let t = state.topic(topic).unwrap();
    (0..t.partitions()).map(|p| state.assignment(topic, p).unwrap().owner_id.clone()).collect()
}

fn join(b: &Broker, id: &str, last_heartbeat: i64) {
    let m = Member {
        id: id.into(),
        addr: format!("{id}.local:7942"),
        cluster_addr: None,
        status: MemberStatus::Alive,
        last_heartbeat,
        draining: false,
    };
    b.meta().member_join(m).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_owns_every_partition_even_once_its_own_heartbeat_is_old() {
    let clock = ManualClock::new(T0_MS);
    let b = broker(&clock).await;
    create(&b, "a", "", 3).await;
    assert_eq!(owners(&b, "a"), ["n1", "n1", "n1"]);
    // A member left behind by an earlier node id, long silent.
    join(&b, "old-host", T0_S - 3_600);
    clock.advance(MEMBER_DEAD_AFTER + Duration::from_secs(1));
    create(&b, "b", "", 4).await;
    create(&b, "c", "b", 5).await;
    assert_eq!(owners(&b, "b"), ["n1"; 4]);
    assert_eq!(owners(&b, "c"), ["n1"; 5]);
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_places_round_robin_over_the_live_members_sorted_by_id() {
    let clock = ManualClock::new(T0_MS);
    let b = broker(&clock).await;
    join(&b, "n2", T0_S);
    join(&b, "n10", T0_S - 30); // just within the timeout
    join(&b, "n0", T0_S - 31); // overdue: left out
    join(&b, "m", T0_S);
    b.meta().member_dead("m").unwrap(); // dead: left out
    create(&b, "t", "", 4).await;
    // Ring n1, n10, n2 (byte order).
    assert_eq!(owners(&b, "t"), ["n1", "n10", "n2", "n1"]);
    // A child avoids its parent partition's owner.
    create(&b, "child", "t", 5).await;
    let (parent, child) = (owners(&b, "t"), owners(&b, "child"));
    for p in 0..4 {
        assert_ne!(child[p], parent[p], "child partition {p}");
    }
    // Grown partitions go over the ring as it is now (n10 overdue).
    clock.advance(Duration::from_secs(1));
    let grow = AlterTopicRequest { partitions: 6, ..Default::default() };
    b.alter_topic("t", grow).await.unwrap();
    assert_eq!(owners(&b, "t"), ["n1", "n10", "n2", "n1", "n1", "n2"]);
    b.shutdown().await.unwrap();
}
