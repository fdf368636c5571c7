//! Raft's state machine: narad-meta's [`MetaStore`]. Committed entries are
//! applied with [`MetaStore::apply_entry`], which stores the entry's
//! [`AppliedState`] (last applied log id, membership) in the same redb
//! transaction as the command's effects, so the state machine is durable
//! entry by entry and a restart resumes after the last applied entry
//! instead of replaying from zero.
//!
//! A snapshot is [`MetaStore::export_snapshot`]'s self-checking bytes (the
//! whole state and the applied state); installing one is
//! [`MetaStore::install_snapshot`] (atomic: old or new state after a
//! crash). The current snapshot is kept in memory; after a restart the
//! first request for it exports the state as it is (every applied entry is
//! committed, so that is a valid snapshot).
//!
//! Applies and the (applied state, export) pair of a snapshot build run
//! under one gate, so a snapshot's metadata always matches its bytes even
//! though openraft builds snapshots concurrently with applying.

use std::io::Cursor;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use narad_fs::FsRef;
use narad_meta::MetaStore;
use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{AnyError, EntryPayload, RaftSnapshotBuilder, StorageIOError};

use super::log_store::PurgeFloor;
use super::metrics::RaftMetrics;
use super::types::{
    AppliedState, ApplyOutcome, Entry, LogId, NodeId, RaftNode, StorageError, StoredMembership,
    TypeConfig,
};

/// A snapshot's metadata and bytes.
type Stored = (SnapshotMeta<NodeId, RaftNode>, Vec<u8>);

/// A failure inside a blocking step, turned into openraft's error after.
enum Failure {
    Read(String),
    Write(String),
}

fn read(e: impl ToString) -> Failure {
    Failure::Read(e.to_string())
}

fn write(e: impl ToString) -> Failure {
    Failure::Write(e.to_string())
}

impl From<Failure> for StorageError {
    fn from(f: Failure) -> StorageError {
        match f {
            Failure::Read(e) => StorageIOError::read_state_machine(AnyError::error(e)).into(),
            Failure::Write(e) => StorageIOError::write_state_machine(AnyError::error(e)).into(),
        }
    }
}

struct Shared {
    meta: Arc<MetaStore>,
    fs: FsRef,
    /// Held by every apply and by a snapshot build's read of the state.
    gate: Mutex<()>,
    /// The last snapshot built or installed.
    current: Mutex<Option<Stored>>,
    metrics: RaftMetrics,
    /// Snapshots built by this process, for unique ids.
    built: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The state machine over a [`MetaStore`].
#[derive(Clone)]
pub struct StateMachine {
    shared: Arc<Shared>,
    /// [`DELAY_APPLY_ENV`]'s deadline, until the first apply passes it.
    delay_until: Option<Instant>,
}

impl std::fmt::Debug for StateMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateMachine").field("meta", &self.shared.meta).finish_non_exhaustive()
    }
}

/// Builds snapshots of the state machine.
#[derive(Debug, Clone)]
pub struct SnapshotBuilder {
    sm: StateMachine,
}

/// Test-only: applies nothing until this many milliseconds after the state
/// machine was opened (a restarted node whose catch-up is slow; issue 35
/// case 6). Unset or unparsable: no delay.
pub const DELAY_APPLY_ENV: &str = "NARAD_TEST_DELAY_RAFT_APPLY_MS";

/// When [`DELAY_APPLY_ENV`] lets the state machine apply again.
fn apply_delay_deadline() -> Option<Instant> {
    let ms: u64 = std::env::var(DELAY_APPLY_ENV).ok()?.trim().parse().ok()?;
    tracing::warn!(ms, "test hook: the raft state machine applies nothing for {ms} ms");
    Some(Instant::now() + std::time::Duration::from_millis(ms))
}

