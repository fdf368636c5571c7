//! The dispatcher's decisions, as a state machine with no I/O and no clock
//! of its own: the driver feeds it WAL records, commit results and the
//! time, and carries out the commit orders it returns. Tests drive it with
//! a fake owner and fake time.
//!
//! # State
//! Every sequence number between the checkpoint `C` and the read frontier
//! `R` is in one of three states ([`Mark`]):
//! * **Done**: committed, or discarded (topic deleted);
//! * **Held**: queued on its destination, or in a commit in flight;
//! * **Skipped**: left in the WAL, to be read again by a rescan.
//!
//! The checkpoint is the first sequence number not Done, so it never passes
//! a record that is not committed. Each destination (topic, partition) has
//! a queue and at most one commit in flight.
//!
//! # Rules (the v3 "Dispatch stage")
//! * Window: records held (queued or in flight, hung commits aside) stay
//!   below `clamp(64 × destinations, 4,096, 65,536)` and below 256 MiB of
//!   encoded bytes (plus the one record read last); the reader also never
//!   reads more than 16 windows past the checkpoint. A destination's queue
//!   holds at most `max(window / 4, 4,096)` records and 128 MiB.
//! * A commit carries at most 64 MiB (or its owner's tighter budget), well
//!   under the partition log's 512 MiB commit limit, and at least one
//!   record.
//! * At most 16 commits in flight; one running past 1 s is *hung*: it
//!   stops counting, whatever queued behind it goes back to the WAL, and its
//!   destination takes nothing new until it lands.
//! * Linger: while other commits are in flight, a destination with fewer
//!   than 64 records waits until twice its owner's moving-average commit
//!   latency has passed since its oldest queued record, at most 50 ms.
//! * A failed commit keeps one record as a probe (retried once a second);
//!   the rest go back to the WAL. After 3 s of failures (from the start of
//!   the first failed attempt), or at once if the owner is dead, records for
//!   it go to the next healthy sibling partition; the probe keeps testing
//!   the original.
//! * A record is skipped (left in the WAL) when its destination is failing,
//!   hung, full, or already has an earlier skipped record (order), or when
//!   its owner does not resolve yet. Rescans read skipped records again in
//!   WAL order: at once when a destination recovers or drains, and at least
//!   once a second.

use std::collections::{BTreeSet, VecDeque};

use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;
use std::time::Duration;

use narad_wal::WalRecord;

use crate::limits::{
    DISPATCH_COMMIT_MAX_BYTES, DISPATCH_COMMIT_SLOTS, DISPATCH_DEST_QUEUE_MAX_BYTES,
    DISPATCH_FAILURE_BACKOFF, DISPATCH_HUNG_AFTER, DISPATCH_LINGER_MAX, DISPATCH_LOOKAHEAD_WINDOWS,
    DISPATCH_REROUTE_GRACE, DISPATCH_RESCAN_INTERVAL, DISPATCH_TARGET_PER_DEST,
    DISPATCH_UNRESOLVED_RETRY, DISPATCH_WINDOW_MAX, DISPATCH_WINDOW_MAX_BYTES, DISPATCH_WINDOW_MIN,
};

/// The bytes a record costs in a commit (payload, key, envelope overhead).
pub fn encoded_size(r: &WalRecord) -> usize {
    r.payload.len() + r.key.as_ref().map_or(0, |k| k.len()) + 32
}

/// An owner (node), for per-owner commit latency.
pub type OwnerId = u64;

/// A destination: one partition of one topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dest {
    /// Topic name.
    pub topic: Arc<str>,
    /// Partition index.
    pub partition: u32,
}

/// One WAL record on its way to an owner.
#[derive(Debug, Clone)]
pub struct Item {
    /// Its WAL sequence number.
    pub seq: u64,
    /// The record (its `partition` is the one chosen at accept time; a
    /// rerouted item is committed elsewhere).
    pub record: WalRecord,
}

/// The state of a sequence number between the checkpoint and the frontier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Committed or discarded.
    Done,
    /// Queued or in flight.
    Held,
    /// Left in the WAL.
    Skipped,
}

