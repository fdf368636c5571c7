//! `narad bench consume`: consume + ack throughput on a pre-filled topic.
//!
//! Each client long-polls `GET .../consume?max=N&wait=W` (or a single
//! consume with `--batch 1`), then acks what it got in one batch ack
//! (`POST .../ack {"receipt_handles":[...]}`, or `?receipt_handle=` for a
//! single message). A message counts once its ack succeeded.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use hyper::Method;

use super::http::{Conn, Target};
use super::load::{
    BoxError, Fields, LoadArgs, Pacer, Progress, Run, Tally, ack_body, cpu_seconds, ensure_topic,
    error_fields, failure, histogram, latency_fields, record, scan_ack_statuses, scan_consume,
    stop_on_ctrl_c, unix_micros,
};
use super::produce::{ProduceCtx, produce_all, produce_fields};

/// Messages per consume request (and per batch ack), at most.
pub const MAX_BATCH: usize = 100;

/// What every consumer of one run shares.
#[derive(Debug)]
pub struct ConsumeCtx {
    /// The nodes; consumer `i` talks to `targets[i % len]`.
    targets: Vec<Target>,
    consume_path: String,
    ack_path: String,
    batch: usize,
    wait_ms: u128,
    rate: Option<f64>,
    clients: usize,
    /// End the run when a long poll comes back empty (the topic is drained).
    stop_when_empty: bool,
}

impl ConsumeCtx {
    /// Consumers of `topic`, `batch` messages a request, long-polling
    /// `wait`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        targets: Vec<Target>,
        topic: &str,
        batch: usize,
        wait: Duration,
        rate: Option<f64>,
        clients: usize,
        stop_when_empty: bool,
    ) -> ConsumeCtx {
        ConsumeCtx {
            consume_path: targets[0].path(&format!("/v1/topics/{topic}/consume")),
            ack_path: targets[0].path(&format!("/v1/topics/{topic}/ack")),
            targets,
            batch,
            wait_ms: wait.as_millis(),
            rate,
            clients,
            stop_when_empty,
        }
    }
}

/// What one consumer counted.
#[derive(Debug)]
pub struct ConsumeTally {
    /// Acked messages, consume-request latency, errors.
    pub t: Tally,
    /// Ack-request latency.
    pub ack_lat: Histogram<u64>,
    /// Produce → consume latency from the stamps in the payloads.
    pub e2e: Histogram<u64>,
    /// Long polls that came back empty.
    pub empty: u64,
    /// Acks retried after a 503 (acked-ahead full).
    pub ack_retries: u64,
}

impl Default for ConsumeTally {
    fn default() -> ConsumeTally {
        ConsumeTally {
            t: Tally::default(),
            ack_lat: histogram(),
            e2e: histogram(),
            empty: 0,
            ack_retries: 0,
        }
    }
}

impl ConsumeTally {
    /// Adds `other` into this one.
    pub fn merge(&mut self, other: ConsumeTally) {
        self.t.merge(other.t);
        self.ack_lat.add(&other.ack_lat).expect("same histogram bounds");
        self.e2e.add(&other.e2e).expect("same histogram bounds");
        self.empty += other.empty;
        self.ack_retries += other.ack_retries;
    }
}

