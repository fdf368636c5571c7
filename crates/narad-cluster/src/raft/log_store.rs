//! The Raft log and vote of this node: one redb database,
//! `<data>/metastore/raft.redb`, reached through [`narad_fs`] with
//! narad-meta's [`FsBackend`] (the same door as `fsm.redb`).
//!
//! # Layout
//!
//! | table | key | value |
//! |---|---|---|
//! | `raft_meta` | `"format"` | record of the JSON number [`FORMAT_VERSION`] |
//! | `raft_meta` | `"vote"` | record of the last saved [`Vote`](openraft::Vote) as JSON |
//! | `raft_meta` | `"purged"` | record of the last purged [`LogId`] as JSON |
//! | `raft_log` | log index (u64) | record of the [`Entry`](openraft::Entry) as JSON |
//!
//! Every value is a record:
//!
//! ```text
//! record = magic "NRAF" | version u8 (1) | len u32 BE | crc32c u32 BE of the body | body (len bytes)
//! ```
//!
//! # Invariants
//!
//! * Entries are contiguous: the indexes present are exactly
//!   `first..=last` with `first = purged.index + 1` once anything was
//!   purged; truncate removes a suffix, purge a prefix (and records the
//!   last purged id in the same transaction), append extends the end.
//! * Every write (append, truncate, purge, vote) is one redb transaction
//!   with immediate durability and two-phase commit: it is on disk when
//!   the commit returns, and `append`'s flush callback and `save_vote`'s
//!   return come only after that. Writes are serialized (`&mut self`, each
//!   awaits its commit), as openraft requires.
//! * A failed commit latches the store: every later write fails with the
//!   first failure (the disk state after a failed fsync is unknown);
//!   reopening recovers whatever the disk holds.
//! * Reads check every record (magic, version, length, CRC) and fail as
//!   corrupt rather than hand openraft a damaged entry.
//! * The file is created whole: built as `raft.redb.tmp`, renamed into
//!   place, the directory fsynced.
//! * With a purge floor ([`LogStore::with_purge_floor`]: the state
//!   machine's durably applied index), a purge does not pass it at once.
//!   openraft 0.9 asks a follower installing a snapshot to purge up to the
//!   snapshot without waiting for the state machine to have it on disk,
//!   and a start whose log is purged past the state machine's applied
//!   entry is refused by openraft (its state check panics): after a power
//!   loss or a failed install in between, the node could not start again
//!   without an operator. The rest of such a purge is pending (in memory)
//!   and done in the first write after the floor reaches it, or in an
//!   append that would otherwise leave a gap below its entries (openraft
//!   believes them purged), so entries stay contiguous. That last case
//!   purges before the floor, as openraft would have: if such an append
//!   came before the install landed and the node then lost power, the old
//!   window would be back (not seen in the simulation: openraft answers an
//!   install only once it is installed, and the leader that sent it appends
//!   after the answer; only another leader's append could come first). Found
//!   by the metastore simulation (`tests/metastore_sim.rs`, seed 21: the
//!   install failed on a full disk after the purge landed).

use std::fmt::Debug;
use std::io;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use narad_fs::{Fs, OpenMode};
use narad_meta::FsBackend;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, LogId, RaftLogId, RaftLogReader, RaftTypeConfig, StorageIOError, Vote};
use redb::{Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The on-disk format of `raft.redb`.
pub const FORMAT_VERSION: u64 = 1;
/// The magic of every record.
pub const RECORD_MAGIC: [u8; 4] = *b"NRAF";
/// The record version this build writes and reads.
pub const RECORD_VERSION: u8 = 1;
/// Bytes before a record's body.
pub const RECORD_HEADER_LEN: usize = 4 + 1 + 4 + 4;

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const KEY_FORMAT: &str = "format";
const KEY_VOTE: &str = "vote";
const KEY_PURGED: &str = "purged";
/// redb's page cache for the log.
const CACHE_BYTES: usize = 16 << 20;

/// Where the Raft log lives under the data directory.
pub fn raft_log_path(data_dir: &Path) -> PathBuf {
    data_dir.join("metastore").join("raft.redb")
}

/// Encodes a record around `body`.
pub fn encode_record(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEADER_LEN + body.len());
    out.extend_from_slice(&RECORD_MAGIC);
    out.push(RECORD_VERSION);
    out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// The body of a record, checked.
pub fn decode_record(bytes: &[u8]) -> Result<&[u8], String> {
    let Some((header, body)) = bytes.split_first_chunk::<RECORD_HEADER_LEN>() else {
        return Err(format!("record of {} bytes is shorter than its header", bytes.len()));
    };
    if header[..4] != RECORD_MAGIC {
        return Err(format!("bad record magic {:02x?}", &header[..4]));
    }
    if header[4] != RECORD_VERSION {
        return Err(format!("unsupported record version {}", header[4]));
    }
    let len = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) as usize;
    if len != body.len() {
        return Err(format!("record announces {len} body bytes, holds {}", body.len()));
    }
    let crc = u32::from_be_bytes([header[9], header[10], header[11], header[12]]);
    if crc32c::crc32c(body) != crc {
        return Err("record CRC mismatch".to_owned());
    }
    Ok(body)
}

