//! `narad bench disk`: can this disk carry the WAL?
//!
//! Measures, in one run, in a scratch directory it removes afterwards:
//! * `fdatasync_per_sec`: serial 4 KiB appends, each followed by fdatasync,
//!   the mean of a probe before the WAL phase and one after it
//!   (`fdatasync_before_per_sec`, `fdatasync_after_per_sec`): a shared
//!   virtual disk's speed drifts by a factor of two within minutes, so one
//!   probe on one side of the run makes `wal_vs_fdatasync` a coin toss;
//! * `dsync_mb_per_sec`: sequential 1 MiB writes, each followed by fdatasync;
//! * `group_fdatasync_per_sec`: serial appends of one whole group (the
//!   bytes of one frame from every appender), each followed by fdatasync,
//!   into a zero-filled file when the WAL prepares its segments. Times the
//!   number of appenders it is `ceiling_appends_per_sec`: what the WAL
//!   could reach if every sync carried every appender's record and cost
//!   nothing but its write and fdatasync. On a disk whose fdatasync time
//!   grows with the bytes synced, that ceiling, not the appender count,
//!   bounds `wal_vs_fdatasync`;
//! * the WAL itself under `appenders` concurrent appenders of
//!   `record_bytes`-byte payloads: appends/s, MB/s, records per sync and
//!   append latency percentiles.
//!
//! The appenders are async tasks on a tokio runtime with one worker per
//! core ([`Driver::Tasks`], the default), which is how the server drives the
//! WAL: every produce handler is a task awaiting `append_async`. With
//! [`Driver::Threads`] each appender is an OS thread blocked in `append`; on
//! a small machine that measures mostly the cost of waking 64 threads.
//!
//! Figures, not assertions: nothing here fails because a disk is slow.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use narad_fs::probe::append_sync_per_sec;
use narad_fs::{Fs, OpenMode, RealFs};

use crate::limits::FRAME_HEADER_BYTES;
use crate::record::RecordRef;
use crate::wal::{Wal, WalOptions};

/// What the concurrent appenders are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Driver {
    /// Async tasks awaiting `append_async` on a tokio runtime with one
    /// worker thread per core, as the server's produce handlers do.
    #[default]
    Tasks,
    /// One OS thread per appender, blocked in `append`.
    Threads,
}

impl Driver {
    /// The driver's name, as `--driver` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Driver::Tasks => "tasks",
            Driver::Threads => "threads",
        }
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct DiskBenchOptions {
    /// A directory on the disk to test; a scratch subdirectory is used.
    pub dir: PathBuf,
    /// Concurrent WAL appenders.
    pub appenders: usize,
    /// Payload bytes per WAL record.
    pub record_bytes: usize,
    /// Duration of the WAL phase.
    pub seconds: f64,
    /// Duration of each raw-disk probe.
    pub probe_seconds: f64,
    /// What the appenders are.
    pub driver: Driver,
    /// Run the WAL with segment preparation (`storage.ingress_wal_prealloc`).
    pub prealloc: bool,
    /// The WAL's zero runway ([`WalOptions::runway_bytes`]; 0 = none).
    pub runway_bytes: u64,
}

