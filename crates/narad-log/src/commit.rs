//! The durable commit: the combiner that groups concurrent batches into one
//! cycle, and the cycle itself (append, fdatasync, read back, publish; or
//! truncate back).
//!
//! # The combiner
//!
//! A caller queues its batch and parks. If no cycle is running, it becomes
//! the leader instead: it drains the queue (whole batches, oldest first, up
//! to the drain bounds) and runs the cycle on its own thread. When the cycle
//! ends it files every drained batch's outcome, hands the lead to the caller
//! of the oldest batch still queued (if any), and wakes the waiting callers.
//! A caller returns only with its own batch's outcome.
//!
//! Waiting callers sleep on one futex word, the combiner's epoch, which the
//! end of every cycle bumps and wakes with a single `wake_all`: one system
//! call per cycle instead of one `unpark` per caller, during which the
//! leader was preempted by each caller it woke. A queued caller woken this
//! way that neither has an outcome nor the lead goes back to sleep.
//!
//! Before draining, a new leader lingers while callers of the previous cycle
//! have not yet collected their outcomes (at most
//! [`LogConfig::commit_linger_us`](crate::LogConfig), 200 µs by default):
//! under closed-loop load (each committer commits again as soon as its last
//! commit returns) this lets them join the cycle instead of forming a second
//! group that alternates with the first, roughly doubling the records per
//! fdatasync. A lone committer never waits.
//!
//! # One cycle, under the produce lock
//!
//! 1. Refuse if closed or poisoned.
//! 2. Commit time `t = max(wall clock, previous t)`; offsets from the high
//!    watermark, contiguous in queue order.
//! 3. Encode frames (split at the frame target), write each with its own
//!    `write_all_at`, rolling to a new segment before a frame that would
//!    overflow the active one (the old segment is fdatasynced and trimmed
//!    to its frames first, so a sealed segment is always complete on disk
//!    and exactly its frames).
//!    A cycle of one frame then tops up the zero runway after it (see
//!    `extend_runway`); a cycle of several frames trims the runway first.
//! 4. `fdatasync` the active segment.
//! 5. Read every frame back and check its header and CRC.
//! 6. Publish: extend the view and its sparse index, advance the high
//!    watermark, cache the decoded frames, then (outside the lock) wake
//!    waiters and the listener.
//!
//! If any step from 3 on fails, the cycle is rolled back: segments it
//! created are removed, the segment it appended to is truncated to its old
//! length and fdatasynced. If that fails too, or if the step that failed was
//! an fdatasync, the log is poisoned: every later cycle fails until the log
//! is reopened (a failed fsync latches and is never retried: a later
//! fdatasync may report success for pages whose write-back failed; the
//! rollback's own fdatasync only makes the truncation durable, and nothing
//! is acked on it).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::Thread;
use std::time::{Duration, Instant};

use narad_fs::{FileRef, OpenMode};
use tracing::error;

use crate::cache::{DecodedFrame, DecodedRecord};
use crate::error::LogError;
use crate::frame::{self, FrameSeed, PayloadBuilder};
use crate::limits::{
    CYCLE_DRAIN_BYTES, CYCLE_DRAIN_RECORDS, MAX_COMMIT_BYTES, MAX_COMMIT_RECORDS,
    MAX_FRAME_RECORDS_WRITTEN, MAX_KEY_BYTES, MAX_RECORD_BYTES,
};
use crate::log::{Active, PartitionLog, SegFile, SegState, Writer, lock};
use crate::metrics::Counters;
use crate::segment::{self, IndexBuilder, SegmentFormat};
use crate::{CommitOutcome, CommitRecord, CycleTimings};

/// The largest read-back buffer a committing thread keeps between cycles.
const READ_BACK_KEEP_BYTES: usize = 4 << 20;

