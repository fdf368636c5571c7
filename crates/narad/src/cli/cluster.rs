//! `narad cluster members|status|moves|move|rebalance|drain|undrain`: the
//! members the server's metastore knows, the server's view of the control
//! plane (leader, term, its role), the partition moves in flight, the
//! rebalance planner's moves (a dry run), and decommission (drain) of a
//! member or its cancel (undrain).

use clap::{Args, Subcommand};
use serde_json::Value;

use super::{CliResult, Client, Conn, Output, cell, enc, print_table};

/// `narad cluster ...`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    cmd: ClusterCommand,
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// List the cluster's members: id, address, status, draining, owned
    /// partitions, partition moves out of it in progress.
    Members,
    /// This server's view of the control plane: mode, leader, term, role,
    /// indices, voters.
    Status,
    /// The partition moves the rebalance planner would start now, so that
    /// every alive member holds an even share (partitions of dead members
    /// stay). Only a dry run: nothing moves.
    Rebalance {
        /// Show the plan without moving anything (the only mode so far).
        #[arg(long, required = true)]
        dry_run: bool,
    },
    /// The partition moves in flight: topic, partition, from, to.
    Moves,
    /// Move one partition to a member by hand (admin): the member copies
    /// it from its owner, then the ownership flips; `moves` shows it until
    /// then.
    Move {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The member to move it to.
        to: String,
    },
    /// Decommission a member: it gets no new partitions and its partitions
    /// are planned away (admin). `decommission` is the same command.
    #[command(alias = "decommission")]
    Drain {
        /// The member's node id.
        id: String,
        /// Cancel the decommission instead (as `undrain`).
        #[arg(long)]
        cancel: bool,
    },
    /// Cancel a member's decommission: it receives partitions again
    /// (admin). Moves already finished stay where they went.
    Undrain {
        /// The member's node id.
        id: String,
    },
    /// Remove a member that is gone for good (its disk is lost; admin):
    /// its partitions get new owners with empty logs that start above the
    /// offsets the cluster saw, and it leaves the Raft group. The records
    /// it held that nobody consumed are lost: without --force this prints
    /// what would be lost and fails.
    Remove {
        /// The member's node id (it must be marked dead).
        id: String,
        /// Remove it, losing what it held.
        #[arg(long)]
        force: bool,
    },
}

/// Fills in the progress of every move the answering node is not the
/// destination of, from the destination's own `GET /v1/cluster/moves`
/// (left `null` where it does not answer).
fn with_progress(c: &Client, mut v: Value) -> Value {
    let Some(moves) = v["moves"].as_array_mut() else { return v };
    if moves.iter().all(|m| !m["progress"].is_null()) {
        return v;
    }
    let members = c
        .get("/v1/cluster/members")
        .and_then(|r| r.expect(200, "cluster members"))
        .and_then(|r| r.value())
        .unwrap_or(Value::Null);
    let addr_of = |id: &str| {
        members["members"].as_array()?.iter().find(|m| m["id"] == id)?["addr"]
            .as_str()
            .map(str::to_owned)
    };
    let mut asked: std::collections::BTreeMap<String, Value> = Default::default();
    for m in moves.iter_mut().filter(|m| m["progress"].is_null()) {
        let Some(to) = m["to"].as_str().map(str::to_owned) else { continue };
        let theirs = asked.entry(to.clone()).or_insert_with(|| {
            addr_of(&to)
                .and_then(|addr| c.at(&addr).get("/v1/cluster/moves").ok())
                .and_then(|r| r.expect(200, "cluster moves").ok())
                .and_then(|r| r.value().ok())
                .unwrap_or(Value::Null)
        });
        if let Some(p) = theirs["moves"].as_array().into_iter().flatten().find(|t| {
            t["topic"] == m["topic"] && t["partition"] == m["partition"] && t["from"] == m["from"]
        }) {
            m["progress"] = p["progress"].clone();
        }
    }
    v
}

fn print_moves(c: &Client, v: &Value) {
    if c.output == Output::Json {
        c.print_json(v);
        return;
    }
    let mib = |b: &Value| b.as_u64().map(|b| format!("{:.1}", b as f64 / (1 << 20) as f64));
    let rows: Vec<Vec<String>> = v["moves"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let p = &m["progress"];
            let dash = || "-".to_owned();
            vec![
                cell(&m["topic"]),
                cell(&m["partition"]),
                cell(&m["from"]),
                cell(&m["to"]),
                p["phase"].as_str().map(str::to_owned).unwrap_or_else(dash),
                p["rounds"].as_u64().map(|r| r.to_string()).unwrap_or_else(dash),
                match (mib(&p["bytes_copied"]), mib(&p["bytes_total"])) {
                    (Some(a), Some(b)) => format!("{a}/{b} MiB"),
                    _ => dash(),
                },
                p["age_ms"]
                    .as_u64()
                    .map(|ms| format!("{:.1}s", ms as f64 / 1000.0))
                    .unwrap_or_else(dash),
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("no moves in flight");
    } else {
        print_table(
            &["topic", "partition", "from", "to", "phase", "rounds", "copied", "age"],
            rows,
        );
    }
}

fn remove(c: &Client, id: &str, force: bool) -> CliResult {
    let path = format!("/v1/cluster/members/{}{}", enc(id), if force { "?force=true" } else { "" });
    let v = c.send("DELETE", &path, None)?.expect(200, "remove")?.value()?;
    println!(
        "{id} is removed; its partitions have new owners (records it held that nobody consumed are lost):"
    );
    let rows: Vec<Vec<String>> = v["partitions"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    ["topic", "partition", "owner", "seen_next_offset", "start_offset"]
                        .iter()
                        .map(|k| cell(&p[*k]))
                        .collect()
                })
                .collect()
        })
        .unwrap_or_default();
    print_table(&["topic", "partition", "owner", "seen", "start"], rows);
    Ok(())
}

