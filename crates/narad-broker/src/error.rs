//! The data plane's one error enum. Each variant has exactly one HTTP
//! meaning (the server maps it with one exhaustive match); causes are kept.

use std::sync::Arc;

use narad_meta::MetaError;

/// Everything the broker can refuse or fail with.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The topic does not exist (404).
    #[error("topic not found")]
    TopicNotFound,
    /// The request is malformed or violates a rule (400). The text is the
    /// full wire message.
    #[error("{0}")]
    Invalid(String),
    /// Produce into a delayed child (409).
    #[error("direct produce to a delayed child topic is not allowed")]
    DelayedChild,
    /// The receipt handle matches no live lease (410).
    #[error("receipt handle no longer matches an active reservation")]
    StaleHandle,
    /// A replay offset is older than the log keeps (410).
    #[error("consume failed: offset {offset} aged out of retention (oldest retained: {oldest})")]
    AgedOut {
        /// The offset asked for.
        offset: u64,
        /// The oldest offset still kept.
        oldest: u64,
    },
    /// A replay offset cannot be read (410).
    #[error("consume failed: offset {0} is not readable")]
    Unreadable(u64),
    /// The acked-ahead set is full (503).
    #[error("acked-ahead set is full; head of queue may be stuck")]
    AckedAheadFull,
    /// The node is shutting down (503).
    #[error("server is shutting down")]
    ShuttingDown,
    /// A cluster node that has not reached its group's leader since it
    /// started takes no produce (503): its replica may be stale, and a
    /// node removed from the cluster while it was away never reaches one.
    #[error(
        "not ready: this node has not reached the cluster's raft leader since it started; retry, or produce through another node"
    )]
    LeaderNotReached,
    /// The partition moved to another member (421): this node's log of it
    /// is a leftover; the sender asks the new owner.
    #[error("not partition owner: {0}")]
    NotOwner(String),
    /// A metastore error (its own status).
    #[error(transparent)]
    Meta(#[from] MetaError),
    /// The ingress WAL refused or failed the append (500 `produce failed`;
    /// 503 when nothing was written and the WAL is not latched, so the
    /// produce may simply be retried).
    #[error("produce failed: {0}")]
    Wal(#[source] Arc<narad_wal::WalError>),
    /// A storage or internal failure during `op` (500 `<op> failed`).
    #[error("{op} failed: {detail}")]
    Internal {
        /// The operation, e.g. `consume`.
        op: &'static str,
        /// What went wrong (logged; the client sees `<op> failed`).
        detail: String,
    },
}

impl BrokerError {
    pub(crate) fn internal(op: &'static str, detail: impl std::fmt::Display) -> BrokerError {
        BrokerError::Internal { op, detail: detail.to_string() }
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> u16 {
        match self {
            BrokerError::TopicNotFound => 404,
            BrokerError::Invalid(_) => 400,
            BrokerError::DelayedChild => 409,
            BrokerError::StaleHandle | BrokerError::AgedOut { .. } | BrokerError::Unreadable(_) => {
                410
            }
            BrokerError::AckedAheadFull
            | BrokerError::ShuttingDown
            | BrokerError::LeaderNotReached => 503,
            BrokerError::NotOwner(_) => 421,
            BrokerError::Meta(e) => e.status(),
            BrokerError::Wal(e) if e.is_retriable() => 503,
            BrokerError::Wal(_) | BrokerError::Internal { .. } => 500,
        }
    }

    /// The message a client sees (internal details stay in the logs).
    pub fn public_message(&self) -> String {
        match self {
            BrokerError::Wal(e) if e.is_retriable() => {
                "produce failed: storage temporarily unavailable; retry".to_owned()
            }
            BrokerError::Wal(_) => "produce failed".to_owned(),
            BrokerError::Internal { op, .. } => format!("{op} failed"),
            other => other.to_string(),
        }
    }
}
