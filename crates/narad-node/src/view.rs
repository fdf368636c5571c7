//! What the HTTP API sees of the cluster: the [`ClusterView`] the server
//! holds (a cluster node, [`crate::cluster_node::ClusterNode`], implements
//! it; `None` on a single node), the JSON of `GET /v1/cluster/status`, and
//! partition figures asked of their owners ([`with_owner_figures`]).

use std::time::Duration;

use narad_broker::ownership::PartitionStatus;
use narad_broker::{AckAction, PartitionStats};
use serde::Serialize;

use crate::forward::{ConsumeAsk, PartitionRoute, PeerAnswer};

/// `mode` of the status: one node with no peers, or a Raft group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ClusterMode {
    /// No peers configured: the metastore applies directly.
    Single,
    /// Peers configured: the metastore replicates through Raft.
    Cluster,
}

/// This node's Raft role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ClusterRole {
    /// It leads (a single node always does).
    Leader,
    /// A voter following a leader.
    Follower,
    /// A voter asking for votes.
    Candidate,
    /// A non-voter catching up (e.g. joining).
    Learner,
    /// Raft's core stopped on a fatal error (see `stopped`): this node
    /// neither follows nor votes until it restarts.
    Stopped,
}

/// `GET /v1/cluster/status`: this node's view of the control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterStatus {
    /// This node's id.
    pub node_id: String,
    /// `single` or `cluster`.
    pub mode: ClusterMode,
    /// This node's role.
    pub role: ClusterRole,
    /// The Raft term (0 on a single node).
    pub term: u64,
    /// The leader's node id (`null` while none is known).
    pub leader: Option<String>,
    /// The highest committed Raft log index (a single node: its applied
    /// index).
    pub commit_index: u64,
    /// The applied index: a cluster node's Raft log index it applied (compare
    /// with `commit_index`); a single node's metastore applied index.
    pub applied_index: u64,
    /// The voters' node ids.
    pub voters: Vec<String>,
    /// The learners' node ids.
    pub learners: Vec<String>,
    /// Why this node's Raft core stopped (role `stopped`), e.g. a failed
    /// log write on a full disk; `null` while it runs.
    pub stopped: Option<String>,
}

impl ClusterStatus {
    /// The status of a single node (no peers): it leads itself, term 0,
    /// committed = applied = the metastore's applied index.
    pub fn single(node_id: &str, applied_index: u64) -> ClusterStatus {
        ClusterStatus {
            node_id: node_id.to_owned(),
            mode: ClusterMode::Single,
            role: ClusterRole::Leader,
            term: 0,
            leader: Some(node_id.to_owned()),
            commit_index: applied_index,
            applied_index,
            voters: vec![node_id.to_owned()],
            learners: Vec::new(),
            stopped: None,
        }
    }
}

/// The control plane as the HTTP API sees it. The cluster's wiring
/// implements it; the server holds it as `Option<Arc<dyn ClusterView>>`
/// (`None`: a single node, answered with [`ClusterStatus::single`]).
pub trait ClusterView: Send + Sync + std::fmt::Debug {
    /// This node's current view (cheap, non-blocking: served on the async
    /// runtime).
    fn status(&self) -> ClusterStatus;

    /// Why this node's control plane stopped on a fatal error (`None`: it
    /// runs). Makes `/readyz` answer 503.
    fn control_plane_stopped(&self) -> Option<String> {
        None
    }

    /// The partition moves this node runs as their destination, with where
    /// each is (empty on a single node).
    fn move_progress(&self) -> Vec<crate::moves::MoveProgress> {
        Vec::new()
    }

