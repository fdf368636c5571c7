//! What `narad bench produce|consume|flow` share: options, the run window,
//! rate pacing, keys, payloads, the wire scanners, tallies, live progress
//! and the figures printed at the end.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};

use super::http::{Answer, Target};

/// How messages are keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Keys {
    /// No key: the server spreads keyless records over the partitions.
    None,
    /// A key drawn uniformly from 100,000 (`k0` .. `k99999`).
    Uniform,
    /// Skewed: 9 in 10 messages carry the one hot key `k0` (so one
    /// partition takes most of the load), the rest are uniform.
    Hot,
}

/// Options shared by `narad bench produce|consume|flow`.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// The server, plain HTTP (URL or host:port); several, comma-separated,
    /// spread the clients over the nodes of a cluster in turn [default:
    /// the context's, else http://127.0.0.1:7942; `--url` and `NARAD_URL`
    /// are older names].
    #[arg(
        short = 's',
        long = "server",
        alias = "url",
        env = "NARAD_ADDR",
        value_name = "URL[,URL...]"
    )]
    pub server: Option<String>,
    /// Where the load goes: `--server`, else `NARAD_URL`, else the
    /// context's, else the default (set by [`LoadArgs::resolve`]).
    #[arg(skip)]
    pub url: String,
    /// The topic; created with --partitions if it does not exist.
    #[arg(long, default_value = "narad-bench")]
    pub topic: String,
    /// Partitions of the topic when this run creates it (the server's
    /// default).
    #[arg(long, default_value_t = 3)]
    pub partitions: u32,
    /// Concurrent clients (one HTTP/1.1 connection each); in `flow`, the
    /// producers.
    #[arg(long, short = 'c', default_value_t = 16)]
    pub concurrency: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1024)]
    pub message_bytes: usize,
    /// Records per request: 1 = single produce / single consume; more =
    /// `produce/batch` (≤ 1,000) or `consume?max=` with a batch ack (≤ 100).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// How long to measure (`10s`, `1m`, or seconds); default 10 s unless
    /// --count is given.
    #[arg(long, value_parser = parse_duration, conflicts_with = "count")]
    pub duration: Option<Duration>,
    /// Stop after this many messages instead of after a duration.
    #[arg(long)]
    pub count: Option<u64>,
    /// Unmeasured load before the --duration window (connections warm up).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub warmup: Duration,
    /// Cap on messages per second over all clients.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Message keys.
    #[arg(long, value_enum, default_value_t = Keys::None)]
    pub keys: Keys,
    /// Produce every message to this partition (`?partition=` on single
    /// produce, `"partition"` on each batch record) instead of by key or
    /// spread by the server: with a cluster, all commits local (clients on
    /// its owner) or all remote (clients on another node).
    #[arg(long)]
    pub partition: Option<u32>,
    /// User for HTTP Basic authentication.
    #[arg(short = 'u', long, env = "NARAD_USER")]
    pub user: Option<String>,
    /// Password for HTTP Basic authentication.
    #[arg(short = 'p', long, env = "NARAD_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// Use this context instead of the selected one (`narad ctx`).
    #[arg(long, env = "NARAD_CONTEXT")]
    pub context: Option<String>,
    /// Threads of the load generator (it shares the machine with what it
    /// measures when both run on one host).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Output format: a table, or one JSON object (no progress line).
    #[arg(short = 'o', long, value_enum, default_value_t = crate::cli::Output::Table)]
    pub output: crate::cli::Output,
    /// The older name of `-o json`.
    #[arg(long, hide = true)]
    pub json: bool,
}

