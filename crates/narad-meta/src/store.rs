//! `MetaStore`: the single-node metastore. Writes apply commands directly,
//! one at a time, each in its own redb transaction; reads are served from an
//! in-memory snapshot.
//!
//! # The seam for the cluster
//!
//! Callers write through [`MetaWriter::propose`] and read from a
//! [`MetaState`] snapshot. This store fulfils `propose` by applying the
//! command at the next index and committing it; a replicated store will
//! fulfil it by appending the same command to the Raft log and applying it
//! on commit with the same [`crate::apply`], so callers do not change.
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
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use narad_clock::ClockRef;
use narad_fs::{Fs, SimRng};

use crate::apply::apply;
use crate::command::{
    AssignPartitions, AttachChild, Command, CreateTopic, CreateUser, DeleteTopic, DeleteUser,
    DetachChild, MemberDead, MemberJoin, PartitionAssignment, Response, SeedRootUser, UpdateUser,
};
use crate::config::TopicDefaults;
use crate::error::{MetaError, StorageError};
use crate::member::Member;
use crate::request::{AlterTopicRequest, AttachChildRequest, CreateTopicRequest};
use crate::schema::CompiledSchema;
use crate::state::{MetaState, TopicPage, Versions};
use crate::storage::MetaDb;
use crate::storage::applied::{AppliedRecord, applied_path};
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

/// The single-node metastore.
pub struct MetaStore {
    writer: Mutex<Writer>,
    snapshot: RwLock<Arc<MetaState>>,
    defaults: TopicDefaults,
    clock: ClockRef,
    rng: Mutex<SimRng>,
}

impl std::fmt::Debug for MetaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaStore")
            .field("applied_index", &self.snapshot().applied_index())
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
        let (db, state) = MetaDb::open(fs, &path).map_err(named)?;
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
        let command = AssignPartitions { topic: topic.to_owned(), incarnation, assignments };
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
        match self.propose(Command::MemberDead(MemberDead { id: id.to_owned() }))? {
            Response::Member(m) => Ok(m),
            other => unreachable!("MemberDead answered {other:?}"),
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
        let mut writer = lock(&self.writer);
        if let Some(first) = &writer.poisoned {
            return Err(StorageError::Poisoned { first: first.clone() }.into());
        }
        let current = self.snapshot();
        let applied = apply(&current, current.applied_index() + 1, &command)?;
        if let Err(e) = writer.db.commit(&applied) {
            tracing::error!(error = %e, opcode = command.opcode(), "metastore commit failed; refusing further writes");
            writer.poisoned = Some(e.to_string());
            return Err(e.into());
        }
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
        match &applied.response {
            Response::Topic(t) if matches!(command, Command::CreateTopic(_)) => {
                tracing::info!(
                    topic = t.name(),
                    incarnation = t.incarnation(),
                    index,
                    "topic created"
                );
            }
            Response::TopicDeleted(t) => {
                tracing::info!(
                    topic = t.name(),
                    incarnation = t.incarnation(),
                    index,
                    "topic deleted"
                );
            }
            Response::Topic(parent) if let Command::AttachChild(c) = &command => {
                tracing::info!(
                    parent = parent.name(),
                    child = c.child,
                    attach_epoch = c.attach_epoch,
                    delay_ms = c.fanout_delay_ms,
                    index,
                    "child attached"
                );
            }
            Response::ChildDetached { parent, link } => {
                let child = match &command {
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
        Ok(applied.response)
    }
}
