use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use narad_fs::SimRng;
use narad_wal::{RecordRef, record};

use super::*;

const MS: Duration = Duration::from_millis(1);

struct AllAlive(u32);
impl Topology for AllAlive {
    fn owner_of(&self, _topic: &str, partition: u32) -> Option<(OwnerId, bool)> {
        (partition < self.0).then_some((u64::from(partition), true))
    }
}

fn wal_record(seq: u64, partition: u32) -> WalRecord {
    let payload = format!("m{seq}");
    let r = RecordRef {
        topic: "t",
        incarnation: Some(1),
        key: None,
        partition,
        accepted_at_ms: 0,
        payload: payload.as_bytes(),
    };
    let mut buf = Vec::new();
    r.encode_into(&mut buf);
    record::decode(seq, &Bytes::from(buf)).unwrap()
}

fn dest(p: u32) -> Dest {
    Dest { topic: "t".into(), partition: p }
}

fn target(p: u32) -> Target {
    Target::Commit { dest: dest(p), owner: u64::from(p), alive: true, partitions: 4 }
}

fn place(core: &mut Core, p: u32, now: Duration) -> Placed {
    let seq = core.read_next();
    core.place_new(Item { seq, record: wal_record(seq, p) }, target(p), &AllAlive(4), now)
}

fn unbounded(_: OwnerId) -> Option<usize> {
    None
}

fn seqs(o: &Order) -> Vec<u64> {
    o.items.iter().map(|i| i.seq).collect()
}

#[test]
fn a_commit_that_lands_moves_the_checkpoint() {
    let mut c = Core::new(10);
    for _ in 0..3 {
        assert_eq!(place(&mut c, 0, Duration::ZERO), Placed::Queued);
    }
    let orders = c.take_orders(Duration::ZERO, &unbounded);
    assert_eq!(orders.len(), 1);
    assert_eq!(seqs(&orders[0]), vec![10, 11, 12]);
    assert_eq!(c.checkpoint(), 10);
    let o = orders.into_iter().next().unwrap();
    c.finish(o.id, &o.dest, o.items, Outcome::Committed, MS);
    assert_eq!(c.checkpoint(), 13);
    assert_eq!(c.held(), 0);
}

#[test]
fn one_commit_in_flight_per_destination_and_the_queue_becomes_the_next_batch() {
    let mut c = Core::new(0);
    place(&mut c, 0, Duration::ZERO);
    let first = c.take_orders(Duration::ZERO, &unbounded).pop().unwrap();
    for _ in 0..5 {
        place(&mut c, 0, MS);
    }
    assert!(c.take_orders(MS, &unbounded).is_empty(), "second commit while one in flight");
    c.finish(first.id, &first.dest, first.items, Outcome::Committed, 2 * MS);
    let next = c.take_orders(2 * MS, &unbounded);
    assert_eq!(seqs(&next[0]), vec![1, 2, 3, 4, 5]);
}

#[test]
fn the_checkpoint_waits_for_the_oldest_uncommitted_record() {
    let mut c = Core::new(0);
    place(&mut c, 0, Duration::ZERO);
    place(&mut c, 1, Duration::ZERO);
    let mut orders = c.take_orders(Duration::ZERO, &unbounded);
    orders.sort_by_key(|o| o.dest.partition);
    let second = orders.pop().unwrap();
    c.finish(second.id, &second.dest, second.items, Outcome::Committed, MS);
    assert_eq!(c.checkpoint(), 0, "seq 0 is still in flight");
    let first = orders.pop().unwrap();
    c.finish(first.id, &first.dest, first.items, Outcome::Committed, MS);
    assert_eq!(c.checkpoint(), 2);
}

#[test]
fn at_most_sixteen_commits_run_at_once() {
    let mut c = Core::new(0);
    for p in 0..20 {
        let seq = c.read_next();
        let t = Target::Commit { dest: dest(p), owner: 0, alive: true, partitions: 20 };
        c.place_new(Item { seq, record: wal_record(seq, p) }, t, &AllAlive(20), Duration::ZERO);
    }
    let orders = c.take_orders(Duration::ZERO, &unbounded);
    assert_eq!(orders.len(), 16);
    let o = orders.into_iter().next().unwrap();
    c.finish(o.id, &o.dest, o.items, Outcome::Committed, MS);
    // Past any linger, one more slot is free.
    assert_eq!(c.take_orders(100 * MS, &unbounded).len(), 1);
}

