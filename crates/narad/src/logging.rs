//! Logs on stderr, text or JSON, at narad's levels.
//!
//! narad's own events are written as they are. The libraries it runs on
//! log by their own standards, which are not an operator's: openraft logs
//! its state machine at INFO and a vote sent to a peer that is still
//! starting at ERROR, quinn its connection life at INFO. Their events are
//! mapped to what they mean for an operator of narad ([`effective_level`]):
//!
//! | library | event | shown as |
//! |---|---|---|
//! | openraft, quinn | INFO | DEBUG |
//! | openraft | WARN (stale messages, changed votes, back-off, a peer's RPC failing) | DEBUG |
//! | openraft | WARN that a log store broke its contract or a follower's log went back | WARN |
//! | openraft | ERROR of an RPC to a peer (not answered, refused, timed out: a peer starting, stopping or cut off) | DEBUG |
//! | openraft | ERROR of a command sent to a core that has stopped, or of a request whose answer was lost as the core stopped (at shutdown; a fatal stop is reported on its own): any ERROR whose `error` field is openraft's `Fatal::Stopped`, and the messages in `OPENRAFT_CORE_STOPPED` | DEBUG |
//! | openraft | any other ERROR (storage, a fatal core error) | ERROR |
//!
//! The mapped level is both what the filter compares with `log.level` and
//! what is printed. A filter that names a library (`info,openraft=debug`)
//! selects that library's events by their own level; they are still
//! printed at the mapped one. A peer that stays unreachable is narad's to
//! report: membership marks it dead (WARN) after 30 s without a heartbeat.
//!
//! Raft node ids are 64-bit hashes of the configured node ids; in a
//! cluster every line is printed with each peer's id in place of its
//! number (`T1-N9238…` becomes `T1-Nn2`).

use std::fmt::{self, Write as _};
use std::sync::Arc;

use narad_server::config::LogFormat;
use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber, span};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::{Format, Full, Json, JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer as _, Registry};

/// A library whose levels are mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Library {
    Openraft,
    Quinn,
}

impl Library {
    /// The library an event's target belongs to.
    fn of(target: &str) -> Option<Library> {
        match target.split("::").next().unwrap_or(target) {
            "openraft" => Some(Library::Openraft),
            "quinn" | "quinn_proto" | "quinn_udp" => Some(Library::Quinn),
            _ => None,
        }
    }

    /// The crate names a filter directive would use for it.
    fn names(self) -> &'static [&'static str] {
        match self {
            Library::Openraft => &["openraft"],
            Library::Quinn => &["quinn", "quinn_proto", "quinn_udp"],
        }
    }
}

/// openraft's messages of an RPC to a peer that failed (0.9): the peer is
/// starting, stopping, restarting or cut off. Prefixes.
const OPENRAFT_PEER_RPC_FAILED: [&str; 8] = [
    "while requesting vote",
    "timeout",
    "RPCError",
    "error replication to target=",
    "heartbeat error",
    "update progress error",
    "InstallSnapshot RPC timed out",
    "error sending InstallSnapshot RPC",
];

/// openraft's ERRORs when a command reaches a core that has stopped (a
/// campaign asked for while the node shuts down), or a request in flight
/// (an AppendEntries from the leader) loses its answer because the core
/// stopped under it. Prefixes.
/// (`core_call fatal error` is how a request's call into a stopped core
/// ends; a core that stops on a fatal error says so at ERROR on its own.)
const OPENRAFT_CORE_STOPPED: [&str; 3] = [
    "failure sending external command to RaftCore",
    "failure receiving rx from RaftCore",
    "core_call fatal error",
];

/// openraft's WARNs an operator should see: the log store broke its
/// contract, or a follower's log went back.
const OPENRAFT_WARN_KEPT: [&str; 2] = ["violates the API contract", "log is reverted"];

/// Whether an event's `error` field is openraft's `Fatal::Stopped` (its
/// Debug form `Stopped`, its Display form `raft stopped`): a call into a
/// core that stopped, whatever the message around it says.
fn is_core_stopped(error: &str) -> bool {
    let e = error.trim();
    e == "Stopped" || e.ends_with("(Stopped)") || e == "raft stopped"
}

