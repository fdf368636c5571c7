//! Frames: the unit a partition log writes, syncs, verifies and reads.
//!
//! # Byte layout (all integers big-endian, SPEC §5.2)
//!
//! ```text
//! off  size  field
//! 0    2     magic CA FE
//! 2    1     flags: bits 0-2 codec (0 none, 1 zstd); bits 3-7 reserved, zero
//! 3    4     record count, i32 > 0
//! 7    8     base offset (offset of the first record), i64 ≥ 0
//! 15   4     uncompressed payload size, i32
//! 19   4     stored payload size, i32 (= uncompressed size for codec none)
//! 23   4     CRC32C (Castagnoli) over bytes [2, 23) and the stored payload,
//!            seeded with the segment's [`FrameSeed`]
//! 27   n     stored payload = codec( Σ [u32 record length][record envelope] )
//! ```
//!
//! A record envelope is described in [`crate::envelope`].
//!
//! # The seed
//!
//! A frame's CRC starts from its segment's seed: the CRC32C of the log's
//! salt, 64 bits from the operating system's random source kept in every
//! segment header (see [`crate::segment`]) and never shown to anyone. A
//! client can put bytes shaped like a frame, with a CRC computed by the
//! public algorithm, into a record's payload; without the salt that CRC
//! fails (but for a 2^-32 chance per forgery), so recovery's and the read
//! path's look-ahead for valid frames behind damage cannot be steered by
//! payload bytes. A segment written before segments had headers (format 1)
//! has no salt: its frames use [`FrameSeed::UNSALTED`], a plain CRC32C.
//!
//! # Invariants
//!
//! * Both sizes are at most [`MAX_FRAME_BYTES`]: refused on write (before
//!   anything reaches the file) and on read (before anything is allocated).
//! * The count is at least 1 and small enough that `count` minimal records
//!   fit in the uncompressed size.
//! * Decoding is exact: the decompressed length equals the uncompressed
//!   size, every record length is within bounds and inside the payload, the
//!   records add up to the payload exactly, and there are exactly `count`.
//! * The reserved flag bits are zero; a frame with any of them set (a future
//!   format) is refused as corrupt rather than misread.
//!
//! # What a crash may leave behind
//!
//! A frame is written with one `write_all_at` and becomes durable with the
//! `fdatasync` of its commit cycle. A crash before that sync may leave any
//! prefix of the frame, with holes; the CRC covers every byte after the
//! magic, so such a frame never verifies. Recovery (see [`crate::recovery`])
//! decides what to do with it.

use std::fmt;

use bytes::{BufMut, Bytes};

use crate::envelope::{self, Envelope, EnvelopeError};
use crate::limits::{
    FRAME_HEADER_LEN, MAX_ENVELOPE_LEN, MAX_FRAME_BYTES, MAX_FRAME_RECORDS_READ, MIN_ENVELOPE_LEN,
    MIN_RECORD_WIRE_LEN,
};

/// The two magic bytes that open every frame.
pub const FRAME_MAGIC: [u8; 2] = [0xCA, 0xFE];

/// The CRC32C state every frame CRC of a segment starts from: the CRC of
/// the segment's salt (computed once, so sealing or checking a frame costs
/// no byte more than an unsalted CRC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameSeed(u32);

impl FrameSeed {
    /// The seed of format 1 segments, which have no salt: a plain CRC32C
    /// (continuing from 0 is the CRC32C of the bytes alone).
    pub const UNSALTED: FrameSeed = FrameSeed(0);

    /// The seed of a segment whose header holds `salt`.
    pub fn of_salt(salt: u64) -> FrameSeed {
        FrameSeed(crc32c::crc32c(&salt.to_be_bytes()))
    }
}

/// A fresh salt for a log, from the operating system's random source.
pub fn new_salt() -> std::io::Result<u64> {
    getrandom::u64().map_err(|e| std::io::Error::other(format!("no randomness for a salt: {e}")))
}

const CODEC_MASK: u8 = 0b0000_0111;
const CODEC_NONE: u8 = 0;
const CODEC_ZSTD: u8 = 1;

/// How a log compresses its frame payloads. Readers follow each frame's flag,
/// so a log's codec can change between opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Codec {
    /// Stored as is (the server default, SPEC §5.2).
    #[default]
    None,
    /// zstd at the given level (1..=22; 3 is zstd's default).
    Zstd {
        /// The compression level.
        level: i32,
    },
}

impl Codec {
    fn flag(self) -> u8 {
        match self {
            Codec::None => CODEC_NONE,
            Codec::Zstd { .. } => CODEC_ZSTD,
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::None => f.write_str("none"),
            Codec::Zstd { level } => write!(f, "zstd (level {level})"),
        }
    }
}

