//! Copies a move left behind (SPEC §7.1's destruction rule, §7.3): once a
//! partition's ownership flipped to another node, this node's files of it
//! are redundant — the new owner installed a verified copy holding every
//! record the source had when it froze, and a frozen source commits
//! nothing after. They are deleted only when the caller has confirmed
//! with the metastore's leader that this replica is caught up
//! ([`Broker::discard_moved_partitions`] must be called after that
//! confirmation), and only for partitions the replica shows owned by
//! another member with no move back to this node in flight; the check is
//! repeated under the lock a move's install takes.

use super::{Broker, blocking};
use crate::error::BrokerError;

impl Broker {
    /// The partitions whose files this node holds while the replica shows
    /// them owned elsewhere with no move to this node: `(topic, partition)`.
    /// Cheap enough for a periodic check (one `exists` per partition of
    /// the open topics); empty on a single node.
    pub async fn moved_away_leftovers(&self) -> Result<Vec<(String, u32)>, BrokerError> {
        if !self.meta.is_replicated() {
            return Ok(Vec::new());
        }
        let (topics, meta, me) =
            (self.topics.clone(), self.meta.clone(), self.config.node_id.clone());
        blocking(move || {
            let state = meta.snapshot();
            let mut out = Vec::new();
            for t in state.topics() {
                for p in topics.partitions_on_disk(t)? {
                    if owned_elsewhere(&state, t.name(), p, &me) {
                        out.push((t.name().to_owned(), p));
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    /// Deletes this node's files of the partitions
    /// [`Broker::moved_away_leftovers`] names. Call only once the leader
    /// confirmed this replica caught up (the replica's "owned elsewhere"
    /// is then the cluster's). Returns what was removed.
    pub async fn discard_moved_partitions(&self) -> Result<Vec<(String, u32)>, BrokerError> {
        let leftovers = self.moved_away_leftovers().await?;
        let mut removed = Vec::new();
        for (name, p) in leftovers {
            let Some(t) = self.meta.topic(&name) else { continue };
            let (topics, meta, me, t2) =
                (self.topics.clone(), self.meta.clone(), self.config.node_id.clone(), t.clone());
            let gone = blocking(move || {
                topics.discard_partition(&t2, p, || {
                    owned_elsewhere(&meta.snapshot(), t2.name(), p, &me)
                        && meta
                            .topic(t2.name())
                            .is_some_and(|now| now.incarnation() == t2.incarnation())
                })
            })
            .await?;
            if gone {
                tracing::info!(topic = %name, partition = p, incarnation = t.incarnation(),
                    "deleted this node's copy of a partition that moved to another node");
                removed.push((name, p));
            }
        }
        Ok(removed)
    }
}

/// Whether the replica `state` shows partition `p` of `topic` owned by a
/// member other than `me`, with no move to `me` in flight.
fn owned_elsewhere(state: &narad_meta::MetaState, topic: &str, p: u32, me: &str) -> bool {
    state
        .assignment(topic, p)
        .is_some_and(|a| a.owner_id != me && a.target_id.as_deref() != Some(me))
}
