//! One fan-out cursor: the task that copies one parent partition into one
//! child, for one attachment (epoch).
//!
//! # Start
//! The cursor resumes from its file (`fanout@<epoch>.offset`, see
//! [`super::cursor_file`]). An attach writes that file at the parent's high
//! watermark before the link is committed (see the module docs of
//! [`crate::fanout`]), so a cursor of a new link finds its start there.
//! Without a file of its epoch (a partition added later, a file that could
//! not be written or was damaged) it anchors at the first parent record
//! committed at or after the link was made, found by a binary search over
//! commit times ([`anchor`]; no window: however long ago the link was
//! made, nothing committed since is skipped). If the parent partition
//! cannot be opened, the file cannot be read or written, or the search
//! cannot read the log, the cursor does not start (it warns and ends; the
//! runner starts it again after a backoff): it never starts at a guess.
//!
//! # Loop
//! Read a slab (up to the high watermark, and for a delayed child up to
//! `now − delay`), group it by child partition once (`fanout/slab.rs`), and
//! commit the groups through the [`crate::owner::Owner`], each child
//! partition on its own: a group that committed is not sent again, one that
//! failed is tried again after its back-off while the others go on, and the
//! parent is not read again until every group has committed. Only then does
//! the cursor file move past the slab: a crash re-sends, never skips.
//! Commit failures are counted (`narad_fanout_commit_failures_total`) and
//! logged at most once per [`FANOUT_COMMIT_WARN_EVERY`] per cursor.
//!
//! # Stop
//! [`StopReason::Shutdown`] keeps the link: a slab already sent is still
//! recorded. [`StopReason::Unlinked`] means the link is gone: the cursor
//! never writes its file again, so the runner can remove it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use narad_log::{PartitionLog, ReadError, ReadRequest};
use narad_meta::Topic;
use tokio::sync::Notify;
use tracing::{info, warn};

use super::cursor_file::{self, CursorState};
use super::slab::{ChildHealth, Owners, PendingSlab};
use super::{CursorKey, FanoutCtx, FanoutLabels, FanoutPartitionLabels};
use crate::limits::{
    FANOUT_COMMIT_WARN_EVERY, FANOUT_COMMITS_IN_FLIGHT, FANOUT_DELAY_SLEEP_MAX, FANOUT_IDLE_WAIT,
    FANOUT_RETRY_BACKOFF, FANOUT_SLAB_BYTES, FANOUT_SLAB_RECORDS,
};
use crate::log_gate::LogGate;
use crate::owner::CommitError;
use crate::topics::{PartitionRt, TopicRt};

/// `position` before the cursor knows where it starts.
pub(crate) const NO_POSITION: u64 = u64::MAX;

/// Why a cursor was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum StopReason {
    /// Still running.
    Running = 0,
    /// The node stops; the link stays (the file may still be written).
    Shutdown = 1,
    /// The link is gone: the file must never be written again.
    Unlinked = 2,
}

/// What a cursor shares with the runner.
#[derive(Debug)]
pub(crate) struct CursorShared {
    stop: AtomicU8,
    /// Wakes an idle cursor (to stop).
    pub(crate) wake: Notify,
    /// The parent partition's directory, once opened (for its file).
    pub(crate) dir: Mutex<Option<PathBuf>>,
    /// The next parent offset to send, as stored ([`NO_POSITION`] before
    /// the start is known).
    pub(crate) position: AtomicU64,
}

impl CursorShared {
    pub(crate) fn new() -> CursorShared {
        CursorShared {
            stop: AtomicU8::new(StopReason::Running as u8),
            wake: Notify::new(),
            dir: Mutex::new(None),
            position: AtomicU64::new(NO_POSITION),
        }
    }

    /// Asks the cursor to stop; an unlink is never downgraded.
    pub(crate) fn stop(&self, reason: StopReason) {
        self.stop.fetch_max(reason as u8, Ordering::AcqRel);
        self.wake.notify_one();
    }

