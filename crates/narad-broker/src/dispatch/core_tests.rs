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

/// Re-places every record a rescan hands out, each resolved to its own
/// partition (`alive` says whether that partition's owner is alive).
fn rescan_all(c: &mut Core, now: Duration, topo: &dyn Topology, alive: bool) -> Vec<Placed> {
    let seqs = c.begin_rescan(now, topo);
    seqs.into_iter()
        .map(|seq| {
            let r = wal_record(seq, 2);
            let t = Target::Commit { dest: dest(2), owner: 2, alive, partitions: 4 };
            c.place_skipped(Item { seq, record: r }, t, topo, now)
        })
        .collect()
}

#[test]
fn a_failed_commit_holds_nothing_and_its_owner_is_pinged_not_sent_records() {
    let mut c = Core::new(0);
    for _ in 0..4 {
        place(&mut c, 2, Duration::ZERO);
    }
    let o = c.take_orders(Duration::ZERO, &unbounded).pop().unwrap();
    place(&mut c, 2, MS); // queued behind the failing commit
    c.finish(o.id, &o.dest, o.items, Outcome::Failed, 2 * MS);
    for s in 0..5 {
        assert_eq!(c.mark(s), Some(Mark::Skipped), "every record back in the WAL");
    }
    assert_eq!((c.held(), c.held_bytes()), (0, 0));
    // New records for a failing destination stay in the WAL too.
    assert_eq!(place(&mut c, 2, 3 * MS), Placed::Skipped);
    assert!(c.take_orders(1002 * MS, &unbounded).is_empty(), "no record is sent to test it");
    assert!(c.take_pings(500 * MS).is_empty(), "pinged once a second");
    assert_eq!(c.take_pings(1002 * MS), vec![2]);
    assert!(c.take_pings(1003 * MS).is_empty(), "one ping at a time");
    // The ping comes back: a trial; the rescan puts the records back in order.
    c.finish_ping(2, true, 1010 * MS);
    assert!(c.rescan_due(1010 * MS));
    assert!(rescan_all(&mut c, 1010 * MS, &AllAlive(4), true).iter().all(|p| *p == Placed::Queued));
    let trial = c.take_orders(1010 * MS, &unbounded).pop().unwrap();
    assert!(trial.probe, "the trial runs on the probe budget");
    assert_eq!(seqs(&trial), vec![0], "a trial carries one record");
    c.finish(trial.id, &trial.dest, trial.items, Outcome::Committed, 1020 * MS);
    let rest = c.take_orders(1020 * MS, &unbounded).pop().unwrap();
    assert!(!rest.probe);
    assert_eq!(seqs(&rest), vec![1, 2, 3, 4, 5]);
    c.finish(rest.id, &rest.dest, rest.items, Outcome::Committed, 1030 * MS);
    assert_eq!(c.checkpoint(), 6);
    assert!(c.troubled().is_empty(), "recovered");
}

#[test]
fn a_failed_trial_keeps_the_time_of_the_first_failure_so_the_reroute_grace_is_not_reset() {
    let mut c = Core::new(0);
    place(&mut c, 2, Duration::ZERO);
    let o = c.take_orders(Duration::ZERO, &unbounded).pop().unwrap();
    c.finish(o.id, &o.dest, o.items, Outcome::Failed, 10 * MS);
    assert_eq!(c.take_pings(1_010 * MS), vec![2]);
    c.finish_ping(2, true, 1_020 * MS);
    rescan_all(&mut c, 1_020 * MS, &AllAlive(4), true);
    let trial = c.take_orders(1_020 * MS, &unbounded).pop().unwrap();
    c.finish(trial.id, &trial.dest, trial.items, Outcome::Failed, 2_000 * MS);
    let t = c.troubled();
    assert_eq!(t[0].failing, Some((Duration::ZERO, ProbeState::Waiting)));
    // 3 s after the first failure, its records go to a sibling.
    assert_eq!(
        rescan_all(&mut c, 3_000 * MS, &AllAlive(4), true),
        vec![Placed::Rerouted(3, false)]
    );
}

#[test]
fn one_ping_serves_every_failing_destination_of_an_owner() {
    let mut c = Core::new(0);
    for p in 0..3 {
        let seq = c.read_next();
        let t = Target::Commit { dest: dest(p), owner: 9, alive: true, partitions: 4 };
        c.place_new(Item { seq, record: wal_record(seq, p) }, t, &AllAlive(4), Duration::ZERO);
    }
    for o in c.take_orders(Duration::ZERO, &unbounded) {
        c.finish(o.id, &o.dest, o.items, Outcome::Failed, MS);
    }
    assert_eq!(c.take_pings(2_000 * MS), vec![9]);
    c.finish_ping(9, false, 2_100 * MS);
    assert!(c.troubled().iter().all(|t| t.failing.unwrap().1 == ProbeState::Waiting));
    assert!(c.take_pings(2_500 * MS).is_empty());
    assert_eq!(c.take_pings(3_100 * MS), vec![9]);
}