fn set_draining(c: &Client, id: &str, draining: bool) -> CliResult {
    let path = format!("/v1/cluster/members/{}/decommission", enc(id));
    let (method, what) = if draining { ("POST", "drain") } else { ("DELETE", "undrain") };
    c.send(method, &path, None)?.expect(204, what)?;
    if draining {
        println!(
            "{id} is draining: it gets no new partitions, and the rebalance plan takes its partitions away"
        );
    } else {
        println!("{id} is no longer draining");
    }
    Ok(())
}

/// `v["moves"]` as a topic/partition/from/to table, or `empty` when there
/// are none (the plan and the moves in flight print alike).
fn print_moves_table(v: &Value, empty: &str) {
    let rows: Vec<Vec<String>> = v["moves"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| vec![cell(&m["topic"]), cell(&m["partition"]), cell(&m["from"]), cell(&m["to"])])
        .collect();
    if rows.is_empty() {
        println!("{empty}");
    } else {
        print_table(&["topic", "partition", "from", "to"], rows);
    }
}

fn print_plan(c: &Client, v: &Value) {
    if c.output == Output::Json {
        c.print_json(v);
        return;
    }
    print_moves_table(v, "balanced: nothing to move");
    println!(
        "receivers {}; {} moves in flight (at most {}); {} partitions of dead members stay",
        names(&v["receivers"]),
        cell(&v["in_flight"]),
        cell(&v["max_in_flight"]),
        cell(&v["unplannable_partitions"])
    );
}

fn print_members(c: &Client, v: &Value) {
    if c.output == Output::Json {
        c.print_json(v);
        return;
    }
    let rows = v["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let draining = if m["draining"] == true { "yes" } else { "no" };
            vec![
                cell(&m["id"]),
                cell(&m["addr"]),
                cell(&m["status"]),
                draining.to_owned(),
                cell(&m["owned_partitions"]),
                cell(&m["outbound_moves"]),
            ]
        })
        .collect();
    print_table(&["id", "addr", "status", "draining", "owned_partitions", "outbound_moves"], rows);
}

fn names(v: &Value) -> String {
    v.as_array().into_iter().flatten().map(cell).collect::<Vec<_>>().join(",")
}

fn print_status(c: &Client, v: &Value) {
    if c.output == Output::Json {
        c.print_json(v);
        return;
    }
    let leader = match &v["leader"] {
        Value::Null => "(none known)".to_owned(),
        other => cell(other),
    };
    let lines = [
        ("node", cell(&v["node_id"])),
        ("mode", cell(&v["mode"])),
        (
            "role",
            match &v["stopped"] {
                Value::String(why) => format!("stopped: {why}"),
                _ => cell(&v["role"]),
            },
        ),
        ("leader", leader),
        ("term", cell(&v["term"])),
        ("commit_index", cell(&v["commit_index"])),
        ("applied_index", cell(&v["applied_index"])),
        ("voters", names(&v["voters"])),
        ("learners", names(&v["learners"])),
    ];
    for (k, val) in lines {
        println!("{k:<14}{val}");
    }
}

/// Runs `narad cluster`.
pub fn run(a: ClusterArgs) -> CliResult {
    let c = Client::new(&a.conn)?;
    match a.cmd {
        ClusterCommand::Members => {
            let v = c.get("/v1/cluster/members")?.expect(200, "cluster members")?.value()?;
            print_members(&c, &v);
        }
        ClusterCommand::Status => {
            let v = c.get("/v1/cluster/status")?.expect(200, "cluster status")?.value()?;
            print_status(&c, &v);
        }
        ClusterCommand::Rebalance { dry_run: _ } => {
            let v = c.get("/v1/cluster/rebalance")?.expect(200, "rebalance plan")?.value()?;
            print_plan(&c, &v);
        }
        ClusterCommand::Moves => {
            let v = c.get("/v1/cluster/moves")?.expect(200, "cluster moves")?.value()?;
            print_moves(&c, &with_progress(&c, v));
        }
        ClusterCommand::Move { topic, partition, to } => {
            let body = serde_json::json!({"topic": topic, "partition": partition, "to": to});
            let v =
                c.send_json("POST", "/v1/cluster/moves", &body)?.expect(202, "move")?.value()?;
            println!(
                "moving {}/{} from {} to {}: `narad cluster moves` shows it until the owner flips",
                cell(&v["topic"]),
                cell(&v["partition"]),
                cell(&v["from"]),
                cell(&v["to"])
            );
        }
        ClusterCommand::Drain { id, cancel } => set_draining(&c, &id, !cancel)?,
        ClusterCommand::Undrain { id } => set_draining(&c, &id, false)?,
        ClusterCommand::Remove { id, force } => remove(&c, &id, force)?,
    }
    Ok(())
}
