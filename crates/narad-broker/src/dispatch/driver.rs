//! The dispatcher's driver: reads the WAL, asks the resolver where each
//! record goes, runs the commits and pings the [`Core`] orders through the
//! [`Owner`], and stores the checkpoint. One task per node.
//!
//! Logs of commit outcomes that can repeat for every commit (a failing or
//! refusing owner) are rate-limited: at most one WARN per kind a second,
//! naming how many happened since the last one.

use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;
use std::time::Duration;

use narad_clock::ClockRef;
use narad_wal::{Wal, WalReader, WalRecord};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use super::core::{Core, Dest, Item, Order, Outcome, OwnerId, Placed, Target, Topology};
use crate::limits::{
    DISPATCH_COMMIT_TIMEOUT, DISPATCH_FAILURE_BACKOFF, DISPATCH_IDLE_BACKSTOP,
    DISPATCH_PROBE_TIMEOUT,
};
use crate::log_gate::LogGate;
use crate::metrics::{BrokerMetrics, PartitionLabels, ProbeStateLabels, TopicLabels};
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
            reroute_log: GATE,
            outcome_logs: [GATE; 7],
            last_trouble_report: None,
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

/// How a commit ended, as the driver logs it.
#[derive(Debug)]
enum Note {
    Committed,
    NotOwner(String),
    Refused(String),
    Failed(String),
    Unavailable(String),
    Frozen(String),
    TimedOut,
}

impl Note {
    fn outcome(&self) -> Outcome {
        match self {
            Note::Committed => Outcome::Committed,
            Note::NotOwner(_) | Note::Refused(_) | Note::Frozen(_) => Outcome::Refused,
            Note::Failed(_) | Note::Unavailable(_) | Note::TimedOut => Outcome::Failed,
        }
    }

    /// Its slot in [`Driver::outcome_logs`].
    fn kind(&self) -> usize {
        match self {
            Note::Committed => 0,
            Note::NotOwner(_) => 1,
            Note::Refused(_) => 2,
            Note::Failed(_) => 3,
            Note::TimedOut => 4,
            Note::Unavailable(_) => 5,
            Note::Frozen(_) => 6,
        }
    }
}

enum Event {
    Commit(u64, Dest, Vec<Item>, Note),
    Ping(OwnerId, Result<(), String>),
}

/// At most one WARN of a kind this often; each names how many happened
/// since the last one.
const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Per-destination gauges are refreshed at most this often.
const TROUBLE_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// A rescan walks forward over at most this many records between two it
/// wants (cheap: a header each); a longer gap is a seek.
const RESCAN_WALK_MAX: u64 = 4_096;

