//! `/v1/topics`: create, list, get (with partition stats), alter, delete.

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_meta::{Action, AlterTopicRequest, CreateTopicRequest, TopicJson, parse_list_limit};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

use crate::access::{CREATE_DENIED, Caller, OWNER_DENIED, forbidden};
use crate::body::{read_limited, strict_json};
use crate::error::{ApiError, json_response};
use crate::limits::TOPIC_BODY_BYTES;
use crate::openapi::ErrorBody;
use crate::query::{decode_component, pairs, values};
use crate::state::Shared;

/// Body of `POST /v1/topics` (0 or absent = the server default).
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = CreateTopic)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    #[serde(default)]
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,255}$")]
    name: String,
    /// 3 to 108.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 108)]
    partitions: Option<i64>,
    #[serde(default)]
    retention_ms: Option<i64>,
    #[serde(default)]
    visibility_timeout_ms: Option<i64>,
    #[serde(default)]
    max_in_flight_per_partition: Option<i64>,
    #[serde(default)]
    max_acked_ahead_per_partition: Option<i64>,
    /// A JSON Schema every payload must match.
    #[serde(default)]
    #[schema(value_type = Option<Value>)]
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
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = AlterTopic)]
#[serde(deny_unknown_fields)]
struct AlterBody {
    /// Grow-only, at most 108.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 108)]
    partitions: Option<i64>,
    #[serde(default)]
    retention_ms: Option<i64>,
    #[serde(default)]
    max_in_flight_per_partition: Option<i64>,
    #[serde(default)]
    max_acked_ahead_per_partition: Option<i64>,
    /// A new JSON Schema, backward compatible with the current one.
    #[serde(default)]
    #[schema(value_type = Option<Value>)]
    schema: Option<Box<RawValue>>,
}

fn schema_text(raw: Option<Box<RawValue>>) -> Option<String> {
    raw.map(|r| r.get().to_owned()).filter(|s| s.trim() != "null")
}

/// `POST /v1/topics`: needs `create` on the name (and, with a parent, to
/// own the parent or be an admin); the caller becomes the owner.
#[utoipa::path(
    post,
    operation_id = "create_topic",
    path = "/v1/topics",
    tag = "topics",
    request_body = CreateBody,
    responses(
        (status = 201, description = "Created", body = TopicJson),
        (status = 400, description = "Invalid name, option or schema", body = ErrorBody),
        (status = 403, description = "Not allowed", body = ErrorBody),
        (status = 404, description = "The parent does not exist", body = ErrorBody),
        (status = 409, description = "The topic exists, or a fan-out conflict", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
    )
)]
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

/// A page of topics, by name.
#[derive(Serialize, ToSchema)]
struct ListReply<'a> {
    #[schema(value_type = Vec<TopicJson>)]
    topics: Vec<TopicJson<'a>>,
    next_page_token: &'a str,
}

/// The first value of `name`, decoded; a bad escape reads as empty, as Go's
/// `URL.Query()` drops such a pair.
fn first_lossy(p: &[(String, &str)], name: &str) -> Option<String> {
    values(p, name)
        .first()
        .map(|v| String::from_utf8_lossy(&decode_component(v).unwrap_or_default()).into_owned())
}

/// The `limit` (default 100, clamped to 1000) and `page_token` (`""` = from
/// the start) of a topic list.
pub fn parse_list_query(raw: &str) -> Result<(usize, String), ApiError> {
    let p = pairs(raw);
    // Narad answers this one without the `invalid argument:` prefix.
    let limit = parse_list_limit(first_lossy(&p, "limit").as_deref())
        .map_err(|_| ApiError::bad_request("limit must be a positive integer"))?;
    Ok((limit, first_lossy(&p, "page_token").unwrap_or_default()))
}

/// The `partition` of a topic details read (`None` = every partition).
pub fn parse_details_query(raw: &str) -> Result<Option<u32>, ApiError> {
    first_lossy(&pairs(raw), "partition")
        .map(|v| v.parse::<u32>().map_err(|_| ApiError::bad_request("invalid partition")))
        .transpose()
}

