//! A consume forwarded to a partition's owner leases nothing for a
//! requester that no longer exists (issue 36).
//!
//! The call runs in a task of its own, apart from the HTTP request that
//! asked for it. When that request goes away (its client disconnected, or
//! a queue-mode consume took another owner's answer), the task asks the
//! owner to stop the call (CancelRequest, op 38): a long poll still
//! waiting ends there, leasing nothing. It then still waits for the
//! owner's answer: one that the owner had already sent with messages is
//! given back at once (a Nack, op 19, per receipt handle), not left
//! hidden for the topic's visibility timeout.
//!
//! What is not covered: an owner from before op 38 answers the cancel 400
//! and its poll runs on (what it then leases is still given back, when its
//! answer arrives within the call's timeout); an answer that reached the
//! HTTP layer and was lost writing to a client that had just gone is lost
//! as a local consume's is (the lease expires).

use std::sync::Arc;
use std::time::Duration;

use narad_cluster::rpc::{self, Reply, Request};
use narad_cluster::{Error, Peer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels of the release counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReleaseLabels {
    /// `cancelled` (the caller went away while the owner worked: the owner
    /// was asked to stop), `released` (a message of an answer nobody was
    /// waiting for any more, nacked on its owner), `release_failed` (that
    /// nack failed: the message waits for its visibility timeout).
    pub outcome: &'static str,
}

/// `narad_cluster_forwarded_consume_releases_total{outcome}`.
#[derive(Debug, Clone, Default)]
pub struct Releases(Family<ReleaseLabels, Counter>);

impl Releases {
    /// Registers the counter.
    pub fn new(registry: &mut Registry) -> Self {
        let r = Releases::default();
        registry.register(
            "cluster_forwarded_consume_releases",
            "Forwarded consumes whose caller went away: owners asked to stop, and messages of their answers given back, by outcome",
            r.0.clone(),
        );
        r
    }

    fn count(&self, outcome: &'static str, n: u64) {
        self.0.get_or_create(&ReleaseLabels { outcome }).inc_by(n);
    }
}

/// How long the nack of a message nobody waits for may take.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Forwards consume `request` to `peer` (a watched call, at most
/// `timeout`) from a task of its own; see the module header for what
/// happens when the caller stops waiting.
pub async fn call(
    peer: Arc<Peer>,
    request: Request,
    timeout: Duration,
    releases: Releases,
) -> Result<Reply, Error> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut tx = tx;
        let reply = {
            let gone = tx.closed();
            let counted = async {
                gone.await;
                releases.count("cancelled", 1);
            };
            peer.call_cancellable(&request, timeout, counted).await
        };
        if let Err(Ok(reply)) = tx.send(reply) {
            let Request::Consume(c) = &request else { return };
            give_back(&peer, &c.topic, &reply, &releases).await;
        }
    });
    rx.await.unwrap_or_else(|_| Err(Error::Connection("the forwarding task ended".into())))
}

/// Nacks on `peer` every message of `reply` (an owner's consume answer
/// nobody waits for any more), all at once.
async fn give_back(peer: &Peer, topic: &str, reply: &Reply, releases: &Releases) {
    if reply.status != 200 {
        return;
    }
    let handles = receipt_handles(&reply.body);
    let nacks = handles.iter().filter_map(|h| {
        let (partition, offset, nonce) = narad_broker::consume::shard::parse_receipt_handle(h)?;
        let request = Request::Nack(rpc::Receipt {
            topic: topic.to_owned(),
            partition: partition as i32,
            offset: offset.min(i64::MAX as u64) as i64,
            nonce: nonce.min(i64::MAX as u64) as i64,
        });
        Some(async move { peer.call_with_timeout(&request, RELEASE_TIMEOUT).await })
    });
    let answers = futures_util::future::join_all(nacks).await;
    let released = answers.iter().filter(|a| a.as_ref().is_ok_and(|r| r.status == 204)).count();
    releases.count("released", released as u64);
    releases.count("release_failed", (handles.len() - released) as u64);
    tracing::info!(
        peer = %peer.addr(),
        topic,
        released,
        failed = handles.len() - released,
        "gave back the messages of a forwarded consume whose caller went away"
    );
}

/// The receipt handles of a consume answer (one message, or the batch
/// shape `{"messages":[...]}`).
fn receipt_handles(body: &[u8]) -> Vec<String> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else { return Vec::new() };
    let messages = match v.get("messages").and_then(|m| m.as_array()) {
        Some(batch) => batch.iter().collect::<Vec<_>>(),
        None => vec![&v],
    };
    messages
        .into_iter()
        .filter_map(|m| m.get("receipt_handle")?.as_str().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_read_from_either_answer_shape() {
        let one = br#"{"topic":"t","partition":1,"offset":4,"payload":{},"timestamp":1,"receipt_handle":"1:4:9"}"#;
        assert_eq!(receipt_handles(one), ["1:4:9"]);
        let batch = br#"{"messages":[{"receipt_handle":"0:1:1"},{"receipt_handle":"2:7:3"}]}"#;
        assert_eq!(receipt_handles(batch), ["0:1:1", "2:7:3"]);
        assert!(receipt_handles(br#"{"topic":"t","offset":3}"#).is_empty(), "a replay: no lease");
        assert!(receipt_handles(b"not json").is_empty());
    }
}
