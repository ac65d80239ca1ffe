//! Once the microVM runs: requests answered on the server's threads,
//! through the VM's controller.

use crate::sync::Locked;
use std::path::PathBuf;
use std::time::Duration;

use super::models::{InstanceActionInfo, InstanceInfo, SnapshotCreateParams, VmState};
use super::setup::AFTER_START;
use super::{done, fault, ok, parse, Shared};
use crate::api::http::Answer;
use crate::vm::{Command, Controller, Lifecycle};

/// The answer about a balloon to a microVM without one.
pub(super) const NO_BALLOON: &str = "there is no balloon device: PUT /balloon before the start";

/// How long a command may take (a snapshot of a large VM takes a while).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(600);

/// Firecracker's name for a state.
fn state_name(s: Lifecycle) -> &'static str {
    match s {
        Lifecycle::Paused | Lifecycle::PostcopyPaused | Lifecycle::Exited => "Paused",
        Lifecycle::Created | Lifecycle::Running => "Running",
    }
}

/// Answer one request once the microVM was started.
pub(super) fn handle(shared: &Shared, method: &str, path: &str, body: &[u8]) -> Answer {
    let config = || shared.config.locked();
    match (method, path) {
        ("GET", "/version") => ok(&super::models::FirecrackerVersion {
            firecracker_version: super::version(),
        }),
        ("GET", "/machine-config") => ok(&config().machine_config),
        ("GET", "/vm/config") => ok(&*config()),
        _ => {
            // A request right after the start waits for the vCPUs to run.
            let routes = match shared.slot.wait() {
                crate::api::slot::Waited::Running(r) => r,
                _ => return fault(400, "the microVM has stopped"),
            };
            let c = routes.controller();
            match (method, path) {
                ("GET", "/") => ok(&InstanceInfo {
                    app_name: "Hover",
                    id: shared.id.clone(),
                    state: state_name(c.info().state),
                    vmm_version: super::version(),
                }),
                ("GET", "/balloon") | ("PATCH", "/balloon") => balloon(&routes, method, body),
                ("GET", "/balloon/statistics") | ("PATCH", "/balloon/statistics") => {
                    balloon_statistics(&routes, method, body)
                }
                ("PATCH", "/vm") => patch_vm(c, body),
                ("PUT", "/snapshot/create") => snapshot(c, body),
                ("PUT", "/actions") => action(shared, &routes, body),
                _ => fault(400, AFTER_START),
            }
        }
    }
}

/// Carry out `cmd`: 204, or 400 with the VM's reason.
fn command(c: &Controller, cmd: Command) -> Answer {
    match c.request(cmd, COMMAND_TIMEOUT) {
        Ok(_) => done(),
        Err(e) => fault(400, e),
    }
}

fn patch_vm(c: &Controller, body: &[u8]) -> Answer {
    let v = match parse::<VmState>(body) {
        Ok(v) => v,
        Err(a) => return a,
    };
    let now = c.info().state;
    match v.state.as_str() {
        // Asking for the state the VM is in succeeds, as in Firecracker.
        "Paused" if now == Lifecycle::Paused => done(),
        "Resumed" if now == Lifecycle::Running => done(),
        "Paused" => command(c, Command::Pause),
        "Resumed" => command(c, Command::Resume),
        other => fault(
            400,
            format!(
                "unknown state {}: give Paused or Resumed",
                crate::api::quote(other)
            ),
        ),
    }
}

