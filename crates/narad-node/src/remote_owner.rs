//! Commits to partitions owned by other nodes: the dispatcher's [`Owner`]
//! over node RPC CommitProduceBatch (op 11), and the owner's side of it
//! (SPEC §7.4, the v3 page's "Commit stage" and "Discarding").
//!
//! The sender puts each record's topic incarnation in the batch's trailing
//! section. An owner from before incarnations refuses that section as
//! trailing bytes (400): the batch goes again without it, and batches to
//! that owner go without ids for [`LEGACY_OWNER_TTL`].
//!
//! The owner answers with a [`CommitAnswer`] (narad-cluster's
//! `commit_answer`, which pins the wire form); what the dispatcher makes of
//! each:
//!
//! | owner's answer | meaning | dispatcher |
//! |---|---|---|
//! | `Committed` (200) | durable, read back, visible | committed |
//! | `IncarnationMismatch` (412) | another incarnation is live there | refused: back to the WAL, re-resolved, not failing |
//! | `NoTopic` (404) | no such topic in the owner's replica | refused (a lagging replica or a delete) |
//! | `NotOwner` (421) | the owner's replica says another node owns it | refused (not the owner): re-resolved, not failing |
//! | `IdsRefused` (400 naming trailing bytes), with ids sent | an owner from before incarnations | sent again without ids |
//! | `Unavailable` (503) | the owner cannot commit now | unavailable: retried, not failing |
//! | anything else, no answer | | failed: probe, then reroute after 3 s |

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_broker::dispatch::core::OwnerId;
use narad_broker::dispatch::resolve::OwnerIds;
use narad_broker::owner::{CommitBatch, CommitError, CommitFuture, Owner, PingFuture};
use narad_clock::ClockRef;
use narad_cluster::Transport;
use narad_cluster::commit_answer::CommitAnswer;
use narad_cluster::rpc::{self, Request};
use narad_meta::MetaStore;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tracing::{info, warn};

/// The most encoded record bytes of one commit to another node: half the
/// 16 MiB stream frame limit (the v3 page's remote commit byte budget).
pub const REMOTE_COMMIT_MAX_BYTES: usize = 8 << 20;

/// How long commits to an owner that refused the incarnation section go
/// without it.
pub const LEGACY_OWNER_TTL: Duration = Duration::from_secs(120);

/// Labels of the remote-commit counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PeerOutcome {
    /// The owner's member id.
    pub peer: String,
    /// `committed`, `incarnation_mismatch`, `not_owner`, `no_topic`, `unavailable`,
    /// `failed`.
    pub outcome: &'static str,
}

/// Labels by peer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PeerLabel {
    /// The owner's member id.
    pub peer: String,
}

/// Seconds from sending a commit to its owner's answer: 100 µs to ~26 s.
fn commit_seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 19))
}

/// The remote owner's metrics.
#[derive(Debug, Clone)]
pub struct RemoteCommitMetrics {
    commits: Family<PeerOutcome, Counter>,
    records: Family<PeerLabel, Counter>,
    bytes: Family<PeerLabel, Counter>,
    legacy: Family<PeerLabel, Counter>,
    seconds: Family<PeerLabel, Histogram, fn() -> Histogram>,
}

impl Default for RemoteCommitMetrics {
    fn default() -> Self {
        RemoteCommitMetrics {
            commits: Family::default(),
            records: Family::default(),
            bytes: Family::default(),
            legacy: Family::default(),
            seconds: Family::new_with_constructor(commit_seconds),
        }
    }
}

