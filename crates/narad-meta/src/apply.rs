//! The state machine: `apply(state, index, command)` → the next state.
//!
//! Apply is a pure function of its inputs: it reads no clock, draws no random
//! number and touches no disk, so every replica that applies the same
//! commands in the same order holds the same state. It either succeeds as a
//! whole or fails and leaves nothing behind. A topic's incarnation id is the
//! index of the command that created it: indices only grow, so an id is
//! never reused, and a delete and recreate under one name gets a new one.
//!
//! Apply also records which keys it changed ([`Dirty`]) so that storage can
//! persist exactly those, and bumps the change counter of each domain it
//! touched, once per command.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::assignment::Assignment;
use crate::command::{
    AbortMove, AlterTopic, AssignPartitions, AttachChild, Command, CompleteMove, CreateTopic,
    CreateUser, DeleteUser, DetachChild, MemberDead, MemberJoin, Reassigned, RemoveMember,
    Response, SeedRootUser, SetAssignmentTarget, SetMemberDraining, UpdateUser,
};
use crate::error::MetaError;
use crate::limits::{
    ATTACH_EPOCH_HEX_LEN, CHILDREN_PER_PARENT_MAX, MAX_MOVES_IN_FLIGHT, PARTITIONS_MIN,
    RETENTION_MS_MIN,
};
use crate::member::{Member, MemberStatus};
use crate::request::{
    check_fanout_delay, check_retention_floor, parent_not_found, validate_topic_name,
};
use crate::schema::{CompiledSchema, SchemaHistory, check_backward_compatible};
use crate::state::{MetaState, TopicAssignments};
use crate::topic::{ParentLink, Topic};
use crate::user::{User, validate_grants, validate_username};

/// The keys a command changed, per domain (topic names, member ids,
/// usernames).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dirty {
    pub(crate) topics: BTreeSet<String>,
    pub(crate) schemas: BTreeSet<String>,
    pub(crate) assignments: BTreeSet<String>,
    pub(crate) members: BTreeSet<String>,
    pub(crate) users: BTreeSet<String>,
}

/// The outcome of applying one command.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The state after the command.
    pub state: MetaState,
    /// What the command answers.
    pub response: Response,
    /// What changed, for storage.
    pub dirty: Dirty,
}

/// Applies `command` as the command at `index` (which must be greater than
/// the state's applied index).
pub fn apply(state: &MetaState, index: u64, command: &Command) -> Result<Applied, MetaError> {
    assert!(
        index > state.applied_index,
        "command index {index} is not after the applied index {}",
        state.applied_index
    );
    let mut txn = Txn { state: state.clone(), dirty: Dirty::default() };
    let response = match command {
        Command::CreateTopic(c) => create_topic(&mut txn, index, c)?,
        Command::AlterTopic(c) => alter_topic(&mut txn, c)?,
        Command::DeleteTopic(c) => delete_topic(&mut txn, &c.name)?,
        Command::AssignPartitions(c) => assign_partitions(&mut txn, c)?,
        Command::MemberJoin(c) => member_join(&mut txn, c)?,
        Command::MemberDead(c) => member_dead(&mut txn, c)?,
        Command::CreateUser(c) => create_user(&mut txn, c)?,
        Command::UpdateUser(c) => update_user(&mut txn, c)?,
        Command::DeleteUser(c) => delete_user(&mut txn, c)?,
        Command::SeedRootUser(c) => seed_root_user(&mut txn, c)?,
        Command::AttachChild(c) => attach_child(&mut txn, c)?,
        Command::DetachChild(c) => detach_child(&mut txn, c)?,
        Command::SetAssignmentTarget(c) => set_assignment_target(&mut txn, index, c)?,
        Command::CompleteMove(c) => complete_move(&mut txn, c)?,
        Command::AbortMove(c) => abort_move(&mut txn, c)?,
        Command::SetMemberDraining(c) => set_member_draining(&mut txn, c)?,
        Command::RemoveMember(c) => remove_member(&mut txn, c)?,
    };
    Ok(txn.finish(index, response))
}

/// A state being changed, and the record of what changed.
struct Txn {
    state: MetaState,
    dirty: Dirty,
}

impl Txn {
    fn topic(&self, name: &str) -> Result<Arc<Topic>, MetaError> {
        self.state.topics.get(name).cloned().ok_or_else(MetaError::topic_not_found)
    }

