//! The durable commit, reads by offset, notifications and close.
#![allow(clippy::single_range_in_vec_init)] // lists of corrupt offset ranges, on purpose

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use narad_clock::ManualClock;
use narad_fs::{CrashMode, FaultKind, Fs, OpenMode, SimFs};
use narad_log::limits::{FRAME_HEADER_LEN, MAX_KEY_BYTES, MAX_RECORD_BYTES};
use narad_log::{Codec, CommitRecord, LogConfig, LogError, ReadError, ReadRequest};

#[test]
fn offsets_are_contiguous_and_reads_return_what_was_committed() {
    for codec in [Codec::None, Codec::Zstd { level: 3 }] {
        let fs = SimFs::new(1);
        let config = LogConfig { codec, ..small_config() };
        let clock = ManualClock::new(T0);
        let log = open_sim(&fs, &config, &clock).unwrap();
        let batch = vec![
            CommitRecord::keyless("no key"),
            CommitRecord::keyed("", "empty key"),
            CommitRecord::keyed("k", "a key"),
            CommitRecord::keyless(""),
        ];
        let o = log.commit(batch.clone()).unwrap();
        assert_eq!((o.offsets(), o.commit_time_ms), (0..4, T0));
        assert_eq!(log.commit(recs("b", 3)).unwrap().offsets(), 4..7);
        assert_eq!(log.high_watermark(), 7);
        let check = |log: &narad_log::PartitionLog| {
            let got = read_all(log);
            assert_eq!(got.len(), 7);
            for (i, r) in batch.iter().enumerate() {
                assert_eq!((&got[i].key, &got[i].payload), (&r.key, &r.payload), "{codec}");
                assert_eq!(got[i].commit_time_ms, T0);
            }
            // Absent and empty keys stay distinguishable.
            assert_eq!(got[0].key, None);
            assert_eq!(got[1].key, Some(Bytes::new()));
        };
        check(&log);
        drop(log);
        check(&open_sim(&fs, &config, &clock).unwrap());
    }
}

#[test]
fn a_large_batch_is_split_into_frames_and_costs_one_fdatasync() {
    let fs = SimFs::new(2);
    // No zero runway: a batch of several frames trims one first, with an
    // fdatasync of its own (`runway_cycles_*` covers that).
    let config = LogConfig {
        segment_bytes: 64 << 20,
        frame_target_bytes: 64 << 10,
        runway_bytes: 0,
        ..LogConfig::default()
    };
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    log.commit(recs("warm", 1)).unwrap();
    let payload = Bytes::from(vec![7u8; 1024]);
    let batch: Vec<_> = (0..4096).map(|_| CommitRecord::keyless(payload.clone())).collect();
    let syncs = fs.sync_count();
    let o = log.commit(batch).unwrap();
    assert_eq!(o.offsets(), 1..4097);
    assert_eq!(fs.sync_count() - syncs, 1, "one fdatasync for the whole batch");
    assert!(log.metrics().frames_written > 60, "4 MiB split into 64 KiB frames");
    let b = log.read(1, 5000, u64::MAX).unwrap();
    assert_eq!(b.records.len(), 4096);
    assert!(b.records.iter().all(|r| r.payload == payload));
}

#[test]
fn commit_time_is_monotonic_when_the_wall_clock_goes_backwards() {
    let fs = SimFs::new(3);
    let config = small_config();
    let clock = ManualClock::new(T0);
    let log = open_sim(&fs, &config, &clock).unwrap();
    let t1 = log.commit(recs("a", 2)).unwrap().commit_time_ms;
    clock.advance(Duration::from_secs(5));
    let t2 = log.commit(recs("b", 2)).unwrap().commit_time_ms;
    assert_eq!((t1, t2), (T0, T0 + 5_000));
    clock.set_wall_ms(T0 - 60_000);
    let t3 = log.commit(recs("c", 2)).unwrap().commit_time_ms;
    assert_eq!(t3, t2, "never below the previous commit time");
    drop(log);
    // Across a restart too: the floor is recovered from the last record.
    let log = open_sim(&fs, &config, &clock).unwrap();
    let t4 = log.commit(recs("d", 1)).unwrap().commit_time_ms;
    assert_eq!(t4, t2);
    clock.set_wall_ms(T0 + 9_000);
    assert_eq!(log.commit(recs("e", 1)).unwrap().commit_time_ms, T0 + 9_000);
    let times: Vec<u64> = read_all(&log).iter().map(|r| r.commit_time_ms).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
}