#[test]
fn small_batches_linger_only_while_other_commits_run() {
    let mut c = Core::new(0);
    // Measure owner 1's latency: 10 ms.
    place(&mut c, 1, Duration::ZERO);
    let o = c.take_orders(Duration::ZERO, &unbounded).pop().unwrap();
    c.finish(o.id, &o.dest, o.items, Outcome::Committed, 10 * MS);
    // Nothing else in flight: commit at once.
    place(&mut c, 1, 10 * MS);
    let o = c.take_orders(10 * MS, &unbounded).pop().unwrap();
    // Now another destination is busy; a small batch for owner 1 lingers
    // for twice its latency.
    place(&mut c, 0, 11 * MS);
    let busy = c.take_orders(11 * MS, &unbounded).pop().unwrap();
    c.finish(o.id, &o.dest, o.items, Outcome::Committed, 20 * MS);
    place(&mut c, 1, 21 * MS);
    assert!(c.take_orders(21 * MS, &unbounded).is_empty(), "should linger");
    assert!(c.next_deadline(21 * MS).unwrap() <= 21 * MS + 20 * MS);
    let late = c.take_orders(45 * MS, &unbounded);
    assert_eq!(late.len(), 1);
    c.finish(busy.id, &busy.dest, busy.items, Outcome::Committed, 46 * MS);
}

#[test]
fn a_full_batch_does_not_linger() {
    let mut c = Core::new(0);
    place(&mut c, 1, Duration::ZERO);
    let o = c.take_orders(Duration::ZERO, &unbounded).pop().unwrap();
    c.finish(o.id, &o.dest, o.items, Outcome::Committed, 10 * MS);
    place(&mut c, 0, 10 * MS);
    let _busy = c.take_orders(10 * MS, &unbounded);
    for _ in 0..DISPATCH_TARGET_PER_DEST {
        place(&mut c, 1, 11 * MS);
    }
    assert_eq!(c.take_orders(11 * MS, &unbounded).len(), 1);
}

#[test]
fn a_failed_commit_keeps_one_probe_and_returns_the_rest_to_the_wal() {
    let mut c = Core::new(0);
    for _ in 0..4 {
        place(&mut c, 2, Duration::ZERO);
    }
    let o = c.take_orders(Duration::ZERO, &unbounded).pop().unwrap();
    place(&mut c, 2, MS); // queued behind the failing commit
    c.finish(o.id, &o.dest, o.items, Outcome::Failed, 2 * MS);
    assert_eq!(c.mark(0), Some(Mark::Held), "the probe");
    for s in 1..5 {
        assert_eq!(c.mark(s), Some(Mark::Skipped));
    }
    // New records for a failing destination stay in the WAL.
    assert_eq!(place(&mut c, 2, 3 * MS), Placed::Skipped);
    // The probe goes out alone, once a second.
    assert!(c.take_orders(500 * MS, &unbounded).is_empty());
    let probe = c.take_orders(1002 * MS, &unbounded).pop().unwrap();
    assert!(probe.probe);
    assert_eq!(seqs(&probe), vec![0]);
    c.finish(probe.id, &probe.dest, probe.items, Outcome::Committed, 1003 * MS);
    assert_eq!(c.checkpoint(), 1);
    // Recovery triggers a rescan that puts the skipped records back, in order.
    assert!(c.rescan_due(1003 * MS));
    let (from, to) = c.begin_rescan(1003 * MS).unwrap();
    assert_eq!((from, to), (1, 6));
    for seq in from..to {
        let placed = c.place_skipped(
            Item { seq, record: wal_record(seq, 2) },
            target(2),
            &AllAlive(4),
            1003 * MS,
        );
        assert_eq!(placed, Placed::Queued);
    }
    let all = c.take_orders(1003 * MS, &unbounded).pop().unwrap();
    assert_eq!(seqs(&all), vec![1, 2, 3, 4, 5]);
}

