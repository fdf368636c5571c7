//! The cluster part of the configuration (SPEC §8 `cluster.*`, the
//! `security.cluster_tls_*` files and `NARAD_CLUSTER_SECRET`), checked as a
//! whole and resolved into [`ClusterSettings`] (narad-node's): what the control plane
//! needs to start, with every peer address a [`SocketAddr`].
//!
//! No peers configured (the default) means a single node: no settings
//! (`None`), no node RPC listener, today's direct-apply metastore. A peer
//! list (even one naming only this node) makes a Raft group of the peers.
//!
//! Rules, each with its own error naming the key:
//! * `cluster.addr` is a `host:port` socket address (the UDP address the
//!   node RPC listens on); loopback with `--dev` when peers are set; set
//!   (to other than its default) without peers is an error.
//! * `security.cluster_tls_{cert,key,ca}_file`: all three or none.
//! * with peers: `cluster.node_id` set; peer ids match
//!   `^[A-Za-z0-9._-]{1,64}$` and are unique; addresses resolve and are
//!   unique; their Raft ids ([`raft_id`]) are distinct; this node is
//!   listed, on `cluster.addr`'s port; with `--dev` every peer is on
//!   loopback.
//! * `cluster.initial_members`: only with peers, each one a peer, once.
//! * security on (no `--dev`) and peers set: `NARAD_CLUSTER_SECRET` or the
//!   cluster TLS files (or both), so only cluster nodes reach the node RPC.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use narad_node::settings::{ClusterAuth, ClusterSecret, TlsFiles};
pub use narad_node::settings::{
    ClusterPeer, ClusterSettings, NODE_ID_LEN_MAX, raft_id, validate_node_id,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::Config;

/// The environment variable of the cluster secret (a secret: never a file
/// key, masked when printed).
pub const CLUSTER_SECRET_ENV: &str = "NARAD_CLUSTER_SECRET";
/// The environment variable of the secret being rotated out.
pub const CLUSTER_SECRET_PREVIOUS_ENV: &str = "NARAD_CLUSTER_SECRET_PREVIOUS";
/// `cluster.addr` of a non-dev start.
pub const DEFAULT_CLUSTER_ADDR: &str = "0.0.0.0:7943";
/// `cluster.move_copy_rate`'s default: 32 MiB/s for the copy rounds of all
/// the moves to one node together (docs/CLUSTER.md "Partition moves").
pub const DEFAULT_MOVE_COPY_RATE: u64 = 32 << 20;
/// `cluster.addr` of a `--dev` start.
pub const DEFAULT_DEV_CLUSTER_ADDR: &str = "127.0.0.1:7943";
/// One entry of `cluster.peers`: `"id@host:port"` or `{id, addr}` in a
/// file, `id@host:port,...` in `NARAD_CLUSTER_PEERS`. Printed as
/// `"id@host:port"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    /// The peer's node id.
    pub id: String,
    /// Its cluster address, `host:port` (resolved at start).
    pub addr: String,
}

impl PeerSpec {
    /// Parses `id@host:port`.
    pub fn parse(s: &str) -> Result<PeerSpec, String> {
        match s.trim().split_once('@') {
            Some((id, addr)) if !id.is_empty() && !addr.is_empty() => {
                Ok(PeerSpec { id: id.to_owned(), addr: addr.to_owned() })
            }
            _ => Err(format!("peer {s:?} is not id@host:port")),
        }
    }
}

impl Serialize for PeerSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}@{}", self.id, self.addr))
    }
}

impl<'de> Deserialize<'de> for PeerSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PeerSpec, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Table {
            id: String,
            addr: String,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Table(Table),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("a peer is \"id@host:port\" or {id = \"...\", addr = \"...\"}")
        })? {
            Raw::Text(s) => PeerSpec::parse(&s).map_err(serde::de::Error::custom),
            Raw::Table(t) => {
                PeerSpec::parse(&format!("{}@{}", t.id, t.addr)).map_err(serde::de::Error::custom)
            }
        }
    }
}

/// The cluster TLS files of `security.*`: all three or none.
pub fn cluster_tls_files(c: &Config) -> Result<Option<TlsFiles>, String> {
    let s = &c.security;
    let path = |p: &str| (!p.is_empty()).then(|| PathBuf::from(p));
    narad_node::settings::tls_files(
        path(&s.cluster_tls_cert_file),
        path(&s.cluster_tls_key_file),
        path(&s.cluster_tls_ca_file),
    )
}

