//! What a node in a cluster starts with ([`ClusterSettings`]): its id, its
//! node RPC addresses, the resolved peers and the way nodes authenticate
//! each other. The HTTP crate's configuration checks the `cluster.*` keys
//! and resolves them into these (narad-server's `cluster_settings`).

use std::net::SocketAddr;
use std::path::PathBuf;

pub use narad_cluster::{ClusterAuth, ClusterSecret, TlsFiles};

/// The longest node id.
pub const NODE_ID_LEN_MAX: usize = 64;

/// One resolved peer (this node included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPeer {
    /// The node id.
    pub id: String,
    /// Its cluster (node RPC, UDP) address.
    pub addr: SocketAddr,
    /// Its Raft node id ([`raft_id`] of `id`).
    pub raft_id: u64,
}

/// What a node in a cluster starts with: the resolved, validated `cluster.*`
/// keys and the way nodes authenticate each other.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// This node's id (`cluster.node_id`).
    pub node_id: String,
    /// Where this node's node RPC listens (`cluster.addr`, UDP).
    pub bind_addr: SocketAddr,
    /// This node's address as the peers dial it (its own peer entry).
    pub advertised_addr: SocketAddr,
    /// Every peer in `cluster.peers` order, this node included.
    pub peers: Vec<ClusterPeer>,
    /// `cluster.initial_members` (empty: every peer bootstraps).
    pub initial_members: Vec<String>,
    /// `cluster.move_copy_rate`: bytes per second the copy rounds of the
    /// moves to this node read together (0: no limit).
    pub move_copy_rate: u64,
    /// The cluster secret and/or the cluster TLS files (neither only with
    /// `--dev`).
    pub auth: ClusterAuth,
}

impl ClusterSettings {
    /// Whether this node only joins (a non-empty `initial_members` that
    /// does not list it): it never bootstraps.
    pub fn join_only(&self) -> bool {
        !self.initial_members.is_empty() && !self.initial_members.contains(&self.node_id)
    }

    /// The peers other than this node.
    pub fn others(&self) -> impl Iterator<Item = &ClusterPeer> {
        self.peers.iter().filter(move |p| p.id != self.node_id)
    }
}

/// The Raft node id of a node id (FNV-1a 64 of its bytes): the control
/// plane's own derivation, so validation and Raft never disagree.
/// Validation refuses peers whose ids collide.
pub use narad_cluster::raft::raft_id;

/// Checks a node id: `^[A-Za-z0-9._-]{1,64}$`.
pub fn validate_node_id(id: &str) -> Result<(), String> {
    let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    if id.is_empty() || id.len() > NODE_ID_LEN_MAX || !id.bytes().all(ok) {
        return Err(format!("node id {id:?} must match ^[A-Za-z0-9._-]{{1,64}}$"));
    }
    Ok(())
}

/// The cluster TLS files: all three or none (the error names what is
/// missing).
pub fn tls_files(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
) -> Result<Option<TlsFiles>, String> {
    TlsFiles::from_options(cert, key, ca).map_err(|e| match e {
        narad_cluster::Error::Config(m) => m,
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raft_ids_are_fnv_1a_64_of_the_id() {
        // Reference values of FNV-1a 64 (the published test vectors).
        assert_eq!(raft_id(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(raft_id("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(raft_id("foobar"), 0x8594_4171_f739_67e8);
        assert_ne!(raft_id("n1"), raft_id("n2"));
    }
}
