//! Firecracker's API on a Unix socket (`hover firecracker`), so that tools
//! written for Firecracker (its Go SDK, firectl) can drive Hover. A VM is
//! configured by requests, then started (`InstanceStart`) or loaded from a
//! snapshot (`snapshot/load`); Hover's own endpoints (`/vm/*`, `GET
//! /metrics`) answer on the same socket while it runs, so a VM driven this
//! way can be migrated with `hover ctl migrate`. docs/FIRECRACKER.md lists
//! every endpoint, what it does here, and what is refused and why.
//!
//! Threads: the HTTP server's (under the API's seccomp filter) answer
//! what needs no file or VM from the shared state; everything before the
//! start (opening the kernel, the logger's file, building the VM) is done
//! by the caller's thread in [`serve`] (`setup.rs`), which then runs the
//! VM; once it runs, requests go to the VM's controller (`runtime.rs`).

mod checks;
mod devices;
mod metrics;
pub mod models;
pub mod refusal;
mod runtime;
mod setup;

pub use setup::open_log;

use crate::sync::Locked;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use crate::api::http::{self, Answer};
use crate::api::slot::Waited;
use crate::api::{ApiError, ApiServer, ApiSlot};
use crate::config::HostConfig;
use crate::vm::RunOutcome;
use models::{FullVmConfiguration, Logger};
use refusal::Refusal;

/// What Hover answers as `firecracker_version` and `vmm_version`: the
/// Firecracker API version, with Hover's own as semver build metadata
/// (Hover never claims to be Firecracker).
pub fn version() -> String {
    format!(
        "{}+hover.{}",
        models::API_VERSION,
        env!("CARGO_PKG_VERSION")
    )
}

/// Sets up logging for `PUT /logger` (the binary owns the log's writer).
pub type LoggerHook = Box<dyn FnMut(&Logger) -> Result<(), Refusal> + Send>;

/// How `hover firecracker` was started.
pub struct Options {
    /// `--api-sock` (`None`: `--no-api`).
    pub api_sock: Option<PathBuf>,
    /// `--id`.
    pub id: String,
    /// `--config-file`, parsed: applied, then the VM starts at once.
    pub config_file: Option<FullVmConfiguration>,
    /// How this host runs the VM (console, seccomp, ...; no API socket).
    pub host: HostConfig,
    /// `--log-path` and `--level`, as a `PUT /logger` would give them.
    pub logger: Option<Logger>,
    /// `--metrics-path`.
    pub metrics_path: Option<PathBuf>,
    /// Applies a logger configuration.
    pub set_logger: LoggerHook,
}

/// How [`serve`] ended.
pub enum Ended {
    /// The VM ran and ended.
    Ran(Box<RunOutcome>),
    /// A signal ended the process before a VM ran.
    Signal(i32),
}

/// Why [`serve`] failed.
#[derive(Debug, thiserror::Error)]
pub enum FirecrackerError {
    /// The configuration (flags or `--config-file`) is refused.
    #[error("{0}")]
    Config(String),
    /// The API socket cannot be served.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The VM failed.
    #[error(transparent)]
    Vm(#[from] crate::Error),
}

impl FirecrackerError {
    /// Whether the user's input is at fault (exit status 2).
    pub fn is_bad_input(&self) -> bool {
        match self {
            FirecrackerError::Config(_) => true,
            FirecrackerError::Api(e) => matches!(e, ApiError::Exists(_) | ApiError::Bind { .. }),
            FirecrackerError::Vm(e) => e.is_bad_input(),
        }
    }
}

/// A request the server hands to the thread in [`serve`].
struct Forwarded {
    method: String,
    path: String,
    body: Vec<u8>,
    reply: Sender<Outcome>,
}

/// What the thread in [`serve`] made of a request.
enum Outcome {
    /// The answer.
    Answer(Answer),
    /// The VM is built and about to run: answer once it runs.
    Starting,
}

enum Msg {
    Request(Forwarded),
    Signal(i32),
}

/// Whether the VM was started yet (requests before go to [`serve`]'s thread).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Configuring,
    Started,
}

/// What the server's threads and [`serve`]'s share.
struct Shared {
    id: String,
    phase: Mutex<Phase>,
    to_setup: Mutex<Sender<Msg>>,
    /// The configuration as `GET /vm/config` shows it.
    config: Mutex<FullVmConfiguration>,
    /// The running VM's routes.
    slot: ApiSlot,
    /// Where `FlushMetrics` writes.
    metrics: Mutex<Option<std::fs::File>>,
}