/// Where the resolver says a record goes.
#[derive(Debug, Clone)]
pub enum Target {
    /// Commit to `dest` on `owner`.
    Commit {
        /// The record's own destination.
        dest: Dest,
        /// Its owner.
        owner: OwnerId,
        /// Whether membership reports the owner alive.
        alive: bool,
        /// The topic's partition count (for reroutes).
        partitions: u32,
    },
    /// The record can never be committed (its topic, or its topic
    /// incarnation, is confirmed deleted): drop it.
    Discard,
    /// Not resolvable yet (e.g. no owner assigned): leave it in the WAL and
    /// look again soon.
    Wait,
}

/// The owners of sibling partitions, for reroutes.
pub trait Topology {
    /// The owner of `partition` of `topic` and whether it is alive, if
    /// assigned.
    fn owner_of(&self, topic: &str, partition: u32) -> Option<(OwnerId, bool)>;
}

/// What happened to a placed record (for metrics and logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placed {
    /// Queued on its destination.
    Queued,
    /// Queued on a sibling partition: (that partition, whether the owner
    /// is dead rather than failing).
    Rerouted(u32, bool),
    /// Left in the WAL.
    Skipped,
    /// Dropped for good.
    Discarded,
}

/// A commit the driver must carry out.
#[derive(Debug)]
pub struct Order {
    /// Identifies the order in [`Core::finish`].
    pub id: u64,
    /// Where to commit.
    pub dest: Dest,
    /// The owner to send it to.
    pub owner: OwnerId,
    /// The records, in WAL order.
    pub items: Vec<Item>,
    /// A single-record probe of a failing destination (shorter budget).
    pub probe: bool,
}

/// How a commit ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Durable and visible on the owner.
    Committed,
    /// Refused without failure (e.g. another topic incarnation): the records
    /// go back to the WAL and are resolved again; the destination is not
    /// marked failing.
    Refused,
    /// Failed (error, timeout, unreachable owner).
    Failed,
}

#[derive(Debug)]
struct InFlight {
    id: u64,
    started: Duration,
    count: usize,
    /// Encoded bytes of its records.
    bytes: usize,
    hung: bool,
}

#[derive(Debug)]
struct Failing {
    since: Duration,
    next_probe: Duration,
}

#[derive(Debug, Default)]
struct DestState {
    owner: OwnerId,
    alive: bool,
    partitions: u32,
    queue: VecDeque<Item>,
    /// Encoded bytes of `queue`.
    queued_bytes: usize,
    oldest_queued: Option<Duration>,
    in_flight: Option<InFlight>,
    failing: Option<Failing>,
    /// Records of this destination currently Skipped.
    skipped: usize,
}

impl DestState {
    fn idle(&self) -> bool {
        self.queue.is_empty()
            && self.in_flight.is_none()
            && self.failing.is_none()
            && self.skipped == 0
    }
}

/// Counters the driver exports.
#[derive(Debug, Default, Clone, Copy)]
pub struct CoreStats {
    /// Records committed.
    pub committed: u64,
    /// Records discarded.
    pub discarded: u64,
    /// Records rerouted to a sibling.
    pub rerouted: u64,
    /// Commits that failed.
    pub failed_commits: u64,
    /// Commits that became hung.
    pub hung_commits: u64,
}

/// The dispatcher state machine.
#[derive(Debug)]
pub struct Core {
    checkpoint: u64,
    marks: VecDeque<Mark>,
    dests: HashMap<Dest, DestState>,
    /// Destinations with a queue and nothing in flight.
    ready: BTreeSet<Dest>,
    held: usize,
    /// Encoded bytes of the held records.
    held_bytes: usize,
    in_flight: usize,
    skipped: usize,
    window: usize,
    owner_latency: HashMap<OwnerId, Duration>,
    /// Non-hung orders in start order, for hung detection: (start, id, dest).
    started: VecDeque<(Duration, u64, Dest)>,
    rescan_asap: bool,
    last_rescan: Duration,
    unresolved_retry: Option<Duration>,
    next_order: u64,
    stats: CoreStats,
}

