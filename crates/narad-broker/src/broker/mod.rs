//! The broker on one node: wiring of the metastore, the ingress WAL, the
//! dispatcher, the partition logs and the consumer state, and the
//! operations the HTTP layer calls.
//!
//! Start-up order: metastore → partition logs (recovered; damage stops the
//! start) → WAL (recovered) → dispatcher → background tasks. Shutdown:
//! refuse new work → stop the dispatcher (commits in flight finish) → close
//! the WAL (final checkpoint sync) → persist consumer frontiers → close logs.
//!
//! # Files
//!
//! [`Broker`] is one struct, declared here; each file holds one
//! `impl Broker` block for one part of its job and is where the fields
//! named beside it are worked on. `config`, `clock`, `meta`, `topics` and
//! `metrics` are set at open and shared by every file.
//!
//! | File | What it holds | Fields |
//! |---|---|---|
//! | `mod.rs` | the struct, accessors, `check_running`, the produce hold (`release_produce`), the helpers every file uses (`blocking`, `unix_seconds`) | `produce_held` |
//! | `open.rs` | [`BrokerConfig`], [`Registration`], [`Routing`]; open, drain, shutdown | `dispatcher`, `fanout_task`, `stop`, `shutting_down` |
//! | `produce.rs` | [`ProduceRecord`]; checking a produce and appending it to the WAL | `wal`, `round_robin` |
//! | `consume.rs` | [`Delivered`], [`AckAction`]; leases, long polls, replay, ack/extend/nack | `draining` (set by `open.rs`'s `begin_drain`) |
//! | `admin.rs` | create, alter, delete and read topics; placing new partitions | — |
//! | `links.rs` | parent/child links: attach, detach, fan-out lag, the owners' side of link RPCs | `links`, `fanout` |
//! | `serving.rs` | what this node serves and answers to other nodes: owned partitions, peer commits, orphan directories | `local_owner`, `unconfirmed_orphans` |
//! | `leftovers.rs` | deleting this node's copy of a partition whose ownership flipped away, once the leader confirmed the replica | — |
//! | `move_cursors.rs` | a moving parent partition's fan-out cursor files: read at the freeze, stored on the destination before the flip | — |
//! | `housekeeping.rs` | background tasks: frontiers, lease expiry, retention, idle logs, replicated deletes | `tasks`, `frontier_moves_seen` |
//! | `stats.rs` | [`PartitionStats`] and the metrics polls | `wal_seen`, `dir_walk_skip` |
//!
//! Rules every file keeps:
//! - An operation that starts new work calls `check_running` first: once
//!   `shutting_down` is set, nothing new reaches the WAL, the logs or the
//!   metastore.
//! - File and metastore I/O runs on the blocking pool (`blocking`), never
//!   on a runtime worker.
//! - Locks are taken poison-tolerant (`unwrap_or_else(|p| p.into_inner())`):
//!   a panicked holder does not wedge the broker.

mod admin;
mod consume;
mod housekeeping;
mod leftovers;
mod links;
mod move_cursors;
mod moves;
mod open;
mod produce;
mod removed;
mod serving;
mod stats;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use narad_clock::ClockRef;
use narad_meta::MetaStore;
use narad_wal::Wal;
use tokio::task::JoinHandle;

use crate::dispatch::driver::Dispatcher;
use crate::error::BrokerError;
use crate::fanout::FanoutRunner;
use crate::fanout::peers::LinkPeers;
use crate::metrics::BrokerMetrics;
use crate::owner::LocalOwner;
use crate::partition::RoundRobin;
use crate::topics::Topics;

pub use consume::{AckAction, Delivered};
pub use moves::{FrozenSource, MoveListing, steps as move_steps};
pub use open::{BrokerConfig, Registration, Routing};
pub use produce::ProduceRecord;
pub use stats::PartitionStats;