/// The level an event from `target` at `level` with `message` and `error`
/// field (empty when it has none) is shown at (see the module's table).
pub fn effective_level(target: &str, level: Level, message: &str, error: &str) -> Level {
    let Some(library) = Library::of(target) else { return level };
    match (library, level) {
        (_, Level::INFO) => Level::DEBUG,
        (Library::Openraft, Level::WARN) => {
            if OPENRAFT_WARN_KEPT.iter().any(|m| message.contains(m)) {
                Level::WARN
            } else {
                Level::DEBUG
            }
        }
        (Library::Openraft, Level::ERROR) => {
            // "error replication to target=" is also how a storage error is
            // reported at ERROR: that one stays.
            let peer = OPENRAFT_PEER_RPC_FAILED
                .iter()
                .filter(|m| !m.starts_with("error replication"))
                .any(|m| message.starts_with(m));
            // A command for a core that has stopped: at shutdown, or after
            // a fatal error that openraft reports at ERROR on its own.
            let stopped = is_core_stopped(error)
                || OPENRAFT_CORE_STOPPED.iter().any(|m| message.starts_with(m));
            if peer || stopped { Level::DEBUG } else { Level::ERROR }
        }
        _ => level,
    }
}

/// The `message` and `error` fields of an event (only read for the few
/// events whose level depends on them).
#[derive(Default)]
struct Message {
    message: String,
    error: String,
}

impl Message {
    fn field(&mut self, field: &Field) -> Option<&mut String> {
        match field.name() {
            "message" => Some(&mut self.message),
            "error" => Some(&mut self.error),
            _ => None,
        }
    }
}

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if let Some(s) = self.field(field) {
            s.push_str(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if let Some(s) = self.field(field) {
            let _ = write!(s, "{value:?}");
        }
    }
}

/// The level `event` is shown at.
fn event_level(event: &Event<'_>) -> Level {
    let meta = event.metadata();
    let level = *meta.level();
    match (Library::of(meta.target()), level) {
        (None, _) => level,
        // Only openraft's WARN and ERROR depend on the message.
        (Some(Library::Openraft), Level::WARN | Level::ERROR) => {
            let mut m = Message::default();
            event.record(&mut m);
            effective_level(meta.target(), level, &m.message, &m.error)
        }
        (Some(_), _) => effective_level(meta.target(), level, "", ""),
    }
}

/// The filter: `log.level` as an [`EnvFilter`] for narad's events, the
/// mapped levels against the filter's default level for the libraries'.
struct Levels {
    env: EnvFilter,
    /// The filter's bare level (`info` of `info,narad_wal=debug`).
    default: LevelFilter,
    /// Libraries the filter names: their events are selected by `env`.
    named: Vec<Library>,
}

impl Levels {
    fn new(spec: &str) -> Result<Levels, String> {
        let env =
            EnvFilter::try_new(spec).map_err(|e| format!("invalid log level {spec:?}: {e}"))?;
        let directives: Vec<&str> = spec.split(',').map(str::trim).collect();
        let default = directives
            .iter()
            .filter_map(|d| d.parse::<LevelFilter>().ok())
            .next_back()
            .unwrap_or(LevelFilter::OFF);
        let named = [Library::Openraft, Library::Quinn]
            .into_iter()
            .filter(|l| {
                directives.iter().any(|d| {
                    let target = d.split(['=', '[']).next().unwrap_or("");
                    l.names().iter().any(|n| target == *n || target.starts_with(&format!("{n}::")))
                })
            })
            .collect();
        Ok(Levels { env, default, named })
    }

    /// The library of `meta` when this filter maps its levels.
    fn mapped(&self, meta: &Metadata<'_>) -> Option<Library> {
        Library::of(meta.target()).filter(|l| !self.named.contains(l))
    }
}

impl<S: Subscriber> Filter<S> for Levels {
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        match self.mapped(meta) {
            // Mapping only lowers a level: an event too verbose at its own
            // level stays hidden; the rest is decided per event.
            Some(_) if meta.is_event() => *meta.level() <= self.default,
            Some(_) => effective_level(meta.target(), *meta.level(), "", "") <= self.default,
            None => Filter::<S>::enabled(&self.env, meta, cx),
        }
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        match self.mapped(meta) {
            Some(_) if *meta.level() <= self.default => Interest::sometimes(),
            Some(_) => Interest::never(),
            None => Filter::<S>::callsite_enabled(&self.env, meta),
        }
    }

    fn event_enabled(&self, event: &Event<'_>, cx: &Context<'_, S>) -> bool {
        match self.mapped(event.metadata()) {
            Some(_) => event_level(event) <= self.default,
            None => Filter::<S>::event_enabled(&self.env, event, cx),
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Filter::<S>::max_level_hint(&self.env)
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        Filter::<S>::on_new_span(&self.env, attrs, id, ctx);
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        Filter::<S>::on_record(&self.env, id, values, ctx);
    }

    fn on_enter(&self, id: &span::Id, ctx: Context<'_, S>) {
        Filter::<S>::on_enter(&self.env, id, ctx);
    }

    fn on_exit(&self, id: &span::Id, ctx: Context<'_, S>) {
        Filter::<S>::on_exit(&self.env, id, ctx);
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        Filter::<S>::on_close(&self.env, id, ctx);
    }
}

