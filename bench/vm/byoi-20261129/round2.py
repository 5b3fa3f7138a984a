import sys, json, os, time, subprocess
sys.path.insert(0, "/tmp/vmuser-bin")
from vmlib import *
I = "/tmp/vmuser-img"
GOFF, HOFF = 201588736, 195559424
R = {"load0": sh("uptime")[1]}
R["flatc_before"] = sh("md5sum", f"{I}/flatc.qcow2")[1]
a = Vm("c", f"{I}/flatc.qcow2", "blk"); b = Vm("d", f"{I}/chg/top.qcow2", "pmem", kernel=True)
try:
    R["a_ready"] = a.ready(); R["b_ready"] = b.ready()
    R["a_get"], R["b_get"] = a.get(), b.get()
    # a QEMU-family writer on a layer of the running pmem VM
    R["qemu_io_write"] = sh("qemu-io", "-c", "write -P 0xcd 0 4k", f"{I}/chg/app.qcow2")
    R["qemu_img_commit"] = sh("qemu-img", "commit", f"{I}/chg/top.qcow2")
    b.qmp.cmd("stop"); b.pmemsave(f"{RUN}/d1.raw"); b.qmp.cmd("cont")
    # a plain in-place write to the base layer's data
    with open(f"{I}/chg/base.qcow2", "r+b") as f:
        f.seek(HOFF); f.write(b"\xab" * 4096)
    b.qmp.cmd("stop"); b.pmemsave(f"{RUN}/d2.raw"); b.qmp.cmd("cont")
    d1, d2 = open(f"{RUN}/d1.raw", "rb"), open(f"{RUN}/d2.raw", "rb")
    d1.seek(GOFF); d2.seek(GOFF)
    x1, x2 = d1.read(4096), d2.read(4096)
    R["guest_sees_change"] = {"before_is_ab": x1 == b"\xab" * 4096, "after_is_ab": x2 == b"\xab" * 4096}
    R["b_get2"] = b.get()
    # a second VM start on the changed chain (planned afresh) is not needed to boot: fake QEMU
    R["new_plan"] = sh(ADVM, "vm", "run", "--image", f"{I}/chg/top.qcow2", "--accel", "tcg", "--kernel", f"{G}/vmlinuz", "--initrd", f"{G}/initrd.img", "--qemu", "/bin/true", env=dict(os.environ, ADVM_SOCKET="/tmp/vmuser-no.sock"))
finally:
    R["stop_c"] = a.stop("int-group") if a.p.poll() is None else "dead"
    R["stop_d"] = b.stop("term") if b.p.poll() is None else "dead"
    a.rmcg(); b.rmcg()
R["flatc_after"] = sh("md5sum", f"{I}/flatc.qcow2")[1]
R["load1"] = sh("uptime")[1]
json.dump(R, open(f"{RUN}/round2.json", "w"), indent=1, default=str)
