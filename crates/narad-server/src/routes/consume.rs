//! `GET /v1/topics/{topic}/consume` (queue, pinned and replay modes) and
//! `POST /v1/topics/{topic}/ack` (ack, extend, nack; single or batch).

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_broker::AckAction;
use narad_node::consume::consume_here;
use serde::Deserialize;
use utoipa::ToSchema;

use crate::body::{read_limited, strict_json};
use crate::duration::parse_go_duration;
use crate::error::{ApiError, json_response};
use crate::forward::{self, ConsumeAsk, PartitionRoute, PeerAnswer, relay};
use crate::limits::{BATCH_ACK_BODY_BYTES, BATCH_ACK_MAX};
use crate::openapi::ErrorBody;
use crate::query::{decode_component, pairs, values};
use crate::state::Shared;
use crate::wire::{ConsumeReply, push_json_string};

/// The parsed query of a consume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumeQuery {
    /// `partition=`.
    pub partition: Option<u32>,
    /// `offset=` (replay).
    pub offset: Option<u64>,
    /// `wait=`, before clamping.
    pub wait: Duration,
    /// `max=` (batch shape when present).
    pub max: Option<usize>,
}

fn first_decoded(p: &[(String, &str)], name: &str) -> Result<Option<String>, ApiError> {
    match values(p, name).first() {
        None => Ok(None),
        Some(v) => decode_component(v)
            .map(|b| Some(String::from_utf8_lossy(&b).into_owned()))
            .map_err(|e| ApiError::bad_request(format!("invalid {name}: {e}"))),
    }
}

/// Parses `partition`, `offset`, `wait` and `max` (the first occurrence of
/// each, as Narad's `url.Values.Get`). A replay (`offset`) needs a
/// `partition` and reads one record without a lease, so it does not take
/// `max`, a queue-mode batch option.
pub fn parse_consume_query(raw: &str) -> Result<ConsumeQuery, ApiError> {
    let p = pairs(raw);
    let partition = first_decoded(&p, "partition")?
        .map(|s| {
            s.parse::<u32>().map_err(|_| {
                ApiError::bad_request(format!(
                    "invalid partition: {s:?} is not a non-negative integer"
                ))
            })
        })
        .transpose()?;
    let offset = first_decoded(&p, "offset")?
        .map(|s| {
            s.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!(
                    "invalid offset: {s:?} is not a non-negative integer"
                ))
            })
        })
        .transpose()?;
    let wait = match first_decoded(&p, "wait")? {
        None => Duration::ZERO,
        Some(s) => parse_go_duration(&s)
            .map_err(|e| ApiError::bad_request(format!("invalid wait: {e}")))?,
    };
    let max = first_decoded(&p, "max")?
        .map(|s| match s.parse::<usize>() {
            Ok(n) if (1..=narad_broker::limits::CONSUME_BATCH_MAX).contains(&n) => Ok(n),
            _ => Err(ApiError::bad_request(format!(
                "invalid max: {s:?} (must be between 1 and {})",
                narad_broker::limits::CONSUME_BATCH_MAX
            ))),
        })
        .transpose()?;
    if offset.is_some() && partition.is_none() {
        return Err(ApiError::bad_request("partition required for replay-mode consume"));
    }
    if offset.is_some() && max.is_some() {
        return Err(ApiError::bad_request(
            "max cannot be combined with offset: a replay reads one record",
        ));
    }
    Ok(ConsumeQuery { partition, offset, wait, max })
}

