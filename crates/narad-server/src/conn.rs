//! Serving connections (SPEC §1.1): hyper's HTTP/1.1 and HTTP/2 on every
//! accepted stream, plain TCP or TLS alike, with the read, write and idle
//! timeouts kept per connection and the request head bounded.
//!
//! # Phases and deadlines
//!
//! A connection is always in one phase, and each phase has one deadline:
//!
//! | phase | begins when                                         | closed unless it moves on by |
//! |-------|-----------------------------------------------------|------------------------------|
//! | idle  | accepted, or its last response was handed over      | `idle_timeout` after that    |
//! | head  | (HTTP/1) a byte of a new request arrives while idle | `read_timeout` after it      |
//! | busy  | a request's head is complete                        | `write_timeout` after the last request started or finished |
//!
//! A request body must arrive whole within `read_timeout` of its head: the
//! body handed to the handler fails with [`BodyReadTimeout`] after that,
//! and the handler answers 408. A response the client does not take is
//! bounded by the idle deadline that follows it.
//!
//! One watchdog per connection (in the connection's own task, its futures
//! polled only when their own waker fires) sleeps until the current
//! deadline, or the shortest timeout ahead if that is sooner, and drops the
//! connection when the deadline passes. A phase change wakes it only if it
//! moves the deadline earlier than that (which arming no later than the
//! shortest timeout ahead makes rare); a later deadline is picked up when
//! the armed one fires, so a busy keep-alive connection costs no timer work
//! per request. A slow or
//! silent client therefore costs a socket, a parked task and at most
//! `max_header_bytes` of buffered head; it never holds a thread, a lock or a
//! permit that other clients wait for. A head over `max_header_bytes` (or
//! with more than 100 headers) is answered 431 and the connection closed.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Version};
use axum::serve::Listener;
use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tracing::{debug, warn};

use crate::fast::App;

/// The smallest request-head bound hyper accepts (its minimum buffer).
pub const MIN_HEADER_BYTES: usize = 8 << 10;

/// Timeouts and bounds of every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnConfig {
    /// A request's head must arrive within this of its first byte, and its
    /// body within this of its head.
    pub read_timeout: Duration,
    /// A request must be answered within this of its head (or, with HTTP/2
    /// streams in flight, some request must start or finish this often).
    pub write_timeout: Duration,
    /// A connection with no request in flight is closed after this.
    pub idle_timeout: Duration,
    /// The largest request head (request line and headers), in bytes.
    pub max_header_bytes: usize,
}

impl Default for ConnConfig {
    /// SPEC §1.1: read 10 s, write 30 s, idle 60 s; heads up to 64 KiB.
    fn default() -> Self {
        ConnConfig {
            read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_header_bytes: 64 << 10,
        }
    }
}

/// The error a request body yields once its read deadline has passed.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("request body not received within {0:?}")]
pub struct BodyReadTimeout(pub Duration);

/// Where a connection is (see the module documentation).
#[derive(Debug, Clone, Copy)]
enum Phase {
    Idle { since: Instant },
    Head { since: Instant },
    Busy { in_flight: usize, progress: Instant },
}

/// A connection's phase and the deadline its watchdog sleeps until.
#[derive(Debug)]
struct State {
    phase: Phase,
    /// The deadline the watchdog is sleeping until. A phase change wakes it
    /// only when the new deadline is earlier; a later one is picked up when
    /// this one fires (the watchdog then re-reads the phase). Waking it on
    /// every change re-armed a timer three times per request: 15% of the
    /// instructions of a durable produce.
    armed: Instant,
}

/// The phase of one connection, shared by its stream, its requests and
/// its watchdog.
#[derive(Debug)]
struct Clock {
    config: ConnConfig,
    /// A `std` mutex: held for a few instructions, never across `.await`.
    state: Mutex<State>,
    /// Set once an HTTP/2 request was seen: bytes on an idle HTTP/2
    /// connection (pings, settings) are not the start of a request head.
    h2: AtomicBool,
    /// Wakes the watchdog when the deadline moved earlier than `armed`.
    changed: Notify,
}

