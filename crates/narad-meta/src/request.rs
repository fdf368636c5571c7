//! What a caller asks for, before it becomes a command: the proposer-side
//! half of validation. `resolve` applies the defaults of [`TopicDefaults`]
//! and every rule that needs no state (or only a read of the proposer's
//! snapshot), in the order Narad checks them, with SPEC's texts. Apply
//! re-checks whatever the state decides.

use std::sync::Arc;

use crate::command::{AlterTopic, AttachChild, CreateTopic};
use crate::config::TopicDefaults;
use crate::error::MetaError;
use crate::limits::{
    FANOUT_DELAY_MS_MAX, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX, PARTITIONS_MIN, RETENTION_MS_MIN,
    TOPIC_NAME_LEN_MAX,
};
use crate::schema::CompiledSchema;
use crate::state::MetaState;
use crate::topic::ParentLink;

/// The topic name pattern, as quoted in errors.
pub const TOPIC_NAME_PATTERN: &str = "^[A-Za-z0-9._-]{1,255}$";

fn invalid(msg: impl Into<String>) -> MetaError {
    MetaError::Invalid(msg.into())
}

/// Checks a topic name: `^[A-Za-z0-9._-]{1,255}$`, and not `.` or `..`
/// (the name is a directory under `<data>/topics`).
pub fn validate_topic_name(name: &str) -> Result<(), MetaError> {
    if name.is_empty() {
        return Err(invalid("name required"));
    }
    if name == "." || name == ".." {
        return Err(invalid(format!("topic name must not be {name:?}")));
    }
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    if name.len() > TOPIC_NAME_LEN_MAX || !name.bytes().all(allowed) {
        return Err(invalid(format!("topic name must match {TOPIC_NAME_PATTERN}")));
    }
    Ok(())
}

/// Parses the `limit` query parameter of a listing: absent or empty means
/// 100, more than 1000 is clamped, anything else not a positive integer is
/// refused.
pub fn parse_list_limit(raw: Option<&str>) -> Result<usize, MetaError> {
    match raw {
        None | Some("") => Ok(LIST_LIMIT_DEFAULT),
        Some(s) => match s.parse::<i64>() {
            Ok(n) if n >= 1 => Ok(usize::try_from(n).unwrap_or(usize::MAX).min(LIST_LIMIT_MAX)),
            _ => Err(invalid("limit must be a positive integer")),
        },
    }
}

/// `value`, or `default` when 0; negative values are refused.
fn defaulted(value: i64, default: u64, field: &str) -> Result<u64, MetaError> {
    match value {
        0 => Ok(default),
        v if v < 0 => Err(invalid(format!("{field} must be >= 0 (0 = use default)"))),
        v => Ok(v as u64),
    }
}

/// Retention must be 0 (keep forever) or at least an hour.
pub(crate) fn check_retention_floor(retention_ms: u64) -> Result<(), MetaError> {
    if retention_ms != 0 && retention_ms < RETENTION_MS_MIN {
        return Err(invalid(format!(
            "retention_ms ({retention_ms}) is below the minimum of {RETENTION_MS_MIN} (1 hour)"
        )));
    }
    Ok(())
}

fn check_max_partitions(partitions: i64, defaults: &TopicDefaults) -> Result<(), MetaError> {
    let max = defaults.max_partitions;
    if partitions > i64::from(max) {
        return Err(invalid(format!(
            "partitions ({partitions}) exceeds topic.max_partitions ({max})"
        )));
    }
    Ok(())
}

/// The body of `POST /v1/topics`, as the user sent it (0 = server default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateTopicRequest {
    /// Required.
    pub name: String,
    /// 0 ⇒ default (or, with `parent`, the parent's count).
    pub partitions: i64,
    /// 0 ⇒ default; otherwise at least one hour.
    pub retention_ms: i64,
    /// 0 ⇒ default.
    pub visibility_timeout_ms: i64,
    /// 0 ⇒ default.
    pub max_in_flight_per_partition: i64,
    /// 0 ⇒ default.
    pub max_acked_ahead_per_partition: i64,
    /// A JSON Schema document, as raw JSON text.
    pub schema: Option<String>,
    /// Create as a child of this topic ("" = none).
    pub parent: String,
    /// Delay of the child (only with `parent`), 0..=1 year.
    pub fanout_delay_ms: i64,
    /// The authenticated caller ("" when security is off).
    pub owner: String,
}

