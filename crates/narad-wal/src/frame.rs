//! WAL frames and segment headers: how records sit in a segment file.
//!
//! # Segment file `%020d.wal` (named by the sequence number of its first frame)
//! ```text
//! offset 0   segment header (32 bytes)
//! offset 32  frame, frame, ...   (a frame never spans two segments)
//! ```
//! Segment header, version 2 (written by this binary; big-endian):
//! ```text
//! 0  magic "NARADWAL" (8) | 8 version u16 = 2 | 10 flags u16
//! 12 base_seq u64 | 20 salt u64 | 28 crc32c u32 over bytes [0, 28)
//! ```
//! Version 1 (read, never written since version 2):
//! ```text
//! 0  magic "NARADWAL" (8) | 8 version u16 = 1 | 10 header_len u16 = 32
//! 12 flags u32 | 16 base_seq u64 | 24 reserved u32 = 0
//! 28 crc32c u32 over bytes [0, 28)
//! ```
//! Flags: bit 0 ([`SEGMENT_FLAG_PREPARED`]) marks a segment renamed in from
//! a prepared file (see [`crate::prep`]); every other bit is zero. It only
//! tells recovery that a trailer at the end of this file may be ours (a
//! header is our bytes under a CRC, where the end of the file may be a
//! client's payload).
//!
//! The salt (version 2) is 64 bits from the operating system's random
//! source, drawn when the segment is started and never shown to anyone.
//! Every frame's CRC is seeded with it ([`FrameSeed`]): a frame checks only
//! in the segment it was written for. A client can put bytes shaped like a
//! frame into a payload, with a CRC computed by the public algorithm, but it
//! cannot compute the seed, so such a frame fails its check (but for a
//! 2^-32 chance per forgery: the check is 32 bits, whatever the salt's
//! size). Recovery relies on that when it looks behind damage for frames of
//! a later write (see [`crate::recovery`]). A version 1 segment has no salt:
//! its frames are checked with the unsalted seed, as they were written.
//!
//! Frame (big-endian, 24-byte header):
//! ```text
//! 0 magic "NWAL" u32 | 4 len u32 (1..=16 MiB) | 8 seq u64
//! 16 write_index u32 | 20 crc32c u32, seeded with the segment's FrameSeed,
//!                      over bytes [4, 20) ++ payload
//! 24 payload (one encoded record, see `record`)
//! ```
//! `write_index` is the frame's position within the single write (one
//! `pwrite` + `fdatasync`) that put it on disk: 0 for the first frame of a
//! write. So `seq - write_index` names the write. Recovery uses it to tell a
//! torn write from damage to acked data: a valid frame of a *later* write
//! behind a bad frame proves the bad frame's write was synced (and maybe
//! acked), so that is corruption; valid frames of the *same* write behind a
//! bad one are what a torn, never-acked write leaves (holes of zeros in
//! front of written sectors).
//!
//! # Invariants
//! * Sequence numbers are dense: each frame's `seq` is the previous frame's
//!   plus one, across segments; a segment's first frame has `base_seq`.
//! * The CRC covers everything in the frame except the magic and the CRC,
//!   and starts from the seed of the segment's salt: every frame of a
//!   segment was sealed with that segment's seed (version 2: the salt in
//!   its header; version 1: [`FrameSeed::UNSALTED`]).
//! * This binary writes only version 2 headers, and frames only into
//!   version 2 segments: a version 1 segment left by an older binary is read
//!   and recovered by its own rules, then sealed (the WAL rolls to a new
//!   segment at open when the last one is version 1 and holds frames).

use crate::limits::{FRAME_HEADER_BYTES, MAX_RECORD_BYTES, SEGMENT_HEADER_BYTES};

/// `NWAL`.
pub const FRAME_MAGIC: u32 = u32::from_be_bytes(*b"NWAL");
/// Segment header magic.
pub const SEGMENT_MAGIC: [u8; 8] = *b"NARADWAL";
/// The segment format version this code writes (it also reads
/// [`SEGMENT_VERSION_UNSALTED`]).
pub const SEGMENT_VERSION: u16 = 2;
/// The first segment format: no salt, frames sealed with
/// [`FrameSeed::UNSALTED`].
pub const SEGMENT_VERSION_UNSALTED: u16 = 1;
/// Segment header flag: the segment was a prepared file (zeros to the
/// segment size, then a trailer) when it was renamed in.
pub const SEGMENT_FLAG_PREPARED: u32 = 1;

