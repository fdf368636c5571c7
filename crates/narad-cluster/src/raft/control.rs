//! The control plane of one node: the Raft node of the metastore group,
//! how it forms (bootstrap or join), how writes reach the leader, what it
//! serves over node RPC (ops 21, 29-33), its status and its shutdown.
//!
//! * Bootstrap: with `initial_members` empty every peer initialises the
//!   group with the identical voter set (all peers); with a list, the
//!   listed nodes do. openraft makes simultaneous initialisation with the
//!   same membership safe; a node already initialised skips it.
//! * A bootstrapping node without Raft state (and other peers) does not
//!   initialise at once: it is *forming*. It asks every other peer
//!   (ProbeGroup, op 39) every [`FORM_RETRY`] and bootstraps, waits or
//!   refuses as [`super::first_start`] decides: a peer whose state knows
//!   it as a member means its data directory was wiped, and the node
//!   stops with what to do ([`ControlPlane::refused`]); a group that has
//!   run and whose leader does not answer makes it wait (issue 35). While
//!   forming it answers no Raft RPC (503), so its empty log casts no vote.
//! * Join-only (a node not in a non-empty `initial_members`): sends
//!   JoinCluster (21) to every peer every [`JOIN_INTERVAL`] until it sees a
//!   leader. The leader answers by adding the node as a learner and then
//!   as a voter; joining twice is harmless.
//! * A node removed from the cluster (`narad cluster remove`) that comes
//!   back on its old directory: the leader refuses the writes it forwards
//!   ([`NOT_IN_GROUP`]), and the node, whose own replica still counts it
//!   in the group, stops with what to do; knowing no leader, it finds out
//!   by asking its peers ([`ControlPlane::watch_removal`]).
//! * A member restarted on another cluster address announces it with
//!   JoinCluster until its replica records it (the leader commits
//!   SetNodes); Raft dials the addresses the group records, never the
//!   configured peers' (those only serve forming and joining).
//! * Writes ([`narad_meta::Replicator`]): on the leader `client_write`
//!   (bounded by [`APPLY_TIMEOUT`]); on a follower the command is
//!   forwarded with ProposeCommand (29) within its budget (create 75 s,
//!   delete 30 s, others 5 s), and the answer is returned once this node
//!   has applied the entry too (read-your-writes on the node that was
//!   asked). No leader for [`LEADER_WAIT`] → `MetaError::Unavailable`
//!   (503); a leader that cannot be dialled for that long likewise; a
//!   transport failure after the request may have reached the leader →
//!   `MetaError::Upstream` (502).
//! * A fatal Raft error (a log or state machine write that failed, e.g. a
//!   full disk: openraft quits its core) is noticed by the monitor within
//!   [`MONITOR_INTERVAL`]: [`ControlPlane::stopped`] says why,
//!   `narad_raft_stopped` turns 1, every write through this node answers
//!   503, [`ControlPlane::applied_caught_up`] is false and the status's
//!   role is [`Role::Shutdown`]. The core is not restarted in place (the
//!   log store latched the failure and the metastore may hold a partial
//!   apply; only reopening both from disk is sound): the server stops
//!   the process once the disk accepts writes again, so its supervisor
//!   starts it afresh (`narad-server`'s `cluster_node`).
//! * A write answers success only once applied on this node: a forwarded
//!   write the leader applied but this node did not apply within the
//!   write's budget answers 503 (it is committed and will be visible here
//!   once applied; a retried create answers 409).
//! * Shutdown: a leader stops heartbeating, asks the most up-to-date voter
//!   to campaign (33) as soon as its leader lease lapses, and waits up to
//!   [`HANDOVER_WAIT`] for another leader before Raft stops. A voter that
//!   is stopping too (from the moment its shutdown began,
//!   [`ControlPlane::begin_leaving`]) or cannot be reached refuses, and the
//!   next is asked; when none takes it the leader stops at once (a whole
//!   cluster stopping together waits for nobody).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_fs::FsRef;
use narad_meta::{Command, MetaError, MetaStore, Replicator, Response};
use openraft::error::{ClientWriteError, RaftError};
use openraft::raft::AppendEntriesResponse;
use openraft::{ChangeMembers, ServerState, SnapshotPolicy};
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use super::Error;
use super::first_start::{self, FirstStart, PeerAnswer, PeerView};
use super::log_store::LogStore;
use super::metrics::RaftMetrics;
use super::network::{ControlPayload, Network, SNAPSHOT_CHUNK_BYTES, peer_of};
use super::state_machine::StateMachine;
use super::types::{NodeId, Raft, RaftNode, TypeConfig, raft_id};
use crate::handshake::PeerIdentity;
use crate::limits::{CREATE_FORWARD_TIMEOUT, DELETE_FORWARD_TIMEOUT, REPLY_TIMEOUT};
use crate::rpc::{JoinCluster, Reply, Request};
use crate::transport::Transport;

/// A join-only node asks to join this often until it sees a leader.
pub const JOIN_INTERVAL: Duration = Duration::from_secs(2);
/// How long a write waits for a leader to be known (or reachable).
pub const LEADER_WAIT: Duration = Duration::from_secs(2);
/// How long the leader waits for its own write to be committed and applied.
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a node without Raft state waits for each peer's answer to
/// "does the group already run?" before it bootstraps.
pub const GROUP_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a forming node asks its peers again.
pub const FORM_RETRY: Duration = Duration::from_millis(500);
/// How long a leader that shuts down waits for another leader.
pub const HANDOVER_WAIT: Duration = Duration::from_secs(3);

/// How often a leader handing over checks that the voter campaigning for
/// it is still there.
const HANDOVER_CHECK: Duration = Duration::from_millis(250);
/// Leader contact older than this makes a follower's state stale
/// (SPEC §7.1 AppliedCaughtUp).
pub const LEADER_CONTACT_FRESH: Duration = Duration::from_secs(5);

/// How often the control plane refreshes its committed index and gauges,
/// and notices a leader change for its log line.
const MONITOR_INTERVAL: Duration = Duration::from_millis(100);

/// Status of a request refused because this node is not the leader.
pub const NOT_LEADER: u16 = 421;

/// How long a node with Raft state may know no leader before it asks its
/// peers whether it was removed ([`ControlPlane::watch_removal`]): longer
/// than an election.
const REMOVAL_CHECK_AFTER: Duration = Duration::from_secs(6);

/// How long a leader answering ProbeGroup waits for a quorum to confirm
/// it still leads (below [`GROUP_PROBE_TIMEOUT`], the asker's wait).
const PROBE_CONFIRM: Duration = Duration::from_secs(1);

/// How often [`ControlPlane::watch_removal`] looks.
const REMOVAL_CHECK_EVERY: Duration = Duration::from_secs(2);

/// Status of a write refused because the node that forwarded it is not in
/// the Raft group (removed from the cluster). Only between nodes: the
/// forwarding node answers its client 503 (it stops).
pub const NOT_IN_GROUP: u16 = 410;

/// One configured peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerEntry {
    /// Its node id.
    pub id: String,
    /// Its node-RPC (cluster) address.
    pub addr: SocketAddr,
}

/// Raft's timings.
///
/// A heartbeat every 100 ms (about the round trip of a slow LAN, so
/// followers hear from the leader many times per election timeout) and an
/// election timeout randomised in 0.5-1 s. openraft 0.9 adds its leader
/// lease (= the upper bound) before a follower that heard from a leader
/// campaigns, so a dead leader is noticed after 1.5-2 s, which is etcd's
/// effective figure (election timeout 1 s, randomised to 1-2 s), fifteen
/// to twenty heartbeats: a leader is not deposed by a few lost packets or
/// a short pause. With 1-2 s (plus the 2 s lease: 3-4 s) a kill -9 of the
/// leader took 3.5-11.9 s to the next write, median 5.0 s (8 trials,
/// docs/BENCHMARKS.md), outside the 5 s target: a vote refused for a
/// shorter log restarts the refuser's timer and costs a second round.
/// Tests may shorten them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftTimings {
    /// Leader heartbeat interval.
    pub heartbeat: Duration,
    /// Lower bound of the randomised election timeout.
    pub election_min: Duration,
    /// Upper bound of the randomised election timeout (also openraft's
    /// leader lease: a node that heard from a leader this recently refuses
    /// to vote for another).
    pub election_max: Duration,
    /// A snapshot is built after this many entries since the last one.
    pub snapshot_after_entries: u64,
    /// Entries kept in the log behind a snapshot (a follower that far
    /// behind catches up from the log rather than a snapshot).
    pub entries_kept_after_snapshot: u64,
}

impl Default for RaftTimings {
    fn default() -> Self {
        RaftTimings {
            heartbeat: Duration::from_millis(100),
            election_min: Duration::from_millis(500),
            election_max: Duration::from_millis(1000),
            snapshot_after_entries: 5000,
            entries_kept_after_snapshot: 1000,
        }
    }
}

impl RaftTimings {
    /// openraft's configuration with these timings.
    pub fn raft_config(&self) -> Result<openraft::Config, Error> {
        openraft::Config {
            cluster_name: "narad-metastore".to_owned(),
            heartbeat_interval: self.heartbeat.as_millis() as u64,
            election_timeout_min: self.election_min.as_millis() as u64,
            election_timeout_max: self.election_max.as_millis() as u64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_after_entries),
            max_in_snapshot_log_to_keep: self.entries_kept_after_snapshot,
            snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
            ..Default::default()
        }
        .validate()
        .map_err(|e| Error::Config(format!("raft timings: {e}")))
    }
}

