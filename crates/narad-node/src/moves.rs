//! Partition moves between nodes (SPEC §7.3): the source's answers to node
//! RPC 22, 23 and 24, and the destination's mover.
//!
//! # The destination's mover
//!
//! As soon as its metastore replica applies a move's start (and every
//! second besides), each node looks at the partitions its replica shows
//! moving to it (`target_id` = this node) and runs one task per move (at
//! most [`MAX_MOVES_IN_FLIGHT`] exist cluster-wide):
//!
//! 1. stage a copy ([`Broker::move_stage`]);
//! 2. copy rounds: list the source's segments (RPC 22), fetch what the copy
//!    lacks in [`MOVE_CHUNK_BYTES`] chunks (RPC 23); stop once the copy is
//!    within [`MOVE_CATCH_UP_BYTES`] of the source, or after
//!    [`MOVE_MAX_ROUNDS`] rounds;
//! 3. freeze the source (RPC 24, [`MOVE_FREEZE_TTL`]): from here its high
//!    watermark and consumer frontier are final, and producers' records for
//!    the partition wait in their nodes' WALs (a retriable refusal);
//! 4. copy the tail (list again, fetch the rest);
//! 5. verify and install ([`Broker::move_install`]: every frame's CRC, the
//!    source's oldest offset and high watermark, the consumer frontier);
//! 6. flip the owner through Raft with a compare and set (CompleteMove).
//!    The source's replica applies it and seals the partition there; the
//!    records waiting in WALs then resolve to this node.
//!
//! Any failure before the flip aborts the move (AbortMove, a compare and set
//! on the target: it fails if the flip happened), which lifts the source's
//! freeze; a later plan may try again.
//!
//! A source that stops answering: while it answers nothing, the mover
//! retries; once its member record has been dead for
//! [`MOVE_FORCE_PROMOTE_AFTER`], the move is force-promoted only if this
//! copy holds everything the source had when it froze (a frozen high
//! watermark is final: nothing was committed there after it), and aborted
//! otherwise, as Narad does. Without a freeze answer nothing proves the copy
//! complete, so the move is aborted.
//!
//! # The source
//!
//! [`serve`] answers RPC 22, 23 and 24 from the broker; 24 freezes only for
//! the peer the metastore names as the target (the asker is the
//! authenticated peer). A freeze that expires (its mover went quiet) is not
//! lifted by the source: it proposes AbortMove, and the metastore decides
//! ([`expire_freezes`]).

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use narad_broker::Broker;
use narad_broker::fanout::cursor_file::CursorState;
use narad_broker::{FrozenSource, MoveListing};
use narad_cluster::handshake::PeerIdentity;
use narad_cluster::moves::{CursorBody, FrozenBody, SegmentBody, SegmentsBody};
use narad_cluster::rpc::{Handoff, MovePartition, Reply, Request, SegmentChunk};
use narad_cluster::transport::Transport;
use narad_log::copy::{IncomingCopy, SegmentExtent};
use narad_meta::limits::{
    MAX_MOVES_IN_FLIGHT, MOVE_CATCH_UP_BYTES, MOVE_CHUNK_BYTES, MOVE_FORCE_PROMOTE_AFTER,
    MOVE_FREEZE_TTL, MOVE_MAX_ROUNDS,
};
use narad_meta::{MemberStatus, MetaStore};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Serialize;
use tracing::{info, warn};

use crate::copy_rate::CopyRate;

/// How often the mover looks for moves to run (besides at once when a
/// move starts), and a source for expired freezes.
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// Chunk fetches (RPC 23) a copy keeps in flight, so that the source's
/// read, the network and this node's write overlap (one at a time, the
/// copy ran at about 0.4 × the disk's write rate: docs/BENCHMARKS.md).
const CHUNKS_IN_FLIGHT: usize = 4;

/// Back-off between attempts to reach a source that did not answer.
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// Test-only: the mover sleeps this many milliseconds before each chunk it
/// fetches (a slow copy, so a test can kill a node mid-copy). Unset or
/// unparsable: no delay.
pub const CHUNK_DELAY_ENV: &str = "NARAD_TEST_MOVE_CHUNK_DELAY_MS";

fn chunk_delay() -> Option<Duration> {
    static DELAY: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        let ms: u64 = std::env::var(CHUNK_DELAY_ENV).ok()?.trim().parse().ok()?;
        warn!(ms, "test hook: the partition mover waits {ms} ms before each chunk");
        Some(Duration::from_millis(ms))
    })
}

/// Test-only: the mover waits this many milliseconds after the source
/// froze, before copying the tail (a test kills the source there).
pub const PAUSE_AFTER_FREEZE_ENV: &str = "NARAD_TEST_MOVE_PAUSE_AFTER_FREEZE_MS";