    fn put_topic(&mut self, topic: Topic) -> Arc<Topic> {
        let topic = Arc::new(topic);
        self.dirty.topics.insert(topic.name.clone());
        Arc::make_mut(&mut self.state.topics).insert(topic.name.clone(), topic.clone());
        topic
    }

    fn remove_topic(&mut self, name: &str) {
        self.dirty.topics.insert(name.to_owned());
        Arc::make_mut(&mut self.state.topics).remove(name);
    }

    fn put_schemas(&mut self, name: &str, history: Arc<SchemaHistory>) {
        self.dirty.schemas.insert(name.to_owned());
        Arc::make_mut(&mut self.state.schemas).insert(name.to_owned(), history);
    }

    fn remove_schemas(&mut self, name: &str) {
        if self.state.schemas.contains_key(name) {
            self.dirty.schemas.insert(name.to_owned());
            Arc::make_mut(&mut self.state.schemas).remove(name);
        }
    }

    /// Stores a topic's assignments; an empty set is stored as none, as
    /// storage (one row per assigned partition) would read it back.
    fn put_assignments(&mut self, name: &str, parts: TopicAssignments) {
        if parts.is_empty() {
            return self.remove_assignments(name);
        }
        self.dirty.assignments.insert(name.to_owned());
        Arc::make_mut(&mut self.state.assignments).insert(name.to_owned(), Arc::new(parts));
    }

    fn remove_assignments(&mut self, name: &str) {
        if self.state.assignments.contains_key(name) {
            self.dirty.assignments.insert(name.to_owned());
            Arc::make_mut(&mut self.state.assignments).remove(name);
        }
    }

    fn put_member(&mut self, member: Member) -> Arc<Member> {
        let member = Arc::new(member);
        self.dirty.members.insert(member.id.clone());
        Arc::make_mut(&mut self.state.members).insert(member.id.clone(), member.clone());
        member
    }

    fn remove_member(&mut self, id: &str) {
        if self.state.members.contains_key(id) {
            self.dirty.members.insert(id.to_owned());
            Arc::make_mut(&mut self.state.members).remove(id);
        }
    }

    fn user(&self, name: &str) -> Result<Arc<User>, MetaError> {
        self.state.users.get(name).cloned().ok_or_else(MetaError::user_not_found)
    }

    fn put_user(&mut self, user: User) -> Arc<User> {
        let user = Arc::new(user);
        self.dirty.users.insert(user.username.clone());
        Arc::make_mut(&mut self.state.users).insert(user.username.clone(), user.clone());
        user
    }

    fn remove_user(&mut self, name: &str) {
        self.dirty.users.insert(name.to_owned());
        Arc::make_mut(&mut self.state.users).remove(name);
    }

    fn finish(mut self, index: u64, response: Response) -> Applied {
        let v = &mut self.state.versions;
        v.topics += u64::from(!self.dirty.topics.is_empty());
        v.schemas += u64::from(!self.dirty.schemas.is_empty());
        v.assignments += u64::from(!self.dirty.assignments.is_empty());
        v.members += u64::from(!self.dirty.members.is_empty());
        v.users += u64::from(!self.dirty.users.is_empty());
        self.state.applied_index = index;
        Applied { state: self.state, response, dirty: self.dirty }
    }
}

fn invalid(msg: impl Into<String>) -> MetaError {
    MetaError::Invalid(msg.into())
}

fn conflict(msg: impl Into<String>) -> MetaError {
    MetaError::Conflict(msg.into())
}

fn compile(version: u32, raw: &str) -> Result<CompiledSchema, MetaError> {
    CompiledSchema::compile(version, Arc::from(raw)).map_err(|e| invalid(format!("schema: {e}")))
}