fn segment_bytes_total(fs: &SimFs) -> u64 {
    segment_paths(fs).iter().map(|p| fs.open(p, OpenMode::Existing).unwrap().len().unwrap()).sum()
}

/// A failed fdatasync latches the log (DESIGN §3: never retried, since a
/// later fdatasync may report success for pages whose write-back failed):
/// the cycle is truncated away, every later commit is refused until the log
/// is reopened, reads go on, and the reopen's recovery starts from disk.
#[test]
fn a_failed_fsync_latches_the_log_until_it_is_reopened() {
    let fs = SimFs::new(3);
    let config = LogConfig { segment_bytes: 1 << 20, runway_bytes: 0, ..small_config() };
    let clock = ManualClock::new(T0);
    let log = open_sim(&fs, &config, &clock).unwrap();
    let first = recs("ok", 5);
    log.commit(first.clone()).unwrap();
    let len = segment_bytes_total(&fs);
    fs.inject(fs.op_count(), FaultKind::SyncError);
    assert!(matches!(log.commit(recs("failed", 5)), Err(LogError::Io { .. })));
    assert_eq!(log.high_watermark(), 5);
    assert_eq!(segment_bytes_total(&fs), len, "the failed cycle is truncated away");
    match log.commit(recs("refused", 1)) {
        Err(LogError::Poisoned { source }) => assert!(matches!(*source, LogError::Io { .. })),
        other => panic!("expected Poisoned, got {other:?}"),
    }
    assert_eq!(read_all(&log).len(), 5, "reads go on");
    drop(log);
    let log = open_sim(&fs, &config, &clock).unwrap();
    assert_eq!(log.commit(recs("next", 3)).unwrap().offsets(), 5..8);
    assert_eq!(read_all(&log).len(), 8);
}

/// A failed write (not an fdatasync) is rolled back and the log goes on:
/// the rollback's fdatasync is the first one after it, not a retry.
#[test]
fn failed_write_truncates_back_to_the_high_watermark_and_the_next_commit_starts_clean() {
    for fault in [FaultKind::WriteError, FaultKind::NoSpace] {
        let fs = SimFs::new(4);
        // File sizes are compared: no zero runway.
        let config = LogConfig { segment_bytes: 1 << 20, runway_bytes: 0, ..small_config() };
        let clock = ManualClock::new(T0);
        let log = open_sim(&fs, &config, &clock).unwrap();
        let first = recs("ok", 5);
        log.commit(first.clone()).unwrap();
        let len = segment_bytes_total(&fs);
        fs.inject(fs.op_count(), fault);
        let err = log.commit(recs("failed", 5)).unwrap_err();
        assert!(matches!(err, LogError::Io { .. }), "{fault:?}: {err}");
        assert_eq!(err.is_no_space(), fault == FaultKind::NoSpace);
        // Nothing of the failed commit is visible or left in the file.
        assert_eq!(log.high_watermark(), 5);
        assert_eq!(segment_bytes_total(&fs), len, "{fault:?}");
        assert_eq!(log.metrics().rollbacks, 1);
        // The next commit reuses the offsets and lands cleanly.
        let next = recs("next", 3);
        assert_eq!(log.commit(next.clone()).unwrap().offsets(), 5..8);
        let got = read_all(&log);
        assert_eq!(got.len(), 8);
        assert_eq!(got[5].payload, next[0].payload);
        // And that is exactly what survives a crash.
        drop(log);
        fs.crash(CrashMode::DropUnsynced);
        let log = open_sim(&fs, &config, &clock).unwrap();
        let got = read_all(&log);
        let want: Vec<_> = first.iter().chain(&next).map(|r| r.payload.clone()).collect();
        assert_eq!(got.iter().map(|r| r.payload.clone()).collect::<Vec<_>>(), want, "{fault:?}");
    }
}

