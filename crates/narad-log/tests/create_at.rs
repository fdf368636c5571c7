//! A log created at an offset (`PartitionLog::create_at`): the partition
//! of a node removed for good starts its new log where the cluster last saw
//! its offsets, so they keep growing and are not handed out again.

mod common;

use std::sync::Arc;

use common::*;
use narad_clock::ManualClock;
use narad_fs::{Fs, SimFs};
use narad_log::PartitionLog;

fn create(fs: &SimFs, clock: &ManualClock, base: u64) -> PartitionLog {
    PartitionLog::create_at(fs.shared(), dir(), small_config(), Arc::new(clock.clone()), base)
        .unwrap()
}

#[test]
fn a_log_created_at_an_offset_starts_there_and_reopens_there_after_a_crash() {
    let fs = SimFs::new(7);
    let clock = ManualClock::new(T0);
    let log = create(&fs, &clock, 1_048_700);
    assert_eq!((log.oldest_offset(), log.high_watermark()), (1_048_700, 1_048_700));
    let first = log.commit(recs("a", 3)).unwrap();
    assert_eq!(first.first_offset, 1_048_700);
    assert_eq!(log.high_watermark(), 1_048_703);
    let got = read_all(&log);
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].offset, 1_048_700);
    drop(log);
    // A crash keeps what was synced: the records and the log's base.
    fs.crash(narad_fs::CrashMode::DropUnsynced);
    let log = open_sim(&fs, &small_config(), &clock).unwrap();
    assert_eq!((log.oldest_offset(), log.high_watermark()), (1_048_700, 1_048_703));
    // Enough to roll segments: offsets stay dense from the base on.
    for i in 0..40 {
        log.commit(vec![rec("b", i)]).unwrap();
    }
    let all = read_all(&log);
    let offsets: Vec<u64> = all.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (1_048_700..1_048_743).collect::<Vec<u64>>());
}

#[test]
fn an_empty_log_created_at_an_offset_survives_a_crash_right_after() {
    let fs = SimFs::new(8);
    let clock = ManualClock::new(T0);
    drop(create(&fs, &clock, 500));
    fs.crash(narad_fs::CrashMode::DropUnsynced);
    let log = open_sim(&fs, &small_config(), &clock).unwrap();
    assert_eq!((log.oldest_offset(), log.high_watermark()), (500, 500));
    assert_eq!(log.commit(recs("c", 1)).unwrap().first_offset, 500);
}

#[test]
fn creating_over_an_existing_log_is_refused_and_leaves_it_alone() {
    let fs = SimFs::new(9);
    let clock = ManualClock::new(T0);
    let log = open_sim(&fs, &small_config(), &clock).unwrap();
    log.commit(recs("d", 2)).unwrap();
    drop(log);
    let e = PartitionLog::create_at(fs.shared(), dir(), small_config(), Arc::new(clock.clone()), 9)
        .unwrap_err();
    assert!(e.to_string().contains("already holds a log"), "{e}");
    let log = open_sim(&fs, &small_config(), &clock).unwrap();
    assert_eq!((log.oldest_offset(), log.high_watermark()), (0, 2));
    assert!(fs.exists(&dir()).unwrap());
}