impl CreateTopicRequest {
    /// Validates and resolves the request into a command. `state` is the
    /// proposer's snapshot (for the parent), `now_ms` the proposer's clock
    /// in Unix ms (the topic's `created_at` is its second; a child's link is
    /// made at `now_ms`), `epoch` 64 random bits for the attach epoch.
    pub fn resolve(
        self,
        defaults: &TopicDefaults,
        state: &MetaState,
        now_ms: u64,
        epoch: u64,
    ) -> Result<CreateTopic, MetaError> {
        let created_at = i64::try_from(now_ms / 1000).unwrap_or(i64::MAX);
        validate_topic_name(&self.name)?;
        let mut partitions = self.partitions;
        let parent = if self.parent.is_empty() {
            if self.fanout_delay_ms != 0 {
                return Err(invalid("fanout_delay_ms requires parent"));
            }
            None
        } else {
            let link = self.parent_link(now_ms, epoch)?;
            let parent = state.topic(&link.name).ok_or_else(|| parent_not_found(&link.name))?;
            if partitions == 0 {
                partitions = i64::from(parent.partitions());
            }
            Some(link)
        };
        if partitions == 0 {
            partitions = i64::from(defaults.default_partitions);
        }
        if partitions < i64::from(PARTITIONS_MIN) {
            return Err(invalid("partitions must be >= 3 (0 = use default)"));
        }
        check_max_partitions(partitions, defaults)?;
        let retention_ms =
            defaulted(self.retention_ms, defaults.default_retention_age_ms, "retention_ms")?;
        check_retention_floor(retention_ms)?;
        let visibility_timeout_ms = defaulted(
            self.visibility_timeout_ms,
            defaults.default_visibility_timeout_ms,
            "visibility_timeout_ms",
        )?;
        let max_in_flight_per_partition = defaulted(
            self.max_in_flight_per_partition,
            defaults.default_max_in_flight_per_partition,
            "max_in_flight_per_partition",
        )?;
        let max_acked_ahead_per_partition = defaulted(
            self.max_acked_ahead_per_partition,
            defaults.default_max_acked_ahead_per_partition,
            "max_acked_ahead_per_partition",
        )?;
        if let Some(raw) = &self.schema {
            CompiledSchema::compile(1, Arc::from(raw.as_str()))
                .map_err(|e| invalid(format!("schema: {e}")))?;
        }
        Ok(CreateTopic {
            name: self.name,
            partitions: partitions as u32,
            retention_ms,
            visibility_timeout_ms,
            max_in_flight_per_partition,
            max_acked_ahead_per_partition,
            created_at,
            owner: self.owner,
            schema: self.schema,
            parent,
        })
    }

    fn parent_link(&self, now_ms: u64, epoch: u64) -> Result<ParentLink, MetaError> {
        validate_topic_name(&self.parent)?;
        if self.parent == self.name {
            return Err(invalid("a topic cannot be its own parent"));
        }
        check_fanout_delay("fanout_delay_ms", self.fanout_delay_ms)?;
        Ok(ParentLink {
            name: self.parent.clone(),
            attach_epoch: format_epoch(epoch),
            fanout_delay_ms: self.fanout_delay_ms as u64,
            attached_at_ms: now_ms,
        })
    }
}

/// An attach epoch as stored and shown: 16 lowercase hex digits.
pub fn format_epoch(epoch: u64) -> String {
    format!("{epoch:016x}")
}

/// A fan-out delay (`field` as the caller named it) must be within
/// 0..=1 year.
pub(crate) fn check_fanout_delay(field: &str, delay_ms: i64) -> Result<(), MetaError> {
    if delay_ms < 0 {
        return Err(invalid(format!("{field} must be >= 0")));
    }
    if delay_ms as u64 > FANOUT_DELAY_MS_MAX {
        return Err(invalid(format!(
            "{field} ({delay_ms}) exceeds the maximum of {FANOUT_DELAY_MS_MAX} (1 year)"
        )));
    }
    Ok(())
}