impl Core {
    /// A dispatcher resuming at `checkpoint`.
    pub fn new(checkpoint: u64) -> Core {
        Core {
            checkpoint,
            marks: VecDeque::new(),
            dests: HashMap::new(),
            ready: BTreeSet::new(),
            held: 0,
            held_bytes: 0,
            in_flight: 0,
            skipped: 0,
            window: DISPATCH_WINDOW_MIN,
            owner_latency: HashMap::new(),
            started: VecDeque::new(),
            rescan_asap: false,
            last_rescan: Duration::ZERO,
            unresolved_retry: None,
            next_order: 1,
            stats: CoreStats::default(),
        }
    }

    /// The first sequence number not done.
    pub fn checkpoint(&self) -> u64 {
        self.checkpoint
    }

    /// The next sequence number the reader should read.
    pub fn read_next(&self) -> u64 {
        self.checkpoint + self.marks.len() as u64
    }

    /// Records held (queued or in flight, hung commits aside).
    pub fn held(&self) -> usize {
        self.held
    }

    /// Encoded bytes of the held records.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Records left in the WAL.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// The current window.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Commits in flight that count against the slots.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Counters.
    pub fn stats(&self) -> CoreStats {
        self.stats
    }

    /// The state of `seq`, if between the checkpoint and the frontier.
    pub fn mark(&self, seq: u64) -> Option<Mark> {
        let i = seq.checked_sub(self.checkpoint)?;
        self.marks.get(usize::try_from(i).ok()?).copied()
    }

    /// Whether the reader may read another new record: held records stay
    /// below the window (but at least four destinations' worth, so a hot
    /// partition never takes more than half), and the reader stays within
    /// 16 windows of the checkpoint.
    pub fn wants_read(&self) -> bool {
        let limit = self.window.max(4 * self.per_dest_cap());
        self.held < limit
            && self.held_bytes < DISPATCH_WINDOW_MAX_BYTES
            && (self.marks.len() as u64) < (DISPATCH_LOOKAHEAD_WINDOWS * self.window) as u64
    }

    fn linger(&self, owner: OwnerId) -> Option<Duration> {
        self.owner_latency.get(&owner).map(|lat| (*lat * 2).min(DISPATCH_LINGER_MAX))
    }

    fn per_dest_cap(&self) -> usize {
        (self.window / 4).max(DISPATCH_WINDOW_MIN)
    }

    fn set_mark(&mut self, seq: u64, m: Mark) {
        let i = (seq - self.checkpoint) as usize;
        self.marks[i] = m;
    }

    /// Places the next new record (its seq must be [`Core::read_next`]).
    pub fn place_new(
        &mut self,
        item: Item,
        target: Target,
        topo: &dyn Topology,
        now: Duration,
    ) -> Placed {
        assert_eq!(item.seq, self.read_next(), "records are placed in WAL order");
        self.marks.push_back(Mark::Skipped);
        self.skipped += 1;
        self.place(item, target, topo, now)
    }

    /// Places a record that was skipped, during a rescan.
    pub fn place_skipped(
        &mut self,
        item: Item,
        target: Target,
        topo: &dyn Topology,
        now: Duration,
    ) -> Placed {
        assert_eq!(self.mark(item.seq), Some(Mark::Skipped), "only skipped records are re-placed");
        self.place(item, target, topo, now)
    }

