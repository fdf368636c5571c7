//! Node RPC requests and replies (SPEC §7.4): the payloads of NodeRequest
//! and NodeReply frames.
//!
//! ```text
//! request = op u8 | fields...            (no bytes after the last field)
//! reply   = status u16 | u32 len + content type | u32 len + body
//! field   = int: big-endian (i32, i64, u32, u64)
//!           string, bytes: u32 len + data (strings UTF-8)
//!           bool: one byte, 0 or 1
//! ```
//!
//! Invariants:
//! - op codes are append-only: a number, once given, is never reused or
//!   renumbered ([`Op`] lists all of SPEC's);
//! - a request with an op this node does not serve decodes to
//!   [`Error::UnsupportedOp`], which the server answers with
//!   `400 unsupported rpc operation N`;
//! - every length is checked against the bytes left before anything is
//!   copied or allocated, and trailing bytes are refused;
//! - CommitProduce (10) may end with an optional incarnation id (u64,
//!   non-zero); CommitProduceBatch (11) may end with an optional
//!   incarnation section, written only when some record has an id:
//!   `runs u32 | runs × (records u32 | id u64)`, runs of consecutive
//!   records that share an id, in record order, covering every record
//!   exactly; id 0 marks a run of records without one. Runs are maximal
//!   (adjacent runs never share an id) and a section has at least one
//!   non-zero id, so every batch has one encoding. Without ids the bytes
//!   are exactly those of a release that knows no incarnations.

use crate::codec::{self, Dec, Enc};
use crate::error::{Error, Result};
use crate::limits::{
    COMMIT_TIMEOUT, CONSUME_MAX_WAIT, CREATE_FORWARD_TIMEOUT, DELETE_FORWARD_TIMEOUT,
    LONG_POLL_SLACK, PURGE_TIMEOUT, REPLY_TIMEOUT,
};
use bytes::Bytes;
use std::num::NonZeroU64;
use std::time::Duration;

/// Every op code of SPEC §7.4. Append-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    /// 1: produce through another node.
    Produce = 1,
    /// 2: consume from the owner.
    Consume = 2,
    /// 3: ack a delivery.
    Ack = 3,
    /// 4: create a topic (forwarded to the leader).
    CreateTopic = 4,
    /// 5: alter a topic.
    AlterTopic = 5,
    /// 6: delete a topic.
    DeleteTopic = 6,
    /// 7: purge a topic.
    PurgeTopic = 7,
    /// 8: one partition's stats.
    TopicPartitionStats = 8,
    /// 9: membership heartbeat / upsert.
    RegisterMember = 9,
    /// 10: commit one record on its owner.
    CommitProduce = 10,
    /// 11: commit a batch of records on their owner.
    CommitProduceBatch = 11,
    /// 12: create a user.
    CreateUser = 12,
    /// 13: update a user.
    UpdateUser = 13,
    /// 14: delete a user.
    DeleteUser = 14,
    /// 15: attach a fan-out child.
    AttachChild = 15,
    /// 16: detach a fan-out child.
    DetachChild = 16,
    /// 17: fan-out cursor positions.
    FanoutCursors = 17,
    /// 18: extend a lease.
    ExtendAck = 18,
    /// 19: nack a delivery.
    Nack = 19,
    /// 20: the leader's view of a topic (leader confirmation).
    GetTopic = 20,
    /// 21: join the cluster.
    JoinCluster = 21,
    /// 22: list a partition's segments (moves).
    ListPartitionSegments = 22,
    /// 23: fetch a segment chunk (moves).
    FetchSegmentChunk = 23,
    /// 24: freeze a partition for handoff.
    PrepareHandoff = 24,
    /// 25: (cancel) decommission a member.
    DecommissionMember = 25,
    /// 26: flip a move's owner (CAS).
    CompleteMove = 26,
    /// 27: abort a move (CAS).
    AbortMove = 27,
    /// 28: a partition's assignment.
    GetAssignment = 28,
    /// 29: a metastore command forwarded to the Raft leader.
    ProposeCommand = 29,
    /// 30: Raft AppendEntries.
    RaftAppendEntries = 30,
    /// 31: Raft RequestVote.
    RaftVote = 31,
    /// 32: Raft InstallSnapshot (one chunk).
    RaftInstallSnapshot = 32,
    /// 33: ask a follower to start an election now (leadership handover).
    RaftCampaign = 33,
    /// 34: anchor a new fan-out link's cursors on a parent partition's
    /// owner before the link is committed.
    AnchorFanoutLink = 34,
    /// 35: apply the metastore up to an index and stop the fan-out cursors
    /// of links gone by then.
    SettleFanoutLinks = 35,
    /// 36: the Raft leader's read index (its commit index once a quorum
    /// confirmed it still leads): how far a replica must apply to be
    /// caught up (SPEC §7.1).
    ReadIndex = 36,
    /// 37: how many messages each of the receiver's partitions of a topic
    /// has ready to lease, once one has some (a long poll that leases
    /// nothing).
    ReadyCounts = 37,
    /// 38: stop a request this connection sent that is still running (its
    /// requester went away); served by the transport, never a handler.
    CancelRequest = 38,
    /// 39: what the receiver knows of the group and of the asker, for a
    /// node without Raft state deciding whether it may bootstrap.
    ProbeGroup = 39,
    /// 40: the offsets the receiver has seen other owners assign or serve,
    /// per partition (the start offsets of a removed member's partitions).
    KnownOffsets = 40,
}

