//! Segment files: naming, and the header walk that recovery and the sparse
//! index are built from.
//!
//! # Layout
//!
//! A partition directory `<data>/topics/<topic>/p%05d/` holds segments named
//! `%020d.log` by the offset of their first record. A segment (format 2,
//! the one this binary writes) is a 32-byte header, then frames (see
//! [`crate::frame`]) back to back to the end of the file:
//!
//! ```text
//! off  size  field (big-endian)
//! 0    8     magic "NARADLOG"
//! 8    2     format version, 2
//! 10   2     flags, 0 (a set bit is a format this binary does not know)
//! 12   8     base offset: the offset in the file's name
//! 20   8     salt: the log's, seeding every frame CRC of the segment
//! 28   4     CRC32C over bytes [0, 28)
//! 32   ...   frames
//! ```
//!
//! A format 1 segment (written before segments had headers) is frames from
//! byte 0, with unsalted CRCs; it is told apart by its first bytes, a
//! frame's magic `CA FE` where format 2 has `NA`. Format 1 segments are read
//! and recovered by their own rules and never written again: the log rolls
//! to a format 2 segment before its next frame (see [`crate::log`]).
//!
//! # Invariants
//!
//! * One salt per log, drawn from the operating system's random source when
//!   the log's first format 2 segment is made and copied into every later
//!   one (frames are sealed before the cycle knows which segment they land
//!   in). It never leaves the files: see [`crate::frame`] for what it buys.
//! * A header is durable before any frame is written behind it: the writer
//!   creates the file, writes the header and fdatasyncs it, and only then
//!   appends. So a header that fails its checks in a file longer than the
//!   header is damage, never a crash's tear.
//!
//! * Offsets are dense: the first frame of a segment starts at its name's
//!   offset, each frame starts where the previous one ended, and a segment
//!   starts where its predecessor ended.
//! * A frame never spans segments. Only the last segment (the *active* one)
//!   is ever written; every other one is *sealed*: the writer synced it
//!   before it created the next segment, so a sealed segment is complete and
//!   immutable, and only retention removes it (whole).
//! * A segment holds at most its configured size, unless one frame alone is
//!   larger.
//!
//! # What a crash may leave behind
//!
//! Only the active segment can end in a torn frame, and a newly created
//! segment may be empty or hold a torn header (and nothing after it). See
//! [`crate::recovery`] for what recovery does with each case.

use std::io;
use std::path::Path;

use narad_fs::File;

use crate::frame::{FRAME_MAGIC, FrameError, FrameHeader, FrameSeed, crc_start};
use crate::limits::{FRAME_HEADER_LEN, SCAN_CHUNK_BYTES, SEGMENT_HEADER_LEN};

/// The magic that opens a format 2 segment.
pub const SEGMENT_MAGIC: [u8; 8] = *b"NARADLOG";

/// The segment format this binary writes.
pub const SEGMENT_VERSION: u16 = 2;

/// How a segment's frames are laid out and sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentFormat {
    /// Format 1: frames from byte 0, unsalted CRCs. Read, never written.
    Legacy,
    /// Format 2: a header holding `salt`, frames from its end.
    Salted {
        /// The log's salt.
        salt: u64,
    },
}

impl SegmentFormat {
    /// The seed of the segment's frame CRCs.
    pub fn seed(self) -> FrameSeed {
        match self {
            SegmentFormat::Legacy => FrameSeed::UNSALTED,
            SegmentFormat::Salted { salt } => FrameSeed::of_salt(salt),
        }
    }

    /// The byte position of the segment's first frame.
    pub fn frames_start(self) -> u64 {
        match self {
            SegmentFormat::Legacy => 0,
            SegmentFormat::Salted { .. } => SEGMENT_HEADER_LEN as u64,
        }
    }
}

