//! `hover bench`'s command line: each scenario's flags, their help and
//! defaults (what `--help` and README show); `super` checks and runs them.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub(super) scenario: Scenario,
}

#[derive(Subcommand)]
pub(super) enum Scenario {
    /// Boot the built-in guest repeatedly: time to first instruction, first
    /// console byte and exit; the monitor's own resident memory.
    Boot {
        /// Number of boots.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        runs: u32,
        /// vCPUs per VM (1 to 32).
        #[arg(long, default_value_t = 2,
              value_parser = clap::value_parser!(u32).range(1..=hover_abi::layout::MAX_VCPUS as i64))]
        vcpus: u32,
        /// Also boot the same image under this peer VMM (`qemu`: QEMU
        /// microvm and pc through the image's PVH entry), interleaved with
        /// `hover run`, 1 vCPU; skipped with a message if it is not installed.
        #[arg(long, value_enum)]
        peer: Option<Peer>,
        /// Directory for the JSON results.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
    /// The async page fault seed's experiment: bm under a memory budget with
    /// async PF off, on and adaptive (and the ideal), across page-store
    /// latencies.
    Apf {
        /// Page-store latencies to sweep (comma-separated durations, as
        /// `hover run --page-store-latency` takes them, each at most 1s).
        #[arg(long, default_value = "0,100us,500us,2ms,5ms", value_delimiter = ',',
              value_parser = crate::parse::store_latency)]
        latencies: Vec<String>,
        /// Seconds each run measures.
        #[arg(long, default_value_t = 5, value_parser = crate::parse::seconds)]
        seconds: u32,
        /// Runs per configuration (the median is reported).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        runs: u32,
        /// The "adaptive" rows' guest `apf_min_us=`: async PF stays on only
        /// while faults wait at least this long on average.
        #[arg(long, default_value_t = hover_bench::apf::ApfBench::default().adaptive_min_us,
              value_parser = crate::parse::micros_max::<1_000_000>)]
        adaptive_min_us: u64,
        /// Directory for the JSON results and the plot.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
    /// The halt-polling seed's experiment: iolat under each way of waiting
    /// (off, KVM default, fixed windows, the governor, guest haltpoll with
    /// and without the governor, idle=poll, HLT exits disabled) on a fast
    /// and a slow device, and the host CPU an idle guest burns under each.
    HaltPoll {
        /// Seconds per run.
        #[arg(long, default_value_t = 3, value_parser = crate::parse::seconds)]
        seconds: u32,
        /// Runs per mode (the median is reported).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        runs: u32,
        /// The fast device: directory for the I/O device's file (tmpfs, the
        /// seed's battery-backed disk).
        #[arg(long, default_value = "/dev/shm")]
        fast_dir: PathBuf,
        /// The slow device: a directory on a real disk.
        #[arg(long, default_value = "/var/tmp")]
        io_dir: PathBuf,
        /// Which devices to run: fast, slow or both.
        #[arg(long, value_enum, value_delimiter = ',', default_value = "fast,slow")]
        devices: Vec<Device>,
        /// Also run iolat under this peer VMM each round (`qemu`: QEMU
        /// microvm, the guest's virtio block driver on a file in the same
        /// directory, KVM's default halt polling) and print it beside
        /// Hover's rows; skipped with a message if it is not installed.
        #[arg(long, value_enum)]
        peer: Option<Peer>,
        /// Directory for the JSON results and the plot.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
    /// Live migration between two hover processes: each dirty tracker across
    /// guest memory sizes (total time, downtime, rounds, pages, the guest's
    /// ops/s during vs before, its page faults), batch sizes (pages/s, CPU
    /// cycles per page), a sender process per mapping mode, and the mapping
    /// micro-benchmark (per-page mmap vs process_vm_readv vs one mapping).
    Migrate(MigrateArgs),
    /// The vCPU priority boosting seed's tables: a real-time timer task and
    /// an audio task in the guest, host idle and busy (hog threads the bench
    /// starts), a host-side latency probe; vanilla, dynamic boost, static RT.
    Boost(BoostArgs),
    /// Seed 4's experiment: each dirty tracker turned on and harvested
    /// every period while a kvstore guest writes (at --rate, or as fast as
    /// it can), nothing sent: the guest's ops/s (and per round over bitmap's), KVM page
    /// faults/s, harvest time; trackers rotated in each round.
    DirtyLog {
        /// Trackers (comma-separated; `none`: no tracking, the baseline).
        #[arg(
            long,
            default_value = "none,bitmap,manual,hybrid,ring",
            value_delimiter = ',',
            value_parser = ["none", "bitmap", "manual", "hybrid", "ring"]
        )]
        trackers: Vec<String>,
        /// Guest memory.
        #[arg(long, default_value = "1G")]
        memory: String,
        /// kvstore's working set.
        #[arg(long, default_value = "64M")]
        wss: String,
        /// kvstore's operations per second (0: as fast as it can, so that
        /// what tracking costs shows as fewer operations).
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Time between harvests, milliseconds.
        #[arg(long, default_value_t = 100, value_parser = crate::parse::millis)]
        period_ms: u64,
        /// How long each tracker stays on per round, seconds.
        #[arg(long, default_value_t = 2.0, value_parser = crate::parse::seconds_f64)]
        seconds: f64,
        /// Entries of each vCPU's dirty ring in the `ring` tracker's VM (a
        /// power of two; a full ring exits to Hover, which harvests and
        /// re-protects the pages in it).
        #[arg(long, default_value_t = 4096)]
        ring_entries: u32,
        /// Rounds.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        runs: u32,
        /// Directory for the JSON results.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
    /// Pause latency, snapshot time and size, and restore (eager, lazy,
    /// prefetch): time to the vCPUs running, the guest's work in its first
    /// second and the time to 90% of its speed, across guest memory sizes at
    /// a fixed working set.
    Snapshot {
        /// Guest memory sizes (comma-separated).
        #[arg(long, default_value = "256M,1G,4G", value_delimiter = ',')]
        memories: Vec<String>,
        /// The guest's working set (bm's array).
        #[arg(long, default_value = "64M")]
        working_set: String,
        /// Rounds (sizes and modes interleaved within each).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        runs: u32,
        /// Hot-set windows to compare (comma-separated, ms, each at most
        /// 10000): one prefetch row per window, the snapshot taken with
        /// `hot_window_ms` set to it (eager and lazy use the API's default).
        #[arg(long, default_value = "100", value_delimiter = ',',
              value_parser = crate::parse::millis_max::<10_000>)]
        hot_windows_ms: Vec<u64>,
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
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        runs: u32,
        /// Also run the cases (all but the MSI ones) under this peer VMM (`qemu`: QEMU
        /// microvm on the same image), interleaved; skipped with a message
        /// if it is not installed.
        #[arg(long, value_enum)]
        peer: Option<Peer>,
        /// Directory for the JSON results.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
    /// Draw a scenario's plots again from the results file it wrote (e.g.
    /// docs/bench/2026-11-28/apf.json): the stored samples, nothing
    /// measured. The SVGs take the scenario's names (dirty_log.svg from
    /// any dirty-log file): draw an older file into another directory.
    Plot {
        /// The results file (apf.json, boost.json, boot.json, boot_peer.json,
        /// dirty_log.json, halt_poll.json, migrate.json, migrate_peer.json,
        /// migrate_postcopy.json, snapshot.json, or a KVM lab run's figures).
        file: PathBuf,
        /// Directory for the SVGs.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
    },
}