impl Op {
    /// Every op, in code order.
    pub const ALL: [Op; 40] = [
        Op::Produce,
        Op::Consume,
        Op::Ack,
        Op::CreateTopic,
        Op::AlterTopic,
        Op::DeleteTopic,
        Op::PurgeTopic,
        Op::TopicPartitionStats,
        Op::RegisterMember,
        Op::CommitProduce,
        Op::CommitProduceBatch,
        Op::CreateUser,
        Op::UpdateUser,
        Op::DeleteUser,
        Op::AttachChild,
        Op::DetachChild,
        Op::FanoutCursors,
        Op::ExtendAck,
        Op::Nack,
        Op::GetTopic,
        Op::JoinCluster,
        Op::ListPartitionSegments,
        Op::FetchSegmentChunk,
        Op::PrepareHandoff,
        Op::DecommissionMember,
        Op::CompleteMove,
        Op::AbortMove,
        Op::GetAssignment,
        Op::ProposeCommand,
        Op::RaftAppendEntries,
        Op::RaftVote,
        Op::RaftInstallSnapshot,
        Op::RaftCampaign,
        Op::AnchorFanoutLink,
        Op::SettleFanoutLinks,
        Op::ReadIndex,
        Op::ReadyCounts,
        Op::CancelRequest,
        Op::ProbeGroup,
        Op::KnownOffsets,
    ];

    /// The op of a code byte.
    pub fn from_u8(code: u8) -> Option<Op> {
        Op::ALL.get((code as usize).wrapping_sub(1)).copied()
    }

    /// The name used in logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Op::Produce => "produce",
            Op::Consume => "consume",
            Op::Ack => "ack",
            Op::CreateTopic => "create_topic",
            Op::AlterTopic => "alter_topic",
            Op::DeleteTopic => "delete_topic",
            Op::PurgeTopic => "purge_topic",
            Op::TopicPartitionStats => "topic_partition_stats",
            Op::RegisterMember => "register_member",
            Op::CommitProduce => "commit_produce",
            Op::CommitProduceBatch => "commit_produce_batch",
            Op::CreateUser => "create_user",
            Op::UpdateUser => "update_user",
            Op::DeleteUser => "delete_user",
            Op::AttachChild => "attach_child",
            Op::DetachChild => "detach_child",
            Op::FanoutCursors => "fanout_cursors",
            Op::ExtendAck => "extend_ack",
            Op::Nack => "nack",
            Op::GetTopic => "get_topic",
            Op::JoinCluster => "join_cluster",
            Op::ListPartitionSegments => "list_partition_segments",
            Op::FetchSegmentChunk => "fetch_segment_chunk",
            Op::PrepareHandoff => "prepare_handoff",
            Op::DecommissionMember => "decommission_member",
            Op::CompleteMove => "complete_move",
            Op::AbortMove => "abort_move",
            Op::GetAssignment => "get_assignment",
            Op::ProposeCommand => "propose_command",
            Op::RaftAppendEntries => "raft_append_entries",
            Op::RaftVote => "raft_vote",
            Op::RaftInstallSnapshot => "raft_install_snapshot",
            Op::RaftCampaign => "raft_campaign",
            Op::AnchorFanoutLink => "anchor_fanout_link",
            Op::SettleFanoutLinks => "settle_fanout_links",
            Op::ReadIndex => "read_index",
            Op::ReadyCounts => "ready_counts",
            Op::CancelRequest => "cancel_request",
            Op::ProbeGroup => "probe_group",
            Op::KnownOffsets => "known_offsets",
        }
    }
}

/// Consume (2): `topic, partition i32, has_partition, offset i64,
/// has_offset, wait_nanos i64, local_only`, and an optional trailing `max
/// u32` (1..=[`CONSUME_MAX_BATCH`], written only when above 1): a batch
/// consume, answered in the batch shape. Without it the bytes are SPEC's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consume {
    /// Topic name.
    pub topic: String,
    /// Partition (meaningful when `has_partition`).
    pub partition: i32,
    /// Whether a partition was asked for.
    pub has_partition: bool,
    /// Offset (meaningful when `has_offset`).
    pub offset: i64,
    /// Whether an offset was asked for (replay).
    pub has_offset: bool,
    /// Long-poll wait in nanoseconds (the owner clamps it to 30 s).
    pub wait_nanos: i64,
    /// Only the receiving node's partitions.
    pub local_only: bool,
    /// At most this many messages, in the batch shape (`max=` of the HTTP
    /// consume); 1 with the single-message shape.
    pub max: u32,
}

/// ReadyCounts (37): `topic, wait_nanos i64`. The receiver answers 200
/// with `{"ready":[[partition, messages], ...]}`, every partition of the
/// topic it owns and how many of its messages a consume could lease now,
/// as soon as one of them has any or once the wait (clamped to
/// [`CONSUME_MAX_WAIT`]) is over. It leases nothing: a node that serves a
/// queue-mode consume learns from it which other owners have messages
/// (wait 0) and when one gets some (a long wait).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyCounts {
    /// Topic name.
    pub topic: String,
    /// How long to wait for a message, in nanoseconds.
    pub wait_nanos: i64,
}

