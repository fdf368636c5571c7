//! Black-box tests of a control plane that stops (issue 35): real `narad
//! serve` processes on loopback. A node whose Raft storage fails (a full
//! disk) must not pass for a working one: not ready, writes refused with
//! 503 (never a 201 it cannot read back), its status says `stopped`, and
//! once the disk takes writes again it stops for its supervisor, restarts
//! and catches up. The failure is the test hook
//! `NARAD_TEST_FAIL_RAFT_STORAGE_WHILE`: the node's own writes under
//! `<data>/metastore/` fail in its file layer (the real write path of the
//! Raft log and state machine) while a file exists. Each test bounded in
//! time; the harness kills its processes and removes its directories
//! however the test ends.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, ClusterOpts, wait_for};
use reqwest::Method;
use serde_json::json;

/// A scratch directory removed however the test ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// POST a topic through node `i`; its status and body (status 0: no
/// answer).
fn create_topic(c: &Cluster, i: usize, name: &str) -> (u16, String) {
    match c
        .request(i, Method::POST, "/v1/topics")
        .body(json!({"name": name, "partitions": 3}).to_string())
        .send()
    {
        Ok(r) => (r.status().as_u16(), r.text().unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

/// Creates `name` through node `i`, retrying while the control plane is
/// between leaders (503), until 201 (or 409: a retry of one that landed).
fn create_until_ok(c: &Cluster, i: usize, name: &str) {
    let last = std::cell::RefCell::new((0, String::new()));
    wait_for(
        Duration::from_secs(20),
        &format!("create {name} through {}", c.node(i).id),
        || {
            let answer = create_topic(c, i, name);
            let ok = matches!(answer.0, 201 | 409);
            *last.borrow_mut() = answer;
            ok.then_some(())
        },
        || format!("last answer {:?}\n{}", last.borrow(), c.describe()),
    );
}

/// Names of every topic node `i` lists.
fn topic_names(c: &Cluster, i: usize) -> Option<BTreeSet<String>> {
    let (st, v) = c.get_json(i, "/v1/topics?limit=1000")?;
    (st == 200).then(|| {
        v["topics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    })
}

/// A label-less metric of node `i`.
fn metric(c: &Cluster, i: usize, name: &str) -> Option<f64> {
    let body = c.request(i, Method::GET, "/metrics").send().ok()?.text().ok()?;
    body.lines().find_map(|l| l.strip_prefix(&format!("{name} "))?.trim().parse().ok())
}

#[test]
fn a_node_whose_raft_storage_fails_turns_unready_refuses_writes_then_restarts_and_catches_up() {
    let scratch = Scratch(common::temp_dir("raftfault"));
    let trigger = scratch.0.join("fail-raft-storage");
    let failing = 2;
    let opts = ClusterOpts::dev().node_env(
        failing,
        "NARAD_TEST_FAIL_RAFT_STORAGE_WHILE",
        trigger.to_str().unwrap(),
    );
    let mut c = Cluster::start(3, opts);
    let entry = 0;
    create_until_ok(&c, entry, "before");
    wait_for(
        Duration::from_secs(20),
        "every node lists the first topic",
        || (0..3).all(|i| topic_names(&c, i).is_some_and(|t| t.contains("before"))).then_some(()),
        || c.describe(),
    );
    assert_eq!(metric(&c, failing, "narad_raft_stopped"), Some(0.0));

    // The disk under n3's Raft log refuses writes: the next entry it must
    // store (another create, or any heartbeat) stops its Raft core.
    std::fs::write(&trigger, b"").unwrap();
    let failed_at = Instant::now();
    for k in 0..3 {
        create_until_ok(&c, entry, &format!("during-{k}"));
    }
    let why = wait_for(
        Duration::from_secs(30),
        "the node with the failed disk answers /readyz 503 naming the control plane",
        || {
            let (st, v) = c.get_json(failing, "/readyz")?;
            let why = v["error"].as_str()?.to_owned();
            (st == 503 && why.contains("control plane stopped")).then_some(why)
        },
        || c.describe(),
    );
    eprintln!("unready {:?} after the disk failed: {why}", failed_at.elapsed());
    let status = c.status(failing).expect("status answers");
    assert_eq!(status["role"], "stopped", "{status}");
    assert!(status["stopped"].as_str().is_some_and(|s| !s.is_empty()), "{status}");
    assert_eq!(metric(&c, failing, "narad_raft_stopped"), Some(1.0));

    // A write through it: 503, never a 201 it could not read back.
    for k in 0..3 {
        let (st, body) = create_topic(&c, failing, &format!("through-stopped-{k}"));
        assert_eq!(st, 503, "a create through a stopped control plane: {body}");
    }
    // The others carry on.
    create_until_ok(&c, entry, "after");

    // The disk recovers: the node stops by itself (for its supervisor) ...
    std::fs::remove_file(&trigger).unwrap();
    let recovered_at = Instant::now();
    let exit = c.wait_exit(failing, Duration::from_secs(40));
    eprintln!("exited {:?} after the disk recovered: {exit}", recovered_at.elapsed());
    assert!(!exit.success(), "a stop for a restart is not a clean exit: {exit}");
    assert!(c.node(failing).log().contains("restart required"), "{}", c.node(failing).log_tail());

    // ... and, started again (as its supervisor would), lists what the
    // others list.
    c.restart(failing);
    c.wait_ready(failing, Duration::from_secs(60));
    let want = topic_names(&c, entry).unwrap();
    assert!(want.contains("after") && !want.iter().any(|t| t.starts_with("through-stopped")));
    wait_for(
        Duration::from_secs(20),
        "the restarted node lists every topic the others list",
        || (topic_names(&c, failing).as_ref() == Some(&want)).then_some(()),
        || format!("{:?}\n{}", topic_names(&c, failing), c.describe()),
    );
    let status = c.status(failing).unwrap();
    assert!(status["stopped"].is_null(), "{status}");
    assert_eq!(metric(&c, failing, "narad_raft_stopped"), Some(0.0));
}
