//! narad-server: the HTTP API (SPEC §1), wire-compatible with Narad /v1.
//!
//! * [`server`]: binding, wiring, graceful shutdown.
//! * [`accept`]: accepting connections: the connection limit, accept back-off.
//! * [`conn`]: serving connections: read, write and idle timeouts, head bound.
//! * [`routes`]: one module per resource.
//! * [`error`]: every failure to a status and body, in one place.
//! * [`access`], [`auth`], [`ratelimit`]: who may call what, how often;
//!   [`csrf`]: what a browser marks as sent by another site.
//! * [`config`]: the layered configuration; [`tls`]: the HTTPS listener;
//!   [`cluster_settings`]: the cluster keys, checked and resolved into
//!   narad-node's settings.
//! * [`cluster`]: the control plane as the API sees it ([`cluster::ClusterView`],
//!   narad-node's); [`forward`]: owners' answers relayed as HTTP answers;
//!   [`consume_any`]: queue-mode consumes across the cluster's owners.
//! * [`openapi`]: the OpenAPI document, generated from the handlers.
//! * [`body`], [`objects_only`], [`query`], [`duration`], [`wire`]: parsing
//!   and encoding.
//!
//! The node itself (node RPC, commits to other owners, forwarding, the
//! cluster's start-up and shutdown, the node id) is narad-node: this crate
//! speaks HTTP and calls the node, never node RPC directly.

pub mod accept;
pub mod access;
pub mod auth;
pub mod body;
pub mod cluster;
pub mod cluster_settings;
pub mod config;
pub mod conn;
pub mod consume_any;
pub mod csrf;
pub mod duration;
pub mod error;
pub mod fast;
pub mod forward;
pub mod http_metrics;
pub mod limits;
pub mod objects_only;
pub mod openapi;
pub mod query;
pub mod ratelimit;
pub mod routes;
pub mod server;
pub mod state;
pub mod tls;
pub mod wire;
