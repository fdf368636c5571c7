//! Black-box tests of the cross-node produce path (issue 24): real
//! `narad serve` processes on loopback; any node accepts, owners commit,
//! consumers and acks work through any node. Each test bounded in time.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::cluster::{Cluster, ClusterOpts, key_partition, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

/// Creates `name` with `partitions` partitions and a 1 s visibility timeout
/// through node `i` once every node is an alive member (so partitions are
/// spread over all of them), and waits until every node shows every
/// partition owned; returns the owners by partition.
fn create_placed(c: &Cluster, i: usize, name: &str, partitions: u32) -> Vec<String> {
    c.create_placed(
        i,
        json!({"name": name, "partitions": partitions, "visibility_timeout_ms": 1000}),
    )
}

/// Whether a partition directory holds a segment with a frame (more than
/// the 32-byte segment header).
fn holds_records(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok).any(|e| {
                e.file_name().to_string_lossy().ends_with(".log")
                    && e.metadata().is_ok_and(|m| m.len() > 32)
            })
        })
        .unwrap_or(false)
}

/// Produces `{"i": i}` through node `node` at `path`; it must answer 202.
fn produce_i(c: &Cluster, node: usize, path: &str, i: u64) {
    let r = c.request(node, Method::POST, path).body(json!({"i": i}).to_string()).send().unwrap();
    let status = r.status().as_u16();
    assert_eq!(status, 202, "produce {i} at {path} through n{}: {}", node + 1, r.text().unwrap());
}

/// One delivered message: (payload's `i`, partition, receipt handle).
fn messages(body: &str) -> Vec<(u64, u32, String)> {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["payload"]["i"].as_u64().unwrap(),
                m["partition"].as_u64().unwrap() as u32,
                m["receipt_handle"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn records_produced_through_any_node_are_committed_by_their_owner_and_consumed_and_acked_through_any_node()
 {
    let c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(15));
    let owners = create_placed(&c, leader, "work", 6);
    let distinct: BTreeSet<&String> = owners.iter().collect();
    assert_eq!(distinct.len(), 3, "6 partitions over 3 members: {owners:?}");
    // Keyed and keyless records through every node.
    let mut keyed: BTreeMap<u64, u32> = BTreeMap::new();
    let produced = 300u64;
    for i in 0..produced {
        let mut path = "/v1/topics/work/produce".to_owned();
        if i % 2 == 0 {
            let key = format!("k{}", i % 17);
            keyed.insert(i, key_partition(&key, 6));
            path.push_str(&format!("?key={key}"));
        }
        let r = c
            .request((i % 3) as usize, Method::POST, &path)
            .body(json!({"i": i}).to_string())
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap());
    }
    // Consume through every node in turn, ack each batch through the next.
    let mut delivered: BTreeMap<u64, u32> = BTreeMap::new();
    let mut deliveries = 0u64;
    let started = Instant::now();
    let mut turn = 0usize;
    while delivered.len() < produced as usize {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "delivered {} of {produced}; missing {:?}\n{}",
            delivered.len(),
            (0..produced).filter(|i| !delivered.contains_key(i)).take(20).collect::<Vec<_>>(),
            c.describe()
        );
        let node = turn % 3;
        turn += 1;
        let r = c
            .request(node, Method::GET, "/v1/topics/work/consume?max=100&wait=500ms")
            .send()
            .unwrap();
        let status = r.status().as_u16();
        let body = r.text().unwrap();
        if status == 204 {
            continue;
        }
        assert_eq!(status, 200, "{body}");
        let got = messages(&body);
        deliveries += got.len() as u64;
        let handles: Vec<&String> = got.iter().map(|(_, _, h)| h).collect();
        let ack = c
            .request((node + 1) % 3, Method::POST, "/v1/topics/work/ack")
            .body(json!({"receipt_handles": handles}).to_string())
            .send()
            .unwrap();
        assert_eq!(ack.status().as_u16(), 200);
        let results: Value = serde_json::from_str(&ack.text().unwrap()).unwrap();
        for r in results["results"].as_array().unwrap() {
            assert_eq!(r["status"], 204, "an ack through another node: {results}");
        }
        for (i, p, _) in got {
            if let Some(&want) = keyed.get(&i) {
                assert_eq!(p, want, "record {i} of its key's partition");
            }
            delivered.insert(i, p);
        }
    }
    eprintln!(
        "{produced} produced through 3 nodes, {deliveries} deliveries in {:?}",
        started.elapsed()
    );
    // Every partition got records (keyless records spread), and the acks
    // stuck: past the 1 s visibility timeout nothing comes back, through
    // any node, pinned or not.
    let partitions: BTreeSet<u32> = delivered.values().copied().collect();
    assert_eq!(partitions.len(), 6, "{partitions:?}");
    std::thread::sleep(Duration::from_millis(1500));
    for node in 0..3 {
        let r = c.request(node, Method::GET, "/v1/topics/work/consume?max=100").send().unwrap();
        assert_eq!(r.status().as_u16(), 204, "redelivered after its ack: {}", r.text().unwrap());
        for p in 0..6 {
            let r = c
                .request(node, Method::GET, &format!("/v1/topics/work/consume?partition={p}"))
                .send()
                .unwrap();
            assert_eq!(r.status().as_u16(), 204, "partition {p} through n{}", node + 1);
        }
    }
    // Each partition's records sit in its owner's log only.
    for (p, owner) in owners.iter().enumerate() {
        for n in 0..3 {
            let has = holds_records(&c.node(n).data_dir.join(format!("topics/work/p{p:05}")));
            assert_eq!(has, &c.node(n).id == owner, "partition {p} on n{}", n + 1);
        }
    }
    let forwarded = (0..3)
        .map(|n| metric(&c, n, "narad_cluster_forwarded_requests_total{op=\"consume\""))
        .sum::<f64>();
    let acks = (0..3)
        .map(|n| metric(&c, n, "narad_cluster_forwarded_requests_total{op=\"ack\""))
        .sum::<f64>();
    assert!(forwarded > 0.0 && acks > 0.0, "forwarded consumes {forwarded}, acks {acks}");
    // A replay through a node that does not own the partition is served
    // by the owner.
    let (p, owner) = owners.iter().enumerate().find(|(_, o)| *o != &c.node(0).id).unwrap();
    let r = c
        .request(0, Method::GET, &format!("/v1/topics/work/consume?partition={p}&offset=0"))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "replay of {owner}'s partition {p} through n1");
    let m: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    assert_eq!((m["partition"].as_u64(), m["offset"].as_u64()), (Some(p as u64), Some(0)));
    assert!(m.get("receipt_handle").is_none(), "a replay leases nothing: {m}");
}

