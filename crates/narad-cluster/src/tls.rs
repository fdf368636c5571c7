//! rustls configurations of the QUIC endpoint (ring provider, TLS 1.3,
//! ALPN `narad-cluster-quic-v2`): an ephemeral self-signed server
//! certificate that clients do not verify (the handshake's proofs, bound to
//! this TLS session, authenticate both ends: `handshake.rs`), or mutual TLS
//! against the cluster CA. A server also offers the old
//! `narad-cluster-quic-v1` so that an old node's dial completes far enough
//! to be told, by name, which version it must speak (it is then closed).

use crate::auth::TlsFiles;
use crate::error::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;

/// The ALPN every node RPC connection negotiates.
pub const ALPN: &[u8] = b"narad-cluster-quic-v2";
/// The ALPN of the per-stream static tag (before 2026-12-04): offered by a
/// server only to refuse it by name.
pub const ALPN_V1: &[u8] = b"narad-cluster-quic-v1";
/// The server name clients present when no cluster TLS is configured.
pub const DEFAULT_SERVER_NAME: &str = "narad-cluster";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_err(what: &str) -> impl FnOnce(rustls::Error) -> Error + '_ {
    move |e| Error::Config(format!("{what}: {e}"))
}

struct Loaded {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: Arc<RootCertStore>,
}

fn load(files: &TlsFiles) -> Result<Loaded> {
    let pem = |p: &std::path::Path, e: rustls::pki_types::pem::Error| {
        Error::Config(format!("{}: {e}", p.display()))
    };
    let chain = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| pem(&files.cert, e))?;
    if chain.is_empty() {
        return Err(Error::Config(format!("{}: no certificate", files.cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| pem(&files.key, e))?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(&files.ca).map_err(|e| pem(&files.ca, e))? {
        let ca = ca.map_err(|e| pem(&files.ca, e))?;
        roots.add(ca).map_err(tls_err("cluster CA"))?;
    }
    if roots.is_empty() {
        return Err(Error::Config(format!("{}: no CA certificate", files.ca.display())));
    }
    Ok(Loaded { chain, key, roots: Arc::new(roots) })
}

/// The server side's rustls config.
pub(crate) fn server_config(tls: Option<&TlsFiles>) -> Result<rustls::ServerConfig> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err("tls versions"))?;
    let mut cfg = match tls {
        Some(files) => {
            let l = load(files)?;
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(l.roots, provider())
                    .build()
                    .map_err(|e| Error::Config(format!("client verifier: {e}")))?;
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(l.chain, l.key)
                .map_err(tls_err("cluster cert"))?
        }
        None => {
            let ck = rcgen::generate_simple_self_signed(vec![DEFAULT_SERVER_NAME.to_owned()])
                .map_err(|e| Error::Config(format!("self-signed cert: {e}")))?;
            let key = PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der());
            builder
                .with_no_client_auth()
                .with_single_cert(vec![ck.cert.der().clone()], key.into())
                .map_err(tls_err("self-signed cert"))?
        }
    };
    cfg.alpn_protocols = vec![ALPN.to_vec(), ALPN_V1.to_vec()];
    Ok(cfg)
}

/// The client side's rustls config.
pub(crate) fn client_config(tls: Option<&TlsFiles>) -> Result<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err("tls versions"))?;
    let mut cfg = match tls {
        Some(files) => {
            let l = load(files)?;
            builder
                .with_root_certificates(l.roots)
                .with_client_auth_cert(l.chain, l.key)
                .map_err(tls_err("cluster client cert"))?
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServerCert(provider())))
            .with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}

/// Accepts any server certificate (the server's certificate is ephemeral;
/// the handshake's proof, bound to this TLS session's exporter value, is
/// what authenticates the server: an impostor with its own certificate
/// cannot make one), but still checks the handshake signature against it.
#[derive(Debug)]
struct AnyServerCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