#[test]
fn after_three_seconds_of_failures_records_go_to_a_healthy_sibling() {
    let mut c = Core::new(0);
    place(&mut c, 1, Duration::ZERO);
    let o = c.take_orders(Duration::ZERO, &unbounded).pop().unwrap();
    c.finish(o.id, &o.dest, o.items, Outcome::Failed, 10 * MS);
    assert_eq!(place(&mut c, 1, 2_000 * MS), Placed::Skipped);
    assert_eq!(place(&mut c, 1, 3_001 * MS), Placed::Rerouted(2, false));
    // The failed record itself goes there too, at the next rescan.
    let again = c.begin_rescan(3_001 * MS, &AllAlive(4));
    assert_eq!(again, vec![0, 1]);
    for seq in again {
        let placed = c.place_skipped(
            Item { seq, record: wal_record(seq, 1) },
            target(1),
            &AllAlive(4),
            3_001 * MS,
        );
        assert_eq!(placed, Placed::Rerouted(2, false));
    }
    let orders = c.take_orders(3_001 * MS, &unbounded);
    assert_eq!(orders.len(), 1);
    assert_eq!((orders[0].dest.partition, seqs(&orders[0])), (2, vec![2, 0, 1]));
    assert_eq!(c.stats().rerouted, 3);
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
fn once_the_owner_is_dead_every_record_left_for_it_is_rerouted_at_the_next_rescan() {
    let mut c = Core::new(0);
    for _ in 0..10 {
        place(&mut c, 2, Duration::ZERO);
    }
    let o = c.take_orders(Duration::ZERO, &unbounded).pop().unwrap();
    c.finish(o.id, &o.dest, o.items, Outcome::Failed, 10 * MS);
    // Within the grace, alive by membership: they wait.
    assert!(rescan_all(&mut c, 1_000 * MS, &AllAlive(4), true).is_empty());
    // Membership marks the owner dead (the next record resolves so).
    let seq = c.read_next();
    let dead = Target::Commit { dest: dest(2), owner: 2, alive: false, partitions: 4 };
    let placed =
        c.place_new(Item { seq, record: wal_record(seq, 2) }, dead, &AllAlive(4), 1_500 * MS);
    assert_eq!(placed, Placed::Rerouted(3, true));
    let placed = rescan_all(&mut c, 1_500 * MS, &AllAlive(4), false);
    assert_eq!(placed.len(), 10);
    assert!(placed.iter().all(|p| *p == Placed::Rerouted(3, true)));
    let o = c.take_orders(1_500 * MS, &unbounded).pop().unwrap();
    assert_eq!(o.items.len(), 11);
    c.finish(o.id, &o.dest, o.items, Outcome::Committed, 1_510 * MS);
    assert_eq!(c.checkpoint(), 11, "nothing waits for the dead owner");
}

#[test]
fn a_destination_that_cannot_commit_pins_the_checkpoint_but_never_the_reader() {
    // One topic's only partition fails for good (no sibling to reroute
    // to); another topic keeps committing: far more records than the old
    // 16-window horizon go past the stuck one.
    let mut c = Core::new(0);
    let stuck = Dest { topic: "stuck".into(), partition: 0 };
    let seq = c.read_next();
    let t = Target::Commit { dest: stuck.clone(), owner: 7, alive: true, partitions: 1 };
    c.place_new(Item { seq, record: wal_record(seq, 0) }, t.clone(), &AllAlive(4), Duration::ZERO);
    let o = c.take_orders(Duration::ZERO, &unbounded).pop().unwrap();
    c.finish(o.id, &o.dest, o.items, Outcome::Failed, MS);
    let mut now = 2 * MS;
    let mut committed = 0u64;
    let total = 3 * DISPATCH_LOOKAHEAD_WINDOWS * DISPATCH_WINDOW_MIN;
    while committed < total as u64 {
        assert!(c.wants_read(), "the reader stopped after {committed} records");
        let seq = c.read_next();
        if seq.is_multiple_of(1_000) {
            c.place_new(Item { seq, record: wal_record(seq, 0) }, t.clone(), &AllAlive(4), now);
        } else {
            place(&mut c, 0, now);
        }
        if c.held() >= 64 {
            for o in c.take_orders(now, &unbounded) {
                committed += o.items.len() as u64;
                c.finish(o.id, &o.dest, o.items, Outcome::Committed, now);
            }
        }
        if c.rescan_due(now) {
            assert!(c.begin_rescan(now, &AllAlive(4)).is_empty(), "nothing to read for it");
        }
        now += Duration::from_micros(50);
    }
    assert_eq!(c.checkpoint(), 0, "the stuck record pins the checkpoint");
    assert!(c.skipped() as u64 > total as u64 / 1_000, "its records wait in the WAL");
    assert!(c.parked() > 0, "and fell out of the dense strip");
    assert_eq!(c.uncommitted(), c.skipped() + c.held());
    let t = c.troubled();
    assert_eq!((t.len(), t[0].skipped), (1, c.skipped()));
}

#[test]
fn refusals_back_off_from_ten_milliseconds_doubling_to_a_second_and_a_commit_resets_it() {
    let mut c = Core::new(0);
    place(&mut c, 0, Duration::ZERO);
    let mut now = Duration::ZERO;
    let mut waits = Vec::new();
    for _ in 0..9 {
        let o = c.take_orders(now, &unbounded).pop().expect("an order");
        c.finish(o.id, &o.dest, o.items, Outcome::Refused, now);
        let refused_at = now;
        // The destination takes nothing until the back-off ends.
        assert_eq!(place(&mut c, 0, now), Placed::Skipped);
        loop {
            now += MS;
            let seqs = if c.rescan_due(now) { c.begin_rescan(now, &AllAlive(4)) } else { vec![] };
            if seqs.is_empty() {
                continue;
            }
            waits.push((now - refused_at).as_millis());
            for seq in seqs {
                let item = Item { seq, record: wal_record(seq, 0) };
                c.place_skipped(item, target(0), &AllAlive(4), now);
            }
            break;
        }
    }
    assert_eq!(waits, vec![10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
    let o = c.take_orders(now, &unbounded).pop().unwrap();
    c.finish(o.id, &o.dest, o.items, Outcome::Committed, now);
    place(&mut c, 0, now);
    let o = c.take_orders(now, &unbounded).pop().unwrap();
    c.finish(o.id, &o.dest, o.items, Outcome::Refused, now);
    assert!(c.troubled()[0].skipped > 0);
    assert!(c.begin_rescan(now + 9 * MS, &AllAlive(4)).is_empty());
    assert!(!c.begin_rescan(now + 10 * MS, &AllAlive(4)).is_empty(), "reset to 10 ms");
    assert_eq!(c.stats().failed_commits, 0, "a refusal is not a failure");
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
    assert!(!c.rescan_due(5 * MS), "after a back-off");
    assert!(c.rescan_due(12 * MS));
    // Resolved again: the topic incarnation is gone for good.
    let seqs = c.begin_rescan(12 * MS, &AllAlive(4));
    assert_eq!(seqs, vec![0, 1]);
    for seq in seqs {
        let item = Item { seq, record: wal_record(seq, 0) };
        assert_eq!(
            c.place_skipped(item, Target::Discard, &AllAlive(4), 12 * MS),
            Placed::Discarded
        );
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
fn the_reader_stops_at_the_window_of_held_records() {
    let mut c = Core::new(0);
    let mut n = 0u32;
    while c.wants_read() {
        let p = n % 8;
        let seq = c.read_next();
        let t = Target::Commit { dest: dest(p), owner: u64::from(p), alive: true, partitions: 8 };
        c.place_new(Item { seq, record: wal_record(seq, p) }, t, &AllAlive(8), Duration::ZERO);
        n += 1;
        assert!(n < 100_000);
    }
    assert_eq!(c.held(), 4 * DISPATCH_WINDOW_MIN);
}

#[test]
fn one_full_destination_leaves_its_records_in_the_wal_and_the_reader_reads_on() {
    let mut c = Core::new(0);
    for _ in 0..100_000 {
        assert!(c.wants_read());
        place(&mut c, 0, Duration::ZERO);
    }
    // One destination may hold at most its cap; the rest waits in the WAL.
    assert_eq!(c.held(), DISPATCH_WINDOW_MIN);
    assert_eq!(c.skipped(), 100_000 - DISPATCH_WINDOW_MIN);
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
        if c.rescan_due(now) {
            for seq in c.begin_rescan(now, &AllAlive(4)) {
                let item = Item { seq, record: big_record(seq, 0, &mib) };
                c.place_skipped(item, target(0), &AllAlive(4), now);
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
        if c.rescan_due(now) {
            for seq in c.begin_rescan(now, &topo) {
                assert_eq!(c.mark(seq), Some(Mark::Skipped), "seed {seed}");
                let r = wal[seq as usize].clone();
                let t = target_of(&r);
                if let Placed::Rerouted(..) =
                    c.place_skipped(Item { seq, record: r }, t, &topo, now)
                {
                    ever_rerouted.insert(seq);
                }
            }
        }
        for owner in c.take_pings(now) {
            c.finish_ping(owner, !chaos || rng.chance(1, 2), now);
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
