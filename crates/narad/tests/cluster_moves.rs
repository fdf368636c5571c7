//! Partition moves on real processes (issue 37, SPEC §7.3): the target
//! copies the partition from its owner while producers keep sending, the
//! owner freezes, the tail is copied, the ownership flips through Raft, and
//! every record acknowledged with 202 is delivered (duplicates allowed,
//! loss never), with the consumer frontier moved along. Each test is
//! bounded in time; the harness kills its processes and removes its
//! directories.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cluster::{Cluster, ClusterOpts, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

/// The owner of partition `p` of `topic` node `i` shows.
fn owner_seen(c: &Cluster, i: usize, topic: &str, p: usize) -> Option<String> {
    let (status, v) = c.get_json(i, &format!("/v1/topics/{topic}"))?;
    (status == 200).then_some(())?;
    v["partition_stats"][p]["owner_node"].as_str().map(str::to_owned)
}

/// Produces `{"i": i}` to partition `p` through node `node`; whether the
/// node answered 202.
fn produce(c: &Cluster, node: usize, topic: &str, p: usize, i: u64) -> bool {
    let path = format!("/v1/topics/{topic}/produce?partition={p}");
    c.request(node, Method::POST, &path)
        .body(json!({"i": i}).to_string())
        .send()
        .is_ok_and(|r| r.status().as_u16() == 202)
}

/// Consumes up to 100 of partition `p` through node `node`, acking all;
/// their `i`s.
fn consume_ack(c: &Cluster, node: usize, topic: &str, p: usize) -> Vec<u64> {
    let path = format!("/v1/topics/{topic}/consume?partition={p}&max=100&wait=200ms");
    let Ok(r) = c.request(node, Method::GET, &path).send() else { return Vec::new() };
    if r.status().as_u16() != 200 {
        return Vec::new();
    }
    let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    let msgs = v["messages"].as_array().unwrap();
    let handles: Vec<&str> = msgs.iter().map(|m| m["receipt_handle"].as_str().unwrap()).collect();
    if !handles.is_empty() {
        let _ = c
            .request(node, Method::POST, &format!("/v1/topics/{topic}/ack"))
            .body(json!({"receipt_handles": handles}).to_string())
            .send();
    }
    msgs.iter().map(|m| m["payload"]["i"].as_u64().unwrap()).collect()
}

