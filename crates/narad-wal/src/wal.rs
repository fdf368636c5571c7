//! The ingress WAL: open (recovery), append (group commit), the durable
//! frontier, the dispatch checkpoint and compaction.
//!
//! # Directory `<data>/ingress/produce/`
//! * `%020d.wal` segments (see [`crate::frame`]), named by base sequence
//!   number, at most 64 MiB each; dense sequence numbers across segments.
//! * `checkpoint` (see [`crate::checkpoint`]): the first sequence number not
//!   yet dispatched.
//!
//! # Threads
//! * The *sync thread* owns every write to segments: it takes what
//!   appenders staged, writes it (one `pwrite` per segment touched, and
//!   one per 64 KiB of zeros when it tops up the runway after the frames), syncs
//!   it, advances the durable frontier, and completes the group. It wakes on
//!   every append (only when parked) and every 10 ms.
//! * The *prep thread* (only with [`WalOptions::prealloc`]) writes out the
//!   next segment in advance (see [`crate::prep`]) once the active one is
//!   half full; the sync thread renames it in at the roll.
//! * The *checkpoint thread* makes stored checkpoints durable within
//!   250 ms (one `fdatasync` per burst), then compacts behind the synced
//!   value: it deletes segments whose records are all below it, and asks for
//!   a fully dispatched active segment over 1 MiB to be rotated.
//!
//! # Invariants
//! * An append returns `Ok` only after its own bytes were fdatasynced.
//! * The durable frontier only covers synced bytes; readers never read past
//!   it.
//! * After the first failed write or sync the WAL is latched: the group in
//!   flight and every later append fail with that error. Never retried.
//! * A roll whose new segment file cannot be created (out of file
//!   descriptors, say) wrote nothing: that group, and whatever was staged
//!   behind it, fail with [`WalError::SegmentUnavailable`], the staging
//!   state goes back to the durable frontier in the previous segment, and
//!   the next append rolls again. Not latched.
//! * Segments are deleted only below a checkpoint value that was synced.
//! * Only the last segment may extend past its frames (zeros of the runway,
//!   or a prepared segment's zeros and trailer); a segment is cut to its
//!   frames, durably, before its successor is created.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_fs::{FsRef, OpenMode};
use tracing::{error, info, warn};

use crate::checkpoint::{CheckpointFile, Stored};
use crate::error::WalError;
use crate::frame::{
    FrameSeed, SEGMENT_FLAG_PREPARED, SEGMENT_VERSION, new_salt, parse_segment_file_name,
    segment_file_name, segment_header, segment_header_with_flags,
};
use crate::group::Pending;
use crate::limits::{
    CHECKPOINT_SYNC_DELAY, COMPACTION_INTERVAL, FRAME_HEADER_BYTES, GATHER_MAX_WAIT,
    GATHER_MIN_GROUP, MAX_RECORD_BYTES, ROTATE_DISPATCHED_ACTIVE_BYTES, RUNWAY_BYTES,
    SEGMENT_BYTES, SEGMENT_HEADER_BYTES, STAGING_KEEP_BYTES, SYNC_BACKSTOP,
};
use crate::prep;
use crate::reader::WalReader;
use crate::record::RecordError;
use crate::record::RecordRef;
use crate::recovery::{self, Behind, Decision};
use crate::segment::{Segment, SegmentMap};
use crate::stage::{Chunk, Stage};
use crate::tail::Tail;

/// A callback run by the sync thread each time the durable frontier moves;
/// it receives the new frontier (first sequence number not yet durable).
/// Keep it short: it runs on the path every appender waits on.
pub type DurableListener = Arc<dyn Fn(u64) + Send + Sync>;

/// Sizes of a WAL. The defaults are the production values; tests use small
/// segments to exercise rolls and compaction cheaply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalOptions {
    /// A segment is rolled before a frame would take it past this size.
    pub segment_bytes: u64,
    /// The largest encoded record accepted.
    pub max_record_bytes: u32,
    /// A fully dispatched active segment larger than this is rotated.
    pub rotate_dispatched_active_bytes: u64,
    /// A stored checkpoint is made durable this long after it is stored
    /// (one fdatasync per burst). Simulations set it very long and flush
    /// explicitly, so every disk operation happens in a seeded order.
    pub checkpoint_sync_delay: Duration,
    /// How often the background looks for compaction work when idle.
    pub compaction_interval: Duration,
    /// Prepare each next segment in advance, zero-filled to its full size
    /// (`storage.ingress_wal_prealloc`, off by default): group commits then
    /// overwrite allocated blocks instead of growing the file.
    pub prealloc: bool,
    /// Zeros kept written after the active segment's frames (0: none), so
    /// small group commits overwrite blocks the file already has and their
    /// fdatasync does not change its size (see [`extend_runway`]); never
    /// past the segment's size. Only groups of at most an eighth of this
    /// extend it.
    pub runway_bytes: u64,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: SEGMENT_BYTES,
            max_record_bytes: MAX_RECORD_BYTES,
            rotate_dispatched_active_bytes: ROTATE_DISPATCHED_ACTIVE_BYTES,
            checkpoint_sync_delay: CHECKPOINT_SYNC_DELAY,
            compaction_interval: COMPACTION_INTERVAL,
            prealloc: false,
            runway_bytes: RUNWAY_BYTES,
        }
    }
}

impl WalOptions {
    fn validate(&self) -> Result<(), String> {
        if self.max_record_bytes == 0 || self.max_record_bytes > MAX_RECORD_BYTES {
            return Err(format!("max_record_bytes must be in 1..={MAX_RECORD_BYTES}"));
        }
        let min_segment =
            SEGMENT_HEADER_BYTES + FRAME_HEADER_BYTES + u64::from(self.max_record_bytes);
        if self.segment_bytes < min_segment || self.segment_bytes > 1 << 30 {
            return Err(format!(
                "segment_bytes must be in {min_segment}..=1 GiB so a largest record always fits"
            ));
        }
        if self.rotate_dispatched_active_bytes >= self.segment_bytes {
            return Err("rotate_dispatched_active_bytes must be below segment_bytes".into());
        }
        Ok(())
    }
}

/// Counters for metrics and benchmarks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WalStats {
    /// Group commits that synced at least one record.
    pub syncs: u64,
    /// Records made durable.
    pub records: u64,
    /// Frame bytes made durable.
    pub bytes: u64,
    /// Segments deleted by compaction.
    pub segments_compacted: u64,
    /// Nanoseconds the sync thread spent writing and fdatasyncing.
    pub io_nanos: u64,
    /// Rolls that renamed in a prepared segment.
    pub prepared_rolls: u64,
    /// Segment preparations that failed (the roll then creates an empty
    /// segment, as without preparation).
    pub prep_failures: u64,
    /// Top-ups of the zero runway that failed (that segment's group commits
    /// then append).
    pub runway_failures: u64,
    /// Rolls whose new segment could not be created (the group commit failed
    /// and the next append retried; not latched).
    pub segment_create_failures: u64,
    /// Bytes readers took from the in-memory tail of latest group commits.
    pub read_memory_bytes: u64,
    /// Bytes readers read from segment files (behind the tail, or after a
    /// restart).
    pub read_disk_bytes: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    io_nanos: AtomicU64,
    syncs: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
    segments_compacted: AtomicU64,
    prepared_rolls: AtomicU64,
    prep_failures: AtomicU64,
    runway_failures: AtomicU64,
    segment_create_failures: AtomicU64,
    pub(crate) read_memory_bytes: AtomicU64,
    pub(crate) read_disk_bytes: AtomicU64,
}