/// How a node takes part in the control plane.
#[derive(Debug, Clone)]
pub struct ControlPlaneConfig {
    /// This node's id.
    pub node_id: String,
    /// Where this node's node RPC listens (advertised).
    pub cluster_addr: SocketAddr,
    /// This node's advertised HTTP `host:port`.
    pub http_addr: String,
    /// Every peer, this node included.
    pub peers: Vec<PeerEntry>,
    /// The nodes that bootstrap the group; empty: all peers.
    pub initial_members: Vec<String>,
    /// The data directory (the log is `<data>/metastore/raft.redb`).
    pub data_dir: PathBuf,
    /// The file system.
    pub fs: FsRef,
    /// Raft's timings.
    pub timings: RaftTimings,
}

/// The leader as this node knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderInfo {
    /// Its node id.
    pub id: String,
    /// Its node-RPC address.
    pub cluster_addr: String,
    /// Its HTTP address ("" when not known).
    pub http_addr: String,
}

/// This node's role in the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Leads.
    Leader,
    /// Follows a leader (or waits for one).
    Follower,
    /// Campaigns.
    Candidate,
    /// Receives the log without a vote (joining, or not a member yet).
    Learner,
    /// Raft has stopped.
    Shutdown,
}

impl Role {
    /// The lowercase name (`leader`, `follower`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Learner => "learner",
            Role::Shutdown => "shutdown",
        }
    }
}

/// A snapshot of the control plane's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftStatus {
    /// This node's role.
    pub role: Role,
    /// The current term.
    pub term: u64,
    /// The leader's node id, when one is known.
    pub leader: Option<String>,
    /// The highest log index known committed (0: none).
    pub commit_index: u64,
    /// The highest log index applied to the metastore (0: none).
    pub last_applied: u64,
    /// The last log index of the current snapshot (0: none).
    pub snapshot_index: u64,
    /// The last log index purged from the log (0: none).
    pub purged_index: u64,
    /// Milliseconds since this node last heard from the leader (0 on the
    /// leader; `None`: never).
    pub millis_since_leader_contact: Option<u64>,
    /// Voter ids, sorted.
    pub voters: Vec<String>,
    /// Learner ids, sorted.
    pub learners: Vec<String>,
    /// Why Raft's core stopped on a fatal error (`None`: running, or
    /// stopped by this node's own shutdown).
    pub stopped: Option<String>,
}

/// How long [`ControlPlane::caught_up_with_leader`] waits for this replica
/// to apply up to the leader's read index.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(2);

/// How long the leader's confirmation barrier may take (SPEC §7.1: 5 s).
pub const CONFIRM_BARRIER: Duration = Duration::from_secs(5);

/// The leader's answer to "does this topic exist?" (SPEC §7.1's leader
/// confirmation), read after a barrier that proves it still leads and has
/// applied everything committed before the question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaderTopicView {
    /// The leader's state has no topic of that name: destruction is
    /// authorised.
    Absent,
    /// The leader's state has it, as this incarnation.
    Present {
        /// The live incarnation id.
        incarnation: u64,
    },
}

/// The leader's confirmed view of topic `name`: a barrier (a quorum
/// confirms that `raft` still leads, and `meta`, its state machine, applied
/// everything committed before the question), then `meta`'s state. Without
/// the barrier a leader cut off from a majority, already replaced, would
/// answer from a stale state: "absent" for a topic recreated since, which
/// would destroy its records.
pub async fn confirmed_view(
    raft: &Raft,
    meta: &MetaStore,
    name: &str,
) -> Result<LeaderTopicView, String> {
    match tokio::time::timeout(CONFIRM_BARRIER, raft.ensure_linearizable()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(format!("leadership not confirmed: {e}")),
        Err(_) => {
            return Err(format!("leadership not confirmed within {CONFIRM_BARRIER:?}"));
        }
    }
    Ok(match meta.topic(name) {
        Some(t) => LeaderTopicView::Present { incarnation: t.incarnation() },
        None => LeaderTopicView::Absent,
    })
}

/// The body of GetTopic's (op 20) 200.
#[derive(Debug, Serialize, Deserialize)]
struct TopicPresence {
    name: String,
    incarnation: u64,
}

/// The audit event of a forwarded command that changes users, grants or
/// topics: (event, target, the user who asked where the command names it).
fn audit_event(command: &Command) -> Option<(&'static str, String, Option<String>)> {
    Some(match command {
        Command::CreateTopic(c) => {
            ("topic.create", c.name.clone(), (!c.owner.is_empty()).then(|| c.owner.clone()))
        }
        Command::AlterTopic(c) => ("topic.alter", c.name.clone(), None),
        Command::DeleteTopic(c) => ("topic.delete", c.name.clone(), None),
        Command::AttachChild(c) => ("topic.attach", format!("{}/{}", c.parent, c.child), None),
        Command::DetachChild(c) => ("topic.detach", format!("{}/{}", c.parent, c.child), None),
        Command::CreateUser(c) => ("user.create", c.user.username.clone(), None),
        Command::UpdateUser(c) => {
            let event = match (&c.grants, &c.password_hash) {
                (Some(_), Some(_)) => "user.grants_and_password",
                (Some(_), None) => "user.grants",
                (None, _) => "user.password",
            };
            (event, c.username.clone(), None)
        }
        Command::DeleteUser(c) => ("user.delete", c.username.clone(), None),
        Command::SeedRootUser(c) => ("user.seed_root", c.user.username.clone(), None),
        Command::SetMemberDraining(c) => {
            let event =
                if c.draining { "cluster.decommission" } else { "cluster.decommission.cancel" };
            (event, c.id.clone(), None)
        }
        Command::SetAssignmentTarget(c) => {
            ("cluster.move", format!("{}/{}", c.topic, c.partition), None)
        }
        Command::RemoveMember(c) => ("cluster.remove", c.id.clone(), None),
        Command::AssignPartitions(_)
        | Command::MemberJoin(_)
        | Command::MemberDead(_)
        | Command::CompleteMove(_)
        | Command::AbortMove(_) => {
            return None;
        }
    })
}

/// A response as it may leave the leader: user records without their
/// password hash (the asking node reads its own replica for anything more).
fn without_secrets(response: Response) -> Response {
    let redact = |u: Arc<narad_meta::User>| {
        let mut u = (*u).clone();
        u.password_hash = String::new();
        Arc::new(u)
    };
    match response {
        Response::User(u) => Response::User(redact(u)),
        Response::UserDeleted(u) => Response::UserDeleted(redact(u)),
        other => other,
    }
}

/// The body of ReadIndex's (op 36) 200.
#[derive(Debug, Serialize, Deserialize)]
struct ReadIndex {
    /// The leader's read index.
    index: u64,
}

/// The body of JoinCluster's 200. `known_member`: the leader's state has
/// a member record of the node (absent from releases before issue 35).
#[derive(Debug, Serialize, Deserialize)]
struct Joined {
    joined: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    known_member: Option<bool>,
}

/// The reply body of a ProposeCommand the leader applied.
#[derive(Debug, Serialize, Deserialize)]
struct Proposed {
    /// The log index of the entry (the follower waits to apply it).
    log_index: u64,
    /// The command's response.
    response: Response,
}

/// What a write on this node came to.
enum LocalWrite {
    Written(u64, Result<Response, MetaError>),
    NotLeader,
    Failed(MetaError),
}