/// The largest `max` of a forwarded consume (the HTTP consume's bound).
pub const CONSUME_MAX_BATCH: u32 = 100;

/// Ack (3), ExtendAck (18), Nack (19): `topic, partition i32, offset i64,
/// nonce i64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// Topic name.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset of the delivery.
    pub offset: i64,
    /// The lease's nonce.
    pub nonce: i64,
}

/// CreateTopic (4, topic ""), AlterTopic (5): `topic, body` (the HTTP JSON body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicBody {
    /// Topic name ("" for create: the name is in the body).
    pub topic: String,
    /// JSON body.
    pub body: Bytes,
}

/// RegisterMember (9): `id, addr, cluster_addr, status, last_heartbeat i64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterMember {
    /// Member id.
    pub id: String,
    /// Advertised HTTP (and QUIC) address.
    pub addr: String,
    /// Raft address.
    pub cluster_addr: String,
    /// `alive` / `dead`.
    pub status: String,
    /// Unix nanoseconds of the heartbeat.
    pub last_heartbeat: i64,
}

/// One record of CommitProduce / CommitProduceBatch: `topic, key,
/// partition i32, payload, created_at i64` (an empty key is no key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRecord {
    /// Topic name.
    pub topic: String,
    /// Partition key; `None` is sent as an empty key.
    pub key: Option<Bytes>,
    /// Partition.
    pub partition: i32,
    /// Payload.
    pub payload: Bytes,
    /// Accept time, unix milliseconds.
    pub created_at: i64,
    /// The topic incarnation the payload was validated against, if any.
    pub incarnation: Option<NonZeroU64>,
}

/// Bytes of a record with empty strings: the smallest a count can promise.
const MIN_RECORD_BYTES: usize = 4 + 4 + 4 + 4 + 8;
/// Bytes of one incarnation run.
const RUN_BYTES: usize = 4 + 8;

impl CommitRecord {
    fn put(&self, e: &mut Enc) {
        e.str(&self.topic)
            .bytes(self.key.as_deref().unwrap_or_default())
            .i32(self.partition)
            .shared(&self.payload)
            .i64(self.created_at);
    }

    fn get(d: &mut Dec<'_>) -> Result<CommitRecord> {
        let topic = d.string("topic")?;
        let key = d.bytes("key")?;
        Ok(CommitRecord {
            topic,
            key: (!key.is_empty()).then_some(key),
            partition: d.i32("partition")?,
            payload: d.bytes("payload")?,
            created_at: d.i64("created_at")?,
            incarnation: None,
        })
    }
}

/// UserRequests 12/13/14: `username, body`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserBody {
    /// User name.
    pub username: String,
    /// JSON body (empty for delete).
    pub body: Bytes,
}

/// AttachChild (15) / DetachChild (16): `parent, child, delay_ms i64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildLink {
    /// Parent topic.
    pub parent: String,
    /// Child topic.
    pub child: String,
    /// Delay of the link in milliseconds.
    pub delay_ms: i64,
}

/// JoinCluster (21): `id, cluster_addr` and, optionally, `http_addr`
/// (written only when known; a reader that knows no HTTP address reads the
/// two-field form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinCluster {
    /// Joining member's id.
    pub id: String,
    /// Its cluster (Raft) address.
    pub cluster_addr: String,
    /// Its advertised HTTP address, if sent.
    pub http_addr: Option<String>,
}

/// TopicPartitionStats (8): `topic, partition i32` and, optionally, the
/// caller's incarnation id of the topic (u64, written only when known; the
/// owner answers 404 when its live topic is another incarnation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionStatsRequest {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// The incarnation the caller asks about.
    pub incarnation: Option<NonZeroU64>,
}

/// ListPartitionSegments (22): `topic`, `partition i32`, and an optional
/// trailing incarnation (the one the move was planned for; absent: the
/// live one). Answered 200 with a [`crate::moves::SegmentsBody`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovePartition {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// The incarnation the move was planned for.
    pub incarnation: Option<NonZeroU64>,
}

/// FetchSegmentChunk (23): `topic`, `partition i32`, `base i64` (the
/// segment), `at i64` (a byte position in it), `length i64` (at most
/// [`narad_meta::limits::MOVE_CHUNK_BYTES`]), and an optional trailing
/// incarnation. Answered 200 with the raw bytes (empty at the segment's
/// verified end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentChunk {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// The segment's base offset.
    pub base: i64,
    /// The first byte.
    pub at: i64,
    /// How many bytes at most.
    pub length: i64,
    /// The incarnation the move was planned for.
    pub incarnation: Option<NonZeroU64>,
}

/// PrepareHandoff (24): `topic`, `partition i32`, `freeze_ttl_nanos i64`,
/// and an optional trailing incarnation. The asker (the authenticated
/// peer) is the move's target. Answered 200 with a
/// [`crate::moves::FrozenBody`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handoff {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// How long the freeze lasts unless renewed.
    pub freeze_ttl_nanos: i64,
    /// The incarnation the move was planned for.
    pub incarnation: Option<NonZeroU64>,
}

