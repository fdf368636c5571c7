//! `POST /v1/topics/{topic}/produce` and `/produce/batch`.

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use narad_broker::ProduceRecord;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::body::{decode_content, read_limited, strict_json};
use crate::error::{ApiError, json_response};
use crate::limits::{BATCH_BODY_BYTES, BATCH_MAX_RECORDS, PRODUCE_BODY_BYTES};
use crate::query::{decode_component, pairs, values};
use crate::state::Shared;

/// The `key` and `partition` query parameters of a produce.
pub fn parse_produce_query(raw: &str) -> Result<(Option<Bytes>, Option<u32>), ApiError> {
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
pub async fn produce(
    State(s): State<Shared>,
    Path(topic): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (key, partition) = parse_produce_query(q.as_deref().unwrap_or(""))?;
    let payload = read_limited(&headers, body, PRODUCE_BODY_BYTES).await?;
    if payload.is_empty() {
        return Err(ApiError::bad_request("message required"));
    }
    s.broker.produce(&topic, key, partition, payload).await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody<'a> {
    #[serde(borrow, default)]
    messages: Vec<BatchMessage<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchMessage<'a> {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    key_encoding: Option<String>,
    #[serde(borrow, default)]
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

/// `POST /v1/topics/{topic}/produce/batch`: every record is checked before
/// any is appended; 202 `{"accepted":N}` once the last is durable.
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
    let bytes = decode_content(&headers, packed, BATCH_BODY_BYTES)?;
    let b: BatchBody<'_> = strict_json(&bytes)?;
    if b.messages.is_empty() {
        return Err(ApiError::bad_request("messages required"));
    }
    if b.messages.len() > BATCH_MAX_RECORDS {
        return Err(ApiError::bad_request(format!(
            "too many messages: {} (at most {BATCH_MAX_RECORDS})",
            b.messages.len()
        )));
    }
    let records = b
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| batch_record(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let n = s.broker.produce_batch(&topic, records).await?;
    Ok(json_response(StatusCode::ACCEPTED, format!("{{\"accepted\":{n}}}")))
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
