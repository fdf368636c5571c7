//! `narad user add|grant|ls|rm|passwd`. Grants are written
//! `action:pattern[,pattern]` (`produce:orders*`, `consume:a,b`, `admin`).

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::{CliError, CliResult, Client, Conn, Output, cell, enc, print_table, usage};

/// `narad user ...`.
#[derive(Debug, Args)]
pub struct UserArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    cmd: UserCommand,
}

#[derive(Debug, Subcommand)]
enum UserCommand {
    /// Create a user.
    Add {
        /// The username.
        name: String,
        /// The new user's password (else read from stdin).
        #[arg(long)]
        new_password: Option<String>,
        /// A grant, `action:pattern[,pattern]` (repeatable).
        #[arg(short = 'g', long = "grant")]
        grants: Vec<String>,
    },
    /// Replace a user's grants.
    Grant {
        /// The username.
        name: String,
        /// A grant, `action:pattern[,pattern]` (repeatable; none = no grants).
        #[arg(short = 'g', long = "grant")]
        grants: Vec<String>,
    },
    /// List users.
    Ls,
    /// Delete a user.
    Rm {
        /// The username.
        name: String,
    },
    /// Change a password (yours needs --current-password).
    Passwd {
        /// The username.
        name: String,
        /// The new password (else read from stdin).
        #[arg(long)]
        new_password: Option<String>,
        /// Your current password, when changing your own.
        #[arg(long)]
        current_password: Option<String>,
    },
}

/// Parses `action:pattern[,pattern]` (or a bare `admin`).
pub fn parse_grant(s: &str) -> Result<Value, CliError> {
    let (action, patterns) = match s.split_once(':') {
        Some((a, p)) => (a, p.split(',').filter(|p| !p.is_empty()).collect::<Vec<_>>()),
        None => (s, Vec::new()),
    };
    if !matches!(action, "produce" | "consume" | "create" | "admin") {
        return Err(usage(format!(
            "invalid grant {s:?}: the action is produce, consume, create or admin"
        )));
    }
    Ok(if patterns.is_empty() {
        json!({ "action": action })
    } else {
        json!({ "action": action, "patterns": patterns })
    })
}

fn grants_of(list: &[String]) -> Result<Vec<Value>, CliError> {
    list.iter().map(|g| parse_grant(g)).collect()
}

fn grants_text(u: &Value) -> String {
    u["grants"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            let pats: Vec<String> =
                g["patterns"].as_array().into_iter().flatten().map(cell).collect();
            if pats.is_empty() {
                cell(&g["action"])
            } else {
                format!("{}:{}", cell(&g["action"]), pats.join(","))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn password_or_stdin(p: Option<String>) -> Result<String, CliError> {
    let p = match p {
        Some(p) => p,
        None => {
            let raw = super::read_stdin()?;
            String::from_utf8(raw)
                .map_err(|_| usage("the password on stdin is not UTF-8"))?
                .trim_end_matches(['\r', '\n'])
                .to_owned()
        }
    };
    if p.is_empty() {
        return Err(usage("password required"));
    }
    Ok(p)
}

fn print_users(c: &Client, users: &[Value]) {
    match c.output {
        Output::Json => c.print_json(&Value::Array(users.to_vec())),
        Output::Table => {
            let rows = users
                .iter()
                .map(|u| {
                    let root = if u["root"] == true { "yes" } else { "" };
                    vec![cell(&u["username"]), grants_text(u), root.to_owned()]
                })
                .collect();
            print_table(&["username", "grants", "root"], rows);
        }
    }
}

/// Runs `narad user`.
pub fn run(a: UserArgs) -> CliResult {
    let c = Client::new(&a.conn)?;
    match a.cmd {
        UserCommand::Add { name, new_password, grants } => {
            let grants = grants_of(&grants)?;
            let password = password_or_stdin(new_password)?;
            let body = json!({ "username": name, "password": password, "grants": grants });
            let u = c.send_json("POST", "/v1/users", &body)?;
            let u = u.expect(201, &format!("add user {name}"))?.value()?;
            print_users(&c, &[u]);
        }
        UserCommand::Grant { name, grants } => {
            let body = json!({ "grants": grants_of(&grants)? });
            let u = c.send_json("PUT", &format!("/v1/users/{}/grants", enc(&name)), &body)?;
            let u = u.expect(200, &format!("grant {name}"))?.value()?;
            print_users(&c, &[u]);
        }
        UserCommand::Ls => {
            let v = c.get("/v1/users")?.expect(200, "list users")?.value()?;
            print_users(&c, v.as_array().map_or(&[][..], Vec::as_slice));
        }
        UserCommand::Rm { name } => {
            c.send("DELETE", &format!("/v1/users/{}", enc(&name)), None)?
                .expect(204, &format!("delete user {name}"))?;
            println!("user {name} deleted");
        }
        UserCommand::Passwd { name, new_password, current_password } => {
            let new_password = password_or_stdin(new_password)?;
            let body = json!({
                "current_password": current_password.unwrap_or_default(),
                "new_password": new_password,
            });
            let r = c.send_json("PUT", &format!("/v1/users/{}/password", enc(&name)), &body)?;
            if !matches!(r.status, 200 | 204) {
                return Err(r.error(&format!("change the password of {name}")));
            }
            println!("password of {name} changed");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_parse_from_the_short_form() {
        assert_eq!(
            parse_grant("produce:orders*,logs").unwrap(),
            json!({"action":"produce","patterns":["orders*","logs"]})
        );
        assert_eq!(parse_grant("admin").unwrap(), json!({"action":"admin"}));
        assert!(parse_grant("read:x").is_err());
    }
}
