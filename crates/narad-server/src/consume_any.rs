//! Queue-mode consume on a cluster node (no `partition=`): which partition
//! of the topic serves the next consume, this node's or another owner's,
//! and how a consume that found nothing learns at once that another owner
//! got a message (issue 36).
//!
//! **Turns.** Each topic has a cursor of its own on this node. A consume
//! walks the topic's partitions from the cursor and is served by the first
//! one with messages: one of this node's (it knows their counts exactly)
//! or one of another owner's that this node believes has some (a pinned
//! op 2 to the owner, `wait` 0). The cursor then moves past the partition
//! that served, so consecutive consumes go round every partition with
//! messages, local or not, whichever node the consumers connect to: a
//! busy local partition can no longer starve the others, and no other
//! request (a local answer included) moves another topic's turn.
//!
//! **What this node believes of the others.** For each other owner of a
//! topic being consumed here, one watcher task asks it (node RPC
//! ReadyCounts, op 37) how many messages each of its partitions has ready
//! to lease: every [`REFRESH_EVERY`] without waiting while consumes here
//! are busy, and as a long poll ([`WATCH_WAIT`]) while a consume here waits
//! for something. A partition never reported is tried; one reported empty
//! is skipped until a report says otherwise; each pinned consume's answer
//! corrects the belief (204: empty; 200: that many fewer).
//!
//! **Waiting.** A consume that found nothing anywhere waits for this
//! node's own partitions (the broker's long poll) and, at the same time,
//! for a watcher to report another owner's messages; whichever comes first
//! wins. Only the broker's wait and the pinned `wait` 0 consumes lease,
//! and a consume runs one of them at a time, so a request holds at most
//! one lease-taking call at any moment and nothing is leased for a request
//! that has gone on (a ReadyCounts poll leases nothing; an abandoned one
//! costs its owner a waiting task until its wait ends, at most one per
//! topic and watching node). A forwarded long poll per owner would have
//! raced leases on several owners, leaving all but the winner's to be
//! given back.
//!
//! An owner that does not know op 37 (an older release, answering 400
//! `unsupported rpc operation 37`) is asked the old way for
//! [`LEGACY_PEER_TTL`]: an op 2 `local_only` consume without wait after
//! each pass, and this node's wait cut into [`ANY_PARTITION_POLL`] slices.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use narad_broker::Delivered;
use narad_node::consume::answer_of;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use tokio::sync::Notify;

use crate::cluster::ClusterView;
use crate::error::{ApiError, json_response};
use crate::forward::{ConsumeAsk, PartitionRoute, PeerAnswer, relay};
use crate::routes::consume::as_batch_if;
use crate::state::Shared;

/// How often a watcher asks its owner for fresh counts while consumes
/// here are busy (none waiting): a remote partition that got messages is
/// in the turns within this (and a round trip).
pub const REFRESH_EVERY: Duration = Duration::from_millis(100);

/// The wait of a watcher's ReadyCounts long poll while a consume here
/// waits (asked again when it ends).
pub const WATCH_WAIT: Duration = Duration::from_secs(5);

/// How long a watcher keeps going after the last consume of its topic
/// through this node.
pub const WATCH_IDLE: Duration = Duration::from_secs(10);

/// The pause of a watcher after an owner that reported messages, before it
/// asks again: bounds the asks when messages stay ready that the consumes
/// here do not take (another node's consumers take them first).
pub const WATCH_RESPACE: Duration = Duration::from_millis(2);

/// The pause of a watcher after its owner failed or refused to answer.
pub const WATCH_RETRY: Duration = Duration::from_secs(1);

/// How long an owner that does not know ReadyCounts is asked the old way.
pub const LEGACY_PEER_TTL: Duration = Duration::from_secs(120);

