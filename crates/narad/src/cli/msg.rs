//! `narad pub`, `narad sub` and `narad replay`.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use clap::Args;
use serde_json::{Value, json};

use super::{CliError, CliResult, Client, Conn, Output, enc, failed, read_stdin, usage};

/// `narad pub`: produce a message (or many).
#[derive(Debug, Args)]
pub struct PubArgs {
    #[command(flatten)]
    conn: Conn,
    /// The topic.
    topic: String,
    /// The message body (else --file, else stdin).
    body: Option<String>,
    /// Read the body from this file.
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
    /// Message key (keyed messages of one key go to one partition).
    #[arg(short = 'k', long)]
    key: Option<String>,
    /// Pin the partition.
    #[arg(long)]
    partition: Option<u32>,
    /// Send the body this many times.
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// At most this many messages per second.
    #[arg(long)]
    rate: Option<f64>,
    /// Send batches of this many messages (1..=1000) per request.
    #[arg(long)]
    batch: Option<usize>,
}

fn body_of(a: &PubArgs) -> Result<Vec<u8>, CliError> {
    let body = match (&a.body, &a.file) {
        (Some(_), Some(_)) => {
            return Err(usage("give the body as an argument or --file, not both"));
        }
        (Some(b), None) => b.clone().into_bytes(),
        (None, Some(f)) => {
            std::fs::read(f).map_err(|e| usage(format!("cannot read {}: {e}", f.display())))?
        }
        (None, None) => read_stdin()?,
    };
    if body.is_empty() {
        return Err(usage("message required: the body is empty"));
    }
    Ok(body)
}

/// A batch record: JSON payloads as written, anything else base64.
fn batch_message(a: &PubArgs, body: &[u8]) -> Value {
    let mut m = serde_json::Map::new();
    if let Some(k) = &a.key {
        m.insert("key".into(), k.clone().into());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => {
            m.insert("payload".into(), v);
        }
        Err(_) => {
            m.insert("payload".into(), STANDARD.encode(body).into());
            m.insert("payload_encoding".into(), "base64".into());
        }
    }
    if let Some(p) = a.partition {
        m.insert("partition".into(), p.into());
    }
    Value::Object(m)
}

/// Runs `narad pub`.
pub fn run_pub(a: PubArgs) -> CliResult {
    let body = body_of(&a)?;
    if a.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return Err(usage("--rate must be > 0"));
    }
    let batch = a.batch.unwrap_or(1);
    if !(1..=1000).contains(&batch) {
        return Err(usage("--batch must be between 1 and 1000"));
    }
    let c = Client::new(&a.conn)?;
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < a.count {
        let n = (a.count - sent).min(batch as u64);
        if let Some(rate) = a.rate {
            let due = start + Duration::from_secs_f64(sent as f64 / rate);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        if a.batch.is_some() {
            let msgs: Vec<Value> = (0..n).map(|_| batch_message(&a, &body)).collect();
            let path = format!("/v1/topics/{}/produce/batch", enc(&a.topic));
            c.send_json("POST", &path, &json!({ "messages": msgs }))?
                .expect(202, &format!("publish to {}", a.topic))?;
        } else {
            let mut q = Vec::new();
            if let Some(k) = &a.key {
                q.push(format!("key={}", enc(k)));
            }
            if let Some(p) = a.partition {
                q.push(format!("partition={p}"));
            }
            let q = if q.is_empty() { String::new() } else { format!("?{}", q.join("&")) };
            let path = format!("/v1/topics/{}/produce{q}", enc(&a.topic));
            c.send("POST", &path, Some(body.clone()))?
                .expect(202, &format!("publish to {}", a.topic))?;
        }
        sent += n;
    }
    eprintln!("published {sent} message(s) to {}", a.topic);
    Ok(())
}

/// A message's payload bytes (JSON text, a string's contents, or base64
/// decoded).
fn payload_bytes(m: &Value) -> Vec<u8> {
    match (&m["payload"], m.get("payload_encoding")) {
        (Value::String(s), Some(_)) => STANDARD.decode(s).unwrap_or_else(|_| s.as_bytes().to_vec()),
        (Value::String(s), None) => s.as_bytes().to_vec(),
        (other, _) => other.to_string().into_bytes(),
    }
}

/// Prints one message: its JSON (`-o json`), its payload (`--raw`), or
/// `partition:offset [key] payload`.
fn print_message(output: Output, raw: bool, m: &Value) -> CliResult {
    let mut out = std::io::stdout().lock();
    let res = if raw {
        out.write_all(&payload_bytes(m)).and_then(|()| out.write_all(b"\n"))
    } else if output == Output::Json {
        writeln!(out, "{m}")
    } else {
        let key =
            m.get("key").and_then(Value::as_str).map(|k| format!(" key={k}")).unwrap_or_default();
        let payload = String::from_utf8_lossy(&payload_bytes(m)).into_owned();
        writeln!(out, "{}:{}{key} {payload}", m["partition"], m["offset"])
    };
    res.and_then(|()| out.flush()).map_err(|e| failed(format!("cannot write stdout: {e}")))
}

