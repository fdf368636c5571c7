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

/// Asks node `node` to move partition 0 of `topic` to `to` (must answer 202).
fn request_move(c: &Cluster, node: usize, topic: &str, to: &str) {
    request_move_of(c, node, topic, 0, to);
}

/// Asks node `node` to move partition `p` of `topic` to `to` (must answer
/// 202).
fn request_move_of(c: &Cluster, node: usize, topic: &str, p: usize, to: &str) {
    let r = c
        .request(node, Method::POST, "/v1/cluster/moves")
        .body(json!({"topic": topic, "partition": p, "to": to}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap());
}

/// The value of the sample `name` (with its labels) in a `/metrics` text.
/// Waits until partition 0 of `topic` holds `n` records on its owner
/// `source`.
fn wait_committed(c: &Cluster, source: usize, topic: &str, n: u64) {
    wait_for(
        Duration::from_secs(30),
        &format!("{n} records committed on the source"),
        || {
            let (_, v) = c.get_json(source, &format!("/v1/topics/{topic}"))?;
            (v["partition_stats"][0]["high_watermark"].as_u64()? >= n).then_some(())
        },
        || c.describe(),
    );
}

/// The staged copies under node `i`'s `<data>/moves/`.
fn staged_copies(c: &Cluster, i: usize) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(c.node(i).data_dir.join("moves"))
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default()
}

fn metric_value(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the destination's metrics"))
}

