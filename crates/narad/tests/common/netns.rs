//! Network namespaces for cluster tests that cut links (issue 25 part 2):
//! each node in a namespace of its own, joined to the others by a veth pair
//! and a bridge that lives in a hub namespace, so the host's own network is
//! never touched: every address is inside a namespace the lab made, and
//! dropping the [`Lab`] deletes every namespace (and with them the veths,
//! the bridge and the addresses), also while a test panics. Namespaces left
//! by a test process that died (SIGKILL) are deleted by the next lab.
//!
//! The test process stays in the host namespace: it reaches each node's
//! HTTP port (on the loopback of its namespace: `--dev` serves loopback
//! only) through a relay, a 127.0.0.1 listener of the host whose thread
//! moved into the node's namespace, so every connection it makes lands
//! there.
//!
//! Needs root and `ip` (iproute2); [`unavailable`] says why a test skips.
//!
//! Faults: a node cut off in both directions ([`Lab::isolate`]: its veth
//! down in the hub namespace); and, with nftables ([`nft_unavailable`]
//! says why not), rules in a table `ip nrdlab` the lab adds inside the
//! node's own namespace, matching its `eth0` only (never its loopback,
//! where the relay reaches its HTTP port): a one-way cut
//! ([`Lab::one_way`]), random loss ([`Lab::lossy`]) and duplication
//! ([`Lab::duplicating`]), all removed by [`Lab::heal_links`]. A
//! bandwidth limit with a bounded queue ([`Lab::limit_bandwidth`]: TBF on
//! both ends of the node's link, up to 400 ms of queueing delay) is a
//! qdisc, removed by [`Lab::heal_links`] too. This kernel has no
//! `sch_netem`: no fixed delay or reordering between processes (the
//! cluster simulation, `narad-broker/tests/cluster_sim.rs`, delays and
//! reorders its messages instead).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Names of namespaces made by labs: `nrdlab-<pid>-<lab>-<role>`.
const PREFIX: &str = "nrdlab";

static NEXT_LAB: AtomicUsize = AtomicUsize::new(0);

/// Why namespace tests cannot run here (`None`: they can).
pub fn unavailable() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("network namespace tests need root".into());
    }
    let probe = format!(
        "{PREFIX}-{}-{}-probe",
        std::process::id(),
        NEXT_LAB.fetch_add(1, Ordering::Relaxed)
    );
    match Command::new("ip").args(["netns", "add", &probe]).output() {
        Ok(o) if o.status.success() => {
            let _ = Command::new("ip").args(["netns", "del", &probe]).output();
            None
        }
        Ok(o) => {
            Some(format!("ip netns add failed: {}", String::from_utf8_lossy(&o.stderr).trim()))
        }
        Err(e) => Some(format!("no ip command (iproute2): {e}")),
    }
}

/// Why the nftables faults ([`Lab::one_way`], [`Lab::lossy`],
/// [`Lab::duplicating`]) cannot run here (`None`: they can). Checks
/// [`unavailable`] first, then adds the lab's table with a `numgen` and a
/// `dup` rule in a namespace of its own (so a kernel without them says so
/// here, not in the middle of a test).
pub fn nft_unavailable() -> Option<String> {
    if let Some(why) = unavailable() {
        return Some(why);
    }
    if let Err(e) = Command::new("nft").arg("--version").output() {
        return Some(format!("no nft command (nftables): {e}"));
    }
    let rules = format!(
        "{TABLE}\nadd rule ip nrdlab output oifname \"lo\" numgen random mod 100 < 1 drop\n\
         add rule ip nrdlab output oifname \"lo\" ip daddr 127.0.0.2 dup to 127.0.0.3 device \"lo\"\n"
    );
    in_probe(|probe| nft(probe, &rules))
        .err()
        .map(|e| format!("nftables cannot add the lab's rules: {e}"))
}

