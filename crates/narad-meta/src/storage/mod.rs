//! The metastore on disk: one redb database, `<data>/metastore/fsm.redb`,
//! reached through [`narad_fs`] (see [`backend`]).
//!
//! # Layout
//!
//! | table | key | value |
//! |---|---|---|
//! | `meta` | `&str` | `u64`: `format` (= [`FORMAT_VERSION`]), `applied_index`, `versions.topics`, `versions.schemas`, `versions.assignments`, `versions.members`, `versions.users` |
//! | `topics` | name | the [`Topic`] record as JSON |
//! | `schemas` | (topic, version ≥ 1) | the schema text as the user sent it |
//! | `assignments` | (topic, partition) | the [`Assignment`] as JSON (`{"owner_id","target_id"?}`) |
//! | `members` | id | the [`Member`] as JSON |
//! | `users` | username | the [`User`] as JSON (with its bcrypt hash) |
//! | `raft` | `state` | opaque bytes the replicated control plane stores with each applied Raft entry (its last-applied log id and membership); absent on a single node |
//!
//! Format history, each upgraded in place at open in one transaction:
//! * 1 had no `users` table (the upgrade adds it, empty);
//! * 2 had no `attached_at_ms` in a child's parent link (the field is
//!   optional and reads as 0, so the upgrade only stamps the format; the
//!   bump makes an older build refuse a newer file by its format rather
//!   than call a record it cannot read corrupt);
//! * 3 had no `raft` table (the upgrade adds it, empty).
//!
//! # Invariants
//!
//! * One redb write transaction per applied command carries everything the
//!   command changed together with its index and the change counters, and
//!   is durable when the commit returns; a Raft entry's `raft` bytes ride
//!   in the same transaction as the command's effects (or alone, for an
//!   entry with no command or a command that failed to apply) (redb's immediate durability with
//!   two-phase commit: the data pages and the new commit slot are fsynced,
//!   then the slot is made primary and fsynced again, before it returns).
//! * Two-phase commit also means redb trusts only the primary slot at open:
//!   a damaged newest commit fails the open ("Primary is corrupted despite
//!   2-phase commit") instead of being replaced, silently, by the previous
//!   commit, as redb's one-phase recovery does.
//! * After each commit the applied index is also written to an independent
//!   record ([`applied`]); a metastore behind it is refused at open.
//! * Rows mirror the in-memory state exactly: a command rewrites every row
//!   of each key it touched (a topic's whole schema history, a topic's whole
//!   assignment set) from the state after the command.
//! * The state read back must pass [`MetaState::check_invariants`] and every
//!   stored schema must still compile; otherwise the open fails as corrupt.
//!
//! # What a crash may leave
//!
//! redb commits atomically: after a crash the file holds the state as of the
//! last command whose commit reached the disk, which is every command whose
//! apply returned `Ok` and perhaps the one in flight, never part of one. The
//! file is created whole: built and initialised as `fsm.redb.tmp`, then
//! renamed into place, so a crash during creation leaves no database (the
//! next open starts over) rather than a torn header. Installing a snapshot
//! ([`snapshot`]) builds the whole new database the same way and renames it
//! over the old one: a crash leaves the old database or the new one.

pub(crate) mod applied;
pub(crate) mod backend;
pub(crate) mod snapshot;

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;

use narad_fs::{Fs, OpenMode};
use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableError};

use crate::apply::{Applied, Dirty};
use crate::assignment::Assignment;
use crate::error::StorageError;
use crate::member::Member;
use crate::schema::SchemaHistory;
use crate::state::{MetaState, TopicAssignments, Versions};
use crate::topic::Topic;
use crate::user::User;
use backend::FsBackend;

/// The on-disk format this build reads and writes. A change to any table or
/// record shape takes the next number.
pub const FORMAT_VERSION: u64 = 4;

/// The first format (no `users` table), upgraded in place at open.
const FORMAT_V1: u64 = 1;

/// The format before parent links recorded their attach time, upgraded in
/// place at open.
const FORMAT_V2: u64 = 2;

