//! The server configuration (SPEC §8): one tree of keys, filled in layers
//! — defaults < config file (`--config`, TOML or JSON) < `NARAD_*`
//! environment < command-line flags — then checked as a whole.
//!
//! Layering works on a JSON tree: the defaults are serialized, the file is
//! merged into them key by key, each environment variable and flag sets one
//! key, and the result is decoded into [`Config`] with unknown keys refused.
//! Every error names the key (`http.addr: ...`) or the variable that set it.
//! Secrets (the admin password) come from the environment only and are
//! masked when the config is printed. `docs/CONFIGURATION.md` lists every
//! key with its default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use narad_log::LogConfig;
use narad_meta::TopicDefaults;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::cluster_settings::{
    CLUSTER_SECRET_ENV, CLUSTER_SECRET_PREVIOUS_ENV, ClusterSettings, DEFAULT_CLUSTER_ADDR,
    DEFAULT_DEV_CLUSTER_ADDR, DEFAULT_MOVE_COPY_RATE, PeerSpec,
};
use crate::conn::{ConnConfig, MIN_HEADER_BYTES};
use crate::duration::parse_go_duration;

/// The address a non-dev start listens on.
pub const DEFAULT_ADDR: &str = "0.0.0.0:7942";
/// The address a `--dev` start listens on.
pub const DEFAULT_DEV_ADDR: &str = "127.0.0.1:7942";
/// The largest allowed `http.max_header_bytes` (Go's default bound).
pub const MAX_HEADER_BYTES_LIMIT: u64 = 1 << 20;
/// The largest allowed `http.max_connections`.
pub const MAX_CONNECTIONS_LIMIT: u64 = 1 << 20;
/// How a masked secret is printed.
pub const MASK: &str = "********";

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The HTTP listener.
    pub http: HttpConfig,
    /// This node.
    pub cluster: ClusterConfig,
    /// The data directory and partition log storage.
    pub storage: StorageConfig,
    /// Topic defaults and bounds.
    pub topic: TopicDefaults,
    /// Logging.
    pub log: LogSection,
    /// Authentication.
    pub security: SecurityConfig,
    /// Per-user rate limits.
    pub limits: LimitsConfig,
}

/// `http.*`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Where to listen.
    pub addr: String,
    /// The long-poll ceiling of consume.
    #[serde(with = "duration_serde")]
    pub max_consume_wait: Duration,
    /// How long shutdown waits for in-flight requests.
    #[serde(with = "duration_serde")]
    pub shutdown_grace: Duration,
    /// A request's head must arrive within this of its first byte, its body
    /// within this of its head (and a TLS handshake within this).
    #[serde(with = "duration_serde")]
    pub read_timeout: Duration,
    /// A request must be answered within this of its head.
    #[serde(with = "duration_serde")]
    pub write_timeout: Duration,
    /// A connection with no request in flight is closed after this.
    #[serde(with = "duration_serde")]
    pub idle_timeout: Duration,
    /// The largest request head (request line and headers), bytes or
    /// `64KiB`-style; larger heads are answered 431.
    #[serde(deserialize_with = "de_size")]
    pub max_header_bytes: u64,
    /// The most connections open at once (0 = half the open-file limit,
    /// at most 65,536); more wait in the listen backlog.
    pub max_connections: u64,
    /// PEM certificate chain: serve HTTPS ("" = plain HTTP).
    pub tls_cert_file: String,
    /// PEM private key of the certificate.
    pub tls_key_file: String,
    /// PEM CA bundle: require client certificates signed by it (mTLS).
    pub tls_client_ca_file: String,
}

/// `cluster.*` (checked and resolved by [`crate::cluster_settings`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's id ("" = the host name; required with peers).
    pub node_id: String,
    /// Where the node RPC listens (UDP `host:port`; used only with peers).
    pub addr: String,
    /// The cluster's nodes, this one included (empty = a single node).
    pub peers: Vec<PeerSpec>,
    /// The ids that bootstrap the cluster (empty = every peer); a node not
    /// listed only joins.
    pub initial_members: Vec<String>,
    /// Bytes per second the copy rounds of the partition moves to this
    /// node read together (bytes, or `32MiB`-style; 0 = no limit).
    #[serde(deserialize_with = "de_size")]
    pub move_copy_rate: u64,
}

