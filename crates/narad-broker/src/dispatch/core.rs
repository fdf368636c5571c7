//! The dispatcher's decisions, as a state machine with no I/O and no clock
//! of its own: the driver feeds it WAL records, commit and ping results and
//! the time, and carries out the commit and ping orders it returns. Tests
//! drive it with a fake owner and fake time.
//!
//! # State
//! Every sequence number between the checkpoint `C` and the read frontier
//! `R` is in one of three states ([`Mark`]):
//! * **Done**: committed, or discarded (topic deleted);
//! * **Held**: queued on its destination, or in a commit in flight;
//! * **Skipped**: left in the WAL, to be read again by a rescan.
//!
//! The checkpoint is the first sequence number not Done, so it never passes
//! a record that is not committed. Marks live in a dense strip from `base`
//! (the first not-Done number the strip still covers) to `R`, at most 16
//! windows long; a not-Done number that falls out of the strip's front is
//! *parked* in a sparse map, so a record that cannot be committed now pins
//! the checkpoint (and the WAL behind it) but never the reader. Every
//! Skipped record is also listed on its destination (or, unresolved, in one
//! list of its own), so a rescan reads only the records that may go
//! somewhere now, never the whole strip.
//!
//! Each destination (topic, partition) has a queue and at most one commit in
//! flight.
//!
//! # Rules (the v3 "Dispatch stage", and issue 34)
//! * Window: records held (queued or in flight, hung commits aside) stay
//!   below `clamp(64 × destinations, 4,096, 65,536)` and below 256 MiB of
//!   encoded bytes (plus the one record read last). Skipped records do not
//!   count: the reader reads on whatever any destination does. A
//!   destination's queue holds at most `max(window / 4, 4,096)` records and
//!   128 MiB.
//! * A commit carries at most 64 MiB (or its owner's tighter budget), well
//!   under the partition log's 512 MiB commit limit, and at least one
//!   record.
//! * At most 16 commits in flight; one running past 1 s is *hung*: it
//!   stops counting, whatever queued behind it goes back to the WAL, and its
//!   destination takes nothing new until it lands.
//! * Linger: while other commits are in flight, a destination with fewer
//!   than 64 records waits until twice its owner's moving-average commit
//!   latency has passed since its oldest queued record, at most 50 ms.
//! * A failed commit sends all its records, and whatever queued behind
//!   them, back to the WAL; the destination is *failing*. It holds no
//!   record: once a second its owner is pinged ([`Core::take_pings`], one
//!   ping per owner however many of its destinations fail); a ping that
//!   comes back opens a *trial*: the destination takes records again and
//!   its next commit, of one record on the short probe budget, decides
//!   (what queued behind it waits for the answer). A trial that fails
//!   keeps the time of the first failure.
//! * After 3 s of failures (from the start of the first failed attempt), or
//!   at once if membership marks the owner dead, records for it go to the
//!   next healthy sibling partition (a trial aside, while its owner is
//!   alive).
//! * A refused commit (the owner answered: another incarnation, not the
//!   owner) sends its records back to the WAL without marking failure; the
//!   destination takes nothing for a back-off of 10 ms, doubling with each
//!   refusal in a row up to 1 s, reset by a commit.
//! * A record is skipped (left in the WAL) when its destination is failing
//!   (outside a trial), backing off, hung, full, or already has an earlier
//!   skipped record (order), or when its owner does not resolve yet.
//!   Rescans read skipped records again in WAL order, only those of
//!   destinations that can take them (or reroute them) now: at once when a
//!   destination recovers or drains, and at least once a second.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::sync::Arc;
use std::time::Duration;

use narad_wal::WalRecord;

