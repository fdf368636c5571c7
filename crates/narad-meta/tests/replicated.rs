//! The replicated path of the metastore: committed Raft entries applied
//! with `apply_entry`, state-machine snapshots exported and installed
//! (also across a power cut at every file-system operation of the install),
//! a `Replicator` taking `propose`, and the applied-command listeners.

mod support;

use std::sync::{Arc, Mutex, OnceLock, Weak};

use narad_fs::{CrashMode, SimFs, SimRng};
use narad_meta::{
    Command, CreateTopicRequest, DeleteTopic, MetaError, MetaState, MetaStore, MetaWriter,
    Replicator, Response, StorageError,
};

use support::{open, random_command};

/// The Raft state a test stores with entry `i` (opaque to the store).
fn raft_bytes(i: u64) -> Vec<u8> {
    format!("{{\"last_applied\":{i}}}").into_bytes()
}

/// `n` seeded entries: random commands (drawn against `state` as it evolves
/// on `store`) with a blank entry now and then. Applies them to `store` and
/// returns them.
fn drive(store: &MetaStore, seed: u64, n: u64) -> Vec<Option<Command>> {
    let mut rng = SimRng::new(seed);
    let mut entries = Vec::new();
    for i in 0..n {
        let entry =
            if rng.chance(1, 8) { None } else { random_command(&mut rng, &store.snapshot()) };
        store.apply_entry(entry.as_ref(), &raft_bytes(i)).unwrap();
        entries.push(entry);
    }
    entries
}

fn topic(name: &str) -> Command {
    let request = CreateTopicRequest { name: name.into(), ..Default::default() };
    let state = MetaState::default();
    let defaults = narad_meta::TopicDefaults::default();
    Command::CreateTopic(request.resolve(&defaults, &state, 1_700_000_000_000, 7).unwrap())
}

#[test]
fn applying_the_same_entries_on_two_stores_gives_identical_states_and_incarnations() {
    let (fs_a, fs_b) = (SimFs::new(1), SimFs::new(2));
    let (a, b) = (open(&fs_a).unwrap(), open(&fs_b).unwrap());
    let entries = drive(&a, 42, 200);
    for (i, entry) in entries.iter().enumerate() {
        b.apply_entry(entry.as_ref(), &raft_bytes(i as u64)).unwrap();
    }
    assert!(a.snapshot().applied_index() > 20, "the workload applied too little");
    assert!(a.snapshot().applied_index() < 200, "blank and refused entries advanced the index");
    assert_eq!(*a.snapshot(), *b.snapshot());
    let incarnations = |s: &MetaState| s.topics().map(|t| t.incarnation()).collect::<Vec<_>>();
    assert_eq!(incarnations(&a.snapshot()), incarnations(&b.snapshot()));
    assert_eq!(a.raft_state(), Some(raft_bytes(199)));
    assert_eq!(a.raft_state(), b.raft_state());
    assert_eq!(a.export_snapshot().unwrap(), b.export_snapshot().unwrap());
}

#[test]
fn the_replicated_path_reaches_the_state_the_direct_path_reaches() {
    let (fs_a, fs_b) = (SimFs::new(1), SimFs::new(2));
    let (direct, replicated) = (open(&fs_a).unwrap(), open(&fs_b).unwrap());
    let mut rng = SimRng::new(9);
    for i in 0..150 {
        let Some(command) = random_command(&mut rng, &direct.snapshot()) else { continue };
        let by_propose = direct.propose(command.clone()).map_err(|e| e.to_wire());
        let by_entry = replicated.apply_entry(Some(&command), &raft_bytes(i)).unwrap().unwrap();
        assert_eq!(by_propose, by_entry.map_err(|e| e.to_wire()), "command {i}");
    }
    assert_eq!(*direct.snapshot(), *replicated.snapshot());
    assert_eq!(direct.raft_state(), None);
}

