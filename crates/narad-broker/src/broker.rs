//! The broker on one node: wiring of the metastore, the ingress WAL, the
//! dispatcher, the partition logs and the consumer state, and the
//! operations the HTTP layer calls.
//!
//! Start-up order: metastore → partition logs (recovered; damage stops the
//! start) → WAL (recovered) → dispatcher → background tasks. Shutdown:
//! refuse new work → stop the dispatcher (commits in flight finish) → close
//! the WAL (final checkpoint sync) → persist consumer frontiers → close logs.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use narad_clock::ClockRef;
use narad_fs::FsRef;
use narad_log::{LogConfig, LogStats, ReadError};
use narad_meta::{
    AlterTopicRequest, AttachChildRequest, CreateTopicRequest, Member, MemberStatus, MetaError,
    MetaStore, MetaStoreOptions, Topic, TopicDefaults, TopicPage,
};
use narad_wal::{RecordRef, Wal, WalOptions};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::consume::shard::{ResolveError, parse_receipt_handle, receipt_handle};
use crate::consume::take::{Taken, take};
use crate::dispatch::driver::Dispatcher;
use crate::dispatch::driver::Resolver;
use crate::dispatch::resolve::{ClusterResolver, DeleteConfirmer, LocalResolver, OwnerIds};
use crate::error::BrokerError;
use crate::fanout::peers::{LAG_PEER_TIMEOUT, LINK_PEER_TIMEOUT, LinkPeers, NewLink, PeerLag};
use crate::fanout::{ChildLag, FanoutCtx, FanoutRunner, cursor_file};
use crate::limits::{
    CONSUME_BATCH_BYTES, CONSUME_ERROR_WARN_EVERY, DATA_DIR_WALK_ENTRIES_PER_POLL,
    DATA_DIR_WALK_MAX_SKIP, EXPIRY_PURGE_INTERVAL, FRONTIER_PERSIST_INTERVAL,
    IDLE_EVICTION_INTERVAL, METRICS_POLL_INTERVAL, RETENTION_INTERVAL,
};
use crate::metrics::{
    BrokerMetrics, PartitionLabels, RejectionLabels, SourceLabels, TopicLabels, WaitLabels,
};
use crate::owner::{CommitBatch, CommitError, LocalOwner, Owner, RoutedOwner};
use crate::partition::{RoundRobin, keyed_partition};
use crate::placement;
use crate::topics::{PartitionRt, TopicRt, Topics, shard_limits};

/// How the broker is set up.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The data directory.
    pub data_dir: PathBuf,
    /// This node's id.
    pub node_id: String,
    /// This node's advertised HTTP address.
    pub advertised_addr: String,
    /// Topic defaults and bounds.
    pub topic_defaults: TopicDefaults,
    /// Partition log settings.
    pub log: LogConfig,
    /// Ingress WAL sizes.
    pub wal: WalOptions,
    /// Close partition logs unaccessed this long (ms; 0 = never; SPEC
    /// §5.7, `storage.idle_log_eviction_ms`).
    pub idle_log_eviction_ms: u64,
}

/// One message handed to a consumer.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// Topic name.
    pub topic: Arc<str>,
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// Key.
    pub key: Option<Bytes>,
    /// Payload.
    pub payload: Bytes,
    /// Commit time, ms.
    pub commit_time_ms: u64,
    /// Receipt handle (queue mode).
    pub receipt_handle: Option<String>,
}

/// Which partitions a consume takes from.
#[derive(Debug, Clone)]
enum Pick {
    /// Every partition this node serves, starting at the next in turn.
    Any,
    /// One (a pinned consume).
    One(u32),
    /// These, in this order (those this node does not serve are passed
    /// over).
    Order(Vec<u32>),
}

/// One record of a batch produce, already decoded from the wire.
#[derive(Debug, Clone)]
pub struct ProduceRecord {
    /// The key.
    pub key: Option<Bytes>,
    /// A pinned partition.
    pub partition: Option<u32>,
    /// The payload.
    pub payload: Bytes,
}

/// What to do with a leased message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckAction {
    /// Done with it.
    Ack,
    /// Keep it invisible for another visibility timeout.
    Extend,
    /// Make it visible again now.
    Nack,
}

/// Per-partition details for `GET /v1/topics/{topic}` (also the body of
/// node RPC op 8's reply).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PartitionStats {
    /// Partition index.
    pub index: u32,
    /// Segment files.
    pub segments: usize,
    /// Oldest readable offset.
    pub oldest_offset: u64,
    /// Offset of the next record.
    pub next_offset: u64,
    /// First offset not yet visible.
    pub high_watermark: u64,
    /// Bytes on disk.
    pub size_bytes: u64,
    /// Commit time (Unix s) of the oldest segment's first record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_segment_at: Option<u64>,
    /// The member that owns the partition (absent while unassigned).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_node: Option<String>,
    /// The member whose log the figures above describe: the owner's when
    /// it answered, else this node's own (set by a cluster node; absent on
    /// a single node, whose figures are always its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats_from: Option<String>,
    /// `ok`, or `owner_unavailable` when the owner is dead, unknown, not
    /// assigned yet, or did not answer for its figures.
    pub status: crate::ownership::PartitionStatus,
    /// The owner's liveness: `alive`, `dead` or `unknown`.
    pub owner_liveness: crate::ownership::OwnerLiveness,
}

/// Whether [`Broker::open_on`] registers this node as a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// Upsert this node's member record (alive) before opening: a single
    /// node, whose metastore applies directly.
    Now,
    /// Leave it to the cluster's membership heartbeat.
    ByHeartbeat,
}

/// How the dispatcher reaches the owners of partitions.
#[derive(Debug)]
pub enum Routing {
    /// Every partition is this node's (a single node).
    Local,
    /// A cluster node: owners and their liveness from the replicated
    /// assignments and membership; other owners' commits through `remote`;
    /// records of topics this replica does not hold discarded only on the
    /// leader's confirmation through `confirmer`.
    Cluster {
        /// Member ids as owner ids (this node is 0).
        ids: Arc<OwnerIds>,
        /// Commits to other nodes.
        remote: Arc<dyn Owner>,
        /// The leader's word on deletions.
        confirmer: Arc<dyn DeleteConfirmer>,
        /// The owners of a parent's other partitions, for link changes
        /// and fan-out lag.
        links: Arc<dyn LinkPeers>,
        /// Whether this replica caught up with the leader (fan-out acts
        /// only then).
        freshness: Arc<dyn crate::fanout::ReplicaFreshness>,
    },
}

/// The owner and the view of owners the dispatcher and the fan-out cursors
/// share, built from a [`Routing`].
struct Routes {
    owner: Arc<dyn Owner>,
    resolver: Arc<dyn Resolver>,
    topology: Arc<dyn crate::dispatch::core::Topology + Send + Sync>,
    /// This member's id on a cluster node.
    node_id: Option<String>,
    /// Other owners of fan-out parents' partitions (cluster only).
    links: Option<Arc<dyn LinkPeers>>,
    /// Whether this replica caught up with the leader (cluster only).
    freshness: Option<Arc<dyn crate::fanout::ReplicaFreshness>>,
}

impl Routes {
    fn new(
        routing: Routing,
        local: &Arc<LocalOwner>,
        meta: &Arc<MetaStore>,
        clock: &ClockRef,
        node_id: &str,
    ) -> Routes {
        match routing {
            Routing::Local => {
                let r = Arc::new(LocalResolver::new(meta.clone()));
                Routes {
                    owner: Arc::new(local.clone()),
                    resolver: r.clone(),
                    topology: r,
                    node_id: None,
                    links: None,
                    freshness: None,
                }
            }
            Routing::Cluster { ids, remote, confirmer, links, freshness } => {
                let r = Arc::new(ClusterResolver::new(meta.clone(), ids, confirmer, clock.clone()));
                Routes {
                    owner: Arc::new(RoutedOwner::new(local.clone(), remote)),
                    resolver: r.clone(),
                    topology: r,
                    node_id: Some(node_id.to_owned()),
                    links: Some(links),
                    freshness: Some(freshness),
                }
            }
        }
    }
}

/// The broker.
#[derive(Debug)]
pub struct Broker {
    config: BrokerConfig,
    clock: ClockRef,
    meta: Arc<MetaStore>,
    wal: Arc<Wal>,
    topics: Arc<Topics>,
    metrics: Arc<BrokerMetrics>,
    round_robin: RoundRobin,
    /// Commits into this node's partition logs (the dispatcher's local
    /// owner, and the owner side of other nodes' commits).
    local_owner: Arc<LocalOwner>,
    dispatcher: Mutex<Option<Dispatcher>>,
    fanout: Arc<FanoutRunner>,
    fanout_task: Mutex<Option<JoinHandle<()>>>,
    /// The owners of a parent's other partitions (cluster only).
    links: Option<Arc<dyn LinkPeers>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    stop: tokio::sync::watch::Sender<bool>,
    shutting_down: AtomicBool,
    /// Long polls return at once (the HTTP layer is draining).
    draining: AtomicBool,
    /// The WAL's counters at the last metrics poll: the next poll adds the
    /// difference to the `narad_ingress_wal_*_total` counters, and counts
    /// new failed segment preparations as
    /// `narad_errors{component="ingress_wal",kind="prepare"}` and failed
    /// zero-runway top-ups as `kind="runway"`.
    wal_seen: Mutex<narad_wal::WalStats>,
    /// Metric polls to skip before the next walk of the data directory.
    dir_walk_skip: AtomicU32,
    /// [`Topics::frontier_moves`] when the last frontier pass began: while
    /// it has not changed, the pass looks at no partition.
    frontier_moves_seen: AtomicU64,
    /// See [`Broker::unconfirmed_orphans`].
    unconfirmed_orphans: Mutex<std::collections::BTreeSet<String>>,
}

