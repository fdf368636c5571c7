//! Recovery: what opening the WAL does with what a crash left behind.
//!
//! Every segment is scanned frame by frame (header, CRC, dense sequence
//! numbers, record format). Where the frames stop parsing, the spot is
//! classified and [`decide`] applies this table (the only two outcomes):
//!
//! | damage                                  | segment | valid frames behind it | decision      |
//! |-----------------------------------------|---------|------------------------|---------------|
//! | CRC-valid frame, wrong seq or format    | any     | any                    | fail open     |
//! | short/bad header, bad length, short payload, bad CRC | sealed | any     | fail open     |
//! | same                                    | last    | none                   | truncate tail |
//! | same                                    | last    | only of the same write | truncate tail |
//! | same                                    | last    | of a later write       | fail open     |
//!
//! Why: a write is one `pwrite` + `fdatasync`, and nothing in it is acked
//! before its sync returns. A crash during the write can leave its end
//! missing or holes of zeros in front of written sectors: that is a torn
//! write, never acked, and truncating it loses nothing promised. A valid
//! frame of a *later* write proves the damaged write was synced, so the
//! damage is to acked data: open fails and names the file and offset, for
//! an operator to look at. Sealed segments were synced whole before the next
//! segment was created, so any damage there is corruption.
//!
//! # Client bytes at the end of the file
//!
//! A record's payload is its last field, so when a write ends the file (a
//! group too large to top up the zero runway, a record longer than the
//! runway) the file's last bytes are a client's. No rule may read them as
//! ours: the scan always runs over the whole file, and a preparation
//! trailer is honoured only by [`prepared_tail`], which asks for our own
//! header's flag and nothing but zeros between the frames and the trailer
//! (a client's bytes are inside a valid frame, never behind the damage).
//! Nor can a client's bytes pass for a frame of a later write behind a
//! tear: every frame's CRC is seeded with its segment's secret salt (see
//! [`crate::frame`]), which the scan and the look-behind both use, so a
//! frame a client embedded in a payload (sealed with the public CRC, or a
//! guessed salt) is not a valid frame, and a torn, never-acked write that
//! carries one is cut like any other. A version 1 segment (no salt, left
//! by an older binary) keeps the old rule: there, such a payload makes the
//! open fail instead of cutting the tear (an operator must look; no record
//! is lost).

use std::path::Path;

use bytes::Bytes;

use crate::error::WalError;
use crate::frame::{
    FrameHeader, FrameSeed, HeaderFault, SEGMENT_FLAG_PREPARED, SegmentHeader, check_segment_header,
};
use crate::limits::{FRAME_HEADER_BYTES, INDEX_STRIDE_BYTES, SEGMENT_BYTES, SEGMENT_HEADER_BYTES};
use crate::record;

/// What is wrong at the spot where a segment's frames stop parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Damage {
    /// The segment header is missing, short or fails its CRC.
    SegmentHeader,
    /// Fewer bytes than a frame header remain.
    ShortHeader,
    /// The frame magic does not match.
    BadMagic,
    /// The length field is zero or over the limit.
    BadLength,
    /// The payload runs past the end of the file.
    ShortPayload,
    /// The CRC does not match.
    BadCrc,
    /// A CRC-valid frame with an unexpected sequence number.
    SeqOutOfOrder,
    /// A CRC-valid frame whose record does not decode.
    UndecodableRecord,
}

/// What lies behind the damaged spot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Behind {
    /// No valid frame.
    Nothing,
    /// Valid frames, all from the same write as the damaged spot.
    SameWrite,
    /// At least one valid frame of a later write.
    LaterWrite,
}

/// The two outcomes of recovery at a damaged spot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Cut the file at the damaged spot: those bytes were never acked.
    TruncateTail,
    /// Refuse to open, naming the file and offset.
    FailOpen,
}

/// The recovery table (see the module documentation).
pub(crate) fn decide(damage: Damage, last_segment: bool, behind: Behind) -> Decision {
    match (damage, last_segment, behind) {
        (Damage::SeqOutOfOrder | Damage::UndecodableRecord, _, _) => Decision::FailOpen,
        (_, false, _) => Decision::FailOpen,
        (_, true, Behind::LaterWrite) => Decision::FailOpen,
        (_, true, Behind::Nothing | Behind::SameWrite) => Decision::TruncateTail,
    }
}