/// The control plane of one node.
pub struct ControlPlane {
    me: RaftNode,
    meta: Arc<MetaStore>,
    raft_id: NodeId,
    raft: Raft,
    transport: Arc<Transport>,
    peers: Vec<PeerEntry>,
    timings: RaftTimings,
    runtime: tokio::runtime::Handle,
    metrics: RaftMetrics,
    /// The committed and the applied index, refreshed together by the
    /// monitor task: the applied index read first, so it is never above
    /// the committed one (as in Raft itself).
    indices: Mutex<(u64, u64)>,
    /// When an AppendEntries from a leader last arrived.
    leader_contact: Mutex<Option<Instant>>,
    /// Membership changes run one at a time.
    join_lock: tokio::sync::Mutex<()>,
    stopping: AtomicBool,
    /// Why Raft's core stopped on its own (a fatal error), once it did.
    stopped: Mutex<Option<String>>,
    /// Set when this node's shutdown began (before its HTTP drains): it
    /// refuses to campaign for a leader that hands over.
    leaving: AtomicBool,
    /// Set while this node, without Raft state, decides whether it may
    /// bootstrap ([`super::first_start`]): it answers no Raft RPC.
    forming: AtomicBool,
    /// Why this node may not take part under its id (its data directory
    /// was wiped), once a peer said so.
    refused: Mutex<Option<String>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("node_id", &self.me.id)
            .field("raft_id", &self.raft_id)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long the leader waits for a removed node's membership change.
const REMOVE_GROUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The time a forwarded write may take.
fn budget(command: &Command) -> Duration {
    match command {
        Command::CreateTopic(_) => CREATE_FORWARD_TIMEOUT,
        Command::DeleteTopic(_) => DELETE_FORWARD_TIMEOUT,
        // The metastore write, then the raft membership change (REMOVE_GROUP_TIMEOUT).
        Command::RemoveMember(_) => DELETE_FORWARD_TIMEOUT,
        _ => REPLY_TIMEOUT,
    }
}

fn json_reply<T: Serialize>(value: &T) -> Reply {
    match serde_json::to_vec(value) {
        Ok(body) => Reply::json(200, body),
        Err(e) => Reply::error(500, &format!("encode reply: {e}")),
    }
}

fn error_text(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Body {
        error: String,
    }
    serde_json::from_slice::<Body>(body)
        .map(|b| b.error)
        .unwrap_or_else(|_| String::from_utf8_lossy(body).into_owned())
}

impl ControlPlane {
    /// Opens the Raft log, starts the Raft node over `meta`'s state
    /// machine, and bootstraps or starts joining (see the module docs).
    /// `transport` is already bound; its handler must pass ops 21 and
    /// 29-33 to [`ControlPlane::handle`].
    pub async fn start(
        cfg: ControlPlaneConfig,
        meta: Arc<MetaStore>,
        transport: Arc<Transport>,
        registry: &mut Registry,
    ) -> Result<Arc<ControlPlane>, Error> {
        let me_entry = cfg.peers.iter().find(|p| p.id == cfg.node_id).ok_or_else(|| {
            Error::Config(format!("the peers do not include this node {:?}", cfg.node_id))
        })?;
        let mut ids = BTreeMap::new();
        for p in &cfg.peers {
            if let Some(other) = ids.insert(raft_id(&p.id), &p.id) {
                return Err(Error::Config(format!(
                    "peers {other:?} and {:?} derive the same raft id",
                    p.id
                )));
            }
        }
        if let Some(stranger) =
            cfg.initial_members.iter().find(|m| !cfg.peers.iter().any(|p| &p.id == *m))
        {
            return Err(Error::Config(format!("initial member {stranger:?} is not a peer")));
        }
        let me = RaftNode {
            id: cfg.node_id.clone(),
            cluster_addr: me_entry.addr.to_string(),
            http_addr: cfg.http_addr.clone(),
        };
        let config = cfg.timings.raft_config()?;

        let metrics = RaftMetrics::default();
        metrics.register(registry);
        let sm = StateMachine::new(meta.clone(), cfg.fs.clone(), metrics.clone());
        let log = LogStore::<TypeConfig>::open(&*cfg.fs, &cfg.data_dir)?
            .with_purge_floor(sm.purge_floor());
        if cfg.initial_members == [cfg.node_id.clone()]
            || (cfg.initial_members.is_empty() && cfg.peers.len() == 1)
        {
            let me = RaftNode { http_addr: String::new(), ..me.clone() };
            super::upgrade::seed_group(&meta, &log, &me)?;
        }
        let id = raft_id(&cfg.node_id);
        let raft = Raft::new(id, Arc::new(config), Network::new(transport.clone()), log, sm)
            .await
            .map_err(|e| Error::Raft(format!("start: {e}")))?;

        let plane = Arc::new(ControlPlane {
            me,
            meta,
            raft_id: id,
            raft,
            transport,
            peers: cfg.peers.clone(),
            timings: cfg.timings.clone(),
            runtime: tokio::runtime::Handle::current(),
            metrics,
            indices: Mutex::new((0, 0)),
            leader_contact: Mutex::new(None),
            join_lock: tokio::sync::Mutex::new(()),
            stopping: AtomicBool::new(false),
            stopped: Mutex::new(None),
            leaving: AtomicBool::new(false),
            forming: AtomicBool::new(false),
            refused: Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
        });

        let bootstraps =
            cfg.initial_members.is_empty() || cfg.initial_members.contains(&cfg.node_id);
        let initialized =
            plane.raft.is_initialized().await.map_err(|e| Error::Raft(e.to_string()))?;
        let voters: BTreeMap<NodeId, RaftNode> = cfg
            .peers
            .iter()
            .filter(|p| cfg.initial_members.is_empty() || cfg.initial_members.contains(&p.id))
            .map(|p| {
                // Identical on every bootstrapping node: only what the
                // shared peer list says.
                let node = RaftNode {
                    id: p.id.clone(),
                    cluster_addr: p.addr.to_string(),
                    http_addr: String::new(),
                };
                (raft_id(&p.id), node)
            })
            .collect();
        if bootstraps && !initialized {
            if cfg.peers.len() > 1 {
                plane.forming.store(true, Ordering::SeqCst);
                let form = tokio::spawn(plane.clone().form(voters));
                lock(&plane.tasks).push(form);
            } else {
                plane.initialize(voters).await?;
            }
        }
        let monitor = tokio::spawn(plane.clone().monitor());
        lock(&plane.tasks).push(monitor);
        let steward = tokio::spawn(plane.clone().steward_voters());
        lock(&plane.tasks).push(steward);
        let greet = tokio::spawn(plane.clone().greet_peers());
        lock(&plane.tasks).push(greet);
        if !bootstraps {
            // Without Raft state, it answers no Raft RPC until a leader
            // accepted its join as a node it does not know (a wiped
            // member's empty log would contradict what the leader matched).
            plane.forming.store(!initialized, Ordering::SeqCst);
            let join = tokio::spawn(plane.clone().join_loop(initialized));
            lock(&plane.tasks).push(join);
        }
        if initialized {
            plane.note_moved_peers();
            let announce = tokio::spawn(plane.clone().announce_address());
            lock(&plane.tasks).push(announce);
            let removal = tokio::spawn(plane.clone().watch_removal());
            lock(&plane.tasks).push(removal);
        }
        tracing::info!(
            node_id = %plane.me.id,
            bootstraps,
            initialized,
            "control plane started"
        );
        Ok(plane)
    }

    /// Keeps the gauges and the committed index current.
    async fn monitor(self: Arc<Self>) {
        let mut rx = self.raft.metrics();
        let mut last_leader = None;
        loop {
            let m = rx.borrow_and_update().clone();
            if let Err(fatal) = &m.running_state {
                self.note_stopped(fatal.to_string());
                break;
            }
            if m.current_leader != last_leader {
                last_leader = m.current_leader;
                let leader = self.leader().map(|l| l.id);
                tracing::info!(term = m.current_term, leader = ?leader, state = ?m.state, "raft leader changed");
            }
            let committed =
                match self.raft.with_raft_state(|st| st.committed.map_or(0, |l| l.index)).await {
                    Ok(c) => c,
                    Err(e) => {
                        // The core quit: its metrics carry the reason as
                        // soon as it finished quitting.
                        let why = self
                            .raft
                            .wait(Some(Duration::from_secs(1)))
                            .metrics(|m| m.running_state.is_err(), "raft core stopped")
                            .await
                            .ok()
                            .and_then(|m| m.running_state.err())
                            .map_or_else(|| e.to_string(), |f| f.to_string());
                        self.note_stopped(why);
                        break;
                    }
                };
            // `m` was read before the committed index: what it says was
            // applied was committed by then.
            let applied = m.last_applied.map_or(0, |l| l.index);
            *lock(&self.indices) = (committed, applied);
            self.metrics.term.set(m.current_term as i64);
            self.metrics.leader.set(i64::from(m.state == ServerState::Leader));
            self.metrics.commit_index.set(committed as i64);
            self.metrics.applied_index.set(m.last_applied.map_or(0, |l| l.index) as i64);
            if m.state == ServerState::Shutdown {
                self.note_stopped("raft core shut down".to_owned());
                break;
            }
            // A fixed cadence, not "wake on every metrics change": reading
            // the committed index (`with_raft_state`) makes openraft report
            // its metrics again, which changed them (timings), which woke
            // this loop: an idle 3-node cluster spent ~45% of a core per
            // node in that loop. 100 ms also catches the committed index
            // moving on followers without a metrics change.
            tokio::time::sleep(MONITOR_INTERVAL).await;
        }
    }

    /// Records that Raft's core stopped on its own (not by
    /// [`ControlPlane::shutdown`]): from now on this node refuses writes,
    /// is not caught up and shows `stopped` (SPEC §7.1: a node must not
    /// act on, or serve as current, a replica that no longer follows).
    fn note_stopped(&self, why: String) {
        if self.stopping.load(Ordering::SeqCst) {
            return;
        }
        let mut stopped = lock(&self.stopped);
        if stopped.is_some() {
            return;
        }
        tracing::error!(
            node_id = %self.me.id,
            reason = %why,
            "the control plane stopped: raft's core quit on a fatal error; this node is not \
             ready and refuses metadata writes until it restarts"
        );
        self.metrics.stopped.set(1);
        self.metrics.leader.set(0);
        *stopped = Some(why);
    }

    /// Why Raft's core stopped on a fatal error, once it did (`None`:
    /// running, or stopped by this node's shutdown).
    pub fn stopped(&self) -> Option<String> {
        lock(&self.stopped).clone()
    }

    /// Resolves with the reason once Raft's core stopped on a fatal error
    /// (never, while it runs).
    pub async fn wait_stopped(&self) -> String {
        loop {
            if let Some(why) = self.stopped() {
                return why;
            }
            tokio::time::sleep(MONITOR_INTERVAL).await;
        }
    }

    /// Pings every other peer once at start: a peer that still holds a
    /// connection to this node's previous process (killed, restarted on the
    /// same address) sees this node connect anew and replaces it at once
    /// (see `Peer::probe_in_background`), instead of sending the next
    /// vote or append into it and waiting out a timeout.
    async fn greet_peers(self: Arc<Self>) {
        let pings = self.peers.iter().filter(|p| p.id != self.me.id).map(|p| {
            let peer = self.transport.peer(p.addr, crate::tls::DEFAULT_SERVER_NAME);
            async move {
                if let Err(e) = peer.ping().await {
                    tracing::debug!(peer = %p.id, error = %e, "start-up ping not answered");
                }
            }
        });
        futures_util::future::join_all(pings).await;
    }

