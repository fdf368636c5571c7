//! The client commands (SPEC §8): `topic`, `pub`, `sub`, `replay`,
//! `user`, `cluster`, `ctx`, `version`.
//!
//! Every command talks to a server over HTTP(S) with Basic credentials.
//! Where they come from, strongest first: flags (`-s`, `-u`, `-p`,
//! `--ca-cert`), the environment (`NARAD_ADDR`, `NARAD_USER`,
//! `NARAD_PASSWORD`, `NARAD_CA_CERT`), the selected context (`narad ctx`),
//! then `http://127.0.0.1:7942` without credentials. Lists print as tables;
//! every read command takes `-o json`. Exit codes: 0 ok, 1 server or
//! network error, 2 usage error.

pub mod cluster;
pub mod ctx;
pub mod msg;
pub mod topic;
pub mod user;

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use base64::Engine as _;
use clap::{Args, ValueEnum};
use serde_json::Value;

/// The default server.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7942";

/// How read commands print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Output {
    /// Human-readable tables and lines.
    #[default]
    Table,
    /// JSON, as the server sent it.
    Json,
}

/// Where the server is and who we are (shared by every client command).
#[derive(Debug, Clone, Args)]
pub struct Conn {
    /// Server URL or host:port [default: the context's, else http://127.0.0.1:7942].
    #[arg(short = 's', long = "server", global = true, env = "NARAD_ADDR")]
    pub server: Option<String>,
    /// Username.
    #[arg(short = 'u', long = "user", global = true, env = "NARAD_USER")]
    pub user: Option<String>,
    /// Password.
    #[arg(
        short = 'p',
        long = "password",
        global = true,
        env = "NARAD_PASSWORD",
        hide_env_values = true
    )]
    pub password: Option<String>,
    /// PEM CA bundle to trust for an https server.
    #[arg(long, global = true, env = "NARAD_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// PEM client certificate (mutual TLS).
    #[arg(long, global = true, env = "NARAD_CLIENT_CERT", value_name = "FILE")]
    pub client_cert: Option<PathBuf>,
    /// PEM key of --client-cert.
    #[arg(long, global = true, env = "NARAD_CLIENT_KEY", value_name = "FILE")]
    pub client_key: Option<PathBuf>,
    /// Use this context instead of the selected one.
    #[arg(long, global = true, env = "NARAD_CONTEXT")]
    pub context: Option<String>,
    /// Output format of read commands.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

impl Conn {
    /// The connection of `narad bench`: its server, credentials and
    /// context (it speaks plain HTTP, so no certificates).
    pub fn for_bench(
        server: Option<String>,
        user: Option<String>,
        password: Option<String>,
        context: Option<String>,
    ) -> Conn {
        Conn {
            server,
            user,
            password,
            ca_cert: None,
            client_cert: None,
            client_key: None,
            context,
            output: Output::Table,
        }
    }
}

/// A command's failure, with its exit code.
#[derive(Debug)]
pub enum CliError {
    /// Exit 2: the command line is wrong.
    Usage(String),
    /// Exit 1: the server refused, or the network failed.
    Failed(String),
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(m) | CliError::Failed(m) => f.write_str(m),
        }
    }
}

/// What client commands return.
pub type CliResult = Result<(), CliError>;

/// Prints the error and picks the exit code.
pub fn finish(r: CliResult) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(m)) => {
            eprintln!("narad: {m}");
            ExitCode::from(2)
        }
        Err(CliError::Failed(m)) => {
            eprintln!("narad: {m}");
            ExitCode::from(1)
        }
    }
}

/// A usage error.
pub fn usage(msg: impl Into<String>) -> CliError {
    CliError::Usage(msg.into())
}

/// A server or network error.
pub fn failed(msg: impl Into<String>) -> CliError {
    CliError::Failed(msg.into())
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: Vec<u8>,
    /// Whether the body is JSON.
    pub json: bool,
}

impl Reply {
    /// The body as JSON.
    pub fn value(&self) -> Result<Value, CliError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| failed(format!("the server sent invalid JSON: {e}")))
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The error this answer stands for: the server's `error` text, or
    /// for a route the server does not have, a note saying so.
    pub fn error(&self, what: &str) -> CliError {
        if self.status == 404 && !self.json {
            return failed(format!("{what}: this server does not support this request (404)"));
        }
        let msg = if self.json {
            self.value().ok().and_then(|v| v["error"].as_str().map(str::to_owned))
        } else {
            None
        };
        let msg = msg.unwrap_or_else(|| self.text().trim().to_owned());
        failed(format!("{what}: {} {msg}", self.status))
    }

    /// Ok when the status is `want`, else the error.
    pub fn expect(self, want: u16, what: &str) -> Result<Reply, CliError> {
        if self.status == want { Ok(self) } else { Err(self.error(what)) }
    }
}

/// A connection to one server.
#[derive(Debug)]
pub struct Client {
    agent: ureq::Agent,
    base: String,
    auth: Option<String>,
    /// How read commands print.
    pub output: Output,
}

fn pem_file(path: &PathBuf, what: &str) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|e| usage(format!("cannot read {what} {}: {e}", path.display())))
}

