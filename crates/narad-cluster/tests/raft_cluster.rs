//! The replicated metastore in one process: control planes over real QUIC
//! on loopback, each node with its own MetaStore and Raft log in a temp
//! directory on the real file system. Fast Raft timings (heartbeat 50 ms,
//! election 300-600 ms); every wait is bounded.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use narad_clock::ManualClock;
use narad_cluster::raft::{ControlPlane, ControlPlaneConfig, PeerEntry, RaftTimings, Role};
use narad_cluster::{ClusterAuth, Handler, PeerIdentity, Reply, Request, RpcMetrics, Transport};
use narad_fs::RealFs;
use narad_meta::{CreateTopicRequest, MetaError, MetaStore, MetaStoreOptions, TopicDefaults};
use prometheus_client::registry::Registry;

/// Passes the control plane's ops to the node's current control plane
/// (none while the node is stopped: every request then gets a 503).
#[derive(Default)]
struct Serve {
    plane: RwLock<Option<Arc<ControlPlane>>>,
}

impl Serve {
    fn set(&self, plane: Option<Arc<ControlPlane>>) {
        *self.plane.write().unwrap() = plane;
    }
}

impl Handler for Serve {
    async fn handle(&self, from: Arc<PeerIdentity>, request: Request) -> Reply {
        let plane = self.plane.read().unwrap().clone();
        let Some(plane) = plane else {
            return Reply::error(503, "node stopped");
        };
        match plane.handle(&from, &request).await {
            Some(reply) => reply,
            None => Reply::error(400, &format!("unsupported rpc operation {}", request.op() as u8)),
        }
    }
}

struct Node {
    id: String,
    meta: Arc<MetaStore>,
    plane: Arc<ControlPlane>,
}

/// A temp directory removed on drop.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Cluster {
    root: Dir,
    peers: Vec<PeerEntry>,
    initial: Vec<String>,
    timings: RaftTimings,
    nodes: Vec<Option<Node>>,
    /// Each node's endpoint, kept across a stop and restart of the node
    /// (rebinding a port quinn still drains is not possible at once).
    endpoints: Vec<Option<(Arc<Transport>, Arc<Serve>)>>,
}

fn fast() -> RaftTimings {
    RaftTimings {
        heartbeat: Duration::from_millis(50),
        election_min: Duration::from_millis(300),
        election_max: Duration::from_millis(600),
        ..RaftTimings::default()
    }
}

fn free_udp_port() -> SocketAddr {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap()
}

fn options() -> MetaStoreOptions {
    MetaStoreOptions {
        defaults: TopicDefaults::default(),
        clock: Arc::new(ManualClock::new(1_700_000_000_000)),
        rng_seed: Some(1),
    }
}

impl Cluster {
    /// `n` peers "n1".."n<n>"; `initial` bootstrap (empty: all).
    fn new(name: &str, n: usize, initial: &[&str], timings: RaftTimings) -> Cluster {
        let root = std::env::temp_dir().join(format!("narad-raft-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let peers =
            (1..=n).map(|i| PeerEntry { id: format!("n{i}"), addr: free_udp_port() }).collect();
        Cluster {
            root: Dir(root),
            peers,
            initial: initial.iter().map(|s| s.to_string()).collect(),
            timings,
            nodes: (0..n).map(|_| None).collect(),
            endpoints: (0..n).map(|_| None).collect(),
        }
    }

    async fn start(&mut self, i: usize) {
        let peer = self.peers[i].clone();
        let dir = self.root.0.join(&peer.id);
        let fs = RealFs::shared();
        let meta = Arc::new(MetaStore::open(&*fs, &dir, options()).unwrap());
        let (transport, serve) = self.endpoints[i]
            .get_or_insert_with(|| {
                let serve = Arc::new(Serve::default());
                let t = Transport::serve(
                    peer.addr,
                    ClusterAuth { node_id: peer.id.clone(), ..ClusterAuth::default() },
                    RpcMetrics::default(),
                    serve.clone(),
                )
                .unwrap();
                (Arc::new(t), serve)
            })
            .clone();
        let cfg = ControlPlaneConfig {
            node_id: peer.id.clone(),
            cluster_addr: peer.addr,
            http_addr: format!("127.0.0.1:{}", 9000 + i),
            peers: self.peers.clone(),
            initial_members: self.initial.clone(),
            data_dir: dir,
            fs,
            timings: self.timings.clone(),
        };
        let mut registry = Registry::with_prefix("narad");
        let plane =
            ControlPlane::start(cfg, meta.clone(), transport.clone(), &mut registry).await.unwrap();
        serve.set(Some(plane.clone()));
        meta.set_replicator(plane.clone());
        self.nodes[i] = Some(Node { id: peer.id, meta, plane });
    }

    async fn start_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.start(i).await;
        }
    }