/// Raft node ids (decimal) and the node ids they stand for.
#[derive(Debug, Clone, Default)]
pub struct NodeNames(Arc<Vec<(String, String)>>);

impl NodeNames {
    /// The names of `ids` (the configured node ids of the peers).
    pub fn of<'a>(ids: impl IntoIterator<Item = &'a str>) -> NodeNames {
        let mut names: Vec<(String, String)> = ids
            .into_iter()
            .map(|id| (narad_server::cluster_settings::raft_id(id).to_string(), id.to_owned()))
            .collect();
        names.sort();
        names.dedup();
        NodeNames(Arc::new(names))
    }

    /// `line` with every whole decimal number that is a raft node id
    /// replaced by its node's id.
    pub fn replace(&self, line: &str) -> String {
        let mut out = String::with_capacity(line.len());
        let mut rest = line;
        while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
            out.push_str(&rest[..start]);
            let digits = &rest[start..];
            let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
            let number = &digits[..end];
            match self.0.iter().find(|(n, _)| n == number) {
                Some((_, name)) => out.push_str(name),
                None => out.push_str(number),
            }
            rest = &digits[end..];
        }
        out.push_str(rest);
        out
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The event format: tracing-subscriber's full text or JSON format, with
/// the mapped level and the node names.
struct NaradFormat {
    json: bool,
    names: NodeNames,
    text: Format<Full, SystemTime>,
    /// Text without time and level (the mapped level is written here).
    bare_text: Format<Full, ()>,
    json_full: Format<Json, SystemTime>,
    /// JSON without the level.
    bare_json: Format<Json, SystemTime>,
}

impl NaradFormat {
    fn new(json: bool, names: NodeNames) -> NaradFormat {
        let json_full = Format::default().json().flatten_event(true);
        NaradFormat {
            json,
            names,
            text: Format::default(),
            bare_text: Format::default().without_time().with_level(false).with_ansi(false),
            bare_json: json_full.clone().with_level(false),
            json_full,
        }
    }
}

/// tracing-subscriber's padded level names and colours.
fn level_label(level: Level, ansi: bool) -> String {
    let (name, colour) = match level {
        Level::TRACE => ("TRACE", "35"),
        Level::DEBUG => ("DEBUG", "34"),
        Level::INFO => (" INFO", "32"),
        Level::WARN => (" WARN", "33"),
        Level::ERROR => ("ERROR", "31"),
    };
    if ansi { format!("\x1b[{colour}m{name}\x1b[0m") } else { name.to_owned() }
}

impl<S, N> FormatEvent<S, N> for NaradFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mapped = Library::of(event.metadata().target()).is_some();
        if !mapped && self.names.is_empty() {
            return match self.json {
                true => self.json_full.format_event(ctx, writer, event),
                false => self.text.format_event(ctx, writer, event),
            };
        }
        let level = event_level(event);
        let ansi = writer.has_ansi_escapes();
        let mut buf = String::new();
        match (self.json, mapped) {
            (true, false) => self.json_full.format_event(ctx, Writer::new(&mut buf), event)?,
            (false, false) => {
                self.text.clone().with_ansi(ansi).format_event(ctx, Writer::new(&mut buf), event)?
            }
            (true, true) => {
                self.bare_json.format_event(ctx, Writer::new(&mut buf), event)?;
                // `{"timestamp":...` becomes `{"level":"DEBUG","timestamp":...`.
                let rest = buf.strip_prefix('{').unwrap_or(&buf);
                buf = format!("{{\"level\":\"{level}\",{rest}");
            }
            (false, true) => {
                let mut head = String::new();
                let mut w = Writer::new(&mut head);
                if ansi {
                    w.write_str("\x1b[2m")?;
                }
                SystemTime.format_time(&mut w)?;
                if ansi {
                    w.write_str("\x1b[0m")?;
                }
                write!(w, " {} ", level_label(level, ansi))?;
                self.bare_text.format_event(ctx, Writer::new(&mut buf), event)?;
                buf.insert_str(0, &head);
            }
        }
        let line = if self.names.is_empty() { buf } else { self.names.replace(&buf) };
        writer.write_str(&line)
    }
}

