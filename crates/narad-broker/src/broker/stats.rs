//! Figures: [`PartitionStats`] ([`Broker::partition_stats`], also the
//! body of node RPC op 8's reply, so its serialised form is a wire
//! format), the gauge polls [`Broker::poll_metrics`] (background, every
//! [`METRICS_POLL_INTERVAL`](crate::limits::METRICS_POLL_INTERVAL)) and
//! [`Broker::poll_cheap_gauges`] (every scrape), and the data-directory
//! walk (`dir_size`, `dir_walk_skip`).
//!
//! Fields worked on here: `wal_seen` and `dir_walk_skip`.
//!
//! Invariants the code relies on:
//! - `wal_seen` holds the WAL's counters at the last poll and is swapped
//!   under its lock, so each WAL event is added to the counters once.
//! - `poll_cheap_gauges` does no walk and no read (one statvfs): it is
//!   cheap enough for every scrape. `poll_metrics` blocks.

use std::sync::atomic::Ordering;

use narad_log::LogStats;
use narad_meta::Topic;

use super::Broker;
use crate::limits::{DATA_DIR_WALK_ENTRIES_PER_POLL, DATA_DIR_WALK_MAX_SKIP};
use crate::metrics::{PartitionLabels, SourceLabels, TopicLabels};

/// Per-partition details for `GET /v1/topics/{topic}` (also the body of
/// node RPC op 8's reply).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartitionStats {
    /// Partition index.
    pub index: u32,
    /// Segment files.
    pub segments: usize,
    /// Oldest readable offset.
    pub oldest_offset: u64,
    /// Offset of the next record.
    pub next_offset: u64,
    /// First offset not yet visible.
    pub high_watermark: u64,
    /// Bytes on disk.
    pub size_bytes: u64,
    /// Commit time (Unix s) of the oldest segment's first record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_segment_at: Option<u64>,
    /// The member that owns the partition (absent while unassigned).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_node: Option<String>,
    /// The member whose log the figures above describe: the owner's when
    /// it answered, else this node's own (set by a cluster node; absent on
    /// a single node, whose figures are always its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats_from: Option<String>,
    /// `ok`, or `owner_unavailable` when the owner is dead, unknown, not
    /// assigned yet, or did not answer for its figures.
    pub status: crate::ownership::PartitionStatus,
    /// The owner's liveness: `alive`, `dead` or `unknown`.
    pub owner_liveness: crate::ownership::OwnerLiveness,
}

impl Broker {
    /// Per-partition details of a topic (all, or one).
    pub fn partition_stats(&self, t: &Topic, only: Option<u32>) -> Vec<PartitionStats> {
        let rt = self.topics.get_open(t.name(), t.incarnation());
        let state = self.meta.snapshot();
        let range = match only {
            Some(p) => p..p + 1,
            None => 0..t.partitions(),
        };
        range
            .map(|p| {
                let s = rt.as_ref().and_then(|rt| rt.partition_stats(p));
                let s = s.unwrap_or(LogStats {
                    segments: 0,
                    oldest_offset: 0,
                    next_offset: 0,
                    high_watermark: 0,
                    size_bytes: 0,
                    oldest_segment_at_ms: None,
                });
                let owner = crate::ownership::partition_owner(&state, t.name(), p);
                PartitionStats {
                    index: p,
                    segments: s.segments,
                    oldest_offset: s.oldest_offset,
                    next_offset: s.next_offset,
                    high_watermark: s.high_watermark,
                    size_bytes: s.size_bytes,
                    oldest_segment_at: s.oldest_segment_at_ms.map(|ms| ms / 1000),
                    owner_node: owner.owner_node,
                    stats_from: None,
                    status: owner.status,
                    owner_liveness: owner.liveness,
                }
            })
            .collect()
    }

    /// Refreshes the gauges (every 5 s in the background; blocking: it
    /// may read a frame header and walks the data directory).
    pub fn poll_metrics(&self) {
        self.poll_cheap_gauges();
        let m = &self.metrics;
        let now_ms = self.clock.wall_ms();
        for rt in self.topics.all() {
            let mut topic_bytes = rt.evicted_bytes();
            for part in rt.open_partitions() {
                let l = PartitionLabels::new(&rt.name, part.index);
                let stats = part.log.stats();
                topic_bytes += stats.size_bytes;
                m.partition_size_bytes.get_or_create(&l).set(stats.size_bytes as i64);
                m.segments.get_or_create(&l).set(stats.segments as i64);
                if let Ok(mut g) = part.shard()
                    && let Some(s) = g.as_mut()
                {
                    let written = part.log.segment_written_at_ms(s.next());
                    let age = written.map_or(0, |t| now_ms.saturating_sub(t));
                    m.oldest_unconsumed_message_age_seconds
                        .get_or_create(&l)
                        .set(age as f64 / 1000.0);
                    m.consumer_lag_messages
                        .get_or_create(&l)
                        .set(stats.next_offset.saturating_sub(s.next()) as i64);
                    m.consumer_dropped_messages
                        .get_or_create(&l)
                        .set(stats.oldest_offset.saturating_sub(s.next()) as i64);
                    m.inflight_size.get_or_create(&l).set(s.in_flight() as i64);
                    m.acked_ahead_size
                        .get_or_create(&l)
                        .set((s.acked_ahead() + s.corrupt_ahead()) as i64);
                }
            }
            m.topic_bytes
                .get_or_create(&TopicLabels { topic: rt.name.to_string() })
                .set(i64::try_from(topic_bytes).unwrap_or(i64::MAX));
        }
        // The walk stats every entry: a data dir of many entries is walked
        // on fewer polls (see DATA_DIR_WALK_ENTRIES_PER_POLL).
        let skip = self.dir_walk_skip.load(Ordering::Relaxed);
        if skip > 0 {
            self.dir_walk_skip.store(skip - 1, Ordering::Relaxed);
            return;
        }
        match dir_size(&self.config.data_dir) {
            Ok((bytes, entries)) => {
                m.data_dir_size_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
                self.dir_walk_skip.store(dir_walk_skip(entries), Ordering::Relaxed);
            }
            Err(_) => m.error("metrics", "snapshot"),
        }
    }

