# pair.py OUT name|image|disk|stop|flag,flag ...   (two VMs at once at most)
import sys, json, os, time
sys.path.insert(0, "/tmp/vmuser-bin")
from vmlib import *
R = {"load0": sh("uptime")[1]}
vms = []
for spec in sys.argv[2:]:
    name, image, disk, stop, *fl = spec.split("|")
    flags = [f for f in (fl[0].split(",") if fl else []) if f]
    R[f"{name}_md5_before"] = sh("md5sum", image)[1]
    vms.append((Vm(name, image, disk, flags), stop, image))
try:
    for v, _, _ in vms:
        try:
            R[f"{v.name}_ready"] = v.ready(); R[f"{v.name}_get"] = v.get()
            R[f"{v.name}_meminfo_cached"] = [l for l in v.get("/meminfo").splitlines() if l.startswith("Cached")]
            mounts = [l for l in open(f"/tmp/advm-vm-{v.p.pid}/console.log", errors="replace").read().splitlines() if "advm-init" in l]
            R[f"{v.name}_init"] = mounts
            if os.environ.get("SCRIBBLE") and v.name == os.environ.get("SCRIBBLE_VM"):
                with open(os.environ["SCRIBBLE"], "r+b") as f:
                    f.seek(195559424); f.write(b"\xab" * 4096)
                time.sleep(1.5)
        except Exception as e:
            R[f"{v.name}_error"] = str(e)
finally:
    for v, stop, image in vms:
        R[f"{v.name}_stop"] = v.stop(stop) if v.p.poll() is None else {"rc": v.p.returncode, "err": open(f"{RUN}/{v.name}.err").read()[-1500:]}
        R[f"{v.name}_md5_after"] = sh("md5sum", image)[1]
        v.rmcg()
R["load1"] = sh("uptime")[1]
json.dump(R, open(sys.argv[1], "w"), indent=1, default=str)
for k, v in R.items(): print(k, json.dumps(v)[:700])