#[test]
fn a_partition_moved_by_hand_under_load_loses_nothing_and_is_served_by_its_new_owner() {
    let c = Arc::new(Cluster::start(3, ClusterOpts::dev()));
    let leader = c.leader(Duration::from_secs(30));
    let body = json!({"name": "mv", "partitions": 3, "visibility_timeout_ms": 2000});
    let owners = c.create_placed(leader, body);
    let from = owners[0].clone();
    let to = ["n1", "n2", "n3"].into_iter().find(|n| *n != from).unwrap().to_owned();

    // Records before the move, 100 of them consumed and acked.
    let produced = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    for i in 0..2_000u64 {
        assert!(produce(&c, (i % 3) as usize, "mv", 0, i), "produce {i}");
        produced.lock().unwrap().insert(i);
    }
    let mut consumed = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while consumed.len() < 100 {
        assert!(Instant::now() < deadline, "nothing to consume before the move");
        consumed.extend(consume_ack(&c, 0, "mv", 0).into_iter().take(100));
    }

    // Producers through every node during the move.
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(2_000));
    let load = {
        let (c, stop, next, produced) = (c.clone(), stop.clone(), next.clone(), produced.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if produce(&c, (i % 3) as usize, "mv", 0, i) {
                    produced.lock().unwrap().insert(i);
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let r = c
        .request(leader, Method::POST, "/v1/cluster/moves")
        .body(json!({"topic": "mv", "partition": 0, "to": to}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap());
    wait_for(
        Duration::from_secs(60),
        &format!("every node shows partition 0 owned by {to} and no move in flight"),
        || {
            (0..3)
                .all(|i| {
                    owner_seen(&c, i, "mv", 0).as_deref() == Some(to.as_str())
                        && c.get_json(i, "/v1/cluster/moves")
                            .is_some_and(|(_, v)| v["moves"] == json!([]))
                })
                .then_some(())
        },
        || c.describe(),
    );
    let flipped_after = started.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    load.join().unwrap();
    let produced = produced.lock().unwrap().clone();
    assert!(produced.len() > 2_000, "load ran during the move");

    // Everything acknowledged with 202 is delivered, through any node; the
    // 100 acked before the move are not delivered again (the frontier
    // moved), unless a lease of theirs was still open (it was not).
    let mut again = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut i = 0;
    while !produced.is_subset(&consumed) {
        assert!(
            Instant::now() < deadline,
            "{} of {} records never delivered after the move (first missing: {:?})\n{}",
            produced.difference(&consumed).count(),
            produced.len(),
            produced.difference(&consumed).take(5).collect::<Vec<_>>(),
            c.describe()
        );
        for n in consume_ack(&c, i % 3, "mv", 0) {
            if !consumed.insert(n) {
                again.push(n);
            }
        }
        i += 1;
    }
    assert!(again.iter().all(|n| *n >= 100), "acked before the move, delivered again: {again:?}");
    eprintln!(
        "moved {from}->{to} in {flipped_after:?} under load; {} records, {} delivered twice",
        produced.len(),
        again.len()
    );
    // The old owner's log is a leftover: it serves nothing of partition 0.
    let old = c.index_of(&from).unwrap();
    let path = "/v1/topics/mv/consume?partition=0&offset=0";
    let r = c.request(old, Method::GET, path).send().unwrap();
    assert!(r.status().is_success(), "replay is forwarded to the new owner: {}", r.status());
}

/// Producers and consumers through the nodes at `bases`, until `stop`:
/// keyed records `{"i": n}` (so every partition gets some); returns what
/// was acknowledged with 202 and what was delivered (acked).
struct Load {
    stop: Arc<AtomicBool>,
    produced: Arc<std::sync::Mutex<BTreeSet<u64>>>,
    consumed: Arc<std::sync::Mutex<BTreeSet<u64>>>,
    twice: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(bases: &[String], topic: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let produced = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
        let consumed = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
        let twice = Arc::new(AtomicU64::new(0));
        let next = Arc::new(AtomicU64::new(0));
        let client =
            reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        let mut threads = Vec::new();
        for (n, base) in bases.iter().enumerate() {
            let (halt, produced, next, http) =
                (stop.clone(), produced.clone(), next.clone(), client.clone());
            let url = format!("{base}/v1/topics/{topic}/produce");
            threads.push(std::thread::spawn(move || {
                while !halt.load(Ordering::SeqCst) {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let r = http
                        .post(format!("{url}?key=k{}", i % 97))
                        .body(json!({"i": i}).to_string())
                        .send();
                    if r.is_ok_and(|r| r.status().as_u16() == 202) {
                        produced.lock().unwrap().insert(i);
                    }
                    if n == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }));
            let (halt, consumed, twice, http) =
                (stop.clone(), consumed.clone(), twice.clone(), client.clone());
            let base = base.clone();
            let topic = topic.to_owned();
            threads.push(std::thread::spawn(move || {
                while !halt.load(Ordering::SeqCst) {
                    for i in consume_via(&http, &base, &topic) {
                        let fresh = consumed.lock().unwrap().insert(i);
                        if !fresh {
                            twice.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }));
        }
        Load { stop, produced, consumed, twice, threads }
    }

    fn stop(self) -> (BTreeSet<u64>, Arc<std::sync::Mutex<BTreeSet<u64>>>, u64) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        let produced = self.produced.lock().unwrap().clone();
        (produced, self.consumed, self.twice.load(Ordering::SeqCst))
    }
}

/// One consume-and-ack round through `base`: the `i`s delivered.
fn consume_via(client: &reqwest::blocking::Client, base: &str, topic: &str) -> Vec<u64> {
    let url = format!("{base}/v1/topics/{topic}/consume?max=100&wait=200ms");
    let Ok(r) = client.get(url).send() else { return Vec::new() };
    if r.status().as_u16() != 200 {
        return Vec::new();
    }
    let Ok(v) = serde_json::from_str::<Value>(&r.text().unwrap_or_default()) else {
        return Vec::new();
    };
    let msgs = v["messages"].as_array().cloned().unwrap_or_default();
    let handles: Vec<&str> = msgs.iter().filter_map(|m| m["receipt_handle"].as_str()).collect();
    if !handles.is_empty() {
        let _ = client
            .post(format!("{base}/v1/topics/{topic}/ack"))
            .body(json!({"receipt_handles": handles}).to_string())
            .send();
    }
    msgs.iter().filter_map(|m| m["payload"]["i"].as_u64()).collect()
}

#[test]
fn a_fourth_node_joining_a_loaded_cluster_gets_its_share_and_nothing_is_lost() {
    let mut c = Cluster::prepare(4, ClusterOpts::dev().initial_members(&["n1", "n2", "n3"]));
    c.start_first(3);
    let leader = c.leader(Duration::from_secs(30));
    wait_for(
        Duration::from_secs(20),
        "n1..n3 alive",
        || {
            c.get_json(leader, "/v1/cluster/members").and_then(|(_, m)| {
                (m["members"].as_array()?.iter().filter(|m| m["status"] == "alive").count() == 3)
                    .then_some(())
            })
        },
        || c.describe(),
    );
    let body = json!({"name": "grow", "partitions": 8, "visibility_timeout_ms": 2000});
    let r = c.request(leader, Method::POST, "/v1/topics").body(body.to_string()).send().unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let bases: Vec<String> = (0..3).map(|i| c.node(i).url("")).collect();
    let load = Load::start(&bases, "grow");
    std::thread::sleep(Duration::from_secs(1));
    c.spawn(3);
    c.wait_ready(3, Duration::from_secs(30));
    let joined = Instant::now();
    wait_for(
        Duration::from_secs(120),
        "n4 owns 2 of the 8 partitions and no move is in flight, on every node",
        || {
            (0..4)
                .all(|i| {
                    let n4 = c.get_json(i, "/v1/cluster/members").and_then(|(_, m)| {
                        m["members"].as_array()?.iter().find(|m| m["id"] == "n4").cloned()
                    });
                    let idle = c
                        .get_json(i, "/v1/cluster/moves")
                        .is_some_and(|(_, v)| v["moves"] == json!([]));
                    idle && n4.is_some_and(|m| m["owned_partitions"] == 2)
                })
                .then_some(())
        },
        || c.describe(),
    );
    let share_after = joined.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let (produced, consumed, twice) = load.stop();
    assert!(produced.len() > 500, "the load ran: {} records", produced.len());
    // Drain what is left, through every node (n4 included).
    let client = reqwest::blocking::Client::new();
    let bases: Vec<String> = (0..4).map(|i| c.node(i).url("")).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut k = 0;
    loop {
        let missing: Vec<u64> =
            produced.difference(&consumed.lock().unwrap()).copied().take(5).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} acknowledged records never delivered, e.g. {missing:?}\n{}",
            produced.difference(&consumed.lock().unwrap()).count(),
            produced.len(),
            c.describe()
        );
        for i in consume_via(&client, &bases[k % 4], "grow") {
            consumed.lock().unwrap().insert(i);
        }
        k += 1;
    }
    eprintln!(
        "n4 got its share {share_after:?} after joining; {} records, 0 lost, {twice} delivered twice",
        produced.len()
    );
}
