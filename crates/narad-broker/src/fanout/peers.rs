//! Fan-out links across the nodes of a cluster.
//!
//! A parent's cursors run on each parent partition's owner, so a link
//! change made on one node reaches the others' cursors through these
//! questions (node RPC on a cluster node, nothing on a single node):
//!
//! - **anchor** (before a link is committed): each owner of a parent
//!   partition writes the new link's cursor file at that partition's high
//!   watermark, exactly as a single node does for all of them. An owner
//!   that does not answer leaves its partitions to the attach-time fallback
//!   (see [`crate::fanout`]); the attach goes on.
//! - **settle** (after a detach): each owner applies the metastore at least
//!   up to the change and reconciles, so its cursors of the dissolved link
//!   have stopped when the detach answers. An owner that does not answer
//!   stops them at its next background reconcile (within a second of
//!   applying the change).
//! - **lag** (`GET .../children`): each owner's figures over the partitions
//!   it runs cursors for; `lag_complete` only when every partition is
//!   covered and every owner answered.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::ChildLag;

/// A boxed future of a peer's answer.
pub type PeerFuture<T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'static>>;

/// How long a node changing a link waits for each owner's answer.
pub const LINK_PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the lag of a child waits for each owner's figures.
pub const LAG_PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// How long an anchor written for a link not committed yet is kept from
/// the sweep (the link is proposed right after every owner answered).
pub const PENDING_ANCHOR_TTL: Duration = Duration::from_secs(120);

/// The most link changes of other nodes whose anchors are kept from the
/// sweep at once.
pub const PENDING_ANCHORS_MAX: usize = 1024;

/// A link about to be committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewLink {
    /// The parent topic.
    pub parent: String,
    /// The parent's incarnation (the owner must hold the same).
    pub incarnation: u64,
    /// The child topic.
    pub child: String,
    /// The link's attach epoch.
    pub epoch: u64,
}

/// One owner's fan-out figures of a parent's children.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PeerLag {
    /// The parent partitions whose cursors run on that owner.
    pub partitions: Vec<u32>,
    /// Each child's figures over those partitions.
    pub children: Vec<ChildLag>,
}

/// The other owners of a parent's partitions, as a cluster node reaches
/// them.
pub trait LinkPeers: Send + Sync + std::fmt::Debug {
    /// Asks `member` to anchor `link`'s cursor files in `partitions` at
    /// their high watermarks; the partitions it anchored.
    fn anchor(&self, member: &str, link: &NewLink, partitions: &[u32]) -> PeerFuture<Vec<u32>>;

    /// Asks `member` to apply the metastore up to `applied_index` and stop
    /// the cursors of links gone by then.
    fn settle(&self, member: &str, applied_index: u64) -> PeerFuture<()>;

    /// `member`'s figures of `parent`'s (incarnation `incarnation`)
    /// children.
    fn lag(&self, member: &str, parent: &str, incarnation: u64) -> PeerFuture<PeerLag>;
}
