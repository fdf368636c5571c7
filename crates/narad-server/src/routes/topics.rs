//! `/v1/topics`: create, list, get (with partition stats), alter, delete.

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_meta::{Action, AlterTopicRequest, CreateTopicRequest, TopicJson, parse_list_limit};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::access::{CREATE_DENIED, Caller, OWNER_DENIED, forbidden};
use crate::body::{read_limited, strict_json};
use crate::error::{ApiError, json_response};
use crate::limits::TOPIC_BODY_BYTES;
use crate::query::{decode_component, pairs, values};
use crate::state::Shared;

/// Body of `POST /v1/topics`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    #[serde(default)]
    name: String,
    #[serde(default)]
    partitions: Option<i64>,
    #[serde(default)]
    retention_ms: Option<i64>,
    #[serde(default)]
    visibility_timeout_ms: Option<i64>,
    #[serde(default)]
    max_in_flight_per_partition: Option<i64>,
    #[serde(default)]
    max_acked_ahead_per_partition: Option<i64>,
    #[serde(default)]
    schema: Option<Box<RawValue>>,
    #[serde(default)]
    parent: Option<String>,
    #[serde(default)]
    fanout_delay_ms: Option<i64>,
    /// Accepted and overwritten by the caller's identity.
    #[serde(default)]
    #[allow(dead_code)]
    owner: Option<String>,
}

/// Body of `PATCH /v1/topics/{topic}` (`visibility_timeout_ms` is not
/// alterable, so it is an unknown field).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AlterBody {
    #[serde(default)]
    partitions: Option<i64>,
    #[serde(default)]
    retention_ms: Option<i64>,
    #[serde(default)]
    max_in_flight_per_partition: Option<i64>,
    #[serde(default)]
    max_acked_ahead_per_partition: Option<i64>,
    #[serde(default)]
    schema: Option<Box<RawValue>>,
}

fn schema_text(raw: Option<Box<RawValue>>) -> Option<String> {
    raw.map(|r| r.get().to_owned()).filter(|s| s.trim() != "null")
}

/// `POST /v1/topics`: needs `create` on the name (and, with a parent, to
/// own the parent or be an admin); the caller becomes the owner.
pub async fn create(
    State(s): State<Shared>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_limited(&headers, body, TOPIC_BODY_BYTES).await?;
    let b: CreateBody = strict_json(&bytes)?;
    if !caller.may(Action::Create, &b.name) {
        return Err(forbidden(CREATE_DENIED));
    }
    if let Some(parent) = b.parent.as_deref().filter(|p| !p.is_empty())
        && !caller.may_modify(s.broker.meta().topic(parent).as_deref())
    {
        return Err(forbidden(OWNER_DENIED));
    }
    let req = CreateTopicRequest {
        name: b.name,
        partitions: b.partitions.unwrap_or(0),
        retention_ms: b.retention_ms.unwrap_or(0),
        visibility_timeout_ms: b.visibility_timeout_ms.unwrap_or(0),
        max_in_flight_per_partition: b.max_in_flight_per_partition.unwrap_or(0),
        max_acked_ahead_per_partition: b.max_acked_ahead_per_partition.unwrap_or(0),
        schema: schema_text(b.schema),
        parent: b.parent.unwrap_or_default(),
        fanout_delay_ms: b.fanout_delay_ms.unwrap_or(0),
        owner: caller.name().to_owned(),
    };
    let t = s.broker.create_topic(req).await?;
    Ok(json_response(StatusCode::CREATED, to_json(&t.json_reply())))
}

fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

#[derive(Serialize)]
struct ListReply<'a> {
    topics: Vec<TopicJson<'a>>,
    next_page_token: &'a str,
}

/// `GET /v1/topics?limit=&page_token=`.
pub async fn list(State(s): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let raw = q.unwrap_or_default();
    let p = pairs(&raw);
    let limit = values(&p, "limit").first().map(|v| decode_component(v).unwrap_or_default());
    let limit_str = limit.as_ref().map(|v| String::from_utf8_lossy(v).into_owned());
    // Narad answers this one without the `invalid argument:` prefix.
    let limit = parse_list_limit(limit_str.as_deref())
        .map_err(|_| ApiError::bad_request("limit must be a positive integer"))?;
    let after = values(&p, "page_token")
        .first()
        .map(|v| String::from_utf8_lossy(&decode_component(v).unwrap_or_default()).into_owned())
        .unwrap_or_default();
    let page = s.broker.list_topics(&after, limit);
    let reply = ListReply {
        topics: page.topics.iter().map(|t| t.json_read()).collect(),
        next_page_token: &page.next_page_token,
    };
    Ok(json_response(StatusCode::OK, to_json(&reply)))
}

#[derive(Serialize)]
struct Details<'a> {
    #[serde(flatten)]
    topic: TopicJson<'a>,
    partition_stats: Vec<narad_broker::PartitionStats>,
}

/// `GET /v1/topics/{topic}?partition=`.
pub async fn get(
    State(s): State<Shared>,
    Path(topic): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let raw = q.unwrap_or_default();
    let p = pairs(&raw);
    let only = match values(&p, "partition").first() {
        None => None,
        Some(v) => {
            let v = String::from_utf8_lossy(&decode_component(v).unwrap_or_default()).into_owned();
            Some(v.parse::<u32>().map_err(|_| ApiError::bad_request("invalid partition"))?)
        }
    };
    let t = s.broker.topic(&topic)?;
    if let Some(p) = only
        && p >= t.partitions()
    {
        return Err(ApiError::bad_request("invalid partition"));
    }
    let details =
        Details { topic: t.json_read(), partition_stats: s.broker.partition_stats(&t, only) };
    Ok(json_response(StatusCode::OK, to_json(&details)))
}

/// `PATCH /v1/topics/{topic}`.
pub async fn alter(
    State(s): State<Shared>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_limited(&headers, body, TOPIC_BODY_BYTES).await?;
    let b: AlterBody = strict_json(&bytes)?;
    let req = AlterTopicRequest {
        partitions: b.partitions.unwrap_or(0),
        retention_ms: b.retention_ms,
        max_in_flight_per_partition: b.max_in_flight_per_partition,
        max_acked_ahead_per_partition: b.max_acked_ahead_per_partition,
        schema: schema_text(b.schema),
    };
    let t = s.broker.alter_topic(&topic, req).await?;
    Ok(json_response(StatusCode::OK, to_json(&t.json_reply())))
}

/// `DELETE /v1/topics/{topic}`.
pub async fn delete(
    State(s): State<Shared>,
    Path(topic): Path<String>,
) -> Result<Response, ApiError> {
    s.broker.delete_topic(&topic).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
