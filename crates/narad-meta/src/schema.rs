//! JSON Schemas: compiling them, the validator handed to the produce path,
//! a topic's version history, and the backward-compatibility rule of
//! SPEC §1.4.
//!
//! A schema is kept as the raw text the user sent (version 1, 2, …); only the
//! latest version is compiled. Compatibility looks at the top level only:
//! `properties` and `required`.
//!
//! # Patterns
//! `pattern` and `patternProperties` are matched with the `regex` crate, a
//! linear-time engine (as Narad's RE2): a payload's validation costs time
//! proportional to its size, whatever the pattern. A schema whose pattern
//! that engine cannot compile (backreferences, look-around) is refused at
//! create and alter (400), and each compiled pattern is bounded
//! ([`PATTERN_SIZE_LIMIT`], [`PATTERN_DFA_LIMIT`]). A schema stored by an
//! earlier version with such a pattern still loads, with the backtracking
//! engine bounded to [`STORED_BACKTRACK_LIMIT`] steps per match (a match
//! over it fails validation).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use jsonschema::PatternOptions;
use serde_json::Value;

/// The most memory one compiled schema pattern may take.
pub const PATTERN_SIZE_LIMIT: usize = 1 << 20;
/// The most memory the lazy DFA of one schema pattern may cache.
pub const PATTERN_DFA_LIMIT: usize = 2 << 20;
/// The backtracking bound of a stored pattern the linear engine refuses.
pub const STORED_BACKTRACK_LIMIT: usize = 10_000;

/// A compiled schema version, ready to validate payloads. Shared (`Arc`) by
/// the state snapshot and the produce path.
pub struct CompiledSchema {
    version: u32,
    raw: Arc<str>,
    validator: jsonschema::Validator,
}

impl fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledSchema").field("version", &self.version).finish_non_exhaustive()
    }
}

impl CompiledSchema {
    /// Compiles `raw` as version `version`; the error is the reason, without
    /// the `schema: ` prefix.
    /// Patterns must compile with the linear-time engine.
    pub fn compile(version: u32, raw: Arc<str>) -> Result<CompiledSchema, String> {
        let doc: Value =
            serde_json::from_str(&raw).map_err(|e| format!("schema is not valid JSON: {e}"))?;
        let validator = jsonschema::options()
            .with_pattern_options(
                PatternOptions::regex()
                    .size_limit(PATTERN_SIZE_LIMIT)
                    .dfa_size_limit(PATTERN_DFA_LIMIT),
            )
            .build(&doc)
            .map_err(|e| e.to_string())?;
        Ok(CompiledSchema { version, raw, validator })
    }

    /// Compiles a stored schema: as [`compile`](Self::compile), or, for a
    /// pattern only the backtracking engine reads (stored before patterns
    /// had to be linear), with that engine bounded to
    /// [`STORED_BACKTRACK_LIMIT`] steps per match.
    fn compile_stored(version: u32, raw: Arc<str>) -> Result<CompiledSchema, String> {
        let linear = match CompiledSchema::compile(version, raw.clone()) {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        let doc: Value =
            serde_json::from_str(&raw).map_err(|e| format!("schema is not valid JSON: {e}"))?;
        let validator = jsonschema::options()
            .with_pattern_options(
                PatternOptions::fancy_regex().backtrack_limit(STORED_BACKTRACK_LIMIT),
            )
            .build(&doc)
            .map_err(|e| e.to_string())?;
        tracing::warn!(
            reason = %linear,
            "a stored schema has a pattern the linear-time engine refuses; it is matched with \
             a bounded backtracking engine (alter the schema to remove it)"
        );
        Ok(CompiledSchema { version, raw, validator })
    }

    /// The version number (1 = the first schema of the topic).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The schema text as the user sent it.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// Checks a produce payload: it must be JSON and valid against this
    /// schema. The error is the reason a 400 shows as
    /// `invalid argument: schema: <reason>`.
    pub fn validate_payload(&self, payload: &[u8]) -> Result<(), String> {
        let instance: Value = serde_json::from_slice(payload)
            .map_err(|e| format!("payload is not valid JSON: {e}"))?;
        self.validator.validate(&instance).map_err(|e| {
            let at = e.instance_path().as_str();
            if at.is_empty() { e.to_string() } else { format!("at {at}: {e}") }
        })
    }
}

/// The schema versions of one topic, oldest first, and the compiled latest.
#[derive(Debug, Clone)]
pub struct SchemaHistory {
    versions: Vec<Arc<str>>,
    latest: Arc<CompiledSchema>,
}

impl PartialEq for SchemaHistory {
    fn eq(&self, other: &Self) -> bool {
        self.versions == other.versions
    }
}

impl SchemaHistory {
    /// A history holding `versions` (non-empty), compiling the last one.
    pub(crate) fn from_versions(versions: Vec<Arc<str>>) -> Result<SchemaHistory, String> {
        let last = versions.last().ok_or("a schema history needs at least one version")?;
        let latest = CompiledSchema::compile_stored(versions.len() as u32, last.clone())?;
        Ok(SchemaHistory { versions, latest: Arc::new(latest) })
    }

