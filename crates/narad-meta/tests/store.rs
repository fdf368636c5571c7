//! The store as its callers use it: the write helpers, reads from the
//! snapshot, persistence across reopen (simulated and real file systems) and
//! the on-disk layout.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use narad_fs::{Fs, OpenMode, RealFs, SimFs};
use narad_meta::{
    Action, AlterTopicRequest, AttachChildRequest, CreateTopicRequest, Grant, Member, MemberStatus,
    MetaStore, MetaWriter as _, PartitionAssignment, Role, TopicDefaults, metastore_path,
};

use support::{DATA, SCHEMAS, open, options};

fn req(name: &str) -> CreateTopicRequest {
    CreateTopicRequest { name: name.into(), ..Default::default() }
}

/// Fills a store with one of everything.
fn populate(store: &MetaStore) {
    let parent = store
        .create_topic(CreateTopicRequest { schema: Some(SCHEMAS[0].into()), ..req("orders") })
        .unwrap();
    store
        .create_topic(CreateTopicRequest {
            parent: "orders".into(),
            fanout_delay_ms: 60_000,
            ..req("orders.audit")
        })
        .unwrap();
    store
        .create_topic(CreateTopicRequest { partitions: 4, owner: "bob".into(), ..req("logs") })
        .unwrap();
    store.create_topic(req("doomed")).unwrap();
    store.delete_topic("doomed").unwrap();
    store.create_topic(req("orders.copy")).unwrap();
    store
        .attach_child(AttachChildRequest {
            parent: "orders".into(),
            child: "orders.copy".into(),
            delay_ms: 0,
        })
        .unwrap();
    store.create_topic(req("orders.gone")).unwrap();
    let gone =
        AttachChildRequest { parent: "orders".into(), child: "orders.gone".into(), delay_ms: 5 };
    store.attach_child(gone).unwrap();
    store.detach_child("orders", "orders.gone").unwrap();
    store
        .alter_topic(
            "orders",
            AlterTopicRequest {
                schema: Some(SCHEMAS[1].into()),
                partitions: 6,
                ..Default::default()
            },
        )
        .unwrap();
    let assignments = (0..6)
        .map(|p| PartitionAssignment { partition: p, owner_id: "n1".into(), target_id: None })
        .collect();
    store.assign_partitions("orders", parent.incarnation(), assignments).unwrap();
    store
        .member_join(Member {
            id: "n1".into(),
            addr: "127.0.0.1:7942".into(),
            cluster_addr: Some("127.0.0.1:7943".into()),
            status: MemberStatus::Alive,
            last_heartbeat: 1_700_000_000,
            draining: false,
        })
        .unwrap();
    store.seed_root_user("$2b$10$root".into()).unwrap();
    let grants = vec![Grant { action: Action::Consume, patterns: vec!["orders*".into()] }];
    store.create_user("carol", "$2b$10$c".into(), grants).unwrap();
    store.create_user("dave", "$2b$10$d".into(), Vec::new()).unwrap();
    store.update_user("dave", None, Some("$2b$10$d2".into())).unwrap();
    store.create_user("erin", "$2b$10$e".into(), Vec::new()).unwrap();
    store.delete_user("erin").unwrap();
}

