//! The client CLI end to end against a secured server: topic lifecycle,
//! pub/sub, peek, replay, users, cluster, contexts, version, exit codes.

mod common;

use common::{ADMIN_PASSWORD, Server, run_cli, temp_dir};
use serde_json::Value;

/// Runs the CLI as root against `s`, with its own config directory.
struct Cli<'a> {
    s: &'a Server,
    config_dir: String,
}

/// The config directory goes with the test, however it ends.
impl Drop for Cli<'_> {
    fn drop(&mut self) {
        common::remove_test_dir(std::path::Path::new(&self.config_dir), &[]);
    }
}

impl<'a> Cli<'a> {
    fn new(s: &'a Server, name: &str) -> Cli<'a> {
        Cli { s, config_dir: temp_dir(name).display().to_string() }
    }

    fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("NARAD_ADDR", self.s.base.as_str()),
            ("NARAD_USER", "admin"),
            ("NARAD_PASSWORD", ADMIN_PASSWORD),
            ("NARAD_CONFIG_DIR", self.config_dir.as_str()),
        ]
    }

    fn run(&self, args: &[&str]) -> (i32, String, String) {
        run_cli(args, &self.env(), None)
    }

    fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        out
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
    }

    /// Runs with only the config directory (credentials from a context).
    fn bare(&self, args: &[&str]) -> (i32, String, String) {
        run_cli(args, &[("NARAD_CONFIG_DIR", self.config_dir.as_str())], None)
    }
}

