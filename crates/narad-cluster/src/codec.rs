//! The field encoding shared by requests and replies (SPEC §7.4): integers
//! big-endian, string and bytes as a u32 length and the data, bool as one
//! byte 0 or 1. The decoder checks every length against the bytes left
//! before copying, so nothing is allocated from an unchecked length.

use crate::error::{Error, Result};
use bytes::{Bytes, BytesMut};

/// `Bytes` fields at least this long are sent as shared chunks (a
/// reference to the caller's buffer) instead of being copied into the
/// encoded request; shorter ones are copied (a chunk costs more than
/// copying a few hundred bytes).
pub(crate) const SHARE_MIN_BYTES: usize = 512;

/// Appends fields to a buffer.
///
/// The encoding is a sequence of chunks: runs of fields written here, and
/// large `Bytes` fields ([`Enc::shared`]) kept as references to the
/// caller's buffers, so a commit of 8 MiB of payloads is sent without
/// copying them (quinn keeps the chunks until the peer acknowledges them).
/// Concatenated, the chunks are exactly what [`Enc::bytes`] alone would
/// have written.
#[derive(Debug, Default)]
pub(crate) struct Enc {
    /// Fields written since the last shared chunk.
    buf: BytesMut,
    /// The encoding before `buf`.
    chunks: Vec<Bytes>,
}

impl Enc {
    /// An encoder whose field buffer starts with `capacity` bytes (the
    /// fields other than shared chunks, so the buffer is not regrown).
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Enc { buf: BytesMut::with_capacity(capacity), chunks: Vec::new() }
    }
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.extend_from_slice(&[v]);
        self
    }
    pub(crate) fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }
    pub(crate) fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// A u32 length and the bytes. Callers keep fields far below 4 GiB (the
    /// frame limit is 16 MiB and is checked when the frame is written).
    pub(crate) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        self.buf.extend_from_slice(v);
        self
    }
    /// The same bytes on the wire as [`Enc::bytes`]; from
    /// [`SHARE_MIN_BYTES`] on, `v` becomes a chunk of its own (a reference,
    /// not a copy).
    pub(crate) fn shared(&mut self, v: &Bytes) -> &mut Self {
        if v.len() < SHARE_MIN_BYTES {
            return self.bytes(v);
        }
        self.u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        // `split` hands over the written fields and keeps the rest of the
        // buffer's capacity for the fields that follow.
        self.chunks.push(self.buf.split().freeze());
        self.chunks.push(v.clone());
        self
    }
    pub(crate) fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
    /// The encoding as chunks (never empty chunks, at least one chunk).
    pub(crate) fn into_chunks(mut self) -> Vec<Bytes> {
        if !self.buf.is_empty() || self.chunks.is_empty() {
            self.chunks.push(self.buf.freeze());
        }
        self.chunks
    }
}

/// Chunks as one buffer.
pub(crate) fn concat(chunks: &[Bytes]) -> Vec<u8> {
    let mut out = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
    for c in chunks {
        out.extend_from_slice(c);
    }
    out
}

/// Reads fields from the front of a buffer.
#[derive(Debug)]
pub(crate) struct Dec<'a> {
    buf: &'a [u8],
}

impl<'a> Dec<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Dec { buf }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(Error::Truncated { what, need: n as u64, have: self.buf.len() });
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn bool(&mut self, what: &'static str) -> Result<bool> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(Error::InvalidField {
                field: what,
                reason: format!("bool byte {b}, not 0 or 1"),
            }),
        }
    }
    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }
    pub(crate) fn i32(&mut self, what: &'static str) -> Result<i32> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }
    pub(crate) fn i64(&mut self, what: &'static str) -> Result<i64> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }
    /// A length-prefixed field; the length is checked against what is left.
    pub(crate) fn bytes(&mut self, what: &'static str) -> Result<Bytes> {
        let len = self.u32(what)? as usize;
        Ok(Bytes::copy_from_slice(self.take(len, what)?))
    }
    pub(crate) fn string(&mut self, what: &'static str) -> Result<String> {
        let len = self.u32(what)? as usize;
        let raw = self.take(len, what)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|e| Error::InvalidField { field: what, reason: e.to_string() })
    }
    /// Ends decoding: bytes left over are an error.
    pub(crate) fn finish(self) -> Result<()> {
        if self.buf.is_empty() { Ok(()) } else { Err(Error::TrailingBytes(self.buf.len())) }
    }
}
