//! Output of a run: an aligned table for people, JSON for machines, and an SVG line
//! plot (one series per policy) per scenario.

use serde_json::Value;
use std::fmt::Write;

/// An aligned text table.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.len());
            }
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:>w$}", w = widths[i]))
            .collect();
        let _ = writeln!(out, "{}", parts.join("  "));
    };
    line(&mut out, header.to_vec());
    line(
        &mut out,
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect(),
    );
    for row in rows {
        line(&mut out, row.iter().map(String::as_str).collect());
    }
    out
}

/// A number for a table cell.
pub fn num(v: &Value) -> String {
    match v.as_f64() {
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 1.0 => format!("{x:.2}"),
        Some(x) => format!("{x:.3}"),
        None => "-".into(),
    }
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// An SVG line plot: `series` of (name, points) over a shared x axis.
pub fn svg_plot(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> String {
    let (w, h, left, right, top, bottom) = (640.0, 400.0, 70.0, 170.0, 40.0, 50.0);
    let xs = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0));
    let ys = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.1));
    let (x_min, x_max) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let y_max = ys.fold(0.0_f64, f64::max).max(1e-9) * 1.1;
    let (x_min, x_max) = if x_min >= x_max {
        (x_min - 1.0, x_min + 1.0)
    } else {
        (x_min, x_max)
    };
    let px = |x: f64| left + (x - x_min) / (x_max - x_min) * (w - left - right);
    let py = |y: f64| h - bottom - y / y_max * (h - top - bottom);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="15">{}</text>"#,
        left,
        escape(title)
    );
    let _ = writeln!(
        s,
        r#"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>"#,
        h - bottom,
        w - right,
        h - bottom,
        h - bottom
    );
    for i in 0..=4 {
        let y = y_max * f64::from(i) / 4.0;
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{}</text><line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="#ddd"/>"##,
            left - 6.0,
            py(y) + 4.0,
            short(y),
            py(y),
            w - right,
            py(y)
        );
    }
    let mut ticks: Vec<f64> = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for x in ticks {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            px(x),
            h - bottom + 16.0,
            short(x)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (left + w - right) / 2.0,
        h - 12.0,
        escape(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>"#,
        (top + h - bottom) / 2.0,
        (top + h - bottom) / 2.0,
        escape(y_label)
    );
    for (i, (name, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for (x, y) in points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                px(*x),
                py(*y)
            );
        }
        let ly = top + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="12" height="3" fill="{color}"/><text x="{}" y="{}">{}</text>"#,
            w - right + 10.0,
            ly + 4.0,
            w - right + 28.0,
            ly + 8.0,
            escape(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn short(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_plots_are_svg() {
        let t = table(&["policy", "p50"], &[vec!["kv-aware".into(), "1.5".into()]]);
        assert_eq!(t.lines().next().unwrap(), "  policy  p50");
        assert!(t.contains("kv-aware  1.5"));
        let svg = svg_plot(
            "t <x>",
            "rate",
            "s",
            &[("a".into(), vec![(1.0, 2.0), (2.0, 3.0)])],
        );
        assert!(svg.starts_with("<svg") && svg.contains("polyline") && svg.contains("t &lt;x&gt;"));
    }
}
