//! Retention with an injected clock, and readers racing deletion.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use narad_clock::ManualClock;
use narad_fs::{FsRef, RealFs, SimFs};
use narad_log::{CommitRecord, LogConfig, PartitionLog, ReadError};

const MIN: u64 = 60_000;

/// Commits `n` single-record batches, one per minute of the manual clock.
fn commit_minutes(log: &PartitionLog, clock: &ManualClock, n: usize) {
    for i in 0..n {
        log.commit(vec![CommitRecord::keyless(format!("minute-{i}-{}", "y".repeat(280)))]).unwrap();
        clock.advance(Duration::from_millis(MIN));
    }
}

#[test]
fn retention_deletes_only_sealed_segments_whose_newest_record_is_older() {
    let fs = SimFs::new(1);
    // ~330-byte frames, 1 KiB segments: three records per segment.
    let config = small_config();
    let clock = ManualClock::new(T0);
    let log = open_sim(&fs, &config, &clock).unwrap();
    commit_minutes(&log, &clock, 12); // records at T0 + 0..11 min
    let before = log.stats();
    assert_eq!((before.segments, before.oldest_segment_at_ms), (4, Some(T0)));
    let now = T0 + 12 * MIN;
    // Retention 0 keeps everything.
    assert_eq!(log.enforce_retention(now, 0).unwrap().segments_deleted, 0);
    // 6.5 minutes: segments whose newest record is before T0 + 5.5 min go:
    // [0,3) (newest at 2 min) and [3,6) (newest at 5 min).
    let r = log.enforce_retention(now, 6 * MIN + MIN / 2).unwrap();
    assert_eq!((r.segments_deleted, r.records_deleted, r.oldest_offset), (2, 6, 6));
    assert_eq!(log.oldest_offset(), 6);
    assert_eq!(log.stats().oldest_segment_at_ms, Some(T0 + 6 * MIN));
    assert_eq!(segment_paths(&fs).len(), 2);
    // Reads below the oldest offset are gone, with a distinct error.
    match log.read(2, 10, u64::MAX) {
        Err(ReadError::Gone { offset, oldest }) => assert_eq!((offset, oldest), (2, 6)),
        other => panic!("expected Gone, got {other:?}"),
    }
    assert_eq!(log.read(6, 100, u64::MAX).unwrap().records.len(), 6);
    // Even with everything expired, the active segment stays.
    let r = log.enforce_retention(now + 100 * MIN, MIN).unwrap();
    assert_eq!(r.segments_deleted, 1);
    let s = log.stats();
    assert_eq!((s.segments, s.oldest_offset, s.high_watermark), (1, 9, 12));
    assert_eq!(log.read(9, 100, u64::MAX).unwrap().records.len(), 3);
    // And the log goes on.
    assert_eq!(log.commit(recs("more", 1)).unwrap().first_offset, 12);
}

#[test]
fn retention_after_a_reopen_dates_segments_from_their_records() {
    let fs = SimFs::new(2);
    let config = small_config();
    let clock = ManualClock::new(T0);
    let log = open_sim(&fs, &config, &clock).unwrap();
    commit_minutes(&log, &clock, 9);
    drop(log);
    let log = open_sim(&fs, &config, &clock).unwrap();
    assert_eq!(log.stats().oldest_segment_at_ms, Some(T0));
    // Nothing is old enough yet at a 10-minute retention...
    assert_eq!(log.enforce_retention(T0 + 9 * MIN, 10 * MIN).unwrap().segments_deleted, 0);
    // ...then the first segment (newest record at T0 + 2 min) is.
    let r = log.enforce_retention(T0 + 12 * MIN + 1, 10 * MIN).unwrap();
    assert_eq!((r.segments_deleted, r.oldest_offset), (1, 3));
    drop(log);
    // The deletion is durable.
    let log = open_sim(&fs, &config, &clock).unwrap();
    assert_eq!(log.oldest_offset(), 3);
}

