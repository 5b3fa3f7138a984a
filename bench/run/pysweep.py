#!/usr/bin/env python3
"""Sweeps unmodified Python and R programs under every `advm run` mode (docs/run.md,
"Python and R programs swept").

    ADVM=target/release/advm bench/run/pysweep.py [--scale S] [--modes m1,m2] [--only a,b] [--out FILE]

For each program of crates/advm-cli/tests/programs/sweep/ and each mode it runs
`advm run --mode M --cgroup --stats --json -- PROGRAM` and checks: stdout and exit
status as the plain run's (no advm at all), no hang (timeout), both JSON reports
well-formed; it reports memory on both meters: the cgroup's anon+shmem (mean and
peak, from --cgroup) and distinct anon+shmem pages of the program's process tree
(`advm stat --json PIDS` every 200 ms, mean and peak), each against `--mode off`
(medians over --passes interleaved passes; printed as "cgroup mean peak / distinct
mean peak", relative to off).
Then SIGINT (caught and uncaught KeyboardInterrupt) and the weights server under
merge with `advm merge PID`. Measure under the shared lock: `flock -o /work/bench.lock`.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGS = os.path.join(REPO, "crates/advm-cli/tests/programs/sweep")
ADVM = os.environ.get("ADVM", os.path.join(REPO, "target/debug/advm"))
PY = "/usr/bin/python3"
MODES = ["off", "alloc", "vcopy", "ksm", "ksm-aggr", "merge"]
PYW = os.path.join(PROGS, "py_workloads.py")
RW = os.path.join(PROGS, "r_workloads.R")

CASES = [(w, [PY, PYW, w]) for w in
         ["mp_fork", "mp_spawn", "mp_forkserver", "futures", "fork_wait", "subproc", "threads", "numpy_ops",
          "pandas_ops"]]
CASES += [(f"exits_{e}", [PY, PYW, "exits", e]) for e in ["code3", "sigkill", "sigsegv", "child_os_exit"]]
CASES += [(f"r_{w}", ["Rscript", "--vanilla", RW, w]) for w in ["vectors", "frames", "parallel", "matrix", "csv"]]


def env(scale):
    e = dict(os.environ, SWEEP_SCALE=str(scale), ADVM_SOCKET="/nonexistent/pysweep-advmd.sock")
    return e


def tree(pid):
    """pid and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


class Distinct(threading.Thread):
    """Samples distinct anon+shmem of advm's descendants (not advm itself)."""

    def __init__(self, advm_pid):
        super().__init__(daemon=True)
        self.pid, self.samples, self.stop = advm_pid, [], threading.Event()

    def run(self):
        while not self.stop.wait(0.2):
            pids = [str(p) for p in tree(self.pid)[1:]]
            if not pids:
                continue
            r = subprocess.run([ADVM, "stat", "--json", *pids], capture_output=True, text=True)
            if r.returncode == 0:
                self.samples.append(json.loads(r.stdout)["anon_shmem_bytes"])


def json_docs(text):
    """advm's JSON reports (the objects starting a line of stderr), and the text before
    the first of them (the program's own stderr)."""
    dec, docs, first = json.JSONDecoder(), [], len(text)
    for k in [k for k in range(len(text)) if text[k] == "{" and (k == 0 or text[k - 1] == "\n")]:
        try:
            doc, _ = dec.raw_decode(text, k)
        except ValueError:
            continue
        if isinstance(doc, dict) and ("anon_shmem_bytes" in doc or "mode" in doc):
            docs.append(doc)
            first = min(first, k)
    return docs, text[:first]


def run_case(argv, mode, scale, timeout):
    cmd = [ADVM, "run", "--mode", mode, "--cgroup", "--stats", "--json", "--", *argv]
    t = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(scale), cwd="/tmp")
    d = Distinct(p.pid)
    d.start()
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for q in reversed(tree(p.pid)):
            os.kill(q, signal.SIGKILL)
        out, err = p.communicate()
        return {"hang": True, "stdout": out, "rc": None, "stderr": err.decode(errors="replace")[-2000:]}
    d.stop.set()
    d.join()
    docs, prog_err = json_docs(err.decode(errors="replace"))
    r = {"rc": p.returncode, "stdout": out, "seconds": round(time.time() - t, 2), "stderr": prog_err[-2000:]}
    cg = [x for x in docs if "anon_shmem_bytes" in x]
    st = [x for x in docs if "mode" in x]
    full = err.decode(errors="replace")
    r["reports_ok"] = len(cg) == 1 and (len(st) == 1 or (mode == "off" and "shim was not loaded" in full))
    if cg:
        r["cgroup_mean"], r["cgroup_peak"] = cg[0]["anon_shmem_bytes"]["mean"], cg[0]["anon_shmem_bytes"]["max"]
    if d.samples:
        r["distinct_mean"], r["distinct_peak"] = sum(d.samples) / len(d.samples), max(d.samples)
    if st:
        c = st[0].get("counters", {})
        r["virtual_copies"] = c.get("copies_virtual")
        if "merge_agent" in st[0]:
            r["merged"] = st[0]["merge_agent"].get("merged")
    return r


def median(xs):
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2 if xs else None


def plain(argv, scale, timeout):
    p = subprocess.run(argv, capture_output=True, env=env(scale), cwd="/tmp", timeout=timeout)
    return p.returncode, p.stdout


