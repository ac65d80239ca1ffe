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
