//! Commands: every mutation of the metastore, as a value that can be logged,
//! replicated and applied in order.
//!
//! # Encoding
//!
//! A command serializes (with serde, JSON in practice) as an envelope
//! `{"op":<opcode>,"d":<payload>}`. Opcodes are append-only: a new command
//! takes the next number and a retired number is never reused, so a log
//! written by an older build replays unchanged. Payloads refuse unknown
//! fields, so a node never applies a command it only half understands.
//!
//! | op | command |
//! |---|---|
//! | 1 | [`CreateTopic`] |
//! | 2 | [`AlterTopic`] |
//! | 3 | [`DeleteTopic`] |
//! | 4 | [`AssignPartitions`] |
//! | 5 | [`MemberJoin`] |
//! | 6 | [`MemberDead`] |
//! | 7 | [`CreateUser`] |
//! | 8 | [`UpdateUser`] |
//! | 9 | [`DeleteUser`] |
//! | 10 | [`SeedRootUser`] |
//! | 11 | [`AttachChild`] |
//! | 12 | [`DetachChild`] |
//! | 13 | [`SetAssignmentTarget`] |
//! | 14 | [`CompleteMove`] |
//! | 15 | [`AbortMove`] |
//! | 16 | [`SetMemberDraining`] |
//! | 17 | [`RemoveMember`] |
//!
//! Everything time-based, random or slow (creation time, attach epochs,
//! heartbeat times, password hashes) is decided by the proposer and carried
//! in the command; applying it reads no clock, draws no random number and
//! hashes nothing.

use std::sync::Arc;

use serde::de::Error as _;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::member::Member;
use crate::topic::{ParentLink, Topic};
use crate::user::{Grant, User};

/// One mutation of the metastore. Variants are append-only (see the module
/// docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Op 1: create a topic, optionally with its first schema and as a child.
    CreateTopic(CreateTopic),
    /// Op 2: change a topic's retention, caps, partitions and/or schema.
    AlterTopic(AlterTopic),
    /// Op 3: delete a topic with its schemas and assignments.
    DeleteTopic(DeleteTopic),
    /// Op 4: set the owners of some partitions of one topic incarnation.
    AssignPartitions(AssignPartitions),
    /// Op 5: upsert a member (join and heartbeat).
    MemberJoin(MemberJoin),
    /// Op 6: mark a member dead.
    MemberDead(MemberDead),
    /// Op 7: create a (non-root) user.
    CreateUser(CreateUser),
    /// Op 8: change a user's grants and/or password hash.
    UpdateUser(UpdateUser),
    /// Op 9: delete a user (never the root user).
    DeleteUser(DeleteUser),
    /// Op 10: create the root user, when there is none.
    SeedRootUser(SeedRootUser),
    /// Op 11: attach an existing topic to a parent as a fan-out child.
    AttachChild(AttachChild),
    /// Op 12: detach a child from its parent (both become standalone when
    /// that was the last link).
    DetachChild(DetachChild),
    /// Op 13: start moving a partition (set its `target_id`).
    SetAssignmentTarget(SetAssignmentTarget),
    /// Op 14: finish a move: the target becomes the owner (compare and set).
    CompleteMove(CompleteMove),
    /// Op 15: give up a move: the target is cleared (compare and set).
    AbortMove(AbortMove),
    /// Op 16: mark a member draining, or clear the mark.
    SetMemberDraining(SetMemberDraining),
    /// Op 17: remove a dead member for good; its partitions get new owners
    /// whose logs start at the given offsets.
    RemoveMember(RemoveMember),
}

/// Creates a topic. Built by [`crate::CreateTopicRequest::resolve`], which
/// applies defaults and the stateless rules; apply re-checks what depends on
/// the state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTopic {
    /// The topic name.
    pub name: String,
    /// Partition count (resolved: never 0).
    pub partitions: u32,
    /// Retention in ms (resolved; 0 = keep forever).
    pub retention_ms: u64,
    /// Visibility timeout in ms (resolved).
    pub visibility_timeout_ms: u64,
    /// In-flight cap (resolved).
    pub max_in_flight_per_partition: u64,
    /// Acked-ahead cap (resolved).
    pub max_acked_ahead_per_partition: u64,
    /// Creation time, Unix seconds, from the proposer's clock.
    pub created_at: i64,
    /// The creating user ("" when security is off).
    pub owner: String,
    /// The first schema (version 1), as raw JSON text.
    pub schema: Option<String>,
    /// Create the topic attached to this parent.
    pub parent: Option<ParentLink>,
}