/// The result of scanning one segment.
#[derive(Debug)]
pub(crate) struct Scan {
    /// Byte offset after the last good frame (the header's end if none).
    pub valid_len: u64,
    /// First sequence number after the last good frame.
    pub next_seq: u64,
    /// Sparse (seq, offset) index of the good frames.
    pub index: Vec<(u64, u64)>,
    /// Where the frames stopped parsing, if not at the end of the file.
    pub damage: Option<(u64, Damage)>,
    /// The file's length.
    pub file_len: u64,
    /// The segment header, if it passed its checks.
    pub header: Option<SegmentHeader>,
    /// The highest topic incarnation a good frame's record carries, with
    /// that record's sequence number (the first such record).
    pub newest_incarnation: Option<(u64, u64)>,
}

impl Scan {
    /// The seed the segment's frames are checked with.
    pub fn seed(&self) -> FrameSeed {
        self.header.map_or(FrameSeed::UNSALTED, |h| h.seed())
    }
}

/// Scans a whole segment image. `base` is the sequence number from its name.
pub(crate) fn scan(image: &Bytes, base: u64) -> Scan {
    let file_len = image.len() as u64;
    let mut scan = Scan {
        valid_len: 0,
        next_seq: base,
        index: Vec::new(),
        damage: None,
        file_len,
        header: None,
        newest_incarnation: None,
    };
    let Ok(segment_header) = check_segment_header(image, base) else {
        scan.damage = Some((0, Damage::SegmentHeader));
        return scan;
    };
    scan.header = Some(segment_header);
    let seed = segment_header.seed();
    let mut pos = SEGMENT_HEADER_BYTES;
    scan.valid_len = pos;
    let mut last_indexed: Option<u64> = None;
    while pos < file_len {
        let at = pos as usize;
        let header = match FrameHeader::parse(&image[at..]) {
            Ok(h) => h,
            Err(HeaderFault::Short) => {
                scan.damage = Some((pos, Damage::ShortHeader));
                return scan;
            }
            Err(HeaderFault::BadMagic) => {
                scan.damage = Some((pos, Damage::BadMagic));
                return scan;
            }
            Err(HeaderFault::BadLength(_)) => {
                scan.damage = Some((pos, Damage::BadLength));
                return scan;
            }
        };
        let end = pos + header.frame_len();
        if end > file_len {
            scan.damage = Some((pos, Damage::ShortPayload));
            return scan;
        }
        let payload = image.slice(at + FRAME_HEADER_BYTES as usize..end as usize);
        if !header.check(&image[at..], &payload, seed) {
            scan.damage = Some((pos, Damage::BadCrc));
            return scan;
        }
        if header.seq != scan.next_seq {
            scan.damage = Some((pos, Damage::SeqOutOfOrder));
            return scan;
        }
        let Ok(rec) = record::decode(header.seq, &payload) else {
            scan.damage = Some((pos, Damage::UndecodableRecord));
            return scan;
        };
        if let Some(inc) = rec.incarnation
            && scan.newest_incarnation.is_none_or(|(newest, _)| inc > newest)
        {
            scan.newest_incarnation = Some((inc, header.seq));
        }
        if last_indexed.is_none_or(|l| pos >= l + INDEX_STRIDE_BYTES) {
            scan.index.push((header.seq, pos));
            last_indexed = Some(pos);
        }
        scan.next_seq += 1;
        pos = end;
        scan.valid_len = pos;
    }
    scan
}