#[test]
fn a_failure_inside_a_roll_removes_the_new_segment() {
    let fs = SimFs::new(5);
    let config = small_config();
    let clock = ManualClock::new(T0);
    let log = open_sim(&fs, &config, &clock).unwrap();
    log.commit(recs("a", 20)).unwrap();
    let segments = segment_paths(&fs);
    // A batch that needs several new segments; the fsync of the second
    // frame's segment fails.
    let big: Vec<_> = (0..6).map(|i| CommitRecord::keyless(vec![i as u8; 700])).collect();
    let syncs = fs.sync_count();
    fs.inject(fs.op_count() + 3, FaultKind::SyncError);
    assert!(log.commit(big.clone()).is_err());
    assert!(fs.sync_count() > syncs, "the first roll synced before failing later");
    assert_eq!(segment_paths(&fs), segments, "segments created by the failed cycle are removed");
    assert_eq!(log.high_watermark(), 20);
    // The failed fdatasync latched the log: reopened, it goes on.
    assert!(matches!(log.commit(big.clone()), Err(LogError::Poisoned { .. })));
    drop(log);
    let log = open_sim(&fs, &config, &clock).unwrap();
    let o = log.commit(big).unwrap();
    assert_eq!(o.offsets(), 20..26);
    assert!(segment_paths(&fs).len() >= segments.len() + 5);
    drop(log);
    fs.crash(CrashMode::DropUnsynced);
    let log = open_sim(&fs, &config, &clock).unwrap();
    assert_eq!(read_all(&log).len(), 26);
}

#[test]
fn a_failed_truncation_poisons_the_log_until_it_is_reopened() {
    let fs = SimFs::new(6);
    let config = LogConfig { segment_bytes: 1 << 20, ..small_config() };
    let clock = ManualClock::new(T0);
    let log = open_sim(&fs, &config, &clock).unwrap();
    log.commit(recs("a", 3)).unwrap();
    // The cycle's fdatasync fails, then the rollback's fdatasync fails too.
    let at = fs.op_count();
    fs.inject(at, FaultKind::SyncError);
    fs.inject(at, FaultKind::SyncError);
    assert!(matches!(log.commit(recs("b", 3)), Err(LogError::Io { .. })));
    match log.commit(recs("c", 1)) {
        Err(LogError::Poisoned { source }) => assert!(matches!(*source, LogError::Io { .. })),
        other => panic!("expected Poisoned, got {other:?}"),
    }
    // Reads still work, bounded by the high watermark.
    assert_eq!(read_all(&log).len(), 3);
    drop(log);
    let log = open_sim(&fs, &config, &clock).unwrap();
    assert_eq!(log.high_watermark(), 3, "the unsynced tail is truncated by recovery");
    assert_eq!(log.commit(recs("d", 1)).unwrap().first_offset, 3);
}

#[test]
fn empty_and_oversized_commits_are_refused_before_queueing() {
    let fs = SimFs::new(7);
    let log = open_sim(&fs, &small_config(), &ManualClock::new(T0)).unwrap();
    let ops = fs.op_count();
    assert!(matches!(log.commit(vec![]), Err(LogError::EmptyCommit)));
    let big_key = Bytes::from(vec![0u8; MAX_KEY_BYTES as usize + 1]);
    assert!(matches!(
        log.commit(vec![CommitRecord::keyed(big_key, "x")]),
        Err(LogError::TooLarge { what: "record key bytes", .. })
    ));
    let big = Bytes::from(vec![0u8; MAX_RECORD_BYTES as usize + 1]);
    assert!(matches!(log.commit(vec![CommitRecord::keyless(big)]), Err(LogError::TooLarge { .. })));
    assert_eq!(fs.op_count(), ops, "nothing touched the disk");
    assert_eq!(log.high_watermark(), 0);
}

#[test]
fn reads_honour_limits_and_stop_at_the_high_watermark() {
    let fs = SimFs::new(8);
    let log = open_sim(&fs, &small_config(), &ManualClock::new(T0)).unwrap();
    log.commit(recs("r", 30)).unwrap();
    let b = log.read(5, 10, u64::MAX).unwrap();
    assert_eq!(b.records.iter().map(|r| r.offset).collect::<Vec<_>>(), (5..15).collect::<Vec<_>>());
    assert_eq!((b.next_offset, b.high_watermark), (15, 30));
    // max_bytes: the first record always, then only what fits.
    let b = log.read(0, 100, 1).unwrap();
    assert_eq!(b.records.len(), 1);
    let one = b.records[0].payload.len() as u64 + 2; // key "k0"
    let b = log.read(0, 100, one + 5).unwrap();
    assert_eq!(b.records.len(), 1);
    // At and past the high watermark: nothing, no error.
    for from in [30, 31, 1_000] {
        let b = log.read(from, 10, u64::MAX).unwrap();
        assert!(b.records.is_empty() && b.corrupt.is_empty());
        assert_eq!(b.next_offset, from);
    }
}

