//! The background tasks started at open ([`Broker::spawn_background`]):
//! persisting consumer frontiers, purging expired leases, retention
//! ([`Broker::enforce_retention`]), closing idle logs
//! ([`Broker::evict_idle_logs`]), the metrics poll (in `stats.rs`) and, on
//! a cluster node, removing the files of topics deleted through another
//! node (`follow_replicated_deletes`). Also `persist_frontiers` (called
//! again by shutdown) and the timers `every` and `every_blocking`.
//!
//! Fields worked on here: `tasks` (the handles shutdown aborts) and
//! `frontier_moves_seen`.
//!
//! Invariants the code relies on:
//! - A task holds only a `Weak<Broker>`, so it never keeps a stopped
//!   broker alive, and ends when `stop` is sent.
//! - Passes that do disk I/O or walk every partition run on the blocking
//!   pool (`every_blocking`).
//! - A metastore listener runs under the metastore's writer lock: it only
//!   queues, and a task does the work.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::{Broker, blocking};
use crate::fence::PartitionKey;
use crate::limits::{
    EXPIRY_PURGE_INTERVAL, FRONTIER_PERSIST_INTERVAL, IDLE_EVICTION_INTERVAL,
    METRICS_POLL_INTERVAL, RETENTION_INTERVAL,
};
use crate::metrics::{BrokerMetrics, PartitionLabels};
use crate::topics::Topics;

impl Broker {
    pub(super) fn spawn_background(self: &Arc<Self>) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        let me = Arc::downgrade(self);
        let stop = self.stop.subscribe();
        tasks.push(every_blocking(&me, FRONTIER_PERSIST_INTERVAL, stop.clone(), |b| {
            // An idle node's pass is one atomic load, not a look at each of
            // its partitions ten times a second.
            let moves = b.topics.frontier_moves();
            if b.frontier_moves_seen.swap(moves, Ordering::Relaxed) != moves {
                persist_frontiers(&b.topics, &b.metrics);
            }
        }));
        tasks.push(tokio::spawn(every(EXPIRY_PURGE_INTERVAL, stop.clone(), {
            let me = me.clone();
            move || {
                let me = me.clone();
                async move {
                    if let Some(b) = me.upgrade() {
                        b.purge_expired();
                    }
                }
            }
        })));
        tasks.push(every_blocking(
            &me,
            RETENTION_INTERVAL,
            stop.clone(),
            Broker::enforce_retention,
        ));
        if self.config.idle_log_eviction_ms > 0 {
            tasks.push(every_blocking(&me, IDLE_EVICTION_INTERVAL, stop.clone(), |b| {
                b.evict_idle_logs();
            }));
        }
        tasks.push(every_blocking(&me, METRICS_POLL_INTERVAL, stop.clone(), Broker::poll_metrics));
        if self.meta.is_replicated() {
            tasks.push(self.follow_replicated_deletes(stop.clone()));
            tasks.push(self.follow_removals(stop.clone()));
            tasks.push(self.follow_move_outcomes(stop));
        }
    }

    /// The source's fence follows the metastore (SPEC §7.3): once a move's
    /// CompleteMove applies on this replica, the partition it moved away
    /// from this node is sealed (moved to the target: commits answer "not
    /// the owner", consume and ack stop); once an AbortMove applies, the
    /// freeze for that target is lifted. Raft decides which of the two
    /// happened, so the source never guesses from a timer. The listener
    /// only queues; a task changes the gate (which may wait for a commit
    /// in flight).
    fn follow_move_outcomes(
        self: &Arc<Self>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> JoinHandle<()> {
        enum Outcome {
            Moved { key: PartitionKey, to: String },
            Aborted { key: PartitionKey, target: String },
        }
        let me_id = self.config.node_id.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Outcome>();
        self.meta.on_applied(Arc::new(move |command, _response| match command {
            narad_meta::Command::CompleteMove(c) if c.expected_owner == me_id => {
                let key = PartitionKey::new(&c.topic, c.incarnation, c.partition);
                let _ = tx.send(Outcome::Moved { key, to: c.target_id.clone() });
            }
            narad_meta::Command::AbortMove(c) => {
                let key = PartitionKey::new(&c.topic, c.incarnation, c.partition);
                let _ = tx.send(Outcome::Aborted { key, target: c.expected_target.clone() });
            }
            _ => {}
        }));
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let outcome = tokio::select! {
                    next = rx.recv() => match next {
                        Some(next) => next,
                        None => return,
                    },
                    _ = stop.changed() => return,
                };
                let Some(b) = me.upgrade() else { return };
                let fences = b.fences().clone();
                let _ = blocking(move || {
                    match outcome {
                        Outcome::Moved { key, to } => {
                            info!(topic = %key.topic, partition = key.partition, to = %to, "partition moved away: sealed here");
                            fences.seal_moved(&key, &to);
                        }
                        Outcome::Aborted { key, target } => {
                            if fences.unfreeze(&key, &target) {
                                info!(topic = %key.topic, partition = key.partition, target = %target, "partition move aborted: commits resume here");
                            }
                        }
                    }
                    Ok(())
                })
                .await;
            }
        })
    }

    /// A cluster node learns of most deletes from consensus, not from its
    /// own HTTP handlers: a delete accepted by another node reaches this
    /// one as an applied command. This removes the deleted incarnation's
    /// local files then (what [`Broker::delete_topic`] does on the node
    /// that took the request), so a topic deleted anywhere stops holding
    /// disk everywhere. The listener only queues (it runs under the
    /// metastore's writer lock); a task does the removal. Removal names the
    /// incarnation, so it never touches a newer one, and is idempotent.
    fn follow_replicated_deletes(
        self: &Arc<Self>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> JoinHandle<()> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, u64, u32)>();
        self.meta.on_applied(Arc::new(move |_command, response| {
            if let narad_meta::Response::TopicDeleted(t) = response {
                let _ = tx.send((t.name().to_owned(), t.incarnation(), t.partitions()));
            }
        }));
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let (name, incarnation, partitions) = tokio::select! {
                    next = rx.recv() => match next {
                        Some(next) => next,
                        None => return,
                    },
                    _ = stop.changed() => return,
                };
                let Some(b) = me.upgrade() else { return };
                let topics = b.topics.clone();
                let removed = {
                    let name = name.clone();
                    blocking(move || topics.remove(&name, incarnation)).await
                };
                match removed {
                    Ok(()) => {
                        b.metrics.forget_topic(&name, partitions);
                        let links = b.fanout.lock_links().await;
                        b.fanout.reconcile_now(&links).await;
                    }
                    Err(e) => {
                        b.metrics.error("storage", "delete_topic");
                        warn!(topic = %name, incarnation, error = %e, "could not remove the files of a topic deleted through the cluster; the start-up sweep retries");
                    }
                }
            }
        })
    }

    fn purge_expired(&self) {
        let now = self.clock.wall_ms();
        for rt in self.topics.all() {
            let mut freed = 0;
            for part in rt.open_partitions() {
                if let Ok(mut g) = part.shard() {
                    freed += g.as_mut().map_or(0, |s| s.purge_expired(now));
                }
            }
            if freed > 0 {
                rt.wake.everyone();
            }
        }
    }

    /// Closes the partition logs unaccessed for `storage.idle_log_eviction_ms`
    /// whose closing loses nothing (see [`Topics::evict_idle`]); every minute
    /// in the background unless the setting is 0. Blocking. Returns how many
    /// it closed.
    pub fn evict_idle_logs(&self) -> usize {
        let idle_ms = self.config.idle_log_eviction_ms;
        if idle_ms == 0 {
            return 0;
        }
        let closed = self.topics.evict_idle(idle_ms, &|rt| {
            self.meta
                .topic(&rt.name)
                .filter(|t| t.incarnation() == rt.incarnation)
                .map(|t| t.retention_ms())
        });
        self.metrics.idle_logs_evicted.inc_by(closed as u64);
        self.metrics.open_partition_logs.set(self.topics.open_logs() as i64);
        closed
    }

    /// Runs retention on every open log (every minute in the background).
    pub fn enforce_retention(&self) {
        let now = self.clock.wall_ms();
        for rt in self.topics.all() {
            let Some(t) = self.meta.topic(&rt.name).filter(|t| t.incarnation() == rt.incarnation)
            else {
                continue;
            };
            for part in rt.open_partitions() {
                let started = std::time::Instant::now();
                let pass = part.log.enforce_retention(now, t.retention_ms());
                self.metrics
                    .storage_retention_run_duration_seconds
                    .0
                    .get_or_create(&PartitionLabels::new(&rt.name, part.index))
                    .observe(started.elapsed().as_secs_f64());
                match pass {
                    Ok(r) if r.segments_deleted > 0 => {
                        let l = PartitionLabels::new(&rt.name, part.index);
                        self.metrics
                            .storage_retention_bytes_deleted
                            .get_or_create(&l)
                            .inc_by(r.bytes_deleted);
                        self.metrics
                            .storage_retention_messages_deleted
                            .get_or_create(&l)
                            .inc_by(r.records_deleted);
                        info!(topic = %rt.name, partition = part.index, segments = r.segments_deleted, "retention deleted segments");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        self.metrics.error("storage", "retention");
                        warn!(topic = %rt.name, partition = part.index, error = %e, "retention pass failed");
                    }
                }
            }
        }
    }
}

