"""One model-serving worker of `advm bench merge`: loads a model's weights into
page-aligned anonymous memory, binds them to an onnxruntime session without copying,
serves requests, and (method "merge") merges the weight buffers with advm.merge.

Usage: worker.py MODEL_DIR NAME METHOD REQUESTS
METHOD: none | ksm (PR_SET_MEMORY_MERGE on the whole process) | merge (advm.merge).
Prints one JSON line when loaded (and merged), then waits for a line on stdin, serves
REQUESTS more requests, prints a second JSON line and exits."""

import ctypes
import json
import mmap
import os
import sys
import time

import numpy as np
import onnxruntime as ort

PR_SET_MEMORY_MERGE = 67


def main():
    model_dir, name, method, requests = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    t0 = time.monotonic()
    if method == "ksm":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_MEMORY_MERGE)")
    meta = json.load(open(os.path.join(model_dir, name + ".json")))
    # One private anonymous mapping holds every weight, each page-aligned as in the file.
    buf = mmap.mmap(-1, max(meta["bytes"], 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with open(os.path.join(model_dir, name + ".weights"), "rb") as f:
        f.readinto(memoryview(buf)[: meta["bytes"]])
    weights = np.frombuffer(buf, dtype=np.uint8)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.disable_prepacking", "1")
    sess = ort.InferenceSession(os.path.join(model_dir, name + ".onnx"), opts, providers=["CPUExecutionProvider"])
    binding = sess.io_binding()
    for t in meta["tensors"]:
        a = weights[t["offset"] : t["offset"] + int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize]
        a = a.view(t["dtype"]).reshape(t["shape"])
        binding.bind_ortvalue_input(t["name"], ort.OrtValue.ortvalue_from_numpy(a))
    x = np.random.default_rng(0).standard_normal(meta["input"]["shape"]).astype(np.float32)
    binding.bind_cpu_input(meta["input"]["name"], x)
    for o in sess.get_outputs():
        binding.bind_output(o.name)

    def serve(n):
        lat = []
        for _ in range(n):
            t = time.monotonic()
            sess.run_with_iobinding(binding)
            lat.append((time.monotonic() - t) * 1e3)
        return lat

    before = serve(requests)
    loaded = time.monotonic() - t0
    merged = None
    if method == "merge":
        import advm

        merged = advm.merge(weights)
    print(json.dumps({"pid": os.getpid(), "loaded_s": loaded, "weights_bytes": meta["bytes"], "merge": merged,
                      "latency_before_ms": before}), flush=True)
    sys.stdin.readline()
    after = serve(requests)
    print(json.dumps({"latency_after_ms": after}), flush=True)


if __name__ == "__main__":
    main()
