//! A state-machine snapshot: the metastore's whole state and the Raft state
//! stored with it, as one self-checking byte string. The replicated control
//! plane ships it to a follower that is too far behind for the log
//! ([`crate::MetaStore::export_snapshot`], [`crate::MetaStore::install_snapshot`]).
//!
//! # Layout (integers big-endian)
//! ```text
//! 0   magic "NMSNAP01" (8)
//! 8   version u16 = 1
//! 10  flags u16: bit 0 = a Raft state is present; every other bit zero
//! 12  raft_len u32: length of the Raft state (0 when absent)
//! 16  body_len u64: length of the body
//! 24  the Raft state (raft_len bytes, opaque)
//! ..  the body (body_len bytes): JSON {"applied_index","versions","topics":
//!     [Topic…],"schemas":{name:[text…]},"assignments":{name:{partition:
//!     Assignment}},"members":[Member…],"users":[User…]}, each record the
//!     same JSON as its metastore row, every list and map in key order
//! end crc32c u32 over every byte before it
//! ```
//!
//! # Invariants
//!
//! * The encoding is a function of the state: two stores holding the same
//!   state and Raft state export the same bytes.
//! * Decoding checks, in order, the header's size, the magic, the version,
//!   the flags, that `24 + raft_len + body_len + 4` is exactly the input's
//!   length (with overflow checked: nothing is allocated from a length
//!   before it is known to fit the input), the CRC, and then that the body
//!   decodes (unknown fields refused), every schema compiles and the state
//!   passes [`MetaState::check_invariants`]. Any failure is a
//!   [`StorageError::BadSnapshot`] naming it; decoding never panics.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::assignment::Assignment;
use crate::error::StorageError;
use crate::member::Member;
use crate::schema::SchemaHistory;
use crate::state::{MetaState, Versions};
use crate::topic::Topic;
use crate::user::User;

const MAGIC: [u8; 8] = *b"NMSNAP01";
const VERSION: u16 = 1;
const FLAG_RAFT_STATE: u16 = 1;
const HEADER_BYTES: usize = 24;
const CRC_BYTES: usize = 4;

/// The body as it is written (borrowing the state).
#[derive(Serialize)]
struct BodyRef<'a> {
    applied_index: u64,
    versions: Versions,
    topics: Vec<&'a Topic>,
    schemas: BTreeMap<&'a str, &'a [Arc<str>]>,
    assignments: BTreeMap<&'a str, &'a BTreeMap<u32, Assignment>>,
    members: Vec<&'a Member>,
    users: Vec<&'a User>,
}

/// The body as it is read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    applied_index: u64,
    versions: Versions,
    topics: Vec<Topic>,
    schemas: BTreeMap<String, Vec<Arc<str>>>,
    assignments: BTreeMap<String, BTreeMap<u32, Assignment>>,
    members: Vec<Member>,
    users: Vec<User>,
}

fn bad(why: impl Into<String>) -> StorageError {
    StorageError::BadSnapshot(why.into())
}

/// Encodes `state` and `raft_state` (see the module docs).
pub(crate) fn encode(
    state: &MetaState,
    raft_state: Option<&[u8]>,
) -> Result<Vec<u8>, StorageError> {
    let body = BodyRef {
        applied_index: state.applied_index,
        versions: state.versions,
        topics: state.topics.values().map(|t| t.as_ref()).collect(),
        schemas: state.schemas.iter().map(|(k, h)| (k.as_str(), h.versions())).collect(),
        assignments: state.assignments.iter().map(|(k, a)| (k.as_str(), a.as_ref())).collect(),
        members: state.members.values().map(|m| m.as_ref()).collect(),
        users: state.users.values().map(|u| u.as_ref()).collect(),
    };
    let body = serde_json::to_vec(&body).expect("metastore records always serialize");
    let raft = raft_state.unwrap_or_default();
    let raft_len = u32::try_from(raft.len())
        .map_err(|_| bad(format!("the Raft state is {} bytes, more than 4 GiB", raft.len())))?;
    let flags = if raft_state.is_some() { FLAG_RAFT_STATE } else { 0 };
    let mut out = Vec::with_capacity(HEADER_BYTES + raft.len() + body.len() + CRC_BYTES);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&raft_len.to_be_bytes());
    out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    out.extend_from_slice(raft);
    out.extend_from_slice(&body);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// Decodes and checks a snapshot (see the module docs): the state and the
