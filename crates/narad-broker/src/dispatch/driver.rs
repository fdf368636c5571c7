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
use crate::owner::{BatchRecord, CommitBatch, CommitError, Owner};

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

    fn item(&mut self, seq: u64, record: WalRecord) -> (Item, Target) {
        let topic = self.intern(record.topic());
        let target = self.resolver.resolve(&record, &topic);
        (Item { seq, record }, target)
    }

    fn log_placement(&self, placed: &Placed, item_seq: u64, topic: &str, partition: u32) {
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
            let (seq, topic, partition) = (record.seq, record.topic().to_owned(), record.partition);
            let (item, target) = self.item(seq, record);
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
            let (topic, partition) = (record.topic().to_owned(), record.partition);
            let (item, target) = self.item(seq, record);
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
            let batch = CommitBatch {
                topic: dest.topic.clone(),
                partition: dest.partition,
                records: items
                    .iter()
                    .map(|i| BatchRecord {
                        incarnation: i.record.incarnation,
                        key: i.record.key.clone(),
                        payload: i.record.payload.clone(),
                    })
                    .collect(),
            };
            let fut = self.owner.commit(owner_id, batch);
            let budget = if probe { DISPATCH_PROBE_TIMEOUT } else { DISPATCH_COMMIT_TIMEOUT };
            let tx = tx.clone();
            let metrics = self.metrics.clone();
            tokio::spawn(async move {
                let outcome = match tokio::time::timeout(budget, fut).await {
                    Ok(Ok(())) => Outcome::Committed,
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
