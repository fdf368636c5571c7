//! `/v1/users` (SPEC §1.9): create, list, get, delete, grants, password.
//!
//! Every route is for admins, except that a user may read itself and
//! change its own password (with the current one). Only root grants
//! `admin`; admins grant any scoped grant. The root user cannot be deleted
//! and keeps its grants; only root changes root's password. Passwords are
//! at most 72 bytes (bcrypt's limit: longer is a 400, never truncated).
//! Hashing runs on the blocking pool; the self-service `current_password`
//! check goes through the authenticator's throttle and verify queue. A
//! user who owns topics cannot be deleted (409). Every change is logged as
//! an `audit` event.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_meta::user::UserJson;
use narad_meta::user::{validate_grants, validate_username};
use narad_meta::{Grant, MetaError, User};
use serde::Deserialize;
use tracing::info;
use utoipa::ToSchema;

use crate::access::{ADMIN_DENIED, Caller, auth_busy, forbidden, too_many};
use crate::auth::{AuthError, UNKNOWN_CLIENT, blocking, check_password_len, hash_password};
use crate::body::read_streamed_json;
use crate::error::{ApiError, json_response};
use crate::limits::STREAMED_BODY_BYTES;
use crate::openapi::ErrorBody;
use crate::state::Shared;

/// 403 when a grant exceeds what the caller may hand out.
pub const ESCALATION_DENIED: &str = "cannot grant permissions you do not hold";

/// Body of `POST /v1/users`.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = CreateUser)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    grants: Vec<Grant>,
}

/// Body of `PUT /v1/users/{user}/grants`.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = UserGrants)]
#[serde(deny_unknown_fields)]
struct GrantsBody {
    grants: Vec<Grant>,
}

/// Body of `PUT /v1/users/{user}/password`.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(as = PasswordChange)]
#[serde(deny_unknown_fields)]
struct PasswordBody {
    #[serde(default)]
    current_password: String,
    #[serde(default)]
    new_password: String,
}

/// Reads a users body: over the cap is a 400, as Narad streams these.
async fn read_json<T: for<'de> Deserialize<'de>>(
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ApiError> {
    read_streamed_json(headers, body, STREAMED_BODY_BYTES).await
}

fn user_reply(status: StatusCode, u: &User) -> Response {
    json_response(status, serde_json::to_string(&u.json()).expect("a user serializes"))
}

/// 403 unless the caller is an admin (every user route but the self-service
/// password change, and the cluster's decommission).
pub(crate) fn require_admin(caller: &Caller) -> Result<(), ApiError> {
    if caller.is_admin() { Ok(()) } else { Err(forbidden(ADMIN_DENIED)) }
}

fn check_delegation(caller: &Caller, grants: &[Grant]) -> Result<(), ApiError> {
    match &caller.0 {
        Some(u) if !grants.iter().all(|g| u.may_delegate(g)) => Err(forbidden(ESCALATION_DENIED)),
        _ => Ok(()),
    }
}

/// Runs a blocking metastore (or hashing) step.
pub(crate) async fn run<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    blocking(f).await.ok_or_else(|| ApiError::Json {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message: "users failed".into(),
    })?
}

fn hashed(password: &str) -> Result<String, ApiError> {
    hash_password(password).map_err(|e| {
        tracing::error!(error = %e, "password hashing failed");
        ApiError::Json { status: StatusCode::INTERNAL_SERVER_ERROR, message: "users failed".into() }
    })
}

/// Logs an `audit` event: who did what to which user or member.
pub(crate) fn audit(caller: &Caller, event: &str, target: &str) {
    info!(component = "audit", event, actor = caller.name(), target, "audit");
}

