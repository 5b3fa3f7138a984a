//! `advm bench merge`'s plot: memory of all workers over time, one line per method,
//! both meters (distinct pages solid, the cgroup's anon+shmem dashed), as an SVG drawn
//! from the samples the bench took.

use std::fmt::Write;

/// One sample: `(seconds since the workers started, distinct bytes, cgroup bytes)`;
/// a cgroup figure that is not a number (no cgroup) is left out.
pub type Sample = (f64, f64, f64);

/// One method's samples.
pub struct Curve<'a> {
    /// The method's name (the legend).
    pub name: &'a str,
    /// The samples.
    pub samples: &'a [Sample],
}

const W: f64 = 840.0;
const H: f64 = 380.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 310.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 6] = ["#444444", "#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd"];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A round step giving about `target` ticks over `span`.
fn step(span: f64, target: f64) -> f64 {
    let raw = (span / target).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|&s| s >= raw).unwrap_or(10.0 * mag)
}

/// The SVG for `curves` under `title`; times past `max_s` are cut off (KSM runs for
/// minutes, advm for seconds: `None` shows everything).
pub fn svg(title: &str, curves: &[Curve<'_>], max_s: Option<f64>) -> String {
    let mib = |b: f64| b / (1u64 << 20) as f64;
    let keep = |t: f64| max_s.map_or(true, |m| t <= m);
    let t_max = curves.iter().flat_map(|c| c.samples.iter().map(|s| s.0)).filter(|&t| keep(t)).fold(1.0, f64::max);
    let y_max = curves
        .iter()
        .flat_map(|c| c.samples.iter().filter(|s| keep(s.0)).flat_map(|s| [mib(s.1), mib(s.2)]))
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max)
        * 1.05;
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let x = |t: f64| LEFT + t / t_max * pw;
    let y = |v: f64| TOP + ph - v / y_max * ph;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(out, r#"<text x="{LEFT}" y="22" font-size="14">{}</text>"#, escape(title));
    let (sx, sy) = (step(t_max, 8.0), step(y_max, 6.0));
    let mut t = 0.0;
    while t <= t_max + 1e-9 {
        let _ = writeln!(
            out,
            r##"<line x1="{0:.1}" y1="{TOP}" x2="{0:.1}" y2="{1:.1}" stroke="#eee"/><text x="{0:.1}" y="{2:.1}" text-anchor="middle">{t}</text>"##,
            x(t),
            TOP + ph,
            TOP + ph + 16.0
        );
        t += sx;
    }
    let mut v = 0.0;
    while v <= y_max {
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#eee"/><text x="{2:.1}" y="{3:.1}" text-anchor="end">{v}</text>"##,
            y(v),
            LEFT + pw,
            LEFT - 6.0,
            y(v) + 4.0
        );
        v += sy;
    }
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#888"/><text x="{0:.1}" y="{1:.1}" text-anchor="middle">seconds since the workers started</text><text x="16" y="{2:.1}" transform="rotate(-90 16 {2:.1})" text-anchor="middle">MiB, all workers (and advmd)</text>"##,
        LEFT + pw / 2.0,
        H - 12.0,
        TOP + ph / 2.0
    );
    for (k, c) in curves.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        for (dashed, pick) in [(false, 1usize), (true, 2usize)] {
            let pts: Vec<String> = c
                .samples
                .iter()
                .filter(|s| keep(s.0))
                .filter_map(|s| {
                    let b = if pick == 1 { s.1 } else { s.2 };
                    b.is_finite().then(|| format!("{:.1},{:.1}", x(s.0), y(mib(b))))
                })
                .collect();
            if pts.is_empty() {
                continue;
            }
            let dash = if dashed { r#" stroke-dasharray="5,4""# } else { "" };
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="1.6"{dash} points="{}"/>"#,
                pts.join(" ")
            );
        }
        let ly = TOP + 14.0 + 18.0 * k as f64;
        let lx = LEFT + pw + 12.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" y1="{ly}" x2="{0}" y2="{ly}" stroke="{colour}" stroke-width="2"/><text x="{1}" y="{2}">{3}</text>"#,
            lx + 22.0,
            lx + 28.0,
            ly + 4.0,
            escape(c.name)
        );
    }
    let ly = TOP + 14.0 + 18.0 * curves.len() as f64 + 8.0;
    let lx = LEFT + pw + 12.0;
    let _ = writeln!(
        out,
        r##"<text x="{lx}" y="{ly}" fill="#555">solid: distinct pages</text><text x="{lx}" y="{0}" fill="#555">dashed: cgroup anon+shmem</text>"##,
        ly + 16.0
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plot_has_one_line_per_method_and_meter_and_leaves_out_samples_past_the_cut() {
        let a = [(0.0, 1e9, 1e9), (2.0, 2e9, 2e9), (100.0, 3e9, f64::NAN)];
        let b = [(0.0, 5e8, f64::NAN), (1.0, 6e8, f64::NAN)];
        let s =
            svg("t <1>", &[Curve { name: "no dedup", samples: &a }, Curve { name: "advm", samples: &b }], Some(10.0));
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        // a: solid and dashed; b: solid only (no cgroup figures).
        assert_eq!(s.matches("<polyline").count(), 3);
        assert!(s.contains("t &lt;1&gt;") && s.contains(">no dedup<") && s.contains(">advm<"));
        // The sample at 100 s is past the cut: a's solid line has two points.
        let first = s.lines().find(|l| l.starts_with("<polyline")).unwrap();
        assert_eq!(first.split("points=\"").nth(1).unwrap().split(' ').count(), 2);
    }
}
