//! Fan-out children through the real binary: the attach, list and detach
//! routes with every documented status, where an attached child starts
//! (the parent's high watermark at the attach), what detach, re-attach and
//! delete do to delivery and to the cursor files, the per-child metrics,
//! and the CLI's `topic attach|children|detach`.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Opts, Server, metric, run_cli, temp_dir};
use reqwest::Method;
use serde_json::{Value, json};

fn status_and_json(r: reqwest::blocking::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let text = r.text().unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn attach(s: &Server, parent: &str, body: impl Into<String>) -> (u16, Value) {
    status_and_json(s.post(&format!("/v1/topics/{parent}/children"), body.into()))
}

fn attach_ok(s: &Server, parent: &str, child: &str, delay_ms: u64) -> Value {
    let (status, v) =
        attach(s, parent, json!({ "child": child, "delay_ms": delay_ms }).to_string());
    assert_eq!(status, 200, "attach {child} to {parent}: {v}");
    v
}

/// Sends only the head of an attach whose body would be `len` bytes, and
/// reads the answer: a body over the cap is refused on its declared length,
/// and a client that kept writing it could see a broken pipe instead.
fn attach_declaring_length(s: &Server, parent: &str, len: usize) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST /v1/topics/{parent}/children HTTP/1.1\r\nHost: localhost\r\n\
         Content-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    let status = answer.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: Value = serde_json::from_str(body.trim()).unwrap_or(Value::Null);
    (status, v["error"].as_str().unwrap_or(body).to_owned())
}

fn detach(s: &Server, parent: &str, child: &str) -> (u16, Value) {
    let url = s.url(&format!("/v1/topics/{parent}/children/{child}"));
    status_and_json(s.client.delete(url).send().unwrap())
}

fn children(s: &Server, parent: &str) -> (u16, Value) {
    status_and_json(s.get(&format!("/v1/topics/{parent}/children")))
}

fn topic(s: &Server, name: &str) -> Value {
    let (status, v) = status_and_json(s.get(&format!("/v1/topics/{name}")));
    assert_eq!(status, 200, "{v}");
    v
}

