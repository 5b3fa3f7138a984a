#!/usr/bin/env python3
"""Draws docs/remap.svg from an `advm bench remap --out FILE` report (stdlib only).

usage: plot.py REPORT.json OUT.svg

Three panels: time per move against size (log-log) for memmove and each engine; the
break-even curves (cold source, one thread) with the paper's 10-page threshold; and
per-object time for single calls against batches (the paper's Fig. 6 experiment), with
the aggregation bound (the same pages moved by one call, which the kernel cannot do) dashed.
"""
import json
import math
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in bench/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from svgplot import Svg, esc  # noqa: E402

W, H = 1200, 430
PANEL_W, PANEL_H = 340, 300
TOP = 60
COLORS = {
    "memmove": "#444444",
    "uffd-move": "#d62728",
    "uffd-move, vacated dst": "#ff7f0e",
    "mremap": "#1f77b4",
    "memmove (populated dst)": "#444444",
    "UFFDIO_MOVE, populated dst": "#d62728",
    "UFFDIO_MOVE, vacated dst": "#ff7f0e",
    "scatter": "#9467bd",
    "compaction": "#2ca02c",
}


BOUND = "bound: 1 call for all pages"


class Panel:
    def __init__(self, x0, title, xlabel, ylabel, xs, ys, xlog=True, ylog=True):
        self.x0, self.title, self.xlabel, self.ylabel = x0, title, xlabel, ylabel
        self.xlog, self.ylog = xlog, ylog
        f = (lambda v: math.log10(v)) if xlog else (lambda v: v)
        g = (lambda v: math.log10(v)) if ylog else (lambda v: v)
        self.fx, self.fy = f, g
        self.xmin, self.xmax = f(min(xs)), f(max(xs))
        self.ymin, self.ymax = g(min(ys)), g(max(ys))
        if ylog:
            self.ymin, self.ymax = math.floor(self.ymin), math.ceil(self.ymax)
        else:
            self.ymin, self.ymax = 0, self.ymax * 1.1
        if self.xmax == self.xmin:
            self.xmax += 1
        self.out = []
        self.legend_bottom = False
        self.legend_right = False

    def px(self, v):
        return self.x0 + 50 + (self.fx(v) - self.xmin) / (self.xmax - self.xmin) * (PANEL_W - 60)

    def py(self, v):
        return TOP + PANEL_H - (self.fy(v) - self.ymin) / (self.ymax - self.ymin) * PANEL_H

    def frame(self, xticks, yticks):
        o = self.out
        x1, y1 = self.x0 + 50, TOP
        o.append(f'<rect x="{x1}" y="{y1}" width="{PANEL_W - 60}" height="{PANEL_H}" fill="none" stroke="#999"/>')
        o.append(f'<text x="{self.x0 + 50 + (PANEL_W - 60) / 2}" y="{TOP - 28}" text-anchor="middle" font-weight="bold">{esc(self.title)}</text>')
        o.append(f'<text x="{self.x0 + 50 + (PANEL_W - 60) / 2}" y="{TOP + PANEL_H + 36}" text-anchor="middle">{esc(self.xlabel)}</text>')
        o.append(f'<text transform="translate({self.x0 + 12},{TOP + PANEL_H / 2}) rotate(-90)" text-anchor="middle">{esc(self.ylabel)}</text>')
        for v, lab in xticks:
            x = self.px(v)
            o.append(f'<line x1="{x:.1f}" y1="{TOP + PANEL_H}" x2="{x:.1f}" y2="{TOP + PANEL_H + 4}" stroke="#999"/>')
            o.append(f'<text x="{x:.1f}" y="{TOP + PANEL_H + 16}" text-anchor="middle" font-size="10">{esc(lab)}</text>')
        for v, lab in yticks:
            y = self.py(v)
            o.append(f'<line x1="{self.x0 + 50}" y1="{y:.1f}" x2="{self.x0 + PANEL_W - 10}" y2="{y:.1f}" stroke="#eee"/>')
            o.append(f'<text x="{self.x0 + 46}" y="{y + 3:.1f}" text-anchor="end" font-size="10">{esc(lab)}</text>')

    def line(self, pts, color, label, legend_i, dash=""):
        if not pts:
            return
        d = " ".join(f"{self.px(x):.1f},{self.py(y):.1f}" for x, y in pts)
        da = f' stroke-dasharray="{dash}"' if dash else ""
        self.out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"{da}/>')
        for x, y in pts:
            self.out.append(f'<circle cx="{self.px(x):.1f}" cy="{self.py(y):.1f}" r="2.5" fill="{color}"/>')
        ly = TOP + 8 + 14 * legend_i
        if self.legend_bottom:
            ly = TOP + PANEL_H - 40 + 14 * legend_i
        lx = self.x0 + 58
        if self.legend_right:
            lx = self.x0 + PANEL_W - 150
        self.out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 16}" y2="{ly}" stroke="{color}" stroke-width="2"{da}/>')
        self.out.append(f'<text x="{lx + 20}" y="{ly + 4}" font-size="10">{esc(label)}</text>')


