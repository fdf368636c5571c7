//! Users and grants (SPEC §1.2, §1.9): the record the metastore keeps, the
//! rules a grant must follow, and what a set of grants allows.
//!
//! A grant is an action (`produce`, `consume`, `create`, `admin`) and, for
//! the scoped actions, one or more topic patterns: a literal name, or a
//! prefix followed by `*` (`*` alone matches every topic). `admin` takes no
//! pattern and allows everything; the root user is always an admin, cannot
//! be deleted and keeps its grants.
//!
//! Password hashes (bcrypt) are computed by the proposer and carried in the
//! commands; the metastore stores them and never returns them.

use serde::{Deserialize, Serialize};

use crate::error::MetaError;
use crate::limits::{PATTERN_LEN_MAX, USERNAME_LEN_MAX};

/// The name of the root user seeded at first start.
pub const ROOT_USERNAME: &str = "admin";

/// What a grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Produce to matching topics.
    Produce,
    /// Consume from, ack, extend and nack on matching topics.
    Consume,
    /// Create topics with matching names.
    Create,
    /// Everything, on every topic, and the users API.
    Admin,
}

impl Action {
    /// The action as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Produce => "produce",
            Action::Consume => "consume",
            Action::Create => "create",
            Action::Admin => "admin",
        }
    }
}

/// One grant: an action and, for scoped actions, the topic patterns it
/// covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// The action.
    pub action: Action,
    /// Topic patterns (`name`, `prefix*`, `*`); none for `admin`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patterns: Vec<String>,
}

/// One user, as the metastore holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    /// `^[A-Za-z0-9._-]{1,64}$`.
    pub username: String,
    /// The bcrypt hash of the password (never returned by the API).
    pub password_hash: String,
    /// What the user may do (root: always admin, whatever this says).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<Grant>,
    /// The root user: undeletable, grants immutable, always admin.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub root: bool,
    /// Creation time, Unix ms (from the proposer's clock).
    pub created_at_ms: i64,
    /// Last change, Unix ms (from the proposer's clock).
    pub updated_at_ms: i64,
}

/// The user JSON of SPEC §1.9 (the hash is never part of it).
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = User))]
pub struct UserJson<'a> {
    username: &'a str,
    #[serde(skip_serializing_if = "<[Grant]>::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Grant>))]
    grants: &'a [Grant],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    root: bool,
    created_at_ms: i64,
    updated_at_ms: i64,
}

impl User {
    /// The user as the API shows it.
    pub fn json(&self) -> UserJson<'_> {
        UserJson {
            username: &self.username,
            grants: &self.grants,
            root: self.root,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
        }
    }

    /// Whether the user is an admin (root, or holds an `admin` grant).
    pub fn is_admin(&self) -> bool {
        self.root || self.grants.iter().any(|g| g.action == Action::Admin)
    }

    /// Whether the user may do `action` on `topic`. Admins may do anything.
    pub fn may(&self, action: Action, topic: &str) -> bool {
        self.is_admin()
            || self
                .grants
                .iter()
                .any(|g| g.action == action && g.patterns.iter().any(|p| pattern_matches(p, topic)))
    }

    /// Whether this user may hand out `grant` (SPEC §1.2 delegation): only
    /// root grants `admin`; admins grant any scoped grant; others only
    /// grants covered by their own.
    pub fn may_delegate(&self, grant: &Grant) -> bool {
        if self.root {
            return true;
        }
        if grant.action == Action::Admin {
            return false;
        }
        self.is_admin()
            || grant.patterns.iter().all(|wanted| {
                self.grants.iter().any(|g| {
                    g.action == grant.action && g.patterns.iter().any(|p| pattern_covers(p, wanted))
                })
            })
    }
}

fn invalid(msg: impl Into<String>) -> MetaError {
    MetaError::Invalid(msg.into())
}

fn name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// Checks a username: `^[A-Za-z0-9._-]{1,64}$`.
pub fn validate_username(name: &str) -> Result<(), MetaError> {
    if name.is_empty() {
        return Err(invalid("username required"));
    }
    if name.len() > USERNAME_LEN_MAX || !name.bytes().all(name_char) {
        return Err(invalid("username must match ^[A-Za-z0-9._-]{1,64}$"));
    }
    Ok(())
}

/// Checks a topic pattern: `^[A-Za-z0-9._-]{0,255}\*?$`, and not empty.
fn validate_pattern(p: &str) -> Result<(), String> {
    let body = p.strip_suffix('*').unwrap_or(p);
    if p.is_empty() || body.len() > PATTERN_LEN_MAX || !body.bytes().all(name_char) {
        return Err(format!("invalid pattern {p:?}: must match ^[A-Za-z0-9._-]{{0,255}}\\*?$"));
    }
    Ok(())
}

/// Checks a set of grants: scoped actions need at least one valid pattern,
/// `admin` takes none.
pub fn validate_grants(grants: &[Grant]) -> Result<(), MetaError> {
    for g in grants {
        match g.action {
            Action::Admin if !g.patterns.is_empty() => {
                return Err(invalid("invalid grant: admin takes no patterns"));
            }
            Action::Admin => {}
            a if g.patterns.is_empty() => {
                return Err(invalid(format!(
                    "invalid grant: {} needs at least one pattern",
                    a.as_str()
                )));
            }
            _ => {
                for p in &g.patterns {
                    validate_pattern(p).map_err(|e| invalid(format!("invalid grant: {e}")))?;
                }
            }
        }
    }
    Ok(())
}

