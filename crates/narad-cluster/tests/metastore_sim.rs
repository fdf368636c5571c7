//! The replicated metastore, simulated deterministically (issue 25 part 1,
//! second slice): three or five nodes, each the real Raft node of the
//! metastore group — openraft with narad's log store (`raft.redb`) and
//! state machine (the metastore) on its own `SimFs` — exchanging Raft's
//! RPCs in their wire form (`ControlPayload`, JSON) over a simulated
//! network, under one seeded scheduler with virtual time (tokio's paused
//! clock on one thread; storage work runs inline on a disk in memory, and
//! each node's election timeout is drawn from the seed, so a seed replays
//! bit for bit).
//!
//! The harness proposes topic creates and deletes (the same few names
//! over and over: delete and recreate) at the node each node believes
//! leads, asks nodes that believe they lead for their confirmed view of a
//! topic ([`narad_cluster::raft::confirmed_view`], the leader confirmation
//! a cluster node needs before it discards a 202'd record of a deleted
//! topic), and injects: lost, duplicated, delayed and reordered messages;
//! links cut both ways or one way, healed at random (flapping); node
//! crashes with power loss (unsynced bytes dropped, the last write torn);
//! failed fsyncs and writes, which stop the node (a latched log) until it
//! restarts. Small snapshot intervals in a quarter of the seeds make
//! lagging nodes catch up by snapshot.
//!
//! After the run it heals every link, restarts every node and waits for
//! one leader and every node to apply the same log. Then:
//! * one entry per log index: every node, in every life, applied the same
//!   log id and the same effect at each index (state machine safety), and
//!   every node holds the same state at the end, byte for byte;
//! * a node just elected holds every entry acknowledged in an earlier term
//!   (leader completeness). openraft, as narad runs it (without its
//!   `single-term-leader` feature), names a leader by (term, node id): two
//!   nodes may lead one term in turn, the greater id deposing the other,
//!   so "one leader per term" is checked as these two properties, which
//!   are what it protects; the run counts the terms led by two nodes;
//! * every write the group acknowledged was applied, and its effect is in
//!   the final state or undone by a later committed write (durability);
//! * every confirmed view answered is linearizable as far as the history
//!   tells: never a topic whose deletion was acknowledged before the
//!   question, never "absent" for a topic whose creation was acknowledged
//!   before the question and which was never deleted, never an
//!   incarnation nobody created.
//!
//! `NARAD_SEED=S` runs one seed, `NARAD_SEEDS=N` runs N (default 1,000);
//! `NARAD_SIM_TRACE=1` prints every fault, restart and new leader;
//! `NARAD_SIM_LOG=<filter>` prints the nodes' own logs (`openraft=debug`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_clock::ManualClock;
use narad_cluster::controller::plan_with;
use narad_cluster::heartbeat_ages::HeartbeatAges;
use narad_cluster::limits::{CONTROLLER_INTERVAL, HEARTBEAT_INTERVAL, MEMBER_DEAD_AFTER};
use narad_cluster::members::beat_value;
use narad_cluster::raft::first_start::{self, FirstStart, PeerAnswer, PeerView};
use narad_cluster::raft::log_store::LogStore;
use narad_cluster::raft::metrics::RaftMetrics;
use narad_cluster::raft::network::ControlPayload;
use narad_cluster::raft::state_machine::StateMachine;
use narad_cluster::raft::types::AppliedState;
use narad_cluster::raft::{
    LeaderTopicView, RaftNode, RaftTimings, TypeConfig, confirmed_view, raft_id,
};
use narad_cluster::rpc::Request;
use narad_fs::{CrashMode, FaultKind, SimFs, SimRng};
use narad_meta::{
    Command, CreateTopicRequest, DeleteTopic, Member, MetaState, MetaStore, MetaStoreOptions,
    Response, TopicDefaults,
};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::storage::RaftLogStorage;
use openraft::{AnyError, Raft, RaftNetwork, RaftNetworkFactory, ServerState};
use tokio::time::Instant;

type NodeId = u64;
type LogId = openraft::LogId<NodeId>;
type RpcErr<E = openraft::error::Infallible> = RPCError<NodeId, RaftNode, RaftError<NodeId, E>>;

const NAMES: [&str; 4] = ["alpha", "beta", "gamma", "delta"];
/// Steps of the faulty phase (each 1-60 ms of virtual time).
const STEPS: usize = 400;

fn node_name(i: usize) -> String {
    format!("n{i}")
}

/// What the simulated network shares between nodes.
struct NetState {
    rng: SimRng,
    /// Each node's running Raft (`None`: down).
    rafts: Vec<Option<Raft<TypeConfig>>>,
    /// Directed links that drop everything: (from, to).
    cut: HashSet<(usize, usize)>,
    faulty: bool,
    messages: u64,
    lost: u64,
    duplicated: u64,
}

type Net = Arc<Mutex<NetState>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How one message fares: lost, or delivered after a delay.
fn fate(net: &Net, from: usize, to: usize) -> Option<Duration> {
    let mut st = lock(net);
    st.messages += 1;
    if st.cut.contains(&(from, to)) || (st.faulty && st.rng.chance(1, 20)) {
        st.lost += 1;
        return None;
    }
    let ms = if st.faulty && st.rng.chance(1, 10) {
        st.rng.range(100, 900)
    } else {
        st.rng.range(1, 15)
    };
    Some(Duration::from_millis(ms))
}

/// Node `to`'s side of one Raft RPC in its wire form: decoded as the
/// control plane's handler decodes it, answered with the JSON of the
/// receiver's `Result`.
async fn serve(raft: &Raft<TypeConfig>, request: &Request) -> Result<Vec<u8>, String> {
    let payload = ControlPayload::decode(request)
        .ok_or("not a control payload")?
        .map_err(|e| format!("undecodable: {e}"))?;
    let json = match payload {
        ControlPayload::AppendEntries(rpc) => serde_json::to_vec(&raft.append_entries(rpc).await),
        ControlPayload::Vote(rpc) => serde_json::to_vec(&raft.vote(rpc).await),
        ControlPayload::InstallSnapshot(rpc) => {
            serde_json::to_vec(&raft.install_snapshot(rpc).await)
        }
        ControlPayload::Propose(_) => return Err("not a raft rpc".into()),
    };
    json.map_err(|e| e.to_string())
}

