#!/usr/bin/env python3
"""Memory per VM against the number of VMs for docs/vm.md, from one or more
`advm bench vm-density --json` reports (a sweep split over runs with ADVM_VM_COUNTS /
ADVM_VM_METHODS; a later report's point replaces an earlier one's): a markdown table
and an SVG with one line per method, the cgroup meter solid, distinct pages dashed.

Usage: density_plot.py OUT.svg REPORT.json [REPORT.json ...]
"""
import json
import math
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in bench/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from svgplot import Svg  # noqa: E402

COLOURS = {"blk": "#c0392b", "blk-ksm": "#e67e22", "pmem": "#2980b9", "pmem-merge": "#27ae60"}

points = {}  # (method, n) -> figures
for path in sys.argv[2:]:
    for r in json.load(open(path))["rows"]:
        c = dict(r["config"])
        points[(c["method"], int(c["VMs"]))] = {f["name"]: f["median"] for f in r["figures"]}
methods = [m for m in COLOURS if any(k[0] == m for k in points)]
ns = sorted({n for _, n in points})


def rel(m, n, key):
    base = points.get(("blk", n))
    if m == "blk" or base is None:
        return ""
    return f" ({points[(m, n)][key] / base[key] - 1:+.0%})"


print("| method | VMs | anon+shmem / VM (cgroup) | page cache / VM (cgroup) | **memory / VM** (vs blk) "
      "| distinct pages / VM (vs blk) | boot to answer | ksmd CPU while settling |")
print("|---|---|---|---|---|---|---|---|")
for m in methods:
    for n in ns:
        f = points.get((m, n))
        if f is None:
            continue
        ksm = f.get("ksmd CPU while settling", 0)
        print(f"| {m} | {n} | {f['cgroup anon+shmem per VM']:.1f} MiB | {f['page cache per VM']:.1f} MiB "
              f"| **{f['memory per VM']:.1f} MiB{rel(m, n, 'memory per VM')}** "
              f"| {f['distinct pages per VM']:.1f} MiB{rel(m, n, 'distinct pages per VM')} "
              f"| {f['boot to answer']:.1f} s | {f'{ksm:.1f} s' if m == 'blk-ksm' else '-'} |")

W, H, L, R, T, B = 640, 400, 70, 130, 20, 50
top = max(f["memory per VM"] for f in points.values()) * 1.1
lo, hi = math.log2(ns[0]), math.log2(ns[-1]) or 1


def x(n):
    return L + (math.log2(n) - lo) / (hi - lo or 1) * (W - L - R)


def y(v):
    return H - B - v / top * (H - T - B)


svg = Svg(W, H)
o = svg.out
step = 50 if top > 200 else 25
for v in range(0, int(top) + 1, step):
    o.append(f'<line x1="{L}" x2="{W - R}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
    o.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v}</text>')
for n in ns:
    o.append(f'<text x="{x(n):.1f}" y="{H - B + 18}" text-anchor="middle">{n}</text>')
o.append(f'<text x="{(L + W - R) / 2}" y="{H - 10}" text-anchor="middle">VMs booted from one chain</text>')
o.append(f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" '
         'text-anchor="middle">host memory per VM, MiB</text>')
for i, m in enumerate(methods):
    for key, dash in (("memory per VM", ""), ("distinct pages per VM", ' stroke-dasharray="5,4"')):
        pts = " ".join(f"{x(n):.1f},{y(points[(m, n)][key]):.1f}" for n in ns if (m, n) in points)
        o.append(f'<polyline points="{pts}" fill="none" stroke="{COLOURS[m]}" stroke-width="2"{dash}/>')
    o.append(f'<text x="{W - R + 10}" y="{T + 20 + 18 * i}" fill="{COLOURS[m]}">{m}</text>')
o.append(f'<text x="{W - R + 10}" y="{T + 20 + 18 * len(methods) + 10}" fill="#555">solid: cgroup</text>')
o.append(f'<text x="{W - R + 10}" y="{T + 20 + 18 * len(methods) + 26}" fill="#555">dashed: distinct</text>')
svg.save(sys.argv[1])
