//! The `narad` command: one binary for the broker and its tools.
//!
//! Each subcommand lives in its own module; this file only parses the
//! command line and dispatches. Exit codes: 0 ok, 1 runtime failure, 2 usage
//! error (clap's own).

mod banner;
mod bench;
mod cli;
mod logging;
mod report;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc malloc: per-request allocations (bodies,
/// records, futures) cost ~10% of produce CPU with glibc (docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// narad: a durable, WAL-first message broker in one binary.
#[derive(Debug, Parser)]
#[command(name = "narad", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the broker (`narad serve --dev` for a single node on loopback).
    Serve(serve::ServeArgs),
    /// Server commands.
    #[command(subcommand)]
    Server(ServerCommand),
    /// Measure this machine: disk limits and narad's storage engines.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Topics: add, ls, info, edit, rm, attach, detach, children.
    Topic(cli::topic::TopicArgs),
    /// Publish a message (argument, --file or stdin).
    Pub(cli::msg::PubArgs),
    /// Consume and ack, printing messages (--peek: read-only live tail).
    Sub(cli::msg::SubArgs),
    /// Read a partition from an offset, without leasing.
    Replay(cli::msg::ReplayArgs),
    /// Users: add, grant, ls, rm, passwd.
    User(cli::user::UserArgs),
    /// Cluster: members, status.
    Cluster(cli::cluster::ClusterArgs),
    /// Named server + credential contexts: add, select, ls, rm.
    Ctx(cli::ctx::CtxArgs),
    /// Print the version.
    Version {
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = cli::Output::Table)]
        output: cli::Output,
    },
}

/// `narad server ...`.
#[derive(Debug, Subcommand)]
enum ServerCommand {
    /// Run the broker (same as `narad serve`).
    Start(serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(a) | Command::Server(ServerCommand::Start(a)) => serve::run_serve(a),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Topic(a) => return cli::finish(cli::topic::run(a)),
        Command::Pub(a) => return cli::finish(cli::msg::run_pub(a)),
        Command::Sub(a) => return cli::finish(cli::msg::run_sub(a)),
        Command::Replay(a) => return cli::finish(cli::msg::run_replay(a)),
        Command::User(a) => return cli::finish(cli::user::run(a)),
        Command::Cluster(a) => return cli::finish(cli::cluster::run(a)),
        Command::Ctx(a) => return cli::finish(cli::ctx::run(a)),
        Command::Version { output } => return cli::finish(cli::version(output)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("narad: {e}");
            ExitCode::from(1)
        }
    }
}