/// `GET /v1/topics?limit=&page_token=`.
#[utoipa::path(
    get,
    operation_id = "list_topics",
    path = "/v1/topics",
    tag = "topics",
    params(
        ("limit" = Option<i64>, Query, description = "Page size (default 100, at most 1000)", minimum = 1),
        ("page_token" = Option<String>, Query, description = "`next_page_token` of the previous page"),
    ),
    responses(
        (status = 200, description = "A page of topics; `next_page_token` is empty on the last", body = ListReply),
        (status = 400, description = "Invalid limit", body = ErrorBody),
    )
)]
pub async fn list(State(s): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let (limit, after) = parse_list_query(q.as_deref().unwrap_or(""))?;
    let page = s.broker.list_topics(&after, limit);
    let reply = ListReply {
        topics: page.topics.iter().map(|t| t.json_read()).collect(),
        next_page_token: &page.next_page_token,
    };
    Ok(json_response(StatusCode::OK, to_json(&reply)))
}

/// A topic and its partitions.
#[derive(Serialize, ToSchema)]
struct Details<'a> {
    #[serde(flatten)]
    #[schema(inline)]
    topic: TopicJson<'a>,
    partition_stats: Vec<narad_broker::PartitionStats>,
    /// `true` when some partition's figures are not its owner's (the owner
    /// is dead, unknown, not assigned yet, or did not answer: its `status`
    /// is `owner_unavailable`); absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    partial: bool,
}

/// `GET /v1/topics/{topic}?partition=`.
#[utoipa::path(
    get,
    operation_id = "get_topic",
    path = "/v1/topics/{topic}",
    tag = "topics",
    params(
        ("topic" = String, Path, description = "Topic name", pattern = r"^[A-Za-z0-9._-]{1,255}$"),
        ("partition" = Option<u32>, Query, description = "Only this partition's stats"),
    ),
    responses(
        (status = 200, description = "The topic and its partition stats", body = Details),
        (status = 400, description = "Invalid partition", body = ErrorBody),
        (status = 404, description = "No such topic", body = ErrorBody),
    )
)]
pub async fn get(
    State(s): State<Shared>,
    Path(topic): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let only = parse_details_query(q.as_deref().unwrap_or(""))?;
    let t = s.broker.topic(&topic)?;
    if let Some(p) = only
        && p >= t.partitions()
    {
        return Err(ApiError::bad_request("invalid partition"));
    }
    let mut partition_stats = s.broker.partition_stats(&t, only);
    if let Some(cluster) = &s.cluster {
        partition_stats = crate::cluster::with_owner_figures(
            &**cluster,
            s.broker.node_id(),
            t.name(),
            t.incarnation(),
            partition_stats,
        )
        .await;
    }
    let partial = partition_stats
        .iter()
        .any(|p| p.status == narad_broker::ownership::PartitionStatus::OwnerUnavailable);
    let details = Details { topic: t.json_read(), partition_stats, partial };
    Ok(json_response(StatusCode::OK, to_json(&details)))
}

/// `PATCH /v1/topics/{topic}`.
#[utoipa::path(
    patch,
    operation_id = "alter_topic",
    path = "/v1/topics/{topic}",
    tag = "topics",
    params(("topic" = String, Path, description = "Topic name", pattern = r"^[A-Za-z0-9._-]{1,255}$")),
    request_body = AlterBody,
    responses(
        (status = 200, description = "The altered topic", body = TopicJson),
        (status = 400, description = "Invalid change", body = ErrorBody),
        (status = 403, description = "Not the owner or an admin", body = ErrorBody),
        (status = 404, description = "No such topic", body = ErrorBody),
        (status = 409, description = "Schema managed by the parent", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
    )
)]
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
#[utoipa::path(
    delete,
    operation_id = "delete_topic",
    path = "/v1/topics/{topic}",
    tag = "topics",
    params(("topic" = String, Path, description = "Topic name", pattern = r"^[A-Za-z0-9._-]{1,255}$")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 403, description = "Not the owner or an admin", body = ErrorBody),
        (status = 404, description = "No such topic", body = ErrorBody),
    )
)]
pub async fn delete(
    State(s): State<Shared>,
    Path(topic): Path<String>,
) -> Result<Response, ApiError> {
    s.broker.delete_topic(&topic).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