/// Alters a topic. Each present field is a step, checked in the order
/// retention → caps → partitions → schema; the command applies all of them or
/// none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlterTopic {
    /// The topic.
    pub name: String,
    /// New retention in ms (resolved: 0 = keep forever).
    pub retention_ms: Option<u64>,
    /// New in-flight cap (resolved).
    pub max_in_flight_per_partition: Option<u64>,
    /// New acked-ahead cap (resolved).
    pub max_acked_ahead_per_partition: Option<u64>,
    /// New partition count (must grow).
    pub partitions: Option<u32>,
    /// A new schema version, as raw JSON text.
    pub schema: Option<String>,
}

/// Deletes a topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteTopic {
    /// The topic.
    pub name: String,
}

/// Assigns partitions of one topic incarnation. Refused with a conflict when
/// the topic was recreated since the proposer looked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssignPartitions {
    /// The topic.
    pub topic: String,
    /// The incarnation the assignments were planned for.
    pub incarnation: u64,
    /// One entry per partition to (re)assign.
    pub assignments: Vec<PartitionAssignment>,
    /// Only place partitions that have no owner when the command applies;
    /// an entry for an assigned one is skipped. Placement at create and the
    /// controller propose this way, so two proposals planned on the same
    /// view (a create and a controller tick) never move a partition the
    /// first one placed (assignments are sticky). Absent in the JSON when
    /// false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub unassigned_only: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The owner (and move target) of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionAssignment {
    /// The partition index.
    pub partition: u32,
    /// The owning member.
    pub owner_id: String,
    /// The member a move is taking it to, if any.
    pub target_id: Option<String>,
}

/// Upserts a member: sent on join and as the periodic heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberJoin {
    /// The member record to store.
    pub member: Member,
}

/// Marks a member dead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberDead {
    /// The member id.
    pub id: String,
    /// The `last_heartbeat` the proposer judged overdue: the command is
    /// refused (409, nothing changes) when the member heartbeated since,
    /// so a dead-marking planned on a view older than a fresh heartbeat
    /// never marks a live node dead. Absent (older logs, or an operator's
    /// unconditional marking): no condition. Optional and skipped when
    /// absent, so older commands encode and replay unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<i64>,
}

/// Creates a user. The password hash and the timestamps come from the
/// proposer; `root` must be false (only [`SeedRootUser`] makes a root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateUser {
    /// The user record to store.
    pub user: User,
}

/// Changes a user: each present field replaces the stored one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateUser {
    /// The user.
    pub username: String,
    /// The new grants (refused for the root user).
    pub grants: Option<Vec<Grant>>,
    /// The new password hash.
    pub password_hash: Option<String>,
    /// The change time, Unix ms, from the proposer's clock.
    pub updated_at_ms: i64,
}

/// Deletes a user (refused for the root user).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteUser {
    /// The user.
    pub username: String,
}

/// Creates the root user at first start; refused once a root exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedRootUser {
    /// The root user record (`root` must be true).
    pub user: User,
}

/// Attaches an existing topic as a child of `parent`. Built by
/// [`crate::AttachChildRequest::resolve`] (which stamps the epoch and the
/// time); apply checks every rule of SPEC §1.5 again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachChild {
    /// The parent topic.
    pub parent: String,
    /// The topic to attach.
    pub child: String,
    /// The new attachment's id: 16 hex digits of 8 random bytes, drawn by
    /// the proposer for every attach.
    pub attach_epoch: String,
    /// Delivery delay after the parent's commit time, in ms (0..=1 year).
    pub fanout_delay_ms: u64,
    /// The attach time, Unix ms, from the proposer's clock.
    pub attached_at_ms: u64,
}