use crate::limits::{
    DISPATCH_COMMIT_MAX_BYTES, DISPATCH_COMMIT_SLOTS, DISPATCH_DEST_QUEUE_MAX_BYTES,
    DISPATCH_FAILING_FORGET_AFTER, DISPATCH_FAILURE_BACKOFF, DISPATCH_HUNG_AFTER,
    DISPATCH_LINGER_MAX, DISPATCH_LOOKAHEAD_WINDOWS, DISPATCH_REFUSAL_BACKOFF_MAX,
    DISPATCH_REFUSAL_BACKOFF_MIN, DISPATCH_REROUTE_GRACE, DISPATCH_RESCAN_INTERVAL,
    DISPATCH_TARGET_PER_DEST, DISPATCH_UNRESOLVED_RETRY, DISPATCH_WINDOW_MAX,
    DISPATCH_WINDOW_MAX_BYTES, DISPATCH_WINDOW_MIN,
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
    /// The trial commit of a failing destination (the short probe budget).
    pub probe: bool,
}

/// How a commit ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Durable and visible on the owner.
    Committed,
    /// Refused without failure (e.g. another topic incarnation): the records
    /// go back to the WAL and are resolved again after a short back-off;
    /// the destination is not marked failing.
    Refused,
    /// Failed (error, timeout, unreachable owner).
    Failed,
}

/// Where a failing destination stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeState {
    /// Waiting for the next ping.
    Waiting,
    /// Its owner's ping is out.
    Pinging,
    /// The ping came back: the next commit decides.
    Trial,
}

impl ProbeState {
    /// The state's name in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeState::Waiting => "waiting",
            ProbeState::Pinging => "pinging",
            ProbeState::Trial => "trial",
        }
    }
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

#[derive(Debug, Clone, Copy)]
struct Failing {
    /// The start of the first failed attempt in a row.
    since: Duration,
    /// When the next ping goes out (state `Waiting`).
    next_ping: Duration,
    state: ProbeState,
}

#[derive(Debug, Clone, Copy)]
struct Refusal {
    /// Takes nothing before this.
    until: Duration,
    /// The back-off that set `until` (doubles with the next refusal).
    delay: Duration,
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
    refused: Option<Refusal>,
    /// This destination's Skipped records (a rescan takes them from the
    /// front, in WAL order).
    skipped: BTreeSet<u64>,
}

impl DestState {
    fn idle(&self) -> bool {
        self.queue.is_empty()
            && self.in_flight.is_none()
            && self.failing.is_none()
            && self.refused.is_none()
            && self.skipped.is_empty()
    }

    fn hung(&self) -> bool {
        self.in_flight.as_ref().is_some_and(|f| f.hung)
    }

    /// Failing outside a trial: takes nothing.
    fn shut(&self) -> bool {
        self.failing.is_some_and(|f| f.state != ProbeState::Trial)
    }

    fn backing_off(&self, now: Duration) -> bool {
        self.refused.is_some_and(|r| now < r.until)
    }

    /// Room for `n` more queued records.
    fn room(&self, cap: usize) -> usize {
        if self.queued_bytes >= DISPATCH_DEST_QUEUE_MAX_BYTES {
            return 0;
        }
        cap.saturating_sub(self.queue.len())
    }

    /// Whether its own records go to a sibling now.
    fn reroutes(&self, now: Duration) -> bool {
        !self.alive
            || self.failing.is_some_and(|f| {
                f.state != ProbeState::Trial
                    && now.saturating_sub(f.since) >= DISPATCH_REROUTE_GRACE
            })
    }