/// FanoutCursors (17): `topic` (the parent) and an optional trailing
/// incarnation (the parent's, as the caller holds it). The answer is this
/// node's fan-out figures of the parent's children over the partitions
/// whose cursors run on it (JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanoutCursorsRequest {
    /// The parent topic.
    pub topic: String,
    /// Its incarnation as the caller holds it.
    pub incarnation: Option<NonZeroU64>,
}

/// AnchorFanoutLink (34): `parent, incarnation u64, child, epoch u64,
/// count u32, count × partition u32` (count at most
/// [`ANCHOR_MAX_PARTITIONS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnchorFanoutLink {
    /// The parent topic.
    pub parent: String,
    /// The parent's incarnation.
    pub incarnation: u64,
    /// The child topic.
    pub child: String,
    /// The new link's attach epoch.
    pub epoch: u64,
    /// The parent partitions to anchor (those the caller believes the
    /// receiver owns).
    pub partitions: Vec<u32>,
}

/// The most partitions one AnchorFanoutLink names (a topic has at most
/// 108; the bound is checked before anything is allocated).
pub const ANCHOR_MAX_PARTITIONS: u32 = 1024;

/// A request this node serves, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// 2.
    Consume(Consume),
    /// 3.
    Ack(Receipt),
    /// 18.
    ExtendAck(Receipt),
    /// 19.
    Nack(Receipt),
    /// 4.
    CreateTopic(TopicBody),
    /// 5.
    AlterTopic(TopicBody),
    /// 6.
    DeleteTopic(String),
    /// 7.
    PurgeTopic(String),
    /// 20.
    GetTopic(String),
    /// 8.
    TopicPartitionStats(PartitionStatsRequest),
    /// 9.
    RegisterMember(RegisterMember),
    /// 10 (the record's incarnation is the optional trailing id).
    CommitProduce(CommitRecord),
    /// 11.
    CommitProduceBatch(Vec<CommitRecord>),
    /// 12.
    CreateUser(UserBody),
    /// 13.
    UpdateUser(UserBody),
    /// 14.
    DeleteUser(UserBody),
    /// 15.
    AttachChild(ChildLink),
    /// 16.
    DetachChild(ChildLink),
    /// 21.
    JoinCluster(JoinCluster),
    /// 29: `command` (bytes: the command as JSON).
    ProposeCommand(Bytes),
    /// 30: `rpc` (bytes: openraft's AppendEntriesRequest as JSON).
    RaftAppendEntries(Bytes),
    /// 31: `rpc` (bytes: openraft's VoteRequest as JSON).
    RaftVote(Bytes),
    /// 32: `rpc` (bytes: openraft's InstallSnapshotRequest as JSON).
    RaftInstallSnapshot(Bytes),
    /// 33: no fields.
    RaftCampaign,
    /// 17.
    FanoutCursors(FanoutCursorsRequest),
    /// 34.
    AnchorFanoutLink(AnchorFanoutLink),
    /// 35: `applied_index u64`.
    SettleFanoutLinks(u64),
    /// 36: no fields.
    ReadIndex,
    /// 37.
    ReadyCounts(ReadyCounts),
    /// 38: `request_id u64`, the id of a NodeRequest this connection sent
    /// (answered 204 when it was running and is stopped, 404 when nothing
    /// runs under that id).
    CancelRequest(u64),
    /// 39: `id`, the asking node's id (answered 200 with a
    /// `raft::first_start::PeerView` as JSON).
    ProbeGroup(String),
    /// 22.
    ListPartitionSegments(MovePartition),
    /// 23.
    FetchSegmentChunk(SegmentChunk),
    /// 24.
    PrepareHandoff(Handoff),
    /// 40: no fields. Answered 200 with `{"partitions":[{"topic",
    /// "incarnation","partition","next_offset"}...]}`: for each partition
    /// of another owner, the highest offset this node saw that owner assign
    /// (a commit's answer) or serve (a forwarded consume or ack), plus one,
    /// since this process started.
    KnownOffsets,
}

impl Request {
    /// Its op code.
    pub fn op(&self) -> Op {
        match self {
            Request::Consume(_) => Op::Consume,
            Request::Ack(_) => Op::Ack,
            Request::ExtendAck(_) => Op::ExtendAck,
            Request::Nack(_) => Op::Nack,
            Request::CreateTopic(_) => Op::CreateTopic,
            Request::AlterTopic(_) => Op::AlterTopic,
            Request::DeleteTopic(_) => Op::DeleteTopic,
            Request::PurgeTopic(_) => Op::PurgeTopic,
            Request::GetTopic(_) => Op::GetTopic,
            Request::TopicPartitionStats(_) => Op::TopicPartitionStats,
            Request::RegisterMember(_) => Op::RegisterMember,
            Request::CommitProduce(_) => Op::CommitProduce,
            Request::CommitProduceBatch(_) => Op::CommitProduceBatch,
            Request::CreateUser(_) => Op::CreateUser,
            Request::UpdateUser(_) => Op::UpdateUser,
            Request::DeleteUser(_) => Op::DeleteUser,
            Request::AttachChild(_) => Op::AttachChild,
            Request::DetachChild(_) => Op::DetachChild,
            Request::JoinCluster(_) => Op::JoinCluster,
            Request::ProposeCommand(_) => Op::ProposeCommand,
            Request::RaftAppendEntries(_) => Op::RaftAppendEntries,
            Request::RaftVote(_) => Op::RaftVote,
            Request::RaftInstallSnapshot(_) => Op::RaftInstallSnapshot,
            Request::RaftCampaign => Op::RaftCampaign,
            Request::FanoutCursors(_) => Op::FanoutCursors,
            Request::AnchorFanoutLink(_) => Op::AnchorFanoutLink,
            Request::SettleFanoutLinks(_) => Op::SettleFanoutLinks,
            Request::ReadIndex => Op::ReadIndex,
            Request::ReadyCounts(_) => Op::ReadyCounts,
            Request::CancelRequest(_) => Op::CancelRequest,
            Request::ProbeGroup(_) => Op::ProbeGroup,
            Request::ListPartitionSegments(_) => Op::ListPartitionSegments,
            Request::FetchSegmentChunk(_) => Op::FetchSegmentChunk,
            Request::PrepareHandoff(_) => Op::PrepareHandoff,
            Request::KnownOffsets => Op::KnownOffsets,
        }
    }

