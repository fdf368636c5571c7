//! Authentication (SPEC §1.2): HTTP Basic credentials checked against the
//! bcrypt hashes in the metastore.
//!
//! A bcrypt verify costs ~100 ms of CPU, so it never runs on the async
//! threads: it goes to the blocking pool, at most one per core at a time,
//! and at most [`VERIFY_QUEUE_MAX`] more wait for a slot (beyond that the
//! request is answered 503 at once, so unauthenticated callers cannot
//! queue unbounded work). Verdicts are cached:
//!
//! * a verified credential is remembered per user for as long as that
//!   user's password hash is unchanged (grants are read from the current
//!   snapshot on every request, so a grant change or a deletion applies at
//!   once, and another user's change leaves the cache alone);
//! * a wrong password is remembered for 60 s.
//!
//! The cache keeps no password: it keys verdicts by an HMAC-SHA256 tag of
//! username, stored hash and password under a key drawn at start, and
//! compares tags in constant time; a new hash changes every tag.
//!
//! # The failed-password throttle
//!
//! A verify needs a token from two buckets: one per (username, client
//! address) (5, +1 per 12 s) and one per client address over every
//! username (20, +1 per 3 s). Both are taken *before* the verify (so
//! parallel guesses cannot all be verified) and given back when it
//! succeeds. An empty bucket answers 429 before any verify. A cached
//! correct credential is accepted without a token, so guessing never locks
//! out a client already signed in; and because the per-username budget is
//! per address, a stranger guessing from elsewhere cannot lock anyone out.
//! IPv6 clients are keyed by their /64.
//!
//! In a cluster every node keeps its own buckets, and an attacker can ask
//! every node: so each node's budget is the budget above shared out over
//! the members of the cluster (the metastore's member list, dead members
//! included): the refill divided by their number, the burst divided and
//! rounded up but never below 2 (one typo must not lock a user out). With
//! 3 nodes: 2 failures per username and address in a burst and one per
//! 36 s on each node, so 6 in a burst and one per 12 s in all (one node
//! alone: 5, one per 12 s; before the sharing, 3 nodes gave 15 and 3 per
//! 12 s). Usernames that cannot exist (over
//! 64 bytes, or outside `[A-Za-z0-9._-]`) and passwords over 72 bytes
//! (bcrypt's limit) fail without a verify and take only the address token.
//! The self-service `current_password` check ([`Authenticator::check_password`])
//! goes through the same throttle and verify queue.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use narad_meta::user::validate_username;
use narad_meta::{MetaStore, User};
use ring::hmac;
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use crate::ratelimit::TokenBucket;

pub use narad_node::root::{
    BCRYPT_COST, PASSWORD_BYTES_MAX, PASSWORD_TOO_LONG, check_password_len, hash_password,
    random_password, seed_root,
};

/// Failed attempts allowed in a burst, per username and client address.
const FAIL_BURST: f64 = 5.0;
/// One more failed attempt per username and address every this often.
const FAIL_REFILL: Duration = Duration::from_secs(12);
/// Failed attempts allowed in a burst, per client address.
const ADDR_FAIL_BURST: f64 = 20.0;
/// One more failed attempt per address every this often.
const ADDR_FAIL_REFILL: Duration = Duration::from_secs(3);
/// Verifies allowed to wait for a slot beyond the running ones.
pub const VERIFY_QUEUE_MAX: usize = 32;
/// How long a wrong password is remembered.
const WRONG_TTL: Duration = Duration::from_secs(60);
/// More entries than this in a cache map and the stale ones are dropped.
const CACHE_SOFT_MAX: usize = 10_000;

/// Why a request is not authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// 401: missing, unknown or wrong credentials.
    Unauthorized,
    /// 429: too many failed attempts for this username or address; retry
    /// after this.
    Throttled(Duration),
    /// 503: every verify slot and queue place is taken.
    Busy,
    /// 500: the verify could not run.
    Unavailable,
}

type Tag = [u8; 32];

/// A throttle key: the client address (IPv6 by its /64), and the
/// username or `None` for the address's own bucket.
type FailKey = (IpAddr, Option<String>);

