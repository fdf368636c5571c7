//! Bad input to the cluster's decoders, in seconds: the checks of the
//! cluster's fuzz targets (`fuzz/src/cluster.rs`: node RPC, the Raft log's
//! values, the metastore snapshot) over their checked-in corpora
//! `fuzz/corpus/<target>/` and seeded mutations. The long runs are
//! `cargo +nightly fuzz run <target>` (docs/DURABILITY.md, Fuzzing).

#[path = "../../../fuzz/src/cluster.rs"]
mod checks;
#[path = "../../../fuzz/src/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn survives_corpus_and_mutations(target: &str) {
    let check = checks::CHECKS
        .iter()
        .find(|(n, _)| *n == target)
        .unwrap_or_else(|| panic!("no check named {target}"))
        .1;
    harness::survives_corpus_and_mutations(&fuzz_dir(), target, check);
}

#[test]
fn the_handshake_an_unauthenticated_peer_speaks_is_read_within_its_bounds_and_round_trips() {
    survives_corpus_and_mutations("node_rpc_handshake");
}

#[test]
fn node_rpc_frame_decoding_never_panics_and_round_trips() {
    survives_corpus_and_mutations("node_rpc_frame");
}

#[test]
fn node_rpc_request_decoding_answers_400_never_panics_and_round_trips() {
    survives_corpus_and_mutations("node_rpc_request");
}

#[test]
fn node_rpc_reply_decoding_never_panics_and_round_trips() {
    survives_corpus_and_mutations("node_rpc_reply");
}

#[test]
fn control_rpc_payload_decoding_answers_400_never_panics_and_round_trips() {
    survives_corpus_and_mutations("control_rpc_payload");
}

#[test]
fn raft_log_values_are_refused_cleanly_never_panic_and_round_trip() {
    survives_corpus_and_mutations("raft_log_value");
}

#[test]
fn metastore_snapshots_are_refused_cleanly_or_install_and_export_back_identically() {
    survives_corpus_and_mutations("meta_snapshot");
}

#[test]
fn every_cluster_fuzz_target_has_a_corpus_and_a_test_here() {
    let this = include_str!("bad_input.rs");
    for (name, _) in checks::CHECKS {
        assert!(fuzz_dir().join("corpus").join(name).is_dir(), "fuzz/corpus/{name} is missing");
        assert!(
            this.contains(&format!("survives_corpus_and_mutations(\"{name}\")")),
            "no test runs the {name} check"
        );
        let target = fuzz_dir().join(format!("fuzz_targets/{name}.rs"));
        assert!(target.is_file(), "fuzz/fuzz_targets/{name}.rs is missing");
    }
}

/// Writes the seed inputs of the cluster corpora (run once by hand):
/// `cargo test -p narad-cluster --test bad_input -- --ignored write_seed_corpora`.
#[test]
#[ignore = "writes fuzz/corpus seeds into the source tree"]
fn write_seed_corpora() {
    for (target, seeds) in seeds::all() {
        let dir = fuzz_dir().join("corpus").join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds {
            std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
        }
    }
}

mod seeds {
    use bytes::Bytes;
    use narad_cluster::frame::{Frame, FrameType};
    use narad_cluster::rpc::{
        AnchorFanoutLink, ChildLink, CommitRecord, Consume, FanoutCursorsRequest, Handoff,
        JoinCluster, MovePartition, ReadyCounts, Receipt, RegisterMember, Reply, Request,
        SegmentChunk, TopicBody, UserBody,
    };
    use std::num::NonZeroU64;

    type Seeds = Vec<(String, Vec<u8>)>;

    pub fn all() -> Vec<(&'static str, Seeds)> {
        vec![
            ("node_rpc_handshake", handshake_messages()),
            ("node_rpc_frame", frames()),
            ("node_rpc_request", requests()),
            ("node_rpc_reply", replies()),
            ("control_rpc_payload", control_payloads()),
            ("raft_log_value", raft_log_values()),
            ("meta_snapshot", meta_snapshots()),
        ]
    }

