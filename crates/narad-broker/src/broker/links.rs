//! Parent/child links (fan-out): [`Broker::attach_child`],
//! [`Broker::detach_child`], [`Broker::children`] and their owners' side
//! for other nodes (`*_for_peer`, the server side of [`LinkPeers`]), plus
//! the helpers `anchor_new_link`, `other_owners`, `settle_other_owners`,
//! `merge_lags` and `parse_epoch`. The cursors themselves run in
//! [`crate::fanout`].
//!
//! Fields worked on here: `fanout` (this node's cursors) and `links` (the
//! other owners of a parent's partitions; `None` on a single node).
//!
//! Invariants the code relies on:
//! - Link changes on this node are serialised by `fanout.lock_links()`.
//! - A new link's cursor files are written at each parent partition's high
//!   watermark before the link commits, and removed if the commit fails.
//! - Other owners are asked with a time limit ([`LINK_PEER_TIMEOUT`],
//!   [`LAG_PEER_TIMEOUT`]); one that does not answer never fails the
//!   operation: it is logged, or its lag is reported incomplete.
//! - A peer's lag or anchor request names the parent's incarnation; another
//!   incarnation here reads as "not found".

use std::sync::Arc;
use std::time::Duration;

use narad_meta::{AttachChildRequest, MetaError, Topic};
use tracing::warn;

use super::{Broker, blocking};
use crate::error::BrokerError;
#[cfg(doc)]
use crate::fanout::peers::LinkPeers;
use crate::fanout::peers::{LAG_PEER_TIMEOUT, LINK_PEER_TIMEOUT, NewLink, PeerLag};
use crate::fanout::{ChildLag, cursor_file};

/// A parent's children's lag: this node's figures merged with each other
/// owner's (`None`: it did not answer). Complete only when every partition
/// is covered by an answer and every answer is complete.
fn merge_lags(
    partitions: u32,
    here: PeerLag,
    others: Vec<(String, Vec<u32>, Option<PeerLag>)>,
) -> Vec<ChildLag> {
    let mut covered: std::collections::BTreeSet<u32> = here.partitions.iter().copied().collect();
    let mut out = here.children;
    let mut answered_all = true;
    for (_, _, answer) in others {
        let Some(answer) = answer else {
            answered_all = false;
            continue;
        };
        covered.extend(answer.partitions.iter().copied());
        for lag in &mut out {
            match answer.children.iter().find(|c| c.name == lag.name) {
                Some(theirs) => lag.merge(theirs),
                // Their replica does not know the link yet (or any more).
                None => lag.lag_complete = false,
            }
        }
    }
    let whole = answered_all && (0..partitions).all(|p| covered.contains(&p));
    for lag in &mut out {
        lag.lag_complete &= whole;
    }
    out
}

impl Broker {
    /// Attaches an existing topic as a child of `request.parent`; returns
    /// the parent. The child starts at the parent's current high watermark
    /// in every partition: records the parent committed before the attach
    /// are not delivered to it, records committed after it are. Its cursors
    /// are running when this returns (on a cluster: those on this node;
    /// the other owners start theirs when their replicas apply the link).
    pub async fn attach_child(
        &self,
        request: AttachChildRequest,
    ) -> Result<Arc<Topic>, BrokerError> {
        self.check_running()?;
        let links = self.fanout.lock_links().await;
        let meta = self.meta.clone();
        let (command, parent) = blocking(move || {
            let command = meta.resolve_attach_child(request)?;
            let parent = meta.topic(&command.parent).ok_or(BrokerError::TopicNotFound)?;
            Ok((command, parent))
        })
        .await?;
        let epoch = parse_epoch(&command.attach_epoch)?;
        let child = command.child.clone();
        self.anchor_new_link(&parent, &child, epoch).await?;
        let (meta, fanout) = (self.meta.clone(), self.fanout.clone());
        let parent = blocking(move || {
            meta.propose_attach_child(command).map_err(|e| {
                fanout.remove_link_files(&parent, &child, epoch);
                BrokerError::from(e)
            })
        })
        .await?;
        self.fanout.reconcile_now(&links).await;
        // The other owners start their cursors before the attach answers,
        // so the child's lag is complete from the first read on.
        self.settle_other_owners(&parent, LinkChange::Attached).await;
        Ok(parent)
    }