/// The dispatcher's log gates: one line per [`LOG_INTERVAL`] per kind.
const GATE: LogGate = LogGate::every(LOG_INTERVAL);

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
    /// Reroute WARNs (a client can produce to a failing partition as fast
    /// as it likes).
    reroute_log: LogGate,
    /// Commit outcome WARNs, by [`Note::kind`].
    outcome_logs: [LogGate; 7],
    last_trouble_report: Option<Duration>,
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
        let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
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
                self.ping(now, &tx);
            }
            self.store_checkpoint();
            self.report(now);
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
                Some(event) = rx.recv() => {
                    self.handle(event);
                    while let Ok(more) = rx.try_recv() {
                        self.handle(more);
                    }
                }
                _ = tokio::time::sleep(deadline) => {}
                _ = stop.notified(), if !stopping => { stopping = true; }
            }
        }
    }

    fn handle(&mut self, event: Event) {
        let now = self.clock.mono();
        match event {
            Event::Commit(id, dest, items, note) => {
                self.outstanding -= 1;
                self.log_outcome(&dest, items.len(), &note, now);
                self.core.finish(id, &dest, items, note.outcome(), now);
            }
            Event::Ping(owner, answer) => {
                if let Err(why) = &answer {
                    tracing::debug!(owner, error = %why, "failing owner did not answer a ping");
                }
                self.core.finish_ping(owner, answer.is_ok(), now);
            }
        }
    }

    /// One rate-limited line for a commit that did not land.
    fn log_outcome(&mut self, dest: &Dest, records: usize, note: &Note, now: Duration) {
        if matches!(note, Note::Committed) {
            return;
        }
        // This line's event and those held back since the last line.
        let Some(commits) = self.outcome_logs[note.kind()].hit(now).map(|held| held + 1) else {
            return;
        };
        let (topic, partition) = (&*dest.topic, dest.partition);
        match note {
            Note::Committed => {}
            Note::NotOwner(why) => info!(topic, partition, records, commits, reason = %why,
                "partition owner's replica names another owner; resolving produce records again"),
            Note::Refused(why) => info!(topic, partition, records, commits, reason = %why,
                "owner refused produce records; resolving them again after a back-off"),
            Note::Failed(why) => warn!(topic, partition, records, commits, error = %why,
                "produce commit failed; its records stay in the WAL, the owner is pinged"),
            Note::TimedOut => warn!(
                topic,
                partition,
                records,
                commits,
                "produce commit timed out; its records stay in the WAL, the owner is pinged"
            ),
            Note::Unavailable(why) => info!(topic, partition, records, commits, reason = %why,
                "partition owner is shutting down; its records stay in the WAL (rerouted after 3 s)"),
            Note::Frozen(why) => info!(topic, partition, records, commits, reason = %why,
                "partition is frozen while it moves; its records stay in the WAL and go to the same partition after a back-off"),
        }
    }

    /// The item of `record`, where it goes, and its interned topic.
    fn item(&mut self, seq: u64, record: WalRecord) -> (Item, Target, Arc<str>) {
        let topic = self.intern(record.topic());
        let target = self.resolver.resolve(&record, &topic);
        (Item { seq, record }, target, topic)
    }

    fn log_placement(
        &mut self,
        placed: &Placed,
        seq: u64,
        topic: &str,
        partition: u32,
        keyed: bool,
    ) {
        if let Placed::Rerouted(to, dead) = *placed {
            if keyed {
                let l = TopicLabels { topic: topic.to_owned() };
                self.metrics.dispatch_keyed_rerouted.get_or_create(&l).inc();
            }
            let now = self.clock.mono();
            if let Some(records) = self.reroute_log.hit(now).map(|held| held + 1) {
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
            warn!(topic, partition, seq, "discarding undispatched record for deleted topic");
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
            let (seq, partition, keyed) = (record.seq, record.partition, record.key.is_some());
            let (item, target, topic) = self.item(seq, record);
            let placed = self.core.place_new(item, target, &*self.resolver, now);
            self.log_placement(&placed, seq, &topic, partition, keyed);
        }
        true
    }

    /// Reads again, in WAL order, the skipped records the core hands out;
    /// `false` on a read error (the rest stay skipped, the caller backs
    /// off).
    fn rescan(&mut self, now: Duration) -> bool {
        let seqs = self.core.begin_rescan(now, &*self.resolver);
        let mut pending = seqs.into_iter().peekable();
        while let Some(&seq) = pending.peek() {
            let record = match self.read_at(seq) {
                Ok(r) => r,
                Err(why) => {
                    self.metrics.error("dispatch", "wal_read");
                    error!(error = %why, seq, "dispatcher rescan cannot read the ingress WAL; retrying in 1 s");
                    self.rescan.seek(seq);
                    self.core.unread(pending);
                    return false;
                }
            };
            pending.next();
            let (partition, keyed) = (record.partition, record.key.is_some());
            let (item, target, topic) = self.item(seq, record);
            let placed = self.core.place_skipped(item, target, &*self.resolver, now);
            self.log_placement(&placed, seq, &topic, partition, keyed);
        }
        true
    }

    /// The record at `seq`, through the rescan reader: a short walk forward
    /// from where it is, else a seek.
    fn read_at(&mut self, seq: u64) -> Result<WalRecord, String> {
        let pos = self.rescan.position();
        if seq < pos || seq - pos > RESCAN_WALK_MAX {
            self.rescan.seek(seq);
        }
        loop {
            match self.rescan.next_entry() {
                Ok(Some(e)) if e.seq == seq => return e.decode().map_err(|e| e.to_string()),
                Ok(Some(_)) => {} // walking over records that need no work
                Ok(None) => return Err(format!("sequence {seq} is past the durable end")),
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    fn launch(&mut self, now: Duration, tx: &mpsc::UnboundedSender<Event>) {
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
                let note = match tokio::time::timeout(budget, fut).await {
                    Ok(Ok(())) => Note::Committed,
                    Ok(Err(CommitError::NotOwner(why))) => Note::NotOwner(why),
                    Ok(Err(CommitError::Refused(why))) => Note::Refused(why),
                    Ok(Err(CommitError::Failed(why))) => Note::Failed(why),
                    Ok(Err(CommitError::Unavailable(why))) => Note::Unavailable(why),
                    Ok(Err(CommitError::Frozen(why))) => Note::Frozen(why),
                    Err(_) => Note::TimedOut,
                };
                match note.outcome() {
                    Outcome::Failed => {
                        metrics.dispatch_commit_failures.inc();
                    }
                    Outcome::Refused => {
                        metrics.dispatch_commit_refusals.inc();
                    }
                    Outcome::Committed => {}
                }
                let _ = tx.send(Event::Commit(id, dest, items, note));
            });
        }
    }

    /// Pings the owners of failing destinations that are due.
    fn ping(&mut self, now: Duration, tx: &mpsc::UnboundedSender<Event>) {
        for owner in self.core.take_pings(now) {
            let fut = self.owner.ping(owner);
            let tx = tx.clone();
            tokio::spawn(async move {
                let answer = match tokio::time::timeout(DISPATCH_PROBE_TIMEOUT, fut).await {
                    Ok(r) => r,
                    Err(_) => Err("no answer within the probe budget".into()),
                };
                let _ = tx.send(Event::Ping(owner, answer));
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

    fn report(&mut self, now: Duration) {
        let s = self.core.stats();
        self.metrics.dispatch_rerouted.inc_by(s.rerouted - self.reported.rerouted);
        self.metrics.dispatch_discarded.inc_by(s.discarded - self.reported.discarded);
        self.reported = s;
        self.metrics.ingress_dispatch_uncommitted_records.set(self.core.uncommitted() as i64);
        if self.last_trouble_report.is_some_and(|t| now.saturating_sub(t) < TROUBLE_REPORT_INTERVAL)
        {
            return;
        }
        self.last_trouble_report = Some(now);
        let m = &self.metrics;
        m.dispatch_destination_skipped_records.clear();
        m.dispatch_destination_failing_seconds.clear();
        m.dispatch_destination_probe_state.clear();
        for t in self.core.troubled() {
            let l = PartitionLabels::new(&t.dest.topic, t.dest.partition);
            if t.skipped > 0 {
                m.dispatch_destination_skipped_records.get_or_create(&l).set(t.skipped as i64);
            }
            if let Some((since, state)) = t.failing {
                let secs = now.saturating_sub(since).as_secs() as i64;
                m.dispatch_destination_failing_seconds.get_or_create(&l).set(secs);
                let sl = ProbeStateLabels {
                    topic: l.topic.clone(),
                    partition: l.partition.clone(),
                    state: state.as_str(),
                };
                m.dispatch_destination_probe_state.get_or_create(&sl).set(1);
            }
        }
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