fn snapshot(c: &Controller, body: &[u8]) -> Answer {
    let p = match parse::<SnapshotCreateParams>(body) {
        Ok(p) => p,
        Err(a) => return a,
    };
    match p.snapshot_type.as_deref() {
        None | Some("Full") => {}
        Some("Diff") => {
            return fault(
                400,
                "Hover makes full snapshots only: give snapshot_type Full (or omit it)",
            )
        }
        Some(other) => {
            return fault(
                400,
                format!(
                    "unknown snapshot_type {}: give Full",
                    crate::api::quote(other)
                ),
            )
        }
    }
    if let Some(v) = p.version.as_deref() {
        if v != super::models::API_VERSION {
            return fault(
                400,
                format!(
                    "version {}: Hover writes its own snapshot format only (version {})",
                    crate::api::quote(v),
                    super::models::API_VERSION
                ),
            );
        }
    }
    if p.snapshot_path.is_empty() || p.mem_file_path.is_empty() {
        return fault(400, "snapshot_path and mem_file_path must not be empty");
    }
    if c.info().state != Lifecycle::Paused {
        return fault(
            400,
            "Cannot create a snapshot of a running microVM: pause it first (PATCH /vm {\"state\": \"Paused\"})",
        );
    }
    let (snap, mem) = (
        PathBuf::from(&p.snapshot_path),
        PathBuf::from(&p.mem_file_path),
    );
    command(
        c,
        Command::Snapshot {
            also_at: (mem != snap).then_some(mem),
            path: snap,
            stop: false,
            hot_window: Duration::ZERO,
        },
    )
}

fn action(shared: &Shared, routes: &crate::api::Routes, body: &[u8]) -> Answer {
    let a = match parse::<InstanceActionInfo>(body) {
        Ok(a) => a,
        Err(a) => return a,
    };
    match a.action_type.as_str() {
        "InstanceStart" => fault(400, "The microVM is already running."),
        // Hover's guests have no keyboard to press Ctrl+Alt+Del on: the
        // VM is shut down as `PUT /vm/shutdown` does.
        "SendCtrlAltDel" => command(routes.controller(), Command::Shutdown),
        "FlushMetrics" => super::metrics::flush_answer(shared, Some(routes)),
        other => fault(
            400,
            format!(
                "unknown action_type {}: give InstanceStart, SendCtrlAltDel or FlushMetrics",
                crate::api::quote(other)
            ),
        ),
    }
}

/// `GET /balloon` (its configuration, the target as now set) and `PATCH
/// /balloon` (a new target).
fn balloon(routes: &crate::api::Routes, method: &str, body: &[u8]) -> Answer {
    let Some(control) = routes.balloon() else {
        return fault(400, NO_BALLOON);
    };
    if method == "PATCH" {
        let u = match parse::<super::models::BalloonUpdate>(body) {
            Ok(u) => u,
            Err(a) => return a,
        };
        return match control.set_target_mib(u.amount_mib) {
            Ok(()) => done(),
            Err(e) => fault(400, format!("amount_mib: {e}")),
        };
    }
    let now = control.report();
    // From the running device (a microVM loaded from a snapshot was never
    // configured through PUT /balloon here).
    ok(&super::models::Balloon {
        amount_mib: now.target_mib,
        deflate_on_oom: now.deflate_on_oom,
        stats_polling_interval_s: now.stats_polling_interval_s,
        free_page_hinting: None,
        free_page_reporting: now.free_page_reporting,
    })
}

/// `GET /balloon/statistics` and `PATCH /balloon/statistics` (a new
/// polling interval; 0 stops the requests).
fn balloon_statistics(routes: &crate::api::Routes, method: &str, body: &[u8]) -> Answer {
    let Some(control) = routes.balloon() else {
        return fault(400, NO_BALLOON);
    };
    if method == "PATCH" {
        return match parse::<super::models::BalloonStatsUpdate>(body) {
            Ok(u) => {
                control.set_stats_interval(u.stats_polling_interval_s);
                done()
            }
            Err(a) => a,
        };
    }
    let r = control.report();
    if r.stats_polling_interval_s == 0 && r.statistics.is_empty() {
        return fault(
            400,
            "balloon statistics are not enabled: set stats_polling_interval_s (PATCH /balloon/statistics)",
        );
    }
    ok(&super::models::BalloonStats {
        target_pages: r.target_pages,
        actual_pages: r.actual_pages,
        target_mib: r.target_mib,
        actual_mib: r.actual_mib,
        statistics: r.statistics,
    })
}
