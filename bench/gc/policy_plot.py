#!/usr/bin/env python3
"""The SML/NJ policy comparison for docs/gc.md from `advm bench gc-policy --json`
(or `advm bench gc --json`): a markdown table of medians, and an SVG plot of heap size
(old generation + nursery) over time per policy and copy-back setting.

Usage: policy_plot.py REPORT.json OUT.svg
"""
import json
import sys

report = json.load(open(sys.argv[1]))
rows = [r for r in report["rows"] if dict(r["config"]).get("policy")]
FIGS = [
    ("total_s", "elapsed s", 2),
    ("pause_total_ms", "GC ms", 0),
    ("minor_collections", "minor", 0),
    ("major_collections", "major", 0),
    ("heap_mib_mean", "heap mean MiB", 1),
    ("heap_mib_max", "heap max MiB", 1),
    ("copied_back_mib", "copied back MiB", 0),
    ("freed_to_hook_mib", "freed to hook MiB", 0),
    ("mem_distinct_mib", "distinct pages MiB", 1),
    ("mem_cgroup_mib", "cgroup anon+shmem MiB", 1),
]
print("| workload | policy | copy-back | " + " | ".join(f[1] for f in FIGS) + " |")
print("|" + "---|" * (3 + len(FIGS)))
for r in rows:
    c = dict(r["config"])
    med = {f["name"]: f["median"] for f in r["figures"]}
    cells = [f"{med[n]:.{d}f}" if med.get(n) is not None else "-" for n, _, d in FIGS]
    print(f"| {c['workload']} | {c['policy']} | {c['copy_back']} | " + " | ".join(cells) + " |")

# The plot: one panel per workload, a step line per configuration.
series = {k[len("heap_series_"):]: v for k, v in report["configuration"].items() if k.startswith("heap_series_")}
workloads = sorted({k.split("_", 1)[0] for k in series})
COLORS = {"original+copy-back": "#1f77b4", "original-drift": "#9ecae1", "modified+copy-back": "#d62728",
          "modified-drift": "#fc9272"}
W, H, PAD = 460, 260, 50
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * len(workloads)}" height="{H + 60}" '
       'font-family="sans-serif" font-size="11">']
for i, w in enumerate(workloads):
    x0 = i * W
    lines = {k.split("_", 1)[1]: v for k, v in series.items() if k.split("_", 1)[0] == w}
    tmax = max((p[0] for v in lines.values() for p in v), default=1) or 1
    ymax = max((p[1] for v in lines.values() for p in v), default=1) or 1
    sx = lambda t: x0 + PAD + (W - PAD - 20) * t / tmax
    sy = lambda y: H - (H - 40) * y / ymax
    out.append(f'<text x="{x0 + W / 2}" y="16" text-anchor="middle" font-size="13">{w}: heap size over time</text>')
    out.append(f'<line x1="{x0 + PAD}" y1="{H}" x2="{x0 + W - 20}" y2="{H}" stroke="black"/>')
    out.append(f'<line x1="{x0 + PAD}" y1="{H}" x2="{x0 + PAD}" y2="40" stroke="black"/>')
    for k in range(5):
        y = ymax * k / 4
        out.append(f'<text x="{x0 + PAD - 4}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.0f}</text>')
        t = tmax * k / 4
        out.append(f'<text x="{sx(t):.1f}" y="{H + 14}" text-anchor="middle">{t:.0f}</text>')
    out.append(f'<text x="{x0 + W / 2}" y="{H + 28}" text-anchor="middle">ms since heap creation</text>')
    out.append(f'<text x="{x0 + 12}" y="{H / 2}" transform="rotate(-90 {x0 + 12} {H / 2})" '
               'text-anchor="middle">MiB (old + nursery)</text>')
    for j, (label, pts) in enumerate(sorted(lines.items())):
        d, prev = [], None
        for t, y in pts:
            if prev is not None:
                d.append(f"{sx(t):.1f},{sy(prev):.1f}")
            d.append(f"{sx(t):.1f},{sy(y):.1f}")
            prev = y
        out.append(f'<polyline fill="none" stroke="{COLORS.get(label, "gray")}" stroke-width="1.5" '
                   f'points="{" ".join(d)}"/>')
        out.append(f'<text x="{x0 + PAD + 10 + (j % 2) * 200}" y="{H + 44 + (j // 2) * 13}" '
                   f'fill="{COLORS.get(label, "gray")}">{label}</text>')
out.append("</svg>")
open(sys.argv[2], "w").write("\n".join(out))
