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
mod self_doc;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use ctl::{CtlAction, CtlArgs};
use host_args::{host_config, BoostHostArgs, GuardArgs, HostFileArgs, RunOutput};
use hover_vmm::config::{
    BoostConfig, BoostMode, BoostPolicy, GuestImage, HaltPoll, MachineConfig, MemoryBackend,
    VmConfig,
};
use hover_vmm::{Error, MemoryRestore, ReceiveOptions, RestoreOptions, Vm};
use parse::{parse_duration, parse_size};

fn parse_boost_policy(s: &str) -> Result<BoostPolicy, String> {
    s.parse()
}

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

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BootArg {
    /// Hover's 64-bit entry.
    Hover,
    /// The PVH 32-bit entry.
    Pvh,
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
    #[arg(long, default_value_t = hover_vmm::config::halt_poll::DEFAULT_BUDGET_PCT, requires = "halt_poll")]
    halt_poll_budget: f64,
    /// Give each vCPU a dirty ring of this many entries (a power of two, 256
    /// to 65536), for live migration with `--dirty-tracking ring`. KVM
    /// creates rings only with the vCPUs, and refuses the other trackers then.
    #[arg(long)]
    dirty_ring: Option<u32>,
    /// Let guest HLT run without exiting to KVM (KVM_CAP_X86_DISABLE_EXITS):
    /// wake-ups cost nothing, but each vCPU keeps a host CPU busy.
    #[arg(long)]
    disable_hlt_exits: bool,
    /// The longest an idle vCPU may poll before it halts (e.g. 200us; 0: no
    /// guest polling; at most 10ms). The built-in guest in `idle=haltpoll`
    /// mode adapts its window below this, and while it polls, I/O
    /// completion interrupts to it are skipped. A Linux guest given a limit
    /// gets the "realtime" hint that loads `cpuidle-haltpoll` (it also
    /// turns off the guest's paravirtual spinlocks) and the limit as
    /// `haltpoll.guest_halt_poll_ns` [default: 200us for the built-in
    /// guest, 0 for a Linux kernel]
    #[arg(long, value_parser = parse_duration)]
    guest_halt_poll_max: Option<Duration>,
    /// Dynamic vCPU priority boosting: the guest asks through a shared page
    /// per vCPU, the VMM boosts the vCPU's thread (and on interrupts it
    /// injects) and the guest unboosts when its sensitive work ends. A
    /// guest with no shared page (Linux) gets the interrupt boosts alone,
    /// each ended by Hover as the vCPU halts (or at --boost-irq-us).
    #[arg(long, value_enum, default_value = "off")]
    boost: OnOff,
    /// Static baseline: every vCPU thread boosted with --boost-policy for as
    /// long as it runs guest code (like crosvm's --rt-cpus).
    #[arg(long, conflicts_with = "boost")]
    vcpu_rt: bool,
    /// What a boost does to a vCPU thread: `fifo[:PRIO]` (SCHED_FIFO, 1-99,
    /// default 10) or `nice[:VALUE]` (-20..19, default -20).
    #[arg(long, default_value = "fifo", value_parser = parse_boost_policy)]
    boost_policy: BoostPolicy,
    /// Revoke a boost once its thread has run this many milliseconds of CPU
    /// time (1-10000): the longest a guest can hold a host CPU from normal
    /// threads in one go.
    #[arg(long, default_value_t = hover_vmm::config::boost::DEFAULT_MAX_MS)]
    boost_max_ms: u64,
    /// No boost for this long after one was revoked, milliseconds (0-60000).
    #[arg(long, default_value_t = hover_vmm::config::boost::DEFAULT_COOLDOWN_MS)]
    boost_cooldown_ms: u64,
    /// Most boosts per vCPU in one second; more are revoked as above.
    #[arg(long, default_value_t = hover_vmm::config::boost::DEFAULT_MAX_RATE)]
    boost_max_rate: u32,
    /// How often the boost monitor reads the shared pages, microseconds
    /// (50-1000000).
    #[arg(long, default_value_t = hover_vmm::config::boost::DEFAULT_POLL_US)]
    boost_poll_us: u64,
    /// The guest: `builtin` or the path of an x86_64 ELF executable.
    #[arg(long, default_value = "builtin", conflicts_with = "kernel")]
    guest: String,
    /// Boot a Linux kernel instead: a bzImage or an uncompressed x86-64
    /// ELF vmlinux (boot protocol 2.12 or later). `--cmdline` is then the
    /// kernel's command line.
    #[arg(long, value_name = "PATH", conflicts_with = "boot")]
    kernel: Option<std::path::PathBuf>,
    /// The initramfs for `--kernel`.
    #[arg(long, value_name = "PATH", requires = "kernel")]
    initrd: Option<std::path::PathBuf>,
    /// A virtio disk for `--kernel`: `PATH[,readonly][,id=ID]` (a raw image
    /// file or a block device; ids default to disk0, disk1, ... in order;
    /// the guest sees vda, vdb, ...). Repeatable.
    #[arg(long, value_name = "PATH[,readonly][,id=ID]", value_parser = parse::parse_disk, requires = "kernel")]
    disk: Vec<parse::DiskArg>,
    /// A virtio network card for `--kernel` on an existing tap device:
    /// `tap=NAME[,mac=MAC][,id=ID]` (`ip tuntap add NAME mode tap user
    /// $USER` makes one; MACs default to 06:00:00:00:00:01, :02, ... and
    /// ids to net0, net1, ... in order). Repeatable.
    #[arg(long, value_name = "tap=NAME[,mac=MAC][,id=ID]", value_parser = parse::parse_net, requires = "kernel")]
    net: Vec<parse::NetArg>,
    /// A virtio entropy device for `--kernel` (entropy from the host's getrandom).
    #[arg(long, value_enum, default_value = "on")]
    rng: OnOff,
    /// A virtio balloon for `--kernel`: `--balloon` alone, or
    /// `target=SIZE,reporting=on|off,stats=SECONDS,deflate-on-oom=on|off`
    /// (defaults: target 0, free page reporting on, no statistics polling,
    /// no deflate on OOM). Pages the guest gives back (inflated or
    /// reported free) leave host memory at once; `hover ctl balloon`
    /// changes the target live.
    #[arg(long, value_name = "[target=SIZE][,reporting=on|off][,stats=SECONDS][,deflate-on-oom=on|off]", num_args = 0..=1, default_missing_value = "", value_parser = parse::parse_balloon, requires = "kernel")]
    balloon: Option<hover_vmm::config::BalloonConfig>,
    /// Guest command line: for the built-in guest its workload, e.g.
    /// "workload=hello" (the default); for `--kernel` the kernel's command
    /// line (default "console=ttyS0 reboot=k panic=-1").
    #[arg(long)]
    cmdline: Option<String>,
    /// How the boot vCPU enters the image: `hover` (Hover's 64-bit entry,
    /// every vCPU) or `pvh` (the image's PVH 32-bit entry, as QEMU boots it;
    /// ACPI tables list every vCPU and the guest starts the others).
    #[arg(long, value_enum, default_value = "hover")]
    boot: BootArg,
    #[command(flatten)]
    files: HostFileArgs,
    #[command(flatten)]
    out: RunOutput,
    #[command(flatten)]
    guard: GuardArgs,
    #[command(flatten)]
    boost_host: BoostHostArgs,
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
    let cli = if invoked_as.as_deref() == Some("firecracker") {
        let mut args = vec!["hover".to_string(), "firecracker".to_string()];
        args.extend(argv.iter().skip(1).cloned());
        Cli::parse_from(args)
    } else {
        Cli::parse()
    };
    // Commands that run a VM end it cleanly on SIGTERM/SIGINT. Installed
    // before any thread starts: every thread inherits the blocked mask.
    if matches!(
        cli.command,
        Command::Run(_) | Command::Restore(_) | Command::Receive(_) | Command::Firecracker(_)
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
        Command::Bench(args) => bench::bench(args),
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
    let machine = machine_config(&args);
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

/// The machine `hover run`'s flags describe (the host's part is
/// `host_config`).
fn machine_config(args: &RunArgs) -> MachineConfig {
    let mut machine = MachineConfig {
        vcpus: args.vcpus,
        memory: args.memory,
        memory_backend: match args.memory_backend {
            BackendArg::Anon => MemoryBackend::Anonymous,
            BackendArg::Memfd => MemoryBackend::Memfd,
        },
        cmdline: args.cmdline.clone().unwrap_or_else(|| {
            if args.kernel.is_some() {
                hover_vmm::boot::linux::DEFAULT_CMDLINE.into()
            } else {
                hover_vmm::config::DEFAULT_CMDLINE.into()
            }
        }),
        guest: match &args.kernel {
            Some(kernel) => GuestImage::Linux(hover_vmm::boot::linux::LinuxBoot {
                kernel: kernel.clone(),
                initrd: args.initrd.clone(),
            }),
            None if args.guest == "builtin" => GuestImage::Builtin,
            None => GuestImage::Path(args.guest.clone().into()),
        },
        boot: match args.boot {
            BootArg::Hover => hover_vmm::config::BootProtocol::Hover,
            BootArg::Pvh => hover_vmm::config::BootProtocol::Pvh,
        },
        memory_budget: args.memory_budget,
        async_pf: args.async_pf == OnOff::On,
        halt_poll: match (args.halt_poll_ns, args.halt_poll) {
            (Some(ns), _) => HaltPoll::Fixed { window_ns: ns },
            (None, Some(HaltPollArg::Auto)) => HaltPoll::Auto {
                budget_pct: args.halt_poll_budget,
            },
            (None, None) => HaltPoll::KvmDefault,
        },
        hlt_exits: !args.disable_hlt_exits,
        guest_poll_max_ns: 0, // below: by the guest's kind unless given
        dirty_ring: args.dirty_ring,
        boost: BoostConfig {
            mode: match (args.boost, args.vcpu_rt) {
                (_, true) => BoostMode::Static,
                (OnOff::On, false) => BoostMode::Dynamic,
                (OnOff::Off, false) => BoostMode::Off,
            },
            policy: args.boost_policy,
            max_ms: args.boost_max_ms,
            cooldown_ms: args.boost_cooldown_ms,
            max_rate: args.boost_max_rate,
            poll_us: args.boost_poll_us,
        },
        disks: Vec::new(),
        nets: Vec::new(),
        rng: true,
        balloon: args.balloon.clone(),
    };
    machine.guest_poll_max_ns = match args.guest_halt_poll_max {
        Some(d) => d.as_nanos().min(u64::MAX as u128) as u64,
        None => hover_vmm::config::default_guest_poll_ns(&machine.guest),
    };
    machine.rng = args.rng == OnOff::On;
    machine.disks = args
        .disk
        .iter()
        .enumerate()
        .map(|(i, d)| hover_vmm::devices::virtio::block::DiskConfig {
            id: d.id.clone().unwrap_or_else(|| format!("disk{i}")),
            readonly: d.readonly,
            size: 0,
        })
        .collect();
    machine.nets = args
        .net
        .iter()
        .enumerate()
        .map(|(i, n)| hover_vmm::devices::virtio::net::NetConfig {
            id: n.id.clone().unwrap_or_else(|| format!("net{i}")),
            mac: n
                .mac
                .unwrap_or_else(|| hover_vmm::devices::virtio::net::default_mac(i)),
        })
        .collect();
    machine
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

#[cfg(test)]
mod defaults {
    use super::*;

    /// `hover run`'s flags as given (one word each after `hover run`).
    fn run_args(flags: &[&str]) -> RunArgs {
        let argv = ["hover", "run"].iter().chain(flags).copied();
        match Cli::parse_from(argv).command {
            Command::Run(a) => a,
            _ => unreachable!("hover run parses as run"),
        }
    }

    #[test]
    fn hover_run_with_no_flags_is_the_default_machine_and_guest_limits() {
        let args = run_args(&[]);
        assert_eq!(machine_config(&args), MachineConfig::default());
        assert_eq!(
            args.guard.limits(),
            hover_vmm::config::GuestLimits::default()
        );
    }

    #[test]
    fn boost_flags_left_out_are_the_boost_defaults() {
        let m = machine_config(&run_args(&["--boost", "on"]));
        assert_eq!(
            m.boost,
            BoostConfig {
                mode: BoostMode::Dynamic,
                ..BoostConfig::default()
            }
        );
    }
}
