//! The owner side of a commit, reached through one trait so the dispatcher
//! never knows whether an owner is this node or another one.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use narad_log::{CommitRecord, LogError};
use narad_meta::MetaStore;
use tracing::warn;

use crate::dispatch::core::OwnerId;
use crate::dispatch::resolve::LOCAL_OWNER;
use crate::error::BrokerError;
use crate::fence::{Fences, PartitionKey, Shut};
use crate::metrics::{BrokerMetrics, PartitionLabels};
use crate::topics::Topics;

/// One record of a commit batch.
#[derive(Debug, Clone)]
pub struct BatchRecord {
    /// The topic incarnation the record was accepted under (if it has one).
    pub incarnation: Option<u64>,
    /// The key.
    pub key: Option<Bytes>,
    /// The payload.
    pub payload: Bytes,
    /// When it was accepted (its WAL record's time), Unix milliseconds; 0
    /// when unknown. Informational (the commit time is the owner's).
    pub accepted_at_ms: u64,
}

/// A batch of records for one partition.
#[derive(Debug, Clone)]
pub struct CommitBatch {
    /// Topic name.
    pub topic: Arc<str>,
    /// Partition.
    pub partition: u32,
    /// The records, in WAL order.
    pub records: Vec<BatchRecord>,
}

impl CommitBatch {
    /// The batch that commits `items` (an order's records, in WAL order)
    /// into `dest`.
    pub fn of(dest: &crate::dispatch::core::Dest, items: &[crate::dispatch::core::Item]) -> Self {
        CommitBatch {
            topic: dest.topic.clone(),
            partition: dest.partition,
            records: items
                .iter()
                .map(|i| BatchRecord {
                    incarnation: i.record.incarnation,
                    key: i.record.key.clone(),
                    payload: i.record.payload.clone(),
                    accepted_at_ms: i.record.accepted_at_ms,
                })
                .collect(),
        }
    }
}

/// Why a commit did not land.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    /// The owner answered but holds another topic incarnation, or no such
    /// topic: the records go back to the WAL and are resolved again, and the
    /// destination is not marked failing.
    #[error("commit refused: {0}")]
    Refused(String),
    /// The owner's replica says another node owns the partition (a lagging
    /// replica, a move): like [`CommitError::Refused`], the records are
    /// resolved again, the destination not marked failing.
    #[error("commit refused, not the owner: {0}")]
    NotOwner(String),
    /// The commit failed (storage error, unreachable owner, timeout).
    #[error("commit failed: {0}")]
    Failed(String),
    /// The owner cannot take commits for now (it is shutting down): a
    /// transient failure, logged quietly; the records stay in the WAL.
    #[error("owner unavailable: {0}")]
    Unavailable(String),
    /// The partition is frozen while it moves (SPEC §7.3): the owner
    /// answered, so the destination is not failing; the records go back to
    /// the WAL and are resolved again after the refusal back-off, to this
    /// owner while the move runs and to the new one once it flipped. Never
    /// a reason to reroute to a sibling partition.
    #[error("commit refused, partition frozen: {0}")]
    Frozen(String),
}

impl CommitError {
    /// What the dispatcher makes of it: an answer from the owner that
    /// refuses (another incarnation, another owner, a freeze) is a refusal
    /// (resolved again, not failing); anything else is a failure.
    pub fn outcome(&self) -> crate::dispatch::core::Outcome {
        use crate::dispatch::core::Outcome;
        match self {
            CommitError::Refused(_) | CommitError::NotOwner(_) | CommitError::Frozen(_) => {
                Outcome::Refused
            }
            CommitError::Failed(_) | CommitError::Unavailable(_) => Outcome::Failed,
        }
    }
}

/// A boxed commit future.
pub type CommitFuture = Pin<Box<dyn Future<Output = Result<(), CommitError>> + Send>>;

/// Where commits go.
pub trait Owner: Send + Sync + Debug {
    /// Commits `batch` durably on `owner`: appended, fsynced, read back and
    /// visible when the future resolves `Ok`.
    fn commit(&self, owner: OwnerId, batch: CommitBatch) -> CommitFuture;

    /// The byte budget of one commit to `owner`, when tighter than the
    /// dispatcher's own cap for every commit
    /// ([`crate::limits::DISPATCH_COMMIT_MAX_BYTES`]); `None`: that cap.
    fn max_batch_bytes(&self, owner: OwnerId) -> Option<usize>;

    /// Whether `owner` answers at all: a failing destination's owner is
    /// pinged instead of being sent records. `Err` names why not. The
    /// default answers at once (an owner in this process); an owner across
    /// the network must override it.
    fn ping(&self, owner: OwnerId) -> PingFuture {
        let _ = owner;
        Box::pin(async { Ok(()) })
    }
}

/// A boxed ping future.
pub type PingFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Commits into this node's partition logs, each through its partition's
/// gate ([`Fences`]).
#[derive(Debug)]
pub struct LocalOwner {
    meta: Arc<MetaStore>,
    topics: Arc<Topics>,
    metrics: Arc<BrokerMetrics>,
    fences: Arc<Fences>,
}

impl LocalOwner {
    /// The local owner, every gate open.
    pub fn new(meta: Arc<MetaStore>, topics: Arc<Topics>, metrics: Arc<BrokerMetrics>) -> Self {
        LocalOwner { meta, topics, metrics, fences: Arc::new(Fences::new()) }
    }

    /// The gates every commit passes (freezes and moves shut them).
    pub fn fences(&self) -> &Arc<Fences> {
        &self.fences
    }

