//! The crash loop: produce from 16 clients (single and batch, keyed and
//! keyless, two topics) while consumers consume and ack; kill the server at
//! random moments (SIGKILL mid-stream, during start-up recovery, during a
//! graceful shutdown); restart on the same data directory; repeat. Finally
//! drain everything. Every message that got a 202 must have been consumed.
//!
//! CI runs 5 cycles; `NARAD_SOAK=1` runs 100 (`NARAD_CYCLES=N` for N).
//! `NARAD_SEED` fixes the kill schedule.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use common::{Server, assert_none_lost, payload_bytes};
use narad_fs::SimRng;
use serde_json::{Value, json};

const TOPICS: [&str; 2] = ["cl-a", "cl-b"];

fn cycles() -> u64 {
    if let Some(n) = std::env::var("NARAD_CYCLES").ok().and_then(|s| s.parse().ok()) {
        return n;
    }
    if std::env::var("NARAD_SOAK").is_ok_and(|v| v == "1") { 100 } else { 5 }
}

struct Shared {
    base: RwLock<String>,
    stop: AtomicBool,
    acked: Mutex<HashSet<String>>,
    delivered: Mutex<HashSet<String>>,
    deliveries: AtomicU64,
    next_id: AtomicU64,
}

fn producer(shared: Arc<Shared>, n: u64) {
    let client =
        reqwest::blocking::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let mut rng = SimRng::new(n);
    while !shared.stop.load(Ordering::Relaxed) {
        let base = shared.base.read().unwrap().clone();
        let topic = TOPICS[rng.below(2) as usize];
        if rng.chance(1, 4) {
            let ids: Vec<String> = (0..5)
                .map(|_| format!("m{}", shared.next_id.fetch_add(1, Ordering::Relaxed)))
                .collect();
            let msgs: Vec<Value> = ids
                .iter()
                .map(|id| {
                    if rng.chance(1, 2) {
                        json!({"key": id, "payload": {"id": id}})
                    } else {
                        json!({"payload": {"id": id}})
                    }
                })
                .collect();
            let r = client
                .post(format!("{base}/v1/topics/{topic}/produce/batch"))
                .body(json!({"messages": msgs}).to_string())
                .send();
            match r {
                Ok(r) if r.status() == 202 => shared.acked.lock().unwrap().extend(ids),
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        } else {
            let id = format!("m{}", shared.next_id.fetch_add(1, Ordering::Relaxed));
            let q = if rng.chance(1, 2) { format!("?key={id}") } else { String::new() };
            let r = client
                .post(format!("{base}/v1/topics/{topic}/produce{q}"))
                .body(json!({"id": id}).to_string())
                .send();
            match r {
                Ok(r) if r.status() == 202 => {
                    shared.acked.lock().unwrap().insert(id);
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

fn consume_once(
    client: &reqwest::blocking::Client,
    base: &str,
    topic: &str,
    shared: &Shared,
    wait: &str,
) -> Option<usize> {
    let r =
        client.get(format!("{base}/v1/topics/{topic}/consume?max=50&wait={wait}")).send().ok()?;
    if r.status() == 204 {
        return Some(0);
    }
    if r.status() != 200 {
        return None;
    }
    let v: Value = serde_json::from_str(&r.text().ok()?).ok()?;
    let msgs = v["messages"].as_array()?.clone();
    let handles: Vec<Value> = msgs.iter().map(|m| m["receipt_handle"].clone()).collect();
    {
        let mut d = shared.delivered.lock().unwrap();
        for m in &msgs {
            let p: Value = serde_json::from_slice(&payload_bytes(m)).ok()?;
            d.insert(p["id"].as_str()?.to_owned());
        }
    }
    shared.deliveries.fetch_add(msgs.len() as u64, Ordering::Relaxed);
    let _ = client
        .post(format!("{base}/v1/topics/{topic}/ack"))
        .body(json!({"receipt_handles": handles}).to_string())
        .send();
    Some(msgs.len())
}

fn consumer(shared: Arc<Shared>, n: usize) {
    let client =
        reqwest::blocking::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    while !shared.stop.load(Ordering::Relaxed) {
        let base = shared.base.read().unwrap().clone();
        if consume_once(&client, &base, TOPICS[n % 2], &shared, "200ms").is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn no_202_is_lost_across_repeated_crashes() {
    let seed = std::env::var("NARAD_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0xC0FFEE);
    let mut rng = SimRng::new(seed);
    let mut s = Server::start("crashloop");
    s.create_topic(r#"{"name":"cl-a","partitions":3}"#);
    s.create_topic(r#"{"name":"cl-b","partitions":4}"#);
    let shared = Arc::new(Shared {
        base: RwLock::new(s.base.clone()),
        stop: AtomicBool::new(false),
        acked: Mutex::default(),
        delivered: Mutex::default(),
        deliveries: AtomicU64::new(0),
        next_id: AtomicU64::new(0),
    });
    let mut threads = Vec::new();
    for n in 0..16 {
        let sh = shared.clone();
        threads.push(std::thread::spawn(move || producer(sh, n)));
    }
    for n in 0..2 {
        let sh = shared.clone();
        threads.push(std::thread::spawn(move || consumer(sh, n)));
    }
    let started = Instant::now();
    let (mut kills, mut startup_kills, mut shutdown_kills) = (0, 0, 0);
    for _ in 0..cycles() {
        std::thread::sleep(Duration::from_millis(rng.range(200, 1200)));
        match rng.below(4) {
            0 => {
                s.terminate_then_kill_after(Duration::from_millis(rng.range(0, 30)));
                shutdown_kills += 1;
            }
            _ => {
                s.kill9();
                kills += 1;
            }
        }
        if rng.chance(1, 3) {
            s.restart_and_kill_after(Duration::from_millis(rng.range(0, 40)));
            startup_kills += 1;
        }
        s.restart();
        *shared.base.write().unwrap() = s.base.clone();
    }
    // Let the load run a moment on the last life, then stop it.
    std::thread::sleep(Duration::from_millis(300));
    shared.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    // Drain whatever is left.
    let client = reqwest::blocking::Client::new();
    for topic in TOPICS {
        while consume_once(&client, &s.base, topic, &shared, "500ms").expect("drain") > 0 {}
    }
    let acked = shared.acked.lock().unwrap();
    let delivered = shared.delivered.lock().unwrap();
    let deliveries = shared.deliveries.load(Ordering::Relaxed);
    eprintln!(
        "crash loop: {} cycles in {:.1?} ({kills} SIGKILL mid-stream, {shutdown_kills} during shutdown, {startup_kills} during start-up); \
         {} acked, {} distinct delivered, {} deliveries, duplicate ratio {:.4}",
        cycles(),
        started.elapsed(),
        acked.len(),
        delivered.len(),
        deliveries,
        deliveries as f64 / delivered.len().max(1) as f64 - 1.0
    );
    assert!(acked.len() > 100, "the load barely ran");
    assert_none_lost("crash loop", acked.iter().cloned(), &delivered);
}