    fn reason(&self) -> StopReason {
        match self.stop.load(Ordering::Acquire) {
            0 => StopReason::Running,
            1 => StopReason::Shutdown,
            _ => StopReason::Unlinked,
        }
    }

    pub(crate) fn dir(&self) -> Option<PathBuf> {
        self.dir.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

pub(crate) struct Cursor {
    ctx: Arc<FanoutCtx>,
    key: CursorKey,
    delay_ms: u64,
    /// When the link was made (Unix ms): the fallback start.
    since_ms: u64,
    shared: Arc<CursorShared>,
    /// Spreads keyless records over the child's partitions (advanced once
    /// per keyless record, when a slab is grouped).
    spread: u64,
    /// The slab being sent: read and grouped, not all committed yet.
    pending: Option<PendingSlab>,
    /// When each child partition may be tried again.
    health: ChildHealth,
    /// Rate limit of the "fan-out commit failed" WARN.
    failed_log: LogGate,
    /// Rate limit of the "no owner yet" WARN.
    unowned_log: LogGate,
    /// Rate limit of the reroute WARN.
    reroute_log: LogGate,
}

/// What a pass over the pending slab came to.
enum Pass {
    /// Every group has committed.
    Done(PendingSlab),
    /// Some have not: the next is due in this long (zero: now).
    Wait(Duration),
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
    /// A cursor for `key`, not started (see [`Cursor::run`]).
    pub(crate) fn new(
        ctx: Arc<FanoutCtx>,
        key: CursorKey,
        delay_ms: u64,
        since_ms: u64,
        shared: Arc<CursorShared>,
    ) -> Cursor {
        Cursor {
            spread: u64::from(key.partition),
            ctx,
            key,
            delay_ms,
            since_ms,
            shared,
            pending: None,
            health: ChildHealth::default(),
            failed_log: LogGate::every(FANOUT_COMMIT_WARN_EVERY),
            unowned_log: LogGate::every(FANOUT_COMMIT_WARN_EVERY),
            reroute_log: LogGate::every(FANOUT_COMMIT_WARN_EVERY),
        }
    }

    fn stopped(&self) -> bool {
        self.shared.reason() != StopReason::Running
    }

    fn labels(&self) -> FanoutPartitionLabels {
        FanoutPartitionLabels {
            parent: self.key.parent.clone(),
            child: self.key.child.clone(),
            partition: self.key.partition.to_string(),
        }
    }

    fn link_labels(&self) -> FanoutLabels {
        FanoutLabels { parent: self.key.parent.clone(), child: self.key.child.clone() }
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

    pub(crate) async fn run(mut self) {
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
        *self.shared.dir.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(part.log.dir().to_path_buf());
        let Some(mut next) = self.start_position(&part).await else { return };
        self.shared.position.store(next, Ordering::Release);
        info!(parent = %self.key.parent, child = %self.key.child, partition = part_no, next, "fan-out cursor started");
        while !self.stopped() {
            let notified = rt.wake.waiter(true);
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.step(&rt, &part, &mut next).await {
                Step::Progress => {}
                Step::Done => return,
                Step::Idle(wait) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = self.shared.wake.notified() => {}
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// Resumes from the cursor file of this attachment, or anchors at the
    /// first record committed since the link was made (and stores that).
    async fn start_position(&self, part: &Arc<PartitionRt>) -> Option<u64> {
        let dir = part.log.dir().to_path_buf();
        let (fs, epoch, log, since) =
            (self.ctx.fs.clone(), self.key.epoch, part.log.clone(), self.since_ms);
        let (shared, child) = (self.shared.clone(), self.key.child.clone());
        let result = tokio::task::spawn_blocking(move || {
            if let Some(s) = cursor_file::load(&*fs, &dir, &child, epoch)? {
                return Ok(Some(s.next_offset));
            }
            if shared.reason() == StopReason::Unlinked {
                return Ok(None);
            }
            let anchor = anchor(&log, since).map_err(std::io::Error::other)?;
            let path = cursor_file::path(&dir, epoch);
            cursor_file::store(&*fs, &path, CursorState { epoch, next_offset: anchor })?;
            Ok::<_, std::io::Error>(Some(anchor))
        })
        .await;
        match result {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => {
                warn!(parent = %self.key.parent, child = %self.key.child, partition = self.key.partition, error = %e, "fan-out cursor cannot find where to start (its file, or the parent log)");
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
        self.health.track(&child);
        if self.pending.as_ref().is_some_and(|slab| !slab.fits(&child)) {
            // Groups already committed are sent again (duplicates, never
            // loss): the stored position is still before the slab.
            info!(parent = %self.key.parent, child = %self.key.child, partition = self.key.partition, from = *next,
                "fan-out child changed (incarnation or partition count) while a slab was being sent; reading it again");
            self.pending = None;
        }
        let now_ms = self.ctx.clock.wall_ms();
        let hwm = part.log.high_watermark();
        let metrics = self.ctx.metrics.clone();
        metrics
            .fanout_lag_messages
            .get_or_create(&self.labels())
            .set(hwm.saturating_sub(*next) as i64);
        let slab = match self.pending.take() {
            Some(slab) => slab,
            None => match self.read_slab(part, &child, next, now_ms).await {
                Ok(slab) => slab,
                Err(step) => return step,
            },
        };
        if let Some(first) = slab.first_commit_time_ms {
            let due = first + self.delay_ms;
            metrics
                .fanout_due_lag_seconds
                .get_or_create(&self.labels())
                .set((now_ms.saturating_sub(due) / 1000) as i64);
        }
        let slab = match self.send_pass(slab, &child).await {
            Pass::Done(slab) => slab,
            Pass::Wait(wait) if wait.is_zero() => return Step::Progress,
            Pass::Wait(wait) => return Step::Idle(wait),
        };
        *next = slab.next_offset;
        if !self.persist(part, *next).await {
            return Step::Idle(FANOUT_RETRY_BACKOFF);
        }
        metrics.fanout_committed.get_or_create(&self.link_labels()).inc_by(slab.records);
        if slab.records > 0 {
            metrics.fanout_batch_records.0.observe(slab.records as f64);
            metrics.fanout_batch_bytes.0.observe(slab.bytes as f64);
        }
        Step::Progress
    }

    /// Reads the next slab from `next` and groups it for `child`; the step
    /// to return instead when there is none to send now.
    async fn read_slab(
        &mut self,
        part: &Arc<PartitionRt>,
        child: &Topic,
        next: &mut u64,
        now_ms: u64,
    ) -> Result<PendingSlab, Step> {
        let gate = (self.delay_ms > 0).then(|| now_ms.saturating_sub(self.delay_ms));
        let req = ReadRequest {
            from: *next,
            max_records: FANOUT_SLAB_RECORDS,
            max_bytes: FANOUT_SLAB_BYTES,
            max_commit_time_ms: gate,
        };
        let metrics = self.ctx.metrics.clone();
        let batch = match part.log.read_with(&req) {
            Ok(b) => b,
            Err(ReadError::Gone { oldest, .. }) => {
                self.dropped(oldest.saturating_sub(*next));
                *next = oldest;
                return Err(if self.persist(part, *next).await {
                    Step::Progress
                } else {
                    Step::Idle(FANOUT_RETRY_BACKOFF)
                });
            }
            Err(ReadError::Closed) => return Err(Step::Done),
            Err(e) => {
                warn!(parent = %self.key.parent, partition = self.key.partition, error = %e, "fan-out cursor cannot read the parent");
                return Err(Step::Idle(FANOUT_RETRY_BACKOFF));
            }
        };
        if batch.records.is_empty() && batch.corrupt.is_empty() {
            metrics.fanout_due_lag_seconds.get_or_create(&self.labels()).set(0);
            return Err(Step::Idle(match batch.held_back_commit_time_ms {
                Some(t) => {
                    metrics.fanout_delay_gate_holds.get_or_create(&self.link_labels()).inc();
                    Duration::from_millis((t + self.delay_ms).saturating_sub(now_ms).max(1))
                        .min(FANOUT_DELAY_SLEEP_MAX)
                }
                None => FANOUT_IDLE_WAIT,
            }));
        }
        let corrupt: u64 = batch.corrupt.iter().map(|r| r.end - r.start).sum();
        if corrupt > 0 {
            self.dropped(corrupt);
        }
        Ok(PendingSlab::new(child, &batch.records, batch.next_offset, &mut self.spread))
    }

    fn dropped(&self, n: u64) {
        if n == 0 {
            return;
        }
        let labels = self.link_labels();
        self.ctx.metrics.fanout_child_dropped_messages.get_or_create(&labels).inc_by(n as i64);
        warn!(parent = %self.key.parent, child = %self.key.child, records = n, "fanout: child lost records the parent no longer holds");
    }

    /// One pass over `slab`: commits every group whose child partition is
    /// due (at most [`FANOUT_COMMITS_IN_FLIGHT`] at a time), whatever
    /// happens to the others. A slab not all committed stays pending.
    async fn send_pass(&mut self, mut slab: PendingSlab, child: &Topic) -> Pass {
        let partitions = child.partitions().max(1);
        let owners: Vec<_> =
            (0..partitions).map(|p| self.ctx.topology.owner_of(child.name(), p)).collect();
        let now = self.ctx.clock.mono();
        let plan = slab.plan(&self.health, &owners, now);
        self.rerouted(&plan.rerouted, &owners, now);
        for p in plan.unowned {
            let retry_in = self.health.missed(p, now, false);
            if let Some(suppressed) = self.unowned_log.hit(now) {
                warn!(parent = %self.key.parent, child = %self.key.child, partition = p,
                    retry_in_ms = retry_in.as_millis() as u64, suppressed,
                    "fan-out commit waits: the child partition has no owner yet");
            }
        }
        let owner = self.ctx.owner.clone();
        let answers: Vec<_> = futures_util::stream::iter(plan.tries)
            .map(|(p, to, batch)| {
                let records = batch.records.len();
                let commit = owner.commit(to, batch);
                async move { (p, records, commit.await) }
            })
            .buffer_unordered(FANOUT_COMMITS_IN_FLIGHT)
            .collect()
            .await;
        let now = self.ctx.clock.mono();
        for (p, records, answer) in answers {
            match answer {
                Ok(()) => {
                    slab.committed(p);
                    self.health.committed(p);
                }
                Err(e) => {
                    let failed = matches!(e, CommitError::Failed(_));
                    let retry_in = self.health.missed(p, now, failed);
                    self.ctx
                        .metrics
                        .fanout_commit_failures
                        .get_or_create(&self.link_labels())
                        .inc();
                    if let Some(suppressed) = self.failed_log.hit(now) {
                        warn!(parent = %self.key.parent, child = %self.key.child, partition = p,
                            records, retry_in_ms = retry_in.as_millis() as u64, suppressed, error = %e,
                            "fan-out commit failed; that child partition is tried again after a back-off, the others go on");
                    }
                }
            }
        }
        // A partition that failed past the reroute grace in this pass (its
        // trial) gives its keyless records to a sibling now, not at its
        // next try.
        let moves = slab.reroute(&self.health, &owners, now);
        self.rerouted(&moves, &owners, now);
        match slab.next_due(&self.health, now) {
            None => Pass::Done(slab),
            Some(wait) => {
                self.pending = Some(slab);
                // Never a busy loop: a group that did not land is due only
                // after its back-off.
                Pass::Wait(wait)
            }
        }
    }

    /// Counts and logs (rate-limited) keyless records moved from one child
    /// partition to a sibling.
    fn rerouted(&mut self, moves: &[(u32, u32, u64)], owners: &Owners, now: Duration) {
        let total: u64 = moves.iter().map(|m| m.2).sum();
        if total == 0 {
            return;
        }
        self.ctx.metrics.fanout_rerouted.get_or_create(&self.link_labels()).inc_by(total);
        let Some(suppressed) = self.reroute_log.hit(now) else { return };
        let (from, to, records) = moves[0];
        let why = match owners.get(from as usize).copied().flatten() {
            None => "has no owner",
            Some((_, false)) => "owner is dead",
            Some((_, true)) => "commits keep failing",
        };
        warn!(parent = %self.key.parent, child = %self.key.child, from, to, records, suppressed,
            "fan-out rerouting keyless records to a sibling child partition: its {why}; keyed records wait for it");
    }

    /// Stores the cursor (unless the link is gone) and publishes it.
    async fn persist(&self, part: &Arc<PartitionRt>, next: u64) -> bool {
        let path = cursor_file::path(part.log.dir(), self.key.epoch);
        let (fs, epoch, shared) = (self.ctx.fs.clone(), self.key.epoch, self.shared.clone());
        let r = tokio::task::spawn_blocking(move || {
            if shared.reason() == StopReason::Unlinked {
                return Ok(false);
            }
            cursor_file::store(&*fs, &path, CursorState { epoch, next_offset: next }).map(|()| true)
        })
        .await;
        match r {
            Ok(Ok(true)) => {
                self.shared.position.store(next, Ordering::Release);
                true
            }
            Ok(Ok(false)) => false,
            Ok(Err(e)) => {
                warn!(parent = %self.key.parent, child = %self.key.child, error = %e, "fan-out cursor file not stored; resending");
                false
            }
            Err(_) => false,
        }
    }
}

/// The first offset committed at or after `since_ms`, or the high
/// watermark if none is: a binary search over the retained offsets by
/// commit time (commit times never decrease along a partition), one
/// one-record read per step. Offsets that cannot be read are placed as late
/// as the next readable record, so an unreadable stretch is sent (and
/// counted as dropped by the cursor), never skipped unseen. Fails if the
/// log cannot be read.
pub fn anchor(log: &PartitionLog, since_ms: u64) -> Result<u64, ReadError> {
    // Everything below `lo` was committed before `since_ms`; the answer is
    // at most `hi`.
    let (mut lo, mut hi) = (log.oldest_offset(), log.high_watermark());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match log.read(mid, 1, u64::MAX) {
            Ok(batch) => match batch.records.first() {
                Some(r) if r.offset < hi && r.commit_time_ms < since_ms => lo = r.offset + 1,
                // Recent enough, or nothing readable in [mid, hi).
                _ => hi = mid,
            },
            // Retention moved the start past `mid`.
            Err(ReadError::Gone { oldest, .. }) if oldest > mid => {
                lo = oldest;
                hi = hi.max(lo);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(lo)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use narad_clock::ManualClock;
    use narad_log::{CommitRecord, LogConfig, PartitionLog};

    use super::anchor;

    /// A cursor that lost its file long after its link was made starts at
    /// the first record committed since the link, however many came after:
    /// (the search once walked back at most 1 Mi records and skipped the
    /// rest silently).
    #[test]
    fn the_fallback_start_is_the_first_record_since_the_attach_however_far_back() {
        let fs = narad_fs::SimFs::new(1).shared();
        let clock = ManualClock::new(1_000);
        let log = PartitionLog::open(
            fs,
            PathBuf::from("/p"),
            LogConfig::default(),
            std::sync::Arc::new(clock.clone()),
        )
        .unwrap();
        let commit = |n: usize| {
            let recs = (0..n).map(|_| CommitRecord::new(None, &b"x"[..])).collect();
            log.commit(recs).unwrap();
        };
        commit(100); // before the attach
        clock.set_wall_ms(2_000); // the attach
        for _ in 0..11 {
            commit(100_000);
            clock.advance(std::time::Duration::from_millis(1));
        }
        let hwm = log.high_watermark();
        assert_eq!(hwm, 1_100_100);
        assert_eq!(anchor(&log, 2_000).unwrap(), 100);
        assert_eq!(anchor(&log, 0).unwrap(), 0);
        assert_eq!(anchor(&log, 2_005).unwrap(), 100 + 5 * 100_000);
        assert_eq!(anchor(&log, 9_999).unwrap(), hwm, "nothing since: the high watermark");
    }
}
