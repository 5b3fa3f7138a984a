#!/usr/bin/env python3
"""docs/pager.svg: the paper's experiment at a glance, from `advm bench pager --json`
reports (stdlib only).

usage: plot.py OUT.svg INPUT[:SET,SET...] ...

An INPUT is a report, or a file of side-by-side rounds ({"sets": {NAME: {"rounds":
[report, ...]}}}, as bench/pager/results/pager-64-npfree-ab.json) with the sets to take
after the colon. One group of bars per (workload, heap, limit), in the order met.
Left: NP/this (how many times faster than NP, the kernel's own swap), the median over
the runs or rounds with each one as a dot (a round's ratio is against that round's NP),
beside NP itself (1) and the paper's 4x. Right: pages written to swap per run (the
kernel's swap-out, system-wide, plus the pager's own page-outs written), medians.
"""
import json
import os
import statistics
import sys

sys.dont_write_bytecode = True  # no __pycache__ in bench/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import svgplot  # noqa: E402

SPEEDUP = [  # (setting, fault mode, legend, colour)
    ("PFKernel", "sigbus", "PFKernel (pager, SIGBUS mode)", "#d62728"),
    ("NPFree", "-", "NPFree (no pager, garbage MADV_FREE)", "#ff7f0e"),
    ("NoLimit", "-", "NoLimit (no memory limit: the floor)", "#7f7f7f"),
]
WRITTEN = [("NP", "-", "NP (no pager)", "#1f77b4")] + SPEEDUP[:2]


def reports(arg):
    path, _, sets = arg.partition(":")
    doc = json.load(open(path))
    if "sets" not in doc:
        return [doc]
    return [r for s in sets.split(",") for r in doc["sets"][s]["rounds"]]


def main():
    runs = {}  # (workload, heap, limit) -> (setting, faults) -> figure -> [values]
    for arg in sys.argv[2:]:
        for rep in reports(arg):
            for row in rep["rows"]:
                c = dict(row["config"])
                if "setting" not in c or "limit" not in c:
                    continue  # the fault-cost table
                fig = runs.setdefault((c["workload"], c["heap"], c["limit"]), {}).setdefault(
                    (c["setting"], c["faults"]), {})
                for f in row["figures"]:
                    fig.setdefault(f["name"], []).extend(f["runs"])
    keys = list(runs)

    def values(setting, faults, name, scale=1.0):
        out = []
        for k in keys:
            fig = runs[k].get((setting, faults))
            if fig is None or name not in fig:
                out.append(None)
                continue
            vs = [v * scale for v in fig[name]]
            if name == "kernel swap out" and "page-out written" in fig:
                vs = [v + w * scale for v, w in zip(vs, fig["page-out written"])]
            out.append((statistics.median(vs), vs))
        return out

    def label(k):
        workload, heap, limit = k
        shape = "in place" if "in place" in heap else "drift"
        return f"{workload}\n{heap.split(',')[0]}\n{shape}, {limit}"

    groups = [label(k) for k in keys]
    svg = svgplot.Svg(1080, 460)
    top = max(v for s, f, _, _ in SPEEDUP for x in values(s, f, "NP/this") if x for v in x[1])
    ymax = max(5, int(top) + 1)
    svgplot.bars(
        svg, (70, 50, 470, 270), groups,
        [(name, colour, values(s, f, "NP/this")) for s, f, name, colour in SPEEDUP],
        ymax, range(0, ymax + 1), "NP / this (x faster than NP)",
        title="elapsed time: NP / this (higher is faster)",
        refs=[(1, "#1f77b4", "", "NP"), (4, "#2ca02c", "6,4", "paper: 4x")],
        fmt=lambda v: f"{v:.2f}", label_groups=range(len(groups)))
    svg.legend(80, 396, [(name, colour) for _, _, name, colour in SPEEDUP], step=14)

    wr = [values(s, f, "kernel swap out", 1e-3) for s, f, _, _ in WRITTEN]
    top = max(v for series in wr for x in series if x for v in x[1])
    step = 100 if top < 1000 else 200
    wmax = (int(top) // step + 1) * step
    svgplot.bars(
        svg, (650, 50, 400, 270), groups,
        [(name, colour, w) for (_, _, name, colour), w in zip(WRITTEN, wr)],
        wmax, range(0, wmax + 1, step), "pages written to swap per run, thousands",
        title="pages written to swap (kernel + pager)",
        fmt=lambda v: f"{v:.0f}", label_groups=range(len(groups)))
    svg.legend(660, 396, [(name, colour) for _, _, name, colour in WRITTEN], step=14)
    sources = "; ".join(os.path.basename(a) for a in sys.argv[2:])
    svg.text(10, 452, f"advm bench pager --json, {sources}", size=10, fill="#666")
    svg.save(sys.argv[1])


if __name__ == "__main__":
    main()
