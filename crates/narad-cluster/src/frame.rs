//! The `NRS1` frame of node RPC (SPEC §7.4): every message on a QUIC
//! stream is one frame.
//!
//! ```text
//! offset size field
//!      0    4 magic        "NRS1"
//!      4    1 version      1
//!      5    1 type         3 Error | 4 Ping | 5 Pong | 8 NodeRequest |
//!                          9 NodeReply
//!      6    2 reserved     0
//!      8    8 request id   u64, big-endian
//!     16    4 len          u32, big-endian, <= 16 MiB
//!     20  len payload
//! ```
//!
//! Invariants:
//! - every integer is big-endian; the header is exactly 20 bytes;
//! - `len` is checked against [`FRAME_MAX_PAYLOAD`] on write (nothing is
//!   written) and on read right after the header; the reader's buffer then
//!   grows only as payload bytes arrive (by at most [`READ_CHUNK`] beyond
//!   what has arrived), never to a length a peer merely announced;
//! - magic, version, type and the reserved bytes are all checked: a header
//!   that breaks any of them is refused whole;
//! - an Error frame's payload is a u16 length and that many bytes of UTF-8;
//!   Ping and Pong carry whatever the sender put in (echoed back);
//! - the request id pairs a NodeReply (or Error) with its NodeRequest on
//!   the same stream;
//! - type 10 (the per-stream Auth frame of `narad-cluster-quic-v1`) is gone:
//!   a connection authenticates once, before any frame (`handshake.rs`).

use crate::error::{Error, Result};
use crate::limits::{FRAME_HEADER_LEN, FRAME_MAX_PAYLOAD};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The frame magic.
pub const MAGIC: [u8; 4] = *b"NRS1";
/// The only frame version.
pub const VERSION: u8 = 1;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameType {
    /// An error about the request id (u16 length + message).
    Error = 3,
    /// Liveness probe; answered with Pong carrying the same payload.
    Ping = 4,
    /// Answer to Ping.
    Pong = 5,
    /// An encoded [`crate::rpc::Request`].
    NodeRequest = 8,
    /// An encoded [`crate::rpc::Reply`].
    NodeReply = 9,
}

impl FrameType {
    /// The type of a wire byte.
    pub fn from_u8(b: u8) -> Result<Self> {
        Ok(match b {
            3 => FrameType::Error,
            4 => FrameType::Ping,
            5 => FrameType::Pong,
            8 => FrameType::NodeRequest,
            9 => FrameType::NodeReply,
            other => return Err(Error::BadFrameType(other)),
        })
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the payload is.
    pub kind: FrameType,
    /// Pairs replies with requests.
    pub request_id: u64,
    /// Payload bytes that follow (already checked against the limit).
    pub len: u32,
}

impl Header {
    /// The 20 header bytes.
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut h = [0u8; FRAME_HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC);
        h[4] = VERSION;
        h[5] = self.kind as u8;
        h[8..16].copy_from_slice(&self.request_id.to_be_bytes());
        h[16..20].copy_from_slice(&self.len.to_be_bytes());
        h
    }

    /// Checks every header field, the length limit included.
    pub fn decode(h: &[u8; FRAME_HEADER_LEN]) -> Result<Header> {
        let magic: [u8; 4] = [h[0], h[1], h[2], h[3]];
        if magic != MAGIC {
            return Err(Error::BadMagic(magic));
        }
        if h[4] != VERSION {
            return Err(Error::BadVersion(h[4]));
        }
        let kind = FrameType::from_u8(h[5])?;
        let reserved = u16::from_be_bytes([h[6], h[7]]);
        if reserved != 0 {
            return Err(Error::BadReserved(reserved));
        }
        let request_id = u64::from_be_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
        let len = u32::from_be_bytes([h[16], h[17], h[18], h[19]]);
        check_len(len as u64)?;
        Ok(Header { kind, request_id, len })
    }
}

fn check_len(len: u64) -> Result<()> {
    if len > FRAME_MAX_PAYLOAD as u64 {
        return Err(Error::FrameTooLarge { len, max: FRAME_MAX_PAYLOAD });
    }
    Ok(())
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What the payload is.
    pub kind: FrameType,
    /// Pairs replies with requests.
    pub request_id: u64,
    /// The payload.
    pub payload: Bytes,
}

impl Frame {
    /// A frame (its size is checked when it is encoded).
    pub fn new(kind: FrameType, request_id: u64, payload: impl Into<Bytes>) -> Frame {
        Frame { kind, request_id, payload: payload.into() }
    }

    /// An Error frame carrying `message` (cut to 65,535 bytes on a char boundary).
    pub fn error(request_id: u64, message: &str) -> Frame {
        let mut end = message.len().min(u16::MAX as usize);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let mut p = Vec::with_capacity(2 + end);
        p.extend_from_slice(&(end as u16).to_be_bytes());
        p.extend_from_slice(&message.as_bytes()[..end]);
        Frame::new(FrameType::Error, request_id, p)
    }

