//! `narad serve` (alias `narad server start`): run the broker.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use narad_server::server::{ServerConfig, run, shutdown_signal};

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Options of `narad serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (HTTP). Default 0.0.0.0:7942; 127.0.0.1:7942
    /// with --dev.
    #[arg(long, env = "NARAD_HTTP_ADDR")]
    pub addr: Option<SocketAddr>,
    /// Data directory (created if missing).
    #[arg(long, env = "NARAD_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
    /// Development mode: a single node on loopback with security off.
    #[arg(long)]
    pub dev: bool,
    /// This node's id (default: the host name).
    #[arg(long, env = "NARAD_NODE_ID")]
    pub node_id: Option<String>,
    /// Log level: debug, info, warn or error.
    #[arg(long, env = "NARAD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log format.
    #[arg(long, env = "NARAD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

fn init_logging(level: &str, format: LogFormat) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .map_err(|e| format!("invalid --log-level {level:?}: {e}"))?;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| format!("cannot set up logging: {e}"))
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "narad-0".to_owned())
}

/// Runs the server until SIGTERM/SIGINT.
pub fn run_serve(a: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    init_logging(&a.log_level, a.log_format)?;
    let addr = match (a.addr, a.dev) {
        (Some(addr), true) if !addr.ip().is_loopback() => {
            return Err(
                format!("--dev binds loopback only; {addr} is not a loopback address").into()
            );
        }
        (Some(addr), _) => addr,
        (None, true) => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 7942),
        (None, false) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 7942),
    };
    let config = ServerConfig {
        addr,
        data_dir: a.data_dir,
        node_id: a.node_id.unwrap_or_else(host_name),
        topic_defaults: narad_meta::TopicDefaults::default(),
        log: narad_log::LogConfig::default(),
        max_consume_wait: Duration::from_secs(10),
        shutdown_grace: Duration::from_secs(10),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run(config, shutdown_signal()))?;
    Ok(())
}
