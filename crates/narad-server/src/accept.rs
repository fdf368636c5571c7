//! Accepting connections: the connection limit (`http.max_connections`)
//! and an accept loop that survives running out of descriptors.
//!
//! Every accepted connection holds a [`ConnPermit`] until it closes (for
//! TLS, from the TCP accept, through the handshake). With every permit
//! taken the listener stops calling `accept`: new connections wait in the
//! kernel's listen backlog, costing this process no descriptor, and are
//! accepted as soon as an open one closes; the open ones keep working. So
//! idle sockets cannot take the descriptors the data plane needs (WAL and
//! partition segment files, the metastore).
//!
//! An `accept` that fails for lack of resources (`EMFILE`, `ENFILE`,
//! `ENOBUFS`, `ENOMEM`) is retried after a back-off (10 ms doubling to
//! 1 s), never in a tight loop, and never ends the listener.
//!
//! Metrics: `narad_http_connections_open` (gauge),
//! `narad_http_connections_waited_total` (a new connection had to wait for
//! the limit), `narad_http_accept_errors_total`. The limit being reached
//! and failed accepts are each logged at most once per 10 s.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::serve::Listener;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::warn;

/// The default limit is this share of the open-file limit...
const AUTO_SHARE_DIVISOR: u64 = 2;
/// ...and at most this many connections.
pub const AUTO_MAX_CONNECTIONS: usize = 65_536;
/// How often the limit being reached, or a failing accept, is logged.
const LOG_INTERVAL: Duration = Duration::from_secs(10);
/// The first back-off after a failed accept, doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// The longest back-off after a failed accept.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The connection limit when `http.max_connections` is 0 (auto): half the
/// soft open-file limit (`RLIMIT_NOFILE`, which `narad serve` raises to the
/// hard limit first), at most [`AUTO_MAX_CONNECTIONS`], at least 1; the
/// other half stays for the data plane.
pub fn auto_max_connections(nofile: u64) -> usize {
    usize::try_from(nofile / AUTO_SHARE_DIVISOR)
        .unwrap_or(usize::MAX)
        .clamp(1, AUTO_MAX_CONNECTIONS)
}

/// The process's soft open-file limit, if it can be read.
pub fn open_file_limit() -> Option<u64> {
    rlimit::getrlimit(rlimit::Resource::NOFILE).ok().map(|(soft, _)| soft)
}

/// At most once per [`LOG_INTERVAL`].
#[derive(Debug, Default)]
struct Every(Mutex<Option<Instant>>);

impl Every {
    fn due(&self) -> bool {
        let mut last = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let due = last.is_none_or(|at| at.elapsed() >= LOG_INTERVAL);
        if due {
            *last = Some(Instant::now());
        }
        due
    }
}

/// The connection limit and its metrics. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ConnLimit {
    max: usize,
    permits: Arc<Semaphore>,
    open: Gauge<i64, std::sync::atomic::AtomicI64>,
    waited: Counter<u64, AtomicU64>,
    accept_errors: Counter<u64, AtomicU64>,
    warned_full: Arc<Every>,
    warned_accept: Arc<Every>,
}

impl ConnLimit {
    /// A limit of `max` (at least 1) open connections, its metrics
    /// registered in `registry`.
    pub fn new(max: usize, registry: &mut Registry) -> ConnLimit {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        let limit = ConnLimit {
            max,
            permits: Arc::new(Semaphore::new(max)),
            open: Gauge::default(),
            waited: Counter::default(),
            accept_errors: Counter::default(),
            warned_full: Arc::default(),
            warned_accept: Arc::default(),
        };
        registry.register(
            "http_connections_open",
            "Open HTTP connections (TLS ones from their TCP accept)",
            limit.open.clone(),
        );
        registry.register(
            "http_connections_waited",
            "New connections that waited in the listen backlog because http.max_connections were open",
            limit.waited.clone(),
        );
        registry.register(
            "http_accept_errors",
            "Failed accepts (out of file descriptors, say), retried after a back-off",
            limit.accept_errors.clone(),
        );
        limit
    }

    /// The limit.
    pub fn max(&self) -> usize {
        self.max
    }

    /// A slot for the next connection: at once if one is free, else once
    /// an open connection closes.
    pub async fn acquire(&self) -> ConnPermit {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                self.waited.inc();
                if self.warned_full.due() {
                    warn!(
                        max_connections = self.max,
                        "connection limit reached: new connections wait in the listen backlog \
                         until one closes (http.max_connections)"
                    );
                }
                self.permits.clone().acquire_owned().await.expect("the semaphore is never closed")
            }
        };
        self.open.inc();
        ConnPermit { _permit: permit, open: self.open.clone() }
    }

    /// Accepts the next TCP connection within the limit, with Nagle's
    /// algorithm off ([`crate::conn::set_nodelay`]). Never fails: a failed
    /// accept is counted, logged (rate-limited) and retried after a
    /// back-off.
    pub async fn accept(&self, tcp: &TcpListener) -> (TcpStream, SocketAddr, ConnPermit) {
        let permit = self.acquire().await;
        let mut backoff = FIRST_BACKOFF;
        loop {
            match tcp.accept().await {
                Ok((stream, peer)) => {
                    crate::conn::set_nodelay(&stream);
                    return (stream, peer, permit);
                }
                // The peer gave up before we took it: nothing to wait for.
                Err(e) if is_connection_error(&e) => {}
                Err(e) => {
                    self.accept_errors.inc();
                    if self.warned_accept.due() {
                        warn!(
                            error = %e,
                            open = self.max - self.permits.available_permits(),
                            "accepting a connection failed; retrying after a back-off"
                        );
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// One open connection's slot; given back when dropped.
#[derive(Debug)]
pub struct ConnPermit {
    _permit: OwnedSemaphorePermit,
    open: Gauge<i64, std::sync::atomic::AtomicI64>,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// A connection's stream with its slot: the slot is free again when the
/// stream is dropped.
#[derive(Debug)]
pub struct Limited<I> {
    io: I,
    _permit: ConnPermit,
}

impl<I> Limited<I> {
    /// `io`, holding `permit` until it is dropped.
    pub fn new(io: I, permit: ConnPermit) -> Limited<I> {
        Limited { io, _permit: permit }
    }

    /// The stream.
    pub fn get_ref(&self) -> &I {
        &self.io
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Limited<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Limited<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The plain-TCP listener: connections within `limit`, Nagle off.
#[derive(Debug)]
pub struct PlainListener {
    tcp: TcpListener,
    limit: ConnLimit,
}

impl PlainListener {
    /// Accepts on `tcp` within `limit`.
    pub fn new(tcp: TcpListener, limit: ConnLimit) -> PlainListener {
        PlainListener { tcp, limit }
    }
}

impl Listener for PlainListener {
    type Io = Limited<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, peer, permit) = self.limit.accept(&self.tcp).await;
        (Limited::new(stream, permit), peer)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_automatic_limit_leaves_half_the_descriptors_to_the_data_plane() {
        assert_eq!(auto_max_connections(1024), 512);
        assert_eq!(auto_max_connections(128), 64);
        assert_eq!(auto_max_connections(1), 1);
        assert_eq!(auto_max_connections(0), 1);
        assert_eq!(auto_max_connections(1 << 20), AUTO_MAX_CONNECTIONS);
        assert_eq!(auto_max_connections(u64::MAX), AUTO_MAX_CONNECTIONS);
    }
}