impl StateMachine {
    /// The state machine over `meta` (opened on `fs`).
    pub fn new(meta: Arc<MetaStore>, fs: FsRef, metrics: RaftMetrics) -> Self {
        StateMachine {
            delay_until: apply_delay_deadline(),
            shared: Arc::new(Shared {
                meta,
                fs,
                gate: Mutex::new(()),
                current: Mutex::new(None),
                metrics,
                built: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// The log store's purge floor ([`LogStore::with_purge_floor`]): the
    /// index of the last entry applied durably to this state machine
    /// (its applied state is stored in the same transaction as the entry's
    /// effects, or with an installed snapshot).
    ///
    /// [`LogStore::with_purge_floor`]: super::log_store::LogStore::with_purge_floor
    pub fn purge_floor(&self) -> PurgeFloor {
        let meta = self.shared.meta.clone();
        Box::new(move || Self::applied(&meta).ok()?.last_applied.map(|l| l.index))
    }

    /// The applied state stored with the last applied entry.
    fn applied(meta: &MetaStore) -> Result<AppliedState, String> {
        meta.raft_state().map_or(Ok(AppliedState::default()), |b| AppliedState::decode(&b))
    }

    /// Exports the state now, with its metadata (blocking).
    fn export(shared: &Shared) -> Result<Stored, String> {
        let (state, data) = {
            let _gate = lock(&shared.gate);
            let state = Self::applied(&shared.meta)?;
            let data = shared.meta.export_snapshot().map_err(|e| e.to_string())?;
            (state, data)
        };
        let n = shared.built.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = match &state.last_applied {
            Some(l) => format!("{}-{}-{}-{n}", l.leader_id.term, l.leader_id.node_id, l.index),
            None => format!("none-{n}"),
        };
        let meta = SnapshotMeta {
            last_log_id: state.last_applied,
            last_membership: state.membership,
            snapshot_id: id,
        };
        Ok((meta, data))
    }
}

/// Runs blocking metastore work off the async runtime (inline on a disk in
/// memory, see [`narad_fs::Fs::in_memory`]).
async fn blocking<T: Send + 'static>(
    inline: bool,
    f: impl FnOnce() -> Result<T, Failure> + Send + 'static,
) -> Result<T, StorageError> {
    if inline {
        return Ok(f()?);
    }
    Ok(tokio::task::spawn_blocking(f).await.map_err(write)??)
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let shared = self.sm.shared.clone();
        let built = blocking(shared.fs.in_memory(), move || {
            let (meta, data) = StateMachine::export(&shared).map_err(read)?;
            *lock(&shared.current) = Some((meta.clone(), data.clone()));
            Ok((meta, data))
        })
        .await?;
        tracing::info!(
            last_log_id = ?built.0.last_log_id,
            bytes = built.1.len(),
            "raft snapshot built"
        );
        Ok(Snapshot { meta: built.0, snapshot: Box::new(Cursor::new(built.1)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let state = Self::applied(&self.shared.meta).map_err(read)?;
        Ok((state.last_applied, state.membership))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyOutcome>, StorageError>
    where
        I: IntoIterator<Item = Entry> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        if let Some(until) = self.delay_until.take() {
            tokio::time::sleep_until(until.into()).await;
        }
        let shared = self.shared.clone();
        blocking(shared.fs.in_memory(), move || {
            let _gate = lock(&shared.gate);
            let mut state = Self::applied(&shared.meta).map_err(read)?;
            let mut out = Vec::with_capacity(entries.len());
            for entry in &entries {
                let start = Instant::now();
                state.last_applied = Some(entry.log_id);
                let command = match &entry.payload {
                    EntryPayload::Normal(c) => Some(c),
                    EntryPayload::Membership(m) => {
                        state.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                        None
                    }
                    EntryPayload::Blank => None,
                };
                let outcome = shared.meta.apply_entry(command, &state.encode()).map_err(write)?;
                shared.metrics.apply_duration.observe(start.elapsed().as_secs_f64());
                out.push(ApplyOutcome::new(outcome));
            }
            Ok(out)
        })
        .await
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder { sm: self.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, RaftNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let (shared, meta) = (self.shared.clone(), meta.clone());
        blocking(shared.fs.in_memory(), move || {
            let _gate = lock(&shared.gate);
            shared.meta.install_snapshot(&*shared.fs, &data).map_err(write)?;
            let state = Self::applied(&shared.meta).map_err(read)?;
            if state.last_applied != meta.last_log_id {
                return Err(write(format!(
                    "installed snapshot {} carries applied log id {:?}, its metadata says {:?}",
                    meta.snapshot_id, state.last_applied, meta.last_log_id
                )));
            }
            tracing::info!(
                snapshot = %meta.snapshot_id,
                last_log_id = ?meta.last_log_id,
                bytes = data.len(),
                "raft snapshot installed"
            );
            *lock(&shared.current) = Some((meta, data));
            Ok(())
        })
        .await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let shared = self.shared.clone();
        let current = blocking(shared.fs.in_memory(), move || {
            if let Some(c) = lock(&shared.current).clone() {
                return Ok(Some(c));
            }
            if shared.meta.raft_state().is_none() {
                return Ok(None); // nothing applied: no snapshot yet
            }
            let built = Some(StateMachine::export(&shared).map_err(read)?);
            *lock(&shared.current) = built.clone();
            Ok(built)
        })
        .await?;
        Ok(current.map(|(meta, data)| Snapshot { meta, snapshot: Box::new(Cursor::new(data)) }))
    }
}
