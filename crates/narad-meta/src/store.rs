//! `MetaStore`: the metastore. Writes apply commands one at a time, each in
//! its own redb transaction; reads are served from an in-memory snapshot.
//!
//! # Direct and replicated
//!
//! Callers write through [`MetaWriter::propose`] and read from a
//! [`MetaState`] snapshot. A single node fulfils `propose` directly: it
//! applies the command at the next index and commits it. Once a
//! [`Replicator`] is set ([`MetaStore::set_replicator`], at start-up, on a
//! node with peers), `propose` hands the command to it instead; consensus
//! commits it and every replica applies it through
//! [`MetaStore::apply_entry`], with the same [`crate::apply`], so callers do
//! not change. Both paths share one apply-commit-publish step (logging,
//! latching, the applied-index record, the snapshot, the
//! [`MetaStore::on_applied`] listeners).
//!
//! The applied index is the store's own count of applied commands, not the
//! Raft log index: entries without a command, and commands apply refuses,
//! do not advance it (their Raft state is still stored). Every replica
//! applying the same entries therefore reaches the same index and the same
//! incarnation ids, and a single node upgraded to a cluster keeps its own.
//!
//! A snapshot ([`MetaStore::export_snapshot`], format in
//! `storage::snapshot`) carries the whole state and the Raft state;
//! [`MetaStore::install_snapshot`] replaces the database with it
//! atomically.
//!
//! # Concurrency
//!
//! Proposals serialize on one mutex (held across the commit, so snapshots
//! are published in index order). The snapshot is an `Arc<MetaState>` behind
//! an `RwLock` that is held only to clone or swap the `Arc`: a hot-path read
//! (the topic of every produce) takes no redb transaction and allocates
//! nothing beyond that clone.
//!
//! # Failures
//!
//! A failed commit poisons the store (it is never retried: the disk state
//! after a failed fsync is unknown). Every later write fails with
//! [`StorageError::Poisoned`]; reads keep serving the last applied state;
//! reopening recovers whatever the disk holds.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use narad_clock::ClockRef;
use narad_fs::{Fs, SimRng};

use crate::apply::{Applied, apply};
use crate::command::{
    AbortMove, AssignPartitions, AttachChild, Command, CompleteMove, CreateTopic, CreateUser,
    DeleteTopic, DeleteUser, DetachChild, MemberDead, MemberJoin, PartitionAssignment, Reassigned,
    RemoveMember, RemovedPartition, Response, SeedRootUser, SetAssignmentTarget, SetMemberDraining,
    UpdateUser,
};
use crate::config::TopicDefaults;
use crate::error::{MetaError, StorageError};
use crate::member::Member;
use crate::request::{AlterTopicRequest, AttachChildRequest, CreateTopicRequest};
use crate::schema::CompiledSchema;
use crate::state::{MetaState, TopicPage, Versions};
use crate::storage::applied::{AppliedRecord, applied_path};
use crate::storage::{MetaDb, snapshot};
use crate::topic::{ParentLink, Topic};
use crate::user::{Action, Grant, ROOT_USERNAME, User};

/// Where the metastore lives under the data directory.
pub fn metastore_path(data_dir: &Path) -> PathBuf {
    data_dir.join("metastore").join("fsm.redb")
}

/// Applies commands to the metastore. Blocking: a commit waits for an
/// fsync, so async callers run it on a blocking thread.
pub trait MetaWriter: Send + Sync {
    /// Applies `command` (locally, or through consensus) and returns its
    /// response once it is durable.
    fn propose(&self, command: Command) -> Result<Response, MetaError>;
}

/// Where a replicated store sends commands (the cluster implements it).
pub trait Replicator: Send + Sync + std::fmt::Debug {
    /// Replicates `command` through consensus and returns its response once
    /// this node has applied it. Blocking (called on blocking threads).
    fn replicate(&self, command: Command) -> Result<Response, MetaError>;
}

/// A listener of applied commands ([`MetaStore::on_applied`]).
pub type AppliedListener = Arc<dyn Fn(&Command, &Response) + Send + Sync>;