/// Parses `10s`, `1m30s`, `250ms` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<f64>() {
        return if secs.is_finite() && secs >= 0.0 {
            Ok(Duration::from_secs_f64(secs))
        } else {
            Err(format!("invalid duration {s:?}"))
        };
    }
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// The boxed error of the load generator.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl LoadArgs {
    /// Checks the options that clap cannot.
    pub fn validate(&self, max_batch: usize) -> Result<(), String> {
        if self.concurrency == 0 {
            return Err("--concurrency must be at least 1".into());
        }
        if self.threads == 0 {
            return Err("--threads must be at least 1".into());
        }
        if self.batch == 0 || self.batch > max_batch {
            return Err(format!("--batch must be between 1 and {max_batch}"));
        }
        if self.message_bytes < 2 {
            return Err("--message-bytes must be at least 2".into());
        }
        if let Some(r) = self.rate
            && !(r.is_finite() && r > 0.0)
        {
            return Err("--rate must be a positive number of messages per second".into());
        }
        if let Some(p) = self.partition
            && p >= self.partitions
        {
            return Err(format!("--partition must be below --partitions ({})", self.partitions));
        }
        if self.count == Some(0) {
            return Err("--count must be positive".into());
        }
        if self.duration == Some(Duration::ZERO) {
            return Err("--duration must be positive".into());
        }
        let valid_name = !self.topic.is_empty()
            && self.topic.len() <= 255
            && self.topic != "."
            && self.topic != ".."
            && self.topic.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !valid_name {
            return Err(format!("--topic {:?}: use 1-255 of A-Z a-z 0-9 . _ -", self.topic));
        }
        if self.user.is_some() != self.password.is_some() {
            return Err("--user and --password go together".into());
        }
        Ok(())
    }

    /// Fills [`LoadArgs::url`] and the credentials as every client command
    /// does: flags, then the environment (`NARAD_ADDR`, then the older
    /// `NARAD_URL`), then the context, then the default server.
    pub fn resolve(&mut self) -> Result<(), String> {
        let mut conn = crate::cli::Conn::for_bench(
            self.server.clone().or_else(|| std::env::var("NARAD_URL").ok()),
            self.user.clone(),
            self.password.clone(),
            self.context.clone(),
        );
        crate::cli::ctx::fill_from_context(&mut conn).map_err(|e| e.to_string())?;
        let server = conn.server.unwrap_or_else(|| crate::cli::DEFAULT_SERVER.to_owned());
        self.url = server
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| if s.contains("://") { s.to_owned() } else { format!("http://{s}") })
            .collect::<Vec<_>>()
            .join(",");
        self.user = conn.user;
        self.password = conn.password;
        Ok(())
    }

    /// Whether the figures are printed as JSON.
    pub fn json(&self) -> bool {
        self.json || self.output == crate::cli::Output::Json
    }

    /// The credentials, when given.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        self.user.as_deref().zip(self.password.as_deref())
    }

    /// The tokio runtime of the load generator.
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.threads)
            .enable_all()
            .build()
    }
}

/// Creates `topic` with `partitions` unless it exists (409). Any 2xx counts
/// as success, so the bare HTTP ceiling server passes too.
pub async fn ensure_topic(target: &Target, topic: &str, partitions: u32) -> Result<(), BoxError> {
    let body = format!("{{\"name\":\"{topic}\",\"partitions\":{partitions}}}");
    let mut conn = super::http::Conn::default();
    let a = conn
        .send(target, hyper::Method::POST, &target.path("/v1/topics"), Bytes::from(body), true)
        .await
        .map_err(|e| format!("cannot reach {}: {e}", target.addr))?;
    if a.status.is_success() || a.status.as_u16() == 409 {
        return Ok(());
    }
    Err(format!(
        "create topic {topic}: {} {}",
        a.status.as_u16(),
        String::from_utf8_lossy(&a.body).trim()
    )
    .into())
}

/// A small, fast PRNG (SplitMix64): keys need spread, not secrecy.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for worker `n`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Keys drawn uniformly from this many.
pub const KEY_SPACE: u64 = 100_000;

/// The key of the next message, if any.
pub fn next_key(keys: Keys, rng: &mut Rng) -> Option<u64> {
    match keys {
        Keys::None => None,
        Keys::Uniform => Some(rng.below(KEY_SPACE)),
        Keys::Hot => Some(if rng.below(10) < 9 { 0 } else { rng.below(KEY_SPACE) }),
    }
}

