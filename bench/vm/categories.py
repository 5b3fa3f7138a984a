#!/usr/bin/env python3
"""What each running VM's guest RAM is made of, page by page (root only).

    python3 bench/vm/categories.py [--json] QEMU_PID...

For each QEMU process, guest RAM is the contiguous run of mappings (anonymous, or
advm's merge store memfds after `advm vm run --merge`) of at least 64 MiB that starts
at its largest anonymous or store mapping. Every page is read (/proc/PID/mem) and
looked up in /proc/PID/pagemap, and counted in one category:

- absent: not in memory (never touched, or handed back by free page reporting);
- zero page: the kernel's shared zero page (reads as zeros, costs nothing);
- store: a page of the merge store (shared with the store and other VMs);
- private zero: a page of its own holding only zeros (KSM merges these, with its
  zero-page setting or into one page of zeros);
- private dup, after merge: a page of its own in a store mapping (the guest wrote a
  merged page after the merge: copy-on-write), whose content another VM's private
  page or a store page also holds;
- private dup: the same in anonymous memory (not merged: written while merged, or
  written after the merge where nothing was merged);
- private unique, after merge / private unique: content no other page holds.

"KSM could still share" is, over all VMs, the private pages whose content another
page holds, less one copy per content that no store page already holds: what a
scanner that merged all equal pages (zero pages into one) would save beyond the merge.
"""

import collections
import hashlib
import json
import os
import re
import sys

PS = os.sysconf("SC_PAGE_SIZE")
ZERO = bytes(PS)
MIB = 1 << 20


def maps(pid):
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            start, end = (int(x, 16) for x in parts[0].split("-"))
            name = parts[5].strip() if len(parts) > 5 else ""
            anon = parts[3] == "00:00" and parts[4] == "0" and name == ""
            store = name.startswith("/memfd:advm-merge")
            out.append((start, end, parts[1], anon, store, name))
    return out


def guest_ram(pid):
    m = maps(pid)
    best = None
    for k, (s, e, perms, anon, store, _) in enumerate(m):
        if not (anon or store) or perms[0:2] != "rw":
            continue
        j, end = k, e
        while j + 1 < len(m) and m[j + 1][0] == end and (m[j + 1][3] or m[j + 1][4]) and m[j + 1][2][:2] == "rw":
            j += 1
            end = m[j][1]
        if end - s >= 64 * MIB and (best is None or end - s > best[1] - best[0]):
            best = (s, end, [(x[0], x[1], x[4]) for x in m[k : j + 1]])
    return best


def zero_pfn():
    import mmap

    m = mmap.mmap(-1, PS, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    _ = m[0]
    addr = ctypes_addr(m)
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // PS * 8)
        e = int.from_bytes(f.read(8), "little")
    return e & ((1 << 55) - 1) if e >> 63 else None


def ctypes_addr(m):
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def scan(pid, zpfn):
    s, e, vmas = guest_ram(pid)
    n = (e - s) // PS
    with open(f"/proc/{pid}/pagemap", "rb") as f:
        f.seek(s // PS * 8)
        pm = f.read(n * 8)
    in_store_vma = bytearray(n)
    for a, b, store in vmas:
        if store:
            for i in range((a - s) // PS, (b - s) // PS):
                in_store_vma[i] = 1
    pages = []  # (index, kind, digest)
    ents = [int.from_bytes(pm[i * 8 : i * 8 + 8], "little") for i in range(n)]
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        i = 0
        while i < n:
            ent = ents[i]
            present = ent >> 63 & 1
            pfn = ent & ((1 << 55) - 1)
            if not present:
                pages.append((i, "absent", None))
                i += 1
                continue
            if zpfn is not None and pfn == zpfn:
                pages.append((i, "zero page", None))
                i += 1
                continue
            # A run of present pages, read at once (absent pages are never read: that
            # would fault them in).
            j = i
            while j < n and ents[j] >> 63 & 1 and not (zpfn is not None and ents[j] & ((1 << 55) - 1) == zpfn):
                j += 1
            mem.seek(s + i * PS)
            data = mem.read((j - i) * PS)
            for k in range(i, j):
                page = data[(k - i) * PS : (k - i + 1) * PS]
                if ents[k] >> 61 & 1:
                    pages.append((k, "store", hashlib.blake2b(page, digest_size=16).digest()))
                elif page == ZERO:
                    pages.append((k, "private zero", None))
                else:
                    kind = "private, after merge" if in_store_vma[k] else "private"
                    pages.append((k, kind, hashlib.blake2b(page, digest_size=16).digest()))
            i = j
    return {"start": s, "pages": n, "mappings": len(vmas), "list": pages}


def main():
    args = [a for a in sys.argv[1:] if a != "--json"]
    zpfn = zero_pfn()
    vms = {int(p): scan(int(p), zpfn) for p in args}
    count = collections.Counter()  # content -> private copies
    stored = set()
    for v in vms.values():
        for _, kind, d in v["list"]:
            if kind == "store":
                stored.add(d)
            elif kind.startswith("private,") or kind == "private":
                count[d] += 1
    report = {"zero_pfn_known": zpfn is not None, "vms": {}}
    ksm_more = 0
    seen = set()
    zero_private = 0
    for pid, v in vms.items():
        c = collections.Counter()
        for _, kind, d in v["list"]:
            if kind in ("private", "private, after merge"):
                dup = count[d] > 1 or d in stored
                suffix = kind[len("private") :]
                kind = ("private dup" if dup else "private unique") + suffix
                if dup:
                    if d in stored or d in seen:
                        ksm_more += 1
                    else:
                        seen.add(d)
            if kind == "private zero":
                zero_private += 1
            c[kind] += 1
        report["vms"][pid] = {
            "guest_ram_mib": v["pages"] * PS / MIB,
            "mappings": v["mappings"],
            "mib": {k: round(x * PS / MIB, 2) for k, x in sorted(c.items())},
        }
    # All private zero pages but one would go too under KSM.
    report["ksm_could_still_share_mib"] = round((ksm_more + max(zero_private - 1, 0)) * PS / MIB, 2)
    report["of_which_zero_mib"] = round(max(zero_private - 1, 0) * PS / MIB, 2)
    if "--json" in sys.argv:
        print(json.dumps(report, indent=1))
        return
    kinds = sorted({k for v in report["vms"].values() for k in v["mib"]})
    print("pid      maps  " + "  ".join(f"{k:>28}" for k in kinds))
    for pid, v in report["vms"].items():
        print(f"{pid:<8} {v['mappings']:>5}  " + "  ".join(f"{v['mib'].get(k, 0):>28.2f}" for k in kinds))
    print(
        f"KSM could still share {report['ksm_could_still_share_mib']} MiB over these VMs "
        f"({report['of_which_zero_mib']} MiB of it private zero pages)"
    )


if __name__ == "__main__":
    main()
