//! `narad bench produce`: produce throughput and latency (each request
//! answered 202 once durable), single (`--batch 1`) or batch.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use hyper::Method;

use super::http::{Conn, Target};
use super::load::{
    BoxError, Fields, Keys, LoadArgs, Pacer, Payloads, Progress, Rng, Run, Tally, cpu_seconds,
    ensure_topic, error_fields, failure, latency_fields, next_key, record, stop_on_ctrl_c,
};

/// Records per batch produce request, at most.
pub const MAX_BATCH: usize = 1000;

/// What every producer of one run shares.
#[derive(Debug)]
pub struct ProduceCtx {
    /// The nodes; producer `i` talks to `targets[i % len]`.
    targets: Vec<Target>,
    single_path: String,
    batch_path: String,
    batch: usize,
    keys: Keys,
    partition: Option<u32>,
    payloads: Payloads,
    rate: Option<f64>,
    clients: usize,
}

impl ProduceCtx {
    /// Producers of `a`'s shape; `stamp` puts the produce time into every
    /// payload (for `flow`).
    pub fn new(a: &LoadArgs, targets: Vec<Target>, stamp: bool) -> Result<ProduceCtx, String> {
        let first = targets.first().ok_or("no target")?;
        Ok(ProduceCtx {
            single_path: first.path(&match a.partition {
                Some(p) => format!("/v1/topics/{}/produce?partition={p}", a.topic),
                None => format!("/v1/topics/{}/produce", a.topic),
            }),
            batch_path: first.path(&format!("/v1/topics/{}/produce/batch", a.topic)),
            targets,
            batch: a.batch,
            keys: a.keys,
            partition: a.partition,
            payloads: Payloads::new(a.message_bytes, stamp)?,
            rate: a.rate,
            clients: a.concurrency,
        })
    }
}

/// One producer: requests one after another on its own connection until
/// the run ends.
pub async fn producer(ctx: Arc<ProduceCtx>, run: Arc<Run>, id: usize) -> Tally {
    let mut t = Tally::default();
    let mut conn = Conn::default();
    let mut rng = Rng::new(id as u64 + 1);
    let mut pacer = Pacer::new(ctx.rate, ctx.clients, ctx.batch);
    let target = &ctx.targets[id % ctx.targets.len()];
    loop {
        let n = run.claim(ctx.batch);
        if n == 0 {
            break;
        }
        pacer.wait().await;
        let (path, body) = if ctx.batch == 1 {
            let path = match next_key(ctx.keys, &mut rng) {
                Some(k) if ctx.partition.is_some() => {
                    Cow::Owned(format!("{}&key=k{k}", ctx.single_path))
                }
                Some(k) => Cow::Owned(format!("{}?key=k{k}", ctx.single_path)),
                None => Cow::Borrowed(ctx.single_path.as_str()),
            };
            (path, ctx.payloads.single())
        } else {
            (
                Cow::Borrowed(ctx.batch_path.as_str()),
                ctx.payloads.batch(n, ctx.keys, ctx.partition, &mut rng),
            )
        };
        let sent = Instant::now();
        let r = conn.send(target, Method::POST, &path, body, ctx.batch > 1).await;
        let done = Instant::now();
        match failure(&r, &[202]) {
            None => {
                run.live.produced.fetch_add(n as u64, Ordering::Relaxed);
                if run.in_window(sent, done) {
                    t.msgs += n as u64;
                    t.requests += 1;
                    t.wire_bytes += r.map_or(0, |a| a.body.len() as u64);
                    record(&mut t.lat, done - sent);
                    t.last_done = Some(done);
                }
            }
            Some(kind) => {
                if sent >= run.measure_from {
                    t.error(kind, &run.live);
                }
            }
        }
    }
    t
}

/// Runs `clients` producers to the end of `run` and adds up their tallies.
pub async fn produce_all(
    ctx: Arc<ProduceCtx>,
    run: Arc<Run>,
    clients: usize,
) -> Result<Tally, BoxError> {
    let tasks: Vec<_> =
        (0..clients).map(|i| tokio::spawn(producer(ctx.clone(), run.clone(), i))).collect();
    let mut total = Tally::default();
    for task in tasks {
        total.merge(task.await?);
    }
    Ok(total)
}

/// Figures of a produce tally: rates, latency, errors.
pub fn produce_fields(out: &mut Fields, prefix: &str, t: &Tally, secs: f64, message_bytes: usize) {
    let secs = secs.max(1e-9);
    out.push((format!("{prefix}msgs_per_sec"), t.msgs as f64 / secs));
    out.push((format!("{prefix}mb_per_sec"), t.msgs as f64 * message_bytes as f64 / secs / 1e6));
    out.push((format!("{prefix}requests_per_sec"), t.requests as f64 / secs));
    out.push((format!("{prefix}messages"), t.msgs as f64));
    out.push((format!("{prefix}requests"), t.requests as f64));
    latency_fields(out, prefix, &t.lat);
    error_fields(out, prefix, t);
}

/// Runs `narad bench produce`.
pub fn run(a: &LoadArgs) -> Result<Fields, BoxError> {
    a.validate(MAX_BATCH)?;
    a.runtime()?.block_on(async {
        let targets = Target::resolve_all(&a.url, a.credentials()).await?;
        ensure_topic(&targets[0], &a.topic, a.partitions).await?;
        let ctx = Arc::new(ProduceCtx::new(a, targets, false)?);
        let run = Arc::new(Run::new(a.count, a.duration, a.warmup));
        let ctrl_c = stop_on_ctrl_c(vec![run.clone()]);
        let progress = Progress::start("produce", run.clone(), !a.json());
        let cpu0 = cpu_seconds();
        let tally = produce_all(ctx, run.clone(), a.concurrency).await;
        let cpu = cpu_seconds() - cpu0;
        progress.finish();
        ctrl_c.abort();
        let tally = tally?;
        let secs = run.elapsed(tally.last_done);
        let mut out = Fields::new();
        produce_fields(&mut out, "", &tally, secs, a.message_bytes);
        out.push(("seconds".into(), secs));
        out.push(("concurrency".into(), a.concurrency as f64));
        out.push(("batch".into(), a.batch as f64));
        out.push(("message_bytes".into(), a.message_bytes as f64));
        out.push(("client_cpu_pct".into(), 100.0 * cpu / run.start.elapsed().as_secs_f64()));
        Ok(out)
    })
}