#[test]
fn a_partition_moved_by_hand_under_load_loses_nothing_and_is_served_by_its_new_owner() {
    let c = Arc::new(Cluster::start(3, ClusterOpts::dev()));
    let leader = c.leader(Duration::from_secs(30));
    // Four partitions over three nodes (2, 1, 1): one of the node holding
    // two moves to a node holding one, which leaves the cluster balanced,
    // so the planner's next tick does not move it back before the source
    // deleted its copy (with 3 partitions, one each, it did at times: CI,
    // 2026-12-07).
    let body = json!({"name": "mv", "partitions": 4, "visibility_timeout_ms": 2000});
    let owners = c.create_placed(leader, body);
    let holds = |id: &str| owners.iter().filter(|o| *o == id).count();
    let p = (0..4).find(|&p| holds(&owners[p]) == 2).expect("one node holds 2 of 4");
    let from = owners[p].clone();
    let to = ["n1", "n2", "n3"].into_iter().find(|n| holds(n) == 1).unwrap().to_owned();

    // Records before the move, 100 of them consumed and acked.
    let produced = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    for i in 0..2_000u64 {
        assert!(produce(&c, (i % 3) as usize, "mv", p, i), "produce {i}");
        produced.lock().unwrap().insert(i);
    }
    let mut consumed = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while consumed.len() < 100 {
        assert!(Instant::now() < deadline, "nothing to consume before the move");
        consumed.extend(consume_ack(&c, 0, "mv", p).into_iter().take(100));
    }

    // Producers through every node during the move.
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(2_000));
    let load = {
        let (c, stop, next, produced) = (c.clone(), stop.clone(), next.clone(), produced.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if produce(&c, (i % 3) as usize, "mv", p, i) {
                    produced.lock().unwrap().insert(i);
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    request_move_of(&c, leader, "mv", p, &to);
    wait_for(
        Duration::from_secs(60),
        &format!("every node shows partition {p} owned by {to} and no move in flight"),
        || {
            (0..3)
                .all(|i| {
                    owner_seen(&c, i, "mv", p).as_deref() == Some(to.as_str())
                        && c.get_json(i, "/v1/cluster/moves")
                            .is_some_and(|(_, v)| v["moves"] == json!([]))
                })
                .then_some(())
        },
        || c.describe(),
    );
    let flipped_after = started.elapsed();
    // The source deletes its copy once the leader confirms the new owner.
    let p_dir =
        |id: &str| c.node(c.index_of(id).unwrap()).data_dir.join(format!("topics/mv/p{p:05}"));
    assert!(p_dir(&to).is_dir(), "the new owner holds the partition");
    wait_for(
        Duration::from_secs(30),
        &format!("{from} deleted its copy of partition {p}"),
        || (!p_dir(&from).exists()).then_some(()),
        || c.describe(),
    );
    eprintln!("source copy deleted {:?} after the move request", started.elapsed());
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
        for n in consume_ack(&c, i % 3, "mv", p) {
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
    // The old owner's log is a leftover: it serves nothing of partition p.
    let old = c.index_of(&from).unwrap();
    let path = format!("/v1/topics/mv/consume?partition={p}&offset=0");
    let r = c.request(old, Method::GET, &path).send().unwrap();
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
    // A payload produced as a JSON string comes back as that string.
    let i_of = |p: &Value| match p {
        Value::String(text) => serde_json::from_str::<Value>(text).ok()?["i"].as_u64(),
        other => other["i"].as_u64(),
    };
    msgs.iter().filter_map(|m| i_of(&m["payload"])).collect()
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

/// Produces `n` records of about 2 KiB (`{"i": from + k, "pad": ...}`) to
/// partition 0 of `topic` through node `node`, in batches of 500; the `i`s.
fn produce_bulk(c: &Cluster, node: usize, topic: &str, from: u64, n: u64) -> Vec<u64> {
    let pad = "x".repeat(2000);
    let mut done = Vec::new();
    let mut i = from;
    while i < from + n {
        let end = (i + 500).min(from + n);
        let messages: Vec<Value> = (i..end)
            .map(|k| json!({"payload": json!({"i": k, "pad": pad}).to_string(), "partition": 0}))
            .collect();
        let r = c
            .request(node, Method::POST, &format!("/v1/topics/{topic}/produce/batch"))
            .body(json!({"messages": messages}).to_string())
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap());
        done.extend(i..end);
        i = end;
    }
    done
}

/// Consumes and acks every partition of `topic` through the running nodes
/// until every `i` of `want` was delivered (within 90 s, else a panic);
/// every `i` delivered.
fn deliver_all(c: &Cluster, topic: &str, want: &BTreeSet<u64>) -> BTreeSet<u64> {
    let client = reqwest::blocking::Client::new();
    let running: Vec<usize> = (0..c.len()).filter(|&i| c.node(i).is_running()).collect();
    let mut got = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut k = 0;
    while !want.is_subset(&got) {
        assert!(
            Instant::now() < deadline,
            "{} of {} acknowledged records never delivered, e.g. {:?}\n{}",
            want.difference(&got).count(),
            want.len(),
            want.difference(&got).take(5).collect::<Vec<_>>(),
            c.describe()
        );
        let base = c.node(running[k % running.len()]).url("");
        for m in consume_via(&client, &base, topic) {
            got.insert(m);
        }
        k += 1;
    }
    got
}

/// Whether node `i` shows a move of partition 0 of `topic` in flight
/// (`None`: no answer). The planner may move other partitions meanwhile.
fn moving_p0(c: &Cluster, i: usize, topic: &str) -> Option<bool> {
    let (_, v) = c.get_json(i, "/v1/cluster/moves")?;
    Some(v["moves"].as_array()?.iter().any(|m| m["topic"] == topic && m["partition"] == 0))
}

/// A move's target killed (`kill -9`) mid-copy: the source never froze
/// (the copy had rounds to go), so it keeps committing; once the target is
/// marked dead the leader aborts the move; nothing acknowledged is lost.
#[test]
fn a_moves_target_killed_mid_copy_is_aborted_and_nothing_is_lost() {
    let opts = ClusterOpts::dev().node_env(2, "NARAD_TEST_MOVE_CHUNK_DELAY_MS", "1000");
    let mut c = Cluster::start(3, opts);
    let leader = c.leader(Duration::from_secs(30));
    let owners = c.create_placed(
        leader,
        json!({"name": "big", "partitions": 3, "visibility_timeout_ms": 2000}),
    );
    assert_ne!(owners[0], "n3", "partition 0 is not on n3 already: {owners:?}");
    let via = (0..3).find(|&i| i != 2).unwrap();
    let mut produced: BTreeSet<u64> = produce_bulk(&c, via, "big", 0, 6_000).into_iter().collect();
    request_move(&c, leader, "big", "n3");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(moving_p0(&c, leader, "big"), Some(true), "the move is still copying");
    c.kill9(2);
    let leader = c.leader(Duration::from_secs(30));
    produced.extend(produce_bulk(&c, leader, "big", 6_000, 500));
    let started = Instant::now();
    wait_for(
        Duration::from_secs(90),
        "the move to the dead n3 aborted, partition 0 still on its owner",
        || {
            (!moving_p0(&c, leader, "big")?
                && owner_seen(&c, leader, "big", 0).as_deref() == Some(owners[0].as_str()))
            .then_some(())
        },
        || c.describe(),
    );
    eprintln!("move to a killed target aborted {:?} after the kill", started.elapsed());
    // The killed target left its partial copy behind; it removes it when it
    // starts again (or, if its replica has not learnt yet that the move
    // was given up and a copy starts over, as soon as it learns).
    assert_eq!(
        staged_copies(&c, 2).len(),
        1,
        "the killed target's partial copy: {:?}",
        staged_copies(&c, 2)
    );
    c.restart(2);
    c.wait_ready(2, Duration::from_secs(30));
    wait_for(
        Duration::from_secs(30),
        "n3 removed the partial copy",
        || staged_copies(&c, 2).is_empty().then_some(()),
        || format!("{:?}\n{}", staged_copies(&c, 2), c.node(2).log_tail()),
    );
    let _ = deliver_all(&c, "big", &produced);
}

/// A move's source killed (`kill -9`) mid-copy and restarted: it comes back
/// frozen (the move is in flight), the target carries on and flips the
/// owner; nothing acknowledged is lost.
#[test]
fn a_moves_source_killed_mid_copy_and_restarted_hands_the_partition_over_losing_nothing() {
    let opts = ClusterOpts::dev().node_env(2, "NARAD_TEST_MOVE_CHUNK_DELAY_MS", "1000");
    let mut c = Cluster::start(3, opts);
    let leader = c.leader(Duration::from_secs(30));
    let owners = c.create_placed(
        leader,
        json!({"name": "big", "partitions": 3, "visibility_timeout_ms": 2000}),
    );
    let source = c.index_of(&owners[0]).unwrap();
    assert_ne!(source, 2, "partition 0 is not on n3 already: {owners:?}");
    let via = (0..3).find(|&i| i != source).unwrap();
    let mut produced: BTreeSet<u64> = produce_bulk(&c, via, "big", 0, 6_000).into_iter().collect();
    request_move(&c, via, "big", "n3");
    std::thread::sleep(Duration::from_secs(3));
    // Mid-copy: the destination shows where it is; the CLI asked through
    // another node fetches that from the destination.
    let progress = |c: &Cluster, i: usize| {
        let (_, v) = c.get_json(i, "/v1/cluster/moves")?;
        v["moves"]
            .as_array()?
            .iter()
            .find(|m| m["topic"] == "big" && m["partition"] == 0)
            .map(|m| m["progress"].clone())
    };
    let p = progress(&c, 2).expect("n3 shows the move");
    assert_eq!(p["phase"], "copying", "{p}");
    assert!(p["rounds"].as_u64() >= Some(1), "{p}");
    let copied = p["bytes_copied"].as_u64().unwrap();
    assert!(copied > 0 && copied < p["bytes_total"].as_u64().unwrap(), "a slowed copy: {p}");
    assert!(p["age_ms"].as_u64() >= Some(1_000), "{p}");
    assert_eq!(progress(&c, source), Some(Value::Null), "only the destination knows");
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["cluster", "moves", "-s", &c.node(source).url("")])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&cli.stdout);
    assert!(cli.status.success(), "{table} {}", String::from_utf8_lossy(&cli.stderr));
    assert!(
        table.contains("copying") && table.contains("PHASE") && table.contains(" MiB"),
        "the CLI shows the destination's progress: {table}"
    );
    c.kill9(source);
    // Records for partition 0 wait in the accepting node's WAL (or go to a
    // sibling once the owner is marked dead); none is lost either way.
    produced.extend(produce_bulk(&c, via, "big", 6_000, 500));
    std::thread::sleep(Duration::from_secs(2));
    c.restart(source);
    c.wait_ready(source, Duration::from_secs(30));
    let started = Instant::now();
    wait_for(
        Duration::from_secs(120),
        "partition 0 owned by n3 on every node, no move in flight",
        || {
            (0..3)
                .all(|i| {
                    moving_p0(&c, i, "big") == Some(false)
                        && owner_seen(&c, i, "big", 0).as_deref() == Some("n3")
                })
                .then_some(())
        },
        || c.describe(),
    );
    eprintln!("moved after the source's restart in {:?}", started.elapsed());
    let metrics = c.request(2, Method::GET, "/metrics").send().unwrap().text().unwrap();
    let metric = |name: &str| metric_value(&metrics, name);
    assert_eq!(metric("narad_moves_total{outcome=\"completed\"}"), 1.0);
    assert_eq!(metric("narad_moves_inflight"), 0.0);
    assert!(metric("narad_moves_bytes_total") >= copied as f64);
    assert_eq!(metric("narad_moves_duration_seconds_count"), 1.0);
    let _ = deliver_all(&c, "big", &produced);
}

/// A move's source killed (`kill -9`) mid-copy, before its freeze, and
/// not restarted: nothing proves the copy complete, so once the source has
/// been dead for the force-promote wait (2 s here, 2 minutes by default)
/// the destination gives the move up. The partition stays with its dead
/// owner (as Narad: no copy short of the source's records is promoted),
/// the staged copy is removed, and when the source comes back every
/// acknowledged record is delivered from it.
#[test]
fn a_moves_source_dead_before_its_freeze_is_not_promoted_and_the_move_is_aborted() {
    let opts = ClusterOpts::dev().node_env(2, "NARAD_TEST_MOVE_CHUNK_DELAY_MS", "1000").node_env(
        2,
        "NARAD_TEST_MOVE_FORCE_PROMOTE_AFTER_MS",
        "2000",
    );
    let mut c = Cluster::start(3, opts);
    let leader = c.leader(Duration::from_secs(30));
    let owners = c.create_placed(
        leader,
        json!({"name": "short", "partitions": 3, "visibility_timeout_ms": 2000}),
    );
    let source = c.index_of(&owners[0]).unwrap();
    assert_ne!(source, 2, "partition 0 is not on n3 already: {owners:?}");
    let via = (0..3).find(|&i| i != source && i != 2).unwrap();
    let produced: BTreeSet<u64> = produce_bulk(&c, via, "short", 0, 6_000).into_iter().collect();
    wait_committed(&c, source, "short", 6_000);
    request_move(&c, via, "short", "n3");
    wait_for(
        Duration::from_secs(30),
        "n3 copying, part of the partition copied",
        || {
            let (_, v) = c.get_json(2, "/v1/cluster/moves")?;
            let m = v["moves"].as_array()?.iter().find(|m| m["topic"] == "short")?.clone();
            let p = &m["progress"];
            (p["phase"] == "copying" && p["bytes_copied"].as_u64()? > 0).then_some(())
        },
        || c.describe(),
    );
    let source_id = c.node(source).id.clone();
    c.kill9(source);
    let killed = Instant::now();
    wait_for(
        Duration::from_secs(120),
        "the move given up, partition 0 still the dead source's",
        || {
            [via, 2]
                .iter()
                .all(|&i| {
                    moving_p0(&c, i, "short") == Some(false)
                        && owner_seen(&c, i, "short", 0).as_deref() == Some(source_id.as_str())
                })
                .then_some(())
        },
        || c.describe(),
    );
    eprintln!("move aborted {:?} after the source's kill", killed.elapsed());
    let log = c.node(2).log();
    assert!(log.contains("never froze"), "n3 says why it gave up: {}", c.node(2).log_tail());
    assert!(!log.contains("force-promoting"), "{}", c.node(2).log_tail());
    let metrics = c.request(2, Method::GET, "/metrics").send().unwrap().text().unwrap();
    let metric = |name: &str| metric_value(&metrics, name);
    assert_eq!(metric("narad_moves_total{outcome=\"aborted\"}"), 1.0);
    assert_eq!(metric("narad_moves_total{outcome=\"force_promoted\"}"), 0.0);
    assert_eq!(metric("narad_moves_inflight"), 0.0);
    let left = staged_copies(&c, 2);
    assert!(left.is_empty(), "n3 removed its staged copy: {left:?}");
    c.restart(source);
    c.wait_ready(source, Duration::from_secs(30));
    let _ = deliver_all(&c, "short", &produced);
    assert_eq!(owner_seen(&c, via, "short", 0).as_deref(), Some(source_id.as_str()));
}

/// Produces `{"i": i}` for every `i` of `range` to partition 0 of `topic`
/// through node `node`, in batches of 500 (each must answer 202).
fn produce_objects(c: &Cluster, node: usize, topic: &str, range: std::ops::Range<u64>) {
    let all: Vec<u64> = range.collect();
    for chunk in all.chunks(500) {
        let messages: Vec<Value> =
            chunk.iter().map(|i| json!({"payload": {"i": i}, "partition": 0})).collect();
        let r = c
            .request(node, Method::POST, &format!("/v1/topics/{topic}/produce/batch"))
            .body(json!({"messages": messages}).to_string())
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap());
    }
}