/// The stored form of a value (the format number, a vote, a log id, an
/// entry): a record around its JSON.
pub fn encode_value<T: Serialize>(value: &T) -> Vec<u8> {
    encode_record(&serde_json::to_vec(value).expect("raft log values always serialize"))
}

/// A value as read back: the record checked, then its JSON body decoded;
/// `what` names the value in the error.
pub fn decode_value<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, String> {
    let body = decode_record(bytes).map_err(|e| format!("{what}: {e}"))?;
    serde_json::from_slice(body).map_err(|e| format!("{what}: {e}"))
}

/// The log entry stored under key `index`: a value that holds that index.
pub fn decode_entry<C: RaftTypeConfig>(index: u64, bytes: &[u8]) -> Result<C::Entry, String> {
    let entry: C::Entry = decode_value(&format!("log entry {index}"), bytes)?;
    if entry.get_log_id().index != index {
        return Err(format!("log entry at key {index} holds index {}", entry.get_log_id().index));
    }
    Ok(entry)
}

/// Why opening the log failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot open the raft log {path}: {reason}")]
pub struct OpenError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub reason: String,
}

struct Shared {
    db: redb::Database,
    /// The disk is memory: redb work runs inline.
    inline: bool,
    /// The first failed write, which latches the store.
    poisoned: Mutex<Option<String>>,
    /// The highest index a purge may reach (`None` from it: none).
    floor: std::sync::OnceLock<PurgeFloor>,
    /// The rest of a purge held back at the floor: (index, stored log id).
    pending: Mutex<Option<(u64, Vec<u8>)>>,
}

/// The state machine's durably applied index, read at each purge.
pub type PurgeFloor = Box<dyn Fn() -> Option<u64> + Send + Sync>;

impl Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftLogDb").finish_non_exhaustive()
    }
}

/// The log store ([`RaftLogStorage`]).
#[derive(Debug)]
pub struct LogStore<C> {
    shared: Arc<Shared>,
    _types: PhantomData<fn() -> C>,
}

/// A reader of the log ([`RaftLogReader`]), for openraft's replication tasks.
#[derive(Debug)]
pub struct LogReader<C> {
    shared: Arc<Shared>,
    _types: PhantomData<fn() -> C>,
}

impl<C> Clone for LogReader<C> {
    fn clone(&self) -> Self {
        LogReader { shared: self.shared.clone(), _types: PhantomData }
    }
}

fn open_database(file: narad_fs::FileRef) -> Result<redb::Database, String> {
    redb::Builder::new()
        .set_cache_size(CACHE_BYTES)
        .create_with_backend(FsBackend::new(file))
        .map_err(|e| format!("open database: {e}"))
}

/// One durable write transaction.
fn write_txn(db: &redb::Database) -> Result<redb::WriteTransaction, String> {
    let mut txn = db.begin_write().map_err(|e| format!("begin write: {e}"))?;
    txn.set_durability(Durability::Immediate).map_err(|e| format!("set durability: {e}"))?;
    txn.set_two_phase_commit(true);
    Ok(txn)
}

/// Creates an initialised database at `path` atomically (tmp + rename).
fn create(fs: &dyn Fs, path: &Path) -> Result<(), String> {
    let tmp = narad_fs::tmp_sibling(path);
    let file = fs
        .open(&tmp, OpenMode::CreateOrTruncate)
        .map_err(|e| format!("create {}: {e}", tmp.display()))?;
    let db = open_database(file)?;
    let txn = write_txn(&db)?;
    (|| -> Result<(), redb::Error> {
        let mut meta = txn.open_table(META)?;
        meta.insert(KEY_FORMAT, encode_value(&FORMAT_VERSION).as_slice())?;
        drop(meta);
        txn.open_table(LOG)?;
        Ok(())
    })()
    .map_err(|e| format!("init: {e}"))?;
    txn.commit().map_err(|e| format!("commit init: {e}"))?;
    drop(db);
    fs.rename(&tmp, path).map_err(|e| format!("rename {} into place: {e}", tmp.display()))?;
    if let Some(dir) = path.parent() {
        fs.sync_dir(dir).map_err(|e| format!("sync {}: {e}", dir.display()))?;
    }
    Ok(())
}

