//! The control API: HTTP/1.1 and JSON on the Unix socket of `--api-socket`
//! (docs/api.yaml is the contract; a test walks it against this server).
//!
//! The endpoints are [`Endpoint`] (`routes.rs`): one table that the
//! server dispatches on, answers 404 and 405 from, the docs/api.yaml test
//! walks and `hover ctl` sends.
//!
//! HTTP is served by [`http`], a server whose every resource a client can
//! claim is bounded (connections, head and body sizes, time): a client that
//! stalls or floods holds at most one of a few connection threads, and the
//! VM and other clients go on. Commands reach the
//! VM through its [`Controller`], which carries them out one at a time. The
//! socket file is created here with mode 0600 (an existing path is refused,
//! except a stale socket nobody listens on, left by a killed VM) and removed
//! when the VM stops.

pub mod client;
pub mod http;
mod metrics;
mod requests;
mod routes;
mod server;
pub mod slot;

pub use routes::Endpoint;
pub use server::ApiServer;

pub use server::SocketApi;
pub use slot::ApiSlot;
pub use slot::SlotApi;

pub use crate::vm::{GovernorSource, LiveSources};

pub use requests::{
    BalloonRequest, HaltPollRequest, MigrateRequest, SnapshotRequest, DEFAULT_HOT_WINDOW_MS,
};

use crate::sync::Locked;
use requests::{parse_body, ApiFailure};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Answer;
use serde::Serialize;

use crate::devices::pvio::PvioStats;
use crate::memory::paged::PagerStats;
use crate::sched::guest_poll::GuestPoll;
use crate::sched::halt_poll::GovernorReport;
use crate::vm::{Command, Controller};

pub use client::{query, ApiClient};

/// How long a command may take (a snapshot of a large VM takes a while).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(600);