/// Detaches `child` from `parent`; refused with 404 unless `child` is
/// attached to exactly that parent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetachChild {
    /// The parent topic.
    pub parent: String,
    /// The child topic.
    pub child: String,
}

/// Starts a partition move (SPEC §7.3): `target_id` is set, so the target
/// starts copying the partition from its owner. Refused (409, nothing
/// changes) unless the partition of this incarnation is owned by
/// `expected_owner` and has no other target, the target is a different,
/// alive, non-draining member, and fewer than
/// [`crate::limits::MAX_MOVES_IN_FLIGHT`] moves are in flight cluster-wide;
/// setting the target it already has is a no-op that succeeds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetAssignmentTarget {
    /// The topic.
    pub topic: String,
    /// The topic incarnation the move was planned for.
    pub incarnation: u64,
    /// The partition.
    pub partition: u32,
    /// The owner the proposer saw.
    pub expected_owner: String,
    /// The member to move it to.
    pub target_id: String,
}

/// Finishes a move: a compare and set that makes `target_id` the owner and
/// clears the target, only if the partition of this incarnation is still
/// owned by `expected_owner` with exactly this target (409 otherwise, and
/// nothing changes). The one step at which ownership of a partition flips:
/// two racing completions, or a completion racing an abort, cannot both
/// apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteMove {
    /// The topic.
    pub topic: String,
    /// The topic incarnation.
    pub incarnation: u64,
    /// The partition.
    pub partition: u32,
    /// The owner the move started from.
    pub expected_owner: String,
    /// The target that copied the partition and becomes its owner.
    pub target_id: String,
    /// The attempt the flip belongs to (the target's
    /// [`crate::Assignment::move_attempt`] when its copy started): refused
    /// (409) unless it is still the move in flight. Absent: matched on
    /// owner and target only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u64>,
}

/// Gives a move up: clears the target, only if it is `expected_target`
/// (409 otherwise). The owner stays the owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AbortMove {
    /// The topic.
    pub topic: String,
    /// The topic incarnation.
    pub incarnation: u64,
    /// The partition.
    pub partition: u32,
    /// The target the aborting side saw.
    pub expected_target: String,
    /// The attempt given up (see [`CompleteMove::attempt`]); absent:
    /// whichever move to `expected_target` is in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u64>,
}

/// Marks a member draining (decommission) or clears the mark (cancel). A
/// draining member gets no new partitions and the planner moves its
/// partitions away. 404 for an unknown member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetMemberDraining {
    /// The member id.
    pub id: String,
    /// Draining or not.
    pub draining: bool,
}

/// Removes a member that is gone for good (its disk is lost): `narad
/// cluster remove <id> --force`. Atomically: every partition it owns (any
/// topic, fan-out children included) gets a new owner, placed by
/// [`crate::placement::reassign_removed`] over the alive, non-draining
/// members as the state is when the command applies, with its log's start
/// offset from `partitions`; a move to or from it is cleared (a copy in
/// flight is never taken as complete: nothing can prove it caught up with a
/// node that is gone); and its member record goes.
///
/// Refused (409, nothing changes) unless the member is marked dead with
/// exactly `last_heartbeat` (a compare and set: a member that came back
/// since is alive, or has a newer heartbeat), when a partition it owns
/// has no entry in `partitions` (the proposer planned on an older state),
/// or when no other member is alive to take its partitions; 404 for an
/// unknown member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveMember {
    /// The member id.
    pub id: String,
    /// The heartbeat the proposer saw on the dead member's record.
    pub last_heartbeat: i64,
    /// The start offset of every partition it owns (extra entries are
    /// ignored).
    pub partitions: Vec<RemovedPartition>,
}

/// The start offset of one partition of a removed member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemovedPartition {
    /// The topic.
    pub topic: String,
    /// Its incarnation.
    pub incarnation: u64,
    /// The partition.
    pub partition: u32,
    /// The offset its new log starts at.
    pub base_offset: u64,
}

