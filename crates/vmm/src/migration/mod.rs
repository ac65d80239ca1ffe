//! Live migration: pre-copy (the source keeps its guest running while it
//! sends memory in rounds, each round the pages the guest wrote during the
//! last one, until what is left fits the downtime target; then it pauses,
//! sends the rest and the state), post-copy (the guest runs at the
//! destination at once and its memory follows: `postcopy`) and hybrid
//! (pre-copy rounds, then post-copy).
//!
//! Here: the dirty trackers (`dirty`), the stream format (`wire`, framed
//! and MAC'd: `mac`, `auth` for the pre-shared key's proof), the
//! connections (`transport`, `opening` for a recovery's), what each frame
//! means (`message`), what a round
//! sends (`page_lists`, `batch`, `page_sender` sending it within the
//! bandwidth, `sender` and `mapper` for the sending process of seed 3),
//! pre-copy's rounds as a policy (`precopy`: the link's rate, the
//! throttle, and `convergence`'s when to pause, switch or give up; auto-
//! converge's `throttle`), what the destination received (`received`),
//! and the request's options below. The source side runs in the VM's control loop
//! (`vm/source/`), the destination side is [`crate::Vm::receive`]
//! (`vm/destination/`). docs/MIGRATION.md.

pub mod auth;
pub mod batch;
pub mod convergence;
pub mod dirty;
pub mod mac;
pub mod mapper;
pub mod message;
pub mod opening;
pub mod page_lists;
pub mod page_sender;
pub mod postcopy;
pub mod precopy;
pub mod received;
pub mod sender;
pub mod throttle;
pub mod transport;
pub mod wire;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use transport::Addr;
use wire::WireError;

/// How dirty pages are found (in JSON by the names `--dirty-tracking` takes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tracker {
    /// `KVM_GET_DIRTY_LOG`.
    #[default]
    Bitmap,
    /// `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` with chunked `KVM_CLEAR_DIRTY_LOG`.
    Manual,
    /// Per-vCPU dirty rings.
    Ring,
    /// Sections that stay hot are not re-protected (seed 4).
    Hybrid,
}

impl std::str::FromStr for Tracker {
    type Err = String;
    fn from_str(s: &str) -> Result<Tracker, String> {
        Ok(match s {
            "bitmap" => Tracker::Bitmap,
            "manual" => Tracker::Manual,
            "ring" => Tracker::Ring,
            "hybrid" => Tracker::Hybrid,
            _ => {
                return Err(format!(
                    "unknown dirty tracking '{s}': use bitmap, manual, ring or hybrid"
                ))
            }
        })
    }
}

/// Default downtime target.
pub const DEFAULT_DOWNTIME: Duration = Duration::from_millis(100);
/// Default pages per batch.
pub const DEFAULT_BATCH_PAGES: usize = 256;
/// Default time a migration may take before it gives up.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// What a migration is asked to do.
#[derive(Clone, Debug)]
pub struct MigrateOptions {
    /// The destination (`hover receive --listen` there).
    pub to: Addr,
    /// How dirty pages are found.
    pub tracker: Tracker,
    /// The longest pause the final round may take.
    pub downtime: Duration,
    /// Pages per batch (1: a frame per page, the baseline).
    pub batch_pages: usize,
    /// Bytes per second the sender may use (`None`: as fast as it can).
    pub bandwidth: Option<u64>,
    /// Give up (and resume) after this long.
    pub timeout: Duration,
    /// Send a digest of memory for the destination to check before it runs.
    pub verify: bool,
    /// Slowing vCPUs that outrun the link.
    pub throttle: throttle::ThrottleSettings,
    /// Send from a separate process that reads guest memory this way
    /// (`None`: the VMM's own thread sends).
    pub sender_process: Option<mapper::MapMode>,
    /// How memory moves.
    pub mode: postcopy::Mode,
    /// Reconnect a post-copy migration whose connection broke (the VM is
    /// `postcopy-paused`) instead of starting one.
    pub recover: bool,
    /// Allow TCP without a migration key: anyone who can reach or imitate
    /// the destination gets the VM.
    pub insecure: bool,
}

impl MigrateOptions {
    /// Options with defaults, to `to`.
    pub fn to(to: Addr) -> Self {
        MigrateOptions {
            to,
            tracker: Tracker::default(),
            downtime: DEFAULT_DOWNTIME,
            batch_pages: DEFAULT_BATCH_PAGES,
            bandwidth: None,
            timeout: DEFAULT_TIMEOUT,
            verify: false,
            throttle: throttle::ThrottleSettings::default(),
            sender_process: None,
            mode: postcopy::Mode::Precopy,
            recover: false,
            insecure: false,
        }
    }

