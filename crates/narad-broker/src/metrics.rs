//! The data plane's metrics (SPEC §9 names; prometheus-client appends
//! `_total` to counters, and the registry adds the `narad_` prefix).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// `{topic, partition}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: String,
}

impl PartitionLabels {
    /// Labels of one partition.
    pub fn new(topic: &str, partition: u32) -> Self {
        PartitionLabels { topic: topic.to_owned(), partition: partition.to_string() }
    }
}

/// `{topic}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    /// Topic name.
    pub topic: String,
}

/// `{topic, partition, state}`: a failing destination's probe state.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeStateLabels {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: String,
    /// `waiting`, `pinging` or `trial`.
    pub state: &'static str,
}

/// `{topic, reason}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    /// Topic name.
    pub topic: String,
    /// `schema` or `delayed_child`.
    pub reason: String,
}

/// `{topic, outcome}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabels {
    /// Topic name.
    pub topic: String,
    /// `hit`, `timeout`, `cancelled` or `no_wait`.
    pub outcome: String,
}

/// `{reason}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why.
    pub reason: String,
}

/// `{topic, partition, outcome}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PersistLabels {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: String,
    /// `ok` or `error`.
    pub outcome: String,
}

/// `{component, kind}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// Where: `http`, `messaging`, `storage`, `dispatch`.
    pub component: String,
    /// What: `5xx`, `append`, `commit_boundary`, `consume`, ...
    pub kind: String,
}

/// `{source}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    /// `memory` or `disk`.
    pub source: String,
}

