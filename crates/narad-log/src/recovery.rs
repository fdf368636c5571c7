//! Recovery on open: walk every segment, then apply an explicit decision
//! table to whatever is found.
//!
//! # The decision table
//!
//! Each segment gets one [`Finding`] from the walk (the first damaged spot
//! decides), and its [`Place`] (the last segment, or a sealed one). Together
//! they map to exactly one [`Case`], and each case to one [`Decision`]:
//!
//! | place  | finding                        | case                          | decision  |
//! |--------|--------------------------------|-------------------------------|-----------|
//! | any    | clean                          | `CleanSegment`                | keep      |
//! | last   | empty file, or a header and no frames | `EmptyActiveSegment`   | keep      |
//! | last   | header cut short or torn, nothing after it | `TornHeaderOfLastSegment` | truncate |
//! | last   | only zero bytes after the frames | `ZeroRunwayOfLastSegment`   | truncate  |
//! | last   | file ends inside a frame, nothing valid after | `TornTailOfLastSegment` | truncate |
//! | last   | bad frame, nothing valid after | `GarbageTailOfLastSegment`    | truncate  |
//! | last   | bad frame or sizes past the end, valid frame after | `CorruptionBeforeValidFrames` | fail open |
//! | sealed | empty file, or a header and no frames | `EmptySealedSegment`   | fail open |
//! | sealed | only zero bytes after the frames (the next segment starts where they end) | `ZeroRunwayOfSealedSegment` | keep |
//! | sealed | torn header / ends inside a frame / bad frame | `DamagedSealedSegment` | fail open |
//! | any    | bad header with bytes after it, or a valid header that disagrees | `DamagedSegmentHeader` | fail open |
//! | any    | CRC-valid frame, wrong offsets | `FrameOutOfSequence`          | fail open |
//! | any    | name ≠ end of previous segment | `SegmentGap`                  | fail open |
//!
//! Why this is safe: a commit is acked only after its frames were fdatasynced
//! and read back, and the writer syncs a segment before it creates the next
//! one. So the only bytes a crash can damage are the unsynced tail of the
//! last segment, which no one was ever told about: truncating them loses
//! nothing acked. Damage anywhere else (a bad frame with a valid frame after
//! it, a sealed segment) is not a crash artifact; truncating it could discard
//! acked records, so opening stops with an error naming the file and the
//! byte offset, and an operator decides. (SPEC v2 resynced past such damage;
//! the v3 behaviour and issue 3 fail open instead.)
//!
//! One exception, zeros after the last frame of a sealed segment: the
//! writer cuts a segment's zero runway and syncs before sealing it, but
//! when an earlier open cut that runway and its fdatasync failed (the open
//! failed), the cut lives in the page cache only; the next process sees a
//! clean segment, seals it, and a power loss brings the runway back (found
//! by the cluster simulation, `crates/narad-broker/tests/cluster_sim.rs`).
//! Zeros hold no record, and the segment is kept as its frames only if the
//! next segment starts exactly at the offset after them: had the zeros
//! replaced acked frames, the next segment's base would be past the end of
//! what is left, and the open fails on `SegmentGap`. Nothing is truncated
//! (only the last segment ever is).
//!
//! A frame whose size fields run past the end of the file is what a crash
//! in the middle of its write leaves, but also what one damaged size field
//! of an acked frame leaves (with zstd, the stored size alone): the
//! look-ahead tells them apart, as for a bad frame. The last frame of the
//! file with a damaged size cannot be told from a torn write and is cut.
//!
//! "A valid frame after" means a position after the damage where a header
//! passes its checks and its CRC: a torn write cannot produce one, because
//! each frame is written by its own `write` call, and a torn write leaves a
//! prefix of the writes since the last sync, the last one cut short (with
//! holes, in the worst case). Nor can a client's payload: the CRC is seeded
//! with the log's secret salt (see [`crate::frame`]), so a frame a client
//! forges inside a record does not pass (format 1 segments, unsalted, are
//! only ever recovered as last segment once, right after an upgrade: the
//! writer rolls away from them before its first frame).
//!
//! A segment header is written and fdatasynced before any frame behind it
//! (see [`crate::segment`]), so only a file no longer than a header can hold
//! a header torn by a crash; it held no frame, and recovery truncates it to
//! nothing (the log then writes a fresh header into it). A bad header in a
//! longer file is damage to a file that may hold acked frames (which its
//! salt would be needed to check): opening fails.
//!
//! # The high watermark
//!
//! It is not stored: it is the offset after the last frame that survived
//! the walk (every one CRC-checked in the last segment, and in sealed
//! segments too unless [`SealedCheck::Headers`] was chosen). The commit-time
//! floor (commit times never go backwards, across restarts too) is the
//! commit time of the last record, read from the last frame.

