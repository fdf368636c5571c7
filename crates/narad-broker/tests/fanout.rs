//! Fan-out through the broker, in process: every child gets every parent
//! record; a delayed child gets none early; a failing child does not slow
//! the parent's consumers or the other children, and catches up once its
//! disk works again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_broker::metrics::BrokerMetrics;
use narad_broker::{AckAction, Broker, ProduceRecord};
use narad_clock::SystemClock;
use narad_fs::{FaultFs, FaultRule, Fs, SimFs};
use narad_meta::CreateTopicRequest;
use prometheus_client::registry::Registry;

mod common;

async fn broker(fs: narad_fs::FsRef) -> Arc<Broker> {
    let metrics = Arc::new(BrokerMetrics::new(&mut Registry::default()));
    Broker::open(common::config(), fs, SystemClock::shared(), metrics).await.unwrap()
}

async fn create(b: &Broker, name: &str, parent: &str, delay: i64) {
    let req = CreateTopicRequest {
        name: name.into(),
        parent: parent.into(),
        fanout_delay_ms: delay,
        ..Default::default()
    };
    b.create_topic(req).await.unwrap();
}

async fn produce(b: &Broker, topic: &str, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        let recs = chunk
            .iter()
            .map(|i| ProduceRecord {
                key: (i % 3 == 0).then(|| Bytes::from(format!("k{}", i % 17))),
                partition: None,
                payload: Bytes::from(format!("m{i}")),
            })
            .collect();
        b.produce_batch(topic, recs).await.unwrap();
    }
}

