//! kill -9 in the middle of a produce stream loses nothing that got a 202.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Opts, Server, assert_none_lost};
use serde_json::json;

#[test]
fn every_message_that_got_a_202_survives_sigkill() {
    run(Server::start("kill9"), "kill9");
}

/// The same with `storage.ingress_wal_prealloc`: the WAL overwrites a
/// prepared segment's zeros instead of growing the file.
#[test]
fn every_message_that_got_a_202_survives_sigkill_with_wal_preparation() {
    let opts = Opts::dev().env("NARAD_STORAGE_INGRESS_WAL_PREALLOC", "true");
    run(Server::start_opts("kill9-prealloc", opts), "kill9-prealloc");
}

fn run(mut s: Server, name: &str) {
    s.create_topic(r#"{"name":"k9","partitions":4}"#);
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    let attempted = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let total = 5_000;
    let base = s.base.clone();
    let handles: Vec<_> = (0..16)
        .map(|c| {
            let (acked, attempted, stop, base) = (acked.clone(), attempted.clone(), stop.clone(), base.clone());
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) && attempted.load(Ordering::Relaxed) < total {
                    if n % 4 == 3 {
                        // A batch of 10.
                        let ids: Vec<String> = (0..10).map(|i| format!("c{c}-{n}-{i}")).collect();
                        attempted.fetch_add(10, Ordering::Relaxed);
                        let body = json!({"messages": ids.iter().map(|id| json!({"payload": {"id": id}})).collect::<Vec<_>>()});
                        match client.post(format!("{base}/v1/topics/k9/produce/batch")).body(body.to_string()).send() {
                            Ok(r) if r.status() == 202 => acked.lock().unwrap().extend(ids),
                            _ => return,
                        }
                    } else {
                        let id = format!("c{c}-{n}");
                        attempted.fetch_add(1, Ordering::Relaxed);
                        let q = if n % 2 == 0 { format!("?key={id}") } else { String::new() };
                        let body = json!({"id": id}).to_string();
                        match client.post(format!("{base}/v1/topics/k9/produce{q}")).body(body).send() {
                            Ok(r) if r.status() == 202 => {
                                acked.lock().unwrap().insert(id);
                            }
                            _ => return,
                        }
                    }
                    n += 1;
                }
            })
        })
        .collect();
    // Kill mid-stream.
    while acked.lock().unwrap().len() < total / 2 {
        std::thread::sleep(Duration::from_millis(5));
    }
    s.kill9();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= total / 2);
    s.restart();
    let mut seen: HashSet<String> = HashSet::new();
    let mut deliveries = 0usize;
    for payload in s.drain("k9") {
        let v: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        seen.insert(v["id"].as_str().unwrap().to_owned());
        deliveries += 1;
    }
    assert_none_lost(name, acked.iter().cloned(), &seen);
    eprintln!(
        "{name}: {} acked, {} distinct delivered, {} deliveries (duplicates {:.3}%)",
        acked.len(),
        seen.len(),
        deliveries,
        100.0 * (deliveries - seen.len()) as f64 / seen.len().max(1) as f64
    );
}