    /// Refreshes the cheap node-level gauges (called on every scrape).
    pub fn poll_cheap_gauges(&self) {
        let m = &self.metrics;
        let snap = self.meta.snapshot();
        m.topics.set(snap.topic_count() as i64);
        m.partitions.set(snap.topics().map(|t| i64::from(t.partitions())).sum());
        m.ingress_wal_failed.set(i64::from(self.wal.is_latched()));
        let now = self.wal.stats();
        let seen =
            std::mem::replace(&mut *self.wal_seen.lock().unwrap_or_else(|p| p.into_inner()), now);
        m.ingress_wal_syncs.inc_by(now.syncs - seen.syncs);
        m.ingress_wal_records.inc_by(now.records - seen.records);
        m.ingress_wal_bytes.inc_by(now.bytes - seen.bytes);
        m.ingress_wal_sync_seconds.inc_by((now.io_nanos - seen.io_nanos) as f64 / 1e9);
        for (source, n) in [
            ("memory", now.read_memory_bytes - seen.read_memory_bytes),
            ("disk", now.read_disk_bytes - seen.read_disk_bytes),
        ] {
            m.ingress_wal_read_bytes
                .get_or_create(&SourceLabels { source: source.into() })
                .inc_by(n);
        }
        for _ in seen.prep_failures..now.prep_failures {
            m.error("ingress_wal", "prepare");
        }
        for _ in seen.runway_failures..now.runway_failures {
            m.error("ingress_wal", "runway");
        }
        for _ in seen.segment_create_failures..now.segment_create_failures {
            m.error("ingress_wal", "segment_create");
        }
        m.ingress_dispatch_backlog_records.set(self.wal.dispatch_backlog() as i64);
        m.open_partition_logs.set(self.topics.open_logs() as i64);
        // One statvfs: cheap enough for every scrape.
        match fs4::available_space(&self.config.data_dir) {
            Ok(free) => {
                m.data_dir_available_bytes.set(i64::try_from(free).unwrap_or(i64::MAX));
            }
            Err(_) => m.error("metrics", "snapshot"),
        }
    }
}

/// Polls to skip after a data-dir walk that met `entries` entries: about
/// [`DATA_DIR_WALK_ENTRIES_PER_POLL`] stats per poll on average, and a walk
/// at least every [`DATA_DIR_WALK_MAX_SKIP`] + 1 polls.
fn dir_walk_skip(entries: u64) -> u32 {
    u32::try_from(entries / DATA_DIR_WALK_ENTRIES_PER_POLL)
        .unwrap_or(u32::MAX)
        .min(DATA_DIR_WALK_MAX_SKIP)
}

/// The bytes of the files under `dir` (apparent sizes; files that vanish
/// during the walk are skipped), and how many entries (files and
/// directories) the walk met. A metrics walk: it reads no file, so it goes
/// to the file system directly, as the free-space gauge does.
fn dir_size(dir: &std::path::Path) -> std::io::Result<(u64, u64)> {
    let mut total = 0u64;
    let mut entries_met = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && d != dir => continue,
            Err(e) => return Err(e),
        };
        for entry in entries.flatten() {
            entries_met += 1;
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    Ok((total, entries_met))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::limits::METRICS_POLL_INTERVAL;

    #[test]
    fn a_small_data_dir_is_walked_on_every_poll_and_a_large_one_at_least_once_a_minute() {
        assert_eq!(dir_walk_skip(0), 0);
        assert_eq!(dir_walk_skip(DATA_DIR_WALK_ENTRIES_PER_POLL - 1), 0);
        // 1,000 topics x 3 partitions with a segment each: 8,007 entries,
        // walked on every 9th poll.
        assert_eq!(dir_walk_skip(8_007), 8);
        assert_eq!(dir_walk_skip(12_000), DATA_DIR_WALK_MAX_SKIP);
        assert_eq!(dir_walk_skip(u64::MAX), DATA_DIR_WALK_MAX_SKIP);
        let once_a_minute = METRICS_POLL_INTERVAL * (DATA_DIR_WALK_MAX_SKIP + 1);
        assert_eq!(once_a_minute, Duration::from_secs(60));
    }

    #[test]
    fn dir_size_counts_the_bytes_and_entries_of_nested_files() {
        let dir = std::env::temp_dir().join(format!("narad-dir-size-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("x"), [0u8; 10]).unwrap();
        std::fs::write(dir.join("a/b/y"), [0u8; 32]).unwrap();
        let got = dir_size(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        // Entries: x, a, a/b, a/b/y.
        assert_eq!(got.unwrap(), (42, 4));
    }
}
