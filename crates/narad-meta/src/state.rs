//! The metastore's state: an immutable value, shared behind `Arc`s.
//!
//! Each domain (topics, schemas, assignments, members) is its own
//! `Arc<BTreeMap>`, so applying a command copies only the domains it touches
//! (copy-on-write), and a reader holding an old snapshot is never disturbed.
//! Maps are keyed by name in byte order, which is the listing order.
//!
//! # Invariants ([`MetaState::check_invariants`])
//!
//! * Every topic's key is its name, a valid name; it has at least
//!   [`PARTITIONS_MIN`] partitions; incarnation ids are distinct and no
//!   greater than the applied index.
//! * Fan-out links are symmetric and one level deep: a child's parent exists
//!   and lists it once; a parent's children exist and point back; a parent
//!   has at most [`CHILDREN_PER_PARENT_MAX`] children and no parent.
//! * An attached child's schema history equals its parent's.
//! * Schemas and assignments exist only for existing topics; assignments
//!   only for partitions below the topic's count.
//! * Every user's key is its username; at most one user is root.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::assignment::Assignment;
use crate::limits::{CHILDREN_PER_PARENT_MAX, LIST_LIMIT_MAX, PARTITIONS_MIN};
use crate::member::Member;
use crate::request::validate_topic_name;
use crate::schema::{CompiledSchema, SchemaHistory};
use crate::topic::Topic;
use crate::user::User;

/// Per-domain change counters. Each bumps by one with every applied command
/// that changes its domain, so a cache keyed by a counter is fresh exactly
/// while the counter is unchanged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Versions {
    /// Topic records (create, alter of options or partitions, delete, links).
    pub topics: u64,
    /// Schema histories.
    pub schemas: u64,
    /// Partition assignments.
    pub assignments: u64,
    /// Members.
    pub members: u64,
    /// Users (create, grants, password, delete, root seed).
    pub users: u64,
}

/// The partitions of one topic that have an owner, by index.
pub type TopicAssignments = BTreeMap<u32, Assignment>;

/// One page of a topic listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPage {
    /// The topics, in name order.
    pub topics: Vec<Arc<Topic>>,
    /// The name to pass as `after` for the next page; `""` when done.
    pub next_page_token: String,
}

/// A snapshot of everything the metastore holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetaState {
    pub(crate) applied_index: u64,
    pub(crate) versions: Versions,
    pub(crate) topics: Arc<BTreeMap<String, Arc<Topic>>>,
    pub(crate) schemas: Arc<BTreeMap<String, Arc<SchemaHistory>>>,
    pub(crate) assignments: Arc<BTreeMap<String, Arc<TopicAssignments>>>,
    pub(crate) members: Arc<BTreeMap<String, Arc<Member>>>,
    pub(crate) users: Arc<BTreeMap<String, Arc<User>>>,
}

impl MetaState {
    /// The index of the last applied command (0 before the first).
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// The change counters.
    pub fn versions(&self) -> Versions {
        self.versions
    }

    /// A topic by name.
    pub fn topic(&self, name: &str) -> Option<&Arc<Topic>> {
        self.topics.get(name)
    }

    /// Every topic, in name (byte) order.
    pub fn topics(&self) -> impl Iterator<Item = &Arc<Topic>> {
        self.topics.values()
    }

    /// How many topics exist.
    pub fn topic_count(&self) -> usize {
        self.topics.len()
    }

    /// Keyset pagination by name: up to `limit` topics whose name sorts
    /// after `after` (`""` = from the start; a deleted name resumes at the
    /// next one). `limit` 0 means the default, and is clamped to
    /// [`LIST_LIMIT_MAX`].
    pub fn list_topics(&self, after: &str, limit: usize) -> TopicPage {
        let limit = match limit {
            0 => crate::limits::LIST_LIMIT_DEFAULT,
            n => n.min(LIST_LIMIT_MAX),
        };
        let start = if after.is_empty() { Bound::Unbounded } else { Bound::Excluded(after) };
        let mut rest = self.topics.range::<str, _>((start, Bound::Unbounded)).map(|(_, t)| t);
        let topics: Vec<Arc<Topic>> = rest.by_ref().take(limit).cloned().collect();
        let next_page_token = match (rest.next(), topics.last()) {
            (Some(_), Some(last)) => last.name().to_owned(),
            _ => String::new(),
        };
        TopicPage { topics, next_page_token }
    }