    /// Metastore commands of several kinds, each valid after the ones
    /// before it (a topic with a schema, its assignment, a member, a user).
    fn commands() -> Vec<(&'static str, narad_meta::Command)> {
        use narad_meta::{
            Action, AssignPartitions, Command, CreateTopicRequest, CreateUser, Grant, Member,
            MemberJoin, MemberStatus, MetaState, PartitionAssignment, TopicDefaults, User,
        };
        let request = CreateTopicRequest {
            name: "orders".into(),
            partitions: 3,
            schema: Some(r#"{"type":"object"}"#.into()),
            ..Default::default()
        };
        let create = request
            .resolve(&TopicDefaults::default(), &MetaState::default(), 1_700_000_000_000, 1)
            .unwrap();
        // A topic's incarnation is the index that created it: the first.
        let incarnation = 1;
        vec![
            ("create_topic", Command::CreateTopic(create)),
            (
                "assign_partitions",
                Command::AssignPartitions(AssignPartitions {
                    topic: "orders".into(),
                    incarnation,
                    assignments: vec![PartitionAssignment {
                        partition: 0,
                        owner_id: "n1".into(),
                        target_id: None,
                    }],
                    unassigned_only: true,
                }),
            ),
            (
                "member_join",
                Command::MemberJoin(MemberJoin {
                    member: Member {
                        id: "n1".into(),
                        addr: "127.0.0.1:7942".into(),
                        cluster_addr: Some("127.0.0.1:7943".into()),
                        status: MemberStatus::Alive,
                        last_heartbeat: 1_700_000_000_000_000_000,
                        draining: false,
                    },
                }),
            ),
            (
                "create_user",
                Command::CreateUser(CreateUser {
                    user: User {
                        username: "alice".into(),
                        password_hash: "$2b$10$abcdefghijklmnopqrstuv".into(),
                        grants: vec![Grant {
                            action: Action::Produce,
                            patterns: vec!["orders*".into()],
                        }],
                        root: false,
                        created_at_ms: 1,
                        updated_at_ms: 1,
                    },
                }),
            ),
        ]
    }

    fn raft_node(id: &str) -> narad_cluster::raft::RaftNode {
        narad_cluster::raft::RaftNode {
            id: id.into(),
            cluster_addr: "127.0.0.1:7943".into(),
            http_addr: "127.0.0.1:7942".into(),
        }
    }

    fn membership() -> openraft::Membership<u64, narad_cluster::raft::RaftNode> {
        use std::collections::{BTreeMap, BTreeSet};
        openraft::Membership::new(
            vec![BTreeSet::from([1u64, 2, 3])],
            BTreeMap::from([(1u64, raft_node("n1")), (2, raft_node("n2")), (3, raft_node("n3"))]),
        )
    }

    /// Values of `raft.redb` as the log store writes them: mode byte (see
    /// `raft_log_value`), then the record (and the key, for an entry); each
    /// also as a bare body (mode bit 7) for the harness to wrap.
    fn raft_log_values() -> Seeds {
        use narad_cluster::raft::TypeConfig;
        use narad_cluster::raft::log_store::{FORMAT_VERSION, RECORD_HEADER_LEN, encode_value};
        use openraft::testing::log_id;
        use openraft::{Entry, EntryPayload, Vote};

        let mut values: Vec<(String, u8, Vec<u8>)> = vec![
            ("format".into(), 0, encode_value(&FORMAT_VERSION)),
            ("vote".into(), 1, encode_value(&Vote::<u64>::new(3, 2))),
            ("vote_committed".into(), 1, encode_value(&Vote::<u64>::new_committed(4, 1))),
            ("purged".into(), 2, encode_value(&log_id::<u64>(2, 1, 17))),
        ];
        let mut entries = vec![
            ("blank", EntryPayload::<TypeConfig>::Blank),
            ("membership", EntryPayload::Membership(membership())),
        ];
        entries.extend(commands().into_iter().map(|(n, c)| (n, EntryPayload::Normal(c))));
        for (i, (name, payload)) in entries.into_iter().enumerate() {
            let index = 18 + i as u64;
            let entry = Entry::<TypeConfig> { log_id: log_id(4, 1, index), payload };
            let mut keyed = index.to_be_bytes().to_vec();
            keyed.extend_from_slice(&encode_value(&entry));
            values.push((format!("entry_{name}"), 3, keyed));
        }
        let mut out = Seeds::new();
        for (name, mode, bytes) in values {
            let key_len = if mode == 3 { 8 } else { 0 };
            let mut body = bytes[..key_len].to_vec();
            body.extend_from_slice(&bytes[key_len + RECORD_HEADER_LEN..]);
            out.push((name.clone(), [&[mode][..], &bytes].concat()));
            out.push((format!("{name}_body"), [&[mode | 0x80][..], &body].concat()));
        }
        out
    }

    /// Snapshots as `MetaStore::export_snapshot` writes them, with the
    /// harness's fix-ups on (mode 3) and as exported (mode 0): an empty
    /// store, a store written directly (no Raft state), a store applied
    /// from Raft entries (topic, assignment, member, user, Raft state).
    fn meta_snapshots() -> Seeds {
        use narad_cluster::raft::types::{AppliedState, StoredMembership};
        use narad_meta::{MetaStore, MetaStoreOptions, MetaWriter, TopicDefaults};
        use openraft::testing::log_id;
        use std::path::Path;
        use std::sync::Arc;

        let open = |fs: &narad_fs::SimFs| {
            let options = MetaStoreOptions {
                defaults: TopicDefaults::default(),
                clock: Arc::new(narad_clock::ManualClock::new(1_700_000_000_000)),
                rng_seed: Some(1),
            };
            MetaStore::open(fs, Path::new("/data"), options).unwrap()
        };
        let fs = narad_fs::SimFs::new(1);
        let empty = open(&fs).export_snapshot().unwrap();
        let fs = narad_fs::SimFs::new(2);
        let direct = open(&fs);
        for (_, command) in commands() {
            direct.propose(command).unwrap();
        }
        let direct = direct.export_snapshot().unwrap();
        let fs = narad_fs::SimFs::new(3);
        let replicated = open(&fs);
        let mut applied = AppliedState {
            last_applied: Some(log_id(1, 1, 1)),
            membership: StoredMembership::new(Some(log_id(1, 1, 1)), membership()),
        };
        replicated.apply_entry(None, &applied.encode()).unwrap();
        for (i, (_, command)) in commands().into_iter().enumerate() {
            applied.last_applied = Some(log_id(1, 1, 2 + i as u64));
            replicated.apply_entry(Some(&command), &applied.encode()).unwrap().unwrap().unwrap();
        }
        let replicated = replicated.export_snapshot().unwrap();
        let mut out = Seeds::new();
        for (name, bytes) in [("empty", empty), ("direct", direct), ("replicated", replicated)] {
            out.push((name.into(), [&[3][..], &bytes].concat()));
            out.push((format!("{name}_as_exported"), [&[0][..], &bytes].concat()));
        }
        out
    }

    /// Real payloads of ops 29-32, built from openraft's and narad-meta's
    /// types.
    fn control_payloads() -> Seeds {
        use narad_cluster::raft::network::ControlPayload;
        use narad_cluster::raft::{RaftNode, TypeConfig};
        use narad_meta::{Command, DeleteTopic, MemberDead};
        use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
        use openraft::testing::log_id;
        use openraft::{Entry, EntryPayload, Membership, SnapshotMeta, StoredMembership, Vote};
        use std::collections::{BTreeMap, BTreeSet};

        let node = |id: &str| RaftNode {
            id: id.into(),
            cluster_addr: "127.0.0.1:7943".into(),
            http_addr: String::new(),
        };
        let membership = Membership::new(
            vec![BTreeSet::from([1u64, 2])],
            BTreeMap::from([(1u64, node("n1")), (2, node("n2"))]),
        );
        let entries = vec![
            Entry::<TypeConfig> { log_id: log_id(1, 1, 1), payload: EntryPayload::Blank },
            Entry {
                log_id: log_id(1, 1, 2),
                payload: EntryPayload::Membership(membership.clone()),
            },
            Entry {
                log_id: log_id(1, 1, 3),
                payload: EntryPayload::Normal(Command::DeleteTopic(DeleteTopic {
                    name: "t".into(),
                })),
            },
        ];
        let payloads = [
            (
                "propose",
                ControlPayload::Propose(Command::MemberDead(MemberDead {
                    id: "n2".into(),
                    last_heartbeat: None,
                })),
            ),
            (
                "append_entries",
                ControlPayload::AppendEntries(AppendEntriesRequest {
                    vote: Vote::new_committed(1, 1),
                    prev_log_id: Some(log_id(1, 1, 0)),
                    entries,
                    leader_commit: Some(log_id(1, 1, 2)),
                }),
            ),
            (
                "heartbeat",
                ControlPayload::AppendEntries(AppendEntriesRequest {
                    vote: Vote::new_committed(2, 2),
                    prev_log_id: None,
                    entries: vec![],
                    leader_commit: None,
                }),
            ),
            (
                "vote",
                ControlPayload::Vote(VoteRequest::new(Vote::new(3, 2), Some(log_id(2, 2, 9)))),
            ),
            (
                "install_snapshot",
                ControlPayload::InstallSnapshot(InstallSnapshotRequest {
                    vote: Vote::new_committed(1, 1),
                    meta: SnapshotMeta {
                        last_log_id: Some(log_id(1, 1, 3)),
                        last_membership: StoredMembership::new(Some(log_id(1, 1, 2)), membership),
                        snapshot_id: "1-1-3-0".into(),
                    },
                    offset: 0,
                    data: b"NMSNAP".to_vec(),
                    done: true,
                }),
            ),
        ];
        payloads.into_iter().map(|(n, p)| (n.to_owned(), p.encode().encode())).collect()
    }

    fn record(key: Option<&'static str>, incarnation: u64) -> CommitRecord {
        CommitRecord {
            topic: "orders".into(),
            key: key.map(|k| Bytes::from_static(k.as_bytes())),
            partition: 3,
            payload: Bytes::from_static(b"{\"id\":1}"),
            created_at: 1_700_000_000_000,
            incarnation: NonZeroU64::new(incarnation),
        }
    }

    fn request_list() -> Vec<(&'static str, Request)> {
        let receipt = Receipt { topic: "orders".into(), partition: 1, offset: 42, nonce: 7 };
        let user = |b: &'static str| UserBody {
            username: "alice".into(),
            body: Bytes::from_static(b.as_bytes()),
        };
        let link = ChildLink { parent: "p".into(), child: "c".into(), delay_ms: 60_000 };
        vec![
            (
                "consume",
                Request::Consume(Consume {
                    topic: "orders".into(),
                    partition: 2,
                    has_partition: true,
                    offset: 0,
                    has_offset: true,
                    wait_nanos: 1_000_000_000,
                    local_only: false,
                    max: 1,
                }),
            ),
            (
                "consume_batch",
                Request::Consume(Consume {
                    topic: "orders".into(),
                    partition: 0,
                    has_partition: false,
                    offset: 0,
                    has_offset: false,
                    wait_nanos: 0,
                    local_only: true,
                    max: 100,
                }),
            ),
            ("ack", Request::Ack(receipt.clone())),
            ("extend_ack", Request::ExtendAck(receipt.clone())),
            ("nack", Request::Nack(receipt)),
            (
                "create_topic",
                Request::CreateTopic(TopicBody {
                    topic: "".into(),
                    body: "{\"name\":\"t\"}".into(),
                }),
            ),
            (
                "alter_topic",
                Request::AlterTopic(TopicBody {
                    topic: "t".into(),
                    body: "{\"partitions\":4}".into(),
                }),
            ),
            ("delete_topic", Request::DeleteTopic("t".into())),
            ("purge_topic", Request::PurgeTopic("t".into())),
            ("get_topic", Request::GetTopic("t".into())),
            (
                "register_member",
                Request::RegisterMember(RegisterMember {
                    id: "n1".into(),
                    addr: "127.0.0.1:7942".into(),
                    cluster_addr: "127.0.0.1:7943".into(),
                    status: "alive".into(),
                    last_heartbeat: 1_700_000_000_000_000_000,
                }),
            ),
            ("commit_produce", Request::CommitProduce(record(Some("k"), 0))),
            ("commit_produce_incarnation", Request::CommitProduce(record(None, 9))),
            (
                "commit_produce_batch",
                Request::CommitProduceBatch(vec![record(Some("k"), 0), record(None, 0)]),
            ),
            (
                "commit_produce_batch_incarnations",
                Request::CommitProduceBatch(vec![
                    record(Some("a"), 5),
                    record(None, 5),
                    record(None, 0),
                    record(None, 6),
                ]),
            ),
            ("create_user", Request::CreateUser(user("{\"password\":\"x\"}"))),
            ("update_user", Request::UpdateUser(user("{\"grants\":[]}"))),
            ("delete_user", Request::DeleteUser(user(""))),
            ("attach_child", Request::AttachChild(link.clone())),
            ("detach_child", Request::DetachChild(link)),
            (
                "join_cluster",
                Request::JoinCluster(JoinCluster {
                    id: "n4".into(),
                    cluster_addr: "10.0.0.4:7943".into(),
                    http_addr: None,
                }),
            ),
            (
                "join_cluster_http",
                Request::JoinCluster(JoinCluster {
                    id: "n4".into(),
                    cluster_addr: "10.0.0.4:7943".into(),
                    http_addr: Some("10.0.0.4:7942".into()),
                }),
            ),
            (
                "propose_command",
                Request::ProposeCommand(
                    "{\"DeleteTopic\":{\"name\":\"t\",\"deleted_at_ms\":1}}".into(),
                ),
            ),
            (
                "raft_append_entries",
                Request::RaftAppendEntries(
                    "{\"vote\":{\"leader_id\":{\"term\":1,\"node_id\":7},\"committed\":true},\"prev_log_id\":null,\"entries\":[],\"leader_commit\":null}".into(),
                ),
            ),
            (
                "raft_vote",
                Request::RaftVote(
                    "{\"vote\":{\"leader_id\":{\"term\":2,\"node_id\":7},\"committed\":false},\"last_log_id\":null}".into(),
                ),
            ),
            ("raft_install_snapshot", Request::RaftInstallSnapshot("{}".into())),
            ("raft_campaign", Request::RaftCampaign),
            (
                "fanout_cursors",
                Request::FanoutCursors(FanoutCursorsRequest {
                    topic: "p".into(),
                    incarnation: NonZeroU64::new(9),
                }),
            ),
            (
                "anchor_fanout_link",
                Request::AnchorFanoutLink(AnchorFanoutLink {
                    parent: "p".into(),
                    incarnation: 7,
                    child: "c".into(),
                    epoch: 3,
                    partitions: vec![0, 2],
                }),
            ),
            ("settle_fanout_links", Request::SettleFanoutLinks(42)),
            ("read_index", Request::ReadIndex),
            (
                "ready_counts",
                Request::ReadyCounts(ReadyCounts { topic: "orders".into(), wait_nanos: 500_000_000 }),
            ),
            ("cancel_request", Request::CancelRequest(7)),
            ("probe_group", Request::ProbeGroup("n4".into())),
            ("known_offsets", Request::KnownOffsets),
            // The moves' ops (22-24), with the incarnation and without it
            // (a sender before the field).
            (
                "list_partition_segments",
                Request::ListPartitionSegments(MovePartition {
                    topic: "orders".into(),
                    partition: 2,
                    incarnation: NonZeroU64::new(9),
                }),
            ),
            (
                "list_partition_segments_unnamed",
                Request::ListPartitionSegments(MovePartition {
                    topic: "orders".into(),
                    partition: 0,
                    incarnation: None,
                }),
            ),
            (
                "fetch_segment_chunk",
                Request::FetchSegmentChunk(SegmentChunk {
                    topic: "orders".into(),
                    partition: 2,
                    base: 0,
                    at: 4096,
                    length: 1 << 20,
                    incarnation: NonZeroU64::new(9),
                }),
            ),
            (
                "prepare_handoff",
                Request::PrepareHandoff(Handoff {
                    topic: "orders".into(),
                    partition: 2,
                    freeze_ttl_nanos: 30_000_000_000,
                    incarnation: NonZeroU64::new(9),
                }),
            ),
            (
                "commit_produce_batch_large_payload",
                Request::CommitProduceBatch(vec![CommitRecord {
                    payload: Bytes::from(vec![b'x'; 600]),
                    ..record(None, 3)
                }]),
            ),
        ]
    }

