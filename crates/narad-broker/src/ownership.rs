//! Who owns a partition and whether that owner is up, as the metastore's
//! assignments and members say (SPEC §7.2): the owner fields of a topic's
//! `partition_stats` and the per-member counts of `GET
//! /v1/cluster/members`. Reads one snapshot; never blocks.

use std::collections::BTreeMap;

use narad_meta::MemberStatus;
use narad_meta::MetaState;
use serde::{Deserialize, Serialize};

/// The owner's liveness by its member record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum OwnerLiveness {
    /// The owner is a member marked alive.
    Alive,
    /// The owner is a member marked dead (missed its heartbeats).
    Dead,
    /// The partition is unassigned, or its owner has no member record.
    Unknown,
}

/// Whether a partition can be served by its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PartitionStatus {
    /// Owned by an alive member.
    Ok,
    /// The owner is dead, unknown, or there is none yet.
    OwnerUnavailable,
}

/// The owner of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionOwner {
    /// The owning member's id (`None` while unassigned).
    pub owner_node: Option<String>,
    /// `ok` exactly when the owner is alive.
    pub status: PartitionStatus,
    /// The owner's liveness.
    pub liveness: OwnerLiveness,
}

/// The owner of `topic`'s partition `partition` in `state`.
pub fn partition_owner(state: &MetaState, topic: &str, partition: u32) -> PartitionOwner {
    let owner = state.assignment(topic, partition).map(|a| a.owner_id.clone());
    let liveness = match owner.as_deref().and_then(|id| state.member(id)) {
        Some(m) if m.status == MemberStatus::Alive => OwnerLiveness::Alive,
        Some(_) => OwnerLiveness::Dead,
        None => OwnerLiveness::Unknown,
    };
    let status = if liveness == OwnerLiveness::Alive {
        PartitionStatus::Ok
    } else {
        PartitionStatus::OwnerUnavailable
    };
    PartitionOwner { owner_node: owner, status, liveness }
}

/// What one member holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberLoad {
    /// Partitions it owns (over every topic).
    pub owned_partitions: u64,
    /// Of those, the ones a move is taking elsewhere (a target is set).
    pub outbound_moves: u64,
}

/// The load of every member id that owns something (members owning
/// nothing are absent: their load is the default).
pub fn member_loads(state: &MetaState) -> BTreeMap<String, MemberLoad> {
    let mut out: BTreeMap<String, MemberLoad> = BTreeMap::new();
    for t in state.topics() {
        for a in state.assignments(t.name()).into_iter().flat_map(|a| a.values()) {
            let load = out.entry(a.owner_id.clone()).or_default();
            load.owned_partitions += 1;
            if a.target_id.is_some() {
                load.outbound_moves += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use narad_meta::Member;
    use narad_meta::PartitionAssignment;
    use narad_meta::{CreateTopicRequest, MetaStore};

    use super::*;

    use crate::test_support::sim_store as store;

    fn join(meta: &MetaStore, id: &str) {
        let m = Member {
            id: id.into(),
            addr: format!("{id}:7942"),
            cluster_addr: None,
            status: MemberStatus::Alive,
            last_heartbeat: 1,
            draining: false,
        };
        meta.member_join(m).unwrap();
    }

    fn assign(p: u32, owner: &str, target: Option<&str>) -> PartitionAssignment {
        PartitionAssignment {
            partition: p,
            owner_id: owner.into(),
            target_id: target.map(str::to_owned),
        }
    }

    #[test]
    fn a_partition_is_ok_only_while_its_owner_is_an_alive_member() {
        let meta = store();
        let req = CreateTopicRequest { name: "t".into(), partitions: 4, ..Default::default() };
        let t = meta.create_topic(req).unwrap();
        join(&meta, "n1");
        join(&meta, "n2");
        let a = vec![assign(0, "n1", None), assign(1, "n2", None), assign(2, "ghost", None)];
        meta.assign_partitions("t", t.incarnation(), a).unwrap();
        meta.member_dead("n2").unwrap();
        let snap = meta.snapshot();
        let got: Vec<PartitionOwner> = (0..4).map(|p| partition_owner(&snap, "t", p)).collect();
        let want = |owner: Option<&str>, status, liveness| PartitionOwner {
            owner_node: owner.map(str::to_owned),
            status,
            liveness,
        };
        use OwnerLiveness::*;
        use PartitionStatus::*;
        assert_eq!(
            got,
            vec![
                want(Some("n1"), Ok, Alive),
                want(Some("n2"), OwnerUnavailable, Dead),
                want(Some("ghost"), OwnerUnavailable, Unknown),
                want(None, OwnerUnavailable, Unknown),
            ]
        );
        let json = serde_json::to_string(&(OwnerUnavailable, Dead, Ok, Unknown)).unwrap();
        assert_eq!(json, r#"["owner_unavailable","dead","ok","unknown"]"#);
    }

    #[test]
    fn member_loads_count_owned_partitions_and_outbound_moves_over_every_topic() {
        let meta = store();
        for name in ["a", "b"] {
            let req = CreateTopicRequest { name: name.into(), ..Default::default() };
            let t = meta.create_topic(req).unwrap();
            let a = vec![
                assign(0, "n1", None),
                assign(1, "n2", Some("n1")),
                assign(2, "n1", Some("n2")),
            ];
            meta.assign_partitions(name, t.incarnation(), a).unwrap();
        }
        let loads = member_loads(&meta.snapshot());
        assert_eq!(loads["n1"], MemberLoad { owned_partitions: 4, outbound_moves: 2 });
        assert_eq!(loads["n2"], MemberLoad { owned_partitions: 2, outbound_moves: 2 });
        assert_eq!(loads.len(), 2);
    }
}