/// One consumer: consume, ack, repeat, until the run ends.
pub async fn consumer(ctx: Arc<ConsumeCtx>, run: Arc<Run>, id: usize) -> ConsumeTally {
    let target = &ctx.targets[id % ctx.targets.len()];
    let mut c = ConsumeTally::default();
    let mut conn = Conn::default();
    let mut pacer = Pacer::new(ctx.rate, ctx.clients, ctx.batch);
    let mut handles = Vec::with_capacity(ctx.batch);
    let mut stamps = Vec::with_capacity(ctx.batch);
    loop {
        let want = run.claim(ctx.batch);
        if want == 0 {
            break;
        }
        pacer.wait().await;
        let path = if ctx.batch > 1 {
            format!("{}?max={want}&wait={}ms", ctx.consume_path, ctx.wait_ms)
        } else {
            format!("{}?wait={}ms", ctx.consume_path, ctx.wait_ms)
        };
        let sent = Instant::now();
        let r = conn.send(target, Method::GET, &path, Bytes::new(), false).await;
        let got_at = Instant::now();
        if let Some(kind) = failure(&r, &[200, 204]) {
            run.refund(want);
            if sent >= run.measure_from {
                c.t.error(kind, &run.live);
            }
            continue;
        }
        let Ok(answer) = r else { unreachable!("failure() passed it") };
        handles.clear();
        stamps.clear();
        if answer.status.as_u16() == 200 {
            scan_consume(&answer.body, &mut handles, &mut stamps);
        }
        run.refund(want.saturating_sub(handles.len()));
        let measured = run.in_window(sent, got_at);
        if measured {
            record(&mut c.t.lat, got_at - sent);
            c.t.wire_bytes += answer.body.len() as u64;
            let now = unix_micros();
            for s in &stamps {
                c.e2e.saturating_record(now.saturating_sub(*s).max(1));
            }
        }
        if handles.is_empty() {
            c.empty += 1;
            if ctx.stop_when_empty {
                run.stop();
                break;
            }
            continue;
        }
        let acked = ack(&ctx, target, &mut conn, &handles, &run, &mut c, measured).await;
        let done = Instant::now();
        if acked > 0 {
            run.live.consumed.fetch_add(acked, Ordering::Relaxed);
        }
        if run.in_window(sent, done) {
            c.t.msgs += acked;
            c.t.requests += 1;
            c.t.last_done = Some(done);
        }
    }
    c
}

/// Acks `handles`; returns how many acks succeeded and counts failures.
///
/// An ack answered 503 (the partition's acked-ahead set is full: its head
/// message is still leased by a slower consumer) keeps its lease, so it is
/// retried, as a client should, after a short pause (at most
/// [`ACK_RETRIES`] times, then it counts as an error and the message is
/// redelivered when its lease expires). Retries are counted, not errors.
async fn ack(
    ctx: &ConsumeCtx,
    target: &Target,
    conn: &mut Conn,
    handles: &[String],
    run: &Run,
    c: &mut ConsumeTally,
    measured: bool,
) -> u64 {
    let mut acked = 0;
    let mut retry: Vec<String> = Vec::new();
    // A retry list is never longer than the first, so a single ack stays
    // single.
    let batch = ctx.batch > 1;
    for attempt in 0..=ACK_RETRIES {
        let todo: &[String] = if attempt == 0 { handles } else { &retry };
        let sent = Instant::now();
        let r = if batch {
            conn.send(target, Method::POST, &ctx.ack_path, ack_body(todo), true).await
        } else {
            let path = format!("{}?receipt_handle={}", ctx.ack_path, todo[0]);
            conn.send(target, Method::POST, &path, Bytes::new(), false).await
        };
        let done = Instant::now();
        // One status per handle: a batch ack's results, or a single ack's
        // own response status.
        let statuses = match r {
            Ok(a) if batch && a.status.as_u16() == 200 => scan_ack_statuses(&a.body),
            Ok(a) if !batch => vec![a.status.as_u16()],
            failed => {
                if measured && let Some(kind) = failure(&failed, &[200]) {
                    c.t.error(format!("ack_{kind}"), &run.live);
                }
                return acked;
            }
        };
        if measured && attempt == 0 {
            record(&mut c.ack_lat, done - sent);
        }
        let mut again = Vec::new();
        for (handle, status) in todo.iter().zip(statuses) {
            match status {
                204 => acked += 1,
                503 if attempt < ACK_RETRIES => again.push(handle.clone()),
                _ if measured => c.t.error(format!("ack_status_{status}"), &run.live),
                _ => {}
            }
        }
        if again.is_empty() {
            return acked;
        }
        c.ack_retries += again.len() as u64;
        retry = again;
        tokio::time::sleep(ACK_RETRY_PAUSE * (attempt + 1)).await;
    }
    acked
}

/// How often an ack answered 503 (acked-ahead full) is retried.
const ACK_RETRIES: u32 = 20;

/// The pause before the first retry; the n-th waits n times as long.
const ACK_RETRY_PAUSE: Duration = Duration::from_millis(2);

/// Runs `clients` consumers to the end of `run` and adds up their tallies.
pub async fn consume_all(
    ctx: Arc<ConsumeCtx>,
    run: Arc<Run>,
    clients: usize,
) -> Result<ConsumeTally, BoxError> {
    let tasks: Vec<_> =
        (0..clients).map(|i| tokio::spawn(consumer(ctx.clone(), run.clone(), i))).collect();
    let mut total = ConsumeTally::default();
    for task in tasks {
        total.merge(task.await?);
    }
    Ok(total)
}

