//! Node RPC for a narad cluster: the `NRS1` frame, the op codes and their
//! request/reply encodings, and the QUIC transport (quinn, ALPN
//! `narad-cluster-quic-v2`) with mutual authentication between nodes once
//! per connection (HMAC proofs bound to the TLS session, and/or mutual TLS); membership (every node's heartbeat, and the controller the
//! leader runs: dead-marking and placing unassigned partitions). The broker
//! never depends on this crate, nor this crate on the broker (placement is
//! narad-meta's); the server wires the two together (DESIGN §6b).

pub mod auth;
mod codec;
pub mod commit_answer;
pub mod controller;
pub mod error;
pub mod frame;
mod gate;
pub mod handshake;
pub mod heartbeat_ages;
pub mod limits;
pub mod members;
pub mod metrics;
pub mod moves;
pub mod raft;
pub mod rpc;
pub mod suspect;
pub mod tls;
pub mod transport;

pub use auth::{ClusterAuth, ClusterSecret, TlsFiles};
pub use controller::plan;
pub use error::{Error, Result};
pub use handshake::PeerIdentity;
pub use members::{LeaderView, Membership};
pub use metrics::RpcMetrics;
pub use rpc::{Lane, Op, Reply, Request};
pub use suspect::Suspicion;
pub use transport::{Handler, Peer, Transport};
