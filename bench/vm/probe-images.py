#!/usr/bin/env python3
"""Images made with qemu-img the way a VM platform engineer makes them, each read with
`advm image info`, `map --json` and `cat` (compared with `qemu-img convert -O raw`) and
given to `advm vm run --disk pmem` and `--disk blk` with a stand-in QEMU (probe-qemu.py
beside this file: it maps the pmem device as QEMU does, under the shim, or converts the
blk -drive as QEMU would open it), compared with the same. docs/vm.md, "Probed with
qemu-img". One JSON line per case: "same", or the error advm gave.

    python3 bench/vm/probe-images.py ADVM [CASE...]      # scratch in $PROBE_DIR (/tmp/advm-probe)
    PROBE_FLAGS=--allow-backing-outside python3 bench/vm/probe-images.py ADVM abs-outside dotdot symlink-out

The self-backed case is left out by default: qemu-img convert loops on it.
"""
import hashlib, json, os, shutil, subprocess, sys
ADVM = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else "advm"
R = os.environ.get("PROBE_DIR", "/tmp/advm-probe")
FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe-qemu.py")
FLAGS = os.environ.get("PROBE_FLAGS", "")

def sh(cmd, cwd, check=True):
    r = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"{cmd}: {r.stderr}")
    return r

def md5(path, n=None):
    h = hashlib.md5()
    with open(path, "rb") as f:
        left = n
        while True:
            b = f.read(1 << 22 if left is None else min(1 << 22, left))
            if not b:
                break
            h.update(b)
            if left is not None:
                left -= len(b)
                if left == 0:
                    break
    return h.hexdigest()

def zeros_after(path, n):
    with open(path, "rb") as f:
        f.seek(n)
        while True:
            b = f.read(1 << 22)
            if not b:
                return True
            if b.count(0) != len(b):
                return False

BASE = "qemu-io -f {f} -c 'write -P 0x11 0 1M' -c 'write -P 0x12 3M 100k' -c 'write -P 0x13 7M 1M' {img}"
TOP = ("qemu-io -c 'write -P 0x22 512k 8k' -c 'write -P 0x23 1000k 1k' -c 'write -z 3M 64k' "
       "-c 'write -P 0x24 6M 4k' -c 'discard 7M 64k' {img}")

def chain(d, base_opts="", top_opts="", base_fmt="qcow2", backing="base.qcow2", size="8M"):
    if base_fmt == "raw":
        sh(f"qemu-img create -q -f raw base.raw {size}", d)
        sh(BASE.format(f="raw", img="base.raw"), d)
        backing = backing if backing != "base.qcow2" else "base.raw"
    else:
        sh(f"qemu-img create -q -f qcow2 {base_opts} base.qcow2 {size}", d)
        sh(BASE.format(f="qcow2", img="base.qcow2"), d)
    sh(f"qemu-img create -q -f qcow2 {top_opts} -b {backing} -F {base_fmt} top.qcow2", d)
    sh(TOP.format(img="top.qcow2"), d)
    return "top.qcow2"

def c_opts(o):
    return lambda d: chain(d, f"-o {o}", f"-o {o}")

CASES = {
    "rel": lambda d: chain(d),
    "abs-inside": lambda d: chain(d, backing=f"{d}/base.qcow2"),
    "raw-backing": lambda d: chain(d, base_fmt="raw"),
    "v2": c_opts("compat=0.10"),
    "cs512": c_opts("cluster_size=512"),
    "cs4k": c_opts("cluster_size=4k"),
    "cs64k": c_opts("cluster_size=64k"),
    "cs2m": c_opts("cluster_size=2M"),
    "extl2-64k": c_opts("extended_l2=on,cluster_size=64k"),
    "extl2-2m": c_opts("extended_l2=on,cluster_size=2M"),
    "extl2-16k": c_opts("extended_l2=on,cluster_size=16k"),
    "lazy": c_opts("lazy_refcounts=on"),
    "rc1": c_opts("refcount_bits=1"),
    "rc64": c_opts("refcount_bits=64"),
}

