//! Placement: which node owns each partition of a new (or grown) topic.
//!
//! This is the hook for replica children. A child created with `parent` is
//! an asynchronous copy of the parent, and it only protects the data
//! against the loss of a node's disk if its partitions live elsewhere than
//! the parent's (SPEC §6 "Anti-affinity"):
//!
//! * child partition `p` (for `p` below the parent's partition count)
//!   avoids the owner of parent partition `p`: walk the ID-sorted ring of
//!   alive members from position `p` and take the first member that is not
//!   that owner;
//! * a child partition whose parent counterpart has no owner yet is left
//!   unassigned (the cluster controller places it once the parent's is);
//! * a ring of one colocates everything at once: there is nowhere else;
//! * every other partition (standalone topics, a parent, child indices at
//!   or above the parent's count) goes round robin: `ring[p % n]`.
//!
//! A child attached later keeps the placement it already has; rebalancing
//! treats anti-affinity as a preference.
//!
//! The ring is the members that are alive, heartbeated within
//! [`MEMBER_DEAD_AFTER`] and not draining ([`alive_ring`]): exactly the members the cluster
//! controller's next tick leaves alive. On a single node it is that node (or
//! nobody, once its start-up heartbeat is old; the broker then uses the node
//! itself), so every partition is local and the rules above reduce to
//! "assign to self"; a member left behind by an earlier node id never gets
//! partitions. A topic is placed at create (and its new partitions at
//! alter-grow) over the ring the creating node sees; the cluster controller
//! places whatever is left unassigned over the ring it sees at its tick.

use std::ops::Range;

use crate::limits::MEMBER_DEAD_AFTER;
use crate::{MemberStatus, MetaState, PartitionAssignment, Topic};

/// Whether a member last heard from at `last_heartbeat` is overdue at
/// `now_s` (both Unix seconds): silent for more than [`MEMBER_DEAD_AFTER`].
pub fn heartbeat_overdue(last_heartbeat: i64, now_s: i64) -> bool {
    now_s.saturating_sub(last_heartbeat) > MEMBER_DEAD_AFTER.as_secs() as i64
}

/// The ring [`place`] takes at `now_s` (Unix seconds): the ids of the
/// members `state` holds as alive whose heartbeat is not overdue and that
/// are not draining, in ascending (byte) order. When every live member is
/// draining, the live members (a cluster being emptied still places new
/// topics somewhere). Empty when there are none.
pub fn alive_ring(state: &MetaState, now_s: i64) -> Vec<String> {
    // Members iterate in id order.
    let live = |m: &&std::sync::Arc<crate::Member>| {
        m.status == MemberStatus::Alive && !heartbeat_overdue(m.last_heartbeat, now_s)
    };
    let receivers: Vec<String> =
        state.members().filter(live).filter(|m| !m.draining).map(|m| m.id.clone()).collect();
    if !receivers.is_empty() {
        return receivers;
    }
    state.members().filter(live).map(|m| m.id.clone()).collect()
}

/// The partitions of `topic` in `range` that can be placed now, with their
/// owners, by the rules of the module docs. `ring` is the alive members'
/// ids in ascending order (at least one); `state` gives the parent's
/// assignments.
pub fn place(
    state: &MetaState,
    topic: &Topic,
    range: Range<u32>,
    ring: &[String],
) -> Vec<PartitionAssignment> {
    assert!(!ring.is_empty(), "placement needs at least one alive member");
    let parent = topic.parent().and_then(|l| state.topic(&l.name));
    let mut out = Vec::new();
    for p in range {
        let owner = match parent.filter(|parent| p < parent.partitions() && ring.len() > 1) {
            Some(parent) => match state.assignment(parent.name(), p) {
                Some(a) => anti_affine(ring, p, &a.owner_id),
                None => continue, // wait for the parent's partition
            },
            None => ring[p as usize % ring.len()].clone(),
        };
        out.push(PartitionAssignment { partition: p, owner_id: owner, target_id: None });
    }
    out
}

/// One partition of a removed member and its new owner
/// ([`reassign_removed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOwner {
    /// The topic.
    pub topic: String,
    /// Its incarnation.
    pub incarnation: u64,
    /// The partition.
    pub partition: u32,
    /// The member that takes it.
    pub owner_id: String,
}