fn json_lines(out: &str) -> Vec<Value> {
    out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn topic_lifecycle() {
    let s = Server::start_secure("cli-topic");
    let c = Cli::new(&s, "cli-topic-cfg");
    let out = c.ok(&[
        "topic",
        "add",
        "t",
        "--partitions",
        "4",
        "--retention",
        "2h",
        "--visibility",
        "45s",
    ]);
    assert!(out.contains("NAME") && out.contains('t'), "a table: {out}");
    let list = c.json(&["topic", "ls", "-o", "json"]);
    assert_eq!(list[0]["name"], "t");
    assert_eq!(list[0]["retention_ms"], 7_200_000);
    assert_eq!(list[0]["visibility_timeout_ms"], 45_000);
    assert_eq!(list[0]["owner"], "admin");
    let info = c.json(&["topic", "info", "t", "-o", "json"]);
    assert_eq!(info["partition_stats"].as_array().unwrap().len(), 4);
    let table = c.ok(&["topic", "info", "t"]);
    let header =
        table.lines().find(|l| l.contains("HIGH_WATERMARK")).unwrap_or_else(|| panic!("{table}"));
    let cols: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(cols[..4], ["PARTITION", "OWNER", "LIVENESS", "STATUS"], "{table}");
    let owner = info["partition_stats"][0]["owner_node"].as_str().unwrap();
    let row0 = table.lines().find(|l| l.trim_start().starts_with("0 ")).unwrap();
    let row0: Vec<&str> = row0.split_whitespace().collect();
    assert_eq!(row0[..4], ["0", owner, "alive", "ok"], "{table}");
    assert!(!table.contains('*'), "a single node's figures are its own: {table}");
    let edited = c.json(&["topic", "edit", "t", "--partitions", "6", "-o", "json"]);
    assert_eq!(edited["partitions"], 6);
    // The visibility timeout is fixed after create (the server refuses it
    // on PATCH): edit does not offer it.
    let (code, _, err) = c.run(&["topic", "edit", "t", "--visibility", "10s"]);
    assert_eq!(code, 2, "edit has no --visibility: {err}");
    assert!(err.contains("--visibility"), "{err}");
    let (code, _, err) = c.run(&["topic", "edit", "t"]);
    assert_eq!(code, 2, "nothing to change is a usage error: {err}");
    let children = c.json(&["topic", "children", "t", "-o", "json"]);
    assert_eq!(children, serde_json::json!({"parent": "t", "children": []}), "no children");
    let (code, _, _) = c.run(&["topic", "add"]);
    assert_eq!(code, 2, "a missing argument is a usage error");
    let (code, _, _) = c.run(&["topic", "add", "x", "--retention", "soon"]);
    assert_eq!(code, 2);
    c.ok(&["topic", "rm", "t"]);
    let (code, _, err) = c.run(&["topic", "info", "t"]);
    assert_eq!(code, 1);
    assert!(err.contains("topic not found"), "{err}");
    let (code, _, err) = run_cli(&["topic", "ls", "-s", "127.0.0.1:1"], &[], None);
    assert_eq!(code, 1, "a network error: {err}");
}

#[test]
fn pub_sub_peek_and_replay() {
    let s = Server::start_secure("cli-msg");
    let c = Cli::new(&s, "cli-msg-cfg");
    c.ok(&["topic", "add", "m"]);
    c.ok(&["pub", "m", "hello", "--partition", "0", "--count", "2"]);
    let (code, _, err) = run_cli(&["pub", "m", "--partition", "0"], &c.env(), Some(b"from stdin"));
    assert_eq!(code, 0, "{err}");
    c.ok(&["pub", "m", r#"{"n":1}"#, "--partition", "1", "--batch", "10", "--count", "3"]);

    // Peek reads without leasing: everything stays consumable.
    let peeked =
        c.ok(&["sub", "m", "--peek", "--partition", "0", "--from", "0", "--max", "3", "--raw"]);
    assert_eq!(peeked, "hello\nhello\nfrom stdin\n");
    let (code, _, _) = c.run(&["sub", "m", "--from", "1"]);
    assert_eq!(code, 2, "--from needs --peek");
    let p1 = json_lines(&c.ok(&[
        "sub",
        "m",
        "--peek",
        "--partition",
        "1",
        "--from",
        "0",
        "--max",
        "3",
        "-o",
        "json",
    ]));
    assert_eq!(p1.len(), 3, "a 202 becomes visible once the owner commits; peek waits for it");
    assert!(p1.iter().all(|m| m.get("receipt_handle").is_none()), "peek takes no lease");

    let replayed = c.json(&["replay", "m", "--partition", "0", "--from-offset", "1", "-o", "json"]);
    let offsets: Vec<u64> =
        replayed.as_array().unwrap().iter().map(|m| m["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, vec![1, 2], "to the end of the partition");
    let raw = c.ok(&["replay", "m", "--partition", "0", "--to", "2", "--raw"]);
    assert_eq!(raw, "hello\nhello\n", "--to is exclusive");
    let one = c.json(&["replay", "m", "--partition", "1", "--count", "1", "-o", "json"]);
    assert_eq!(one[0]["payload"], serde_json::json!({"n": 1}));
    let (code, out, err) = c.run(&["replay", "m", "--partition", "0", "--from-offset", "50"]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    assert!(
        err.contains("no messages in m/0 from offset 50 to the end (it holds offsets 0 to 2)"),
        "an empty range says so: {err}"
    );
    let (_, _, err) = c.run(&["replay", "m", "--partition", "0", "--to", "1"]);
    assert!(!err.contains("no messages"), "a range with messages says nothing: {err}");

    let got = json_lines(&c.ok(&["sub", "m", "--max", "6", "-o", "json"]));
    assert_eq!(got.len(), 6);
    let mut payloads: Vec<String> = got.iter().map(|m| m["payload"].to_string()).collect();
    payloads.sort();
    assert_eq!(
        payloads,
        vec![
            r#""from stdin""#,
            r#""hello""#,
            r#""hello""#,
            r#"{"n":1}"#,
            r#"{"n":1}"#,
            r#"{"n":1}"#
        ]
    );
    let r = s.as_admin(reqwest::Method::GET, "/v1/topics/m/consume").send().unwrap();
    assert_eq!(r.status(), 204, "sub acked everything it printed");

    // A live tail sees what is produced after it starts.
    let env: Vec<(String, String)> =
        c.env().iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let tail = std::thread::spawn(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        run_cli(&["sub", "m", "--peek", "--max", "1", "--raw"], &env, None)
    });
    // The tail starts at the end it finds: keep producing until it has
    // printed one message (whichever it saw first is a "late" one).
    for _ in 0..100 {
        if tail.is_finished() {
            break;
        }
        c.ok(&["pub", "m", "late", "--partition", "2"]);
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (code, out, err) = tail.join().unwrap();
    assert_eq!((code, out.as_str()), (0, "late\n"), "{err}");

    let (code, _, err) = c.run(&["pub", "m", ""]);
    assert_eq!(code, 2, "an empty body is a usage error: {err}");
}

#[test]
fn users_and_version() {
    let s = Server::start_secure("cli-users");
    let c = Cli::new(&s, "cli-users-cfg");
    c.ok(&["user", "add", "bob", "--new-password", "bpw", "-g", "produce:t*", "-g", "consume:t"]);
    let users = c.json(&["user", "ls", "-o", "json"]);
    assert_eq!(users[1]["username"], "bob");
    assert_eq!(users[1]["grants"][0], serde_json::json!({"action":"produce","patterns":["t*"]}));
    let table = c.ok(&["user", "ls"]);
    assert!(table.contains("produce:t*") && table.contains("consume:t"), "{table}");
    c.ok(&["user", "grant", "bob", "-g", "consume:t*"]);
    let (code, _, err) = run_cli(&["user", "passwd", "bob"], &c.env(), Some(b"bpw2\n"));
    assert_eq!(code, 0, "{err}");
    let bob = [("NARAD_ADDR", s.base.as_str()), ("NARAD_USER", "bob"), ("NARAD_PASSWORD", "bpw2")];
    let (code, _, err) = run_cli(&["topic", "ls"], &bob, None);
    assert_eq!(code, 0, "bob signs in with the new password: {err}");
    let (code, _, err) = run_cli(&["user", "ls"], &bob, None);
    assert_eq!(code, 1);
    assert!(err.contains("admin privileges required"), "{err}");
    let (code, _, _) = c.run(&["user", "add", "x", "--new-password", "p", "-g", "read:x"]);
    assert_eq!(code, 2);
    c.ok(&["user", "rm", "bob"]);
    assert_eq!(c.json(&["user", "ls", "-o", "json"]).as_array().unwrap().len(), 1);

    let (code, out, _) = run_cli(&["version"], &[], None);
    assert_eq!((code, out.trim()), (0, format!("narad {}", env!("CARGO_PKG_VERSION")).as_str()));
    let (_, out, _) = run_cli(&["version", "-o", "json"], &[], None);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn contexts_hold_server_and_credentials() {
    use std::os::unix::fs::PermissionsExt as _;
    let s = Server::start_secure("cli-ctx");
    let c = Cli::new(&s, "cli-ctx-cfg");
    let (code, _, err) = c.bare(&["topic", "ls"]);
    assert_eq!(code, 1, "no context: the default server, which is not there: {err}");
    let (code, _, err) =
        c.bare(&["ctx", "add", "local", "-s", &s.base, "-u", "admin", "-p", ADMIN_PASSWORD]);
    assert_eq!(code, 0, "{err}");
    let file = std::path::Path::new(&c.config_dir).join("contexts.json");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the contexts file holds passwords");
    let (code, _, err) = c.bare(&["topic", "add", "via-ctx"]);
    assert_eq!(code, 0, "the selected context supplies server and credentials: {err}");
    let (code, _, _) = c.bare(&["ctx", "add", "nowhere", "-s", "127.0.0.1:1"]);
    assert_eq!(code, 0);
    let (code, _, _) = c.bare(&["topic", "ls"]);
    assert_eq!(code, 1, "the new context is selected");
    let (code, out, _) = c.bare(&["topic", "ls", "--context", "local"]);
    assert_eq!(code, 0);
    assert!(out.contains("via-ctx"));
    let (code, out, _) = c.bare(&["ctx", "ls", "-o", "json"]);
    assert_eq!(code, 0);
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2);
    assert!(!out.contains(ADMIN_PASSWORD), "ls never shows passwords");
    assert_eq!(c.bare(&["ctx", "select", "local"]).0, 0);
    assert_eq!(c.bare(&["topic", "ls"]).0, 0);
    let (code, _, _) = c.bare(&["topic", "ls", "-s", "127.0.0.1:1"]);
    assert_eq!(code, 1, "a flag beats the context");
    assert_eq!(c.bare(&["ctx", "rm", "nowhere"]).0, 0);
    assert_eq!(c.bare(&["ctx", "select", "nowhere"]).0, 2);
    let (code, _, _) = c.bare(&["topic", "ls", "--context", "nope"]);
    assert_eq!(code, 2);
}

#[test]
fn cluster_members_and_status() {
    let s = Server::start_opts("cli-cluster", common::Opts::secure().args(&["--node-id", "n1"]));
    let c = Cli::new(&s, "cli-cluster-cfg");
    c.ok(&["topic", "add", "t", "--partitions", "5"]);
    let table = c.ok(&["cluster", "members"]);
    let lines: Vec<&str> = table.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["ID", "ADDR", "STATUS", "DRAINING", "OWNED_PARTITIONS", "OUTBOUND_MOVES"],
        "{table}"
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    let addr = format!("127.0.0.1:{}", s.port);
    assert_eq!(row, ["n1", addr.as_str(), "alive", "no", "5", "0"], "{table}");
    let m = c.json(&["cluster", "members", "-o", "json"]);
    assert_eq!(m["members"][0]["owned_partitions"], 5);
    assert_eq!(m["members"][0]["outbound_moves"], 0);

    let st = c.json(&["cluster", "status", "-o", "json"]);
    assert_eq!((st["role"].as_str(), st["leader"].as_str()), (Some("leader"), Some("n1")));
    assert_eq!(st["term"], 0);
    // One node owns every partition: the rebalance planner moves nothing.
    let plan = c.json(&["cluster", "rebalance", "--dry-run", "-o", "json"]);
    assert_eq!(plan["moves"], serde_json::json!([]), "{plan}");
    assert!(c.ok(&["cluster", "rebalance", "--dry-run"]).contains("balanced: nothing to move"));
    let text = c.ok(&["cluster", "status"]);
    for want in
        ["role          leader", "leader        n1", "term          0", "mode          single"]
    {
        assert!(text.contains(want), "{want:?} in:\n{text}");
    }
    // Nothing moves on one node; a drain marks it (new topics still land
    // on it: it is the only member) and an undrain clears the mark.
    assert_eq!(c.json(&["cluster", "moves", "-o", "json"]), serde_json::json!({"moves": []}));
    assert!(c.ok(&["cluster", "moves"]).contains("no moves in flight"));
    assert!(c.ok(&["cluster", "drain", "n1"]).contains("n1 is draining"));
    let m = c.json(&["cluster", "members", "-o", "json"]);
    assert_eq!(m["members"][0]["draining"], true, "{m}");
    assert!(c.ok(&["cluster", "members"]).lines().nth(1).unwrap().contains(" yes "));
    c.ok(&["topic", "add", "t2", "--partitions", "3"]);
    let m = c.json(&["cluster", "members", "-o", "json"]);
    assert_eq!(m["members"][0]["owned_partitions"], 8, "{m}");
    assert!(c.ok(&["cluster", "undrain", "n1"]).contains("no longer draining"));
    c.ok(&["cluster", "decommission", "n1"]);
    c.ok(&["cluster", "decommission", "n1", "--cancel"]);
    let m = c.json(&["cluster", "members", "-o", "json"]);
    assert_eq!(m["members"][0]["draining"], false, "{m}");
    let (code, _, err) = c.run(&["cluster", "drain", "n9"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("404") && err.contains("member not found"), "{err}");

    let env = [("NARAD_ADDR", s.base.as_str()), ("NARAD_CONFIG_DIR", c.config_dir.as_str())];
    let (code, _, err) = run_cli(&["cluster", "members"], &env, None);
    assert_eq!(code, 1, "no credentials: {err}");
    assert!(err.contains("401"), "{err}");
}

/// Runs `narad ARGS` under `script`, which gives it a terminal (stdin,
/// stdout and stderr a pty; what it prints comes back on `script`'s
/// stdout), for at most `secs`.
fn on_a_terminal(c: &Cli<'_>, args: &str, secs: u64) -> String {
    let cmd = format!("timeout {secs} {} {args}", env!("CARGO_BIN_EXE_narad"));
    let out = std::process::Command::new("script")
        .args(["-q", "-e", "-c", &cmd, "/dev/null"])
        .envs(c.env())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script (util-linux)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn sub_says_it_is_waiting_on_a_terminal_and_not_off_one() {
    let s = Server::start_secure("cli-wait");
    let c = Cli::new(&s, "cli-wait-cfg");
    c.ok(&["topic", "add", "w"]);
    let shown = on_a_terminal(&c, "sub w --max 1", 2);
    assert!(shown.contains("narad: waiting for messages on w"), "on a terminal: {shown:?}");
    // Off a terminal stderr carries nothing while it waits: a script sees
    // messages on stdout and errors on stderr only.
    let env: Vec<(String, String)> =
        c.env().iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let sub = std::thread::spawn(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        run_cli(&["sub", "w", "--max", "1", "--raw"], &env, None)
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    c.ok(&["pub", "w", "late"]);
    let (code, out, err) = sub.join().unwrap();
    assert_eq!((code, out.as_str(), err.as_str()), (0, "late\n", ""), "off a terminal");
}