impl Clock {
    fn new(config: ConnConfig) -> Clock {
        let now = Instant::now();
        Clock {
            config,
            state: Mutex::new(State {
                phase: Phase::Idle { since: now },
                armed: now + config.idle_timeout,
            }),
            h2: AtomicBool::new(false),
            changed: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The deadline of `phase` and what missing it means.
    fn deadline_of(&self, phase: Phase) -> (Instant, &'static str) {
        let c = &self.config;
        match phase {
            Phase::Idle { since } => (since + c.idle_timeout, "idle"),
            Phase::Head { since } => (since + c.read_timeout, "request head not received in time"),
            Phase::Busy { progress, .. } => {
                (progress + c.write_timeout, "request not answered in time")
            }
        }
    }

    /// The current deadline and what missing it means.
    fn deadline(&self) -> (Instant, &'static str) {
        self.deadline_of(self.state().phase)
    }

    /// What the watchdog now sleeps until: the current deadline, or the
    /// shortest of the timeouts from now if that is sooner. Any phase
    /// entered later has a deadline at least that far away, so no phase
    /// change needs to wake the watchdog; it re-reads the phase when the
    /// sleep ends, at most once per shortest timeout. (Arming exactly the
    /// current deadline made every request's head, whose read timeout is
    /// shorter than the write timeout armed while it was busy, wake the
    /// watchdog and re-arm its timer.)
    fn arm(&self) -> Instant {
        let c = &self.config;
        let shortest = c.read_timeout.min(c.write_timeout).min(c.idle_timeout);
        let soonest = Instant::now() + shortest;
        let mut st = self.state();
        let (deadline, _) = self.deadline_of(st.phase);
        st.armed = deadline.min(soonest);
        st.armed
    }

    /// Moves to `phase`; wakes the watchdog if that deadline is earlier than
    /// the one it sleeps until.
    fn enter(&self, mut st: std::sync::MutexGuard<'_, State>, phase: Phase) {
        st.phase = phase;
        let (deadline, _) = self.deadline_of(phase);
        let earlier = deadline < st.armed;
        if earlier {
            st.armed = deadline;
        }
        drop(st);
        if earlier {
            self.changed.notify_one();
        }
    }

    fn bytes_read(&self) {
        if self.h2.load(Ordering::Relaxed) {
            return;
        }
        let st = self.state();
        if let Phase::Idle { .. } = st.phase {
            self.enter(st, Phase::Head { since: Instant::now() });
        }
    }

    fn request_started(self: &Arc<Self>, version: Version) -> InFlight {
        if version == Version::HTTP_2 {
            self.h2.store(true, Ordering::Relaxed);
        }
        let now = Instant::now();
        let st = self.state();
        let next = match st.phase {
            Phase::Busy { in_flight, .. } => {
                Phase::Busy { in_flight: in_flight + 1, progress: now }
            }
            Phase::Idle { .. } | Phase::Head { .. } => Phase::Busy { in_flight: 1, progress: now },
        };
        self.enter(st, next);
        InFlight(self.clone())
    }

    fn request_finished(&self) {
        let now = Instant::now();
        let st = self.state();
        if let Phase::Busy { in_flight, .. } = st.phase {
            let next = if in_flight > 1 {
                Phase::Busy { in_flight: in_flight - 1, progress: now }
            } else {
                Phase::Idle { since: now }
            };
            self.enter(st, next);
        }
    }
}

/// One request in flight: from its complete head until its response body
/// is done (or dropped).
#[derive(Debug)]
struct InFlight(Arc<Clock>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

/// The accepted stream, noting when bytes arrive.
#[derive(Debug)]
struct Watched<I> {
    io: I,
    clock: Arc<Clock>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.bytes_read();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
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

/// A request body that fails with [`BodyReadTimeout`] once its deadline
/// passes. The timer is only armed when the body actually has to wait.
#[derive(Debug)]
struct TimedBody {
    inner: Incoming,
    deadline: Instant,
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyReadTimeout(this.timeout)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.inner)
    }

    fn size_hint(&self) -> SizeHint {
        http_body::Body::size_hint(&self.inner)
    }
}

/// A response body that ends its request's [`InFlight`] when it is done.
#[derive(Debug)]
struct Tracked {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.inner)
    }

    fn size_hint(&self) -> SizeHint {
        http_body::Body::size_hint(&self.inner)
    }
}

fn builder(config: ConnConfig) -> Builder<TokioExecutor> {
    let mut b = Builder::new(TokioExecutor::new());
    // No hyper timer: the watchdog keeps every deadline (hyper's own
    // header timeout would also run while idle, cutting keep-alive short).
    b.http1().max_buf_size(config.max_header_bytes.max(MIN_HEADER_BYTES));
    b.http2().max_header_list_size(u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX));
    b
}