/// How a store is opened.
#[derive(Debug, Clone)]
pub struct MetaStoreOptions {
    /// Topic defaults and bounds.
    pub defaults: TopicDefaults,
    /// The clock that stamps `created_at`.
    pub clock: ClockRef,
    /// Seed of the attach-epoch generator; `None` seeds it randomly.
    pub rng_seed: Option<u64>,
}

struct Writer {
    db: MetaDb,
    /// The applied-index record, written after each commit.
    record: AppliedRecord,
    poisoned: Option<String>,
}

/// The metastore.
pub struct MetaStore {
    writer: Mutex<Writer>,
    snapshot: RwLock<Arc<MetaState>>,
    /// The Raft state stored with the last applied entry (changed under the
    /// writer lock, with the database).
    raft_state: RwLock<Option<Arc<[u8]>>>,
    replicator: OnceLock<Arc<dyn Replicator>>,
    listeners: RwLock<Vec<AppliedListener>>,
    /// The database file ([`metastore_path`]).
    path: PathBuf,
    defaults: TopicDefaults,
    clock: ClockRef,
    rng: Mutex<SimRng>,
}

impl std::fmt::Debug for MetaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaStore")
            .field("applied_index", &self.snapshot().applied_index())
            .field("replicator", &self.replicator.get())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl MetaStore {
    /// Opens the metastore under `data_dir` ([`metastore_path`]), creating
    /// it if needed, and loads its state. Refuses (naming the file) a
    /// metastore that is missing or behind its applied-index record
    /// ([`crate::storage::applied`]); every storage error names the file.
    pub fn open(
        fs: &dyn Fs,
        data_dir: &Path,
        options: MetaStoreOptions,
    ) -> Result<Self, MetaError> {
        options.defaults.validate().map_err(MetaError::Invalid)?;
        let path = metastore_path(data_dir);
        let named =
            |e: StorageError| StorageError::Open { path: path.clone(), source: Box::new(e) };
        let record_path = applied_path(data_dir);
        let recorded = AppliedRecord::read(fs, &record_path)
            .map_err(|why| named(StorageError::Record(why)))?;
        if let Some(recorded) = recorded {
            let exists = fs
                .exists(&path)
                .map_err(|source| named(StorageError::Io { context: "stat".to_owned(), source }))?;
            if !exists {
                return Err(named(StorageError::Missing { recorded, record: record_path }).into());
            }
        }
        let (db, state, raft_state) = MetaDb::open(fs, &path).map_err(named)?;
        if let Some(recorded) = recorded.filter(|r| *r > state.applied_index()) {
            let applied = state.applied_index();
            return Err(
                named(StorageError::RolledBack { applied, recorded, record: record_path }).into()
            );
        }
        let record = AppliedRecord::open(fs, &record_path, state.applied_index())
            .map_err(|e| named(StorageError::Record(format!("{}: {e}", record_path.display()))))?;
        tracing::info!(
            path = %path.display(),
            applied_index = state.applied_index(),
            topics = state.topic_count(),
            "metastore opened"
        );
        let seed = options
            .rng_seed
            .unwrap_or_else(|| RandomState::new().hash_one(options.clock.wall_ms()));
        Ok(MetaStore {
            writer: Mutex::new(Writer { db, record, poisoned: None }),
            snapshot: RwLock::new(Arc::new(state)),
            raft_state: RwLock::new(raft_state.map(Arc::from)),
            replicator: OnceLock::new(),
            listeners: RwLock::new(Vec::new()),
            path,
            defaults: options.defaults,
            clock: options.clock,
            rng: Mutex::new(SimRng::new(seed)),
        })
    }

    /// The topic defaults this store resolves requests with.
    pub fn defaults(&self) -> &TopicDefaults {
        &self.defaults
    }

    /// The current state.
    pub fn snapshot(&self) -> Arc<MetaState> {
        self.snapshot.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A topic by name.
    pub fn topic(&self, name: &str) -> Option<Arc<Topic>> {
        self.snapshot.read().unwrap_or_else(|p| p.into_inner()).topic(name).cloned()
    }

    /// The compiled latest schema of a topic, for payload validation.
    pub fn compiled_schema(&self, topic: &str) -> Option<Arc<CompiledSchema>> {
        self.snapshot.read().unwrap_or_else(|p| p.into_inner()).compiled_schema(topic).cloned()
    }

    /// One page of topics after `after` (see [`MetaState::list_topics`]).
    pub fn list_topics(&self, after: &str, limit: usize) -> TopicPage {
        self.snapshot().list_topics(after, limit)
    }

    /// The change counters.
    pub fn versions(&self) -> Versions {
        self.snapshot().versions()
    }

    /// Creates a topic: resolves the request against the defaults, stamps
    /// the creation time and an attach epoch, and applies it.
    pub fn create_topic(&self, request: CreateTopicRequest) -> Result<Arc<Topic>, MetaError> {
        let command = self.resolve_create_topic(request)?;
        self.propose_create_topic(command)
    }

    /// The first half of [`MetaStore::create_topic`]: the command, checked
    /// against the current state, with its time and attach epoch. A caller
    /// that must prepare something under the epoch (fan-out cursor files)
    /// does so before proposing it.
    pub fn resolve_create_topic(
        &self,
        request: CreateTopicRequest,
    ) -> Result<CreateTopic, MetaError> {
        let epoch = self.new_attach_epoch();
        request.resolve(&self.defaults, &self.snapshot(), self.clock.wall_ms(), epoch)
    }

    /// The second half of [`MetaStore::create_topic`]: applies the command.
    pub fn propose_create_topic(&self, command: CreateTopic) -> Result<Arc<Topic>, MetaError> {
        match self.propose(Command::CreateTopic(command))? {
            Response::Topic(t) => Ok(t),
            other => unreachable!("CreateTopic answered {other:?}"),
        }
    }

    /// Attaches a child: [`MetaStore::resolve_attach_child`] then
    /// [`MetaStore::propose_attach_child`]. Returns the parent.
    pub fn attach_child(&self, request: AttachChildRequest) -> Result<Arc<Topic>, MetaError> {
        let command = self.resolve_attach_child(request)?;
        self.propose_attach_child(command)
    }

    /// Checks an attach against the current state and stamps the attach
    /// time and a new attach epoch.
    pub fn resolve_attach_child(
        &self,
        request: AttachChildRequest,
    ) -> Result<AttachChild, MetaError> {
        let epoch = self.new_attach_epoch();
        request.resolve(&self.snapshot(), self.clock.wall_ms(), epoch)
    }

    /// Applies an attach; returns the parent as it is now.
    pub fn propose_attach_child(&self, command: AttachChild) -> Result<Arc<Topic>, MetaError> {
        match self.propose(Command::AttachChild(command))? {
            Response::Topic(t) => Ok(t),
            other => unreachable!("AttachChild answered {other:?}"),
        }
    }

    /// Detaches `child` from `parent`; returns the parent as it is now and
    /// the link that was dissolved.
    pub fn detach_child(
        &self,
        parent: &str,
        child: &str,
    ) -> Result<(Arc<Topic>, ParentLink), MetaError> {
        let command = DetachChild { parent: parent.to_owned(), child: child.to_owned() };
        match self.propose(Command::DetachChild(command))? {
            Response::ChildDetached { parent, link } => Ok((parent, link)),
            other => unreachable!("DetachChild answered {other:?}"),
        }
    }

    /// 64 random bits for an attach epoch (never 0, so an epoch is never
    /// all zero digits).
    fn new_attach_epoch(&self) -> u64 {
        let mut rng = lock(&self.rng);
        loop {
            let epoch = rng.next_u64();
            if epoch != 0 {
                return epoch;
            }
        }
    }

    /// Alters topic `name`.
    pub fn alter_topic(
        &self,
        name: &str,
        request: AlterTopicRequest,
    ) -> Result<Arc<Topic>, MetaError> {
        let command = request.resolve(name, &self.defaults)?;
        match self.propose(Command::AlterTopic(command))? {
            Response::Topic(t) => Ok(t),
            other => unreachable!("AlterTopic answered {other:?}"),
        }
    }

    /// Deletes topic `name`; returns the deleted record.
    pub fn delete_topic(&self, name: &str) -> Result<Arc<Topic>, MetaError> {
        match self.propose(Command::DeleteTopic(DeleteTopic { name: name.to_owned() }))? {
            Response::TopicDeleted(t) => Ok(t),
            other => unreachable!("DeleteTopic answered {other:?}"),
        }
    }

    /// Assigns partitions of incarnation `incarnation` of `topic`.
    pub fn assign_partitions(
        &self,
        topic: &str,
        incarnation: u64,
        assignments: Vec<PartitionAssignment>,
    ) -> Result<(), MetaError> {
        self.assign(topic, incarnation, assignments, false)
    }

    /// Places the partitions of `assignments` that have no owner when the
    /// command applies; assigned ones keep theirs (see
    /// [`AssignPartitions::unassigned_only`]).
    pub fn assign_unassigned(
        &self,
        topic: &str,
        incarnation: u64,
        assignments: Vec<PartitionAssignment>,
    ) -> Result<(), MetaError> {
        self.assign(topic, incarnation, assignments, true)
    }

    fn assign(
        &self,
        topic: &str,
        incarnation: u64,
        assignments: Vec<PartitionAssignment>,
        unassigned_only: bool,
    ) -> Result<(), MetaError> {
        let command =
            AssignPartitions { topic: topic.to_owned(), incarnation, assignments, unassigned_only };
        self.propose(Command::AssignPartitions(command)).map(drop)
    }

    /// Upserts a member (join or heartbeat).
    pub fn member_join(&self, member: Member) -> Result<Arc<Member>, MetaError> {
        match self.propose(Command::MemberJoin(MemberJoin { member }))? {
            Response::Member(m) => Ok(m),
            other => unreachable!("MemberJoin answered {other:?}"),
        }
    }

    /// Marks a member dead.
    pub fn member_dead(&self, id: &str) -> Result<Arc<Member>, MetaError> {
        match self
            .propose(Command::MemberDead(MemberDead { id: id.to_owned(), last_heartbeat: None }))?
        {
            Response::Member(m) => Ok(m),
            other => unreachable!("MemberDead answered {other:?}"),
        }
    }
}

/// Partition moves and decommission (SPEC §7.3).
impl MetaStore {
    /// Starts moving `(topic, partition)` of `incarnation` from
    /// `expected_owner` to `target` ([`SetAssignmentTarget`]).
    pub fn set_assignment_target(
        &self,
        topic: &str,
        incarnation: u64,
        partition: u32,
        expected_owner: &str,
        target: &str,
    ) -> Result<(), MetaError> {
        let command = SetAssignmentTarget {
            topic: topic.to_owned(),
            incarnation,
            partition,
            expected_owner: expected_owner.to_owned(),
            target_id: target.to_owned(),
        };
        self.propose(Command::SetAssignmentTarget(command)).map(drop)
    }

    /// Flips the owner of a moving partition to its target, if it is still
    /// `expected_owner` moving to `target` in move `attempt`
    /// ([`CompleteMove`]).
    pub fn complete_move(
        &self,
        topic: &str,
        incarnation: u64,
        partition: u32,
        expected_owner: &str,
        target: &str,
        attempt: Option<u64>,
    ) -> Result<(), MetaError> {
        let command = CompleteMove {
            topic: topic.to_owned(),
            incarnation,
            partition,
            expected_owner: expected_owner.to_owned(),
            target_id: target.to_owned(),
            attempt,
        };
        self.propose(Command::CompleteMove(command)).map(drop)
    }

    /// Clears a move's target, if it is still `expected_target` (in move
    /// `attempt`, when given) ([`AbortMove`]).
    pub fn abort_move(
        &self,
        topic: &str,
        incarnation: u64,
        partition: u32,
        expected_target: &str,
        attempt: Option<u64>,
    ) -> Result<(), MetaError> {
        let command = AbortMove {
            topic: topic.to_owned(),
            incarnation,
            partition,
            expected_target: expected_target.to_owned(),
            attempt,
        };
        self.propose(Command::AbortMove(command)).map(drop)
    }

    /// Marks member `id` draining, or clears the mark.
    pub fn set_member_draining(&self, id: &str, draining: bool) -> Result<Arc<Member>, MetaError> {
        let command = SetMemberDraining { id: id.to_owned(), draining };
        match self.propose(Command::SetMemberDraining(command))? {
            Response::Member(m) => Ok(m),
            other => unreachable!("SetMemberDraining answered {other:?}"),
        }
    }
}

/// Removing a member for good (op 17).
impl MetaStore {
    /// Removes dead member `id`, last heard from at `last_heartbeat`, and
    /// gives its partitions new owners starting at the offsets of
    /// `partitions` ([`RemoveMember`]); returns its last record and the
    /// reassigned partitions.
    pub fn remove_member(
        &self,
        id: &str,
        last_heartbeat: i64,
        partitions: Vec<RemovedPartition>,
    ) -> Result<(Arc<Member>, Vec<Reassigned>), MetaError> {
        let command = RemoveMember { id: id.to_owned(), last_heartbeat, partitions };
        match self.propose(Command::RemoveMember(command))? {
            Response::MemberRemoved { member, reassigned } => Ok((member, reassigned)),
            other => unreachable!("RemoveMember answered {other:?}"),
        }
    }
}

/// The user record an apply answered with.
fn user_response(r: Response) -> Arc<User> {
    match r {
        Response::User(u) | Response::UserDeleted(u) => u,
        other => unreachable!("a user command answered {other:?}"),
    }
}

impl MetaStore {
    /// A user by name.
    pub fn user(&self, name: &str) -> Option<Arc<User>> {
        self.snapshot.read().unwrap_or_else(|p| p.into_inner()).user(name).cloned()
    }

    /// Creates a (non-root) user with an already computed password hash.
    pub fn create_user(
        &self,
        username: &str,
        password_hash: String,
        grants: Vec<Grant>,
    ) -> Result<Arc<User>, MetaError> {
        let now = self.clock.wall_ms() as i64;
        let user = User {
            username: username.to_owned(),
            password_hash,
            grants,
            root: false,
            created_at_ms: now,
            updated_at_ms: now,
        };
        self.propose(Command::CreateUser(CreateUser { user })).map(user_response)
    }

    /// Replaces a user's grants and/or password hash.
    pub fn update_user(
        &self,
        username: &str,
        grants: Option<Vec<Grant>>,
        password_hash: Option<String>,
    ) -> Result<Arc<User>, MetaError> {
        let command = UpdateUser {
            username: username.to_owned(),
            grants,
            password_hash,
            updated_at_ms: self.clock.wall_ms() as i64,
        };
        self.propose(Command::UpdateUser(command)).map(user_response)
    }

    /// Deletes a user; returns the deleted record.
    pub fn delete_user(&self, username: &str) -> Result<Arc<User>, MetaError> {
        let command = DeleteUser { username: username.to_owned() };
        self.propose(Command::DeleteUser(command)).map(user_response)
    }

    /// Creates the root user [`ROOT_USERNAME`] (always admin) with an
    /// already computed password hash; refused once a root exists.
    pub fn seed_root_user(&self, password_hash: String) -> Result<Arc<User>, MetaError> {
        let now = self.clock.wall_ms() as i64;
        let user = User {
            username: ROOT_USERNAME.to_owned(),
            password_hash,
            grants: vec![Grant { action: Action::Admin, patterns: Vec::new() }],
            root: true,
            created_at_ms: now,
            updated_at_ms: now,
        };
        self.propose(Command::SeedRootUser(SeedRootUser { user })).map(user_response)
    }
}

impl MetaWriter for MetaStore {
    fn propose(&self, command: Command) -> Result<Response, MetaError> {
        if let Some(replicator) = self.replicator.get() {
            return replicator.replicate(command);
        }
        let mut writer = lock(&self.writer);
        self.apply_command(&mut writer, &command, None)?
    }
}

/// The replicated path, snapshots and listeners.
impl MetaStore {
    /// From now on `propose` goes through `replicator` (set once, at
    /// start-up, before any write).
    ///
    /// # Panics
    /// On a second call: a store has one way to write.
    pub fn set_replicator(&self, replicator: Arc<dyn Replicator>) {
        if self.replicator.set(replicator).is_err() {
            panic!("MetaStore::set_replicator called twice");
        }
    }

    /// Whether writes go through a [`Replicator`].
    pub fn is_replicated(&self) -> bool {
        self.replicator.get().is_some()
    }

    /// The state machine side of consensus: applies one committed Raft
    /// entry. `command` is `None` for blank and membership entries.
    /// `raft_state` (opaque: the last-applied log id and membership, as the
    /// cluster serializes them) is stored in the same redb transaction as
    /// the command's effects, also when the command is refused or absent.
    ///
    /// A command applies at the store's own next index (see the module
    /// docs). Returns `Ok(None)` for no command, `Ok(Some(outcome))` with
    /// the command's own outcome (deterministic on every replica: a refused
    /// command changes no state); `Err` is a storage failure, which latches
    /// the store as on the direct path.
    pub fn apply_entry(
        &self,
        command: Option<&Command>,
        raft_state: &[u8],
    ) -> Result<Option<Result<Response, MetaError>>, StorageError> {
        let mut writer = lock(&self.writer);
        match command {
            Some(command) => self.apply_command(&mut writer, command, Some(raft_state)).map(Some),
            None => {
                check_writable(&writer)?;
                self.commit(&mut writer, None, Some(raft_state), None)?;
                Ok(None)
            }
        }
    }

    /// The Raft state stored with the last applied entry (`None`: never).
    pub fn raft_state(&self) -> Option<Vec<u8>> {
        self.raft_state.read().unwrap_or_else(|p| p.into_inner()).as_deref().map(<[u8]>::to_vec)
    }

    /// Calls `listener` after every command applied from now on (on either
    /// path), in apply order, with the command and its response; not for
    /// refused commands. Listeners run under the store's writer lock, so
    /// they must be quick and must not write to the store.
    pub fn on_applied(&self, listener: AppliedListener) {
        self.listeners.write().unwrap_or_else(|p| p.into_inner()).push(listener);
    }

    /// The whole state and the Raft state as one self-checking byte string
    /// (format in `storage::snapshot`): identical states export identical
    /// bytes.
    pub fn export_snapshot(&self) -> Result<Vec<u8>, StorageError> {
        // Under the writer lock: the state and the Raft state of one entry.
        let _writer = lock(&self.writer);
        snapshot::encode(&self.snapshot(), self.raft_state().as_deref())
    }

    /// Replaces the whole state and the Raft state with a snapshot from
    /// [`MetaStore::export_snapshot`], atomically: a crash at any point
    /// leaves the old database or the new one, never a mix, and either
    /// opens. `fs` must be the file system the store was opened on.
    ///
    /// The snapshot is decoded and checked whole first (a bad one is
    /// [`StorageError::BadSnapshot`] and changes nothing). Then the new
    /// database is built beside the old one (`fsm.redb.tmp`), fsynced, and
    /// renamed over it (the rename syncs the directory); the store reopens
    /// it, checks it reads back as the snapshot, swaps its state in and
    /// records the snapshot's applied index. Raft installs whatever
    /// snapshot it is given, so that index may be below the current one:
    /// the applied-index record is then lowered, explicitly, before the
    /// rename (see `storage::applied`). A failure after the decode latches
    /// the store (reopening recovers the old or the new state).
    pub fn install_snapshot(&self, fs: &dyn Fs, bytes: &[u8]) -> Result<(), StorageError> {
        let (state, raft_state) = snapshot::decode(bytes)?;
        let mut writer = lock(&self.writer);
        check_writable(&writer)?;
        let from = self.snapshot().applied_index();
        let to = state.applied_index();
        if let Err(e) = self.install(fs, &mut writer, state, raft_state) {
            tracing::error!(error = %e, from, to, "metastore snapshot install failed; refusing further writes");
            writer.poisoned = Some(e.to_string());
            return Err(e);
        }
        let topics = self.snapshot().topic_count();
        tracing::info!(from, to, topics, "metastore snapshot installed");
        Ok(())
    }

    fn install(
        &self,
        fs: &dyn Fs,
        writer: &mut Writer,
        state: MetaState,
        raft_state: Option<Vec<u8>>,
    ) -> Result<(), StorageError> {
        let index = state.applied_index();
        let record_err = |record: &AppliedRecord, e: std::io::Error| {
            StorageError::Record(format!("{}: {e}", record.path().display()))
        };
        if index < writer.record.index() {
            writer.record.lower(fs, index).map_err(|e| record_err(&writer.record, e))?;
        }
        MetaDb::replace(fs, &self.path, &state, raft_state.as_deref())?;
        let (db, loaded, loaded_raft) = MetaDb::open(fs, &self.path)?;
        if loaded != state || loaded_raft != raft_state {
            return Err(StorageError::Corrupt(format!(
                "{} does not read back as the snapshot just installed",
                self.path.display()
            )));
        }
        writer.db = db;
        *self.raft_state.write().unwrap_or_else(|p| p.into_inner()) = raft_state.map(Arc::from);
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(state);
        writer.record.store(index).map_err(|e| record_err(&writer.record, e))
    }

    /// Applies `command` at the next index and commits it (with
    /// `raft_state`, on the replicated path): the one step both paths share.
    /// A refused command commits only its `raft_state`, if any.
    fn apply_command(
        &self,
        writer: &mut Writer,
        command: &Command,
        raft_state: Option<&[u8]>,
    ) -> Result<Result<Response, MetaError>, StorageError> {
        check_writable(writer)?;
        let current = self.snapshot();
        let applied = match apply(&current, current.applied_index() + 1, command) {
            Ok(applied) => applied,
            Err(refused) => {
                if raft_state.is_some() {
                    self.commit(writer, None, raft_state, Some(command))?;
                }
                return Ok(Err(refused));
            }
        };
        self.commit(writer, Some(&applied), raft_state, Some(command))?;
        let index = applied.state.applied_index();
        if let Err(e) = writer.record.store(index) {
            // The command is durable in the metastore; only the witness is
            // not. Latch, as after a failed fsync anywhere.
            let why = format!(
                "cannot record applied index {index} in {}: {e}",
                writer.record.path().display()
            );
            tracing::error!(error = %why, "metastore applied-index record failed; refusing further writes");
            writer.poisoned = Some(why);
        }
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(applied.state);
        log_applied(command, &applied.response, index);
        for listener in self.listeners.read().unwrap_or_else(|p| p.into_inner()).iter() {
            listener(command, &applied.response);
        }
        Ok(Ok(applied.response))
    }

    /// Commits `applied` and/or `raft_state` in one transaction; a failure
    /// latches the store.
    fn commit(
        &self,
        writer: &mut Writer,
        applied: Option<&Applied>,
        raft_state: Option<&[u8]>,
        command: Option<&Command>,
    ) -> Result<(), StorageError> {
        if let Err(e) = writer.db.commit(applied, raft_state) {
            let opcode = command.map(Command::opcode);
            tracing::error!(error = %e, opcode, "metastore commit failed; refusing further writes");
            writer.poisoned = Some(e.to_string());
            return Err(e);
        }
        if let Some(raft_state) = raft_state {
            *self.raft_state.write().unwrap_or_else(|p| p.into_inner()) =
                Some(Arc::from(raft_state));
        }
        Ok(())
    }
}

/// Refuses writes once the store has latched.
fn check_writable(writer: &Writer) -> Result<(), StorageError> {
    match &writer.poisoned {
        Some(first) => Err(StorageError::Poisoned { first: first.clone() }),
        None => Ok(()),
    }
}

/// Logs an applied command: topic and link changes at INFO, the rest at
/// DEBUG.
fn log_applied(command: &Command, response: &Response, index: u64) {
    match response {
        Response::Topic(t) if matches!(command, Command::CreateTopic(_)) => {
            tracing::info!(topic = t.name(), incarnation = t.incarnation(), index, "topic created");
        }
        Response::TopicDeleted(t) => {
            tracing::info!(topic = t.name(), incarnation = t.incarnation(), index, "topic deleted");
        }
        Response::Topic(parent) if let Command::AttachChild(c) = command => {
            tracing::info!(
                parent = parent.name(),
                child = c.child,
                attach_epoch = c.attach_epoch,
                delay_ms = c.fanout_delay_ms,
                index,
                "child attached"
            );
        }
        Response::MemberRemoved { member, reassigned } => {
            tracing::info!(
                member = member.id,
                partitions = reassigned.len(),
                index,
                "member removed for good; its partitions have new owners"
            );
        }
        Response::ChildDetached { parent, link } => {
            let child = match command {
                Command::DetachChild(c) => c.child.as_str(),
                _ => "",
            };
            tracing::info!(
                parent = parent.name(),
                child,
                attach_epoch = link.attach_epoch,
                index,
                "child detached"
            );
        }
        _ => tracing::debug!(opcode = command.opcode(), index, "metastore command applied"),
    }
}
