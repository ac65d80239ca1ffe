//! `hover run`'s flags and the machine configuration they describe (the
//! host's part is `host_args`). Defaults come from the same named
//! constants as `MachineConfig::default()`; a test holds them equal.

use std::time::Duration;

use clap::{Args, ValueEnum};
use hover_vmm::config::{
    BoostConfig, BoostMode, BoostPolicy, GuestImage, HaltPoll, MachineConfig, MemoryBackend,
};

use crate::host_args::{BoostHostArgs, GuardArgs, HostFileArgs, RunOutput};
use crate::parse::{self, parse_duration, parse_size};

fn parse_boost_policy(s: &str) -> Result<BoostPolicy, String> {
    s.parse()
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
pub(crate) struct RunArgs {
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
    pub(crate) memory_budget: Option<u64>,
    /// Offer KVM's asynchronous page faults to the guest (on: the guest runs
    /// another task while a page is fetched; off: the vCPU waits).
    #[arg(long, value_enum, default_value = "on")]
    async_pf: OnOff,
    /// Fixed maximum halt-poll window for this VM, nanoseconds (0: no
    /// polling; at most 10 ms). Default: KVM's module setting.
    #[arg(long, conflicts_with = "halt_poll", value_parser = crate::parse::nanos)]
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
    /// Size it to the pages a vCPU dirties between two harvests: a ring
    /// that fills sooner re-protects hot pages, which fault again
    /// (docs/RESULTS.md).
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
    #[arg(long, default_value_t = hover_vmm::config::boost::DEFAULT_MAX_MS, value_parser = crate::parse::millis)]
    boost_max_ms: u64,
    /// No boost for this long after one was revoked, milliseconds (0-60000).
    #[arg(long, default_value_t = hover_vmm::config::boost::DEFAULT_COOLDOWN_MS, value_parser = crate::parse::millis)]
    boost_cooldown_ms: u64,
    /// Most boosts per vCPU in one second; more are revoked as above.
    #[arg(long, default_value_t = hover_vmm::config::boost::DEFAULT_MAX_RATE)]
    boost_max_rate: u32,
    /// How often the boost monitor reads the shared pages, microseconds
    /// (50-1000000).
    #[arg(long, default_value_t = hover_vmm::config::boost::DEFAULT_POLL_US, value_parser = crate::parse::micros)]
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
    pub(crate) disk: Vec<parse::DiskArg>,
    /// A virtio network card for `--kernel` on an existing tap device:
    /// `tap=NAME[,mac=MAC][,id=ID]` (`ip tuntap add NAME mode tap user
    /// $USER` makes one; MACs default to 06:00:00:00:00:01, :02, ... and
    /// ids to net0, net1, ... in order). Repeatable.
    #[arg(long, value_name = "tap=NAME[,mac=MAC][,id=ID]", value_parser = parse::parse_net, requires = "kernel")]
    pub(crate) net: Vec<parse::NetArg>,
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
    pub(crate) files: HostFileArgs,
    #[command(flatten)]
    pub(crate) out: RunOutput,
    #[command(flatten)]
    pub(crate) guard: GuardArgs,
    #[command(flatten)]
    pub(crate) boost_host: BoostHostArgs,
}

/// The machine `hover run`'s flags describe (the host's part is
/// `host_config`).
impl RunArgs {
    pub(crate) fn machine_config(&self) -> MachineConfig {
        let args = self;
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
}

#[cfg(test)]
mod defaults {
    use super::*;
    use clap::Parser;

    /// `hover run`'s flags as given (one word each after `hover run`).
    fn run_args(flags: &[&str]) -> RunArgs {
        let argv = ["hover", "run"].iter().chain(flags).copied();
        match crate::Cli::parse_from(argv).command {
            crate::Command::Run(a) => a,
            _ => unreachable!("hover run parses as run"),
        }
    }

    #[test]
    fn hover_run_with_no_flags_is_the_default_machine_and_guest_limits() {
        let args = run_args(&[]);
        assert_eq!(args.machine_config(), MachineConfig::default());
        assert_eq!(
            args.guard.limits(),
            hover_vmm::config::GuestLimits::default()
        );
    }

    #[test]
    fn boost_flags_left_out_are_the_boost_defaults() {
        let m = run_args(&["--boost", "on"]).machine_config();
        assert_eq!(
            m.boost,
            BoostConfig {
                mode: BoostMode::Dynamic,
                ..BoostConfig::default()
            }
        );
    }
}
