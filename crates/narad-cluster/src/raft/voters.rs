//! Which nodes vote (SPEC §7.3 "Decommission"): a drained member leaves
//! the Raft voters unless fewer than [`MIN_VOTERS_AFTER_DRAIN`] would
//! remain, the leader handing leadership over first when it is the one
//! drained; an undrained member (or any live learner, while the group has
//! fewer voters than that) becomes a voter again.
//!
//! [`voter_step`] is a pure function of the metastore state and the Raft
//! membership; the leader's control plane applies one step per
//! [`crate::limits::CONTROLLER_INTERVAL`] (`ControlPlane::steward_voters`).
//! A member is *drained* when it is marked draining, owns no partition and
//! no move targets it: it serves nothing, so its vote only makes the
//! quorum larger. It stays a learner: its replica keeps up, so it still
//! answers HTTP (it accepts and forwards produces) until it is stopped.

use narad_meta::{MemberStatus, MetaState};

use super::types::NodeId;

/// A drained member is demoted only while at least this many voters stay.
pub const MIN_VOTERS_AFTER_DRAIN: usize = 3;

/// One change of who votes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VoterStep {
    /// The leader itself is drained: hand leadership to another voter
    /// first (the next leader demotes it).
    HandOver,
    /// Make this voter a learner.
    Demote(NodeId, String),
    /// Make this learner a voter.
    Promote(NodeId, String),
}

/// Whether member `id` is drained in `state`: draining, owning no
/// partition and the target of no move.
pub fn drained(state: &MetaState, id: &str) -> bool {
    let Some(m) = state.member(id) else { return false };
    if !m.draining {
        return false;
    }
    !state.topics().any(|t| {
        state.assignments(t.name()).is_some_and(|a| {
            a.values().any(|a| a.owner_id == id || a.target_id.as_deref() == Some(id))
        })
    })
}

/// The next change of who votes, if any: `voters` and `learners` are the
/// Raft membership's (raft id, node id), `me` the leader's raft id.
/// Demotions first (id order), then promotions (id order).
pub fn voter_step(
    state: &MetaState,
    voters: &[(NodeId, String)],
    learners: &[(NodeId, String)],
    me: NodeId,
) -> Option<VoterStep> {
    if voters.len() > MIN_VOTERS_AFTER_DRAIN {
        let mut drained_voters: Vec<&(NodeId, String)> =
            voters.iter().filter(|(_, id)| drained(state, id)).collect();
        drained_voters.sort_by(|a, b| a.1.cmp(&b.1));
        if let Some((raft, id)) = drained_voters.first() {
            return Some(if *raft == me {
                VoterStep::HandOver
            } else {
                VoterStep::Demote(*raft, id.clone())
            });
        }
    }
    let short = voters.len() < MIN_VOTERS_AFTER_DRAIN;
    let mut promote: Vec<&(NodeId, String)> = learners
        .iter()
        .filter(|(_, id)| {
            state.member(id).is_some_and(|m| {
                m.status == MemberStatus::Alive && (!m.draining || short || !drained(state, id))
            })
        })
        .collect();
    promote.sort_by(|a, b| a.1.cmp(&b.1));
    promote.first().map(|(raft, id)| VoterStep::Promote(*raft, id.clone()))
}

#[cfg(test)]
mod tests {
    use narad_meta::{
        AssignPartitions, Command, CreateTopic, Member, MemberJoin, PartitionAssignment,
        SetMemberDraining, apply,
    };

    use super::super::types::raft_id;
    use super::*;

    fn run(commands: &[Command]) -> MetaState {
        let mut s = MetaState::default();
        for c in commands {
            s = apply(&s, s.applied_index() + 1, c).expect("applies").state;
        }
        s
    }

    fn join(id: &str) -> Command {
        Command::MemberJoin(MemberJoin {
            member: Member {
                id: id.to_owned(),
                addr: format!("{id}.local:7942"),
                cluster_addr: None,
                status: MemberStatus::Alive,
                last_heartbeat: 1_700_000_000,
                draining: false,
            },
        })
    }

    fn drain(id: &str) -> Command {
        Command::SetMemberDraining(SetMemberDraining { id: id.into(), draining: true })
    }

    fn ids(v: &[&str]) -> Vec<(NodeId, String)> {
        v.iter().map(|id| (raft_id(id), (*id).to_owned())).collect()
    }

    fn with_partition_on(mut commands: Vec<Command>, owner: &str) -> MetaState {
        commands.push(Command::CreateTopic(CreateTopic {
            name: "t".into(),
            partitions: 3,
            retention_ms: 0,
            visibility_timeout_ms: 30_000,
            max_in_flight_per_partition: 1024,
            max_acked_ahead_per_partition: 1024,
            created_at: 1_700_000_000,
            owner: String::new(),
            schema: None,
            parent: None,
        }));
        let s = run(&commands);
        let incarnation = s.topic("t").unwrap().incarnation();
        commands.push(Command::AssignPartitions(AssignPartitions {
            topic: "t".into(),
            incarnation,
            assignments: vec![PartitionAssignment {
                partition: 0,
                owner_id: owner.into(),
                target_id: None,
            }],
            unassigned_only: false,
        }));
        run(&commands)
    }

    #[test]
    fn a_drained_voter_is_demoted_only_while_three_voters_stay() {
        let s = run(&[join("n1"), join("n2"), join("n3"), join("n4"), drain("n4")]);
        let me = raft_id("n1");
        assert!(drained(&s, "n4"));
        assert_eq!(
            voter_step(&s, &ids(&["n1", "n2", "n3", "n4"]), &[], me),
            Some(VoterStep::Demote(raft_id("n4"), "n4".into()))
        );
        assert_eq!(voter_step(&s, &ids(&["n1", "n2", "n4"]), &[], me), None, "3 voters stay");
        // Demoted, it stays a learner while it drains.
        assert_eq!(voter_step(&s, &ids(&["n1", "n2", "n3"]), &ids(&["n4"]), me), None);
    }

    #[test]
    fn a_drained_leader_hands_leadership_over_before_it_is_demoted() {
        let s = run(&[join("n1"), join("n2"), join("n3"), join("n4"), drain("n4")]);
        assert_eq!(
            voter_step(&s, &ids(&["n1", "n2", "n3", "n4"]), &[], raft_id("n4")),
            Some(VoterStep::HandOver)
        );
    }

    #[test]
    fn a_draining_member_that_still_owns_a_partition_keeps_its_vote() {
        let s = with_partition_on(
            vec![join("n1"), join("n2"), join("n3"), join("n4"), drain("n4")],
            "n4",
        );
        assert!(!drained(&s, "n4"));
        assert_eq!(voter_step(&s, &ids(&["n1", "n2", "n3", "n4"]), &[], raft_id("n1")), None);
    }

    #[test]
    fn an_undrained_learner_votes_again_and_a_short_group_takes_any_live_learner() {
        let s = run(&[join("n1"), join("n2"), join("n3"), join("n4")]);
        let me = raft_id("n1");
        assert_eq!(
            voter_step(&s, &ids(&["n1", "n2", "n3"]), &ids(&["n4"]), me),
            Some(VoterStep::Promote(raft_id("n4"), "n4".into()))
        );
        let s = run(&[join("n1"), join("n2"), join("n3"), drain("n3")]);
        assert_eq!(
            voter_step(&s, &ids(&["n1", "n2"]), &ids(&["n3"]), me),
            Some(VoterStep::Promote(raft_id("n3"), "n3".into())),
            "fewer than 3 voters: a drained learner votes again"
        );
    }
}
