//! The control plane's metrics (SPEC §9): `narad_raft_term`,
//! `narad_raft_leader` (1 while this node leads), `narad_raft_stopped` (1
//! once Raft's core stopped on a fatal error), `narad_raft_commit_index`,
//! `narad_raft_applied_index` (Raft log indexes) and
//! `narad_raft_apply_duration_seconds` (one committed entry applied to the
//! metastore, fsync included).

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The Raft metrics of one node.
#[derive(Debug, Clone)]
pub struct RaftMetrics {
    /// `raft_term`.
    pub term: Gauge,
    /// `raft_leader`.
    pub leader: Gauge,
    /// `raft_stopped`.
    pub stopped: Gauge,
    /// `raft_commit_index`.
    pub commit_index: Gauge,
    /// `raft_applied_index`.
    pub applied_index: Gauge,
    /// `raft_apply_duration_seconds`.
    pub apply_duration: Histogram,
}

impl Default for RaftMetrics {
    fn default() -> Self {
        RaftMetrics {
            term: Gauge::default(),
            leader: Gauge::default(),
            stopped: Gauge::default(),
            commit_index: Gauge::default(),
            applied_index: Gauge::default(),
            // 50 µs .. ~3 s.
            apply_duration: Histogram::new(exponential_buckets(0.00005, 2.0, 16)),
        }
    }
}

impl RaftMetrics {
    /// Adds the metrics to `registry` (which carries the `narad` prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register("raft_term", "The Raft term this node is in", self.term.clone());
        registry.register(
            "raft_leader",
            "1 while this node is the Raft leader",
            self.leader.clone(),
        );
        registry.register(
            "raft_stopped",
            "1 once Raft's core stopped on a fatal error (a failed log or state machine write): \
             the node is not ready and refuses metadata writes until it restarts",
            self.stopped.clone(),
        );
        registry.register(
            "raft_commit_index",
            "The highest Raft log index known committed",
            self.commit_index.clone(),
        );
        registry.register(
            "raft_applied_index",
            "The highest Raft log index applied to the metastore",
            self.applied_index.clone(),
        );
        registry.register(
            "raft_apply_duration_seconds",
            "Time to apply one committed Raft entry to the metastore",
            self.apply_duration.clone(),
        );
    }
}