/// Every data-plane metric.
#[derive(Debug, Default)]
pub struct BrokerMetrics {
    /// Records committed by this node's owner, per partition.
    pub messages_produced: Family<PartitionLabels, Counter>,
    /// Payload bytes committed.
    pub bytes_produced: Family<PartitionLabels, Counter>,
    /// Messages handed to consumers (queue and replay).
    pub messages_consumed: Family<PartitionLabels, Counter>,
    /// Payload bytes handed to consumers.
    pub bytes_consumed: Family<PartitionLabels, Counter>,
    /// Produces refused by schema or because the topic is a delayed child.
    pub produce_rejections: Family<RejectionLabels, Counter>,
    /// How long consumes waited, by outcome.
    pub consume_wait_seconds: WaitSeconds,
    /// Consumes that returned nothing.
    pub consume_empty: Family<TopicLabels, Counter>,
    /// Offsets skipped as unreadable.
    pub consumer_corrupt_skipped: Family<PartitionLabels, Counter>,
    /// Consumes that could not take from a partition (its consumer state
    /// could not be loaded, a read failed) and passed over it.
    pub consume_partition_errors: Family<PartitionLabels, Counter>,
    /// Acks refused (`cap`: the acked-ahead set was full).
    pub ack_rejected: Family<ReasonLabels, Counter>,
    /// Lease extensions.
    pub ack_extended: Family<TopicLabels, Counter>,
    /// Nacks.
    pub nack: Family<TopicLabels, Counter>,
    /// Next offset − (committed + 1), per partition (5 s poller).
    pub consumer_lag_messages: Family<PartitionLabels, Gauge>,
    /// Offsets retention removed before they were consumed.
    pub consumer_dropped_messages: Family<PartitionLabels, Gauge>,
    /// Live leases.
    pub inflight_size: Family<PartitionLabels, Gauge>,
    /// Acked-ahead plus corrupt offsets.
    pub acked_ahead_size: Family<PartitionLabels, Gauge>,
    /// Bytes of a partition's log.
    pub partition_size_bytes: Family<PartitionLabels, Gauge>,
    /// Bytes of all of a topic's partition logs on this node.
    pub topic_bytes: Family<TopicLabels, Gauge>,
    /// Now minus when the segment holding the consumer frontier was last
    /// written (0 when nothing is unconsumed), per partition.
    pub oldest_unconsumed_message_age_seconds: Family<PartitionLabels, Gauge<f64, AtomicU64>>,
    /// Segments of a partition's log.
    pub segments: Family<PartitionLabels, Gauge>,
    /// Segments and bytes deleted by retention.
    pub storage_retention_bytes_deleted: Family<PartitionLabels, Counter>,
    /// Records deleted by retention.
    pub storage_retention_messages_deleted: Family<PartitionLabels, Counter>,
    /// How long one retention pass over a partition took.
    pub storage_retention_run_duration_seconds: StorageSeconds<PartitionLabels>,
    /// A durable commit cycle's I/O (write, fdatasync, read-back).
    pub storage_flush_duration_seconds: StorageSeconds<PartitionLabels>,
    /// The fdatasync calls of a commit cycle.
    pub storage_fsync_duration_seconds: StorageSeconds<PartitionLabels>,
    /// Frame bytes written by commit cycles.
    pub storage_flush_bytes: Family<PartitionLabels, Counter>,
    /// Writing the consumer frontier (`consumer.offset`: temp file,
    /// fdatasync, rename, directory fsync), by outcome.
    pub storage_high_watermark_persist_duration_seconds: StorageSeconds<PersistLabels>,
    /// Commits whose durable commit failed on this owner.
    pub errors: Family<ErrorLabels, Counter>,
    /// Topics in the metastore.
    pub topics: Gauge,
    /// Partitions of all topics.
    pub partitions: Gauge,
    /// Partition logs open on this node.
    pub open_partition_logs: Gauge,
    /// Partition logs closed as idle (SPEC §5.7).
    pub idle_logs_evicted: Counter,
    /// 1 once the ingress WAL latched a write/fsync failure.
    pub ingress_wal_failed: Gauge,
    /// Records a restart would replay: durable WAL end − stored checkpoint.
    pub ingress_dispatch_backlog_records: Gauge,
    /// Ingress WAL group commits (one write + fdatasync each).
    pub ingress_wal_syncs: Counter,
    /// Records the ingress WAL made durable (÷ syncs = the group size).
    pub ingress_wal_records: Counter,
    /// Frame bytes the ingress WAL made durable.
    pub ingress_wal_bytes: Counter,
    /// Seconds the WAL sync thread spent writing and fdatasyncing
    /// (÷ syncs = the mean group commit I/O time).
    pub ingress_wal_sync_seconds: Counter<f64, AtomicU64>,
    /// Bytes the dispatcher's WAL readers took from the in-memory tail of
    /// the latest group commits (`memory`) or read from segment files
    /// (`disk`: it was behind the tail, or restarted).
    pub ingress_wal_read_bytes: Family<SourceLabels, Counter>,
    /// Records rerouted to a sibling partition.
    pub dispatch_rerouted: Counter,
    /// Records discarded because their topic (incarnation) is gone.
    pub dispatch_discarded: Counter,
    /// Dispatcher commits that failed.
    pub dispatch_commit_failures: Counter,
    /// Dispatcher commits an owner refused (another incarnation, not the
    /// owner): resolved again after a back-off.
    pub dispatch_commit_refusals: Counter,
    /// Records accepted here (read from the ingress WAL) and not yet
    /// committed anywhere: queued, in flight, or left in the WAL for a
    /// destination that cannot take them now.
    pub ingress_dispatch_uncommitted_records: Gauge,
    /// Keyed records committed to a sibling partition because theirs could
    /// not take them (their key's partition is not kept), by topic.
    pub dispatch_keyed_rerouted: Family<TopicLabels, Counter>,
    /// Records of one destination left in the WAL (only destinations with
    /// some are listed).
    pub dispatch_destination_skipped_records: Family<PartitionLabels, Gauge>,
    /// Seconds a failing destination has been failing (only failing
    /// destinations are listed).
    pub dispatch_destination_failing_seconds: Family<PartitionLabels, Gauge>,
    /// 1 for the probe state a failing destination is in (`waiting`: for
    /// its next ping; `pinging`: its owner's ping is out; `trial`: the ping
    /// came back and the next commit decides).
    pub dispatch_destination_probe_state: Family<ProbeStateLabels, Gauge>,
    /// Bytes free on the data directory's file system.
    pub data_dir_available_bytes: Gauge,
    /// Bytes of the files under the data directory.
    pub data_dir_size_bytes: Gauge,
    /// Parent records a fan-out cursor has not sent yet.
    pub fanout_lag_messages: Family<crate::fanout::FanoutPartitionLabels, Gauge>,
    /// How late (s) the oldest unsent record of a cursor is past its due time.
    pub fanout_due_lag_seconds: Family<crate::fanout::FanoutPartitionLabels, Gauge>,
    /// Records committed into children.
    pub fanout_committed: Family<crate::fanout::FanoutLabels, Counter>,
    /// Parent records a child never got (retention or corruption). A gauge
    /// that only grows, so the name stays SPEC's (a counter would gain
    /// `_total`).
    pub fanout_child_dropped_messages: Family<crate::fanout::FanoutLabels, Gauge>,
    /// Times a delayed cursor found its next record not due yet and slept.
    pub fanout_delay_gate_holds: Family<crate::fanout::FanoutLabels, Counter>,
    /// Fan-out cursors started again after they ended while their link held.
    pub fanout_cursor_restarts: Family<crate::fanout::FanoutLabels, Counter>,
    /// 1 while the fan-out reconciler waits for this replica to catch up
    /// with the Raft leader (no cursor starts or resumes, no sweep).
    pub fanout_waiting_for_replica: Gauge,
    /// Commits of a fan-out group (a slab's records for one child
    /// partition) that did not land; the group is tried again.
    pub fanout_commit_failures: Family<crate::fanout::FanoutLabels, Counter>,
    /// Keyless records a fan-out cursor moved from a child partition that
    /// has no owner, a dead owner or failing commits to a sibling.
    pub fanout_rerouted: Family<crate::fanout::FanoutLabels, Counter>,
    /// Records per slab a cursor committed into a child.
    pub fanout_batch_records: BatchRecords,
    /// Payload bytes per slab a cursor committed into a child.
    pub fanout_batch_bytes: BatchBytes,
}