/// Encodes the header of the format 2 segment `base` of a log salted with
/// `salt`.
pub fn segment_header(base: u64, salt: u64) -> [u8; SEGMENT_HEADER_LEN] {
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    h[0..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..10].copy_from_slice(&SEGMENT_VERSION.to_be_bytes());
    h[12..20].copy_from_slice(&base.to_be_bytes());
    h[20..28].copy_from_slice(&salt.to_be_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_be_bytes());
    h
}

/// Why a segment header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SegmentHeaderError {
    /// The file is shorter than a header.
    #[error("the file ends inside the segment header ({0} bytes)")]
    Short(u64),
    /// Neither a format 2 magic nor a frame's.
    #[error("bad segment magic {0:02x?}")]
    BadMagic([u8; 8]),
    /// The header's CRC does not match.
    #[error("segment header CRC mismatch: header says {expected:#010x}, bytes give {actual:#010x}")]
    Crc {
        /// The CRC in the header.
        expected: u32,
        /// The CRC of the bytes.
        actual: u32,
    },
    /// A CRC-valid header of a version or with flags this binary does not
    /// know: written by a newer narad.
    #[error(
        "segment format version {version} with flags {flags:#06x} is not one this binary reads"
    )]
    Unknown {
        /// The version.
        version: u16,
        /// The flags.
        flags: u16,
    },
    /// A CRC-valid header naming another base offset than the file's name.
    #[error("the segment header says base offset {found}, the file name {expected}")]
    WrongBase {
        /// The header's base.
        found: u64,
        /// The name's base.
        expected: u64,
    },
}

impl SegmentHeaderError {
    /// Whether the bytes can be what a crash leaves of a header that was
    /// being written (cut short, holes, a half-written sector), as opposed
    /// to a whole, CRC-valid header that disagrees.
    pub fn may_be_torn(&self) -> bool {
        matches!(
            self,
            SegmentHeaderError::Short(_)
                | SegmentHeaderError::BadMagic(_)
                | SegmentHeaderError::Crc { .. }
        )
    }
}

/// The format of segment `base` from its first bytes (`head`: at most
/// [`SEGMENT_HEADER_LEN`] of them, fewer only if the file is shorter).
pub fn parse_segment_format(head: &[u8], base: u64) -> Result<SegmentFormat, SegmentHeaderError> {
    if head.len() >= 2 && head[..2] == FRAME_MAGIC {
        return Ok(SegmentFormat::Legacy);
    }
    let Some(h) = head.get(..SEGMENT_HEADER_LEN) else {
        return Err(SegmentHeaderError::Short(head.len() as u64));
    };
    let be64 = |at: usize| u64::from_be_bytes(h[at..at + 8].try_into().expect("8 bytes"));
    let be16 = |at: usize| u16::from_be_bytes(h[at..at + 2].try_into().expect("2 bytes"));
    if h[..8] != SEGMENT_MAGIC {
        return Err(SegmentHeaderError::BadMagic(h[..8].try_into().expect("8 bytes")));
    }
    let expected = u32::from_be_bytes(h[28..32].try_into().expect("4 bytes"));
    let actual = crc32c::crc32c(&h[..28]);
    if actual != expected {
        return Err(SegmentHeaderError::Crc { expected, actual });
    }
    let (version, flags) = (be16(8), be16(10));
    if version != SEGMENT_VERSION || flags != 0 {
        return Err(SegmentHeaderError::Unknown { version, flags });
    }
    if be64(12) != base {
        return Err(SegmentHeaderError::WrongBase { found: be64(12), expected: base });
    }
    Ok(SegmentFormat::Salted { salt: be64(20) })
}

/// The file name of the segment whose first offset is `base`.
pub fn segment_file_name(base: u64) -> String {
    format!("{base:020}.log")
}

/// The first offset of a segment file name, if `name` is one.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".log")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// One entry of a segment's sparse index: a frame that starts `rel_offset`
/// records after the segment's base, at byte `pos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Offset of the frame's first record, relative to the segment base.
    pub rel_offset: u32,
    /// Byte position of the frame in the segment file.
    pub pos: u32,
}