/// Gathers deliveries of `topic`: consumes through `nodes` in turn (batch,
/// short long-poll), acks each batch, and counts every delivery of every
/// `i`; stops when `done` says so or at `deadline` (then `None`).
fn drain_until(
    c: &Cluster,
    nodes: &[usize],
    topic: &str,
    delivered: &mut BTreeMap<u64, u32>,
    deadline: Instant,
    mut done: impl FnMut(&BTreeMap<u64, u32>) -> bool,
) -> Option<()> {
    let mut turn = 0usize;
    loop {
        if done(delivered) {
            return Some(());
        }
        if Instant::now() >= deadline {
            return None;
        }
        let node = nodes[turn % nodes.len()];
        turn += 1;
        let Ok(r) = c
            .request(node, Method::GET, &format!("/v1/topics/{topic}/consume?max=100&wait=200ms"))
            .send()
        else {
            continue;
        };
        if r.status().as_u16() != 200 {
            continue;
        }
        let got = messages(&r.text().unwrap());
        let handles: Vec<&String> = got.iter().map(|(_, _, h)| h).collect();
        let _ = c
            .request(node, Method::POST, &format!("/v1/topics/{topic}/ack"))
            .body(json!({"receipt_handles": handles}).to_string())
            .send();
        for (i, p, _) in got {
            *delivered.entry(i).or_default() += 1;
            let _ = p;
        }
    }
}

/// Drains `topic` through `nodes` into `delivered` until every `i` of
/// `want` was delivered, within `within`; panics with the count and the
/// cluster's state otherwise.
fn drain_all(
    c: &Cluster,
    nodes: &[usize],
    topic: &str,
    delivered: &mut BTreeMap<u64, u32>,
    want: impl Iterator<Item = u64> + Clone,
    within: Duration,
) {
    let total = want.clone().count();
    let done = drain_until(c, nodes, topic, delivered, Instant::now() + within, |d| {
        want.clone().all(|i| d.contains_key(&i))
    });
    assert!(
        done.is_some(),
        "{topic}: {} of {total} delivered\n{}",
        want.filter(|i| delivered.contains_key(i)).count(),
        c.describe()
    );
}

