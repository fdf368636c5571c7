//! The cluster controller: what the leader proposes on each tick (SPEC §7.2).
//!
//! [`plan_with`] is a pure, deterministic function of the metastore state and
//! which members are overdue; [`crate::members::Membership`] decides that
//! from the leader's own monotonic record of when each member's heartbeat
//! last changed ([`crate::heartbeat_ages`]: no member's clock is compared
//! with the leader's), and runs it every
//! [`crate::limits::CONTROLLER_INTERVAL`] on the leader and proposes what it
//! returns, in order:
//!
//! 1. `MemberDead` for every alive member whose last heartbeat is overdue
//!    (silent for more than [`MEMBER_DEAD_AFTER`] by the leader's monotonic
//!    clock), in id order;
//! 2. one `AssignPartitions` per topic that has unassigned partitions, placed
//!    by narad-meta's [`placement::place`] over the ring of the members
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

use narad_meta::placement::{self, heartbeat_overdue};
use narad_meta::{
    AssignPartitions, Command, Member, MemberDead, MemberStatus, MetaState, PartitionAssignment,
    Topic,
};

#[cfg(doc)]
use crate::limits::MEMBER_DEAD_AFTER;

/// [`plan_with`] where every heartbeat was stamped by the clock that reads
/// `now_s` (Unix seconds): overdue = older than [`MEMBER_DEAD_AFTER`] by
/// it. For states whose stamps share one clock (tests); the running
/// controller uses [`plan_with`] with the leader's own ages.
pub fn plan(state: &MetaState, now_s: i64) -> Vec<Command> {
    plan_with(state, &|m: &Member| heartbeat_overdue(m.last_heartbeat, now_s))
}

/// The commands one controller tick proposes on `state`, `overdue` saying
/// which members have been silent too long, in the order of the module
/// docs. Empty when there is nothing to do.
pub fn plan_with(state: &MetaState, overdue: &dyn Fn(&Member) -> bool) -> Vec<Command> {
    let mut commands: Vec<Command> = state
        .members()
        .filter(|m| m.status == MemberStatus::Alive && overdue(m))
        .map(|m| {
            Command::MemberDead(MemberDead {
                id: m.id.clone(),
                last_heartbeat: Some(m.last_heartbeat),
            })
        })
        .collect();
    // The same rule as the marking above: alive and not overdue.
    let ring: Vec<String> = state
        .members()
        .filter(|m| m.status == MemberStatus::Alive && !overdue(m))
        .map(|m| m.id.clone())
        .collect();
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