    /// How long a caller waits for the reply (SPEC §7.4's RPC timeouts).
    pub fn timeout(&self) -> Duration {
        match self {
            Request::CommitProduce(_) | Request::CommitProduceBatch(_) => COMMIT_TIMEOUT,
            Request::CreateTopic(_) => CREATE_FORWARD_TIMEOUT,
            Request::DeleteTopic(_) => DELETE_FORWARD_TIMEOUT,
            Request::PurgeTopic(_) => PURGE_TIMEOUT,
            Request::Consume(Consume { wait_nanos, .. })
            | Request::ReadyCounts(ReadyCounts { wait_nanos, .. }) => {
                let wait = Duration::from_nanos((*wait_nanos).max(0) as u64).min(CONSUME_MAX_WAIT);
                (wait + LONG_POLL_SLACK).max(REPLY_TIMEOUT)
            }
            _ => REPLY_TIMEOUT,
        }
    }

    /// Whether the server may stop the request half-way when its requester
    /// asks (CancelRequest) or its connection ends: only a consume, whose
    /// handler leases nothing until its last, synchronous step (a long poll
    /// stopped while it waits holds nothing). Writes never are.
    pub fn cancellable(&self) -> bool {
        matches!(self, Request::Consume(_))
    }

    /// The lane (stream pool) the request travels on.
    pub fn lane(&self) -> Lane {
        match self {
            Request::CommitProduce(_) | Request::CommitProduceBatch(_) => Lane::Produce,
            Request::Consume(_) | Request::ReadyCounts(_) => Lane::Consume,
            Request::Ack(_) | Request::ExtendAck(_) | Request::Nack(_) => Lane::Ack,
            _ => Lane::Control,
        }
    }

    /// The request's bytes (the NodeRequest payload).
    pub fn encode(&self) -> Vec<u8> {
        codec::concat(&self.encode_chunks())
    }

    /// The request's bytes as chunks, in order: record payloads and bodies
    /// of at least [`codec::SHARE_MIN_BYTES`] are references to the
    /// request's own buffers, not copies (the transport hands the chunks to
    /// QUIC as they are). Concatenated they are [`Request::encode`].
    pub fn encode_chunks(&self) -> Vec<Bytes> {
        let mut e = Enc::with_capacity(self.field_bytes_hint());
        e.u8(self.op() as u8);
        match self {
            Request::Consume(c) => {
                e.str(&c.topic)
                    .i32(c.partition)
                    .bool(c.has_partition)
                    .i64(c.offset)
                    .bool(c.has_offset)
                    .i64(c.wait_nanos)
                    .bool(c.local_only);
                if c.max > 1 {
                    e.u32(c.max);
                }
            }
            Request::Ack(r) | Request::ExtendAck(r) | Request::Nack(r) => {
                e.str(&r.topic).i32(r.partition).i64(r.offset).i64(r.nonce);
            }
            Request::CreateTopic(t) | Request::AlterTopic(t) => {
                e.str(&t.topic).shared(&t.body);
            }
            Request::DeleteTopic(t) | Request::PurgeTopic(t) | Request::GetTopic(t) => {
                e.str(t);
            }
            Request::TopicPartitionStats(r) => {
                e.str(&r.topic).i32(r.partition);
                if let Some(id) = r.incarnation {
                    e.u64(id.get());
                }
            }
            Request::RegisterMember(m) => {
                e.str(&m.id).str(&m.addr).str(&m.cluster_addr).str(&m.status).i64(m.last_heartbeat);
            }
            Request::CommitProduce(r) => {
                r.put(&mut e);
                if let Some(id) = r.incarnation {
                    e.u64(id.get());
                }
            }
            Request::CommitProduceBatch(records) => {
                e.i32(i32::try_from(records.len()).unwrap_or(i32::MAX));
                for r in records {
                    r.put(&mut e);
                }
                if records.iter().any(|r| r.incarnation.is_some()) {
                    let runs = runs(records);
                    e.u32(runs.len() as u32);
                    for (count, id) in runs {
                        e.u32(count).u64(id);
                    }
                }
            }
            Request::CreateUser(u) | Request::UpdateUser(u) | Request::DeleteUser(u) => {
                e.str(&u.username).shared(&u.body);
            }
            Request::AttachChild(l) | Request::DetachChild(l) => {
                e.str(&l.parent).str(&l.child).i64(l.delay_ms);
            }
            Request::JoinCluster(j) => {
                e.str(&j.id).str(&j.cluster_addr);
                if let Some(http) = &j.http_addr {
                    e.str(http);
                }
            }
            Request::ProposeCommand(b)
            | Request::RaftAppendEntries(b)
            | Request::RaftVote(b)
            | Request::RaftInstallSnapshot(b) => {
                e.shared(b);
            }
            Request::RaftCampaign | Request::ReadIndex | Request::KnownOffsets => {}
            Request::FanoutCursors(r) => {
                e.str(&r.topic);
                if let Some(id) = r.incarnation {
                    e.u64(id.get());
                }
            }
            Request::AnchorFanoutLink(a) => {
                e.str(&a.parent).u64(a.incarnation).str(&a.child).u64(a.epoch);
                e.u32(a.partitions.len() as u32);
                for &p in &a.partitions {
                    e.u32(p);
                }
            }
            Request::SettleFanoutLinks(index) => {
                e.u64(*index);
            }
            Request::ReadyCounts(r) => {
                e.str(&r.topic).i64(r.wait_nanos);
            }
            Request::CancelRequest(id) => {
                e.u64(*id);
            }
            Request::ProbeGroup(id) => {
                e.str(id);
            }
            Request::ListPartitionSegments(m) => {
                e.str(&m.topic).i32(m.partition);
                if let Some(id) = m.incarnation {
                    e.u64(id.get());
                }
            }
            Request::FetchSegmentChunk(c) => {
                e.str(&c.topic).i32(c.partition).i64(c.base).i64(c.at).i64(c.length);
                if let Some(id) = c.incarnation {
                    e.u64(id.get());
                }
            }
            Request::PrepareHandoff(h) => {
                e.str(&h.topic).i32(h.partition).i64(h.freeze_ttl_nanos);
                if let Some(id) = h.incarnation {
                    e.u64(id.get());
                }
            }
        }
        e.into_chunks()
    }