/// Whether `pattern` matches the topic `name`: `*` matches all, `p*`
/// matches names starting with `p`, anything else only itself.
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Whether holding `held` covers handing out `wanted`: a wildcard covers
/// every literal and wildcard under its prefix, a literal only itself.
pub fn pattern_covers(held: &str, wanted: &str) -> bool {
    match (held.strip_suffix('*'), wanted.strip_suffix('*')) {
        (Some(h), Some(w)) => w.starts_with(h),
        (Some(h), None) => wanted.starts_with(h),
        (None, Some(_)) => false,
        (None, None) => held == wanted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(action: Action, patterns: &[&str]) -> Grant {
        Grant { action, patterns: patterns.iter().map(|p| p.to_string()).collect() }
    }

    fn user(grants: Vec<Grant>) -> User {
        User {
            username: "u".into(),
            password_hash: "h".into(),
            grants,
            root: false,
            created_at_ms: 1,
            updated_at_ms: 1,
        }
    }

    #[test]
    fn patterns_match_literals_prefixes_and_everything() {
        assert!(pattern_matches("*", "anything"));
        assert!(pattern_matches("orders*", "orders"));
        assert!(pattern_matches("orders*", "orders.eu"));
        assert!(!pattern_matches("orders*", "order"));
        assert!(pattern_matches("orders", "orders"));
        assert!(!pattern_matches("orders", "orders.eu"));
    }

    #[test]
    fn a_wildcard_covers_what_lies_under_its_prefix_and_a_literal_only_itself() {
        assert!(pattern_covers("p*", "p"));
        assert!(pattern_covers("p*", "pq"));
        assert!(pattern_covers("p*", "pq*"));
        assert!(pattern_covers("*", "x*"));
        assert!(!pattern_covers("pq*", "p*"));
        assert!(!pattern_covers("p", "p*"));
        assert!(pattern_covers("p", "p"));
        assert!(!pattern_covers("p", "q"));
    }

    #[test]
    fn grant_rules_name_the_problem() {
        validate_grants(&[grant(Action::Admin, &[]), grant(Action::Produce, &["a*", "*"])])
            .unwrap();
        let e = validate_grants(&[grant(Action::Admin, &["x"])]).unwrap_err();
        assert_eq!(e.to_string(), "invalid argument: invalid grant: admin takes no patterns");
        let e = validate_grants(&[grant(Action::Consume, &[])]).unwrap_err();
        assert!(e.to_string().contains("consume needs at least one pattern"), "{e}");
        for bad in ["", "a*b", "a b", "**", &"x".repeat(256)] {
            assert_eq!(
                validate_grants(&[grant(Action::Create, &[bad])]).unwrap_err().status(),
                400
            );
        }
        validate_grants(&[grant(Action::Create, &[&"x".repeat(255)])]).unwrap();
    }

    #[test]
    fn usernames_follow_the_pattern() {
        validate_username("a.b_c-1").unwrap();
        validate_username(&"u".repeat(64)).unwrap();
        for bad in ["", "a b", "a/b", &"u".repeat(65)] {
            assert_eq!(validate_username(bad).unwrap_err().status(), 400, "{bad:?}");
        }
    }

    #[test]
    fn what_grants_allow() {
        let u = user(vec![grant(Action::Produce, &["orders*"]), grant(Action::Consume, &["x"])]);
        assert!(u.may(Action::Produce, "orders.eu"));
        assert!(!u.may(Action::Consume, "orders.eu"));
        assert!(u.may(Action::Consume, "x"));
        assert!(!u.may(Action::Create, "x"));
        assert!(!u.is_admin());
        let admin = user(vec![grant(Action::Admin, &[])]);
        assert!(admin.is_admin() && admin.may(Action::Create, "anything"));
        let root = User { root: true, ..user(Vec::new()) };
        assert!(root.is_admin() && root.may(Action::Consume, "t"));
    }

    #[test]
    fn delegation_follows_spec() {
        let root = User { root: true, ..user(Vec::new()) };
        let admin = user(vec![grant(Action::Admin, &[])]);
        let scoped = user(vec![grant(Action::Produce, &["p*"])]);
        let give_admin = grant(Action::Admin, &[]);
        assert!(root.may_delegate(&give_admin));
        assert!(!admin.may_delegate(&give_admin), "only root grants admin");
        assert!(admin.may_delegate(&grant(Action::Consume, &["*"])));
        assert!(scoped.may_delegate(&grant(Action::Produce, &["pa", "pb*"])));
        assert!(!scoped.may_delegate(&grant(Action::Produce, &["q"])));
        assert!(!scoped.may_delegate(&grant(Action::Consume, &["pa"])));
        assert!(!scoped.may_delegate(&grant(Action::Produce, &["*"])));
    }

    #[test]
    fn user_json_never_shows_the_hash() {
        let u = user(vec![grant(Action::Produce, &["a"])]);
        let s = serde_json::to_string(&u.json()).unwrap();
        assert_eq!(
            s,
            r#"{"username":"u","grants":[{"action":"produce","patterns":["a"]}],"created_at_ms":1,"updated_at_ms":1}"#
        );
        let root = User { root: true, grants: vec![grant(Action::Admin, &[])], ..u };
        let s = serde_json::to_string(&root.json()).unwrap();
        assert_eq!(
            s,
            r#"{"username":"u","grants":[{"action":"admin"}],"root":true,"created_at_ms":1,"updated_at_ms":1}"#
        );
    }
}