/// The figures.
#[derive(Debug, Clone, Default)]
pub struct DiskBenchReport {
    /// Serial 4 KiB append + fdatasync per second: the mean of the probes
    /// before and after the WAL phase.
    pub fdatasync_per_sec: f64,
    /// The probe before the WAL phase.
    pub fdatasync_before_per_sec: f64,
    /// The probe after the WAL phase.
    pub fdatasync_after_per_sec: f64,
    /// Sequential 1 MiB write + fdatasync throughput.
    pub dsync_mb_per_sec: f64,
    /// WAL appends completed per second.
    pub wal_appends_per_sec: f64,
    /// WAL payload megabytes per second.
    pub wal_mb_per_sec: f64,
    /// Average records made durable per fdatasync.
    pub wal_records_per_sync: f64,
    /// Median append latency, µs.
    pub wal_p50_us: f64,
    /// 99th percentile append latency, µs.
    pub wal_p99_us: f64,
    /// Maximum append latency, µs.
    pub wal_max_us: f64,
    /// `wal_appends_per_sec / fdatasync_per_sec`.
    pub wal_vs_fdatasync: f64,
    /// Average write + fdatasync time of one group commit, µs.
    pub wal_sync_us: f64,
    /// Fraction of the run the sync thread spent in write + fdatasync.
    pub wal_sync_busy: f64,
    /// Appenders used.
    pub appenders: usize,
    /// Payload bytes per record.
    pub record_bytes: usize,
    /// OS threads the appenders ran on: the runtime's workers for
    /// [`Driver::Tasks`], one per appender for [`Driver::Threads`].
    pub appender_os_threads: usize,
    /// Serial append + fdatasync per second of one whole group's bytes
    /// (`appenders` frames of `record_bytes`), into a zero-filled file when
    /// `prealloc` is on.
    pub group_fdatasync_per_sec: f64,
    /// `group_fdatasync_per_sec × appenders`: the WAL's bound on this disk.
    pub ceiling_appends_per_sec: f64,
    /// `ceiling_appends_per_sec / fdatasync_per_sec`.
    pub ceiling_vs_fdatasync: f64,
    /// `wal_appends_per_sec / ceiling_appends_per_sec`.
    pub wal_of_ceiling: f64,
    /// Whether segment preparation was on.
    pub prealloc: bool,
    /// The WAL's zero runway in bytes.
    pub runway_bytes: u64,
    /// Segment rolls during the run that renamed in a prepared segment.
    pub wal_prepared_rolls: u64,
}

impl DiskBenchReport {
    /// Every figure as (name, value), in a stable order.
    pub fn fields(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("fdatasync_per_sec", self.fdatasync_per_sec),
            ("fdatasync_before_per_sec", self.fdatasync_before_per_sec),
            ("fdatasync_after_per_sec", self.fdatasync_after_per_sec),
            ("dsync_mb_per_sec", self.dsync_mb_per_sec),
            ("wal_appends_per_sec", self.wal_appends_per_sec),
            ("wal_mb_per_sec", self.wal_mb_per_sec),
            ("wal_records_per_sync", self.wal_records_per_sync),
            ("wal_p50_us", self.wal_p50_us),
            ("wal_p99_us", self.wal_p99_us),
            ("wal_max_us", self.wal_max_us),
            ("wal_vs_fdatasync", self.wal_vs_fdatasync),
            ("wal_sync_us", self.wal_sync_us),
            ("wal_sync_busy", self.wal_sync_busy),
            ("group_fdatasync_per_sec", self.group_fdatasync_per_sec),
            ("ceiling_appends_per_sec", self.ceiling_appends_per_sec),
            ("ceiling_vs_fdatasync", self.ceiling_vs_fdatasync),
            ("wal_of_ceiling", self.wal_of_ceiling),
            ("appenders", self.appenders as f64),
            ("record_bytes", self.record_bytes as f64),
            ("appender_os_threads", self.appender_os_threads as f64),
            ("prealloc", if self.prealloc { 1.0 } else { 0.0 }),
            ("runway_bytes", self.runway_bytes as f64),
            ("wal_prepared_rolls", self.wal_prepared_rolls as f64),
        ]
    }
}

/// Serial fdatasyncs per second of 4 KiB appends to one file in `dir`.
pub fn fdatasync_per_sec(fs: &dyn Fs, dir: &Path, seconds: f64) -> std::io::Result<f64> {
    append_sync_per_sec(fs, &dir.join("fdatasync.probe"), 4096, seconds, false)
}

/// MB/s of sequential 1 MiB writes each followed by fdatasync.
pub fn dsync_mb_per_sec(fs: &dyn Fs, dir: &Path, seconds: f64) -> std::io::Result<f64> {
    let path = dir.join("dsync.probe");
    let f = fs.open(&path, OpenMode::CreateOrTruncate)?;
    let block = vec![0x5Au8; 1 << 20];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < seconds && n < 1024 {
        f.write_all_at(&block, n << 20)?;
        f.sync_data()?;
        n += 1;
    }
    let mb = n as f64 * 1.048_576;
    let rate = mb / start.elapsed().as_secs_f64();
    drop(f);
    fs.remove_file(&path)?;
    Ok(rate)
}