/// Raft's network for node `me`.
#[derive(Clone)]
struct SimNet {
    me: usize,
    net: Net,
}

struct SimConn {
    from: usize,
    to: usize,
    target: NodeId,
    net: Net,
}

impl RaftNetworkFactory<TypeConfig> for SimNet {
    type Network = SimConn;

    async fn new_client(&mut self, target: NodeId, node: &RaftNode) -> SimConn {
        let to = node.id.trim_start_matches('n').parse().expect("sim node ids are n<k>");
        SimConn { from: self.me, to, target, net: self.net.clone() }
    }
}

fn network_error<E: std::error::Error>(text: &str) -> RPCError<NodeId, RaftNode, E> {
    RPCError::Network(NetworkError::new(&AnyError::error(text)))
}

impl SimConn {
    /// One round trip: the request and its answer each may be lost (the
    /// caller then waits out its deadline, as for a silent QUIC peer),
    /// delayed or duplicated (the copy is served later, its answer lost).
    async fn call<Resp, E>(&self, request: Request, ttl: Duration) -> Result<Resp, RpcErr<E>>
    where
        Resp: serde::de::DeserializeOwned,
        E: std::error::Error + serde::de::DeserializeOwned,
    {
        let deadline = Instant::now() + ttl;
        let silent = || async move {
            tokio::time::sleep_until(deadline).await;
            Err(network_error("timed out"))
        };
        let Some(delay) = fate(&self.net, self.from, self.to) else { return silent().await };
        let twice = {
            let mut st = lock(&self.net);
            let twice = st.faulty && st.rng.chance(1, 30);
            st.duplicated += u64::from(twice);
            twice.then(|| Duration::from_millis(st.rng.range(1, 400)))
        };
        if let Some(later) = twice {
            let (net, to, copy) = (self.net.clone(), self.to, request.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay + later).await;
                let raft = lock(&net).rafts[to].clone();
                if let Some(raft) = raft {
                    let _ = serve(&raft, &copy).await;
                }
            });
        }
        tokio::time::sleep(delay).await;
        if Instant::now() >= deadline {
            return Err(network_error("timed out"));
        }
        let raft = lock(&self.net).rafts[self.to].clone();
        let Some(raft) = raft else {
            // Nobody listens: the dial fails.
            tokio::time::sleep_until(deadline).await;
            return Err(RPCError::Unreachable(Unreachable::new(&AnyError::error("node down"))));
        };
        let reply = match tokio::time::timeout_at(deadline, serve(&raft, &request)).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => return Err(network_error(&e)),
            Err(_) => return Err(network_error("timed out")),
        };
        let Some(back) = fate(&self.net, self.to, self.from) else { return silent().await };
        tokio::time::sleep(back).await;
        if Instant::now() > deadline {
            return Err(network_error("timed out"));
        }
        let result: Result<Resp, RaftError<NodeId, E>> =
            serde_json::from_slice(&reply).map_err(|e| network_error(&e.to_string()))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for SimConn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr> {
        self.call(ControlPayload::AppendEntries(rpc).encode(), option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        self.call(ControlPayload::InstallSnapshot(rpc).encode(), option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr> {
        self.call(ControlPayload::Vote(rpc).encode(), option.hard_ttl()).await
    }
}

/// What a write came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Created, as this incarnation.
    Created(u64),
    /// Deleted this incarnation.
    Deleted(u64),
    /// Refused: the name existed.
    Exists,
    /// Refused: no such topic.
    NotFound,
}

/// An acknowledged write.
#[derive(Debug)]
struct Write {
    name: &'static str,
    end: Duration,
    index: u64,
    log_id: LogId,
    outcome: Outcome,
}

/// A confirmed view answered.
#[derive(Debug)]
struct View {
    node: usize,
    name: &'static str,
    start: Duration,
    answer: LeaderTopicView,
}

/// What the run observed, shared with its tasks.
#[derive(Default)]
struct History {
    writes: Vec<Write>,
    views: Vec<View>,
    /// Leaders seen per term (every node's every life).
    leaders: BTreeMap<u64, BTreeSet<usize>>,
    /// What was applied at each log index, by any node in any life: the
    /// entry's log id and what it did.
    applied: BTreeMap<u64, (LogId, String)>,
    /// Safety violations seen inside the nodes (checked after the run).
    violations: Vec<String>,
    /// Creates and deletes applied by any node: (name, incarnation).
    created: BTreeSet<(String, u64)>,
    deleted: BTreeSet<(String, u64)>,
    unacked_writes: u64,
}

/// One life of one node.
struct Node {
    raft: Raft<TypeConfig>,
    meta: Arc<MetaStore>,
    watcher: tokio::task::JoinHandle<()>,
}

/// The counts of a run, for replay checks and the summary.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Tally {
    writes_acked: u64,
    writes_unacked: u64,
    views: u64,
    terms: u64,
    /// Terms in which two nodes led, one after the other (openraft names a
    /// leader by term and node id).
    shared_terms: u64,
    crashes: u64,
    failed_starts: u64,
    /// Nodes wiped, refused by the first-start rule, bootstrapped by it.
    wipes: u64,
    wiped_refused: u64,
    wiped_bootstraps: u64,
    messages: u64,
    lost: u64,
    duplicated: u64,
    final_index: u64,
    /// FNV-1a of the final state's bytes.
    state_digest: u64,
}