use std::fmt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use narad_fs::{FileRef, FsRef, OpenMode};
use tracing::{info, warn};

use crate::config::{LogConfig, SealedCheck};
use crate::error::LogError;
use crate::frame::{self, FrameHeader, FrameSeed};
use crate::limits::{FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::segment::{self, DefectKind, IndexEntry, SegmentFormat, SegmentScan};

/// Where a segment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The last segment: the only one ever written to.
    Last,
    /// Any segment before it: complete and immutable.
    Sealed,
}

/// What the walk found in one segment (its first damaged spot decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finding {
    /// Every frame checks out, up to the end of the file.
    Clean,
    /// The file is empty, or holds a segment header and no frame.
    Empty,
    /// The file is no longer than a segment header, and its bytes are what
    /// a crash can leave of one being written.
    TornSegmentHeader,
    /// The segment header fails its checks and bytes follow it, or it is a
    /// whole, CRC-valid header that disagrees (version, base offset).
    DamagedSegmentHeader,
    /// After the last good frame there are only zero bytes (the writer's
    /// zero runway, or the start of one a crash left).
    ZeroTail,
    /// The file ends inside a frame header or payload, and no valid frame
    /// follows (one that does makes it `BadFrameThenValidFrame`).
    EndsInsideFrame,
    /// A frame fails its checks, and no valid frame follows it.
    BadFrameThenNothingValid,
    /// A frame fails its checks, and a valid frame follows it.
    BadFrameThenValidFrame,
    /// A frame passes its CRC but holds the wrong offsets.
    OutOfSequence,
    /// The segment's name is not where the previous segment ended.
    OffsetGap,
}

/// The recovery cases: every (place, finding) pair is exactly one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// Nothing to do.
    CleanSegment,
    /// A last segment with no frames (just rolled, or truncated to nothing).
    EmptyActiveSegment,
    /// A last segment holding only part of its header: a crash while it was
    /// being created. Truncated to nothing; the log writes a fresh header.
    TornHeaderOfLastSegment,
    /// A segment header that fails its checks with bytes after it, or that
    /// disagrees with the file: not a crash artifact.
    DamagedSegmentHeader,
    /// The last segment's zero runway (see `LogConfig::runway_bytes`):
    /// never data; cut off so the file is its frames again.
    ZeroRunwayOfLastSegment,
    /// The last segment ends in a cut-off frame: never acked, truncated.
    TornTailOfLastSegment,
    /// The last segment ends in frames that fail their checks, with nothing
    /// valid after them: an unsynced write torn with holes; truncated.
    GarbageTailOfLastSegment,
    /// A bad frame with a valid frame after it: not a crash artifact.
    CorruptionBeforeValidFrames,
    /// A sealed segment with no frames: the writer never leaves one.
    EmptySealedSegment,
    /// Only zero bytes after a sealed segment's last frame: a runway whose
    /// cut an earlier open made in the page cache only (its fdatasync
    /// failed). Kept, read as its frames; the next segment must start at
    /// the offset after them (else `SegmentGap`).
    ZeroRunwayOfSealedSegment,
    /// A sealed segment that is cut short or has a bad frame.
    DamagedSealedSegment,
    /// A frame with a valid CRC but the wrong offsets.
    FrameOutOfSequence,
    /// Offsets missing or repeated between two segments.
    SegmentGap,
}

