//! Wiring: bind, start the node (narad-node's `Node`: the broker and the
//! cluster side), serve, shut down gracefully.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{delete, get, post, put};
use narad_broker::{BrokerConfig, metrics::BrokerMetrics};
use narad_clock::SystemClock;
use narad_fs::RealFs;
use narad_log::LogConfig;
use narad_meta::TopicDefaults;
use narad_node::control_restart::Stop;
use narad_node::node::{Node, NodeConfig, NodeStartError};
use narad_wal::WalOptions;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{error, info, warn};

use crate::accept::{ConnLimit, PlainListener, auto_max_connections, open_file_limit};
use crate::access::Security;
use crate::auth::Authenticator;
use crate::cluster_settings::ClusterSettings;
use crate::config::{Config, LimitsConfig};
use crate::conn::ConnConfig;
use crate::error::ApiError;
use crate::http_metrics::{HttpMetrics, track};
use crate::ratelimit::RateLimiter;
use crate::routes::{children, cluster, consume, health, produce, topics, users};
use crate::state::{AppState, Shared};
use crate::tls::TlsListener;

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The data directory.
    pub data_dir: PathBuf,
    /// This node's id: the configured one, or without one the host name
    /// (what a data directory from a release before `node.id` is owned
    /// by); [`run`] settles it against the data directory's
    /// [`node_identity`](narad_node::node_identity) file.
    pub node_id: String,
    /// Whether `node_id` was configured (flag, environment, file) rather
    /// than defaulted.
    pub node_id_configured: bool,
    /// Topic defaults.
    pub topic_defaults: TopicDefaults,
    /// Partition log settings.
    pub log: LogConfig,
    /// Ingress WAL settings (`storage.ingress_wal_prealloc`).
    pub wal: WalOptions,
    /// `storage.idle_log_eviction_ms` (0 = never).
    pub idle_log_eviction_ms: u64,
    /// The long-poll ceiling.
    pub max_consume_wait: Duration,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
    /// Authentication and authorization (off only with `--dev`).
    pub security_enabled: bool,
    /// The root user's password at first start (else a random one).
    pub admin_password: Option<String>,
    /// Serve HTTPS with these files.
    pub tls: Option<TlsFiles>,
    /// Per-user rate limits.
    pub limits: LimitsConfig,
    /// Connection timeouts and the request-head bound.
    pub conn: ConnConfig,
    /// `http.max_connections` (0 = from the open-file limit).
    pub max_connections: usize,
    /// The cluster (`None`: a single node, no peers configured).
    pub cluster: Option<ClusterSettings>,
}

/// The PEM files of the HTTPS listener.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
    /// CA bundle for client certificates (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

