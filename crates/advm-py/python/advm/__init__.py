"""advm: application-directed virtual memory for Python.

- ``merge(obj)``: user-guided page merging of any buffer (bytes, memoryview, NumPy
  arrays): pages equal to ones in the store become copy-on-write mappings of the
  store's pages, so processes holding the same data (model weights) keep one copy.
  The store is advmd's for this uid ($ADVM_SOCKET, else /run/advm/advmd.sock), or this
  process's own when no daemon answers (the result's ``via`` says which, and why; a
  process that fell back looks for advmd again at most once a second).
- ``stat(pid)``: the ``advm stat`` figures of a process, or of a list of processes
  measured together (distinct physical pages, RSS, PSS, USS, KSM) as a dict.
- ``vcopy(array)``: a copy of a NumPy array (as ``numpy.copy``) in advm's arena, whose
  own copies are virtual (pages shared until written).
- ``vcopy_stats()``: what the arena did so far.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, SupportsIndex, TypedDict, TypeVar

from . import _advm

if TYPE_CHECKING:
    import numpy

_Shape = TypeVar("_Shape", bound=tuple[Any, ...])
_DType = TypeVar("_DType", bound="numpy.dtype[Any]")

__all__ = ["merge", "trim", "stat", "vcopy", "vcopy_stats", "MergeStats", "TrimStats", "__version__"]
__version__: str = _advm.__version__


class MergeStats(TypedDict):
    """What one merge did (``help(advm.MergeStats)`` shows this; a field's own string
    would not reach ``help``).

    - ``merged``: pages now mapping a page the store already held (or one an earlier,
      equal page of the same range added).
    - ``added``: pages added to the store, one per distinct new page (the next process
      shares them).
    - ``skipped``: pages left alone: partial end pages, zero pages, refused or
      mismatched pages.
    - ``refused``: of ``skipped``, pages the store refused because it reached its byte
      limit; ``refusal``: the store's reason then, else ``None``.
    - ``bytes``: bytes of the buffer (of a strided view: the span from its lowest byte
      to its highest); ``seconds``: time the merge took.
    - ``phases``: where that time went, seconds: ``fence`` (checking and
      write-protecting the range), ``hash`` (this process hashing its pages),
      ``lookup`` (asking the store, including waits for pages other processes are
      adding), ``add`` (handing new pages over), ``map`` (mapping store pages over the
      buffer).
    - ``via``: ``"daemon"`` (advmd's store for this uid) or ``"local"`` (this
      process's own); ``via_detail``: the daemon's socket, or why it was not used.
    """

    merged: int
    added: int
    skipped: int
    refused: int
    refusal: str | None
    bytes: int
    seconds: float
    phases: dict[str, float]
    via: str
    via_detail: str


def merge(obj: Any) -> MergeStats:
    """Merge the full pages of ``obj`` with equal pages in the store; return what it did.

    ``obj`` is any buffer: a NumPy array of any dtype (read-only ones too), ``bytes``,
    ``bytearray``, ``array.array``, a memoryview slice. Only its whole pages count; a
    buffer under a page merges nothing. A strided view (a slice with a step, a
    transposed, reversed or broadcast array) merges the memory it spans, from its lowest
    byte to its highest: the bytes it steps over (its base array's) are merged with it,
    which changes none of them. The content the process sees never changes, and writes
    after the merge go to a private copy. The GIL is released while it merges (other
    threads run on; one writing the buffer waits until the merge is done); Ctrl-C raises
    ``KeyboardInterrupt`` at the end of the 128 MiB piece under way (the pieces before
    it stay merged).

    Returns a :class:`MergeStats` dict (``merged``, ``added``, ``skipped``, ``via``...).

    An object without the buffer protocol that exports an array interface
    (``__array_interface__`` or ``__array_struct__``) is merged through the NumPy array
    over its own memory (``numpy.asarray`` wraps it, no copy). One that only converts
    (``__array__``: a torch tensor) raises ``TypeError`` naming the fix (``t.numpy()``,
    or ``np.asarray(x)`` when it shares memory): the conversion may copy, and merging a
    copy would share nothing of the original.

    Raises ``TypeError`` for any other object without the buffer protocol (``None``,
    ``str``, ``int``: the message names it) and for an array of Python objects (``dtype=object``, a structured dtype with an
    object field, a ctypes array of ``py_object``: its elements are references, which no
    other process could share);
    ``ValueError`` from a released memoryview, ``BufferError`` from an exporter that
    needs suboffsets (PIL-style arrays of pointers); memory that is not private anonymous (a file mapping,
    ``np.memmap``, shared memory such as ``mmap.mmap(-1, n)``, an array ``vcopy``
    made) raises ``ValueError`` naming the mapping; the system's failures raise
    ``OSError``: ``PermissionError`` when this user gets only a user-mode-only
    userfaultfd (not root, ``vm.unprivileged_userfaultfd=0``: the message names the
    fixes), and ``ConnectionError`` (an ``OSError``) when advmd stops or restarts
    during the call (what was merged keeps its content; the next call connects again:
    to advmd when one answers, else to a store of this process's own). An array from ``np.load(path, mmap_mode="r")`` is such a file
    mapping, and needs no merge: its pages are the file's page cache, one copy for
    every process that maps the file.

    In a forked child (``multiprocessing`` with ``fork``, a preforking server) arrays
    the parent merged before the fork stay shared, and merging them again works.

    Marks set on the memory with ``madvise`` (``MADV_DONTFORK``, ``MADV_DONTDUMP``) or
    ``mlock`` are set again on the merged pages; a range marked ``MADV_WIPEONFORK``
    raises ``ValueError`` (a merged page could not be wiped in a forked child).
    """
    obj = _buffer_of(obj)
    objects = _object_type(obj)
    if objects is not None:
        raise TypeError(
            f"merge cannot share an array of Python objects ({objects}): its elements are "
            "references into this process, not data (merge the arrays or bytes they refer to)"
        )
    return _advm.merge(obj)  # type: ignore[no-any-return]


def _described(obj: Any) -> str:
    """``obj``'s type and a short repr, for an error message."""
    text = repr(obj)
    return f"{type(obj).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _buffer_of(obj: Any) -> Any:
    """``obj`` when it has the buffer protocol; else the NumPy array over its own memory
    when it exports an array interface (``__array_interface__``, ``__array_struct__``:
    NumPy wraps the pointer, no copy); else a ``TypeError`` saying what was passed."""
    try:
        memoryview(obj).release()
        return obj
    except TypeError:
        pass
    except (ValueError, BufferError):
        return obj  # _advm.merge says why
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array_struct__"):
        import numpy as np

        return np.asarray(obj)
    hint = (
        " It converts to a NumPy array (``__array__``), which may be a copy: merging a copy "
        "shares nothing of the original, so pass an array over the object's own memory "
        "(a CPU torch tensor: t.numpy(); otherwise np.asarray(x), where "
        "np.shares_memory tells it is no copy)."
        if hasattr(obj, "__array__")
        else ""
    )
    raise TypeError(
        f"merge needs a buffer (a NumPy array, bytes, bytearray, memoryview, array.array), "
        f"not {_described(obj)}.{hint}"
    )


class TrimStats(TypedDict):
    """What one trim did (:func:`trim`).

    - ``released``: store pages let go: no process maps them any more (the store frees
      those no other process holds).
    - ``kept``: store pages still held: some process maps them.
    - ``seconds``: time the trim took (mostly reading every process's maps).
    """

    released: int
    kept: int
    seconds: float


def trim() -> TrimStats:
    """Let go of the merged pages this process no longer maps; return what it did.

    A merged page stays in the store for as long as the process holds it, also after the
    array merged onto it was freed. ``trim`` lets go of every page no process maps any
    more: arrays deleted (their memory unmapped), not arrays written (their mappings
    still cover the store's pages). Pages a forked child still maps are kept. It reads
    every process's maps (milliseconds; tens with many thousands of mappings): call it
    after dropping merged data, not per merge. An array ``malloc`` placed in its heap
    stays mapped after ``del`` (glibc does so for blocks under its mmap threshold,
    which rises up to 32 MiB as large blocks are freed), and its pages are kept: set
    ``MALLOC_MMAP_THRESHOLD_=1048576`` in the environment to have large arrays
    unmapped when deleted (docs/merge.md, "Trims"). Under ``advm run --mode merge`` the agent
    trims by itself.

    Raises ``OSError`` when the maps of this process, or of a process of its user started
    since its first merge, cannot be read (nothing is let go then).
    """
    return _advm.trim()  # type: ignore[no-any-return]


def _object_type(obj: Any) -> str | None:
    """The dtype or buffer format of ``obj`` when its elements are Python objects."""
    dtype = getattr(obj, "dtype", None)
    if hasattr(dtype, "hasobject"):
        return str(dtype) if dtype.hasobject else None
    # Any other buffer (a memoryview, a ctypes array of py_object) by its struct
    # format: "O" is an object; field names sit between colons.
    try:
        with memoryview(obj) as m:
            fmt = m.format
    except (TypeError, ValueError, BufferError):
        return None  # _advm.merge says why
    return fmt if "O" in re.sub(":[^:]*:", "", fmt) else None


def stat(pid: SupportsIndex | Iterable[SupportsIndex]) -> dict[str, Any]:
    """The ``advm stat`` figures of process ``pid``, or of several processes measured
    together, as a dict: ``physical_bytes`` (distinct physical pages; a page the
    processes share counts once, so the figure of a list of workers shows what merging
    saved), ``anon_shmem_bytes`` (those pages without the page cache of regular files:
    what a memory cgroup charges as anon + shmem), ``rss_bytes``, ``pss_bytes``,
    ``uss_bytes``, ``ksm``, and ``processes`` (one entry per process: ``pid``,
    ``comm``, ``vmas``, ``mapped_pages``, ``distinct_pages``, ``held_pages``,
    ``rss_bytes``, ``pss_bytes``, ``uss_bytes``, ``swap_bytes``, ``ksm_stat``). Also
    ``distinct`` (pages by kind: ``total``, ``anon``, ``shmem``, ``file``),
    ``physical_source``, ``pfn_visible``, ``held_pages``, ``held_swapped_pages``,
    ``shmem_objects``, ``shmem_objects_unread``, ``mapped_pages``,
    ``zero_page_mappings``, ``swapped_pages``, ``ksmd_cpu_seconds``, ``measure_ms``,
    ``page_size_bytes``: the keys of ``advm stat --json`` (docs/stat.md), the same in
    every release. A process listed twice, or beside one of its threads' ids, is
    measured once.

    Needs permission to read the processes' /proc files (the same user, or root).
    Raises ``ProcessLookupError`` when a process does not exist (or exits while
    measured, or is a zombie) and ``PermissionError`` when its files may not be read;
    both are ``OSError``s. A kernel thread (no user memory), an empty list or a pid
    below 1 or past 2**31 - 1 raises ``ValueError``; a pid that is not an int
    (``str``, ``float``, ``bool``) ``TypeError``."""
    try:
        pids = [_pid(pid)]
    except TypeError:
        if not isinstance(pid, Iterable) or isinstance(pid, (str, bytes, bytearray, memoryview)):
            raise TypeError(f"stat takes a pid (an int) or an iterable of pids, not {type(pid).__name__}") from None
        pids = [_pid(p, f"item {i} of the pids: ") for i, p in enumerate(pid)]
    return json.loads(_advm.stat_json(pids))  # type: ignore[no-any-return]


def _pid(p: object, where: str = "") -> int:
    """``p`` as a pid: an int (NumPy's too) from 1 to 2**31 - 1, not a bool."""
    # operator.index takes True as 1, which would measure pid 1 (init).
    try:
        if isinstance(p, bool):
            raise TypeError
        n = operator.index(p)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"stat takes pids (ints): {where}{type(p).__name__} {p!r}") from None
    if not 0 < n < 2**31:
        raise ValueError(f"{where}pid {n} is not a process id: a pid is from 1 to 2**31 - 1")
    return n


def vcopy(array: numpy.ndarray[_Shape, _DType]) -> numpy.ndarray[_Shape, _DType]:
    """A copy of a NumPy array, as ``numpy.copy`` makes it (same values, dtype, shape
    and strides; writable; independent of the source both ways), living in advm's arena.

    Copying an array that already lives in the arena (the result of an earlier
    ``vcopy``) shares its pages copy-on-write instead of copying bytes; copying any
    other array copies its bytes once into the arena, and a strided view gathers its
    elements there as ``numpy.copy`` does. The GIL is released while it copies (other
    threads run on), as during ``merge``, and Ctrl-C stops a first copy at the end of
    the 128 MiB piece under way.

    Returns a plain ``numpy.ndarray`` (a subclass such as a masked array loses its
    class, as with ``numpy.copy``). Unlike ``numpy.copy``'s, its memory is the arena's:
    ``flags.owndata`` is false, ``base`` is not ``None``, and ``ndarray.resize``
    refuses it (``numpy.resize`` makes a resized copy of any array). Raises ``TypeError`` for an array of Python objects
    (a dtype holding ``object`` fields): its elements are references, not bytes;
    ``OSError`` when the arena cannot be made or grown.
    """
    import numpy as np

    src = np.asarray(array)
    if src.dtype.hasobject and not isinstance(array, np.ndarray):
        raise TypeError(
            f"vcopy copies a NumPy array, or what numpy.asarray makes one of; it was given "
            f"{_described(array)}, of which numpy.asarray makes an array of Python objects "
            f"(dtype {src.dtype}), references, not bytes"
        )
    if src.dtype.hasobject:
        raise TypeError(
            f"vcopy cannot copy an array of Python objects (dtype {src.dtype}): "
            "its elements are references, not bytes (use array.copy())"
        )
    if src.nbytes == 0:
        return np.copy(src)
    if src.flags.c_contiguous or src.flags.f_contiguous:
        block = _advm.vcopy_block(src)
        out = np.frombuffer(block, dtype=src.dtype, count=src.size)
        order = "F" if src.flags.f_contiguous and not src.flags.c_contiguous else "C"
        return out.reshape(src.shape, order=order)
    # numpy.copy's layout (order "K": the source's axis order, packed); empty_like only
    # reserves address space for it, which is freed untouched.
    strides = np.empty_like(src, order="K").strides
    block = _advm.empty_block(src.nbytes)
    out = np.ndarray(src.shape, dtype=src.dtype, buffer=block, strides=strides)
    np.copyto(out, src)
    return out


def vcopy_stats() -> dict[str, Any]:
    """What this process's arena did so far, as a dict (the fields of Rust's
    ``advm::vcopy::Stats``; cumulative counts since the arena was made):

    - ``vcopies`` (copies of arena arrays, made virtual), ``pages_shared`` (pages those
      copies share instead of copying), ``bytes_copied`` (bytes of those copies copied
      after all: small ones, partial pages, fallbacks; a first copy of an array into the
      arena is not counted);
    - ``fallback_unaligned``, ``fallback_small``, ``fallback_vma_budget``: copies done
      by copying bytes, and why (not page-congruent, under ``small_block_pages``, over
      the VMA budget);
    - ``pages_rehomed``, ``pages_adopted``: written pages moved into fresh arena pages,
      and pages whose last view took its page over;
    - live now: ``blocks`` and ``block_bytes`` (arrays in the arena),
      ``memfd_pages_live`` and ``memfd_resident_bytes`` (memory the arena holds),
      ``memfds``, ``vmas`` and ``vma_budget``, ``deferred_pending`` (old mappings
      waiting to be unmapped) and ``deferred_unmap_ms`` (time spent unmapping them off
      the copy's path);
    - ``forks`` (forks the arena was frozen for), ``small_block_pages``,
      ``crossover_write_fraction`` (``None`` unless calibrated).

    Raises ``OSError`` when the arena cannot be made."""
    return json.loads(_advm.vcopy_stats_json())  # type: ignore[no-any-return]