    /// This history plus `next`, already compiled as the next version.
    pub(crate) fn with_next(&self, next: CompiledSchema) -> SchemaHistory {
        assert_eq!(next.version as usize, self.versions.len() + 1, "schema versions are dense");
        let mut versions = self.versions.clone();
        versions.push(next.raw.clone());
        SchemaHistory { versions, latest: Arc::new(next) }
    }

    /// The first history of a topic: `first` as version 1.
    pub(crate) fn first(first: CompiledSchema) -> SchemaHistory {
        assert_eq!(first.version, 1, "a topic's first schema is version 1");
        SchemaHistory { versions: vec![first.raw.clone()], latest: Arc::new(first) }
    }

    /// Every version's text; index 0 is version 1.
    pub fn versions(&self) -> &[Arc<str>] {
        &self.versions
    }

    /// The compiled latest version.
    pub fn latest(&self) -> &Arc<CompiledSchema> {
        &self.latest
    }
}

/// The `type` of a property: any type (no `type` keyword), or a set.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TypeSet {
    Any,
    Only(BTreeSet<String>),
}

impl TypeSet {
    fn of(property: &Value) -> TypeSet {
        match property {
            Value::Bool(false) => TypeSet::Only(BTreeSet::new()),
            Value::Object(o) => match o.get("type") {
                Some(Value::String(s)) => TypeSet::Only(BTreeSet::from([s.clone()])),
                Some(Value::Array(a)) => {
                    TypeSet::Only(a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                }
                _ => TypeSet::Any,
            },
            _ => TypeSet::Any,
        }
    }

    /// Whether every value of `self`'s types is also one of `wider`'s
    /// (`number` covers `integer`).
    fn within(&self, wider: &TypeSet) -> bool {
        match (self, wider) {
            (_, TypeSet::Any) => true,
            (TypeSet::Any, TypeSet::Only(_)) => false,
            (TypeSet::Only(old), TypeSet::Only(new)) => {
                old.iter().all(|t| new.contains(t) || (t == "integer" && new.contains("number")))
            }
        }
    }
}

impl fmt::Display for TypeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TypeSet::Any => f.write_str("any type"),
            TypeSet::Only(set) => {
                let names: Vec<&str> = set.iter().map(String::as_str).collect();
                write!(f, "[{}]", names.join(", "))
            }
        }
    }
}

/// The top level of a schema that compatibility looks at.
struct TopLevel {
    properties: BTreeMap<String, TypeSet>,
    required: BTreeSet<String>,
}