#[test]
fn delay_gated_reads_stop_at_the_first_later_record_and_report_its_time() {
    let fs = SimFs::new(9);
    let clock = ManualClock::new(T0);
    let log = open_sim(&fs, &small_config(), &clock).unwrap();
    log.commit(recs("a", 3)).unwrap(); // T0
    clock.advance(Duration::from_secs(10));
    log.commit(recs("b", 3)).unwrap(); // T0 + 10 s
    clock.advance(Duration::from_secs(10));
    log.commit(recs("c", 3)).unwrap(); // T0 + 20 s
    let b = log.read_committed_until(0, 100, u64::MAX, T0 + 15_000).unwrap();
    assert_eq!(b.records.len(), 6);
    assert_eq!((b.next_offset, b.held_back_commit_time_ms), (6, Some(T0 + 20_000)));
    let b = log.read_committed_until(0, 100, u64::MAX, T0 - 1).unwrap();
    assert!(b.records.is_empty());
    assert_eq!(b.held_back_commit_time_ms, Some(T0));
    let b = log
        .read_with(&ReadRequest {
            from: 6,
            max_records: 100,
            max_bytes: u64::MAX,
            max_commit_time_ms: Some(T0 + 20_000),
        })
        .unwrap();
    assert_eq!((b.records.len(), b.held_back_commit_time_ms), (3, None));
}

#[test]
fn a_frame_that_fails_its_crc_at_read_time_is_skipped_and_counted_never_panicking() {
    let fs = SimFs::new(10);
    let config = LogConfig { segment_bytes: 1 << 20, cache_bytes: 0, ..small_config() };
    let log = open_sim(&fs, &config, &ManualClock::new(T0)).unwrap();
    for i in 0..6 {
        log.commit(recs(&format!("f{i}"), 2)).unwrap(); // frame i: offsets 2i, 2i+1
    }
    let seg = segment_paths(&fs)[0].clone();
    let pos = frame_positions(&fs, &seg);
    // Bit rot in frame 2's payload, after the log was opened.
    fs.poke(&seg, pos[2] + FRAME_HEADER_LEN as u64 + 4, &[0xab]).unwrap();
    let b = log.read(0, 100, u64::MAX).unwrap();
    assert_eq!(b.corrupt, vec![4..6]);
    assert_eq!(
        b.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 6, 7, 8, 9, 10, 11]
    );
    assert_eq!(log.corrupt_frames_skipped(), 1);
    // Reading from inside the bad frame skips the rest of it.
    let b = log.read(5, 100, u64::MAX).unwrap();
    assert_eq!((b.corrupt.clone(), b.records[0].offset), (vec![5..6], 6));
    // A destroyed header: the frame's length cannot be trusted, so the read
    // resumes at the first later frame that verifies and chains to the end
    // of the segment, and never returns a byte it cannot verify.
    fs.poke(&seg, pos[4], &[0, 0, 0, 0, 0, 0, 0]).unwrap();
    let b = log.read(6, 100, u64::MAX).unwrap();
    assert_eq!(b.records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![6, 7, 10, 11]);
    assert_eq!(b.corrupt, vec![8..10]);
    assert_eq!(b.next_offset, 12);
    assert_eq!(log.corrupt_frames_skipped(), 3);
    // The partition is not wedged: commits and reads go on.
    log.commit(recs("after", 2)).unwrap();
    let b = log.read(12, 100, u64::MAX).unwrap();
    assert_eq!(b.records.len(), 2);
}

