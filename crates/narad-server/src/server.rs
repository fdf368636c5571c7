//! Wiring: bind, open the broker, serve, shut down gracefully.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use narad_broker::{Broker, BrokerConfig, metrics::BrokerMetrics};
use narad_clock::SystemClock;
use narad_fs::RealFs;
use narad_log::LogConfig;
use narad_meta::TopicDefaults;
use narad_wal::WalOptions;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{error, info};

use crate::error::ApiError;
use crate::http_metrics::{HttpMetrics, track};
use crate::routes::{consume, health, produce, topics};
use crate::state::{AppState, Shared};

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The data directory.
    pub data_dir: PathBuf,
    /// This node's id.
    pub node_id: String,
    /// Topic defaults.
    pub topic_defaults: TopicDefaults,
    /// Partition log settings.
    pub log: LogConfig,
    /// The long-poll ceiling.
    pub max_consume_wait: Duration,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
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
    /// The broker could not start (unusable data dir, damaged files).
    #[error("cannot start: {0}")]
    Start(#[source] narad_broker::BrokerError),
    /// The HTTP server failed.
    #[error("http server failed: {0}")]
    Serve(#[source] std::io::Error),
    /// A final sync at shutdown failed.
    #[error("shutdown did not complete cleanly: {0}")]
    Shutdown(#[source] narad_broker::BrokerError),
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
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .fallback(|| async {
            ApiError::Text { status: StatusCode::NOT_FOUND, body: "404 page not found\n" }
        })
        .method_not_allowed_fallback(|| async {
            ApiError::Text { status: StatusCode::METHOD_NOT_ALLOWED, body: "Method Not Allowed\n" }
        })
        .layer(axum::middleware::from_fn_with_state(state.clone(), track))
        .with_state(state)
}

/// Runs the server until `shutdown` resolves, then drains and stops.
pub async fn run(
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let listener = TcpListener::bind(config.addr)
        .await
        .map_err(|source| ServerError::Bind { addr: config.addr, source })?;
    let local = listener.local_addr().map_err(ServerError::Serve)?;
    let mut registry = Registry::with_prefix("narad");
    let metrics = Arc::new(BrokerMetrics::new(&mut registry));
    let http = HttpMetrics::new(&mut registry);
    let broker = Broker::open(
        BrokerConfig {
            data_dir: config.data_dir.clone(),
            node_id: config.node_id.clone(),
            advertised_addr: local.to_string(),
            topic_defaults: config.topic_defaults.clone(),
            log: config.log.clone(),
            wal: WalOptions::default(),
        },
        RealFs::shared(),
        SystemClock::shared(),
        metrics,
    )
    .await
    .map_err(ServerError::Start)?;
    let state = Arc::new(AppState {
        broker: broker.clone(),
        registry,
        http,
        ready: AtomicBool::new(true),
        shutting_down: AtomicBool::new(false),
        max_consume_wait: config.max_consume_wait,
    });
    info!(addr = %local, data_dir = %config.data_dir.display(), "narad listening");
    let st = state.clone();
    let b = broker.clone();
    let drain = async move {
        shutdown.await;
        info!("shutdown requested: draining in-flight requests");
        st.shutting_down.store(true, Ordering::Release);
        b.begin_drain();
    };
    let served = axum::serve(listener, router(state.clone())).with_graceful_shutdown(drain).await;
    if let Err(e) = served {
        error!(error = %e, "http server failed");
        let _ = broker.shutdown().await;
        return Err(ServerError::Serve(e));
    }
    broker.shutdown().await.map_err(ServerError::Shutdown)?;
    info!("narad stopped");
    Ok(())
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
