//! The node-RPC connection handshake (ALPN `narad-cluster-quic-v2`): how
//! two nodes prove to each other that they hold the cluster secret, once
//! per connection, before either sends anything else.
//!
//! After QUIC's TLS 1.3 handshake the dialling node (the client) opens the
//! connection's first bidirectional stream, and these four messages pass
//! on it, in this order; then both ends finish it and the connection
//! carries `NRS1` frames on streams of its own (`frame.rs`).
//!
//! ```text
//! every message starts with an 8-byte header:
//!   magic "NRH2" | version 2 | type | reserved u16 = 0
//!
//! type 1 Hello        C→S  header | client nonce [32]                       (40 bytes)
//! type 2 ServerProof  S→C  header | server nonce [32] | n u8 (0..=2) | n × mac [32]
//!                          | id len u8 (1..=64) | server node id           (≤ 171 bytes)
//! type 3 ClientProof  C→S  header | n u8 (0..=2) | n × mac [32]
//!                          | id len u8 (1..=64) | client node id           (≤ 139 bytes)
//! type 4 Welcome      S→C  header                                           (8 bytes)
//!
//! mac      = HMAC-SHA256(key, role label | exporter | client nonce | server nonce
//!                             | id len | id)
//! label    = "narad-cluster-v2 server proof" or "narad-cluster-v2 client proof"
//! key      = HMAC-SHA256(secret, "narad-cluster-key-v2")
//! exporter = the connection's TLS exporter value (RFC 8446 §7.5, RFC 5705):
//!            label "EXPORTER-narad-cluster-v2", empty context, 32 bytes
//! ```
//!
//! Invariants:
//! - **the server proves first.** A client sends its proof only once the
//!   server's proof verified under one of the client's keys, and sends
//!   nothing else (no request, no Raft message, no record) before Welcome;
//!   a server runs nothing a client sends before the client's proof
//!   verified, and sends Welcome only then.
//! - **nothing captured authenticates anything else.** A mac binds the TLS
//!   session it was made in (the exporter value is unique to a connection's
//!   key exchange), both nonces, the role and the sender's node id: relayed
//!   to another connection, replayed later, or reflected back to its
//!   sender, it does not verify.
//! - **bounded reading.** Every message is fixed-size or bounded by two
//!   macs and a 64-byte id (at most 171 bytes); the reader reads exactly the
//!   bytes each field needs into fixed buffers and allocates nothing from a
//!   length a peer announced.
//! - with no secret (the `--dev` loopback mode, or mutual TLS alone) `n` is
//!   0; a node with a secret requires `n` ≥ 1 and one mac that verifies,
//!   compared in constant time, under one of its keys (the current secret,
//!   and during a rotation the previous one); a node sends one mac per key
//!   it holds (server) or the one mac under the key the server's proof
//!   verified with (client).

use crate::auth::{ClusterAuth, ClusterSecret};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The handshake messages' magic.
pub const MAGIC: [u8; 4] = *b"NRH2";
/// The handshake version (the `v2` of the ALPN).
pub const VERSION: u8 = 2;
/// Bytes of a handshake message header.
pub const HEADER_LEN: usize = 8;
/// Bytes of a nonce and of a mac.
pub const NONCE_LEN: usize = 32;
/// Bytes of a mac (HMAC-SHA256).
pub const MAC_LEN: usize = 32;
/// The most macs a proof carries (current and previous secret).
pub const MAX_MACS: usize = 2;
/// The longest node id (`^[A-Za-z0-9._-]{1,64}$`).
pub const MAX_NODE_ID: usize = 64;
/// The TLS exporter label both ends derive the session binding with.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-narad-cluster-v2";
/// Bytes of the exporter value.
pub const EXPORTER_LEN: usize = 32;
/// What the key is derived from the secret with.
pub const KEY_CONTEXT: &[u8] = b"narad-cluster-key-v2";
const SERVER_LABEL: &[u8] = b"narad-cluster-v2 server proof";
const CLIENT_LABEL: &[u8] = b"narad-cluster-v2 client proof";