impl RemoteCommitMetrics {
    /// Registers the families.
    pub fn new(registry: &mut Registry) -> Self {
        let m = RemoteCommitMetrics::default();
        registry.register(
            "ingress_dispatch_remote_commit_seconds",
            "Time from sending a commit to another node to its answer (any answer), by peer",
            m.seconds.clone(),
        );
        registry.register(
            "ingress_dispatch_remote_commits",
            "Commits to partitions owned by other nodes, by peer and outcome",
            m.commits.clone(),
        );
        registry.register(
            "ingress_dispatch_remote_records",
            "Records committed on other nodes, by peer",
            m.records.clone(),
        );
        registry.register(
            "ingress_dispatch_remote_bytes",
            "Payload and key bytes committed on other nodes, by peer",
            m.bytes.clone(),
        );
        registry.register(
            "ingress_dispatch_legacy_owner_fallbacks",
            "Commits sent again without topic incarnation ids to an owner that refused them",
            m.legacy.clone(),
        );
        m
    }
}

/// Owners that refused the incarnation section, remembered for
/// [`LEGACY_OWNER_TTL`] each (then the section is tried again: the owner
/// may have been upgraded).
#[derive(Debug)]
pub struct LegacyOwners {
    clock: ClockRef,
    /// Until when (monotonic) each one goes without ids.
    until: Mutex<HashMap<String, Duration>>,
}

impl LegacyOwners {
    /// None remembered yet.
    pub fn new(clock: ClockRef) -> Self {
        LegacyOwners { clock, until: Mutex::new(HashMap::new()) }
    }

    /// Whether batches to `member` go without ids now.
    pub fn is_legacy(&self, member: &str) -> bool {
        let now = self.clock.mono();
        let mut l = self.until.lock().unwrap_or_else(|p| p.into_inner());
        match l.get(member) {
            Some(&until) if until > now => true,
            Some(_) => {
                l.remove(member);
                false
            }
            None => false,
        }
    }

    /// `member` refused the section just now.
    pub fn refused(&self, member: &str) {
        let until = self.clock.mono() + LEGACY_OWNER_TTL;
        self.until.lock().unwrap_or_else(|p| p.into_inner()).insert(member.to_owned(), until);
    }
}

/// Commits batches on other nodes over node RPC.
#[derive(Debug)]
pub struct RemoteOwner {
    meta: Arc<MetaStore>,
    transport: Arc<Transport>,
    ids: Arc<OwnerIds>,
    legacy: LegacyOwners,
    metrics: RemoteCommitMetrics,
}

impl RemoteOwner {
    /// A remote owner reaching members of `meta` through `transport`.
    pub fn new(
        meta: Arc<MetaStore>,
        transport: Arc<Transport>,
        ids: Arc<OwnerIds>,
        clock: ClockRef,
        metrics: RemoteCommitMetrics,
    ) -> Self {
        RemoteOwner { meta, transport, ids, legacy: LegacyOwners::new(clock), metrics }
    }

    fn mark_legacy(&self, member: &str) {
        self.legacy.refused(member);
        self.metrics.legacy.get_or_create(&PeerLabel { peer: member.to_owned() }).inc();
    }

    fn count(&self, member: &str, outcome: &'static str) {
        let labels = PeerOutcome { peer: member.to_owned(), outcome };
        self.metrics.commits.get_or_create(&labels).inc();
    }