impl<C: RaftTypeConfig> LogStore<C> {
    /// Opens (creating if needed) `<data_dir>/metastore/raft.redb`.
    pub fn open(fs: &dyn Fs, data_dir: &Path) -> Result<Self, OpenError> {
        let path = raft_log_path(data_dir);
        let named = |reason: String| OpenError { path: path.clone(), reason };
        let dir = path.parent().expect("the raft log has a directory");
        fs.create_dir_all(dir).map_err(|e| named(format!("create {}: {e}", dir.display())))?;
        if !fs.exists(&path).map_err(|e| named(format!("stat: {e}")))? {
            create(fs, &path).map_err(named)?;
        }
        let file = fs.open(&path, OpenMode::Existing).map_err(|e| named(format!("open: {e}")))?;
        let db = open_database(file).map_err(named)?;
        let format: u64 = {
            let txn = db.begin_read().map_err(|e| named(format!("read: {e}")))?;
            let meta = txn.open_table(META).map_err(|e| named(format!("read: {e}")))?;
            let row = meta.get(KEY_FORMAT).map_err(|e| named(format!("read: {e}")))?;
            let row = row.ok_or_else(|| named("no format row".to_owned()))?;
            decode_value("format", row.value()).map_err(named)?
        };
        if format != FORMAT_VERSION {
            return Err(named(format!(
                "format version {format} is not supported (this build reads version {FORMAT_VERSION})"
            )));
        }
        let shared = Arc::new(Shared {
            db,
            inline: fs.in_memory(),
            poisoned: Mutex::new(None),
            floor: std::sync::OnceLock::new(),
            pending: Mutex::new(None),
        });
        let store = LogStore { shared, _types: PhantomData };
        // Read everything once: a damaged record fails the open, not a
        // replication task later.
        let (first, last) = store.shared.bounds().map_err(named)?;
        store.shared.read_entries::<C>(first..=last).map_err(named)?;
        store.shared.vote::<C>().map_err(named)?;
        tracing::info!(path = %path.display(), first, last, "raft log opened");
        Ok(store)
    }
}

impl<C: RaftTypeConfig> LogStore<C> {
    /// On a pristine log (no entry, nothing purged, no vote), records
    /// `log_id` as purged, so the log starts after it, and answers true;
    /// on any other, changes nothing and answers false. For a group formed
    /// around state that no entry holds (see `raft::upgrade`): openraft
    /// sends a follower whose log is behind the purged id a snapshot.
    pub fn start_after(&self, log_id: &LogId<C::NodeId>) -> Result<bool, String> {
        let shared = &self.shared;
        let purged: Option<LogId<C::NodeId>> = shared.meta_row(KEY_PURGED)?;
        let pristine =
            purged.is_none() && shared.bounds()? == (1, 0) && shared.vote::<C>()?.is_none();
        if !pristine {
            return Ok(false);
        }
        let row = encode_value(log_id);
        shared.write(|txn| {
            let mut meta = txn.open_table(META).map_err(|e| format!("start after: {e}"))?;
            meta.insert(KEY_PURGED, row.as_slice()).map_err(|e| format!("start after: {e}"))?;
            Ok(())
        })?;
        Ok(true)
    }
}

impl<C> LogStore<C> {
    /// Purges from now on stop at `floor()`, the index the state machine
    /// has durably applied (see the module docs); the first floor set wins.
    pub fn with_purge_floor(self, floor: PurgeFloor) -> Self {
        let _ = self.shared.floor.set(floor);
        self
    }
}

/// Removes the entries up to `upto` and records `row` (its log id) as the
/// last purged, in `txn`.
fn purge_in(txn: &redb::WriteTransaction, upto: u64, row: &[u8]) -> Result<(), String> {
    let mut meta = txn.open_table(META).map_err(|e| format!("purge: {e}"))?;
    meta.insert(KEY_PURGED, row).map_err(|e| format!("purge: {e}"))?;
    let mut log = txn.open_table(LOG).map_err(|e| format!("purge: {e}"))?;
    log.retain_in(..=upto, |_, _| false).map_err(|e| format!("purge: {e}"))?;
    Ok(())
}

fn io_err(e: String) -> io::Error {
    io::Error::other(e)
}

