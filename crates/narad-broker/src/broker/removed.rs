//! A member removed for good (`narad cluster remove --force`, metastore op
//! 17): the partitions it owned that this node takes over. Their logs are
//! created at their start offsets by [`crate::topics::Topics::partition`]
//! (see [`crate::topics::BaseOffsets`]); what is left here is the fence.
//! This node may hold a partition's leftover from an earlier ownership
//! that a move took to the removed member: its gate is sealed "moved to"
//! that member, which is final for the incarnation. The partition is this
//! node's again, so the seal goes (the leftover log itself is replaced at
//! its next open). The listener only queues (it runs under the metastore's
//! writer lock); a task changes the gate.

use std::sync::Arc;

use tokio::task::JoinHandle;
use tracing::info;

use super::{Broker, blocking};
use crate::fence::PartitionKey;

impl Broker {
    /// Follows removals of members: lifts the "moved" seal of every
    /// partition a removal gave this node.
    pub(super) fn follow_removals(
        self: &Arc<Self>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> JoinHandle<()> {
        let me_id = self.config.node_id.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(PartitionKey, String)>();
        self.meta.on_applied(Arc::new(move |_command, response| {
            if let narad_meta::Response::MemberRemoved { member, reassigned } = response {
                for r in reassigned.iter().filter(|r| r.owner_id == me_id) {
                    let key = PartitionKey::new(&r.topic, r.incarnation, r.partition);
                    let _ = tx.send((key, member.id.clone()));
                }
            }
        }));
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let (key, removed) = tokio::select! {
                    next = rx.recv() => match next {
                        Some(next) => next,
                        None => return,
                    },
                    _ = stop.changed() => return,
                };
                let Some(b) = me.upgrade() else { return };
                let fences = b.fences().clone();
                let _ = blocking(move || {
                    if fences.shut(&key).is_some() {
                        info!(topic = %key.topic, partition = key.partition, removed = %removed,
                            "partition of a removed member is this node's again: its seal here is lifted");
                    }
                    fences.forget(&key);
                    Ok(())
                })
                .await;
            }
        })
    }
}
