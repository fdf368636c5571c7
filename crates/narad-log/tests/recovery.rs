//! Recovery on open, one test per case of the decision table in
//! `narad_log::recovery` (the table itself is unit-tested there).
#![allow(clippy::single_range_in_vec_init)] // lists of corrupt offset ranges, on purpose

mod common;

use std::path::{Path, PathBuf};

use common::*;
use narad_clock::ManualClock;
use narad_fs::{CrashMode, Fs, OpenMode, SimFs};
use narad_log::frame::{FrameHeader, FrameSeed, PayloadBuilder};
use narad_log::limits::FRAME_HEADER_LEN;
use narad_log::recovery::Case;
use narad_log::segment::SegmentFormat;
use narad_log::{Codec, CommitRecord, LogConfig, LogError, SealedCheck};

/// `small_config` without the zero runway: these tests damage files at
/// positions computed from their frames, so a file must be its frames.
fn exact_config() -> LogConfig {
    LogConfig { runway_bytes: 0, ..small_config() }
}

/// A config with one big segment and small frames.
fn one_segment() -> LogConfig {
    LogConfig { segment_bytes: 1 << 20, ..exact_config() }
}

fn append_raw(fs: &SimFs, path: &Path, bytes: &[u8]) {
    let f = fs.open(path, OpenMode::Existing).unwrap();
    let len = f.len().unwrap();
    f.write_all_at(bytes, len).unwrap();
    f.sync_data().unwrap();
}

/// A log with `n` single-record commits (one frame each).
fn log_with_frames(fs: &SimFs, config: &LogConfig, n: usize) -> Vec<CommitRecord> {
    let clock = ManualClock::new(T0);
    let log = open_sim(fs, config, &clock).unwrap();
    let records = recs("r", n);
    for r in &records {
        log.commit(vec![r.clone()]).unwrap();
    }
    records
}

fn assert_records(fs: &SimFs, config: &LogConfig, expected: &[CommitRecord]) {
    let log = open_sim(fs, config, &ManualClock::new(T0)).unwrap();
    let got = read_all(&log);
    assert_eq!(got.len(), expected.len());
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!((g.offset, &g.key, &g.payload), (i as u64, &e.key, &e.payload));
    }
}

fn only_segment(fs: &SimFs) -> PathBuf {
    let segs = segment_paths(fs);
    assert_eq!(segs.len(), 1);
    segs[0].clone()
}

/// A frame the log would write at `base` into segment `seg` (sealed with
/// its seed).
fn a_frame(fs: &SimFs, seg: &Path, base: u64) -> Vec<u8> {
    let mut p = PayloadBuilder::new();
    p.push(Some(b"k"), T0, b"a frame that was never acknowledged");
    p.finish(base, Codec::None, segment_seed(fs, seg)).unwrap()
}

#[test]
fn clean_log_reopens_with_the_same_high_watermark_and_records() {
    let fs = SimFs::new(1);
    let config = exact_config();
    let records = log_with_frames(&fs, &config, 60);
    assert!(segment_paths(&fs).len() > 3, "small segments roll");
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    assert_eq!(log.high_watermark(), 60);
    assert_eq!(log.recovery_report().truncation, None);
    drop(log);
    assert_records(&fs, &config, &records);
}

#[test]
fn torn_tail_of_last_segment_is_truncated() {
    for cut in [1, FRAME_HEADER_LEN - 1, FRAME_HEADER_LEN, FRAME_HEADER_LEN + 5] {
        let fs = SimFs::new(2);
        let config = one_segment();
        let records = log_with_frames(&fs, &config, 5);
        let seg = only_segment(&fs);
        let good_len = fs.durable_len(&seg).unwrap();
        let frame = a_frame(&fs, &seg, 5);
        append_raw(&fs, &seg, &frame[..cut]);
        let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
        let t = log.recovery_report().truncation.clone().expect("a truncation");
        assert_eq!(
            (t.case, t.at, t.dropped_bytes),
            (Case::TornTailOfLastSegment, good_len, cut as u64)
        );
        assert_eq!(log.high_watermark(), 5);
        // The truncation is durable, and the next commit starts clean.
        assert_eq!(fs.durable_len(&seg), Some(good_len));
        assert_eq!(log.commit(vec![CommitRecord::keyless("next")]).unwrap().first_offset, 5);
        drop(log);
        let mut expected = records.clone();
        expected.push(CommitRecord::keyless("next"));
        assert_records(&fs, &config, &expected);
    }
}