/// What recovery does about a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Keep the segment as it is.
    Keep,
    /// Truncate the segment at the damaged spot (and fdatasync).
    Truncate,
    /// Stop the open with an error naming the file and byte offset.
    FailOpen,
}

/// The decision table's first column: which case a segment is in.
pub fn classify(place: Place, finding: Finding) -> Case {
    use Finding as F;
    match (place, finding) {
        (_, F::Clean) => Case::CleanSegment,
        (_, F::OutOfSequence) => Case::FrameOutOfSequence,
        (_, F::OffsetGap) => Case::SegmentGap,
        (_, F::DamagedSegmentHeader) => Case::DamagedSegmentHeader,
        (Place::Last, F::Empty) => Case::EmptyActiveSegment,
        (Place::Last, F::TornSegmentHeader) => Case::TornHeaderOfLastSegment,
        (Place::Last, F::ZeroTail) => Case::ZeroRunwayOfLastSegment,
        (Place::Last, F::EndsInsideFrame) => Case::TornTailOfLastSegment,
        (Place::Last, F::BadFrameThenNothingValid) => Case::GarbageTailOfLastSegment,
        (Place::Last, F::BadFrameThenValidFrame) => Case::CorruptionBeforeValidFrames,
        (Place::Sealed, F::Empty) => Case::EmptySealedSegment,
        (Place::Sealed, F::ZeroTail) => Case::ZeroRunwayOfSealedSegment,
        (
            Place::Sealed,
            F::TornSegmentHeader
            | F::EndsInsideFrame
            | F::BadFrameThenNothingValid
            | F::BadFrameThenValidFrame,
        ) => Case::DamagedSealedSegment,
    }
}

impl Case {
    /// The decision table's second column.
    pub fn decision(self) -> Decision {
        match self {
            Case::CleanSegment | Case::EmptyActiveSegment | Case::ZeroRunwayOfSealedSegment => {
                Decision::Keep
            }
            Case::ZeroRunwayOfLastSegment
            | Case::TornHeaderOfLastSegment
            | Case::TornTailOfLastSegment
            | Case::GarbageTailOfLastSegment => Decision::Truncate,
            Case::CorruptionBeforeValidFrames
            | Case::DamagedSegmentHeader
            | Case::EmptySealedSegment
            | Case::DamagedSealedSegment
            | Case::FrameOutOfSequence
            | Case::SegmentGap => Decision::FailOpen,
        }
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Case::CleanSegment => "clean segment",
            Case::EmptyActiveSegment => "empty active segment",
            Case::TornHeaderOfLastSegment => "torn header of the last segment",
            Case::DamagedSegmentHeader => "a damaged segment header",
            Case::ZeroRunwayOfLastSegment => "zero runway of the last segment",
            Case::TornTailOfLastSegment => "torn tail of the last segment",
            Case::GarbageTailOfLastSegment => "unverifiable tail of the last segment",
            Case::CorruptionBeforeValidFrames => "a bad frame followed by valid frames",
            Case::EmptySealedSegment => "an empty sealed segment",
            Case::ZeroRunwayOfSealedSegment => "zero runway of a sealed segment",
            Case::DamagedSealedSegment => "damage in a sealed segment",
            Case::FrameOutOfSequence => "a frame with the wrong offsets",
            Case::SegmentGap => "offsets missing between segments",
        })
    }
}

