//! Aligned text tables and human-readable numbers: the benchmark reports' tables and
//! the advm command's own (doctor, stat, image, run --stats).

use crate::Row;

/// Formats a number with a sensible precision for a table.
pub fn fmt_num(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let a = x.abs();
    if x.fract() == 0.0 && a < 1e15 {
        format!("{x:.0}")
    } else if a >= 1e6 || (a > 0.0 && a < 1e-3) {
        format!("{x:.3e}")
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.4}")
    }
}

/// Renders rows as an aligned text table (medians; min-max shown when runs differ).
pub fn render_table(rows: &[Row]) -> String {
    let mut header: Vec<String> = Vec::new();
    for r in rows {
        for (k, _) in &r.config {
            if !header.contains(k) {
                header.push(k.clone());
            }
        }
    }
    let n_config = header.len();
    for r in rows {
        for f in &r.figures {
            let h = format!("{} ({})", f.name, f.unit);
            if !header.contains(&h) {
                header.push(h);
            }
        }
    }
    let mut cells: Vec<Vec<String>> = vec![header.clone()];
    for r in rows {
        let mut line = vec![String::new(); header.len()];
        for (k, v) in &r.config {
            let i = header.iter().position(|h| h == k).expect("header has every key");
            line[i] = v.clone();
        }
        for f in &r.figures {
            let h = format!("{} ({})", f.name, f.unit);
            let i = header[n_config..].iter().position(|x| *x == h).expect("header has every figure") + n_config;
            line[i] = if f.runs.len() > 1 && f.min != f.max {
                format!("{} [{}..{}]", fmt_num(f.median), fmt_num(f.min), fmt_num(f.max))
            } else {
                fmt_num(f.median)
            };
        }
        cells.push(line);
    }
    render_cells(&cells)
}

/// Aligns a grid of cells into columns separated by two spaces; first row is the header.
pub fn render_cells(cells: &[Vec<String>]) -> String {
    let cols = cells.iter().map(|r| r.len()).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..cols).map(|c| cells.iter().map(|r| r.get(c).map_or(0, |s| s.chars().count())).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for (i, row) in cells.iter().enumerate() {
        let line: Vec<String> = row.iter().enumerate().map(|(c, s)| format!("{s:<w$}", w = widths[c])).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
        if i == 0 {
            out.push_str(&widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  "));
            out.push('\n');
        }
    }
    out
}

/// Human-readable byte size ("64 KiB", "1 GiB").
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Figure;

    #[test]
    fn table_aligns_columns() {
        let rows = vec![
            Row::new().with("size", "4 KiB").figure(Figure::single("time", "ms", 1.5)),
            Row::new().with("size", "1 GiB").figure(Figure::new("time", "ms", vec![100.0, 120.0, 110.0])),
        ];
        let t = render_table(&rows);
        assert_eq!(t.lines().next().unwrap(), "size   time (ms)");
        assert!(t.contains("1 GiB  110 [100..120]"), "{t}");
        assert_eq!(fmt_bytes(64 * 1024), "64 KiB");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
    }
}