/// A parent's children's lag: this node's figures merged with each other
/// owner's (`None`: it did not answer). Complete only when every partition
/// is covered by an answer and every answer is complete.
fn merge_lags(
    partitions: u32,
    here: PeerLag,
    others: Vec<(String, Vec<u32>, Option<PeerLag>)>,
) -> Vec<ChildLag> {
    let mut covered: std::collections::BTreeSet<u32> = here.partitions.iter().copied().collect();
    let mut out = here.children;
    let mut answered_all = true;
    for (_, _, answer) in others {
        let Some(answer) = answer else {
            answered_all = false;
            continue;
        };
        covered.extend(answer.partitions.iter().copied());
        for lag in &mut out {
            match answer.children.iter().find(|c| c.name == lag.name) {
                Some(theirs) => lag.merge(theirs),
                // Their replica does not know the link yet (or any more).
                None => lag.lag_complete = false,
            }
        }
    }
    let whole = answered_all && (0..partitions).all(|p| covered.contains(&p));
    for lag in &mut out {
        lag.lag_complete &= whole;
    }
    out
}

fn join_err(e: tokio::task::JoinError) -> BrokerError {
    BrokerError::internal("background task", e)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BrokerError> + Send + 'static,
) -> Result<T, BrokerError> {
    tokio::task::spawn_blocking(f).await.map_err(join_err)?
}

impl Broker {
    /// Opens everything and starts the dispatcher and background tasks.
    /// Fails (naming file and offset) when recovery finds damage to acked
    /// data. A single node: the metastore applies commands directly and
    /// this node registers itself as the one alive member.
    pub async fn open(
        config: BrokerConfig,
        fs: FsRef,
        clock: ClockRef,
        metrics: Arc<BrokerMetrics>,
    ) -> Result<Arc<Broker>, BrokerError> {
        let meta = Broker::open_meta(&config, fs.clone(), clock.clone()).await?;
        Broker::open_on(config, fs, clock, metrics, meta, Registration::Now, Routing::Local).await
    }

    /// Opens the metastore of `config`'s data directory (creating the
    /// directory), refusing a data directory whose metastore is missing
    /// beside partition data. The first half of [`Broker::open`]: a cluster
    /// starts consensus over the store before the broker opens on it.
    pub async fn open_meta(
        config: &BrokerConfig,
        fs: FsRef,
        clock: ClockRef,
    ) -> Result<Arc<MetaStore>, BrokerError> {
        let (cfg, fs2) = (config.clone(), fs);
        blocking(move || {
            fs2.create_dir_all(&cfg.data_dir).map_err(|e| {
                BrokerError::internal(
                    "open data directory",
                    format!("{}: {e}", cfg.data_dir.display()),
                )
            })?;
            crate::start_check::metastore_missing_beside_data(&*fs2, &cfg.data_dir)?;
            let meta = MetaStore::open(
                &*fs2,
                &cfg.data_dir,
                MetaStoreOptions { defaults: cfg.topic_defaults.clone(), clock, rng_seed: None },
            )?;
            Ok(Arc::new(meta))
        })
        .await
    }

    /// The second half of [`Broker::open`]: opens the partition logs of
    /// the topics `meta` knows and the ingress WAL, and starts the
    /// dispatcher and background tasks. `registration` says whether this
    /// node upserts its member record now (a single node) or leaves that to
    /// the cluster's heartbeat (a cluster node, whose writes need a leader);
    /// `routing` how the dispatcher reaches partition owners.
    pub async fn open_on(
        config: BrokerConfig,
        fs: FsRef,
        clock: ClockRef,
        metrics: Arc<BrokerMetrics>,
        meta: Arc<MetaStore>,
        registration: Registration,
        routing: Routing,
    ) -> Result<Arc<Broker>, BrokerError> {
        let (cfg, fs2, clock2, metrics2, meta2) =
            (config.clone(), fs.clone(), clock.clone(), metrics.clone(), meta.clone());
        let (topics, wal, unconfirmed_orphans) = blocking(move || {
            let meta = meta2;
            let topics_root = cfg.data_dir.join("topics");
            let applied = meta.snapshot().applied_index();
            crate::start_check::markers_not_newer(&*fs2, &topics_root, applied)?;
            if registration == Registration::Now {
                let now_s = unix_seconds(&*clock2);
                meta.member_join(Member {
                    id: cfg.node_id.clone(),
                    addr: cfg.advertised_addr.clone(),
                    cluster_addr: None,
                    status: MemberStatus::Alive,
                    last_heartbeat: now_s,
                })?;
            }
            let topics = Topics::new(fs2.clone(), &cfg.data_dir, cfg.log.clone(), clock2.clone())
                .with_metrics(metrics2);
            let live: Vec<Arc<Topic>> = meta.snapshot().topics().cloned().collect();
            let deferred = topics.open_at_startup(&live, meta.is_replicated())?;
            let wal = Wal::open_with(fs2.clone(), narad_wal::wal_dir(&cfg.data_dir), cfg.wal)
                .map_err(|e| BrokerError::internal("open ingress WAL", e))?;
            let metastore = narad_meta::metastore_path(&cfg.data_dir);
            crate::start_check::wal_records_not_newer(&wal, &metastore, applied)?;
            Ok((Arc::new(topics), Arc::new(wal), deferred))
        })
        .await?;
        let owner = Arc::new(LocalOwner::new(meta.clone(), topics.clone(), metrics.clone()));
        // One owner and one view of owners for the dispatcher and the
        // fan-out cursors alike.
        let routes = Routes::new(routing, &owner, &meta, &clock, &config.node_id);
        let links = routes.links;
        let fanout = FanoutRunner::new(Arc::new(FanoutCtx {
            meta: meta.clone(),
            topics: topics.clone(),
            owner: routes.owner.clone(),
            topology: routes.topology,
            node_id: routes.node_id,
            fs: fs.clone(),
            clock: clock.clone(),
            metrics: metrics.clone(),
            freshness: routes.freshness,
        }));
        let broker = Arc::new(Broker {
            fanout: fanout.clone(),
            fanout_task: Mutex::new(None),
            links,
            round_robin: RoundRobin::new(clock.wall_ms() ^ 0x5EED, Duration::from_secs(300)),
            config,
            clock: clock.clone(),
            meta: meta.clone(),
            wal: wal.clone(),
            topics: topics.clone(),
            metrics: metrics.clone(),
            local_owner: owner.clone(),
            dispatcher: Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
            stop: tokio::sync::watch::channel(false).0,
            shutting_down: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            wal_seen: Mutex::new(narad_wal::WalStats::default()),
            dir_walk_skip: AtomicU32::new(0),
            frontier_moves_seen: AtomicU64::new(0),
            unconfirmed_orphans: Mutex::new(unconfirmed_orphans.into_iter().collect()),
        });
        let wake = Arc::new(Notify::new());
        let w = wake.clone();
        wal.on_durable(Arc::new(move |_| w.notify_one()));
        let dispatcher =
            Dispatcher::start(wal, routes.owner, routes.resolver, clock, wake, metrics);
        *broker.dispatcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(dispatcher);
        let fanout_task = tokio::spawn(fanout.run(broker.stop.subscribe()));
        *broker.fanout_task.lock().unwrap_or_else(|p| p.into_inner()) = Some(fanout_task);
        broker.spawn_background();
        info!(data_dir = %broker.config.data_dir.display(), "broker started");
        Ok(broker)
    }

    /// Topic directories found at start-up that this (replicated)
    /// metastore does not know: kept until the group's leader confirms the
    /// topic is gone (SPEC §7.1), then passed to
    /// [`Broker::remove_confirmed_orphan`]. Empty on a single node, which
    /// removes them at start-up.
    pub fn unconfirmed_orphans(&self) -> Vec<String> {
        self.unconfirmed_orphans.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }

    /// Commits a batch another node's dispatcher sent for a partition this
    /// node owns (node RPC CommitProduceBatch) through the same combining
    /// commit as this node's own: appended, fdatasynced, read back and
    /// visible when it returns `Ok` with the offsets the records got. The
    /// caller checked ownership; the topic incarnation is checked here, as
    /// for a local commit.
    pub async fn commit_for_peer(
        &self,
        batch: CommitBatch,
    ) -> Result<narad_log::CommitOutcome, CommitError> {
        let unavailable =
            || CommitError::Unavailable(format!("{} is shutting down", self.config.node_id));
        if self.check_running().is_err() {
            return Err(unavailable());
        }
        let owner = self.local_owner.clone();
        match tokio::task::spawn_blocking(move || owner.commit_blocking(batch)).await {
            // A log closed by the shutdown reads as a deleted topic's.
            Ok(Err(CommitError::Refused(_))) if self.check_running().is_err() => Err(unavailable()),
            Ok(r) => r,
            Err(e) => Err(CommitError::Failed(format!("commit task failed: {e}"))),
        }
    }

    /// The partitions of `t` this node serves: all of them on a single
    /// node; on a cluster node those the replicated assignments give it (a
    /// partition it does not own may hold records committed here before;
    /// its owner serves it).
    pub fn owned_partitions(&self, t: &Topic) -> std::collections::BTreeSet<u32> {
        if !self.meta.is_replicated() {
            return (0..t.partitions()).collect();
        }
        let snap = self.meta.snapshot();
        (0..t.partitions())
            .filter(|&p| {
                snap.assignment(t.name(), p).is_some_and(|a| a.owner_id == self.config.node_id)
            })
            .collect()
    }

