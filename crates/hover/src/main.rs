//! `hover`: the command line of the Hover VMM.
//!
//! Exit status: the guest's exit code when it powers off (the built-in guest
//! uses 0 for success and 16 and above for its own failures); 2 for bad input
//! (flags, configuration, guest image); 3 when the guest crashes; 1 for any
//! other failure of the host.

mod ctl;
mod output;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ctl::{CtlAction, CtlArgs};
use hover_vmm::config::{
    parse_console, parse_duration, parse_size, ConsoleTarget, GuestImage, MemoryBackend,
    PagingConfig, VmConfig,
};
use hover_vmm::config::{HaltPoll, PvioConfig};
use hover_vmm::{Error, MemoryRestore, RestoreOptions, Vm};

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
    Bench(BenchArgs),
    /// Show the live figures of a VM started with `hover run --api-socket`
    /// (the same as `hover ctl --api-socket PATH stats`).
    Stats(StatsArgs),
    /// Steer a running VM through its API socket.
    Ctl(CtlArgs),
    /// Boot a new VM from a snapshot; the guest continues where it was.
    Restore(RestoreArgs),
    /// Wait for one VM migrating here (`hover ctl migrate --to`) and run it.
    Receive(ReceiveArgs),
}

#[derive(Args)]
struct ReceiveArgs {
    /// Where to listen: tcp:HOST:PORT (port 0: any; the address chosen is
    /// printed on stderr) or unix:PATH.
    #[arg(long)]
    listen: String,
    #[command(flatten)]
    out: RunOutput,
}

#[derive(Clone, Copy, ValueEnum)]
enum MemoryRestoreArg {
    /// Read every saved page before the guest runs.
    Eager,
    /// Bring each page in from the file when the guest first touches it.
    Lazy,
}

#[derive(Args)]
struct RestoreArgs {
    /// The snapshot file (`hover ctl snapshot`).
    path: PathBuf,
    /// How guest memory comes back (a VM with a memory budget is always
    /// restored lazily, through its pager).
    #[arg(long, value_enum, default_value = "eager")]
    memory_restore: MemoryRestoreArg,
    /// Page store for a VM with a memory budget [default: a temporary file in /var/tmp].
    #[arg(long)]
    page_store: Option<PathBuf>,
    #[command(flatten)]
    out: RunOutput,
}

