//! The rebalance planner (SPEC §7.3): which partitions should move, and
//! where, so that the receivers (alive members that are not draining) each
//! hold ⌊T/R⌋ or ⌈T/R⌉ of the T partitions that can move. A pure function
//! of the metastore's state, like placement: the leader's controller and
//! `GET /v1/cluster/rebalance` (the plan, dry run) call the same code.
//!
//! Rules:
//! * A partition whose owner is not a receiver and not draining (dead, or
//!   a member the state does not know alive) is not planned: a dead
//!   owner's log is in nobody's reach, so it stays (SPEC: "dead-owner
//!   partitions stay"; `narad cluster remove --force` is the way out).
//! * A draining member's partitions all move away, whatever the balance.
//! * A partition already moving (`target_id` set) counts on its target and
//!   is not planned again; at most `max_in_flight` moves exist at once,
//!   cluster-wide, counting those.
//! * Minimal: each planned move takes one partition from the most loaded
//!   member (draining members first) to the least loaded receiver, and
//!   planning stops as soon as the loads are within one of each other, so
//!   the plan holds exactly the surplus above the quotas.
//! * Anti-affinity is a preference: among the source's partitions and the
//!   least loaded receivers, a move that puts a fan-out child's partition
//!   `p` on the owner of its parent's partition `p` (or the reverse) is
//!   taken only when no other move of that source is possible.
//! * Deterministic: ties go to the smaller id, then to the smaller
//!   `(topic, partition)`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::state::MetaState;

/// One partition as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionView {
    /// The topic's name.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// Its owner.
    pub owner: String,
    /// Where a move is already taking it.
    pub target: Option<String>,
    /// Members its anti-affine counterparts live on (the parent's
    /// partition of the same index for a child; the children's for a
    /// parent).
    pub avoid: Vec<String>,
}

/// A move the planner asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PlannedMove {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// Its owner now.
    pub from: String,
    /// Where it should go.
    pub to: String,
}

/// The partitions of `state` as the planner sees them, in `(topic,
/// partition)` order (unassigned partitions are placement's, not the
/// planner's).
pub fn partition_views(state: &MetaState) -> Vec<PartitionView> {
    let mut out = Vec::new();
    for t in state.topics() {
        let Some(assignments) = state.assignments(t.name()) else { continue };
        for (&p, a) in assignments.iter() {
            let mut avoid = Vec::new();
            if let Some(parent) = t.parent()
                && let Some(pa) = state.assignment(&parent.name, p)
            {
                avoid.push(pa.owner_id.clone());
            }
            for child in t.children() {
                if let Some(ca) = state.assignment(child, p) {
                    avoid.push(ca.owner_id.clone());
                }
            }
            out.push(PartitionView {
                topic: t.name().to_owned(),
                partition: p,
                owner: a.owner_id.clone(),
                target: a.target_id.clone(),
                avoid,
            });
        }
    }
    out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    out
}