/// Consumes and acks `topic` until `want` distinct payloads arrived or the
/// deadline passed; returns them.
async fn drain(b: &Broker, topic: &str, want: usize, deadline: Instant) -> HashSet<String> {
    let mut seen = HashSet::new();
    while seen.len() < want && Instant::now() < deadline {
        let got = b.consume(topic, None, Duration::from_millis(200), 100).await.unwrap();
        for d in got {
            seen.insert(String::from_utf8(d.payload.to_vec()).unwrap());
            b.resolve(topic, d.receipt_handle.as_deref().unwrap(), AckAction::Ack).unwrap();
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_child_gets_every_record_and_a_delayed_child_none_early() {
    let fs = SimFs::new(1);
    let b = broker(fs.shared()).await;
    create(&b, "p", "", 0).await;
    create(&b, "c0", "p", 0).await;
    create(&b, "c1", "p", 0).await;
    create(&b, "late", "p", 2_000).await;
    let n = 10_000;
    produce(&b, "p", n).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    for child in ["c0", "c1", "late"] {
        let got = drain(&b, child, n, deadline).await;
        assert_eq!(got.len(), n, "{child} got {} of {n}", got.len());
    }
    // Never early, and on time: compare commit times in the logs.
    let parent_times = commit_times(&b, "p").await;
    let late_times = commit_times(&b, "late").await;
    let mut lateness: Vec<i64> = Vec::new();
    let mut early = 0;
    for (payload, child_ms) in &late_times {
        let parent_ms = parent_times[payload];
        let due = parent_ms + 2_000;
        if *child_ms < due {
            early += 1;
        }
        lateness.push(*child_ms as i64 - due as i64);
    }
    lateness.sort_unstable();
    let p99 = lateness[lateness.len() * 99 / 100];
    eprintln!(
        "delayed child: {} records, early {early}, lateness p50 {} ms, p99 {p99} ms",
        lateness.len(),
        lateness[lateness.len() / 2]
    );
    assert_eq!(early, 0, "records delivered before parent commit time + delay");
    assert!(p99 <= 1_000, "p99 lateness {p99} ms");
    b.shutdown().await.unwrap();
}

/// payload -> commit time (ms) of its first copy in `topic`.
async fn commit_times(b: &Arc<Broker>, topic: &str) -> HashMap<String, u64> {
    let t = b.topic(topic).unwrap();
    let mut out = HashMap::new();
    for p in 0..t.partitions() {
        let mut from = 0;
        loop {
            let got = b.replay(topic, p, from, 100).await.unwrap_or_default();
            let Some(last) = got.last() else { break };
            from = last.offset + 1;
            for d in got {
                out.entry(String::from_utf8(d.payload.to_vec()).unwrap())
                    .or_insert(d.commit_time_ms);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_child_stalls_only_itself_and_catches_up_later() {
    let sim = SimFs::new(2);
    let fs = FaultFs::new(sim.shared());
    let b = broker(Arc::new(fs.clone())).await;
    create(&b, "p", "", 0).await;
    create(&b, "good", "p", 0).await;
    create(&b, "bad", "p", 0).await;
    fs.add_rule(FaultRule {
        prefix: "/data/topics/bad".into(),
        fail_writes: true,
        fail_syncs: true,
        fail_reads: false,
    });
    let n = 2_000;
    let start = Instant::now();
    produce(&b, "p", n).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    assert_eq!(drain(&b, "p", n, deadline).await.len(), n, "the parent's consumers got everything");
    assert_eq!(drain(&b, "good", n, deadline).await.len(), n, "the healthy child got everything");
    let elapsed = start.elapsed();
    eprintln!("failing child: parent and healthy child drained in {elapsed:?}");
    let bad = b.topic("bad").unwrap();
    let committed: u64 = b.partition_stats(&bad, None).iter().map(|s| s.high_watermark).sum();
    assert_eq!(committed, 0, "nothing can be committed into the failing child");
    // The disk under the failing child works again: it catches up.
    fs.clear();
    let deadline = Instant::now() + Duration::from_secs(30);
    assert_eq!(drain(&b, "bad", n, deadline).await.len(), n, "the failed child caught up");
    b.shutdown().await.unwrap();
}

/// A cursor whose first start fails (its parent partition cannot be opened
/// or its file written) is started again once the disk works: the child
/// still gets every record of that partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_whose_first_start_fails_is_restarted() {
    let sim = SimFs::new(4);
    let fs = FaultFs::new(sim.shared());
    let b = broker(Arc::new(fs.clone())).await;
    let req = CreateTopicRequest { name: "p".into(), partitions: 3, ..Default::default() };
    b.create_topic(req).await.unwrap();
    fs.add_rule(FaultRule {
        prefix: "/data/topics/p/p00000".into(),
        fail_writes: true,
        fail_syncs: true,
        fail_reads: false,
    });
    create(&b, "c", "p", 0).await;
    // Long enough for the cursors to try to start (and p0's to fail).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    fs.clear();
    let n = 300;
    produce(&b, "p", n).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let got = drain(&b, "c", n, deadline).await;
    assert_eq!(got.len(), n, "the child got {} of {n}", got.len());
    b.shutdown().await.unwrap();
}

/// The seeded cursor-file fault workload: while a parent is produced to,
/// its cursor files are damaged, removed or made unwritable, and the node
/// restarts (with a file damaged or removed at rest); once the disk works
/// again the child has every record (duplicates allowed, loss never).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_file_faults_never_lose_a_childs_record() {
    for seed in 1..=3u64 {
        cursor_file_fault_run(seed).await;
    }
}

async fn cursor_file_fault_run(seed: u64) {
    use narad_broker::fanout::cursor_file;
    use std::path::PathBuf;
    let sim = SimFs::new(seed);
    let fs = FaultFs::new(sim.shared());
    let mut rng = narad_fs::SimRng::new(seed);
    let mut b = broker(Arc::new(fs.clone())).await;
    let req = CreateTopicRequest { name: "p".into(), partitions: 3, ..Default::default() };
    b.create_topic(req).await.unwrap();
    create(&b, "c", "p", 0).await;
    let epoch = {
        let c = b.topic("c").unwrap();
        cursor_file::parse_epoch(&c.parent().unwrap().attach_epoch).unwrap()
    };
    let file = |p: u64| cursor_file::path(&PathBuf::from(format!("/data/topics/p/p{p:05}")), epoch);
    let damage = |path: &PathBuf, rng: &mut narad_fs::SimRng| {
        if let Ok(mut bytes) = narad_fs::read_small_file(&sim, path, 64) {
            let i = rng.below(bytes.len() as u64) as usize;
            bytes[i] ^= 1 << rng.below(8);
            narad_fs::write_file_atomic(&sim, path, &bytes).unwrap();
        }
    };
    let mut sent = Vec::new();
    for round in 0..6 {
        let recs: Vec<ProduceRecord> = (0..150)
            .map(|i| {
                let id = format!("s{seed}-r{round}-{i}");
                sent.push(id.clone());
                ProduceRecord { key: None, partition: None, payload: Bytes::from(id) }
            })
            .collect();
        b.produce_batch("p", recs).await.unwrap();
        tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
        fs.clear();
        let path = file(rng.below(3));
        match rng.below(5) {
            0 => damage(&path, &mut rng),
            1 => {
                let _ = sim.remove_file(&path);
            }
            2 => {
                for p in [path.clone(), narad_fs::tmp_sibling(&path)] {
                    fs.add_rule(FaultRule {
                        prefix: p,
                        fail_writes: true,
                        fail_syncs: true,
                        fail_reads: false,
                    });
                }
            }
            r => {
                b.shutdown().await.unwrap();
                drop(b);
                if r == 3 {
                    damage(&path, &mut rng);
                } else {
                    let _ = sim.remove_file(&path);
                }
                b = broker(Arc::new(fs.clone())).await;
            }
        }
    }
    fs.clear();
    let deadline = Instant::now() + Duration::from_secs(60);
    let got = drain(&b, "c", sent.len(), deadline).await;
    let lost: Vec<&String> = sent.iter().filter(|id| !got.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "seed {seed}: {} of {} lost, e.g. {:?}",
        lost.len(),
        sent.len(),
        &lost[..lost.len().min(5)]
    );
    b.shutdown().await.unwrap();
}

/// An anchor request from another node for a link already committed here
/// (late, repeated, or a peer that lies) moves no cursor: the child still
/// gets every record, none skipped to the high watermark. A new link's
/// anchor is written at the high watermark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_anchor_never_moves_a_committed_links_cursor() {
    use narad_broker::fanout::peers::NewLink;
    let b = broker(Arc::new(SimFs::new(11))).await;
    create(&b, "ap", "", 0).await;
    create(&b, "ak", "ap", 0).await;
    let parent = b.topic("ap").unwrap();
    let epoch = narad_broker::fanout::cursor_file::parse_epoch(
        &b.topic("ak").unwrap().parent().unwrap().attach_epoch,
    )
    .unwrap();
    // The child's cursors are stalled behind nothing: produce, and before
    // they copy everything, a peer asks to anchor the committed link.
    produce(&b, "ap", 300).await;
    let link = NewLink {
        parent: "ap".into(),
        incarnation: parent.incarnation(),
        child: "ak".into(),
        epoch,
    };
    let anchored = b.anchor_link_for_peer(link, vec![0, 1, 2]).await.unwrap();
    assert!(anchored.is_empty(), "a committed link re-anchored in {anchored:?}");
    let got = drain(&b, "ak", 300, Instant::now() + Duration::from_secs(20)).await;
    assert_eq!(got.len(), 300, "the child got every record");
    // Another incarnation is not this one's to anchor.
    let stale = NewLink {
        parent: "ap".into(),
        incarnation: parent.incarnation() + 1,
        child: "x".into(),
        epoch: 7,
    };
    assert!(b.anchor_link_for_peer(stale, vec![0]).await.is_err());
    // A link not committed yet: anchored in every partition asked (this
    // single node owns them all), out-of-range ones ignored.
    let fresh = NewLink {
        parent: "ap".into(),
        incarnation: parent.incarnation(),
        child: "z".into(),
        epoch: 9,
    };
    assert_eq!(b.anchor_link_for_peer(fresh, vec![0, 2, 99]).await.unwrap(), vec![0, 2]);
}