/// Consumes and acks `topic` through every node in turn, counting each
/// delivery, until every `i` below `upto` was delivered (within 60 s, else
/// a panic).
fn drain_child(
    c: &Cluster,
    topic: &str,
    upto: u64,
    delivered: &mut std::collections::BTreeMap<u64, u32>,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut turn = 0;
    while (0..upto).any(|i| !delivered.contains_key(&i)) {
        assert!(
            Instant::now() < deadline,
            "{} of {upto} parent records never reached the child\n{}",
            (0..upto).filter(|i| !delivered.contains_key(i)).count(),
            c.describe()
        );
        for i in c.consume_round(turn % c.len(), topic) {
            *delivered.entry(i).or_default() += 1;
        }
        turn += 1;
    }
}

/// A fan-out parent partition moves with its cursor (issue 37): the
/// child already holds the 3,000 records when the partition moves, and the
/// destination resumes the child's cursor where the source's file stood at
/// the freeze, so they are not sent again (without the file the
/// destination's cursor anchors at the link's creation and sends all 3,000
/// again: 7,000 deliveries); every record before and after the move
/// reaches the child.
#[test]
fn a_fanout_parent_partition_moves_with_its_cursor_and_the_child_misses_nothing() {
    let c = Cluster::start(3, ClusterOpts::dev());
    let leader = c.leader(Duration::from_secs(30));
    let parents = c.create_placed(leader, json!({"name": "fp", "partitions": 3}));
    c.create_placed(leader, json!({"name": "fc", "partitions": 3, "parent": "fp"}));
    let mut delivered = std::collections::BTreeMap::new();
    produce_objects(&c, leader, "fp", 0..3_000);
    drain_child(&c, "fc", 3_000, &mut delivered);
    // The cursor file is stored right after the child commits it covers.
    std::thread::sleep(Duration::from_secs(1));

    let to = ["n1", "n2", "n3"].into_iter().find(|n| *n != parents[0]).unwrap();
    request_move(&c, leader, "fp", to);
    wait_for(
        Duration::from_secs(60),
        &format!("partition 0 of fp owned by {to} on every node"),
        || (0..3).all(|i| owner_seen(&c, i, "fp", 0).as_deref() == Some(to)).then_some(()),
        || c.describe(),
    );
    produce_objects(&c, leader, "fp", 3_000..4_000);
    drain_child(&c, "fc", 4_000, &mut delivered);
    // Anything sent twice arrives within a few seconds.
    std::thread::sleep(Duration::from_secs(3));
    for _ in 0..3 {
        for i in 0..3 {
            for k in c.consume_round(i, "fc") {
                *delivered.entry(k).or_default() += 1;
            }
        }
    }
    let deliveries: u32 = delivered.values().sum();
    eprintln!("fan-out parent moved to {to}: 4,000 records, {deliveries} deliveries to the child");
    assert!(
        deliveries < 4_000 + 1_000,
        "the child got {deliveries} deliveries of 4,000 records: its cursor started over"
    );
}

