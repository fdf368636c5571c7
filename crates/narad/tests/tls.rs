//! Native TLS on the HTTP listener: a round trip with a generated
//! certificate (HTTP/1.1, and HTTP/2 offered by ALPN), mutual TLS refusing
//! clients without a certificate from the CA, the CLI over HTTPS, and the
//! same connection timeouts as plain HTTP.

mod common;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{ADMIN_PASSWORD, Opts, Server, run_cli};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA and PEM files signed by it, written under `dir`.
struct Pki {
    ca_pem: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    names: &[&str],
    dir: &Path,
    stem: &str,
) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, stem);
    let cert = p.signed_by(&key, issuer).unwrap();
    let (c, k) = (dir.join(format!("{stem}.pem")), dir.join(format!("{stem}.key")));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

fn pki(dir: &Path) -> Pki {
    let ca = ca("narad test CA");
    let ca_pem = dir.join("ca.pem");
    std::fs::write(&ca_pem, ca.pem()).unwrap();
    let (server_cert, server_key) = leaf(&ca, &["localhost", "127.0.0.1"], dir, "server");
    let (client_cert, client_key) = leaf(&ca, &["client"], dir, "client");
    Pki { ca_pem, server_cert, server_key, client_cert, client_key }
}

fn tls_server(name: &str, mtls: bool) -> (Server, Pki) {
    tls_server_with(name, mtls, &[])
}

