//! The controller's assignment rules, checked on random states: a seeded
//! property test (set `NARAD_PLAN_SEED` to replay one seed) and a few
//! worked examples.

use std::collections::{BTreeMap, BTreeSet};

use narad_fs::SimRng;
use narad_meta::{
    AssignPartitions, Command, CreateTopic, Member, MemberDead, MemberJoin, MemberStatus,
    MetaState, ParentLink, PartitionAssignment, apply,
};

use super::plan;

const NOW: i64 = 1_700_000_000;
const SEEDS: u64 = 400;

fn run(state: &MetaState, command: Command) -> MetaState {
    let index = state.applied_index() + 1;
    match apply(state, index, &command) {
        Ok(applied) => applied.state,
        Err(e) => panic!("building the state: {command:?} refused: {e}"),
    }
}

fn member(id: &str, last_heartbeat: i64) -> Command {
    Command::MemberJoin(MemberJoin {
        member: Member {
            id: id.to_owned(),
            addr: format!("{id}.local:7942"),
            cluster_addr: None,
            status: MemberStatus::Alive,
            last_heartbeat,
            draining: false,
        },
    })
}

fn topic(name: &str, partitions: u32, parent: Option<(&str, u64)>) -> Command {
    Command::CreateTopic(CreateTopic {
        name: name.to_owned(),
        partitions,
        retention_ms: 0,
        visibility_timeout_ms: 30_000,
        max_in_flight_per_partition: 1024,
        max_acked_ahead_per_partition: 1024,
        created_at: NOW - 100,
        owner: String::new(),
        schema: None,
        parent: parent.map(|(name, epoch)| ParentLink {
            name: name.to_owned(),
            attach_epoch: format!("{epoch:016x}"),
            fanout_delay_ms: 0,
            attached_at_ms: 0,
        }),
    })
}

fn assign(state: &MetaState, name: &str, owners: &[(u32, &str)]) -> Command {
    Command::AssignPartitions(AssignPartitions {
        topic: name.to_owned(),
        incarnation: state.topic(name).unwrap().incarnation(),
        assignments: owners
            .iter()
            .map(|(p, o)| PartitionAssignment {
                partition: *p,
                owner_id: (*o).to_owned(),
                target_id: None,
            })
            .collect(),
        unassigned_only: false,
    })
}

/// A random state: members alive and dead with heartbeat ages around the
/// dead timeout, standalone topics, parents with children, some partitions
/// already assigned (to live, dead and unknown members).
fn random_state(rng: &mut SimRng) -> MetaState {
    let mut s = MetaState::default();
    // Ids whose byte order differs from their "numeric" order.
    let pool = ["n1", "n10", "n2", "a", "zz", "n3"];
    for id in pool {
        if !rng.chance(2, 3) {
            continue;
        }
        let age = match rng.below(4) {
            0 => rng.range(0, 29) as i64,
            1 => 30,
            2 => 31,
            _ => rng.range(32, 500) as i64,
        };
        s = run(&s, member(id, NOW - age));
        if rng.chance(1, 4) {
            s = run(
                &s,
                Command::MemberDead(MemberDead { id: id.to_owned(), last_heartbeat: None }),
            );
        }
    }
    let mut roots = Vec::new();
    for i in 0..rng.range(0, 5) {
        let name = format!("t{i}");
        s = run(&s, topic(&name, rng.range(3, 8) as u32, None));
        roots.push(name);
    }
    if !roots.is_empty() {
        for j in 0..rng.range(0, 4) {
            let parent = &roots[rng.below(roots.len() as u64) as usize];
            // Children sort before and after their parents ("c" < "t" < "x").
            let name = if rng.chance(1, 2) { format!("c{j}") } else { format!("x{j}") };
            s = run(&s, topic(&name, rng.range(3, 10) as u32, Some((parent, j + 1))));
        }
    }
    let owners: Vec<String> =
        s.members().map(|m| m.id.clone()).chain(["gone".to_owned()]).collect();
    let names: Vec<String> = s.topics().map(|t| t.name().to_owned()).collect();
    for name in names {
        if rng.chance(1, 3) {
            continue; // fresh: nothing assigned
        }
        let t = s.topic(&name).unwrap().clone();
        let picked: Vec<(u32, &str)> = (0..t.partitions())
            .filter_map(|p| {
                let owner = &owners[rng.below(owners.len() as u64) as usize];
                rng.chance(1, 2).then_some((p, owner.as_str()))
            })
            .collect();
        if !picked.is_empty() {
            s = run(&s, assign(&s, &name, &picked));
        }
    }
    s.check_invariants().unwrap();
    s
}

