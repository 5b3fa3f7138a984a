#!/usr/bin/env python3
"""advmd's memory under one long-lived client that merges the same buffer again and
again (bench/merge/repeat.c): the daemon's anonymous memory (smaps_rollup), its
distinct anon pages (`advm stat`) and its own memory cgroup's anon+shmem, at start,
after the merges with the session still open, and a second after the client exited.

Usage (root; cgroup v1 or v2; a private socket, never /run/advm):
  python3 bench/merge/repeat.py OUT.json TIMES KIB LABEL=ADVM_BINARY ...
Each LABEL's `advm daemon` runs in turn (in the order given, so alternate them), in a
memory cgroup of its own that is removed afterwards. REPEAT (the built repeat.c) and
ADVM_STAT (an advm binary for `advm stat`) come from the environment.
"""
import json
import os
import signal
import subprocess
import sys
import time

SCRATCH = "/tmp/advmd2-m"


def cgroup_dir(name):
    v1 = "/sys/fs/cgroup/memory"
    base = v1 if os.path.isdir(v1) else "/sys/fs/cgroup"
    return os.path.join(base, name)


def meters(stat, pid, group):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        anon_kib = next(int(l.split()[1]) for l in f if l.startswith("Anonymous:"))
    d = json.loads(subprocess.check_output([stat, "stat", str(pid), "--json"]))
    g = json.loads(subprocess.check_output([stat, "stat", "--cgroup", group, "--json"]))
    return {
        "anonymous_kib": anon_kib,
        "rss_kib": d["rss_bytes"] // 1024,
        "distinct_anon_pages": d["distinct"]["anon"],
        "distinct_shmem_pages": d["distinct"]["shmem"],
        "cgroup_anon_shmem_kib": g["anon_shmem_bytes"] // 1024,
    }


def run(label, advm, times, kib, stat, repeat):
    sock_dir = os.path.join(SCRATCH, label)
    os.makedirs(sock_dir, exist_ok=True)
    sock = os.path.join(sock_dir, "advmd.sock")
    group = cgroup_dir(f"advmd2-repeat-{label}")
    os.makedirs(group, exist_ok=True)

    def join():
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write("0")

    daemon = subprocess.Popen([advm, "daemon", "--socket", sock], preexec_fn=join, stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(sock):
            time.sleep(0.05)
        time.sleep(0.5)
        out = {"label": label, "start": meters(stat, daemon.pid, group)}
        env = dict(os.environ, ADVM_SOCKET=sock)
        t = time.time()
        client = subprocess.Popen([repeat, str(times), str(kib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env=env, text=True)
        for line in client.stdout:
            if line.strip() == "done":
                break
        else:
            raise SystemExit(f"{label}: the client failed ({client.wait()})")
        out["merges_seconds"] = round(time.time() - t, 2)
        out["open"] = meters(stat, daemon.pid, group)
        client.stdin.close()
        client.wait()
        time.sleep(1.5)
        out["after_exit"] = meters(stat, daemon.pid, group)
        return out
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=5)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        time.sleep(0.2)
        os.rmdir(group)


def main():
    out_path, times, kib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    stat, repeat = os.environ["ADVM_STAT"], os.environ["REPEAT"]
    runs = []
    for arg in sys.argv[4:]:
        label, advm = arg.split("=", 1)
        r = run(label, advm, times, kib, stat, repeat)
        print(json.dumps(r), flush=True)
        runs.append(r)
    load = open("/proc/loadavg").read().split()[:3]
    with open(out_path, "w") as f:
        json.dump({"times": times, "kib": kib, "load": load, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "runs": runs}, f, indent=1)


main()
