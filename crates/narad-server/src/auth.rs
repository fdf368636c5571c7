//! Authentication (SPEC §1.2): HTTP Basic credentials checked against the
//! bcrypt hashes in the metastore.
//!
//! A bcrypt verify costs ~100 ms of CPU, so it never runs on the async
//! threads (it goes to the blocking pool, at most one per core at a time)
//! and its verdicts are cached:
//!
//! * a verified credential is remembered per user until the users-domain
//!   version changes (any user change: a new password, new grants or a
//!   deletion applies at once);
//! * a wrong password is remembered for 60 s (also dropped when the
//!   version changes).
//!
//! The cache keeps no password: it keys verdicts by an HMAC-SHA256 tag of
//! username and password under a key drawn at start, and compares tags in
//! constant time. Failed attempts take a token from a per-username bucket
//! (5, +1 per 12 s); an empty bucket answers 429 before any verify. A
//! cached correct credential is still accepted while its user is throttled,
//! so an attacker guessing cannot lock out a client already signed in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use narad_meta::{MetaStore, User};
use ring::hmac;
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;
use tracing::{info, warn};

use crate::ratelimit::TokenBucket;

/// bcrypt cost of stored hashes.
pub const BCRYPT_COST: u32 = 10;
/// Failed attempts allowed in a burst, per username.
const FAIL_BURST: f64 = 5.0;
/// One more failed attempt is allowed every this often.
const FAIL_REFILL: Duration = Duration::from_secs(12);
/// How long a wrong password is remembered.
const WRONG_TTL: Duration = Duration::from_secs(60);
/// More entries than this in a cache map and the stale ones are dropped.
const CACHE_SOFT_MAX: usize = 10_000;

/// Why a request is not authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// 401: missing, unknown or wrong credentials.
    Unauthorized,
    /// 429: too many failed attempts for this username; retry after this.
    Throttled(Duration),
    /// 500: the verify could not run.
    Unavailable,
}

type Tag = [u8; 32];

#[derive(Debug, Default)]
struct Cache {
    users_version: u64,
    verified: HashMap<String, Tag>,
    wrong: HashMap<Tag, Instant>,
}

/// Verifies credentials; shared by every request.
pub struct Authenticator {
    meta: Arc<MetaStore>,
    key: hmac::Key,
    cache: Mutex<Cache>,
    failures: Mutex<HashMap<String, TokenBucket>>,
    verify_slots: Semaphore,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn fail_rate() -> f64 {
    1.0 / FAIL_REFILL.as_secs_f64()
}

/// A hash to verify against when the user does not exist, so an unknown
/// name costs as much as a wrong password.
fn dummy_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        bcrypt::hash("narad-no-such-user", BCRYPT_COST).expect("bcrypt hashes a fixed password")
    })
}

/// Hashes a password with bcrypt (blocking: call it off the async threads).
pub fn hash_password(password: &str) -> Result<String, String> {
    bcrypt::hash(password, BCRYPT_COST).map_err(|e| format!("cannot hash password: {e}"))
}

/// Runs `f` on the blocking pool.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

