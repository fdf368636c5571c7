//! `POST /v1/topics/{topic}/produce` and `/produce/batch`.

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use narad_broker::ProduceRecord;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

use crate::body::{content_encoding, decode_content, read_limited, strict_json};
use crate::error::{ApiError, json_response};
use crate::limits::{BATCH_BODY_BYTES, BATCH_MAX_RECORDS, PRODUCE_BODY_BYTES};
use crate::openapi::ErrorBody;
use crate::query::{decode_component, pairs, values};
use crate::state::Shared;

/// The `key` and `partition` query parameters of a produce.
pub fn parse_produce_query(raw: &str) -> Result<(Option<Bytes>, Option<u32>), ApiError> {
    if raw.is_empty() {
        return Ok((None, None));
    }
    let p = pairs(raw);
    let keys = values(&p, "key");
    if keys.len() > 1 {
        return Err(ApiError::bad_request("duplicate key parameter"));
    }
    let key = match keys.first() {
        None => None,
        Some(v) => {
            let k = decode_component(v)
                .map_err(|e| ApiError::bad_request(format!("invalid key: {e}")))?;
            (!k.is_empty()).then(|| Bytes::from(k))
        }
    };
    let parts = values(&p, "partition");
    if parts.len() > 1 {
        return Err(ApiError::bad_request("duplicate partition parameter"));
    }
    let partition = match parts.first() {
        None => None,
        Some(v) => {
            let s = decode_component(v)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .map_err(|e| ApiError::bad_request(format!("invalid partition: {e}")))?;
            Some(s.parse::<u32>().map_err(|_| {
                ApiError::bad_request(format!(
                    "invalid partition: {s:?} is not a non-negative integer"
                ))
            })?)
        }
    };
    Ok((key, partition))
}

/// `POST /v1/topics/{topic}/produce?key=&partition=`: 202 once the record
/// is fsynced in this node's ingress WAL.
#[utoipa::path(
    post,
    operation_id = "produce",
    path = "/v1/topics/{topic}/produce",
    tag = "messages",
    params(
        ("topic" = String, Path, description = "Topic name", pattern = r"^[A-Za-z0-9._-]{1,255}$"),
        ("key" = Option<String>, Query, description = "Message key (picks the partition)"),
        ("partition" = Option<u32>, Query, description = "Pin to this partition"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The message, 1 byte to 1 MiB"),
    responses(
        (status = 202, description = "Durable in the ingress WAL"),
        (status = 400, description = "Empty body, bad query, schema or partition", body = ErrorBody),
        (status = 403, description = "Not allowed", body = ErrorBody),
        (status = 404, description = "No such topic", body = ErrorBody),
        (status = 408, description = "Body not received in time", body = ErrorBody),
        (status = 409, description = "A delayed child takes no direct produce", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 429, description = "Rate limit", body = ErrorBody),
    )
)]
pub async fn produce(
    State(s): State<Shared>,
    Path(topic): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    produce_to(&s, &topic, q.as_deref(), &headers, body).await
}

/// The work of [`produce`], also run by the produce fast path
/// ([`crate::fast`]): `topic` is the decoded path segment, `query` the raw
/// query string.
pub async fn produce_to<B>(
    s: &Shared,
    topic: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: B,
) -> Result<Response, ApiError>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: Into<axum::BoxError>,
{
    let (key, partition) = parse_produce_query(query.unwrap_or(""))?;
    let payload = read_limited(headers, body, PRODUCE_BODY_BYTES).await?;
    if payload.is_empty() {
        return Err(ApiError::bad_request("message required"));
    }
    s.broker.produce(topic, key, partition, payload).await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// Body of a batch produce.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct BatchBody<'a> {
    /// 1 to 1,000 messages.
    #[serde(borrow, default)]
    #[schema(value_type = Vec<BatchMessage>)]
    messages: Capped<BatchMessage<'a>>,
}

/// A JSON array decoded into at most [`BATCH_MAX_RECORDS`] items; the rest
/// are only counted, so a 16 MiB body of `{}`s cannot make millions of
/// records before the count is refused.
#[derive(Debug)]
struct Capped<T> {
    items: Vec<T>,
    total: usize,
}

impl<T> Default for Capped<T> {
    fn default() -> Self {
        Capped { items: Vec::new(), total: 0 }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Capped<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = Capped<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Capped<T>, A::Error> {
                let mut out = Capped::default();
                while out.items.len() < BATCH_MAX_RECORDS {
                    match seq.next_element()? {
                        Some(item) => out.items.push(item),
                        None => {
                            out.total = out.items.len();
                            return Ok(out);
                        }
                    }
                }
                out.total = out.items.len();
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    out.total += 1;
                }
                Ok(out)
            }
        }
        d.deserialize_seq(Visit(std::marker::PhantomData))
    }
}

/// One message of a batch produce.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct BatchMessage<'a> {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    key_encoding: Option<String>,
    /// Any JSON value (stored as written), or a string with
    /// `payload_encoding` `base64`.
    #[serde(borrow, default)]
    #[schema(value_type = Value)]
    payload: Option<&'a RawValue>,
    #[serde(default)]
    payload_encoding: Option<String>,
    #[serde(default)]
    partition: Option<i64>,
}

