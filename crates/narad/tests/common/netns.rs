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
//! This kernel has no `sch_netem`, so faults are links cut (`ip link set
//! down`) in both directions; one-way cuts and loss need nftables.

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

/// Runs `ip args...`; panics with its stderr when it fails.
fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("run ip");
    assert!(o.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
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
}

impl Lab {
    /// Builds the namespaces, the bridge and the links, all up.
    pub fn create(n: usize) -> Lab {
        sweep_stale();
        let k = NEXT_LAB.fetch_add(1, Ordering::Relaxed);
        let base = format!("{PREFIX}-{}-{k}", std::process::id());
        let mut lab = Lab { hub: format!("{base}-hub"), nodes: Vec::new(), relays: Vec::new() };
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