fn create_topic(txn: &mut Txn, index: u64, c: &CreateTopic) -> Result<Response, MetaError> {
    validate_topic_name(&c.name)?;
    if c.partitions < PARTITIONS_MIN {
        return Err(invalid("partitions must be >= 3 (0 = use default)"));
    }
    check_retention_floor(c.retention_ms)?;
    let schema = c.schema.as_deref().map(|raw| compile(1, raw)).transpose()?;
    let parent = match &c.parent {
        Some(link) => Some(check_create_as_child(txn, c, link)?),
        None => None,
    };
    if txn.state.topics.contains_key(&c.name) {
        return Err(MetaError::AlreadyExists("topic already exists".to_owned()));
    }
    let history = match (&parent, schema) {
        (Some(p), schema) => attach_schema(txn, &c.name, p, schema)?,
        (None, Some(s)) => Some(Arc::new(SchemaHistory::first(s))),
        (None, None) => None,
    };
    let topic = txn.put_topic(Topic {
        name: c.name.clone(),
        incarnation: index,
        partitions: c.partitions,
        retention_ms: c.retention_ms,
        visibility_timeout_ms: c.visibility_timeout_ms,
        max_in_flight_per_partition: c.max_in_flight_per_partition,
        max_acked_ahead_per_partition: c.max_acked_ahead_per_partition,
        created_at: c.created_at,
        owner: c.owner.clone(),
        children: Vec::new(),
        parent: c.parent.clone(),
    });
    if let Some(h) = history {
        txn.put_schemas(&c.name, h);
    }
    if let Some(p) = parent {
        let mut p = (*p).clone();
        p.children.push(c.name.clone());
        txn.put_topic(p);
    }
    Ok(Response::Topic(topic))
}

/// The attach rules for a topic created with `parent` (SPEC §1.5), except the
/// schema rule, which [`attach_schema`] checks.
fn check_create_as_child(
    txn: &Txn,
    c: &CreateTopic,
    link: &ParentLink,
) -> Result<Arc<Topic>, MetaError> {
    validate_topic_name(&link.name)?;
    if link.name == c.name {
        return Err(invalid("a topic cannot be its own parent"));
    }
    check_fanout_delay("fanout_delay_ms", delay_as_i64(link.fanout_delay_ms))?;
    check_epoch(&link.attach_epoch)?;
    let parent = txn.state.topics.get(&link.name).cloned();
    let parent = parent.ok_or_else(|| parent_not_found(&link.name))?;
    check_parent_accepts(&parent, link.fanout_delay_ms)?;
    Ok(parent)
}

fn delay_as_i64(delay_ms: u64) -> i64 {
    i64::try_from(delay_ms).unwrap_or(i64::MAX)
}

fn check_epoch(epoch: &str) -> Result<(), MetaError> {
    let ok = epoch.len() == ATTACH_EPOCH_HEX_LEN && epoch.bytes().all(|b| b.is_ascii_hexdigit());
    if !ok {
        return Err(invalid(format!(
            "attach_epoch must be {ATTACH_EPOCH_HEX_LEN} hex digits, got {epoch:?}"
        )));
    }
    Ok(())
}

/// The rules a parent sets for one more child: it is not itself a child, it
/// has room, and (for a delayed child) it keeps records long enough.
fn check_parent_accepts(parent: &Topic, delay_ms: u64) -> Result<(), MetaError> {
    if let Some(grandparent) = &parent.parent {
        return Err(conflict(format!(
            "topic {:?} is a child of {:?} and cannot have children",
            parent.name, grandparent.name
        )));
    }
    if parent.children.len() >= CHILDREN_PER_PARENT_MAX {
        return Err(conflict(format!(
            "parent topic {:?} already has {CHILDREN_PER_PARENT_MAX} children",
            parent.name
        )));
    }
    check_delay_fits_retention(parent.retention_ms, delay_ms)
}

/// A parent with a non-zero retention must keep records for the delay of
/// each delayed child plus an hour.
fn check_delay_fits_retention(parent_retention_ms: u64, delay_ms: u64) -> Result<(), MetaError> {
    let needed = delay_ms.saturating_add(RETENTION_MS_MIN);
    if delay_ms > 0 && parent_retention_ms != 0 && parent_retention_ms < needed {
        return Err(invalid(format!(
            "parent retention_ms ({parent_retention_ms}) must be at least fanout_delay_ms + 1 \
             hour ({needed})"
        )));
    }
    Ok(())
}

fn schema_mismatch(child: &str, parent: &str) -> MetaError {
    conflict(format!(
        "schema mismatch: child {child:?} must have no schema or the same schema history as \
         parent {parent:?}"
    ))
}

