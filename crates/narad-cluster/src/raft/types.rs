//! The Raft type configuration of the metastore group: commands of
//! narad-meta as the log's application data, [`ApplyOutcome`] as what
//! applying one returns, u64 node ids derived from the configured string
//! ids, and [`RaftNode`] as what the membership says about each node.

use std::io::Cursor;

use narad_meta::{Command, MetaError, Response};
use serde::{Deserialize, Serialize};

openraft::declare_raft_types!(
    /// The metastore group's types.
    pub TypeConfig:
        D = Command,
        R = ApplyOutcome,
        NodeId = u64,
        Node = RaftNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A Raft node id (FNV-1a 64 of the configured id, see [`raft_id`]).
pub type NodeId = u64;
/// A log id of the group.
pub type LogId = openraft::LogId<NodeId>;
/// A vote of the group.
pub type Vote = openraft::Vote<NodeId>;
/// A log entry of the group.
pub type Entry = openraft::Entry<TypeConfig>;
/// The membership as stored with the last applied entry.
pub type StoredMembership = openraft::StoredMembership<NodeId, RaftNode>;
/// openraft's storage error for this group.
pub type StorageError = openraft::StorageError<NodeId>;
/// The Raft node of the group.
pub type Raft = openraft::Raft<TypeConfig>;

/// What the membership records of a node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftNode {
    /// The configured node id ("n1").
    pub id: String,
    /// Its node-RPC (QUIC) address, `host:port`.
    pub cluster_addr: String,
    /// Its advertised HTTP `host:port` ("" when not known: nodes that
    /// bootstrap together only know each other's cluster addresses).
    pub http_addr: String,
}

/// The Raft id of a configured node id: FNV-1a 64 of its bytes. Stable
/// across releases (it is stored in every log id and vote); configuration
/// refuses two peers whose ids collide.
pub fn raft_id(id: &str) -> NodeId {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    id.bytes().fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// The outcome of applying one entry: for a command, its response or its
/// error in wire form (status, text; [`MetaError::from_wire`] rebuilds
/// it), the same on every replica because applying is deterministic;
/// `None` for an entry without a command (blank, membership).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyOutcome(pub Option<Result<Response, (u16, String)>>);

impl ApplyOutcome {
    /// Wraps what the metastore's `apply_entry` returned.
    pub fn new(outcome: Option<Result<Response, MetaError>>) -> Self {
        ApplyOutcome(outcome.map(|r| r.map_err(|e| e.to_wire())))
    }

    /// The command's outcome as the metastore's types.
    pub fn into_result(self) -> Result<Response, MetaError> {
        match self.0 {
            Some(r) => r.map_err(|(status, text)| MetaError::from_wire(status, text)),
            None => Err(MetaError::Upstream("the raft entry carried no command".to_owned())),
        }
    }
}

/// What the state machine stores beside the metastore's state, in the same
/// transaction as each applied entry (narad-meta keeps it as opaque bytes):
/// the last applied log id and the membership in effect.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedState {
    /// The last applied log id.
    pub last_applied: Option<LogId>,
    /// The last applied membership.
    pub membership: StoredMembership,
}

impl AppliedState {
    /// Its stored form.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("log ids and memberships always serialize")
    }

    /// Decodes the stored form.
    pub fn decode(bytes: &[u8]) -> Result<AppliedState, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("raft applied state: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raft_ids_are_fnv1a_64_of_the_node_id() {
        // Reference values of FNV-1a 64 (the empty string is the offset basis).
        assert_eq!(raft_id(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(raft_id("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(raft_id("foobar"), 0x8594_4171_f739_67e8);
        assert_ne!(raft_id("n1"), raft_id("n2"));
    }
}
