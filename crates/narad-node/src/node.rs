//! A node: the broker and, with peers configured, the cluster side, started
//! in the one order that is sound and stopped in the reverse (DESIGN §6b).
//! The HTTP server starts a [`Node`] and serves it; it never opens the
//! broker or binds node RPC itself.
//!
//! Start-up, a single node: metastore opened → a cluster member's or a
//! renamed node's data directory refused → the adopted node id recorded →
//! broker opened (registered at once, local routing).
//!
//! Start-up, a cluster node: metastore opened → node RPC bound and
//! consensus started over the store ([`ClusterNode::start`], which refuses
//! a pre-cluster state it cannot share) → the adopted node id recorded →
//! broker opened on the store (registered by heartbeat, routing through
//! [`ClusterNode::routing`]) → the broker handed to node RPC → membership.
//!
//! Shutdown ([`Node::shutdown`]): broker stopped (its last metadata writes
//! go through consensus) → membership stopped → leadership handed over and
//! consensus stopped → node RPC closed.

use std::path::PathBuf;
use std::sync::Arc;

use narad_broker::metrics::BrokerMetrics;
use narad_broker::{Broker, BrokerConfig, BrokerError, Registration, Routing};
use narad_clock::ClockRef;
use narad_fs::FsRef;
use narad_meta::{Member, MemberStatus};
use prometheus_client::registry::Registry;

use crate::cluster_node::{ClusterNode, ClusterStartError};
use crate::control_restart::Stop;
use crate::node_identity::{self, IdentityError};
use crate::settings::ClusterSettings;
use crate::view::ClusterView;

