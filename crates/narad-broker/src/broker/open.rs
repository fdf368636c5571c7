//! Opening and stopping the broker: [`BrokerConfig`], [`Registration`],
//! [`Routing`] (and the `Routes` built from it), [`Broker::open`],
//! [`Broker::open_meta`], [`Broker::open_on`], [`Broker::begin_drain`],
//! [`Broker::wal_failed`] and [`Broker::shutdown`].
//!
//! Fields worked on here: `dispatcher`, `fanout_task`, `stop` and
//! `shutting_down` (and every field is first set in `open_on`).
//!
//! Invariants the code relies on:
//! - `open_on` sets `dispatcher` and `fanout_task` exactly once, before the
//!   broker is handed out; `shutdown` takes each exactly once.
//! - The dispatcher and the fan-out cursors share one owner and one view of
//!   owners (`Routes`), so they agree on who owns a partition.
//! - `shutdown` runs once (the `shutting_down` swap) and in the order the
//!   module header gives: the dispatcher stops before `stop` is sent, so
//!   fan-out cursors finish their commits in flight before the logs close,
//!   and logs close only after the WAL closed and the frontiers were
//!   persisted.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_clock::ClockRef;
use narad_fs::FsRef;
use narad_log::LogConfig;
use narad_meta::{Member, MemberStatus, MetaStore, MetaStoreOptions, Topic, TopicDefaults};
use narad_wal::{Wal, WalOptions};
use tokio::sync::Notify;
use tracing::info;

use super::housekeeping::persist_frontiers;
use super::{Broker, blocking, unix_seconds};
use crate::dispatch::driver::{Dispatcher, Resolver};
use crate::dispatch::resolve::{ClusterResolver, DeleteConfirmer, LocalResolver, OwnerIds};
use crate::error::BrokerError;
use crate::fanout::peers::LinkPeers;
use crate::fanout::{FanoutCtx, FanoutRunner};
use crate::metrics::BrokerMetrics;
use crate::owner::{LocalOwner, Owner, RoutedOwner};
use crate::partition::RoundRobin;
use crate::topics::Topics;

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
                    draining: false,
                })?;
            }
            let topics = Topics::new(fs2.clone(), &cfg.data_dir, cfg.log.clone(), clock2.clone())
                .with_metrics(metrics2)
                .with_base_offsets(crate::topics::base_offsets_of(&meta, &cfg.node_id));
            let live: Vec<Arc<Topic>> = meta.snapshot().topics().cloned().collect();
            let deferred = topics.open_at_startup(&live, meta.is_replicated())?;
            let staged = topics.discard_staged_copies()?;
            if staged > 0 {
                tracing::info!(staged, "removed the staged copies of moves that had not finished");
            }
            let wal = Wal::open_with(fs2.clone(), narad_wal::wal_dir(&cfg.data_dir), cfg.wal)
                .map_err(|e| BrokerError::internal("open ingress WAL", e))?;
            let metastore = narad_meta::metastore_path(&cfg.data_dir);
            crate::start_check::wal_records_not_newer(&wal, &metastore, applied)?;
            Ok((Arc::new(topics), Arc::new(wal), deferred))
        })
        .await?;
        let owner = Arc::new(LocalOwner::new(meta.clone(), topics.clone(), metrics.clone()));
        if meta.is_replicated() {
            super::moves::steps::freeze_moving_partitions(
                &owner,
                &meta,
                &config.node_id,
                clock.wall_ms(),
            );
        }
        // One owner and one view of owners for the dispatcher and the
        // fan-out cursors alike.
        // A cluster node takes no produce until it has reached its
        // group's leader (`Broker::release_produce`).
        let produce_held = matches!(routing, Routing::Cluster { .. });
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
            produce_held: AtomicBool::new(produce_held),
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

    /// Makes long polls return at once (shutdown is draining requests).
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
        for rt in self.topics.all() {
            rt.wake.everyone();
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
