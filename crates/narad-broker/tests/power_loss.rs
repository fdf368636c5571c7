//! Whole-node power loss, simulated.
//!
//! The node's whole storage stack runs in process on the simulated disk:
//! the metastore (redb through narad-fs), the ingress WAL, the dispatcher's
//! decision core with the local owner, the partition logs and the consumer
//! frontiers. One thread drives a seeded workload (produce single and batch,
//! dispatch, checkpoint flushes and compaction, consume, ack, frontier
//! persists) with virtual time, and (odd seeds) delete + recreate churn: a
//! topic is deleted and its name created again under load, with the callers
//! that race such a churn played out in the order that hurts (a delete that
//! reaches the files after the name was recreated and committed to; an open
//! by a caller holding the deleted incarnation's record, as a commit, a
//! first consume, a replay or a fan-out cursor does; a frontier pass that
//! listed partitions before the delete and persists after the recreation).
//! Sometimes a disk error (failed fsync, failed write, ENOSPC) strikes
//! first; the power is cut at a random disk operation; the disk keeps only
//! what was synced (with and without torn writes); the node restarts on what
//! is left, several times. At the end everything is dispatched and drained.
//! Then:
//! * every record that was acked (appended to the WAL with `Ok`, the 202)
//!   for a topic incarnation still live at the end was delivered to a
//!   consumer at least once, before or after a crash;
//! * no record of a deleted incarnation is ever delivered from another
//!   incarnation of the name;
//! * every record ever delivered was produced by the workload (nothing
//!   invented, nothing half-written);
//! * every restart succeeded (recovery never refuses a torn tail).
//!
//! A third of the payloads start and end with bytes of our own formats (WAL
//! segment headers, preparation trailers with valid CRCs, runs of zeros,
//! partition-log frames and segment headers), as a client may send them.
//!
//! The workload is one thread and every background timer is pushed out of
//! the way, so a seed replays the same disk operations: `NARAD_SEED=S` runs
//! one seed; `NARAD_SEEDS=N` runs N (default 200).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_broker::consume::shard::ShardLimits;
use narad_broker::consume::take::take;
use narad_broker::dispatch::core::{Core, Outcome};
use narad_broker::dispatch::resolve::LocalResolver;
use narad_broker::metrics::BrokerMetrics;
use narad_broker::owner::{CommitBatch, LocalOwner};
use narad_broker::partition::keyed_partition;
use narad_broker::topics::{PartitionRt, Topics, shard_limits};
use narad_clock::{Clock, ManualClock};
use narad_fs::{CrashMode, FaultKind, SimFs, SimRng};
use narad_log::LogConfig;
use narad_meta::{CreateTopicRequest, MetaStore, MetaStoreOptions, Topic, TopicDefaults};
use narad_wal::{RecordRef, Wal, WalOptions, WalReader};
use prometheus_client::registry::Registry;

#[path = "common/sim.rs"]
mod sim;

const TOPICS: [&str; 2] = ["orders", "events"];

fn wal_options() -> WalOptions {
    WalOptions {
        segment_bytes: 16 << 10,
        max_record_bytes: 4 << 10,
        rotate_dispatched_active_bytes: 4 << 10,
        // Flushed explicitly by the workload, so disk operations happen in
        // a seeded order.
        checkpoint_sync_delay: Duration::from_secs(86_400),
        compaction_interval: Duration::from_secs(86_400),
        // The prep thread would write at unseeded moments; preparation has
        // its own power cuts in narad-wal's crash-consistency test.
        prealloc: false,
        // Small against the 16 KiB segments, so power cuts land around
        // top-ups of the zero runway, overwrites of it and the cut that
        // seals a segment.
        runway_bytes: 8 << 10,
    }
}

fn log_config() -> LogConfig {
    LogConfig { segment_bytes: 8 << 10, ..LogConfig::default() }
}

struct Node {
    meta: Arc<MetaStore>,
    topics: Arc<Topics>,
    wal: Arc<Wal>,
    owner: Arc<LocalOwner>,
    resolver: LocalResolver,
    core: Core,
    reader: WalReader,
    rescan: WalReader,
    /// Leases not yet acked: (topic, partition, offset, nonce).
    leases: Vec<(Arc<Topic>, u32, u64, u64)>,
    /// Records of incarnations deleted in this life, as a caller that read
    /// them before the delete still holds them.
    stale: Vec<Arc<Topic>>,
    /// Deletes done in the metastore whose files are not removed yet:
    /// (name, incarnation).
    pending_removes: Vec<(String, u64)>,
    /// The partitions a frontier pass listed at its start.
    pass: Vec<Arc<PartitionRt>>,
}