/// New owners for every partition member `removed` owns in `state` (every
/// topic, fan-out children included), for `RemoveMember` (op 17): a pure
/// function of the state, so the proposer's preview and every replica's
/// apply agree.
///
/// Receivers are the members marked alive, not draining, other than
/// `removed` (all alive ones when every one drains); none is an error.
/// Partitions go in (topic, partition) order, parents before children,
/// each to the receiver that owns the fewest partitions so far (ties by
/// id), preferring one that owns neither the partition of the same index
/// of the topic's parent nor of any of its children (SPEC §6
/// anti-affinity, kept where a receiver allows it).
pub fn reassign_removed(state: &MetaState, removed: &str) -> Result<Vec<NewOwner>, String> {
    let alive: Vec<&std::sync::Arc<crate::Member>> =
        state.members().filter(|m| m.status == MemberStatus::Alive && m.id != removed).collect();
    let mut receivers: Vec<&str> =
        alive.iter().filter(|m| !m.draining).map(|m| m.id.as_str()).collect();
    if receivers.is_empty() {
        receivers = alive.iter().map(|m| m.id.as_str()).collect();
    }
    let mut load: std::collections::BTreeMap<&str, u64> =
        receivers.iter().map(|id| (*id, 0)).collect();
    let mut owners: std::collections::BTreeMap<(&str, u32), &str> = Default::default();
    for t in state.topics() {
        for (p, a) in state.assignments(t.name()).into_iter().flat_map(|a| a.iter()) {
            owners.insert((t.name(), *p), a.owner_id.as_str());
            if let Some(n) = load.get_mut(a.owner_id.as_str()) {
                *n += 1;
            }
        }
    }
    let (parents, children): (Vec<&Topic>, Vec<&Topic>) =
        state.topics().map(|t| &**t).partition(|t| t.parent().is_none());
    let mut out = Vec::new();
    for t in parents.into_iter().chain(children) {
        for p in 0..t.partitions() {
            if owners.get(&(t.name(), p)) != Some(&removed) {
                continue;
            }
            if receivers.is_empty() {
                return Err(format!(
                    "no member is alive to take the partitions of {removed}: start a node first"
                ));
            }
            let relatives = t
                .parent()
                .map(|l| l.name.as_str())
                .into_iter()
                .chain(t.children().iter().map(String::as_str));
            let avoid: Vec<&str> = relatives.filter_map(|r| owners.get(&(r, p)).copied()).collect();
            let pick = |allowed: &dyn Fn(&str) -> bool| {
                receivers
                    .iter()
                    .copied()
                    .filter(|id| allowed(id))
                    .min_by_key(|id| (load.get(id).copied().unwrap_or(0), *id))
            };
            let owner = pick(&|id| !avoid.contains(&id))
                .or_else(|| pick(&|_| true))
                .expect("receivers is not empty");
            *load.entry(owner).or_default() += 1;
            owners.insert((t.name(), p), owner);
            out.push(NewOwner {
                topic: t.name().to_owned(),
                incarnation: t.incarnation(),
                partition: p,
                owner_id: owner.to_owned(),
            });
        }
    }
    out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    Ok(out)
}

