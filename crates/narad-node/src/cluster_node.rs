//! The cluster side of a node (DESIGN §6b). With peers configured the
//! node binds node RPC (QUIC, `cluster.addr`), starts the replicated
//! metastore ([`ControlPlane`]) over it, routes this node's metadata writes
//! through it, and runs the membership heartbeat and the leader's
//! controller. Without peers none of this exists and the metastore applies
//! directly, as a single node always has.
//!
//! Start-up ([`crate::node::Node::start`]): metastore opened → node RPC
//! bound → consensus started over the store → writes routed through it →
//! broker opened on the store → membership → HTTP. `/readyz` turns 200 once a leader is visible and this
//! replica has applied what it knows committed, or after
//! [`READY_CATCH_UP_WAIT`] with a leader visible (SPEC §7.6).
//!
//! Shutdown: HTTP drained → broker stopped → membership stopped →
//! leadership handed over (as leader) and consensus stopped → QUIC closed.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use narad_broker::dispatch::resolve::{DeleteConfirmer, LeaderTopic, OwnerIds};
use narad_broker::owner::{BatchRecord, CommitBatch, CommitError};
use narad_broker::{AckAction, Broker, PartitionStats, Routing};
use narad_clock::ClockRef;
use narad_cluster::commit_answer::CommitAnswer;
use narad_cluster::raft::{
    ControlPlane, ControlPlaneConfig, LeaderTopicView, PeerEntry, RaftTimings, Role,
};
use narad_cluster::rpc::{self, PartitionStatsRequest, Reply, Request};
use narad_cluster::{Handler, Membership, PeerIdentity, RpcMetrics, Transport};
use narad_fs::FsRef;
use narad_meta::{Member, MetaStore};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use crate::error::{self, NodeError};
use crate::forward::{self, ConsumeAsk, PartitionRoute, PeerAnswer};
use crate::remote_owner::{RemoteCommitMetrics, RemoteOwner, RemoteOwnerRef};
use crate::settings::ClusterSettings;
use crate::view::{BoxFuture, ClusterMode, ClusterRole, ClusterStatus, ClusterView};
use narad_broker::ownership::OwnerLiveness;

/// How long a node that sees a leader waits for its replica to catch up
/// before it calls itself ready anyway (SPEC §7.6: 60 s).
pub const READY_CATCH_UP_WAIT: Duration = Duration::from_secs(60);

/// How long `GET /v1/topics/{topic}` waits for an owner's partition
/// figures (SPEC §7.4's reply timeout).
pub const OWNER_STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// How often unconfirmed orphan directories are asked about.
const ORPHAN_CONFIRM_INTERVAL: Duration = Duration::from_secs(2);

/// Answers node RPC: the control plane's ops (20, 21, 29-33), a
/// partition's figures (8), commits of records other nodes accepted for
/// partitions this node owns (10, 11), consume, replay and ack of this
/// node's partitions for clients of other nodes (2, 3, 18, 19), its
/// partitions' ready counts (37), and fan-out link changes and lag for the
/// parent partitions it owns (17, 34, 35).
/// Any other op is answered `400 unsupported rpc operation N`.
#[derive(Debug)]
struct NodeHandler {
    node_id: String,
    control: OnceLock<Arc<ControlPlane>>,
    broker: OnceLock<Arc<Broker>>,
    /// Test switch (`NARAD_TEST_REFUSE_INCARNATION_SECTION=1`): answer a
    /// commit batch carrying topic incarnation ids as a release from before
    /// them does (400, trailing bytes), so the sender's fallback can be
    /// tested against a real process.
    refuse_incarnation_section: bool,
}

impl Handler for NodeHandler {
    async fn handle(&self, from: Arc<PeerIdentity>, request: Request) -> Reply {
        let Some(control) = self.control.get() else {
            return starting();
        };
        match request {
            Request::TopicPartitionStats(_)
            | Request::CommitProduceBatch(_)
            | Request::CommitProduce(_)
            | Request::Consume(_)
            | Request::Ack(_)
            | Request::ExtendAck(_)
            | Request::Nack(_)
            | Request::FanoutCursors(_)
            | Request::AnchorFanoutLink(_)
            | Request::SettleFanoutLinks(_)
            | Request::ReadyCounts(_) => match self.broker.get() {
                Some(broker) => self.data_plane(broker, request).await,
                None => starting(),
            },
            Request::KnownOffsets => {
                let known = crate::offsets_seen::global().known();
                Reply::json(200, serde_json::to_vec(&known).unwrap_or_default())
            }
            // A freeze is granted only on a replica caught up with the
            // leader: one lagging behind an AbortMove of an earlier attempt
            // of the same move (same source, same target) would freeze for
            // the later mover and then lift that freeze when the abort
            // applies, while the mover copies the tail and flips (records
            // committed after the lift lost: cluster_sim seed 447 with
            // NARAD_SIM_UNNAMED_MOVES=1).
            Request::PrepareHandoff(_) if control.caught_up_with_leader().await.is_err() => {
                Reply::error(
                    503,
                    "this node's metastore replica has not caught up with the leader yet; retry the freeze",
                )
            }
            Request::ListPartitionSegments(_)
            | Request::FetchSegmentChunk(_)
            | Request::PrepareHandoff(_) => match self.broker.get() {
                Some(broker) => match crate::moves::serve(broker, &from, &request).await {
                    Some(reply) => reply,
                    None => unsupported(&request),
                },
                None => starting(),
            },
            request => match control.handle(&from, &request).await {
                Some(reply) => reply,
                None => unsupported(&request),
            },
        }
    }
}