/// Builds a sparse index: the first frame, then the first frame at least
/// `stride` bytes after the last indexed one.
#[derive(Debug, Clone)]
pub struct IndexBuilder {
    stride: u64,
    last_pos: Option<u64>,
}

impl IndexBuilder {
    /// A builder for a segment whose last indexed frame (if any) is at
    /// `last_pos`.
    pub fn new(stride: u64, last_pos: Option<u64>) -> Self {
        IndexBuilder { stride, last_pos }
    }

    /// Notes a frame; returns the entry to add, if it gets one.
    pub fn frame(&mut self, rel_offset: u64, pos: u64) -> Option<IndexEntry> {
        if self.last_pos.is_some_and(|last| pos < last + self.stride) {
            return None;
        }
        self.last_pos = Some(pos);
        // Both fit in u32: see the assertions in `limits`.
        Some(IndexEntry { rel_offset: rel_offset as u32, pos: pos as u32 })
    }
}

/// What is wrong at a damaged spot of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefectKind {
    /// The segment header (at byte 0) fails its checks.
    SegmentHeader(SegmentHeaderError),
    /// The file ends inside a frame header.
    ShortHeader,
    /// The file ends inside a frame's payload (the header is valid).
    ShortPayload,
    /// The header fails its checks.
    BadHeader(FrameError),
    /// The header is valid but the CRC over header and payload is not.
    BadCrc(FrameError),
    /// A frame that passes its CRC holds the wrong offsets.
    OutOfSequence {
        /// The base offset the frame claims.
        found: u64,
        /// The offset that was expected.
        expected: u64,
    },
}

impl DefectKind {
    /// Whether the file simply ends inside a frame (a cut, not a bad byte).
    pub fn is_short(&self) -> bool {
        matches!(self, DefectKind::ShortHeader | DefectKind::ShortPayload)
    }
}

impl std::fmt::Display for DefectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DefectKind::SegmentHeader(e) => write!(f, "{e}"),
            DefectKind::ShortHeader => f.write_str("file ends inside a frame header"),
            DefectKind::ShortPayload => f.write_str("file ends inside a frame payload"),
            DefectKind::BadHeader(e) | DefectKind::BadCrc(e) => write!(f, "{e}"),
            DefectKind::OutOfSequence { found, expected } => {
                write!(f, "frame holds offset {found}, expected {expected}")
            }
        }
    }
}

/// The first damaged spot of a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defect {
    /// Byte position of the damaged frame.
    pub pos: u64,
    /// What is wrong there.
    pub kind: DefectKind,
    /// The position of a frame after `pos` that passes its header checks and
    /// its CRC, if there is one: evidence that the damage is not a torn tail.
    pub valid_frame_after: Option<u64>,
    /// Every byte from `pos` to the end of the file is zero: the zero runway
    /// the writer keeps after the active segment's data, not damage.
    pub zero_tail: bool,
}

/// The result of walking a segment's frames.
#[derive(Debug, Clone)]
pub struct SegmentScan {
    /// The segment's format; `None` when the file is empty or its header
    /// fails its checks (then `defect` says why).
    pub format: Option<SegmentFormat>,
    /// The file's length.
    pub file_len: u64,
    /// The end of the last good frame (the whole file if there is no defect).
    pub good_len: u64,
    /// The offset after the last good frame.
    pub next_offset: u64,
    /// Number of good frames.
    pub frames: u64,
    /// The position of the last good frame, if any.
    pub last_frame_pos: Option<u64>,
    /// The sparse index of the good frames.
    pub index: Vec<IndexEntry>,
    /// The first damaged spot, if any.
    pub defect: Option<Defect>,
}

/// Reads a file front to back through one bounded buffer.
struct ChunkReader<'a> {
    file: &'a dyn File,
    len: u64,
    buf: Vec<u8>,
    buf_pos: u64,
    /// The seed of the segment's frame CRCs.
    seed: FrameSeed,
}