/// A handshake message's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Client → server: the client's nonce.
    Hello = 1,
    /// Server → client: the server's nonce, macs and id.
    ServerProof = 2,
    /// Client → server: the client's mac and id.
    ClientProof = 3,
    /// Server → client: the client is authenticated.
    Welcome = 4,
}

/// Why a handshake failed. [`HandshakeError::reason`] is the metrics label.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// Bytes that are not the message due (magic, version, type, reserved
    /// bytes, a count or length out of range, an id that is not a node id).
    #[error("malformed handshake: {0}")]
    Malformed(String),
    /// The peer's proof does not verify under any of this node's keys.
    #[error("the peer's proof does not verify under this node's cluster secret")]
    BadProof,
    /// This node has a secret and the peer proved none.
    #[error("the peer presented no cluster secret proof (is NARAD_CLUSTER_SECRET set on it?)")]
    NoProof,
    /// The stream or connection ended or failed mid-handshake.
    #[error("handshake i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The TLS exporter could not be read.
    #[error("tls exporter: {0}")]
    Exporter(String),
    /// The handshake did not finish within its deadline.
    #[error("no handshake within {0:?}")]
    Timeout(std::time::Duration),
}

impl HandshakeError {
    /// The metrics label (`narad_node_rpc_connections_rejected_total{reason}`).
    pub fn reason(&self) -> &'static str {
        match self {
            HandshakeError::Malformed(_) => "malformed",
            HandshakeError::BadProof | HandshakeError::NoProof => "auth",
            HandshakeError::Io(_) | HandshakeError::Exporter(_) => "connection",
            HandshakeError::Timeout(_) => "auth_timeout",
        }
    }

    /// Whether the failure is the peer's guess at the secret (it counts
    /// against the peer's failure budget).
    pub fn is_failed_proof(&self) -> bool {
        matches!(
            self,
            HandshakeError::BadProof | HandshakeError::NoProof | HandshakeError::Malformed(_)
        )
    }
}

type HResult<T> = Result<T, HandshakeError>;

/// The key a secret proves with.
pub(crate) fn derive_key(secret: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(KEY_CONTEXT);
    mac.finalize().into_bytes().into()
}

/// What both ends bind every proof to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// The connection's TLS exporter value.
    pub exporter: [u8; EXPORTER_LEN],
    /// The client's nonce.
    pub client_nonce: [u8; NONCE_LEN],
    /// The server's nonce.
    pub server_nonce: [u8; NONCE_LEN],
}

/// Which side made a proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The node that accepted the connection.
    Server,
    /// The node that dialled.
    Client,
}

/// A proof's mac under `key`.
pub fn mac(key: &[u8; 32], role: Role, binding: &Binding, node_id: &str) -> [u8; MAC_LEN] {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(match role {
        Role::Server => SERVER_LABEL,
        Role::Client => CLIENT_LABEL,
    });
    m.update(&binding.exporter);
    m.update(&binding.client_nonce);
    m.update(&binding.server_nonce);
    m.update(&[node_id.len() as u8]);
    m.update(node_id.as_bytes());
    m.finalize().into_bytes().into()
}

/// The keys a node proves with and accepts: the current secret's first.
pub(crate) fn keys(auth: &ClusterAuth) -> Vec<[u8; 32]> {
    [auth.secret.as_ref(), auth.previous_secret.as_ref()]
        .into_iter()
        .flatten()
        .map(ClusterSecret::key)
        .collect()
}