def conv(extra):
    def f(d):
        chain(d)
        sh(f"qemu-img convert {extra} -O qcow2 top.qcow2 flat.qcow2", d)
        return "flat.qcow2"
    return f

CASES["zlib"] = conv("-c -o compression_type=zlib")
CASES["zstd"] = conv("-c -o compression_type=zstd")
CASES["zstd-cs512"] = conv("-c -o compression_type=zstd,cluster_size=512")
CASES["zlib-extl2"] = conv("-c -o compression_type=zlib,extended_l2=on")
CASES["v2-convert"] = conv("-o compat=0.10")

def raw_top(d):
    chain(d)
    sh("qemu-img convert -O raw top.qcow2 disk.raw", d)
    return "disk.raw"
CASES["raw-top"] = raw_top

def symlink_in(d):
    chain(d)
    os.rename(f"{d}/base.qcow2", f"{d}/real-base.qcow2")
    os.symlink("real-base.qcow2", f"{d}/base.qcow2")
    return "top.qcow2"
CASES["symlink-layer"] = symlink_in

def symlink_top(d):
    chain(d)
    os.symlink("top.qcow2", f"{d}/link.qcow2")
    return "link.qcow2"
CASES["symlink-top"] = symlink_top

def missing(d):
    chain(d)
    os.remove(f"{d}/base.qcow2")
    return "top.qcow2"
CASES["missing-layer"] = missing

def luks(d):
    sh("qemu-img create -q -f qcow2 --object secret,id=s0,data=pw -o encrypt.format=luks,encrypt.key-secret=s0 top.qcow2 8M", d)
    sh("qemu-io --object secret,id=s0,data=pw --image-opts -c 'write -P 0x44 0 64k' driver=qcow2,file.filename=top.qcow2,encrypt.key-secret=s0", d)
    return "top.qcow2"
CASES["luks"] = luks

def vmdk(d):
    sh("qemu-img create -q -f vmdk top.vmdk 8M", d)
    return "top.vmdk"
CASES["vmdk"] = vmdk

def vdi(d):
    sh("qemu-img create -q -f vdi top.vdi 8M", d)
    return "top.vdi"
CASES["vdi"] = vdi

def vmdk_backing(d):
    sh("qemu-img create -q -f vmdk base.vmdk 8M", d)
    sh("qemu-img create -q -f qcow2 -b base.vmdk -F vmdk top.qcow2", d)
    return "top.qcow2"
CASES["vmdk-backing"] = vmdk_backing

def run_case(name, build, only_vm=None):
    d = f"{R}/c/{name}"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    top = build(d)
    res = {"case": name}
    ref = f"{d}/ref.raw"
    r = sh(f"qemu-img convert -U -O raw {top} {ref}", d, check=False)
    res["convert"] = "ok" if r.returncode == 0 else r.stderr.strip()[-200:]
    have_ref = r.returncode == 0
    n = os.path.getsize(ref) if have_ref else None
    for cmd in ["info", "map --json"]:
        r = sh(f"{ADVM} image {cmd} {FLAGS} {top}", d, check=False)
        res[cmd.split()[0]] = "ok" if r.returncode == 0 else r.stderr.strip()
    r = sh(f"{ADVM} image cat {FLAGS} {top} > cat.raw", d, check=False)
    if r.returncode:
        res["cat"] = r.stderr.strip()
    else:
        res["cat"] = "same" if have_ref and md5(f"{d}/cat.raw") == md5(ref) else f"DIFFERS ({os.path.getsize(f'{d}/cat.raw')} vs {n})"
    os.remove(f"{d}/cat.raw")
    for disk in ["pmem", "blk"]:
        out = f"{d}/dev-{disk}.raw"
        env = dict(os.environ, FAKE_OUT=out, ADVM_SOCKET=f"{R}/no.sock")
        p = subprocess.run([ADVM, "vm", "run", "--json", "--image", top, "--disk", disk, "--accel", "tcg",
                            "--kernel", f"{R}/vmlinuz", "--initrd", f"{R}/initrd.img", "--qemu", FAKE,
                            "--exit-when-ready", "--timeout", "30", *FLAGS.split()], cwd=d, env=env, capture_output=True, text=True)
        ev = [json.loads(l) for l in p.stdout.splitlines()]
        ex = ev[-1] if ev else {}
        if p.returncode:
            res[disk] = (ex.get("error") or p.stderr.strip()).splitlines()[0][:400]
        elif not os.path.exists(out):
            res[disk] = "NO DEVICE"
        elif not have_ref:
            res[disk] = "ran, no reference"
        else:
            same = md5(out, n) == md5(ref) and zeros_after(out, n) and os.path.getsize(out) >= n
            res[disk] = "same" if same else f"DIFFERS (size {os.path.getsize(out)} vs {n})"
        if os.path.exists(out):
            os.remove(out)
    return res