/// Persists every moved consumer frontier; returns how many failed.
pub(super) fn persist_frontiers(topics: &Topics, metrics: &BrokerMetrics) -> usize {
    let mut failed = 0;
    for rt in topics.all() {
        for part in rt.frontier_dirty_partitions() {
            let started = std::time::Instant::now();
            let persisted = part.persist_frontier();
            if !matches!(persisted, Ok(false)) {
                metrics.frontier_persisted(
                    &rt.name,
                    part.index,
                    persisted.is_ok(),
                    started.elapsed(),
                );
            }
            if let Err(e) = persisted {
                failed += 1;
                metrics.error("storage", "consumer_frontier");
                warn!(topic = %rt.name, partition = part.index, error = %e, "cannot persist the consumer frontier");
            }
        }
    }
    failed
}

/// Runs `f` on the blocking pool every `period` while the broker lives
/// (the passes that do disk I/O or walk every partition).
fn every_blocking(
    me: &std::sync::Weak<Broker>,
    period: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
    f: fn(&Broker),
) -> tokio::task::JoinHandle<()> {
    let me = me.clone();
    tokio::spawn(every(period, stop, move || {
        let me = me.clone();
        async move {
            if let Some(b) = me.upgrade() {
                let _ = tokio::task::spawn_blocking(move || f(&b)).await;
            }
        }
    }))
}

async fn every<F, Fut>(period: Duration, mut stop: tokio::sync::watch::Receiver<bool>, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => f().await,
            _ = stop.changed() => return,
        }
    }
}