/// The broker.
#[derive(Debug)]
pub struct Broker {
    config: BrokerConfig,
    clock: ClockRef,
    meta: Arc<MetaStore>,
    wal: Arc<Wal>,
    topics: Arc<Topics>,
    metrics: Arc<BrokerMetrics>,
    round_robin: RoundRobin,
    /// Commits into this node's partition logs (the dispatcher's local
    /// owner, and the owner side of other nodes' commits).
    local_owner: Arc<LocalOwner>,
    dispatcher: Mutex<Option<Dispatcher>>,
    fanout: Arc<FanoutRunner>,
    fanout_task: Mutex<Option<JoinHandle<()>>>,
    /// The owners of a parent's other partitions (cluster only).
    links: Option<Arc<dyn LinkPeers>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    stop: tokio::sync::watch::Sender<bool>,
    shutting_down: AtomicBool,
    /// Produce is refused (503 not ready) until [`Broker::release_produce`]:
    /// set at open on a cluster node, whose replica may be stale until it
    /// has reached its group's leader (a node removed from the cluster
    /// while it was away never does, and would otherwise take records
    /// into partitions that are no longer its own).
    produce_held: AtomicBool,
    /// Long polls return at once (the HTTP layer is draining).
    draining: AtomicBool,
    /// The WAL's counters at the last metrics poll: the next poll adds the
    /// difference to the `narad_ingress_wal_*_total` counters, and counts
    /// new failed segment preparations as
    /// `narad_errors{component="ingress_wal",kind="prepare"}` and failed
    /// zero-runway top-ups as `kind="runway"`.
    wal_seen: Mutex<narad_wal::WalStats>,
    /// Metric polls to skip before the next walk of the data directory.
    dir_walk_skip: AtomicU32,
    /// [`Topics::frontier_moves`] when the last frontier pass began: while
    /// it has not changed, the pass looks at no partition.
    frontier_moves_seen: AtomicU64,
    /// See [`Broker::unconfirmed_orphans`].
    unconfirmed_orphans: Mutex<std::collections::BTreeSet<String>>,
}

fn join_err(e: tokio::task::JoinError) -> BrokerError {
    BrokerError::internal("background task", e)
}

/// Runs `f` on the blocking pool (file and metastore I/O).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BrokerError> + Send + 'static,
) -> Result<T, BrokerError> {
    tokio::task::spawn_blocking(f).await.map_err(join_err)?
}

impl Broker {
    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.config.node_id
    }

    /// The metastore.
    pub fn meta(&self) -> &Arc<MetaStore> {
        &self.meta
    }

    /// The clock the broker stamps and measures with.
    pub fn clock(&self) -> &ClockRef {
        &self.clock
    }

    /// The ingress WAL.
    pub fn wal(&self) -> &Arc<Wal> {
        &self.wal
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<BrokerMetrics> {
        &self.metrics
    }

    fn check_running(&self) -> Result<(), BrokerError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(BrokerError::ShuttingDown);
        }
        Ok(())
    }

    /// Lets produce in: the node layer calls this once this cluster node
    /// has reached its group's leader since it started (a single node
    /// never holds produce). Idempotent; never closed again (a node that
    /// loses its leader later keeps taking produces into its WAL).
    pub fn release_produce(&self) {
        if self.produce_held.swap(false, Ordering::AcqRel) {
            tracing::info!("the raft leader was reached: produce accepted from now on");
        }
    }

    /// Whether produce is held (see [`Broker::release_produce`]).
    pub fn produce_held(&self) -> bool {
        self.produce_held.load(Ordering::Acquire)
    }

    /// [`Broker::check_running`] for a produce: also refused while
    /// produce is held (counted as `produce_rejections{topic,reason="not_ready"}`).
    fn check_accepting(&self, topic: &str) -> Result<(), BrokerError> {
        self.check_running()?;
        if self.produce_held() {
            self.metrics
                .produce_rejections
                .get_or_create(&crate::metrics::RejectionLabels {
                    topic: topic.into(),
                    reason: "not_ready".into(),
                })
                .inc();
            return Err(BrokerError::LeaderNotReached);
        }
        Ok(())
    }
}

/// The wall clock in Unix seconds (heartbeat times are kept in those).
fn unix_seconds(clock: &dyn narad_clock::Clock) -> i64 {
    (clock.wall_ms() / 1000) as i64
}
