//! `/v1/cluster` (SPEC §1.9): the members the metastore knows, this
//! node's view of the control plane, the moves in flight and the rebalance
//! plan (dry run) are reads, so any authenticated user (SPEC §1.2); they
//! answer from local state (possibly stale on a follower), on a single
//! node too. Decommission (`POST`/`DELETE .../decommission`) marks a member
//! draining or clears the mark through the metastore: admin only, audited.

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use narad_broker::ownership::member_loads;
use narad_meta::MetaError;
use narad_meta::limits::MAX_MOVES_IN_FLIGHT;
use narad_meta::rebalance::{self, PlannedMove};
use narad_meta::{MemberStatus, MetaState};
use serde::Serialize;
use utoipa::ToSchema;

use crate::access::Caller;
use crate::cluster::ClusterStatus;
use crate::error::{ApiError, json_response};
use crate::openapi::ErrorBody;
use crate::routes::users::{audit, require_admin, run};
use crate::state::Shared;

/// One member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct MemberJson {
    /// The node id.
    pub id: String,
    /// Its advertised HTTP `host:port`.
    pub addr: String,
    /// `alive` or `dead`.
    #[schema(value_type = String, example = "alive")]
    pub status: &'static str,
    /// Being decommissioned: it gets no new partitions, and the planner
    /// moves its partitions away.
    pub draining: bool,
    /// Partitions it owns, over every topic.
    pub owned_partitions: u64,
    /// Of those, the ones a move is taking elsewhere.
    pub outbound_moves: u64,
}

/// `GET /v1/cluster/members`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Members {
    /// In id order.
    pub members: Vec<MemberJson>,
}

/// The members of `state`, in id order, with what each owns.
pub fn members_of(state: &MetaState) -> Vec<MemberJson> {
    let loads = member_loads(state);
    state
        .members()
        .map(|m| {
            let load = loads.get(&m.id).copied().unwrap_or_default();
            MemberJson {
                id: m.id.clone(),
                addr: m.addr.clone(),
                status: match m.status {
                    MemberStatus::Alive => "alive",
                    MemberStatus::Dead => "dead",
                },
                draining: m.draining,
                owned_partitions: load.owned_partitions,
                outbound_moves: load.outbound_moves,
            }
        })
        .collect()
}

/// `GET /v1/cluster/members`.
#[utoipa::path(
    get,
    operation_id = "list_cluster_members",
    path = "/v1/cluster/members",
    tag = "cluster",
    responses(
        (status = 200, description = "Every member the metastore knows (this node's replica)", body = Members),
        (status = 401, description = "No or bad credentials", body = ErrorBody),
    )
)]
pub async fn members(State(s): State<Shared>) -> Response {
    let reply = Members { members: members_of(&s.broker.meta().snapshot()) };
    json_response(StatusCode::OK, serde_json::to_string(&reply).expect("members serialize"))
}

/// `GET /v1/cluster/rebalance`: what the rebalance planner would move now.
#[derive(Debug, Serialize, ToSchema)]
pub struct RebalancePlan {
    /// The moves, in the order the planner chose them.
    pub moves: Vec<PlannedMove>,
    /// Members that receive partitions: alive and not draining.
    pub receivers: Vec<String>,
    /// Partitions of members that are dead (or unknown): they stay where
    /// they are and are not planned.
    pub unplannable_partitions: u64,
    /// Moves already in flight (partitions with a target).
    pub in_flight: u64,
    /// At most this many moves in flight cluster-wide.
    pub max_in_flight: u64,
}

/// The plan for `state`: receivers are the members it marks alive and not
/// draining; the alive draining ones are emptied.
pub fn rebalance_plan(state: &MetaState) -> RebalancePlan {
    let alive = || state.members().filter(|m| m.status == MemberStatus::Alive);
    let receivers: std::collections::BTreeSet<String> =
        alive().filter(|m| !m.draining).map(|m| m.id.clone()).collect();
    let draining: std::collections::BTreeSet<String> =
        alive().filter(|m| m.draining).map(|m| m.id.clone()).collect();
    let views = rebalance::partition_views(state);
    let unplannable = views
        .iter()
        .filter(|v| {
            let at = v.target.as_deref().unwrap_or(&v.owner);
            !receivers.contains(at) && !draining.contains(at)
        })
        .count();
    let in_flight = views.iter().filter(|v| v.target.is_some()).count();
    let moves = rebalance::plan(&views, &receivers, &draining, MAX_MOVES_IN_FLIGHT);
    RebalancePlan {
        moves,
        receivers: receivers.into_iter().collect(),
        unplannable_partitions: unplannable as u64,
        in_flight: in_flight as u64,
        max_in_flight: MAX_MOVES_IN_FLIGHT as u64,
    }
}

