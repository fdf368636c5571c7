//! Loopback tests of the transport: two endpoints in one process on
//! 127.0.0.1, port 0.

use super::*;
use crate::auth::{ClusterSecret, TlsFiles};
use crate::frame::FrameType;
use crate::limits::FRAME_HEADER_LEN;
use crate::rpc::{CommitRecord, TopicBody};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicUsize;
use tokio::io::AsyncReadExt;

/// Answers GetTopic(t) with 200 and body t, after sleeping
/// `t.len() % 7` ms (so replies finish out of order); GetTopic("slow")
/// sleeps 10 s. Counts every request it sees.
#[derive(Debug, Default)]
struct Echo {
    seen: AtomicUsize,
}

impl Handler for Echo {
    async fn handle(&self, _from: Arc<PeerIdentity>, request: Request) -> Reply {
        self.seen.fetch_add(1, Ordering::SeqCst);
        match request {
            Request::GetTopic(t) if t == "slow" => {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Reply::json(200, t)
            }
            Request::GetTopic(t) => {
                tokio::time::sleep(Duration::from_millis((t.len() % 7) as u64)).await;
                Reply::json(200, t)
            }
            Request::CreateTopic(b) => Reply::json(201, b.body),
            other => Reply::error(404, &format!("no {:?}", other.op())),
        }
    }
}

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A ClusterAuth with a secret made of `s` (padded to the 32-character
/// minimum).
fn secret(s: &str) -> ClusterAuth {
    let long = format!("{s}-0123456789abcdef0123456789abcdef");
    ClusterAuth {
        secret: Some(ClusterSecret::new(long.as_bytes()).unwrap()),
        node_id: format!("node-{s}"),
        ..ClusterAuth::default()
    }
}

fn tls_only(files: TlsFiles) -> ClusterAuth {
    ClusterAuth { tls: Some(files), ..ClusterAuth::default() }
}

fn server(auth: ClusterAuth) -> (Transport, Arc<Echo>, RpcMetrics) {
    let echo = Arc::new(Echo::default());
    let metrics = RpcMetrics::default();
    let t = Transport::serve(localhost(), auth, metrics.clone(), echo.clone()).unwrap();
    (t, echo, metrics)
}

fn client(auth: ClusterAuth) -> (Transport, RpcMetrics) {
    let metrics = RpcMetrics::default();
    (Transport::client_only(localhost(), auth, metrics.clone()).unwrap(), metrics)
}

fn get(t: &str) -> Request {
    Request::GetTopic(t.into())
}

fn exposition(m: &RpcMetrics) -> String {
    let mut r = Registry::with_prefix("narad");
    m.register(&mut r);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
    out
}

#[tokio::test]
async fn a_request_gets_its_reply_and_a_ping_its_pong() {
    let (srv, echo, srv_metrics) = server(secret("s3cret"));
    let (cli, cli_metrics) = client(secret("s3cret"));
    let peer = cli.peer(srv.local_addr().unwrap(), tls::DEFAULT_SERVER_NAME);
    let reply = peer.call(&get("orders")).await.unwrap();
    assert_eq!(
        (reply.status, &reply.content_type[..], &reply.body[..]),
        (200, "application/json", &b"orders"[..])
    );
    let reply = peer.call(&Request::DeleteTopic("x".into())).await.unwrap();
    assert_eq!(reply.status, 404);
    // A body made of our own handshake and frame headers is only bytes.
    let mut own = crate::handshake::encode_hello(&[7; 32]);
    own.extend(crate::handshake::encode_welcome());
    own.extend(Frame::new(FrameType::NodeRequest, 1, get("x").encode()).encode().unwrap());
    own.extend(&own[..FRAME_HEADER_LEN + 3].to_vec());
    let reply = peer
        .call(&Request::CreateTopic(TopicBody { topic: "".into(), body: own.clone().into() }))
        .await
        .unwrap();
    assert_eq!((reply.status, &reply.body[..]), (201, &own[..]));
    peer.ping().await.unwrap();
    assert_eq!(echo.seen.load(Ordering::SeqCst), 3);
    let c = exposition(&cli_metrics);
    assert!(c.contains(r#"narad_node_rpc_requests_total{op="get_topic",side="client"} 1"#), "{c}");
    assert!(
        c.contains(
            r#"narad_node_rpc_errors_total{op="delete_topic",side="client",kind="status_4xx"} 1"#
        ),
        "{c}"
    );
    assert!(
        c.contains(
            r#"narad_node_rpc_request_duration_seconds_count{op="get_topic",side="client"} 1"#
        ),
        "{c}"
    );
    // The server counts once its reply is written, just after the client has it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let s = exposition(&srv_metrics);
    assert!(s.contains(r#"narad_node_rpc_requests_total{op="get_topic",side="server"} 1"#), "{s}");
    // Same peer, same connection: the transport keeps one per address.
    assert!(Arc::ptr_eq(&peer, &cli.peer(srv.local_addr().unwrap(), tls::DEFAULT_SERVER_NAME)));
}

#[tokio::test]
async fn many_concurrent_requests_are_multiplexed_and_each_gets_its_own_reply() {
    let (srv, echo, _) = server(secret("s"));
    let (cli, _) = client(secret("s"));
    let peer = cli.peer(srv.local_addr().unwrap(), tls::DEFAULT_SERVER_NAME);
    let calls = (0..1_000).map(|i| {
        let peer = peer.clone();
        tokio::spawn(async move {
            let topic = format!("t{}", "x".repeat(i % 13)) + &i.to_string();
            let reply = peer.call(&get(&topic)).await.unwrap();
            assert_eq!(reply.body, topic.as_bytes(), "reply of another request");
        })
    });
    for c in calls.collect::<Vec<_>>() {
        c.await.unwrap();
    }
    assert_eq!(echo.seen.load(Ordering::SeqCst), 1_000);
    let control = peer.lanes[Lane::Control as usize].lock().await.streams.len();
    assert!(
        (1..=crate::limits::CONTROL_LANE_STREAMS).contains(&control),
        "{control} control streams"
    );
}

#[tokio::test]
async fn a_late_reply_times_out_and_the_stream_stays_usable() {
    let (srv, _, _) = server(ClusterAuth::default());
    let (cli, metrics) = client(ClusterAuth::default());
    let peer = cli.peer(srv.local_addr().unwrap(), tls::DEFAULT_SERVER_NAME);
    let e = peer.call_with_timeout(&get("slow"), Duration::from_millis(200)).await.unwrap_err();
    assert!(matches!(e, Error::Timeout { op: "get_topic", .. }), "{e}");
    assert_eq!(peer.call(&get("fast")).await.unwrap().body, &b"fast"[..]);
    assert!(exposition(&metrics).contains(r#"kind="timeout"} 1"#));
}

#[tokio::test]
async fn a_dial_to_nobody_fails_within_the_dial_timeout() {
    let (cli, _) = client(ClusterAuth::default());
    // A bound UDP socket that never answers.
    let silent = std::net::UdpSocket::bind(localhost()).unwrap();
    let peer = cli.peer(silent.local_addr().unwrap(), tls::DEFAULT_SERVER_NAME);
    let start = Instant::now();
    let e = peer.call(&get("t")).await.unwrap_err();
    assert!(matches!(e, Error::Dial { .. }), "{e}");
    assert!(start.elapsed() < REPLY_TIMEOUT, "{:?}", start.elapsed());
}

#[tokio::test]
async fn a_wrong_or_missing_secret_gets_nothing_and_reaches_no_handler() {
    let (srv, echo, metrics) = server(secret("right"));
    let addr = srv.local_addr().unwrap();
    for (auth, side) in [(secret("wrong"), "client"), (ClusterAuth::default(), "server")] {
        let (cli, cli_metrics) = client(auth);
        let peer = cli.peer(addr, tls::DEFAULT_SERVER_NAME);
        let e = peer
            .call(&Request::CreateTopic(TopicBody { topic: "".into(), body: "{}".into() }))
            .await
            .unwrap_err();
        // The request never left: a dial failure, safe to send elsewhere.
        assert!(
            matches!(e, Error::Dial { ref reason, .. } if reason.contains("authentication")),
            "{e}"
        );
        assert!(peer.ping().await.is_err());
        assert!(peer.conn.lock().await.is_none(), "an unauthenticated connection was kept");
        if side == "client" {
            // The wrong secret's node refused the server's proof itself.
            let c = exposition(&cli_metrics);
            assert!(
                c.contains(
                    r#"narad_node_rpc_connections_rejected_total{side="client",reason="auth"}"#
                ),
                "{c}"
            );
            // ... and the server knows it was refused.
            wait_until(|| {
                exposition(&metrics).contains(r#"side="server",reason="peer_refused"} 1"#)
            })
            .await;
        }
    }
    assert_eq!(echo.seen.load(Ordering::SeqCst), 0, "an unauthenticated peer reached the handler");
    let m = exposition(&metrics);
    assert!(
        m.contains(r#"narad_node_rpc_connections_rejected_total{side="server",reason="auth"}"#),
        "{m}"
    );
    assert!(!m.contains("narad_node_rpc_requests_total"), "{m}");
    // The right secret still gets in.
    let (cli, _) = client(secret("right"));
    assert_eq!(cli.peer(addr, tls::DEFAULT_SERVER_NAME).call(&get("t")).await.unwrap().status, 200);
}

/// Waits (up to 5 s) for `f` to hold.
async fn wait_until(f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "not within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A raw QUIC connection to `addr` (nothing sent on it yet).
async fn raw_connection(
    addr: SocketAddr,
    auth: &ClusterAuth,
) -> (quinn::Endpoint, quinn::Connection) {
    let ep = quinn::Endpoint::client(localhost()).unwrap();
    let conn = ep
        .connect_with(client_config(auth).unwrap(), addr, tls::DEFAULT_SERVER_NAME)
        .unwrap()
        .await
        .unwrap();
    (ep, conn)
}

/// A raw stream to `addr` on a connection that authenticated, for peers
/// that know the secret and then lie.
async fn raw_stream(
    addr: SocketAddr,
    auth: &ClusterAuth,
) -> (quinn::Endpoint, quinn::SendStream, quinn::RecvStream) {
    let (ep, conn) = raw_connection(addr, auth).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let keys = crate::handshake::keys(auth);
    let binding = exporter(&conn).unwrap();
    crate::handshake::client(&mut send, &mut recv, binding, &keys, "liar").await.unwrap();
    send.finish().unwrap();
    open_up(&conn, false);
    let (send, recv) = conn.open_bi().await.unwrap();
    (ep, send, recv)
}

/// Reads what the server sent until it finished or reset the stream.
async fn drain(recv: &mut quinn::RecvStream) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let reset =
        tokio::time::timeout(Duration::from_secs(10), AsyncReadExt::read_to_end(recv, &mut out))
            .await
            .unwrap()
            .is_err();
    (out, reset)
}

async fn expect_error_frame(recv: &mut quinn::RecvStream, needle: &str) {
    let (bytes, _) = drain(recv).await;
    let (f, used) = Frame::decode(&bytes).unwrap_or_else(|e| panic!("{e}: {bytes:?}"));
    assert_eq!((f.kind, f.request_id, used), (FrameType::Error, 0, bytes.len()));
    let msg = Frame::error_message(&f.payload).unwrap();
    assert!(msg.contains(needle), "{msg}");
}

#[tokio::test]
async fn a_peer_that_lies_gets_an_error_frame_and_reaches_no_handler() {
    let auth = secret("s");
    let (srv, echo, metrics) = server(auth.clone());
    let addr = srv.local_addr().unwrap();

    // A length beyond 16 MiB: refused from the header alone.
    let (_ep, mut send, mut recv) = raw_stream(addr, &auth).await;
    let mut header = Frame::new(FrameType::NodeRequest, 1, Bytes::new()).encode().unwrap();
    header[16..20].copy_from_slice(&(FRAME_MAX_PAYLOAD as u32 + 1).to_be_bytes());
    send.write_all(&header).await.unwrap();
    expect_error_frame(&mut recv, "exceeds the 16777216-byte limit").await;

    // Garbage on an authenticated connection.
    let (_ep, mut send, mut recv) = raw_stream(addr, &auth).await;
    send.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    expect_error_frame(&mut recv, "bad frame magic").await;

    // Our own header with the reserved bytes set.
    let (_ep, mut send, mut recv) = raw_stream(addr, &auth).await;
    let mut f = Frame::new(FrameType::NodeRequest, 1, get("t").encode()).encode().unwrap();
    f[7] = 1;
    send.write_all(&f).await.unwrap();
    expect_error_frame(&mut recv, "reserved").await;

    // Half a frame, then the end of the stream.
    let (_ep, mut send, mut recv) = raw_stream(addr, &auth).await;
    let f = Frame::new(FrameType::NodeRequest, 1, get("t").encode()).encode().unwrap();
    send.write_all(&f[..FRAME_HEADER_LEN + 3]).await.unwrap();
    send.finish().unwrap();
    expect_error_frame(&mut recv, "truncated frame payload").await;

    // A reply frame sent to a server.
    let (_ep, mut send, mut recv) = raw_stream(addr, &auth).await;
    write_frame(&mut send, &Frame::new(FrameType::NodeReply, 1, Reply::json(200, "{}").encode()))
        .await
        .unwrap();
    expect_error_frame(&mut recv, "unexpected NodeReply").await;

    // An unknown op is answered (400), not a stream fault.
    let (_ep, mut send, mut recv) = raw_stream(addr, &auth).await;
    write_frame(&mut send, &Frame::new(FrameType::NodeRequest, 9, vec![99u8])).await.unwrap();
    send.finish().unwrap();
    let (bytes, _) = drain(&mut recv).await;
    let (f, _) = Frame::decode(&bytes).unwrap();
    assert_eq!((f.kind, f.request_id), (FrameType::NodeReply, 9));
    let reply = Reply::decode(&f.payload).unwrap();
    assert_eq!(reply.status, 400);
    assert_eq!(&reply.body[..], br#"{"error":"unsupported rpc operation 99"}"#);

    assert_eq!(echo.seen.load(Ordering::SeqCst), 0);
    let m = exposition(&metrics);
    assert!(m.contains(r#"narad_node_rpc_streams_rejected_total{reason="too_large"} 1"#), "{m}");
    assert!(m.contains(r#"narad_node_rpc_streams_rejected_total{reason="malformed"} 4"#), "{m}");
    assert!(
        m.contains(
            r#"narad_node_rpc_errors_total{op="unknown",side="server",kind="status_4xx"} 1"#
        ),
        "{m}"
    );
    // The server still serves honest peers.
    let (cli, _) = client(auth);
    assert_eq!(cli.peer(addr, tls::DEFAULT_SERVER_NAME).call(&get("t")).await.unwrap().status, 200);
}

#[tokio::test]
async fn a_connection_that_does_not_authenticate_within_five_seconds_is_closed() {
    let auth = secret("s");
    let (srv, echo, metrics) = server(auth);
    // Half a Hello, then silence (the client's own keep-alives would keep
    // the connection open forever).
    let (_ep, conn) = raw_connection(srv.local_addr().unwrap(), &ClusterAuth::default()).await;
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    send.write_all(&crate::handshake::encode_hello(&[1; 32])[..10]).await.unwrap();
    let start = Instant::now();
    let closed = tokio::time::timeout(AUTH_TIMEOUT * 3, conn.closed()).await.unwrap();
    assert!(
        matches!(closed, quinn::ConnectionError::ApplicationClosed(ref c)
            if c.error_code == VarInt::from_u32(close_code::AUTH_TIMEOUT)),
        "{closed}"
    );
    assert!(start.elapsed() >= AUTH_TIMEOUT - Duration::from_millis(500), "{:?}", start.elapsed());
    assert_eq!(echo.seen.load(Ordering::SeqCst), 0);
    let m = exposition(&metrics);
    assert!(m.contains(r#"side="server",reason="auth_timeout"} 1"#), "{m}");
    assert!(m.contains("narad_node_rpc_unauthenticated_connections 0"), "{m}");
}

#[tokio::test]
async fn an_oversized_request_is_refused_before_it_is_sent() {
    let (srv, echo, _) = server(ClusterAuth::default());
    let (cli, _) = client(ClusterAuth::default());
    let peer = cli.peer(srv.local_addr().unwrap(), tls::DEFAULT_SERVER_NAME);
    let big = Request::CommitProduce(CommitRecord {
        topic: "t".into(),
        key: None,
        partition: 0,
        payload: vec![0u8; FRAME_MAX_PAYLOAD].into(),
        created_at: 0,
        incarnation: None,
    });
    let e = peer.call(&big).await.unwrap_err();
    assert!(matches!(e, Error::FrameTooLarge { .. }), "{e}");
    assert_eq!(echo.seen.load(Ordering::SeqCst), 0);
    // Nothing was dialled for it.
    assert!(peer.conn.lock().await.is_none());
}

#[tokio::test]
async fn a_reply_after_the_stream_failed_reaches_the_waiter_as_an_error() {
    // The server goes away while a request waits.
    let (srv, _, _) = server(ClusterAuth::default());
    let (cli, _) = client(ClusterAuth::default());
    let peer = cli.peer(srv.local_addr().unwrap(), tls::DEFAULT_SERVER_NAME);
    let waiting = tokio::spawn({
        let peer = peer.clone();
        async move { peer.call(&get("slow")).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    srv.endpoint.close(0u32.into(), b"bye");
    let e =
        tokio::time::timeout(Duration::from_secs(3), waiting).await.unwrap().unwrap().unwrap_err();
    assert!(matches!(e, Error::Connection(_)), "{e}");
}

/// A CA and two node certificates (SAN localhost / 127.0.0.1) in a temp dir.
fn mtls_files(dir: &std::path::Path) -> (TlsFiles, TlsFiles) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    std::fs::create_dir_all(dir).unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let node = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let (c, k) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        TlsFiles { cert: c, key: k, ca: dir.join("ca.pem") }
    };
    (node("a"), node("b"))
}

#[tokio::test]
async fn mutual_tls_admits_nodes_of_the_cluster_ca_only() {
    let dir = std::env::temp_dir().join(format!("narad-cluster-mtls-{}", std::process::id()));
    let (a, b) = mtls_files(&dir);
    let (srv, echo, _) = server(tls_only(a));
    let addr = srv.local_addr().unwrap();
    let (cli, _) = client(tls_only(b));
    assert_eq!(cli.peer(addr, "localhost").call(&get("t")).await.unwrap().status, 200);
    // A node with no client certificate does not get through the handshake.
    let (stranger, _) = client(ClusterAuth::default());
    let e = stranger.peer(addr, tls::DEFAULT_SERVER_NAME).call(&get("t")).await.unwrap_err();
    assert!(matches!(e, Error::Dial { .. } | Error::Connection(_)), "{e}");
    assert_eq!(echo.seen.load(Ordering::SeqCst), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unreadable_tls_files_are_a_config_error() {
    let files = TlsFiles {
        cert: "/nonexistent/c".into(),
        key: "/nonexistent/k".into(),
        ca: "/nonexistent/a".into(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let e = Transport::client_only(localhost(), tls_only(files), RpcMetrics::default())
            .unwrap_err();
        assert!(matches!(e, Error::Config(ref m) if m.contains("/nonexistent/c")), "{e}");
    });
}

/// A UDP relay on its own port in front of `target`: what a peer at the
/// relay's address looks like from outside. Aborting the task drops both
/// sockets without a word: the peer vanishes like a killed process, and
/// its address is free for a new one.
async fn relay(target: SocketAddr) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let front = tokio::net::UdpSocket::bind(localhost()).await.unwrap();
    let back = tokio::net::UdpSocket::bind(localhost()).await.unwrap();
    let addr = front.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut a, mut b) = (vec![0u8; 65536], vec![0u8; 65536]);
        let mut client: Option<SocketAddr> = None;
        loop {
            tokio::select! {
                r = front.recv_from(&mut a) => {
                    let Ok((n, from)) = r else { return };
                    client = Some(from);
                    let _ = back.send_to(&a[..n], target).await;
                }
                r = back.recv_from(&mut b) => {
                    let Ok((n, _)) = r else { return };
                    if let Some(c) = client {
                        let _ = front.send_to(&b[..n], c).await;
                    }
                }
            }
        }
    });
    (addr, task)
}

/// Waits (up to 5 s) until `m` counts one probe started by a peer's new
/// connection that ended `outcome`.
async fn probe_counted(m: &RpcMetrics, outcome: &str) {
    let want = format!(
        r#"narad_node_rpc_liveness_probes_total{{trigger="peer_connected",outcome="{outcome}"}} 1"#
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !exposition(m).contains(&want) {
        assert!(Instant::now() < deadline, "no {outcome} probe:\n{}", exposition(m));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_peer_that_connects_anew_gets_its_stale_connection_replaced_before_the_next_call() {
    // `a` talks to the node at `b_addr`; that node then vanishes without
    // closing anything (kill -9), and a new process starts on its address.
    let (a, _, a_metrics) = server(ClusterAuth::default());
    let (b1, _, _) = server(ClusterAuth::default());
    let (b_addr, b1_process) = relay(b1.local_addr().unwrap()).await;
    let to_b = a.peer(b_addr, tls::DEFAULT_SERVER_NAME);
    assert_eq!(to_b.call(&get("before")).await.unwrap().status, 200);
    b1_process.abort();
    let _ = b1_process.await;
    let echo = Arc::new(Echo::default());
    let b2 = Transport::serve(b_addr, ClusterAuth::default(), RpcMetrics::default(), echo.clone())
        .unwrap();
    // The new process connects to `a` (the control plane pings every peer
    // at start): `a` probes its own connection to that address.
    b2.peer(a.local_addr().unwrap(), tls::DEFAULT_SERVER_NAME).ping().await.unwrap();
    probe_counted(&a_metrics, "closed").await;
    // The next call dials the new process (on the stale connection it
    // would wait for the whole budget and time out).
    let reply = to_b.call_with_timeout(&get("after"), Duration::from_secs(3)).await.unwrap();
    assert_eq!((reply.status, &reply.body[..]), (200, &b"after"[..]));
    assert_eq!(echo.seen.load(Ordering::SeqCst), 1);
    // A live peer connecting anew keeps its connection.
    let (c, _, _) = server(ClusterAuth::default());
    let to_c = a.peer(c.local_addr().unwrap(), tls::DEFAULT_SERVER_NAME);
    to_c.ping().await.unwrap();
    c.peer(a.local_addr().unwrap(), tls::DEFAULT_SERVER_NAME).ping().await.unwrap();
    probe_counted(&a_metrics, "alive").await;
}

/// A QUIC server that is not a node: its own self-signed certificate, the
/// ALPNs given, and whatever `serve` does with each connection.
fn impostor_endpoint(alpns: &[&[u8]]) -> quinn::Endpoint {
    let ck = rcgen::generate_simple_self_signed(vec![tls::DEFAULT_SERVER_NAME.to_owned()]).unwrap();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der());
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![ck.cert.der().clone()], key.into())
    .unwrap();
    cfg.alpn_protocols = alpns.iter().map(|a| a.to_vec()).collect();
    let quic = QuicServerConfig::try_from(cfg).unwrap();
    quinn::Endpoint::server(quinn::ServerConfig::with_crypto(Arc::new(quic)), localhost()).unwrap()
}

#[tokio::test]
async fn an_impostor_relaying_a_real_nodes_proof_gets_nothing_from_the_dialling_node() {
    // A real node with the secret, and an impostor (no secret) that relays
    // the handshake between the dialling node and the real one.
    let auth = secret("s");
    let (real, real_echo, _) = server(auth.clone());
    let real_addr = real.local_addr().unwrap();
    let impostor = impostor_endpoint(&[tls::ALPN]);
    let imp_addr = impostor.local_addr().unwrap();
    let relay_auth = ClusterAuth::default();
    let seen_after_hello = Arc::new(Mutex::new(None::<Vec<u8>>));
    let seen = seen_after_hello.clone();
    let task = tokio::spawn(async move {
        let conn = impostor.accept().await.unwrap().await.unwrap();
        let (mut to_victim, mut from_victim) = conn.accept_bi().await.unwrap();
        let mut hello = [0u8; 40];
        from_victim.read_exact(&mut hello).await.unwrap();
        // The impostor's own connection to the real node.
        let (_ep, up) = raw_connection(real_addr, &relay_auth).await;
        let (mut up_send, mut up_recv) = up.open_bi().await.unwrap();
        up_send.write_all(&hello).await.unwrap();
        let proof = crate::handshake::read_proof(&mut up_recv, crate::handshake::Kind::ServerProof)
            .await
            .unwrap();
        let relayed = crate::handshake::encode_proof(crate::handshake::Kind::ServerProof, &proof);
        to_victim.write_all(&relayed).await.unwrap();
        // Whatever the victim sends now, until it gives up.
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(
            Duration::from_secs(3),
            AsyncReadExt::read_to_end(&mut from_victim, &mut rest),
        )
        .await;
        *seen.lock().unwrap() = Some(rest);
    });
    let (victim, metrics) = client(auth.clone());
    let e = victim.peer(imp_addr, tls::DEFAULT_SERVER_NAME).call(&get("secret")).await.unwrap_err();
    assert!(
        matches!(e, Error::Dial { ref reason, .. } if reason.contains("authentication")),
        "{e}"
    );
    task.await.unwrap();
    let rest = seen_after_hello.lock().unwrap().clone().unwrap();
    assert!(rest.is_empty(), "the dialling node sent {} bytes to an impostor", rest.len());
    assert_eq!(real_echo.seen.load(Ordering::SeqCst), 0);
    assert!(exposition(&metrics).contains(r#"side="client",reason="auth"} 1"#));
}

#[tokio::test]
async fn an_impostor_answering_with_its_own_proof_gets_no_request() {
    let impostor = impostor_endpoint(&[tls::ALPN]);
    let addr = impostor.local_addr().unwrap();
    let got = tokio::spawn(async move {
        let conn = impostor.accept().await.unwrap().await.unwrap();
        let (mut send, mut recv) = conn.accept_bi().await.unwrap();
        let _hello = crate::handshake::read_hello(&mut recv).await.unwrap();
        let fake = crate::handshake::Proof {
            nonce: Some([9; 32]),
            macs: vec![[0x42; 32]],
            node_id: "n3".into(),
        };
        send.write_all(&crate::handshake::encode_proof(crate::handshake::Kind::ServerProof, &fake))
            .await
            .unwrap();
        // Any stream or byte the node would send next.
        let next = tokio::time::timeout(Duration::from_secs(3), conn.accept_bi()).await;
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            AsyncReadExt::read_to_end(&mut recv, &mut rest),
        )
        .await;
        (matches!(next, Ok(Ok(_))), rest)
    });
    let (node, _) = client(secret("s"));
    let e = node.peer(addr, tls::DEFAULT_SERVER_NAME).call(&get("t")).await.unwrap_err();
    assert!(matches!(e, Error::Dial { .. }), "{e}");
    let (opened_stream, rest) = got.await.unwrap();
    assert!(!opened_stream, "a request stream was opened to an impostor");
    assert!(rest.is_empty(), "{rest:?}");
}

#[tokio::test]
async fn an_old_node_is_refused_naming_the_version_and_a_new_one_says_the_peer_is_older() {
    let (srv, echo, metrics) = server(secret("s"));
    // A v1 node dials: the handshake completes, the connection is closed
    // with the version it must speak.
    let mut crypto = tls::client_config(None).unwrap();
    crypto.alpn_protocols = vec![tls::ALPN_V1.to_vec()];
    let v1 = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(crypto).unwrap()));
    let ep = quinn::Endpoint::client(localhost()).unwrap();
    let conn = ep
        .connect_with(v1, srv.local_addr().unwrap(), tls::DEFAULT_SERVER_NAME)
        .unwrap()
        .await
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), conn.closed()).await.unwrap() {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code, VarInt::from_u32(close_code::VERSION));
            let reason = String::from_utf8_lossy(&c.reason).into_owned();
            assert!(
                reason.contains("narad-cluster-quic-v1 is no longer served")
                    && reason.contains("narad-cluster-quic-v2"),
                "{reason}"
            );
        }
        other => panic!("{other}"),
    }
    assert!(exposition(&metrics).contains(r#"side="server",reason="version"} 1"#));
    assert_eq!(echo.seen.load(Ordering::SeqCst), 0);
    // A v2 node dials a v1-only peer.
    let old = impostor_endpoint(&[tls::ALPN_V1]);
    let old_addr = old.local_addr().unwrap();
    tokio::spawn(async move {
        while let Some(incoming) = old.accept().await {
            let _ = incoming.await;
        }
    });
    let (cli, _) = client(secret("s"));
    let e = cli.peer(old_addr, tls::DEFAULT_SERVER_NAME).call(&get("t")).await.unwrap_err();
    assert!(e.to_string().contains("does not speak narad-cluster-quic-v2"), "{e}");
}

#[tokio::test]
async fn before_authenticating_a_peer_gets_one_stream_and_a_header_flood_is_eight_bad_bytes() {
    let (srv, echo, metrics) = server(secret("s"));
    let addr = srv.local_addr().unwrap();
    let (_ep, conn) = raw_connection(addr, &ClusterAuth::default()).await;
    let (mut first, _r1) = conn.open_bi().await.unwrap();
    // The server grants no second stream before authentication.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), conn.open_bi()).await.is_err(),
        "a second stream opened before authentication"
    );
    // A frame header announcing 16 MiB where the Hello is due.
    let mut flood = Frame::new(FrameType::NodeRequest, 1, Bytes::new()).encode().unwrap();
    flood[16..20].copy_from_slice(&(FRAME_MAX_PAYLOAD as u32).to_be_bytes());
    flood.extend([0u8; 20]);
    first.write_all(&flood).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(5), conn.closed()).await.unwrap() {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code, VarInt::from_u32(close_code::AUTH_FAILED));
            assert_eq!(&c.reason[..], b"authentication failed", "no hint of what was wrong");
        }
        other => panic!("{other}"),
    }
    assert_eq!(echo.seen.load(Ordering::SeqCst), 0);
    assert!(exposition(&metrics).contains(r#"side="server",reason="malformed"} 1"#));
}

#[tokio::test]
async fn a_source_that_keeps_failing_is_refused_while_a_node_that_authenticated_before_gets_in() {
    let (srv, echo, metrics) = server(secret("right"));
    let addr = srv.local_addr().unwrap();
    let (good, _) = client(secret("right"));
    let to_srv = good.peer(addr, tls::DEFAULT_SERVER_NAME);
    assert_eq!(to_srv.call(&get("t")).await.unwrap().status, 200);
    // Guesses from other ports of the same address spend its budget.
    for _ in 0..crate::limits::AUTH_FAILURE_BURST {
        let (guess, _) = client(ClusterAuth::default());
        assert!(guess.peer(addr, tls::DEFAULT_SERVER_NAME).call(&get("t")).await.is_err());
    }
    let (late, _) = client(secret("right"));
    let e = late.peer(addr, tls::DEFAULT_SERVER_NAME).call(&get("t")).await.unwrap_err();
    assert!(matches!(e, Error::Dial { .. }), "{e}");
    let m = exposition(&metrics);
    assert!(m.contains(r#"side="server",reason="backoff"} 1"#), "{m}");
    // The node that authenticated before reconnects from its address.
    if let Some(c) = to_srv.conn.lock().await.take() {
        c.close(0u32.into(), b"test");
    }
    assert_eq!(to_srv.call(&get("again")).await.unwrap().status, 200);
    assert_eq!(echo.seen.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn connections_not_yet_authenticated_are_capped_per_source() {
    let (srv, _, metrics) = server(secret("s"));
    let addr = srv.local_addr().unwrap();
    let mut held = Vec::new();
    for _ in 0..crate::limits::MAX_UNAUTHENTICATED_PER_SOURCE {
        let (ep, conn) = raw_connection(addr, &ClusterAuth::default()).await;
        held.push((ep, conn));
    }
    let ep = quinn::Endpoint::client(localhost()).unwrap();
    let refused = ep
        .connect_with(
            client_config(&ClusterAuth::default()).unwrap(),
            addr,
            tls::DEFAULT_SERVER_NAME,
        )
        .unwrap()
        .await;
    assert!(refused.is_err(), "a ninth unauthenticated connection was accepted");
    let m = exposition(&metrics);
    assert!(m.contains(r#"side="server",reason="busy"} 1"#), "{m}");
    assert!(m.contains("narad_node_rpc_unauthenticated_connections 8"), "{m}");
}