    /// `item` is currently marked Skipped (and counted in `self.skipped`).
    fn place(&mut self, item: Item, target: Target, topo: &dyn Topology, now: Duration) -> Placed {
        let (dest, owner, alive, partitions) = match target {
            Target::Discard => {
                self.set_mark(item.seq, Mark::Done);
                self.skipped -= 1;
                self.stats.discarded += 1;
                self.advance();
                return Placed::Discarded;
            }
            Target::Wait => {
                // Stays Skipped (already counted); looked up again soon.
                self.unresolved_retry.get_or_insert(now + DISPATCH_UNRESOLVED_RETRY);
                return Placed::Skipped;
            }
            Target::Commit { dest, owner, alive, partitions } => (dest, owner, alive, partitions),
        };
        self.window = (DISPATCH_TARGET_PER_DEST * (self.dests.len() + 1))
            .clamp(DISPATCH_WINDOW_MIN, DISPATCH_WINDOW_MAX);
        let cap = self.per_dest_cap();
        let st = self.dests.entry(dest.clone()).or_default();
        st.owner = owner;
        st.alive = alive;
        st.partitions = partitions;
        let reroute = !alive
            || st
                .failing
                .as_ref()
                .is_some_and(|f| now.saturating_sub(f.since) >= DISPATCH_REROUTE_GRACE);
        if reroute && let Some(to) = self.healthy_sibling(&dest, partitions, topo, cap) {
            self.enqueue(&to, item, now);
            self.stats.rerouted += 1;
            return Placed::Rerouted(to.partition, !alive);
        }
        let st = self.dests.get_mut(&dest).expect("inserted above");
        // A failing destination holds exactly one record: its probe.
        let needs_probe = st.queue.is_empty() && st.in_flight.is_none();
        let blocked = (st.failing.is_some() && !needs_probe)
            || st.in_flight.as_ref().is_some_and(|f| f.hung)
            || st.queue.len() >= cap
            || st.queued_bytes >= DISPATCH_DEST_QUEUE_MAX_BYTES
            || st.skipped > 0;
        if blocked {
            st.skipped += 1;
            return Placed::Skipped;
        }
        self.enqueue(&dest, item, now);
        Placed::Queued
    }

    fn healthy_sibling(
        &mut self,
        dest: &Dest,
        partitions: u32,
        topo: &dyn Topology,
        cap: usize,
    ) -> Option<Dest> {
        for step in 1..partitions {
            let p = (dest.partition + step) % partitions;
            let Some((owner, alive)) = topo.owner_of(&dest.topic, p) else { continue };
            if !alive {
                continue;
            }
            let cand = Dest { topic: dest.topic.clone(), partition: p };
            let st = self.dests.entry(cand.clone()).or_default();
            if st.failing.is_none()
                && !st.in_flight.as_ref().is_some_and(|f| f.hung)
                && st.queue.len() < cap
                && st.queued_bytes < DISPATCH_DEST_QUEUE_MAX_BYTES
                && st.skipped == 0
            {
                st.owner = owner;
                st.alive = alive;
                st.partitions = partitions;
                return Some(cand);
            }
        }
        None
    }

    fn enqueue(&mut self, dest: &Dest, item: Item, now: Duration) {
        self.set_mark(item.seq, Mark::Held);
        self.skipped -= 1;
        self.held += 1;
        let size = encoded_size(&item.record);
        self.held_bytes += size;
        let st = self.dests.get_mut(dest).expect("destination exists");
        if st.queue.is_empty() {
            st.oldest_queued = Some(now);
        }
        st.queued_bytes += size;
        st.queue.push_back(item);
        if st.in_flight.is_none() {
            self.ready.insert(dest.clone());
        }
    }

    /// Starts a rescan: returns the range to read again, or `None` when no
    /// record is skipped. Per-destination skip counts restart from zero and
    /// are rebuilt as the rescan re-places records in WAL order.
    pub fn begin_rescan(&mut self, now: Duration) -> Option<(u64, u64)> {
        self.last_rescan = now;
        self.rescan_asap = false;
        self.unresolved_retry = None;
        if self.skipped == 0 {
            return None;
        }
        for st in self.dests.values_mut() {
            st.skipped = 0;
        }
        Some((self.checkpoint, self.read_next()))
    }

    /// Whether a rescan is due.
    pub fn rescan_due(&self, now: Duration) -> bool {
        self.skipped > 0
            && (self.rescan_asap
                || now.saturating_sub(self.last_rescan) >= DISPATCH_RESCAN_INTERVAL
                || self.unresolved_retry.is_some_and(|t| now >= t))
    }

