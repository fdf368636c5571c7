//! Fan-out through the real binary: kill -9 in the middle of fanning out
//! loses nothing in any child.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{Server, assert_none_lost};
use serde_json::json;

fn drain_ids(s: &Server, topic: &str, want: usize) -> HashSet<String> {
    let mut seen = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < want && Instant::now() < deadline {
        for p in s.drain(topic) {
            seen.insert(String::from_utf8(p).unwrap());
        }
    }
    seen
}

#[test]
fn sigkill_mid_fan_out_loses_nothing_in_any_child() {
    let mut s = Server::start("fanout-kill");
    s.create_topic(r#"{"name":"parent","partitions":3}"#);
    s.create_topic(r#"{"name":"a","parent":"parent"}"#);
    s.create_topic(r#"{"name":"b","parent":"parent","partitions":4}"#);
    let mut sent = Vec::new();
    for batch in 0..20 {
        let ids: Vec<String> = (0..250).map(|i| format!("r{batch}-{i}")).collect();
        let msgs: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                if i % 2 == 0 { json!({"key": id, "payload": id}) } else { json!({"payload": id}) }
            })
            .collect();
        let r = s.post("/v1/topics/parent/produce/batch", json!({"messages": msgs}).to_string());
        assert_eq!(r.status(), 202);
        // A JSON string payload comes back as that JSON string.
        sent.extend(ids);
        if batch == 12 {
            s.kill9();
            s.restart();
        }
    }
    s.kill9();
    s.restart();
    for child in ["a", "b"] {
        let got = drain_ids(&s, child, sent.len());
        assert_none_lost(child, sent.iter().cloned(), &got);
    }
    let parent = drain_ids(&s, "parent", sent.len());
    assert_eq!(parent.len(), sent.len(), "the parent's own consumers still get everything");
}

/// Any valid topic name (up to 255 characters) can be a child: its cursor
/// files must fit the file system's name limit.
#[test]
fn a_child_with_a_250_character_name_receives_every_record() {
    let s = Server::start("fanout-long-name");
    s.create_topic(r#"{"name":"parent","partitions":3}"#);
    let child = "c".repeat(250);
    s.create_topic(&json!({"name": child, "parent": "parent"}).to_string());
    let sent: Vec<String> = (0..30).map(|i| format!("r{i}")).collect();
    for id in &sent {
        assert_eq!(s.produce("parent", "", id.as_bytes()), 202);
    }
    let got = drain_ids(&s, &child, sent.len());
    assert_none_lost(&child, sent.iter().cloned(), &got);
}