/// A child adopts its parent's schema history when it brings none, and must
/// bring an identical history otherwise.
fn attach_schema(
    txn: &Txn,
    child: &str,
    parent: &Topic,
    schema: Option<CompiledSchema>,
) -> Result<Option<Arc<SchemaHistory>>, MetaError> {
    let parents = txn.state.schemas.get(&parent.name).cloned();
    let Some(schema) = schema else { return Ok(parents) };
    match parents {
        Some(h) if h.versions().len() == 1 && *h.versions()[0] == *schema.raw() => Ok(Some(h)),
        _ => Err(schema_mismatch(child, &parent.name)),
    }
}

/// What an attach that passed [`check_attach`] works with.
pub(crate) struct CheckedAttach {
    parent: Arc<Topic>,
    child: Arc<Topic>,
    /// The child's schema history once attached (the parent's, if any).
    history: Option<Arc<SchemaHistory>>,
}

/// Every rule of attaching an existing topic (SPEC §1.5), in the order they
/// are checked: the request's own values (400), both topics exist (404),
/// the roles (409: already attached here, the parent is a child, the child
/// is a parent, the child is attached elsewhere, the parent is full), the
/// parent's retention against the delay (400), and the schemas (409: the
/// child has none, or the same history as the parent).
pub(crate) fn check_attach(state: &MetaState, c: &AttachChild) -> Result<CheckedAttach, MetaError> {
    if c.child.is_empty() {
        return Err(invalid("child required"));
    }
    if c.child == c.parent {
        return Err(invalid("a topic cannot be attached to itself"));
    }
    check_fanout_delay("delay_ms", delay_as_i64(c.fanout_delay_ms))?;
    check_epoch(&c.attach_epoch)?;
    let parent = state.topics.get(&c.parent).cloned().ok_or_else(MetaError::topic_not_found)?;
    let child = state.topics.get(&c.child).cloned();
    let child = child.ok_or_else(|| {
        MetaError::NotFound(format!("topic not found: child topic {:?}", c.child))
    })?;
    if let Some(link) = &child.parent
        && link.name == parent.name
    {
        return Err(conflict(format!(
            "topic {:?} is already attached to {:?}",
            child.name, parent.name
        )));
    }
    if let Some(grandparent) = &parent.parent {
        return Err(conflict(format!(
            "topic {:?} is a child of {:?} and cannot have children",
            parent.name, grandparent.name
        )));
    }
    if !child.children.is_empty() {
        return Err(conflict(format!(
            "topic {:?} is a parent of {} children and cannot be attached",
            child.name,
            child.children.len()
        )));
    }
    if let Some(link) = &child.parent {
        return Err(conflict(format!(
            "topic {:?} is already attached to parent {:?}",
            child.name, link.name
        )));
    }
    check_parent_accepts(&parent, c.fanout_delay_ms)?;
    let parents = state.schemas.get(&parent.name).cloned();
    let history = match state.schemas.get(&child.name) {
        None => parents,
        Some(own) if parents.as_ref().is_some_and(|p| p.versions() == own.versions()) => parents,
        Some(_) => return Err(schema_mismatch(&child.name, &parent.name)),
    };
    Ok(CheckedAttach { parent, child, history })
}

fn attach_child(txn: &mut Txn, c: &AttachChild) -> Result<Response, MetaError> {
    let CheckedAttach { parent, child, history } = check_attach(&txn.state, c)?;
    let mut child = (*child).clone();
    child.parent = Some(ParentLink {
        name: parent.name.clone(),
        attach_epoch: c.attach_epoch.clone(),
        fanout_delay_ms: c.fanout_delay_ms,
        attached_at_ms: c.attached_at_ms,
    });
    txn.put_topic(child);
    if let Some(h) = history {
        txn.put_schemas(&c.child, h);
    }
    let mut parent = (*parent).clone();
    parent.children.push(c.child.clone());
    Ok(Response::Topic(txn.put_topic(parent)))
}

