//! Black-box cluster harness: N real `narad serve` processes on loopback,
//! each with its own free HTTP (TCP) port, free cluster (UDP) port and
//! temporary data directory, told about each other through
//! `NARAD_CLUSTER_PEERS` (node ids `n1`..`nN`).
//!
//! Every wait is bounded and panics with the node's log when it runs out.
//! Processes are controlled by PID (SIGKILL, SIGSTOP/SIGCONT, SIGTERM) and
//! [`Cluster`]'s `Drop` kills every node it started, paused ones included,
//! and removes the data directories, also while a test panics (then after
//! printing each node's last log lines; `NARAD_TEST_KEEP_DIRS=1` keeps
//! them).
//!
//! ```ignore
//! let mut c = Cluster::start(3, ClusterOpts::dev());
//! let leader = c.leader(Duration::from_secs(10));
//! c.kill9(leader);
//! ```

use std::net::{TcpListener, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use reqwest::blocking::{Client, RequestBuilder};
use serde_json::Value;

use super::{ADMIN_PASSWORD, temp_dir};

/// How to start a cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterOpts {
    /// Security on (no `--dev`; the root password is [`ADMIN_PASSWORD`]).
    /// Off: every node runs `serve --dev`.
    pub security: bool,
    /// `NARAD_CLUSTER_SECRET` of every node (required with security).
    pub secret: Option<String>,
    /// `NARAD_CLUSTER_INITIAL_MEMBERS` (empty: every node bootstraps).
    pub initial_members: Vec<String>,
    /// Extra environment of every node.
    pub env: Vec<(String, String)>,
    /// Extra environment of one node (by index), after `env`: e.g. a wrong
    /// secret for one node.
    pub node_env: Vec<(usize, String, String)>,
    /// Nodes (by index) started with `serve --dev` and neither secret nor
    /// root password even when `security` is on: an outsider to a secured
    /// cluster.
    pub dev_nodes: Vec<usize>,
    /// Nodes (by index) started under an open-file limit (soft and hard,
    /// via `prlimit`).
    pub nofile: Vec<(usize, u64)>,
    /// Each node in a network namespace of its own ([`super::netns::Lab`]),
    /// so a test can cut its links; HTTP is reached through relays.
    pub netns: bool,
}

impl ClusterOpts {
    /// `serve --dev` nodes: security off, no secret needed.
    pub fn dev() -> ClusterOpts {
        ClusterOpts::default()
    }

    /// Secured nodes sharing `secret`.
    pub fn secure(secret: &str) -> ClusterOpts {
        ClusterOpts { security: true, secret: Some(secret.into()), ..ClusterOpts::default() }
    }