fn decode_field(value: &str, encoding: Option<&str>, what: &str) -> Result<Vec<u8>, String> {
    match encoding {
        None | Some("") => Ok(value.as_bytes().to_vec()),
        Some("base64") => STANDARD.decode(value).map_err(|e| format!("invalid base64 {what}: {e}")),
        Some(other) => Err(format!("unsupported {what}_encoding {other:?}")),
    }
}

fn batch_record(i: usize, m: BatchMessage<'_>) -> Result<ProduceRecord, ApiError> {
    let bad = |msg: String| ApiError::bad_request(format!("message {i}: {msg}"));
    let key = match m.key {
        None => None,
        Some(k) => {
            let k = decode_field(&k, m.key_encoding.as_deref(), "key").map_err(bad)?;
            (!k.is_empty()).then(|| Bytes::from(k))
        }
    };
    let raw = m.payload.ok_or_else(|| bad("message required".into()))?;
    let payload = match m.payload_encoding.as_deref() {
        None | Some("") => {
            // A JSON payload is stored as written.
            raw.get().as_bytes().to_vec()
        }
        Some(enc) => {
            let s: String = serde_json::from_str(raw.get()).map_err(|_| {
                bad(format!("payload must be a string when payload_encoding is {enc:?}"))
            })?;
            decode_field(&s, Some(enc), "payload").map_err(bad)?
        }
    };
    if payload.is_empty() {
        return Err(bad("message required".into()));
    }
    let partition = match m.partition {
        None => None,
        Some(p) if p < 0 || p > i64::from(u32::MAX) => {
            return Err(bad(format!("invalid partition: {p}")));
        }
        Some(p) => Some(p as u32),
    };
    Ok(ProduceRecord { key, partition, payload: Bytes::from(payload) })
}

/// Decodes a batch produce body: its `Content-Encoding` (none, `gzip` or
/// `zstd`; at most [`BATCH_BODY_BYTES`] decompressed, else 413), then
/// strict JSON `{"messages":[...]}` of 1..=[`BATCH_MAX_RECORDS`] records,
/// each checked. Every failure is a 400 or 413.
pub fn decode_batch(
    content_encoding: Option<&str>,
    packed: Bytes,
) -> Result<Vec<ProduceRecord>, ApiError> {
    let bytes = decode_content(content_encoding, packed, BATCH_BODY_BYTES)?;
    let b: BatchBody<'_> = strict_json(&bytes)?;
    if b.messages.total == 0 {
        return Err(ApiError::bad_request("messages required"));
    }
    if b.messages.total > BATCH_MAX_RECORDS {
        return Err(ApiError::bad_request(format!(
            "too many messages: {} (at most {BATCH_MAX_RECORDS})",
            b.messages.total
        )));
    }
    b.messages.items.into_iter().enumerate().map(|(i, m)| batch_record(i, m)).collect()
}

/// The answer of a batch produce.
#[derive(Debug, Serialize, ToSchema)]
struct BatchAccepted {
    /// Records made durable.
    accepted: usize,
}

/// `POST /v1/topics/{topic}/produce/batch`: every record is checked before
/// any is appended; 202 `{"accepted":N}` once the last is durable.
#[utoipa::path(
    post,
    operation_id = "produce_batch",
    path = "/v1/topics/{topic}/produce/batch",
    tag = "messages",
    params(("topic" = String, Path, description = "Topic name", pattern = r"^[A-Za-z0-9._-]{1,255}$")),
    request_body(content = BatchBody, description = "JSON; `Content-Encoding` gzip or zstd allowed (16 MiB either side)"),
    responses(
        (status = 202, description = "Every record durable in the ingress WAL", body = BatchAccepted),
        (status = 400, description = "A bad record (none was appended)", body = ErrorBody),
        (status = 403, description = "Not allowed", body = ErrorBody),
        (status = 404, description = "No such topic", body = ErrorBody),
        (status = 408, description = "Body not received in time", body = ErrorBody),
        (status = 409, description = "A delayed child takes no direct produce", body = ErrorBody),
        (status = 413, description = "Body over 16 MiB, packed or not", body = ErrorBody),
        (status = 429, description = "Rate limit", body = ErrorBody),
    )
)]
pub async fn produce_batch(
    State(s): State<Shared>,
    Path(topic): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let raw = q.unwrap_or_default();
    let p = pairs(&raw);
    if !values(&p, "key").is_empty() || !values(&p, "partition").is_empty() {
        return Err(ApiError::bad_request(
            "key and partition query parameters are not allowed on batch produce; set them per message",
        ));
    }
    let packed = read_limited(&headers, body, BATCH_BODY_BYTES).await?;
    let records = decode_batch(content_encoding(&headers), packed)?;
    let n = s.broker.produce_batch(&topic, records).await?;
    let body = serde_json::to_string(&BatchAccepted { accepted: n }).expect("serializes");
    Ok(json_response(StatusCode::ACCEPTED, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn produce_query_decodes_keys_and_refuses_duplicates() {
        assert_eq!(
            parse_produce_query("key=a+b%21").unwrap(),
            (Some(Bytes::from_static(b"a b!")), None)
        );
        assert_eq!(parse_produce_query("key=&partition=2").unwrap(), (None, Some(2)));
        assert_eq!(parse_produce_query("other=1").unwrap(), (None, None));
        for bad in
            ["key=a&key=b", "partition=1&partition=2", "partition=-1", "partition=x", "key=%zz"]
        {
            assert_eq!(parse_produce_query(bad).unwrap_err().status(), 400, "{bad}");
        }
    }
}
