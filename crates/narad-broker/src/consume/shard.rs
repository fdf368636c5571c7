//! Consumer state of one partition (SPEC §2): leases, the acked-ahead and
//! corrupt sets, and the committed frontier.
//!
//! * `next` is the first offset not yet resolved (SPEC's `committed + 1`).
//!   Only it survives a restart (the `consumer.offset` file); leases,
//!   acked-ahead and corrupt sets live in memory, so a crash redelivers
//!   whatever was leased or acked ahead (at-least-once).
//! * A lease is (offset, nonce, expiry); the receipt handle is
//!   `partition:offset:nonce`. Nonces come from one [`Nonces`] counter per
//!   process, shared by every shard of every topic and seeded at start-up
//!   from the wall clock (ms × 2^20), so no shard ever reuses a nonce an
//!   earlier shard of the same partition handed out: not after a delete and
//!   recreate (same name, new shard), an idle close and reopen, or a restart
//!   (an earlier process would have had to lease over 2^20 records per ms
//!   of its life to reach the new seed). A handle from before any of them
//!   therefore never matches a lease held now (SPEC §1.8: 410).
//! * The acked-ahead and corrupt sets together hold at most
//!   `max_acked_ahead` offsets; when they are full only `next` may be
//!   leased, and an ack ahead of the frontier is refused (503) with the lease
//!   kept, so the ack can be retried.
//!
//! Pure state: time comes in as arguments; I/O is the caller's. The one
//! thing shared is a counter every move of the frontier bumps (see
//! [`Shard::tracked`]), so the frontier pass can tell that nothing moved
//! anywhere without looking at every shard.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The source of lease nonces (see the module docs): strictly increasing,
/// never 0, at most 19 decimal digits until the year 2500.
#[derive(Debug)]
pub struct Nonces(AtomicU64);

impl Nonces {
    /// Nonces starting at `wall_ms` × 2^20 (at least 1).
    pub fn seeded(wall_ms: u64) -> Nonces {
        Nonces(AtomicU64::new(wall_ms.saturating_mul(1 << 20).max(1)))
    }

    /// Nonces starting at 1 (for a shard on its own, in tests).
    pub fn from_one() -> Nonces {
        Nonces(AtomicU64::new(1))
    }

    fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// A live lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lease {
    nonce: u64,
    expires_ms: u64,
}

/// Why an ack, extend or nack was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// No live lease with that nonce: expired, re-leased, already acked, or
    /// from before a restart (410).
    #[error("receipt handle no longer matches an active reservation")]
    Stale,
    /// The acked-ahead set is full (503); the lease is kept.
    #[error("acked-ahead set is full; head of queue may be stuck")]
    AheadFull,
}

/// Limits of a shard, from its topic (they can change at runtime).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLimits {
    /// Live leases at most (`max_in_flight_per_partition`).
    pub max_in_flight: usize,
    /// Acked-ahead plus corrupt offsets at most.
    pub max_acked_ahead: usize,
    /// Lease duration (`visibility_timeout_ms`).
    pub visibility_ms: u64,
}

/// The consumer state of one partition.
#[derive(Debug)]
pub struct Shard {
    next: u64,
    leases: HashMap<u64, Lease>,
    expiries: BinaryHeap<Reverse<(u64, u64, u64)>>,
    acked_ahead: BTreeSet<u64>,
    corrupt: BTreeSet<u64>,
    /// Where the next search for an available offset starts: every offset
    /// in `next..free_from` is leased, acked ahead or corrupt. Without it
    /// each reserve re-scanned every live lease from the frontier, so a
    /// consume of 100 at the in-flight cap (1,024) did ~100,000 lookups
    /// under the shard lock (64 consumers got a third of 16's throughput).
    /// Lowered when a lease ends without an ack (nack, expiry).
    free_from: u64,
    nonces: Arc<Nonces>,
    /// The frontier moved since the last persist.
    dirty: bool,
    /// Bumped (after `dirty` is set, under the shard's lock) by every move.
    moves: Arc<AtomicU64>,
}

/// A reservation: the offset to read and its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// The offset leased.
    pub offset: u64,
    /// Its nonce (for the receipt handle).
    pub nonce: u64,
    /// When the lease expires, ms.
    pub expires_ms: u64,
}

