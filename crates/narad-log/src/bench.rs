//! The partition-log benchmark behind `narad bench log`: durable commits of
//! fixed-size records from concurrent committers against a real directory,
//! with the disk's serial fdatasync rate measured in the same run, then a
//! sequential read of everything written. It prints figures; it asserts
//! nothing.
//!
//! Phases, in order:
//! 1. *fdatasync probe*: one thread appends a record-sized block to a file
//!    and fdatasyncs it, serially, for half of `probe_seconds`: the disk's
//!    limit for a committer that syncs on its own. The other half runs after
//!    phase 2; the figure is the mean of the two (both are reported).
//!    A second probe, split the same way, appends one *whole cycle* (the
//!    frame holding one batch from every committer) per fdatasync (over
//!    synced zeros when the cycle is small enough to use the log's zero
//!    runway): times
//!    the records in it, that is `ceiling_records_per_sec`, what the log
//!    could reach if every cycle carried every committer's batch and cost
//!    nothing but its write and fdatasync. On a disk whose fdatasync time
//!    grows with the bytes synced, that ceiling, not the committer count,
//!    bounds `records_per_fdatasync`.
//! 2. *commits*: `committers` threads each commit batches of `batch` records
//!    of `record_bytes` bytes to one [`PartitionLog`] for `seconds`.
//! 3. *read*: the log is reopened (so the decoded-frame cache is cold; the
//!    OS page cache is not) and read sequentially from offset 0.
//!
//! The log directory is created under `dir` and removed at the end unless
//! `keep` is set.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_clock::SystemClock;
use narad_fs::probe::append_sync_per_sec;
use narad_fs::{Fs, RealFs, SimRng};

use crate::commit::runway_frame_max;
use crate::frame::PayloadBuilder;
use crate::limits::{FRAME_HEADER_LEN, MAX_FRAME_RECORDS_WRITTEN};
use crate::{Codec, CommitRecord, LogConfig, LogError, PartitionLog};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The directory to measure (a scratch subdirectory is made in it).
    pub dir: PathBuf,
    /// Concurrent committers. Default 16.
    pub committers: usize,
    /// Records per commit. Default 1.
    pub batch: usize,
    /// Payload bytes per record. Default 1,024.
    pub record_bytes: usize,
    /// Length of the commit phase. Default 5 s.
    pub seconds: f64,
    /// Length of the serial fdatasync probe (half before, half after the
    /// commits). Default 2 s.
    pub probe_seconds: f64,
    /// The log's codec. Default none.
    pub codec: Codec,
    /// The log's segment size. Default 64 MiB.
    pub segment_bytes: u64,
    /// The log's zero runway (`LogConfig::runway_bytes`; 0 = none).
    /// Default the log's default.
    pub runway_bytes: u64,
    /// Keep the scratch directory. Default false.
    pub keep: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            dir: std::env::temp_dir(),
            committers: 16,
            batch: 1,
            record_bytes: 1024,
            seconds: 5.0,
            probe_seconds: 2.0,
            codec: Codec::None,
            segment_bytes: crate::limits::DEFAULT_SEGMENT_BYTES,
            runway_bytes: crate::limits::DEFAULT_RUNWAY_BYTES,
            keep: false,
        }
    }
}

/// The figures of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    /// Concurrent committers.
    pub committers: usize,
    /// Records per commit.
    pub batch: usize,
    /// Payload bytes per record.
    pub record_bytes: usize,
    /// The codec.
    pub codec: Codec,
    /// Serial fdatasyncs per second of the probe (same run, same directory):
    /// the mean of the runs before and after the commit phase.
    pub fdatasync_per_sec: f64,
    /// The probe before the commit phase.
    pub fdatasync_before_per_sec: f64,
    /// The probe after the commit phase.
    pub fdatasync_after_per_sec: f64,
    /// Seconds the commit phase really lasted.
    pub elapsed_sec: f64,
    /// Successful `commit` calls.
    pub commits: u64,
    /// Records committed.
    pub records: u64,
    /// fdatasyncs the log issued.
    pub syncs: u64,
    /// Commits per second.
    pub commits_per_sec: f64,
    /// Records per second.
    pub records_per_sec: f64,
    /// Log fdatasyncs per second.
    pub syncs_per_sec: f64,
    /// Payload MB (10^6 bytes) committed per second.
    pub write_mb_per_sec: f64,
    /// Median commit latency, µs.
    pub commit_p50_us: u64,
    /// 99th percentile commit latency, µs.
    pub commit_p99_us: u64,
    /// Slowest commit, µs.
    pub commit_max_us: u64,
    /// Payload MB (10^6 bytes) per second of the sequential read.
    pub read_mb_per_sec: f64,
    /// Records per second of the sequential read.
    pub read_records_per_sec: f64,
    /// `records_per_sec / fdatasync_per_sec`.
    pub records_per_fdatasync: f64,
    /// Serial append + fdatasync per second of one whole cycle's bytes
    /// (mean of the runs before and after the commit phase).
    pub cycle_fdatasync_per_sec: f64,
    /// `cycle_fdatasync_per_sec ×` the records of a whole cycle: the log's
    /// bound on this disk for this committer count and batch.
    pub ceiling_records_per_sec: f64,
    /// `ceiling_records_per_sec / fdatasync_per_sec`.
    pub ceiling_records_per_fdatasync: f64,
    /// `records_per_sec / ceiling_records_per_sec`.
    pub of_ceiling: f64,
    /// The 1-minute load average when the run ended (Linux), if known.
    pub load_avg_1m: Option<f64>,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Invalid options.
    #[error("invalid benchmark options: {0}")]
    Options(String),
    /// The scratch directory or the probe file failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// A read failed.
    #[error(transparent)]
    Read(#[from] crate::ReadError),
}