/// The moves to plan now over `partitions`: `receivers` are the alive,
/// non-draining members, `draining` the alive members being emptied; at
/// most `max_in_flight` moves in flight once these start (see the module
/// docs).
pub fn plan(
    partitions: &[PartitionView],
    receivers: &BTreeSet<String>,
    draining: &BTreeSet<String>,
    max_in_flight: usize,
) -> Vec<PlannedMove> {
    if receivers.is_empty() {
        return Vec::new();
    }
    let in_flight = partitions.iter().filter(|v| v.target.is_some()).count();
    let budget = max_in_flight.saturating_sub(in_flight);
    // Each member's movable partitions (where they are, or will be).
    let mut held: BTreeMap<&str, Vec<&PartitionView>> = BTreeMap::new();
    for r in receivers.iter().chain(draining) {
        held.entry(r.as_str()).or_default();
    }
    let mut load: BTreeMap<&str, usize> = held.keys().map(|m| (*m, 0)).collect();
    for v in partitions {
        let at = v.target.as_deref().unwrap_or(&v.owner);
        if let Some(n) = load.get_mut(at) {
            *n += 1;
            // Only a partition that is not already moving can be planned.
            if v.target.is_none() {
                held.get_mut(at).expect("held has every loaded member").push(v);
            }
        }
    }
    let mut out = Vec::new();
    while out.len() < budget {
        // The least loaded receiver (smaller id first).
        let min = receivers.iter().map(|r| (load[r.as_str()], r.as_str())).min();
        let Some((min_load, _)) = min else { break };
        // The source: a draining member with partitions left, else the
        // most loaded receiver if it holds two more than the least.
        let source =
            draining.iter().map(String::as_str).find(|d| !held[d].is_empty()).or_else(|| {
                receivers
                    .iter()
                    .map(|r| (load[r.as_str()], std::cmp::Reverse(r.as_str())))
                    .max()
                    .filter(|(l, _)| *l > min_load + 1)
                    .map(|(_, std::cmp::Reverse(r))| r)
                    .filter(|r| !held[r].is_empty())
            });
        let Some(source) = source else { break };
        let dests: Vec<&str> = receivers
            .iter()
            .map(String::as_str)
            .filter(|r| load[r] == min_load && *r != source)
            .collect();
        let Some(&fallback_dest) = dests.first() else { break };
        let candidates = &held[source];
        // Judged by where the counterparts are now (a move planned in
        // this same plan may change that: a preference, not a rule).
        let avoids = |v: &PartitionView, d: &str| v.avoid.iter().any(|a| a == d);
        let pick = candidates
            .iter()
            .enumerate()
            .find_map(|(i, v)| dests.iter().find(|d| !avoids(v, d)).map(|d| (i, *d)))
            .unwrap_or((0, fallback_dest));
        let (i, dest) = pick;
        let v = held.get_mut(source).expect("source is held").remove(i);
        *load.get_mut(source).expect("source is loaded") -= 1;
        *load.get_mut(dest).expect("dest is loaded") += 1;
        out.push(PlannedMove {
            topic: v.topic.clone(),
            partition: v.partition,
            from: v.owner.clone(),
            to: dest.to_owned(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn views(topic: &str, owners: &[&str]) -> Vec<PartitionView> {
        owners
            .iter()
            .enumerate()
            .map(|(p, o)| PartitionView {
                topic: topic.into(),
                partition: p as u32,
                owner: o.to_string(),
                target: None,
                avoid: Vec::new(),
            })
            .collect()
    }

    /// Where every partition is once `moves` are done.
    fn loads(parts: &[PartitionView], moves: &[PlannedMove]) -> BTreeMap<String, usize> {
        let mut at: BTreeMap<(String, u32), String> = parts
            .iter()
            .map(|v| ((v.topic.clone(), v.partition), v.target.clone().unwrap_or(v.owner.clone())))
            .collect();
        for m in moves {
            assert_eq!(at[&(m.topic.clone(), m.partition)], m.from, "{m:?} moves from its owner");
            at.insert((m.topic.clone(), m.partition), m.to.clone());
        }
        let mut out = BTreeMap::new();
        for owner in at.values() {
            *out.entry(owner.clone()).or_default() += 1;
        }
        out
    }

    #[test]
    fn a_joining_member_receives_exactly_its_share() {
        // 12 partitions on 3 members, a 4th joins: 3 each, 3 moves.
        let parts = views("t", &["n1", "n2", "n3"].repeat(4));
        let moves = plan(&parts, &set(&["n1", "n2", "n3", "n4"]), &set(&[]), 100);
        assert_eq!(moves.len(), 3, "{moves:?}");
        assert!(moves.iter().all(|m| m.to == "n4"));
        assert!(loads(&parts, &moves).values().all(|&n| n == 3));
    }

    #[test]
    fn a_balanced_cluster_plans_nothing_and_uneven_counts_stay_within_one() {
        let parts = views("t", &["n1", "n2", "n3", "n1"]);
        assert!(plan(&parts, &set(&["n1", "n2", "n3"]), &set(&[]), 8).is_empty());
        // 7 on one member of 3: 2 or 3 each, the minimal 4 moves.
        let parts = views("t", &["n1"; 7]);
        let moves = plan(&parts, &set(&["n1", "n2", "n3"]), &set(&[]), 8);
        assert_eq!(moves.len(), 4);
        let l = loads(&parts, &moves);
        assert!(l.values().all(|&n| n == 2 || n == 3), "{l:?}");
    }

    #[test]
    fn a_draining_member_is_emptied_and_dead_owners_partitions_stay() {
        let parts = views("t", &["n1", "n2", "n3", "gone", "n3", "gone"]);
        let moves = plan(&parts, &set(&["n1", "n2"]), &set(&["n3"]), 8);
        assert!(moves.iter().all(|m| m.from == "n3"), "{moves:?}");
        assert_eq!(moves.len(), 2);
        let l = loads(&parts, &moves);
        assert_eq!((l.get("n3"), l["gone"], l["n1"], l["n2"]), (None, 2, 2, 2));
    }

    #[test]
    fn moves_in_flight_count_on_their_target_and_against_the_budget() {
        let mut parts = views("t", &["n1"; 6]);
        parts[0].target = Some("n2".into());
        let moves = plan(&parts, &set(&["n1", "n2", "n3"]), &set(&[]), 3);
        // 2 new at most (3 in flight), and the one moving is not planned.
        assert_eq!(moves.len(), 2);
        assert!(moves.iter().all(|m| m.partition != 0));
        let moves = plan(&parts, &set(&["n1", "n2", "n3"]), &set(&[]), 100);
        let l = loads(&parts, &moves);
        assert!(l.values().all(|&n| n == 2), "{l:?}");
    }

    #[test]
    fn a_child_partition_avoids_its_parents_owner_when_it_can() {
        // n1 holds 4, n2 and n3 none; partition 0 must not go to n2 (its
        // parent's owner), so the plan sends it to n3 or another to n2.
        let mut parts = views("c", &["n1"; 4]);
        parts[0].avoid = vec!["n2".into()];
        parts[1].avoid = vec!["n2".into(), "n3".into()];
        let moves = plan(&parts, &set(&["n1", "n2", "n3"]), &set(&[]), 8);
        for m in &moves {
            let v = &parts[m.partition as usize];
            assert!(!v.avoid.contains(&m.to), "{m:?} lands on a counterpart's owner");
        }
        let l = loads(&parts, &moves);
        assert!(l.values().all(|&n| n == 1 || n == 2), "{l:?}");
    }

    #[test]
    fn the_plan_is_the_same_every_time() {
        let parts = views("t", &["n2", "n2", "n2", "n1", "n2", "n2"]);
        let r = set(&["n1", "n2", "n3"]);
        let a = plan(&parts, &r, &set(&[]), 8);
        assert_eq!(a, plan(&parts, &r, &set(&[]), 8));
        // n2 holds 5 of 6: it gives 3 (2 each), n3 first (it holds none).
        assert_eq!(a.len(), 3);
        assert_eq!(
            a[0],
            PlannedMove { topic: "t".into(), partition: 0, from: "n2".into(), to: "n3".into() }
        );
    }
}
