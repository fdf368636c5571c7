//! What a node logs on a clean start and stop: one banner and one ready
//! line, nothing at WARN or ERROR (an ERROR means an operator should act),
//! raft's numeric node ids printed as node ids, openraft's own events at
//! narad's levels.

mod common;

use std::path::PathBuf;

use common::cluster::{Cluster, ClusterOpts};

/// Removes a directory when dropped, also when the test panics (the
/// harness keeps a failed cluster's directories; this test prints every
/// log it checks in its failure message instead).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// FNV-1a 64 of a node id: its raft node id.
fn raft_id(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// The level of a text log line (`<timestamp> <LEVEL> ...`), if it is one.
fn level(line: &str) -> Option<&str> {
    line.split_whitespace()
        .nth(1)
        .filter(|l| ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(l))
}

#[test]
fn a_clean_three_node_start_and_stop_logs_one_banner_one_ready_line_and_nothing_at_warn() {
    let mut c = Cluster::prepare(3, ClusterOpts::secure("quiet-start-secret-0123456789abcdef"));
    let _cleanup = RemoveOnDrop(c.root().clone());
    c.start_first(3);
    c.leader(std::time::Duration::from_secs(20));
    let statuses = c.terminate_all();
    for (i, st) in statuses.iter().enumerate() {
        assert!(st.is_some_and(|s| s.success()), "n{} exit {st:?}:\n{}", i + 1, c.node(i).log());
    }
    let ids: Vec<String> = (1..=3).map(|i| raft_id(&format!("n{i}")).to_string()).collect();
    for i in 0..3 {
        let node = c.node(i);
        let log = node.log();
        let loud: Vec<&str> =
            log.lines().filter(|l| matches!(level(l), Some("WARN" | "ERROR"))).collect();
        assert!(loud.is_empty(), "{} logged at WARN/ERROR: {loud:#?}\nwhole log:\n{log}", node.id);
        let banner: Vec<&str> = log.lines().filter(|l| l.contains("starting: node")).collect();
        assert_eq!(banner.len(), 1, "{}: one banner:\n{log}", node.id);
        let b = banner[0];
        for want in [
            format!(
                "narad {} starting: node {} of a cluster of 3",
                env!("CARGO_PKG_VERSION"),
                node.id
            ),
            format!("node_id={}", node.id),
            "mode=\"cluster\"".to_owned(),
            format!("http=http://127.0.0.1:{}", node.http_port),
            format!("cluster_addr=127.0.0.1:{}", node.cluster_port),
            format!("data_dir={}", node.data_dir.display()),
            format!("peers={}", c.peers()),
            "security=\"secured (cluster secret)\"".to_owned(),
        ] {
            assert!(b.contains(&want), "{}: the banner has {want:?}: {b}", node.id);
        }
        assert_eq!(level(b), Some("INFO"), "{b}");
        let ready: Vec<&str> = log.lines().filter(|l| l.contains("narad ready")).collect();
        assert_eq!(ready.len(), 1, "{}: one ready line:\n{log}", node.id);
        assert!(ready[0].contains("startup_ms="), "{}", ready[0]);
        assert!(log.contains("narad stopped"), "{}: a clean stop:\n{log}", node.id);
        for id in &ids {
            assert!(!log.contains(id.as_str()), "{}: raft id {id} printed:\n{log}", node.id);
        }
        assert!(!log.contains("openraft"), "{}: openraft's events are DEBUG:\n{log}", node.id);
    }
}

#[test]
fn at_debug_openraft_events_show_mapped_levels_and_node_ids() {
    let opts = ClusterOpts::dev().node_env(0, "NARAD_LOG_LEVEL", "debug");
    let mut c = Cluster::prepare(3, opts);
    let _cleanup = RemoveOnDrop(c.root().clone());
    c.start_first(3);
    c.leader(std::time::Duration::from_secs(20));
    c.terminate_all();
    let log = c.node(0).log();
    let raft: Vec<&str> = log.lines().filter(|l| l.contains("openraft")).collect();
    assert!(!raft.is_empty(), "openraft's events are shown at debug:\n{log}");
    for l in &raft {
        assert!(matches!(level(l), Some("DEBUG" | "TRACE")), "an openraft event above DEBUG: {l}");
    }
    for i in 1..=3 {
        let id = raft_id(&format!("n{i}")).to_string();
        assert!(!log.contains(&id), "raft id of n{i} printed as a number:\n{}", raft.join("\n"));
    }
    assert!(
        raft.iter().any(|l| l.contains("n2") || l.contains("n3")),
        "openraft's events name the peers by id:\n{}",
        raft.join("\n")
    );
}
