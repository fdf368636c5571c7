//! The storage histograms through the broker, in process: every open
//! partition's retention pass is timed, and commit cycles are timed on the
//! partition that committed (the black-box test in `narad/tests/http_api.rs`
//! covers the cycle and frontier series over HTTP).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_broker::metrics::BrokerMetrics;
use narad_broker::{Broker, ProduceRecord};
use narad_clock::SystemClock;
use narad_fs::SimFs;
use narad_meta::CreateTopicRequest;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

mod common;

fn count(text: &str, family: &str, topic: &str, partition: u32) -> Option<f64> {
    let prefix = format!("{family}_count{{topic=\"{topic}\",partition=\"{partition}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_passes_and_commit_cycles_are_timed_per_partition() {
    let fs = SimFs::new(7);
    let config = common::config();
    let mut registry = Registry::with_prefix("narad");
    let metrics = Arc::new(BrokerMetrics::new(&mut registry));
    let b = Broker::open(config, fs.shared(), SystemClock::shared(), metrics).await.unwrap();
    let req = CreateTopicRequest { name: "t".into(), partitions: 3, ..Default::default() };
    b.create_topic(req).await.unwrap();
    let rec = ProduceRecord { key: None, partition: Some(2), payload: Bytes::from_static(b"x") };
    b.produce_batch("t", vec![rec]).await.unwrap();
    // Wait until the record is committed on partition 2.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    while got.is_empty() && Instant::now() < deadline {
        got = b.consume("t", Some(2), Duration::from_millis(200), 1).await.unwrap();
    }
    assert_eq!(got.len(), 1, "the record was committed");

    let b2 = b.clone();
    tokio::task::spawn_blocking(move || b2.enforce_retention()).await.unwrap();
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    assert_eq!(
        count(&text, "narad_storage_retention_run_duration_seconds", "t", 2),
        Some(1.0),
        "{text}"
    );
    assert_eq!(count(&text, "narad_storage_flush_duration_seconds", "t", 2), Some(1.0), "{text}");
    assert_eq!(count(&text, "narad_storage_fsync_duration_seconds", "t", 2), Some(1.0), "{text}");
    // Partition 0 never committed: no cycle series.
    assert_eq!(count(&text, "narad_storage_flush_duration_seconds", "t", 0), None, "{text}");
}