/// The body of `POST /v1/topics/{parent}/children` (`{"child","delay_ms"}`),
/// with the parent from the path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttachChildRequest {
    /// The parent topic (from the path).
    pub parent: String,
    /// The topic to attach; required.
    pub child: String,
    /// Delivery delay after the parent's commit time, 0..=1 year.
    pub delay_ms: i64,
}

impl AttachChildRequest {
    /// Validates the request against the proposer's snapshot `state` (every
    /// rule of SPEC §1.5, so a refused attach changes nothing anywhere) and
    /// stamps the attach time (`now_ms`, Unix ms) and a new attach epoch
    /// (`epoch`, 64 random bits). Apply checks the same rules again.
    pub fn resolve(
        self,
        state: &MetaState,
        now_ms: u64,
        epoch: u64,
    ) -> Result<AttachChild, MetaError> {
        if self.child.is_empty() {
            return Err(invalid("child required"));
        }
        check_fanout_delay("delay_ms", self.delay_ms)?;
        let command = AttachChild {
            parent: self.parent,
            child: self.child,
            attach_epoch: format_epoch(epoch),
            fanout_delay_ms: self.delay_ms as u64,
            attached_at_ms: now_ms,
        };
        crate::apply::check_attach(state, &command)?;
        Ok(command)
    }
}

pub(crate) fn parent_not_found(parent: &str) -> MetaError {
    MetaError::NotFound(format!("topic not found: parent topic {parent:?}"))
}

/// The body of `PATCH /v1/topics/{topic}` (visibility is not alterable, so
/// it is not here: the HTTP layer refuses it as an unknown field).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlterTopicRequest {
    /// New partition count; 0 = unchanged; must grow.
    pub partitions: i64,
    /// New retention (0 = reset to default); `None` = unchanged.
    pub retention_ms: Option<i64>,
    /// New in-flight cap (0 = reset to default); `None` = unchanged.
    pub max_in_flight_per_partition: Option<i64>,
    /// New acked-ahead cap (0 = reset to default); `None` = unchanged.
    pub max_acked_ahead_per_partition: Option<i64>,
    /// A new schema version, as raw JSON text.
    pub schema: Option<String>,
}

