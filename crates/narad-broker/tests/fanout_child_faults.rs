//! Fan-out cursors against a child partition whose commits fail or whose
//! owner is dead (issue 34), driven in process with a fake owner and a fake
//! view of owners over real partition logs on a simulated disk.
//!
//! The bug: a cursor committed its slab one child partition after another;
//! when one partition kept failing it gave up the whole slab and sent it
//! again from the start, regrouping keyless records each time. The groups
//! that had committed were committed again (300 parent records became
//! 5,600 child records in 150 s with one dead owner), and the partitions
//! after the failing one got nothing. The fix keeps the pending slab,
//! retries only the groups that did not commit, and never regroups them.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_broker::dispatch::core::{OwnerId, Topology};
use narad_broker::fanout::{FanoutCtx, FanoutLabels, FanoutRunner};
use narad_broker::metrics::BrokerMetrics;
use narad_broker::owner::{BatchRecord, CommitBatch, CommitError, CommitFuture, LocalOwner, Owner};
use narad_broker::partition::keyed_partition;
use narad_broker::topics::Topics;
use narad_clock::SystemClock;
use narad_fs::SimFs;
use narad_log::LogConfig;
use narad_meta::{CreateTopicRequest, MetaStore, MetaStoreOptions, TopicDefaults};
use prometheus_client::registry::Registry;

const CHILD: &str = "c";
const CHILD_PARTITIONS: u32 = 3;
/// The child partition whose commits fail (or whose owner is dead).
const BAD: u32 = 1;

/// The owner: commits into this process's logs, except into the child's
/// partitions listed in `failing`, which fail.
#[derive(Debug)]
struct FaultyOwner {
    local: Arc<LocalOwner>,
    failing: Mutex<HashSet<u32>>,
}

impl Owner for FaultyOwner {
    fn commit(&self, owner: OwnerId, batch: CommitBatch) -> CommitFuture {
        let failing = self.failing.lock().unwrap().contains(&batch.partition);
        if &*batch.topic == CHILD && failing {
            let why = format!("injected failure of {CHILD}/{}", batch.partition);
            return Box::pin(async move { Err(CommitError::Failed(why)) });
        }
        self.local.commit(owner, batch)
    }

    fn max_batch_bytes(&self, _owner: OwnerId) -> Option<usize> {
        None
    }
}

/// The view of owners: every partition is owned (by this process); the
/// child's partitions listed in `dead` are reported dead by membership.
#[derive(Debug)]
struct FakeTopology {
    meta: Arc<MetaStore>,
    dead: Mutex<HashSet<u32>>,
}

impl Topology for FakeTopology {
    fn owner_of(&self, topic: &str, partition: u32) -> Option<(OwnerId, bool)> {
        let t = self.meta.topic(topic)?;
        let dead = topic == CHILD && self.dead.lock().unwrap().contains(&partition);
        (partition < t.partitions()).then_some((0, !dead))
    }
}

struct Rig {
    meta: Arc<MetaStore>,
    topics: Arc<Topics>,
    local: Arc<LocalOwner>,
    owner: Arc<FaultyOwner>,
    topology: Arc<FakeTopology>,
    metrics: Arc<BrokerMetrics>,
    runner: Arc<FanoutRunner>,
}

/// A parent `p` of three partitions and its child `c` of three, with their
/// cursors running.
async fn rig(seed: u64) -> Rig {
    let fs = SimFs::new(seed);
    let clock = SystemClock::shared();
    let options = MetaStoreOptions {
        defaults: TopicDefaults::default(),
        clock: clock.clone(),
        rng_seed: None,
    };
    let meta = Arc::new(MetaStore::open(&fs, Path::new("/data"), options).unwrap());
    let topics =
        Arc::new(Topics::new(fs.shared(), Path::new("/data"), LogConfig::default(), clock.clone()));
    let metrics = Arc::new(BrokerMetrics::new(&mut Registry::default()));
    let local = Arc::new(LocalOwner::new(meta.clone(), topics.clone(), metrics.clone()));
    let owner = Arc::new(FaultyOwner { local: local.clone(), failing: Mutex::new(HashSet::new()) });
    let topology = Arc::new(FakeTopology { meta: meta.clone(), dead: Mutex::new(HashSet::new()) });
    let runner = FanoutRunner::new(Arc::new(FanoutCtx {
        meta: meta.clone(),
        topics: topics.clone(),
        owner: owner.clone(),
        topology: topology.clone(),
        node_id: None,
        fs: fs.shared(),
        clock,
        metrics: metrics.clone(),
        freshness: None,
    }));
    let create = |name: &str, parent: &str, partitions: i64| CreateTopicRequest {
        name: name.into(),
        parent: parent.into(),
        partitions,
        ..Default::default()
    };
    meta.create_topic(create("p", "", 3)).unwrap();
    meta.create_topic(create(CHILD, "p", i64::from(CHILD_PARTITIONS))).unwrap();
    {
        let links = runner.lock_links().await;
        runner.reconcile_now(&links).await;
    }
    Rig { meta, topics, local, owner, topology, metrics, runner }
}

