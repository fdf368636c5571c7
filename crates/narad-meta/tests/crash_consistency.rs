//! Crash consistency of the metastore on the simulated file system.
//!
//! A seeded workload of random commands runs against a store on `SimFs`; the
//! power is cut at a random file-system operation (or an fsync fails), the
//! disk crashes (dropping, tearing or holing unsynced writes), and the store
//! is reopened. The recovered state must be exactly the state after the last
//! command whose propose returned `Ok`, or after the command that was in
//! flight: every acknowledged command survives, nothing is half applied.
//!
//! The crash modes are `DropUnsynced` and `Torn` (a prefix of the unsynced
//! writes survives, the last one cut at any byte). `TornWithHoles` is left
//! out on purpose: it zeroes whole sectors of the cut write even where they
//! overwrite existing bytes, and redb rewrites its header page in place on
//! every commit, so a hole there erases the file's magic number. A real disk
//! leaves an overwritten sector old or new, not zero; zeros are what
//! never-written *new* blocks read as, which matters to append-only files,
//! not to this one.

mod support;

use narad_fs::{CrashMode, FaultKind, SimFs, SimRng};
use narad_meta::{Command, CreateTopicRequest, MetaError, MetaState, MetaWriter, apply};

use support::{open, random_command};

const COMMANDS: usize = 40;

/// What a run acknowledged before its disk failed.
struct Outcome {
    /// The state after the last acknowledged command.
    acked: MetaState,
    /// The state after the command in flight when the disk failed, if any.
    in_flight: Option<MetaState>,
    /// Whether a storage failure ended the run.
    failed: bool,
}

/// Runs the workload of `seed` until it ends or the disk fails.
fn run_workload(fs: &SimFs, seed: u64) -> Outcome {
    let mut rng = SimRng::new(seed);
    let store = match open(fs) {
        Ok(store) => store,
        Err(_) => return Outcome { acked: MetaState::default(), in_flight: None, failed: true },
    };
    for _ in 0..COMMANDS {
        let acked = store.snapshot();
        let Some(command) = random_command(&mut rng, &acked) else { continue };
        match store.propose(command.clone()) {
            Ok(_) => {}
            Err(MetaError::Storage(_)) => {
                let next = apply(&acked, acked.applied_index() + 1, &command).ok();
                let in_flight = next.map(|a| a.state);
                return Outcome { acked: (*acked).clone(), in_flight, failed: true };
            }
            Err(_) => assert_eq!(*store.snapshot(), *acked, "a refused command changes nothing"),
        }
    }
    Outcome { acked: (*store.snapshot()).clone(), in_flight: None, failed: false }
}

fn crash_mode(rng: &mut SimRng) -> CrashMode {
    [CrashMode::DropUnsynced, CrashMode::Torn][rng.below(2) as usize]
}

/// Reopens after the crash and checks the recovered state against the run,
/// then checks the store still takes writes and keeps them. Returns whether
/// the command in flight survived.
fn check_recovery(fs: &SimFs, outcome: &Outcome, what: &str) -> bool {
    let store = open(fs).unwrap_or_else(|e| panic!("{what}: reopen after crash failed: {e}"));
    let recovered = store.snapshot();
    let matches_acked = *recovered == outcome.acked;
    let matches_in_flight = outcome.in_flight.as_ref() == Some(&*recovered);
    assert!(
        matches_acked || matches_in_flight,
        "{what}: recovered state at index {} is neither the acknowledged one (index {}) nor the \
         one in flight",
        recovered.applied_index(),
        outcome.acked.applied_index()
    );
    let request = CreateTopicRequest { name: "after-crash".into(), ..Default::default() };
    store.create_topic(request).unwrap_or_else(|e| panic!("{what}: write after recovery: {e}"));
    let expected = store.snapshot();
    drop(store);
    let reopened = open(fs).unwrap();
    assert_eq!(*reopened.snapshot(), *expected, "{what}: state after a clean reopen");
    !matches_acked
}

#[test]
fn a_power_cut_at_any_operation_keeps_exactly_the_acknowledged_commands() {
    let (mut failed_runs, mut recovered_in_flight) = (0, 0);
    for seed in 0..300 {
        let dry = SimFs::new(seed);
        run_workload(&dry, seed);
        let ops = dry.op_count();

        let fs = SimFs::new(seed);
        let mut rng = SimRng::new(seed ^ 0x5eed);
        let cut = rng.below(ops + 1);
        fs.power_cut_at(cut);
        let outcome = run_workload(&fs, seed);
        let mode = crash_mode(&mut rng);
        fs.crash(mode);
        let what = format!("seed {seed}, cut at op {cut} of {ops}, {mode:?}");
        failed_runs += usize::from(outcome.failed);
        recovered_in_flight += usize::from(check_recovery(&fs, &outcome, &what));
    }
    assert!(failed_runs > 250, "only {failed_runs} of 300 runs were cut short");
    eprintln!("{recovered_in_flight} runs recovered the command in flight");
}

#[test]
fn a_failed_fsync_poisons_the_store_and_recovery_keeps_the_acknowledged_commands() {
    let mut failed_runs = 0;
    for seed in 0..100 {
        let dry = SimFs::new(seed);
        run_workload(&dry, seed);
        let ops = dry.op_count();

        let fs = SimFs::new(seed);
        let mut rng = SimRng::new(seed ^ 0xfa11);
        let at = rng.below(ops + 1);
        fs.inject(at, FaultKind::SyncError);
        let outcome = run_workload(&fs, seed);
        failed_runs += usize::from(outcome.failed);
        let mode = crash_mode(&mut rng);
        fs.crash(mode);
        check_recovery(
            &fs,
            &outcome,
            &format!("seed {seed}, fsync failure at op {at} of {ops}, {mode:?}"),
        );
    }
    assert!(failed_runs > 50, "only {failed_runs} of 100 runs hit the failing fsync");
}

#[test]
fn a_poisoned_store_refuses_writes_but_keeps_serving_reads() {
    let fs = SimFs::new(7);
    let store = open(&fs).unwrap();
    store.create_topic(CreateTopicRequest { name: "kept".into(), ..Default::default() }).unwrap();
    fs.inject(fs.op_count(), FaultKind::SyncError);
    let lost = CreateTopicRequest { name: "lost".into(), ..Default::default() };
    let first = store.create_topic(lost.clone()).unwrap_err();
    assert_eq!(first.status(), 500);
    let again = store.create_topic(lost).unwrap_err();
    assert!(again.to_string().contains("unavailable after an earlier storage failure"), "{again}");
    assert!(store.topic("kept").is_some());
    assert!(store.topic("lost").is_none());
    let delete =
        store.propose(Command::DeleteTopic(narad_meta::DeleteTopic { name: "kept".into() }));
    assert!(matches!(delete, Err(MetaError::Storage(_))));
    drop(store);
    fs.crash(CrashMode::DropUnsynced);
    let reopened = open(&fs).unwrap();
    assert!(reopened.topic("kept").is_some());
    assert!(reopened.topic("lost").is_none());
}
