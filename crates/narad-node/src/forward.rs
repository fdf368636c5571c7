//! Consume, replay and ack for partitions another node owns (SPEC §1.7,
//! §1.8, §7.5): where a partition is served, what is asked of its owner,
//! what the owner answered ([`PeerAnswer`]: status, content type and body
//! as it gave them, which the HTTP layer relays), and how a
//! [`NodeError`] becomes a node RPC reply.
//!
//! | the partition's owner | pinned consume, replay, ack |
//! |---|---|
//! | this node | served here |
//! | another alive member | forwarded (consume: op 2, waiting `wait + 2 s`; ack: 3, 18, 19) |
//! | an alive member that cannot be reached (suspect) | 503 `partition owner N is unreachable; retry later`, at once |
//! | a dead member | 503 `partition owner is down; retry later: ...` naming it |
//! | none assigned yet | 421 `this node does not own the requested partition` |
//!
//! A queue-mode consume is served by every partition of the topic in
//! turn, this node's and the other owners' (see narad-server's
//! `consume_any`).

use std::time::Duration;

use bytes::Bytes;
use narad_broker::AckAction;
use narad_cluster::rpc::{self, Reply, Request};

use crate::error::NodeError;

/// Where a partition is served from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionRoute {
    /// This node owns it (or there is no cluster).
    Local,
    /// Another alive member owns it.
    Remote(String),
    /// Its owner is a dead (or unknown) member.
    OwnerDown(String),
    /// No owner is assigned yet.
    Unassigned,
}

/// An owner's answer to a forwarded request, as it gave it: what the HTTP
/// layer relays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAnswer {
    /// The owner's status (an HTTP status).
    pub status: u16,
    /// Its content type (empty when it has no body).
    pub content_type: String,
    /// Its body.
    pub body: Bytes,
}

impl PeerAnswer {
    /// The error message of the answer (its `{"error"}`, or the text).
    pub fn message(&self) -> String {
        body_message(&self.body)
    }
}

impl From<Reply> for PeerAnswer {
    fn from(r: Reply) -> PeerAnswer {
        PeerAnswer { status: r.status, content_type: r.content_type, body: r.body }
    }
}

impl From<NodeError> for PeerAnswer {
    fn from(e: NodeError) -> PeerAnswer {
        reply_of(e).into()
    }
}

/// A consume asked of a partition's owner (node RPC op 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumeAsk {
    /// The topic.
    pub topic: String,
    /// A pinned consume or a replay of this partition; `None`: any of the
    /// owner's own partitions (`local_only`).
    pub partition: Option<u32>,
    /// A replay of this offset.
    pub offset: Option<u64>,
    /// How long the owner may wait for a message.
    pub wait: Duration,
    /// Up to this many messages, in the batch shape (`None`: one, in the
    /// single shape).
    pub max: Option<usize>,
}

impl ConsumeAsk {
    /// The node RPC request.
    pub(crate) fn request(&self) -> Request {
        Request::Consume(rpc::Consume {
            topic: self.topic.clone(),
            partition: self.partition.map_or(0, |p| p as i32),
            has_partition: self.partition.is_some(),
            offset: self.offset.map_or(0, |o| o.min(i64::MAX as u64) as i64),
            has_offset: self.offset.is_some(),
            wait_nanos: self.wait.as_nanos().min(i64::MAX as u128) as i64,
            local_only: self.partition.is_none(),
            max: self.max.map_or(1, |m| m as u32),
        })
    }

    /// How long the forward of this consume may take by default: its wait
    /// and the op's reply budget.
    pub fn timeout(&self) -> Duration {
        self.request().timeout()
    }
}

/// The Ack (3), ExtendAck (18) or Nack (19) of receipt `(partition,
/// offset, nonce)` of `topic`.
pub(crate) fn resolve_request(
    topic: &str,
    (partition, offset, nonce): (u32, u64, u64),
    action: AckAction,
) -> Request {
    let receipt = rpc::Receipt {
        topic: topic.to_owned(),
        partition: partition as i32,
        offset: offset.min(i64::MAX as u64) as i64,
        nonce: nonce.min(i64::MAX as u64) as i64,
    };
    match action {
        AckAction::Ack => Request::Ack(receipt),
        AckAction::Extend => Request::ExtendAck(receipt),
        AckAction::Nack => Request::Nack(receipt),
    }
}

/// The node RPC reply of an error: the same status and body as the HTTP
/// answer.
pub fn reply_of(e: NodeError) -> Reply {
    Reply::error(e.status, &e.message)
}

/// The error message of an owner's reply (its `{"error"}`, or the text).
pub fn reply_message(reply: &Reply) -> String {
    body_message(&reply.body)
}

fn body_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{owner_down, peer_failed};

    #[test]
    fn errors_round_trip_as_replies() {
        let down = reply_of(owner_down("t", 2, "n3"));
        assert_eq!(
            (down.status, reply_message(&down).as_str()),
            (503, "partition owner is down; retry later: t/2 is owned by n3, which is not alive")
        );
        assert_eq!(down.content_type, "application/json");
        let failed = reply_of(peer_failed("t", 0, "n2", "no handshake within 1s"));
        assert_eq!(failed.status, 502);
        assert_eq!(
            reply_message(&failed),
            "peer rpc failed: t/0 is owned by n2, which did not answer: no handshake within 1s"
        );
        let gone = reply_of(NodeError::new(410, "stale"));
        assert_eq!((gone.status, reply_message(&gone).as_str()), (410, "stale"));
        assert_eq!(PeerAnswer::from(gone).message(), "stale");
    }

    #[test]
    fn a_consume_ask_is_the_op_2_it_always_was() {
        let ask = ConsumeAsk {
            topic: "t".into(),
            partition: Some(3),
            offset: Some(9),
            wait: Duration::from_millis(1500),
            max: None,
        };
        let Request::Consume(c) = ask.request() else { panic!() };
        assert_eq!(
            (c.partition, c.has_partition, c.offset, c.has_offset, c.local_only, c.max),
            (3, true, 9, true, false, 1)
        );
        assert_eq!(c.wait_nanos, 1_500_000_000);
        let any = ConsumeAsk { partition: None, offset: None, max: Some(5), ..ask };
        let Request::Consume(c) = any.request() else { panic!() };
        assert_eq!((c.has_partition, c.local_only, c.max, c.has_offset), (false, true, 5, false));
    }
}
