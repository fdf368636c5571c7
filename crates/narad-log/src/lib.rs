//! narad-log: the partition log, the owner side of the durability boundary.
//!
//! A partition log is the only place where a narad message becomes visible.
//! It is synchronous (no async runtime, no thread of its own: a commit cycle
//! runs on the thread of the caller that leads it), touches the disk only
//! through [`narad_fs`], and reads time only through [`narad_clock`].
//!
//! # The commit (the durability boundary)
//!
//! [`PartitionLog::commit`] takes a batch of records and returns only after
//! they are durable and verified:
//!
//! 1. Batches that arrive while a cycle runs queue on the log's *combiner*.
//!    The first caller with no cycle running leads: it drains every queued
//!    batch (up to [`limits::CYCLE_DRAIN_RECORDS`] / [`limits::CYCLE_DRAIN_BYTES`])
//!    into one cycle. When a cycle ends, the caller of the oldest batch still
//!    queued leads the next one (after a short, bounded linger for the
//!    callers just served, see [`LogConfig::commit_linger_us`]).
//! 2. Under the log's writer lock it assigns one commit time (never below
//!    the previous one, even if the wall clock went back) and contiguous
//!    offsets, wraps the records in envelopes and frames, appends them,
//!    `fdatasync`s, reads every frame back and checks its CRC.
//! 3. Only then does it advance the in-memory high watermark, wake waiters
//!    and the commit listener. Every caller of the cycle gets the same
//!    outcome: its own contiguous offsets, or the same error.
//! 4. A cycle that fails after appending truncates the log back to the high
//!    watermark (and syncs), so no unverified byte ever becomes visible and
//!    the next cycle starts clean. If that truncation fails, the log is
//!    poisoned until it is reopened.
//!
//! The high watermark is never written to disk: [`PartitionLog::open`]
//! recovers it from the CRC-verified tail (see [`recovery`]).
//!
//! # Files
//!
//! `<partition dir>/%020d.log` segments of frames ([`segment`], [`frame`],
//! [`envelope`]) and `consumer.offset` ([`frontier`]).

pub mod bench;
mod cache;
mod commit;
mod config;
pub mod copy;
pub mod envelope;
mod error;
pub mod frame;
pub mod frontier;
pub mod limits;
mod log;
mod metrics;
mod read;
pub mod recovery;
mod retention;
pub mod segment;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;

pub use cache::{DEFAULT_PROCESS_CACHE_BUDGET, process_cache_bytes, set_process_cache_budget};
pub use config::{LogConfig, SealedCheck};
pub use error::{FrontierError, LogError, ReadError};
pub use frame::Codec;
pub use frontier::ConsumerOffset;
pub use log::{CommitListener, CycleObserver, PartitionLog};
pub use metrics::LogMetrics;
pub use recovery::RecoveryReport;
pub use retention::RetentionReport;

/// The directory of a partition's log: `<data>/topics/<topic>/p%05d`
/// (SPEC §5.1). The topic name is used as is; the broker validates it.
pub fn partition_dir(data_dir: &Path, topic: &str, partition: u32) -> PathBuf {
    data_dir.join("topics").join(topic).join(format!("p{partition:05}"))
}

/// One record to commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRecord {
    /// The key: `None` for no key, `Some(empty)` for an empty key. The two
    /// stay distinguishable on disk and in reads.
    pub key: Option<Bytes>,
    /// The payload.
    pub payload: Bytes,
}

impl CommitRecord {
    /// A record with the given key and payload.
    pub fn new(key: Option<Bytes>, payload: impl Into<Bytes>) -> Self {
        CommitRecord { key, payload: payload.into() }
    }

    /// A record without a key.
    pub fn keyless(payload: impl Into<Bytes>) -> Self {
        CommitRecord { key: None, payload: payload.into() }
    }

    /// A record with a key.
    pub fn keyed(key: impl Into<Bytes>, payload: impl Into<Bytes>) -> Self {
        CommitRecord { key: Some(key.into()), payload: payload.into() }
    }

    /// Key plus payload bytes.
    pub fn size(&self) -> u64 {
        (self.payload.len() + self.key.as_ref().map_or(0, Bytes::len)) as u64
    }
}

/// What a successful commit assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitOutcome {
    /// The offset of the batch's first record.
    pub first_offset: u64,
    /// How many records the batch had (its offsets are contiguous).
    pub count: u64,
    /// The commit time of every record of the batch, in ms since the epoch.
    pub commit_time_ms: u64,
}

/// What one successful commit cycle spent (for the storage histograms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CycleTimings {
    /// The durable-commit I/O: from the cycle's first write to the end of
    /// its read-back, segment rolls included.
    pub flush: Duration,
    /// Time inside `write` calls.
    pub write: Duration,
    /// Time inside `fdatasync` calls (the roll's sync of the sealed segment
    /// included).
    pub fsync: Duration,
    /// Frame bytes written.
    pub bytes: u64,
    /// Records made visible.
    pub records: u64,
}

impl CommitOutcome {
    /// The batch's offsets.
    pub fn offsets(&self) -> Range<u64> {
        self.first_offset..self.first_offset + self.count
    }
}

/// One record read from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// Its offset.
    pub offset: u64,
    /// Its key (`None`: no key; `Some(empty)`: an empty key).
    pub key: Option<Bytes>,
    /// Its commit time, in ms since the epoch.
    pub commit_time_ms: u64,
    /// Its payload (zero-copy where the frame was not compressed).
    pub payload: Bytes,
}

/// A read request (see [`PartitionLog::read_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    /// The first offset wanted.
    pub from: u64,
    /// At most this many records (capped at [`limits::MAX_READ_RECORDS`]).
    pub max_records: usize,
    /// Stop before the record that would take key + payload bytes past this;
    /// the first record is returned whatever its size.
    pub max_bytes: u64,
    /// The delay gate: stop at the first record committed after this time
    /// (ms since the epoch) and report its commit time. Commit times never
    /// decrease along a partition, so nothing after it is older.
    pub max_commit_time_ms: Option<u64>,
}

/// What a read returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadBatch {
    /// The records, in offset order (gaps only where `corrupt` says).
    pub records: Vec<LogRecord>,
    /// Offsets skipped because their frame failed its CRC or decode at read
    /// time: the consumer layer counts them as corrupt. Ordered, disjoint.
    pub corrupt: Vec<Range<u64>>,
    /// Where the next read should start.
    pub next_offset: u64,
    /// The high watermark the read was bounded by.
    pub high_watermark: u64,
    /// With a delay gate: the commit time of the first record held back.
    pub held_back_commit_time_ms: Option<u64>,
}

/// A snapshot of a log's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogStats {
    /// Number of segment files.
    pub segments: usize,
    /// The oldest offset still readable.
    pub oldest_offset: u64,
    /// The offset the next record will get.
    pub next_offset: u64,
    /// The first offset not yet visible (equal to `next_offset` between
    /// commit cycles: nothing unverified is ever kept).
    pub high_watermark: u64,
    /// Bytes of verified frames on disk.
    pub size_bytes: u64,
    /// The commit time of the oldest segment's first record, if any.
    pub oldest_segment_at_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_directories_follow_the_spec_layout() {
        assert_eq!(
            partition_dir(Path::new("/var/lib/narad"), "orders", 7),
            PathBuf::from("/var/lib/narad/topics/orders/p00007")
        );
        assert_eq!(
            partition_dir(Path::new("d"), "t", 123_456),
            PathBuf::from("d/topics/t/p123456")
        );
    }
}