/// The parent's high watermarks summed over its partitions.
fn committed(s: &Server, name: &str) -> u64 {
    let t = topic(s, name);
    t["partition_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["high_watermark"].as_u64().unwrap())
        .sum()
}

/// Waits until `name` has committed at least `n` records.
fn wait_committed(s: &Server, name: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while committed(s, name) < n {
        assert!(Instant::now() < deadline, "{name} did not commit {n} records in 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn produce_all(s: &Server, topic: &str, ids: &[String]) {
    let msgs: Vec<Value> = ids.iter().map(|id| json!({ "payload": id })).collect();
    let r = s.post(
        &format!("/v1/topics/{topic}/produce/batch"),
        json!({ "messages": msgs }).to_string(),
    );
    assert_eq!(r.status(), 202);
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Consumes and acks `topic` until every id in `want` arrived (or 20 s
/// passed), then once more briefly; returns everything seen.
fn drain_until(s: &Server, topic: &str, want: &[String]) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !want.iter().all(|id| seen.contains(id)) && Instant::now() < deadline {
        for p in s.drain(topic) {
            seen.insert(String::from_utf8(p).unwrap());
        }
    }
    for p in s.drain(topic) {
        seen.insert(String::from_utf8(p).unwrap());
    }
    seen
}

/// The cursor files of attachment `epoch` (16 hex digits) in `parent`'s
/// partitions (`fanout@<epoch>.offset`).
fn cursor_files(s: &Server, parent: &str, epoch: &str) -> Vec<PathBuf> {
    let dir = s.data_dir.join("topics").join(parent);
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let f = e.path().join(format!("fanout@{epoch}.offset"));
        if f.exists() {
            out.push(f);
        }
    }
    out.sort();
    out
}

/// The attach epoch of `child`'s link.
fn epoch(s: &Server, child: &str) -> String {
    topic(s, child)["attach_epoch"].as_str().unwrap().to_owned()
}

/// The attach epoch stored in a cursor file (bytes 8..16, big-endian).
fn file_epoch(path: &PathBuf) -> String {
    let b = std::fs::read(path).unwrap();
    b[8..16].iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn attach_list_and_detach_round_trip() {
    let s = Server::start("children-rt");
    s.create_topic(r#"{"name":"p","partitions":3}"#);
    s.create_topic(r#"{"name":"c","partitions":4}"#);
    let parent = attach_ok(&s, "p", "c", 0);
    assert_eq!(parent["name"], "p");
    assert_eq!(parent["role"], "parent");
    assert_eq!(parent["children"], json!(["c"]));
    let c = topic(&s, "c");
    assert_eq!((c["role"].as_str(), c["parent"].as_str()), (Some("child"), Some("p")));
    assert_eq!(c["partitions"], 4, "an attached child keeps its partition count");
    let epoch = c["attach_epoch"].as_str().unwrap().to_owned();
    assert_eq!(epoch.len(), 16);
    assert!(c.get("fanout_delay_ms").is_none(), "a zero delay is omitted");

    s.create_topic(r#"{"name":"late"}"#);
    attach_ok(&s, "p", "late", 90_000);
    let (status, list) = children(&s, "p");
    assert_eq!(status, 200);
    assert!(
        list["children"].as_array().unwrap().iter().all(|c| c["lag_complete"] == true),
        "the first read after the attaches is complete: {list}"
    );
    assert_eq!(list["parent"], "p");
    let names: Vec<&str> =
        list["children"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["c", "late"], "attach order");
    let first = &list["children"][0];
    assert_eq!((first["delay_ms"].as_u64(), first["lag_messages"].as_u64()), (Some(0), Some(0)));
    assert_eq!(first["lag_complete"], true);
    assert_eq!(list["children"][1]["delay_ms"], 90_000);
    assert_eq!(topic(&s, "late")["fanout_delay_ms"], 90_000);

    let (status, _) = detach(&s, "p", "c");
    assert_eq!(status, 204);
    let (_, list) = children(&s, "p");
    assert_eq!(list["children"].as_array().unwrap().len(), 1);
    let c = topic(&s, "c");
    assert_eq!(c["role"], "standalone");
    assert!(c.get("parent").is_none() && c.get("attach_epoch").is_none());
    assert_eq!(detach(&s, "p", "late").0, 204);
    assert_eq!(topic(&s, "p")["role"], "standalone", "no children left");
    let (status, list) = children(&s, "p");
    assert_eq!((status, list["children"].as_array().unwrap().len()), (200, 0));
}

#[test]
fn every_documented_attach_and_detach_error_has_its_status_and_text() {
    let s = Server::start("children-errors");
    s.create_topic(r#"{"name":"p","retention_ms":7200000}"#);
    s.create_topic(r#"{"name":"q"}"#);
    s.create_topic(r#"{"name":"c"}"#);
    s.create_topic(r#"{"name":"d"}"#);
    s.create_topic(r#"{"name":"free"}"#);
    s.create_topic(r#"{"name":"typed","schema":{"type":"object"}}"#);
    attach_ok(&s, "p", "c", 0);
    attach_ok(&s, "q", "d", 0);
    let body = |child: &str, delay: i64| json!({ "child": child, "delay_ms": delay }).to_string();
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("nope", body("free", 0), 404, "topic not found"),
        ("p", body("nope", 0), 404, r#"topic not found: child topic "nope""#),
        ("p", "{}".into(), 400, "invalid argument: child required"),
        ("p", body("free", -1), 400, "invalid argument: delay_ms must be >= 0"),
        (
            "p",
            body("free", 31_536_000_001),
            400,
            "invalid argument: delay_ms (31536000001) exceeds the maximum of 31536000000 (1 year)",
        ),
        ("p", body("p", 0), 400, "invalid argument: a topic cannot be attached to itself"),
        ("p", r#"{"child":"free","x":1}"#.into(), 400, r#"invalid json: json: unknown field "x""#),
        ("p", r#"{"child":"free"} {}"#.into(), 400, "invalid json: multiple JSON values"),
        ("p", body("c", 0), 409, r#"topic "c" is already attached to "p""#),
        ("p", body("d", 0), 409, r#"topic "d" is already attached to parent "q""#),
        ("c", body("free", 0), 409, r#"topic "c" is a child of "p" and cannot have children"#),
        (
            "free",
            body("p", 0),
            409,
            r#"topic "p" is a parent of 1 children and cannot be attached"#,
        ),
        (
            "p",
            body("free", 3_600_001),
            400,
            "invalid argument: parent retention_ms (7200000) must be at least fanout_delay_ms + 1 hour (7200001)",
        ),
        (
            "p",
            body("typed", 0),
            409,
            r#"schema mismatch: child "typed" must have no schema or the same schema history as parent "p""#,
        ),
    ];
    for (parent, b, status, text) in cases {
        let (got, v) = attach(&s, parent, b.clone());
        let shown = &b[..b.len().min(60)];
        assert_eq!((got, v["error"].as_str()), (status, Some(text)), "attach {shown} to {parent}");
    }
    assert_eq!(topic(&s, "free")["role"], "standalone", "a refused attach changes nothing");
    assert_eq!(
        attach_declaring_length(&s, "p", (1 << 20) + 1),
        (400, "invalid json: http: request body too large".into()),
        "attach bodies are streamed JSON: over 1 MiB is a 400, not a 413"
    );

    let detaches = [
        ("nope", "c", "topic not found"),
        ("p", "nope", r#"topic not found: child topic "nope""#),
        ("p", "free", r#"topic "free" is not attached to "p""#),
        ("p", "d", r#"topic "d" is not attached to "p""#),
    ];
    for (parent, child, text) in detaches {
        let (got, v) = detach(&s, parent, child);
        assert_eq!((got, v["error"].as_str()), (404, Some(text)), "detach {child} from {parent}");
    }
    let (got, v) = children(&s, "nope");
    assert_eq!((got, v["error"].as_str()), (404, Some("topic not found")));

    // A delayed child refuses direct produce; undelayed children take it.
    attach_ok(&s, "p", "free", 3_600_000);
    let (got, v) = status_and_json(s.post("/v1/topics/free/produce", "x"));
    assert_eq!(
        (got, v["error"].as_str()),
        (409, Some("direct produce to a delayed child topic is not allowed"))
    );
    assert_eq!(s.produce("c", "", b"direct"), 202);
}

#[test]
fn a_parent_takes_at_most_108_children() {
    let s = Server::start("children-108");
    s.create_topic(r#"{"name":"p"}"#);
    for i in 0..108 {
        s.create_topic(&format!(r#"{{"name":"c{i}","parent":"p"}}"#));
    }
    s.create_topic(r#"{"name":"extra"}"#);
    let (got, v) = attach(&s, "p", r#"{"child":"extra"}"#);
    assert_eq!(
        (got, v["error"].as_str()),
        (409, Some(r#"parent topic "p" already has 108 children"#))
    );
    assert_eq!(detach(&s, "p", "c0").0, 204);
    attach_ok(&s, "p", "extra", 0);
}

#[test]
fn attach_and_detach_need_the_parents_owner_or_an_admin() {
    let s = Server::start_opts("children-authz", Opts::secure());
    let add_user = |name: &str, grants: Value| {
        let body = json!({ "username": name, "password": "pw", "grants": grants });
        let r = s.as_admin(Method::POST, "/v1/users").body(body.to_string()).send().unwrap();
        assert_eq!(r.status(), 201);
    };
    add_user("alice", json!([{"action":"create","patterns":["a*"]}]));
    add_user("bob", json!([{"action":"create","patterns":["b*"]}]));
    let create = |user: &str, name: &str| {
        let r = s.as_user(Method::POST, "/v1/topics", user, "pw");
        let r = r.body(json!({ "name": name }).to_string()).send().unwrap();
        assert_eq!(r.status(), 201);
    };
    create("alice", "a.parent");
    create("alice", "a.child");
    create("bob", "b.topic");
    let as_user = |user: &str, method: Method, path: &str, body: &str| {
        let r = s.as_user(method, path, user, "pw").body(body.to_owned()).send().unwrap();
        status_and_json(r)
    };
    let (got, v) =
        as_user("bob", Method::POST, "/v1/topics/a.parent/children", r#"{"child":"b.topic"}"#);
    assert_eq!(
        (got, v["error"].as_str()),
        (403, Some("only the topic owner or an admin may modify this topic"))
    );
    let (got, _) =
        as_user("alice", Method::POST, "/v1/topics/a.parent/children", r#"{"child":"a.child"}"#);
    assert_eq!(got, 200, "the owner attaches");
    let (got, list) = as_user("bob", Method::GET, "/v1/topics/a.parent/children", "");
    assert_eq!(
        (got, list["children"][0]["name"].as_str()),
        (200, Some("a.child")),
        "any user lists"
    );
    let (got, _) = as_user("bob", Method::DELETE, "/v1/topics/a.parent/children/a.child", "");
    assert_eq!(got, 403);
    let r = s.get("/v1/topics/a.parent/children");
    assert_eq!(r.status(), 401, "the list needs credentials");
    let r = s.as_admin(Method::DELETE, "/v1/topics/a.parent/children/a.child").send().unwrap();
    assert_eq!(r.status(), 204, "an admin detaches anyone's child");
    let (got, _) =
        as_user("bob", Method::POST, "/v1/topics/nope/children", r#"{"child":"b.topic"}"#);
    assert_eq!(got, 404, "a missing parent passes the owner check and is a 404");
}

#[test]
fn an_attached_child_starts_at_the_parents_high_watermark() {
    let s = Server::start("children-hwm");
    s.create_topic(r#"{"name":"p","partitions":3}"#);
    s.create_topic(r#"{"name":"c"}"#);
    let before = ids("before", 60);
    produce_all(&s, "p", &before);
    wait_committed(&s, "p", 60);
    attach_ok(&s, "p", "c", 0);
    let after = ids("after", 60);
    produce_all(&s, "p", &after);
    let got = drain_until(&s, "c", &after);
    let early: Vec<&String> = got.iter().filter(|id| id.starts_with("before")).collect();
    assert!(early.is_empty(), "records committed before the attach reached the child: {early:?}");
    let missing: Vec<&String> = after.iter().filter(|id| !got.contains(*id)).collect();
    assert!(missing.is_empty(), "records after the attach missing: {missing:?}");
    let parent: BTreeSet<String> =
        s.drain("p").into_iter().map(|p| String::from_utf8(p).unwrap()).collect();
    assert_eq!(parent.len(), 120, "the parent's own consumers get everything");
    let (_, list) = children(&s, "p");
    assert_eq!(list["children"][0]["lag_messages"], 0);
    assert_eq!(list["children"][0]["lag_complete"], true);
}

#[test]
fn an_attach_survives_a_kill_9_before_any_record_flows() {
    let mut s = Server::start("children-kill");
    s.create_topic(r#"{"name":"p","partitions":3}"#);
    s.create_topic(r#"{"name":"c"}"#);
    let before = ids("before", 30);
    produce_all(&s, "p", &before);
    wait_committed(&s, "p", 30);
    attach_ok(&s, "p", "c", 0);
    s.kill9();
    s.restart();
    let after = ids("after", 30);
    produce_all(&s, "p", &after);
    let got = drain_until(&s, "c", &after);
    assert!(
        after.iter().all(|id| got.contains(id)),
        "after the restart the child gets everything new"
    );
    assert!(!got.iter().any(|id| id.starts_with("before")), "and still nothing older: {got:?}");
}

#[test]
fn detach_stops_delivery_and_removes_the_cursor_files() {
    let s = Server::start("children-detach");
    s.create_topic(r#"{"name":"p","partitions":3}"#);
    s.create_topic(r#"{"name":"c"}"#);
    attach_ok(&s, "p", "c", 0);
    let e = epoch(&s, "c");
    assert_eq!(cursor_files(&s, "p", &e).len(), 3, "one cursor file per parent partition");
    let first = ids("first", 30);
    produce_all(&s, "p", &first);
    let got = drain_until(&s, "c", &first);
    assert_eq!(got, first.iter().cloned().collect());

    assert_eq!(detach(&s, "p", "c").0, 204);
    assert_eq!(cursor_files(&s, "p", &e), Vec::<PathBuf>::new(), "gone when the 204 arrives");
    let second = ids("second", 30);
    produce_all(&s, "p", &second);
    wait_committed(&s, "p", 60);
    std::thread::sleep(Duration::from_millis(1500)); // past a reconcile tick
    assert!(s.drain("c").is_empty(), "a detached child gets nothing more");
    assert!(cursor_files(&s, "p", &e).is_empty());
    assert_eq!(s.drain("p").len(), 60);
}

#[test]
fn a_reattach_starts_fresh_under_a_new_epoch() {
    let s = Server::start("children-reattach");
    s.create_topic(r#"{"name":"p","partitions":3}"#);
    s.create_topic(r#"{"name":"c"}"#);
    attach_ok(&s, "p", "c", 0);
    let old_epoch = topic(&s, "c")["attach_epoch"].as_str().unwrap().to_owned();
    let first = ids("first", 20);
    produce_all(&s, "p", &first);
    drain_until(&s, "c", &first);
    assert_eq!(detach(&s, "p", "c").0, 204);
    let gap = ids("gap", 20);
    produce_all(&s, "p", &gap);
    wait_committed(&s, "p", 40);

    attach_ok(&s, "p", "c", 0);
    let new_epoch = topic(&s, "c")["attach_epoch"].as_str().unwrap().to_owned();
    assert_ne!(new_epoch, old_epoch, "every attach has its own epoch");
    assert!(cursor_files(&s, "p", &old_epoch).is_empty(), "the old epoch's files are gone");
    let files = cursor_files(&s, "p", &new_epoch);
    assert_eq!(files.len(), 3);
    for f in &files {
        assert_eq!(file_epoch(f), new_epoch, "{}", f.display());
    }
    let third = ids("third", 20);
    produce_all(&s, "p", &third);
    let got = drain_until(&s, "c", &third);
    assert_eq!(got, third.iter().cloned().collect(), "nothing from before the re-attach");
}

#[test]
fn deleting_a_child_or_a_parent_dissolves_the_link_and_its_cursors() {
    let s = Server::start("children-delete");
    s.create_topic(r#"{"name":"p","partitions":3}"#);
    s.create_topic(r#"{"name":"c"}"#);
    s.create_topic(r#"{"name":"d"}"#);
    attach_ok(&s, "p", "c", 0);
    attach_ok(&s, "p", "d", 5_000);
    let (ec, ed) = (epoch(&s, "c"), epoch(&s, "d"));
    assert_eq!(cursor_files(&s, "p", &ec).len(), 3);
    let r = s.client.delete(s.url("/v1/topics/c")).send().unwrap();
    assert_eq!(r.status(), 204);
    assert!(cursor_files(&s, "p", &ec).is_empty(), "a deleted child's cursor files go with it");
    assert_eq!(topic(&s, "p")["children"], json!(["d"]));
    assert_eq!(cursor_files(&s, "p", &ed).len(), 3);

    let r = s.client.delete(s.url("/v1/topics/p")).send().unwrap();
    assert_eq!(r.status(), 204);
    let d = topic(&s, "d");
    assert_eq!(d["role"], "standalone", "a deleted parent's children become standalone");
    assert!(d.get("fanout_delay_ms").is_none());
    assert_eq!(s.produce("d", "", b"direct"), 202, "and are no longer delayed children");
    assert!(!s.data_dir.join("topics/p").exists());
}

#[test]
fn fan_out_metrics_are_exported_per_child_and_removed_with_the_link() {
    let s = Server::start("children-metrics");
    s.create_topic(r#"{"name":"p","partitions":3}"#);
    s.create_topic(r#"{"name":"slow"}"#);
    attach_ok(&s, "p", "slow", 1_000);
    let sent = ids("m", 5);
    produce_all(&s, "p", &sent);
    let got = drain_until(&s, "slow", &sent);
    assert_eq!(got.len(), 5);
    let text = s.get("/metrics").text().unwrap();
    let labels = r#"{parent="p",child="slow"}"#;
    assert_eq!(
        metric(&text, &format!("narad_fanout_committed_total{labels}"), &[]),
        Some(5.0),
        "{text}"
    );
    let holds = metric(&text, &format!("narad_fanout_delay_gate_holds_total{labels}"), &[]);
    assert!(holds.is_some_and(|h| h >= 1.0), "the delay gate held records back: {holds:?}");
    assert!(text.contains(r#"narad_fanout_lag_messages{parent="p",child="slow",partition="0"}"#));
    assert!(text.contains(r#"narad_fanout_due_lag_seconds{parent="p",child="slow""#));
    assert!(metric(&text, "narad_fanout_batch_records_count", &[]).is_some_and(|n| n >= 1.0));
    assert!(text.contains("narad_fanout_batch_bytes_bucket"));

    assert_eq!(detach(&s, "p", "slow").0, 204);
    let text = s.get("/metrics").text().unwrap();
    assert!(!text.contains(r#"child="slow""#), "a dissolved link's series are gone");
}

#[test]
fn cli_attach_children_and_detach_end_to_end() {
    let s = Server::start("children-cli");
    s.create_topic(r#"{"name":"p"}"#);
    s.create_topic(r#"{"name":"c"}"#);
    let config_dir = temp_dir("children-cli-cfg").display().to_string();
    let env = [("NARAD_ADDR", s.base.as_str()), ("NARAD_CONFIG_DIR", config_dir.as_str())];
    let cli = |args: &[&str]| run_cli(args, &env, None);

    let (code, out, err) = cli(&["topic", "attach", "p", "c", "--delay", "2s"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("parent"), "the parent, as a table: {out}");
    let (code, out, err) = cli(&["topic", "children", "p", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["children"][0]["name"].as_str(), v["children"][0]["delay_ms"].as_u64()),
        (Some("c"), Some(2000))
    );
    let (code, out, _) = cli(&["topic", "children", "p"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("DELAY_MS") && out.contains("LAG_MESSAGES") && out.contains("2000"),
        "{out}"
    );
    let (code, _, err) = cli(&["topic", "attach", "p", "c"]);
    assert_eq!(code, 1, "a server refusal is exit 1");
    assert!(err.contains("409") && err.contains("already attached"), "{err}");
    let (code, _, _) = cli(&["topic", "attach", "p", "c", "--delay", "soon"]);
    assert_eq!(code, 2, "a bad duration is a usage error");
    let (code, out, err) = cli(&["topic", "detach", "p", "c"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("c detached from p"), "{out}");
    let (code, _, err) = cli(&["topic", "detach", "p", "c"]);
    assert_eq!(code, 1);
    assert!(err.contains("404"), "{err}");
    let (code, out, _) = cli(&["topic", "children", "p", "-o", "json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["children"], json!([]));
    let _ = std::fs::remove_dir_all(&config_dir);
}

#[test]
fn a_grown_parent_fans_out_its_new_partitions_too() {
    let s = Server::start("children-grow");
    s.create_topic(r#"{"name":"p","partitions":3}"#);
    s.create_topic(r#"{"name":"c"}"#);
    attach_ok(&s, "p", "c", 0);
    let r = s.client.patch(s.url("/v1/topics/p")).body(r#"{"partitions":5}"#).send().unwrap();
    assert_eq!(r.status(), 200);
    for i in 0..10 {
        assert_eq!(s.produce("p", "partition=4", format!("new-{i}").as_bytes()), 202);
    }
    let want = ids("new", 10);
    let got = drain_until(&s, "c", &want);
    assert!(want.iter().all(|id| got.contains(id)), "{got:?}");
    assert_eq!(cursor_files(&s, "p", &epoch(&s, "c")).len(), 5);
}

#[test]
fn a_cursor_file_without_a_link_is_swept_at_start() {
    let mut s = Server::start("children-sweep");
    s.create_topic(r#"{"name":"p","partitions":3}"#);
    s.create_topic(r#"{"name":"c"}"#);
    attach_ok(&s, "p", "c", 0);
    let e = epoch(&s, "c");
    s.kill9();
    let dir = s.data_dir.join("topics/p/p00001");
    // A file of an attachment that no longer exists, its torn temporary
    // file, and one under the earlier name of a child no longer linked.
    let ghosts = [
        dir.join("fanout@00000000000000aa.offset"),
        dir.join("fanout@00000000000000aa.offset.tmp"),
        dir.join("fanout-ghost.offset"),
    ];
    std::fs::copy(dir.join(format!("fanout@{e}.offset")), &ghosts[0]).unwrap();
    std::fs::write(&ghosts[1], b"torn").unwrap();
    std::fs::copy(dir.join(format!("fanout@{e}.offset")), &ghosts[2]).unwrap();
    s.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ghosts.iter().any(|g| g.exists()) {
        assert!(Instant::now() < deadline, "the orphaned cursor files were not swept");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(cursor_files(&s, "p", &e).len(), 3, "the files of a live link stay");
}
