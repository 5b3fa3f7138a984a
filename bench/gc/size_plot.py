#!/usr/bin/env python3
"""Pause against object size for docs/gc.md from `advm bench gc-sizes --json` (or
`advm bench gc --json`): a markdown table of medians and an SVG with two log-log panels:
the full-GC pause per object size under both engines, and the compaction break-even
curve (per object, a batch of page moves against memmove) that decides between them.

Usage: size_plot.py REPORT.json OUT.svg
"""
import json
import math
import sys

report = json.load(open(sys.argv[1]))
rows = [r for r in report["rows"] if dict(r["config"]).get("workload") == "object-size"]
pause = {}  # (kib, collector) -> (median pause, median large move, MiB as pages)
for r in rows:
    c = dict(r["config"])
    f = {x["name"]: x["median"] for x in r["figures"]}
    pause[(int(c["object_kib"]), c["collector"])] = (f["pause_ms"], f["move_large_ms"], f["moved_remap_mib"])
sizes = sorted({k for k, _ in pause})
be = report["configuration"].get("break_even_compaction_pages")
curve = report["configuration"].get("break_even_compaction_curve", [])


def size(kib):
    return f"{kib // 1024} MiB" if kib >= 1024 else f"{kib} KiB"


print("| object size | remap pause (ms) | memmove pause (ms) | memmove/remap | moved as pages |")
print("|---|---|---|---|---|")
for k in sizes:
    a, b = pause[(k, "advm-remap")], pause[(k, "advm-memmove")]
    print(f"| {size(k)} | {a[0]:.3f} | {b[0]:.3f} | {b[0] / a[0]:.2f}x | {'yes' if a[2] > 0 else 'no (copied)'} |")
print()
print(f"compaction break-even: {be} pages")
print("| pages | memmove µs/object | batch of page moves µs/object | memmove/batch |")
print("|---|---|---|---|")
for p in curve:
    print(f"| {p['pages']} | {p['memmove_us']:.2f} | {p['batch_us']:.2f} | {p['memmove_us'] / p['batch_us']:.2f}x |")

W, H, PAD, TOP = 470, 300, 60, 40
COL = {"advm-remap": "#d62728", "advm-memmove": "#1f77b4"}
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H + 70}" font-family="sans-serif" '
       'font-size="11">']


def panel(x0, title, xlabel, ylabel, series, xs_all, ys_all, marks, label):
    lx0, lx1 = math.log10(min(xs_all)), math.log10(max(xs_all))
    ly0, ly1 = math.floor(math.log10(min(ys_all))), math.ceil(math.log10(max(ys_all)))
    sx = lambda v: x0 + PAD + (W - PAD - 20) * (math.log10(v) - lx0) / (lx1 - lx0 or 1)
    sy = lambda v: H - (H - TOP) * (math.log10(v) - ly0) / (ly1 - ly0 or 1)
    out.append(f'<text x="{x0 + W / 2}" y="16" text-anchor="middle" font-size="13">{title}</text>')
    out.append(f'<line x1="{x0 + PAD}" y1="{H}" x2="{x0 + W - 20}" y2="{H}" stroke="black"/>')
    out.append(f'<line x1="{x0 + PAD}" y1="{H}" x2="{x0 + PAD}" y2="{TOP}" stroke="black"/>')
    for e in range(ly0, ly1 + 1):
        out.append(f'<text x="{x0 + PAD - 4}" y="{sy(10 ** e) + 4:.1f}" text-anchor="end">{10 ** e:g}</text>')
        out.append(f'<line x1="{x0 + PAD}" y1="{sy(10 ** e):.1f}" x2="{x0 + W - 20}" y2="{sy(10 ** e):.1f}" '
                   'stroke="#ddd"/>')
    for v in xs_all:
        out.append(f'<text x="{sx(v):.1f}" y="{H + 14}" text-anchor="middle">{label(v)}</text>')
    out.append(f'<text x="{x0 + W / 2}" y="{H + 30}" text-anchor="middle">{xlabel}</text>')
    out.append(f'<text x="{x0 + 14}" y="{(H + TOP) / 2}" transform="rotate(-90 {x0 + 14} {(H + TOP) / 2})" '
               f'text-anchor="middle">{ylabel}</text>')
    for i, (v, text) in enumerate(marks):
        out.append(f'<line x1="{sx(v):.1f}" y1="{TOP}" x2="{sx(v):.1f}" y2="{H}" stroke="#999" '
                   'stroke-dasharray="4 3"/>')
        out.append(f'<text x="{sx(v) + 3:.1f}" y="{TOP + 10 + 12 * i}" fill="#555">{text}</text>')
    for j, (name, color, pts) in enumerate(series):
        d = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(pts))
        out.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>')
        out.append(f'<text x="{x0 + PAD + 10}" y="{TOP + 24 + 14 * j}" fill="{color}">{name}</text>')


series = [(f"{c[5:]} (median pause)", COL[c], [(k, pause[(k, c)][0]) for k in sizes]) for c in COL]
ys = [y for _, _, pts in series for _, y in pts]
marks = [(be * 4, "compaction break-even")] if be else []
marks.append((2048, "2 MiB: page tables move"))
panel(0, "full-GC pause vs object size (window of 2 live)", "object size", "pause, ms", series, sizes, ys, marks,
      size)
if curve:
    cs = [("memmove", COL["advm-memmove"], [(p["pages"], p["memmove_us"]) for p in curve]),
          ("batch of UFFDIO_MOVEs", COL["advm-remap"], [(p["pages"], p["batch_us"]) for p in curve])]
    xs = [p["pages"] for p in curve]
    panel(W, "compaction break-even: per object, cold", "pages per object", "µs per object", cs, xs,
          [y for _, _, pts in cs for _, y in pts], [(be, f"break-even {be} pages")] if be else [], str)
out.append(f'<text x="10" y="{H + 52}" fill="#555">paper (SwapVA, Linux 4.17): break-even 10 pages; GC time '
           'memmove/SwapVA 3.44x (Sparse.large/4) to 33.3x (Sigverify, 1 MiB objects)</text>')
out.append("</svg>")
open(sys.argv[2], "w").write("\n".join(out))