/// `narad sub`: consume and ack, printing each message.
#[derive(Debug, Args)]
pub struct SubArgs {
    #[command(flatten)]
    conn: Conn,
    /// The topic.
    topic: String,
    /// Only this partition.
    #[arg(long)]
    partition: Option<u32>,
    /// Stop after this many messages.
    #[arg(long)]
    max: Option<u64>,
    /// Read-only live tail: print new messages without leasing or acking.
    #[arg(long)]
    peek: bool,
    /// With --peek: start at this offset (default: the end of each partition).
    #[arg(long = "from", alias = "from-offset")]
    from: Option<u64>,
    /// Do not ack (messages become visible again after the lease).
    #[arg(long)]
    no_ack: bool,
    /// Print payloads only.
    #[arg(long)]
    raw: bool,
}

fn messages(v: &Value) -> Vec<Value> {
    v["messages"].as_array().cloned().unwrap_or_default()
}

fn ack_all(c: &Client, topic: &str, msgs: &[Value]) -> CliResult {
    let handles: Vec<&Value> = msgs.iter().map(|m| &m["receipt_handle"]).collect();
    let body = json!({ "receipt_handles": handles });
    let path = format!("/v1/topics/{}/ack", enc(topic));
    let mut last = None;
    for attempt in 0..3 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(200 << attempt));
        }
        match c.send_json("POST", &path, &body) {
            Ok(r) if r.status == 200 => {
                let v = r.value()?;
                for (h, res) in handles.iter().zip(v["results"].as_array().into_iter().flatten()) {
                    if res["status"] != 204 {
                        eprintln!("narad: ack of {h} failed: {}", res["error"]);
                    }
                }
                return Ok(());
            }
            Ok(r) if r.status < 500 => return Err(r.error("ack")),
            Ok(r) => last = Some(r.error("ack")),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("three attempts failed"))
}

/// Runs `narad sub`.
pub fn run_sub(a: SubArgs) -> CliResult {
    let c = Client::new(&a.conn)?;
    if a.peek {
        return peek(&c, &a);
    }
    if a.from.is_some() {
        return Err(usage("--from needs --peek (or use narad replay)"));
    }
    let mut seen = 0u64;
    let mut waiting = Waiting::new(&a.topic);
    while a.max.is_none_or(|m| seen < m) {
        let want = a.max.map_or(100, |m| (m - seen).min(100));
        let p = a.partition.map(|p| format!("&partition={p}")).unwrap_or_default();
        // On a terminal, ask without waiting first, so the note comes at
        // once when nothing is there (not after a 10 s long poll).
        let wait = if waiting.due() { "0s" } else { "10s" };
        let path = format!("/v1/topics/{}/consume?wait={wait}&max={want}{p}", enc(&a.topic));
        let r = c.get(&path)?;
        if r.status == 204 {
            waiting.idle();
            continue;
        }
        waiting.busy();
        let msgs = messages(&r.expect(200, &format!("consume {}", a.topic))?.value()?);
        for m in &msgs {
            print_message(c.output, a.raw, m)?;
        }
        if !a.no_ack && !msgs.is_empty() {
            ack_all(&c, &a.topic, &msgs)?;
        }
        seen += msgs.len() as u64;
    }
    Ok(())
}

/// The note on stderr that `sub` is waiting for messages: once each time
/// it becomes idle, and only when stderr is a terminal (a script reading
/// stdout and stderr sees messages and errors only).
struct Waiting {
    note: Option<String>,
    shown: bool,
}

impl Waiting {
    fn new(topic: &str) -> Waiting {
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let note =
            terminal.then(|| format!("narad: waiting for messages on {topic} (Ctrl-C stops)"));
        Waiting { note, shown: false }
    }

    /// Whether the note would be shown if nothing is there.
    fn due(&self) -> bool {
        self.note.is_some() && !self.shown
    }

    /// Nothing arrived.
    fn idle(&mut self) {
        if let Some(note) = &self.note
            && !self.shown
        {
            eprintln!("{note}");
            self.shown = true;
        }
    }

    /// Messages arrived.
    fn busy(&mut self) {
        self.shown = false;
    }
}

/// The partition count and each partition's (oldest, high watermark).
fn partition_bounds(c: &Client, topic: &str) -> Result<Vec<(u32, u64, u64)>, CliError> {
    let v = c.get(&format!("/v1/topics/{}", enc(topic)))?.expect(200, &format!("topic {topic}"))?;
    let v = v.value()?;
    Ok(v["partition_stats"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let n = |k: &str| p[k].as_u64().unwrap_or(0);
            (n("index") as u32, n("oldest_offset"), n("high_watermark"))
        })
        .collect())
}

