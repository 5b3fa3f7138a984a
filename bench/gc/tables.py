#!/usr/bin/env python3
"""Markdown tables for docs/gc.md from `advm bench gc --json` reports.

Usage: tables.py REPORT.json [REPORT.json ...]  (several reports: medians of their runs)
"""
import json
import statistics
import sys
from collections import defaultdict

PAPER_SVAGC = {"sparse-large": "3.44x (Sparse.large/4)", "sigverify-100m": "33.3x (Sigverify)"}

runs = defaultdict(list)  # (workload, factor, collector, figure) -> values
heaps = {}
for path in sys.argv[1:]:
    r = json.load(open(path))
    for row in r["rows"]:
        c = dict(row["config"])
        if "heap_factor" not in c:  # the policy rows: policy_plot.py
            continue
        key = (c["workload"], c["heap_factor"], c["collector"])
        heaps[key] = c.get("heap_mib")
        for f in row["figures"]:
            runs[key + (f["name"],)].extend(v for v in f["runs"] if v is not None)


def med(key, fig):
    v = runs.get(key + (fig,))
    return statistics.median(v) if v else None


def fmt(v, unit=""):
    return "-" if v is None else f"{v:.3g}{unit}"


workloads = list(dict.fromkeys(k[0] for k in heaps))
print("| workload | heap | advm-remap max pause (ms) | advm-memmove max pause (ms) | memmove/remap | MiB moved as pages / copied | paper |")
print("|---|---|---|---|---|---|---|")
for w in workloads:
    for f in ("1.2", "2"):
        a, b = (w, f, "advm-remap"), (w, f, "advm-memmove")
        if a not in heaps:
            continue
        pa, pb = med(a, "pause_ms_max"), med(b, "pause_ms_max")
        n = med(a, "collections")
        ratio = pb / pa if pa and pb and n else None
        pages, copied = med(a, "moved_remap_mib"), med(a, "moved_memmove_mib")
        if not n:
            shown = "no collection"
        elif not pages:
            shown = f"same work ({fmt(ratio, 'x')}: noise)"
        else:
            shown = f"**{fmt(ratio, 'x')}**"
        print(f"| {w} | {f}x ({heaps[a]} MiB) | {fmt(pa)} | {fmt(pb)} | {shown} "
              f"| {fmt(pages)} / {fmt(copied)} | {PAPER_SVAGC.get(w, '') if f == '1.2' else ''} |")

print()
print("| workload | heap | advm-remap max (ms) | parallel max (ms) | shenandoah max (ms) | parallel/advm | shenandoah/advm | advm total (s) | parallel total (s) | shenandoah total (s) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for w in workloads:
    for f in ("1.2", "2"):
        a, p, s = (w, f, "advm-remap"), (w, f, "parallel"), (w, f, "shenandoah")
        if p not in heaps:
            continue
        pa, pp, ps = med(a, "pause_ms_max"), med(p, "pause_ms_max"), med(s, "pause_ms_max")
        rp = pp / pa if pa and pp else None
        rs = ps / pa if pa and ps else None
        print(f"| {w} | {f}x | {fmt(pa)} | {fmt(pp)} | {fmt(ps)} | {fmt(rp, 'x')} | {fmt(rs, 'x')} "
              f"| {fmt(med(a, 'total_s'))} | {fmt(med(p, 'total_s'))} | {fmt(med(s, 'total_s'))} |")