thread_local! {
    /// Scratch for reading back the frames of a cycle: one per committing
    /// thread (not per log, so 3,000 idle logs hold none), reused so a
    /// cycle neither allocates nor zeroes a fresh buffer.
    static READ_BACK: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

type Outcome = Result<CommitOutcome, LogError>;

/// A batch waiting for a cycle.
#[derive(Debug)]
struct Queued {
    id: u64,
    records: Vec<CommitRecord>,
    bytes: u64,
}

#[derive(Debug, Default)]
struct CombinerState {
    queue: VecDeque<Queued>,
    /// A cycle is running, or leadership was handed to `handoff`.
    leading: bool,
    /// The batch whose caller leads the next cycle.
    handoff: Option<u64>,
    done: HashMap<u64, Outcome>,
    next_id: u64,
    /// A leader lingering until the outcomes in `done` are collected.
    lingerer: Option<Thread>,
}

/// The commit combiner of one log.
#[derive(Debug, Default)]
pub(crate) struct Combiner {
    state: Mutex<CombinerState>,
    /// The futex word waiting callers sleep on: bumped (under `state`'s
    /// lock) and woken at the end of every cycle.
    epoch: AtomicU32,
}

/// Ends a cycle, even one that panicked: files an outcome for every drained
/// batch, hands the lead to the oldest queued batch's caller, and wakes the
/// waiting callers with one `wake_all`.
struct LeaderGuard<'a> {
    combiner: &'a Combiner,
    callers: Vec<u64>,
    outcomes: Option<Vec<Outcome>>,
}

impl Drop for LeaderGuard<'_> {
    fn drop(&mut self) {
        let outcomes = self.outcomes.take();
        let mut st = lock(&self.combiner.state);
        match outcomes {
            Some(outcomes) => {
                for (id, o) in self.callers.iter().zip(outcomes) {
                    st.done.insert(*id, o);
                }
            }
            None => {
                for id in &self.callers {
                    st.done.insert(*id, Err(LogError::CyclePanicked));
                }
            }
        }
        let next = st.queue.front().map(|q| q.id);
        st.handoff = next;
        st.leading = next.is_some();
        // Bumped under the lock: a caller that read the epoch under the lock
        // before this either sees the new value or is woken below.
        self.combiner.epoch.fetch_add(1, Ordering::Release);
        drop(st);
        atomic_wait::wake_all(&self.combiner.epoch);
    }
}

/// Checks a batch against the bounds; returns its key + payload bytes.
fn validate(records: &[CommitRecord]) -> Result<u64, LogError> {
    if records.is_empty() {
        return Err(LogError::EmptyCommit);
    }
    if records.len() > MAX_COMMIT_RECORDS {
        return Err(LogError::TooLarge {
            what: "commit record count",
            len: records.len() as u64,
            max: MAX_COMMIT_RECORDS as u64,
        });
    }
    let mut total = 0u64;
    for r in records {
        let key = r.key.as_ref().map_or(0, |k| k.len() as u64);
        if key > MAX_KEY_BYTES {
            return Err(LogError::TooLarge {
                what: "record key bytes",
                len: key,
                max: MAX_KEY_BYTES,
            });
        }
        let size = r.size();
        if size > MAX_RECORD_BYTES {
            return Err(LogError::TooLarge {
                what: "record bytes",
                len: size,
                max: MAX_RECORD_BYTES,
            });
        }
        total += size;
    }
    if total > MAX_COMMIT_BYTES {
        return Err(LogError::TooLarge { what: "commit bytes", len: total, max: MAX_COMMIT_BYTES });
    }
    Ok(total)
}

/// A frame of the cycle, encoded.
struct BuiltFrame {
    base: u64,
    count: u32,
    bytes: Vec<u8>,
    records: Vec<DecodedRecord>,
}

impl BuiltFrame {
    fn end(&self) -> u64 {
        self.base + u64::from(self.count)
    }
}

/// A segment the cycle wrote to (or created).
struct Touched {
    seg: Arc<SegFile>,
    file: FileRef,
    start_len: u64,
    len: u64,
    created: bool,
    /// A write was attempted (the file may hold bytes past `start_len`).
    dirty: bool,
    synced: bool,
    /// Its fdatasync failed: the log latches (see `commit_cycle`).
    sync_failed: bool,
    /// (frame index, byte position)
    frames: Vec<(usize, u64)>,
}

