"""advm bench workload: NumPy and pandas copies of large arrays with a few elements
modified afterwards (copy-on-assignment in libraries that copy defensively)."""
import os
import sys

import numpy as np
import pandas as pd

scale = float(os.environ.get("ADVM_BENCH_SCALE", "1"))
rng = np.random.default_rng(42)
n = int(4_000_000 * scale)
base = rng.random(n)
acc = 0.0
snapshots = []
for i in range(12):
    c = base.copy()            # a full copy ...
    c[i * 1000 : i * 1000 + 10] = -1.0   # ... of which a few elements change
    acc += float(c[:1000].sum())
    snapshots.append(c)        # keep them, as versioned data would be
    if len(snapshots) > 6:
        snapshots.pop(0)
df = pd.DataFrame({"a": base, "b": base * 2, "c": np.arange(n, dtype=np.float64)})
for i in range(6):
    d2 = df.copy()             # deep copy of every column
    d2.loc[i, "a"] = 0.5
    s = d2.sort_values("b").iloc[:5]
    acc += float(d2["a"].iloc[:100].sum()) + float(s["c"].sum())
sub = df[df["a"] > 0.5].copy()
acc += float(sub["b"].sum())
sys.stdout.write("%.6f %d\n" % (acc, len(sub)))
