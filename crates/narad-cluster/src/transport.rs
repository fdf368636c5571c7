//! The QUIC endpoint of node RPC (SPEC §7.4): one connection per peer,
//! pooled streams per lane, requests multiplexed over a stream by request
//! id; a server side that answers NodeRequests through a [`Handler`].
//!
//! Stream protocol: with a cluster secret, the client's first frame on
//! every stream is Auth (id 0, the HMAC tag); the server waits at most
//! [`AUTH_TIMEOUT`] for it and, when it is missing, late or wrong, stops
//! and resets the stream without reading anything else from it: the peer
//! gets no reply, no error frame, and nothing reaches the handler. After
//! that the client sends NodeRequest and Ping frames with fresh ids; the
//! server answers each with NodeReply (or Error) and Pong under the same
//! id, in whatever order the handler finishes. A malformed or oversized
//! frame ends the stream with one Error frame (id 0) naming the fault.

use crate::auth::{ClusterAuth, ClusterSecret, WarnLimiter};
use crate::error::{Error, Result};
use crate::frame::{Frame, FrameType, read_frame, write_frame, write_frame_chunks};
use crate::limits::{
    AUTH_TIMEOUT, DIAL_TIMEOUT, FRAME_MAX_PAYLOAD, IDLE_TIMEOUT, KEEP_ALIVE_INTERVAL,
    LIVENESS_PROBE_TIMEOUT, MAX_IN_FLIGHT_PER_STREAM, MAX_STREAMS_PER_CONNECTION, REPLY_TIMEOUT,
};
use crate::metrics::{RpcMetrics, status_kind};
use crate::rpc::{Lane, Op, Reply, Request};
use crate::tls;
use bytes::Bytes;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, oneshot};

/// What serves the requests a node receives.
pub trait Handler: Send + Sync + 'static {
    /// Answers one decoded request. Requests that fail to decode never
    /// reach the handler (the transport answers them with 400).
    fn handle(&self, request: Request) -> impl Future<Output = Reply> + Send;
}

/// The UDP socket's receive and send buffers: a remote commit of up to
/// 8 MiB arrives as a burst the default buffer (208 KiB) cannot hold while
/// the node's runtime is busy, and every datagram dropped there is a
/// retransmission and a congestion-window cut (100 round trips of 4 MiB on
/// loopback: 1,448-2,470 datagrams dropped with the default, none with
/// 4 MiB). The kernel caps the request at `net.core.rmem_max` /
/// `wmem_max` (docs/CLUSTER.md).
const UDP_SOCKET_BUFFER_BYTES: usize = 4 << 20;

fn transport_config() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(Some(IDLE_TIMEOUT.try_into().expect("30 s fits a QUIC idle timeout")));
    t.keep_alive_interval(Some(KEEP_ALIVE_INTERVAL));
    t.max_concurrent_bidi_streams(MAX_STREAMS_PER_CONNECTION.into());
    t.max_concurrent_uni_streams(0u32.into());
    Arc::new(t)
}

fn client_config(auth: &ClusterAuth) -> Result<quinn::ClientConfig> {
    let crypto = tls::client_config(auth.tls.as_ref())?;
    let quic = QuicClientConfig::try_from(crypto)
        .map_err(|e| Error::Config(format!("quic client: {e}")))?;
    let mut c = quinn::ClientConfig::new(Arc::new(quic));
    c.transport_config(transport_config());
    Ok(c)
}

fn server_config(auth: &ClusterAuth) -> Result<quinn::ServerConfig> {
    let crypto = tls::server_config(auth.tls.as_ref())?;
    let quic = QuicServerConfig::try_from(crypto)
        .map_err(|e| Error::Config(format!("quic server: {e}")))?;
    let mut s = quinn::ServerConfig::with_crypto(Arc::new(quic));
    s.transport_config(transport_config());
    Ok(s)
}