/// What the cycle did, for publishing or rolling back.
struct Cycle {
    prior_active: Option<Active>,
    touched: Vec<Touched>,
    /// A segment whose creation (file and synced header) was attempted and
    /// failed: it may exist.
    failed_create: Option<std::path::PathBuf>,
    /// The fdatasync of a new segment's header failed: latches like any
    /// other failed fdatasync of the cycle.
    header_sync_failed: bool,
    /// A trim of the runway failed after its `set_len`: what the disk holds
    /// past the frames is unknown (a failed fdatasync is never retried), so
    /// the rollback poisons the log; reopening cuts the tail.
    trim_failed: bool,
    /// Time spent in `write` calls and in `fdatasync` calls.
    write_time: Duration,
    sync_time: Duration,
}

impl PartitionLog {
    /// Commits a batch durably and returns its offsets and commit time. Blocks
    /// until the cycle holding the batch (see the module documentation of
    /// the crate) has appended, fdatasynced and verified it, or failed.
    ///
    /// Errors: [`LogError::EmptyCommit`] / [`LogError::TooLarge`] before
    /// queueing; [`LogError::Closed`] if the log is closed before the batch's
    /// cycle appended it; the cycle's I/O or verification error (the batch
    /// is not visible and its bytes were truncated away); or
    /// [`LogError::Poisoned`].
    pub fn commit(&self, records: Vec<CommitRecord>) -> Result<CommitOutcome, LogError> {
        let bytes = validate(&records)?;
        if self.is_closed() {
            return Err(LogError::Closed);
        }
        let outcome = self.combine(records, bytes);
        let counter =
            if outcome.is_ok() { &self.counters.commits } else { &self.counters.commit_failures };
        Counters::add(counter, 1);
        outcome
    }

    /// Batches waiting for a commit cycle (not counting the running one): a
    /// gauge of the combiner's queue.
    pub fn queued_commits(&self) -> usize {
        lock(&self.combiner.state).queue.len()
    }

    fn combine(&self, records: Vec<CommitRecord>, bytes: u64) -> Outcome {
        let c = &self.combiner;
        let mut st = lock(&c.state);
        let id = st.next_id;
        st.next_id += 1;
        st.queue.push_back(Queued { id, records, bytes });
        loop {
            if let Some(outcome) = take_outcome(&mut st, id) {
                return outcome;
            }
            let my_turn = if st.leading { st.handoff == Some(id) } else { true };
            if !my_turn {
                let epoch = c.epoch.load(Ordering::Acquire);
                drop(st);
                // Returns when a cycle ends after the epoch was read (at once
                // if one already has); a spurious wake-up just loops.
                atomic_wait::wait(&c.epoch, epoch);
                st = lock(&c.state);
                continue;
            }
            st.leading = true;
            st.handoff = None;
            st = self.linger(st);
            let drained = drain(&mut st.queue);
            drop(st);
            let mut guard = LeaderGuard {
                combiner: c,
                callers: drained.iter().map(|q| q.id).collect(),
                outcomes: None,
            };
            let (outcomes, advanced) = self.run_cycle(&drained);
            guard.outcomes = Some(outcomes);
            drop(guard);
            st = lock(&c.state);
            if advanced {
                // Collect our own outcome first (the next leader may be
                // lingering for it), then notify outside the lock.
                let own = take_outcome(&mut st, id);
                drop(st);
                self.notify_committed();
                if let Some(outcome) = own {
                    return outcome;
                }
                st = lock(&c.state);
            }
        }
    }

