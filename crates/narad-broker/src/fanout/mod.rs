//! Fan-out: copying a parent topic's committed records into its children.
//!
//! One *cursor* per (parent partition, child) runs on the parent
//! partition's owner. It tails the parent's log up to the high watermark,
//! groups what it read by child partition (a keyed record goes to the
//! partition its key hashes to in the child, a keyless one is spread), and
//! commits each group through the same [`Owner`] as the dispatcher (the
//! child's combiner sees it as one more caller). Only when every child
//! commit of a slab is durable does the cursor's file move past it, so a
//! crash re-sends (duplicates), never skips (loss).
//!
//! A delayed child gets a record no earlier than its parent commit time +
//! the delay: reads stop at the first record committed after `now − delay`
//! (commit times never decrease along a partition), and an idle delayed
//! cursor sleeps until that record is due (at most 30 s at a time).
//!
//! A new attachment starts at the first parent record committed at or after
//! the link was made (no backfill), found by walking back from the high
//! watermark, so a cursor that starts late (or after a crash) still sends
//! everything produced after the attach.
//!
//! Each cursor is its own task: a lagging or failing child stalls only its
//! own cursors. The reconciler starts and stops cursors as links change,
//! and removes a cursor's file when its link is gone.

pub mod cursor_file;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_clock::ClockRef;
use narad_fs::FsRef;
use narad_log::{LogRecord, PartitionLog, ReadError, ReadRequest};
use narad_meta::{MetaStore, Topic};
use prometheus_client::encoding::EncodeLabelSet;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::limits::{
    FANOUT_ANCHOR_WALK_MAX, FANOUT_COMMIT_TRIES, FANOUT_DELAY_SLEEP_MAX, FANOUT_IDLE_WAIT,
    FANOUT_RECONCILE_INTERVAL, FANOUT_RETRY_BACKOFF, FANOUT_SLAB_BYTES, FANOUT_SLAB_RECORDS,
};
use crate::metrics::BrokerMetrics;
use crate::owner::{BatchRecord, CommitBatch, Owner};
use crate::partition::keyed_partition;
use crate::topics::{PartitionRt, TopicRt, Topics};
use cursor_file::CursorState;

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
#[derive(Debug)]
pub struct FanoutCtx {
    /// The metastore.
    pub meta: Arc<MetaStore>,
    /// Opened topics.
    pub topics: Arc<Topics>,
    /// Where child commits go.
    pub owner: Arc<dyn Owner>,
    /// The file layer (cursor files).
    pub fs: FsRef,
    /// Time.
    pub clock: ClockRef,
    /// Metrics.
    pub metrics: Arc<BrokerMetrics>,
}

struct Running {
    stop: Arc<AtomicBool>,
    wake: Arc<Notify>,
    task: JoinHandle<()>,
    /// Parent partition directory (for removing the file).
    dir: Arc<Mutex<Option<std::path::PathBuf>>>,
}

/// Starts and stops cursors as fan-out links change.
pub struct FanoutRunner {
    ctx: Arc<FanoutCtx>,
    running: Mutex<HashMap<CursorKey, Running>>,
}

impl std::fmt::Debug for FanoutRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanoutRunner").finish_non_exhaustive()
    }
}

/// The cursors the metastore asks for: (key, delay ms, link made at ms).
pub fn desired(meta: &MetaStore) -> Vec<(CursorKey, u64, u64)> {
    let snap = meta.snapshot();
    let mut out = Vec::new();
    for parent in snap.topics().filter(|t| !t.children().is_empty()) {
        for child_name in parent.children() {
            let Some(child) = snap.topic(child_name) else { continue };
            let Some(link) = child.parent().filter(|l| l.name == parent.name()) else { continue };
            let Some(epoch) = cursor_file::parse_epoch(&link.attach_epoch) else { continue };
            for p in 0..parent.partitions() {
                out.push((
                    CursorKey {
                        parent: parent.name().to_owned(),
                        parent_incarnation: parent.incarnation(),
                        partition: p,
                        child: child_name.clone(),
                        epoch,
                    },
                    link.fanout_delay_ms,
                    (child.created_at().max(0) as u64) * 1000,
                ));
            }
        }
    }
    out
}

