//! `hover ctl`: steer a running VM through its API socket (and `hover
//! stats`, its alias for `ctl stats`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use hover_vmm::api::{
    ApiClient, ApiError, BalloonRequest, Endpoint, HaltPollRequest, MigrateRequest, SnapshotRequest,
};
use hover_vmm::config::boost::{BoostMode, BoostUpdate, BoostWhen};
use hover_vmm::migration::mapper::MapMode;
use hover_vmm::migration::postcopy::Mode;
use hover_vmm::migration::Tracker;

use crate::{die_on_broken_pipe, output, EXIT_BAD_INPUT, EXIT_HOST_FAILURE};

#[derive(Args)]
pub struct CtlArgs {
    /// The VM's API socket (`hover run --api-socket`).
    #[arg(long)]
    pub api_socket: PathBuf,
    /// Print the VM's JSON answer instead of a summary (`metrics` is
    /// Prometheus text either way).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub action: CtlAction,
}

/// `hover ctl migrate`'s flags.
#[derive(Args)]
pub struct MigrateArgs {
    /// Where: tcp:HOST:PORT or unix:PATH.
    #[arg(long)]
    to: String,
    /// How dirty pages are found: KVM's dirty bitmap (bitmap), the bitmap
    /// with manual re-protection (manual), sections the guest keeps
    /// writing left unprotected and sent at the end (hybrid, seed 4), or
    /// per-vCPU dirty rings (ring; a VM started with --dirty-ring, and
    /// then only ring).
    #[arg(long, default_value = "bitmap", value_parser = listed::<Tracker>(&["bitmap", "manual", "hybrid", "ring"]))]
    dirty_tracking: Tracker,
    /// The longest pause allowed for the final round, milliseconds.
    #[arg(long, default_value_t = hover_vmm::migration::DEFAULT_DOWNTIME.as_millis() as u64, value_parser = crate::parse::millis)]
    downtime_ms: u64,
    /// Pages per batch sent (1: one frame per page, the baseline).
    #[arg(long, default_value_t = hover_vmm::migration::DEFAULT_BATCH_PAGES)]
    batch_pages: usize,
    /// Bytes per second the migration may use, binary units (100M: 100
    /// MiB/s) [default: no limit].
    #[arg(long, value_parser = crate::parse::parse_size)]
    bandwidth: Option<u64>,
    /// Give up (and keep running here) after this long: seconds (120)
    /// or a duration (2m, 90s; whole seconds, rounded up), at most 60m.
    #[arg(long, default_value = "2m", value_parser = crate::parse::parse_timeout)]
    timeout: std::time::Duration,
    /// Send a digest of memory for the destination to check before running.
    #[arg(long)]
    verify: bool,
    /// Slow vCPUs that dirty memory faster than the link moves it (the
    /// dirtiest ones with --dirty-tracking ring, all of them otherwise).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    auto_converge: String,
    /// The first throttle, percent of a vCPU's time taken away.
    #[arg(long, default_value_t = hover_vmm::migration::throttle::DEFAULT_INITIAL_PCT)]
    throttle_initial: u8,
    /// Added per further round that does not converge, percent.
    #[arg(long, default_value_t = hover_vmm::migration::throttle::DEFAULT_STEP_PCT)]
    throttle_step: u8,
    /// The most a vCPU is throttled, percent (at most 99).
    #[arg(long, default_value_t = hover_vmm::migration::throttle::MAX_PCT)]
    throttle_max: u8,
    /// Send from a separate process that reads guest memory by mmap of
    /// each page (per-page), process_vm_readv per batch (readv) or one
    /// mapping made once (persistent); the mapping ones need
    /// --memory-backend memfd [default: the VMM sends itself].
    #[arg(long, value_parser = listed::<MapMode>(&["per-page", "readv", "persistent"]))]
    sender_process: Option<MapMode>,
    /// How memory moves: every page before the guest runs there
    /// (precopy), the guest runs there at once and memory follows on
    /// demand and in the background (postcopy), or pre-copy rounds
    /// until they stop converging, then post-copy (hybrid).
    #[arg(long, default_value = "precopy", value_parser = listed::<Mode>(&["precopy", "postcopy", "hybrid"]))]
    mode: Mode,
    /// Reconnect a post-copy migration whose connection broke (the VM
    /// here is postcopy-paused) to the destination, which waits at its
    /// --listen address.
    #[arg(long)]
    recover: bool,
    /// Over TCP without a migration key (the VMM was started without
    /// --migration-key): anyone who can reach or imitate the
    /// destination gets the VM, and frames carry only a CRC.
    #[arg(long)]
    insecure: bool,
}

