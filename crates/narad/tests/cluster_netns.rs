//! Real network faults between real processes (issue 25 part 2): each node
//! of a 3-node cluster in a network namespace of its own, on a bridge the
//! test makes (common/netns.rs), so a test can cut a node off while it
//! keeps running, then heal. Needs root (CI is root); elsewhere each test
//! prints why it skips and returns.

mod common;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::cluster::{Cluster, ClusterOpts, wait_for};
use common::netns;
use common::payload_bytes;
use reqwest::Method;
use serde_json::{Value, json};

/// Starts a 3-node cluster in namespaces with `topic` (`partitions`, 1 s
/// visibility timeout) placed over all three; `None` (and a printed reason)
/// where namespaces cannot be made.
fn lab_cluster(test: &str, topic: &str, partitions: u32) -> Option<(Cluster, Vec<String>)> {
    if let Some(why) = netns::unavailable() {
        eprintln!("{test}: skipped: {why}");
        return None;
    }
    // Security on: a `--dev` node serves loopback only, and the nodes talk
    // over the bridge.
    let c = Cluster::start(
        3,
        ClusterOpts::secure("netns-lab-secret-0123456789abcdef").in_network_namespaces(),
    );
    c.wait_all_alive(Duration::from_secs(30));
    let r = c
        .request(0, Method::POST, "/v1/topics")
        .body(
            json!({"name": topic, "partitions": partitions, "visibility_timeout_ms": 1000})
                .to_string(),
        )
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
    let owners = c.wait_placed(topic);
    Some((c, owners))
}