    fn requests() -> Seeds {
        let mut s: Seeds =
            request_list().into_iter().map(|(n, r)| (n.to_owned(), r.encode())).collect();
        s.push(("unknown_op".into(), vec![99, 0, 0, 0, 1, b't']));
        s
    }

    fn reply_list() -> Vec<(&'static str, Reply)> {
        vec![
            ("ok", Reply::json(200, "{\"offset\":42,\"partition\":1}")),
            ("no_content", Reply { status: 204, content_type: String::new(), body: Bytes::new() }),
            ("error", Reply::error(400, "unsupported rpc operation 99")),
        ]
    }

    fn replies() -> Seeds {
        reply_list().into_iter().map(|(n, r)| (n.to_owned(), r.encode())).collect()
    }

    fn frames() -> Seeds {
        let f = |kind, id, payload: Vec<u8>| Frame::new(kind, id, payload).encode().unwrap();
        let mut s: Seeds = request_list()
            .into_iter()
            .map(|(n, r)| (format!("request-{n}"), f(FrameType::NodeRequest, 7, r.encode())))
            .collect();
        s.extend(
            reply_list()
                .into_iter()
                .map(|(n, r)| (format!("reply-{n}"), f(FrameType::NodeReply, 7, r.encode()))),
        );
        s.push(("error".into(), Frame::error(7, "no").encode().unwrap()));
        s.push(("ping".into(), f(FrameType::Ping, 1, 42u64.to_be_bytes().to_vec())));
        s.push(("pong".into(), f(FrameType::Pong, 1, 42u64.to_be_bytes().to_vec())));
        s
    }