/// A QUIC endpoint on `addr` (serving with `server` when given) with
/// [`UDP_SOCKET_BUFFER_BYTES`] socket buffers.
fn endpoint(addr: SocketAddr, server: Option<quinn::ServerConfig>) -> Result<quinn::Endpoint> {
    let config = quinn::EndpointConfig::default();
    let socket = std::net::UdpSocket::bind(addr)?;
    let socket = socket2::Socket::from(socket);
    // Best effort: the kernel caps them at net.core.{r,w}mem_max.
    let _ = socket.set_recv_buffer_size(UDP_SOCKET_BUFFER_BYTES);
    let _ = socket.set_send_buffer_size(UDP_SOCKET_BUFFER_BYTES);
    let socket = std::net::UdpSocket::from(socket);
    let runtime = quinn::default_runtime()
        .ok_or_else(|| Error::Config("quic endpoint: no async runtime".into()))?;
    Ok(quinn::Endpoint::new(config, server, socket, runtime)?)
}

fn conn_err(e: impl std::fmt::Display) -> Error {
    Error::Connection(e.to_string())
}

/// A node's QUIC endpoint: dials peers and, when serving, answers them.
#[derive(Debug)]
pub struct Transport {
    endpoint: quinn::Endpoint,
    client: quinn::ClientConfig,
    auth: ClusterAuth,
    metrics: RpcMetrics,
    peers: PeerTable,
}

/// The peers this node dials, by address and server name.
type PeerTable = Arc<Mutex<HashMap<(SocketAddr, String), Arc<Peer>>>>;

/// Why a peer's connection is probed.
#[derive(Debug, Clone, Copy)]
enum ProbeTrigger {
    /// A call to it timed out or was abandoned.
    Timeout,
    /// It opened a new connection to this node (it may have restarted, and
    /// this node's connection to its old process would look healthy until
    /// the idle timeout).
    PeerConnected,
}

impl ProbeTrigger {
    fn as_str(self) -> &'static str {
        match self {
            ProbeTrigger::Timeout => "timeout",
            ProbeTrigger::PeerConnected => "peer_connected",
        }
    }
}

impl Transport {
    /// Binds `addr` (UDP), serves requests with `handler`, and dials peers
    /// from the same socket. Needs a tokio runtime.
    pub fn serve<H: Handler>(
        addr: SocketAddr,
        auth: ClusterAuth,
        metrics: RpcMetrics,
        handler: Arc<H>,
    ) -> Result<Transport> {
        let endpoint = endpoint(addr, Some(server_config(&auth)?))?;
        let peers = PeerTable::default();
        let server = Arc::new(Server {
            auth: auth.clone(),
            metrics: metrics.clone(),
            handler,
            warn: WarnLimiter::default(),
            peers: peers.clone(),
        });
        tokio::spawn(server.accept(endpoint.clone()));
        Transport::with_endpoint(endpoint, auth, metrics, peers)
    }

    /// An endpoint that only dials (binds `addr`, usually port 0).
    pub fn client_only(
        addr: SocketAddr,
        auth: ClusterAuth,
        metrics: RpcMetrics,
    ) -> Result<Transport> {
        let endpoint = endpoint(addr, None)?;
        Transport::with_endpoint(endpoint, auth, metrics, PeerTable::default())
    }

    fn with_endpoint(
        endpoint: quinn::Endpoint,
        auth: ClusterAuth,
        metrics: RpcMetrics,
        peers: PeerTable,
    ) -> Result<Transport> {
        let client = client_config(&auth)?;
        Ok(Transport { endpoint, client, auth, metrics, peers })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.endpoint.local_addr()?)
    }

    /// The peer at `addr` (one per address and name, so one connection).
    /// `server_name` is checked against the peer's certificate under cluster
    /// TLS; without it, any name does (use [`tls::DEFAULT_SERVER_NAME`]).
    pub fn peer(&self, addr: SocketAddr, server_name: &str) -> Arc<Peer> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers
            .entry((addr, server_name.to_owned()))
            .or_insert_with(|| {
                Arc::new_cyclic(|me| Peer {
                    me: me.clone(),
                    probing: std::sync::atomic::AtomicBool::new(false),
                    endpoint: self.endpoint.clone(),
                    client: self.client.clone(),
                    addr,
                    server_name: server_name.to_owned(),
                    secret: self.auth.secret.clone(),
                    metrics: self.metrics.clone(),
                    conn: tokio::sync::Mutex::new(None),
                    lanes: Lane::ALL.map(|_| tokio::sync::Mutex::new(Pool::default())),
                    next_id: AtomicU64::new(1),
                })
            })
            .clone()
    }

    /// Closes every connection and stops serving.
    pub async fn close(&self) {
        self.endpoint.close(0u32.into(), b"shutdown");
        self.endpoint.wait_idle().await;
    }
}