    /// About how many bytes the encoding holds outside shared chunks (the
    /// field buffer's first capacity; a batch's is sized so it is not
    /// regrown record by record).
    fn field_bytes_hint(&self) -> usize {
        // A record's fields besides topic, key and payload: four lengths,
        // partition, created_at, and room for its incarnation run.
        const RECORD_FIELDS: usize = 4 * 4 + 4 + 8 + 12;
        let copied = |b: &[u8]| if b.len() < codec::SHARE_MIN_BYTES { b.len() } else { 0 };
        match self {
            Request::CommitProduceBatch(records) => {
                16 + records
                    .iter()
                    .map(|r| {
                        RECORD_FIELDS
                            + r.topic.len()
                            + copied(r.key.as_deref().unwrap_or_default())
                            + copied(&r.payload)
                    })
                    .sum::<usize>()
            }
            _ => 256,
        }
    }

    /// Decodes a NodeRequest payload.
    pub fn decode(buf: &[u8]) -> Result<Request> {
        let mut d = Dec::new(buf);
        let code = d.u8("op").map_err(|_| Error::Protocol("empty request".into()))?;
        let Some(op) = Op::from_u8(code) else {
            return Err(Error::UnsupportedOp(code));
        };
        let req = match op {
            Op::Consume => Request::Consume(Consume {
                topic: d.string("topic")?,
                partition: d.i32("partition")?,
                has_partition: d.bool("has_partition")?,
                offset: d.i64("offset")?,
                has_offset: d.bool("has_offset")?,
                wait_nanos: d.i64("wait_nanos")?,
                local_only: d.bool("local_only")?,
                max: if d.remaining() == 0 {
                    1
                } else {
                    match d.u32("max")? {
                        n @ 2..=CONSUME_MAX_BATCH => n,
                        n => {
                            return Err(Error::InvalidField {
                                field: "max",
                                reason: format!("{n} is not between 2 and {CONSUME_MAX_BATCH}"),
                            });
                        }
                    }
                },
            }),
            Op::Ack => Request::Ack(receipt(&mut d)?),
            Op::ExtendAck => Request::ExtendAck(receipt(&mut d)?),
            Op::Nack => Request::Nack(receipt(&mut d)?),
            Op::CreateTopic => Request::CreateTopic(TopicBody {
                topic: d.string("topic")?,
                body: d.bytes("body")?,
            }),
            Op::AlterTopic => {
                Request::AlterTopic(TopicBody { topic: d.string("topic")?, body: d.bytes("body")? })
            }
            Op::DeleteTopic => Request::DeleteTopic(d.string("topic")?),
            Op::PurgeTopic => Request::PurgeTopic(d.string("topic")?),
            Op::GetTopic => Request::GetTopic(d.string("topic")?),
            Op::RegisterMember => Request::RegisterMember(RegisterMember {
                id: d.string("id")?,
                addr: d.string("addr")?,
                cluster_addr: d.string("cluster_addr")?,
                status: d.string("status")?,
                last_heartbeat: d.i64("last_heartbeat")?,
            }),
            Op::TopicPartitionStats => Request::TopicPartitionStats(PartitionStatsRequest {
                topic: d.string("topic")?,
                partition: d.i32("partition")?,
                incarnation: trailing_incarnation(&mut d)?,
            }),
            Op::CommitProduce => {
                let mut r = CommitRecord::get(&mut d)?;
                r.incarnation = trailing_incarnation(&mut d)?;
                Request::CommitProduce(r)
            }
            Op::CommitProduceBatch => Request::CommitProduceBatch(batch(&mut d)?),
            Op::CreateUser => Request::CreateUser(user(&mut d)?),
            Op::UpdateUser => Request::UpdateUser(user(&mut d)?),
            Op::DeleteUser => Request::DeleteUser(user(&mut d)?),
            Op::AttachChild => Request::AttachChild(link(&mut d)?),
            Op::DetachChild => Request::DetachChild(link(&mut d)?),
            Op::JoinCluster => Request::JoinCluster(JoinCluster {
                id: d.string("id")?,
                cluster_addr: d.string("cluster_addr")?,
                http_addr: if d.remaining() > 0 { Some(d.string("http_addr")?) } else { None },
            }),
            Op::ProposeCommand => Request::ProposeCommand(d.bytes("command")?),
            Op::RaftAppendEntries => Request::RaftAppendEntries(d.bytes("rpc")?),
            Op::RaftVote => Request::RaftVote(d.bytes("rpc")?),
            Op::RaftInstallSnapshot => Request::RaftInstallSnapshot(d.bytes("rpc")?),
            Op::RaftCampaign => Request::RaftCampaign,
            Op::FanoutCursors => Request::FanoutCursors(FanoutCursorsRequest {
                topic: d.string("topic")?,
                incarnation: trailing_incarnation(&mut d)?,
            }),
            Op::AnchorFanoutLink => Request::AnchorFanoutLink(anchor(&mut d)?),
            Op::SettleFanoutLinks => Request::SettleFanoutLinks(d.u64("applied_index")?),
            Op::ReadIndex => Request::ReadIndex,
            Op::ReadyCounts => Request::ReadyCounts(ReadyCounts {
                topic: d.string("topic")?,
                wait_nanos: d.i64("wait_nanos")?,
            }),
            Op::CancelRequest => Request::CancelRequest(d.u64("request_id")?),
            Op::ProbeGroup => Request::ProbeGroup(d.string("id")?),
            Op::ListPartitionSegments => Request::ListPartitionSegments(MovePartition {
                topic: d.string("topic")?,
                partition: d.i32("partition")?,
                incarnation: trailing_incarnation(&mut d)?,
            }),
            Op::FetchSegmentChunk => Request::FetchSegmentChunk(SegmentChunk {
                topic: d.string("topic")?,
                partition: d.i32("partition")?,
                base: d.i64("base")?,
                at: d.i64("at")?,
                length: d.i64("length")?,
                incarnation: trailing_incarnation(&mut d)?,
            }),
            Op::PrepareHandoff => Request::PrepareHandoff(Handoff {
                topic: d.string("topic")?,
                partition: d.i32("partition")?,
                freeze_ttl_nanos: d.i64("freeze_ttl_nanos")?,
                incarnation: trailing_incarnation(&mut d)?,
            }),
            Op::KnownOffsets => Request::KnownOffsets,
            Op::Produce
            | Op::DecommissionMember
            | Op::CompleteMove
            | Op::AbortMove
            | Op::GetAssignment => return Err(Error::UnsupportedOp(code)),
        };
        d.finish()?;
        Ok(req)
    }
}