/// `GET /v1/topics/{topic}/consume?partition=&offset=&wait=&max=`.
#[utoipa::path(
    get,
    operation_id = "consume",
    path = "/v1/topics/{topic}/consume",
    tag = "messages",
    params(
        ("topic" = String, Path, description = "Topic name", pattern = r"^[A-Za-z0-9._-]{1,255}$"),
        ("partition" = Option<u32>, Query, description = "Only this partition (required with `offset`)"),
        ("offset" = Option<u64>, Query, description = "Replay the one record at this offset (no lease); requires `partition`, refuses `max` (400)"),
        ("wait" = Option<String>, Query, description = "Long-poll up to this Go duration (`500ms`, `10s`), capped by the server"),
        ("max" = Option<u32>, Query, description = "Up to this many messages, batch shape (queue and pinned modes only: 400 with `offset`)", minimum = 1, maximum = 100),
    ),
    responses(
        (status = 200, description = "A message (a batch with `max`)", body = ConsumeReply),
        (status = 204, description = "Nothing available"),
        (status = 400, description = "Bad query or partition, `offset` without `partition`, `max` with `offset`", body = ErrorBody),
        (status = 403, description = "Not allowed", body = ErrorBody),
        (status = 404, description = "No such topic", body = ErrorBody),
        (status = 410, description = "Replay offset aged out or unreadable", body = ErrorBody),
        (status = 429, description = "Rate limit", body = ErrorBody),
    )
)]
pub async fn consume(
    State(s): State<Shared>,
    Path(topic): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let q = parse_consume_query(q.as_deref().unwrap_or(""))?;
    let wait = q.wait.min(s.max_consume_wait);
    let Some(cluster) = s.cluster.clone() else {
        let got = consume_here(&s.broker, &topic, q.partition, q.offset, wait, q.max).await?;
        return Ok(answer(got));
    };
    let t = s.broker.topic(&topic)?;
    let Some(p) = q.partition else {
        return crate::consume_any::consume_anywhere(&s, &cluster, &topic, wait, q.max).await;
    };
    if p >= t.partitions() {
        return Err(ApiError::bad_request("invalid partition"));
    }
    match cluster.route(&topic, p) {
        PartitionRoute::Local => {
            let got = consume_here(&s.broker, &topic, Some(p), q.offset, wait, q.max).await?;
            Ok(answer(got))
        }
        PartitionRoute::Remote(owner) => {
            let ask = ConsumeAsk {
                topic: topic.clone(),
                partition: Some(p),
                offset: q.offset,
                wait,
                max: q.max,
            };
            let timeout = ask.timeout();
            match cluster.consume_at(&owner, ask, timeout).await {
                Ok(reply) => Ok(relay(as_batch_if(reply, q.max == Some(1)))),
                Err(why) => {
                    tracing::warn!(topic, partition = p, owner, why, "forwarded consume failed");
                    Err(forward::peer_failed(&topic, p, &owner, &why).into())
                }
            }
        }
        PartitionRoute::OwnerDown(owner) => Err(forward::owner_down(&topic, p, &owner).into()),
        PartitionRoute::Unassigned => Err(forward::not_owner().into()),
    }
}

/// An owner's single-message answer in the batch shape, when the client
/// asked for `max=1` (a forwarded consume of one message travels in the
/// single shape: SPEC's op 2 has no batch size below 2).
pub(crate) fn as_batch_if(reply: PeerAnswer, batch_of_one: bool) -> PeerAnswer {
    if !batch_of_one || reply.status != 200 {
        return reply;
    }
    let mut body = Vec::with_capacity(reply.body.len() + 16);
    body.extend_from_slice(b"{\"messages\":[");
    body.extend_from_slice(&reply.body);
    body.extend_from_slice(b"]}");
    PeerAnswer { body: body.into(), ..reply }
}