/// The CRC32C state every frame CRC of a segment starts from: the CRC of
/// the segment's salt (computed once per segment, so sealing or checking a
/// frame costs no byte more than an unsalted CRC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameSeed(u32);

impl FrameSeed {
    /// The seed of version 1 segments, which have no salt: a plain CRC32C.
    pub const UNSALTED: FrameSeed = FrameSeed(0);

    /// The seed of a version 2 segment whose header holds `salt`.
    pub fn of_salt(salt: u64) -> FrameSeed {
        FrameSeed(crc32c::crc32c(&salt.to_be_bytes()))
    }
}

/// A fresh salt for a new segment, from the operating system's random
/// source.
pub fn new_salt() -> std::io::Result<u64> {
    getrandom::u64().map_err(|e| std::io::Error::other(format!("no randomness for a salt: {e}")))
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Payload length.
    pub len: u32,
    /// Sequence number.
    pub seq: u64,
    /// Index of the frame within its write.
    pub write_index: u32,
    /// Stored CRC.
    pub crc: u32,
}

/// What is wrong with the bytes where a frame header was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderFault {
    /// Fewer than 24 bytes remain.
    Short,
    /// The magic does not match.
    BadMagic,
    /// The length is zero or above the record limit.
    BadLength(u32),
}

impl FrameHeader {
    /// Parses a frame header from the first 24 bytes of `b`.
    pub fn parse(b: &[u8]) -> Result<FrameHeader, HeaderFault> {
        if (b.len() as u64) < FRAME_HEADER_BYTES {
            return Err(HeaderFault::Short);
        }
        let be32 = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if be32(0) != FRAME_MAGIC {
            return Err(HeaderFault::BadMagic);
        }
        let len = be32(4);
        if len == 0 || len > MAX_RECORD_BYTES {
            return Err(HeaderFault::BadLength(len));
        }
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&b[8..16]);
        Ok(FrameHeader { len, seq: u64::from_be_bytes(seq), write_index: be32(16), crc: be32(20) })
    }

    /// The frame's total size on disk.
    pub fn frame_len(&self) -> u64 {
        FRAME_HEADER_BYTES + u64::from(self.len)
    }

    /// Whether `payload` matches the stored CRC, in a segment whose frames
    /// are sealed with `seed`.
    pub fn check(&self, header_bytes: &[u8], payload: &[u8], seed: FrameSeed) -> bool {
        frame_crc(seed, &header_bytes[4..20], payload) == self.crc
    }

    /// The sequence number of the first frame of this frame's write.
    pub fn write_first_seq(&self) -> u64 {
        self.seq.saturating_sub(u64::from(self.write_index))
    }
}

fn frame_crc(seed: FrameSeed, covered_header: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c_append(seed.0, covered_header), payload)
}

/// Appends the header of a frame whose `len`-byte payload the caller appends
/// right after it; returns the header's offset in `out`, which
/// [`seal_frame`] needs once the payload is in place.
pub fn begin_frame(out: &mut Vec<u8>, len: u32, seq: u64, write_index: u32) -> usize {
    let at = out.len();
    out.extend_from_slice(&FRAME_MAGIC.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&write_index.to_be_bytes());
    out.extend_from_slice(&[0u8; 4]);
    at
}

/// Computes and stores the CRC of the frame starting at `at` (its payload is
/// everything after the header to the end of `out`), for a segment whose
/// frames are sealed with `seed`.
pub fn seal_frame(out: &mut [u8], at: usize, seed: FrameSeed) {
    let header_end = at + FRAME_HEADER_BYTES as usize;
    let crc = frame_crc(seed, &out[at + 4..at + 20], &out[header_end..]);
    out[at + 20..header_end].copy_from_slice(&crc.to_be_bytes());
}

/// Encodes a version 2 segment header (no flags) holding `salt`.
pub fn segment_header(base_seq: u64, salt: u64) -> [u8; SEGMENT_HEADER_BYTES as usize] {
    segment_header_with_flags(base_seq, 0, salt)
}