/// Why [`Lab::limit_bandwidth`] cannot run here (`None`: it can): checks
/// [`unavailable`], then adds a TBF qdisc in a namespace of its own.
pub fn tbf_unavailable() -> Option<String> {
    if let Some(why) = unavailable() {
        return Some(why);
    }
    let added: Result<(), String> = in_probe(|probe| {
        let tbf = ["qdisc", "add", "dev", "lo", "root", "tbf", "rate", "1mbit", "burst", "32kbit"];
        let o = Command::new("tc")
            .args(["-n", probe])
            .args(tbf)
            .args(["latency", "400ms"])
            .output()
            .map_err(|e| format!("no tc command (iproute2): {e}"))?;
        if o.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&o.stderr).into()) }
    });
    added.err().map(|e| format!("cannot add a TBF qdisc: {}", e.trim()))
}

/// Runs `f` with a fresh namespace (loopback up), deleted after.
fn in_probe<T>(f: impl FnOnce(&str) -> T) -> T {
    let probe = format!(
        "{PREFIX}-{}-{}-probe",
        std::process::id(),
        NEXT_LAB.fetch_add(1, Ordering::Relaxed)
    );
    ip(&["netns", "add", &probe]);
    ip(&["-n", &probe, "link", "set", "lo", "up"]);
    let out = f(&probe);
    let _ = Command::new("ip").args(["netns", "del", &probe]).output();
    out
}

/// The lab's table in a node's namespace, its two chains hooked on the
/// node's own traffic (`add`: a no-op when they exist).
const TABLE: &str = "add table ip nrdlab
add chain ip nrdlab output { type filter hook output priority 0; policy accept; }
add chain ip nrdlab input { type filter hook input priority 0; policy accept; }";

/// Runs `nft -f -` with `rules` inside namespace `ns`; its stderr when it
/// fails.
fn nft(ns: &str, rules: &str) -> Result<(), String> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("run nft: {e}"))?;
    child.stdin.take().unwrap().write_all(rules.as_bytes()).map_err(|e| e.to_string())?;
    let o = child.wait_with_output().map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!("{}\n{rules}", String::from_utf8_lossy(&o.stderr).trim()))
    }
}

/// Runs `ip args...`; panics with its stderr when it fails.
fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("run ip");
    assert!(o.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
}