/// The answer to any request before this node's broker or control plane is
/// up.
fn starting() -> Reply {
    Reply::error(503, "node is starting")
}

fn unsupported(request: &Request) -> Reply {
    Reply::error(400, &format!("unsupported rpc operation {}", request.op() as u8))
}

impl NodeHandler {
    /// The ops the broker serves: partitions, commits, consumes and acks,
    /// fan-out links.
    async fn data_plane(&self, broker: &Arc<Broker>, request: Request) -> Reply {
        match request {
            Request::TopicPartitionStats(r) => self.partition_stats(broker, &r),
            Request::CommitProduceBatch(records) => {
                self.commit_for_peer(broker, records).await.to_reply()
            }
            Request::CommitProduce(record) => {
                self.commit_for_peer(broker, vec![record]).await.to_reply()
            }
            Request::Consume(c) => self.consume_for_peer(broker, c).await,
            Request::Ack(r) => resolve_for_peer(broker, r, AckAction::Ack),
            Request::ExtendAck(r) => resolve_for_peer(broker, r, AckAction::Extend),
            Request::Nack(r) => resolve_for_peer(broker, r, AckAction::Nack),
            Request::FanoutCursors(r) => crate::fanout_peers::lag_for_peer(broker, r).await,
            Request::AnchorFanoutLink(a) => {
                // A stale replica could take a link already committed (a
                // late or repeated request) for a new one and move its
                // cursor to the high watermark: anchor only once caught up
                // (refused, the cursor starts from the link's attach time).
                let fresh = match self.control.get() {
                    Some(control) => control.caught_up_with_leader().await,
                    None => Err("the control plane is starting".to_owned()),
                };
                match fresh {
                    Ok(()) => crate::fanout_peers::anchor_for_peer(broker, a).await,
                    Err(why) => Reply::error(
                        503,
                        &format!("this replica has not caught up with the raft leader: {why}"),
                    ),
                }
            }
            Request::SettleFanoutLinks(index) => {
                crate::fanout_peers::settle_for_peer(broker, index).await
            }
            Request::ReadyCounts(r) => crate::consume::ready_for_peer(broker, r).await,
            other => unsupported(&other),
        }
    }

    /// Whether this node owns `partition` of `topic`.
    fn owns(&self, broker: &Broker, topic: &str, partition: u32) -> bool {
        let snap = broker.meta().snapshot();
        snap.assignment(topic, partition).is_some_and(|a| a.owner_id == self.node_id)
    }

    /// Consume (2) from another node: a pinned consume or replay of a
    /// partition this node owns (421 otherwise), or (`local_only`, no
    /// partition) a queue-mode consume of this node's own partitions. The
    /// answer is what the HTTP consume answers here (200 with the message,
    /// or the batch with `max` above 1; 204; the same errors); the wait is
    /// clamped to 30 s.
    async fn consume_for_peer(&self, broker: &Arc<Broker>, c: rpc::Consume) -> Reply {
        let wait = Duration::from_nanos(c.wait_nanos.max(0) as u64)
            .min(narad_cluster::limits::CONSUME_MAX_WAIT);
        let max = (c.max > 1).then_some(c.max as usize);
        let partition = if c.has_partition {
            let Ok(p) = u32::try_from(c.partition) else {
                return Reply::error(400, "invalid partition");
            };
            if !self.owns(broker, &c.topic, p) {
                return forward::reply_of(error::not_owner());
            }
            Some(p)
        } else {
            None
        };
        let offset = match (c.has_offset, u64::try_from(c.offset)) {
            (false, _) => None,
            (true, Ok(o)) if partition.is_some() => Some(o),
            (true, _) => return Reply::error(400, "invalid offset"),
        };
        match crate::consume::consume_here(broker, &c.topic, partition, offset, wait, max).await {
            Ok(Some(json)) => Reply::json(200, json),
            Ok(None) => {
                Reply { status: 204, content_type: String::new(), body: Default::default() }
            }
            Err(e) => forward::reply_of(e),
        }
    }