    /// Pings `owner` over its connection (dialled if need be), within the
    /// transport's liveness bound.
    async fn ping_on(self: Arc<Self>, owner: OwnerId) -> Result<(), String> {
        let member =
            self.ids.name(owner).ok_or_else(|| format!("owner {owner} has no member id"))?;
        let addr = crate::cluster_node::member_addr(&self.meta, &member)?;
        let peer = self.transport.peer(addr, narad_cluster::tls::DEFAULT_SERVER_NAME);
        match tokio::time::timeout(narad_cluster::limits::LIVENESS_PROBE_TIMEOUT, peer.ping()).await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("{member}: {e}")),
            Err(_) => Err(format!("{member}: no pong within the liveness bound")),
        }
    }

    async fn commit_on(
        self: Arc<Self>,
        owner: OwnerId,
        batch: CommitBatch,
    ) -> Result<(), CommitError> {
        let member = self
            .ids
            .name(owner)
            .ok_or_else(|| CommitError::Failed(format!("owner {owner} has no member id")))?;
        let addr =
            crate::cluster_node::member_addr(&self.meta, &member).map_err(CommitError::Failed)?;
        let with_ids = !self.legacy.is_legacy(&member);
        let peer = self.transport.peer(addr, narad_cluster::tls::DEFAULT_SERVER_NAME);
        let request = encode_batch(&batch, with_ids);
        let sent = std::time::Instant::now();
        let mut reply = peer.call_watched(&request, request.timeout()).await;
        if with_ids
            && batch.records.iter().any(|r| r.incarnation.is_some())
            && reply
                .as_ref()
                .is_ok_and(|r| matches!(CommitAnswer::from_reply(r), CommitAnswer::IdsRefused(_)))
        {
            warn!(peer = %member, topic = %batch.topic, partition = batch.partition,
                "owner refused the topic incarnation section (an older release); sending without ids for 2 minutes");
            self.mark_legacy(&member);
            let again = encode_batch(&batch, false);
            reply = peer.call_watched(&again, again.timeout()).await;
        }
        if reply.is_ok() {
            let label = PeerLabel { peer: member.clone() };
            self.metrics.seconds.get_or_create(&label).observe(sent.elapsed().as_secs_f64());
        }
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                self.count(&member, "failed");
                return Err(CommitError::Failed(format!("{member}: {e}")));
            }
        };
        match CommitAnswer::from_reply(&reply) {
            CommitAnswer::Committed { offsets, .. } => {
                self.count(&member, "committed");
                if let Some(&last) = offsets.iter().max() {
                    let incarnation = batch
                        .records
                        .iter()
                        .find_map(|r| r.incarnation)
                        .or_else(|| self.meta.topic(&batch.topic).map(|t| t.incarnation()));
                    if let Some(incarnation) = incarnation {
                        crate::offsets_seen::global().saw(
                            &batch.topic,
                            incarnation,
                            batch.partition,
                            last,
                        );
                    }
                }
                let label = PeerLabel { peer: member.clone() };
                self.metrics.records.get_or_create(&label).inc_by(batch.records.len() as u64);
                let bytes: usize = batch
                    .records
                    .iter()
                    .map(|r| r.payload.len() + r.key.as_ref().map_or(0, |k| k.len()))
                    .sum();
                self.metrics.bytes.get_or_create(&label).inc_by(bytes as u64);
                Ok(())
            }
            CommitAnswer::IncarnationMismatch(why) => {
                self.count(&member, "incarnation_mismatch");
                Err(CommitError::Refused(format!("{member} answered 412: {why}")))
            }
            CommitAnswer::NotOwner(why) => {
                self.count(&member, "not_owner");
                Err(CommitError::NotOwner(format!("{member} answered 421: {why}")))
            }
            CommitAnswer::NoTopic(why) => {
                self.count(&member, "no_topic");
                Err(CommitError::Refused(format!("{member} answered 404: {why}")))
            }
            CommitAnswer::Unavailable(why) => {
                self.count(&member, "unavailable");
                Err(CommitError::Unavailable(format!("{member} answered 503: {why}")))
            }
            CommitAnswer::Frozen(why) => {
                self.count(&member, "frozen");
                Err(CommitError::Frozen(format!("{member} answered 423: {why}")))
            }
            other @ (CommitAnswer::IdsRefused(_)
            | CommitAnswer::BadRequest(_)
            | CommitAnswer::Failed { .. }) => {
                self.count(&member, "failed");
                Err(CommitError::Failed(format!(
                    "{member} answered {}: {}",
                    other.status(),
                    other.message()
                )))
            }
        }
    }
}

// A commit is a watched call (`Peer::call_watched`): the owner is pinged
// every second while it runs, and an owner that does not answer a ping
// within the transport's liveness bound (killed, its machine gone) fails
// the commit at once instead of after the commit's 30 s budget, so its
// records reroute after the 3 s grace. A slow but live owner answers pings
// (they travel on their own stream) and its commit goes on. A commit
// abandoned this way may still land (a duplicate, never a loss: its
// records stay in the WAL). The failure also makes the owner suspect for
// the node's forwarded consumes and acks (`narad_cluster::suspect`).

