//! The plots `hover bench migrate` draws from `migrate.json`: downtime by
//! tracker (part 1), the sending thread's cycles per page by batch size
//! (part 2) and the sender process's cycles per page by mapping mode
//! (part 3). Each is drawn from the stored samples alone, so
//! `hover bench plot` draws the same figures again.

use std::path::Path;

use serde_json::Value;

use crate::plot::{self, Bars, Figure};
use crate::BenchError;

/// Every plot of a `migrate.json` document into `out`: the downtime plot
/// always, the batching and mapping plots when their parts ran.
pub fn plot(doc: &Value, out: &Path) -> Result<(), BenchError> {
    downtime(doc, out)?;
    if has_samples(doc, "batch_samples") {
        batches(doc, out)?;
    }
    if has_samples(doc, "mapping_samples") {
        mapping(doc, out)?;
    }
    Ok(())
}

fn has_samples(doc: &Value, key: &str) -> bool {
    doc[key].as_array().is_some_and(|a| !a.is_empty())
}

fn samples(doc: &Value, key: &str) -> Vec<Value> {
    doc[key].as_array().cloned().unwrap_or_default()
}

/// `migrate_downtime.svg`: per guest memory and working set, each
/// tracker's downtime (median of rounds, min-max whisker).
fn downtime(doc: &Value, out: &Path) -> Result<(), BenchError> {
    let samples = samples(doc, "tracker_samples");
    let groups = plot::distinct(samples.iter().map(|s| {
        (
            s["memory"].as_str().unwrap_or("").to_string(),
            s["wss"].as_str().unwrap_or("").to_string(),
        )
    }));
    let trackers = plot::distinct_field(&samples, "tracker");
    let series: Vec<Bars> = trackers
        .iter()
        .map(|t| Bars {
            label: t.clone(),
            rounds: groups
                .iter()
                .map(|(m, w)| {
                    samples
                        .iter()
                        .filter(|s| s["memory"] == m.as_str() && s["wss"] == w.as_str())
                        .filter(|s| s["tracker"] == t.as_str())
                        .filter_map(|s| s["report"]["downtime_ms"].as_f64())
                        .collect()
                })
                .collect(),
        })
        .collect();
    let labels: Vec<String> = groups
        .iter()
        .map(|(m, w)| format!("{m} guest, {w} written"))
        .collect();
    plot::bars(
        &out.join("migrate_downtime.svg"),
        &Figure {
            title: "Seeds 3 and 4, pre-copy live migration: downtime by dirty tracker".into(),
            caption: plot::caption_of(doc, "hover bench migrate"),
            x_desc: "guest memory and kvstore's working set".into(),
            y_desc: "downtime, ms".into(),
        },
        &labels,
        &series,
    )
}

/// `migrate_batches.svg`: per batch size, the sending thread's CPU cycles
/// per page (median of rounds, min-max whisker).
fn batches(doc: &Value, out: &Path) -> Result<(), BenchError> {
    let samples = samples(doc, "batch_samples");
    let sizes = plot::distinct(samples.iter().filter_map(|s| s["batch_pages"].as_u64()));
    let series = [Bars {
        label: "the VMM's sending thread".into(),
        rounds: sizes
            .iter()
            .map(|&n| cycles_where(&samples, |s| s["batch_pages"].as_u64() == Some(n)))
            .collect(),
    }];
    let labels: Vec<String> = sizes.iter().map(|n| format!("{n} pages")).collect();
    plot::bars(
        &out.join("migrate_batches.svg"),
        &Figure {
            title: "Seed 3, batched transfer: the sender's cost per page by batch size".into(),
            caption: plot::caption_of(doc, "hover bench migrate"),
            x_desc: "pages per frame (an idle 64 MiB working set, 1 GiB guest)".into(),
            y_desc: "sending thread's CPU cycles per page".into(),
        },
        &labels,
        &series,
    )
}

/// `migrate_mapping.svg`: per batch size, a sender process's CPU cycles
/// per page read in each mapping mode (median of rounds, min-max whisker).
fn mapping(doc: &Value, out: &Path) -> Result<(), BenchError> {
    let samples = samples(doc, "mapping_samples");
    let sizes = plot::distinct(samples.iter().filter_map(|s| s["batch_pages"].as_u64()));
    let series: Vec<Bars> = plot::distinct_field(&samples, "mode")
        .into_iter()
        .map(|mode| Bars {
            rounds: sizes
                .iter()
                .map(|&n| {
                    cycles_where(&samples, |s| {
                        s["mode"] == mode.as_str() && s["batch_pages"].as_u64() == Some(n)
                    })
                })
                .collect(),
            label: mode,
        })
        .collect();
    let labels: Vec<String> = sizes.iter().map(|n| format!("{n} pages")).collect();
    plot::bars(
        &out.join("migrate_mapping.svg"),
        &Figure {
            title: "Seed 3's setting: a sender process reading guest memory, by mapping mode"
                .into(),
            caption: plot::caption_of(doc, "hover bench migrate"),
            x_desc: "pages per request (64 MiB of memfd guest memory, read 3 times)".into(),
            y_desc: "sender process's CPU cycles per page".into(),
        },
        &labels,
        &series,
    )
}

fn cycles_where(samples: &[Value], keep: impl Fn(&Value) -> bool) -> Vec<f64> {
    samples
        .iter()
        .filter(|s| keep(s))
        .filter_map(|s| s["cycles_per_page"].as_f64())
        .collect()
}