/// Encodes a version 2 segment header with `flags` (which fit in 16 bits)
/// and `salt`.
pub fn segment_header_with_flags(
    base_seq: u64,
    flags: u32,
    salt: u64,
) -> [u8; SEGMENT_HEADER_BYTES as usize] {
    debug_assert!(flags <= u32::from(u16::MAX));
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    h[0..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..10].copy_from_slice(&SEGMENT_VERSION.to_be_bytes());
    h[10..12].copy_from_slice(&(flags as u16).to_be_bytes());
    h[12..20].copy_from_slice(&base_seq.to_be_bytes());
    h[20..28].copy_from_slice(&salt.to_be_bytes());
    let crc = crc32c::crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_be_bytes());
    h
}

/// Encodes a version 1 (unsalted) segment header. This binary never writes
/// one into a WAL; tests use it to build the segments an older binary left.
pub fn segment_header_unsalted(base_seq: u64, flags: u32) -> [u8; SEGMENT_HEADER_BYTES as usize] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    h[0..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..10].copy_from_slice(&SEGMENT_VERSION_UNSALTED.to_be_bytes());
    h[10..12].copy_from_slice(&(SEGMENT_HEADER_BYTES as u16).to_be_bytes());
    h[12..16].copy_from_slice(&flags.to_be_bytes());
    h[16..24].copy_from_slice(&base_seq.to_be_bytes());
    let crc = crc32c::crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_be_bytes());
    h
}

/// A segment header that passed its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// [`SEGMENT_VERSION`] or [`SEGMENT_VERSION_UNSALTED`].
    pub version: u16,
    /// The flags ([`SEGMENT_FLAG_PREPARED`]).
    pub flags: u32,
    /// The sequence number of its first frame.
    pub base_seq: u64,
    /// The salt (version 2); `None` in a version 1 header.
    pub salt: Option<u64>,
}

impl SegmentHeader {
    /// The seed the segment's frames are sealed with.
    pub fn seed(&self) -> FrameSeed {
        self.salt.map_or(FrameSeed::UNSALTED, FrameSeed::of_salt)
    }
}

/// What is wrong with a segment header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SegmentHeaderError {
    /// Fewer than 32 bytes, or a CRC or magic mismatch.
    #[error("segment header is damaged or incomplete")]
    Damaged,
    /// A valid header of a version this binary does not know.
    #[error("segment format version {0} is not supported (this binary reads versions 1 and 2)")]
    UnsupportedVersion(u16),
    /// The header's base does not match the file name.
    #[error("segment header says base {found}, the file name says {expected}")]
    BaseMismatch {
        /// From the file name.
        expected: u64,
        /// From the header.
        found: u64,
    },
}

/// Checks a segment header against the base sequence number in its name
/// and decodes it.
pub fn check_segment_header(
    b: &[u8],
    expected_base: u64,
) -> Result<SegmentHeader, SegmentHeaderError> {
    if (b.len() as u64) < SEGMENT_HEADER_BYTES || b[0..8] != SEGMENT_MAGIC {
        return Err(SegmentHeaderError::Damaged);
    }
    let crc = u32::from_be_bytes([b[28], b[29], b[30], b[31]]);
    if crc32c::crc32c(&b[0..28]) != crc {
        return Err(SegmentHeaderError::Damaged);
    }
    let be64 = |i: usize| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[i..i + 8]);
        u64::from_be_bytes(v)
    };
    let version = u16::from_be_bytes([b[8], b[9]]);
    let header = match version {
        SEGMENT_VERSION => SegmentHeader {
            version,
            flags: u32::from(u16::from_be_bytes([b[10], b[11]])),
            base_seq: be64(12),
            salt: Some(be64(20)),
        },
        SEGMENT_VERSION_UNSALTED => SegmentHeader {
            version,
            flags: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
            base_seq: be64(16),
            salt: None,
        },
        _ => return Err(SegmentHeaderError::UnsupportedVersion(version)),
    };
    if header.base_seq != expected_base {
        return Err(SegmentHeaderError::BaseMismatch {
            expected: expected_base,
            found: header.base_seq,
        });
    }
    Ok(header)
}

/// The file name of the segment whose first sequence number is `base`.
pub fn segment_file_name(base: u64) -> String {
    format!("{base:020}.wal")
}