#[test]
fn wait_for_hwm_and_the_commit_listener_see_every_commit() {
    let fs = SimFs::new(11);
    let log = Arc::new(open_sim(&fs, &small_config(), &ManualClock::new(T0)).unwrap());
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    log.set_commit_listener(Some(Box::new(move |hwm| {
        s.fetch_max(hwm, Ordering::SeqCst);
    })));
    assert_eq!(log.wait_for_hwm_beyond(0, Duration::from_millis(10)).unwrap(), 0, "times out");
    let l = log.clone();
    let waiter = std::thread::spawn(move || l.wait_for_hwm_beyond(4, Duration::from_secs(30)));
    log.commit(recs("a", 3)).unwrap();
    log.commit(recs("b", 3)).unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), 6);
    assert_eq!(seen.load(Ordering::SeqCst), 6);
    log.set_commit_listener(None);
    log.commit(recs("c", 1)).unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 6);
    // Closing wakes waiters with Closed.
    let l = log.clone();
    let waiter = std::thread::spawn(move || l.wait_for_hwm_beyond(100, Duration::from_secs(30)));
    std::thread::sleep(Duration::from_millis(20));
    log.close();
    assert!(matches!(waiter.join().unwrap(), Err(LogError::Closed)));
}

#[test]
fn after_close_commits_and_reads_fail_with_closed_and_nothing_is_appended() {
    let fs = SimFs::new(12);
    let config = small_config();
    let clock = ManualClock::new(T0);
    let log = open_sim(&fs, &config, &clock).unwrap();
    log.commit(recs("a", 4)).unwrap();
    log.close();
    let ops = fs.op_count();
    assert!(matches!(log.commit(recs("b", 1)), Err(LogError::Closed)));
    assert!(matches!(log.read(0, 10, u64::MAX), Err(ReadError::Closed)));
    assert_eq!(fs.op_count(), ops);
    drop(log);
    // The directory can now be removed and recreated: the new log is empty.
    fs.remove_dir_all(&dir()).unwrap();
    let log = open_sim(&fs, &config, &clock).unwrap();
    assert_eq!(log.high_watermark(), 0);
}

#[test]
fn an_idle_log_costs_no_file_until_its_first_commit() {
    let fs = SimFs::new(13);
    let log = open_sim(&fs, &small_config(), &ManualClock::new(T0)).unwrap();
    let s = log.stats();
    assert_eq!(
        (s.segments, s.high_watermark, s.size_bytes, s.oldest_segment_at_ms),
        (0, 0, 0, None)
    );
    assert!(segment_paths(&fs).is_empty());
    log.commit(recs("a", 1)).unwrap();
    let s = log.stats();
    assert_eq!((s.segments, s.next_offset, s.oldest_segment_at_ms), (1, 1, Some(T0)));
    assert!(s.size_bytes > 0);
}

#[test]
fn codec_can_change_between_opens_and_readers_follow_each_frame() {
    let fs = SimFs::new(14);
    let clock = ManualClock::new(T0);
    let zstd = LogConfig { codec: Codec::Zstd { level: 5 }, cache_bytes: 0, ..small_config() };
    let plain = LogConfig { codec: Codec::None, ..zstd.clone() };
    let compressible = |tag: &str| -> Vec<CommitRecord> {
        (0..4)
            .map(|i| {
                CommitRecord::keyed(format!("{tag}{i}"), format!("{tag} {}", "abc".repeat(40)))
            })
            .collect()
    };
    let log = open_sim(&fs, &zstd, &clock).unwrap();
    log.commit(compressible("z")).unwrap();
    let zstd_bytes = log.stats().size_bytes;
    drop(log);
    let log = open_sim(&fs, &plain, &clock).unwrap();
    log.commit(compressible("p")).unwrap();
    assert!(log.stats().size_bytes - zstd_bytes > 2 * zstd_bytes, "the first frame was compressed");
    drop(log);
    let log = open_sim(&fs, &zstd, &clock).unwrap();
    let got = read_all(&log);
    assert_eq!(got.len(), 8);
    let want: Vec<_> = compressible("z").into_iter().chain(compressible("p")).collect();
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((&g.key, &g.payload), (&w.key, &w.payload));
    }
}

#[test]
fn the_cycle_observer_sees_each_successful_cycle_once_and_no_failed_one() {
    let fs = SimFs::new(12);
    let log = open_sim(&fs, &small_config(), &ManualClock::new(T0)).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    log.set_cycle_observer(Some(Box::new(move |t| s.lock().unwrap().push(*t))));
    log.commit(recs("a", 1)).unwrap();
    log.commit(recs("b", 3)).unwrap();
    // A failed cycle (its fdatasync fails) is not observed.
    fs.inject(fs.op_count() + 1, FaultKind::SyncError);
    assert!(log.commit(recs("c", 2)).is_err());
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.iter().map(|t| t.records).collect::<Vec<_>>(), vec![1, 3]);
    let m = log.metrics();
    assert_eq!(seen.iter().map(|t| t.bytes).sum::<u64>(), m.bytes_written);
    for t in &seen {
        // The write and the fdatasync both run inside the flush.
        assert!(t.write + t.fsync <= t.flush, "{t:?}");
    }
    log.set_cycle_observer(None);
}

