//! Every /v1 route's happy path and every documented error status, against
//! the real binary over HTTP.

mod common;

use std::time::{Duration, Instant};

use common::{Opts, Server, metric, payload_bytes};
use serde_json::{Value, json};

/// Status and error of a POST that only *declares* a body of `len` bytes
/// (none is sent): an over-limit body must be refused from its declared
/// length, before any of it is read. (Sending the body with reqwest raced
/// the refusal: the server answers and closes while the client is still
/// writing, and the client sees a broken pipe instead of the answer.)
fn declared_body_refusal(s: &Server, path: &str, len: usize) -> (u16, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    c.write_all(head.as_bytes()).unwrap();
    let mut reply = Vec::new();
    let _ = c.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status =
        reply.get(9..12).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{reply:?}"));
    let body = reply.split("\r\n\r\n").nth(1).unwrap_or_else(|| panic!("{reply:?}"));
    let v: Value = serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {reply:?}"));
    (status, v["error"].as_str().unwrap().to_owned())
}

fn error_of(r: reqwest::blocking::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    let body = r.text().unwrap();
    assert_eq!(ct.as_deref(), Some("application/json"), "{status} {body}");
    assert!(body.ends_with('\n'), "JSON bodies end with a newline");
    let v: Value = serde_json::from_str(&body).unwrap();
    (status, v["error"].as_str().unwrap().to_owned())
}