impl AlterTopicRequest {
    /// Validates and resolves the request for topic `name`.
    pub fn resolve(self, name: &str, defaults: &TopicDefaults) -> Result<AlterTopic, MetaError> {
        if self.partitions < 0 {
            return Err(invalid("partitions must be > 0"));
        }
        if self.partitions == 0
            && self.retention_ms.is_none()
            && self.max_in_flight_per_partition.is_none()
            && self.max_acked_ahead_per_partition.is_none()
            && self.schema.is_none()
        {
            return Err(invalid(
                "at least one of partitions, retention_ms, max_*_per_partition, or schema is \
                 required",
            ));
        }
        let retention_ms = self
            .retention_ms
            .map(|v| defaulted(v, defaults.default_retention_age_ms, "retention_ms"))
            .transpose()?;
        if let Some(r) = retention_ms {
            check_retention_floor(r)?;
        }
        let max_in_flight_per_partition = self
            .max_in_flight_per_partition
            .map(|v| {
                defaulted(
                    v,
                    defaults.default_max_in_flight_per_partition,
                    "max_in_flight_per_partition",
                )
            })
            .transpose()?;
        let max_acked_ahead_per_partition = self
            .max_acked_ahead_per_partition
            .map(|v| {
                defaulted(
                    v,
                    defaults.default_max_acked_ahead_per_partition,
                    "max_acked_ahead_per_partition",
                )
            })
            .transpose()?;
        check_max_partitions(self.partitions, defaults)?;
        Ok(AlterTopic {
            name: name.to_owned(),
            retention_ms,
            max_in_flight_per_partition,
            max_acked_ahead_per_partition,
            partitions: (self.partitions > 0).then_some(self.partitions as u32),
            schema: self.schema,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(e: MetaError) -> String {
        assert_eq!(e.status(), 400, "{e}");
        e.to_string()
    }

    #[test]
    fn topic_names_follow_the_pattern() {
        for ok in ["a", "orders.v1", "A-b_c.9", &"x".repeat(255)] {
            validate_topic_name(ok).unwrap();
        }
        let cases = [
            ("", "invalid argument: name required"),
            (".", r#"invalid argument: topic name must not be ".""#),
            ("..", r#"invalid argument: topic name must not be "..""#),
            ("a/b", "invalid argument: topic name must match ^[A-Za-z0-9._-]{1,255}$"),
            ("or ders", "invalid argument: topic name must match ^[A-Za-z0-9._-]{1,255}$"),
            ("é", "invalid argument: topic name must match ^[A-Za-z0-9._-]{1,255}$"),
        ];
        for (name, text) in cases {
            assert_eq!(reason(validate_topic_name(name).unwrap_err()), text, "{name:?}");
        }
        let long = "x".repeat(256);
        assert!(reason(validate_topic_name(&long).unwrap_err()).contains("must match"));
    }

    #[test]
    fn list_limit_defaults_clamps_and_refuses() {
        assert_eq!(parse_list_limit(None).unwrap(), 100);
        assert_eq!(parse_list_limit(Some("")).unwrap(), 100);
        assert_eq!(parse_list_limit(Some("7")).unwrap(), 7);
        assert_eq!(parse_list_limit(Some("5000")).unwrap(), 1000);
        for bad in ["0", "-1", "x", "1.5", "99999999999999999999"] {
            assert_eq!(
                reason(parse_list_limit(Some(bad)).unwrap_err()),
                "invalid argument: limit must be a positive integer"
            );
        }
    }

    fn create(f: impl FnOnce(&mut CreateTopicRequest)) -> Result<CreateTopic, MetaError> {
        let mut req = CreateTopicRequest { name: "t".into(), ..Default::default() };
        f(&mut req);
        req.resolve(&TopicDefaults::default(), &MetaState::default(), 1_700_000_000_000, 0xab)
    }

    #[test]
    fn create_fills_every_default() {
        let c = create(|_| {}).unwrap();
        assert_eq!(c.partitions, 3);
        assert_eq!(c.retention_ms, 604_800_000);
        assert_eq!(c.visibility_timeout_ms, 30_000);
        assert_eq!((c.max_in_flight_per_partition, c.max_acked_ahead_per_partition), (1024, 1024));
        assert_eq!((c.created_at, c.parent, c.schema), (1_700_000_000, None, None));
    }

    #[test]
    fn create_keeps_explicit_values() {
        let c = create(|r| {
            r.partitions = 108;
            r.retention_ms = 3_600_000;
            r.visibility_timeout_ms = 1;
            r.max_in_flight_per_partition = 5;
            r.max_acked_ahead_per_partition = 6;
            r.owner = "bob".into();
        })
        .unwrap();
        assert_eq!((c.partitions, c.retention_ms, c.visibility_timeout_ms), (108, 3_600_000, 1));
        assert_eq!((c.max_in_flight_per_partition, c.max_acked_ahead_per_partition), (5, 6));
        assert_eq!(c.owner, "bob");
    }

    #[test]
    fn create_refuses_bad_numbers_with_spec_texts() {
        type Edit = fn(&mut CreateTopicRequest);
        let cases: [(Edit, &str); 9] = [
            (|r| r.partitions = 2, "invalid argument: partitions must be >= 3 (0 = use default)"),
            (|r| r.partitions = -1, "invalid argument: partitions must be >= 3 (0 = use default)"),
            (
                |r| r.partitions = 109,
                "invalid argument: partitions (109) exceeds topic.max_partitions (108)",
            ),
            (
                |r| r.retention_ms = -1,
                "invalid argument: retention_ms must be >= 0 (0 = use default)",
            ),
            (
                |r| r.retention_ms = 3_599_999,
                "invalid argument: retention_ms (3599999) is below the minimum of 3600000 (1 hour)",
            ),
            (
                |r| r.visibility_timeout_ms = -5,
                "invalid argument: visibility_timeout_ms must be >= 0 (0 = use default)",
            ),
            (
                |r| r.max_in_flight_per_partition = -1,
                "invalid argument: max_in_flight_per_partition must be >= 0 (0 = use default)",
            ),
            (
                |r| r.max_acked_ahead_per_partition = -1,
                "invalid argument: max_acked_ahead_per_partition must be >= 0 (0 = use default)",
            ),
            (|r| r.fanout_delay_ms = 10, "invalid argument: fanout_delay_ms requires parent"),
        ];
        for (edit, text) in cases {
            assert_eq!(reason(create(edit).unwrap_err()), text);
        }
    }

    #[test]
    fn create_refuses_schemas_that_do_not_compile() {
        let e = reason(create(|r| r.schema = Some("{nope".into())).unwrap_err());
        assert!(e.starts_with("invalid argument: schema: schema is not valid JSON"), "{e}");
        let e = reason(create(|r| r.schema = Some(r#"{"type":"nope"}"#.into())).unwrap_err());
        assert!(e.starts_with("invalid argument: schema: "), "{e}");
        let c = create(|r| r.schema = Some(r#"{"type":"object"}"#.into())).unwrap();
        assert_eq!(c.schema.as_deref(), Some(r#"{"type":"object"}"#));
    }

    #[test]
    fn create_as_child_checks_the_pair_and_the_parent() {
        let self_parent = create(|r| r.parent = "t".into()).unwrap_err();
        assert_eq!(reason(self_parent), "invalid argument: a topic cannot be its own parent");
        let negative = create(|r| {
            r.parent = "p".into();
            r.fanout_delay_ms = -1;
        });
        assert_eq!(reason(negative.unwrap_err()), "invalid argument: fanout_delay_ms must be >= 0");
        let too_long = create(|r| {
            r.parent = "p".into();
            r.fanout_delay_ms = 31_536_000_001;
        });
        assert_eq!(
            reason(too_long.unwrap_err()),
            "invalid argument: fanout_delay_ms (31536000001) exceeds the maximum of 31536000000 (1 year)"
        );
        let bad_name = create(|r| r.parent = "a b".into()).unwrap_err();
        assert!(reason(bad_name).contains("must match"));
        let missing = create(|r| r.parent = "p".into()).unwrap_err();
        assert_eq!(
            (missing.status(), missing.to_string()),
            (404, r#"topic not found: parent topic "p""#.into())
        );
    }

    fn alter(req: AlterTopicRequest) -> Result<AlterTopic, MetaError> {
        req.resolve("t", &TopicDefaults::default())
    }

    #[test]
    fn alter_needs_a_field_and_resets_zero_to_the_default() {
        let none = alter(AlterTopicRequest::default()).unwrap_err();
        assert_eq!(
            reason(none),
            "invalid argument: at least one of partitions, retention_ms, max_*_per_partition, or schema is required"
        );
        let a = alter(AlterTopicRequest {
            retention_ms: Some(0),
            max_in_flight_per_partition: Some(0),
            max_acked_ahead_per_partition: Some(9),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(a.retention_ms, Some(604_800_000));
        assert_eq!(a.max_in_flight_per_partition, Some(1024));
        assert_eq!(a.max_acked_ahead_per_partition, Some(9));
        assert_eq!((a.partitions, a.schema), (None, None));
    }

    #[test]
    fn alter_refuses_bad_numbers() {
        let cases = [
            (
                AlterTopicRequest { partitions: -1, ..Default::default() },
                "invalid argument: partitions must be > 0",
            ),
            (
                AlterTopicRequest { partitions: 200, ..Default::default() },
                "invalid argument: partitions (200) exceeds topic.max_partitions (108)",
            ),
            (
                AlterTopicRequest { retention_ms: Some(-1), ..Default::default() },
                "invalid argument: retention_ms must be >= 0 (0 = use default)",
            ),
            (
                AlterTopicRequest { retention_ms: Some(60_000), ..Default::default() },
                "invalid argument: retention_ms (60000) is below the minimum of 3600000 (1 hour)",
            ),
            (
                AlterTopicRequest { max_in_flight_per_partition: Some(-2), ..Default::default() },
                "invalid argument: max_in_flight_per_partition must be >= 0 (0 = use default)",
            ),
            (
                AlterTopicRequest { max_acked_ahead_per_partition: Some(-2), ..Default::default() },
                "invalid argument: max_acked_ahead_per_partition must be >= 0 (0 = use default)",
            ),
        ];
        for (req, text) in cases {
            assert_eq!(reason(alter(req).unwrap_err()), text);
        }
    }
}