    /// CommitProduceBatch (11) and CommitProduce (10): records another
    /// node accepted, for one partition this node owns, committed through
    /// the same combining commit as this node's own (see
    /// `remote_owner` for what each answer tells the sender).
    async fn commit_for_peer(
        &self,
        broker: &Broker,
        records: Vec<rpc::CommitRecord>,
    ) -> CommitAnswer {
        if self.refuse_incarnation_section && records.iter().any(|r| r.incarnation.is_some()) {
            return CommitAnswer::ids_refused_like_an_old_owner();
        }
        let Some(first) = records.first() else {
            return CommitAnswer::BadRequest("empty commit batch".into());
        };
        let (topic, partition) = (first.topic.clone(), first.partition);
        if records.iter().any(|r| r.topic != topic || r.partition != partition) {
            return CommitAnswer::BadRequest(
                "a commit batch holds the records of one partition".into(),
            );
        }
        let snap = broker.meta().snapshot();
        let Some(t) = snap.topic(&topic).cloned() else {
            return CommitAnswer::NoTopic(format!("topic not found: {topic}"));
        };
        let Some(partition) = u32::try_from(partition).ok().filter(|p| *p < t.partitions()) else {
            return CommitAnswer::BadRequest("invalid partition".into());
        };
        let owner = narad_broker::ownership::partition_owner(&snap, &topic, partition);
        if owner.owner_node.as_deref() != Some(self.node_id.as_str()) {
            let by = owner.owner_node.unwrap_or_else(|| "nobody yet".into());
            return CommitAnswer::NotOwner(format!(
                "not partition owner: {topic}/{partition} is owned by {by}"
            ));
        }
        if let Some(sent) =
            records.iter().filter_map(|r| r.incarnation).find(|id| id.get() != t.incarnation())
        {
            crate::remote_owner::log_incarnation_refusal(&topic, sent.get(), t.incarnation());
            return CommitAnswer::IncarnationMismatch(format!(
                "records accepted for incarnation {sent} of topic {topic}, which is incarnation {} here",
                t.incarnation()
            ));
        }
        let batch = CommitBatch {
            topic: topic.as_str().into(),
            partition,
            records: records
                .into_iter()
                .map(|r| BatchRecord {
                    incarnation: r.incarnation.map(|id| id.get()),
                    key: r.key,
                    payload: r.payload,
                    accepted_at_ms: u64::try_from(r.created_at).unwrap_or(0),
                })
                .collect(),
        };
        match broker.commit_for_peer(batch).await {
            Ok(outcome) => CommitAnswer::Committed {
                offsets: outcome.offsets().collect(),
                count: outcome.count,
            },
            Err(CommitError::Refused(why)) => match broker.meta().topic(&topic) {
                None => CommitAnswer::NoTopic(format!("topic not found: {why}")),
                Some(_) => CommitAnswer::IncarnationMismatch(why),
            },
            Err(CommitError::NotOwner(why)) => CommitAnswer::NotOwner(why),
            Err(CommitError::Failed(why)) => {
                CommitAnswer::Failed { status: 500, why: format!("commit failed: {why}") }
            }
            Err(CommitError::Unavailable(why)) => CommitAnswer::Unavailable(why),
            Err(CommitError::Frozen(why)) => CommitAnswer::Frozen(why),
        }
    }

    /// TopicPartitionStats (8): this node's figures of one partition of the
    /// topic's live incarnation (404 when the topic, or the asked
    /// incarnation, is not live here).
    fn partition_stats(&self, broker: &Broker, r: &PartitionStatsRequest) -> Reply {
        let t = match broker.topic(&r.topic) {
            Ok(t) => t,
            Err(narad_broker::BrokerError::TopicNotFound) => {
                return Reply::error(404, "topic not found");
            }
            Err(e) => return Reply::error(500, &format!("topic partition stats: {e}")),
        };
        if let Some(asked) = r.incarnation
            && asked.get() != t.incarnation()
        {
            return Reply::error(
                404,
                &format!(
                    "topic not found: incarnation {} is not the live one ({})",
                    asked,
                    t.incarnation()
                ),
            );
        }
        let Some(p) = u32::try_from(r.partition).ok().filter(|p| *p < t.partitions()) else {
            return Reply::error(400, "invalid partition");
        };
        match broker.partition_stats(&t, Some(p)).pop() {
            Some(stats) => match serde_json::to_vec(&stats) {
                Ok(body) => Reply::json(200, body),
                Err(e) => Reply::error(500, &format!("encode partition stats: {e}")),
            },
            None => Reply::error(400, "invalid partition"),
        }
    }
}

/// A running cluster node's control plane.
#[derive(Debug)]
pub struct ClusterNode {
    node_id: String,
    meta: Arc<MetaStore>,
    transport: Arc<Transport>,
    control: Arc<ControlPlane>,
    handler: Arc<NodeHandler>,
    membership: OnceLock<Membership>,
    /// The control plane's file system and the data directory (to probe
    /// the disk once the control plane stopped).
    storage: (FsRef, std::path::PathBuf),
    orphan_task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The partition mover, the freeze expiry, the leftover discards and
    /// the produce release (aborted by `shutdown`).
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    move_stop: tokio::sync::watch::Sender<bool>,
    /// The destination's mover, once the broker is attached.
    mover: OnceLock<Arc<crate::moves::Mover>>,
    move_metrics: crate::moves::MoveMetrics,
    /// `cluster.move_copy_rate` (bytes/s, 0: none).
    move_copy_rate: u64,
    /// `narad_cluster_forwarded_requests_total{op,peer,outcome}`.
    forwarded: Family<ForwardLabels, Counter>,
    /// What forwarded consumes whose caller went away gave back.
    releases: crate::forwarded_consume::Releases,
}

/// Labels of the forwarded-request counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
pub struct ForwardLabels {
    /// The node RPC op (`consume`, `ack`, `extend_ack`, `nack`).
    pub op: &'static str,
    /// The member it went to.
    pub peer: String,
    /// The owner's status class (`2xx`, `4xx`, `5xx`); `unreachable` (the
    /// call failed in transport: answered 503 naming the owner), `suspect`
    /// (not sent: a call to it failed and it has not answered since;
    /// answered 503 at once), or `failed` (another transport failure: 502).
    pub outcome: &'static str,
}

