//! Black-box harness: starts the real `narad` binary on a free loopback
//! port with a temporary data directory and speaks HTTP to it. The default
//! mode is `serve --dev` (security off); [`Opts`] starts a secured server
//! (the root password comes from `NARAD_ADMIN_PASSWORD`), with extra flags,
//! environment variables, or TLS. [`cluster`] starts N nodes of one
//! cluster.
//!
//! With `NARAD_TEST_REPLICATED=1` in the test process's environment every
//! [`Server`] runs as a one-voter Raft group (node `n1`, peers naming only
//! itself on a free UDP port kept across restarts, the cluster secret when
//! security is on), so every metadata write goes through the replicated
//! path; a test that configures the cluster itself (`--node-id`,
//! `--cluster-addr`, `NARAD_NODE_ID`, `NARAD_CLUSTER_*`) is left as it is.
//! `/readyz` answers 200 only once the group has a leader, which
//! [`Server::wait_ready`] waits for.

#![allow(dead_code)]

pub mod cluster;
pub mod impostor;
pub mod netns;

use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use reqwest::blocking::{Client, Response};
use serde_json::Value;

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

/// The root password of secured test servers.
pub const ADMIN_PASSWORD: &str = "admin-secret";

/// The cluster secret of secured servers in replicated mode.
pub const REPLICATED_SECRET: &str = "replicated-test-secret-0123456789abcdef";

/// Whether `NARAD_TEST_REPLICATED=1`: every [`Server`] is a one-voter
/// Raft group.
pub fn replicated() -> bool {
    std::env::var("NARAD_TEST_REPLICATED").is_ok_and(|v| v == "1")
}

/// How to start a server.
#[derive(Debug, Clone)]
pub struct Opts {
    /// `--dev` (security off).
    pub dev: bool,
    /// Extra arguments after `serve`.
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// The server speaks TLS: readiness is read from the log, and `base`
    /// starts with `https://`.
    pub tls: bool,
    /// Start under this open-file limit (soft and hard, via `prlimit`).
    pub nofile: Option<u64>,
}

impl Opts {
    /// `serve --dev`.
    pub fn dev() -> Opts {
        Opts { dev: true, args: Vec::new(), env: Vec::new(), tls: false, nofile: None }
    }

    /// A secured server whose root password is [`ADMIN_PASSWORD`].
    pub fn secure() -> Opts {
        Opts {
            dev: false,
            args: Vec::new(),
            env: vec![("NARAD_ADMIN_PASSWORD".into(), ADMIN_PASSWORD.into())],
            tls: false,
            nofile: None,
        }
    }

    /// Adds an environment variable.
    pub fn env(mut self, k: &str, v: &str) -> Opts {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Adds arguments.
    pub fn args(mut self, args: &[&str]) -> Opts {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }
}

/// A running (or stopped) narad server.
pub struct Server {
    pub data_dir: PathBuf,
    pub port: u16,
    pub base: String,
    child: Option<Child>,
    log_path: PathBuf,
    pub client: Client,
    opts: Opts,
    /// The one-voter group's cluster (UDP) port in replicated mode, kept
    /// across restarts (the Raft membership names it).
    cluster_port: Option<u16>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Opts {
    /// Whether the test configured the cluster itself (then replicated
    /// mode leaves the server as the test asked).
    fn sets_cluster(&self) -> bool {
        self.args.iter().any(|a| a.starts_with("--node-id") || a.starts_with("--cluster"))
            || self.env.iter().any(|(k, _)| k == "NARAD_NODE_ID" || k.starts_with("NARAD_CLUSTER_"))
    }
}

/// A fresh temporary directory for a test. It is removed once the test
/// process has exited at the latest ([`at_exit`]), however its tests ended.
pub fn temp_dir(name: &str) -> PathBuf {
    let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("narad-it-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    at_exit::track_dir(&dir);
    dir
}

/// The last line of clean-up, once the test process has exited, however
/// its tests ended. A test that fails while another thread still holds its
/// cluster (a load generator looping on an `Arc<Cluster>`) never drops
/// it: its nodes would outlive the test process, and its directories
/// stay. Every `narad` the harness starts is recorded with its data
/// directory, and every [`temp_dir`], in a list file; a watchdog (`sh`,
/// started once per test process, detached from its output) waits for
/// the test process to end, then SIGKILLs each recorded process that
/// still runs with that data directory on its command line (so a reused
/// PID is never hit), and removes the directories (kept with
/// `NARAD_TEST_KEEP_DIRS=1`) and the list.
pub mod at_exit {
    use std::io::Write as _;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};
    use std::sync::{Mutex, OnceLock};

    /// What the watchdog reads when the test process is gone.
    const WATCHDOG: &str = r#"
while kill -0 "$TEST_PID" 2>/dev/null; do sleep 1; done
while read -r kind a b; do
  case "$kind" in
    P) tr '\0' ' ' < "/proc/$a/cmdline" 2>/dev/null | grep -qF -- "$b" && kill -9 "$a" ;;
    D) [ "$KEEP" = 1 ] || rm -rf -- "$a" ;;
  esac
done < "$LIST"
rm -f -- "$LIST"
"#;