    /// Stops node `i` (graceful: a leader hands over); its endpoint
    /// answers 503 until it restarts.
    async fn stop(&mut self, i: usize) {
        let node = self.nodes[i].take().expect("running");
        node.plane.shutdown().await;
        if let Some((_, serve)) = &self.endpoints[i] {
            serve.set(None);
        }
    }

    /// Stops node `i` for good and closes its endpoint: peers can no longer
    /// reach it at all.
    async fn kill(&mut self, i: usize) {
        if self.nodes[i].is_some() {
            self.stop(i).await;
        }
        if let Some((transport, _)) = self.endpoints[i].take() {
            // Closing waits for every connection to drain (a half-open dial
            // to a stopped peer up to the idle timeout): not worth waiting.
            tokio::spawn(async move { transport.close().await });
        }
    }

    fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("running")
    }

    fn running(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes.iter().enumerate().filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
    }

    /// The index of the node every running node agrees leads.
    async fn leader(&self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let leaders: Vec<usize> =
                self.running().filter(|(_, n)| n.plane.is_leader()).map(|(i, _)| i).collect();
            if let [l] = leaders[..] {
                let id = &self.node(l).id;
                if self.running().all(|(_, n)| n.plane.leader().is_some_and(|x| &x.id == id)) {
                    return l;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no single agreed leader within {within:?}: {leaders:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn shutdown(mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].is_some() {
                self.stop(i).await;
            }
            if let Some((transport, _)) = self.endpoints[i].take() {
                tokio::spawn(async move { transport.close().await });
            }
        }
    }
}

async fn create(meta: &Arc<MetaStore>, name: &str) -> Result<u64, MetaError> {
    let (meta, name) = (meta.clone(), name.to_owned());
    tokio::task::spawn_blocking(move || {
        meta.create_topic(CreateTopicRequest { name, ..Default::default() })
            .map(|t| t.incarnation())
    })
    .await
    .unwrap()
}

/// Waits until every running node holds the same state as node `i`, with
/// topic `topic` in it.
async fn converged(c: &Cluster, topic: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let states: Vec<_> = c.running().map(|(_, n)| n.meta.snapshot()).collect();
        if states[0].topic(topic).is_some() && states.iter().all(|s| **s == *states[0]) {
            return;
        }
        assert!(Instant::now() < deadline, "nodes did not converge on {topic} within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_elect_one_leader_and_a_write_on_a_follower_applies_everywhere() {
    let mut c = Cluster::new("elect", 3, &[], fast());
    c.start_all().await;
    let l = c.leader(Duration::from_secs(10)).await;
    let f = (l + 1) % 3;
    let incarnation = create(&c.node(f).meta, "orders").await.unwrap();
    // Read-your-writes on the node that was asked.
    assert_eq!(c.node(f).meta.topic("orders").unwrap().incarnation(), incarnation);
    converged(&c, "orders", Duration::from_secs(5)).await;
    for (_, n) in c.running() {
        assert_eq!(n.meta.topic("orders").unwrap().incarnation(), incarnation, "{}", n.id);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !n.plane.applied_caught_up() {
            assert!(Instant::now() < deadline, "{} never caught up: {:?}", n.id, n.plane.status());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let s = n.plane.status();
        assert_eq!(s.voters, ["n1", "n2", "n3"]);
        assert_eq!(s.leader.as_deref(), Some(c.node(l).id.as_str()));
    }
    assert_eq!(c.node(l).plane.status().role, Role::Leader);
    // The leader's own error comes back through a follower as it is.
    let e = create(&c.node(f).meta, "orders").await.unwrap_err();
    assert_eq!((e.status(), e.to_string()), (409, "topic already exists".to_owned()));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn when_the_leader_stops_another_takes_over_and_writes_succeed() {
    let mut c = Cluster::new("failover", 3, &[], fast());
    c.start_all().await;
    let l = c.leader(Duration::from_secs(10)).await;
    create(&c.node((l + 1) % 3).meta, "before").await.unwrap();
    converged(&c, "before", Duration::from_secs(5)).await;
    let stopped_at = Instant::now();
    c.stop(l).await;
    let l2 = c.leader(Duration::from_secs(10)).await;
    assert_ne!(l2, l);
    eprintln!("handover took {:?}", stopped_at.elapsed());
    let survivors: Vec<usize> = (0..3).filter(|i| *i != l).collect();
    for i in &survivors {
        create(&c.node(*i).meta, &format!("after-{i}")).await.unwrap();
    }
    converged(&c, &format!("after-{}", survivors[1]), Duration::from_secs(5)).await;
    c.kill(l).await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_node_catches_up_and_keeps_its_applied_state() {
    let mut c = Cluster::new("restart", 3, &[], fast());
    c.start_all().await;
    let l = c.leader(Duration::from_secs(10)).await;
    let f = (l + 1) % 3;
    create(&c.node(l).meta, "t0").await.unwrap();
    converged(&c, "t0", Duration::from_secs(5)).await;
    c.stop(f).await;
    for i in 1..=5 {
        create(&c.node(l).meta, &format!("t{i}")).await.unwrap();
    }
    c.start(f).await;
    // Its metastore still has what it applied before stopping.
    assert!(c.node(f).meta.topic("t0").is_some());
    converged(&c, "t5", Duration::from_secs(10)).await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_far_behind_catches_up_from_a_snapshot() {
    let timings =
        RaftTimings { snapshot_after_entries: 5, entries_kept_after_snapshot: 0, ..fast() };
    let mut c = Cluster::new("snapshot", 3, &[], timings);
    c.start_all().await;
    let l = c.leader(Duration::from_secs(10)).await;
    let f = (l + 1) % 3;
    create(&c.node(l).meta, "t0").await.unwrap();
    converged(&c, "t0", Duration::from_secs(5)).await;
    let behind = c.node(f).plane.status().last_applied;
    c.stop(f).await;
    for i in 1..=20 {
        create(&c.node(l).meta, &format!("t{i}")).await.unwrap();
    }
    // The leader compacted its log past what the stopped node has.
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.node(l).plane.status().purged_index <= behind + 1 {
        assert!(Instant::now() < deadline, "the leader never purged its log");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.start(f).await;
    converged(&c, "t20", Duration::from_secs(10)).await;
    assert!(c.node(f).plane.status().snapshot_index > behind, "caught up without a snapshot");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_only_node_joins_a_running_group() {
    let mut c = Cluster::new("join", 4, &["n1", "n2", "n3"], fast());
    for i in 0..3 {
        c.start(i).await;
    }
    let l = c.leader(Duration::from_secs(10)).await;
    create(&c.node(l).meta, "early").await.unwrap();
    c.start(3).await;
    tokio::time::timeout(Duration::from_secs(10), c.node(3).plane.wait_for_leader())
        .await
        .expect("the joining node sees a leader");
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.node(l).plane.status().voters != ["n1", "n2", "n3", "n4"] {
        assert!(Instant::now() < deadline, "n4 never became a voter");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    create(&c.node(3).meta, "from-n4").await.unwrap();
    converged(&c, "from-n4", Duration::from_secs(5)).await;
    assert!(c.node(3).meta.topic("early").is_some());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_quorum_a_write_is_unavailable_within_bounded_time() {
    let mut c = Cluster::new("quorum", 3, &[], fast());
    c.start_all().await;
    let l = c.leader(Duration::from_secs(10)).await;
    let survivor = (l + 1) % 3;
    for i in (0..3).filter(|i| *i != survivor) {
        c.kill(i).await;
    }
    let started = Instant::now();
    let e = create(&c.node(survivor).meta, "nope").await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.status(), 503, "{e}");
    assert!(e.to_string().starts_with("control plane temporarily unavailable: "), "{e}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_ops_refuse_lying_payloads_and_followers_answer_421() {
    use narad_cluster::rpc::JoinCluster;
    let mut c = Cluster::new("ops", 3, &[], fast());
    c.start_all().await;
    let l = c.leader(Duration::from_secs(10)).await;
    let f = (l + 1) % 3;
    let client = Transport::client_only(
        "127.0.0.1:0".parse().unwrap(),
        ClusterAuth::default(),
        RpcMetrics::default(),
    )
    .unwrap();
    let peer = |i: usize| client.peer(c.peers[i].addr, narad_cluster::tls::DEFAULT_SERVER_NAME);
    // Payloads that are not what the op says, our own frame magic included.
    for bad in [&b"NRS1\x01\x08"[..], b"{}", b"[", b"null", b"{\"vote\":7}"] {
        for req in [
            Request::ProposeCommand(bytes::Bytes::copy_from_slice(bad)),
            Request::RaftAppendEntries(bytes::Bytes::copy_from_slice(bad)),
            Request::RaftVote(bytes::Bytes::copy_from_slice(bad)),
            Request::RaftInstallSnapshot(bytes::Bytes::copy_from_slice(bad)),
        ] {
            let reply = peer(l).call(&req).await.unwrap();
            assert_eq!(
                reply.status,
                400,
                "{:?} {:?}",
                req.op(),
                String::from_utf8_lossy(&reply.body)
            );
        }
    }
    // A follower takes no command and no join: 421, nothing written.
    let command = narad_meta::Command::MemberDead(narad_meta::MemberDead {
        id: "n9".into(),
        last_heartbeat: None,
    });
    let command = serde_json::to_vec(&command).unwrap();
    let reply = peer(f).call(&Request::ProposeCommand(command.into())).await.unwrap();
    assert_eq!(reply.status, 421, "{}", String::from_utf8_lossy(&reply.body));
    let join = Request::JoinCluster(JoinCluster {
        id: "n9".into(),
        cluster_addr: "127.0.0.1:1".into(),
        http_addr: None,
    });
    assert_eq!(peer(f).call(&join).await.unwrap().status, 421);
    // The leader refuses a join with an address it cannot dial.
    let bad_join = Request::JoinCluster(JoinCluster {
        id: "n9".into(),
        cluster_addr: "not an address".into(),
        http_addr: None,
    });
    assert_eq!(peer(l).call(&bad_join).await.unwrap().status, 400);
    // Nor does it let a peer move another member (its Raft traffic would
    // go wherever the peer says): a node joins, or moves, only as itself.
    let hijack = Request::JoinCluster(JoinCluster {
        id: c.node(f).id.clone(),
        cluster_addr: "127.0.0.1:1".into(),
        http_addr: None,
    });
    let reply = peer(l).call(&hijack).await.unwrap();
    assert_eq!(reply.status, 403, "{}", String::from_utf8_lossy(&reply.body));
    assert_eq!(c.node(l).plane.status().voters, ["n1", "n2", "n3"]);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_a_leader_that_confirms_its_leadership_says_a_topic_is_gone() {
    use narad_cluster::raft::LeaderTopicView;
    let mut c = Cluster::new("confirm", 3, &[], fast());
    c.start_all().await;
    let l = c.leader(Duration::from_secs(10)).await;
    let f = (l + 1) % 3;
    let incarnation = create(&c.node(f).meta, "kept").await.unwrap();
    create(&c.node(f).meta, "doomed").await.unwrap();
    converged(&c, "doomed", Duration::from_secs(5)).await;
    // Asked on the leader (barrier + re-read) and through a follower (op 20).
    for i in [l, f] {
        let view = c.node(i).plane.leader_topic_view("kept").await;
        assert_eq!(view, Ok(LeaderTopicView::Present { incarnation }), "{}", c.node(i).id);
        let view = c.node(i).plane.leader_topic_view("never-created").await;
        assert_eq!(view, Ok(LeaderTopicView::Absent), "{}", c.node(i).id);
    }
    let meta = c.node(f).meta.clone();
    tokio::task::spawn_blocking(move || meta.delete_topic("doomed")).await.unwrap().unwrap();
    assert_eq!(c.node(f).plane.leader_topic_view("doomed").await, Ok(LeaderTopicView::Absent));
    // A follower answers GetTopic with 421: only the leader's view counts.
    let client = Transport::client_only(
        "127.0.0.1:0".parse().unwrap(),
        ClusterAuth::default(),
        RpcMetrics::default(),
    )
    .unwrap();
    let follower = client.peer(c.peers[f].addr, narad_cluster::tls::DEFAULT_SERVER_NAME);
    let reply = follower.call(&Request::GetTopic("kept".into())).await.unwrap();
    assert_eq!(reply.status, 421, "{}", String::from_utf8_lossy(&reply.body));
    // Without a quorum nothing is confirmed: neither by a leader that can no
    // longer prove it leads, nor by a follower whose leader is gone.
    let survivor = l;
    for i in (0..3).filter(|i| *i != survivor) {
        c.kill(i).await;
    }
    let started = Instant::now();
    let view = c.node(survivor).plane.leader_topic_view("never-created").await;
    assert!(view.is_err(), "confirmed without a quorum: {view:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    c.shutdown().await;
}