    /// Whether this replica knows a topic named `name` now.
    pub fn knows_topic(&self, name: &str) -> bool {
        self.meta.topic(name).is_some()
    }

    /// Settles an unconfirmed orphan the leader confirmed gone: removes its
    /// directory unless this replica knows the topic by now (checked under
    /// the lock every open takes). Returns whether files were removed.
    pub async fn remove_confirmed_orphan(&self, name: &str) -> Result<bool, BrokerError> {
        let (topics, meta, owned) = (self.topics.clone(), self.meta.clone(), name.to_owned());
        let removed = blocking(move || {
            topics.remove_confirmed_orphan(&owned, || meta.topic(&owned).is_some())
        })
        .await?;
        self.forget_orphan(name);
        Ok(removed)
    }

    /// Drops `name` from the unconfirmed orphans (this replica knows the
    /// topic now: its files are the topic's to open).
    pub fn forget_orphan(&self, name: &str) {
        self.unconfirmed_orphans.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.config.node_id
    }

    /// The metastore.
    pub fn meta(&self) -> &Arc<MetaStore> {
        &self.meta
    }

    /// The ingress WAL.
    pub fn wal(&self) -> &Arc<Wal> {
        &self.wal
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<BrokerMetrics> {
        &self.metrics
    }

    fn check_running(&self) -> Result<(), BrokerError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(BrokerError::ShuttingDown);
        }
        Ok(())
    }

    // ------------------------------------------------------------ topics

    /// Creates a topic and assigns its partitions over the live members (on a
    /// single node: to this node). A child created with `parent` starts at
    /// the parent's high watermark (see [`crate::fanout`]): its cursor files
    /// are written before the create commits, and its cursors start before
    /// this returns.
    pub async fn create_topic(
        &self,
        request: CreateTopicRequest,
    ) -> Result<Arc<Topic>, BrokerError> {
        self.check_running()?;
        let (meta, node, clock) =
            (self.meta.clone(), self.config.node_id.clone(), self.clock.clone());
        if request.parent.is_empty() {
            // Only a child changes links; a plain create does not wait for them.
            return blocking(move || {
                let command = meta.resolve_create_topic(request)?;
                let t = meta.propose_create_topic(command)?;
                place_after_write(&meta, &t, 0, &node, unix_seconds(&*clock));
                Ok(t)
            })
            .await;
        }
        let links = self.fanout.lock_links().await;
        let m = meta.clone();
        let command = blocking(move || Ok(m.resolve_create_topic(request)?)).await?;
        let link = command.parent.as_ref().ok_or_else(|| {
            BrokerError::internal("create a child", "the resolved create lost its parent")
        })?;
        let parent = meta.topic(&link.name).ok_or(BrokerError::TopicNotFound)?;
        let epoch = parse_epoch(&link.attach_epoch)?;
        let child = command.name.clone();
        self.anchor_new_link(&parent, &child, epoch).await?;
        let fanout = self.fanout.clone();
        let t = blocking(move || {
            let t = meta.propose_create_topic(command).map_err(|e| {
                fanout.remove_link_files(&parent, &child, epoch);
                BrokerError::from(e)
            })?;
            place_after_write(&meta, &t, 0, &node, unix_seconds(&*clock));
            Ok(t)
        })
        .await?;
        self.fanout.reconcile_now(&links).await;
        Ok(t)
    }

    /// Attaches an existing topic as a child of `request.parent`; returns
    /// the parent. The child starts at the parent's current high watermark
    /// in every partition: records the parent committed before the attach
    /// are not delivered to it, records committed after it are. Its cursors
    /// are running when this returns (on a cluster: those on this node;
    /// the other owners start theirs when their replicas apply the link).
    pub async fn attach_child(
        &self,
        request: AttachChildRequest,
    ) -> Result<Arc<Topic>, BrokerError> {
        self.check_running()?;
        let links = self.fanout.lock_links().await;
        let meta = self.meta.clone();
        let (command, parent) = blocking(move || {
            let command = meta.resolve_attach_child(request)?;
            let parent = meta.topic(&command.parent).ok_or(BrokerError::TopicNotFound)?;
            Ok((command, parent))
        })
        .await?;
        let epoch = parse_epoch(&command.attach_epoch)?;
        let child = command.child.clone();
        self.anchor_new_link(&parent, &child, epoch).await?;
        let (meta, fanout) = (self.meta.clone(), self.fanout.clone());
        let parent = blocking(move || {
            meta.propose_attach_child(command).map_err(|e| {
                fanout.remove_link_files(&parent, &child, epoch);
                BrokerError::from(e)
            })
        })
        .await?;
        self.fanout.reconcile_now(&links).await;
        // The other owners start their cursors before the attach answers,
        // so the child's lag is complete from the first read on.
        self.settle_other_owners(&parent, LinkChange::Attached).await;
        Ok(parent)
    }

    /// Writes the cursor files of a new link at each parent partition's
    /// high watermark before the link is committed: this node's partitions
    /// here, every other owner's through it (at most
    /// [`LINK_PEER_TIMEOUT`]; an owner that does not answer leaves its
    /// partitions to the attach-time fallback, logged).
    async fn anchor_new_link(
        &self,
        parent: &Arc<Topic>,
        child: &str,
        epoch: u64,
    ) -> Result<(), BrokerError> {
        let fanout = self.fanout.clone();
        let (p, c) = (parent.clone(), child.to_owned());
        blocking(move || Ok(fanout.anchor_link(&p, &c, epoch, &fanout.owned_partitions(&p))))
            .await?;
        let Some(peers) = &self.links else { return Ok(()) };
        let link = NewLink {
            parent: parent.name().to_owned(),
            incarnation: parent.incarnation(),
            child: child.to_owned(),
            epoch,
        };
        let asks = self.other_owners(parent).into_iter().map(|(member, partitions)| {
            let ask = peers.anchor(&member, &link, &partitions);
            async move { (member, partitions, tokio::time::timeout(LINK_PEER_TIMEOUT, ask).await) }
        });
        for (member, partitions, answer) in futures_util::future::join_all(asks).await {
            let missing = match answer {
                Ok(Ok(anchored)) => {
                    partitions.iter().filter(|p| !anchored.contains(p)).copied().collect()
                }
                Ok(Err(e)) => {
                    warn!(parent = parent.name(), child, peer = %member, error = %e, "an owner could not anchor a new child's cursors; they start from the attach time");
                    partitions
                }
                Err(_) => {
                    warn!(parent = parent.name(), child, peer = %member, "an owner did not answer the anchor of a new child's cursors in time; they start from the attach time");
                    partitions
                }
            };
            if !missing.is_empty() {
                warn!(parent = parent.name(), child, peer = %member, partitions = ?missing, "parent partitions not anchored at their high watermark; their cursors start from the attach time");
            }
        }
        Ok(())
    }

    /// The other members owning partitions of `parent`, with their
    /// partitions (cluster only; unassigned partitions are nobody's).
    fn other_owners(&self, parent: &Topic) -> Vec<(String, Vec<u32>)> {
        let snap = self.meta.snapshot();
        let mut out: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
        for p in 0..parent.partitions() {
            if let Some(a) = snap.assignment(parent.name(), p)
                && a.owner_id != self.config.node_id
            {
                out.entry(a.owner_id.clone()).or_default().push(p);
            }
        }
        out.into_iter().collect()
    }

    /// Detaches `child` from `parent`. When this returns the link's cursors
    /// have stopped and their files are removed; the child keeps what it
    /// received and becomes standalone.
    pub async fn detach_child(&self, parent: &str, child: &str) -> Result<(), BrokerError> {
        self.check_running()?;
        let links = self.fanout.lock_links().await;
        let (meta, p, c) = (self.meta.clone(), parent.to_owned(), child.to_owned());
        let (parent, link) = blocking(move || Ok(meta.detach_child(&p, &c)?)).await?;
        self.fanout.reconcile_now(&links).await;
        if let Some(epoch) = cursor_file::parse_epoch(&link.attach_epoch) {
            // Cursors that never ran left their anchor files behind.
            let (fanout, child, parent) = (self.fanout.clone(), child.to_owned(), parent.clone());
            blocking(move || Ok(fanout.remove_link_files(&parent, &child, epoch))).await?;
        }
        self.settle_other_owners(&parent, LinkChange::Detached).await;
        Ok(())
    }

    /// After a link change this node has applied: each other owner of
    /// `parent`'s partitions applies it too and starts the cursors it adds
    /// or stops the ones it ends before this returns (at most [`LINK_PEER_TIMEOUT`] each; one that
    /// does not answer stops them within a second of applying it).
    async fn settle_other_owners(&self, parent: &Topic, change: LinkChange) {
        let Some(peers) = &self.links else { return };
        let applied = self.meta.snapshot().applied_index();
        let asks = self.other_owners(parent).into_iter().map(|(member, _)| {
            let ask = peers.settle(&member, applied);
            async move { (member, tokio::time::timeout(LINK_PEER_TIMEOUT, ask).await) }
        });
        for (member, answer) in futures_util::future::join_all(asks).await {
            match (answer, change) {
                (Ok(Ok(())), _) => {}
                (Ok(Err(e)), LinkChange::Detached) => {
                    warn!(parent = parent.name(), peer = %member, error = %e, "an owner did not confirm it stopped a dissolved link's cursors; it stops them when it applies the change")
                }
                (Err(_), LinkChange::Detached) => {
                    warn!(parent = parent.name(), peer = %member, "an owner did not confirm in time that it stopped a dissolved link's cursors; it stops them when it applies the change")
                }
                (Ok(Err(e)), LinkChange::Attached) => {
                    warn!(parent = parent.name(), peer = %member, error = %e, "an owner did not confirm it started a new link's cursors; it starts them when it applies the change")
                }
                (Err(_), LinkChange::Attached) => {
                    warn!(parent = parent.name(), peer = %member, "an owner did not confirm in time that it started a new link's cursors; it starts them when it applies the change")
                }
            }
        }
    }

    /// The children of `parent`, in attach order, with their fan-out lag
    /// (on a cluster, every owner's cursors: `lag_complete` only when every
    /// owner answered within [`LAG_PEER_TIMEOUT`]).
    pub async fn children(&self, parent: &str) -> Result<Vec<ChildLag>, BrokerError> {
        let parent = self.topic(parent)?;
        let (fanout, p) = (self.fanout.clone(), parent.clone());
        let here = blocking(move || Ok(fanout.lag_here(&p))).await?;
        let Some(peers) = &self.links else { return Ok(here.children) };
        let asks = self.other_owners(&parent).into_iter().map(|(member, partitions)| {
            let ask = peers.lag(&member, parent.name(), parent.incarnation());
            async move { (member, partitions, tokio::time::timeout(LAG_PEER_TIMEOUT, ask).await) }
        });
        let answers: Vec<(String, Vec<u32>, Option<PeerLag>)> =
            futures_util::future::join_all(asks)
                .await
                .into_iter()
                .map(|(member, partitions, answer)| {
                    (member, partitions, answer.ok().and_then(Result::ok))
                })
                .collect();
        Ok(merge_lags(parent.partitions(), here, answers))
    }

    /// This node's figures of `parent`'s children (the owner's side of
    /// [`LinkPeers::lag`]); `incarnation` must be the one held here.
    pub async fn fanout_lag_for_peer(
        &self,
        parent: &str,
        incarnation: u64,
    ) -> Result<PeerLag, BrokerError> {
        let parent = self.topic_of_incarnation(parent, incarnation)?;
        let fanout = self.fanout.clone();
        blocking(move || Ok(fanout.lag_here(&parent))).await
    }

    /// Anchors another node's new link in this node's partitions of its
    /// parent (the owner's side of [`LinkPeers::anchor`]); the partitions
    /// anchored.
    pub async fn anchor_link_for_peer(
        &self,
        link: NewLink,
        partitions: Vec<u32>,
    ) -> Result<Vec<u32>, BrokerError> {
        self.check_running()?;
        let parent = self.topic_of_incarnation(&link.parent, link.incarnation)?;
        let _links = self.fanout.lock_links().await;
        let fanout = self.fanout.clone();
        blocking(move || Ok(fanout.anchor_for_peer(&parent, &link, &partitions))).await
    }

    /// Applies the metastore up to `applied_index` (waiting at most
    /// [`LINK_PEER_TIMEOUT`]) and reconciles the fan-out cursors (the
    /// owner's side of [`LinkPeers::settle`]).
    pub async fn settle_links_for_peer(&self, applied_index: u64) -> Result<(), BrokerError> {
        self.check_running()?;
        let deadline = tokio::time::Instant::now() + LINK_PEER_TIMEOUT;
        while self.meta.snapshot().applied_index() < applied_index {
            if tokio::time::Instant::now() >= deadline {
                return Err(BrokerError::Meta(MetaError::Unavailable(format!(
                    "this replica has not applied index {applied_index} yet"
                ))));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let links = self.fanout.lock_links().await;
        self.fanout.reconcile_now(&links).await;
        Ok(())
    }

    /// `name` as this replica holds it, if it is incarnation `incarnation`
    /// (another one: not found, as the caller knows it).
    fn topic_of_incarnation(
        &self,
        name: &str,
        incarnation: u64,
    ) -> Result<Arc<Topic>, BrokerError> {
        let t = self.topic(name)?;
        if t.incarnation() != incarnation {
            return Err(BrokerError::TopicNotFound);
        }
        Ok(t)
    }

    /// Alters a topic (new partitions are assigned over the alive members).
    pub async fn alter_topic(
        &self,
        name: &str,
        request: AlterTopicRequest,
    ) -> Result<Arc<Topic>, BrokerError> {
        self.check_running()?;
        let (meta, node, name) = (self.meta.clone(), self.config.node_id.clone(), name.to_owned());
        let clock = self.clock.clone();
        let t = blocking(move || {
            let before = meta.topic(&name).map_or(0, |t| t.partitions());
            let t = meta.alter_topic(&name, request)?;
            if t.partitions() > before {
                place_after_write(&meta, &t, before, &node, unix_seconds(&*clock));
            }
            Ok(t)
        })
        .await?;
        if let Some(rt) = self.topics.get_open(t.name(), t.incarnation()) {
            rt.wake.everyone(); // caps may have grown
        }
        if !t.children().is_empty() {
            // New parent partitions need cursors now, not at the next tick.
            let links = self.fanout.lock_links().await;
            self.fanout.reconcile_now(&links).await;
        }
        Ok(t)
    }

    /// Deletes a topic and its files. Undispatched records of it are
    /// discarded by the dispatcher. Links dissolve: a deleted parent's
    /// cursors stop (their files went with its directory), a deleted
    /// child's cursors stop and their files in the parent's partitions are
    /// removed before this returns.
    pub async fn delete_topic(&self, name: &str) -> Result<(), BrokerError> {
        self.check_running()?;
        let links = self.fanout.lock_links().await;
        let (meta, topics, name) = (self.meta.clone(), self.topics.clone(), name.to_owned());
        let deleted = blocking(move || {
            let t = meta.delete_topic(&name)?;
            topics.remove(&name, t.incarnation())?;
            Ok(t)
        })
        .await?;
        self.metrics.forget_topic(deleted.name(), deleted.partitions());
        self.fanout.reconcile_now(&links).await;
        if let Some(link) = deleted.parent()
            && let Some(parent) = self.meta.topic(&link.name)
            && let Some(epoch) = cursor_file::parse_epoch(&link.attach_epoch)
        {
            let (fanout, child) = (self.fanout.clone(), deleted.name().to_owned());
            blocking(move || Ok(fanout.remove_link_files(&parent, &child, epoch))).await?;
        }
        Ok(())
    }

    /// A topic's record.
    pub fn topic(&self, name: &str) -> Result<Arc<Topic>, BrokerError> {
        self.meta.topic(name).ok_or(BrokerError::TopicNotFound)
    }

    /// A page of topics.
    pub fn list_topics(&self, after: &str, limit: usize) -> TopicPage {
        self.meta.list_topics(after, limit)
    }

    /// Per-partition details of a topic (all, or one).
    pub fn partition_stats(&self, t: &Topic, only: Option<u32>) -> Vec<PartitionStats> {
        let rt = self.topics.get_open(t.name(), t.incarnation());
        let state = self.meta.snapshot();
        let range = match only {
            Some(p) => p..p + 1,
            None => 0..t.partitions(),
        };
        range
            .map(|p| {
                let s = rt.as_ref().and_then(|rt| rt.partition_stats(p));
                let s = s.unwrap_or(LogStats {
                    segments: 0,
                    oldest_offset: 0,
                    next_offset: 0,
                    high_watermark: 0,
                    size_bytes: 0,
                    oldest_segment_at_ms: None,
                });
                let owner = crate::ownership::partition_owner(&state, t.name(), p);
                PartitionStats {
                    index: p,
                    segments: s.segments,
                    oldest_offset: s.oldest_offset,
                    next_offset: s.next_offset,
                    high_watermark: s.high_watermark,
                    size_bytes: s.size_bytes,
                    oldest_segment_at: s.oldest_segment_at_ms.map(|ms| ms / 1000),
                    owner_node: owner.owner_node,
                    stats_from: None,
                    status: owner.status,
                    owner_liveness: owner.liveness,
                }
            })
            .collect()
    }

    // ----------------------------------------------------------- produce

    /// Checks a produce against its topic (delayed child, schema, pinned
    /// partition) and picks the partition.
    fn accept_one(
        &self,
        t: &Topic,
        key: Option<&[u8]>,
        partition: Option<u32>,
        payload: &[u8],
    ) -> Result<u32, BrokerError> {
        if t.is_delayed_child() {
            self.metrics
                .produce_rejections
                .get_or_create(&RejectionLabels {
                    topic: t.name().into(),
                    reason: "delayed_child".into(),
                })
                .inc();
            return Err(BrokerError::DelayedChild);
        }
        if let Some(schema) = self.meta.compiled_schema(t.name())
            && let Err(reason) = schema.validate_payload(payload)
        {
            self.metrics
                .produce_rejections
                .get_or_create(&RejectionLabels { topic: t.name().into(), reason: "schema".into() })
                .inc();
            return Err(BrokerError::Invalid(format!("invalid argument: schema: {reason}")));
        }
        match (partition, key) {
            (Some(p), _) if p >= t.partitions() => {
                Err(BrokerError::Invalid("invalid argument: partition out of range".into()))
            }
            (Some(p), _) => Ok(p),
            (None, Some(k)) => Ok(keyed_partition(k, t.partitions())),
            (None, None) => Ok(self.round_robin.pick(t.name(), t.partitions(), self.clock.mono())),
        }
    }

    /// Produces one record: answers once it is fsynced in the ingress WAL.
    pub async fn produce(
        &self,
        topic: &str,
        key: Option<Bytes>,
        partition: Option<u32>,
        payload: Bytes,
    ) -> Result<(), BrokerError> {
        self.check_running()?;
        let t = self.topic(topic)?;
        let p = self.accept_one(&t, key.as_deref(), partition, &payload)?;
        let rec = RecordRef {
            topic,
            incarnation: Some(t.incarnation()),
            key: key.as_deref(),
            partition: p,
            accepted_at_ms: self.clock.wall_ms(),
            payload: &payload,
        };
        let pending = self.wal.append_async(&rec).map_err(|e| self.wal_error(e))?;
        pending.await.map_err(|e| self.wal_error(e))?;
        Ok(())
    }

    /// Produces a batch atomically from the client's view: every record is
    /// checked before any is appended; one failure refuses all
    /// (`message <i>: ...`). Answers once the last record is durable.
    pub async fn produce_batch(
        &self,
        topic: &str,
        records: Vec<ProduceRecord>,
    ) -> Result<usize, BrokerError> {
        self.check_running()?;
        let t = self.topic(topic)?;
        let mut parts = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            let p = self.accept_one(&t, r.key.as_deref(), r.partition, &r.payload).map_err(
                |e| match e {
                    BrokerError::Invalid(m) => BrokerError::Invalid(format!("message {i}: {m}")),
                    other => other,
                },
            )?;
            parts.push(p);
        }
        let now = self.clock.wall_ms();
        let refs: Vec<RecordRef<'_>> = records
            .iter()
            .zip(&parts)
            .map(|(r, p)| RecordRef {
                topic,
                incarnation: Some(t.incarnation()),
                key: r.key.as_deref(),
                partition: *p,
                accepted_at_ms: now,
                payload: &r.payload,
            })
            .collect();
        let pending = self.wal.append_many_async(&refs).map_err(|e| self.wal_error(e))?;
        drop(refs);
        let range = pending.await.map_err(|e| self.wal_error(e))?;
        Ok((range.end - range.start) as usize)
    }

    fn wal_error(&self, e: narad_wal::WalError) -> BrokerError {
        if let narad_wal::WalError::Record(r) = &e {
            return BrokerError::Invalid(format!("invalid argument: {r}"));
        }
        self.metrics.error("messaging", "append");
        BrokerError::Wal(Arc::new(e))
    }

    // ----------------------------------------------------------- consume

    /// Leases up to `max` messages (queue mode, or one pinned partition),
    /// waiting up to `wait` for one to become available.
    pub async fn consume(
        &self,
        topic: &str,
        partition: Option<u32>,
        wait: Duration,
        max: usize,
    ) -> Result<Vec<Delivered>, BrokerError> {
        let pick = match partition {
            Some(p) => Pick::One(p),
            None => Pick::Any,
        };
        self.consume_picked(topic, pick, wait, max).await
    }

    /// Leases up to `max` messages from `order`'s partitions, in that order
    /// (those this node serves; others are passed over), without waiting:
    /// a queue-mode consume that chose where to start (see the server's
    /// `consume_any`).
    pub async fn consume_in_order(
        &self,
        topic: &str,
        order: Vec<u32>,
        max: usize,
    ) -> Result<Vec<Delivered>, BrokerError> {
        self.consume_picked(topic, Pick::Order(order), Duration::ZERO, max).await
    }

    /// The topic's runtime, opened if need be (first touch of the topic on
    /// this node: opening does I/O).
    async fn open_rt(&self, t: &Topic) -> Result<Arc<TopicRt>, BrokerError> {
        match self.topics.get_open(t.name(), t.incarnation()) {
            Some(rt) => Ok(rt),
            None => {
                let (topics, t2) = (self.topics.clone(), t.clone());
                blocking(move || topics.topic(&t2)).await
            }
        }
    }

    async fn consume_picked(
        &self,
        topic: &str,
        pick: Pick,
        wait: Duration,
        max: usize,
    ) -> Result<Vec<Delivered>, BrokerError> {
        let started = self.clock.mono();
        let deadline = started + wait;
        let t = self.topic(topic)?;
        if let Pick::One(p) = pick
            && p >= t.partitions()
        {
            return Err(BrokerError::Invalid("invalid partition".into()));
        }
        let rt = self.open_rt(&t).await?;
        let mut t = t;
        let any = matches!(pick, Pick::Any);
        loop {
            let notified = rt.wake.waiter(!any);
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (got, full) = self.take(&t, &rt, &pick, max).inspect_err(|_| {
                // Other partitions may still hold what woke us.
                rt.wake.pass_on();
            })?;
            if full && any {
                // Stopped at a limit, not because nothing was left.
                rt.wake.pass_on();
            }
            let now = self.clock.mono();
            if !got.is_empty() || now >= deadline || self.draining.load(Ordering::Acquire) {
                let outcome = match (got.is_empty(), wait.is_zero()) {
                    (false, true) | (true, true) => "no_wait",
                    (false, false) => "hit",
                    (true, false) => "timeout",
                };
                self.metrics
                    .consume_wait_seconds
                    .0
                    .get_or_create(&WaitLabels { topic: topic.into(), outcome: outcome.into() })
                    .observe((now - started).as_secs_f64());
                if got.is_empty() {
                    self.metrics
                        .consume_empty
                        .get_or_create(&TopicLabels { topic: topic.into() })
                        .inc();
                }
                return Ok(got);
            }
            t = self.nap(topic, &rt, notified.as_mut(), deadline - now).await?;
        }
    }

    /// How many messages a consume could lease now from each partition of
    /// `topic` this node serves (on a cluster node: those it owns), in
    /// partition order. A partition whose log is not open has none.
    pub fn ready_counts(&self, topic: &str) -> Result<Vec<(u32, u64)>, BrokerError> {
        let t = self.topic(topic)?;
        let rt = self.topics.get_open(t.name(), t.incarnation());
        Ok(self.ready_in(&t, rt.as_deref()))
    }

    fn ready_in(&self, t: &Topic, rt: Option<&TopicRt>) -> Vec<(u32, u64)> {
        let limits = shard_limits(t);
        let now_ms = self.clock.wall_ms();
        let owned = self.owned_partitions(t);
        owned
            .into_iter()
            .map(|p| {
                let Some(part) = rt.and_then(|rt| rt.peek_partition(p)) else { return (p, 0) };
                let hwm = part.log.high_watermark();
                let n = match part.shard() {
                    Ok(mut g) => g.as_mut().map_or(0, |s| {
                        s.purge_expired(now_ms);
                        s.ready(hwm, &limits)
                    }),
                    Err(_) => 0,
                };
                (p, n)
            })
            .collect()
    }

    /// [`Broker::ready_counts`] once some partition has a message ready,
    /// or once `wait` is over (node RPC ReadyCounts: another node serving
    /// a queue-mode consume waits on it). It leases nothing, and waits as
    /// a partition waiter does, so it never takes the wake-up meant for a
    /// consumer of this node.
    pub async fn wait_ready(
        &self,
        topic: &str,
        wait: Duration,
    ) -> Result<Vec<(u32, u64)>, BrokerError> {
        let deadline = self.clock.mono() + wait;
        let mut t = self.topic(topic)?;
        let rt = self.open_rt(&t).await?;
        loop {
            let notified = rt.wake.waiter(true);
            tokio::pin!(notified);
            notified.as_mut().enable();
            let counts = self.ready_in(&t, Some(&rt));
            let now = self.clock.mono();
            if counts.iter().any(|(_, n)| *n > 0)
                || now >= deadline
                || self.draining.load(Ordering::Acquire)
            {
                return Ok(counts);
            }
            t = self.nap(topic, &rt, notified.as_mut(), deadline - now).await?;
        }
    }

    /// A long poll's wait between two looks: until `notified` fires, the
    /// next lease of `rt` expires or `left` is over. Then `topic` is read
    /// again: it may have been deleted or altered meanwhile.
    async fn nap<F: std::future::Future>(
        &self,
        topic: &str,
        rt: &TopicRt,
        notified: std::pin::Pin<&mut F>,
        left: Duration,
    ) -> Result<Arc<Topic>, BrokerError> {
        let next_expiry = self
            .next_expiry(rt)
            .map(|ms| Duration::from_millis(ms.saturating_sub(self.clock.wall_ms())));
        let sleep = left.min(next_expiry.unwrap_or(Duration::MAX));
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep(sleep) => {}
        }
        let t = self.topic(topic)?;
        if rt.is_closed() || t.incarnation() != rt.incarnation {
            return Err(BrokerError::TopicNotFound);
        }
        Ok(t)
    }

    fn next_expiry(&self, rt: &TopicRt) -> Option<u64> {
        rt.open_partitions()
            .iter()
            .filter_map(|p| {
                p.shard().ok().and_then(|mut g| g.as_mut().and_then(|s| s.next_expiry()))
            })
            .min()
    }

    /// One pass over the partitions: reserve, then read. The flag says
    /// whether the pass stopped at a limit (`max` records or
    /// [`CONSUME_BATCH_BYTES`]) rather than because nothing takeable was
    /// left.
    ///
    /// A partition that fails (its consumer state cannot be loaded, a read
    /// fails with an I/O error) is passed over in queue mode: the others
    /// still serve, and the pass fails only if every partition did. A
    /// pinned take fails only if it leased nothing. Either way what was
    /// leased is answered, never dropped behind an error.
    fn take(
        &self,
        t: &Topic,
        rt: &TopicRt,
        pick: &Pick,
        max: usize,
    ) -> Result<(Vec<Delivered>, bool), BrokerError> {
        let n = t.partitions();
        let order: Vec<u32> = match pick {
            Pick::One(p) => vec![*p],
            Pick::Order(order) => {
                let owned = self.meta.is_replicated().then(|| self.owned_partitions(t));
                order
                    .iter()
                    .copied()
                    .filter(|p| *p < n && owned.as_ref().is_none_or(|o| o.contains(p)))
                    .collect()
            }
            Pick::Any => {
                let start = rt.consume_rr.fetch_add(1, Ordering::Relaxed) as u32 % n.max(1);
                // Only a cluster node filters (a single node owns them all:
                // no set built on its consume path).
                let owned = self.meta.is_replicated().then(|| self.owned_partitions(t));
                (0..n)
                    .map(|i| (start + i) % n)
                    .filter(|p| owned.as_ref().is_none_or(|o| o.contains(p)))
                    .collect()
            }
        };
        let limits = shard_limits(t);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let (mut tried, mut failures, mut first_error) = (0usize, 0usize, None);
        for p in order {
            let Some(part) = rt.partition_if_open(p) else { continue };
            tried += 1;
            let failed =
                self.take_from(&rt.name, &part, &limits, max - out.len(), &mut bytes, &mut out);
            if let Some(e) = failed {
                failures += 1;
                self.partition_failed(&rt.name, &part, &e);
                first_error.get_or_insert(e);
            }
            if out.len() >= max || bytes >= CONSUME_BATCH_BYTES {
                return Ok((out, true));
            }
        }
        match first_error {
            Some(e) if out.is_empty() && failures == tried => Err(e),
            _ => Ok((out, false)),
        }
    }

    /// Counts a partition a consume could not take from, and warns (at most
    /// every [`CONSUME_ERROR_WARN_EVERY`] per partition: a client polling a
    /// bad partition must not flood the log).
    fn partition_failed(&self, topic: &Arc<str>, part: &PartitionRt, e: &BrokerError) {
        self.metrics.error("messaging", "consume");
        self.metrics
            .consume_partition_errors
            .get_or_create(&PartitionLabels::new(topic, part.index))
            .inc();
        let now = self.clock.wall_ms();
        let last = part.consume_warned_ms.load(Ordering::Relaxed);
        let every = CONSUME_ERROR_WARN_EVERY.as_millis() as u64;
        if (last == 0 || now.saturating_sub(last) >= every)
            && part
                .consume_warned_ms
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            warn!(topic = %topic, partition = part.index, error = %e, "consume passes over a partition it cannot read");
        }
    }

    /// Leases from one partition into `out`; returns why it stopped early,
    /// if it failed (what it leased before is in `out` all the same).
    fn take_from(
        &self,
        topic: &Arc<str>,
        part: &PartitionRt,
        limits: &crate::consume::shard::ShardLimits,
        max: usize,
        bytes: &mut usize,
        out: &mut Vec<Delivered>,
    ) -> Option<BrokerError> {
        let labels = PartitionLabels::new(topic, part.index);
        let budget = CONSUME_BATCH_BYTES.saturating_sub(*bytes);
        let Taken { leased, skipped, failed } =
            take(topic, part, limits, self.clock.wall_ms(), max, budget);
        if skipped.corrupt + skipped.dropped > 0 {
            self.metrics
                .consumer_corrupt_skipped
                .get_or_create(&labels)
                .inc_by(skipped.corrupt + skipped.dropped);
        }
        for l in leased {
            let r = l.record;
            *bytes += r.payload.len();
            self.metrics.messages_consumed.get_or_create(&labels).inc();
            self.metrics.bytes_consumed.get_or_create(&labels).inc_by(r.payload.len() as u64);
            out.push(Delivered {
                topic: topic.clone(),
                partition: part.index,
                offset: r.offset,
                key: r.key,
                payload: r.payload,
                commit_time_ms: r.commit_time_ms,
                receipt_handle: Some(receipt_handle(part.index, r.offset, l.nonce)),
            });
        }
        failed
    }

    /// Reads without leasing (replay mode): up to `max` records from
    /// `offset`.
    pub async fn replay(
        self: &Arc<Self>,
        topic: &str,
        partition: u32,
        offset: u64,
        max: usize,
    ) -> Result<Vec<Delivered>, BrokerError> {
        let t = self.topic(topic)?;
        if partition >= t.partitions() {
            return Err(BrokerError::Invalid("invalid partition".into()));
        }
        let Some(rt) = self.topics.get_open(t.name(), t.incarnation()) else {
            return Ok(Vec::new()); // nothing was ever committed here
        };
        let part = match rt.partition_if_open(partition) {
            Some(part) => part,
            // Closed as idle: reopen it (recovery reads its files) on the
            // blocking pool, not on this runtime worker.
            None if rt.was_evicted(partition) => {
                let (me, t) = (self.clone(), t.clone());
                blocking(move || me.topics.partition(&t, partition)).await?
            }
            None => return Ok(Vec::new()), // nothing was ever committed here
        };
        if offset >= part.log.high_watermark() {
            return Ok(Vec::new());
        }
        let batch =
            part.log.read(offset, max, CONSUME_BATCH_BYTES as u64).map_err(|e| match e {
                ReadError::Gone { oldest, .. } => BrokerError::AgedOut { offset, oldest },
                other => BrokerError::internal("consume", other),
            })?;
        let topic: Arc<str> = t.name().into();
        let labels = PartitionLabels::new(&topic, partition);
        let mut out = Vec::new();
        for r in batch.records {
            if out.is_empty() && r.offset != offset {
                return Err(BrokerError::Unreadable(offset));
            }
            self.metrics.messages_consumed.get_or_create(&labels).inc();
            self.metrics.bytes_consumed.get_or_create(&labels).inc_by(r.payload.len() as u64);
            out.push(Delivered {
                topic: topic.clone(),
                partition,
                offset: r.offset,
                key: r.key,
                payload: r.payload,
                commit_time_ms: r.commit_time_ms,
                receipt_handle: None,
            });
        }
        if out.is_empty() {
            return Err(BrokerError::Unreadable(offset));
        }
        Ok(out)
    }

    /// Acks, extends or nacks the lease named by `handle`.
    pub fn resolve(&self, topic: &str, handle: &str, action: AckAction) -> Result<(), BrokerError> {
        let (p, offset, nonce) = parse_receipt_handle(handle)
            .ok_or_else(|| BrokerError::Invalid("receipt handle is malformed".into()))?;
        let t = self.topic(topic)?;
        let Some(rt) = self.topics.get_open(t.name(), t.incarnation()) else {
            return Err(BrokerError::StaleHandle);
        };
        let Some(part) = rt.partition_if_open(p) else { return Err(BrokerError::StaleHandle) };
        let limits = shard_limits(&t);
        let now = self.clock.wall_ms();
        let (result, freed) = {
            let mut g = part.shard()?;
            let shard = g.as_mut().expect("shard() fills the slot");
            // An ack frees nothing a consumer could take unless leases
            // expired just now or the partition was at one of its limits;
            // a nack always does.
            let expired = shard.purge_expired(now) > 0;
            let was_blocked = shard.blocked(&limits);
            let result = match action {
                AckAction::Ack => shard.ack(offset, nonce, now, &limits).map(drop),
                AckAction::Extend => shard.extend(offset, nonce, now, &limits),
                AckAction::Nack => shard.nack(offset, nonce, now),
            };
            let freed = match action {
                AckAction::Ack => expired || (was_blocked && result.is_ok()),
                AckAction::Extend => expired,
                AckAction::Nack => expired || result.is_ok(),
            };
            (result, freed)
        };
        if freed {
            rt.wake.available();
        }
        match result {
            Ok(()) => {
                let labels = TopicLabels { topic: topic.into() };
                match action {
                    AckAction::Extend => {
                        self.metrics.ack_extended.get_or_create(&labels).inc();
                    }
                    AckAction::Nack => {
                        self.metrics.nack.get_or_create(&labels).inc();
                    }
                    AckAction::Ack => {}
                }
                Ok(())
            }
            Err(ResolveError::Stale) => Err(BrokerError::StaleHandle),
            Err(ResolveError::AheadFull) => {
                self.metrics
                    .ack_rejected
                    .get_or_create(&crate::metrics::ReasonLabels { reason: "cap".into() })
                    .inc();
                Err(BrokerError::AckedAheadFull)
            }
        }
    }

    // -------------------------------------------------------- background

    fn spawn_background(self: &Arc<Self>) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        let me = Arc::downgrade(self);
        let stop = self.stop.subscribe();
        tasks.push(every_blocking(&me, FRONTIER_PERSIST_INTERVAL, stop.clone(), |b| {
            // An idle node's pass is one atomic load, not a look at each of
            // its partitions ten times a second.
            let moves = b.topics.frontier_moves();
            if b.frontier_moves_seen.swap(moves, Ordering::Relaxed) != moves {
                persist_frontiers(&b.topics, &b.metrics);
            }
        }));
        tasks.push(tokio::spawn(every(EXPIRY_PURGE_INTERVAL, stop.clone(), {
            let me = me.clone();
            move || {
                let me = me.clone();
                async move {
                    if let Some(b) = me.upgrade() {
                        b.purge_expired();
                    }
                }
            }
        })));
        tasks.push(every_blocking(
            &me,
            RETENTION_INTERVAL,
            stop.clone(),
            Broker::enforce_retention,
        ));
        if self.config.idle_log_eviction_ms > 0 {
            tasks.push(every_blocking(&me, IDLE_EVICTION_INTERVAL, stop.clone(), |b| {
                b.evict_idle_logs();
            }));
        }
        tasks.push(every_blocking(&me, METRICS_POLL_INTERVAL, stop.clone(), Broker::poll_metrics));
        if self.meta.is_replicated() {
            tasks.push(self.follow_replicated_deletes(stop));
        }
    }

    /// A cluster node learns of most deletes from consensus, not from its
    /// own HTTP handlers: a delete accepted by another node reaches this
    /// one as an applied command. This removes the deleted incarnation's
    /// local files then (what [`Broker::delete_topic`] does on the node
    /// that took the request), so a topic deleted anywhere stops holding
    /// disk everywhere. The listener only queues (it runs under the
    /// metastore's writer lock); a task does the removal. Removal names the
    /// incarnation, so it never touches a newer one, and is idempotent.
    fn follow_replicated_deletes(
        self: &Arc<Self>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> JoinHandle<()> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, u64, u32)>();
        self.meta.on_applied(Arc::new(move |_command, response| {
            if let narad_meta::Response::TopicDeleted(t) = response {
                let _ = tx.send((t.name().to_owned(), t.incarnation(), t.partitions()));
            }
        }));
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let (name, incarnation, partitions) = tokio::select! {
                    next = rx.recv() => match next {
                        Some(next) => next,
                        None => return,
                    },
                    _ = stop.changed() => return,
                };
                let Some(b) = me.upgrade() else { return };
                let topics = b.topics.clone();
                let removed = {
                    let name = name.clone();
                    blocking(move || topics.remove(&name, incarnation)).await
                };
                match removed {
                    Ok(()) => {
                        b.metrics.forget_topic(&name, partitions);
                        let links = b.fanout.lock_links().await;
                        b.fanout.reconcile_now(&links).await;
                    }
                    Err(e) => {
                        b.metrics.error("storage", "delete_topic");
                        warn!(topic = %name, incarnation, error = %e, "could not remove the files of a topic deleted through the cluster; the start-up sweep retries");
                    }
                }
            }
        })
    }

    fn purge_expired(&self) {
        let now = self.clock.wall_ms();
        for rt in self.topics.all() {
            let mut freed = 0;
            for part in rt.open_partitions() {
                if let Ok(mut g) = part.shard() {
                    freed += g.as_mut().map_or(0, |s| s.purge_expired(now));
                }
            }
            if freed > 0 {
                rt.wake.everyone();
            }
        }
    }

    /// Closes the partition logs unaccessed for `storage.idle_log_eviction_ms`
    /// whose closing loses nothing (see [`Topics::evict_idle`]); every minute
    /// in the background unless the setting is 0. Blocking. Returns how many
    /// it closed.
    pub fn evict_idle_logs(&self) -> usize {
        let idle_ms = self.config.idle_log_eviction_ms;
        if idle_ms == 0 {
            return 0;
        }
        let closed = self.topics.evict_idle(idle_ms, &|rt| {
            self.meta
                .topic(&rt.name)
                .filter(|t| t.incarnation() == rt.incarnation)
                .map(|t| t.retention_ms())
        });
        self.metrics.idle_logs_evicted.inc_by(closed as u64);
        self.metrics.open_partition_logs.set(self.topics.open_logs() as i64);
        closed
    }

    /// Runs retention on every open log (every minute in the background).
    pub fn enforce_retention(&self) {
        let now = self.clock.wall_ms();
        for rt in self.topics.all() {
            let Some(t) = self.meta.topic(&rt.name).filter(|t| t.incarnation() == rt.incarnation)
            else {
                continue;
            };
            for part in rt.open_partitions() {
                let started = std::time::Instant::now();
                let pass = part.log.enforce_retention(now, t.retention_ms());
                self.metrics
                    .storage_retention_run_duration_seconds
                    .0
                    .get_or_create(&PartitionLabels::new(&rt.name, part.index))
                    .observe(started.elapsed().as_secs_f64());
                match pass {
                    Ok(r) if r.segments_deleted > 0 => {
                        let l = PartitionLabels::new(&rt.name, part.index);
                        self.metrics
                            .storage_retention_bytes_deleted
                            .get_or_create(&l)
                            .inc_by(r.bytes_deleted);
                        self.metrics
                            .storage_retention_messages_deleted
                            .get_or_create(&l)
                            .inc_by(r.records_deleted);
                        info!(topic = %rt.name, partition = part.index, segments = r.segments_deleted, "retention deleted segments");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        self.metrics.error("storage", "retention");
                        warn!(topic = %rt.name, partition = part.index, error = %e, "retention pass failed");
                    }
                }
            }
        }
    }

    /// Refreshes the gauges (every 5 s in the background; blocking: it
    /// may read a frame header and walks the data directory).
    pub fn poll_metrics(&self) {
        self.poll_cheap_gauges();
        let m = &self.metrics;
        let now_ms = self.clock.wall_ms();
        for rt in self.topics.all() {
            let mut topic_bytes = rt.evicted_bytes();
            for part in rt.open_partitions() {
                let l = PartitionLabels::new(&rt.name, part.index);
                let stats = part.log.stats();
                topic_bytes += stats.size_bytes;
                m.partition_size_bytes.get_or_create(&l).set(stats.size_bytes as i64);
                m.segments.get_or_create(&l).set(stats.segments as i64);
                if let Ok(mut g) = part.shard()
                    && let Some(s) = g.as_mut()
                {
                    let written = part.log.segment_written_at_ms(s.next());
                    let age = written.map_or(0, |t| now_ms.saturating_sub(t));
                    m.oldest_unconsumed_message_age_seconds
                        .get_or_create(&l)
                        .set(age as f64 / 1000.0);
                    m.consumer_lag_messages
                        .get_or_create(&l)
                        .set(stats.next_offset.saturating_sub(s.next()) as i64);
                    m.consumer_dropped_messages
                        .get_or_create(&l)
                        .set(stats.oldest_offset.saturating_sub(s.next()) as i64);
                    m.inflight_size.get_or_create(&l).set(s.in_flight() as i64);
                    m.acked_ahead_size
                        .get_or_create(&l)
                        .set((s.acked_ahead() + s.corrupt_ahead()) as i64);
                }
            }
            m.topic_bytes
                .get_or_create(&TopicLabels { topic: rt.name.to_string() })
                .set(i64::try_from(topic_bytes).unwrap_or(i64::MAX));
        }
        // The walk stats every entry: a data dir of many entries is walked
        // on fewer polls (see DATA_DIR_WALK_ENTRIES_PER_POLL).
        let skip = self.dir_walk_skip.load(Ordering::Relaxed);
        if skip > 0 {
            self.dir_walk_skip.store(skip - 1, Ordering::Relaxed);
            return;
        }
        match dir_size(&self.config.data_dir) {
            Ok((bytes, entries)) => {
                m.data_dir_size_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
                self.dir_walk_skip.store(dir_walk_skip(entries), Ordering::Relaxed);
            }
            Err(_) => m.error("metrics", "snapshot"),
        }
    }

    /// Makes long polls return at once (shutdown is draining requests).
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
        for rt in self.topics.all() {
            rt.wake.everyone();
        }
    }

    /// Refreshes the cheap node-level gauges (called on every scrape).
    pub fn poll_cheap_gauges(&self) {
        let m = &self.metrics;
        let snap = self.meta.snapshot();
        m.topics.set(snap.topic_count() as i64);
        m.partitions.set(snap.topics().map(|t| i64::from(t.partitions())).sum());
        m.ingress_wal_failed.set(i64::from(self.wal.is_latched()));
        let now = self.wal.stats();
        let seen =
            std::mem::replace(&mut *self.wal_seen.lock().unwrap_or_else(|p| p.into_inner()), now);
        m.ingress_wal_syncs.inc_by(now.syncs - seen.syncs);
        m.ingress_wal_records.inc_by(now.records - seen.records);
        m.ingress_wal_bytes.inc_by(now.bytes - seen.bytes);
        m.ingress_wal_sync_seconds.inc_by((now.io_nanos - seen.io_nanos) as f64 / 1e9);
        for (source, n) in [
            ("memory", now.read_memory_bytes - seen.read_memory_bytes),
            ("disk", now.read_disk_bytes - seen.read_disk_bytes),
        ] {
            m.ingress_wal_read_bytes
                .get_or_create(&SourceLabels { source: source.into() })
                .inc_by(n);
        }
        for _ in seen.prep_failures..now.prep_failures {
            m.error("ingress_wal", "prepare");
        }
        for _ in seen.runway_failures..now.runway_failures {
            m.error("ingress_wal", "runway");
        }
        for _ in seen.segment_create_failures..now.segment_create_failures {
            m.error("ingress_wal", "segment_create");
        }
        m.ingress_dispatch_backlog_records.set(self.wal.dispatch_backlog() as i64);
        m.open_partition_logs.set(self.topics.open_logs() as i64);
        // One statvfs: cheap enough for every scrape.
        match fs4::available_space(&self.config.data_dir) {
            Ok(free) => {
                m.data_dir_available_bytes.set(i64::try_from(free).unwrap_or(i64::MAX));
            }
            Err(_) => m.error("metrics", "snapshot"),
        }
    }

    /// Whether the WAL latched a failure.
    pub fn wal_failed(&self) -> bool {
        self.wal.is_latched()
    }

    /// Stops the broker: the dispatcher finishes its commits in flight, the
    /// WAL checkpoint and consumer frontiers are made durable, logs close.
    /// Returns an error if a final sync failed.
    pub async fn shutdown(&self) -> Result<(), BrokerError> {
        if self.shutting_down.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.begin_drain();
        for rt in self.topics.all() {
            rt.wake.everyone();
        }
        let dispatcher = self.dispatcher.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(d) = dispatcher {
            d.stop().await;
        }
        // Fan-out cursors finish their commits in flight before logs close.
        self.stop.send_replace(true);
        let fanout_task = self.fanout_task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = fanout_task {
            let _ = t.await;
        }
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for t in tasks {
            t.abort();
            let _ = t.await;
        }
        let (wal, topics, metrics) = (self.wal.clone(), self.topics.clone(), self.metrics.clone());
        blocking(move || {
            let wal_result = wal.close().map_err(|e| BrokerError::internal("close ingress WAL", e));
            let frontier_errors = persist_frontiers(&topics, &metrics);
            for rt in topics.all() {
                for part in rt.open_partitions() {
                    part.log.close();
                }
            }
            wal_result?;
            if frontier_errors > 0 {
                return Err(BrokerError::internal(
                    "persist consumer frontiers",
                    format!("{frontier_errors} frontier(s) could not be made durable"),
                ));
            }
            info!("broker stopped");
            Ok(())
        })
        .await
    }
}