/// Test-only: force-promote after the source has been dead this many
/// milliseconds instead of [`MOVE_FORCE_PROMOTE_AFTER`].
pub const FORCE_PROMOTE_AFTER_ENV: &str = "NARAD_TEST_MOVE_FORCE_PROMOTE_AFTER_MS";

fn test_ms(
    name: &'static str,
    cell: &'static std::sync::OnceLock<Option<Duration>>,
) -> Option<Duration> {
    *cell.get_or_init(|| {
        let ms: u64 = std::env::var(name).ok()?.trim().parse().ok()?;
        warn!(ms, "test hook {name}: {ms} ms");
        Some(Duration::from_millis(ms))
    })
}

fn pause_after_freeze() -> Option<Duration> {
    static CELL: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    test_ms(PAUSE_AFTER_FREEZE_ENV, &CELL)
}

fn force_promote_after() -> Duration {
    static CELL: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    test_ms(FORCE_PROMOTE_AFTER_ENV, &CELL).unwrap_or(MOVE_FORCE_PROMOTE_AFTER)
}

/// Why a copy stopped: the source did not answer (or refused) a call,
/// with the freeze answer if it had frozen; or a step on this node failed.
#[derive(Debug)]
enum Stall {
    Source(String, Option<FrozenSource>),
    Local(String),
}

/// One move as the metastore shows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Move {
    topic: String,
    incarnation: u64,
    partition: u32,
    source: String,
    /// The metastore's name for this attempt of the move
    /// (`Assignment::move_attempt`): its flip and abort name it, so a later
    /// attempt between the same two nodes is never acted on by this one.
    attempt: Option<u64>,
}

impl Move {
    /// The partition it moves: one task per partition at a time.
    fn slot(&self) -> (String, u64, u32) {
        (self.topic.clone(), self.incarnation, self.partition)
    }
}

/// `{outcome}` of a move this node ran as its destination.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MoveOutcomeLabels {
    /// `completed` (copied and flipped), `force_promoted` (the source was
    /// dead and the copy held its frozen high watermark) or `aborted`.
    pub outcome: String,
}

/// The destination's move metrics (SPEC §9 "Moves"): created at start,
/// registered in the node's registry.
#[derive(Debug, Clone)]
pub struct MoveMetrics {
    /// `narad_moves_inflight`: moves this node is running as destination.
    inflight: Gauge,
    /// `narad_moves_total{outcome}`.
    total: Family<MoveOutcomeLabels, Counter>,
    /// `narad_moves_duration_seconds`: from the start of the copy to the
    /// flip (or the abort).
    duration: Histogram,
    /// `narad_moves_bytes_total`: segment bytes copied from sources.
    bytes: Counter,
    /// `narad_moves_throttled_seconds_total`: time chunk fetches waited
    /// on `cluster.move_copy_rate`.
    throttled: Counter<f64, std::sync::atomic::AtomicU64>,
}

impl MoveMetrics {
    /// New metrics, added to `registry`.
    pub fn new(registry: &mut Registry) -> MoveMetrics {
        let m = MoveMetrics {
            inflight: Gauge::default(),
            total: Family::default(),
            duration: Histogram::new(exponential_buckets(0.05, 2.0, 16)),
            bytes: Counter::default(),
            throttled: Counter::default(),
        };
        // Every outcome from the start, at 0 until it happens.
        for outcome in ["completed", "force_promoted", "aborted"] {
            let _ = m.total.get_or_create(&MoveOutcomeLabels { outcome: outcome.to_owned() });
        }
        registry.register(
            "moves_inflight",
            "Partition moves this node is running as their destination",
            m.inflight.clone(),
        );
        registry.register(
            "moves",
            "Partition moves this node ran as their destination, by outcome (completed, force_promoted, aborted)",
            m.total.clone(),
        );
        registry.register(
            "moves_duration_seconds",
            "Time from the start of a move's copy to its owner flip or abort, on the destination",
            m.duration.clone(),
        );
        registry.register(
            "moves_bytes",
            "Partition segment bytes copied from move sources",
            m.bytes.clone(),
        );
        registry.register(
            "moves_throttled_seconds",
            "Time the copy rounds of moves to this node waited on cluster.move_copy_rate",
            m.throttled.clone(),
        );
        m
    }

    fn ended(&self, outcome: &str, took: Duration) {
        self.total.get_or_create(&MoveOutcomeLabels { outcome: outcome.to_owned() }).inc();
        self.duration.observe(took.as_secs_f64());
    }
}

