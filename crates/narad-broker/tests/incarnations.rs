//! Records accepted for a topic incarnation never commit into another one:
//! the owner refuses them (so the dispatcher puts them back in the WAL) and
//! the resolver discards them once the incarnation is gone. And a log
//! closed as idle is never one a committer still holds (a refused commit
//! there would look like a deleted topic). The frontier pass picks exactly
//! the partitions whose consumer frontier moved.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use narad_broker::consume::take::take;
use narad_broker::metrics::BrokerMetrics;
use narad_broker::owner::{BatchRecord, CommitBatch, CommitError, LocalOwner};
use narad_broker::topics::{Topics, shard_limits};
use narad_clock::ManualClock;
use narad_fs::{Fs, SimFs};
use narad_log::LogConfig;
use narad_meta::{CreateTopicRequest, MetaStore, MetaStoreOptions, TopicDefaults};
use prometheus_client::registry::Registry;

fn setup() -> (Arc<MetaStore>, Arc<Topics>, Arc<LocalOwner>) {
    let fs = SimFs::new(1);
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let data = Path::new("/data");
    let meta = Arc::new(
        MetaStore::open(
            &fs,
            data,
            MetaStoreOptions {
                defaults: TopicDefaults::default(),
                clock: clock.clone(),
                rng_seed: Some(1),
            },
        )
        .unwrap(),
    );
    let topics = Arc::new(Topics::new(fs.shared(), data, LogConfig::default(), clock));
    let metrics = Arc::new(BrokerMetrics::new(&mut Registry::default()));
    let owner = Arc::new(LocalOwner::new(meta.clone(), topics.clone(), metrics));
    (meta, topics, owner)
}

fn create(meta: &MetaStore, name: &str) -> u64 {
    let req = CreateTopicRequest { name: name.into(), ..Default::default() };
    meta.create_topic(req).unwrap().incarnation()
}

fn batch(topic: &str, incarnation: Option<u64>, payload: &'static [u8]) -> CommitBatch {
    CommitBatch {
        topic: topic.into(),
        partition: 0,
        records: vec![BatchRecord {
            incarnation,
            key: None,
            payload: Bytes::from_static(payload),
            accepted_at_ms: 0,
        }],
    }
}

#[test]
fn an_old_incarnation_is_refused_by_the_owner_and_nothing_lands_in_the_new_topic() {
    let (meta, topics, owner) = setup();
    let old = create(&meta, "t");
    owner.commit_blocking(batch("t", Some(old), b"before")).unwrap();
    meta.delete_topic("t").unwrap();
    topics.remove("t", old).unwrap();
    let new = create(&meta, "t");
    assert_ne!(old, new);
    let err = owner.commit_blocking(batch("t", Some(old), b"stale")).unwrap_err();
    assert!(matches!(err, CommitError::Refused(_)), "{err:?}");
    owner.commit_blocking(batch("t", Some(new), b"fresh")).unwrap();
    let t = meta.topic("t").unwrap();
    let part = topics.partition(&t, 0).unwrap();
    let got = part.log.read(0, 10, u64::MAX).unwrap();
    let payloads: Vec<&[u8]> = got.records.iter().map(|r| &r.payload[..]).collect();
    assert_eq!(
        payloads,
        vec![&b"fresh"[..]],
        "the old topic's files were purged and the stale record refused"
    );
}

#[test]
fn a_deleted_topic_is_refused_not_failed() {
    let (meta, _topics, owner) = setup();
    let id = create(&meta, "gone");
    meta.delete_topic("gone").unwrap();
    let err = owner.commit_blocking(batch("gone", Some(id), b"x")).unwrap_err();
    assert!(matches!(err, CommitError::Refused(_)), "{err:?}");
}

#[test]
fn leftover_files_of_an_earlier_incarnation_are_cleared_before_the_name_is_reused() {
    let (meta, topics, owner) = setup();
    let old = create(&meta, "t");
    owner.commit_blocking(batch("t", Some(old), b"old data")).unwrap();
    // The metastore forgets the topic, but the purge never ran (a crash).
    meta.delete_topic("t").unwrap();
    let new = create(&meta, "t");
    owner.commit_blocking(batch("t", Some(new), b"new data")).unwrap();
    let t = meta.topic("t").unwrap();
    let part = topics.partition(&t, 0).unwrap();
    let got = part.log.read(0, 10, u64::MAX).unwrap();
    let payloads: Vec<&[u8]> = got.records.iter().map(|r| &r.payload[..]).collect();
    assert_eq!(payloads, vec![&b"new data"[..]]);
}