/// Raft state it carries. Public (as `narad_meta::decode_snapshot`, hidden)
/// only for the fuzz checks of `fuzz/src/cluster.rs`.
pub fn decode(bytes: &[u8]) -> Result<(MetaState, Option<Vec<u8>>), StorageError> {
    if bytes.len() < HEADER_BYTES + CRC_BYTES {
        return Err(bad(format!(
            "{} bytes is shorter than a header and a checksum ({} bytes)",
            bytes.len(),
            HEADER_BYTES + CRC_BYTES
        )));
    }
    if bytes[..8] != MAGIC {
        return Err(bad("no snapshot magic"));
    }
    let u16_at = |at: usize| u16::from_be_bytes([bytes[at], bytes[at + 1]]);
    let version = u16_at(8);
    if version != VERSION {
        return Err(bad(format!(
            "version {version} is not supported (this build reads {VERSION})"
        )));
    }
    let flags = u16_at(10);
    if flags & !FLAG_RAFT_STATE != 0 {
        return Err(bad(format!("unknown flags {flags:#06x}")));
    }
    let raft_len = u32::from_be_bytes(bytes[12..16].try_into().expect("4 bytes")) as u64;
    let body_len = u64::from_be_bytes(bytes[16..24].try_into().expect("8 bytes"));
    if flags & FLAG_RAFT_STATE == 0 && raft_len != 0 {
        return Err(bad(format!("no Raft state flagged but {raft_len} bytes of it")));
    }
    let expected = (HEADER_BYTES as u64 + CRC_BYTES as u64)
        .checked_add(raft_len)
        .and_then(|n| n.checked_add(body_len));
    if expected != Some(bytes.len() as u64) {
        return Err(bad(format!(
            "is {} bytes, but its header says {raft_len} bytes of Raft state and {body_len} of \
             body (truncated or damaged)",
            bytes.len()
        )));
    }
    let (covered, crc) = bytes.split_at(bytes.len() - CRC_BYTES);
    let stored = u32::from_be_bytes(crc.try_into().expect("4 bytes"));
    let actual = crc32c::crc32c(covered);
    if stored != actual {
        return Err(bad(format!(
            "checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
        )));
    }
    let (raft, body) = covered[HEADER_BYTES..].split_at(raft_len as usize);
    let raft_state = (flags & FLAG_RAFT_STATE != 0).then(|| raft.to_vec());
    let body: Body =
        serde_json::from_slice(body).map_err(|e| bad(format!("the body does not decode: {e}")))?;
    Ok((state_of(body)?, raft_state))
}