/// Runs the benchmark.
pub fn run(opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    if opts.committers == 0 || opts.batch == 0 || opts.record_bytes == 0 {
        return Err(BenchError::Options("committers, batch and record bytes must be > 0".into()));
    }
    if !(opts.seconds > 0.0 && opts.probe_seconds > 0.0) {
        return Err(BenchError::Options("seconds must be > 0".into()));
    }
    let fs = Arc::new(RealFs);
    let scratch = opts.dir.join(format!("narad-bench-log-{}", std::process::id()));
    let io = |op, path: &PathBuf| {
        let path = path.clone();
        move |source| BenchError::Io { op, path, source }
    };
    if fs.exists(&scratch).map_err(io("stat", &scratch))? {
        fs.remove_dir_all(&scratch).map_err(io("remove", &scratch))?;
    }
    fs.create_dir_all(&scratch).map_err(io("create", &scratch))?;
    let result = run_in(opts, fs.clone(), &scratch);
    if !opts.keep {
        fs.remove_dir_all(&scratch).map_err(io("remove", &scratch))?;
    }
    result
}

fn run_in(
    opts: &BenchOptions,
    fs: Arc<RealFs>,
    scratch: &std::path::Path,
) -> Result<BenchReport, BenchError> {
    // The probe runs half before and half after the commit phase, so a
    // change of load on a shared machine shows (and averages out).
    let half = opts.probe_seconds / 2.0;
    let before = probe_fdatasync(&*fs, scratch, opts.record_bytes, half, false)?;
    let (cycle_bytes, cycle_records) = whole_cycle(opts);
    // The log keeps a zero runway ahead of one-frame cycles, so their probe
    // overwrites synced zeros too.
    let prezeroed = cycle_bytes as u64 <= runway_frame_max(opts.runway_bytes);
    let cycle_before = probe_fdatasync(&*fs, scratch, cycle_bytes, half, prezeroed)?;

    let config = LogConfig {
        codec: opts.codec,
        segment_bytes: opts.segment_bytes,
        runway_bytes: opts.runway_bytes,
        ..LogConfig::default()
    };
    let log_dir = scratch.join("p00000");
    let clock = SystemClock::shared();
    let log = PartitionLog::open(fs.clone(), log_dir.clone(), config.clone(), clock.clone())?;
    let mut rng = SimRng::new(0x006e_6172_6164);
    let mut payload = vec![0u8; opts.record_bytes];
    // Half random, half repeated: compressible like typical JSON, not
    // trivially so.
    rng.fill(&mut payload[..opts.record_bytes / 2]);
    let payload = Bytes::from(payload);
    let deadline = Instant::now() + Duration::from_secs_f64(opts.seconds);
    let start = Instant::now();
    let per_thread: Vec<Result<Vec<u32>, LogError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..opts.committers)
            .map(|_| {
                let log = &log;
                let payload = payload.clone();
                s.spawn(move || {
                    let mut lat = Vec::new();
                    while Instant::now() < deadline {
                        let batch = vec![CommitRecord::keyless(payload.clone()); opts.batch];
                        let t = Instant::now();
                        log.commit(batch)?;
                        lat.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                    }
                    Ok(lat)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("committer thread panicked")).collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let mut lat = Vec::new();
    for r in per_thread {
        lat.extend(r?);
    }
    let m = log.metrics();
    log.close();
    drop(log);
    let after = probe_fdatasync(&*fs, scratch, opts.record_bytes, half, false)?;
    let cycle_after = probe_fdatasync(&*fs, scratch, cycle_bytes, half, prezeroed)?;
    let fdatasync_per_sec = (before + after) / 2.0;
    let cycle_fdatasync_per_sec = (cycle_before + cycle_after) / 2.0;
    let ceiling = cycle_fdatasync_per_sec * cycle_records as f64;
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let commits = lat.len() as u64;
    let records = m.records_committed;

    // Sequential read of everything, from a reopened log.
    let log = PartitionLog::open(fs, log_dir, config, clock)?;
    let hwm = log.high_watermark();
    let start = Instant::now();
    let (mut offset, mut bytes, mut read) = (0u64, 0u64, 0u64);
    while offset < hwm {
        let b = log.read(offset, 1000, 8 << 20)?;
        bytes += b.records.iter().map(|r| r.payload.len() as u64).sum::<u64>();
        read += b.records.len() as u64;
        if b.next_offset == offset {
            break;
        }
        offset = b.next_offset;
    }
    let read_sec = start.elapsed().as_secs_f64().max(1e-9);
    log.close();

    let records_per_sec = records as f64 / elapsed;
    Ok(BenchReport {
        committers: opts.committers,
        batch: opts.batch,
        record_bytes: opts.record_bytes,
        codec: opts.codec,
        fdatasync_per_sec,
        fdatasync_before_per_sec: before,
        fdatasync_after_per_sec: after,
        elapsed_sec: elapsed,
        commits,
        records,
        syncs: m.syncs,
        commits_per_sec: commits as f64 / elapsed,
        records_per_sec,
        syncs_per_sec: m.syncs as f64 / elapsed,
        write_mb_per_sec: (records * opts.record_bytes as u64) as f64 / elapsed / 1e6,
        commit_p50_us: u64::from(pct(0.50)),
        commit_p99_us: u64::from(pct(0.99)),
        commit_max_us: u64::from(lat.last().copied().unwrap_or(0)),
        read_mb_per_sec: bytes as f64 / read_sec / 1e6,
        read_records_per_sec: read as f64 / read_sec,
        records_per_fdatasync: if fdatasync_per_sec > 0.0 {
            records_per_sec / fdatasync_per_sec
        } else {
            0.0
        },
        cycle_fdatasync_per_sec,
        ceiling_records_per_sec: ceiling,
        ceiling_records_per_fdatasync: ceiling / fdatasync_per_sec.max(1.0),
        of_ceiling: records_per_sec / ceiling.max(1.0),
        load_avg_1m: load_avg(),
    })
}

/// The file bytes and records of one whole cycle: a batch from every
/// committer, split into frames at the frame target as a cycle is. Capped
/// at 16 MiB (a bigger cycle's ceiling is its bandwidth, which a 16 MiB
/// probe already measures).
fn whole_cycle(opts: &BenchOptions) -> (usize, usize) {
    const CAP: usize = 16 << 20;
    let wire = PayloadBuilder::wire_len(None, opts.record_bytes);
    let config = LogConfig { segment_bytes: opts.segment_bytes, ..LogConfig::default() };
    let per_frame = (config.effective_frame_target() as usize / wire)
        .clamp(1, MAX_FRAME_RECORDS_WRITTEN as usize);
    let frame_bytes = |records: usize| FRAME_HEADER_LEN + records * wire;
    let records = (opts.committers * opts.batch).min((CAP / wire).max(1));
    let full = records / per_frame;
    let rest = records % per_frame;
    let bytes = full * frame_bytes(per_frame) + if rest > 0 { frame_bytes(rest) } else { 0 };
    (bytes, records)
}

/// Serial append + fdatasync of `block` bytes for `seconds` (over synced
/// zeros with `prezeroed`): [`append_sync_per_sec`] in the scratch dir.
fn probe_fdatasync(
    fs: &dyn Fs,
    dir: &std::path::Path,
    block: usize,
    seconds: f64,
    prezeroed: bool,
) -> Result<f64, BenchError> {
    let path = dir.join("fdatasync-probe");
    append_sync_per_sec(fs, &path, block, seconds, prezeroed).map_err(|source| BenchError::Io {
        op: "probe",
        path,
        source,
    })
}

fn load_avg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

impl BenchReport {
    /// The figures as (name, value) pairs, in a stable order (the JSON keys
    /// of `narad bench log --json`).
    pub fn fields(&self) -> Vec<(&'static str, f64)> {
        let zstd_level = match self.codec {
            Codec::None => 0.0,
            Codec::Zstd { level } => f64::from(level),
        };
        let mut fields = vec![
            ("committers", self.committers as f64),
            ("batch", self.batch as f64),
            ("record_bytes", self.record_bytes as f64),
            ("zstd_level", zstd_level),
            ("fdatasync_per_sec", self.fdatasync_per_sec),
            ("fdatasync_before_per_sec", self.fdatasync_before_per_sec),
            ("fdatasync_after_per_sec", self.fdatasync_after_per_sec),
            ("elapsed_sec", self.elapsed_sec),
            ("commits", self.commits as f64),
            ("records", self.records as f64),
            ("syncs", self.syncs as f64),
            ("commits_per_sec", self.commits_per_sec),
            ("records_per_sec", self.records_per_sec),
            ("syncs_per_sec", self.syncs_per_sec),
            ("records_per_fdatasync", self.records_per_fdatasync),
            ("cycle_fdatasync_per_sec", self.cycle_fdatasync_per_sec),
            ("ceiling_records_per_sec", self.ceiling_records_per_sec),
            ("ceiling_records_per_fdatasync", self.ceiling_records_per_fdatasync),
            ("of_ceiling", self.of_ceiling),
            ("write_mb_per_sec", self.write_mb_per_sec),
            ("commit_p50_us", self.commit_p50_us as f64),
            ("commit_p99_us", self.commit_p99_us as f64),
            ("commit_max_us", self.commit_max_us as f64),
            ("read_mb_per_sec", self.read_mb_per_sec),
            ("read_records_per_sec", self.read_records_per_sec),
        ];
        fields.extend(self.load_avg_1m.map(|l| ("load_avg_1m", l)));
        fields
    }

    /// One JSON object of [`BenchReport::fields`].
    pub fn to_json(&self) -> String {
        let mut s = String::from("{");
        for (i, (k, v)) in self.fields().into_iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = match v {
                v if !v.is_finite() => write!(s, "\"{k}\":null"),
                v if v.fract() == 0.0 && v.abs() < 1e15 => write!(s, "\"{k}\":{}", v as i64),
                v => write!(s, "\"{k}\":{v:.2}"),
            };
        }
        s.push('}');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_cycle_is_one_batch_per_committer_in_frames_of_the_target() {
        let wire = PayloadBuilder::wire_len(None, 1024);
        let opts = BenchOptions { committers: 16, ..BenchOptions::default() };
        assert_eq!(whole_cycle(&opts), (FRAME_HEADER_LEN + 16 * wire, 16));
        // 16 x 100 records of 1 KiB: more than one 1 MiB frame.
        let opts = BenchOptions { committers: 16, batch: 100, ..BenchOptions::default() };
        let per_frame = (1usize << 20) / wire;
        let (bytes, records) = whole_cycle(&opts);
        assert_eq!(records, 1600);
        let frames = 1600usize.div_ceil(per_frame);
        assert_eq!(bytes, frames * FRAME_HEADER_LEN + 1600 * wire);
        // Capped at 16 MiB of records.
        let opts = BenchOptions { committers: 64, batch: 1000, ..BenchOptions::default() };
        let (bytes, records) = whole_cycle(&opts);
        assert_eq!(records, (16 << 20) / wire);
        assert!(bytes <= (16 << 20) + 64 * FRAME_HEADER_LEN, "{bytes}");
    }

    #[test]
    fn bench_runs_against_a_real_directory_and_reports_json() {
        let dir = std::env::temp_dir().join(format!("narad-log-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let opts = BenchOptions {
            dir: dir.clone(),
            committers: 4,
            batch: 8,
            seconds: 0.3,
            probe_seconds: 0.1,
            ..BenchOptions::default()
        };
        let r = run(&opts).unwrap();
        assert!(r.commits > 0 && r.records == r.commits * 8);
        assert!(r.syncs > 0 && r.syncs <= r.commits);
        assert!(r.fdatasync_per_sec > 0.0 && r.read_mb_per_sec > 0.0);
        assert!(r.cycle_fdatasync_per_sec > 0.0 && r.ceiling_records_per_sec > 0.0);
        let json = r.to_json();
        for key in [
            "fdatasync_per_sec",
            "commits_per_sec",
            "records_per_sec",
            "syncs_per_sec",
            "commit_p50_us",
            "commit_p99_us",
            "read_mb_per_sec",
            "ceiling_records_per_sec",
            "of_ceiling",
        ] {
            assert!(json.contains(&format!("\"{key}\":")), "{key} missing from {json}");
        }
        // The scratch directory is gone.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