    static LIST: OnceLock<Option<Mutex<std::fs::File>>> = OnceLock::new();

    fn list() -> Option<&'static Mutex<std::fs::File>> {
        LIST.get_or_init(|| {
            let path: PathBuf =
                std::env::temp_dir().join(format!("narad-it-exit-{}.list", std::process::id()));
            let file = std::fs::File::create(&path).ok()?;
            let keep = std::env::var("NARAD_TEST_KEEP_DIRS").unwrap_or_default();
            Command::new("sh")
                .args(["-c", WATCHDOG])
                .env("TEST_PID", std::process::id().to_string())
                .env("LIST", &path)
                .env("KEEP", keep)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .ok()?;
            Some(Mutex::new(file))
        })
        .as_ref()
    }

    fn record(line: String) {
        if let Some(file) = list() {
            let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
            let _ = f.write_all(line.as_bytes());
        }
    }

    /// Records a started `narad` process and its data directory.
    pub fn track_process(pid: u32, data_dir: &Path) {
        record(format!("P {pid} {}\n", data_dir.display()));
    }

    /// Records a temporary directory.
    pub fn track_dir(dir: &Path) {
        record(format!("D {}\n", dir.display()));
    }
}

/// Removes a test's temporary directory `root` however the test ended. A
/// failing test first prints the tail of each log in `logs` (its files go
/// with the directory); with `NARAD_TEST_KEEP_DIRS=1` a failing test keeps
/// the directory and says where it is.
pub fn remove_test_dir(root: &std::path::Path, logs: &[PathBuf]) {
    if std::thread::panicking() {
        if std::env::var_os("NARAD_TEST_KEEP_DIRS").is_some_and(|v| v == "1") {
            eprintln!("test failed: its directory is kept at {}", root.display());
            return;
        }
        for log in logs {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!(
                "--- last lines of {} (removed with the test's directory; \
                 NARAD_TEST_KEEP_DIRS=1 keeps it) ---\n{}",
                log.display(),
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
    }
    let _ = std::fs::remove_dir_all(root);
}

impl Server {
    /// Starts a server on a fresh data directory.
    pub fn start(name: &str) -> Server {
        let root = temp_dir(name);
        Server::start_in(root.join("data"), root.join("server.log"))
    }

    /// Starts a server on `data_dir`.
    pub fn start_in(data_dir: PathBuf, log_path: PathBuf) -> Server {
        Server::start_opts_in(data_dir, log_path, Opts::dev())
    }

    /// Starts a server on a fresh data directory, as `opts` say.
    pub fn start_opts(name: &str, opts: Opts) -> Server {
        let root = temp_dir(name);
        Server::start_opts_in(root.join("data"), root.join("server.log"), opts)
    }

    /// Starts a secured server on a fresh data directory.
    pub fn start_secure(name: &str) -> Server {
        Server::start_opts(name, Opts::secure())
    }

    /// The directory holding the data directory and the log (for extra
    /// files a test writes).
    pub fn root(&self) -> PathBuf {
        self.data_dir.parent().unwrap().to_path_buf()
    }

    fn start_opts_in(data_dir: PathBuf, log_path: PathBuf, opts: Opts) -> Server {
        let port = free_port();
        let client = Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(64)
            .build()
            .unwrap();
        let cluster_port = (replicated() && !opts.sets_cluster()).then(free_udp_port);
        let mut s = Server {
            data_dir,
            port,
            base: String::new(),
            child: None,
            log_path,
            client,
            opts,
            cluster_port,
        };
        s.base = s.base_for(port);
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        self.spawn_unready();
        self.wait_ready();
        if self.cluster_port.is_some() {
            // Replicated mode really runs the metastore through Raft.
            let raft = self.data_dir.join("metastore").join("raft.redb");
            assert!(
                raft.exists(),
                "replicated mode without {}; log:\n{}",
                raft.display(),
                self.log()
            );
        }
    }

    /// Starts the process without waiting for it to be ready.
    pub fn spawn_unready(&mut self) {
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(&self.log_path).unwrap();
        let mut cmd = match self.opts.nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg("--").arg(env!("CARGO_BIN_EXE_narad"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_narad")),
        };
        cmd.arg("serve");
        if self.opts.dev {
            cmd.arg("--dev");
        }
        if let Some(cport) = self.cluster_port {
            let addr = format!("127.0.0.1:{cport}");
            cmd.env("NARAD_NODE_ID", "n1")
                .env("NARAD_CLUSTER_ADDR", &addr)
                .env("NARAD_CLUSTER_PEERS", format!("n1@{addr}"));
            if !self.opts.dev {
                cmd.env("NARAD_CLUSTER_SECRET", REPLICATED_SECRET);
            }
        }
        let child = cmd
            .arg("--addr")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.opts.args)
            .env("NARAD_LOG_LEVEL", "info")
            .envs(self.opts.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start narad");
        at_exit::track_process(child.id(), &self.data_dir);
        self.child = Some(child);
    }

    /// Restarts on the same data directory and SIGKILLs the process after
    /// `delay`, whether or not start-up finished (a crash during recovery).
    pub fn restart_and_kill_after(&mut self, delay: Duration) {
        assert!(self.child.is_none(), "stop the server first");
        self.port = free_port();
        self.base = format!("http://127.0.0.1:{}", self.port);
        self.spawn_unready();
        std::thread::sleep(delay);
        self.kill9();
    }

    /// SIGTERM, then SIGKILL after `delay` (a crash during graceful
    /// shutdown), unless the process exited first.
    pub fn terminate_then_kill_after(&mut self, delay: Duration) {
        let mut c = self.child.take().expect("server running");
        let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
        std::thread::sleep(delay);
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Waits for `/readyz` to answer 200.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("narad exited during start-up ({status}); log:\n{}", self.log());
            }
            if self.opts.tls {
                // A cluster node listens before it sees a leader; it logs
                // when it is ready.
                let log = self.log();
                if log.contains("narad listening")
                    && (self.cluster_port.is_none() || log.contains("ready: a leader is visible"))
                {
                    return;
                }
            } else if let Ok(r) = self.client.get(format!("{}/readyz", self.base)).send()
                && r.status() == 200
            {
                return;
            }
            assert!(Instant::now() < deadline, "narad not ready in 30 s; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("server running");
        let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            assert!(Instant::now() < deadline, "narad did not stop in 30 s after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts again on the same data directory (a new port).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the server first");
        self.port = free_port();
        self.base = self.base_for(self.port);
        self.spawn();
    }

    fn base_for(&self, port: u16) -> String {
        let scheme = if self.opts.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{port}")
    }

    /// A request builder with `user:password` Basic credentials.
    pub fn as_user(
        &self,
        method: reqwest::Method,
        path: &str,
        user: &str,
        password: &str,
    ) -> reqwest::blocking::RequestBuilder {
        self.client.request(method, self.url(path)).basic_auth(user, Some(password))
    }

    /// As [`Server::as_user`] for the root user.
    pub fn as_admin(
        &self,
        method: reqwest::Method,
        path: &str,
    ) -> reqwest::blocking::RequestBuilder {
        self.as_user(method, path, "admin", ADMIN_PASSWORD)
    }

    /// Runs the `narad` CLI with `args` and environment `env` (on top of a
    /// cleaned `NARAD_*` environment); returns (exit code, stdout, stderr).
    pub fn cli(
        &self,
        args: &[&str],
        env: &[(&str, &str)],
        stdin: Option<&[u8]>,
    ) -> (i32, String, String) {
        run_cli(args, env, stdin)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn post(&self, path: &str, body: impl Into<reqwest::blocking::Body>) -> Response {
        self.client.post(self.url(path)).body(body).send().unwrap()
    }

    pub fn get(&self, path: &str) -> Response {
        self.client.get(self.url(path)).send().unwrap()
    }

    pub fn create_topic(&self, body: &str) -> Value {
        let r = self.post("/v1/topics", body.to_owned());
        let status = r.status();
        let text = r.text().unwrap();
        assert_eq!(status, 201, "create topic {body}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    pub fn produce(&self, topic: &str, query: &str, body: &[u8]) -> u16 {
        let q = if query.is_empty() { String::new() } else { format!("?{query}") };
        self.post(&format!("/v1/topics/{topic}/produce{q}"), body.to_vec()).status().as_u16()
    }

    /// One consume; `None` on 204.
    pub fn consume(&self, topic: &str, query: &str) -> Option<Value> {
        let r = self.get(&format!("/v1/topics/{topic}/consume?{query}"));
        match r.status().as_u16() {
            204 => None,
            200 => Some(serde_json::from_str(&r.text().unwrap()).unwrap()),
            other => panic!("consume: {other} {}", r.text().unwrap_or_default()),
        }
    }

    pub fn ack(&self, topic: &str, handle: &str, extend: Option<&str>) -> u16 {
        let e = extend.map(|e| format!("&extend={e}")).unwrap_or_default();
        self.post(&format!("/v1/topics/{topic}/ack?receipt_handle={handle}{e}"), Vec::new())
            .status()
            .as_u16()
    }

    /// Consumes and acks until the topic is empty; returns the payloads.
    pub fn drain(&self, topic: &str) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let r = self.get(&format!("/v1/topics/{topic}/consume?max=100&wait=200ms"));
            if r.status() == 204 {
                return out;
            }
            assert_eq!(r.status(), 200);
            let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
            let msgs = v["messages"].as_array().unwrap().clone();
            let handles: Vec<Value> = msgs.iter().map(|m| m["receipt_handle"].clone()).collect();
            for m in &msgs {
                out.push(payload_bytes(m));
            }
            let body = serde_json::json!({ "receipt_handles": handles }).to_string();
            let r = self.post(&format!("/v1/topics/{topic}/ack"), body);
            assert_eq!(r.status(), 200);
        }
    }
}

/// The value of the first series of a `/metrics` text that starts with
/// `prefix` (the name, and the start of its labels or a space) and contains
/// every one of `labels`.
pub fn metric(text: &str, prefix: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(prefix) && labels.iter().all(|x| l.contains(x)))
        .find_map(|l| l.rsplit_once(' ')?.1.parse().ok())
}

/// A message's payload as bytes: raw JSON text, a string's contents, or
/// decoded base64.
pub fn payload_bytes(m: &Value) -> Vec<u8> {
    match (&m["payload"], m.get("payload_encoding")) {
        (Value::String(s), Some(_)) => base64_decode(s),
        (Value::String(s), None) => s.as_bytes().to_vec(),
        (other, _) => other.to_string().into_bytes(),
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let table = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => 0,
        }
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::new();
    for chunk in bytes.chunks(4) {
        let mut v = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            v |= table(c) << (18 - 6 * i);
        }
        let n = chunk.len() * 6 / 8;
        for i in 0..n {
            out.push((v >> (16 - 8 * i)) as u8);
        }
    }
    out
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if let Some(root) = self.data_dir.parent() {
            remove_test_dir(root, std::slice::from_ref(&self.log_path));
        }
    }
}

/// Runs the `narad` CLI with `args`, no inherited `NARAD_*` variables, and
/// `env`; returns (exit code, stdout, stderr).
pub fn run_cli(args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>) -> (i32, String, String) {
    use std::io::Write as _;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_narad"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("NARAD_")) {
        cmd.env_remove(k);
    }
    let mut child = cmd
        .args(args)
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start narad");
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether a path exists.
pub fn exists(p: &Path) -> bool {
    p.exists()
}

/// Fails, naming a few, if any acknowledged id was never delivered: the
/// one promise every crash test checks. `what` says where (a test, a child).
pub fn assert_none_lost<T, I>(what: &str, acked: I, delivered: &std::collections::HashSet<T>)
where
    T: std::hash::Hash + Eq + std::fmt::Debug,
    I: IntoIterator<Item = T>,
{
    let acked: Vec<T> = acked.into_iter().collect();
    let lost: Vec<&T> = acked.iter().filter(|id| !delivered.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{what}: {} of {} acked messages lost, e.g. {:?}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(5)]
    );
}
