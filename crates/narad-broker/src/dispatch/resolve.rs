//! Resolving a WAL record to its destination on one node.

use std::sync::Arc;

use narad_meta::MetaStore;
use narad_wal::WalRecord;
use tracing::warn;

use super::core::{Dest, OwnerId, Target, Topology};
use super::driver::Resolver;

/// Resolves WAL records against this node's metastore replica. On one node
/// the local metastore is the authority, so a missing topic or another
/// incarnation is a confirmed deletion.
#[derive(Debug)]
pub struct LocalResolver {
    meta: Arc<MetaStore>,
}

impl LocalResolver {
    /// A resolver reading `meta`.
    pub fn new(meta: Arc<MetaStore>) -> Self {
        LocalResolver { meta }
    }
}

impl Topology for LocalResolver {
    fn owner_of(&self, topic: &str, partition: u32) -> Option<(OwnerId, bool)> {
        let t = self.meta.topic(topic)?;
        (partition < t.partitions()).then_some((0, true))
    }
}

impl Resolver for LocalResolver {
    fn resolve(&self, record: &WalRecord, topic: &Arc<str>) -> Target {
        let Some(t) = self.meta.topic(topic) else { return Target::Discard };
        if record.incarnation.is_some_and(|id| id != t.incarnation()) {
            warn!(
                topic = %topic,
                topic_id = record.incarnation,
                partition = record.partition,
                seq = record.seq,
                "discarding undispatched record of a deleted topic incarnation"
            );
            return Target::Discard;
        }
        let partitions = t.partitions();
        Target::Commit {
            dest: Dest { topic: topic.clone(), partition: record.partition % partitions },
            owner: 0,
            alive: true,
            partitions,
        }
    }
}