/// A move's source dies for good after it froze (`kill -9` while the
/// target pauses after the freeze, test hooks shorten the 2-minute wait to
/// 2 s): the copy holds the frozen high watermark (nothing was produced
/// since the last round), so once the source is marked dead the target
/// force-promotes it; every record acknowledged before is delivered from
/// the new owner.
#[test]
fn a_frozen_source_that_dies_is_replaced_by_its_complete_copy() {
    let opts = ClusterOpts::dev()
        .node_env(2, "NARAD_TEST_MOVE_PAUSE_AFTER_FREEZE_MS", "6000")
        .node_env(2, "NARAD_TEST_MOVE_FORCE_PROMOTE_AFTER_MS", "2000");
    let mut c = Cluster::start(3, opts);
    let leader = c.leader(Duration::from_secs(30));
    let owners = c.create_placed(leader, json!({"name": "fpr", "partitions": 3}));
    let source = c.index_of(&owners[0]).unwrap();
    assert_ne!(source, 2, "partition 0 is not on n3 already: {owners:?}");
    let via = (0..3).find(|&i| i != source && i != 2).unwrap();
    let produced: BTreeSet<u64> = produce_bulk(&c, via, "fpr", 0, 2_000).into_iter().collect();
    wait_committed(&c, source, "fpr", 2_000);
    request_move(&c, via, "fpr", "n3");
    wait_for(
        Duration::from_secs(30),
        "n3 froze the source",
        || {
            let (_, v) = c.get_json(2, "/v1/cluster/moves")?;
            let m = v["moves"].as_array()?.iter().find(|m| m["topic"] == "fpr")?.clone();
            (m["progress"]["phase"] == "frozen").then_some(())
        },
        || c.describe(),
    );
    c.kill9(source);
    let killed = Instant::now();
    wait_for(
        Duration::from_secs(120),
        "partition 0 force-promoted to n3",
        || {
            [via, 2]
                .iter()
                .all(|&i| owner_seen(&c, i, "fpr", 0).as_deref() == Some("n3"))
                .then_some(())
        },
        || c.describe(),
    );
    eprintln!("force-promoted {:?} after the source's kill", killed.elapsed());
    assert!(c.node(2).log().contains("force-promoting the copy"), "{}", c.node(2).log_tail());
    let metrics = c.request(2, Method::GET, "/metrics").send().unwrap().text().unwrap();
    assert!(metrics.contains("narad_moves_total{outcome=\"force_promoted\"} 1"), "{metrics}");
    let _ = deliver_all(&c, "fpr", &produced);
}

