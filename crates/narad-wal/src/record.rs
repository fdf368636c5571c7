//! WAL record encoding: what one accepted produce looks like inside a frame.
//!
//! # Layout (big-endian)
//!
//! Format 1:
//! ```text
//! 0x01 | u32 topic_len | topic (UTF-8) | u32 key_len | key | u32 partition
//!      | u64 accepted_at_ms | u32 payload_len | payload
//! ```
//! Format 2 (a topic with an incarnation id) adds the id after the topic:
//! ```text
//! 0x02 | u32 topic_len | topic | u64 incarnation | u32 key_len | key | ...
//! ```
//! `key_len = 0xFFFF_FFFF` means "no key" (a keyless produce); `key_len = 0`
//! is a present, empty key. The two are different and both round-trip.
//!
//! # Invariants
//! * The decoder is strict: every length is checked against the bytes that
//!   remain before anything is sliced, the lengths must add up to exactly the
//!   record's size, and the topic must be UTF-8. Anything else, including an
//!   unknown format byte, is a [`RecordError`], which the WAL turns into a
//!   corruption error naming segment and offset.
//! * Decoding allocates nothing: key, topic and payload are slices of the
//!   frame's `Bytes`.

use bytes::{BufMut, Bytes};

use crate::limits::{MAX_RECORD_BYTES, MAX_TOPIC_BYTES};

/// Format byte of a record without an incarnation id.
pub const FORMAT_1: u8 = 0x01;
/// Format byte of a record carrying the topic's incarnation id.
pub const FORMAT_2: u8 = 0x02;

const NO_KEY: u32 = u32::MAX;

/// A record to append, borrowed from the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// The topic's name.
    pub topic: &'a str,
    /// The incarnation id of the topic the payload was validated against;
    /// `Some` writes format 2.
    pub incarnation: Option<u64>,
    /// The key; `None` for a keyless produce.
    pub key: Option<&'a [u8]>,
    /// The partition chosen at accept time.
    pub partition: u32,
    /// Accept time, ms since the Unix epoch.
    pub accepted_at_ms: u64,
    /// The message body.
    pub payload: &'a [u8],
}

/// A decoded record; its byte fields share the frame's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalRecord {
    /// The WAL sequence number of the record.
    pub seq: u64,
    /// The format byte it was written with.
    pub format: u8,
    topic: Bytes,
    /// The incarnation id (format 2 only).
    pub incarnation: Option<u64>,
    /// The key, `None` for a keyless produce.
    pub key: Option<Bytes>,
    /// The partition chosen at accept time.
    pub partition: u32,
    /// Accept time, ms since the Unix epoch.
    pub accepted_at_ms: u64,
    /// The message body.
    pub payload: Bytes,
}

impl WalRecord {
    /// The topic's name.
    pub fn topic(&self) -> &str {
        // Checked to be UTF-8 when the record was decoded.
        std::str::from_utf8(&self.topic).unwrap_or_default()
    }
}

/// Why a record could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The encoded record would exceed [`MAX_RECORD_BYTES`].
    #[error("record of {size} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// The size the record would have.
        size: u64,
        /// The limit.
        max: u32,
    },
    /// The topic name is empty or longer than 255 bytes.
    #[error("topic name of {0} bytes is out of range 1..=255")]
    BadTopic(usize),
    /// Unknown format byte.
    #[error("unknown record format byte {0:#04x}")]
    UnknownFormat(u8),
    /// A length runs past the end of the record, or bytes are left over.
    #[error("record is malformed: {0}")]
    Malformed(&'static str),
}