    /// The linger of a new leader: while callers of the previous cycle have
    /// not collected their outcomes yet, wait (at most the configured
    /// linger) for them to do so, so that a caller that commits again right
    /// away joins this cycle instead of starting the next. With a single
    /// committer there is nothing to collect and no wait.
    fn linger<'a>(
        &'a self,
        mut st: MutexGuard<'a, CombinerState>,
    ) -> MutexGuard<'a, CombinerState> {
        let max = Duration::from_micros(self.config.commit_linger_us);
        if st.done.is_empty() || max.is_zero() {
            return st;
        }
        let deadline = Instant::now() + max;
        while !st.done.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            st.lingerer = Some(std::thread::current());
            drop(st);
            std::thread::park_timeout(deadline - now);
            st = lock(&self.combiner.state);
        }
        st.lingerer = None;
        st
    }

    /// Runs one cycle for the drained batches; returns one outcome per batch
    /// and whether the high watermark advanced.
    fn run_cycle(&self, batches: &[Queued]) -> (Vec<Outcome>, bool) {
        let result = match self.writer.lock() {
            Ok(mut w) => self.cycle_locked(&mut w, batches),
            // A cycle panicked while holding the produce lock: the files
            // may hold unverified bytes. Refuse until reopened.
            Err(_) => Err(LogError::Poisoned { source: Arc::new(LogError::CyclePanicked) }),
        };
        match result {
            Ok((outcomes, timings)) => {
                self.observe_cycle(&timings);
                (outcomes.into_iter().map(Ok).collect(), true)
            }
            Err(e) => (batches.iter().map(|_| Err(e.clone())).collect(), false),
        }
    }

    fn cycle_locked(
        &self,
        w: &mut Writer,
        batches: &[Queued],
    ) -> Result<(Vec<CommitOutcome>, CycleTimings), LogError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(LogError::Closed);
        }
        if let Some(p) = &w.poisoned {
            return Err(LogError::Poisoned { source: p.clone() });
        }
        let time = self.clock.wall_ms().max(w.time_floor_ms);
        w.time_floor_ms = time;
        let base = w.next_offset;
        let mut next = base;
        let outcomes: Vec<CommitOutcome> = batches
            .iter()
            .map(|q| {
                let o = CommitOutcome {
                    first_offset: next,
                    count: q.records.len() as u64,
                    commit_time_ms: time,
                };
                next += o.count;
                o
            })
            .collect();
        let frames = self.build_frames(batches, base, time, FrameSeed::of_salt(w.salt))?;
        let mut cycle = Cycle {
            prior_active: w.active.clone(),
            touched: Vec::new(),
            failed_create: None,
            header_sync_failed: false,
            trim_failed: false,
            write_time: Duration::ZERO,
            sync_time: Duration::ZERO,
        };
        let flush_start = Instant::now();
        if let Err(e) = self.write_sync_verify(w, &frames, &mut cycle) {
            error!(
                dir = %self.dir.display(), error = %e, records = next - base,
                "partition commit failed; truncating back to the high watermark"
            );
            let sync_failed =
                cycle.header_sync_failed || cycle.touched.iter().any(|t| t.sync_failed);
            self.rollback(w, cycle);
            if sync_failed && w.poisoned.is_none() {
                // A failed fdatasync latches (DESIGN §3): a later one may
                // report success for pages whose write-back failed, so no
                // later cycle may trust one. Reopening re-runs recovery
                // from what the disk holds.
                error!(
                    dir = %self.dir.display(), error = %e,
                    "partition log fdatasync failed; the log refuses commits until it is reopened"
                );
                w.poisoned = Some(Arc::new(e.clone()));
            }
            return Err(e);
        }
        let timings = CycleTimings {
            flush: flush_start.elapsed(),
            write: cycle.write_time,
            fsync: cycle.sync_time,
            bytes: frames.iter().map(|f| f.bytes.len() as u64).sum(),
            records: next - base,
        };
        self.publish(w, &frames, cycle, time);
        Counters::add(&self.counters.commit_cycles, 1);
        Counters::add(&self.counters.records_committed, next - base);
        Ok((outcomes, timings))
    }

    fn build_frames(
        &self,
        batches: &[Queued],
        base: u64,
        time: u64,
        seed: FrameSeed,
    ) -> Result<Vec<BuiltFrame>, LogError> {
        let target = self.config.effective_frame_target() as usize;
        let codec = self.config.codec;
        let mut frames = Vec::new();
        // Each frame's buffer is allocated once, at the size it will reach.
        let wire = |r: &CommitRecord| PayloadBuilder::wire_len(r.key.as_deref(), r.payload.len());
        let mut left: usize = batches.iter().flat_map(|q| &q.records).map(wire).sum();
        let mut payload = PayloadBuilder::with_capacity(left.min(target));
        let mut records = Vec::new();
        let mut frame_base = base;
        let finish = |payload: PayloadBuilder, records: Vec<DecodedRecord>, frame_base: u64| {
            let count = payload.count();
            let bytes = payload
                .finish(frame_base, codec, seed)
                .map_err(|source| LogError::Encode { source })?;
            Ok::<_, LogError>(BuiltFrame { base: frame_base, count, bytes, records })
        };
        for r in batches.iter().flat_map(|q| &q.records) {
            let wire = wire(r);
            let full =
                payload.count() >= MAX_FRAME_RECORDS_WRITTEN || payload.len() + wire > target;
            if !payload.is_empty() && full {
                left -= payload.len();
                let done = std::mem::replace(
                    &mut payload,
                    PayloadBuilder::with_capacity(left.min(target)),
                );
                let n = u64::from(done.count());
                frames.push(finish(done, std::mem::take(&mut records), frame_base)?);
                frame_base += n;
            }
            payload.push(r.key.as_deref(), time, &r.payload);
            records.push(DecodedRecord {
                key: r.key.clone(),
                commit_time_ms: time,
                payload: r.payload.clone(),
            });
        }
        if !payload.is_empty() {
            frames.push(finish(payload, records, frame_base)?);
        }
        Ok(frames)
    }

    fn write_sync_verify(
        &self,
        w: &mut Writer,
        frames: &[BuiltFrame],
        cycle: &mut Cycle,
    ) -> Result<(), LogError> {
        let segment_bytes = self.config.segment_bytes;
        if frames.len() > 1 {
            // Several frames are never written over the zero runway: see
            // `extend_runway`.
            self.trim_runway(w, cycle)?;
        }
        for (i, f) in frames.iter().enumerate() {
            let len = f.bytes.len() as u64;
            let roll = match &w.active {
                None => true,
                // A format 1 segment (or one of another salt) never gets a
                // frame of this binary: its frames are sealed with the
                // log's salt.
                Some(a) if a.seg.format != (SegmentFormat::Salted { salt: w.salt }) => true,
                Some(a) => a.len > a.seg.frames_start() && a.len + len > segment_bytes,
            };
            if roll {
                self.roll(w, f.base, cycle)?;
            }
            let a = w.active.as_mut().expect("a segment is active after a roll");
            if cycle.touched.last().is_none_or(|t| !Arc::ptr_eq(&t.seg, &a.seg)) {
                cycle.touched.push(Touched {
                    seg: a.seg.clone(),
                    file: a.file.clone(),
                    start_len: a.len,
                    len: a.len,
                    created: false,
                    dirty: false,
                    synced: false,
                    sync_failed: false,
                    frames: Vec::new(),
                });
            }
            let t = cycle.touched.last_mut().expect("pushed above");
            t.dirty = true;
            let started = Instant::now();
            let written = t.file.write_all_at(&f.bytes, t.len);
            cycle.write_time += started.elapsed();
            written.map_err(|e| LogError::io("write", &t.seg.path, e))?;
            t.frames.push((i, t.len));
            t.len += len;
            a.len = t.len;
        }
        if let [frame] = frames {
            self.extend_runway(w, frame.bytes.len() as u64, cycle)?;
        }
        if let Some(t) = cycle.touched.last_mut() {
            self.sync(t, &mut cycle.sync_time)?;
        }
        READ_BACK.with_borrow_mut(|buf| self.read_back(cycle, frames, buf))
    }

    /// Reads back every frame this cycle wrote and checks it against what
    /// was written. `buf` is the committing thread's scratch buffer.
    fn read_back(
        &self,
        cycle: &Cycle,
        frames: &[BuiltFrame],
        buf: &mut Vec<u8>,
    ) -> Result<(), LogError> {
        let out = self.read_back_into(cycle, frames, buf);
        if buf.capacity() > READ_BACK_KEEP_BYTES {
            // A rare huge cycle does not pin its buffer on this thread.
            *buf = Vec::new();
        }
        out
    }

    fn read_back_into(
        &self,
        cycle: &Cycle,
        frames: &[BuiltFrame],
        buf: &mut Vec<u8>,
    ) -> Result<(), LogError> {
        for t in &cycle.touched {
            for &(i, pos) in &t.frames {
                let f = &frames[i];
                buf.resize(f.bytes.len(), 0);
                t.file
                    .read_exact_at(buf, pos)
                    .map_err(|e| LogError::io("read back", &t.seg.path, e))?;
                let fail = |reason: String| {
                    Counters::add(&self.counters.verify_failures, 1);
                    LogError::VerifyFailed { path: t.seg.path.clone(), offset: pos, reason }
                };
                let h = frame::verify_frame(buf, t.seg.seed()).map_err(|e| fail(e.to_string()))?;
                if h.base_offset != f.base || h.count != f.count {
                    return Err(fail(format!(
                        "frame holds offsets {}+{}, {}+{} were written",
                        h.base_offset, h.count, f.base, f.count
                    )));
                }
            }
        }
        Ok(())
    }

    /// Fdatasyncs a segment the cycle wrote to, once; adds the time taken
    /// to `spent`.
    fn sync(&self, t: &mut Touched, spent: &mut Duration) -> Result<(), LogError> {
        if t.dirty && !t.synced {
            let started = Instant::now();
            let synced = t.file.sync_data();
            *spent += started.elapsed();
            t.sync_failed = synced.is_err();
            synced.map_err(|e| LogError::io("fdatasync", &t.seg.path, e))?;
            Counters::add(&self.counters.syncs, 1);
            t.synced = true;
        }
        Ok(())
    }

    /// After the write of a cycle of one frame, before its fdatasync: tops
    /// the zero runway after the active segment's data up to
    /// `min(runway_bytes, data in the segment, room left in the segment)`
    /// once less than half of that is left. The cycle's fdatasync makes the
    /// zeros durable with the frame; later one-frame cycles then overwrite
    /// blocks the file has, and their fdatasync does not change its size.
    ///
    /// Why only one-frame cycles overwrite the runway: a crash may keep any
    /// subset of an unsynced overwrite's pages (an append is cut by the
    /// file size the journal commits). A torn frame followed by zeros is a
    /// torn tail recovery truncates; a torn frame followed by a whole frame
    /// of the same write would read as damage before valid frames. So a
    /// cycle of several frames first trims the runway, durably, and
    /// appends.
    ///
    /// Only a small frame (at most [`runway_frame_max`]) extends it: every
    /// runway byte is written twice, as a zero and then as data, which pays
    /// for itself when a cycle's fdatasync is dominated by its journal
    /// commit, not when it is dominated by its own bytes (64 committers of
    /// 1 KiB, 66 KiB cycles, lost 5-10% with it).
    fn extend_runway(
        &self,
        w: &mut Writer,
        frame_len: u64,
        cycle: &mut Cycle,
    ) -> Result<(), LogError> {
        if frame_len > runway_frame_max(self.config.runway_bytes) {
            return Ok(());
        }
        let Some(a) = w.active.as_mut() else { return Ok(()) };
        let room = self.config.segment_bytes.saturating_sub(a.len);
        let want = self.config.runway_bytes.min(a.len).min(room);
        if want == 0 || a.alloc >= a.len + want / 2 {
            return Ok(());
        }
        let from = a.alloc.max(a.len);
        let to = a.len + want;
        let started = Instant::now();
        let written = narad_fs::write_zeros(&*a.file, from, to);
        cycle.write_time += started.elapsed();
        written.map_err(|e| LogError::io("write", &a.seg.path, e))?;
        a.alloc = to;
        Ok(())
    }

    /// Cuts the active segment's file back to its frames, durably, if it is
    /// longer (its size is asked of the file, not taken from the hint):
    /// before a cycle of several frames and before the segment is sealed.
    fn trim_runway(&self, w: &mut Writer, cycle: &mut Cycle) -> Result<(), LogError> {
        let Some(a) = w.active.as_mut() else { return Ok(()) };
        let path = &a.seg.path;
        let size = a.file.len().map_err(|e| LogError::io("stat", path, e))?;
        if size > a.len {
            cycle.trim_failed = true;
            a.file.set_len(a.len).map_err(|e| LogError::io("truncate", path, e))?;
            let started = Instant::now();
            let synced = a.file.sync_data();
            cycle.sync_time += started.elapsed();
            synced.map_err(|e| LogError::io("fdatasync", path, e))?;
            Counters::add(&self.counters.syncs, 1);
            cycle.trim_failed = false;
        }
        a.alloc = a.len;
        Ok(())
    }

    /// Starts a new segment at `base`. The current one is synced and cut to
    /// its frames first, so a sealed segment is always complete on disk, and
    /// exactly its frames, before its successor exists. The new segment's
    /// header is fdatasynced before any frame is written behind it (see
    /// `segment`: a bad header with bytes after it is then never a tear).
    fn roll(&self, w: &mut Writer, base: u64, cycle: &mut Cycle) -> Result<(), LogError> {
        if let Some(t) = cycle.touched.last_mut() {
            self.sync(t, &mut cycle.sync_time)?;
        }
        self.trim_runway(w, cycle)?;
        let path = segment::segment_path(&self.dir, base);
        cycle.failed_create = Some(path.clone());
        let file = self
            .fs
            .open(&path, OpenMode::CreateNew)
            .map_err(|e| LogError::io("create", &path, e))?;
        let header = segment::segment_header(base, w.salt);
        let started = Instant::now();
        let written = file.write_all_at(&header, 0);
        cycle.write_time += started.elapsed();
        written.map_err(|e| LogError::io("write", &path, e))?;
        let started = Instant::now();
        let synced = file.sync_data();
        cycle.sync_time += started.elapsed();
        cycle.header_sync_failed = synced.is_err();
        synced.map_err(|e| LogError::io("fdatasync", &path, e))?;
        Counters::add(&self.counters.syncs, 1);
        cycle.failed_create = None;
        let format = SegmentFormat::Salted { salt: w.salt };
        let start = format.frames_start();
        let seg = SegFile::new(base, path, format, Some(file.clone()));
        cycle.touched.push(Touched {
            seg: seg.clone(),
            file: file.clone(),
            start_len: start,
            len: start,
            created: true,
            dirty: false,
            sync_failed: false,
            synced: false,
            frames: Vec::new(),
        });
        w.active = Some(Active { seg, file, len: start, alloc: start });
        Counters::add(&self.counters.segments_rolled, 1);
        Ok(())
    }

    /// Undoes a failed cycle: removes the segments it created (newest
    /// first), then truncates the segment it appended to back to its old
    /// length and fdatasyncs it. Poisons the log if any of that fails.
    fn rollback(&self, w: &mut Writer, cycle: Cycle) {
        Counters::add(&self.counters.rollbacks, 1);
        let remove = |path: &std::path::Path| match self.fs.remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(LogError::io("remove", path, e)),
        };
        let result = (|| {
            if let Some(path) = &cycle.failed_create {
                remove(path)?;
            }
            if cycle.trim_failed {
                return Err(LogError::io(
                    "trim the zero runway",
                    &self.dir,
                    std::io::Error::other("the segment's size on disk is unknown"),
                ));
            }
            for t in cycle.touched.iter().rev() {
                if t.created {
                    *lock(&t.seg.handle) = None;
                    remove(&t.seg.path)?;
                } else if t.dirty {
                    t.file
                        .set_len(t.start_len)
                        .map_err(|e| LogError::io("truncate", &t.seg.path, e))?;
                    t.file.sync_data().map_err(|e| LogError::io("fdatasync", &t.seg.path, e))?;
                    Counters::add(&self.counters.syncs, 1);
                }
            }
            Ok::<(), LogError>(())
        })();
        w.active = cycle.prior_active;
        if let Some(a) = w.active.as_mut() {
            // Truncated back (or never written): the file is its frames,
            // unless the truncation failed, which poisons the log below.
            if cycle.touched.iter().any(|t| Arc::ptr_eq(&t.seg, &a.seg) && t.dirty) {
                a.alloc = a.len;
            }
        }
        if let Err(e) = result {
            error!(
                dir = %self.dir.display(), error = %e,
                "could not truncate a failed commit back to the high watermark; the partition log is poisoned until reopened"
            );
            w.poisoned = Some(Arc::new(e));
        }
    }

    /// Makes a verified cycle visible.
    fn publish(&self, w: &mut Writer, frames: &[BuiltFrame], cycle: Cycle, time: u64) {
        let end = frames.last().map_or(w.next_offset, BuiltFrame::end);
        w.next_offset = end;
        let stride = self.config.index_stride_bytes;
        let mut sealed = Vec::new();
        let mut decoded = Vec::new();
        {
            let mut v = self.view_write();
            for t in &cycle.touched {
                if t.frames.is_empty() {
                    continue;
                }
                if t.created {
                    v.segments.push(SegState {
                        file: t.seg.clone(),
                        end_pos: t.seg.frames_start(),
                        end_offset: t.seg.base,
                        index: Vec::new(),
                        last_frame_pos: None,
                        first_time_ms: None,
                        newest_time_ms: None,
                    });
                }
                let s = v.segments.last_mut().expect("the cycle's segment is in the view");
                assert_eq!(s.file.base, t.seg.base, "a cycle writes only to the last segment");
                let first_frames = s.last_frame_pos.is_none();
                let mut ib = IndexBuilder::new(stride, s.index.last().map(|e| u64::from(e.pos)));
                for &(i, pos) in &t.frames {
                    let f = &frames[i];
                    if let Some(e) = ib.frame(f.base - s.file.base, pos) {
                        s.index.push(e);
                    }
                    s.last_frame_pos = Some(pos);
                    decoded.push(Arc::new(DecodedFrame {
                        base: f.base,
                        records: f.records.clone(),
                        segment_base: s.file.base,
                        pos,
                        frame_len: f.bytes.len() as u64,
                    }));
                }
                if first_frames {
                    s.first_time_ms = Some(time);
                }
                s.end_pos = t.len;
                s.end_offset = frames[t.frames.last().expect("non-empty").0].end();
                s.newest_time_ms = Some(time);
            }
            assert_eq!(v.segments.last().map_or(end, |s| s.end_offset), end);
            v.hwm = end;
            self.hwm.store(end, Ordering::Release);
        }
        // Segments the cycle rolled away from are sealed now: their handles
        // join the few kept open for readers.
        let active = w.active.as_ref().map(|a| a.seg.clone());
        let is_active = |s: &Arc<SegFile>| active.as_ref().is_some_and(|a| Arc::ptr_eq(a, s));
        for s in
            cycle.prior_active.iter().map(|a| &a.seg).chain(cycle.touched.iter().map(|t| &t.seg))
        {
            if !is_active(s) && !sealed.iter().any(|x| Arc::ptr_eq(x, s)) {
                sealed.push(s.clone());
            }
        }
        for s in sealed {
            self.remember_sealed(s);
        }
        let mut cache = lock(&self.cache);
        for f in decoded {
            cache.insert(f);
        }
        drop(cache);
        Counters::add(&self.counters.frames_written, frames.len() as u64);
        Counters::add(
            &self.counters.bytes_written,
            frames.iter().map(|f| f.bytes.len() as u64).sum(),
        );
    }
}