/// Why a frame (or its header) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first two bytes are not `CA FE`.
    #[error("bad magic {0:02x}{1:02x}")]
    BadMagic(u8, u8),
    /// Unknown codec or reserved flag bits set.
    #[error("unknown frame flags {0:#04x}")]
    BadFlags(u8),
    /// A header field is out of its bounds.
    #[error("bad frame header: {0}")]
    BadHeader(String),
    /// A payload size over [`MAX_FRAME_BYTES`].
    #[error("frame {what} size {len} is more than the {max} allowed")]
    TooLarge {
        /// Which size.
        what: &'static str,
        /// The size.
        len: u64,
        /// The bound.
        max: u64,
    },
    /// The CRC does not match.
    #[error("CRC mismatch: header says {expected:#010x}, bytes give {actual:#010x}")]
    Crc {
        /// The CRC in the header.
        expected: u32,
        /// The CRC of the bytes.
        actual: u32,
    },
    /// Compression or decompression failed.
    #[error("codec: {0}")]
    Codec(String),
    /// The records do not add up to the payload.
    #[error("bad records: {0}")]
    Records(String),
    /// A record's envelope failed to decode.
    #[error("record {index}: {source}")]
    Envelope {
        /// The record's index in the frame.
        index: u32,
        /// Why.
        #[source]
        source: EnvelopeError,
    },
}

/// A parsed frame header. Parsing checks every bound; the CRC is checked
/// against the payload separately ([`FrameHeader::check_crc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The codec flag (0 none, 1 zstd).
    pub codec: u8,
    /// Number of records, ≥ 1.
    pub count: u32,
    /// Offset of the first record.
    pub base_offset: u64,
    /// Payload size after decompression.
    pub uncompressed_len: u32,
    /// Payload size as stored.
    pub stored_len: u32,
    /// The CRC32C from the header.
    pub crc: u32,
}

impl FrameHeader {
    /// Parses and bound-checks the 27 header bytes.
    pub fn parse(b: &[u8; FRAME_HEADER_LEN]) -> Result<FrameHeader, FrameError> {
        if b[0..2] != FRAME_MAGIC {
            return Err(FrameError::BadMagic(b[0], b[1]));
        }
        let flags = b[2];
        let codec = flags & CODEC_MASK;
        if flags & !CODEC_MASK != 0 || (codec != CODEC_NONE && codec != CODEC_ZSTD) {
            return Err(FrameError::BadFlags(flags));
        }
        let count = i32::from_be_bytes(b[3..7].try_into().expect("4 bytes"));
        let base = i64::from_be_bytes(b[7..15].try_into().expect("8 bytes"));
        let uncompressed = i32::from_be_bytes(b[15..19].try_into().expect("4 bytes"));
        let stored = i32::from_be_bytes(b[19..23].try_into().expect("4 bytes"));
        let crc = u32::from_be_bytes(b[23..27].try_into().expect("4 bytes"));
        if count <= 0 || count as u64 > MAX_FRAME_RECORDS_READ {
            return Err(FrameError::BadHeader(format!("record count {count}")));
        }
        if base < 0 {
            return Err(FrameError::BadHeader(format!("base offset {base}")));
        }
        for (what, len) in [("uncompressed", uncompressed), ("stored", stored)] {
            if len < 0 {
                return Err(FrameError::BadHeader(format!("{what} size {len}")));
            }
            if len as u64 > MAX_FRAME_BYTES {
                return Err(FrameError::TooLarge { what, len: len as u64, max: MAX_FRAME_BYTES });
            }
        }
        if (count as u64) * (MIN_RECORD_WIRE_LEN as u64) > uncompressed as u64 {
            return Err(FrameError::BadHeader(format!(
                "{count} records cannot fit in {uncompressed} bytes"
            )));
        }
        if codec == CODEC_NONE && stored != uncompressed {
            return Err(FrameError::BadHeader(format!(
                "uncompressed frame with stored size {stored} ≠ {uncompressed}"
            )));
        }
        Ok(FrameHeader {
            codec,
            count: count as u32,
            base_offset: base as u64,
            uncompressed_len: uncompressed as u32,
            stored_len: stored as u32,
            crc,
        })
    }

    /// Header plus stored payload, in bytes.
    pub fn frame_len(&self) -> u64 {
        FRAME_HEADER_LEN as u64 + u64::from(self.stored_len)
    }

    /// The offset after the last record of the frame.
    pub fn end_offset(&self) -> u64 {
        self.base_offset + u64::from(self.count)
    }

