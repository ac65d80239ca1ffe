//! The plots drawn from stored samples: one bar and one whisker per mode.

use super::*;

/// Filled rectangles of series colour `k` in an SVG: its bars and its
/// legend swatch (its square markers, 8 by 8, aside).
pub(crate) fn rects_of(svg: &str, k: usize) -> usize {
    let c = PALETTE[k];
    let fill = format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
    svg.split("<rect")
        .skip(1)
        .map(|r| r.split("/>").next().unwrap_or(""))
        .filter(|r| r.contains(&fill))
        .filter(|r| !(r.contains("width=\"8\"") && r.contains("height=\"8\"")))
        .count()
}

/// Whiskers in an SVG: each is three 2-px paths of two points (a
/// line series' path has more points, a legend's is 3 px wide).
pub(crate) fn whiskers(svg: &str) -> usize {
    svg.split("<polyline")
        .skip(1)
        .filter(|p| {
            let p = p.split("/>").next().unwrap_or("");
            let points = p
                .split("points=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .map_or(0, |pts| pts.split_whitespace().count());
            p.contains("stroke-width=\"2\"") && points == 2
        })
        .count()
        / 3
}

#[test]
fn min_median_max_of_a_sample() {
    assert_eq!(min_median_max(&[3.0, 1.0, 2.0]), Some((1.0, 2.0, 3.0)));
    assert_eq!(min_median_max(&[4.0, 1.0, 2.0, 3.0]), Some((1.0, 2.5, 4.0)));
    assert_eq!(min_median_max(&[]), None);
}

#[test]
fn labels_wrap_to_their_slot() {
    assert_eq!(
        wrap("guest haltpoll + governor", 10),
        ["guest", "haltpoll +", "governor"]
    );
    assert_eq!(wrap("KVM default", 20), ["KVM default"]);
}

#[test]
fn dates_are_civil() {
    let t = today();
    assert_eq!(t.len(), 10, "{t}");
    assert!(t.starts_with("20"), "{t}");
}

#[test]
fn bars_have_one_whisker_each() {
    let dir = std::env::temp_dir().join(format!("hover-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bars.svg");
    let fig = Figure {
        title: "t".into(),
        caption: caption("hover bench x", "2026-11-26"),
        x_desc: "x".into(),
        y_desc: "y".into(),
    };
    let groups = ["a".to_string(), "b".to_string(), "c".to_string()];
    let series = [
        Bars {
            label: "one".into(),
            rounds: vec![vec![1.0, 2.0], vec![3.0], vec![2.0, 5.0]],
        },
        Bars {
            label: "two".into(),
            rounds: vec![vec![2.0], vec![], vec![1.0, 1.5, 4.0]],
        },
    ];
    bars(&path, &fig, &groups, &series).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    // Bars plus one legend swatch each; "two" has no bar at b.
    assert_eq!(rects_of(&svg, 0), 3 + 1);
    assert_eq!(rects_of(&svg, 1), 2 + 1);
    assert_eq!(whiskers(&svg), 5);
    assert!(svg.contains("hover bench x"), "the caption");
    // Nothing measured: an error, never an empty picture.
    let empty = [Bars {
        label: "none".into(),
        rounds: vec![vec![], vec![], vec![]],
    }];
    assert!(matches!(
        bars(&path, &fig, &groups, &empty),
        Err(BenchError::Input(_))
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_that_is_not_a_results_file_is_refused() {
    let dir = std::env::temp_dir().join(format!("hover-replot-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out");
    for (name, text) in [
        ("notjson.json", "nope"),
        ("noscenario.json", "{}"),
        ("other.json", r#"{"scenario": "boot"}"#),
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
    ];
    for (file, svg, series, drawn) in cases {
        from_results(&docs.join(file), &dir).unwrap();
        let text = std::fs::read_to_string(dir.join(svg)).unwrap();
        assert_eq!(whiskers(&text), drawn, "{svg}: a whisker per bar or point");
        if svg != "snapshot.svg" {
            let bars: usize = (0..series).map(|k| rects_of(&text, k) - 1).sum();
            assert_eq!(bars, drawn, "{svg}: bars");
        }
        assert!(
            text.contains("hover bench"),
            "{svg}: the caption names the command"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