    /// Writes the cursor files of a new link at each parent partition's
    /// high watermark before the link is committed: this node's partitions
    /// here, every other owner's through it (at most
    /// [`LINK_PEER_TIMEOUT`]; an owner that does not answer leaves its
    /// partitions to the attach-time fallback, logged).
    pub(super) async fn anchor_new_link(
        &self,
        parent: &Arc<Topic>,
        child: &str,
        epoch: u64,
    ) -> Result<(), BrokerError> {
        let fanout = self.fanout.clone();
        let (p, c) = (parent.clone(), child.to_owned());
        blocking(move || Ok(fanout.anchor_link(&p, &c, epoch, &fanout.owned_partitions(&p))))
            .await?;
        let Some(peers) = &self.links else { return Ok(()) };
        let link = NewLink {
            parent: parent.name().to_owned(),
            incarnation: parent.incarnation(),
            child: child.to_owned(),
            epoch,
        };
        let asks = self.other_owners(parent).into_iter().map(|(member, partitions)| {
            let ask = peers.anchor(&member, &link, &partitions);
            async move { (member, partitions, tokio::time::timeout(LINK_PEER_TIMEOUT, ask).await) }
        });
        for (member, partitions, answer) in futures_util::future::join_all(asks).await {
            let missing = match answer {
                Ok(Ok(anchored)) => {
                    partitions.iter().filter(|p| !anchored.contains(p)).copied().collect()
                }
                Ok(Err(e)) => {
                    warn!(parent = parent.name(), child, peer = %member, error = %e, "an owner could not anchor a new child's cursors; they start from the attach time");
                    partitions
                }
                Err(_) => {
                    warn!(parent = parent.name(), child, peer = %member, "an owner did not answer the anchor of a new child's cursors in time; they start from the attach time");
                    partitions
                }
            };
            if !missing.is_empty() {
                warn!(parent = parent.name(), child, peer = %member, partitions = ?missing, "parent partitions not anchored at their high watermark; their cursors start from the attach time");
            }
        }
        Ok(())
    }

    /// The other members owning partitions of `parent`, with their
    /// partitions (cluster only; unassigned partitions are nobody's).
    fn other_owners(&self, parent: &Topic) -> Vec<(String, Vec<u32>)> {
        let snap = self.meta.snapshot();
        let mut out: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
        for p in 0..parent.partitions() {
            if let Some(a) = snap.assignment(parent.name(), p)
                && a.owner_id != self.config.node_id
            {
                out.entry(a.owner_id.clone()).or_default().push(p);
            }
        }
        out.into_iter().collect()
    }

    /// Detaches `child` from `parent`. When this returns the link's cursors
    /// have stopped and their files are removed; the child keeps what it
    /// received and becomes standalone.
    pub async fn detach_child(&self, parent: &str, child: &str) -> Result<(), BrokerError> {
        self.check_running()?;
        let links = self.fanout.lock_links().await;
        let (meta, p, c) = (self.meta.clone(), parent.to_owned(), child.to_owned());
        let (parent, link) = blocking(move || Ok(meta.detach_child(&p, &c)?)).await?;
        self.fanout.reconcile_now(&links).await;
        if let Some(epoch) = cursor_file::parse_epoch(&link.attach_epoch) {
            // Cursors that never ran left their anchor files behind.
            let (fanout, child, parent) = (self.fanout.clone(), child.to_owned(), parent.clone());
            blocking(move || Ok(fanout.remove_link_files(&parent, &child, epoch))).await?;
        }
        self.settle_other_owners(&parent, LinkChange::Detached).await;
        Ok(())
    }

    /// After a link change this node has applied: each other owner of
    /// `parent`'s partitions applies it too and starts the cursors it adds
    /// or stops the ones it ends before this returns (at most [`LINK_PEER_TIMEOUT`] each; one that
    /// does not answer stops them within a second of applying it).
    async fn settle_other_owners(&self, parent: &Topic, change: LinkChange) {
        let Some(peers) = &self.links else { return };
        let applied = self.meta.snapshot().applied_index();
        let asks = self.other_owners(parent).into_iter().map(|(member, _)| {
            let ask = peers.settle(&member, applied);
            async move { (member, tokio::time::timeout(LINK_PEER_TIMEOUT, ask).await) }
        });
        for (member, answer) in futures_util::future::join_all(asks).await {
            match (answer, change) {
                (Ok(Ok(())), _) => {}
                (Ok(Err(e)), LinkChange::Detached) => {
                    warn!(parent = parent.name(), peer = %member, error = %e, "an owner did not confirm it stopped a dissolved link's cursors; it stops them when it applies the change")
                }
                (Err(_), LinkChange::Detached) => {
                    warn!(parent = parent.name(), peer = %member, "an owner did not confirm in time that it stopped a dissolved link's cursors; it stops them when it applies the change")
                }
                (Ok(Err(e)), LinkChange::Attached) => {
                    warn!(parent = parent.name(), peer = %member, error = %e, "an owner did not confirm it started a new link's cursors; it starts them when it applies the change")
                }
                (Err(_), LinkChange::Attached) => {
                    warn!(parent = parent.name(), peer = %member, "an owner did not confirm in time that it started a new link's cursors; it starts them when it applies the change")
                }
            }
        }
    }