impl Shared {
    fn check_poisoned(&self) -> Result<(), String> {
        match &*self.poisoned.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(first) => Err(format!("raft log unavailable after an earlier failure: {first}")),
            None => Ok(()),
        }
    }

    /// Runs one durable write; a failure latches the store.
    fn write(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), String>,
    ) -> Result<(), String> {
        self.write_purging(false, f)
    }

    /// Runs one durable write, with the pending purge if the floor reached
    /// it (or `force`); a failure latches the store.
    fn write_purging(
        &self,
        force: bool,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), String>,
    ) -> Result<(), String> {
        self.check_poisoned()?;
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let due = pending.filter(|(index, _)| {
            force || self.floor.get().and_then(|f| f()).is_some_and(|floor| floor >= *index)
        });
        let result = write_txn(&self.db).and_then(|txn| {
            if let Some((upto, row)) = &due {
                purge_in(&txn, *upto, row)?;
            }
            f(&txn)?;
            txn.commit().map_err(|e| format!("commit: {e}"))
        });
        if result.is_ok() && due.is_some() {
            *self.pending.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        if let Err(e) = &result {
            tracing::error!(error = %e, "raft log write failed; the log refuses writes until restart");
            self.poisoned
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| e.clone());
        }
        result
    }

    /// The first and last index present (`(1, 0)`-like empty range when none).
    fn bounds(&self) -> Result<(u64, u64), String> {
        let txn = self.db.begin_read().map_err(|e| format!("read: {e}"))?;
        let log = txn.open_table(LOG).map_err(|e| format!("read: {e}"))?;
        let first = log.first().map_err(|e| format!("read: {e}"))?.map(|(k, _)| k.value());
        let last = log.last().map_err(|e| format!("read: {e}"))?.map(|(k, _)| k.value());
        Ok(match (first, last) {
            (Some(f), Some(l)) => (f, l),
            _ => (1, 0),
        })
    }

    fn read_entries<C: RaftTypeConfig>(
        &self,
        range: impl RangeBounds<u64>,
    ) -> Result<Vec<C::Entry>, String> {
        let txn = self.db.begin_read().map_err(|e| format!("read: {e}"))?;
        let log = txn.open_table(LOG).map_err(|e| format!("read: {e}"))?;
        let mut out = Vec::new();
        let mut expect: Option<u64> = None;
        for row in log.range::<u64>(range).map_err(|e| format!("read: {e}"))? {
            let (k, v) = row.map_err(|e| format!("read: {e}"))?;
            let index = k.value();
            let entry = decode_entry::<C>(index, v.value())?;
            if expect.is_some_and(|e| e != index) {
                return Err(format!("hole in the raft log before index {index}"));
            }
            expect = Some(index + 1);
            out.push(entry);
        }
        Ok(out)
    }

    fn meta_row<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, String> {
        let txn = self.db.begin_read().map_err(|e| format!("read: {e}"))?;
        let meta = txn.open_table(META).map_err(|e| format!("read: {e}"))?;
        let row = meta.get(key).map_err(|e| format!("read: {e}"))?;
        row.map(|r| decode_value(key, r.value())).transpose()
    }

    fn vote<C: RaftTypeConfig>(&self) -> Result<Option<Vote<C::NodeId>>, String> {
        self.meta_row(KEY_VOTE)
    }
}

/// Runs blocking redb work off the async runtime (inline on a disk in
/// memory, see [`narad_fs::Fs::in_memory`]).
async fn blocking<T: Send + 'static>(
    inline: bool,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    if inline {
        return f();
    }
    tokio::task::spawn_blocking(f).await.map_err(|e| format!("raft log task: {e}"))?
}

fn to_range(range: impl RangeBounds<u64>) -> (Bound<u64>, Bound<u64>) {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

impl<C: RaftTypeConfig> RaftLogReader<C> for LogReader<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, openraft::StorageError<C::NodeId>> {
        let (shared, range) = (self.shared.clone(), to_range(range));
        blocking(shared.inline, move || shared.read_entries::<C>(range))
            .await
            .map_err(|e| StorageIOError::read_logs(AnyError::error(e)).into())
    }
}

impl<C: RaftTypeConfig> RaftLogReader<C> for LogStore<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, openraft::StorageError<C::NodeId>> {
        LogReader::<C> { shared: self.shared.clone(), _types: PhantomData }
            .try_get_log_entries(range)
            .await
    }
}

impl<C: RaftTypeConfig> RaftLogStorage<C> for LogStore<C> {
    type LogReader = LogReader<C>;