impl MigrateArgs {
    /// The `PUT /vm/migrate` body these flags ask for.
    fn body(&self) -> MigrateRequest {
        let timeout = self.timeout;
        MigrateRequest {
            to: self.to.clone(),
            dirty_tracking: Some(self.dirty_tracking),
            downtime_ms: Some(self.downtime_ms),
            batch_pages: Some(self.batch_pages),
            bandwidth: self.bandwidth,
            // Whole seconds, rounded up: the API's unit.
            timeout_s: Some(timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0)),
            verify: self.verify,
            auto_converge: Some(self.auto_converge == "on"),
            throttle_initial: Some(self.throttle_initial),
            throttle_step: Some(self.throttle_step),
            throttle_max: Some(self.throttle_max),
            sender_process: self.sender_process,
            mode: Some(self.mode),
            recover: self.recover,
            insecure: self.insecure,
        }
    }
}

#[derive(Subcommand)]
pub enum CtlAction {
    /// The VM's state, configuration and uptime.
    Get,
    /// Stop every vCPU and freeze the devices.
    Pause,
    /// Let a paused VM run again.
    Resume,
    /// End the VM now (the guest does not power off itself).
    Shutdown,
    /// Write the VM's state and memory to a new file (pausing it meanwhile),
    /// then let it run on, or end it with --stop.
    Snapshot {
        /// The file to create (an existing path is refused).
        path: PathBuf,
        /// End the VM once the snapshot is written.
        #[arg(long)]
        stop: bool,
        /// Before pausing, watch which pages the guest writes for this many
        /// milliseconds (0-10000): the hot set that `hover restore
        /// --memory-restore prefetch` loads first.
        #[arg(long, default_value_t = hover_vmm::api::DEFAULT_HOT_WINDOW_MS, value_parser = crate::parse::millis)]
        hot_window_ms: u64,
    },
    /// Move the running VM to `hover receive` at ADDR, live (pre-copy,
    /// post-copy or hybrid: --mode). Over TCP the VMMs prove a shared
    /// --migration-key (or --insecure). The VM here ends once the guest runs
    /// there; on any failure before that it runs on here.
    Migrate(MigrateArgs),
    /// Have the hybrid migration under way switch to post-copy after its
    /// current round.
    Postcopy,
    /// Live figures: KVM statistics, pager, governor, I/O device.
    Stats,
    /// The Prometheus text exposition (`GET /metrics`).
    Metrics,
    /// Change vCPU priority boosting live; what is not given stays.
    Boost {
        /// off, dynamic or static.
        #[arg(long, value_parser = boost_modes())]
        mode: Option<BoostMode>,
        /// `fifo[:PRIO]` or `nice[:VALUE]`.
        #[arg(long)]
        policy: Option<String>,
        /// CPU time a boost may run before it is revoked, ms.
        #[arg(long, value_parser = crate::parse::millis)]
        max_ms: Option<u64>,
        /// No boost for this long after a revocation, ms.
        #[arg(long, value_parser = crate::parse::millis)]
        cooldown_ms: Option<u64>,
        /// Most boosts per vCPU per second.
        #[arg(long)]
        max_rate: Option<u32>,
        /// The boost monitor's period, us.
        #[arg(long, value_parser = crate::parse::micros)]
        poll_us: Option<u64>,
        /// When boosts are granted: always, or only while the vCPU thread
        /// has lately waited for a CPU (contended).
        #[arg(long, value_parser = boost_whens())]
        when: Option<BoostWhen>,
        /// Keep a boost across a gap up to this long when the guest's next
        /// real-time wake-up is announced, us (0: never; at most 100000).
        #[arg(long, value_parser = crate::parse::micros)]
        keep_us: Option<u64>,
        /// A host-side boost (a vCPU with no boost area: a Linux guest)
        /// ends when the vCPU halts or after this much of its thread's CPU
        /// time, us (50 to 100000).
        #[arg(long, value_parser = crate::parse::micros)]
        irq_us: Option<u64>,
    },
    /// Set the balloon's target (`--target SIZE`: what the guest gives
    /// back; 0 returns it all) or its statistics interval (`--stats
    /// SECONDS`); prints the balloon's report.
    Balloon {
        /// What the guest is asked to give back: whole MiB (e.g. 64M, 0).
        #[arg(long, value_parser = crate::parse::parse_size)]
        target: Option<u64>,
        /// Seconds between requests for the guest's statistics (0: none;
        /// `5` or `5s`, `1m`).
        #[arg(long, value_parser = crate::parse::whole_seconds)]
        stats: Option<u32>,
    },
    /// Change halt polling: `--window-ns N`, `--auto [--budget PCT]` or `--kvm-default`.
    HaltPoll {
        /// A fixed maximum window, nanoseconds (0: no polling; at most 10 ms).
        #[arg(long, conflicts_with_all = ["auto", "kvm_default"], value_parser = crate::parse::nanos)]
        window_ns: Option<u64>,
        /// The governor.
        #[arg(long, conflicts_with = "kvm_default")]
        auto: bool,
        /// The governor's CPU budget, percent of one CPU per vCPU.
        #[arg(long, requires = "auto")]
        budget: Option<f64>,
        /// KVM's module-wide default window.
        #[arg(long)]
        kvm_default: bool,
    },
}

