//! The root user's seeding (security on): on a single node before it
//! listens, on a cluster node once a leader is visible
//! ([`crate::cluster_node::ClusterNode::seed_root_when_led`]), and the
//! password hashing it needs, which the HTTP API's user routes use too.

use tracing::{info, warn};

use narad_meta::MetaStore;

/// bcrypt cost of stored hashes.
pub const BCRYPT_COST: u32 = 10;
/// bcrypt reads at most this many bytes of a password; longer ones are
/// refused rather than silently truncated.
pub const PASSWORD_BYTES_MAX: usize = 72;
/// 400 text for a password over [`PASSWORD_BYTES_MAX`].
pub const PASSWORD_TOO_LONG: &str = "password longer than 72 bytes";

/// Refuses a password bcrypt would truncate (the 400 of create and change).
pub fn check_password_len(password: &str) -> Result<(), &'static str> {
    if password.len() > PASSWORD_BYTES_MAX { Err(PASSWORD_TOO_LONG) } else { Ok(()) }
}

/// Hashes a password with bcrypt (blocking: call it off the async threads).
/// A password over 72 bytes is refused, never truncated.
pub fn hash_password(password: &str) -> Result<String, String> {
    check_password_len(password).map_err(str::to_owned)?;
    bcrypt::hash(password, BCRYPT_COST).map_err(|e| format!("cannot hash password: {e}"))
}

/// 18 random bytes as 24 URL-safe base64 characters.
pub fn random_password() -> Result<String, String> {
    use base64::Engine;
    let mut bytes = [0u8; 18];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a password: {e}"))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// Seeds the root user `admin` when there is none (blocking: it hashes).
/// The password is `admin_password`, else a random one that is logged once
/// at WARN. Returns whether a root was seeded.
pub fn seed_root(meta: &MetaStore, admin_password: Option<&str>) -> Result<bool, String> {
    if meta.snapshot().has_root() {
        return Ok(false);
    }
    let (password, generated) = match admin_password {
        Some(p) => (p.to_owned(), false),
        None => (random_password()?, true),
    };
    let hash = hash_password(&password)?;
    meta.seed_root_user(hash).map_err(|e| format!("cannot seed the root user: {e}"))?;
    if generated {
        warn!(
            component = "audit",
            event = "user.seed_root",
            actor = "system",
            target = narad_meta::ROOT_USERNAME,
            password = %password,
            "seeded the root user with a generated password (shown once: change it with \
             'narad user passwd admin')"
        );
    } else {
        info!(
            component = "audit",
            event = "user.seed_root",
            actor = "system",
            target = narad_meta::ROOT_USERNAME,
            "seeded the root user with NARAD_ADMIN_PASSWORD"
        );
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_over_72_bytes_are_refused_not_truncated() {
        assert!(check_password_len(&"p".repeat(72)).is_ok());
        assert_eq!(check_password_len(&"p".repeat(73)), Err(PASSWORD_TOO_LONG));
        assert_eq!(hash_password(&"p".repeat(73)).unwrap_err(), PASSWORD_TOO_LONG);
    }

    #[test]
    fn random_passwords_are_long_and_differ() {
        let (a, b) = (random_password().unwrap(), random_password().unwrap());
        assert_eq!(a.len(), 24);
        assert_ne!(a, b);
    }
}
