#!/usr/bin/env python3
"""The wide sweep over what qemu-img and qemu-io make (long; not part of `make test`;
the fast one is crates/advm/tests/image_variants.rs).

N times: a random chain of 1 to 3 layers (a raw base sometimes), each qcow2 layer with
random creation options (cluster size 512 B to 2 MiB, compat 0.10 or 1.1, refcount
width, lazy refcounts, extended L2, zlib or zstd, preallocation, sometimes an external
data file, raw when nothing is below), a random virtual size (often not a multiple of the cluster or the page,
overlays larger or smaller than their backing file), random operations (writes, zero
writes with and without -u, discards, compressed writes, internal snapshots made and
reverted to, persistent bitmaps, a writer killed with lazy refcounts, resize, amend to
v2, commit, rebase, convert -c), backing names relative or absolute, backing formats
sometimes missing. Each chain is read with `advm image cat` (through the mapping) and
with `qemu-img convert -O raw`, and `advm image map` is compared with `qemu-img map`.

    python3 bench/image/sweep.py target/debug/advm 300 1 /tmp/qimg-sweep

A defect is: differing bytes, a map that disagrees with qemu-img map, a panic, a read over 20 s, or a refusal advm does not
mean to make (none is made here: encrypted data is not built, and probing raw without
--allow-probed-raw is avoided). Image `i` is seeded `SEED + i`; a defect's
chain is kept in WORKDIR/defect-SEED.
"""
import bisect
import collections
import json
import os
import random
import shutil
import subprocess
import sys
import time