/// Polls to skip after a data-dir walk that met `entries` entries: about
/// [`DATA_DIR_WALK_ENTRIES_PER_POLL`] stats per poll on average, and a walk
/// at least every [`DATA_DIR_WALK_MAX_SKIP`] + 1 polls.
fn dir_walk_skip(entries: u64) -> u32 {
    u32::try_from(entries / DATA_DIR_WALK_ENTRIES_PER_POLL)
        .unwrap_or(u32::MAX)
        .min(DATA_DIR_WALK_MAX_SKIP)
}

/// The bytes of the files under `dir` (apparent sizes; files that vanish
/// during the walk are skipped), and how many entries (files and
/// directories) the walk met. A metrics walk: it reads no file, so it goes
/// to the file system directly, as the free-space gauge does.
fn dir_size(dir: &std::path::Path) -> std::io::Result<(u64, u64)> {
    let mut total = 0u64;
    let mut entries_met = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && d != dir => continue,
            Err(e) => return Err(e),
        };
        for entry in entries.flatten() {
            entries_met += 1;
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    Ok((total, entries_met))
}

/// Persists every moved consumer frontier; returns how many failed.
fn persist_frontiers(topics: &Topics, metrics: &BrokerMetrics) -> usize {
    let mut failed = 0;
    for rt in topics.all() {
        for part in rt.frontier_dirty_partitions() {
            let started = std::time::Instant::now();
            let persisted = part.persist_frontier();
            if !matches!(persisted, Ok(false)) {
                metrics.frontier_persisted(
                    &rt.name,
                    part.index,
                    persisted.is_ok(),
                    started.elapsed(),
                );
            }
            if let Err(e) = persisted {
                failed += 1;
                metrics.error("storage", "consumer_frontier");
                warn!(topic = %rt.name, partition = part.index, error = %e, "cannot persist the consumer frontier");
            }
        }
    }
    failed
}