fn tls_server_with(name: &str, mtls: bool, env: &[(&str, &str)]) -> (Server, Pki) {
    let dir = common::temp_dir(&format!("{name}-pki"));
    let pki = pki(&dir);
    let mut args = vec![
        "--tls-cert".to_owned(),
        pki.server_cert.display().to_string(),
        "--tls-key".to_owned(),
        pki.server_key.display().to_string(),
    ];
    if mtls {
        args.extend(["--tls-client-ca".to_owned(), pki.ca_pem.display().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut opts = Opts { tls: true, ..Opts::secure().args(&args) };
    for (k, v) in env {
        opts = opts.env(k, v);
    }
    let s = Server::start_opts(name, opts);
    (s, pki)
}

fn pem_certs(path: &Path) -> Vec<ureq::tls::Certificate<'static>> {
    let pem = std::fs::read(path).unwrap();
    ureq::tls::parse_pem(&pem)
        .filter_map(|i| match i.unwrap() {
            ureq::tls::PemItem::Certificate(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// An HTTPS client trusting `ca`, presenting `client` if given.
fn agent(ca: &Path, client: Option<(&Path, &Path)>) -> ureq::Agent {
    let mut tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::new_with_certs(&pem_certs(ca)));
    if let Some((cert, key)) = client {
        let key = ureq::tls::PrivateKey::from_pem(&std::fs::read(key).unwrap()).unwrap();
        tls = tls.client_cert(Some(ureq::tls::ClientCert::new_with_certs(&pem_certs(cert), key)));
    }
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .tls_config(tls.build())
        .build()
        .new_agent()
}

fn basic() -> String {
    use base64::Engine as _;
    let pair = format!("admin:{ADMIN_PASSWORD}");
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
}

/// A TLS client stream to the server, trusting `ca`, offering `offer`.
fn tls_client(
    port: u16,
    ca: &Path,
    offer: &[&[u8]],
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for c in pem_certs(ca) {
        roots.add(rustls_pki_types::CertificateDer::from(c.der().to_vec())).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = offer.iter().map(|p| p.to_vec()).collect();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    rustls::StreamOwned::new(conn, sock)
}

/// The ALPN protocol the server picks when the client offers `offer`.
fn negotiated_alpn(port: u16, ca: &Path, offer: &[&[u8]]) -> Option<Vec<u8>> {
    let mut tls = tls_client(port, ca, offer);
    if offer.contains(&&b"h2"[..]) {
        // The HTTP/2 connection preface and an empty SETTINGS frame.
        tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .unwrap();
        let mut frame = [0u8; 9];
        tls.read_exact(&mut frame).unwrap();
        assert_eq!(frame[3], 4, "the server answers with an HTTP/2 SETTINGS frame");
    } else {
        tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut reply = String::new();
        let _ = tls.read_to_string(&mut reply);
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    }
    tls.conn.alpn_protocol().map(<[u8]>::to_vec)
}

#[test]
fn https_round_trip_with_a_generated_certificate() {
    let (s, pki) = tls_server("tls", false);
    assert!(s.base.starts_with("https://"));
    let a = agent(&pki.ca_pem, None);
    let mut r = a.get(format!("{}/healthz", s.base)).call().unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.body_mut().read_to_string().unwrap(), "{\"status\":\"ok\"}\n");
    let r = a.get(format!("{}/v1/topics", s.base)).call().unwrap();
    assert_eq!(r.status(), 401, "TLS does not replace authentication");
    let r = a
        .post(format!("{}/v1/topics", s.base))
        .header("Authorization", basic())
        .send(r#"{"name":"secure"}"#)
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = a
        .post(format!("{}/v1/topics/secure/produce?partition=0", s.base))
        .header("Authorization", basic())
        .send("over tls")
        .unwrap();
    assert_eq!(r.status(), 202);
    let mut r = a
        .get(format!("{}/v1/topics/secure/consume?wait=5s", s.base))
        .header("Authorization", basic())
        .call()
        .unwrap();
    assert_eq!(r.status(), 200);
    let m: serde_json::Value =
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(m["payload"], "over tls");

    assert_eq!(
        negotiated_alpn(s.port, &pki.ca_pem, &[b"h2", b"http/1.1"]).as_deref(),
        Some(&b"h2"[..])
    );
    assert_eq!(
        negotiated_alpn(s.port, &pki.ca_pem, &[b"http/1.1"]).as_deref(),
        Some(&b"http/1.1"[..])
    );

    // A client that does not trust the CA refuses the server.
    let other = common::temp_dir("tls-other-ca");
    let stranger = ca("another CA");
    std::fs::write(other.join("ca.pem"), stranger.pem()).unwrap();
    assert!(agent(&other.join("ca.pem"), None).get(format!("{}/healthz", s.base)).call().is_err());

    // The CLI over HTTPS.
    let ca = pki.ca_pem.display().to_string();
    let (code, out, err) = run_cli(
        &["topic", "ls", "-s", &s.base, "--ca-cert", &ca],
        &[("NARAD_USER", "admin"), ("NARAD_PASSWORD", ADMIN_PASSWORD)],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("secure"), "{out}");
}

#[test]
fn mutual_tls_refuses_clients_without_a_certificate_from_the_ca() {
    let (s, pki) = tls_server("mtls", true);
    let url = format!("{}/healthz", s.base);
    let e = agent(&pki.ca_pem, None).get(&url).call();
    assert!(e.is_err(), "no client certificate: refused in the handshake");
    let other = common::temp_dir("mtls-other-ca");
    let stranger = ca("another CA");
    let (cert, key) = leaf(&stranger, &["intruder"], &other, "intruder");
    let e = agent(&pki.ca_pem, Some((&cert, &key))).get(&url).call();
    assert!(e.is_err(), "a certificate from another CA: refused");
    let ok = agent(&pki.ca_pem, Some((&pki.client_cert, &pki.client_key)));
    assert_eq!(ok.get(&url).call().unwrap().status(), 200);
    let r =
        ok.get(format!("{}/v1/topics", s.base)).header("Authorization", basic()).call().unwrap();
    assert_eq!(r.status(), 200, "mTLS and Basic auth together");
}

/// Reads until the peer closes (EOF, reset, or a TLS close); panics if it
/// is still open after the stream's 15 s read timeout.
fn wait_closed(r: &mut impl std::io::Read) {
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!("connection still open: {e}")
            }
            Err(_) => return,
        }
    }
}

#[test]
fn tls_connections_are_held_to_the_same_read_and_idle_timeouts() {
    let (s, pki) = tls_server_with(
        "tls-timeouts",
        false,
        &[
            ("NARAD_HTTP_READ_TIMEOUT", "1s"),
            ("NARAD_HTTP_IDLE_TIMEOUT", "2s"),
            ("NARAD_HTTP_WRITE_TIMEOUT", "4s"),
            ("NARAD_HTTP_MAX_CONSUME_WAIT", "1s"),
        ],
    );
    let (read, idle) = (Duration::from_secs(1), Duration::from_secs(2));
    // No handshake at all: closed once the read timeout passes.
    let t = Instant::now();
    let mut raw = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    wait_closed(&mut raw);
    assert!(t.elapsed() >= read * 3 / 4, "no-handshake connection closed after {:?}", t.elapsed());
    // A handshake, then a request head that never ends.
    let mut tls = tls_client(s.port, &pki.ca_pem, &[b"http/1.1"]);
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHo").unwrap();
    let t = Instant::now();
    wait_closed(&mut tls);
    assert!(t.elapsed() >= read * 3 / 4, "slow head closed after {:?}", t.elapsed());
    // One request, answered; then idle until the idle timeout.
    let mut tls = tls_client(s.port, &pki.ca_pem, &[b"http/1.1"]);
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut buf = [0u8; 512];
    let n = tls.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    let t = Instant::now();
    wait_closed(&mut tls);
    assert!(t.elapsed() >= idle * 3 / 4, "idle TLS connection closed after {:?}", t.elapsed());
}