fn open(fs: &SimFs, clock: &ManualClock) -> Result<Node, String> {
    let data = Path::new("/data");
    let meta = Arc::new(
        MetaStore::open(
            fs,
            data,
            MetaStoreOptions {
                defaults: TopicDefaults::default(),
                clock: Arc::new(clock.clone()),
                rng_seed: Some(7),
            },
        )
        .map_err(|e| format!("metastore: {e}"))?,
    );
    let topics = Arc::new(Topics::new(fs.shared(), data, log_config(), Arc::new(clock.clone())));
    let live: Vec<Arc<Topic>> = meta.snapshot().topics().cloned().collect();
    topics.open_at_startup(&live, false).map_err(|e| format!("partition logs: {e}"))?;
    let wal = Arc::new(
        Wal::open_with(fs.shared(), narad_wal::wal_dir(data), wal_options())
            .map_err(|e| format!("wal: {e}"))?,
    );
    let metrics = Arc::new(BrokerMetrics::new(&mut Registry::default()));
    let owner = Arc::new(LocalOwner::new(meta.clone(), topics.clone(), metrics));
    let start = wal.checkpoint();
    Ok(Node {
        resolver: LocalResolver::new(meta.clone()),
        core: Core::new(start),
        reader: wal.reader(start),
        rescan: wal.reader(start),
        meta,
        topics,
        wal,
        owner,
        leases: Vec::new(),
        stale: Vec::new(),
        pending_removes: Vec::new(),
        pass: Vec::new(),
    })
}

/// Bytes of one of our on-disk formats, valid where they carry a CRC: a
/// WAL segment header, a WAL preparation trailer, a run of zeros, or a
/// partition-log frame (continuing plausible offsets) or segment header.
/// A client may send any of them as a payload. The log frames are sealed
/// as a client can seal them: with the public CRC32C, or with a guessed
/// salt. Before the log's frames were salted, a torn (never acked) commit
/// whose payload carried such a frame made the log's open fail instead of
/// cutting the tear (seed 168 of 1,000 found it; docs/DURABILITY.md,
/// "payloads that look like ours").
fn our_bytes(rng: &mut SimRng) -> Vec<u8> {
    use narad_log::frame::{FrameSeed, PayloadBuilder};
    match rng.below(6) {
        0 => narad_wal::frame::segment_header(rng.below(1_000), rng.below(u64::MAX)).to_vec(),
        1 => narad_wal::prep::trailer(rng.below(16 << 10) as u32).to_vec(),
        2 => vec![0u8; 1 + rng.below(600) as usize],
        3 | 4 => {
            let seed = if rng.chance(1, 2) {
                FrameSeed::UNSALTED
            } else {
                FrameSeed::of_salt(rng.below(u64::MAX))
            };
            let mut p = PayloadBuilder::new();
            for i in 0..1 + rng.below(3) {
                p.push(None, 1_700_000_000_000, format!("forged {i}").as_bytes());
            }
            p.finish(rng.below(64), narad_log::Codec::None, seed).expect("a small frame")
        }
        _ => narad_log::segment::segment_header(rng.below(64), rng.below(u64::MAX)).to_vec(),
    }
}

#[derive(Default)]
struct Ledger {
    attempted: HashSet<Vec<u8>>,
    acked: HashSet<Vec<u8>>,
    /// The topic incarnation each attempted record was produced for.
    incarnation: HashMap<Vec<u8>, u64>,
    delivered: HashSet<Vec<u8>>,
    deliveries: u64,
    /// Acked records whose incarnation is live at the end (the ones that
    /// must be delivered; the others' topic was deleted later in the run).
    acked_live: u64,
}

impl Ledger {
    /// A record delivered from incarnation `t`: it must have been produced
    /// for that incarnation.
    fn deliver(&mut self, payload: &[u8], t: &Topic) {
        let produced_for = self.incarnation.get(payload).copied();
        assert!(
            produced_for.is_none_or(|i| i == t.incarnation()),
            "a record of incarnation {produced_for:?} delivered from incarnation {} of {}: {:?}",
            t.incarnation(),
            t.name(),
            String::from_utf8_lossy(&payload[..payload.len().min(24)])
        );
        self.delivered.insert(payload.to_vec());
        self.deliveries += 1;
    }
}

