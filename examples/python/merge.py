"""docs/merge.md's example: two workers' copies of one model's weights, merged so they
share pages (through advmd when it runs, else a store inside this process).
pip install ./crates/advm-py numpy; python examples/python/merge.py"""
import os

import advm
import numpy as np

weights = np.random.default_rng(7).random(4 << 20)  # 32 MiB of float64, any buffer works
again = weights.copy()                                # a second worker's copy
first = advm.merge(weights)   # {'merged': ..., 'added': ..., 'skipped': ..., 'seconds': ..., 'via': ...}
second = advm.merge(again)    # equal pages now map the stored ones
print(f"added {first['added']}, then merged {second['merged']} pages via {second['via']}")
assert np.array_equal(weights, again)                 # merging never changes the bytes

copy = advm.vcopy(weights)    # a virtual copy: pages shared until written
copy[0] = -1.0                # only this page is copied
assert weights[0] != -1.0
print(advm.stat(os.getpid())["physical_bytes"], "bytes held by this process")  # advm stat's figures
