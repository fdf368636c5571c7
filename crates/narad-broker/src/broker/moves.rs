//! Partition moves, the broker's side (SPEC §7.3). The node crate drives a
//! move over node RPC; these are the steps it calls on each end.
//!
//! Source: [`Broker::move_listing`] (RPC 22: segments with their verified
//! lengths, the high watermark, the oldest offset), [`Broker::move_chunk`]
//! (RPC 23: raw bytes of one segment), [`Broker::move_freeze`] (RPC 24:
//! commits stop, the consumer frontier is persisted, and the final high
//! watermark and frontier are answered), [`Broker::move_unfreeze`] (an
//! aborted move) and [`Broker::move_seal`] (the flip committed).
//!
//! Destination: [`Broker::move_stage`] starts a staged copy,
//! [`Broker::move_install`] verifies it against the source's frozen figures
//! and installs it with the consumer frontier.
//!
//! Invariants:
//! - Every step names the topic incarnation it was planned for; a step on
//!   another incarnation is refused (404), so a move never mixes the files
//!   of a deleted and a recreated topic.
//! - Leases are not moved: a record leased on the source and not acked by
//!   the freeze comes back on the destination after its visibility
//!   timeout (a duplicate, never a loss); acks after the freeze are acks
//!   the destination does not know (duplicates again).

use bytes::Bytes;
use narad_log::copy::{IncomingCopy, SegmentExtent};
use narad_meta::Topic;

use super::{Broker, blocking};
use crate::error::BrokerError;
use crate::fence::PartitionKey;

/// What the source holds of a partition (RPC 22's answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveListing {
    /// The offset after the last committed record.
    pub high_watermark: u64,
    /// The oldest offset retention kept.
    pub oldest: u64,
    /// The segments, oldest first, with their verified lengths.
    pub segments: Vec<SegmentExtent>,
}

/// The source at rest (RPC 24's answer): final while it stays frozen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrozenSource {
    /// The offset after the last committed record.
    pub high_watermark: u64,
    /// The last acked offset below which every record is acked (`None`:
    /// nothing acked yet).
    pub consumer_frontier: Option<u64>,
}

impl Broker {
    /// The live topic `name` if it is incarnation `incarnation` and has
    /// partition `p`.
    fn move_topic(
        &self,
        name: &str,
        incarnation: u64,
        p: u32,
    ) -> Result<std::sync::Arc<Topic>, BrokerError> {
        let t = self.topic(name)?;
        if t.incarnation() != incarnation {
            return Err(BrokerError::TopicNotFound);
        }
        if p >= t.partitions() {
            return Err(BrokerError::Invalid("invalid partition".into()));
        }
        Ok(t)
    }

    /// [`Broker::move_topic`] for the source's side of a copy (RPCs 22 and
    /// 23): on a cluster node, only a partition this node's replica names it
    /// the owner of (421 otherwise). Reading a partition opens its log, and
    /// opening creates one: a mover whose replica lags, or a peer asking
    /// the wrong node, would otherwise leave an empty partition directory on
    /// a node that never owned it, and copy an empty listing.
    fn move_source_topic(
        &self,
        name: &str,
        incarnation: u64,
        p: u32,
    ) -> Result<std::sync::Arc<Topic>, BrokerError> {
        let t = self.move_topic(name, incarnation, p)?;
        if self.meta.is_replicated() {
            let owner = self.meta.snapshot().assignment(name, p).map(|a| a.owner_id.clone());
            if owner.as_deref() != Some(self.config.node_id.as_str()) {
                return Err(BrokerError::NotOwner(format!(
                    "partition {p} of {name} is {} here, not this node's",
                    owner.map_or_else(|| "unassigned".to_owned(), |o| format!("owned by {o}"))
                )));
            }
        }
        Ok(t)
    }

    /// RPC 22: the source's segments of partition `p`.
    pub async fn move_listing(
        &self,
        topic: &str,
        incarnation: u64,
        p: u32,
    ) -> Result<MoveListing, BrokerError> {
        let t = self.move_source_topic(topic, incarnation, p)?;
        let topics = self.topics.clone();
        blocking(move || steps::listing(&topics, &t, p)).await
    }

    /// RPC 23: up to `max_len` raw bytes of segment `base` from byte `at`.
    pub async fn move_chunk(
        &self,
        topic: &str,
        incarnation: u64,
        p: u32,
        base: u64,
        at: u64,
        max_len: u64,
    ) -> Result<Bytes, BrokerError> {
        let t = self.move_source_topic(topic, incarnation, p)?;
        let topics = self.topics.clone();
        blocking(move || steps::chunk(&topics, &t, p, base, at, max_len)).await
    }