/// Checks every rule of the controller on one state; the error names the
/// first broken rule.
fn check(state: &MetaState) -> Result<(), String> {
    let commands = plan(state, NOW);
    if plan(state, NOW) != commands {
        return Err("plan is not deterministic".into());
    }
    // Dead-marking: exactly the alive members silent for more than 30 s.
    let overdue: Vec<String> = state
        .members()
        .filter(|m| m.status == MemberStatus::Alive && NOW - m.last_heartbeat > 30)
        .map(|m| m.id.clone())
        .collect();
    let marked: Vec<String> = commands
        .iter()
        .filter_map(|c| match c {
            Command::MemberDead(d) => Some(d.id.clone()),
            _ => None,
        })
        .collect();
    if marked != overdue {
        return Err(format!("marked dead {marked:?}, expected {overdue:?}"));
    }
    if commands.iter().take(marked.len()).any(|c| !matches!(c, Command::MemberDead(_))) {
        return Err("dead-marking does not come first".into());
    }
    // The ring: alive after this tick's marking, sorted by id.
    let mut ring: Vec<String> = state
        .members()
        .filter(|m| m.status == MemberStatus::Alive && NOW - m.last_heartbeat <= 30)
        .map(|m| m.id.clone())
        .collect();
    ring.sort();
    let mut seen = BTreeSet::new();
    let receivers: BTreeSet<&String> =
        ring.iter().filter(|id| state.member(id).is_some_and(|m| !m.draining)).collect();
    let moves_from = commands[marked.len()..]
        .iter()
        .position(|c| matches!(c, Command::SetAssignmentTarget(_) | Command::AbortMove(_)))
        .map_or(commands.len(), |i| i + marked.len());
    for c in &commands[moves_from..] {
        match c {
            Command::SetAssignmentTarget(m) => {
                let a = state.assignment(&m.topic, m.partition);
                if a.is_none_or(|a| a.owner_id != m.expected_owner || a.target_id.is_some()) {
                    return Err(format!("{m:?} planned on {a:?}"));
                }
                if !receivers.contains(&m.target_id) {
                    return Err(format!("{m:?} targets a member that is not a receiver"));
                }
            }
            Command::AbortMove(m) => {
                let a = state.assignment(&m.topic, m.partition);
                if a.is_none_or(|a| a.target_id.as_deref() != Some(m.expected_target.as_str())) {
                    return Err(format!("{m:?} aborts what {a:?} is not"));
                }
            }
            other => return Err(format!("{other:?} after the rebalance commands")),
        }
    }
    for c in &commands[marked.len()..moves_from] {
        let Command::AssignPartitions(a) = c else {
            return Err(format!("unexpected command after the dead-marking: {c:?}"));
        };
        if !seen.insert(a.topic.clone()) {
            return Err(format!("two AssignPartitions for {:?}", a.topic));
        }
        let t = state.topic(&a.topic).ok_or(format!("assigns missing topic {:?}", a.topic))?;
        if a.incarnation != t.incarnation() || a.assignments.is_empty() || !a.unassigned_only {
            return Err(format!("bad AssignPartitions {a:?}"));
        }
        for pa in &a.assignments {
            if state.assignment(&a.topic, pa.partition).is_some() {
                return Err(format!("{}/{} was assigned and is reassigned", a.topic, pa.partition));
            }
            if !ring.contains(&pa.owner_id) || pa.target_id.is_some() {
                return Err(format!(
                    "{}/{} placed on {pa:?}, ring {ring:?}",
                    a.topic, pa.partition
                ));
            }
        }
    }
    // Apply the plan: every command is accepted.
    let mut after = state.clone();
    for c in &commands {
        let index = after.applied_index() + 1;
        after = apply(&after, index, c).map_err(|e| format!("{c:?} refused: {e}"))?.state;
    }
    after.check_invariants()?;
    for t in state.topics() {
        for p in 0..t.partitions() {
            let old = state.assignment(t.name(), p);
            let new = after.assignment(t.name(), p);
            // Sticky: an owner (alive, dead or unknown) never changes (a
            // move only sets a target; its target flips the owner).
            if old.is_some() && old.map(|a| &a.owner_id) != new.map(|a| &a.owner_id) {
                return Err(format!("{}/{p} moved from {old:?} to {new:?}", t.name()));
            }
            let Some(new) = new else {
                if !ring.is_empty() {
                    return Err(format!("{}/{p} left unassigned with ring {ring:?}", t.name()));
                }
                continue;
            };
            if old.is_some() {
                continue;
            }
            let parent = t.parent().map(|l| after.topic(&l.name).unwrap());
            match parent.filter(|parent| p < parent.partitions()) {
                // Anti-affinity, where the ring has another member.
                Some(parent) => {
                    let parent_owner = &after.assignment(parent.name(), p).unwrap().owner_id;
                    let elsewhere = ring.iter().any(|m| m != parent_owner);
                    if elsewhere && &new.owner_id == parent_owner {
                        return Err(format!(
                            "{}/{p} colocated with its parent's owner {parent_owner} (ring {ring:?})",
                            t.name()
                        ));
                    }
                }
                // Round robin over the sorted ring (fresh topics, partitions
                // added later, child partitions past the parent's count).
                None => {
                    let want = &ring[p as usize % ring.len()];
                    if &new.owner_id != want {
                        return Err(format!("{}/{p} on {}, want {want}", t.name(), new.owner_id));
                    }
                }
            }
        }
    }
    // Converges: later ticks (moves never finishing here) only start
    // moves, within the cap, and soon plan nothing.
    for _ in 0..20 {
        let again = plan(&after, NOW);
        if again.is_empty() {
            return Ok(());
        }
        for c in &again {
            if !matches!(c, Command::SetAssignmentTarget(_)) {
                return Err(format!("re-planning the applied plan gives {c:?}"));
            }
            let index = after.applied_index() + 1;
            after = apply(&after, index, c).map_err(|e| format!("{c:?} refused: {e}"))?.state;
        }
        let in_flight = narad_meta::rebalance::partition_views(&after)
            .iter()
            .filter(|v| v.target.is_some())
            .count();
        if in_flight > narad_meta::limits::MAX_MOVES_IN_FLIGHT {
            return Err(format!("{in_flight} moves in flight"));
        }
    }
    Err("the plan never settles".into())
}

