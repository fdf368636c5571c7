//! `narad bench produce|consume|flow` and `narad-http-ceiling`, run as a
//! user would, on counts (never on timings): every message is accounted for
//! and the JSON report has its figures.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Server;
use serde_json::Value;

fn bench(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_narad"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .stdin(Stdio::null())
        .output()
        .expect("run narad bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "narad bench {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn n(v: &Value, field: &str) -> f64 {
    v[field].as_f64().unwrap_or_else(|| panic!("no {field} in {v}"))
}

#[test]
fn produce_single_and_batch_count_every_message_and_create_the_topic() {
    let s = Server::start("bench-produce");
    let single = bench(&[
        "produce",
        "--url",
        &s.base,
        "--topic",
        "b1",
        "--partitions",
        "4",
        "--count",
        "150",
        "-c",
        "4",
        "--keys",
        "uniform",
    ]);
    assert_eq!(n(&single, "messages"), 150.0);
    assert_eq!(n(&single, "errors"), 0.0);
    for f in ["msgs_per_sec", "mb_per_sec", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"] {
        assert!(n(&single, f) >= 0.0, "{f}");
    }
    let topic: Value = serde_json::from_str(&s.get("/v1/topics/b1").text().unwrap()).unwrap();
    assert_eq!(topic["partitions"], 4);
    // 250 = 2 full batches of 100 and one of 50; hot keys.
    let batch = bench(&[
        "produce", "--url", &s.base, "--topic", "b1", "--count", "250", "-c", "2", "--batch",
        "100", "--keys", "hot",
    ]);
    assert_eq!(n(&batch, "messages"), 250.0);
    assert_eq!(n(&batch, "requests"), 3.0);
    let got = s.drain("b1");
    assert_eq!(got.len(), 400);
    // A single produce stores the 1,024 raw bytes; a batch record stores
    // its JSON string as written (1,024 bytes with the quotes), which a
    // consumer reads back as a 1,022-character string.
    assert_eq!(got.iter().filter(|p| p.len() == 1024).count(), 150);
    assert_eq!(got.iter().filter(|p| p.len() == 1022).count(), 250);
}

#[test]
fn consume_acks_a_prefilled_topic_to_the_last_message() {
    let s = Server::start("bench-consume");
    for batch in ["1", "50"] {
        let topic = format!("c{batch}");
        let r = bench(&[
            "consume",
            "--url",
            &s.base,
            "--topic",
            &topic,
            "--prefill",
            "300",
            "--batch",
            batch,
            "-c",
            "3",
            "--message-bytes",
            "200",
        ]);
        assert_eq!(n(&r, "prefill_messages"), 300.0);
        assert_eq!(n(&r, "messages"), 300.0, "{r}");
        assert_eq!(n(&r, "errors"), 0.0);
        assert!(n(&r, "ack_p50_ms") >= 0.0);
        assert!(s.consume(&topic, "wait=0s").is_none(), "everything was acked");
    }
}

#[test]
fn flow_delivers_what_it_produced_and_measures_produce_to_consume_latency() {
    let s = Server::start("bench-flow");
    let r = bench(&[
        "flow",
        "--url",
        &s.base,
        "--topic",
        "f",
        "--count",
        "200",
        "-c",
        "2",
        "--consumers",
        "2",
        "--consume-batch",
        "10",
    ]);
    assert_eq!(n(&r, "produce_messages"), 200.0);
    assert_eq!(n(&r, "consume_messages"), 200.0);
    assert_eq!(n(&r, "e2e_samples"), 200.0, "every delivered payload carried its stamp");
    assert!(n(&r, "e2e_p50_ms") <= n(&r, "e2e_max_ms"));
    assert_eq!(n(&r, "produce_errors") + n(&r, "consume_errors"), 0.0);
}

#[test]
fn the_http_ceiling_answers_202_to_the_same_load_generator() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_narad-http-ceiling"))
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "narad-http-ceiling did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = format!("http://127.0.0.1:{port}");
    let r = bench(&[
        "produce",
        "--url",
        &url,
        "--count",
        "100",
        "-c",
        "4",
        "--user",
        "u",
        "--password",
        "p",
    ]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(n(&r, "messages"), 100.0);
    assert_eq!(n(&r, "errors"), 0.0);
}

#[test]
fn a_pinned_produce_puts_every_message_into_that_partition() {
    let s = Server::start("bench-pinned");
    for batch in ["1", "10"] {
        let r = bench(&[
            "produce",
            "--url",
            &s.base,
            "--topic",
            "pin",
            "--partitions",
            "3",
            "--partition",
            "2",
            "--count",
            "30",
            "-c",
            "2",
            "--batch",
            batch,
        ]);
        assert_eq!(n(&r, "messages"), 30.0);
        assert_eq!(n(&r, "errors"), 0.0);
    }
    let wanted = [0, 0, 60];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let topic: Value = serde_json::from_str(&s.get("/v1/topics/pin").text().unwrap()).unwrap();
        let next: Vec<u64> = topic["partition_stats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["next_offset"].as_u64().unwrap())
            .collect();
        if next == wanted {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "next offsets by partition: {next:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn bad_options_fail_before_any_load() {
    for args in [
        &["produce", "--batch", "0"][..],
        &["produce", "--batch", "1001"],
        &["consume", "--batch", "101"],
        &["produce", "--topic", "no spaces"],
        &["produce", "--url", "https://127.0.0.1:1"],
        &["produce", "--user", "u"],
        &["produce", "--partition", "8"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_narad"))
            .arg("bench")
            .args(args)
            .args(["--url", "http://127.0.0.1:1"].iter().filter(|_| !args.contains(&"--url")))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
}

#[test]
fn bench_takes_the_common_connection_flags_and_the_servers_partition_default() {
    let s = Server::start_secure("bench-flags");
    let host_port = s.base.trim_start_matches("http://").to_owned();
    let cfg = common::temp_dir("bench-flags-cfg");
    // -s (host:port, no scheme), -u/-p and -o json, as every client command.
    let out = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["bench", "produce", "-s", &host_port, "-u", "admin", "-p", common::ADMIN_PASSWORD])
        .args(["--topic", "flags", "--count", "30", "-c", "2", "-o", "json"])
        .env_remove("NARAD_ADDR")
        .env_remove("NARAD_URL")
        .env("NARAD_CONFIG_DIR", &cfg)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!((n(&v, "messages"), n(&v, "errors")), (30.0, 0.0), "{v}");
    let topic = s.as_admin(reqwest::Method::GET, "/v1/topics/flags").send().unwrap();
    let topic: Value = serde_json::from_str(&topic.text().unwrap()).unwrap();
    assert_eq!(topic["partitions"], 3, "the server's default partition count");
    // The older names still work: NARAD_URL, and NARAD_USER/NARAD_PASSWORD.
    let out = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["bench", "produce", "--topic", "flags", "--count", "10", "-c", "1", "--json"])
        .env_remove("NARAD_ADDR")
        .env("NARAD_URL", &s.base)
        .env("NARAD_USER", "admin")
        .env("NARAD_PASSWORD", common::ADMIN_PASSWORD)
        .env("NARAD_CONFIG_DIR", &cfg)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(n(&v, "messages"), 10.0, "{v}");
    assert!(
        out.stderr.is_empty(),
        "nothing on stderr off a terminal (no progress line): {:?}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&cfg);
}
