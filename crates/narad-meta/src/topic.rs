//! The topic record: its options, its incarnation id and its fan-out links,
//! and the two ways it is rendered as SPEC §1.4 "Topic JSON".
//!
//! A topic's role is not stored: it follows from its links (a topic with
//! children is a parent, a topic with a parent link is a child, any other is
//! standalone), so the role can never disagree with the links.

use serde::{Deserialize, Serialize};

/// A topic's position in fan-out. Roles are exclusive and one level deep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Neither a parent nor a child.
    Standalone,
    /// Fans out to one or more children.
    Parent,
    /// Receives fan-out from a parent.
    Child,
}

/// A child's link to its parent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParentLink {
    /// The parent topic's name.
    pub name: String,
    /// This attachment's id: 8 random bytes as 16 lowercase hex digits, new
    /// on every attach. Fan-out cursor state is scoped to it.
    pub attach_epoch: String,
    /// Delivery delay after the parent's commit time, in ms (0 = immediate).
    pub fanout_delay_ms: u64,
    /// When the link was made, Unix ms, from the proposer's clock (0 in
    /// records of format 2, which did not keep it). A fan-out cursor with no
    /// stored position of this epoch starts at the first parent record
    /// committed at or after it, less a margin for the owner's clock (see
    /// `narad-broker`'s fan-out module).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attached_at_ms: u64,
}

/// One topic, as the metastore holds it. Immutable once built; a change
/// makes a new record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topic {
    pub(crate) name: String,
    pub(crate) incarnation: u64,
    pub(crate) partitions: u32,
    pub(crate) retention_ms: u64,
    pub(crate) visibility_timeout_ms: u64,
    pub(crate) max_in_flight_per_partition: u64,
    pub(crate) max_acked_ahead_per_partition: u64,
    pub(crate) created_at: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) owner: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) children: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) parent: Option<ParentLink>,
}

impl Topic {
    /// The topic's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The incarnation id: assigned at create from the applied command index,
    /// never reused, so a delete and recreate under the same name gets a new
    /// one. WAL records carry it (format 2).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The partition count (grow-only).
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// Retention age in ms; 0 keeps forever.
    pub fn retention_ms(&self) -> u64 {
        self.retention_ms
    }

    /// The lease length of a consumed message, in ms (fixed at create).
    pub fn visibility_timeout_ms(&self) -> u64 {
        self.visibility_timeout_ms
    }

    /// Live leases allowed per partition.
    pub fn max_in_flight_per_partition(&self) -> u64 {
        self.max_in_flight_per_partition
    }

    /// Acked-ahead (plus corrupt) entries allowed per partition.
    pub fn max_acked_ahead_per_partition(&self) -> u64 {
        self.max_acked_ahead_per_partition
    }

    /// Creation time, Unix seconds.
    pub fn created_at(&self) -> i64 {
        self.created_at
    }

    /// The user that created the topic ("" when security is off).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The role, derived from the links.
    pub fn role(&self) -> Role {
        if self.parent.is_some() {
            Role::Child
        } else if self.children.is_empty() {
            Role::Standalone
        } else {
            Role::Parent
        }
    }

    /// The children, in attach order (parents only).
    pub fn children(&self) -> &[String] {
        &self.children
    }

    /// The link to the parent (children only).
    pub fn parent(&self) -> Option<&ParentLink> {
        self.parent.as_ref()
    }

    /// Whether this is a child with a non-zero delay: direct produce to it is
    /// refused with 409.
    pub fn is_delayed_child(&self) -> bool {
        self.parent.as_ref().is_some_and(|p| p.fanout_delay_ms > 0)
    }