/// Looks for valid frames (sealed with the segment's `seed`) behind a
/// damaged spot at `from` whose expected sequence number was
/// `expected_seq`, and says whether any belongs to a later write.
pub(crate) fn look_behind(image: &[u8], from: u64, expected_seq: u64, seed: FrameSeed) -> Behind {
    let mut behind = Behind::Nothing;
    let magic = crate::frame::FRAME_MAGIC.to_be_bytes();
    let mut pos = from as usize + 1;
    while pos + FRAME_HEADER_BYTES as usize <= image.len() {
        let Some(rel) = image[pos..].windows(4).position(|w| w == magic) else { break };
        let at = pos + rel;
        if let Ok(h) = FrameHeader::parse(&image[at..]) {
            let end = at as u64 + h.frame_len();
            if end <= image.len() as u64
                && h.check(
                    &image[at..],
                    &image[at + FRAME_HEADER_BYTES as usize..end as usize],
                    seed,
                )
            {
                if h.write_first_seq() > expected_seq {
                    return Behind::LaterWrite;
                }
                behind = Behind::SameWrite;
            }
        }
        pos = at + 1;
    }
    behind
}

/// Whether the last segment `image`, whose scan is `scan`, is a prepared
/// segment in its normal state (see [`crate::prep`]): it ends in a valid
/// trailer at its limit, its frames stop before that limit, everything
/// from the last good frame up to the trailer is zeros, and its header
/// carries [`SEGMENT_FLAG_PREPARED`] (or is zeros itself: the roll renamed
/// the file in and no write reached it, so the whole file is zeros and a
/// trailer). Then the zeros and the trailer are kept: the segment goes on
/// overwriting allocated blocks. Any other tail is cut, trailer included.
///
/// Never steered by a payload: a client's bytes are in a frame that passed
/// the scan, so they are before the first damage, and a trailer honoured
/// here lies behind zeros that run from that damage to it.
pub(crate) fn prepared_tail(image: &[u8], scan: &Scan) -> bool {
    // Frames run to the end of the file: its last bytes are a payload's,
    // whatever they look like.
    let Some((from, damage)) = scan.damage else { return false };
    let Some(limit) = crate::prep::prepared_limit(image) else { return false };
    if from > limit || image[from as usize..limit as usize].iter().any(|&b| b != 0) {
        return false;
    }
    match damage {
        Damage::SegmentHeader => from == 0,
        _ => scan.header.is_some_and(|h| h.flags & SEGMENT_FLAG_PREPARED != 0),
    }
}

/// What opening the WAL does with `image` as segment `base` (the last
/// segment when `last`): `Ok(len)` keeps the first `len` bytes (a torn tail
/// is cut; `len` is at least the segment header), `Err(offset)` refuses to
/// open, naming that offset; for a prepared last segment kept as it is
/// ([`prepared_tail`]), `len` is where its frames end. [`crate::Wal::open`]
/// applies the same steps.
pub fn verdict(image: &Bytes, base: u64, last: bool) -> Result<u64, u64> {
    let scan = scan(image, base);
    if last && prepared_tail(image, &scan) {
        return Ok(scan.valid_len.max(SEGMENT_HEADER_BYTES));
    }
    let Some((offset, damage)) = scan.damage else { return Ok(scan.valid_len) };
    let behind =
        if last { look_behind(image, offset, scan.next_seq, scan.seed()) } else { Behind::Nothing };
    match decide(damage, last, behind) {
        Decision::FailOpen => Err(offset),
        Decision::TruncateTail if damage == Damage::SegmentHeader => Ok(SEGMENT_HEADER_BYTES),
        Decision::TruncateTail => Ok(offset),
    }
}