/// Resolves `host:port` to one socket address (the first the resolver
/// gives).
fn resolve_addr(addr: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    let mut all = addr.to_socket_addrs().map_err(|e| format!("cannot resolve {addr:?}: {e}"))?;
    all.next().ok_or_else(|| format!("{addr:?} resolves to no address"))
}

/// Two peers whose Raft ids (under `hash`) are equal, if any.
fn raft_id_collision<'a>(
    ids: impl Iterator<Item = &'a str>,
    hash: impl Fn(&str) -> u64,
) -> Option<(&'a str, &'a str)> {
    let mut seen: BTreeMap<u64, &str> = BTreeMap::new();
    for id in ids {
        if let Some(first) = seen.insert(hash(id), id) {
            return Some((first, id));
        }
    }
    None
}

/// Checks the cluster keys of `c` and resolves them: `None` for a single
/// node (no peers). `--dev` is `!c.security.enabled`.
pub fn resolve(c: &Config) -> Result<Option<ClusterSettings>, String> {
    let cl = &c.cluster;
    let dev = !c.security.enabled;
    let bind_addr: SocketAddr = cl.addr.parse().map_err(|e| {
        format!("cluster.addr ({:?}) is not a host:port socket address: {e}", cl.addr)
    })?;
    let tls = cluster_tls_files(c)?;
    if cl.peers.is_empty() {
        // A cluster address asks for a cluster: without peers this would be
        // a single node that writes state of its own, after which every
        // start with the right peers is refused (issue 35). (Set to exactly
        // its default it cannot be told from unset.)
        let default = if dev { DEFAULT_DEV_CLUSTER_ADDR } else { DEFAULT_CLUSTER_ADDR };
        if cl.addr != default {
            return Err(format!(
                "cluster.addr ({}) is set but cluster.peers is not: a cluster node needs its \
                 peers (--peers id@host:port,... or NARAD_CLUSTER_PEERS, this node included); \
                 a single node sets neither",
                cl.addr
            ));
        }
        if !cl.initial_members.is_empty() {
            return Err("cluster.initial_members needs cluster.peers (a single node has no \
                        members to bootstrap with)"
                .into());
        }
        return Ok(None);
    }
    if cl.node_id.is_empty() {
        return Err("cluster.node_id must be set when cluster.peers is (NARAD_NODE_ID or \
                    --node-id): peers are named by id"
            .into());
    }
    validate_node_id(&cl.node_id).map_err(|e| format!("cluster.node_id: {e}"))?;
    if dev && !bind_addr.ip().is_loopback() {
        return Err(format!(
            "cluster.addr ({bind_addr}) must be a loopback address with --dev (security is off)"
        ));
    }
    let mut peers: Vec<ClusterPeer> = Vec::with_capacity(cl.peers.len());
    let mut by_addr: BTreeMap<SocketAddr, &str> = BTreeMap::new();
    for spec in &cl.peers {
        validate_node_id(&spec.id).map_err(|e| format!("cluster.peers: {e}"))?;
        if peers.iter().any(|p| p.id == spec.id) {
            return Err(format!("cluster.peers: node id {:?} is listed twice", spec.id));
        }
        let addr = resolve_addr(&spec.addr)
            .map_err(|e| format!("cluster.peers: {}@{}: {e}", spec.id, spec.addr))?;
        if let Some(other) = by_addr.insert(addr, &spec.id) {
            return Err(format!(
                "cluster.peers: {other} and {} have the same address {addr}",
                spec.id
            ));
        }
        if dev && !addr.ip().is_loopback() {
            return Err(format!(
                "cluster.peers: {}@{} must be a loopback address with --dev (security is off)",
                spec.id, spec.addr
            ));
        }
        peers.push(ClusterPeer { id: spec.id.clone(), addr, raft_id: raft_id(&spec.id) });
    }
    if let Some((a, b)) = raft_id_collision(peers.iter().map(|p| p.id.as_str()), raft_id) {
        return Err(format!(
            "cluster.peers: {a} and {b} map to the same Raft node id (FNV-1a 64 of the id): \
             rename one"
        ));
    }
    let Some(me) = peers.iter().find(|p| p.id == cl.node_id) else {
        return Err(format!(
            "cluster.peers must include this node (cluster.node_id {:?}, as id@host:port)",
            cl.node_id
        ));
    };
    if me.addr.port() != bind_addr.port() {
        return Err(format!(
            "cluster.peers: this node's entry {}@{} must use cluster.addr's port {} (peers dial \
             it there)",
            me.id,
            me.addr,
            bind_addr.port()
        ));
    }
    let advertised_addr = me.addr;
    let mut listed = BTreeSet::new();
    for m in &cl.initial_members {
        if !peers.iter().any(|p| &p.id == m) {
            return Err(format!("cluster.initial_members: {m:?} is not in cluster.peers"));
        }
        if !listed.insert(m.as_str()) {
            return Err(format!("cluster.initial_members: {m:?} is listed twice"));
        }
    }
    let secret = match c.security.cluster_secret.as_deref() {
        Some(s) => Some(
            ClusterSecret::new(s.as_bytes()).map_err(|e| format!("{CLUSTER_SECRET_ENV}: {e}"))?,
        ),
        None => None,
    };
    let previous_secret = match c.security.cluster_secret_previous.as_deref() {
        Some(_) if secret.is_none() => {
            return Err(format!(
                "{CLUSTER_SECRET_PREVIOUS_ENV} is set without {CLUSTER_SECRET_ENV}: the previous \
                 secret is only accepted beside the current one (docs/CLUSTER.md, \
                 \"Rotating the secret\")"
            ));
        }
        Some(s) => Some(
            ClusterSecret::new(s.as_bytes())
                .map_err(|e| format!("{CLUSTER_SECRET_PREVIOUS_ENV}: {e}"))?,
        ),
        None => None,
    };
    if !dev && secret.is_none() && tls.is_none() {
        return Err(format!(
            "cluster.peers is set and security is on: set {CLUSTER_SECRET_ENV} (a secret shared \
             by every node) or security.cluster_tls_cert_file, security.cluster_tls_key_file \
             and security.cluster_tls_ca_file (mutual TLS), so that only cluster nodes reach \
             the node RPC"
        ));
    }
    Ok(Some(ClusterSettings {
        node_id: cl.node_id.clone(),
        bind_addr,
        advertised_addr,
        peers,
        initial_members: cl.initial_members.clone(),
        move_copy_rate: cl.move_copy_rate,
        auth: ClusterAuth { secret, previous_secret, tls, node_id: cl.node_id.clone() },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A secret of the minimum length.
    const LONG_SECRET: &str = "0123456789abcdef0123456789abcdef";
    use crate::config::Sources;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn load(pairs: &[(&str, &str)], dev: bool) -> Result<Config, String> {
        Config::load(Sources { env: env(pairs), dev, ..Default::default() })
    }

    const THREE: &str = "n1@127.0.0.1:7943,n2@127.0.0.1:7944,n3@127.0.0.1:7945";

    #[test]
    fn colliding_raft_ids_are_found() {
        let ids = ["a", "bb", "cc"];
        assert_eq!(raft_id_collision(ids.into_iter(), |s| s.len() as u64), Some(("bb", "cc")));
        assert_eq!(raft_id_collision(ids.into_iter(), raft_id), None);
    }

    #[test]
    fn no_peers_is_a_single_node() {
        let c = load(&[], false).unwrap();
        assert_eq!(c.cluster.addr, DEFAULT_CLUSTER_ADDR);
        assert!(resolve(&c).unwrap().is_none());
        let dev = load(&[], true).unwrap();
        assert_eq!(dev.cluster.addr, DEFAULT_DEV_CLUSTER_ADDR);
    }

    #[test]
    fn peers_from_the_environment_resolve_with_this_node_and_the_secret() {
        let c = load(
            &[
                ("NARAD_NODE_ID", "n2"),
                ("NARAD_CLUSTER_ADDR", "127.0.0.1:7944"),
                ("NARAD_CLUSTER_PEERS", THREE),
                ("NARAD_CLUSTER_INITIAL_MEMBERS", "n1, n2"),
                (CLUSTER_SECRET_ENV, LONG_SECRET),
            ],
            false,
        )
        .unwrap();
        let s = resolve(&c).unwrap().unwrap();
        assert_eq!(s.node_id, "n2");
        assert_eq!(s.bind_addr, "127.0.0.1:7944".parse().unwrap());
        assert_eq!(s.advertised_addr, "127.0.0.1:7944".parse().unwrap());
        let ids: Vec<&str> = s.peers.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["n1", "n2", "n3"]);
        assert_eq!(s.peers[2].addr, "127.0.0.1:7945".parse().unwrap());
        assert_eq!(s.peers[0].raft_id, raft_id("n1"));
        assert_eq!(s.others().count(), 2);
        assert_eq!(s.initial_members, ["n1", "n2"]);
        assert!(!s.join_only());
        assert!(s.auth.secret.is_some() && s.auth.tls.is_none());
        let shown = c.to_printable_json();
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn a_node_not_in_initial_members_is_join_only() {
        let c = load(
            &[
                ("NARAD_NODE_ID", "n3"),
                ("NARAD_CLUSTER_ADDR", "127.0.0.1:7945"),
                ("NARAD_CLUSTER_PEERS", THREE),
                ("NARAD_CLUSTER_INITIAL_MEMBERS", "n1,n2"),
            ],
            true,
        )
        .unwrap();
        let s = resolve(&c).unwrap().unwrap();
        assert!(s.join_only());
        assert!(s.auth.secret.is_none() && s.auth.tls.is_none(), "--dev: no secret needed");
    }

    #[test]
    fn peers_from_a_file_take_both_forms_and_tls_files_from_security() {
        let dir = std::env::temp_dir().join(format!("narad-cluster-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(
            &file,
            "[cluster]\nnode_id = \"a\"\naddr = \"0.0.0.0:9000\"\n\
             peers = [\"a@127.0.0.1:9000\", { id = \"b\", addr = \"localhost:9001\" }]\n\
             [security]\ncluster_tls_cert_file = \"c.pem\"\ncluster_tls_key_file = \"k.pem\"\n\
             cluster_tls_ca_file = \"ca.pem\"\n",
        )
        .unwrap();
        let c = Config::load(Sources { file: Some(&file), ..Default::default() }).unwrap();
        let s = resolve(&c).unwrap().unwrap();
        assert_eq!(s.peers[1].addr.port(), 9001);
        assert!(s.peers[1].addr.ip().is_loopback(), "localhost resolves");
        let tls = s.auth.tls.unwrap();
        assert_eq!(tls.ca, PathBuf::from("ca.pem"));
        assert!(s.auth.secret.is_none());
        let v: serde_json::Value = serde_json::from_str(&c.to_printable_json()).unwrap();
        assert_eq!(v["cluster"]["peers"][1], "b@localhost:9001");
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "[cluster]\npeers = [\"nope\"]\n").unwrap();
        let e = Config::load(Sources { file: Some(&bad), ..Default::default() }).unwrap_err();
        assert!(e.contains("cluster.peers") && e.contains("id@host:port"), "{e}");
        let secret = dir.join("secret.toml");
        std::fs::write(&secret, "[security]\ncluster_secret = \"x\"\n").unwrap();
        let e = Config::load(Sources { file: Some(&secret), ..Default::default() }).unwrap_err();
        assert!(e.contains("cluster_secret") && e.contains(CLUSTER_SECRET_ENV), "{e}");
    }

    /// Each rule, with the key its error names.
    #[test]
    fn each_cluster_rule_is_refused_naming_the_key() {
        let base = |extra: &[(&'static str, &'static str)]| {
            let mut v = vec![("NARAD_NODE_ID", "n1"), ("NARAD_CLUSTER_ADDR", "127.0.0.1:7943")];
            v.extend_from_slice(extra);
            v
        };
        type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, bool);
        let cases: Vec<Case> = vec![
            ("cluster.addr", base(&[("NARAD_CLUSTER_ADDR", "nope")]), true),
            (
                "must be set all or none; missing: key, ca",
                base(&[("NARAD_CLUSTER_TLS_CERT_FILE", "c.pem")]),
                true,
            ),
            (
                "cluster.initial_members needs cluster.peers",
                base(&[("NARAD_CLUSTER_INITIAL_MEMBERS", "n1")]),
                true,
            ),
            (
                "cluster.node_id must be set",
                vec![("NARAD_CLUSTER_PEERS", "n1@127.0.0.1:7943")],
                true,
            ),
            (
                "cluster.peers: node id \"n 2\"",
                base(&[("NARAD_CLUSTER_PEERS", THREE_BAD_ID)]),
                true,
            ),
            (
                "listed twice",
                base(&[("NARAD_CLUSTER_PEERS", "n1@127.0.0.1:7943,n1@127.0.0.1:7944")]),
                true,
            ),
            (
                "have the same address 127.0.0.1:7943",
                base(&[("NARAD_CLUSTER_PEERS", "n1@127.0.0.1:7943,n2@127.0.0.1:7943")]),
                true,
            ),
            (
                "cluster.peers: n2@no-such-host.invalid:1",
                base(&[("NARAD_CLUSTER_PEERS", "n1@127.0.0.1:7943,n2@no-such-host.invalid:1")]),
                true,
            ),
            (
                "must include this node",
                base(&[("NARAD_CLUSTER_PEERS", "n2@127.0.0.1:7944,n3@127.0.0.1:7945")]),
                true,
            ),
            (
                "must use cluster.addr's port 7943",
                base(&[("NARAD_CLUSTER_PEERS", "n1@127.0.0.1:8000,n2@127.0.0.1:7944")]),
                true,
            ),
            (
                "cluster.initial_members: \"n9\" is not in cluster.peers",
                base(&[("NARAD_CLUSTER_PEERS", THREE), ("NARAD_CLUSTER_INITIAL_MEMBERS", "n1,n9")]),
                true,
            ),
            (
                "cluster.initial_members: \"n1\" is listed twice",
                base(&[("NARAD_CLUSTER_PEERS", THREE), ("NARAD_CLUSTER_INITIAL_MEMBERS", "n1,n1")]),
                true,
            ),
            (
                "cluster.addr (0.0.0.0:7943) must be a loopback address with --dev",
                base(&[("NARAD_CLUSTER_ADDR", "0.0.0.0:7943"), ("NARAD_CLUSTER_PEERS", THREE)]),
                true,
            ),
            (
                "n2@10.0.0.2:7944 must be a loopback address with --dev",
                base(&[("NARAD_CLUSTER_PEERS", "n1@127.0.0.1:7943,n2@10.0.0.2:7944")]),
                true,
            ),
            (
                "set NARAD_CLUSTER_SECRET (a secret shared by every node) or \
                 security.cluster_tls_cert_file",
                base(&[("NARAD_CLUSTER_PEERS", THREE)]),
                false,
            ),
            (
                "NARAD_CLUSTER_SECRET: cluster transport config: the cluster secret has 1 \
                 characters; it must have at least 32 (generate one with `openssl rand -hex 32`)",
                base(&[("NARAD_CLUSTER_PEERS", THREE), (CLUSTER_SECRET_ENV, "a")]),
                false,
            ),
            (
                "NARAD_CLUSTER_SECRET_PREVIOUS: cluster transport config: the cluster secret has \
                 5 characters",
                base(&[
                    ("NARAD_CLUSTER_PEERS", THREE),
                    (CLUSTER_SECRET_ENV, LONG_SECRET),
                    (CLUSTER_SECRET_PREVIOUS_ENV, "short"),
                ]),
                false,
            ),
            (
                "NARAD_CLUSTER_SECRET_PREVIOUS is set without NARAD_CLUSTER_SECRET",
                base(&[("NARAD_CLUSTER_PEERS", THREE), (CLUSTER_SECRET_PREVIOUS_ENV, LONG_SECRET)]),
                true,
            ),
        ];
        for (needle, pairs, dev) in cases {
            let e = match load(&pairs, dev) {
                Ok(c) => panic!("{needle}: accepted {:?}", c.cluster),
                Err(e) => e,
            };
            assert!(e.contains(needle), "want {needle:?} in: {e}");
        }
        // The same secured config is accepted with the secret, or with TLS.
        let ok = base(&[("NARAD_CLUSTER_PEERS", THREE), (CLUSTER_SECRET_ENV, LONG_SECRET)]);
        assert!(load(&ok, false).is_ok());
        // A rotation: the current and the previous secret.
        let rotating = base(&[
            ("NARAD_CLUSTER_PEERS", THREE),
            (CLUSTER_SECRET_ENV, LONG_SECRET),
            (CLUSTER_SECRET_PREVIOUS_ENV, "fedcba9876543210fedcba9876543210"),
        ]);
        let s = resolve(&load(&rotating, false).unwrap()).unwrap().unwrap();
        assert!(s.auth.secret.is_some() && s.auth.previous_secret.is_some());
        assert_eq!(s.auth.node_id, "n1");
        let tls = base(&[
            ("NARAD_CLUSTER_PEERS", THREE),
            ("NARAD_CLUSTER_TLS_CERT_FILE", "c"),
            ("NARAD_CLUSTER_TLS_KEY_FILE", "k"),
            ("NARAD_CLUSTER_TLS_CA_FILE", "a"),
        ]);
        assert!(load(&tls, false).is_ok());
        // One peer naming only this node is a one-voter group.
        let one = base(&[("NARAD_CLUSTER_PEERS", "n1@127.0.0.1:7943")]);
        assert_eq!(resolve(&load(&one, true).unwrap()).unwrap().unwrap().peers.len(), 1);
    }

    const THREE_BAD_ID: &str = "n1@127.0.0.1:7943,n 2@127.0.0.1:7944";
}