/// Where a running move is (the destination's view), for
/// `GET /v1/cluster/moves`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MovePhase {
    /// Copy rounds: the source still takes commits.
    Copying,
    /// The source is frozen; the tail is being copied.
    Frozen,
    /// Verifying and installing the copy, then the owner flip.
    Installing,
    /// The source does not answer: waiting for it (or for force-promote).
    WaitingForSource,
}

/// A move this node is running as its destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MoveProgress {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The source (the owner).
    pub from: String,
    /// Where the move is.
    pub phase: MovePhase,
    /// Copy rounds started (the tail after the freeze counts as one).
    pub rounds: u32,
    /// Segment bytes copied so far.
    pub bytes_copied: u64,
    /// Segment bytes the source held at its last listing.
    pub bytes_total: u64,
    /// Milliseconds since this node started the move.
    pub age_ms: u64,
}

#[derive(Debug)]
struct Running {
    started: Instant,
    phase: MovePhase,
    rounds: u32,
    bytes_copied: u64,
    bytes_total: u64,
}

/// Answers node RPC 22, 23 and 24 (`None` for any other request).
pub async fn serve(broker: &Arc<Broker>, from: &PeerIdentity, request: &Request) -> Option<Reply> {
    Some(match request {
        Request::ListPartitionSegments(m) => list(broker, m).await,
        Request::FetchSegmentChunk(c) => chunk(broker, c).await,
        Request::PrepareHandoff(h) => freeze(broker, &from.node_id, h).await,
        _ => return None,
    })
}

fn error_reply(e: &narad_broker::BrokerError) -> Reply {
    Reply::error(e.status(), &e.public_message())
}

/// The incarnation a request names, or the live one.
fn incarnation_of(broker: &Broker, topic: &str, named: Option<NonZeroU64>) -> Option<u64> {
    named.map(NonZeroU64::get).or_else(|| broker.meta().topic(topic).map(|t| t.incarnation()))
}

fn partition_of(p: i32) -> Result<u32, Reply> {
    u32::try_from(p).map_err(|_| Reply::error(400, "invalid partition"))
}

async fn list(broker: &Arc<Broker>, m: &MovePartition) -> Reply {
    let p = match partition_of(m.partition) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let Some(inc) = incarnation_of(broker, &m.topic, m.incarnation) else {
        return Reply::error(404, "topic not found");
    };
    match broker.move_listing(&m.topic, inc, p).await {
        Ok(l) => Reply::json(200, serde_json::to_vec(&segments_body(&l)).unwrap_or_default()),
        Err(e) => error_reply(&e),
    }
}

fn segments_body(l: &MoveListing) -> SegmentsBody {
    SegmentsBody {
        high_watermark: l.high_watermark,
        oldest: l.oldest,
        segments: l
            .segments
            .iter()
            .map(|s| SegmentBody { base: s.base, len: s.len, end_offset: s.end_offset })
            .collect(),
    }
}

async fn chunk(broker: &Arc<Broker>, c: &SegmentChunk) -> Reply {
    let p = match partition_of(c.partition) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let (Ok(base), Ok(at), Ok(len)) =
        (u64::try_from(c.base), u64::try_from(c.at), u64::try_from(c.length))
    else {
        return Reply::error(400, "negative segment, position or length");
    };
    let Some(inc) = incarnation_of(broker, &c.topic, c.incarnation) else {
        return Reply::error(404, "topic not found");
    };
    match broker.move_chunk(&c.topic, inc, p, base, at, len.min(MOVE_CHUNK_BYTES)).await {
        Ok(bytes) => {
            Reply { status: 200, content_type: "application/octet-stream".into(), body: bytes }
        }
        Err(e) => error_reply(&e),
    }
}

async fn freeze(broker: &Arc<Broker>, target: &str, h: &Handoff) -> Reply {
    let p = match partition_of(h.partition) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let Some(inc) = incarnation_of(broker, &h.topic, h.incarnation) else {
        return Reply::error(404, "topic not found");
    };
    let ttl = Duration::from_nanos(h.freeze_ttl_nanos.max(0) as u64).min(MOVE_FREEZE_TTL);
    let deadline = now_ms(broker) + ttl.as_millis() as u64;
    match broker.move_freeze(&h.topic, inc, p, target, deadline).await {
        Ok(f) => {
            // A cursor file that cannot be read is left behind: the
            // destination's cursor then anchors at the link's creation
            // (more duplicates, no skipped record).
            let cursors = match broker.move_fanout_cursors(&h.topic, inc, p).await {
                Ok(c) => c,
                Err(e) => {
                    warn!(topic = %h.topic, partition = p, error = %e,
                        "cannot read the fan-out cursors of a moving partition; the destination's cursors start over");
                    Vec::new()
                }
            };
            let body = FrozenBody {
                high_watermark: f.high_watermark,
                consumer_frontier: f.consumer_frontier,
                fanout_cursors: cursors
                    .iter()
                    .map(|c| CursorBody { epoch: c.epoch, next_offset: c.next_offset })
                    .collect(),
            };
            Reply::json(200, serde_json::to_vec(&body).unwrap_or_default())
        }
        Err(e) => error_reply(&e),
    }
}