/// kill -9 of an owner during a produce load spread over the other nodes:
/// every produce to a live node keeps answering 202, the dead owner's share
/// of the records reaches sibling partitions after the reroute grace (3 s
/// of failed commits; membership marks it dead only after 30 s), and after
/// a restart and a full drain none of the 202'd records is missing.
#[test]
fn an_owner_killed_under_produce_load_costs_no_acked_record_and_its_records_reroute() {
    let mut c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(15));
    let owners = create_placed(&c, leader, "load", 6);
    let victim = (0..3).find(|&i| i != leader).unwrap();
    let victim_id = c.node(victim).id.clone();
    let live: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let victim_partition = owners.iter().position(|o| *o == victim_id).expect("it owns one") as u32;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let next = std::sync::atomic::AtomicU64::new(0);
    let acked = std::sync::Mutex::new(Vec::<u64>::new());
    let mut delivered: BTreeMap<u64, u32> = BTreeMap::new();
    // Records pinned to one of the victim's partitions after the kill,
    // numbered from here: the first to be delivered marks when its share
    // reaches a sibling (every one of them does, the first record of a
    // failed commit included: a failing destination holds no record).
    let markers = 1u64 << 40..(1u64 << 40) + 20;
    let mut reroute = None;
    /// Stops the producers however the scope ends (a failed assertion
    /// included), so the scope never waits for them forever.
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for &node in &live {
            let (c, stop, next, acked) = (&c, &stop, &next, &acked);
            s.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    produce_i(c, node, "/v1/topics/load/produce", i);
                    acked.lock().unwrap().push(i);
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
        }
        std::thread::sleep(Duration::from_millis(1500));
        // The victim dies; records pinned to one of its partitions mark when
        // its share starts reaching a sibling.
        let pid = c.node(victim).pid().expect("the victim runs");
        let killed_ok = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
        assert!(killed_ok.is_ok_and(|s| s.success()));
        let killed = Instant::now();
        for m in markers.clone() {
            produce_i(
                &c,
                live[0],
                &format!("/v1/topics/load/produce?partition={victim_partition}"),
                m,
            );
            acked.lock().unwrap().push(m);
        }
        let found =
            drain_until(&c, &live, "load", &mut delivered, killed + Duration::from_secs(20), |d| {
                markers.clone().any(|m| d.contains_key(&m))
            });
        assert!(
            found.is_some(),
            "the dead owner's record never reached a sibling ({} delivered, {} acked); partitions: {:?}\n{}",
            delivered.len(),
            acked.lock().unwrap().len(),
            c.get_json(live[0], "/v1/topics/load").map(|(_, v)| v["partition_stats"].clone()),
            c.describe()
        );
        reroute = Some(killed.elapsed());
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let reroute = reroute.unwrap();
    eprintln!("kill -9 of the owner to its pinned record consumable on a sibling: {reroute:?}");
    // Not before the grace: the commits to the dead owner have to fail for
    // 3 s first (generously bounded above).
    assert!(reroute >= Duration::from_millis(2500), "rerouted before the grace: {reroute:?}");
    assert!(reroute < Duration::from_secs(15), "{reroute:?}");
    // The owner comes back; everything 202'd is delivered.
    c.kill9(victim); // reaps it
    c.restart(victim);
    c.wait_ready(victim, Duration::from_secs(30));
    let acked = acked.into_inner().unwrap();
    let all: Vec<usize> = (0..3).collect();
    let drained = drain_until(
        &c,
        &all,
        "load",
        &mut delivered,
        Instant::now() + Duration::from_secs(60),
        |d| acked.iter().all(|i| d.contains_key(i)),
    );
    let missing: Vec<&u64> = acked.iter().filter(|i| !delivered.contains_key(i)).collect();
    assert!(
        drained.is_some() && missing.is_empty(),
        "{} of {} acked records missing: {:?}\n{}",
        missing.len(),
        acked.len(),
        missing.iter().take(20).collect::<Vec<_>>(),
        c.describe()
    );
    let deliveries: u32 = delivered.values().sum();
    eprintln!(
        "{} records acked, all delivered; {deliveries} deliveries of {} distinct (duplicates {})",
        acked.len(),
        delivered.len(),
        deliveries as usize - delivered.len()
    );
}