    /// Check the values: `(field, reason)` of the first bad one.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.batch_pages == 0 || self.batch_pages > wire::MAX_BATCH {
            return Err((
                "batch_pages",
                format!(
                    "batch_pages {} is out of range: give 1 to {}",
                    self.batch_pages,
                    wire::MAX_BATCH
                ),
            ));
        }
        if self.downtime.is_zero() || self.downtime > Duration::from_secs(60) {
            return Err((
                "downtime_ms",
                format!(
                    "downtime_ms {} is out of range: give 1 to 60000",
                    self.downtime.as_millis()
                ),
            ));
        }
        if self.bandwidth == Some(0) {
            return Err((
                "bandwidth",
                "bandwidth 0 bytes per second moves nothing".into(),
            ));
        }
        if self.mode != postcopy::Mode::Precopy && self.sender_process.is_some() {
            return Err((
                "sender_process",
                "post-copy serves page requests from the VMM's own thread: leave sender_process out".into(),
            ));
        }
        if self.timeout.is_zero() {
            return Err((
                "timeout_s",
                "timeout_s 0: a migration needs some time".into(),
            ));
        }
        self.throttle.check()
    }
}

/// What a migration did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MigrationReport {
    /// The destination.
    pub to: String,
    /// How memory moved: `precopy`, or `postcopy` (also when a hybrid
    /// migration switched).
    pub mode: String,
    /// The post-copy phase, if there was one.
    pub postcopy: Option<postcopy::PostcopyReport>,
    /// Whether both ends proved the migration key and every frame carried
    /// a MAC (`false`: a Unix socket, or TCP with `insecure`).
    pub authenticated: bool,
    /// The tracker.
    pub tracker: String,
    /// Pages per batch.
    pub batch_pages: usize,
    /// From the request to the destination confirming, milliseconds.
    pub total_ms: f64,
    /// The source's pause (final round, state, confirmation), milliseconds.
    pub downtime_ms: f64,
    /// The gap the guest saw: its TSC from the pause on the source to the
    /// destination's RUNNING (stamped as it is sent; the destination's
    /// vCPUs, started and held, are let go right after), milliseconds.
    pub guest_downtime_ms: f64,
    /// Where the downtime went.
    pub downtime_breakdown: DowntimeBreakdown,
    /// Waiting, before the pause, for the destination to apply everything
    /// sent so far (a `SYNC` round trip; two when the first outlasted the
    /// downtime target and one more round followed), microseconds: on a slow link the
    /// socket buffers and any relay between hold rounds already "sent",
    /// which the pause would otherwise wait behind.
    pub drain_us: u64,
    /// Rounds, the final one included.
    pub rounds: u32,
    /// Pages sent in each round.
    pub round_pages: Vec<u64>,
    /// Time each round's harvest of dirty pages took (the final one
    /// included, the guest paused), microseconds: what a tracker costs the
    /// sender, which seed 4 wants flat in the guest's size.
    pub harvest_us: Vec<u64>,
    /// Pages sent in all.
    pub pages_sent: u64,
    /// Bytes sent in all (frames included).
    pub bytes_sent: u64,
    /// Whether the sender held back to respect the bandwidth limit.
    pub throttled: bool,
    /// CPU time the sending thread used, microseconds (reading, copying,
    /// CRCs, system calls).
    pub sender_cpu_us: u64,
    /// With a sender process: the CPU time it used, microseconds.
    pub sender_process_cpu_us: u64,
    /// With a sender process: how it read guest memory.
    pub sender_process: Option<mapper::MapMode>,
    /// With rings: vCPU stops on a full ring during the migration.
    pub ring_full_exits: u64,
    /// The highest throttle each vCPU reached, percent (0: never slowed).
    pub vcpu_throttle_pct: Vec<u8>,
    /// Time each vCPU slept for its throttle, milliseconds.
    pub vcpu_throttled_ms: Vec<f64>,
}

/// Where a migration's downtime (`downtime_ms`) went, microseconds, in the
/// order it is spent; the parts add up to the downtime but for the few
/// steps between them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DowntimeBreakdown {
    /// Stopping every vCPU.
    pub pause_us: u64,
    /// The tracker's last harvest and the monitor's own writes.
    pub final_harvest_us: u64,
    /// Sending the final round's pages (post-copy: the pinned boot area's).
    pub final_pages_us: u64,
    /// Reading the vCPUs' and devices' state and sending it (post-copy:
    /// with the list of pages still to come).
    pub state_us: u64,
    /// With `verify`: digesting guest memory and sending the digest.
    pub verify_us: u64,
    /// The destination, from the stream's end to its vCPUs being ready:
    /// building devices and the pager, checking, loading the state (as it
    /// reports it).
    pub destination_load_us: u64,
    /// The rest of the wait for the destination's answer: the link's
    /// latency and the frames still in flight.
    pub ack_us: u64,
}

impl DowntimeBreakdown {
    /// The parts added up, microseconds.
    pub fn total_us(&self) -> u64 {
        self.pause_us
            + self.final_harvest_us
            + self.final_pages_us
            + self.state_us
            + self.verify_us
            + self.destination_load_us
            + self.ack_us
    }
}