    /// Whether it can take a record itself now (order aside).
    fn takes(&self, now: Duration, cap: usize) -> bool {
        !self.shut() && !self.hung() && !self.backing_off(now) && self.room(cap) > 0
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
    /// Commits refused.
    pub refused_commits: u64,
    /// Commits that became hung.
    pub hung_commits: u64,
}

/// One destination that is not healthy, for metrics
/// ([`Core::troubled`]).
#[derive(Debug, Clone)]
pub struct Trouble {
    /// The destination.
    pub dest: Dest,
    /// Its owner.
    pub owner: OwnerId,
    /// Failing since (the dispatcher's clock), with its probe state.
    pub failing: Option<(Duration, ProbeState)>,
    /// Its records left in the WAL.
    pub skipped: usize,
}

/// The dispatcher state machine.
#[derive(Debug)]
pub struct Core {
    /// The first sequence number the dense strip covers.
    base: u64,
    /// Marks of `[base, read_next)`; its front is never Done.
    marks: VecDeque<Mark>,
    /// Not-Done sequence numbers below `base` (Held or Skipped).
    parked: BTreeMap<u64, Mark>,
    dests: HashMap<Dest, DestState>,
    /// Destinations with a queue and nothing in flight.
    ready: BTreeSet<Dest>,
    /// Destinations failing (any probe state).
    failing: BTreeSet<Dest>,
    /// Owners with a ping out.
    pinging: HashSet<OwnerId>,
    /// Skipped records with no destination yet (unresolved, or taken by a
    /// rescan that could not read them).
    unresolved: BTreeSet<u64>,
    held: usize,
    /// Encoded bytes of the held records.
    held_bytes: usize,
    in_flight: usize,
    skipped: usize,
    /// Records between the checkpoint and the frontier not Done.
    uncommitted: usize,
    window: usize,
    owner_latency: HashMap<OwnerId, Duration>,
    /// Non-hung orders in start order, for hung detection: (start, id, dest).
    started: VecDeque<(Duration, u64, Dest)>,
    rescan_asap: bool,
    /// A rescan is due at this time (a back-off ends).
    rescan_at: Option<Duration>,
    last_rescan: Duration,
    unresolved_retry: Option<Duration>,
    next_order: u64,
    stats: CoreStats,
}

impl Core {
    /// A dispatcher resuming at `checkpoint`.
    pub fn new(checkpoint: u64) -> Core {
        Core {
            base: checkpoint,
            marks: VecDeque::new(),
            parked: BTreeMap::new(),
            dests: HashMap::new(),
            ready: BTreeSet::new(),
            failing: BTreeSet::new(),
            pinging: HashSet::new(),
            unresolved: BTreeSet::new(),
            held: 0,
            held_bytes: 0,
            in_flight: 0,
            skipped: 0,
            uncommitted: 0,
            window: DISPATCH_WINDOW_MIN,
            owner_latency: HashMap::new(),
            started: VecDeque::new(),
            rescan_asap: false,
            rescan_at: None,
            last_rescan: Duration::ZERO,
            unresolved_retry: None,
            next_order: 1,
            stats: CoreStats::default(),
        }
    }

    /// The first sequence number not done.
    pub fn checkpoint(&self) -> u64 {
        self.parked.keys().next().map_or(self.base, |&p| p.min(self.base))
    }

