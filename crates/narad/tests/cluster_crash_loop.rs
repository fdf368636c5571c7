//! The cluster crash loop (issue 25 part 3): a 3-node cluster on loopback
//! under mixed load — single and batch produces, keyed and keyless, to every
//! node; consumers on every node acking through a random node — while a
//! random node is killed with SIGKILL and restarted, or paused with SIGSTOP
//! for up to 3 s, cycle after cycle. At the end every node runs, the load
//! stops, everything is drained, and a history checker reads the history
//! file back: every record that got a 202 was delivered at least once, and
//! nothing was delivered that no producer sent.
//!
//! The history is a Jepsen-style file of JSON lines, one per request and
//! its answer (and one per fault), written as the run goes; it is kept with
//! the nodes' data and logs when the test fails (the path is in the
//! failure message) so a failure can be read afterwards.
//!
//! CI runs 4 cycles; `NARAD_SOAK=1` runs 100 (`NARAD_CYCLES=N` for N).
//! `NARAD_SEED` fixes the fault schedule and the load's choices.

mod common;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{Cluster, ClusterOpts};
use common::payload_bytes;
use narad_fs::SimRng;
use reqwest::blocking::Client;
use serde_json::{Value, json};

const TOPICS: [(&str, u32); 2] = [("ccl-a", 6), ("ccl-b", 3)];

fn cycles() -> u64 {
    if let Some(n) = std::env::var("NARAD_CYCLES").ok().and_then(|s| s.parse().ok()) {
        return n;
    }
    if std::env::var("NARAD_SOAK").is_ok_and(|v| v == "1") { 100 } else { 4 }
}

/// The history file: one JSON object per line, `t_ms` since the start.
struct History {
    path: PathBuf,
    out: Mutex<std::io::BufWriter<std::fs::File>>,
    start: Instant,
}

impl History {
    fn create(path: PathBuf) -> History {
        let file = std::fs::File::create(&path).unwrap();
        History { path, out: Mutex::new(std::io::BufWriter::new(file)), start: Instant::now() }
    }

    fn record(&self, mut event: Value) {
        event["t_ms"] = json!(self.start.elapsed().as_millis() as u64);
        let mut out = self.out.lock().unwrap();
        serde_json::to_writer(&mut *out, &event).unwrap();
        out.write_all(b"\n").unwrap();
    }

    fn flush(&self) {
        self.out.lock().unwrap().flush().unwrap();
    }
}

struct Load {
    bases: Vec<String>,
    stop: AtomicBool,
    next_id: AtomicU64,
    history: History,
}

fn client() -> Client {
    Client::builder().timeout(Duration::from_secs(5)).build().unwrap()
}