fn detach_child(txn: &mut Txn, c: &DetachChild) -> Result<Response, MetaError> {
    let parent = txn.topic(&c.parent)?;
    let child = txn.state.topics.get(&c.child).cloned();
    let child = child.ok_or_else(|| {
        MetaError::NotFound(format!("topic not found: child topic {:?}", c.child))
    })?;
    let link = match &child.parent {
        Some(link) if link.name == parent.name => link.clone(),
        _ => {
            return Err(MetaError::NotFound(format!(
                "topic {:?} is not attached to {:?}",
                c.child, c.parent
            )));
        }
    };
    // The child keeps its data and its schema history, now its own.
    let mut child = (*child).clone();
    child.parent = None;
    txn.put_topic(child);
    let mut parent = (*parent).clone();
    parent.children.retain(|name| name != &c.child);
    let parent = txn.put_topic(parent);
    Ok(Response::ChildDetached { parent, link })
}

fn alter_topic(txn: &mut Txn, c: &AlterTopic) -> Result<Response, MetaError> {
    let current = txn.topic(&c.name)?;
    let mut next = (*current).clone();
    if let Some(retention) = c.retention_ms {
        check_retention_floor(retention)?;
        for child in &current.children {
            let delay = txn.topic(child)?.parent.as_ref().map_or(0, |l| l.fanout_delay_ms);
            check_delay_fits_retention(retention, delay)?;
        }
        next.retention_ms = retention;
    }
    if let Some(cap) = c.max_in_flight_per_partition {
        next.max_in_flight_per_partition = cap;
    }
    if let Some(cap) = c.max_acked_ahead_per_partition {
        next.max_acked_ahead_per_partition = cap;
    }
    if let Some(partitions) = c.partitions {
        if partitions <= current.partitions {
            return Err(invalid(format!(
                "new partition count ({partitions}) must be greater than current ({}); decrease \
                 is not supported",
                current.partitions
            )));
        }
        next.partitions = partitions;
    }
    if let Some(raw) = &c.schema {
        put_next_schema(txn, &current, raw)?;
    }
    let topic = if next == *current { current } else { txn.put_topic(next) };
    Ok(Response::Topic(topic))
}

/// Appends a schema version to `topic` and to each of its children.
fn put_next_schema(txn: &mut Txn, topic: &Topic, raw: &str) -> Result<(), MetaError> {
    if let Some(link) = &topic.parent {
        return Err(conflict(format!(
            "topic {:?} is attached to parent {:?}, which manages its schema",
            topic.name, link.name
        )));
    }
    let history = txn.state.schemas.get(&topic.name).cloned();
    let version = history.as_ref().map_or(1, |h| h.versions().len() as u32 + 1);
    let compiled = compile(version, raw)?;
    let next = match history {
        Some(h) => {
            let latest = h.latest();
            check_backward_compatible(latest.version(), latest.raw(), raw)
                .map_err(|e| invalid(format!("schema: {e}")))?;
            h.with_next(compiled)
        }
        None => SchemaHistory::first(compiled),
    };
    let next = Arc::new(next);
    txn.put_schemas(&topic.name, next.clone());
    for child in &topic.children {
        txn.put_schemas(child, next.clone());
    }
    Ok(())
}

fn delete_topic(txn: &mut Txn, name: &str) -> Result<Response, MetaError> {
    let topic = txn.topic(name)?;
    txn.remove_topic(name);
    txn.remove_schemas(name);
    txn.remove_assignments(name);
    if let Some(link) = &topic.parent {
        let mut parent = (*txn.topic(&link.name)?).clone();
        parent.children.retain(|c| c != name);
        txn.put_topic(parent);
    }
    for child in &topic.children {
        let mut c = (*txn.topic(child)?).clone();
        c.parent = None;
        txn.put_topic(c);
    }
    Ok(Response::TopicDeleted(topic))
}

fn assign_partitions(txn: &mut Txn, c: &AssignPartitions) -> Result<Response, MetaError> {
    let topic = txn.topic(&c.topic)?;
    if topic.incarnation != c.incarnation {
        return Err(conflict(format!(
            "topic {:?} is incarnation {}, not {}; it was recreated",
            c.topic, topic.incarnation, c.incarnation
        )));
    }
    let mut parts: TopicAssignments =
        txn.state.assignments.get(&c.topic).map(|a| (**a).clone()).unwrap_or_default();
    for a in &c.assignments {
        if a.partition >= topic.partitions {
            return Err(invalid(format!(
                "partition {} out of range (topic {:?} has {})",
                a.partition, c.topic, topic.partitions
            )));
        }
        if a.owner_id.is_empty() {
            return Err(invalid("owner_id required"));
        }
        if c.unassigned_only && parts.contains_key(&a.partition) {
            continue;
        }
        let assignment = Assignment {
            owner_id: a.owner_id.clone(),
            target_id: a.target_id.clone(),
            base_offset: None,
            move_attempt: None,
        };
        parts.insert(a.partition, assignment);
    }
    txn.put_assignments(&c.topic, parts);
    Ok(Response::Assigned)
}