/// The format before the `raft` table, upgraded in place at open.
const FORMAT_V3: u64 = 3;

/// redb's page cache for the metastore; reads are served from memory, so
/// this only bounds what commits and the open scan hold.
const CACHE_BYTES: usize = 16 << 20;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const TOPICS: TableDefinition<&str, &[u8]> = TableDefinition::new("topics");
const SCHEMAS: TableDefinition<(&str, u32), &str> = TableDefinition::new("schemas");
const ASSIGNMENTS: TableDefinition<(&str, u32), &[u8]> = TableDefinition::new("assignments");
const MEMBERS: TableDefinition<&str, &[u8]> = TableDefinition::new("members");
const USERS: TableDefinition<&str, &[u8]> = TableDefinition::new("users");
const RAFT: TableDefinition<&str, &[u8]> = TableDefinition::new("raft");

const KEY_FORMAT: &str = "format";
const KEY_APPLIED: &str = "applied_index";
const KEY_RAFT_STATE: &str = "state";
const KEY_VERSIONS: [&str; 5] = [
    "versions.topics",
    "versions.schemas",
    "versions.assignments",
    "versions.members",
    "versions.users",
];

fn versions_array(v: &Versions) -> [u64; 5] {
    [v.topics, v.schemas, v.assignments, v.members, v.users]
}

/// The Raft state stored beside the metastore's state (`None`: never set).
pub(crate) type RaftState = Option<Vec<u8>>;

fn redb_err(context: &'static str) -> impl FnOnce(redb::Error) -> StorageError {
    move |e| StorageError::redb(context, e)
}

/// The open database.
#[derive(Debug)]
pub(crate) struct MetaDb {
    db: redb::Database,
}

impl MetaDb {
    /// Opens (creating if needed) the database at `path` and reads the state
    /// and the Raft state stored with it.
    pub(crate) fn open(
        fs: &dyn Fs,
        path: &Path,
    ) -> Result<(MetaDb, MetaState, RaftState), StorageError> {
        let io_err =
            |context: String| move |source: io::Error| StorageError::Io { context, source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs.create_dir_all(dir).map_err(io_err(format!("create {}", dir.display())))?;
        }
        if !fs.exists(path).map_err(io_err(format!("stat {}", path.display())))? {
            create(fs, path, &MetaState::default(), None)?;
        }
        let file = fs
            .open(path, OpenMode::Existing)
            .map_err(io_err(format!("open {}", path.display())))?;
        let meta_db = MetaDb { db: open_database(file)? };
        meta_db.upgrade()?;
        let (state, raft_state) = meta_db.load()?.ok_or_else(|| {
            StorageError::Corrupt(format!("{} holds no metastore tables", path.display()))
        })?;
        Ok((meta_db, state, raft_state))
    }

    /// Replaces the database at `path` with one holding `state` and
    /// `raft_state`, atomically (built whole beside it, then renamed over
    /// it: see [`create`]). The caller reopens it with [`MetaDb::open`].
    pub(crate) fn replace(
        fs: &dyn Fs,
        path: &Path,
        state: &MetaState,
        raft_state: Option<&[u8]>,
    ) -> Result<(), StorageError> {
        create(fs, path, state, raft_state)
    }

    /// Brings a database of an older format to the current one (see the
    /// format history in the module docs), in one transaction.
    fn upgrade(&self) -> Result<(), StorageError> {
        let mut txn = self.db.begin_write().map_err(|e| StorageError::redb("begin upgrade", e))?;
        txn.set_two_phase_commit(true);
        let upgraded = (|| -> Result<Option<u64>, redb::Error> {
            let mut meta = txn.open_table(META)?;
            let from = match meta.get(KEY_FORMAT)?.map(|g| g.value()) {
                Some(v @ (FORMAT_V1 | FORMAT_V2 | FORMAT_V3)) => v,
                _ => return Ok(None),
            };
            meta.insert(KEY_FORMAT, FORMAT_VERSION)?;
            drop(meta);
            if from == FORMAT_V1 {
                txn.open_table(USERS)?;
            }
            txn.open_table(RAFT)?;
            Ok(Some(from))
        })()
        .map_err(redb_err("upgrade"))?;
        if let Some(from) = upgraded {
            txn.commit().map_err(|e| StorageError::redb("commit upgrade", e))?;
            tracing::info!(from, to = FORMAT_VERSION, "metastore format upgraded");
        } else {
            txn.abort().map_err(|e| StorageError::redb("abort upgrade", e))?;
        }
        Ok(())
    }