/// The prepared next segment, between the prep thread and the sync thread.
#[derive(Debug, Default)]
struct Spare {
    /// A durable prepared file, ready to be renamed in.
    ready: Option<narad_fs::FileRef>,
    /// The sync thread asked for one and the prep thread has not answered.
    wanted: bool,
    /// Asked once for the current active segment (reset at each roll), so
    /// a failing disk is not asked again and again.
    asked: bool,
    closing: bool,
}

#[derive(Debug)]
struct Checkpoint {
    file: CheckpointFile,
    /// The latest value written in place.
    stored: u64,
    /// The latest value known durable.
    synced: u64,
    /// When the oldest unsynced store happened.
    dirty_since: Option<Instant>,
    /// A failed checkpoint sync: compaction stops until restart.
    failed: Option<WalError>,
    closing: bool,
}

pub(crate) struct Shared {
    pub(crate) fs: FsRef,
    pub(crate) dir: PathBuf,
    stage: Mutex<Stage>,
    sync_wake: Condvar,
    latch: OnceLock<WalError>,
    pub(crate) durable_next: AtomicU64,
    durable_mutex: Mutex<()>,
    durable_cv: Condvar,
    listeners: RwLock<Vec<DurableListener>>,
    pub(crate) segments: SegmentMap,
    checkpoint: Mutex<Checkpoint>,
    checkpoint_cv: Condvar,
    spare: Mutex<Spare>,
    spare_cv: Condvar,
    /// Serializes checkpoint flushes (background and explicit).
    checkpoint_sync: Mutex<()>,
    pub(crate) counters: Counters,
    /// The latest durable chunks, for readers at the frontier.
    pub(crate) tail: Tail,
    options: WalOptions,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("dir", &self.dir)
            .field("durable_next", &self.durable_next)
            .field("latched", &self.latch.get().is_some())
            .finish_non_exhaustive()
    }
}

/// The ingress write-ahead log. Cheap to share behind an `Arc`; every
/// method takes `&self`.
#[derive(Debug)]
pub struct Wal {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    newest_incarnation: Option<NewestIncarnation>,
}