impl Scenario {
    /// Where the scenario writes its results (`--out`).
    pub(super) fn out(&self) -> &std::path::Path {
        match self {
            Scenario::Boot { out, .. }
            | Scenario::Apf { out, .. }
            | Scenario::HaltPoll { out, .. }
            | Scenario::DirtyLog { out, .. }
            | Scenario::Snapshot { out, .. }
            | Scenario::Runtime { out, .. }
            | Scenario::Plot { out, .. } => out,
            Scenario::Migrate(m) => &m.out,
            Scenario::Boost(b) => &b.out,
        }
    }
}

/// A peer VMM for `--peer`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Peer {
    /// QEMU (`qemu-system-x86_64`, Debian package qemu-system-x86).
    Qemu,
}

/// A device of `hover bench halt-poll`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Device {
    /// tmpfs (`--fast-dir`).
    Fast,
    /// A real disk (`--io-dir`).
    Slow,
}

/// A host load of `hover bench boost`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum BoostHost {
    /// Nothing else running.
    Idle,
    /// Hog threads pinned one per CPU (`--hogs`).
    Busy,
}

/// A test of `hover bench boost`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum BoostTest {
    /// The real-time timer task at each of `--intervals`.
    Timer,
    /// The audio task at each of `--buffers`.
    Audio,
    /// The serial line (`--uart-count` bytes).
    Uart,
    /// The rogue guests and the host probe.
    Rogue,
}

