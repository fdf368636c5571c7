//! The start banner: one INFO line saying what this node is before it
//! opens anything (version, node id, mode, addresses, data directory,
//! peers, security), and the warnings about settings narad does not read.

use narad_server::config::Config;

/// How the node is secured, from the configuration: `dev (no auth)` with
/// `--dev`; else `secured`, and for a cluster how nodes authenticate each
/// other (`cluster secret`, `mutual TLS` or both).
pub fn security_mode(config: &Config) -> String {
    let s = &config.security;
    if !s.enabled {
        return "dev (no auth)".to_owned();
    }
    if config.cluster.peers.is_empty() {
        return "secured".to_owned();
    }
    let secret = s.cluster_secret.as_deref().is_some_and(|v| !v.is_empty());
    let mtls = !s.cluster_tls_cert_file.is_empty();
    match (secret, mtls) {
        (true, true) => "secured (cluster secret and mutual TLS)",
        (true, false) => "secured (cluster secret)",
        (false, true) => "secured (mutual TLS)",
        // The configuration check refuses this; said as it is.
        (false, false) => "secured (no cluster authentication)",
    }
    .to_owned()
}

/// `http://addr` or `https://addr`.
fn http_url(config: &Config) -> String {
    let scheme = if config.http.tls_cert_file.is_empty() { "http" } else { "https" };
    format!("{scheme}://{}", config.http.addr)
}

/// Logs the banner of `config` (a single node without a configured id
/// settles it later, from its data directory).
pub fn log_start(config: &Config) {
    let version = env!("CARGO_PKG_VERSION");
    let c = &config.cluster;
    let security = security_mode(config);
    let data_dir = config.storage.data_dir.display();
    if c.peers.is_empty() {
        let node_id = if c.node_id.is_empty() { "(the data directory's)" } else { &c.node_id };
        tracing::info!(
            version,
            node_id = %node_id,
            mode = "single",
            http = %http_url(config),
            data_dir = %data_dir,
            security,
            "narad {version} starting: node {} (single node)",
            node_id
        );
        return;
    }
    let peers = c.peers.iter().map(|p| format!("{}@{}", p.id, p.addr)).collect::<Vec<_>>();
    let joins = !c.initial_members.is_empty() && !c.initial_members.contains(&c.node_id);
    tracing::info!(
        version,
        node_id = %c.node_id,
        mode = if joins { "cluster (joins)" } else { "cluster" },
        http = %http_url(config),
        cluster_addr = %c.addr,
        data_dir = %data_dir,
        peers = %peers.join(","),
        security,
        "narad {version} starting: node {} of a cluster of {}",
        c.node_id,
        c.peers.len()
    );
}

/// Narad's variables that narad does not read, and why, when they are set
/// in `env`: each is one WARN, so a setting that seems to take effect and
/// does not is never silent.
pub fn warn_ignored_env(env: impl IntoIterator<Item = (String, String)>) {
    for (k, v) in env {
        if k == "NARAD_SECURITY_ENABLED" {
            tracing::warn!(
                variable = %k,
                value = %v,
                "NARAD_SECURITY_ENABLED is ignored: security is on unless the node is started \
                 with --dev (docs/CONFIGURATION.md)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_server::config::Sources;

    fn config(dev: bool, env: &[(&str, &str)]) -> Config {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::load(Sources { file: None, env, flags: Vec::new(), dev }).unwrap()
    }

    #[test]
    fn security_mode_names_how_nodes_authenticate() {
        assert_eq!(security_mode(&config(true, &[])), "dev (no auth)");
        assert_eq!(security_mode(&config(false, &[])), "secured");
        let peers = ("NARAD_CLUSTER_PEERS", "n1@127.0.0.1:7943,n2@127.0.0.1:7944");
        let dev_cluster = config(true, &[peers, ("NARAD_NODE_ID", "n1")]);
        assert_eq!(security_mode(&dev_cluster), "dev (no auth)");
        let secret = config(
            false,
            &[
                peers,
                ("NARAD_NODE_ID", "n1"),
                ("NARAD_CLUSTER_SECRET", "0123456789abcdef0123456789abcdef"),
            ],
        );
        assert_eq!(security_mode(&secret), "secured (cluster secret)");
    }
}
