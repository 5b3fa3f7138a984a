"""Realistic Python programs that know nothing of advm, for `advm run` sweeps.

`python3 py_workloads.py NAME`: runs one workload and prints only what is the same in
every run (sums, digests, exit statuses; never addresses, pids or times), so its
stdout under `advm run --mode M` must be byte-identical to the plain run.
SWEEP_SCALE (default 1, seconds-sized) multiplies the sizes.
"""
import hashlib
import os
import sys

SCALE = float(os.environ.get("SWEEP_SCALE", "1"))


def n(x):
    return max(1, int(x * SCALE))


def digest(buf):
    return hashlib.sha256(memoryview(buf).cast("B")).hexdigest()[:16]


# ---- multiprocessing (top-level functions: spawn and forkserver pickle them by name)

def chunk_stats(a):
    import numpy as np
    b = a.copy()
    b *= 2.0
    np.sqrt(b, out=b)
    return float(a.sum()), round(float(b.sum()), 3), digest(a)


def build(i):
    import numpy as np
    a = np.arange(n(1 << 19), dtype=np.float64) + i
    c = np.concatenate([a, a[::-1]])
    c[::3] = -1
    return float(c.sum())


def mp(method):
    import multiprocessing
    import numpy as np
    ctx = multiprocessing.get_context(method)
    big = np.arange(n(4 << 20), dtype=np.float64)
    chunks = np.array_split(big, 8)
    with ctx.Pool(2) as pool:
        res = pool.map(chunk_stats, chunks)
        built = pool.map(build, range(4))
    for r in res:
        print(method, *r)
    print(method, "built", built)
    print(method, "parent", float(big.sum()), digest(big))


def load_twice(path):
    import time
    import numpy as np
    hold = float(os.environ.get("SWEEP_HOLD", "0"))
    w = np.load(path)
    time.sleep(hold)
    w2 = np.load(path)  # the same bytes again, as a second model of one base
    time.sleep(hold)  # serving
    return digest(w) == digest(w2), float(w.sum())


def pool_load():
    """Pool workers (start method argv[2]) each load one weights file twice."""
    import multiprocessing
    import tempfile
    import subprocess
    with tempfile.TemporaryDirectory(prefix="advm-sweep-") as tmp:
        path = os.path.join(tmp, "w.npy")
        # Made by another process: a 16 MiB block freed here would raise glibc's mmap
        # threshold, and the workers' two loads would land at different page offsets
        # (nothing to merge then, with or without advm).
        make = f"import numpy as np; np.save({path!r}, np.random.default_rng(4).random({n(4 << 20)}, np.float32))"
        subprocess.run([sys.executable, "-c", make], check=True)
        with multiprocessing.get_context(sys.argv[2]).Pool(2) as pool:
            print(pool.map(load_twice, [path] * 2))


def futures():
    import concurrent.futures as cf
    import numpy as np
    with cf.ProcessPoolExecutor(max_workers=2) as ex:
        print("process", list(ex.map(build, range(6))))
    big = np.arange(n(2 << 20), dtype=np.float64)

    def work(i):
        part = big[i::4].copy()
        part += i
        return float(part.sum()), digest(part)

    with cf.ThreadPoolExecutor(max_workers=4) as ex:
        print("thread", list(ex.map(work, range(8))))


def fork_wait():
    import numpy as np
    a = np.arange(n(4 << 20), dtype=np.int64)
    before = digest(a)
    kids = []
    for k in range(3):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            b = a.copy()
            b[k::5] = -k
            a[::7] = 99  # the parent must not see this
            os.write(w, f"{k} {int(b.sum())} {digest(b)}\n".encode())
            os._exit(10 + k)
        os.close(w)
        kids.append((pid, r))
    for pid, r in kids:
        with os.fdopen(r) as f:
            line = f.read().strip()
        _, st = os.waitpid(pid, 0)
        print("child", line, "exit", os.waitstatus_to_exitcode(st))
    print("parent unchanged", digest(a) == before, int(a.sum()))
    pid = os.fork()
    if pid == 0:
        c = a[::2].copy()
        sys.stdout.flush()
        sys.exit(0 if int(c.sum()) > 0 else 1)  # a normal exit: atexit handlers run
    print("sys.exit child", os.waitstatus_to_exitcode(os.wait()[1]))