/// `storage.*`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// The data directory.
    pub data_dir: PathBuf,
    /// Partition log segment size (bytes, or `64MiB`-style).
    #[serde(deserialize_with = "de_size")]
    pub segment_bytes: u64,
    /// Codec of new partition log frames: `none` or `zstd`.
    pub codec: CodecName,
    /// zstd level (1..=22) when `codec` is `zstd`.
    pub compression_level: i32,
    /// Prepare each next ingress WAL segment in advance, zero-filled to
    /// 64 MiB, so group commits overwrite allocated blocks and their
    /// fdatasync never grows the file (v3.1; off by default). Costs up to
    /// two segments of extra disk.
    pub ingress_wal_prealloc: bool,
    /// Close partition logs unaccessed this long (ms), when that loses
    /// nothing (SPEC §5.7); reopened on demand. 0 = never; else at least
    /// 60000.
    pub idle_log_eviction_ms: u64,
}

/// `storage.codec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CodecName {
    /// Stored as is.
    None,
    /// zstd.
    Zstd,
}

/// `log.*`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSection {
    /// `debug`, `info`, `warn`, `error`, or a tracing filter.
    pub level: String,
    /// Log line format.
    pub format: LogFormat,
}

/// `log.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `security.*`. Only the cluster TLS files can be set in a file: security
/// is on unless the server runs with `--dev`, and the admin password and
/// the cluster secret are secrets, read from the environment only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecurityConfig {
    /// Authentication and authorization on (off only with `--dev`).
    #[serde(skip_deserializing)]
    pub enabled: bool,
    /// The root user's password at first start (`NARAD_ADMIN_PASSWORD`).
    #[serde(skip_deserializing)]
    pub admin_password: Option<String>,
    /// The secret nodes prove to each other once per node-RPC connection
    /// (`NARAD_CLUSTER_SECRET`, at least 32 characters).
    #[serde(skip_deserializing)]
    pub cluster_secret: Option<String>,
    /// During a rotation, the secret being replaced, still proved with and
    /// accepted (`NARAD_CLUSTER_SECRET_PREVIOUS`).
    #[serde(skip_deserializing)]
    pub cluster_secret_previous: Option<String>,
    /// This node's certificate chain for cluster mutual TLS (PEM).
    pub cluster_tls_cert_file: String,
    /// Its private key (PEM).
    pub cluster_tls_key_file: String,
    /// The cluster CA (PEM) every node's certificate is signed by.
    pub cluster_tls_ca_file: String,
}

/// The `security.*` keys a file may set.
const SECURITY_FILE_KEYS: [&str; 3] =
    ["cluster_tls_cert_file", "cluster_tls_key_file", "cluster_tls_ca_file"];

/// One token bucket: `rate` requests per second, bursts of `burst`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Rate {
    /// Sustained requests per second per user (0 = unlimited).
    pub produce_rate: f64,
    /// Bucket size for produce (0 = the rate, at least 1).
    pub produce_burst: u32,
    /// Sustained consume requests per second per user (0 = unlimited).
    pub consume_rate: f64,
    /// Bucket size for consume (0 = the rate, at least 1).
    pub consume_burst: u32,
}

/// `limits.*`: the per-user limits every user gets, and overrides by
/// username.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Sustained produce requests per second per user (0 = unlimited).
    pub produce_rate: f64,
    /// Bucket size for produce (0 = the rate, at least 1).
    pub produce_burst: u32,
    /// Sustained consume requests per second per user (0 = unlimited).
    pub consume_rate: f64,
    /// Bucket size for consume (0 = the rate, at least 1).
    pub consume_burst: u32,
    /// Per-user overrides (each replaces the limits above whole).
    pub users: BTreeMap<String, Rate>,
}