impl Client {
    /// Connects as `conn` says (flags, env, context, default).
    pub fn new(conn: &Conn) -> Result<Client, CliError> {
        let mut conn = conn.clone();
        ctx::fill_from_context(&mut conn)?;
        let server = conn.server.clone().unwrap_or_else(|| DEFAULT_SERVER.to_owned());
        let base = if server.contains("://") { server } else { format!("http://{server}") };
        let base = base.trim_end_matches('/').to_owned();
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(ca) = &conn.ca_cert {
            let pem = pem_file(ca, "--ca-cert")?;
            let certs: Vec<_> = ureq::tls::parse_pem(&pem)
                .filter_map(|i| match i {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                return Err(usage(format!("--ca-cert {}: no certificate found", ca.display())));
            }
            tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&certs));
        }
        match (&conn.client_cert, &conn.client_key) {
            (Some(c), Some(k)) => {
                let pem = pem_file(c, "--client-cert")?;
                let chain: Vec<_> = ureq::tls::parse_pem(&pem)
                    .filter_map(|i| match i {
                        Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                        _ => None,
                    })
                    .collect();
                let key = ureq::tls::PrivateKey::from_pem(&pem_file(k, "--client-key")?)
                    .map_err(|e| usage(format!("--client-key {}: {e}", k.display())))?;
                tls = tls.client_cert(Some(ureq::tls::ClientCert::new_with_certs(&chain, key)));
            }
            (None, None) => {}
            _ => return Err(usage("--client-cert and --client-key go together")),
        }
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .tls_config(tls.build())
            .build()
            .new_agent();
        let auth = conn.user.as_ref().map(|u| {
            let pair = format!("{u}:{}", conn.password.as_deref().unwrap_or(""));
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
        });
        Ok(Client { agent, base, auth, output: conn.output })
    }

    /// The same connection (credentials, TLS, output) to another server:
    /// `addr` is a member's advertised HTTP `host:port`, reached with this
    /// client's scheme.
    pub fn at(&self, addr: &str) -> Client {
        let scheme = self.base.split("://").next().unwrap_or("http");
        Client {
            agent: self.agent.clone(),
            base: format!("{scheme}://{addr}"),
            auth: self.auth.clone(),
            output: self.output,
        }
    }

    /// Sends one request; `path` starts with `/`.
    pub fn send(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<Reply, CliError> {
        let url = format!("{}{path}", self.base);
        let mut req = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        if body.is_some() {
            req = req.header("Content-Type", "application/json");
        }
        let req = req.body(body.unwrap_or_default()).map_err(|e| usage(format!("{url}: {e}")))?;
        let mut resp = self.agent.run(req).map_err(|e| failed(format!("{url}: {e}")))?;
        let json = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_vec()
            .map_err(|e| failed(format!("{url}: {e}")))?;
        Ok(Reply { status, body, json })
    }

    /// `GET`.
    pub fn get(&self, path: &str) -> Result<Reply, CliError> {
        self.send("GET", path, None)
    }

    /// Sends a JSON body.
    pub fn send_json(&self, method: &str, path: &str, v: &Value) -> Result<Reply, CliError> {
        self.send(method, path, Some(v.to_string().into_bytes()))
    }

    /// Prints a JSON value (pretty) on stdout.
    pub fn print_json(&self, v: &Value) {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    }
}

/// Percent-encodes a path segment or query value.
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A human duration (`1h`, `30s`, `1m30s`, `500ms`, `7d`) as milliseconds.
pub fn parse_duration_ms(s: &str) -> Result<i64, CliError> {
    let bad = || usage(format!("invalid duration {s:?} (use e.g. 30s, 5m, 1h, 7d, 500ms)"));
    if s == "0" {
        return Ok(0);
    }
    let (mut total, mut rest) = (0f64, s.trim());
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let n_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let n: f64 = rest[..n_end].parse().map_err(|_| bad())?;
        let unit_end = rest[n_end..]
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .map_or(rest.len(), |i| n_end + i);
        let ms = match &rest[n_end..unit_end] {
            "ms" => 1.0,
            "s" => 1_000.0,
            "m" => 60_000.0,
            "h" => 3_600_000.0,
            "d" => 86_400_000.0,
            _ => return Err(bad()),
        };
        total += n * ms;
        rest = &rest[unit_end..];
    }
    Ok(total.round() as i64)
}

/// Reads all of stdin.
pub fn read_stdin() -> Result<Vec<u8>, CliError> {
    let mut buf = Vec::new();
    std::io::stdin().read_to_end(&mut buf).map_err(|e| usage(format!("cannot read stdin: {e}")))?;
    Ok(buf)
}

/// `narad version`.
pub fn version(output: Output) -> CliResult {
    let v = env!("CARGO_PKG_VERSION");
    match output {
        Output::Json => println!("{}", serde_json::json!({ "version": v })),
        Output::Table => println!("narad {v}"),
    }
    Ok(())
}

/// A table with a header row, printed on stdout.
pub fn print_table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    t.set_header(header.iter().map(|h| h.to_uppercase()));
    for r in rows {
        t.add_row(r);
    }
    println!("{t}");
}

/// A JSON value as table cell text (strings without quotes).
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations() {
        assert_eq!(parse_duration_ms("30s").unwrap(), 30_000);
        assert_eq!(parse_duration_ms("1h").unwrap(), 3_600_000);
        assert_eq!(parse_duration_ms("1m30s").unwrap(), 90_000);
        assert_eq!(parse_duration_ms("7d").unwrap(), 604_800_000);
        assert_eq!(parse_duration_ms("500ms").unwrap(), 500);
        assert_eq!(parse_duration_ms("1.5s").unwrap(), 1_500);
        assert_eq!(parse_duration_ms("0").unwrap(), 0);
        for bad in ["", "10", "5x", "s", "1h5"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn encoding_keeps_unreserved_bytes() {
        assert_eq!(enc("a.b-c_d~"), "a.b-c_d~");
        assert_eq!(enc("a b/c"), "a%20b%2Fc");
    }
}
