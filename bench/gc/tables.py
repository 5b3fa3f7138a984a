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


def spread(key, fig):
    v = runs.get(key + (fig,))
    return f"{statistics.median(v):.2f}x ({min(v):.2f}-{max(v):.2f})" if v else "-"


print("| workload | heap | advm-remap max pause (ms) | advm-memmove max pause (ms) | memmove/remap, max | "
      "sum of pauses, paired | per collection, paired | large-object batch, paired | MiB moved as pages / copied "
      "| paper |")
print("|---|---|---|---|---|---|---|---|---|---|")
for w in workloads:
    for f in ("1.2", "2"):
        a, b = (w, f, "advm-remap"), (w, f, "advm-memmove")
        if a not in heaps:
            continue
        pa, pb = med(a, "pause_ms_max"), med(b, "pause_ms_max")
        n = med(a, "collections")
        ratio = pb / pa if pa and pb and n else None
        pages, copied = med(a, "moved_remap_mib"), med(a, "moved_memmove_mib")
        r = (w, f, "memmove/remap")
        if not n:
            shown, tot, per, batch = "no collection", "-", "-", "-"
        else:
            shown = f"**{fmt(ratio, 'x')}**" if pages else f"{fmt(ratio, 'x')} (same work)"
            tot, per = spread(r, "total_pause_ratio"), spread(r, "collection_pause_ratio")
            batch = spread(r, "page_move_batch_ratio")
        print(f"| {w} | {f}x ({heaps[a]} MiB) | {fmt(pa)} | {fmt(pb)} | {shown} | {tot} | {per} | {batch} "
              f"| {fmt(pages)} / {fmt(copied)} | {PAPER_SVAGC.get(w, '') if f == '1.2' else ''} |")

PAPER_JVM = {"1.2": "4.49x / 18.25x", "2": "3.60x / 12.24x"}
print()
print("| workload | heap | advm-remap max full (ms) | advm-gen max major (all) (ms) | parallel max full (all) (ms) "
      "| shenandoah max full / degenerated (all) (ms) | parallel/advm-remap | parallel/advm-gen "
      "| shenandoah/advm-remap, full | advm total (s) | advm-gen total (s) | parallel total (s) | shenandoah total (s) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for w in workloads:
    for f in ("1.2", "2"):
        a, g, p, s = (w, f, "advm-remap"), (w, f, "advm-gen"), (w, f, "parallel"), (w, f, "shenandoah")
        if p not in heaps and s not in heaps:
            continue
        pa, pg = med(a, "full_pause_ms_max"), med(g, "full_pause_ms_max")
        full = {k: med(k, "full_pause_ms_max") for k in (p, s)}
        ratio = lambda x, y: fmt(x / y, "x") if x and y else "-"
        print(f"| {w} | {f}x | {fmt(pa)} | {fmt(pg)} ({fmt(med(g, 'pause_ms_max'))}) "
              f"| {fmt(full[p])} ({fmt(med(p, 'pause_ms_max'))}) "
              f"| {fmt(full[s])} / {fmt(med(s, 'degenerated_pause_ms_max'))} ({fmt(med(s, 'pause_ms_max'))}) "
              f"| {ratio(full[p], pa)} | {ratio(full[p], pg)} | {ratio(full[s], pa)} "
              f"| {fmt(med(a, 'total_s'))} | {fmt(med(g, 'total_s'))} | {fmt(med(p, 'total_s'))} | {fmt(med(s, 'total_s'))} |")

# Reports from before the figure existed have no median full pause: the table is left out.
if any(k[3] == "full_pause_ms_median" for k in runs):
    print()
    print("| workload | heap | advm-remap full pauses: count, median (ms) | parallel: count, median (ms) "
          "| shenandoah: count, median (ms) | parallel/advm, median |")
    print("|---|---|---|---|---|---|")
    for w in workloads:
        for f in ("1.2", "2"):
            keys = [(w, f, c) for c in ("advm-remap", "parallel", "shenandoah")]
            if keys[1] not in heaps:
                continue
            cells = [f"{fmt(med(k, 'full_collections'))}, {fmt(med(k, 'full_pause_ms_median'))}" for k in keys]
            ma, mp = med(keys[0], "full_pause_ms_median"), med(keys[1], "full_pause_ms_median")
            print(f"| {w} | {f}x | {cells[0]} | {cells[1]} | {cells[2]} "
                  f"| {fmt(mp / ma, 'x') if ma and mp else '-'} |")
print()
print("| workload | heap | advm-remap full pause median / p99 / max (ms) | advm-gen major median / max, minor max (ms) |")
print("|---|---|---|---|")
for w in workloads:
    for f in ("1.2", "2"):
        a, g = (w, f, "advm-remap"), (w, f, "advm-gen")
        if a not in heaps:
            continue
        print(f"| {w} | {f}x | {fmt(med(a, 'full_pause_ms_median'))} / {fmt(med(a, 'pause_ms_p99'))} / "
              f"{fmt(med(a, 'full_pause_ms_max'))} | {fmt(med(g, 'full_pause_ms_median'))} / "
              f"{fmt(med(g, 'full_pause_ms_max'))}, {fmt(med(g, 'minor_pause_ms_max'))} |")
print()
print("paper (SVAGC vs ParallelGC / Shenandoah, max full-GC pause):",
      ", ".join(f"{k}x heap: {v}" for k, v in PAPER_JVM.items()))