    /// Checks the CRC over the header bytes `[2, 23)` and the stored payload,
    /// seeded with the frame's segment's `seed`.
    pub fn check_crc(
        &self,
        seed: FrameSeed,
        header: &[u8; FRAME_HEADER_LEN],
        stored: &[u8],
    ) -> Result<(), FrameError> {
        let actual = crc32c::crc32c_append(crc_start(seed, header), stored);
        if actual == self.crc {
            Ok(())
        } else {
            Err(FrameError::Crc { expected: self.crc, actual })
        }
    }
}

/// The CRC of the covered header bytes from `seed`, to be continued over
/// the payload.
pub fn crc_start(seed: FrameSeed, header: &[u8; FRAME_HEADER_LEN]) -> u32 {
    crc32c::crc32c_append(seed.0, &header[2..23])
}

/// Builds the uncompressed payload of one frame, record by record.
///
/// The buffer starts with room for the frame header, so an uncompressed
/// frame is finished in place: no second buffer, no copy of the payload.
#[derive(Debug, Default)]
pub struct PayloadBuilder {
    /// `FRAME_HEADER_LEN` bytes for the header (once a record is pushed),
    /// then the payload.
    buf: Vec<u8>,
    count: u32,
}

impl PayloadBuilder {
    /// An empty payload.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty payload with room for `payload_bytes` of records (sum their
    /// [`PayloadBuilder::wire_len`]) and the header, allocated once.
    pub fn with_capacity(payload_bytes: usize) -> Self {
        PayloadBuilder { buf: Vec::with_capacity(FRAME_HEADER_LEN + payload_bytes), count: 0 }
    }

    /// The bytes one record adds to the payload (length prefix included).
    pub fn wire_len(key: Option<&[u8]>, payload_len: usize) -> usize {
        4 + envelope::encoded_len(key, payload_len)
    }

    /// Appends one record.
    pub fn push(&mut self, key: Option<&[u8]>, commit_time_ms: u64, payload: &[u8]) {
        let len = envelope::encoded_len(key, payload.len());
        assert!(len as u64 <= MAX_ENVELOPE_LEN, "envelope of {len} bytes passed the commit checks");
        if self.buf.is_empty() {
            self.buf.reserve(FRAME_HEADER_LEN + 4 + len);
            self.buf.resize(FRAME_HEADER_LEN, 0);
        }
        self.buf.reserve(4 + len);
        self.buf.put_u32(len as u32);
        envelope::encode_into(&mut self.buf, key, commit_time_ms, payload);
        self.count += 1;
    }

    /// Records so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Payload bytes so far.
    pub fn len(&self) -> usize {
        self.buf.len().saturating_sub(FRAME_HEADER_LEN)
    }

    fn payload(&self) -> &[u8] {
        self.buf.get(FRAME_HEADER_LEN..).unwrap_or(&[])
    }

    /// Whether no record was pushed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Encodes the frame (header and stored payload) at `base_offset`,
    /// sealed with `seed`: the same bytes as [`encode_frame`] of the
    /// payload. Uncompressed, the header is written into the room kept for
    /// it.
    pub fn finish(
        mut self,
        base_offset: u64,
        codec: Codec,
        seed: FrameSeed,
    ) -> Result<Vec<u8>, FrameError> {
        if codec != Codec::None {
            return encode_frame(base_offset, self.count, self.payload(), codec, seed);
        }
        check_frame(base_offset, self.count, self.len())?;
        let header = frame_header(codec, self.count, base_offset, self.len(), self.payload(), seed);
        self.buf[..FRAME_HEADER_LEN].copy_from_slice(&header);
        Ok(self.buf)
    }
}

/// The header of a frame of `count` records at `base_offset` whose payload
/// is `uncompressed` bytes before the codec and `stored` after it.
fn frame_header(
    codec: Codec,
    count: u32,
    base_offset: u64,
    uncompressed: usize,
    stored: &[u8],
    seed: FrameSeed,
) -> [u8; FRAME_HEADER_LEN] {
    let mut header = [0u8; FRAME_HEADER_LEN];
    let mut w = &mut header[..];
    w.put_slice(&FRAME_MAGIC);
    w.put_u8(codec.flag());
    w.put_i32(count as i32);
    w.put_i64(base_offset as i64);
    w.put_i32(uncompressed as i32);
    w.put_i32(stored.len() as i32);
    let crc = crc32c::crc32c_append(crc_start(seed, &header), stored);
    header[23..27].copy_from_slice(&crc.to_be_bytes());
    header
}

/// The checks [`encode_frame`] makes before encoding anything.
fn check_frame(base_offset: u64, count: u32, payload_len: usize) -> Result<(), FrameError> {
    if payload_len as u64 > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            what: "uncompressed",
            len: payload_len as u64,
            max: MAX_FRAME_BYTES,
        });
    }
    if count == 0 || base_offset > i64::MAX as u64 {
        return Err(FrameError::BadHeader(format!("count {count}, base offset {base_offset}")));
    }
    Ok(())
}

