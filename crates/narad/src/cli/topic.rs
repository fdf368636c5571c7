//! `narad topic add|ls|info|edit|rm|attach|detach|children`.

use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};

use super::{CliResult, Client, Conn, Output, cell, enc, parse_duration_ms, print_table, usage};

/// `narad topic ...`.
#[derive(Debug, Args)]
pub struct TopicArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    cmd: TopicCommand,
}

/// Options shared by `add` and `edit`.
#[derive(Debug, Args)]
struct Options {
    /// Partition count (edit: grow only).
    #[arg(long)]
    partitions: Option<i64>,
    /// Retention (e.g. 7d, 12h; 0 = the server default).
    #[arg(long)]
    retention: Option<String>,
    /// Leases per partition.
    #[arg(long)]
    max_in_flight: Option<i64>,
    /// Acked-ahead entries per partition.
    #[arg(long)]
    max_acked_ahead: Option<i64>,
    /// JSON Schema for payloads: inline JSON, or @FILE.
    #[arg(long)]
    schema: Option<String>,
}

#[derive(Debug, Subcommand)]
enum TopicCommand {
    /// Create a topic.
    Add {
        /// The topic's name.
        name: String,
        #[command(flatten)]
        options: Options,
        /// Visibility timeout of a lease (e.g. 30s; default 30 s). Fixed
        /// once the topic exists: `edit` cannot change it (SPEC §1.3).
        #[arg(long)]
        visibility: Option<String>,
        /// Create it as a fan-out child of this topic.
        #[arg(long)]
        parent: Option<String>,
        /// Fan-out delay of the child (e.g. 10m; needs --parent).
        #[arg(long)]
        delay: Option<String>,
    },
    /// List topics.
    Ls,
    /// Show a topic and its partitions.
    Info {
        /// The topic.
        name: String,
        /// Only this partition.
        #[arg(long)]
        partition: Option<u32>,
    },
    /// Change a topic.
    Edit {
        /// The topic.
        name: String,
        #[command(flatten)]
        options: Options,
    },
    /// Delete a topic and its messages.
    Rm {
        /// The topic.
        name: String,
    },
    /// Attach a child topic to a parent (fan-out).
    Attach {
        /// The parent topic.
        parent: String,
        /// The child topic.
        child: String,
        /// Delivery delay of the child (e.g. 10m).
        #[arg(long)]
        delay: Option<String>,
    },
    /// Detach a child topic from its parent.
    Detach {
        /// The parent topic.
        parent: String,
        /// The child topic.
        child: String,
    },
    /// List a parent's children and their lag.
    Children {
        /// The parent topic.
        parent: String,
    },
}

fn schema_value(raw: &str) -> Result<Value, super::CliError> {
    let text = match raw.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| usage(format!("cannot read schema file {path}: {e}")))?,
        None => raw.to_owned(),
    };
    serde_json::from_str(&text).map_err(|e| usage(format!("--schema is not JSON: {e}")))
}

fn options_body(o: Options, body: &mut Map<String, Value>) -> CliResult {
    if let Some(p) = o.partitions {
        body.insert("partitions".into(), p.into());
    }
    if let Some(r) = o.retention {
        body.insert("retention_ms".into(), parse_duration_ms(&r)?.into());
    }
    if let Some(c) = o.max_in_flight {
        body.insert("max_in_flight_per_partition".into(), c.into());
    }
    if let Some(c) = o.max_acked_ahead {
        body.insert("max_acked_ahead_per_partition".into(), c.into());
    }
    if let Some(s) = o.schema {
        body.insert("schema".into(), schema_value(&s)?);
    }
    Ok(())
}

fn topic_row(t: &Value) -> Vec<String> {
    let role = t.get("role").map_or_else(|| "standalone".to_owned(), cell);
    vec![
        cell(&t["name"]),
        cell(&t["partitions"]),
        cell(&t["retention_ms"]),
        cell(&t["visibility_timeout_ms"]),
        role,
        t.get("owner").map(cell).unwrap_or_default(),
    ]
}

const TOPIC_HEADER: [&str; 6] =
    ["name", "partitions", "retention_ms", "visibility_ms", "role", "owner"];

fn print_topic(c: &Client, t: &Value) {
    match c.output {
        Output::Json => c.print_json(t),
        Output::Table => print_table(&TOPIC_HEADER, vec![topic_row(t)]),
    }
}

