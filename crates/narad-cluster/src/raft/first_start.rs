//! Whether a node without Raft state may bootstrap the group (issue 35).
//!
//! A bootstrapping node (every peer with `initial_members` empty, or one of
//! the listed ones) that has no Raft state cannot tell from its own disk
//! whether it starts for the first time or its data directory was wiped.
//! The difference matters: a wiped voter that bootstraps again votes with
//! an empty log and can elect a node missing entries it had acknowledged
//! (the metastore simulation's seed 13: an acknowledged delete lost). So it
//! asks every other peer (ProbeGroup, op 39) and [`decide`]s from their
//! answers:
//!
//! 1. A peer whose state knows it as a member (its metastore holds the
//!    node's member record, written by the node's heartbeats; or, on the
//!    leader, the node acknowledged log entries) → [`FirstStart::Refuse`]:
//!    the directory was wiped; the node must come back under a new id.
//! 2. Else a leader answered → [`FirstStart::Bootstrap`]: a late starter
//!    of a group it is a voter of; its bootstrap entry (index 0) is the
//!    group's own. Unless the leader says its group does not have the node
//!    (`in_group` false: a member removed for good, back on an empty
//!    directory) → [`FirstStart::Join`]: it joins as a new member.
//! 3. Else a peer holds log entries past the bootstrap entry, or cannot
//!    say (it is opening its log, or runs a release without op 39) →
//!    [`FirstStart::Wait`]: the group has run, and only its leader can
//!    tell whether this node is new.
//! 4. Else, when the answering peers (none holding entries past the
//!    bootstrap entry) and this node form a majority of the voters →
//!    [`FirstStart::Bootstrap`]: the group is forming.
//! 5. Else → [`FirstStart::Wait`] (too few peers answered).
//!
//! Waiting is free: a group of several voters elects nobody without a
//! majority anyway. What remains unprotected is a double fault: a wiped
//! node, every peer holding the group's entries silent, and a majority of
//! peers that never received an entry answering; and a node wiped between
//! acknowledging its first entries and its first heartbeat's commit, whose
//! leader then changed (docs/CLUSTER.md).

use serde::{Deserialize, Serialize};

/// What one peer answers ProbeGroup (op 39) with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerView {
    /// The peer's last log index; `None`: it holds no Raft state (no
    /// entry, not even the bootstrap entry at index 0).
    pub log_end: Option<u64>,
    /// The peer leads the group.
    pub leader: bool,
    /// The peer's state knows the asker as a member (see the module docs).
    pub knows_member: bool,
    /// A leader's answer: whether its Raft membership has the asker (as a
    /// voter or a learner). Absent from other peers and older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_group: Option<bool>,
}

/// One peer's answer to ProbeGroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerAnswer {
    /// No answer (down, unreachable, timed out, still starting).
    Silent,
    /// It answered but cannot say (a release without op 39, a log still
    /// being opened).
    Unknown,
    /// Its view.
    View(PeerView),
}

/// What a node without Raft state does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstStart {
    /// Initialise the group with the configured voters.
    Bootstrap,
    /// Join the running group as a new member (JoinCluster): its leader
    /// neither knows this node nor counts it in the group (it was removed
    /// for good, `narad cluster remove`, and comes back on an empty
    /// directory), so bootstrapping would make a group of one's own.
    Join,
    /// Ask again later; the reason, for the log.
    Wait(String),
    /// Do not start: the group knows this node as a member, so its data
    /// directory was wiped. The peer that said so.
    Refuse {
        /// The peer whose state knows this node.
        by: String,
    },
}

/// One other peer's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    /// Its id.
    pub id: String,
    /// It is one of the voters the group bootstraps with (only those count
    /// towards the majority of rule 4; any peer's log or knowledge counts).
    pub voter: bool,
    /// What it answered.
    pub answer: PeerAnswer,
}