/// A request body as JSON (the types serialize to objects; nothing fails).
fn to_json<T: serde::Serialize>(body: &T) -> String {
    serde_json::to_string(body).expect("a request body serializes")
}

/// `--mode` of `hover ctl boost`: the values listed in `--help`, each
/// one a mode.
/// A flag whose values are `names` (listed in `--help`), each parsed into
/// the API's own type.
fn listed<T>(names: &'static [&'static str]) -> impl clap::builder::TypedValueParser<Value = T>
where
    T: std::str::FromStr<Err = String> + Clone + Send + Sync + 'static,
{
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(names).try_map(|s| s.parse::<T>())
}

fn boost_modes() -> impl clap::builder::TypedValueParser<Value = BoostMode> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["off", "dynamic", "static"])
        .map(|s| s.parse::<BoostMode>().expect("a listed mode parses"))
}

/// `--when` of `hover ctl boost` (and `--boost-when`): the values listed
/// in `--help`.
pub(crate) fn boost_whens() -> impl clap::builder::TypedValueParser<Value = BoostWhen> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["always", "contended"])
        .map(|s| s.parse::<BoostWhen>().expect("a listed condition parses"))
}

/// The endpoint and body of `action`'s request (a flag the API would
/// refuse is refused here, exit 2).
fn request(action: &CtlAction) -> Result<(Endpoint, Option<String>), ExitCode> {
    Ok(match action {
        CtlAction::Get => (Endpoint::Info, None),
        CtlAction::Pause => (Endpoint::Pause, None),
        CtlAction::Resume => (Endpoint::Resume, None),
        CtlAction::Shutdown => (Endpoint::Shutdown, None),
        CtlAction::Stats => (Endpoint::Stats, None),
        CtlAction::Migrate(m) => (Endpoint::Migrate, Some(to_json(&m.body()))),
        CtlAction::Metrics => (Endpoint::Metrics, None),
        CtlAction::Postcopy => (Endpoint::Postcopy, None),
        CtlAction::Snapshot {
            path,
            stop,
            hot_window_ms,
        } => {
            // The VM resolves paths from its own directory: send an absolute one.
            let path = std::env::current_dir()
                .map(|d| d.join(path))
                .unwrap_or_else(|_| path.clone());
            let body = SnapshotRequest {
                path,
                stop: *stop,
                hot_window_ms: Some(*hot_window_ms),
            };
            (Endpoint::Snapshot, Some(to_json(&body)))
        }
        CtlAction::HaltPoll {
            window_ns,
            auto,
            budget,
            kvm_default,
        } => {
            let request = |mode: &str, window_ns, budget_pct| HaltPollRequest {
                mode: mode.into(),
                window_ns,
                budget_pct,
            };
            let body = match (window_ns, auto, kvm_default) {
                (Some(ns), _, _) => request("fixed", Some(*ns), None),
                (None, true, _) => request("auto", None, *budget),
                (None, false, true) => request("kvm-default", None, None),
                (None, false, false) => {
                    eprintln!(
                        "hover: error: halt-poll needs --window-ns N, --auto or --kvm-default"
                    );
                    return Err(ExitCode::from(EXIT_BAD_INPUT));
                }
            };
            (Endpoint::HaltPoll, Some(to_json(&body)))
        }
        CtlAction::Balloon { target, stats } => {
            if target.is_none() && stats.is_none() {
                eprintln!("hover: error: balloon needs --target SIZE, --stats SECONDS or both");
                return Err(ExitCode::from(EXIT_BAD_INPUT));
            }
            if let Some(t) = target.filter(|t| t % (1 << 20) != 0) {
                eprintln!("hover: error: --target {t}: give whole MiB (e.g. 64M, 0)");
                return Err(ExitCode::from(EXIT_BAD_INPUT));
            }
            let body = BalloonRequest {
                target_mib: target.map(|t| t >> 20),
                stats_polling_interval_s: *stats,
            };
            (Endpoint::Balloon, Some(to_json(&body)))
        }
        CtlAction::Boost {
            mode,
            policy,
            max_ms,
            cooldown_ms,
            max_rate,
            poll_us,
            when,
            keep_us,
            irq_us,
        } => {
            let body = BoostUpdate {
                mode: *mode,
                policy: policy.clone(),
                max_ms: *max_ms,
                cooldown_ms: *cooldown_ms,
                max_rate: *max_rate,
                poll_us: *poll_us,
                when: *when,
                keep_us: *keep_us,
                irq_us: *irq_us,
            };
            (Endpoint::Boost, Some(to_json(&body)))
        }
    })
}