struct Sim {
    seed: u64,
    n: usize,
    rng: SimRng,
    clock: ManualClock,
    disks: Vec<SimFs>,
    nodes: Vec<Option<Node>>,
    net: Net,
    history: Arc<Mutex<History>>,
    timings: RaftTimings,
    epoch: Instant,
    crashes: u64,
    failed_starts: u64,
    /// Nodes whose disk was wiped (everything gone) since their last life:
    /// their next start goes through the product's wiped-member check.
    wiped: Vec<bool>,
    /// Nodes the check refused: out of the group for the rest of the run
    /// (the operator brings the machine back under a new id).
    refused: Vec<bool>,
    wipes: u64,
    /// Wiped nodes that started anyway, no leader having answered.
    wiped_bootstraps: u64,
    trace: bool,
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

impl Sim {
    fn new(seed: u64, n: usize) -> Sim {
        let mut rng = SimRng::new(seed);
        let snapshots = seed % 4 == 1;
        let timings = RaftTimings {
            heartbeat: Duration::from_millis(50),
            election_min: Duration::from_millis(300),
            election_max: Duration::from_millis(600),
            snapshot_after_entries: if snapshots { 8 } else { 100_000 },
            entries_kept_after_snapshot: if snapshots { 2 } else { 1_000 },
        };
        let net = Arc::new(Mutex::new(NetState {
            rng: rng.fork(),
            rafts: vec![None; n],
            cut: HashSet::new(),
            faulty: true,
            messages: 0,
            lost: 0,
            duplicated: 0,
        }));
        Sim {
            seed,
            n,
            rng,
            clock: ManualClock::new(1_700_000_000_000),
            disks: (0..n as u64).map(|i| SimFs::new(seed * 31 + i)).collect(),
            nodes: (0..n).map(|_| None).collect(),
            net,
            history: Arc::default(),
            timings,
            epoch: Instant::now(),
            crashes: 0,
            failed_starts: 0,
            wiped: vec![false; n],
            refused: vec![false; n],
            wipes: 0,
            wiped_bootstraps: 0,
            trace: std::env::var("NARAD_SIM_TRACE").is_ok_and(|v| v == "1"),
        }
    }

    fn now(&self) -> Duration {
        Instant::now() - self.epoch
    }

    fn trace(&self, what: std::fmt::Arguments<'_>) {
        if self.trace {
            eprintln!("seed {} t={:?} {what}", self.seed, self.now());
        }
    }

