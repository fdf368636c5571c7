//! The partition fence at the commit boundary (SPEC §7.3): a frozen
//! partition refuses commits as retriable and its high watermark is final
//! from the moment the freeze returns, even with committers running; a
//! partition sealed as moved refuses as "not the owner"; both are
//! refusals to the dispatcher (resolved again, never failing, never
//! rerouted to a sibling), and neither touches another partition.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use narad_broker::dispatch::core::Outcome;
use narad_broker::fence::PartitionKey;
use narad_broker::metrics::BrokerMetrics;
use narad_broker::owner::{BatchRecord, CommitBatch, CommitError, LocalOwner};
use narad_broker::topics::Topics;
use narad_clock::ManualClock;
use narad_fs::SimFs;
use narad_log::LogConfig;
use narad_meta::{CreateTopicRequest, MetaStore, MetaStoreOptions, TopicDefaults};
use prometheus_client::registry::Registry;

fn setup() -> (Arc<MetaStore>, Arc<Topics>, Arc<LocalOwner>) {
    let fs = SimFs::new(1);
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let data = Path::new("/data");
    let options = MetaStoreOptions {
        defaults: TopicDefaults::default(),
        clock: clock.clone(),
        rng_seed: Some(1),
    };
    let meta = Arc::new(MetaStore::open(&fs, data, options).unwrap());
    let topics = Arc::new(Topics::new(fs.shared(), data, LogConfig::default(), clock));
    let metrics = Arc::new(BrokerMetrics::new(&mut Registry::default()));
    let owner = Arc::new(LocalOwner::new(meta.clone(), topics.clone(), metrics));
    let req = CreateTopicRequest { name: "t".into(), partitions: 3, ..Default::default() };
    meta.create_topic(req).unwrap();
    (meta, topics, owner)
}

fn batch(partition: u32, payload: &'static [u8]) -> CommitBatch {
    let record = BatchRecord {
        incarnation: None,
        key: None,
        payload: Bytes::from_static(payload),
        accepted_at_ms: 0,
    };
    CommitBatch { topic: "t".into(), partition, records: vec![record] }
}

fn hwm(meta: &MetaStore, topics: &Topics, p: u32) -> u64 {
    topics.partition(&meta.topic("t").unwrap(), p).unwrap().log.high_watermark()
}

#[test]
fn a_frozen_partition_refuses_commits_as_retriable_until_it_is_unfrozen() {
    let (meta, topics, owner) = setup();
    for _ in 0..3 {
        owner.commit_blocking(batch(0, b"before")).unwrap();
    }
    assert_eq!(owner.freeze("t", 0, "n4", 30_000).unwrap(), 3, "the high watermark at rest");
    let err = owner.commit_blocking(batch(0, b"during")).unwrap_err();
    assert!(matches!(&err, CommitError::Frozen(why) if why.contains("n4")), "{err:?}");
    assert_eq!(err.outcome(), Outcome::Refused, "the owner answered: not failing");
    // Another partition of the topic commits as before.
    owner.commit_blocking(batch(1, b"elsewhere")).unwrap();
    assert_eq!(hwm(&meta, &topics, 0), 3);
    // A retried freeze by the same mover answers the same watermark; a
    // freeze by another is refused.
    assert_eq!(owner.freeze("t", 0, "n4", 60_000).unwrap(), 3);
    assert!(owner.freeze("t", 0, "n5", 60_000).is_err());
    let key = PartitionKey::new("t", meta.topic("t").unwrap().incarnation(), 0);
    assert!(owner.fences().unfreeze(&key, "n4"));
    let out = owner.commit_blocking(batch(0, b"after")).unwrap();
    assert_eq!(out.offsets().collect::<Vec<_>>(), vec![3]);
}