fn now_ms(broker: &Broker) -> u64 {
    broker.clock().wall_ms()
}

/// The source's side of an expired freeze: proposes AbortMove for it (a
/// compare and set on the target). If the move completed meanwhile the
/// abort is refused and the completion seals the partition; if it applies,
/// the freeze lifts (`follow_move_outcomes`). Runs every second.
pub async fn expire_freezes(broker: Arc<Broker>, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(SCAN_EVERY) => {}
            _ = stop.changed() => return,
        }
        for (key, target) in broker.fences().expired(now_ms(&broker)) {
            let meta = broker.meta().clone();
            let k = key.clone();
            let t = target.clone();
            let aborted = tokio::task::spawn_blocking(move || {
                meta.abort_move(&k.topic, k.incarnation, k.partition, &t, None)
            })
            .await;
            match aborted {
                Ok(Ok(())) => {
                    warn!(topic = %key.topic, partition = key.partition, target = %target,
                    "partition move froze this partition and went quiet: aborted")
                }
                Ok(Err(e)) if e.status() == 409 => {
                    // The move completed, or was aborted already: the
                    // metastore's outcome reaches the fence on its own.
                }
                Ok(Err(e)) => warn!(topic = %key.topic, partition = key.partition, error = %e,
                    "cannot abort an expired partition move yet; retrying"),
                Err(e) => warn!(error = %e, "abort task failed"),
            }
        }
    }
}

/// How often a node looks for its copies of partitions that moved away.
const LEFTOVERS_EVERY: Duration = Duration::from_secs(5);

/// The source's side after a flip (SPEC §7.1's destruction rule): deletes
/// this node's copy of every partition the replica shows owned by another
/// member, once the metastore's leader confirms this replica is caught up
/// (so "owned elsewhere" is the cluster's view, not a stale one). Nothing
/// is deleted while no leader answers. Runs every
/// [`LEFTOVERS_EVERY`] until `stop`.
pub async fn discard_leftovers(
    broker: Arc<Broker>,
    control: Arc<narad_cluster::raft::ControlPlane>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(LEFTOVERS_EVERY) => {}
            _ = stop.changed() => return,
        }
        match broker.moved_away_leftovers().await {
            Ok(l) if l.is_empty() => continue,
            Ok(_) => {}
            Err(e) => {
                warn!(error = %e, "cannot list the partitions that moved away from this node");
                continue;
            }
        }
        if let Err(why) = control.caught_up_with_leader().await {
            tracing::debug!(%why, "leftover partition copies kept: the leader did not confirm this replica");
            continue;
        }
        if let Err(e) = broker.discard_moved_partitions().await {
            warn!(error = %e, "cannot delete the copy of a partition that moved away; retrying");
        }
    }
}

/// The destination's mover (see the module docs).
#[derive(Debug)]
pub struct Mover {
    me: String,
    meta: Arc<MetaStore>,
    broker: Arc<Broker>,
    transport: Arc<Transport>,
    running: Mutex<BTreeSet<(String, u64, u32)>>,
    progress: Mutex<BTreeMap<Move, Running>>,
    /// The fan-out cursors each frozen source answered, stored with the
    /// installed copy before the flip.
    cursors: Mutex<BTreeMap<Move, Vec<CursorState>>>,
    metrics: MoveMetrics,
    /// `cluster.move_copy_rate`, shared by every move to this node.
    rate: CopyRate,
    /// Woken when this replica applies a move's start (op 13).
    started: Arc<tokio::sync::Notify>,
}

impl Mover {
    /// A mover for node `me`.
    pub fn new(
        me: String,
        meta: Arc<MetaStore>,
        broker: Arc<Broker>,
        transport: Arc<Transport>,
        metrics: MoveMetrics,
        rate: CopyRate,
    ) -> Arc<Mover> {
        let started = Arc::new(tokio::sync::Notify::new());
        let wake = started.clone();
        meta.on_applied(Arc::new(move |command, _| {
            if matches!(command, narad_meta::Command::SetAssignmentTarget(_)) {
                wake.notify_one();
            }
        }));
        Arc::new(Mover {
            me,
            meta,
            broker,
            transport,
            running: Mutex::new(BTreeSet::new()),
            progress: Mutex::new(BTreeMap::new()),
            cursors: Mutex::new(BTreeMap::new()),
            metrics,
            rate,
            started,
        })
    }