/// One peer: a lazily dialled connection (re-dialled when it drops) and
/// its lanes' stream pools.
#[derive(Debug)]
pub struct Peer {
    /// This peer, for the liveness probe a dropped or timed-out call starts.
    me: std::sync::Weak<Peer>,
    /// A liveness probe is running.
    probing: std::sync::atomic::AtomicBool,
    endpoint: quinn::Endpoint,
    client: quinn::ClientConfig,
    addr: SocketAddr,
    server_name: String,
    secret: Option<ClusterSecret>,
    metrics: RpcMetrics,
    conn: tokio::sync::Mutex<Option<quinn::Connection>>,
    lanes: [tokio::sync::Mutex<Pool>; 4],
    next_id: AtomicU64,
}

#[derive(Debug, Default)]
struct Pool {
    streams: Vec<Arc<ClientStream>>,
    next: usize,
}

/// Starts [`Peer::probe_in_background`] in the background when dropped
/// holding the peer (a call that did not finish: timed out or abandoned).
struct ProbeOnDrop(Option<std::sync::Weak<Peer>>);

impl Drop for ProbeOnDrop {
    fn drop(&mut self) {
        let Some(peer) = self.0.take().and_then(|w| w.upgrade()) else { return };
        peer.probe_in_background(ProbeTrigger::Timeout);
    }
}

/// Replies awaited on one stream, by request id.
#[derive(Debug, Default)]
struct Pending {
    waiting: HashMap<u64, oneshot::Sender<Result<Frame>>>,
    /// Why the stream ended, once it has.
    closed: Option<String>,
}

#[derive(Debug)]
struct ClientStream {
    send: tokio::sync::Mutex<quinn::SendStream>,
    pending: Arc<Mutex<Pending>>,
}

impl ClientStream {
    fn alive(&self) -> bool {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).closed.is_none()
    }
}

/// Removes a request's slot when its caller stops waiting (timeout, drop).
struct Slot<'a> {
    pending: &'a Mutex<Pending>,
    id: u64,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).waiting.remove(&self.id);
    }
}

/// Reads a client stream's replies and hands each to its waiter; when the
/// stream ends, every waiter gets the reason.
async fn read_replies(mut recv: quinn::RecvStream, pending: Arc<Mutex<Pending>>) {
    let reason = loop {
        match read_frame(&mut recv).await {
            Ok(Some(f))
                if matches!(f.kind, FrameType::NodeReply | FrameType::Error | FrameType::Pong) =>
            {
                if f.kind == FrameType::Error && f.request_id == 0 {
                    break format!(
                        "peer closed the stream: {}",
                        Frame::error_message(&f.payload).unwrap_or_default()
                    );
                }
                let tx =
                    pending.lock().unwrap_or_else(|p| p.into_inner()).waiting.remove(&f.request_id);
                if let Some(tx) = tx {
                    let _ = tx.send(Ok(f));
                }
            }
            Ok(Some(f)) => break format!("unexpected {:?} frame from the server", f.kind),
            Ok(None) => break "stream closed by the peer".to_owned(),
            Err(e) => break e.to_string(),
        }
    };
    let mut p = pending.lock().unwrap_or_else(|p| p.into_inner());
    for (_, tx) in p.waiting.drain() {
        let _ = tx.send(Err(Error::Connection(reason.clone())));
    }
    p.closed = Some(reason);
}

impl Peer {
    /// The peer's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends `request` and waits for its reply, up to the op's timeout.
    pub async fn call(&self, request: &Request) -> Result<Reply> {
        self.call_with_timeout(request, request.timeout()).await
    }

