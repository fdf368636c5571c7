//! Shared helpers of the integration tests: opening stores and a seeded
//! generator of random but meaningful commands.

#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use narad_clock::ManualClock;
use narad_fs::{Fs, SimRng};
use narad_meta::{
    Action, AlterTopicRequest, AttachChildRequest, Command, CreateTopicRequest, CreateUser,
    DeleteTopic, DeleteUser, DetachChild, Grant, Member, MemberDead, MemberJoin, MemberStatus,
    MetaError, MetaState, MetaStore, MetaStoreOptions, PartitionAssignment, SeedRootUser,
    TopicDefaults, UpdateUser, User,
};

pub const DATA: &str = "/data";

pub fn options() -> MetaStoreOptions {
    MetaStoreOptions {
        defaults: TopicDefaults::default(),
        clock: Arc::new(ManualClock::new(1_700_000_000_000)),
        rng_seed: Some(1),
    }
}

pub fn open(fs: &dyn Fs) -> Result<MetaStore, MetaError> {
    MetaStore::open(fs, Path::new(DATA), options())
}

/// Compatible schema versions, in order, and one that breaks them.
pub const SCHEMAS: [&str; 3] = [
    r#"{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]}"#,
    r#"{"type":"object","properties":{"id":{"type":"integer"},"a":{}},"required":["id"]}"#,
    r#"{"type":"object","properties":{"id":{"type":["integer","null"]},"a":{},"b":{"type":"string"}},"required":["id"]}"#,
];
pub const BREAKING_SCHEMA: &str = r#"{"type":"object","properties":{"a":{}}}"#;

const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];
const MEMBERS: [&str; 2] = ["n1", "n2"];

/// A random command that makes sense against `state` (it may still be
/// refused by apply, as real requests are). `None` when the drawn request
/// fails the proposer-side rules.
pub fn random_command(rng: &mut SimRng, state: &MetaState) -> Option<Command> {
    let pick =
        |rng: &mut SimRng, from: &[&'static str]| from[rng.below(from.len() as u64) as usize];
    let name = pick(rng, &NAMES).to_owned();
    let defaults = TopicDefaults::default();
    let command = match rng.below(14) {
        0..=2 => {
            let mut req = CreateTopicRequest { name, ..Default::default() };
            req.partitions = [0, 3, 4, 8][rng.below(4) as usize];
            if rng.chance(1, 3) {
                req.schema = Some(SCHEMAS[0].to_owned());
            }
            if rng.chance(1, 3) {
                req.parent = pick(rng, &NAMES).to_owned();
                req.fanout_delay_ms = [0, 1000][rng.below(2) as usize];
            }
            let now_ms = 1_700_000_000_000 + state.applied_index() * 1000;
            Command::CreateTopic(req.resolve(&defaults, state, now_ms, rng.next_u64()).ok()?)
        }
        3..=4 => {
            let mut req = AlterTopicRequest::default();
            match rng.below(4) {
                0 => req.retention_ms = Some([0, 3_600_000, 7_200_000][rng.below(3) as usize]),
                1 => req.max_in_flight_per_partition = Some(rng.below(2000) as i64),
                2 => req.partitions = rng.range(3, 12) as i64,
                _ => {
                    let next = state.schema_history(&name).map_or(0, |h| h.versions().len());
                    let schema = SCHEMAS.get(next).copied().unwrap_or(BREAKING_SCHEMA);
                    req.schema = Some(schema.to_owned());
                }
            }
            Command::AlterTopic(req.resolve(&name, &defaults).ok()?)
        }
        5..=6 => Command::DeleteTopic(DeleteTopic { name }),
        7 => {
            let topic = state.topic(&name)?;
            let owner = pick(rng, &MEMBERS).to_owned();
            let assignments = (0..topic.partitions())
                .filter(|_| rng.chance(1, 2))
                .map(|partition| PartitionAssignment {
                    partition,
                    owner_id: owner.clone(),
                    target_id: None,
                })
                .collect();
            Command::AssignPartitions(narad_meta::AssignPartitions {
                topic: name,
                incarnation: topic.incarnation(),
                assignments,
                unassigned_only: rng.below(2) == 1,
            })
        }
        8 => Command::MemberJoin(MemberJoin {
            member: Member {
                id: pick(rng, &MEMBERS).to_owned(),
                addr: "127.0.0.1:7942".to_owned(),
                cluster_addr: None,
                status: MemberStatus::Alive,
                last_heartbeat: state.applied_index() as i64,
                draining: false,
            },
        }),
        9 => Command::MemberDead(MemberDead {
            id: pick(rng, &MEMBERS).to_owned(),
            last_heartbeat: None,
        }),
        10 => {
            let user = User {
                username: name.clone(),
                password_hash: format!("$2b$10$h{}", state.applied_index()),
                grants: vec![Grant { action: Action::Produce, patterns: vec![format!("{name}*")] }],
                root: false,
                created_at_ms: 1,
                updated_at_ms: 1,
            };
            if state.user(&name).is_some() {
                Command::UpdateUser(UpdateUser {
                    username: name,
                    grants: rng.chance(1, 2).then(Vec::new),
                    password_hash: Some(user.password_hash),
                    updated_at_ms: 2,
                })
            } else {
                Command::CreateUser(CreateUser { user })
            }
        }
        11 => {
            let parent = pick(rng, &NAMES).to_owned();
            let delay_ms = [0, 1000][rng.below(2) as usize];
            let req = AttachChildRequest { parent, child: name, delay_ms };
            let now_ms = 1_700_000_000_000 + state.applied_index() * 1000;
            Command::AttachChild(req.resolve(state, now_ms, rng.next_u64()).ok()?)
        }
        12 => {
            let parent = state.topic(&name)?.parent()?.name.clone();
            let child = if rng.chance(1, 4) { pick(rng, &NAMES).to_owned() } else { name };
            Command::DetachChild(DetachChild { parent, child })
        }
        _ if rng.chance(1, 4) => Command::SeedRootUser(SeedRootUser {
            user: User {
                username: "admin".to_owned(),
                password_hash: "$2b$10$root".to_owned(),
                grants: Vec::new(),
                root: true,
                created_at_ms: 1,
                updated_at_ms: 1,
            },
        }),
        _ => Command::DeleteUser(DeleteUser { username: name }),
    };
    Some(command)
}
