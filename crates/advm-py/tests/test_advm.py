"""The advm Python package: merge, stat and vcopy."""

import mmap
import os
import pathlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import advm

PAGE = mmap.PAGESIZE


@pytest.fixture(autouse=True)
def no_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    # The process's own store: these tests must not depend on a running advmd.
    monkeypatch.setenv("ADVM_SOCKET", "/nonexistent/advmd.sock")


def page_aligned(n_pages: int, seed: int) -> np.ndarray:
    """A fresh page-aligned array of random bytes in its own anonymous mapping."""
    m = mmap.mmap(-1, n_pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    a = np.frombuffer(m, dtype=np.uint8)
    a[:] = np.random.default_rng(seed).integers(0, 256, a.size, dtype=np.uint8)
    return a


def test_merging_two_equal_arrays_shares_pages_and_keeps_content() -> None:
    a, b = page_aligned(64, 1), page_aligned(64, 1)
    before = b.copy()
    sa = advm.merge(a)
    sb = advm.merge(b)
    assert (sa["added"], sb["merged"], sb["added"]) == (64, 64, 0)
    assert sb["via"] == "local" and "not reachable" in sb["via_detail"]
    assert np.array_equal(b, before) and np.array_equal(a, before)
    assert sb["seconds"] > 0 and sb["bytes"] == 64 * PAGE


def test_writes_after_a_merge_stay_private() -> None:
    a, b = page_aligned(8, 2), page_aligned(8, 2)
    advm.merge(a)
    advm.merge(b)
    b[3 * PAGE] ^= 0xFF
    assert a[3 * PAGE] != b[3 * PAGE]
    c = page_aligned(8, 2)
    assert advm.merge(c)["merged"] == 8, "the store still holds the original pages"


def test_float_arrays_bytes_and_memoryviews_are_buffers_too() -> None:
    f = page_aligned(16, 3).view(np.float32)
    g = page_aligned(16, 3).view(np.float32)
    advm.merge(f)
    s = advm.merge(g)
    assert s["merged"] == 16 and np.array_equal(f, g, equal_nan=True)
    data = bytes(range(256)) * (4 * PAGE // 256 + 1)
    s = advm.merge(memoryview(data))
    assert s["bytes"] == len(data)


class _Interface:
    """An array exporter without the buffer protocol (what a GPU-less tensor library
    may be): only ``__array_interface__``, or only ``__array__``."""

    def __init__(self, a: np.ndarray, interface: bool) -> None:
        self.a = a
        if interface:
            self.__array_interface__ = a.__array_interface__
        else:
            self.__array__ = lambda dtype=None, copy=None: a.copy()


def test_objects_exporting_an_array_interface_merge_and_others_name_the_fix() -> None:
    # Both said "a bytes-like object is required, not '_Interface'", and None that.
    a, b = page_aligned(8, 5), page_aligned(8, 5)
    advm.merge(a)
    assert advm.merge(_Interface(b, True))["merged"] == 8, "merged in place, no copy"
    with pytest.raises(TypeError, match=r"not _Interface .*may be a copy.*t\.numpy\(\).*np\.asarray\(x\)"):
        advm.merge(_Interface(b, False))
    with pytest.raises(TypeError, match=r"^merge needs a buffer .*not NoneType None\.$"):
        advm.merge(None)


def test_vcopy_of_what_is_no_array_says_what_it_was_given() -> None:
    # vcopy(None) said "cannot copy an array of Python objects (dtype object)".
    with pytest.raises(TypeError, match=r"it was given NoneType None, of which numpy\.asarray makes"):
        advm.vcopy(None)  # type: ignore[arg-type]
    c: np.ndarray = advm.vcopy(_Interface(page_aligned(2, 6), True))  # type: ignore[arg-type]
    assert np.array_equal(c, page_aligned(2, 6))


STRIDED: dict[str, Callable[[np.ndarray], Any]] = {
    "every third byte": lambda a: a[::3],
    "reversed": lambda a: a[::-1],
    "columns": lambda a: a.reshape(32, PAGE)[:, 10:300],
    "rows and columns reversed": lambda a: a.reshape(32, PAGE)[::-1, ::-2],
    "float64 transposed, reversed": lambda a: a.view(np.float64).reshape(64, 256).T[::-1],
    "memoryview step": lambda a: a.data[::2],
    "broadcast": lambda a: np.broadcast_to(a[PAGE : 3 * PAGE], (5, 2 * PAGE)),
}


@pytest.mark.parametrize("name", list(STRIDED))
def test_a_strided_view_merges_the_memory_it_spans(name: str) -> None:
    # A strided view raised ValueError ("ndarray is not contiguous"; memoryview's
    # BufferError): a model's weights sliced or transposed could not be merged.
    view = STRIDED[name]
    a, b = page_aligned(32, 40), page_aligned(32, 40)
    before = a.copy()
    sa = advm.merge(view(a))
    sb = advm.merge(view(b))
    assert sb["merged"] >= 1 and sb["added"] == 0, (sa, sb)
    assert sa["merged"] + sa["added"] == sb["merged"], "both spans cover the same pages"
    assert np.array_equal(a, before) and np.array_equal(b, before)
    b[PAGE + 5] ^= 0xFF  # a write after the merge stays the writer's
    assert a[PAGE + 5] == before[PAGE + 5]


def exporters(n: int) -> dict[str, Any]:
    import array

    raw = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m[:] = raw
    return {
        "bytes": raw,
        "bytearray": bytearray(raw),
        "array.array": array.array("B", raw),
        "mmap.mmap": m,
        "memoryview of bytes": memoryview(raw)[3:],
        "numpy": np.frombuffer(raw, dtype=np.uint8),
    }


@pytest.mark.parametrize("name", list(exporters(1)))
def test_every_kind_of_buffer_merges_all_its_whole_pages(name: str) -> None:
    # With strided views allowed, bytes and bytearray (whose shape and strides point
    # into the buffer struct) merged 1 byte: the struct had moved after it was filled.
    n = 64 * PAGE + 123
    buf = exporters(n)[name]
    view = memoryview(buf)
    start = np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]
    whole = (start + view.nbytes) // PAGE - (start + PAGE - 1) // PAGE
    s = advm.merge(buf)
    assert s["bytes"] == view.nbytes and s["merged"] + s["added"] == whole, s
    assert bytes(view) == bytes(memoryview(exporters(n)[name])), "content unchanged"


def test_a_file_mapping_is_refused() -> None:
    with open(os.__file__, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        with pytest.raises(ValueError, match="file-backed"):
            advm.merge(memoryview(m))
    with pytest.raises(TypeError):
        advm.merge(42)


def test_stat_returns_the_figures_of_a_process() -> None:
    s = advm.stat(os.getpid())
    assert len(s["processes"]) == 1 and s["rss_bytes"] > 0 and s["physical_bytes"] > 0


STAT_KEYS = {
    "processes", "distinct", "physical_bytes", "physical_source", "pfn_visible", "anon_shmem_bytes",
    "held_pages", "held_swapped_pages", "shmem_objects", "shmem_objects_unread", "mapped_pages",
    "zero_page_mappings", "swapped_pages", "rss_bytes", "pss_bytes", "uss_bytes", "ksm",
    "ksmd_cpu_seconds", "measure_ms", "page_size_bytes",
}
PROCESS_KEYS = {
    "pid", "comm", "vmas", "mapped_pages", "distinct_pages", "held_pages", "rss_bytes", "pss_bytes",
    "uss_bytes", "swap_bytes", "ksm_stat",
}


def test_stat_keys_are_the_documented_ones() -> None:
    # Scripts index these dicts: a key renamed or dropped breaks them. Each is named in
    # stat's docstring (docs/stat.md lists them too).
    s = advm.stat(os.getpid())
    assert set(s) == STAT_KEYS and set(s["processes"][0]) == PROCESS_KEYS
    assert set(s["distinct"]) == {"total", "anon", "shmem", "file"}
    doc = advm.stat.__doc__ or ""
    assert [k for k in sorted(STAT_KEYS | PROCESS_KEYS) if f"``{k}``" not in doc] == []


def test_stat_refuses_bools_and_pids_out_of_range_by_name() -> None:
    # stat(True) measured pid 1 (True is an int); stat(-1) said "process -1 does not
    # exist" and stat(2**31) raised OverflowError ("out of range integral type
    # conversion attempted"), naming no pid.
    with pytest.raises(TypeError, match="not bool"):
        advm.stat(True)
    with pytest.raises(TypeError, match="item 1 of the pids: bool"):
        advm.stat([os.getpid(), False])
    for pid in (0, -1, 2**31, 2**64):
        with pytest.raises(ValueError, match=f"pid {pid} is not a process id: a pid is from 1 to 2\\*\\*31 - 1"):
            advm.stat(pid)
    with pytest.raises(ValueError, match="item 0 of the pids: pid -3 is not a process id"):
        advm.stat([-3])
    with pytest.raises(TypeError, match="item 1 of the pids: str '1'"):
        advm.stat([os.getpid(), "1"])  # type: ignore[list-item]


def test_stat_takes_numpy_ints_and_0_d_arrays() -> None:
    # A 0-d array is iterable by type, so stat iterated it: "iteration over a 0-d array".
    # Type checkers take them too (test_types runs mypy on this file): stat was typed
    # `int | Iterable[int]`, which refused a NumPy int under `mypy --strict`.
    me = os.getpid()
    for pid in (np.int32(me), np.array(me), np.array([me])):
        assert [p["pid"] for p in advm.stat(pid)["processes"]] == [me]


def test_stat_of_a_process_listed_twice_counts_it_once() -> None:
    # advm.stat([me, me]) summed the process's RSS, PSS and USS twice.
    import threading

    me = os.getpid()
    ready, done = threading.Event(), threading.Event()
    tid: list[int] = []

    def wait() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        done.wait()

    t = threading.Thread(target=wait)
    t.start()
    ready.wait()
    try:
        once = advm.stat(me)
        twice = advm.stat([me, me, tid[0]])
    finally:
        done.set()
        t.join()
    assert [p["pid"] for p in twice["processes"]] == [me]
    assert twice["rss_bytes"] < once["rss_bytes"] * 5 // 4, (once["rss_bytes"], twice["rss_bytes"])


def test_vcopy_of_an_array_is_equal_independent_and_virtual_the_second_time() -> None:
    src = np.arange(1 << 20, dtype=np.float64).reshape(1024, 1024)
    c1 = advm.vcopy(src)
    assert c1.shape == src.shape and c1.dtype == src.dtype and np.array_equal(c1, src)
    before = advm.vcopy_stats()
    c2 = advm.vcopy(c1)
    after = advm.vcopy_stats()
    assert np.array_equal(c2, src)
    c2[0, 0] = -1.0
    assert c1[0, 0] == 0.0 and src[0, 0] == 0.0
    pages = src.nbytes // PAGE
    assert after["vcopies"] == before["vcopies"] + 1, "the copy of an arena block is virtual"
    assert after["pages_shared"] >= before["pages_shared"] + pages - 1


def test_the_package_names_the_library_sources_it_was_built_from() -> None:
    # `advm bench merge` compares this with its own build's id before it measures.
    sid = advm._advm.__source_id__
    assert isinstance(sid, str) and len(sid) == 16
    int(sid, 16)


def _elf_sections(path: str) -> set[str]:
    """The section names of a 64-bit little-endian ELF file."""
    import struct

    with open(path, "rb") as f:
        elf = f.read()
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [elf[shoff + i * shentsize : shoff + (i + 1) * shentsize] for i in range(shnum)]
    strtab_off, = struct.unpack_from("<Q", headers[shstrndx], 0x18)
    names = set()
    for h in headers:
        name, = struct.unpack_from("<I", h, 0)
        start = strtab_off + name
        names.add(elf[start : elf.index(b"\0", start)].decode())
    return names


def test_the_extension_is_stripped() -> None:
    # The wheel's _advm.abi3.so was 30 MB, its symbol table and debug info.
    sections = _elf_sections(advm._advm.__file__)
    assert ".dynsym" in sections, sections
    assert not sections & {".symtab", ".debug_info", ".debug_line"}, sections


def test_vcopy_refuses_arrays_of_python_objects_before_copying() -> None:
    # Their bytes are references: a copy of them would hold objects it does not own.
    for a in (np.array([object(), "x"], dtype=object), np.zeros(3, dtype=[("a", "O"), ("b", "i4")])):
        before = advm.vcopy_stats()
        with pytest.raises(TypeError, match="array of Python objects"):
            advm.vcopy(a)
        assert advm.vcopy_stats() == before, "nothing was copied into the arena"


def test_stat_of_a_process_that_does_not_exist_raises_process_lookup_error() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # reaped: the pid names no process now
    with pytest.raises(ProcessLookupError, match=f"process {pid} does not exist"):
        advm.stat(pid)


def _python_as_nobody() -> list[str]:
    """The command that runs this Python as uid 65534 (setpriv), or a skip where it
    cannot: an interpreter under a directory only root may enter (pyenv's in /root)
    says nothing of advm."""
    import shutil
    import subprocess
    import sys

    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to run a process as another user")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    probe = subprocess.run([*nobody, "-c", "import advm"], capture_output=True, text=True, timeout=60, cwd="/")
    if probe.returncode != 0:
        pytest.skip(f"{sys.executable} with advm cannot run as uid 65534: {probe.stderr.strip()[-200:]}")
    return nobody


def test_stat_of_another_users_process_raises_permission_error() -> None:
    import subprocess

    if os.geteuid() != 0:
        # Not root: pid 1 is another user's already (unless this is its container).
        if os.stat("/proc/1").st_uid == os.geteuid():
            pytest.skip("pid 1 belongs to this user: no other user's process to try")
        with pytest.raises(PermissionError, match="process 1: permission denied"):
            advm.stat(1)
        return
    nobody = _python_as_nobody()
    code = (
        "import advm\n"
        "try:\n    advm.stat(1)\nexcept PermissionError as e:\n    print('PermissionError', e)\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([*nobody, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.stdout.startswith("PermissionError process 1: permission denied"), out.stdout + out.stderr


def test_merge_without_a_full_userfaultfd_raises_permission_error_naming_the_fixes() -> None:
    """A user who gets only a user-mode-only userfaultfd (not root,
    vm.unprivileged_userfaultfd=0) is refused a merge before any change: the fence
    could not hold the kernel's writes into the range. It raised a plain OSError."""
    import subprocess

    sysctl = "/proc/sys/vm/unprivileged_userfaultfd"
    if os.geteuid() != 0 or not os.path.exists(sysctl):
        pytest.skip("needs root and vm.unprivileged_userfaultfd to run as a user at 0")
    if os.path.exists("/dev/userfaultfd") and os.stat("/dev/userfaultfd").st_mode & 0o006:
        pytest.skip("/dev/userfaultfd is open to every user here: they get a full userfaultfd")
    nobody = _python_as_nobody()
    code = (
        "import os, advm\n"
        "b = bytearray(os.urandom(1 << 20))\n"
        "try:\n    advm.merge(b)\n    print('merged')\n"
        "except PermissionError as e:\n    print('PermissionError', e)\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    with open(sysctl) as f:
        was = f.read()
    try:
        with open(sysctl, "w") as f:
            f.write("0")
        env = dict(os.environ, ADVM_SOCKET="/nonexistent/advmd.sock")
        out = subprocess.run([*nobody, "-c", code], capture_output=True, text=True, timeout=60, cwd="/", env=env)
    finally:
        with open(sysctl, "w") as f:
            f.write(was)
    assert out.stdout.startswith("PermissionError"), out.stdout + out.stderr
    assert "unprivileged_userfaultfd" in out.stdout, out.stdout


CLOSES_EVERY_FD = r"""
import os, sys, numpy as np, advm
a = np.arange(1 << 20, dtype=np.float64)
x = advm.vcopy(a)
y = advm.vcopy(x)  # the arena's memfd is open now
os.closerange(3, 1024)  # as a daemon does
files = [open(os.path.join(sys.argv[1], f"f{i}"), "wb+", buffering=0) for i in range(8)]
for f in files:
    f.write(b"U" * (1 << 20))
z = advm.vcopy(a[: 1 << 18])
w = advm.vcopy(z)
assert np.array_equal(w, a[: 1 << 18]) and np.array_equal(y, a)
y[5] = -1.0
assert x[5] == 5.0
del x, y, z, w
for f in files:
    f.seek(0)
    assert f.read() == b"U" * (1 << 20), f"{f.name} changed"
    f.close()
print("ok")
"""


def test_vcopy_after_the_program_closed_every_fd_leaves_its_files_alone(tmp_path: pathlib.Path) -> None:
    # The arena's memfd number comes back for the program's own file: the arena must
    # not map, write or punch it (the process died of SIGBUS mapping it).
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", CLOSES_EVERY_FD, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "ok\n", (r.returncode, r.stdout, r.stderr)


MERGES_AFTER_CLOSING_EVERY_FD = r"""
import os, sys, numpy as np, advm
a = np.full(8 << 20, 3, dtype=np.uint8)
advm.merge(a)  # the process's own store, its memfds and the maps file are open now
os.closerange(3, 1024)
files = [open(os.path.join(sys.argv[1], f"f{i}"), "wb+", buffering=0) for i in range(8)]
for f in files:
    f.write(b"U" * (1 << 20))
b = np.full(8 << 20, 3, dtype=np.uint8)
c = np.random.default_rng(1).integers(0, 256, 8 << 20, dtype=np.uint8)
before = c.copy()
sb, sc = advm.merge(b), advm.merge(c)
sa = advm.merge(a)  # merged by the forgotten client: maps its store
assert sa["merged"] + sa["added"] >= 2047 and (a == 3).all(), sa
assert sb["merged"] + sb["added"] >= 2000 and sc["added"] >= 2000, (sb, sc)
assert (b == 3).all() and np.array_equal(c, before)
for f in files:
    f.seek(0)
    assert f.read() == b"U" * (1 << 20), f"{f.name} changed"
print("ok")
"""


def test_merge_after_the_program_closed_every_fd_works_and_leaves_its_files_alone(tmp_path: pathlib.Path) -> None:
    # It failed for good (ioctl(PROCMAP_QUERY) on the closed maps file); past that, the
    # store would have written and punched the program's files at its memfds' numbers.
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", MERGES_AFTER_CLOSING_EVERY_FD, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "ok\n", (r.returncode, r.stdout, r.stderr)


@pytest.mark.parametrize("call", ["vcopy", "merge"])
def test_vcopy_and_merge_release_the_gil(call: str) -> None:
    # Another Python thread runs on during a long copy (it used to wait for all of it).
    import threading
    import time

    ticks = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    t0, n0 = time.perf_counter(), ticks[0]
    time.sleep(0.2)  # its rate alone (the main thread sleeps)
    rate = (ticks[0] - n0) / (time.perf_counter() - t0)
    a = np.arange(32 << 20, dtype=np.uint64)  # not in the arena: its bytes are copied; distinct pages
    t0, n0 = time.perf_counter(), ticks[0]
    b = advm.vcopy(a) if call == "vcopy" else (advm.merge(a), a)[1]
    took, during = time.perf_counter() - t0, ticks[0] - n0
    stop.set()
    t.join()
    assert b[123456] == 123456
    assert during >= 0.2 * rate * took, f"{during} ticks in {took:.3f} s, {rate:.0f}/s alone"


def views() -> dict[str, np.ndarray]:
    c = np.arange(2 * 3 * 40, dtype=np.float64).reshape(2, 3, 40) * 1.5
    return {
        "every third": np.arange(3000, dtype=np.int32)[::3],
        "reversed": np.arange(5000, dtype=np.int16)[::-1],
        "columns": np.arange(2000.0).reshape(100, 20)[:, 2:7],
        "axes swapped and one reversed": c.transpose(1, 0, 2)[:, ::-1],
        "inner stride": c[:, :, ::2],
        "transposed slice": np.arange(24 * 50.0).reshape(24, 50).T[::2],
        "complex real part": (np.arange(4096) * (1 + 2j)).real,
        "structured field": np.zeros(1000, dtype=[("a", "i4"), ("b", "f8")])["b"],
        "bool rows": (np.arange(600).reshape(20, 30) % 3 == 0)[::2],
        "fortran": np.asfortranarray(c),
        "0-d": np.array(7.25),
        "0-size fortran": np.zeros((0, 3), order="F"),
        "0-size strided": np.zeros((4, 6))[:, 6:],
        "read-only": np.frombuffer(bytes(range(256)) * 64, dtype=np.uint16)[::5],
    }


@pytest.mark.parametrize("name", list(views()))
def test_vcopy_makes_what_numpy_copy_makes_of_any_view(name: str) -> None:
    # A strided view raised BufferError ("vcopy needs a contiguous array"): numpy.copy
    # copies any view, and vcopy is its drop-in.
    src = views()[name]
    before = src.copy()
    got, want = advm.vcopy(src), np.copy(src)
    assert (got.dtype, got.shape, got.strides) == (want.dtype, want.shape, want.strides)
    assert np.array_equal(got, want) and got.flags.writeable
    assert (got.flags.c_contiguous, got.flags.f_contiguous) == (want.flags.c_contiguous, want.flags.f_contiguous)
    if got.size:
        got.reshape(-1, order="A")[:1] = 0  # the copy's writes stay in the copy
        assert np.array_equal(src, before)
        if src.flags.writeable:
            src[...] = 1  # and the source's in the source
            assert np.array_equal(got.reshape(-1, order="A")[1:], want.reshape(-1, order="A")[1:])
    if got.nbytes >= 2 * PAGE:
        again = advm.vcopy(got)  # a copy in the arena: its own copies are virtual
        assert np.array_equal(again, got) and again.strides == got.strides


def test_stat_of_several_processes_counts_the_pages_they_share_once() -> None:
    # Per-process figures count a page each process maps; a model server needs the
    # workers' distinct pages together to see what sharing saved (stat took one pid).
    held = np.random.default_rng(9).integers(0, 256, 32 << 20, dtype=np.uint8)  # touched, 32 MiB
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, b".")  # the child maps the parent's pages (copy-on-write) until it exits
        time.sleep(30)
        os._exit(0)
    os.close(w)
    try:
        os.read(r, 1)
        me, child = advm.stat(os.getpid()), advm.stat(pid)
        both = advm.stat([os.getpid(), pid])
        assert [p["pid"] for p in both["processes"]] == [os.getpid(), pid]
        shared = me["physical_bytes"] + child["physical_bytes"] - both["physical_bytes"]
        figures = (me["physical_bytes"], child["physical_bytes"], both["physical_bytes"])
        if both["pfn_visible"]:
            assert shared >= held.nbytes, figures
        else:  # no PFNs without CAP_SYS_ADMIN: the figure is PSS, which splits shared pages
            assert both["physical_source"] == "pss" and abs(shared) < held.nbytes // 4, figures
        assert [p["pid"] for p in advm.stat(p for p in [pid])["processes"]] == [pid]
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(r)
    with pytest.raises(TypeError, match="a pid .* or an iterable of pids, not str"):
        advm.stat(str(os.getpid()))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no process given"):
        advm.stat([])


def test_the_result_dicts_have_the_documented_keys() -> None:
    # Scripts index these dicts: every key is named in the docstring, and a key added
    # or dropped must change this test (and the docstring) with it.
    s = advm.merge(page_aligned(4, 30))
    assert set(s) == set(advm.MergeStats.__annotations__)
    assert set(s["phases"]) == {"fence", "hash", "lookup", "add", "map"}
    assert all(f"``{k}``" in (advm.MergeStats.__doc__ or "") for k in s["phases"])
    v = advm.vcopy_stats()
    assert [k for k in v if f"``{k}``" not in (advm.vcopy_stats.__doc__ or "")] == []
    assert len(v) == 20, sorted(v)


def test_help_says_what_every_result_field_means() -> None:
    # MergeStats' fields were documented by strings after each field, which help() and
    # pydoc never show: help(advm.MergeStats) said only "What one merge did."
    doc = advm.MergeStats.__doc__ or ""
    missing = [k for k in advm.MergeStats.__annotations__ if f"``{k}``" not in doc]
    assert not missing, missing
    for f in (advm.merge, advm.stat, advm.vcopy, advm.vcopy_stats):
        assert "Raises" in (f.__doc__ or ""), f.__name__
    assert all(f"``{k}``" in (advm.vcopy_stats.__doc__ or "") for k in ("vcopies", "pages_shared", "bytes_copied"))


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt, as in a Python started from a terminal: one
    started with SIGINT ignored (a script's `&` job, some CI runners) keeps it
    ignored, and Ctrl-C would not reach the code under test at all."""
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def interrupt_soon(after: float) -> None:
    import signal
    import threading

    threading.Timer(after, os.kill, (os.getpid(), signal.SIGINT)).start()


def test_ctrl_c_stops_a_long_merge_between_pieces_and_changes_no_byte(ctrl_c_raises: None) -> None:
    # Ctrl-C came through only when the whole merge (or copy) returned: 1.2 s for
    # 1 GiB, 15 s for a 14 GiB model's weights; it is raised between 128 MiB pieces now.
    n = 512 << 20
    a = np.arange(n // 8, dtype=np.uint64)  # distinct pages: every one is added
    before = a[::512].copy()
    interrupt_soon(0.1)
    with pytest.raises(KeyboardInterrupt):
        advm.merge(a)
        time.sleep(5)  # were the merge done first, Ctrl-C lands here: the checks below tell
    assert np.array_equal(a[::512], before)
    again = np.arange(n // 8, dtype=np.uint64)
    s = advm.merge(again)  # the pieces merged before Ctrl-C are in the store
    assert s["merged"] > 0 and s["added"] > 0, s
    start = again.__array_interface__["data"][0]
    full = (start + n) // PAGE - (start + PAGE - 1) // PAGE  # every whole page, once
    assert (s["merged"] + s["added"], s["bytes"]) == (full, n), s
    assert np.array_equal(again[::512], before)


def test_ctrl_c_stops_a_long_first_vcopy_and_frees_its_block(ctrl_c_raises: None) -> None:
    import signal
    import threading

    a = np.ones(512 << 20, dtype=np.uint8)  # not in the arena: its bytes are copied
    t0 = time.perf_counter()
    advm.vcopy(a)  # (freed at once)
    full = time.perf_counter() - t0
    blocks = advm.vcopy_stats()["blocks"]
    fired: list[float] = []

    def ctrl_c() -> None:
        fired.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Timer(full / 8, ctrl_c).start()
    with pytest.raises(KeyboardInterrupt):
        advm.vcopy(a)
        time.sleep(5)  # were the copy done first, Ctrl-C lands here: the check below tells
    late = time.perf_counter() - fired[0]
    assert late < full / 2, f"KeyboardInterrupt {late:.3f} s after Ctrl-C; a whole copy takes {full:.3f} s"
    assert advm.vcopy_stats()["blocks"] == blocks, "the interrupted copy's block is freed"


def test_merging_a_vcopy_says_it_is_one() -> None:
    # The refusal named a "shared mapping" at some address: the user made no shared
    # mapping, advm.vcopy did.
    v = advm.vcopy(page_aligned(16, 11))
    with pytest.raises(ValueError, match="made by advm.vcopy.*merge the array it was copied from"):
        advm.merge(v[3:])


UNDER_ULIMIT_V = r"""
import resource, numpy as np, advm
a = np.ones(1 << 20)
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))
for f in (advm.vcopy, advm.merge):
    try:
        f(a)
        print(f.__name__, "worked")
    except OSError as e:
        print(f.__name__, e)
"""


def test_under_ulimit_v_vcopy_and_merge_say_the_limit_is_why() -> None:
    # They failed with "mmap(reserve): Cannot allocate memory" alone: 8 MiB to copy, and
    # nothing said the address-space reservation under a 4 GiB ulimit -v was the cause.
    import subprocess
    import sys

    env = dict(os.environ, ADVM_SOCKET="/nonexistent/advmd.sock")
    out = subprocess.run([sys.executable, "-c", UNDER_ULIMIT_V], capture_output=True, text=True, timeout=60, env=env)
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout + out.stderr
    for line in lines:
        assert "worked" in line or ("limited to 4096 MiB (ulimit -v" in line and "lift the limit" in line), line


def test_a_forked_child_merges_again_what_its_parent_merged() -> None:
    # A preforking server (gunicorn --preload) merges the model in the parent; a worker
    # that merged it again got "ValueError: ... is file-backed (inode N)": the range maps
    # the parent's store, which the child's own session did not know.
    a = page_aligned(32, 12)
    advm.merge(a)
    want = a.copy()
    want[5 * PAGE : 6 * PAGE] = 7
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            a[5 * PAGE : 6 * PAGE] = 7
            s = advm.merge(a)
            code = 0 if s["merged"] + s["added"] == 32 and np.array_equal(a, want) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's merge of its parent's merged array failed"
    assert not np.array_equal(a, want), "the child's write stayed in the child"


def test_merge_refuses_arrays_of_python_objects() -> None:
    # It merged the pages of pointers (no other process could ever share them) and
    # reported them merged, as if the objects were shared.
    for a in (np.array([object()] * 4096, dtype=object), np.zeros(4096, dtype=[("a", "O"), ("b", "f8")])):
        with pytest.raises(TypeError, match="array of Python objects"):
            advm.merge(a)
        with pytest.raises(TypeError, match="array of Python objects"):
            advm.merge(a.data)  # a memoryview of the array
    import ctypes

    # A ctypes array of py_object (format "<O") merged its pointers: only NumPy arrays
    # and memoryviews were looked at.
    with pytest.raises(TypeError, match=r"array of Python objects \(<O\)"):
        advm.merge((ctypes.py_object * 4096)())
    named = np.zeros(4096, dtype=[("Offset", "f8"), ("b", "i4")])  # a field name is no object
    assert advm.merge(named.data)["bytes"] == named.nbytes


SOCKET_IS_A_DIRECTORY = r"""
import numpy as np, advm
s = advm.merge(np.arange(1 << 16))
print(s["via"], s["via_detail"])
"""


def test_advm_socket_naming_a_directory_says_so(tmp_path: pathlib.Path) -> None:
    # connect(2) fails with ECONNREFUSED there, which was read as "a socket is there but
    # no advmd answers (one that died left it)".
    import subprocess
    import sys

    env = dict(os.environ, ADVM_SOCKET=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", SOCKET_IS_A_DIRECTORY], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("local advmd is not reachable at"), out.stdout
    assert "a directory is there, not a socket (ADVM_SOCKET or --socket must name advmd's socket)" in out.stdout


DAEMON_GOES_AWAY = r"""
import os, signal, sys, time, numpy as np, advm
daemon = int(sys.argv[1])
a = np.arange(1 << 18, dtype=np.uint64)
print(advm.merge(a)["via"])
os.kill(daemon, signal.SIGTERM)
t0 = time.monotonic()
while open(f"/proc/{daemon}/stat").read().split(") ")[1][0] != "Z":  # until it has exited
    assert time.monotonic() - t0 < 20, "advmd did not stop on SIGTERM"
    time.sleep(0.01)
try:
    advm.merge(np.arange(1 << 18, dtype=np.uint64) + 1)
    print("no error")
except ConnectionError as e:
    print("ConnectionError", e)
s = advm.merge(np.arange(1 << 18, dtype=np.uint64) + 2)
print(s["via"], np.array_equal(a, np.arange(1 << 18, dtype=np.uint64)))
"""


def advm_binary() -> pathlib.Path:
    root = pathlib.Path(__file__).resolve().parents[3]
    found = next((p for p in (root / "target/debug/advm", root / "target/release/advm") if p.exists()), None)
    if found is None:
        pytest.skip("no advm binary under target/ (make test builds it) to run a private advmd")
    return found


DAEMON_COMES_LATER = r"""
import subprocess, sys, time, numpy as np, advm
advm_bin, sock = sys.argv[1:]
a = np.arange(1 << 18, dtype=np.uint64)
s = advm.merge(a)
print(s["via"], s["added"])
daemon = subprocess.Popen([advm_bin, "daemon", "--socket", sock], stderr=subprocess.DEVNULL)
try:
    t0 = time.monotonic()
    while advm.merge(b"")["via"] != "daemon":  # looked for again at most once a second
        assert time.monotonic() - t0 < 20, "advm never went through advmd"
        time.sleep(0.05)
    s = advm.merge(np.arange(1 << 18, dtype=np.uint64))
    print(s["via"], s["added"])
    s = advm.merge(a)  # merged into the process's own store: merges again, into advmd's
    print(s["via"], s["merged"], np.array_equal(a, np.arange(1 << 18, dtype=np.uint64)))
finally:
    daemon.terminate()
    daemon.wait()
"""


def test_a_process_that_merged_before_advmd_started_goes_through_it_once_it_serves() -> None:
    # A worker started before the daemon kept its own store for good: it never shared.
    import shutil
    import subprocess
    import sys
    import tempfile

    advm_bin = advm_binary()
    where = tempfile.mkdtemp(prefix="advm-py-")  # short: a socket path holds 107 bytes
    try:
        env = dict(os.environ, ADVM_SOCKET=os.path.join(where, "advmd.sock"))
        args = [sys.executable, "-c", DAEMON_COMES_LATER, str(advm_bin), env["ADVM_SOCKET"]]
        out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
    finally:
        shutil.rmtree(where)
    lines = [line.split() for line in out.stdout.splitlines()]
    assert [line[0] for line in lines] == ["local", "daemon", "daemon"], out.stdout + out.stderr
    whole = (1 << 21) // PAGE - 1  # at least: the arrays need not be page aligned
    assert all(int(line[1]) >= whole for line in lines) and lines[2][2] == "True", out.stdout


def test_a_daemon_gone_mid_session_raises_connection_error_and_the_next_merge_goes_on() -> None:
    # It raised a bare OSError telling a Python program to "connect a new client",
    # which it cannot do (and need not: the next advm.merge connects again).
    import shutil
    import subprocess
    import sys
    import tempfile

    advm_bin = advm_binary()
    where = tempfile.mkdtemp(prefix="advm-py-")  # short: a socket path holds 107 bytes
    sock = os.path.join(where, "advmd.sock")
    daemon = subprocess.Popen([advm_bin, "daemon", "--socket", sock], stderr=subprocess.DEVNULL)
    try:
        t0 = time.monotonic()
        while not os.path.exists(sock):
            assert daemon.poll() is None and time.monotonic() - t0 < 30, "advmd did not start"
            time.sleep(0.02)
        env = dict(os.environ, ADVM_SOCKET=sock)
        out = subprocess.run(
            [sys.executable, "-c", DAEMON_GOES_AWAY, str(daemon.pid)], capture_output=True, text=True, env=env, timeout=60
        )
    finally:
        daemon.kill()
        daemon.wait()
        shutil.rmtree(where)
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out.stdout + out.stderr
    assert lines[0] == "daemon"
    assert lines[1].startswith(f"ConnectionError advmd at {sock} closed the connection"), lines[1]
    assert lines[1].endswith("(the next advm.merge connects again: to advmd when one answers, else to a store of this process's own)")
    assert lines[2] == "local True", lines[2]


def test_a_bytearray_cannot_be_resized_while_it_is_merged() -> None:
    # The merge holds the buffer exported: bytearray refuses to move its memory
    # meanwhile, so the merge never writes a freed buffer.
    import threading

    n = 128 << 20
    data = bytearray(np.random.default_rng(21).integers(0, 256, n, dtype=np.uint8).tobytes())
    want = bytes(data[: 64 << 20])
    done = threading.Event()
    def merge() -> None:
        advm.merge(data)
        done.set()

    t = threading.Thread(target=merge)
    t.start()
    refused = 0
    while not done.is_set():
        try:
            data.extend(b"x")
            del data[-1]
        except BufferError as e:
            assert "Existing exports" in str(e)
            refused += 1
    t.join()
    # (an extend that came before the merge began may have kept its byte)
    assert data[: 64 << 20] == want and len(data) in (n, n + 1)
    assert refused > 0, "no resize was tried while the merge ran"


def test_snapshots_of_an_array_another_thread_writes_lose_none_of_its_writes() -> None:
    # A thread updating an array while another took advm.vcopy snapshots of it lost
    # updates: after 3 s, 112,918 elements of a 64 MiB array read back older values
    # than the writer's last (the copy re-homed the array's written pages and
    # remapped them, dropping writes that landed in between).
    import threading

    n = (16 << 20) // 8
    v = advm.vcopy(np.zeros(n, dtype=np.int64))
    model = np.zeros(n, dtype=np.int64)  # what the writer wrote, in plain memory
    stop = threading.Event()
    writes = [0]

    def writer() -> None:
        rng = np.random.default_rng(2)
        k = 0
        while not stop.is_set():
            k += 1
            at = rng.integers(0, n, 64)
            v[at] = k
            model[at] = k
        writes[0] = k

    t = threading.Thread(target=writer)
    t.start()
    copies = 0
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < 1.0:
            advm.vcopy(v)
            copies += 1
    finally:
        stop.set()
        t.join()
    lost = int(np.count_nonzero(v != model))
    assert lost == 0, f"{lost} elements lost their writes ({writes[0]} writes, {copies} copies)"
    assert copies > 10 and writes[0] > 100, (copies, writes[0])


def test_a_merge_keeps_the_programs_marks_and_refuses_a_wipe_on_fork_range() -> None:
    # The merged pages became store mappings without the marks set on the memory: a
    # MADV_WIPEONFORK range was no longer wiped in a forked child (it read the
    # parent's bytes), and MADV_DONTFORK, MADV_DONTDUMP and mlock were dropped.
    import ctypes

    def flags(addr: int) -> list[str]:
        inside = False
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                first = line.split()[0]
                if not first.endswith(":") and "-" in first:
                    s, e = (int(x, 16) for x in first.split("-"))
                    inside = s <= addr < e
                elif inside and first == "VmFlags:":
                    return line.split()[1:]
        raise AssertionError(f"{addr:#x} is not mapped")

    def child_reads_zeros(m: mmap.mmap) -> bool:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if not any(m[:]) else 1)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0

    rng = np.random.default_rng(41)
    w = mmap.mmap(-1, 16 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    w[:] = rng.integers(1, 256, 16 * PAGE, dtype=np.uint8).tobytes()
    w.madvise(18)  # MADV_WIPEONFORK (Linux 4.14; not in Python's mmap module)
    with pytest.raises(ValueError, match="is marked MADV_WIPEONFORK, which a merged page"):
        advm.merge(w)
    assert child_reads_zeros(w), "the refused range is still wiped in a child"

    m = mmap.mmap(-1, 16 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    want = rng.integers(1, 256, 16 * PAGE, dtype=np.uint8).tobytes()
    m[:] = want
    m.madvise(mmap.MADV_DONTFORK)
    m.madvise(16)  # MADV_DONTDUMP
    addr = np.frombuffer(m, dtype=np.uint8).__array_interface__["data"][0]
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(16 * PAGE)) == 0, os.strerror(ctypes.get_errno())
    s = advm.merge(m)
    assert s["added"] + s["merged"] == 16, s
    assert {"dc", "dd", "lo"} <= set(flags(addr + 5 * PAGE)), flags(addr + 5 * PAGE)
    assert m[:] == want


def test_a_forked_child_and_its_parent_keep_their_vcopies_apart() -> None:
    src = np.arange(1 << 18, dtype=np.float64)
    x = advm.vcopy(src)
    y = advm.vcopy(x)  # shares x's pages
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            x[0], y[1] = -1.0, -2.0
            z = advm.vcopy(y)
            z[2] = -3.0
            ok = (x[1], y[0], y[2], z[0], z[1]) == (1.0, 0.0, 2.0, 0.0, -2.0)
            code = 0 if ok and np.array_equal(src, np.arange(1 << 18, dtype=np.float64)) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert np.array_equal(x, src) and np.array_equal(y, src), "the child's writes stayed in the child"
    y[3] = 9.0
    assert x[3] == 3.0


def test_many_vcopies_leave_no_descriptors_or_mappings_behind() -> None:
    import gc

    def counts() -> tuple[int, int]:
        with open("/proc/self/maps") as maps:
            return len(os.listdir("/proc/self/fd")), sum(1 for _ in maps)

    src = np.random.default_rng(31).random(1 << 17)  # 1 MiB
    x = advm.vcopy(src)
    for _ in range(20):  # the arena's own memfds and mappings settle first
        advm.vcopy(x)
    gc.collect()
    fds, maps = counts()
    for i in range(300):
        y = advm.vcopy(x)  # virtual
        y[i] = -1.0
        z = advm.vcopy(src[: 1000 + i])  # small
        w = advm.vcopy(x[::3])  # gathered
        del y, z, w
    gc.collect()
    fds2, maps2 = counts()
    assert fds2 <= fds + 2 and maps2 <= maps + 8, ((fds, maps), (fds2, maps2))
    assert np.array_equal(x, src)


def test_trim_lets_go_of_merged_pages_once_their_array_is_unmapped() -> None:
    m = mmap.mmap(-1, 64 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    a = np.frombuffer(m, dtype=np.uint8)
    a[:] = np.random.default_rng(77).integers(0, 256, a.size, dtype=np.uint8)
    want = a.copy()
    assert advm.merge(a)["added"] == 64
    t = advm.trim()
    assert t["kept"] >= 64 and t["seconds"] >= 0
    assert (a == want).all()
    del a
    m.close()
    assert advm.trim()["released"] >= 64


NUMPY_GENERATIONS = """
import gc, sys
import numpy as np
import advm
rng = np.random.default_rng(5)
for gen in range(3):
    a = rng.integers(0, 2**63, (8 << 20) // 8, dtype=np.int64)
    want = a.copy()
    added = advm.merge(a)["added"]
    assert (a == want).all()
    del a, want
    gc.collect()
    t = advm.trim()
    print(gen, added, t["released"], t["kept"])
"""


def test_trim_releases_each_generation_of_numpy_arrays_malloc_unmaps() -> None:
    """8 MiB arrays made, merged, deleted, three times. glibc raises its mmap threshold
    to a freed mmapped block's size, so from the second generation on such arrays come
    from the heap, which keeps them mapped after ``del`` (the trim keeps their pages,
    docs/merge.md "Trims"). With the threshold fixed (``MALLOC_MMAP_THRESHOLD_``) each
    array is unmapped when deleted, and each trim releases its whole generation."""
    import subprocess
    import sys

    env = dict(os.environ, ADVM_SOCKET="/nonexistent/advmd.sock", MALLOC_MMAP_THRESHOLD_=str(1 << 20))
    out = subprocess.run([sys.executable, "-c", NUMPY_GENERATIONS], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [[int(x) for x in line.split()] for line in out.stdout.splitlines()]
    assert len(rows) == 3, out.stdout
    for gen, added, released, kept in rows:
        assert added >= 2047 and released == added and kept == 0, (gen, added, released, kept)