/// The marker that carries a produce timestamp in a payload:
/// `nbts=` + 16 digits of Unix microseconds + `;`.
pub const STAMP_PREFIX: &[u8] = b"nbts=";
/// Length of a whole stamp.
pub const STAMP_LEN: usize = STAMP_PREFIX.len() + 16 + 1;

/// Unix time in microseconds.
pub fn unix_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

fn write_stamp(out: &mut Vec<u8>, micros: u64) {
    out.extend_from_slice(STAMP_PREFIX);
    out.extend_from_slice(format!("{micros:016}").as_bytes());
    out.push(b';');
}

/// Builds request bodies of `message_bytes`-byte payloads (ASCII, so the
/// server stores a single produce as is and answers it as a JSON string).
#[derive(Debug, Clone)]
pub struct Payloads {
    bytes: usize,
    stamp: bool,
    filler: Bytes,
}

impl Payloads {
    /// Payloads of `bytes` bytes; with `stamp`, each starts with the produce
    /// time (needs `bytes >= STAMP_LEN + 2`).
    pub fn new(bytes: usize, stamp: bool) -> Result<Payloads, String> {
        if stamp && bytes < STAMP_LEN + 2 {
            return Err(format!("--message-bytes must be at least {} here", STAMP_LEN + 2));
        }
        Ok(Payloads { bytes, stamp, filler: Bytes::from(vec![b'x'; bytes]) })
    }

    /// The body of a single produce.
    pub fn single(&self) -> Bytes {
        if !self.stamp {
            return self.filler.clone();
        }
        let mut out = Vec::with_capacity(self.bytes);
        write_stamp(&mut out, unix_micros());
        out.resize(self.bytes, b'x');
        Bytes::from(out)
    }

    /// The body of a batch produce of `n` records:
    /// `{"messages":[{"key":"k1","payload":"..."},...]}`. The payload is a
    /// JSON string of `bytes - 2` characters, which the server stores as
    /// written: `bytes` bytes with its quotes.
    pub fn batch(&self, n: usize, keys: Keys, partition: Option<u32>, rng: &mut Rng) -> Bytes {
        let mut out = Vec::with_capacity(16 + n * (self.bytes + 32));
        out.extend_from_slice(b"{\"messages\":[");
        let micros = if self.stamp { unix_micros() } else { 0 };
        for i in 0..n {
            if i > 0 {
                out.push(b',');
            }
            out.push(b'{');
            if let Some(p) = partition {
                out.extend_from_slice(format!("\"partition\":{p},").as_bytes());
            }
            if let Some(k) = next_key(keys, rng) {
                out.extend_from_slice(format!("\"key\":\"k{k}\",").as_bytes());
            }
            out.extend_from_slice(b"\"payload\":\"");
            let start = out.len();
            if self.stamp {
                write_stamp(&mut out, micros);
            }
            out.resize(start + self.bytes - 2, b'x');
            out.extend_from_slice(b"\"}");
        }
        out.extend_from_slice(b"]}");
        Bytes::from(out)
    }
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let first = needle[0];
    let mut i = from;
    while i + needle.len() <= hay.len() {
        let j = i + hay[i..=hay.len() - needle.len()].iter().position(|&b| b == first)?;
        if &hay[j..j + needle.len()] == needle {
            return Some(j);
        }
        i = j + 1;
    }
    None
}