    /// The topic as a create (or alter) reply renders it: `role` omitted for
    /// a standalone topic.
    pub fn json_reply(&self) -> TopicJson<'_> {
        self.json(self.role() != Role::Standalone)
    }

    /// The topic as reads (get, list) render it: `role` always present.
    pub fn json_read(&self) -> TopicJson<'_> {
        self.json(true)
    }

    fn json(&self, with_role: bool) -> TopicJson<'_> {
        let link = self.parent.as_ref();
        TopicJson {
            name: &self.name,
            partitions: self.partitions,
            retention_ms: self.retention_ms,
            visibility_timeout_ms: self.visibility_timeout_ms,
            max_in_flight_per_partition: self.max_in_flight_per_partition,
            max_acked_ahead_per_partition: self.max_acked_ahead_per_partition,
            created_at: self.created_at,
            owner: &self.owner,
            role: with_role.then(|| self.role()),
            children: &self.children,
            parent: link.map_or("", |l| l.name.as_str()),
            attach_epoch: link.map_or("", |l| l.attach_epoch.as_str()),
            fanout_delay_ms: link.map_or(0, |l| l.fanout_delay_ms),
        }
    }
}

/// SPEC §1.4 "Topic JSON", fields in order, empty optional fields omitted.
/// Serialize it with serde (e.g. `serde_json::to_vec(&topic.json_read())`);
/// the details route can `#[serde(flatten)]` it next to `partition_stats`.
/// The schema and the incarnation id are never part of it.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = Topic))]
pub struct TopicJson<'a> {
    name: &'a str,
    partitions: u32,
    retention_ms: u64,
    visibility_timeout_ms: u64,
    max_in_flight_per_partition: u64,
    max_acked_ahead_per_partition: u64,
    created_at: i64,
    #[serde(skip_serializing_if = "str::is_empty")]
    owner: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<Role>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    children: &'a [String],
    #[serde(skip_serializing_if = "str::is_empty")]
    parent: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    attach_epoch: &'a str,
    #[serde(skip_serializing_if = "is_zero")]
    fanout_delay_ms: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample(name: &str) -> Topic {
        Topic {
            name: name.to_owned(),
            incarnation: 7,
            partitions: 3,
            retention_ms: 604_800_000,
            visibility_timeout_ms: 30_000,
            max_in_flight_per_partition: 1024,
            max_acked_ahead_per_partition: 1024,
            created_at: 1_700_000_000,
            owner: String::new(),
            children: Vec::new(),
            parent: None,
        }
    }

    fn json(v: &TopicJson<'_>) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[test]
    fn standalone_reply_omits_role_and_reads_show_it() {
        let t = sample("orders");
        let base = r#"{"name":"orders","partitions":3,"retention_ms":604800000,"visibility_timeout_ms":30000,"max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1700000000"#;
        assert_eq!(json(&t.json_reply()), format!("{base}}}"));
        assert_eq!(json(&t.json_read()), format!(r#"{base},"role":"standalone"}}"#));
    }

    #[test]
    fn child_json_has_every_field_in_spec_order() {
        let mut t = sample("c");
        t.owner = "alice".into();
        t.parent = Some(ParentLink {
            name: "p".into(),
            attach_epoch: "00112233aabbccdd".into(),
            fanout_delay_ms: 5000,
            attached_at_ms: 1_700_000_000_123,
        });
        let expected = r#"{"name":"c","partitions":3,"retention_ms":604800000,"visibility_timeout_ms":30000,"max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1700000000,"owner":"alice","role":"child","parent":"p","attach_epoch":"00112233aabbccdd","fanout_delay_ms":5000}"#;
        assert_eq!(json(&t.json_reply()), expected);
        assert_eq!(json(&t.json_read()), expected);
        assert!(t.is_delayed_child());
    }

    #[test]
    fn parent_json_lists_children_and_its_role() {
        let mut t = sample("p");
        t.children = vec!["a".into(), "b".into()];
        let s = json(&t.json_reply());
        assert!(s.ends_with(r#""created_at":1700000000,"role":"parent","children":["a","b"]}"#));
        assert_eq!(t.role(), Role::Parent);
    }
}