/// The largest frame whose cycle tops up a zero runway of `runway_bytes`
/// (an eighth of it: 32 KiB for the default 256 KiB; 0 when there is none).
pub(crate) fn runway_frame_max(runway_bytes: u64) -> u64 {
    runway_bytes / 8
}

/// Removes a caller's filed outcome, waking a lingering leader when it was
/// the last one to collect.
fn take_outcome(st: &mut CombinerState, id: u64) -> Option<Outcome> {
    let outcome = st.done.remove(&id)?;
    if st.done.is_empty()
        && let Some(t) = st.lingerer.take()
    {
        t.unpark();
    }
    Some(outcome)
}

/// Takes whole batches from the queue, oldest first, until the drain bounds
/// are reached (always at least one).
fn drain(queue: &mut VecDeque<Queued>) -> Vec<Queued> {
    let mut out = Vec::new();
    let (mut records, mut bytes) = (0usize, 0u64);
    while let Some(q) = queue.front() {
        let over =
            records + q.records.len() > CYCLE_DRAIN_RECORDS || bytes + q.bytes > CYCLE_DRAIN_BYTES;
        if !out.is_empty() && over {
            break;
        }
        records += q.records.len();
        bytes += q.bytes;
        out.push(queue.pop_front().expect("front exists"));
    }
    out
}