    /// RPC 24: freezes partition `p` for a move to `target` until
    /// `deadline_ms` (wall clock), persists its consumer frontier, and
    /// answers the figures the copy must reproduce.
    pub async fn move_freeze(
        &self,
        topic: &str,
        incarnation: u64,
        p: u32,
        target: &str,
        deadline_ms: u64,
    ) -> Result<FrozenSource, BrokerError> {
        let t = self.move_topic(topic, incarnation, p)?;
        if self.meta.is_replicated() {
            // Only a move this replica knows of: its SetAssignmentTarget is
            // then in this node's durable metastore, so a restart freezes
            // the partition again before any commit (`open`).
            let state = self.meta.snapshot();
            let known = state.assignment(topic, p).is_some_and(|a| {
                a.owner_id == self.config.node_id && a.target_id.as_deref() == Some(target)
            });
            if !known {
                return Err(BrokerError::Invalid(format!(
                    "this node's metastore does not show partition {p} of {topic} moving from it to {target} (yet)"
                )));
            }
        }
        let (topics, owner, target) =
            (self.topics.clone(), self.local_owner.clone(), target.to_owned());
        blocking(move || steps::freeze(&topics, &owner, &t, p, &target, deadline_ms)).await
    }

    /// Opens partition `p` again after an aborted move to `target`;
    /// whether it was frozen for it.
    pub fn move_unfreeze(&self, topic: &str, incarnation: u64, p: u32, target: &str) -> bool {
        self.fences().unfreeze(&PartitionKey::new(topic, incarnation, p), target)
    }

    /// Seals partition `p` as moved to `to` (the flip committed): commits
    /// answer "not the owner", consume skips it, ack and replay answer 421.
    pub fn move_seal(&self, topic: &str, incarnation: u64, p: u32, to: &str) {
        self.fences().seal_moved(&PartitionKey::new(topic, incarnation, p), to);
    }

    /// Starts staging a copy of partition `p` on this node (the move's
    /// destination).
    pub async fn move_stage(
        &self,
        topic: &str,
        incarnation: u64,
        p: u32,
    ) -> Result<IncomingCopy, BrokerError> {
        let t = self.move_topic(topic, incarnation, p)?;
        let topics = self.topics.clone();
        blocking(move || topics.incoming_copy(&t, p)).await
    }

    /// Removes the staged copy of partition `p` of a move to this node that
    /// ended without its flip; answers whether there was one.
    pub async fn move_unstage(
        &self,
        topic: &str,
        incarnation: u64,
        p: u32,
    ) -> Result<bool, BrokerError> {
        let topics = self.topics.clone();
        let topic = topic.to_owned();
        blocking(move || topics.discard_staged_copy(&topic, incarnation, p)).await
    }

    /// Verifies the staged `copy` against the source's frozen figures
    /// (every frame's CRC, the same oldest offset and high watermark) and
    /// installs it as this node's log of partition `p`, with the source's
    /// consumer frontier.
    pub async fn move_install(
        &self,
        topic: &str,
        incarnation: u64,
        p: u32,
        copy: IncomingCopy,
        oldest: u64,
        frozen: FrozenSource,
    ) -> Result<(), BrokerError> {
        let t = self.move_topic(topic, incarnation, p)?;
        let (topics, fences, clock) =
            (self.topics.clone(), self.fences().clone(), self.clock.clone());
        let replica =
            self.meta.is_replicated().then(|| (self.meta.clone(), self.config.node_id.clone()));
        blocking(move || {
            let replica = replica.as_ref().map(|(m, me)| (&**m, me.as_str()));
            steps::install(&topics, &fences, replica, clock, &t, p, copy, oldest, frozen)
        })
        .await
    }
}

/// The bodies of the broker's move steps, on a node's parts rather than a
/// [`Broker`]: the broker runs them on a blocking thread, and the cluster
/// simulation (`tests/cluster_sim.rs`), which runs each node's parts
/// without a broker, drives the same code. Each takes the topic
/// incarnation the move was planned for (checked by the caller).
pub mod steps {
    use std::sync::Arc;

    use bytes::Bytes;
    use narad_clock::ClockRef;
    use narad_log::copy::IncomingCopy;
    use narad_meta::{MetaStore, Topic};
    use tracing::info;

    use super::{FrozenSource, MoveListing};
    use crate::error::BrokerError;
    use crate::fence::{Fences, PartitionKey};
    use crate::owner::LocalOwner;
    use crate::topics::Topics;

    /// RPC 22's answer: the segments of partition `p` of `t`.
    pub fn listing(topics: &Topics, t: &Arc<Topic>, p: u32) -> Result<MoveListing, BrokerError> {
        let part = topics.partition(t, p)?;
        Ok(MoveListing {
            high_watermark: part.log.high_watermark(),
            oldest: part.log.oldest_offset(),
            segments: part.log.segment_extents(),
        })
    }