/// An open whose recovery cut a zero runway off the last segment but whose
/// fdatasync failed (the open fails) leaves the file cut in the page cache
/// only (a failed fdatasync drops the dirty state). The next open sees a
/// clean segment and has nothing to cut; a roll seals it; a power loss
/// brings the runway back inside the sealed segment. Zeros hold no record
/// and the next segment starts where the frames end: the open keeps the
/// segment as its frames instead of refusing it as damage (found by the
/// cluster simulation, seed 7,719; refused before this case existed).
#[test]
fn a_zero_runway_back_inside_a_sealed_segment_after_a_power_loss_does_not_stop_the_open() {
    let fs = SimFs::new(31);
    let config = LogConfig { segment_bytes: 4096, runway_bytes: 2048, ..small_config() };
    let clock = ManualClock::new(T0);
    let log = open_sim(&fs, &config, &clock).unwrap();
    for i in 0..10 {
        // Small one-frame cycles: the runway after the frames is durable
        // zeros.
        log.commit(vec![CommitRecord::keyless(vec![i as u8; 100])]).unwrap();
    }
    assert_eq!(segment_paths(&fs).len(), 1);
    let len = segment_bytes_total(&fs);
    drop(log);
    fs.crash(CrashMode::DropUnsynced);
    assert!(segment_bytes_total(&fs) > len - 1, "the runway is on disk");
    // The recovery cuts the runway; its fdatasync fails; the open fails.
    fs.inject(fs.op_count(), FaultKind::SyncError);
    assert!(open_sim(&fs, &config, &clock).is_err(), "the open meets the failed fdatasync");
    // Started again (no power loss): the segment looks cut already.
    let log = open_sim(&fs, &config, &clock).unwrap();
    assert_eq!(log.high_watermark(), 10);
    // A record that does not fit the room left: the cycle rolls at once,
    // sealing the first segment without writing to it.
    log.commit(vec![CommitRecord::keyless(vec![9; 3000])]).unwrap();
    assert_eq!(segment_paths(&fs).len(), 2, "the first segment was sealed");
    drop(log);
    fs.crash(CrashMode::DropUnsynced);
    let log = open_sim(&fs, &config, &clock)
        .unwrap_or_else(|e| panic!("the open after a power loss refuses: {e}"));
    assert_eq!(read_all(&log).len(), 11);
    assert_eq!(log.commit(recs("after", 2)).unwrap().offsets(), 11..13);
}

/// Zeros in place of a sealed segment's last acked frame are not a runway:
/// the next segment starts at the offset after that frame, past what is
/// left, and the open fails naming the gap instead of keeping the segment.
#[test]
fn zeros_in_place_of_a_sealed_segments_last_frame_fail_the_open() {
    let fs = SimFs::new(41);
    let config = LogConfig { segment_bytes: 4096, runway_bytes: 0, ..small_config() };
    let clock = ManualClock::new(T0);
    let log = open_sim(&fs, &config, &clock).unwrap();
    let mut before_last = 0;
    for i in 0..10 {
        before_last = segment_bytes_total(&fs);
        log.commit(vec![CommitRecord::keyless(vec![i as u8; 100])]).unwrap();
    }
    let end = segment_bytes_total(&fs);
    log.commit(vec![CommitRecord::keyless(vec![9; 3000])]).unwrap();
    drop(log);
    let segments = segment_paths(&fs);
    assert_eq!(segments.len(), 2, "the first segment was sealed");
    // The sealed segment's last frame, offset 9, becomes zeros.
    fs.poke(&segments[0], before_last, &vec![0u8; (end - before_last) as usize]).unwrap();
    match open_sim(&fs, &config, &clock) {
        Err(LogError::Corrupt { reason, .. }) => {
            assert!(reason.contains("offsets missing between segments"), "{reason}")
        }
        other => panic!("expected the open to fail on the gap, got {:?}", other.map(|_| ())),
    }
}
