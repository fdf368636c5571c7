//! Consumes served from this node's own partitions, for a client of this
//! node (the HTTP consume) and for one of another node (node RPC op 2,
//! whose answer is the same JSON), and ReadyCounts (op 37) for the
//! queue-mode consumes of other nodes.

use std::sync::Arc;
use std::time::Duration;

use narad_broker::limits::CONSUME_BATCH_BYTES;
use narad_broker::{AckAction, Broker, Delivered};
use narad_cluster::rpc::{self, Reply};

use crate::error::NodeError;
use crate::forward;
use crate::wire::{MessageView, encode_message};

fn view(d: &Delivered) -> MessageView<'_> {
    MessageView {
        topic: &d.topic,
        partition: d.partition,
        offset: d.offset,
        key: d.key.as_deref(),
        payload: &d.payload,
        commit_time_ms: d.commit_time_ms,
        receipt_handle: d.receipt_handle.as_deref(),
    }
}

/// The JSON answer to a consume and how many of `got` it holds (`None`
/// when `got` is empty): a batch answer is at most [`CONSUME_BATCH_BYTES`]
/// as sent (base64, escapes, field names and the final newline counted),
/// with at least one message.
fn messages_json(got: &[Delivered], batch: bool) -> Option<(String, usize)> {
    if got.is_empty() {
        return None;
    }
    let mut s = String::with_capacity(
        got.iter().map(|d| d.payload.len() + 160).sum::<usize>().min(CONSUME_BATCH_BYTES),
    );
    let mut sent = 1;
    if batch {
        const CLOSE: usize = "]}\n".len();
        s.push_str("{\"messages\":[");
        for (i, d) in got.iter().enumerate() {
            let before = s.len();
            if i > 0 {
                s.push(',');
            }
            encode_message(&mut s, &view(d));
            if i > 0 && s.len() + CLOSE > CONSUME_BATCH_BYTES {
                s.truncate(before);
                break;
            }
            sent = i + 1;
        }
        s.push_str("]}");
    } else {
        encode_message(&mut s, &view(&got[0]));
    }
    Some((s, sent))
}

/// A consume served from this node's partitions: a replay (`offset`, one
/// record, no lease), a pinned or a queue-mode consume (`max`: the batch
/// shape). The JSON of the answer, or `None` for nothing (204). Leased
/// messages that do not fit the answer are given back at once.
pub async fn consume_here(
    broker: &Arc<Broker>,
    topic: &str,
    partition: Option<u32>,
    offset: Option<u64>,
    wait: Duration,
    max: Option<usize>,
) -> Result<Option<String>, NodeError> {
    if let (Some(offset), Some(partition)) = (offset, partition) {
        let got = broker.replay(topic, partition, offset, 1).await?;
        return Ok(messages_json(&got, false).map(|(json, _)| json));
    }
    let got = broker.consume(topic, partition, wait, max.unwrap_or(1)).await?;
    Ok(answer_of(broker, topic, &got, max.is_some()))
}

/// The JSON answer of leased messages `got` (the batch shape with
/// `batch`), `None` for none. Leased messages that do not fit the answer
/// are given back at once.
pub fn answer_of(broker: &Broker, topic: &str, got: &[Delivered], batch: bool) -> Option<String> {
    let (json, sent) = messages_json(got, batch)?;
    // What did not fit is given back at once, not left leased until its
    // visibility timeout. (A nack that finds the lease gone is harmless.)
    for d in &got[sent..] {
        if let Some(h) = &d.receipt_handle {
            let _ = broker.resolve(topic, h, AckAction::Nack);
        }
    }
    Some(json)
}

/// ReadyCounts (37) from another node: this node's partitions of the topic
/// and their messages ready to lease, once one has some or the wait (at
/// most 30 s) is over.
pub(crate) async fn ready_for_peer(broker: &Broker, r: rpc::ReadyCounts) -> Reply {
    let wait = Duration::from_nanos(r.wait_nanos.max(0) as u64)
        .min(narad_cluster::limits::CONSUME_MAX_WAIT);
    match broker.wait_ready(&r.topic, wait).await {
        Ok(ready) => Reply::json(200, serde_json::json!({ "ready": ready }).to_string()),
        Err(e) => forward::reply_of(e.into()),
    }
}
