//! The access layer: one middleware in front of every route that
//! authenticates the caller ([`crate::auth`]), applies the route's
//! authorization rule (SPEC §1.2) and the caller's rate limits, and hands
//! the caller to the handler as a [`Caller`] extension.
//!
//! The rule is chosen by the matched route, whatever the method: axum
//! answers `HEAD` with a route's `GET` handler, and a method the route does
//! not serve must not get through unchecked on its way to the 405.
//!
//! | route | rule |
//! |---|---|
//! | `/healthz`, `/readyz`, `/metrics`, `/openapi.json` | open (exact paths) |
//! | `.../produce`, `.../produce/batch` | `produce` on the topic, then the produce rate limit |
//! | `.../consume` (`GET` and `HEAD`) | `consume` on the topic, then the consume rate limit |
//! | `.../ack` | `consume` on the topic |
//! | `/v1/topics/{topic}`, `.../children` other than `GET`/`HEAD`; `.../children/{child}` | owner of the topic or admin (a missing topic passes: the handler answers 404) |
//! | `POST /v1/topics` | checked by the handler (`create` on the name; owner or admin of a parent) |
//! | `POST .../children` | also checked by the handler: owner or admin of the child |
//! | `/v1/users...` | checked by the handlers (admin; self-service password change) |
//! | anything else | any authenticated user |
//!
//! With security off (`--dev`) nobody is authenticated, every rule passes
//! and the rate limits apply to one anonymous user.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use axum::RequestExt;
use axum::extract::{ConnectInfo, MatchedPath, RawPathParams, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use narad_meta::{Action, Topic, User};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::auth::{AuthError, Authenticator, UNKNOWN_CLIENT, basic_credentials};
use crate::error::ApiError;
use crate::ratelimit::{Op, RateLimiter, retry_after_secs};
use crate::state::Shared;

/// Paths that never ask for credentials.
pub const EXEMPT_PATHS: [&str; 4] = ["/healthz", "/readyz", "/metrics", "/openapi.json"];

/// 403 text for a produce without the grant.
pub const PRODUCE_DENIED: &str = "produce not allowed on this topic";
/// 403 text for a consume or ack without the grant.
pub const CONSUME_DENIED: &str = "consume not allowed on this topic";
/// 403 text for a create without the grant.
pub const CREATE_DENIED: &str = "create not allowed on this topic";
/// 403 text for a change by someone neither owner nor admin.
pub const OWNER_DENIED: &str = "only the topic owner or an admin may modify this topic";
/// 403 text for an admin-only action.
pub const ADMIN_DENIED: &str = "admin privileges required";

/// Who is calling: `None` when security is off (everything allowed).
#[derive(Debug, Clone)]
pub struct Caller(pub Option<Arc<User>>);

impl Caller {
    /// The username (`""` when security is off).
    pub fn name(&self) -> &str {
        self.0.as_deref().map_or("", |u| u.username.as_str())
    }

    /// Whether the caller may do `action` on `topic`.
    pub fn may(&self, action: Action, topic: &str) -> bool {
        self.0.as_deref().is_none_or(|u| u.may(action, topic))
    }

    /// Whether the caller is an admin (always, with security off).
    pub fn is_admin(&self) -> bool {
        self.0.as_deref().is_none_or(User::is_admin)
    }

    /// Whether the caller may alter, delete, attach to or detach from
    /// `topic` (its owner or an admin; a missing topic passes).
    pub fn may_modify(&self, topic: Option<&Topic>) -> bool {
        match (&self.0, topic) {
            (None, _) | (_, None) => true,
            (Some(u), Some(t)) => {
                u.is_admin() || (!t.owner().is_empty() && t.owner() == u.username)
            }
        }
    }
}

/// `{reason}` of the throttled-requests counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ThrottleLabels {
    /// `produce_rate`, `consume_rate`, `auth_failures` (429) or
    /// `auth_busy` (503: no password-verify slot).
    pub reason: String,
}

/// Everything the access layer needs.
#[derive(Debug)]
pub struct Security {
    /// Off only with `--dev`.
    pub enabled: bool,
    /// Credentials (present when enabled).
    pub auth: Option<Authenticator>,
    /// Per-user rate limits.
    pub limits: RateLimiter,
    /// `narad_throttled_requests_total{reason}`.
    pub throttled: Family<ThrottleLabels, Counter>,
    /// Security off and no rate limits: every request passes unchecked.
    open: bool,
}