#[test]
fn garbage_tail_of_last_segment_without_valid_frames_is_truncated() {
    // Only zeros (the writer's zero runway, or a torn write that reached
    // none of its bytes); a frame cut short by zeros (a torn overwrite of
    // the runway); and a whole last frame whose payload does not match its
    // CRC: nothing valid after any of them.
    for damage in ["zeros", "frame then zeros", "bad last frame"] {
        let fs = SimFs::new(3);
        let config = one_segment();
        let records = log_with_frames(&fs, &config, 5);
        let seg = only_segment(&fs);
        let good_len = fs.durable_len(&seg).unwrap();
        let case = match damage {
            "zeros" => {
                append_raw(&fs, &seg, &[0u8; 700]);
                Case::ZeroRunwayOfLastSegment
            }
            "frame then zeros" => {
                let mut bytes = a_frame(&fs, &seg, 5);
                let half = bytes.len() / 2;
                bytes[half..].fill(0);
                bytes.extend_from_slice(&[0u8; 300]);
                append_raw(&fs, &seg, &bytes);
                Case::GarbageTailOfLastSegment
            }
            _ => {
                let mut frame = a_frame(&fs, &seg, 5);
                let last = frame.len() - 1;
                frame[last] ^= 0xff;
                append_raw(&fs, &seg, &frame);
                Case::GarbageTailOfLastSegment
            }
        };
        let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
        let t = log.recovery_report().truncation.clone().expect("a truncation");
        assert_eq!((t.case, t.at), (case, good_len), "{damage}");
        assert_eq!(log.high_watermark(), 5);
        drop(log);
        assert_eq!(fs.durable_len(&seg).unwrap(), good_len, "{damage}: cut durably");
        assert_records(&fs, &config, &records);
    }
}

/// A record of about 250 bytes.
fn big_record(tag: &str, i: usize) -> CommitRecord {
    CommitRecord::keyless(format!("{tag}-{i}-{}", "x".repeat(240)))
}

#[test]
fn the_zero_runway_is_kept_ahead_of_small_commits_and_trimmed_before_a_seal() {
    let fs = SimFs::new(21);
    // 4 KiB segments and runway: frames of up to 512 B top it up.
    let config = LogConfig { segment_bytes: 4096, runway_bytes: 4096, ..small_config() };
    let clock = ManualClock::new(T0);
    let log = open_sim(&fs, &config, &clock).unwrap();
    let file_len = |p: &Path| fs.open(p, OpenMode::Existing).unwrap().len().unwrap();
    let mut committed = Vec::new();
    let mut saw_runway = false;
    for i in 0..40 {
        let batch = vec![big_record("r", i)];
        committed.extend(batch.clone());
        log.commit(batch).unwrap();
        let segs = segment_paths(&fs);
        let (last, sealed) = segs.split_last().unwrap();
        let data = log.stats().size_bytes - sealed.iter().map(|p| file_len(p)).sum::<u64>();
        let len = file_len(last);
        // The runway: at most the configured bytes, at most the data, never
        // past the segment size, and durable with the frame it followed.
        assert!(len >= data && len - data <= data, "{i}: {len} vs {data}");
        assert!(len <= 4096, "{i}");
        assert_eq!(fs.durable_len(last).unwrap(), len, "{i}: the runway is synced");
        saw_runway |= len > data;
        // Sealed segments are exactly their frames.
        for p in sealed {
            let f = fs.open(p, OpenMode::Existing).unwrap();
            let scan_end: u64 = frame_positions(&fs, p)
                .last()
                .map(|&pos| {
                    let mut raw = [0u8; FRAME_HEADER_LEN];
                    f.read_exact_at(&mut raw, pos).unwrap();
                    pos + FrameHeader::parse(&raw).unwrap().frame_len()
                })
                .unwrap();
            assert_eq!(scan_end, file_len(p), "{i}: a sealed segment ends with its last frame");
        }
    }
    assert!(saw_runway, "small commits ran ahead of a runway");
    assert!(segment_paths(&fs).len() >= 3, "segments rolled");
    // A batch of several frames trims the runway first and appends.
    let big: Vec<_> = (0..12).map(|i| big_record("big", i)).collect();
    committed.extend(big.clone());
    log.commit(big).unwrap();
    // Reopen: the runway is cut, as a runway, and every record is there.
    drop(log);
    let log = open_sim(&fs, &config, &clock).unwrap();
    if let Some(t) = &log.recovery_report().truncation {
        assert_eq!(t.case, Case::ZeroRunwayOfLastSegment);
    }
    let got = read_all(&log);
    assert_eq!(got.len(), committed.len());
    for (g, e) in got.iter().zip(&committed) {
        assert_eq!(&g.payload, &e.payload);
    }
}