/// How long a consume waits for another owner's answer (it asks without
/// waiting, so a healthy owner answers in a round trip); an owner that
/// does not answer is left out of the next rounds for a few seconds.
pub const CONSUME_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a consume waits on this node's partitions before asking an
/// owner that does not know ReadyCounts again.
pub const ANY_PARTITION_POLL: Duration = Duration::from_millis(200);

/// At most this many topics' turns are kept; past it, those of topics not
/// consumed here for a minute are dropped.
const TOPICS_KEPT: usize = 1024;

/// Labels of `narad_consume_any_partition_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ServedLabels {
    /// `local`, `remote`, `none`.
    served: &'static str,
}

/// Labels of `narad_consume_ready_watch_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct WatchLabels {
    /// `ready`, `empty`, `refused`, `unsupported`, `failed`.
    outcome: &'static str,
}

/// The turns of every topic consumed through this node in queue mode.
#[derive(Debug)]
pub struct AnyPartition {
    topics: Mutex<HashMap<String, Arc<TopicTurns>>>,
    served: Family<ServedLabels, Counter>,
    watches: Family<WatchLabels, Counter>,
}

/// One topic's turns on this node.
#[derive(Debug)]
struct TopicTurns {
    /// The partition the next walk starts at.
    cursor: AtomicU32,
    /// Consumes of this topic waiting here now.
    waiting: AtomicUsize,
    /// Wakes waiting consumes: a watcher reported messages.
    remote_ready: Notify,
    /// Wakes the watchers: a consume began to wait.
    kick: Notify,
    state: Mutex<TurnsState>,
}

#[derive(Debug)]
struct TurnsState {
    last_used: Instant,
    /// What this node believes of each other owner, by member id.
    peers: HashMap<String, PeerBelief>,
}

#[derive(Debug, Default)]
struct PeerBelief {
    /// Messages ready by partition, as last reported and corrected since;
    /// a partition not in it is unknown (tried).
    ready: HashMap<u32, u64>,
    /// When it last reported.
    reported: Option<Instant>,
    /// A watcher task runs for it.
    watched: bool,
    /// It does not know ReadyCounts: asked the old way until then.
    legacy_until: Option<Instant>,
}

impl AnyPartition {
    /// No topic consumed yet; registers the metrics.
    pub fn new(registry: &mut Registry) -> Self {
        let a = AnyPartition {
            topics: Mutex::new(HashMap::new()),
            served: Family::default(),
            watches: Family::default(),
        };
        registry.register(
            "consume_any_partition",
            "Queue-mode consumes on a cluster node, by what served them: this node's partitions, another owner's, or none",
            a.served.clone(),
        );
        registry.register(
            "consume_ready_watch",
            "ReadyCounts asks of other owners by this node's watchers, by outcome",
            a.watches.clone(),
        );
        a
    }

    fn turns(&self, topic: &str) -> Arc<TopicTurns> {
        let mut topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = topics.get(topic) {
            return t.clone();
        }
        if topics.len() >= TOPICS_KEPT {
            topics.retain(|_, t| {
                let s = t.state.lock().unwrap_or_else(|p| p.into_inner());
                s.last_used.elapsed() < Duration::from_secs(60)
                    || s.peers.values().any(|p| p.watched)
            });
        }
        let t = Arc::new(TopicTurns {
            cursor: AtomicU32::new(0),
            waiting: AtomicUsize::new(0),
            remote_ready: Notify::new(),
            kick: Notify::new(),
            state: Mutex::new(TurnsState { last_used: Instant::now(), peers: HashMap::new() }),
        });
        topics.insert(topic.to_owned(), t.clone());
        t
    }

    fn serve_count(&self, served: &'static str) {
        self.served.get_or_create(&ServedLabels { served }).inc();
    }
}

impl TopicTurns {
    fn lock(&self) -> std::sync::MutexGuard<'_, TurnsState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `owner`'s partition `p` may have messages (unknown: yes).
    fn maybe_ready(&self, owner: &str, p: u32) -> bool {
        self.lock().peers.get(owner).and_then(|b| b.ready.get(&p)).is_none_or(|n| *n > 0)
    }