/// Readers hammer random offsets (old ones especially) while one thread
/// commits and retention deletes segments under them. Every read either
/// returns the right records or `Gone`: never garbage, never another error,
/// never a panic.
fn readers_race_retention(fs: FsRef, dir: std::path::PathBuf) {
    let config = LogConfig { segment_bytes: 512, cache_bytes: 0, ..small_config() };
    let clock = ManualClock::new(T0);
    let log = Arc::new(PartitionLog::open(fs, dir, config, Arc::new(clock.clone())).unwrap());
    let payload = |offset: u64| format!("record-{offset}-{}", "z".repeat((offset % 97) as usize));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3u64)
        .map(|t| {
            let (log, stop) = (log.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = narad_fs::SimRng::new(t);
                let (mut ok, mut gone) = (0u64, 0u64);
                // Keep going until told to stop, and at least 200 reads with
                // both outcomes seen (a reader starved while retention ran
                // still checks the final state, which has both), within a cap.
                while !stop.load(Ordering::Acquire)
                    || ((ok + gone < 200 || ok == 0 || gone == 0) && ok + gone < 100_000)
                {
                    let oldest = log.oldest_offset();
                    let hwm = log.high_watermark();
                    let from =
                        oldest.saturating_sub(rng.below(5)) + rng.below(hwm - oldest + 1).min(8);
                    match log.read(from, 20, u64::MAX) {
                        Ok(b) => {
                            assert!(b.corrupt.is_empty(), "corrupt {:?}", b.corrupt);
                            for r in &b.records {
                                assert_eq!(r.payload, payload(r.offset).as_bytes());
                            }
                            ok += 1;
                        }
                        Err(ReadError::Gone { offset, oldest }) => {
                            assert!(offset < oldest);
                            gone += 1;
                        }
                        Err(e) => panic!("unexpected read error: {e}"),
                    }
                }
                (ok, gone)
            })
        })
        .collect();
    let mut next = 0u64;
    for round in 0..300 {
        let batch: Vec<_> = (0..3).map(|k| CommitRecord::keyless(payload(next + k))).collect();
        next = log.commit(batch).unwrap().offsets().end;
        clock.advance(Duration::from_millis(1_000));
        if round % 5 == 4 {
            log.enforce_retention(T0 + round * 1_000, 20_000).unwrap();
        }
    }
    stop.store(true, Ordering::Release);
    let (mut ok, mut gone) = (0, 0);
    for r in readers {
        let (o, g) = r.join().unwrap();
        ok += o;
        gone += g;
    }
    assert!(log.metrics().segments_deleted > 50, "retention deleted segments under the readers");
    assert!(ok > 0 && gone > 0, "readers saw both outcomes ({ok} ok, {gone} gone)");
}

#[test]
fn a_reader_racing_retention_keeps_reading_or_gets_gone_on_the_simulated_fs() {
    readers_race_retention(SimFs::new(3).shared(), dir());
}

#[test]
fn a_reader_racing_retention_keeps_reading_or_gets_gone_on_a_real_directory() {
    // Real unlink semantics: an open handle keeps reading a removed file.
    let root = std::env::temp_dir().join(format!("narad-log-retention-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    readers_race_retention(Arc::new(RealFs), root.join("p00000"));
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_segment_is_dated_by_its_newest_record_before_and_after_a_reopen() {
    let fs = SimFs::new(3);
    let config = small_config();
    let clock = ManualClock::new(T0);
    let log = open_sim(&fs, &config, &clock).unwrap();
    commit_minutes(&log, &clock, 7); // three records per segment: [0,3) [3,6) [6,7)
    let want =
        |log: &PartitionLog| (0..8).map(|o| log.segment_written_at_ms(o)).collect::<Vec<_>>();
    let at = |m: u64| Some(T0 + m * MIN);
    let expected = vec![at(2), at(2), at(2), at(5), at(5), at(5), at(6), None];
    assert_eq!(want(&log), expected, "offset 7 is not committed yet");
    // A reopened log reads the sealed segments' times from their last frame.
    log.close();
    drop(log);
    let log = open_sim(&fs, &config, &clock).unwrap();
    assert_eq!(want(&log), expected);
    // Offsets retention removed have no segment.
    log.enforce_retention(T0 + 10 * MIN, 6 * MIN).unwrap();
    assert_eq!(log.oldest_offset(), 3);
    assert_eq!(log.segment_written_at_ms(2), None);
    assert_eq!(log.segment_written_at_ms(3), at(5));
}