/// `cluster.move_copy_rate` on the destination (2 MiB/s here) paces the
/// copy rounds: a partition of ~12 MiB takes more than 4 s to move, the
/// destination counts the time its chunk fetches waited, and nothing
/// acknowledged is lost. (Without the limit the same move takes well under
/// a second on loopback.)
#[test]
fn a_move_copies_no_faster_than_the_destinations_copy_rate() {
    let opts = ClusterOpts::dev().node_env(2, "NARAD_CLUSTER_MOVE_COPY_RATE", "2097152");
    let c = Cluster::start(3, opts);
    let leader = c.leader(Duration::from_secs(30));
    let owners = c.create_placed(leader, json!({"name": "paced", "partitions": 3}));
    assert_ne!(owners[0], "n3", "partition 0 is not on n3 already: {owners:?}");
    let via = (0..3).find(|&i| i != 2).unwrap();
    let produced: BTreeSet<u64> = produce_bulk(&c, via, "paced", 0, 6_000).into_iter().collect();
    wait_for(
        Duration::from_secs(30),
        "partition 0 holds the 6,000 records",
        || {
            let (_, v) = c.get_json(via, "/v1/topics/paced")?;
            (v["partition_stats"][0]["next_offset"].as_u64()? == 6_000).then_some(())
        },
        || c.describe(),
    );
    let asked = Instant::now();
    request_move(&c, leader, "paced", "n3");
    wait_for(
        Duration::from_secs(60),
        "partition 0 owned by n3",
        || (owner_seen(&c, leader, "paced", 0)? == "n3").then_some(()),
        || c.describe(),
    );
    let took = asked.elapsed();
    let metrics = c.request(2, Method::GET, "/metrics").send().unwrap().text().unwrap();
    let metric = |name: &str| metric_value(&metrics, name);
    let bytes = metric("narad_moves_bytes_total");
    let moving = metric("narad_moves_duration_seconds_sum");
    let throttled = metric("narad_moves_throttled_seconds_total");
    eprintln!(
        "moved {bytes} bytes in {moving:.2} s (request to flip seen: {took:?}), \
         {throttled:.2} s waiting on the copy rate"
    );
    assert!(bytes >= 10.0 * 1024.0 * 1024.0, "the partition is ~12 MiB: {bytes}");
    // The rounds copy all but the frozen tail (at most 4 MiB plus a chunk)
    // at 2 MiB/s.
    let paced = (bytes - 5.0 * 1024.0 * 1024.0) / (2.0 * 1024.0 * 1024.0);
    assert!(moving >= paced, "{moving} s to move {bytes} bytes at 2 MiB/s (>= {paced} s)");
    assert!(throttled >= paced / 2.0, "waited {throttled} s on the rate");
    let _ = deliver_all(&c, "paced", &produced);
}