impl Node {
    fn produce(
        &mut self,
        rng: &mut SimRng,
        ledger: &mut Ledger,
        id: &mut u64,
        clock: &ManualClock,
    ) {
        let name = TOPICS[rng.below(2) as usize];
        let Some(t) = self.meta.topic(name) else { return };
        let n = if rng.chance(1, 3) { 1 + rng.below(6) } else { 1 };
        let mut payloads = Vec::new();
        let mut keys = Vec::new();
        for _ in 0..n {
            *id += 1;
            let mut p = format!("{name}:{id}:").into_bytes();
            let pad = rng.below(300) as usize;
            p.extend((0..pad).map(|i| b'a' + (i % 26) as u8));
            if rng.chance(1, 3) {
                // Our own formats' bytes at the payload's start and end.
                let mut head = our_bytes(rng);
                head.extend_from_slice(&p);
                p = head;
                p.extend_from_slice(&our_bytes(rng));
            }
            ledger.attempted.insert(p.clone());
            ledger.incarnation.insert(p.clone(), t.incarnation());
            payloads.push(p);
            keys.push(if rng.chance(1, 2) {
                Some(format!("k{}", rng.below(20)).into_bytes())
            } else {
                None
            });
        }
        let recs: Vec<RecordRef<'_>> = payloads
            .iter()
            .zip(&keys)
            .enumerate()
            .map(|(i, (p, k))| RecordRef {
                topic: name,
                incarnation: Some(t.incarnation()),
                key: k.as_deref(),
                partition: match k {
                    Some(k) => keyed_partition(k, t.partitions()),
                    None => (*id as u32 + i as u32) % t.partitions(),
                },
                accepted_at_ms: clock.wall_ms(),
                payload: p,
            })
            .collect();
        let ok = if recs.len() == 1 {
            self.wal.append(&recs[0]).is_ok()
        } else {
            self.wal.append_many(&recs).is_ok()
        };
        if ok {
            ledger.acked.extend(payloads);
        }
    }

    /// One round of the dispatcher: read, rescan, commit, checkpoint.
    fn dispatch(&mut self, now: Duration) {
        sim::read_and_rescan(
            &mut self.core,
            &mut self.reader,
            &mut self.rescan,
            &self.resolver,
            now,
        );
        // The only owner is this node: its pings answer at once.
        for owner in self.core.take_pings(now) {
            self.core.finish_ping(owner, true, now);
        }
        for o in self.core.take_orders(now, &|_| None) {
            let batch = CommitBatch::of(&o.dest, &o.items);
            let outcome = match self.owner.commit_blocking(batch) {
                Ok(_) => Outcome::Committed,
                Err(e) => e.outcome(),
            };
            self.core.finish(o.id, &o.dest, o.items, outcome, now);
        }
        let _ = self.wal.store_checkpoint(self.core.checkpoint());
    }

    fn consume(&mut self, rng: &mut SimRng, ledger: &mut Ledger, now_ms: u64) {
        let name = TOPICS[rng.below(2) as usize];
        let Some(t) = self.meta.topic(name) else { return };
        let Some(rt) = self.topics.get_open(name, t.incarnation()) else { return };
        let p = rng.below(u64::from(t.partitions())) as u32;
        let Some(part) = rt.partition_if_open(p) else { return };
        let limits: ShardLimits = shard_limits(&t);
        // A failed read leaves what was leased before it (live leases).
        let leased = take(name, &part, &limits, now_ms, 1 + rng.below(5) as usize, 1 << 20).leased;
        for l in leased {
            ledger.deliver(&l.record.payload, &t);
            self.leases.push((t.clone(), p, l.record.offset, l.nonce));
        }
    }

    fn ack_some(&mut self, rng: &mut SimRng, now_ms: u64) {
        let n = rng.below(self.leases.len() as u64 + 1) as usize;
        for (t, p, offset, nonce) in self.leases.drain(..n).collect::<Vec<_>>() {
            let Some(rt) = self.topics.get_open(t.name(), t.incarnation()) else { continue };
            let Some(part) = rt.partition_if_open(p) else { continue };
            let Ok(mut g) = part.shard() else { continue };
            if let Some(s) = g.as_mut() {
                let _ = s.ack(offset, nonce, now_ms, &shard_limits(&t));
            }
        }
    }

