//! Fan-out: copying a parent topic's committed records into its children.
//!
//! One *cursor* ([`cursor`]) per (parent partition, child, attach epoch)
//! runs on the parent partition's owner. It tails the parent's log up to
//! the high watermark, groups what it read by child partition (a keyed
//! record goes to the partition its key hashes to in the child, a keyless
//! one is spread), and commits each group through the same
//! [`crate::owner::Owner`] as the dispatcher (the child's combiner sees it
//! as one more caller). Only when every child commit of a slab is durable
//! does the cursor's file move past it, so a crash re-sends (duplicates),
//! never skips (loss).
//!
//! A delayed child gets a record no earlier than its parent commit time +
//! the delay: reads stop at the first record committed after `now − delay`
//! (commit times never decrease along a partition), and an idle delayed
//! cursor sleeps until that record is due (at most 30 s at a time).
//!
//! # Where a child starts: the parent's high watermark at the attach
//!
//! There is no backfill. Before a link (an attach, or a create with
//! `parent`) is committed to the metastore, [`FanoutRunner::anchor_link`]
//! writes the cursor file of the new epoch in every parent partition at
//! that partition's current high watermark (on a cluster, each owner of a
//! parent partition writes its own, asked by the node making the change:
//! [`peers`]). So a record the parent had
//! committed before the attach never reaches the child, and every record
//! it commits after the attach answered does (a record accepted earlier but
//! still in the ingress WAL is committed later, and is delivered). A cursor
//! that finds no file of its epoch (a partition added later, a file that
//! could not be written) starts at the first record committed at or after
//! the link's `attached_at_ms` less [`FANOUT_ANCHOR_CLOCK_MARGIN`]
//! ([`fallback_since_ms`]): commit times are the owner's clock, the attach
//! time another node's, and an owner whose clock runs behind must not skip
//! what it committed after the attach (extra copies from before the attach,
//! never a gap).
//!
//! A re-attach gets a new epoch: a file of an older epoch is never resumed.
//!
//! # Link changes
//!
//! Attach, detach, create-with-parent and delete hold
//! [`FanoutRunner::lock_links`] across "metastore change + cursor files", and
//! so does the reconciler, so a reconcile never sees half of a change. The
//! broker reconciles right after each change ([`FanoutRunner::reconcile_now`]:
//! the cursors of a dissolved link have stopped and their files are gone
//! when it returns) and every second in the background. Files whose link
//! is gone are removed by their own epoch only; a sweep at start-up and
//! every [`FANOUT_SWEEP_EVERY`] passes removes cursor files of children
//! that are no longer linked at all (e.g. after a crash between a detach
//! and its clean-up).
//!
//! Each cursor is its own task: a lagging or failing child stalls only its
//! own cursors. Within a cursor, a child partition whose commits fail
//! holds back only its own share of the slab (and, while its keyed
//! records wait, the cursor's next slab); keyless records go around a
//! child partition without a live owner (`fanout/slab.rs`).
//!
//! # A stale replica never acts
//!
//! On a cluster node the reconciler (cursor starts and resumes) and the
//! sweep act only once this node's metadata replica has caught up with the
//! Raft leader ([`ReplicaFreshness`]: a leader known and heard from within
//! 5 s, and everything the leader had committed when asked applied here;
//! SPEC §6, §7.1). A node restarted after missing a detach would otherwise
//! start the detached child's cursors from its stale replica and copy
//! records into it until it applied the detach. While it waits,
//! `narad_fanout_waiting_for_replica` is 1 and a rate-limited INFO line
//! says why.
//!
//! # A cursor that stops
//!
//! A cursor ends on its own only when it cannot go on: its parent
//! partition cannot be opened, its file cannot be read or written at the
//! start, or the start point cannot be found (see [`cursor`]). While its
//! link holds, the reconciler starts it again after a backoff (1 s,
//! doubling to [`FANOUT_RESTART_BACKOFF_MAX`]), counts it
//! (`narad_fanout_cursor_restarts_total{parent,child}`) and warns; until
//! then the child's `lag_complete` is `false` and its `lag_messages`
//! counts that partition from the cursor's last known position (or its
//! file).