/// Records per fan-out slab: 1 .. 4,096 (the slab cap) in powers of two.
#[derive(Debug, Clone)]
pub struct BatchRecords(pub Histogram);

impl Default for BatchRecords {
    fn default() -> Self {
        BatchRecords(Histogram::new(exponential_buckets(1.0, 2.0, 13)))
    }
}

/// Payload bytes per fan-out slab: 256 B .. 4 MiB (the slab cap) in
/// powers of four.
#[derive(Debug, Clone)]
pub struct BatchBytes(pub Histogram);

impl Default for BatchBytes {
    fn default() -> Self {
        BatchBytes(Histogram::new(exponential_buckets(256.0, 4.0, 8)))
    }
}

/// Storage latency buckets (s): 100 µs .. 1 s, 1-2.5-5 per decade.
const STORAGE_BUCKETS: [f64; 13] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

fn storage_histogram() -> Histogram {
    Histogram::new(STORAGE_BUCKETS)
}

/// A family of storage-latency histograms.
#[derive(Debug, Clone)]
pub struct StorageSeconds<L>(pub Family<L, Histogram, fn() -> Histogram>);

impl<L: Clone + std::hash::Hash + Eq> Default for StorageSeconds<L> {
    fn default() -> Self {
        StorageSeconds(Family::new_with_constructor(storage_histogram))
    }
}

fn wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Consume wait-time histograms by topic and outcome.
#[derive(Debug, Clone)]
pub struct WaitSeconds(pub Family<WaitLabels, Histogram, fn() -> Histogram>);

impl Default for WaitSeconds {
    fn default() -> Self {
        WaitSeconds(Family::new_with_constructor(wait_histogram))
    }
}

