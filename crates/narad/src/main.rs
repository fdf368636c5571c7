//! The `narad` command: one binary for the broker and its tools.
//!
//! Each subcommand lives in its own module; this file only parses the
//! command line and dispatches. Exit codes: 0 ok, 1 runtime failure, 2 usage
//! error (clap's own).

mod bench;
mod report;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("narad: {e}");
            ExitCode::from(1)
        }
    }
}
