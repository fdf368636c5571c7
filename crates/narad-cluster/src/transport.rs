//! The QUIC endpoint of node RPC (SPEC §7.4): one connection per peer,
//! pooled streams per lane, requests multiplexed over a stream by request
//! id; a server side that answers NodeRequests through a [`Handler`].
//!
//! Connection protocol: every connection authenticates once, before
//! anything else, with the handshake of `handshake.rs` on its first stream
//! (the server proves first; the proofs are bound to the TLS session). Until
//! then the server allows that one stream and a
//! [`PRE_AUTH_RECEIVE_WINDOW`]-byte receive window, and the client allows
//! the server no stream at all; a server admits connections not yet
//! authenticated through its [`Gate`] (caps per source and overall, a
//! failure budget per source) and closes one that has not authenticated
//! within [`AUTH_TIMEOUT`]. A failed proof closes the connection.
//!
//! Stream protocol, once authenticated: the client sends NodeRequest and
//! Ping frames with fresh ids; the server answers each with NodeReply (or
//! Error) and Pong under the same id, in whatever order the handler
//! finishes. A malformed or oversized frame ends the stream with one Error
//! frame (id 0) naming the fault.
//!
//! Cancellation (issue 36): a request ids are unique per connection, so a
//! client whose caller went away sends CancelRequest (op 38) naming the id,
//! on any stream of the same connection; the server stops that request if
//! it is still running and [`Request::cancellable`] (a consume: its long
//! poll ends, leasing nothing) and answers it 499. A connection that ends
//! stops every cancellable request still running on it. A requester that
//! was killed cannot cancel, and its connection lives on until the idle
//! timeout; but it watches its calls (a Ping every second on the same
//! connection), so a cancellable request during which the connection has
//! pinged and then gone silent for [`REQUESTER_SILENT_AFTER`] is stopped
//! the same way (a requester that never pings, an older release, is not
//! judged by it). The transport serves op 38 itself; a handler never sees
//! it.
//!
//! Suspicion (`suspect.rs`): a call that fails in transport makes its peer
//! suspect until a frame comes back from it; the transport pings suspect
//! peers.

use crate::auth::{ClusterAuth, WarnLimiter};
use crate::error::{Error, Result};
use crate::frame::{Frame, FrameType, read_frame, write_frame, write_frame_chunks};
use crate::gate::{Admission, Gate};
use crate::handshake::{self, EXPORTER_LABEL, EXPORTER_LEN, HandshakeError, PeerIdentity};
use crate::limits::{
    AUTH_TIMEOUT, CANCEL_TIMEOUT, CLIENT_AUTH_TIMEOUT, DIAL_TIMEOUT, FRAME_MAX_PAYLOAD,
    IDLE_TIMEOUT, KEEP_ALIVE_INTERVAL, LIVENESS_PROBE_TIMEOUT, MAX_IN_FLIGHT_PER_STREAM,
    MAX_STREAMS_PER_CONNECTION, PRE_AUTH_RECEIVE_WINDOW, REPLY_TIMEOUT, REQUESTER_SILENT_AFTER,
    WATCH_PING_EVERY,
};
use crate::metrics::PeerAddrLabels;
use crate::metrics::{RpcMetrics, status_kind};
use crate::rpc::{Lane, Op, Reply, Request};
use crate::suspect::{SUSPECT_PING_EVERY, SuspectState, Suspicion};
use crate::tls;
use bytes::Bytes;
use quinn::VarInt;
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
    /// Answers one decoded request from the authenticated peer `from`.
    /// Requests that fail to decode never reach the handler (the transport
    /// answers them with 400).
    fn handle(
        &self,
        from: Arc<PeerIdentity>,
        request: Request,
    ) -> impl Future<Output = Reply> + Send;
}

/// The application close codes of a node-RPC connection.
pub mod close_code {
    /// The node is shutting down.
    pub const SHUTDOWN: u32 = 0;
    /// The peer's connection did not authenticate (no hint why).
    pub const AUTH_FAILED: u32 = 0x4e01;
    /// The peer negotiated a protocol version this node no longer serves.
    pub const VERSION: u32 = 0x4e02;
    /// The peer did not authenticate within the deadline.
    pub const AUTH_TIMEOUT: u32 = 0x4e03;
}

/// The UDP socket's receive and send buffers: a remote commit of up to
/// 8 MiB arrives as a burst the default buffer (208 KiB) cannot hold while
/// the node's runtime is busy, and every datagram dropped there is a
/// retransmission and a congestion-window cut (100 round trips of 4 MiB on
/// loopback: 1,448-2,470 datagrams dropped with the default, none with
/// 4 MiB). The kernel caps the request at `net.core.rmem_max` /
/// `wmem_max` (docs/CLUSTER.md).
const UDP_SOCKET_BUFFER_BYTES: usize = 4 << 20;

