//! Configuration layering through the real binary: `narad serve
//! --print-config` shows the effective config (file < env < flags, secrets
//! masked), and an impossible config stops the start naming the key.

mod common;

use common::{Server, run_cli, temp_dir};
use serde_json::Value;

fn print_config(args: &[&str], env: &[(&str, &str)]) -> Value {
    let mut all = vec!["serve", "--print-config"];
    all.extend_from_slice(args);
    let (code, out, err) = run_cli(&all, env, None);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn file_then_environment_then_flags() {
    let dir = temp_dir("config-layers");
    let file = dir.join("narad.toml");
    std::fs::write(
        &file,
        "[http]\naddr = \"127.0.0.1:1001\"\nshutdown_grace = \"20s\"\n\
         [log]\nlevel = \"warn\"\nformat = \"json\"\n\
         [topic]\ndefault_partitions = 5\n\
         [storage]\nsegment_bytes = \"16MiB\"\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let c = print_config(&["--config", f], &[]);
    assert_eq!(c["http"]["addr"], "127.0.0.1:1001");
    assert_eq!(c["http"]["shutdown_grace"], "20s");
    assert_eq!(c["http"]["max_consume_wait"], "10s", "untouched keys keep defaults");
    assert_eq!(c["topic"]["default_partitions"], 5);
    assert_eq!(c["storage"]["segment_bytes"], 16 << 20);
    assert_eq!(c["security"]["enabled"], true);

    let env = [("NARAD_HTTP_ADDR", "127.0.0.1:1002"), ("NARAD_LOG_LEVEL", "error")];
    let c = print_config(&["--config", f], &env);
    assert_eq!(c["http"]["addr"], "127.0.0.1:1002", "env beats the file");
    assert_eq!(c["log"]["level"], "error");
    assert_eq!(c["log"]["format"], "json", "the file still sets what env does not");

    let c =
        print_config(&["--config", f, "--addr", "127.0.0.1:1003", "--log-format", "text"], &env);
    assert_eq!(c["http"]["addr"], "127.0.0.1:1003", "a flag beats env and file");
    assert_eq!(c["log"]["format"], "text");
    assert_eq!(c["log"]["level"], "error");
}

#[test]
fn secrets_are_masked_and_dev_mode_shows_security_off() {
    let c = print_config(&["--dev"], &[("NARAD_ADMIN_PASSWORD", "hunter2")]);
    assert_eq!(c["security"]["admin_password"], "********");
    assert_eq!(c["security"]["enabled"], false);
    assert_eq!(c["http"]["addr"], "127.0.0.1:7942");
    let json = temp_dir("config-json").join("c.json");
    std::fs::write(&json, r#"{"limits":{"produce_rate":2.5}}"#).unwrap();
    let c = print_config(&["--config", json.to_str().unwrap()], &[]);
    assert_eq!(c["limits"]["produce_rate"], 2.5);
    assert_eq!(c["http"]["addr"], "0.0.0.0:7942");
}

#[test]
fn an_impossible_config_stops_the_start_naming_the_key() {
    let dir = temp_dir("config-bad");
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [&'a str]);
    let cases: [Case; 5] = [
        ("unknown field `nope`", &[], &["--config", "BAD"]),
        ("http.max_consume_wait", &[("NARAD_HTTP_MAX_CONSUME_WAIT", "1m")], &[]),
        ("tls_key_file", &[], &["--tls-cert", "cert.pem"]),
        ("loopback", &[], &["--dev", "--addr", "0.0.0.0:7942"]),
        ("NARAD_TOPIC_DEFAULT_PARTITIONS", &[("NARAD_TOPIC_DEFAULT_PARTITIONS", "many")], &[]),
    ];
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[storage]\nnope = 1\n").unwrap();
    for (needle, env, args) in cases {
        let mut all = vec!["serve", "--data-dir", dir.to_str().unwrap()];
        all.extend(args.iter().map(|a| if *a == "BAD" { bad.to_str().unwrap() } else { a }));
        let (code, _, err) = run_cli(&all, env, None);
        assert_eq!(code, 1, "{needle}: {err}");
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

#[test]
fn a_secured_server_starts_from_a_config_file() {
    let dir = temp_dir("config-start");
    let file = dir.join("narad.json");
    std::fs::write(&file, r#"{"topic":{"default_partitions":7}}"#).unwrap();
    let s = Server::start_opts(
        "config-start",
        common::Opts::secure().args(&["--config", file.to_str().unwrap()]),
    );
    let r = s.as_admin(reqwest::Method::POST, "/v1/topics").body(r#"{"name":"t"}"#).send().unwrap();
    let t: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    assert_eq!(t["partitions"], 7, "the file's topic defaults apply");
    assert_eq!(t["owner"], "admin");
}

#[test]
fn cluster_keys_come_from_environment_and_flags_and_the_secret_is_masked() {
    let env = [
        ("NARAD_CLUSTER_PEERS", "n1@127.0.0.1:7001,n2@127.0.0.1:7002"),
        ("NARAD_CLUSTER_INITIAL_MEMBERS", "n1,n2"),
        ("NARAD_CLUSTER_SECRET", "hunter2-hunter2-hunter2-hunter2-hunter2"),
        ("NARAD_CLUSTER_ADDR", "0.0.0.0:7001"),
        ("NARAD_NODE_ID", "n1"),
    ];
    let c = print_config(&[], &env);
    assert_eq!(
        c["cluster"]["peers"],
        serde_json::json!(["n1@127.0.0.1:7001", "n2@127.0.0.1:7002"])
    );
    assert_eq!(c["cluster"]["initial_members"], serde_json::json!(["n1", "n2"]));
    assert_eq!(c["cluster"]["addr"], "0.0.0.0:7001");
    assert_eq!(c["security"]["cluster_secret"], "********");
    let c = print_config(
        &[
            "--node-id",
            "n2",
            "--cluster-addr",
            "127.0.0.1:7002",
            "--peers",
            "n1@127.0.0.1:7001,n2@127.0.0.1:7002",
            "--initial-members",
            "n1",
        ],
        &env,
    );
    assert_eq!(c["cluster"]["node_id"], "n2", "a flag beats env");
    assert_eq!(c["cluster"]["addr"], "127.0.0.1:7002");
    assert_eq!(c["cluster"]["initial_members"], serde_json::json!(["n1"]));
    let dev = print_config(&["--dev"], &[]);
    assert_eq!(dev["cluster"]["addr"], "127.0.0.1:7943");
    assert_eq!(dev["cluster"]["peers"], serde_json::json!([]), "no peers: a single node");
}

#[test]
fn an_impossible_cluster_config_stops_the_start_naming_the_key() {
    let dir = temp_dir("config-cluster-bad");
    let peers = "n1@127.0.0.1:7001,n2@127.0.0.1:7002";
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [&'a str]);
    let cases: [Case; 9] = [
        (
            "set NARAD_CLUSTER_SECRET",
            &[("NARAD_CLUSTER_PEERS", peers), ("NARAD_CLUSTER_ADDR", "0.0.0.0:7001")],
            &["--node-id", "n1"],
        ),
        (
            "the cluster secret has 1 characters; it must have at least 32 (generate one with \
             `openssl rand -hex 32`)",
            &[
                ("NARAD_CLUSTER_PEERS", peers),
                ("NARAD_CLUSTER_ADDR", "0.0.0.0:7001"),
                ("NARAD_CLUSTER_SECRET", "a"),
            ],
            &["--node-id", "n1"],
        ),
        (
            "cluster.peers must include this node",
            &[("NARAD_CLUSTER_PEERS", peers)],
            &["--dev", "--node-id", "n3"],
        ),
        ("cluster.node_id must be set", &[("NARAD_CLUSTER_PEERS", peers)], &["--dev"]),
        (
            "cluster.initial_members: \"n9\" is not in cluster.peers",
            &[],
            &[
                "--dev",
                "--node-id",
                "n1",
                "--cluster-addr",
                "127.0.0.1:7001",
                "--peers",
                "n1@127.0.0.1:7001",
                "--initial-members",
                "n9",
            ],
        ),
        ("cluster.addr", &[("NARAD_CLUSTER_ADDR", "nowhere")], &[]),
        // A cluster address without peers (issue 35): a quick-start node
        // whose terminal lost NARAD_CLUSTER_PEERS must not run alone.
        (
            "cluster.addr (127.0.0.1:7001) is set but cluster.peers is not",
            &[],
            &["--dev", "--cluster-addr", "127.0.0.1:7001"],
        ),
        (
            "cluster.addr (127.0.0.1:7001) is set but cluster.peers is not",
            &[("NARAD_CLUSTER_ADDR", "127.0.0.1:7001")],
            &["--dev"],
        ),
        ("security.cluster_tls_", &[("NARAD_CLUSTER_TLS_CA_FILE", "ca.pem")], &[]),
    ];
    for (needle, env, args) in cases {
        let mut all = vec!["serve", "--data-dir", dir.to_str().unwrap()];
        all.extend_from_slice(args);
        let (code, _, err) = run_cli(&all, env, None);
        assert_eq!(code, 1, "{needle}: {err}");
        assert!(err.contains(needle), "{needle}: {err}");
    }
}