impl LimitsConfig {
    /// The limits of users without an override.
    pub fn global(&self) -> Rate {
        Rate {
            produce_rate: self.produce_rate,
            produce_burst: self.produce_burst,
            consume_rate: self.consume_rate,
            consume_burst: self.consume_burst,
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        let conn = ConnConfig::default();
        HttpConfig {
            addr: DEFAULT_ADDR.to_owned(),
            max_consume_wait: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
            read_timeout: conn.read_timeout,
            write_timeout: conn.write_timeout,
            idle_timeout: conn.idle_timeout,
            max_header_bytes: conn.max_header_bytes as u64,
            max_connections: 0,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_client_ca_file: String::new(),
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        let log = LogConfig::default();
        StorageConfig {
            data_dir: PathBuf::from("data"),
            segment_bytes: log.segment_bytes,
            codec: CodecName::None,
            compression_level: 3,
            ingress_wal_prealloc: false,
            idle_log_eviction_ms: narad_broker::limits::DEFAULT_IDLE_LOG_EVICTION_MS,
        }
    }
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection { level: "info".to_owned(), format: LogFormat::Text }
    }
}

impl Default for SecurityConfig {
    fn default() -> Self {
        SecurityConfig {
            enabled: true,
            admin_password: None,
            cluster_secret: None,
            cluster_secret_previous: None,
            cluster_tls_cert_file: String::new(),
            cluster_tls_key_file: String::new(),
            cluster_tls_ca_file: String::new(),
        }
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            node_id: String::new(),
            addr: DEFAULT_CLUSTER_ADDR.to_owned(),
            peers: Vec::new(),
            initial_members: Vec::new(),
            move_copy_rate: DEFAULT_MOVE_COPY_RATE,
        }
    }
}

/// Environment variables and the keys they set (`NARAD_` + the key with
/// dots as underscores, upper case, except `NARAD_NODE_ID`,
/// `NARAD_DATA_DIR` and `NARAD_CLUSTER_TLS_*`, as in Narad). A list key
/// (`cluster.peers`, `cluster.initial_members`) takes a comma-separated
/// list.
pub const ENV_KEYS: &[(&str, &str)] = &[
    ("NARAD_HTTP_ADDR", "http.addr"),
    ("NARAD_HTTP_MAX_CONSUME_WAIT", "http.max_consume_wait"),
    ("NARAD_HTTP_SHUTDOWN_GRACE", "http.shutdown_grace"),
    ("NARAD_HTTP_READ_TIMEOUT", "http.read_timeout"),
    ("NARAD_HTTP_WRITE_TIMEOUT", "http.write_timeout"),
    ("NARAD_HTTP_IDLE_TIMEOUT", "http.idle_timeout"),
    ("NARAD_HTTP_MAX_HEADER_BYTES", "http.max_header_bytes"),
    ("NARAD_HTTP_MAX_CONNECTIONS", "http.max_connections"),
    ("NARAD_HTTP_TLS_CERT_FILE", "http.tls_cert_file"),
    ("NARAD_HTTP_TLS_KEY_FILE", "http.tls_key_file"),
    ("NARAD_HTTP_TLS_CLIENT_CA_FILE", "http.tls_client_ca_file"),
    ("NARAD_NODE_ID", "cluster.node_id"),
    ("NARAD_CLUSTER_ADDR", "cluster.addr"),
    ("NARAD_CLUSTER_PEERS", "cluster.peers"),
    ("NARAD_CLUSTER_INITIAL_MEMBERS", "cluster.initial_members"),
    ("NARAD_CLUSTER_MOVE_COPY_RATE", "cluster.move_copy_rate"),
    ("NARAD_CLUSTER_TLS_CERT_FILE", "security.cluster_tls_cert_file"),
    ("NARAD_CLUSTER_TLS_KEY_FILE", "security.cluster_tls_key_file"),
    ("NARAD_CLUSTER_TLS_CA_FILE", "security.cluster_tls_ca_file"),
    ("NARAD_DATA_DIR", "storage.data_dir"),
    ("NARAD_STORAGE_SEGMENT_BYTES", "storage.segment_bytes"),
    ("NARAD_STORAGE_CODEC", "storage.codec"),
    ("NARAD_STORAGE_COMPRESSION_LEVEL", "storage.compression_level"),
    ("NARAD_STORAGE_INGRESS_WAL_PREALLOC", "storage.ingress_wal_prealloc"),
    ("NARAD_STORAGE_IDLE_LOG_EVICTION_MS", "storage.idle_log_eviction_ms"),
    ("NARAD_TOPIC_DEFAULT_PARTITIONS", "topic.default_partitions"),
    ("NARAD_TOPIC_MAX_PARTITIONS", "topic.max_partitions"),
    ("NARAD_TOPIC_DEFAULT_RETENTION_AGE_MS", "topic.default_retention_age_ms"),
    ("NARAD_TOPIC_DEFAULT_VISIBILITY_TIMEOUT_MS", "topic.default_visibility_timeout_ms"),
    (
        "NARAD_TOPIC_DEFAULT_MAX_IN_FLIGHT_PER_PARTITION",
        "topic.default_max_in_flight_per_partition",
    ),
    (
        "NARAD_TOPIC_DEFAULT_MAX_ACKED_AHEAD_PER_PARTITION",
        "topic.default_max_acked_ahead_per_partition",
    ),
    ("NARAD_LOG_LEVEL", "log.level"),
    ("NARAD_LOG_FORMAT", "log.format"),
    ("NARAD_LIMITS_PRODUCE_RATE", "limits.produce_rate"),
    ("NARAD_LIMITS_PRODUCE_BURST", "limits.produce_burst"),
    ("NARAD_LIMITS_CONSUME_RATE", "limits.consume_rate"),
    ("NARAD_LIMITS_CONSUME_BURST", "limits.consume_burst"),
];

