//! Raft's RPCs over node RPC: openraft's requests travel as serde_json in
//! the `bytes` field of ops 30 (AppendEntries), 31 (Vote) and 32
//! (InstallSnapshot, one chunk per call; see [`SNAPSHOT_CHUNK_BYTES`]);
//! the reply is 200 with the JSON of the receiver's `Result` (its Raft
//! error included), any other status is a transport-level failure.
//!
//! Failures map to what openraft expects: an unreachable peer (dial or
//! connection failure) is [`Unreachable`] so openraft backs off; a request
//! over the frame limit is [`PayloadTooLarge`] with a hint of half the
//! entries, so openraft retries with smaller batches.

use std::net::SocketAddr;
use std::sync::Arc;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, RaftNetwork, RaftNetworkFactory};
use serde::Serialize;
use serde::de::DeserializeOwned;

use narad_meta::Command;

use super::types::{NodeId, RaftNode, TypeConfig};
use crate::error::Error;
use crate::rpc::Request;
use crate::tls::DEFAULT_SERVER_NAME;
use crate::transport::{Peer, Transport};

/// Bytes of snapshot data per InstallSnapshot call. serde_json writes a
/// byte array as numbers (up to 4 bytes per byte), so 2 MiB of data stays
/// well inside the 16 MiB frame.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 2 << 20;

/// Builds a connection per target over the node's [`Transport`].
#[derive(Debug, Clone)]
pub struct Network {
    transport: Arc<Transport>,
}

impl Network {
    /// Raft's network over `transport`.
    pub fn new(transport: Arc<Transport>) -> Self {
        Network { transport }
    }
}

/// One target.
#[derive(Debug)]
pub struct Connection {
    target: NodeId,
    peer: Result<Arc<Peer>, String>,
}

/// The peer at a node's cluster address.
pub(crate) fn peer_of(transport: &Transport, node: &RaftNode) -> Result<Arc<Peer>, String> {
    let addr: SocketAddr = node.cluster_addr.parse().map_err(|e| {
        format!("node {} has a bad cluster address {:?}: {e}", node.id, node.cluster_addr)
    })?;
    Ok(transport.peer(addr, DEFAULT_SERVER_NAME))
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &RaftNode) -> Connection {
        Connection { target, peer: peer_of(&self.transport, node) }
    }
}

type RpcErr<E = openraft::error::Infallible> = RPCError<NodeId, RaftNode, RaftError<NodeId, E>>;

fn network_error<E: std::error::Error>(text: String) -> RPCError<NodeId, RaftNode, E> {
    RPCError::Network(NetworkError::new(&AnyError::error(text)))
}

impl Connection {
    /// Sends one Raft RPC and decodes the receiver's `Result`.
    async fn call<Req, Resp, E>(
        &self,
        make: fn(bytes::Bytes) -> Request,
        rpc: &Req,
        option: &RPCOption,
        entries: usize,
    ) -> Result<Resp, RPCError<NodeId, RaftNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let peer = self.peer.as_ref().map_err(|e| network_error(e.clone()))?;
        let body = serde_json::to_vec(rpc).map_err(|e| network_error(format!("encode: {e}")))?;
        let request = make(body.into());
        match peer.call_with_timeout(&request, option.hard_ttl()).await {
            Ok(reply) if reply.status == 200 => {
                let result: Result<Resp, RaftError<NodeId, E>> =
                    serde_json::from_slice(&reply.body).map_err(|e| {
                        network_error(format!(
                            "{} reply from node {}: {e}",
                            request.op().name(),
                            self.target
                        ))
                    })?;
                result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(reply) => Err(network_error(format!(
                "{} to node {}: status {}: {}",
                request.op().name(),
                self.target,
                reply.status,
                String::from_utf8_lossy(&reply.body)
            ))),
            Err(Error::FrameTooLarge { .. }) if entries > 1 => Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint((entries / 2) as u64),
            )),
            Err(e @ (Error::Dial { .. } | Error::Connection(_))) => {
                Err(RPCError::Unreachable(Unreachable::new(&e)))
            }
            Err(e) => Err(network_error(e.to_string())),
        }
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        let n = rpc.entries.len();
        self.call(Request::RaftAppendEntries, &rpc, &option, n).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        self.call(Request::RaftInstallSnapshot, &rpc, &option, 0).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        self.call(Request::RaftVote, &rpc, &option, 0).await
    }
}

/// The JSON payload of a control-plane request (ops 29-32), decoded: the
/// one decoder of these payloads, used by the server side and fuzzed
/// (`fuzz/src/cluster.rs`, `control_rpc_payload`).
#[derive(Debug)]
pub enum ControlPayload {
    /// 29.
    Propose(Command),
    /// 30.
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// 31.
    Vote(VoteRequest<NodeId>),
    /// 32.
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
}

impl ControlPayload {
    /// The payload of `request`; `None` for a request that carries no JSON
    /// payload of the control plane.
    pub fn decode(request: &Request) -> Option<Result<ControlPayload, serde_json::Error>> {
        Some(match request {
            Request::ProposeCommand(b) => serde_json::from_slice(b).map(ControlPayload::Propose),
            Request::RaftAppendEntries(b) => {
                serde_json::from_slice(b).map(ControlPayload::AppendEntries)
            }
            Request::RaftVote(b) => serde_json::from_slice(b).map(ControlPayload::Vote),
            Request::RaftInstallSnapshot(b) => {
                serde_json::from_slice(b).map(ControlPayload::InstallSnapshot)
            }
            _ => return None,
        })
    }

    /// The request carrying this payload.
    pub fn encode(&self) -> Request {
        fn json<T: Serialize>(v: &T) -> bytes::Bytes {
            serde_json::to_vec(v).expect("control payloads always serialize").into()
        }
        match self {
            ControlPayload::Propose(c) => Request::ProposeCommand(json(c)),
            ControlPayload::AppendEntries(r) => Request::RaftAppendEntries(json(r)),
            ControlPayload::Vote(r) => Request::RaftVote(json(r)),
            ControlPayload::InstallSnapshot(r) => Request::RaftInstallSnapshot(json(r)),
        }
    }
}