fn finding_of(scan: &SegmentScan) -> Finding {
    match &scan.defect {
        None if scan.frames == 0 => Finding::Empty,
        None => Finding::Clean,
        Some(d) => match d.kind {
            DefectKind::SegmentHeader(ref e)
                if e.may_be_torn() && scan.file_len <= SEGMENT_HEADER_LEN as u64 =>
            {
                Finding::TornSegmentHeader
            }
            DefectKind::SegmentHeader(_) => Finding::DamagedSegmentHeader,
            DefectKind::ShortHeader | DefectKind::BadHeader(_) if d.zero_tail => Finding::ZeroTail,
            DefectKind::OutOfSequence { .. } => Finding::OutOfSequence,
            // Sizes pointing past the end with a valid frame after them: a
            // damaged size field, not a cut (see below).
            DefectKind::ShortPayload | DefectKind::BadHeader(_) | DefectKind::BadCrc(_)
                if d.valid_frame_after.is_some() =>
            {
                Finding::BadFrameThenValidFrame
            }
            DefectKind::ShortHeader | DefectKind::ShortPayload => Finding::EndsInsideFrame,
            DefectKind::BadHeader(_) | DefectKind::BadCrc(_) => Finding::BadFrameThenNothingValid,
        },
    }
}

/// A truncation recovery performed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncation {
    /// The segment file.
    pub path: PathBuf,
    /// The length it was cut to.
    pub at: u64,
    /// How many bytes were dropped.
    pub dropped_bytes: u64,
    /// The case that led to it.
    pub case: Case,
}

/// What recovery found and did on open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segments found.
    pub segments: usize,
    /// Frames that passed the walk.
    pub frames: u64,
    /// The truncation of the last segment's tail, if one was needed.
    pub truncation: Option<Truncation>,
    /// The recovered high watermark.
    pub high_watermark: u64,
}

/// One segment as recovery leaves it.
#[derive(Debug)]
pub(crate) struct RecoveredSegment {
    pub base: u64,
    pub path: PathBuf,
    /// `None` for a last segment that is empty or was truncated to nothing
    /// (it has no header yet).
    pub format: Option<SegmentFormat>,
    pub end_pos: u64,
    pub end_offset: u64,
    pub index: Vec<IndexEntry>,
    pub last_frame_pos: Option<u64>,
    /// Kept open for the last segment only.
    pub file: Option<FileRef>,
}

/// The whole log as recovery leaves it.
#[derive(Debug)]
pub(crate) struct Recovered {
    pub segments: Vec<RecoveredSegment>,
    pub report: RecoveryReport,
    /// The commit time of the last record, if there is one.
    pub last_commit_time_ms: Option<u64>,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> LogError + 'a {
    move |e| LogError::io(op, path, e)
}