    /// Sends `request` and waits for its reply, up to `timeout`.
    pub async fn call_with_timeout(&self, request: &Request, timeout: Duration) -> Result<Reply> {
        let start = Instant::now();
        let op = request.op();
        // A call that times out here, or that its caller abandons (openraft
        // drops a heartbeat after its own short timeout), starts a liveness
        // probe of the connection when the guard drops unfinished.
        let mut unfinished = ProbeOnDrop(Some(self.me.clone()));
        let result = self.call_inner(request, op, timeout).await;
        if !matches!(result, Err(Error::Timeout { .. })) {
            unfinished.0 = None;
        }
        let kind = match &result {
            Ok(r) => status_kind(r.status),
            Err(e) => Some(e.kind()),
        };
        self.metrics.observe(op.name(), "client", start.elapsed().as_secs_f64(), kind);
        result
    }

    async fn call_inner(&self, request: &Request, op: Op, timeout: Duration) -> Result<Reply> {
        let payload = request.encode_chunks();
        let len = payload.iter().map(Bytes::len).sum::<usize>();
        if len > FRAME_MAX_PAYLOAD {
            return Err(Error::FrameTooLarge { len: len as u64, max: FRAME_MAX_PAYLOAD });
        }
        let f = match tokio::time::timeout(
            timeout,
            self.roundtrip(request.lane(), FrameType::NodeRequest, payload),
        )
        .await
        {
            Ok(f) => f?,
            Err(_) => return Err(Error::Timeout { op: op.name(), after: timeout }),
        };
        match f.kind {
            FrameType::NodeReply => Reply::decode(&f.payload),
            FrameType::Error => Err(Error::Remote(Frame::error_message(&f.payload)?)),
            other => Err(Error::Protocol(format!("{other:?} frame in reply to a request"))),
        }
    }

    /// A request timed out: is the connection still alive? A Ping must
    /// come back within [`LIVENESS_PROBE_TIMEOUT`], else the connection is
    /// closed so the next request dials again (a peer killed and restarted
    /// on the same address never resets the old connection: its new
    /// endpoint does not know it, and it would look healthy until the idle
    /// timeout). A slow handler on a live peer answers the Ping and keeps
    /// the connection and its other requests.
    ///
    /// The same probe runs when the peer opens a new connection to this
    /// node ([`ProbeTrigger::PeerConnected`]): a restarted peer does that
    /// at once (the control plane pings every peer when it starts), so the
    /// connection to its old process is replaced before a call needs it.
    fn probe_in_background(self: Arc<Self>, trigger: ProbeTrigger) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { self.probe_once(trigger).await });
        }
    }

    async fn probe_once(&self, trigger: ProbeTrigger) {
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        self.probe(trigger).await;
        self.probing.store(false, Ordering::Release);
    }

    async fn probe(&self, trigger: ProbeTrigger) {
        let cached = self.conn.lock().await.clone();
        let Some(conn) = cached.filter(|c| c.close_reason().is_none()) else { return };
        if matches!(tokio::time::timeout(LIVENESS_PROBE_TIMEOUT, self.ping()).await, Ok(Ok(_))) {
            self.metrics.probed(trigger.as_str(), "alive");
        } else {
            self.metrics.probed(trigger.as_str(), "closed");
            tracing::info!(peer = %self.addr, trigger = trigger.as_str(), "peer did not answer a ping: closing the connection to dial again");
            conn.close(0u32.into(), b"peer unresponsive");
        }
    }

    /// Round-trips a Ping on the control lane; the time it took.
    pub async fn ping(&self) -> Result<Duration> {
        let start = Instant::now();
        let nonce = Bytes::copy_from_slice(&self.next_id.load(Ordering::Relaxed).to_be_bytes());
        let f = tokio::time::timeout(
            REPLY_TIMEOUT,
            self.roundtrip(Lane::Control, FrameType::Ping, vec![nonce.clone()]),
        )
        .await
        .map_err(|_| Error::Timeout { op: "ping", after: REPLY_TIMEOUT })??;
        if f.kind != FrameType::Pong || f.payload != nonce {
            return Err(Error::Protocol(format!("{:?} frame in reply to a ping", f.kind)));
        }
        Ok(start.elapsed())
    }

    async fn roundtrip(&self, lane: Lane, kind: FrameType, payload: Vec<Bytes>) -> Result<Frame> {
        let stream = self.stream(lane).await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = stream.pending.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(reason) = &p.closed {
                return Err(Error::Connection(reason.clone()));
            }
            p.waiting.insert(id, tx);
        }
        let _slot = Slot { pending: &stream.pending, id };
        {
            let mut send = stream.send.lock().await;
            if let Err(e) = write_frame_chunks(&mut send, kind, id, payload).await {
                let mut p = stream.pending.lock().unwrap_or_else(|p| p.into_inner());
                p.closed.get_or_insert_with(|| e.to_string());
                return Err(e);
            }
        }
        rx.await.map_err(|_| Error::Connection("stream ended".into()))?
    }

    /// A live stream of the lane: a new one while the pool is not full,
    /// else the next in turn (a dead one is replaced).
    async fn stream(&self, lane: Lane) -> Result<Arc<ClientStream>> {
        let mut pool = self.lanes[lane as usize].lock().await;
        pool.streams.retain(|s| s.alive());
        if pool.streams.len() < lane.streams() {
            let s = self.open_stream().await?;
            pool.streams.push(s.clone());
            return Ok(s);
        }
        pool.next = (pool.next + 1) % pool.streams.len();
        Ok(pool.streams[pool.next].clone())
    }

    async fn open_stream(&self) -> Result<Arc<ClientStream>> {
        let conn = self.connection().await?;
        let (mut send, recv) = conn.open_bi().await.map_err(conn_err)?;
        if let Some(secret) = &self.secret {
            write_frame(&mut send, &Frame::new(FrameType::Auth, 0, secret.tag().to_vec())).await?;
        }
        let pending = Arc::new(Mutex::new(Pending::default()));
        tokio::spawn(read_replies(recv, pending.clone()));
        Ok(Arc::new(ClientStream { send: tokio::sync::Mutex::new(send), pending }))
    }

    async fn connection(&self) -> Result<quinn::Connection> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref().filter(|c| c.close_reason().is_none()) {
            return Ok(c.clone());
        }
        let dial = |reason: String| Error::Dial { addr: self.addr, reason };
        let connecting = self
            .endpoint
            .connect_with(self.client.clone(), self.addr, &self.server_name)
            .map_err(|e| dial(e.to_string()))?;
        let c = tokio::time::timeout(DIAL_TIMEOUT, connecting)
            .await
            .map_err(|_| dial(format!("no handshake within {DIAL_TIMEOUT:?}")))?
            .map_err(|e| dial(e.to_string()))?;
        *conn = Some(c.clone());
        Ok(c)
    }
}