#[derive(Debug, Default)]
struct Cache {
    verified: HashMap<String, Tag>,
    wrong: HashMap<Tag, Instant>,
}

/// The outcome of one verify, shared by every request that presented the
/// same credential while it ran.
type Shared = Arc<tokio::sync::OnceCell<Result<bool, AuthError>>>;

/// Removes a credential's in-flight entry when the request that looked it
/// up is done (or dropped), if the entry is still the one it used.
struct InFlight<'a> {
    map: &'a Mutex<HashMap<Tag, Shared>>,
    tag: Tag,
    cell: Shared,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut map = lock(self.map);
        if map.get(&self.tag).is_some_and(|c| Arc::ptr_eq(c, &self.cell)) {
            map.remove(&self.tag);
        }
    }
}

/// Verifies credentials; shared by every request.
pub struct Authenticator {
    meta: Arc<MetaStore>,
    key: hmac::Key,
    cache: Mutex<Cache>,
    failures: Mutex<HashMap<FailKey, TokenBucket>>,
    verifies: VerifyQueue,
    /// Verifies running, by credential: a pool of clients that log in with
    /// the same credential at once shares one verify and one throttle
    /// token, instead of spending the burst and getting 429s.
    in_flight: Mutex<HashMap<Tag, Shared>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A node's share of a burst, never below this: one typo must not lock a
/// user out of the node it talks to.
const MIN_NODE_BURST: f64 = 2.0;

/// (rate per second, burst) of a throttle bucket on one of `nodes` nodes:
/// the cluster's budget shared out (the refill divided by `nodes`, the
/// burst divided and rounded up, at least [`MIN_NODE_BURST`]).
fn budget(key: &FailKey, nodes: usize) -> (f64, f64) {
    let n = nodes.max(1) as f64;
    let share = |burst: f64| if n == 1.0 { burst } else { (burst / n).ceil().max(MIN_NODE_BURST) };
    match key.1 {
        Some(_) => (1.0 / FAIL_REFILL.as_secs_f64() / n, share(FAIL_BURST)),
        None => (1.0 / ADDR_FAIL_REFILL.as_secs_f64() / n, share(ADDR_FAIL_BURST)),
    }
}

/// The address a client is throttled by: IPv4 as is (an IPv4-mapped IPv6
/// address as its IPv4), IPv6 by its /64 (one host holds a whole /64).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// The address used when the connection's is unknown (in-process tests).
pub const UNKNOWN_CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

/// A username as it may be logged: whole when it could be a user, else
/// only its length (a client chooses it, and it may be megabytes).
fn loggable(username: &str) -> std::borrow::Cow<'_, str> {
    if validate_username(username).is_ok() {
        username.into()
    } else {
        format!("<invalid username, {} bytes>", username.len()).into()
    }
}

/// A hash to verify against when the user does not exist, so an unknown
/// name costs as much as a wrong password.
fn dummy_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        bcrypt::hash("narad-no-such-user", BCRYPT_COST).expect("bcrypt hashes a fixed password")
    })
}

/// Runs `f` on the blocking pool.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

/// The bcrypt verifies: at most one running per slot, at most `queue_max`
/// more waiting for one; beyond that [`VerifyQueue::enter`] refuses at once.
#[derive(Debug)]
struct VerifyQueue {
    slots: Semaphore,
    waiting: AtomicUsize,
    queue_max: usize,
}

