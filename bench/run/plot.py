#!/usr/bin/env python3
"""docs/run.svg: the paper's table per workload, from an `advm bench r --json` report
(stdlib only).

usage: plot.py OUT.svg REPORT.json

Memory (top) and CPU time (bottom) of each mode relative to untouched R (100), per R
workload, their geometric mean (the report's own row) and NumPy (not in the mean).
Memory: bar = the cgroup's anon+shmem at the sampling instants, dot = distinct anon+shmem
pages (held included) at the same instants; both medians of the runs. CPU: bar = user +
system of the program (ratio of medians over the sequential passes), lighter top = ksmd's
CPU (the KSM modes), dot = the concurrent pairs (untouched and the mode at once). On
the mean, a black bar marks the paper's figure for the mode (its own meter: mapped pages).
"""
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in bench/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import svgplot  # noqa: E402

MODES = [  # (mode in the report, legend, colour)
    ("alloc", "alloc (advm's arena, no copies)", "#9e9e9e"),
    ("ksm", "ksm", "#6baed6"),
    ("ksm-aggr", "ksm-aggr", "#2171b5"),
    ("cow", "vcopy (virtual copies)", "#d62728"),
]
GEOMEAN = "geomean of 11 R workloads"


def name(workload):
    if workload == GEOMEAN:
        return "geomean\n(11 R)"
    if workload.endswith(".py"):
        return "NumPy\n(not in mean)"
    w = workload.removesuffix(".R").removeprefix("ml_").removeprefix("b25_")
    return {"randomforest": "random\nForest"}.get(w, w)


def main():
    rep = json.load(open(sys.argv[2]))
    fig = {}  # (workload, mode) -> figure -> median
    order = []
    for row in rep["rows"]:
        c = dict(row["config"])
        if c["workload"].startswith("threshold"):
            continue
        if c["workload"] not in order:
            order.append(c["workload"])
        fig[(c["workload"], c["mode"])] = {f["name"]: f["median"] for f in row["figures"]}
    # The R workloads, the mean over them, then the rest.
    order = ([w for w in order if w.endswith(".R")] + [GEOMEAN]
             + [w for w in order if not w.endswith(".R") and w != GEOMEAN])
    groups = [name(w) for w in order]

    def series(bar, dot=None, top=None):
        out = []
        for mode, label, colour in MODES:
            vals = []
            for w in order:
                f = fig.get((w, mode), {})
                b = f.get(bar)
                d = f.get(dot) if dot else None
                t = b * f[top] / 100 if top and f.get(top) and mode.startswith("ksm") else 0
                vals.append(None if b is None else (b, [d] if d is not None else [], t))
            out.append((label, colour, vals))
        return out

    svg = svgplot.Svg(1120, 720)
    gi = order.index(GEOMEAN)
    mem = series("cgroup at samples vs off", "distinct anon+shmem vs off")
    cpu = series("cpu vs off", "cpu vs off, pairs", "ksmd cpu")
    for panel, (y0, data, title, ylabel, goal, paper) in enumerate([
        (50, mem, "memory relative to untouched R (100): bar cgroup anon+shmem, dot distinct pages",
         "memory, % of untouched", (90, "goal: 90%"), "paper memory"),
        (360, cpu, "CPU time relative to untouched R (100): bar sequential passes, light top ksmd, "
         "dot concurrent pairs", "CPU time, % of untouched", (102, "goal: 102%"), "paper runtime"),
    ]):
        top = max(b + t for _, _, vals in data for v in vals if v for b, _, t in [v])
        ymax = (int(top) // 20 + 1) * 20
        where = svgplot.bars(
            svg, (70, y0, 960, 220), groups, data, ymax, range(0, ymax + 1, 20), ylabel,
            title=title, refs=[(100, "#444", "", ""), (goal[0], "#2ca02c", "6,4", goal[1])])
        for si, (mode, _, _) in enumerate(MODES):
            p = fig.get((GEOMEAN, mode), {}).get(paper)
            if p is not None:
                x, y = where(gi, si, p)
                svg.line(x - 7, y, x + 7, y, stroke="#000", width=2.5)
    svg.legend(80, 652, [(label, colour) for _, label, colour in MODES[:2]], step=16)
    svg.legend(330, 652, [(label, colour) for _, label, colour in MODES[2:]], step=16)
    svg.line(580, 648, 594, 648, stroke="#000", width=2.5)
    svg.text(600, 652, "paper's figure (geomean; its meter: mapped pages only)", size=11)
    svg.circle(587, 664, 2.2, "white", stroke="#222")
    svg.text(600, 668, "dot: distinct pages (memory), concurrent pairs (CPU)", size=11)
    g = fig[(GEOMEAN, "cow")]
    svg.text(80, 692, f"vcopy, geomean of the 11 R workloads: memory {g['cgroup at samples vs off']:.1f}% "
             f"(cgroup), {g['distinct anon+shmem vs off']:.1f}% (distinct pages); CPU "
             f"{g['cpu vs off']:.1f}% (passes), {g['cpu vs off, pairs']:.1f}% (pairs)", size=11)
    svg.text(10, 712, f"advm bench r --json, {os.path.basename(sys.argv[2])}: medians of "
             f"{rep.get('runs')} interleaved passes", size=10, fill="#666")
    svg.save(sys.argv[1])


if __name__ == "__main__":
    main()