#[test]
fn after_three_seconds_of_failures_records_go_to_a_healthy_sibling() {
    let mut c = Core::new(0);
    place(&mut c, 1, Duration::ZERO);
    let o = c.take_orders(Duration::ZERO, &unbounded).pop().unwrap();
    c.finish(o.id, &o.dest, o.items, Outcome::Failed, 10 * MS);
    assert_eq!(place(&mut c, 1, 2_000 * MS), Placed::Skipped);
    assert_eq!(place(&mut c, 1, 3_001 * MS), Placed::Rerouted(2, false));
    // The sibling commits; the probe keeps testing the original.
    let orders = c.take_orders(3_001 * MS, &unbounded);
    let parts: BTreeSet<u32> = orders.iter().map(|o| o.dest.partition).collect();
    assert_eq!(parts, BTreeSet::from([1, 2]));
    assert_eq!(c.stats().rerouted, 1);
}

#[test]
fn a_dead_owner_reroutes_at_once() {
    let mut c = Core::new(0);
    let t = Target::Commit { dest: dest(3), owner: 3, alive: false, partitions: 4 };
    let seq = c.read_next();
    let placed =
        c.place_new(Item { seq, record: wal_record(seq, 3) }, t, &AllAlive(4), Duration::ZERO);
    assert_eq!(placed, Placed::Rerouted(0, true));
}

#[test]
fn a_hung_commit_frees_its_slot_and_returns_its_queue_to_the_wal() {
    let mut c = Core::new(0);
    place(&mut c, 0, Duration::ZERO);
    let hung = c.take_orders(Duration::ZERO, &unbounded).pop().unwrap();
    place(&mut c, 0, 10 * MS);
    assert_eq!(c.in_flight(), 1);
    c.tick(1_001 * MS);
    assert_eq!(c.in_flight(), 0, "a hung commit stops counting");
    assert_eq!(c.mark(1), Some(Mark::Skipped));
    assert_eq!(place(&mut c, 0, 1_002 * MS), Placed::Skipped, "takes nothing while hung");
    c.finish(hung.id, &hung.dest, hung.items, Outcome::Committed, 5_000 * MS);
    assert_eq!(c.checkpoint(), 1);
    assert!(c.rescan_due(5_000 * MS));
}

#[test]
fn a_refused_commit_sends_its_records_back_without_marking_failure() {
    let mut c = Core::new(0);
    place(&mut c, 0, Duration::ZERO);
    let o = c.take_orders(Duration::ZERO, &unbounded).pop().unwrap();
    place(&mut c, 0, MS);
    c.finish(o.id, &o.dest, o.items, Outcome::Refused, 2 * MS);
    assert_eq!((c.mark(0), c.mark(1)), (Some(Mark::Skipped), Some(Mark::Skipped)));
    assert!(c.rescan_due(2 * MS));
    // Resolved again: the topic incarnation is gone for good.
    let (from, to) = c.begin_rescan(2 * MS).unwrap();
    for seq in from..to {
        let item = Item { seq, record: wal_record(seq, 0) };
        assert_eq!(c.place_skipped(item, Target::Discard, &AllAlive(4), 2 * MS), Placed::Discarded);
    }
    assert_eq!(c.checkpoint(), 2);
    assert_eq!(c.stats().failed_commits, 0);
}

#[test]
fn unresolved_records_wait_in_the_wal_and_are_looked_up_again_soon() {
    let mut c = Core::new(0);
    let seq = c.read_next();
    let item = Item { seq, record: wal_record(seq, 0) };
    assert_eq!(c.place_new(item, Target::Wait, &AllAlive(4), Duration::ZERO), Placed::Skipped);
    assert!(!c.rescan_due(5 * MS));
    assert!(c.rescan_due(10 * MS));
}

#[test]
fn the_remote_byte_budget_splits_a_batch_but_always_sends_one_record() {
    let mut c = Core::new(0);
    for _ in 0..5 {
        place(&mut c, 0, Duration::ZERO);
    }
    let o = c.take_orders(Duration::ZERO, &|_| Some(70)).pop().unwrap();
    assert_eq!(o.items.len(), 2);
    let mut c = Core::new(0);
    place(&mut c, 0, Duration::ZERO);
    assert_eq!(c.take_orders(Duration::ZERO, &|_| Some(1)).pop().unwrap().items.len(), 1);
}

