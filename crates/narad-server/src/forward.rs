//! Consume, replay and ack for partitions another node owns (SPEC §1.7,
//! §1.8, §7.5): where a partition is served, and how a node RPC reply is
//! relayed as the HTTP answer (status, content type and body as the owner
//! gave them) or an HTTP error becomes a node RPC reply.
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
//! turn, this node's and the other owners' (see `consume_any`).

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use narad_cluster::rpc::Reply;

use crate::error::ApiError;

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

/// The 503 for a partition whose owner is not alive: SPEC's text
/// (`partition owner is down; retry later`), as JSON like every other error
/// (Narad sends it as plain text; a client that reads the text finds it at
/// the start of the `error`), naming the owner.
pub fn owner_down(topic: &str, partition: u32, owner: &str) -> ApiError {
    ApiError::Json {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: format!(
            "partition owner is down; retry later: {topic}/{partition} is owned by {owner}, \
             which is not alive"
        ),
    }
}

/// The 503 for a partition whose owner is alive as far as membership
/// knows but cannot be reached: a call to it failed in transport and it
/// has not answered since (issue 36). Answered at once until the owner
/// answers a ping or membership marks it dead ([`owner_down`]).
pub fn owner_unreachable(owner: &str) -> ApiError {
    ApiError::Json {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: format!("partition owner {owner} is unreachable; retry later"),
    }
}

/// SPEC's 421 for a partition no one is assigned.
pub fn not_owner() -> ApiError {
    ApiError::Json {
        status: StatusCode::MISDIRECTED_REQUEST,
        message: "this node does not own the requested partition".into(),
    }
}

/// The 502 for a forward to an alive owner that failed in transport:
/// SPEC's text (`peer rpc failed`), as JSON, naming the owner and the
/// cause.
pub fn peer_failed(topic: &str, partition: u32, owner: &str, why: &str) -> ApiError {
    ApiError::Json {
        status: StatusCode::BAD_GATEWAY,
        message: format!(
            "peer rpc failed: {topic}/{partition} is owned by {owner}, which did not answer: {why}"
        ),
    }
}

/// The HTTP answer an owner's reply stands for.
pub fn relay(reply: Reply) -> Response {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::BAD_GATEWAY);
    if status == StatusCode::NO_CONTENT {
        return StatusCode::NO_CONTENT.into_response();
    }
    // Bodies as this node would have written them: JSON ends in a newline.
    let json = reply.content_type == "application/json";
    let body = if json && !reply.body.ends_with(b"\n") {
        let mut b = Vec::with_capacity(reply.body.len() + 1);
        b.extend_from_slice(&reply.body);
        b.push(b'\n');
        Body::from(b)
    } else {
        Body::from(reply.body)
    };
    let mut r = (status, body).into_response();
    if let Ok(v) = HeaderValue::from_str(&reply.content_type)
        && !reply.content_type.is_empty()
    {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    if status == StatusCode::SERVICE_UNAVAILABLE {
        crate::error::add_retry_after(&mut r);
    }
    r
}

/// The node RPC reply of an HTTP error: the same status and body.
pub fn reply_of(e: ApiError) -> Reply {
    match e {
        ApiError::Json { status, message } => Reply::error(status.as_u16(), &message),
        ApiError::Text { status, body } => Reply {
            status: status.as_u16(),
            content_type: "text/plain; charset=utf-8".into(),
            body: bytes::Bytes::from_static(body.as_bytes()),
        },
    }
}

/// The error message of an owner's reply (its `{"error"}`, or the text).
pub fn reply_message(reply: &Reply) -> String {
    serde_json::from_slice::<serde_json::Value>(&reply.body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&reply.body).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replies_relay_their_status_type_and_body_and_errors_round_trip() {
        let r = relay(Reply::json(200, r#"{"offset":1}"#));
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(r.into_body(), 1 << 10).await.unwrap();
        assert_eq!(&body[..], b"{\"offset\":1}\n", "JSON ends in a newline, as a local answer");
        let r = relay(Reply { status: 204, content_type: String::new(), body: Default::default() });
        assert_eq!(r.status(), 204);
        let down = reply_of(owner_down("t", 2, "n3"));
        assert_eq!(
            (down.status, reply_message(&down).as_str()),
            (503, "partition owner is down; retry later: t/2 is owned by n3, which is not alive")
        );
        let r = relay(down);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(r.headers()[header::RETRY_AFTER], "1", "every 503 says when to retry");
        let failed = reply_of(peer_failed("t", 0, "n2", "no handshake within 1s"));
        assert_eq!(failed.status, 502);
        assert_eq!(
            reply_message(&failed),
            "peer rpc failed: t/0 is owned by n2, which did not answer: no handshake within 1s"
        );
        let gone = reply_of(ApiError::Json { status: StatusCode::GONE, message: "stale".into() });
        assert_eq!((gone.status, reply_message(&gone).as_str()), (410, "stale"));
        assert_eq!(relay(Reply::error(1000, "x")).status(), 502, "no HTTP status: a bad gateway");
    }
}
