//! The bodies the control API accepts, and its error answers: every field
//! checked, and an error names the field at fault.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::HaltPoll;
use crate::vm::CommandError;

/// The body of `PUT /vm/snapshot` (the server reads it, `hover ctl` writes it).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// The new snapshot file (absolute, or from the VMM's directory).
    pub path: PathBuf,
    /// End the VM once the snapshot is written.
    #[serde(default)]
    pub stop: bool,
    /// Milliseconds to watch the guest's writes before pausing (the hot
    /// set); absent: [`DEFAULT_HOT_WINDOW_MS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hot_window_ms: Option<u64>,
}

/// The hot-set window a snapshot takes unless told otherwise, ms.
pub const DEFAULT_HOT_WINDOW_MS: u64 = 100;

/// The body of `PUT /vm/dirty-log`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DirtyLogBody {
    dirty_tracking: String,
    #[serde(default = "default_period_ms")]
    period_ms: u64,
    seconds: f64,
    #[serde(default = "default_hold_pages")]
    hold_pages: u64,
}

fn default_period_ms() -> u64 {
    100
}

/// A migration's hot budget at 1 GB/s and the default 100 ms downtime
/// (half of it, in pages).
fn default_hold_pages() -> u64 {
    12_288
}

impl DirtyLogBody {
    /// The command's request, checked.
    pub(super) fn request(&self) -> Result<crate::migration::dirty::DirtyLogRequest, ApiFailure> {
        let tracker = self
            .dirty_tracking
            .parse()
            .map_err(|e| ApiFailure::bad("dirty_tracking", e))?;
        if !(1..=10_000).contains(&self.period_ms) {
            return Err(ApiFailure::bad(
                "period_ms",
                format!("{} is out of range: give 1 to 10000", self.period_ms),
            ));
        }
        let max = crate::migration::dirty::MAX_DIRTY_LOG.as_secs_f64();
        if !(self.seconds > 0.0 && self.seconds <= max) {
            return Err(ApiFailure::bad(
                "seconds",
                format!(
                    "{} is out of range: give more than 0, at most {max}",
                    self.seconds
                ),
            ));
        }
        Ok(crate::migration::dirty::DirtyLogRequest {
            tracker,
            period: Duration::from_millis(self.period_ms),
            duration: Duration::from_secs_f64(self.seconds),
            hold_pages: self.hold_pages,
        })
    }
}

/// The body of `PUT /vm/migrate` (the server reads it, `hover ctl` writes
/// it): what is absent takes [`crate::migration::MigrateOptions`]' default.
/// docs/api.yaml describes each field.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    /// The destination: `tcp:HOST:PORT` or `unix:PATH`.
    pub to: String,
    /// `bitmap`, `manual`, `hybrid` or `ring`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dirty_tracking: Option<crate::migration::Tracker>,
    /// The longest pause allowed for the final round, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub downtime_ms: Option<u64>,
    /// Pages per batch sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_pages: Option<usize>,
    /// Bytes per second the migration may use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<u64>,
    /// Give up after this many seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
    /// Send a digest of memory for the destination to check.
    #[serde(default)]
    pub verify: bool,
    /// Throttle vCPUs that dirty faster than the link.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_converge: Option<bool>,
    /// The first throttle, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttle_initial: Option<u8>,
    /// Added per round that does not converge, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttle_step: Option<u8>,
    /// The most a vCPU is throttled, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttle_max: Option<u8>,
    /// `per-page`, `readv` or `persistent`: send from a separate process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender_process: Option<crate::migration::mapper::MapMode>,
    /// `precopy`, `postcopy` or `hybrid`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<crate::migration::postcopy::Mode>,
    /// Post-copy: reconnect to a destination waiting for its missing pages.
    #[serde(default)]
    pub recover: bool,
    /// TCP without a migration key.
    #[serde(default)]
    pub insecure: bool,
}

impl MigrateRequest {
    /// The migration's options, checked: the field at fault otherwise.
    pub(super) fn options(&self) -> Result<crate::migration::MigrateOptions, ApiFailure> {
        use crate::migration::MigrateOptions;
        let to = self.to.parse().map_err(|e| ApiFailure::bad("to", e))?;
        let mut o = MigrateOptions::to(to);
        o.tracker = self.dirty_tracking.unwrap_or(o.tracker);
        if let Some(ms) = self.downtime_ms {
            o.downtime = Duration::from_millis(ms);
        }
        if let Some(b) = self.batch_pages {
            o.batch_pages = b;
        }
        o.bandwidth = self.bandwidth;
        if let Some(s) = self.timeout_s {
            o.timeout = Duration::from_secs(s);
        }
        o.verify = self.verify;
        let t = &mut o.throttle;
        t.on = self.auto_converge.unwrap_or(t.on);
        t.initial = self.throttle_initial.unwrap_or(t.initial);
        t.step = self.throttle_step.unwrap_or(t.step);
        t.max = self.throttle_max.unwrap_or(t.max);
        o.sender_process = self.sender_process.or(o.sender_process);
        o.mode = self.mode.unwrap_or(o.mode);
        o.recover = self.recover;
        o.insecure = self.insecure;
        o.check()
            .map_err(|(field, reason)| ApiFailure::bad(field, reason))?;
        Ok(o)
    }
}