    /// The commits to start now. Each carries at most
    /// [`DISPATCH_COMMIT_MAX_BYTES`] encoded bytes, or `max_bytes(owner)`
    /// when that is tighter (`None`: no tighter budget, e.g. a local
    /// owner); a commit always carries at least one record.
    pub fn take_orders(
        &mut self,
        now: Duration,
        max_bytes: &dyn Fn(OwnerId) -> Option<usize>,
    ) -> Vec<Order> {
        let mut orders = Vec::new();
        if self.in_flight >= DISPATCH_COMMIT_SLOTS || self.ready.is_empty() {
            return orders;
        }
        let mut ready: Vec<(Duration, Dest)> = self
            .ready
            .iter()
            .map(|d| (self.dests[d].oldest_queued.unwrap_or(now), d.clone()))
            .collect();
        ready.sort_by_key(|r| r.0);
        for (oldest, dest) in ready {
            if self.in_flight >= DISPATCH_COMMIT_SLOTS {
                break;
            }
            let (owner, probe_due, queued) = {
                let st = &self.dests[&dest];
                (st.owner, st.failing.as_ref().map(|f| f.next_probe), st.queue.len())
            };
            let probe = probe_due.is_some();
            match probe_due {
                Some(due) if now < due => continue,
                Some(_) => {}
                None => {
                    // Small batches linger while other commits run.
                    let lingering = queued < DISPATCH_TARGET_PER_DEST
                        && self.in_flight > 0
                        && self.linger(owner).is_some_and(|l| now < oldest + l);
                    if lingering {
                        continue;
                    }
                }
            }
            let budget = max_bytes(owner)
                .map_or(DISPATCH_COMMIT_MAX_BYTES, |b| b.min(DISPATCH_COMMIT_MAX_BYTES));
            let st = self.dests.get_mut(&dest).expect("ready destinations exist");
            let mut items = Vec::new();
            let mut bytes = 0usize;
            while let Some(next) = st.queue.front() {
                let size = encoded_size(&next.record);
                let over_budget = bytes + size > budget;
                if !items.is_empty() && (probe || over_budget) {
                    break;
                }
                bytes += size;
                st.queued_bytes -= size;
                items.push(st.queue.pop_front().expect("front exists"));
            }
            st.oldest_queued = if st.queue.is_empty() { None } else { Some(now) };
            let id = self.next_order;
            self.next_order += 1;
            st.in_flight =
                Some(InFlight { id, started: now, count: items.len(), bytes, hung: false });
            self.started.push_back((now, id, dest.clone()));
            self.in_flight += 1;
            self.ready.remove(&dest);
            orders.push(Order { id, dest, owner, items, probe });
        }
        orders
    }

    /// Marks commits in flight for more than 1 s as hung.
    pub fn tick(&mut self, now: Duration) {
        while self
            .started
            .front()
            .is_some_and(|(t, _, _)| now.saturating_sub(*t) >= DISPATCH_HUNG_AFTER)
        {
            let (_, id, dest) = self.started.pop_front().expect("front exists");
            let Some(st) = self.dests.get_mut(&dest) else { continue };
            let Some(f) = st.in_flight.as_mut().filter(|f| f.id == id && !f.hung) else {
                continue; // finished meanwhile
            };
            f.hung = true;
            self.in_flight -= 1;
            self.held -= f.count;
            self.held_bytes -= f.bytes + std::mem::take(&mut st.queued_bytes);
            self.stats.hung_commits += 1;
            // Whatever queued behind it goes back to the WAL.
            let returned: Vec<u64> = st.queue.drain(..).map(|i| i.seq).collect();
            st.skipped += returned.len();
            st.oldest_queued = None;
            self.held -= returned.len();
            for seq in returned {
                self.set_mark(seq, Mark::Skipped);
                self.skipped += 1;
            }
        }
    }