/// A topic deleted while a move of its partition is copying, and its name
/// created again at once: the move of the old incarnation ends (the
/// target gives it up and removes its staged copy), the new incarnation's
/// records are all delivered, and none of the old incarnation's appears in
/// the new one.
#[test]
fn a_topic_deleted_and_recreated_mid_move_ends_the_move_and_mixes_no_incarnations() {
    let opts = ClusterOpts::dev().node_env(2, "NARAD_TEST_MOVE_CHUNK_DELAY_MS", "1000");
    let c = Cluster::start(3, opts);
    let leader = c.leader(Duration::from_secs(30));
    let body = json!({"name": "dr", "partitions": 3, "visibility_timeout_ms": 2000});
    let owners = c.create_placed(leader, body.clone());
    assert_ne!(owners[0], "n3", "partition 0 is not on n3 already: {owners:?}");
    let via = (0..3).find(|&i| i != 2).unwrap();
    produce_bulk(&c, via, "dr", 0, 6_000);
    request_move(&c, leader, "dr", "n3");
    wait_for(
        Duration::from_secs(30),
        "n3 staging a copy",
        || (!staged_copies(&c, 2).is_empty()).then_some(()),
        || c.describe(),
    );
    assert_eq!(moving_p0(&c, leader, "dr"), Some(true), "the move is still copying");
    let old_copy = staged_copies(&c, 2);

    let deleted = Instant::now();
    let r = c.request(via, Method::DELETE, "/v1/topics/dr").send().unwrap();
    assert_eq!(r.status().as_u16(), 204, "{}", r.text().unwrap());
    let r = c.request(2, Method::POST, "/v1/topics").body(body.to_string()).send().unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
    let fresh = c.wait_placed("dr");
    // The new incarnation through every node, n3 (the old move's target)
    // included.
    let mut produced = BTreeSet::new();
    for (k, node) in [0usize, 1, 2].into_iter().enumerate() {
        let from = 10_000 + 200 * k as u64;
        produced.extend(produce_bulk(&c, node, "dr", from, 200));
    }
    assert_eq!(fresh.len(), 3, "the new incarnation is placed: {fresh:?}");
    wait_for(
        Duration::from_secs(60),
        "the old incarnation's move ended and n3's staged copy of it is gone",
        || {
            let now = staged_copies(&c, 2);
            (!old_copy.iter().any(|o| now.contains(o))).then_some(())
        },
        || format!("{old_copy:?} {:?}\n{}", staged_copies(&c, 2), c.describe()),
    );
    eprintln!("the old move's staged copy gone {:?} after the delete", deleted.elapsed());

    let got = deliver_all(&c, "dr", &produced);
    if let Some(old) = got.iter().find(|i| **i < 10_000) {
        panic!("record {old} of the deleted incarnation delivered from the new one");
    }
    eprintln!("{} new records delivered {:?} after the delete", got.len(), deleted.elapsed());
}
