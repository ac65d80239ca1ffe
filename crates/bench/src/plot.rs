//! Line plots as SVG (plotters), for scenario results.

use std::path::Path;

use plotters::prelude::*;

use crate::BenchError;

/// One line: a label and its (x, y) points.
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// Draw `series` to an SVG file at `path`, x on a log2-like categorical axis
/// given by `x_labels` (one per distinct x, in order).
pub fn lines(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    x_labels: &[String],
    series: &[Series],
) -> Result<(), BenchError> {
    let err = |e: String| BenchError::Write {
        path: path.display().to_string(),
        source: std::io::Error::other(e),
    };
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        * 1.1;
    let n = x_labels.len().max(1);
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..y_max.max(1.0))
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round() as usize;
            if (x - i as f64).abs() < 1e-6 {
                x_labels.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .draw()
        .map_err(|e| err(e.to_string()))?;
    let palette = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    for (k, s) in series.iter().enumerate() {
        let color = palette[k % palette.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| err(e.to_string()))?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| err(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    println!("wrote {}", path.display());
    Ok(())
}