/// One parent record: its payload (unique) and key.
#[derive(Debug, Clone)]
struct Sent {
    payload: String,
    key: Option<String>,
}

impl Sent {
    /// The child partition a keyed record must land in.
    fn home(&self) -> Option<u32> {
        self.key.as_ref().map(|k| keyed_partition(k.as_bytes(), CHILD_PARTITIONS))
    }
}

impl Rig {
    /// Commits `n` records into the parent (a third in each partition), one
    /// in three keyed (17 keys, so every child partition gets some).
    async fn produce(&self, n: usize) -> Vec<Sent> {
        let sent: Vec<Sent> = (0..n)
            .map(|i| Sent {
                payload: format!("r{i}"),
                key: (i % 3 == 0).then(|| format!("k{}", i % 17)),
            })
            .collect();
        for (p, chunk) in sent.chunks(n.div_ceil(3)).enumerate() {
            let batch = CommitBatch {
                topic: "p".into(),
                partition: p as u32,
                records: chunk
                    .iter()
                    .map(|s| BatchRecord {
                        incarnation: None,
                        key: s.key.clone().map(Bytes::from),
                        payload: Bytes::from(s.payload.clone()),
                        accepted_at_ms: 0,
                    })
                    .collect(),
            };
            let local = self.local.clone();
            tokio::task::spawn_blocking(move || local.commit_blocking(batch))
                .await
                .unwrap()
                .unwrap();
        }
        sent
    }

    /// Every record in the child: payload -> the partitions it is in (one
    /// entry per copy).
    fn child_copies(&self) -> BTreeMap<String, Vec<u32>> {
        let child = self.meta.topic(CHILD).unwrap();
        let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for p in 0..child.partitions() {
            let log = self.topics.partition(&child, p).unwrap().log.clone();
            let mut from = 0;
            while from < log.high_watermark() {
                let batch = log.read(from, 1_000, u64::MAX).unwrap();
                for r in &batch.records {
                    let payload = String::from_utf8(r.payload.to_vec()).unwrap();
                    out.entry(payload).or_default().push(p);
                }
                if batch.next_offset <= from {
                    break;
                }
                from = batch.next_offset;
            }
        }
        out
    }

