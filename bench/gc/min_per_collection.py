#!/usr/bin/env python3
"""advm-gc's `workload` example, several builds side by side, judged by the smallest time
per collection.

Usage: min_per_collection.py ROUNDS BIN [BIN ...]  (the first BIN is the reference; each
one `cargo build --release -p advm-gc --example workload` of one commit, copied aside;
$W, e.g. "gcbench:8.4,binary-trees:7.2", picks the workloads). Runs each workload at its
1.2x and 2x heap, the binaries alternating (their order reversed every other round); run
it under the bench lock. Per binary: the median over runs of the largest pause, the
median pause and the sum of pauses; and, since the workloads are deterministic
(collection i does the same work in every run), the smallest time of each collection
over the runs, summed over the collections (pause, mark, move), and the largest of those
smallest pauses: the collector's cost with the scheduler's interruptions filtered out.
Ratios to the first binary in brackets.
"""
import os
import re
import statistics as st
import subprocess
import sys

W = [("gcbench", 8.4), ("binary-trees", 7.2), ("compiler-sawtooth", 6.6),
     ("gcbench", 14), ("binary-trees", 12), ("compiler-sawtooth", 11)]
if os.environ.get("W"):
    W = [(w.split(":")[0], float(w.split(":")[1])) for w in os.environ["W"].split(",")]
rounds, bins = int(sys.argv[1]), sys.argv[2:]
pat = re.compile(r"pause\s+([\d.]+) ms\s+stop ([\d.]+) mark ([\d.]+) fwd ([\d.]+) adj ([\d.]+) move ([\d.]+)")
runs = {}
for r in range(rounds):
    for w, mib in W:
        for b in (bins if r % 2 == 0 else bins[::-1]):
            out = subprocess.run([b, w, str(mib)], capture_output=True, text=True, check=True).stdout
            runs.setdefault((w, mib, b), []).append([tuple(map(float, m.groups())) for m in pat.finditer(out)])
for w, mib in W:
    ref = None
    for b in bins:
        v = runs[(w, mib, b)]
        p = [[c[0] for c in x] for x in v]
        med = [st.median(max(x) for x in p), st.median(st.median(x) for x in p), st.median(sum(x) for x in p)]
        n = min(len(x) for x in v)
        least = [sum(min(x[i][j] for x in v) for i in range(n)) for j in (0, 2, 5)]
        least.append(max(min(x[i][0] for x in v) for i in range(n)))
        ref = ref or med + least
        f = [f"{a:.3f} ({a / r:.2f})" for a, r in zip(med + least, ref)]
        print(f"{w:17} {mib:5} {os.path.basename(b):10} max {f[0]} median {f[1]} sum {f[2]} | "
              f"smallest per collection: pause sum {f[3]} mark {f[4]} move {f[5]} largest {f[6]}")
