//! `hover`: the command line of the Hover VMM.
//!
//! Exit status: the guest's exit code when it powers off (the built-in guest
//! uses 0 for success and 16 and above for its own failures); 2 for bad input
//! (flags, configuration, guest image); 3 when the guest crashes; 1 for any
//! other failure of the host.

// Functions that fit on a screen: at most 120 lines (clippy.toml).
#![warn(clippy::too_many_lines)]

mod bench;
mod ctl;
mod firecracker;
mod host_args;
mod logging;
mod output;
mod parse;
#[cfg(test)]
mod readme_check;
mod run_args;
mod self_doc;

use run_args::RunArgs;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use ctl::{CtlAction, CtlArgs};
use host_args::{host_config, BoostHostArgs, GuardArgs, HostFileArgs, RunOutput};
use hover_vmm::config::VmConfig;
use hover_vmm::{Error, MemoryRestore, ReceiveOptions, RestoreOptions, Vm};

/// Exit status for bad input.
pub(crate) const EXIT_BAD_INPUT: u8 = 2;
/// Exit status when the guest crashed.
const EXIT_GUEST_CRASH: u8 = 3;
/// Exit status for a host-side failure.
pub(crate) const EXIT_HOST_FAILURE: u8 = 1;

#[derive(Parser)]
#[command(
    name = "hover",
    version,
    about = "A KVM virtual machine monitor that keeps guests fast when their host is short of memory, busy, or moving them."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Boot a VM and run it until the guest powers off.
    Run(RunArgs),
    /// Run a benchmark scenario and print its table.
    Bench(bench::BenchArgs),
    /// Show the live figures of a VM started with `hover run --api-socket`
    /// (the same as `hover ctl --api-socket PATH stats`).
    Stats(StatsArgs),
    /// Steer a running VM through its API socket.
    Ctl(CtlArgs),
    /// Boot a new VM from a snapshot; the guest continues where it was.
    Restore(RestoreArgs),
    /// Wait for one VM migrating here (`hover ctl migrate --to`) and run it.
    Receive(ReceiveArgs),
    /// Write the built-in guest's ELF to a new file, to boot it elsewhere
    /// (`hover run --guest PATH`, or another VMM).
    GuestImage(GuestImageArgs),
    /// Serve Firecracker's API (and take its command line), so that tools
    /// written for Firecracker drive Hover (docs/FIRECRACKER.md). Also run
    /// when this binary is invoked as `firecracker`.
    Firecracker(firecracker::FirecrackerArgs),
    /// Make a new random migration key file (mode 0600) to copy to both
    /// hosts and give `hover run|restore|receive --migration-key`.
    MigrationKey(MigrationKeyArgs),
    /// List the built-in guest's workloads with their parameters, accepted
    /// values and defaults (the table `--cmdline` is checked against).
    Workloads,
    /// Print a shell completion script, e.g. `hover completions bash >
    /// ~/.local/share/bash-completion/completions/hover`.
    Completions(CompletionsArgs),
    /// Print hover(1) on stdout, or with --out write a man page for every
    /// subcommand too (`hover-run.1`, `hover-ctl-migrate.1`, ...).
    Man(ManArgs),
}

#[derive(Args)]
struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Args)]
struct ManArgs {
    /// A directory (created if missing) to write every page into.
    #[arg(long, conflicts_with = "markdown")]
    out: Option<PathBuf>,
    /// Print the whole command reference as Markdown instead (docs/CLI.md).
    #[arg(long)]
    markdown: bool,
}

#[derive(Args)]
struct MigrationKeyArgs {
    /// The file to write (a new file: an existing path is refused).
    path: PathBuf,
}