#[test]
fn plan_marks_the_overdue_dead_and_places_only_unassigned_partitions_stickily() {
    let seeds: Vec<u64> = match std::env::var("NARAD_PLAN_SEED") {
        Ok(s) => vec![s.parse().expect("NARAD_PLAN_SEED is a u64")],
        Err(_) => (0..SEEDS).collect(),
    };
    let mut kinds = BTreeMap::<&str, usize>::new();
    for seed in seeds {
        let state = random_state(&mut SimRng::new(seed));
        if let Err(why) = check(&state) {
            panic!("seed {seed} (replay: NARAD_PLAN_SEED={seed}): {why}\nstate: {state:#?}");
        }
        let commands = plan(&state, NOW);
        if commands.iter().any(|c| matches!(c, Command::MemberDead(_))) {
            *kinds.entry("marks dead").or_default() += 1;
        }
        if commands.iter().any(|c| matches!(c, Command::AssignPartitions(_))) {
            *kinds.entry("assigns").or_default() += 1;
        }
        if state.topics().any(|t| t.parent().is_some()) {
            *kinds.entry("children").or_default() += 1;
        }
    }
    // The generator reaches every case it is meant to (skipped on replay).
    if std::env::var("NARAD_PLAN_SEED").is_err() {
        for kind in ["marks dead", "assigns", "children"] {
            assert!(kinds.get(kind).copied().unwrap_or(0) > SEEDS as usize / 10, "{kinds:?}");
        }
    }
}

fn owners(state: &MetaState, name: &str) -> Vec<(u32, String)> {
    let Some(a) = state.assignments(name) else { return Vec::new() };
    a.iter().map(|(p, a)| (*p, a.owner_id.clone())).collect()
}

