//! Queue consume under read faults: one unreadable partition (a bad
//! sector, a damaged frontier file) never breaks consume of the other
//! partitions, and records already leased by a consume that then fails are
//! given back at once, not stranded until their visibility timeout.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
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
    let mut config = common::config();
    // Small segments and no frame cache: a partition spans several files,
    // and every read goes to the file.
    config.log.segment_bytes = 4096;
    config.log.frame_target_bytes = 1024;
    config.log.cache_bytes = 0;
    Broker::open(config, fs, SystemClock::shared(), metrics).await.unwrap()
}

fn payload(p: u32, i: usize) -> String {
    format!("p{p}-{i:04}-{}", "x".repeat(200))
}

/// The segment files of a partition directory, oldest first.
fn segments(fs: &dyn Fs, dir: &Path) -> Vec<PathBuf> {
    let mut names: Vec<String> = fs
        .list_dir(dir)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n.ends_with(".log"))
        .collect();
    names.sort();
    names.into_iter().map(|n| dir.join(n)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_partition_never_breaks_queue_consume_of_the_others() {
    let sim = SimFs::new(3);
    let fs = FaultFs::new(sim.shared());
    let per = 100;
    {
        let b = broker(Arc::new(fs.clone())).await;
        let req = CreateTopicRequest { name: "q".into(), partitions: 3, ..Default::default() };
        b.create_topic(req).await.unwrap();
        for p in 0..3 {
            let recs = (0..per)
                .map(|i| ProduceRecord {
                    key: None,
                    partition: Some(p),
                    payload: Bytes::from(payload(p, i)),
                })
                .collect();
            b.produce_batch("q", recs).await.unwrap();
        }
        let t = b.topic("q").unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while b.partition_stats(&t, None).iter().any(|s| s.high_watermark < per as u64) {
            assert!(Instant::now() < deadline, "records not committed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        b.shutdown().await.unwrap();
    }
    // Partition 2's frontier file is damaged (one flipped byte).
    let frontier = Path::new("/data/topics/q/p00002/consumer.offset");
    let mut bytes = narad_fs::read_small_file(&sim, frontier, 4096).unwrap_or_default();
    if bytes.is_empty() {
        bytes = vec![0u8; 16];
    }
    bytes[0] ^= 0x01;
    narad_fs::write_file_atomic(&sim, frontier, &bytes).unwrap();

    let b = broker(Arc::new(fs.clone())).await;
    // Open every partition (replay reads from the first file), then make
    // partition 1's second segment unreadable.
    for p in 0..2 {
        b.replay("q", p, 0, 1).await.unwrap();
    }
    let files = segments(&sim, Path::new("/data/topics/q/p00001"));
    assert!(files.len() >= 3, "partition 1 spans several segments: {files:?}");
    fs.add_rule(FaultRule {
        prefix: files[1].clone(),
        fail_writes: false,
        fail_syncs: false,
        fail_reads: true,
    });
    // A pinned consume of the bad partition answers what it could read
    // before the bad sector (given back here) or an error; either way it
    // leaves nothing leased that the caller did not get.
    if let Ok(got) = b.consume("q", Some(1), Duration::ZERO, 100).await {
        assert!(!got.is_empty(), "the first segment is readable");
        for d in got {
            b.resolve("q", d.receipt_handle.as_deref().unwrap(), AckAction::Nack).unwrap();
        }
    }

    // Queue consume serves partition 0 and partition 1's readable prefix.
    let mut seen = HashSet::new();
    for _ in 0..20 {
        let got = b.consume("q", None, Duration::ZERO, 100).await.unwrap();
        for d in got {
            seen.insert(String::from_utf8(d.payload.to_vec()).unwrap());
            b.resolve("q", d.receipt_handle.as_deref().unwrap(), AckAction::Ack).unwrap();
        }
    }
    for i in 0..per {
        assert!(seen.contains(&payload(0, i)), "partition 0 record {i} not delivered");
    }
    let first_of_1 = seen.iter().filter(|s| s.starts_with("p1-")).count();
    assert!(first_of_1 > 0, "partition 1's readable first segment was stranded");

    // The sector is readable again: the rest of partition 1 arrives.
    fs.clear();
    let deadline = Instant::now() + Duration::from_secs(10);
    while (0..per).any(|i| !seen.contains(&payload(1, i))) {
        assert!(Instant::now() < deadline, "partition 1 not fully delivered");
        for d in b.consume("q", None, Duration::from_millis(100), 100).await.unwrap() {
            seen.insert(String::from_utf8(d.payload.to_vec()).unwrap());
            b.resolve("q", d.receipt_handle.as_deref().unwrap(), AckAction::Ack).unwrap();
        }
    }
    b.shutdown().await.unwrap();
}