/// Runs of consecutive records sharing an incarnation (0 = none).
fn runs(records: &[CommitRecord]) -> Vec<(u32, u64)> {
    let mut out: Vec<(u32, u64)> = Vec::new();
    for r in records {
        let id = r.incarnation.map_or(0, NonZeroU64::get);
        match out.last_mut() {
            Some((n, last)) if *last == id => *n += 1,
            _ => out.push((1, id)),
        }
    }
    out
}

/// An optional trailing incarnation id (absent when no bytes are left;
/// 0 is no id and is refused).
fn anchor(d: &mut Dec<'_>) -> Result<AnchorFanoutLink> {
    let (parent, incarnation) = (d.string("parent")?, d.u64("incarnation")?);
    let (child, epoch) = (d.string("child")?, d.u64("epoch")?);
    let count = d.u32("count")?;
    if count > ANCHOR_MAX_PARTITIONS || count as usize > d.remaining() / 4 {
        return Err(Error::InvalidField {
            field: "count",
            reason: format!(
                "{count} partitions (at most {ANCHOR_MAX_PARTITIONS}, {} bytes left)",
                d.remaining()
            ),
        });
    }
    let partitions = (0..count).map(|_| d.u32("partition")).collect::<Result<Vec<u32>>>()?;
    Ok(AnchorFanoutLink { parent, incarnation, child, epoch, partitions })
}

fn trailing_incarnation(d: &mut Dec<'_>) -> Result<Option<NonZeroU64>> {
    if d.remaining() == 0 {
        return Ok(None);
    }
    let id = d.u64("incarnation")?;
    NonZeroU64::new(id).map(Some).ok_or_else(|| Error::InvalidField {
        field: "incarnation",
        reason: "0 is no incarnation id".into(),
    })
}