impl ServerConfig {
    /// The runtime settings of a validated [`Config`]; `node_id` fills an
    /// empty `cluster.node_id`.
    pub fn from_config(c: &Config, node_id: impl FnOnce() -> String) -> Result<Self, String> {
        let tls = (!c.http.tls_cert_file.is_empty()).then(|| TlsFiles {
            cert: PathBuf::from(&c.http.tls_cert_file),
            key: PathBuf::from(&c.http.tls_key_file),
            client_ca: (!c.http.tls_client_ca_file.is_empty())
                .then(|| PathBuf::from(&c.http.tls_client_ca_file)),
        });
        Ok(ServerConfig {
            addr: c.listen_addr()?,
            data_dir: c.storage.data_dir.clone(),
            node_id: if c.cluster.node_id.is_empty() {
                node_id()
            } else {
                c.cluster.node_id.clone()
            },
            node_id_configured: !c.cluster.node_id.is_empty(),
            topic_defaults: c.topic.clone(),
            log: c.log_config(),
            wal: WalOptions { prealloc: c.storage.ingress_wal_prealloc, ..WalOptions::default() },
            idle_log_eviction_ms: c.storage.idle_log_eviction_ms,
            max_consume_wait: c.http.max_consume_wait,
            shutdown_grace: c.http.shutdown_grace,
            security_enabled: c.security.enabled,
            admin_password: c.security.admin_password.clone(),
            tls,
            limits: c.limits.clone(),
            conn: c.conn_config(),
            max_connections: usize::try_from(c.http.max_connections).unwrap_or(usize::MAX),
            cluster: c.cluster_settings()?,
        })
    }
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The data directory could not be locked (another process uses it).
    #[error("cannot start: {0}")]
    DataDir(#[source] std::io::Error),
    /// The broker could not start (unusable data dir, damaged files).
    #[error("cannot start: {0}")]
    Start(#[source] narad_broker::BrokerError),
    /// The security set-up failed (TLS files, root user).
    #[error("cannot start: {0}")]
    Security(String),
    /// The HTTP server failed.
    #[error("http server failed: {0}")]
    Serve(#[source] std::io::Error),
    /// The node id is not the data directory's, or its file is unusable.
    #[error("cannot start: {0}")]
    Identity(#[source] narad_node::node_identity::IdentityError),
    /// The data directory is not this start's to use as configured (a
    /// cluster member's without peers, a renamed node's).
    #[error("cannot start: {0}")]
    Refused(String),
    /// The cluster side (node RPC, consensus) could not start.
    #[error("cannot start: {0}")]
    Cluster(#[source] narad_node::cluster_node::ClusterStartError),
    /// A final sync at shutdown failed.
    #[error("shutdown did not complete cleanly: {0}")]
    Shutdown(#[source] narad_broker::BrokerError),
    /// The control plane stopped on a fatal error and the disk recovered:
    /// the server stopped for its supervisor to start it afresh.
    #[error("restart required: {0}")]
    ControlPlaneStopped(String),
}

impl From<NodeStartError> for ServerError {
    fn from(e: NodeStartError) -> ServerError {
        match e {
            NodeStartError::Broker(e) => ServerError::Start(e),
            NodeStartError::Identity(e) => ServerError::Identity(e),
            NodeStartError::Refused(why) => ServerError::Refused(why),
            NodeStartError::Cluster(e) => ServerError::Cluster(e),
        }
    }
}

/// The router, for tests and for [`run`].
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/topics", post(topics::create).get(topics::list))
        .route("/v1/topics/{topic}", get(topics::get).patch(topics::alter).delete(topics::delete))
        .route("/v1/topics/{topic}/produce", post(produce::produce))
        .route("/v1/topics/{topic}/produce/batch", post(produce::produce_batch))
        .route("/v1/topics/{topic}/consume", get(consume::consume))
        .route("/v1/topics/{topic}/ack", post(consume::ack))
        .route("/v1/topics/{topic}/children", post(children::attach).get(children::list))
        .route("/v1/topics/{topic}/children/{child}", delete(children::detach))
        .route("/v1/users", post(users::create).get(users::list))
        .route("/v1/users/{user}", get(users::get).delete(users::delete))
        .route("/v1/users/{user}/grants", put(users::put_grants))
        .route("/v1/users/{user}/password", put(users::put_password))
        .route("/v1/cluster/members", get(cluster::members))
        .route("/v1/cluster/members/{id}", delete(crate::routes::cluster_remove::remove))
        .route(
            "/v1/cluster/members/{id}/decommission",
            post(cluster::decommission).delete(cluster::cancel_decommission),
        )
        .route("/v1/cluster/moves", get(cluster::moves).post(cluster::start_move))
        .route("/v1/cluster/rebalance", get(cluster::rebalance))
        .route("/v1/cluster/status", get(cluster::status))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/openapi.json", get(crate::openapi::serve))
        .fallback(|| async {
            ApiError::Text { status: StatusCode::NOT_FOUND, body: "404 page not found\n" }
        })
        .method_not_allowed_fallback(|| async {
            ApiError::Text { status: StatusCode::METHOD_NOT_ALLOWED, body: "Method Not Allowed\n" }
        })
        // One layer: `track` measures every request and runs the access
        // checks (`access::guard`) inside its measurement.
        .layer(axum::middleware::from_fn_with_state(state.clone(), track))
        .with_state(state)
}

/// Runs the server until `shutdown` resolves, then drains and stops.
pub async fn run(
    mut config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let boot_started = std::time::Instant::now();
    // Before anything under the data directory is opened; held until the
    // server has stopped (the process's life).
    let _data_dir_lock =
        narad_fs::DirLock::acquire(&config.data_dir).map_err(ServerError::DataDir)?;
    let (fs, clock) = (RealFs::shared(), SystemClock::shared());
    let settled = narad_node::node_identity::settle(
        &*fs,
        &config.data_dir,
        config.node_id_configured.then_some(config.node_id.as_str()),
        &config.node_id,
    )
    .map_err(ServerError::Identity)?;
    match &settled {
        narad_node::node_identity::Settled::Stored(id) => {
            tracing::info!(node_id = %id, "node id (from the data directory)")
        }
        narad_node::node_identity::Settled::Adopted(id) => {
            tracing::info!(node_id = %id, "node id adopted by a data directory from an older release, now recorded in it")
        }
        narad_node::node_identity::Settled::New(id) => {
            tracing::info!(node_id = %id, "node id recorded in the new data directory; keep it: a later start under another id is refused")
        }
    }
    config.node_id = settled.id().to_owned();
    let adopted = matches!(settled, narad_node::node_identity::Settled::Adopted(_));
    let tls = match &config.tls {
        Some(f) => Some(
            crate::tls::server_config(&f.cert, &f.key, f.client_ca.as_deref())
                .map_err(ServerError::Security)?,
        ),
        None => None,
    };
    let listener = TcpListener::bind(config.addr)
        .await
        .map_err(|source| ServerError::Bind { addr: config.addr, source })?;
    let local = listener.local_addr().map_err(ServerError::Serve)?;
    let mut registry = Registry::with_prefix("narad");
    let metrics = Arc::new(BrokerMetrics::new(&mut registry));
    let http = HttpMetrics::new(&mut registry);
    // narad creates its data directory 0700 (narad_fs::DIR_MODE); one that
    // existed before and is open to others is the operator's to fix.
    if narad_fs::open_to_others(&config.data_dir).unwrap_or(false) {
        tracing::warn!(
            data_dir = %config.data_dir.display(),
            "the data directory is readable by other users (it holds every message and the \
             password hashes): chmod 700 it"
        );
    }
    let broker_config = BrokerConfig {
        data_dir: config.data_dir.clone(),
        node_id: config.node_id.clone(),
        advertised_addr: local.to_string(),
        topic_defaults: config.topic_defaults.clone(),
        log: config.log.clone(),
        wal: config.wal,
        idle_log_eviction_ms: config.idle_log_eviction_ms,
    };
    let node = Node::start(
        NodeConfig { broker: broker_config, cluster: config.cluster.clone(), adopted_id: adopted },
        fs,
        clock,
        metrics,
        &mut registry,
    )
    .await
    .map_err(ServerError::from)?;
    let node = Arc::new(node);
    let broker = node.broker().clone();
    let cluster = node.cluster();
    let auth = if config.security_enabled {
        let started = match node.seed_root(config.admin_password.clone()).await {
            Ok(()) => {
                let meta = broker.meta().clone();
                tokio::task::spawn_blocking(move || Authenticator::new(meta))
                    .await
                    .map_err(|e| format!("security set-up: {e}"))
                    .and_then(|a| a)
            }
            Err(e) => Err(e),
        };
        match started {
            Ok(a) => Some(a),
            Err(e) => {
                let _ = node.shutdown().await;
                return Err(ServerError::Security(e));
            }
        }
    } else {
        tracing::warn!("security is off (--dev): every request is allowed");
        None
    };
    let security = Security::new(auth, RateLimiter::new(config.limits.clone()), &mut registry);
    let limit = ConnLimit::new(max_connections(config.max_connections), &mut registry);
    // From the start of `run` (TLS, bind, metastore, WAL and partition
    // recovery, security) to serving.
    let boot = Gauge::<f64, AtomicU64>::default();
    boot.set(boot_started.elapsed().as_secs_f64());
    registry.register("boot_duration_seconds", "Time the node took to start serving", boot);
    let any_partition = crate::consume_any::AnyPartition::new(&mut registry);
    let state = Arc::new(AppState {
        any_partition,
        broker: broker.clone(),
        registry,
        http,
        // A cluster node is ready once it sees a leader and caught up.
        ready: AtomicBool::new(cluster.is_none()),
        shutting_down: AtomicBool::new(false),
        max_consume_wait: config.max_consume_wait,
        security,
        cluster: cluster.clone(),
    });
    {
        let st = Arc::downgrade(&state);
        node.on_ready(config.security_enabled, move |caught_up| {
            if let Some(st) = st.upgrade() {
                st.ready.store(true, Ordering::Release);
                let why = if caught_up {
                    "a leader is visible and this replica caught up"
                } else {
                    "a leader is visible; this replica is still catching up"
                };
                log_ready(boot_started.elapsed(), why);
            }
        });
    }
    info!(
        addr = %local,
        data_dir = %config.data_dir.display(),
        tls = tls.is_some(),
        mtls = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        security = config.security_enabled,
        max_connections = limit.max(),
        "narad listening"
    );
    if cluster.is_none() {
        log_ready(boot_started.elapsed(), "single node");
    }
    let st = state.clone();
    let leaving = node.clone();
    // Set when the server stops because its control plane stopped (see
    // `control_restart`): the run then ends in an error.
    let restart_why: Arc<std::sync::Mutex<Option<Stop>>> = Arc::default();
    let restart = node.stop_needed();
    let why_slot = restart_why.clone();
    let drain = async move {
        tokio::select! {
            () = shutdown => info!("shutdown requested: draining in-flight requests"),
            why = restart => {
                match &why {
                    Stop::Restart(why) => {
                        error!(reason = %why, "stopping for a restart: draining in-flight requests")
                    }
                    Stop::Refused(why) => {
                        error!(reason = %why, "stopping: this node cannot start under its id")
                    }
                }
                *why_slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
            }
        }
        st.shutting_down.store(true, Ordering::Release);
        leaving.begin_leaving();
    };
    let app = crate::fast::App::new(router(state.clone()), state.clone());
    let (conn, grace) = (config.conn, config.shutdown_grace);
    match tls {
        Some(tls) => match TlsListener::new(listener, tls, conn.read_timeout, limit) {
            Ok(listener) => crate::conn::serve(listener, app, conn, drain, grace).await,
            Err(e) => {
                error!(error = %e, "http server failed");
                let _ = node.shutdown().await;
                return Err(ServerError::Serve(e));
            }
        },
        None => {
            let listener = PlainListener::new(listener, limit);
            crate::conn::serve(listener, app, conn, drain, grace).await
        }
    }
    // The broker, then the cluster side (membership, consensus, node RPC).
    node.shutdown().await.map_err(ServerError::Shutdown)?;
    match restart_why.lock().unwrap_or_else(|p| p.into_inner()).take() {
        Some(Stop::Restart(why)) => {
            return Err(ServerError::ControlPlaneStopped(why));
        }
        Some(Stop::Refused(why)) => {
            return Err(ServerError::Refused(why));
        }
        None => {}
    }
    info!("narad stopped");
    Ok(())
}

/// The one line that says the node is ready (`/readyz` 200) and how long
/// its start took, from the start of [`run`].
fn log_ready(took: Duration, why: &str) {
    info!(
        startup_ms = took.as_millis() as u64,
        "narad ready ({why}) after {:.2} s",
        took.as_secs_f64()
    );
}

/// The connection limit: `configured`, or with 0 half the open-file limit
/// ([`auto_max_connections`]). Warns when a configured limit leaves the
/// data plane fewer than 64 descriptors.
fn max_connections(configured: usize) -> usize {
    let nofile = open_file_limit();
    if configured == 0 {
        return match nofile {
            Some(n) => auto_max_connections(n),
            None => {
                warn!("cannot read the open-file limit: http.max_connections is 1024");
                1024
            }
        };
    }
    if let Some(n) = nofile
        && (configured as u64).saturating_add(64) > n
    {
        warn!(
            max_connections = configured,
            open_file_limit = n,
            "http.max_connections leaves fewer than 64 descriptors for the data plane: idle \
             connections can make WAL and partition files fail to open"
        );
    }
    configured
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