    /// Deletes a topic and creates the name again (a new incarnation).
    /// Sometimes the delete's removal of the files is held back until a
    /// later step, after the new incarnation was committed to; sometimes a
    /// frontier pass lists the moved partitions before the delete and
    /// persists them after the new incarnation was committed to.
    fn churn(&mut self, rng: &mut SimRng, ledger: &mut Ledger, id: &mut u64, clock: &ManualClock) {
        let pass = rng.chance(1, 2);
        if pass {
            self.start_a_frontier_pass();
        }
        self.delete_and_recreate(rng);
        if pass {
            for _ in 0..3 {
                self.produce(rng, ledger, id, clock);
            }
            self.dispatch(clock.mono());
            self.finish_the_frontier_pass();
        }
    }

    fn delete_and_recreate(&mut self, rng: &mut SimRng) {
        let name = TOPICS[rng.below(2) as usize];
        if let Some(t) = self.meta.topic(name) {
            let Ok(deleted) = self.meta.delete_topic(name) else { return };
            self.stale.push(t);
            if rng.chance(1, 2) {
                self.pending_removes.push((name.to_owned(), deleted.incarnation()));
            } else {
                let _ = self.topics.remove(name, deleted.incarnation());
            }
        }
        let req = CreateTopicRequest { name: name.into(), partitions: 3, ..Default::default() };
        let _ = self.meta.create_topic(req);
    }

    /// A held-back delete reaches the files.
    fn finish_a_remove(&mut self) {
        if let Some((name, incarnation)) = self.pending_removes.pop() {
            let _ = self.topics.remove(&name, incarnation);
        }
    }

    /// A caller holding a deleted incarnation's record gets to its open:
    /// a commit or a replay (the partition), a first consume or a fan-out
    /// cursor (the topic).
    fn stale_open(&mut self, rng: &mut SimRng) {
        if self.stale.is_empty() {
            return;
        }
        let t = self.stale[rng.below(self.stale.len() as u64) as usize].clone();
        if rng.chance(1, 2) {
            let _ = self.topics.partition(&t, rng.below(u64::from(t.partitions())) as u32);
        } else {
            let _ = self.topics.topic(&t);
        }
    }

    /// A frontier pass lists the moved partitions ...
    fn start_a_frontier_pass(&mut self) {
        self.pass =
            self.topics.all().iter().flat_map(|rt| rt.frontier_dirty_partitions()).collect();
    }

    /// ... and persists them (maybe after a churn).
    fn finish_the_frontier_pass(&mut self) {
        for part in std::mem::take(&mut self.pass) {
            let _ = part.persist_frontier();
        }
    }

    fn persist_frontiers(&self) {
        for rt in self.topics.all() {
            for part in rt.frontier_dirty_partitions() {
                let _ = part.persist_frontier();
            }
        }
    }

    /// Dispatches and consumes until nothing is left (no crash).
    fn drain(&mut self, ledger: &mut Ledger, clock: &ManualClock, seed: u64) {
        for _ in 0..10_000 {
            clock.advance(Duration::from_millis(100));
            self.dispatch(clock.mono());
            let done =
                self.core.checkpoint() == self.wal.durable_next() && self.core.skipped() == 0;
            if done {
                break;
            }
        }
        assert_eq!(
            self.core.checkpoint(),
            self.wal.durable_next(),
            "seed {seed}: dispatch never finished"
        );
        // Unacked leases expire; then consume and ack everything.
        clock.advance(Duration::from_secs(120));
        for name in TOPICS {
            let Some(t) = self.meta.topic(name) else { continue };
            let Some(rt) = self.topics.get_open(name, t.incarnation()) else { continue };
            for part in rt.open_partitions() {
                loop {
                    let now = clock.wall_ms();
                    let taken = take(name, &part, &shard_limits(&t), now, 100, 8 << 20);
                    if let Some(e) = taken.failed {
                        panic!("drain: {e}");
                    }
                    let leased = taken.leased;
                    if leased.is_empty() {
                        break;
                    }
                    let mut g = part.shard().unwrap();
                    let s = g.as_mut().unwrap();
                    for l in leased {
                        ledger.deliver(&l.record.payload, &t);
                        s.ack(l.record.offset, l.nonce, now, &shard_limits(&t)).unwrap();
                    }
                }
            }
        }
    }

    fn close(mut self) {
        self.pass.clear();
        let _ = self.wal.close();
        for rt in self.topics.all() {
            for part in rt.open_partitions() {
                part.log.close();
            }
        }
    }
}

