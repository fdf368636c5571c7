//! narad-server: the HTTP API (SPEC §1), wire-compatible with Narad /v1.
//!
//! * [`server`]: binding, wiring, graceful shutdown.
//! * [`routes`]: one module per resource.
//! * [`error`]: every failure to a status and body, in one place.
//! * [`access`], [`auth`], [`ratelimit`]: who may call what, how often.
//! * [`config`]: the layered configuration; [`tls`]: the HTTPS listener.
//! * [`body`], [`query`], [`duration`], [`wire`]: parsing and encoding.

pub mod access;
pub mod auth;
pub mod body;
pub mod config;
pub mod duration;
pub mod error;
pub mod http_metrics;
pub mod limits;
pub mod query;
pub mod ratelimit;
pub mod routes;
pub mod server;
pub mod state;
pub mod tls;
pub mod wire;
