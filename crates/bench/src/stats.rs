//! Small summary statistics for benchmark tables.

use serde::Serialize;

/// Minimum, median, mean, 90th percentile and maximum of a sample.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Number of values.
    pub n: usize,
    /// Smallest.
    pub min: f64,
    /// Median (the lower middle for an even count).
    pub p50: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// 90th percentile (nearest rank).
    pub p90: f64,
    /// Largest.
    pub max: f64,
}

/// Summarize `values`; `None` when empty.
pub fn summarize(values: &[f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Some(Summary {
        n: v.len(),
        min: v[0],
        p50: v[(v.len() - 1) / 2],
        mean: v.iter().sum::<f64>() / v.len() as f64,
        p90: rank(0.9),
        max: v[v.len() - 1],
    })
}

impl Summary {
    /// "median (min-max)" with `digits` decimals: how every table shows a
    /// spread.
    pub(crate) fn text(&self, digits: usize) -> String {
        format!(
            "{:.d$} ({:.d$}-{:.d$})",
            self.p50,
            self.min,
            self.max,
            d = digits
        )
    }
}

/// "median (min-max)" of `v` (one value: itself; none: "-").
pub(crate) fn spread(v: &[f64], digits: usize) -> String {
    match summarize(v) {
        Some(s) if s.n > 1 => s.text(digits),
        Some(s) => format!("{:.d$}", s.p50, d = digits),
        None => "-".into(),
    }
}

/// Per-round ratios `base / x` (min/median/max); "-" if undefined.
pub(crate) fn ratios(base: &[f64], x: &[f64]) -> String {
    let r: Vec<f64> = base
        .iter()
        .zip(x)
        .filter(|(_, &x)| x > 0.0)
        .map(|(b, x)| b / x)
        .collect();
    match summarize(&r) {
        Some(s) => format!("{:.2}/{:.2}/{:.2}x", s.min, s.p50, s.max),
        None => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_a_sample() {
        let s = summarize(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!((s.n, s.min, s.p50, s.mean, s.max), (5, 1.0, 3.0, 3.0, 5.0));
        assert_eq!(s.p90, 5.0);
        assert!(summarize(&[]).is_none());
        let t = summarize(&(1..=10).map(f64::from).collect::<Vec<_>>()).unwrap();
        assert_eq!((t.p50, t.p90), (5.0, 9.0));
    }
}
