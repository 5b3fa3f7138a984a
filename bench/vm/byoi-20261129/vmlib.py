import json, os, signal, socket, subprocess, time, glob
ADVM = "/work/wt-vmuser/target/debug/advm"
G = "/tmp/vmuser-guest"
RUN = "/tmp/vmuser-run"
CGROOT = "/sys/fs/cgroup/memory/process_api/4db5dba2137653f4fd573a8bf738f4d4"

def sh(*a, **k):
    r = subprocess.run(list(a), capture_output=True, text=True, **k)
    return r.returncode, (r.stdout + r.stderr).strip()

class Qmp:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        for _ in range(200):
            try:
                self.s.connect(path); break
            except OSError:
                time.sleep(0.1)
        self.f = self.s.makefile("rw"); self.f.readline(); self.cmd("qmp_capabilities")
    def cmd(self, name, **args):
        self.f.write(json.dumps({"execute": name, "arguments": args}) + "\n"); self.f.flush()
        while True:
            r = json.loads(self.f.readline())
            if "error" in r: raise RuntimeError(f"QMP {name}: {r['error']}")
            if "return" in r: return r["return"]

class Vm:
    def __init__(self, name, image, disk, flags=(), kernel=True, cgroup=True):
        self.name = name
        self.sock = f"{RUN}/{name}.qmp"
        self.cg = f"{CGROOT}/vmuser-{name}" if cgroup else None
        if self.cg:
            os.makedirs(self.cg, exist_ok=True)
        args = [ADVM, "vm", "run", "--image", image, "--disk", disk, "--accel", "tcg", "--mem", "128", "--timeout", "150", *flags]
        if kernel:
            args += ["--kernel", f"{G}/vmlinuz", "--initrd", f"{G}/initrd.img"]
        args += ["--", "-qmp", f"unix:{self.sock},server=on,wait=off"]
        pre = f'echo $$ > {self.cg}/cgroup.procs; ' if self.cg else ''
        self.err = open(f"{RUN}/{name}.err", "w")
        self.p = subprocess.Popen(["sh", "-c", pre + 'exec "$@"', "sh", *args], stdout=subprocess.PIPE, stderr=self.err,
                                  text=True, start_new_session=True, env=dict(os.environ, ADVM_SOCKET="/tmp/vmuser-no.sock"))
        self.t0 = time.monotonic()
    def ready(self):
        line = self.p.stdout.readline()
        self.ready_line = line.strip()
        self.ready_s = time.monotonic() - self.t0
        if "ready" not in line:
            raise RuntimeError(f"{self.name}: {line!r}: {open(f'{RUN}/{self.name}.err').read()[-3000:]}")
        self.port = int(line.split("127.0.0.1:")[1].split("/")[0])
        self.qemu = json.load(open(f"/tmp/advm-vm-{self.p.pid}/vm.json"))["qemu_pid"]
        self.qmp = Qmp(self.sock)
        return line.strip()
    def get(self, path="/"):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        out = b""
        while True:
            b = s.recv(65536)
            if not b: break
            out += b
        return out.decode(errors="replace").split("\r\n\r\n", 1)[-1].strip()
    def pmemsave(self, path):
        devs = [d for d in self.qmp.cmd("query-memory-devices") if d["type"] == "virtio-pmem"]
        addr, size = devs[0]["data"]["memaddr"], devs[0]["data"]["size"]
        self.qmp.cmd("pmemsave", val=addr, size=size, filename=path)
    def stop(self, how):
        """how: 'int-group' (Ctrl-C at a terminal), 'term' (SIGTERM to advm)"""
        if how == "int-group":
            os.killpg(self.p.pid, signal.SIGINT)
        else:
            os.kill(self.p.pid, signal.SIGTERM)
        t = time.monotonic()
        rc = self.p.wait(timeout=60)
        el = time.monotonic() - t
        self.err.close()
        time.sleep(0.3)
        qemu_alive = os.path.exists(f"/proc/{self.qemu}") if hasattr(self, "qemu") else None
        left = os.path.exists(f"/tmp/advm-vm-{self.p.pid}")
        return {"rc": rc, "stop_s": round(el, 2), "qemu_left": qemu_alive, "workdir_left": left,
                "stderr_tail": open(f"{RUN}/{self.name}.err").read()[-400:]}
    def rmcg(self):
        if self.cg:
            try: os.rmdir(self.cg)
            except OSError as e: print("cgroup", self.cg, e)

def cgstat(cg):
    st = {}
    for l in open(f"{cg}/memory.stat"):
        k, v = l.split(); st[k] = int(v)
    return {k: round(st.get(k, 0) / 2**20, 1) for k in ("rss", "shmem", "cache", "mapped_file")}