/// Reads a whole segment file into memory for scanning.
pub(crate) fn read_image(
    file: &dyn narad_fs::File,
    path: &Path,
    segment_bytes: u64,
) -> Result<Bytes, WalError> {
    let len = file.len().map_err(|e| WalError::io("stat segment", path, e))?;
    // A prepared last segment is a whole segment plus its trailer.
    let max = segment_bytes.max(SEGMENT_BYTES) + crate::prep::PREP_TRAILER_BYTES;
    if len > max {
        return Err(WalError::Corrupt {
            path: path.to_path_buf(),
            offset: max,
            reason: format!("segment is {len} bytes, more than a segment can ever hold"),
        });
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, 0).map_err(|e| WalError::io("read segment", path, e))?;
    Ok(Bytes::from(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAMAGES: [Damage; 8] = [
        Damage::SegmentHeader,
        Damage::ShortHeader,
        Damage::BadMagic,
        Damage::BadLength,
        Damage::ShortPayload,
        Damage::BadCrc,
        Damage::SeqOutOfOrder,
        Damage::UndecodableRecord,
    ];

    #[test]
    fn recovery_table_truncates_only_unacked_tails_of_the_last_segment() {
        for d in DAMAGES {
            for last in [false, true] {
                for behind in [Behind::Nothing, Behind::SameWrite, Behind::LaterWrite] {
                    let expect = if last
                        && behind != Behind::LaterWrite
                        && !matches!(d, Damage::SeqOutOfOrder | Damage::UndecodableRecord)
                    {
                        Decision::TruncateTail
                    } else {
                        Decision::FailOpen
                    };
                    assert_eq!(decide(d, last, behind), expect, "{d:?} last={last} {behind:?}");
                }
            }
        }
    }

    /// A keyless record of topic `t`, partition 0.
    fn rec(payload: &[u8]) -> crate::RecordRef<'_> {
        crate::RecordRef {
            topic: "t",
            incarnation: None,
            key: None,
            partition: 0,
            accepted_at_ms: 0,
            payload,
        }
    }

    const SALT: u64 = 0x5eed;

    /// A segment image: `header` (salted with [`SALT`]), one frame of
    /// `payload` (seq 0), `gap` zeros, and a trailer naming the offset where
    /// it starts.
    fn image(header: [u8; 32], payload: &[u8], gap: usize) -> Vec<u8> {
        let mut out = header.to_vec();
        let r = rec(payload);
        let at = crate::frame::begin_frame(&mut out, r.encoded_len().unwrap(), 0, 0);
        r.encode_into(&mut out);
        crate::frame::seal_frame(&mut out, at, FrameSeed::of_salt(SALT));
        out.resize(out.len() + gap, 0);
        let limit = out.len() as u32;
        out.extend_from_slice(&crate::prep::trailer(limit));
        out
    }

    fn honoured(image: &[u8]) -> bool {
        prepared_tail(image, &scan(&Bytes::copy_from_slice(image), 0))
    }

    #[test]
    fn a_trailer_counts_only_behind_zeros_in_a_segment_our_header_says_was_prepared() {
        let flagged = crate::frame::segment_header_with_flags(0, SEGMENT_FLAG_PREPARED, SALT);
        let plain = crate::frame::segment_header(0, SALT);
        // The normal state of a prepared active segment.
        assert!(honoured(&image(flagged, b"abc", 100)));
        assert!(honoured(&image(flagged, b"abc", 0)), "frames filling it to the limit");
        // Not prepared by us: the trailer is cut with the zeros.
        assert!(!honoured(&image(plain, b"abc", 100)));
        // Anything but zeros between the frames and the trailer.
        let mut dirty = image(flagged, b"abc", 100);
        dirty[90] = 1;
        assert!(!honoured(&dirty));
        // A payload that ends the file in a trailer naming where it starts:
        // the frames run to the end of the file, so there is no trailer.
        let mut payload = vec![7u8; 64];
        let frame_end = 32 + 24 + (1 + 4 + 1 + 4 + 4 + 8 + 4 + payload.len());
        let t = crate::prep::trailer((frame_end - 16) as u32);
        payload[48..].copy_from_slice(&t);
        let mut forged = flagged.to_vec();
        let r = rec(&payload);
        assert_eq!(32 + 24 + r.encoded_len().unwrap() as usize, frame_end);
        let at = crate::frame::begin_frame(&mut forged, r.encoded_len().unwrap(), 0, 0);
        r.encode_into(&mut forged);
        crate::frame::seal_frame(&mut forged, at, FrameSeed::of_salt(SALT));
        assert!(crate::prep::prepared_limit(&forged).is_some(), "the forgery is well formed");
        assert!(!honoured(&forged));
        assert_eq!(verdict(&Bytes::from(forged.clone()), 0, true), Ok(forged.len() as u64));
        // A header that is zeros (renamed in, nothing written): only if the
        // whole file is zeros up to the trailer.
        let mut blank = vec![0u8; 200];
        blank.extend_from_slice(&crate::prep::trailer(200));
        assert!(honoured(&blank));
        blank[150] = 1;
        assert!(!honoured(&blank));
    }
}