/// The body of `PUT /vm/balloon` (the server reads it, `hover ctl
/// balloon` writes it): either field or both.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonRequest {
    /// What the guest is asked to give back, MiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_mib: Option<u64>,
    /// Seconds between requests for the guest's statistics (0: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats_polling_interval_s: Option<u32>,
}

impl BalloonRequest {
    pub(super) fn apply(
        &self,
        b: &crate::devices::virtio::balloon::BalloonControl,
    ) -> Result<(), ApiFailure> {
        if self.target_mib.is_none() && self.stats_polling_interval_s.is_none() {
            return Err(ApiFailure::bad(
                "target_mib",
                "give target_mib, stats_polling_interval_s or both".into(),
            ));
        }
        if let Some(mib) = self.target_mib {
            b.set_target_mib(mib)
                .map_err(|e| ApiFailure::bad("target_mib", e.to_string()))?;
        }
        if let Some(s) = self.stats_polling_interval_s {
            b.set_stats_interval(s);
        }
        Ok(())
    }
}

/// The body of `PUT /vm/halt-poll` (the server reads it, `hover ctl`
/// writes it).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HaltPollRequest {
    /// `fixed`, `auto` or `kvm-default` (`kvm_default` is read too).
    pub mode: String,
    /// The window of `fixed`, nanoseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_ns: Option<u64>,
    /// The governor's CPU budget of `auto`, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_pct: Option<f64>,
}

impl HaltPollRequest {
    pub(super) fn setting(&self) -> Result<HaltPoll, ApiFailure> {
        let unexpected = |field: &'static str| {
            ApiFailure::bad(
                field,
                format!("{field} does not go with mode {:?}", self.mode),
            )
        };
        match self.mode.as_str() {
            "fixed" => {
                if self.budget_pct.is_some() {
                    return Err(unexpected("budget_pct"));
                }
                let window_ns = self.window_ns.ok_or_else(|| {
                    ApiFailure::bad("window_ns", "mode fixed needs window_ns".into())
                })?;
                Ok(HaltPoll::Fixed { window_ns })
            }
            "auto" => {
                if self.window_ns.is_some() {
                    return Err(unexpected("window_ns"));
                }
                Ok(HaltPoll::Auto {
                    budget_pct: self
                        .budget_pct
                        .unwrap_or(crate::config::halt_poll::DEFAULT_BUDGET_PCT),
                })
            }
            "kvm-default" | "kvm_default" => match (self.window_ns, self.budget_pct) {
                (Some(_), _) => Err(unexpected("window_ns")),
                (_, Some(_)) => Err(unexpected("budget_pct")),
                _ => Ok(HaltPoll::KvmDefault),
            },
            other => Err(ApiFailure::bad(
                "mode",
                format!("unknown mode {other:?}: use fixed, auto or kvm-default"),
            )),
        }
    }
}

/// An error answer: HTTP status, message, and the request field at fault.
#[derive(Debug)]
pub(super) struct ApiFailure {
    pub(super) status: u16,
    pub(super) message: String,
    pub(super) field: Option<String>,
}

impl ApiFailure {
    pub(super) fn new(status: u16, message: String) -> Self {
        ApiFailure {
            status,
            message,
            field: None,
        }
    }

    pub(super) fn bad(field: &str, message: String) -> Self {
        ApiFailure {
            status: 400,
            message,
            field: Some(field.into()),
        }
    }
}

impl From<CommandError> for ApiFailure {
    fn from(e: CommandError) -> Self {
        use crate::state::file::SnapshotError;
        let message = e.to_string();
        match e {
            CommandError::WrongState { .. } => ApiFailure::new(409, message),
            CommandError::Invalid { field, .. } => ApiFailure::bad(field, message),
            CommandError::Snapshot(SnapshotError::Exists(_)) => ApiFailure {
                status: 409,
                message,
                field: Some("path".into()),
            },
            CommandError::Snapshot(SnapshotError::Io { .. }) => ApiFailure {
                status: 400,
                message,
                field: Some("path".into()),
            },
            CommandError::Gone => ApiFailure::new(503, message),
            CommandError::Migrating(..) => ApiFailure::new(409, message),
            CommandError::Migration(ref m) => {
                use crate::migration::MigrationError as M;
                ApiFailure::new(
                    match m {
                        M::Connect { .. }
                        | M::Refused(_)
                        | M::Auth(_)
                        | M::Wire(_)
                        | M::Link(_) => 502,
                        M::NoConvergence(_) => 504,
                        M::GuestEnded => 409,
                        _ => 500,
                    },
                    message,
                )
            }
            _ => ApiFailure::new(500, message),
        }
    }
}