    /// Reads the whole state and the Raft state; `None` for a database
    /// never initialised.
    fn load(&self) -> Result<Option<(MetaState, RaftState)>, StorageError> {
        let read = |e: redb::Error| StorageError::redb("read", e);
        let txn = self.db.begin_read().map_err(|e| read(e.into()))?;
        let meta = match txn.open_table(META) {
            Ok(t) => t,
            Err(TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(read(e.into())),
        };
        let get = |key: &str| -> Result<u64, StorageError> {
            let v = meta.get(key).map_err(|e| read(e.into()))?;
            v.map(|g| g.value())
                .ok_or_else(|| StorageError::Corrupt(format!("no meta row {key:?}")))
        };
        let format = get(KEY_FORMAT)?;
        if format != FORMAT_VERSION {
            return Err(StorageError::UnsupportedFormat {
                found: format,
                supported: FORMAT_VERSION,
            });
        }
        let mut state = MetaState { applied_index: get(KEY_APPLIED)?, ..MetaState::default() };
        let [topics, schemas, assignments, members, users] = KEY_VERSIONS;
        state.versions = Versions {
            topics: get(topics)?,
            schemas: get(schemas)?,
            assignments: get(assignments)?,
            members: get(members)?,
            users: get(users)?,
        };
        state.topics = Arc::new(load_topics(&txn)?);
        state.schemas = Arc::new(load_schemas(&txn)?);
        state.assignments = Arc::new(load_assignments(&txn)?);
        state.members = Arc::new(load_members(&txn)?);
        state.users = Arc::new(load_users(&txn)?);
        state.check_invariants().map_err(StorageError::Corrupt)?;
        let raft = txn.open_table(RAFT).map_err(read_err)?;
        let raft_state = raft.get(KEY_RAFT_STATE).map_err(read_err)?.map(|g| g.value().to_vec());
        Ok(Some((state, raft_state)))
    }

    /// Persists one applied command (its changed rows, its index and the
    /// counters) and/or the Raft state that goes with it, in one
    /// transaction, durable when this returns.
    pub(crate) fn commit(
        &self,
        applied: Option<&Applied>,
        raft_state: Option<&[u8]>,
    ) -> Result<(), StorageError> {
        let mut txn = self.db.begin_write().map_err(|e| StorageError::redb("begin write", e))?;
        txn.set_two_phase_commit(true);
        (|| -> Result<(), redb::Error> {
            if let Some(applied) = applied {
                write_changes(&txn, &applied.state, &applied.dirty)?;
            }
            if let Some(raft_state) = raft_state {
                txn.open_table(RAFT)?.insert(KEY_RAFT_STATE, raft_state)?;
            }
            Ok(())
        })()
        .map_err(redb_err("write"))?;
        txn.commit().map_err(|e| StorageError::redb("commit", e))
    }
}

fn open_database(file: narad_fs::FileRef) -> Result<redb::Database, StorageError> {
    redb::Builder::new()
        .set_cache_size(CACHE_BYTES)
        .create_with_backend(FsBackend::new(file))
        .map_err(|e| StorageError::redb("open database", e))
}

/// Creates a database holding `state` (and `raft_state`) at `path`
/// atomically: it is built and committed (fsynced) in `<path>.tmp`, closed,
/// and renamed over `path` (the rename syncs the directory), so a crash
/// leaves whatever was at `path` before (no database, or the old one, and
/// maybe a stale temporary file, which the next attempt truncates) or the
/// complete new one.
fn create(
    fs: &dyn Fs,
    path: &Path,
    state: &MetaState,
    raft_state: Option<&[u8]>,
) -> Result<(), StorageError> {
    let tmp = narad_fs::tmp_sibling(path);
    let io_err = |context: String| move |source: io::Error| StorageError::Io { context, source };
    let file = fs
        .open(&tmp, OpenMode::CreateOrTruncate)
        .map_err(io_err(format!("create {}", tmp.display())))?;
    let db = open_database(file)?;
    let mut txn = db.begin_write().map_err(|e| StorageError::redb("begin init", e))?;
    txn.set_two_phase_commit(true);
    (|| -> Result<(), redb::Error> {
        init_tables(&txn)?;
        write_changes(&txn, state, &every_key(state))?;
        if let Some(raft_state) = raft_state {
            txn.open_table(RAFT)?.insert(KEY_RAFT_STATE, raft_state)?;
        }
        Ok(())
    })()
    .map_err(redb_err("init"))?;
    txn.commit().map_err(|e| StorageError::redb("commit init", e))?;
    drop(db);
    fs.rename(&tmp, path).map_err(io_err(format!("rename {} into place", tmp.display())))
}

fn init_tables(txn: &redb::WriteTransaction) -> Result<(), redb::Error> {
    let mut meta = txn.open_table(META)?;
    meta.insert(KEY_FORMAT, FORMAT_VERSION)?;
    meta.insert(KEY_APPLIED, 0)?;
    for key in KEY_VERSIONS {
        meta.insert(key, 0)?;
    }
    txn.open_table(TOPICS)?;
    txn.open_table(SCHEMAS)?;
    txn.open_table(ASSIGNMENTS)?;
    txn.open_table(MEMBERS)?;
    txn.open_table(USERS)?;
    txn.open_table(RAFT)?;
    Ok(())
}

/// Every key of `state`, as if one command had written them all.
fn every_key(state: &MetaState) -> Dirty {
    Dirty {
        topics: state.topics.keys().cloned().collect(),
        schemas: state.schemas.keys().cloned().collect(),
        assignments: state.assignments.keys().cloned().collect(),
        members: state.members.keys().cloned().collect(),
        users: state.users.keys().cloned().collect(),
    }
}

fn write_changes(
    txn: &redb::WriteTransaction,
    state: &MetaState,
    dirty: &Dirty,
) -> Result<(), redb::Error> {
    let mut topics = txn.open_table(TOPICS)?;
    for name in &dirty.topics {
        match state.topics.get(name) {
            Some(t) => topics.insert(name.as_str(), encode(t.as_ref()).as_slice())?,
            None => topics.remove(name.as_str())?,
        };
    }
    let mut schemas = txn.open_table(SCHEMAS)?;
    for name in &dirty.schemas {
        let name = name.as_str();
        schemas.retain_in((name, 0u32)..=(name, u32::MAX), |_, _| false)?;
        for (i, raw) in state.schemas.get(name).iter().flat_map(|h| h.versions().iter().enumerate())
        {
            schemas.insert((name, i as u32 + 1), raw.as_ref())?;
        }
    }
    let mut assignments = txn.open_table(ASSIGNMENTS)?;
    for name in &dirty.assignments {
        let name = name.as_str();
        assignments.retain_in((name, 0u32)..=(name, u32::MAX), |_, _| false)?;
        for (p, a) in state.assignments.get(name).iter().flat_map(|parts| parts.iter()) {
            assignments.insert((name, *p), encode(a).as_slice())?;
        }
    }
    let mut members = txn.open_table(MEMBERS)?;
    for id in &dirty.members {
        match state.members.get(id) {
            Some(m) => members.insert(id.as_str(), encode(m.as_ref()).as_slice())?,
            None => members.remove(id.as_str())?,
        };
    }
    let mut users = txn.open_table(USERS)?;
    for name in &dirty.users {
        match state.users.get(name) {
            Some(u) => users.insert(name.as_str(), encode(u.as_ref()).as_slice())?,
            None => users.remove(name.as_str())?,
        };
    }
    let mut meta = txn.open_table(META)?;
    meta.insert(KEY_APPLIED, state.applied_index)?;
    for (key, value) in KEY_VERSIONS.into_iter().zip(versions_array(&state.versions)) {
        meta.insert(key, value)?;
    }
    Ok(())
}

fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("metastore records always serialize")
}