fn member_join(txn: &mut Txn, c: &MemberJoin) -> Result<Response, MetaError> {
    if c.member.id.is_empty() {
        return Err(invalid("member id required"));
    }
    if c.member.addr.is_empty() {
        return Err(invalid("member addr required"));
    }
    // Draining is an operator's decision, not the heartbeat's: the stored
    // mark survives every heartbeat.
    let draining = txn.state.members.get(&c.member.id).is_some_and(|m| m.draining);
    Ok(Response::Member(txn.put_member(Member { draining, ..c.member.clone() })))
}

/// The assignment of `(topic, partition)` of this incarnation, for a move
/// command: 404 for a missing topic, 409 for another incarnation or an
/// unassigned partition.
fn moving_assignment(
    txn: &Txn,
    topic: &str,
    incarnation: u64,
    partition: u32,
) -> Result<(TopicAssignments, Assignment), MetaError> {
    let t = txn.topic(topic)?;
    if t.incarnation != incarnation {
        return Err(conflict(format!(
            "topic {topic:?} is incarnation {}, not {incarnation}; it was recreated",
            t.incarnation
        )));
    }
    let parts: TopicAssignments =
        txn.state.assignments.get(topic).map(|a| (**a).clone()).unwrap_or_default();
    let Some(current) = parts.get(&partition).cloned() else {
        return Err(conflict(format!("partition {partition} of {topic:?} has no owner")));
    };
    Ok((parts, current))
}

fn set_assignment_target(
    txn: &mut Txn,
    index: u64,
    c: &SetAssignmentTarget,
) -> Result<Response, MetaError> {
    let (mut parts, current) = moving_assignment(txn, &c.topic, c.incarnation, c.partition)?;
    let (topic, p) = (&c.topic, c.partition);
    if current.owner_id != c.expected_owner {
        return Err(conflict(format!(
            "partition {p} of {topic:?} is owned by {}, not {}",
            current.owner_id, c.expected_owner
        )));
    }
    match &current.target_id {
        Some(t) if *t == c.target_id => return Ok(Response::Assigned),
        Some(t) => {
            return Err(conflict(format!("partition {p} of {topic:?} is already moving to {t}")));
        }
        None => {}
    }
    if c.target_id == current.owner_id {
        return Err(invalid(format!("partition {p} of {topic:?} is already on {}", c.target_id)));
    }
    let Some(target) = txn.state.members.get(&c.target_id) else {
        return Err(MetaError::NotFound(format!("member {} not found", c.target_id)));
    };
    if target.status != MemberStatus::Alive || target.draining {
        return Err(conflict(format!(
            "member {} cannot receive partitions: it is {}",
            c.target_id,
            if target.draining { "draining" } else { "dead" }
        )));
    }
    let in_flight = txn
        .state
        .assignments
        .values()
        .flat_map(|parts| parts.values())
        .filter(|a| a.target_id.is_some())
        .count();
    if in_flight >= MAX_MOVES_IN_FLIGHT {
        return Err(conflict(format!(
            "{in_flight} moves are in flight, the most the cluster runs at once"
        )));
    }
    parts.insert(
        p,
        Assignment { target_id: Some(c.target_id.clone()), move_attempt: Some(index), ..current },
    );
    txn.put_assignments(topic, parts);
    Ok(Response::Assigned)
}