    /// A topic's schema versions, if it has a schema.
    pub fn schema_history(&self, topic: &str) -> Option<&Arc<SchemaHistory>> {
        self.schemas.get(topic)
    }

    /// The compiled latest schema of a topic, for payload validation.
    pub fn compiled_schema(&self, topic: &str) -> Option<&Arc<CompiledSchema>> {
        self.schemas.get(topic).map(|h| h.latest())
    }

    /// The owner of one partition, if assigned.
    pub fn assignment(&self, topic: &str, partition: u32) -> Option<&Assignment> {
        self.assignments.get(topic)?.get(&partition)
    }

    /// The assigned partitions of a topic (empty if none).
    pub fn assignments(&self, topic: &str) -> Option<&Arc<TopicAssignments>> {
        self.assignments.get(topic)
    }

    /// A member by id.
    pub fn member(&self, id: &str) -> Option<&Arc<Member>> {
        self.members.get(id)
    }

    /// Every member, in id order.
    pub fn members(&self) -> impl Iterator<Item = &Arc<Member>> {
        self.members.values()
    }

    /// A user by name.
    pub fn user(&self, name: &str) -> Option<&Arc<User>> {
        self.users.get(name)
    }

    /// Every user, in username (byte) order.
    pub fn users(&self) -> impl Iterator<Item = &Arc<User>> {
        self.users.values()
    }

    /// Whether a root user exists.
    pub fn has_root(&self) -> bool {
        self.users.values().any(|u| u.root)
    }

    /// Checks every invariant of the module docs; the error names the first
    /// violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut incarnations = BTreeSet::new();
        for (key, t) in self.topics.iter() {
            if key != &t.name {
                return Err(format!("topic stored under {key:?} is named {:?}", t.name));
            }
            validate_topic_name(key).map_err(|e| e.to_string())?;
            if t.partitions < PARTITIONS_MIN {
                return Err(format!("topic {key:?} has {} partitions", t.partitions));
            }
            if t.incarnation == 0 || t.incarnation > self.applied_index {
                return Err(format!("topic {key:?} has incarnation {}", t.incarnation));
            }
            if !incarnations.insert(t.incarnation) {
                return Err(format!("incarnation {} is used twice", t.incarnation));
            }
            self.check_links(t)?;
        }
        for name in self.schemas.keys() {
            if !self.topics.contains_key(name) {
                return Err(format!("schemas of missing topic {name:?}"));
            }
        }
        for (name, parts) in self.assignments.iter() {
            let topic =
                self.topics.get(name).ok_or(format!("assignments of missing topic {name:?}"))?;
            if parts.keys().any(|p| *p >= topic.partitions) {
                return Err(format!("topic {name:?} has an assignment out of range"));
            }
        }
        for (id, m) in self.members.iter() {
            if id != &m.id {
                return Err(format!("member stored under {id:?} has id {:?}", m.id));
            }
        }
        for (name, u) in self.users.iter() {
            if name != &u.username {
                return Err(format!("user stored under {name:?} is named {:?}", u.username));
            }
        }
        if self.users.values().filter(|u| u.root).count() > 1 {
            return Err("more than one root user".to_owned());
        }
        Ok(())
    }

    fn check_links(&self, t: &Topic) -> Result<(), String> {
        let name = &t.name;
        if let Some(link) = &t.parent {
            if !t.children.is_empty() {
                return Err(format!("child {name:?} has children"));
            }
            let parent = self
                .topics
                .get(&link.name)
                .ok_or(format!("child {name:?} points to missing parent {:?}", link.name))?;
            if parent.parent.is_some() {
                return Err(format!("parent {:?} of {name:?} is itself a child", link.name));
            }
            if parent.children.iter().filter(|c| *c == name).count() != 1 {
                return Err(format!("parent {:?} does not list {name:?} once", link.name));
            }
            if self.schemas.get(name) != self.schemas.get(&link.name) {
                return Err(format!("child {name:?} has a schema history unlike its parent's"));
            }
        }
        if t.children.len() > CHILDREN_PER_PARENT_MAX {
            return Err(format!("parent {name:?} has {} children", t.children.len()));
        }
        for child in &t.children {
            let c =
                self.topics.get(child).ok_or(format!("{name:?} lists missing child {child:?}"))?;
            if c.parent.as_ref().map(|l| &l.name) != Some(name) {
                return Err(format!("{name:?} lists {child:?}, which is not its child"));
            }
        }
        Ok(())
    }
}