/// The index in `keys` of the first key under which one of `macs`
/// verifies (every comparison in constant time, all of them made).
pub fn verify(
    keys: &[[u8; 32]],
    role: Role,
    binding: &Binding,
    node_id: &str,
    macs: &[[u8; MAC_LEN]],
) -> HResult<usize> {
    if keys.is_empty() {
        return Ok(0);
    }
    if macs.is_empty() {
        return Err(HandshakeError::NoProof);
    }
    let mut found = None;
    for (i, key) in keys.iter().enumerate() {
        let expected = mac(key, role, binding, node_id);
        for m in macs {
            if bool::from(expected.ct_eq(m)) && found.is_none() {
                found = Some(i);
            }
        }
    }
    found.ok_or(HandshakeError::BadProof)
}

/// A decoded proof (ServerProof or ClientProof).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// The server's nonce (ServerProof only).
    pub nonce: Option<[u8; NONCE_LEN]>,
    /// The macs (0..=2).
    pub macs: Vec<[u8; MAC_LEN]>,
    /// The sender's node id.
    pub node_id: String,
}

fn header(kind: Kind) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&MAGIC);
    h[4] = VERSION;
    h[5] = kind as u8;
    h
}

/// The Hello message.
pub fn encode_hello(client_nonce: &[u8; NONCE_LEN]) -> Vec<u8> {
    let mut out = header(Kind::Hello).to_vec();
    out.extend_from_slice(client_nonce);
    out
}

/// A ServerProof or ClientProof message.
pub fn encode_proof(kind: Kind, proof: &Proof) -> Vec<u8> {
    debug_assert!(matches!(kind, Kind::ServerProof | Kind::ClientProof));
    debug_assert!(proof.macs.len() <= MAX_MACS);
    debug_assert!((1..=MAX_NODE_ID).contains(&proof.node_id.len()));
    let mut out = header(kind).to_vec();
    if let Some(nonce) = &proof.nonce {
        out.extend_from_slice(nonce);
    }
    out.push(proof.macs.len() as u8);
    for m in &proof.macs {
        out.extend_from_slice(m);
    }
    out.push(proof.node_id.len() as u8);
    out.extend_from_slice(proof.node_id.as_bytes());
    out
}

/// The Welcome message.
pub fn encode_welcome() -> [u8; HEADER_LEN] {
    header(Kind::Welcome)
}

async fn read_array<R: AsyncRead + Unpin, const N: usize>(r: &mut R) -> HResult<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b).await?;
    Ok(b)
}

async fn read_header<R: AsyncRead + Unpin>(r: &mut R, want: Kind) -> HResult<()> {
    let h: [u8; HEADER_LEN] = read_array(r).await?;
    if h[..4] != MAGIC {
        return Err(HandshakeError::Malformed(format!("bad magic {:02x?}", &h[..4])));
    }
    if h[4] != VERSION {
        return Err(HandshakeError::Malformed(format!(
            "handshake version {} (this node speaks {VERSION})",
            h[4]
        )));
    }
    if h[5] != want as u8 {
        return Err(HandshakeError::Malformed(format!(
            "message type {} where {want:?} ({}) was due",
            h[5], want as u8
        )));
    }
    if h[6] != 0 || h[7] != 0 {
        return Err(HandshakeError::Malformed("reserved bytes are not zero".into()));
    }
    Ok(())
}

/// Reads a Hello: its client nonce.
pub async fn read_hello<R: AsyncRead + Unpin>(r: &mut R) -> HResult<[u8; NONCE_LEN]> {
    read_header(r, Kind::Hello).await?;
    read_array(r).await
}

