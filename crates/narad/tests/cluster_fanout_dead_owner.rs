//! Black-box test of fan-out while one child partition's owner is dead
//! (issue 34): real `narad serve` processes on loopback. Bounded in time;
//! the harness kills its processes however the test ends.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, ClusterOpts, key_partition};
use reqwest::Method;
use serde_json::{Value, json};

/// Produces `messages` to `topic` through node `node` in batch requests of
/// 200; each must answer 202.
fn produce(c: &Cluster, node: usize, topic: &str, messages: &[Value]) {
    for chunk in messages.chunks(200) {
        let r = c
            .request(node, Method::POST, &format!("/v1/topics/{topic}/produce/batch"))
            .body(json!({"messages": chunk}).to_string())
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap_or_default());
    }
}

/// Consumes and acks `topic` through `nodes` in turn, counting every
/// delivery of every `i`, until `done` holds (`true`) or `deadline` passes
/// (`false`).
fn drain_until(
    c: &Cluster,
    nodes: &[usize],
    topic: &str,
    delivered: &mut BTreeMap<u64, u32>,
    deadline: Instant,
    done: impl Fn(&BTreeMap<u64, u32>) -> bool,
) -> bool {
    let mut turn = 0usize;
    while !done(delivered) {
        if Instant::now() >= deadline {
            return false;
        }
        let node = nodes[turn % nodes.len()];
        turn += 1;
        for i in c.consume_round(node, topic) {
            *delivered.entry(i).or_default() += 1;
        }
    }
    true
}

/// One child partition's owner is killed and stays dead while records are
/// produced to the parent: the child's keyless records reach its other
/// partitions meanwhile (the cursors move them off the dead partition),
/// records keyed to the dead partition wait for it and arrive after its
/// restart, and every record reaches the child with duplicates well under
/// 1.2x (`NARAD_SOAK=1`: the owner stays dead for 3 minutes while 100,000
/// keyless records go through). Before the fix the cursors resent each slab whole every second
/// (issue 34: 300 parent records became 5,600 child records in 150 s) and
/// the partitions after the dead one got nothing.
#[test]
fn a_dead_child_partition_owner_holds_back_only_the_records_keyed_to_it() {
    let mut c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(15));
    c.create_placed(leader, json!({"name": "fp", "partitions": 3}));
    let child = c.create_placed(leader, json!({"name": "fc", "partitions": 3, "parent": "fp"}));
    let victim = (0..3)
        .find(|&i| i != leader && child.contains(&c.node(i).id))
        .expect("a node other than the leader owns a child partition");
    let dead = child.iter().position(|o| *o == c.node(victim).id).unwrap() as u32;
    let live: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    c.kill9(victim);
    let killed = Instant::now();

    // NARAD_SOAK=1: the owner stays dead for 3 minutes while 100,000
    // keyless records go through, drained as they come.
    let soak = std::env::var("NARAD_SOAK").is_ok_and(|v| v == "1");
    let (count, hold) =
        if soak { (100_000, Duration::from_secs(180)) } else { (600, Duration::ZERO) };
    let keyless: Vec<u64> = (0..count).collect();
    let mut delivered: BTreeMap<u64, u32> = BTreeMap::new();
    let slices: Vec<&[u64]> = keyless.chunks(if soak { 500 } else { 600 }).collect();
    for (k, slice) in slices.iter().enumerate() {
        let msgs: Vec<Value> = slice.iter().map(|i| json!({"payload": {"i": i}})).collect();
        produce(&c, live[k % live.len()], "fp", &msgs);
        let due = killed + hold.mul_f64((k + 1) as f64 / slices.len() as f64);
        drain_until(&c, &live, "fc", &mut delivered, due, |_| false);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let kept_up = drain_until(&c, &live, "fc", &mut delivered, deadline, |d| {
        keyless.iter().all(|i| d.contains_key(i))
    });
    let keyless_in = killed.elapsed();
    assert!(
        kept_up,
        "with child partition {dead}'s owner dead: {} of {} keyless records reached the child \
         within 30 s of the last produce\n{}",
        keyless.iter().filter(|i| delivered.contains_key(i)).count(),
        keyless.len(),
        c.describe()
    );

    // Keyed records, some of them for the dead partition: those wait.
    let keyed: Vec<(u64, String)> =
        (1_000_000..1_000_060).map(|i| (i, format!("key-{i}"))).collect();
    let aimed: Vec<u64> =
        keyed.iter().filter(|(_, k)| key_partition(k, 3) == dead).map(|(i, _)| *i).collect();
    assert!(!aimed.is_empty(), "some keys hash to partition {dead}");
    let msgs: Vec<Value> =
        keyed.iter().map(|(i, k)| json!({"key": k, "payload": {"i": i}})).collect();
    produce(&c, live[1], "fp", &msgs);
    let deadline = Instant::now() + Duration::from_secs(3);
    drain_until(&c, &live, "fc", &mut delivered, deadline, |_| false);
    let early: Vec<&u64> = aimed.iter().filter(|i| delivered.contains_key(i)).collect();
    assert!(early.is_empty(), "records keyed to the dead partition delivered: {early:?}");

    c.restart(victim);
    c.wait_ready(victim, Duration::from_secs(30));
    let restarted = Instant::now();
    let all: Vec<usize> = (0..3).collect();
    let want: Vec<u64> = keyless.iter().copied().chain(keyed.iter().map(|(i, _)| *i)).collect();
    let complete =
        drain_until(&c, &all, "fc", &mut delivered, restarted + Duration::from_secs(30), |d| {
            want.iter().all(|i| d.contains_key(i))
        });
    let missing: Vec<&u64> = want.iter().filter(|i| !delivered.contains_key(i)).collect();
    assert!(
        complete,
        "{} of {} records missing after the restart, e.g. {:?}\n{}",
        missing.len(),
        want.len(),
        &missing[..missing.len().min(10)],
        c.describe()
    );
    let deliveries: u32 = delivered.values().sum();
    let ratio = f64::from(deliveries) / want.len() as f64;
    eprintln!(
        "child partition {dead}'s owner dead: {count} keyless records all in the child \
         {keyless_in:?} after the kill; {} records keyed to it delivered {:?} after the restart; \
         {deliveries} deliveries of {} records ({ratio:.3}x)",
        aimed.len(),
        restarted.elapsed(),
        want.len()
    );
    assert!(ratio < 1.2, "duplicates: {deliveries} deliveries of {} records", want.len());
}