/// The first member of `ring`, starting at position `p` and wrapping, that
/// is not `avoid`; `avoid` itself when it is the only member.
fn anti_affine(ring: &[String], p: u32, avoid: &str) -> String {
    let n = ring.len();
    (0..n)
        .map(|i| &ring[(p as usize + i) % n])
        .find(|m| m.as_str() != avoid)
        .unwrap_or(&ring[p as usize % n])
        .clone()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::path::Path;

    use narad_clock::ManualClock;
    use narad_fs::SimFs;

    use crate::{CreateTopicRequest, MetaStore, MetaStoreOptions, TopicDefaults};

    use super::*;

    fn store() -> MetaStore {
        let options = MetaStoreOptions {
            defaults: TopicDefaults::default(),
            clock: Arc::new(ManualClock::new(1_700_000_000_000)),
            rng_seed: Some(3),
        };
        MetaStore::open(&SimFs::new(1), Path::new("/d"), options).unwrap()
    }

    fn ring(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn owners(a: &[PartitionAssignment]) -> Vec<(u32, &str)> {
        a.iter().map(|a| (a.partition, a.owner_id.as_str())).collect()
    }

    fn create(meta: &MetaStore, name: &str, parent: &str, partitions: i64) -> Arc<Topic> {
        let req = CreateTopicRequest {
            name: name.into(),
            parent: parent.into(),
            partitions,
            ..Default::default()
        };
        meta.create_topic(req).unwrap()
    }

    #[test]
    fn the_ring_is_the_alive_members_heard_from_within_the_timeout_in_id_order() {
        let meta = store();
        let now = 1_700_000_000;
        for (id, age) in [("n2", 0), ("n10", 30), ("n1", 31), ("a", 5), ("gone", 0)] {
            let m = crate::Member {
                id: id.into(),
                addr: format!("{id}:7942"),
                cluster_addr: None,
                status: MemberStatus::Alive,
                last_heartbeat: now - age,
                draining: false,
            };
            meta.member_join(m).unwrap();
        }
        meta.member_dead("gone").unwrap();
        assert_eq!(alive_ring(&meta.snapshot(), now), ring(&["a", "n10", "n2"]));
        assert!(!heartbeat_overdue(now - 30, now) && heartbeat_overdue(now - 31, now));
        assert_eq!(alive_ring(&meta.snapshot(), now + 100), Vec::<String>::new());
    }

    #[test]
    fn draining_members_leave_the_ring_unless_every_live_member_drains() {
        let meta = store();
        let now = 1_700_000_000;
        for id in ["n1", "n2", "n3"] {
            let m = crate::Member {
                id: id.into(),
                addr: format!("{id}:7942"),
                cluster_addr: None,
                status: MemberStatus::Alive,
                last_heartbeat: now,
                draining: false,
            };
            meta.member_join(m).unwrap();
        }
        meta.set_member_draining("n2", true).unwrap();
        assert_eq!(alive_ring(&meta.snapshot(), now), ring(&["n1", "n3"]));
        meta.set_member_draining("n1", true).unwrap();
        meta.set_member_draining("n3", true).unwrap();
        assert_eq!(alive_ring(&meta.snapshot(), now), ring(&["n1", "n2", "n3"]));
        meta.set_member_draining("n2", false).unwrap();
        assert_eq!(alive_ring(&meta.snapshot(), now), ring(&["n2"]));
    }

    #[test]
    fn a_single_node_places_everything_on_itself() {
        let meta = store();
        let parent = create(&meta, "p", "", 3);
        let n1 = ring(&["n1"]);
        let a = place(&meta.snapshot(), &parent, 0..3, &n1);
        meta.assign_partitions("p", parent.incarnation(), a).unwrap();
        let child = create(&meta, "c", "p", 5);
        let placed = place(&meta.snapshot(), &child, 0..5, &n1);
        assert_eq!(owners(&placed), vec![(0, "n1"), (1, "n1"), (2, "n1"), (3, "n1"), (4, "n1")]);
    }

    #[test]
    fn replica_child_partitions_avoid_their_parent_partitions_owner() {
        let meta = store();
        let parent = create(&meta, "p", "", 4);
        let members = ring(&["n1", "n2", "n3"]);
        let a = place(&meta.snapshot(), &parent, 0..4, &members);
        assert_eq!(owners(&a), vec![(0, "n1"), (1, "n2"), (2, "n3"), (3, "n1")], "round robin");
        meta.assign_partitions("p", parent.incarnation(), a).unwrap();
        let child = create(&meta, "c", "p", 6);
        let placed = place(&meta.snapshot(), &child, 0..6, &members);
        assert_eq!(
            owners(&placed),
            vec![(0, "n2"), (1, "n3"), (2, "n1"), (3, "n2"), (4, "n2"), (5, "n3")],
            "indices past the parent's count go round robin"
        );
        let snap = meta.snapshot();
        for a in placed.iter().filter(|a| a.partition < 4) {
            let parent_owner = &snap.assignment("p", a.partition).unwrap().owner_id;
            assert_ne!(&a.owner_id, parent_owner, "partition {}", a.partition);
        }
    }

    #[test]
    fn a_child_partition_waits_for_its_parent_partition_to_be_placed() {
        let meta = store();
        let parent = create(&meta, "p", "", 3);
        let first =
            vec![PartitionAssignment { partition: 1, owner_id: "n2".into(), target_id: None }];
        meta.assign_partitions("p", parent.incarnation(), first).unwrap();
        let child = create(&meta, "c", "p", 3);
        let placed = place(&meta.snapshot(), &child, 0..3, &ring(&["n1", "n2"]));
        assert_eq!(owners(&placed), vec![(1, "n1")]);
        let alone = place(&meta.snapshot(), &child, 0..3, &ring(&["n1"]));
        assert_eq!(owners(&alone), vec![(0, "n1"), (1, "n1"), (2, "n1")], "one node: no waiting");
    }
}