/// Runs `f` on the blocking pool every `period` while the broker lives
/// (the passes that do disk I/O or walk every partition).
fn every_blocking(
    me: &std::sync::Weak<Broker>,
    period: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
    f: fn(&Broker),
) -> tokio::task::JoinHandle<()> {
    let me = me.clone();
    tokio::spawn(every(period, stop, move || {
        let me = me.clone();
        async move {
            if let Some(b) = me.upgrade() {
                let _ = tokio::task::spawn_blocking(move || f(&b)).await;
            }
        }
    }))
}

/// Assigns partitions `from..` of `t` through the placement hook, over the
/// ring of live members this node's metastore holds at `now_s`
/// ([`placement::alive_ring`]); with none, this node is the ring (a single
/// node: every partition is local). Partitions the placement leaves
/// unassigned (a child's whose parent partition has no owner yet) wait for
/// the cluster controller.
fn assign_all(
    meta: &MetaStore,
    t: &Topic,
    from: u32,
    node: &str,
    now_s: i64,
) -> Result<(), BrokerError> {
    let state = meta.snapshot();
    let mut ring = placement::alive_ring(&state, now_s);
    if ring.is_empty() {
        ring.push(node.to_owned());
    }
    let assignments = placement::place(&state, t, from..t.partitions(), &ring);
    if !assignments.is_empty() {
        meta.assign_unassigned(t.name(), t.incarnation(), assignments)?;
    }
    Ok(())
}

