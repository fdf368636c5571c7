//! The cluster harness itself (`common/cluster.rs`), on a one-node
//! "cluster" (the peer list names only the node itself): start, members
//! and status routes, leader lookup, SIGSTOP/SIGCONT, kill -9 and restart
//! on the same ports and data directory, cleanup.

mod common;

use std::time::Duration;

use common::cluster::{Cluster, ClusterOpts};
use reqwest::Method;
use serde_json::Value;

fn members(c: &Cluster, i: usize) -> Vec<Value> {
    let (status, v) = c.get_json(i, "/v1/cluster/members").expect("members answer");
    assert_eq!(status, 200, "{v}");
    v["members"].as_array().unwrap().clone()
}

#[test]
fn a_one_node_cluster_lists_itself_survives_pause_and_kill_and_is_cleaned_up() {
    let mut c = Cluster::start(1, ClusterOpts::dev());
    let n1 = c.node(0);
    assert_eq!(n1.id, "n1");
    assert_eq!(c.peers(), format!("n1@127.0.0.1:{}", n1.cluster_port));
    let r = c.request(0, Method::POST, "/v1/topics").body(r#"{"name":"t"}"#).send().unwrap();
    assert_eq!(r.status(), 201);

    let m = members(&c, 0);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(m[0]["id"], "n1");
    assert_eq!(m[0]["addr"], format!("127.0.0.1:{}", n1.http_port));
    assert_eq!(m[0]["status"], "alive");
    assert_eq!(m[0]["draining"], false);
    assert_eq!(m[0]["owned_partitions"], 3, "the topic's 3 partitions");
    assert_eq!(m[0]["outbound_moves"], 0);
    assert_eq!(c.leader(Duration::from_secs(10)), 0);
    let s = c.status(0).unwrap();
    assert_eq!((&s["node_id"], &s["leader"]), (&Value::from("n1"), &Value::from("n1")), "{s}");

    c.stop(0);
    assert!(c.status(0).is_none(), "a paused node answers nothing");
    c.cont(0);
    assert_eq!(c.leader(Duration::from_secs(10)), 0);

    let pid = c.node(0).pid().unwrap();
    c.kill9(0);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "killed and reaped");
    c.restart(0);
    c.wait_ready(0, Duration::from_secs(30));
    assert_eq!(members(&c, 0)[0]["owned_partitions"], 3, "same data directory");
    let root = c.root().clone();
    let pid = c.node(0).pid().unwrap();
    drop(c);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "Drop killed the node");
    assert!(!root.exists(), "Drop removed the directories");
}
