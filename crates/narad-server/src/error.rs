//! Errors at the HTTP edge: every failure becomes a status and a body in
//! one place. JSON errors are `{"error":"<msg>"}\n`; two are plain text,
//! as in Narad and Go's `net/http` (an unknown route 404, a wrong method
//! 405). Every 503 carries `Retry-After` ([`RETRY_AFTER_SECS`]): the
//! refusal is temporary (an election, an owner restarting, a full queue).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use narad_broker::BrokerError;
use narad_meta::MetaError;
use narad_node::error::NodeError;

/// An error answer.
#[derive(Debug)]
pub enum ApiError {
    /// `{"error": msg}` with `status`.
    Json {
        /// HTTP status.
        status: StatusCode,
        /// The wire message.
        message: String,
    },
    /// A plain-text body.
    Text {
        /// HTTP status.
        status: StatusCode,
        /// The body.
        body: &'static str,
    },
}

impl ApiError {
    /// 400 with `message`.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::Json { status: StatusCode::BAD_REQUEST, message: message.into() }
    }

    /// 413 `request body too large`.
    pub fn too_large() -> ApiError {
        ApiError::Json {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: "request body too large".into(),
        }
    }

    /// 408: the request body did not arrive within `http.read_timeout`.
    pub fn body_timeout() -> ApiError {
        ApiError::Json {
            status: StatusCode::REQUEST_TIMEOUT,
            message: "request body not received in time".into(),
        }
    }

    /// The status of this answer.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Json { status, .. } | ApiError::Text { status, .. } => *status,
        }
    }
}

/// The `Retry-After` of a 503: one second, as the password-verify queue's.
pub const RETRY_AFTER_SECS: u64 = 1;

/// Adds `Retry-After` to a 503 (unless it has one).
pub fn add_retry_after(r: &mut Response) {
    if !r.headers().contains_key(header::RETRY_AFTER) {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    }
}

/// The JSON error body.
pub fn error_body(message: &str) -> String {
    let mut s = serde_json::json!({ "error": message }).to_string();
    s.push('\n');
    s
}

impl From<NodeError> for ApiError {
    fn from(e: NodeError) -> ApiError {
        let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError::Json { status, message: e.message }
    }
}

/// A broker error's status and public message (logged where it becomes a
/// [`NodeError`]: by design refusals at DEBUG, a leaderless control plane
/// at most one WARN per 10 s, other 5xx at ERROR).
impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> ApiError {
        NodeError::from(e).into()
    }
}

impl From<MetaError> for ApiError {
    fn from(e: MetaError) -> ApiError {
        BrokerError::Meta(e).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Json { status, message } => {
                let mut r = (status, error_body(&message)).into_response();
                r.headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                if status == StatusCode::PAYLOAD_TOO_LARGE || status == StatusCode::REQUEST_TIMEOUT
                {
                    // The unread rest of the body makes the connection
                    // unusable: tell the client not to reuse it.
                    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    add_retry_after(&mut r);
                }
                r
            }
            ApiError::Text { status, body } => {
                let mut r = (status, body).into_response();
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                r.headers_mut()
                    .insert("X-Content-Type-Options", HeaderValue::from_static("nosniff"));
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    add_retry_after(&mut r);
                }
                r
            }
        }
    }
}

/// A JSON response: the value's encoding plus `\n`.
pub fn json_response(status: StatusCode, body: String) -> Response {
    let mut body = body;
    body.push('\n');
    let mut r = (status, body).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        add_retry_after(&mut r);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_503_says_when_to_retry_and_other_errors_do_not() {
        let busy = ApiError::Json { status: StatusCode::SERVICE_UNAVAILABLE, message: "x".into() };
        assert_eq!(busy.into_response().headers()[header::RETRY_AFTER], "1");
        let text = ApiError::Text { status: StatusCode::SERVICE_UNAVAILABLE, body: "x" };
        assert_eq!(text.into_response().headers()[header::RETRY_AFTER], "1");
        let ready =
            json_response(StatusCode::SERVICE_UNAVAILABLE, r#"{"error":"not ready"}"#.into());
        assert_eq!(ready.headers()[header::RETRY_AFTER], "1");
        let failed =
            ApiError::Json { status: StatusCode::INTERNAL_SERVER_ERROR, message: "x".into() };
        assert!(failed.into_response().headers().get(header::RETRY_AFTER).is_none());
        assert!(
            json_response(StatusCode::OK, "{}".into()).headers().get(header::RETRY_AFTER).is_none()
        );
        // A 503 that set its own keeps it.
        let mut r = (StatusCode::SERVICE_UNAVAILABLE, "").into_response();
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(7u64));
        add_retry_after(&mut r);
        assert_eq!(r.headers()[header::RETRY_AFTER], "7");
    }
}