def subproc():
    import subprocess
    code = (
        "import numpy as np, hashlib\n"
        f"a = np.arange({n(2 << 20)}, dtype=np.float64)\n"
        "b = a.copy(); b[1::2] *= -1\n"
        "print(float(b.sum()), hashlib.sha256(b.tobytes()).hexdigest()[:16])\n"
    )
    for k in range(2):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        print("run", k, r.stdout.strip(), repr(r.stderr))
    r = subprocess.run([sys.executable, "-c", "import sys; sys.exit(4)"])
    print("exit", r.returncode)


def threads():
    import threading
    import numpy as np
    out = [None] * 6

    def work(k):
        import random
        a = bytearray(random.Random(k).randbytes(1 << 10) * n(1 << 14))  # 16 MiB of one repeated KiB
        b = bytes(a)
        c = bytearray(b)
        c[k::4096] = bytes([a[k] ^ 0xFF]) * len(c[k::4096])
        x = np.frombuffer(c, dtype=np.uint8).sum(dtype=np.int64)
        out[k] = (len(a), a == b, c != a, int(x) >= int(np.frombuffer(a, np.uint8).sum(dtype=np.int64)))

    ts = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for o in out:
        print(*o)


def numpy_ops():
    import tempfile
    import numpy as np
    rng = np.random.default_rng(1)
    a = rng.standard_normal(n(3 << 20))
    b = a.copy()
    b[::1000] = 0
    c = a[10:-10].copy()
    d = np.concatenate([a, b, c])
    e = d.reshape(-1)[: len(a)] * 2
    e += 1
    e[::2] -= a[::2]
    f = np.ascontiguousarray(np.stack([a[: n(1 << 18)]] * 4).T)
    g = np.sort(b)
    print("digests", digest(a), digest(b), digest(c), digest(d), digest(e), digest(f), digest(g))
    print("sums", round(float(d.sum()), 6), round(float(e.sum()), 6), round(float(g[-5:].sum()), 6))
    with tempfile.TemporaryDirectory(prefix="advm-sweep-") as tmp:
        path = os.path.join(tmp, "m.dat")
        m = np.memmap(path, dtype=np.float64, mode="w+", shape=(len(a),))
        m[:] = a
        m[::3] *= 3
        m.flush()
        del m
        r = np.memmap(path, dtype=np.float64, mode="r")
        print("memmap", digest(np.asarray(r)), round(float(r.sum()), 6))
        rc = np.memmap(path, dtype=np.float64, mode="c")
        rc[:100] = 7  # copy-on-write: the file keeps its bytes
        del rc, r
        print("memmap after c", digest(np.fromfile(path, dtype=np.float64)))
        np.save(os.path.join(tmp, "a.npy"), a)
        np.savez(os.path.join(tmp, "z.npz"), b=b, c=c)
        la = np.load(os.path.join(tmp, "a.npy"))
        lm = np.load(os.path.join(tmp, "a.npy"), mmap_mode="r")
        z = np.load(os.path.join(tmp, "z.npz"))
        print("load", digest(la), digest(np.array(lm)), digest(z["b"]), digest(z["c"]))


