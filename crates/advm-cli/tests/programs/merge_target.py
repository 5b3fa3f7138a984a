"""A program that knows nothing of advm, for `advm run --mode merge` tests.

It holds the same 32 MiB twice (`a` and `b`, as if it loaded one file twice; each
made of one random MiB repeated), threads write `a` throughout (every write also goes
to a shadow copy), and it checks through /proc/self/pagemap that `b`'s pages came to
share frames. Then it forks: the child sees the same bytes and its writes stay its own.

argv[1]: "ask" (wait for "check" on stdin, after `advm merge PID`) or "auto" (poll
until the quiet-period merge happened, at most 30 s). Prints "ok ..." and exits 0.
"""
import ctypes, os, random, struct, sys, threading, time

MIB = 1 << 20
PS = os.sysconf("SC_PAGE_SIZE")
seed = os.urandom(MIB)
a = bytearray(seed * 32)
b = bytearray(a)
shadow = bytearray(a)
stop = threading.Event()
writes = [0]


def writer(k, n):
    rnd = random.Random(k)
    lo, hi = k * len(a) // n, (k + 1) * len(a) // n
    while not stop.is_set():
        i = rnd.randrange(lo, hi)
        v = rnd.randrange(256)
        a[i] = v
        shadow[i] = v
        writes[0] += 1
        if writes[0] % 64 == 0:
            time.sleep(0)


def frames(buf):
    """Distinct physical frames under buf's whole pages (after reading each page)."""
    addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    first = (addr + PS - 1) // PS
    last = (addr + len(buf)) // PS
    _ = bytes(buf[::PS])  # map every page
    out = set()
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        data = f.read((last - first) * 8)
    for (e,) in struct.iter_unpack("<Q", data):
        if e >> 63 & 1:
            out.add(e & ((1 << 55) - 1))
    return out


threads = [threading.Thread(target=writer, args=(k, 4), daemon=True) for k in range(4)]
for t in threads:
    t.start()
print("ready", flush=True)
pages_b = len(b) // PS
if sys.argv[1] == "ask":
    assert sys.stdin.readline().strip() == "check"
    shared = len(frames(b))
else:
    deadline = time.time() + 30
    while (shared := len(frames(b))) > MIB // PS + 16 and time.time() < deadline:
        time.sleep(0.2)
time.sleep(0.2)  # writers keep writing after the merge too
stop.set()
for t in threads:
    t.join()
assert a == shadow, "a write was lost"
assert b == seed * 32, "b changed"
# b repeats every MiB: merged, it maps at most one MiB of distinct frames
assert shared <= MIB // PS + 16, f"b's {pages_b} pages map {shared} distinct frames: not merged"
snap = bytes(a)
pid = os.fork()
if pid == 0:
    ok = bytes(a) == snap and b == seed * 32
    a[0:PS] = b"\x01" * PS
    b[5 * PS : 6 * PS] = b"\x02" * PS
    os._exit(0 if ok and a[0] == 1 and b[5 * PS] == 2 else 3)
_, status = os.waitpid(pid, 0)
assert status == 0, f"child saw different bytes ({status})"
assert bytes(a) == snap and b == seed * 32, "the child's writes reached the parent"
print(f"ok writes={writes[0]} frames_b={shared}", flush=True)
