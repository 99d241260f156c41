//! Summaries of measurements (pure).

use serde_json::{Value, json};

/// The `q` quantile (0..=1) of `values` by nearest rank; 0 for none.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Mean; 0 for none.
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// Coefficient of variation (stddev / mean); 0 when the mean is 0.
pub fn spread(values: &[f64]) -> f64 {
    let m = mean(values);
    if m == 0.0 {
        return 0.0;
    }
    let var = values.iter().map(|v| (v - m).powi(2)).sum::<f64>() / values.len() as f64;
    var.sqrt() / m
}

/// p50/p90/p99/mean of `values`, scaled by `scale`, as JSON.
pub fn summary(values: &[f64], scale: f64) -> Value {
    json!({
        "p50": quantile(values, 0.5) * scale,
        "p90": quantile(values, 0.9) * scale,
        "p99": quantile(values, 0.99) * scale,
        "mean": mean(values) * scale,
        "n": values.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_means_and_spread() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
        assert_eq!(mean(&[1.0, 3.0]), 2.0);
        assert_eq!(spread(&[5.0, 5.0, 5.0]), 0.0);
        assert!((spread(&[0.0, 10.0]) - 1.0).abs() < 1e-9);
        assert_eq!(summary(&[1.0, 2.0], 1000.0)["p50"], 1000.0);
    }
}
