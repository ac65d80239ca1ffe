//! The command line describing itself: shell completions, man pages, the
//! Markdown reference (docs/CLI.md) and the built-in guest's workload table. Each is generated from what the binary
//! itself uses (clap's command tree, `hover_abi::workload`), so none can
//! drift from it.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use std::process::ExitCode;

use clap::Command;
use hover_abi::workload::{ParamKind, ParamSpec, DEFAULT_WORKLOAD, GLOBAL_PARAMS, WORKLOADS};
use hover_vmm::config::size_text as size;

/// `hover man`: hover(1) on stdout, or every page into `out`.
pub fn man(cmd: Command, out: Option<&Path>) -> ExitCode {
    let written = match out {
        None => man_page(cmd, &mut std::io::stdout()).map(|()| Vec::new()),
        Some(dir) => std::fs::create_dir_all(dir).and_then(|()| man_pages(cmd, dir)),
    };
    match written {
        Ok(pages) => {
            if let Some(dir) = out {
                eprintln!(
                    "hover: wrote {} man pages to {}",
                    pages.len(),
                    dir.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hover: error: cannot write the man pages: {e}");
            ExitCode::from(crate::EXIT_HOST_FAILURE)
        }
    }
}

/// Write `shell`'s completion script for `cmd` to `out`.
pub fn completions(shell: clap_complete::Shell, mut cmd: Command, out: &mut dyn Write) {
    let name = cmd.get_name().to_string();
    clap_complete::generate(shell, &mut cmd, name, out);
}

/// Write a man page for `cmd` and one for each of its subcommands (nested
/// ones too: `hover-ctl-migrate.1`) into `dir`; the paths written.
pub fn man_pages(cmd: Command, dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    write_pages(cmd, dir, &mut written)?;
    Ok(written)
}

fn write_pages(cmd: Command, dir: &Path, written: &mut Vec<PathBuf>) -> io::Result<()> {
    let path = dir.join(format!("{}.1", cmd.get_name()));
    let mut page = Vec::new();
    man_page(cmd.clone(), &mut page)?;
    std::fs::write(&path, page)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        // A subcommand's page is named after its whole path, as git's are.
        let name = format!("{}-{}", cmd.get_name(), sub.get_name());
        write_pages(sub.clone().name(name), dir, written)?;
    }
    Ok(())
}

/// Write `cmd`'s own man page (roff) to `out`.
pub fn man_page(cmd: Command, out: &mut dyn Write) -> io::Result<()> {
    clap_mangen::Man::new(cmd).render(out)
}

/// The command reference in Markdown (`hover man --markdown`, checked
/// into docs/CLI.md): for every subcommand, nested ones too, what it does
/// and a table of its arguments with their defaults and help.
pub fn markdown(cmd: Command) -> String {
    let mut out = String::from(
        "# The command line\n\n\
         Generated from the binary (`hover man --markdown > docs/CLI.md`; a test\n\
         fails when this file and `--help` differ). `hover help SUBCOMMAND` and\n\
         `hover SUBCOMMAND --help` say the same; docs/GUIDE.md walks through\n\
         the commands with examples.\n",
    );
    let mut cmd = cmd;
    // Built: value counts and subcommands' names as `--help` shows them.
    cmd.build();
    let name = cmd.get_name().to_string();
    markdown_command(&cmd, &name, &mut out);
    out
}

fn markdown_command(cmd: &Command, path: &str, out: &mut String) {
    let about = cmd
        .get_long_about()
        .or(cmd.get_about())
        .map(|a| a.to_string())
        .unwrap_or_default();
    if !out.ends_with("\n\n") {
        out.push('\n');
    }
    out.push_str(&format!("## `{path}`\n\n"));
    if !about.is_empty() {
        out.push_str(&format!("{}\n\n", about.trim()));
    }
    let args: Vec<_> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    if !args.is_empty() {
        out.push_str("| argument | default | what it does |\n|---|---|---|\n");
        for a in args {
            out.push_str(&markdown_arg(a));
        }
    }
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" || sub.is_hide_set() {
            continue;
        }
        markdown_command(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

/// One argument's row: its flag and value, default, help and values.
fn markdown_arg(a: &clap::Arg) -> String {
    let value = a
        .get_value_names()
        .map(|v| {
            v.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| a.get_id().to_string().to_uppercase());
    let takes_value = a.get_num_args().is_some_and(|n| n.takes_values());
    let name = match (a.get_long(), a.get_short()) {
        (Some(l), _) if takes_value => format!("`--{l} {value}`"),
        (Some(l), _) => format!("`--{l}`"),
        (None, Some(c)) => format!("`-{c}`"),
        (None, None) => format!("`{value}`"),
    };
    let default = a
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(",");
    let mut help = a
        .get_long_help()
        .or(a.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let values: Vec<String> = a
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect();
    if !values.is_empty() && takes_value {
        help.push_str(&format!(" (one of: {})", values.join(", ")));
    }
    let cell = |t: &str| {
        t.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace('|', "\\|")
    };
    let default = match default.is_empty() {
        true => String::new(),
        false => format!("`{}`", cell(&default)),
    };
    format!("| {name} | {default} | {} |\n", cell(&help))
}

/// The workload table: each workload with what it does, then its
/// parameters (accepted values, default, meaning), then the parameters
/// every workload takes.
pub fn workloads() -> String {
    let mut s = String::from(
        "The built-in guest's workloads (hover run --cmdline \"workload=NAME KEY=VALUE ...\"):\n",
    );
    for w in WORKLOADS {
        s += &format!("\n{}\n    {}\n", w.name, w.help);
        for p in w.params {
            s += &param_line(p);
        }
    }
    s += "\nParameters every workload takes:\n";
    for p in GLOBAL_PARAMS {
        s += &param_line(p);
    }
    s
}

fn param_line(p: &ParamSpec) -> String {
    let (accepts, default) = match p.kind {
        ParamKind::Number { min, max, default } => (format!("{min}-{max}"), default.to_string()),
        ParamKind::Size { min, max, default } => {
            (format!("{}-{}", size(min), size(max)), size(default))
        }
        // `workload` itself: its values are the table's names.
        ParamKind::Choice { values: [] } if p.name == "workload" => {
            ("a name above".into(), DEFAULT_WORKLOAD.into())
        }
        ParamKind::Choice { values: [] } => ("text".into(), "none".into()),
        ParamKind::Choice { values } => (values.join("|"), values[0].to_string()),
    };
    format!(
        "    {:<18} {:<22} default {:<8} {}\n",
        p.name, accepts, default, p.help
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/CLI.md is what the binary generates; `HOVER_BLESS=1` rewrites it.
    #[test]
    fn docs_cli_md_is_the_binarys_own_reference() {
        use clap::CommandFactory;
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/CLI.md");
        let want = markdown(crate::Cli::command());
        if std::env::var_os("HOVER_BLESS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "docs/CLI.md differs from the binary's flags: regenerate it with `cargo run -p hover -- man --markdown > docs/CLI.md` (or HOVER_BLESS=1 cargo test -p hover docs_cli_md)"
        );
        for sub in [
            "run",
            "restore",
            "receive",
            "ctl migrate",
            "bench boost",
            "firecracker",
        ] {
            assert!(want.contains(&format!("\n## `hover {sub}`\n")), "{sub}");
        }
        assert!(want.contains("| `--boost-irq-us BOOST_IRQ_US` | `1000` |"));
    }

    #[test]
    fn the_table_lists_every_workload_and_parameter_with_its_default() {
        let t = workloads();
        for w in WORKLOADS {
            assert!(t.contains(&format!("\n{}\n", w.name)), "{}", w.name);
            for p in w.params.iter().chain(GLOBAL_PARAMS) {
                assert!(t.contains(&format!("    {:<18} ", p.name)), "{}", p.name);
            }
        }
        assert!(t.contains("default"));
    }
}