    /// RPC 23's answer: up to `max_len` raw bytes of segment `base` from
    /// byte `at`.
    pub fn chunk(
        topics: &Topics,
        t: &Arc<Topic>,
        p: u32,
        base: u64,
        at: u64,
        max_len: u64,
    ) -> Result<Bytes, BrokerError> {
        let part = topics.partition(t, p)?;
        part.log.read_segment_bytes(base, at, max_len).map_err(|e| match e {
            narad_log::copy::CopyError::Gone(_) | narad_log::copy::CopyError::Range(_) => {
                BrokerError::Invalid(e.to_string())
            }
            other => BrokerError::internal("read segment", other),
        })
    }

    /// RPC 24 once the caller checked the move: freezes partition `p` of
    /// `t` for `target` until `deadline_ms`, persists its consumer
    /// frontier, answers the frozen figures.
    pub fn freeze(
        topics: &Topics,
        owner: &LocalOwner,
        t: &Arc<Topic>,
        p: u32,
        target: &str,
        deadline_ms: u64,
    ) -> Result<FrozenSource, BrokerError> {
        let high_watermark = owner.freeze(t.name(), p, target, deadline_ms)?;
        let part = topics.partition(t, p)?;
        part.persist_frontier()?;
        let consumer_frontier = part.persisted_frontier()?;
        Ok(FrozenSource { high_watermark, consumer_frontier })
    }

    /// The destination's install: verifies `copy` against the frozen
    /// figures and installs it as this node's log of partition `p` of `t`,
    /// with the source's consumer frontier, and opens it. The partition's
    /// gate here is dropped with the leftover log the install removed: a
    /// partition that moved away from this node earlier was sealed here as
    /// moved, and that seal belongs to the old log, not to the copy coming
    /// back (kept, it refused every commit once the flip made this node the
    /// owner again, until a restart).
    ///
    /// `replica`, on a cluster node: its metastore replica and its member
    /// id. A copy is never installed over a partition that replica names
    /// this node the owner of: a mover started from a replica that lagged
    /// behind the flip of this very move (or a source whose replica lags and
    /// froze for it again) would otherwise replace the live log, and lose
    /// what was committed into it since the flip.
    #[allow(clippy::too_many_arguments)]
    pub fn install(
        topics: &Topics,
        fences: &Fences,
        replica: Option<(&MetaStore, &str)>,
        clock: ClockRef,
        t: &Arc<Topic>,
        p: u32,
        copy: IncomingCopy,
        oldest: u64,
        frozen: FrozenSource,
    ) -> Result<(), BrokerError> {
        let config = topics.log_config().clone();
        let staged = copy
            .verify(&config, clock, oldest, frozen.high_watermark)
            .map_err(|e| BrokerError::Invalid(format!("partition copy refused: {e}")))?;
        // The check and the replacement under the partition's gate: a
        // commit this node's replica let in as the owner (the flip of an
        // earlier attempt applied meanwhile) either landed before the check,
        // which then refuses, or waits and lands in the installed log.
        fences.replace(&PartitionKey::new(t.name(), t.incarnation(), p), || {
            if let Some((meta, me)) = replica
                && meta.snapshot().assignment(t.name(), p).is_some_and(|a| a.owner_id == me)
            {
                return Err(BrokerError::Invalid(format!(
                    "partition copy refused: this node owns partition {p} of {} already",
                    t.name()
                )));
            }
            topics.install_partition(t, p, &staged, frozen.consumer_frontier)
        })?;
        // Open it: a consume takes only from open partitions.
        topics.partition(t, p).map(drop)
    }

    /// Freezes, before the dispatcher starts, every partition node `me`
    /// owns that a move is taking elsewhere: the freeze is in memory, so a
    /// source that restarted while frozen would otherwise take commits the
    /// move's copy never sees, and lose them at the flip. Frozen until the
    /// move completes or aborts (the metastore decides, see
    /// `follow_move_outcomes`); the mover renews it when it asks.
    pub fn freeze_moving_partitions(owner: &LocalOwner, meta: &MetaStore, me: &str, now_ms: u64) {
        let deadline = now_ms + narad_meta::limits::MOVE_FREEZE_TTL.as_millis() as u64;
        let state = meta.snapshot();
        for t in state.topics() {
            let Some(parts) = state.assignments(t.name()) else { continue };
            for (&p, a) in parts.iter() {
                let Some(target) = a.target_id.as_deref().filter(|_| a.owner_id == me) else {
                    continue;
                };
                let key = crate::fence::PartitionKey::new(t.name(), t.incarnation(), p);
                if owner.fences().freeze(&key, target, deadline, || ()).is_ok() {
                    info!(topic = %t.name(), partition = p, target, "partition frozen at start: a move to another node is in flight");
                }
            }
        }
    }
}