def pandas_ops():
    import numpy as np
    import pandas as pd
    rows = n(1_000_000)
    rng = np.random.default_rng(2)
    df = pd.DataFrame({
        "k": rng.integers(0, 1000, rows),
        "g": rng.integers(0, 17, rows),
        "x": rng.standard_normal(rows),
        "y": rng.integers(0, 1 << 30, rows),
    })
    agg = df.groupby("g").agg(x=("x", "sum"), y=("y", "max"), n=("k", "count"))
    print(agg.round(6).to_csv())
    right = pd.DataFrame({"k": np.arange(1000), "w": np.arange(1000) * 0.5})
    m = df.merge(right, on="k", how="left")
    m["z"] = m["x"] * m["w"]
    d2 = df.copy()
    d2.loc[d2["g"] == 3, "x"] = 0.0
    s = m.sort_values(["g", "k"], kind="stable")
    print(round(float(m["z"].sum()), 4), round(float(d2["x"].sum()), 4), round(float(df["x"].sum()), 4))
    print(s.head(3)[["g", "k"]].to_csv(index=False).strip())
    print(pd.util.hash_pandas_object(s[["k", "g", "y"]], index=False).sum())


def both_written():
    """A copy whose two sides are then written whole (docs/run.md, Limits)."""
    import time
    import numpy as np
    a = np.arange(n(8 << 20), dtype=np.int64)
    b = a.copy()
    b[::5] = -1
    a[::7] = 99
    time.sleep(0.5)
    print(int(a.sum()), int(b.sum()))


def interrupt():
    """Computes until SIGINT; KeyboardInterrupt is caught (argv[2] == 'catch') or not."""
    import numpy as np
    a = np.arange(n(1 << 20), dtype=np.float64)
    print("ready", flush=True)
    try:
        while True:
            b = a.copy()
            b += 1
    except KeyboardInterrupt:
        if sys.argv[2:] != ["catch"]:
            raise
        print("KeyboardInterrupt caught", float(a.sum()), flush=True)
        sys.exit(0)


def exits():
    """Exits as argv[2] says: code3, sigkill, sigsegv, child_os_exit."""
    import signal
    import numpy as np
    a = np.ones(n(1 << 20))
    b = a.copy()
    print("before", float(b.sum()), flush=True)
    how = sys.argv[2]
    if how == "code3":
        sys.exit(3)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "sigsegv":
        import ctypes
        ctypes.string_at(0)
    if how == "child_os_exit":
        pid = os.fork()
        if pid == 0:
            print("in child (buffered, lost by os._exit)")
            os._exit(7)
        print("child status", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        return
    raise SystemExit(f"unknown exit {how}")


def serve():
    """Loads ~200 MB of weights (two models sharing a base, as fine-tunes do), prints
    "ready", then answers lines on stdin: `check` (every weight as loaded), `write I V`
    (a private update), `sum`."""
    import numpy as np
    path = sys.argv[2]
    base = np.load(path)
    models = [base.copy(), np.load(path)]  # the same bytes twice, as two loads give
    models[1][: len(base) // 100] += 1  # the fine-tune differs in one page in a hundred
    want = [digest(m) for m in models]
    print("ready", len(base) * base.itemsize * 2, flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "check":
            print("check", [digest(m) == w for m, w in zip(models, want)], flush=True)
        elif cmd[0] == "write":
            i, v = int(cmd[1]), float(cmd[2])
            models[0][i] = v
            want[0] = digest(models[0])
            print("wrote", models[0][i], models[1][i] != v, flush=True)
        elif cmd[0] == "sum":
            print("sum", [round(float(m.sum()), 3) for m in models], flush=True)
        elif cmd[0] == "quit":
            break


def make_weights():
    import numpy as np
    rng = np.random.default_rng(3)
    np.save(sys.argv[2], rng.standard_normal(n(25 << 20) // 1).astype(np.float32))


WORKLOADS = {
    "mp_fork": lambda: mp("fork"),
    "mp_spawn": lambda: mp("spawn"),
    "mp_forkserver": lambda: mp("forkserver"),
    "pool_load": pool_load,
    "futures": futures,
    "fork_wait": fork_wait,
    "subproc": subproc,
    "threads": threads,
    "numpy_ops": numpy_ops,
    "pandas_ops": pandas_ops,
    "both_written": both_written,
    "interrupt": interrupt,
    "exits": exits,
    "serve": serve,
    "make_weights": make_weights,
}

if __name__ == "__main__":
    WORKLOADS[sys.argv[1]]()