def luks2(d):
    for _ in range(3):
        try:
            return luks(d)
        except RuntimeError:
            pass
    return luks(d)
CASES["luks"] = luks2

for mode in ["metadata", "falloc", "full"]:
    CASES[f"prealloc-base-{mode}"] = (lambda m: lambda d: chain(d, f"-o preallocation={m}"))(mode)
    CASES[f"prealloc-conv-{mode}"] = conv(f"-o preallocation={mode}")
    CASES[f"prealloc-conv-v2-{mode}"] = conv(f"-o preallocation={mode},compat=0.10,cluster_size=4k")

def outside(d):
    o = f"{d}-out"
    shutil.rmtree(o, ignore_errors=True); os.makedirs(o)
    sh("qemu-img create -q -f qcow2 base.qcow2 8M", o)
    sh(BASE.format(f="qcow2", img="base.qcow2"), o)
    sh(f"qemu-img create -q -f qcow2 -b {o}/base.qcow2 -F qcow2 top.qcow2", d)
    sh(TOP.format(img="top.qcow2"), d)
    return "top.qcow2"
CASES["abs-outside"] = outside

def symlink_out(d):
    o = f"{d}-out"
    shutil.rmtree(o, ignore_errors=True); os.makedirs(o)
    sh("qemu-img create -q -f qcow2 base.qcow2 8M", o)
    sh(BASE.format(f="qcow2", img="base.qcow2"), o)
    os.symlink(f"{o}/base.qcow2", f"{d}/base.qcow2")
    sh("qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2", d)
    sh(TOP.format(img="top.qcow2"), d)
    return "top.qcow2"
CASES["symlink-out"] = symlink_out

def dotdot(d):
    o = f"{d}-base"
    shutil.rmtree(o, ignore_errors=True); os.makedirs(o)
    sh("qemu-img create -q -f qcow2 base.qcow2 8M", o)
    sh(BASE.format(f="qcow2", img="base.qcow2"), o)
    sh(f"qemu-img create -q -f qcow2 -b ../{os.path.basename(o)}/base.qcow2 -F qcow2 top.qcow2", d)
    sh(TOP.format(img="top.qcow2"), d)
    return "top.qcow2"
CASES["dotdot"] = dotdot

def subdir(d):
    os.makedirs(f"{d}/b")
    sh("qemu-img create -q -f qcow2 b/base.qcow2 8M", d)
    sh(BASE.format(f="qcow2", img="b/base.qcow2"), d)
    sh("qemu-img create -q -f qcow2 -b b/base.qcow2 -F qcow2 top.qcow2", d)
    sh(TOP.format(img="top.qcow2"), d)
    return "top.qcow2"
CASES["subdir"] = subdir

def three(d):
    sh("qemu-img create -q -f raw base.raw 8M", d)
    sh(BASE.format(f="raw", img="base.raw"), d)
    sh("qemu-img create -q -f qcow2 -o cluster_size=512,compat=0.10 -b base.raw -F raw mid.qcow2", d)
    sh("qemu-io -c 'write -P 0x31 100k 3k' -c 'write -c -P 0x32 2M 64k' mid.qcow2", d)
    sh("qemu-img create -q -f qcow2 -o extended_l2=on,cluster_size=2M -b mid.qcow2 -F qcow2 top.qcow2 12M", d)
    sh(TOP.format(img="top.qcow2"), d)
    sh("qemu-io -c 'write -P 0x66 9M 5k' top.qcow2", d)
    return "top.qcow2"
