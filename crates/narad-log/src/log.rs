//! The partition log: its state, open, close, stats and notifications. The
//! commit cycle is in `commit.rs`, reads in `read.rs`, retention in
//! `retention.rs`.
//!
//! # State and locks
//!
//! * The *combiner* (a mutex and a condvar) queues commit batches and elects
//!   the leader of the next cycle.
//! * The *writer* mutex is the partition's produce lock: the leader holds it
//!   for a whole cycle (append, sync, read-back, publish); `close` takes it.
//! * The *view* (a read-write lock) is what readers see: the segments with
//!   their sparse indexes and verified lengths, the high watermark and the
//!   oldest offset. The writer changes it only when a cycle succeeded,
//!   retention only after a segment file is gone. Readers hold it only to
//!   look a position up, never during I/O.
//! * Lock order: combiner, then writer, then view, then cache / open-sealed
//!   list; a segment's handle lock is never held while another is taken.
//!
//! # Invariants
//!
//! * Between cycles, the bytes of every segment are exactly the verified
//!   frames the view describes; `next_offset == high watermark`.
//! * The high watermark only grows; a reader never reads past the one it
//!   started with, so it never sees an unverified byte.
//! * Only the last segment is written; the others are sealed.

use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{
    Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::{Duration, Instant};

use narad_clock::ClockRef;
use narad_fs::{FileRef, FsRef, OpenMode};

use crate::cache::FrameCache;
use crate::commit::Combiner;
use crate::config::LogConfig;
use crate::error::{LogError, ReadError};
use crate::frame::{self, FrameSeed};
use crate::limits::MAX_OPEN_SEALED_FILES;
use crate::metrics::{Counters, LogMetrics};
use crate::recovery::{self, RecoveryReport};
use crate::segment::{self, IndexEntry, SegmentFormat};
use crate::{CycleTimings, LogStats};

/// Called with the new high watermark after every commit cycle that
/// advanced it, on the thread that led the cycle, outside the log's locks.
/// Keep it short (e.g. notify an async waiter).
pub type CommitListener = Box<dyn Fn(u64) + Send + Sync>;

type SharedListener = Arc<dyn Fn(u64) + Send + Sync>;

/// Called once per successful commit cycle, by the thread that ran it,
/// after the writer lock is released (see [`PartitionLog::set_cycle_observer`]).
pub type CycleObserver = Box<dyn Fn(&CycleTimings) + Send + Sync>;

type SharedObserver = Arc<dyn Fn(&CycleTimings) + Send + Sync>;

/// A segment file, shared by the view, the writer and readers.
#[derive(Debug)]
pub(crate) struct SegFile {
    pub base: u64,
    pub path: PathBuf,
    /// Where its frames start and how their CRCs are seeded.
    pub format: SegmentFormat,
    /// An open handle: always for the active segment, on demand (and for a
    /// few at a time) for sealed ones.
    pub handle: Mutex<Option<FileRef>>,
}

impl SegFile {
    pub fn new(
        base: u64,
        path: PathBuf,
        format: SegmentFormat,
        handle: Option<FileRef>,
    ) -> Arc<Self> {
        Arc::new(SegFile { base, path, format, handle: Mutex::new(handle) })
    }

    /// The seed of its frame CRCs.
    pub fn seed(&self) -> FrameSeed {
        self.format.seed()
    }

    /// The byte position of its first frame.
    pub fn frames_start(&self) -> u64 {
        self.format.frames_start()
    }
}

/// One segment as readers see it.
#[derive(Debug)]
pub(crate) struct SegState {
    pub file: Arc<SegFile>,
    /// Bytes of verified frames.
    pub end_pos: u64,
    /// The offset after the last verified record.
    pub end_offset: u64,
    /// The sparse index.
    pub index: Vec<IndexEntry>,
    /// Position of the last frame, if any.
    pub last_frame_pos: Option<u64>,
    /// Commit time of the first record, once known.
    pub first_time_ms: Option<u64>,
    /// Commit time of the last record, once known.
    pub newest_time_ms: Option<u64>,
}

impl SegState {
    pub fn base(&self) -> u64 {
        self.file.base
    }

    /// The frame to start a walk for `offset` from: (byte position, offset).
    pub fn index_start(&self, offset: u64) -> (u64, u64) {
        let base = self.base();
        let j = self.index.partition_point(|e| base + u64::from(e.rel_offset) <= offset);
        match j.checked_sub(1).map(|j| self.index[j]) {
            Some(e) => (u64::from(e.pos), base + u64::from(e.rel_offset)),
            None => (self.file.frames_start(), base),
        }
    }

    /// The first index entry after byte `pos`: (byte position, offset).
    pub fn index_after(&self, pos: u64) -> Option<(u64, u64)> {
        let j = self.index.partition_point(|e| u64::from(e.pos) <= pos);
        self.index.get(j).map(|e| (u64::from(e.pos), self.base() + u64::from(e.rel_offset)))
    }
}

/// What readers see.
#[derive(Debug)]
pub(crate) struct View {
    pub segments: Vec<SegState>,
    pub hwm: u64,
    pub oldest: u64,
}

impl View {
    /// The segment holding `offset`, if it is in the log.
    pub fn segment_of(&self, offset: u64) -> Option<&SegState> {
        let i = self.segments.partition_point(|s| s.base() <= offset);
        let s = self.segments.get(i.checked_sub(1)?)?;
        (offset < s.end_offset).then_some(s)
    }

    pub fn segment_by_base(&mut self, base: u64) -> Option<&mut SegState> {
        self.segments.iter_mut().find(|s| s.base() == base)
    }
}

/// The active segment, open for appending.
#[derive(Debug, Clone)]
pub(crate) struct Active {
    pub seg: Arc<SegFile>,
    pub file: FileRef,
    /// Bytes of verified frames (between cycles).
    pub len: u64,
    /// What the cycles have made the file's size: `len` plus the zero
    /// runway written after it. A hint for extending the runway only:
    /// decisions that need the true size (trimming before a seal or before
    /// a cycle of several frames) ask the file.
    pub alloc: u64,
}

/// The writer's state, under the produce lock.
#[derive(Debug)]
pub(crate) struct Writer {
    /// The log's salt: every frame is sealed with its seed, and every new
    /// segment's header carries it (see `segment`).
    pub salt: u64,
    /// `None` before the first segment exists, and after close.
    pub active: Option<Active>,
    pub next_offset: u64,
    /// The last commit time assigned: the next is never below it.
    pub time_floor_ms: u64,
    /// Set when a failed cycle could not be truncated back.
    pub poisoned: Option<Arc<LogError>>,
}

/// A durable, verified, append-only log of one partition. See the crate
/// documentation for the commit protocol. Share it with `Arc`.
pub struct PartitionLog {
    pub(crate) fs: FsRef,
    pub(crate) dir: PathBuf,
    pub(crate) config: LogConfig,
    pub(crate) clock: ClockRef,
    pub(crate) combiner: Combiner,
    pub(crate) writer: Mutex<Writer>,
    pub(crate) view: RwLock<View>,
    pub(crate) hwm: AtomicU64,
    pub(crate) closed: AtomicBool,
    pub(crate) cache: Mutex<FrameCache>,
    pub(crate) open_sealed: Mutex<VecDeque<Arc<SegFile>>>,
    listener: RwLock<Option<SharedListener>>,
    observer: RwLock<Option<SharedObserver>>,
    hwm_lock: Mutex<()>,
    hwm_changed: Condvar,
    pub(crate) retention_lock: Mutex<()>,
    pub(crate) counters: Counters,
    recovery: RecoveryReport,
}

impl fmt::Debug for PartitionLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartitionLog")
            .field("dir", &self.dir)
            .field("high_watermark", &self.high_watermark())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

/// Locks a mutex, ignoring poisoning: every structure behind these locks is
/// left consistent between statements (a panicking commit cycle is handled
/// separately, see `commit.rs`).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PartitionLog {
    /// Opens (or creates) the log in `dir`: creates the directory if it is
    /// missing, walks every segment, applies the recovery decision table
    /// (see [`recovery`]) and recovers the high watermark from the verified
    /// tail. Fails with [`LogError::Corrupt`] naming the file and byte
    /// offset where recovery may not repair the damage.
    ///
    /// An open log holds one file handle (the active segment; none before
    /// the first commit) and a few KiB of memory plus its sparse index.
    pub fn open(
        fs: FsRef,
        dir: PathBuf,
        config: LogConfig,
        clock: ClockRef,
    ) -> Result<PartitionLog, LogError> {
        config.validate()?;
        fs.create_dir_all(&dir).map_err(|e| LogError::io("create directory", &dir, e))?;
        let rec = recovery::recover(&fs, &dir, &config)?;
        let hwm = rec.report.high_watermark;
        let oldest = rec.segments.first().map_or(hwm, |s| s.base);
        let salt = match rec.segments.iter().rev().find_map(|s| match s.format {
            Some(SegmentFormat::Salted { salt }) => Some(salt),
            _ => None,
        }) {
            Some(salt) => salt,
            None => frame::new_salt().map_err(|e| LogError::io("draw a salt", &dir, e))?,
        };
        let mut active = None;
        let mut segments = Vec::with_capacity(rec.segments.len());
        for mut s in rec.segments {
            let frameless_legacy = s.format == Some(SegmentFormat::Legacy) && s.end_pos == 0;
            if let Some(file) = s.file.as_ref().filter(|_| s.format.is_none() || frameless_legacy) {
                // A last segment with no header (empty, or its torn header
                // truncated) or a format 1 one without frames: made a
                // format 2 segment in place, durably, before anything else.
                write_segment_header(&**file, &s.path, s.base, salt)?;
                s.format = Some(SegmentFormat::Salted { salt });
                s.end_pos = segment::SegmentFormat::Salted { salt }.frames_start();
            }
            let format = s.format.expect("every kept segment has a format");
            let seg = SegFile::new(s.base, s.path, format, s.file.clone());
            if let Some(file) = s.file {
                active = Some(Active { seg: seg.clone(), file, len: s.end_pos, alloc: s.end_pos });
            }
            segments.push(SegState {
                file: seg,
                end_pos: s.end_pos,
                end_offset: s.end_offset,
                index: s.index,
                last_frame_pos: s.last_frame_pos,
                first_time_ms: None,
                newest_time_ms: None,
            });
        }
        if let Some(last) = segments.last_mut() {
            last.newest_time_ms = rec.last_commit_time_ms.filter(|_| last.last_frame_pos.is_some());
        }
        Ok(PartitionLog {
            cache: Mutex::new(FrameCache::new(config.cache_bytes, config.cache_frames)),
            fs,
            dir,
            config,
            clock,
            combiner: Combiner::default(),
            writer: Mutex::new(Writer {
                salt,
                active,
                next_offset: hwm,
                time_floor_ms: rec.last_commit_time_ms.unwrap_or(0),
                poisoned: None,
            }),
            view: RwLock::new(View { segments, hwm, oldest }),
            hwm: AtomicU64::new(hwm),
            closed: AtomicBool::new(false),
            open_sealed: Mutex::new(VecDeque::new()),
            listener: RwLock::new(None),
            observer: RwLock::new(None),
            hwm_lock: Mutex::new(()),
            hwm_changed: Condvar::new(),
            retention_lock: Mutex::new(()),
            counters: Counters::default(),
            recovery: rec.report,
        })
    }

    /// Creates a new, empty log in `dir` whose first offset is `base` and
    /// opens it: its oldest offset and high watermark are `base`, and its
    /// first commit gets offset `base`. Refused when `dir` already holds a
    /// segment (the log exists: open it instead).
    ///
    /// Used for a partition whose earlier log is lost with its node's disk
    /// (`narad cluster remove --force`): its offsets continue from where the
    /// cluster last saw them, never from 0. Nothing new is on disk: the
    /// log is one empty segment file named for `base` (its directory entry
    /// durable), which [`PartitionLog::open`] gives a format 2 header in
    /// place, as it does for any empty last segment. A crash before the
    /// file's entry is durable leaves no segment (the caller creates it
    /// again); after it, an empty segment at `base`, which opens as this
    /// log.
    pub fn create_at(
        fs: FsRef,
        dir: PathBuf,
        config: LogConfig,
        clock: ClockRef,
        base: u64,
    ) -> Result<PartitionLog, LogError> {
        config.validate()?;
        fs.create_dir_all(&dir).map_err(|e| LogError::io("create directory", &dir, e))?;
        let entries = fs.list_dir(&dir).map_err(|e| LogError::io("list", &dir, e))?;
        if let Some(e) = entries
            .iter()
            .find(|e| !e.is_dir && segment::parse_segment_file_name(&e.name).is_some())
        {
            return Err(LogError::io(
                "create log",
                dir.join(&e.name),
                std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "the partition directory already holds a log",
                ),
            ));
        }
        let path = segment::segment_path(&dir, base);
        fs.open(&path, OpenMode::CreateNew).map_err(|e| LogError::io("create", &path, e))?;
        let log = PartitionLog::open(fs, dir, config, clock)?;
        debug_assert_eq!((log.oldest_offset(), log.high_watermark()), (base, base));
        Ok(log)
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The configuration the log was opened with.
    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// What recovery found and did when the log was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// The high watermark: the first offset not yet visible (exclusive).
    pub fn high_watermark(&self) -> u64 {
        self.hwm.load(Ordering::Acquire)
    }

    /// The oldest offset still in the log (retention removes older ones).
    pub fn oldest_offset(&self) -> u64 {
        self.view_read().oldest
    }

    /// Whether [`PartitionLog::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The log's counters since it was opened.
    pub fn metrics(&self) -> LogMetrics {
        let mut m = self.counters.snapshot();
        m.cache_bytes = lock(&self.cache).bytes();
        m
    }

    /// Frames skipped at read time because they failed their CRC or decode.
    pub fn corrupt_frames_skipped(&self) -> u64 {
        self.metrics().corrupt_frames_skipped
    }

    /// A snapshot of the log's shape. May read one frame (once) to learn
    /// the commit time of the oldest segment's first record.
    pub fn stats(&self) -> LogStats {
        let (mut stats, probe) = {
            let v = self.view_read();
            let first = v.segments.first();
            let stats = LogStats {
                segments: v.segments.len(),
                oldest_offset: v.oldest,
                next_offset: v.hwm,
                high_watermark: v.hwm,
                size_bytes: v.segments.iter().map(|s| s.end_pos).sum(),
                oldest_segment_at_ms: first.and_then(|s| s.first_time_ms),
            };
            let probe = first
                .filter(|s| s.first_time_ms.is_none() && s.last_frame_pos.is_some())
                .map(|s| s.file.clone());
            (stats, probe)
        };
        if let Some(seg) = probe
            && let Ok((first, _)) = self.frame_times(&seg, seg.frames_start())
        {
            if let Some(s) = self.view_write().segment_by_base(seg.base) {
                s.first_time_ms = Some(first);
            }
            stats.oldest_segment_at_ms = Some(first);
        }
        stats
    }

    /// Installs (or with `None` removes) the commit listener.
    pub fn set_commit_listener(&self, listener: Option<CommitListener>) {
        *self.listener.write().unwrap_or_else(PoisonError::into_inner) = listener.map(Arc::from);
    }

    /// Installs (or with `None` removes) the cycle observer: it gets the
    /// timings of every successful commit cycle (for the storage flush and
    /// fsync histograms). It runs on the committing thread, outside the
    /// log's locks, so it must be cheap.
    pub fn set_cycle_observer(&self, observer: Option<CycleObserver>) {
        *self.observer.write().unwrap_or_else(PoisonError::into_inner) = observer.map(Arc::from);
    }

    pub(crate) fn observe_cycle(&self, timings: &CycleTimings) {
        let observer = self.observer.read().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(o) = observer {
            o(timings);
        }
    }

    /// Blocks until the high watermark is above `offset`, the timeout
    /// passes, or the log is closed. Returns the high watermark (which is
    /// `<= offset` on timeout), or [`LogError::Closed`].
    pub fn wait_for_hwm_beyond(&self, offset: u64, timeout: Duration) -> Result<u64, LogError> {
        let deadline = Instant::now() + timeout;
        let mut guard = lock(&self.hwm_lock);
        loop {
            if self.is_closed() {
                return Err(LogError::Closed);
            }
            let hwm = self.high_watermark();
            let now = Instant::now();
            if hwm > offset || now >= deadline {
                return Ok(hwm);
            }
            guard = self
                .hwm_changed
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Wakes waiters and the listener after the high watermark moved.
    pub(crate) fn notify_committed(&self) {
        drop(lock(&self.hwm_lock));
        self.hwm_changed.notify_all();
        let listener = self.listener.read().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(l) = listener {
            l(self.high_watermark());
        }
    }

    /// Closes the log. A commit cycle already running finishes (its callers
    /// get its outcome) and `close` waits for it; every other commit,
    /// including batches already queued on the combiner, fails with
    /// [`LogError::Closed`] and appends nothing. Reads fail with
    /// [`ReadError::Closed`]. File handles and caches are released. Use it
    /// before deleting a topic, so that no commit for the old incarnation
    /// can land in a recreated log.
    pub fn close(&self) {
        // The flag first: a cycle checks it under the writer lock, so any
        // cycle that takes the lock from now on refuses, whoever gets the
        // lock first below.
        self.closed.store(true, Ordering::Release);
        let mut w = lock(&self.writer);
        w.active = None;
        drop(w);
        let files: Vec<_> = self.view_read().segments.iter().map(|s| s.file.clone()).collect();
        for f in files {
            *lock(&f.handle) = None;
        }
        lock(&self.open_sealed).clear();
        lock(&self.cache).clear();
        drop(lock(&self.hwm_lock));
        self.hwm_changed.notify_all();
    }

    /// Drops the decoded-frame cache and the open handles of sealed
    /// segments (for idle logs); both refill on demand.
    pub fn release_memory(&self) {
        lock(&self.cache).clear();
        let sealed: Vec<_> = lock(&self.open_sealed).drain(..).collect();
        for s in sealed {
            *lock(&s.handle) = None;
        }
    }

    pub(crate) fn view_read(&self) -> RwLockReadGuard<'_, View> {
        self.view.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn view_write(&self) -> RwLockWriteGuard<'_, View> {
        self.view.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// An open handle of a segment: the cached one, or a new one (then kept
    /// in the small set of open sealed segments). A file that retention
    /// already removed gives [`ReadError::Gone`].
    pub(crate) fn segment_handle(
        &self,
        seg: &Arc<SegFile>,
        end_offset: u64,
    ) -> Result<FileRef, ReadError> {
        let mut h = lock(&seg.handle);
        if let Some(f) = &*h {
            return Ok(f.clone());
        }
        if self.is_closed() {
            return Err(ReadError::Closed);
        }
        let file = match self.fs.open(&seg.path, OpenMode::Existing) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                drop(h); // never hold a handle lock while taking the view lock
                let oldest = self.view_read().oldest.max(end_offset);
                return Err(ReadError::Gone { offset: seg.base, oldest });
            }
            Err(e) => return Err(ReadError::io("open", &seg.path, e)),
        };
        *h = Some(file.clone());
        drop(h);
        self.remember_sealed(seg.clone());
        Ok(file)
    }

    /// Notes that a sealed segment's handle is open; closes the oldest such
    /// handles beyond [`MAX_OPEN_SEALED_FILES`].
    pub(crate) fn remember_sealed(&self, seg: Arc<SegFile>) {
        let evicted: Vec<_> = {
            let mut q = lock(&self.open_sealed);
            q.retain(|s| !Arc::ptr_eq(s, &seg));
            q.push_back(seg);
            let excess = q.len().saturating_sub(MAX_OPEN_SEALED_FILES);
            q.drain(..excess).collect()
        };
        for s in evicted {
            *lock(&s.handle) = None;
        }
    }

    /// The commit times of the first and last records of the frame at
    /// `pos` of a segment.
    pub(crate) fn frame_times(&self, seg: &Arc<SegFile>, pos: u64) -> Result<(u64, u64), LogError> {
        let file = self.segment_handle(seg, seg.base).map_err(|e| match e {
            ReadError::Io { op, path, source } => LogError::Io { op, path, source },
            ReadError::Gone { .. } => LogError::io(
                "open",
                &seg.path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "segment removed"),
            ),
            ReadError::Closed => LogError::Closed,
        })?;
        recovery::frame_time_bounds(&*file, &seg.path, seg.seed(), pos)
    }
}

/// Makes `file` (empty, or to be emptied) the format 2 segment `base` of a
/// log salted with `salt`: its header, fdatasynced, and nothing after it.
pub(crate) fn write_segment_header(
    file: &dyn narad_fs::File,
    path: &Path,
    base: u64,
    salt: u64,
) -> Result<(), LogError> {
    file.set_len(0).map_err(|e| LogError::io("truncate", path, e))?;
    let header = segment::segment_header(base, salt);
    file.write_all_at(&header, 0).map_err(|e| LogError::io("write", path, e))?;
    file.sync_data().map_err(|e| LogError::io("fdatasync", path, e))
}
