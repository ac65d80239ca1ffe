//! README.md and docs/GUIDE.md against the binary: every example command
//! parses as written, and every default they state (in a flag table or a
//! synopsis's `[--flag VALUE]`) is the one `--help` shows.

use clap::{CommandFactory, Parser};

use crate::Cli;

const README: &str = include_str!("../../../README.md");
const GUIDE: &str = include_str!("../../../docs/GUIDE.md");

/// The lines of README's and the guide's code blocks that start with `hover `.
fn hover_lines() -> Vec<&'static str> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in README.lines().chain(GUIDE.lines()) {
        if line.starts_with("```") {
            inside = !inside;
        } else if inside {
            if let Some(rest) = line.trim().strip_prefix("$ ").or(Some(line.trim())) {
                if rest.starts_with("hover ") {
                    out.push(rest);
                }
            }
        }
    }
    out
}

/// `line` split as a shell would (double quotes group; no escapes needed here).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

/// The subcommand `words` (after `hover`) name, as deep as they go.
fn subcommand(words: &[String]) -> clap::Command {
    let mut cmd = Cli::command();
    for w in words {
        match cmd.find_subcommand(w) {
            Some(sub) => cmd = sub.clone(),
            None => break,
        }
    }
    cmd
}

/// The default `--help` shows for `--long` of `cmd` (None: it has none).
fn default_of(cmd: &clap::Command, long: &str) -> Option<Option<String>> {
    let arg = cmd.get_arguments().find(|a| a.get_long() == Some(long))?;
    let d = arg.get_default_values();
    Some((!d.is_empty()).then(|| {
        d.iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(",")
    }))
}

#[test]
fn readme_examples_parse() {
    let mut checked = 0;
    for line in hover_lines() {
        // Synopses (`[...]`, `a|b`) are not commands.
        if line.contains('[') || line.contains('|') {
            continue;
        }
        let line = line.trim_end_matches('&').trim();
        let mut argv = vec!["hover".to_string()];
        argv.extend(words(line).into_iter().skip(1));
        if let Err(e) = Cli::try_parse_from(&argv) {
            panic!("README example does not parse: {line}\n{e}");
        }
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} examples found");
}

#[test]
fn readme_defaults_are_the_binarys() {
    let mut bad = Vec::new();
    let mut checked = 0;
    // Synopses: `[--flag VALUE]` where VALUE is a value, not a placeholder.
    for line in hover_lines() {
        let w = words(line);
        let cmd = subcommand(&w[1..]);
        for group in line.split('[').skip(1) {
            let inner = group.split(']').next().unwrap_or("");
            let mut parts = inner.split_whitespace();
            let (Some(flag), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            let Some(long) = flag.strip_prefix("--") else {
                continue;
            };
            let placeholder = value.chars().all(|c| c.is_ascii_uppercase() || c == '_');
            if placeholder || value.contains('|') {
                continue;
            }
            if let Some(Some(d)) = default_of(&cmd, long) {
                checked += 1;
                if d != value {
                    bad.push(format!(
                        "{line}: --{long} {value}, the binary's default is {d}"
                    ));
                }
            }
        }
    }
    // The flag tables of `hover run` (its guards included): | `--flag` | default | ...
    let run = subcommand(&["run".to_string()]);
    let section = GUIDE
        .split("## `hover run`")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/GUIDE.md's hover run section");
    for row in section.lines().filter(|l| l.starts_with("| `--")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let long = cells[1].trim_matches('`').trim_start_matches("--");
        let long = long.split_whitespace().next().unwrap_or(long);
        let said = cells[2]
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_matches('`');
        match default_of(&run, long) {
            None => bad.push(format!(
                "docs/GUIDE.md's run table has --{long}, which hover run lacks"
            )),
            Some(Some(d)) => {
                checked += 1;
                if d != said {
                    bad.push(format!(
                        "docs/GUIDE.md's run table: --{long} {said}, the binary's default is {d}"
                    ));
                }
            }
            Some(None) => {}
        }
    }
    assert!(checked >= 20, "only {checked} defaults found");
    assert!(
        bad.is_empty(),
        "README/docs/GUIDE.md and the binary disagree:\n{}",
        bad.join("\n")
    );
}

/// docs/GUIDE.md's synopses (a code block's `hover ...` line with `[`,
/// and the indented lines that continue it), each with the command it is
/// of (as deep as its words name subcommands) and its whole text.
fn synopses() -> Vec<(String, clap::Command, String)> {
    let mut inside = false;
    let mut out: Vec<(String, clap::Command, String)> = Vec::new();
    let mut open = false;
    for line in GUIDE.lines() {
        if line.starts_with("```") {
            inside = !inside;
            open = false;
            continue;
        }
        if !inside {
            continue;
        }
        if line.starts_with("hover ") && line.contains('[') {
            let mut cmd = Cli::command();
            let mut path = String::new();
            for w in words(line).iter().skip(1) {
                if let Some(sub) = cmd.find_subcommand(w) {
                    path = format!("{path} {w}");
                    cmd = sub.clone();
                }
            }
            out.push((path.trim().to_string(), cmd, line.to_string()));
            open = true;
        } else if open && line.starts_with(' ') {
            let last = out.last_mut().expect("a synopsis is open");
            last.2 = format!("{}\n{line}", last.2);
        } else {
            open = false;
        }
    }
    out
}

/// The flags `hover run` and its kin take to guard the host against a
/// guest (GUIDE's "host guards", a table of their own).
const HOST_GUARDS: [&str; 6] = [
    "guest-io-max",
    "guest-msi-max-delay",
    "guest-msi-max-pending",
    "guest-reports-max",
    "guest-log-max",
    "seccomp",
];

#[test]
fn every_flag_is_in_its_commands_synopsis() {
    let mut by_command: std::collections::BTreeMap<String, (clap::Command, String)> =
        std::collections::BTreeMap::new();
    for (path, cmd, text) in synopses() {
        let entry = by_command.entry(path).or_insert((cmd, String::new()));
        entry.1.push_str(&text);
        entry.1.push('\n');
    }
    for must in [
        "run",
        "restore",
        "receive",
        "firecracker",
        "bench migrate",
        "bench boost",
    ] {
        assert!(by_command.contains_key(must), "no synopsis of hover {must}");
    }
    let mut missing = Vec::new();
    for (path, (cmd, text)) in &by_command {
        for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            let Some(long) = arg.get_long() else { continue };
            if ["help", "version"].contains(&long)
                || (text.contains("[host guards]") && HOST_GUARDS.contains(&long))
            {
                continue;
            }
            let shown = text
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .any(|w| w == format!("--{long}"));
            if !shown {
                missing.push(format!("hover {path}: --{long}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/GUIDE.md's synopses lack flags the binary takes:\n{}",
        missing.join("\n")
    );
}
