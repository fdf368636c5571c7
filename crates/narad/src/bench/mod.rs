//! `narad bench ...`: figures about this machine and narad's engines, and
//! the load generator users point at a running server (`produce`,
//! `consume`, `flow`).

mod consume;
mod flow;
mod http;
mod load;
mod produce;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::report::print_figures;

/// What to measure.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Can this disk carry the ingress WAL? Serial fdatasync rate, dsync
    /// bandwidth, and the WAL's group commit under concurrent appenders.
    Disk(DiskArgs),
    /// Durable commits to one partition log (append, fdatasync, read-back)
    /// from concurrent committers, against the serial fdatasync rate of the
    /// same disk; then a sequential read of what was written.
    Log(LogArgs),
    /// Produce load against a running server (-s): msgs/s, MB/s and
    /// latency of durable produces, single (--batch 1) or batch.
    Produce(ProduceArgs),
    /// Consume + ack throughput on a pre-filled topic (--prefill N fills it
    /// first with batch produces).
    Consume(ConsumeArgs),
    /// Producers and consumers together: both rates and produce → consume
    /// latency (each payload carries its produce time).
    Flow(FlowArgs),
}

/// Options of `narad bench produce`.
#[derive(Debug, Args)]
pub struct ProduceArgs {
    #[command(flatten)]
    load: load::LoadArgs,
}

/// Options of `narad bench consume`.
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    #[command(flatten)]
    load: load::LoadArgs,
    /// First produce this many messages (batch produce, --concurrency
    /// clients); without --count or --duration the run then consumes them.
    #[arg(long)]
    prefill: Option<u64>,
    /// Records per request of the prefill.
    #[arg(long, default_value_t = 100)]
    prefill_batch: usize,
    /// Long-poll wait of each consume; an empty answer ends the run (the
    /// topic is drained).
    #[arg(long, value_parser = load::parse_duration, default_value = "1s")]
    wait: Duration,
}

/// Options of `narad bench flow`.
#[derive(Debug, Args)]
pub struct FlowArgs {
    #[command(flatten)]
    load: load::LoadArgs,
    /// Consumers (default: as many as producers, --concurrency).
    #[arg(long)]
    consumers: Option<usize>,
    /// Messages per consume request and batch ack (1 = single consume and
    /// ack).
    #[arg(long, default_value_t = 100)]
    consume_batch: usize,
    /// Long-poll wait of each consume.
    #[arg(long, value_parser = load::parse_duration, default_value = "1s")]
    wait: Duration,
    /// Where the consumers connect (comma-separated, spread in turn;
    /// default: --server). With a cluster, producers on one node and consumers
    /// on the partition's owner measure produce → consumable through a
    /// remote commit.
    #[arg(long)]
    consume_url: Option<String>,
}

/// Options of `narad bench log`.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// A directory on the disk to measure (a scratch subdirectory is used
    /// and removed afterwards).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Concurrent committers.
    #[arg(long, default_value_t = 16)]
    pub committers: usize,
    /// Records per commit.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Payload bytes per record.
    #[arg(long, default_value_t = 1024)]
    pub record_bytes: usize,
    /// Seconds of commit load.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Seconds of the serial fdatasync probe (half before, half after the
    /// commits).
    #[arg(long, default_value_t = 2.0)]
    pub probe_seconds: f64,
    /// Compress frames with zstd at this level (default: no compression).
    #[arg(long)]
    pub zstd_level: Option<i32>,
    /// The log's zero runway in bytes (0 = none, so every commit cycle
    /// appends).
    #[arg(long, default_value_t = narad_log::limits::DEFAULT_RUNWAY_BYTES)]
    pub runway_bytes: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Options of `narad bench disk`.
#[derive(Debug, Args)]
pub struct DiskArgs {
    /// A directory on the disk to measure (a scratch subdirectory is used
    /// and removed afterwards).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Concurrent WAL appenders.
    #[arg(long, default_value_t = 64)]
    pub appenders: usize,
    /// Payload bytes per WAL record.
    #[arg(long, default_value_t = 1024)]
    pub record_bytes: usize,
    /// Seconds of WAL load.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Seconds of each raw-disk probe (fdatasync, dsync).
    #[arg(long, default_value_t = 2.0)]
    pub probe_seconds: f64,
    /// What the appenders are: async tasks on one worker per core, as the
    /// server's produce handlers (tasks), or one OS thread each (threads).
    #[arg(long, value_enum, default_value_t = DiskDriver::Tasks)]
    pub driver: DiskDriver,
    /// Run the WAL with segment preparation, as `storage.ingress_wal_prealloc`
    /// does (off by default, like the server).
    #[arg(long)]
    pub prealloc: bool,
    /// The WAL's zero runway in bytes (0 = none, so every group commit
    /// appends).
    #[arg(long, default_value_t = narad_wal::limits::RUNWAY_BYTES)]
    pub runway_bytes: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `-o` of the disk and log benches (and the older `--json`).
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Output format: a table, or one JSON object (no progress line).
    #[arg(short = 'o', long, value_enum, default_value_t = crate::cli::Output::Table)]
    pub output: crate::cli::Output,
    /// The older name of `-o json`.
    #[arg(long, hide = true)]
    pub json: bool,
}