impl TopLevel {
    fn of(raw: &str) -> Result<TopLevel, String> {
        let doc: Value =
            serde_json::from_str(raw).map_err(|e| format!("schema is not valid JSON: {e}"))?;
        let properties = doc
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.iter().map(|(k, v)| (k.clone(), TypeSet::of(v))).collect())
            .unwrap_or_default();
        let required = doc
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default();
        Ok(TopLevel { properties, required })
    }
}

/// Checks that `new` may follow `old` (version `old_version`): no top-level
/// property removed, no property's type set narrowed, no required property
/// dropped, no new required property. The error is the reason.
pub fn check_backward_compatible(old_version: u32, old: &str, new: &str) -> Result<(), String> {
    let (old, new) = (TopLevel::of(old)?, TopLevel::of(new)?);
    let fail =
        |why: String| Err(format!("not backward compatible with version {old_version}: {why}"));
    for (name, old_types) in &old.properties {
        match new.properties.get(name) {
            None => return fail(format!("property {name:?} was removed")),
            Some(new_types) if !old_types.within(new_types) => {
                return fail(format!(
                    "property {name:?} type narrowed from {old_types} to {new_types}"
                ));
            }
            Some(_) => {}
        }
    }
    if let Some(name) = old.required.difference(&new.required).next() {
        return fail(format!("required property {name:?} is no longer required"));
    }
    if let Some(name) = new.required.difference(&old.required).next() {
        return fail(format!("new required property {name:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compat(old: &str, new: &str) -> Result<(), String> {
        check_backward_compatible(1, old, new)
    }

    #[test]
    fn adding_an_optional_property_is_compatible() {
        compat(
            r#"{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}"#,
            r#"{"type":"object","properties":{"a":{"type":"string"},"b":{}},"required":["a"]}"#,
        )
        .unwrap();
    }

    #[test]
    fn widening_a_type_set_is_compatible() {
        compat(
            r#"{"properties":{"a":{"type":"string"},"n":{"type":"integer"}}}"#,
            r#"{"properties":{"a":{"type":["string","null"]},"n":{"type":"number"}}}"#,
        )
        .unwrap();
        compat(r#"{"properties":{"a":{"type":"string"}}}"#, r#"{"properties":{"a":{}}}"#).unwrap();
    }

    #[test]
    fn removing_a_property_is_refused() {
        let e = compat(r#"{"properties":{"a":{}, "b":{}}}"#, r#"{"properties":{"a":{}}}"#);
        assert_eq!(
            e.unwrap_err(),
            r#"not backward compatible with version 1: property "b" was removed"#
        );
    }

    #[test]
    fn narrowing_a_type_is_refused() {
        let e = compat(
            r#"{"properties":{"a":{"type":["string","null"]}}}"#,
            r#"{"properties":{"a":{"type":"string"}}}"#,
        );
        assert_eq!(
            e.unwrap_err(),
            r#"not backward compatible with version 1: property "a" type narrowed from [null, string] to [string]"#
        );
        let from_any =
            compat(r#"{"properties":{"a":{}}}"#, r#"{"properties":{"a":{"type":"string"}}}"#);
        assert!(from_any.unwrap_err().contains("from any type to [string]"));
        let number_to_integer = compat(
            r#"{"properties":{"a":{"type":"number"}}}"#,
            r#"{"properties":{"a":{"type":"integer"}}}"#,
        );
        assert!(number_to_integer.is_err());
    }

    #[test]
    fn required_set_may_neither_shrink_nor_grow() {
        let props = r#""properties":{"a":{},"b":{}}"#;
        let dropped = compat(
            &format!(r#"{{{props},"required":["a","b"]}}"#),
            &format!(r#"{{{props},"required":["a"]}}"#),
        );
        assert!(dropped.unwrap_err().contains(r#"required property "b" is no longer required"#));
        let added = compat(
            &format!(r#"{{{props},"required":["a"]}}"#),
            &format!(r#"{{{props},"required":["a","b"]}}"#),
        );
        assert!(added.unwrap_err().contains(r#"new required property "b""#));
        let added_new_property = compat(
            r#"{"properties":{"a":{}}}"#,
            r#"{"properties":{"a":{},"c":{}},"required":["c"]}"#,
        );
        assert!(added_new_property.unwrap_err().contains(r#"new required property "c""#));
    }

    #[test]
    fn schemas_without_properties_are_compatible_with_each_other() {
        compat("true", r#"{"type":"object"}"#).unwrap();
        compat(r#"{"type":"object"}"#, r#"{"properties":{"x":{}}}"#).unwrap();
    }

    #[test]
    fn compile_rejects_invalid_json_and_invalid_schemas() {
        let bad_json = CompiledSchema::compile(1, "{".into()).unwrap_err();
        assert!(bad_json.starts_with("schema is not valid JSON"), "{bad_json}");
        CompiledSchema::compile(1, r#"{"type": 12}"#.into()).unwrap_err();
        CompiledSchema::compile(1, r#"{"minLength": -1}"#.into()).unwrap_err();
    }

    #[test]
    fn remote_references_do_not_compile() {
        let e = CompiledSchema::compile(1, r#"{"$ref":"https://example.com/s.json"}"#.into());
        assert!(e.is_err());
    }

    #[test]
    fn payload_validation_gives_a_reason() {
        let s = CompiledSchema::compile(
            1,
            r#"{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]}"#.into(),
        )
        .unwrap();
        s.validate_payload(br#"{"id": 4}"#).unwrap();
        let not_json = s.validate_payload(b"hello").unwrap_err();
        assert!(not_json.starts_with("payload is not valid JSON"), "{not_json}");
        let missing = s.validate_payload(b"{}").unwrap_err();
        assert!(missing.contains("id"), "{missing}");
        let wrong_type = s.validate_payload(br#"{"id":"x"}"#).unwrap_err();
        assert!(wrong_type.starts_with("at /id: "), "{wrong_type}");
    }

    #[test]
    fn history_grows_one_version_at_a_time() {
        let h = SchemaHistory::first(CompiledSchema::compile(1, "{}".into()).unwrap());
        let h2 = h.with_next(CompiledSchema::compile(2, "true".into()).unwrap());
        assert_eq!(h2.versions().len(), 2);
        assert_eq!(h2.latest().version(), 2);
        assert_eq!(h2.latest().raw(), "true");
        let rebuilt = SchemaHistory::from_versions(h2.versions().to_vec()).unwrap();
        assert_eq!(rebuilt, h2);
    }

    #[test]
    fn patterns_must_compile_with_the_linear_engine() {
        let backref = r#"{"items":{"type":"string","pattern":"(a*)*\\1b"}}"#;
        let e = CompiledSchema::compile(1, backref.into()).unwrap_err();
        assert!(e.contains(r#"is not a "regex""#), "{e}");
        let look = r#"{"patternProperties":{"^(?=x)":{}}}"#;
        CompiledSchema::compile(1, look.into()).unwrap_err();
        // A schema stored before the rule still loads, bounded.
        let stored = CompiledSchema::compile_stored(1, backref.into()).unwrap();
        let long = format!(r#"["{}c"]"#, "a".repeat(5_000));
        assert!(stored.validate_payload(long.as_bytes()).is_err());
    }

    #[test]
    fn a_pattern_catastrophic_for_backtracking_is_matched_in_linear_time() {
        let s = CompiledSchema::compile(1, r#"{"pattern":"^(a+)+$"}"#.into()).unwrap();
        let evil = format!(r#""{}b""#, "a".repeat(100_000));
        let started = std::time::Instant::now();
        assert!(s.validate_payload(evil.as_bytes()).is_err());
        assert!(s.validate_payload(format!(r#""{}""#, "a".repeat(100_000)).as_bytes()).is_ok());
        // Backtracking would take longer than the universe; linear is
        // milliseconds. The bound is loose on purpose.
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }
}