    /// The moves this node runs as their destination, in (topic,
    /// partition) order.
    pub fn progress(&self) -> Vec<MoveProgress> {
        let progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        progress
            .iter()
            .map(|(m, r)| MoveProgress {
                topic: m.topic.clone(),
                partition: m.partition,
                from: m.source.clone(),
                phase: r.phase,
                rounds: r.rounds,
                bytes_copied: r.bytes_copied,
                bytes_total: r.bytes_total,
                age_ms: r.started.elapsed().as_millis() as u64,
            })
            .collect()
    }

    fn note(&self, m: &Move, f: impl FnOnce(&mut Running)) {
        if let Some(r) = self.progress.lock().unwrap_or_else(|p| p.into_inner()).get_mut(m) {
            f(r);
        }
    }

    /// Runs until `stop`: starts a task for every move to this node that
    /// is not running yet.
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(SCAN_EVERY) => {}
                () = self.started.notified() => {}
                _ = stop.changed() => return,
            }
            for m in self.moves_to_me() {
                let fresh = self.running.lock().unwrap_or_else(|p| p.into_inner()).insert(m.slot());
                if !fresh {
                    continue;
                }
                let me = self.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = me.clone().run_move(m.clone()) => {}
                        _ = wait_stop(stop) => {}
                    }
                    me.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&m.slot());
                });
            }
        }
    }

    fn moves_to_me(&self) -> Vec<Move> {
        let state = self.meta.snapshot();
        let mut out = Vec::new();
        for t in state.topics() {
            let Some(parts) = state.assignments(t.name()) else { continue };
            for (&p, a) in parts.iter() {
                if a.target_id.as_deref() == Some(self.me.as_str()) {
                    out.push(Move {
                        topic: t.name().to_owned(),
                        incarnation: t.incarnation(),
                        partition: p,
                        source: a.owner_id.clone(),
                        attempt: a.move_attempt,
                    });
                }
            }
        }
        out.truncate(MAX_MOVES_IN_FLIGHT);
        out
    }

    async fn run_move(self: Arc<Self>, m: Move) {
        let started = Instant::now();
        info!(topic = %m.topic, partition = m.partition, from = %m.source, "partition move to this node starts");
        self.progress.lock().unwrap_or_else(|p| p.into_inner()).insert(
            m.clone(),
            Running {
                started,
                phase: MovePhase::Copying,
                rounds: 0,
                bytes_copied: 0,
                bytes_total: 0,
            },
        );
        self.metrics.inflight.inc();
        // Counted down and the progress dropped however the task ends
        // (aborted at shutdown included).
        let _running = RunningGuard { mover: &self, m: &m };
        match self.copy_and_flip(&m).await {
            Ok(how) => {
                let outcome = if how == FORCE_PROMOTED { "force_promoted" } else { "completed" };
                self.metrics.ended(outcome, started.elapsed());
                info!(topic = %m.topic, partition = m.partition, from = %m.source,
                how, elapsed_ms = started.elapsed().as_millis() as u64, "partition moved to this node")
            }
            Err(why) => {
                self.metrics.ended("aborted", started.elapsed());
                warn!(topic = %m.topic, partition = m.partition, from = %m.source, reason = %why,
                    "partition move failed: aborting it");
                if let Err(e) = self.broker.move_unstage(&m.topic, m.incarnation, m.partition).await
                {
                    warn!(topic = %m.topic, partition = m.partition, error = %e,
                        "cannot remove the failed move's staged copy; it goes at the next start or move");
                }
                let (meta, m2, me) = (self.meta.clone(), m.clone(), self.me.clone());
                let aborted = tokio::task::spawn_blocking(move || {
                    meta.abort_move(&m2.topic, m2.incarnation, m2.partition, &me, m2.attempt)
                })
                .await;
                if let Ok(Err(e)) = aborted
                    && e.status() != 409
                {
                    warn!(topic = %m.topic, partition = m.partition, error = %e, "partition move abort not committed; the next scan retries");
                }
            }
        }
    }

    /// The steps of the module docs; the way the move ended.
    async fn copy_and_flip(&self, m: &Move) -> Result<&'static str, String> {
        let mut copy = self
            .broker
            .move_stage(&m.topic, m.incarnation, m.partition)
            .await
            .map_err(|e| e.to_string())?;
        match self.copy_until_frozen(m, &mut copy).await {
            Ok((frozen, oldest)) => {
                self.install_and_flip(m, copy, oldest, frozen).await?;
                Ok("copied")
            }
            Err(Stall::Source(why, frozen)) => self.source_gone(m, copy, frozen, why).await,
            Err(Stall::Local(why)) => Err(why),
        }
    }

    /// Copy rounds, the freeze and the tail; the frozen figures and the
    /// source's oldest offset.
    async fn copy_until_frozen(
        &self,
        m: &Move,
        copy: &mut IncomingCopy,
    ) -> Result<(FrozenSource, u64), Stall> {
        let mut rounds = 0;
        loop {
            rounds += 1;
            self.note(m, |r| r.rounds = rounds);
            let listing = self.list(m).await.map_err(|why| Stall::Source(why, None))?;
            let behind = self.copy_round(m, &listing, copy, Pace::Limited).await?;
            if behind <= MOVE_CATCH_UP_BYTES || rounds >= MOVE_MAX_ROUNDS {
                break;
            }
        }
        let frozen = self.freeze(m).await.map_err(|why| Stall::Source(why, None))?;
        self.note(m, |r| {
            r.phase = MovePhase::Frozen;
            r.rounds += 1;
        });
        if let Some(d) = pause_after_freeze() {
            tokio::time::sleep(d).await;
        }
        let with_freeze = |stall: Stall| match stall {
            Stall::Source(why, _) => Stall::Source(why, Some(frozen)),
            local => local,
        };
        let listing = self.list(m).await.map_err(|why| Stall::Source(why, Some(frozen)))?;
        self.copy_round(m, &listing, copy, Pace::Frozen).await.map_err(with_freeze)?;
        Ok((frozen, listing.oldest))
    }

    async fn install_and_flip(
        &self,
        m: &Move,
        copy: IncomingCopy,
        oldest: u64,
        frozen: FrozenSource,
    ) -> Result<(), String> {
        self.note(m, |r| r.phase = MovePhase::Installing);
        self.broker
            .move_install(&m.topic, m.incarnation, m.partition, copy, oldest, frozen)
            .await
            .map_err(|e| e.to_string())?;
        let cursors =
            self.cursors.lock().unwrap_or_else(|p| p.into_inner()).remove(m).unwrap_or_default();
        if let Err(e) = self
            .broker
            .move_seed_fanout_cursors(&m.topic, m.incarnation, m.partition, cursors)
            .await
        {
            warn!(topic = %m.topic, partition = m.partition, error = %e,
                "cannot store the moving partition's fan-out cursors; its cursors here start over");
        }
        let (meta, m2, me) = (self.meta.clone(), m.clone(), self.me.clone());
        tokio::task::spawn_blocking(move || {
            meta.complete_move(&m2.topic, m2.incarnation, m2.partition, &m2.source, &me, m2.attempt)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the owner flip was not committed: {e}"))
    }

    /// The source stopped answering: retry until it answers, or until its
    /// member record has been dead for [`MOVE_FORCE_PROMOTE_AFTER`]; then
    /// force-promote a copy that holds everything the frozen source had,
    /// and give up otherwise.
    async fn source_gone(
        &self,
        m: &Move,
        mut copy: IncomingCopy,
        frozen: Option<FrozenSource>,
        why: String,
    ) -> Result<&'static str, String> {
        let mut dead_since: Option<Instant> = None;
        self.note(m, |r| r.phase = MovePhase::WaitingForSource);
        loop {
            tokio::time::sleep(RETRY_EVERY).await;
            if !self.current(m) {
                return Err(GIVEN_UP.into());
            }
            let state = self.meta.snapshot();
            let dead = state.member(&m.source).is_none_or(|s| s.status == MemberStatus::Dead);
            if !dead {
                dead_since = None;
                // Alive again (or never marked dead): carry on from a fresh
                // listing if it answers.
                if let Ok(listing) = self.list(m).await {
                    let frozen = match frozen {
                        Some(f) => f,
                        None => match self.freeze(m).await {
                            Ok(f) => f,
                            Err(_) => continue,
                        },
                    };
                    if self.copy_round(m, &listing, &mut copy, Pace::Frozen).await.is_err() {
                        continue;
                    }
                    let Ok(listing) = self.list(m).await else { continue };
                    if self.copy_round(m, &listing, &mut copy, Pace::Frozen).await.is_err() {
                        continue;
                    }
                    self.install_and_flip(m, copy, listing.oldest, frozen).await?;
                    return Ok("copied after the source came back");
                }
                continue;
            }
            let since = *dead_since.get_or_insert_with(Instant::now);
            if since.elapsed() < force_promote_after() {
                continue;
            }
            let Some(frozen) = frozen else {
                return Err(format!(
                    "the source is dead and never froze, so nothing proves the copy complete ({why})"
                ));
            };
            let oldest = copy_oldest(&copy);
            warn!(topic = %m.topic, partition = m.partition, from = %m.source,
                high_watermark = frozen.high_watermark,
                "the move's source is dead; force-promoting the copy, which holds everything it had frozen");
            self.install_and_flip(m, copy, oldest, frozen).await?;
            return Ok(FORCE_PROMOTED);
        }
    }

    async fn call(&self, source: &str, request: &Request) -> Result<Reply, String> {
        let addr = crate::cluster_node::member_addr(&self.meta, source)?;
        let peer = self.transport.peer(addr, narad_cluster::tls::DEFAULT_SERVER_NAME);
        let reply = peer.call(request).await.map_err(|e| format!("{source}: {e}"))?;
        if reply.status != 200 {
            return Err(format!(
                "{source} answered {}: {}",
                reply.status,
                String::from_utf8_lossy(&reply.body)
            ));
        }
        Ok(reply)
    }

    fn incarnation(m: &Move) -> Option<NonZeroU64> {
        NonZeroU64::new(m.incarnation)
    }

    async fn list(&self, m: &Move) -> Result<MoveListing, String> {
        let request = Request::ListPartitionSegments(MovePartition {
            topic: m.topic.clone(),
            partition: m.partition as i32,
            incarnation: Self::incarnation(m),
        });
        let reply = self.call(&m.source, &request).await?;
        let body: SegmentsBody = serde_json::from_slice(&reply.body)
            .map_err(|e| format!("{}: unreadable segment list: {e}", m.source))?;
        Ok(MoveListing {
            high_watermark: body.high_watermark,
            oldest: body.oldest,
            segments: body
                .segments
                .iter()
                .map(|s| SegmentExtent { base: s.base, len: s.len, end_offset: s.end_offset })
                .collect(),
        })
    }

    async fn freeze(&self, m: &Move) -> Result<FrozenSource, String> {
        let request = Request::PrepareHandoff(Handoff {
            topic: m.topic.clone(),
            partition: m.partition as i32,
            freeze_ttl_nanos: MOVE_FREEZE_TTL.as_nanos() as i64,
            incarnation: Self::incarnation(m),
        });
        let reply = self.call(&m.source, &request).await?;
        let body: FrozenBody = serde_json::from_slice(&reply.body)
            .map_err(|e| format!("{}: unreadable freeze answer: {e}", m.source))?;
        let cursors = body
            .fanout_cursors
            .iter()
            .map(|c| CursorState { epoch: c.epoch, next_offset: c.next_offset })
            .collect();
        self.cursors.lock().unwrap_or_else(|p| p.into_inner()).insert(m.clone(), cursors);
        Ok(FrozenSource {
            high_watermark: body.high_watermark,
            consumer_frontier: body.consumer_frontier,
        })
    }

    /// One chunk (RPC 23): `len` bytes of segment `base` from byte `at`;
    /// answers `(at, len, bytes)` (the bytes may be fewer).
    async fn fetch_chunk(
        &self,
        m: &Move,
        base: u64,
        at: u64,
        len: u64,
    ) -> Result<(u64, u64, bytes::Bytes), String> {
        if let Some(d) = chunk_delay() {
            tokio::time::sleep(d).await;
        }
        let request = Request::FetchSegmentChunk(SegmentChunk {
            topic: m.topic.clone(),
            partition: m.partition as i32,
            base: base as i64,
            at: at as i64,
            length: len as i64,
            incarnation: Self::incarnation(m),
        });
        let reply = self.call(&m.source, &request).await?;
        Ok((at, len, reply.body))
    }

    /// Fetches what `copy` lacks of the segments `listing` names; returns
    /// how many bytes it was behind the listing before this round.
    async fn copy_round(
        &self,
        m: &Move,
        listing: &MoveListing,
        copy: &mut IncomingCopy,
        pace: Pace,
    ) -> Result<u64, Stall> {
        let held: u64 = listing.segments.iter().map(|s| copy.written(s.base)).sum();
        let total = listing.segments.iter().map(|s| s.len).sum::<u64>();
        let behind = total.saturating_sub(held);
        self.note(m, |r| {
            r.bytes_total = total;
            r.bytes_copied = held;
        });
        for s in &listing.segments {
            // A pipeline of chunk fetches from what the copy holds; a short
            // answer (the source's segment ended before its listed length)
            // ends the pipeline and the loop starts another from there.
            while copy.written(s.base) < s.len {
                let from = copy.written(s.base);
                let asks = (from..s.len)
                    .step_by(MOVE_CHUNK_BYTES as usize)
                    .map(|at| (at, (s.len - at).min(MOVE_CHUNK_BYTES)));
                let in_flight = if chunk_delay().is_some() { 1 } else { CHUNKS_IN_FLIGHT };
                let mut fetches = futures_util::stream::iter(
                    asks.map(|(at, len)| self.fetch_chunk(m, s.base, at, len)),
                )
                .buffered(in_flight);
                // The chunk received last is written on a blocking thread
                // while the next one arrives (the destination's buffered
                // write was the copy's largest cost, on the runtime thread).
                let mut writing = None;
                while let Some(fetched) = fetches.next().await {
                    let (at, asked, body) = match fetched {
                        Ok(fetched) => fetched,
                        Err(why) => {
                            // What arrived before is kept: a source that
                            // comes back continues the copy from there.
                            self.written(m, writing.take()).await?;
                            return Err(Stall::Source(why, None));
                        }
                    };
                    if body.is_empty() {
                        let why = format!("segment {} of the source ended early", s.base);
                        return Err(Stall::Local(why));
                    }
                    if !self.current(m) {
                        self.written(m, writing.take()).await?;
                        return Err(Stall::Local(GIVEN_UP.into()));
                    }
                    let n = body.len() as u64;
                    let chunk =
                        copy.stage(s.base, at, body).map_err(|e| Stall::Local(e.to_string()))?;
                    self.written(m, writing.take()).await?;
                    writing = Some(tokio::task::spawn_blocking(move || chunk.write()));
                    if pace == Pace::Limited {
                        // The pipeline is not polled while this waits, so
                        // at most `in_flight` chunks run ahead of the rate
                        // and the waits add up to the time the copy was paced.
                        let waited = self.rate.admit(n).await;
                        self.metrics.throttled.inc_by(waited.as_secs_f64());
                    }
                    if n < asked {
                        break;
                    }
                }
                self.written(m, writing.take()).await?;
            }
        }
        Ok(behind)
    }

    /// Whether this node's replica still shows `m` as a move in flight (the
    /// same attempt, from the same source, to this node): a move aborted or
    /// reassigned meanwhile stops copying at once.
    fn current(&self, m: &Move) -> bool {
        let state = self.meta.snapshot();
        state.topic(&m.topic).is_some_and(|t| t.incarnation() == m.incarnation)
            && state.assignment(&m.topic, m.partition).is_some_and(|a| {
                a.owner_id == m.source
                    && a.target_id.as_deref() == Some(self.me.as_str())
                    && a.move_attempt == m.attempt
            })
    }

    /// Waits for a chunk's write (if any) and counts its bytes as copied.
    async fn written(
        &self,
        m: &Move,
        writing: Option<tokio::task::JoinHandle<Result<u64, narad_log::copy::CopyError>>>,
    ) -> Result<(), Stall> {
        let Some(writing) = writing else { return Ok(()) };
        let n = writing
            .await
            .map_err(|e| Stall::Local(format!("the chunk's writer: {e}")))?
            .map_err(|e| Stall::Local(e.to_string()))?;
        self.metrics.bytes.inc_by(n);
        self.note(m, |r| r.bytes_copied += n);
        Ok(())
    }
}

