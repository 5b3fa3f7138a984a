#!/usr/bin/env python3
"""A program that merges its data and then replaces it, under `advm run --mode merge`,
with the agent's trims on and off (docs/merge.md, "Trims").

    ADVM=/abs/target/debug/advm bench/merge/replace.py [--gens G] [--mib M] [--passes P] [--out FILE]

The program (plain Python, no advm in it) holds M MiB of new random bytes per
generation (bytearrays of 32 MiB, which glibc maps and unmaps on their own), keeps
them for 4 s (the agent's quiet-period merge takes them: they are new, so they are
added to the store), then drops them and makes the next generation. Without trims the
in-process store keeps every generation's pages until the program exits; with them the
agent lets a generation's pages go once the program has unmapped them.

Per pass, side by side: `--mode off`, merge with `ADVM_MERGE_TRIM=0`, merge with trims;
memory on both meters as bench/run/pysweep.py takes them (the cgroup's anon+shmem
every 50 ms from `advm run --cgroup`, and the distinct anon+shmem pages of the
program's processes every 200 ms from `advm stat`), mean and peak; and the agent's
totals (pages added, trims, pages released, seconds trimming). The store is the
in-process one (ADVM_SOCKET points nowhere), as in the sweep.
Measure under the shared lock: `flock -o /work/bench.lock`.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run"))
import pysweep  # noqa: E402

PROG = r"""
import os, sys, time
gens, mib = int(sys.argv[1]), int(sys.argv[2])
data = None
for g in range(gens):
    data = None
    data = [bytearray(os.urandom(32 << 20)) for _ in range(mib // 32)]
    time.sleep(4)
print("done", len(data))
"""


def run(mode, trim, gens, mib):
    cmd = [pysweep.ADVM, "run", "--mode", mode, "--cgroup", "--stats", "--json", "--",
           "/usr/bin/python3", "-c", PROG, str(gens), str(mib)]
    env = dict(os.environ, ADVM_SOCKET="/nonexistent/replace-advmd.sock", ADVM_MERGE_TRIM=trim)
    t = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd="/tmp")
    d = pysweep.Distinct(p.pid)
    d.start()
    out, err = p.communicate(timeout=300)
    d.stop.set()
    d.join()
    docs, prog_err = pysweep.json_docs(err.decode(errors="replace"))
    r = {"rc": p.returncode, "stdout": out.decode().strip(), "seconds": round(time.time() - t, 2)}
    for x in docs:
        if "anon_shmem_bytes" in x:
            r["cgroup_mean"], r["cgroup_peak"] = x["anon_shmem_bytes"]["mean"], x["anon_shmem_bytes"]["max"]
        if "merge_agent" in x:
            r["agent"] = x["merge_agent"]
    if d.samples:
        r["distinct_mean"], r["distinct_peak"] = sum(d.samples) / len(d.samples), max(d.samples)
    if prog_err.strip():
        r["stderr"] = prog_err[-2000:]
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gens", type=int, default=4)
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    results = {"load": os.getloadavg(), "started": time.ctime(), "gens": a.gens, "mib": a.mib, "runs": []}
    mib = lambda x: f"{x / 2**20:.0f}" if x is not None else "-"
    for k in range(a.passes):
        for name, mode, trim in [("off", "off", "1"), ("merge, no trims", "merge", "0"), ("merge", "merge", "1")]:
            r = run(mode, trim, a.gens, a.mib)
            r.update(name=name, k=k, load=os.getloadavg())
            results["runs"].append(r)
            ag = r.get("agent", {})
            print(f"pass {k} {name:16s} rc {r['rc']} cgroup mean/peak {mib(r.get('cgroup_mean'))} / "
                  f"{mib(r.get('cgroup_peak'))} MiB, distinct {mib(r.get('distinct_mean'))} / "
                  f"{mib(r.get('distinct_peak'))} MiB; added {ag.get('added')} trims {ag.get('trims')} "
                  f"released {ag.get('released')} in {ag.get('trim_seconds', 0):.3f} s; load {r['load'][0]:.1f}",
                  flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