    /// Polls the child until `done` holds for its copies or `within` passed;
    /// the last copies seen.
    async fn wait_for(
        &self,
        within: Duration,
        done: impl Fn(&BTreeMap<String, Vec<u32>>) -> bool,
    ) -> BTreeMap<String, Vec<u32>> {
        let deadline = Instant::now() + within;
        loop {
            let copies = self.child_copies();
            if done(&copies) || Instant::now() >= deadline {
                return copies;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn link_counter(&self, family: &str) -> u64 {
        let l = FanoutLabels { parent: "p".into(), child: CHILD.into() };
        match family {
            "commit_failures" => self.metrics.fanout_commit_failures.get_or_create(&l).get(),
            "rerouted" => self.metrics.fanout_rerouted.get_or_create(&l).get(),
            other => panic!("no counter {other}"),
        }
    }

    async fn stop(self) {
        self.runner.stop_all().await;
    }
}

/// The records of `sent` that `keep` selects, by payload.
fn payloads(sent: &[Sent], keep: impl Fn(&Sent) -> bool) -> Vec<&str> {
    sent.iter().filter(|s| keep(s)).map(|s| s.payload.as_str()).collect()
}

/// How many records the child holds more than once, and a few of them
/// with the partitions of their copies.
fn duplicated(copies: &BTreeMap<String, Vec<u32>>) -> (usize, Vec<(&String, &Vec<u32>)>) {
    let dups: Vec<_> = copies.iter().filter(|(_, at)| at.len() > 1).collect();
    (dups.len(), dups.into_iter().take(3).collect())
}

/// While commits into one child partition fail, the cursors go on
/// committing into the others (a failing group does not stop the groups
/// after it), and nothing is committed twice: once the partition works
/// again, every parent record is in the child exactly once, keyed records
/// in their key's partition. Before the fix the partitions after the
/// failing one got nothing and the ones before it got the slab again on
/// every retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_child_partition_holds_back_only_its_own_records_and_none_is_sent_twice() {
    let rig = rig(21).await;
    rig.owner.failing.lock().unwrap().insert(BAD);
    let sent = rig.produce(300).await;
    let healthy_keyed = payloads(&sent, |s| s.home().is_some_and(|p| p != BAD));
    assert!(sent.iter().any(|s| s.home() == Some(BAD)), "some keyed records aim at the bad one");
    let copies = rig
        .wait_for(Duration::from_secs(10), |c| healthy_keyed.iter().all(|p| c.contains_key(*p)))
        .await;
    let missing: Vec<&&str> = healthy_keyed.iter().filter(|p| !copies.contains_key(**p)).collect();
    assert!(missing.is_empty(), "keyed records of healthy partitions missing: {missing:?}");
    for s in &sent {
        if s.home() == Some(BAD) {
            assert!(
                !copies.contains_key(&s.payload),
                "{} got past the failing partition",
                s.payload
            );
        }
    }
    // Failing past the grace (3 s, as for produce), its keyless records go
    // to a sibling; its keyed records wait.
    let keyless = payloads(&sent, |s| s.key.is_none());
    let copies =
        rig.wait_for(Duration::from_secs(10), |c| keyless.iter().all(|p| c.contains_key(*p))).await;
    let missing = keyless.iter().filter(|p| !copies.contains_key(**p)).count();
    let total: usize = copies.values().map(Vec::len).sum();
    eprintln!(
        "failing child partition: {} of {} records in the child, {total} copies",
        copies.len(),
        sent.len()
    );
    assert_eq!(missing, 0, "keyless records still held by the failing partition");
    assert_eq!(duplicated(&copies), (0, Vec::new()), "records committed twice while one failed");
    assert!(copies.keys().all(|p| sent.iter().any(|s| &s.payload == p)), "nothing invented");
    for s in sent.iter().filter(|s| s.home() == Some(BAD)) {
        assert!(!copies.contains_key(&s.payload), "{} got past the failing partition", s.payload);
    }
    assert!(rig.link_counter("commit_failures") >= 2, "the failures are counted");
    assert!(rig.link_counter("rerouted") > 0, "the reroutes are counted");

    rig.owner.failing.lock().unwrap().clear();
    all_arrive_once_keyed_ones_home(&rig, &sent).await;
    rig.stop().await;
}

/// Keyless records aimed at a child partition whose owner membership
/// marks dead go to a live sibling at once; keyed ones wait for their
/// partition and arrive once its owner is back; every parent record is in
/// the child exactly once. Before the fix the dead partition's records, and
/// those of the partitions after it, never arrived while it was dead, and
/// the ones before it were committed again every second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_records_of_a_dead_child_partition_are_rerouted_and_keyed_ones_wait_for_it() {
    let rig = rig(22).await;
    rig.topology.dead.lock().unwrap().insert(BAD);
    rig.owner.failing.lock().unwrap().insert(BAD);
    let sent = rig.produce(300).await;
    let ready = payloads(&sent, |s| s.home() != Some(BAD));
    let started = Instant::now();
    let copies =
        rig.wait_for(Duration::from_secs(10), |c| ready.iter().all(|p| c.contains_key(*p))).await;
    let missing: Vec<&&str> = ready.iter().filter(|p| !copies.contains_key(**p)).collect();
    assert!(missing.is_empty(), "records not aimed at the dead partition missing: {missing:?}");
    eprintln!("dead child partition: the other records arrived in {:?}", started.elapsed());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "keyless records reroute at once for a dead owner, not after the failing grace"
    );
    assert!(copies.values().all(|at| !at.contains(&BAD)), "nothing landed on the dead partition");
    assert_eq!(duplicated(&copies), (0, Vec::new()), "records committed twice");
    let keyless = sent.iter().filter(|s| s.key.is_none()).count() as u64;
    let rerouted = rig.link_counter("rerouted");
    assert!(rerouted > 0 && rerouted < keyless, "rerouted {rerouted} of {keyless} keyless");

    // The owner comes back: the keyed records that waited arrive.
    rig.topology.dead.lock().unwrap().clear();
    rig.owner.failing.lock().unwrap().clear();
    all_arrive_once_keyed_ones_home(&rig, &sent).await;
    rig.stop().await;
}

/// Once nothing fails: every record of `sent` reaches the child within
/// 15 s, exactly once, a keyed one in its key's partition.
async fn all_arrive_once_keyed_ones_home(rig: &Rig, sent: &[Sent]) {
    let copies = rig.wait_for(Duration::from_secs(15), |c| c.len() == sent.len()).await;
    assert_eq!(copies.len(), sent.len(), "every parent record reached the child");
    assert_eq!(duplicated(&copies), (0, Vec::new()), "records committed twice");
    for s in sent {
        if let Some(home) = s.home() {
            assert_eq!(copies[&s.payload], vec![home], "{} left its key's partition", s.payload);
        }
    }
}