/// Serve Firecracker's API until the VM it starts ends (or a signal ends
/// the process first).
pub fn serve(mut opts: Options) -> Result<Ended, FirecrackerError> {
    // The server's threads start before any VM: they take this mode.
    crate::seccomp::set_mode(opts.host.seccomp);
    crate::seccomp::check(opts.host.seccomp).map_err(|e| FirecrackerError::Vm(e.into()))?;
    let (tx, rx) = mpsc::channel();
    let shared = Arc::new(Shared {
        id: opts.id.clone(),
        phase: Mutex::new(Phase::Configuring),
        to_setup: Mutex::new(tx.clone()),
        config: Mutex::default(),
        slot: ApiSlot::default(),
        metrics: Mutex::default(),
    });
    let configuring = configuring_signals(tx, opts.api_sock.clone());
    let mut setup = setup::Setup::new(shared.clone(), std::mem::take(&mut opts.host));
    if let Some(l) = opts.logger.take() {
        setup
            .logger(&l, &mut opts.set_logger)
            .map_err(|e| FirecrackerError::Config(e.0))?;
    }
    if let Some(p) = opts.metrics_path.take() {
        setup
            .metrics(&models::Metrics {
                metrics_path: p.display().to_string(),
            })
            .map_err(|e| FirecrackerError::Config(e.0))?;
    }
    // A configuration file starts the VM before the API listens: no
    // request can find it half configured.
    let started = match opts.config_file.take() {
        Some(file) => {
            let vm = setup.apply_file(file, &mut opts.set_logger)?;
            *shared.phase.locked() = Phase::Started;
            Some(vm)
        }
        None => None,
    };
    let _server = match &opts.api_sock {
        Some(path) => {
            let s = shared.clone();
            Some(ApiServer::listen(
                path,
                Arc::new(move |r: &http::Request| handle(&s, r)),
            )?)
        }
        None => None,
    };
    let mut vm = match started {
        Some(vm) => vm,
        None => match wait_for_start(&rx, &mut setup, &mut opts.set_logger) {
            Some(vm) => vm,
            None => return Ok(Ended::Signal(setup.signalled.unwrap_or(libc::SIGTERM))),
        },
    };
    // The handler of the request that started it set the phase.
    vm.serve_api(Box::new(crate::api::SlotApi::new(shared.slot.clone())));
    let controller = vm.controller();
    // The VM hears signals from now on (the newest watcher wins, so none
    // falls between the two); one that came while it was built is passed on.
    let running = {
        let c = controller.clone();
        crate::signals::watch(move |sig| c.signal(sig))
    };
    drop(configuring);
    for msg in rx.try_iter() {
        if let Msg::Signal(sig) = msg {
            controller.signal(sig);
        }
    }
    // Requests still queued are answered "no longer configuring".
    drop(rx);
    let ran = vm.run();
    // A VM that failed before its vCPUs ran never filled the slot.
    shared.slot.close();
    if let Err(e) = metrics::flush(&shared, shared.slot.last_routes().as_deref()) {
        tracing::warn!("cannot write the last metrics line: {e}");
    }
    // The VM has ended: a signal now must not cut the outcome short.
    crate::signals::ignore_from_now();
    drop(running);
    Ok(Ended::Ran(Box::new(ran?)))
}

/// Signals while configuring: the first ends the wait for a start (the
/// socket is removed as [`serve`] returns); a second, if the first is not
/// taken at once (a VM being built), removes the socket and exits.
fn configuring_signals(tx: Sender<Msg>, socket: Option<PathBuf>) -> crate::signals::Watch {
    let seen = std::sync::atomic::AtomicBool::new(false);
    crate::signals::watch(move |sig| {
        if seen.swap(true, std::sync::atomic::Ordering::SeqCst) {
            if let Some(p) = &socket {
                let _ = std::fs::remove_file(p);
            }
            eprintln!(
                "hover: {} again while starting a microVM: exiting at once",
                crate::signals::name(sig)
            );
            std::process::exit(crate::signals::exit_status(sig).into());
        }
        let _ = tx.send(Msg::Signal(sig));
    })
}