impl Shard {
    /// A shard whose first unresolved offset is `next` (from
    /// `consumer.offset`, or the log's oldest offset when there is none),
    /// counting its moves on a counter of its own.
    pub fn new(next: u64) -> Shard {
        Shard::tracked(next, Arc::default(), Arc::new(Nonces::from_one()))
    }

    /// A shard that bumps `moves` every time its frontier moves (or is
    /// marked as not persisted), after setting its dirty flag: whoever reads
    /// a new count and then looks at the shard finds it dirty. Its lease
    /// nonces come from `nonces`.
    pub fn tracked(next: u64, moves: Arc<AtomicU64>, nonces: Arc<Nonces>) -> Shard {
        Shard {
            next,
            leases: HashMap::new(),
            expiries: BinaryHeap::new(),
            acked_ahead: BTreeSet::new(),
            corrupt: BTreeSet::new(),
            free_from: next,
            nonces,
            dirty: false,
            moves,
        }
    }

    /// The first offset not yet resolved.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Live leases.
    pub fn in_flight(&self) -> usize {
        self.leases.len()
    }

    /// Offsets acked ahead of the frontier.
    pub fn acked_ahead(&self) -> usize {
        self.acked_ahead.len()
    }

    /// Offsets skipped as corrupt ahead of the frontier.
    pub fn corrupt_ahead(&self) -> usize {
        self.corrupt.len()
    }

    /// Whether the frontier moved since the last persist.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Takes the "frontier moved" flag (for the persister).
    pub fn take_dirty(&mut self) -> Option<u64> {
        std::mem::take(&mut self.dirty).then_some(self.next)
    }

    /// Marks the frontier as not yet persisted (after a failed persist).
    pub fn mark_dirty(&mut self) {
        self.dirty = true;
        self.moves.fetch_add(1, Ordering::Release);
    }

    /// Releases expired leases; returns how many.
    pub fn purge_expired(&mut self, now_ms: u64) -> usize {
        let mut n = 0;
        while let Some(Reverse((exp, off, nonce))) = self.expiries.peek().copied() {
            if exp > now_ms {
                break;
            }
            self.expiries.pop();
            if self.leases.get(&off) == Some(&Lease { nonce, expires_ms: exp }) {
                self.leases.remove(&off);
                self.free_from = self.free_from.min(off);
                n += 1;
            }
        }
        n
    }

    /// The earliest lease expiry, if any (for a wake-up timer).
    pub fn next_expiry(&mut self) -> Option<u64> {
        while let Some(Reverse((exp, off, nonce))) = self.expiries.peek().copied() {
            if self.leases.get(&off) == Some(&Lease { nonce, expires_ms: exp }) {
                return Some(exp);
            }
            self.expiries.pop();
        }
        None
    }

    /// Whether a limit holds back offsets a consumer could otherwise take:
    /// the in-flight cap, or the acked-ahead cap (only the head may be
    /// leased). Only then can an ack make something takeable.
    pub fn blocked(&self, limits: &ShardLimits) -> bool {
        self.leases.len() >= limits.max_in_flight || self.ahead_full(limits)
    }

    /// How many offsets below `hwm` a consume could lease now (after
    /// [`Shard::purge_expired`]): none while the in-flight cap holds, at
    /// most the head while the acked-ahead set is full, else every offset
    /// from the frontier that is not leased, acked ahead or skipped. A
    /// consume through another node reads it to pick partitions (node RPC
    /// ReadyCounts), so it never counts what [`Shard::reserve`] would not
    /// hand out.
    pub fn ready(&self, hwm: u64, limits: &ShardLimits) -> u64 {
        if self.leases.len() >= limits.max_in_flight || self.next >= hwm {
            return 0;
        }
        if self.ahead_full(limits) {
            return u64::from(!self.leases.contains_key(&self.next));
        }
        // Leases, acked-ahead and corrupt offsets all lie in next..hwm.
        let held = (self.leases.len() + self.acked_ahead.len() + self.corrupt.len()) as u64;
        (hwm - self.next).saturating_sub(held)
    }

