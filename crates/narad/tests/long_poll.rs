//! Long-polling consumers are woken by what makes a record takeable
//! (SPEC §2.2: commits, expiries, cap-freeing acks, nacks), and never miss
//! one: any-partition consumers are woken one at a time and a consumer that
//! takes a full batch passes the wake-up on, so every record is handed out
//! long before a waiting consumer's `wait` runs out. Against the real
//! binary over HTTP.

mod common;

use std::collections::HashSet;
use std::thread;
use std::time::{Duration, Instant};

use common::Server;
use serde_json::{Value, json};

/// Every wait here is 20 s; a consumer that gets its record must have it
/// long before that (the measured time is a few milliseconds).
const WAIT: &str = "wait=20s";
const PROMPT: Duration = Duration::from_secs(10);

/// Time for the consumers started just before to park in their long poll
/// (if one is late it takes without waiting: the properties still hold).
fn let_them_park() {
    thread::sleep(Duration::from_millis(400));
}

/// The records of a consume reply: a batch (`max=`) or a single message.
fn messages(v: &Option<Value>) -> Vec<Value> {
    match v {
        None => Vec::new(),
        Some(v) => match v.get("messages") {
            Some(batch) => batch.as_array().unwrap().clone(),
            None => vec![v.clone()],
        },
    }
}

/// One consume, timed: how long it took and what it returned.
fn timed_consume(s: &Server, topic: &str, query: &str) -> (Duration, Vec<Value>) {
    let t = Instant::now();
    let got = s.consume(topic, query);
    (t.elapsed(), messages(&got))
}

fn produce_batch(s: &Server, topic: &str, n: usize) {
    let msgs: Vec<Value> =
        (0..n).map(|i| json!({ "payload": format!("m{i}"), "partition": 0 })).collect();
    let r = s.post(
        &format!("/v1/topics/{topic}/produce/batch"),
        json!({ "messages": msgs }).to_string(),
    );
    assert_eq!(r.status(), 202, "{}", r.text().unwrap_or_default());
}

fn handle(m: &Value) -> String {
    m["receipt_handle"].as_str().unwrap().to_owned()
}

#[test]
fn every_waiting_consumer_gets_records_while_records_remain() {
    let s = Server::start("lp-chain");
    s.create_topic(r#"{"name":"lp","partitions":3}"#);
    let results: Vec<(Duration, Vec<Value>)> = thread::scope(|sc| {
        let waiters: Vec<_> = (0..4)
            .map(|_| sc.spawn(|| timed_consume(&s, "lp", &format!("max=5&{WAIT}"))))
            .collect();
        let_them_park();
        produce_batch(&s, "lp", 20);
        waiters.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mut offsets = HashSet::new();
    for (took, msgs) in &results {
        assert!(!msgs.is_empty(), "a consumer waited out its poll while records remained");
        assert!(*took < PROMPT, "a consumer got its records only after {took:?}");
        for m in msgs {
            assert!(offsets.insert(m["offset"].as_u64().unwrap()), "an offset leased twice");
        }
    }
}

#[test]
fn an_ack_that_frees_the_in_flight_cap_wakes_a_waiting_consumer() {
    let s = Server::start("lp-cap");
    s.create_topic(r#"{"name":"cap","partitions":3,"max_in_flight_per_partition":1}"#);
    assert_eq!(s.produce("cap", "partition=0", b"first"), 202);
    assert_eq!(s.produce("cap", "partition=0", b"second"), 202);
    let first = messages(&s.consume("cap", "wait=5s"));
    assert_eq!(first.len(), 1);
    let (took, got) = thread::scope(|sc| {
        let waiter = sc.spawn(|| timed_consume(&s, "cap", WAIT));
        let_them_park();
        assert_eq!(s.ack("cap", &handle(&first[0]), None), 204);
        waiter.join().unwrap()
    });
    assert_eq!(got.len(), 1, "the consumer held back by the cap got nothing");
    assert_eq!(got[0]["offset"], 1);
    assert!(took < PROMPT, "the freed slot was noticed only after {took:?}");
}

#[test]
fn a_nack_wakes_a_waiting_consumer_with_the_same_record() {
    let s = Server::start("lp-nack");
    s.create_topic(r#"{"name":"nk","partitions":3}"#);
    assert_eq!(s.produce("nk", "partition=0", b"only"), 202);
    let first = messages(&s.consume("nk", "wait=5s"));
    assert_eq!(first.len(), 1);
    let (took, got) = thread::scope(|sc| {
        let waiter = sc.spawn(|| timed_consume(&s, "nk", WAIT));
        let_them_park();
        assert_eq!(s.ack("nk", &handle(&first[0]), Some("0")), 204);
        waiter.join().unwrap()
    });
    assert_eq!(got.len(), 1, "the nacked record was not handed to the waiting consumer");
    assert_eq!(got[0]["offset"], first[0]["offset"]);
    assert!(took < PROMPT, "the nack was noticed only after {took:?}");
}

#[test]
fn consumers_pinned_to_different_partitions_each_get_their_own() {
    let s = Server::start("lp-pinned");
    s.create_topic(r#"{"name":"pin","partitions":3}"#);
    thread::scope(|sc| {
        let pinned = |p: u32| {
            let s = &s;
            sc.spawn(move || timed_consume(s, "pin", &format!("partition={p}&{WAIT}")))
        };
        let (p0, p1) = (pinned(0), pinned(1));
        let_them_park();
        assert_eq!(s.produce("pin", "partition=1", b"for one"), 202);
        let (took, got) = p1.join().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["partition"], 1);
        assert!(took < PROMPT, "partition 1's consumer was woken only after {took:?}");
        assert!(!p0.is_finished(), "partition 0's consumer returned without a record of its own");
        assert_eq!(s.produce("pin", "partition=0", b"for zero"), 202);
        let (took, got) = p0.join().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["partition"], 0);
        assert!(took < PROMPT, "partition 0's consumer was woken only after {took:?}");
    });
}