/// An idle log that a committer (or reader) still holds is not closed under
/// it: its next commit would otherwise fail as if the topic were deleted,
/// and the dispatcher would drop the records. Once released, it closes, and
/// the next commit reopens it.
#[test]
fn an_idle_log_is_not_closed_while_someone_holds_it() {
    let (meta, topics, owner) = setup();
    let inc = create(&meta, "t");
    let retention = |_: &narad_broker::topics::TopicRt| Some(0);
    let t = meta.topic("t").unwrap();
    let held = topics.partition(&t, 0).unwrap();
    // The manual clock never moves: idle for 0 ms is idle.
    assert_eq!(topics.evict_idle(0, &retention), 0, "held by a caller");
    let log = held.log.clone();
    drop(held);
    assert_eq!(topics.evict_idle(0, &retention), 0, "its log is still held");
    drop(log);
    assert_eq!(topics.evict_idle(0, &retention), 1);
    assert_eq!(topics.open_logs(), 0);
    owner.commit_blocking(batch("t", Some(inc), b"after")).unwrap();
    let got = topics.partition(&t, 0).unwrap().log.read(0, 10, u64::MAX).unwrap();
    assert_eq!(got.records.len(), 1);
}

/// The frontier pass (every 100 ms) looks only at partitions whose frontier
/// moved: an idle one is not picked, an acked one is picked until its
/// frontier is persisted, and one whose shard someone holds is picked (the
/// pass never skips a partition it could not look at).
#[test]
fn the_frontier_pass_picks_exactly_the_partitions_whose_frontier_moved() {
    let (meta, topics, owner) = setup();
    let inc = create(&meta, "t");
    owner.commit_blocking(batch("t", Some(inc), b"one")).unwrap();
    let t = meta.topic("t").unwrap();
    let part = topics.partition(&t, 0).unwrap();
    let rt = topics.get_open("t", inc).unwrap();
    let picked = |rt: &narad_broker::topics::TopicRt| rt.frontier_dirty_partitions().len();
    assert_eq!(picked(&rt), 0, "nothing consumed yet");
    let limits = shard_limits(&t);
    let leased = take("t", &part, &limits, 1_000, 10, 1 << 20).leased;
    assert_eq!(leased.len(), 1);
    assert_eq!(picked(&rt), 0, "a lease does not move the frontier");
    {
        let mut g = part.shard().unwrap();
        let s = g.as_mut().unwrap();
        s.ack(leased[0].record.offset, leased[0].nonce, 1_000, &limits).unwrap();
        assert_eq!(picked(&rt), 1, "a held shard counts as moved");
    }
    assert_eq!(picked(&rt), 1, "the ack moved the frontier");
    assert!(part.persist_frontier().unwrap());
    assert_eq!(picked(&rt), 0, "persisted");
    assert!(!part.persist_frontier().unwrap());
}

/// The frontier pass skips its look at the partitions while the node-wide
/// count of frontier moves stands still: every move must change it, and
/// nothing that moves no frontier may (or an idle node would look again).
#[test]
fn every_consumer_frontier_move_changes_the_count_the_frontier_pass_checks() {
    let (meta, topics, owner) = setup();
    let inc = create(&meta, "t");
    owner.commit_blocking(batch("t", Some(inc), b"one")).unwrap();
    owner.commit_blocking(batch("t", Some(inc), b"two")).unwrap();
    let t = meta.topic("t").unwrap();
    let part = topics.partition(&t, 0).unwrap();
    let limits = shard_limits(&t);
    let before = topics.frontier_moves();
    let leased = take("t", &part, &limits, 1_000, 10, 1 << 20).leased;
    assert_eq!(leased.len(), 2);
    assert_eq!(topics.frontier_moves(), before, "leasing moves no frontier");
    let ack = |i: usize| {
        let mut g = part.shard().unwrap();
        g.as_mut().unwrap().ack(leased[i].record.offset, leased[i].nonce, 1_000, &limits).unwrap()
    };
    assert!(!ack(1), "acked ahead");
    assert_eq!(topics.frontier_moves(), before);
    assert!(ack(0));
    let moved = topics.frontier_moves();
    assert!(moved > before, "the ack moved the frontier");
    assert!(part.persist_frontier().unwrap());
    assert_eq!(topics.frontier_moves(), moved, "persisting is not a move");
}

fn payloads(topics: &Topics, t: &narad_meta::Topic) -> Vec<Vec<u8>> {
    let part = topics.partition(t, 0).unwrap();
    let got = part.log.read(0, 100, u64::MAX).unwrap();
    got.records.iter().map(|r| r.payload.to_vec()).collect()
}

