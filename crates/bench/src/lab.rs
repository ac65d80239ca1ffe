//! Plots of the KVM lab's figures (docs/LAB.md). A lab scenario runs inside
//! an emulated machine and prints one line per round; its per-round
//! figures, as the run printed them, go in a results file of this shape,
//! and `hover bench plot` draws them as it draws its own scenarios':
//!
//! ```json
//! {"scenario": "lab", "plot": "NAME.svg", "command": "...", "date": "...",
//!  "title": "...", "x_desc": "...", "y_desc": "...",
//!  "groups": ["a", "b"],
//!  "series": [{"label": "...", "rounds": [[1.0, 2.0], [3.0]]}]}
//! ```
//!
//! Each series has one list of rounds per group: a bar at their median
//! and a whisker from their minimum to their maximum. Other keys (a
//! `source` saying where the figures were printed) are kept, not drawn.

use std::path::Path;

use serde::Deserialize;

use crate::plot::{self, Bars, Figure};
use crate::BenchError;

/// The `scenario` of a lab results file.
pub const SCENARIO: &str = "lab";

#[derive(Deserialize)]
struct LabDoc {
    plot: String,
    command: String,
    date: String,
    title: String,
    x_desc: String,
    y_desc: String,
    groups: Vec<String>,
    series: Vec<LabSeries>,
}

#[derive(Deserialize)]
struct LabSeries {
    label: String,
    rounds: Vec<Vec<f64>>,
}

/// Draw a lab results file's plot into `out`.
pub fn plot(doc: &serde_json::Value, out: &Path) -> Result<(), BenchError> {
    let d: LabDoc = serde_json::from_value(doc.clone())
        .map_err(|e| BenchError::Input(format!("not a lab results file: {e}")))?;
    let name = Path::new(&d.plot);
    if name.components().count() != 1 || name.extension().is_none_or(|e| e != "svg") {
        return Err(BenchError::Input(format!(
            "\"plot\": {:?} is not a file name ending in .svg",
            d.plot
        )));
    }
    if let Some(s) = d.series.iter().find(|s| s.rounds.len() != d.groups.len()) {
        return Err(BenchError::Input(format!(
            "series {:?} has {} groups of rounds where {} groups are named",
            s.label,
            s.rounds.len(),
            d.groups.len()
        )));
    }
    let series: Vec<Bars> = d
        .series
        .into_iter()
        .map(|s| Bars {
            label: s.label,
            rounds: s.rounds,
        })
        .collect();
    plot::bars(
        &out.join(name),
        &Figure {
            title: d.title,
            caption: plot::caption(&d.command, &d.date),
            x_desc: d.x_desc,
            y_desc: d.y_desc,
        },
        &d.groups,
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lab_file_draws_its_bars_and_a_bad_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("hover-lab-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = serde_json::json!({
            "scenario": "lab", "plot": "x.svg", "command": "scripts/kvm-lab.sh run x",
            "date": "2026-11-28", "title": "t", "x_desc": "x", "y_desc": "y",
            "groups": ["a", "b"],
            "series": [{"label": "s", "rounds": [[1.0, 2.0], [3.0]]}],
        });
        plot(&good, &dir).unwrap();
        let text = std::fs::read_to_string(dir.join("x.svg")).unwrap();
        assert_eq!(crate::plot::tests::whiskers(&text), 2);
        for (key, bad) in [
            ("plot", serde_json::json!("../x.svg")),
            ("plot", serde_json::json!("x.png")),
            ("groups", serde_json::json!(["a"])),
            ("title", serde_json::json!(3)),
        ] {
            let mut doc = good.clone();
            doc[key] = bad;
            assert!(
                matches!(plot(&doc, &dir), Err(BenchError::Input(_))),
                "{key}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