/// `GET /v1/cluster/rebalance`.
#[utoipa::path(
    get,
    operation_id = "cluster_rebalance_plan",
    path = "/v1/cluster/rebalance",
    tag = "cluster",
    responses(
        (status = 200, description = "The partition moves the rebalance planner would start now, from this node's replica (a dry run: nothing moves)", body = RebalancePlan),
        (status = 401, description = "No or bad credentials", body = ErrorBody),
    )
)]
pub async fn rebalance(State(s): State<Shared>) -> Response {
    let plan = rebalance_plan(&s.broker.meta().snapshot());
    json_response(StatusCode::OK, serde_json::to_string(&plan).expect("plan serializes"))
}

/// One move in flight (SPEC §1.9 `GET /v1/cluster/moves`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct MoveJson {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// Its owner, which the partition is copied from.
    pub from: String,
    /// The member copying it, which becomes the owner when the move ends.
    pub to: String,
    /// Where the copy is, when the node answering is the destination
    /// (`null` otherwise: ask `to`'s own `GET /v1/cluster/moves`, as
    /// `narad cluster moves` does).
    pub progress: Option<MoveProgressJson>,
}

/// Where a move is, as its destination sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct MoveProgressJson {
    /// `copying` (rounds while the source takes commits), `frozen` (the
    /// source is frozen, the tail is copied), `installing` (verify,
    /// install, owner flip) or `waiting_for_source` (the source does not
    /// answer).
    #[schema(value_type = String, example = "copying")]
    pub phase: narad_node::moves::MovePhase,
    /// Copy rounds started (the tail after the freeze counts as one).
    pub rounds: u32,
    /// Segment bytes copied so far.
    pub bytes_copied: u64,
    /// Segment bytes the source held at its last listing.
    pub bytes_total: u64,
    /// Milliseconds since the destination started the move.
    pub age_ms: u64,
}

/// `GET /v1/cluster/moves`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Moves {
    /// In `(topic, partition)` order.
    pub moves: Vec<MoveJson>,
}

/// The moves in flight in `state` (the partitions with a target), with
/// the progress of those in `local` (the moves this node runs as their
/// destination).
pub fn moves_of(state: &MetaState, local: &[narad_node::moves::MoveProgress]) -> Vec<MoveJson> {
    let mut out = Vec::new();
    for t in state.topics() {
        let Some(parts) = state.assignments(t.name()) else { continue };
        for (&partition, a) in parts.iter() {
            let Some(to) = &a.target_id else { continue };
            let progress = local
                .iter()
                .find(|l| l.topic == t.name() && l.partition == partition && l.from == a.owner_id)
                .map(|l| MoveProgressJson {
                    phase: l.phase,
                    rounds: l.rounds,
                    bytes_copied: l.bytes_copied,
                    bytes_total: l.bytes_total,
                    age_ms: l.age_ms,
                });
            out.push(MoveJson {
                topic: t.name().to_owned(),
                partition,
                from: a.owner_id.clone(),
                to: to.clone(),
                progress,
            });
        }
    }
    out
}

/// `GET /v1/cluster/moves`.
#[utoipa::path(
    get,
    operation_id = "list_cluster_moves",
    path = "/v1/cluster/moves",
    tag = "cluster",
    responses(
        (status = 200, description = "The partition moves in flight (this node's replica)", body = Moves),
        (status = 401, description = "No or bad credentials", body = ErrorBody),
    )
)]
pub async fn moves(State(s): State<Shared>) -> Response {
    let local = s.cluster.as_ref().map(|c| c.move_progress()).unwrap_or_default();
    let reply = Moves { moves: moves_of(&s.broker.meta().snapshot(), &local) };
    json_response(StatusCode::OK, serde_json::to_string(&reply).expect("moves serialize"))
}

/// Body of `POST /v1/cluster/moves`: move one partition by hand.
#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The member to move it to.
    pub to: String,
}