/// Places the partitions a create (or a grow) just committed, best
/// effort: the write itself succeeded, so its caller hears of it whatever
/// happens here. The topic may already be deleted or recreated through
/// another node (the placement is refused: nothing of this incarnation is
/// left to place), or the control plane may refuse for a moment; the
/// controller places whatever is still unassigned within one tick.
fn place_after_write(meta: &MetaStore, t: &Topic, from: u32, node: &str, now_s: i64) {
    match assign_all(meta, t, from, node, now_s) {
        Ok(()) => {}
        Err(BrokerError::Meta(MetaError::NotFound(_) | MetaError::Conflict(_))) => {
            info!(
                topic = t.name(),
                incarnation = t.incarnation(),
                "the topic was deleted or recreated before its partitions were placed"
            );
        }
        Err(e) => {
            warn!(topic = t.name(), incarnation = t.incarnation(), error = %e, "placing the new partitions failed; the controller places them within a tick");
        }
    }
}

/// The wall clock in Unix seconds (heartbeat times are kept in those).
fn unix_seconds(clock: &dyn narad_clock::Clock) -> i64 {
    (clock.wall_ms() / 1000) as i64
}

/// An attach epoch the metastore just stamped.
fn parse_epoch(hex: &str) -> Result<u64, BrokerError> {
    cursor_file::parse_epoch(hex)
        .ok_or_else(|| BrokerError::internal("attach", format!("bad attach epoch {hex:?}")))
}