impl Security {
    /// The access layer; registers its metric.
    pub fn new(
        auth: Option<Authenticator>,
        limits: RateLimiter,
        registry: &mut Registry,
    ) -> Security {
        let throttled = Family::default();
        registry.register(
            "throttled_requests",
            "Requests refused with 429 (rate limits, failed-password throttle) or 503 (password-verify queue full)",
            throttled.clone(),
        );
        let open = auth.is_none() && limits.is_unlimited();
        Security { enabled: auth.is_some(), auth, limits, throttled, open }
    }

    /// Counts a refusal in `narad_throttled_requests_total{reason}`.
    pub fn count_throttled(&self, reason: &str) {
        self.throttled.get_or_create(&ThrottleLabels { reason: reason.to_owned() }).inc();
    }
}

fn unauthorized() -> Response {
    let mut r = ApiError::Json {
        status: StatusCode::UNAUTHORIZED,
        message: "authentication required".into(),
    }
    .into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"narad\""));
    r
}

/// A 403 with `message`.
pub fn forbidden(message: &str) -> ApiError {
    ApiError::Json { status: StatusCode::FORBIDDEN, message: message.to_owned() }
}

/// A 429 with `message` and `Retry-After`.
pub fn too_many(message: &str, wait: std::time::Duration) -> Response {
    let mut r = ApiError::Json { status: StatusCode::TOO_MANY_REQUESTS, message: message.into() }
        .into_response();
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(wait)));
    r
}

/// The 503 of a request whose password verify found no slot.
pub fn auth_busy() -> Response {
    let mut r = ApiError::Json {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: "authentication busy, retry later".into(),
    }
    .into_response();
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(1u64));
    r
}

/// What a route asks of the caller before its handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Grant(Action, Option<Op>),
    OwnerOrAdmin,
    Authenticated,
}

/// The rule of a matched route. Keyed by the route first, so that every
/// method it answers (`HEAD` as `GET`) or refuses gets the route's rule;
/// the method only tells the reads of a route from its changes.
fn rule(method: &Method, route: &str) -> Rule {
    let read = *method == Method::GET || *method == Method::HEAD;
    match route {
        "/v1/topics/{topic}/produce" | "/v1/topics/{topic}/produce/batch" => {
            Rule::Grant(Action::Produce, Some(Op::Produce))
        }
        "/v1/topics/{topic}/consume" => Rule::Grant(Action::Consume, Some(Op::Consume)),
        "/v1/topics/{topic}/ack" => Rule::Grant(Action::Consume, None),
        "/v1/topics/{topic}" | "/v1/topics/{topic}/children" if !read => Rule::OwnerOrAdmin,
        "/v1/topics/{topic}/children/{child}" => Rule::OwnerOrAdmin,
        _ => Rule::Authenticated,
    }
}

/// The address of the connection a request came on (its throttle key).
pub fn client_addr(req: &Request) -> IpAddr {
    req.extensions().get::<ConnectInfo<SocketAddr>>().map_or(UNKNOWN_CLIENT, |c| c.0.ip())
}

/// The access checks (authentication, grants, rate limits) of every
/// request, run by the one middleware [`crate::http_metrics::track`].
pub async fn guard(State(s): State<Shared>, mut req: Request, next: Next) -> Response {
    let sec = &s.security;
    if EXEMPT_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    if sec.open {
        // Security off and no rate limit: nothing to check.
        req.extensions_mut().insert(Caller(None));
        return next.run(req).await;
    }
    let rule = req
        .extensions()
        .get::<MatchedPath>()
        .map_or(Rule::Authenticated, |r| rule(req.method(), r.as_str()));
    let topic = if rule == Rule::Authenticated {
        String::new()
    } else {
        match req.extract_parts::<RawPathParams>().await {
            Ok(params) => params.iter().find(|(k, _)| *k == "topic").map(|(_, v)| v.to_owned()),
            Err(_) => None,
        }
        .unwrap_or_default()
    };
    match admit(&s, rule, &topic, req.headers(), client_addr(&req)).await {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(refused) => refused,
    }
}

/// Whether the produce fast path ([`crate::fast`]) may skip the access
/// checks: security off and no rate limits.
pub fn is_open(s: &Shared) -> bool {
    s.security.open
}