impl BrokerMetrics {
    /// Metrics registered in `registry` (which carries the `narad` prefix).
    pub fn new(registry: &mut Registry) -> BrokerMetrics {
        let m = BrokerMetrics::default();
        macro_rules! reg {
            ($name:literal, $help:literal, $field:ident) => {
                registry.register($name, $help, m.$field.clone());
            };
            // A histogram (family) behind a newtype that gives its buckets.
            ($name:literal, $help:literal, $field:ident.0) => {
                registry.register($name, $help, m.$field.0.clone());
            };
        }
        reg!("messages_produced", "Records committed on this owner", messages_produced);
        reg!("bytes_produced", "Payload bytes committed on this owner", bytes_produced);
        reg!("messages_consumed", "Messages delivered (queue and replay)", messages_consumed);
        reg!("bytes_consumed", "Payload bytes delivered", bytes_consumed);
        reg!(
            "produce_rejections",
            "Produces refused (schema, delayed_child, not_ready)",
            produce_rejections
        );
        reg!("consume_wait_seconds", "Time consumes waited, by outcome", consume_wait_seconds.0);
        reg!("consume_empty", "Consumes that returned no message", consume_empty);
        reg!("consumer_corrupt_skipped", "Offsets skipped as unreadable", consumer_corrupt_skipped);
        reg!(
            "consume_partition_errors",
            "Consumes that could not read a partition and passed over it",
            consume_partition_errors
        );
        reg!("ack_rejected", "Acks refused, by reason", ack_rejected);
        reg!("ack_extended", "Lease extensions", ack_extended);
        reg!("nack", "Nacks", nack);
        reg!("consumer_lag_messages", "Committed records not yet consumed", consumer_lag_messages);
        reg!(
            "consumer_dropped_messages",
            "Records retention removed unconsumed",
            consumer_dropped_messages
        );
        reg!("inflight_size", "Live leases", inflight_size);
        reg!("acked_ahead_size", "Acked-ahead and corrupt offsets", acked_ahead_size);
        reg!("partition_size_bytes", "Bytes of a partition log", partition_size_bytes);
        reg!("topic_bytes", "Bytes of a topic's partition logs on this node", topic_bytes);
        reg!(
            "oldest_unconsumed_message_age_seconds",
            "Now minus when the segment holding the consumer frontier was last written",
            oldest_unconsumed_message_age_seconds
        );
        reg!("segments", "Segments of a partition log", segments);
        reg!(
            "storage_retention_bytes_deleted",
            "Bytes deleted by retention",
            storage_retention_bytes_deleted
        );
        reg!(
            "storage_retention_messages_deleted",
            "Records deleted by retention",
            storage_retention_messages_deleted
        );
        reg!(
            "storage_retention_run_duration_seconds",
            "How long one retention pass over a partition took",
            storage_retention_run_duration_seconds.0
        );
        reg!(
            "storage_flush_duration_seconds",
            "A durable commit cycle's I/O: write, fdatasync and read-back",
            storage_flush_duration_seconds.0
        );
        reg!(
            "storage_fsync_duration_seconds",
            "The fdatasync calls of a durable commit cycle",
            storage_fsync_duration_seconds.0
        );
        reg!("storage_flush_bytes", "Frame bytes written by commit cycles", storage_flush_bytes);
        reg!(
            "storage_high_watermark_persist_duration_seconds",
            "Writing the consumer frontier (temp file, fdatasync, rename, directory fsync)",
            storage_high_watermark_persist_duration_seconds.0
        );
        reg!("errors", "Errors by component and kind", errors);
        reg!("topics_total", "Topics", topics);
        reg!("partitions_total", "Partitions of all topics", partitions);
        reg!("open_partition_logs", "Partition logs open on this node", open_partition_logs);
        reg!("idle_logs_evicted", "Partition logs closed as idle", idle_logs_evicted);
        reg!("ingress_wal_failed", "1 once the ingress WAL latched a failure", ingress_wal_failed);
        reg!(
            "ingress_dispatch_backlog_records",
            "Records a restart would replay",
            ingress_dispatch_backlog_records
        );
        reg!("ingress_wal_syncs", "Ingress WAL group commits", ingress_wal_syncs);
        reg!("ingress_wal_records", "Records the ingress WAL made durable", ingress_wal_records);
        reg!("ingress_wal_bytes", "Frame bytes the ingress WAL made durable", ingress_wal_bytes);
        reg!(
            "ingress_wal_sync_seconds",
            "Time the ingress WAL spent in group commit writes and fdatasyncs",
            ingress_wal_sync_seconds
        );
        reg!(
            "ingress_wal_read_bytes",
            "Bytes the dispatcher read from the ingress WAL, by source (memory, disk)",
            ingress_wal_read_bytes
        );
        reg!("dispatch_rerouted", "Records rerouted to a sibling partition", dispatch_rerouted);
        reg!("dispatch_discarded", "Records of deleted topics discarded", dispatch_discarded);
        reg!(
            "dispatch_commit_failures",
            "Dispatcher commits that failed",
            dispatch_commit_failures
        );
        reg!(
            "dispatch_commit_refusals",
            "Dispatcher commits an owner refused (another incarnation, not the owner)",
            dispatch_commit_refusals
        );
        reg!(
            "ingress_dispatch_uncommitted_records",
            "Records accepted here and not yet committed anywhere",
            ingress_dispatch_uncommitted_records
        );
        reg!(
            "dispatch_keyed_rerouted",
            "Keyed records committed to a sibling partition, by topic",
            dispatch_keyed_rerouted
        );
        reg!(
            "dispatch_destination_skipped_records",
            "Records of a destination left in the ingress WAL until it can take them",
            dispatch_destination_skipped_records
        );
        reg!(
            "dispatch_destination_failing_seconds",
            "Seconds a failing destination has been failing",
            dispatch_destination_failing_seconds
        );
        reg!(
            "dispatch_destination_probe_state",
            "1 for the probe state of a failing destination (waiting, pinging, trial)",
            dispatch_destination_probe_state
        );
        reg!(
            "data_dir_size_bytes",
            "Bytes of the files under the data directory",
            data_dir_size_bytes
        );
        reg!(
            "data_dir_available_bytes",
            "Bytes free on the data directory's file system",
            data_dir_available_bytes
        );
        reg!(
            "fanout_lag_messages",
            "Parent records a fan-out cursor has not sent yet (high watermark - cursor)",
            fanout_lag_messages
        );
        reg!(
            "fanout_due_lag_seconds",
            "How long past its due time the next record of a fan-out cursor is",
            fanout_due_lag_seconds
        );
        reg!("fanout_committed", "Records committed into a child by fan-out", fanout_committed);
        reg!(
            "fanout_child_dropped_messages",
            "Parent records a child never got (aged out or unreadable)",
            fanout_child_dropped_messages
        );
        reg!(
            "fanout_delay_gate_holds",
            "Times a delayed child's cursor waited for its next record to be due",
            fanout_delay_gate_holds
        );
        reg!(
            "fanout_waiting_for_replica",
            "1 while fan-out cursors wait for this node's metadata replica to catch up with the Raft leader",
            fanout_waiting_for_replica
        );
        reg!(
            "fanout_cursor_restarts",
            "Fan-out cursors started again after ending while their link held",
            fanout_cursor_restarts
        );
        reg!(
            "fanout_commit_failures",
            "Fan-out commits into a child partition that did not land (tried again after a back-off)",
            fanout_commit_failures
        );
        reg!(
            "fanout_rerouted",
            "Keyless records fan-out moved from a child partition without a live owner (or failing) to a sibling",
            fanout_rerouted
        );
        reg!(
            "fanout_batch_records",
            "Records per slab committed into a child",
            fanout_batch_records.0
        );
        reg!(
            "fanout_batch_bytes",
            "Payload bytes per slab committed into a child",
            fanout_batch_bytes.0
        );
        m
    }