    /// A pinned consume of `owner`'s partition `p` got `got` messages (0: a
    /// 204 or a refusal).
    fn took(&self, owner: &str, p: u32, got: u64) {
        let mut s = self.lock();
        let b = s.peers.entry(owner.to_owned()).or_default();
        match (got, b.ready.get_mut(&p)) {
            (0, _) => {
                b.ready.insert(p, 0);
            }
            // Reports go stale either way: it is tried again until a 204
            // says it is empty.
            (n, Some(c)) => *c = c.saturating_sub(n).max(1),
            (_, None) => {}
        }
    }

    fn legacy_peers(&self, serving: &[String]) -> Vec<String> {
        let now = Instant::now();
        let s = self.lock();
        serving
            .iter()
            .filter(|m| s.peers.get(*m).and_then(|b| b.legacy_until).is_some_and(|u| u > now))
            .cloned()
            .collect()
    }
}

/// Where one partition of a walk is served.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Local,
    Remote(String),
}

/// A queue-mode consume on a cluster node (see the module docs).
pub async fn consume_anywhere(
    s: &Shared,
    cluster: &Arc<dyn ClusterView>,
    topic: &str,
    wait: Duration,
    max: Option<usize>,
) -> Result<Response, ApiError> {
    let deadline = tokio::time::Instant::now() + wait;
    let n = s.broker.topic(topic)?.partitions().max(1);
    let serving = cluster.serving_peers(topic);
    let any = &s.any_partition;
    let turns = any.turns(topic);
    turns.lock().last_used = Instant::now();
    for peer in &serving {
        start_watcher(s, cluster, &turns, topic, peer);
    }
    let legacy = turns.legacy_peers(&serving);
    loop {
        // The walk: every partition from the cursor, those with messages.
        let local: HashMap<u32, u64> = s.broker.ready_counts(topic)?.into_iter().collect();
        let start = turns.cursor.load(Ordering::Relaxed) % n;
        let mut walk: Vec<(u32, Source)> = Vec::new();
        for p in (0..n).map(|i| (start + i) % n) {
            if let Some(ready) = local.get(&p) {
                if *ready > 0 {
                    walk.push((p, Source::Local));
                }
                continue;
            }
            if let PartitionRoute::Remote(owner) = cluster.route(topic, p)
                && !legacy.contains(&owner)
                && turns.maybe_ready(&owner, p)
            {
                walk.push((p, Source::Remote(owner)));
            }
        }
        let mut i = 0;
        while i < walk.len() {
            match &walk[i].1 {
                Source::Local => {
                    // This node's partitions next in turn, in one take.
                    let run: Vec<u32> = walk[i..]
                        .iter()
                        .take_while(|(_, src)| *src == Source::Local)
                        .map(|(p, _)| *p)
                        .collect();
                    i += run.len();
                    let got = s.broker.consume_in_order(topic, run, max.unwrap_or(1)).await?;
                    if let Some(r) = served_here(s, &turns, topic, got, max, n) {
                        return Ok(r);
                    }
                }
                Source::Remote(owner) => {
                    let p = walk[i].0;
                    i += 1;
                    if let Some(r) = ask_owner(cluster, &turns, topic, owner, Some(p), max).await {
                        turns.cursor.store((p + 1) % n, Ordering::Relaxed);
                        any.serve_count("remote");
                        return Ok(r);
                    }
                }
            }
        }
        // Owners of an older release: asked for any of theirs, the old way.
        for owner in &legacy {
            if let Some(r) = ask_owner(cluster, &turns, topic, owner, None, max).await {
                any.serve_count("remote");
                return Ok(r);
            }
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            any.serve_count("none");
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        // Nothing anywhere: wait here, and for a watcher's report.
        let mut slice = deadline - now;
        if !legacy.is_empty() {
            slice = slice.min(ANY_PARTITION_POLL);
        }
        let _waiting = Waiting::begin(&turns);
        let reported = turns.remote_ready.notified();
        tokio::pin!(reported);
        reported.as_mut().enable();
        tokio::select! {
            got = s.broker.consume(topic, None, slice, max.unwrap_or(1)) => {
                if let Some(r) = served_here(s, &turns, topic, got?, max, n) {
                    return Ok(r);
                }
            }
            _ = &mut reported => {}
        }
    }
}

/// The answer of what this node's partitions gave (`None`: nothing), with
/// the cursor moved past the last partition that served.
fn served_here(
    s: &Shared,
    turns: &TopicTurns,
    topic: &str,
    got: Vec<Delivered>,
    max: Option<usize>,
    n: u32,
) -> Option<Response> {
    let last = got.last()?.partition;
    let json = answer_of(&s.broker, topic, &got, max.is_some())?;
    turns.cursor.store((last + 1) % n, Ordering::Relaxed);
    s.any_partition.serve_count("local");
    Some(json_response(StatusCode::OK, json))
}

/// Asks `owner` for a message of its partition `p` (pinned), or of any of
/// its own (`None`: `local_only`), without waiting; the answer when it has
/// one. What it says corrects this node's belief.
async fn ask_owner(
    cluster: &Arc<dyn ClusterView>,
    turns: &TopicTurns,
    topic: &str,
    owner: &str,
    p: Option<u32>,
    max: Option<usize>,
) -> Option<Response> {
    let ask = ConsumeAsk {
        topic: topic.to_owned(),
        partition: p,
        offset: None,
        wait: Duration::ZERO,
        max,
    };
    match cluster.consume_at(owner, ask, CONSUME_PROBE_TIMEOUT).await {
        Ok(reply) if reply.status == 200 => {
            if let Some(p) = p {
                turns.took(owner, p, count_messages(&reply, max.is_some()));
            }
            Some(relay(as_batch_if(reply, max == Some(1))))
        }
        Ok(reply) => {
            if reply.status != 204 {
                tracing::debug!(topic, owner, status = reply.status,
                    error = %reply.message(), "an owner refused a queue-mode consume");
            }
            if let Some(p) = p {
                turns.took(owner, p, 0);
            }
            None
        }
        Err(why) => {
            tracing::debug!(topic, owner, why, "an owner did not answer a queue-mode consume");
            if let Some(p) = p {
                turns.took(owner, p, 0);
            }
            None
        }
    }
}

/// How many messages an owner's 200 holds (a batch's, or 1).
fn count_messages(reply: &PeerAnswer, batch: bool) -> u64 {
    #[derive(Deserialize)]
    struct Batch {
        messages: Vec<serde::de::IgnoredAny>,
    }
    if !batch {
        return 1;
    }
    serde_json::from_slice::<Batch>(&reply.body).map_or(1, |b| b.messages.len() as u64)
}

/// Counts a consume as waiting while it lives, and wakes the watchers so
/// they long-poll their owners.
struct Waiting<'a>(&'a TopicTurns);

