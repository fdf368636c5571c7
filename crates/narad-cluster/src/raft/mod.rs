//! The replicated metastore: narad-meta's commands go through Raft
//! (openraft 0.9, `storage-v2`), carried by node RPC.
//!
//! * [`types`] — the type configuration, node ids (FNV-1a 64 of the
//!   configured id), the applied state stored beside the metastore;
//! * [`log_store`] — the log and the vote in `<data>/metastore/raft.redb`;
//! * [`state_machine`] — the metastore as Raft's state machine, snapshots;
//! * [`network`] — Raft's RPCs over the node RPC transport (ops 30-32);
//! * [`control`] — the [`ControlPlane`]: bootstrap and join (op 21), writes
//!   forwarded to the leader (op 29), leadership handover (op 33), status;
//! * [`first_start`] — whether a node without Raft state may bootstrap;
//! * [`upgrade`] — a group formed around a node's existing state;
//! * [`metrics`] — `narad_raft_*`.

pub mod control;
pub mod first_start;
pub mod log_store;
pub mod metrics;
pub mod network;
pub mod state_machine;
pub mod types;
pub mod upgrade;
pub mod voters;

#[cfg(test)]
mod storage_suite;

pub use control::{
    CONFIRM_BARRIER, ControlPlane, ControlPlaneConfig, LeaderInfo, LeaderTopicView, PeerEntry,
    RaftStatus, RaftTimings, Role, confirmed_view,
};
pub use types::{RaftNode, TypeConfig, raft_id};

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is unusable (peers, initial members, timings).
    #[error("cluster config: {0}")]
    Config(String),
    /// The Raft log could not be opened.
    #[error(transparent)]
    Log(#[from] log_store::OpenError),
    /// openraft refused to start or initialise.
    #[error("raft: {0}")]
    Raft(String),
}