    /// Removes the series of one fan-out cursor (its link is gone), and the
    /// link's series with it.
    pub fn forget_fanout_cursor(&self, parent: &str, child: &str, partition: u32) {
        let l = crate::fanout::FanoutPartitionLabels {
            parent: parent.to_owned(),
            child: child.to_owned(),
            partition: partition.to_string(),
        };
        self.fanout_lag_messages.remove(&l);
        self.fanout_due_lag_seconds.remove(&l);
        let l = crate::fanout::FanoutLabels { parent: parent.to_owned(), child: child.to_owned() };
        self.fanout_committed.remove(&l);
        self.fanout_child_dropped_messages.remove(&l);
        self.fanout_delay_gate_holds.remove(&l);
        self.fanout_cursor_restarts.remove(&l);
        self.fanout_commit_failures.remove(&l);
        self.fanout_rerouted.remove(&l);
    }

    /// Counts an error.
    pub fn error(&self, component: &str, kind: &str) {
        self.errors
            .get_or_create(&ErrorLabels { component: component.into(), kind: kind.into() })
            .inc();
    }

    /// Removes every per-partition series of a deleted topic.
    pub fn forget_topic(&self, topic: &str, partitions: u32) {
        self.topic_bytes.remove(&TopicLabels { topic: topic.to_owned() });
        for p in 0..partitions {
            let l = PartitionLabels::new(topic, p);
            for fam in [
                &self.consumer_lag_messages,
                &self.consumer_dropped_messages,
                &self.inflight_size,
                &self.acked_ahead_size,
                &self.partition_size_bytes,
                &self.segments,
            ] {
                fam.remove(&l);
            }
            self.oldest_unconsumed_message_age_seconds.remove(&l);
            for fam in [
                &self.messages_produced,
                &self.bytes_produced,
                &self.messages_consumed,
                &self.bytes_consumed,
                &self.consumer_corrupt_skipped,
                &self.consume_partition_errors,
                &self.storage_retention_bytes_deleted,
                &self.storage_retention_messages_deleted,
                &self.storage_flush_bytes,
            ] {
                fam.remove(&l);
            }
            for fam in [
                &self.storage_retention_run_duration_seconds,
                &self.storage_flush_duration_seconds,
                &self.storage_fsync_duration_seconds,
            ] {
                fam.0.remove(&l);
            }
            for outcome in ["ok", "error"] {
                self.storage_high_watermark_persist_duration_seconds.0.remove(&PersistLabels {
                    topic: topic.to_owned(),
                    partition: p.to_string(),
                    outcome: outcome.to_owned(),
                });
            }
        }
    }

    /// The cycle observer of partition `p` of `topic`: its series are
    /// resolved once, here, so a commit cycle only touches atomics.
    pub fn cycle_observer(&self, topic: &str, p: u32) -> narad_log::CycleObserver {
        let l = PartitionLabels::new(topic, p);
        let flush = self.storage_flush_duration_seconds.0.get_or_create(&l).clone();
        let fsync = self.storage_fsync_duration_seconds.0.get_or_create(&l).clone();
        let bytes = self.storage_flush_bytes.get_or_create(&l).clone();
        Box::new(move |t: &narad_log::CycleTimings| {
            flush.observe(t.flush.as_secs_f64());
            fsync.observe(t.fsync.as_secs_f64());
            bytes.inc_by(t.bytes);
        })
    }

    /// Records one write of a partition's consumer frontier.
    pub fn frontier_persisted(&self, topic: &str, p: u32, ok: bool, took: std::time::Duration) {
        let l = PersistLabels {
            topic: topic.to_owned(),
            partition: p.to_string(),
            outcome: if ok { "ok" } else { "error" }.to_owned(),
        };
        self.storage_high_watermark_persist_duration_seconds
            .0
            .get_or_create(&l)
            .observe(took.as_secs_f64());
    }
}
