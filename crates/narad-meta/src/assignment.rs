//! Partition assignments: which node owns `(topic, partition)`, and where a
//! planned move is taking it.

use serde::{Deserialize, Serialize};

/// The owner of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    /// The member that owns the partition's log.
    pub owner_id: String,
    /// The member a rebalance is moving it to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_id: Option<String>,
    /// The offset the owner's log starts at when the owner has no log of
    /// the partition yet: set when the partition's earlier owner was
    /// removed for good with its disk (`RemoveMember`, op 17), so that
    /// offsets keep growing from where the cluster last saw them instead of
    /// starting again at 0. Absent otherwise (and in records written
    /// before it existed); a move's flip drops it (the new owner installs
    /// a copy of the log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_offset: Option<u64>,
    /// The metastore log index of the `SetAssignmentTarget` that started
    /// the move in flight (with `target_id`): names the attempt, so that a
    /// `CompleteMove` or `AbortMove` of an earlier attempt between the same
    /// two members (aborted since, then planned again) cannot act on this
    /// one. Absent when nothing moves (and in records written before it
    /// existed: such a move is matched on owner and target only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub move_attempt: Option<u64>,
}