fn decode<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, StorageError> {
    serde_json::from_slice(bytes).map_err(|e| StorageError::Corrupt(format!("{what}: {e}")))
}

fn read_err(e: impl Into<redb::Error>) -> StorageError {
    StorageError::redb("read", e)
}

fn load_topics(txn: &redb::ReadTransaction) -> Result<BTreeMap<String, Arc<Topic>>, StorageError> {
    let table = txn.open_table(TOPICS).map_err(read_err)?;
    let mut out = BTreeMap::new();
    for row in table.iter().map_err(read_err)? {
        let (k, v) = row.map_err(read_err)?;
        let name = k.value().to_owned();
        let topic: Topic = decode(&format!("topic {name:?}"), v.value())?;
        out.insert(name, Arc::new(topic));
    }
    Ok(out)
}

fn load_schemas(
    txn: &redb::ReadTransaction,
) -> Result<BTreeMap<String, Arc<SchemaHistory>>, StorageError> {
    let table = txn.open_table(SCHEMAS).map_err(read_err)?;
    let mut texts: BTreeMap<String, Vec<Arc<str>>> = BTreeMap::new();
    for row in table.iter().map_err(read_err)? {
        let (k, v) = row.map_err(read_err)?;
        let (name, version) = k.value();
        let versions = texts.entry(name.to_owned()).or_default();
        if version as usize != versions.len() + 1 {
            return Err(StorageError::Corrupt(format!(
                "schema versions of {name:?} are not dense: found {version} after {}",
                versions.len()
            )));
        }
        versions.push(Arc::from(v.value()));
    }
    texts
        .into_iter()
        .map(|(name, versions)| {
            let history = SchemaHistory::from_versions(versions).map_err(|e| {
                StorageError::Corrupt(format!("stored schema of {name:?} does not compile: {e}"))
            })?;
            Ok((name, Arc::new(history)))
        })
        .collect()
}

