//! Plain counters of one partition log. The server exports them (as
//! Prometheus metrics); this crate depends on no metrics library.

use std::sync::atomic::{AtomicU64, Ordering};

/// The live counters (relaxed atomics: they are statistics, not
/// synchronisation).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub commits: AtomicU64,
    pub commit_cycles: AtomicU64,
    pub records_committed: AtomicU64,
    pub frames_written: AtomicU64,
    pub bytes_written: AtomicU64,
    pub syncs: AtomicU64,
    pub commit_failures: AtomicU64,
    pub rollbacks: AtomicU64,
    pub verify_failures: AtomicU64,
    pub segments_rolled: AtomicU64,
    pub corrupt_frames_skipped: AtomicU64,
    pub corrupt_records_skipped: AtomicU64,
    pub records_read: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub segments_deleted: AtomicU64,
    pub bytes_deleted: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> LogMetrics {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LogMetrics {
            commits: g(&self.commits),
            commit_cycles: g(&self.commit_cycles),
            records_committed: g(&self.records_committed),
            frames_written: g(&self.frames_written),
            bytes_written: g(&self.bytes_written),
            syncs: g(&self.syncs),
            commit_failures: g(&self.commit_failures),
            rollbacks: g(&self.rollbacks),
            verify_failures: g(&self.verify_failures),
            segments_rolled: g(&self.segments_rolled),
            corrupt_frames_skipped: g(&self.corrupt_frames_skipped),
            corrupt_records_skipped: g(&self.corrupt_records_skipped),
            records_read: g(&self.records_read),
            cache_hits: g(&self.cache_hits),
            cache_misses: g(&self.cache_misses),
            segments_deleted: g(&self.segments_deleted),
            bytes_deleted: g(&self.bytes_deleted),
            cache_bytes: 0,
        }
    }
}

/// A snapshot of a log's counters, all since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogMetrics {
    /// `commit` calls that succeeded.
    pub commits: u64,
    /// Commit cycles that succeeded (each one fdatasync of the active
    /// segment, plus one per roll inside the cycle).
    pub commit_cycles: u64,
    /// Records made visible.
    pub records_committed: u64,
    /// Frames written by successful cycles.
    pub frames_written: u64,
    /// Bytes written by successful cycles.
    pub bytes_written: u64,
    /// Successful `fdatasync` calls on segments.
    pub syncs: u64,
    /// `commit` calls that failed (every caller of a failed cycle counts).
    pub commit_failures: u64,
    /// Failed cycles truncated back to the high watermark.
    pub rollbacks: u64,
    /// Cycles whose read-back after fdatasync did not match.
    pub verify_failures: u64,
    /// New segments started.
    pub segments_rolled: u64,
    /// Frames skipped at read time because they failed their CRC or decode.
    pub corrupt_frames_skipped: u64,
    /// Records (offsets) skipped with them.
    pub corrupt_records_skipped: u64,
    /// Records returned by reads.
    pub records_read: u64,
    /// Reads of a frame served by the decoded-frame cache.
    pub cache_hits: u64,
    /// Reads of a frame that went to the file.
    pub cache_misses: u64,
    /// Segments deleted by retention.
    pub segments_deleted: u64,
    /// Bytes deleted by retention.
    pub bytes_deleted: u64,
    /// Bytes held by the decoded-frame cache now (a gauge).
    pub cache_bytes: u64,
}