/// A parent's fan-out cursors run on each parent partition's owner and
/// commit into the child's partitions on their owners, wherever they are.
#[test]
fn a_parents_records_fan_out_into_child_partitions_other_nodes_own() {
    let c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(15));
    create_placed(&c, leader, "parent", 3);
    let r = c
        .request(leader, Method::POST, "/v1/topics")
        .body(json!({"name": "kid", "partitions": 4, "parent": "parent"}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
    let kid_owners = wait_for(
        Duration::from_secs(20),
        "every partition of the child owned",
        || {
            let (_, v) = c.get_json(leader, "/v1/topics/kid")?;
            v["partition_stats"]
                .as_array()?
                .iter()
                .map(|p| p["owner_node"].as_str().map(str::to_owned))
                .collect::<Option<Vec<String>>>()
        },
        || c.describe(),
    );
    let n = 60u64;
    for i in 0..n {
        produce_i(&c, (i % 3) as usize, "/v1/topics/parent/produce", i);
    }
    let all: Vec<usize> = (0..3).collect();
    for topic in ["kid", "parent"] {
        let mut delivered = BTreeMap::new();
        drain_all(&c, &all, topic, &mut delivered, 0..n, Duration::from_secs(30));
    }
    // The child's records sit in each child partition's owner's log only.
    for (p, owner) in kid_owners.iter().enumerate() {
        for node in 0..3 {
            let has = holds_records(&c.node(node).data_dir.join(format!("topics/kid/p{p:05}")));
            assert!(!has || &c.node(node).id == owner, "kid/{p} committed on n{}", node + 1);
        }
    }
}

/// The value of a counter line of node `i`'s `/metrics` that starts with
/// `series` (name and labels), or 0.
fn metric(c: &Cluster, i: usize, series: &str) -> f64 {
    let Ok(r) = c.request(i, Method::GET, "/metrics").send() else { return 0.0 };
    let body = r.text().unwrap_or_default();
    body.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The first partition of `owners` not owned by node `i`, and its owner's
/// index.
fn remote_partition(c: &Cluster, owners: &[String], i: usize) -> (u32, usize) {
    let p = owners.iter().position(|o| *o != c.node(i).id).expect("another node owns one");
    (p as u32, c.index_of(&owners[p]).unwrap())
}

/// An owner on a release from before topic incarnations refuses the
/// batch's incarnation section (simulated by a test switch on n2): the
/// sender commits the batch again without ids, and sends that owner none
/// for 2 minutes (the clock-driven expiry is unit-tested in
/// `remote_owner`), so one refusal is all it costs.
#[test]
fn an_owner_that_refuses_incarnation_ids_gets_the_records_without_them() {
    let opts = ClusterOpts::dev().node_env(1, "NARAD_TEST_REFUSE_INCARNATION_SECTION", "1");
    let c = Cluster::start(3, opts);
    let leader = c.leader(Duration::from_secs(15));
    let owners = create_placed(&c, leader, "mixed", 3);
    let p = owners.iter().position(|o| o == "n2").expect("n2 owns a partition") as u32;
    let n = 30u64;
    for i in 0..n {
        produce_i(&c, 0, &format!("/v1/topics/mixed/produce?partition={p}"), i);
        if i == n / 2 {
            std::thread::sleep(Duration::from_millis(300)); // more than one batch
        }
    }
    let mut delivered = BTreeMap::new();
    let all: Vec<usize> = (0..3).collect();
    drain_all(&c, &all, "mixed", &mut delivered, 0..n, Duration::from_secs(30));
    let fallbacks =
        metric(&c, 0, r#"narad_ingress_dispatch_legacy_owner_fallbacks_total{peer="n2"}"#);
    let committed = metric(
        &c,
        0,
        r#"narad_ingress_dispatch_remote_commits_total{peer="n2",outcome="committed"}"#,
    );
    eprintln!("{fallbacks} fallback(s), {committed} commits to n2");
    assert_eq!(fallbacks, 1.0, "one refusal, then batches without ids");
    assert!(committed >= 1.0);
    assert_eq!(c.node(0).log().matches("sending without ids for 2 minutes").count(), 1);
}

/// A remote commit carries at most 8 MiB of records: 12 records of 900
/// KiB for a partition another node owns, accepted in one batch produce
/// (one WAL write, so the dispatcher reads them together), go in several
/// commits; a record near the 1 MiB body limit goes through.
#[test]
fn a_remote_backlog_over_8_mib_is_split_and_a_record_near_1_mib_goes_through() {
    let c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(15));
    let owners = create_placed(&c, leader, "big", 3);
    let (p, owner) = remote_partition(&c, &owners, 0);
    let owner_id = c.node(owner).id.clone();
    let pad = "x".repeat(900 << 10);
    let n = 12u64;
    let messages: Vec<Value> =
        (0..n).map(|i| json!({"payload": {"i": i, "pad": pad}, "partition": p})).collect();
    let r = c
        .request(0, Method::POST, "/v1/topics/big/produce/batch")
        .body(json!({ "messages": messages }).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap());
    let near = "y".repeat((1 << 20) - 64);
    let r = c
        .request(0, Method::POST, &format!("/v1/topics/big/produce?partition={p}"))
        .body(json!({"i": n, "pad": near}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "a record near 1 MiB is accepted");
    let mut delivered = BTreeMap::new();
    let all: Vec<usize> = (0..3).collect();
    drain_all(&c, &all, "big", &mut delivered, 0..=n, Duration::from_secs(60));
    let series = format!(
        r#"narad_ingress_dispatch_remote_commits_total{{peer="{owner_id}",outcome="committed"}}"#
    );
    let commits = metric(&c, 0, &series);
    let bytes = metric(
        &c,
        0,
        &format!(r#"narad_ingress_dispatch_remote_bytes_total{{peer="{owner_id}"}}"#),
    );
    let timed = metric(
        &c,
        0,
        &format!(r#"narad_ingress_dispatch_remote_commit_seconds_count{{peer="{owner_id}"}}"#),
    );
    eprintln!("{commits} commits of {bytes} bytes to {owner_id}");
    assert!(commits >= 2.0, "~11.5 MiB went in one commit: {commits}");
    assert!(timed >= commits, "every answered commit timed: {timed} of {commits}");
    assert!(bytes >= (12 * (900 << 10)) as f64, "{bytes}");
}

/// SIGSTOP of an owner (its commits hang): the other partitions keep
/// flowing, its share reroutes after the grace, and after SIGCONT nothing
/// is missing.
#[test]
fn an_owner_paused_with_sigstop_holds_up_nothing_and_loses_nothing() {
    let mut c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(15));
    create_placed(&c, leader, "pause", 6);
    let victim = (0..3).find(|&i| i != leader).unwrap();
    let live: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    c.stop(victim);
    let paused = Instant::now();
    let n = 300u64;
    for i in 0..n {
        produce_i(&c, live[(i % 2) as usize], "/v1/topics/pause/produce", i);
    }
    // While it is paused: everything but the probes (one record per
    // destination the dispatchers kept for the paused owner) is delivered.
    let mut delivered = BTreeMap::new();
    let most =
        drain_until(&c, &live, "pause", &mut delivered, paused + Duration::from_secs(20), |d| {
            d.len() as u64 >= n - 8
        });
    assert!(most.is_some(), "{} of {n} delivered while paused\n{}", delivered.len(), c.describe());
    eprintln!("{} of {n} delivered {:?} after the pause", delivered.len(), paused.elapsed());
    c.cont(victim);
    let all: Vec<usize> = (0..3).collect();
    drain_all(&c, &all, "pause", &mut delivered, 0..n, Duration::from_secs(40));
}

/// Delete + recreate of a topic while another node's WAL holds a backlog
/// of the old incarnation for it (the partition's owner is paused, so the
/// records wait in the accepting node's WAL): the backlog is discarded
/// once the leader confirms the old incarnation gone, and none of it ever
/// enters the new topic. (That nothing is discarded without the leader's
/// word: the next test.)
#[test]
fn a_backlog_of_a_deleted_incarnation_never_enters_the_recreated_topic() {
    let mut c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(15));
    let owners = create_placed(&c, leader, "dr", 3);
    let owner = (0..3).find(|&i| i != leader).unwrap();
    let p = owners.iter().position(|o| *o == c.node(owner).id).unwrap();
    let accept = (0..3).find(|&i| i != owner).unwrap();
    c.stop(owner);
    let old = 1_000u64..1_050;
    for i in old.clone() {
        produce_i(&c, accept, &format!("/v1/topics/dr/produce?partition={p}"), i);
    }
    // Within the reroute grace: the topic is deleted and made again.
    let r = c.request(leader, Method::DELETE, "/v1/topics/dr").send().unwrap();
    assert_eq!(r.status().as_u16(), 204, "{}", r.text().unwrap());
    let r = c
        .request(leader, Method::POST, "/v1/topics")
        .body(json!({"name": "dr", "partitions": 3, "visibility_timeout_ms": 1000}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
    // The owner stays paused until the old records were discarded: its
    // commit in flight fails (unanswered ping), the records go back to the
    // WAL and resolve against the new incarnation. (Resumed at once, it
    // may commit them into the old incarnation before it applies the
    // delete, which is just as right: they go with it.)
    let discarded = wait_for(
        Duration::from_secs(20),
        "the old backlog discarded on the accepting node",
        || {
            let d = metric(&c, accept, "narad_dispatch_discarded_total");
            (d >= 1.0).then_some(d)
        },
        || {
            let log = c.node(accept).log();
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("dispatch") || l.contains("WARN") || l.contains("keeping"))
                .collect();
            format!(
                "leader n{}, owner n{}, accepting n{}; accepting node's dispatch lines:\n{}\n{}",
                leader + 1,
                owner + 1,
                accept + 1,
                lines.join("\n"),
                c.describe()
            )
        },
    );
    c.cont(owner);
    // The resumed owner's replica catches up with the delete and the
    // create before anything is produced through it: a node that has not
    // applied them yet stamps its records with the old incarnation, and
    // they go with it (faster since a failing destination holds no probe:
    // everything else here settles within a second of the resume).
    let leader_commit = c.status(leader).and_then(|s| s["commit_index"].as_u64()).unwrap();
    wait_for(
        Duration::from_secs(20),
        "the resumed owner's replica caught up",
        || {
            let applied = c.status(owner)?["applied_index"].as_u64()?;
            (applied >= leader_commit).then_some(())
        },
        || c.describe(),
    );
    // The rest settles too: the accepting node's backlog drains.
    wait_for(
        Duration::from_secs(20),
        "the accepting node's dispatch backlog drained",
        || (metric(&c, accept, "narad_ingress_dispatch_backlog_records") == 0.0).then_some(()),
        || c.describe(),
    );
    let new = 0u64..30;
    for i in new.clone() {
        produce_i(&c, (i % 3) as usize, "/v1/topics/dr/produce", i);
    }
    let mut delivered = BTreeMap::new();
    let all: Vec<usize> = (0..3).collect();
    drain_all(&c, &all, "dr", &mut delivered, new.clone(), Duration::from_secs(30));
    // A little longer: nothing of the old incarnation shows up.
    let _ = drain_until(
        &c,
        &all,
        "dr",
        &mut delivered,
        Instant::now() + Duration::from_secs(2),
        |_| false,
    );
    let leaked: Vec<&u64> = delivered.keys().filter(|i| old.contains(i)).collect();
    assert!(leaked.is_empty(), "records of the deleted incarnation in the new topic: {leaked:?}");
    eprintln!("{discarded} old records discarded on the accepting node; none in the new topic");
}

/// A backlog of a deleted topic on a node that applied the delete stays in
/// its WAL while the leader cannot confirm the delete (leader and owner
/// paused with SIGSTOP: no leader is reachable), and is discarded only after
/// the leader answers again.
///
/// The leader is paused right after the delete's 204; the accepting node
/// re-reads its skipped records about once a second, so it nearly always
/// asks after the pause. If it already discarded (it asked first), the
/// scenario did not happen and runs again on a new topic; a node that
/// discards without asking fails all three attempts.
#[test]
fn a_deleted_topics_backlog_is_kept_while_the_leader_cannot_confirm_the_delete() {
    const DISCARDED: &str = "narad_dispatch_discarded_total";
    const BACKLOG: &str = "narad_ingress_dispatch_backlog_records";
    let mut c = Cluster::start(3, ClusterOpts::dev());
    for attempt in 0..3 {
        let leader = c.leader(Duration::from_secs(15));
        let topic = format!("lu{attempt}");
        let owners = create_placed(&c, leader, &topic, 3);
        let owner = (0..3).find(|&i| i != leader).unwrap();
        let accept = (0..3).find(|&i| i != leader && i != owner).unwrap();
        let p = owners.iter().position(|o| *o == c.node(owner).id).unwrap();
        let before = metric(&c, accept, DISCARDED);
        c.stop(owner);
        for i in 0..40 {
            produce_i(&c, accept, &format!("/v1/topics/{topic}/produce?partition={p}"), i);
        }
        // Within the reroute grace: deleted, then the leader paused.
        let r = c.request(leader, Method::DELETE, &format!("/v1/topics/{topic}")).send().unwrap();
        assert_eq!(r.status().as_u16(), 204, "{}", r.text().unwrap());
        c.stop(leader);
        let settle = |c: &mut Cluster| {
            c.cont(leader);
            c.cont(owner);
            wait_for(
                Duration::from_secs(30),
                "the accepting node's dispatch backlog drained",
                || (metric(c, accept, BACKLOG) == 0.0).then_some(()),
                || c.describe(),
            );
        };
        if metric(&c, accept, DISCARDED) > before {
            eprintln!("attempt {attempt}: the accepting node asked before the leader was paused");
            settle(&mut c);
            continue;
        }
        // Five seconds without a reachable leader: the records stay.
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            assert_eq!(
                metric(&c, accept, DISCARDED),
                before,
                "records discarded while the leader could not confirm the delete\n{}",
                c.describe()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let held = metric(&c, accept, BACKLOG);
        assert!(held >= 1.0, "the backlog is still in the WAL: {held}\n{}", c.describe());
        settle(&mut c);
        let discarded = metric(&c, accept, DISCARDED) - before;
        assert!(discarded >= 1.0, "discarded once the leader answered: {discarded}");
        eprintln!(
            "attempt {attempt}: {held} records held for 5 s without a leader, {discarded} discarded after"
        );
        return;
    }
    panic!("in three attempts the accepting node discarded before the leader was paused");
}

/// The sum of `next_offset` over `topic`'s partitions as node `i` reports
/// them (every owner's figures).
fn committed(c: &Cluster, i: usize, topic: &str) -> Option<u64> {
    let (status, v) = c.get_json(i, &format!("/v1/topics/{topic}"))?;
    (status == 200).then_some(())?;
    v["partition_stats"].as_array()?.iter().map(|p| p["next_offset"].as_u64()).sum()
}

/// Attach, lag and detach of a child whose parent's partitions are owned
/// by three nodes, each change made through a node that owns only one of
/// them: the child gets every record the parent commits after the attach
/// answered and none from before; the handling node opens no partition of
/// the parent it does not own; every node reports the lag of every
/// owner's cursors (complete, 0 once drained); after the detach answered,
/// no owner's cursor copies another record.
#[test]
fn attach_lag_and_detach_reach_every_owner_of_the_parents_partitions() {
    let c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(15));
    let owners = create_placed(&c, leader, "fp", 3);
    create_placed(&c, leader, "fk", 3);
    let handler = (leader + 1) % 3;
    for i in 0..30u64 {
        produce_i(&c, (i % 3) as usize, "/v1/topics/fp/produce", i);
    }
    wait_for(
        Duration::from_secs(20),
        "the records from before the attach committed",
        || (committed(&c, leader, "fp")? == 30).then_some(()),
        || c.describe(),
    );
    let r = c
        .request(handler, Method::POST, "/v1/topics/fp/children")
        .body(json!({"child": "fk"}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().unwrap());
    // The attach answers once every owner started its cursors: the very
    // first read of the lag is complete.
    let (status, v) = c.get_json(handler, "/v1/topics/fp/children").expect("children answer");
    assert_eq!((status, &v["children"][0]["lag_complete"]), (200, &json!(true)), "{v}");
    for (p, owner) in owners.iter().enumerate() {
        let dir = c.node(handler).data_dir.join(format!("topics/fp/p{p:05}"));
        assert!(
            *owner == c.node(handler).id || !dir.exists(),
            "the attach through n{} opened fp/{p}, which {owner} owns",
            handler + 1
        );
    }
    let after = 1_000u64..1_030;
    for i in after.clone() {
        produce_i(&c, (i % 3) as usize, "/v1/topics/fp/produce", i);
    }
    let all: Vec<usize> = (0..3).collect();
    let mut delivered = BTreeMap::new();
    drain_all(&c, &all, "fk", &mut delivered, after.clone(), Duration::from_secs(30));
    for node in 0..3 {
        wait_for(
            Duration::from_secs(20),
            "every owner's cursors in the lag, nothing left",
            || {
                let (status, v) = c.get_json(node, "/v1/topics/fp/children")?;
                let kid = &v["children"][0];
                (status == 200
                    && kid["name"] == "fk"
                    && kid["lag_complete"] == true
                    && kid["lag_messages"] == 0)
                    .then_some(())
            },
            || {
                format!(
                    "n{}: {:?}\n{}",
                    node + 1,
                    c.get_json(node, "/v1/topics/fp/children"),
                    c.describe()
                )
            },
        );
    }
    let r =
        c.request((leader + 2) % 3, Method::DELETE, "/v1/topics/fp/children/fk").send().unwrap();
    assert_eq!(r.status().as_u16(), 204, "{}", r.text().unwrap());
    let post = 2_000u64..2_030;
    for i in post.clone() {
        produce_i(&c, (i % 3) as usize, "/v1/topics/fp/produce", i);
    }
    wait_for(
        Duration::from_secs(20),
        "the records from after the detach committed in the parent",
        || (committed(&c, leader, "fp")? == 90).then_some(()),
        || c.describe(),
    );
    let _ = drain_until(
        &c,
        &all,
        "fk",
        &mut delivered,
        Instant::now() + Duration::from_secs(3),
        |_| false,
    );
    let before: Vec<&u64> = delivered.keys().filter(|i| **i < 30).collect();
    assert!(before.is_empty(), "records committed before the attach in the child: {before:?}");
    let late: Vec<&u64> = delivered.keys().filter(|i| post.contains(i)).collect();
    assert!(late.is_empty(), "records produced after the detach in the child: {late:?}");
}

/// A delayed child whose parent's partitions are on three nodes: no record
/// reaches it before its parent commit time + the delay (measured from
/// before the produce, a lower bound), and every one does.
#[test]
fn a_delayed_childs_records_wait_out_the_delay_on_every_owner() {
    let c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(15));
    create_placed(&c, leader, "dp", 3);
    let r = c
        .request(leader, Method::POST, "/v1/topics")
        .body(
            json!({"name": "dk", "partitions": 3, "parent": "dp", "fanout_delay_ms": 2000})
                .to_string(),
        )
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
    let mut sent = BTreeMap::new();
    for i in 0..30u64 {
        sent.insert(i, Instant::now());
        produce_i(&c, (i % 3) as usize, "/v1/topics/dp/produce", i);
    }
    let mut arrived: BTreeMap<u64, Instant> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut turn = 0;
    while arrived.len() < 30 && Instant::now() < deadline {
        let node = turn % 3;
        turn += 1;
        let Ok(r) = c.request(node, Method::GET, "/v1/topics/dk/consume?max=100&wait=100ms").send()
        else {
            continue;
        };
        if r.status().as_u16() != 200 {
            continue;
        }
        let now = Instant::now();
        let got = messages(&r.text().unwrap());
        let handles: Vec<&String> = got.iter().map(|(_, _, h)| h).collect();
        let _ = c
            .request(node, Method::POST, "/v1/topics/dk/ack")
            .body(json!({"receipt_handles": handles}).to_string())
            .send();
        for (i, _, _) in got {
            arrived.entry(i).or_insert(now);
        }
    }
    assert_eq!(
        arrived.len(),
        30,
        "delivered after the delay: {:?}\n{}",
        arrived.keys(),
        c.describe()
    );
    // Commit times are whole milliseconds on the owner's clock: allow 50 ms.
    let early: Vec<(u64, Duration)> = arrived
        .iter()
        .map(|(i, at)| (*i, at.duration_since(sent[i])))
        .filter(|(_, waited)| *waited < Duration::from_millis(1950))
        .collect();
    assert!(early.is_empty(), "delivered before the 2 s delay: {early:?}");
    let slowest = arrived.iter().map(|(i, at)| at.duration_since(sent[i])).max().unwrap();
    eprintln!("30 records through a 2 s delayed child on three owners; slowest after {slowest:?}");
}

/// Every method on every data route, through a node that owns none of the
/// partition it names (so each is forwarded to its owner, or answered
/// from every owner's figures): no 5xx, and the node goes on serving.
#[test]
fn every_method_on_every_data_route_through_a_non_owner_answers_without_a_5xx() {
    let c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(15));
    let owners = create_placed(&c, leader, "mt", 3);
    create_placed(&c, leader, "mc", 3);
    let via = (leader + 1) % 3;
    let (p, _) = remote_partition(&c, &owners, via);
    for i in 0..20 {
        produce_i(&c, via, &format!("/v1/topics/mt/produce?partition={p}"), i);
    }
    let handle = wait_for(
        Duration::from_secs(20),
        "a record of the remote partition leased through the non-owner",
        || {
            let r = c
                .request(
                    via,
                    Method::GET,
                    &format!("/v1/topics/mt/consume?partition={p}&wait=200ms"),
                )
                .send()
                .ok()?;
            (r.status().as_u16() == 200).then_some(())?;
            let v: Value = serde_json::from_str(&r.text().ok()?).ok()?;
            v["receipt_handle"].as_str().map(str::to_owned)
        },
        || c.describe(),
    );
    let batch = json!({"messages": [{"payload": {"i": 1}, "partition": p}]}).to_string();
    let handles = json!({ "receipt_handles": [handle] }).to_string();
    let routes: Vec<(String, String)> = vec![
        (format!("/v1/topics/mt?partition={p}"), json!({"partitions": 6}).to_string()),
        (format!("/v1/topics/mt/produce?partition={p}"), json!({"i": 2}).to_string()),
        ("/v1/topics/mt/produce/batch".into(), batch),
        (format!("/v1/topics/mt/consume?partition={p}&wait=0s"), String::new()),
        (format!("/v1/topics/mt/consume?partition={p}&offset=0"), String::new()),
        (format!("/v1/topics/mt/consume?partition={p}&offset=0&max=5"), String::new()),
        ("/v1/topics/mt/consume?wait=0s&max=5".into(), String::new()),
        (format!("/v1/topics/mt/ack?receipt_handle={handle}&extend=5s"), String::new()),
        (format!("/v1/topics/mt/ack?receipt_handle={handle}"), String::new()),
        ("/v1/topics/mt/ack".into(), handles),
        ("/v1/topics/mt/children".into(), json!({"child": "mc"}).to_string()),
        ("/v1/topics/mt/children/mc".into(), String::new()),
        ("/v1/topics".into(), json!({"name": "mt2"}).to_string()),
        ("/v1/cluster/members".into(), String::new()),
        ("/v1/cluster/status".into(), String::new()),
    ];
    let methods = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::OPTIONS,
        Method::from_bytes(b"FROB").unwrap(),
        Method::DELETE,
    ];
    let mut server_errors = Vec::new();
    for method in &methods {
        for (route, body) in &routes {
            let r = c.request(via, method.clone(), route).body(body.clone()).send().unwrap();
            let status = r.status().as_u16();
            if status >= 500 {
                server_errors.push(format!("{method} {route}: {status} {}", r.text().unwrap()));
            }
        }
    }
    assert!(server_errors.is_empty(), "5xx answers:\n{}", server_errors.join("\n"));
    let r = c.request(via, Method::GET, "/readyz").send().unwrap();
    assert_eq!(r.status().as_u16(), 200, "the node still serves");
}

/// A node out of file descriptors (a low limit, flooded with idle
/// connections) while other nodes commit records on its partitions, some
/// of a topic it has not opened yet: every 202'd record is delivered once
/// the flood ends, and the node still serves and stays a member.
#[test]
fn a_node_out_of_file_descriptors_loses_no_acked_record() {
    let c = Cluster::start(3, ClusterOpts::dev().nofile(1, 64));
    // n2 is flooded: every HTTP request goes to n1 or n3 (n2 may lead:
    // Raft and commits travel over its QUIC socket, opened at start).
    create_placed(&c, 0, "fd1", 3);
    // Idle connections until n2's listen backlog is full too (a connect
    // that does not complete within 200 ms: its SYN was dropped).
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], c.node(1).http_port));
    let flood: Vec<std::net::TcpStream> = (0..400)
        .map_while(|_| std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok())
        .collect();
    eprintln!("{} idle connections to n2", flood.len());
    // A topic created during the flood: its partitions on n2 are opened
    // (files) while n2 has no descriptors to spare.
    let r = c
        .request(0, Method::POST, "/v1/topics")
        .body(json!({"name": "fd2", "partitions": 3, "visibility_timeout_ms": 1000}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
    wait_for(
        Duration::from_secs(20),
        "n1 and n3 show every partition of fd2 owned",
        || {
            [0, 2]
                .iter()
                .all(|&i| {
                    c.get_json(i, "/v1/topics/fd2").is_some_and(|(status, v)| {
                        status == 200
                            && v["partition_stats"]
                                .as_array()
                                .is_some_and(|ps| ps.iter().all(|p| p["owner_node"].is_string()))
                    })
                })
                .then_some(())
        },
        || c.describe(),
    );
    let senders: Vec<usize> = vec![0, 2];
    let n = 60u64;
    for topic in ["fd1", "fd2"] {
        for i in 0..n {
            produce_i(&c, senders[(i % 2) as usize], &format!("/v1/topics/{topic}/produce"), i);
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    drop(flood);
    let all: Vec<usize> = (0..3).collect();
    for topic in ["fd1", "fd2"] {
        // Every partition, n2's included, through every node.
        let mut delivered = BTreeMap::new();
        drain_all(&c, &all, topic, &mut delivered, 0..n, Duration::from_secs(40));
    }
    let r = c.request(1, Method::GET, "/readyz").send().unwrap();
    assert_eq!(r.status().as_u16(), 200, "n2 serves after the flood\n{}", c.describe());
    let (_, members) = c.get_json(0, "/v1/cluster/members").unwrap();
    let alive = members["members"].as_array().unwrap().iter().filter(|m| m["status"] == "alive");
    assert_eq!(alive.count(), 3, "{members}");
    // The flood did reach n2's connection limit (half its 64 descriptors).
    assert!(metric(&c, 1, "narad_http_connections_waited_total") >= 1.0);
}
