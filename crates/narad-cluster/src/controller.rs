//! The cluster controller: what the leader proposes on each tick (SPEC §7.2).
//!
//! [`plan`] is a pure, deterministic function of the metastore state and the
//! leader's wall clock. [`crate::members::Membership`] runs it every
//! [`crate::limits::CONTROLLER_INTERVAL`] on the leader and proposes what it
//! returns, in order:
//!
//! 1. `MemberDead` for every alive member whose last heartbeat is overdue
//!    (more than [`MEMBER_DEAD_AFTER`] old by the leader's clock), in id
//!    order;
//! 2. one `AssignPartitions` per topic that has unassigned partitions, placed
//!    by narad-broker's [`placement::place`] over the ring of the members
//!    still alive after step 1, sorted by id: round robin `ring[p % n]`, a
//!    fan-out child's partition anti-affine to its parent partition's owner.
//!    Standalone topics and parents come first (name order), then children
//!    (name order), placed against their parents' owners as they will be
//!    once this tick's commands apply, so one tick places every partition
//!    and the next tick, on the resulting state, plans nothing.
//!
//! What it never does: move an assigned partition (sticky), reassign the
//! partitions of a dead owner (that is rebalance's job), or place anything
//! while no member is alive. A dead member that heartbeats again is alive
//! (its MemberJoin upserts the record) and joins the ring at the next tick.

use narad_broker::placement::{self, heartbeat_overdue};
use narad_meta::{
    AssignPartitions, Command, MemberDead, MemberStatus, MetaState, PartitionAssignment, Topic,
};

#[cfg(doc)]
use crate::limits::MEMBER_DEAD_AFTER;

/// The commands one controller tick proposes on `state` at `now_s` (the
/// leader's wall clock, Unix seconds), in the order of the module docs.
/// Empty when there is nothing to do.
pub fn plan(state: &MetaState, now_s: i64) -> Vec<Command> {
    let mut commands: Vec<Command> = state
        .members()
        .filter(|m| m.status == MemberStatus::Alive && heartbeat_overdue(m.last_heartbeat, now_s))
        .map(|m| {
            Command::MemberDead(MemberDead {
                id: m.id.clone(),
                last_heartbeat: Some(m.last_heartbeat),
            })
        })
        .collect();
    // The same rule as the marking above: alive and not overdue.
    let ring = placement::alive_ring(state, now_s);
    if ring.is_empty() {
        return commands;
    }
    // Parents first, so that their children are placed against the owners
    // this tick gives them: a scratch copy of the state takes the parents'
    // new assignments (only when a parent got some).
    let mut scratch: Option<MetaState> = None;
    for topic in state.topics().filter(|t| t.parent().is_none()) {
        let Some(assign) = unplaced(state, topic, &ring) else { continue };
        let command = Command::AssignPartitions(assign);
        if !topic.children().is_empty() {
            let current = scratch.take().unwrap_or_else(|| state.clone());
            // Built from the state it applies to: cannot be refused. Were it
            // refused, the children would only wait for the next tick.
            let next = narad_meta::apply(&current, current.applied_index() + 1, &command);
            scratch = Some(next.map_or(current, |applied| applied.state));
        }
        commands.push(command);
    }
    let placed = scratch.as_ref().unwrap_or(state);
    for child in state.topics().filter(|t| t.parent().is_some()) {
        if let Some(assign) = unplaced(placed, child, &ring) {
            commands.push(Command::AssignPartitions(assign));
        }
    }
    commands
}

/// The owners of `topic`'s unassigned partitions that can be placed now,
/// as one command for its current incarnation; `None` when there are none.
fn unplaced(state: &MetaState, topic: &Topic, ring: &[String]) -> Option<AssignPartitions> {
    let assigned = state.assignments(topic.name());
    let assignments: Vec<PartitionAssignment> = (0..topic.partitions())
        .filter(|p| assigned.is_none_or(|a| !a.contains_key(p)))
        .flat_map(|p| placement::place(state, topic, p..p + 1, ring))
        .collect();
    (!assignments.is_empty()).then(|| AssignPartitions {
        topic: topic.name().to_owned(),
        incarnation: topic.incarnation(),
        assignments,
        unassigned_only: true,
    })
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