impl RecordRef<'_> {
    /// The size of the encoded record, or an error if it is not encodable.
    pub fn encoded_len(&self) -> Result<u32, RecordError> {
        if self.topic.is_empty() || self.topic.len() > MAX_TOPIC_BYTES {
            return Err(RecordError::BadTopic(self.topic.len()));
        }
        let size = 1
            + 4
            + self.topic.len() as u64
            + if self.incarnation.is_some() { 8 } else { 0 }
            + 4
            + self.key.map_or(0, |k| k.len() as u64)
            + 4
            + 8
            + 4
            + self.payload.len() as u64;
        if size > u64::from(MAX_RECORD_BYTES) {
            return Err(RecordError::TooLarge { size, max: MAX_RECORD_BYTES });
        }
        Ok(size as u32)
    }

    /// Appends the encoded record to `out`. The caller checked
    /// [`RecordRef::encoded_len`] first.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let format = if self.incarnation.is_some() { FORMAT_2 } else { FORMAT_1 };
        out.put_u8(format);
        out.put_u32(self.topic.len() as u32);
        out.put_slice(self.topic.as_bytes());
        if let Some(id) = self.incarnation {
            out.put_u64(id);
        }
        match self.key {
            Some(k) => {
                out.put_u32(k.len() as u32);
                out.put_slice(k);
            }
            None => out.put_u32(NO_KEY),
        }
        out.put_u32(self.partition);
        out.put_u64(self.accepted_at_ms);
        out.put_u32(self.payload.len() as u32);
        out.put_slice(self.payload);
    }
}

/// A cursor over a record's bytes that checks every length.
struct Cursor<'a> {
    bytes: &'a Bytes,
    pos: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<Bytes, RecordError> {
        if self.bytes.len() - self.pos < n {
            return Err(RecordError::Malformed(what));
        }
        let out = self.bytes.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, RecordError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, RecordError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(&b);
        Ok(u64::from_be_bytes(a))
    }
}

