//! A partition moves between two brokers through the broker's move steps
//! (SPEC §7.3), as the node drives them over RPC: list and copy chunks
//! while the source takes commits, freeze, copy the tail, install on the
//! destination with the consumer frontier. The destination serves exactly
//! the records the source had not acked (leases are not moved: leased but
//! unacked records come back at once, duplicates never loss), continues
//! the offsets, and the source, sealed, serves the partition no more.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_broker::metrics::BrokerMetrics;
use narad_broker::{AckAction, Broker, ProduceRecord};
use narad_clock::ManualClock;
use narad_fs::SimFs;
use narad_log::LogConfig;
use narad_meta::CreateTopicRequest;
use prometheus_client::registry::Registry;

mod common;

async fn open(seed: u64) -> Arc<Broker> {
    let fs = SimFs::new(seed);
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let metrics = Arc::new(BrokerMetrics::new(&mut Registry::default()));
    let mut config = common::config();
    // Small segments: the copy crosses several.
    config.log = LogConfig { segment_bytes: 4096, ..LogConfig::default() };
    let b = Broker::open(config, fs.shared(), clock, metrics).await.unwrap();
    let req = CreateTopicRequest { name: "t".into(), partitions: 3, ..Default::default() };
    b.create_topic(req).await.unwrap();
    b
}

async fn produce(b: &Broker, from: usize, to: usize) {
    let records = (from..to)
        .map(|i| ProduceRecord {
            key: None,
            partition: Some(0),
            payload: Bytes::from(format!("record-{i:04}-{}", "p".repeat(i % 90))),
        })
        .collect();
    b.produce_batch("t", records).await.unwrap();
}