/// Microseconds since `t`, and `t` moved to now: for timing steps in turn.
pub(crate) fn lap_us(t: &mut std::time::Instant) -> u64 {
    let now = std::time::Instant::now();
    let us = now.duration_since(*t).as_micros() as u64;
    *t = now;
    us
}

/// Why a migration failed. The source runs on.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// The destination could not be reached.
    #[error("cannot reach the destination {to}: {source}")]
    Connect {
        /// Where.
        to: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The destination refused.
    #[error("the destination refused: {0}")]
    Refused(String),
    /// The peer did not prove it holds the migration key, or the two ends
    /// disagree on authenticating.
    #[error("migration authentication failed: {0}")]
    Auth(String),
    /// The stream broke or was malformed.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// Dirty tracking failed.
    #[error(transparent)]
    Dirty(#[from] dirty::DirtyError),
    /// The guest dirties memory faster than the link moves it.
    #[error("{0}")]
    NoConvergence(String),
    /// The post-copy phase stopped: the guest runs at the destination and
    /// this VM is `postcopy-paused`, keeping what the destination lacks.
    #[error("post-copy stopped ({0}); the guest runs at the destination and this VM keeps the pages it still lacks: reconnect with `hover ctl migrate --recover --to ADDR`")]
    PostcopyInterrupted(String),
    /// The guest powered off or crashed while migrating.
    #[error("the guest stopped while migrating")]
    GuestEnded,
    /// A section of the stream does not fit this host or build.
    #[error("{section} frame at offset {offset}: {reason}")]
    Unfit {
        /// The frame.
        section: &'static str,
        /// Where it started.
        offset: u64,
        /// Why.
        reason: String,
    },
    /// The destination's wait for a source ended without one.
    #[error(transparent)]
    Waited(#[from] opening::WaitError),
    /// The connection to the peer failed while sending or waiting.
    #[error("the link to the destination failed ({0})")]
    Link(String),
    /// A host-side failure.
    #[error("{0}")]
    Host(String),
    /// A post-copy's destination did not get every page.
    #[error("post-copy: {0}")]
    Postcopy(#[from] postcopy::PostcopyError),
}

impl MigrationError {
    /// A failure of this host while doing `what` (reading guest memory,
    /// the sender process, a timeout it could not set).
    pub fn host(what: &str, e: std::io::Error) -> MigrationError {
        MigrationError::Host(format!("{what}: {e}"))
    }

    /// A failure of the connection itself while doing `what` (the peer
    /// died, stalled or closed): the other side's fault, not this host's;
    /// a stall is said as one.
    pub fn link(what: &str, e: std::io::Error) -> MigrationError {
        MigrationError::Link(match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                format!("{what}: the destination stopped reading (timed out)")
            }
            _ => format!("{what}: {e}"),
        })
    }

    /// Whether the other side or its input is at fault (bad stream,
    /// unfit VM, refusal), rather than this host.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            MigrationError::Wire(_)
                | MigrationError::Unfit { .. }
                | MigrationError::Refused(_)
                | MigrationError::Auth(_)
        )
    }
}

/// Transfer time of `pages` at `bytes_per_sec`.
pub fn transfer_time(pages: u64, bytes_per_sec: f64) -> Duration {
    if pages == 0 {
        return Duration::ZERO;
    }
    if bytes_per_sec <= 0.0 {
        return Duration::MAX;
    }
    Duration::from_secs_f64(pages as f64 * 4096.0 / bytes_per_sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        let o = MigrateOptions::to("unix:/x".parse().unwrap());
        assert!(o.check().is_ok());
        let bad = |f: &dyn Fn(&mut MigrateOptions)| {
            let mut o = o.clone();
            f(&mut o);
            o.check().unwrap_err().0
        };
        assert_eq!(bad(&|o| o.batch_pages = 0), "batch_pages");
        assert_eq!(bad(&|o| o.batch_pages = 1 << 20), "batch_pages");
        assert_eq!(bad(&|o| o.downtime = Duration::ZERO), "downtime_ms");
        assert_eq!(bad(&|o| o.bandwidth = Some(0)), "bandwidth");
        assert_eq!(bad(&|o| o.timeout = Duration::ZERO), "timeout_s");
        assert_eq!(bad(&|o| o.throttle.step = 0), "throttle_step");
        assert_eq!("ring".parse::<Tracker>().unwrap(), Tracker::Ring);
        assert!("often".parse::<Tracker>().is_err());
    }

    #[test]
    fn transfer_time_scales() {
        assert_eq!(transfer_time(256, 4096.0 * 256.0), Duration::from_secs(1));
        assert_eq!(transfer_time(1, 0.0), Duration::MAX);
        // Nothing left is done at once, whatever the link.
        assert_eq!(transfer_time(0, 0.0), Duration::ZERO);
    }
}
