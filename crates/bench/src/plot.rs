//! Plots as SVG (plotters) that a reader takes in at a glance: categorical
//! modes as grouped bars, a real x axis (memory, time) as lines; every
//! value the median of its rounds with a min-max whisker; one colour of a
//! colour-blind-safe palette (Okabe and Ito's) and one marker per series;
//! group labels wrapped to their slot so they never overlap; a title that
//! states the experiment and a caption with the command and the date.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::BenchError;

/// What a plot shows and how it was measured.
pub struct Figure {
    /// The experiment, in a line.
    pub title: String,
    /// The command that measured it and the date (see [`caption`]).
    pub caption: String,
    /// What the x axis (or the groups) are.
    pub x_desc: String,
    /// What the y axis is, with its unit.
    pub y_desc: String,
}

/// One series of a grouped bar chart: per group, the rounds' values (an
/// empty list: not measured there, no bar).
pub struct Bars {
    /// Legend label.
    pub label: String,
    /// Per group, each round's value.
    pub rounds: Vec<Vec<f64>>,
}

/// One series over a real x axis: per x, the rounds' values.
pub struct Line {
    /// Legend label.
    pub label: String,
    /// (x, each round's value), in x order.
    pub points: Vec<(f64, Vec<f64>)>,
}

/// Okabe and Ito's palette, told apart with any colour vision.
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(213, 94, 0),
    RGBColor(86, 180, 233),
    RGBColor(240, 228, 66),
    RGBColor(0, 0, 0),
];

/// `(min, median, max)` of `v` (None: empty).
pub fn min_median_max(v: &[f64]) -> Option<(f64, f64, f64)> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    Some((s[0], median, s[n - 1]))
}