/// Why the cluster side could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterStartError {
    /// Node RPC could not bind `cluster.addr`.
    #[error("cannot listen for node RPC on {addr} (udp): {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: narad_cluster::Error,
    },
    /// This node holds metastore state from before it was in a cluster and
    /// would not be the group's only source of it.
    #[error(
        "this node's metastore has state from before it joined a cluster (applied index \
         {applied}) and no Raft state: {why}. A cluster forms from empty nodes, or from one \
         node with state that bootstraps alone (cluster.initial_members = [{node_id}]) while the \
         others start empty and join; move this data directory aside or make this node the \
         only initial member"
    )]
    PreClusterState {
        /// The metastore's applied index.
        applied: u64,
        /// This node.
        node_id: String,
        /// Why its state cannot be used.
        why: &'static str,
    },
    /// An upgraded single node's partitions are owned by another id than
    /// the one it starts under.
    #[error(
        "this node's partitions are owned by node id {owner:?}, and it starts as {node_id:?}: a \
         node's id cannot change. Start it with --node-id {owner} and name it {owner} in the \
         peers and initial members"
    )]
    Renamed {
        /// The id owning its partitions.
        owner: String,
        /// The configured id.
        node_id: String,
    },
    /// Consensus could not start (raft.redb damaged, bad configuration).
    #[error("cannot start the control plane: {0}")]
    Control(#[source] narad_cluster::raft::Error),
    /// A Raft tuning variable is set but is not a positive whole number.
    #[error(
        "{var} must be a whole number of entries (above 0 for the snapshot threshold), got {value:?}"
    )]
    Tuning {
        /// The environment variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
}

/// The Raft timings: the defaults, with the snapshot threshold tuned by
/// `NARAD_RAFT_SNAPSHOT_AFTER_ENTRIES` (a snapshot every N applied
/// entries) and `NARAD_RAFT_ENTRIES_KEPT_AFTER_SNAPSHOT` (log kept behind
/// it) when set (docs/CONFIGURATION.md).
fn raft_timings_from_env() -> Result<RaftTimings, ClusterStartError> {
    let mut t = RaftTimings::default();
    let read = |var: &'static str, zero_ok: bool| -> Result<Option<u64>, ClusterStartError> {
        match std::env::var(var) {
            Err(_) => Ok(None),
            Ok(value) => match value.trim().parse::<u64>() {
                Ok(n) if n > 0 || zero_ok => Ok(Some(n)),
                _ => Err(ClusterStartError::Tuning { var, value }),
            },
        }
    };
    if let Some(n) = read("NARAD_RAFT_SNAPSHOT_AFTER_ENTRIES", false)? {
        t.snapshot_after_entries = n;
    }
    if let Some(n) = read("NARAD_RAFT_ENTRIES_KEPT_AFTER_SNAPSHOT", true)? {
        t.entries_kept_after_snapshot = n;
    }
    Ok(t)
}

/// A node whose metastore applied commands before it had any Raft state
/// (an upgraded single node) brings state the Raft log does not hold. The
/// group's state machines agree only if every member starts from the same
/// state: that node must bootstrap alone (it files its state as the
/// group's first snapshot, `narad_cluster::raft::upgrade`), and the others
/// start empty and install that snapshot. Two such nodes, or one
/// that joins or bootstraps with others, would diverge (different topics,
/// different incarnation ids) silently, so the start is refused.
fn refuse_diverging_state(
    settings: &ClusterSettings,
    meta: &MetaStore,
) -> Result<(), ClusterStartError> {
    let applied = meta.snapshot().applied_index();
    if applied == 0 || meta.raft_state().is_some() {
        return Ok(());
    }
    let bootstrappers: Vec<&str> = if settings.initial_members.is_empty() {
        settings.peers.iter().map(|p| p.id.as_str()).collect()
    } else {
        settings.initial_members.iter().map(String::as_str).collect()
    };
    let why = if settings.join_only() {
        "it would join a group whose log does not hold that state"
    } else if bootstrappers != [settings.node_id.as_str()] {
        "it would bootstrap together with other nodes that do not hold that state"
    } else {
        // The single node's partitions are owned by the id it ran under:
        // under another one they would be owned by nobody alive.
        let foreign = crate::node_identity::foreign_owners(meta, &settings.node_id, &[]);
        if let Some(owner) = foreign.first() {
            return Err(ClusterStartError::Renamed {
                owner: owner.clone(),
                node_id: settings.node_id.clone(),
            });
        }
        return Ok(());
    };
    Err(ClusterStartError::PreClusterState { applied, node_id: settings.node_id.clone(), why })
}

impl ClusterNode {
    /// Binds node RPC, starts consensus over `meta` and routes `meta`'s
    /// writes through it. Call before the broker opens on `meta`.
    pub async fn start(
        settings: &ClusterSettings,
        http_addr: String,
        meta: Arc<MetaStore>,
        data_dir: std::path::PathBuf,
        fs: FsRef,
        registry: &mut Registry,
    ) -> Result<Arc<ClusterNode>, ClusterStartError> {
        refuse_diverging_state(settings, &meta)?;
        let timings = raft_timings_from_env()?;
        let rpc_metrics = RpcMetrics::default();
        rpc_metrics.register(registry);
        let handler = Arc::new(NodeHandler {
            node_id: settings.node_id.clone(),
            control: OnceLock::new(),
            broker: OnceLock::new(),
            refuse_incarnation_section: std::env::var("NARAD_TEST_REFUSE_INCARNATION_SECTION")
                .is_ok_and(|v| v == "1"),
        });
        let transport = Transport::serve(
            settings.bind_addr,
            settings.auth.clone(),
            rpc_metrics,
            handler.clone(),
        )
        .map_err(|source| ClusterStartError::Bind { addr: settings.bind_addr, source })?;
        let transport = Arc::new(transport);
        let fs = crate::control_restart::control_plane_fs(fs, &data_dir);
        let storage = (fs.clone(), data_dir.clone());
        let config = ControlPlaneConfig {
            node_id: settings.node_id.clone(),
            cluster_addr: settings.advertised_addr,
            http_addr,
            peers: settings
                .peers
                .iter()
                .map(|p| PeerEntry { id: p.id.clone(), addr: p.addr })
                .collect(),
            initial_members: settings.initial_members.clone(),
            data_dir,
            fs,
            timings,
        };
        let control = ControlPlane::start(config, meta.clone(), transport.clone(), registry)
            .await
            .map_err(ClusterStartError::Control)?;
        let _ = handler.control.set(control.clone());
        meta.set_replicator(control.clone());
        let forwarded = Family::<ForwardLabels, Counter>::default();
        registry.register(
            "cluster_forwarded_requests",
            "Consumes, replays and acks forwarded to the partition's owner, by op, peer and outcome",
            forwarded.clone(),
        );
        info!(
            node_id = %settings.node_id,
            cluster_addr = %settings.advertised_addr,
            peers = settings.peers.len(),
            join_only = settings.join_only(),
            "control plane started"
        );
        Ok(Arc::new(ClusterNode {
            node_id: settings.node_id.clone(),
            meta,
            transport,
            control,
            handler,
            membership: OnceLock::new(),
            storage,
            orphan_task: std::sync::Mutex::new(None),
            tasks: std::sync::Mutex::new(Vec::new()),
            move_stop: tokio::sync::watch::channel(false).0,
            mover: OnceLock::new(),
            move_metrics: crate::moves::MoveMetrics::new(registry),
            move_copy_rate: settings.move_copy_rate,
            forwarded,
            releases: crate::forwarded_consume::Releases::new(registry),
        }))
    }