/// [`FirstStart`] from every other peer's answer; `voters`: how many
/// voters the group bootstraps with, this node included (see the module
/// docs for the rules).
pub fn decide(voters: usize, answers: &[Probed]) -> FirstStart {
    let views = || {
        answers.iter().filter_map(|p| match &p.answer {
            PeerAnswer::View(v) => Some((&p.id, v)),
            _ => None,
        })
    };
    if let Some((id, _)) = views().find(|(_, v)| v.knows_member) {
        return FirstStart::Refuse { by: id.clone() };
    }
    if let Some((_, v)) = views().find(|(_, v)| v.leader) {
        return if v.in_group == Some(false) { FirstStart::Join } else { FirstStart::Bootstrap };
    }
    if let Some((id, v)) = views().find(|(_, v)| v.log_end.is_some_and(|end| end > 0)) {
        return FirstStart::Wait(format!(
            "peer {id} holds the group's log (to index {}) and no leader answered: only the \
             leader can tell whether this node is new",
            v.log_end.unwrap_or(0)
        ));
    }
    if let Some(p) = answers.iter().find(|p| p.answer == PeerAnswer::Unknown) {
        return FirstStart::Wait(format!("peer {} cannot say yet whether the group has run", p.id));
    }
    let fresh =
        answers.iter().filter(|p| p.voter && matches!(p.answer, PeerAnswer::View(_))).count();
    if (fresh + 1) * 2 > voters {
        return FirstStart::Bootstrap;
    }
    FirstStart::Wait(format!(
        "{fresh} of {} other voters answered; a majority of {voters} is needed to form the group",
        voters.saturating_sub(1)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(log_end: Option<u64>, leader: bool, knows_member: bool) -> PeerAnswer {
        PeerAnswer::View(PeerView { log_end, leader, knows_member, in_group: None })
    }

    #[test]
    fn a_leader_that_neither_knows_the_node_nor_counts_it_in_the_group_makes_it_join() {
        let led = |in_group| {
            PeerAnswer::View(PeerView {
                log_end: Some(9),
                leader: true,
                knows_member: false,
                in_group,
            })
        };
        let a = answers(&[led(Some(false)), view(Some(9), false, false)]);
        assert_eq!(decide(3, &a), FirstStart::Join);
        // Counted in the group (a late starter), or an older leader that
        // does not say: bootstrap as before.
        assert_eq!(decide(3, &answers(&[led(Some(true))])), FirstStart::Bootstrap);
        assert_eq!(decide(3, &answers(&[led(None)])), FirstStart::Bootstrap);
        // Any peer that knows it still refuses it (a wiped member).
        let a = answers(&[led(Some(false)), view(Some(9), false, true)]);
        assert!(matches!(decide(3, &a), FirstStart::Refuse { .. }));
    }

    fn answers(list: &[PeerAnswer]) -> Vec<Probed> {
        list.iter()
            .enumerate()
            .map(|(i, a)| Probed { id: format!("n{}", i + 2), voter: true, answer: *a })
            .collect()
    }

    #[test]
    fn any_peer_that_knows_the_node_refuses_it_leader_or_not() {
        let a = answers(&[view(Some(40), false, true), PeerAnswer::Silent]);
        assert_eq!(decide(3, &a), FirstStart::Refuse { by: "n2".into() });
        let a = answers(&[view(Some(40), true, false), view(Some(40), false, true)]);
        assert_eq!(decide(3, &a), FirstStart::Refuse { by: "n3".into() });
    }

    #[test]
    fn a_leader_that_does_not_know_the_node_lets_a_late_starter_bootstrap() {
        let a = answers(&[view(Some(90), true, false), PeerAnswer::Silent]);
        assert_eq!(decide(3, &a), FirstStart::Bootstrap);
    }

    #[test]
    fn a_peer_holding_the_groups_log_without_a_leader_answering_makes_it_wait() {
        // Seed 13 of the metastore simulation: the wiped node was the
        // leader; the others hold the log and have not elected yet.
        let a = answers(&[view(Some(13), false, false), view(Some(14), false, false)]);
        assert!(matches!(decide(3, &a), FirstStart::Wait(_)));
        // One peer that never got an entry does not outvote one that did.
        let a = answers(&[view(Some(0), false, false), view(Some(14), false, false)]);
        assert!(matches!(decide(3, &a), FirstStart::Wait(_)));
    }

    #[test]
    fn no_answer_or_an_unknown_answer_makes_it_wait() {
        assert!(matches!(
            decide(3, &answers(&[PeerAnswer::Silent, PeerAnswer::Silent])),
            FirstStart::Wait(_)
        ));
        let a = answers(&[PeerAnswer::Unknown, view(None, false, false)]);
        assert!(matches!(decide(3, &a), FirstStart::Wait(_)));
    }

    #[test]
    fn fresh_peers_making_a_majority_form_the_group_even_with_one_down() {
        let a = answers(&[view(None, false, false), PeerAnswer::Silent]);
        assert_eq!(decide(3, &a), FirstStart::Bootstrap);
        // A peer that bootstrapped and never heard from a leader is fresh.
        let a = answers(&[view(Some(0), false, false), view(None, false, false)]);
        assert_eq!(decide(3, &a), FirstStart::Bootstrap);
        // Five voters: this node and one fresh peer are not a majority.
        let a = answers(&[
            view(None, false, false),
            PeerAnswer::Silent,
            PeerAnswer::Silent,
            PeerAnswer::Silent,
        ]);
        assert!(matches!(decide(5, &a), FirstStart::Wait(_)));
        let a = answers(&[
            view(None, false, false),
            view(Some(0), false, false),
            PeerAnswer::Silent,
            PeerAnswer::Silent,
        ]);
        assert_eq!(decide(5, &a), FirstStart::Bootstrap);
    }

    #[test]
    fn only_voters_count_towards_the_majority_but_any_peers_log_counts() {
        let mut a = answers(&[view(None, false, false), PeerAnswer::Silent]);
        a[0].voter = false;
        assert!(matches!(decide(3, &a), FirstStart::Wait(_)));
        let mut a = answers(&[view(None, false, false), view(Some(7), false, false)]);
        a[1].voter = false;
        assert!(matches!(decide(3, &a), FirstStart::Wait(_)));
    }
}