CASES["three-mixed-grown"] = three


def fmt_raw_on_qcow2(d):
    sh("qemu-img create -q -f qcow2 base.qcow2 8M", d)
    sh(BASE.format(f="qcow2", img="base.qcow2"), d)
    sh("qemu-img create -q -f qcow2 -b base.qcow2 -F raw top.qcow2 8M", d)
    sh(TOP.format(img="top.qcow2"), d)
    return "top.qcow2"
CASES["fmt-raw-on-qcow2"] = fmt_raw_on_qcow2

def fmt_qcow2_on_raw(d):
    sh("qemu-img create -q -f raw base.raw 8M", d)
    sh(BASE.format(f="raw", img="base.raw"), d)
    sh("qemu-img create -q -f qcow2 -b base.raw -F raw top.qcow2", d)
    sh(TOP.format(img="top.qcow2"), d)
    sh("qemu-img rebase -u -b base.raw -F qcow2 top.qcow2", d)
    return "top.qcow2"
CASES["fmt-qcow2-on-raw"] = fmt_qcow2_on_raw

def symlink_chain_dir(d):
    # the whole chain reached through a symlinked directory
    o = f"{d}-real"
    shutil.rmtree(o, ignore_errors=True); os.makedirs(o)
    chain(o)
    os.symlink(o, f"{d}/vm")
    return "vm/top.qcow2"
CASES["symlinked-dir"] = symlink_chain_dir

def hardlink_layer(d):
    chain(d)
    os.rename(f"{d}/base.qcow2", f"{d}/b0.qcow2")
    os.link(f"{d}/b0.qcow2", f"{d}/base.qcow2")
    return "top.qcow2"
CASES["hardlink-layer"] = hardlink_layer

def self_backing(d):
    sh("qemu-img create -q -f qcow2 top.qcow2 8M", d)
    sh("qemu-img rebase -u -b top.qcow2 -F qcow2 top.qcow2", d)
    return "top.qcow2"
CASES["self-backing"] = self_backing

def backing_dir(d):
    os.makedirs(f"{d}/base.qcow2")
    sh("qemu-img create -q -f qcow2 -u -b base.qcow2 -F qcow2 top.qcow2 8M", d)
    return "top.qcow2"
CASES["backing-is-dir"] = backing_dir

def grown_top(d):
    chain(d)
    sh("qemu-img resize top.qcow2 13M", d)
    sh("qemu-io -c 'write -P 0x71 12M 4k' top.qcow2", d)
    return "top.qcow2"
CASES["grown-top"] = grown_top

def shrunk_top(d):
    sh("qemu-img create -q -f qcow2 base.qcow2 8M", d)
    sh(BASE.format(f="qcow2", img="base.qcow2"), d)
    sh("qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2 5M", d)
    sh("qemu-io -c 'write -P 0x72 100k 4k' top.qcow2", d)
    return "top.qcow2"
CASES["small-top"] = shrunk_top

def odd_raw(d):
    with open(f"{d}/disk.raw", "wb") as f:
        f.write(os.urandom(70001))
    return "disk.raw"
CASES["odd-raw"] = odd_raw

def boot_files():
    """A kernel and an initramfs that pass advm vm run's checks (the stand-in boots nothing)."""
    os.makedirs(R, exist_ok=True)
    k = bytearray(1024)
    k[0x202:0x206] = b"HdrS"
    open(f"{R}/vmlinuz", "wb").write(k)
    open(f"{R}/initrd.img", "wb").write(b"070701")


if __name__ == "__main__":
    boot_files()
    names = sys.argv[2:] or [c for c in CASES if c != "self-backing"]
    for name in names:
        try:
            res = run_case(name, CASES[name])
        except Exception as e:
            res = {"case": name, "build": str(e)[-300:]}
        print(json.dumps(res), flush=True)
