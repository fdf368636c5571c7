//! `narad bench flow`: producers and consumers together. Every payload
//! carries its produce time (`nbts=<unix µs>;`), so besides both rates the
//! run reports produce → consume latency: from just before the produce
//! request is built to the consume answer that delivered the message.

use std::sync::Arc;
use std::time::Duration;

use super::consume::{ConsumeCtx, consume_all, consume_fields};
use super::http::Target;
use super::load::{
    BoxError, Fields, LoadArgs, Progress, Run, cpu_seconds, ensure_topic, latency_fields,
    stop_on_ctrl_c,
};
use super::produce::{self, ProduceCtx, produce_all, produce_fields};

/// Runs `narad bench flow`.
pub fn run(
    a: &LoadArgs,
    consume_url: Option<&str>,
    consumers: usize,
    consume_batch: usize,
    wait: Duration,
) -> Result<Fields, BoxError> {
    a.validate(produce::MAX_BATCH)?;
    if consumers == 0 {
        return Err("--consumers must be at least 1".into());
    }
    if consume_batch == 0 || consume_batch > super::consume::MAX_BATCH {
        return Err(
            format!("--consume-batch must be between 1 and {}", super::consume::MAX_BATCH).into()
        );
    }
    a.runtime()?.block_on(async {
        let targets = Target::resolve_all(&a.url, a.credentials()).await?;
        ensure_topic(&targets[0], &a.topic, a.partitions).await?;
        let consume_targets = match consume_url {
            Some(url) => Target::resolve_all(url, a.credentials()).await?,
            None => targets.clone(),
        };
        let pctx = Arc::new(ProduceCtx::new(a, targets, true)?);
        // The --rate cap applies to the producers; consumers take what comes.
        let cctx = Arc::new(ConsumeCtx::new(
            consume_targets,
            &a.topic,
            consume_batch,
            wait,
            None,
            consumers,
            false,
        ));
        let prun = Arc::new(Run::new(a.count, a.duration, a.warmup));
        let crun = Arc::new(prun.sibling(a.count));
        let ctrl_c = stop_on_ctrl_c(vec![prun.clone(), crun.clone()]);
        let progress = Progress::start("flow", prun.clone(), !a.json());
        let cpu0 = cpu_seconds();
        let consumed = tokio::spawn(consume_all(cctx, crun.clone(), consumers));
        let produced = produce_all(pctx, prun.clone(), a.concurrency).await;
        let consumed = consumed.await;
        let cpu = cpu_seconds() - cpu0;
        progress.finish();
        ctrl_c.abort();
        let (produced, consumed) = (produced?, consumed??);
        let psecs = prun.elapsed(produced.last_done);
        let csecs = crun.elapsed(consumed.t.last_done);
        let mut out = Fields::new();
        produce_fields(&mut out, "produce_", &produced, psecs, a.message_bytes);
        consume_fields(&mut out, "consume_", &consumed, csecs, a.message_bytes);
        latency_fields(&mut out, "e2e_", &consumed.e2e);
        out.push(("e2e_samples".into(), consumed.e2e.len() as f64));
        out.push(("seconds".into(), psecs));
        out.push(("producers".into(), a.concurrency as f64));
        out.push(("consumers".into(), consumers as f64));
        out.push(("batch".into(), a.batch as f64));
        out.push(("consume_batch".into(), consume_batch as f64));
        out.push(("message_bytes".into(), a.message_bytes as f64));
        out.push(("client_cpu_pct".into(), 100.0 * cpu / prun.start.elapsed().as_secs_f64()));
        Ok(out)
    })
}