#[test]
fn the_write_helpers_stamp_time_and_attach_epochs() {
    let fs = SimFs::new(1);
    let store = open(&fs).unwrap();
    let t = store.create_topic(req("p")).unwrap();
    assert_eq!(t.created_at(), 1_700_000_000, "Unix seconds of the store's clock");
    let a = store.create_topic(CreateTopicRequest { parent: "p".into(), ..req("a") }).unwrap();
    let b = store.create_topic(CreateTopicRequest { parent: "p".into(), ..req("b") }).unwrap();
    let (ea, eb) = (&a.parent().unwrap().attach_epoch, &b.parent().unwrap().attach_epoch);
    assert_eq!(ea.len(), 16);
    assert!(ea.bytes().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(ea, eb);
    assert_eq!(store.topic("p").unwrap().role(), Role::Parent);
    let e = store.create_topic(req("p")).unwrap_err();
    assert_eq!((e.status(), e.to_string()), (409, "topic already exists".to_owned()));

    store.create_topic(req("c")).unwrap();
    let attach = || AttachChildRequest { parent: "p".into(), child: "c".into(), delay_ms: 0 };
    let parent = store.attach_child(attach()).unwrap();
    assert_eq!(parent.children(), &["a".to_owned(), "b".to_owned(), "c".to_owned()][..]);
    let first = store.topic("c").unwrap().parent().unwrap().clone();
    assert_eq!(first.attached_at_ms, 1_700_000_000_000, "Unix ms of the store's clock");
    let (parent, link) = store.detach_child("p", "c").unwrap();
    assert_eq!((parent.children().len(), link), (2, first.clone()));
    store.attach_child(attach()).unwrap();
    let second = store.topic("c").unwrap().parent().unwrap().clone();
    assert_ne!(second.attach_epoch, first.attach_epoch, "every attach has a new epoch");
    assert!(![ea, eb].contains(&&second.attach_epoch));
}

#[test]
fn reads_come_from_the_latest_snapshot() {
    let fs = SimFs::new(2);
    let store = open(&fs).unwrap();
    let before = store.snapshot();
    let versions = store.versions();
    store.create_topic(CreateTopicRequest { schema: Some(SCHEMAS[0].into()), ..req("t") }).unwrap();
    assert!(before.topic("t").is_none(), "an old snapshot never changes");
    assert_eq!(store.versions().topics, versions.topics + 1);
    let schema = store.compiled_schema("t").unwrap();
    schema.validate_payload(br#"{"id": 1}"#).unwrap();
    assert!(schema.validate_payload(br#"{"id": "x"}"#).is_err());
    assert!(store.compiled_schema("nope").is_none());
    let page = store.list_topics("", 10);
    assert_eq!(page.topics.len(), 1);
    assert_eq!(page.next_page_token, "");
}

#[test]
fn the_state_survives_a_reopen() {
    let fs = SimFs::new(3);
    let store = open(&fs).unwrap();
    populate(&store);
    let before = store.snapshot();
    drop(store);

    let store = open(&fs).unwrap();
    assert_eq!(*store.snapshot(), *before);
    assert_eq!(store.versions(), before.versions());
    assert_eq!(store.compiled_schema("orders.audit").unwrap().version(), 2);
    assert!(store.user("admin").unwrap().root);
    assert_eq!(store.user("dave").unwrap().password_hash, "$2b$10$d2");
    assert!(store.user("erin").is_none());
    assert_eq!(store.versions().users, 6);
    let highest = before.topics().map(|t| t.incarnation()).max().unwrap();
    let fresh = store.create_topic(req("doomed")).unwrap();
    assert!(fresh.incarnation() > highest, "ids are never reused across a reopen");
}

#[test]
fn the_metastore_lives_in_one_file_under_the_data_dir() {
    let fs = SimFs::new(4);
    drop(open(&fs).unwrap());
    let path = metastore_path(Path::new(DATA));
    assert_eq!(path, PathBuf::from("/data/metastore/fsm.redb"));
    let names: Vec<String> =
        fs.list_dir(Path::new("/data/metastore")).unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, vec!["fsm.redb"]);
}

#[test]
fn a_stale_temporary_file_from_an_interrupted_creation_is_replaced() {
    let fs = SimFs::new(5);
    fs.create_dir_all(Path::new("/data/metastore")).unwrap();
    let tmp = fs.open(Path::new("/data/metastore/fsm.redb.tmp"), OpenMode::CreateNew).unwrap();
    tmp.write_all_at(b"half a database", 0).unwrap();
    tmp.sync_data().unwrap();
    let store = open(&fs).unwrap();
    store.create_topic(req("t")).unwrap();
    drop(store);
    assert!(open(&fs).unwrap().topic("t").is_some());
}

#[test]
fn invalid_defaults_are_refused_at_open() {
    let fs = SimFs::new(6);
    let mut opts = options();
    opts.defaults = TopicDefaults { default_partitions: 1, ..TopicDefaults::default() };
    let e = MetaStore::open(&fs, Path::new(DATA), opts).unwrap_err();
    assert_eq!(e.status(), 400);
    assert!(e.to_string().contains("default_partitions"), "{e}");
}

#[test]
fn the_real_file_system_keeps_the_state_across_a_reopen() {
    let dir = std::env::temp_dir().join(format!("narad-meta-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fs = RealFs;
    let store = MetaStore::open(&fs, &dir, options()).unwrap();
    populate(&store);
    let before = store.snapshot();
    drop(store);
    let store = MetaStore::open(&fs, &dir, options()).unwrap();
    assert_eq!(*store.snapshot(), *before);
    assert!(metastore_path(&dir).is_file());
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn proposals_from_many_threads_apply_one_at_a_time() {
    let fs = SimFs::new(7);
    let store = Arc::new(open(&fs).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..10 {
                    store.create_topic(req(&format!("t{t}-{i}"))).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let state = store.snapshot();
    assert_eq!((state.topic_count(), state.applied_index()), (40, 40));
    let mut ids: Vec<u64> = state.topics().map(|t| t.incarnation()).collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=40).collect::<Vec<_>>());
}

/// The property the cluster milestone relies on: replaying the applied
/// commands, as logged (encoded and decoded), from an empty state, at the
/// same indices, rebuilds exactly the store's state, and every state on the
/// way keeps every invariant.
#[test]
fn replaying_the_logged_commands_rebuilds_the_same_state() {
    for seed in 0..20 {
        let fs = SimFs::new(seed);
        let store = open(&fs).unwrap();
        let mut rng = narad_fs::SimRng::new(seed);
        let mut log = Vec::new();
        for _ in 0..80 {
            let state = store.snapshot();
            let Some(command) = support::random_command(&mut rng, &state) else { continue };
            if store.propose(command.clone()).is_ok() {
                store.snapshot().check_invariants().unwrap();
                log.push((store.snapshot().applied_index(), command.to_json()));
            }
        }
        let mut replayed = narad_meta::MetaState::default();
        for (index, bytes) in &log {
            let command = narad_meta::Command::from_json(bytes).unwrap();
            replayed = narad_meta::apply(&replayed, *index, &command).unwrap().state;
        }
        assert_eq!(replayed, *store.snapshot(), "seed {seed}");
        assert!(log.len() > 20, "seed {seed}: only {} commands applied", log.len());
        drop(store);
        assert_eq!(*open(&fs).unwrap().snapshot(), replayed, "seed {seed}: after reopen");
    }
}