#[test]
fn a_partition_sealed_as_moved_refuses_commits_as_not_the_owner() {
    let (meta, _topics, owner) = setup();
    let key = PartitionKey::new("t", meta.topic("t").unwrap().incarnation(), 2);
    owner.freeze("t", 2, "n4", 30_000).unwrap();
    owner.fences().seal_moved(&key, "n4");
    let err = owner.commit_blocking(batch(2, b"late")).unwrap_err();
    assert!(matches!(&err, CommitError::NotOwner(why) if why.contains("moved to n4")), "{err:?}");
    assert_eq!(err.outcome(), Outcome::Refused);
    assert!(!owner.fences().unfreeze(&key, "n4"), "a move that flipped stays flipped");
}

#[test]
fn no_commit_lands_after_a_freeze_returns_even_with_committers_running() {
    let (meta, topics, owner) = setup();
    let stop = Arc::new(AtomicBool::new(false));
    let frozen_answers = Arc::new(AtomicU64::new(0));
    let committers: Vec<_> = (0..4)
        .map(|_| {
            let (owner, stop, frozen) = (owner.clone(), stop.clone(), frozen_answers.clone());
            std::thread::spawn(move || {
                let mut committed = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    match owner.commit_blocking(batch(0, b"load")) {
                        Ok(_) => committed += 1,
                        Err(CommitError::Frozen(_)) => {
                            frozen.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                }
                committed
            })
        })
        .collect();
    // Let the committers run, then freeze under them.
    while hwm(&meta, &topics, 0) < 200 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let at_rest = owner.freeze("t", 0, "n4", 30_000).unwrap();
    while frozen_answers.load(Ordering::SeqCst) < 100 {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(hwm(&meta, &topics, 0), at_rest, "nothing committed after the freeze returned");
    stop.store(true, Ordering::SeqCst);
    let committed: u64 = committers.into_iter().map(|c| c.join().unwrap()).sum();
    assert_eq!(committed, at_rest, "every commit that succeeded is below the frozen watermark");
}

mod common;

/// A partition whose move flipped away is a leftover here: a consume takes
/// nothing from it (the others are served), an ack of a lease taken before
/// and a replay answer 421 naming the new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_partition_is_not_served_by_the_node_it_left() {
    use narad_broker::{AckAction, Broker, ProduceRecord};
    let fs = SimFs::new(5);
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let metrics = Arc::new(BrokerMetrics::new(&mut Registry::default()));
    let b = Broker::open(common::config(), fs.shared(), clock, metrics).await.unwrap();
    let req = CreateTopicRequest { name: "t".into(), partitions: 3, ..Default::default() };
    b.create_topic(req).await.unwrap();
    for p in 0..3 {
        let r = ProduceRecord { key: None, partition: Some(p), payload: Bytes::from_static(b"x") };
        b.produce_batch("t", vec![r.clone(), r]).await.unwrap();
    }
    // Lease one record of partition 0, so its handle outlives the move.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let leased = loop {
        let got = b.consume("t", Some(0), Duration::ZERO, 1).await.unwrap();
        if let Some(d) = got.into_iter().next() {
            break d;
        }
        assert!(std::time::Instant::now() < deadline, "partition 0 never served");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let t = b.topic("t").unwrap();
    b.fences().seal_moved(&PartitionKey::new("t", t.incarnation(), 0), "n4");
    assert_eq!(b.moved_away(&t, 0).as_deref(), Some("n4"));

    let handle = leased.receipt_handle.clone().unwrap();
    let err = b.resolve("t", &handle, AckAction::Ack).unwrap_err();
    assert_eq!(
        (err.status(), err.to_string()),
        (421, "not partition owner: partition 0 moved to n4".into())
    );
    assert_eq!(b.replay("t", 0, 0, 10).await.unwrap_err().status(), 421);
    assert!(b.consume("t", Some(0), Duration::ZERO, 10).await.unwrap().is_empty());
    // The other partitions are served as before: all four of their records.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut others = Vec::new();
    while others.len() < 4 {
        assert!(std::time::Instant::now() < deadline, "{others:?}");
        let got = b.consume("t", None, Duration::ZERO, 10).await.unwrap();
        assert!(got.iter().all(|d| d.partition != 0), "{got:?}");
        others.extend(got);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    b.shutdown().await.unwrap();
}
