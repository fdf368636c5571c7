//! `/v1/topics/{topic}/children` (SPEC §1.5): attach, list, detach.
//!
//! Attach and detach need the parent's owner or an admin (checked by the
//! access layer; a missing parent passes it and is a 404 here). Attach
//! also needs the child's owner or an admin (checked here; a missing child
//! passes and is a 404): attaching changes the child (a delayed child
//! refuses direct produce, the parent's schema binds it), so the owner of
//! a parent must not take over somebody else's topic. SPEC §1.2 checks
//! only the parent: this is a deliberate tightening. The list needs any
//! authenticated user. An attached child starts at the parent's
//! high watermark as of the attach: it gets what the parent commits from
//! then on, nothing older.

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_broker::ChildLag;
use narad_meta::AttachChildRequest;
use narad_meta::TopicJson;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::access::{Caller, OWNER_DENIED, forbidden};
use crate::body::read_streamed_json;
use crate::error::{ApiError, json_response};
use crate::limits::STREAMED_BODY_BYTES;
use crate::openapi::ErrorBody;
use crate::state::Shared;

/// Body of `POST /v1/topics/{topic}/children`.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = AttachChild)]
#[serde(deny_unknown_fields)]
struct AttachBody {
    /// The child topic (it must exist).
    #[serde(default)]
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,255}$")]
    child: String,
    /// Delivery delay, 0 to 1 year in ms.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 31_536_000_000_i64)]
    delay_ms: Option<i64>,
}

/// Reply of `GET /v1/topics/{topic}/children`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Children)]
struct ChildrenReply<'a> {
    parent: &'a str,
    /// In attach order.
    #[schema(value_type = Vec<ChildLag>)]
    children: &'a [ChildLag],
}

fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// `POST /v1/topics/{topic}/children` with `{"child","delay_ms"}`: 200 and
/// the parent topic.
#[utoipa::path(
    post,
    operation_id = "attach_child",
    path = "/v1/topics/{topic}/children",
    tag = "topics",
    params(("topic" = String, Path, description = "The parent topic", pattern = r"^[A-Za-z0-9._-]{1,255}$")),
    request_body = AttachBody,
    responses(
        (status = 200, description = "Attached: the parent topic", body = TopicJson),
        (status = 400, description = "Bad body, delay, retention or self-attach", body = ErrorBody),
        (status = 403, description = "Not the owner of both parent and child, nor an admin", body = ErrorBody),
        (status = 404, description = "No such parent or child", body = ErrorBody),
        (status = 409, description = "A fan-out role, limit or schema conflict", body = ErrorBody),
    )
)]
pub async fn attach(
    State(s): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let b: AttachBody = read_streamed_json(&headers, body, STREAMED_BODY_BYTES).await?;
    if !caller.may_modify(s.broker.meta().topic(&b.child).as_deref()) {
        return Err(forbidden(OWNER_DENIED));
    }
    let request =
        AttachChildRequest { parent: topic, child: b.child, delay_ms: b.delay_ms.unwrap_or(0) };
    let parent = s.broker.attach_child(request).await?;
    Ok(json_response(StatusCode::OK, to_json(&parent.json_read())))
}

/// `GET /v1/topics/{topic}/children`: the children in attach order, with
/// their lag (an empty list for a topic that has none).
#[utoipa::path(
    get,
    operation_id = "list_children",
    path = "/v1/topics/{topic}/children",
    tag = "topics",
    params(("topic" = String, Path, description = "The parent topic", pattern = r"^[A-Za-z0-9._-]{1,255}$")),
    responses(
        (status = 200, description = "The children and their lag", body = ChildrenReply),
        (status = 404, description = "No such topic", body = ErrorBody),
    )
)]
pub async fn list(
    State(s): State<Shared>,
    Path(topic): Path<String>,
) -> Result<Response, ApiError> {
    let children = s.broker.children(&topic).await?;
    let reply = ChildrenReply { parent: &topic, children: &children };
    Ok(json_response(StatusCode::OK, to_json(&reply)))
}

/// `DELETE /v1/topics/{topic}/children/{child}`: 204 once the child's
/// cursors have stopped and their files are gone.
#[utoipa::path(
    delete,
    operation_id = "detach_child",
    path = "/v1/topics/{topic}/children/{child}",
    tag = "topics",
    params(
        ("topic" = String, Path, description = "The parent topic", pattern = r"^[A-Za-z0-9._-]{1,255}$"),
        ("child" = String, Path, description = "The child topic", pattern = r"^[A-Za-z0-9._-]{1,255}$"),
    ),
    responses(
        (status = 204, description = "Detached"),
        (status = 403, description = "Not the parent's owner or an admin", body = ErrorBody),
        (status = 404, description = "No such topic, or not attached to it", body = ErrorBody),
    )
)]
pub async fn detach(
    State(s): State<Shared>,
    Path((topic, child)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    s.broker.detach_child(&topic, &child).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
