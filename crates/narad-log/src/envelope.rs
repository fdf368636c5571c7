//! The record envelope: what one record of a partition log holds.
//!
//! # Byte layout (version 3, the one narad writes)
//!
//! ```text
//! off  size  field
//! 0    1     version = 0x03
//! 1    1..5  key tag, unsigned LEB128 varint:
//!              0      no key
//!              n + 1  a key of n bytes (n = 0 is a present, empty key)
//! ..   n     key bytes
//! ..   8     commit time, u64 big-endian, milliseconds since the Unix epoch
//! ..   rest  payload (its length is the record length minus the above)
//! ```
//!
//! The record's total length is not in the envelope: the frame payload
//! prefixes every record with a u32 length (see [`crate::frame`]).
//!
//! # Why not SPEC's version 2
//!
//! SPEC §5.2's keyed envelope `0x02 | uvarint keyLen | key | u64 committedAt |
//! payload` cannot tell a present, empty key from no key at all, which the
//! partition log must (issue 3). Version 3 changes only the key field, and
//! takes a new version byte so that no reader ever misreads one layout as the
//! other. Version 2 records are still decoded (a zero length reads as "no
//! key", as Narad v3.1 stores keyless records); any other version byte is
//! corruption.
//!
//! # Invariants
//!
//! * Decoding is strict: the varint is minimal and at most 5 bytes, the key fits
//!   the record, the commit time is present, and every length is checked
//!   against [`crate::limits`] before use. Key and payload are zero-copy
//!   slices of the record's buffer.

use bytes::{BufMut, Bytes};

use crate::limits::{MAX_KEY_BYTES, MAX_KEY_TAG_LEN, MAX_RECORD_BYTES};

/// The envelope version narad writes.
pub const ENVELOPE_VERSION: u8 = 0x03;

/// SPEC §5.2's envelope version, decoded for compatibility, never written.
pub const ENVELOPE_VERSION_V2: u8 = 0x02;

/// A decoded envelope: zero-copy slices of the record buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The key: `None` if the record has none; `Some(empty)` for an empty key.
    pub key: Option<Bytes>,
    /// Commit time in milliseconds since the Unix epoch.
    pub commit_time_ms: u64,
    /// The payload.
    pub payload: Bytes,
}

/// Why an envelope failed to decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// The record is shorter than its fixed fields.
    #[error("record of {0} bytes is too short for an envelope")]
    TooShort(usize),
    /// The version byte is not one this reader knows.
    #[error("unknown envelope version {0:#04x}")]
    UnknownVersion(u8),
    /// The key tag varint is malformed or too long.
    #[error("malformed key length varint")]
    BadVarint,
    /// The key is longer than allowed or than the record.
    #[error("key of {len} bytes does not fit (record {record} bytes, limit {limit})")]
    BadKeyLength {
        /// The key length the record claims.
        len: u64,
        /// The record's length.
        record: usize,
        /// The key length limit.
        limit: u64,
    },
}

/// The number of bytes [`encode_into`] writes for this record.
pub fn encoded_len(key: Option<&[u8]>, payload_len: usize) -> usize {
    1 + varint_len(key_tag(key)) + key.map_or(0, <[u8]>::len) + 8 + payload_len
}

fn key_tag(key: Option<&[u8]>) -> u64 {
    key.map_or(0, |k| k.len() as u64 + 1)
}

/// Appends the version-3 envelope of a record to `out`.
///
/// The caller has checked the key and record sizes against
/// [`crate::limits`]; this asserts it.
pub fn encode_into(out: &mut Vec<u8>, key: Option<&[u8]>, commit_time_ms: u64, payload: &[u8]) {
    let key_len = key.map_or(0, <[u8]>::len) as u64;
    assert!(key_len <= MAX_KEY_BYTES, "key of {key_len} bytes passed the commit checks");
    assert!(
        key_len + payload.len() as u64 <= MAX_RECORD_BYTES,
        "record of {} bytes passed the commit checks",
        key_len + payload.len() as u64
    );
    out.put_u8(ENVELOPE_VERSION);
    put_varint(out, key_tag(key));
    if let Some(k) = key {
        out.put_slice(k);
    }
    out.put_u64(commit_time_ms);
    out.put_slice(payload);
}

/// Decodes one record's envelope; key and payload are slices of `record`.
pub fn decode(record: &Bytes) -> Result<Envelope, EnvelopeError> {
    let len = record.len();
    if len < 1 {
        return Err(EnvelopeError::TooShort(len));
    }
    let version = record[0];
    if version != ENVELOPE_VERSION && version != ENVELOPE_VERSION_V2 {
        return Err(EnvelopeError::UnknownVersion(version));
    }
    let (tag, tag_len) = read_varint(&record[1..])?;
    let key_len = if version == ENVELOPE_VERSION { tag.saturating_sub(1) } else { tag };
    let key_start = 1 + tag_len;
    let bad_key = EnvelopeError::BadKeyLength { len: key_len, record: len, limit: MAX_KEY_BYTES };
    if key_len > MAX_KEY_BYTES {
        return Err(bad_key);
    }
    // key_len ≤ 16 MiB, so the sum cannot overflow.
    let key_end = key_start + key_len as usize;
    if key_end + 8 > len {
        return Err(if key_start + 8 > len { EnvelopeError::TooShort(len) } else { bad_key });
    }
    let key = match (version, tag) {
        (ENVELOPE_VERSION, 0) | (ENVELOPE_VERSION_V2, 0) => None,
        _ => Some(record.slice(key_start..key_end)),
    };
    let mut time = [0u8; 8];
    time.copy_from_slice(&record[key_end..key_end + 8]);
    Ok(Envelope {
        key,
        commit_time_ms: u64::from_be_bytes(time),
        payload: record.slice(key_end + 8..),
    })
}