    /// Sets `NARAD_CLUSTER_INITIAL_MEMBERS`.
    pub fn initial_members(mut self, ids: &[&str]) -> ClusterOpts {
        self.initial_members = ids.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Adds an environment variable of every node.
    pub fn env(mut self, k: &str, v: &str) -> ClusterOpts {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Starts node `i` with `serve --dev`, without the secret.
    pub fn dev_node(mut self, i: usize) -> ClusterOpts {
        self.dev_nodes.push(i);
        self
    }

    /// Starts node `i` under an open-file limit of `n`.
    pub fn nofile(mut self, i: usize, n: u64) -> ClusterOpts {
        self.nofile.push((i, n));
        self
    }

    /// Runs each node in a network namespace of its own (needs root:
    /// check [`super::netns::unavailable`] first).
    pub fn in_network_namespaces(mut self) -> ClusterOpts {
        self.netns = true;
        self
    }

    /// Adds an environment variable of node `i` only.
    pub fn node_env(mut self, i: usize, k: &str, v: &str) -> ClusterOpts {
        self.node_env.push((i, k.into(), v.into()));
        self
    }
}

/// One node: its id, addresses and files.
#[derive(Debug)]
pub struct Node {
    /// `n1`, `n2`, ...
    pub id: String,
    /// Its HTTP port on 127.0.0.1.
    pub http_port: u16,
    /// Its cluster (node RPC, UDP) port on 127.0.0.1.
    pub cluster_port: u16,
    /// `http://127.0.0.1:<http_port>`.
    pub base: String,
    /// Its data directory (kept across restarts).
    pub data_dir: PathBuf,
    /// Its log (stderr, appended across restarts).
    pub log_path: PathBuf,
    /// With network namespaces: its namespace and address there.
    ns: Option<(String, String)>,
    child: Option<Child>,
    paused: bool,
}

impl Node {
    /// The URL of `path` on this node.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Whether its process was started and not killed or stopped for good
    /// (a paused node counts as running).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether it is paused (SIGSTOP).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Its PID, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }
}

/// N nodes of one cluster.
pub struct Cluster {
    nodes: Vec<Node>,
    opts: ClusterOpts,
    peers: String,
    root: PathBuf,
    /// A client for requests (10 s timeout per request).
    pub client: Client,
    /// A client with a short timeout for polling (a paused node must not
    /// hold a wait up).
    probe: Client,
    /// The namespaces, when the nodes run in them (dropped after the nodes
    /// are killed).
    lab: Option<super::netns::Lab>,
}

/// A node's HTTP port inside its network namespace.
const NS_HTTP_PORT: u16 = 7942;
/// A node's cluster (UDP) port inside its network namespace.
const NS_CLUSTER_PORT: u16 = 7943;

/// Picks `n` distinct free TCP ports and `n` distinct free UDP ports on
/// 127.0.0.1, holding them all until every one is picked.
fn free_ports(n: usize) -> Vec<(u16, u16)> {
    let tcp: Vec<TcpListener> =
        (0..n).map(|_| TcpListener::bind("127.0.0.1:0").expect("free tcp port")).collect();
    let udp: Vec<UdpSocket> =
        (0..n).map(|_| UdpSocket::bind("127.0.0.1:0").expect("free udp port")).collect();
    tcp.iter()
        .zip(&udp)
        .map(|(t, u)| (t.local_addr().unwrap().port(), u.local_addr().unwrap().port()))
        .collect()
}

/// Polls `f` every 50 ms until it returns `Some`, or panics after
/// `timeout` with `what` and the last state `describe` gives.
pub fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
    describe: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}\n{}", describe());
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Cluster {
    /// Picks ports and directories for `n` nodes without starting any:
    /// start them with [`Cluster::spawn`] (e.g. a join-only node later).
    pub fn prepare(n: usize, opts: ClusterOpts) -> Cluster {
        assert!(n >= 1, "a cluster has at least one node");
        let root = temp_dir(&format!("cluster{n}"));
        let mut lab = opts.netns.then(|| super::netns::Lab::create(n));
        let mut nodes: Vec<Node> = free_ports(n)
            .into_iter()
            .enumerate()
            .map(|(i, (http_port, cluster_port))| {
                let id = format!("n{}", i + 1);
                Node {
                    base: format!("http://127.0.0.1:{http_port}"),
                    data_dir: root.join(&id).join("data"),
                    log_path: root.join(&id).join("server.log"),
                    ns: None,
                    id,
                    http_port,
                    cluster_port,
                    child: None,
                    paused: false,
                }
            })
            .collect();
        if let Some(lab) = lab.as_mut() {
            // Inside its namespace every node has the same ports on its own
            // address; the host reaches its HTTP port through a relay.
            for (i, node) in nodes.iter_mut().enumerate() {
                let addr = super::netns::Lab::addr(i);
                let relay = lab.relay(i, ([127, 0, 0, 1], NS_HTTP_PORT).into());
                node.http_port = relay.port();
                node.cluster_port = NS_CLUSTER_PORT;
                node.base = format!("http://{relay}");
                node.ns = Some((lab.ns(i).to_owned(), addr));
            }
        }
        for node in &nodes {
            std::fs::create_dir_all(node.log_path.parent().unwrap()).unwrap();
        }
        let peers = nodes
            .iter()
            .map(|n| {
                let host = n.ns.as_ref().map_or("127.0.0.1", |(_, addr)| addr.as_str());
                format!("{}@{host}:{}", n.id, n.cluster_port)
            })
            .collect::<Vec<_>>()
            .join(",");
        let client = Client::builder()
            .timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(16)
            .build()
            .unwrap();
        let probe = Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
        Cluster { nodes, opts, peers, root, client, probe, lab }
    }

    /// Starts `n` nodes and waits (≤ 30 s each) until every one is ready.
    pub fn start(n: usize, opts: ClusterOpts) -> Cluster {
        let mut c = Cluster::prepare(n, opts);
        c.start_first(n);
        c
    }

    /// Spawns nodes `0..k` (all at once, so they can bootstrap together)
    /// and waits (≤ 30 s each) until every one is ready.
    pub fn start_first(&mut self, k: usize) {
        for i in 0..k {
            self.spawn(i);
        }
        for i in 0..k {
            self.wait_ready(i, Duration::from_secs(30));
        }
    }

    /// The namespaces the nodes run in (with
    /// [`ClusterOpts::in_network_namespaces`]).
    pub fn lab(&self) -> &super::netns::Lab {
        self.lab.as_ref().expect("the nodes run in network namespaces")
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Node `i` (0-based; its id is `n{i+1}`).
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// The index of the node with id `id`.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// `NARAD_CLUSTER_PEERS` of every node.
    pub fn peers(&self) -> &str {
        &self.peers
    }

    /// The directory holding every node's data directory and log.
    pub fn root(&self) -> &PathBuf {
        &self.root
    }

    /// Starts node `i`'s process (not running), on its ports and data
    /// directory, without waiting for it to be ready.
    pub fn spawn(&mut self, i: usize) {
        let opts = &self.opts;
        let node = &self.nodes[i];
        assert!(node.child.is_none(), "{} is already running", node.id);
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(&node.log_path).unwrap();
        let mut cmd = match (&node.ns, opts.nofile.iter().find(|(n, _)| *n == i)) {
            // `ip netns exec` enters the namespace and execs: the same PID.
            (Some((ns, _)), _) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(env!("CARGO_BIN_EXE_narad"));
                c
            }
            // prlimit sets the limit on itself and execs: the same PID.
            (None, Some((_, n))) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg("--").arg(env!("CARGO_BIN_EXE_narad"));
                c
            }
            (None, None) => Command::new(env!("CARGO_BIN_EXE_narad")),
        };
        let (http, cluster) = match &node.ns {
            Some((_, addr)) => {
                (format!("127.0.0.1:{NS_HTTP_PORT}"), format!("{addr}:{NS_CLUSTER_PORT}"))
            }
            None => (
                format!("127.0.0.1:{}", node.http_port),
                format!("127.0.0.1:{}", node.cluster_port),
            ),
        };
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("NARAD_")) {
            cmd.env_remove(k);
        }
        cmd.arg("serve");
        let secured = opts.security && !opts.dev_nodes.contains(&i);
        if !secured {
            cmd.arg("--dev");
        }
        cmd.arg("--addr")
            .arg(http)
            .arg("--data-dir")
            .arg(&node.data_dir)
            .arg("--node-id")
            .arg(&node.id)
            .arg("--cluster-addr")
            .arg(cluster)
            .env("NARAD_LOG_LEVEL", "info")
            .env("NARAD_CLUSTER_PEERS", &self.peers);
        if !opts.initial_members.is_empty() {
            cmd.env("NARAD_CLUSTER_INITIAL_MEMBERS", opts.initial_members.join(","));
        }
        if secured {
            cmd.env("NARAD_ADMIN_PASSWORD", ADMIN_PASSWORD);
        }
        if let Some(secret) = opts.secret.as_ref().filter(|_| !opts.dev_nodes.contains(&i)) {
            cmd.env("NARAD_CLUSTER_SECRET", secret);
        }
        cmd.envs(opts.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        for (_, k, v) in opts.node_env.iter().filter(|(n, _, _)| *n == i) {
            cmd.env(k, v);
        }
        let child =
            cmd.stdout(Stdio::null()).stderr(log).spawn().expect("start narad (cluster node)");
        let node = &mut self.nodes[i];
        super::at_exit::track_process(child.id(), &node.data_dir);
        node.child = Some(child);
        node.paused = false;
    }