impl<'a> ChunkReader<'a> {
    fn new(file: &'a dyn File, len: u64) -> Self {
        ChunkReader { file, len, buf: Vec::new(), buf_pos: 0, seed: FrameSeed::UNSALTED }
    }

    /// `n` (≤ chunk size) bytes at `pos`; the caller made sure they exist.
    fn bytes(&mut self, pos: u64, n: usize) -> io::Result<&[u8]> {
        debug_assert!(n <= SCAN_CHUNK_BYTES && pos + n as u64 <= self.len);
        let have = pos >= self.buf_pos && pos + n as u64 <= self.buf_pos + self.buf.len() as u64;
        if !have {
            let want = (self.len - pos).min(SCAN_CHUNK_BYTES as u64) as usize;
            self.buf.resize(want, 0);
            self.file.read_exact_at(&mut self.buf, pos)?;
            self.buf_pos = pos;
        }
        let start = (pos - self.buf_pos) as usize;
        Ok(&self.buf[start..start + n])
    }

    /// Continues `crc` over the `n` bytes at `pos`.
    fn crc(&mut self, mut pos: u64, mut n: u64, mut crc: u32) -> io::Result<u32> {
        while n > 0 {
            let take = n.min(SCAN_CHUNK_BYTES as u64) as usize;
            crc = crc32c::crc32c_append(crc, self.bytes(pos, take)?);
            pos += take as u64;
            n -= take as u64;
        }
        Ok(crc)
    }

    fn header(&mut self, pos: u64) -> io::Result<[u8; FRAME_HEADER_LEN]> {
        Ok(self.bytes(pos, FRAME_HEADER_LEN)?.try_into().expect("header length"))
    }

    /// Whether a frame at `pos` passes its header checks and its CRC.
    fn valid_frame_at(&mut self, pos: u64) -> io::Result<bool> {
        if pos + FRAME_HEADER_LEN as u64 > self.len {
            return Ok(false);
        }
        let raw = self.header(pos)?;
        let Ok(h) = FrameHeader::parse(&raw) else { return Ok(false) };
        if pos + h.frame_len() > self.len {
            return Ok(false);
        }
        let start = crc_start(self.seed, &raw);
        let crc = self.crc(pos + FRAME_HEADER_LEN as u64, u64::from(h.stored_len), start)?;
        Ok(crc == h.crc)
    }

    /// Whether every byte from `from` to the end of the file is zero.
    fn all_zero(&mut self, mut from: u64) -> io::Result<bool> {
        while from < self.len {
            let n = (self.len - from).min(SCAN_CHUNK_BYTES as u64) as usize;
            if self.bytes(from, n)?.iter().any(|&b| b != 0) {
                return Ok(false);
            }
            from += n as u64;
        }
        Ok(true)
    }

    /// The first position after `from` where a valid frame starts.
    fn find_valid_frame(&mut self, from: u64) -> io::Result<Option<u64>> {
        let mut q = from;
        while q + FRAME_HEADER_LEN as u64 <= self.len {
            let n = (self.len - q).min(SCAN_CHUNK_BYTES as u64) as usize;
            let window = self.bytes(q, n)?;
            let Some(i) = window.windows(2).position(|w| w == [0xCA, 0xFE]) else {
                // Keep the last byte: it may be the first half of a magic.
                q += (n as u64).saturating_sub(1).max(1);
                continue;
            };
            let cand = q + i as u64;
            if self.valid_frame_at(cand)? {
                return Ok(Some(cand));
            }
            q = cand + 1;
        }
        Ok(None)
    }
}