    /// What this node and every other alive member have seen of other
    /// owners' offsets (node RPC op 40, [`crate::offsets_seen`]), with the
    /// members that did not answer. Nothing on a single node.
    fn known_offsets(&self) -> BoxFuture<'_, (Vec<crate::offsets_seen::KnownOffset>, Vec<String>)> {
        Box::pin(async { (Vec::new(), Vec::new()) })
    }

    /// The figures of a partition as its owner `owner` has them, for the
    /// topic's incarnation `incarnation` (node RPC op 8; an `Err` says why
    /// the owner did not answer).
    fn owner_partition_stats<'a>(
        &'a self,
        owner: &'a str,
        topic: &'a str,
        incarnation: u64,
        partition: u32,
    ) -> BoxFuture<'a, Result<PartitionStats, String>>;

    /// Where `partition` of `topic` is served (from the replicated
    /// assignments and membership).
    fn route(&self, topic: &str, partition: u32) -> PartitionRoute;

    /// The other alive members that own partitions of `topic`, each once.
    fn serving_peers(&self, topic: &str) -> Vec<String>;

    /// Forwards consume `ask` to partition owner `member` (node RPC op 2)
    /// and waits at most `timeout` for its answer; `Err` says why there is
    /// none. A member that cannot be reached (the call failed on a dial, a
    /// timeout, a lost connection or an unanswered ping), or that is
    /// suspect because an earlier call did and it has not answered since,
    /// is answered here at once as if it had said 503 `partition owner N
    /// is unreachable; retry later`, and is left out of
    /// [`ClusterView::serving_peers`] until it answers a ping. A forwarded
    /// consume whose caller goes away is stopped on the owner, and what it
    /// leased is given back (`forwarded_consume`).
    fn consume_at<'a>(
        &'a self,
        member: &'a str,
        ask: ConsumeAsk,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<PeerAnswer, String>>;

    /// Forwards the ack, extend or nack of receipt `(partition, offset,
    /// nonce)` of `topic` to its owner `member` (node RPC op 3, 18 or 19),
    /// within the op's reply budget; an unreachable or suspect member as
    /// in [`ClusterView::consume_at`].
    fn resolve_at<'a>(
        &'a self,
        member: &'a str,
        topic: &'a str,
        receipt: (u32, u64, u64),
        action: AckAction,
    ) -> BoxFuture<'a, Result<PeerAnswer, String>>;

    /// Asks `member` how many messages each of its partitions of `topic`
    /// has ready to lease, waiting up to `wait` for some (node RPC
    /// ReadyCounts, op 37; the body is `{"ready":[[partition, n],...]}`);
    /// an unreachable or suspect member as in [`ClusterView::consume_at`].
    fn ready_counts_at<'a>(
        &'a self,
        member: &'a str,
        topic: &'a str,
        wait: Duration,
    ) -> BoxFuture<'a, Result<PeerAnswer, String>>;
}

/// A boxed future ([`ClusterView`] is used as a trait object).
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// At most this many partitions' figures are asked for at once by one
/// `GET /v1/topics/{topic}` (a topic may have `topic.max_partitions`).
pub const OWNER_STATS_IN_FLIGHT: usize = 16;