impl OutputArgs {
    /// Whether the figures are printed as JSON.
    pub fn json(&self) -> bool {
        self.json || self.output == crate::cli::Output::Json
    }
}

/// Runs `measure` with a progress line on stderr (after
/// [`load::PROGRESS_AFTER`], on a terminal, without JSON output) saying
/// what is measured and about how long it takes.
fn with_progress<T>(label: &str, about_secs: f64, json: bool, measure: impl FnOnce() -> T) -> T {
    let bar = load::spinner();
    bar.set_message(format!("{label}: measuring (about {about_secs:.0} s in all)"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ticker = {
        let (bar, stop) = (bar.clone(), stop.clone());
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                load::reveal_when_due(&bar, started, !json);
                bar.tick();
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let out = measure();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = ticker.join();
    bar.finish_and_clear();
    out
}

/// `--driver` of `narad bench disk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DiskDriver {
    /// Async tasks awaiting `append_async`, one runtime worker per core.
    Tasks,
    /// One OS thread per appender, blocked in `append`.
    Threads,
}

fn unsend(e: load::BoxError) -> Box<dyn std::error::Error> {
    e
}

/// Runs a bench subcommand.
pub fn run(cmd: BenchCommand) -> Result<(), Box<dyn std::error::Error>> {
    match cmd {
        BenchCommand::Disk(a) => {
            if a.appenders == 0 || a.seconds <= 0.0 || a.probe_seconds <= 0.0 {
                return Err("--appenders, --seconds and --probe-seconds must be positive".into());
            }
            let about = a.seconds + 2.0 * a.probe_seconds;
            let json = a.output.json();
            let options = narad_wal::bench::DiskBenchOptions {
                dir: a.dir,
                appenders: a.appenders,
                record_bytes: a.record_bytes,
                seconds: a.seconds,
                probe_seconds: a.probe_seconds,
                driver: match a.driver {
                    DiskDriver::Tasks => narad_wal::bench::Driver::Tasks,
                    DiskDriver::Threads => narad_wal::bench::Driver::Threads,
                },
                prealloc: a.prealloc,
                runway_bytes: a.runway_bytes,
            };
            let report =
                with_progress("narad bench disk", about, json, || narad_wal::bench::run(&options))?;
            print_figures("narad bench disk", &report.fields(), json);
            Ok(())
        }
        BenchCommand::Log(a) => {
            let about = a.seconds + a.probe_seconds;
            let json = a.output.json();
            let options = narad_log::bench::BenchOptions {
                dir: a.dir,
                committers: a.committers,
                batch: a.batch,
                record_bytes: a.record_bytes,
                seconds: a.seconds,
                probe_seconds: a.probe_seconds,
                codec: a
                    .zstd_level
                    .map_or(narad_log::Codec::None, |level| narad_log::Codec::Zstd { level }),
                runway_bytes: a.runway_bytes,
                ..narad_log::bench::BenchOptions::default()
            };
            let report =
                with_progress("narad bench log", about, json, || narad_log::bench::run(&options))?;
            print_figures("narad bench log", &report.fields(), json);
            Ok(())
        }
        BenchCommand::Produce(mut a) => {
            a.load.resolve()?;
            let fields = produce::run(&a.load).map_err(unsend)?;
            print_figures("narad bench produce", &fields, a.load.json());
            Ok(())
        }
        BenchCommand::Consume(mut a) => {
            a.load.resolve()?;
            let fields =
                consume::run(&a.load, a.prefill, a.prefill_batch, a.wait).map_err(unsend)?;
            print_figures("narad bench consume", &fields, a.load.json());
            Ok(())
        }
        BenchCommand::Flow(mut a) => {
            a.load.resolve()?;
            let consumers = a.consumers.unwrap_or(a.load.concurrency);
            let fields =
                flow::run(&a.load, a.consume_url.as_deref(), consumers, a.consume_batch, a.wait)
                    .map_err(unsend)?;
            print_figures("narad bench flow", &fields, a.load.json());
            Ok(())
        }
    }
}