    /// Every handshake message (the first byte picks the reader), and the
    /// v1 Auth frame and a 16 MiB frame header sent where a Hello is due.
    fn handshake_messages() -> Seeds {
        use narad_cluster::handshake::{self as h, Kind, Proof};
        let server =
            Proof { nonce: Some([3; 32]), macs: vec![[5; 32], [6; 32]], node_id: "n1".into() };
        let client = Proof { nonce: None, macs: vec![[7; 32]], node_id: "node-2.x_y".into() };
        let dev = Proof { nonce: None, macs: vec![], node_id: "-".into() };
        let with = |pick: u8, bytes: Vec<u8>| [vec![pick], bytes].concat();
        let mut v1_auth = Frame::new(FrameType::Ping, 0, vec![0xee; 32]).encode().unwrap();
        v1_auth[5] = 10;
        let mut flood = Frame::new(FrameType::NodeRequest, 1, Vec::new()).encode().unwrap();
        flood[16..20].copy_from_slice(&(16u32 << 20).to_be_bytes());
        vec![
            ("hello".into(), with(0, h::encode_hello(&[2; 32]))),
            ("server_proof".into(), with(1, h::encode_proof(Kind::ServerProof, &server))),
            ("client_proof".into(), with(2, h::encode_proof(Kind::ClientProof, &client))),
            ("client_proof_dev".into(), with(2, h::encode_proof(Kind::ClientProof, &dev))),
            ("welcome".into(), with(3, h::encode_welcome().to_vec())),
            ("v1_auth_as_hello".into(), with(0, v1_auth)),
            ("frame_flood_as_hello".into(), with(0, flood)),
        ]
    }
}