/// Walks the frames of one segment: reads its format from its first bytes,
/// then checks every frame header (and every CRC, with the segment's seed,
/// if `check_crc`), that offsets run densely from `base`, and builds the
/// sparse index. Stops at the first damaged spot and looks for a valid frame
/// after it. Reads through one bounded buffer.
pub fn scan_segment(
    file: &dyn File,
    base: u64,
    check_crc: bool,
    stride: u64,
) -> io::Result<SegmentScan> {
    let file_len = file.len()?;
    let mut r = ChunkReader::new(file, file_len);
    let mut index = IndexBuilder::new(stride, None);
    let mut scan = SegmentScan {
        format: None,
        file_len,
        good_len: 0,
        next_offset: base,
        frames: 0,
        last_frame_pos: None,
        index: Vec::new(),
        defect: None,
    };
    if file_len == 0 {
        return Ok(scan);
    }
    let head = r.bytes(0, file_len.min(SEGMENT_HEADER_LEN as u64) as usize)?;
    let format = match parse_segment_format(head, base) {
        Ok(f) => f,
        Err(e) => {
            let kind = DefectKind::SegmentHeader(e);
            scan.defect = Some(Defect { pos: 0, kind, valid_frame_after: None, zero_tail: false });
            return Ok(scan);
        }
    };
    scan.format = Some(format);
    r.seed = format.seed();
    let mut pos = format.frames_start();
    scan.good_len = pos;
    while pos < file_len {
        let kind = match check_frame(&mut r, pos, scan.next_offset, check_crc)? {
            Ok(h) => {
                if let Some(e) = index.frame(scan.next_offset - base, pos) {
                    scan.index.push(e);
                }
                scan.last_frame_pos = Some(pos);
                scan.frames += 1;
                scan.next_offset = h.end_offset();
                pos += h.frame_len();
                scan.good_len = pos;
                continue;
            }
            Err(kind) => kind,
        };
        let zero_tail = r.all_zero(pos)?;
        // A frame whose sizes run past the end of the file is a torn tail
        // only if nothing valid follows it: a size field damaged on an
        // acked frame looks the same, with the frames after it intact.
        let valid_frame_after = if kind == DefectKind::ShortHeader || zero_tail {
            None
        } else {
            r.find_valid_frame(pos + 1)?
        };
        scan.defect = Some(Defect { pos, kind, valid_frame_after, zero_tail });
        break;
    }
    Ok(scan)
}

fn check_frame(
    r: &mut ChunkReader<'_>,
    pos: u64,
    expected: u64,
    check_crc: bool,
) -> io::Result<Result<FrameHeader, DefectKind>> {
    if pos + FRAME_HEADER_LEN as u64 > r.len {
        return Ok(Err(DefectKind::ShortHeader));
    }
    let raw = r.header(pos)?;
    let h = match FrameHeader::parse(&raw) {
        Ok(h) => h,
        Err(e) => return Ok(Err(DefectKind::BadHeader(e))),
    };
    if pos + h.frame_len() > r.len {
        return Ok(Err(DefectKind::ShortPayload));
    }
    if check_crc {
        let start = crc_start(r.seed, &raw);
        let actual = r.crc(pos + FRAME_HEADER_LEN as u64, u64::from(h.stored_len), start)?;
        if actual != h.crc {
            return Ok(Err(DefectKind::BadCrc(FrameError::Crc { expected: h.crc, actual })));
        }
    }
    if h.base_offset != expected {
        return Ok(Err(DefectKind::OutOfSequence { found: h.base_offset, expected }));
    }
    Ok(Ok(h))
}

/// Reads the header at `pos` of a segment, if the file has one there.
pub fn read_header(file: &dyn File, pos: u64) -> io::Result<[u8; FRAME_HEADER_LEN]> {
    let mut raw = [0u8; FRAME_HEADER_LEN];
    file.read_exact_at(&mut raw, pos)?;
    Ok(raw)
}

