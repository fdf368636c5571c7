//! A peer that is not a node: it binds a downed node's cluster address with
//! its own self-signed certificate and does its worst with what the real
//! nodes send it. It speaks both protocols, written here from their
//! documented bytes (docs/CLUSTER.md), not with the node's code:
//!
//! * `narad-cluster-quic-v1` (the per-stream static tag): it keeps every
//!   Auth tag it is given and answers every request as a successful owner
//!   would (pongs; `200 {"count","offsets"}` to commits; `200 {}` to the
//!   rest), the attack that once made 202'd records vanish;
//! * `narad-cluster-quic-v2` (the connection handshake): with a relay
//!   target it forwards the dialling node's Hello to a real node and the
//!   real node's proof back (the best an impostor without the secret can
//!   do), then takes whatever the dialling node sends next.
//!
//! Everything it is sent is counted in [`Captured`]. It runs on a runtime
//! of its own; dropping it stops it and frees the address.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use tokio::io::AsyncReadExt;

/// The ALPNs of the two protocols.
pub const ALPN_V2: &[u8] = b"narad-cluster-quic-v2";
pub const ALPN_V1: &[u8] = b"narad-cluster-quic-v1";

/// What the impostor was sent.
#[derive(Debug, Default)]
pub struct Captured {
    /// Connections whose QUIC handshake completed, by protocol.
    pub v1_connections: AtomicUsize,
    pub v2_connections: AtomicUsize,
    /// v1 Auth tags (32 bytes each).
    pub v1_tags: Mutex<Vec<Vec<u8>>>,
    /// Node requests it received (any protocol) and answered as a success.
    pub requests: AtomicUsize,
    /// Records in the commits among them.
    pub committed_records: AtomicUsize,
    /// v2: Hellos relayed, and bytes the dialling node sent after its Hello
    /// on the handshake stream (a proof would be one).
    pub v2_hellos: AtomicUsize,
    pub v2_bytes_after_hello: AtomicUsize,
}

/// A running impostor.
pub struct Impostor {
    pub captured: Arc<Captured>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Impostor {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any server certificate (the impostor dials real nodes too).
#[derive(Debug)]
struct AnyCert;

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &[rustls_pki_types::CertificateDer<'_>],
        _: &rustls_pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls_pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        provider().signature_verification_algorithms.supported_schemes()
    }
}

/// A client config offering `alpn`, verifying nothing.
pub fn client_config(alpn: &[u8]) -> quinn::ClientConfig {
    client_config_offering(&[alpn])
}

/// A client config offering every one of `alpns`, verifying nothing.
pub fn client_config_offering(alpns: &[&[u8]]) -> quinn::ClientConfig {
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert))
        .with_no_client_auth();
    cfg.alpn_protocols = alpns.iter().map(|a| a.to_vec()).collect();
    quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(cfg).unwrap()))
}

fn server_config() -> quinn::ServerConfig {
    let ck = rcgen::generate_simple_self_signed(vec!["narad-cluster".to_owned()]).unwrap();
    let key = rustls_pki_types::PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key.into())
        .unwrap();
    cfg.alpn_protocols = vec![ALPN_V2.to_vec(), ALPN_V1.to_vec()];
    quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(cfg).unwrap()))
}

impl Impostor {
    /// Binds `addr` (retrying while the killed node's socket is released)
    /// and serves; with `relay_to`, v2 Hellos are relayed to that node.
    pub fn start(addr: SocketAddr, relay_to: Option<SocketAddr>) -> Impostor {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let captured = Arc::new(Captured::default());
        let endpoint = runtime.block_on(async {
            for _ in 0..100 {
                if let Ok(ep) = quinn::Endpoint::server(server_config(), addr) {
                    return ep;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("the impostor could not bind {addr}");
        });
        let c = captured.clone();
        runtime.spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                let c = c.clone();
                tokio::spawn(async move {
                    let Ok(conn) = incoming.await else { return };
                    let alpn = conn
                        .handshake_data()
                        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
                        .and_then(|d| d.protocol);
                    if alpn.as_deref() == Some(ALPN_V1) {
                        c.v1_connections.fetch_add(1, Ordering::SeqCst);
                        serve_v1(conn, c).await;
                    } else {
                        c.v2_connections.fetch_add(1, Ordering::SeqCst);
                        serve_v2(conn, relay_to, c).await;
                    }
                });
            }
        });
        Impostor { captured, runtime: Some(runtime) }
    }

    /// Runs `f` on the impostor's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.as_ref().unwrap().block_on(f)
    }
}