    /// The message of an Error frame's payload.
    pub fn error_message(payload: &[u8]) -> Result<String> {
        let Some((len, rest)) = payload.split_first_chunk::<2>() else {
            return Err(Error::Truncated {
                what: "error message length",
                need: 2,
                have: payload.len(),
            });
        };
        let len = u16::from_be_bytes(*len) as usize;
        if rest.len() < len {
            return Err(Error::Truncated {
                what: "error message",
                need: len as u64,
                have: rest.len(),
            });
        }
        if rest.len() > len {
            return Err(Error::TrailingBytes(rest.len() - len));
        }
        String::from_utf8(rest.to_vec())
            .map_err(|e| Error::InvalidField { field: "error message", reason: e.to_string() })
    }

    /// Header and payload, appended to `out`; nothing is appended when the
    /// payload is over the limit.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<()> {
        check_len(self.payload.len() as u64)?;
        let header =
            Header { kind: self.kind, request_id: self.request_id, len: self.payload.len() as u32 };
        out.reserve(FRAME_HEADER_LEN + self.payload.len());
        out.extend_from_slice(&header.encode());
        out.extend_from_slice(&self.payload);
        Ok(())
    }

    /// Header and payload as one buffer.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// One frame from the front of `buf`, and the bytes it took.
    pub fn decode(buf: &[u8]) -> Result<(Frame, usize)> {
        let Some(h) = buf.first_chunk::<FRAME_HEADER_LEN>() else {
            return Err(Error::Truncated {
                what: "frame header",
                need: FRAME_HEADER_LEN as u64,
                have: buf.len(),
            });
        };
        let header = Header::decode(h)?;
        let rest = &buf[FRAME_HEADER_LEN..];
        let len = header.len as usize;
        if rest.len() < len {
            return Err(Error::Truncated {
                what: "frame payload",
                need: len as u64,
                have: rest.len(),
            });
        }
        let frame =
            Frame::new(header.kind, header.request_id, Bytes::copy_from_slice(&rest[..len]));
        Ok((frame, FRAME_HEADER_LEN + len))
    }
}

/// How much a frame reader's buffer may grow ahead of the payload bytes
/// that have arrived.
pub const READ_CHUNK: usize = 64 << 10;

/// Reads one frame. `Ok(None)` is a clean end of stream at a frame
/// boundary; an end inside a frame is [`Error::Truncated`]. The payload
/// buffer grows as its bytes arrive, [`READ_CHUNK`] at a time: a header
/// announcing 16 MiB followed by nothing costs 64 KiB, not 16 MiB.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>> {
    let mut h = [0u8; FRAME_HEADER_LEN];
    let mut got = 0;
    while got < FRAME_HEADER_LEN {
        let n = r.read(&mut h[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(Error::Truncated {
                what: "frame header",
                need: FRAME_HEADER_LEN as u64,
                have: got,
            });
        }
        got += n;
    }
    let header = Header::decode(&h)?;
    let len = header.len as usize;
    let mut payload = bytes::BytesMut::new();
    while payload.len() < len {
        let want = (len - payload.len()).min(READ_CHUNK);
        payload.reserve(want);
        let n = (&mut *r).take(want as u64).read_buf(&mut payload).await?;
        if n == 0 {
            return Err(Error::Truncated {
                what: "frame payload",
                need: header.len as u64,
                have: payload.len(),
            });
        }
    }
    Ok(Some(Frame::new(header.kind, header.request_id, payload.freeze())))
}

/// Writes one frame as a single write; an oversized payload writes nothing.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &Frame) -> Result<()> {
    let buf = frame.encode()?;
    w.write_all(&buf).await?;
    Ok(())
}

/// Writes one frame whose payload is `chunks` in order, without copying
/// them: QUIC keeps each chunk until the peer acknowledges it, so a
/// commit's record payloads go from the caller's buffers straight into
/// packets. An oversized payload writes nothing.
pub async fn write_frame_chunks(
    send: &mut quinn::SendStream,
    kind: FrameType,
    request_id: u64,
    chunks: Vec<Bytes>,
) -> Result<()> {
    let len = chunks.iter().map(Bytes::len).sum::<usize>();
    check_len(len as u64)?;
    let header = Header { kind, request_id, len: len as u32 };
    let mut all = Vec::with_capacity(chunks.len() + 1);
    all.push(Bytes::copy_from_slice(&header.encode()));
    all.extend(chunks);
    send.write_all_chunks(&mut all).await.map_err(|e| Error::Io(e.into()))
}

#[cfg(test)]
#[path = "frame_tests.rs"]
mod tests;
