#!/usr/bin/env python3
"""The pause and the copy-on-write faults of `advm vm dump`, two advm builds side by side.

    flock -o /work/bench.lock bench/vm/dump-pause.py OUTDIR LABEL=ADVM[,VAR=VALUE...] ...

(e.g. `whole=target/release/advm,ADVM_PMEM_DUMP_WHOLE=1`: the VM's environment gets VAR).

For each build in turn, and the whole list ROUNDS times (ABAB...): boots a 128 MiB
pmem guest with --guest-writes (a QMP socket added), waits DUMPS_WAIT_S, then
- DUMPS dumps 3 s apart; before each, QEMU's minor faults over 1 s without a dump (the
  baseline rate); the dump's faults from the request until the copy is done (from
  /proc/QEMU/stat, all threads), and the pause as the shim measured it;
- one loss check: QMP `stop`, `pmemsave` of the whole virtio-pmem device (the truth),
  the dump requested, QMP `cont` as soon as the shim has forked (so the guest writes
  during the copy), then `qemu-img check` and `qemu-img compare` of the overlay against
  the truth.
With MERGE=1 each guest is booted with `--merge --merge-after 0` (QEMU's own store, no
daemon, as the merged boot test does): guest RAM is then thousands of store mappings, and
the number of QEMU's mappings (and of those marked `dc`) before the first dump is
recorded.
Writes OUTDIR/report.json and prints a table; the load (uptime) before and after each VM.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

IMAGE = os.path.expanduser(os.environ.get("ADVM_VM_IMAGE", "~/.cache/advm/vm/app.qcow2"))
DUMPS = int(os.environ.get("DUMPS", "5"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))
WAIT_S = float(os.environ.get("DUMPS_WAIT_S", "8"))
MERGE = os.environ.get("MERGE", "0") == "1"


def mappings(pid):
    """QEMU's mappings, and how many of them carry MADV_DONTFORK (`dc`)."""
    n = dc = 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if line.startswith("VmFlags:"):
                n += 1
                dc += " dc" in line
    return n, dc


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def minflt(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


class Qmp:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        for _ in range(100):
            try:
                self.s.connect(path)
                break
            except OSError:
                time.sleep(0.1)
        self.f = self.s.makefile("rw")
        self.f.readline()
        self.cmd("qmp_capabilities")

    def cmd(self, name, **args):
        self.f.write(json.dumps({"execute": name, "arguments": args}) + "\n")
        self.f.flush()
        while True:
            r = json.loads(self.f.readline())
            if "return" in r or "error" in r:
                if "error" in r:
                    raise RuntimeError(f"QMP {name}: {r['error']}")
                return r["return"]


def dump(advm, vm, out, qemu):
    f0 = minflt(qemu)
    t = time.monotonic()
    r = subprocess.run([advm, "vm", "dump", "--vm", str(vm), "--out", out], capture_output=True, text=True)
    el = time.monotonic() - t
    f1 = minflt(qemu)
    if r.returncode:
        raise RuntimeError(f"dump failed: {r.stdout} {r.stderr}")
    m = re.search(r"(\d+) clusters.*paused ([\d.]+) ms.*after (\d+) ms", r.stdout)
    parts = re.search(r"(?:smaps|maps) scan ([\d.]+) ms.*marks ([\d.]+) ms, fork ([\d.]+) ms, unmarks \+ first child ([\d.]+) ms.*"
                      r"left out of the fork: (\d+) ranges, ([\d.]+) MiB", r.stdout)
    kind = re.search(r"\n  (smaps|maps) scan", r.stdout)
    d = {"clusters": int(m[1]), "pause_ms": float(m[2]), "copy_ms": int(m[3]), "faults": f1 - f0, "cli_s": el,
         "out": r.stdout.strip(), "scan": kind[1] if kind else None}
    if parts:
        d.update(scan_ms=float(parts[1]), marks_ms=float(parts[2]), fork_ms=float(parts[3]),
                 after_ms=float(parts[4]), left_ranges=int(parts[5]), left_mib=float(parts[6]))
    return d


def loss_check(advm, vm, qemu, qmp, outdir, label, i):
    devs = [d for d in qmp.cmd("query-memory-devices") if d["type"] == "virtio-pmem"]
    addr, size = devs[0]["data"]["memaddr"], devs[0]["data"]["size"]
    truth = os.path.join(outdir, f"{label}-{i}-truth.raw")
    out = os.path.join(outdir, f"{label}-{i}-check.qcow2")
    work = f"/tmp/advm-vm-{vm}"
    qmp.cmd("stop")
    qmp.cmd("pmemsave", val=addr, size=size, filename=truth)
    for f in ("dump.pause_ns",):
        try:
            os.remove(os.path.join(work, f))
        except FileNotFoundError:
            pass
    p = subprocess.Popen([advm, "vm", "dump", "--vm", str(vm), "--out", out], stdout=subprocess.PIPE, text=True)
    # The shim writes dump.pause_ns once it has forked; the guest goes on from there.
    t = time.monotonic()
    while not os.path.exists(os.path.join(work, "dump.pause_ns")) and time.monotonic() - t < 30:
        time.sleep(0.001)
    qmp.cmd("cont")
    f0 = minflt(qemu)
    text, _ = p.communicate()
    if p.returncode:
        raise RuntimeError(f"loss-check dump failed: {text}")
    check = subprocess.run(["qemu-img", "check", "-q", out], capture_output=True, text=True)
    cmp_ = subprocess.run(["qemu-img", "compare", "-F", "raw", out, truth], capture_output=True, text=True)
    os.remove(truth)
    return {"check_rc": check.returncode, "compare_rc": cmp_.returncode,
            "compare": (cmp_.stdout + cmp_.stderr).strip(), "faults_while_copying": minflt(qemu) - f0,
            "out": text.strip()}


def one_vm(label, spec, outdir, i):
    advm, *env = spec.split(",")
    env = dict(os.environ, **dict(e.split("=", 1) for e in env))
    sock = os.path.join(outdir, f"qmp-{label}-{i}.sock")
    load0 = uptime()
    merge = ["--merge", "--merge-after", "0"] if MERGE else []
    if MERGE:
        env.setdefault("ADVM_SOCKET", "/nonexistent/advmd.sock")
    vm = subprocess.Popen([advm, "vm", "run", "--image", IMAGE, "--disk", "pmem", "--mem", "128", "--guest-writes",
                           *merge, "--", "-qmp", f"unix:{sock},server=on,wait=off"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = vm.stdout.readline()
        if "ready" not in line:
            raise RuntimeError(f"{label}: no ready line: {line!r} {vm.stderr.read()[-2000:]}")
        merged = None
        if MERGE:
            m = vm.stdout.readline()
            if not m.startswith("merged: "):
                raise RuntimeError(f"{label}: no merged line: {m!r}")
            merged = json.loads(m[len("merged: "):])
        with open(f"/tmp/advm-vm-{vm.pid}/vm.json") as f:
            qemu = json.load(f)["qemu_pid"]
        qmp = Qmp(sock)
        time.sleep(WAIT_S)
        maps_before = mappings(qemu)
        print(f"{label} vm{i}: QEMU has {maps_before[0]} mappings, {maps_before[1]} marked dc", flush=True)
        rows = []
        for k in range(DUMPS):
            b0 = minflt(qemu)
            time.sleep(1.0)
            base = minflt(qemu) - b0
            d = dump(advm, vm.pid, os.path.join(outdir, f"{label}-{i}-{k}.qcow2"), qemu)
            d["baseline_faults_per_s"] = base
            chk = subprocess.run(["qemu-img", "check", "-q", os.path.join(outdir, f"{label}-{i}-{k}.qcow2")])
            d["check_rc"] = chk.returncode
            rows.append(d)
            print(f"{label} vm{i} dump{k}: {d}", flush=True)
            time.sleep(2.0)
        loss = loss_check(advm, vm.pid, qemu, qmp, outdir, label, i)
        print(f"{label} vm{i} loss check: {loss}", flush=True)
        return {"label": label, "vm": i, "load_before": load0, "load_after": uptime(), "dumps": rows, "loss": loss,
                "merged": merged, "mappings": maps_before[0], "mappings_dc": maps_before[1],
                "mappings_after": mappings(qemu)}
    finally:
        vm.send_signal(signal.SIGTERM)
        try:
            vm.wait(timeout=30)
        except subprocess.TimeoutExpired:
            vm.kill()
            vm.wait()


def main():
    outdir = sys.argv[1]
    builds = [a.split("=", 1) for a in sys.argv[2:]]
    os.makedirs(outdir, exist_ok=True)
    runs = []
    for i in range(ROUNDS):
        for label, spec in builds:
            runs.append(one_vm(label, spec, outdir, i))
            with open(os.path.join(outdir, "report.json"), "w") as f:
                json.dump(runs, f, indent=1)
    print("\nbuild  vm  pause ms (per dump)                 faults during copy (baseline/s)   copy ms   loss check")
    for r in runs:
        ds = r["dumps"]
        print(f"{r['label']:6} {r['vm']:2}  {' '.join('%.2f' % d['pause_ms'] for d in ds):35} "
              f"{' '.join(str(d['faults']) for d in ds):20} ({ds[0]['baseline_faults_per_s']})  "
              f"{' '.join(str(d['copy_ms']) for d in ds)}  check {r['loss']['check_rc']} compare {r['loss']['compare_rc']}")
    print("\nmedians [range] per build: handler ms, scan ms, marks ms, fork ms, faults during copy, left out MiB, mappings")
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")
    for label, _ in builds:
        ds = [d for r in runs if r["label"] == label for d in r["dumps"]]
        row = []
        for k in ("pause_ms", "scan_ms", "marks_ms", "fork_ms", "faults", "left_mib"):
            xs = [d[k] for d in ds if k in d]
            row.append(f"{k} {med(xs):.2f} [{min(xs, default=0):.2f}-{max(xs, default=0):.2f}]")
        maps = [r["mappings"] for r in runs if r["label"] == label]
        print(f"{label:6} " + ", ".join(row) + f", mappings {maps}")


if __name__ == "__main__":
    main()
