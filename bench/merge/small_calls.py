"""What one advm.merge call costs beside the process's size: 200 merges of 64 KiB
(new pages, then equal ones) and one 1 GiB add, in a process holding HELD_GIB GiB.
Run it with two builds side by side (alternating), under the bench lock:
  HELD_GIB=1 flock -o /work/bench.lock python bench/merge/small_calls.py LABEL"""
import os
import sys
import time

os.environ.setdefault("ADVM_SOCKET", "/nonexistent/advmd.sock")  # the process's own store
import numpy as np

import advm

held = np.ones(int(os.environ.get("HELD_GIB", "1")) << 30, np.uint8)  # as a model server holds its model
small = [np.random.default_rng(i).random(8192) for i in range(200)]  # 64 KiB each
advm.merge(np.ones(1 << 20))  # the store is made
t = []
for a in small:
    t0 = time.perf_counter()
    advm.merge(a)
    t.append(time.perf_counter() - t0)
equal = [a.copy() for a in small]
t2 = []
for a in equal:
    t0 = time.perf_counter()
    advm.merge(a)
    t2.append(time.perf_counter() - t0)
x = np.random.default_rng(9).random(1 << 27)  # 1 GiB of new pages
t0 = time.perf_counter()
advm.merge(x)
tb = time.perf_counter() - t0
label = sys.argv[1] if len(sys.argv) > 1 else ""
print(f"{label}: 64 KiB add median {np.median(t) * 1e3:.2f} ms, 64 KiB merge median {np.median(t2) * 1e3:.2f} ms, 1 GiB add {tb:.2f} s")
