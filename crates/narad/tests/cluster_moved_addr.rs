//! Black-box test (issue 35): a node restarted on a new cluster address
//! while the other nodes' peers still name its old one. Bounded in time;
//! the harness kills its processes and removes its directories however the
//! test ends.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{Cluster, ClusterOpts, wait_for};
use reqwest::Method;
use serde_json::json;

/// Fails on this branch (06:34 UTC run): the moved n3 is not ready within
/// 30 s, its log says "no contact with the raft leader n2 within 5s" and a
/// dial of 127.0.0.1:<port> gets "no handshake within 1s". The suspected
/// bug (Raft peer addresses never follow cluster.peers/membership) is not
/// fixed yet; ignored until it is.
#[test]
#[ignore = "issue 35: a node moved to a new cluster port does not rejoin (not fixed yet)"]
fn a_node_restarted_on_a_new_cluster_port_rejoins() {
    let mut c = Cluster::start(3, ClusterOpts::dev());
    c.leader(Duration::from_secs(15));
    c.wait_all_alive(Duration::from_secs(20));
    c.kill9(2);
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    c.move_cluster_port(2, port);
    c.restart(2);
    let t = Instant::now();
    c.wait_ready(2, Duration::from_secs(30));
    c.wait_all_alive(Duration::from_secs(20));
    eprintln!("n3 alive on its new port {:?} after its restart", t.elapsed());
    let r = c
        .request(0, Method::POST, "/v1/topics")
        .body(json!({"name": "mv", "partitions": 3}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
    wait_for(
        Duration::from_secs(15),
        "the topic created through n1 is visible through the moved n3",
        || c.get_json(2, "/v1/topics/mv").filter(|(st, _)| *st == 200).map(|_| ()),
        || c.describe(),
    );
    let owners = c.wait_placed("mv");
    let msgs: Vec<_> =
        (0..30).map(|i| json!({"key": format!("k{i}"), "payload": {"i": i}})).collect();
    let r = c
        .request(0, Method::POST, "/v1/topics/mv/produce/batch")
        .body(json!({"messages": msgs}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap_or_default());
    wait_for(
        Duration::from_secs(15),
        "the 30 records are committed, n3's partitions included, as n1 sees them",
        || {
            let (st, v) = c.get_json(0, "/v1/topics/mv")?;
            let sum: u64 = v["partition_stats"]
                .as_array()?
                .iter()
                .map(|s| s["high_watermark"].as_u64())
                .sum::<Option<u64>>()?;
            (st == 200 && v["partial"] != true && sum == 30).then_some(())
        },
        || format!("owners {owners:?}\n{}", c.describe()),
    );
    eprintln!("all checks passed {:?} after n3's restart", t.elapsed());
}
