//! Node RPC metrics: request counts, latency and errors by op, on both
//! sides of a call; connections refused or not authenticated, and the
//! ones still authenticating; streams closed on a bad frame. Created
//! unregistered; the server adds them to its registry (which carries the
//! `narad` prefix; prometheus-client appends `_total` to counters).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `{op, side}`; side is `client` (this node called) or `server` (it answered).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// The op's name (`commit_produce_batch`, ...), or `unknown`.
    pub op: String,
    /// `client` or `server`.
    pub side: String,
}

/// `{op, side, kind}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpErrorLabels {
    /// The op's name, or `unknown`.
    pub op: String,
    /// `client` or `server`.
    pub side: String,
    /// `timeout`, `dial`, `connection`, `remote`, `malformed`,
    /// `unsupported_op`, `too_large`, `status_4xx`, `status_5xx`, ...
    pub kind: String,
}

/// `{reason}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    /// `malformed`, `too_large`.
    pub reason: String,
}

/// `{side, reason}` of a connection that was not served.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnRejectLabels {
    /// `server` (this node refused a connection it was offered) or
    /// `client` (the node it dialled did not prove the secret).
    pub side: String,
    /// `auth` (a wrong or missing proof), `peer_refused` (the dialler
    /// refused this node's proof), `auth_timeout`, `malformed`
    /// (bytes that are not the handshake), `version` (an older protocol),
    /// `handshake` (QUIC/TLS failed), `connection` (closed mid-way),
    /// `busy` (too many connections not yet authenticated), `backoff` (the
    /// source spent its failure budget).
    pub reason: String,
}

/// `{trigger, outcome}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    /// `timeout` (a call to the peer timed out or was abandoned) or
    /// `peer_connected` (the peer opened a new connection to this node:
    /// it may have restarted).
    pub trigger: String,
    /// `alive` (the peer answered the ping) or `closed` (it did not: the
    /// connection was closed, the next call dials again).
    pub outcome: String,
}

/// `{peer}`: a peer's address.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerAddrLabels {
    /// The peer's node RPC address.
    pub peer: String,
}

/// `{outcome}` of a cancel a peer sent.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CancelLabels {
    /// `stopped` (the request was running: its handler was dropped),
    /// `finished` (nothing was running under that id any more), or
    /// `disconnected` (the requester's connection ended with it running).
    pub outcome: String,
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~105 s: covers the 75 s create forward.
    Histogram::new(exponential_buckets(0.0001, 2.0, 21))
}

/// The node RPC metrics.
#[derive(Debug, Clone)]
pub struct RpcMetrics {
    /// `node_rpc_requests_total{op,side}`.
    pub requests: Family<OpLabels, Counter>,
    /// `node_rpc_request_duration_seconds{op,side}`.
    pub duration: Family<OpLabels, Histogram, fn() -> Histogram>,
    /// `node_rpc_errors_total{op,side,kind}`: failed calls, and replies
    /// with status ≥ 400.
    pub errors: Family<OpErrorLabels, Counter>,
    /// `node_rpc_streams_rejected_total{reason}`.
    pub streams_rejected: Family<RejectLabels, Counter>,
    /// `node_rpc_liveness_probes_total{trigger,outcome}`.
    pub probes: Family<ProbeLabels, Counter>,
    /// `node_rpc_connections_rejected_total{side,reason}`.
    pub connections_rejected: Family<ConnRejectLabels, Counter>,
    /// `node_rpc_unauthenticated_connections`.
    pub unauthenticated: Gauge,
    /// `node_rpc_peer_suspected_total{peer}`: times a peer became suspect.
    pub suspected: Family<PeerAddrLabels, Counter>,
    /// `node_rpc_suspect_peers`: peers suspect now.
    pub suspect_peers: Gauge,
    /// `node_rpc_requests_cancelled_total{outcome}`: requests stopped
    /// because their requester went away: `stopped` / `finished` (it asked,
    /// op 38), `disconnected` (its connection ended), `silent` (it stopped
    /// pinging during the request).
    pub cancelled: Family<CancelLabels, Counter>,
}

