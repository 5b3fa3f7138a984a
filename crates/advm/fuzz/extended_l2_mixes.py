#!/usr/bin/env python3
"""Random extended-L2 images against qemu-img (long; not part of `make test`).

N times: a qcow2 with extended L2 entries (clusters of 16 KiB to 2 MiB, so
subclusters of 512 B to 64 KiB), alone or over a raw, extended-L2 or plain qcow2
backing file (sometimes half the overlay's size), scribbled with writes, zero writes
(`write -z`, with and without `-u`) and discards at 512-byte granularity, so that
clusters mix allocated, zero and unallocated subclusters. Each is read with
`advm image cat` (through the mapping) and compared with `qemu-img convert -O raw`.

    python3 crates/advm/fuzz/extended_l2_mixes.py target/debug/advm 600 1 /tmp/mixes

Image `i` is seeded `SEED + i`; a mismatch is kept in WORKDIR/mismatch-SEED.
"""
import os
import random
import shutil
import subprocess
import sys

ADVM, N, SEED, ROOT = os.path.abspath(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


def main():
    shutil.rmtree(ROOT, ignore_errors=True)
    work = f"{ROOT}/work"
    bad = 0
    for i in range(N):
        seed = SEED + i
        r = random.Random(seed)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)

        def sh(*args):
            p = subprocess.run(args, cwd=work, capture_output=True)
            if p.returncode:
                raise SystemExit(f"seed {seed}: {args}: {p.stderr.decode()}")

        def scribble(image, size, ops, fmt="qcow2"):
            cmds = []
            for _ in range(ops):
                off = r.randrange(size // 512) * 512
                n = min(r.randrange(1, 64) * 512, size - off)
                t = r.random()
                if t < 0.2:
                    cmds += ["-c", f"write -z {off} {n}"]
                elif t < 0.25:
                    cmds += ["-c", f"write -z -u {off} {n}"]
                elif t < 0.4:
                    cmds += ["-c", f"discard {off} {n}"]
                else:
                    cmds += ["-c", f"write -P {r.randrange(1, 256)} {off} {n}"]
            sh("qemu-io", "-f", fmt, *cmds, image)

        cs = r.choice([16 << 10, 32 << 10, 64 << 10, 128 << 10, 2 << 20])
        size = max(cs * r.choice([2, 4, 8]), 1 << 20) + r.choice([0, 0, 512 * r.randrange(1, 64)])
        ext = f"cluster_size={cs},extended_l2=on"
        create = ["qemu-img", "create", "-q", "-f", "qcow2", "-o", ext]
        backing = r.choice([None, "raw", "qcow2", "plain"])
        base_size = size if r.random() < 0.7 else size // 2 // 512 * 512
        if backing == "raw":
            sh("qemu-img", "create", "-q", "-f", "raw", "base", str(base_size))
            sh("qemu-io", "-f", "raw", "-c", f"write -P 0x5a 0 {base_size // 2}", "base")
            scribble("base", base_size, 6, "raw")
            create += ["-b", "base", "-F", "raw"]
        elif backing:
            opts = ext if backing == "qcow2" else f"cluster_size={r.choice([512, 4096, 65536])}"
            sh("qemu-img", "create", "-q", "-f", "qcow2", "-o", opts, "base", str(base_size))
            scribble("base", base_size, 20)
            create += ["-b", "base", "-F", "qcow2"]
        sh(*create, "top.qcow2", str(size))
        scribble("top.qcow2", size, r.randrange(5, 40))
        sh("qemu-img", "convert", "-O", "raw", "top.qcow2", "expect.raw")
        expect = open(f"{work}/expect.raw", "rb").read()
        got = subprocess.run([ADVM, "image", "cat", "top.qcow2"], cwd=work, capture_output=True)
        if got.returncode or got.stdout != expect:
            bad += 1
            at = next((j for j in range(min(len(expect), len(got.stdout))) if expect[j] != got.stdout[j]), None)
            print(f"MISMATCH seed {seed}: {cs}-byte clusters, {size} bytes, backing {backing}: "
                  f"exit {got.returncode} {got.stderr.decode().strip()} first difference at {at}", flush=True)
            shutil.copytree(work, f"{ROOT}/mismatch-{seed}")
    print(f"{N} images (seeds {SEED}-{SEED + N - 1}), {bad} mismatches")
    sys.exit(1 if bad else 0)


main()