#[test]
fn the_reader_stops_at_the_window() {
    let mut c = Core::new(0);
    let mut n = 0;
    while c.wants_read() {
        place(&mut c, 0, Duration::ZERO);
        n += 1;
        assert!(n < 100_000);
    }
    // One destination may hold at most its cap; the rest waits in the WAL.
    assert_eq!(c.held(), DISPATCH_WINDOW_MIN);
    assert!(c.skipped() > 0);
}

/// A record whose payload is `payload` (shared, not copied: a test can
/// hold thousands of "1 MiB records" in a few MiB).
fn big_record(seq: u64, partition: u32, payload: &Bytes) -> WalRecord {
    let mut r = wal_record(seq, partition);
    r.payload = payload.clone();
    r
}

#[test]
fn no_commit_exceeds_the_dispatch_byte_budget_even_for_an_unbounded_owner() {
    // A backlog of one partition beyond the partition log's commit limit,
    // fed in as the reader would: commit after commit, none above the
    // budget (so the log never refuses one), every record exactly once.
    let mib = Bytes::from(vec![7u8; 1 << 20]);
    let mut c = Core::new(0);
    let total = (narad_log::limits::MAX_COMMIT_BYTES as usize >> 20) + 64;
    let mut committed = 0;
    let mut now = Duration::ZERO;
    let mut orders_seen = 0;
    while committed < total {
        while c.wants_read() && c.read_next() < total as u64 {
            let seq = c.read_next();
            let item = Item { seq, record: big_record(seq, 0, &mib) };
            c.place_new(item, target(0), &AllAlive(4), now);
        }
        if let Some((from, to)) = c.rescan_due(now).then(|| c.begin_rescan(now)).flatten() {
            for seq in from..to {
                if c.mark(seq) == Some(Mark::Skipped) {
                    let item = Item { seq, record: big_record(seq, 0, &mib) };
                    c.place_skipped(item, target(0), &AllAlive(4), now);
                }
            }
        }
        let orders = c.take_orders(now, &unbounded);
        assert!(!orders.is_empty() || c.rescan_due(now + 2_000 * MS), "dispatch stalled");
        for o in orders {
            let bytes: usize = o.items.iter().map(|i| encoded_size(&i.record)).sum();
            assert!(
                bytes <= DISPATCH_COMMIT_MAX_BYTES,
                "a commit of {bytes} bytes is over the {DISPATCH_COMMIT_MAX_BYTES}-byte budget"
            );
            committed += o.items.len();
            orders_seen += 1;
            c.finish(o.id, &o.dest, o.items, Outcome::Committed, now + MS);
        }
        now += 2_000 * MS;
    }
    assert_eq!(c.checkpoint(), total as u64);
    assert!(orders_seen > 1);
    assert_eq!((c.held(), c.held_bytes()), (0, 0));
}

#[test]
fn the_reader_stops_at_the_byte_window_with_big_records() {
    // ~1 MiB records over many partitions: the record window alone would
    // admit tens of thousands (tens of GiB); the byte window stops it.
    let mib = Bytes::from(vec![7u8; 1 << 20]);
    let mut c = Core::new(0);
    let mut n = 0u32;
    while c.wants_read() && n < 100_000 {
        let seq = c.read_next();
        let p = n % 64;
        let t = Target::Commit { dest: dest(p), owner: u64::from(p), alive: true, partitions: 64 };
        c.place_new(
            Item { seq, record: big_record(seq, p, &mib) },
            t,
            &AllAlive(64),
            Duration::ZERO,
        );
        n += 1;
    }
    let record = encoded_size(&big_record(0, 0, &mib));
    assert!(
        c.held_bytes() < DISPATCH_WINDOW_MAX_BYTES + record,
        "{} bytes held in {} records",
        c.held_bytes(),
        c.held()
    );
}

/// A randomized run against a fake owner: commits land, fail, hang and are
/// refused at random while time moves; then everything is allowed to
/// succeed. Every record is committed exactly once, records of a partition
/// that were never rerouted commit in WAL order, and the checkpoint never
/// passes an uncommitted record.
#[test]
fn random_runs_commit_every_record_once_and_never_lie_with_the_checkpoint() {
    for seed in 0..300 {
        run_random(seed);
    }
}

