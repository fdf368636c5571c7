//! narad-meta: the metastore.
//!
//! Topics (every option of SPEC §1.4, their incarnation ids and fan-out
//! links), schema histories, partition assignments, members and users, kept as a
//! deterministic state machine of [`Command`]s:
//!
//! * [`request`] turns what a user asked for into a command (defaults and
//!   stateless rules, SPEC's error texts);
//! * [`apply()`] applies a command at an index to a [`MetaState`] (pure: no
//!   clock, no randomness, no I/O);
//! * [`MetaStore`] applies commands one by one, persisting each in a redb
//!   transaction (`<data>/metastore/fsm.redb`, through `narad_fs`), and
//!   serves reads from an in-memory snapshot. It implements [`MetaWriter`]
//!   directly on a single node, or through a [`Replicator`] (Raft, in the
//!   cluster crate) that applies committed entries with
//!   [`MetaStore::apply_entry`] and ships [`MetaStore::export_snapshot`]s.
//!
//! Errors are one enum, [`MetaError`], with one HTTP status per variant.

pub mod apply;
mod assignment;
pub mod command;
mod config;
mod error;
pub mod limits;
mod member;
pub mod placement;
pub mod rebalance;
pub mod request;
pub mod schema;
mod state;
mod storage;
mod store;
mod topic;
pub mod user;

pub use apply::{Applied, apply};
pub use assignment::Assignment;
pub use command::{
    AbortMove, AlterTopic, AssignPartitions, AttachChild, Command, CompleteMove, CreateTopic,
    CreateUser, DeleteTopic, DeleteUser, DetachChild, MemberDead, MemberJoin, PartitionAssignment,
    Reassigned, RemoveMember, RemovedPartition, Response, SeedRootUser, SetAssignmentTarget,
    SetMemberDraining, UpdateUser,
};
pub use config::TopicDefaults;
pub use error::{MetaError, StorageError};
pub use member::{Member, MemberStatus};
pub use request::{
    AlterTopicRequest, AttachChildRequest, CreateTopicRequest, format_epoch, parse_list_limit,
    validate_topic_name,
};
pub use schema::{CompiledSchema, SchemaHistory};
pub use state::{MetaState, TopicAssignments, TopicPage, Versions};
pub use storage::FORMAT_VERSION;
pub use storage::backend::FsBackend;
/// The snapshot decoder alone, for the fuzz checks (`fuzz/src/cluster.rs`),
/// which feed it any bytes without a store; everything else goes through
/// [`MetaStore::install_snapshot`].
#[doc(hidden)]
pub use storage::snapshot::decode as decode_snapshot;
pub use store::{
    AppliedListener, MetaStore, MetaStoreOptions, MetaWriter, Replicator, metastore_path,
};
pub use topic::{ParentLink, Role, Topic, TopicJson};
pub use user::{Action, Grant, ROOT_USERNAME, User, UserJson};
