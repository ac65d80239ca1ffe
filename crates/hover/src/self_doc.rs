//! The command line describing itself: shell completions, man pages and the
//! built-in guest's workload table. Each is generated from what the binary
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
