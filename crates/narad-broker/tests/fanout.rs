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
use narad_fs::{FaultFs, FaultRule, SimFs};
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