#[derive(Args)]
struct GuestImageArgs {
    /// The file to write (a new file: an existing path is refused).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct ReceiveArgs {
    /// Where to listen: tcp:HOST:PORT (port 0: any; the address chosen is
    /// printed on stderr) or unix:PATH.
    #[arg(long)]
    listen: String,
    /// Over TCP, take a VM without a migration key: anyone who reaches the
    /// port can send one (and read nothing back but its errors). Unix
    /// sockets need no key (their file is 0600).
    #[arg(long)]
    insecure: bool,
    /// Give up (exit 1) if no source has opened a migration stream within
    /// this long: seconds (600) or a duration (10m), at most 60m [default:
    /// wait for ever].
    #[arg(long, value_parser = parse::parse_timeout)]
    timeout: Option<std::time::Duration>,
    #[command(flatten)]
    devices: host_args::SavedDeviceArgs,
    #[command(flatten)]
    files: HostFileArgs,
    #[command(flatten)]
    out: RunOutput,
    #[command(flatten)]
    guard: GuardArgs,
    #[command(flatten)]
    boost_host: BoostHostArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum MemoryRestoreArg {
    /// prefetch where this host lets Hover use userfaultfd (Linux 5.7+,
    /// vm.unprivileged_userfaultfd=1 or CAP_SYS_PTRACE) and the VM's memory
    /// is anonymous, else eager (with a warning when userfaultfd is
    /// refused); the outcome's restore.memory_restore says which ran.
    Auto,
    /// Read every saved page before the guest runs.
    Eager,
    /// Bring each page in from the file when the guest first touches it.
    Lazy,
    /// As lazy, and load the rest in the background in large copies, the
    /// snapshot's hot set first; once all is loaded, a VM without a memory
    /// budget hands its memory back to the kernel (no pager from then on).
    Prefetch,
}

#[derive(Args)]
struct RestoreArgs {
    /// The snapshot file (`hover ctl snapshot`).
    path: PathBuf,
    /// How guest memory comes back (a VM with a memory budget comes back
    /// through its pager: lazily, or with prefetch its hot set up to the
    /// budget).
    #[arg(long, value_enum, default_value = "auto")]
    memory_restore: MemoryRestoreArg,
    /// With prefetch: load at most this many pages a second in the
    /// background (a device shared with others), at the default priority
    /// [default: no limit, at the pager's raised priority].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    prefetch_rate: Option<u64>,
    #[command(flatten)]
    devices: host_args::SavedDeviceArgs,
    #[command(flatten)]
    files: HostFileArgs,
    #[command(flatten)]
    out: RunOutput,
    #[command(flatten)]
    guard: GuardArgs,
    #[command(flatten)]
    boost_host: BoostHostArgs,
}

#[derive(Args)]
struct StatsArgs {
    /// The VM's API socket.
    #[arg(long)]
    api_socket: PathBuf,
    /// Print the whole JSON document (KVM statistics and histograms, pager,
    /// governor, I/O device) instead of a summary.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    // The migration's sender process (started by a VMM, not by users).
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(hover_vmm::migration::sender::SUBCOMMAND) {
        return ExitCode::from(hover_vmm::migration::sender::child_main(&argv[2..]) as u8);
    }
    logging::init();
    // Invoked as `firecracker` (a symlink): Firecracker's command line.
    let invoked_as = std::path::Path::new(argv.first().map_or("", String::as_str))
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let args = if invoked_as.as_deref() == Some("firecracker") {
        let mut args = vec!["hover".to_string(), "firecracker".to_string()];
        args.extend(argv.iter().skip(1).cloned());
        args
    } else {
        argv.clone()
    };
    // The matches too: `hover bench` asks which flags were given, not only
    // their values, to refuse one its scenario would ignore.
    let matches = <Cli as clap::CommandFactory>::command().get_matches_from(args);
    let cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Commands that run a VM end it cleanly on SIGTERM/SIGINT. Installed
    // before any thread starts: every thread inherits the blocked mask.
    // `hover bench` too: a signal ends it at once, removing the files it
    // registered, and the VMs it started end with it (their parent-death
    // signal).
    if matches!(cli.command, Command::Bench(_)) {
        hover_vmm::signals::say_on_signal("the bench ended; the VMs it started end with it");
    }
    if matches!(
        cli.command,
        Command::Run(_)
            | Command::Restore(_)
            | Command::Receive(_)
            | Command::Firecracker(_)
            | Command::Bench(_)
    ) {
        if let Err(e) = hover_vmm::signals::install() {
            eprintln!("hover: error: cannot set up SIGTERM/SIGINT handling: {e}");
            return ExitCode::from(EXIT_HOST_FAILURE);
        }
    }
    // Whatever runs a VM here ends with the process: its thread may be
    // confined once the VM runs (docs/RELIABILITY.md).
    hover_vmm::seccomp::confine_control_threads();
    match cli.command {
        Command::Run(args) => run(args),
        Command::Bench(args) => bench::bench(args, bench::Given::of(&matches)),
        Command::Stats(args) => ctl::ctl(CtlArgs {
            api_socket: args.api_socket,
            json: args.json,
            action: CtlAction::Stats,
        }),
        Command::Ctl(args) => ctl::ctl(args),
        Command::Restore(args) => restore(args),
        Command::Receive(args) => receive(args),
        Command::GuestImage(args) => guest_image(&args.out),
        Command::Firecracker(args) => firecracker::firecracker(args),
        Command::MigrationKey(args) => migration_key(&args.path),
        Command::Workloads => {
            die_on_broken_pipe();
            print!("{}", self_doc::workloads());
            ExitCode::SUCCESS
        }
        Command::Completions(args) => {
            die_on_broken_pipe();
            self_doc::completions(args.shell, Cli::command(), &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Man(args) => {
            die_on_broken_pipe();
            if args.markdown {
                print!("{}", self_doc::markdown(Cli::command()));
                return ExitCode::SUCCESS;
            }
            self_doc::man(Cli::command(), args.out.as_deref())
        }
    }
}

fn migration_key(path: &std::path::Path) -> ExitCode {
    match hover_vmm::config::MigrationKey::create(path) {
        Ok(()) => {
            eprintln!(
                "hover: wrote a new migration key to {} (mode 0600); copy it to the other host the same way (e.g. scp -p) and give both VMMs --migration-key {}",
                path.display(),
                path.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            eprintln!(
                "hover: error: {}: already exists (choose a new path; a key is never overwritten)",
                path.display()
            );
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Err(e) => {
            eprintln!("hover: error: {}: {e}", path.display());
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

fn guest_image(out: &std::path::Path) -> ExitCode {
    use std::io::Write;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .and_then(|mut f| {
            f.write_all(hover_vmm::boot::BUILTIN_GUEST)
                .and_then(|()| f.sync_all())
        });
    match written {
        Ok(()) => {
            eprintln!(
                "hover: wrote the built-in guest ({} bytes, x86_64 ELF) to {}",
                hover_vmm::boot::BUILTIN_GUEST.len(),
                out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            eprintln!(
                "hover: error: --out {}: already exists (choose a new path; nothing is overwritten)",
                out.display()
            );
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Err(e) => {
            // A partly written file is not a guest image.
            let _ = std::fs::remove_file(out);
            eprintln!("hover: error: cannot write {}: {e}", out.display());
            ExitCode::from(EXIT_HOST_FAILURE)
        }
    }
}

/// Run `vm` to its end, its API on `api_socket` if given; SIGTERM or
/// SIGINT meanwhile ends it as the API's shutdown does (`ended: signal`,
/// exit status 128 + the signal).
pub(crate) fn run_vm(
    mut vm: Vm,
    api_socket: Option<&std::path::Path>,
) -> Result<hover_vmm::RunOutcome, Error> {
    if let Some(path) = api_socket {
        vm.serve_api(Box::new(hover_vmm::api::SocketApi::new(path)));
    }
    let controller = vm.controller();
    let _signals = hover_vmm::signals::watch(move |sig| controller.signal(sig));
    let ran = vm.run();
    // The VM has ended: a signal now must not cut its outcome short.
    hover_vmm::signals::ignore_from_now();
    ran
}

/// Print a finished run's outcome and turn it into the exit status.
pub(crate) fn finish(
    result: Result<hover_vmm::RunOutcome, Error>,
    json: bool,
    stats: bool,
) -> ExitCode {
    match result {
        Ok(outcome) => {
            if json {
                output::print_json(&outcome);
            } else {
                output::print_summary(&outcome);
                if stats {
                    output::print_stats(&outcome);
                }
            }
            // Process exit statuses are 8 bits; the full code is in the summary.
            ExitCode::from(u8::try_from(outcome.exit_code).unwrap_or(u8::MAX))
        }
        Err(e) => fail(&e),
    }
}

fn receive(args: ReceiveArgs) -> ExitCode {
    let listen: hover_vmm::migration::Addr = match args.listen.parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hover: error: --listen: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let opts = RestoreOptions {
        host: match host_config(&args.out, &args.files, &args.guard, &args.boost_host) {
            Ok(mut h) => {
                args.devices.apply(&mut h);
                h
            }
            Err(e) => return bad_input(&e),
        },
        ..Default::default()
    };
    let announce = |at: &str| eprintln!("hover: waiting for a migrating VM on {at}");
    finish(
        Vm::receive(
            &listen,
            &opts,
            &ReceiveOptions {
                insecure: args.insecure,
                timeout: args.timeout,
            },
            announce,
        )
        .and_then(|vm| run_vm(vm, args.out.api_socket.as_deref())),
        args.out.json,
        args.out.stats,
    )
}

fn restore(args: RestoreArgs) -> ExitCode {
    let opts = RestoreOptions {
        memory: match args.memory_restore {
            MemoryRestoreArg::Auto => MemoryRestore::Auto,
            MemoryRestoreArg::Eager => MemoryRestore::Eager,
            MemoryRestoreArg::Lazy => MemoryRestore::Lazy,
            MemoryRestoreArg::Prefetch => MemoryRestore::Prefetch,
        },
        prefetch_rate: args.prefetch_rate,
        host: match host_config(&args.out, &args.files, &args.guard, &args.boost_host) {
            Ok(mut h) => {
                args.devices.apply(&mut h);
                h
            }
            Err(e) => return bad_input(&e),
        },
    };
    finish(
        Vm::restore(&args.path, &opts).and_then(|vm| run_vm(vm, args.out.api_socket.as_deref())),
        args.out.json,
        args.out.stats,
    )
}

fn run(args: RunArgs) -> ExitCode {
    if args.memory_budget.is_none() && args.files.names_a_page_store() {
        eprintln!("hover: error: --page-store, --page-store-latency and --page-store-jitter need --memory-budget (only an overcommitted VM has a page store)");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let machine = args.machine_config();
    let mut host = match host_config(&args.out, &args.files, &args.guard, &args.boost_host) {
        Ok(h) => h,
        Err(e) => return bad_input(&e),
    };
    host.disk_paths = args.disk.iter().map(|d| d.path.clone()).collect();
    host.taps = args.net.iter().map(|n| n.tap.clone()).collect();
    let config = VmConfig { machine, host };
    finish(
        Vm::new(&config).and_then(|vm| run_vm(vm, args.out.api_socket.as_deref())),
        args.out.json,
        args.out.stats,
    )
}

pub(crate) fn fail(e: &Error) -> ExitCode {
    eprintln!("hover: error: {e}");
    ExitCode::from(match e {
        e if e.is_bad_input() => EXIT_BAD_INPUT,
        Error::GuestCrash(_) => EXIT_GUEST_CRASH,
        _ => EXIT_HOST_FAILURE,
    })
}

/// For commands that only print: end quietly when stdout is a closed pipe
/// (`hover stats | head`), as Unix tools do, instead of failing to print.
pub(crate) fn die_on_broken_pipe() {
    // SAFETY: restoring a signal's default disposition is always sound.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// Refuse bad input: one line, exit 2.
fn bad_input(why: &str) -> ExitCode {
    eprintln!("hover: error: {why}");
    ExitCode::from(EXIT_BAD_INPUT)
}
