//! A full disk: the data directory on a small tmpfs. Produce until the WAL
//! cannot write: that produce gets 500, `narad_ingress_wal_failed` turns 1,
//! every later produce fails fast, `/readyz` answers 503 and says why,
//! consume keeps working.
//! Then free space and restart: every message acked before the failure is
//! delivered.
//!
//! Needs root (to mount tmpfs), as `.ci/run` has; elsewhere the test says
//! so and does nothing (the same path is covered in process on the
//! simulated disk by the WAL's and the power-loss simulation's ENOSPC
//! faults).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Server, assert_none_lost, temp_dir};

struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Option<Mount> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Mount(dir.to_path_buf()))
    }

    fn resize(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(st.success());
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A label-less metric's value.
fn gauge(s: &Server, name: &str) -> Option<f64> {
    common::metric(&s.get("/metrics").text().ok()?, &format!("{name} "), &[])
}

#[test]
fn a_full_disk_latches_produce_keeps_consume_and_loses_nothing_acked() {
    let root = temp_dir("diskfull");
    let mnt = root.join("mnt");
    let Some(mount) = Mount::tmpfs(&mnt, "24m") else {
        eprintln!(
            "disk full: cannot mount tmpfs here (not root?); covered in process by ENOSPC faults on SimFs"
        );
        return;
    };
    let mut s = Server::start_in(mnt.join("data"), root.join("server.log"));
    s.create_topic(r#"{"name":"full"}"#);
    let body = vec![b'z'; 64 << 10];
    let mut acked = Vec::new();
    let mut failed_at = None;
    for i in 0..2_000u32 {
        let mut payload = format!("{i:06}:").into_bytes();
        payload.extend_from_slice(&body);
        match s.produce("full", "", &payload) {
            202 => acked.push(i),
            500 => {
                failed_at = Some(i);
                break;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    let failed_at = failed_at.expect("the disk never filled");
    assert!(!acked.is_empty());
    assert_eq!(gauge(&s, "narad_ingress_wal_failed"), Some(1.0));
    // Every later produce fails fast, even a tiny one.
    let t = Instant::now();
    for _ in 0..5 {
        assert_eq!(s.produce("full", "", b"tiny"), 500);
    }
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "latched produces should fail fast: {:?}",
        t.elapsed()
    );
    // The node says it is not ready, and why; consume is unaffected.
    let ready = s.get("/readyz");
    assert_eq!(ready.status(), 503);
    let why = ready.text().unwrap();
    assert!(why.contains("ingress WAL failed"), "{why}");
    let r = s.get("/v1/topics/full/consume?wait=1s");
    assert!(r.status() == 200 || r.status() == 204, "{}", r.status());
    eprintln!("disk full: {} acked before the WAL latched at message {failed_at}", acked.len());
    // Free space, restart: everything acked is delivered.
    s.kill9();
    mount.resize("256m");
    s.restart();
    assert_eq!(gauge(&s, "narad_ingress_wal_failed"), Some(0.0));
    assert_eq!(s.get("/readyz").status(), 200);
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < acked.len() && Instant::now() < deadline {
        for p in s.drain("full") {
            let id: u32 = String::from_utf8_lossy(&p[..6]).parse().unwrap();
            seen.insert(id);
        }
    }
    assert_none_lost("after the disk filled", acked.iter().copied(), &seen);
    drop(s);
}