/// The callers that open a topic hold the record they read a moment
/// earlier: the dispatcher's commit (checked, then opens the partition),
/// the first consume on this node, a replay reopening an idle log, a
/// fan-out cursor opening its parent. When the topic was deleted and
/// recreated in that moment, their open must be refused, not close the new
/// incarnation and clear its directory (committed records included).
#[test]
fn a_caller_holding_the_old_incarnation_never_wipes_the_recreated_topic() {
    let (meta, topics, owner) = setup();
    let old = create(&meta, "t");
    owner.commit_blocking(batch("t", Some(old), b"old")).unwrap();
    let stale = meta.topic("t").unwrap(); // read by a caller, before the delete
    meta.delete_topic("t").unwrap();
    topics.remove("t", old).unwrap();
    let new = create(&meta, "t");
    owner.commit_blocking(batch("t", Some(new), b"fresh")).unwrap();
    // The stale caller reaches the open now: a commit or a replay, or a
    // first consume or a cursor opening its parent.
    let partition_open = topics.partition(&stale, 0).map(drop);
    let topic_open = topics.topic(&stale).map(drop);
    let t = meta.topic("t").unwrap();
    assert_eq!(payloads(&topics, &t), vec![b"fresh".to_vec()]);
    assert!(partition_open.is_err() && topic_open.is_err(), "opens of a deleted incarnation");
    // Not even the files of a newer incarnation nobody opened yet are
    // touched by the stale caller.
    meta.delete_topic("t").unwrap();
    topics.remove("t", new).unwrap();
    let newer = create(&meta, "t");
    owner.commit_blocking(batch("t", Some(newer), b"newer")).unwrap();
    let t = meta.topic("t").unwrap();
    assert!(topics.partition(&stale, 0).is_err());
    assert_eq!(payloads(&topics, &t), vec![b"newer".to_vec()]);
}

/// A delete removes the incarnation it deleted: when the name was
/// recreated (and committed to) before the delete got to the files, the
/// new topic keeps them.
#[test]
fn deleting_an_incarnation_never_removes_a_newer_one() {
    let (meta, topics, owner) = setup();
    let old = create(&meta, "t");
    owner.commit_blocking(batch("t", Some(old), b"old")).unwrap();
    let deleted = meta.delete_topic("t").unwrap();
    assert_eq!(deleted.incarnation(), old);
    let new = create(&meta, "t");
    owner.commit_blocking(batch("t", Some(new), b"fresh")).unwrap();
    topics.remove("t", old).unwrap(); // the delete of `old` gets to the files now
    let t = meta.topic("t").unwrap();
    assert_eq!(payloads(&topics, &t), vec![b"fresh".to_vec()]);
}

/// The frontier pass takes its list of partitions at its start; a topic
/// deleted and recreated meanwhile must not receive the old incarnation's
/// consumer frontier (its consumers would start past records never
/// delivered).
#[test]
fn a_frontier_pass_that_outlives_a_delete_never_moves_the_recreated_topics_frontier() {
    let (meta, topics, owner) = setup();
    let old = create(&meta, "t");
    for p in [b"o1", b"o2", b"o3"] {
        owner.commit_blocking(batch("t", Some(old), p)).unwrap();
    }
    let t = meta.topic("t").unwrap();
    let part = topics.partition(&t, 0).unwrap();
    let limits = shard_limits(&t);
    let leased = take("t", &part, &limits, 1_000, 10, 1 << 20).leased;
    assert_eq!(leased.len(), 3);
    {
        let mut g = part.shard().unwrap();
        for l in &leased {
            g.as_mut().unwrap().ack(l.record.offset, l.nonce, 1_000, &limits).unwrap();
        }
    }
    drop(part);
    // The pass starts: it lists the moved partitions.
    let pass: Vec<_> = topics.all().iter().flat_map(|rt| rt.frontier_dirty_partitions()).collect();
    assert_eq!(pass.len(), 1);
    meta.delete_topic("t").unwrap();
    topics.remove("t", old).unwrap();
    let new = create(&meta, "t");
    for p in [b"n1", b"n2", b"n3", b"n4", b"n5"] {
        owner.commit_blocking(batch("t", Some(new), p)).unwrap();
    }
    // The pass goes on with what it listed.
    for part in &pass {
        let _ = part.persist_frontier();
    }
    drop(pass);
    let t = meta.topic("t").unwrap();
    let part = topics.partition(&t, 0).unwrap();
    let leased = take("t", &part, &shard_limits(&t), 2_000, 10, 1 << 20).leased;
    let got: Vec<&[u8]> = leased.iter().map(|l| &l.record.payload[..]).collect();
    assert_eq!(got, vec![&b"n1"[..], b"n2", b"n3", b"n4", b"n5"]);
}

/// At startup, a topic directory whose marker names a newer incarnation
/// than the metastore's (a metastore rolled back) is neither opened nor
/// cleared: the start is refused, naming the directory.
#[test]
fn startup_refuses_files_of_a_newer_incarnation_than_the_metastore_knows() {
    let (meta, topics, owner) = setup();
    let inc = create(&meta, "t");
    owner.commit_blocking(batch("t", Some(inc), b"kept")).unwrap();
    let t = meta.topic("t").unwrap();
    let fs = SimFs::new(1);
    let data = Path::new("/data");
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let marker = narad_broker::topics::encode_marker(inc + 100);
    let fresh = Topics::new(fs.shared(), data, LogConfig::default(), clock);
    fs.create_dir_all(&data.join("topics/t")).unwrap();
    narad_fs::write_file_atomic(&fs, &data.join("topics/t/incarnation"), &marker).unwrap();
    let err = fresh.open_at_startup(std::slice::from_ref(&t), false).unwrap_err().to_string();
    assert!(err.contains("/data/topics/t") && err.contains("newer incarnation"), "{err}");
    assert!(fs.exists(&data.join("topics/t/incarnation")).unwrap(), "left alone");
    drop(topics);
}
