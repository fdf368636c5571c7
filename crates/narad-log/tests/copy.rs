//! Copying a log chunk by chunk (the move protocol's data path, SPEC §7.3):
//! the copy verifies, reads back every record of the source, and continues
//! the source's offsets; a copy that misses, reorders or damages a chunk,
//! or stops short of the source's high watermark, does not verify.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use narad_clock::ManualClock;
use narad_fs::{Fs, FsRef, OpenMode, SimFs};
use narad_log::copy::{CopyError, IncomingCopy, install};
use narad_log::{CommitRecord, LogConfig, PartitionLog};

const STAGING: &str = "/data/topics/orders/p00000.incoming";
const INSTALLED: &str = "/data/topics/orders/p00001";

/// Copies every segment of `log` into `copy`, `chunk` bytes at a time.
fn copy_all(log: &PartitionLog, copy: &mut IncomingCopy, chunk: u64) {
    for s in log.segment_extents() {
        loop {
            let at = copy.written(s.base);
            let bytes = log.read_segment_bytes(s.base, at, chunk).unwrap();
            if bytes.is_empty() {
                break;
            }
            copy.write(s.base, at, &bytes).unwrap();
        }
    }
}

fn source(fs: &SimFs, clock: &ManualClock, n: usize) -> PartitionLog {
    let log = open_sim(fs, &small_config(), clock).unwrap();
    for i in 0..n {
        log.commit(vec![rec("src", i)]).unwrap();
    }
    log
}

fn open_at(fs: FsRef, dir: &str, config: &LogConfig, clock: &ManualClock) -> PartitionLog {
    PartitionLog::open(fs, PathBuf::from(dir), config.clone(), Arc::new(clock.clone())).unwrap()
}

#[test]
fn a_copy_made_in_small_chunks_verifies_reads_back_every_record_and_continues_the_offsets() {
    let fs = SimFs::new(3);
    let clock = ManualClock::new(T0);
    let log = source(&fs, &clock, 40);
    assert!(log.segment_extents().len() >= 3, "several segments: {:?}", log.segment_extents());
    let mut copy = IncomingCopy::create(fs.shared(), Path::new(STAGING)).unwrap();
    copy_all(&log, &mut copy, 100);
    let staged =
        copy.verify(&small_config(), Arc::new(clock.clone()), log.oldest_offset(), 40).unwrap();
    install(&fs, &staged, Path::new(INSTALLED)).unwrap();
    // Power loss right after the install: the copy is durable.
    fs.crash(narad_fs::CrashMode::DropUnsynced);
    drop(log);
    let log = open_sim(&fs, &small_config(), &clock).unwrap();
    let copied = open_at(fs.shared(), INSTALLED, &small_config(), &clock);
    assert_eq!(copied.high_watermark(), 40);
    let want: Vec<(u64, Vec<u8>)> =
        read_all(&log).into_iter().map(|r| (r.offset, r.payload.to_vec())).collect();
    let got: Vec<(u64, Vec<u8>)> =
        read_all(&copied).into_iter().map(|r| (r.offset, r.payload.to_vec())).collect();
    assert_eq!(got, want);
    assert_eq!(copied.commit(vec![CommitRecord::keyless("next")]).unwrap().first_offset, 40);
    assert!(!fs.exists(Path::new(STAGING)).unwrap(), "the staging directory is gone");
    // A second copy never lands over a log that is there.
    let mut again = IncomingCopy::create(fs.shared(), Path::new(STAGING)).unwrap();
    copy_all(&log, &mut again, 1 << 20);
    let staged = again.verify(&small_config(), Arc::new(clock.clone()), 0, 40).unwrap();
    let e = install(&fs, &staged, Path::new(INSTALLED)).unwrap_err();
    assert!(matches!(e, CopyError::Range(_)), "{e}");
}

#[test]
fn a_copy_after_retention_begins_at_the_sources_oldest_offset() {
    let fs = SimFs::new(4);
    let clock = ManualClock::new(T0);
    let log = source(&fs, &clock, 30);
    clock.advance(std::time::Duration::from_secs(3600));
    log.enforce_retention(clock_ms(&clock), 1).unwrap();
    let oldest = log.oldest_offset();
    assert!(oldest > 0);
    let mut copy = IncomingCopy::create(fs.shared(), Path::new(STAGING)).unwrap();
    copy_all(&log, &mut copy, 1 << 20);
    copy.verify(&small_config(), Arc::new(clock.clone()), oldest, 30).unwrap();
}

fn clock_ms(clock: &ManualClock) -> u64 {
    use narad_clock::Clock;
    clock.wall_ms()
}

