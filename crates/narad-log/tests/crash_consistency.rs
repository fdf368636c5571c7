//! Crash consistency on the simulated file system.
//!
//! A quarter of the payloads end in bytes of the log's own format (frames
//! with CRCs a client can compute, segment headers).
//!
//! For each seed: a log with random small segments, frame targets, codec and
//! cache; optionally a first life that commits and closes; then a workload of
//! seeded random commits (single records and batches, from one to four
//! committer threads, with the wall clock moving forwards and sometimes
//! backwards) while a reader thread checks every record it sees; sometimes
//! an fsync, write or ENOSPC fault is injected first (the log rolls back and
//! goes on); the power is cut at a random operation; the machine crashes (dropping unsynced
//! bytes, or tearing them, or tearing them with holes); the log is reopened.
//! Then:
//!
//! * the reopen succeeds (a crash alone never needs an operator);
//! * the recovered high watermark is at or above the end of every acked
//!   commit;
//! * every acked commit is readable at its offsets with its keys, payloads
//!   and commit time;
//! * every record read is one that some committer submitted, byte for byte,
//!   and appears once; nothing is skipped as corrupt; commit times never go
//!   down;
//! * the log takes new commits at the recovered high watermark, and a clean
//!   reopen sees them.
//!
//! 1,000 seeds by default; `NARAD_SEEDS=N` runs N, `NARAD_SEED=S` one seed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use narad_clock::ManualClock;
use narad_fs::{CrashMode, FaultKind, SimFs, SimRng};
use narad_log::frame::{FrameSeed, PayloadBuilder};
use narad_log::recovery::Case;
use narad_log::{Codec, CommitOutcome, CommitRecord, LogConfig, PartitionLog, SealedCheck};

mod common;
use common::{T0, open_sim};

/// Everything the committers submitted, by payload (payloads are unique).
#[derive(Default)]
struct Submitted {
    by_payload: HashMap<Bytes, Option<Bytes>>,
    acked: Vec<(CommitOutcome, Vec<CommitRecord>)>,
}

fn random_record(rng: &mut SimRng, id: &str) -> CommitRecord {
    let key = match rng.below(4) {
        0 => None,
        1 => Some(Bytes::new()),
        _ => Some(Bytes::from(format!("key-{}", rng.below(20)))),
    };
    let mut payload = format!("{id}|").into_bytes();
    let extra = [0, 8, 60, 300, 900][rng.below(5) as usize];
    let start = payload.len();
    payload.resize(start + rng.below(extra + 1) as usize, 0);
    rng.fill(&mut payload[start..]);
    if rng.chance(1, 4) {
        payload.extend(forged_bytes(rng));
    }
    CommitRecord { key, payload: Bytes::from(payload) }
}

/// Bytes of the log's own format, as a client can make them: a frame at
/// plausible offsets sealed with the public CRC32C or a guessed salt, or a
/// segment header. The salt keeps them from passing for frames of the
/// log when recovery looks behind a torn commit that carried them.
fn forged_bytes(rng: &mut SimRng) -> Vec<u8> {
    if rng.chance(1, 4) {
        return narad_log::segment::segment_header(rng.below(200), rng.next_u64()).to_vec();
    }
    let seed =
        if rng.chance(1, 2) { FrameSeed::UNSALTED } else { FrameSeed::of_salt(rng.next_u64()) };
    let mut p = PayloadBuilder::new();
    for i in 0..1 + rng.below(3) {
        p.push(None, T0, format!("forged {i}").as_bytes());
    }
    p.finish(rng.below(200), Codec::None, seed).unwrap()
}

fn random_config(rng: &mut SimRng) -> LogConfig {
    LogConfig {
        segment_bytes: rng.range(300, 6000),
        frame_target_bytes: rng.range(1024, 3000),
        index_stride_bytes: 1024,
        codec: if rng.chance(1, 3) { Codec::Zstd { level: 1 } } else { Codec::None },
        cache_bytes: if rng.chance(1, 2) { 0 } else { 64 << 10 },
        sealed_check: if rng.chance(1, 4) { SealedCheck::Headers } else { SealedCheck::Full },
        ..LogConfig::default()
    }
}

/// Checks that a record read from the log is one that was submitted.
fn check_known(sub: &Submitted, seed: u64, r: &narad_log::LogRecord) {
    match sub.by_payload.get(&r.payload) {
        Some(key) => assert_eq!(
            key, &r.key,
            "seed {seed}: offset {} has a record with another key",
            r.offset
        ),
        None => panic!("seed {seed}: offset {} holds bytes no committer submitted", r.offset),
    }
}