/// A counter of node `i`'s /metrics (0 when absent or unreachable).
fn metric(c: &Cluster, i: usize, series: &str) -> f64 {
    let Ok(r) = c.request(i, Method::GET, "/metrics").send() else { return 0.0 };
    let text = r.text().unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Keyless single produces of `n{k}` records through `nodes` in turn until
/// `stop`; the acked ids go to `acked`.
fn produce_until(
    c: &Cluster,
    nodes: &[usize],
    topic: &str,
    stop: &AtomicBool,
    next: &AtomicU64,
    acked: &Mutex<Vec<u64>>,
) {
    let mut turn = 0;
    while !stop.load(Ordering::Relaxed) {
        let id = next.fetch_add(1, Ordering::Relaxed);
        let node = nodes[turn % nodes.len()];
        turn += 1;
        let r = c
            .request(node, Method::POST, &format!("/v1/topics/{topic}/produce"))
            .body(json!({"id": id}).to_string())
            .send();
        match r {
            Ok(r) if r.status() == 202 => acked.lock().unwrap().push(id),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Consumes and acks `topic` through every node until every id of `want`
/// was delivered or `within` passes; the ids delivered.
fn drain(c: &Cluster, topic: &str, want: &BTreeSet<u64>, within: Duration) -> BTreeSet<u64> {
    drain_counted(c, topic, want, within).0
}

/// [`drain`], also counting deliveries (distinct ids plus duplicates:
/// records committed twice, and leases that expired before their ack).
fn drain_counted(
    c: &Cluster,
    topic: &str,
    want: &BTreeSet<u64>,
    within: Duration,
) -> (BTreeSet<u64>, u64) {
    let mut got = BTreeSet::new();
    let mut deliveries = 0u64;
    let deadline = Instant::now() + within;
    while Instant::now() < deadline && !want.is_subset(&got) {
        for i in 0..c.len() {
            let Ok(r) = c
                .request(i, Method::GET, &format!("/v1/topics/{topic}/consume?max=100&wait=300ms"))
                .send()
            else {
                continue;
            };
            if r.status() != 200 {
                continue;
            }
            let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
            let msgs = v["messages"].as_array().unwrap();
            for m in msgs {
                let p: Value = serde_json::from_slice(&payload_bytes(m)).unwrap();
                got.insert(p["id"].as_u64().unwrap());
                deliveries += 1;
            }
            let handles: Vec<&Value> = msgs.iter().map(|m| &m["receipt_handle"]).collect();
            let _ = c
                .request(i, Method::POST, &format!("/v1/topics/{topic}/ack"))
                .body(json!({"receipt_handles": handles}).to_string())
                .send();
        }
    }
    (got, deliveries)
}

/// The owner of some partitions is cut off the network (it keeps running)
/// while the two other nodes take produces: every produce to them keeps
/// answering 202, the cut-off owner's share reroutes to sibling partitions
/// after the 3 s grace, and once the link is back and everything is
/// drained, none of the 202'd records is missing.
#[test]
fn an_owner_cut_off_under_produce_load_reroutes_and_loses_nothing_after_the_heal() {
    let Some((c, owners)) = lab_cluster("owner cut off", "cut", 6) else { return };
    let leader = c.leader(Duration::from_secs(15));
    // The victim is not the leader: the majority keeps its metadata.
    let victim = (0..3).find(|&i| i != leader && owners.contains(&c.node(i).id)).unwrap();
    let live: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let (stop, next, acked) = (AtomicBool::new(false), AtomicU64::new(0), Mutex::new(Vec::new()));
    let rerouted_before: f64 =
        live.iter().map(|&i| metric(&c, i, "narad_dispatch_rerouted_total")).sum();
    std::thread::scope(|s| {
        let guard = scopeguard(&stop);
        for _ in 0..4 {
            s.spawn(|| produce_until(&c, &live, "cut", &stop, &next, &acked));
        }
        std::thread::sleep(Duration::from_secs(1));
        c.lab().isolate(victim);
        std::thread::sleep(Duration::from_secs(7));
        let rerouted: f64 =
            live.iter().map(|&i| metric(&c, i, "narad_dispatch_rerouted_total")).sum();
        assert!(
            rerouted > rerouted_before,
            "no record rerouted away from the cut-off owner {} in 7 s\n{}",
            c.node(victim).id,
            c.describe()
        );
        c.lab().heal(victim);
        std::thread::sleep(Duration::from_secs(1));
        drop(guard);
    });
    let want: BTreeSet<u64> = acked.lock().unwrap().iter().copied().collect();
    assert!(want.len() > 100, "the load barely ran: {} acked", want.len());
    c.wait_all_alive(Duration::from_secs(40));
    let got = drain(&c, "cut", &want, Duration::from_secs(60));
    let lost = want.difference(&got).count();
    eprintln!("owner cut off: {} acked, {} delivered, {} lost", want.len(), got.len(), lost);
    assert_none_lost(&c, "acked records", &want, &got);
}

/// The leader is cut off: the two others elect a leader among themselves
/// and take metadata writes; the cut-off node answers a metadata write 503
/// but still accepts produces into its WAL (202), and those records are
/// committed and delivered once the link is back.
#[test]
fn a_cut_off_leader_loses_to_the_majority_and_its_accepted_records_commit_after_the_heal() {
    let Some((c, _)) = lab_cluster("leader cut off", "lead", 3) else { return };
    let old = c.leader(Duration::from_secs(15));
    let majority: Vec<usize> = (0..3).filter(|&i| i != old).collect();
    c.lab().isolate(old);
    let new = wait_for(
        Duration::from_secs(30),
        "a leader on the majority side",
        || {
            let s = c.status(majority[0])?;
            let leader = s["leader"].as_str()?;
            majority.iter().copied().find(|&i| {
                c.node(i).id == leader && c.status(i).is_some_and(|s| s["role"] == "leader")
            })
        },
        || c.describe(),
    );
    let create = |i: usize, name: &str| {
        let r = c
            .request(i, Method::POST, "/v1/topics")
            .body(json!({"name": name, "partitions": 3}).to_string())
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let (status, body) = create(new, "majority-side");
    assert_eq!(status, 201, "the majority takes metadata writes: {body}");
    let (status, body) = create(old, "minority-side");
    assert_eq!(status, 503, "the cut-off node refuses metadata writes: {body}");
    // Produces into the cut-off node's WAL: 202, committed later.
    let mut acked = BTreeSet::new();
    for id in 0..200u64 {
        let r = c
            .request(old, Method::POST, "/v1/topics/lead/produce")
            .body(json!({"id": id}).to_string())
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{}", r.text().unwrap());
        acked.insert(id);
    }
    c.lab().heal(old);
    c.wait_all_alive(Duration::from_secs(40));
    let got = drain(&c, "lead", &acked, Duration::from_secs(60));
    eprintln!(
        "leader cut off: {} acked through the cut-off node, {} delivered after the heal",
        acked.len(),
        got.len()
    );
    assert_none_lost(&c, "the cut-off leader's records", &acked, &got);
    // It follows the new leader, and sees what the majority wrote meanwhile.
    wait_for(
        Duration::from_secs(20),
        "the healed node knows the topic created while it was cut off",
        || (c.get_json(old, "/v1/topics/majority-side")?.0 == 200).then_some(()),
        || c.describe(),
    );
}

/// Sets `stop` however the scope ends, so producers never outlive a
/// failed assertion.
fn scopeguard(stop: &AtomicBool) -> impl Drop + '_ {
    struct Guard<'a>(&'a AtomicBool);
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    Guard(stop)
}

/// Links that flap: for a while (10 s in CI, a minute with `NARAD_SOAK=1`)
/// a random node is cut off for 0.3-1.5 s, again and again, under produce
/// load through every node. Once every link is back and everything is
/// drained, none of the 202'd records is missing.
#[test]
fn flapping_links_under_produce_load_lose_nothing() {
    let Some((c, _)) = lab_cluster("flapping links", "flap", 6) else { return };
    let soak = std::env::var("NARAD_SOAK").is_ok_and(|v| v == "1");
    let flapping = Duration::from_secs(if soak { 60 } else { 10 });
    let seed = std::env::var("NARAD_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(7);
    let mut rng = narad_fs::SimRng::new(seed);
    let all: Vec<usize> = (0..3).collect();
    let (stop, next, acked) = (AtomicBool::new(false), AtomicU64::new(0), Mutex::new(Vec::new()));
    let mut cuts = 0;
    std::thread::scope(|s| {
        let guard = scopeguard(&stop);
        for _ in 0..4 {
            s.spawn(|| produce_until(&c, &all, "flap", &stop, &next, &acked));
        }
        let end = Instant::now() + flapping;
        while Instant::now() < end {
            let victim = rng.below(3) as usize;
            c.lab().isolate(victim);
            cuts += 1;
            std::thread::sleep(Duration::from_millis(rng.range(300, 1500)));
            c.lab().heal(victim);
            std::thread::sleep(Duration::from_millis(rng.range(200, 1000)));
        }
        drop(guard);
    });
    let want: BTreeSet<u64> = acked.lock().unwrap().iter().copied().collect();
    assert!(want.len() > 100, "the load barely ran: {} acked", want.len());
    c.wait_all_alive(Duration::from_secs(40));
    let got = drain(&c, "flap", &want, Duration::from_secs(90));
    let lost = want.difference(&got).count();
    eprintln!(
        "flapping links (seed {seed}): {cuts} cuts in {flapping:?}, {} acked, {} delivered, {} lost",
        want.len(),
        got.len(),
        lost
    );
    assert_none_lost(&c, "acked records", &want, &got);
}

/// Asserts every acked record of `want` is in `got`, naming some lost ones
/// and the cluster's state otherwise.
fn assert_none_lost(c: &Cluster, what: &str, want: &BTreeSet<u64>, got: &BTreeSet<u64>) {
    let lost: Vec<&u64> = want.difference(got).collect();
    assert!(
        lost.is_empty(),
        "{} of {} {what} lost, e.g. {:?}\n{}",
        lost.len(),
        want.len(),
        &lost[..lost.len().min(10)],
        c.describe()
    );
}

/// Why the nftables tests cannot run here, printed as the test's skip
/// reason; `true`: skip.
fn skip_without_nft(test: &str) -> bool {
    let Some(why) = netns::nft_unavailable() else { return false };
    eprintln!("{test}: skipped: {why}");
    true
}

/// The sum of `series` over every node.
fn metric_sum(c: &Cluster, series: &str) -> f64 {
    (0..c.len()).map(|i| metric(c, i, series)).sum()
}

/// After a fault is healed: waits for every member alive, drains `topic`,
/// prints `what` with the figures (acked, delivered, lost, duplicate
/// deliveries, `elapsed` under the fault and load) and fails on any acked
/// record missing.
fn check_nothing_lost(
    c: &Cluster,
    what: &str,
    topic: &str,
    acked: &Mutex<Vec<u64>>,
    elapsed: Duration,
) {
    let want: BTreeSet<u64> = acked.lock().unwrap().iter().copied().collect();
    assert!(want.len() > 100, "the load barely ran: {} acked", want.len());
    c.wait_all_alive(Duration::from_secs(40));
    let started = Instant::now();
    let (got, deliveries) = drain_counted(c, topic, &want, Duration::from_secs(90));
    let lost = want.difference(&got).count();
    eprintln!(
        "{what}: {} acked in {elapsed:.1?}, {} delivered ({deliveries} deliveries: {} duplicate) \
         in {:.1?} after the heal, {} lost",
        want.len(),
        got.len(),
        deliveries - got.len() as u64,
        started.elapsed(),
        lost
    );
    assert_none_lost(c, "acked records", &want, &got);
}

/// A one-way cut between the two followers: owner `o` hears node `s`, but
/// every packet `o` sends to `s` is dropped. `s`'s commits reach `o` and
/// land in its partition logs, but their answers (and `o`'s pongs) never
/// come back: `s` fails those commits (no pong within 500 ms), keeps the
/// records in its WAL and sends them again, to `o`'s partitions or to
/// siblings after 3 s, so a record can be committed twice; `o`'s own
/// commits to `s` never arrive. Under produce load through every node for
/// 8 s; after the heal every 202'd record is delivered (duplicates allowed,
/// loss never).
#[test]
fn a_one_way_cut_that_loses_an_owners_answers_loses_no_acked_record() {
    const WHAT: &str = "one-way cut owner->sender";
    if skip_without_nft(WHAT) {
        return;
    }
    let Some((c, owners)) = lab_cluster(WHAT, "oneway", 6) else { return };
    let leader = c.leader(Duration::from_secs(15));
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    // Partitions are placed over all three nodes: both followers own some.
    let (o, s) = (followers[0], followers[1]);
    assert!(owners.contains(&c.node(o).id), "{} owns no partition: {owners:?}", c.node(o).id);
    let all: Vec<usize> = (0..3).collect();
    let (stop, next, acked) = (AtomicBool::new(false), AtomicU64::new(0), Mutex::new(Vec::new()));
    let failures_before = metric(&c, s, "narad_dispatch_commit_failures_total");
    let mut dropped = 0;
    let (rerouted_before, started) =
        (metric_sum(&c, "narad_dispatch_rerouted_total"), Instant::now());
    std::thread::scope(|scope| {
        let guard = scopeguard(&stop);
        for _ in 0..4 {
            scope.spawn(|| produce_until(&c, &all, "oneway", &stop, &next, &acked));
        }
        std::thread::sleep(Duration::from_secs(1));
        c.lab().one_way(o, s);
        std::thread::sleep(Duration::from_secs(8));
        let failures = metric(&c, s, "narad_dispatch_commit_failures_total");
        assert!(
            failures > failures_before,
            "{} saw no commit fail while {} could not answer it, in 8 s\n{}",
            c.node(s).id,
            c.node(o).id,
            c.describe()
        );
        dropped = c.lab().fault_counts(o).0;
        c.lab().heal_links(o);
        std::thread::sleep(Duration::from_secs(1));
        drop(guard);
    });
    let elapsed = started.elapsed();
    eprintln!(
        "{WHAT}: {} -> {} cut for 8 s ({dropped} packets dropped): {} commits of {} failed, \
         {} records rerouted",
        c.node(o).id,
        c.node(s).id,
        metric(&c, s, "narad_dispatch_commit_failures_total") - failures_before,
        c.node(s).id,
        metric_sum(&c, "narad_dispatch_rerouted_total") - rerouted_before
    );
    check_nothing_lost(&c, WHAT, "oneway", &acked, elapsed);
}

/// Every node's link drops 20 % of the packets it sends and 20 % of those
/// it receives, at random (about 36 % of the packets between two nodes),
/// and sends 10 % of what it sends twice, for 8 s, under produce load
/// through every node. Node-to-node traffic is QUIC, which resends what
/// is lost and discards duplicate datagrams, but commits and pings slow
/// down: some miss their 500 ms, fail, and their records are sent again
/// (duplicates). After the heal every 202'd record is delivered.
#[test]
fn lossy_and_duplicating_links_under_produce_load_lose_nothing() {
    const WHAT: &str = "lossy links";
    const LOSS: u32 = 20;
    const DUPLICATE: u32 = 10;
    if skip_without_nft(WHAT) {
        return;
    }
    let Some((c, _)) = lab_cluster(WHAT, "lossy", 6) else { return };
    let all: Vec<usize> = (0..3).collect();
    let (stop, next, acked) = (AtomicBool::new(false), AtomicU64::new(0), Mutex::new(Vec::new()));
    let failures_before = metric_sum(&c, "narad_dispatch_commit_failures_total");
    let (mut dropped, mut duplicated) = (0, 0);
    let (rerouted_before, started) =
        (metric_sum(&c, "narad_dispatch_rerouted_total"), Instant::now());
    std::thread::scope(|scope| {
        let guard = scopeguard(&stop);
        for _ in 0..4 {
            scope.spawn(|| produce_until(&c, &all, "lossy", &stop, &next, &acked));
        }
        std::thread::sleep(Duration::from_secs(1));
        for i in 0..3 {
            c.lab().lossy(i, LOSS);
            c.lab().duplicating(i, DUPLICATE);
        }
        std::thread::sleep(Duration::from_secs(8));
        for i in 0..3 {
            let (d, u) = c.lab().fault_counts(i);
            (dropped, duplicated) = (dropped + d, duplicated + u);
            c.lab().heal_links(i);
        }
        std::thread::sleep(Duration::from_secs(1));
        drop(guard);
    });
    let elapsed = started.elapsed();
    eprintln!(
        "{WHAT}: {LOSS} % loss each way per node, {DUPLICATE} % duplicated, for 8 s ({dropped} \
         packets dropped, {duplicated} duplicated): {} commits failed, {} records rerouted",
        metric_sum(&c, "narad_dispatch_commit_failures_total") - failures_before,
        metric_sum(&c, "narad_dispatch_rerouted_total") - rerouted_before
    );
    check_nothing_lost(&c, WHAT, "lossy", &acked, elapsed);
}

/// An owner's link limited to 256 kbit/s each way (TBF: a queue of up to
/// 400 ms, then drops) for 8 s under produce load through every node:
/// commits to it and its answers crawl, pings may miss their 500 ms. After
/// the limit is lifted every 202'd record is delivered.
#[test]
fn an_owner_on_a_slow_link_under_produce_load_loses_nothing() {
    const WHAT: &str = "slow owner link";
    if let Some(why) = netns::tbf_unavailable() {
        eprintln!("{WHAT}: skipped: {why}");
        return;
    }
    let Some((c, owners)) = lab_cluster(WHAT, "slow", 6) else { return };
    let leader = c.leader(Duration::from_secs(15));
    let victim = (0..3).find(|&i| i != leader && owners.contains(&c.node(i).id)).unwrap();
    let all: Vec<usize> = (0..3).collect();
    let mut dropped = 0;
    let (stop, next, acked) = (AtomicBool::new(false), AtomicU64::new(0), Mutex::new(Vec::new()));
    let failures_before = metric_sum(&c, "narad_dispatch_commit_failures_total");
    let (rerouted_before, started) =
        (metric_sum(&c, "narad_dispatch_rerouted_total"), Instant::now());
    std::thread::scope(|scope| {
        let guard = scopeguard(&stop);
        for _ in 0..4 {
            scope.spawn(|| produce_until(&c, &all, "slow", &stop, &next, &acked));
        }
        std::thread::sleep(Duration::from_secs(1));
        c.lab().limit_bandwidth(victim, 256);
        std::thread::sleep(Duration::from_secs(8));
        dropped = c.lab().fault_counts(victim).0;
        c.lab().heal_links(victim);
        std::thread::sleep(Duration::from_secs(1));
        drop(guard);
    });
    let elapsed = started.elapsed();
    eprintln!(
        "{WHAT}: {} at 256 kbit/s for 8 s ({dropped} packets dropped from its queues): {} \
         commits failed, {} records rerouted",
        c.node(victim).id,
        metric_sum(&c, "narad_dispatch_commit_failures_total") - failures_before,
        metric_sum(&c, "narad_dispatch_rerouted_total") - rerouted_before
    );
    check_nothing_lost(&c, WHAT, "slow", &acked, elapsed);
}