pub mod cursor;
pub mod cursor_file;
pub mod peers;
pub mod slab;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use narad_clock::ClockRef;
use narad_fs::FsRef;
use narad_meta::{MetaStore, ParentLink, Topic};
use prometheus_client::encoding::EncodeLabelSet;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::dispatch::core::Topology;
use crate::limits::{
    FANOUT_ANCHOR_CLOCK_MARGIN, FANOUT_RECONCILE_INTERVAL, FANOUT_RESTART_BACKOFF_MAX,
    FANOUT_RESTART_BACKOFF_MIN, FANOUT_STOP_WAIT, FANOUT_SWEEP_EVERY,
};
use crate::metrics::BrokerMetrics;
use crate::owner::Owner;
use crate::topics::Topics;
use cursor::{Cursor, CursorShared, NO_POSITION, StopReason};
use cursor_file::{CursorFileOf, CursorState};

pub use cursor::anchor;

/// Whether this node's metadata replica has caught up with the Raft
/// leader (implemented by the cluster's control plane).
pub trait ReplicaFreshness: Send + Sync + std::fmt::Debug {
    /// `Ok` once a leader is known and was heard from recently, and this
    /// replica applied everything the leader had committed when asked;
    /// `Err` says why not.
    fn caught_up(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + '_>>;
}

/// How often the reconciler says it waits for the replica.
const STALE_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Identifies one cursor.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CursorKey {
    /// Parent topic.
    pub parent: String,
    /// Parent incarnation.
    pub parent_incarnation: u64,
    /// Parent partition.
    pub partition: u32,
    /// Child topic.
    pub child: String,
    /// The attachment.
    pub epoch: u64,
}

/// `{parent, child, partition}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FanoutPartitionLabels {
    /// Parent topic.
    pub parent: String,
    /// Child topic.
    pub child: String,
    /// Parent partition.
    pub partition: String,
}

/// `{parent, child}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FanoutLabels {
    /// Parent topic.
    pub parent: String,
    /// Child topic.
    pub child: String,
}

/// What cursors share.
pub struct FanoutCtx {
    /// The metastore.
    pub meta: Arc<MetaStore>,
    /// Opened topics.
    pub topics: Arc<Topics>,
    /// Where child commits go.
    pub owner: Arc<dyn Owner>,
    /// Who owns each child partition (the dispatcher's view: this node on
    /// a single node, the replicated assignments on a cluster node).
    pub topology: Arc<dyn Topology + Send + Sync>,
    /// On a cluster node, this member's id: cursors run only for the parent
    /// partitions it owns (the parent's records are in its owner's log).
    /// `None` on a single node: every parent partition.
    pub node_id: Option<String>,
    /// The file layer (cursor files).
    pub fs: FsRef,
    /// Time.
    pub clock: ClockRef,
    /// Metrics.
    pub metrics: Arc<BrokerMetrics>,
    /// On a cluster node, whether this replica caught up with the leader
    /// (see the module docs). `None` on a single node: always.
    pub freshness: Option<Arc<dyn ReplicaFreshness>>,
}

impl std::fmt::Debug for FanoutCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanoutCtx").field("node_id", &self.node_id).finish_non_exhaustive()
    }
}

struct Running {
    shared: Arc<CursorShared>,
    task: JoinHandle<()>,
    /// Starts since the cursor last got going (0 for the first).
    restarts: u32,
    /// When a cursor found stopped may start again.
    retry_at: Option<tokio::time::Instant>,
}

impl Running {
    /// Whether the cursor's task has ended while its link may still hold.
    fn ended(&self) -> bool {
        self.task.is_finished()
    }
}

