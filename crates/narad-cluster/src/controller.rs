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
//! 3. rebalance (SPEC §7.3): `AbortMove` for every move whose target is no
//!    longer a receiver (dead, overdue or draining: nobody will finish it),
//!    then one `SetAssignmentTarget` per move narad-meta's
//!    [`rebalance::plan`] asks for over the receivers (alive, not overdue,
//!    not draining) and the draining members still alive: at most
//!    [`MAX_MOVES_IN_FLIGHT`] in flight, minimal, anti-affinity a
//!    preference. The targets copy the partitions and flip their owners
//!    themselves; the next ticks plan on what is left.
//!
//! What it never does: reassign the partitions of a dead owner (they stay:
//! `narad cluster remove --force` is the way out), or place anything while
//! no member is alive. New partitions avoid draining members unless every
//! live member drains. A dead member that heartbeats again is alive
//! (its MemberJoin upserts the record) and joins the ring at the next tick.

use std::collections::BTreeSet;

use narad_meta::limits::MAX_MOVES_IN_FLIGHT;
use narad_meta::placement::{self, heartbeat_overdue};
use narad_meta::rebalance;
use narad_meta::{
    AbortMove, AssignPartitions, Command, Member, MemberDead, MemberStatus, MetaState,
    PartitionAssignment, SetAssignmentTarget, Topic,
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
    // The same rule as the marking above: alive and not overdue; new
    // partitions avoid draining members while another member is live.
    let live: Vec<&Member> = state
        .members()
        .filter(|m| m.status == MemberStatus::Alive && !overdue(m))
        .map(|m| &**m)
        .collect();
    let receivers: Vec<String> =
        live.iter().filter(|m| !m.draining).map(|m| m.id.clone()).collect();
    let draining: BTreeSet<String> =
        live.iter().filter(|m| m.draining).map(|m| m.id.clone()).collect();
    let ring: Vec<String> = if receivers.is_empty() {
        live.iter().map(|m| m.id.clone()).collect()
    } else {
        receivers.clone()
    };
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
    rebalance_moves(state, &receivers.into_iter().collect(), &draining, &mut commands);
    commands
}

/// Step 3 of the module docs, on `state` (this tick's placements are not
/// in it: they are planned from the next tick's state).
fn rebalance_moves(
    state: &MetaState,
    receivers: &BTreeSet<String>,
    draining: &BTreeSet<String>,
    commands: &mut Vec<Command>,
) {
    let mut views = rebalance::partition_views(state);
    for v in views.iter_mut() {
        let Some(target) = v.target.clone() else { continue };
        if receivers.contains(&target) {
            continue;
        }
        let Some(t) = state.topic(&v.topic) else { continue };
        commands.push(Command::AbortMove(AbortMove {
            topic: v.topic.clone(),
            incarnation: t.incarnation(),
            partition: v.partition,
            expected_target: target,
            attempt: state.assignment(&v.topic, v.partition).and_then(|a| a.move_attempt),
        }));
        v.target = None;
    }
    if receivers.is_empty() {
        return;
    }
    for m in rebalance::plan(&views, receivers, draining, MAX_MOVES_IN_FLIGHT) {
        let Some(t) = state.topic(&m.topic) else { continue };
        commands.push(Command::SetAssignmentTarget(SetAssignmentTarget {
            topic: m.topic,
            incarnation: t.incarnation(),
            partition: m.partition,
            expected_owner: m.from,
            target_id: m.to,
        }));
    }
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