/// The environment variable of the admin password (a secret: never a file
/// key, masked when printed).
pub const ADMIN_PASSWORD_ENV: &str = "NARAD_ADMIN_PASSWORD";

/// Where the layers come from.
#[derive(Debug, Default)]
pub struct Sources<'a> {
    /// `--config FILE`.
    pub file: Option<&'a Path>,
    /// The environment (`NARAD_*` variables), as `(name, value)` pairs.
    pub env: Vec<(String, String)>,
    /// Keys set by flags, as `(key, value)`.
    pub flags: Vec<(&'static str, Value)>,
    /// `--dev`: security off, loopback only.
    pub dev: bool,
}

impl Config {
    /// Builds the configuration from its layers and validates it.
    pub fn load(sources: Sources<'_>) -> Result<Config, String> {
        let mut defaults = Config::default();
        if sources.dev {
            defaults.http.addr = DEFAULT_DEV_ADDR.to_owned();
            defaults.cluster.addr = DEFAULT_DEV_CLUSTER_ADDR.to_owned();
        }
        let mut tree = serde_json::to_value(&defaults).expect("the defaults serialize");
        tree.as_object_mut().expect("the config is a table").remove("security");
        if let Some(path) = sources.file {
            let file = read_file(path)?;
            if let Some(keys) = file.get("security") {
                let key = match keys.as_object() {
                    Some(k) => {
                        k.keys().find(|k| !SECURITY_FILE_KEYS.contains(&k.as_str())).cloned()
                    }
                    None => Some(String::new()),
                };
                if let Some(key) = key {
                    return Err(format!(
                        "config key security.{key} cannot be set in a file: security is on \
                         unless the server runs with --dev, the admin password comes from \
                         {ADMIN_PASSWORD_ENV} only and the cluster secret from \
                         {CLUSTER_SECRET_ENV} only"
                    ));
                }
            }
            merge(&mut tree, file);
        }
        let env: BTreeMap<&str, &str> =
            sources.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        for (var, key) in ENV_KEYS {
            if let Some(raw) = env.get(var) {
                let value = typed_like(&tree, key, raw).map_err(|e| format!("{var}: {e}"))?;
                set(&mut tree, key, value);
            }
        }
        for (key, value) in sources.flags {
            set(&mut tree, key, value);
        }
        let mut config: Config = serde_path_to_error::deserialize(tree).map_err(|e| {
            let path = e.path().to_string();
            format!("config key {path}: {}", e.into_inner())
        })?;
        config.security.enabled = !sources.dev;
        config.security.admin_password =
            env.get(ADMIN_PASSWORD_ENV).map(|s| (*s).to_owned()).filter(|s| !s.is_empty());
        config.security.cluster_secret =
            env.get(CLUSTER_SECRET_ENV).map(|s| (*s).to_owned()).filter(|s| !s.is_empty());
        config.security.cluster_secret_previous =
            env.get(CLUSTER_SECRET_PREVIOUS_ENV).map(|s| (*s).to_owned()).filter(|s| !s.is_empty());
        config.validate(sources.dev)?;
        Ok(config)
    }