/// The wait before the `restarts`-th restart in a row: 1 s, doubling, at
/// most [`FANOUT_RESTART_BACKOFF_MAX`].
fn restart_backoff(restarts: u32) -> std::time::Duration {
    FANOUT_RESTART_BACKOFF_MIN
        .saturating_mul(1u32 << restarts.min(16))
        .min(FANOUT_RESTART_BACKOFF_MAX)
}

/// One child's fan-out progress, for `GET /v1/topics/{parent}/children`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChildLag {
    /// The child topic.
    pub name: String,
    /// Its delivery delay, ms.
    pub delay_ms: u64,
    /// Σ over the parent's partitions of max(0, parent high watermark −
    /// cursor).
    pub lag_messages: u64,
    /// How far past its due time (parent commit time + delay) the oldest
    /// record not yet fanned out is, in seconds; 0 when nothing is overdue.
    pub lag_seconds: f64,
    /// Whether every parent partition has a running cursor whose position
    /// is known (on a cluster: and every owner answered). When `false`,
    /// `lag_messages` still counts each partition whose cursor's last
    /// position is known (from memory or its file), and leaves out only
    /// those where none is.
    pub lag_complete: bool,
}

impl ChildLag {
    /// Adds another node's figures for the same child (over other
    /// partitions).
    pub fn merge(&mut self, other: &ChildLag) {
        self.lag_messages += other.lag_messages;
        self.lag_seconds = self.lag_seconds.max(other.lag_seconds);
        self.lag_complete &= other.lag_complete;
    }
}

/// Starts and stops cursors as fan-out links change.
pub struct FanoutRunner {
    ctx: Arc<FanoutCtx>,
    running: std::sync::Mutex<HashMap<CursorKey, Running>>,
    links: tokio::sync::Mutex<()>,
    /// Epochs anchored here for another node's link change not committed
    /// yet, with when: the sweep keeps their files for
    /// [`peers::PENDING_ANCHOR_TTL`].
    pending_anchors: std::sync::Mutex<HashMap<u64, std::time::Instant>>,
}

impl std::fmt::Debug for FanoutRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanoutRunner").finish_non_exhaustive()
    }
}

/// One wanted cursor: its key, the child's delay and when the link was
/// made (Unix ms; a link recorded before attach times were kept counts
/// from the child's creation).
struct Wanted {
    key: CursorKey,
    delay_ms: u64,
    since_ms: u64,
}

/// Where a cursor without a file of its link's epoch starts: at the first
/// record committed at or after this wall time, the link's attach time (its
/// child's creation for links that predate `attached_at_ms`) less
/// [`FANOUT_ANCHOR_CLOCK_MARGIN`], so that an owner whose clock runs behind
/// the attaching node's skips nothing committed after the attach.
pub fn fallback_since_ms(child: &Topic, link: &ParentLink) -> u64 {
    let attached = match link.attached_at_ms {
        0 => (child.created_at().max(0) as u64) * 1000,
        ms => ms,
    };
    attached.saturating_sub(FANOUT_ANCHOR_CLOCK_MARGIN.as_millis() as u64)
}

/// The cursors the metastore asks for.
fn desired(meta: &MetaStore, node_id: Option<&str>) -> Vec<Wanted> {
    let snap = meta.snapshot();
    let mine = |parent: &str, p: u32| {
        node_id.is_none_or(|me| snap.assignment(parent, p).is_some_and(|a| a.owner_id == me))
    };
    let mut out = Vec::new();
    for parent in snap.topics().filter(|t| !t.children().is_empty()) {
        for child_name in parent.children() {
            let Some(child) = snap.topic(child_name) else { continue };
            let Some(link) = child.parent().filter(|l| l.name == parent.name()) else { continue };
            let Some(epoch) = cursor_file::parse_epoch(&link.attach_epoch) else { continue };
            let since_ms = fallback_since_ms(child, link);
            for p in (0..parent.partitions()).filter(|&p| mine(parent.name(), p)) {
                out.push(Wanted {
                    key: CursorKey {
                        parent: parent.name().to_owned(),
                        parent_incarnation: parent.incarnation(),
                        partition: p,
                        child: child_name.clone(),
                        epoch,
                    },
                    delay_ms: link.fanout_delay_ms,
                    since_ms,
                });
            }
        }
    }
    out
}

