//! README.md against the binary: the `narad serve` flag table lists every
//! flag `narad serve --help` has and no other, and the CLI's command table
//! every command and subcommand `narad --help` has and no other, so the
//! README cannot drift from what the binary takes.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

fn readme() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    std::fs::read_to_string(path).expect("README.md")
}

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_narad")).args(args).arg("--help").output().unwrap();
    assert!(
        out.status.success(),
        "narad {args:?} --help: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The long flags (`--name`) in `text`.
fn long_flags(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("--") {
        let name: String = rest[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        if !name.is_empty() {
            out.insert(format!("--{name}"));
        }
        rest = &rest[i + 2 + name.len()..];
    }
    out
}

/// The lines of README's table that starts with `header`.
fn table<'a>(readme: &'a str, header: &str) -> Vec<&'a str> {
    let start = readme.find(header).unwrap_or_else(|| panic!("README has no table {header:?}"));
    readme[start..].lines().skip(2).take_while(|l| l.starts_with('|')).collect()
}

/// The option lines of a `--help` text: each flag line's own flags, not
/// the ones its description mentions.
fn help_flags(help: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in help.lines().map(str::trim_start).filter(|l| l.starts_with('-')) {
        let flags = line.split("  ").next().unwrap_or("");
        out.extend(long_flags(flags));
    }
    out.remove("--help");
    out.remove("--version");
    out
}

#[test]
fn the_serve_flag_table_lists_exactly_the_flags_of_serve_help() {
    let help = help(&["serve"]);
    let want = help_flags(&help);
    assert!(want.contains("--peers") && want.contains("--config"), "parsed: {want:?}\n{help}");
    let readme = readme();
    let rows = table(&readme, "| Flag | Default | |");
    let listed: BTreeSet<String> =
        rows.iter().flat_map(|r| long_flags(r.split('|').nth(1).unwrap_or(""))).collect();
    let missing: Vec<&String> = want.difference(&listed).collect();
    let extra: Vec<&String> = listed.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "README's serve flags: missing {missing:?}, not in --help {extra:?}"
    );
}

/// The names in the `Commands:` section of a `--help` text (`help` left
/// out).
fn commands(help: &str) -> BTreeSet<String> {
    let Some(start) = help.find("Commands:\n") else { return BTreeSet::new() };
    help[start + "Commands:\n".len()..]
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_cli_table_lists_exactly_the_commands_of_help() {
    let mut want: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for c in commands(&help(&[])) {
        let subs = commands(&help(&[c.as_str()]));
        want.insert(c, subs);
    }
    assert!(want.contains_key("bench") && want["topic"].contains("info"), "parsed: {want:?}");
    let readme = readme();
    let mut listed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for row in table(&readme, "| Command | What it does |") {
        let first = row.split(" | ").next().unwrap_or("");
        // Each `narad CMD [a\|b\|c]` span of the first cell.
        for span in first.split('`').skip(1).step_by(2) {
            let mut words = span.split_whitespace();
            assert_eq!(words.next(), Some("narad"), "{row}");
            let cmd = words.next().unwrap_or_else(|| panic!("no command in {span:?}"));
            let subs = listed.entry(cmd.to_owned()).or_default();
            if let Some(alts) = words.next() {
                subs.extend(alts.split("\\|").map(str::to_owned));
            }
        }
    }
    assert_eq!(listed, want, "README's command table (left) against narad --help (right)");
}