/// Parses a segment file name back into its base sequence number.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".wal")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame holding the 3-byte payload "abc" with seq 5, write index 2,
    /// in a version 1 (unsalted) segment.
    const GOLDEN_FRAME: &[u8] = &[
        b'N', b'W', b'A', b'L', // magic
        0, 0, 0, 3, // len
        0, 0, 0, 0, 0, 0, 0, 5, // seq
        0, 0, 0, 2, // write index
        0x27, 0x02, 0x4F, 0xA8, // crc32c (checked with an independent implementation)
        b'a', b'b', b'c',
    ];

    /// The salt of the version 2 golden bytes.
    const SALT: u64 = 0x0123_4567_89AB_CDEF;

    /// The same frame in a version 2 segment whose salt is [`SALT`]: only the
    /// CRC differs. It is the CRC32C of the salt's 8 bytes (big-endian),
    /// bytes [4, 20) and the payload, computed independently (a bitwise
    /// CRC32C in Python).
    const GOLDEN_SALTED_FRAME: &[u8] = &[
        b'N', b'W', b'A', b'L', 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 2, //
        0x50, 0x4B, 0x1E, 0x40, b'a', b'b', b'c',
    ];

    const GOLDEN_SEGMENT_HEADER_BASE_42: &[u8] = &[
        b'N', b'A', b'R', b'A', b'D', b'W', b'A', b'L', 0, 2, 0, 0, 0, 0, 0, 0, //
        0, 0, 0, 42, 0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF, 0x71, 0xDF, 0xE5, 0xDF,
    ];

    const GOLDEN_PREPARED_SEGMENT_HEADER_BASE_42: &[u8] = &[
        b'N', b'A', b'R', b'A', b'D', b'W', b'A', b'L', 0, 2, 0, 1, 0, 0, 0, 0, //
        0, 0, 0, 42, 0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF, 0x2E, 0x3B, 0x39, 0x80,
    ];
    // Both CRCs were computed independently (a bitwise CRC32C in Python).

    const GOLDEN_V1_SEGMENT_HEADER_BASE_42: &[u8] = &[
        b'N', b'A', b'R', b'A', b'D', b'W', b'A', b'L', 0, 1, 0, 32, 0, 0, 0, 0, //
        0, 0, 0, 0, 0, 0, 0, 42, 0, 0, 0, 0, 0xD0, 0xF0, 0x32, 0x00,
    ];

    const GOLDEN_V1_PREPARED_SEGMENT_HEADER_BASE_42: &[u8] = &[
        b'N', b'A', b'R', b'A', b'D', b'W', b'A', b'L', 0, 1, 0, 32, 0, 0, 0, 1, //
        0, 0, 0, 0, 0, 0, 0, 42, 0, 0, 0, 0, 0xE0, 0x22, 0x0A, 0x65,
    ];

    fn sealed(seed: FrameSeed) -> Vec<u8> {
        let mut out = Vec::new();
        let at = begin_frame(&mut out, 3, 5, 2);
        out.extend_from_slice(b"abc");
        seal_frame(&mut out, at, seed);
        out
    }

    #[test]
    fn frame_matches_golden_bytes_and_parses_them() {
        let out = sealed(FrameSeed::UNSALTED);
        assert_eq!(out, GOLDEN_FRAME, "{:02X?}", &out[20..24]);
        let h = FrameHeader::parse(GOLDEN_FRAME).unwrap();
        assert_eq!((h.len, h.seq, h.write_index, h.write_first_seq()), (3, 5, 2, 3));
        let seed = FrameSeed::UNSALTED;
        assert!(h.check(GOLDEN_FRAME, &GOLDEN_FRAME[24..], seed));
        let mut bad = GOLDEN_FRAME.to_vec();
        bad[25] ^= 1;
        assert!(!h.check(&bad, &bad[24..], seed));
        bad = GOLDEN_FRAME.to_vec();
        bad[15] ^= 1; // the seq is covered by the CRC
        let h2 = FrameHeader::parse(&bad).unwrap();
        assert!(!h2.check(&bad, &bad[24..], seed));
    }

    #[test]
    fn salted_frame_matches_golden_bytes_and_checks_only_with_its_segments_seed() {
        let seed = FrameSeed::of_salt(SALT);
        let out = sealed(seed);
        assert_eq!(out, GOLDEN_SALTED_FRAME, "{:02X?}", &out[20..24]);
        let h = FrameHeader::parse(GOLDEN_SALTED_FRAME).unwrap();
        assert!(h.check(GOLDEN_SALTED_FRAME, &GOLDEN_SALTED_FRAME[24..], seed));
        // What a client can compute: the unsalted CRC, or a guessed salt.
        for wrong in [FrameSeed::UNSALTED, FrameSeed::of_salt(0), FrameSeed::of_salt(SALT ^ 1)] {
            assert!(!h.check(GOLDEN_SALTED_FRAME, &GOLDEN_SALTED_FRAME[24..], wrong), "{wrong:?}");
        }
        let unsalted = FrameHeader::parse(GOLDEN_FRAME).unwrap();
        assert!(!unsalted.check(GOLDEN_FRAME, &GOLDEN_FRAME[24..], seed));
    }

    #[test]
    fn segment_header_matches_golden_bytes() {
        let h = segment_header(42, SALT);
        assert_eq!(&h[..], GOLDEN_SEGMENT_HEADER_BASE_42, "{:02X?}", &h[28..]);
        let want = SegmentHeader { version: 2, flags: 0, base_seq: 42, salt: Some(SALT) };
        assert_eq!(check_segment_header(&h, 42), Ok(want));
        assert_eq!(want.seed(), FrameSeed::of_salt(SALT));
        assert_eq!(
            check_segment_header(&h, 41),
            Err(SegmentHeaderError::BaseMismatch { expected: 41, found: 42 })
        );
        assert_eq!(check_segment_header(&h[..31], 42), Err(SegmentHeaderError::Damaged));
        // The salt is under the header's CRC.
        let mut bad = h;
        bad[27] ^= 1;
        assert_eq!(check_segment_header(&bad, 42), Err(SegmentHeaderError::Damaged));
    }

    #[test]
    fn prepared_segment_header_matches_golden_bytes() {
        let h = segment_header_with_flags(42, SEGMENT_FLAG_PREPARED, SALT);
        assert_eq!(&h[..], GOLDEN_PREPARED_SEGMENT_HEADER_BASE_42, "{:02X?}", &h[28..]);
        assert_eq!(check_segment_header(&h, 42).map(|h| h.flags), Ok(SEGMENT_FLAG_PREPARED));
    }

    #[test]
    fn version_1_headers_still_read_and_have_no_salt() {
        for (flags, golden) in [
            (0, GOLDEN_V1_SEGMENT_HEADER_BASE_42),
            (SEGMENT_FLAG_PREPARED, GOLDEN_V1_PREPARED_SEGMENT_HEADER_BASE_42),
        ] {
            let h = segment_header_unsalted(42, flags);
            assert_eq!(&h[..], golden, "{:02X?}", &h[28..]);
            let want = SegmentHeader { version: 1, flags, base_seq: 42, salt: None };
            assert_eq!(check_segment_header(golden, 42), Ok(want));
            assert_eq!(want.seed(), FrameSeed::UNSALTED);
        }
        let mut v3 = segment_header(42, SALT);
        v3[9] = 3;
        let crc = crc32c::crc32c(&v3[..28]);
        v3[28..].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(check_segment_header(&v3, 42), Err(SegmentHeaderError::UnsupportedVersion(3)));
    }

    #[test]
    fn salts_differ_between_segments() {
        let a = new_salt().unwrap();
        let b = new_salt().unwrap();
        assert_ne!(a, b, "two draws of 64 random bits");
    }

    #[test]
    fn header_parse_rejects_bad_magic_and_lengths() {
        assert_eq!(FrameHeader::parse(&GOLDEN_FRAME[..23]), Err(HeaderFault::Short));
        let mut b = GOLDEN_FRAME.to_vec();
        b[0] = b'X';
        assert_eq!(FrameHeader::parse(&b), Err(HeaderFault::BadMagic));
        let mut b = GOLDEN_FRAME.to_vec();
        b[4..8].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(FrameHeader::parse(&b), Err(HeaderFault::BadLength(0)));
        b[4..8].copy_from_slice(&(MAX_RECORD_BYTES + 1).to_be_bytes());
        assert_eq!(FrameHeader::parse(&b), Err(HeaderFault::BadLength(MAX_RECORD_BYTES + 1)));
    }

    #[test]
    fn segment_names_round_trip_and_reject_strangers() {
        assert_eq!(segment_file_name(42), "00000000000000000042.wal");
        assert_eq!(parse_segment_file_name("00000000000000000042.wal"), Some(42));
        for bad in ["42.wal", "0000000000000000004x.wal", "00000000000000000042.log", "checkpoint"]
        {
            assert_eq!(parse_segment_file_name(bad), None, "{bad}");
        }
    }
}