/// Cursors taken out of the running set, not yet joined.
#[must_use = "stopped cursors must be finished (joined and cleaned up)"]
struct Stopped(Vec<(CursorKey, Running)>);

/// Held while a link change and its cursor files are made (see the module
/// docs).
pub type LinksGuard<'a> = tokio::sync::MutexGuard<'a, ()>;

impl FanoutRunner {
    /// A runner with no cursors yet.
    pub fn new(ctx: Arc<FanoutCtx>) -> Arc<FanoutRunner> {
        Arc::new(FanoutRunner {
            ctx,
            running: std::sync::Mutex::new(HashMap::new()),
            links: tokio::sync::Mutex::new(()),
            pending_anchors: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Anchors another node's new link in the partitions of `partitions`
    /// this node runs cursors for (blocking I/O; call with the links lock
    /// held): the owner's side of [`peers::LinkPeers::anchor`]. Its files
    /// are kept from the sweep until the link is committed (or
    /// [`peers::PENDING_ANCHOR_TTL`] passed).
    pub fn anchor_for_peer(
        &self,
        parent: &Topic,
        link: &peers::NewLink,
        partitions: &[u32],
    ) -> Vec<u32> {
        // A link already committed here (a late or repeated request, or a
        // peer that lies) is never re-anchored: moving its cursor to the
        // high watermark would skip records the child is owed.
        let snap = self.ctx.meta.snapshot();
        let committed = parent.children().iter().any(|c| {
            snap.topic(c)
                .and_then(|t| t.parent().and_then(|l| cursor_file::parse_epoch(&l.attach_epoch)))
                == Some(link.epoch)
        });
        if committed {
            return Vec::new();
        }
        let mine = self.owned_partitions(parent);
        let rt = self.ctx.topics.get_open(parent.name(), parent.incarnation());
        let (mut wanted, mut kept) = (Vec::new(), Vec::new());
        for p in partitions.iter().copied().filter(|p| mine.contains(p)) {
            // A file of this epoch already there stays as it is.
            let existing = rt.as_ref().and_then(|rt| rt.peek_partition(p)).and_then(|part| {
                cursor_file::peek(&*self.ctx.fs, part.log.dir(), &link.child, link.epoch)
                    .ok()
                    .flatten()
            });
            if existing.is_some() { kept.push(p) } else { wanted.push(p) }
        }
        let now = std::time::Instant::now();
        {
            let mut pending = self.pending_anchors.lock().unwrap_or_else(|p| p.into_inner());
            pending.retain(|_, at| now.duration_since(*at) < peers::PENDING_ANCHOR_TTL);
            // Bounded: past this, an anchor may be swept before its link
            // commits, and the cursor falls back to the attach time.
            if pending.len() < peers::PENDING_ANCHORS_MAX {
                pending.insert(link.epoch, now);
            }
        }
        let mut anchored = self.anchor_link(parent, &link.child, link.epoch, &wanted);
        anchored.extend(kept);
        anchored.sort_unstable();
        anchored
    }

    /// Whether the sweep keeps files of `epoch` (anchored for a link
    /// change not committed yet).
    fn anchor_pending(&self, epoch: u64) -> bool {
        let pending = self.pending_anchors.lock().unwrap_or_else(|p| p.into_inner());
        pending.get(&epoch).is_some_and(|at| at.elapsed() < peers::PENDING_ANCHOR_TTL)
    }

    /// This node's figures of `parent`'s children over the partitions whose
    /// cursors run here (blocking): the owner's side of
    /// [`peers::LinkPeers::lag`].
    pub fn lag_here(&self, parent: &Topic) -> peers::PeerLag {
        let partitions = self.owned_partitions(parent);
        let snap = self.ctx.meta.snapshot();
        let children = parent
            .children()
            .iter()
            .filter_map(|c| snap.topic(c))
            .map(|c| self.child_lag(parent, c, &partitions))
            .collect();
        peers::PeerLag { partitions, children }
    }

    /// Serializes link changes with each other and with the reconciler.
    pub async fn lock_links(&self) -> LinksGuard<'_> {
        self.links.lock().await
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<CursorKey, Running>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts missing cursors, restarts ended ones whose link holds (after
    /// their backoff) and takes unwanted ones out of the running set (asked
    /// to stop as unlinked). Cheap when nothing changed. Call with the
    /// links lock held.
    fn reconcile(&self) -> Stopped {
        let want = desired(&self.ctx.meta, self.ctx.node_id.as_deref());
        let mut running = self.running();
        let keys: HashSet<&CursorKey> = want.iter().map(|w| &w.key).collect();
        let gone: Vec<CursorKey> = running.keys().filter(|k| !keys.contains(k)).cloned().collect();
        let mut stopped = Vec::new();
        for k in gone {
            if let Some(r) = running.remove(&k) {
                r.shared.stop(StopReason::Unlinked);
                stopped.push((k, r));
            }
        }
        let now = tokio::time::Instant::now();
        for w in want {
            let mut restarts = 0;
            if let Some(r) = running.get_mut(&w.key) {
                if !r.ended() {
                    continue;
                }
                // It had got going: a new run of failures starts over.
                let got_going = r.shared.position.load(Ordering::Acquire) != NO_POSITION;
                let n = if got_going { 0 } else { r.restarts };
                match r.retry_at {
                    None => {
                        let wait = restart_backoff(n);
                        r.retry_at = Some(now + wait);
                        warn!(parent = %w.key.parent, child = %w.key.child, partition = w.key.partition, retry_in_ms = wait.as_millis() as u64, "fan-out cursor stopped while its link holds; restarting it");
                        continue;
                    }
                    Some(at) if now < at => continue,
                    Some(_) => {}
                }
                restarts = n + 1;
                self.ctx
                    .metrics
                    .fanout_cursor_restarts
                    .get_or_create(&FanoutLabels {
                        parent: w.key.parent.clone(),
                        child: w.key.child.clone(),
                    })
                    .inc();
            }
            let shared = Arc::new(CursorShared::new());
            let cursor = Cursor::new(
                self.ctx.clone(),
                w.key.clone(),
                w.delay_ms,
                w.since_ms,
                shared.clone(),
            );
            let task = tokio::spawn(cursor.run());
            running.insert(w.key, Running { shared, task, restarts, retry_at: None });
        }
        Stopped(stopped)
    }

    /// Joins stopped cursors (all of them within [`FANOUT_STOP_WAIT`]),
    /// removes their files (by their own epoch) and their metric series.
    async fn finish(&self, stopped: Stopped) {
        let deadline = tokio::time::Instant::now() + FANOUT_STOP_WAIT;
        for (k, r) in stopped.0 {
            if tokio::time::timeout_at(deadline, r.task).await.is_err() {
                warn!(parent = %k.parent, child = %k.child, partition = k.partition, "fan-out cursor did not stop in time; its file is left to the sweep");
            }
            if let Some(dir) = r.shared.dir() {
                let (fs, child) = (self.ctx.fs.clone(), k.child.clone());
                let removed = tokio::task::spawn_blocking(move || {
                    cursor_file::remove_if_epoch(&*fs, &dir, &child, k.epoch)
                })
                .await;
                if let Ok(Err(e)) = removed {
                    warn!(parent = %k.parent, child = %k.child, partition = k.partition, error = %e, "cannot remove a fan-out cursor file");
                }
            }
            self.ctx.metrics.forget_fanout_cursor(&k.parent, &k.child, k.partition);
            info!(parent = %k.parent, child = %k.child, partition = k.partition, "fan-out cursor stopped");
        }
    }

    /// Reconciles now and waits until the cursors of dissolved links have
    /// stopped and their files are gone. Call with the links lock held.
    pub async fn reconcile_now(&self, _links: &LinksGuard<'_>) {
        let stopped = self.reconcile();
        self.finish(stopped).await;
    }

    /// Runs the reconciler every second (and the sweep at the first pass
    /// and every [`FANOUT_SWEEP_EVERY`] passes) until `stop` turns true.
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(FANOUT_RECONCILE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pass: u64 = 0;
        let mut stale_log = crate::log_gate::LogGate::every(STALE_LOG_EVERY);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => break,
            }
            if let Some(freshness) = &self.ctx.freshness {
                let checked = tokio::select! {
                    checked = freshness.caught_up() => checked,
                    _ = stop.changed() => break,
                };
                let waiting = &self.ctx.metrics.fanout_waiting_for_replica;
                match checked {
                    Ok(()) => {
                        if waiting.get() != 0 {
                            info!("this replica caught up with the raft leader: fan-out resumes");
                        }
                        waiting.set(0);
                    }
                    Err(why) => {
                        waiting.set(1);
                        if let Some(held) = stale_log.hit(self.ctx.clock.mono()) {
                            info!(reason = %why, suppressed = held, "fan-out waits for this replica to catch up with the raft leader: no cursor starts, no sweep");
                        }
                        continue;
                    }
                }
            }
            let links = self.links.lock().await;
            let stopped = self.reconcile();
            if pass.is_multiple_of(FANOUT_SWEEP_EVERY) {
                let me = self.clone();
                let _ = tokio::task::spawn_blocking(move || me.sweep()).await;
            }
            drop(links);
            pass += 1;
            if !stopped.0.is_empty() {
                let me = self.clone();
                tokio::spawn(async move { me.finish(stopped).await });
            }
        }
        self.stop_all().await;
    }

    /// Stops every cursor and waits for them (files stay: the links do).
    pub async fn stop_all(&self) {
        let all: Vec<Running> = self.running().drain().map(|(_, r)| r).collect();
        for r in &all {
            r.shared.stop(StopReason::Shutdown);
        }
        for r in all {
            let _ = r.task.await;
        }
    }

    /// The running cursors, in key order.
    pub fn cursors(&self) -> Vec<CursorKey> {
        let mut keys: Vec<CursorKey> = self.running().keys().cloned().collect();
        keys.sort();
        keys
    }

    /// The partitions of `parent` whose cursors run here: every one on a
    /// single node, those the replicated assignments give this member on a
    /// cluster node.
    pub fn owned_partitions(&self, parent: &Topic) -> Vec<u32> {
        let Some(me) = self.ctx.node_id.as_deref() else {
            return (0..parent.partitions()).collect();
        };
        let snap = self.ctx.meta.snapshot();
        (0..parent.partitions())
            .filter(|&p| snap.assignment(parent.name(), p).is_some_and(|a| a.owner_id == me))
            .collect()
    }

    /// Writes the cursor file of a new link (`child` under `parent`, epoch
    /// `epoch`) in each of `partitions` (of `parent`, held here) at its
    /// current high watermark, before the link is committed (blocking
    /// I/O). A partition that cannot be opened or written is logged and
    /// skipped: its cursor falls back to the link's attach time. Returns the
    /// partitions anchored.
    pub fn anchor_link(
        &self,
        parent: &Topic,
        child: &str,
        epoch: u64,
        partitions: &[u32],
    ) -> Vec<u32> {
        let mut anchored = Vec::new();
        for &p in partitions.iter().filter(|&&p| p < parent.partitions()) {
            let part = match self.ctx.topics.partition(parent, p) {
                Ok(part) => part,
                Err(e) => {
                    warn!(parent = parent.name(), partition = p, error = %e, "cannot open the parent partition to anchor a new child; its cursor starts from the attach time");
                    continue;
                }
            };
            let hwm = part.log.high_watermark();
            let path = cursor_file::path(part.log.dir(), epoch);
            let state = CursorState { epoch, next_offset: hwm };
            match cursor_file::store(&*self.ctx.fs, &path, state) {
                Ok(()) => anchored.push(p),
                Err(e) => {
                    warn!(parent = parent.name(), child, partition = p, error = %e, "cannot anchor a new child's cursor; it starts from the attach time");
                }
            }
        }
        anchored
    }

    /// Removes the cursor files of link (`parent`, `child`, `epoch`) from
    /// every open partition of `parent` (blocking I/O); files of another
    /// epoch stay. Returns how many were removed.
    pub fn remove_link_files(&self, parent: &Topic, child: &str, epoch: u64) -> u32 {
        let Some(rt) = self.ctx.topics.get_open(parent.name(), parent.incarnation()) else {
            return 0;
        };
        let mut removed = 0;
        for part in rt.open_partitions() {
            match cursor_file::remove_if_epoch(&*self.ctx.fs, part.log.dir(), child, epoch) {
                Ok(true) => removed += 1,
                Ok(false) => {}
                Err(e) => {
                    warn!(parent = parent.name(), child, partition = part.index, error = %e, "cannot remove a fan-out cursor file");
                }
            }
        }
        removed
    }

    /// Removes cursor files (and their temporary files) of children no
    /// longer linked to the topic whose partition holds them (blocking I/O;
    /// call with the links lock held). Returns how many were removed.
    pub fn sweep(&self) -> u32 {
        let snap = self.ctx.meta.snapshot();
        let mut removed = 0;
        for rt in self.ctx.topics.all() {
            // The linked children and the epochs of their links.
            let (linked, epochs): (HashSet<&str>, HashSet<u64>) = match snap.topic(&rt.name) {
                Some(t) if t.incarnation() == rt.incarnation => t
                    .children()
                    .iter()
                    .filter_map(|c| {
                        let link = snap.topic(c)?.parent().filter(|l| l.name == t.name())?;
                        Some((c.as_str(), cursor_file::parse_epoch(&link.attach_epoch)?))
                    })
                    .unzip(),
                _ => continue, // a topic being removed: its directory goes whole
            };
            for part in rt.open_partitions() {
                let dir = part.log.dir();
                let entries = match self.ctx.fs.list_dir(dir) {
                    Ok(e) => e,
                    Err(e) => {
                        warn!(dir = %dir.display(), error = %e, "fan-out sweep cannot list a partition");
                        continue;
                    }
                };
                for e in entries.iter().filter(|e| !e.is_dir) {
                    let keep = match cursor_file::file_of(&e.name) {
                        None => continue,
                        Some(CursorFileOf::Epoch(epoch)) => {
                            epochs.contains(&epoch) || self.anchor_pending(epoch)
                        }
                        Some(CursorFileOf::LegacyChild(child)) => linked.contains(child),
                    };
                    if keep {
                        continue;
                    }
                    match self.ctx.fs.remove_file(&dir.join(&e.name)) {
                        Ok(()) => {
                            removed += 1;
                            info!(topic = %rt.name, partition = part.index, file = %e.name, "removed the cursor file of a child no longer attached");
                        }
                        Err(e) => {
                            warn!(dir = %dir.display(), error = %e, "fan-out sweep cannot remove a file")
                        }
                    }
                }
            }
        }
        removed
    }

    /// The fan-out progress of `child` under `parent` over `partitions` (of
    /// `parent`, those whose cursors run here; blocking: it may read one
    /// parent record per partition to date the oldest unsent one).
    /// `lag_complete` speaks for those partitions only.
    pub fn child_lag(&self, parent: &Topic, child: &Topic, partitions: &[u32]) -> ChildLag {
        let link = child.parent().filter(|l| l.name == parent.name());
        let delay_ms = link.map_or(0, |l| l.fanout_delay_ms);
        let epoch = link.and_then(|l| cursor_file::parse_epoch(&l.attach_epoch));
        let rt = self.ctx.topics.get_open(parent.name(), parent.incarnation());
        let now_ms = self.ctx.clock.wall_ms();
        let (mut lag_messages, mut late_ms, mut complete) = (0u64, 0u64, epoch.is_some());
        for &p in partitions {
            let part = rt.as_ref().and_then(|rt| rt.peek_partition(p));
            let (position, alive) = match epoch {
                None => (None, false),
                Some(epoch) => {
                    let key = CursorKey {
                        parent: parent.name().to_owned(),
                        parent_incarnation: parent.incarnation(),
                        partition: p,
                        child: child.name().to_owned(),
                        epoch,
                    };
                    // A cursor the reconciler has not started yet (a link
                    // just applied) has not stopped: its file is exact.
                    let (pos, alive) = match self.running().get(&key) {
                        Some(r) => (r.shared.position.load(Ordering::Acquire), !r.ended()),
                        None => (NO_POSITION, true),
                    };
                    let pos = (pos != NO_POSITION).then_some(pos).or_else(|| {
                        // Not started (or never got going): its file says.
                        let dir = part.as_ref()?.log.dir();
                        cursor_file::peek(&*self.ctx.fs, dir, child.name(), epoch)
                            .ok()
                            .flatten()
                            .map(|s| s.next_offset)
                    });
                    (pos, alive)
                }
            };
            if !alive || position.is_none() {
                complete = false;
            }
            let Some(next) = position else { continue };
            let Some(part) = part else { continue };
            let hwm = part.log.high_watermark();
            if next >= hwm {
                continue;
            }
            lag_messages += hwm - next;
            if let Ok(batch) = part.log.read(next, 1, u64::MAX)
                && let Some(r) = batch.records.first()
            {
                late_ms = late_ms.max(now_ms.saturating_sub(r.commit_time_ms + delay_ms));
            }
        }
        ChildLag {
            name: child.name().to_owned(),
            delay_ms,
            lag_messages,
            lag_seconds: late_ms as f64 / 1000.0,
            lag_complete: complete,
        }
    }
}

#[cfg(test)]
mod fallback_tests {
    use super::*;

    fn child(created_at: i64, attached_at_ms: u64) -> Topic {
        serde_json::from_value(serde_json::json!({
            "name": "c", "incarnation": 1, "partitions": 1, "retention_ms": 1,
            "visibility_timeout_ms": 1, "max_in_flight_per_partition": 1,
            "max_acked_ahead_per_partition": 1, "created_at": created_at,
            "parent": {"name": "p", "attach_epoch": "00000000000000ff",
                       "fanout_delay_ms": 0, "attached_at_ms": attached_at_ms}
        }))
        .unwrap()
    }

    #[test]
    fn a_cursor_without_a_file_starts_the_clock_margin_before_the_attach() {
        let margin = FANOUT_ANCHOR_CLOCK_MARGIN.as_millis() as u64;
        let c = child(1_700_000_000, 1_700_000_123_456);
        assert_eq!(fallback_since_ms(&c, c.parent().unwrap()), 1_700_000_123_456 - margin);
        // A link of format 2 (no attach time): the child's creation.
        let c = child(1_700_000_000, 0);
        assert_eq!(fallback_since_ms(&c, c.parent().unwrap()), 1_700_000_000_000 - margin);
        // Never below the epoch.
        let c = child(0, 5);
        assert_eq!(fallback_since_ms(&c, c.parent().unwrap()), 0);
    }
}