/// What one seed exercised (to check that the seeds cover the cases).
#[derive(Debug, Default, Clone, Copy)]
struct Coverage {
    failed_commits: bool,
    truncated: bool,
    unacked_visible: bool,
    segments: usize,
    threads: u64,
    faults: u64,
}

fn run_seed(seed: u64) -> Coverage {
    let mut cov = Coverage::default();
    let mut rng = SimRng::new(seed);
    let fs = SimFs::new(seed.wrapping_mul(0x9E37_79B9));
    let clock = ManualClock::new(T0);
    let config = random_config(&mut rng);
    let sub = Arc::new(Mutex::new(Submitted::default()));

    // An optional first life, closed cleanly.
    if rng.chance(1, 2) {
        let log = open_sim(&fs, &config, &clock).unwrap();
        for i in 0..rng.range(1, 6) {
            let batch: Vec<_> = (0..rng.range(1, 8))
                .map(|j| random_record(&mut rng, &format!("{seed}/pre/{i}/{j}")))
                .collect();
            let mut s = sub.lock().unwrap();
            for r in &batch {
                s.by_payload.insert(r.payload.clone(), r.key.clone());
            }
            drop(s);
            let o = log.commit(batch.clone()).unwrap();
            sub.lock().unwrap().acked.push((o, batch));
        }
        log.close();
    }

    let log = Arc::new(open_sim(&fs, &config, &clock).unwrap());
    let threads = if rng.chance(1, 2) { 1 } else { rng.range(2, 4) };
    cov.threads = threads;
    let commits = rng.range(2, 10);
    let horizon = threads * commits * 5 + 10;
    // Sometimes a fault first (a failed fsync, write or a full disk), which
    // the log rolls back and survives, then the power cut.
    for _ in 0..rng.below(3) {
        let fault = [FaultKind::SyncError, FaultKind::WriteError, FaultKind::NoSpace]
            [rng.below(3) as usize];
        fs.inject(fs.op_count() + rng.below(horizon), fault);
        cov.faults += 1;
    }
    fs.power_cut_at(fs.op_count() + rng.below(horizon));

    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (log, sub, done) = (log.clone(), sub.clone(), done.clone());
        std::thread::spawn(move || {
            let mut offset = log.oldest_offset();
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let b = log.read(offset, 50, 1 << 20).expect("reads never fail here");
                assert!(
                    b.corrupt.is_empty(),
                    "seed {seed}: corrupt ranges {:?} before the crash",
                    b.corrupt
                );
                let s = sub.lock().unwrap();
                for r in &b.records {
                    check_known(&s, seed, r);
                }
                drop(s);
                offset = if b.next_offset >= b.high_watermark {
                    log.oldest_offset()
                } else {
                    b.next_offset
                };
                std::thread::yield_now();
            }
        })
    };

    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (log, sub, clock) = (log.clone(), sub.clone(), clock.clone());
            let mut rng = rng.fork();
            std::thread::spawn(move || {
                let mut failed = false;
                for i in 0..commits {
                    let n = if rng.chance(1, 2) { 1 } else { rng.range(2, 20) };
                    let batch: Vec<_> = (0..n)
                        .map(|j| random_record(&mut rng, &format!("{seed}/{t}/{i}/{j}")))
                        .collect();
                    {
                        let mut s = sub.lock().unwrap();
                        for r in &batch {
                            s.by_payload.insert(r.payload.clone(), r.key.clone());
                        }
                    }
                    match rng.below(10) {
                        0 => clock.set_wall_ms(clock_now(&clock).saturating_sub(rng.below(5_000))),
                        1..=5 => clock.advance(Duration::from_millis(rng.below(3_000))),
                        _ => {}
                    }
                    match log.commit(batch.clone()) {
                        Ok(o) => {
                            assert_eq!(o.count, batch.len() as u64);
                            sub.lock().unwrap().acked.push((o, batch));
                        }
                        Err(_) => failed = true,
                    }
                }
                failed
            })
        })
        .collect();
    for w in workers {
        cov.failed_commits |= w.join().unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    reader.join().unwrap();

    let mode =
        [CrashMode::DropUnsynced, CrashMode::Torn, CrashMode::TornWithHoles][rng.below(3) as usize];
    drop(Arc::try_unwrap(log).expect("every thread let go of the log"));
    fs.crash(mode);

    let log = open_sim(&fs, &config, &clock)
        .unwrap_or_else(|e| panic!("seed {seed} ({mode:?}): reopen failed: {e}"));
    let sub = sub.lock().unwrap();
    let hwm = log.high_watermark();
    let acked_end = sub.acked.iter().map(|(o, _)| o.offsets().end).max().unwrap_or(0);
    assert!(
        hwm >= acked_end,
        "seed {seed}: recovered high watermark {hwm} is below acked offset {acked_end}"
    );

    let all = read_everything(&log, seed);
    assert_eq!(all.len() as u64, hwm, "seed {seed}: offsets are dense from 0");
    let mut seen = std::collections::HashSet::new();
    for (i, r) in all.iter().enumerate() {
        assert_eq!(r.offset, i as u64);
        check_known(&sub, seed, r);
        assert!(
            seen.insert(r.payload.clone()),
            "seed {seed}: offset {} repeats a record",
            r.offset
        );
    }
    assert!(
        all.windows(2).all(|w| w[0].commit_time_ms <= w[1].commit_time_ms),
        "seed {seed}: commit times went down"
    );
    for (o, batch) in &sub.acked {
        for (k, r) in batch.iter().enumerate() {
            let got = &all[(o.first_offset + k as u64) as usize];
            assert_eq!(
                (&got.key, &got.payload, got.commit_time_ms),
                (&r.key, &r.payload, o.commit_time_ms),
                "seed {seed} ({mode:?}): acked record at offset {} differs",
                got.offset
            );
        }
    }
    assert_eq!(log.corrupt_frames_skipped(), 0, "seed {seed}");
    cov.truncated = log.recovery_report().truncation.is_some();
    cov.unacked_visible = hwm > acked_end;
    cov.segments = log.stats().segments;

    // Life goes on at the recovered high watermark.
    let next = vec![CommitRecord::keyed("after", format!("{seed}/after"))];
    assert_eq!(log.commit(next).unwrap().first_offset, hwm, "seed {seed}");
    log.close();
    drop(log);
    let log = open_sim(&fs, &config, &clock).unwrap();
    assert_eq!(log.high_watermark(), hwm + 1, "seed {seed}");
    // A clean reopen cuts at most the zero runway after the last frame.
    let cut = log.recovery_report().truncation.as_ref().map(|t| t.case);
    assert!(
        matches!(cut, None | Some(Case::ZeroRunwayOfLastSegment)),
        "seed {seed}: a clean reopen truncated {cut:?}"
    );
    cov
}

