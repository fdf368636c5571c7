//! Fan-out cursors move with their parent partition (SPEC §7.3, issue 37):
//! a parent partition's cursor files (`fanout@<epoch>.offset`, one per
//! attached child, in the partition's directory) are not segment files, so
//! the copy does not carry them. The source reads them when it freezes
//! ([`Broker::move_fanout_cursors`]) and answers them with the freeze; the
//! destination stores them in the installed partition
//! ([`Broker::move_seed_fanout_cursors`]) before the flip, so its cursors
//! resume there once it owns the partition.
//!
//! Invariant: a cursor file only moves past records whose child commits
//! are durable, so the positions read at the freeze are at or behind what
//! the source's cursors sent; the source may still send records below the
//! frozen high watermark until the flip seals it, and the destination
//! sends them again: duplicates, never a skipped record. Without a file
//! (a copy that carried none) the destination's cursor anchors at the
//! link's creation (`fanout::cursor`): more duplicates, still no skip.

use narad_meta::MetaState;

use super::{Broker, blocking};
use crate::error::BrokerError;
use crate::fanout::cursor_file::{CursorState, parse_epoch};

impl Broker {
    /// The cursor files of partition `p` of the parent `topic` (source of
    /// a move, at the freeze): one per attached child that has one.
    pub async fn move_fanout_cursors(
        &self,
        topic: &str,
        incarnation: u64,
        p: u32,
    ) -> Result<Vec<CursorState>, BrokerError> {
        let t = self.topic(topic)?;
        if t.incarnation() != incarnation || p >= t.partitions() {
            return Err(BrokerError::TopicNotFound);
        }
        let links = links_of(&self.meta.snapshot(), topic);
        if links.is_empty() {
            return Ok(Vec::new());
        }
        let topics = self.topics.clone();
        blocking(move || topics.fanout_cursors(&t, p, &links)).await
    }

    /// Stores the source's cursor files in this node's installed copy of
    /// partition `p` (destination of a move, before the flip).
    pub async fn move_seed_fanout_cursors(
        &self,
        topic: &str,
        incarnation: u64,
        p: u32,
        cursors: Vec<CursorState>,
    ) -> Result<(), BrokerError> {
        if cursors.is_empty() {
            return Ok(());
        }
        let t = self.topic(topic)?;
        if t.incarnation() != incarnation || p >= t.partitions() {
            return Err(BrokerError::TopicNotFound);
        }
        let topics = self.topics.clone();
        blocking(move || topics.seed_fanout_cursors(&t, p, &cursors)).await
    }
}

/// The attachments of parent `topic` in `state`: (child name, attach
/// epoch).
fn links_of(state: &MetaState, topic: &str) -> Vec<(String, u64)> {
    let Some(t) = state.topic(topic) else { return Vec::new() };
    t.children()
        .iter()
        .filter_map(|child| {
            let link = state.topic(child)?.parent()?.clone();
            let epoch = parse_epoch(&link.attach_epoch)?;
            (link.name == topic).then(|| (child.clone(), epoch))
        })
        .collect()
}