/// Whether a copy round's chunk fetches take their bytes from
/// `cluster.move_copy_rate` (the rounds before the freeze) or not (the
/// frozen tail: commits wait for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pace {
    Limited,
    Frozen,
}

/// Why a move stopped when this node's replica no longer shows it.
const GIVEN_UP: &str = "the move was aborted or reassigned meanwhile";

/// How [`Mover::copy_and_flip`] says a move was force-promoted.
const FORCE_PROMOTED: &str = "force-promoted";

/// Drops a move's progress entry and counts it out of
/// `narad_moves_inflight` when its task ends, however it ends.
struct RunningGuard<'a> {
    mover: &'a Mover,
    m: &'a Move,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.mover.metrics.inflight.dec();
        self.mover.progress.lock().unwrap_or_else(|p| p.into_inner()).remove(self.m);
        self.mover.cursors.lock().unwrap_or_else(|p| p.into_inner()).remove(self.m);
    }
}

/// The oldest offset a staged copy begins at: its first segment's base.
fn copy_oldest(copy: &IncomingCopy) -> u64 {
    copy.first_segment().unwrap_or(0)
}

async fn wait_stop(mut stop: tokio::sync::watch::Receiver<bool>) {
    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_indexes_from_the_wire_must_not_be_negative() {
        assert!(partition_of(-1).is_err());
        assert_eq!(partition_of(3).unwrap(), 3);
    }
}