/// Receipt handles and produce stamps found in a consume answer (one
/// message object or `{"messages":[...]}`), without a JSON parse: handles
/// are `partition:offset:nonce`, digits and colons only.
pub fn scan_consume(body: &[u8], handles: &mut Vec<String>, stamps: &mut Vec<u64>) {
    const H: &[u8] = b"\"receipt_handle\":\"";
    let mut at = 0;
    while let Some(i) = find(body, H, at) {
        let s = i + H.len();
        let Some(len) = body[s..].iter().position(|&b| b == b'"') else { break };
        handles.push(String::from_utf8_lossy(&body[s..s + len]).into_owned());
        at = s + len;
    }
    let mut at = 0;
    while let Some(i) = find(body, STAMP_PREFIX, at) {
        let s = i + STAMP_PREFIX.len();
        at = s;
        let Some(digits) = body.get(s..s + 16) else { break };
        if digits.iter().all(u8::is_ascii_digit) && body.get(s + 16) == Some(&b';') {
            stamps.push(digits.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')));
        }
    }
}

/// The body of a batch ack.
pub fn ack_body(handles: &[String]) -> Bytes {
    let mut out = String::with_capacity(24 + handles.len() * 16);
    out.push_str("{\"receipt_handles\":[");
    for (i, h) in handles.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('"');
        out.push_str(h);
        out.push('"');
    }
    out.push_str("]}");
    Bytes::from(out)
}

/// The per-handle statuses of a batch ack answer
/// (`{"results":[{"status":204},{"status":410,"error":"..."}]}`).
pub fn scan_ack_statuses(body: &[u8]) -> Vec<u16> {
    const S: &[u8] = b"\"status\":";
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = find(body, S, at) {
        let s = i + S.len();
        let n = body[s..].iter().take_while(|b| b.is_ascii_digit()).count();
        if let Ok(code) = std::str::from_utf8(&body[s..s + n]).unwrap_or("").parse() {
            out.push(code);
        }
        at = s + n;
    }
    out
}

/// Spaces requests so that all clients together send at most `rate`
/// messages per second; behind schedule, it does not burst to catch up.
#[derive(Debug)]
pub struct Pacer {
    interval: Option<Duration>,
    next: Instant,
}

impl Pacer {
    /// A pacer for one of `clients` clients sending `per_request` messages a
    /// request.
    pub fn new(rate: Option<f64>, clients: usize, per_request: usize) -> Pacer {
        let interval =
            rate.map(|r| Duration::from_secs_f64(per_request as f64 * clients as f64 / r));
        Pacer { interval, next: Instant::now() }
    }

    /// Waits for the next slot.
    pub async fn wait(&mut self) {
        let Some(iv) = self.interval else { return };
        let now = Instant::now();
        if self.next > now {
            tokio::time::sleep_until(self.next.into()).await;
        } else {
            self.next = now;
        }
        self.next += iv;
    }
}

/// Live counters for the progress line.
#[derive(Debug, Default)]
pub struct Live {
    /// Messages produced (202).
    pub produced: AtomicU64,
    /// Messages consumed and acked.
    pub consumed: AtomicU64,
    /// Failed requests.
    pub errors: AtomicU64,
}

/// The window of one run: when measuring starts and stops, and the shared
/// message budget of a --count run.
#[derive(Debug)]
pub struct Run {
    /// When load started.
    pub start: Instant,
    /// When measuring starts (after the warm-up).
    pub measure_from: Instant,
    /// The end of a --duration run.
    pub end: Option<Instant>,
    remaining: AtomicI64,
    stopped: AtomicBool,
    stopped_at: OnceLock<Instant>,
    /// Live counters (shared by the runs of one `flow`).
    pub live: Arc<Live>,
}

impl Run {
    /// A run of `count` messages, or of `duration` after `warmup`.
    pub fn new(count: Option<u64>, duration: Option<Duration>, warmup: Duration) -> Run {
        let start = Instant::now();
        let (measure_from, end, remaining) = match count {
            Some(n) => (start, None, i64::try_from(n).unwrap_or(i64::MAX)),
            None => {
                let from = start + warmup;
                (from, Some(from + duration.unwrap_or(Duration::from_secs(10))), i64::MAX)
            }
        };
        Run {
            start,
            measure_from,
            end,
            remaining: AtomicI64::new(remaining),
            stopped: AtomicBool::new(false),
            stopped_at: OnceLock::new(),
            live: Arc::new(Live::default()),
        }
    }

