//! Schema patterns are matched in linear time: a pattern only a
//! backtracking engine reads is refused when the schema is set, and a
//! pattern catastrophic for backtracking cannot stall the server.

mod common;

use std::time::{Duration, Instant};

use common::Server;
use serde_json::Value;

fn error_of(r: reqwest::blocking::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    (status, v["error"].as_str().unwrap_or_default().to_owned())
}

#[test]
fn a_backreference_pattern_is_refused_at_create_and_alter() {
    let mut s = Server::start("schema-backref");
    let backref = r#"{"type":"array","items":{"type":"string","pattern":"(a*)*\\1b"}}"#;
    let (status, msg) =
        error_of(s.post("/v1/topics", format!(r#"{{"name":"br","schema":{backref}}}"#)));
    assert_eq!(status, 400, "{msg}");
    assert!(msg.starts_with("invalid argument: schema: "), "{msg}");
    assert_eq!(s.get("/v1/topics/br").status(), 404);
    s.create_topic(r#"{"name":"br2","schema":{"type":"array"}}"#);
    let r = s
        .client
        .patch(s.url("/v1/topics/br2"))
        .body(format!(r#"{{"schema":{backref}}}"#))
        .send()
        .unwrap();
    let (status, msg) = error_of(r);
    assert_eq!(status, 400, "{msg}");
    s.kill9();
}

#[test]
fn a_pattern_catastrophic_for_backtracking_validates_quickly() {
    let mut s = Server::start("schema-redos");
    s.create_topic(
        r#"{"name":"redos","schema":{"type":"array","items":{"type":"string","pattern":"^(a+)+$"}}}"#,
    );
    // 200 items of 3,000 'a's and a 'b': hopeless for a backtracking
    // engine, a few milliseconds for a linear one.
    let item = format!("\"{}b\"", "a".repeat(3000));
    let body = format!("[{}]", vec![item; 200].join(","));
    let started = Instant::now();
    let (status, msg) = error_of(s.post("/v1/topics/redos/produce", body));
    assert_eq!(status, 400, "{msg}");
    assert!(msg.starts_with("invalid argument: schema: "), "{msg}");
    let good = format!("[\"{}\"]", "a".repeat(3000));
    assert_eq!(s.produce("redos", "", good.as_bytes()), 202);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "validation took {took:?}");
    eprintln!("schema with ^(a+)+$: 600 KB refused and a valid payload accepted in {took:?}");
    s.kill9();
}