/// Runs the whole disk benchmark.
pub fn run(opts: &DiskBenchOptions) -> Result<DiskBenchReport, Box<dyn std::error::Error>> {
    let fs = RealFs::shared();
    let scratch = opts.dir.join(format!("narad-bench-disk-{}", std::process::id()));
    fs.create_dir_all(&scratch)?;
    let result = run_in(&scratch, opts);
    let cleanup = fs.remove_dir_all(&scratch);
    let report = result?;
    cleanup?;
    Ok(report)
}

fn run_in(
    scratch: &Path,
    opts: &DiskBenchOptions,
) -> Result<DiskBenchReport, Box<dyn std::error::Error>> {
    let fs = RealFs::shared();
    let fdatasync_before = fdatasync_per_sec(&*fs, scratch, opts.probe_seconds)?;
    let dsync = dsync_mb_per_sec(&*fs, scratch, opts.probe_seconds)?;
    let appenders = opts.appenders.max(1);
    let group_bytes = appenders * frame_bytes(opts.record_bytes);
    // A group small enough to write over the zero runway overwrites zeros
    // in the WAL, as it does in a prepared segment.
    let prezeroed =
        opts.prealloc || group_bytes as u64 <= crate::runway_group_max(opts.runway_bytes);
    let group = append_sync_per_sec(
        &*fs,
        &scratch.join("group.probe"),
        group_bytes,
        opts.probe_seconds,
        prezeroed,
    )?;
    let ceiling = group * appenders as f64;

    let wal = Arc::new(Wal::open_with(
        fs.clone(),
        scratch.join("wal"),
        WalOptions {
            prealloc: opts.prealloc,
            runway_bytes: opts.runway_bytes,
            ..WalOptions::default()
        },
    )?);
    let before = wal.stats();
    let start = Instant::now();
    let outcome = match opts.driver {
        Driver::Tasks => drive_tasks(&wal, opts),
        Driver::Threads => drive_threads(&wal, opts),
    };
    let elapsed = start.elapsed().as_secs_f64();
    let (total, hist, os_threads) = outcome?;
    let after = wal.stats();
    wal.close()?;
    let fdatasync_after = fdatasync_per_sec(&*fs, scratch, opts.probe_seconds)?;
    let fdatasync = (fdatasync_before + fdatasync_after) / 2.0;
    let appends_per_sec = total as f64 / elapsed;
    let syncs = (after.syncs - before.syncs).max(1);
    Ok(DiskBenchReport {
        fdatasync_per_sec: fdatasync,
        fdatasync_before_per_sec: fdatasync_before,
        fdatasync_after_per_sec: fdatasync_after,
        dsync_mb_per_sec: dsync,
        wal_appends_per_sec: appends_per_sec,
        wal_mb_per_sec: appends_per_sec * opts.record_bytes as f64 / 1e6,
        wal_records_per_sync: (after.records - before.records) as f64 / syncs as f64,
        wal_p50_us: hist.value_at_quantile(0.50) as f64,
        wal_p99_us: hist.value_at_quantile(0.99) as f64,
        wal_max_us: hist.max() as f64,
        wal_vs_fdatasync: appends_per_sec / fdatasync.max(1.0),
        wal_sync_us: (after.io_nanos - before.io_nanos) as f64 / 1e3 / syncs as f64,
        wal_sync_busy: (after.io_nanos - before.io_nanos) as f64 / 1e9 / elapsed,
        appenders: opts.appenders,
        record_bytes: opts.record_bytes,
        appender_os_threads: os_threads,
        group_fdatasync_per_sec: group,
        ceiling_appends_per_sec: ceiling,
        ceiling_vs_fdatasync: ceiling / fdatasync.max(1.0),
        wal_of_ceiling: appends_per_sec / ceiling.max(1.0),
        prealloc: opts.prealloc,
        runway_bytes: opts.runway_bytes,
        wal_prepared_rolls: after.prepared_rolls - before.prepared_rolls,
    })
}