    async fn get_log_state(&mut self) -> Result<LogState<C>, openraft::StorageError<C::NodeId>> {
        let shared = self.shared.clone();
        blocking(shared.inline, move || {
            let purged: Option<LogId<C::NodeId>> = shared.meta_row(KEY_PURGED)?;
            let (_, last) = shared.bounds()?;
            let last_entry = shared.read_entries::<C>(last..=last)?;
            let last_log_id = last_entry.last().map(|e| e.get_log_id().clone()).or(purged.clone());
            Ok(LogState { last_purged_log_id: purged, last_log_id })
        })
        .await
        .map_err(|e| StorageIOError::read_logs(AnyError::error(e)).into())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader { shared: self.shared.clone(), _types: PhantomData }
    }

    async fn save_vote(
        &mut self,
        vote: &Vote<C::NodeId>,
    ) -> Result<(), openraft::StorageError<C::NodeId>> {
        let (shared, row) = (self.shared.clone(), encode_value(vote));
        blocking(shared.inline, move || {
            shared.write(|txn| {
                let mut meta = txn.open_table(META).map_err(|e| format!("vote: {e}"))?;
                meta.insert(KEY_VOTE, row.as_slice()).map_err(|e| format!("vote: {e}"))?;
                Ok(())
            })
        })
        .await
        .map_err(|e| StorageIOError::write_vote(AnyError::error(e)).into())
    }

    async fn read_vote(
        &mut self,
    ) -> Result<Option<Vote<C::NodeId>>, openraft::StorageError<C::NodeId>> {
        let shared = self.shared.clone();
        blocking(shared.inline, move || shared.vote::<C>())
            .await
            .map_err(|e| StorageIOError::read_vote(AnyError::error(e)).into())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<C>,
    ) -> Result<(), openraft::StorageError<C::NodeId>>
    where
        I: IntoIterator<Item = C::Entry> + Send,
        I::IntoIter: Send,
    {
        let rows: Vec<(u64, Vec<u8>)> =
            entries.into_iter().map(|e| (e.get_log_id().index, encode_value(&e))).collect();
        let shared = self.shared.clone();
        let first = rows.first().map(|(index, _)| *index);
        let result = blocking(shared.inline, move || {
            // openraft appends after what it believes purged: a purge still
            // pending below the new entries is done now, or they would
            // leave a gap. (The bounds are read only while one is pending.)
            let pending = shared.pending.lock().unwrap_or_else(|p| p.into_inner()).is_some();
            let gap =
                pending && first.is_some_and(|f| shared.bounds().is_ok_and(|(_, l)| f > l + 1));
            shared.write_purging(gap, |txn| {
                let mut log = txn.open_table(LOG).map_err(|e| format!("append: {e}"))?;
                for (index, row) in &rows {
                    log.insert(*index, row.as_slice()).map_err(|e| format!("append: {e}"))?;
                }
                Ok(())
            })
        })
        .await;
        // The entries are durable (or the write failed) before the callback.
        callback.log_io_completed(result.clone().map_err(io_err));
        result.map_err(|e| StorageIOError::write_logs(AnyError::error(e)).into())
    }

    async fn truncate(
        &mut self,
        log_id: LogId<C::NodeId>,
    ) -> Result<(), openraft::StorageError<C::NodeId>> {
        let (shared, since) = (self.shared.clone(), log_id.index);
        blocking(shared.inline, move || {
            shared.write(|txn| {
                let mut log = txn.open_table(LOG).map_err(|e| format!("truncate: {e}"))?;
                log.retain_in(since.., |_, _| false).map_err(|e| format!("truncate: {e}"))?;
                Ok(())
            })
        })
        .await
        .map_err(|e| StorageIOError::write_logs(AnyError::error(e)).into())
    }

    async fn purge(
        &mut self,
        log_id: LogId<C::NodeId>,
    ) -> Result<(), openraft::StorageError<C::NodeId>> {
        let shared = self.shared.clone();
        blocking(shared.inline, move || {
            let mut now = log_id.clone();
            if let Some(floor) = shared.floor.get() {
                let floor = floor().unwrap_or(0);
                if floor < log_id.index {
                    tracing::info!(
                        requested = log_id.index,
                        floor,
                        "raft log purge held back at the state machine's durably applied index"
                    );
                    *shared.pending.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some((log_id.index, encode_value(&log_id)));
                    match shared.read_entries::<C>(floor..=floor)?.first() {
                        Some(e) if floor > 0 => now = e.get_log_id().clone(),
                        _ => return Ok(()), // nothing to purge yet
                    }
                }
            }
            let row = encode_value(&now);
            shared.write(|txn| purge_in(txn, now.index, &row))
        })
        .await
        .map_err(|e| StorageIOError::write_logs(AnyError::error(e)).into())
    }
}

#[cfg(test)]
#[path = "log_store_tests.rs"]
mod tests;