/// Carry out `hover ctl`.
pub fn ctl(args: CtlArgs) -> ExitCode {
    die_on_broken_pipe();
    let client = ApiClient::new(&args.api_socket, Duration::from_secs(600));
    let (endpoint, body) = match request(&args.action) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if let CtlAction::Migrate(_) = args.action {
        return match migrate_with_progress(&args.api_socket, body.as_deref()) {
            Ok(v) if args.json => {
                println!("{v}");
                ExitCode::SUCCESS
            }
            Ok(v) => {
                output::print_ctl("migrate", &v);
                ExitCode::SUCCESS
            }
            Err(e) => ctl_error(&e),
        };
    }
    if let CtlAction::Metrics = args.action {
        if args.json {
            eprintln!(
                "hover: error: metrics are Prometheus text only; for JSON use `hover ctl --json stats`"
            );
            return ExitCode::from(EXIT_BAD_INPUT);
        }
        return match client.call(endpoint.method(), endpoint.path(), None) {
            Ok(r) if r.status == 200 => {
                print!("{}", r.body);
                ExitCode::SUCCESS
            }
            Ok(r) => {
                eprintln!(
                    "hover: error: the VM answered HTTP {}: {}",
                    r.status, r.body
                );
                ExitCode::from(EXIT_HOST_FAILURE)
            }
            Err(e) => ctl_error(&e),
        };
    }
    match client.send(endpoint, body.as_deref()) {
        Ok(v) if args.json => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Ok(v) => {
            output::print_ctl(args.action_name(), &v);
            ExitCode::SUCCESS
        }
        Err(e) => ctl_error(&e),
    }
}

