//! The one error type of node RPC: malformed frames and requests, and the
//! transport's failures.

use std::time::Duration;

/// Everything that can go wrong in node RPC.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A frame header that does not start with `NRS1`.
    #[error("bad frame magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// A frame version this node does not speak.
    #[error("unsupported frame version {0}")]
    BadVersion(u8),
    /// A frame type outside SPEC §7.4's list.
    #[error("unknown frame type {0}")]
    BadFrameType(u8),
    /// The two reserved header bytes are not zero.
    #[error("frame reserved bytes are {0:#06x}, not zero")]
    BadReserved(u16),
    /// A frame payload over the 16 MiB limit (on write, or announced on read).
    #[error("frame payload of {len} bytes exceeds the {max}-byte limit")]
    FrameTooLarge {
        /// Announced or attempted payload length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// Input that ends before the frame or field it announces.
    #[error("truncated {what}: {need} bytes needed, {have} left")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes it needs.
        need: u64,
        /// Bytes there were.
        have: usize,
    },
    /// An op code this node does not serve (the server answers 400).
    #[error("unsupported rpc operation {0}")]
    UnsupportedOp(u8),
    /// A request or reply with bytes after its last field.
    #[error("{0} trailing bytes after the last field")]
    TrailingBytes(usize),
    /// A field whose value breaks its rule (bool not 0/1, bad UTF-8, ...).
    #[error("invalid {field}: {reason}")]
    InvalidField {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An empty request or an unexpected frame where another was due.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The peer answered with an Error frame.
    #[error("peer error: {0}")]
    Remote(String),
    /// No reply within the op's timeout.
    #[error("no reply to {op} within {after:?}")]
    Timeout {
        /// The op's name.
        op: &'static str,
        /// Its timeout.
        after: Duration,
    },
    /// The peer could not be reached in time.
    #[error("dial {addr}: {reason}")]
    Dial {
        /// The peer's address.
        addr: std::net::SocketAddr,
        /// Why.
        reason: String,
    },
    /// The connection or stream failed or closed.
    #[error("connection: {0}")]
    Connection(String),
    /// Transport configuration (TLS files, certificates, secret) is unusable.
    #[error("cluster transport config: {0}")]
    Config(String),
    /// Socket I/O.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The reply status a server answers a request that failed to decode
    /// with: every decode error is the caller's fault.
    pub fn status(&self) -> u16 {
        match self {
            Error::UnsupportedOp(_)
            | Error::TrailingBytes(_)
            | Error::InvalidField { .. }
            | Error::Truncated { .. }
            | Error::Protocol(_)
            | Error::FrameTooLarge { .. }
            | Error::BadMagic(_)
            | Error::BadVersion(_)
            | Error::BadFrameType(_)
            | Error::BadReserved(_) => 400,
            Error::Timeout { .. } => 504,
            Error::Remote(_) | Error::Dial { .. } | Error::Connection(_) => 502,
            Error::Config(_) | Error::Io(_) => 500,
        }
    }

    /// Whether the failure says the peer could not be reached (no dial, no
    /// reply in time, a connection or stream lost, socket I/O), as opposed
    /// to a peer that answered something this node could not use: such a
    /// failure makes the peer suspect (`suspect.rs`).
    pub fn means_unreachable(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::Dial { .. } | Error::Connection(_) | Error::Io(_) => {
                true
            }
            Error::BadMagic(_)
            | Error::BadVersion(_)
            | Error::BadFrameType(_)
            | Error::BadReserved(_)
            | Error::FrameTooLarge { .. }
            | Error::Truncated { .. }
            | Error::UnsupportedOp(_)
            | Error::TrailingBytes(_)
            | Error::InvalidField { .. }
            | Error::Protocol(_)
            | Error::Remote(_)
            | Error::Config(_) => false,
        }
    }

    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::BadMagic(_)
            | Error::BadVersion(_)
            | Error::BadFrameType(_)
            | Error::BadReserved(_)
            | Error::Truncated { .. }
            | Error::TrailingBytes(_)
            | Error::InvalidField { .. }
            | Error::Protocol(_) => "malformed",
            Error::FrameTooLarge { .. } => "too_large",
            Error::UnsupportedOp(_) => "unsupported_op",
            Error::Remote(_) => "remote",
            Error::Timeout { .. } => "timeout",
            Error::Dial { .. } => "dial",
            Error::Connection(_) | Error::Io(_) => "connection",
            Error::Config(_) => "config",
        }
    }
}

/// Result of node RPC.
pub type Result<T, E = Error> = std::result::Result<T, E>;
