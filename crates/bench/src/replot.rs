//! `hover bench plot FILE`: a scenario's plot drawn again from the results
//! file it wrote, dispatched on the file's scenario (beside the scenarios,
//! as `hover bench`'s own dispatch is; `plot.rs` draws and knows none of
//! them).

use std::path::Path;

use crate::BenchError;

/// Draw again, from a results file a scenario wrote (`apf.json`,
/// `boost.json`, `boot.json`, `boot_peer.json`, `dirty_log.json`, `halt_poll.json`,
/// `migrate.json`, `migrate_peer.json`, `migrate_postcopy.json`,
/// `snapshot.json`, a lab run's figures: `lab.rs`), the plots it drew, into `out`: a plot is always drawn
/// from the stored samples, so one drawn today and one drawn later from the
/// same file are the same.
pub fn from_results(file: &Path, out: &Path) -> Result<(), BenchError> {
    let bad = |why: String| BenchError::Input(format!("{}: {why}", file.display()));
    let text = std::fs::read_to_string(file).map_err(|e| bad(e.to_string()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let draw: fn(&serde_json::Value, &Path) -> Result<(), BenchError> =
        match doc["scenario"].as_str() {
            Some("apf") => crate::apf::plot,
            Some("boost") => crate::boost::plot,
            Some("dirty-log") => crate::dirty_log::plot,
            Some("halt-poll") if doc["rows"].is_array() => crate::halt_poll::plot,
            Some("migrate") => crate::migrate::plot,
            Some("migrate-postcopy") => crate::postcopy::plot,
            Some("snapshot") => crate::snapshot::plot,
            Some(crate::migrate_peer::SCENARIO) => crate::migrate_peer::plot,
            Some(crate::boot::PEER_SCENARIO) => crate::boot::plot_peer,
            Some("boot") => crate::boot::plot,
            Some(crate::lab::SCENARIO) => crate::lab::plot,
            Some(other) => return Err(bad(format!("scenario {other:?} draws no plot"))),
            None => {
                return Err(bad(
                    "no \"scenario\": not a results file of hover bench".into()
                ))
            }
        };
    std::fs::create_dir_all(out).map_err(|source| BenchError::Write {
        path: out.display().to_string(),
        source,
    })?;
    draw(&doc, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::tests::{rects_of, whiskers};

    #[test]
    fn a_file_that_is_not_a_results_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("hover-replot-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out");
        for (name, text) in [
            ("notjson.json", "nope"),
            ("noscenario.json", "{}"),
            ("other.json", r#"{"scenario": "runtime"}"#),
            ("norows.json", r#"{"scenario": "apf"}"#),
        ] {
            let f = dir.join(name);
            std::fs::write(&f, text).unwrap();
            let e = from_results(&f, &out).unwrap_err();
            assert!(matches!(e, BenchError::Input(_)), "{name}: {e}");
        }
        assert!(matches!(
            from_results(&dir.join("missing.json"), &out),
            Err(BenchError::Input(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Each stored results file (docs/bench) draws its plot again: one bar
    /// (or point) per mode and round set, each with its whisker.
    #[test]
    fn stored_results_draw_a_bar_and_a_whisker_per_mode() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/bench");
        let dir = std::env::temp_dir().join(format!("hover-replot-{}", std::process::id()));
        // (results file, its plot, series, bars or points drawn)
        let cases = [
            ("apf.json", "apf.svg", 3, 15),
            ("boost.json", "boost.svg", 3, 6),
            ("dirty_log.json", "dirty_log.svg", 1, 6),
            ("halt_poll.json", "halt_poll.svg", 2, 20),
            ("migrate.json", "migrate_downtime.svg", 4, 24),
            ("migrate_postcopy.json", "migrate_postcopy.svg", 1, 3),
            ("snapshot.json", "snapshot.svg", 3, 30),
            ("2026-11-28/apf.json", "apf.svg", 4, 8),
            ("2026-11-28/boot_peer.json", "boot_peer.svg", 2, 4),
            ("2026-11-28/boot.json", "boot.svg", 1, 3),
            ("2026-11-28/boot_mincore.json", "boot.svg", 1, 3),
            ("2026-11-28/dirty_log.json", "dirty_log.svg", 1, 6),
            ("2026-11-28/dirty_log_ring4096.json", "dirty_log.svg", 1, 4),
            ("2026-11-28/dirty_log_ring65536.json", "dirty_log.svg", 1, 4),
            ("2026-11-28/migrate.json", "migrate_downtime.svg", 4, 24),
            ("2026-11-28/migrate.json", "migrate_batches.svg", 1, 4),
            ("2026-11-28/migrate.json", "migrate_mapping.svg", 3, 12),
            ("2026-11-28/migrate_peer.json", "migrate_peer.svg", 4, 24),
            (
                "2026-11-28/migrate_postcopy.json",
                "migrate_postcopy.svg",
                1,
                3,
            ),
            (
                "2026-11-28/migrate_postcopy.json",
                "migrate_postcopy_pause.svg",
                1,
                3,
            ),
            ("2026-11-28/snapshot.json", "snapshot.svg", 3, 30),
            ("2026-11-28/snapshot.json", "snapshot_to_running.svg", 3, 9),
            ("2026-11-28/boost.json", "boost.svg", 4, 8),
            ("2026-11-28/halt_poll.json", "halt_poll.svg", 2, 20),
            ("2026-11-28/linux_boost.json", "linux_boost.svg", 2, 4),
            (
                "2026-11-28/linux_balloon_waves.json",
                "linux_balloon_waves.svg",
                1,
                4,
            ),
        ];
        for (file, svg, series, drawn) in cases {
            from_results(&docs.join(file), &dir).unwrap();
            let text = std::fs::read_to_string(dir.join(svg)).unwrap();
            assert_eq!(
                whiskers(&text),
                drawn,
                "{file} {svg}: a whisker per bar or point"
            );
            if svg != "snapshot.svg" {
                let bars: usize = (0..series).map(|k| rects_of(&text, k) - 1).sum();
                assert_eq!(bars, drawn, "{file} {svg}: bars");
            }
            let doc: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(docs.join(file)).unwrap()).unwrap();
            let command = doc["command"].as_str().unwrap_or("hover bench");
            assert!(
                text.contains(&command.replace('"', "&quot;")) || text.contains(command),
                "{file} {svg}: the caption names the command"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