fn complete_move(txn: &mut Txn, c: &CompleteMove) -> Result<Response, MetaError> {
    let (mut parts, current) = moving_assignment(txn, &c.topic, c.incarnation, c.partition)?;
    if let Some(attempt) = c.attempt
        && current.move_attempt != Some(attempt)
    {
        return Err(conflict(format!(
            "partition {} of {:?}: the move of attempt {attempt} was given up (the move in flight is attempt {})",
            c.partition,
            c.topic,
            current.move_attempt.map_or("none".to_owned(), |a| a.to_string())
        )));
    }
    if current.owner_id != c.expected_owner
        || current.target_id.as_deref() != Some(c.target_id.as_str())
    {
        return Err(conflict(format!(
            "partition {} of {:?} is owned by {} moving to {}, not by {} moving to {}",
            c.partition,
            c.topic,
            current.owner_id,
            current.target_id.as_deref().unwrap_or("nowhere"),
            c.expected_owner,
            c.target_id
        )));
    }
    parts.insert(
        c.partition,
        Assignment {
            owner_id: c.target_id.clone(),
            target_id: None,
            base_offset: None,
            move_attempt: None,
        },
    );
    txn.put_assignments(&c.topic, parts);
    Ok(Response::Assigned)
}

fn abort_move(txn: &mut Txn, c: &AbortMove) -> Result<Response, MetaError> {
    let (mut parts, current) = moving_assignment(txn, &c.topic, c.incarnation, c.partition)?;
    if let Some(attempt) = c.attempt
        && current.move_attempt != Some(attempt)
    {
        return Err(conflict(format!(
            "partition {} of {:?}: the move of attempt {attempt} is over (the move in flight is attempt {})",
            c.partition,
            c.topic,
            current.move_attempt.map_or("none".to_owned(), |a| a.to_string())
        )));
    }
    if current.target_id.as_deref() != Some(c.expected_target.as_str()) {
        return Err(conflict(format!(
            "partition {} of {:?} is moving to {}, not {}",
            c.partition,
            c.topic,
            current.target_id.as_deref().unwrap_or("nowhere"),
            c.expected_target
        )));
    }
    parts.insert(c.partition, Assignment { target_id: None, move_attempt: None, ..current });
    txn.put_assignments(&c.topic, parts);
    Ok(Response::Assigned)
}

fn set_member_draining(txn: &mut Txn, c: &SetMemberDraining) -> Result<Response, MetaError> {
    let current = txn.state.members.get(&c.id).cloned();
    let current = current.ok_or_else(|| MetaError::NotFound("member not found".to_owned()))?;
    let member = Member { draining: c.draining, ..(*current).clone() };
    Ok(Response::Member(txn.put_member(member)))
}

/// Op 17 (see [`RemoveMember`]): a compare and set on the member being
/// dead with the heartbeat the proposer saw, then every partition it owns
/// to its new owner ([`crate::placement::reassign_removed`] on this
/// state) with its start offset, every move to or from it cleared, and its
/// record removed, all in this one command.
fn remove_member(txn: &mut Txn, c: &RemoveMember) -> Result<Response, MetaError> {
    let current = txn.state.members.get(&c.id).cloned();
    let current = current.ok_or_else(|| MetaError::NotFound("member not found".to_owned()))?;
    if current.status != MemberStatus::Dead {
        return Err(conflict(format!(
            "member {} is alive: only a member marked dead can be removed (drain a live one: \
             narad cluster drain {})",
            c.id, c.id
        )));
    }
    if current.last_heartbeat != c.last_heartbeat {
        return Err(conflict(format!(
            "member {} heartbeated at {}, not {} as the removal saw it: it may have come back",
            c.id, current.last_heartbeat, c.last_heartbeat
        )));
    }
    let plan = crate::placement::reassign_removed(&txn.state, &c.id).map_err(conflict)?;
    let mut reassigned = Vec::with_capacity(plan.len());
    for new in plan {
        let start = c.partitions.iter().find(|r| {
            r.topic == new.topic && r.incarnation == new.incarnation && r.partition == new.partition
        });
        let Some(start) = start else {
            return Err(conflict(format!(
                "partition {} of {:?} (incarnation {}) of member {} has no start offset in the \
                 removal: it was planned on an older state; ask again",
                new.partition, new.topic, new.incarnation, c.id
            )));
        };
        reassigned.push(Reassigned {
            topic: new.topic,
            incarnation: new.incarnation,
            partition: new.partition,
            owner_id: new.owner_id,
            base_offset: start.base_offset,
        });
    }
    let names: Vec<String> = txn.state.assignments.keys().cloned().collect();
    for name in names {
        let mut parts: TopicAssignments = (*txn.state.assignments[&name]).clone();
        let mut changed = false;
        for (p, a) in parts.iter_mut() {
            if a.owner_id == c.id {
                let new = reassigned
                    .iter()
                    .find(|r| r.topic == name && r.partition == *p)
                    .expect("every partition of the member is reassigned");
                *a = Assignment {
                    owner_id: new.owner_id.clone(),
                    target_id: None,
                    base_offset: Some(new.base_offset),
                    move_attempt: None,
                };
                changed = true;
            } else if a.target_id.as_deref() == Some(c.id.as_str()) {
                a.target_id = None;
                a.move_attempt = None;
                changed = true;
            }
        }
        if changed {
            txn.put_assignments(&name, parts);
        }
    }
    txn.remove_member(&c.id);
    Ok(Response::MemberRemoved { member: current, reassigned })
}