    /// Hands the opened broker to node RPC (op 8) and starts settling the
    /// topic directories it kept at start-up: each is removed once this
    /// replica has caught up and the leader confirms the topic is gone
    /// (SPEC §7.1); one the leader still has stays for this replica to
    /// learn it; nothing is removed while no leader answers.
    pub fn attach_broker(self: &Arc<Self>, broker: Arc<Broker>) {
        let _ = self.handler.broker.set(broker.clone());
        {
            // The broker holds produce until this node has reached its
            // group's leader (see `Broker::release_produce`): a replica
            // that never heard from a leader since the start may be one the
            // cluster removed, whose partitions are no longer its own.
            let (control, b) = (self.control.clone(), broker.clone());
            self.tasks.lock().unwrap_or_else(|p| p.into_inner()).push(tokio::spawn(async move {
                control.wait_leader_reached().await;
                b.release_produce();
            }));
        }
        {
            let mover = crate::moves::Mover::new(
                self.node_id.clone(),
                self.meta.clone(),
                broker.clone(),
                self.transport.clone(),
                self.move_metrics.clone(),
                crate::copy_rate::CopyRate::new(self.move_copy_rate),
            );
            let _ = self.mover.set(mover.clone());
            let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
            tasks.push(tokio::spawn(mover.run(self.move_stop.subscribe())));
            tasks.push(tokio::spawn(crate::moves::expire_freezes(
                broker.clone(),
                self.move_stop.subscribe(),
            )));
            tasks.push(tokio::spawn(crate::moves::discard_leftovers(
                broker.clone(),
                self.control.clone(),
                self.move_stop.subscribe(),
            )));
        }
        if broker.unconfirmed_orphans().is_empty() {
            return;
        }
        let me = self.clone();
        let task = tokio::spawn(async move { me.settle_orphans(broker).await });
        *self.orphan_task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
    }

