//! What every handler shares.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use narad_broker::Broker;
use prometheus_client::registry::Registry;

use crate::access::Security;
use crate::cluster::ClusterView;
use crate::http_metrics::HttpMetrics;

/// Shared state of the HTTP server.
#[derive(Debug)]
pub struct AppState {
    /// The data plane.
    pub broker: Arc<Broker>,
    /// Every metric, for `/metrics`.
    pub registry: Registry,
    /// HTTP metrics.
    pub http: HttpMetrics,
    /// Set once start-up finished (`/readyz`).
    pub ready: AtomicBool,
    /// Set once shutdown started (`/healthz` answers 503).
    pub shutting_down: AtomicBool,
    /// The long-poll ceiling (`http.max_consume_wait`).
    pub max_consume_wait: Duration,
    /// Authentication, authorization and rate limits.
    pub security: Security,
    /// The control plane (`None`: a single node, no peers).
    pub cluster: Option<Arc<dyn ClusterView>>,
    /// Which partition serves the next queue-mode consume on a cluster
    /// node, and what it knows of the other owners' backlogs.
    pub any_partition: crate::consume_any::AnyPartition,
}

/// The handle handlers receive.
pub type Shared = Arc<AppState>;