/// The record carrying the highest topic incarnation among those the WAL
/// held when it was opened. A record is accepted under the incarnation the
/// metastore had applied, so the metastore that accepted it had applied
/// index at least `incarnation`: the broker refuses to start on a
/// metastore behind that (a rolled-back copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewestIncarnation {
    /// The incarnation id.
    pub incarnation: u64,
    /// The sequence number of the (first) record carrying it.
    pub seq: u64,
    /// The segment file holding that record.
    pub segment: PathBuf,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Wal {
    /// Opens (recovering) or creates the WAL in `dir` with default sizes.
    pub fn open(fs: FsRef, dir: impl Into<PathBuf>) -> Result<Wal, WalError> {
        Wal::open_with(fs, dir, WalOptions::default())
    }

    /// Opens (recovering) or creates the WAL in `dir`.
    pub fn open_with(
        fs: FsRef,
        dir: impl Into<PathBuf>,
        options: WalOptions,
    ) -> Result<Wal, WalError> {
        let dir = dir.into();
        options.validate().map_err(|reason| {
            WalError::io(
                "validate options",
                &dir,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, reason),
            )
        })?;
        fs.create_dir_all(&dir).map_err(|e| WalError::io("create directory", &dir, e))?;
        let recovered = recover(&*fs, &dir, &options)?;
        let oldest = *recovered.segments.keys().next().expect("recovery leaves a segment");
        let checkpoint = recover_checkpoint(&*fs, &dir, oldest, recovered.next_seq)?;
        let last = recovered.segments.values().next_back().expect("a segment");
        let mut stage = Stage::new(
            recovered.next_seq,
            last.base,
            last.durable_len(),
            last.seed,
            options.segment_bytes,
        );
        // An older binary's last segment (version 1, holding frames) takes
        // no frame of this one: the first record rolls to a salted segment.
        stage.roll_first = recovered.last_unsalted;
        info!(
            dir = %dir.display(),
            segments = recovered.segments.len(),
            next_seq = recovered.next_seq,
            checkpoint = checkpoint.1,
            "ingress WAL opened"
        );
        let shared = Arc::new(Shared {
            fs,
            dir,
            stage: Mutex::new(stage),
            sync_wake: Condvar::new(),
            latch: OnceLock::new(),
            durable_next: AtomicU64::new(recovered.next_seq),
            durable_mutex: Mutex::new(()),
            durable_cv: Condvar::new(),
            listeners: RwLock::new(Vec::new()),
            segments: RwLock::new(recovered.segments),
            checkpoint: Mutex::new(Checkpoint {
                file: checkpoint.0,
                stored: checkpoint.1,
                synced: checkpoint.1,
                dirty_since: None,
                failed: None,
                closing: false,
            }),
            checkpoint_cv: Condvar::new(),
            spare: Mutex::new(Spare::default()),
            spare_cv: Condvar::new(),
            checkpoint_sync: Mutex::new(()),
            counters: Counters::default(),
            tail: Tail::default(),
            options,
        });
        let s1 = shared.clone();
        let s2 = shared.clone();
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| WalError::io("spawn thread", PathBuf::from(name), e))
        };
        let t1 = spawn("wal-sync", Box::new(move || sync_loop(&s1)))?;
        let t2 = spawn("wal-checkpoint", Box::new(move || checkpoint_loop(&s2)))?;
        let mut threads = vec![t1, t2];
        if shared.options.prealloc {
            let s3 = shared.clone();
            threads.push(spawn("wal-prep", Box::new(move || prep_loop(&s3)))?);
        }
        Ok(Wal { shared, threads: Mutex::new(threads), newest_incarnation: recovered.newest })
    }

    /// The record with the highest topic incarnation the WAL held when it
    /// was opened (records of format 1 carry none), if any.
    pub fn newest_incarnation_at_open(&self) -> Option<&NewestIncarnation> {
        self.newest_incarnation.as_ref()
    }

    /// The WAL's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The record's encoded length, checked against this WAL's limits.
    pub fn checked_len(&self, rec: &RecordRef<'_>) -> Result<u32, WalError> {
        let len = rec.encoded_len()?;
        let max = self.shared.options.max_record_bytes;
        if len > max {
            return Err(RecordError::TooLarge { size: u64::from(len), max }.into());
        }
        Ok(len)
    }

    fn check_open(&self, st: &Stage) -> Result<(), WalError> {
        if let Some(e) = self.shared.latch.get() {
            return Err(e.clone());
        }
        if st.closing {
            return Err(WalError::Closed);
        }
        Ok(())
    }

    /// The error of a roll that found no randomness for the new segment's
    /// salt: nothing was staged and nothing latched, so it is retriable.
    fn no_salt(&self, st: &Stage, e: std::io::Error) -> WalError {
        WalError::SegmentUnavailable {
            path: self.shared.dir.join(segment_file_name(st.next_seq)),
            source: Arc::new(e),
        }
    }

    fn wake_sync(&self, st: &mut Stage) {
        if st.take_sync_wake() {
            self.shared.sync_wake.notify_one();
        }
    }

    /// Stages one record and returns a [`Pending`] that resolves to its
    /// sequence number once it is durable. The record waits for the true
    /// outcome even if the `Pending` is dropped.
    pub fn append_async(&self, rec: &RecordRef<'_>) -> Result<Pending<u64>, WalError> {
        let len = self.checked_len(rec)?;
        let mut st = lock(&self.shared.stage);
        self.check_open(&st)?;
        let seq = st.stage(rec, len).map_err(|e| self.no_salt(&st, e))?;
        let group = st.group.clone();
        self.wake_sync(&mut st);
        Ok(Pending::new(group, seq))
    }

    /// Appends one record and returns its sequence number once durable.
    pub fn append(&self, rec: &RecordRef<'_>) -> Result<u64, WalError> {
        self.append_async(rec)?.wait()
    }

    /// Stages several records with consecutive sequence numbers (nothing
    /// else staged between them) after checking every record's size first;
    /// resolves once the last of them is durable.
    pub fn append_many_async(
        &self,
        recs: &[RecordRef<'_>],
    ) -> Result<Pending<Range<u64>>, WalError> {
        let mut lens = Vec::with_capacity(recs.len());
        for r in recs {
            lens.push(self.checked_len(r)?);
        }
        debug_assert_eq!(lens.len(), recs.len());
        self.append_many_with_async(recs.len(), |i| Ok::<_, WalError>(recs[i]))
    }

    /// Blocking form of [`Wal::append_many_async`].
    pub fn append_many(&self, recs: &[RecordRef<'_>]) -> Result<Range<u64>, WalError> {
        self.append_many_async(recs)?.wait()
    }

    /// Stages `count` records produced by `fill(i)` under one hold of the
    /// append lock, checking each record's size as it comes. If `fill` fails
    /// (or panics), or a record is too large, every record this call staged
    /// is withdrawn and its sequence number given back; nothing of it
    /// reaches the disk.
    pub fn append_many_with_async<'r, E>(
        &self,
        count: usize,
        mut fill: impl FnMut(usize) -> Result<RecordRef<'r>, E>,
    ) -> Result<Pending<Range<u64>>, E>
    where
        E: From<WalError>,
    {
        let mut st = lock(&self.shared.stage);
        self.check_open(&st)?;
        let first = st.next_seq;
        /// Withdraws the batch unless disarmed: on an error from `fill`, and
        /// if `fill` panics while the lock is held.
        struct Rollback<'a> {
            st: &'a mut Stage,
            mark: Option<crate::stage::Mark>,
        }
        impl Drop for Rollback<'_> {
            fn drop(&mut self) {
                if let Some(m) = self.mark.take() {
                    self.st.rollback(m);
                }
            }
        }
        {
            let mark = st.mark();
            let mut guard = Rollback { st: &mut st, mark: Some(mark) };
            for i in 0..count {
                let rec = fill(i)?;
                let len = self.checked_len(&rec)?;
                guard.st.stage(&rec, len).map_err(|e| self.no_salt(guard.st, e))?;
            }
            guard.mark = None;
        }
        let end = st.next_seq;
        let group = st.group.clone();
        if end > first {
            self.wake_sync(&mut st);
        }
        Ok(Pending::new(group, first..end))
    }

    /// The first sequence number that is not yet durable.
    pub fn durable_next(&self) -> u64 {
        self.shared.durable_next.load(Ordering::Acquire)
    }

    /// Registers a callback run each time the durable frontier advances.
    pub fn on_durable(&self, listener: DurableListener) {
        self.shared.listeners.write().unwrap_or_else(|p| p.into_inner()).push(listener);
    }

    /// Blocks until the durable frontier passes `seq` (i.e. `seq` is
    /// durable) or `timeout` elapses; returns whether it did.
    pub fn wait_durable(&self, seq: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = lock(&self.shared.durable_mutex);
        loop {
            if self.durable_next() > seq {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g = self
                .shared
                .durable_cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Whether a write or sync failure latched the WAL.
    pub fn is_latched(&self) -> bool {
        self.shared.latch.get().is_some()
    }

    /// The latched error, if any.
    pub fn latched_error(&self) -> Option<WalError> {
        self.shared.latch.get().cloned()
    }

    /// A reader positioned at `seq`, for the dispatcher.
    pub fn reader(&self, seq: u64) -> WalReader {
        WalReader::new(self.shared.clone(), seq)
    }

    /// Stores a new checkpoint (the first sequence number not yet
    /// dispatched): written in place at once, made durable within 250 ms.
    /// Values at or below the current one are ignored.
    pub fn store_checkpoint(&self, seq: u64) -> Result<(), WalError> {
        let durable_next = self.durable_next();
        if seq > durable_next {
            return Err(WalError::CheckpointBeyondEnd { requested: seq, durable_next });
        }
        let mut ck = lock(&self.shared.checkpoint);
        if seq <= ck.stored {
            return Ok(());
        }
        let path = CheckpointFile::path(&self.shared.dir);
        ck.file.store(seq).map_err(|e| WalError::io("store checkpoint", path, e))?;
        ck.stored = seq;
        self.shared.tail.release_below(seq);
        if ck.dirty_since.is_none() {
            ck.dirty_since = Some(Instant::now());
            self.shared.checkpoint_cv.notify_one();
        }
        Ok(())
    }

    /// The latest stored checkpoint: where dispatch resumes. After open this
    /// is the recovered value (raised to the oldest segment if it was below).
    pub fn checkpoint(&self) -> u64 {
        lock(&self.shared.checkpoint).stored
    }

    /// The latest checkpoint known durable.
    pub fn synced_checkpoint(&self) -> u64 {
        lock(&self.shared.checkpoint).synced
    }

    /// Records a restart would replay: durable frontier minus the stored
    /// checkpoint (`narad_ingress_dispatch_backlog_records`).
    pub fn dispatch_backlog(&self) -> u64 {
        self.durable_next().saturating_sub(self.checkpoint())
    }

    /// The oldest sequence number still in the WAL.
    pub fn oldest_seq(&self) -> u64 {
        let segs = self.shared.segments.read().unwrap_or_else(|p| p.into_inner());
        segs.keys().next().copied().unwrap_or(0)
    }

    /// Number of segment files and their total durable size in bytes.
    pub fn disk_usage(&self) -> (usize, u64) {
        let segs = self.shared.segments.read().unwrap_or_else(|p| p.into_inner());
        (segs.len(), segs.values().map(|s| s.durable_len()).sum())
    }

    /// Counters since open.
    pub fn stats(&self) -> WalStats {
        let c = &self.shared.counters;
        WalStats {
            syncs: c.syncs.load(Ordering::Relaxed),
            records: c.records.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            segments_compacted: c.segments_compacted.load(Ordering::Relaxed),
            io_nanos: c.io_nanos.load(Ordering::Relaxed),
            prepared_rolls: c.prepared_rolls.load(Ordering::Relaxed),
            prep_failures: c.prep_failures.load(Ordering::Relaxed),
            runway_failures: c.runway_failures.load(Ordering::Relaxed),
            segment_create_failures: c.segment_create_failures.load(Ordering::Relaxed),
            read_memory_bytes: c.read_memory_bytes.load(Ordering::Relaxed),
            read_disk_bytes: c.read_disk_bytes.load(Ordering::Relaxed),
        }
    }

    /// Whether a prepared next segment is ready to be renamed in at the
    /// next roll (always false without [`WalOptions::prealloc`]).
    pub fn spare_ready(&self) -> bool {
        lock(&self.shared.spare).ready.is_some()
    }

    /// Runs one compaction pass now (it also runs in the background).
    pub fn compact_now(&self) {
        compact(&self.shared);
    }

    /// Makes the stored checkpoint durable now (it is also done in the
    /// background within the sync delay), then compacts behind it. Fails if
    /// a checkpoint sync ever failed (compaction is then stopped until the
    /// WAL is reopened).
    pub fn sync_checkpoint_now(&self) -> Result<(), WalError> {
        flush_checkpoint(&self.shared);
        if let Some(e) = lock(&self.shared.checkpoint).failed.clone() {
            return Err(e);
        }
        compact(&self.shared);
        Ok(())
    }

    /// Flushes everything staged, makes the checkpoint durable, and stops
    /// the background threads. Appends after close fail with
    /// [`WalError::Closed`]. Returns the error of the final checkpoint sync,
    /// if it failed. Idempotent.
    pub fn close(&self) -> Result<(), WalError> {
        {
            let mut st = lock(&self.shared.stage);
            st.closing = true;
            self.shared.sync_wake.notify_all();
        }
        {
            let mut ck = lock(&self.shared.checkpoint);
            ck.closing = true;
            self.shared.checkpoint_cv.notify_all();
        }
        {
            let mut spare = lock(&self.shared.spare);
            spare.closing = true;
            self.shared.spare_cv.notify_all();
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
        let ck = lock(&self.shared.checkpoint);
        match &ck.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

// ---------------------------------------------------------------- recovery

struct Recovered {
    segments: BTreeMap<u64, Arc<Segment>>,
    next_seq: u64,
    /// The last segment is version 1 (unsalted) and holds frames.
    last_unsalted: bool,
    /// See [`Wal::newest_incarnation_at_open`].
    newest: Option<NewestIncarnation>,
}

/// A fresh salt for a segment recovery (re)writes the header of.
fn salt_for(path: &Path) -> Result<u64, WalError> {
    new_salt().map_err(|e| WalError::io("draw a segment salt", path, e))
}

fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> WalError {
    WalError::Corrupt { path: path.to_path_buf(), offset, reason: reason.into() }
}

fn recover(fs: &dyn narad_fs::Fs, dir: &Path, options: &WalOptions) -> Result<Recovered, WalError> {
    let entries = fs.list_dir(dir).map_err(|e| WalError::io("list directory", dir, e))?;
    let mut bases: Vec<u64> = entries
        .iter()
        .filter(|e| !e.is_dir)
        .filter_map(|e| parse_segment_file_name(&e.name))
        .collect();
    bases.sort_unstable();
    let prep = prep::prep_path(dir);
    if entries.iter().any(|e| !e.is_dir && e.name == prep::PREP_FILE_NAME) {
        // Possibly half written; a fresh one is prepared when needed.
        fs.remove_file(&prep).map_err(|e| WalError::io("remove prepared segment", &prep, e))?;
    }
    let mut segments = BTreeMap::new();
    if bases.is_empty() {
        let start = match CheckpointFile::read(fs, dir) {
            Ok(Some(Stored::Value(v))) => v,
            _ => 0,
        };
        let seg = create_segment(fs, dir, start)?;
        segments.insert(start, Arc::new(seg));
        return Ok(Recovered { segments, next_seq: start, last_unsalted: false, newest: None });
    }
    let mut last_unsalted = false;
    let mut newest: Option<NewestIncarnation> = None;
    let mut next_seq = bases[0];
    for (i, &base) in bases.iter().enumerate() {
        let path = dir.join(segment_file_name(base));
        let last = i + 1 == bases.len();
        if base != next_seq {
            return Err(corrupt(
                &path,
                0,
                format!(
                    "segment starts at sequence {base} but the previous one ends at {next_seq}: a segment is missing"
                ),
            ));
        }
        let file = fs
            .open(&path, OpenMode::Existing)
            .map_err(|e| WalError::io("open segment", &path, e))?;
        let image = recovery::read_image(&*file, &path, options.segment_bytes)?;
        // The whole file is scanned: its end may be a client's payload, so
        // a trailer there counts only as `prepared_tail` says (our header's
        // flag, and nothing but zeros from the last good frame to it).
        let scan = recovery::scan(&image, base);
        let mut seed = scan.seed();
        let mut valid_len = scan.valid_len;
        let mut prepared = last && recovery::prepared_tail(&image, &scan);
        if prepared {
            // Zeros from the last good frame to the trailer: the normal state
            // of a prepared active segment. If even the segment header is
            // zeros, the roll renamed the file in but never synced a write:
            // nothing in it was acked.
            if let Some((0, recovery::Damage::SegmentHeader)) = scan.damage {
                let salt = salt_for(&path)?;
                file.write_all_at(&segment_header_with_flags(base, SEGMENT_FLAG_PREPARED, salt), 0)
                    .map_err(|e| WalError::io("rewrite segment header", &path, e))?;
                file.sync_data().map_err(|e| WalError::io("sync segment header", &path, e))?;
                valid_len = SEGMENT_HEADER_BYTES;
                seed = FrameSeed::of_salt(salt);
            }
        } else if let Some((offset, damage)) = scan.damage {
            let expected = scan.next_seq;
            let behind = if last {
                recovery::look_behind(&image, offset, expected, seed)
            } else {
                Behind::Nothing // irrelevant: sealed damage always fails
            };
            match recovery::decide(damage, last, behind) {
                Decision::FailOpen => {
                    return Err(corrupt(
                        &path,
                        offset,
                        format!(
                            "{damage:?} at sequence {expected} ({}); refusing to open: acked records may be damaged",
                            if last {
                                "valid frames of a later write follow"
                            } else {
                                "sealed segment"
                            }
                        ),
                    ));
                }
                Decision::TruncateTail => {
                    let zeros = damage != recovery::Damage::SegmentHeader
                        && image[offset as usize..].iter().all(|&b| b == 0);
                    if zeros {
                        // The zero runway a running WAL keeps after its frames
                        // (or a write of which nothing reached the disk).
                        info!(
                            segment = %path.display(),
                            offset,
                            dropped_bytes = scan.file_len - offset,
                            "cutting the zeros after the last frame of the ingress WAL"
                        );
                    } else {
                        warn!(
                            segment = %path.display(),
                            offset,
                            damage = ?damage,
                            dropped_bytes = scan.file_len - offset,
                            "truncating torn tail of the last ingress WAL segment (never acked)"
                        );
                    }
                    // Cutting also drops a preparation trailer: the segment
                    // is an ordinary one from now on, so no stale frame of
                    // the torn write past the cut can ever be read as new.
                    prepared = false;
                    if damage == recovery::Damage::SegmentHeader {
                        let salt = salt_for(&path)?;
                        file.set_len(0).map_err(|e| WalError::io("truncate segment", &path, e))?;
                        file.write_all_at(&segment_header(base, salt), 0)
                            .map_err(|e| WalError::io("rewrite segment header", &path, e))?;
                        valid_len = SEGMENT_HEADER_BYTES;
                        seed = FrameSeed::of_salt(salt);
                    } else {
                        file.set_len(offset)
                            .map_err(|e| WalError::io("truncate segment", &path, e))?;
                    }
                    file.sync_data()
                        .map_err(|e| WalError::io("sync truncated segment", &path, e))?;
                }
            }
        }
        let unsalted = scan.header.is_some_and(|h| h.version != SEGMENT_VERSION)
            && seed == FrameSeed::UNSALTED;
        if last && unsalted && scan.next_seq == base {
            // An older binary's last segment with no frame in it: its header
            // is rewritten as version 2 (same flags), so new frames are
            // salted without a segment of the same name being created.
            let salt = salt_for(&path)?;
            let flags = scan.header.map_or(0, |h| h.flags);
            file.write_all_at(&segment_header_with_flags(base, flags, salt), 0)
                .map_err(|e| WalError::io("rewrite segment header", &path, e))?;
            file.sync_data().map_err(|e| WalError::io("sync segment header", &path, e))?;
            seed = FrameSeed::of_salt(salt);
        } else if last && unsalted {
            last_unsalted = true;
        }
        if let Some((incarnation, seq)) = scan.newest_incarnation
            && newest.as_ref().is_none_or(|n| incarnation > n.incarnation)
        {
            newest = Some(NewestIncarnation { incarnation, seq, segment: path.clone() });
        }
        let seg = Segment::new(base, path, file, valid_len, seed);
        seg.set_prepared(prepared);
        for &(seq, off) in &scan.index {
            seg.note_index(seq, off);
        }
        seg.publish(scan.next_seq, valid_len, scan.next_seq, valid_len);
        next_seq = scan.next_seq;
        segments.insert(base, Arc::new(seg));
    }
    Ok(Recovered { segments, next_seq, last_unsalted, newest })
}

fn create_segment(fs: &dyn narad_fs::Fs, dir: &Path, base: u64) -> Result<Segment, WalError> {
    let path = dir.join(segment_file_name(base));
    let file = fs
        .open(&path, OpenMode::CreateNew)
        .map_err(|e| WalError::io("create segment", &path, e))?;
    let salt = salt_for(&path)?;
    file.write_all_at(&segment_header(base, salt), 0)
        .map_err(|e| WalError::io("write segment header", &path, e))?;
    file.sync_data().map_err(|e| WalError::io("sync segment header", &path, e))?;
    Ok(Segment::new(base, path, file, SEGMENT_HEADER_BYTES, FrameSeed::of_salt(salt)))
}

fn recover_checkpoint(
    fs: &dyn narad_fs::Fs,
    dir: &Path,
    oldest: u64,
    next_seq: u64,
) -> Result<(CheckpointFile, u64), WalError> {
    let path = CheckpointFile::path(dir);
    let stored =
        CheckpointFile::read(fs, dir).map_err(|e| WalError::io("read checkpoint", &path, e))?;
    let value = match stored {
        None => oldest,
        Some(Stored::Value(v)) if v > next_seq => {
            // Only dispatched records are ever behind a stored checkpoint,
            // and it never passed the durable frontier: records next_seq..v
            // were dispatched and are gone from the WAL since (damage, or a
            // recovery that cut them). Keeping v would mark the sequence
            // numbers handed out again as dispatched and skip new records;
            // refusing would keep the node down for records it already
            // delivered. So dispatch resumes at the WAL's end.
            warn!(
                path = %path.display(),
                checkpoint = v,
                next_seq,
                lost_dispatched_records = v - next_seq,
                "ingress dispatch checkpoint is beyond the end of the WAL: records that were already dispatched are missing from it; dispatch resumes at the WAL's end"
            );
            next_seq
        }
        Some(Stored::Value(v)) if v < oldest => {
            warn!(
                checkpoint = v,
                oldest_segment = oldest,
                "ingress dispatch checkpoint was below the oldest WAL segment; dispatch starts at that segment"
            );
            oldest
        }
        Some(Stored::Value(v)) => v,
        Some(damaged) => {
            error!(
                path = %path.display(),
                state = ?damaged,
                oldest_segment = oldest,
                "ingress dispatch checkpoint is unreadable; dispatch starts at the oldest WAL segment (records may be dispatched twice)"
            );
            oldest
        }
    };
    // The recovered value is made durable before anything compacts behind it.
    let file = CheckpointFile::create(fs, dir, value)
        .map_err(|e| WalError::io("write checkpoint", &path, e))?;
    Ok((file, value))
}

// ------------------------------------------------------------- sync thread

/// When the sync thread waits for the callers of its previous group before
/// the next sync.
///
/// The callers of a large group are on their way back when it completes.
/// Waiting a fraction of a sync for them lets them share the next sync
/// instead of queueing behind it (the sync is the cost; the wait is at most
/// half of one, and at most [`GATHER_MAX_WAIT`]). Only the records staged
/// since that group completed count as its callers: counting those staged
/// during its sync would let closed-loop appenders settle into two
/// alternating half-size groups, each syncing while the other is away
/// (64 appenders synced 32-36 records at a time that way, against 53-54
/// with this rule).
///
/// The waiting sync thread is woken by the record that makes the gather
/// enough, not by every caller on its way back
/// ([`Stage::sync_wake_at_seq`]): each of those wake-ups cost its caller a
/// `futex` call and the sync thread a trip through the scheduler, on the
/// CPUs the remaining callers needed to come back (with it, `narad bench
/// disk` groups went from 54 to 60 records of 64).
#[derive(Debug, Default)]
struct Gather {
    /// Records of the previous group commit.
    last_group: u64,
    /// Its write + fdatasync time.
    last_io: Duration,
    /// The next sequence number when it completed.
    completed_at_seq: u64,
}

impl Gather {
    /// How long, from now, to wait for returning callers; `None` after a
    /// small group (a lone appender never waits).
    fn wait(&self) -> Option<Duration> {
        (self.last_group >= GATHER_MIN_GROUP).then(|| (self.last_io / 2).min(GATHER_MAX_WAIT))
    }

    /// Whether enough of the previous group's callers are back, with
    /// `next_seq` the next sequence number to stage.
    fn enough(&self, next_seq: u64) -> bool {
        next_seq >= self.enough_at_seq()
    }

    /// The first `next_seq` that is [`enough`](Self::enough).
    fn enough_at_seq(&self) -> u64 {
        self.completed_at_seq + (self.last_group * 3).div_ceil(4)
    }
}

fn sync_loop(shared: &Shared) {
    let mut gather = Gather::default();
    let mut create_warned: Option<Instant> = None;
    loop {
        let (mut chunks, group) = {
            let mut st = lock(&shared.stage);
            loop {
                if !st.chunks.is_empty() {
                    break;
                }
                if st.closing {
                    return;
                }
                st.sync_waiting = true;
                st = shared
                    .sync_wake
                    .wait_timeout(st, SYNC_BACKSTOP)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                st.sync_waiting = false;
            }
            if let Some(wait) = gather.wait() {
                let deadline = Instant::now() + wait;
                loop {
                    let now = Instant::now();
                    if gather.enough(st.next_seq) || st.closing || now >= deadline {
                        break;
                    }
                    st.sync_waiting = true;
                    st.sync_wake_at_seq = gather.enough_at_seq();
                    st = shared
                        .sync_wake
                        .wait_timeout(st, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    st.sync_waiting = false;
                    st.sync_wake_at_seq = 0;
                }
            }
            st.take()
        };
        gather.last_group = chunks.iter().map(|c| c.end_seq - c.first_seq).sum();
        let started = Instant::now();
        let outcome = match shared.latch.get() {
            Some(e) => Err(e.clone()),
            None => flush(shared, &mut chunks),
        };
        gather.last_io = started.elapsed();
        shared.counters.io_nanos.fetch_add(gather.last_io.as_nanos() as u64, Ordering::Relaxed);
        if let Err(e) = &outcome {
            if e.is_retriable() {
                shared.counters.segment_create_failures.fetch_add(1, Ordering::Relaxed);
                if create_warned.is_none_or(|at| at.elapsed() >= CREATE_WARN_INTERVAL) {
                    create_warned = Some(Instant::now());
                    warn!(
                        error = %e,
                        failures = shared.counters.segment_create_failures.load(Ordering::Relaxed),
                        "ingress WAL could not create its next segment: appends fail until it can (not latched)"
                    );
                }
                withdraw_staged(shared, e);
            } else if shared.latch.set(e.clone()).is_ok() {
                error!(error = %e, "ingress WAL latched: every append fails until restart");
            }
        }
        group.complete(outcome);
        // A flushed chunk's buffer went to the tail: the next group stages
        // into a fresh one about as large as this group's (allocated before
        // the append lock is taken).
        let handed_over = chunks.iter().any(|c| !c.create && c.bytes.capacity() == 0);
        let fresh = handed_over.then(|| {
            let written = chunks.iter().map(|c| c.written).max().unwrap_or(0);
            Vec::with_capacity(staging_hint(written))
        });
        let mut st = lock(&shared.stage);
        gather.completed_at_seq = st.next_seq;
        for chunk in chunks {
            if !chunk.create {
                st.recycle(chunk.bytes);
            }
        }
        if let Some(buf) = fresh {
            st.recycle(buf);
        }
    }
}

/// The capacity of a fresh staging buffer after a group of `written` bytes:
/// a quarter more, so that a slightly larger next group does not grow it.
fn staging_hint(written: usize) -> usize {
    (written + written / 4).clamp(4 << 10, STAGING_KEEP_BYTES)
}

/// At most one warning per this long about segments that could not be
/// created (every produce retries the roll while descriptors are short).
const CREATE_WARN_INTERVAL: Duration = Duration::from_secs(10);

/// After a roll failed with [`WalError::SegmentUnavailable`]: fails what
/// was staged since the sync thread took the failed group (it was staged
/// into the segment that does not exist) and puts the staging state back
/// at the durable frontier, at the end of the last segment that exists, so
/// the next append stages into it (and rolls again if it must). The chunks
/// before the failed one were published; the failed one and everything
/// after it were never written, so their sequence numbers are handed out
/// again and stay dense.
fn withdraw_staged(shared: &Shared, e: &WalError) {
    let (chunks, group) = {
        let mut st = lock(&shared.stage);
        let taken = st.take();
        let active = {
            let segs = shared.segments.read().unwrap_or_else(|p| p.into_inner());
            segs.values().next_back().map(|s| (s.base, s.durable_len(), s.seed))
        };
        let (base, end, seed) = active.expect("the WAL always has an active segment");
        st.next_seq = shared.durable_next.load(Ordering::Acquire);
        st.active_base = base;
        st.active_end = end;
        st.active_seed = seed;
        st.roll_first = seed == FrameSeed::UNSALTED;
        taken
    };
    group.complete(Err(e.clone()));
    let mut st = lock(&shared.stage);
    for chunk in chunks {
        if !chunk.create {
            st.recycle(chunk.bytes);
        }
    }
}

/// Writes and syncs staged chunks in order; publishes each as it lands.
fn flush(shared: &Shared, chunks: &mut [Chunk]) -> Result<(), WalError> {
    for chunk in chunks {
        let segment = if chunk.create {
            seal_predecessor(shared, chunk.segment)?;
            let path = shared.dir.join(segment_file_name(chunk.segment));
            let spare = {
                let mut spare = lock(&shared.spare);
                spare.asked = false;
                spare.ready.take()
            };
            let (file, prepared) = match spare {
                Some(file) => {
                    // Durable when it returns (both directories synced).
                    shared
                        .fs
                        .rename(&prep::prep_path(&shared.dir), &path)
                        .map_err(|e| latched("rename prepared segment", &path, e))?;
                    shared.counters.prepared_rolls.fetch_add(1, Ordering::Relaxed);
                    (file, true)
                }
                None => (create_next_segment(shared, &path)?, false),
            };
            let seg = Arc::new(Segment::new(
                chunk.segment,
                path,
                file,
                0,
                FrameSeed::of_salt(chunk.salt),
            ));
            seg.set_prepared(prepared);
            shared
                .segments
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(chunk.segment, seg.clone());
            seg
        } else {
            let segs = shared.segments.read().unwrap_or_else(|p| p.into_inner());
            segs.get(&chunk.segment).cloned().expect("staged chunk targets a known segment")
        };
        let (at, bytes) = if chunk.create && segment.is_prepared() {
            // The staged header has no flags: a prepared segment's says so,
            // which is what lets recovery honour its trailer (see
            // `recovery::prepared_tail`). Both writes precede the sync.
            let header =
                segment_header_with_flags(chunk.segment, SEGMENT_FLAG_PREPARED, chunk.salt);
            segment
                .file
                .write_all_at(&header, 0)
                .map_err(|e| latched("write", &segment.path, e))?;
            (SEGMENT_HEADER_BYTES, &chunk.bytes[SEGMENT_HEADER_BYTES as usize..])
        } else {
            (chunk.offset, &chunk.bytes[..])
        };
        segment.file.write_all_at(bytes, at).map_err(|e| latched("write", &segment.path, e))?;
        let end = chunk.offset + chunk.bytes.len() as u64;
        if !segment.is_prepared() {
            extend_runway(shared, &segment, end, chunk.bytes.len() as u64);
        }
        segment.file.sync_data().map_err(|e| latched("fdatasync", &segment.path, e))?;
        // Before the frontier moves: a reader it wakes finds these here.
        // The tail takes the buffer itself (no copy); the sync loop gives
        // the stage a fresh one.
        let written = chunk.bytes.len();
        chunk.written = written;
        let held = chunk.bytes.capacity();
        let bytes = Bytes::from(std::mem::take(&mut chunk.bytes));
        shared.tail.push(chunk.segment, chunk.offset, bytes, held, chunk.end_seq);
        let frames_at = if chunk.create { SEGMENT_HEADER_BYTES } else { chunk.offset };
        segment.publish(chunk.first_seq, frames_at, chunk.end_seq, end);
        want_spare(shared, end);
        let records = chunk.end_seq - chunk.first_seq;
        if records > 0 {
            let c = &shared.counters;
            c.syncs.fetch_add(1, Ordering::Relaxed);
            c.records.fetch_add(records, Ordering::Relaxed);
            c.bytes.fetch_add(written as u64, Ordering::Relaxed);
            shared.durable_next.store(chunk.end_seq, Ordering::Release);
            {
                let _g = lock(&shared.durable_mutex);
                shared.durable_cv.notify_all();
            }
            let listeners = shared.listeners.read().unwrap_or_else(|p| p.into_inner());
            for l in listeners.iter() {
                l(chunk.end_seq);
            }
        }
    }
    Ok(())
}

/// After a group's write ended the active segment's frames at `end`, before
/// its fdatasync: keeps zeros written after the frames, so that later small
/// groups overwrite blocks the file already has and their fdatasync does
/// not change the file's size (on ext4 that saves writing the inode, or a
/// journal commit, on the path every produce waits on).
///
/// The runway is topped up to `min(runway_bytes, room left in the segment)`
/// once less than half of that is left after `end`, and only by a group of
/// at most an eighth of `runway_bytes`: every runway byte is written twice,
/// as a zero and then as a frame, which pays for itself while a group's
/// fdatasync is dominated by the size change, not by its own bytes. The
/// zeros are written in the same group, before its fdatasync, so they are
/// durable with its frames. A failed zero write is counted and logged, not
/// latched: nothing acked depends on it.
///
/// Why recovery stays sound: the zeros past the last frame of the last
/// segment are a tail with no frame behind it, which opening cuts (see
/// [`crate::recovery`]); a torn overwrite leaves damage followed at most by
/// frames of the same write, which every frame header names; and a segment
/// is cut to its frames before its successor exists
/// ([`seal_predecessor`]), so a sealed segment never ends in zeros.
fn extend_runway(shared: &Shared, seg: &Segment, end: u64, group_bytes: u64) {
    let runway = shared.options.runway_bytes;
    let mut allocated = seg.allocated().max(end);
    if runway > 0 && group_bytes <= runway_group_max(runway) {
        let want = runway.min(shared.options.segment_bytes.saturating_sub(end));
        if allocated < end + want / 2 {
            let to = end + want;
            match narad_fs::write_zeros(&*seg.file, allocated, to) {
                Ok(()) => allocated = to,
                Err(e) => {
                    // Only the zeros failed (a full disk, say): the group's
                    // frames were written and its fdatasync decides its
                    // fate. The write may have grown the file, so the
                    // segment counts as allocated to its end: the seal cuts
                    // it, and it is not topped up again.
                    shared.counters.runway_failures.fetch_add(1, Ordering::Relaxed);
                    warn!(
                        segment = %seg.path.display(), error = %e,
                        "could not write the zero runway after the ingress WAL's frames; this segment's group commits append instead"
                    );
                    allocated = shared.options.segment_bytes.max(to);
                }
            }
        }
    }
    seg.set_allocated(allocated);
}

/// The largest group that tops up a zero runway of `runway_bytes` (and so
/// is written over zeros when it follows one).
pub fn runway_group_max(runway_bytes: u64) -> u64 {
    runway_bytes / 8
}

/// Before segment `next` is created: if its predecessor is longer than its
/// frames (a prepared segment, or a zero runway), cut it to its frames and
/// sync that, so a sealed segment never carries zeros or a trailer.
fn seal_predecessor(shared: &Shared, next: u64) -> Result<(), WalError> {
    let prev = {
        let segs = shared.segments.read().unwrap_or_else(|p| p.into_inner());
        segs.range(..next).next_back().map(|(_, s)| s.clone())
    };
    if let Some(prev) = prev.filter(|s| s.is_prepared() || s.allocated() > s.durable_len()) {
        prev.file
            .set_len(prev.durable_len())
            .map_err(|e| latched("cut segment to its frames", &prev.path, e))?;
        prev.file.sync_data().map_err(|e| latched("fdatasync", &prev.path, e))?;
        prev.set_prepared(false);
        prev.set_allocated(prev.durable_len());
    }
    Ok(())
}

/// After a flush that left the active segment at `active_len` bytes: once it
/// is half full, ask the prep thread (once per segment) for the next one.
fn want_spare(shared: &Shared, active_len: u64) {
    if !shared.options.prealloc || active_len < shared.options.segment_bytes / 2 {
        return;
    }
    let mut spare = lock(&shared.spare);
    if !spare.asked && spare.ready.is_none() {
        spare.asked = true;
        spare.wanted = true;
        shared.spare_cv.notify_one();
    }
}

/// The prep thread: writes a prepared segment whenever the sync thread asks.
fn prep_loop(shared: &Shared) {
    loop {
        {
            let mut spare = lock(&shared.spare);
            while !spare.wanted && !spare.closing {
                spare = shared.spare_cv.wait(spare).unwrap_or_else(|p| p.into_inner());
            }
            if spare.closing {
                return;
            }
        }
        let outcome = prep::prepare(&*shared.fs, &shared.dir, shared.options.segment_bytes);
        let mut spare = lock(&shared.spare);
        spare.wanted = false;
        match outcome {
            Ok(file) => spare.ready = Some(file),
            Err(e) => {
                shared.counters.prep_failures.fetch_add(1, Ordering::Relaxed);
                warn!(
                    dir = %shared.dir.display(), error = %e,
                    "preparing the next ingress WAL segment failed; the roll creates an empty one"
                );
                // A half-written file would hold up to a segment of a disk
                // that may be full: give the space back to the WAL.
                let _ = shared.fs.remove_file(&prep::prep_path(&shared.dir));
            }
        }
    }
}

/// Creates the file of a new segment. Nothing has been written to it when
/// this fails, so the failure does not latch ([`WalError::SegmentUnavailable`])
/// — unless a file of that name exists already, which nothing but this
/// roll should have made: that latches. The open may have created the file
/// before it failed (its directory sync needs a descriptor too); the empty
/// file is removed so that the retry can create it again.
fn create_next_segment(shared: &Shared, path: &Path) -> Result<narad_fs::FileRef, WalError> {
    match shared.fs.open(path, OpenMode::CreateNew) {
        Ok(file) => Ok(file),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Err(latched("create segment", path, e))
        }
        Err(e) => {
            let _ = shared.fs.remove_file(path);
            Err(WalError::SegmentUnavailable { path: path.to_path_buf(), source: Arc::new(e) })
        }
    }
}

fn latched(op: &'static str, path: &Path, e: std::io::Error) -> WalError {
    WalError::Latched { op, path: path.to_path_buf(), source: Arc::new(e) }
}

// ------------------------------------------------------- checkpoint thread

fn checkpoint_loop(shared: &Shared) {
    let mut last_compaction = Instant::now();
    loop {
        let closing = {
            let mut ck = lock(&shared.checkpoint);
            // Wait for a store to age by the sync delay, close, or the
            // compaction interval.
            loop {
                let now = Instant::now();
                let due = match ck.dirty_since {
                    Some(t) if ck.failed.is_none() => {
                        (t + shared.options.checkpoint_sync_delay).saturating_duration_since(now)
                    }
                    _ => shared.options.compaction_interval.saturating_sub(now - last_compaction),
                };
                if ck.closing || due.is_zero() {
                    break;
                }
                ck =
                    shared.checkpoint_cv.wait_timeout(ck, due).unwrap_or_else(|p| p.into_inner()).0;
            }
            ck.closing
        };
        flush_checkpoint(shared);
        compact(shared);
        last_compaction = Instant::now();
        if closing {
            return;
        }
    }
}

/// Makes the stored checkpoint durable if a store is pending: one
/// fdatasync for every store since the last flush. A failure stops
/// compaction until restart (never retried).
fn flush_checkpoint(shared: &Shared) {
    let _one_at_a_time = lock(&shared.checkpoint_sync);
    let (value, file) = {
        let mut ck = lock(&shared.checkpoint);
        if ck.dirty_since.is_none() || ck.failed.is_some() {
            return;
        }
        ck.dirty_since = None;
        (ck.stored, ck.file.clone_handle())
    };
    // Synced outside the state lock, so stores are not held up by the disk.
    let result = file.sync_data();
    let mut ck = lock(&shared.checkpoint);
    match result {
        Ok(()) => ck.synced = ck.synced.max(value),
        Err(e) => {
            let err = WalError::io("fdatasync checkpoint", CheckpointFile::path(&shared.dir), e);
            error!(error = %err, "ingress WAL checkpoint sync failed; compaction stops until restart");
            ck.failed = Some(err);
        }
    }
}

/// Deletes segments wholly below the synced checkpoint, and rotates a fully
/// dispatched active segment over 1 MiB so the next pass can delete it.
fn compact(shared: &Shared) {
    let synced = {
        let ck = lock(&shared.checkpoint);
        if ck.failed.is_some() {
            return;
        }
        ck.synced
    };
    let doomed: Vec<Arc<Segment>> = {
        let segs = shared.segments.read().unwrap_or_else(|p| p.into_inner());
        let bases: Vec<u64> = segs.keys().copied().collect();
        bases.windows(2).take_while(|w| w[1] <= synced).map(|w| segs[&w[0]].clone()).collect()
    };
    for seg in doomed {
        match shared.fs.remove_file(&seg.path) {
            Ok(()) => {}
            // An earlier pass unlinked it and then failed to sync the
            // directory: sync it now, so the unlink is durable before any
            // later segment goes (a crash must never bring back an older
            // segment beside a gap).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Err(e) = shared.fs.sync_dir(&shared.dir) {
                    warn!(dir = %shared.dir.display(), error = %e, "could not sync the ingress WAL directory after compaction; will retry");
                    return;
                }
            }
            Err(e) => {
                warn!(segment = %seg.path.display(), error = %e, "could not delete a compacted ingress WAL segment; will retry");
                return;
            }
        }
        shared.segments.write().unwrap_or_else(|p| p.into_inner()).remove(&seg.base);
        shared.counters.segments_compacted.fetch_add(1, Ordering::Relaxed);
    }
    if shared.latch.get().is_some() {
        return;
    }
    let rotation = {
        let mut st = lock(&shared.stage);
        if !st.closing
            && st.chunks.is_empty()
            && synced >= st.next_seq
            && st.active_end > shared.options.rotate_dispatched_active_bytes
        {
            if let Err(e) = st.roll() {
                warn!(error = %e, "could not rotate the dispatched active ingress WAL segment");
                return;
            }
            st.sync_waiting = false;
            shared.sync_wake.notify_one();
            Some(Pending::new(st.group.clone(), ()))
        } else {
            None
        }
    };
    // Wait for the new segment to exist, so a compaction pass is complete
    // when it returns (and its disk operations happen in a fixed order).
    if let Some(p) = rotation
        && let Err(e) = p.wait()
        && !e.is_retriable()
    {
        // A segment that could not be created is warned about (at most
        // every 10 s) by the sync thread; the next pass tries again.
        warn!(error = %e, "rotating the dispatched active ingress WAL segment failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_counts_only_records_staged_after_the_previous_group_completed() {
        // A group of 36 records completed at sequence 1,000, while 28 other
        // appenders had already staged records 972..1,000 during its sync.
        let g =
            Gather { last_group: 36, last_io: Duration::from_micros(500), completed_at_seq: 1_000 };
        assert_eq!(g.wait(), Some(Duration::from_micros(250)));
        // Those 28 are the other half, not the group's callers coming back.
        assert!(!g.enough(1_000));
        assert!(!g.enough(1_026));
        // Three quarters of the 36 callers are back.
        assert!(g.enough(1_027));
        // A withdrawn batch can give sequence numbers back below the mark.
        assert!(!g.enough(990));
        // The sequence number the parked sync thread asks to be woken at is
        // exactly the first that is enough, for any group size.
        for last_group in GATHER_MIN_GROUP..200 {
            let g = Gather { last_group, completed_at_seq: 5_000, ..g };
            let at = g.enough_at_seq();
            assert!(g.enough(at) && !g.enough(at - 1), "group {last_group}");
        }
    }

    #[test]
    fn gather_waits_at_most_half_a_sync_and_never_after_a_small_group() {
        let small = Gather { last_group: GATHER_MIN_GROUP - 1, ..Gather::default() };
        assert_eq!(small.wait(), None);
        let slow = Gather {
            last_group: GATHER_MIN_GROUP,
            last_io: Duration::from_millis(30),
            completed_at_seq: 0,
        };
        assert_eq!(slow.wait(), Some(GATHER_MAX_WAIT));
    }
}