    /// Starts node `i` on what its disk holds; the first start of each
    /// node initialises the group with every node as a voter.
    async fn start(&mut self, i: usize, first: bool) -> Result<(), String> {
        let fs = self.disks[i].shared();
        let data = Path::new("/data");
        // Set once this life's Raft core quit on a storage error: the
        // product's control plane is then stopped (not ready, writes 503)
        // and applies nothing more until the process restarts.
        let stopped = Arc::new(AtomicBool::new(false));
        let stopped_at_apply = stopped.clone();
        let meta = Arc::new(
            MetaStore::open(
                &*fs,
                data,
                MetaStoreOptions {
                    defaults: TopicDefaults::default(),
                    clock: Arc::new(self.clock.clone()),
                    rng_seed: Some(self.seed),
                },
            )
            .map_err(|e| format!("metastore: {e}"))?,
        );
        let (history, weak) = (self.history.clone(), Arc::downgrade(&meta));
        meta.on_applied(Arc::new(move |_c: &Command, r: &Response| {
            let mut h = lock(&history);
            if stopped_at_apply.load(Ordering::SeqCst) {
                h.violations.push(format!(
                    "node {i} applied {r:?} after its Raft stopped on a storage error"
                ));
            }
            let did = match r {
                Response::Topic(t) => {
                    h.created.insert((t.name().to_owned(), t.incarnation()));
                    format!("created {}@{}", t.name(), t.incarnation())
                }
                Response::TopicDeleted(t) => {
                    h.deleted.insert((t.name().to_owned(), t.incarnation()));
                    format!("deleted {}@{}", t.name(), t.incarnation())
                }
                other => format!("{other:?}"),
            };
            // The entry's log id was stored with its effects just before.
            let log_id = weak
                .upgrade()
                .and_then(|m| m.raft_state())
                .and_then(|b| AppliedState::decode(&b).ok())
                .and_then(|a| a.last_applied);
            let Some(log_id) = log_id else {
                h.violations.push(format!("node {i} applied {did} with no log id stored"));
                return;
            };
            let before = h.applied.insert(log_id.index, (log_id, did.clone()));
            if let Some(before) = before.filter(|b| *b != (log_id, did.clone())) {
                h.violations.push(format!(
                    "node {i} applied {log_id} ({did}) at index {} where {} ({}) was applied before",
                    log_id.index, before.0, before.1
                ));
            }
        }));
        let sm = StateMachine::new(meta.clone(), fs.clone(), RaftMetrics::default());
        let mut log = LogStore::<TypeConfig>::open(&*fs, data)
            .map_err(|e| format!("raft log: {e}"))?
            .with_purge_floor(sm.purge_floor());
        // A node restarted with its own committed vote leads again without
        // an election (openraft restores it); entries committed since it
        // was elected, before the restart, need not be in its log.
        let resumed = log.read_vote().await.map_err(|e| format!("raft log: {e}"))?;
        // Each life draws its own election timeout from the seed; openraft
        // draws within [min, max), here one value.
        let min = self.rng.range(250, 700);
        let timings = RaftTimings {
            election_min: Duration::from_millis(min),
            election_max: Duration::from_millis(min + 1),
            ..self.timings.clone()
        };
        let config = Arc::new(timings.raft_config().map_err(|e| e.to_string())?);
        let raft = Raft::new(
            raft_id(&node_name(i)),
            config,
            SimNet { me: i, net: self.net.clone() },
            log,
            sm,
        )
        .await
        .map_err(|e| format!("raft: {e}"))?;
        if first {
            let voters: BTreeMap<NodeId, RaftNode> = (0..self.n)
                .map(|k| {
                    let node = RaftNode {
                        id: node_name(k),
                        cluster_addr: format!("10.0.0.{}:7943", k + 1),
                        http_addr: String::new(),
                    };
                    (raft_id(&node.id), node)
                })
                .collect();
            raft.initialize(voters).await.map_err(|e| format!("initialize: {e}"))?;
        }
        let (mut rx, history) = (raft.metrics(), self.history.clone());
        let (trace, seed, epoch) = (self.trace, self.seed, self.epoch);
        let watcher = tokio::spawn(async move {
            loop {
                {
                    let m = rx.borrow_and_update();
                    if m.running_state.is_err() {
                        stopped.store(true, Ordering::SeqCst);
                    }
                    let mut h = lock(&history);
                    if m.state == ServerState::Leader
                        && h.leaders.entry(m.current_term).or_default().insert(i)
                    {
                        // Leader completeness: a node just elected holds
                        // every entry acknowledged in an earlier term.
                        let last = m.last_log_index.unwrap_or(0);
                        let elected = resumed != Some(m.vote);
                        let missing = h.writes.iter().find(|w| {
                            elected && w.log_id.leader_id.term < m.current_term && w.index > last
                        });
                        if let Some(w) = missing {
                            let v = format!(
                                "node {i} leads term {} with its log ending at {last}, without {w:?}",
                                m.current_term
                            );
                            h.violations.push(v);
                        }
                    }
                    drop(h);
                    if m.state == ServerState::Leader && trace {
                        eprintln!(
                            "seed {seed} t={:?} node {i} leads term {} (vote {}, last log {:?})",
                            Instant::now() - epoch,
                            m.current_term,
                            m.vote,
                            m.last_log_index
                        );
                    }
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
        lock(&self.net).rafts[i] = Some(raft.clone());
        self.nodes[i] = Some(Node { raft, meta, watcher });
        Ok(())
    }

    /// Node `i` loses power.
    async fn crash(&mut self, i: usize) {
        let Some(node) = self.nodes[i].take() else { return };
        lock(&self.net).rafts[i] = None;
        let _ = node.raft.shutdown().await;
        node.watcher.abort();
        let mode = match self.rng.below(3) {
            0 => CrashMode::DropUnsynced,
            1 => CrashMode::Torn,
            _ => CrashMode::TornWithHoles,
        };
        self.disks[i].crash(mode);
        self.crashes += 1;
        self.trace(format_args!("node {i} lost power ({mode:?})"));
    }

    async fn restart(&mut self, i: usize) {
        if self.nodes[i].is_some() || self.refused[i] {
            return;
        }
        let mut bootstrap = false;
        if self.wiped[i] {
            // The product's rule itself (`first_start::decide`) on what
            // the peers answer across the simulated network.
            let answers = self.probe_group(i);
            match first_start::decide(self.n, &answers) {
                FirstStart::Refuse { by } => {
                    // The product stops with an error: the node is out
                    // for good under this id.
                    self.refused[i] = true;
                    self.trace(format_args!("node {i} (wiped) refused: {by} knows it"));
                    return;
                }
                FirstStart::Wait(why) => {
                    self.trace(format_args!("node {i} (wiped) waits: {why}"));
                    return;
                }
                // The sim removes no member, and its peers never say
                // `in_group`: a wiped node is always known or a voter.
                FirstStart::Join => {
                    self.trace(format_args!("node {i} (wiped) would join: waits"));
                    return;
                }
                FirstStart::Bootstrap => {
                    bootstrap = true;
                    self.wiped_bootstraps += 1;
                }
            }
        }
        let r = self.start(i, bootstrap).await;
        if r.is_ok() {
            self.wiped[i] = false;
        }
        self.trace(format_args!("node {i} started: {:?}", r.as_ref().err()));
        if r.is_err() {
            self.failed_starts += 1;
        }
    }

    /// ProbeGroup (op 39) from node `i`, with no Raft state, to every
    /// peer: a peer answers when it runs and both directions of the link
    /// deliver (cut links and losses are no answer), with what the
    /// product's `ControlPlane::probe_view` reads: its last log index,
    /// whether it leads, and whether its state knows `i` as a member. The
    /// product knows a member by its metastore member record (the node
    /// heartbeated) or, on the leader, by entries `i` acknowledged; the
    /// simulated group has no heartbeats and every node here is one of the
    /// group's voters that ran from the start, so the peer's Raft
    /// membership stands for the record.
    fn probe_group(&mut self, i: usize) -> Vec<first_start::Probed> {
        let id = raft_id(&node_name(i));
        (0..self.n)
            .filter(|&k| k != i)
            .map(|k| {
                let answer = match self.nodes[k].as_ref() {
                    Some(node)
                        if fate(&self.net, i, k).is_some() && fate(&self.net, k, i).is_some() =>
                    {
                        let m = node.raft.metrics().borrow().clone();
                        PeerAnswer::View(PeerView {
                            log_end: m.last_log_index,
                            leader: m.state == ServerState::Leader,
                            knows_member: m.membership_config.membership().get_node(&id).is_some(),
                            in_group: None,
                        })
                    }
                    _ => PeerAnswer::Silent,
                };
                first_start::Probed { id: node_name(k), voter: true, answer }
            })
            .collect()
    }

    /// Node `i` loses power and its data directory is wiped (a replaced
    /// disk, an operator's `rm -rf`): everything it stored is gone.
    async fn wipe(&mut self, i: usize) {
        self.crash(i).await;
        self.disks[i] = SimFs::new(self.seed * 31 + 1_000 + i as u64);
        self.wiped[i] = true;
        self.wipes += 1;
        self.trace(format_args!("node {i} wiped"));
    }

    /// A node whose Raft stopped on a storage error is down: its disk's
    /// unsynced bytes are gone as in a crash, and it waits for a restart.
    async fn reap(&mut self) {
        for i in 0..self.n {
            let stopped = self.nodes[i].as_ref().is_some_and(|n| {
                let m = n.raft.metrics().borrow().clone();
                m.running_state.is_err() || m.state == ServerState::Shutdown
            });
            if stopped {
                self.trace(format_args!("node {i} stopped on a storage error"));
                self.crash(i).await;
            }
        }
    }

    /// A create or delete of a name, proposed at the node node `i` believes
    /// leads; recorded when acknowledged.
    fn write(&mut self, i: usize) {
        let Some(node) = self.nodes[i].as_ref() else { return };
        let leader = node.raft.metrics().borrow().current_leader;
        let target = (0..self.n).find(|&k| Some(raft_id(&node_name(k))) == leader).unwrap_or(i);
        let Some(raft) = self.nodes[target].as_ref().map(|n| n.raft.clone()) else { return };
        let name = NAMES[self.rng.below(NAMES.len() as u64) as usize];
        let command = if self.rng.chance(1, 2) {
            let request =
                CreateTopicRequest { name: name.into(), partitions: 3, ..Default::default() };
            let c = request
                .resolve(&TopicDefaults::default(), &MetaState::default(), 1_700_000_000_000, 1)
                .expect("a valid create");
            Command::CreateTopic(c)
        } else {
            Command::DeleteTopic(DeleteTopic { name: name.to_owned() })
        };
        let (history, epoch) = (self.history.clone(), self.epoch);
        tokio::spawn(async move {
            let r = tokio::time::timeout(Duration::from_secs(5), raft.client_write(command)).await;
            let mut h = lock(&history);
            let Ok(Ok(r)) = r else {
                h.unacked_writes += 1;
                return;
            };
            let outcome = match r.data.into_result() {
                Ok(Response::Topic(t)) => Outcome::Created(t.incarnation()),
                Ok(Response::TopicDeleted(t)) => Outcome::Deleted(t.incarnation()),
                Err(e) if e.status() == 409 => Outcome::Exists,
                Err(e) if e.status() == 404 => Outcome::NotFound,
                other => panic!("a topic write answered {other:?}"),
            };
            let end = Instant::now() - epoch;
            h.writes.push(Write { name, end, index: r.log_id.index, log_id: r.log_id, outcome });
        });
    }

    /// A confirmed view of a name, asked of the node node `i` believes
    /// leads (as a cluster node asks GetTopic of its leader), if that node
    /// believes it leads too.
    fn view(&mut self, i: usize) {
        let Some(node) = self.nodes[i].as_ref() else { return };
        let leader = node.raft.metrics().borrow().current_leader;
        let i = (0..self.n).find(|&k| Some(raft_id(&node_name(k))) == leader).unwrap_or(i);
        let Some(node) = self.nodes[i].as_ref() else { return };
        if node.raft.metrics().borrow().state != ServerState::Leader {
            return;
        }
        let (raft, meta) = (node.raft.clone(), node.meta.clone());
        let name = NAMES[self.rng.below(NAMES.len() as u64) as usize];
        let (history, start) = (self.history.clone(), self.now());
        tokio::spawn(async move {
            if let Ok(answer) = confirmed_view(&raft, &meta, name).await {
                lock(&history).views.push(View { node: i, name, start, answer });
            }
        });
    }

    fn flap(&mut self) {
        let a = self.rng.below(self.n as u64) as usize;
        let b = (a + 1 + self.rng.below(self.n as u64 - 1) as usize) % self.n;
        let what = self.rng.below(5);
        let mut st = lock(&self.net);
        match what {
            0 => {
                st.cut.insert((a, b));
                st.cut.insert((b, a));
            }
            1 => {
                st.cut.insert((a, b));
            }
            2 => {
                // Node a cut off from everyone.
                for k in 0..self.n {
                    if k != a {
                        st.cut.insert((a, k));
                        st.cut.insert((k, a));
                    }
                }
            }
            3 => {
                st.cut.remove(&(a, b));
                st.cut.remove(&(b, a));
            }
            _ => st.cut.clear(),
        }
    }

    async fn step(&mut self) {
        tokio::time::sleep(Duration::from_millis(self.rng.range(1, 60))).await;
        self.clock.advance(Duration::from_millis(10));
        self.reap().await;
        let i = self.rng.below(self.n as u64) as usize;
        match self.rng.below(100) {
            0..=29 => self.write(i),
            30..=49 => self.view(i),
            50..=54 => self.flap(),
            55..=56 => self.crash(i).await,
            57..=64 => self.restart(i).await,
            // A wipe in a fifth of the seeds, at most one node per run (the
            // refused one is gone for good: a majority must stay).
            66 if self.seed % 5 == 3 && self.wipes == 0 => self.wipe(i).await,
            65 => {
                let kind = match self.rng.below(3) {
                    0 => FaultKind::SyncError,
                    1 => FaultKind::WriteError,
                    _ => FaultKind::NoSpace,
                };
                let at = self.disks[i].op_count() + self.rng.below(40);
                self.disks[i].inject(at, kind);
                self.trace(format_args!("node {i}: {kind:?} armed at disk op {at}"));
            }
            _ => {}
        }
    }

    /// Heals every link, restarts every node (a power cycle disarms the
    /// faults not spent yet) and waits for one leader and every node to
    /// have applied the leader's whole log.
    async fn settle(&mut self) -> u64 {
        {
            let mut st = lock(&self.net);
            st.faulty = false;
            st.cut.clear();
        }
        for i in 0..self.n {
            // A wiped node starts in the loop below, through the check.
            if self.nodes[i].is_none() && !self.wiped[i] && !self.refused[i] {
                self.disks[i].crash(CrashMode::DropUnsynced);
                let mut started = self.start(i, false).await;
                for _ in 0..3 {
                    if started.is_ok() {
                        break;
                    }
                    self.disks[i].crash(CrashMode::DropUnsynced);
                    started = self.start(i, false).await;
                }
                if let Err(e) = started {
                    panic!("seed {}: node {i} never started again: {e}", self.seed);
                }
            }
        }
        // Faults armed on running nodes are spent or disarmed by a power
        // cycle of every node that stopped on one.
        for _ in 0..1_200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.reap().await;
            for i in 0..self.n {
                if self.nodes[i].is_none() && !self.refused[i] {
                    self.disks[i].crash(CrashMode::DropUnsynced);
                    self.restart(i).await;
                }
            }
            let metrics: Vec<_> = self
                .nodes
                .iter()
                .map(|n| n.as_ref().map(|n| n.raft.metrics().borrow().clone()))
                .collect();
            let Some(Some(leader)) =
                metrics.iter().find(|m| m.as_ref().is_some_and(|m| m.state == ServerState::Leader))
            else {
                continue;
            };
            let Some(last) = leader.last_log_index else { continue };
            let in_term =
                leader.last_applied.is_some_and(|l| l.leader_id.term == leader.current_term);
            if in_term
                && metrics.iter().enumerate().all(|(k, m)| {
                    self.refused[k]
                        || m.as_ref().is_some_and(|m| {
                            m.last_applied.map(|l| l.index) == Some(last)
                                && m.current_leader == leader.current_leader
                        })
                })
            {
                return last;
            }
        }
        let state: Vec<String> = self
            .nodes
            .iter()
            .map(|n| match n {
                Some(n) => {
                    let m = n.raft.metrics().borrow().clone();
                    format!(
                        "{:?} term {} leader {:?} last {:?} applied {:?}",
                        m.state, m.current_term, m.current_leader, m.last_log_index, m.last_applied
                    )
                }
                None => "down".into(),
            })
            .collect();
        panic!("seed {}: the group never settled: {state:#?}", self.seed);
    }

    fn check(&self, final_index: u64) -> Tally {
        let seed = self.seed;
        let live: Vec<&Node> = self.nodes.iter().flatten().collect();
        assert_eq!(
            live.len() + self.refused.iter().filter(|r| **r).count(),
            self.n,
            "seed {seed}: a node is down after settling"
        );
        let exports: Vec<Vec<u8>> =
            live.iter().map(|n| n.meta.export_snapshot().expect("export")).collect();
        for (i, e) in exports.iter().enumerate() {
            assert!(
                *e == exports[0],
                "seed {seed}: node {i}'s state differs from node 0's after applying the same log"
            );
        }
        let final_state = live[0].meta.snapshot();
        let h = lock(&self.history);
        assert!(h.violations.is_empty(), "seed {seed}: {:#?}", h.violations);
        for w in &h.writes {
            let live = final_state.topic(w.name).map(|t| t.incarnation());
            match w.outcome {
                Outcome::Created(inc) => {
                    let key = (w.name.to_owned(), inc);
                    assert!(
                        h.created.contains(&key),
                        "seed {seed}: acknowledged create {key:?} was never applied"
                    );
                    assert!(
                        live == Some(inc) || h.deleted.contains(&key),
                        "seed {seed}: acknowledged create {key:?} is neither live nor deleted \
                         (live: {live:?})"
                    );
                }
                Outcome::Deleted(inc) => {
                    let key = (w.name.to_owned(), inc);
                    assert!(
                        h.deleted.contains(&key) && live != Some(inc),
                        "seed {seed}: acknowledged delete {key:?} did not stick (live: {live:?})"
                    );
                }
                Outcome::Exists | Outcome::NotFound => {}
            }
            assert!(w.index <= final_index, "seed {seed}: {w:?} is past the final log");
            if matches!(w.outcome, Outcome::Created(_) | Outcome::Deleted(_)) {
                let applied = h.applied.get(&w.index).map(|a| a.0);
                assert_eq!(
                    applied,
                    Some(w.log_id),
                    "seed {seed}: acknowledged {w:?} was replaced at its index"
                );
            }
        }
        for v in &h.views {
            let before = h.writes.iter().filter(|w| w.name == v.name && w.end < v.start);
            match v.answer {
                LeaderTopicView::Present { incarnation } => {
                    let key = (v.name.to_owned(), incarnation);
                    assert!(
                        h.created.contains(&key),
                        "seed {seed}: {v:?} names an incarnation never created"
                    );
                    for w in before {
                        let stale = match w.outcome {
                            Outcome::Deleted(inc) => inc == incarnation,
                            Outcome::Created(inc) => inc > incarnation,
                            // Incarnations count applied commands, not
                            // Raft entries: a refusal's place is unknown.
                            Outcome::NotFound | Outcome::Exists => false,
                        };
                        assert!(
                            !stale,
                            "seed {seed}: stale confirmed view of node {}: {v:?}: {w:?} was acknowledged before it was asked",
                            v.node
                        );
                    }
                }
                LeaderTopicView::Absent => {
                    for w in before {
                        if let Outcome::Created(inc) = w.outcome {
                            assert!(
                                h.deleted.contains(&(v.name.to_owned(), inc)),
                                "seed {seed}: stale confirmed view of node {}: {v:?}: {w:?} was \
                                 acknowledged before it was asked and never deleted",
                                v.node
                            );
                        }
                    }
                }
            }
        }
        let st = lock(&self.net);
        Tally {
            writes_acked: h.writes.len() as u64,
            writes_unacked: h.unacked_writes,
            views: h.views.len() as u64,
            terms: h.leaders.len() as u64,
            shared_terms: h.leaders.values().filter(|l| l.len() > 1).count() as u64,
            crashes: self.crashes,
            failed_starts: self.failed_starts,
            wipes: self.wipes,
            wiped_refused: self.refused.iter().filter(|r| **r).count() as u64,
            wiped_bootstraps: self.wiped_bootstraps,
            messages: st.messages,
            lost: st.lost,
            duplicated: st.duplicated,
            final_index,
            state_digest: fnv(&exports[0]),
        }
    }

    async fn shutdown(self) {
        for node in self.nodes.into_iter().flatten() {
            let _ = node.raft.shutdown().await;
            node.watcher.abort();
        }
    }
}

/// One run of `n` nodes.
fn run_seed(seed: u64, n: usize) -> Tally {
    if let Ok(filter) = std::env::var("NARAD_SIM_LOG") {
        // The nodes' own logs (openraft's included), e.g. `openraft=debug`.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut sim = Sim::new(seed, n);
        for i in 0..n {
            sim.start(i, true).await.unwrap_or_else(|e| panic!("seed {seed}: start {i}: {e}"));
        }
        for _ in 0..STEPS {
            sim.step().await;
        }
        let last = sim.settle().await;
        // Writes and views still in flight end before the check.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let tally = sim.check(last);
        sim.shutdown().await;
        tally
    })
}

fn nodes_of(seed: u64) -> usize {
    if seed % 3 == 2 { 5 } else { 3 }
}

fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("NARAD_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![s];
    }
    let n: u64 = std::env::var("NARAD_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
    // `NARAD_SEED_FROM=F`: seeds F..F+N (a long soak run in slices).
    let from: u64 = std::env::var("NARAD_SEED_FROM").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    (from..from + n).collect()
}

#[test]
fn the_simulated_metastore_group_never_loses_or_replaces_an_acknowledged_write_and_never_confirms_from_a_stale_view()
 {
    let started = std::time::Instant::now();
    let seeds = seeds();
    let mut total = Tally::default();
    for &seed in &seeds {
        let t = run_seed(seed, nodes_of(seed));
        total.writes_acked += t.writes_acked;
        total.writes_unacked += t.writes_unacked;
        total.views += t.views;
        total.terms += t.terms;
        total.shared_terms += t.shared_terms;
        total.crashes += t.crashes;
        total.failed_starts += t.failed_starts;
        total.wipes += t.wipes;
        total.wiped_refused += t.wiped_refused;
        total.wiped_bootstraps += t.wiped_bootstraps;
        total.messages += t.messages;
        total.lost += t.lost;
        total.duplicated += t.duplicated;
    }
    eprintln!(
        "metastore simulation: {} seeds in {:.1?}: {} writes acknowledged ({} not), {} confirmed \
         views, {} terms with a leader ({} led by two nodes in turn), {} crashes ({} starts failed on a disk fault), {} nodes wiped ({} refused \
         at restart, {} bootstrapped by the first-start rule), {} messages ({} lost, {} duplicated)",
        seeds.len(),
        started.elapsed(),
        total.writes_acked,
        total.writes_unacked,
        total.views,
        total.terms,
        total.shared_terms,
        total.crashes,
        total.failed_starts,
        total.wipes,
        total.wiped_refused,
        total.wiped_bootstraps,
        total.messages,
        total.lost,
        total.duplicated
    );
    assert!(total.writes_acked > 0 && total.views > 0 && total.crashes > 0, "{total:?}");
}

#[test]
fn a_seed_of_the_metastore_simulation_replays_the_same_run() {
    assert_eq!(run_seed(5, 3), run_seed(5, 3));
    assert_eq!(run_seed(8, 5), run_seed(8, 5));
}

/// What one run of the membership simulation counted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct MemberTally {
    beats: u64,
    lost_beats: u64,
    deaths: u64,
    /// Deaths of a node dead for good, and the longest time it took (ms
    /// after its last heartbeat landed or the leader's first look).
    final_deaths: u64,
    slowest_final_death_ms: u64,
    leader_changes: u64,
    clock_steps: u64,
    /// Beats that landed with a value their member had sent before.
    same_value_beats: u64,
}

/// Dead-marking under skewed clocks (issue 35), one seed: `n` members
/// heartbeat ([`HEARTBEAT_INTERVAL`], each at its own phase) with their own
/// wall clock, skewed by up to ±100 s from the seed (and, in half the
/// seeds, one clock stepped by up to ±60 s mid-run); heartbeats are lost
/// (1 in 10) or land late (up to 3 s). The leader runs the product's
/// controller tick every [`CONTROLLER_INTERVAL`]: [`HeartbeatAges`] on its
/// own monotonic clock (an offset of its own) and [`plan_with`], applying
/// the planned `MemberDead`s with [`narad_meta::apply`] (refused when a
/// beat landed since the plan). Leadership moves now and then (the new
/// leader starts with no ages). Members pause (stop beating 5-60 s, then
/// beat again) and, in half the seeds, one dies for good. In real
/// (simulated) time, with second steps:
/// * a member is marked dead only after real silence: more than
///   [`MEMBER_DEAD_AFTER`] since its last heartbeat landed (a live member
///   beating is never marked dead, whatever its clock);
/// * a member dead for good is marked dead within [`MEMBER_DEAD_AFTER`] +
///   2 × [`CONTROLLER_INTERVAL`] of the later of its last heartbeat's
///   landing and the current leader's start.
fn run_membership_seed(seed: u64, n: usize) -> MemberTally {
    const START_S: i64 = 1_700_000_000;
    const SECS: u64 = 900;
    let mut rng = SimRng::new(seed ^ 0x6d65_6d62);
    let mut tally = MemberTally::default();
    let skew: Vec<i64> = (0..n).map(|_| rng.range(0, 201) as i64 - 100).collect();
    let phase: Vec<u64> = (0..n).map(|_| rng.below(5)).collect();
    let step_at = rng.chance(1, 2).then(|| (rng.below(n as u64) as usize, rng.range(60, 800)));
    let mut step = vec![0i64; n];
    let dies = rng.chance(1, 2).then(|| (rng.below(n as u64) as usize, rng.range(60, 600)));
    let mut paused_until = vec![0u64; n];
    let mut state = MetaState::default();
    let mut index = 0u64;
    let mut apply = |state: &mut MetaState, c: &Command| -> bool {
        index += 1;
        match narad_meta::apply(state, index, c) {
            Ok(a) => {
                *state = a.state;
                true
            }
            Err(_) => false,
        }
    };
    // Heartbeats in flight: (lands at, member, value).
    let mut flight: Vec<(u64, usize, i64)> = Vec::new();
    let mut last_landed = vec![0u64; n];
    // The values that landed, per member.
    let mut sent: Vec<HashSet<i64>> = vec![HashSet::new(); n];
    let mut last_sent: Vec<Option<i64>> = vec![None; n];
    // When each member's record last changed value (any beat, new or not):
    // the leader's ages may restart from there.
    let mut last_change = vec![0u64; n];
    let mut ages = HeartbeatAges::default();
    let (mut leader_since, mut mono_offset, mut tick_phase) = (0u64, rng.range(0, 10_000), 0u64);
    for t in 0..SECS {
        if let Some((k, at)) = step_at
            && t == at
        {
            step[k] = rng.range(0, 121) as i64 - 60;
            tally.clock_steps += 1;
        }
        for k in 0..n {
            let dead = dies.is_some_and(|(d, at)| d == k && t >= at);
            if dead || t < paused_until[k] {
                continue;
            }
            if t > 0 && rng.chance(1, 400) {
                paused_until[k] = t + rng.range(5, 61);
                continue;
            }
            if t % HEARTBEAT_INTERVAL.as_secs() == phase[k] || t == 0 {
                tally.beats += 1;
                if t > 0 && rng.chance(1, 10) {
                    tally.lost_beats += 1;
                } else {
                    let wall = START_S + t as i64 + skew[k] + step[k];
                    // The product's sender: never a value it sent before.
                    let value = beat_value(wall, last_sent[k]);
                    last_sent[k] = Some(value);
                    flight.push((t + rng.below(4), k, value));
                }
            }
        }
        let (landing, later): (Vec<_>, Vec<_>) = flight.drain(..).partition(|f| f.0 <= t);
        flight = later;
        for (_, k, wall) in landing {
            let member = Member {
                id: node_name(k),
                addr: format!("10.0.0.{}:7942", k + 1),
                cluster_addr: None,
                status: narad_meta::MemberStatus::Alive,
                last_heartbeat: wall,
                draining: false,
            };
            // A beat repeating a value its member sent before would look
            // like no change to the leader, which compares values at its
            // ticks only (seeds 3601 and 13789 before `beat_value`,
            // docs/DURABILITY.md): not counted as a beat, and counted.
            let same = !sent[k].insert(wall);
            if state.member(&node_name(k)).is_none_or(|m| m.last_heartbeat != wall) {
                last_change[k] = t;
            }
            if apply(&mut state, &Command::MemberJoin(narad_meta::MemberJoin { member })) {
                if same {
                    tally.same_value_beats += 1;
                } else {
                    last_landed[k] = t;
                }
            }
        }
        if t > 0 && rng.chance(1, 120) {
            // A new leader: its own monotonic clock, no ages, its own tick.
            ages = HeartbeatAges::default();
            leader_since = t;
            mono_offset = rng.range(0, 10_000);
            tick_phase = rng.below(CONTROLLER_INTERVAL.as_secs());
            tally.leader_changes += 1;
        }
        if t % CONTROLLER_INTERVAL.as_secs() == tick_phase {
            let mono = Duration::from_secs(t + mono_offset);
            ages.observe(&state, mono);
            let plan = plan_with(&state, &|m: &Member| ages.overdue(m, mono));
            for c in plan {
                let Command::MemberDead(d) = &c else { continue };
                let k: usize = d.id.trim_start_matches('n').parse().expect("n<k>");
                if !apply(&mut state, &c) {
                    continue;
                }
                tally.deaths += 1;
                let silent = t - last_landed[k];
                assert!(
                    silent > MEMBER_DEAD_AFTER.as_secs(),
                    "seed {seed}: member {k} (clock skew {}s, step {}s) marked dead at t={t}s \
                     after {silent}s of real silence",
                    skew[k],
                    step[k]
                );
                if dies.is_some_and(|(d, _)| d == k) {
                    let from = last_change[k].max(leader_since);
                    tally.final_deaths += 1;
                    tally.slowest_final_death_ms =
                        tally.slowest_final_death_ms.max((t - from) * 1_000);
                }
            }
        }
        if let Some((d, at)) = dies
            && t >= at
            && flight.iter().all(|f| f.1 != d)
        {
            let from = last_change[d].max(leader_since);
            let alive = state
                .member(&node_name(d))
                .is_some_and(|m| m.status == narad_meta::MemberStatus::Alive);
            let bound = MEMBER_DEAD_AFTER.as_secs() + 2 * CONTROLLER_INTERVAL.as_secs();
            assert!(
                !(alive && t > from + bound),
                "seed {seed}: member {d} (clock skew {}s, step {}s), dead for good since its \
                 last heartbeat landed at t={}s, still alive at t={t}s (leader since {leader_since}s)",
                skew[d],
                step[d],
                last_landed[d]
            );
        }
    }
    tally
}

#[test]
fn dead_marking_follows_real_silence_whatever_the_members_clocks() {
    let started = std::time::Instant::now();
    let seeds = seeds();
    let mut total = MemberTally::default();
    for &seed in &seeds {
        let t = run_membership_seed(seed, nodes_of(seed));
        total.beats += t.beats;
        total.lost_beats += t.lost_beats;
        total.deaths += t.deaths;
        total.final_deaths += t.final_deaths;
        total.slowest_final_death_ms = total.slowest_final_death_ms.max(t.slowest_final_death_ms);
        total.leader_changes += t.leader_changes;
        total.clock_steps += t.clock_steps;
        total.same_value_beats += t.same_value_beats;
    }
    eprintln!(
        "membership simulation (skewed clocks): {} seeds in {:.1?}: {} heartbeats ({} lost), {} \
         members marked dead ({} dead for good, the slowest {} ms after its last beat or the \
         leader's start), {} leader changes, {} clock steps ({} beats repeated an earlier value)",
        seeds.len(),
        started.elapsed(),
        total.beats,
        total.lost_beats,
        total.deaths,
        total.final_deaths,
        total.slowest_final_death_ms,
        total.leader_changes,
        total.clock_steps,
        total.same_value_beats
    );
    assert!(total.deaths > 0 && total.final_deaths > 0, "{total:?}");
    assert_eq!(total.same_value_beats, 0, "a sender repeated a heartbeat value: {total:?}");
}