/// One partition a [`RemoveMember`] gave a new owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reassigned {
    /// The topic.
    pub topic: String,
    /// Its incarnation.
    pub incarnation: u64,
    /// The partition.
    pub partition: u32,
    /// The new owner.
    pub owner_id: String,
    /// The offset its new log starts at.
    pub base_offset: u64,
}

/// What applying a command produced.
///
/// Serializes (for a follower that forwarded a command to the leader) as
/// `{"r":"<kind>","d":<payload>}`, kinds in snake case (`topic`,
/// `topic_deleted`, `assigned`, `member`, `user`, `user_deleted`,
/// `child_detached` with `{"parent","link"}`); the records inside are the
/// same JSON as the metastore stores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "r", content = "d", rename_all = "snake_case", deny_unknown_fields)]
pub enum Response {
    /// The created or altered topic.
    Topic(Arc<Topic>),
    /// The record of the topic just deleted (its incarnation tells the
    /// purge which files and WAL records belonged to it).
    TopicDeleted(Arc<Topic>),
    /// Assignments stored.
    Assigned,
    /// The member as stored.
    Member(Arc<Member>),
    /// The user as stored.
    User(Arc<User>),
    /// The record of the user just deleted.
    UserDeleted(Arc<User>),
    /// A child was detached: the parent as it is now, and the link that was
    /// dissolved (its epoch names the cursor state to clean up).
    ChildDetached {
        /// The parent after the detach.
        parent: Arc<Topic>,
        /// The link the child had.
        link: ParentLink,
    },
    /// A member was removed ([`RemoveMember`]): its record as it was, and
    /// the partitions it owned with their new owners.
    MemberRemoved {
        /// The removed member's last record.
        member: Arc<Member>,
        /// Its partitions, in (topic, partition) order.
        reassigned: Vec<Reassigned>,
    },
}

impl Command {
    /// The command's stable opcode.
    pub fn opcode(&self) -> u8 {
        match self {
            Command::CreateTopic(_) => 1,
            Command::AlterTopic(_) => 2,
            Command::DeleteTopic(_) => 3,
            Command::AssignPartitions(_) => 4,
            Command::MemberJoin(_) => 5,
            Command::MemberDead(_) => 6,
            Command::CreateUser(_) => 7,
            Command::UpdateUser(_) => 8,
            Command::DeleteUser(_) => 9,
            Command::SeedRootUser(_) => 10,
            Command::AttachChild(_) => 11,
            Command::DetachChild(_) => 12,
            Command::SetAssignmentTarget(_) => 13,
            Command::CompleteMove(_) => 14,
            Command::AbortMove(_) => 15,
            Command::SetMemberDraining(_) => 16,
            Command::RemoveMember(_) => 17,
        }
    }

    /// The command as JSON bytes (the envelope of the module docs).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("commands always serialize")
    }

    /// A command from JSON bytes; unknown opcodes and fields are refused.
    pub fn from_json(bytes: &[u8]) -> Result<Command, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

impl Serialize for Command {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut envelope = serializer.serialize_struct("Command", 2)?;
        envelope.serialize_field("op", &self.opcode())?;
        match self {
            Command::CreateTopic(c) => envelope.serialize_field("d", c)?,
            Command::AlterTopic(c) => envelope.serialize_field("d", c)?,
            Command::DeleteTopic(c) => envelope.serialize_field("d", c)?,
            Command::AssignPartitions(c) => envelope.serialize_field("d", c)?,
            Command::MemberJoin(c) => envelope.serialize_field("d", c)?,
            Command::MemberDead(c) => envelope.serialize_field("d", c)?,
            Command::CreateUser(c) => envelope.serialize_field("d", c)?,
            Command::UpdateUser(c) => envelope.serialize_field("d", c)?,
            Command::DeleteUser(c) => envelope.serialize_field("d", c)?,
            Command::SeedRootUser(c) => envelope.serialize_field("d", c)?,
            Command::AttachChild(c) => envelope.serialize_field("d", c)?,
            Command::DetachChild(c) => envelope.serialize_field("d", c)?,
            Command::SetAssignmentTarget(c) => envelope.serialize_field("d", c)?,
            Command::CompleteMove(c) => envelope.serialize_field("d", c)?,
            Command::AbortMove(c) => envelope.serialize_field("d", c)?,
            Command::SetMemberDraining(c) => envelope.serialize_field("d", c)?,
            Command::RemoveMember(c) => envelope.serialize_field("d", c)?,
        }
        envelope.end()
    }
}