/// The transport parameters a connection starts with, before it has
/// authenticated: a [`PRE_AUTH_RECEIVE_WINDOW`]-byte connection receive
/// window, no datagrams, no unidirectional streams, and `bidi` streams the
/// peer may open (the server: 1, the handshake's; the client: none). After
/// the handshake [`open_up`] raises the window (and, on the server, the
/// stream limit). Only the dialling side sends keep-alives: a server never
/// keeps a connection open on its own.
fn transport_config(bidi: u32, keep_alive: bool) -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(Some(IDLE_TIMEOUT.try_into().expect("30 s fits a QUIC idle timeout")));
    t.keep_alive_interval(keep_alive.then_some(KEEP_ALIVE_INTERVAL));
    t.max_concurrent_bidi_streams(bidi.into());
    t.max_concurrent_uni_streams(0u32.into());
    t.receive_window(PRE_AUTH_RECEIVE_WINDOW.into());
    t.datagram_receive_buffer_size(None);
    Arc::new(t)
}

/// An authenticated connection's limits: the receive window QUIC's default
/// gives (unbounded at the connection level; each stream keeps its own
/// window) and, on the server, [`MAX_STREAMS_PER_CONNECTION`] streams.
fn open_up(conn: &quinn::Connection, server: bool) {
    conn.set_receive_window(VarInt::MAX);
    if server {
        conn.set_max_concurrent_bi_streams(MAX_STREAMS_PER_CONNECTION.into());
    }
}

fn client_config(auth: &ClusterAuth) -> Result<quinn::ClientConfig> {
    let crypto = tls::client_config(auth.tls.as_ref())?;
    let quic = QuicClientConfig::try_from(crypto)
        .map_err(|e| Error::Config(format!("quic client: {e}")))?;
    let mut c = quinn::ClientConfig::new(Arc::new(quic));
    c.transport_config(transport_config(0, true));
    Ok(c)
}

fn server_config(auth: &ClusterAuth) -> Result<quinn::ServerConfig> {
    let crypto = tls::server_config(auth.tls.as_ref())?;
    let quic = QuicServerConfig::try_from(crypto)
        .map_err(|e| Error::Config(format!("quic server: {e}")))?;
    let mut s = quinn::ServerConfig::with_crypto(Arc::new(quic));
    s.transport_config(transport_config(1, false));
    Ok(s)
}

/// The connection's TLS exporter value (the handshake's session binding).
fn exporter(conn: &quinn::Connection) -> std::result::Result<[u8; EXPORTER_LEN], HandshakeError> {
    let mut out = [0u8; EXPORTER_LEN];
    conn.export_keying_material(&mut out, EXPORTER_LABEL, b"").map_err(|_| {
        HandshakeError::Exporter("the TLS session exports no keying material".into())
    })?;
    Ok(out)
}

/// The ALPN the connection negotiated.
fn negotiated_alpn(conn: &quinn::Connection) -> Option<Vec<u8>> {
    conn.handshake_data()?.downcast::<quinn::crypto::rustls::HandshakeData>().ok()?.protocol
}

