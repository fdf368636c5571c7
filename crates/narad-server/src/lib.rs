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
//!   [`cluster_settings`]: the cluster keys, checked and resolved.
//! * [`cluster`]: the control plane as the API sees it ([`cluster::ClusterView`]).
//! * [`openapi`]: the OpenAPI document, generated from the handlers.
//! * [`body`], [`objects_only`], [`query`], [`duration`], [`wire`]: parsing
//!   and encoding.

pub mod accept;
pub mod access;
pub mod auth;
pub mod body;
pub mod cluster;
pub mod cluster_node;
pub mod cluster_settings;
pub mod config;
pub mod conn;
pub mod consume_any;
pub mod control_restart;
pub mod csrf;
pub mod duration;
pub mod error;
pub mod fanout_peers;
pub mod fast;
pub mod forward;
pub mod forwarded_consume;
pub mod http_metrics;
pub mod limits;
pub mod moves;
pub mod node_identity;
pub mod objects_only;
pub mod openapi;
pub mod query;
pub mod ratelimit;
pub mod remote_owner;
pub mod routes;
pub mod server;
pub mod state;
pub mod tls;
pub mod wire;
