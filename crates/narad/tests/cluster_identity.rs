//! Black-box tests of what operators do to a node's identity and data
//! directory (issue 35), each following docs/CLUSTER.md "What to do"
//! literally, on real `narad serve` processes on loopback: a single node
//! upgraded to a cluster's first member, a node started under another id,
//! a node wiped and restarted under its old id, a cluster node started
//! without peers. Each test is bounded in time; the harness kills its
//! processes and removes its directories however the test ends.

mod common;

use std::time::Duration;

use common::cluster::{Cluster, ClusterOpts, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

const START: Duration = Duration::from_secs(30);

fn post(c: &Cluster, i: usize, path: &str, body: Value) -> (u16, String) {
    let r = c.request(i, Method::POST, path).body(body.to_string()).send().unwrap();
    (r.status().as_u16(), r.text().unwrap_or_default())
}

fn create_topic(c: &Cluster, i: usize, name: &str, partitions: u32) {
    let body = json!({"name": name, "partitions": partitions, "visibility_timeout_ms": 30_000});
    let (status, text) = post(c, i, "/v1/topics", body);
    assert_eq!(status, 201, "create {name} through node {i}: {text}");
}

fn produce(c: &Cluster, i: usize, topic: &str, key: &str, payload: &str) {
    let body = json!({"key": key, "payload": payload});
    let (status, text) = post(c, i, &format!("/v1/topics/{topic}/produce"), body);
    assert_eq!(status, 202, "produce to {topic} through node {i}: {text}");
}

/// Every record of every partition of `topic`, read back (replay, one
/// offset at a time from 0, nothing leased) through node `i`: sorted
/// payloads, or `None` while some read does not answer 200/204.
fn replay_all(c: &Cluster, i: usize, topic: &str, partitions: u32) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for p in 0..partitions {
        for offset in 0.. {
            let path = format!("/v1/topics/{topic}/consume?partition={p}&offset={offset}");
            let r = c.request(i, Method::GET, &path).send().ok()?;
            match r.status().as_u16() {
                204 => break,
                200 => {
                    let v: Value = serde_json::from_str(&r.text().ok()?).ok()?;
                    out.push(v["payload"]["payload"].as_str()?.to_owned());
                }
                _ => return None,
            }
        }
    }
    out.sort();
    Some(out)
}

/// Node `i`'s metadata as HTTP shows it: every topic (its JSON without
/// the live figures, with each partition's owner and next offset as the
/// owner reports it), every user with its
/// grants (no secrets), every topic's children. `None` while a read fails.
fn metadata(c: &Cluster, i: usize) -> Option<Value> {
    let (status, list) = c.get_json(i, "/v1/topics?limit=1000")?;
    (status == 200).then_some(())?;
    let mut names: Vec<String> = list["topics"]
        .as_array()?
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    let mut topics = serde_json::Map::new();
    for name in names {
        let (status, mut t) = c.get_json(i, &format!("/v1/topics/{name}"))?;
        (status == 200).then_some(())?;
        let owners: Vec<Value> = t["partition_stats"]
            .as_array()?
            .iter()
            .map(|p| json!([p["index"].clone(), p["owner_node"].clone(), p["next_offset"].clone()]))
            .collect();
        let obj = t.as_object_mut()?;
        obj.remove("partition_stats");
        obj.remove("partial");
        obj.insert("owners".into(), Value::Array(owners));
        let (status, children) = c.get_json(i, &format!("/v1/topics/{name}/children"))?;
        (status == 200).then_some(())?;
        obj.insert("children_listed".into(), children);
        topics.insert(name, t);
    }
    let (status, users) = c.get_json(i, "/v1/users")?;
    (status == 200).then_some(())?;
    Some(json!({"topics": topics, "users": users}))
}

