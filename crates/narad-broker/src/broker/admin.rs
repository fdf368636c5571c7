//! Topic administration: [`Broker::create_topic`], [`Broker::alter_topic`],
//! [`Broker::delete_topic`], [`Broker::topic`], [`Broker::list_topics`] and
//! `topic_of_incarnation`, plus placing the partitions a create or a grow
//! adds (`assign_all`, `place_after_write`).
//!
//! No field of its own: it writes through `meta`, removes files through
//! `topics`, and keeps the fan-out cursors (`fanout`, see `links.rs`) in
//! step with link changes.
//!
//! Invariants the code relies on:
//! - Placement after a write is best effort: the write already succeeded
//!   and its caller hears so; whatever stays unassigned the cluster
//!   controller places within a tick.
//! - A link-changing write (a child's create, a delete) takes the fan-out
//!   links lock (`fanout.lock_links()`) before the metastore write and
//!   holds it until the cursors are reconciled. A child's cursor files are
//!   anchored before its create commits, and removed if the commit fails.

use std::sync::Arc;

use narad_meta::{AlterTopicRequest, CreateTopicRequest, MetaError, MetaStore, Topic, TopicPage};
use tracing::{info, warn};

use super::links::parse_epoch;
use super::{Broker, blocking, unix_seconds};
use crate::error::BrokerError;
use crate::fanout::cursor_file;
use crate::placement;

impl Broker {
    /// Creates a topic and assigns its partitions over the live members (on a
    /// single node: to this node). A child created with `parent` starts at
    /// the parent's high watermark (see [`crate::fanout`]): its cursor files
    /// are written before the create commits, and its cursors start before
    /// this returns.
    pub async fn create_topic(
        &self,
        request: CreateTopicRequest,
    ) -> Result<Arc<Topic>, BrokerError> {
        self.check_running()?;
        let (meta, node, clock) =
            (self.meta.clone(), self.config.node_id.clone(), self.clock.clone());
        if request.parent.is_empty() {
            // Only a child changes links; a plain create does not wait for them.
            return blocking(move || {
                let command = meta.resolve_create_topic(request)?;
                let t = meta.propose_create_topic(command)?;
                place_after_write(&meta, &t, 0, &node, unix_seconds(&*clock));
                Ok(t)
            })
            .await;
        }
        let links = self.fanout.lock_links().await;
        let m = meta.clone();
        let command = blocking(move || Ok(m.resolve_create_topic(request)?)).await?;
        let link = command.parent.as_ref().ok_or_else(|| {
            BrokerError::internal("create a child", "the resolved create lost its parent")
        })?;
        let parent = meta.topic(&link.name).ok_or(BrokerError::TopicNotFound)?;
        let epoch = parse_epoch(&link.attach_epoch)?;
        let child = command.name.clone();
        self.anchor_new_link(&parent, &child, epoch).await?;
        let fanout = self.fanout.clone();
        let t = blocking(move || {
            let t = meta.propose_create_topic(command).map_err(|e| {
                fanout.remove_link_files(&parent, &child, epoch);
                BrokerError::from(e)
            })?;
            place_after_write(&meta, &t, 0, &node, unix_seconds(&*clock));
            Ok(t)
        })
        .await?;
        self.fanout.reconcile_now(&links).await;
        Ok(t)
    }

    /// `name` as this replica holds it, if it is incarnation `incarnation`
    /// (another one: not found, as the caller knows it).
    pub(super) fn topic_of_incarnation(
        &self,
        name: &str,
        incarnation: u64,
    ) -> Result<Arc<Topic>, BrokerError> {
        let t = self.topic(name)?;
        if t.incarnation() != incarnation {
            return Err(BrokerError::TopicNotFound);
        }
        Ok(t)
    }