/// The partition table of `topic info`: each partition's owner, its
/// liveness and status, then its log figures. Figures that are not the
/// owner's (it did not answer, or is not alive: the asked node's own,
/// often zero) are marked `*` and explained below the table.
fn print_partitions(v: &Value) {
    let parts: Vec<&Value> = v["partition_stats"].as_array().into_iter().flatten().collect();
    let figures = ["oldest_offset", "next_offset", "high_watermark", "segments", "size_bytes"];
    let mut marked = Vec::new();
    let rows = parts
        .iter()
        .map(|p| {
            let owner = p.get("owner_node").map_or_else(|| "(unassigned)".to_owned(), cell);
            // A single node's figures are its own (no `stats_from`).
            let from = p.get("stats_from").map(cell);
            let not_owners =
                from.as_ref().is_some_and(|f| Some(f) != p.get("owner_node").map(cell).as_ref());
            let mark = if not_owners { "*" } else { "" };
            if not_owners {
                marked.push(format!(
                    "partition {}: figures of {} (owner {owner} is {})",
                    cell(&p["index"]),
                    from.unwrap_or_default(),
                    cell(&p["owner_liveness"])
                ));
            }
            let mut row =
                vec![cell(&p["index"]), owner, cell(&p["owner_liveness"]), cell(&p["status"])];
            row.extend(figures.iter().map(|k| format!("{}{mark}", cell(&p[*k]))));
            row
        })
        .collect();
    let mut header = vec!["partition", "owner", "liveness", "status"];
    header.extend(figures);
    print_table(&header, rows);
    if !marked.is_empty() || v["partial"] == true {
        println!();
        println!(
            "* partial: these figures are not the owner's but the asked node's own (the owner did \
             not answer or is not alive)"
        );
        for m in marked {
            println!("  {m}");
        }
    }
}

/// Runs `narad topic`.
pub fn run(a: TopicArgs) -> CliResult {
    let c = Client::new(&a.conn)?;
    match a.cmd {
        TopicCommand::Add { name, options, visibility, parent, delay } => {
            let mut body = Map::new();
            body.insert("name".into(), name.clone().into());
            options_body(options, &mut body)?;
            if let Some(v) = visibility {
                body.insert("visibility_timeout_ms".into(), parse_duration_ms(&v)?.into());
            }
            if let Some(p) = parent {
                body.insert("parent".into(), p.into());
            }
            if let Some(d) = delay {
                body.insert("fanout_delay_ms".into(), parse_duration_ms(&d)?.into());
            }
            let r = c.send_json("POST", "/v1/topics", &Value::Object(body))?;
            let t = r.expect(201, &format!("create topic {name}"))?.value()?;
            print_topic(&c, &t);
        }
        TopicCommand::Ls => {
            let mut all = Vec::new();
            let mut token = String::new();
            loop {
                let path = format!("/v1/topics?limit=1000&page_token={}", enc(&token));
                let v = c.get(&path)?.expect(200, "list topics")?.value()?;
                all.extend(v["topics"].as_array().cloned().unwrap_or_default());
                token = v["next_page_token"].as_str().unwrap_or_default().to_owned();
                if token.is_empty() {
                    break;
                }
            }
            match c.output {
                Output::Json => c.print_json(&Value::Array(all)),
                Output::Table => print_table(&TOPIC_HEADER, all.iter().map(topic_row).collect()),
            }
        }
        TopicCommand::Info { name, partition } => {
            let q = partition.map(|p| format!("?partition={p}")).unwrap_or_default();
            let v = c.get(&format!("/v1/topics/{}{q}", enc(&name)))?;
            let v = v.expect(200, &format!("topic {name}"))?.value()?;
            match c.output {
                Output::Json => c.print_json(&v),
                Output::Table => {
                    let mut fields = Vec::new();
                    for (k, val) in v.as_object().into_iter().flatten() {
                        if k != "partition_stats" {
                            fields.push(vec![k.clone(), cell(val)]);
                        }
                    }
                    print_table(&["field", "value"], fields);
                    println!();
                    print_partitions(&v);
                }
            }
        }
        TopicCommand::Edit { name, options } => {
            let mut body = Map::new();
            options_body(options, &mut body)?;
            if body.is_empty() {
                return Err(usage("nothing to change: give at least one option"));
            }
            let r =
                c.send_json("PATCH", &format!("/v1/topics/{}", enc(&name)), &Value::Object(body))?;
            let t = r.expect(200, &format!("edit topic {name}"))?.value()?;
            print_topic(&c, &t);
        }
        TopicCommand::Rm { name } => {
            c.send("DELETE", &format!("/v1/topics/{}", enc(&name)), None)?
                .expect(204, &format!("delete topic {name}"))?;
            println!("topic {name} deleted");
        }
        TopicCommand::Attach { parent, child, delay } => {
            let delay_ms = delay.as_deref().map(parse_duration_ms).transpose()?.unwrap_or(0);
            let body = json!({ "child": child, "delay_ms": delay_ms });
            let r = c.send_json("POST", &format!("/v1/topics/{}/children", enc(&parent)), &body)?;
            let t = r.expect(200, &format!("attach {child} to {parent}"))?.value()?;
            print_topic(&c, &t);
        }
        TopicCommand::Detach { parent, child } => {
            let path = format!("/v1/topics/{}/children/{}", enc(&parent), enc(&child));
            c.send("DELETE", &path, None)?.expect(204, &format!("detach {child} from {parent}"))?;
            println!("{child} detached from {parent}");
        }
        TopicCommand::Children { parent } => {
            let v = c.get(&format!("/v1/topics/{}/children", enc(&parent)))?;
            let v = v.expect(200, &format!("children of {parent}"))?.value()?;
            match c.output {
                Output::Json => c.print_json(&v),
                Output::Table => {
                    let cols = ["name", "delay_ms", "lag_messages", "lag_seconds", "lag_complete"];
                    let rows = v["children"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|ch| cols.iter().map(|k| cell(&ch[*k])).collect())
                        .collect();
                    print_table(&cols, rows);
                }
            }
        }
    }
    Ok(())
}
