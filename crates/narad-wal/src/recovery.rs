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

use std::path::Path;

use bytes::Bytes;

use crate::error::WalError;
use crate::frame::{FrameHeader, HeaderFault, check_segment_header};
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
}

/// Scans a whole segment image. `base` is the sequence number from its name.
pub(crate) fn scan(image: &Bytes, base: u64) -> Scan {
    let file_len = image.len() as u64;
    let mut scan = Scan { valid_len: 0, next_seq: base, index: Vec::new(), damage: None, file_len };
    if check_segment_header(image, base).is_err() {
        scan.damage = Some((0, Damage::SegmentHeader));
        return scan;
    }
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
        if !header.check(&image[at..], &payload) {
            scan.damage = Some((pos, Damage::BadCrc));
            return scan;
        }
        if header.seq != scan.next_seq {
            scan.damage = Some((pos, Damage::SeqOutOfOrder));
            return scan;
        }
        if record::decode(header.seq, &payload).is_err() {
            scan.damage = Some((pos, Damage::UndecodableRecord));
            return scan;
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

/// Looks for valid frames behind a damaged spot at `from` whose expected
/// sequence number was `expected_seq`, and says whether any belongs to a
/// later write.
pub(crate) fn look_behind(image: &[u8], from: u64, expected_seq: u64) -> Behind {
    let mut behind = Behind::Nothing;
    let magic = crate::frame::FRAME_MAGIC.to_be_bytes();
    let mut pos = from as usize + 1;
    while pos + FRAME_HEADER_BYTES as usize <= image.len() {
        let Some(rel) = image[pos..].windows(4).position(|w| w == magic) else { break };
        let at = pos + rel;
        if let Ok(h) = FrameHeader::parse(&image[at..]) {
            let end = at as u64 + h.frame_len();
            if end <= image.len() as u64
                && h.check(&image[at..], &image[at + FRAME_HEADER_BYTES as usize..end as usize])
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

/// What opening the WAL does with `image` as segment `base` (the last
/// segment when `last`): `Ok(len)` keeps the first `len` bytes (a torn tail
/// is cut; `len` is at least the segment header), `Err(offset)` refuses to
/// open, naming that offset. [`crate::Wal::open`] applies the same steps.
pub fn verdict(image: &Bytes, base: u64, last: bool) -> Result<u64, u64> {
    let scan = scan(image, base);
    let Some((offset, damage)) = scan.damage else { return Ok(scan.valid_len) };
    let behind = if last { look_behind(image, offset, scan.next_seq) } else { Behind::Nothing };
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
}
