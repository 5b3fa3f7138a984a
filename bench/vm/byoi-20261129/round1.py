import sys, json, os, time, subprocess
sys.path.insert(0, "/tmp/vmuser-bin")
from vmlib import *
IMG = "/tmp/vmuser-img/flat.qcow2"
R = {}
R["before"] = [sh("md5sum", IMG)[1], sh("qemu-img", "check", IMG)[1][-80:]]
R["load0"] = sh("uptime")[1]
a = Vm("a", IMG, "pmem", ["--guest-writes"]); b = Vm("b", IMG, "pmem", ["--guest-writes"])
try:
    R["a_ready"] = a.ready(); R["b_ready"] = b.ready()
    R["a_s"], R["b_s"] = a.ready_s, b.ready_s
    R["a_get"], R["b_get"] = a.get(), b.get()
    time.sleep(3)
    for who, pids in (("stat_a", [a.qemu]), ("stat_b", [b.qemu]), ("stat_ab", [a.qemu, b.qemu])):
        R[who] = json.loads(sh(ADVM, "stat", "--json", *map(str, pids))[1])
    R["cg_a"], R["cg_b"] = cgstat(a.cg), cgstat(b.cg)
    R["cg_a_advm"] = json.loads(sh(ADVM, "stat", "--json", "--cgroup", a.cg)[1])
    R["cg_b_advm"] = json.loads(sh(ADVM, "stat", "--json", "--cgroup", b.cg)[1])
    # isolation: both guests stopped, both devices saved
    for v in (a, b): v.qmp.cmd("stop")
    a.pmemsave(f"{RUN}/a.raw"); b.pmemsave(f"{RUN}/b.raw")
    for v in (a, b): v.qmp.cmd("cont")
    # dump of A against a pmemsave (as bench/vm/dump-pause.py's loss check)
    a.qmp.cmd("stop"); a.pmemsave(f"{RUN}/a-truth.raw")
    work = f"/tmp/advm-vm-{a.p.pid}"
    p = subprocess.Popen([ADVM, "vm", "dump", "--vm", str(a.p.pid), "--out", f"{RUN}/a-dump.qcow2"], stdout=subprocess.PIPE, text=True)
    t = time.monotonic()
    while not os.path.exists(f"{work}/dump.pause_ns") and time.monotonic() - t < 30: time.sleep(0.001)
    a.qmp.cmd("cont")
    R["dump_out"] = p.communicate()[0]
    R["dump_check"] = sh("qemu-img", "check", f"{RUN}/a-dump.qcow2")
    R["dump_compare"] = sh("qemu-img", "compare", "-F", "raw", f"{RUN}/a-dump.qcow2", f"{RUN}/a-truth.raw")
    R["dump_info"] = sh("qemu-img", "info", f"{RUN}/a-dump.qcow2")[1]
    R["a_get2"], R["b_get2"] = a.get(), b.get()
finally:
    R["stop_a"] = a.stop("int-group") if a.p.poll() is None else "dead"
    R["stop_b"] = b.stop("term") if b.p.poll() is None else "dead"
    a.rmcg(); b.rmcg()
R["after"] = [sh("md5sum", IMG)[1], sh("qemu-img", "check", IMG)[1][-80:]]
R["load1"] = sh("uptime")[1]
json.dump(R, open(f"{RUN}/round1.json", "w"), indent=1, default=str)
print("done")