def size_bytes(s):
    n, u = s.split()
    return float(n) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[u]


def cfg(row, key):
    for k, v in row["config"]:
        if k == key:
            return v
    return None


def fig(row, name):
    for f in row["figures"]:
        if f["name"] == name:
            return f["median"]
    return None


def main():
    rep = json.load(open(sys.argv[1]))
    rows = rep["rows"]
    parts = []
    # Panel 1: size sweep.
    series = {}
    for r in rows:
        if cfg(r, "section") != "size":
            continue
        eng = cfg(r, "engine")
        if eng.startswith("auto"):
            continue
        series.setdefault(eng, []).append((size_bytes(cfg(r, "size")), fig(r, "time per op")))
    xs = [x for s in series.values() for x, _ in s]
    ys = [y for s in series.values() for _, y in s]
    p1 = Panel(0, "time per move (cache-cold source)", "size", "microseconds", xs, ys)
    xt = [(v, l) for v, l in [(4096, "4K"), (65536, "64K"), (1 << 20, "1M"), (16 << 20, "16M"), (256 << 20, "256M"), (1 << 30, "1G")] if min(xs) <= v <= max(xs)]
    yt = [(10 ** e, f"1e{e}" if e not in (0, 1, 2, 3) else str(10 ** e)) for e in range(int(p1.ymin), int(p1.ymax) + 1)]
    p1.frame(xt, yt)
    for i, (eng, pts) in enumerate(series.items()):
        p1.line(sorted(pts), COLORS.get(eng, "#000"), eng, i)
    parts += p1.out

    # Panel 2: break-even curves.
    curves = rep["configuration"].get("break_even_curves", {}).get("cold-1t", [])
    if curves:
        lines = {
            "memmove (populated dst)": [(c["pages"], c["memmove_us"]) for c in curves],
            "UFFDIO_MOVE, vacated dst": [(c["pages"], c["uffd_move_us"]) for c in curves],
            "UFFDIO_MOVE, populated dst": [(c["pages"], c["uffd_move_populated_us"]) for c in curves],
        }
        xs = [p for p, _ in lines["memmove (populated dst)"]]
        ys = [y for l in lines.values() for _, y in l]
        p2 = Panel(400, "break-even (cold source, 1 thread)", "pages per move", "microseconds", xs, ys, xlog=True, ylog=True)
        yt = [(10 ** e, str(10 ** e)) for e in range(int(p2.ymin), int(p2.ymax) + 1)]
        p2.frame([(v, str(v)) for v in (1, 2, 4, 8, 16, 32, 64) if v in xs], yt)
        for i, (name, pts) in enumerate(lines.items()):
            p2.line(pts, COLORS[name], name, i)
        x = p2.px(10)
        p2.out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + PANEL_H}" stroke="#2ca02c" stroke-dasharray="4,3"/>')
        p2.out.append(f'<text x="{x + 3:.1f}" y="{TOP + PANEL_H - 6}" font-size="10" fill="#2ca02c">paper: 10 pages</text>')
        parts += p2.out

    # Panel 3: batches.
    modes = ["one call each", "batch of 1", "batch of 10", "batch of 100", "batch of 1000"]
    bl = {}
    for r in rows:
        if cfg(r, "section") != "batch" or cfg(r, "calls") not in modes:
            continue
        bl.setdefault(cfg(r, "layout"), []).append((modes.index(cfg(r, "calls")) + 1, fig(r, "time per op")))
    if bl:
        ys = [y for l in bl.values() for _, y in l]
        p3 = Panel(800, "10-page objects: single vs batched (Fig. 6)", "calls", "microseconds per object", [1, 5], ys, xlog=False, ylog=False)
        p3.legend_right = True
        step = max(1, int(p3.ymax / 5))
        p3.frame([(i + 1, m.replace("batch of ", "b=").replace("one call each", "single")) for i, m in enumerate(modes)], [(v, str(v)) for v in range(0, int(p3.ymax) + 1, step)])
        for i, (name, pts) in enumerate(sorted(bl.items())):
            p3.line(sorted(pts), COLORS.get(name, "#000"), name, i)
        # The aggregation bound: the same pages in one UFFDIO_MOVE (no such call exists).
        j = len(bl)
        for r in rows:
            if cfg(r, "section") == "batch" and cfg(r, "calls") == BOUND and cfg(r, "layout") in bl:
                y = fig(r, "time per op")
                p3.line([(1, y), (5, y)], COLORS.get(cfg(r, "layout"), "#000"), f"{cfg(r, 'layout')}: bound (1 call)", j, dash="5,3")
                j += 1
        parts += p3.out

    svg = Svg(W, H)
    svg.out += parts
    m = rep.get("machine", {})
    svg.add(f'<text x="10" y="{H - 8}" font-size="10" fill="#666">advm bench remap, Linux {esc(m.get("kernel_release", "?"))}, {m.get("cpus", "?")} CPUs; medians of {rep.get("runs")} runs</text>')
    svg.save(sys.argv[2])


if __name__ == "__main__":
    main()