/// The bytes one bench record takes in the WAL (frame header included).
fn frame_bytes(record_bytes: usize) -> usize {
    let payload = vec![b'x'; record_bytes];
    let body = record("k0", 0, &payload).encoded_len().map_or(record_bytes, |n| n as usize);
    FRAME_HEADER_BYTES as usize + body
}

/// Appends done and their latencies (µs).
type Tally = (u64, Histogram<u64>);

fn histogram() -> Result<Histogram<u64>, String> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())
}

/// The record appender `t` writes: keyed, spread over three partitions.
fn record<'a>(key: &'a str, t: usize, payload: &'a [u8]) -> RecordRef<'a> {
    RecordRef {
        topic: "bench",
        incarnation: Some(1),
        key: Some(key.as_bytes()),
        partition: t as u32 % 3,
        accepted_at_ms: 0,
        payload,
    }
}

/// Sums the appenders' counts and latency histograms.
fn merge(parts: Vec<Result<Tally, String>>) -> Result<Tally, Box<dyn std::error::Error>> {
    let mut total = 0u64;
    let mut hist = histogram()?;
    for part in parts {
        let (n, h) = part?;
        total += n;
        hist.add(h)?;
    }
    Ok((total, hist))
}

/// One OS thread per appender, blocked in `append`. Returns the tally and
/// the threads used.
fn drive_threads(
    wal: &Arc<Wal>,
    opts: &DiskBenchOptions,
) -> Result<(u64, Histogram<u64>, usize), Box<dyn std::error::Error>> {
    let appenders = opts.appenders.max(1);
    let stop = Arc::new(AtomicBool::new(false));
    let payload: Arc<[u8]> = vec![b'x'; opts.record_bytes].into();
    let mut handles = Vec::new();
    for t in 0..appenders {
        let (wal, stop, payload) = (wal.clone(), stop.clone(), payload.clone());
        handles.push(std::thread::spawn(move || -> Result<Tally, String> {
            let mut hist = histogram()?;
            let key = format!("k{t}");
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                wal.append(&record(&key, t, &payload)).map_err(|e| e.to_string())?;
                hist.saturating_record(t0.elapsed().as_micros() as u64);
                n += 1;
            }
            Ok((n, hist))
        }));
    }
    std::thread::sleep(Duration::from_secs_f64(opts.seconds));
    stop.store(true, Ordering::Relaxed);
    let parts = handles
        .into_iter()
        .map(|h| h.join().unwrap_or_else(|_| Err("appender thread panicked".to_string())))
        .collect();
    let (total, hist) = merge(parts)?;
    Ok((total, hist, appenders))
}

/// Async tasks awaiting `append_async` on a runtime with one worker per
/// core. Returns the tally and the worker threads used.
fn drive_tasks(
    wal: &Arc<Wal>,
    opts: &DiskBenchOptions,
) -> Result<(u64, Histogram<u64>, usize), Box<dyn std::error::Error>> {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_time()
        .build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let payload: Arc<[u8]> = vec![b'x'; opts.record_bytes].into();
    let parts = rt.block_on(async {
        let mut handles = Vec::new();
        for t in 0..opts.appenders.max(1) {
            let (wal, stop, payload) = (wal.clone(), stop.clone(), payload.clone());
            handles.push(tokio::spawn(async move {
                let mut hist = histogram()?;
                let key = format!("k{t}");
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let pending =
                        wal.append_async(&record(&key, t, &payload)).map_err(|e| e.to_string())?;
                    pending.await.map_err(|e| e.to_string())?;
                    hist.saturating_record(t0.elapsed().as_micros() as u64);
                    n += 1;
                }
                Ok::<Tally, String>((n, hist))
            }));
        }
        tokio::time::sleep(Duration::from_secs_f64(opts.seconds)).await;
        stop.store(true, Ordering::Relaxed);
        let mut parts = Vec::new();
        for h in handles {
            parts.push(h.await.unwrap_or_else(|e| Err(format!("appender task failed: {e}"))));
        }
        parts
    });
    let (total, hist) = merge(parts)?;
    Ok((total, hist, workers))
}
