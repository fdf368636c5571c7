//! Black-box test of a stale replica (issue 35): real `narad serve`
//! processes on loopback. A node restarted after missing metadata changes
//! must not act on its old replica: its fan-out cursors start only once it
//! has caught up with the Raft leader (SPEC §6, §7.1). Bounded in time;
//! the harness kills its processes and removes its directories however
//! the test ends.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{Cluster, ClusterOpts, key_partition, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

/// Creates `body`'s topic through node `i` once every node is alive, and
/// waits until every node shows its partitions owned; the owners.
fn create_placed(c: &Cluster, i: usize, body: Value) -> Vec<String> {
    c.wait_all_alive(Duration::from_secs(20));
    let name = body["name"].as_str().unwrap().to_owned();
    let r = c.request(i, Method::POST, "/v1/topics").body(body.to_string()).send().unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
    c.wait_placed(&name)
}

/// Produces `n` records keyed to partition `p` of `topic` (3 partitions)
/// through node `node`, numbered from `first`; each batch must answer 202.
fn produce_to(c: &Cluster, node: usize, topic: &str, p: u32, first: u64, n: usize) {
    let msgs: Vec<Value> = (first..)
        .map(|i| (i, format!("key-{i}")))
        .filter(|(_, k)| key_partition(k, 3) == p)
        .take(n)
        .map(|(i, k)| json!({"key": k, "payload": {"i": i}}))
        .collect();
    let r = c
        .request(node, Method::POST, &format!("/v1/topics/{topic}/produce/batch"))
        .body(json!({"messages": msgs}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap_or_default());
}

/// The records of `topic` as node `i` reports its owners' figures: the sum
/// of the partitions' high watermarks, and the figure of partition `p`
/// (`None` while some owner's figures are missing).
fn records(c: &Cluster, i: usize, topic: &str, p: usize) -> Option<(u64, u64)> {
    let (st, v) = c.get_json(i, &format!("/v1/topics/{topic}"))?;
    (st == 200).then_some(())?;
    let parts = v["partition_stats"].as_array()?;
    let hwm: Vec<u64> =
        parts.iter().map(|s| s["high_watermark"].as_u64()).collect::<Option<Vec<u64>>>()?;
    (v["partial"] != true).then(|| (hwm.iter().sum(), hwm[p]))
}

/// How long the restarted owner's state machine applies nothing.
const APPLY_DELAY_MS: u64 = 10_000;

/// Issue 35 case 6: a child detached while the owner of a parent partition
/// was dead gets nothing more once that owner restarts. Before the fix the
/// restarted owner resumed its cursor from its stale replica (which still
/// held the link) and copied the records committed meanwhile into the
/// detached child before it applied the detach.
#[test]
fn a_child_detached_while_a_parent_owner_was_dead_gets_nothing_after_that_owner_restarts() {
    let mut c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(15));
    let parent = create_placed(&c, leader, json!({"name": "sp", "partitions": 3}));
    create_placed(&c, leader, json!({"name": "sc", "partitions": 3, "parent": "sp"}));
    let victim = (0..3)
        .find(|&i| i != leader && parent.contains(&c.node(i).id))
        .expect("a node other than the leader owns a parent partition");
    let p = parent.iter().position(|o| *o == c.node(victim).id).unwrap();
    let entry = (0..3).find(|&i| i != victim && i != leader).unwrap();

    // The link works: records of the victim's parent partition reach the
    // child.
    produce_to(&c, entry, "sp", p as u32, 0, 5);
    wait_for(
        Duration::from_secs(20),
        "the child has the 5 records copied before the detach",
        || (records(&c, entry, "sc", 0)?.0 == 5).then_some(()),
        || format!("{:?}\n{}", records(&c, entry, "sc", 0), c.describe()),
    );

    c.kill9(victim);
    let r = c.request(entry, Method::DELETE, "/v1/topics/sp/children/sc").send().unwrap();
    assert_eq!(r.status().as_u16(), 204, "detach: {}", r.text().unwrap_or_default());
    // Accepted now, committed to the dead owner's partition once it is
    // back: from its stale replica it would copy them into the child.
    produce_to(&c, entry, "sp", p as u32, 1_000, 30);

    // The restarted owner's catch-up is slow (its state machine applies
    // nothing for its first APPLY_DELAY_MS, test hook): it learns of the
    // detach long after the 30 records land in its partition. Without the
    // gate its cursor copies them from the stale replica meanwhile.
    c.restart_with_env(victim, "NARAD_TEST_DELAY_RAFT_APPLY_MS", &APPLY_DELAY_MS.to_string());
    c.wait_ready(victim, Duration::from_secs(30));
    let restarted = Instant::now();
    wait_for(
        Duration::from_secs(30),
        "the 35 parent records are in the restarted owner's partition",
        || (records(&c, entry, "sp", p)?.1 == 35).then_some(()),
        || format!("{:?}\n{}", records(&c, entry, "sp", p), c.describe()),
    );
    let landed = restarted.elapsed();
    // A generous settle past the apply delay: a cursor running from the
    // stale replica copies within a second of the records landing, well
    // before the restarted owner applies the detach.
    std::thread::sleep(Duration::from_millis(APPLY_DELAY_MS).saturating_sub(landed));
    std::thread::sleep(Duration::from_secs(4));
    let child: Vec<Option<(u64, u64)>> = (0..3).map(|i| records(&c, i, "sc", 0)).collect();
    eprintln!(
        "parent records in the restarted owner {landed:?} after its restart; child: {child:?}"
    );
    for (i, figures) in child.iter().enumerate() {
        assert_eq!(
            figures.map(|f| f.0),
            Some(5),
            "the detached child as node {} sees it (5 = only the records before the \
             detach)\n{}",
            c.node(i).id,
            c.describe()
        );
    }
}