fn answer(got: Option<String>) -> Response {
    match got {
        Some(json) => json_response(StatusCode::OK, json),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// Parses `extend=`: absent, bare, empty or `false` ack; `true`/`1` extend;
/// `0` nack.
pub fn parse_extend(p: &[(String, &str)]) -> Result<AckAction, ApiError> {
    let Some(raw) = values(p, "extend").first().copied() else { return Ok(AckAction::Ack) };
    let v =
        decode_component(raw).map_err(|e| ApiError::bad_request(format!("invalid extend: {e}")))?;
    match &v[..] {
        b"" | b"false" => Ok(AckAction::Ack),
        b"true" | b"1" => Ok(AckAction::Extend),
        b"0" => Ok(AckAction::Nack),
        other => Err(ApiError::bad_request(format!(
            "invalid extend: {:?} (use true, 1, 0 or false)",
            String::from_utf8_lossy(other)
        ))),
    }
}

/// The `extend` action and the `receipt_handle` of an ack (the first one;
/// `None` when absent: the handles are in the body). An empty handle is a
/// 400 `receipt_handle required`.
pub fn parse_ack_query(raw: &str) -> Result<(Option<String>, AckAction), ApiError> {
    let p = pairs(raw);
    let action = parse_extend(&p)?;
    let Some(h) = values(&p, "receipt_handle").first().copied() else { return Ok((None, action)) };
    let h = decode_component(h)
        .map_err(|e| ApiError::bad_request(format!("invalid receipt_handle: {e}")))?;
    if h.is_empty() {
        return Err(ApiError::bad_request("receipt_handle required"));
    }
    Ok((Some(String::from_utf8_lossy(&h).into_owned()), action))
}

/// Body of a batch ack.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct BatchAck {
    /// 1 to 100 receipt handles.
    #[serde(default)]
    receipt_handles: Vec<String>,
}

/// The answer of a batch ack: one result per handle, in order (written by
/// hand in [`ack`]; a test decodes it into this).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckResults {
    /// One per handle.
    pub results: Vec<AckResult>,
}

/// The outcome of one handle of a batch ack.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckResult {
    /// The status a single ack would have had (204 done).
    pub status: u16,
    /// Why not, when not 204.
    pub error: Option<String>,
}

/// `POST /v1/topics/{topic}/ack?receipt_handle=&extend=`, or a batch ack
/// with body `{"receipt_handles":[...]}`.
#[utoipa::path(
    post,
    operation_id = "ack",
    path = "/v1/topics/{topic}/ack",
    tag = "messages",
    params(
        ("topic" = String, Path, description = "Topic name", pattern = r"^[A-Za-z0-9._-]{1,255}$"),
        ("receipt_handle" = Option<String>, Query, description = "The handle to resolve (else the body lists them)"),
        ("extend" = Option<String>, Query, description = "`true`/`1` extends the lease, `0` nacks, absent or `false` acks"),
    ),
    request_body(content = Option<BatchAck>, description = "Batch form, when `receipt_handle` is absent"),
    responses(
        (status = 200, description = "Batch form: a result per handle", body = AckResults),
        (status = 204, description = "Done"),
        (status = 400, description = "Malformed handle or body", body = ErrorBody),
        (status = 403, description = "Not allowed", body = ErrorBody),
        (status = 404, description = "No such topic", body = ErrorBody),
        (status = 410, description = "The handle no longer matches a lease", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 503, description = "Acked-ahead set full; retry", body = ErrorBody),
    )
)]
pub async fn ack(
    State(s): State<Shared>,
    Path(topic): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, action) = parse_ack_query(q.as_deref().unwrap_or(""))?;
    if let Some(h) = handle {
        return match resolve_anywhere(&s, &topic, &h, action).await {
            Ok(()) => Ok(StatusCode::NO_CONTENT.into_response()),
            Err(Resolved::Here(e)) => Err(e),
            Err(Resolved::Owner(reply)) => Ok(relay(reply)),
        };
    }
    let bytes = read_limited(&headers, body, BATCH_ACK_BODY_BYTES).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("receipt_handle required"));
    }
    let b: BatchAck = strict_json(&bytes)?;
    if b.receipt_handles.is_empty() {
        return Err(ApiError::bad_request("receipt_handles required"));
    }
    if b.receipt_handles.len() > BATCH_ACK_MAX {
        return Err(ApiError::bad_request(format!(
            "too many receipt_handles: {} (at most {BATCH_ACK_MAX})",
            b.receipt_handles.len()
        )));
    }
    s.broker.topic(&topic)?;
    // Every handle at once: a batch spanning owners answers within the
    // slowest owner's budget, not the sum of one call per handle (an
    // unreachable owner's handles all fail within its first call's watch).
    let resolved = futures_util::future::join_all(
        b.receipt_handles.iter().map(|h| resolve_anywhere(&s, &topic, h, action)),
    )
    .await;
    let mut out = String::from("{\"results\":[");
    for (i, resolved) in resolved.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let failed = match resolved {
            Ok(()) => None,
            Err(Resolved::Here(api)) => {
                let msg = match &api {
                    ApiError::Json { message, .. } => message.clone(),
                    ApiError::Text { body, .. } => (*body).to_owned(),
                };
                Some((api.status().as_u16(), msg))
            }
            Err(Resolved::Owner(reply)) => Some((reply.status, reply.message())),
        };
        match failed {
            None => out.push_str("{\"status\":204}"),
            Some((status, msg)) => {
                out.push_str(&format!("{{\"status\":{status},\"error\":"));
                push_json_string(&mut out, &msg);
                out.push('}');
            }
        }
    }
    out.push_str("]}");
    Ok(json_response(StatusCode::OK, out))
}

