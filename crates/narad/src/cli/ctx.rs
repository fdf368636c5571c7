//! `narad ctx add|select|ls|rm`: named server + credential contexts.
//!
//! They live in `contexts.json` in the user's config directory
//! (`$NARAD_CONFIG_DIR`, else `$XDG_CONFIG_HOME/narad`, else
//! `~/.config/narad`). The file holds passwords, so it is written with
//! mode 0600 (to a temporary file, then renamed into place).

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};

use super::{CliResult, Conn, Output, cell, failed, print_table, usage};
use crate::cli::CliError;

/// One context.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    /// Server URL.
    pub server: String,
    /// Username.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// CA bundle to trust.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<PathBuf>,
}

/// The contexts file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contexts {
    /// The selected context ("" = none).
    #[serde(default)]
    pub current: String,
    /// Contexts by name.
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
}

/// The directory of the contexts file.
pub fn config_dir() -> Result<PathBuf, CliError> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = var("NARAD_CONFIG_DIR") {
        return Ok(d);
    }
    if let Some(d) = var("XDG_CONFIG_HOME") {
        return Ok(d.join("narad"));
    }
    var("HOME")
        .map(|h| h.join(".config").join("narad"))
        .ok_or_else(|| usage("no config directory: set NARAD_CONFIG_DIR or HOME"))
}

fn path() -> Result<PathBuf, CliError> {
    Ok(config_dir()?.join("contexts.json"))
}

/// Reads the contexts file (none yet = empty).
pub fn load() -> Result<Contexts, CliError> {
    let p = path()?;
    match std::fs::read(&p) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| usage(format!("{} is not a contexts file: {e}", p.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Contexts::default()),
        Err(e) => Err(usage(format!("cannot read {}: {e}", p.display()))),
    }
}

fn save(c: &Contexts) -> CliResult {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let p = path()?;
    let dir = p.parent().expect("the file is in a directory");
    let err = |e: std::io::Error| failed(format!("cannot write {}: {e}", p.display()));
    std::fs::create_dir_all(dir).map_err(err)?;
    let tmp = dir.join(".contexts.json.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    let mut text = serde_json::to_vec_pretty(c).expect("contexts serialize");
    text.push(b'\n');
    f.write_all(&text).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, &p).map_err(err)
}

/// Fills what flags and environment left open from the context named by
/// `--context`, else the selected one.
pub fn fill_from_context(conn: &mut Conn) -> CliResult {
    let all = load()?;
    let name = conn.context.clone().unwrap_or_else(|| all.current.clone());
    if name.is_empty() {
        return Ok(());
    }
    let Some(c) = all.contexts.get(&name) else {
        return if conn.context.is_some() {
            Err(usage(format!("no context named {name:?} (see narad ctx ls)")))
        } else {
            Ok(())
        };
    };
    conn.server.get_or_insert_with(|| c.server.clone());
    if conn.user.is_none() {
        conn.user = c.user.clone();
        if conn.password.is_none() {
            conn.password = c.password.clone();
        }
    }
    if conn.ca_cert.is_none() {
        conn.ca_cert = c.ca_cert.clone();
    }
    Ok(())
}

/// `narad ctx ...`.
#[derive(Debug, Args)]
pub struct CtxArgs {
    #[command(subcommand)]
    cmd: CtxCommand,
    /// Output format of `ls`.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Debug, Subcommand)]
enum CtxCommand {
    /// Add (or replace) a context and select it.
    Add {
        /// The context's name.
        name: String,
        /// Server URL or host:port.
        #[arg(short = 's', long)]
        server: String,
        /// Username.
        #[arg(short = 'u', long)]
        user: Option<String>,
        /// Password.
        #[arg(short = 'p', long)]
        password: Option<String>,
        /// PEM CA bundle to trust.
        #[arg(long)]
        ca_cert: Option<PathBuf>,
    },
    /// Select the context later commands use.
    Select {
        /// The context's name.
        name: String,
    },
    /// List the contexts (passwords are not shown).
    Ls,
    /// Remove a context.
    Rm {
        /// The context's name.
        name: String,
    },
}

/// Runs `narad ctx`.
pub fn run(a: CtxArgs) -> CliResult {
    let mut all = load()?;
    match a.cmd {
        CtxCommand::Add { name, server, user, password, ca_cert } => {
            if name.is_empty() {
                return Err(usage("context name required"));
            }
            let server = if server.contains("://") { server } else { format!("http://{server}") };
            let ca_cert = ca_cert.map(|p| std::path::absolute(&p).unwrap_or(p));
            all.contexts.insert(name.clone(), Context { server, user, password, ca_cert });
            all.current = name.clone();
            save(&all)?;
            println!("context {name:?} added and selected");
        }
        CtxCommand::Select { name } => {
            if !all.contexts.contains_key(&name) {
                return Err(usage(format!("no context named {name:?} (see narad ctx ls)")));
            }
            all.current = name.clone();
            save(&all)?;
            println!("context {name:?} selected");
        }
        CtxCommand::Ls => match a.output {
            Output::Json => {
                let list: Vec<_> = all
                    .contexts
                    .iter()
                    .map(|(n, c)| {
                        serde_json::json!({
                            "name": n, "server": c.server, "user": c.user,
                            "current": *n == all.current,
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list).expect("json"));
            }
            Output::Table => {
                let rows = all
                    .contexts
                    .iter()
                    .map(|(n, c)| {
                        let mark = if *n == all.current { "*" } else { "" };
                        vec![
                            mark.to_owned(),
                            n.clone(),
                            c.server.clone(),
                            cell(&c.user.clone().into()),
                        ]
                    })
                    .collect();
                print_table(&["", "name", "server", "user"], rows);
            }
        },
        CtxCommand::Rm { name } => {
            if all.contexts.remove(&name).is_none() {
                return Err(usage(format!("no context named {name:?}")));
            }
            if all.current == name {
                all.current.clear();
            }
            save(&all)?;
            println!("context {name:?} removed");
        }
    }
    Ok(())
}