impl Default for RpcMetrics {
    fn default() -> Self {
        RpcMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
            errors: Family::default(),
            streams_rejected: Family::default(),
            probes: Family::default(),
            connections_rejected: Family::default(),
            unauthenticated: Gauge::default(),
            suspected: Family::default(),
            suspect_peers: Gauge::default(),
            cancelled: Family::default(),
        }
    }
}

impl RpcMetrics {
    /// Adds the metrics to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "node_rpc_requests",
            "Node RPC requests, by op and side",
            self.requests.clone(),
        );
        registry.register(
            "node_rpc_request_duration_seconds",
            "Node RPC request latency, by op and side",
            self.duration.clone(),
        );
        registry.register(
            "node_rpc_errors",
            "Node RPC failures and error replies, by op, side and kind",
            self.errors.clone(),
        );
        registry.register(
            "node_rpc_streams_rejected",
            "Node RPC streams closed on a malformed or oversized frame",
            self.streams_rejected.clone(),
        );
        registry.register(
            "node_rpc_connections_rejected",
            "Node RPC connections refused or closed before they authenticated, by side and reason",
            self.connections_rejected.clone(),
        );
        registry.register(
            "node_rpc_unauthenticated_connections",
            "Node RPC connections in the QUIC handshake or the authentication exchange",
            self.unauthenticated.clone(),
        );
        registry.register(
            "node_rpc_liveness_probes",
            "Pings of a peer's connection after a call to it timed out or the peer connected anew, by trigger and outcome",
            self.probes.clone(),
        );
        registry.register(
            "node_rpc_peer_suspected",
            "Times a peer became suspect: a call to it failed in transport (no dial, no reply in time, a lost connection, an unanswered ping); forwarded requests to it answer 503 at once until a ping comes back",
            self.suspected.clone(),
        );
        registry.register(
            "node_rpc_suspect_peers",
            "Peers suspect now (no frame from them since a call to them failed in transport)",
            self.suspect_peers.clone(),
        );
        registry.register(
            "node_rpc_requests_cancelled",
            "Requests a peer asked this node to stop because their requester went away, by outcome",
            self.cancelled.clone(),
        );
    }

    pub(crate) fn cancel(&self, outcome: &str) {
        self.cancelled.get_or_create(&CancelLabels { outcome: outcome.to_owned() }).inc();
    }

    pub(crate) fn observe(&self, op: &str, side: &str, seconds: f64, error: Option<&str>) {
        let labels = OpLabels { op: op.to_owned(), side: side.to_owned() };
        self.requests.get_or_create(&labels).inc();
        self.duration.get_or_create(&labels).observe(seconds);
        if let Some(kind) = error {
            self.errors
                .get_or_create(&OpErrorLabels {
                    op: op.to_owned(),
                    side: side.to_owned(),
                    kind: kind.to_owned(),
                })
                .inc();
        }
    }

    pub(crate) fn probed(&self, trigger: &str, outcome: &str) {
        self.probes
            .get_or_create(&ProbeLabels {
                trigger: trigger.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    pub(crate) fn connection_rejected(&self, side: &str, reason: &str) {
        self.connections_rejected
            .get_or_create(&ConnRejectLabels { side: side.to_owned(), reason: reason.to_owned() })
            .inc();
    }

    pub(crate) fn set_unauthenticated(&self, n: usize) {
        self.unauthenticated.set(n as i64);
    }

    pub(crate) fn rejected(&self, reason: &str) {
        self.streams_rejected.get_or_create(&RejectLabels { reason: reason.to_owned() }).inc();
    }
}

/// The error kind of a reply status, if it is an error.
pub(crate) fn status_kind(status: u16) -> Option<&'static str> {
    match status {
        400..=499 => Some("status_4xx"),
        500.. => Some("status_5xx"),
        _ => None,
    }
}
