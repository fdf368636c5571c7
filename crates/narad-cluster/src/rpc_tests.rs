//! Golden bytes of every request and reply encoding, and every way a
//! request can be malformed.

use super::*;

/// Checked-in encodings, computed independently (a Python `struct`
/// script following SPEC §7.4), as hex: name → bytes.
const GOLDEN: &[(&str, &str)] = &[
    ("consume", "02000000066f72646572730000000201ffffffffffffffff0000000002540be40001"),
    ("consume_max", "02000000066f72646572730000000201ffffffffffffffff0000000002540be400010000000a"),
    ("ack", "03000000066f726465727300000001000000000000002a0000000000000007"),
    ("extend_ack", "12000000066f726465727300000001000000000000002a0000000000000007"),
    ("nack", "13000000066f726465727300000001000000000000002a0000000000000007"),
    ("create_topic", "04000000000000000c7b226e616d65223a2274227d"),
    ("alter_topic", "050000000174000000127b22726574656e74696f6e223a223168227d"),
    ("delete_topic", "060000000174"),
    ("purge_topic", "070000000174"),
    ("get_topic", "140000000174"),
    ("topic_partition_stats", "08000000066f726465727300000002"),
    ("topic_partition_stats_incarnation", "08000000066f7264657273000000020000000000000009"),
    (
        "register_member",
        "09000000026e310000000e3132372e302e302e313a373934320000000e3132372e302e302e313a3739343300000005616c69766517979cfe362a0000",
    ),
    ("commit_produce", "0a0000000174000000016b000000000000000568656c6c6f0000018bcfe56800"),
    (
        "commit_produce_incarnation",
        "0a0000000174000000016b000000000000000568656c6c6f0000018bcfe568000000000000000005",
    ),
    (
        "commit_produce_batch",
        "0b000000020000000174000000016b000000000000000568656c6c6f0000018bcfe568000000000174000000000000000100000005776f726c640000018bcfe56801",
    ),
    (
        "commit_produce_batch_incarnations",
        "0b000000030000000174000000016b000000000000000568656c6c6f0000018bcfe568000000000174000000016b000000000000000568656c6c6f0000018bcfe568000000000174000000000000000100000005776f726c640000018bcfe5680100000002000000020000000000000005000000010000000000000000",
    ),
    ("create_user", "0c00000005616c696365000000107b2270617373776f7264223a2278227d"),
    ("update_user", "0d00000005616c696365000000107b2270617373776f7264223a2279227d"),
    ("delete_user", "0e00000005616c69636500000000"),
    ("attach_child", "0f00000001700000000163000000000000ea60"),
    ("detach_child", "10000000017000000001630000000000000000"),
    ("join_cluster", "15000000026e340000000d31302e302e302e343a37393433"),
    (
        "join_cluster_http",
        "15000000026e340000000d31302e302e302e343a373934330000000d31302e302e302e343a37393432",
    ),
    ("propose_command", "1d000000027b7d"),
    ("raft_append_entries", "1e000000027b7d"),
    ("raft_vote", "1f000000027b7d"),
    ("raft_install_snapshot", "20000000027b7d"),
    ("raft_campaign", "21"),
    ("fanout_cursors", "110000000170"),
    ("fanout_cursors_incarnation", "1100000001700000000000000009"),
    (
        "anchor_fanout_link",
        "220000000170000000000000000700000001630123456789abcdef000000020000000000000002",
    ),
    ("settle_fanout_links", "23000000000000002a"),
    ("read_index", "24"),
    ("ready_counts", "25000000066f726465727300000002540be400"),
    ("cancel_request", "260000000000000107"),
    ("probe_group", "27000000026e33"),
    ("known_offsets", "28"),
    ("list_partition_segments", "16000000066f7264657273000000020000000000000007"),
    (
        "fetch_segment_chunk",
        "17000000066f7264657273000000020000000000000064000000000000002000000000001000000000000000000007",
    ),
    ("prepare_handoff", "18000000066f72646572730000000200000006fc23ac00"),
    (
        "reply_ok",
        "00c8000000106170706c69636174696f6e2f6a736f6e0000001b7b226f6666736574223a34322c22706172746974696f6e223a317d",
    ),
    ("reply_empty", "00cc0000000000000000"),
    (
        "reply_error",
        "0190000000106170706c69636174696f6e2f6a736f6e000000287b226572726f72223a22756e737570706f7274656420727063206f7065726174696f6e203939227d",
    ),
];