fn run_random(seed: u64) {
    let mut rng = SimRng::new(seed);
    let parts = 1 + rng.below(6) as u32;
    let topo = AllAlive(parts);
    let total = 200 + rng.below(400);
    let mut c = Core::new(0);
    let mut wal: Vec<WalRecord> = Vec::new();
    let mut now = Duration::ZERO;
    let mut in_flight: Vec<(Order, Duration, Outcome)> = Vec::new();
    let mut committed: BTreeMap<u64, u32> = BTreeMap::new();
    let mut last_in_partition: BTreeMap<u32, u64> = BTreeMap::new();
    let mut ever_rerouted: BTreeSet<u64> = BTreeSet::new();
    let mut chaos = true;
    let target_of = |r: &WalRecord| Target::Commit {
        dest: dest(r.partition),
        owner: u64::from(r.partition),
        alive: true,
        partitions: parts,
    };
    for step in 0..200_000 {
        if step == 20_000 {
            chaos = false;
        }
        now += Duration::from_micros(rng.range(0, 20_000));
        // Produce.
        while (wal.len() as u64) < total && rng.chance(1, 2) {
            let seq = wal.len() as u64;
            wal.push(wal_record(seq, rng.below(u64::from(parts)) as u32));
        }
        // Read new records.
        while c.wants_read() && (c.read_next() as usize) < wal.len() {
            let r = wal[c.read_next() as usize].clone();
            let t = target_of(&r);
            let seq = r.seq;
            if let Placed::Rerouted(..) = c.place_new(Item { seq, record: r }, t, &topo, now) {
                ever_rerouted.insert(seq);
            }
        }
        c.tick(now);
        if c.rescan_due(now)
            && let Some((from, to)) = c.begin_rescan(now)
        {
            for seq in from..to {
                if c.mark(seq) == Some(Mark::Skipped) {
                    let r = wal[seq as usize].clone();
                    let t = target_of(&r);
                    if let Placed::Rerouted(..) =
                        c.place_skipped(Item { seq, record: r }, t, &topo, now)
                    {
                        ever_rerouted.insert(seq);
                    }
                }
            }
        }
        for o in c.take_orders(now, &unbounded) {
            let roll = rng.below(100);
            let outcome = if !chaos || roll < 80 {
                Outcome::Committed
            } else if roll < 90 {
                Outcome::Failed
            } else {
                Outcome::Refused
            };
            let delay = if chaos && rng.chance(1, 20) {
                Duration::from_millis(1_500)
            } else {
                Duration::from_micros(rng.range(100, 30_000))
            };
            in_flight.push((o, now + delay, outcome));
        }
        // Land the commits that are due.
        let mut i = 0;
        while i < in_flight.len() {
            if in_flight[i].1 <= now {
                let (o, _, outcome) = in_flight.swap_remove(i);
                if outcome == Outcome::Committed {
                    for it in &o.items {
                        assert!(
                            committed.insert(it.seq, o.dest.partition).is_none(),
                            "seed {seed}: seq {} committed twice",
                            it.seq
                        );
                        if !ever_rerouted.contains(&it.seq) {
                            let last = last_in_partition.insert(o.dest.partition, it.seq);
                            assert!(
                                last.is_none_or(|l| l < it.seq),
                                "seed {seed}: partition {} out of order",
                                o.dest.partition
                            );
                        }
                    }
                }
                c.finish(o.id, &o.dest, o.items, outcome, now);
                for s in 0..c.checkpoint() {
                    assert!(committed.contains_key(&s), "seed {seed}: checkpoint passed seq {s}");
                }
            } else {
                i += 1;
            }
        }
        if !chaos && c.checkpoint() == total && wal.len() as u64 == total {
            assert_eq!(committed.len() as u64, total, "seed {seed}");
            if c.held() == 0 {
                assert_eq!(c.held_bytes(), 0, "seed {seed}: held bytes leak");
            }
            return;
        }
    }
    panic!("seed {seed}: dispatch never finished (checkpoint {} of {total})", c.checkpoint());
}