/// Reads the message at `offset` of one partition (replay: no lease; one
/// record per request, as `max` does not combine with `offset`), or the
/// first one after it when offsets were skipped. `Ok(None)` when the
/// offset aged out; an empty list at the high watermark.
fn read_at(
    c: &Client,
    topic: &str,
    partition: u32,
    offset: u64,
) -> Result<Option<Vec<Value>>, CliError> {
    let path = format!("/v1/topics/{}/consume?partition={partition}&offset={offset}", enc(topic));
    let r = c.get(&path)?;
    match r.status {
        200 => Ok(Some(vec![r.value()?])),
        204 => Ok(Some(Vec::new())),
        410 => Ok(None),
        _ => Err(r.error(&format!("read {topic}/{partition}@{offset}"))),
    }
}

fn peek(c: &Client, a: &SubArgs) -> CliResult {
    let bounds = partition_bounds(c, &a.topic)?;
    let mut cursors: Vec<(u32, u64)> = bounds
        .iter()
        .filter(|(p, ..)| a.partition.is_none_or(|want| want == *p))
        .map(|(p, _, hwm)| (*p, a.from.unwrap_or(*hwm)))
        .collect();
    if cursors.is_empty() {
        return Err(usage(format!("topic {} has no partition {:?}", a.topic, a.partition)));
    }
    let mut seen = 0u64;
    let mut waiting = Waiting::new(&a.topic);
    loop {
        let mut progressed = false;
        for (p, offset) in cursors.iter_mut() {
            if a.max.is_some_and(|m| seen >= m) {
                return Ok(());
            }
            match read_at(c, &a.topic, *p, *offset)? {
                Some(msgs) => {
                    for m in &msgs {
                        print_message(c.output, a.raw, m)?;
                        *offset = m["offset"].as_u64().unwrap_or(*offset) + 1;
                    }
                    seen += msgs.len() as u64;
                    progressed |= !msgs.is_empty();
                }
                None => {
                    let oldest = partition_bounds(c, &a.topic)?
                        .into_iter()
                        .find(|(q, ..)| q == p)
                        .map_or(*offset, |(_, oldest, _)| oldest);
                    eprintln!(
                        "narad: partition {p} offset {offset} aged out; resuming at {oldest}"
                    );
                    *offset = oldest.max(*offset + 1);
                    progressed = true;
                }
            }
        }
        if a.max.is_some_and(|m| seen >= m) {
            return Ok(());
        }
        if progressed {
            waiting.busy();
        } else {
            waiting.idle();
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// `narad replay`: read one partition from an offset, without leasing.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    conn: Conn,
    /// The topic.
    topic: String,
    /// The partition.
    #[arg(long)]
    partition: u32,
    /// The first offset (default 0: the oldest kept).
    #[arg(long = "from-offset", alias = "from", default_value_t = 0)]
    from_offset: u64,
    /// Stop after this many messages (default: at the end of the partition).
    #[arg(long)]
    count: Option<u64>,
    /// Stop before this offset (exclusive).
    #[arg(long)]
    to: Option<u64>,
    /// Print payloads only.
    #[arg(long)]
    raw: bool,
}

/// Runs `narad replay`.
pub fn run_replay(a: ReplayArgs) -> CliResult {
    let c = Client::new(&a.conn)?;
    let mut offset = a.from_offset;
    let mut seen = 0u64;
    let mut all = Vec::new();
    while a.count.is_none_or(|n| seen < n) && a.to.is_none_or(|to| offset < to) {
        let Some(msgs) = read_at(&c, &a.topic, a.partition, offset)? else {
            let oldest = partition_bounds(&c, &a.topic)?
                .into_iter()
                .find(|(p, ..)| *p == a.partition)
                .map_or(offset + 1, |(_, oldest, _)| oldest);
            if oldest <= offset {
                return Err(failed(format!(
                    "offset {offset} of partition {} is unreadable",
                    a.partition
                )));
            }
            eprintln!("narad: offset {offset} aged out; starting at {oldest}");
            offset = oldest;
            continue;
        };
        if msgs.is_empty() {
            break;
        }
        for m in msgs {
            offset = m["offset"].as_u64().unwrap_or(offset) + 1;
            if a.to.is_some_and(|to| offset > to) {
                break;
            }
            seen += 1;
            if c.output == Output::Json && !a.raw {
                all.push(m);
            } else {
                print_message(c.output, a.raw, &m)?;
            }
        }
    }
    if c.output == Output::Json && !a.raw {
        c.print_json(&Value::Array(all));
    }
    if seen == 0 {
        let end = match a.to {
            Some(to) => format!("before offset {to}"),
            None => "to the end".to_owned(),
        };
        let held = match partition_bounds(&c, &a.topic)?.into_iter().find(|b| b.0 == a.partition) {
            Some((_, oldest, hwm)) if hwm > oldest => {
                format!("it holds offsets {oldest} to {}", hwm - 1)
            }
            Some(_) => "it holds none".to_owned(),
            None => format!("the topic has no partition {}", a.partition),
        };
        eprintln!(
            "narad: no messages in {}/{} from offset {} {end} ({held})",
            a.topic, a.partition, a.from_offset
        );
    }
    Ok(())
}
