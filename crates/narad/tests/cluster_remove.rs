//! `narad cluster remove <id> --force` on real `narad serve` processes: a
//! node whose disk is gone for good is removed, and the cluster is whole
//! again (issue 37). Bounded in time; the harness kills its processes by PID
//! and removes its directories however the test ends.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::cluster::{Cluster, ClusterOpts, key_partition, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

const TOPIC: &str = "rm";
const PARTITIONS: u32 = 6;

/// `narad cluster remove <id>` (with `--force` when asked) against node
/// `i`: its exit status, stdout and stderr.
fn cli_remove(c: &Cluster, i: usize, id: &str, force: bool) -> (bool, String, String) {
    let url = c.node(i).url("");
    let mut args = vec!["cluster", "remove", id, "-s", url.as_str()];
    if force {
        args.push("--force");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_narad")).args(&args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Produces one record `{"i": i}` per entry through node `node`, pinned
/// to its partition (`Some`) or keyed (`None`: the key is `k<i>`), in one
/// batch that must answer 202.
fn produce(c: &Cluster, node: usize, records: &[(u64, Option<u32>)]) {
    let messages: Vec<Value> = records
        .iter()
        .map(|(i, p)| match p {
            Some(p) => json!({"payload": {"i": i}, "partition": p}),
            None => json!({"payload": {"i": i}, "key": format!("k{i}")}),
        })
        .collect();
    let r = c
        .request(node, Method::POST, &format!("/v1/topics/{TOPIC}/produce/batch"))
        .body(json!({"messages": messages}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap_or_default());
}

/// Waits until node 1 shows member `id` dead.
fn wait_marked_dead(c: &Cluster, id: &str) {
    wait_for(
        Duration::from_secs(75),
        &format!("{id} marked dead"),
        || {
            let (_, v) = c.get_json(0, "/v1/cluster/members")?;
            v["members"]
                .as_array()?
                .iter()
                .any(|m| m["id"] == id && m["status"] == "dead")
                .then_some(())
        },
        || c.describe(),
    );
}

/// Each partition's next offset as node `i` shows it (its owner's figures).
fn next_offsets(c: &Cluster, i: usize) -> Option<BTreeMap<u32, u64>> {
    let (status, v) = c.get_json(i, &format!("/v1/topics/{TOPIC}"))?;
    (status == 200).then_some(())?;
    v["partition_stats"]
        .as_array()?
        .iter()
        .map(|p| Some((p["index"].as_u64()? as u32, p["next_offset"].as_u64()?)))
        .collect()
}

/// Consumes (and acks) through `nodes` until every `i` of `want` arrived or
/// `deadline` passed: `i` → (partition, offset) of its first delivery.
fn consume_until(
    c: &Cluster,
    nodes: &[usize],
    want: &BTreeSet<u64>,
    deadline: Instant,
) -> BTreeMap<u64, (u32, u64)> {
    let mut got: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
    let mut turn = 0;
    while !want.iter().all(|i| got.contains_key(i)) && Instant::now() < deadline {
        let node = nodes[turn % nodes.len()];
        turn += 1;
        let path = format!("/v1/topics/{TOPIC}/consume?max=100&wait=200ms");
        let Ok(r) = c.request(node, Method::GET, &path).send() else { continue };
        if r.status().as_u16() != 200 {
            continue;
        }
        let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
        let mut handles = Vec::new();
        for m in v["messages"].as_array().unwrap() {
            let i = m["payload"]["i"].as_u64().unwrap();
            let at = (m["partition"].as_u64().unwrap() as u32, m["offset"].as_u64().unwrap());
            got.entry(i).or_insert(at);
            handles.push(m["receipt_handle"].as_str().unwrap().to_owned());
        }
        if !handles.is_empty() {
            let _ = c
                .request(node, Method::POST, &format!("/v1/topics/{TOPIC}/ack"))
                .body(json!({"receipt_handles": handles}).to_string())
                .send();
        }
    }
    got
}

/// A 3-node cluster loses n3 for good (`kill -9`, its data directory
/// deleted). Once membership marks it dead, `narad cluster remove n3`
/// refuses without `--force` and says what is lost; with it, every
/// partition n3 owned gets a live owner whose log starts above the offsets
/// the survivors saw, n3 leaves the Raft voters (on the removal repeated,
/// when its first try left it there), and produce (keyed to every
/// partition and pinned to each) and consume work on every partition, with
/// nothing produced after the removal lost.
#[test]
fn a_node_whose_disk_is_gone_is_removed_and_every_partition_works_again() {
    // The first removal leaves n3 in the raft group, as if its leader had
    // stopped between the metastore's commit and the raft step; the
    // operator's retry finishes it.
    let opts = ClusterOpts::dev().env("NARAD_TEST_SKIP_REMOVE_GROUP_STEP_ONCE", "1");
    let mut c = Cluster::start(3, opts);
    let owners = c.create_placed(0, json!({"name": TOPIC, "partitions": PARTITIONS}));
    let lost: Vec<u32> = (0..PARTITIONS).filter(|&p| owners[p as usize] == "n3").collect();
    assert!(!lost.is_empty(), "n3 owns partitions: {owners:?}");
    // 20 records pinned to every partition through n1 and n2: n3's are
    // committed to it by the survivors, which see the offsets it assigns.
    let mut i = 0u64;
    for node in [0, 1] {
        let batch: Vec<(u64, Option<u32>)> = (0..PARTITIONS)
            .flat_map(|p| (0..10).map(move |_| p))
            .map(|p| {
                i += 1;
                (i, Some(p))
            })
            .collect();
        produce(&c, node, &batch);
    }
    let before = wait_for(
        Duration::from_secs(20),
        "every partition holds its 20 records",
        || next_offsets(&c, 0).filter(|o| o.values().all(|&n| n == 20)),
        || c.describe(),
    );
    c.kill9(2);
    let killed = Instant::now();
    std::fs::remove_dir_all(&c.node(2).data_dir).unwrap();
    wait_marked_dead(&c, "n3");
    let dead_after = killed.elapsed();

    let (ok, out, err) = cli_remove(&c, 1, "n3", false);
    assert!(!ok, "without --force the removal is refused: {out} {err}");
    assert!(err.contains("lost") && err.contains("--force"), "it says what is lost: {err}");
    let members = c.get_json(0, "/v1/cluster/members").unwrap().1;
    assert!(members.to_string().contains("\"n3\""), "nothing removed yet: {members}");

    let asked = Instant::now();
    let (ok, out, err) = cli_remove(&c, 1, "n3", true);
    assert!(ok, "the forced removal succeeds: {out} {err}");
    let removal_took = asked.elapsed();
    for p in &lost {
        assert!(out.contains(TOPIC) && out.contains(&p.to_string()), "{out}");
    }

    // Half done: n3 is no member, but still a raft voter (a dead one that
    // counts toward every quorum). The removal repeated finishes it.
    wait_for(
        Duration::from_secs(20),
        "n3 no member on n1 while still a voter",
        || {
            let (_, m) = c.get_json(0, "/v1/cluster/members")?;
            (!m.to_string().contains("\"n3\"")).then_some(())?;
            let s = c.status(0)?;
            s["voters"].as_array()?.iter().any(|v| v == "n3").then_some(())
        },
        || c.describe(),
    );
    let (ok, out, err) = cli_remove(&c, 0, "n3", false);
    assert!(!ok && err.contains("raft group") && err.contains("--force"), "{out} {err}");
    let (ok, out, err) = cli_remove(&c, 0, "n3", true);
    assert!(ok, "the repeated removal finishes: {out} {err}");
    let (ok, out, err) = cli_remove(&c, 0, "n9", true);
    assert!(!ok && err.contains("not found"), "an id in neither is not found: {out} {err}");

    // Every node: n3 is no member, every partition has a live owner, and
    // n3 is out of the Raft group.
    let new_owners = wait_for(
        Duration::from_secs(20),
        "every node shows n3 gone, its partitions on n1/n2 and two voters",
        || {
            let mut seen = Vec::new();
            for n in [0, 1] {
                (c.member_ids(n)? == ["n1", "n2"]).then_some(())?;
                let (_, t) = c.get_json(n, &format!("/v1/topics/{TOPIC}"))?;
                let o: Vec<String> = t["partition_stats"]
                    .as_array()?
                    .iter()
                    .map(|p| p["owner_node"].as_str().map(str::to_owned))
                    .collect::<Option<_>>()?;
                o.iter().all(|o| o == "n1" || o == "n2").then_some(())?;
                let s = c.status(n)?;
                (s["voters"].as_array()?.len() == 2).then_some(())?;
                seen.push(o);
            }
            (seen[0] == seen[1]).then(|| seen[0].clone())
        },
        || c.describe(),
    );
    // Metadata writes still commit (2 voters of 2).
    let r = c
        .request(1, Method::POST, "/v1/topics")
        .body(json!({"name": "after", "partitions": 3}).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap_or_default());

    // After the removal: pinned to every partition and keyed to every
    // partition, through both live nodes.
    let mut keyed_to: BTreeMap<u32, u64> = BTreeMap::new();
    let first_after = i + 1;
    let mut probe = 1_000_000u64;
    while keyed_to.len() < PARTITIONS as usize {
        probe += 1;
        keyed_to.entry(key_partition(&format!("k{probe}"), PARTITIONS)).or_insert(probe);
    }
    let mut want = BTreeSet::new();
    for node in [0, 1] {
        let mut batch = Vec::new();
        for p in 0..PARTITIONS {
            for _ in 0..5 {
                i += 1;
                batch.push((i, Some(p)));
            }
        }
        produce(&c, node, &batch);
        want.extend(batch.iter().map(|(i, _)| *i));
    }
    let keyed: Vec<(u64, Option<u32>)> = keyed_to.values().map(|&k| (k, None)).collect();
    produce(&c, 0, &keyed);
    want.extend(keyed_to.values());
    let started = Instant::now();
    let got = consume_until(&c, &[0, 1], &want, Instant::now() + Duration::from_secs(30));
    let delivered_in = started.elapsed();
    let missing: Vec<&u64> = want.iter().filter(|i| !got.contains_key(i)).collect();
    assert!(
        missing.is_empty(),
        "records produced after the removal lost: {missing:?}\n{}",
        c.describe()
    );
    for (k, p) in keyed_to.iter().map(|(p, k)| (k, p)) {
        assert_eq!(got[k].0, *p, "keyed record {k} is in the partition its key names");
    }
    // Every partition took records; the reassigned ones continue above the
    // offsets acknowledged and committed before the kill.
    for p in 0..PARTITIONS {
        let offsets: Vec<u64> = got
            .iter()
            .filter(|(i, (q, _))| **i >= first_after && *q == p)
            .map(|(_, (_, o))| *o)
            .collect();
        assert!(offsets.len() >= 10, "partition {p} took its records: {offsets:?}");
        if lost.contains(&p) {
            let floor = before[&p];
            assert!(
                offsets.iter().all(|&o| o >= floor),
                "partition {p} reuses offsets below {floor}: {offsets:?}"
            );
        }
    }
    eprintln!(
        "n3 owned {lost:?} (20 records each, next offset {before:?}); marked dead {dead_after:?} \
         after the kill; removal took {removal_took:?}; new owners {new_owners:?}; {} records \
         produced after it all delivered in {delivered_in:?}",
        want.len()
    );

    // n3 comes back under its id on its wiped directory: nobody knows it
    // any more, so it joins as a new, empty member and gets partitions
    // only by moves (copies).
    let restarted = Instant::now();
    c.restart(2);
    c.wait_ready(2, Duration::from_secs(60));
    wait_for(
        Duration::from_secs(90),
        "n3 back as an alive voter owning partitions moved to it",
        || {
            let (_, m) = c.get_json(0, "/v1/cluster/members")?;
            let n3 = m["members"].as_array()?.iter().find(|m| m["id"] == "n3")?.clone();
            (n3["status"] == "alive" && n3["owned_partitions"].as_u64()? > 0).then_some(())?;
            let s = c.status(0)?;
            s["voters"].as_array()?.iter().any(|v| v == "n3").then_some(())
        },
        || c.describe(),
    );
    eprintln!(
        "the wiped n3 rejoined and owns partitions {:?} after its start",
        restarted.elapsed()
    );
    let mut again = Vec::new();
    for p in 0..PARTITIONS {
        i += 1;
        again.push((i, Some(p)));
    }
    produce(&c, 2, &again);
    let want: BTreeSet<u64> = again.iter().map(|(i, _)| *i).collect();
    let got = consume_until(&c, &[0, 1, 2], &want, Instant::now() + Duration::from_secs(30));
    let missing: Vec<&u64> = want.iter().filter(|i| !got.contains_key(i)).collect();
    assert!(missing.is_empty(), "records produced through the rejoined n3 lost: {missing:?}");
    c.terminate_all();
}

/// A node removed for good (`remove --force`) that comes back on its old
/// directory after all (it was only unreachable): its replica never applied
/// the removal and still counts it in the group, but the leader refuses the
/// first write it forwards (its heartbeat) as coming from outside the Raft
/// group, so it stops with what to do instead of joining back as a member
/// (before the fix its heartbeat re-created its member record, the planner
/// moved partitions to it, and produces through it answered 202 into a log
/// nobody reads). The survivors never list it again.
#[test]
fn a_removed_node_restarted_on_its_old_disk_stops_and_is_not_a_member_again() {
    let mut c = Cluster::start(3, ClusterOpts::dev());
    let owners = c.create_placed(0, json!({"name": TOPIC, "partitions": PARTITIONS}));
    assert!(owners.iter().any(|o| o == "n3"), "n3 owns partitions: {owners:?}");
    c.kill9(2);
    wait_marked_dead(&c, "n3");
    let (ok, out, err) = cli_remove(&c, 1, "n3", true);
    assert!(ok, "the forced removal succeeds: {out} {err}");
    wait_for(
        Duration::from_secs(20),
        "n3 gone from the members and the voters",
        || {
            (c.member_ids(0)? == ["n1", "n2"]).then_some(())?;
            let s = c.status(0)?;
            (!s["voters"].as_array()?.iter().any(|v| v == "n3")).then_some(())
        },
        || c.describe(),
    );

    // n3 back on the directory it had, with a producer sending to it,
    // pinned to its old partitions, from its first moment to its exit.
    let started = Instant::now();
    c.spawn(2);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let url = c.node(2).url(&format!("/v1/topics/{TOPIC}/produce/batch"));
        let old: Vec<u32> = (0..PARTITIONS).filter(|p| owners[*p as usize] == "n3").collect();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let client = reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap();
            let mut answers: BTreeMap<u16, usize> = BTreeMap::new();
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let messages: Vec<Value> = old
                    .iter()
                    .map(|p| json!({"payload": {"i": 5_000 + i}, "partition": p}))
                    .collect();
                i += 1;
                let body = json!({"messages": messages}).to_string();
                if let Ok(r) = client.post(&url).body(body).send() {
                    *answers.entry(r.status().as_u16()).or_default() += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            answers
        })
    };
    let status = c.wait_exit(2, Duration::from_secs(60));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers = producer.join().unwrap();
    eprintln!(
        "n3 stopped {:?} after its start: {status}; its answers to produces: {answers:?}",
        started.elapsed()
    );
    assert!(!status.success(), "a removed node does not run on: {status}");
    // It never reached a leader, so it took none: a 202 here would be a
    // record in a log no other node reads.
    assert!(
        !answers.contains_key(&202),
        "a removed node accepted produces into its old partitions: {answers:?}"
    );
    let log = c.node(2).log();
    assert!(
        log.contains("removed from the cluster") && log.contains("wipe"),
        "n3 says why and what to do:\n{}",
        c.node(2).log_tail()
    );
    // It learnt it either from the leader refusing its forwarded heartbeat
    // or, knowing no leader, from the leader's answer to its probe; either
    // way the survivors never list it again.
    assert!(
        log.contains("says this node is not in the raft group")
            || log.contains("does not know this node"),
        "{}",
        c.node(2).log_tail()
    );
    for i in [0, 1] {
        assert_eq!(c.member_ids(i).unwrap(), ["n1", "n2"], "n{} lists n3 again", i + 1);
    }
    let (_, moves) = c.get_json(0, "/v1/cluster/moves").unwrap();
    assert!(!moves.to_string().contains("\"n3\""), "no move to n3: {moves}");
    // Every partition still works through the survivors.
    let batch: Vec<(u64, Option<u32>)> =
        (0..PARTITIONS).map(|p| (1_000 + p as u64, Some(p))).collect();
    produce(&c, 0, &batch);
}
