//! Cluster members: one record per node, upserted by the node's heartbeat
//! (MemberJoin), marked dead by the controller (MemberDead) and marked
//! draining by an operator's decommission (SetMemberDraining).

use serde::{Deserialize, Serialize};

/// Whether a member is considered up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberStatus {
    /// Heartbeating.
    Alive,
    /// Marked dead after missing heartbeats; its partitions stay assigned.
    Dead,
}

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// The node id.
    pub id: String,
    /// Advertised HTTP `host:port` (also the node-RPC QUIC address).
    pub addr: String,
    /// The Raft address, when the node runs in a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_addr: Option<String>,
    /// Alive or dead.
    pub status: MemberStatus,
    /// The last heartbeat, Unix seconds (carried in the command).
    pub last_heartbeat: i64,
    /// Being decommissioned (SPEC §7.3): it gets no new partitions and the
    /// rebalance planner moves its partitions away. Set and cleared only by
    /// `SetMemberDraining`; a heartbeat (`MemberJoin`) keeps the stored
    /// value whatever it carries. Absent in the JSON when false, so records
    /// written before draining existed read back unchanged.
    #[serde(default, skip_serializing_if = "is_false")]
    pub draining: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}