    async fn settle_orphans(&self, broker: Arc<Broker>) {
        let mut last_warn: Option<std::time::Instant> = None;
        loop {
            let names = broker.unconfirmed_orphans();
            if names.is_empty() {
                info!("every topic directory kept at start-up is settled");
                return;
            }
            if self.control.caught_up_with_leader().await.is_ok() {
                for name in names {
                    if broker.knows_topic(&name) {
                        info!(topic = %name, "this replica learned the topic: its files stay");
                        broker.forget_orphan(&name);
                        continue;
                    }
                    match self.control.leader_topic_view(&name).await {
                        Ok(LeaderTopicView::Absent) => {
                            if let Err(e) = broker.remove_confirmed_orphan(&name).await {
                                warn!(topic = %name, error = %e, "cannot remove the files of a deleted topic; retrying");
                            }
                        }
                        Ok(LeaderTopicView::Present { incarnation }) => {
                            info!(topic = %name, incarnation, "the leader has this topic: its files stay until this replica learns it");
                        }
                        Err(why) => {
                            if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                                last_warn = Some(std::time::Instant::now());
                                warn!(topic = %name, why, "cannot confirm with the leader that a topic is gone: its files stay; asking again");
                            }
                        }
                    }
                }
            }
            tokio::time::sleep(ORPHAN_CONFIRM_INTERVAL).await;
        }
    }

    /// How this node's dispatcher reaches partition owners: its own
    /// partitions through the local owner, the others' over node RPC
    /// ([`RemoteOwner`]), and the leader's word before a record of a topic
    /// this replica does not hold is discarded.
    pub fn routing(&self, clock: ClockRef, registry: &mut Registry) -> Routing {
        let ids = Arc::new(OwnerIds::new(&self.node_id));
        let remote = RemoteOwner::new(
            self.meta.clone(),
            self.transport.clone(),
            ids.clone(),
            clock,
            RemoteCommitMetrics::new(registry),
        );
        Routing::Cluster {
            ids,
            remote: Arc::new(RemoteOwnerRef(Arc::new(remote))),
            confirmer: Arc::new(LeaderConfirmer { control: self.control.clone() }),
            links: Arc::new(crate::fanout_peers::RemoteLinks::new(
                self.meta.clone(),
                self.transport.clone(),
            )),
            freshness: Arc::new(Freshness { control: self.control.clone() }),
        }
    }

    /// The connection to `member`.
    fn peer_of(&self, member: &str) -> Result<Arc<narad_cluster::Peer>, String> {
        let addr = member_addr(&self.meta, member)?;
        Ok(self.transport.peer(addr, narad_cluster::tls::DEFAULT_SERVER_NAME))
    }

    /// Whether a call to `member` failed in transport and it has not
    /// answered since (`narad_cluster::suspect`).
    fn is_suspect(&self, member: &str) -> bool {
        self.peer_of(member).is_ok_and(|p| p.suspicion().is_some())
    }

    /// Sends `request` to `member`, waiting at most `timeout` (a watched
    /// call: an owner that stops answering pings fails it within about
    /// 1.5 s); a suspect member is not asked.
    async fn call_member(
        &self,
        member: &str,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, String> {
        let peer = self.peer_of(member)?;
        if let Some(s) = peer.suspicion() {
            return Err(format!("{member} is unreachable: {}", s.why));
        }
        peer.call_watched(request, timeout).await.map_err(|e| format!("{member}: {e}"))
    }

    /// The figures of `topic`'s partition `partition` as its owner `owner`
    /// has them (node RPC op 8, [`OWNER_STATS_TIMEOUT`]).
    pub async fn fetch_partition_stats(
        &self,
        owner: &str,
        topic: &str,
        incarnation: u64,
        partition: u32,
    ) -> Result<PartitionStats, String> {
        let request = Request::TopicPartitionStats(PartitionStatsRequest {
            topic: topic.to_owned(),
            partition: i32::try_from(partition).map_err(|_| "partition out of range".to_owned())?,
            incarnation: std::num::NonZeroU64::new(incarnation),
        });
        let reply = self.call_member(owner, &request, OWNER_STATS_TIMEOUT).await?;
        if reply.status != 200 {
            return Err(format!(
                "{owner} answered {}: {}",
                reply.status,
                String::from_utf8_lossy(&reply.body)
            ));
        }
        serde_json::from_slice(&reply.body)
            .map_err(|e| format!("{owner} answered unreadable figures: {e}"))
    }

    /// Sends `request` to member `member` and waits at most `timeout` for
    /// its reply; `Err` says why there is none. A member that cannot be
    /// reached (the call failed on a dial, a timeout, a lost connection or
    /// an unanswered ping), or that is suspect because an earlier call did
    /// and it has not answered since, is answered here at once as if it
    /// had said 503 `partition owner N is unreachable; retry later`, and is
    /// left out of [`ClusterView::serving_peers`] until it answers a ping.
    /// A forwarded consume whose caller goes away is stopped on the owner,
    /// and what it leased is given back (`forwarded_consume`).
    async fn forward(
        &self,
        member: &str,
        request: Request,
        timeout: Duration,
    ) -> Result<Reply, String> {
        let op = request.op().name();
        let count = |outcome| {
            self.forwarded
                .get_or_create(&ForwardLabels { op, peer: member.to_owned(), outcome })
                .inc()
        };
        let unreachable = || forward::reply_of(error::owner_unreachable(member));
        let peer = self.peer_of(member)?;
        if peer.suspicion().is_some() {
            count("suspect");
            return Ok(unreachable());
        }
        let reply = match request {
            Request::Consume(_) => {
                crate::forwarded_consume::call(peer, request, timeout, self.releases.clone()).await
            }
            request => peer.call_watched(&request, timeout).await,
        };
        match reply {
            Ok(r) => {
                count(match r.status {
                    0..300 => "2xx",
                    300..500 => "4xx",
                    _ => "5xx",
                });
                Ok(r)
            }
            Err(e) if e.means_unreachable() => {
                count("unreachable");
                tracing::debug!(peer = member, op, error = %e, "a forwarded request found its owner unreachable");
                Ok(unreachable())
            }
            Err(e) => {
                count("failed");
                Err(format!("{member}: {e}"))
            }
        }
    }

    /// Starts the heartbeat (and, while this node leads, the controller).
    pub fn start_membership(
        &self,
        me: Member,
        clock: ClockRef,
        registry: &mut Registry,
        errors: narad_cluster::members::ErrorSink,
    ) {
        let m =
            Membership::start(self.meta.clone(), me, self.control.clone(), clock, registry, errors);
        let _ = self.membership.set(m);
    }

    /// Sets `ready` once this node reached a leader and this replica caught
    /// up (or [`READY_CATCH_UP_WAIT`] after it reached one), and,
    /// with `needs_root` (security on), once the replicated state holds the
    /// root user: a single node seeds it before it listens, so a ready
    /// node never answers the root's credentials with 401. `ready` is told
    /// whether the replica caught up (false: the wait ran out).
    pub fn mark_ready_when_caught_up(
        self: &Arc<Self>,
        needs_root: bool,
        ready: impl Fn(bool) + Send + 'static,
    ) {
        let me = self.clone();
        tokio::spawn(async move {
            // Reached, not only named: a vote restored from disk names a
            // leader before any contact (see `wait_leader_reached`).
            me.control.wait_leader_reached().await;
            // Ready implies produce is taken: release it here too, not only
            // in `attach_broker`'s task, which may notice a moment later.
            if let Some(broker) = me.handler.broker.get() {
                broker.release_produce();
            }
            let deadline = tokio::time::Instant::now() + READY_CATCH_UP_WAIT;
            let mut caught_up = me.control.applied_caught_up();
            while !caught_up && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
                caught_up = me.control.applied_caught_up();
            }
            while needs_root && !me.meta.snapshot().has_root() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            ready(caught_up);
        });
    }

    /// Seeds the root user (security on) once a leader is visible, unless
    /// the replicated state already has one: every node tries, the first
    /// proposal wins and the others are refused (a root exists), so the
    /// password of the node whose proposal won is the one that holds (with
    /// `NARAD_ADMIN_PASSWORD` set alike on every node, that one). Retries
    /// every second while the control plane refuses.
    pub fn seed_root_when_led(self: &Arc<Self>, admin_password: Option<String>) {
        let me = self.clone();
        tokio::spawn(async move {
            me.control.wait_for_leader().await;
            loop {
                if me.meta.snapshot().has_root() {
                    return;
                }
                let (meta, password) = (me.meta.clone(), admin_password.clone());
                let seeded = tokio::task::spawn_blocking(move || {
                    crate::root::seed_root(&meta, password.as_deref())
                })
                .await;
                match seeded {
                    Ok(Ok(_)) => return,
                    Ok(Err(_)) if me.meta.snapshot().has_root() => return,
                    // Another node's proposal won (this replica has not
                    // applied it yet): the expected outcome of every node
                    // trying, not a failure.
                    Ok(Err(e)) if e.contains("a root user already exists") => {
                        tracing::debug!(error = %e, "root user seeded by another node");
                        return;
                    }
                    Ok(Err(e)) => warn!(error = %e, "root user not seeded yet; retrying"),
                    Err(e) => warn!(error = %e, "root user seeding task failed; retrying"),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    /// Why the control plane stopped on a fatal error (`None`: it runs).
    pub fn control_plane_stopped(&self) -> Option<String> {
        self.control.stopped()
    }

    /// Resolves once the control plane stopped on a fatal error and the
    /// disk accepts writes again: the server then stops, for its
    /// supervisor to restart it (see [`crate::control_restart`]); or once
    /// the group refused this node under its id (the server then exits
    /// with why).
    pub fn restart_needed(
        &self,
    ) -> impl std::future::Future<Output = crate::control_restart::Stop> + Send + 'static {
        let (fs, dir) = self.storage.clone();
        crate::control_restart::restart_needed(self.control.clone(), fs, dir)
    }

    /// Shutdown began (before HTTP drains): this node no longer campaigns
    /// for a leader that hands over, so nodes stopping together do not wait
    /// for each other.
    pub fn begin_leaving(&self) {
        self.control.begin_leaving();
    }

    /// Stops membership, hands leadership over and stops consensus, then
    /// closes node RPC.
    pub async fn shutdown(&self) {
        if let Some(task) = self.orphan_task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
        let _ = self.move_stop.send(true);
        for task in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            task.abort();
        }
        if let Some(m) = self.membership.get() {
            m.stop().await;
        }
        self.control.shutdown().await;
        // A handshake to a dead peer can hold the endpoint open until the
        // 30 s idle timeout; the process is about to exit, so bound it.
        let _ = tokio::time::timeout(Duration::from_secs(2), self.transport.close()).await;
    }
}

/// The node RPC address of member `member` in `meta`'s replica.
pub(crate) fn member_addr(meta: &MetaStore, member: &str) -> Result<SocketAddr, String> {
    let m = meta.snapshot().member(member).cloned();
    let m = m.ok_or_else(|| format!("{member} is not a member"))?;
    m.cluster_addr
        .as_deref()
        .ok_or_else(|| format!("{member} has no cluster address"))?
        .parse()
        .map_err(|e| format!("{member} has a bad cluster address: {e}"))
}

/// The leader's confirmation that a topic incarnation is gone (SPEC §7.1):
/// only once this replica has applied what it knows committed, and only
/// from a leader that confirmed its leadership (op 20 / a barrier).
#[derive(Debug)]
struct LeaderConfirmer {
    control: Arc<ControlPlane>,
}

/// SPEC §6/§7.1's "caught up", asked of the leader (op 36): the fan-out
/// reconciler acts only once it holds.
#[derive(Debug)]
struct Freshness {
    control: Arc<ControlPlane>,
}

impl narad_broker::fanout::ReplicaFreshness for Freshness {
    fn caught_up(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + '_>> {
        Box::pin(self.control.caught_up_with_leader())
    }
}

impl DeleteConfirmer for LeaderConfirmer {
    fn leader_topic(
        &self,
        topic: &str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<LeaderTopic, String>> + Send>>
    {
        let (control, topic) = (self.control.clone(), topic.to_owned());
        Box::pin(async move {
            control
                .caught_up_with_leader()
                .await
                .map_err(|why| format!("this replica has not caught up with the leader: {why}"))?;
            Ok(match control.leader_topic_view(&topic).await? {
                LeaderTopicView::Absent => LeaderTopic::Absent,
                LeaderTopicView::Present { incarnation } => LeaderTopic::Present(incarnation),
            })
        })
    }
}

/// How long `narad cluster remove` waits for each live member's offsets
/// (node RPC op 40).
const REMOVE_ASK_TIMEOUT: Duration = Duration::from_secs(5);

impl ClusterView for ClusterNode {
    fn move_progress(&self) -> Vec<crate::moves::MoveProgress> {
        self.mover.get().map(|m| m.progress()).unwrap_or_default()
    }

    fn known_offsets(&self) -> BoxFuture<'_, (Vec<crate::offsets_seen::KnownOffset>, Vec<String>)> {
        Box::pin(async move {
            let snap = self.meta.snapshot();
            let peers: Vec<String> = snap
                .members()
                .filter(|m| m.status == narad_meta::MemberStatus::Alive && m.id != self.node_id)
                .map(|m| m.id.clone())
                .collect();
            let asks = peers.iter().map(|id| async move {
                let reply = self.forward(id, Request::KnownOffsets, REMOVE_ASK_TIMEOUT).await;
                let known = reply.ok().filter(|r| r.status == 200).and_then(|r| {
                    serde_json::from_slice::<crate::offsets_seen::KnownOffsets>(&r.body).ok()
                });
                (id.clone(), known)
            });
            let mut all = crate::offsets_seen::global().known().partitions;
            let mut silent = Vec::new();
            for (id, known) in futures_util::future::join_all(asks).await {
                match known {
                    Some(k) => all.extend(k.partitions),
                    None => silent.push(id),
                }
            }
            (all, silent)
        })
    }

    fn control_plane_stopped(&self) -> Option<String> {
        self.control.stopped()
    }

    fn owner_partition_stats<'a>(
        &'a self,
        owner: &'a str,
        topic: &'a str,
        incarnation: u64,
        partition: u32,
    ) -> BoxFuture<'a, Result<PartitionStats, String>> {
        Box::pin(self.fetch_partition_stats(owner, topic, incarnation, partition))
    }

    fn route(&self, topic: &str, partition: u32) -> PartitionRoute {
        let snap = self.meta.snapshot();
        let owner = narad_broker::ownership::partition_owner(&snap, topic, partition);
        match owner.owner_node {
            None => PartitionRoute::Unassigned,
            Some(id) if id == self.node_id => PartitionRoute::Local,
            Some(id) if owner.liveness == OwnerLiveness::Alive => PartitionRoute::Remote(id),
            Some(id) => PartitionRoute::OwnerDown(id),
        }
    }

    fn serving_peers(&self, topic: &str) -> Vec<String> {
        let snap = self.meta.snapshot();
        let mut out: Vec<String> = Vec::new();
        for a in snap.assignments(topic).into_iter().flat_map(|a| a.values()) {
            let alive = snap
                .member(&a.owner_id)
                .is_some_and(|m| m.status == narad_meta::MemberStatus::Alive);
            if a.owner_id != self.node_id
                && alive
                && !out.contains(&a.owner_id)
                && !self.is_suspect(&a.owner_id)
            {
                out.push(a.owner_id.clone());
            }
        }
        out
    }

    fn consume_at<'a>(
        &'a self,
        member: &'a str,
        ask: ConsumeAsk,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<PeerAnswer, String>> {
        Box::pin(async move { self.forward(member, ask.request(), timeout).await.map(Into::into) })
    }

    fn resolve_at<'a>(
        &'a self,
        member: &'a str,
        topic: &'a str,
        receipt: (u32, u64, u64),
        action: AckAction,
    ) -> BoxFuture<'a, Result<PeerAnswer, String>> {
        let request = forward::resolve_request(topic, receipt, action);
        let timeout = request.timeout();
        Box::pin(async move {
            let reply = self.forward(member, request, timeout).await?;
            // A receipt the owner took names an offset it served.
            if reply.status < 300
                && let Some(t) = self.meta.topic(topic)
            {
                crate::offsets_seen::global().saw(topic, t.incarnation(), receipt.0, receipt.1);
            }
            Ok(reply.into())
        })
    }

    fn ready_counts_at<'a>(
        &'a self,
        member: &'a str,
        topic: &'a str,
        wait: Duration,
    ) -> BoxFuture<'a, Result<PeerAnswer, String>> {
        let request = Request::ReadyCounts(rpc::ReadyCounts {
            topic: topic.to_owned(),
            wait_nanos: wait.as_nanos() as i64,
        });
        let timeout = request.timeout();
        Box::pin(async move { self.forward(member, request, timeout).await.map(Into::into) })
    }

    fn status(&self) -> ClusterStatus {
        let s = self.control.status();
        ClusterStatus {
            node_id: self.node_id.clone(),
            mode: ClusterMode::Cluster,
            role: match s.role {
                _ if s.stopped.is_some() => ClusterRole::Stopped,
                Role::Leader => ClusterRole::Leader,
                // Only while this node's own shutdown runs (a core that
                // quit on its own is `stopped` above).
                Role::Follower | Role::Shutdown => ClusterRole::Follower,
                Role::Candidate => ClusterRole::Candidate,
                Role::Learner => ClusterRole::Learner,
            },
            term: s.term,
            leader: s.leader,
            commit_index: s.commit_index,
            // Raft log indexes both, so they compare: applied = committed
            // once this replica caught up.
            applied_index: s.last_applied,
            voters: s.voters,
            learners: s.learners,
            stopped: s.stopped,
        }
    }
}

/// Ack (3), ExtendAck (18), Nack (19) from another node: resolved here,
/// answered as the HTTP ack answers (204, or the error).
fn resolve_for_peer(broker: &Broker, r: rpc::Receipt, action: AckAction) -> Reply {
    let handle = format!("{}:{}:{}", r.partition, r.offset, r.nonce);
    match broker.resolve(&r.topic, &handle, action) {
        Ok(()) => Reply { status: 204, content_type: String::new(), body: Default::default() },
        Err(e) => forward::reply_of(NodeError::from(e)),
    }
}
