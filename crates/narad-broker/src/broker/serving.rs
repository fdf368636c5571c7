//! What this node serves, and its answers to other nodes:
//! [`Broker::owned_partitions`], [`Broker::knows_topic`],
//! [`Broker::commit_for_peer`] (the owner's side of another node's
//! dispatcher), and the topic directories found at start-up that this
//! replica does not know ([`Broker::unconfirmed_orphans`],
//! [`Broker::remove_confirmed_orphan`], [`Broker::forget_orphan`]).
//! The partition fence ([`crate::fence`]) is read here too:
//! [`Broker::moved_away`] for consume, ack and replay, which must not serve
//! a partition whose move flipped (its log here is a leftover).
//!
//! Fields worked on here: `local_owner` (commits into this node's logs)
//! and `unconfirmed_orphans`.
//!
//! Invariants the code relies on:
//! - `commit_for_peer` trusts the caller's ownership check; the topic
//!   incarnation is checked in the commit, as for a local commit. A commit
//!   refused because shutdown closed the log reads as "unavailable", not
//!   as a deleted topic.
//! - An orphan directory is removed only once the group's leader confirmed
//!   the topic gone, and never when this replica knows the topic by then.

use narad_meta::Topic;

use super::{Broker, blocking};
use crate::error::BrokerError;
use crate::owner::{CommitBatch, CommitError};

impl Broker {
    /// Topic directories found at start-up that this (replicated)
    /// metastore does not know: kept until the group's leader confirms the
    /// topic is gone (SPEC §7.1), then passed to
    /// [`Broker::remove_confirmed_orphan`]. Empty on a single node, which
    /// removes them at start-up.
    pub fn unconfirmed_orphans(&self) -> Vec<String> {
        self.unconfirmed_orphans.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }

    /// Commits a batch another node's dispatcher sent for a partition this
    /// node owns (node RPC CommitProduceBatch) through the same combining
    /// commit as this node's own: appended, fdatasynced, read back and
    /// visible when it returns `Ok` with the offsets the records got. The
    /// caller checked ownership; the topic incarnation is checked here, as
    /// for a local commit.
    pub async fn commit_for_peer(
        &self,
        batch: CommitBatch,
    ) -> Result<narad_log::CommitOutcome, CommitError> {
        let unavailable =
            || CommitError::Unavailable(format!("{} is shutting down", self.config.node_id));
        if self.check_running().is_err() {
            return Err(unavailable());
        }
        let owner = self.local_owner.clone();
        match tokio::task::spawn_blocking(move || owner.commit_blocking(batch)).await {
            // A log closed by the shutdown reads as a deleted topic's.
            Ok(Err(CommitError::Refused(_))) if self.check_running().is_err() => Err(unavailable()),
            Ok(r) => r,
            Err(e) => Err(CommitError::Failed(format!("commit task failed: {e}"))),
        }
    }

    /// The gates of this node's partitions (every local commit passes one).
    pub fn fences(&self) -> &std::sync::Arc<crate::fence::Fences> {
        self.local_owner.fences()
    }

    /// Where partition `p` of `t` moved, if its move flipped away from this
    /// node (the fence sealed it): consume skips it, ack and replay answer
    /// 421 naming the new owner.
    pub fn moved_away(&self, t: &Topic, p: u32) -> Option<String> {
        let key = crate::fence::PartitionKey::new(t.name(), t.incarnation(), p);
        match self.local_owner.fences().shut(&key) {
            Some(crate::fence::Shut::Moved { to }) => Some(to),
            _ => None,
        }
    }

    /// The partitions of `t` this node serves: all of them on a single
    /// node; on a cluster node those the replicated assignments give it (a
    /// partition it does not own may hold records committed here before;
    /// its owner serves it).
    pub fn owned_partitions(&self, t: &Topic) -> std::collections::BTreeSet<u32> {
        if !self.meta.is_replicated() {
            return (0..t.partitions()).collect();
        }
        let snap = self.meta.snapshot();
        (0..t.partitions())
            .filter(|&p| {
                snap.assignment(t.name(), p).is_some_and(|a| a.owner_id == self.config.node_id)
            })
            .collect()
    }

    /// Whether this replica knows a topic named `name` now.
    pub fn knows_topic(&self, name: &str) -> bool {
        self.meta.topic(name).is_some()
    }

    /// Settles an unconfirmed orphan the leader confirmed gone: removes its
    /// directory unless this replica knows the topic by now (checked under
    /// the lock every open takes). Returns whether files were removed.
    pub async fn remove_confirmed_orphan(&self, name: &str) -> Result<bool, BrokerError> {
        let (topics, meta, owned) = (self.topics.clone(), self.meta.clone(), name.to_owned());
        let removed = blocking(move || {
            topics.remove_confirmed_orphan(&owned, || meta.topic(&owned).is_some())
        })
        .await?;
        self.forget_orphan(name);
        Ok(removed)
    }

    /// Drops `name` from the unconfirmed orphans (this replica knows the
    /// topic now: its files are the topic's to open).
    pub fn forget_orphan(&self, name: &str) {
        self.unconfirmed_orphans.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
    }
}
