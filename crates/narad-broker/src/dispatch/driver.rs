//! The dispatcher's driver: reads the WAL, asks the resolver where each
//! record goes, runs the commits the [`Core`] orders through the [`Owner`],
//! and stores the checkpoint. One task per node.

use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;
use std::time::Duration;

use narad_clock::ClockRef;
use narad_wal::{Wal, WalReader, WalRecord};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tracing::{error, warn};

use super::core::{Core, Dest, Item, Mark, Order, Outcome, OwnerId, Placed, Target, Topology};
use crate::limits::{
    DISPATCH_COMMIT_TIMEOUT, DISPATCH_FAILURE_BACKOFF, DISPATCH_IDLE_BACKSTOP,
    DISPATCH_PROBE_TIMEOUT,
};
use crate::metrics::BrokerMetrics;
use crate::owner::{CommitBatch, CommitError, Owner};

/// Decides where records go.
pub trait Resolver: Topology + Send + Sync {
    /// The target of a record (its topic, incarnation and partition).
    fn resolve(&self, record: &WalRecord, topic: &Arc<str>) -> Target;
}

/// A running dispatcher.
#[derive(Debug)]
pub struct Dispatcher {
    stop: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Dispatcher {
    /// Starts dispatching from the WAL's checkpoint. `wake` must be notified
    /// whenever the WAL's durable frontier advances.
    pub fn start(
        wal: Arc<Wal>,
        owner: Arc<dyn Owner>,
        resolver: Arc<dyn Resolver>,
        clock: ClockRef,
        wake: Arc<Notify>,
        metrics: Arc<BrokerMetrics>,
    ) -> Dispatcher {
        let stop = Arc::new(Notify::new());
        let driver = Driver {
            core: Core::new(wal.checkpoint()),
            reader: wal.reader(wal.checkpoint()),
            rescan: wal.reader(wal.checkpoint()),
            wal,
            owner,
            resolver,
            clock,
            metrics,
            interned: HashMap::new(),
            last_stored: 0,
            outstanding: 0,
            reroutes_unlogged: 0,
            last_reroute_log: None,
            reported: Default::default(),
        };
        let task = tokio::spawn(driver.run(wake, stop.clone()));
        Dispatcher { stop, task }
    }

    /// Stops reading, waits for the commits in flight, stores the final
    /// checkpoint.
    pub async fn stop(self) {
        self.stop.notify_one();
        let _ = self.task.await;
    }
}

type Done = (u64, Dest, Vec<Item>, Outcome);

/// At most one reroute WARN this often; each names how many records were
/// rerouted since the last one.
const REROUTE_LOG_INTERVAL: Duration = Duration::from_secs(1);

struct Driver {
    core: Core,
    reader: WalReader,
    rescan: WalReader,
    wal: Arc<Wal>,
    owner: Arc<dyn Owner>,
    resolver: Arc<dyn Resolver>,
    clock: ClockRef,
    metrics: Arc<BrokerMetrics>,
    interned: HashMap<Box<str>, Arc<str>>,
    last_stored: u64,
    outstanding: usize,
    /// Reroutes since the last reroute WARN (rate-limited: a client can
    /// produce to a failing partition as fast as it likes).
    reroutes_unlogged: u64,
    last_reroute_log: Option<Duration>,
    reported: super::core::CoreStats,
}

impl Driver {
    fn intern(&mut self, topic: &str) -> Arc<str> {
        if let Some(t) = self.interned.get(topic) {
            return t.clone();
        }
        if self.interned.len() > 10_000 {
            self.interned.clear();
        }
        let t: Arc<str> = topic.into();
        self.interned.insert(topic.into(), t.clone());
        t
    }

    async fn run(mut self, wake: Arc<Notify>, stop: Arc<Notify>) {
        let (tx, mut rx) = mpsc::unbounded_channel::<Done>();
        let mut stopping = false;
        loop {
            let now = self.clock.mono();
            let mut backoff = false;
            if !stopping {
                backoff |= !self.read_new(now);
                self.core.tick(now);
                if self.core.rescan_due(now) {
                    backoff |= !self.rescan(now);
                }
                self.launch(now, &tx);
            }
            self.store_checkpoint();
            self.report();
            if stopping && self.outstanding == 0 {
                return;
            }
            let deadline = if backoff {
                DISPATCH_FAILURE_BACKOFF
            } else {
                self.core
                    .next_deadline(now)
                    .map_or(DISPATCH_IDLE_BACKSTOP, |t| t.saturating_sub(now))
                    .min(DISPATCH_IDLE_BACKSTOP)
            };
            tokio::select! {
                _ = wake.notified(), if !stopping && !backoff => {}
                Some(done) = rx.recv() => {
                    self.finish(done);
                    while let Ok(more) = rx.try_recv() {
                        self.finish(more);
                    }
                }
                _ = tokio::time::sleep(deadline) => {}
                _ = stop.notified(), if !stopping => { stopping = true; }
            }
        }
    }