/// Runs `tc args...` (`-n NS` first: in that namespace); panics with its
/// stderr when it fails.
fn tc(args: &[&str]) {
    let o = Command::new("tc").args(args).output().expect("run tc");
    assert!(o.status.success(), "tc {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
}

/// Deletes the namespaces of labs whose test process is gone.
fn sweep_stale() {
    let Ok(o) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(rest) = name.strip_prefix(&format!("{PREFIX}-")) else { continue };
        let pid = rest.split('-').next().unwrap_or_default();
        if !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

/// `n` node namespaces on one bridge (in a hub namespace), node `i` at
/// `10.77.0.<i+1>/24`.
#[derive(Debug)]
pub struct Lab {
    hub: String,
    nodes: Vec<String>,
    relays: Vec<Relay>,
    /// By node: whether the lab's nftables table is in its namespace.
    filtered: Vec<AtomicBool>,
}

impl Lab {
    /// Builds the namespaces, the bridge and the links, all up.
    pub fn create(n: usize) -> Lab {
        sweep_stale();
        let k = NEXT_LAB.fetch_add(1, Ordering::Relaxed);
        let base = format!("{PREFIX}-{}-{k}", std::process::id());
        let mut lab = Lab {
            hub: format!("{base}-hub"),
            nodes: Vec::new(),
            relays: Vec::new(),
            filtered: (0..n).map(|_| AtomicBool::new(false)).collect(),
        };
        ip(&["netns", "add", &lab.hub]);
        ip(&["-n", &lab.hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &lab.hub, "link", "set", "br0", "up"]);
        for i in 0..n {
            let ns = format!("{base}-n{}", i + 1);
            ip(&["netns", "add", &ns]);
            lab.nodes.push(ns.clone());
            let port = format!("v{}", i + 1);
            ip(&[
                "-n", &lab.hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ]);
            ip(&["-n", &lab.hub, "link", "set", &port, "master", "br0"]);
            ip(&["-n", &lab.hub, "link", "set", &port, "up"]);
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", Lab::addr(i)), "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        lab
    }

    /// Node `i`'s address.
    pub fn addr(i: usize) -> String {
        format!("10.77.0.{}", i + 1)
    }

    /// Node `i`'s namespace.
    pub fn ns(&self, i: usize) -> &str {
        &self.nodes[i]
    }

    /// A 127.0.0.1 address of the host that reaches `target` inside node
    /// `i`'s namespace (lives as long as the lab).
    pub fn relay(&mut self, i: usize, target: SocketAddr) -> SocketAddr {
        let relay = Relay::start(&self.nodes[i], target);
        let addr = relay.addr;
        self.relays.push(relay);
        addr
    }

    /// Cuts node `i` off the bridge: nothing in or out until [`Lab::heal`].
    pub fn isolate(&self, i: usize) {
        ip(&["-n", &self.hub, "link", "set", &format!("v{}", i + 1), "down"]);
    }

    /// Reconnects node `i`.
    pub fn heal(&self, i: usize) {
        ip(&["-n", &self.hub, "link", "set", &format!("v{}", i + 1), "up"]);
    }

    /// Adds `rules` (chains `input`/`output` of table `ip nrdlab`) in node
    /// `i`'s namespace, making the table first; panics when nft fails.
    fn nft_rules(&self, i: usize, rules: &[String]) {
        let script = format!("{TABLE}\n{}\n", rules.join("\n"));
        self.filtered[i].store(true, Ordering::Relaxed);
        if let Err(e) = nft(&self.nodes[i], &script) {
            panic!("nft in {}: {e}", self.nodes[i]);
        }
    }

    /// Drops every packet node `from` sends to node `to`, and nothing else:
    /// `to`'s packets still reach `from` (a rule in `from`'s output chain)
    /// until [`Lab::heal_links`]. Needs nftables ([`nft_unavailable`]).
    pub fn one_way(&self, from: usize, to: usize) {
        let rule = format!(
            "add rule ip nrdlab output oifname \"eth0\" ip daddr {} counter drop",
            Lab::addr(to)
        );
        self.nft_rules(from, &[rule]);
    }

    /// Drops `percent` % of node `i`'s packets on its link, at random, in
    /// each direction (what it sends and what it receives; between two
    /// lossy nodes a packet crosses two such rules) until
    /// [`Lab::heal_links`]. Needs nftables.
    pub fn lossy(&self, i: usize, percent: u32) {
        assert!(percent <= 100, "a percentage: {percent}");
        let rules = [("output", "oifname"), ("input", "iifname")].map(|(chain, dev)| {
            format!(
                "add rule ip nrdlab {chain} {dev} \"eth0\" numgen random mod 100 < {percent} counter drop"
            )
        });
        self.nft_rules(i, &rules);
    }

    /// Sends `percent` % of the packets node `i` sends to each other node
    /// of the lab twice (nftables `dup`), until [`Lab::heal_links`].
    /// Duplicated datagrams: QUIC discards the second copy by its packet
    /// number. Needs nftables.
    pub fn duplicating(&self, i: usize, percent: u32) {
        assert!(percent <= 100, "a percentage: {percent}");
        let rules: Vec<String> = (0..self.nodes.len())
            .filter(|&j| j != i)
            .map(|j| {
                let to = Lab::addr(j);
                format!(
                    "add rule ip nrdlab output oifname \"eth0\" ip daddr {to} \
                     numgen random mod 100 < {percent} counter dup to {to} device \"eth0\""
                )
            })
            .collect();
        self.nft_rules(i, &rules);
    }

    /// Limits node `i`'s link to `kbit` kbit/s in each direction with a
    /// token bucket (TBF: 32 kbit bursts, what waits longer than 400 ms is
    /// dropped): a slow link whose queue adds up to 400 ms of delay under
    /// load; no delay when idle (not netem's fixed delay). A qdisc on the
    /// node's `eth0` (what it sends) and on its port of the bridge in the
    /// hub namespace (what it receives), until [`Lab::heal_links`].
    pub fn limit_bandwidth(&self, i: usize, kbit: u32) {
        let rate = format!("{kbit}kbit");
        for (ns, dev) in self.link_ends(i) {
            tc(&[
                "-n", ns, "qdisc", "replace", "dev", &dev, "root", "tbf", "rate", &rate, "burst",
                "32kbit", "latency", "400ms",
            ]);
        }
    }

    /// Packets node `i`'s faults dropped and duplicated so far: the
    /// counters of the lab's nftables rules in its namespace, plus what a
    /// bandwidth limit's queues dropped (0 and 0 after
    /// [`Lab::heal_links`]).
    pub fn fault_counts(&self, i: usize) -> (u64, u64) {
        let (mut dropped, mut duplicated) = (0, 0);
        let rules = if self.filtered[i].load(Ordering::Relaxed) {
            let o = Command::new("ip")
                .args(["netns", "exec", &self.nodes[i], "nft", "list", "table", "ip", "nrdlab"])
                .output()
                .expect("run nft");
            String::from_utf8_lossy(&o.stdout).into_owned()
        } else {
            String::new()
        };
        for line in rules.lines() {
            let Some((_, after)) = line.split_once("counter packets ") else { continue };
            let n: u64 = after.split(' ').next().and_then(|n| n.parse().ok()).unwrap_or(0);
            if line.trim_end().ends_with(" drop") {
                dropped += n;
            } else if line.contains(" dup to ") {
                duplicated += n;
            }
        }
        for (ns, dev) in self.link_ends(i) {
            let o = Command::new("tc")
                .args(["-n", ns, "-s", "qdisc", "show", "dev", &dev, "root"])
                .output()
                .expect("run tc");
            let text = String::from_utf8_lossy(&o.stdout);
            if text.contains("tbf")
                && let Some((_, after)) = text.split_once("(dropped ")
            {
                dropped += after.split(',').next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
            }
        }
        (dropped, duplicated)
    }

    /// Removes every fault of node `i` but a cut: the lab's nftables
    /// table in its namespace (one-way cuts, loss, duplication) and the
    /// bandwidth limit on both ends of its link.
    pub fn heal_links(&self, i: usize) {
        if self.filtered[i].swap(false, Ordering::Relaxed)
            && let Err(e) = nft(&self.nodes[i], "delete table ip nrdlab\n")
        {
            panic!("nft in {}: {e}", self.nodes[i]);
        }
        for (ns, dev) in self.link_ends(i) {
            let o = Command::new("tc")
                .args(["-n", ns, "qdisc", "show", "dev", &dev, "root"])
                .output()
                .expect("run tc");
            if String::from_utf8_lossy(&o.stdout).contains("tbf") {
                tc(&["-n", ns, "qdisc", "del", "dev", &dev, "root"]);
            }
        }
    }

    /// Both ends of node `i`'s link: its `eth0` and its port of the bridge,
    /// each with its namespace.
    fn link_ends(&self, i: usize) -> [(&str, String); 2] {
        [(&self.nodes[i], "eth0".to_owned()), (&self.hub, format!("v{}", i + 1))]
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for r in &self.relays {
            r.stop();
        }
        for ns in self.nodes.iter().chain([&self.hub]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// A host listener whose accepting thread lives in a node's namespace:
/// each connection accepted is copied both ways to a connection made there.
#[derive(Debug)]
struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Relay {
    fn start(ns: &str, target: SocketAddr) -> Relay {
        // Bound before the thread moves: the listener stays the host's.
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay listener");
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let ns_file = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("netns file");
        let stopping = stop.clone();
        std::thread::spawn(move || {
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&ns_file),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("setns into the node's namespace");
            for conn in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = conn else { continue };
                // Made on this thread: inside the namespace.
                let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
                    continue;
                };
                pump(client, server);
            }
        });
        Relay { addr, stop }
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept so the thread sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

/// Copies `a` to `b` and `b` to `a` on two threads until either side ends.
fn pump(a: TcpStream, b: TcpStream) {
    let (a2, b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
    std::thread::spawn(move || copy(a, b));
    std::thread::spawn(move || copy(b2, a2));
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