/// Walks every segment of `dir` and applies the decision table.
pub(crate) fn recover(fs: &FsRef, dir: &Path, config: &LogConfig) -> Result<Recovered, LogError> {
    let mut bases = Vec::new();
    for entry in fs.list_dir(dir).map_err(io_err("list", dir))? {
        if entry.is_dir {
            continue;
        }
        match segment::parse_segment_file_name(&entry.name) {
            Some(base) => bases.push(base),
            None if entry.name.ends_with(".log") => {
                warn!(dir = %dir.display(), file = %entry.name, "ignoring a file that is not a segment");
            }
            None => {}
        }
    }
    bases.sort_unstable();
    let mut out = Recovered {
        segments: Vec::new(),
        report: RecoveryReport::default(),
        last_commit_time_ms: None,
    };
    out.report.segments = bases.len();
    let mut prev_end: Option<u64> = None;
    for (i, &base) in bases.iter().enumerate() {
        let place = if i + 1 == bases.len() { Place::Last } else { Place::Sealed };
        let path = segment::segment_path(dir, base);
        if let Some(end) = prev_end.filter(|&end| end != base) {
            let case = classify(place, Finding::OffsetGap);
            debug_assert_eq!(case.decision(), Decision::FailOpen);
            return Err(LogError::Corrupt {
                path,
                offset: 0,
                reason: format!(
                    "{case}: the previous segment ends at offset {end}, this one starts at {base}"
                ),
            });
        }
        let file = fs.open(&path, OpenMode::Existing).map_err(io_err("open", &path))?;
        let check_crc = place == Place::Last || config.sealed_check == SealedCheck::Full;
        let scan = segment::scan_segment(&*file, base, check_crc, config.index_stride_bytes)
            .map_err(io_err("scan", &path))?;
        let case = classify(place, finding_of(&scan));
        let defect_at = scan.defect.as_ref().map_or(0, |d| d.pos);
        match case.decision() {
            Decision::Keep if case == Case::ZeroRunwayOfSealedSegment => {
                info!(
                    file = %path.display(), at = defect_at,
                    zero_bytes = scan.file_len - defect_at,
                    "recovery: a sealed segment ends in a zero runway after its last frame; \
                     kept as its frames (the next segment must start where they end)"
                );
            }
            Decision::Keep => {}
            Decision::Truncate => {
                let dropped = scan.file_len - defect_at;
                if case == Case::ZeroRunwayOfLastSegment {
                    info!(
                        file = %path.display(), at = defect_at, dropped_bytes = dropped,
                        "recovery: cutting the zero runway after the last frame"
                    );
                } else {
                    warn!(
                        file = %path.display(), at = defect_at, dropped_bytes = dropped,
                        reason = %scan.defect.as_ref().map(|d| d.kind.to_string()).unwrap_or_default(),
                        "recovery: truncating the {case} (these bytes were never acknowledged)"
                    );
                }
                file.set_len(defect_at).map_err(io_err("truncate", &path))?;
                file.sync_data().map_err(io_err("fdatasync", &path))?;
                out.report.truncation = Some(Truncation {
                    path: path.clone(),
                    at: defect_at,
                    dropped_bytes: dropped,
                    case,
                });
            }
            Decision::FailOpen => {
                let reason = match &scan.defect {
                    Some(d) => {
                        let after = d
                            .valid_frame_after
                            .map(|p| format!(" (a valid frame follows at byte {p})"))
                            .unwrap_or_default();
                        format!("{case}: {}{after}", d.kind)
                    }
                    None => format!("{case}"),
                };
                return Err(LogError::Corrupt { path, offset: defect_at, reason });
            }
        }
        out.report.frames += scan.frames;
        prev_end = Some(scan.next_offset);
        let format = scan.format.filter(|_| case != Case::TornHeaderOfLastSegment);
        out.segments.push(RecoveredSegment {
            base,
            path,
            format,
            end_pos: scan.good_len,
            end_offset: scan.next_offset,
            index: scan.index,
            last_frame_pos: scan.last_frame_pos,
            file: (place == Place::Last).then_some(file),
        });
    }
    out.report.high_watermark = out.segments.last().map_or(0, |s| s.end_offset);
    out.last_commit_time_ms = last_commit_time(fs, &out.segments)?;
    if !out.segments.is_empty() {
        info!(
            dir = %dir.display(), segments = out.segments.len(), frames = out.report.frames,
            high_watermark = out.report.high_watermark, "partition log recovered"
        );
    }
    Ok(out)
}

/// The commit time of the log's last record (from the last frame of the
/// last segment that has one).
fn last_commit_time(fs: &FsRef, segments: &[RecoveredSegment]) -> Result<Option<u64>, LogError> {
    let Some(seg) = segments.iter().rev().find(|s| s.last_frame_pos.is_some()) else {
        return Ok(None);
    };
    let pos = seg.last_frame_pos.expect("filtered above");
    let file = match &seg.file {
        Some(f) => f.clone(),
        None => fs.open(&seg.path, OpenMode::Existing).map_err(io_err("open", &seg.path))?,
    };
    let seed = seg.format.map_or(FrameSeed::UNSALTED, SegmentFormat::seed);
    let (_, last) = frame_time_bounds(&*file, &seg.path, seed, pos)?;
    Ok(Some(last))
}