    /// Checks the configuration as a whole; the message names the key.
    pub fn validate(&self, dev: bool) -> Result<(), String> {
        let addr = self.listen_addr()?;
        if dev && !addr.ip().is_loopback() {
            return Err(format!(
                "http.addr ({addr}) must be a loopback address with --dev (security is off)"
            ));
        }
        let h = &self.http;
        if h.max_consume_wait.is_zero() {
            return Err("http.max_consume_wait must be > 0".into());
        }
        if h.max_consume_wait > h.shutdown_grace {
            return Err(format!(
                "http.max_consume_wait ({}) must be <= http.shutdown_grace ({})",
                format_duration(h.max_consume_wait),
                format_duration(h.shutdown_grace)
            ));
        }
        for (key, d) in [
            ("http.read_timeout", h.read_timeout),
            ("http.write_timeout", h.write_timeout),
            ("http.idle_timeout", h.idle_timeout),
        ] {
            if d.is_zero() {
                return Err(format!("{key} must be > 0"));
            }
        }
        if h.max_consume_wait >= h.write_timeout {
            return Err(format!(
                "http.max_consume_wait ({}) must be < http.write_timeout ({}): a long poll must \
                 be answered before its connection's write deadline",
                format_duration(h.max_consume_wait),
                format_duration(h.write_timeout)
            ));
        }
        let head = MIN_HEADER_BYTES as u64..=MAX_HEADER_BYTES_LIMIT;
        if !head.contains(&h.max_header_bytes) {
            return Err(format!(
                "http.max_header_bytes ({}) must be between {} and {}",
                h.max_header_bytes,
                head.start(),
                head.end()
            ));
        }
        if h.max_connections > MAX_CONNECTIONS_LIMIT {
            return Err(format!(
                "http.max_connections ({}) must be at most {MAX_CONNECTIONS_LIMIT} (0 = half the \
                 open-file limit)",
                h.max_connections
            ));
        }
        match (h.tls_cert_file.is_empty(), h.tls_key_file.is_empty()) {
            (true, false) | (false, true) => {
                return Err("http.tls_cert_file and http.tls_key_file must be set together".into());
            }
            (true, true) if !h.tls_client_ca_file.is_empty() => {
                return Err("http.tls_client_ca_file needs http.tls_cert_file and \
                            http.tls_key_file (mutual TLS is TLS)"
                    .into());
            }
            _ => {}
        }
        if self.storage.data_dir.as_os_str().is_empty() {
            return Err("storage.data_dir must not be empty".into());
        }
        self.log_config().validate().map_err(|e| format!("storage: {e}"))?;
        let idle = self.storage.idle_log_eviction_ms;
        let min = narad_broker::limits::MIN_IDLE_LOG_EVICTION_MS;
        if idle != 0 && idle < min {
            return Err(format!(
                "storage.idle_log_eviction_ms ({idle}) must be 0 (never) or at least {min}"
            ));
        }
        self.topic.validate()?;
        tracing_subscriber::EnvFilter::try_new(&self.log.level)
            .map_err(|e| format!("log.level ({:?}): {e}", self.log.level))?;
        check_rate("limits", &self.limits.global())?;
        for (user, rate) in &self.limits.users {
            narad_meta::user::validate_username(user)
                .map_err(|e| format!("limits.users.{user}: {e}"))?;
            check_rate(&format!("limits.users.{user}"), rate)?;
        }
        self.cluster_settings()?;
        Ok(())
    }

    /// The resolved cluster settings: `None` for a single node (no
    /// `cluster.peers`). See [`crate::cluster_settings`].
    pub fn cluster_settings(&self) -> Result<Option<ClusterSettings>, String> {
        crate::cluster_settings::resolve(self)
    }

    /// `http.addr` as a socket address.
    pub fn listen_addr(&self) -> Result<SocketAddr, String> {
        self.http.addr.parse().map_err(|e| {
            format!("http.addr ({:?}) is not a host:port address: {e}", self.http.addr)
        })
    }

    /// The connection settings of `http.*`.
    pub fn conn_config(&self) -> ConnConfig {
        let h = &self.http;
        ConnConfig {
            read_timeout: h.read_timeout,
            write_timeout: h.write_timeout,
            idle_timeout: h.idle_timeout,
            max_header_bytes: usize::try_from(h.max_header_bytes).unwrap_or(usize::MAX),
        }
    }