    fn finish(&mut self, (id, dest, items, outcome): Done) {
        self.outstanding -= 1;
        let now = self.clock.mono();
        self.core.finish(id, &dest, items, outcome, now);
    }

    /// The item of `record`, where it goes, and its interned topic.
    fn item(&mut self, seq: u64, record: WalRecord) -> (Item, Target, Arc<str>) {
        let topic = self.intern(record.topic());
        let target = self.resolver.resolve(&record, &topic);
        (Item { seq, record }, target, topic)
    }

    fn log_placement(&mut self, placed: &Placed, item_seq: u64, topic: &str, partition: u32) {
        if let Placed::Rerouted(to, dead) = *placed {
            self.reroutes_unlogged += 1;
            let now = self.clock.mono();
            if self.last_reroute_log.is_none_or(|t| now.saturating_sub(t) >= REROUTE_LOG_INTERVAL) {
                self.last_reroute_log = Some(now);
                let records = std::mem::take(&mut self.reroutes_unlogged);
                if dead {
                    warn!(
                        topic,
                        partition,
                        to,
                        records,
                        "rerouting produce records for dead partition owner"
                    );
                } else {
                    warn!(
                        topic,
                        partition,
                        to,
                        records,
                        "rerouting produce records for stuck partition owner"
                    );
                }
            }
        }
        if *placed == Placed::Discarded {
            warn!(
                topic,
                partition,
                seq = item_seq,
                "discarding undispatched record for deleted topic"
            );
        }
    }

    /// Reads new durable records while the window allows; `false` on a WAL
    /// read error (the caller backs off).
    fn read_new(&mut self, now: Duration) -> bool {
        while self.core.wants_read() {
            debug_assert_eq!(self.reader.position(), self.core.read_next());
            let entry = match self.reader.next_entry() {
                Ok(Some(e)) => e,
                Ok(None) => return true,
                Err(e) => {
                    self.metrics.error("dispatch", "wal_read");
                    error!(error = %e, "dispatcher cannot read the ingress WAL; retrying in 1 s");
                    self.reader.seek(self.core.read_next());
                    return false;
                }
            };
            let record = match entry.decode() {
                Ok(r) => r,
                Err(e) => {
                    self.metrics.error("dispatch", "wal_decode");
                    error!(error = %e, "dispatcher cannot decode a durable WAL record; retrying in 1 s");
                    self.reader.seek(self.core.read_next());
                    return false;
                }
            };
            let (seq, partition) = (record.seq, record.partition);
            let (item, target, topic) = self.item(seq, record);
            let placed = self.core.place_new(item, target, &*self.resolver, now);
            self.log_placement(&placed, seq, &topic, partition);
        }
        true
    }

    /// Reads skipped records again, in WAL order.
    fn rescan(&mut self, now: Duration) -> bool {
        let Some((from, to)) = self.core.begin_rescan(now) else { return true };
        self.rescan.seek(from);
        while self.rescan.position() < to {
            let seq = self.rescan.position();
            let entry = match self.rescan.next_entry() {
                Ok(Some(e)) => e,
                Ok(None) => break,
                Err(e) => {
                    error!(error = %e, "dispatcher rescan cannot read the ingress WAL");
                    return false;
                }
            };
            if self.core.mark(seq) != Some(Mark::Skipped) {
                continue; // no work: not decoded
            }
            let record = match entry.decode() {
                Ok(r) => r,
                Err(e) => {
                    error!(error = %e, "dispatcher rescan cannot decode a durable WAL record");
                    return false;
                }
            };
            let partition = record.partition;
            let (item, target, topic) = self.item(seq, record);
            let placed = self.core.place_skipped(item, target, &*self.resolver, now);
            self.log_placement(&placed, seq, &topic, partition);
        }
        true
    }