    /// Initialises the group with `voters` (already initialised: fine).
    async fn initialize(&self, voters: BTreeMap<NodeId, RaftNode>) -> Result<(), Error> {
        tracing::info!(voters = ?voters.values().map(|n| &n.id).collect::<Vec<_>>(), "raft group bootstrapping");
        match self.raft.initialize(voters).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(e)) => {
                tracing::info!(error = %e, "raft group already initialised");
                Ok(())
            }
            Err(e) => Err(Error::Raft(format!("initialize: {e}"))),
        }
    }

    /// A forming node (see the module docs): asks the peers until
    /// [`first_start::decide`] says bootstrap (then initialises with
    /// `voters`) or refuse (then [`ControlPlane::refused`] says why).
    async fn form(self: Arc<Self>, voters: BTreeMap<NodeId, RaftNode>) {
        let started = Instant::now();
        let mut last_said: Option<(Instant, String)> = None;
        loop {
            if self.stopping.load(Ordering::Relaxed) {
                return;
            }
            let answers = self.probe_group(&voters).await;
            match first_start::decide(voters.len(), &answers) {
                FirstStart::Bootstrap => break,
                FirstStart::Join => {
                    tracing::info!(
                        node_id = %self.me.id,
                        "no raft state here, and the group's leader neither knows this node nor \
                         counts it in the group (removed for good earlier?): joining as a new member"
                    );
                    self.clone().join_loop(false).await;
                    return;
                }
                FirstStart::Refuse { by } => {
                    self.refuse(self.wiped(&format!("peer {by}")));
                    return;
                }
                FirstStart::Wait(why) => {
                    // Said once, then again every 30 s while it lasts.
                    let due = last_said.as_ref().is_none_or(|(at, said)| {
                        *said != why || at.elapsed() >= Duration::from_secs(30)
                    });
                    // Peers started together answer within moments: a
                    // wait is news (WARN) only once it lasts.
                    let waited = started.elapsed();
                    if due && waited < FORM_WAIT_WARN_AFTER {
                        tracing::info!(
                            node_id = %self.me.id,
                            waited_s = waited.as_secs(),
                            reason = %why,
                            "no raft state here: waiting before bootstrapping the group"
                        );
                    } else if due {
                        tracing::warn!(
                            node_id = %self.me.id,
                            waited_s = waited.as_secs(),
                            reason = %why,
                            "no raft state here: waiting before bootstrapping the group"
                        );
                    }
                    if due {
                        last_said = Some((Instant::now(), why));
                    }
                }
            }
            tokio::time::sleep(FORM_RETRY).await;
        }
        if let Err(e) = self.initialize(voters).await {
            self.note_stopped(e.to_string());
            return;
        }
        self.forming.store(false, Ordering::SeqCst);
    }

    /// ProbeGroup (op 39) to every other peer at once, each within
    /// [`GROUP_PROBE_TIMEOUT`].
    async fn probe_group(&self, voters: &BTreeMap<NodeId, RaftNode>) -> Vec<first_start::Probed> {
        let request = Request::ProbeGroup(self.me.id.clone());
        let asks = self.peers.iter().filter(|p| p.id != self.me.id).map(|p| {
            let peer = self.transport.peer(p.addr, crate::tls::DEFAULT_SERVER_NAME);
            let request = &request;
            async move {
                let answer = match peer.call_with_timeout(request, GROUP_PROBE_TIMEOUT).await {
                    Err(_) => PeerAnswer::Silent,
                    Ok(reply) if reply.status == 200 => {
                        match serde_json::from_slice::<PeerView>(&reply.body) {
                            Ok(view) => PeerAnswer::View(view),
                            Err(_) => PeerAnswer::Unknown,
                        }
                    }
                    // Still starting (before its control plane exists).
                    Ok(reply) if reply.status == 503 => PeerAnswer::Silent,
                    // A release without op 39, or anything else.
                    Ok(_) => PeerAnswer::Unknown,
                };
                first_start::Probed {
                    id: p.id.clone(),
                    voter: voters.contains_key(&raft_id(&p.id)),
                    answer,
                }
            }
        });
        futures_util::future::join_all(asks).await
    }

    /// This node's answer to ProbeGroup from `id` (see
    /// [`super::first_start`]).
    ///
    /// A leader answers as one only once a quorum confirmed it still leads
    /// (within [`PROBE_CONFIRM`]): a leader cut off, or deposed and not
    /// told yet, may hold a membership older than the group's, and its "I
    /// do not know you" would stop a node that joined since
    /// ([`ControlPlane::watch_removal`]) or misguide a first start.
    async fn probe_view(&self, id: &str) -> Reply {
        let leads = self.raft.metrics().borrow().state == ServerState::Leader
            && !self.forming.load(Ordering::SeqCst);
        let confirmed = leads
            && matches!(
                tokio::time::timeout(PROBE_CONFIRM, self.raft.ensure_linearizable()).await,
                Ok(Ok(_))
            );
        // Read after the confirmation: the membership it vouches for.
        let m = self.raft.metrics().borrow().clone();
        let leader = confirmed && m.state == ServerState::Leader;
        let rid = raft_id(id);
        let acknowledged = leader
            && m.replication
                .as_ref()
                .and_then(|r| r.get(&rid).cloned().flatten())
                .is_some_and(|l| l.index > 0);
        let knows_member = acknowledged || self.meta.snapshot().member(id).is_some();
        let in_group = leader.then(|| m.membership_config.membership().get_node(&rid).is_some());
        json_reply(&PeerView { log_end: m.last_log_index, leader, knows_member, in_group })
    }

    /// Why a node whose data directory was wiped may not take part under
    /// its id (`by`: who knows it), and what to do.
    fn wiped(&self, by: &str) -> String {
        format!(
            "node {id:?} is a member of the running cluster ({by} knows it), but this data \
             directory has no Raft state: it was wiped or lost. It cannot rejoin under {id:?}. \
             Start it on this empty directory under a new id that joins: --node-id <new id>, \
             --peers with <new id>@<this cluster address> in place of {id}@..., and \
             NARAD_CLUSTER_INITIAL_MEMBERS naming the running members; {id:?} stays listed as \
             a dead member (docs/CLUSTER.md, \"A node's data directory was wiped\")",
            id = self.me.id
        )
    }

    /// A node with Raft state that has known no leader for
    /// [`REMOVAL_CHECK_AFTER`] asks its peers (ProbeGroup, op 39) every
    /// [`REMOVAL_CHECK_EVERY`]: a leader that knows it neither as a member
    /// nor as a follower, while this node's own replica still counts it in
    /// the group, means it was removed from the cluster while it was away
    /// (`narad cluster remove`; the group no longer replicates to it, so it
    /// would never learn it otherwise). Said by a leader (one a quorum
    /// confirmed as it answered, see `probe_view`) twice in a row, the
    /// node stops with what to do. A node that follows a leader needs no check.
    async fn watch_removal(self: Arc<Self>) {
        let mut leaderless_since: Option<Instant> = None;
        let mut said_once: Option<String> = None;
        loop {
            tokio::time::sleep(REMOVAL_CHECK_EVERY).await;
            if self.stopping.load(Ordering::Relaxed) || self.stopped().is_some() {
                return;
            }
            if self.leader().is_some() || !self.in_own_group() {
                (leaderless_since, said_once) = (None, None);
                continue;
            }
            let since = *leaderless_since.get_or_insert_with(Instant::now);
            if since.elapsed() < REMOVAL_CHECK_AFTER {
                continue;
            }
            let answers = self.probe_group(&BTreeMap::new()).await;
            let by = answers.iter().find_map(|p| match p.answer {
                PeerAnswer::View(v) if v.leader && !v.knows_member => Some(p.id.clone()),
                _ => None,
            });
            match (by, said_once.take()) {
                (Some(by), Some(_)) => {
                    self.refuse(format!(
                        "the raft leader {by} does not know this node: it was removed from the \
                         cluster (narad cluster remove) while it was away, and its data directory \
                         belongs to a member that no longer exists; wipe the directory to rejoin \
                         as a new, empty member, or start it under a new id"
                    ));
                    return;
                }
                (by, _) => said_once = by,
            }
        }
    }

    /// This node may not take part under its id: it stops as on a fatal
    /// error (not ready, writes 503) and [`ControlPlane::refused`] says
    /// why, for the server to exit with it.
    fn refuse(&self, why: String) {
        tracing::error!(node_id = %self.me.id, reason = %why, "refusing to start");
        *lock(&self.refused) = Some(why.clone());
        self.metrics.stopped.set(1);
        *lock(&self.stopped) = Some(why);
    }

    /// Why this node may not take part under its id (its data directory
    /// was wiped and the group knows it), once decided.
    pub fn refused(&self) -> Option<String> {
        lock(&self.refused).clone()
    }

    /// Whether this node's own replica counts it in the Raft group.
    fn in_own_group(&self) -> bool {
        let membership = self.raft.metrics().borrow().membership_config.clone();
        membership.membership().get_node(&self.raft_id).is_some()
    }

    /// A join-only node: JoinCluster to every peer until a leader is seen.
    /// `had_state`: this node held Raft state at start; without it, a
    /// leader that knows it as a member means a wiped directory (refused).
    async fn join_loop(self: Arc<Self>, had_state: bool) {
        let request = Request::JoinCluster(JoinCluster {
            id: self.me.id.clone(),
            cluster_addr: self.me.cluster_addr.clone(),
            http_addr: Some(self.me.http_addr.clone()),
        });
        loop {
            if self.stopping.load(Ordering::Relaxed) {
                return;
            }
            if self.raft.metrics().borrow().current_leader.is_some() {
                tracing::info!(node_id = %self.me.id, "joined the raft group: a leader is visible");
                return;
            }
            for p in self.peers.iter().filter(|p| p.id != self.me.id) {
                let peer = self.transport.peer(p.addr, crate::tls::DEFAULT_SERVER_NAME);
                match peer.call(&request).await {
                    Ok(r) if r.status == 200 => {
                        let known = serde_json::from_slice::<Joined>(&r.body)
                            .is_ok_and(|j| j.known_member == Some(true));
                        if known && !had_state {
                            // Its member record predates this empty log:
                            // the directory was wiped (see `form`).
                            self.refuse(self.wiped(&format!("the leader, {}", p.id)));
                            return;
                        }
                        tracing::info!(peer = %p.id, "join accepted");
                        self.forming.store(false, Ordering::SeqCst);
                        break;
                    }
                    Ok(r) => tracing::debug!(peer = %p.id, status = r.status, "join refused"),
                    Err(e) => tracing::debug!(peer = %p.id, error = %e, "join request failed"),
                }
            }
            tokio::time::sleep(JOIN_INTERVAL).await;
        }
    }

    /// This node's entry in the group's membership as this replica last
    /// saw it (`None`: not a member yet).
    fn recorded_self(&self) -> Option<RaftNode> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        m.membership().get_node(&self.raft_id).cloned()
    }

    /// Says at start which configured peers the group records at another
    /// cluster address: the group's record is what Raft dials (a moved
    /// node announced its new address, see `announce_address`); the
    /// configured list is only used to form and to join.
    fn note_moved_peers(&self) {
        let m = self.raft.metrics().borrow().membership_config.clone();
        for p in self.peers.iter().filter(|p| p.id != self.me.id) {
            if let Some(n) = m.membership().get_node(&raft_id(&p.id))
                && n.cluster_addr != p.addr.to_string()
            {
                tracing::warn!(
                    peer = %p.id,
                    configured = %p.addr,
                    recorded = %n.cluster_addr,
                    "a peer's configured cluster address differs from the one the raft group \
                     records: raft dials the recorded one; update this node's peers"
                );
            }
        }
    }

    /// A member restarted on another cluster address (a new port or
    /// host): the others' Raft would keep dialling the address the group
    /// recorded, so it never hears from a leader again (issue 35). It
    /// announces its configured address with JoinCluster, which the leader
    /// commits as a membership change (SetNodes), until its own replica
    /// records the new address; a leader (it may win an election before
    /// anyone else can reach it) commits it itself.
    async fn announce_address(self: Arc<Self>) {
        let Some(recorded) = self.recorded_self() else { return };
        if recorded.cluster_addr == self.me.cluster_addr {
            return;
        }
        tracing::warn!(
            node_id = %self.me.id,
            recorded = %recorded.cluster_addr,
            configured = %self.me.cluster_addr,
            "this node's cluster address is not the one the raft group records: announcing \
             the new address to the leader"
        );
        let join = JoinCluster {
            id: self.me.id.clone(),
            cluster_addr: self.me.cluster_addr.clone(),
            http_addr: Some(self.me.http_addr.clone()),
        };
        let request = Request::JoinCluster(join.clone());
        let started = Instant::now();
        loop {
            if self.stopping.load(Ordering::Relaxed) || self.stopped().is_some() {
                return;
            }
            if self.recorded_self().is_some_and(|n| n.cluster_addr == self.me.cluster_addr) {
                tracing::info!(
                    node_id = %self.me.id,
                    cluster_addr = %self.me.cluster_addr,
                    after_ms = started.elapsed().as_millis() as u64,
                    "the raft group records this node's new cluster address"
                );
                return;
            }
            if self.is_leader() {
                let r = self.handle_join(&self.me.id, &join).await;
                if r.status != 200 {
                    tracing::debug!(status = r.status, "address change not committed yet");
                }
            } else {
                for addr in self.contact_addrs() {
                    let peer = self.transport.peer(addr, crate::tls::DEFAULT_SERVER_NAME);
                    match peer.call(&request).await {
                        Ok(r) if r.status == 200 => break,
                        Ok(r) => {
                            tracing::debug!(%addr, status = r.status, "address change refused")
                        }
                        Err(e) => tracing::debug!(%addr, error = %e, "address change not sent"),
                    }
                }
            }
            tokio::time::sleep(JOIN_INTERVAL).await;
        }
    }

    /// Where to reach the other members: the addresses the group records,
    /// then the configured peers' (either may be stale after a move).
    fn contact_addrs(&self) -> Vec<SocketAddr> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        let recorded = m
            .membership()
            .nodes()
            .filter(|(id, _)| **id != self.raft_id)
            .filter_map(|(_, n)| n.cluster_addr.parse::<SocketAddr>().ok());
        let configured = self.peers.iter().filter(|p| p.id != self.me.id).map(|p| p.addr);
        let mut out: Vec<SocketAddr> = Vec::new();
        for a in recorded.chain(configured) {
            if !out.contains(&a) {
                out.push(a);
            }
        }
        out
    }

    /// Serves ops 21 and 29-33 for the authenticated peer `from` (`None`:
    /// not an op of the control plane).
    pub async fn handle(&self, from: &PeerIdentity, request: &Request) -> Option<Reply> {
        match request {
            Request::ProbeGroup(id) => return Some(self.probe_view(id).await),
            Request::RaftAppendEntries(_)
            | Request::RaftVote(_)
            | Request::RaftInstallSnapshot(_)
                if self.forming.load(Ordering::SeqCst) =>
            {
                return Some(Reply::error(
                    503,
                    "control plane temporarily unavailable: forming (no raft state yet)",
                ));
            }
            Request::JoinCluster(j) => return Some(self.handle_join(&from.node_id, j).await),
            Request::RaftCampaign => return Some(self.handle_campaign().await),
            Request::GetTopic(name) => return Some(self.handle_get_topic(name).await),
            Request::ReadIndex => return Some(self.handle_read_index().await),
            _ => {}
        }
        let payload = match ControlPayload::decode(request)? {
            Ok(p) => p,
            Err(e) => {
                return Some(Reply::error(
                    400,
                    &format!("invalid {} payload: {e}", request.op().name()),
                ));
            }
        };
        Some(match payload {
            ControlPayload::Propose(command) => self.handle_propose(from, command).await,
            ControlPayload::AppendEntries(rpc) => {
                let result = self.raft.append_entries(rpc).await;
                if matches!(&result, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
                    *lock(&self.leader_contact) = Some(Instant::now());
                }
                json_reply(&result)
            }
            ControlPayload::Vote(rpc) => json_reply(&self.raft.vote(rpc).await),
            ControlPayload::InstallSnapshot(rpc) => {
                let result = self.raft.install_snapshot(rpc).await;
                if result.is_ok() {
                    *lock(&self.leader_contact) = Some(Instant::now());
                }
                json_reply(&result)
            }
        })
    }

    fn not_leader(&self) -> Reply {
        let leader = self.leader().map(|l| l.id);
        Reply::error(
            NOT_LEADER,
            &format!("not the leader (leader: {})", leader.as_deref().unwrap_or("unknown")),
        )
    }

    /// GetTopic (op 20) on the leader: the topic as the leader's state has
    /// it after a barrier, so a 404 is an authoritative "gone".
    async fn handle_get_topic(&self, name: &str) -> Reply {
        if !self.is_leader() {
            return self.not_leader();
        }
        match self.confirmed_local_view(name).await {
            Ok(LeaderTopicView::Absent) => Reply::error(404, "topic not found"),
            Ok(LeaderTopicView::Present { incarnation }) => {
                json_reply(&TopicPresence { name: name.to_owned(), incarnation })
            }
            Err(why) => Reply::error(503, &format!("control plane temporarily unavailable: {why}")),
        }
    }

    /// ReadIndex (op 36) on the leader: its read index once a quorum
    /// confirmed it still leads.
    async fn handle_read_index(&self) -> Reply {
        if !self.is_leader() {
            return self.not_leader();
        }
        match self.read_index_here().await {
            Ok(index) => json_reply(&ReadIndex { index }),
            Err(why) => Reply::error(503, &format!("control plane temporarily unavailable: {why}")),
        }
    }

    /// As leader: the index a read must see (everything committed when
    /// asked), after a quorum confirmed this node still leads; this node
    /// has applied it when this returns.
    async fn read_index_here(&self) -> Result<u64, String> {
        match tokio::time::timeout(CONFIRM_BARRIER, self.raft.ensure_linearizable()).await {
            Ok(Ok(read)) => Ok(read.map_or(0, |l| l.index)),
            Ok(Err(e)) => Err(format!("leadership not confirmed: {e}")),
            Err(_) => Err(format!("leadership not confirmed within {CONFIRM_BARRIER:?}")),
        }
    }

    /// SPEC §6/§7.1's "caught up", asked of the leader: a leader is known,
    /// this node leads or heard from it within [`LEADER_CONTACT_FRESH`],
    /// and this replica has applied at least the leader's commit index at
    /// the time of asking (op 36; waiting up to [`CATCH_UP_WAIT`] for it).
    /// Unlike [`ControlPlane::applied_caught_up`] (this node's own idea of
    /// what is committed, which a restarted follower holding a stale log
    /// may believe complete) this cannot pass on a stale replica. Work
    /// that destroys or copies data waits for it.
    pub async fn caught_up_with_leader(&self) -> Result<(), String> {
        if let Some(why) = self.stopped() {
            return Err(format!("the control plane stopped: {why}"));
        }
        let (leader_id, leader) = self
            .wait_leader(Duration::ZERO)
            .await
            .ok_or_else(|| "no raft leader is known".to_owned())?;
        let index = if leader_id == self.raft_id {
            self.read_index_here().await?
        } else {
            let fresh =
                lock(&self.leader_contact).is_some_and(|t| t.elapsed() <= LEADER_CONTACT_FRESH);
            if !fresh {
                return Err(format!(
                    "no contact with the raft leader {} within {LEADER_CONTACT_FRESH:?}",
                    leader.id
                ));
            }
            let peer = peer_of(&self.transport, &leader)?;
            let reply = peer
                .call_with_timeout(&Request::ReadIndex, CONFIRM_BARRIER)
                .await
                .map_err(|e| format!("asking the raft leader {}: {e}", leader.id))?;
            if reply.status != 200 {
                return Err(format!(
                    "the raft leader {} answered {}: {}",
                    leader.id,
                    reply.status,
                    error_text(&reply.body)
                ));
            }
            let r: ReadIndex = serde_json::from_slice(&reply.body).map_err(|e| {
                format!("the raft leader {} answered an unreadable read index: {e}", leader.id)
            })?;
            r.index
        };
        self.raft
            .wait(Some(CATCH_UP_WAIT))
            .applied_index_at_least(Some(index), "caught up with the leader")
            .await
            .map_err(|e| format!("not applied up to the leader's index {index} yet: {e}"))?;
        match self.stopped() {
            None => Ok(()),
            Some(why) => Err(format!("the control plane stopped: {why}")),
        }
    }

    /// As leader: [`confirmed_view`] of this node's state.
    async fn confirmed_local_view(&self, name: &str) -> Result<LeaderTopicView, String> {
        confirmed_view(&self.raft, &self.meta, name).await
    }

    /// Leader confirmation (SPEC §7.1) of whether `name` exists: as leader,
    /// barrier + re-read; otherwise GetTopic (op 20) to the leader. Only
    /// [`LeaderTopicView::Absent`] authorises destroying anything of the
    /// topic; every failure is an `Err` (keep everything, ask again later).
    /// Callers check [`ControlPlane::applied_caught_up`] first.
    pub async fn leader_topic_view(&self, name: &str) -> Result<LeaderTopicView, String> {
        let (leader_id, leader) = self
            .wait_leader(Duration::ZERO)
            .await
            .ok_or_else(|| "no raft leader is known".to_owned())?;
        if leader_id == self.raft_id {
            return self.confirmed_local_view(name).await;
        }
        let peer = peer_of(&self.transport, &leader)?;
        let reply = peer
            .call_with_timeout(&Request::GetTopic(name.to_owned()), CONFIRM_BARRIER)
            .await
            .map_err(|e| format!("asking the raft leader {}: {e}", leader.id))?;
        match reply.status {
            404 => Ok(LeaderTopicView::Absent),
            200 => {
                let p: TopicPresence = serde_json::from_slice(&reply.body).map_err(|e| {
                    format!("the raft leader {} answered an unreadable topic: {e}", leader.id)
                })?;
                if p.name != name {
                    return Err(format!(
                        "the raft leader {} answered for topic {:?}, not {name:?}",
                        leader.id, p.name
                    ));
                }
                Ok(LeaderTopicView::Present { incarnation: p.incarnation })
            }
            status => Err(format!(
                "the raft leader {} answered {status}: {}",
                leader.id,
                error_text(&reply.body)
            )),
        }
    }

    /// JoinCluster on the leader: the node becomes a learner, then a voter.
    /// JoinCluster's 200: joined, and whether this leader's state knows
    /// the node as a member (it heartbeated before: a node without Raft
    /// state asking is one that lost it).
    fn joined(&self, id: &str) -> Reply {
        let known_member = Some(self.meta.snapshot().member(id).is_some());
        json_reply(&Joined { joined: true, known_member })
    }

    /// JoinCluster from the peer that proved (or, without a secret,
    /// claimed) the id `from`: a node joins, or announces a new address,
    /// only as itself; another member's answer would let any peer redirect
    /// a member's Raft traffic.
    async fn handle_join(&self, from: &str, j: &JoinCluster) -> Reply {
        if !self.is_leader() {
            return self.not_leader();
        }
        if self.stopping.load(Ordering::Relaxed) {
            return Reply::error(503, "control plane temporarily unavailable: shutting down");
        }
        let id = raft_id(&j.id);
        if j.cluster_addr.parse::<SocketAddr>().is_err() {
            return Reply::error(400, &format!("invalid cluster address {:?}", j.cluster_addr));
        }
        if from != j.id {
            tracing::warn!(
                peer = %from,
                claimed = %j.id,
                cluster_addr = %j.cluster_addr,
                "join refused: a peer asked to join (or move) another node"
            );
            return Reply::error(
                403,
                &format!(
                    "node {from:?} cannot join or move node {:?}: a node joins as itself",
                    j.id
                ),
            );
        }
        let node = RaftNode {
            id: j.id.clone(),
            cluster_addr: j.cluster_addr.clone(),
            http_addr: j.http_addr.clone().unwrap_or_default(),
        };
        let _one = self.join_lock.lock().await;
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let m = membership.membership();
        if let Some(known) = m.get_node(&id).filter(|n| n.id != j.id) {
            return Reply::error(
                409,
                &format!("node {:?} derives the raft id of node {:?}", j.id, known.id),
            );
        }
        let is_voter = m.voter_ids().any(|v| v == id);
        if is_voter && m.get_node(&id) == Some(&node) {
            return self.joined(&j.id);
        }
        let step = async {
            match m.get_node(&id) {
                None => {
                    self.raft
                        .add_learner(id, node.clone(), false)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                // A node that rejoins from another address.
                Some(known) if known != &node => {
                    let set = ChangeMembers::SetNodes(BTreeMap::from([(id, node.clone())]));
                    self.raft.change_membership(set, true).await.map_err(|e| e.to_string())?;
                }
                Some(_) => {}
            }
            // A drained member rejoining (a restart) stays a learner while
            // the group keeps enough voters without it (`voters`).
            let stays_learner = super::voters::drained(&self.meta.snapshot(), &j.id)
                && m.voter_ids().count() >= super::voters::MIN_VOTERS_AFTER_DRAIN;
            if !is_voter && !stays_learner {
                self.raft
                    .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        };
        match tokio::time::timeout(REPLY_TIMEOUT - Duration::from_millis(500), step).await {
            Ok(Ok(())) => {
                tracing::info!(node_id = %j.id, cluster_addr = %j.cluster_addr, "node joined the raft group as a voter");
                self.joined(&j.id)
            }
            Ok(Err(e)) => {
                tracing::warn!(node_id = %j.id, error = %e, "join failed");
                Reply::error(503, &format!("control plane temporarily unavailable: join: {e}"))
            }
            Err(_) => Reply::error(
                503,
                "control plane temporarily unavailable: join did not commit in time",
            ),
        }
    }

    /// ProposeCommand on the leader: the write, an audit line for what it
    /// changed of users, grants and topics, and the response without any
    /// password hash.
    async fn handle_propose(&self, from: &PeerIdentity, command: Command) -> Reply {
        if !self.is_leader() {
            return self.not_leader();
        }
        if let Some(refused) = self.refuse_outsider(from).await {
            return refused;
        }
        let audited = audit_event(&command);
        match self.write_local(command).await {
            LocalWrite::Written(log_index, Ok(response)) => {
                if let Some((event, target, actor)) = audited {
                    tracing::info!(
                        component = "audit",
                        event,
                        target = %target,
                        actor = actor.as_deref().unwrap_or("unknown"),
                        from_node = %from.node_id,
                        from_addr = %from.addr,
                        log_index,
                        "audit: metadata write forwarded by a peer"
                    );
                }
                json_reply(&Proposed { log_index, response: without_secrets(response) })
            }
            LocalWrite::Written(_, Err(e)) | LocalWrite::Failed(e) => {
                let (status, text) = e.to_wire();
                Reply::error(status, &text)
            }
            LocalWrite::NotLeader => self.not_leader(),
        }
    }

    /// A write forwarded by a node outside the Raft group is refused with
    /// [`NOT_IN_GROUP`]: such a node was removed (`narad cluster remove`)
    /// and came back on its old directory, whose replica no longer follows
    /// the group, so a heartbeat of it would bring back a member record
    /// for a node that cannot own anything. Said only by a leader that
    /// confirmed it still leads: a deposed one may not know a node that
    /// joined since. `None`: the write goes on.
    async fn refuse_outsider(&self, from: &PeerIdentity) -> Option<Reply> {
        let rid = raft_id(&from.node_id);
        let in_group = || {
            let membership = self.raft.metrics().borrow().membership_config.clone();
            membership.membership().get_node(&rid).is_some()
        };
        if in_group() {
            return None;
        }
        match tokio::time::timeout(CONFIRM_BARRIER, self.raft.ensure_linearizable()).await {
            Ok(Ok(_)) if !in_group() => {}
            Ok(Ok(_)) => return None,
            _ => return Some(self.not_leader()),
        }
        tracing::warn!(peer = %from.node_id, addr = %from.addr,
            "refused a write from a node outside the raft group (removed from the cluster?)");
        Some(Reply::error(
            NOT_IN_GROUP,
            &format!(
                "{} is not in the raft group: it was removed from the cluster (narad cluster remove)",
                from.node_id
            ),
        ))
    }

    /// RaftCampaign: start an election as soon as this node's leader lease
    /// has lapsed (before that, the other voters would refuse to vote).
    async fn handle_campaign(&self) -> Reply {
        if self.leaving.load(Ordering::Relaxed) || self.stopping.load(Ordering::Relaxed) {
            return Reply::error(503, "this node is stopping: it does not campaign");
        }
        let lease = self.timings.election_max;
        let since = self
            .raft
            .with_raft_state(|st| st.vote_last_modified().map(|t| t.elapsed()))
            .await
            .ok()
            .flatten();
        // Past this node's lease, and the other voters' (they heard the
        // last heartbeat at about the same time), with two heartbeats of slack.
        let wait =
            since.map_or(Duration::ZERO, |s| lease.saturating_sub(s)) + self.timings.heartbeat * 2;
        let raft = self.raft.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            match raft.trigger().elect().await {
                Ok(()) => {}
                // This node stopped meanwhile: the leader sees nobody
                // campaigning and stops waiting (see `hand_over`).
                Err(openraft::error::Fatal::Stopped) => {
                    tracing::debug!("campaign dropped: this node stopped")
                }
                Err(e) => tracing::warn!(error = %e, "campaign failed"),
            }
        });
        tracing::info!(after = ?wait, "campaign requested: starting an election");
        Reply::json(200, r#"{"campaign":true}"#)
    }

    /// Writes `command` through Raft on this node, if it leads. A
    /// RemoveMember (op 17) also takes the member out of the Raft group
    /// once the metastore applied it (see [`ControlPlane::remove_from_group`]).
    async fn write_local(&self, command: Command) -> LocalWrite {
        let Command::RemoveMember(c) = &command else {
            return self.write_command(command).await;
        };
        let id = c.id.clone();
        let rid = raft_id(&id);
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let voters: Vec<NodeId> = membership.membership().voter_ids().collect();
        if voters.iter().all(|v| *v == rid) {
            return LocalWrite::Failed(MetaError::Conflict(format!(
                "removing {id} would leave the raft group without a voter"
            )));
        }
        let written = self.write_command(command).await;
        // Removed now, or by an earlier removal whose raft step did not
        // commit (the leader stopped or lost its quorum in between): the
        // metastore no longer knows the member, the raft group may still.
        // The operator's retry lands here and finishes it.
        let gone = matches!(&written, LocalWrite::Written(_, Ok(_) | Err(MetaError::NotFound(_))));
        if gone && skip_group_step_once() {
            return written;
        }
        if gone && let Err(e) = self.remove_from_group(&id).await {
            return LocalWrite::Failed(MetaError::Unavailable(format!(
                "member {id} was removed from the metastore, but not from the raft group: {e}; \
                 repeat the removal to finish it"
            )));
        }
        written
    }

    /// Takes node `id`, removed for good, out of the Raft group on the
    /// leader: out of the voters (the joint change needs a majority of the
    /// old voters and of the new ones, which the live nodes are: a 3-voter
    /// group that lost one node becomes a 2-voter group that keeps its
    /// quorum with both) and out of the nodes, or out of the learners. A
    /// node that comes back under the id afterwards is not in the group: it
    /// can only join as a new member (its wiped directory is refused as
    /// before while any peer still knows it; once nobody does, it joins
    /// with an empty log as a member that owns nothing).
    async fn remove_from_group(&self, id: &str) -> Result<(), String> {
        let rid = raft_id(id);
        let _one = self.join_lock.lock().await;
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let m = membership.membership();
        let change = if m.voter_ids().any(|v| v == rid) {
            ChangeMembers::RemoveVoters(BTreeSet::from([rid]))
        } else if m.get_node(&rid).is_some() {
            ChangeMembers::RemoveNodes(BTreeSet::from([rid]))
        } else {
            return Ok(());
        };
        match tokio::time::timeout(REMOVE_GROUP_TIMEOUT, self.raft.change_membership(change, false))
            .await
        {
            Ok(Ok(_)) => {
                tracing::warn!(node_id = %id, "removed node left the raft group for good");
                Ok(())
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("not committed within {REMOVE_GROUP_TIMEOUT:?}")),
        }
    }

    /// Writes `command` through Raft on this node, if it leads.
    async fn write_command(&self, command: Command) -> LocalWrite {
        match tokio::time::timeout(APPLY_TIMEOUT, self.raft.client_write(command)).await {
            Err(_) => LocalWrite::Failed(MetaError::Unavailable(format!(
                "the write was not committed within {APPLY_TIMEOUT:?} (it may still be applied)"
            ))),
            Ok(Ok(r)) => LocalWrite::Written(r.log_id.index, r.data.into_result()),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))) => {
                LocalWrite::NotLeader
            }
            Ok(Err(e)) => LocalWrite::Failed(MetaError::Unavailable(format!("raft: {e}"))),
        }
    }

    /// The leader, waiting up to `wait` for one to be known.
    async fn wait_leader(&self, wait: Duration) -> Option<(NodeId, RaftNode)> {
        let mut rx = self.raft.metrics();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            {
                let m = rx.borrow_and_update();
                if let Some(id) = m.current_leader
                    && let Some(node) = m.membership_config.membership().get_node(&id)
                {
                    return Some((id, node.clone()));
                }
            }
            // Timed out, or Raft stopped (its metrics' sender is gone:
            // `changed` would answer at once, forever).
            if !matches!(tokio::time::timeout_at(deadline, rx.changed()).await, Ok(Ok(()))) {
                return None;
            }
        }
    }

    async fn replicate_async(&self, command: Command) -> Result<Response, MetaError> {
        let start = Instant::now();
        let deadline = start + budget(&command);
        let body: Bytes = serde_json::to_vec(&command)
            .map_err(|e| MetaError::Invalid(format!("command does not serialize: {e}")))?
            .into();
        let mut unreachable: Option<(Instant, String)> = None;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if self.stopping.load(Ordering::Relaxed) {
                return Err(MetaError::Unavailable("this node is shutting down".to_owned()));
            }
            if let Some(why) = self.stopped() {
                return Err(MetaError::Unavailable(format!(
                    "this node's control plane stopped ({why}); write through another node"
                )));
            }
            let Some((leader_id, leader)) = self.wait_leader(LEADER_WAIT.min(remaining)).await
            else {
                let why = unreachable.map_or_else(
                    || format!("no raft leader elected within {LEADER_WAIT:?}"),
                    |(_, why)| why,
                );
                return Err(MetaError::Unavailable(why));
            };
            if remaining.is_zero() {
                return Err(MetaError::Unavailable(format!(
                    "the write did not complete within {:?}",
                    budget(&command)
                )));
            }
            if leader_id == self.raft_id {
                match self.write_local(command.clone()).await {
                    LocalWrite::Written(_, result) => return result,
                    LocalWrite::Failed(e) => return Err(e),
                    LocalWrite::NotLeader => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                }
            }
            let peer = peer_of(&self.transport, &leader).map_err(MetaError::Upstream)?;
            let request = Request::ProposeCommand(body.clone());
            // A connection to a leader that just died looks healthy until
            // QUIC's idle timeout (30 s): do not wait for it once this node
            // sees another leader (or an election).
            let call = tokio::select! {
                call = peer.call_with_timeout(&request, remaining) => call,
                () = self.leader_replaced(leader_id) => {
                    return Err(MetaError::Unavailable(format!(
                        "the raft leader {} was replaced while the write was in flight; it may \
                         or may not have been applied (retry: a repeated create answers 409 if it was)",
                        leader.id
                    )));
                }
            };
            match call {
                Ok(reply) if reply.status == 200 => {
                    let proposed: Proposed = serde_json::from_slice(&reply.body).map_err(|e| {
                        MetaError::Upstream(format!(
                            "leader {} answered an unreadable reply: {e}",
                            leader.id
                        ))
                    })?;
                    self.await_applied(proposed.log_index, deadline).await?;
                    return Ok(proposed.response);
                }
                Ok(reply) if reply.status == NOT_LEADER => {
                    // Nothing was written: ask the leader it names, or wait.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok(reply) if reply.status == NOT_IN_GROUP => {
                    // This replica still counts this node in the group, the
                    // leader does not: it was removed while it was away.
                    // (A node joining, not in its own replica's group yet,
                    // just waits to be added.)
                    if self.in_own_group() {
                        self.refuse(format!(
                            "the raft leader {} says this node is not in the raft group: it was \
                             removed from the cluster (narad cluster remove) while it was away, and \
                             its data directory belongs to a member that no longer exists; wipe the \
                             directory to rejoin as a new, empty member, or start it under a new id",
                            leader.id
                        ));
                    }
                    // To the client: this node is stopping (SPEC's 503).
                    return Err(MetaError::Unavailable(error_text(&reply.body)));
                }
                Ok(reply) => {
                    return Err(MetaError::from_wire(reply.status, error_text(&reply.body)));
                }
                Err(e @ crate::Error::Dial { .. }) => {
                    // The request never left: safe to retry until a
                    // reachable leader appears, for as long as one may take.
                    let why = format!(
                        "raft leader {} ({}) is unreachable: {e}",
                        leader.id, leader.cluster_addr
                    );
                    let since = unreachable.as_ref().map_or_else(Instant::now, |(t, _)| *t);
                    if since.elapsed() >= LEADER_WAIT {
                        return Err(MetaError::Unavailable(why));
                    }
                    unreachable = Some((since, why));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    return Err(MetaError::Upstream(format!(
                        "forwarding to the raft leader {} ({}): {e}",
                        leader.id, leader.cluster_addr
                    )));
                }
            }
        }
    }

    /// Resolves once this node's view of the leader is no longer `leader`
    /// (an election started, or another node leads).
    async fn leader_replaced(&self, leader: NodeId) {
        let mut rx = self.raft.metrics();
        loop {
            if rx.borrow_and_update().current_leader != Some(leader) {
                return;
            }
            if rx.changed().await.is_err() {
                // Raft stopped; the stopping check answers the caller.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Waits (bounded by `deadline`, at least briefly) until this node has
    /// applied `index`, so the caller reads its own write here. When it
    /// has not (its Raft stopped, or it lags), the write is committed but
    /// not visible here: 503, never a success the caller cannot read back.
    async fn await_applied(&self, index: u64, deadline: Instant) -> Result<(), MetaError> {
        let wait =
            deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(500));
        let waited =
            self.raft.wait(Some(wait)).applied_index_at_least(Some(index), "forwarded write").await;
        match waited {
            Ok(_) if self.stopped().is_none() => Ok(()),
            Ok(_) => Err(MetaError::Unavailable(format!(
                "the write was committed (raft log index {index}) but this node's control plane \
                 stopped; it is visible through the other nodes"
            ))),
            Err(e) => {
                tracing::warn!(index, error = %e, "a forwarded write is not applied here");
                Err(MetaError::Unavailable(format!(
                    "the write was committed (raft log index {index}) but is not applied on this \
                     node yet ({e}); it is visible through the leader and will be here once \
                     applied (a retried create answers 409)"
                )))
            }
        }
    }

    /// The leader as this node knows it.
    pub fn leader(&self) -> Option<LeaderInfo> {
        let m = self.raft.metrics().borrow().clone();
        let id = m.current_leader?;
        let node = m.membership_config.membership().get_node(&id)?.clone();
        Some(LeaderInfo { id: node.id, cluster_addr: node.cluster_addr, http_addr: node.http_addr })
    }

    /// Whether this node leads.
    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.raft_id)
    }

    /// This node's view of the group.
    pub fn status(&self) -> RaftStatus {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let name =
            |id: NodeId| membership.get_node(&id).map_or_else(|| id.to_string(), |n| n.id.clone());
        let mut voters: Vec<String> = membership.voter_ids().map(name).collect();
        let mut learners: Vec<String> = membership.learner_ids().map(name).collect();
        voters.sort();
        learners.sort();
        let role = match m.state {
            ServerState::Leader => Role::Leader,
            ServerState::Follower => Role::Follower,
            ServerState::Candidate => Role::Candidate,
            ServerState::Learner => Role::Learner,
            ServerState::Shutdown => Role::Shutdown,
        };
        // Both from one refresh: an applied index read now could be above a
        // committed index refreshed up to 100 ms ago.
        let (commit_index, last_applied) = *lock(&self.indices);
        let millis_since_leader_contact = if role == Role::Leader {
            Some(0)
        } else {
            lock(&self.leader_contact).map(|t| t.elapsed().as_millis() as u64)
        };
        RaftStatus {
            role,
            term: m.current_term,
            leader: m.current_leader.map(name),
            commit_index,
            last_applied,
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            purged_index: m.purged.map_or(0, |l| l.index),
            millis_since_leader_contact,
            voters,
            learners,
            stopped: self.stopped(),
        }
    }

    /// SPEC §7.1 AppliedCaughtUp: a leader is known, this node leads or
    /// heard from it within [`LEADER_CONTACT_FRESH`], and it has applied
    /// everything it knows committed.
    pub fn applied_caught_up(&self) -> bool {
        let s = self.status();
        let fresh = s.role == Role::Leader
            || s.millis_since_leader_contact
                .is_some_and(|ms| ms <= LEADER_CONTACT_FRESH.as_millis() as u64);
        s.stopped.is_none() && s.leader.is_some() && fresh && s.last_applied >= s.commit_index
    }

    /// Resolves once a leader is visible (join-only readiness), or never.
    pub async fn wait_for_leader(&self) {
        let mut rx = self.raft.metrics();
        loop {
            if rx.borrow_and_update().current_leader.is_some() {
                return;
            }
            if rx.changed().await.is_err() {
                // Raft stopped: no leader will ever be visible.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Resolves once this node has reached its group's leader since it
    /// started: a leader's AppendEntries or snapshot was accepted here, or
    /// this node leads and a quorum confirmed it. Unlike
    /// [`ControlPlane::wait_for_leader`] this cannot pass on a vote restored
    /// from disk (openraft names the leader of the last committed vote at
    /// once, before any contact), so a node the group removed while it was
    /// away, which no leader replicates to, never passes it. Never resolves
    /// once the control plane stopped or is stopping.
    pub async fn wait_leader_reached(&self) {
        loop {
            if self.stopping.load(Ordering::SeqCst) || self.stopped().is_some() {
                std::future::pending::<()>().await;
            }
            if lock(&self.leader_contact).is_some() {
                return;
            }
            let leads = self.raft.metrics().borrow().state == ServerState::Leader;
            if leads && !self.forming.load(Ordering::SeqCst) && self.read_index_here().await.is_ok()
            {
                return;
            }
            tokio::time::sleep(MONITOR_INTERVAL).await;
        }
    }

    /// The leader's side of [`super::voters`]: every controller interval,
    /// one change of who votes (a drained member leaves the voters, the
    /// leader handing over first when it is the one; an undrained one
    /// votes again). Runs on every node, acts only while leading.
    async fn steward_voters(self: Arc<Self>) {
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + crate::limits::CONTROLLER_INTERVAL,
            crate::limits::CONTROLLER_INTERVAL,
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            if !self.is_leader() {
                continue;
            }
            if let Err(why) = self.voter_step().await {
                tracing::warn!(reason = %why, "voter change not committed; the next tick retries");
            }
        }
    }

    async fn voter_step(&self) -> Result<(), String> {
        use super::voters::{VoterStep, voter_step};
        let one = self.join_lock.lock().await;
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let m = membership.membership();
        let named = |id: NodeId| m.get_node(&id).map(|n| (id, n.id.clone()));
        let voters: Vec<(NodeId, String)> = m.voter_ids().filter_map(named).collect();
        let learners: Vec<(NodeId, String)> = m.learner_ids().filter_map(named).collect();
        let step = voter_step(&self.meta.snapshot(), &voters, &learners, self.raft_id);
        match step {
            None => Ok(()),
            Some(VoterStep::HandOver) => {
                drop(one);
                tracing::info!(
                    node_id = %self.me.id,
                    "this leader is drained: handing leadership over before it leaves the voters"
                );
                self.hand_over().await;
                // `hand_over` silenced this node for a stop; it keeps
                // running (as a follower, then a learner).
                self.raft.runtime_config().heartbeat(true);
                self.raft.runtime_config().elect(true);
                Ok(())
            }
            Some(VoterStep::Demote(id, name)) => {
                let change = ChangeMembers::RemoveVoters(BTreeSet::from([id]));
                self.raft.change_membership(change, true).await.map_err(|e| e.to_string())?;
                tracing::info!(node_id = %name, voters_left = voters.len() - 1,
                    "drained member left the raft voters (it stays a learner)");
                Ok(())
            }
            Some(VoterStep::Promote(id, name)) => {
                let change = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
                self.raft.change_membership(change, false).await.map_err(|e| e.to_string())?;
                tracing::info!(node_id = %name, voters = voters.len() + 1, "learner became a raft voter");
                Ok(())
            }
        }
    }

    /// This node's shutdown began: from now on it refuses to campaign
    /// (op 33), so a leader stopping at the same time does not wait for it.
    pub fn begin_leaving(&self) {
        self.leaving.store(true, Ordering::SeqCst);
    }

    /// Graceful stop: a leader hands leadership to the most up-to-date
    /// voter that agrees to campaign (op 33) and waits up to
    /// [`HANDOVER_WAIT`] for another leader; then Raft shuts down.
    /// Idempotent.
    pub async fn shutdown(&self) {
        self.begin_leaving();
        if self.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        if self.is_leader() {
            self.hand_over().await;
        }
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
        tracing::info!(node_id = %self.me.id, "control plane stopped");
    }

    async fn hand_over(&self) {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let matched = |id: &NodeId| {
            m.replication.as_ref().and_then(|r| r.get(id).cloned().flatten()).map_or(0, |l| l.index)
        };
        // The most up-to-date first.
        let mut voters: Vec<(u64, RaftNode)> = membership
            .voter_ids()
            .filter(|id| *id != self.raft_id)
            .filter_map(|id| membership.get_node(&id).map(|n| (matched(&id), n.clone())))
            .collect();
        if voters.is_empty() {
            return;
        }
        voters.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
        // No more heartbeats: the other voters' leader lease lapses.
        self.raft.runtime_config().heartbeat(false);
        self.raft.runtime_config().elect(false);
        let mut refused = Vec::new();
        let mut taken = None;
        for (_, node) in voters {
            let answer = match peer_of(&self.transport, &node) {
                Ok(peer) => peer
                    .call_with_timeout(&Request::RaftCampaign, Duration::from_secs(1))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| match r.status {
                        200 => Ok(()),
                        status => Err(format!("{status} {}", String::from_utf8_lossy(&r.body))),
                    }),
                Err(e) => Err(e.to_string()),
            };
            match answer {
                Ok(()) => {
                    taken = Some(node);
                    break;
                }
                Err(why) => refused.push(format!("{}: {why}", node.id)),
            }
        }
        let Some(node) = taken else {
            // Every other voter is stopping or out of reach: nobody can
            // take over, so waiting would only delay this stop.
            tracing::info!(
                refused = %refused.join("; "),
                "leadership not handed over: no other voter can campaign"
            );
            return;
        };
        let me = self.raft_id;
        let deadline = Instant::now() + HANDOVER_WAIT;
        let peer = peer_of(&self.transport, &node).ok();
        loop {
            let slice = HANDOVER_CHECK.min(deadline.saturating_duration_since(Instant::now()));
            let handed = self
                .raft
                .wait(Some(slice))
                .metrics(move |m| m.current_leader.is_some_and(|l| l != me), "another leader")
                .await;
            if handed.is_ok() {
                tracing::info!(to = %node.id, "leadership handed over");
                return;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    to = %node.id,
                    waited = ?HANDOVER_WAIT,
                    "leadership handover: no other leader in time"
                );
                return;
            }
            // The voter agreed and then stopped (its own shutdown began
            // just after): nobody is campaigning any more.
            let gone = match &peer {
                Some(p) => {
                    !matches!(tokio::time::timeout(HANDOVER_CHECK, p.ping()).await, Ok(Ok(_)))
                }
                None => true,
            };
            if gone {
                tracing::info!(
                    to = %node.id,
                    "leadership not handed over: the voter that agreed to campaign stopped"
                );
                return;
            }
        }
    }
}

impl crate::members::LeaderView for ControlPlane {
    fn is_leader(&self) -> bool {
        ControlPlane::is_leader(self)
    }
}

impl Replicator for ControlPlane {
    fn replicate(&self, command: Command) -> Result<Response, MetaError> {
        self.runtime.block_on(self.replicate_async(command))
    }
}

/// Test-only: the first forced removal this process leads commits in the
/// metastore and skips its raft step, as if the leader had stopped in
/// between (`cluster_remove.rs` retries it). Unset: never.
pub const SKIP_REMOVE_GROUP_STEP_ENV: &str = "NARAD_TEST_SKIP_REMOVE_GROUP_STEP_ONCE";

fn skip_group_step_once() -> bool {
    static SKIPPED: AtomicBool = AtomicBool::new(false);
    if std::env::var_os(SKIP_REMOVE_GROUP_STEP_ENV).is_none()
        || SKIPPED.swap(true, Ordering::SeqCst)
    {
        return false;
    }
    tracing::warn!("test hook: this removal leaves its node in the raft group");
    true
}

/// How long a first start waits for its peers before the wait is logged at
/// WARN (INFO before: peers started together answer within moments).
const FORM_WAIT_WARN_AFTER: Duration = Duration::from_secs(10);