    /// Applies the outcome of order `id` for `dest`, which carried `items`
    /// (given back by the driver).
    pub fn finish(
        &mut self,
        id: u64,
        dest: &Dest,
        items: Vec<Item>,
        outcome: Outcome,
        now: Duration,
    ) {
        let st = self.dests.get_mut(dest).expect("a destination with an order in flight exists");
        let f = st.in_flight.take().expect("an order in flight");
        assert_eq!(f.id, id, "one order in flight per destination");
        if !f.hung {
            self.in_flight -= 1;
            self.held -= f.count;
            self.held_bytes -= f.bytes;
        }
        let mut back_to_wal: Vec<u64> = Vec::new();
        match outcome {
            Outcome::Committed => {
                let lat = now.saturating_sub(f.started);
                let ema = self.owner_latency.entry(st.owner).or_insert(lat);
                *ema = (*ema * 7 + lat) / 8;
                if st.failing.take().is_some() || st.skipped > 0 {
                    self.rescan_asap = true;
                }
                self.stats.committed += items.len() as u64;
                for it in &items {
                    self.set_mark(it.seq, Mark::Done);
                }
            }
            Outcome::Refused => {
                // The owner answered: the destination is not failing. These
                // records, and whatever queued behind them, go back to the
                // WAL in order, to be resolved again.
                st.failing = None;
                back_to_wal.extend(items.iter().map(|i| i.seq));
                back_to_wal.extend(st.queue.drain(..).map(|i| i.seq));
                self.held -= back_to_wal.len() - items.len();
                self.held_bytes -= std::mem::take(&mut st.queued_bytes);
                st.oldest_queued = None;
                self.rescan_asap = true;
            }
            Outcome::Failed => {
                self.stats.failed_commits += 1;
                let since = st.failing.as_ref().map_or(f.started, |x| x.since);
                st.failing = Some(Failing { since, next_probe: now + DISPATCH_FAILURE_BACKOFF });
                // Keep one record as the probe; the rest go back to the WAL.
                let mut rest = items.into_iter();
                let probe = rest.next().expect("an order has at least one record");
                back_to_wal.extend(rest.map(|i| i.seq));
                let queued: Vec<u64> = st.queue.drain(..).map(|i| i.seq).collect();
                self.held -= queued.len();
                self.held_bytes -= std::mem::take(&mut st.queued_bytes);
                back_to_wal.extend(queued);
                let size = encoded_size(&probe.record);
                st.queue.push_back(probe);
                st.queued_bytes = size;
                st.oldest_queued = Some(now);
                self.held += 1;
                self.held_bytes += size;
                self.ready.insert(dest.clone());
            }
        }
        let st = self.dests.get_mut(dest).expect("exists");
        st.skipped += back_to_wal.len();
        if st.in_flight.is_none() && !st.queue.is_empty() {
            self.ready.insert(dest.clone());
        }
        for seq in back_to_wal {
            self.set_mark(seq, Mark::Skipped);
            self.skipped += 1;
        }
        if f.hung {
            // Its destination can take records again.
            self.rescan_asap |= self.dests[dest].skipped > 0;
        }
        self.advance();
        // Forget idle destinations: the window follows the fan-out in use.
        if self.dests.get(dest).is_some_and(DestState::idle) {
            self.dests.remove(dest);
        }
    }

    /// Moves the checkpoint over the done prefix.
    fn advance(&mut self) {
        while self.marks.front() == Some(&Mark::Done) {
            self.marks.pop_front();
            self.checkpoint += 1;
        }
    }

    /// The earliest time something becomes due (linger, probe, hung, rescan).
    pub fn next_deadline(&self, now: Duration) -> Option<Duration> {
        let mut next: Option<Duration> = None;
        let mut consider = |t: Duration| next = Some(next.map_or(t, |n: Duration| n.min(t)));
        if self.skipped > 0 {
            consider(self.last_rescan + DISPATCH_RESCAN_INTERVAL);
        }
        if let Some(t) = self.unresolved_retry {
            consider(t);
        }
        if let Some((started, _, _)) = self.started.front() {
            consider(*started + DISPATCH_HUNG_AFTER);
        }
        for d in &self.ready {
            let st = &self.dests[d];
            match &st.failing {
                Some(f) => consider(f.next_probe),
                None => {
                    let oldest = st.oldest_queued.unwrap_or(now);
                    consider(oldest + self.linger(st.owner).unwrap_or(Duration::ZERO));
                }
            }
        }
        next.map(|t| t.max(now))
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