    /// A run over the same window and live counters with a budget of its
    /// own (`flow`: producers and consumers each count to --count).
    pub fn sibling(&self, count: Option<u64>) -> Run {
        Run {
            start: self.start,
            measure_from: self.measure_from,
            end: self.end,
            remaining: AtomicI64::new(
                count.map_or(i64::MAX, |n| i64::try_from(n).unwrap_or(i64::MAX)),
            ),
            stopped: AtomicBool::new(false),
            stopped_at: OnceLock::new(),
            live: self.live.clone(),
        }
    }

    /// Up to `want` messages this client may send or take next; 0 = stop.
    pub fn claim(&self, want: usize) -> usize {
        if self.stopped.load(Ordering::Relaxed) {
            return 0;
        }
        if let Some(end) = self.end {
            return if Instant::now() >= end { 0 } else { want };
        }
        let mut prev = self.remaining.load(Ordering::Relaxed);
        loop {
            if prev <= 0 {
                return 0;
            }
            let take = want.min(usize::try_from(prev).unwrap_or(usize::MAX));
            match self.remaining.compare_exchange_weak(
                prev,
                prev - take as i64,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return take,
                Err(now) => prev = now,
            }
        }
    }

    /// Gives back messages claimed but not taken (a short consume).
    pub fn refund(&self, n: usize) {
        if self.end.is_none() && n > 0 {
            self.remaining.fetch_add(n as i64, Ordering::Relaxed);
        }
    }

    /// Ends the run early (the topic is drained, or Ctrl-C).
    pub fn stop(&self) {
        let _ = self.stopped_at.set(Instant::now());
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// Whether the run was ended early.
    pub fn stopped_early(&self) -> bool {
        self.stopped_at.get().is_some()
    }

    /// Whether a request sent at `sent` and answered at `done` is measured.
    pub fn in_window(&self, sent: Instant, done: Instant) -> bool {
        sent >= self.measure_from && self.end.is_none_or(|end| done <= end)
    }

    /// Seconds measured, given the last measured completion.
    pub fn elapsed(&self, last_done: Option<Instant>) -> f64 {
        let last = last_done.unwrap_or(self.measure_from);
        let until = match self.end {
            Some(end) if !self.stopped_early() => end,
            _ => last,
        };
        until.saturating_duration_since(self.measure_from).as_secs_f64()
    }
}

/// A latency histogram in microseconds, 1 µs to 10 min.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// Records `d` in `h` (clamped to the histogram's range).
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record((d.as_micros() as u64).max(1));
}

/// What one client counted.
#[derive(Debug)]
pub struct Tally {
    /// Messages that succeeded in the window.
    pub msgs: u64,
    /// Requests that succeeded in the window.
    pub requests: u64,
    /// Response body bytes read in the window.
    pub wire_bytes: u64,
    /// Latency of successful requests.
    pub lat: Histogram<u64>,
    /// Failures by kind (`status_503`, `io`, `ack_410`).
    pub errors: BTreeMap<String, u64>,
    /// The last measured completion.
    pub last_done: Option<Instant>,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            msgs: 0,
            requests: 0,
            wire_bytes: 0,
            lat: histogram(),
            errors: BTreeMap::new(),
            last_done: None,
        }
    }
}

impl Tally {
    /// Adds `other` into this one.
    pub fn merge(&mut self, other: Tally) {
        self.msgs += other.msgs;
        self.requests += other.requests;
        self.wire_bytes += other.wire_bytes;
        self.lat.add(&other.lat).expect("same histogram bounds");
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        self.last_done = self.last_done.max(other.last_done);
    }

