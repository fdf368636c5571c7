//! Commit combining: concurrent batches share cycles (one append, one
//! fdatasync), each caller gets its own contiguous offsets or the shared
//! error, and closing fails the batches still queued.

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;
use narad_clock::ManualClock;
use narad_fs::{FaultKind, SimFs};
use narad_log::{CommitRecord, LogConfig, LogError};

#[test]
fn thirty_two_committers_get_contiguous_unique_offsets_with_far_fewer_fsyncs() {
    const COMMITTERS: usize = 32;
    const COMMITS_EACH: usize = 20;
    let sim = SimFs::new(1);
    let fs = GateFs::new(sim.clone());
    // A slow disk: each fdatasync takes 2 ms, so batches pile up behind it.
    fs.set_sync_delay(Duration::from_millis(2));
    let config = LogConfig { segment_bytes: 64 << 10, ..small_config() };
    let clock = ManualClock::new(T0);
    let log = Arc::new(open(fs.shared(), &config, &clock).unwrap());
    let start = Arc::new(Barrier::new(COMMITTERS));
    let handles: Vec<_> = (0..COMMITTERS)
        .map(|t| {
            let (log, start) = (log.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                (0..COMMITS_EACH)
                    .map(|i| {
                        let n = 1 + (t + i) % 4;
                        let batch: Vec<_> =
                            (0..n).map(|j| CommitRecord::keyless(format!("{t}/{i}/{j}"))).collect();
                        (log.commit(batch.clone()).unwrap(), batch)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut results: Vec<_> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let commits = results.len() as u64;
    assert_eq!(commits, (COMMITTERS * COMMITS_EACH) as u64);
    // The offsets tile 0..total with no gap and no overlap.
    results.sort_by_key(|(o, _)| o.first_offset);
    let mut next = 0;
    for (o, batch) in &results {
        assert_eq!(o.first_offset, next, "contiguous and unique");
        assert_eq!(o.count, batch.len() as u64);
        next += o.count;
    }
    assert_eq!(log.high_watermark(), next);
    // Each batch is where its outcome says.
    let all = read_all(&log);
    for (o, batch) in &results {
        for (k, r) in batch.iter().enumerate() {
            assert_eq!(all[(o.first_offset as usize) + k].payload, r.payload);
        }
    }
    let syncs = sim.sync_count();
    let m = log.metrics();
    eprintln!("{commits} commits in {} cycles with {syncs} fdatasyncs", m.commit_cycles);
    assert!(syncs * 4 <= commits, "{syncs} fdatasyncs for {commits} commits is not combining");
    assert_eq!(m.commits, commits);
}

#[test]
fn every_caller_of_a_failed_cycle_gets_the_same_error_and_the_log_latches() {
    let sim = SimFs::new(2);
    let fs = GateFs::new(sim.clone());
    let config = LogConfig { segment_bytes: 1 << 20, ..small_config() };
    let log = Arc::new(open(fs.shared(), &config, &ManualClock::new(T0)).unwrap());
    log.commit(recs("before", 2)).unwrap();
    // Hold the leader's cycle just before its fdatasync while eight more
    // batches queue behind it.
    let syncs_before = fs.gate().syncs_started.load(std::sync::atomic::Ordering::SeqCst);
    fs.hold(true);
    let leader = {
        let log = log.clone();
        std::thread::spawn(move || log.commit(recs("leader", 1)))
    };
    fs.wait_syncs_started(syncs_before + 1);
    let queued: Vec<_> = (0..8)
        .map(|i| {
            let log = log.clone();
            std::thread::spawn(move || log.commit(recs(&format!("q{i}"), 2)))
        })
        .collect();
    while log.queued_commits() < 8 {
        std::thread::sleep(Duration::from_millis(1));
    }
    // The leader's fdatasync is the next operation; the one after it (the
    // combined cycle's write) arms the fault for that cycle's fdatasync.
    sim.inject(sim.op_count() + 1, FaultKind::SyncError);
    fs.hold(false);
    assert_eq!(leader.join().unwrap().unwrap().offsets(), 2..3);
    let errors: Vec<String> =
        queued.into_iter().map(|h| h.join().unwrap().unwrap_err().to_string()).collect();
    assert!(errors[0].contains("fdatasync"), "{}", errors[0]);
    assert!(errors.iter().all(|e| *e == errors[0]), "one cycle, one shared error: {errors:?}");
    let m = log.metrics();
    assert_eq!((m.commit_cycles, m.commit_failures, m.rollbacks), (2, 8, 1));
    // The failed cycle left nothing behind, and the failed fdatasync
    // latched the log: the next commit is refused until it is reopened.
    assert_eq!(log.high_watermark(), 3);
    assert!(matches!(log.commit(recs("after", 1)), Err(LogError::Poisoned { .. })));
    assert_eq!(read_all(&log).len(), 3);
}

#[test]
fn batches_queued_behind_a_running_cycle_fail_with_closed_when_the_log_closes() {
    let sim = SimFs::new(3);
    let fs = GateFs::new(sim.clone());
    let config = small_config();
    let clock = ManualClock::new(T0);
    let log = Arc::new(open(fs.shared(), &config, &clock).unwrap());
    fs.hold(true);
    let leader = {
        let log = log.clone();
        std::thread::spawn(move || log.commit(recs("leader", 3)))
    };
    fs.wait_syncs_started(1);
    let queued: Vec<_> = (0..4)
        .map(|i| {
            let log = log.clone();
            std::thread::spawn(move || log.commit(recs(&format!("queued{i}"), 2)))
        })
        .collect();
    while log.queued_commits() < 4 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let closer = {
        let log = log.clone();
        std::thread::spawn(move || log.close())
    };
    while !log.is_closed() {
        std::thread::sleep(Duration::from_millis(1));
    }
    fs.hold(false);
    closer.join().unwrap();
    // The running cycle finishes; everything queued behind it is refused.
    assert_eq!(leader.join().unwrap().unwrap().offsets(), 0..3);
    for q in queued {
        assert!(matches!(q.join().unwrap(), Err(LogError::Closed)));
    }
    assert!(matches!(log.commit(recs("late", 1)), Err(LogError::Closed)));
    drop(log);
    // Nothing was appended after the close.
    let log = open_sim(&sim, &config, &clock).unwrap();
    assert_eq!(log.high_watermark(), 3);
}
