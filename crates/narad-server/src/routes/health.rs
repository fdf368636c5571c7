//! `/healthz`, `/readyz`, `/metrics` (no auth).

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use utoipa::ToSchema;

use crate::error::json_response;
use crate::openapi::ErrorBody;
use crate::state::Shared;

/// `{"status": ...}` of `/healthz` and `/readyz`.
#[derive(Debug, serde::Serialize, ToSchema)]
pub struct Status {
    /// `ok`, `ready` or `shutting down`.
    pub status: String,
}

/// 200 `{"status":"ok"}`, 503 `{"status":"shutting down"}` once shutdown
/// started.
#[utoipa::path(
    get,
    operation_id = "healthz",
    path = "/healthz",
    tag = "operations",
    responses(
        (status = 200, description = "Serving", body = Status),
        (status = 503, description = "Shutting down", body = Status),
    )
)]
pub async fn healthz(State(s): State<Shared>) -> Response {
    if s.shutting_down.load(Ordering::Acquire) {
        json_response(StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"shutting down"}"#.into())
    } else {
        json_response(StatusCode::OK, r#"{"status":"ok"}"#.into())
    }
}

/// 200 `{"status":"ready"}` once start-up finished, else 503 `{"error":"not
/// ready"}`. A latched ingress WAL makes the node unready for good (503
/// `{"error":"ingress WAL failed: produce refused until restart"}`): every
/// produce fails until a restart, and an orchestrator must be able to see
/// that (narad v3 kept answering 200; a deliberate change). So does a
/// control plane whose Raft core stopped on a fatal error (503
/// `{"error":"control plane stopped: ..."}`): its metadata is frozen and
/// its writes refused.
#[utoipa::path(
    get,
    operation_id = "readyz",
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Status),
        (status = 503, description = "Not ready, the ingress WAL latched a failure, or the control plane stopped", body = ErrorBody),
    )
)]
pub async fn readyz(State(s): State<Shared>) -> Response {
    if s.broker.wal_failed() {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":"ingress WAL failed: produce refused until restart"}"#.into(),
        )
    } else if let Some(why) = s.cluster.as_ref().and_then(|c| c.control_plane_stopped()) {
        let body = serde_json::json!({
            "error": format!("control plane stopped: {why}; metadata writes refused until restart")
        });
        json_response(StatusCode::SERVICE_UNAVAILABLE, body.to_string())
    } else if s.ready.load(Ordering::Acquire) {
        json_response(StatusCode::OK, r#"{"status":"ready"}"#.into())
    } else {
        json_response(StatusCode::SERVICE_UNAVAILABLE, r#"{"error":"not ready"}"#.into())
    }
}

/// Prometheus text format.
#[utoipa::path(
    get,
    operation_id = "metrics",
    path = "/metrics",
    tag = "operations",
    responses(
        (status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text", body = String),
    )
)]
pub async fn metrics(State(s): State<Shared>) -> Response {
    s.broker.poll_cheap_gauges();
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &s.registry) {
        return crate::error::ApiError::Json {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("metrics encoding failed: {e}"),
        }
        .into_response();
    }
    let mut r = (StatusCode::OK, out).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}