#[test]
fn topic_routes_answer_with_narads_shapes_and_statuses() {
    let s = Server::start("topics");
    let r = s.post("/v1/topics", r#"{"name":"orders","partitions":4,"retention_ms":3600000}"#);
    assert_eq!(r.status(), 201);
    let text = r.text().unwrap();
    assert!(
        text.starts_with(
            r#"{"name":"orders","partitions":4,"retention_ms":3600000,"visibility_timeout_ms""#
        ),
        "{text}"
    );
    let t: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(t["name"], "orders");
    assert_eq!(t["partitions"], 4);
    assert_eq!(t["retention_ms"], 3_600_000);
    assert_eq!(t["visibility_timeout_ms"], 30_000);
    assert_eq!(t["max_in_flight_per_partition"], 1024);
    assert!(t.get("role").is_none(), "role is absent in a standalone create reply");

    // Duplicates, bad names, bad values, strict bodies, size.
    assert_eq!(
        error_of(s.post("/v1/topics", r#"{"name":"orders"}"#)),
        (409, "topic already exists".into())
    );
    assert_eq!(error_of(s.post("/v1/topics", r#"{"name":"bad name"}"#)).0, 400);
    assert_eq!(error_of(s.post("/v1/topics", r#"{"name":".."}"#)).0, 400);
    assert_eq!(error_of(s.post("/v1/topics", r#"{"name":"x","partitions":2}"#)).0, 400);
    assert_eq!(error_of(s.post("/v1/topics", r#"{"name":"x","retention_ms":1000}"#)).0, 400);
    assert_eq!(error_of(s.post("/v1/topics", r#"{"name":"x","visibility_timeout_ms":-1}"#)).0, 400);
    assert_eq!(
        error_of(s.post("/v1/topics", r#"{"name":"x","colour":"red"}"#)),
        (400, "invalid json: json: unknown field \"colour\"".into())
    );
    assert_eq!(
        error_of(s.post("/v1/topics", r#"{"name":"x"} {"name":"y"}"#)),
        (400, "invalid json: multiple JSON values".into())
    );
    assert_eq!(error_of(s.post("/v1/topics", r#"{"name":"x","schema":{"type":"nope"}}"#)).0, 400);
    assert_eq!(
        declared_body_refusal(&s, "/v1/topics", (1 << 20) + 1),
        (413, "request body too large".into())
    );

    // List with keyset pagination.
    for n in ["a1", "a2", "a3"] {
        s.create_topic(&format!(r#"{{"name":"{n}"}}"#));
    }
    let page: Value = serde_json::from_str(&s.get("/v1/topics?limit=2").text().unwrap()).unwrap();
    let names: Vec<&str> =
        page["topics"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["a1", "a2"]);
    assert_eq!(page["next_page_token"], "a2");
    assert_eq!(page["topics"][0]["role"], "standalone", "role is present on reads");
    let page: Value =
        serde_json::from_str(&s.get("/v1/topics?limit=2&page_token=a2").text().unwrap()).unwrap();
    let names: Vec<&str> =
        page["topics"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["a3", "orders"]);
    let last: Value =
        serde_json::from_str(&s.get("/v1/topics?limit=10&page_token=orders").text().unwrap())
            .unwrap();
    assert_eq!(last["next_page_token"], "");
    assert_eq!(
        error_of(s.get("/v1/topics?limit=0")),
        (400, "limit must be a positive integer".into())
    );

    // Details.
    let d: Value = serde_json::from_str(&s.get("/v1/topics/orders").text().unwrap()).unwrap();
    let stats = d["partition_stats"].as_array().unwrap();
    assert_eq!(stats.len(), 4);
    assert_eq!(stats[3]["index"], 3);
    let one: Value =
        serde_json::from_str(&s.get("/v1/topics/orders?partition=2").text().unwrap()).unwrap();
    assert_eq!(one["partition_stats"].as_array().unwrap().len(), 1);
    assert_eq!(error_of(s.get("/v1/topics/orders?partition=9")), (400, "invalid partition".into()));
    assert_eq!(error_of(s.get("/v1/topics/orders?partition=x")), (400, "invalid partition".into()));
    assert_eq!(error_of(s.get("/v1/topics/missing")).0, 404);

    // Alter.
    let patch = |body: &str| {
        s.client.patch(s.url("/v1/topics/orders")).body(body.to_owned()).send().unwrap()
    };
    let r = patch(r#"{"partitions":6,"max_in_flight_per_partition":10}"#);
    assert_eq!(r.status(), 200);
    let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    assert_eq!(
        (v["partitions"].as_u64(), v["max_in_flight_per_partition"].as_u64()),
        (Some(6), Some(10))
    );
    assert_eq!(
        error_of(patch(r#"{"visibility_timeout_ms":5000}"#)),
        (400, "invalid json: json: unknown field \"visibility_timeout_ms\"".into())
    );
    assert_eq!(error_of(patch(r#"{"partitions":5}"#)).0, 400, "partitions only grow");
    assert_eq!(error_of(patch("{}")).0, 400);
    let r = s.client.patch(s.url("/v1/topics/missing")).body(r#"{"partitions":9}"#).send().unwrap();
    assert_eq!(error_of(r).0, 404);

    // Delete.
    let r = s.client.delete(s.url("/v1/topics/a1")).send().unwrap();
    assert_eq!(r.status(), 204);
    let r = s.client.delete(s.url("/v1/topics/a1")).send().unwrap();
    assert_eq!(error_of(r).0, 404);
}

#[test]
fn produce_routes_validate_in_narads_order() {
    let s = Server::start("produce");
    s.create_topic(r#"{"name":"t"}"#);
    s.create_topic(
        r#"{"name":"typed","schema":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}}"#,
    );
    assert_eq!(s.produce("t", "", b"x"), 202);
    assert_eq!(s.produce("t", "key=a%20b&partition=2", b"x"), 202);
    let r = s.post("/v1/topics/t/produce", Vec::<u8>::new());
    assert_eq!(error_of(r), (400, "message required".into()));
    let exactly = vec![b'a'; 1 << 20];
    assert_eq!(s.produce("t", "", &exactly), 202, "exactly 1 MiB is allowed");
    assert_eq!(
        declared_body_refusal(&s, "/v1/topics/t/produce", (1 << 20) + 1),
        (413, "request body too large".into())
    );
    assert_eq!(error_of(s.post("/v1/topics/missing/produce", "x")).0, 404);
    assert_eq!(
        error_of(s.post("/v1/topics/t/produce?partition=3", "x")),
        (400, "invalid argument: partition out of range".into())
    );
    assert_eq!(error_of(s.post("/v1/topics/t/produce?partition=x", "x")).0, 400);
    assert_eq!(error_of(s.post("/v1/topics/t/produce?key=a&key=b", "x")).0, 400);
    // Query errors come before the topic lookup.
    assert_eq!(error_of(s.post("/v1/topics/missing/produce?partition=x", "x")).0, 400);
    assert_eq!(s.produce("typed", "", br#"{"n":1}"#), 202);
    let (status, msg) = error_of(s.post("/v1/topics/typed/produce", r#"{"n":"one"}"#));
    assert_eq!(status, 400);
    assert!(msg.starts_with("invalid argument: schema: "), "{msg}");
    assert_eq!(error_of(s.post("/v1/topics/typed/produce", "not json")).0, 400);

    // Batch produce.
    let batch = json!({"messages": [
        {"key": "k", "payload": {"a": 1}},
        {"payload": "text"},
        {"payload": "AAEC", "payload_encoding": "base64", "partition": 1},
        {"key": "/w==", "key_encoding": "base64", "payload": [1, 2]}
    ]});
    let r = s.post("/v1/topics/t/produce/batch", batch.to_string());
    assert_eq!(r.status(), 202);
    assert_eq!(r.text().unwrap(), "{\"accepted\":4}\n");
    let bad = json!({"messages": [{"payload": 1}, {"payload": 2, "partition": 9}]});
    let (status, msg) = error_of(s.post("/v1/topics/t/produce/batch", bad.to_string()));
    assert_eq!(status, 400);
    assert!(msg.starts_with("message 1: "), "{msg}");
    assert_eq!(error_of(s.post("/v1/topics/t/produce/batch?key=a", batch.to_string())).0, 400);
    assert_eq!(error_of(s.post("/v1/topics/t/produce/batch", r#"{"messages":[]}"#)).0, 400);
    let too_many =
        json!({"messages": (0..1001).map(|i| json!({"payload": i})).collect::<Vec<_>>()});
    assert_eq!(error_of(s.post("/v1/topics/t/produce/batch", too_many.to_string())).0, 400);
    let typed_bad = json!({"messages": [{"payload": {"n": 1}}, {"payload": {"n": "x"}}]});
    let (status, msg) = error_of(s.post("/v1/topics/typed/produce/batch", typed_bad.to_string()));
    assert_eq!(status, 400);
    assert!(msg.starts_with("message 1: invalid argument: schema: "), "{msg}");
    // zstd-compressed batch.
    let packed = zstd_compress(batch.to_string().as_bytes());
    let r = s
        .client
        .post(s.url("/v1/topics/t/produce/batch"))
        .header("Content-Encoding", "zstd")
        .body(packed)
        .send()
        .unwrap();
    assert_eq!(r.status(), 202);

    // Everything accepted is eventually consumable, exactly as sent.
    let got = s.drain("t");
    assert_eq!(got.len(), 3 + 4 + 4);
    assert!(got.contains(&br#"{"a":1}"#.to_vec()));
    assert!(got.contains(&vec![0, 1, 2]));
    assert!(got.contains(&exactly));
    let typed = s.drain("typed");
    assert_eq!(typed, vec![br#"{"n":1}"#.to_vec()], "a refused batch appends nothing");
}

fn zstd_compress(b: &[u8]) -> Vec<u8> {
    zstd::encode_all(b, 3).unwrap()
}

#[test]
fn consume_and_ack_routes_answer_every_documented_status() {
    let s = Server::start("consume");
    s.create_topic(r#"{"name":"q","max_acked_ahead_per_partition":1}"#);
    assert!(s.consume("q", "").is_none(), "204 when nothing");
    for i in 0..4 {
        assert_eq!(s.produce("q", "partition=0", format!("m{i}").as_bytes()), 202);
    }
    // Wait for all four to be visible, then lease three in partition 0.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let d: Value =
            serde_json::from_str(&s.get("/v1/topics/q?partition=0").text().unwrap()).unwrap();
        if d["partition_stats"][0]["high_watermark"] == 4 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "records not visible: {d}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let m0 = s.consume("q", "partition=0&wait=5s").unwrap();
    assert_eq!(m0["offset"], 0);
    assert_eq!(m0["payload"], "m0");
    assert!(m0["timestamp"].as_u64().unwrap() > 1_600_000_000);
    let batch = s.consume("q", "partition=0&max=2").unwrap();
    let msgs = batch["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2);
    let h = |m: &Value| m["receipt_handle"].as_str().unwrap().to_owned();
    // Ack ahead of the frontier fills the acked-ahead set (cap 1)...
    assert_eq!(s.ack("q", &h(&msgs[0]), None), 204);
    // ...so the next ack ahead is refused with 503 and its lease kept.
    let r = s.post(&format!("/v1/topics/q/ack?receipt_handle={}", h(&msgs[1])), Vec::new());
    assert_eq!(error_of(r), (503, "acked-ahead set is full; head of queue may be stuck".into()));
    assert!(
        !s.log().contains("http server error"),
        "a refused ack is back-pressure, not a server error to log:\n{}",
        s.log()
    );
    assert_eq!(s.ack("q", &h(&m0), None), 204);
    assert_eq!(s.ack("q", &h(&msgs[1]), None), 204, "the refused ack can be retried");
    // Stale, malformed, missing.
    let (st, msg) =
        error_of(s.post(&format!("/v1/topics/q/ack?receipt_handle={}", h(&m0)), Vec::new()));
    assert_eq!((st, msg.as_str()), (410, "receipt handle no longer matches an active reservation"));
    assert_eq!(
        error_of(s.post("/v1/topics/q/ack?receipt_handle=1:2", Vec::new())),
        (400, "receipt handle is malformed".into())
    );
    assert_eq!(error_of(s.post("/v1/topics/q/ack?receipt_handle=0:0:0", Vec::new())).0, 400);
    assert_eq!(
        error_of(s.post("/v1/topics/q/ack", Vec::new())),
        (400, "receipt_handle required".into())
    );
    assert_eq!(
        error_of(s.post("/v1/topics/q/ack?receipt_handle=", Vec::new())),
        (400, "receipt_handle required".into())
    );
    assert_eq!(
        error_of(s.post("/v1/topics/q/ack?receipt_handle=0:9:1&extend=maybe", Vec::new())).0,
        400
    );
    assert_eq!(error_of(s.post("/v1/topics/gone/ack?receipt_handle=0:0:1", Vec::new())).0, 404);
    // Batch ack: per-handle results.
    let m3 = s.consume("q", "partition=0").unwrap();
    let body = json!({"receipt_handles": [h(&m3), h(&m3), "nope"]}).to_string();
    let r = s.post("/v1/topics/q/ack", body);
    assert_eq!(r.status(), 200);
    let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    let statuses: Vec<u64> =
        v["results"].as_array().unwrap().iter().map(|x| x["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, vec![204, 410, 400]);

    // Replay: read-only, no handle.
    let r = s.consume("q", "partition=0&offset=1").unwrap();
    assert_eq!((r["offset"].as_u64(), r.get("receipt_handle")), (Some(1), None));
    assert_eq!(payload_bytes(&r), b"m1");
    assert!(s.consume("q", "partition=0&offset=99").is_none(), "204 at or past the high watermark");
    assert_eq!(
        error_of(s.get("/v1/topics/q/consume?offset=1")),
        (400, "partition required for replay-mode consume".into())
    );
    // Bad parameters and missing topics.
    assert_eq!(error_of(s.get("/v1/topics/q/consume?wait=10")).0, 400);
    assert_eq!(error_of(s.get("/v1/topics/q/consume?partition=x")).0, 400);
    assert_eq!(error_of(s.get("/v1/topics/q/consume?partition=3")).0, 400);
    assert_eq!(error_of(s.get("/v1/topics/q/consume?max=101")).0, 400);
    assert_eq!(error_of(s.get("/v1/topics/missing/consume")).0, 404);
}

#[test]
fn health_metrics_and_unknown_routes() {
    let s = Server::start("health");
    let r = s.get("/healthz");
    assert_eq!((r.status().as_u16(), r.text().unwrap()), (200, "{\"status\":\"ok\"}\n".into()));
    let r = s.get("/readyz");
    assert_eq!((r.status().as_u16(), r.text().unwrap()), (200, "{\"status\":\"ready\"}\n".into()));
    s.create_topic(r#"{"name":"m"}"#);
    assert_eq!(s.produce("m", "", b"x"), 202);
    let m = s.get("/metrics").text().unwrap();
    for name in [
        "narad_ingress_wal_failed 0",
        "narad_ingress_dispatch_backlog_records",
        "narad_http_requests_total{",
        "narad_topics_total 1",
    ] {
        assert!(m.contains(name), "missing {name} in\n{m}");
    }
    let count = |name: &str| {
        metric(&m, &format!("{name} "), &[]).unwrap_or_else(|| panic!("{name} is exported:\n{m}"))
    };
    let free = count("narad_data_dir_available_bytes");
    assert!(free > 0.0, "the data dir's free space is measured, not a constant 0");
    // The 202 came after the WAL's group commit: it is counted.
    assert!(count("narad_ingress_wal_syncs_total") >= 1.0);
    assert!(count("narad_ingress_wal_records_total") >= 1.0);
    assert!(count("narad_ingress_wal_bytes_total") > 1.0);
    assert!(count("narad_ingress_wal_sync_seconds_total") > 0.0);
    // The dispatcher, keeping up, took the record from the WAL's in-memory
    // tail rather than reading back the file it had just been written to.
    let r = s.consume("m", "wait=10s").expect("the record is dispatched and consumed");
    assert_eq!(payload_bytes(&r), b"x");
    let m = s.get("/metrics").text().unwrap();
    let read = |source: &str| {
        metric(&m, "narad_ingress_wal_read_bytes_total{", &[&format!("source=\"{source}\"")])
            .unwrap_or_else(|| panic!("read bytes from {source} are exported:\n{m}"))
    };
    assert!(read("memory") > 0.0, "{m}");
    assert_eq!(read("disk"), 0.0, "{m}");
    let r = s.get("/nope");
    assert_eq!(r.status(), 404);
    assert_eq!(r.text().unwrap(), "404 page not found\n");
    let r = s.client.put(s.url("/v1/topics")).send().unwrap();
    assert_eq!(r.status(), 405);
}

/// Consumes (with `query`) and acks `n` messages of `topic`, waiting up to
/// 20 s for the dispatcher to commit them.
fn consume_and_ack(s: &Server, topic: &str, query: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut acked = 0;
    while acked < n {
        assert!(Instant::now() < deadline, "only {acked} of {n} messages of {topic} consumed");
        if let Some(m) = s.consume(topic, query) {
            assert_eq!(s.ack(topic, m["receipt_handle"].as_str().unwrap(), None), 204);
            acked += 1;
        }
    }
}

/// `/metrics` once `done` holds for it (polled for at most 30 s).
fn metrics_when(s: &Server, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = s.get("/metrics").text().unwrap();
        if done(&m) {
            return m;
        }
        assert!(Instant::now() < deadline, "the metrics never got there:\n{m}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn storage_metrics_time_every_commit_cycle_and_frontier_write() {
    let s = Server::start("storage-metrics");
    s.create_topic(r#"{"name":"sm"}"#);
    for body in [&b"one"[..], b"two", b"three"] {
        assert_eq!(s.produce("sm", "partition=1", body), 202);
    }
    // Consumed and acked: the frontier moves and is persisted (every
    // 100 ms in the background).
    consume_and_ack(&s, "sm", "partition=1&wait=1s", 3);
    let p1 = ["topic=\"sm\"", "partition=\"1\""];
    let m = metrics_when(&s, |m| {
        metric(m, "narad_storage_high_watermark_persist_duration_seconds_count{", &p1).is_some()
    });
    let get = |prefix: &str, extra: &[&str]| {
        let labels: Vec<&str> = p1.iter().chain(extra).copied().collect();
        metric(&m, prefix, &labels).unwrap_or_else(|| panic!("no {prefix} {labels:?} in\n{m}"))
    };
    let cycles = get("narad_storage_flush_duration_seconds_count{", &[]);
    assert!((1.0..=3.0).contains(&cycles), "1 to 3 commit cycles for 3 records: {cycles}");
    // One fsync histogram sample per cycle, and both take time.
    assert_eq!(get("narad_storage_fsync_duration_seconds_count{", &[]), cycles);
    assert!(get("narad_storage_fsync_duration_seconds_sum{", &[]) > 0.0);
    assert!(
        get("narad_storage_flush_duration_seconds_sum{", &[])
            >= get("narad_storage_fsync_duration_seconds_sum{", &[])
    );
    // Frames hold the payloads plus headers and envelopes.
    assert!(get("narad_storage_flush_bytes_total{", &[]) > 11.0);
    let persisted =
        get("narad_storage_high_watermark_persist_duration_seconds_count{", &["outcome=\"ok\""]);
    assert!(persisted >= 1.0);
    // Passes that found nothing moved skip the partitions; a later ack is
    // still persisted by one of the next passes.
    assert_eq!(s.produce("sm", "partition=1", b"four"), 202);
    consume_and_ack(&s, "sm", "partition=1&wait=1s", 1);
    let ok = ["topic=\"sm\"", "partition=\"1\"", "outcome=\"ok\""];
    metrics_when(&s, |m| {
        metric(m, "narad_storage_high_watermark_persist_duration_seconds_count{", &ok)
            .is_some_and(|n| n > persisted)
    });
    // Partitions that committed nothing have no series.
    let p0 = ["topic=\"sm\"", "partition=\"0\""];
    assert_eq!(metric(&m, "narad_storage_flush_duration_seconds_count{", &p0), None);
    // Deleting the topic removes its series.
    assert_eq!(s.client.delete(s.url("/v1/topics/sm")).send().unwrap().status(), 204);
    let m = s.get("/metrics").text().unwrap();
    assert_eq!(metric(&m, "narad_storage_flush_duration_seconds_count{", &p1), None, "{m}");
    assert_eq!(metric(&m, "narad_storage_flush_bytes_total{", &p1), None, "{m}");
}

#[test]
fn inventory_and_age_gauges_follow_the_data() {
    let s = Server::start("inventory-metrics");
    s.create_topic(r#"{"name":"inv","partitions":3}"#);
    for body in [&b"one"[..], b"two", b"three"] {
        assert_eq!(s.produce("inv", "partition=1", body), 202);
    }
    let p1 = ["topic=\"inv\"", "partition=\"1\""];
    // The per-partition gauges come from a 5 s poller: wait for a poll that
    // saw all three records committed and had walked the data dir (a scrape
    // can land between the two within the first poll: the walk comes last).
    let m = metrics_when(&s, |m| {
        metric(m, "narad_consumer_lag_messages{", &p1) == Some(3.0)
            && metric(m, "narad_data_dir_size_bytes ", &[]).is_some_and(|d| d > 0.0)
    });
    assert_eq!(metric(&m, "narad_topics_total ", &[]), Some(1.0), "{m}");
    assert_eq!(metric(&m, "narad_partitions_total ", &[]), Some(3.0), "{m}");
    assert!(metric(&m, "narad_boot_duration_seconds ", &[]).is_some_and(|b| b > 0.0), "{m}");
    let topic = metric(&m, "narad_topic_bytes{", &["topic=\"inv\""]).unwrap();
    let part = metric(&m, "narad_partition_size_bytes{", &p1).unwrap();
    assert!(topic >= part && part > 11.0, "{m}");
    let dir = metric(&m, "narad_data_dir_size_bytes ", &[]).unwrap();
    assert!(dir > topic, "the data dir holds the logs, the WAL and the metastore: {m}");
    let age = metric(&m, "narad_oldest_unconsumed_message_age_seconds{", &p1).unwrap();
    assert!((0.0..30.0).contains(&age), "{m}");
    // Consumed and acked: nothing is unconsumed, so the age is 0.
    consume_and_ack(&s, "inv", "partition=1&wait=5s", 3);
    let m = metrics_when(&s, |m| metric(m, "narad_consumer_lag_messages{", &p1) == Some(0.0));
    assert_eq!(metric(&m, "narad_oldest_unconsumed_message_age_seconds{", &p1), Some(0.0), "{m}");
}

#[test]
fn http_metrics_count_each_route_method_and_status() {
    let s = Server::start("http-metrics");
    s.create_topic(r#"{"name":"hm"}"#);
    for body in [&b"abc"[..], b"de", b"fghij"] {
        assert_eq!(s.produce("hm", "", body), 202);
    }
    assert_eq!(s.produce("missing", "", b"zz"), 404);
    assert_eq!(s.get("/nope").status(), 404);
    let m = s.get("/metrics").text().unwrap();
    let value = |series: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {series} in\n{m}"))
            .parse()
            .unwrap()
    };
    let produce = r#"route="POST /v1/topics/{topic}/produce",method="POST""#;
    assert_eq!(value(&format!("narad_http_requests_total{{{produce},status=\"202\"}}")), 3.0);
    assert_eq!(value(&format!("narad_http_requests_total{{{produce},status=\"404\"}}")), 1.0);
    assert_eq!(
        value(&format!("narad_http_request_duration_seconds_count{{{produce},status=\"202\"}}")),
        3.0
    );
    // 3 + 2 + 5 bytes accepted, 2 refused: all read off the wire.
    assert_eq!(
        value(r#"narad_http_request_bytes_in_total{route="POST /v1/topics/{topic}/produce"}"#),
        12.0
    );
    assert_eq!(
        value(r#"narad_http_requests_total{route="GET unmatched",method="GET",status="404"}"#),
        1.0
    );
    assert!(value("narad_http_requests_in_flight") >= 1.0, "the scrape itself is in flight");
}

/// A batch consume answers at most 8 MiB *as sent*: binary payloads go out
/// as base64 (4/3 of their size), so twelve 1 MiB binary records may not
/// all fit even though eight raw MiB would. What does not fit is given back
/// at once (nacked), not left leased until the visibility timeout.
#[test]
fn batch_consume_answers_stay_within_8_mib_encoded_and_the_rest_stays_available() {
    let s = Server::start("batch-encoded-budget");
    s.create_topic(r#"{"name":"big","partitions":3}"#);
    const MIB: usize = 1 << 20;
    for i in 0..12u8 {
        // 0xFF is never valid UTF-8: the payload is sent as base64.
        let mut body = vec![0xFF; MIB];
        body[0] = i;
        assert_eq!(s.produce("big", "", &body), 202, "record {i}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = std::collections::BTreeSet::new();
    let mut answers = 0;
    while seen.len() < 12 {
        assert!(Instant::now() < deadline, "only {seen:?} delivered");
        let r = s.get("/v1/topics/big/consume?max=12&wait=1s");
        if r.status() == 204 {
            continue;
        }
        assert_eq!(r.status(), 200);
        let body = r.bytes().unwrap();
        assert!(body.len() <= 8 * MIB, "an answer of {} bytes (> 8 MiB)", body.len());
        answers += 1;
        let v: Value = serde_json::from_slice(&body).unwrap();
        for m in v["messages"].as_array().unwrap() {
            let p = payload_bytes(m);
            assert_eq!(p.len(), MIB);
            seen.insert(p[0]);
            assert_eq!(s.ack("big", m["receipt_handle"].as_str().unwrap(), None), 204);
        }
    }
    assert!(answers >= 2, "twelve base64 MiB cannot fit one answer");
}

/// Consume's parameters: `max` (a queue-mode batch) does not combine with
/// `offset` (a replay reads one record, without a lease); `offset` needs a
/// `partition`; `max` is 1 to 100; a repeated parameter takes its first
/// value (Narad's `url.Values.Get`), so a later one cannot sneak past the
/// checks. Nothing is leased by a refused consume.
#[test]
fn consume_parameters_that_do_not_combine_are_refused_with_a_400_naming_them() {
    let s = Server::start("consume-params");
    s.create_topic(r#"{"name":"q","partitions":3}"#);
    assert_eq!(s.produce("q", "partition=0", b"m0"), 202);
    // Wait until it is committed (visible to replay).
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.consume("q", "partition=0&offset=0").is_none() {
        assert!(Instant::now() < deadline, "never committed");
        std::thread::sleep(Duration::from_millis(20));
    }
    for q in
        ["partition=0&offset=0&max=5", "max=1&partition=0&offset=0", "offset=0&partition=0&max=100"]
    {
        let (status, error) = error_of(s.get(&format!("/v1/topics/q/consume?{q}")));
        assert_eq!(status, 400, "{q}");
        assert!(error.contains("max") && error.contains("offset"), "{q}: {error}");
    }
    assert_eq!(
        error_of(s.get("/v1/topics/q/consume?offset=0&max=5")),
        (400, "partition required for replay-mode consume".into())
    );
    for q in ["max=0", "max=101", "max=-1", "max=x", "max=", "max=0&max=5"] {
        let (status, error) = error_of(s.get(&format!("/v1/topics/q/consume?{q}")));
        assert_eq!(status, 400, "{q}");
        assert!(error.starts_with("invalid max"), "{q}: {error}");
    }
    // First occurrence wins: the second `offset` or `max` is not read.
    let r = s.consume("q", "partition=0&offset=0&offset=7").unwrap();
    assert_eq!(r["offset"], 0);
    assert_eq!(error_of(s.get("/v1/topics/q/consume?max=101&max=5")).0, 400);
    // The refusals leased nothing: a queue consume still gets the message.
    let m = s.consume("q", "partition=0").expect("still available");
    assert_eq!(payload_bytes(&m), b"m0");
}

/// A single node (no peers) is a cluster of one: it lists itself as the
/// only alive member owning every partition, leads at term 0 with its
/// metastore's applied index, and every partition is `ok` on it.
#[test]
fn a_single_node_is_its_own_member_leader_and_partition_owner() {
    let s = Server::start_opts("cluster-single", Opts::dev().args(&["--node-id", "solo"]));
    let json = |path: &str| -> Value {
        let r = s.get(path);
        assert_eq!(r.status(), 200, "{path}");
        serde_json::from_str(&r.text().unwrap()).unwrap()
    };
    let before = json("/v1/cluster/status");
    s.create_topic(r#"{"name":"a","partitions":4}"#);
    s.create_topic(r#"{"name":"b"}"#);
    let m = json("/v1/cluster/members");
    let want = serde_json::json!({"members": [{
        "id": "solo", "addr": format!("127.0.0.1:{}", s.port), "status": "alive",
        "draining": false, "owned_partitions": 7, "outbound_moves": 0,
    }]});
    assert_eq!(m, want);
    let st = json("/v1/cluster/status");
    assert_eq!(st["node_id"], "solo");
    assert_eq!(st["mode"], "single");
    assert_eq!(st["role"], "leader");
    assert_eq!(st["leader"], "solo");
    assert_eq!(st["term"], 0);
    assert_eq!(st["voters"], serde_json::json!(["solo"]));
    assert_eq!(st["learners"], serde_json::json!([]));
    let applied = st["applied_index"].as_u64().unwrap();
    assert!(applied >= before["applied_index"].as_u64().unwrap() + 4, "create + assign, twice");
    assert_eq!(st["commit_index"], applied);
    let d = json("/v1/topics/a");
    for p in d["partition_stats"].as_array().unwrap() {
        assert_eq!(p["owner_node"], "solo", "{p}");
        assert_eq!(p["status"], "ok", "{p}");
        assert_eq!(p["owner_liveness"], "alive", "{p}");
    }
    assert_eq!(s.client.post(s.url("/v1/cluster/status")).send().unwrap().status(), 405);
}