    /// Starts node `i`'s process as a single node, as an operator would
    /// before it joined a cluster: `--dev` on its HTTP port and data
    /// directory, no peers and no cluster address, with `--node-id` only
    /// when `node_id` is given. Follow with [`Cluster::wait_ready`] (or
    /// [`Cluster::wait_exit`] for a start that must be refused).
    pub fn spawn_single(&mut self, i: usize, node_id: Option<&str>) {
        let node = &self.nodes[i];
        assert!(node.child.is_none(), "{} is already running", node.id);
        assert!(node.ns.is_none(), "a single node runs on the host");
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(&node.log_path).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_narad"));
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("NARAD_")) {
            cmd.env_remove(k);
        }
        cmd.args(["serve", "--dev", "--addr"])
            .arg(format!("127.0.0.1:{}", node.http_port))
            .arg("--data-dir")
            .arg(&node.data_dir)
            .env("NARAD_LOG_LEVEL", "info");
        if let Some(id) = node_id {
            cmd.arg("--node-id").arg(id);
        }
        let child = cmd.stdout(Stdio::null()).stderr(log).spawn().expect("start narad (single)");
        let node = &mut self.nodes[i];
        super::at_exit::track_process(child.id(), &node.data_dir);
        node.child = Some(child);
        node.paused = false;
    }

    /// Waits (≤ `timeout`) for node `i`'s process to exit by itself and
    /// returns its status; kills it and panics with its log if it is still
    /// running then (a start that must be refused, and was not).
    pub fn wait_exit(&mut self, i: usize, timeout: Duration) -> ExitStatus {
        let node = &mut self.nodes[i];
        let mut c = node.child.take().unwrap_or_else(|| panic!("{} is not running", node.id));
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            if Instant::now() >= deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!("{} still running after {timeout:?}; log:\n{}", node.id, node.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until node `i` answers `/readyz` 200; panics with its log if
    /// it exits or `timeout` passes.
    pub fn wait_ready(&mut self, i: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let node = &mut self.nodes[i];
            let child = node.child.as_mut().unwrap_or_else(|| panic!("{} is not running", node.id));
            if let Some(status) = child.try_wait().unwrap() {
                node.child = None;
                panic!("{} exited during start-up ({status}); log:\n{}", node.id, node.log());
            }
            if let Ok(r) = self.probe.get(node.url("/readyz")).send()
                && r.status() == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready within {timeout:?}; log:\n{}",
                node.id,
                node.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL node `i` (paused or not) and reap it.
    pub fn kill9(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if let Some(mut c) = node.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        node.paused = false;
    }

    /// SIGTERM node `i` (graceful stop) and its exit status; SIGKILL and a
    /// panic if it takes over 30 s.
    pub fn terminate(&mut self, i: usize) -> ExitStatus {
        if self.nodes[i].paused {
            self.cont(i);
        }
        let node = &mut self.nodes[i];
        let mut c = node.child.take().unwrap_or_else(|| panic!("{} is not running", node.id));
        signal(c.id(), "-TERM");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            if Instant::now() >= deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!(
                    "{} did not stop within 30 s of SIGTERM; log:\n{}",
                    node.id,
                    node.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM every running node at once (paused ones resumed first), then
    /// waits for each to exit: the whole cluster stopping together. Returns
    /// the exit statuses by node; SIGKILL and a panic if one takes over
    /// 30 s.
    pub fn terminate_all(&mut self) -> Vec<Option<ExitStatus>> {
        for i in 0..self.nodes.len() {
            if self.nodes[i].paused {
                self.cont(i);
            }
        }
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            signal(node.pid().expect("running"), "-TERM");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut out = Vec::new();
        for node in &mut self.nodes {
            let Some(mut c) = node.child.take() else {
                out.push(None);
                continue;
            };
            loop {
                if let Some(st) = c.try_wait().unwrap() {
                    out.push(Some(st));
                    break;
                }
                if Instant::now() >= deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!(
                        "{} did not stop within 30 s of SIGTERM; log:\n{}",
                        node.id,
                        node.log_tail()
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        out
    }

    /// Pauses node `i` (SIGSTOP) and waits (≤ 10 s) until every thread of
    /// it is stopped: it holds its ports and answers nothing.
    pub fn stop(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let pid = node.pid().unwrap_or_else(|| panic!("{} is not running", node.id));
        signal(pid, "-STOP");
        node.paused = true;
        wait_for(
            Duration::from_secs(10),
            "SIGSTOP took effect",
            || stopped(pid).then_some(()),
            || format!("threads of {pid}: {:?}", thread_states(pid)),
        );
    }

    /// Resumes node `i` (SIGCONT) and waits (≤ 10 s) until no thread of it
    /// is stopped.
    pub fn cont(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let pid = node.pid().unwrap_or_else(|| panic!("{} is not running", node.id));
        signal(pid, "-CONT");
        node.paused = false;
        let running = || thread_states(pid).iter().all(|s| *s != 'T');
        wait_for(
            Duration::from_secs(10),
            "SIGCONT took effect",
            || running().then_some(()),
            || format!("threads of {pid}: {:?}", thread_states(pid)),
        );
    }

    /// Starts node `i` again (after [`Cluster::kill9`] or
    /// [`Cluster::terminate`]) on the same ports and data directory,
    /// without waiting: follow with [`Cluster::wait_ready`].
    pub fn restart(&mut self, i: usize) {
        assert!(self.nodes[i].child.is_none(), "{}: stop it first", self.nodes[i].id);
        self.spawn(i);
    }

    /// Node `i`'s next starts listen on cluster port `port` (the other
    /// nodes' peers still name the old one; node `i`'s own name `port`).
    pub fn move_cluster_port(&mut self, i: usize, port: u16) {
        let old = format!("{}@127.0.0.1:{}", self.nodes[i].id, self.nodes[i].cluster_port);
        let new = format!("{}@127.0.0.1:{port}", self.nodes[i].id);
        self.nodes[i].cluster_port = port;
        let own = self.peers.replace(&old, &new);
        self.opts.node_env.push((i, "NARAD_CLUSTER_PEERS".into(), own));
    }

    /// [`Cluster::restart`] with an extra environment variable of node `i`
    /// (for this and later starts).
    pub fn restart_with_env(&mut self, i: usize, k: &str, v: &str) {
        self.opts.node_env.push((i, k.into(), v.into()));
        self.restart(i);
    }

    /// A request to node `i` (with the root's credentials when security is
    /// on).
    pub fn request(&self, i: usize, method: Method, path: &str) -> RequestBuilder {
        let rb = self.client.request(method, self.nodes[i].url(path));
        if self.opts.security { rb.basic_auth("admin", Some(ADMIN_PASSWORD)) } else { rb }
    }

    /// `GET path` on node `i` as JSON, with its status; `None` when the node
    /// does not answer (down, paused, timed out) or the body is not JSON.
    pub fn get_json(&self, i: usize, path: &str) -> Option<(u16, Value)> {
        let mut rb = self.probe.get(self.nodes[i].url(path));
        if self.opts.security {
            rb = rb.basic_auth("admin", Some(ADMIN_PASSWORD));
        }
        let r = rb.send().ok()?;
        let status = r.status().as_u16();
        Some((status, serde_json::from_str(&r.text().ok()?).ok()?))
    }

    /// `GET /v1/cluster/status` of node `i` (`None`: no answer).
    pub fn status(&self, i: usize) -> Option<Value> {
        self.get_json(i, "/v1/cluster/status").filter(|(s, _)| *s == 200).map(|(_, v)| v)
    }

    /// The ids node `i` lists in `/v1/cluster/members`, in its order
    /// (`None`: no answer).
    pub fn member_ids(&self, i: usize) -> Option<Vec<String>> {
        let (_, m) = self.get_json(i, "/v1/cluster/members")?;
        Some(
            m["members"]
                .as_array()?
                .iter()
                .filter_map(|m| m["id"].as_str().map(str::to_owned))
                .collect(),
        )
    }

    /// Waits until every running, unpaused node lists all `len()` nodes as
    /// alive members (within `timeout`, else a panic with every node's
    /// state). Partitions are placed over the alive members at create, so a
    /// test that needs them spread over every node waits for this first:
    /// a node is ready (HTTP up) before it is an alive member.
    pub fn wait_all_alive(&self, timeout: Duration) {
        let n = self.nodes.len();
        wait_for(
            timeout,
            &format!("every running node lists all {n} members alive"),
            || {
                self.nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, node)| node.is_running() && !node.paused)
                    .all(|(i, _)| {
                        self.get_json(i, "/v1/cluster/members").is_some_and(|(status, v)| {
                            status == 200
                                && v["members"].as_array().is_some_and(|m| {
                                    m.iter().filter(|m| m["status"] == "alive").count() == n
                                })
                        })
                    })
                    .then_some(())
            },
            || self.describe(),
        );
    }

    /// One round of a queue-mode consumer through node `i`: consumes up to
    /// 100 records of `topic` (waiting at most 200 ms), acks them, and
    /// returns the payloads' `"i"` numbers (none when the node does not
    /// answer 200).
    pub fn consume_round(&self, i: usize, topic: &str) -> Vec<u64> {
        let path = format!("/v1/topics/{topic}/consume?max=100&wait=200ms");
        let Ok(r) = self.request(i, Method::GET, &path).send() else { return Vec::new() };
        if r.status().as_u16() != 200 {
            return Vec::new();
        }
        let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
        let mut got = Vec::new();
        let mut handles = Vec::new();
        for m in v["messages"].as_array().unwrap() {
            got.push(m["payload"]["i"].as_u64().unwrap());
            handles.push(m["receipt_handle"].as_str().unwrap().to_owned());
        }
        if !handles.is_empty() {
            let _ = self
                .request(i, Method::POST, &format!("/v1/topics/{topic}/ack"))
                .body(serde_json::json!({"receipt_handles": handles}).to_string())
                .send();
        }
        got
    }

    /// Creates the topic `body` describes through node `i` once every node
    /// is alive (201 or a panic); its owners by partition, once placed.
    pub fn create_placed(&self, i: usize, body: Value) -> Vec<String> {
        self.wait_all_alive(Duration::from_secs(20));
        let name = body["name"].as_str().expect("the topic's name").to_owned();
        let r = self.request(i, Method::POST, "/v1/topics").body(body.to_string()).send().unwrap();
        assert_eq!(r.status().as_u16(), 201, "{}", r.text().unwrap());
        self.wait_placed(&name)
    }

    /// Waits until every node shows every partition of `topic` owned, all
    /// alike (within 20 s, else a panic with every node's state); returns
    /// the owners by partition.
    pub fn wait_placed(&self, topic: &str) -> Vec<String> {
        wait_for(
            Duration::from_secs(20),
            &format!("every node shows every partition of {topic} owned"),
            || {
                let owners: Vec<Vec<String>> = (0..self.nodes.len())
                    .map(|n| {
                        let (status, v) = self.get_json(n, &format!("/v1/topics/{topic}"))?;
                        (status == 200).then_some(())?;
                        v["partition_stats"]
                            .as_array()?
                            .iter()
                            .map(|p| p["owner_node"].as_str().map(str::to_owned))
                            .collect::<Option<Vec<String>>>()
                    })
                    .collect::<Option<_>>()?;
                owners.iter().all(|o| o == &owners[0]).then(|| owners[0].clone())
            },
            || self.describe(),
        )
    }

    /// The index of the leader: a running, unpaused node whose
    /// `/v1/cluster/status` says it leads (the highest term if several
    /// do), within `timeout` (else a panic with every node's status).
    pub fn leader(&self, timeout: Duration) -> usize {
        wait_for(
            timeout,
            "a leader",
            || {
                let mut best: Option<(u64, usize)> = None;
                for (i, node) in self.nodes.iter().enumerate() {
                    if !node.is_running() || node.paused {
                        continue;
                    }
                    let Some(s) = self.status(i) else { continue };
                    if s["role"] == "leader" && s["node_id"] == node.id.as_str() {
                        let term = s["term"].as_u64().unwrap_or(0);
                        if best.is_none_or(|(t, _)| term > t) {
                            best = Some((term, i));
                        }
                    }
                }
                best.map(|(_, i)| i)
            },
            || self.describe(),
        )
    }

    /// Every node's state, for failure messages: running/paused/down, its
    /// status, and the tail of its log.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let state = match (node.is_running(), node.paused) {
                (false, _) => "down",
                (true, true) => "paused",
                (true, false) => "running",
            };
            let status = if state == "running" {
                self.status(i).map_or("(no answer)".to_owned(), |v| v.to_string())
            } else {
                String::new()
            };
            out.push_str(&format!("--- {} ({state}) {status}\n{}\n", node.id, node.log_tail()));
        }
        out
    }
}

/// The state letter of every thread of `pid` (`/proc/<pid>/task/*/stat`;
/// `T` = stopped by a signal).
fn thread_states(pid: u32) -> Vec<char> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
        .filter_map(|stat| stat.rsplit_once(") ")?.1.chars().next())
        .collect()
}

/// Whether every thread of `pid` is stopped (SIGSTOP delivery is
/// asynchronous: `kill` returns before the threads stop).
fn stopped(pid: u32) -> bool {
    let states = thread_states(pid);
    !states.is_empty() && states.iter().all(|s| *s == 'T')
}

/// Sends `sig` (`-STOP`, `-CONT`, `-TERM`) to `pid`.
fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill").arg(sig).arg(pid.to_string()).status().is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            // SIGKILL ends a stopped process too; no SIGCONT needed.
            self.kill9(i);
        }
        let logs: Vec<PathBuf> = self.nodes.iter().map(|n| n.log_path.clone()).collect();
        super::remove_test_dir(&self.root, &logs);
    }
}

/// SPEC §1.6's partition of a key: FNV-1a-32 modulo the partition count.
pub fn key_partition(key: &str, partitions: u32) -> u32 {
    let mut h: u32 = 2_166_136_261;
    for b in key.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(16_777_619);
    }
    h % partitions
}