/// Encodes a frame from an uncompressed payload of `count` records, sealed
/// with `seed`. Refuses (before writing anything) a payload over
/// [`MAX_FRAME_BYTES`], stored or not.
pub fn encode_frame(
    base_offset: u64,
    count: u32,
    payload: &[u8],
    codec: Codec,
    seed: FrameSeed,
) -> Result<Vec<u8>, FrameError> {
    check_frame(base_offset, count, payload.len())?;
    let compressed;
    let stored: &[u8] = match codec {
        Codec::None => payload,
        Codec::Zstd { level } => {
            compressed = zstd::bulk::compress(payload, level)
                .map_err(|e| FrameError::Codec(format!("zstd compress: {e}")))?;
            &compressed
        }
    };
    if stored.len() as u64 > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            what: "stored",
            len: stored.len() as u64,
            max: MAX_FRAME_BYTES,
        });
    }
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + stored.len());
    out.extend_from_slice(&frame_header(codec, count, base_offset, payload.len(), stored, seed));
    out.extend_from_slice(stored);
    Ok(out)
}

/// Parses a whole frame's header and checks its length and its CRC (seeded
/// with `seed`). Used by the commit read-back and by tests.
pub fn verify_frame(bytes: &[u8], seed: FrameSeed) -> Result<FrameHeader, FrameError> {
    let header: &[u8; FRAME_HEADER_LEN] = bytes
        .get(..FRAME_HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| FrameError::BadHeader(format!("{} bytes is no frame", bytes.len())))?;
    let h = FrameHeader::parse(header)?;
    if bytes.len() as u64 != h.frame_len() {
        return Err(FrameError::BadHeader(format!(
            "frame is {} bytes, header says {}",
            bytes.len(),
            h.frame_len()
        )));
    }
    h.check_crc(seed, header, &bytes[FRAME_HEADER_LEN..])?;
    Ok(h)
}

/// Decodes a CRC-checked frame's stored payload into its records. `stored`
/// must be exactly `header.stored_len` bytes.
pub fn decode_records(header: &FrameHeader, stored: Bytes) -> Result<Vec<Envelope>, FrameError> {
    let raw = uncompress(header, stored)?;
    split_records(header.count, &raw)?
        .into_iter()
        .enumerate()
        .map(|(i, range)| {
            envelope::decode(&raw.slice(range))
                .map_err(|source| FrameError::Envelope { index: i as u32, source })
        })
        .collect()
}

/// The commit times of the first and last records of a CRC-checked frame.
pub fn commit_time_bounds(header: &FrameHeader, stored: Bytes) -> Result<(u64, u64), FrameError> {
    let raw = uncompress(header, stored)?;
    let ranges = split_records(header.count, &raw)?;
    let time = |i: usize| {
        envelope::commit_time_of(&raw[ranges[i].clone()])
            .map_err(|source| FrameError::Envelope { index: i as u32, source })
    };
    Ok((time(0)?, time(ranges.len() - 1)?))
}

fn uncompress(header: &FrameHeader, stored: Bytes) -> Result<Bytes, FrameError> {
    if stored.len() != header.stored_len as usize {
        return Err(FrameError::BadHeader(format!(
            "stored payload is {} bytes, header says {}",
            stored.len(),
            header.stored_len
        )));
    }
    let want = header.uncompressed_len as usize;
    match header.codec {
        CODEC_NONE => Ok(stored),
        CODEC_ZSTD => {
            // `want` was bound-checked by `FrameHeader::parse`; the buffer
            // of that size is only allocated when the zstd frame is one
            // whole frame declaring exactly that content size, so a few
            // damaged bytes cannot make a 256 MiB allocation.
            check_zstd_frame(&stored, want)?;
            let raw = zstd::bulk::decompress(&stored, want)
                .map_err(|e| FrameError::Codec(format!("zstd decompress: {e}")))?;
            if raw.len() != want {
                return Err(FrameError::Codec(format!(
                    "zstd gave {} bytes, header says {want}",
                    raw.len()
                )));
            }
            Ok(Bytes::from(raw))
        }
        other => Err(FrameError::BadFlags(other)),
    }
}