/// The ids a produce attempt carries; the answer's status (0: no answer).
fn produce(load: &Load, client: &Client, rng: &mut SimRng) {
    let node = rng.below(load.bases.len() as u64) as usize;
    let topic = TOPICS[rng.below(TOPICS.len() as u64) as usize].0;
    let base = &load.bases[node];
    let batch = rng.chance(1, 4);
    let n = if batch { 10 } else { 1 };
    let ids: Vec<String> =
        (0..n).map(|_| format!("m{}", load.next_id.fetch_add(1, Ordering::Relaxed))).collect();
    let keyed = rng.chance(1, 2);
    let answer = if batch {
        let msgs: Vec<Value> = ids
            .iter()
            .map(|id| {
                if keyed {
                    json!({"key": id, "payload": {"id": id}})
                } else {
                    json!({"payload": {"id": id}})
                }
            })
            .collect();
        client
            .post(format!("{base}/v1/topics/{topic}/produce/batch"))
            .body(json!({ "messages": msgs }).to_string())
            .send()
    } else {
        let q = if keyed { format!("?key={}", ids[0]) } else { String::new() };
        client
            .post(format!("{base}/v1/topics/{topic}/produce{q}"))
            .body(json!({"id": ids[0]}).to_string())
            .send()
    };
    let status = answer.as_ref().map_or(0, |r| r.status().as_u16());
    load.history.record(json!({
        "op": if batch { "produce_batch" } else { "produce" },
        "node": node, "topic": topic, "keyed": keyed, "ids": ids, "status": status,
        "error": answer.err().map(|e| e.to_string()),
    }));
    if status != 202 {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One consume through `node` and an ack of what came through a random
/// node; the number of messages delivered (`None`: no answer).
fn consume_once(
    load: &Load,
    client: &Client,
    rng: &mut SimRng,
    node: usize,
    topic: &str,
    wait: &str,
) -> Option<usize> {
    let base = &load.bases[node];
    let r = client.get(format!("{base}/v1/topics/{topic}/consume?max=50&wait={wait}")).send();
    let status = r.as_ref().map_or(0, |r| r.status().as_u16());
    let body: Option<Value> = match r {
        Ok(r) if status == 200 => r.text().ok().and_then(|t| serde_json::from_str(&t).ok()),
        _ => None,
    };
    let msgs = body.as_ref().and_then(|b| b["messages"].as_array()).cloned().unwrap_or_default();
    let ids: Vec<String> = msgs
        .iter()
        .map(|m| {
            let raw = payload_bytes(m);
            serde_json::from_slice::<Value>(&raw)
                .ok()
                .and_then(|p| p["id"].as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("unparsable:{}", String::from_utf8_lossy(&raw)))
        })
        .collect();
    load.history.record(json!({
        "op": "consume", "node": node, "topic": topic, "status": status, "ids": ids,
        "partitions": msgs.iter().map(|m| m["partition"].clone()).collect::<Vec<_>>(),
    }));
    if status == 204 {
        return Some(0);
    }
    if status != 200 {
        return None;
    }
    let handles: Vec<Value> = msgs.iter().map(|m| m["receipt_handle"].clone()).collect();
    if !handles.is_empty() {
        let ack_node = rng.below(load.bases.len() as u64) as usize;
        let r = client
            .post(format!("{}/v1/topics/{topic}/ack", load.bases[ack_node]))
            .body(json!({ "receipt_handles": handles }).to_string())
            .send();
        load.history.record(json!({
            "op": "ack", "node": ack_node, "topic": topic, "count": handles.len(),
            "status": r.as_ref().map_or(0, |r| r.status().as_u16()),
        }));
    }
    Some(msgs.len())
}

/// What the history file says.
#[derive(Debug, Default)]
struct Checked {
    /// Ids of records whose produce was answered 202.
    acked: HashSet<String>,
    /// Ids of every produce attempt, whatever its answer.
    attempted: HashSet<String>,
    /// Deliveries by id.
    delivered: HashMap<String, u64>,
    /// Produce answers by status (0: no answer).
    statuses: HashMap<u16, u64>,
    faults: HashMap<String, u64>,
}

impl Checked {
    fn read(path: &Path) -> Checked {
        let mut c = Checked::default();
        let file = std::fs::File::open(path).unwrap();
        for line in std::io::BufReader::new(file).lines() {
            let e: Value = serde_json::from_str(&line.unwrap()).unwrap();
            let ids = || {
                e["ids"].as_array().into_iter().flatten().map(|i| i.as_str().unwrap().to_owned())
            };
            match e["op"].as_str().unwrap() {
                "produce" | "produce_batch" => {
                    let status = e["status"].as_u64().unwrap() as u16;
                    *c.statuses.entry(status).or_default() += 1;
                    c.attempted.extend(ids());
                    if status == 202 {
                        c.acked.extend(ids());
                    }
                }
                "consume" => {
                    for id in ids() {
                        *c.delivered.entry(id).or_default() += 1;
                    }
                }
                fault @ ("kill9" | "sigstop") => {
                    *c.faults.entry(fault.to_owned()).or_default() += 1
                }
                _ => {}
            }
        }
        c
    }

    fn lost(&self) -> Vec<&String> {
        let mut lost: Vec<&String> =
            self.acked.iter().filter(|id| !self.delivered.contains_key(*id)).collect();
        lost.sort();
        lost
    }

    fn phantoms(&self) -> Vec<&String> {
        self.delivered.keys().filter(|id| !self.attempted.contains(*id)).collect()
    }

    fn deliveries(&self) -> u64 {
        self.delivered.values().sum()
    }
}

#[test]
fn no_202_is_lost_while_nodes_of_a_cluster_are_killed_and_paused_at_random() {
    let seed = std::env::var("NARAD_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x005E_EDC1);
    let mut rng = SimRng::new(seed);
    let mut c = Cluster::start(3, ClusterOpts::dev());
    c.wait_all_alive(Duration::from_secs(30));
    for (topic, partitions) in TOPICS {
        let r = c
            .request(0, reqwest::Method::POST, "/v1/topics")
            .body(
                json!({"name": topic, "partitions": partitions, "visibility_timeout_ms": 2000})
                    .to_string(),
            )
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
    }
    let load = Arc::new(Load {
        bases: (0..3).map(|i| c.node(i).base.clone()).collect(),
        stop: AtomicBool::new(false),
        next_id: AtomicU64::new(0),
        history: History::create(c.root().join("history.jsonl")),
    });
    let history = load.history.path.clone();
    let mut threads = Vec::new();
    for _ in 0..6 {
        let (load, mut rng) = (load.clone(), rng.fork());
        threads.push(std::thread::spawn(move || {
            let client = client();
            while !load.stop.load(Ordering::Relaxed) {
                produce(&load, &client, &mut rng);
            }
        }));
    }
    for n in 0..3usize {
        let (load, mut rng) = (load.clone(), rng.fork());
        threads.push(std::thread::spawn(move || {
            let client = client();
            let mut k = 0usize;
            while !load.stop.load(Ordering::Relaxed) {
                let topic = TOPICS[k % TOPICS.len()].0;
                k += 1;
                if consume_once(&load, &client, &mut rng, n, topic, "200ms").is_none() {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }));
    }
    let started = Instant::now();
    for cycle in 0..cycles() {
        std::thread::sleep(Duration::from_millis(rng.range(800, 2500)));
        let victim = rng.below(3) as usize;
        // Every other cycle a kill, so the short CI run has both kinds.
        if cycle % 2 == 0 || rng.chance(1, 3) {
            load.history.record(json!({"op": "kill9", "node": victim}));
            c.kill9(victim);
            std::thread::sleep(Duration::from_millis(rng.range(0, 1000)));
            c.restart(victim);
            c.wait_ready(victim, Duration::from_secs(30));
            load.history.record(json!({"op": "restarted", "node": victim}));
        } else {
            let pause = rng.range(300, 3000);
            load.history.record(json!({"op": "sigstop", "node": victim, "ms": pause}));
            c.stop(victim);
            std::thread::sleep(Duration::from_millis(pause));
            c.cont(victim);
            load.history.record(json!({"op": "sigcont", "node": victim}));
        }
    }
    // The last life runs a moment under load, then the load stops.
    std::thread::sleep(Duration::from_millis(500));
    load.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    load.history.record(json!({"op": "load_stopped"}));
    c.wait_all_alive(Duration::from_secs(30));

    // Drain through every node until every 202'd record was delivered (or
    // the deadline: the checker then names what is missing).
    load.history.flush();
    let acked = Checked::read(&history).acked;
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut drain_rng = SimRng::new(seed ^ 0xD7A1);
    loop {
        load.history.flush();
        let seen = Checked::read(&history);
        if acked.iter().all(|id| seen.delivered.contains_key(id)) || Instant::now() > deadline {
            break;
        }
        for node in 0..3 {
            for (topic, _) in TOPICS {
                while consume_once(&load, &client, &mut drain_rng, node, topic, "300ms")
                    .is_some_and(|n| n > 0)
                {}
            }
        }
    }
    load.history.flush();

    let checked = Checked::read(&history);
    let lost = checked.lost();
    let phantoms = checked.phantoms();
    let deliveries = checked.deliveries();
    eprintln!(
        "cluster crash loop (seed {seed:#x}): {} cycles in {:.1?}, faults {:?}; produce answers {:?}; \
         {} acked, {} distinct delivered, {} deliveries, duplicate ratio {:.4}; history {}",
        cycles(),
        started.elapsed(),
        checked.faults,
        checked.statuses,
        checked.acked.len(),
        checked.delivered.len(),
        deliveries,
        deliveries as f64 / checked.delivered.len().max(1) as f64 - 1.0,
        history.display(),
    );
    assert!(checked.acked.len() > 200, "the load barely ran: {:?}", checked.statuses);
    assert!(
        lost.is_empty(),
        "{} of {} acked records never delivered, e.g. {:?}; history kept at {}\n{}",
        lost.len(),
        checked.acked.len(),
        &lost[..lost.len().min(10)],
        history.display(),
        c.describe()
    );
    assert!(
        phantoms.is_empty(),
        "delivered records no producer sent: {:?}; history kept at {}",
        &phantoms[..phantoms.len().min(10)],
        history.display()
    );
}

/// The checker fails a history that lost a 202'd record or delivered one
/// nobody sent (so the loop above can fail).
#[test]
fn the_history_checker_names_a_lost_and_a_phantom_record() {
    let dir = common::temp_dir("history-check");
    let path = dir.join("history.jsonl");
    let h = History::create(path.clone());
    h.record(json!({"op": "produce", "ids": ["m1"], "status": 202}));
    h.record(json!({"op": "produce_batch", "ids": ["m2", "m3"], "status": 202}));
    h.record(json!({"op": "produce", "ids": ["m4"], "status": 0}));
    h.record(json!({"op": "kill9", "node": 1}));
    h.record(json!({"op": "consume", "ids": ["m1", "m3", "m4", "m9"], "status": 200}));
    h.record(json!({"op": "consume", "ids": ["m1"], "status": 200}));
    h.flush();
    let c = Checked::read(&path);
    assert_eq!(c.lost(), [&"m2".to_owned()], "acked, never delivered");
    assert_eq!(c.phantoms(), [&"m9".to_owned()], "delivered, never sent");
    assert_eq!((c.acked.len(), c.deliveries()), (3, 5));
    assert_eq!(c.faults.get("kill9"), Some(&1));
    let _ = std::fs::remove_dir_all(dir);
}