def interrupt_case(mode, catch, scale, group=False):
    """SIGINT to the Python process (advm's child), or to the whole process group as a
    terminal's Ctrl-C: as without advm."""
    argv = [PY, PYW, "interrupt"] + (["catch"] if catch else [])
    pre = [] if mode is None else [ADVM, "run", "--mode", mode, "--"]
    p = subprocess.Popen(pre + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(scale), cwd="/tmp",
                         start_new_session=group)
    assert p.stdout.readline().strip() == b"ready"
    target = p.pid if mode is None else tree(p.pid)[1]
    time.sleep(0.3)
    if group:
        os.killpg(p.pid, signal.SIGINT)
    else:
        os.kill(target, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    return p.returncode, out, b"KeyboardInterrupt" in err


def serve_case(scale, tmp):
    """The weights server under merge: `advm merge PID`, content unchanged, writes private."""
    w = os.path.join(tmp, "w.npy")
    subprocess.run([PY, PYW, "make_weights", w], check=True, env=env(scale))
    p = subprocess.Popen([ADVM, "run", "--mode", "merge", "--merge-after", "1", "--stats", "--json", "--",
                          PY, PYW, "serve", w], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env(scale), text=True)
    ready = p.stdout.readline().split()
    pid = tree(p.pid)[1]
    before = json.loads(subprocess.run([ADVM, "stat", "--json", str(pid)], capture_output=True).stdout)
    time.sleep(2.5)  # the quiet-period merge (--merge-after 1)
    m = subprocess.run([ADVM, "merge", str(pid), "--json"], capture_output=True, text=True)
    after = json.loads(subprocess.run([ADVM, "stat", "--json", str(pid)], capture_output=True).stdout)
    lines = []
    for cmd in ["check", "sum", "write 5 42.5", "check", "write 100 -1", "check", "sum"]:
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
        lines.append(p.stdout.readline().strip())
    p.stdin.write("quit\n")
    p.stdin.close()
    rest, err = p.stdout.read(), p.stderr.read()
    p.wait(timeout=60)
    docs, _ = json_docs(err)
    return {"ready": ready, "merge_rc": m.returncode, "merge": json.loads(m.stdout) if m.returncode == 0 else m.stderr,
            "distinct_before": before["anon_shmem_bytes"], "distinct_after": after["anon_shmem_bytes"],
            "answers": lines, "rc": p.returncode, "report": docs, "rest": rest}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--only", default="")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    modes = a.modes.split(",")
    only = set(a.only.split(",")) - {""}
    results, defects = {"scale": a.scale, "load": os.getloadavg(), "started": time.ctime(), "cases": {}}, []
    todo = [(name, argv) for name, argv in CASES if not only or name in only]
    for name, argv in todo:
        results["cases"][name] = {"plain_rc": None, **{m: [] for m in modes}}
    for pass_ in range(a.passes):
        for name, argv in todo:
            rc0, out0 = plain(argv, a.scale, a.timeout)
            row = results["cases"][name]
            row["plain_rc"] = rc0
            for mode in modes:
                r = run_case(argv, mode, a.scale, a.timeout)
                bad = []
                if r.get("hang"):
                    bad.append("hang")
                if r["rc"] != rc0:
                    bad.append(f"exit {r['rc']} != {rc0}")
                if r["stdout"] != out0:
                    bad.append("stdout differs")
                if not r.get("reports_ok"):
                    bad.append("reports malformed")
                r["stdout"] = len(r["stdout"])
                r["defects"] = bad
                row[mode].append(r)
                defects += [f"{name} {mode} pass {pass_}: {b}" for b in bad]
                if bad:
                    print(f"{name} {mode}: {bad}\n{r.get('stderr', '')[-600:]}", file=sys.stderr)
    for name, _ in todo:
        row = results["cases"][name]
        med = {m: {k: median([r[k] for r in row[m] if r.get(k)]) for k in ["cgroup_mean", "cgroup_peak", "distinct_mean", "distinct_peak", "seconds"]} for m in modes}
        row["medians"] = med
        base = med.get("off", {})
        rel = lambda m, k: f"{100 * med[m][k] / base[k]:.0f}%" if base.get(k) and med[m].get(k) else "-"
        cells = [f"{m} {rel(m, 'cgroup_mean')} {rel(m, 'cgroup_peak')} / {rel(m, 'distinct_mean')} {rel(m, 'distinct_peak')}"
                 for m in modes if m != "off"]
        mib = lambda k: f"{(base.get(k) or 0) / 2**20:.0f}"
        print(f"{name:20} off {mib('cgroup_mean')} {mib('cgroup_peak')} / {mib('distinct_mean')} {mib('distinct_peak')} MiB | "
              + " | ".join(cells), flush=True)
        results["cases"][name] = row

    if not only or "interrupt" in only:
        for catch, group in [(True, False), (False, False), (True, True), (False, True)]:
            ref = interrupt_case(None, catch, a.scale, group)
            for mode in modes:
                got = interrupt_case(mode, catch, a.scale, group)
                ok = got == ref
                results["cases"].setdefault("interrupt", {})[f"{mode} catch={catch} group={group}"] = [got[0], ok]
                if not ok:
                    defects.append(f"interrupt catch={catch} group={group} {mode}: {got} != {ref}")
        print("interrupt", results["cases"]["interrupt"], flush=True)
    if not only or "serve" in only:
        tmp = f"/tmp/pyrun-sweep-{os.getpid()}"
        os.makedirs(tmp, exist_ok=True)
        try:
            s = serve_case(a.scale, tmp)
        finally:
            subprocess.run(["rm", "-rf", tmp])
        results["cases"]["serve"] = s
        print("serve", json.dumps(s)[:1500], flush=True)
    results["defects"] = defects
    print("defects:", defects or "none")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