/// Decrements the waiting count when dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl VerifyQueue {
    fn new(slots: usize, queue_max: usize) -> VerifyQueue {
        VerifyQueue { slots: Semaphore::new(slots), waiting: AtomicUsize::new(0), queue_max }
    }

    /// A slot, after waiting in the queue; `Busy` when the queue is full.
    async fn enter(&self) -> Result<tokio::sync::SemaphorePermit<'_>, AuthError> {
        let ahead = self.waiting.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(&self.waiting);
        if ahead >= self.queue_max {
            debug!("authentication busy: verify queue full");
            return Err(AuthError::Busy);
        }
        self.slots.acquire().await.map_err(|_| AuthError::Unavailable)
    }
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
            verifies: VerifyQueue::new(cores, VERIFY_QUEUE_MAX),
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    /// The cache key of a credential against the user's current hash
    /// (`""` for no user): a new hash gives every password a new tag.
    fn tag(&self, username: &str, hash: &str, password: &str) -> Tag {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(&(username.len() as u64).to_le_bytes());
        ctx.update(username.as_bytes());
        ctx.update(&(hash.len() as u64).to_le_bytes());
        ctx.update(hash.as_bytes());
        ctx.update(password.as_bytes());
        let mut tag = [0u8; 32];
        tag.copy_from_slice(ctx.sign().as_ref());
        tag
    }

    /// The user these credentials belong to; `client` is the connection's
    /// address (the throttle's key).
    pub async fn authenticate(
        &self,
        username: &str,
        password: &str,
        client: IpAddr,
    ) -> Result<Arc<User>, AuthError> {
        let client = client_key(client);
        if validate_username(username).is_err() {
            // No such user can exist: no verify, and nothing stored per name.
            self.reserve(client, None, Instant::now())?;
            info!(user = %loggable(username), %client, "authentication failed");
            return Err(AuthError::Unauthorized);
        }
        let user = self.meta.snapshot().user(username).cloned();
        let hash = user.as_deref().map_or("", |u| u.password_hash.as_str());
        let tag = self.tag(username, hash, password);
        let now = Instant::now();
        let known_wrong = {
            let cache = lock(&self.cache);
            if let (Some(user), Some(known)) = (&user, cache.verified.get(username))
                && bool::from(known[..].ct_eq(&tag[..]))
            {
                return Ok(user.clone());
            }
            check_password_len(password).is_err()
                || cache.wrong.get(&tag).is_some_and(|at| now.duration_since(*at) < WRONG_TTL)
        };
        let cell = lock(&self.in_flight).entry(tag).or_default().clone();
        let _in_flight = InFlight { map: &self.in_flight, tag, cell: cell.clone() };
        let ok = cell
            .get_or_init(|| {
                self.throttled_verify(username, user.as_deref(), password, known_wrong, client)
            })
            .await
            .clone()?;
        let mut cache = lock(&self.cache);
        match user {
            Some(user) if ok => {
                if cache.verified.len() >= CACHE_SOFT_MAX {
                    cache.verified.clear();
                }
                cache.verified.insert(username.to_owned(), tag);
                Ok(user)
            }
            _ => {
                if cache.wrong.len() >= CACHE_SOFT_MAX {
                    cache.wrong.retain(|_, at| now.duration_since(*at) < WRONG_TTL);
                }
                if cache.wrong.len() < CACHE_SOFT_MAX {
                    cache.wrong.insert(tag, now);
                }
                drop(cache);
                info!(user = username, %client, "authentication failed");
                Err(AuthError::Unauthorized)
            }
        }
    }

    /// Whether `password` is `user`'s (the self-service `current_password`
    /// check): throttled and queued like a login, never cached.
    pub async fn check_password(
        &self,
        user: &User,
        password: &str,
        client: IpAddr,
    ) -> Result<bool, AuthError> {
        let client = client_key(client);
        let too_long = check_password_len(password).is_err();
        let ok =
            self.throttled_verify(&user.username, Some(user), password, too_long, client).await?;
        if !ok {
            info!(user = %user.username, %client, "current password check failed");
        }
        Ok(ok)
    }

    /// Takes the throttle tokens, verifies (unless the answer is `known_wrong`
    /// already) and gives the tokens back on success or when no verify ran
    /// for want of a slot.
    async fn throttled_verify(
        &self,
        username: &str,
        user: Option<&User>,
        password: &str,
        known_wrong: bool,
        client: IpAddr,
    ) -> Result<bool, AuthError> {
        self.reserve(client, Some(username), Instant::now())?;
        let outcome = if known_wrong { Ok(false) } else { self.verify(user, password).await };
        if !matches!(outcome, Ok(false)) {
            self.refund(client, username);
        }
        outcome
    }

    async fn verify(&self, user: Option<&User>, password: &str) -> Result<bool, AuthError> {
        let _slot = self.verifies.enter().await?;
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

    /// The nodes the failed-password budget is shared by: the cluster's
    /// members (1 for a single node).
    fn nodes(&self) -> usize {
        self.meta.snapshot().members().count().max(1)
    }

    /// Takes a token from the address's bucket and, with a username, from
    /// the (address, username) bucket: both or neither.
    fn reserve(
        &self,
        client: IpAddr,
        username: Option<&str>,
        now: Instant,
    ) -> Result<(), AuthError> {
        let nodes = self.nodes();
        let mut failures = lock(&self.failures);
        if failures.len() >= CACHE_SOFT_MAX {
            failures.retain(|k, b| {
                let (rate, burst) = budget(k, nodes);
                !b.is_full(rate, burst, now)
            });
        }
        let mut keys = vec![(client, None)];
        if let Some(name) = username {
            keys.push((client, Some(name.to_owned())));
        }
        for key in &keys {
            let (rate, burst) = budget(key, nodes);
            if let Some(bucket) = failures.get_mut(key)
                && let Err(wait) = bucket.peek(rate, burst, now)
            {
                debug!(user = username.unwrap_or(""), %client, "authentication throttled");
                return Err(AuthError::Throttled(wait));
            }
        }
        for key in keys {
            let (rate, burst) = budget(&key, nodes);
            let bucket = failures.entry(key).or_insert_with(|| TokenBucket::full(burst, now));
            let _ = bucket.take(rate, burst, now);
        }
        Ok(())
    }

    /// Gives back the tokens [`Self::reserve`] took for a verify that
    /// succeeded (or did not run).
    fn refund(&self, client: IpAddr, username: &str) {
        let nodes = self.nodes();
        let mut failures = lock(&self.failures);
        for key in [(client, None), (client, Some(username.to_owned()))] {
            let (_, burst) = budget(&key, nodes);
            if let Some(bucket) = failures.get_mut(&key) {
                bucket.refund(burst);
            }
        }
    }
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

    #[test]
    fn the_failed_password_budget_is_shared_out_over_the_cluster() {
        let user: FailKey = (IpAddr::V4(Ipv4Addr::LOCALHOST), Some("bob".into()));
        let addr: FailKey = (IpAddr::V4(Ipv4Addr::LOCALHOST), None);
        assert_eq!(budget(&user, 1), (1.0 / 12.0, 5.0));
        assert_eq!(budget(&addr, 1), (1.0 / 3.0, 20.0));
        let (rate, burst) = budget(&user, 3);
        assert!((rate - 1.0 / 36.0).abs() < 1e-12 && burst == 2.0, "{rate} {burst}");
        assert_eq!(budget(&addr, 3).1, 7.0);
        assert_eq!(budget(&user, 5).1, 2.0, "never below 2");
        assert_eq!(budget(&user, 0), budget(&user, 1));
    }
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

    #[tokio::test]
    async fn the_verify_queue_refuses_beyond_its_slots_and_queue() {
        let q = VerifyQueue::new(1, 2);
        let running = q.enter().await.unwrap();
        let mut waiters = Vec::new();
        for _ in 0..2 {
            let mut w = Box::pin(q.enter());
            assert!(futures_poll_pending(&mut w), "waits for the slot");
            waiters.push(w);
        }
        assert_eq!(q.enter().await.unwrap_err(), AuthError::Busy, "the queue is full");
        drop(waiters.pop());
        let mut w = Box::pin(q.enter());
        assert!(futures_poll_pending(&mut w), "a place came free");
        drop(running);
        assert!(waiters.pop().unwrap().await.is_ok(), "the slot passes to a waiter");
    }

    /// Polls once: whether the future is still pending.
    fn futures_poll_pending<F: std::future::Future + Unpin>(f: &mut F) -> bool {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        std::pin::Pin::new(f).poll(&mut cx).is_pending()
    }

    #[test]
    fn ipv6_clients_are_throttled_by_their_64_and_mapped_v4_as_v4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        assert_eq!(client_key(a), client_key(b));
        assert_ne!(client_key(a), client_key("2001:db8:1:3::1".parse().unwrap()));
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert_eq!(client_key(mapped), "10.0.0.7".parse::<IpAddr>().unwrap());
    }
}