/// Answer requests forwarded by the server until one starts a VM (`Some`)
/// or a signal ends the wait (`None`).
fn wait_for_start(
    rx: &Receiver<Msg>,
    setup: &mut setup::Setup,
    set_logger: &mut LoggerHook,
) -> Option<crate::vm::Vm> {
    loop {
        match rx.recv().ok()? {
            Msg::Signal(sig) => {
                setup.signalled = Some(sig);
                return None;
            }
            Msg::Request(f) => match setup.request(&f.method, &f.path, &f.body, set_logger) {
                setup::Step::Answer(a) => {
                    let _ = f.reply.send(Outcome::Answer(a));
                }
                setup::Step::Start(vm) => {
                    let _ = f.reply.send(Outcome::Starting);
                    return Some(*vm);
                }
            },
        }
    }
}

/// `{"fault_message": ...}` with `status`.
pub(crate) fn fault(status: u16, message: impl std::fmt::Display) -> Answer {
    let body = serde_json::json!({ "fault_message": message.to_string() });
    (status, "application/json", body.to_string())
}

/// 204, empty: Firecracker's success for a change.
pub(crate) fn done() -> Answer {
    (204, "application/json", String::new())
}

/// 200 with `v` as JSON.
pub(crate) fn ok<T: serde::Serialize>(v: &T) -> Answer {
    match serde_json::to_string(v) {
        Ok(s) => (200, "application/json", s),
        Err(e) => fault(500, format!("cannot encode the answer: {e}")),
    }
}

/// Parse a request body as Firecracker does: unknown fields and bad JSON
/// refused, the message naming what is wrong.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Answer> {
    serde_json::from_slice(body).map_err(|e| {
        let text = e.to_string();
        let cut: String = text.chars().take(300).collect();
        fault(
            400,
            format!("An error occurred when deserializing the json body of a request: {cut}."),
        )
    })
}

/// Firecracker's endpoints Hover answers: (method, path).
pub const ENDPOINTS: [(&str, &str); 21] = [
    ("GET", "/"),
    ("GET", "/version"),
    ("GET", "/machine-config"),
    ("PUT", "/machine-config"),
    ("PATCH", "/machine-config"),
    ("PUT", "/boot-source"),
    ("PUT", "/drives/{drive_id}"),
    ("PUT", "/network-interfaces/{iface_id}"),
    ("PUT", "/entropy"),
    ("PUT", "/balloon"),
    ("PATCH", "/balloon"),
    ("GET", "/balloon"),
    ("GET", "/balloon/statistics"),
    ("PATCH", "/balloon/statistics"),
    ("PUT", "/actions"),
    ("PATCH", "/vm"),
    ("GET", "/vm/config"),
    ("PUT", "/snapshot/create"),
    ("PUT", "/snapshot/load"),
    ("PUT", "/logger"),
    ("PUT", "/metrics"),
];

/// Firecracker's device endpoints, refused whatever the method: (path or
/// prefix of `path/ID`, what it is).
pub const DEVICES: [(&str, &str); 4] = [
    ("/vsock", "vsock devices"),
    ("/mmds", "MMDS (the metadata service)"),
    ("/cpu-config", "custom CPU templates"),
    ("/hotplug", "hot-plugging"),
];

/// Whether `method path` is one of [`ENDPOINTS`] (`{...}` in an endpoint
/// stands for one non-empty path segment).
fn is_endpoint(method: &str, path: &str) -> bool {
    ENDPOINTS.iter().any(|&(m, p)| {
        m == method
            && match p.split_once('{') {
                Some((prefix, _)) => path
                    .strip_prefix(prefix)
                    .is_some_and(|id| !id.is_empty() && !id.contains('/')),
                None => p == path,
            }
    })
}