async fn wait_hwm(b: &Broker, inc: u64, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while b.move_listing("t", inc, 0).await.unwrap().high_watermark < want {
        assert!(Instant::now() < deadline, "partition 0 never reached {want}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Copies whatever of the source's segments the copy does not hold yet.
async fn copy_round(src: &Broker, src_inc: u64, copy: &mut narad_log::copy::IncomingCopy) -> u64 {
    let mut copied = 0;
    for s in src.move_listing("t", src_inc, 0).await.unwrap().segments {
        loop {
            let at = copy.written(s.base);
            let chunk = src.move_chunk("t", src_inc, 0, s.base, at, 1024).await.unwrap();
            if chunk.is_empty() {
                break;
            }
            copy.write(s.base, at, &chunk).unwrap();
            copied += chunk.len() as u64;
        }
    }
    copied
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_partition_serves_what_the_source_had_not_acked_and_continues_its_offsets() {
    let (src, dst) = (open(1).await, open(2).await);
    let (src_inc, dst_inc) =
        (src.topic("t").unwrap().incarnation(), dst.topic("t").unwrap().incarnation());
    produce(&src, 0, 300).await;
    wait_hwm(&src, src_inc, 300).await;
    // Lease 20 records and ack the first 10: the frontier is offset 9.
    let mut leased = Vec::new();
    while leased.len() < 20 {
        let got = src.consume("t", Some(0), Duration::ZERO, 20 - leased.len()).await.unwrap();
        leased.extend(got);
    }
    for d in &leased[..10] {
        src.resolve("t", d.receipt_handle.as_deref().unwrap(), AckAction::Ack).unwrap();
    }

    // First round while the source still takes commits.
    let mut copy = dst.move_stage("t", dst_inc, 0).await.unwrap();
    let first = copy_round(&src, src_inc, &mut copy).await;
    assert!(first > 4096, "the first round crossed segments: {first} bytes");
    produce(&src, 300, 350).await;
    wait_hwm(&src, src_inc, 350).await;
    // Freeze, then the tail.
    let frozen = src.move_freeze("t", src_inc, 0, "n2", u64::MAX).await.unwrap();
    assert_eq!((frozen.high_watermark, frozen.consumer_frontier), (350, Some(9)));
    let tail = copy_round(&src, src_inc, &mut copy).await;
    assert!(tail > 0, "the tail round copied what came after the first");
    let oldest = src.move_listing("t", src_inc, 0).await.unwrap().oldest;
    dst.move_install("t", dst_inc, 0, copy, oldest, frozen).await.unwrap();
    src.move_seal("t", src_inc, 0, "n2");

    // The destination serves offsets 10..350, each once, with the source's
    // payloads; then new records continue at 350.
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < 340 {
        assert!(Instant::now() < deadline, "{} records served", got.len());
        let more = dst.consume("t", Some(0), Duration::ZERO, 100).await.unwrap();
        for d in &more {
            dst.resolve("t", d.receipt_handle.as_deref().unwrap(), AckAction::Ack).unwrap();
        }
        got.extend(more);
    }
    let offsets: Vec<u64> = got.iter().map(|d| d.offset).collect();
    assert_eq!(offsets, (10..350).collect::<Vec<u64>>());
    for d in &got {
        let i = d.offset as usize;
        assert_eq!(d.payload, Bytes::from(format!("record-{i:04}-{}", "p".repeat(i % 90))));
    }
    produce(&dst, 350, 351).await;
    wait_hwm(&dst, dst_inc, 351).await;
    // The source serves it no more.
    assert_eq!(src.replay("t", 0, 0, 10).await.unwrap_err().status(), 421);
    src.shutdown().await.unwrap();
    dst.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_missed_the_tail_is_refused_and_the_destination_holds_nothing() {
    let (src, dst) = (open(3).await, open(4).await);
    let (src_inc, dst_inc) =
        (src.topic("t").unwrap().incarnation(), dst.topic("t").unwrap().incarnation());
    produce(&src, 0, 100).await;
    wait_hwm(&src, src_inc, 100).await;
    let mut copy = dst.move_stage("t", dst_inc, 0).await.unwrap();
    copy_round(&src, src_inc, &mut copy).await;
    produce(&src, 100, 120).await;
    wait_hwm(&src, src_inc, 120).await;
    let frozen = src.move_freeze("t", src_inc, 0, "n2", u64::MAX).await.unwrap();
    // No tail round: the copy ends at 100, the source at 120.
    let e = dst.move_install("t", dst_inc, 0, copy, 0, frozen).await.unwrap_err();
    assert!(e.to_string().contains("ends at offset 100"), "{e}");
    assert_eq!(dst.move_listing("t", dst_inc, 0).await.unwrap().high_watermark, 0);
    // The move is aborted: the source takes commits again.
    assert!(src.move_unfreeze("t", src_inc, 0, "n2"));
    produce(&src, 120, 121).await;
    wait_hwm(&src, src_inc, 121).await;
    // A step on another incarnation is refused.
    assert_eq!(src.move_listing("t", src_inc + 1, 0).await.unwrap_err().status(), 404);
    src.shutdown().await.unwrap();
    dst.shutdown().await.unwrap();
}

/// A metastore "replicated" through itself: every proposal applies at once
/// as a committed entry (the cluster's apply path, without Raft).
#[derive(Debug, Default)]
struct Loopback {
    meta: std::sync::OnceLock<std::sync::Weak<narad_meta::MetaStore>>,
}

impl narad_meta::Replicator for Loopback {
    fn replicate(
        &self,
        command: narad_meta::Command,
    ) -> Result<narad_meta::Response, narad_meta::MetaError> {
        let meta = self.meta.get().and_then(std::sync::Weak::upgrade).expect("the store is open");
        match meta.apply_entry(Some(&command), b"{}") {
            Ok(Some(answer)) => answer,
            Ok(None) => unreachable!("a command answers"),
            Err(e) => Err(narad_meta::MetaError::Unavailable(e.to_string())),
        }
    }
}

async fn open_replicated(fs: &SimFs) -> Arc<Broker> {
    // The real clock: the dispatcher's refusal back-off must run out.
    let clock = narad_clock::SystemClock::shared();
    let metrics = Arc::new(BrokerMetrics::new(&mut Registry::default()));
    let config = common::config();
    let meta = Broker::open_meta(&config, fs.shared(), clock.clone()).await.unwrap();
    let loopback = Arc::new(Loopback::default());
    loopback.meta.set(Arc::downgrade(&meta)).unwrap();
    meta.set_replicator(loopback);
    let (registration, routing) = (narad_broker::Registration::Now, narad_broker::Routing::Local);
    Broker::open_on(config, fs.shared(), clock, metrics, meta, registration, routing).await.unwrap()
}

/// The committed high watermark of partition 0 stays `at` for a while (the
/// dispatcher keeps offering the record that was produced meanwhile).
async fn stays(b: &Broker, inc: u64, at: u64) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.move_listing("t", inc, 0).await.unwrap().high_watermark, at);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sources_fence_follows_the_metastore_and_a_restart_keeps_a_moving_partition_frozen() {
    let fs = SimFs::new(9);
    let b = open_replicated(&fs).await;
    let meta = b.meta().clone();
    let n2 = narad_meta::Member {
        id: "n2".into(),
        addr: "127.0.0.1:2".into(),
        cluster_addr: None,
        status: narad_meta::MemberStatus::Alive,
        last_heartbeat: 1_700_000_000,
        draining: false,
    };
    meta.member_join(n2.clone()).unwrap();
    let req = CreateTopicRequest { name: "t".into(), partitions: 3, ..Default::default() };
    b.create_topic(req).await.unwrap();
    let inc = b.topic("t").unwrap().incarnation();
    assert_eq!(meta.snapshot().assignment("t", 0).unwrap().owner_id, "n1");
    produce(&b, 0, 10).await;
    wait_hwm(&b, inc, 10).await;

    // A partition of n2's is not read here (listing or reading it would
    // create an empty log of it on this node): n2 heartbeats now, and a
    // topic created now has partitions on it.
    let now_s =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
            as i64;
    meta.member_join(narad_meta::Member { last_heartbeat: now_s, ..n2 }).unwrap();
    let req = CreateTopicRequest { name: "u".into(), partitions: 3, ..Default::default() };
    b.create_topic(req).await.unwrap();
    let u_inc = b.topic("u").unwrap().incarnation();
    let theirs = (0..3)
        .find(|&p| meta.snapshot().assignment("u", p).is_some_and(|a| a.owner_id == "n2"))
        .expect("placement gives n2 a partition of u");
    let e = b.move_listing("u", u_inc, theirs).await.unwrap_err();
    assert_eq!(e.status(), 421, "{e}");
    let e = b.move_chunk("u", u_inc, theirs, 0, 0, 4096).await.unwrap_err();
    assert_eq!(e.status(), 421, "{e}");

    // Only the move the metastore shows may freeze the partition.
    let e = b.move_freeze("t", inc, 0, "n2", u64::MAX).await.unwrap_err();
    assert!(e.to_string().contains("does not show partition 0"), "{e}");
    meta.set_assignment_target("t", inc, 0, "n1", "n2").unwrap();
    assert!(b.move_freeze("t", inc, 0, "n3", u64::MAX).await.is_err(), "not the target");
    assert_eq!(b.move_freeze("t", inc, 0, "n2", u64::MAX).await.unwrap().high_watermark, 10);
    produce(&b, 10, 11).await;
    stays(&b, inc, 10).await;
    // The abort applies: the freeze lifts and the held record commits.
    meta.abort_move("t", inc, 0, "n2", None).unwrap();
    wait_hwm(&b, inc, 11).await;

    // A move in flight survives a restart of its source frozen: nothing
    // commits into partition 0 until the move ends.
    meta.set_assignment_target("t", inc, 0, "n1", "n2").unwrap();
    b.shutdown().await.unwrap();
    drop((b, meta));
    let b = open_replicated(&fs).await;
    let meta = b.meta().clone();
    assert_eq!(b.move_listing("t", inc, 0).await.unwrap().high_watermark, 11);
    produce(&b, 11, 12).await;
    stays(&b, inc, 11).await;
    // The mover renews its freeze and completes: the partition is sealed.
    b.move_freeze("t", inc, 0, "n2", u64::MAX).await.unwrap();
    meta.complete_move("t", inc, 0, "n1", "n2", None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while b.replay("t", 0, 0, 1).await.err().map(|e| e.status()) != Some(421) {
        assert!(Instant::now() < deadline, "partition 0 never sealed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Another partition commits as before.
    let r = ProduceRecord { key: None, partition: Some(1), payload: Bytes::from_static(b"y") };
    b.produce_batch("t", vec![r]).await.unwrap();
    b.shutdown().await.unwrap();
}
