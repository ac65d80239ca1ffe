//! `hover firecracker`: Firecracker's command line and API
//! (docs/FIRECRACKER.md), also run when the binary is invoked as
//! `firecracker` (a symlink), for tools that exec that name.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use hover_vmm::config::{GuestLimits, HostConfig, PageStore, SeccompMode};
use hover_vmm::firecracker::{self, models, Ended, FirecrackerError, Options};

use crate::host_args::{parse_console, HostFileArgs};
use crate::{EXIT_BAD_INPUT, EXIT_HOST_FAILURE};

/// Firecracker's flags (and a few of Hover's).
#[derive(Args)]
#[command(disable_version_flag = true)]
pub(crate) struct FirecrackerArgs {
    /// The Unix socket to serve Firecracker's API on (and Hover's own
    /// `/vm/*` endpoints once the VM runs).
    #[arg(long, default_value = "/run/firecracker.socket")]
    api_sock: PathBuf,
    /// The microVM's id (`GET /`).
    #[arg(long, default_value = "anonymous-instance")]
    id: String,
    /// Install no seccomp filters (Hover's `--seccomp off`).
    #[arg(long)]
    no_seccomp: bool,
    /// A Firecracker BPF filter file: refused (Hover installs its own
    /// filter per thread kind; use the default or --no-seccomp).
    #[arg(long, value_name = "FILE")]
    seccomp_filter: Option<PathBuf>,
    /// A Firecracker JSON configuration (`boot-source`, `machine-config`,
    /// `logger`, `metrics`): the VM starts at once, without waiting for
    /// `InstanceStart`.
    #[arg(long, value_name = "FILE")]
    config_file: Option<PathBuf>,
    /// Serve no API (needs --config-file).
    #[arg(long, requires = "config_file")]
    no_api: bool,
    /// Log to this file (appended; created if missing) instead of stderr.
    #[arg(long, value_name = "PATH")]
    log_path: Option<PathBuf>,
    /// The log level: Error, Warning (default), Info, Debug, Trace, Off.
    #[arg(long)]
    level: Option<String>,
    /// Show each log line's level.
    #[arg(long)]
    show_level: bool,
    /// Show each log line's origin (module).
    #[arg(long)]
    show_log_origin: bool,
    /// Write Firecracker-style metrics lines to this file on `FlushMetrics`
    /// and when the VM ends.
    #[arg(long, value_name = "PATH")]
    metrics_path: Option<PathBuf>,
    /// Print the guest's boot times when the VM ends (Firecracker logs the
    /// time to the guest's boot-timer write; Hover's guest reports its
    /// first instruction itself).
    #[arg(long)]
    boot_timer: bool,
    /// Print Hover's version and the Firecracker API version it answers.
    #[arg(long)]
    version: bool,
    /// Where the guest console goes: stdout, stderr, off or file:PATH.
    #[arg(long, default_value = "stdout", value_parser = parse_console)]
    console: hover_vmm::config::ConsoleTarget,
    /// Print the outcome as JSON on stdout when the VM ends (give
    /// --console stderr or a file with it).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    files: HostFileArgs,
}

/// The `--version` line: Hover's name first; never Firecracker's.
pub(crate) fn version_line() -> String {
    format!(
        "Hover {} (answers the Firecracker API {}; it is not Firecracker)",
        env!("CARGO_PKG_VERSION"),
        models::API_VERSION
    )
}

/// Run `hover firecracker`.
pub(crate) fn firecracker(args: FirecrackerArgs) -> ExitCode {
    if args.version {
        println!("{}", version_line());
        return ExitCode::SUCCESS;
    }
    let bad = |msg: String| {
        eprintln!("hover: error: {msg}");
        ExitCode::from(EXIT_BAD_INPUT)
    };
    if let Some(f) = &args.seccomp_filter {
        return bad(format!(
            "--seccomp-filter {}: Hover does not load Firecracker BPF filters; it installs its own filter on each kind of thread (docs/RELIABILITY.md): omit the flag, or give --no-seccomp",
            f.display()
        ));
    }
    if args.files.names_a_page_store() {
        return bad("--page-store, --page-store-latency and --page-store-jitter need a memory budget, which the Firecracker API does not set".into());
    }
    if args.log_path.is_none() && (args.level.is_some() || args.show_level || args.show_log_origin)
    {
        if let Err(e) = crate::logging::set_stderr_level(
            args.level.as_deref(),
            args.show_level,
            args.show_log_origin,
        ) {
            return bad(format!("--level: {e}"));
        }
    }
    let config_file = match &args.config_file {
        None => None,
        // A few KiB of JSON: a megabyte is ample, and /dev/zero is refused.
        Some(p) => match hover_vmm::host::files::read_input(p, 1 << 20) {
            Err(e) => return bad(format!("--config-file {}: {e}", p.display())),
            Ok(bytes) => match serde_json::from_slice::<models::FullVmConfiguration>(&bytes) {
                Ok(c) => Some(c),
                Err(e) => return bad(format!("--config-file {}: {e}", p.display())),
            },
        },
    };
    let opts = Options {
        api_sock: (!args.no_api).then(|| args.api_sock.clone()),
        id: args.id,
        config_file,
        host: HostConfig {
            console: args.console,
            page_store: PageStore::default(),
            io_file: args.files.io_file,
            limits: GuestLimits::default(),
            seccomp: if args.no_seccomp {
                SeccompMode::Off
            } else {
                SeccompMode::On
            },
            migration_key: args.files.migration_key,
            boost_tuning: Default::default(),
            disk_paths: Vec::new(),
            taps: Vec::new(),
            named_disks: Vec::new(),
            named_taps: Vec::new(),
        },
        logger: args.log_path.map(|p| models::Logger {
            log_path: p.display().to_string(),
            level: args.level,
            show_level: args.show_level,
            show_log_origin: args.show_log_origin,
            module: None,
        }),
        metrics_path: args.metrics_path,
        set_logger: Box::new(crate::logging::set_firecracker_logger),
    };
    match firecracker::serve(opts) {
        Ok(Ended::Ran(outcome)) => {
            if args.boot_timer {
                let t = &outcome.timings;
                let us = |v: Option<u64>| v.map_or("-".into(), |v| format!("{v} us"));
                eprintln!(
                    "hover: boot timer: setup {} us, guest's first instruction {}, first console byte {}",
                    t.setup_us,
                    us(t.first_instruction_us),
                    us(t.first_console_byte_us)
                );
            }
            crate::finish(Ok(*outcome), args.json, false)
        }
        Ok(Ended::Signal(sig)) => {
            eprintln!(
                "hover: {}: ended before a microVM was started",
                hover_vmm::signals::name(sig)
            );
            ExitCode::from(hover_vmm::signals::exit_status(sig))
        }
        Err(FirecrackerError::Vm(e)) => crate::fail(&e),
        Err(e) => {
            eprintln!("hover: error: {e}");
            ExitCode::from(if e.is_bad_input() {
                EXIT_BAD_INPUT
            } else {
                EXIT_HOST_FAILURE
            })
        }
    }
}