    /// The children of `parent`, in attach order, with their fan-out lag
    /// (on a cluster, every owner's cursors: `lag_complete` only when every
    /// owner answered within [`LAG_PEER_TIMEOUT`]).
    pub async fn children(&self, parent: &str) -> Result<Vec<ChildLag>, BrokerError> {
        let parent = self.topic(parent)?;
        let (fanout, p) = (self.fanout.clone(), parent.clone());
        let here = blocking(move || Ok(fanout.lag_here(&p))).await?;
        let Some(peers) = &self.links else { return Ok(here.children) };
        let asks = self.other_owners(&parent).into_iter().map(|(member, partitions)| {
            let ask = peers.lag(&member, parent.name(), parent.incarnation());
            async move { (member, partitions, tokio::time::timeout(LAG_PEER_TIMEOUT, ask).await) }
        });
        let answers: Vec<(String, Vec<u32>, Option<PeerLag>)> =
            futures_util::future::join_all(asks)
                .await
                .into_iter()
                .map(|(member, partitions, answer)| {
                    (member, partitions, answer.ok().and_then(Result::ok))
                })
                .collect();
        Ok(merge_lags(parent.partitions(), here, answers))
    }

    /// This node's figures of `parent`'s children (the owner's side of
    /// [`LinkPeers::lag`]); `incarnation` must be the one held here.
    pub async fn fanout_lag_for_peer(
        &self,
        parent: &str,
        incarnation: u64,
    ) -> Result<PeerLag, BrokerError> {
        let parent = self.topic_of_incarnation(parent, incarnation)?;
        let fanout = self.fanout.clone();
        blocking(move || Ok(fanout.lag_here(&parent))).await
    }

    /// Anchors another node's new link in this node's partitions of its
    /// parent (the owner's side of [`LinkPeers::anchor`]); the partitions
    /// anchored.
    pub async fn anchor_link_for_peer(
        &self,
        link: NewLink,
        partitions: Vec<u32>,
    ) -> Result<Vec<u32>, BrokerError> {
        self.check_running()?;
        let parent = self.topic_of_incarnation(&link.parent, link.incarnation)?;
        let _links = self.fanout.lock_links().await;
        let fanout = self.fanout.clone();
        blocking(move || Ok(fanout.anchor_for_peer(&parent, &link, &partitions))).await
    }

    /// Applies the metastore up to `applied_index` (waiting at most
    /// [`LINK_PEER_TIMEOUT`]) and reconciles the fan-out cursors (the
    /// owner's side of [`LinkPeers::settle`]).
    pub async fn settle_links_for_peer(&self, applied_index: u64) -> Result<(), BrokerError> {
        self.check_running()?;
        let deadline = tokio::time::Instant::now() + LINK_PEER_TIMEOUT;
        while self.meta.snapshot().applied_index() < applied_index {
            if tokio::time::Instant::now() >= deadline {
                return Err(BrokerError::Meta(MetaError::Unavailable(format!(
                    "this replica has not applied index {applied_index} yet"
                ))));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let links = self.fanout.lock_links().await;
        self.fanout.reconcile_now(&links).await;
        Ok(())
    }
}

/// An attach epoch the metastore just stamped.
pub(super) fn parse_epoch(hex: &str) -> Result<u64, BrokerError> {
    cursor_file::parse_epoch(hex)
        .ok_or_else(|| BrokerError::internal("attach", format!("bad attach epoch {hex:?}")))
}

/// Which link change [`Broker::settle_other_owners`] settles (for its
/// warnings).
#[derive(Debug, Clone, Copy)]
enum LinkChange {
    Attached,
    Detached,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lag(name: &str, messages: u64, seconds: f64, complete: bool) -> ChildLag {
        ChildLag {
            name: name.into(),
            delay_ms: 0,
            lag_messages: messages,
            lag_seconds: seconds,
            lag_complete: complete,
        }
    }

    #[test]
    fn a_childs_lag_adds_every_owners_figures_and_is_complete_only_when_all_answered() {
        let here = PeerLag { partitions: vec![0], children: vec![lag("a", 3, 1.0, true)] };
        let n2 = PeerLag { partitions: vec![1], children: vec![lag("a", 4, 2.5, true)] };
        let n3 = PeerLag { partitions: vec![2], children: vec![lag("a", 0, 0.0, true)] };
        let all = merge_lags(
            3,
            here.clone(),
            vec![("n2".into(), vec![1], Some(n2.clone())), ("n3".into(), vec![2], Some(n3))],
        );
        assert_eq!(all, vec![lag("a", 7, 2.5, true)]);
        // An owner that did not answer: its partitions are not counted.
        let silent = merge_lags(
            3,
            here.clone(),
            vec![("n2".into(), vec![1], Some(n2.clone())), ("n3".into(), vec![2], None)],
        );
        assert_eq!(silent, vec![lag("a", 7, 2.5, false)]);
        // A partition nobody reports (unassigned): incomplete.
        assert_eq!(
            merge_lags(3, here.clone(), vec![("n2".into(), vec![1], Some(n2))]),
            vec![lag("a", 7, 2.5, false)]
        );
        // An owner whose replica does not know the link yet.
        let unaware = PeerLag { partitions: vec![1, 2], children: vec![] };
        assert_eq!(
            merge_lags(3, here, vec![("n2".into(), vec![1, 2], Some(unaware))]),
            vec![lag("a", 3, 1.0, false)]
        );
    }
}
