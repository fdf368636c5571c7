//! HTTP metrics (SPEC §9): requests, durations, bytes in and out, in
//! flight; `route` is the matched pattern or `unmatched`, and `method` one
//! of the nine standard methods or `other` ([`method_label`]): no label
//! takes its text from the request, so junk methods cannot grow `/metrics`
//! or the series map.
//!
//! The label sets a request touches are resolved once per (method, route,
//! status) and their handles kept in a small map, so a request does one
//! foldhash lookup instead of four SipHash lookups in the metric families
//! and the label strings it would allocate for them (about 2% of the
//! instructions of a durable produce, by callgrind).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use narad_broker::metrics::BrokerMetrics;
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

/// The `method` label of a request method: the standard methods by name,
/// any other (an extension method, a client's invention of any length) as
/// `other`.
pub fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::PATCH => "PATCH",
        _ => "other",
    }
}

/// The series of one (method, route): shared handles into the families.
#[derive(Debug)]
struct RouteSeries {
    /// [`method_label`] of the method.
    method_key: &'static str,
    /// `"{method} {route}"`, the `route` label.
    label: String,
    bytes_in: Counter,
    bytes_out: Counter,
    /// (status, requests, durations), a handful per route.
    by_status: RwLock<Vec<(u16, Counter, Histogram)>>,
}

/// Route pattern -> the series of each method seen on it.
type Routes = HashMap<Box<str>, Vec<Arc<RouteSeries>>, foldhash::fast::RandomState>;

#[derive(Debug, Clone)]
pub struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    durations: Durations,
    bytes_in: Family<RouteLabels, Counter>,
    bytes_out: Family<RouteLabels, Counter>,
    in_flight: Gauge,
    routes: Arc<RwLock<Routes>>,
    /// The series of `POST /v1/topics/{topic}/produce`, for the produce
    /// fast path ([`crate::fast`]), resolved on its first request.
    produce: OnceLock<Arc<RouteSeries>>,
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
            routes: Arc::default(),
            produce: OnceLock::new(),
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

impl HttpMetrics {
    /// The series of `method` on `route`, created on first use.
    fn route(&self, method: &Method, route: &str) -> Arc<RouteSeries> {
        let method = method_label(method);
        let find =
            |routes: &Routes| routes.get(route)?.iter().find(|s| s.method_key == method).cloned();
        if let Some(s) = find(&self.routes.read().unwrap_or_else(|p| p.into_inner())) {
            return s;
        }
        let label = format!("{method} {route}");
        let series = Arc::new(RouteSeries {
            method_key: method,
            bytes_in: self.bytes_in.get_or_create(&RouteLabels { route: label.clone() }).clone(),
            bytes_out: self.bytes_out.get_or_create(&RouteLabels { route: label.clone() }).clone(),
            label,
            by_status: RwLock::default(),
        });
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = find(&routes) {
            return s;
        }
        routes.entry(route.into()).or_default().push(series.clone());
        series
    }

    /// The request counter and duration histogram of `series` at `status`.
    fn status(&self, series: &RouteSeries, status: u16) -> (Counter, Histogram) {
        let find = |v: &Vec<(u16, Counter, Histogram)>| {
            v.iter().find(|(s, _, _)| *s == status).map(|(_, c, h)| (c.clone(), h.clone()))
        };
        if let Some(found) = find(&series.by_status.read().unwrap_or_else(|p| p.into_inner())) {
            return found;
        }
        let labels = RequestLabels {
            route: series.label.clone(),
            method: series.method_key.to_owned(),
            status: status.to_string(),
        };
        let counter = self.requests.get_or_create(&labels).clone();
        let histogram = self.durations.get_or_create(&labels).clone();
        let mut v = series.by_status.write().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = find(&v) {
            return found;
        }
        v.push((status, counter.clone(), histogram.clone()));
        (counter, histogram)
    }
}

fn content_length(h: &HeaderMap) -> u64 {
    h.get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One request's measurement: begun before its checks and its handler,
/// finished with its response.
#[derive(Debug)]
pub struct Measure {
    series: Arc<RouteSeries>,
    start: Instant,
}

impl HttpMetrics {
    /// Starts measuring a request of `method` on `route`.
    pub fn begin(&self, method: &Method, route: &str, headers: &HeaderMap) -> Measure {
        self.begin_on(self.route(method, route), headers)
    }

    /// [`HttpMetrics::begin`] for `POST /v1/topics/{topic}/produce`.
    pub fn begin_produce(&self, headers: &HeaderMap) -> Measure {
        let series = self.produce.get_or_init(|| self.route(&Method::POST, PRODUCE_ROUTE));
        self.begin_on(series.clone(), headers)
    }

    fn begin_on(&self, series: Arc<RouteSeries>, headers: &HeaderMap) -> Measure {
        series.bytes_in.inc_by(content_length(headers));
        self.in_flight.inc();
        Measure { series, start: Instant::now() }
    }

    /// Counts the answer of a request measured since [`HttpMetrics::begin`].
    pub fn finish(&self, m: Measure, resp: &Response, broker: &BrokerMetrics) {
        self.in_flight.dec();
        let (requests, durations) = self.status(&m.series, resp.status().as_u16());
        requests.inc();
        durations.observe(m.start.elapsed().as_secs_f64());
        m.series.bytes_out.inc_by(content_length(resp.headers()));
        if resp.status().is_server_error() {
            broker.error("http", "5xx");
        }
    }
}

/// The route pattern of a single produce.
pub const PRODUCE_ROUTE: &str = "/v1/topics/{topic}/produce";

/// The middleware: counts and times every request, and runs the
/// cross-site check ([`crate::csrf`]) and the access checks
/// ([`crate::access::guard`]) inside that measurement.
pub async fn track(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let m = &state.http;
    let measure = m.begin(
        req.method(),
        req.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str()),
        req.headers(),
    );
    // The cross-site and access checks run inside the measurement (a
    // refused request is counted with its status) without a middleware
    // layer of their own.
    let resp = match crate::csrf::refusal(&req, state.broker.metrics()) {
        Some(refused) => refused.into_response(),
        None => crate::access::guard(State(state.clone()), req, next).await,
    };
    m.finish(measure, &resp, state.broker.metrics());
    resp
}