#[test]
fn a_copy_short_of_the_sources_high_watermark_does_not_verify() {
    let fs = SimFs::new(5);
    let clock = ManualClock::new(T0);
    let log = source(&fs, &clock, 20);
    let mut copy = IncomingCopy::create(fs.shared(), Path::new(STAGING)).unwrap();
    copy_all(&log, &mut copy, 1 << 20);
    // The source committed more after the copy's last round.
    log.commit(vec![rec("late", 0)]).unwrap();
    let e = copy.verify(&small_config(), Arc::new(clock.clone()), 0, 21).unwrap_err();
    assert!(matches!(&e, CopyError::Mismatch(why) if why.contains("ends at offset 20")), "{e}");
}

#[test]
fn chunks_out_of_order_are_refused_and_a_damaged_chunk_fails_verification() {
    let fs = SimFs::new(6);
    let clock = ManualClock::new(T0);
    let log = source(&fs, &clock, 20);
    let first = log.segment_extents()[0];
    let mut copy = IncomingCopy::create(fs.shared(), Path::new(STAGING)).unwrap();
    let head = log.read_segment_bytes(first.base, 0, 64).unwrap();
    copy.write(first.base, 0, &head).unwrap();
    // A duplicated or skipped-ahead chunk cannot leave a hole.
    assert!(matches!(copy.write(first.base, 0, &head), Err(CopyError::Range(_))));
    assert!(matches!(copy.write(first.base, 200, &head), Err(CopyError::Range(_))));
    // Reads past a segment's verified bytes are refused; unknown segments
    // are gone (list again).
    assert!(matches!(
        log.read_segment_bytes(first.base, first.len + 1, 10),
        Err(CopyError::Range(_))
    ));
    assert!(matches!(log.read_segment_bytes(12_345, 0, 10), Err(CopyError::Gone(12_345))));
    copy.abandon().unwrap();
    assert!(!fs.exists(Path::new(STAGING)).unwrap());

    // One flipped byte in the middle of the first (sealed) segment.
    let mut copy = IncomingCopy::create(fs.shared(), Path::new(STAGING)).unwrap();
    copy_all(&log, &mut copy, 1 << 20);
    let staged = Path::new(STAGING).join(format!("{:020}.log", first.base));
    let f = fs.open(&staged, OpenMode::Existing).unwrap();
    let mut b = [0u8; 1];
    let at = first.len / 2;
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    let e = copy.verify(&small_config(), Arc::new(clock.clone()), 0, 20).unwrap_err();
    assert!(matches!(e, CopyError::Log(_) | CopyError::Mismatch(_)), "{e}");
}

#[test]
fn staged_chunks_written_in_any_order_verify_and_a_chunk_never_written_fails_verification() {
    let fs = SimFs::new(11);
    let clock = ManualClock::new(T0);
    let log = source(&fs, &clock, 40);
    // Every chunk booked in order, their bytes written last to first (as a
    // writer thread may finish them).
    let mut copy = IncomingCopy::create(fs.shared(), Path::new(STAGING)).unwrap();
    let mut staged = Vec::new();
    for s in log.segment_extents() {
        while copy.written(s.base) < s.len {
            let at = copy.written(s.base);
            let bytes = log.read_segment_bytes(s.base, at, 100).unwrap();
            staged.push(copy.stage(s.base, at, bytes).unwrap());
        }
    }
    assert!(staged.len() > 10, "many chunks: {}", staged.len());
    for chunk in staged.into_iter().rev() {
        chunk.write().unwrap();
    }
    let dir =
        copy.verify(&small_config(), Arc::new(clock.clone()), log.oldest_offset(), 40).unwrap();
    install(&fs, &dir, Path::new(INSTALLED)).unwrap();
    let installed = open_at(fs.shared(), INSTALLED, &small_config(), &clock);
    assert_eq!(installed.high_watermark(), 40);

    // One chunk in the middle booked but never written: a hole.
    let mut copy = IncomingCopy::create(fs.shared(), Path::new(STAGING)).unwrap();
    let mut n = 0;
    for s in log.segment_extents() {
        while copy.written(s.base) < s.len {
            let at = copy.written(s.base);
            let bytes = log.read_segment_bytes(s.base, at, 100).unwrap();
            let chunk = copy.stage(s.base, at, bytes).unwrap();
            n += 1;
            if n != 3 {
                chunk.write().unwrap();
            }
        }
    }
    let e = copy.verify(&small_config(), Arc::new(clock.clone()), log.oldest_offset(), 40);
    assert!(
        matches!(e, Err(CopyError::Mismatch(_) | CopyError::Log(_))),
        "a copy with a hole verified: {e:?}"
    );
}