/// `hover bench boost`'s flags.
#[derive(Args)]
pub(super) struct BoostArgs {
    /// Seconds per run.
    #[arg(long, default_value_t = 5, value_parser = crate::parse::seconds)]
    pub(super) seconds: u32,
    /// Rounds (modes interleaved within each).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(super) runs: u32,
    /// Timer intervals, microseconds (comma-separated).
    #[arg(long, default_value = "500,1000", value_delimiter = ',', value_parser = crate::parse::micros)]
    pub(super) intervals: Vec<u64>,
    /// Audio buffers, milliseconds (comma-separated).
    #[arg(long, default_value = "2,4,10", value_delimiter = ',', value_parser = crate::parse::millis)]
    pub(super) buffers: Vec<u64>,
    /// Audio computation per buffer, microseconds.
    #[arg(long, default_value_t = 500, value_parser = crate::parse::micros)]
    pub(super) work_us: u64,
    /// Spinning guest tasks beside the real-time one (the rest of a busy guest).
    #[arg(long, default_value_t = 1)]
    pub(super) background: u32,
    /// Host hog threads when the host is busy (0: one per CPU).
    #[arg(long, default_value_t = 0)]
    pub(super) hogs: usize,
    /// Bytes the serial-line test sends per run, one interrupt each.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub(super) uart_count: u64,
    /// Also dynamic boosting with other host tuning, each a mode of
    /// its own (comma-separated): no-keep (--boost-keep-us 0: an
    /// unboost call each time), keep (--boost-keep-us, see --keep-us),
    /// contended (--boost-when contended), keep-contended (both).
    #[arg(long, value_delimiter = ',', value_parser = ["no-keep", "keep", "contended", "keep-contended"])]
    pub(super) variants: Vec<String>,
    /// The keep variant's --boost-keep-us.
    #[arg(long, default_value_t = 2000, value_parser = crate::parse::micros)]
    pub(super) keep_us: u64,
    /// The hosts to run on (comma-separated): idle, busy.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "idle,busy")]
    pub(super) hosts: Vec<BoostHost>,
    /// The tests to run (comma-separated): timer (each of --intervals),
    /// audio (each of --buffers), uart, rogue.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "timer,audio,uart,rogue"
    )]
    pub(super) tests: Vec<BoostTest>,
    /// Directory for the JSON results and the plot.
    #[arg(long, default_value = "bench-results")]
    pub(super) out: PathBuf,
}

