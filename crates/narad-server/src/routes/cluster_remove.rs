//! `DELETE /v1/cluster/members/{id}?force=true` (`narad cluster remove <id>
//! --force`, admin, audited `cluster.remove`): removes a member that is gone
//! for good (its disk is lost) and gives its partitions new owners.
//!
//! # Start offsets
//!
//! The metastore holds no high watermarks, so each partition's new log
//! starts above what the cluster has seen of it: the highest offset any
//! live node saw the removed owner assign (a commit's answer) or serve (a
//! forwarded ack), plus one (node RPC op 40, [`narad_node::offsets_seen`]),
//! plus a margin of [`START_OFFSET_MARGIN`]. What the survivors saw is a
//! lower bound of the owner's high watermark only: records the owner
//! committed from its own WAL (produced to it directly) and nobody else
//! saw are above it, and a node forgets what it saw when it restarts. Had
//! the new log started at that bound, such offsets would be handed out a
//! second time, for other records, and a consumer that deduplicates by
//! (partition, offset) would drop the new ones. The margin leaves room for
//! 2^20 unseen records per partition; offsets still grow past a gap, which
//! nothing relies on being dense. Offsets are reused only if the removed
//! node committed more than that unseen, which the WARN line and the docs
//! say.
//!
//! What is lost: the records of each partition that the removed node held
//! and nobody consumed (at offsets below the new start; which of them were
//! consumed the survivors do not know), and what it had accepted into its
//! own ingress WAL and not yet committed anywhere.

use axum::Extension;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use narad_meta::{MemberStatus, MetaError, RemovedPartition};
use serde::Serialize;
use utoipa::ToSchema;

use crate::access::Caller;
use crate::error::{ApiError, json_response};
use crate::routes::users::{audit, require_admin, run};
use crate::state::Shared;

/// Offsets left between the highest one the cluster saw of a removed
/// member's partition and its new log's first (see the module docs).
pub const START_OFFSET_MARGIN: u64 = 1 << 20;

/// One partition of the removed member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct RemovedPartitionJson {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// Its new owner (absent in a refusal: placed when the removal applies).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The highest offset the live members saw of it, plus one (0: none).
    pub seen_next_offset: u64,
    /// The offset its new log starts at.
    pub start_offset: u64,
}

/// `DELETE /v1/cluster/members/{id}`'s 200.
#[derive(Debug, Serialize, ToSchema)]
pub struct Removed {
    /// The member removed.
    pub removed: String,
    /// Its partitions, now with new owners.
    pub partitions: Vec<RemovedPartitionJson>,
    /// Live members that did not say what they saw (their offsets are not
    /// in the start offsets).
    pub unanswered: Vec<String>,
}