/// `partition_stats` on a cluster node: every partition owned by another
/// alive member gets that owner's figures (asked concurrently, at most
/// [`OWNER_STATS_IN_FLIGHT`] at a time), stamped
/// with `stats_from` = the owner; a partition whose owner does not answer
/// keeps this node's own figures, `stats_from` = this node, and `status`
/// `owner_unavailable`. Partitions this node owns, or whose owner is dead
/// or unknown, keep this node's figures.
pub async fn with_owner_figures(
    view: &dyn ClusterView,
    node_id: &str,
    topic: &str,
    incarnation: u64,
    mut stats: Vec<PartitionStats>,
) -> Vec<PartitionStats> {
    let asks = stats.iter().enumerate().filter_map(|(i, s)| {
        let owner = s.owner_node.as_deref()?;
        (owner != node_id && s.status == PartitionStatus::Ok).then_some((i, owner.to_owned()))
    });
    let asks: Vec<(usize, String)> = asks.collect();
    use futures_util::StreamExt;
    let calls: Vec<BoxFuture<'_, Result<PartitionStats, String>>> = asks
        .iter()
        .map(|(i, owner)| view.owner_partition_stats(owner, topic, incarnation, stats[*i].index))
        .collect();
    let answers: Vec<Result<PartitionStats, String>> =
        futures_util::stream::iter(calls).buffered(OWNER_STATS_IN_FLIGHT).collect().await;
    for s in &mut stats {
        s.stats_from = Some(node_id.to_owned());
    }
    for ((i, owner), answer) in asks.into_iter().zip(answers) {
        let local = &mut stats[i];
        match answer {
            Ok(remote) => {
                local.segments = remote.segments;
                local.oldest_offset = remote.oldest_offset;
                local.next_offset = remote.next_offset;
                local.high_watermark = remote.high_watermark;
                local.size_bytes = remote.size_bytes;
                local.oldest_segment_at = remote.oldest_segment_at;
                local.stats_from = Some(owner);
            }
            Err(why) => {
                tracing::debug!(
                    topic,
                    partition = local.index,
                    owner,
                    why,
                    "the owner did not answer for its partition figures"
                );
                local.status = PartitionStatus::OwnerUnavailable;
            }
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_broker::ownership::OwnerLiveness;

    fn stats(index: u32, owner: &str, status: PartitionStatus, next: u64) -> PartitionStats {
        PartitionStats {
            index,
            segments: 1,
            oldest_offset: 0,
            next_offset: next,
            high_watermark: next,
            size_bytes: next * 10,
            oldest_segment_at: None,
            owner_node: Some(owner.to_owned()),
            stats_from: None,
            status,
            owner_liveness: if status == PartitionStatus::Ok {
                OwnerLiveness::Alive
            } else {
                OwnerLiveness::Dead
            },
        }
    }

    /// n2 answers with 100 records for any partition; n3 never answers;
    /// counts the calls and the most in flight at once.
    #[derive(Debug, Default)]
    struct Owners {
        calls: std::sync::atomic::AtomicUsize,
        in_flight: std::sync::atomic::AtomicUsize,
        peak: std::sync::atomic::AtomicUsize,
    }

    impl ClusterView for Owners {
        fn status(&self) -> ClusterStatus {
            ClusterStatus::single("n1", 0)
        }

        fn owner_partition_stats<'a>(
            &'a self,
            owner: &'a str,
            _topic: &'a str,
            _incarnation: u64,
            partition: u32,
        ) -> BoxFuture<'a, Result<PartitionStats, String>> {
            use std::sync::atomic::Ordering::SeqCst;
            Box::pin(async move {
                self.calls.fetch_add(1, SeqCst);
                let now = self.in_flight.fetch_add(1, SeqCst) + 1;
                self.peak.fetch_max(now, SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                self.in_flight.fetch_sub(1, SeqCst);
                match owner {
                    "n2" => Ok(stats(partition, "n2", PartitionStatus::Ok, 100)),
                    _ => Err(format!("{owner} did not answer")),
                }
            })
        }

        fn route(&self, _topic: &str, _partition: u32) -> PartitionRoute {
            PartitionRoute::Local
        }

        fn serving_peers(&self, _topic: &str) -> Vec<String> {
            Vec::new()
        }

        fn consume_at<'a>(
            &'a self,
            member: &'a str,
            _ask: ConsumeAsk,
            _timeout: Duration,
        ) -> BoxFuture<'a, Result<PeerAnswer, String>> {
            Box::pin(async move { Err(format!("{member} is not reachable in this test")) })
        }

        fn resolve_at<'a>(
            &'a self,
            member: &'a str,
            _topic: &'a str,
            _receipt: (u32, u64, u64),
            _action: AckAction,
        ) -> BoxFuture<'a, Result<PeerAnswer, String>> {
            Box::pin(async move { Err(format!("{member} is not reachable in this test")) })
        }

        fn ready_counts_at<'a>(
            &'a self,
            member: &'a str,
            _topic: &'a str,
            _wait: Duration,
        ) -> BoxFuture<'a, Result<PeerAnswer, String>> {
            Box::pin(async move { Err(format!("{member} is not reachable in this test")) })
        }
    }

    #[tokio::test]
    async fn each_partitions_figures_come_from_its_owner_or_are_flagged_as_ours() {
        let view = Owners::default();
        let mut local = vec![
            stats(0, "n1", PartitionStatus::Ok, 1),
            stats(1, "n2", PartitionStatus::Ok, 2),
            stats(2, "n3", PartitionStatus::Ok, 3),
            stats(3, "n4", PartitionStatus::OwnerUnavailable, 4),
        ];
        // Many partitions of n2: asked at most OWNER_STATS_IN_FLIGHT at once.
        local.extend((4..60).map(|p| stats(p, "n2", PartitionStatus::Ok, 0)));
        let out = with_owner_figures(&view, "n1", "t", 7, local).await;
        let row = |p: usize| {
            let s = &out[p];
            (s.next_offset, s.stats_from.as_deref().unwrap(), s.status)
        };
        assert_eq!(row(0), (1, "n1", PartitionStatus::Ok), "ours: our figures");
        assert_eq!(row(1), (100, "n2", PartitionStatus::Ok), "the owner's figures");
        assert_eq!(row(2), (3, "n1", PartitionStatus::OwnerUnavailable), "no answer");
        assert_eq!(row(3), (4, "n1", PartitionStatus::OwnerUnavailable), "dead: not asked");
        assert_eq!(out[1].size_bytes, 1000);
        assert!(out[4..].iter().all(|s| s.next_offset == 100));
        use std::sync::atomic::Ordering::SeqCst;
        assert_eq!(view.calls.load(SeqCst), 2 + 56);
        assert!(view.peak.load(SeqCst) <= OWNER_STATS_IN_FLIGHT, "{:?}", view.peak);
        assert!(view.peak.load(SeqCst) > 1, "asked one at a time");
    }

    #[test]
    fn a_single_node_leads_itself_at_term_0() {
        let s = serde_json::to_value(ClusterStatus::single("n1", 7)).unwrap();
        assert_eq!(
            s,
            serde_json::json!({
                "node_id": "n1", "mode": "single", "role": "leader", "term": 0,
                "leader": "n1", "commit_index": 7, "applied_index": 7,
                "voters": ["n1"], "learners": [], "stopped": null,
            })
        );
    }
}