/// Reads the frame at `pos` (of a segment whose frames are sealed with
/// `seed`) and returns the commit times of its first and last records. A
/// frame that fails here is reported as corruption.
pub(crate) fn frame_time_bounds(
    file: &dyn narad_fs::File,
    path: &Path,
    seed: FrameSeed,
    pos: u64,
) -> Result<(u64, u64), LogError> {
    let raw = segment::read_header(file, pos).map_err(io_err("read", path))?;
    let corrupt =
        |reason: String| LogError::Corrupt { path: path.to_path_buf(), offset: pos, reason };
    let h = FrameHeader::parse(&raw).map_err(|e| corrupt(e.to_string()))?;
    let mut stored = vec![0u8; h.stored_len as usize];
    file.read_exact_at(&mut stored, pos + FRAME_HEADER_LEN as u64).map_err(io_err("read", path))?;
    h.check_crc(seed, &raw, &stored).map_err(|e| corrupt(e.to_string()))?;
    frame::commit_time_bounds(&h, Bytes::from(stored)).map_err(|e| corrupt(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLACES: [Place; 2] = [Place::Last, Place::Sealed];
    const FINDINGS: [Finding; 10] = [
        Finding::Clean,
        Finding::Empty,
        Finding::TornSegmentHeader,
        Finding::DamagedSegmentHeader,
        Finding::ZeroTail,
        Finding::EndsInsideFrame,
        Finding::BadFrameThenNothingValid,
        Finding::BadFrameThenValidFrame,
        Finding::OutOfSequence,
        Finding::OffsetGap,
    ];

    /// The table of the module documentation, row by row: every (place,
    /// finding) pair maps to exactly the case and decision written here.
    #[test]
    fn every_place_and_finding_maps_to_exactly_one_case_and_decision() {
        use Decision::*;
        let expected = |p: Place, f: Finding| -> (Case, Decision) {
            match (p, f) {
                (_, Finding::Clean) => (Case::CleanSegment, Keep),
                (Place::Last, Finding::Empty) => (Case::EmptyActiveSegment, Keep),
                (Place::Last, Finding::TornSegmentHeader) => {
                    (Case::TornHeaderOfLastSegment, Truncate)
                }
                (_, Finding::DamagedSegmentHeader) => (Case::DamagedSegmentHeader, FailOpen),
                (Place::Last, Finding::ZeroTail) => (Case::ZeroRunwayOfLastSegment, Truncate),
                (Place::Last, Finding::EndsInsideFrame) => (Case::TornTailOfLastSegment, Truncate),
                (Place::Last, Finding::BadFrameThenNothingValid) => {
                    (Case::GarbageTailOfLastSegment, Truncate)
                }
                (Place::Last, Finding::BadFrameThenValidFrame) => {
                    (Case::CorruptionBeforeValidFrames, FailOpen)
                }
                (Place::Sealed, Finding::Empty) => (Case::EmptySealedSegment, FailOpen),
                (Place::Sealed, Finding::ZeroTail) => (Case::ZeroRunwayOfSealedSegment, Keep),
                (
                    Place::Sealed,
                    Finding::TornSegmentHeader
                    | Finding::EndsInsideFrame
                    | Finding::BadFrameThenNothingValid
                    | Finding::BadFrameThenValidFrame,
                ) => (Case::DamagedSealedSegment, FailOpen),
                (_, Finding::OutOfSequence) => (Case::FrameOutOfSequence, FailOpen),
                (_, Finding::OffsetGap) => (Case::SegmentGap, FailOpen),
            }
        };
        let mut seen = std::collections::HashSet::new();
        for p in PLACES {
            for f in FINDINGS {
                let case = classify(p, f);
                assert_eq!((case, case.decision()), expected(p, f), "{p:?} {f:?}");
                seen.insert(format!("{case:?}"));
            }
        }
        // Every case is reachable from some input.
        assert_eq!(seen.len(), 13);
        // Only the last segment is ever truncated.
        for f in FINDINGS {
            assert_ne!(classify(Place::Sealed, f).decision(), Truncate, "{f:?}");
        }
    }
}
