"""py_workloads.py both_written, then the program goes on allocating: 8 temporaries of
32 MiB after both sides of the copy were written (docs/run.md, "Trimming pages both
sides wrote": the shim's trim runs at an allocation, so here it gives the memfd's third
copy back)."""
import time
import numpy as np
a = np.arange(8 << 20, dtype=np.int64)
b = a.copy()
b[::5] = -1
a[::7] = 99
for i in range(8):
    c = np.ones(4 << 20)
    c += i
time.sleep(0.5)
print(int(a.sum()), int(b.sum()), float(c.sum()))