/// Proven case 1 (issue 35), docs/CLUSTER.md "Upgrade a single node to a
/// cluster": a single node holding topics (with partitions), a user with
/// grants, a fan-out child and records restarts as n1 with peers and
/// `NARAD_CLUSTER_INITIAL_MEMBERS=n1`; n2 and n3 start empty and join.
/// Every node ends with the same metadata, every record is readable
/// through every node (so every node resolves the same incarnation: a
/// commit of another incarnation is refused), and creating an existing
/// topic through a joiner is 409 and changes nothing.
#[test]
fn an_upgraded_single_node_brings_its_state_to_every_joiner() {
    let mut c = Cluster::prepare(3, ClusterOpts::dev().initial_members(&["n1"]));
    // Before: one node, alone.
    c.spawn_single(0, Some("n1"));
    c.wait_ready(0, START);
    create_topic(&c, 0, "old", 3);
    create_topic(&c, 0, "parent", 3);
    create_topic(&c, 0, "kid", 3);
    let (status, text) =
        post(&c, 0, "/v1/topics/parent/children", json!({"child": "kid", "delay_ms": 0}));
    assert_eq!(status, 200, "attach: {text}");
    let grants = json!([{"action": "produce", "patterns": ["old"]}, {"action": "consume", "patterns": ["p*"]}]);
    let (status, text) = post(
        &c,
        0,
        "/v1/users",
        json!({"username": "alice", "password": "alice-pw-123", "grants": grants}),
    );
    assert_eq!(status, 201, "create user: {text}");
    for k in 0..6 {
        produce(&c, 0, "old", &format!("k{k}"), &format!("old-{k}"));
    }
    for k in 0..4 {
        produce(&c, 0, "parent", &format!("k{k}"), &format!("fan-{k}"));
    }
    let expected_old: Vec<String> = (0..6).map(|k| format!("old-{k}")).collect();
    let expected_fan: Vec<String> = (0..4).map(|k| format!("fan-{k}")).collect();
    wait_for(
        Duration::from_secs(20),
        "the single node copied the parent's records to its child",
        || (replay_all(&c, 0, "kid", 3)? == expected_fan).then_some(()),
        || c.node(0).log_tail(),
    );
    let before = metadata(&c, 0).expect("the single node's metadata");
    assert_eq!(c.terminate(0).code(), Some(0));

    // The upgrade: n1 on the same data directory with its peers, bootstrapping
    // alone; n2 and n3 start empty and join.
    c.restart(0);
    c.wait_ready(0, START);
    c.spawn(1);
    c.spawn(2);
    c.wait_ready(1, START);
    c.wait_ready(2, START);

    for i in 0..3 {
        let got = wait_for(
            Duration::from_secs(30),
            &format!("n{} holds the upgraded node's metadata", i + 1),
            || metadata(&c, i).filter(|m| m == &before),
            || format!("expected {before}\nn{} has {:?}\n{}", i + 1, metadata(&c, i), c.describe()),
        );
        assert_eq!(got, before);
        for (topic, partitions, expected) in
            [("old", 3, &expected_old), ("parent", 3, &expected_fan), ("kid", 3, &expected_fan)]
        {
            wait_for(
                Duration::from_secs(20),
                &format!("every record of {topic} readable through n{}", i + 1),
                || {
                    (replay_all(&c, i, topic, partitions)?.as_slice() == expected.as_slice())
                        .then_some(())
                },
                || format!("{:?}\n{}", replay_all(&c, i, topic, partitions), c.describe()),
            );
        }
    }

    // The same topic created through a joiner: 409, nothing changes.
    let (status, text) = post(&c, 1, "/v1/topics", json!({"name": "old", "partitions": 4}));
    assert_eq!(status, 409, "{text}");
    for i in 0..3 {
        assert_eq!(metadata(&c, i).as_ref(), Some(&before), "n{} after the refused create", i + 1);
    }
    // A record produced through each joiner lands (same incarnation on
    // every node: the owner would refuse another's).
    produce(&c, 1, "old", "k0", "new-from-n2");
    produce(&c, 2, "old", "k1", "new-from-n3");
    let mut all = expected_old.clone();
    all.extend(["new-from-n2".to_owned(), "new-from-n3".to_owned()]);
    all.sort();
    wait_for(
        Duration::from_secs(20),
        "records produced through the joiners are committed",
        || (replay_all(&c, 0, "old", 3)? == all).then_some(()),
        || format!("{:?}\n{}", replay_all(&c, 0, "old", 3), c.describe()),
    );
}