/// 18 random bytes as 24 URL-safe base64 characters.
pub fn random_password() -> Result<String, String> {
    use base64::Engine;
    let mut bytes = [0u8; 18];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a password: {e}"))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

impl Authenticator {
    /// An authenticator over the users of `meta`.
    pub fn new(meta: Arc<MetaStore>) -> Result<Authenticator, String> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| format!("no randomness for the auth cache: {e}"))?;
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Ok(Authenticator {
            meta,
            key: hmac::Key::new(hmac::HMAC_SHA256, &key),
            cache: Mutex::new(Cache::default()),
            failures: Mutex::new(HashMap::new()),
            verify_slots: Semaphore::new(cores),
        })
    }

    fn tag(&self, username: &str, password: &str) -> Tag {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(&(username.len() as u64).to_le_bytes());
        ctx.update(username.as_bytes());
        ctx.update(password.as_bytes());
        let mut tag = [0u8; 32];
        tag.copy_from_slice(ctx.sign().as_ref());
        tag
    }

    /// The user these credentials belong to.
    pub async fn authenticate(
        &self,
        username: &str,
        password: &str,
    ) -> Result<Arc<User>, AuthError> {
        let snapshot = self.meta.snapshot();
        let version = snapshot.versions().users;
        let user = snapshot.user(username).cloned();
        let tag = self.tag(username, password);
        let now = Instant::now();
        let cached_wrong = {
            let mut cache = lock(&self.cache);
            if cache.users_version != version {
                *cache = Cache { users_version: version, ..Cache::default() };
            }
            if let (Some(user), Some(known)) = (&user, cache.verified.get(username))
                && bool::from(known[..].ct_eq(&tag[..]))
            {
                return Ok(user.clone());
            }
            cache.wrong.get(&tag).is_some_and(|at| now.duration_since(*at) < WRONG_TTL)
        };
        self.check_throttle(username, now)?;
        let ok = if cached_wrong { false } else { self.verify(user.as_deref(), password).await? };
        let mut cache = lock(&self.cache);
        if !ok {
            if cache.users_version == version {
                if cache.wrong.len() >= CACHE_SOFT_MAX {
                    cache.wrong.retain(|_, at| now.duration_since(*at) < WRONG_TTL);
                }
                if cache.wrong.len() < CACHE_SOFT_MAX {
                    cache.wrong.insert(tag, now);
                }
            }
            drop(cache);
            self.record_failure(username, now);
            info!(user = username, "authentication failed");
            return Err(AuthError::Unauthorized);
        }
        let user = user.ok_or(AuthError::Unauthorized)?;
        if cache.users_version == version {
            if cache.verified.len() >= CACHE_SOFT_MAX {
                cache.verified.clear();
            }
            cache.verified.insert(username.to_owned(), tag);
        }
        Ok(user)
    }

    async fn verify(&self, user: Option<&User>, password: &str) -> Result<bool, AuthError> {
        let _slot = self.verify_slots.acquire().await.map_err(|_| AuthError::Unavailable)?;
        let hash = user.map(|u| u.password_hash.clone());
        let password = password.to_owned();
        let outcome = blocking(move || match hash {
            Some(h) => bcrypt::verify(password, &h).map_err(|e| e.to_string()),
            None => {
                let _ = bcrypt::verify(password, dummy_hash());
                Ok(false)
            }
        })
        .await
        .ok_or(AuthError::Unavailable)?;
        outcome.map_err(|e| {
            warn!(error = %e, "password verify failed");
            AuthError::Unavailable
        })
    }

    fn check_throttle(&self, username: &str, now: Instant) -> Result<(), AuthError> {
        let mut failures = lock(&self.failures);
        match failures.get_mut(username) {
            Some(bucket) => bucket.peek(fail_rate(), FAIL_BURST, now).map_err(|wait| {
                warn!(user = username, "authentication throttled");
                AuthError::Throttled(wait)
            }),
            None => Ok(()),
        }
    }

    fn record_failure(&self, username: &str, now: Instant) {
        let mut failures = lock(&self.failures);
        if failures.len() >= CACHE_SOFT_MAX {
            failures.retain(|_, b| !b.is_full(fail_rate(), FAIL_BURST, now));
        }
        let bucket = failures
            .entry(username.to_owned())
            .or_insert_with(|| TokenBucket::full(FAIL_BURST, now));
        let _ = bucket.take(fail_rate(), FAIL_BURST, now);
    }
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

/// Decodes `Authorization: Basic base64(user:password)`.
pub fn basic_credentials(header: Option<&axum::http::HeaderValue>) -> Option<(String, String)> {
    use base64::Engine;
    let value = header?.to_str().ok()?;
    let (scheme, rest) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(rest.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn basic_credentials_decode() {
        let h = HeaderValue::from_static("Basic Ym9iOnA6dw=="); // bob:p:w
        assert_eq!(basic_credentials(Some(&h)), Some(("bob".into(), "p:w".into())));
        let h = HeaderValue::from_static("basic Ym9iOg==");
        assert_eq!(basic_credentials(Some(&h)), Some(("bob".into(), String::new())));
        for bad in ["Bearer x", "Basic !!!", "Basic Ym9i"] {
            assert_eq!(basic_credentials(Some(&HeaderValue::from_static(bad))), None, "{bad}");
        }
        assert_eq!(basic_credentials(None), None);
    }

    #[test]
    fn random_passwords_are_long_and_differ() {
        let (a, b) = (random_password().unwrap(), random_password().unwrap());
        assert_eq!(a.len(), 24);
        assert_ne!(a, b);
    }
}