impl<'de> Deserialize<'de> for Command {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Envelope {
            op: u8,
            d: serde_json::Value,
        }
        fn payload<T: serde::de::DeserializeOwned, E: serde::de::Error>(
            d: serde_json::Value,
        ) -> Result<T, E> {
            serde_json::from_value(d).map_err(E::custom)
        }
        let Envelope { op, d } = Envelope::deserialize(deserializer)?;
        Ok(match op {
            1 => Command::CreateTopic(payload(d)?),
            2 => Command::AlterTopic(payload(d)?),
            3 => Command::DeleteTopic(payload(d)?),
            4 => Command::AssignPartitions(payload(d)?),
            5 => Command::MemberJoin(payload(d)?),
            6 => Command::MemberDead(payload(d)?),
            7 => Command::CreateUser(payload(d)?),
            8 => Command::UpdateUser(payload(d)?),
            9 => Command::DeleteUser(payload(d)?),
            10 => Command::SeedRootUser(payload(d)?),
            11 => Command::AttachChild(payload(d)?),
            12 => Command::DetachChild(payload(d)?),
            13 => Command::SetAssignmentTarget(payload(d)?),
            14 => Command::CompleteMove(payload(d)?),
            15 => Command::AbortMove(payload(d)?),
            16 => Command::SetMemberDraining(payload(d)?),
            17 => Command::RemoveMember(payload(d)?),
            op => return Err(D::Error::custom(format!("unknown metastore command opcode {op}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::MemberStatus;
    use crate::user::Action;

    fn golden() -> Vec<(Command, &'static str)> {
        vec![
            (
                Command::CreateTopic(CreateTopic {
                    name: "orders".into(),
                    partitions: 3,
                    retention_ms: 604_800_000,
                    visibility_timeout_ms: 30_000,
                    max_in_flight_per_partition: 1024,
                    max_acked_ahead_per_partition: 1024,
                    created_at: 1_700_000_000,
                    owner: "alice".into(),
                    schema: Some(r#"{"type":"object"}"#.into()),
                    parent: Some(ParentLink {
                        name: "all".into(),
                        attach_epoch: "0011223344556677".into(),
                        fanout_delay_ms: 0,
                        attached_at_ms: 1_700_000_000_000,
                    }),
                }),
                r#"{"op":1,"d":{"name":"orders","partitions":3,"retention_ms":604800000,"visibility_timeout_ms":30000,"max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1700000000,"owner":"alice","schema":"{\"type\":\"object\"}","parent":{"name":"all","attach_epoch":"0011223344556677","fanout_delay_ms":0,"attached_at_ms":1700000000000}}}"#,
            ),
            (
                Command::AlterTopic(AlterTopic {
                    name: "orders".into(),
                    retention_ms: Some(3_600_000),
                    max_in_flight_per_partition: None,
                    max_acked_ahead_per_partition: Some(10),
                    partitions: Some(8),
                    schema: None,
                }),
                r#"{"op":2,"d":{"name":"orders","retention_ms":3600000,"max_in_flight_per_partition":null,"max_acked_ahead_per_partition":10,"partitions":8,"schema":null}}"#,
            ),
            (
                Command::DeleteTopic(DeleteTopic { name: "orders".into() }),
                r#"{"op":3,"d":{"name":"orders"}}"#,
            ),
            (
                Command::AssignPartitions(AssignPartitions {
                    topic: "orders".into(),
                    incarnation: 12,
                    assignments: vec![PartitionAssignment {
                        partition: 2,
                        owner_id: "n1".into(),
                        target_id: Some("n2".into()),
                    }],
                    unassigned_only: false,
                }),
                r#"{"op":4,"d":{"topic":"orders","incarnation":12,"assignments":[{"partition":2,"owner_id":"n1","target_id":"n2"}]}}"#,
            ),
            (
                Command::MemberJoin(MemberJoin {
                    member: Member {
                        id: "n1".into(),
                        addr: "127.0.0.1:7942".into(),
                        cluster_addr: None,
                        status: MemberStatus::Alive,
                        last_heartbeat: 1_700_000_005,
                        draining: false,
                    },
                }),
                r#"{"op":5,"d":{"member":{"id":"n1","addr":"127.0.0.1:7942","status":"alive","last_heartbeat":1700000005}}}"#,
            ),
            (
                Command::MemberDead(MemberDead { id: "n1".into(), last_heartbeat: None }),
                r#"{"op":6,"d":{"id":"n1"}}"#,
            ),
            (
                Command::CreateUser(CreateUser {
                    user: User {
                        username: "bob".into(),
                        password_hash: "$2b$10$h".into(),
                        grants: vec![Grant {
                            action: Action::Produce,
                            patterns: vec!["o*".into()],
                        }],
                        root: false,
                        created_at_ms: 1_700_000_000_000,
                        updated_at_ms: 1_700_000_000_000,
                    },
                }),
                r#"{"op":7,"d":{"user":{"username":"bob","password_hash":"$2b$10$h","grants":[{"action":"produce","patterns":["o*"]}],"created_at_ms":1700000000000,"updated_at_ms":1700000000000}}}"#,
            ),
            (
                Command::UpdateUser(UpdateUser {
                    username: "bob".into(),
                    grants: Some(Vec::new()),
                    password_hash: None,
                    updated_at_ms: 5,
                }),
                r#"{"op":8,"d":{"username":"bob","grants":[],"password_hash":null,"updated_at_ms":5}}"#,
            ),
            (
                Command::DeleteUser(DeleteUser { username: "bob".into() }),
                r#"{"op":9,"d":{"username":"bob"}}"#,
            ),
            (
                Command::SeedRootUser(SeedRootUser {
                    user: User {
                        username: "admin".into(),
                        password_hash: "$2b$10$r".into(),
                        grants: vec![Grant { action: Action::Admin, patterns: Vec::new() }],
                        root: true,
                        created_at_ms: 1,
                        updated_at_ms: 1,
                    },
                }),
                r#"{"op":10,"d":{"user":{"username":"admin","password_hash":"$2b$10$r","grants":[{"action":"admin"}],"root":true,"created_at_ms":1,"updated_at_ms":1}}}"#,
            ),
            (
                Command::AttachChild(AttachChild {
                    parent: "orders".into(),
                    child: "audit".into(),
                    attach_epoch: "8899aabbccddeeff".into(),
                    fanout_delay_ms: 60_000,
                    attached_at_ms: 1_700_000_000_123,
                }),
                r#"{"op":11,"d":{"parent":"orders","child":"audit","attach_epoch":"8899aabbccddeeff","fanout_delay_ms":60000,"attached_at_ms":1700000000123}}"#,
            ),
            (
                Command::DetachChild(DetachChild {
                    parent: "orders".into(),
                    child: "audit".into(),
                }),
                r#"{"op":12,"d":{"parent":"orders","child":"audit"}}"#,
            ),
            (
                Command::SetAssignmentTarget(SetAssignmentTarget {
                    topic: "orders".into(),
                    incarnation: 7,
                    partition: 2,
                    expected_owner: "n1".into(),
                    target_id: "n4".into(),
                }),
                r#"{"op":13,"d":{"topic":"orders","incarnation":7,"partition":2,"expected_owner":"n1","target_id":"n4"}}"#,
            ),
            (
                Command::CompleteMove(CompleteMove {
                    topic: "orders".into(),
                    incarnation: 7,
                    partition: 2,
                    expected_owner: "n1".into(),
                    target_id: "n4".into(),
                    attempt: None,
                }),
                r#"{"op":14,"d":{"topic":"orders","incarnation":7,"partition":2,"expected_owner":"n1","target_id":"n4"}}"#,
            ),
            (
                Command::AbortMove(AbortMove {
                    topic: "orders".into(),
                    incarnation: 7,
                    partition: 2,
                    expected_target: "n4".into(),
                    attempt: Some(812),
                }),
                r#"{"op":15,"d":{"topic":"orders","incarnation":7,"partition":2,"expected_target":"n4","attempt":812}}"#,
            ),
            (
                Command::SetMemberDraining(SetMemberDraining { id: "n2".into(), draining: true }),
                r#"{"op":16,"d":{"id":"n2","draining":true}}"#,
            ),
            (
                Command::RemoveMember(RemoveMember {
                    id: "n3".into(),
                    last_heartbeat: 1_700_000_005,
                    partitions: vec![RemovedPartition {
                        topic: "orders".into(),
                        incarnation: 7,
                        partition: 2,
                        base_offset: 1_049_000,
                    }],
                }),
                r#"{"op":17,"d":{"id":"n3","last_heartbeat":1700000005,"partitions":[{"topic":"orders","incarnation":7,"partition":2,"base_offset":1049000}]}}"#,
            ),
        ]
    }

    #[test]
    fn commands_encode_to_the_golden_bytes_and_decode_back() {
        for (cmd, bytes) in golden() {
            assert_eq!(String::from_utf8(cmd.to_json()).unwrap(), bytes);
            assert_eq!(Command::from_json(bytes.as_bytes()).unwrap(), cmd);
        }
    }

    #[test]
    fn responses_encode_to_the_golden_bytes_and_decode_back() {
        let topic = Topic {
            name: "p".into(),
            incarnation: 3,
            partitions: 3,
            retention_ms: 0,
            visibility_timeout_ms: 30_000,
            max_in_flight_per_partition: 1024,
            max_acked_ahead_per_partition: 1024,
            created_at: 1_700_000_000,
            owner: String::new(),
            children: Vec::new(),
            parent: None,
        };
        let topic_json = r#"{"name":"p","incarnation":3,"partitions":3,"retention_ms":0,"visibility_timeout_ms":30000,"max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1700000000}"#;
        let member = Member {
            id: "n1".into(),
            addr: "h:1".into(),
            cluster_addr: None,
            status: MemberStatus::Alive,
            last_heartbeat: 5,
            draining: false,
        };
        let user = User {
            username: "bob".into(),
            password_hash: "$2b$10$h".into(),
            grants: Vec::new(),
            root: false,
            created_at_ms: 1,
            updated_at_ms: 2,
        };
        let user_json =
            r#"{"username":"bob","password_hash":"$2b$10$h","created_at_ms":1,"updated_at_ms":2}"#;
        let link = ParentLink {
            name: "p".into(),
            attach_epoch: "00000000000000ff".into(),
            fanout_delay_ms: 0,
            attached_at_ms: 7,
        };
        let removed = Member {
            id: "n3".into(),
            addr: "h:3".into(),
            cluster_addr: None,
            status: MemberStatus::Dead,
            last_heartbeat: 9,
            draining: false,
        };
        let reassigned = Reassigned {
            topic: "p".into(),
            incarnation: 3,
            partition: 1,
            owner_id: "n1".into(),
            base_offset: 1_048_586,
        };
        let cases = [
            (
                Response::MemberRemoved { member: Arc::new(removed), reassigned: vec![reassigned] },
                r#"{"r":"member_removed","d":{"member":{"id":"n3","addr":"h:3","status":"dead","last_heartbeat":9},"reassigned":[{"topic":"p","incarnation":3,"partition":1,"owner_id":"n1","base_offset":1048586}]}}"#
                    .to_owned(),
            ),
            (Response::Topic(Arc::new(topic.clone())), format!(r#"{{"r":"topic","d":{topic_json}}}"#)),
            (
                Response::TopicDeleted(Arc::new(topic.clone())),
                format!(r#"{{"r":"topic_deleted","d":{topic_json}}}"#),
            ),
            (Response::Assigned, r#"{"r":"assigned"}"#.to_owned()),
            (
                Response::Member(Arc::new(member)),
                r#"{"r":"member","d":{"id":"n1","addr":"h:1","status":"alive","last_heartbeat":5}}"#
                    .to_owned(),
            ),
            (Response::User(Arc::new(user.clone())), format!(r#"{{"r":"user","d":{user_json}}}"#)),
            (
                Response::UserDeleted(Arc::new(user)),
                format!(r#"{{"r":"user_deleted","d":{user_json}}}"#),
            ),
            (
                Response::ChildDetached { parent: Arc::new(topic), link },
                format!(
                    r#"{{"r":"child_detached","d":{{"parent":{topic_json},"link":{{"name":"p","attach_epoch":"00000000000000ff","fanout_delay_ms":0,"attached_at_ms":7}}}}}}"#
                ),
            ),
        ];
        for (response, json) in cases {
            assert_eq!(serde_json::to_string(&response).unwrap(), json);
            assert_eq!(serde_json::from_str::<Response>(&json).unwrap(), response);
        }
        assert!(serde_json::from_str::<Response>(r#"{"r":"nope"}"#).is_err());
        assert!(serde_json::from_str::<Response>(r#"{"r":"assigned","x":1}"#).is_err());
    }

    #[test]
    fn placing_only_unassigned_partitions_encodes_its_flag_and_decodes_back() {
        let cmd = Command::AssignPartitions(AssignPartitions {
            topic: "orders".into(),
            incarnation: 12,
            assignments: vec![PartitionAssignment {
                partition: 0,
                owner_id: "n3".into(),
                target_id: None,
            }],
            unassigned_only: true,
        });
        let bytes = r#"{"op":4,"d":{"topic":"orders","incarnation":12,"assignments":[{"partition":0,"owner_id":"n3","target_id":null}],"unassigned_only":true}}"#;
        assert_eq!(serde_json::to_string(&cmd).unwrap(), bytes);
        assert_eq!(serde_json::from_str::<Command>(bytes).unwrap(), cmd);
    }

    #[test]
    fn a_flip_names_its_attempt_and_one_logged_without_it_still_decodes() {
        let cmd = Command::CompleteMove(CompleteMove {
            topic: "orders".into(),
            incarnation: 7,
            partition: 2,
            expected_owner: "n1".into(),
            target_id: "n4".into(),
            attempt: Some(812),
        });
        let bytes = r#"{"op":14,"d":{"topic":"orders","incarnation":7,"partition":2,"expected_owner":"n1","target_id":"n4","attempt":812}}"#;
        assert_eq!(serde_json::to_string(&cmd).unwrap(), bytes);
        assert_eq!(serde_json::from_str::<Command>(bytes).unwrap(), cmd);
    }

    #[test]
    fn opcodes_are_distinct_and_never_renumbered() {
        let ops: Vec<u8> = golden().iter().map(|(c, _)| c.opcode()).collect();
        assert_eq!(ops, (1..=17).collect::<Vec<u8>>());
    }

    #[test]
    fn a_child_create_logged_before_links_kept_their_time_still_decodes() {
        let old = r#"{"op":1,"d":{"name":"c","partitions":3,"retention_ms":0,"visibility_timeout_ms":30000,"max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1700000000,"owner":"","schema":null,"parent":{"name":"p","attach_epoch":"0011223344556677","fanout_delay_ms":5}}}"#;
        let Command::CreateTopic(c) = Command::from_json(old.as_bytes()).unwrap() else {
            panic!("op 1 is CreateTopic")
        };
        assert_eq!(c.parent.map(|l| (l.fanout_delay_ms, l.attached_at_ms)), Some((5, 0)));
    }

    #[test]
    fn unknown_opcodes_and_fields_are_refused() {
        let e = Command::from_json(br#"{"op":99,"d":{}}"#).unwrap_err();
        assert!(e.to_string().contains("unknown metastore command opcode 99"), "{e}");
        assert!(Command::from_json(br#"{"op":3,"d":{"name":"x","extra":1}}"#).is_err());
        assert!(Command::from_json(br#"{"op":3,"d":{"name":"x"},"z":0}"#).is_err());
    }
}