    /// The next sequence number the reader should read.
    pub fn read_next(&self) -> u64 {
        self.base + self.marks.len() as u64
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

    /// Records read and not yet committed (or discarded): held, in hung
    /// commits, or left in the WAL.
    pub fn uncommitted(&self) -> usize {
        self.uncommitted
    }

    /// Not-Done records that fell out of the dense strip's front.
    pub fn parked(&self) -> usize {
        self.parked.len()
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
        if seq >= self.read_next() || seq < self.checkpoint() {
            return None;
        }
        if seq < self.base {
            return Some(self.parked.get(&seq).copied().unwrap_or(Mark::Done));
        }
        self.marks.get(usize::try_from(seq - self.base).ok()?).copied()
    }

    /// Every destination that is failing or has records left in the WAL.
    pub fn troubled(&self) -> Vec<Trouble> {
        let mut out: Vec<Trouble> = self
            .dests
            .iter()
            .filter(|(_, st)| st.failing.is_some() || !st.skipped.is_empty())
            .map(|(d, st)| Trouble {
                dest: d.clone(),
                owner: st.owner,
                failing: st.failing.map(|f| (f.since, f.state)),
                skipped: st.skipped.len(),
            })
            .collect();
        out.sort_by(|a, b| a.dest.cmp(&b.dest));
        out
    }

    /// Whether the reader may read another new record: held records stay
    /// below the window (but at least four destinations' worth, so a hot
    /// partition never takes more than half) and below the byte window.
    /// Records left in the WAL do not count.
    pub fn wants_read(&self) -> bool {
        let limit = self.window.max(4 * self.per_dest_cap());
        self.held < limit && self.held_bytes < DISPATCH_WINDOW_MAX_BYTES
    }

    fn linger(&self, owner: OwnerId) -> Option<Duration> {
        self.owner_latency.get(&owner).map(|lat| (*lat * 2).min(DISPATCH_LINGER_MAX))
    }

    fn per_dest_cap(&self) -> usize {
        (self.window / 4).max(DISPATCH_WINDOW_MIN)
    }

    fn set_mark(&mut self, seq: u64, m: Mark) {
        if seq >= self.base {
            let i = (seq - self.base) as usize;
            self.marks[i] = m;
        } else if m == Mark::Done {
            self.parked.remove(&seq);
        } else {
            self.parked.insert(seq, m);
        }
        if m == Mark::Done {
            self.uncommitted -= 1;
        }
    }

    /// Marks `seq` (now Held or Skipped) Skipped and lists it on `dest`.
    fn skip_on(&mut self, dest: &Dest, seq: u64) {
        self.set_mark(seq, Mark::Skipped);
        self.skipped += 1;
        self.dests.get_mut(dest).expect("destination exists").skipped.insert(seq);
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
        self.uncommitted += 1;
        let placed = self.place(item, target, topo, now);
        self.advance();
        placed
    }

    /// Places a record a rescan read again (one of [`Core::begin_rescan`]'s).
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

    /// Gives back records [`Core::begin_rescan`] handed out that the driver
    /// could not read: they stay in the WAL, looked at by the next rescan.
    pub fn unread(&mut self, seqs: impl IntoIterator<Item = u64>) {
        for seq in seqs {
            debug_assert_eq!(self.mark(seq), Some(Mark::Skipped));
            self.unresolved.insert(seq);
        }
    }

    /// `item` is currently marked Skipped (and counted in `self.skipped`)
    /// and listed nowhere.
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
                self.unresolved.insert(item.seq);
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
        if st.reroutes(now)
            && let Some(to) = self.healthy_sibling(&dest, partitions, topo, cap, now)
        {
            self.enqueue(&to, item, now);
            self.stats.rerouted += 1;
            return Placed::Rerouted(to.partition, !alive);
        }
        let st = self.dests.get_mut(&dest).expect("inserted above");
        let earlier_skipped = st.skipped.first().is_some_and(|&s| s < item.seq);
        if !st.takes(now, cap) || earlier_skipped {
            st.skipped.insert(item.seq);
            return Placed::Skipped;
        }
        self.enqueue(&dest, item, now);
        Placed::Queued
    }

    /// The next partition up (wrapping) whose owner is alive and whose
    /// destination takes records now; `None` if there is none.
    fn healthy_sibling(
        &mut self,
        dest: &Dest,
        partitions: u32,
        topo: &dyn Topology,
        cap: usize,
        now: Duration,
    ) -> Option<Dest> {
        for step in 1..partitions {
            let p = (dest.partition + step) % partitions;
            let Some((owner, alive)) = topo.owner_of(&dest.topic, p) else { continue };
            if !alive {
                continue;
            }
            let cand = Dest { topic: dest.topic.clone(), partition: p };
            let fits = self.dests.get(&cand).is_none_or(|st| {
                st.failing.is_none() && st.takes(now, cap) && st.skipped.is_empty()
            });
            if fits {
                let st = self.dests.entry(cand.clone()).or_default();
                st.owner = owner;
                st.alive = alive;
                st.partitions = partitions;
                return Some(cand);
            }
        }
        None
    }

