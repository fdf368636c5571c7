//! What a node does once its control plane stopped on a fatal Raft error
//! (a log or state machine write failed, e.g. on a full disk), and the
//! test hook that makes that write fail.
//!
//! A stopped control plane makes the node not ready (`/readyz` 503
//! naming it), refuses metadata writes (503) and shows `stopped: <why>`
//! in `GET /v1/cluster/status` (see `narad_cluster::raft::control`). The
//! Raft core is not restarted in place: its log store latched the failed
//! write (the disk state after a failed fsync is unknown) and the
//! metastore may hold a partial apply, and only reopening both from disk
//! is sound, which is what a process start does (and what the crash
//! tests prove safe). So [`restart_needed`] resolves once the metastore's
//! directory accepts a synced write again, and the server then stops
//! gracefully with an error, for its supervisor to start it afresh; it
//! catches up from the leader like any restarted node. Exiting at once
//! instead would crash-loop under a supervisor while the disk stays full,
//! and would hide the node's state from the operator: until the disk
//! recovers it stays up, not ready, and says why.
//!
//! Nothing acknowledged is at risk: records were fsynced into the ingress
//! WAL before their 202 and are dispatched after the restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use narad_cluster::raft::ControlPlane;
use narad_fs::{FaultFs, FaultRule, Fs, FsRef, OpenMode};

/// Why the server stops on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The control plane stopped on a fatal error and the disk recovered:
    /// a restart of the process brings it back.
    Restart(String),
    /// This node may not take part under its id (its data directory was
    /// wiped and the group knows it): a restart does not help.
    Refused(String),
}

/// How often a stopped control plane's disk is probed.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Bytes written (and fsynced) by one probe: more than a Raft entry of a
/// topic create, so a disk with room for this has room to restart on.
const PROBE_BYTES: usize = 64 << 10;

/// Test-only: while the file this names exists, every write and fsync of
/// the Raft log and state machine (`<data>/metastore/`) fails, through the
/// same file layer the real writes use (a full disk, without filling one).
pub const FAIL_RAFT_STORAGE_ENV: &str = "NARAD_TEST_FAIL_RAFT_STORAGE_WHILE";

/// How often the test hook looks for its file.
const HOOK_POLL: Duration = Duration::from_millis(100);

/// The metastore's directory (the Raft log and the state machine).
fn metastore_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("metastore")
}

/// `fs` for the control plane: `fs` itself, or (with
/// [`FAIL_RAFT_STORAGE_ENV`] set) `fs` whose writes under the metastore's
/// directory fail while the named file exists.
pub fn control_plane_fs(fs: FsRef, data_dir: &Path) -> FsRef {
    let Some(trigger) = std::env::var_os(FAIL_RAFT_STORAGE_ENV).filter(|v| !v.is_empty()) else {
        return fs;
    };
    let trigger = PathBuf::from(trigger);
    let faulty = FaultFs::new(fs);
    let rule = FaultRule {
        prefix: metastore_dir(data_dir),
        fail_writes: true,
        fail_syncs: true,
        fail_reads: false,
    };
    tracing::warn!(
        trigger = %trigger.display(),
        "test hook: raft storage writes fail while this file exists"
    );
    let hook = faulty.clone();
    std::thread::Builder::new()
        .name("raft-fault-hook".to_owned())
        .spawn(move || {
            let mut failing = false;
            loop {
                let now = trigger.exists();
                if now != failing {
                    failing = now;
                    hook.clear();
                    if now {
                        hook.add_rule(rule.clone());
                    }
                    tracing::warn!(failing, "test hook: raft storage writes failing");
                }
                std::thread::sleep(HOOK_POLL);
            }
        })
        .map(|_| ())
        .unwrap_or_else(|e| tracing::error!(error = %e, "test hook thread did not start"));
    Arc::new(faulty)
}

/// One synced write (and removal) of a scratch file in the metastore's
/// directory.
fn probe(fs: &dyn Fs, dir: &Path) -> std::io::Result<()> {
    let path = dir.join(".write-probe");
    let f = fs.open(&path, OpenMode::CreateOrTruncate)?;
    f.write_all_at(&vec![0xA5; PROBE_BYTES], 0)?;
    f.sync_data()?;
    drop(f);
    fs.remove_file(&path)
}

/// Resolves with a message for the operator once `control` stopped on a
/// fatal error and the metastore's directory accepts a synced write
/// again; never while the control plane runs.
pub async fn restart_needed(control: Arc<ControlPlane>, fs: FsRef, data_dir: PathBuf) -> Stop {
    let why = control.wait_stopped().await;
    if let Some(refused) = control.refused() {
        return Stop::Refused(refused);
    }
    let dir = metastore_dir(&data_dir);
    let mut reported = false;
    loop {
        let (f, d) = (fs.clone(), dir.clone());
        let probed = tokio::task::spawn_blocking(move || probe(&*f, &d))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        match probed {
            Ok(()) => {
                return Stop::Restart(format!(
                    "the control plane stopped ({why}) and {} accepts writes again: stopping so \
                     that the supervisor restarts this node (it catches up from the leader)",
                    dir.display()
                ));
            }
            Err(e) if !reported => {
                reported = true;
                tracing::error!(
                    dir = %dir.display(),
                    error = %e,
                    "the control plane stopped and its disk still refuses writes: free space \
                     (or fix the disk); this node stops for a restart once a write succeeds"
                );
            }
            Err(_) => {}
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}