/// Serves one connection until it ends, its deadline passes, or `stop`
/// asks for a graceful close (finish what is in flight, take nothing new).
async fn serve_connection<I>(
    io: I,
    peer: SocketAddr,
    app: App,
    config: ConnConfig,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let clock = Arc::new(Clock::new(config));
    let io = TokioIo::new(Watched { io, clock: clock.clone() });
    let requests = clock.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let in_flight = requests.request_started(req.version());
        let deadline = Instant::now() + config.read_timeout;
        let timeout = config.read_timeout;
        let req = req.map(|inner| TimedBody { inner, deadline, timeout, sleep: None });
        let answer = app.answer(req, peer);
        async move {
            let response = answer.await;
            Ok::<_, Infallible>(response.map(|inner| Tracked { inner, _in_flight: in_flight }))
        }
    });
    let builder = builder(config);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut stopping = *stop.borrow();
    if stopping {
        conn.as_mut().graceful_shutdown();
    }
    // The watchdog's three futures are polled with a waker of their own,
    // and only after it fired: a connection's task is woken several times
    // per request (bytes in, the WAL's answer, bytes out), and polling them
    // all on every wake-up (as `select!` does) was 7% of the instructions
    // of a durable produce.
    let watchdog = Arc::new(Watchdog { fired: AtomicBool::new(true), task: AtomicWaker::new() });
    let watchdog_waker = Waker::from(watchdog.clone());
    let sleep = tokio::time::sleep_until(clock.arm());
    tokio::pin!(sleep);
    let notified = clock.changed.notified();
    tokio::pin!(notified);
    let stop_changed = stop.changed();
    tokio::pin!(stop_changed);
    std::future::poll_fn(|cx| {
        watchdog.task.register(cx.waker());
        loop {
            if let Poll::Ready(done) = conn.as_mut().poll(cx) {
                if let Err(e) = done {
                    debug!(error = %e, "connection ended with an error");
                }
                return Poll::Ready(());
            }
            if !watchdog.fired.swap(false, Ordering::AcqRel) {
                return Poll::Pending;
            }
            let mut wcx = Context::from_waker(&watchdog_waker);
            let mut shut_down = false;
            loop {
                if !stopping && stop_changed.as_mut().poll(&mut wcx).is_ready() {
                    stopping = true;
                    shut_down = true;
                    conn.as_mut().graceful_shutdown();
                }
                if notified.as_mut().poll(&mut wcx).is_ready() {
                    notified.set(clock.changed.notified());
                    sleep.as_mut().reset(clock.arm());
                    continue;
                }
                if sleep.as_mut().poll(&mut wcx).is_ready() {
                    // The phase may have moved on since the sleep was armed.
                    let (due, why) = clock.deadline();
                    if due <= Instant::now() {
                        debug!(reason = why, "closing connection: deadline passed");
                        return Poll::Ready(());
                    }
                    sleep.as_mut().reset(clock.arm());
                    continue;
                }
                break;
            }
            if !shut_down {
                return Poll::Pending;
            }
            // A graceful shutdown was asked for: the connection acts on it
            // when polled.
        }
    })
    .await;
}

/// The waker of a connection's watchdog futures: notes that one of them
/// is ready and wakes the connection's task.
#[derive(Debug)]
struct Watchdog {
    fired: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Watchdog {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// Turns Nagle's algorithm off on an accepted connection, as Go's net/http
/// (narad v2) and most brokers do: a response written in more than one
/// `write` (a TLS record after its predecessor, a long consume's last
/// segment) then leaves at once instead of waiting for the client's
/// (possibly delayed) ACK of the previous one. A failure is logged and
/// the connection served anyway.
pub fn set_nodelay(tcp: &tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        debug!(error = %e, "could not set TCP_NODELAY on an accepted connection");
    }
}

/// Accepts connections on `listener` and serves `app` on each until
/// `shutdown` resolves; then stops accepting, lets every connection finish
/// what is in flight, and after `grace` closes whatever is left.
pub async fn serve<L>(
    mut listener: L,
    app: App,
    config: ConnConfig,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) where
    L: Listener<Addr = SocketAddr>,
{
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            (io, peer) = listener.accept() => {
                while conns.try_join_next().is_some() {}
                conns.spawn(serve_connection(io, peer, app.clone(), config, stop_rx.clone()));
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained =
        tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        warn!(open = conns.len(), "shutdown grace is over: closing the remaining connections");
        conns.abort_all();
        while conns.join_next().await.is_some() {}
    }
}
