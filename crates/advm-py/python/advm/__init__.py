"""advm: application-directed virtual memory for Python.

- ``merge(obj)``: user-guided page merging of any buffer (bytes, memoryview, NumPy
  arrays): pages equal to ones in the store become copy-on-write mappings of the
  store's pages, so processes holding the same data (model weights) keep one copy.
  The store is advmd's for this uid ($ADVM_SOCKET, else /run/advm/advmd.sock), or this
  process's own when no daemon answers (the result's ``via`` says which, and why).
- ``stat(pid)``: the ``advm stat`` figures of a process (distinct physical pages, RSS,
  PSS, USS, KSM) as a dict.
- ``vcopy(array)``: a virtual copy of a NumPy array through advm's arena.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TypedDict

from . import _advm

if TYPE_CHECKING:
    import numpy

__all__ = ["merge", "stat", "vcopy", "vcopy_stats", "MergeStats", "__version__"]
__version__: str = _advm.__version__


class MergeStats(TypedDict):
    """What one merge did."""

    merged: int
    """Pages now mapping a page the store already held (or one an earlier, equal page
    of the same range added)."""
    added: int
    """Pages added to the store, one per distinct new page (the next process shares
    them)."""
    skipped: int
    """Pages left alone: partial end pages, zero pages, refused or mismatched pages."""
    refused: int
    """Of ``skipped``: pages the store refused because it reached its byte limit."""
    refusal: str | None
    """The store's reason when it refused pages."""
    bytes: int
    """Bytes of the buffer."""
    seconds: float
    """Time the merge took."""
    phases: dict[str, float]
    """Where that time went, seconds: ``fence`` (checking and write-protecting the
    range), ``hash`` (this process hashing its pages), ``lookup`` (asking the store,
    including waits for pages other processes are adding), ``add`` (handing new pages
    over), ``map`` (mapping store pages over the buffer)."""
    via: str
    """``"daemon"`` (advmd's store for this uid) or ``"local"`` (this process's own)."""
    via_detail: str
    """The daemon's socket, or why the daemon was not used."""


def merge(obj: Any) -> MergeStats:
    """Merge the full pages of ``obj`` (any C- or Fortran-contiguous buffer).

    The content seen by the process never changes; writes after the merge go to a
    private copy. A non-contiguous buffer is refused by its exporter (NumPy raises
    ``ValueError``, others ``BufferError``); memory that is not private anonymous (a
    file mapping, shared memory) raises ``ValueError`` naming the mapping.
    """
    return _advm.merge(obj)  # type: ignore[no-any-return]


def stat(pid: int) -> dict[str, Any]:
    """The ``advm stat`` figures of process ``pid`` (needs permission to read its
    /proc files: the same user, or root).

    Raises ``ProcessLookupError`` when no process ``pid`` exists (or it exits while
    measured, or is a zombie) and ``PermissionError`` when its files may not be read; both are
    ``OSError``s. A kernel thread (no user memory) raises ``ValueError``."""
    return json.loads(_advm.stat_json(pid))  # type: ignore[no-any-return]


def vcopy(array: numpy.ndarray) -> numpy.ndarray:
    """A virtual copy of a contiguous NumPy array, living in advm's arena.

    Copying an array that already lives in the arena (the result of an earlier
    ``vcopy``) shares its pages copy-on-write instead of copying bytes; copying any
    other array copies its bytes once into the arena. The result is writable and
    independent of the source. The GIL is released while it copies (other threads
    run on), as during ``merge``. An array of Python objects (a dtype holding ``object``
    fields) raises ``TypeError``: its elements are references, not bytes.
    """
    import numpy as np

    src = np.asarray(array)
    if not (src.flags.c_contiguous or src.flags.f_contiguous):
        raise BufferError("vcopy needs a contiguous array (use numpy.ascontiguousarray first)")
    if src.dtype.hasobject:
        raise TypeError(
            f"vcopy cannot copy an array of Python objects (dtype {src.dtype}): "
            "its elements are references, not bytes (use array.copy())"
        )
    if src.nbytes == 0:
        return src.copy()
    block = _advm.vcopy_block(src)
    out = np.frombuffer(block, dtype=src.dtype, count=src.size)
    return out.reshape(src.shape, order="F" if src.flags.f_contiguous and not src.flags.c_contiguous else "C")


def vcopy_stats() -> dict[str, Any]:
    """What the arena did so far: copies made virtual, bytes not copied, fallbacks."""
    return json.loads(_advm.vcopy_stats_json())  # type: ignore[no-any-return]
