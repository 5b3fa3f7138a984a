#!/usr/bin/env python3
"""The shim's trim on and off (docs/run.md, "Trimming pages both sides wrote"): untouched,
vcopy with ADVM_TRIM_KIB=0 and vcopy with the default, alternating, on both meters
(pysweep.run_case).

    ADVM=target/release/advm flock -o /work/bench.lock bench/run/trim_ab.py [PASSES] [OUT.json]
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pysweep  # noqa: E402

PROGS = {"both_written": ["/usr/bin/python3", pysweep.PYW, "both_written"],
         "both_written_then_alloc": ["/usr/bin/python3", os.path.join(HERE, "both_written_then_alloc.py")]}
KEYS = ["rc", "seconds", "cgroup_peak", "cgroup_mean", "distinct_peak", "distinct_mean"]


def main():
    passes = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    out = {"load": os.getloadavg(), "runs": {}}
    for p in range(passes):
        for name, argv in PROGS.items():
            for label, trim in [("off", None), ("vcopy-notrim", "0"), ("vcopy-trim", None)]:
                os.environ.pop("ADVM_TRIM_KIB", None)
                if trim is not None:
                    os.environ["ADVM_TRIM_KIB"] = trim
                r = pysweep.run_case(argv, "off" if label == "off" else "vcopy", 1.0, 300)
                row = {k: r.get(k) for k in KEYS}
                out["runs"].setdefault(name, {}).setdefault(label, []).append(row)
                mib = {k: round(v / 2**20, 1) for k, v in row.items() if k not in ("rc", "seconds") and v is not None}
                print(p, name, label, row["rc"], mib, flush=True)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