fn load_assignments(
    txn: &redb::ReadTransaction,
) -> Result<BTreeMap<String, Arc<TopicAssignments>>, StorageError> {
    let table = txn.open_table(ASSIGNMENTS).map_err(read_err)?;
    let mut out: BTreeMap<String, TopicAssignments> = BTreeMap::new();
    for row in table.iter().map_err(read_err)? {
        let (k, v) = row.map_err(read_err)?;
        let (name, partition) = k.value();
        let a: Assignment = decode(&format!("assignment {name:?}/{partition}"), v.value())?;
        out.entry(name.to_owned()).or_default().insert(partition, a);
    }
    Ok(out.into_iter().map(|(k, v)| (k, Arc::new(v))).collect())
}

fn load_members(
    txn: &redb::ReadTransaction,
) -> Result<BTreeMap<String, Arc<Member>>, StorageError> {
    let table = txn.open_table(MEMBERS).map_err(read_err)?;
    let mut out = BTreeMap::new();
    for row in table.iter().map_err(read_err)? {
        let (k, v) = row.map_err(read_err)?;
        let id = k.value().to_owned();
        let member: Member = decode(&format!("member {id:?}"), v.value())?;
        out.insert(id, Arc::new(member));
    }
    Ok(out)
}

fn load_users(txn: &redb::ReadTransaction) -> Result<BTreeMap<String, Arc<User>>, StorageError> {
    let table = txn.open_table(USERS).map_err(read_err)?;
    let mut out = BTreeMap::new();
    for row in table.iter().map_err(read_err)? {
        let (k, v) = row.map_err(read_err)?;
        let name = k.value().to_owned();
        let user: User = decode(&format!("user {name:?}"), v.value())?;
        out.insert(name, Arc::new(user));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use narad_fs::SimFs;

    use super::*;
    use crate::member::MemberStatus;
    use crate::topic::ParentLink;

    fn path() -> PathBuf {
        PathBuf::from("/d/metastore/fsm.redb")
    }

    /// Opens, lets `edit` write raw rows, closes, and reopens.
    fn reopen_after(edit: impl FnOnce(&redb::WriteTransaction)) -> Result<MetaState, StorageError> {
        let fs = SimFs::new(1);
        let (db, ..) = MetaDb::open(&fs, &path()).unwrap();
        let txn = db.db.begin_write().unwrap();
        edit(&txn);
        txn.commit().unwrap();
        drop(db);
        MetaDb::open(&fs, &path()).map(|(_, state, _)| state)
    }

    #[test]
    fn a_newer_format_is_refused() {
        let e = reopen_after(|txn| {
            txn.open_table(META).unwrap().insert(KEY_FORMAT, 5).unwrap();
        })
        .unwrap_err();
        assert!(matches!(e, StorageError::UnsupportedFormat { found: 5, supported: 4 }), "{e}");
    }

    #[test]
    fn a_format_1_file_gains_the_users_table_and_the_current_format_at_open() {
        let fs = SimFs::new(1);
        let (db, ..) = MetaDb::open(&fs, &path()).unwrap();
        let txn = db.db.begin_write().unwrap();
        txn.delete_table(USERS).unwrap();
        txn.open_table(META).unwrap().insert(KEY_FORMAT, FORMAT_V1).unwrap();
        txn.commit().unwrap();
        drop(db);
        let (db, state, _) = MetaDb::open(&fs, &path()).unwrap();
        assert_eq!(state.users().count(), 0);
        let txn = db.db.begin_read().unwrap();
        let format = txn.open_table(META).unwrap().get(KEY_FORMAT).unwrap().unwrap().value();
        assert_eq!(format, FORMAT_VERSION);
        txn.open_table(USERS).unwrap();
    }

    #[test]
    fn a_format_2_file_with_links_without_attach_times_opens_as_the_current_format() {
        let fs = SimFs::new(1);
        let (db, ..) = MetaDb::open(&fs, &path()).unwrap();
        let txn = db.db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(META).unwrap();
            meta.insert(KEY_FORMAT, FORMAT_V2).unwrap();
            meta.insert(KEY_APPLIED, 2).unwrap();
            let mut topics = txn.open_table(TOPICS).unwrap();
            let parent = r#"{"name":"p","incarnation":1,"partitions":3,"retention_ms":0,"visibility_timeout_ms":30000,"max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1700000000,"children":["c"]}"#;
            let child = r#"{"name":"c","incarnation":2,"partitions":3,"retention_ms":0,"visibility_timeout_ms":30000,"max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1700000000,"parent":{"name":"p","attach_epoch":"00000000000000ff","fanout_delay_ms":0}}"#;
            topics.insert("p", parent.as_bytes()).unwrap();
            topics.insert("c", child.as_bytes()).unwrap();
        }
        txn.commit().unwrap();
        drop(db);
        let (db, state, _) = MetaDb::open(&fs, &path()).unwrap();
        let link = state.topic("c").unwrap().parent().unwrap().clone();
        assert_eq!((link.name.as_str(), link.attached_at_ms), ("p", 0));
        let txn = db.db.begin_read().unwrap();
        let format = txn.open_table(META).unwrap().get(KEY_FORMAT).unwrap().unwrap().value();
        assert_eq!(format, FORMAT_VERSION);
    }

    #[test]
    fn a_format_3_file_gains_the_raft_table_and_the_current_format_at_open() {
        let fs = SimFs::new(1);
        let (db, ..) = MetaDb::open(&fs, &path()).unwrap();
        let txn = db.db.begin_write().unwrap();
        txn.delete_table(RAFT).unwrap();
        txn.open_table(META).unwrap().insert(KEY_FORMAT, FORMAT_V3).unwrap();
        txn.commit().unwrap();
        drop(db);
        let (db, _, raft_state) = MetaDb::open(&fs, &path()).unwrap();
        assert_eq!(raft_state, None);
        db.commit(None, Some(b"r")).unwrap();
        drop(db);
        let (db, _, raft_state) = MetaDb::open(&fs, &path()).unwrap();
        assert_eq!(raft_state.as_deref(), Some(&b"r"[..]));
        let txn = db.db.begin_read().unwrap();
        let format = txn.open_table(META).unwrap().get(KEY_FORMAT).unwrap().unwrap().value();
        assert_eq!(format, FORMAT_VERSION);
    }

    #[test]
    fn an_undecodable_record_is_corrupt() {
        let e = reopen_after(|txn| {
            txn.open_table(TOPICS).unwrap().insert("t", b"{".as_slice()).unwrap();
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("metastore is corrupt: topic \"t\""), "{e}");
    }

    #[test]
    fn a_state_that_breaks_an_invariant_is_corrupt() {
        let e = reopen_after(|txn| {
            txn.open_table(SCHEMAS).unwrap().insert(("ghost", 1), "{}").unwrap();
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "metastore is corrupt: schemas of missing topic \"ghost\"");
    }

    #[test]
    fn a_gap_in_schema_versions_is_corrupt() {
        let e = reopen_after(|txn| {
            txn.open_table(SCHEMAS).unwrap().insert(("t", 2), "{}").unwrap();
        })
        .unwrap_err();
        assert!(e.to_string().contains("not dense"), "{e}");
    }

    #[test]
    fn records_encode_to_the_golden_bytes() {
        let topic = Topic {
            name: "c".into(),
            incarnation: 9,
            partitions: 3,
            retention_ms: 0,
            visibility_timeout_ms: 30_000,
            max_in_flight_per_partition: 1024,
            max_acked_ahead_per_partition: 1024,
            created_at: 1_700_000_000,
            owner: String::new(),
            children: Vec::new(),
            parent: Some(ParentLink {
                name: "p".into(),
                attach_epoch: "00000000000000ff".into(),
                fanout_delay_ms: 0,
                attached_at_ms: 1_700_000_000_250,
            }),
        };
        let golden = r#"{"name":"c","incarnation":9,"partitions":3,"retention_ms":0,"visibility_timeout_ms":30000,"max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1700000000,"parent":{"name":"p","attach_epoch":"00000000000000ff","fanout_delay_ms":0,"attached_at_ms":1700000000250}}"#;
        assert_eq!(String::from_utf8(encode(&topic)).unwrap(), golden);
        assert_eq!(decode::<Topic>("t", golden.as_bytes()).unwrap(), topic);

        let a = Assignment {
            owner_id: "n1".into(),
            target_id: None,
            base_offset: None,
            move_attempt: None,
        };
        assert_eq!(encode(&a), br#"{"owner_id":"n1"}"#);
        // A move in flight names its attempt (the index of its
        // SetAssignmentTarget).
        let a = Assignment {
            owner_id: "n1".into(),
            target_id: Some("n3".into()),
            base_offset: None,
            move_attempt: Some(4321),
        };
        let golden = br#"{"owner_id":"n1","target_id":"n3","move_attempt":4321}"#;
        assert_eq!(encode(&a), golden);
        assert_eq!(decode::<Assignment>("a", golden).unwrap(), a);
        // A partition of a removed member (op 17) carries its start offset;
        // records without it (every one written before it existed) read
        // back with none.
        let a = Assignment {
            owner_id: "n2".into(),
            target_id: None,
            base_offset: Some(1_048_600),
            move_attempt: None,
        };
        let golden = br#"{"owner_id":"n2","base_offset":1048600}"#;
        assert_eq!(encode(&a), golden);
        assert_eq!(decode::<Assignment>("a", golden).unwrap(), a);
        let old = decode::<Assignment>("a", br#"{"owner_id":"n1","target_id":"n2"}"#).unwrap();
        assert_eq!((old.base_offset, old.move_attempt), (None, None));
        let m = Member {
            id: "n1".into(),
            addr: "h:1".into(),
            cluster_addr: None,
            status: MemberStatus::Dead,
            last_heartbeat: 5,
            draining: false,
        };
        let golden = br#"{"id":"n1","addr":"h:1","status":"dead","last_heartbeat":5}"#;
        assert_eq!(encode(&m), golden);
        assert_eq!(decode::<Member>("m", golden).unwrap(), m);
    }
}
