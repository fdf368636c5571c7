//! The errors a node answers with: a status and the message a client sees,
//! built from [`BrokerError::status`] and [`BrokerError::public_message`]
//! (and, for a partition served elsewhere, SPEC's texts). Node RPC sends
//! them as `{"error"}` replies ([`crate::forward::reply_of`]); the HTTP
//! layer answers them as its own errors, with the same status and body.
//!
//! Broker errors are logged once, where they become a [`NodeError`]: at
//! DEBUG when refused by design, one WARN per 10 s while the control plane
//! is unavailable, at ERROR for any other 5xx.

use std::sync::atomic::{AtomicU64, Ordering};

use narad_broker::BrokerError;
use narad_meta::MetaError;
use tracing::{debug, error, warn};

/// An error answer: an HTTP status (node RPC replies carry the same
/// numbers) and the message a client sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {message}")]
pub struct NodeError {
    /// The status.
    pub status: u16,
    /// The message a client sees.
    pub message: String,
}

impl NodeError {
    /// `status` with `message`.
    pub fn new(status: u16, message: impl Into<String>) -> NodeError {
        NodeError { status, message: message.into() }
    }
}

/// When the last "control plane unavailable" WARN went out (ms since the
/// Unix epoch; 0 = never).
static CONTROL_PLANE_WARNED_MS: AtomicU64 = AtomicU64::new(0);

/// At most one "control plane unavailable" WARN per 10 s.
fn control_plane_warn_due() -> bool {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let last = CONTROL_PLANE_WARNED_MS.load(Ordering::Relaxed);
    now.saturating_sub(last) >= 10_000
        && CONTROL_PLANE_WARNED_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

impl From<BrokerError> for NodeError {
    fn from(e: BrokerError) -> NodeError {
        let status = match e.status() {
            s @ 100..=999 => s,
            _ => 500,
        };
        match e {
            // Designed back-pressure, not a fault: the client retries (the
            // lease is kept) and `narad_ack_rejected_total{reason="cap"}`
            // counts it; at ERROR, 64 consumers behind one slow head wrote
            // ~40,000 lines a second. Likewise refusals while shutting down.
            BrokerError::AckedAheadFull
            | BrokerError::ShuttingDown
            | BrokerError::LeaderNotReached => {
                debug!(error = %e, status, "request refused");
            }
            // No leader (an election, a lost quorum) or the leader out of
            // reach: the cluster's state, not a fault of this request, and
            // every metadata write of a leaderless minute would repeat it.
            // The control plane logs the election itself; one WARN per
            // 10 s says requests are being refused.
            BrokerError::Meta(MetaError::Unavailable(_) | MetaError::Upstream(_))
                if control_plane_warn_due() =>
            {
                warn!(error = %e, status, "metadata write refused: control plane unavailable");
            }
            BrokerError::Meta(MetaError::Unavailable(_) | MetaError::Upstream(_)) => {}
            // The message is the one it had when only the HTTP layer made
            // these errors.
            _ if status >= 500 => {
                error!(error = %e, status, "http server error");
            }
            _ => {}
        }
        NodeError { status, message: e.public_message() }
    }
}

impl From<MetaError> for NodeError {
    fn from(e: MetaError) -> NodeError {
        BrokerError::Meta(e).into()
    }
}

/// The 503 for a partition whose owner is not alive: SPEC's text
/// (`partition owner is down; retry later`), as JSON like every other error
/// (Narad sends it as plain text; a client that reads the text finds it at
/// the start of the `error`), naming the owner.
pub fn owner_down(topic: &str, partition: u32, owner: &str) -> NodeError {
    NodeError::new(
        503,
        format!(
            "partition owner is down; retry later: {topic}/{partition} is owned by {owner}, \
             which is not alive"
        ),
    )
}

/// The 503 for a partition whose owner is alive as far as membership
/// knows but cannot be reached: a call to it failed in transport and it
/// has not answered since (issue 36). Answered at once until the owner
/// answers a ping or membership marks it dead ([`owner_down`]).
pub fn owner_unreachable(owner: &str) -> NodeError {
    NodeError::new(503, format!("partition owner {owner} is unreachable; retry later"))
}

/// SPEC's 421 for a partition no one is assigned.
pub fn not_owner() -> NodeError {
    NodeError::new(421, "this node does not own the requested partition")
}

/// The 502 for a forward to an alive owner that failed in transport:
/// SPEC's text (`peer rpc failed`), as JSON, naming the owner and the
/// cause.
pub fn peer_failed(topic: &str, partition: u32, owner: &str, why: &str) -> NodeError {
    NodeError::new(
        502,
        format!(
            "peer rpc failed: {topic}/{partition} is owned by {owner}, which did not answer: {why}"
        ),
    )
}