/// The path of segment `base` in `dir`.
pub fn segment_path(dir: &Path, base: u64) -> std::path::PathBuf {
    dir.join(segment_file_name(base))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checked-in bytes of the header of segment 42 of a log salted with
    /// 0x0123456789ABCDEF (CRC computed independently, with a bitwise
    /// CRC32C in Python).
    const GOLDEN_HEADER: [u8; SEGMENT_HEADER_LEN] = [
        b'N', b'A', b'R', b'A', b'D', b'L', b'O', b'G', // magic
        0x00, 0x02, // version 2
        0x00, 0x00, // flags
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a, // base offset 42
        0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, // salt
        0x52, 0x10, 0x4c, 0x47, // CRC32C of bytes [0, 28)
    ];
    const SALT: u64 = 0x0123_4567_89ab_cdef;

    #[test]
    fn segment_header_golden_bytes() {
        assert_eq!(segment_header(42, SALT), GOLDEN_HEADER);
        assert_eq!(
            parse_segment_format(&GOLDEN_HEADER, 42),
            Ok(SegmentFormat::Salted { salt: SALT })
        );
        let f = SegmentFormat::Salted { salt: SALT };
        assert_eq!((f.frames_start(), f.seed()), (32, FrameSeed::of_salt(SALT)));
        assert_eq!(
            (SegmentFormat::Legacy.frames_start(), SegmentFormat::Legacy.seed()),
            (0, FrameSeed::UNSALTED)
        );
    }

    #[test]
    fn every_damaged_header_is_refused_and_only_a_cut_or_bad_crc_may_be_a_tear() {
        // Every single-byte flip is caught (a flip making the magic a
        // frame's `CA FE` would read as format 1: not a single flip away).
        for i in 0..SEGMENT_HEADER_LEN {
            let mut h = GOLDEN_HEADER;
            h[i] ^= 0x01;
            let e = parse_segment_format(&h, 42).unwrap_err();
            assert!(e.may_be_torn(), "byte {i}: {e}");
        }
        // Every prefix is short (the first byte alone is no frame magic).
        for n in 0..SEGMENT_HEADER_LEN {
            let e = parse_segment_format(&GOLDEN_HEADER[..n], 42).unwrap_err();
            assert!(e.may_be_torn(), "{n} bytes: {e}");
        }
        // Zeros, as holes leave them.
        assert!(parse_segment_format(&[0u8; 32], 42).unwrap_err().may_be_torn());
        // Whole and CRC-valid, but not ours to write here: never a tear.
        let e = parse_segment_format(&segment_header(43, SALT), 42).unwrap_err();
        assert_eq!(e, SegmentHeaderError::WrongBase { found: 43, expected: 42 });
        assert!(!e.may_be_torn());
        let mut newer = GOLDEN_HEADER;
        newer[9] = 3;
        let crc = crc32c::crc32c(&newer[..28]);
        newer[28..].copy_from_slice(&crc.to_be_bytes());
        let e = parse_segment_format(&newer, 42).unwrap_err();
        assert!(matches!(e, SegmentHeaderError::Unknown { version: 3, .. }) && !e.may_be_torn());
        // A format 1 segment starts with a frame.
        assert_eq!(parse_segment_format(&[0xCA, 0xFE, 0x00], 42), Ok(SegmentFormat::Legacy));
    }

    #[test]
    fn segment_names_round_trip_and_strangers_are_ignored() {
        assert_eq!(segment_file_name(42), "00000000000000000042.log");
        assert_eq!(parse_segment_file_name("00000000000000000042.log"), Some(42));
        assert_eq!(parse_segment_file_name(&segment_file_name(u64::MAX)), Some(u64::MAX));
        for name in [
            "42.log",
            "0000000000000000004x.log",
            "00000000000000000042.log.tmp",
            "consumer.offset",
            "hwm",
        ] {
            assert_eq!(parse_segment_file_name(name), None, "{name}");
        }
    }

    #[test]
    fn index_builder_keeps_the_first_frame_and_one_per_stride() {
        let mut b = IndexBuilder::new(100, None);
        let got: Vec<_> = [(0, 0), (1, 40), (2, 99), (3, 100), (4, 150), (5, 220)]
            .iter()
            .filter_map(|&(o, p)| b.frame(o, p))
            .collect();
        assert_eq!(
            got,
            vec![
                IndexEntry { rel_offset: 0, pos: 0 },
                IndexEntry { rel_offset: 3, pos: 100 },
                IndexEntry { rel_offset: 5, pos: 220 }
            ]
        );
    }
}