/// The CommitProduceBatch of `batch`, with each record's incarnation (the
/// trailing section) when `with_ids`.
fn encode_batch(batch: &CommitBatch, with_ids: bool) -> Request {
    Request::CommitProduceBatch(
        batch
            .records
            .iter()
            .map(|r| rpc::CommitRecord {
                topic: batch.topic.to_string(),
                key: r.key.clone(),
                // Partitions are below 2^31 (topic creation bounds them).
                partition: batch.partition as i32,
                payload: r.payload.clone(),
                created_at: i64::try_from(r.accepted_at_ms).unwrap_or(i64::MAX),
                incarnation: if with_ids { r.incarnation.and_then(NonZeroU64::new) } else { None },
            })
            .collect(),
    )
}

/// The owner behind an [`Arc`] (the trait is implemented on the handle, as
/// each commit runs as its own task).
#[derive(Debug, Clone)]
pub struct RemoteOwnerRef(pub Arc<RemoteOwner>);

impl Owner for RemoteOwnerRef {
    fn commit(&self, owner: OwnerId, batch: CommitBatch) -> CommitFuture {
        Box::pin(self.0.clone().commit_on(owner, batch))
    }

    fn max_batch_bytes(&self, _owner: OwnerId) -> Option<usize> {
        Some(REMOTE_COMMIT_MAX_BYTES)
    }

    fn ping(&self, owner: OwnerId) -> PingFuture {
        Box::pin(self.0.clone().ping_on(owner))
    }
}

/// Logs an owner-side refusal of records of another incarnation (info: the
/// owner answered; a delete and recreate or a lagging replica explains it).
pub(crate) fn log_incarnation_refusal(topic: &str, sent: u64, live: u64) {
    info!(
        topic,
        sent_incarnation = sent,
        live_incarnation = live,
        "refusing commit records accepted for another topic incarnation"
    );
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use narad_broker::owner::BatchRecord;
    use narad_clock::ManualClock;

    use super::*;

    #[test]
    fn an_owner_that_refused_ids_gets_none_for_two_minutes_then_is_tried_again() {
        let clock = ManualClock::new(0);
        let l = LegacyOwners::new(Arc::new(clock.clone()));
        assert!(!l.is_legacy("n2"));
        l.refused("n2");
        assert!(l.is_legacy("n2") && !l.is_legacy("n3"));
        clock.advance(LEGACY_OWNER_TTL - Duration::from_millis(1));
        assert!(l.is_legacy("n2"), "still within the 2 minutes");
        clock.advance(Duration::from_millis(1));
        assert!(!l.is_legacy("n2"), "tried with ids again after 2 minutes");
    }

    #[test]
    fn a_batch_carries_ids_only_when_asked_and_a_refusal_is_recognised() {
        let batch = CommitBatch {
            topic: "t".into(),
            partition: 2,
            records: vec![BatchRecord {
                incarnation: Some(7),
                key: Some(Bytes::from_static(b"k")),
                payload: Bytes::from_static(b"{}"),
                accepted_at_ms: 5,
            }],
        };
        let Request::CommitProduceBatch(with) = encode_batch(&batch, true) else { panic!() };
        let Request::CommitProduceBatch(without) = encode_batch(&batch, false) else { panic!() };
        assert_eq!(with[0].incarnation.map(|i| i.get()), Some(7));
        assert_eq!(without[0].incarnation, None);
        assert_eq!((with[0].partition, with[0].created_at), (2, 5));
        // Without ids the bytes are a release from before incarnations'.
        let old = Request::CommitProduceBatch(without).encode();
        assert!(Request::CommitProduceBatch(with).encode().len() > old.len());
    }
}