/// The refusal for a device Hover does not have, if `path` names one.
fn refused_device(path: &str) -> Option<Answer> {
    let (_, what) = DEVICES
        .iter()
        .find(|(p, _)| path == *p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/')))?;
    Some(fault(
        400,
        format!("Hover has no {what} (docs/FIRECRACKER.md lists what it answers)"),
    ))
}

/// The answer to a query made before the start, from what the configuring
/// thread published (None: not such a query).
fn query_before_start(shared: &Shared, method: &str, path: &str) -> Option<Answer> {
    if method != "GET" {
        return None;
    }
    let config = || shared.config.locked();
    Some(match path {
        "/" => ok(&models::InstanceInfo {
            app_name: "Hover",
            id: shared.id.clone(),
            state: "Not started",
            vmm_version: version(),
        }),
        "/version" => ok(&models::FirecrackerVersion {
            firecracker_version: version(),
        }),
        "/machine-config" => ok(&config().machine_config),
        "/vm/config" => ok(&*config()),
        "/balloon" => match &config().balloon {
            Some(b) => ok(b),
            None => fault(400, runtime::NO_BALLOON),
        },
        "/balloon/statistics" => fault(400, "the balloon's statistics come once the microVM runs"),
        _ => return None,
    })
}

/// Answer one request (on a server thread).
fn handle(shared: &Shared, req: &http::Request) -> Answer {
    let path = req.target.split('?').next().unwrap_or(&req.target);
    let method = req.method.as_str();
    if let Some(refused) = refused_device(path) {
        return refused;
    }
    if method == "PATCH"
        && (path.starts_with("/drives/") || path.starts_with("/network-interfaces/"))
    {
        return fault(
            400,
            "Hover does not change a drive or network interface once configured (no rate limiters, no new path_on_host): PUT it again before the start",
        );
    }
    if !is_endpoint(method, path) {
        if crate::api::Endpoint::is_hover_path(path) {
            return match shared.slot.routes() {
                Some(routes) => routes.handle(req),
                None => fault(
                    400,
                    format!("{path} is Hover's own endpoint: it answers once the microVM runs"),
                ),
            };
        }
        return fault(
            400,
            format!(
                "Invalid request method and/or path: {} {}.",
                crate::api::quote(method),
                crate::api::quote(path)
            ),
        );
    }
    if *shared.phase.locked() == Phase::Started {
        return runtime::handle(shared, method, path, &req.body);
    }
    // Queries before the start answer from what is published, so they
    // never wait behind a start or load under way; no lock is held while
    // a request waits for the thread that configures.
    if let Some(answer) = query_before_start(shared, method, path) {
        return answer;
    }
    let (reply, answer) = mpsc::channel();
    let sent = shared.to_setup.locked().send(Msg::Request(Forwarded {
        method: method.into(),
        path: path.into(),
        body: req.body.clone(),
        reply,
    }));
    if sent.is_err() {
        return fault(400, "the VMM is stopping");
    }
    match answer.recv() {
        Ok(Outcome::Answer(a)) => a,
        Ok(Outcome::Starting) => {
            *shared.phase.locked() = Phase::Started;
            match shared.slot.wait() {
                Waited::Running(_) | Waited::Ended => done(),
                Waited::Closed => fault(
                    400,
                    "the microVM was built but failed to start: see the VMM's log",
                ),
            }
        }
        // The VM started from another request, or a signal ended the wait.
        Err(_) => fault(400, "the VMM is no longer configuring a microVM"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's shared state whose configuring thread never answers (a
    /// start that is stuck), and the receiving end it never reads.
    fn stuck() -> (Arc<Shared>, Receiver<Msg>) {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            id: "stuck".into(),
            phase: Mutex::new(Phase::Configuring),
            to_setup: Mutex::new(tx),
            config: Mutex::new(FullVmConfiguration {
                machine_config: Some(models::MachineConfiguration::default()),
                ..FullVmConfiguration::default()
            }),
            slot: ApiSlot::default(),
            metrics: Mutex::default(),
        });
        (shared, rx)
    }

    fn get(path: &str) -> http::Request {
        http::Request {
            method: "GET".into(),
            target: path.into(),
            body: Vec::new(),
        }
    }

    #[test]
    fn queries_are_answered_while_the_configuring_thread_is_busy() {
        let (shared, _rx) = stuck();
        // A request the configuring thread would answer waits for it, on
        // its own thread, holding nothing the queries need.
        let s = shared.clone();
        let _waiting = std::thread::spawn(move || {
            handle(
                &s,
                &http::Request {
                    method: "PUT".into(),
                    target: "/actions".into(),
                    body: br#"{"action_type": "InstanceStart"}"#.to_vec(),
                },
            )
        });
        for path in ["/", "/version", "/machine-config", "/vm/config"] {
            let (status, _, body) = handle(&shared, &get(path));
            assert_eq!(status, 200, "{path}: {body}");
        }
        let (_, _, body) = handle(&shared, &get("/"));
        assert!(
            body.contains("Not started") && body.contains("stuck"),
            "{body}"
        );
    }
}