fn clock_now(clock: &ManualClock) -> u64 {
    use narad_clock::Clock;
    clock.wall_ms()
}

fn read_everything(log: &PartitionLog, seed: u64) -> Vec<narad_log::LogRecord> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < log.high_watermark() {
        let b = log.read(offset, 1000, u64::MAX).unwrap();
        assert!(b.corrupt.is_empty(), "seed {seed}: corrupt ranges {:?} after reopen", b.corrupt);
        out.extend(b.records);
        offset = b.next_offset;
    }
    out
}

fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("NARAD_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![s];
    }
    let n = std::env::var("NARAD_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
    (0..n).collect()
}

#[test]
fn every_acked_commit_survives_a_crash_at_any_operation() {
    let seeds = seeds();
    let runs: Vec<Coverage> = seeds.iter().map(|&s| run_seed(s)).collect();
    let count = |f: fn(&Coverage) -> bool| runs.iter().filter(|c| f(c)).count();
    let failed = count(|c| c.failed_commits);
    let truncated = count(|c| c.truncated);
    let unacked = count(|c| c.unacked_visible);
    let multi_segment = count(|c| c.segments > 2);
    let threaded = count(|c| c.threads > 1);
    eprintln!(
        "{} seeds: {failed} with failed commits, {truncated} truncated a torn tail, {unacked} \
         recovered unacked records, {multi_segment} with >2 segments, {threaded} multi-threaded",
        runs.len()
    );
    // The default run must exercise every interesting path, or it proves
    // little.
    if runs.len() >= 1000 {
        for (what, n, share) in [
            ("failed commits", failed, 5),
            ("torn tails", truncated, 40),
            ("unacked records", unacked, 10),
            ("multi-segment logs", multi_segment, 5),
            ("multi-threaded runs", threaded, 5),
        ] {
            assert!(n >= runs.len() / share, "only {n} of {} seeds had {what}", runs.len());
        }
    }
}