/// `POST /v1/users`.
#[utoipa::path(
    post,
    operation_id = "create_user",
    path = "/v1/users",
    tag = "users",
    request_body = CreateBody,
    responses(
        (status = 201, description = "Created", body = UserJson),
        (status = 400, description = "Invalid username, password or grants", body = ErrorBody),
        (status = 403, description = "Not an admin, or grants beyond the caller's", body = ErrorBody),
        (status = 409, description = "The user exists", body = ErrorBody),
    )
)]
pub async fn create(
    State(s): State<Shared>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    require_admin(&caller)?;
    let b: CreateBody = read_json(&headers, body).await?;
    validate_username(&b.username)?;
    if b.password.is_empty() {
        return Err(ApiError::bad_request("password required"));
    }
    check_password_len(&b.password).map_err(ApiError::bad_request)?;
    validate_grants(&b.grants)?;
    check_delegation(&caller, &b.grants)?;
    let meta = s.broker.meta().clone();
    if meta.user(&b.username).is_some() {
        return Err(MetaError::AlreadyExists("user already exists".into()).into());
    }
    let name = b.username.clone();
    let user = run(move || {
        let hash = hashed(&b.password)?;
        Ok(meta.create_user(&b.username, hash, b.grants)?)
    })
    .await?;
    audit(&caller, "user.create", &name);
    Ok(user_reply(StatusCode::CREATED, &user))
}

/// `GET /v1/users`: a bare array in username order.
#[utoipa::path(
    get,
    operation_id = "list_users",
    path = "/v1/users",
    tag = "users",
    responses(
        (status = 200, description = "Every user, by name", body = Vec<UserJson>),
        (status = 403, description = "Not an admin", body = ErrorBody),
    )
)]
pub async fn list(
    State(s): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    require_admin(&caller)?;
    let snapshot = s.broker.meta().snapshot();
    let users: Vec<_> = snapshot.users().map(|u| u.json()).collect();
    Ok(json_response(StatusCode::OK, serde_json::to_string(&users).expect("users serialize")))
}

fn find(s: &Shared, name: &str) -> Result<Arc<User>, ApiError> {
    s.broker.meta().user(name).ok_or_else(|| MetaError::NotFound("not found".into()).into())
}

/// `GET /v1/users/{user}`: admins, or the user itself.
#[utoipa::path(
    get,
    operation_id = "get_user",
    path = "/v1/users/{user}",
    tag = "users",
    params(("user" = String, Path, description = "Username", pattern = r"^[A-Za-z0-9._-]{1,64}$")),
    responses(
        (status = 200, description = "The user", body = UserJson),
        (status = 403, description = "Not an admin or the user", body = ErrorBody),
        (status = 404, description = "No such user", body = ErrorBody),
    )
)]
pub async fn get(
    State(s): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    if caller.name() != name {
        require_admin(&caller)?;
    }
    let user = find(&s, &name)?;
    Ok(user_reply(StatusCode::OK, &user))
}

/// `DELETE /v1/users/{user}`: never root, never yourself, never a user
/// who owns topics (409: a user created later under the name would own
/// them).
#[utoipa::path(
    delete,
    operation_id = "delete_user",
    path = "/v1/users/{user}",
    tag = "users",
    params(("user" = String, Path, description = "Username", pattern = r"^[A-Za-z0-9._-]{1,64}$")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 403, description = "Not an admin, root, or yourself", body = ErrorBody),
        (status = 404, description = "No such user", body = ErrorBody),
        (status = 409, description = "The user owns topics", body = ErrorBody),
    )
)]
pub async fn delete(
    State(s): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    require_admin(&caller)?;
    if caller.name() == name {
        return Err(forbidden("cannot delete yourself"));
    }
    let meta = s.broker.meta().clone();
    let target = name.clone();
    run(move || Ok(meta.delete_user(&target)?)).await?;
    audit(&caller, "user.delete", &name);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `PUT /v1/users/{user}/grants`: replaces the grants; not your own, not
/// root's.
#[utoipa::path(
    put,
    operation_id = "put_user_grants",
    path = "/v1/users/{user}/grants",
    tag = "users",
    params(("user" = String, Path, description = "Username", pattern = r"^[A-Za-z0-9._-]{1,64}$")),
    request_body = GrantsBody,
    responses(
        (status = 200, description = "The user with its new grants", body = UserJson),
        (status = 400, description = "Invalid grants", body = ErrorBody),
        (status = 403, description = "Not allowed", body = ErrorBody),
        (status = 404, description = "No such user", body = ErrorBody),
    )
)]
pub async fn put_grants(
    State(s): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    require_admin(&caller)?;
    let b: GrantsBody = read_json(&headers, body).await?;
    if caller.name() == name {
        return Err(forbidden("cannot change your own grants"));
    }
    let target = find(&s, &name)?;
    if target.root {
        return Err(forbidden("the root user's grants cannot be changed"));
    }
    validate_grants(&b.grants)?;
    check_delegation(&caller, &b.grants)?;
    let meta = s.broker.meta().clone();
    let n = name.clone();
    let user = run(move || Ok(meta.update_user(&n, Some(b.grants), None)?)).await?;
    audit(&caller, "user.grants", &name);
    Ok(user_reply(StatusCode::OK, &user))
}