/// What a node starts with.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The broker's configuration (its `node_id` is the settled one).
    pub broker: BrokerConfig,
    /// The cluster side (`None`: a single node).
    pub cluster: Option<ClusterSettings>,
    /// Whether the node id was adopted for a data directory from a release
    /// before `node.id` ([`node_identity::Settled::Adopted`]): it is
    /// recorded once the start has checked who owns its partitions.
    pub adopted_id: bool,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeStartError {
    /// The broker could not start (unusable data dir, damaged files).
    #[error("{0}")]
    Broker(#[source] BrokerError),
    /// The node id could not be recorded.
    #[error("{0}")]
    Identity(#[source] IdentityError),
    /// The data directory is not this start's to use as configured (a
    /// cluster member's without peers, a renamed node's).
    #[error("{0}")]
    Refused(String),
    /// The cluster side (node RPC, consensus) could not start.
    #[error("{0}")]
    Cluster(#[source] ClusterStartError),
}

/// A running node.
#[derive(Debug)]
pub struct Node {
    broker: Arc<Broker>,
    cluster: Option<Arc<ClusterNode>>,
}

impl Node {
    /// Starts a node (see the module header for the order). `http_addr` is
    /// the address clients reach this node's HTTP API on (its member
    /// record's `addr`, the broker's advertised address).
    pub async fn start(
        config: NodeConfig,
        fs: FsRef,
        clock: ClockRef,
        metrics: Arc<BrokerMetrics>,
        registry: &mut Registry,
    ) -> Result<Node, NodeStartError> {
        let NodeConfig { broker: broker_config, cluster, adopted_id } = config;
        let data_dir: PathBuf = broker_config.data_dir.clone();
        let node_id = broker_config.node_id.clone();
        let http_addr = broker_config.advertised_addr.clone();
        let record = |fs: &FsRef| {
            node_identity::record(&**fs, &data_dir, &node_id).map_err(NodeStartError::Identity)
        };
        let meta = Broker::open_meta(&broker_config, fs.clone(), clock.clone())
            .await
            .map_err(NodeStartError::Broker)?;
        let Some(settings) = cluster else {
            node_identity::refuse_single_start(&data_dir, &meta, &node_id)
                .map_err(NodeStartError::Refused)?;
            if adopted_id {
                record(&fs)?;
            }
            let broker = Broker::open_on(
                broker_config,
                fs,
                clock,
                metrics,
                meta,
                Registration::Now,
                Routing::Local,
            )
            .await
            .map_err(NodeStartError::Broker)?;
            return Ok(Node { broker, cluster: None });
        };
        // Consensus runs over the metastore before the broker opens on it,
        // so every write of the broker's goes through consensus.
        let node = ClusterNode::start(
            &settings,
            http_addr.clone(),
            meta.clone(),
            data_dir.clone(),
            fs.clone(),
            registry,
        )
        .await
        .map_err(NodeStartError::Cluster)?;
        if adopted_id {
            // Checked by the start (a pre-cluster state's owners).
            if let Err(e) = record(&fs) {
                node.shutdown().await;
                return Err(e);
            }
        }
        let routing = node.routing(clock.clone(), registry);
        let broker = match Broker::open_on(
            broker_config,
            fs,
            clock.clone(),
            metrics,
            meta,
            Registration::ByHeartbeat,
            routing,
        )
        .await
        {
            Ok(b) => b,
            Err(e) => {
                node.shutdown().await;
                return Err(NodeStartError::Broker(e));
            }
        };
        node.attach_broker(broker.clone());
        node.start_membership(
            Member {
                id: node_id,
                addr: http_addr,
                cluster_addr: Some(settings.advertised_addr.to_string()),
                status: MemberStatus::Alive,
                last_heartbeat: 0,
                draining: false,
            },
            clock,
            registry,
            {
                let metrics = broker.metrics().clone();
                Arc::new(move |component: &str, kind: &str| metrics.error(component, kind))
            },
        );
        Ok(Node { broker, cluster: Some(node) })
    }

    /// The broker.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// The cluster as the HTTP API sees it (`None`: a single node).
    pub fn cluster(&self) -> Option<Arc<dyn ClusterView>> {
        self.cluster.clone().map(|n| n as Arc<dyn ClusterView>)
    }

    /// Seeds the root user (security on) unless the state has one: a
    /// single node now, before it listens (an `Err` says why it could
    /// not); a cluster node once a leader is visible, in the background
    /// (see [`ClusterNode::seed_root_when_led`]).
    pub async fn seed_root(&self, admin_password: Option<String>) -> Result<(), String> {
        match &self.cluster {
            Some(node) => {
                node.seed_root_when_led(admin_password);
                Ok(())
            }
            None => {
                let meta = self.broker.meta().clone();
                tokio::task::spawn_blocking(move || {
                    crate::root::seed_root(&meta, admin_password.as_deref()).map(|_| ())
                })
                .await
                .map_err(|e| format!("security set-up: {e}"))?
            }
        }
    }

    /// A cluster node: calls `ready` once a leader is visible and this
    /// replica caught up (see [`ClusterNode::mark_ready_when_caught_up`]),
    /// telling it whether the replica caught up. A single node is ready
    /// once it serves: `ready` is never called.
    pub fn on_ready(&self, needs_root: bool, ready: impl Fn(bool) + Send + 'static) {
        if let Some(node) = &self.cluster {
            node.mark_ready_when_caught_up(needs_root, ready);
        }
    }

    /// Resolves once this node must stop on its own (a cluster node whose
    /// control plane stopped, see [`crate::control_restart`]); never on a
    /// single node.
    pub fn stop_needed(&self) -> impl std::future::Future<Output = Stop> + Send + 'static {
        let restart = self.cluster.as_ref().map(|n| n.restart_needed());
        async move {
            match restart {
                Some(f) => f.await,
                None => std::future::pending().await,
            }
        }
    }

    /// Shutdown began (before HTTP drains): the broker refuses new work
    /// and a cluster node no longer campaigns for a leader that hands over.
    pub fn begin_leaving(&self) {
        self.broker.begin_drain();
        if let Some(node) = &self.cluster {
            node.begin_leaving();
        }
    }

    /// Stops the broker, then the cluster side (membership, consensus
    /// after handing leadership over, node RPC); the broker's error, if
    /// its final sync failed.
    pub async fn shutdown(&self) -> Result<(), BrokerError> {
        let stopped = self.broker.shutdown().await;
        // After the broker (its last metadata writes): membership stops, a
        // leader hands leadership over, consensus and node RPC stop.
        if let Some(node) = &self.cluster {
            node.shutdown().await;
        }
        stopped
    }
}