fn member_dead(txn: &mut Txn, c: &MemberDead) -> Result<Response, MetaError> {
    let current = txn.state.members.get(&c.id).cloned();
    let current = current.ok_or_else(|| MetaError::NotFound("member not found".to_owned()))?;
    if let Some(seen) = c.last_heartbeat
        && seen != current.last_heartbeat
    {
        return Err(MetaError::Conflict(format!(
            "member {} heartbeated at {} after the {} this marking judged overdue",
            c.id, current.last_heartbeat, seen
        )));
    }
    let member = Member { status: MemberStatus::Dead, ..(*current).clone() };
    Ok(Response::Member(txn.put_member(member)))
}

/// The stateless rules of a user record to store.
fn check_user(u: &User) -> Result<(), MetaError> {
    validate_username(&u.username)?;
    validate_grants(&u.grants)?;
    if u.password_hash.is_empty() {
        return Err(invalid("password hash required"));
    }
    Ok(())
}

fn create_user(txn: &mut Txn, c: &CreateUser) -> Result<Response, MetaError> {
    check_user(&c.user)?;
    if c.user.root {
        return Err(invalid("only the root seed creates a root user"));
    }
    if txn.state.users.contains_key(&c.user.username) {
        return Err(MetaError::AlreadyExists("user already exists".to_owned()));
    }
    Ok(Response::User(txn.put_user(c.user.clone())))
}

fn update_user(txn: &mut Txn, c: &UpdateUser) -> Result<Response, MetaError> {
    let current = txn.user(&c.username)?;
    let mut next = (*current).clone();
    if let Some(grants) = &c.grants {
        if current.root {
            return Err(MetaError::Forbidden("the root user's grants cannot be changed".into()));
        }
        validate_grants(grants)?;
        next.grants = grants.clone();
    }
    if let Some(hash) = &c.password_hash {
        if hash.is_empty() {
            return Err(invalid("password hash required"));
        }
        next.password_hash = hash.clone();
    }
    next.updated_at_ms = c.updated_at_ms;
    Ok(Response::User(txn.put_user(next)))
}

fn delete_user(txn: &mut Txn, c: &DeleteUser) -> Result<Response, MetaError> {
    let current = txn.user(&c.username)?;
    if current.root {
        return Err(MetaError::Forbidden("the root user cannot be deleted".into()));
    }
    // A topic's owner is a username: a user created later under the same
    // name must not inherit it, so its owner goes first.
    let owned: Vec<&str> = txn
        .state
        .topics
        .values()
        .filter(|t| t.owner() == c.username)
        .map(|t| t.name.as_str())
        .collect();
    if !owned.is_empty() {
        let shown = owned.iter().take(5).copied().collect::<Vec<_>>().join(", ");
        let more =
            if owned.len() > 5 { format!(" and {} more", owned.len() - 5) } else { String::new() };
        return Err(conflict(format!("user owns topics ({shown}{more}): delete them first")));
    }
    txn.remove_user(&c.username);
    Ok(Response::UserDeleted(current))
}

fn seed_root_user(txn: &mut Txn, c: &SeedRootUser) -> Result<Response, MetaError> {
    check_user(&c.user)?;
    if !c.user.root {
        return Err(invalid("the seeded user must be root"));
    }
    if txn.state.users.values().any(|u| u.root) {
        return Err(conflict("a root user already exists"));
    }
    if txn.state.users.contains_key(&c.user.username) {
        return Err(MetaError::AlreadyExists("user already exists".to_owned()));
    }
    Ok(Response::User(txn.put_user(c.user.clone())))
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;