    fn ahead_full(&self, limits: &ShardLimits) -> bool {
        self.acked_ahead.len() + self.corrupt.len() >= limits.max_acked_ahead
    }

    /// Leases the lowest available offset below `hwm`, if any (SPEC §2.2).
    /// The caller reads it next; if the read fails it calls
    /// [`Shard::mark_corrupt`].
    pub fn reserve(&mut self, hwm: u64, now_ms: u64, limits: &ShardLimits) -> Option<Reservation> {
        self.purge_expired(now_ms);
        if self.leases.len() >= limits.max_in_flight || self.next >= hwm {
            return None;
        }
        let offset = if self.ahead_full(limits) {
            // Only the head may be leased, so the frontier can move.
            (!self.leases.contains_key(&self.next)).then_some(self.next)?
        } else {
            let mut o = self.next.max(self.free_from);
            while o < hwm
                && (self.leases.contains_key(&o)
                    || self.acked_ahead.contains(&o)
                    || self.corrupt.contains(&o))
            {
                o += 1;
            }
            (o < hwm).then_some(o)?
        };
        let nonce = self.nonces.next();
        let expires_ms = now_ms + limits.visibility_ms;
        self.leases.insert(offset, Lease { nonce, expires_ms });
        self.expiries.push(Reverse((expires_ms, offset, nonce)));
        // Everything from the search's start up to `offset` is taken now.
        self.free_from = self.free_from.max(offset + 1);
        Some(Reservation { offset, nonce, expires_ms })
    }

    fn check(&mut self, offset: u64, nonce: u64, now_ms: u64) -> Result<(), ResolveError> {
        self.purge_expired(now_ms);
        match self.leases.get(&offset) {
            Some(l) if l.nonce == nonce => Ok(()),
            _ => Err(ResolveError::Stale),
        }
    }

    /// Acks a lease (SPEC §2.3); returns whether the frontier moved.
    pub fn ack(
        &mut self,
        offset: u64,
        nonce: u64,
        now_ms: u64,
        limits: &ShardLimits,
    ) -> Result<bool, ResolveError> {
        self.check(offset, nonce, now_ms)?;
        if offset == self.next {
            self.leases.remove(&offset);
            self.next += 1;
            self.advance();
            return Ok(true);
        }
        if self.ahead_full(limits) {
            return Err(ResolveError::AheadFull);
        }
        self.leases.remove(&offset);
        self.acked_ahead.insert(offset);
        Ok(false)
    }

    /// Extends a lease to now + visibility; the handle stays the same.
    pub fn extend(
        &mut self,
        offset: u64,
        nonce: u64,
        now_ms: u64,
        limits: &ShardLimits,
    ) -> Result<(), ResolveError> {
        self.check(offset, nonce, now_ms)?;
        let expires_ms = now_ms + limits.visibility_ms;
        self.leases.insert(offset, Lease { nonce, expires_ms });
        self.expiries.push(Reverse((expires_ms, offset, nonce)));
        Ok(())
    }

    /// Drops a lease so the offset is available again at once.
    pub fn nack(&mut self, offset: u64, nonce: u64, now_ms: u64) -> Result<(), ResolveError> {
        self.check(offset, nonce, now_ms)?;
        self.leases.remove(&offset);
        self.free_from = self.free_from.min(offset);
        Ok(())
    }

    /// Records a reserved offset as permanently unreadable: it resolves like
    /// an ack, so the queue never wedges on it.
    pub fn mark_corrupt(&mut self, offset: u64) {
        self.leases.remove(&offset);
        if offset == self.next {
            self.next += 1;
            self.advance();
        } else if offset > self.next {
            self.corrupt.insert(offset);
        }
    }

    /// Jumps the frontier to `oldest` when retention removed offsets above
    /// it; returns how many offsets were skipped.
    pub fn skip_below(&mut self, oldest: u64) -> u64 {
        if oldest <= self.next {
            return 0;
        }
        let skipped = oldest - self.next;
        self.next = oldest;
        self.leases.retain(|o, _| *o >= oldest);
        self.acked_ahead = self.acked_ahead.split_off(&oldest);
        self.corrupt = self.corrupt.split_off(&oldest);
        self.advance();
        skipped
    }