/// Why a dial failed, for the operator: names a peer that speaks another
/// protocol version, or refused the authentication.
fn dial_failure(e: &quinn::ConnectionError) -> String {
    match e {
        // TLS alert 120, no_application_protocol: the peer offered none of ours.
        quinn::ConnectionError::ConnectionClosed(c)
            if c.error_code == quinn::TransportErrorCode::crypto(120) =>
        {
            format!(
                "the peer does not speak {} (it may run an older narad: every node needs the \
                 same version): {e}",
                String::from_utf8_lossy(tls::ALPN)
            )
        }
        quinn::ConnectionError::ApplicationClosed(c)
            if c.error_code == VarInt::from_u32(close_code::AUTH_FAILED) =>
        {
            "the peer refused this node's cluster authentication (is NARAD_CLUSTER_SECRET the \
             same on both nodes?)"
                .to_owned()
        }
        quinn::ConnectionError::ApplicationClosed(c)
            if c.error_code == VarInt::from_u32(close_code::VERSION) =>
        {
            format!("the peer refused this node's protocol: {}", String::from_utf8_lossy(&c.reason))
        }
        other => other.to_string(),
    }
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
    /// The keys this node proves with and accepts (current secret first).
    keys: Arc<Vec<[u8; 32]>>,
    /// The id this node presents.
    node_id: Arc<str>,
    metrics: RpcMetrics,
    peers: PeerTable,
    /// Rate-limits the warnings about peers that fail to authenticate.
    warn: Arc<WarnLimiter>,
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
            keys: handshake::keys(&auth),
            node_id: auth.presented_id().to_owned(),
            metrics: metrics.clone(),
            handler,
            warn: WarnLimiter::default(),
            peers: peers.clone(),
            gate: Arc::new(Gate::default()),
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
        let keys = Arc::new(handshake::keys(&auth));
        Ok(Transport {
            endpoint,
            client,
            keys,
            node_id: auth.presented_id().into(),
            metrics,
            peers,
            warn: Arc::new(WarnLimiter::default()),
        })
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
                    keys: self.keys.clone(),
                    node_id: self.node_id.clone(),
                    identity: Mutex::new(None),
                    warn: self.warn.clone(),
                    metrics: self.metrics.clone(),
                    conn: tokio::sync::Mutex::new(None),
                    dial_failed: Mutex::new(None),
                    suspect: SuspectState::default(),
                    lanes: Lane::ALL.map(|_| tokio::sync::Mutex::new(Pool::default())),
                    next_id: AtomicU64::new(1),
                })
            })
            .clone()
    }

    /// Closes every connection and stops serving.
    pub async fn close(&self) {
        self.endpoint.close(close_code::SHUTDOWN.into(), b"shutdown");
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
    keys: Arc<Vec<[u8; 32]>>,
    node_id: Arc<str>,
    /// The node id the peer proved in its connection's handshake.
    identity: Mutex<Option<String>>,
    warn: Arc<WarnLimiter>,
    metrics: RpcMetrics,
    /// An authenticated connection, once dialled.
    conn: tokio::sync::Mutex<Option<quinn::Connection>>,
    /// When the last dial failed, and why: a call that waited for the
    /// connection while that dial ran fails with it rather than dial
    /// again (calls queued on a dead peer would otherwise spend a dial
    /// timeout each, one after another).
    dial_failed: Mutex<Option<(Instant, String)>>,
    /// Whether a call to it failed in transport since it last answered.
    suspect: SuspectState,
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
        self.finish_call(op, start, &result);
        result
    }

    /// Counts a finished call and updates the suspicion: an answer clears
    /// it, a transport failure sets it.
    fn finish_call(&self, op: Op, start: Instant, result: &Result<Reply>) {
        let kind = match result {
            Ok(r) => status_kind(r.status),
            Err(e) => Some(e.kind()),
        };
        self.metrics.observe(op.name(), "client", start.elapsed().as_secs_f64(), kind);
        match result {
            Ok(_) => self.answered(),
            Err(e) if e.means_unreachable() => self.suspect_now(&e.to_string()),
            Err(_) => {}
        }
    }

    /// Sends `request` and waits up to `timeout` for its reply, pinging the
    /// peer every [`WATCH_PING_EVERY`] meanwhile: a peer that does not
    /// answer a ping within [`LIVENESS_PROBE_TIMEOUT`] (killed, its machine
    /// gone, cut off) fails the call at once and becomes suspect. A slow but
    /// live peer answers the pings (they travel on their own stream) and
    /// the call goes on.
    pub async fn call_watched(&self, request: &Request, timeout: Duration) -> Result<Reply> {
        self.call_cancellable(request, timeout, std::future::pending()).await
    }

    /// [`Peer::call_watched`]; when `cancelled` resolves first, the peer is
    /// asked to stop the request (CancelRequest, op 38) and the call goes
    /// on waiting for its reply: a request stopped in time answers 499, one
    /// that had finished answers what it did (the caller gives back what
    /// that reply holds).
    pub async fn call_cancellable(
        &self,
        request: &Request,
        timeout: Duration,
        cancelled: impl Future<Output = ()>,
    ) -> Result<Reply> {
        let start = Instant::now();
        let op = request.op();
        let mut unfinished = ProbeOnDrop(Some(self.me.clone()));
        let result = self.watched_inner(request, op, timeout, cancelled).await;
        if !matches!(result, Err(Error::Timeout { .. })) {
            unfinished.0 = None;
        }
        self.finish_call(op, start, &result);
        result
    }

    async fn watched_inner(
        &self,
        request: &Request,
        op: Op,
        timeout: Duration,
        cancelled: impl Future<Output = ()>,
    ) -> Result<Reply> {
        let payload = request.encode_chunks();
        let len = payload.iter().map(Bytes::len).sum::<usize>();
        if len > FRAME_MAX_PAYLOAD {
            return Err(Error::FrameTooLarge { len: len as u64, max: FRAME_MAX_PAYLOAD });
        }
        let timed_out = || Error::Timeout { op: op.name(), after: timeout };
        let deadline = tokio::time::Instant::now() + timeout;
        let sent = tokio::time::timeout_at(
            deadline,
            self.send(request.lane(), FrameType::NodeRequest, payload),
        )
        .await;
        let (stream, id, rx) = sent.map_err(|_| timed_out())??;
        let _slot = Slot { pending: &stream.pending, id };
        tokio::pin!(rx);
        tokio::pin!(cancelled);
        let first = tokio::time::Instant::now() + WATCH_PING_EVERY;
        let mut watch = tokio::time::interval_at(first, WATCH_PING_EVERY);
        let mut cancel_sent = false;
        let f = loop {
            tokio::select! {
                f = &mut rx => break f.map_err(|_| Error::Connection("stream ended".into()))??,
                _ = tokio::time::sleep_until(deadline) => return Err(timed_out()),
                _ = &mut cancelled, if !cancel_sent => {
                    cancel_sent = true;
                    self.send_cancel(id);
                }
                _ = watch.tick() => {
                    let pong = tokio::time::timeout(LIVENESS_PROBE_TIMEOUT, self.ping()).await;
                    if !matches!(pong, Ok(Ok(_))) {
                        return Err(Error::Connection(format!(
                            "no pong within {LIVENESS_PROBE_TIMEOUT:?} while {} was in flight",
                            op.name()
                        )));
                    }
                }
            }
        };
        match f.kind {
            FrameType::NodeReply => Reply::decode(&f.payload),
            FrameType::Error => Err(Error::Remote(Frame::error_message(&f.payload)?)),
            other => Err(Error::Protocol(format!("{other:?} frame in reply to a request"))),
        }
    }

    /// Asks the peer, in the background, to stop request `id`.
    fn send_cancel(&self, id: u64) {
        let (Some(me), Ok(rt)) = (self.me.upgrade(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        rt.spawn(async move {
            let _ = me.call_with_timeout(&Request::CancelRequest(id), CANCEL_TIMEOUT).await;
        });
    }

    /// Closes the connection of a suspect peer that did not answer a ping
    /// (unless a dial holds it: then it is being replaced already), so the
    /// next ping dials: a peer restarted on the same address cannot reset
    /// the old connection.
    fn close_unresponsive(&self) {
        if let Ok(conn) = self.conn.try_lock()
            && let Some(c) = conn.as_ref()
        {
            tracing::debug!(peer = %self.addr, "suspect peer did not answer a ping: closing the connection to dial again");
            c.close(0u32.into(), b"peer unresponsive");
        }
    }

    /// Why this peer is suspect, if it is: a call to it failed in transport
    /// and nothing came back from it since (`suspect.rs`). Asking keeps the
    /// suspicion (and its pings) alive.
    pub fn suspicion(&self) -> Option<Suspicion> {
        self.suspect.ask(Instant::now())
    }

    /// A call failed in transport: the peer is suspect (pinged until it
    /// answers).
    fn suspect_now(&self, why: &str) {
        if !self.suspect.mark(why, Instant::now()) {
            return;
        }
        self.metrics.suspected.get_or_create(&PeerAddrLabels { peer: self.addr.to_string() }).inc();
        self.metrics.suspect_peers.inc();
        tracing::info!(peer = %self.addr, why, "peer suspect: calls to it failed; forwarded requests answer 503 until it answers a ping");
        if let (Some(me), Ok(rt)) = (self.me.upgrade(), tokio::runtime::Handle::try_current()) {
            rt.spawn(me.ping_while_suspect());
        }
    }

    /// Something came back from the peer: it is not suspect.
    fn answered(&self) {
        if self.suspect.clear() {
            self.metrics.suspect_peers.dec();
            tracing::info!(peer = %self.addr, "suspect peer answers again");
        }
    }

    /// Pings a suspect peer every [`SUSPECT_PING_EVERY`] until it answers
    /// (the pong clears it) or nobody asked about it for a while.
    async fn ping_while_suspect(self: Arc<Self>) {
        loop {
            tokio::time::sleep(SUSPECT_PING_EVERY).await;
            if !self.suspect.is_suspect() {
                return;
            }
            if self.suspect.forget_stale(Instant::now()) {
                self.metrics.suspect_peers.dec();
                return;
            }
            let budget = DIAL_TIMEOUT + CLIENT_AUTH_TIMEOUT + LIVENESS_PROBE_TIMEOUT;
            if matches!(tokio::time::timeout(budget, self.ping()).await, Ok(Ok(_))) {
                return;
            }
            self.close_unresponsive();
        }
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
            self.suspect_now(&format!("no pong within {LIVENESS_PROBE_TIMEOUT:?}"));
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
        self.answered();
        Ok(start.elapsed())
    }

    async fn roundtrip(&self, lane: Lane, kind: FrameType, payload: Vec<Bytes>) -> Result<Frame> {
        let (stream, id, rx) = self.send(lane, kind, payload).await?;
        let _slot = Slot { pending: &stream.pending, id };
        rx.await.map_err(|_| Error::Connection("stream ended".into()))?
    }

    /// Writes a frame with a fresh id on a stream of `lane`: the stream,
    /// the id and where its reply will come (the caller holds a [`Slot`]
    /// while it waits).
    async fn send(
        &self,
        lane: Lane,
        kind: FrameType,
        payload: Vec<Bytes>,
    ) -> Result<(Arc<ClientStream>, u64, oneshot::Receiver<Result<Frame>>)> {
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
        // Removes the waiter if this future is dropped mid-write.
        let slot = Slot { pending: &stream.pending, id };
        {
            let mut send = stream.send.lock().await;
            if let Err(e) = write_frame_chunks(&mut send, kind, id, payload).await {
                let mut p = stream.pending.lock().unwrap_or_else(|p| p.into_inner());
                p.closed.get_or_insert_with(|| e.to_string());
                return Err(e);
            }
        }
        std::mem::forget(slot);
        Ok((stream, id, rx))
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
        let (send, recv) = conn.open_bi().await.map_err(conn_err)?;
        let pending = Arc::new(Mutex::new(Pending::default()));
        tokio::spawn(read_replies(recv, pending.clone()));
        Ok(Arc::new(ClientStream { send: tokio::sync::Mutex::new(send), pending }))
    }

    async fn connection(&self) -> Result<quinn::Connection> {
        let asked = Instant::now();
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref().filter(|c| c.close_reason().is_none()) {
            return Ok(c.clone());
        }
        let failed = self.dial_failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some((at, reason)) = failed
            && at >= asked
        {
            return Err(Error::Dial { addr: self.addr, reason });
        }
        let dial = |reason: String| {
            *self.dial_failed.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((Instant::now(), reason.clone()));
            Error::Dial { addr: self.addr, reason }
        };
        let connecting = self
            .endpoint
            .connect_with(self.client.clone(), self.addr, &self.server_name)
            .map_err(|e| dial(e.to_string()))?;
        let c = tokio::time::timeout(DIAL_TIMEOUT, connecting)
            .await
            .map_err(|_| dial(format!("no handshake within {DIAL_TIMEOUT:?}")))?
            .map_err(|e| dial(dial_failure(&e)))?;
        let peer_id = match tokio::time::timeout(CLIENT_AUTH_TIMEOUT, self.authenticate(&c)).await {
            Ok(Ok(id)) => id,
            failed => {
                let e = match failed {
                    Ok(Err(e)) => e,
                    _ => HandshakeError::Timeout(CLIENT_AUTH_TIMEOUT),
                };
                // A peer that closed the connection on our proof says why.
                let why = match c.close_reason() {
                    Some(closed) => dial_failure(&closed),
                    None => e.to_string(),
                };
                c.close(close_code::AUTH_FAILED.into(), b"authentication failed");
                self.metrics.connection_rejected("client", e.reason());
                if e.is_failed_proof()
                    && let Some(suppressed) = self.warn.allow()
                {
                    tracing::warn!(
                        peer = %self.addr, error = %why, suppressed,
                        "the node at this cluster address did not prove the cluster secret: \
                         nothing was sent to it (an impostor, or a node with another secret)"
                    );
                }
                return Err(dial(format!("authentication: {why}")));
            }
        };
        open_up(&c, false);
        *self.identity.lock().unwrap_or_else(|p| p.into_inner()) = Some(peer_id);
        *conn = Some(c.clone());
        Ok(c)
    }

    /// The client's side of the handshake on a new connection's first
    /// stream: the server's node id.
    async fn authenticate(
        &self,
        conn: &quinn::Connection,
    ) -> std::result::Result<String, HandshakeError> {
        let binding = exporter(conn)?;
        let (mut send, mut recv) = conn
            .open_bi()
            .await
            .map_err(|e| HandshakeError::Io(std::io::Error::other(dial_failure(&e))))?;
        let id =
            handshake::client(&mut send, &mut recv, binding, &self.keys, &self.node_id).await?;
        let _ = send.finish();
        Ok(id)
    }

    /// The node id this peer proved, once connected.
    pub fn node_id(&self) -> Option<String> {
        self.identity.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The serving half.
struct Server<H> {
    /// The keys this node proves with and accepts.
    keys: Vec<[u8; 32]>,
    /// The id this node presents.
    node_id: String,
    metrics: RpcMetrics,
    handler: Arc<H>,
    warn: WarnLimiter,
    /// The dialling side's peers, probed when one connects anew.
    peers: PeerTable,
    /// Admission of connections not yet authenticated.
    gate: Arc<Gate>,
}

impl<H: Handler> Server<H> {
    async fn accept(self: Arc<Self>, endpoint: quinn::Endpoint) {
        while let Some(incoming) = endpoint.accept().await {
            let remote = incoming.remote_address();
            let ticket = match self.gate.admit(remote, incoming.remote_address_validated()) {
                Admission::Admit(ticket) => ticket,
                Admission::Retry => {
                    if let Err(e) = incoming.retry() {
                        e.into_incoming().refuse();
                    }
                    continue;
                }
                Admission::Refuse(reason) => {
                    self.reject(remote, "server", reason, &reason);
                    incoming.refuse();
                    continue;
                }
            };
            self.metrics.set_unauthenticated(self.gate.unauthenticated());
            let server = self.clone();
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + AUTH_TIMEOUT;
                let served = match server.authenticate(incoming, deadline).await {
                    Ok((conn, identity)) => {
                        ticket.succeeded();
                        Some((conn, identity))
                    }
                    Err((conn, e)) => {
                        ticket.failed();
                        if let Some(conn) = conn {
                            conn.close(e.close_code().into(), e.close_reason().as_bytes());
                        }
                        server.reject(remote, "server", e.reason(), &e);
                        None
                    }
                };
                server.metrics.set_unauthenticated(server.gate.unauthenticated());
                if let Some((conn, identity)) = served {
                    open_up(&conn, true);
                    server.probe_peers_at(remote);
                    tracing::debug!(%remote, peer = %identity.node_id, "cluster peer authenticated");
                    server.serve_connection(conn, Arc::new(identity)).await;
                }
            });
        }
    }

    /// Counts and logs a connection that was refused or did not
    /// authenticate: at WARN (rate-limited) what an operator should look
    /// at (a wrong or missing proof, bytes that are not the handshake, an
    /// old version, the deadline, caps and back-off), at DEBUG a QUIC
    /// handshake or connection that ended on the peer's side (a node
    /// restarting or shutting down mid-dial).
    fn reject(&self, remote: SocketAddr, side: &str, reason: &str, why: &dyn std::fmt::Display) {
        self.metrics.connection_rejected(side, reason);
        if matches!(reason, "handshake" | "connection") {
            tracing::debug!(%remote, reason, error = %why, "cluster connection ended before it authenticated");
        } else if let Some(suppressed) = self.warn.allow() {
            tracing::warn!(%remote, reason, error = %why, suppressed, "cluster connection rejected");
        }
    }

    /// The QUIC handshake, the protocol version, and the authentication
    /// exchange of one incoming connection, all by `deadline`.
    async fn authenticate(
        &self,
        incoming: quinn::Incoming,
        deadline: tokio::time::Instant,
    ) -> std::result::Result<(quinn::Connection, PeerIdentity), (Option<quinn::Connection>, Refusal)>
    {
        let remote = incoming.remote_address();
        let connecting =
            incoming.accept().map_err(|e| (None, Refusal::Handshake(e.to_string())))?;
        let conn = match tokio::time::timeout_at(deadline, connecting).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err((None, Refusal::Handshake(e.to_string()))),
            Err(_) => return Err((None, Refusal::Timeout)),
        };
        match tokio::time::timeout_at(deadline, self.exchange(&conn)).await {
            Ok(Ok(node_id)) => Ok((conn, PeerIdentity { node_id, addr: remote })),
            Ok(Err(Refusal::Auth(HandshakeError::Io(_))))
                if matches!(conn.close_reason(), Some(quinn::ConnectionError::ApplicationClosed(ref c))
                    if c.error_code == VarInt::from_u32(close_code::AUTH_FAILED)) =>
            {
                // The dialler closed on this node's proof: it holds another
                // secret (or none that matches), or it is not a node.
                Err((None, Refusal::PeerRefused))
            }
            Ok(Err(e)) => Err((Some(conn), e)),
            Err(_) => Err((Some(conn), Refusal::Timeout)),
        }
    }

    /// The protocol version and the authentication exchange: the client's
    /// node id.
    async fn exchange(&self, conn: &quinn::Connection) -> std::result::Result<String, Refusal> {
        let alpn = negotiated_alpn(conn).unwrap_or_default();
        if alpn != tls::ALPN {
            return Err(Refusal::Version(String::from_utf8_lossy(&alpn).into_owned()));
        }
        let binding = exporter(conn).map_err(Refusal::Auth)?;
        let (mut send, mut recv) =
            conn.accept_bi().await.map_err(|e| Refusal::Handshake(e.to_string()))?;
        let node_id = handshake::server(&mut send, &mut recv, binding, &self.keys, &self.node_id)
            .await
            .map_err(Refusal::Auth)?;
        let _ = send.finish();
        Ok(node_id)
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

    async fn serve_connection(self: Arc<Self>, conn: quinn::Connection, from: Arc<PeerIdentity>) {
        let remote = conn.remote_address();
        let running = Running::default();
        let heard = Arc::new(Heard::new());
        loop {
            match conn.accept_bi().await {
                Ok((send, recv)) => {
                    let conn = ConnState { running: running.clone(), heard: heard.clone() };
                    tokio::spawn(self.clone().serve_stream(from.clone(), conn, send, recv));
                }
                Err(e) => {
                    tracing::debug!(%remote, error = %e, "cluster connection ended");
                    // Nobody is left to read their answers.
                    let stopped: Vec<_> =
                        running.lock().unwrap_or_else(|p| p.into_inner()).drain().collect();
                    for (_, stop) in stopped {
                        if stop.send(()).is_ok() {
                            self.metrics.cancel("disconnected");
                        }
                    }
                    return;
                }
            }
        }
    }

    async fn serve_stream(
        self: Arc<Self>,
        from: Arc<PeerIdentity>,
        conn: ConnState,
        send: quinn::SendStream,
        mut recv: quinn::RecvStream,
    ) {
        let remote = from.addr;
        let send = Arc::new(tokio::sync::Mutex::new(send));
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_STREAM));
        let fault = loop {
            let Ok(permit) = in_flight.clone().acquire_owned().await else { break None };
            let frame = match read_frame(&mut recv).await {
                Ok(Some(f)) => f,
                Ok(None) => break None,
                Err(e) => break Some(e),
            };
            conn.heard.frame(frame.kind == FrameType::Ping);
            match frame.kind {
                FrameType::NodeRequest => {
                    let (server, send, from) = (self.clone(), send.clone(), from.clone());
                    let conn = conn.clone();
                    tokio::spawn(async move {
                        server.answer(from, &conn, frame, &send).await;
                        drop(permit);
                    });
                }
                FrameType::Ping => {
                    let pong = Frame::new(FrameType::Pong, frame.request_id, frame.payload);
                    if write_frame(&mut *send.lock().await, &pong).await.is_err() {
                        break None;
                    }
                }
                other => {
                    break Some(Error::Protocol(format!(
                        "unexpected {other:?} frame from a client"
                    )));
                }
            }
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

    async fn answer(
        &self,
        from: Arc<PeerIdentity>,
        conn: &ConnState,
        frame: Frame,
        send: &tokio::sync::Mutex<quinn::SendStream>,
    ) {
        let start = Instant::now();
        let op = frame.payload.first().and_then(|c| Op::from_u8(*c)).map_or("unknown", Op::name);
        let running = &conn.running;
        let reply = match Request::decode(&frame.payload) {
            Ok(Request::CancelRequest(id)) => self.cancel(running, id),
            Ok(request) if request.cancellable() => {
                let (stop, stopped) = oneshot::channel();
                running.lock().unwrap_or_else(|p| p.into_inner()).insert(frame.request_id, stop);
                let _entry = RunningEntry { running, id: frame.request_id };
                let remote = from.addr;
                tokio::select! {
                    reply = self.handler.handle(from, request) => reply,
                    _ = stopped => Reply::error(499, "request cancelled: its requester went away"),
                    silent = conn.heard.silence_after(Instant::now()) => {
                        self.metrics.cancel("silent");
                        tracing::info!(
                            %remote, op, silent_ms = silent.as_millis() as u64,
                            "stopped a request whose requester stopped pinging (killed or cut off?)"
                        );
                        Reply::error(499, "request cancelled: its requester went silent")
                    }
                }
            }
            Ok(request) => self.handler.handle(from, request).await,
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

/// The cancellable requests running on one connection, by request id
/// (each with what stops it).
type Running = Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>;

/// What the streams of one server-side connection share.
#[derive(Clone)]
struct ConnState {
    running: Running,
    heard: Arc<Heard>,
}

/// When a server-side connection last received a frame, and a Ping, as
/// milliseconds since [`Heard::epoch`] (0: never).
struct Heard {
    epoch: Instant,
    frame_ms: AtomicU64,
    ping_ms: AtomicU64,
}

impl Heard {
    fn new() -> Heard {
        Heard { epoch: Instant::now(), frame_ms: AtomicU64::new(0), ping_ms: AtomicU64::new(0) }
    }

    fn now_ms(&self) -> u64 {
        // +1: a frame in the connection's first millisecond is not "never".
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn frame(&self, ping: bool) {
        let now = self.now_ms();
        self.frame_ms.fetch_max(now, Ordering::Relaxed);
        if ping {
            self.ping_ms.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// Resolves (with how long it was silent) once the connection has
    /// pinged after `since` and then received nothing for
    /// [`REQUESTER_SILENT_AFTER`]; never, for a requester that does not
    /// ping. Checked every [`WATCH_PING_EVERY`].
    async fn silence_after(&self, since: Instant) -> Duration {
        let since_ms = since.saturating_duration_since(self.epoch).as_millis() as u64 + 1;
        let mut tick = tokio::time::interval(WATCH_PING_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.ping_ms.load(Ordering::Relaxed) < since_ms {
                continue;
            }
            let silent = Duration::from_millis(
                self.now_ms().saturating_sub(self.frame_ms.load(Ordering::Relaxed)),
            );
            if silent >= REQUESTER_SILENT_AFTER {
                return silent;
            }
        }
    }
}

/// Removes a request from [`Running`] once it is answered.
struct RunningEntry<'a> {
    running: &'a Running,
    id: u64,
}

impl Drop for RunningEntry<'_> {
    fn drop(&mut self) {
        self.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

impl<H: Handler> Server<H> {
    /// CancelRequest (38): stops request `id` of this connection if it is
    /// still running (204), else 404.
    fn cancel(&self, running: &Running, id: u64) -> Reply {
        let stop = running.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        match stop.map(|s| s.send(())) {
            Some(Ok(())) => {
                self.metrics.cancel("stopped");
                Reply { status: 204, content_type: String::new(), body: Bytes::new() }
            }
            _ => {
                self.metrics.cancel("finished");
                Reply::error(404, &format!("no request {id} is running on this connection"))
            }
        }
    }
}

/// Why an incoming connection was not served.
#[derive(Debug)]
enum Refusal {
    /// The QUIC/TLS handshake failed.
    Handshake(String),
    /// The peer negotiated an ALPN this node no longer serves.
    Version(String),
    /// The authentication exchange failed.
    Auth(HandshakeError),
    /// Not authenticated by the deadline.
    Timeout,
    /// The dialler refused this node's proof.
    PeerRefused,
}

impl Refusal {
    fn reason(&self) -> &'static str {
        match self {
            Refusal::Handshake(_) => "handshake",
            Refusal::Version(_) => "version",
            Refusal::Auth(e) => e.reason(),
            Refusal::Timeout => "auth_timeout",
            Refusal::PeerRefused => "peer_refused",
        }
    }

    fn close_code(&self) -> u32 {
        match self {
            Refusal::Version(_) => close_code::VERSION,
            Refusal::Timeout => close_code::AUTH_TIMEOUT,
            _ => close_code::AUTH_FAILED,
        }
    }

    /// What the peer is told: the version it should speak, or nothing
    /// about why its authentication failed.
    fn close_reason(&self) -> String {
        match self {
            Refusal::Version(v) => format!(
                "{v} is no longer served: this node speaks {} (upgrade every node of the cluster)",
                String::from_utf8_lossy(tls::ALPN)
            ),
            Refusal::Timeout => format!("not authenticated within {AUTH_TIMEOUT:?}"),
            _ => "authentication failed".to_owned(),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Handshake(e) => write!(f, "quic handshake: {e}"),
            Refusal::Version(v) => write!(
                f,
                "the peer speaks {v:?}, not {} (it runs an older narad: upgrade it)",
                String::from_utf8_lossy(tls::ALPN)
            ),
            Refusal::Auth(e) => e.fmt(f),
            Refusal::Timeout => write!(f, "not authenticated within {AUTH_TIMEOUT:?}"),
            Refusal::PeerRefused => write!(
                f,
                "the dialling peer refused this node's proof of the cluster secret (it has \
                 another secret, or it is not a node)"
            ),
        }
    }
}

#[cfg(test)]
#[path = "transport_tests.rs"]
mod tests;