    /// The partition log settings of `storage.*`.
    pub fn log_config(&self) -> LogConfig {
        let codec = match self.storage.codec {
            CodecName::None => narad_log::Codec::None,
            CodecName::Zstd => narad_log::Codec::Zstd { level: self.storage.compression_level },
        };
        LogConfig { segment_bytes: self.storage.segment_bytes, codec, ..LogConfig::default() }
    }

    /// The effective configuration as pretty JSON, secrets masked.
    pub fn to_printable_json(&self) -> String {
        let mut shown = self.clone();
        if shown.security.admin_password.is_some() {
            shown.security.admin_password = Some(MASK.to_owned());
        }
        if shown.security.cluster_secret.is_some() {
            shown.security.cluster_secret = Some(MASK.to_owned());
        }
        if shown.security.cluster_secret_previous.is_some() {
            shown.security.cluster_secret_previous = Some(MASK.to_owned());
        }
        serde_json::to_string_pretty(&shown).expect("the config serializes")
    }
}

fn check_rate(section: &str, r: &Rate) -> Result<(), String> {
    for (key, v) in [("produce_rate", r.produce_rate), ("consume_rate", r.consume_rate)] {
        if !v.is_finite() || v < 0.0 {
            return Err(format!("{section}.{key} ({v}) must be a number >= 0 (0 = unlimited)"));
        }
    }
    Ok(())
}

fn read_file(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    let json = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => true,
        Some("toml") => false,
        _ => text.trim_start().starts_with('{'),
    };
    let value: Value = if json {
        serde_json::from_str(&text)
            .map_err(|e| format!("config file {} is not valid JSON: {e}", path.display()))?
    } else {
        toml::from_str(&text)
            .map_err(|e| format!("config file {} is not valid TOML: {e}", path.display()))?
    };
    if !value.is_object() {
        return Err(format!("config file {} must hold a table of sections", path.display()));
    }
    Ok(value)
}

/// Merges `over` into `base`: tables key by key, anything else replaced.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

fn set(tree: &mut Value, key: &str, value: Value) {
    let mut node = tree;
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        let map = node.as_object_mut().expect("just made an object");
        if parts.peek().is_none() {
            map.insert(part.to_owned(), value);
            return;
        }
        node = map.entry(part.to_owned()).or_insert_with(|| Value::Object(Map::new()));
    }
}

/// An environment string as the JSON type the key's current value has
/// (numbers and booleans parsed, anything else a string).
fn typed_like(tree: &Value, key: &str, raw: &str) -> Result<Value, String> {
    let current = key.split('.').try_fold(tree, |node, part| node.get(part));
    match current {
        Some(Value::Number(_)) => {
            let n: serde_json::Number =
                raw.trim().parse().map_err(|_| format!("{raw:?} is not a number"))?;
            Ok(Value::Number(n))
        }
        Some(Value::Bool(_)) => match raw.trim() {
            "true" | "1" => Ok(Value::Bool(true)),
            "false" | "0" => Ok(Value::Bool(false)),
            other => Err(format!("{other:?} is not true or false")),
        },
        Some(Value::Array(_)) => Ok(Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_owned()))
                .collect(),
        )),
        _ => Ok(Value::String(raw.to_owned())),
    }
}

/// Formats a duration in Go syntax (`10s`, `1m30s`, `250ms`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 && !d.is_zero() {
        return format!("{}us", d.as_micros());
    }
    if !ms.is_multiple_of(1000) || ms == 0 {
        return format!("{ms}ms");
    }
    let mut s = (ms / 1000) as u64;
    let mut out = String::new();
    for (unit, len) in [("h", 3600), ("m", 60)] {
        if s >= len {
            out.push_str(&format!("{}{unit}", s / len));
            s %= len;
        }
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

/// Durations are Go duration strings (`10s`) or integer nanoseconds.
mod duration_serde {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Nanos(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Nanos(n) => Ok(Duration::from_nanos(n)),
            Raw::Text(s) => parse_go_duration(&s).map_err(serde::de::Error::custom),
        }
    }
}

/// Parses a byte size: an integer, or a number with a unit (`B`, `KiB`,
/// `MiB`, `GiB`, `KB`, `MB`, `GB`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!("invalid size unit {other:?} in {s:?} (use B, KiB, MiB, GiB)"));
        }
    };
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} is too large"))
}

fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bytes(u64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Bytes(n) => Ok(n),
        Raw::Text(s) => parse_size(&s).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn write(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("narad-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn the_defaults_are_valid_and_documented_values() {
        let c = Config::load(Sources::default()).unwrap();
        assert_eq!(c.http.addr, "0.0.0.0:7942");
        assert_eq!(c.http.max_consume_wait, Duration::from_secs(10));
        assert_eq!(c.storage.segment_bytes, 64 << 20);
        assert_eq!(
            c.conn_config(),
            ConnConfig {
                read_timeout: Duration::from_secs(10),
                write_timeout: Duration::from_secs(30),
                idle_timeout: Duration::from_secs(60),
                max_header_bytes: 64 << 10,
            },
            "SPEC §1.1 timeouts"
        );
        assert_eq!(c.http.max_connections, 0, "automatic: from the open-file limit");
        assert_eq!(c.cluster.move_copy_rate, 32 << 20, "docs/CONFIGURATION.md");
        assert!(c.security.enabled);
        let dev = Config::load(Sources { dev: true, ..Default::default() }).unwrap();
        assert_eq!((dev.http.addr.as_str(), dev.security.enabled), ("127.0.0.1:7942", false));
    }

    #[test]
    fn layers_apply_in_order_file_then_env_then_flags() {
        let file = write(
            "layers.toml",
            "[http]\naddr = \"127.0.0.1:1\"\nmax_consume_wait = \"5s\"\n[log]\nlevel = \"warn\"\n\
             [topic]\ndefault_partitions = 4\n[storage]\nsegment_bytes = \"1MiB\"\n",
        );
        let c = Config::load(Sources {
            file: Some(&file),
            env: env(&[("NARAD_HTTP_ADDR", "127.0.0.1:2"), ("NARAD_LOG_LEVEL", "error")]),
            flags: vec![("http.addr", Value::String("127.0.0.1:3".into()))],
            dev: false,
        })
        .unwrap();
        assert_eq!(c.http.addr, "127.0.0.1:3", "a flag beats env and file");
        assert_eq!(c.log.level, "error", "env beats the file");
        assert_eq!(c.http.max_consume_wait, Duration::from_secs(5), "the file beats defaults");
        assert_eq!(c.topic.default_partitions, 4);
        assert_eq!(c.storage.segment_bytes, 1 << 20);
        assert_eq!(c.topic.max_partitions, 108, "untouched keys keep their defaults");
        let rate = |env_v: Option<&str>, file_v: &str| {
            let file = write("rate.toml", &format!("[cluster]\nmove_copy_rate = {file_v}\n"));
            let vars = env_v.map(|v| env(&[("NARAD_CLUSTER_MOVE_COPY_RATE", v)]));
            let vars = vars.unwrap_or_default();
            Config::load(Sources { file: Some(&file), env: vars, flags: vec![], dev: false })
                .map(|c| c.cluster.move_copy_rate)
        };
        assert_eq!(rate(None, "\"8MiB\""), Ok(8 << 20), "a size in the file");
        assert_eq!(rate(Some("0"), "\"8MiB\""), Ok(0), "0 from the environment: no limit");
        assert!(rate(Some("fast"), "1").unwrap_err().contains("NARAD_CLUSTER_MOVE_COPY_RATE"));
        assert!(rate(None, "\"fast\"").unwrap_err().contains("cluster.move_copy_rate"));
    }

    #[test]
    fn idle_log_eviction_is_a_storage_key_defaulting_to_30_minutes_0_or_at_least_a_minute() {
        let load = |pairs: &[(&str, &str)]| {
            Config::load(Sources { env: env(pairs), ..Default::default() })
                .map(|c| c.storage.idle_log_eviction_ms)
        };
        assert_eq!(load(&[]), Ok(1_800_000));
        assert_eq!(load(&[("NARAD_STORAGE_IDLE_LOG_EVICTION_MS", "0")]), Ok(0));
        assert_eq!(load(&[("NARAD_STORAGE_IDLE_LOG_EVICTION_MS", "60000")]), Ok(60_000));
        let e = load(&[("NARAD_STORAGE_IDLE_LOG_EVICTION_MS", "59999")]).unwrap_err();
        assert!(e.contains("storage.idle_log_eviction_ms"), "{e}");
        let file = write("idle.toml", "[storage]\nidle_log_eviction_ms = 120000\n");
        let c = Config::load(Sources { file: Some(&file), ..Default::default() }).unwrap();
        assert_eq!(c.storage.idle_log_eviction_ms, 120_000, "SPEC §8's key is accepted");
    }

    #[test]
    fn json_files_work_too_and_unknown_keys_are_refused_by_name() {
        let file = write(
            "c.json",
            r#"{"http":{"shutdown_grace":20000000000},"limits":{"produce_rate":5,"users":{"bob":{"produce_rate":1}}}}"#,
        );
        let c = Config::load(Sources { file: Some(&file), ..Default::default() }).unwrap();
        assert_eq!(c.http.shutdown_grace, Duration::from_secs(20));
        assert_eq!(c.limits.global().produce_rate, 5.0);
        assert_eq!(c.limits.users["bob"].produce_rate, 1.0);
        let bad = write("bad.toml", "[http]\nport = 1\n");
        let e = Config::load(Sources { file: Some(&bad), ..Default::default() }).unwrap_err();
        assert!(e.contains("http") && e.contains("unknown field `port`"), "{e}");
        let secret = write("secret.toml", "[security]\nadmin_password = \"x\"\n");
        let e = Config::load(Sources { file: Some(&secret), ..Default::default() }).unwrap_err();
        assert!(e.contains("admin_password"), "{e}");
    }

    #[test]
    fn impossible_combinations_are_refused_naming_the_key() {
        let load = |pairs: &[(&str, &str)], dev: bool| {
            Config::load(Sources { env: env(pairs), dev, ..Default::default() }).unwrap_err()
        };
        assert!(load(&[("NARAD_HTTP_TLS_CERT_FILE", "c.pem")], false).contains("tls_key_file"));
        assert!(
            load(&[("NARAD_HTTP_TLS_CLIENT_CA_FILE", "ca.pem")], false)
                .contains("http.tls_client_ca_file")
        );
        assert!(
            load(&[("NARAD_HTTP_MAX_CONSUME_WAIT", "20s")], false).contains("max_consume_wait")
        );
        assert!(load(&[("NARAD_HTTP_ADDR", "0.0.0.0:1")], true).contains("loopback"));
        assert!(load(&[("NARAD_HTTP_ADDR", "nope")], false).contains("http.addr"));
        assert!(
            load(&[("NARAD_TOPIC_DEFAULT_PARTITIONS", "2")], false).contains("default_partitions")
        );
        assert!(
            load(&[("NARAD_TOPIC_MAX_PARTITIONS", "x")], false)
                .contains("NARAD_TOPIC_MAX_PARTITIONS")
        );
        assert!(
            load(&[("NARAD_LIMITS_PRODUCE_RATE", "-1")], false).contains("limits.produce_rate")
        );
        assert!(load(&[("NARAD_STORAGE_SEGMENT_BYTES", "1")], false).contains("storage"));
        assert!(load(&[("NARAD_LOG_FORMAT", "xml")], false).contains("log.format"));
        assert!(load(&[("NARAD_HTTP_READ_TIMEOUT", "0")], false).contains("http.read_timeout"));
        assert!(
            load(&[("NARAD_HTTP_WRITE_TIMEOUT", "10s")], false).contains("http.write_timeout"),
            "the long-poll ceiling must fit in the write deadline"
        );
        assert!(
            load(&[("NARAD_HTTP_MAX_HEADER_BYTES", "1024")], false)
                .contains("http.max_header_bytes")
        );
    }

    #[test]
    fn printing_masks_the_admin_password() {
        let c = Config::load(Sources {
            env: env(&[(ADMIN_PASSWORD_ENV, "hunter2")]),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.security.admin_password.as_deref(), Some("hunter2"));
        let shown = c.to_printable_json();
        assert!(!shown.contains("hunter2") && shown.contains(MASK), "{shown}");
        let v: Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(v["http"]["max_consume_wait"], "10s");
    }

    #[test]
    fn durations_and_sizes_print_and_parse() {
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
        assert_eq!(format_duration(Duration::ZERO), "0ms");
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("2KB").unwrap(), 2000);
        assert!(parse_size("1XB").is_err());
        assert!(parse_size("MiB").is_err());
    }
}