    /// Counts a failure of kind `kind`.
    pub fn error(&mut self, kind: String, live: &Live) {
        *self.errors.entry(kind).or_default() += 1;
        live.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Sum of all failures.
    pub fn error_total(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// The error kind of a request's outcome (`None` = it succeeded).
pub fn failure(result: &Result<Answer, BoxError>, ok: &[u16]) -> Option<String> {
    match result {
        Ok(a) if ok.contains(&a.status.as_u16()) => None,
        Ok(a) => Some(format!("status_{}", a.status.as_u16())),
        Err(_) => Some("io".to_owned()),
    }
}

/// Figures: name and value.
pub type Fields = Vec<(String, f64)>;

/// `{prefix}p50_ms` .. `{prefix}max_ms` of `h`.
pub fn latency_fields(out: &mut Fields, prefix: &str, h: &Histogram<u64>) {
    let ms = |us: u64| us as f64 / 1000.0;
    if h.is_empty() {
        return;
    }
    for (name, q) in [("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p999", 0.999)] {
        out.push((format!("{prefix}{name}_ms"), ms(h.value_at_quantile(q))));
    }
    out.push((format!("{prefix}max_ms"), ms(h.max())));
}

/// `errors` and `errors_{kind}` of `t`.
pub fn error_fields(out: &mut Fields, prefix: &str, t: &Tally) {
    out.push((format!("{prefix}errors"), t.error_total() as f64));
    for (k, v) in &t.errors {
        out.push((format!("{prefix}errors_{k}"), *v as f64));
    }
}

/// CPU seconds (user + system) this process has used so far.
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the line, in clock ticks (100 per second on
    // Linux).
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { return 0.0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// The live progress line on stderr: shown once a run has lasted
/// [`PROGRESS_AFTER`], only when stderr is a terminal and the figures are
/// not printed as JSON.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

/// How long a run goes before its progress line appears (a short run
/// prints its figures only).
pub const PROGRESS_AFTER: Duration = Duration::from_secs(2);

/// A spinner on stderr, hidden until [`PROGRESS_AFTER`] (see
/// [`reveal_when_due`]).
pub fn spinner() -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar
}

/// Shows `bar` on stderr once `started` is [`PROGRESS_AFTER`] ago, when
/// `shown` (stderr a terminal, no JSON output); indicatif draws nothing
/// when stderr is no terminal.
pub fn reveal_when_due(bar: &ProgressBar, started: Instant, shown: bool) {
    if shown && bar.is_hidden() && started.elapsed() >= PROGRESS_AFTER {
        bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    }
}

impl Progress {
    /// Starts ticking every half second: current rates and errors; `shown`
    /// false (JSON output) keeps it hidden.
    pub fn start(label: &'static str, run: Arc<Run>, shown: bool) -> Progress {
        let bar = spinner();
        let b = bar.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            let started = Instant::now();
            let mut last = (Instant::now(), 0u64, 0u64);
            loop {
                tick.tick().await;
                reveal_when_due(&b, started, shown);
                let now = Instant::now();
                let p = run.live.produced.load(Ordering::Relaxed);
                let c = run.live.consumed.load(Ordering::Relaxed);
                let e = run.live.errors.load(Ordering::Relaxed);
                let dt = now.duration_since(last.0).as_secs_f64().max(1e-3);
                let phase = if now < run.measure_from { " (warm-up)" } else { "" };
                let mut msg = format!("{label}{phase}:");
                if p > 0 || c == 0 {
                    msg.push_str(&format!(
                        " produce {:.0} msgs/s ({p} total)",
                        (p - last.1) as f64 / dt
                    ));
                }
                if c > 0 {
                    msg.push_str(&format!(
                        " consume {:.0} msgs/s ({c} total)",
                        (c - last.2) as f64 / dt
                    ));
                }
                msg.push_str(&format!(", errors {e}"));
                b.set_message(msg);
                b.tick();
                last = (now, p, c);
            }
        });
        Progress { bar, task }
    }

    /// Stops and clears the line.
    pub fn finish(self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}

/// Stops `run` early on Ctrl-C, so what was measured is still printed.
pub fn stop_on_ctrl_c(runs: Vec<Arc<Run>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            for run in runs {
                run.stop();
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_units_and_bare_seconds() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("ten").is_err());
    }

    #[test]
    fn batch_bodies_are_json_with_payloads_of_the_requested_size() {
        let mut rng = Rng::new(1);
        for stamp in [false, true] {
            let p = Payloads::new(100, stamp).unwrap();
            let body = p.batch(3, Keys::Uniform, Some(4), &mut rng);
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let msgs = v["messages"].as_array().unwrap();
            assert_eq!(msgs.len(), 3);
            for m in msgs {
                // Stored as written: the JSON text with its quotes.
                assert_eq!(m["payload"].to_string().len(), 100);
                assert!(m["key"].as_str().unwrap().starts_with('k'));
                assert_eq!(m["partition"], 4);
            }
            assert_eq!(p.single().len(), 100);
        }
        let v: serde_json::Value = serde_json::from_slice(&Payloads::new(2, false).unwrap().batch(
            1,
            Keys::None,
            None,
            &mut rng,
        ))
        .unwrap();
        assert_eq!(v["messages"][0], serde_json::json!({"payload": ""}));
        assert!(Payloads::new(STAMP_LEN + 1, true).is_err());
    }

    #[test]
    fn consume_answers_yield_handles_and_stamps() {
        let p = Payloads::new(64, true).unwrap();
        let single = p.single();
        let stamp_text = String::from_utf8(single[..STAMP_LEN].to_vec()).unwrap();
        let body = format!(
            "{{\"messages\":[{{\"topic\":\"t\",\"partition\":0,\"offset\":1,\"payload\":\"{}\",\"timestamp\":1,\"receipt_handle\":\"0:1:7\"}},{{\"topic\":\"t\",\"partition\":2,\"offset\":9,\"payload\":{{\"a\":\"nbts=12\"}},\"timestamp\":1,\"receipt_handle\":\"2:9:8\"}}]}}",
            String::from_utf8_lossy(&single)
        );
        let (mut h, mut s) = (Vec::new(), Vec::new());
        scan_consume(body.as_bytes(), &mut h, &mut s);
        assert_eq!(h, ["0:1:7", "2:9:8"]);
        assert_eq!(s.len(), 1, "a short nbts= without 16 digits is no stamp");
        assert_eq!(format!("nbts={:016};", s[0]), stamp_text);
        let ack = ack_body(&h);
        let v: serde_json::Value = serde_json::from_slice(&ack).unwrap();
        assert_eq!(v, serde_json::json!({"receipt_handles": ["0:1:7", "2:9:8"]}));
        assert_eq!(
            scan_ack_statuses(
                br#"{"results":[{"status":204},{"status":410,"error":"gone \"status\":x"}]}"#
            ),
            [204, 410]
        );
    }

    #[test]
    fn keys_follow_their_distribution() {
        let mut rng = Rng::new(7);
        assert_eq!(next_key(Keys::None, &mut rng), None);
        let hot = (0..10_000).filter(|_| next_key(Keys::Hot, &mut rng) == Some(0)).count();
        assert!((8_500..=9_500).contains(&hot), "hot key share {hot}");
        let uniform: Vec<u64> =
            (0..10_000).filter_map(|_| next_key(Keys::Uniform, &mut rng)).collect();
        assert!(uniform.iter().all(|k| *k < KEY_SPACE));
        assert!(uniform.iter().filter(|k| **k == 0).count() < 5);
    }

    #[test]
    fn a_count_run_hands_out_exactly_its_budget() {
        let run = Run::new(Some(250), None, Duration::ZERO);
        let mut got = 0;
        loop {
            let n = run.claim(100);
            if n == 0 {
                break;
            }
            got += n;
        }
        assert_eq!(got, 250);
        run.refund(30);
        assert_eq!(run.claim(100), 30);
        assert_eq!(run.claim(1), 0);
        run.stop();
        assert!(run.stopped_early());
    }
}