/// Checks that `stored` is exactly one zstd frame declaring `want` bytes.
fn check_zstd_frame(stored: &[u8], want: usize) -> Result<(), FrameError> {
    let bad = |what: String| Err(FrameError::Codec(format!("zstd frame {what}")));
    match zstd::zstd_safe::get_frame_content_size(stored) {
        Ok(Some(n)) if n == want as u64 => {}
        Ok(Some(n)) => return bad(format!("declares {n} bytes, the header {want}")),
        Ok(None) => return bad("declares no content size".into()),
        Err(_) => return bad("header is damaged".into()),
    }
    match zstd::zstd_safe::find_frame_compressed_size(stored) {
        Ok(n) if n == stored.len() => Ok(()),
        Ok(n) => bad(format!("is {n} of the {} stored bytes", stored.len())),
        Err(_) => bad("is damaged".into()),
    }
}

/// The byte ranges of the `count` records of an uncompressed payload; they
/// must add up to the payload exactly.
fn split_records(count: u32, raw: &[u8]) -> Result<Vec<std::ops::Range<usize>>, FrameError> {
    // count ≤ raw.len() / MIN_RECORD_WIRE_LEN was checked by the header parse;
    // check again here so the allocation below is bounded by the payload.
    if count as usize > raw.len() / MIN_RECORD_WIRE_LEN {
        return Err(FrameError::Records(format!("{count} records in {} bytes", raw.len())));
    }
    let mut out = Vec::with_capacity(count as usize);
    let mut pos = 0usize;
    for i in 0..count {
        let Some(len_bytes) = raw.get(pos..pos + 4) else {
            return Err(FrameError::Records(format!("record {i}: length cut off at byte {pos}")));
        };
        let len = u32::from_be_bytes(len_bytes.try_into().expect("4 bytes")) as usize;
        if len < MIN_ENVELOPE_LEN || len as u64 > MAX_ENVELOPE_LEN {
            return Err(FrameError::Records(format!("record {i}: length {len} out of bounds")));
        }
        let start = pos + 4;
        if len > raw.len() - start {
            return Err(FrameError::Records(format!(
                "record {i}: {len} bytes at {start} overrun the {}-byte payload",
                raw.len()
            )));
        }
        out.push(start..start + len);
        pos = start + len;
    }
    if pos != raw.len() {
        return Err(FrameError::Records(format!(
            "{count} records end at byte {pos} of a {}-byte payload",
            raw.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_of(frame: &[u8]) -> [u8; FRAME_HEADER_LEN] {
        frame[..FRAME_HEADER_LEN].try_into().unwrap()
    }

    fn decode_all(frame: &[u8]) -> Result<(FrameHeader, Vec<Envelope>), FrameError> {
        decode_sealed(frame, FrameSeed::UNSALTED)
    }

    fn decode_sealed(
        frame: &[u8],
        seed: FrameSeed,
    ) -> Result<(FrameHeader, Vec<Envelope>), FrameError> {
        let h = verify_frame(frame, seed)?;
        let recs = decode_records(&h, Bytes::copy_from_slice(&frame[FRAME_HEADER_LEN..]))?;
        Ok((h, recs))
    }

    /// The frame of the golden tests: offsets 42 and 43, commit time
    /// 1,700,000,000,000 ms; the first record has no key and the payload
    /// "hello" × `repeat`, the second the key "k" and "world!" × `repeat`.
    fn golden_payload(repeat: usize) -> PayloadBuilder {
        let mut p = PayloadBuilder::new();
        p.push(None, 1_700_000_000_000, "hello".repeat(repeat).as_bytes());
        p.push(Some(b"k"), 1_700_000_000_000, "world!".repeat(repeat).as_bytes());
        p
    }

    /// Checked-in bytes of the golden frame (`repeat` 1), codec none.
    const GOLDEN_NONE: &[u8] = &[
        0xca, 0xfe, // magic
        0x00, // flags: codec none
        0x00, 0x00, 0x00, 0x02, // count
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a, // base offset 42
        0x00, 0x00, 0x00, 0x28, // uncompressed 40
        0x00, 0x00, 0x00, 0x28, // stored 40
        0x2f, 0x28, 0xd9, 0xcc, // CRC32C (computed independently)
        0x00, 0x00, 0x00, 0x0f, // record 0: 15 bytes
        0x03, 0x00, // version 3, no key
        0x00, 0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00, // 1,700,000,000,000
        b'h', b'e', b'l', b'l', b'o', //
        0x00, 0x00, 0x00, 0x11, // record 1: 17 bytes
        0x03, 0x02, b'k', // version 3, key of 1 byte
        0x00, 0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00, //
        b'w', b'o', b'r', b'l', b'd', b'!',
    ];

    /// Checked-in bytes of the golden frame (`repeat` 8) compressed with
    /// zstd level 3 (zstd 1.5.7): 117 payload bytes stored in 53. Decoding
    /// them is the golden test; the compressor's output is not compared, as
    /// it may change between zstd releases.
    const GOLDEN_ZSTD: &[u8] = &[
        0xca, 0xfe, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a,
        0x00, 0x00, 0x00, 0x75, 0x00, 0x00, 0x00, 0x35, 0x11, 0xf4, 0x04, 0xe8, 0x28, 0xb5, 0x2f,
        0xfd, 0x20, 0x75, 0x65, 0x01, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00, 0x32, 0x03, 0x00, 0x00,
        0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00, 0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x00, 0x00, 0x00,
        0x3b, 0x03, 0x02, 0x6b, 0x77, 0x6f, 0x72, 0x6c, 0x64, 0x21, 0x03, 0x00, 0x53, 0x60, 0xd1,
        0x8a, 0x30, 0x81, 0x2c, 0x61,
    ];

    fn check_golden_records(h: &FrameHeader, recs: &[Envelope], repeat: usize) {
        assert_eq!((h.base_offset, h.count), (42, 2));
        assert_eq!(h.uncompressed_len as usize, 40 + 11 * (repeat - 1));
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].key, None);
        assert_eq!(recs[0].payload, "hello".repeat(repeat).as_bytes());
        assert_eq!(recs[1].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(recs[1].payload, "world!".repeat(repeat).as_bytes());
        assert!(recs.iter().all(|r| r.commit_time_ms == 1_700_000_000_000));
    }

    #[test]
    fn frame_golden_bytes_codec_none() {
        let frame = golden_payload(1).finish(42, Codec::None, FrameSeed::UNSALTED).unwrap();
        assert_eq!(frame, GOLDEN_NONE, "encoder output changed: {frame:02x?}");
        let (h, recs) = decode_all(GOLDEN_NONE).unwrap();
        assert_eq!(h.codec, 0);
        check_golden_records(&h, &recs, 1);
    }

    /// The salt of the salted golden frame.
    const SALT: u64 = 0x0123_4567_89AB_CDEF;

    /// [`GOLDEN_NONE`] sealed with the seed of [`SALT`]: only the CRC
    /// differs. It is the CRC32C of the salt's 8 bytes (big-endian), header
    /// bytes [2, 23) and the payload, as one run (computed independently,
    /// with a bitwise CRC32C in Python).
    const GOLDEN_SALTED_CRC: [u8; 4] = [0x64, 0x4f, 0x7e, 0x42];

    #[test]
    fn salted_frame_golden_bytes_check_only_with_their_segments_seed() {
        let seed = FrameSeed::of_salt(SALT);
        let frame = golden_payload(1).finish(42, Codec::None, seed).unwrap();
        assert_eq!(frame[..23], GOLDEN_NONE[..23]);
        assert_eq!(frame[27..], GOLDEN_NONE[27..]);
        assert_eq!(frame[23..27], GOLDEN_SALTED_CRC, "{:02x?}", &frame[23..27]);
        // The same CRC as one plain CRC32C over salt, header fields, payload.
        let mut run = SALT.to_be_bytes().to_vec();
        run.extend_from_slice(&GOLDEN_NONE[2..23]);
        run.extend_from_slice(&GOLDEN_NONE[27..]);
        assert_eq!(crc32c::crc32c(&run).to_be_bytes(), GOLDEN_SALTED_CRC);
        let (h, recs) = decode_sealed(&frame, seed).unwrap();
        check_golden_records(&h, &recs, 1);
        // Checked with no seed or another salt's, it fails: a client that
        // forges a frame with the public CRC cannot pass it off as ours.
        assert!(matches!(decode_all(&frame), Err(FrameError::Crc { .. })));
        let other = FrameSeed::of_salt(SALT + 1);
        assert!(matches!(decode_sealed(&frame, other), Err(FrameError::Crc { .. })));
        assert!(matches!(decode_sealed(GOLDEN_NONE, seed), Err(FrameError::Crc { .. })));
        // Unsalted is a plain CRC32C: the format 1 frames of older logs.
        let mut plain = GOLDEN_NONE[2..23].to_vec();
        plain.extend_from_slice(&GOLDEN_NONE[27..]);
        assert_eq!(crc32c::crc32c(&plain).to_be_bytes(), GOLDEN_NONE[23..27]);
    }

    #[test]
    fn frame_golden_bytes_codec_zstd_decode() {
        let (h, recs) = decode_all(GOLDEN_ZSTD).unwrap();
        assert_eq!((h.codec, h.stored_len), (1, 53));
        check_golden_records(&h, &recs, 8);
        // The encoder's output may differ across zstd releases, but it must
        // decode to the same records and carry the same header fields up to
        // the stored size.
        let frame =
            golden_payload(8).finish(42, Codec::Zstd { level: 3 }, FrameSeed::UNSALTED).unwrap();
        assert_eq!(frame[..19], GOLDEN_ZSTD[..19]);
        let (h, recs) = decode_all(&frame).unwrap();
        check_golden_records(&h, &recs, 8);
    }

    #[test]
    fn every_single_byte_flip_is_caught() {
        for golden in [GOLDEN_NONE, GOLDEN_ZSTD] {
            for i in 0..golden.len() {
                let mut bad = golden.to_vec();
                bad[i] ^= 0x40;
                assert!(decode_all(&bad).is_err(), "flip at byte {i} went unnoticed");
            }
        }
    }

    #[test]
    fn oversized_frames_are_refused_on_write_and_read() {
        let mut h = header_of(GOLDEN_NONE);
        let too_big = (MAX_FRAME_BYTES + 1) as i32;
        h[15..19].copy_from_slice(&too_big.to_be_bytes());
        h[19..23].copy_from_slice(&too_big.to_be_bytes());
        assert!(matches!(FrameHeader::parse(&h), Err(FrameError::TooLarge { .. })));
        let mut h = header_of(GOLDEN_NONE);
        h[19..23].copy_from_slice(&(-1i32).to_be_bytes());
        assert!(FrameHeader::parse(&h).is_err());
        // A count that cannot fit the payload is refused before any
        // allocation for it.
        let mut h = header_of(GOLDEN_NONE);
        h[3..7].copy_from_slice(&1_000_000i32.to_be_bytes());
        assert!(matches!(FrameHeader::parse(&h), Err(FrameError::BadHeader(_))));
        // Write side: a payload over the bound never becomes a frame. (A
        // zeroed buffer of that size is cheap: the pages are never touched.)
        let huge = vec![0u8; MAX_FRAME_BYTES as usize + 1];
        assert!(matches!(
            encode_frame(0, 1, &huge, Codec::None, FrameSeed::UNSALTED),
            Err(FrameError::TooLarge { .. })
        ));
    }

    #[test]
    fn reserved_flag_bits_and_unknown_codecs_are_refused() {
        for flags in [0x02u8, 0x07, 0x08, 0x80] {
            let mut h = header_of(GOLDEN_NONE);
            h[2] = flags;
            assert_eq!(FrameHeader::parse(&h), Err(FrameError::BadFlags(flags)));
        }
    }

    #[test]
    fn finishing_in_place_gives_the_bytes_of_encode_frame() {
        for (n, capacity) in [(1usize, 0usize), (3, 10), (40, 1 << 16)] {
            let mut p = PayloadBuilder::with_capacity(capacity);
            for i in 0..n {
                let key = (i % 3 == 1).then_some(&b"key"[..]);
                p.push(key, 1_700_000_000_000 + i as u64, format!("payload {i}").as_bytes());
            }
            assert_eq!(p.count(), n as u32);
            let expected =
                encode_frame(7, n as u32, p.payload(), Codec::None, FrameSeed::UNSALTED).unwrap();
            assert_eq!(p.len() + FRAME_HEADER_LEN, expected.len());
            let zstd = encode_frame(
                7,
                n as u32,
                p.payload(),
                Codec::Zstd { level: 1 },
                FrameSeed::UNSALTED,
            )
            .unwrap();
            let mut q = PayloadBuilder::new();
            for i in 0..n {
                let key = (i % 3 == 1).then_some(&b"key"[..]);
                q.push(key, 1_700_000_000_000 + i as u64, format!("payload {i}").as_bytes());
            }
            assert_eq!(
                p.finish(7, Codec::None, FrameSeed::UNSALTED).unwrap(),
                expected,
                "{n} records"
            );
            assert_eq!(
                q.finish(7, Codec::Zstd { level: 1 }, FrameSeed::UNSALTED).unwrap(),
                zstd,
                "{n} records"
            );
        }
        // The same refusals as encode_frame.
        let p = PayloadBuilder::new();
        assert!(matches!(
            p.finish(0, Codec::None, FrameSeed::UNSALTED),
            Err(FrameError::BadHeader(_))
        ));
        let mut p = PayloadBuilder::new();
        p.push(None, 1, b"x");
        assert!(matches!(
            p.finish(u64::MAX, Codec::None, FrameSeed::UNSALTED),
            Err(FrameError::BadHeader(_))
        ));
    }

    #[test]
    fn records_must_add_up_to_the_payload_exactly() {
        // One record claimed, two present: the lengths do not add up.
        let mut p = PayloadBuilder::new();
        p.push(None, 1, &[b'a'; 50]);
        p.push(None, 1, &[b'b'; 50]);
        let frame = encode_frame(0, 1, p.payload(), Codec::None, FrameSeed::UNSALTED).unwrap();
        assert!(matches!(decode_all(&frame), Err(FrameError::Records(_))));
        // Three claimed, two present.
        let frame = encode_frame(0, 3, p.payload(), Codec::None, FrameSeed::UNSALTED).unwrap();
        assert!(matches!(decode_all(&frame), Err(FrameError::Records(_))));
        // A record length that overruns the payload.
        let mut raw = p.payload().to_vec();
        raw[3] = 0x7f;
        let frame = encode_frame(0, 2, &raw, Codec::None, FrameSeed::UNSALTED).unwrap();
        assert!(matches!(decode_all(&frame), Err(FrameError::Records(_))));
    }

    /// Random bytes, and golden frames with random bytes overwritten, never
    /// make the decoders panic or allocate past the bounds.
    #[test]
    fn random_garbage_is_refused_without_panicking() {
        let mut rng = narad_fs::SimRng::new(99);
        for round in 0..3000 {
            let mut buf = if round % 2 == 0 {
                let mut b = vec![0u8; rng.below(200) as usize];
                rng.fill(&mut b);
                if b.len() >= 2 && rng.chance(1, 2) {
                    b[..2].copy_from_slice(&FRAME_MAGIC);
                }
                b
            } else {
                [GOLDEN_NONE, GOLDEN_ZSTD][rng.below(2) as usize].to_vec()
            };
            for _ in 0..rng.range(1, 4) {
                if !buf.is_empty() {
                    let i = rng.below(buf.len() as u64) as usize;
                    buf[i] = rng.next_u64() as u8;
                }
            }
            // Decoding must not panic; a frame that still verifies must
            // decode or be refused cleanly.
            if let Ok(h) = verify_frame(&buf, FrameSeed::UNSALTED) {
                let _ = decode_records(&h, Bytes::copy_from_slice(&buf[FRAME_HEADER_LEN..]));
            }
            if buf.len() >= FRAME_HEADER_LEN {
                let _ = FrameHeader::parse(&header_of(&buf));
            }
            let _ = envelope::decode(&Bytes::copy_from_slice(&buf));
        }
    }

    /// A zstd frame whose header claims far more uncompressed bytes than
    /// its zstd payload holds made `decode_records` allocate the claimed
    /// size (up to 256 MiB) before zstd could fail (seen while writing the
    /// log_frame fuzz target, whose CRC fix-up reaches it). The zstd
    /// frame's own header must now agree first.
    #[test]
    fn a_zstd_frame_disagreeing_with_its_header_fails_before_allocating() {
        let mut f =
            golden_payload(1).finish(42, Codec::Zstd { level: 3 }, FrameSeed::UNSALTED).unwrap();
        f[15..19].copy_from_slice(&(200i32 << 20).to_be_bytes());
        let crc = crc32c::crc32c_append(
            crc_start(FrameSeed::UNSALTED, &header_of(&f)),
            &f[FRAME_HEADER_LEN..],
        );
        f[23..27].copy_from_slice(&crc.to_be_bytes());
        let e = decode_all(&f).unwrap_err();
        assert!(matches!(e, FrameError::Codec(ref m) if m.contains("declares")), "{e:?}");
        let mut cut =
            golden_payload(1).finish(42, Codec::Zstd { level: 3 }, FrameSeed::UNSALTED).unwrap();
        cut.push(0);
        let stored = (cut.len() - FRAME_HEADER_LEN) as i32;
        cut[19..23].copy_from_slice(&stored.to_be_bytes());
        let crc = crc32c::crc32c_append(
            crc_start(FrameSeed::UNSALTED, &header_of(&cut)),
            &cut[FRAME_HEADER_LEN..],
        );
        cut[23..27].copy_from_slice(&crc.to_be_bytes());
        let e = decode_all(&cut).unwrap_err();
        assert!(matches!(e, FrameError::Codec(ref m) if m.contains("stored bytes")), "{e:?}");
    }

    #[test]
    fn zstd_frames_round_trip_many_records() {
        let mut p = PayloadBuilder::new();
        for i in 0..500u32 {
            let key = i.to_string();
            p.push((i % 3 != 0).then_some(key.as_bytes()), u64::from(i), &[i as u8; 100]);
        }
        let frame = p.finish(7, Codec::Zstd { level: 1 }, FrameSeed::UNSALTED).unwrap();
        let (h, recs) = decode_all(&frame).unwrap();
        assert!(h.stored_len < h.uncompressed_len / 4);
        assert_eq!(recs.len(), 500);
        assert_eq!(recs[499].commit_time_ms, 499);
        assert_eq!(recs[3].key, None);
        assert_eq!(recs[4].key.as_deref(), Some(&b"4"[..]));
        let (first, last) =
            commit_time_bounds(&h, Bytes::copy_from_slice(&frame[FRAME_HEADER_LEN..])).unwrap();
        assert_eq!((first, last), (0, 499));
    }
}
