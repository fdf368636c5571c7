//! `narad serve` (alias `narad server start`): run the broker.
//!
//! The configuration is layered (defaults < `--config` file < `NARAD_*`
//! environment < these flags, see `docs/CONFIGURATION.md`) and validated
//! before anything starts; `--print-config` prints the result (secrets
//! masked) and exits.

use std::path::PathBuf;

use clap::Args;
use narad_server::config::{Config, Sources};
use narad_server::server::{ServerConfig, run, shutdown_signal};
use serde_json::Value;

/// Options of `narad serve`. Every flag overrides the config file and the
/// environment.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Config file (TOML, or JSON for a .json name or a leading `{`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (secrets masked) and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Address to listen on (http.addr). Default 0.0.0.0:7942;
    /// 127.0.0.1:7942 with --dev.
    #[arg(long, value_name = "HOST:PORT")]
    pub addr: Option<String>,
    /// Data directory, created if missing (storage.data_dir).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Development mode: a single node on loopback with security off.
    #[arg(long)]
    pub dev: bool,
    /// This node's id (cluster.node_id; required with peers). Recorded in
    /// the data directory at its first start; a later start under another
    /// id is refused. Default: the recorded one, or a generated one.
    #[arg(long)]
    pub node_id: Option<String>,
    /// Where the node RPC listens, UDP (cluster.addr; used with peers).
    /// Default 0.0.0.0:7943; 127.0.0.1:7943 with --dev.
    #[arg(long, value_name = "HOST:PORT")]
    pub cluster_addr: Option<String>,
    /// The cluster's nodes, this one included: id@host:port,...
    /// (cluster.peers; none = a single node).
    #[arg(long, value_name = "ID@HOST:PORT,...", value_delimiter = ',')]
    pub peers: Option<Vec<String>>,
    /// The ids that bootstrap the cluster (cluster.initial_members; none =
    /// every peer); a node not listed only joins.
    #[arg(long, value_name = "ID,...", value_delimiter = ',')]
    pub initial_members: Option<Vec<String>>,
    /// Log level: debug, info, warn, error, or a tracing filter (log.level).
    #[arg(long)]
    pub log_level: Option<String>,
    /// Log format: text or json (log.format).
    #[arg(long)]
    pub log_format: Option<String>,
    /// The most connections open at once; more wait in the listen backlog
    /// (http.max_connections; 0 = half the open-file limit).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<u64>,
    /// PEM certificate chain: serve HTTPS (http.tls_cert_file).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (http.tls_key_file).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle: require client certificates it signed (mutual TLS;
    /// http.tls_client_ca_file).
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "narad-0".to_owned())
}

/// A list flag's values as a JSON list (empty items dropped).
fn string_list(items: Vec<String>) -> Value {
    Value::Array(
        items
            .into_iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .map(Value::String)
            .collect(),
    )
}

fn path_value(p: PathBuf) -> Value {
    Value::String(p.to_string_lossy().into_owned())
}

/// The layered, validated configuration of these flags.
pub fn load_config(a: &ServeArgs) -> Result<Config, String> {
    let mut flags: Vec<(&'static str, Value)> = Vec::new();
    let mut flag = |key: &'static str, v: Option<Value>| {
        if let Some(v) = v {
            flags.push((key, v));
        }
    };
    flag("http.addr", a.addr.clone().map(Value::String));
    flag("storage.data_dir", a.data_dir.clone().map(path_value));
    flag("cluster.node_id", a.node_id.clone().map(Value::String));
    flag("cluster.addr", a.cluster_addr.clone().map(Value::String));
    flag("cluster.peers", a.peers.clone().map(string_list));
    flag("cluster.initial_members", a.initial_members.clone().map(string_list));
    flag("log.level", a.log_level.clone().map(Value::String));
    flag("log.format", a.log_format.clone().map(Value::String));
    flag("http.max_connections", a.max_connections.map(Value::from));
    flag("http.tls_cert_file", a.tls_cert.clone().map(path_value));
    flag("http.tls_key_file", a.tls_key.clone().map(path_value));
    flag("http.tls_client_ca_file", a.tls_client_ca.clone().map(path_value));
    let env = std::env::vars().filter(|(k, _)| k.starts_with("NARAD_")).collect();
    // An id left unset is settled at start against the data directory's
    // `node.id` (narad_node::node_identity), with the host name only for
    // a directory from a release before that file.
    Config::load(Sources { file: a.config.as_deref(), env, flags, dev: a.dev })
}

/// Raises the soft limit on open files to the hard limit: every open
/// partition holds a segment file (1,000 topics x 3 partitions need more
/// than the usual soft limit of 1,024).
fn raise_open_file_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::info!(limit = n, "open file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open file limit"),
    }
}

/// Runs the server until SIGTERM/SIGINT.
pub fn run_serve(a: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let config = load_config(&a)?;
    if a.print_config {
        println!("{}", config.to_printable_json());
        return Ok(());
    }
    let names = crate::logging::NodeNames::of(config.cluster.peers.iter().map(|p| p.id.as_str()));
    crate::logging::init(&config.log.level, config.log.format, names)?;
    crate::banner::log_start(&config);
    crate::banner::warn_ignored_env(std::env::vars());
    raise_open_file_limit();
    let server = ServerConfig::from_config(&config, host_name)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run(server, shutdown_signal()))?;
    Ok(())
}