#[test]
fn a_refused_command_stores_its_raft_state_but_does_not_advance_the_applied_index() {
    let fs = SimFs::new(3);
    let store = open(&fs).unwrap();
    store.apply_entry(Some(&topic("kept")), &raft_bytes(1)).unwrap().unwrap().unwrap();
    let before = store.snapshot();
    let delete = Command::DeleteTopic(DeleteTopic { name: "ghost".into() });
    let outcome = store.apply_entry(Some(&delete), &raft_bytes(2)).unwrap().unwrap();
    assert_eq!(outcome.unwrap_err().to_string(), "topic not found");
    assert_eq!(*store.snapshot(), *before);
    assert_eq!(store.raft_state(), Some(raft_bytes(2)));
    assert!(store.apply_entry(None, &raft_bytes(3)).unwrap().is_none());
    assert_eq!((store.snapshot().applied_index(), store.raft_state()), (1, Some(raft_bytes(3))));
    drop(store);
    let reopened = open(&fs).unwrap();
    assert_eq!(*reopened.snapshot(), *before);
    assert_eq!(reopened.raft_state(), Some(raft_bytes(3)));
}

#[test]
fn a_snapshot_installed_into_another_store_yields_the_same_state_and_survives_reopen() {
    // The receiver behind the snapshot (catching up) and ahead of it (Raft
    // installs whatever it is given; the applied-index record goes down).
    for (receiver_entries, what) in [(30, "behind"), (400, "ahead")] {
        let (fs_a, fs_b) = (SimFs::new(1), SimFs::new(2));
        let (a, b) = (open(&fs_a).unwrap(), open(&fs_b).unwrap());
        drive(&a, 42, 200);
        drive(&b, 7, receiver_entries);
        let (from, to) = (b.snapshot().applied_index(), a.snapshot().applied_index());
        assert_eq!(from > to, what == "ahead", "{what}: from {from} to {to}");
        let bytes = a.export_snapshot().unwrap();
        b.install_snapshot(&fs_b, &bytes).unwrap();
        assert_eq!(*b.snapshot(), *a.snapshot(), "{what}");
        assert_eq!(b.raft_state(), a.raft_state(), "{what}");
        drop(b);
        let b = open(&fs_b).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
        assert_eq!(*b.snapshot(), *a.snapshot(), "{what}");
        assert_eq!(b.raft_state(), a.raft_state(), "{what}");
        // And both go on alike.
        let next = topic("after-install");
        let ra = a.apply_entry(Some(&next), &raft_bytes(1000)).unwrap().unwrap();
        let rb = b.apply_entry(Some(&next), &raft_bytes(1000)).unwrap().unwrap();
        assert_eq!(ra.map_err(|e| e.to_wire()), rb.map_err(|e| e.to_wire()), "{what}");
        assert_eq!(a.export_snapshot().unwrap(), b.export_snapshot().unwrap(), "{what}");
    }
}

#[test]
fn a_damaged_snapshot_is_refused_and_changes_nothing() {
    let (fs_a, fs_b) = (SimFs::new(1), SimFs::new(2));
    let (a, b) = (open(&fs_a).unwrap(), open(&fs_b).unwrap());
    drive(&a, 42, 50);
    drive(&b, 7, 50);
    let before = b.snapshot();
    let mut bytes = a.export_snapshot().unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    let e = b.install_snapshot(&fs_b, &bytes).unwrap_err();
    assert!(matches!(e, StorageError::BadSnapshot(_)), "{e}");
    assert_eq!(*b.snapshot(), *before);
    // Not latched: the store still takes entries.
    b.apply_entry(Some(&topic("still-writable")), &raft_bytes(99)).unwrap().unwrap().unwrap();
}

