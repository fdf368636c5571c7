//! Native TLS on the HTTP listener (rustls on the `ring` provider).
//!
//! [`server_config`] loads the PEM certificate chain and key, and for
//! mutual TLS a CA bundle that client certificates must chain to; ALPN
//! offers `h2` and `http/1.1` (axum's connection builder serves either).
//! [`TlsListener`] accepts TCP connections on a task of its own and runs
//! each handshake on its own task (with a deadline: `http.read_timeout`),
//! so a slow or hostile client never holds up the accept loop (a connection
//! counts against `http.max_connections` from its TCP accept); finished
//! handshakes are handed to the HTTP server through a channel, which then
//! serves them exactly like plain connections ([`crate::conn`]: the same
//! read, write and idle timeouts and head bound).

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::debug;

use crate::accept::{ConnLimit, Limited};

/// Finished handshakes waiting for the HTTP server.
const ACCEPT_QUEUE: usize = 256;

fn certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{key} ({}): {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{key} ({}): {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{key} ({}): no certificate found", path.display()));
    }
    Ok(certs)
}

/// The rustls server configuration; errors name the config key.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certs(cert, "http.tls_cert_file")?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("http.tls_key_file ({}): {e}", key.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in certs(ca, "http.tls_client_ca_file")? {
                roots
                    .add(c)
                    .map_err(|e| format!("http.tls_client_ca_file ({}): {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("http.tls_client_ca_file ({}): {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("http.tls_cert_file / http.tls_key_file: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A listener whose connections are TLS streams.
#[derive(Debug)]
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(Limited<TlsStream<TcpStream>>, SocketAddr)>,
    acceptor: JoinHandle<()>,
}

impl TlsListener {
    /// Starts accepting on `tcp` with `config`, within `limit`; a client has
    /// `handshake_timeout` to finish its handshake.
    pub fn new(
        tcp: TcpListener,
        config: Arc<rustls::ServerConfig>,
        handshake_timeout: Duration,
        limit: ConnLimit,
    ) -> io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(ACCEPT_QUEUE);
        let tls = TlsAcceptor::from(config);
        let acceptor = tokio::spawn(async move {
            loop {
                // The slot is held from the TCP accept: a handshake in
                // progress holds a descriptor too.
                let (stream, peer, permit) = limit.accept(&tcp).await;
                let (tls, tx) = (tls.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(handshake_timeout, tls.accept(stream)).await {
                        Ok(Ok(s)) => {
                            let _ = tx.send((Limited::new(s, permit), peer)).await;
                        }
                        Ok(Err(e)) => debug!(%peer, error = %e, "tls handshake failed"),
                        Err(_) => debug!(%peer, "tls handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { local, ready, acceptor })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = Limited<TlsStream<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept task is gone (never while the listener lives).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}