/// The state a decoded body describes, checked.
fn state_of(body: Body) -> Result<MetaState, StorageError> {
    let keyed = |what: &str, keys: Vec<String>| -> Result<(), StorageError> {
        match keys.windows(2).find(|w| w[0] >= w[1]) {
            Some(w) => Err(bad(format!("{what} are not in key order at {:?}", w[1]))),
            None => Ok(()),
        }
    };
    keyed("topics", body.topics.iter().map(|t| t.name.clone()).collect())?;
    keyed("members", body.members.iter().map(|m| m.id.clone()).collect())?;
    keyed("users", body.users.iter().map(|u| u.username.clone()).collect())?;
    let schemas = body
        .schemas
        .into_iter()
        .map(|(name, versions)| {
            let history = SchemaHistory::from_versions(versions)
                .map_err(|e| bad(format!("the schema of {name:?} does not compile: {e}")))?;
            Ok((name, Arc::new(history)))
        })
        .collect::<Result<BTreeMap<_, _>, StorageError>>()?;
    let state = MetaState {
        applied_index: body.applied_index,
        versions: body.versions,
        topics: Arc::new(body.topics.into_iter().map(|t| (t.name.clone(), Arc::new(t))).collect()),
        schemas: Arc::new(schemas),
        assignments: Arc::new(
            body.assignments.into_iter().map(|(k, a)| (k, Arc::new(a))).collect(),
        ),
        members: Arc::new(body.members.into_iter().map(|m| (m.id.clone(), Arc::new(m))).collect()),
        users: Arc::new(
            body.users.into_iter().map(|u| (u.username.clone(), Arc::new(u))).collect(),
        ),
    };
    state.check_invariants().map_err(|why| bad(format!("the state is inconsistent: {why}")))?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::apply;
    use crate::command::{AssignPartitions, Command, MemberJoin, PartitionAssignment};
    use crate::config::TopicDefaults;
    use crate::member::MemberStatus;
    use crate::request::CreateTopicRequest;

    /// A small state touching every table: a topic with a schema and an
    /// assignment, and a member.
    fn small_state() -> MetaState {
        let request = CreateTopicRequest {
            name: "t".into(),
            partitions: 3,
            schema: Some(r#"{"type":"object"}"#.into()),
            ..Default::default()
        };
        let create = request
            .resolve(&TopicDefaults::default(), &MetaState::default(), 1_700_000_000_000, 1)
            .unwrap();
        let commands = [
            Command::CreateTopic(create),
            Command::AssignPartitions(AssignPartitions {
                topic: "t".into(),
                incarnation: 1,
                assignments: vec![PartitionAssignment {
                    partition: 0,
                    owner_id: "n1".into(),
                    target_id: None,
                }],
                unassigned_only: false,
            }),
            Command::MemberJoin(MemberJoin {
                member: Member {
                    id: "n1".into(),
                    addr: "h:1".into(),
                    cluster_addr: None,
                    status: MemberStatus::Alive,
                    last_heartbeat: 5,
                    draining: false,
                },
            }),
        ];
        let mut state = MetaState::default();
        for (i, c) in commands.iter().enumerate() {
            state = apply(&state, i as u64 + 1, c).unwrap().state;
        }
        state
    }

    const GOLDEN_BODY: &str = r#"{"applied_index":3,"versions":{"topics":1,"schemas":1,"assignments":1,"members":1,"users":0},"topics":[{"name":"t","incarnation":1,"partitions":3,"retention_ms":604800000,"visibility_timeout_ms":30000,"max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1700000000}],"schemas":{"t":["{\"type\":\"object\"}"]},"assignments":{"t":{"0":{"owner_id":"n1"}}},"members":[{"id":"n1","addr":"h:1","status":"alive","last_heartbeat":5}],"users":[]}"#;

    #[test]
    fn a_snapshot_encodes_to_the_golden_bytes_and_decodes_back() {
        let state = small_state();
        let bytes = encode(&state, Some(b"rs")).unwrap();
        let mut golden = Vec::new();
        golden.extend_from_slice(b"NMSNAP01\x00\x01\x00\x01\x00\x00\x00\x02");
        golden.extend_from_slice(&(GOLDEN_BODY.len() as u64).to_be_bytes());
        golden.extend_from_slice(b"rs");
        golden.extend_from_slice(GOLDEN_BODY.as_bytes());
        golden.extend_from_slice(&GOLDEN_CRC.to_be_bytes());
        assert_eq!(String::from_utf8_lossy(&bytes[26..bytes.len() - 4]), GOLDEN_BODY);
        assert_eq!(bytes, golden);
        assert_eq!(crc32c::crc32c(&golden[..golden.len() - 4]), GOLDEN_CRC);
        let (back, raft) = decode(&bytes).unwrap();
        assert_eq!((back, raft.as_deref()), (state.clone(), Some(&b"rs"[..])));
        // No Raft state (a single node's export) is told apart from an empty one.
        let none = encode(&state, None).unwrap();
        assert_eq!(&none[10..16], &[0, 0, 0, 0, 0, 0]);
        assert_eq!(decode(&none).unwrap().1, None);
        assert_eq!(decode(&encode(&state, Some(b"")).unwrap()).unwrap().1, Some(Vec::new()));
    }

    const GOLDEN_CRC: u32 = 0xC510_7867;

    fn refused(bytes: &[u8]) -> String {
        match decode(bytes) {
            Err(StorageError::BadSnapshot(why)) => why,
            Err(other) => panic!("not a BadSnapshot: {other}"),
            Ok(_) => panic!("a damaged snapshot decoded"),
        }
    }

    /// Re-seals `bytes` with a correct CRC (a forger who knows the format).
    fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
        let n = bytes.len() - 4;
        let crc = crc32c::crc32c(&bytes[..n]);
        bytes[n..].copy_from_slice(&crc.to_be_bytes());
        bytes
    }

    #[test]
    fn every_flipped_bit_and_every_truncation_is_refused() {
        let bytes = encode(&small_state(), Some(b"rs")).unwrap();
        for i in 0..bytes.len() {
            for bit in [0x01, 0x80] {
                let mut bad = bytes.clone();
                bad[i] ^= bit;
                refused(&bad);
            }
        }
        for n in 0..bytes.len() {
            refused(&bytes[..n]);
        }
        let mut longer = bytes.clone();
        longer.push(0);
        refused(&longer);
    }

    #[test]
    fn a_forged_header_or_body_is_refused_with_its_reason() {
        let bytes = encode(&small_state(), Some(b"rs")).unwrap();
        let forge = |at: usize, with: &[u8]| {
            let mut b = bytes.clone();
            b[at..at + with.len()].copy_from_slice(with);
            refused(&reseal(b))
        };
        assert!(forge(0, b"NMSNAP02").contains("magic"));
        assert!(forge(8, &[0, 2]).contains("version 2"));
        assert!(forge(10, &[0, 3]).contains("unknown flags"));
        assert!(forge(10, &[0, 0]).contains("no Raft state flagged"));
        // Lengths that point past the end, or overflow, allocate nothing.
        assert!(forge(12, &u32::MAX.to_be_bytes()).contains("truncated or damaged"));
        assert!(forge(16, &u64::MAX.to_be_bytes()).contains("truncated or damaged"));
        // A body that is valid JSON but an inconsistent state.
        let body = GOLDEN_BODY.replace(r#""incarnation":1"#, r#""incarnation":9"#);
        let mut b = Vec::new();
        b.extend_from_slice(&bytes[..16]);
        b.extend_from_slice(&(body.len() as u64).to_be_bytes());
        b.extend_from_slice(b"rs");
        b.extend_from_slice(body.as_bytes());
        b.extend_from_slice(&[0; 4]);
        assert!(refused(&reseal(b)).contains("inconsistent"));
    }
}