    /// Whether [`Core::healthy_sibling`] would find one, without changing
    /// anything.
    fn has_healthy_sibling(
        &self,
        dest: &Dest,
        partitions: u32,
        topo: &dyn Topology,
        cap: usize,
        now: Duration,
    ) -> bool {
        (1..partitions).any(|step| {
            let p = (dest.partition + step) % partitions;
            topo.owner_of(&dest.topic, p).is_some_and(|(_, alive)| alive)
                && self.dests.get(&Dest { topic: dest.topic.clone(), partition: p }).is_none_or(
                    |st| st.failing.is_none() && st.takes(now, cap) && st.skipped.is_empty(),
                )
        })
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

    /// Starts a rescan: the skipped records to read again, in WAL order
    /// (the driver re-places each with [`Core::place_skipped`], or gives it
    /// back with [`Core::unread`]). A destination gives up as many of its
    /// oldest as it has room for, if it takes records now or reroutes them
    /// to a sibling that does; the others stay listed and cost nothing.
    pub fn begin_rescan(&mut self, now: Duration, topo: &dyn Topology) -> Vec<u64> {
        self.last_rescan = now;
        self.rescan_asap = false;
        self.rescan_at = None;
        self.unresolved_retry = None;
        let mut out = Vec::new();
        if self.skipped == 0 {
            return out;
        }
        let cap = self.per_dest_cap();
        let mut takes: Vec<(Dest, usize)> = Vec::new();
        for (d, st) in &self.dests {
            if st.skipped.is_empty() {
                continue;
            }
            let n = if st.takes(now, cap) {
                st.room(cap)
            } else if st.reroutes(now) && self.has_healthy_sibling(d, st.partitions, topo, cap, now)
            {
                cap
            } else {
                0
            };
            if n > 0 {
                takes.push((d.clone(), n));
            }
            if let Some(r) = st.refused.filter(|r| now < r.until) {
                self.rescan_at = Some(self.rescan_at.map_or(r.until, |t| t.min(r.until)));
            }
        }
        for (d, n) in takes {
            let st = self.dests.get_mut(&d).expect("listed above");
            for _ in 0..n {
                match st.skipped.pop_first() {
                    Some(seq) => out.push(seq),
                    None => break,
                }
            }
        }
        for _ in 0..self.window {
            match self.unresolved.pop_first() {
                Some(seq) => out.push(seq),
                None => break,
            }
        }
        if !self.unresolved.is_empty() {
            self.unresolved_retry = Some(now + DISPATCH_UNRESOLVED_RETRY);
        }
        out.sort_unstable();
        out
    }

    /// Whether a rescan is due.
    pub fn rescan_due(&self, now: Duration) -> bool {
        self.skipped > 0
            && (self.rescan_asap
                || now.saturating_sub(self.last_rescan) >= DISPATCH_RESCAN_INTERVAL
                || self.rescan_at.is_some_and(|t| now >= t)
                || self.unresolved_retry.is_some_and(|t| now >= t))
    }

    /// The owners to ping now: one ping per owner with a failing
    /// destination whose wait is over and no ping out. Their destinations
    /// wait for [`Core::finish_ping`].
    pub fn take_pings(&mut self, now: Duration) -> Vec<OwnerId> {
        let mut out = Vec::new();
        let mut forget = Vec::new();
        for d in &self.failing {
            let st = self.dests.get_mut(d).expect("failing destinations exist");
            let Some(f) = st.failing.as_mut() else { continue };
            let unused = st.skipped.is_empty() && st.queue.is_empty() && st.in_flight.is_none();
            if unused && now.saturating_sub(f.since) >= DISPATCH_FAILING_FORGET_AFTER {
                // No record wants it: stop pinging (a record that comes
                // finds it fresh, and its commit decides again).
                forget.push(d.clone());
                continue;
            }
            if f.state != ProbeState::Waiting || now < f.next_ping {
                continue;
            }
            f.state = ProbeState::Pinging;
            if self.pinging.insert(st.owner) {
                out.push(st.owner);
            }
        }
        for d in forget {
            self.set_failing(&d, None);
            if self.dests.get(&d).is_some_and(DestState::idle) {
                self.dests.remove(&d);
            }
        }
        out
    }

    /// Applies the answer to a ping of `owner`: each of its failing
    /// destinations waiting for it opens a trial (`alive`) or waits a
    /// second more.
    pub fn finish_ping(&mut self, owner: OwnerId, alive: bool, now: Duration) {
        self.pinging.remove(&owner);
        let mut recovered = Vec::new();
        for d in &self.failing {
            let st = self.dests.get_mut(d).expect("failing destinations exist");
            if st.owner != owner {
                continue;
            }
            let Some(f) = st.failing.as_mut() else { continue };
            if f.state != ProbeState::Pinging {
                continue;
            }
            if !alive {
                f.state = ProbeState::Waiting;
                f.next_ping = now + DISPATCH_FAILURE_BACKOFF;
            } else if st.skipped.is_empty() && st.queue.is_empty() && st.in_flight.is_none() {
                // Nothing waits for it: the owner answering is all there is
                // to know.
                recovered.push(d.clone());
            } else {
                f.state = ProbeState::Trial;
                self.rescan_asap |= !st.skipped.is_empty();
            }
        }
        for d in recovered {
            self.set_failing(&d, None);
            if self.dests.get(&d).is_some_and(DestState::idle) {
                self.dests.remove(&d);
            }
        }
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
            let (owner, trial, queued) = {
                let st = &self.dests[&dest];
                (st.owner, st.failing.is_some(), st.queue.len())
            };
            // Small batches linger while other commits run (a trial goes
            // at once).
            let lingering = !trial
                && queued < DISPATCH_TARGET_PER_DEST
                && self.in_flight > 0
                && self.linger(owner).is_some_and(|l| now < oldest + l);
            if lingering {
                continue;
            }
            let budget = max_bytes(owner)
                .map_or(DISPATCH_COMMIT_MAX_BYTES, |b| b.min(DISPATCH_COMMIT_MAX_BYTES));
            let st = self.dests.get_mut(&dest).expect("ready destinations exist");
            let mut items = Vec::new();
            let mut bytes = 0usize;
            while let Some(next) = st.queue.front() {
                let size = encoded_size(&next.record);
                // A trial carries one record: if it fails too, one
                // record may land twice, not a whole batch.
                if !items.is_empty() && (trial || bytes + size > budget) {
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
            orders.push(Order { id, dest, owner, items, probe: trial });
        }
        orders
    }

    /// Sends what `dest` queued back to the WAL (listed on it).
    fn return_queue(&mut self, dest: &Dest) {
        let st = self.dests.get_mut(dest).expect("destination exists");
        let returned: Vec<u64> = st.queue.drain(..).map(|i| i.seq).collect();
        self.held -= returned.len();
        self.held_bytes -= std::mem::take(&mut st.queued_bytes);
        st.oldest_queued = None;
        for seq in returned {
            self.skip_on(dest, seq);
        }
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
            self.held_bytes -= f.bytes;
            self.stats.hung_commits += 1;
            // Whatever queued behind it goes back to the WAL.
            self.return_queue(&dest);
        }
    }

    fn set_failing(&mut self, dest: &Dest, f: Option<Failing>) {
        let st = self.dests.get_mut(dest).expect("destination exists");
        st.failing = f;
        if f.is_some() {
            self.failing.insert(dest.clone());
        } else {
            self.failing.remove(dest);
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
        match outcome {
            Outcome::Committed => {
                let lat = now.saturating_sub(f.started);
                let ema = self.owner_latency.entry(st.owner).or_insert(lat);
                *ema = (*ema * 7 + lat) / 8;
                st.refused = None;
                if st.failing.is_some() || !st.skipped.is_empty() {
                    self.rescan_asap = true;
                }
                self.set_failing(dest, None);
                self.stats.committed += items.len() as u64;
                for it in &items {
                    self.set_mark(it.seq, Mark::Done);
                }
            }
            Outcome::Refused => {
                // The owner answered: the destination is not failing. These
                // records, and whatever queued behind them, go back to the
                // WAL in order, to be resolved again after the back-off.
                self.stats.refused_commits += 1;
                let delay = st.refused.map_or(DISPATCH_REFUSAL_BACKOFF_MIN, |r| {
                    (r.delay * 2).min(DISPATCH_REFUSAL_BACKOFF_MAX)
                });
                st.refused = Some(Refusal { until: now + delay, delay });
                self.rescan_at = Some(self.rescan_at.map_or(now + delay, |t| t.min(now + delay)));
                self.set_failing(dest, None);
                self.return_queue(dest);
                for it in &items {
                    self.skip_on(dest, it.seq);
                }
            }
            Outcome::Failed => {
                self.stats.failed_commits += 1;
                let since = st.failing.map_or(f.started, |x| x.since);
                let failing = Failing {
                    since,
                    next_ping: now + DISPATCH_FAILURE_BACKOFF,
                    state: ProbeState::Waiting,
                };
                self.set_failing(dest, Some(failing));
                // Nothing is held for a failing destination: every record
                // goes back to the WAL, to be rerouted or tried again.
                self.return_queue(dest);
                for it in &items {
                    self.skip_on(dest, it.seq);
                }
            }
        }
        let st = self.dests.get_mut(dest).expect("exists");
        if st.in_flight.is_none() && !st.queue.is_empty() {
            self.ready.insert(dest.clone());
        }
        if f.hung {
            // Its destination can take records again.
            self.rescan_asap |= !st.skipped.is_empty();
        }
        self.advance();
        // Forget idle destinations: the window follows the fan-out in use.
        if self.dests.get(dest).is_some_and(DestState::idle) {
            self.dests.remove(dest);
        }
    }

    /// Moves the strip's base over its Done prefix, and parks the front of
    /// a strip longer than 16 windows.
    fn advance(&mut self) {
        let horizon = DISPATCH_LOOKAHEAD_WINDOWS * self.window;
        loop {
            match self.marks.front() {
                Some(Mark::Done) => {}
                Some(&m) if self.marks.len() > horizon => {
                    self.parked.insert(self.base, m);
                }
                _ => return,
            }
            self.marks.pop_front();
            self.base += 1;
        }
    }

    /// The earliest time something becomes due (linger, ping, hung,
    /// rescan).
    pub fn next_deadline(&self, now: Duration) -> Option<Duration> {
        let mut next: Option<Duration> = None;
        let mut consider = |t: Duration| next = Some(next.map_or(t, |n: Duration| n.min(t)));
        if self.skipped > 0 {
            consider(self.last_rescan + DISPATCH_RESCAN_INTERVAL);
        }
        if let Some(t) = self.unresolved_retry {
            consider(t);
        }
        if let Some(t) = self.rescan_at {
            consider(t);
        }
        if let Some((started, _, _)) = self.started.front() {
            consider(*started + DISPATCH_HUNG_AFTER);
        }
        for d in &self.failing {
            if let Some(f) = self.dests[d].failing.filter(|f| f.state == ProbeState::Waiting) {
                consider(f.next_ping);
            }
        }
        for d in &self.ready {
            let st = &self.dests[d];
            let oldest = st.oldest_queued.unwrap_or(now);
            consider(oldest + self.linger(st.owner).unwrap_or(Duration::ZERO));
        }
        next.map(|t| t.max(now))
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