impl CtlArgs {
    fn action_name(&self) -> &'static str {
        match self.action {
            CtlAction::Get => "get",
            CtlAction::Pause => "pause",
            CtlAction::Resume => "resume",
            CtlAction::Shutdown => "shutdown",
            CtlAction::Snapshot { .. } => "snapshot",
            CtlAction::Stats => "stats",
            CtlAction::Metrics => "metrics",
            CtlAction::Migrate(_) => "migrate",
            CtlAction::HaltPoll { .. } => "halt-poll",
            CtlAction::Boost { .. } => "boost",
            CtlAction::Balloon { .. } => "balloon",
            CtlAction::Postcopy => "postcopy",
        }
    }
}

fn ctl_error(e: &ApiError) -> ExitCode {
    match e {
        // The VM names the request's field; the user gave ctl's flag.
        ApiError::Refused {
            field: Some(field), ..
        } if field != "body" => eprintln!("hover: error: {}: {e}", ctl_flag(field)),
        _ => eprintln!("hover: error: {e}"),
    }
    ExitCode::from(match e {
        ApiError::Connect { .. } => EXIT_BAD_INPUT,
        ApiError::Refused { status, .. } if (400..500).contains(status) => EXIT_BAD_INPUT,
        _ => EXIT_HOST_FAILURE,
    })
}

/// The `hover ctl` flag that sets the API's request field `field`: the
/// field's name with dashes, but where ctl's flag is shorter.
fn ctl_flag(field: &str) -> String {
    match field {
        "budget_pct" => "--budget".into(),
        "timeout_s" => "--timeout".into(),
        "target_mib" => "--target".into(),
        "path" => "PATH".into(),
        "stats_polling_interval_s" => "--stats".into(),
        "to" => "--to".into(),
        f => format!("--{}", f.replace('_', "-")),
    }
}

/// Send the migration request and, while it runs, show its progress from
/// `GET /vm` on stderr: a spinner line on a terminal, otherwise a line a
/// second while there is news.
fn migrate_with_progress(
    socket: &std::path::Path,
    body: Option<&str>,
) -> Result<serde_json::Value, ApiError> {
    let body = body.map(str::to_string);
    let sock = socket.to_path_buf();
    let request = std::thread::spawn(move || {
        ApiClient::new(&sock, Duration::from_secs(3600)).send(Endpoint::Migrate, body.as_deref())
    });
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message("connecting");
    // Without a terminal (a log, a CI job) the spinner draws nothing: a
    // line a second instead, when there is news.
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (mut said, mut said_at) = (String::new(), None::<std::time::Instant>);
    let poll = ApiClient::new(socket, Duration::from_secs(2));
    while !request.is_finished() {
        if let Ok(v) = poll.send(Endpoint::Info, None) {
            let m = &v["migration"];
            if !m.is_null() {
                let throttle: Vec<u64> = m["vcpu_throttle_pct"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
                    .unwrap_or_default();
                let throttle = if throttle.iter().any(|&p| p > 0) {
                    format!(", vCPUs throttled {throttle:?}%")
                } else {
                    String::new()
                };
                let line = format!(
                    "round {}: {} pages sent, {} dirty, {:.0} MB/s, final round now ~{:.1} ms{throttle}",
                    m["round"],
                    m["pages_sent"],
                    m["dirty_pages"],
                    m["rate_mb_s"].as_f64().unwrap_or(0.0),
                    m["expected_downtime_ms"].as_f64().unwrap_or(0.0)
                );
                if !tty
                    && line != said
                    && said_at.is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
                {
                    eprintln!("hover: migrating: {line}");
                    (said, said_at) = (line.clone(), Some(std::time::Instant::now()));
                }
                bar.set_message(line);
            }
        }
        bar.tick();
        std::thread::sleep(Duration::from_millis(100));
    }
    bar.finish_and_clear();
    request.join().unwrap_or_else(|_| {
        Err(ApiError::BadReply {
            path: socket.into(),
            reason: "the request thread panicked".into(),
        })
    })
}