/// `POST /v1/cluster/moves`: start moving one partition to a member (admin).
#[utoipa::path(
    post,
    operation_id = "start_cluster_move",
    path = "/v1/cluster/moves",
    tag = "cluster",
    request_body = MoveRequest,
    responses(
        (status = 202, description = "The move is planned (its target copies the partition, then the owner flips); `GET /v1/cluster/moves` shows it until it ends", body = MoveJson),
        (status = 400, description = "Malformed body, or the partition is already on that member", body = ErrorBody),
        (status = 401, description = "No or bad credentials", body = ErrorBody),
        (status = 403, description = "Not an admin", body = ErrorBody),
        (status = 404, description = "No such topic or member", body = ErrorBody),
        (status = 409, description = "The partition is moving already, the member is dead or draining, or 8 moves are in flight", body = ErrorBody),
        (status = 503, description = "No metastore quorum", body = ErrorBody),
    )
)]
pub async fn start_move(
    State(s): State<Shared>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    require_admin(&caller)?;
    let req: MoveRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid move: {e}")))?;
    let meta = s.broker.meta().clone();
    let state = meta.snapshot();
    let topic =
        state.topic(&req.topic).ok_or_else(|| MetaError::NotFound("topic not found".into()))?;
    let incarnation = topic.incarnation();
    let from = state.assignment(&req.topic, req.partition).map(|a| a.owner_id.clone()).ok_or_else(
        || MetaError::Conflict(format!("partition {} has no owner yet", req.partition)),
    )?;
    drop(state);
    let (t, p, to, owner) = (req.topic.clone(), req.partition, req.to.clone(), from.clone());
    run(move || Ok(meta.set_assignment_target(&t, incarnation, p, &owner, &to)?)).await?;
    audit(&caller, "cluster.move", &format!("{}/{}", req.topic, req.partition));
    let reply =
        MoveJson { topic: req.topic, partition: req.partition, from, to: req.to, progress: None };
    Ok(json_response(
        StatusCode::ACCEPTED,
        serde_json::to_string(&reply).expect("a move serializes"),
    ))
}

/// `POST /v1/cluster/members/{id}/decommission`: mark the member draining.
#[utoipa::path(
    post,
    operation_id = "decommission_member",
    path = "/v1/cluster/members/{id}/decommission",
    tag = "cluster",
    params(("id" = String, Path, description = "The member's node id")),
    responses(
        (status = 204, description = "The member is draining: it gets no new partitions and its partitions are planned away"),
        (status = 401, description = "No or bad credentials", body = ErrorBody),
        (status = 403, description = "Not an admin", body = ErrorBody),
        (status = 404, description = "No such member", body = ErrorBody),
        (status = 503, description = "No metastore quorum", body = ErrorBody),
    )
)]
pub async fn decommission(
    State(s): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    set_draining(&s, &caller, id, true).await
}

/// `DELETE /v1/cluster/members/{id}/decommission`: cancel a decommission.
#[utoipa::path(
    delete,
    operation_id = "cancel_decommission",
    path = "/v1/cluster/members/{id}/decommission",
    tag = "cluster",
    params(("id" = String, Path, description = "The member's node id")),
    responses(
        (status = 204, description = "The member is no longer draining (moves already done stay done)"),
        (status = 401, description = "No or bad credentials", body = ErrorBody),
        (status = 403, description = "Not an admin", body = ErrorBody),
        (status = 404, description = "No such member", body = ErrorBody),
        (status = 503, description = "No metastore quorum", body = ErrorBody),
    )
)]
pub async fn cancel_decommission(
    State(s): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    set_draining(&s, &caller, id, false).await
}

async fn set_draining(
    s: &Shared,
    caller: &Caller,
    id: String,
    draining: bool,
) -> Result<Response, ApiError> {
    require_admin(caller)?;
    let meta = s.broker.meta().clone();
    if meta.snapshot().member(&id).is_none() {
        return Err(MetaError::NotFound("member not found".into()).into());
    }
    let target = id.clone();
    run(move || Ok(meta.set_member_draining(&target, draining).map(drop)?)).await?;
    let event = if draining { "cluster.decommission" } else { "cluster.decommission.cancel" };
    audit(caller, event, &id);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v1/cluster/status`.
#[utoipa::path(
    get,
    operation_id = "cluster_status",
    path = "/v1/cluster/status",
    tag = "cluster",
    responses(
        (status = 200, description = "This node's view of the control plane", body = ClusterStatus),
        (status = 401, description = "No or bad credentials", body = ErrorBody),
    )
)]
pub async fn status(State(s): State<Shared>) -> Response {
    let status = match &s.cluster {
        Some(view) => view.status(),
        None => {
            ClusterStatus::single(s.broker.node_id(), s.broker.meta().snapshot().applied_index())
        }
    };
    json_response(StatusCode::OK, serde_json::to_string(&status).expect("status serializes"))
}
