#!/usr/bin/env python3
"""Mutation campaign against qemu-img (long; not part of `make test`).

Builds qcow2 chains with qemu-img/qemu-io (clusters of 512 B, 4 KiB, 64 KiB and
2 MiB, extended L2 on and off, deflate and zstd compressed clusters, with and without
a qcow2 backing file), then N times: mutates 1-4 bytes (mostly in the header, the L1
table and the L2 tables) of the top or the backing file, and reads the disk with
`advm image cat` (through the mapping) and with `qemu-img convert -O raw`.

A defect is: advm panicking or exiting other than 0/1, advm running over 5 s, or both
reading the disk and the bytes differing. It also counts images advm refuses though
qemu-img reads them and `qemu-img check` finds no corruption, and images advm reads
though qemu-img refuses them (with qemu's reason).

    python3 crates/advm/fuzz/qemu_mutants.py target/debug/advm 5000 1 /tmp/mutants

Each mutant is seeded (`SEED + i`), so a defect reproduces; its files are kept in
WORKDIR/defect-SEED. WORKDIR is removed first and left behind for inspection.
"""
import collections
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time

ADVM, N, SEED, ROOT = os.path.abspath(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
READ_LIMIT = 64 << 20  # bytes compared per mutant (a mutated size can be huge)


def sh(cwd, *args, timeout=60):
    return subprocess.run(args, cwd=cwd, capture_output=True, timeout=timeout)


def must(cwd, *args):
    r = sh(cwd, *args)
    if r.returncode:
        raise SystemExit(f"setup failed: {args}: {r.stderr.decode()}")


def originals():
    """(name, {file: bytes}) for every configuration."""
    out = []
    r = random.Random(7)
    for cs in [512, 4096, 65536, 2 << 20]:
        for ext in [False, True] if cs >= 16384 else [False]:
            for comp in ["zlib", "zstd"]:
                for backing in [False, True]:
                    name = f"o-{cs}-ext{int(ext)}-{comp}-backing{int(backing)}"
                    d = f"{ROOT}/{name}"
                    os.makedirs(d)
                    size = max(cs * 8, 1 << 20)
                    opts = f"cluster_size={cs},compression_type={comp}" + (",extended_l2=on" if ext else "")
                    create = ["qemu-img", "create", "-q", "-f", "qcow2", "-o", opts]
                    if backing:
                        base_opts = f"cluster_size={r.choice([4096, 65536])}"
                        must(d, "qemu-img", "create", "-q", "-f", "qcow2", "-o", base_opts, "base.qcow2", str(size))
                        must(d, "qemu-io", "-c", f"write -P 0x5a 0 {size // 2}",
                             "-c", f"write -c -P 0x5b {size // 2} 64k", "base.qcow2")
                        create += ["-b", "base.qcow2", "-F", "qcow2"]
                    must(d, *create, "top.qcow2", str(size))
                    cmds = []
                    # qemu compresses only into unallocated clusters: distinct ones, first.
                    for c in r.sample(range(size // cs), 3):
                        cmds += ["-c", f"write -c -P {r.randrange(1, 255)} {c * cs} {cs}"]
                    for _ in range(8):
                        off = r.randrange(size // 512) * 512
                        n = min(r.randrange(1, 64) * 512, size - off)
                        t = r.random()
                        op = "write -z" if t < 0.2 else "discard" if t < 0.3 else f"write -P {r.randrange(1, 255)}"
                        cmds += ["-c", f"{op} {off} {n}"]
                    must(d, "qemu-io", *cmds, "top.qcow2")
                    out.append((name, {f: open(f"{d}/{f}", "rb").read() for f in os.listdir(d)}))
    return out


def regions(b):
    """Byte ranges worth mutating: the header with its extensions, L1, L2 tables."""
    out = [(0, min(len(b), 512))]
    try:
        bits, l1_n, l1_at = struct.unpack(">I", b[20:24])[0], struct.unpack(">I", b[36:40])[0], struct.unpack(">Q", b[40:48])[0]
        if l1_n and l1_at + 8 * l1_n <= len(b):
            out.append((l1_at, l1_at + 8 * l1_n))
            for i in range(min(l1_n, 64)):
                l2 = struct.unpack(">Q", b[l1_at + 8 * i:l1_at + 8 * i + 8])[0] & 0x00FFFFFFFFFFFE00
                if l2 and l2 + (1 << bits) <= len(b):
                    out.append((l2, l2 + min(1 << bits, 4096)))
    except (struct.error, OverflowError):
        pass
    return out


def mutate(r, b):
    b = bytearray(b)
    spots = regions(bytes(b))
    for _ in range(1 + r.randrange(4)):
        lo, hi = r.choice(spots) if r.random() < 0.85 else (0, len(b))
        at = r.randrange(lo, hi)
        k = r.random()
        if k < 0.4:
            b[at] = r.randrange(256)
        elif k < 0.7:
            b[at] ^= 1 << r.randrange(8)
        elif k < 0.8:
            b[at] = r.choice([0, 0xFF])
        else:  # an 8-byte entry copied from elsewhere in the file
            src, at8 = r.randrange(max(1, len(b) - 8)), at & ~7
            b[at8:at8 + 8] = b[src:src + 8]
    return bytes(b)


def check_clean(cwd):
    """`qemu-img check` finds no corruption in any layer (leaks are not corruption)."""
    try:
        return all(sh(cwd, "qemu-img", "check", f, timeout=30).returncode in (0, 3)
                   for f in ("top.qcow2", "base.qcow2") if os.path.exists(f"{cwd}/{f}"))
    except subprocess.TimeoutExpired:
        return False


def main():
    shutil.rmtree(ROOT, ignore_errors=True)
    os.makedirs(ROOT)
    origs = originals()
    counts, advm_only_refused, qemu_refused = collections.Counter(), collections.Counter(), collections.Counter()
    defects, first_seed = [], {}
    w = f"{ROOT}/work"
    start = time.time()
    for i in range(N):
        seed = SEED + i
        r = random.Random(seed)
        name, files = r.choice(origs)
        shutil.rmtree(w, ignore_errors=True)
        os.makedirs(w)
        target = "base.qcow2" if "base.qcow2" in files and r.random() < 0.2 else "top.qcow2"
        for f, b in files.items():
            open(f"{w}/{f}", "wb").write(mutate(r, b) if f == target else b)

        def defect(why):
            defects.append((seed, name, target, why))
            shutil.copytree(w, f"{ROOT}/defect-{seed}")

        # qemu's reading
        q_err, q_size, q_read = "", None, False
        info = sh(w, "qemu-img", "info", "--output=json", "top.qcow2", timeout=30)
        if info.returncode == 0:
            q_size = json.loads(info.stdout)["virtual-size"]
            try:
                conv = sh(w, "qemu-img", "convert", "-O", "raw", "top.qcow2", "expect.raw", timeout=60)
                q_read = conv.returncode == 0 and not conv.stderr.strip()
                q_err = conv.stderr.decode(errors="replace")
            except subprocess.TimeoutExpired:
                q_err = "qemu-img convert ran over 60 s"
        else:
            q_err = info.stderr.decode(errors="replace")
        # ours
        args = [ADVM, "image", "cat", "top.qcow2"]
        if q_size is not None:
            args += ["--length", str(min(q_size, READ_LIMIT))]
        try:
            ours = sh(w, *args, timeout=5)
        except subprocess.TimeoutExpired:
            counts["hang"] += 1
            defect("advm ran over 5 s")
            continue
        err = ours.stderr.decode(errors="replace")
        if ours.returncode not in (0, 1) or "panicked" in err:
            counts["panic"] += 1
            defect(f"exit {ours.returncode}: {err[:300]}")
            continue
        if ours.returncode == 0 and q_read:
            expect = open(f"{w}/expect.raw", "rb").read(READ_LIMIT)
            if ours.stdout != expect:
                at = next((j for j in range(min(len(expect), len(ours.stdout))) if expect[j] != ours.stdout[j]), None)
                counts["differ"] += 1
                defect(f"differs at byte {at} ({len(ours.stdout)} vs {len(expect)} bytes)")
            else:
                counts["both read, equal"] += 1
        elif ours.returncode == 0:
            counts["advm read, qemu refused"] += 1
            key = (q_err.strip().splitlines() or ["?"])[0][:110]
            qemu_refused[key] += 1
            first_seed.setdefault(key, seed)
        elif q_read and check_clean(w):
            counts["advm refused, qemu read and check clean"] += 1
            key = err.strip().split(": ", 1)[-1][:110]
            advm_only_refused[key] += 1
            first_seed.setdefault(key, seed)
        elif q_read:
            counts["advm refused, qemu read, check finds corruption"] += 1
        else:
            counts["both refused"] += 1
        if (i + 1) % 500 == 0:
            print(f"{i + 1} mutants, {time.time() - start:.0f} s: {dict(counts)}", flush=True)
    print(f"{N} mutants (seeds {SEED}-{SEED + N - 1}) in {time.time() - start:.0f} s: {dict(counts)}")
    print("advm refused, qemu-img read and check found nothing (count, first seed, advm's reason):")
    for k, v in advm_only_refused.most_common(40):
        print(f"  {v:5} {first_seed[k]:7} {k}")
    print("advm read, qemu-img refused (count, first seed, qemu's reason):")
    for k, v in qemu_refused.most_common(40):
        print(f"  {v:5} {first_seed[k]:7} {k}")
    print(f"defects: {len(defects)}")
    for d in defects:
        print("  ", d)
    sys.exit(1 if defects else 0)


main()
