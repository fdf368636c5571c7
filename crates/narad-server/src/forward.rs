//! Answers of partition owners as HTTP answers (SPEC §1.7, §1.8, §7.5):
//! an owner's [`PeerAnswer`] relayed with the status, content type and body
//! as the owner gave them. Where a partition is served
//! ([`PartitionRoute`]) and the errors of one served elsewhere
//! ([`owner_down`], [`not_owner`], [`peer_failed`]) are narad-node's
//! (`forward`, `error`), re-exported here.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
pub use narad_node::error::{not_owner, owner_down, peer_failed};
pub use narad_node::forward::{ConsumeAsk, PartitionRoute, PeerAnswer};

/// The HTTP answer an owner's reply stands for.
pub fn relay(reply: PeerAnswer) -> Response {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replies_relay_their_status_type_and_body() {
        let json = |status, body: &str| PeerAnswer {
            status,
            content_type: "application/json".into(),
            body: bytes::Bytes::copy_from_slice(body.as_bytes()),
        };
        let r = relay(json(200, r#"{"offset":1}"#));
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(r.into_body(), 1 << 10).await.unwrap();
        assert_eq!(&body[..], b"{\"offset\":1}\n", "JSON ends in a newline, as a local answer");
        let r = relay(PeerAnswer {
            status: 204,
            content_type: String::new(),
            body: Default::default(),
        });
        assert_eq!(r.status(), 204);
        let down = PeerAnswer::from(owner_down("t", 2, "n3"));
        assert_eq!(
            (down.status, down.message().as_str()),
            (503, "partition owner is down; retry later: t/2 is owned by n3, which is not alive")
        );
        let r = relay(down);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(r.headers()[header::RETRY_AFTER], "1", "every 503 says when to retry");
        assert_eq!(
            relay(json(1000, r#"{"error":"x"}"#)).status(),
            502,
            "no HTTP status: a bad gateway"
        );
    }
}