/// Reads only the commit time of an envelope (used by delay-gated reads and
/// retention, which need no payload).
pub fn commit_time_of(record: &[u8]) -> Result<u64, EnvelopeError> {
    let len = record.len();
    if len < 1 {
        return Err(EnvelopeError::TooShort(len));
    }
    let version = record[0];
    if version != ENVELOPE_VERSION && version != ENVELOPE_VERSION_V2 {
        return Err(EnvelopeError::UnknownVersion(version));
    }
    let (tag, tag_len) = read_varint(&record[1..])?;
    let key_len = if version == ENVELOPE_VERSION { tag.saturating_sub(1) } else { tag };
    if key_len > MAX_KEY_BYTES {
        return Err(EnvelopeError::BadKeyLength {
            len: key_len,
            record: len,
            limit: MAX_KEY_BYTES,
        });
    }
    let key_end = 1 + tag_len + key_len as usize;
    if key_end + 8 > len {
        return Err(EnvelopeError::TooShort(len));
    }
    let mut time = [0u8; 8];
    time.copy_from_slice(&record[key_end..key_end + 8]);
    Ok(u64::from_be_bytes(time))
}

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads an unsigned LEB128 varint of at most [`MAX_KEY_TAG_LEN`] bytes.
fn read_varint(buf: &[u8]) -> Result<(u64, usize), EnvelopeError> {
    let mut v: u64 = 0;
    for (i, &b) in buf.iter().take(MAX_KEY_TAG_LEN).enumerate() {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            // A final zero byte after the first is a non-minimal encoding.
            if b == 0 && i > 0 {
                return Err(EnvelopeError::BadVarint);
            }
            return Ok((v, i + 1));
        }
    }
    Err(if buf.len() < MAX_KEY_TAG_LEN {
        EnvelopeError::TooShort(buf.len() + 1)
    } else {
        EnvelopeError::BadVarint
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(key: Option<&[u8]>, t: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_into(&mut out, key, t, payload);
        assert_eq!(out.len(), encoded_len(key, payload.len()));
        out
    }

    /// Golden bytes: the three key states of version 3, checked in.
    #[test]
    fn envelope_golden_bytes_distinguish_absent_empty_and_present_keys() {
        let t = 0x0000_0191_2345_6789; // 2024-08-… in ms
        let absent: &[u8] = &[0x03, 0x00, 0, 0, 0x01, 0x91, 0x23, 0x45, 0x67, 0x89, b'h', b'i'];
        let empty: &[u8] = &[0x03, 0x01, 0, 0, 0x01, 0x91, 0x23, 0x45, 0x67, 0x89, b'h', b'i'];
        let present: &[u8] =
            &[0x03, 0x03, b'k', b'1', 0, 0, 0x01, 0x91, 0x23, 0x45, 0x67, 0x89, b'h', b'i'];
        assert_eq!(enc(None, t, b"hi"), absent);
        assert_eq!(enc(Some(b""), t, b"hi"), empty);
        assert_eq!(enc(Some(b"k1"), t, b"hi"), present);

        let d = decode(&Bytes::from_static(absent)).unwrap();
        assert_eq!((d.key, d.commit_time_ms, &d.payload[..]), (None, t, &b"hi"[..]));
        let d = decode(&Bytes::from_static(empty)).unwrap();
        assert_eq!(d.key.as_deref(), Some(&b""[..]));
        let d = decode(&Bytes::from_static(present)).unwrap();
        assert_eq!(d.key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(commit_time_of(present).unwrap(), t);
    }

    /// SPEC §5.2's version 2 (as Narad writes it) still decodes.
    #[test]
    fn spec_version_2_envelope_decodes() {
        let v2: &[u8] = &[0x02, 0x02, b'k', b'1', 0, 0, 0, 0, 0, 0, 0x03, 0xe8, b'p'];
        let d = decode(&Bytes::from_static(v2)).unwrap();
        assert_eq!(d.key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(d.commit_time_ms, 1000);
        assert_eq!(&d.payload[..], b"p");
        let keyless: &[u8] = &[0x02, 0x00, 0, 0, 0, 0, 0, 0, 0x03, 0xe8];
        let d = decode(&Bytes::from_static(keyless)).unwrap();
        assert_eq!((d.key, d.payload.len()), (None, 0));
    }

    #[test]
    fn long_keys_use_multi_byte_tags_and_round_trip() {
        for len in [126usize, 127, 128, 300, 20_000] {
            let key = vec![b'x'; len];
            let bytes = Bytes::from(enc(Some(&key), 7, b"payload"));
            let d = decode(&bytes).unwrap();
            assert_eq!(d.key.as_deref(), Some(&key[..]));
            assert_eq!(&d.payload[..], b"payload");
        }
    }

    #[test]
    fn malformed_envelopes_are_refused_not_panicked_on() {
        let cases: &[&[u8]] = &[
            &[],
            &[0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &[0x03],
            &[0x03, 0x00, 1, 2, 3],
            &[0x03, 0x05, b'a', 0, 0, 0, 0, 0, 0, 0, 0],
            &[0x03, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0, 0, 0, 0, 0, 0, 0],
            &[0x03, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 0, 0, 0, 0],
            &[0x03, 0x80, 0x00, 0, 0, 0, 0, 0, 0, 0, 0],
        ];
        for c in cases {
            assert!(decode(&Bytes::copy_from_slice(c)).is_err(), "{c:?}");
            assert!(commit_time_of(c).is_err(), "{c:?}");
        }
    }
}