/// The distinct values of `items`, in the order first seen (the groups
/// or series of a results file's rows).
pub fn distinct<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for x in items {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// The string field `key` of each of `rows`, distinct, in order.
pub fn distinct_field(rows: &[serde_json::Value], key: &str) -> Vec<String> {
    distinct(
        rows.iter()
            .map(|r| r[key].as_str().unwrap_or("").to_string()),
    )
}

/// The caption of a results document: its command and date (`fallback`
/// for the command of a file that recorded none).
pub fn caption_of(doc: &serde_json::Value, fallback: &str) -> String {
    caption(
        doc["command"].as_str().unwrap_or(fallback),
        doc["date"].as_str().unwrap_or("date not recorded"),
    )
}

/// A caption: the command and the date it ran.
pub fn caption(command: &str, date: &str) -> String {
    format!("{command}  ({date})")
}

/// Today's date (UTC), `YYYY-MM-DD`.
pub fn today() -> String {
    let days = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

const SIZE: (u32, u32) = (960, 600);
const FONT: &str = "sans-serif";

fn write_err(path: &Path) -> impl Fn(String) -> BenchError + '_ {
    move |e| BenchError::Write {
        path: path.display().to_string(),
        source: std::io::Error::other(e),
    }
}

/// `label` cut into lines of at most `width` characters, at spaces.
fn wrap(label: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in label.split_whitespace() {
        match lines.last_mut() {
            Some(l) if l.len() + 1 + word.len() <= width => {
                l.push(' ');
                l.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// Draw marker `k` (circle, triangle, square, cross, ...) at `at`.
fn marker<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    k: usize,
    at: (f64, f64),
    color: RGBColor,
) -> Result<(), String> {
    let filled = color.filled();
    let outline = BLACK.stroke_width(1);
    let r = match k % 4 {
        0 => chart
            .draw_series(std::iter::once(Circle::new(at, 5, filled)))
            .map(drop),
        1 => chart
            .draw_series(std::iter::once(TriangleMarker::new(at, 6, filled)))
            .map(drop),
        2 => chart
            .draw_series(std::iter::once(
                EmptyElement::at(at) + Rectangle::new([(-4, -4), (4, 4)], filled),
            ))
            .map(drop),
        _ => chart
            .draw_series(std::iter::once(Cross::new(at, 5, color.stroke_width(3))))
            .map(drop),
    };
    r.map_err(|e| e.to_string())?;
    // A dark rim on the round markers (the first series') keeps them
    // apart from the bar or line beneath.
    if k.is_multiple_of(4) {
        chart
            .draw_series(std::iter::once(Circle::new(at, 5, outline)))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A min-max whisker at x = `x` (half-width `cap` in x units), in `color`.
fn whisker<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    x: f64,
    (lo, hi): (f64, f64),
    cap: f64,
    color: RGBColor,
) -> Result<(), String> {
    let style = color.stroke_width(2);
    chart
        .draw_series([
            PathElement::new(vec![(x, lo), (x, hi)], style),
            PathElement::new(vec![(x - cap, lo), (x + cap, lo)], style),
            PathElement::new(vec![(x - cap, hi), (x + cap, hi)], style),
        ])
        .map(drop)
        .map_err(|e| e.to_string())
}

fn y_top(values: impl Iterator<Item = f64>) -> f64 {
    let max = values.filter(|v| v.is_finite()).fold(0.0, f64::max);
    // Headroom above the tallest whisker for the legend.
    if max > 0.0 {
        max * 1.3
    } else {
        1.0
    }
}

/// Draw the caption along the bottom of `root`.
fn draw_caption<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    text: &str,
) -> Result<(), String> {
    let style = TextStyle::from((FONT, 13).into_font())
        .color(&RGBColor(60, 60, 60))
        .pos(Pos::new(HPos::Left, VPos::Bottom));
    root.draw(&Text::new(text.to_string(), (12, SIZE.1 as i32 - 8), style))
        .map_err(|e| e.to_string())
}

/// A chart on `root` with `fig`'s title, x over `x`, y from 0 to `y_max`,
/// `x_label_area` pixels under the plot for the x labels.
fn chart_on<'a, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, plotters::coord::Shift>,
    fig: &Figure,
    x: std::ops::Range<f64>,
    y_max: f64,
    x_label_area: u32,
) -> Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>, String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    ChartBuilder::on(root)
        .caption(&fig.title, (FONT, 20))
        .margin(16)
        .margin_bottom(40)
        .x_label_area_size(x_label_area)
        .y_label_area_size(80)
        .build_cartesian_2d(x, 0f64..y_max)
        .map_err(|e| e.to_string())
}

/// The legend at `position`, the caption, and the file written.
fn finish<'a, DB: DrawingBackend + 'a>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    fig: &Figure,
    position: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    draw_caption(root, &fig.caption)?;
    root.present().map_err(|e| e.to_string())
}

/// Grouped bars: one group per entry of `groups`, in it one bar per series
/// (its median) with a whisker from the rounds' minimum to their maximum.
pub fn bars(
    path: &Path,
    fig: &Figure,
    groups: &[String],
    series: &[Bars],
) -> Result<(), BenchError> {
    if series
        .iter()
        .all(|s| s.rounds.iter().all(|r| min_median_max(r).is_none()))
    {
        return Err(nothing_to_draw(path));
    }
    let err = write_err(path);
    let n = groups.len().max(1);
    let y_max = y_top(
        series
            .iter()
            .flat_map(|s| s.rounds.iter().flatten().copied()),
    );
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    let mut chart = chart_on(&root, fig, -0.5f64..(n as f64 - 0.5), y_max, 70).map_err(&err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_desc(&fig.x_desc)
        .y_desc(&fig.y_desc)
        .y_label_formatter(&|v| format!("{v}"))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    let k = series.len().max(1) as f64;
    let width = 0.8 / k;
    for (si, s) in series.iter().enumerate() {
        let color = PALETTE[si % PALETTE.len()];
        let mut first = true;
        for (g, rounds) in s.rounds.iter().enumerate().take(n) {
            let Some((lo, mid, hi)) = min_median_max(rounds) else {
                continue;
            };
            let x0 = g as f64 - 0.4 + si as f64 * width;
            let x1 = x0 + width * 0.92;
            let xc = (x0 + x1) / 2.0;
            let bar = chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0, 0.0), (x1, mid)],
                    color.filled(),
                )))
                .map_err(|e| err(e.to_string()))?;
            if first {
                bar.label(s.label.clone()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 18, y + 6)], color.filled())
                });
                first = false;
            }
            whisker(&mut chart, xc, (lo, hi), width * 0.2, BLACK).map_err(&err)?;
            marker(&mut chart, si, (xc, mid), color).map_err(&err)?;
        }
    }
    // Group labels under their slots, wrapped to the slot's width.
    let slot_px = (SIZE.0 as f64 - 130.0) / n as f64;
    let chars = ((slot_px / 7.5) as usize).max(4);
    let style = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    for (g, label) in groups.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(g as f64, 0.0));
        for (line, text) in wrap(label, chars).iter().enumerate() {
            root.draw(&Text::new(
                text.clone(),
                (px, py + 6 + 15 * line as i32),
                style.clone(),
            ))
            .map_err(|e| err(e.to_string()))?;
        }
    }
    finish(&root, &mut chart, fig, SeriesLabelPosition::UpperLeft).map_err(&err)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Lines over a real x axis: each series' medians joined, a marker and a