fn applied(state: &MetaState, commands: &[Command]) -> MetaState {
    commands.iter().fold(state.clone(), |s, c| run(&s, c.clone()))
}

#[test]
fn a_member_is_marked_dead_only_when_silent_for_more_than_30_seconds() {
    let mut s = MetaState::default();
    s = run(&s, member("n1", NOW));
    s = run(&s, member("n2", NOW - 30));
    s = run(&s, member("n3", NOW - 31));
    assert_eq!(
        plan(&s, NOW),
        vec![Command::MemberDead(MemberDead { id: "n3".into(), last_heartbeat: Some(NOW - 31) })]
    );
    let s = applied(&s, &plan(&s, NOW));
    assert_eq!(plan(&s, NOW), Vec::new(), "a dead member is not marked again");
    // A marking planned before a heartbeat that then committed is refused
    // and leaves the member alive.
    let mut racing = MetaState::default();
    racing = run(&racing, member("n3", NOW - 31));
    let stale = plan(&racing, NOW);
    racing = run(&racing, member("n3", NOW));
    let refused = narad_meta::apply(&racing, racing.applied_index() + 1, &stale[0]);
    assert!(
        matches!(refused, Err(narad_meta::MetaError::Conflict(_))),
        "a stale dead-marking must be refused: {refused:?}"
    );
    assert_eq!(racing.member("n3").unwrap().status, MemberStatus::Alive);
    // Heartbeating again makes it alive (MemberJoin upserts the record).
    let s = run(&s, member("n3", NOW));
    assert_eq!(s.member("n3").unwrap().status, MemberStatus::Alive);
    assert_eq!(plan(&s, NOW), Vec::new());
}

#[test]
fn a_fresh_topic_goes_round_robin_over_the_members_left_alive_sorted_by_id() {
    let mut s = MetaState::default();
    for (id, age) in [("n2", 0), ("n10", 5), ("n1", 40), ("n3", 0)] {
        s = run(&s, member(id, NOW - age));
    }
    s = run(&s, topic("orders", 5, None));
    let s = applied(&s, &plan(&s, NOW));
    // n1 is overdue: the ring is n10, n2, n3 (byte order).
    let want = [(0, "n10"), (1, "n2"), (2, "n3"), (3, "n10"), (4, "n2")];
    let want: Vec<(u32, String)> = want.iter().map(|(p, o)| (*p, o.to_string())).collect();
    assert_eq!(owners(&s, "orders"), want);
    assert_eq!(s.member("n1").unwrap().status, MemberStatus::Dead);
}

#[test]
fn a_dead_owners_partitions_stay_and_a_child_waiting_for_its_parent_is_placed_in_the_same_tick() {
    let mut s = MetaState::default();
    for id in ["n1", "n2", "n3"] {
        s = run(&s, member(id, NOW));
    }
    s = run(&s, Command::MemberDead(MemberDead { id: "n3".into(), last_heartbeat: None }));
    s = run(&s, topic("p", 3, None));
    s = run(&s, assign(&s, "p", &[(0, "n3")]));
    s = run(&s, topic("c", 4, Some(("p", 1))));
    let commands = plan(&s, NOW);
    assert_eq!(commands.len(), 2, "{commands:?}");
    let s = applied(&s, &commands);
    let p: Vec<(u32, String)> = owners(&s, "p");
    assert_eq!(p, vec![(0, "n3".into()), (1, "n2".into()), (2, "n1".into())]);
    let c = owners(&s, "c");
    for (i, owner) in &c[..3] {
        assert_ne!(owner, &p[*i as usize].1, "child partition {i} beside its parent's");
    }
    assert_eq!(c[3], (3, "n2".into()), "past the parent's count: round robin");
    assert_eq!(plan(&s, NOW), Vec::new());
}

#[test]
fn with_no_member_alive_nothing_is_placed() {
    let mut s = MetaState::default();
    s = run(&s, member("n1", NOW - 100));
    s = run(&s, topic("t", 3, None));
    let commands = plan(&s, NOW);
    assert_eq!(
        commands,
        vec![Command::MemberDead(MemberDead { id: "n1".into(), last_heartbeat: Some(NOW - 100) })]
    );
}