/// Reads a ServerProof (`kind` ServerProof) or a ClientProof.
pub async fn read_proof<R: AsyncRead + Unpin>(r: &mut R, kind: Kind) -> HResult<Proof> {
    read_header(r, kind).await?;
    let nonce = match kind {
        Kind::ServerProof => Some(read_array::<_, NONCE_LEN>(r).await?),
        _ => None,
    };
    let [n] = read_array::<_, 1>(r).await?;
    if n as usize > MAX_MACS {
        return Err(HandshakeError::Malformed(format!("{n} macs (at most {MAX_MACS})")));
    }
    let mut macs = Vec::with_capacity(n as usize);
    for _ in 0..n {
        macs.push(read_array::<_, MAC_LEN>(r).await?);
    }
    let [len] = read_array::<_, 1>(r).await?;
    let len = len as usize;
    if !(1..=MAX_NODE_ID).contains(&len) {
        return Err(HandshakeError::Malformed(format!(
            "node id of {len} bytes (1..={MAX_NODE_ID})"
        )));
    }
    let mut id = [0u8; MAX_NODE_ID];
    r.read_exact(&mut id[..len]).await?;
    let ok = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    if !id[..len].iter().all(ok) {
        return Err(HandshakeError::Malformed("the node id is not ^[A-Za-z0-9._-]+$".into()));
    }
    let node_id = String::from_utf8(id[..len].to_vec()).expect("ASCII checked above");
    Ok(Proof { nonce, macs, node_id })
}

/// Reads a Welcome.
pub async fn read_welcome<R: AsyncRead + Unpin>(r: &mut R) -> HResult<()> {
    read_header(r, Kind::Welcome).await
}

/// Fills `buf` from the operating system's secure random source.
pub(crate) fn random<const N: usize>() -> HResult<[u8; N]> {
    let mut b = [0u8; N];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut b)
        .map_err(|_| HandshakeError::Exporter("no secure random source".into()))?;
    Ok(b)
}

/// What a finished handshake established about the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The node id the peer proved (with a secret) or claimed (without).
    pub node_id: String,
    /// The peer's address.
    pub addr: std::net::SocketAddr,
}

/// The client's side over `send`/`recv`, with the connection's exporter
/// value: Hello, verify the ServerProof, ClientProof, Welcome. Returns the
/// server's node id.
pub async fn client<W, R>(
    send: &mut W,
    recv: &mut R,
    exporter: [u8; EXPORTER_LEN],
    keys: &[[u8; 32]],
    my_id: &str,
) -> HResult<String>
where
    W: AsyncWrite + Unpin,
    R: AsyncRead + Unpin,
{
    let client_nonce = random::<NONCE_LEN>()?;
    send.write_all(&encode_hello(&client_nonce)).await?;
    let server = read_proof(recv, Kind::ServerProof).await?;
    let server_nonce = server.nonce.expect("a ServerProof carries a nonce");
    let binding = Binding { exporter, client_nonce, server_nonce };
    let key = verify(keys, Role::Server, &binding, &server.node_id, &server.macs)?;
    let macs = keys.get(key).map(|k| vec![mac(k, Role::Client, &binding, my_id)]);
    let proof = Proof { nonce: None, macs: macs.unwrap_or_default(), node_id: my_id.to_owned() };
    send.write_all(&encode_proof(Kind::ClientProof, &proof)).await?;
    read_welcome(recv).await?;
    Ok(server.node_id)
}

/// The server's side: read Hello, send the ServerProof, verify the
/// ClientProof, send Welcome. Returns the client's node id.
pub async fn server<W, R>(
    send: &mut W,
    recv: &mut R,
    exporter: [u8; EXPORTER_LEN],
    keys: &[[u8; 32]],
    my_id: &str,
) -> HResult<String>
where
    W: AsyncWrite + Unpin,
    R: AsyncRead + Unpin,
{
    let client_nonce = read_hello(recv).await?;
    let server_nonce = random::<NONCE_LEN>()?;
    let binding = Binding { exporter, client_nonce, server_nonce };
    let macs = keys.iter().map(|k| mac(k, Role::Server, &binding, my_id)).collect();
    let proof = Proof { nonce: Some(server_nonce), macs, node_id: my_id.to_owned() };
    send.write_all(&encode_proof(Kind::ServerProof, &proof)).await?;
    let client = read_proof(recv, Kind::ClientProof).await?;
    verify(keys, Role::Client, &binding, &client.node_id, &client.macs)?;
    send.write_all(&encode_welcome()).await?;
    Ok(client.node_id)
}

#[cfg(test)]
#[path = "handshake_tests.rs"]
mod tests;
