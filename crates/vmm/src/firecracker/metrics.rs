//! Firecracker-style metrics: one JSON object per line, written to the
//! file of `PUT /metrics` (or `--metrics-path`) on `FlushMetrics` and when
//! the VM ends. Its groups are Hover's: `vcpu` sums KVM's statistics over
//! the vCPUs, `hover` holds the live figures of `GET /vm/stats` without
//! the histograms.

use crate::sync::Locked;
use std::io::Write;

use super::{done, fault, Shared};
use crate::api::http::Answer;
use crate::api::Routes;

/// One metrics line: `utc_timestamp_ms`, the state, and the figures of
/// the running VM if there is one.
fn line(routes: Option<&Routes>) -> String {
    let utc_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut v = serde_json::json!({ "utc_timestamp_ms": utc_ms });
    match routes {
        None => v["state"] = "Not started".into(),
        Some(r) => {
            let live = r.live();
            let mut vcpu = std::collections::BTreeMap::<String, u64>::new();
            for stats in &live.vcpu_stats {
                for (k, n) in stats {
                    *vcpu.entry(k.clone()).or_default() += n;
                }
            }
            v["state"] = r.controller().info().state.name().into();
            v["vcpu"] = serde_json::to_value(vcpu).unwrap_or_default();
            let mut hover = serde_json::to_value(&live).unwrap_or_default();
            if let Some(o) = hover.as_object_mut() {
                o.remove("vcpu_stats");
                o.remove("vcpu_histograms");
            }
            v["hover"] = hover;
        }
    }
    let mut s = v.to_string();
    s.push('\n');
    s
}

/// Write a line if metrics are configured: whether one was written.
pub(super) fn flush(shared: &Shared, routes: Option<&Routes>) -> std::io::Result<bool> {
    let mut file = shared.metrics.locked();
    match file.as_mut() {
        Some(f) => f.write_all(line(routes).as_bytes()).map(|()| true),
        None => Ok(false),
    }
}

/// `FlushMetrics`: 204 once written.
pub(super) fn flush_answer(shared: &Shared, routes: Option<&Routes>) -> Answer {
    match flush(shared, routes) {
        Ok(true) => done(),
        Ok(false) => fault(
            400,
            "The metrics system is not initialized: PUT /metrics (or --metrics-path) first",
        ),
        Err(e) => fault(400, format!("cannot write the metrics: {e}")),
    }
}
