//! narad-node: a node, the broker and the cluster composed. It owns
//! everything a node does for and with its peers, and nothing of HTTP:
//!
//! * [`node`]: a node, started and stopped in order ([`node::Node`]: the
//!   broker, and with peers the cluster side); what the HTTP server runs.
//! * [`cluster_node`]: a cluster node's start-up, node RPC handlers (the
//!   control plane's ops and the data plane's: commits, consumes, acks,
//!   figures, fan-out links, ready counts), forwarding to partition owners
//!   and shutdown; [`control_restart`]: what it does once its control plane
//!   stopped on a fatal error.
//! * [`remote_owner`]: the dispatcher's commits to partitions other nodes
//!   own; [`fanout_peers`]: fan-out link changes and lag across nodes;
//!   [`forwarded_consume`]: consumes forwarded for a caller that went away.
//! * [`view`]: the cluster as the HTTP API sees it ([`view::ClusterView`]);
//!   [`forward`]: where a partition is served and what its owner answered;
//!   [`error`]: the errors a node answers with, from the broker's.
//! * [`consume`], [`wire`]: consumes served from this node's partitions and
//!   the message JSON they answer with (a forwarded consume's answer is
//!   that JSON).
//! * [`settings`]: what a cluster node starts with; [`node_identity`]: the
//!   node id kept in the data directory; [`root`]: seeding the root user.
//!
//! Partition moves (freezing a partition at its commit boundary and
//! handing it to another owner) land here next: they need the broker and
//! the cluster together, which only this crate has.
//!
//! narad-broker depends on neither this crate nor narad-cluster: the
//! broker reaches other nodes only through the traits this crate
//! implements (`Owner`, `LinkPeers`, `DeleteConfirmer`, `ReplicaFreshness`).

pub mod cluster_node;
pub mod consume;
pub mod control_restart;
pub mod copy_rate;
pub mod error;
pub mod fanout_peers;
pub mod forward;
pub mod forwarded_consume;
pub mod moves;
pub mod node;
pub mod node_identity;
pub mod offsets_seen;
pub mod remote_owner;
pub mod root;
pub mod settings;
pub mod view;
pub mod wire;
