//! What the in-process broker tests share.

use std::path::PathBuf;

use narad_broker::BrokerConfig;
use narad_log::LogConfig;
use narad_meta::TopicDefaults;
use narad_wal::WalOptions;

/// A one-node broker with its data in `/data` (of a simulated file system)
/// and every default.
pub fn config() -> BrokerConfig {
    BrokerConfig {
        data_dir: PathBuf::from("/data"),
        node_id: "n1".into(),
        advertised_addr: "127.0.0.1:0".into(),
        topic_defaults: TopicDefaults::default(),
        log: LogConfig::default(),
        wal: WalOptions::default(),
        idle_log_eviction_ms: narad_broker::limits::DEFAULT_IDLE_LOG_EVICTION_MS,
    }
}