/// `hover bench migrate`'s flags.
#[derive(Args)]
pub(super) struct MigrateArgs {
    /// Trackers (comma-separated).
    #[arg(
        long,
        default_value = "bitmap,manual,hybrid,ring",
        value_delimiter = ',',
        value_parser = ["bitmap", "manual", "hybrid", "ring"],
        conflicts_with = "peer"
    )]
    pub(super) trackers: Vec<String>,
    /// Guest memory sizes (comma-separated).
    #[arg(long, default_value = "256M,1G,4G", value_delimiter = ',')]
    pub(super) memories: Vec<String>,
    /// kvstore's working sets (comma-separated).
    #[arg(long, default_value = "16M,64M", value_delimiter = ',')]
    pub(super) wss: Vec<String>,
    /// kvstore's operations per second.
    #[arg(long, default_value_t = 100_000)]
    pub(super) rate: u64,
    /// Batch sizes (pages, comma-separated, each 1 to 4096).
    #[arg(
        long,
        default_value = "1,16,256,1024",
        value_delimiter = ',',
        conflicts_with = "peer"
    )]
    pub(super) batches: Vec<usize>,
    /// Rounds.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(super) runs: u32,
    /// The link between the two VMMs: a Unix socket, or TCP on loopback.
    #[arg(long, default_value = "unix", value_parser = ["unix", "tcp"], conflicts_with = "peer")]
    pub(super) transport: String,
    /// precopy: the trackers, batching and mapping tables (seeds 3, 4);
    /// postcopy: post-copy with async PF on and off beside pre-copy and
    /// hybrid over a link with latency and a rate limit (seeds 1+3+4).
    #[arg(long, default_value = "precopy", value_parser = ["precopy", "postcopy"])]
    pub(super) mode: String,
    /// Pre-copy beside this peer VMM instead of the trackers, batching
    /// and mapping tables (`qemu`: QEMU microvm migrating the same
    /// 1-vCPU kvstore guest over TCP, dirty bitmap and dirty ring, beside
    /// `hover` with `bitmap` and `ring`; `--memories`, `--wss`, `--rate`
    /// and `--runs` apply); skipped with a message if it is not installed.
    #[arg(long, value_enum)]
    pub(super) peer: Option<Peer>,
    /// Post-copy: the link's rate each way, Mbit/s.
    #[arg(long, default_value_t = 200, conflicts_with = "peer")]
    pub(super) link_mbit: u64,
    /// Post-copy: the link's one-way latency, ms.
    #[arg(long, default_value_t = 1.0, conflicts_with = "peer", value_parser = crate::parse::millis_f64)]
    pub(super) link_delay_ms: f64,
    /// Post-copy: guest memory.
    #[arg(long, default_value = "1G", conflicts_with = "peer")]
    pub(super) postcopy_memory: String,
    /// Post-copy: bm's array, the memory the faulting tasks write.
    #[arg(long, default_value = "128M", conflicts_with = "peer")]
    pub(super) postcopy_array: String,
    /// Post-copy: how long bm runs per sample (warm-up and migration included), s.
    #[arg(long, default_value_t = 18, conflicts_with = "peer", value_parser = crate::parse::seconds)]
    pub(super) postcopy_seconds: u32,
    /// Directory for the JSON results and the plot.
    #[arg(long, default_value = "bench-results")]
    pub(super) out: PathBuf,
}

impl BoostArgs {
    /// Every value in range, or one line naming the flag that is not.
    pub(super) fn check(&self) -> Result<(), String> {
        if let Some(i) = self
            .intervals
            .iter()
            .find(|&&i| !(10..=1_000_000).contains(&i))
        {
            return Err(format!(
                "--intervals: {i} us is out of range: give 10 to 1000000"
            ));
        }
        let work_us = self.work_us;
        if let Some(m) = self
            .buffers
            .iter()
            .find(|&&m| work_us >= m * 1000 || m > 1000)
        {
            return Err(format!("--buffers: a {m} ms buffer cannot hold --work-us {work_us} (buffers are 1 to 1000 ms, longer than the work)"));
        }
        let max_keep = hover_vmm::config::boost::MAX_KEEP_US;
        if self.keep_us > max_keep {
            return Err(format!(
                "--keep-us {} is out of range: give 0 to {max_keep}",
                self.keep_us
            ));
        }
        if self.background > 16 {
            return Err(format!(
                "--background {} is out of range: give 0 to 16",
                self.background
            ));
        }
        if self.hogs > 256 {
            return Err(format!(
                "--hogs {} is out of range: give 0 to 256",
                self.hogs
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        boost: BoostArgs,
    }

    fn check(args: &[&str]) -> Result<(), String> {
        let mut argv = vec!["boost"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).unwrap().boost.check()
    }

    #[test]
    fn boost_flags_are_checked_on_their_own_type() {
        assert_eq!(check(&[]), Ok(()), "the defaults");
        for (args, says) in [
            (&["--intervals", "5"][..], "--intervals: 5 us"),
            (
                &["--buffers", "1", "--work-us", "1000"][..],
                "--buffers: a 1 ms buffer",
            ),
            (&["--keep-us", "100001"][..], "--keep-us 100001"),
            (&["--hogs", "257"][..], "--hogs 257 is out of range"),
            (
                &["--background", "17"][..],
                "--background 17 is out of range",
            ),
        ] {
            let e = check(args).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
        for refused in [
            &["--seconds", "0"][..],
            &["--runs", "0"][..],
            &["--uart-count", "0"][..],
        ] {
            let mut argv = vec!["boost"];
            argv.extend_from_slice(refused);
            assert!(Cli::try_parse_from(argv).is_err(), "{refused:?}");
        }
    }
}