impl<'a> Waiting<'a> {
    fn begin(turns: &'a TopicTurns) -> Self {
        turns.waiting.fetch_add(1, Ordering::AcqRel);
        turns.kick.notify_waiters();
        Waiting(turns)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts the watcher of `peer` for `topic` unless one runs (or the peer
/// is asked the old way).
fn start_watcher(
    s: &Shared,
    cluster: &Arc<dyn ClusterView>,
    turns: &Arc<TopicTurns>,
    topic: &str,
    peer: &str,
) {
    {
        let mut st = turns.lock();
        let b = st.peers.entry(peer.to_owned()).or_default();
        if b.watched || b.legacy_until.is_some_and(|u| u > Instant::now()) {
            return;
        }
        b.watched = true;
    }
    let (s, cluster, turns) = (s.clone(), cluster.clone(), turns.clone());
    let (topic, peer) = (topic.to_owned(), peer.to_owned());
    tokio::spawn(async move {
        watch(&s.any_partition, &*cluster, &turns, &topic, &peer).await;
        turns.lock().peers.entry(peer).or_default().watched = false;
    });
}

/// The answer of ReadyCounts.
#[derive(Debug, Deserialize)]
struct ReadyReply {
    ready: Vec<(u32, u64)>,
}

/// One watcher: keeps this node's belief of `peer`'s partitions of `topic`
/// fresh while the topic is consumed here, long-polling while a consume
/// waits, and wakes the waiting consumes when `peer` reports messages.
async fn watch(
    any: &AnyPartition,
    cluster: &dyn ClusterView,
    turns: &TopicTurns,
    topic: &str,
    peer: &str,
) {
    loop {
        let kicked = turns.kick.notified();
        tokio::pin!(kicked);
        kicked.as_mut().enable();
        let waiting = turns.waiting.load(Ordering::Acquire) > 0;
        let (idle, reported) = {
            let st = turns.lock();
            (st.last_used.elapsed(), st.peers.get(peer).and_then(|b| b.reported))
        };
        if !waiting && idle >= WATCH_IDLE {
            return;
        }
        if !waiting && let Some(at) = reported {
            let due = at + REFRESH_EVERY;
            if due > Instant::now() {
                tokio::select! {
                    _ = &mut kicked => {}
                    _ = tokio::time::sleep_until(due.into()) => {}
                }
                continue;
            }
        }
        let wait = if waiting { WATCH_WAIT } else { Duration::ZERO };
        let reply = cluster.ready_counts_at(peer, topic, wait).await;
        let outcome = match reply {
            Ok(r) if r.status == 200 => match serde_json::from_slice::<ReadyReply>(&r.body) {
                Ok(counts) => {
                    let ready: u64 = counts.ready.iter().map(|(_, n)| n).sum();
                    {
                        let mut st = turns.lock();
                        let b = st.peers.entry(peer.to_owned()).or_default();
                        b.ready = counts.ready.into_iter().collect();
                        b.reported = Some(Instant::now());
                    }
                    if ready > 0 {
                        let wake = ready.min(turns.waiting.load(Ordering::Acquire) as u64);
                        for _ in 0..wake {
                            turns.remote_ready.notify_one();
                        }
                        "ready"
                    } else {
                        "empty"
                    }
                }
                Err(e) => {
                    tracing::debug!(topic, peer, error = %e, "unreadable ReadyCounts answer");
                    "failed"
                }
            },
            Ok(r) if r.status == 400 && r.message().contains("unsupported") => {
                tracing::info!(
                    topic,
                    peer,
                    "this owner does not know ReadyCounts (an older release): asked the old way"
                );
                turns.lock().peers.entry(peer.to_owned()).or_default().legacy_until =
                    Some(Instant::now() + LEGACY_PEER_TTL);
                any.watches.get_or_create(&WatchLabels { outcome: "unsupported" }).inc();
                return;
            }
            Ok(r) => {
                tracing::debug!(topic, peer, status = r.status,
                    error = %r.message(), "an owner refused ReadyCounts");
                "refused"
            }
            Err(why) => {
                tracing::debug!(topic, peer, why, "an owner did not answer ReadyCounts");
                "failed"
            }
        };
        any.watches.get_or_create(&WatchLabels { outcome }).inc();
        match outcome {
            "ready" => tokio::time::sleep(WATCH_RESPACE).await,
            "empty" => {}
            _ => {
                // Nothing known of it: skipped by the walks until it answers.
                {
                    let mut st = turns.lock();
                    let b = st.peers.entry(peer.to_owned()).or_default();
                    for n in b.ready.values_mut() {
                        *n = 0;
                    }
                    b.reported = Some(Instant::now());
                }
                tokio::time::sleep(WATCH_RETRY).await;
            }
        }
    }
}
