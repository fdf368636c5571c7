//! Forming a group around state no log entry holds: a single node upgraded
//! to the first member of a cluster (docs/CLUSTER.md "Forming a cluster
//! from nodes that already hold data", issue 35).
//!
//! Its metastore applied commands before it had any Raft state. Bootstrapped
//! the usual way (a membership entry at index 0), the group's log would not
//! hold that state, and openraft would send joiners the log from index 0:
//! they would never learn the topics, users and grants the first node had.
//! So the group starts as if that state were a snapshot at index 0:
//!
//! 1. the metastore records the applied state "log id 0 applied, membership
//!    {this node}" (the one this node would have after applying the
//!    bootstrap entry), beside the state it holds;
//! 2. the Raft log records log id 0 as purged, so it starts after it.
//!
//! openraft then starts the node as the group's only voter with nothing to
//! replay, and a follower whose log is behind the purged id gets a snapshot:
//! the state machine's export, which holds the old state. Each step is one
//! durable transaction and each is done only where it has not been: a
//! crash between them leaves step 2 to the next start (done in that order,
//! never a log purged past what the state machine applied, which openraft
//! refuses to start from).
//!
//! `refuse_diverging_state` (narad-server) lets only a node that bootstraps
//! alone get here.

use std::collections::{BTreeMap, BTreeSet};

use narad_meta::MetaStore;
use openraft::Membership;

use super::Error;
use super::log_store::LogStore;
use super::types::{AppliedState, LogId, RaftNode, StoredMembership, TypeConfig, raft_id};

/// The log id the old state is filed under: openraft's first log id (the
/// one `initialize` gives the bootstrap entry).
fn first_log_id() -> LogId {
    LogId::default()
}

/// Whether `meta` holds state from before any Raft state.
pub fn has_pre_cluster_state(meta: &MetaStore) -> bool {
    meta.raft_state().is_none() && meta.snapshot().applied_index() > 0
}

/// Files `meta`'s pre-cluster state as the snapshot at log id 0 of a group
/// whose only voter is `me` (see the module docs). Answers whether it did
/// anything. Call before the Raft node starts, on a node that bootstraps
/// alone.
pub fn seed_group(
    meta: &MetaStore,
    log: &LogStore<TypeConfig>,
    me: &RaftNode,
) -> Result<bool, Error> {
    let first = first_log_id();
    let mut did = false;
    if has_pre_cluster_state(meta) {
        let voters = BTreeMap::from([(raft_id(&me.id), me.clone())]);
        let ids: BTreeSet<_> = voters.keys().copied().collect();
        let state = AppliedState {
            last_applied: Some(first),
            membership: StoredMembership::new(Some(first), Membership::new(vec![ids], voters)),
        };
        meta.apply_entry(None, &state.encode()).map_err(|e| {
            Error::Raft(format!("record the existing state as the group's first: {e}"))
        })?;
        did = true;
    }
    let seeded = meta
        .raft_state()
        .map(|b| AppliedState::decode(&b))
        .transpose()
        .map_err(Error::Raft)?
        .is_some_and(|s| s.last_applied == Some(first));
    if seeded
        && log
            .start_after(&first)
            .map_err(|e| Error::Raft(format!("start the log after the existing state: {e}")))?
    {
        did = true;
    }
    if did {
        tracing::info!(
            applied_index = meta.snapshot().applied_index(),
            topics = meta.snapshot().topic_count(),
            "raft group formed around this node's existing metastore state: joiners receive it as a snapshot"
        );
    }
    Ok(did)
}
