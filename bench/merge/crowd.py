"""N processes each hold the same MiB of seeded random bytes and merge them with
advm.merge at one moment: the 16-worker merge of `advm bench merge` without the
model loading and serving around it (docs/merge.md quotes it).

Usage: ADVM_SOCKET=SOCK python crowd.py N MIB SECONDS_TO_FILL
Prints one JSON line per process: its start and end (seconds after the common
start), pages added and merged."""
import json, mmap, os, sys, time
import numpy as np
n, mib = int(sys.argv[1]), int(sys.argv[2])
go = time.monotonic() + float(sys.argv[3])
kids = []
for k in range(n):
    pid = os.fork()
    if pid == 0:
        buf = mmap.mmap(-1, mib << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        a = np.frombuffer(buf, dtype=np.uint64)
        a[:] = np.random.default_rng(7).integers(0, 2**63, size=a.size, dtype=np.uint64)
        import advm
        while time.monotonic() < go:
            time.sleep(0.001)
        t0 = time.monotonic()
        s = advm.merge(a)
        t1 = time.monotonic()
        print(json.dumps({"k": k, "start": t0 - go, "end": t1 - go, "merged": s["merged"], "added": s["added"], "s": s["seconds"]}), flush=True)
        os._exit(0)
    kids.append(pid)
for p in kids:
    os.waitpid(p, 0)