/// Which link change [`Broker::settle_other_owners`] settles (for its
/// warnings).
#[derive(Debug, Clone, Copy)]
enum LinkChange {
    Attached,
    Detached,
}

async fn every<F, Fut>(period: Duration, mut stop: tokio::sync::watch::Receiver<bool>, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => f().await,
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lag(name: &str, messages: u64, seconds: f64, complete: bool) -> ChildLag {
        ChildLag {
            name: name.into(),
            delay_ms: 0,
            lag_messages: messages,
            lag_seconds: seconds,
            lag_complete: complete,
        }
    }

    #[test]
    fn a_childs_lag_adds_every_owners_figures_and_is_complete_only_when_all_answered() {
        let here = PeerLag { partitions: vec![0], children: vec![lag("a", 3, 1.0, true)] };
        let n2 = PeerLag { partitions: vec![1], children: vec![lag("a", 4, 2.5, true)] };
        let n3 = PeerLag { partitions: vec![2], children: vec![lag("a", 0, 0.0, true)] };
        let all = merge_lags(
            3,
            here.clone(),
            vec![("n2".into(), vec![1], Some(n2.clone())), ("n3".into(), vec![2], Some(n3))],
        );
        assert_eq!(all, vec![lag("a", 7, 2.5, true)]);
        // An owner that did not answer: its partitions are not counted.
        let silent = merge_lags(
            3,
            here.clone(),
            vec![("n2".into(), vec![1], Some(n2.clone())), ("n3".into(), vec![2], None)],
        );
        assert_eq!(silent, vec![lag("a", 7, 2.5, false)]);
        // A partition nobody reports (unassigned): incomplete.
        assert_eq!(
            merge_lags(3, here.clone(), vec![("n2".into(), vec![1], Some(n2))]),
            vec![lag("a", 7, 2.5, false)]
        );
        // An owner whose replica does not know the link yet.
        let unaware = PeerLag { partitions: vec![1, 2], children: vec![] };
        assert_eq!(
            merge_lags(3, here, vec![("n2".into(), vec![1, 2], Some(unaware))]),
            vec![lag("a", 3, 1.0, false)]
        );
    }

    #[test]
    fn a_small_data_dir_is_walked_on_every_poll_and_a_large_one_at_least_once_a_minute() {
        assert_eq!(dir_walk_skip(0), 0);
        assert_eq!(dir_walk_skip(DATA_DIR_WALK_ENTRIES_PER_POLL - 1), 0);
        // 1,000 topics x 3 partitions with a segment each: 8,007 entries,
        // walked on every 9th poll.
        assert_eq!(dir_walk_skip(8_007), 8);
        assert_eq!(dir_walk_skip(12_000), DATA_DIR_WALK_MAX_SKIP);
        assert_eq!(dir_walk_skip(u64::MAX), DATA_DIR_WALK_MAX_SKIP);
        let once_a_minute = METRICS_POLL_INTERVAL * (DATA_DIR_WALK_MAX_SKIP + 1);
        assert_eq!(once_a_minute, Duration::from_secs(60));
    }

    #[test]
    fn dir_size_counts_the_bytes_and_entries_of_nested_files() {
        let dir = std::env::temp_dir().join(format!("narad-dir-size-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("x"), [0u8; 10]).unwrap();
        std::fs::write(dir.join("a/b/y"), [0u8; 32]).unwrap();
        let got = dir_size(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        // Entries: x, a, a/b, a/b/y.
        assert_eq!(got.unwrap(), (42, 4));
    }
}