fn run_seed(seed: u64) -> Ledger {
    let mut rng = SimRng::new(seed);
    let fs = SimFs::new(seed);
    let clock = ManualClock::new(1_700_000_000_000);
    let mut ledger = Ledger::default();
    let mut id = 0u64;
    {
        let node = open(&fs, &clock).unwrap_or_else(|e| panic!("seed {seed}: first open: {e}"));
        for name in TOPICS {
            let req = CreateTopicRequest { name: name.into(), partitions: 3, ..Default::default() };
            node.meta.create_topic(req).unwrap();
        }
        node.close();
    }
    let lives = 3;
    // Odd seeds add delete + recreate churn; even seeds keep the workload
    // without it (whose records all stay live).
    let churn = seed % 2 == 1;
    for life in 0..=lives {
        let mut node =
            open(&fs, &clock).unwrap_or_else(|e| panic!("seed {seed}: restart {life} failed: {e}"));
        if life == lives {
            node.drain(&mut ledger, &clock, seed);
            node.close();
            break;
        }
        let cut = fs.op_count() + rng.below(600);
        fs.power_cut_at(cut);
        // Sometimes a disk error first: a failed fsync or write (the WAL
        // latches, a partition commit fails and is retried as a probe).
        if rng.chance(1, 2) {
            let kind = match rng.below(3) {
                0 => FaultKind::SyncError,
                1 => FaultKind::WriteError,
                _ => FaultKind::NoSpace,
            };
            fs.inject(fs.op_count() + rng.below(400), kind);
        }
        for _ in 0..120 {
            clock.advance(Duration::from_millis(rng.range(1, 40)));
            let now = clock.mono();
            match rng.below(if churn { 110 } else { 100 }) {
                0..=34 => node.produce(&mut rng, &mut ledger, &mut id, &clock),
                35..=59 => node.dispatch(now),
                60..=64 => {
                    let _ = node.wal.sync_checkpoint_now();
                }
                65..=79 => node.consume(&mut rng, &mut ledger, clock.wall_ms()),
                80..=89 => node.ack_some(&mut rng, clock.wall_ms()),
                90..=99 => node.persist_frontiers(),
                100..=103 => node.churn(&mut rng, &mut ledger, &mut id, &clock),
                104..=105 => node.finish_a_remove(),
                _ => node.stale_open(&mut rng),
            }
        }
        node.close();
        let mode = match rng.below(3) {
            0 => CrashMode::DropUnsynced,
            1 => CrashMode::Torn,
            _ => CrashMode::TornWithHoles,
        };
        fs.crash(mode);
    }
    // Records of incarnations deleted since need not be delivered.
    let node = open(&fs, &clock).unwrap_or_else(|e| panic!("seed {seed}: last open: {e}"));
    let live: HashSet<u64> = node.meta.snapshot().topics().map(|t| t.incarnation()).collect();
    node.close();
    ledger.acked_live =
        ledger.acked.iter().filter(|p| live.contains(&ledger.incarnation[*p])).count() as u64;
    let lost: Vec<String> = ledger
        .acked
        .iter()
        .filter(|p| live.contains(&ledger.incarnation[*p]))
        .filter(|p| !ledger.delivered.contains(*p))
        .map(|p| String::from_utf8_lossy(&p[..p.len().min(24)]).into_owned())
        .collect();
    assert!(
        lost.is_empty(),
        "seed {seed}: {} acked records never delivered, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(3)]
    );
    for p in &ledger.delivered {
        assert!(ledger.attempted.contains(p), "seed {seed}: delivered a record nobody produced");
    }
    ledger
}

fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("NARAD_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![s];
    }
    let n = std::env::var("NARAD_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    (0..n).collect()
}

#[test]
fn every_record_acked_before_a_power_loss_is_eventually_delivered() {
    let mut totals = (0u64, 0u64, 0u64, 0u64);
    for seed in seeds() {
        let l = run_seed(seed);
        totals.0 += l.acked.len() as u64;
        totals.1 += l.delivered.len() as u64;
        totals.2 += l.deliveries;
        totals.3 += l.acked_live;
    }
    eprintln!(
        "power loss: {} acked, of which {} of incarnations live at the end (all delivered); \
         {} distinct delivered, {} deliveries",
        totals.0, totals.3, totals.1, totals.2
    );
    assert!(totals.0 > 0, "the workload acked nothing");
}

#[test]
fn the_same_seed_replays_the_same_run() {
    let a = run_seed(42);
    let b = run_seed(42);
    assert_eq!((a.acked.len(), a.deliveries), (b.acked.len(), b.deliveries));
    let _ = (HashMap::<u8, u8>::new(), PathBuf::new(), Bytes::new());
}