    /// Freezes partition `partition` of the live incarnation of `topic`
    /// for a move to `target` until `deadline_ms` (wall clock): waits for
    /// the commits in flight, refuses every later one as
    /// [`CommitError::Frozen`], and returns the high watermark, which stays
    /// final while the partition is frozen (SPEC §7.3, PrepareHandoff).
    pub fn freeze(
        &self,
        topic: &str,
        partition: u32,
        target: &str,
        deadline_ms: u64,
    ) -> Result<u64, BrokerError> {
        let t = self.meta.topic(topic).ok_or(BrokerError::TopicNotFound)?;
        if partition >= t.partitions() {
            return Err(BrokerError::Invalid(format!(
                "partition {partition} out of range for topic {topic}"
            )));
        }
        let part = self.topics.partition(&t, partition)?;
        let key = PartitionKey::new(topic, t.incarnation(), partition);
        self.fences
            .freeze(&key, target, deadline_ms, || part.log.high_watermark())
            .map_err(|e| BrokerError::Invalid(e.to_string()))
    }

    /// The commit itself (blocking: append, fsync, read back); the offsets
    /// the records got.
    pub fn commit_blocking(
        &self,
        batch: CommitBatch,
    ) -> Result<narad_log::CommitOutcome, CommitError> {
        let Some(topic) = self.meta.topic(&batch.topic) else {
            return Err(CommitError::Refused(format!("topic {} does not exist", batch.topic)));
        };
        // The incarnation check runs here, before the log of the live
        // incarnation is resolved; a delete in between closes that log, so
        // the commit then fails as Closed and nothing lands in a new one.
        if let Some(other) =
            batch.records.iter().filter_map(|r| r.incarnation).find(|id| *id != topic.incarnation())
        {
            return Err(CommitError::Refused(format!(
                "records accepted for incarnation {other} of topic {}, which is now incarnation {}",
                batch.topic,
                topic.incarnation()
            )));
        }
        if batch.partition >= topic.partitions() {
            return Err(CommitError::Refused(format!(
                "partition {} out of range for topic {}",
                batch.partition, batch.topic
            )));
        }
        let part = match self.topics.partition(&topic, batch.partition) {
            Ok(p) => p,
            Err(BrokerError::TopicNotFound) => {
                return Err(CommitError::Refused(format!("topic {} was removed", batch.topic)));
            }
            Err(e) => {
                self.metrics.error("messaging", "append");
                return Err(CommitError::Failed(e.to_string()));
            }
        };
        let count = batch.records.len() as u64;
        let bytes: u64 = batch.records.iter().map(|r| r.payload.len() as u64).sum();
        let records = batch
            .records
            .into_iter()
            .map(|r| CommitRecord { key: r.key, payload: r.payload })
            .collect();
        let key = PartitionKey::new(&batch.topic, topic.incarnation(), batch.partition);
        let committed = match self.fences.pass(&key, || part.log.commit(records)) {
            Ok(c) => c,
            Err(shut @ Shut::Frozen { .. }) => return Err(CommitError::Frozen(shut.to_string())),
            Err(shut @ Shut::Moved { .. }) => return Err(CommitError::NotOwner(shut.to_string())),
        };
        match committed {
            Ok(outcome) => {
                let l = PartitionLabels::new(&batch.topic, batch.partition);
                self.metrics.messages_produced.get_or_create(&l).inc_by(count);
                self.metrics.bytes_produced.get_or_create(&l).inc_by(bytes);
                Ok(outcome)
            }
            Err(LogError::Closed) => {
                Err(CommitError::Refused(format!("topic {} was deleted", batch.topic)))
            }
            Err(e) => {
                self.metrics.error("messaging", "commit_boundary");
                warn!(topic = %batch.topic, partition = batch.partition, error = %e, "durable commit failed");
                Err(CommitError::Failed(e.to_string()))
            }
        }
    }
}

impl Owner for Arc<LocalOwner> {
    fn commit(&self, _owner: OwnerId, batch: CommitBatch) -> CommitFuture {
        let this = self.clone();
        Box::pin(async move {
            match tokio::task::spawn_blocking(move || this.commit_blocking(batch)).await {
                Ok(r) => r.map(|_| ()),
                Err(e) => Err(CommitError::Failed(format!("commit task failed: {e}"))),
            }
        })
    }

    fn max_batch_bytes(&self, _owner: OwnerId) -> Option<usize> {
        None
    }
}

/// The owner of a cluster node: commits for [`LOCAL_OWNER`] go into this
/// node's partition logs, every other owner's through `remote` (node RPC).
#[derive(Debug)]
pub struct RoutedOwner {
    local: Arc<LocalOwner>,
    remote: Arc<dyn Owner>,
}

impl RoutedOwner {
    /// Local commits through `local`, the others through `remote`.
    pub fn new(local: Arc<LocalOwner>, remote: Arc<dyn Owner>) -> Self {
        RoutedOwner { local, remote }
    }
}

impl Owner for RoutedOwner {
    fn commit(&self, owner: OwnerId, batch: CommitBatch) -> CommitFuture {
        if owner == LOCAL_OWNER {
            self.local.commit(owner, batch)
        } else {
            self.remote.commit(owner, batch)
        }
    }

    fn max_batch_bytes(&self, owner: OwnerId) -> Option<usize> {
        if owner == LOCAL_OWNER { None } else { self.remote.max_batch_bytes(owner) }
    }

    fn ping(&self, owner: OwnerId) -> PingFuture {
        if owner == LOCAL_OWNER { self.local.ping(owner) } else { self.remote.ping(owner) }
    }
}