/// Decodes a record of either format. `bytes` is exactly one frame payload.
pub fn decode(seq: u64, bytes: &Bytes) -> Result<WalRecord, RecordError> {
    let mut c = Cursor { bytes, pos: 0 };
    let format = c.take(1, "missing format byte")?[0];
    if format != FORMAT_1 && format != FORMAT_2 {
        return Err(RecordError::UnknownFormat(format));
    }
    let topic_len = c.u32("truncated topic length")? as usize;
    if topic_len == 0 || topic_len > MAX_TOPIC_BYTES {
        return Err(RecordError::BadTopic(topic_len));
    }
    let topic = c.take(topic_len, "topic runs past the record")?;
    if std::str::from_utf8(&topic).is_err() {
        return Err(RecordError::Malformed("topic is not UTF-8"));
    }
    let incarnation = if format == FORMAT_2 { Some(c.u64("truncated incarnation")?) } else { None };
    let key = match c.u32("truncated key length")? {
        NO_KEY => None,
        n => Some(c.take(n as usize, "key runs past the record")?),
    };
    let partition = c.u32("truncated partition")?;
    let accepted_at_ms = c.u64("truncated accept time")?;
    let payload_len = c.u32("truncated payload length")? as usize;
    let payload = c.take(payload_len, "payload runs past the record")?;
    if c.pos != bytes.len() {
        return Err(RecordError::Malformed("trailing bytes after the payload"));
    }
    Ok(WalRecord { seq, format, topic, incarnation, key, partition, accepted_at_ms, payload })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Format 1, key "k1", partition 2, accepted at 1700000000123 ms.
    const GOLDEN_FORMAT_1: &[u8] = &[
        0x01, // format
        0, 0, 0, 6, b'o', b'r', b'd', b'e', b'r', b's', // topic
        0, 0, 0, 2, b'k', b'1', // key
        0, 0, 0, 2, // partition
        0, 0, 0x01, 0x8B, 0xCF, 0xE5, 0x68, 0x7B, // accepted_at_ms
        0, 0, 0, 5, b'h', b'e', b'l', b'l', b'o', // payload
    ];

    /// Format 2, incarnation 0x0102030405060708, no key, partition 0.
    const GOLDEN_FORMAT_2_NO_KEY: &[u8] = &[
        0x02, // format
        0, 0, 0, 1, b't', // topic
        1, 2, 3, 4, 5, 6, 7, 8, // incarnation
        0xFF, 0xFF, 0xFF, 0xFF, // no key
        0, 0, 0, 0, // partition
        0, 0, 0, 0, 0, 0, 0, 9, // accepted_at_ms
        0, 0, 0, 2, b'{', b'}', // payload
    ];

    fn encode(r: &RecordRef<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        r.encode_into(&mut out);
        assert_eq!(out.len() as u32, r.encoded_len().unwrap());
        out
    }

    #[test]
    fn format_1_matches_golden_bytes_and_decodes_them() {
        let r = RecordRef {
            topic: "orders",
            incarnation: None,
            key: Some(b"k1"),
            partition: 2,
            accepted_at_ms: 1_700_000_000_123,
            payload: b"hello",
        };
        assert_eq!(encode(&r), GOLDEN_FORMAT_1);
        let d = decode(7, &Bytes::from_static(GOLDEN_FORMAT_1)).unwrap();
        assert_eq!(d.seq, 7);
        assert_eq!(d.format, FORMAT_1);
        assert_eq!(d.topic(), "orders");
        assert_eq!(d.incarnation, None);
        assert_eq!(d.key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(d.partition, 2);
        assert_eq!(d.accepted_at_ms, 1_700_000_000_123);
        assert_eq!(&d.payload[..], b"hello");
    }

    #[test]
    fn format_2_matches_golden_bytes_and_decodes_them() {
        let r = RecordRef {
            topic: "t",
            incarnation: Some(0x0102_0304_0506_0708),
            key: None,
            partition: 0,
            accepted_at_ms: 9,
            payload: b"{}",
        };
        assert_eq!(encode(&r), GOLDEN_FORMAT_2_NO_KEY);
        let d = decode(0, &Bytes::from_static(GOLDEN_FORMAT_2_NO_KEY)).unwrap();
        assert_eq!(d.format, FORMAT_2);
        assert_eq!(d.incarnation, Some(0x0102_0304_0506_0708));
        assert_eq!(d.key, None);
        assert_eq!(&d.payload[..], b"{}");
    }

    #[test]
    fn no_key_and_empty_key_are_different_and_both_round_trip() {
        for key in [None, Some(&b""[..]), Some(&b"x"[..])] {
            let r = RecordRef {
                topic: "t",
                incarnation: None,
                key,
                partition: 1,
                accepted_at_ms: 1,
                payload: b"p",
            };
            let d = decode(0, &Bytes::from(encode(&r))).unwrap();
            assert_eq!(d.key.as_deref(), key);
        }
    }

    #[test]
    fn decoder_rejects_every_truncation_and_trailing_bytes() {
        for golden in [GOLDEN_FORMAT_1, GOLDEN_FORMAT_2_NO_KEY] {
            for cut in 0..golden.len() {
                assert!(decode(0, &Bytes::copy_from_slice(&golden[..cut])).is_err(), "cut {cut}");
            }
            let mut long = golden.to_vec();
            long.push(0);
            assert!(decode(0, &Bytes::from(long)).is_err());
        }
    }

    #[test]
    fn decoder_rejects_unknown_formats() {
        for f in [0u8, 3, 0xFF] {
            let mut b = GOLDEN_FORMAT_1.to_vec();
            b[0] = f;
            assert_eq!(decode(0, &Bytes::from(b)), Err(RecordError::UnknownFormat(f)));
        }
    }

    #[test]
    fn decoder_never_trusts_a_huge_length() {
        let mut b = GOLDEN_FORMAT_1.to_vec();
        b[17..21].copy_from_slice(&u32::MAX.to_be_bytes()[..]); // key_len at offset 11
        b[11..15].copy_from_slice(&0xFFFF_FFFEu32.to_be_bytes());
        assert!(matches!(decode(0, &Bytes::from(b)), Err(RecordError::Malformed(_))));
    }

    #[test]
    fn encoder_refuses_oversized_records_and_bad_topics() {
        let big = vec![0u8; MAX_RECORD_BYTES as usize];
        let r = RecordRef {
            topic: "t",
            incarnation: None,
            key: None,
            partition: 0,
            accepted_at_ms: 0,
            payload: &big,
        };
        assert!(matches!(r.encoded_len(), Err(RecordError::TooLarge { .. })));
        let long = "x".repeat(256);
        let r = RecordRef { topic: &long, payload: b"", ..r };
        assert_eq!(r.encoded_len(), Err(RecordError::BadTopic(256)));
    }
}