impl FanoutRunner {
    /// A runner with no cursors yet.
    pub fn new(ctx: Arc<FanoutCtx>) -> Arc<FanoutRunner> {
        Arc::new(FanoutRunner { ctx, running: Mutex::new(HashMap::new()) })
    }

    /// Starts missing cursors and stops (and cleans up after) unwanted
    /// ones. Cheap when nothing changed.
    pub fn reconcile(&self) {
        let want = desired(&self.ctx.meta);
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let keys: std::collections::HashSet<&CursorKey> = want.iter().map(|(k, _, _)| k).collect();
        let gone: Vec<CursorKey> = running.keys().filter(|k| !keys.contains(k)).cloned().collect();
        for k in gone {
            if let Some(r) = running.remove(&k) {
                r.stop.store(true, Ordering::Release);
                r.wake.notify_one();
                let dir = r.dir.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let (fs, child) = (self.ctx.fs.clone(), k.child.clone());
                tokio::spawn(async move {
                    let _ = r.task.await;
                    // The link is gone: its cursor file goes too.
                    if let Some(dir) = dir {
                        let path = cursor_file::path(&dir, &child);
                        let _ = tokio::task::spawn_blocking(move || {
                            if fs.exists(&path).unwrap_or(false) {
                                let _ = fs.remove_file(&path);
                            }
                        })
                        .await;
                    }
                });
                info!(parent = %k.parent, child = %k.child, partition = k.partition, "fan-out cursor stopped");
            }
        }
        for (k, delay_ms, since_ms) in want {
            if running.contains_key(&k) {
                continue;
            }
            let stop = Arc::new(AtomicBool::new(false));
            let wake = Arc::new(Notify::new());
            let dir = Arc::new(Mutex::new(None));
            let cursor = Cursor {
                ctx: self.ctx.clone(),
                key: k.clone(),
                delay_ms,
                since_ms,
                stop: stop.clone(),
                wake: wake.clone(),
                dir: dir.clone(),
                spread: u64::from(k.partition),
            };
            let task = tokio::spawn(cursor.run());
            running.insert(k, Running { stop, wake, task, dir });
        }
    }

    /// Runs the reconciler every second until `stop` turns true.
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(FANOUT_RECONCILE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.reconcile(),
                _ = stop.changed() => break,
            }
        }
        self.stop_all().await;
    }

    /// Stops every cursor and waits for them (files stay: the links do).
    pub async fn stop_all(&self) {
        let all: Vec<Running> = {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            running.drain().map(|(_, r)| r).collect()
        };
        for r in &all {
            r.stop.store(true, Ordering::Release);
            r.wake.notify_one();
        }
        for r in all {
            let _ = r.task.await;
        }
    }

    /// Lag of every running cursor, for `GET .../children`:
    /// (parent partition, child, parent HWM − cursor) where known.
    pub fn cursors(&self) -> Vec<CursorKey> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let mut keys: Vec<CursorKey> = running.keys().cloned().collect();
        keys.sort();
        keys
    }
}

struct Cursor {
    ctx: Arc<FanoutCtx>,
    key: CursorKey,
    delay_ms: u64,
    since_ms: u64,
    stop: Arc<AtomicBool>,
    wake: Arc<Notify>,
    dir: Arc<Mutex<Option<std::path::PathBuf>>>,
    /// Spreads keyless records over the child's partitions.
    spread: u64,
}

enum Step {
    /// Sent a slab; go on at once.
    Progress,
    /// Nothing to send now; wait this long (or for a commit).
    Idle(Duration),
    /// The link or a topic is gone: stop.
    Done,
}

impl Cursor {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn labels(&self) -> FanoutPartitionLabels {
        FanoutPartitionLabels {
            parent: self.key.parent.clone(),
            child: self.key.child.clone(),
            partition: self.key.partition.to_string(),
        }
    }

    /// The parent topic and the child topic, if the link still holds.
    fn link(&self) -> Option<(Arc<Topic>, Arc<Topic>)> {
        let parent = self.ctx.meta.topic(&self.key.parent)?;
        if parent.incarnation() != self.key.parent_incarnation {
            return None;
        }
        let child = self.ctx.meta.topic(&self.key.child)?;
        let link = child.parent()?;
        (link.name == self.key.parent
            && cursor_file::parse_epoch(&link.attach_epoch) == Some(self.key.epoch))
        .then_some((parent, child))
    }