fn golden(name: &str) -> Vec<u8> {
    let hex =
        GOLDEN.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("no golden {name}")).1;
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

fn record(
    key: Option<&'static str>,
    partition: i32,
    payload: &'static str,
    created_at: i64,
    inc: u64,
) -> CommitRecord {
    CommitRecord {
        topic: "t".into(),
        key: key.map(|k| Bytes::from_static(k.as_bytes())),
        partition,
        payload: Bytes::from_static(payload.as_bytes()),
        created_at,
        incarnation: NonZeroU64::new(inc),
    }
}

fn receipt() -> Receipt {
    Receipt { topic: "orders".into(), partition: 1, offset: 42, nonce: 7 }
}

/// The consume of the golden bytes, asking for `max` messages.
fn consume(max: u32) -> Request {
    Request::Consume(Consume {
        topic: "orders".into(),
        partition: 2,
        has_partition: true,
        offset: -1,
        has_offset: false,
        wait_nanos: 10_000_000_000,
        local_only: true,
        max,
    })
}

fn user(body: &'static str) -> UserBody {
    UserBody { username: "alice".into(), body: Bytes::from_static(body.as_bytes()) }
}

fn samples() -> Vec<(&'static str, Request)> {
    let r1 = || record(Some("k"), 0, "hello", 1_700_000_000_000, 0);
    let r2 = || record(None, 1, "world", 1_700_000_000_001, 0);
    let with = |mut r: CommitRecord, inc: u64| {
        r.incarnation = NonZeroU64::new(inc);
        r
    };
    vec![
        ("consume", consume(1)),
        ("consume_max", consume(10)),
        ("ack", Request::Ack(receipt())),
        ("extend_ack", Request::ExtendAck(receipt())),
        ("nack", Request::Nack(receipt())),
        (
            "create_topic",
            Request::CreateTopic(TopicBody {
                topic: "".into(),
                body: Bytes::from_static(br#"{"name":"t"}"#),
            }),
        ),
        (
            "alter_topic",
            Request::AlterTopic(TopicBody {
                topic: "t".into(),
                body: Bytes::from_static(br#"{"retention":"1h"}"#),
            }),
        ),
        ("delete_topic", Request::DeleteTopic("t".into())),
        ("purge_topic", Request::PurgeTopic("t".into())),
        ("get_topic", Request::GetTopic("t".into())),
        (
            "topic_partition_stats",
            Request::TopicPartitionStats(PartitionStatsRequest {
                topic: "orders".into(),
                partition: 2,
                incarnation: None,
            }),
        ),
        (
            "topic_partition_stats_incarnation",
            Request::TopicPartitionStats(PartitionStatsRequest {
                topic: "orders".into(),
                partition: 2,
                incarnation: NonZeroU64::new(9),
            }),
        ),
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
        ("commit_produce", Request::CommitProduce(r1())),
        ("commit_produce_incarnation", Request::CommitProduce(with(r1(), 5))),
        ("commit_produce_batch", Request::CommitProduceBatch(vec![r1(), r2()])),
        (
            "commit_produce_batch_incarnations",
            Request::CommitProduceBatch(vec![with(r1(), 5), with(r1(), 5), r2()]),
        ),
        ("create_user", Request::CreateUser(user(r#"{"password":"x"}"#))),
        ("update_user", Request::UpdateUser(user(r#"{"password":"y"}"#))),
        ("delete_user", Request::DeleteUser(user(""))),
        (
            "attach_child",
            Request::AttachChild(ChildLink {
                parent: "p".into(),
                child: "c".into(),
                delay_ms: 60_000,
            }),
        ),
        (
            "detach_child",
            Request::DetachChild(ChildLink { parent: "p".into(), child: "c".into(), delay_ms: 0 }),
        ),
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
        ("propose_command", Request::ProposeCommand(Bytes::from_static(b"{}"))),
        ("raft_append_entries", Request::RaftAppendEntries(Bytes::from_static(b"{}"))),
        ("raft_vote", Request::RaftVote(Bytes::from_static(b"{}"))),
        ("raft_install_snapshot", Request::RaftInstallSnapshot(Bytes::from_static(b"{}"))),
        ("raft_campaign", Request::RaftCampaign),
        (
            "fanout_cursors",
            Request::FanoutCursors(FanoutCursorsRequest { topic: "p".into(), incarnation: None }),
        ),
        (
            "fanout_cursors_incarnation",
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
                epoch: 0x0123_4567_89ab_cdef,
                partitions: vec![0, 2],
            }),
        ),
        ("settle_fanout_links", Request::SettleFanoutLinks(42)),
        ("read_index", Request::ReadIndex),
        (
            "ready_counts",
            Request::ReadyCounts(ReadyCounts {
                topic: "orders".into(),
                wait_nanos: 10_000_000_000,
            }),
        ),
        ("cancel_request", Request::CancelRequest(263)),
        ("probe_group", Request::ProbeGroup("n3".into())),
        ("known_offsets", Request::KnownOffsets),
        (
            "list_partition_segments",
            Request::ListPartitionSegments(MovePartition {
                topic: "orders".into(),
                partition: 2,
                incarnation: NonZeroU64::new(7),
            }),
        ),
        (
            "fetch_segment_chunk",
            Request::FetchSegmentChunk(SegmentChunk {
                topic: "orders".into(),
                partition: 2,
                base: 100,
                at: 32,
                length: 1 << 20,
                incarnation: NonZeroU64::new(7),
            }),
        ),
        (
            "prepare_handoff",
            Request::PrepareHandoff(Handoff {
                topic: "orders".into(),
                partition: 2,
                freeze_ttl_nanos: 30_000_000_000,
                incarnation: None,
            }),
        ),
    ]
}

fn replies() -> Vec<(&'static str, Reply)> {
    vec![
        ("reply_ok", Reply::json(200, &br#"{"offset":42,"partition":1}"#[..])),
        ("reply_empty", Reply { status: 204, content_type: String::new(), body: Bytes::new() }),
        ("reply_error", Reply::for_decode_error(&Error::UnsupportedOp(99))),
    ]
}

#[test]
fn every_request_encodes_to_its_golden_bytes_and_decodes_back() {
    let samples = samples();
    assert_eq!(samples.len() + replies().len(), GOLDEN.len(), "a golden without a sample");
    for (name, req) in samples {
        let want = golden(name);
        assert_eq!(req.encode(), want, "{name}: encoding");
        assert_eq!(Request::decode(&want).unwrap(), req, "{name}: decoding");
    }
}

#[test]
fn every_reply_encodes_to_its_golden_bytes_and_decodes_back() {
    for (name, reply) in replies() {
        let want = golden(name);
        assert_eq!(reply.encode(), want, "{name}: encoding");
        assert_eq!(Reply::decode(&want).unwrap(), reply, "{name}: decoding");
    }
}

#[test]
fn a_batch_without_incarnations_is_the_bytes_an_older_release_sends() {
    let plain = golden("commit_produce_batch");
    let with = golden("commit_produce_batch_incarnations");
    // No section at all when no record has an id.
    assert_eq!(Request::decode(&plain).unwrap().encode(), plain);
    // The section is exactly: runs 2 | (2, id 5) | (1, no id).
    let tail = &with[with.len() - 28..];
    assert_eq!(
        tail,
        [&[0, 0, 0, 2][..], &[0, 0, 0, 2], &5u64.to_be_bytes(), &[0, 0, 0, 1], &0u64.to_be_bytes()]
            .concat()
    );
}

#[test]
fn op_codes_are_the_specs_numbering_and_append_only() {
    for (i, op) in Op::ALL.iter().enumerate() {
        assert_eq!(*op as u8 as usize, i + 1, "{op:?}");
        assert_eq!(Op::from_u8(*op as u8), Some(*op));
    }
    assert_eq!(Op::from_u8(0), None);
    assert_eq!(Op::from_u8(41), None);
    assert_eq!(
        (Op::CommitProduceBatch as u8, Op::GetTopic as u8, Op::JoinCluster as u8),
        (11, 20, 21)
    );
    assert_eq!(
        [
            Op::ProposeCommand,
            Op::RaftAppendEntries,
            Op::RaftVote,
            Op::RaftInstallSnapshot,
            Op::RaftCampaign
        ]
        .map(|op| op as u8),
        [29, 30, 31, 32, 33]
    );
    assert_eq!((Op::AnchorFanoutLink as u8, Op::SettleFanoutLinks as u8), (34, 35));
    assert_eq!(Op::ReadIndex as u8, 36);
    assert_eq!(Op::ReadyCounts as u8, 37);
    assert_eq!(Op::CancelRequest as u8, 38);
    assert_eq!(Op::ProbeGroup as u8, 39);
    assert_eq!(Op::KnownOffsets as u8, 40);
}

#[test]
fn an_unknown_or_unserved_op_is_unsupported_with_400() {
    for code in [0u8, 1, 25, 28, 41, 99, 255] {
        let e = Request::decode(&[code, 0, 0]).unwrap_err();
        assert!(matches!(e, Error::UnsupportedOp(c) if c == code), "{code}: {e}");
        let reply = Reply::for_decode_error(&e);
        assert_eq!(reply.status, 400);
        let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(body["error"], format!("unsupported rpc operation {code}"));
    }
    assert!(matches!(Request::decode(&[]), Err(Error::Protocol(_))));
}

#[test]
fn every_truncation_of_every_request_and_reply_is_refused() {
    for (name, _) in GOLDEN {
        let full = golden(name);
        let reply = name.starts_with("reply");
        for cut in 1..full.len() {
            let part = &full[..cut];
            let ok =
                if reply { Reply::decode(part).is_ok() } else { Request::decode(part).is_ok() };
            // Cutting exactly the optional incarnation field or section off
            // leaves the valid, shorter form.
            let optional_cut = (*name == "commit_produce_incarnation" && cut == full.len() - 8)
                || (*name == "topic_partition_stats_incarnation" && cut == full.len() - 8)
                || (*name == "fanout_cursors_incarnation" && cut == full.len() - 8)
                || (*name == "list_partition_segments" && cut == full.len() - 8)
                || (*name == "fetch_segment_chunk" && cut == full.len() - 8)
                || (*name == "join_cluster_http" && cut == full.len() - 17)
                || (*name == "consume_max" && cut == full.len() - 4)
                || (*name == "commit_produce_batch_incarnations" && cut == full.len() - 28);
            assert_eq!(ok, optional_cut, "{name} cut at {cut}");
        }
    }
}

#[test]
fn trailing_bytes_are_refused() {
    for (name, _) in GOLDEN {
        let mut b = golden(name);
        b.push(0);
        let e = if name.starts_with("reply") {
            Reply::decode(&b).unwrap_err()
        } else {
            Request::decode(&b).unwrap_err()
        };
        // CommitProduce reads a lone trailing byte as a cut incarnation id,
        // and a batch as a cut incarnation section: refused all the same.
        assert!(matches!(e, Error::TrailingBytes(1) | Error::Truncated { .. }), "{name}: {e}");
    }
}

#[test]
fn bad_fields_are_refused_with_what_is_wrong() {
    // bool byte 2 (has_partition of consume: after op, topic, partition).
    let mut b = golden("consume");
    b[1 + 4 + 6 + 4] = 2;
    assert!(matches!(Request::decode(&b), Err(Error::InvalidField { field: "has_partition", .. })));
    // A batch consume's max: 2..=100 (1 is written as no field at all).
    for max in [0u32, 1, 101, u32::MAX] {
        let mut b = golden("consume");
        b.extend_from_slice(&max.to_be_bytes());
        assert!(
            matches!(Request::decode(&b), Err(Error::InvalidField { field: "max", .. })),
            "max {max}"
        );
    }
    // Invalid UTF-8 in a string.
    let mut b = golden("delete_topic");
    b[5] = 0xff;
    assert!(matches!(Request::decode(&b), Err(Error::InvalidField { field: "topic", .. })));
    // Incarnation id 0 on CommitProduce.
    let mut b = golden("commit_produce");
    b.extend_from_slice(&0u64.to_be_bytes());
    assert!(matches!(Request::decode(&b), Err(Error::InvalidField { field: "incarnation", .. })));
}

fn batch_with_section(section: &[u8]) -> Vec<u8> {
    let mut b = golden("commit_produce_batch");
    b.extend_from_slice(section);
    b
}

fn run(n: u32, id: u64) -> Vec<u8> {
    [n.to_be_bytes().to_vec(), id.to_be_bytes().to_vec()].concat()
}

#[test]
fn incarnation_sections_must_cover_every_record_exactly() {
    let runs = |n: u32| n.to_be_bytes().to_vec();
    let bad = [
        ("zero runs", runs(0)),
        ("more runs than records", [runs(3), run(1, 5), run(1, 5), run(1, 5)].concat()),
        ("runs short of the records", [runs(1), run(1, 5)].concat()),
        ("runs past the records", [runs(2), run(1, 5), run(2, 6)].concat()),
        ("an empty run", [runs(2), run(0, 5), run(2, 6)].concat()),
        ("a run count beyond the bytes", [runs(2), run(2, 5)].concat()),
        ("a cut run", [runs(1), run(2, 5)[..6].to_vec()].concat()),
        ("adjacent runs sharing an id", [runs(2), run(1, 5), run(1, 5)].concat()),
        ("a section without an id", [runs(1), run(2, 0)].concat()),
    ];
    for (what, section) in bad {
        assert!(Request::decode(&batch_with_section(&section)).is_err(), "{what}");
    }
    let Request::CommitProduceBatch(recs) =
        Request::decode(&batch_with_section(&[runs(2), run(1, 0), run(1, 9)].concat())).unwrap()
    else {
        panic!("not a batch")
    };
    assert_eq!(
        recs.iter().map(|r| r.incarnation.map(NonZeroU64::get)).collect::<Vec<_>>(),
        [None, Some(9)]
    );
}

#[test]
fn a_lying_count_is_refused_before_allocating() {
    // count i32::MAX with no records behind it; and a negative count.
    let mut b = vec![Op::CommitProduceBatch as u8];
    b.extend_from_slice(&i32::MAX.to_be_bytes());
    assert!(matches!(Request::decode(&b), Err(Error::Truncated { what: "batch records", .. })));
    let mut b = vec![Op::CommitProduceBatch as u8];
    b.extend_from_slice(&(-1i32).to_be_bytes());
    assert!(matches!(Request::decode(&b), Err(Error::InvalidField { field: "count", .. })));
    // A string length of 4 GiB - 1 with three bytes behind it.
    let mut b = vec![Op::DeleteTopic as u8, 0xff, 0xff, 0xff, 0xff, b'a', b'b', b'c'];
    assert!(matches!(
        Request::decode(&b),
        Err(Error::Truncated { need: 0xffff_ffff, have: 3, .. })
    ));
    b[0] = Op::GetTopic as u8;
    assert!(Request::decode(&b).is_err());
}

#[test]
fn an_anchor_naming_more_partitions_than_it_carries_is_refused_before_allocating() {
    let mut b = golden("anchor_fanout_link");
    let at = b.len() - 12;
    for count in [3u32, ANCHOR_MAX_PARTITIONS + 1, u32::MAX] {
        b[at..at + 4].copy_from_slice(&count.to_be_bytes());
        let e = Request::decode(&b).unwrap_err();
        assert!(matches!(e, Error::InvalidField { field: "count", .. }), "{count}: {e}");
    }
}

#[test]
fn ops_pick_their_lane_and_timeout() {
    use std::time::Duration;
    let s = samples();
    let get = |n: &str| &s.iter().find(|(name, _)| *name == n).unwrap().1;
    assert_eq!(get("commit_produce_batch").lane(), Lane::Produce);
    assert_eq!(get("consume").lane(), Lane::Consume);
    assert_eq!(get("nack").lane(), Lane::Ack);
    assert_eq!(get("join_cluster").lane(), Lane::Control);
    assert_eq!(get("commit_produce").timeout(), Duration::from_secs(30));
    assert_eq!(get("create_topic").timeout(), Duration::from_secs(75));
    assert_eq!(get("delete_topic").timeout(), Duration::from_secs(30));
    assert_eq!(get("purge_topic").timeout(), Duration::from_secs(17));
    assert_eq!(get("consume").timeout(), Duration::from_secs(12), "10 s wait + 2 s");
    assert_eq!(get("get_topic").timeout(), Duration::from_secs(5));
    let long = Request::Consume(Consume {
        topic: "t".into(),
        partition: 0,
        has_partition: false,
        offset: 0,
        has_offset: false,
        wait_nanos: i64::MAX,
        local_only: false,
        max: 1,
    });
    assert_eq!(long.timeout(), Duration::from_secs(32), "wait clamped to 30 s + 2 s");
}

/// A field as the wire has it: u32 length and the bytes.
fn lp(b: &[u8]) -> Vec<u8> {
    [&(b.len() as u32).to_be_bytes()[..], b].concat()
}

#[test]
fn large_payloads_travel_as_references_with_the_same_bytes_on_the_wire() {
    let big = Bytes::from(vec![0xab; codec::SHARE_MIN_BYTES]);
    let small = Bytes::from(vec![0xcd; codec::SHARE_MIN_BYTES - 1]);
    let rec = |payload: &Bytes, key: Option<&'static str>, inc| CommitRecord {
        payload: payload.clone(),
        ..record(key, 3, "", 1_700_000_000_000, inc)
    };
    let req = Request::CommitProduceBatch(vec![
        rec(&big, Some("k"), 9),
        rec(&small, None, 9),
        rec(&big, None, 9),
    ]);
    // Built by hand from SPEC §7.4's field list.
    let record_bytes = |key: &[u8], payload: &[u8]| {
        [
            lp(b"t"),
            lp(key),
            3i32.to_be_bytes().to_vec(),
            lp(payload),
            1_700_000_000_000i64.to_be_bytes().to_vec(),
        ]
        .concat()
    };
    let want = [
        vec![Op::CommitProduceBatch as u8],
        3i32.to_be_bytes().to_vec(),
        record_bytes(b"k", &big),
        record_bytes(b"", &small),
        record_bytes(b"", &big),
        [&1u32.to_be_bytes()[..], &3u32.to_be_bytes(), &9u64.to_be_bytes()].concat(),
    ]
    .concat();
    let chunks = req.encode_chunks();
    assert_eq!(codec::concat(&chunks), want);
    assert_eq!(req.encode(), want);
    assert!(chunks.iter().all(|c| !c.is_empty()), "no empty chunk");
    // Both large payloads are the caller's buffer, not copies; the short
    // one is copied into a field run.
    let shared = chunks.iter().filter(|c| c.as_ptr() == big.as_ptr()).count();
    assert_eq!(shared, 2, "{} chunks", chunks.len());
    assert!(!chunks.iter().any(|c| c.as_ptr() == small.as_ptr()));
    assert_eq!(Request::decode(&want).unwrap(), req);

    let reply = Reply::json(200, big.clone());
    let chunks = reply.encode_chunks();
    let want = [&200u16.to_be_bytes()[..], &lp(b"application/json"), &lp(&big)].concat();
    assert_eq!(codec::concat(&chunks), want);
    assert!(chunks.iter().any(|c| c.as_ptr() == big.as_ptr()));
    assert_eq!(Reply::decode(&want).unwrap(), reply);
}