/// Parse a JSON body into `T`, naming the field at fault.
pub(super) fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiFailure> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let v: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    if v.is_ok() {
        if let Err(e) = de.end() {
            return Err(ApiFailure {
                status: 400,
                message: format!("invalid request body: {e}"),
                field: Some("body".into()),
            });
        }
    }
    v.map_err(|e| {
        let path = e.path().to_string();
        let msg = e.inner().to_string();
        // A wrong value is named by its path; a missing or unknown field
        // only in serde's message, in backquotes; bad JSON by neither.
        let field = if path != "." && path != "?" {
            path
        } else {
            msg.split('`').nth(1).unwrap_or("body").to_string()
        };
        ApiFailure {
            status: 400,
            message: format!("invalid request body: {msg}"),
            field: Some(field),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_migrate_request_with_an_unknown_name_is_refused_naming_its_field() {
        for (body, field) in [
            (
                r#"{"to":"unix:/x","dirty_tracking":"often"}"#,
                "dirty_tracking",
            ),
            (r#"{"to":"unix:/x","mode":"sideways"}"#, "mode"),
            (
                r#"{"to":"unix:/x","sender_process":"mmap"}"#,
                "sender_process",
            ),
        ] {
            let e = parse_body::<MigrateRequest>(body.as_bytes()).unwrap_err();
            assert_eq!((e.status, e.field.as_deref()), (400, Some(field)), "{body}");
        }
        let m = parse_body::<MigrateRequest>(
            br#"{"to":"unix:/x","dirty_tracking":"ring","mode":"postcopy","sender_process":"per-page"}"#,
        )
        .unwrap();
        assert_eq!(m.dirty_tracking, Some(crate::migration::Tracker::Ring));
        assert_eq!(m.mode, Some(crate::migration::postcopy::Mode::Postcopy));
        assert_eq!(
            m.sender_process,
            Some(crate::migration::mapper::MapMode::PerPage)
        );
    }

    #[test]
    fn halt_poll_requests_name_the_bad_field() {
        let parse = |s: &str| parse_body::<HaltPollRequest>(s.as_bytes()).and_then(|r| r.setting());
        assert_eq!(
            parse(r#"{"mode":"fixed","window_ns":5}"#).unwrap(),
            HaltPoll::Fixed { window_ns: 5 }
        );
        assert_eq!(
            parse(r#"{"mode":"auto"}"#).unwrap(),
            HaltPoll::Auto { budget_pct: 2.5 }
        );
        let e = parse(r#"{"mode":"fixed"}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("window_ns"));
        let e = parse(r#"{"mode":"auto","window_ns":1}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("window_ns"));
        let e = parse(r#"{"mode":"sometimes"}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("mode"));
        let e = parse(r#"{"mode":"fixed","window_ns":1,"colour":2}"#).unwrap_err();
        assert_eq!((e.status, e.field.as_deref()), (400, Some("colour")));
        let e = parse(r#"{"mode":"fixed","window_ns":-1}"#).unwrap_err();
        assert_eq!((e.status, e.field.as_deref()), (400, Some("window_ns")));
        let e = parse("{not json").unwrap_err();
        assert_eq!((e.status, e.field.as_deref()), (400, Some("body")));
    }

    /// What a client writes with the shared types is what the server reads.
    #[test]
    fn request_types_round_trip_through_json() {
        let m = MigrateRequest {
            to: "unix:/tmp/in.sock".into(),
            downtime_ms: Some(7),
            mode: Some(crate::migration::postcopy::Mode::Hybrid),
            verify: true,
            ..Default::default()
        };
        let json = serde_json::to_string(&m).unwrap();
        assert!(!json.contains("null"), "absent fields are left out: {json}");
        let o = parse_body::<MigrateRequest>(json.as_bytes())
            .unwrap()
            .options()
            .unwrap();
        assert_eq!(o.downtime, Duration::from_millis(7));
        assert!(o.verify);
        let h = HaltPollRequest {
            mode: "auto".into(),
            window_ns: None,
            budget_pct: Some(4.0),
        };
        let back: HaltPollRequest =
            parse_body(serde_json::to_string(&h).unwrap().as_bytes()).unwrap();
        assert_eq!(back.setting().unwrap(), HaltPoll::Auto { budget_pct: 4.0 });
        let s = SnapshotRequest {
            path: "/tmp/s".into(),
            stop: true,
            hot_window_ms: None,
        };
        let back: SnapshotRequest =
            parse_body(serde_json::to_string(&s).unwrap().as_bytes()).unwrap();
        assert!(back.stop && back.hot_window_ms.is_none());
    }

    #[test]
    fn snapshot_requests_are_checked() {
        let r: SnapshotRequest = parse_body(br#"{"path":"/tmp/x"}"#).unwrap();
        assert!(!r.stop);
        let e = parse_body::<SnapshotRequest>(br#"{"stop":true}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("path"));
        let e = parse_body::<SnapshotRequest>(br#"{"path":"/x","stop":"yes"}"#).unwrap_err();
        assert_eq!((e.status, e.field.as_deref()), (400, Some("stop")));
    }
}