    fn launch(&mut self, now: Duration, tx: &mpsc::UnboundedSender<Done>) {
        let owner = self.owner.clone();
        let budget = move |o: OwnerId| owner.max_batch_bytes(o);
        for order in self.core.take_orders(now, &budget) {
            self.outstanding += 1;
            let Order { id, dest, owner: owner_id, items, probe } = order;
            let batch = CommitBatch::of(&dest, &items);
            let fut = self.owner.commit(owner_id, batch);
            let budget = if probe { DISPATCH_PROBE_TIMEOUT } else { DISPATCH_COMMIT_TIMEOUT };
            let tx = tx.clone();
            let metrics = self.metrics.clone();
            tokio::spawn(async move {
                let outcome = match tokio::time::timeout(budget, fut).await {
                    Ok(Ok(())) => Outcome::Committed,
                    Ok(Err(CommitError::NotOwner(why))) => {
                        warn!(topic = %dest.topic, partition = dest.partition, reason = %why,
                            "partition owner's replica names another owner; resolving produce records again");
                        Outcome::Refused
                    }
                    Ok(Err(CommitError::Refused(why))) => {
                        warn!(topic = %dest.topic, partition = dest.partition, reason = %why,
                            "owner refused produce records accepted for another topic incarnation; checking them again");
                        Outcome::Refused
                    }
                    Ok(Err(CommitError::Failed(why))) => {
                        metrics.dispatch_commit_failures.inc();
                        warn!(topic = %dest.topic, partition = dest.partition, error = %why, "produce commit failed");
                        Outcome::Failed
                    }
                    Err(_) => {
                        metrics.dispatch_commit_failures.inc();
                        warn!(topic = %dest.topic, partition = dest.partition, "produce commit timed out");
                        Outcome::Failed
                    }
                };
                let _ = tx.send((id, dest, items, outcome));
            });
        }
    }

    fn store_checkpoint(&mut self) {
        let c = self.core.checkpoint();
        if c > self.last_stored {
            match self.wal.store_checkpoint(c) {
                Ok(()) => self.last_stored = c,
                Err(e) => {
                    self.metrics.error("dispatch", "checkpoint");
                    error!(error = %e, "cannot store the ingress dispatch checkpoint");
                }
            }
        }
    }

    fn report(&mut self) {
        let s = self.core.stats();
        self.metrics.dispatch_rerouted.inc_by(s.rerouted - self.reported.rerouted);
        self.metrics.dispatch_discarded.inc_by(s.discarded - self.reported.discarded);
        self.reported = s;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use narad_fs::SimFs;
    use narad_wal::RecordRef;
    use prometheus_client::registry::Registry;

    use super::*;
    use crate::owner::CommitFuture;

    /// Every partition of topic `t` (4 of them) is assigned; partition 0's
    /// owner is dead.
    #[derive(Debug)]
    struct DeadZero;
    impl Topology for DeadZero {
        fn owner_of(&self, _topic: &str, partition: u32) -> Option<(OwnerId, bool)> {
            (partition < 4).then_some((u64::from(partition), partition != 0))
        }
    }
    impl Resolver for DeadZero {
        fn resolve(&self, record: &WalRecord, topic: &Arc<str>) -> Target {
            let partition = record.partition % 4;
            Target::Commit {
                dest: Dest { topic: topic.clone(), partition },
                owner: u64::from(partition),
                alive: partition != 0,
                partitions: 4,
            }
        }
    }

    /// Commits everything; counts records per partition.
    #[derive(Debug, Default)]
    struct Counting([AtomicU32; 4]);
    impl Owner for Arc<Counting> {
        fn commit(&self, _owner: OwnerId, batch: CommitBatch) -> CommitFuture {
            self.0[batch.partition as usize]
                .fetch_add(batch.records.len() as u32, Ordering::SeqCst);
            Box::pin(async { Ok(()) })
        }
        fn max_batch_bytes(&self, _owner: OwnerId) -> Option<usize> {
            None
        }
    }

    #[tokio::test]
    async fn rerouted_records_are_counted_in_the_rerouted_metric() {
        let fs: narad_fs::FsRef = Arc::new(SimFs::new(7));
        let wal = Arc::new(Wal::open(fs, "/wal").unwrap());
        for i in 0..5u32 {
            let payload = format!("m{i}");
            let r = RecordRef {
                topic: "t",
                incarnation: Some(1),
                key: None,
                partition: 0,
                accepted_at_ms: 0,
                payload: payload.as_bytes(),
            };
            wal.append(&r).unwrap();
        }
        let metrics = Arc::new(BrokerMetrics::new(&mut Registry::default()));
        let owner = Arc::new(Counting::default());
        let wake = Arc::new(Notify::new());
        let d = Dispatcher::start(
            wal.clone(),
            Arc::new(owner.clone()),
            Arc::new(DeadZero),
            narad_clock::SystemClock::shared(),
            wake.clone(),
            metrics.clone(),
        );
        wake.notify_one();
        for _ in 0..500 {
            if wal.checkpoint() == 5 && metrics.dispatch_rerouted.get() == 5 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        d.stop().await;
        assert_eq!(metrics.dispatch_rerouted.get(), 5, "every record of the dead owner rerouted");
        assert_eq!(owner.0[0].load(Ordering::SeqCst), 0);
        assert_eq!(owner.0[1].load(Ordering::SeqCst), 5, "to the next partition up");
    }
}