/// Zeros after a sealed segment's frames (a runway an earlier open cut in
/// the page cache only, back after a power loss) hold no record; the next
/// segment starts where the frames end, so the segment is kept as its
/// frames. (Zeros in place of frames fail the open on the gap they leave:
/// `commit.rs`, `zeros_in_place_of_a_sealed_segments_last_frame_fail_the_open`.)
#[test]
fn zeros_after_a_sealed_segments_frames_are_kept_as_a_runway() {
    let fs = SimFs::new(22);
    let config = LogConfig { segment_bytes: 1024, ..exact_config() };
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    for i in 0..8 {
        log.commit(vec![big_record("s", i)]).unwrap();
    }
    drop(log);
    let segs = segment_paths(&fs);
    assert!(segs.len() >= 2);
    append_raw(&fs, &segs[0], &[0u8; 100]);
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    assert_eq!(read_all(&log).len(), 8, "every record read, none from the zeros");
    assert_eq!(log.commit(vec![big_record("t", 0)]).unwrap().offsets(), 8..9);
}

#[test]
fn bad_frame_followed_by_valid_frames_fails_open_naming_file_and_offset() {
    let fs = SimFs::new(4);
    let config = one_segment();
    log_with_frames(&fs, &config, 5);
    let seg = only_segment(&fs);
    let pos = frame_positions(&fs, &seg)[2];
    // One flipped byte in the payload of the third frame.
    fs.poke(&seg, pos + FRAME_HEADER_LEN as u64 + 3, &[0xee]).unwrap();
    match open_sim(&fs, &config, &ManualClock::new(T0)) {
        Err(LogError::Corrupt { path, offset, reason }) => {
            assert_eq!((path, offset), (seg.clone(), pos));
            assert!(reason.contains("followed by valid frames"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // A damaged header (the magic) is the same case.
    let fs = SimFs::new(4);
    log_with_frames(&fs, &config, 5);
    let pos = frame_positions(&fs, &seg)[1];
    fs.poke(&seg, pos, &[0x00]).unwrap();
    let err = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap_err();
    assert!(matches!(err, LogError::Corrupt { offset, .. } if offset == pos), "{err}");
    // The message names the file and the byte offset.
    let msg = err.to_string();
    assert!(
        msg.contains("00000000000000000000.log") && msg.contains(&format!("byte {pos}")),
        "{msg}"
    );
}

#[test]
fn damage_in_a_sealed_segment_fails_open() {
    let config = exact_config();
    // A flipped payload byte, a cut-off end, and a damaged last frame: in a
    // sealed segment, each fails the open.
    for damage in ["flip", "cut", "last frame"] {
        let fs = SimFs::new(5);
        log_with_frames(&fs, &config, 60);
        let segs = segment_paths(&fs);
        assert!(segs.len() >= 3);
        let sealed = &segs[0];
        let positions = frame_positions(&fs, sealed);
        let len = fs.durable_len(sealed).unwrap();
        let at = match damage {
            "flip" => {
                fs.poke(sealed, positions[0] + FRAME_HEADER_LEN as u64 + 1, &[0x99]).unwrap();
                positions[0]
            }
            "cut" => {
                let f = fs.open(sealed, OpenMode::Existing).unwrap();
                f.set_len(len - 3).unwrap();
                f.sync_data().unwrap();
                *positions.last().unwrap()
            }
            _ => {
                fs.poke(sealed, len - 1, &[0x99]).unwrap();
                *positions.last().unwrap()
            }
        };
        match open_sim(&fs, &config, &ManualClock::new(T0)) {
            Err(LogError::Corrupt { path, offset, reason }) => {
                assert_eq!((&path, offset), (sealed, at), "{damage}");
                assert!(reason.contains("sealed"), "{damage}: {reason}");
            }
            other => panic!("{damage}: expected Corrupt, got {other:?}"),
        }
    }
}

#[test]
fn with_header_checks_only_sealed_payload_damage_is_found_at_read_time() {
    let fs = SimFs::new(6);
    let config = LogConfig { sealed_check: SealedCheck::Headers, cache_bytes: 0, ..exact_config() };
    let records = log_with_frames(&fs, &config, 30);
    let sealed = segment_paths(&fs)[0].clone();
    let pos = frame_positions(&fs, &sealed)[1];
    fs.poke(&sealed, pos + FRAME_HEADER_LEN as u64 + 2, &[0x77]).unwrap();
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    assert_eq!(log.high_watermark(), 30);
    let b = log.read(0, 100, 1 << 20).unwrap();
    assert_eq!(b.corrupt, vec![1..2], "exactly the damaged frame's record");
    assert_eq!(b.records.len(), 29);
    assert_eq!(b.records[1].offset, 2);
    assert_eq!(b.records[1].payload, records[2].payload);
    assert_eq!(log.corrupt_frames_skipped(), 1);
}

#[test]
fn frame_with_the_wrong_offsets_fails_open() {
    let fs = SimFs::new(7);
    let config = one_segment();
    log_with_frames(&fs, &config, 5);
    let seg = only_segment(&fs);
    let len = fs.durable_len(&seg).unwrap();
    // A frame with a valid CRC that claims offset 9 where 5 is next.
    append_raw(&fs, &seg, &a_frame(&fs, &seg, 9));
    match open_sim(&fs, &config, &ManualClock::new(T0)) {
        Err(LogError::Corrupt { offset, reason, .. }) => {
            assert_eq!(offset, len);
            assert!(reason.contains("offset 9, expected 5"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn offset_gap_between_segments_fails_open() {
    let fs = SimFs::new(8);
    let config = exact_config();
    log_with_frames(&fs, &config, 60);
    let segs = segment_paths(&fs);
    assert!(segs.len() >= 3);
    fs.remove_file(&segs[1]).unwrap();
    match open_sim(&fs, &config, &ManualClock::new(T0)) {
        Err(LogError::Corrupt { path, reason, .. }) => {
            assert_eq!(path, segs[2]);
            assert!(reason.contains("offsets missing between segments"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn empty_sealed_segment_fails_open_and_empty_active_segment_is_kept() {
    let config = one_segment();
    let fs = SimFs::new(9);
    let records = log_with_frames(&fs, &config, 5);
    // An empty segment where the next one would start: kept (a roll that
    // crashed before its first frame reached the disk).
    let empty = dir().join("00000000000000000005.log");
    fs.open(&empty, OpenMode::CreateNew).unwrap();
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    assert_eq!((log.high_watermark(), log.stats().segments), (5, 2));
    drop(log);
    assert_records(&fs, &config, &records);
    // Another segment after it makes it a sealed empty segment: refused.
    let fs2 = SimFs::new(9);
    log_with_frames(&fs2, &config, 5);
    fs2.open(&empty, OpenMode::CreateNew).unwrap();
    let later = dir().join("00000000000000000006.log");
    fs2.open(&later, OpenMode::CreateNew).unwrap();
    match open_sim(&fs2, &config, &ManualClock::new(T0)) {
        Err(LogError::Corrupt { path, reason, .. }) => {
            assert_eq!(path, empty);
            assert!(reason.contains("empty sealed segment"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn commits_continue_in_the_empty_active_segment() {
    let config = one_segment();
    let fs = SimFs::new(10);
    let mut records = log_with_frames(&fs, &config, 3);
    fs.open(&dir().join("00000000000000000003.log"), OpenMode::CreateNew).unwrap();
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    let more = recs("more", 4);
    assert_eq!(log.commit(more.clone()).unwrap().offsets(), 3..7);
    assert_eq!(log.stats().segments, 2);
    drop(log);
    records.extend(more);
    assert_records(&fs, &config, &records);
}

#[test]
fn sparse_index_is_rebuilt_on_open_and_finds_every_offset() {
    let fs = SimFs::new(11);
    // Many small frames per index stride, cache off: every read walks from
    // an index entry.
    let config = LogConfig { segment_bytes: 64 << 10, cache_bytes: 0, ..exact_config() };
    let records = log_with_frames(&fs, &config, 600);
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    for offset in [0u64, 1, 17, 255, 256, 411, 598, 599] {
        let b = log.read(offset, 1, 1 << 20).unwrap();
        assert_eq!(b.records.len(), 1);
        assert_eq!(b.records[0].offset, offset);
        assert_eq!(b.records[0].payload, records[offset as usize].payload);
    }
}

#[test]
fn open_creates_a_missing_directory_and_ignores_foreign_files() {
    let fs = SimFs::new(12);
    let config = exact_config();
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    assert!(fs.exists(&dir()).unwrap());
    // No segment exists before the first commit.
    assert!(segment_paths(&fs).is_empty());
    assert_eq!(log.stats().segments, 0);
    log.commit(recs("a", 2)).unwrap();
    drop(log);
    for name in ["hwm", "consumer.offset", "notes.log", "fanout-x.offset"] {
        fs.open(&dir().join(name), OpenMode::CreateNew).unwrap();
    }
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    assert_eq!(log.high_watermark(), 2);
}

#[test]
fn recovery_after_a_torn_crash_in_the_middle_of_a_commit_keeps_every_acked_record() {
    // A commit whose bytes were written but not synced when the machine
    // stopped: whatever part of it survives, reopening works and the
    // earlier commits are intact.
    for seed in 0..40 {
        let fs = SimFs::new(seed);
        let config = exact_config();
        let clock = ManualClock::new(T0);
        let log = open_sim(&fs, &config, &clock).unwrap();
        let acked = recs("acked", 12);
        log.commit(acked.clone()).unwrap();
        // Cut the power at the next cycle's first or second operation (its
        // write or its fdatasync, or the roll before them).
        fs.power_cut_at(fs.op_count() + seed % 2);
        assert!(log.commit(recs("lost", 9)).is_err());
        drop(log);
        let mode =
            [CrashMode::DropUnsynced, CrashMode::Torn, CrashMode::TornWithHoles][seed as usize % 3];
        fs.crash(mode);
        let log = open_sim(&fs, &config, &clock).unwrap();
        let got = read_all(&log);
        assert!(got.len() >= 12, "seed {seed}");
        for (g, e) in got.iter().zip(&acked) {
            assert_eq!(g.payload, e.payload, "seed {seed}");
        }
    }
}

/// A frame whose size fields point past the end of the file looks like a
/// frame cut short by a crash; it is one only if nothing valid follows it.
/// With valid frames after it, it is damage to acked data: the open fails
/// naming file and offset, case by case (both sizes of an uncompressed
/// frame; only the stored size of a zstd frame; the last frame, which is
/// indistinguishable from a torn tail and is cut).
#[test]
fn a_size_field_pointing_past_the_end_fails_open_unless_nothing_valid_follows() {
    let big = |fs: &SimFs, seg: &Path, pos: u64, fields: &[usize]| {
        for &at in fields {
            fs.poke(seg, pos + at as u64, &(1i32 << 20).to_be_bytes()).unwrap();
        }
    };
    for (name, codec, fields, frame) in [
        ("uncompressed, both sizes", Codec::None, &[15usize, 19][..], 2usize),
        ("zstd, stored size only", Codec::Zstd { level: 3 }, &[19usize][..], 2),
        ("uncompressed, first frame", Codec::None, &[15usize, 19][..], 0),
    ] {
        let fs = SimFs::new(40);
        let config = LogConfig { codec, ..one_segment() };
        log_with_frames(&fs, &config, 5);
        let seg = only_segment(&fs);
        let pos = frame_positions(&fs, &seg)[frame];
        big(&fs, &seg, pos, fields);
        match open_sim(&fs, &config, &ManualClock::new(T0)) {
            Err(LogError::Corrupt { path, offset, reason }) => {
                assert_eq!((path, offset), (seg.clone(), pos), "{name}");
                assert!(reason.contains("followed by valid frames"), "{name}: {reason}");
            }
            other => panic!("{name}: expected Corrupt, got {other:?}"),
        }
    }
    // The last frame: nothing follows it, so it cannot be told from a torn
    // write of the last commit; it is cut, and the frames before it stay.
    let fs = SimFs::new(41);
    let config = one_segment();
    let records = log_with_frames(&fs, &config, 5);
    let seg = only_segment(&fs);
    let pos = *frame_positions(&fs, &seg).last().unwrap();
    big(&fs, &seg, pos, &[15, 19]);
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    let t = log.recovery_report().truncation.clone().expect("a truncation");
    assert_eq!((t.case, t.at), (Case::TornTailOfLastSegment, pos));
    drop(log);
    assert_records(&fs, &config, &records[..4]);
}

/// The bytes of a frame at `base` holding one record with `payload`, sealed
/// with the public CRC32C and nothing else: what a client can compute.
fn forged_frame(base: u64, payload: &[u8]) -> Vec<u8> {
    let mut p = PayloadBuilder::new();
    p.push(None, T0, payload);
    p.finish(base, Codec::None, FrameSeed::UNSALTED).unwrap()
}

/// A commit torn by a crash (its first sector never reached the disk: a
/// hole of zeros) whose record's payload carries a frame with a valid
/// public CRC. With unsalted frames the look-ahead took the forged frame
/// for proof of damage before valid frames and refused to open the log;
/// the salt makes it what it is, payload bytes of a never-acked tail.
/// (Uncompressed: with zstd the payload's bytes are not in the file as
/// sent.)
#[test]
fn a_frame_forged_inside_a_torn_commits_payload_does_not_stop_the_open() {
    let fs = SimFs::new(50);
    let config = one_segment();
    let records = log_with_frames(&fs, &config, 5);
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    // The forged frame claims the next offsets and sits in the middle of
    // a payload of our own bytes.
    let mut payload = b"x".repeat(600);
    payload.extend(forged_frame(6, b"forged"));
    payload.extend(b"y".repeat(600));
    log.commit(vec![CommitRecord::keyless(payload)]).unwrap();
    drop(log);
    let seg = only_segment(&fs);
    let pos = *frame_positions(&fs, &seg).last().unwrap();
    // The torn write: its first 512 bytes are a hole.
    fs.poke(&seg, pos, &[0u8; 512]).unwrap();
    let log = open_sim(&fs, &config, &ManualClock::new(T0))
        .unwrap_or_else(|e| panic!("a forged frame in a payload stopped the open: {e}"));
    let t = log.recovery_report().truncation.clone().expect("the torn commit is cut");
    assert_eq!((t.case, t.at), (Case::GarbageTailOfLastSegment, pos));
    assert_eq!(log.high_watermark(), 5);
    drop(log);
    assert_records(&fs, &config, &records);
}

/// A format 1 segment: frames from byte 0 with unsalted CRCs, as logs
/// written before segments had headers hold them.
fn legacy_segment(fs: &SimFs, base: u64, records: &[CommitRecord]) -> PathBuf {
    let path = dir().join(narad_log::segment::segment_file_name(base));
    fs.create_dir_all(&dir()).unwrap();
    let f = fs.open(&path, OpenMode::CreateNew).unwrap();
    let mut pos = 0;
    for (i, r) in records.iter().enumerate() {
        let mut p = PayloadBuilder::new();
        p.push(r.key.as_deref(), T0, &r.payload);
        let frame = p.finish(base + i as u64, Codec::None, FrameSeed::UNSALTED).unwrap();
        f.write_all_at(&frame, pos).unwrap();
        pos += frame.len() as u64;
    }
    f.sync_data().unwrap();
    path
}

#[test]
fn a_log_of_format_1_segments_is_read_and_continues_in_a_salted_segment() {
    let fs = SimFs::new(51);
    let config = one_segment();
    let old = recs("old", 6);
    let first = legacy_segment(&fs, 0, &old[..3]);
    let second = legacy_segment(&fs, 3, &old[3..]);
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    assert_eq!(log.high_watermark(), 6);
    // The first commit does not go into the format 1 segment: it rolls.
    let new = recs("new", 4);
    assert_eq!(log.commit(new.clone()).unwrap().offsets(), 6..10);
    let segs = segment_paths(&fs);
    assert_eq!(segs.len(), 3);
    assert_eq!(segment_format(&fs, &second), SegmentFormat::Legacy, "never written again");
    assert!(matches!(segment_format(&fs, &segs[2]), SegmentFormat::Salted { .. }));
    let more = recs("more", 2);
    log.commit(more.clone()).unwrap();
    assert_eq!(segment_paths(&fs).len(), 3, "the salted segment takes the next commit");
    drop(log);
    let expected: Vec<_> = [old, new, more].concat();
    assert_records(&fs, &config, &expected);
    assert_eq!(segment_format(&fs, &first), SegmentFormat::Legacy);
    // A format 1 segment torn as the old binary tore them is still cut by
    // its own rules when it is the last one.
    let fs = SimFs::new(52);
    let kept = recs("kept", 3);
    let seg = legacy_segment(&fs, 0, &kept);
    let len = fs.durable_len(&seg).unwrap();
    let mut torn = forged_frame(3, b"never acked");
    torn.truncate(torn.len() - 4);
    append_raw(&fs, &seg, &torn);
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    let t = log.recovery_report().truncation.clone().expect("a truncation");
    assert_eq!((t.case, t.at), (Case::TornTailOfLastSegment, len));
    drop(log);
    assert_records(&fs, &config, &kept);
}

#[test]
fn a_salted_log_keeps_one_salt_across_segments_and_reopens() {
    let fs = SimFs::new(53);
    let config = exact_config();
    let records = log_with_frames(&fs, &config, 60);
    let segs = segment_paths(&fs);
    assert!(segs.len() > 3);
    let salts: std::collections::HashSet<_> = segs
        .iter()
        .map(|p| match segment_format(&fs, p) {
            SegmentFormat::Salted { salt } => salt,
            SegmentFormat::Legacy => panic!("{} is format 1", p.display()),
        })
        .collect();
    assert_eq!(salts.len(), 1, "one salt per log");
    // Reopened, the log keeps its salt for the segments it adds.
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    let more = recs("more", 30);
    for r in &more {
        log.commit(vec![r.clone()]).unwrap();
    }
    drop(log);
    let after: std::collections::HashSet<_> = segment_paths(&fs)
        .iter()
        .map(|p| match segment_format(&fs, p) {
            SegmentFormat::Salted { salt } => salt,
            SegmentFormat::Legacy => unreachable!(),
        })
        .collect();
    assert_eq!(after, salts);
    assert_records(&fs, &config, &[records, more].concat());
    // Another log has another salt.
    let other = SimFs::new(54);
    log_with_frames(&other, &config, 1);
    assert_ne!(segment_format(&other, &segment_paths(&other)[0]), segment_format(&fs, &segs[0]));
}

/// The header is fdatasynced before any frame is written behind it: a file
/// no longer than a header with a bad one is a roll a crash interrupted (cut
/// and rewritten); a bad header with bytes after it is damage (the open
/// fails, naming the file).
#[test]
fn a_torn_header_of_the_last_segment_is_rewritten_and_a_damaged_one_fails_open() {
    let config = one_segment();
    let torn: [(&str, Vec<u8>); 4] = [
        ("empty", Vec::new()),
        ("half a header", narad_log::segment::segment_header(5, 7)[..13].to_vec()),
        ("zeros", vec![0u8; 32]),
        ("bad crc", {
            let mut h = narad_log::segment::segment_header(5, 7).to_vec();
            h[20] ^= 0xff;
            h
        }),
    ];
    for (name, bytes) in torn {
        let fs = SimFs::new(55);
        let mut records = log_with_frames(&fs, &config, 5);
        let next = dir().join("00000000000000000005.log");
        let f = fs.open(&next, OpenMode::CreateNew).unwrap();
        f.write_all_at(&bytes, 0).unwrap();
        f.sync_data().unwrap();
        let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
        if !bytes.is_empty() {
            let t = log.recovery_report().truncation.clone().expect("a truncation");
            assert_eq!((t.case, t.at), (Case::TornHeaderOfLastSegment, 0), "{name}");
        }
        // The file is a salted segment with the log's salt, durably.
        assert_eq!(segment_format(&fs, &next), segment_format(&fs, &segment_paths(&fs)[0]));
        assert_eq!(fs.durable_len(&next), Some(32), "{name}");
        let more = recs("more", 3);
        assert_eq!(log.commit(more.clone()).unwrap().offsets(), 5..8, "{name}");
        assert_eq!(log.stats().segments, 2, "{name}: the commit went into the rewritten file");
        drop(log);
        records.extend(more);
        assert_records(&fs, &config, &records);
    }
    // A damaged header with frames behind it, and a whole header naming
    // another base: refused, whatever the place.
    for name in ["flipped salt", "wrong base", "zeroed"] {
        let fs = SimFs::new(56);
        log_with_frames(&fs, &config, 5);
        let seg = only_segment(&fs);
        match name {
            "flipped salt" => fs.poke(&seg, 22, &[0x5a]).unwrap(),
            "wrong base" => fs.poke(&seg, 0, &narad_log::segment::segment_header(1, 7)).unwrap(),
            _ => fs.poke(&seg, 0, &[0u8; 32]).unwrap(),
        }
        match open_sim(&fs, &config, &ManualClock::new(T0)) {
            Err(LogError::Corrupt { path, offset, reason }) => {
                assert_eq!((&path, offset), (&seg, 0), "{name}");
                assert!(reason.contains("damaged segment header"), "{name}: {reason}");
            }
            other => panic!("{name}: expected Corrupt, got {other:?}"),
        }
    }
    // A sealed segment that is a header and nothing else: refused.
    let fs = SimFs::new(57);
    log_with_frames(&fs, &config, 5);
    let empty = dir().join("00000000000000000005.log");
    let f = fs.open(&empty, OpenMode::CreateNew).unwrap();
    f.write_all_at(&narad_log::segment::segment_header(5, 7), 0).unwrap();
    f.sync_data().unwrap();
    fs.open(&dir().join("00000000000000000006.log"), OpenMode::CreateNew).unwrap();
    match open_sim(&fs, &config, &ManualClock::new(T0)) {
        Err(LogError::Corrupt { path, reason, .. }) => {
            assert_eq!(path, empty);
            assert!(reason.contains("empty sealed segment"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}