fn receipt(d: &mut Dec<'_>) -> Result<Receipt> {
    Ok(Receipt {
        topic: d.string("topic")?,
        partition: d.i32("partition")?,
        offset: d.i64("offset")?,
        nonce: d.i64("nonce")?,
    })
}

fn user(d: &mut Dec<'_>) -> Result<UserBody> {
    Ok(UserBody { username: d.string("username")?, body: d.bytes("body")? })
}

fn link(d: &mut Dec<'_>) -> Result<ChildLink> {
    Ok(ChildLink {
        parent: d.string("parent")?,
        child: d.string("child")?,
        delay_ms: d.i64("delay_ms")?,
    })
}

fn batch(d: &mut Dec<'_>) -> Result<Vec<CommitRecord>> {
    let count = d.i32("count")?;
    let count = usize::try_from(count).map_err(|_| Error::InvalidField {
        field: "count",
        reason: format!("{count} is negative"),
    })?;
    // The count is only trusted as far as the bytes left could hold it.
    if count > d.remaining() / MIN_RECORD_BYTES {
        return Err(Error::Truncated {
            what: "batch records",
            need: (count as u64) * MIN_RECORD_BYTES as u64,
            have: d.remaining(),
        });
    }
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        records.push(CommitRecord::get(d)?);
    }
    if d.remaining() == 0 {
        return Ok(records);
    }
    let runs = d.u32("incarnation runs")? as usize;
    if runs == 0 || runs > count || runs > d.remaining() / RUN_BYTES {
        return Err(Error::InvalidField {
            field: "incarnation runs",
            reason: format!("{runs} runs for {count} records and {} bytes", d.remaining()),
        });
    }
    let (mut at, mut previous, mut any_id) = (0usize, None, false);
    for _ in 0..runs {
        let n = d.u32("incarnation run records")? as usize;
        let id = d.u64("incarnation id")?;
        if n == 0 || n > count - at {
            return Err(Error::InvalidField {
                field: "incarnation run records",
                reason: format!("run of {n} records at record {at} of {count}"),
            });
        }
        // Runs are maximal: one encoding per batch.
        if previous == Some(id) {
            return Err(Error::InvalidField {
                field: "incarnation runs",
                reason: format!("two adjacent runs share id {id}"),
            });
        }
        (previous, any_id) = (Some(id), any_id || id != 0);
        for r in &mut records[at..at + n] {
            r.incarnation = NonZeroU64::new(id);
        }
        at += n;
    }
    if at != count {
        return Err(Error::InvalidField {
            field: "incarnation runs",
            reason: format!("runs cover {at} of {count} records"),
        });
    }
    if !any_id {
        return Err(Error::InvalidField {
            field: "incarnation runs",
            reason: "a section without any id (it is left out then)".into(),
        });
    }
    Ok(records)
}

/// Which stream pool a request travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// CommitProduce, CommitProduceBatch.
    Produce,
    /// Consume.
    Consume,
    /// Ack, ExtendAck, Nack.
    Ack,
    /// Everything else (metadata, membership).
    Control,
}

impl Lane {
    /// Every lane.
    pub const ALL: [Lane; 4] = [Lane::Produce, Lane::Consume, Lane::Ack, Lane::Control];

    /// Streams pooled for the lane.
    pub fn streams(self) -> usize {
        match self {
            Lane::Control => crate::limits::CONTROL_LANE_STREAMS,
            _ => crate::limits::DATA_LANE_STREAMS,
        }
    }
}

/// A reply: `status u16 | u32 + content type | u32 + body`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// HTTP-like status.
    pub status: u16,
    /// Content type of the body ("" when there is none).
    pub content_type: String,
    /// Body.
    pub body: Bytes,
}

impl Reply {
    /// A JSON reply.
    pub fn json(status: u16, body: impl Into<Bytes>) -> Reply {
        Reply { status, content_type: "application/json".into(), body: body.into() }
    }

    /// An error reply, `{"error": message}`.
    pub fn error(status: u16, message: &str) -> Reply {
        let body = serde_json::json!({ "error": message }).to_string();
        Reply::json(status, body)
    }

    /// The reply a server gives a request that failed to decode.
    pub fn for_decode_error(e: &Error) -> Reply {
        Reply::error(e.status(), &e.to_string())
    }

    /// The reply's bytes (the NodeReply payload).
    pub fn encode(&self) -> Vec<u8> {
        codec::concat(&self.encode_chunks())
    }

    /// The reply's bytes as chunks (a large body is a reference, not a
    /// copy); concatenated they are [`Reply::encode`].
    pub fn encode_chunks(&self) -> Vec<Bytes> {
        let mut e = Enc::with_capacity(16 + self.content_type.len());
        e.u16(self.status).str(&self.content_type).shared(&self.body);
        e.into_chunks()
    }

    /// Decodes a NodeReply payload.
    pub fn decode(buf: &[u8]) -> Result<Reply> {
        let mut d = Dec::new(buf);
        let reply = Reply {
            status: d.u16("status")?,
            content_type: d.string("content type")?,
            body: d.bytes("body")?,
        };
        d.finish()?;
        Ok(reply)
    }
}

#[cfg(test)]
#[path = "rpc_tests.rs"]
mod tests;
