//! What the HTTP API shows of the control plane: the [`ClusterView`] the
//! server holds (the cluster's wiring implements it; `None` on a single
//! node), and the JSON of `GET /v1/cluster/status`.

use serde::Serialize;
use utoipa::ToSchema;

/// `mode` of the status: one node with no peers, or a Raft group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClusterMode {
    /// No peers configured: the metastore applies directly.
    Single,
    /// Peers configured: the metastore replicates through Raft.
    Cluster,
}

/// This node's Raft role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
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
}

/// `GET /v1/cluster/status`: this node's view of the control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_node_leads_itself_at_term_0() {
        let s = serde_json::to_value(ClusterStatus::single("n1", 7)).unwrap();
        assert_eq!(
            s,
            serde_json::json!({
                "node_id": "n1", "mode": "single", "role": "leader", "term": 0,
                "leader": "n1", "commit_index": 7, "applied_index": 7,
                "voters": ["n1"], "learners": [],
            })
        );
    }
}