/// The store of one crash run: `old_entries` applied, then the snapshot
/// installed with a power cut at operation `cut` (none when `None`).
/// Returns the file system, crashed, and whether the install returned Ok.
fn install_run(snapshot: &[u8], old_entries: u64, cut: Option<u64>) -> (SimFs, u64, bool) {
    let fs = SimFs::new(5);
    let store = open(&fs).unwrap();
    drive(&store, 7, old_entries);
    let start = fs.op_count();
    if let Some(cut) = cut {
        fs.power_cut_at(start + cut);
    }
    let ok = store.install_snapshot(&fs, snapshot).is_ok();
    let ops = fs.op_count() - start;
    drop(store);
    (fs, ops, ok)
}

#[test]
fn a_power_cut_at_any_operation_of_an_install_leaves_the_old_or_the_new_state() {
    let fs_a = SimFs::new(1);
    let a = open(&fs_a).unwrap();
    drive(&a, 42, 120);
    let new = ((*a.snapshot()).clone(), a.raft_state());
    let snapshot = a.export_snapshot().unwrap();
    for (old_entries, what) in [(30, "behind"), (300, "ahead")] {
        let old = {
            let fs = SimFs::new(5);
            let store = open(&fs).unwrap();
            drive(&store, 7, old_entries);
            ((*store.snapshot()).clone(), store.raft_state())
        };
        let (from, to) = (old.0.applied_index(), new.0.applied_index());
        assert_eq!(from > to, what == "ahead", "{what}: from {from} to {to}");
        let (_, ops, ok) = install_run(&snapshot, old_entries, None);
        assert!(ok && ops > 3, "{what}: the dry run took {ops} operations");
        let mut rng = SimRng::new(old_entries);
        let (mut saw_old, mut saw_new) = (0, 0);
        for cut in 0..=ops {
            let (fs, _, ok) = install_run(&snapshot, old_entries, Some(cut));
            let mode = [CrashMode::DropUnsynced, CrashMode::Torn][rng.below(2) as usize];
            fs.crash(mode);
            let case = format!("{what}: cut at op {cut} of {ops}, {mode:?}");
            let store = open(&fs).unwrap_or_else(|e| panic!("{case}: reopen failed: {e}"));
            let got = ((*store.snapshot()).clone(), store.raft_state());
            if got == new {
                saw_new += 1;
            } else {
                assert!(got == old, "{case}: the state is neither the old one nor the new one");
                assert!(!ok, "{case}: the install returned Ok but the old state came back");
                saw_old += 1;
            }
            store
                .apply_entry(Some(&topic("after-crash")), &raft_bytes(5000))
                .unwrap()
                .unwrap()
                .unwrap();
        }
        assert!(saw_old > 0 && saw_new > 0, "{what}: old {saw_old}, new {saw_new}");
    }
}

/// A replicator that applies each command as the next entry of a store (a
/// one-voter group without the log), remembering what it was given.
#[derive(Debug, Default)]
struct Loopback {
    store: OnceLock<Weak<MetaStore>>,
    seen: Mutex<Vec<Command>>,
}

impl Replicator for Loopback {
    fn replicate(&self, command: Command) -> Result<Response, MetaError> {
        let store = self.store.get().and_then(Weak::upgrade).expect("the store is alive");
        let mut seen = self.seen.lock().unwrap();
        seen.push(command.clone());
        let n = seen.len() as u64;
        store.apply_entry(Some(&command), &raft_bytes(n))?.expect("a command answers")
    }
}

#[test]
fn propose_goes_through_the_replicator_once_one_is_set() {
    let fs = SimFs::new(4);
    let store = Arc::new(open(&fs).unwrap());
    store.create_topic(CreateTopicRequest { name: "direct".into(), ..Default::default() }).unwrap();
    assert!(!store.is_replicated());
    let loopback = Arc::new(Loopback::default());
    loopback.store.set(Arc::downgrade(&store)).unwrap();
    store.set_replicator(loopback.clone());
    assert!(store.is_replicated());
    let t = store
        .create_topic(CreateTopicRequest { name: "replicated".into(), ..Default::default() })
        .unwrap();
    assert_eq!(t.incarnation(), 2);
    let e = store.delete_topic("ghost").unwrap_err();
    assert_eq!((e.status(), e.to_string().as_str()), (404, "topic not found"));
    let seen = loopback.seen.lock().unwrap().iter().map(Command::opcode).collect::<Vec<_>>();
    assert_eq!(seen, vec![1, 3]);
    assert_eq!(store.raft_state(), Some(raft_bytes(2)));
}