/// `DELETE /v1/cluster/members/{id}?force=true`.
#[utoipa::path(
    delete,
    operation_id = "remove_member",
    path = "/v1/cluster/members/{id}",
    tag = "cluster",
    params(
        ("id" = String, Path, description = "The member's node id"),
        ("force" = Option<bool>, Query, description = "Required: the records the member held that nobody consumed are lost"),
    ),
    responses(
        (status = 200, description = "The member is removed: its partitions have new owners whose logs start above the offsets the cluster saw, and it left the Raft group", body = Removed),
        (status = 400, description = "Without force=true: what would be lost", body = ErrorBody),
        (status = 401, description = "No or bad credentials", body = ErrorBody),
        (status = 403, description = "Not an admin", body = ErrorBody),
        (status = 404, description = "No such member", body = ErrorBody),
        (status = 409, description = "The member is alive (only a member marked dead can be removed), came back meanwhile, or nobody alive can take its partitions", body = ErrorBody),
        (status = 503, description = "No metastore quorum", body = ErrorBody),
    )
)]
pub async fn remove(
    State(s): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    require_admin(&caller)?;
    let force = match query.as_deref().unwrap_or("") {
        "" => false,
        "force=true" => true,
        "force=false" => false,
        other => {
            return Err(ApiError::bad_request(format!("unknown query {other:?}; only force=true")));
        }
    };
    let meta = s.broker.meta().clone();
    let state = meta.snapshot();
    let Some(member) = state.member(&id).cloned() else {
        drop(state);
        return finish_group_removal(&s, &caller, id, force).await;
    };
    if member.status != MemberStatus::Dead {
        return Err(MetaError::Conflict(format!(
            "member {id} is alive: only a member the cluster marks dead (30 s without a \
             heartbeat) can be removed; to take a live node out, drain it (narad cluster drain {id})"
        ))
        .into());
    }
    let (seen, unanswered) = match &s.cluster {
        Some(view) => view.known_offsets().await,
        None => (Vec::new(), Vec::new()),
    };
    let mut parts = Vec::new();
    for t in state.topics() {
        for (&p, a) in state.assignments(t.name()).into_iter().flat_map(|a| a.iter()) {
            if a.owner_id != id {
                continue;
            }
            let next = seen
                .iter()
                .filter(|k| {
                    k.topic == t.name() && k.incarnation == t.incarnation() && k.partition == p
                })
                .map(|k| k.next_offset)
                .max()
                .unwrap_or(0);
            parts.push((t.name().to_owned(), t.incarnation(), p, next, next + START_OFFSET_MARGIN));
        }
    }
    drop(state);
    let listing = |owner: &dyn Fn(&str, u32) -> Option<String>| {
        parts
            .iter()
            .map(|(t, _, p, next, start)| RemovedPartitionJson {
                topic: t.clone(),
                partition: *p,
                owner: owner(t, *p),
                seen_next_offset: *next,
                start_offset: *start,
            })
            .collect::<Vec<_>>()
    };
    if !force {
        let shown: Vec<String> = listing(&|_, _| None)
            .iter()
            .map(|r| {
                format!("{}/{} (offsets below {} seen)", r.topic, r.partition, r.seen_next_offset)
            })
            .collect();
        return Err(ApiError::bad_request(format!(
            "removing {id} for good: the records it held that nobody consumed are lost, in its {} \
             partitions: {}; and so is whatever it accepted and had not committed yet. Its partitions \
             get new owners whose logs start {START_OFFSET_MARGIN} offsets above the highest one \
             the cluster saw. Repeat with force=true (narad cluster remove {id} --force)",
            shown.len(),
            if shown.is_empty() { "none".to_owned() } else { shown.join(", ") }
        )));
    }
    let starts: Vec<RemovedPartition> = parts
        .iter()
        .map(|(topic, incarnation, partition, _, start)| RemovedPartition {
            topic: topic.clone(),
            incarnation: *incarnation,
            partition: *partition,
            base_offset: *start,
        })
        .collect();
    let (target, heartbeat) = (id.clone(), member.last_heartbeat);
    let (_, reassigned) = run(move || Ok(meta.remove_member(&target, heartbeat, starts)?)).await?;
    audit(&caller, "cluster.remove", &id);
    let owner_of = |t: &str, p: u32| {
        reassigned.iter().find(|r| r.topic == t && r.partition == p).map(|r| r.owner_id.clone())
    };
    let partitions = listing(&owner_of);
    let lines: Vec<String> = partitions
        .iter()
        .map(|r| {
            format!(
                "{}/{} -> {} at offset {} (lost: what {id} held below offset {} and nobody \
                 consumed; the cluster saw offsets below {})",
                r.topic,
                r.partition,
                r.owner.as_deref().unwrap_or("?"),
                r.start_offset,
                r.start_offset,
                r.seen_next_offset
            )
        })
        .collect();
    tracing::warn!(
        member = %id,
        partitions = partitions.len(),
        unanswered = ?unanswered,
        reassigned = %lines.join("; "),
        "member removed for good: its partitions have new owners with empty logs; the records it \
         held that nobody consumed are lost"
    );
    let reply = Removed { removed: id, partitions, unanswered };
    Ok(json_response(StatusCode::OK, serde_json::to_string(&reply).expect("removal serializes")))
}

/// The member is gone from the metastore: a removal whose raft step did
/// not commit (its leader stopped or lost its quorum in between) left it in
/// the raft group, where a dead voter still counts toward every quorum.
/// Repeating the removal takes it out (the leader's `write_local`); an id
/// in neither is 404.
async fn finish_group_removal(
    s: &Shared,
    caller: &Caller,
    id: String,
    force: bool,
) -> Result<Response, ApiError> {
    let in_group = s.cluster.as_ref().is_some_and(|view| {
        let status = view.status();
        status.voters.contains(&id) || status.learners.contains(&id)
    });
    if !in_group {
        return Err(MetaError::NotFound("member not found".into()).into());
    }
    if !force {
        return Err(ApiError::bad_request(format!(
            "{id} is no member any more (an earlier removal) but still in the raft group; repeat \
             with force=true (narad cluster remove {id} --force) to take it out"
        )));
    }
    let meta = s.broker.meta().clone();
    let target = id.clone();
    match run(move || Ok(meta.remove_member(&target, 0, Vec::new())?)).await {
        // The leader took it out of the group (or a node under the id came
        // back and was removed again by this call).
        Ok(_) => {}
        Err(e) if e.status() == StatusCode::NOT_FOUND => {}
        Err(e) => return Err(e),
    }
    audit(caller, "cluster.remove", &id);
    tracing::warn!(member = %id, "removed member left the raft group (an earlier removal's last step)");
    let reply = Removed { removed: id, partitions: Vec::new(), unanswered: Vec::new() };
    Ok(json_response(StatusCode::OK, serde_json::to_string(&reply).expect("removal serializes")))
}

use crate::openapi::ErrorBody;