/// Why a receipt handle was not resolved: an error here, or the owner's
/// answer (relayed as it is).
enum Resolved {
    Here(ApiError),
    Owner(PeerAnswer),
}

/// Acks, extends or nacks `handle` where its partition is served: here,
/// or at its owner (node RPC 3, 18, 19); a dead owner's partition answers
/// 503 naming the owner.
async fn resolve_anywhere(
    s: &Shared,
    topic: &str,
    handle: &str,
    action: AckAction,
) -> Result<(), Resolved> {
    let parsed = narad_broker::consume::shard::parse_receipt_handle(handle);
    let (Some(cluster), Some((p, offset, nonce))) = (&s.cluster, parsed) else {
        return s.broker.resolve(topic, handle, action).map_err(|e| Resolved::Here(e.into()));
    };
    match cluster.route(topic, p) {
        PartitionRoute::Local | PartitionRoute::Unassigned => {
            s.broker.resolve(topic, handle, action).map_err(|e| Resolved::Here(e.into()))
        }
        PartitionRoute::OwnerDown(owner) => {
            Err(Resolved::Here(forward::owner_down(topic, p, &owner).into()))
        }
        PartitionRoute::Remote(owner) => {
            match cluster.resolve_at(&owner, topic, (p, offset, nonce), action).await {
                Ok(reply) if reply.status == 204 => Ok(()),
                Ok(reply) => Err(Resolved::Owner(reply)),
                Err(why) => {
                    tracing::warn!(topic, partition = p, owner, why, "forwarded ack failed");
                    Err(Resolved::Here(forward::peer_failed(topic, p, &owner, &why).into()))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consume_query_parses_and_validates() {
        let q = parse_consume_query("partition=2&wait=1.5s&max=10").unwrap();
        assert_eq!(
            q,
            ConsumeQuery {
                partition: Some(2),
                offset: None,
                wait: Duration::from_millis(1500),
                max: Some(10)
            }
        );
        assert_eq!(parse_consume_query("").unwrap().wait, Duration::ZERO);
        for bad in [
            "partition=x",
            "offset=-1&partition=0",
            "wait=10",
            "max=0",
            "max=101",
            "offset=3",
            "offset=3&max=2",
            "partition=0&offset=3&max=2",
            "max=0&max=5",
        ] {
            assert_eq!(parse_consume_query(bad).unwrap_err().status(), 400, "{bad}");
        }
        // The first occurrence of a parameter wins.
        let q = parse_consume_query("partition=1&partition=2&max=5&max=500").unwrap();
        assert_eq!((q.partition, q.max), (Some(1), Some(5)));
    }

    #[test]
    fn extend_values_map_to_actions() {
        let act = |q: &str| parse_extend(&pairs(q));
        assert_eq!(act("").unwrap(), AckAction::Ack);
        assert_eq!(act("extend").unwrap(), AckAction::Ack);
        assert_eq!(act("extend=false").unwrap(), AckAction::Ack);
        assert_eq!(act("extend=true").unwrap(), AckAction::Extend);
        assert_eq!(act("extend=1").unwrap(), AckAction::Extend);
        assert_eq!(act("extend=0").unwrap(), AckAction::Nack);
        assert_eq!(act("extend=maybe").unwrap_err().status(), 400);
    }
}