#[test]
#[should_panic(expected = "set_replicator called twice")]
fn a_second_replicator_is_refused() {
    let fs = SimFs::new(4);
    let store = open(&fs).unwrap();
    store.set_replicator(Arc::new(Loopback::default()));
    store.set_replicator(Arc::new(Loopback::default()));
}

#[test]
fn listeners_hear_every_applied_command_on_both_paths_in_order() {
    let fs = SimFs::new(6);
    let store = open(&fs).unwrap();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let h = heard.clone();
    store.on_applied(Arc::new(move |c: &Command, r: &Response| {
        let incarnation = match r {
            Response::Topic(t) | Response::TopicDeleted(t) => t.incarnation(),
            _ => 0,
        };
        h.lock().unwrap().push((c.opcode(), incarnation));
    }));
    store.propose(topic("a")).unwrap();
    store.apply_entry(Some(&topic("b")), &raft_bytes(1)).unwrap().unwrap().unwrap();
    // Refused (exists already) and blank entries are not heard.
    store.apply_entry(Some(&topic("b")), &raft_bytes(2)).unwrap().unwrap().unwrap_err();
    store.propose(topic("a")).unwrap_err();
    store.apply_entry(None, &raft_bytes(3)).unwrap();
    let delete = Command::DeleteTopic(DeleteTopic { name: "a".into() });
    store.apply_entry(Some(&delete), &raft_bytes(4)).unwrap().unwrap().unwrap();
    assert_eq!(*heard.lock().unwrap(), vec![(1, 1), (1, 2), (3, 1)]);
}

#[test]
fn a_storage_failure_while_applying_an_entry_or_installing_latches_the_store() {
    let fs = SimFs::new(8);
    let store = open(&fs).unwrap();
    store.apply_entry(Some(&topic("kept")), &raft_bytes(1)).unwrap().unwrap().unwrap();
    let kept = store.snapshot();
    fs.inject(fs.op_count(), narad_fs::FaultKind::SyncError);
    let e = store.apply_entry(Some(&topic("lost")), &raft_bytes(2)).unwrap_err();
    assert!(!matches!(e, StorageError::Poisoned { .. }), "the first failure is its own: {e}");
    let again = store.apply_entry(None, &raft_bytes(3)).unwrap_err();
    assert!(matches!(again, StorageError::Poisoned { .. }), "{again}");
    let snapshot = store.export_snapshot().unwrap();
    let refused = store.install_snapshot(&fs, &snapshot).unwrap_err();
    assert!(matches!(refused, StorageError::Poisoned { .. }), "{refused}");
    assert_eq!(*store.snapshot(), *kept, "reads keep serving the last applied state");
    assert_eq!(store.raft_state(), Some(raft_bytes(1)));
    drop(store);

    // An install whose new database cannot be synced latches too, and the
    // reopened store holds the old state.
    fs.crash(CrashMode::DropUnsynced);
    let store = open(&fs).unwrap();
    assert_eq!(*store.snapshot(), *kept);
    let fs_a = SimFs::new(1);
    let source = open(&fs_a).unwrap();
    drive(&source, 42, 40);
    let bytes = source.export_snapshot().unwrap();
    fs.inject(fs.op_count(), narad_fs::FaultKind::SyncError);
    store.install_snapshot(&fs, &bytes).unwrap_err();
    let e = store.apply_entry(None, &raft_bytes(4)).unwrap_err();
    assert!(matches!(e, StorageError::Poisoned { .. }), "{e}");
    assert_eq!(*store.snapshot(), *kept);
    drop(store);
    fs.crash(CrashMode::DropUnsynced);
    assert_eq!(*open(&fs).unwrap().snapshot(), *kept);
}