    fn advance(&mut self) {
        loop {
            if self.acked_ahead.remove(&self.next) || self.corrupt.remove(&self.next) {
                self.next += 1;
            } else {
                break;
            }
        }
        self.mark_dirty();
    }
}

/// Parses a receipt handle `partition:offset:nonce` (ASCII digits, exactly
/// two colons, nonce ≥ 1).
pub fn parse_receipt_handle(h: &str) -> Option<(u32, u64, u64)> {
    let mut parts = h.split(':');
    let (p, o, n) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(p) || !digits(o) || !digits(n) {
        return None;
    }
    let (p, o, n) = (p.parse().ok()?, o.parse().ok()?, n.parse().ok()?);
    (n >= 1).then_some((p, o, n))
}

/// Formats a receipt handle.
pub fn receipt_handle(partition: u32, offset: u64, nonce: u64) -> String {
    format!("{partition}:{offset}:{nonce}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: ShardLimits =
        ShardLimits { max_in_flight: 3, max_acked_ahead: 2, visibility_ms: 1000 };

    #[test]
    fn the_shared_count_moves_with_the_frontier_and_only_with_it() {
        let moves = Arc::new(AtomicU64::new(0));
        let count = || moves.load(Ordering::Acquire);
        let mut s = Shard::tracked(0, moves.clone(), Arc::new(Nonces::from_one()));
        let a = s.reserve(10, 0, &L).unwrap();
        let b = s.reserve(10, 0, &L).unwrap();
        let c = s.reserve(10, 0, &L).unwrap();
        s.extend(c.offset, c.nonce, 1, &L).unwrap();
        s.nack(c.offset, c.nonce, 1).unwrap();
        assert_eq!(s.ack(b.offset, b.nonce, 1, &L), Ok(false));
        assert_eq!(count(), 0, "leases, extends, nacks and acks ahead move nothing");
        assert!(!s.is_dirty());
        assert_eq!(s.ack(a.offset, a.nonce, 1, &L), Ok(true));
        assert_eq!(count(), 1);
        assert!(s.is_dirty());
        assert_eq!(s.take_dirty(), Some(2));
        assert_eq!(count(), 1, "persisting is not a move");
        s.mark_corrupt(2);
        assert_eq!(count(), 2);
        assert_eq!(s.skip_below(1), 0);
        assert_eq!(count(), 2, "retention below the frontier moves nothing");
        assert_eq!(s.skip_below(9), 6);
        assert_eq!(count(), 3);
        s.take_dirty();
        s.mark_dirty();
        assert_eq!(count(), 4, "a failed persist counts, so the next pass retries");
    }

    #[test]
    fn leases_go_to_the_lowest_free_offset_and_acks_move_the_frontier() {
        let mut s = Shard::new(0);
        let a = s.reserve(10, 0, &L).unwrap();
        let b = s.reserve(10, 0, &L).unwrap();
        assert_eq!((a.offset, b.offset), (0, 1));
        assert_eq!(s.ack(b.offset, b.nonce, 1, &L), Ok(false));
        assert_eq!(s.next(), 0);
        assert_eq!(s.ack(a.offset, a.nonce, 1, &L), Ok(true));
        assert_eq!(s.next(), 2, "the frontier jumps over the acked-ahead run");
        assert_eq!(s.take_dirty(), Some(2));
        assert_eq!(s.take_dirty(), None);
    }

    /// The search cursor never hides an offset that became available again,
    /// and leasing goes on after the last lease, not from the frontier.
    #[test]
    fn offsets_freed_by_nack_or_expiry_below_the_last_lease_are_leased_first() {
        let wide = ShardLimits { max_in_flight: 100, max_acked_ahead: 100, visibility_ms: 1000 };
        let mut s = Shard::new(0);
        let r: Vec<Reservation> = (0..6).map(|_| s.reserve(10, 0, &wide).unwrap()).collect();
        assert_eq!(r.iter().map(|x| x.offset).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
        s.nack(3, r[3].nonce, 1).unwrap();
        s.nack(1, r[1].nonce, 1).unwrap();
        assert_eq!(s.reserve(10, 1, &wide).unwrap().offset, 1, "the lowest freed offset");
        assert_eq!(s.reserve(10, 1, &wide).unwrap().offset, 3);
        assert_eq!(s.reserve(10, 1, &wide).unwrap().offset, 6, "then on after the last lease");
        // Acks ahead of the frontier stay taken; the head's ack moves past them.
        s.ack(2, r[2].nonce, 2, &wide).unwrap();
        s.ack(0, r[0].nonce, 2, &wide).unwrap();
        assert_eq!(s.next(), 1);
        // Offsets 1 and 3-6 expire (leased at 0-1, 1 s visibility); 7 is new.
        let late = s.reserve(10, 2, &wide).unwrap();
        assert_eq!(late.offset, 7);
        let again: Vec<u64> = (0..6).map(|_| s.reserve(10, 1_001, &wide).unwrap().offset).collect();
        assert_eq!(again, [1, 3, 4, 5, 6, 8], "expired leases first, in order, 2 stays acked");
    }

    /// `blocked` is what decides whether an ack wakes a waiting consumer:
    /// it must hold exactly while a limit keeps a takeable offset back.
    #[test]
    fn a_shard_is_blocked_exactly_while_a_limit_holds_offsets_back() {
        let mut s = Shard::new(0);
        let r: Vec<Reservation> = (0..3).map(|_| s.reserve(10, 0, &L).unwrap()).collect();
        assert!(s.blocked(&L), "three leases reach max_in_flight");
        assert_eq!(s.reserve(10, 0, &L), None);
        s.ack(r[2].offset, r[2].nonce, 1, &L).unwrap();
        assert!(!s.blocked(&L), "one slot free, one ack ahead");
        let d = s.reserve(10, 1, &L).unwrap();
        assert_eq!(d.offset, 3);
        s.ack(d.offset, d.nonce, 1, &L).unwrap();
        assert!(s.blocked(&L), "two acks ahead reach max_acked_ahead");
        assert_eq!(s.reserve(10, 1, &L), None, "only the head may be leased, and it is");
        s.ack(r[0].offset, r[0].nonce, 1, &L).unwrap();
        assert!(s.blocked(&L), "the frontier moved to 1, still leased, 2 and 3 still ahead");
        s.ack(r[1].offset, r[1].nonce, 1, &L).unwrap();
        assert!(!s.blocked(&L), "the frontier passes the acked-ahead run");
        assert_eq!(s.reserve(10, 1, &L).map(|x| x.offset), Some(4));
    }

    #[test]
    fn nothing_past_the_high_watermark_and_at_most_max_in_flight() {
        let mut s = Shard::new(0);
        for _ in 0..3 {
            assert!(s.reserve(10, 0, &L).is_some());
        }
        assert_eq!(s.reserve(10, 0, &L), None, "max in flight");
        let mut t = Shard::new(5);
        assert_eq!(t.reserve(5, 0, &L), None);
    }

    #[test]
    fn a_new_shard_of_a_partition_never_reuses_an_earlier_shards_nonce() {
        let nonces = Arc::new(Nonces::seeded(1_800_000_000_000));
        let mut old = Shard::tracked(0, Arc::default(), nonces.clone());
        let a = old.reserve(10, 0, &L).unwrap();
        // The topic is deleted and recreated: a new shard, same offsets.
        let mut new = Shard::tracked(0, Arc::default(), nonces.clone());
        let b = new.reserve(10, 0, &L).unwrap();
        assert_eq!((a.offset, b.offset), (0, 0));
        assert_eq!(new.ack(0, a.nonce, 1, &L), Err(ResolveError::Stale), "the old handle");
        assert_eq!(new.ack(0, b.nonce, 1, &L), Ok(true));
        // A restart seeds from a later wall clock: above every nonce used.
        let later = Nonces::seeded(1_800_000_000_001);
        assert!(later.next() > b.nonce);
        // Within the handle's wire format (digits, nonce >= 1) for centuries.
        let h = receipt_handle(107, u64::MAX, Nonces::seeded(16_725_225_600_000).next());
        assert!(parse_receipt_handle(&h).is_some(), "{h}");
    }

    #[test]
    fn an_expired_lease_is_redelivered_with_a_new_nonce_and_the_old_handle_is_stale() {
        let mut s = Shard::new(0);
        let a = s.reserve(1, 0, &L).unwrap();
        assert_eq!(s.reserve(1, 500, &L), None);
        let b = s.reserve(1, 1000, &L).unwrap();
        assert_eq!(b.offset, 0);
        assert_ne!(a.nonce, b.nonce);
        assert_eq!(s.ack(0, a.nonce, 1001, &L), Err(ResolveError::Stale));
        assert_eq!(s.ack(0, b.nonce, 1001, &L), Ok(true));
        assert_eq!(s.ack(0, b.nonce, 1001, &L), Err(ResolveError::Stale), "acked once");
    }

    #[test]
    fn extend_keeps_the_message_invisible_and_the_handle_valid() {
        let mut s = Shard::new(0);
        let a = s.reserve(1, 0, &L).unwrap();
        s.extend(0, a.nonce, 900, &L).unwrap();
        assert_eq!(s.reserve(1, 1500, &L), None, "still leased");
        assert_eq!(s.ack(0, a.nonce, 1800, &L), Ok(true));
    }

    #[test]
    fn nack_makes_the_message_available_at_once() {
        let mut s = Shard::new(0);
        let a = s.reserve(1, 0, &L).unwrap();
        s.nack(0, a.nonce, 1).unwrap();
        let b = s.reserve(1, 2, &L).unwrap();
        assert_eq!(b.offset, 0);
        assert_eq!(s.nack(0, a.nonce, 3), Err(ResolveError::Stale));
    }

    #[test]
    fn a_full_acked_ahead_set_refuses_acks_ahead_but_keeps_the_lease() {
        let limits = ShardLimits { max_in_flight: 10, max_acked_ahead: 1, visibility_ms: 1000 };
        let mut s = Shard::new(0);
        let r: Vec<Reservation> = (0..3).map(|_| s.reserve(10, 0, &limits).unwrap()).collect();
        assert_eq!(s.ack(1, r[1].nonce, 1, &limits), Ok(false));
        assert_eq!(s.ack(2, r[2].nonce, 1, &limits), Err(ResolveError::AheadFull));
        // Full: only the head may be leased, and it is taken.
        assert_eq!(s.reserve(10, 1, &limits), None);
        assert_eq!(s.ack(0, r[0].nonce, 2, &limits), Ok(true));
        assert_eq!(s.next(), 2);
        // The refused ack can be retried: its lease was kept.
        assert_eq!(s.ack(2, r[2].nonce, 3, &limits), Ok(true));
        assert_eq!(s.next(), 3);
    }

    #[test]
    fn corrupt_offsets_resolve_so_the_queue_never_wedges() {
        let mut s = Shard::new(0);
        let a = s.reserve(3, 0, &L).unwrap();
        let b = s.reserve(3, 0, &L).unwrap();
        s.mark_corrupt(b.offset);
        assert_eq!(s.corrupt_ahead(), 1);
        s.ack(a.offset, a.nonce, 1, &L).unwrap();
        assert_eq!(s.next(), 2);
        let c = s.reserve(3, 1, &L).unwrap();
        assert_eq!(c.offset, 2);
    }

    #[test]
    fn retention_gaps_are_skipped_in_one_step() {
        let mut s = Shard::new(0);
        let _ = s.reserve(100, 0, &L).unwrap();
        assert_eq!(s.skip_below(50), 50);
        assert_eq!(s.next(), 50);
        assert_eq!(s.in_flight(), 0);
        assert_eq!(s.skip_below(10), 0);
    }

    #[test]
    fn receipt_handles_round_trip_and_malformed_ones_are_refused() {
        assert_eq!(parse_receipt_handle(&receipt_handle(2, 17, 5)), Some((2, 17, 5)));
        for bad in ["", "1:2", "1:2:3:4", "a:2:3", "1:2:0", "-1:2:3", "1: 2:3", "1:2:+3", "1::3"] {
            assert_eq!(parse_receipt_handle(bad), None, "{bad:?}");
        }
    }
}
