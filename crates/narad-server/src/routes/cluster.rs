//! `/v1/cluster` (SPEC §1.9): the members the metastore knows and this
//! node's view of the control plane. Reads, so any authenticated user
//! (SPEC §1.2); both answer from local state (possibly stale on a
//! follower), on a single node too.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use narad_broker::ownership::member_loads;
use narad_meta::{MemberStatus, MetaState};
use serde::Serialize;
use utoipa::ToSchema;

use crate::cluster::ClusterStatus;
use crate::error::json_response;
use crate::openapi::ErrorBody;
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
    /// Being decommissioned (no decommission exists yet: always false).
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
                draining: false,
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