/// Proven case 2 (issue 35), docs/CLUSTER.md "Rename a node": a single
/// node started without `--node-id` gets a generated id, recorded in its
/// data directory and printed; a start with `--node-id n1` on that
/// directory is refused with a message naming the id to use; a start
/// without an id keeps the recorded one, and its records.
#[test]
fn a_node_keeps_its_recorded_id_and_a_start_under_another_is_refused() {
    let mut c = Cluster::prepare(1, ClusterOpts::dev());
    c.spawn_single(0, None);
    c.wait_ready(0, START);
    let id = c.status(0).expect("status")["node_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("node-"), "a generated id, not the host name: {id}");
    assert!(c.node(0).log().contains(&id), "the id is printed at start");
    create_topic(&c, 0, "t", 3);
    for k in 0..6 {
        produce(&c, 0, "t", &format!("k{k}"), &format!("r{k}"));
    }
    let expected: Vec<String> = (0..6).map(|k| format!("r{k}")).collect();
    wait_for(
        Duration::from_secs(10),
        "records committed",
        || (replay_all(&c, 0, "t", 3)? == expected).then_some(()),
        || c.node(0).log_tail(),
    );
    assert_eq!(c.terminate(0).code(), Some(0));

    c.spawn_single(0, Some("n1"));
    let status = c.wait_exit(0, START);
    assert!(!status.success(), "a start under another id must be refused");
    let log = c.node(0).log();
    assert!(
        log.contains(&format!("belongs to node \"{id}\""))
            && log.contains(&format!("--node-id {id}")),
        "the refusal names the recorded id and how to start: {}",
        c.node(0).log_tail()
    );

    c.spawn_single(0, None);
    c.wait_ready(0, START);
    assert_eq!(c.status(0).expect("status")["node_id"].as_str(), Some(id.as_str()));
    assert_eq!(replay_all(&c, 0, "t", 3), Some(expected.clone()));
    // Every partition is still owned by this node.
    let (_, t) = c.get_json(0, "/v1/topics/t").expect("topic");
    let owners: Vec<&str> = t["partition_stats"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["owner_node"].as_str())
        .collect();
    assert_eq!(owners, [id.as_str(); 3], "{t}");
}

/// Proven case 5 (issue 35), docs/CLUSTER.md "A node started without its
/// peers": a cluster member's data directory refuses a start without peers
/// (it would keep records meant for other owners); with its peers it
/// starts again.
#[test]
fn a_cluster_member_refuses_to_start_without_peers() {
    let mut c = Cluster::start(3, ClusterOpts::dev());
    c.wait_all_alive(Duration::from_secs(20));
    create_topic(&c, 0, "t", 3);
    c.wait_placed("t");
    assert_eq!(c.terminate(2).code(), Some(0));

    c.spawn_single(2, Some("n3"));
    let status = c.wait_exit(2, START);
    assert!(!status.success(), "a cluster member alone must be refused");
    let log = c.node(2).log();
    assert!(
        log.contains("belongs to a cluster member") && log.contains("--peers"),
        "the refusal says to start it with its peers: {}",
        c.node(2).log_tail()
    );
    c.restart(2);
    c.wait_ready(2, START);
    c.wait_all_alive(Duration::from_secs(20));
}

/// Kills node `victim` (-9), wipes its data directory, restarts it under
/// its id and waits for it to exit, which must be non-zero; its log of
/// that life (the log file goes on across lives).
fn wipe_and_restart(c: &mut Cluster, victim: usize) -> String {
    c.kill9(victim);
    std::fs::remove_dir_all(&c.node(victim).data_dir).unwrap();
    let earlier = c.node(victim).log().len();
    c.restart(victim);
    let status = c.wait_exit(victim, START);
    assert!(!status.success(), "a wiped member must not start under its old id");
    c.node(victim).log()[earlier..].to_owned()
}

/// Proven case 4 (issue 35), docs/CLUSTER.md "A node's data directory was
/// wiped": a member killed (-9), its data directory wiped, restarted under
/// the same id with its peers, does not bootstrap a second group (before:
/// ready with commit 0 and no topics, then never starting again): it asks
/// its peers, the leader knows it as a member, and the start exits non-zero
/// saying it cannot rejoin under that id and what to do. The cluster keeps
/// working.
#[test]
fn a_wiped_node_restarted_under_its_old_id_is_refused_with_what_to_do() {
    let mut c = Cluster::start(3, ClusterOpts::dev());
    c.wait_all_alive(Duration::from_secs(20));
    for k in 0..12 {
        create_topic(&c, 0, &format!("t{k}"), 3);
    }
    let leader = c.leader(Duration::from_secs(10));
    let victim = (leader + 1) % 3;
    let log = wipe_and_restart(&mut c, victim);
    assert!(
        log.contains("cannot rejoin under") && log.contains("--node-id <new id>"),
        "the refusal says what to do: {}",
        c.node(victim).log_tail()
    );
    // The others still take writes.
    create_topic(&c, leader, "after", 3);
}

/// The metastore simulation's seed 13 on real processes (issue 35): the
/// leader is killed (-9), its directory wiped, and it restarts at once,
/// while the others still wait out its lease and no leader answers.
/// Before, a node without Raft state asked only a leader and, with none
/// answering, bootstrapped a second time (its empty vote could then elect
/// a node missing entries it had acknowledged). Now it waits or is
/// refused: here the followers' state knows it as a member, and the start
/// exits non-zero saying what to do; the others elect a leader among
/// themselves and keep every topic.
#[test]
fn a_wiped_leader_restarted_before_a_new_leader_is_elected_does_not_bootstrap() {
    let mut c = Cluster::start(3, ClusterOpts::dev());
    c.wait_all_alive(Duration::from_secs(20));
    for k in 0..8 {
        create_topic(&c, 0, &format!("t{k}"), 3);
    }
    let victim = c.leader(Duration::from_secs(10));
    let log = wipe_and_restart(&mut c, victim);
    assert!(
        log.contains("cannot rejoin under") && !log.contains("raft group bootstrapping"),
        "refused, never bootstrapped: {}",
        c.node(victim).log_tail()
    );
    let leader = c.leader(Duration::from_secs(20));
    assert_ne!(leader, victim);
    for k in 0..8 {
        let (status, _) = c.get_json(leader, &format!("/v1/topics/t{k}")).expect("topic");
        assert_eq!(status, 200, "t{k} survives on the new leader");
    }
    create_topic(&c, leader, "after", 3);
}

/// A first boot with one of three machines down (issue 35's first-start
/// rule): the two that start answer each other "no Raft state" and,
/// being a majority, form the group; the third, started later for the
/// first time, is a voter the leader has never heard from, and joins
/// (it bootstraps the group's own first entry and follows).
#[test]
fn a_first_boot_forms_with_a_majority_and_the_late_third_node_joins() {
    let mut c = Cluster::prepare(3, ClusterOpts::dev());
    c.start_first(2);
    let leader = c.leader(Duration::from_secs(20));
    create_topic(&c, leader, "early", 3);
    c.spawn(2);
    c.wait_ready(2, START);
    c.wait_all_alive(Duration::from_secs(30));
    let (status, t) = c.get_json(2, "/v1/topics/early").expect("topic on the late node");
    assert_eq!(status, 200, "{t}");
    assert!(
        !c.node(2).log().contains("refusing to start"),
        "a late first start is not a wiped node: {}",
        c.node(2).log_tail()
    );
}