    /// Alters a topic (new partitions are assigned over the alive members).
    pub async fn alter_topic(
        &self,
        name: &str,
        request: AlterTopicRequest,
    ) -> Result<Arc<Topic>, BrokerError> {
        self.check_running()?;
        let (meta, node, name) = (self.meta.clone(), self.config.node_id.clone(), name.to_owned());
        let clock = self.clock.clone();
        let t = blocking(move || {
            let before = meta.topic(&name).map_or(0, |t| t.partitions());
            let t = meta.alter_topic(&name, request)?;
            if t.partitions() > before {
                place_after_write(&meta, &t, before, &node, unix_seconds(&*clock));
            }
            Ok(t)
        })
        .await?;
        if let Some(rt) = self.topics.get_open(t.name(), t.incarnation()) {
            rt.wake.everyone(); // caps may have grown
        }
        if !t.children().is_empty() {
            // New parent partitions need cursors now, not at the next tick.
            let links = self.fanout.lock_links().await;
            self.fanout.reconcile_now(&links).await;
        }
        Ok(t)
    }

    /// Deletes a topic and its files. Undispatched records of it are
    /// discarded by the dispatcher. Links dissolve: a deleted parent's
    /// cursors stop (their files went with its directory), a deleted
    /// child's cursors stop and their files in the parent's partitions are
    /// removed before this returns.
    pub async fn delete_topic(&self, name: &str) -> Result<(), BrokerError> {
        self.check_running()?;
        let links = self.fanout.lock_links().await;
        let (meta, topics, name) = (self.meta.clone(), self.topics.clone(), name.to_owned());
        let deleted = blocking(move || {
            let t = meta.delete_topic(&name)?;
            topics.remove(&name, t.incarnation())?;
            Ok(t)
        })
        .await?;
        self.metrics.forget_topic(deleted.name(), deleted.partitions());
        self.fanout.reconcile_now(&links).await;
        if let Some(link) = deleted.parent()
            && let Some(parent) = self.meta.topic(&link.name)
            && let Some(epoch) = cursor_file::parse_epoch(&link.attach_epoch)
        {
            let (fanout, child) = (self.fanout.clone(), deleted.name().to_owned());
            blocking(move || Ok(fanout.remove_link_files(&parent, &child, epoch))).await?;
        }
        Ok(())
    }

    /// A topic's record.
    pub fn topic(&self, name: &str) -> Result<Arc<Topic>, BrokerError> {
        self.meta.topic(name).ok_or(BrokerError::TopicNotFound)
    }

    /// A page of topics.
    pub fn list_topics(&self, after: &str, limit: usize) -> TopicPage {
        self.meta.list_topics(after, limit)
    }
}

/// Assigns partitions `from..` of `t` through the placement hook, over the
/// ring of live members this node's metastore holds at `now_s`
/// ([`placement::alive_ring`]); with none, this node is the ring (a single
/// node: every partition is local). Partitions the placement leaves
/// unassigned (a child's whose parent partition has no owner yet) wait for
/// the cluster controller.
fn assign_all(
    meta: &MetaStore,
    t: &Topic,
    from: u32,
    node: &str,
    now_s: i64,
) -> Result<(), BrokerError> {
    let state = meta.snapshot();
    let mut ring = placement::alive_ring(&state, now_s);
    if ring.is_empty() {
        ring.push(node.to_owned());
    }
    let assignments = placement::place(&state, t, from..t.partitions(), &ring);
    if !assignments.is_empty() {
        meta.assign_unassigned(t.name(), t.incarnation(), assignments)?;
    }
    Ok(())
}

/// Places the partitions a create (or a grow) just committed, best
/// effort: the write itself succeeded, so its caller hears of it whatever
/// happens here. The topic may already be deleted or recreated through
/// another node (the placement is refused: nothing of this incarnation is
/// left to place), or the control plane may refuse for a moment; the
/// controller places whatever is still unassigned within one tick.
fn place_after_write(meta: &MetaStore, t: &Topic, from: u32, node: &str, now_s: i64) {
    match assign_all(meta, t, from, node, now_s) {
        Ok(()) => {}
        Err(BrokerError::Meta(MetaError::NotFound(_) | MetaError::Conflict(_))) => {
            info!(
                topic = t.name(),
                incarnation = t.incarnation(),
                "the topic was deleted or recreated before its partitions were placed"
            );
        }
        Err(e) => {
            warn!(topic = t.name(), incarnation = t.incarnation(), error = %e, "placing the new partitions failed; the controller places them within a tick");
        }
    }
}