/// What `hover run` and `hover restore` share: the API socket, the console
/// and how the outcome is printed.
#[derive(Args)]
struct RunOutput {
    /// Serve the control API (HTTP on a Unix socket, mode 0600) while the VM
    /// runs: `hover ctl --api-socket PATH ...`; created here (an existing
    /// path is refused), removed at exit.
    #[arg(long)]
    api_socket: Option<PathBuf>,
    /// Where the guest console goes: stdout, stderr, off or file:PATH
    /// [default: stdout, or stderr with --json].
    #[arg(long, value_parser = parse_console)]
    console: Option<ConsoleTarget>,
    /// Print the outcome (exit code, reports, timings, memory) as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Also print KVM's statistics of the VM and of each vCPU at exit (always
    /// included in --json).
    #[arg(long)]
    stats: bool,
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

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum HaltPollArg {
    /// The governor.
    Auto,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendArg {
    /// Private anonymous memory.
    Anon,
    /// A memfd (shareable with another process).
    Memfd,
}

#[derive(Args)]
struct RunArgs {
    /// Number of vCPUs (1-32, and no more than KVM allows).
    #[arg(long, default_value_t = hover_vmm::config::DEFAULT_VCPUS)]
    vcpus: u32,
    /// Guest memory, e.g. 256M or 1G (binary units; a multiple of 4 KiB).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    memory: u64,
    /// How guest memory is backed.
    #[arg(long, value_enum, default_value = "anon")]
    memory_backend: BackendArg,
    /// Overcommit guest memory: keep at most this much of it resident (e.g.
    /// 64M); the rest is paged out to the page store. Off by default.
    #[arg(long, value_parser = parse_size)]
    memory_budget: Option<u64>,
    /// Page store for --memory-budget: a new file to create (an existing path
    /// is refused, never overwritten), or a directory to create one in; the
    /// file is removed at exit [default: a temporary file in /var/tmp].
    #[arg(long, requires = "memory_budget")]
    page_store: Option<PathBuf>,
    /// Extra latency of every page-store read, modelling a slower device
    /// (e.g. 100us, 2ms).
    #[arg(long, default_value = "0", value_parser = parse_duration, requires = "memory_budget")]
    page_store_latency: Duration,
    /// Offer KVM's asynchronous page faults to the guest (on: the guest runs
    /// another task while a page is fetched; off: the vCPU waits).
    #[arg(long, value_enum, default_value = "on")]
    async_pf: OnOff,
    /// Fixed maximum halt-poll window for this VM, nanoseconds (0: no
    /// polling; at most 10 ms). Default: KVM's module setting.
    #[arg(long, conflicts_with = "halt_poll")]
    halt_poll_ns: Option<u64>,
    /// `auto`: a governor picks the window from KVM's measured wake-ups,
    /// within --halt-poll-budget.
    #[arg(long, value_enum)]
    halt_poll: Option<HaltPollArg>,
    /// CPU budget for failed polls under --halt-poll auto, percent of one CPU
    /// per vCPU, in (0, 100].
    #[arg(long, default_value_t = hover_vmm::sched::halt_poll::DEFAULT_BUDGET_PCT, requires = "halt_poll")]
    halt_poll_budget: f64,
    /// File the paravirtual I/O device writes to (created if missing, kept).
    /// Default: a file on tmpfs (/dev/shm), removed at exit.
    #[arg(long)]
    io_file: Option<PathBuf>,
    /// Give each vCPU a dirty ring of this many entries (a power of two, 256
    /// to 65536), for live migration with `--dirty-tracking ring`. KVM
    /// creates rings only with the vCPUs, and refuses the other trackers then.
    #[arg(long)]
    dirty_ring: Option<u32>,
    /// Let guest HLT run without exiting to KVM (KVM_CAP_X86_DISABLE_EXITS):
    /// wake-ups cost nothing, but each vCPU keeps a host CPU busy.
    #[arg(long)]
    disable_hlt_exits: bool,
    /// The guest: `builtin` or the path of an x86_64 ELF executable.
    #[arg(long, default_value = "builtin")]
    guest: String,
    /// Guest command line, e.g. "workload=hello".
    #[arg(long, default_value = hover_vmm::config::DEFAULT_CMDLINE)]
    cmdline: String,
    #[command(flatten)]
    out: RunOutput,
}

#[derive(Args)]
struct BenchArgs {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// Boot the built-in guest repeatedly: time to first instruction, first
    /// console byte and exit; the monitor's own resident memory.
    Boot {
        /// Number of boots.
        #[arg(long, default_value_t = 20)]
        runs: u32,
        /// vCPUs per VM.
        #[arg(long, default_value_t = 2)]
        vcpus: u32,
        /// Directory for the JSON results.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
    /// The async page fault seed's experiment: bm under a memory budget with
    /// async PF off and on (and the ideal), across page-store latencies.
    Apf {
        /// Page-store latencies to sweep (comma-separated).
        #[arg(long, default_value = "0,100us,500us,2ms,5ms", value_delimiter = ',')]
        latencies: Vec<String>,
        /// Seconds each run measures.
        #[arg(long, default_value_t = 5)]
        seconds: u32,
        /// Runs per configuration (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: u32,
        /// Directory for the JSON results and the plot.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
    /// The halt-polling seed's experiment: iolat under each way of waiting
    /// (off, KVM default, fixed windows, the governor, idle=poll, HLT exits
    /// disabled) and the host CPU an idle guest burns under each.
    HaltPoll {
        /// Seconds per run.
        #[arg(long, default_value_t = 3)]
        seconds: u32,
        /// Runs per mode (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: u32,
        /// Directory for the I/O device's file (a real disk: see the scenario's doc).
        #[arg(long, default_value = "/var/tmp")]
        io_dir: PathBuf,
        /// Directory for the JSON results and the plot.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
    /// Live migration between two hover processes: each dirty tracker across
    /// guest memory sizes (total time, downtime, rounds, pages, the guest's
    /// ops/s during vs before, its page faults), and batch sizes (pages/s,
    /// CPU cycles per page).
    Migrate {
        /// Trackers (comma-separated).
        #[arg(
            long,
            default_value = "bitmap,manual,hybrid,ring",
            value_delimiter = ','
        )]
        trackers: Vec<String>,
        /// Guest memory sizes (comma-separated).
        #[arg(long, default_value = "256M,1G,4G", value_delimiter = ',')]
        memories: Vec<String>,
        /// kvstore's working set.
        #[arg(long, default_value = "64M")]
        wss: String,
        /// kvstore's operations per second.
        #[arg(long, default_value_t = 100_000)]
        rate: u64,
        /// Batch sizes (pages, comma-separated).
        #[arg(long, default_value = "1,16,256,1024", value_delimiter = ',')]
        batches: Vec<usize>,
        /// Rounds.
        #[arg(long, default_value_t = 2)]
        runs: u32,
        /// unix or tcp (loopback).
        #[arg(long, default_value = "unix")]
        transport: String,
        /// Directory for the JSON results and the plot.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
    /// Pause latency, snapshot time and size, and restore (eager vs lazy):
    /// time to the vCPUs running and the guest's work in its first second,
    /// across guest memory sizes at a fixed working set.
    Snapshot {
        /// Guest memory sizes (comma-separated).
        #[arg(long, default_value = "256M,1G,4G", value_delimiter = ',')]
        memories: Vec<String>,
        /// The guest's working set (bm's array).
        #[arg(long, default_value = "64M")]
        working_set: String,
        /// Rounds (sizes and modes interleaved within each).
        #[arg(long, default_value_t = 3)]
        runs: u32,
        /// Directory for the snapshot files (removed after each sample).
        #[arg(long, default_value = "/var/tmp")]
        dir: PathBuf,
        /// Directory for the JSON results and the plot.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
    /// The guest runtime's costs: task switches (voluntary, preemptive), a
    /// nub trip, timer and interrupt wake-up latency, cross-vCPU wake-ups.
    Runtime {
        /// Runs per measurement (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: u32,
        /// Directory for the JSON results.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(args),
        Command::Bench(args) => bench(args),
        Command::Stats(args) => ctl::ctl(CtlArgs {
            api_socket: args.api_socket,
            json: args.json,
            action: CtlAction::Stats,
        }),
        Command::Ctl(args) => ctl::ctl(args),
        Command::Restore(args) => restore(args),
        Command::Receive(args) => receive(args),
    }
}

fn console_for(console: Option<ConsoleTarget>, json: bool) -> ConsoleTarget {
    console.unwrap_or(if json {
        ConsoleTarget::Stderr
    } else {
        ConsoleTarget::Stdout
    })
}

/// Print a finished run's outcome and turn it into the exit status.
fn finish(result: Result<hover_vmm::RunOutcome, Error>, json: bool, stats: bool) -> ExitCode {
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
        console: console_for(args.out.console, args.out.json),
        api_socket: args.out.api_socket,
        ..Default::default()
    };
    let announce = |at: &str| eprintln!("hover: waiting for a migrating VM on {at}");
    finish(
        Vm::receive(&listen, &opts, announce).and_then(Vm::run),
        args.out.json,
        args.out.stats,
    )
}

fn restore(args: RestoreArgs) -> ExitCode {
    let opts = RestoreOptions {
        memory: match args.memory_restore {
            MemoryRestoreArg::Eager => MemoryRestore::Eager,
            MemoryRestoreArg::Lazy => MemoryRestore::Lazy,
        },
        console: console_for(args.out.console, args.out.json),
        api_socket: args.out.api_socket,
        page_store: args.page_store,
    };
    finish(
        Vm::restore(&args.path, &opts).and_then(Vm::run),
        args.out.json,
        args.out.stats,
    )
}

fn run(args: RunArgs) -> ExitCode {
    let console = console_for(args.out.console, args.out.json);
    let config = VmConfig {
        vcpus: args.vcpus,
        memory: args.memory,
        memory_backend: match args.memory_backend {
            BackendArg::Anon => MemoryBackend::Anonymous,
            BackendArg::Memfd => MemoryBackend::Memfd,
        },
        guest: if args.guest == "builtin" {
            GuestImage::Builtin
        } else {
            GuestImage::Path(args.guest.into())
        },
        cmdline: args.cmdline,
        console,
        paging: args.memory_budget.map(|budget| PagingConfig {
            budget,
            store: args.page_store.clone(),
            store_latency: args.page_store_latency,
        }),
        async_pf: args.async_pf == OnOff::On,
        halt_poll: match (args.halt_poll_ns, args.halt_poll) {
            (Some(ns), _) => HaltPoll::Fixed { window_ns: ns },
            (None, Some(HaltPollArg::Auto)) => HaltPoll::Auto {
                budget_pct: args.halt_poll_budget,
            },
            (None, None) => HaltPoll::KvmDefault,
        },
        hlt_exits: !args.disable_hlt_exits,
        pvio: PvioConfig {
            file: args.io_file.clone(),
        },
        api_socket: args.out.api_socket.clone(),
        dirty_ring: args.dirty_ring,
    };
    finish(
        Vm::new(&config).and_then(Vm::run),
        args.out.json,
        args.out.stats,
    )
}

fn fail(e: &Error) -> ExitCode {
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

fn bench(args: BenchArgs) -> ExitCode {
    die_on_broken_pipe();
    // Scenarios run `hover run` as fresh processes, as a user would.
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("hover: error: cannot find the hover binary to benchmark: {e}");
            return ExitCode::from(EXIT_HOST_FAILURE);
        }
    };
    bench_result(match args.scenario {
        Scenario::Boot { runs, vcpus, out } => hover_bench::boot::run(&exe, runs, vcpus, &out),
        Scenario::Runtime { runs, out } => hover_bench::runtime::run(&exe, runs, &out),
        Scenario::Migrate {
            trackers,
            memories,
            wss,
            rate,
            batches,
            runs,
            transport,
            out,
        } => {
            if let Err(e) = check_all("--trackers", &trackers, |t| {
                t.parse::<hover_vmm::migration::Tracker>().map(|_| ())
            })
            .and(check_all("--memories", &memories, |m| {
                parse_size(m).map(|_| ()).map_err(|e| e.to_string())
            }))
            .and(check_all(
                "--transport",
                std::slice::from_ref(&transport),
                |t| match t.as_str() {
                    "unix" | "tcp" => Ok(()),
                    _ => Err(format!("{t}: use unix or tcp")),
                },
            )) {
                return e;
            }
            let b = hover_bench::migrate::MigrateBench {
                trackers,
                memories,
                wss,
                rate,
                batches,
                runs,
                transport,
            };
            hover_bench::migrate::run(&exe, &b, &out)
        }
        Scenario::Snapshot {
            memories,
            working_set,
            runs,
            dir,
            out,
        } => {
            if let Err(e) = check_all("--memories", &memories, |m| {
                parse_size(m).map(|_| ()).map_err(|e| e.to_string())
            }) {
                return e;
            }
            let b = hover_bench::snapshot::SnapshotBench {
                memories,
                working_set,
                runs,
                dir,
            };
            hover_bench::snapshot::run(&exe, &b, &out)
        }
        Scenario::HaltPoll {
            seconds,
            runs,
            io_dir,
            out,
        } => hover_bench::halt_poll::run(
            &exe,
            &hover_bench::halt_poll::HaltPollBench {
                seconds,
                runs,
                io_dir,
            },
            &out,
        ),
        Scenario::Apf {
            latencies,
            seconds,
            runs,
            out,
        } => {
            let b = hover_bench::apf::ApfBench {
                latencies,
                seconds,
                runs,
                ..Default::default()
            };
            hover_bench::apf::run(&exe, &b, &out)
        }
    })
}

/// Check every value of a list flag; the first bad one ends `hover` with
/// a one-line error and the bad-input status.
fn check_all(
    flag: &str,
    values: &[String],
    check: impl Fn(&String) -> Result<(), String>,
) -> Result<(), ExitCode> {
    for v in values {
        if let Err(e) = check(v) {
            eprintln!("hover: error: {flag}: {e}");
            return Err(ExitCode::from(EXIT_BAD_INPUT));
        }
    }
    Ok(())
}

fn bench_result(result: Result<(), hover_bench::BenchError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(hover_bench::BenchError::Vm(e)) => fail(&e),
        Err(e) => {
            eprintln!("hover: error: {e}");
            ExitCode::from(EXIT_HOST_FAILURE)
        }
    }
}
