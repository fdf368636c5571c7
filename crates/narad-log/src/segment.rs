//! Segment files: naming, and the header walk that recovery and the sparse
//! index are built from.
//!
//! # Layout
//!
//! A partition directory `<data>/topics/<topic>/p%05d/` holds segments named
//! `%020d.log` by the offset of their first record. A segment is nothing but
//! frames (see [`crate::frame`]) back to back, from byte 0 to the end of the
//! file; there is no file header (each frame carries the magic and flags that
//! a format change would use).
//!
//! # Invariants
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
//! segment may be empty. See [`crate::recovery`] for what recovery does with
//! each case.

use std::io;
use std::path::Path;

use narad_fs::File;

use crate::frame::{FrameError, FrameHeader, crc_start};
use crate::limits::{FRAME_HEADER_LEN, SCAN_CHUNK_BYTES};

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
}

impl<'a> ChunkReader<'a> {
    fn new(file: &'a dyn File, len: u64) -> Self {
        ChunkReader { file, len, buf: Vec::new(), buf_pos: 0 }
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
        let crc =
            self.crc(pos + FRAME_HEADER_LEN as u64, u64::from(h.stored_len), crc_start(&raw))?;
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

/// Walks the frames of one segment from byte 0, checking every header (and
/// every CRC if `check_crc`), that offsets run densely from `base`, and
/// building the sparse index. Stops at the first damaged spot and looks for
/// a valid frame after it. Reads through one bounded buffer.
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
        file_len,
        good_len: 0,
        next_offset: base,
        frames: 0,
        last_frame_pos: None,
        index: Vec::new(),
        defect: None,
    };
    let mut pos = 0u64;
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
        let actual =
            r.crc(pos + FRAME_HEADER_LEN as u64, u64::from(h.stored_len), crc_start(&raw))?;
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