/// The serving half.
struct Server<H> {
    auth: ClusterAuth,
    metrics: RpcMetrics,
    handler: Arc<H>,
    warn: WarnLimiter,
    /// The dialling side's peers, probed when one connects anew.
    peers: PeerTable,
}

impl<H: Handler> Server<H> {
    async fn accept(self: Arc<Self>, endpoint: quinn::Endpoint) {
        while let Some(incoming) = endpoint.accept().await {
            let server = self.clone();
            tokio::spawn(async move {
                let remote = incoming.remote_address();
                match incoming.await {
                    Ok(conn) => {
                        server.probe_peers_at(remote);
                        server.serve_connection(conn).await
                    }
                    Err(e) => {
                        tracing::debug!(%remote, error = %e, "cluster connection handshake failed")
                    }
                }
            });
        }
    }

    /// A node at `remote` connected anew: probe this node's own
    /// connections to that address (its old process may be gone).
    fn probe_peers_at(&self, remote: SocketAddr) {
        let at: Vec<Arc<Peer>> = self
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|((addr, _), _)| *addr == remote)
            .map(|(_, p)| p.clone())
            .collect();
        for peer in at {
            peer.probe_in_background(ProbeTrigger::PeerConnected);
        }
    }

    async fn serve_connection(self: Arc<Self>, conn: quinn::Connection) {
        let remote = conn.remote_address();
        loop {
            match conn.accept_bi().await {
                Ok((send, recv)) => {
                    tokio::spawn(self.clone().serve_stream(remote, send, recv));
                }
                Err(e) => {
                    tracing::debug!(%remote, error = %e, "cluster connection ended");
                    return;
                }
            }
        }
    }

    /// Refuses a stream: nothing is answered, nothing more is read.
    fn refuse(
        &self,
        remote: SocketAddr,
        reason: &str,
        mut send: quinn::SendStream,
        mut recv: quinn::RecvStream,
    ) {
        self.metrics.rejected(reason);
        if let Some(suppressed) = self.warn.allow() {
            tracing::warn!(%remote, reason, suppressed, "cluster stream rejected: invalid auth");
        }
        let _ = recv.stop(0u32.into());
        let _ = send.reset(0u32.into());
    }

    async fn serve_stream(
        self: Arc<Self>,
        remote: SocketAddr,
        send: quinn::SendStream,
        mut recv: quinn::RecvStream,
    ) {
        if let Some(secret) = &self.auth.secret {
            let reason = match tokio::time::timeout(AUTH_TIMEOUT, read_frame(&mut recv)).await {
                Ok(Ok(Some(f))) if f.kind == FrameType::Auth && secret.verify(&f.payload) => None,
                Ok(_) => Some("auth"),
                Err(_) => Some("auth_timeout"),
            };
            if let Some(reason) = reason {
                return self.refuse(remote, reason, send, recv);
            }
        }
        let send = Arc::new(tokio::sync::Mutex::new(send));
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_STREAM));
        let mut first = true;
        let fault = loop {
            let Ok(permit) = in_flight.clone().acquire_owned().await else { break None };
            let frame = match read_frame(&mut recv).await {
                Ok(Some(f)) => f,
                Ok(None) => break None,
                Err(e) => break Some(e),
            };
            match frame.kind {
                FrameType::NodeRequest => {
                    let (server, send) = (self.clone(), send.clone());
                    tokio::spawn(async move {
                        server.answer(frame, &send).await;
                        drop(permit);
                    });
                }
                FrameType::Ping => {
                    let pong = Frame::new(FrameType::Pong, frame.request_id, frame.payload);
                    if write_frame(&mut *send.lock().await, &pong).await.is_err() {
                        break None;
                    }
                }
                // A client with a secret talking to a server without one.
                FrameType::Auth if first && self.auth.secret.is_none() => {}
                other => {
                    break Some(Error::Protocol(format!(
                        "unexpected {other:?} frame from a client"
                    )));
                }
            }
            first = false;
        };
        if let Some(e) = fault {
            self.metrics.rejected(e.kind());
            tracing::debug!(%remote, error = %e, "cluster stream closed on a bad frame");
            let _ = recv.stop(0u32.into());
            let _ = write_frame(&mut *send.lock().await, &Frame::error(0, &e.to_string())).await;
        }
        // Let the requests in flight answer before the stream is finished.
        let _ = in_flight.acquire_many(MAX_IN_FLIGHT_PER_STREAM as u32).await;
        let _ = send.lock().await.finish();
    }

    async fn answer(&self, frame: Frame, send: &tokio::sync::Mutex<quinn::SendStream>) {
        let start = Instant::now();
        let op = frame.payload.first().and_then(|c| Op::from_u8(*c)).map_or("unknown", Op::name);
        let reply = match Request::decode(&frame.payload) {
            Ok(request) => self.handler.handle(request).await,
            Err(e) => Reply::for_decode_error(&e),
        };
        let chunks = reply.encode_chunks();
        let len = chunks.iter().map(Bytes::len).sum::<usize>();
        let (written, too_large) = if len > FRAME_MAX_PAYLOAD {
            tracing::error!(op, bytes = len, "node rpc reply over the frame limit");
            let out = Frame::error(
                frame.request_id,
                &format!("reply of {len} bytes exceeds the frame limit"),
            );
            (write_frame(&mut *send.lock().await, &out).await, true)
        } else {
            let mut send = send.lock().await;
            (
                write_frame_chunks(&mut send, FrameType::NodeReply, frame.request_id, chunks).await,
                false,
            )
        };
        let kind = match (&written, too_large) {
            (Err(e), _) => Some(e.kind()),
            (Ok(()), true) => Some("too_large"),
            (Ok(()), false) => status_kind(reply.status),
        };
        self.metrics.observe(op, "server", start.elapsed().as_secs_f64(), kind);
    }
}

#[cfg(test)]
#[path = "transport_tests.rs"]
mod tests;