    async fn run(mut self) {
        let Some((parent, _)) = self.link() else { return };
        let (topics, p2, part_no) = (self.ctx.topics.clone(), parent.clone(), self.key.partition);
        let opened = tokio::task::spawn_blocking(move || {
            let rt = topics.topic(&p2)?;
            let part = topics.partition(&p2, part_no)?;
            Ok::<_, crate::BrokerError>((rt, part))
        })
        .await;
        let (rt, part) = match opened {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => {
                warn!(parent = %self.key.parent, partition = part_no, error = %e, "fan-out cursor cannot open the parent partition");
                return;
            }
            Err(_) => return,
        };
        *self.dir.lock().unwrap_or_else(|p| p.into_inner()) = Some(part.log.dir().to_path_buf());
        let Some(mut next) = self.start_position(&part).await else { return };
        info!(parent = %self.key.parent, child = %self.key.child, partition = part_no, next, "fan-out cursor started");
        while !self.stopped() {
            let notified = rt.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.step(&rt, &part, &mut next).await {
                Step::Progress => {}
                Step::Done => return,
                Step::Idle(wait) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// Resumes from the cursor file of this attachment, or anchors at the
    /// first record committed since the link was made (and stores that).
    async fn start_position(&self, part: &Arc<PartitionRt>) -> Option<u64> {
        let path = cursor_file::path(part.log.dir(), &self.key.child);
        let (fs, epoch, log, since) =
            (self.ctx.fs.clone(), self.key.epoch, part.log.clone(), self.since_ms);
        let result = tokio::task::spawn_blocking(move || {
            if let Some(s) = cursor_file::load(&*fs, &path, epoch)? {
                return Ok(s.next_offset);
            }
            let anchor = anchor(&log, since);
            cursor_file::store(&*fs, &path, CursorState { epoch, next_offset: anchor })?;
            Ok::<_, std::io::Error>(anchor)
        })
        .await;
        match result {
            Ok(Ok(n)) => Some(n),
            Ok(Err(e)) => {
                warn!(parent = %self.key.parent, child = %self.key.child, error = %e, "fan-out cursor cannot read or write its file");
                None
            }
            Err(_) => None,
        }
    }

    async fn step(&mut self, rt: &Arc<TopicRt>, part: &Arc<PartitionRt>, next: &mut u64) -> Step {
        let Some((_parent, child)) = self.link() else { return Step::Done };
        if rt.is_closed() {
            return Step::Done;
        }
        let now_ms = self.ctx.clock.wall_ms();
        let gate = (self.delay_ms > 0).then(|| now_ms.saturating_sub(self.delay_ms));
        let req = ReadRequest {
            from: *next,
            max_records: FANOUT_SLAB_RECORDS,
            max_bytes: FANOUT_SLAB_BYTES,
            max_commit_time_ms: gate,
        };
        let hwm = part.log.high_watermark();
        self.ctx
            .metrics
            .fanout_lag_messages
            .get_or_create(&self.labels())
            .set(hwm.saturating_sub(*next) as i64);
        let batch = match part.log.read_with(&req) {
            Ok(b) => b,
            Err(ReadError::Gone { oldest, .. }) => {
                self.dropped(oldest.saturating_sub(*next));
                *next = oldest;
                return if self.persist(part, *next).await {
                    Step::Progress
                } else {
                    Step::Idle(FANOUT_RETRY_BACKOFF)
                };
            }
            Err(ReadError::Closed) => return Step::Done,
            Err(e) => {
                warn!(parent = %self.key.parent, partition = self.key.partition, error = %e, "fan-out cursor cannot read the parent");
                return Step::Idle(FANOUT_RETRY_BACKOFF);
            }
        };
        if batch.records.is_empty() && batch.corrupt.is_empty() {
            self.ctx.metrics.fanout_due_lag_seconds.get_or_create(&self.labels()).set(0);
            return Step::Idle(match batch.held_back_commit_time_ms {
                Some(t) => {
                    self.ctx.metrics.fanout_delay_gate_holds.inc();
                    Duration::from_millis((t + self.delay_ms).saturating_sub(now_ms).max(1))
                        .min(FANOUT_DELAY_SLEEP_MAX)
                }
                None => FANOUT_IDLE_WAIT,
            });
        }
        if let Some(first) = batch.records.first() {
            let due = first.commit_time_ms + self.delay_ms;
            self.ctx
                .metrics
                .fanout_due_lag_seconds
                .get_or_create(&self.labels())
                .set((now_ms.saturating_sub(due) / 1000) as i64);
        }
        let corrupt: u64 = batch.corrupt.iter().map(|r| r.end - r.start).sum();
        if corrupt > 0 {
            self.dropped(corrupt);
        }
        if !self.send(&child, &batch.records).await {
            return Step::Idle(FANOUT_RETRY_BACKOFF);
        }
        let sent = batch.records.len() as u64;
        *next = batch.next_offset;
        if !self.persist(part, *next).await {
            return Step::Idle(FANOUT_RETRY_BACKOFF);
        }
        let l = FanoutLabels { parent: self.key.parent.clone(), child: self.key.child.clone() };
        self.ctx.metrics.fanout_committed.get_or_create(&l).inc_by(sent);
        Step::Progress
    }

    fn dropped(&self, n: u64) {
        if n == 0 {
            return;
        }
        let l = FanoutLabels { parent: self.key.parent.clone(), child: self.key.child.clone() };
        self.ctx.metrics.fanout_child_dropped_messages.get_or_create(&l).inc_by(n);
        warn!(parent = %self.key.parent, child = %self.key.child, records = n, "fanout: child lost records the parent no longer holds");
    }

    /// Commits `records` into the child, one commit per child partition;
    /// `false` if a commit kept failing (the slab is sent again later).
    async fn send(&mut self, child: &Topic, records: &[LogRecord]) -> bool {
        let n = child.partitions().max(1);
        let mut groups: Vec<Vec<BatchRecord>> = vec![Vec::new(); n as usize];
        for r in records {
            let p = match &r.key {
                Some(k) => keyed_partition(k, n),
                None => {
                    self.spread = self.spread.wrapping_add(1);
                    (self.spread % u64::from(n)) as u32
                }
            };
            groups[p as usize].push(BatchRecord {
                incarnation: Some(child.incarnation()),
                key: r.key.clone(),
                payload: r.payload.clone(),
            });
        }
        let child_name: Arc<str> = child.name().into();
        for (p, group) in groups.into_iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            let batch =
                CommitBatch { topic: child_name.clone(), partition: p as u32, records: group };
            let mut ok = false;
            for attempt in 1..=FANOUT_COMMIT_TRIES {
                match self.ctx.owner.commit(0, batch.clone()).await {
                    Ok(()) => {
                        ok = true;
                        break;
                    }
                    Err(e) => {
                        warn!(parent = %self.key.parent, child = %self.key.child, partition = p, attempt, error = %e, "fan-out commit failed");
                    }
                }
                if self.stopped() {
                    return false;
                }
            }
            if !ok {
                return false;
            }
        }
        true
    }

    async fn persist(&self, part: &Arc<PartitionRt>, next: u64) -> bool {
        let path = cursor_file::path(part.log.dir(), &self.key.child);
        let (fs, epoch) = (self.ctx.fs.clone(), self.key.epoch);
        let r = tokio::task::spawn_blocking(move || {
            cursor_file::store(&*fs, &path, CursorState { epoch, next_offset: next })
        })
        .await;
        match r {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                warn!(parent = %self.key.parent, child = %self.key.child, error = %e, "fan-out cursor file not stored; resending");
                false
            }
            Err(_) => false,
        }
    }
}

/// The first offset committed at or after `since_ms` (walking back from the
/// high watermark; at most a bounded number of records).
pub fn anchor(log: &PartitionLog, since_ms: u64) -> u64 {
    let hwm = log.high_watermark();
    let oldest = log.oldest_offset();
    let mut lo = hwm;
    let step = 256u64;
    while lo > oldest && hwm - lo < FANOUT_ANCHOR_WALK_MAX {
        let from = lo.saturating_sub(step).max(oldest);
        let Ok(batch) = log.read(from, (lo - from) as usize, u64::MAX) else { return lo };
        match batch.records.iter().position(|r| r.commit_time_ms >= since_ms) {
            // Everything in this chunk is recent enough: look further back.
            Some(0) if batch.records.first().is_some_and(|r| r.offset == from) => lo = from,
            Some(i) => return batch.records[i].offset,
            None => return lo,
        }
    }
    lo
}