/// Reads one NRS1 frame: (type, request id, payload), or None at the end.
pub async fn read_v1_frame(r: &mut quinn::RecvStream) -> Option<(u8, u64, Vec<u8>)> {
    let mut h = [0u8; 20];
    r.read_exact(&mut h).await.ok()?;
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    if &h[..4] != b"NRS1" || len > 16 << 20 {
        return None;
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await.ok()?;
    Some((h[5], u64::from_be_bytes(h[8..16].try_into().unwrap()), payload))
}

/// One NRS1 frame.
pub fn v1_frame(kind: u8, id: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = b"NRS1".to_vec();
    f.extend([1, kind, 0, 0]);
    f.extend(id.to_be_bytes());
    f.extend((payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A reply payload: status u16, content type and body (u32 length each).
pub fn reply(status: u16, body: &[u8]) -> Vec<u8> {
    let mut r = status.to_be_bytes().to_vec();
    let ct = b"application/json";
    r.extend((ct.len() as u32).to_be_bytes());
    r.extend_from_slice(ct);
    r.extend((body.len() as u32).to_be_bytes());
    r.extend_from_slice(body);
    r
}

/// Records in a CommitProduceBatch (op 11: u32 count first) or 1 for a
/// CommitProduce (op 10).
fn records_in(request: &[u8]) -> usize {
    match request.first() {
        Some(10) => 1,
        Some(11) if request.len() >= 5 => {
            u32::from_be_bytes(request[1..5].try_into().unwrap()) as usize
        }
        _ => 0,
    }
}

async fn serve_v1(conn: quinn::Connection, c: Arc<Captured>) {
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        let c = c.clone();
        tokio::spawn(async move {
            while let Some((kind, id, payload)) = read_v1_frame(&mut recv).await {
                let out = match kind {
                    10 => {
                        c.v1_tags.lock().unwrap().push(payload);
                        continue;
                    }
                    4 => v1_frame(5, id, &payload),
                    8 => {
                        c.requests.fetch_add(1, Ordering::SeqCst);
                        let n = records_in(&payload);
                        c.committed_records.fetch_add(n, Ordering::SeqCst);
                        let body = if n > 0 {
                            let offsets: Vec<String> = (0..n).map(|i| i.to_string()).collect();
                            format!(r#"{{"count":{n},"offsets":[{}]}}"#, offsets.join(","))
                        } else {
                            "{}".to_owned()
                        };
                        v1_frame(9, id, &reply(200, body.as_bytes()))
                    }
                    _ => return,
                };
                if send.write_all(&out).await.is_err() {
                    return;
                }
            }
        });
    }
}

async fn serve_v2(conn: quinn::Connection, relay_to: Option<SocketAddr>, c: Arc<Captured>) {
    let Ok((mut to_node, mut from_node)) = conn.accept_bi().await else { return };
    let mut hello = [0u8; 40];
    if from_node.read_exact(&mut hello).await.is_err() {
        return;
    }
    c.v2_hellos.fetch_add(1, Ordering::SeqCst);
    if let Some(target) = relay_to {
        // The impostor's own connection to a real node, carrying the Hello.
        let Ok(ep) = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()) else { return };
        let Ok(connecting) = ep.connect_with(client_config(ALPN_V2), target, "narad-cluster")
        else {
            return;
        };
        let Ok(Ok(up)) = tokio::time::timeout(Duration::from_secs(2), connecting).await else {
            return;
        };
        let Ok((mut up_send, mut up_recv)) = up.open_bi().await else { return };
        let _ = up_send.write_all(&hello).await;
        // ServerProof: header 8, nonce 32, n, n macs, id len, id.
        let mut head = [0u8; 41];
        if up_recv.read_exact(&mut head).await.is_err() {
            return;
        }
        let mut proof = head.to_vec();
        let mut macs = vec![0u8; head[40] as usize * 32 + 1];
        if up_recv.read_exact(&mut macs).await.is_err() {
            return;
        }
        proof.extend_from_slice(&macs);
        let mut id = vec![0u8; *macs.last().unwrap() as usize];
        if up_recv.read_exact(&mut id).await.is_err() {
            return;
        }
        proof.extend_from_slice(&id);
        let _ = to_node.write_all(&proof).await;
    } else {
        // A proof of its own making.
        let mut proof = b"NRH2".to_vec();
        proof.extend([2, 2, 0, 0]);
        proof.extend([0x42; 32]);
        proof.push(1);
        proof.extend([0x24; 32]);
        proof.extend([2, b'n', b'3']);
        let _ = to_node.write_all(&proof).await;
    }
    // Whatever the node sends next: a proof on this stream, requests on
    // others (both answered as if they succeeded).
    let streams = {
        let c = c.clone();
        let conn = conn.clone();
        tokio::spawn(async move { serve_v1_streams(conn, c).await })
    };
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(
        Duration::from_secs(3),
        AsyncReadExt::read_to_end(&mut from_node, &mut rest),
    )
    .await;
    c.v2_bytes_after_hello.fetch_add(rest.len(), Ordering::SeqCst);
    if !rest.is_empty() {
        let _ = to_node.write_all(b"NRH2\x02\x04\x00\x00").await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(3), streams).await;
}

async fn serve_v1_streams(conn: quinn::Connection, c: Arc<Captured>) {
    serve_v1(conn, c).await
}
