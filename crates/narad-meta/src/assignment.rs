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
}