/// Installs the global subscriber: `level` (a level or a tracing filter),
/// `format`, the raft node ids of `names` printed as node ids.
pub fn init(level: &str, format: LogFormat, names: NodeNames) -> Result<(), String> {
    let filter = Levels::new(level)?;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let json = matches!(format, LogFormat::Json);
    let base = tracing_subscriber::fmt::layer()
        .with_ansi(ansi && !json)
        .with_writer(std::io::stderr)
        .event_format(NaradFormat::new(json, names));
    let result = if json {
        Registry::default().with(base.fmt_fields(JsonFields::new()).with_filter(filter)).try_init()
    } else {
        Registry::default().with(base.with_filter(filter)).try_init()
    };
    result.map_err(|e| format!("cannot set up logging: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_info_is_debug_and_peer_rpc_failures_are_not_errors() {
        let l = |t: &str, level: Level, m: &str| effective_level(t, level, m, "");
        assert_eq!(l("openraft::core::raft_core", Level::INFO, "anything"), Level::DEBUG);
        assert_eq!(l("quinn_proto::connection", Level::INFO, ""), Level::DEBUG);
        assert_eq!(l("quinn_udp", Level::WARN, "sendmsg error"), Level::WARN);
        assert_eq!(l("narad_cluster::raft", Level::INFO, ""), Level::INFO);
        assert_eq!(l("narad_cluster::raft", Level::ERROR, "timeout"), Level::ERROR);
        // A vote to a node that is starting, an append nobody answered.
        let core = "openraft::core::raft_core";
        assert_eq!(l(core, Level::ERROR, "while requesting vote"), Level::DEBUG);
        assert_eq!(l(core, Level::ERROR, "timeout"), Level::DEBUG);
        assert_eq!(l("openraft::replication", Level::ERROR, "RPCError"), Level::DEBUG);
        let repl = "error replication to target=1";
        assert_eq!(l("openraft::replication", Level::WARN, repl), Level::DEBUG);
        // Storage and fatal errors stay errors; a broken log store warns.
        assert_eq!(l("openraft::replication", Level::ERROR, repl), Level::ERROR);
        assert_eq!(l(core, Level::ERROR, "quit RaftCore::main on error"), Level::ERROR);
        let inner = "openraft::raft::raft_inner";
        let stopped = "failure sending external command to RaftCore; message: trigger_elect";
        assert_eq!(l(inner, Level::ERROR, stopped), Level::DEBUG);
        // An AppendEntries that arrived as the core stopped (seen in
        // start_logs.rs at a cluster's stop).
        let lost =
            "failure receiving rx from RaftCore; message: AppendEntries: vote=T2-Nn3:committed";
        assert_eq!(l(inner, Level::ERROR, lost), Level::DEBUG);
        assert_eq!(l(inner, Level::ERROR, "core_call fatal error"), Level::DEBUG);
        assert_eq!(l("openraft::storage", Level::ERROR, "LogFlush error: x"), Level::ERROR);
        // Any message whose error is a stopped core (openraft's `error when
        // <call>` with `error=Stopped`, or one not met yet), and only that
        // error.
        let e = |m: &str, error: &str| effective_level(inner, Level::ERROR, m, error);
        assert_eq!(e("error when get_metrics", "Stopped"), Level::DEBUG);
        assert_eq!(e("error when get_metrics", "raft stopped"), Level::DEBUG);
        assert_eq!(e("some future message", "Fatal(Stopped)"), Level::DEBUG);
        assert_eq!(e("error when get_metrics", "Panicked"), Level::ERROR);
        assert_eq!(e("quit RaftCore::main on error", "StorageError(...)"), Level::ERROR);
        let contract =
            "limited_get_log_entries(1, 2) returned empty; this violates the API contract";
        assert_eq!(l("openraft::replication", Level::WARN, contract), Level::WARN);
        assert_eq!(
            l(core, Level::WARN, "A message will be ignored because vote changed"),
            Level::DEBUG
        );
    }

    #[test]
    fn the_filter_default_level_and_named_libraries_come_from_the_spec() {
        let f = Levels::new("info").unwrap();
        assert_eq!((f.default, f.named.len()), (LevelFilter::INFO, 0));
        let f = Levels::new("warn,narad_wal=debug").unwrap();
        assert_eq!(f.default, LevelFilter::WARN);
        let f = Levels::new("info,openraft=debug").unwrap();
        assert_eq!(f.named, vec![Library::Openraft]);
        let f = Levels::new("quinn_proto::connection=trace").unwrap();
        assert_eq!((f.default, f.named.clone()), (LevelFilter::OFF, vec![Library::Quinn]));
        assert!(Levels::new("info,=bad=").is_err());
    }

    #[test]
    fn raft_ids_are_printed_as_node_ids_only_where_a_whole_number_matches() {
        let names = NodeNames::of(["n1", "n2"]);
        let n1 = narad_server::cluster_settings::raft_id("n1");
        let n2 = narad_server::cluster_settings::raft_id("n2");
        let line = format!("vote T3-N{n1}:Q target={n2} other=1{n2} index=7");
        assert_eq!(names.replace(&line), format!("vote T3-Nn1:Q target=n2 other=1{n2} index=7"));
        assert_eq!(NodeNames::default().replace("a 12 b"), "a 12 b");
    }
}