/// Figures of a consume tally: rates, consume/ack latency, errors.
pub fn consume_fields(
    out: &mut Fields,
    prefix: &str,
    c: &ConsumeTally,
    secs: f64,
    message_bytes: usize,
) {
    let secs = secs.max(1e-9);
    out.push((format!("{prefix}msgs_per_sec"), c.t.msgs as f64 / secs));
    out.push((format!("{prefix}mb_per_sec"), c.t.msgs as f64 * message_bytes as f64 / secs / 1e6));
    out.push((format!("{prefix}wire_mb_per_sec"), c.t.wire_bytes as f64 / secs / 1e6));
    out.push((format!("{prefix}messages"), c.t.msgs as f64));
    out.push((format!("{prefix}empty_polls"), c.empty as f64));
    out.push((format!("{prefix}ack_retries"), c.ack_retries as f64));
    latency_fields(out, prefix, &c.t.lat);
    latency_fields(out, &format!("{prefix}ack_"), &c.ack_lat);
    error_fields(out, prefix, &c.t);
}

/// Runs `narad bench consume`.
pub fn run(
    a: &LoadArgs,
    prefill: Option<u64>,
    prefill_batch: usize,
    wait: Duration,
) -> Result<Fields, BoxError> {
    a.validate(MAX_BATCH)?;
    if prefill_batch == 0 || prefill_batch > super::produce::MAX_BATCH {
        return Err(
            format!("--prefill-batch must be between 1 and {}", super::produce::MAX_BATCH).into()
        );
    }
    if wait.is_zero() {
        return Err("--wait must be positive (an empty answer ends the run)".into());
    }
    a.runtime()?.block_on(async {
        let targets = Target::resolve_all(&a.url, a.credentials()).await?;
        ensure_topic(&targets[0], &a.topic, a.partitions).await?;
        let mut out = Fields::new();
        if let Some(n) = prefill {
            let fill_args = LoadArgs { batch: prefill_batch, rate: None, ..a.clone() };
            let ctx = Arc::new(ProduceCtx::new(&fill_args, targets.clone(), false)?);
            let run = Arc::new(Run::new(Some(n), None, Duration::ZERO));
            let progress = Progress::start("prefill", run.clone(), !a.json());
            let tally = produce_all(ctx, run.clone(), a.concurrency).await;
            progress.finish();
            let tally = tally?;
            let secs = run.elapsed(tally.last_done);
            produce_fields(&mut out, "prefill_", &tally, secs, a.message_bytes);
            if tally.error_total() > 0 {
                eprintln!("narad bench consume: {} prefill requests failed", tally.error_total());
            }
        }
        // A run with neither --count nor --duration consumes what the
        // prefill put in; an empty long poll ends any run (drained).
        let count = a.count.or(if a.duration.is_none() { prefill } else { None });
        let run = Arc::new(Run::new(count, a.duration, a.warmup));
        let ctx = Arc::new(ConsumeCtx::new(
            targets,
            &a.topic,
            a.batch,
            wait,
            a.rate,
            a.concurrency,
            true,
        ));
        let ctrl_c = stop_on_ctrl_c(vec![run.clone()]);
        let progress = Progress::start("consume", run.clone(), !a.json());
        let cpu0 = cpu_seconds();
        let tally = consume_all(ctx, run.clone(), a.concurrency).await;
        let cpu = cpu_seconds() - cpu0;
        progress.finish();
        ctrl_c.abort();
        let tally = tally?;
        let secs = run.elapsed(tally.t.last_done);
        let mut fields = Fields::new();
        consume_fields(&mut fields, "", &tally, secs, a.message_bytes);
        fields.push(("drained".into(), f64::from(u8::from(tally.empty > 0))));
        fields.push(("seconds".into(), secs));
        fields.push(("concurrency".into(), a.concurrency as f64));
        fields.push(("batch".into(), a.batch as f64));
        fields.push(("message_bytes".into(), a.message_bytes as f64));
        fields.push(("client_cpu_pct".into(), 100.0 * cpu / run.start.elapsed().as_secs_f64()));
        fields.extend(out);
        Ok(fields)
    })
}
