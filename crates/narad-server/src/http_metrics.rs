//! HTTP metrics (SPEC §9): requests, durations, bytes in and out, in
//! flight; `route` is the matched pattern or `unmatched`.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::state::Shared;

/// `{route, method, status}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Matched route pattern.
    pub route: String,
    /// HTTP method.
    pub method: String,
    /// Status code.
    pub status: String,
}

/// `{route}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// Matched route pattern.
    pub route: String,
}

type Durations = Family<RequestLabels, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

/// The HTTP metrics.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    durations: Durations,
    bytes_in: Family<RouteLabels, Counter>,
    bytes_out: Family<RouteLabels, Counter>,
    in_flight: Gauge,
}

impl HttpMetrics {
    /// Registers the HTTP metrics.
    pub fn new(registry: &mut Registry) -> HttpMetrics {
        let m = HttpMetrics {
            requests: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
            bytes_in: Family::default(),
            bytes_out: Family::default(),
            in_flight: Gauge::default(),
        };
        registry.register("http_requests", "HTTP requests", m.requests.clone());
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency",
            m.durations.clone(),
        );
        registry.register("http_request_bytes_in", "Request body bytes", m.bytes_in.clone());
        registry.register("http_response_bytes_out", "Response body bytes", m.bytes_out.clone());
        registry.register("http_requests_in_flight", "Requests being served", m.in_flight.clone());
        m
    }
}

fn content_length(h: &axum::http::HeaderMap) -> u64 {
    h.get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The middleware.
pub async fn track(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = req.method().as_str().to_owned();
    let route = format!("{method} {route}");
    let m = &state.http;
    m.bytes_in
        .get_or_create(&RouteLabels { route: route.clone() })
        .inc_by(content_length(req.headers()));
    m.in_flight.inc();
    let start = Instant::now();
    let resp = next.run(req).await;
    m.in_flight.dec();
    let labels =
        RequestLabels { route: route.clone(), method, status: resp.status().as_u16().to_string() };
    m.requests.get_or_create(&labels).inc();
    m.durations.get_or_create(&labels).observe(start.elapsed().as_secs_f64());
    m.bytes_out.get_or_create(&RouteLabels { route }).inc_by(content_length(resp.headers()));
    if resp.status().is_server_error() {
        state.broker.metrics().error("http", "5xx");
    }
    resp
}