/// min-max whisker at every point; `x_label` formats the x ticks.
pub fn lines(
    path: &Path,
    fig: &Figure,
    series: &[Line],
    x_label: &dyn Fn(f64) -> String,
) -> Result<(), BenchError> {
    if series
        .iter()
        .all(|s| s.points.iter().all(|(_, v)| min_median_max(v).is_none()))
    {
        return Err(nothing_to_draw(path));
    }
    let err = write_err(path);
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (x_min, x_max) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (x_min, x_max) = if x_min <= x_max {
        (x_min, x_max)
    } else {
        (0.0, 1.0)
    };
    let pad = ((x_max - x_min) * 0.03).max(0.5);
    let y_max = y_top(
        series
            .iter()
            .flat_map(|s| s.points.iter().flat_map(|p| p.1.iter().copied())),
    );
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    let mut chart = chart_on(&root, fig, (x_min - pad)..(x_max + pad), y_max, 50).map_err(&err)?;
    chart
        .configure_mesh()
        .x_desc(&fig.x_desc)
        .y_desc(&fig.y_desc)
        .x_labels(10)
        .x_label_formatter(&|x| x_label(*x))
        .y_label_formatter(&|v| format!("{v}"))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    let cap = (x_max - x_min).max(1.0) * 0.006;
    // Series at the same x are drawn a little apart, so that their
    // whiskers never hide one another.
    let dodge = (x_max - x_min).max(1.0) * 0.008;
    let mid = (series.len() as f64 - 1.0) / 2.0;
    for (si, s) in series.iter().enumerate() {
        let color = PALETTE[si % PALETTE.len()];
        let shift = (si as f64 - mid) * dodge;
        let medians: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter_map(|(x, v)| min_median_max(v).map(|(_, m, _)| (*x + shift, m)))
            .collect();
        chart
            .draw_series(LineSeries::new(
                medians.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| err(e.to_string()))?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        for (x, v) in &s.points {
            if let Some((lo, median, hi)) = min_median_max(v) {
                // In the series' colour: whiskers of one x are told apart.
                whisker(&mut chart, x + shift, (lo, hi), cap, color).map_err(&err)?;
                marker(&mut chart, si, (x + shift, median), color).map_err(&err)?;
            }
        }
    }
    finish(&root, &mut chart, fig, SeriesLabelPosition::UpperRight).map_err(&err)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The error for a plot with nothing to draw (a results file whose rows
/// are missing or renamed): never an empty picture.
fn nothing_to_draw(path: &Path) -> BenchError {
    BenchError::Input(format!(
        "{}: no measured values to draw (is the results file from this version of hover bench?)",
        path.display()
    ))
}

#[cfg(test)]
pub(crate) mod tests;