ADVM, N, SEED, ROOT = os.path.abspath(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
K, M = 1024, 1024 * 1024
# What the chains had, counted for the summary (words of their options and commands).
FEATURES = ["cluster_size=512,", "cluster_size=2097152", "compat=0.10", "refcount_bits=1,", "refcount_bits=64",
            "lazy_refcounts", "extended_l2=on", "compression_type=zstd", "write -c", "write -z -u", "discard",
            "preallocation", "data_file", "data_file_raw", "snapshot -c", "snapshot -a", "bitmap", "abort", "resize", "amend",
            "commit", "convert -c", "no backing format", "raw", "-b /"]
# Refusals advm makes on purpose, by the words of its message (none of the chains built
# here: external data files, refused until 2026-11-29, are mapped).
MEANT = []


class Skip(Exception):
    """qemu refused to build this combination: not a case."""


def one(seed, work):
    r = random.Random(seed)
    log = []

    def sh(*args, ok_fail=False):
        log.append(" ".join(args))
        p = subprocess.run(args, cwd=work, capture_output=True)
        if p.returncode and not ok_fail:
            raise Skip(f"{args}: {p.stderr.decode().strip()[:200]}")
        return p.returncode == 0

    def qcow2_opts(below_fmt):
        compat = r.choice(["0.10", "1.1", "1.1", "1.1"])
        cs = r.choice([512, 1 * K, 2 * K, 4 * K, 4 * K, 16 * K, 64 * K, 64 * K, 128 * K, 2 * M])
        o = [f"cluster_size={cs}", f"compat={compat}"]
        ext = False
        if compat == "1.1":
            o.append(f"refcount_bits={r.choice([1, 2, 4, 8, 16, 16, 32, 64])}")
            if r.random() < 0.2:
                o.append("lazy_refcounts=on")
            if cs >= 16 * K and r.random() < 0.4:
                o.append("extended_l2=on")
                ext = True
            if r.random() < 0.4:
                o.append(f"compression_type={r.choice(['zlib', 'zstd'])}")
            if r.random() < 0.06:
                o.append(f"data_file=data-{r.randrange(1000)}")
                # (a raw data file cannot have a backing file below it)
                if r.random() < 0.5 and below_fmt is None:
                    o.append("data_file_raw=on")
        # (qemu preallocates under a backing file only with extended L2)
        if r.random() < 0.15 and (below_fmt is None or ext):
            o.append(f"preallocation={r.choice(['metadata', 'falloc', 'full'])}")
        return cs, ",".join(o), ext

    def scribble(image, size, cs, fmt, ops):
        cmds = []
        for _ in range(ops):
            t = r.random()
            if fmt == "qcow2" and t < 0.12:
                # compressed: whole clusters into unallocated ones, or the last partial one
                c = r.randrange(max(1, size // cs))
                n = min(cs, size - c * cs)
                sh("qemu-io", "-f", fmt, "-c", f"write -c -P {r.randrange(1, 256)} {c * cs} {n}", image, ok_fail=True)
                continue
            grain = r.choice([512, 512, 4 * K, cs])
            off = r.randrange(size // grain) * grain if size >= grain else 0
            n = min(r.randrange(1, 16) * grain, size - off)
            if n <= 0:
                continue
            if t < 0.3:
                cmds += ["-c", f"write -z {off} {n}"]
            elif t < 0.4:
                cmds += ["-c", f"write -z -u {off} {n}"]
            elif t < 0.55:
                cmds += ["-c", f"discard {off} {n}"]
            else:
                cmds += ["-c", f"write -P {r.randrange(1, 256)} {off} {n}"]
        if cmds:
            sh("qemu-io", "-f", fmt, *cmds, image)

    depth = r.choice([1, 1, 2, 2, 3])
    below = None  # (name, fmt, size)
    kinds = []
    for i in range(depth):
        size = r.choice([1 * M, 2 * M, 3 * M, 4 * M]) + r.choice([0, 0, 512 * r.randrange(1, 128), 64 * K])
        if below and r.random() < 0.3:
            size = below[2]
        if i == 0 and (depth > 1 and r.random() < 0.3 or r.random() < 0.05):
            name, fmt = f"l{i}.raw", "raw"
            if r.random() < 0.5:
                size += r.randrange(1, 512)  # an odd-sized raw file
            sh("truncate", "-s", str(size), name)
            scribble(name, size // 512 * 512, 4 * K, "raw", 6)
            kinds.append(f"raw {size}")
            below = (name, fmt, size)
            continue
        name, fmt = f"l{i}.qcow2", "qcow2"
        cs, opts, ext = qcow2_opts(below[1] if below else None)
        args = ["qemu-img", "create", "-q", "-f", "qcow2", "-o", opts]
        strip = False
        if below:
            bname = below[0] if r.random() < 0.7 else os.path.join(work, below[0])
            args += ["-b", bname, "-F", below[1]]
            strip = below[1] == "qcow2" and r.random() < 0.2
        sh(*args, name, str(size))
        kinds.append(f"qcow2 {size} {opts}{' (no backing format)' if strip else ''}")
        scribble(name, size, cs, "qcow2", r.randrange(4, 30))
        t = r.random()
        if t < 0.15 and sh("qemu-img", "snapshot", "-c", "s1", name, ok_fail=True):
            scribble(name, size, cs, "qcow2", r.randrange(2, 10))
            if r.random() < 0.3:
                sh("qemu-img", "snapshot", "-a", "s1", name)
                log.append("reverted")
        elif t < 0.25 and "compat=1.1" in opts:
            sh("qemu-img", "bitmap", "--add", name, "b0")
            scribble(name, size, cs, "qcow2", 3)
        elif t < 0.3 and "lazy_refcounts" in opts:
            sh("qemu-io", "-c", f"write -P 0x99 0 {min(size, 64 * K)}", "-c", "abort", name, ok_fail=True)
        elif t < 0.35:
            new = size + r.choice([-512 * r.randrange(1, 64), 512 * r.randrange(1, 4096)])
            shrink = ["--shrink"] if new < size else []
            if sh("qemu-img", "resize", "-q", *shrink, name, str(new), ok_fail=True):
                size = new
                kinds[-1] += f" resized {new}"
        elif t < 0.4 and "compat=1.1" in opts and "data_file" not in opts and "extended_l2" not in opts:
            if sh("qemu-img", "amend", "-o", "compat=0.10", name, ok_fail=True):
                kinds[-1] += " amended to 0.10"
        if strip:
            strip_backing_format(os.path.join(work, name))
        below = (name, fmt, size)
    top = below[0]
    t = r.random()
    if t < 0.1 and depth > 1 and top.endswith(".qcow2") and "(no backing format)" not in kinds[-1]:
        # commit the top into the layer below and read the layer below
        if sh("qemu-img", "commit", "-q", top, ok_fail=True):
            top = f"l{depth - 2}.qcow2" if os.path.exists(os.path.join(work, f"l{depth - 2}.qcow2")) else top
            kinds.append(f"committed into {top}")
    elif t < 0.2:
        cs = r.choice([512, 4 * K, 64 * K, 2 * M])
        ct = r.choice(["zlib", "zstd"])
        if sh("qemu-img", "convert", "-c", "-O", "qcow2", "-o", f"cluster_size={cs},compression_type={ct}", top,
              "c.qcow2", ok_fail=True):
            top = "c.qcow2"
            kinds.append(f"convert -c {cs} {ct}")
    return top, kinds, log


def strip_backing_format(path):
    """Makes the backing-format extension one nobody knows (qemu then probes)."""
    with open(path, "r+b") as f:
        b = f.read(65536)
        version = int.from_bytes(b[4:8], "big")
        at = int.from_bytes(b[100:104], "big") if version == 3 else 72
        while at + 8 <= len(b):
            ty, n = int.from_bytes(b[at:at + 4], "big"), int.from_bytes(b[at + 4:at + 8], "big")
            if ty == 0:
                return
            if ty == 0xE2792ACA:
                f.seek(at)
                f.write((0x0BAD0BAD).to_bytes(4, "big"))
                return
            at += 8 + (n + 7) // 8 * 8


def map_differences(work, top):
    """Where `advm image map` disagrees with `qemu-img map` (depth; data, zero or
    compressed; host offset), range by range, as crates/advm/tests/image.rs checks it:
    qemu may call a hole of a layer file zero where advm maps it as data, and puts the
    zeros after an odd-sized raw base up to the next sector in the base itself."""
    q = json.loads(subprocess.run(["qemu-img", "map", "-U", "--output=json", top], cwd=work, capture_output=True,
                                  check=True).stdout)
    a = json.loads(subprocess.run([ADVM, "image", "map", "--json", "--allow-probed-raw", top], cwd=work,
                                  capture_output=True, check=True).stdout)["extents"]
    starts = [e["start"] for e in a]
    # data read from an external data file (the layers' are named data-N)
    from_data_file = any(x["kind"] == "data" and os.path.basename(x["file"]).startswith("data-") for x in a)
    out = []
    for e in q:
        g = e["start"]
        while g < e["start"] + e["length"] and len(out) < 4:
            x = a[bisect.bisect_right(starts, g) - 1]
            end = min(e["start"] + e["length"], x["start"] + x["length"])
            qoff = None if e.get("offset") is None else e["offset"] + (g - e["start"])
            if x["kind"] == "data":
                ok = (e["data"] or e["zero"]) and qoff == x["offset"] + (g - x["start"]) and x["depth"] == e["depth"]
            elif x["kind"] == "compressed":
                ok = e["data"] and qoff is None and x["depth"] == e["depth"]
            else:
                ok = e["zero"] and not e["data"] and (x["depth"] == e["depth"] or end - g < 512)
            if not ok:
                out.append(f"guest {g:#x}+{end - g}: advm {x}, qemu {e}")
            g = end
    return out, from_data_file


def main():
    shutil.rmtree(ROOT, ignore_errors=True)
    work = f"{ROOT}/work"
    counts = collections.Counter()
    defects = 0
    why = collections.Counter()
    seen = collections.Counter()
    start = time.time()
    for i in range(N):
        seed = SEED + i
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        try:
            top, kinds, log = one(seed, work)
            made = " ".join(kinds + log)
            for f in FEATURES:
                seen[f] += f in made
        except Skip as e:
            counts["qemu would not build it"] += 1
            why[str(e)[:160]] += 1
            continue
        q = subprocess.run(["qemu-img", "convert", "-U", "-O", "raw", top, "expect.raw"], cwd=work,
                           capture_output=True)
        try:
            a = subprocess.run([ADVM, "image", "cat", "--allow-probed-raw", top], cwd=work, capture_output=True,
                               timeout=20)
            rc, out, err = a.returncode, a.stdout, a.stderr.decode().strip()
        except subprocess.TimeoutExpired:
            rc, out, err = "timeout", b"", "over 20 s"
        defect = None
        if q.returncode:
            counts["both refused" if rc else "advm read, qemu refused"] += 1
        elif rc == 0:
            expect = open(f"{work}/expect.raw", "rb").read()
            if out == expect:
                counts["equal"] += 1
                differ, from_data_file = map_differences(work, top)
                counts["equal, with data read from an external data file"] += from_data_file
                if differ:
                    defect = "bytes equal, but the map differs from qemu-img map: " + "; ".join(differ)
            else:
                at = next((j for j in range(min(len(expect), len(out))) if expect[j] != out[j]), None)
                defect = f"bytes differ (first at {at}; sizes {len(out)} vs {len(expect)})"
        elif rc == "timeout" or (isinstance(rc, int) and rc > 1) or "panicked" in err:
            defect = f"exit {rc}: {err[-300:]}"
        elif any(w in err for w in MEANT):
            counts["refused on purpose: " + next(w for w in MEANT if w in err)] += 1
        else:
            defect = f"refused: {err[-300:]}"
        if defect:
            defects += 1
            print(f"DEFECT seed {seed}: {defect}\n  chain: {kinds}\n  made by: {log}", flush=True)
            shutil.copytree(work, f"{ROOT}/defect-{seed}")
    print(f"{N} chains (seeds {SEED}-{SEED + N - 1}) in {time.time() - start:.0f} s: {dict(counts)}")
    print("chains with: " + ", ".join(f"{f} {seen[f]}" for f in FEATURES))
    for w, n in why.most_common(5):
        print(f"  not built ({n}): {w}")
    print(f"defects: {defects}")
    sys.exit(1 if defects else 0)


if __name__ == "__main__":
    main()