/// The access checks of a produce (`produce` on `topic`, then the produce
/// rate limit), for the produce fast path ([`crate::fast`]): the caller,
/// or the refusal [`guard`] would answer.
pub async fn admit_produce(
    s: &Shared,
    topic: &str,
    headers: &axum::http::HeaderMap,
    client: IpAddr,
) -> Result<Caller, Response> {
    admit(s, Rule::Grant(Action::Produce, Some(Op::Produce)), topic, headers, client).await
}

/// Authenticates the caller and applies `rule` to it (on `topic`, the
/// decoded `{topic}` of the route, empty if it has none).
async fn admit(
    s: &Shared,
    rule: Rule,
    topic: &str,
    headers: &axum::http::HeaderMap,
    client: IpAddr,
) -> Result<Caller, Response> {
    let sec = &s.security;
    let caller = match &sec.auth {
        None => Caller(None),
        Some(auth) => {
            let Some((user, password)) = basic_credentials(headers.get(header::AUTHORIZATION))
            else {
                return Err(unauthorized());
            };
            match auth.authenticate(&user, &password, client).await {
                Ok(u) => Caller(Some(u)),
                Err(AuthError::Unauthorized) => return Err(unauthorized()),
                Err(AuthError::Throttled(wait)) => {
                    sec.count_throttled("auth_failures");
                    return Err(too_many("too many failed authentication attempts", wait));
                }
                Err(AuthError::Busy) => {
                    sec.count_throttled("auth_busy");
                    return Err(auth_busy());
                }
                Err(AuthError::Unavailable) => {
                    return Err(ApiError::Json {
                        status: StatusCode::INTERNAL_SERVER_ERROR,
                        message: "authentication unavailable".into(),
                    }
                    .into_response());
                }
            }
        }
    };
    match rule {
        Rule::Grant(action, op) => {
            if !caller.may(action, topic) {
                let text = if action == Action::Produce { PRODUCE_DENIED } else { CONSUME_DENIED };
                return Err(forbidden(text).into_response());
            }
            if let Some(op) = op
                && let Err(wait) = sec.limits.check(caller.name(), op, Instant::now())
            {
                sec.count_throttled(&format!("{}_rate", op.as_str()));
                return Err(too_many(&format!("rate limit exceeded: {}", op.as_str()), wait));
            }
        }
        Rule::OwnerOrAdmin => {
            if !caller.may_modify(s.broker.meta().topic(topic).as_deref()) {
                return Err(forbidden(OWNER_DENIED).into_response());
            }
        }
        Rule::Authenticated => {}
    }
    Ok(caller)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_map_to_their_rules() {
        let r = |m: Method, p: &str| rule(&m, p);
        assert_eq!(
            r(Method::POST, "/v1/topics/{topic}/produce/batch"),
            Rule::Grant(Action::Produce, Some(Op::Produce))
        );
        assert_eq!(r(Method::POST, "/v1/topics/{topic}/ack"), Rule::Grant(Action::Consume, None));
        assert_eq!(r(Method::DELETE, "/v1/topics/{topic}"), Rule::OwnerOrAdmin);
        assert_eq!(r(Method::GET, "/v1/topics/{topic}"), Rule::Authenticated);
        assert_eq!(r(Method::POST, "/v1/topics"), Rule::Authenticated);
        assert_eq!(r(Method::DELETE, "/v1/topics/{topic}/children/{child}"), Rule::OwnerOrAdmin);
        assert_eq!(r(Method::POST, "/v1/topics/{topic}/children"), Rule::OwnerOrAdmin);
        assert_eq!(r(Method::GET, "/v1/topics/{topic}/children"), Rule::Authenticated);
        assert_eq!(r(Method::HEAD, "/v1/topics/{topic}/children"), Rule::Authenticated);
        assert_eq!(r(Method::PUT, "/v1/topics/{topic}/children"), Rule::OwnerOrAdmin);
        let consume = Rule::Grant(Action::Consume, Some(Op::Consume));
        let junk = Method::from_bytes(b"FROB").unwrap();
        for m in [Method::GET, Method::HEAD, Method::OPTIONS, Method::POST, junk] {
            assert_eq!(r(m.clone(), "/v1/topics/{topic}/consume"), consume, "{m}");
            assert_eq!(r(m.clone(), "/v1/topics/{topic}/ack"), Rule::Grant(Action::Consume, None));
            assert_eq!(r(m, "/v1/topics/{topic}/children/{child}"), Rule::OwnerOrAdmin);
        }
    }
}