/// `PUT /v1/users/{user}/password`: admins reset anyone's (root's only by
/// root); a user changes its own with the current password. 204.
#[utoipa::path(
    put,
    operation_id = "put_user_password",
    path = "/v1/users/{user}/password",
    tag = "users",
    params(("user" = String, Path, description = "Username", pattern = r"^[A-Za-z0-9._-]{1,64}$")),
    request_body = PasswordBody,
    responses(
        (status = 204, description = "Changed"),
        (status = 400, description = "Empty new password, or over 72 bytes", body = ErrorBody),
        (status = 403, description = "Not allowed, or the current password is wrong", body = ErrorBody),
        (status = 404, description = "No such user", body = ErrorBody),
        (status = 429, description = "Too many wrong current passwords", body = ErrorBody),
        (status = 503, description = "No password-verify slot free", body = ErrorBody),
    )
)]
pub async fn put_password(
    State(s): State<Shared>,
    Extension(caller): Extension<Caller>,
    conn: Option<Extension<ConnectInfo<SocketAddr>>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let b: PasswordBody = read_json(&headers, body).await?;
    let self_service = caller.0.is_some() && caller.name() == name;
    if !self_service {
        require_admin(&caller)?;
    }
    if b.new_password.is_empty() {
        return Err(ApiError::bad_request("new_password required"));
    }
    check_password_len(&b.new_password).map_err(ApiError::bad_request)?;
    let target = find(&s, &name)?;
    if target.root && !self_service && caller.0.as_deref().is_some_and(|u| !u.root) {
        return Err(forbidden("only the root user may change the root user's password"));
    }
    if self_service && let Some(auth) = &s.security.auth {
        let client = conn.map_or(UNKNOWN_CLIENT, |Extension(ConnectInfo(a))| a.ip());
        match auth.check_password(&target, &b.current_password, client).await {
            Ok(true) => {}
            Ok(false) => return Err(forbidden("current password is incorrect")),
            Err(AuthError::Throttled(wait)) => {
                s.security.count_throttled("auth_failures");
                return Ok(too_many("too many failed authentication attempts", wait));
            }
            Err(AuthError::Busy) => {
                s.security.count_throttled("auth_busy");
                return Ok(auth_busy());
            }
            Err(AuthError::Unauthorized | AuthError::Unavailable) => {
                return Err(ApiError::Json {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    message: "authentication unavailable".into(),
                });
            }
        }
    }
    let meta = s.broker.meta().clone();
    let n = name.clone();
    run(move || {
        let hash = hashed(&b.new_password)?;
        Ok(meta.update_user(&n, None, Some(hash))?)
    })
    .await?;
    audit(&caller, "user.password", &name);
    Ok(StatusCode::NO_CONTENT.into_response())
}