/// Why the API socket failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The path exists already.
    #[error("--api-socket {}: already exists (a file, or a socket a running VM serves); give a new path", .0.display())]
    Exists(PathBuf),
    /// Binding failed.
    #[error("--api-socket {}: cannot listen there: {source}", .path.display())]
    Bind {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Connecting failed.
    #[error("cannot reach a VM at {}: {source} (is `hover run --api-socket` running there?)", .path.display())]
    Connect {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The VM's answer could not be read or was an error.
    #[error("the VM at {} answered badly: {reason}", .path.display())]
    BadReply {
        /// The path.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The VM refused the request.
    #[error("the VM at {} refused: {message} (HTTP {status})", .path.display())]
    Refused {
        /// The path.
        path: PathBuf,
        /// The HTTP status.
        status: u16,
        /// The VM's error message.
        message: String,
        /// The request's field at fault, when the VM named one.
        field: Option<String>,
    },
}

/// The answer to `GET /vm/stats`.
#[derive(Serialize)]
pub struct LiveStats {
    /// Milliseconds since the vCPUs started.
    pub uptime_ms: u64,
    /// KVM's single-valued statistics of each vCPU.
    pub vcpu_stats: Vec<BTreeMap<String, u64>>,
    /// KVM's histograms of each vCPU.
    pub vcpu_histograms: Vec<BTreeMap<String, Vec<u64>>>,
    /// KVM's statistics of the VM.
    pub vm_stats: BTreeMap<String, u64>,
    /// The pager, if paging.
    pub pager: Option<PagerStats>,
    /// The halt-poll governor, if governing.
    pub halt_poll: Option<GovernorReport>,
    /// The guest's own halt polling, when the monitor offers it.
    pub guest_halt_poll: Option<GuestPoll>,
    /// vCPU priority boosting, when on.
    pub boost: Option<crate::sched::boost::BoostReport>,
    /// The I/O device, once the guest has set it up.
    pub io: Option<PvioStats>,
    /// The balloon, if the VM has one.
    pub balloon: Option<crate::devices::virtio::balloon::BalloonReport>,
}

impl LiveSources {
    fn snapshot(&self) -> LiveStats {
        let (vcpu_stats, vcpu_histograms) = crate::stats::read_vcpus(&self.vcpu_stats);
        LiveStats {
            uptime_ms: self.started.elapsed().as_millis() as u64,
            vcpu_stats,
            vcpu_histograms,
            vm_stats: crate::stats::read_vm(self.vm_stats.as_ref()),
            pager: self.pager.as_ref().map(|f| f()),
            halt_poll: self.governor.locked().as_ref().map(|f| f()),
            guest_halt_poll: self.guest_poll.as_ref().map(|f| f()),
            boost: self.boost.as_ref().map(|b| b.report()),
            io: self.io.stats(),
            balloon: self.balloon.as_ref().map(|b| b.report()),
        }
    }
}

/// Hover's own routes over one running VM: what [`ApiServer::start`]
/// serves, and what a server that outlives VMs (the Firecracker API's)
/// serves through an [`ApiSlot`] while one runs.
pub struct Routes {
    sources: LiveSources,
    controller: Controller,
}

impl Routes {
    /// Routes over the VM that `controller` steers.
    pub fn new(sources: LiveSources, controller: Controller) -> Routes {
        Routes {
            sources,
            controller,
        }
    }

    /// Answer `req`.
    pub fn handle(&self, req: &http::Request) -> Answer {
        route(self, &req.method, &req.target, &req.body).unwrap_or_else(failure)
    }

    /// The VM's controller.
    pub fn controller(&self) -> &Controller {
        &self.controller
    }

    /// The VM's balloon, if it has one.
    pub fn balloon(&self) -> Option<Arc<crate::devices::virtio::balloon::BalloonControl>> {
        self.sources.balloon.clone()
    }

    /// The VM's live figures (`GET /vm/stats`).
    pub fn live(&self) -> LiveStats {
        self.sources.snapshot()
    }
}

const JSON: &str = "application/json";

fn json<T: Serialize>(status: u16, v: &T) -> Answer {
    match serde_json::to_string(v) {
        Ok(s) => (status, JSON, s),
        Err(e) => failure(ApiFailure::new(
            500,
            format!("cannot encode the answer: {e}"),
        )),
    }
}

fn failure(f: ApiFailure) -> Answer {
    // serde's messages quote the input ("unknown field `...`"): bounded here.
    let mut v = serde_json::json!({ "error": cut(&f.message, MESSAGE_MAX) });
    if let Some(field) = f.field {
        v["field"] = quote(&field).into();
    }
    (f.status, JSON, v.to_string())
}

/// At most this much of a client's input is quoted back in an error.
const QUOTE_MAX: usize = 80;
/// The longest error message (ours are shorter; serde's quote the input).
const MESSAGE_MAX: usize = 400;

/// `s`, cut to [`QUOTE_MAX`] characters: errors never echo unbounded input.
pub(crate) fn quote(s: &str) -> String {
    cut(s, QUOTE_MAX)
}

fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

fn route(ctx: &Routes, method: &str, url: &str, body: &[u8]) -> Result<Answer, ApiFailure> {
    let path = url.split('?').next().unwrap_or(url);
    let command = |cmd| -> Result<Answer, ApiFailure> {
        let reply = ctx.controller.request(cmd, COMMAND_TIMEOUT)?;
        Ok(json(200, &reply))
    };
    let no_body = || -> Result<(), ApiFailure> {
        let blank = body.iter().all(|b| b.is_ascii_whitespace());
        if blank || body == b"{}" {
            Ok(())
        } else {
            Err(ApiFailure::bad("body", "this request takes no body".into()))
        }
    };
    match Endpoint::find(method, path)? {
        Endpoint::Info => Ok(json(200, &ctx.controller.info())),
        Endpoint::Pause => {
            no_body()?;
            command(Command::Pause)
        }
        Endpoint::Resume => {
            no_body()?;
            command(Command::Resume)
        }
        Endpoint::Shutdown => {
            no_body()?;
            command(Command::Shutdown)
        }
        Endpoint::Snapshot => {
            let r: SnapshotRequest = parse_body(body)?;
            if r.path.as_os_str().is_empty() {
                return Err(ApiFailure::bad("path", "path is empty".into()));
            }
            let window = r.hot_window_ms.unwrap_or(requests::DEFAULT_HOT_WINDOW_MS);
            let max = crate::vm::MAX_HOT_WINDOW.as_millis() as u64;
            if window > max {
                return Err(ApiFailure::bad(
                    "hot_window_ms",
                    format!("{window} ms is too long: at most {max} ms"),
                ));
            }
            command(Command::Snapshot {
                path: r.path,
                stop: r.stop,
                hot_window: Duration::from_millis(window),
                also_at: None,
            })
        }
        Endpoint::Boost => {
            let r: crate::config::BoostUpdate = parse_body(body)?;
            command(Command::Boost(r))
        }
        Endpoint::HaltPoll => {
            let r: HaltPollRequest = parse_body(body)?;
            command(Command::HaltPoll(r.setting()?))
        }
        Endpoint::Migrate => {
            let r: MigrateRequest = parse_body(body)?;
            command(Command::Migrate(r.options()?))
        }
        Endpoint::DirtyLog => {
            let r: requests::DirtyLogBody = parse_body(body)?;
            command(Command::DirtyLog(r.request()?))
        }
        Endpoint::Postcopy => {
            no_body()?;
            ctx.controller.switch_to_postcopy()?;
            Ok(json(200, &ctx.controller.info()))
        }
        Endpoint::Balloon => {
            let r: requests::BalloonRequest = parse_body(body)?;
            let Some(b) = &ctx.sources.balloon else {
                return Err(ApiFailure::new(
                    400,
                    "this VM has no balloon (hover run --balloon)".into(),
                ));
            };
            r.apply(b)?;
            Ok(json(200, &b.report()))
        }
        Endpoint::Stats => Ok(json(200, &ctx.sources.snapshot())),
        Endpoint::Metrics => Ok((
            200,
            metrics::CONTENT_TYPE,
            metrics::render(&ctx.sources, &ctx.controller),
        )),
    }
}

/// Parse `body` as the request of one endpoint (`which` picks it) and
/// check it as the server does (the fuzz target `api_body`).
pub(crate) fn fuzz_body(which: u8, body: &[u8]) {
    match which % 4 {
        0 => {
            let _ = parse_body::<SnapshotRequest>(body);
        }
        1 => {
            if let Ok(u) = parse_body::<crate::config::BoostUpdate>(body) {
                let _ = u.apply(Default::default());
            }
        }
        2 => {
            let _ = parse_body::<HaltPollRequest>(body).and_then(|r| r.setting());
        }
        _ => {
            let _ = parse_body::<MigrateRequest>(body).and_then(|r| r.options());
        }
    }
}
