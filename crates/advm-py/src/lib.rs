//! The `advm` Python package's native part (`advm._advm`): merging any buffer,
//! measuring a process, and arena blocks for virtual copies. `python/advm/__init__.py`
//! wraps it with type hints and the NumPy conveniences.
//!
//! `unsafe` here is limited to the buffer protocol: borrowing a Python buffer's memory
//! for a merge, and lending an arena block's memory to Python.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::sync::OnceLock;

use advm::mem::HostAddr;
use advm::vcopy::Arena;
use pyo3::exceptions::{PyConnectionError, PyOSError, PyPermissionError, PyProcessLookupError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// advm's errors as Python's: a bad argument is a `ValueError`, a process that does
/// not exist a `ProcessLookupError`, one we may not read (or a privilege this user
/// lacks, such as a full userfaultfd to merge) a `PermissionError`, a daemon lost
/// mid-call a `ConnectionError` (all `OSError`s, as every other failure is).
fn to_py(e: advm::Error) -> PyErr {
    match e {
        advm::Error::InvalidArgument { .. } | advm::Error::KernelThread { .. } | advm::Error::DaemonRefused { .. } => {
            PyValueError::new_err(e.to_string())
        }
        advm::Error::NoSuchProcess { .. } | advm::Error::ProcessExited { .. } | advm::Error::Zombie { .. } => {
            PyProcessLookupError::new_err(e.to_string())
        }
        advm::Error::PermissionDenied { .. } | advm::Error::NeedsPrivilege { .. } => {
            PyPermissionError::new_err(e.to_string())
        }
        // advm's process-wide client connects again on the next call (`with_default`):
        // the message's "connect a new client" is for Rust callers who hold their own.
        advm::Error::Disconnected { .. } => PyConnectionError::new_err(format!(
            "{e} (the next advm.merge connects again: to advmd when one answers, else to a store of this \
             process's own)"
        )),
        _ => PyOSError::new_err(with_address_space_hint(e.to_string())),
    }
}

/// An allocation failure under `ulimit -v` says so: the arena (256 GiB) and the
/// process's own store (64 GiB) reserve address space up front, which such a limit
/// refuses however little memory the call needs.
fn with_address_space_hint(message: String) -> String {
    if !message.contains("Cannot allocate memory") {
        return message;
    }
    match address_space_limit() {
        Some(limit) => format!(
            "{message}; this process's address space is limited to {} MiB (ulimit -v, RLIMIT_AS), and advm \
             reserves address space up front (256 GiB for vcopy's arena, 64 GiB for merging without advmd): \
             lift the limit, or merge through advmd (ADVM_SOCKET), whose store a client maps at the daemon's \
             --domain-limit-mib (4096 by default)",
            limit >> 20
        ),
        None => message,
    }
}

/// The soft RLIMIT_AS in bytes, when one is set (read from /proc/self/limits).
fn address_space_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max address space"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// A borrowed view of a Python buffer, released on drop. Boxed: the exporter may point
/// into the struct itself (`PyBuffer_FillInfo` sets `shape` to `&len` and `strides` to
/// `&itemsize`), so it must not move once filled.
struct View(Box<std::mem::MaybeUninit<pyo3::ffi::Py_buffer>>);

impl View {
    /// A C- or Fortran-contiguous view: the exporter refuses a strided one
    /// (`BufferError`, NumPy's `ValueError`).
    fn contiguous(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::get(obj, pyo3::ffi::PyBUF_ANY_CONTIGUOUS)
    }

    /// Any view without suboffsets: contiguous, or strided with strides of any sign.
    fn strided(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::get(obj, pyo3::ffi::PyBUF_STRIDES)
    }

    fn get(obj: &Bound<'_, PyAny>, flags: c_int) -> PyResult<Self> {
        let mut raw = Box::new(std::mem::MaybeUninit::<pyo3::ffi::Py_buffer>::uninit());
        // SAFETY: `raw` is writable storage for a Py_buffer that stays where it is; the
        // exporter refuses a view it cannot give as `flags` ask.
        let r = unsafe { pyo3::ffi::PyObject_GetBuffer(obj.as_ptr(), raw.as_mut_ptr(), flags) };
        if r != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // Filled: released exactly once, by Drop.
        Ok(Self(raw))
    }

    fn buffer(&self) -> &pyo3::ffi::Py_buffer {
        // SAFETY: filled by the successful PyObject_GetBuffer that made this View.
        unsafe { self.0.assume_init_ref() }
    }

    fn addr(&self) -> usize {
        self.buffer().buf as usize
    }

    fn len(&self) -> usize {
        self.buffer().len.max(0) as usize
    }

    /// The memory the view's elements lie in, `(start, len)`: from its lowest byte to
    /// its highest (a strided view's span holds the bytes it steps over too, and a
    /// negative stride puts elements below `buf`).
    fn span(&self) -> PyResult<(usize, usize)> {
        let b = self.buffer();
        let ndim = b.ndim.max(0) as usize;
        if b.len <= 0 || b.shape.is_null() || b.strides.is_null() || ndim == 0 {
            return Ok((self.addr(), self.len()));
        }
        // SAFETY: with PyBUF_STRIDES the exporter fills `ndim` shapes and strides,
        // which live until the view is released (after this borrow).
        let (shape, strides) =
            unsafe { (std::slice::from_raw_parts(b.shape, ndim), std::slice::from_raw_parts(b.strides, ndim)) };
        let (mut lo, mut hi) = (0i128, b.itemsize as i128);
        for (&n, &stride) in shape.iter().zip(strides) {
            let reach = (n as i128 - 1) * stride as i128;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        let start = self.addr() as i128 + lo;
        match (usize::try_from(start), usize::try_from(hi - lo)) {
            (Ok(start), Ok(len)) if start.checked_add(len).is_some() => Ok((start, len)),
            _ => Err(PyValueError::new_err(format!(
                "a buffer whose shape {shape:?} and strides {strides:?} reach outside the address space"
            ))),
        }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: obtained by PyObject_GetBuffer and released once; the GIL is held
        // wherever a View is dropped (it never leaves the call that made it).
        unsafe { pyo3::ffi::PyBuffer_Release(self.0.as_mut_ptr()) };
    }
}

fn stats_dict<'py>(py: Python<'py>, s: &advm::merge::MergeStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("merged", s.merged)?;
    d.set_item("added", s.added)?;
    d.set_item("skipped", s.skipped)?;
    d.set_item("refused", s.refused)?;
    d.set_item("refusal", s.refusal.clone())?;
    d.set_item("bytes", s.bytes)?;
    d.set_item("seconds", s.seconds)?;
    let phases = PyDict::new(py);
    let p = &s.phases;
    for (k, v) in [("fence", p.fence_s), ("hash", p.hash_s), ("lookup", p.lookup_s), ("add", p.add_s), ("map", p.map_s)]
    {
        phases.set_item(k, v)?;
    }
    d.set_item("phases", phases)?;
    let (via, why) = match &s.via {
        advm::merge::Via::Daemon { socket } => ("daemon", socket.clone()),
        advm::merge::Via::Local { reason } => ("local", reason.clone()),
    };
    d.set_item("via", via)?;
    d.set_item("via_detail", why)?;
    Ok(d)
}

/// Bytes a merge or a copy handles between two looks for a signal: Ctrl-C is raised
/// within about a tenth of a second at ~1 GB/s, not after a whole model (seconds).
const PIECE: usize = 128 << 20;

/// `[addr, addr+len)` cut at multiples of [`PIECE`] (page aligned, so no piece but the
/// first and last has a partial page); one empty piece for an empty range.
fn pieces(addr: usize, len: usize) -> impl Iterator<Item = (usize, usize)> {
    let end = addr + len;
    let mut at = addr;
    let mut first = true;
    std::iter::from_fn(move || {
        if at >= end && !std::mem::take(&mut first) {
            return None;
        }
        first = false;
        let next = ((at / PIECE + 1) * PIECE).min(end);
        let piece = (at, next - at);
        at = next;
        Some(piece)
    })
}

/// Merges the full pages of a buffer with the process-wide client (advmd, else the
/// process's own store), a piece at a time; returns the figures as a dict.
#[pyfunction]
fn merge<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    // A strided view merges the memory it spans: merging changes no byte, so the bytes
    // it steps over (its base array's) may be merged with it, and a page holding any of
    // its elements is merged whole either way.
    let view = View::strided(obj)?;
    let (start, len) = view.span()?;
    let py = obj.py();
    // The arena's pages are a shared mapping the merge would refuse with a message
    // naming no array; say what the buffer is instead.
    if let Some(Ok(a)) = ARENA.get() {
        if a.touches(HostAddr(start), len) {
            return Err(PyValueError::new_err(
                "merge of an array made by advm.vcopy: its pages live in the virtual-copy arena, which \
                 shares them with its copies already and cannot be merged (merge the array it was copied \
                 from, before copying)",
            ));
        }
    }
    let t0 = std::time::Instant::now();
    let mut total: Option<advm::merge::MergeStats> = None;
    for (i, (addr, len)) in pieces(start, len).enumerate() {
        // Between pieces: a signal's handler (KeyboardInterrupt) runs now. The pieces
        // merged so far stay merged; merging never changes the bytes.
        if i > 0 {
            py.check_signals()?;
        }
        // The GIL is released so other threads run on; one that writes the buffer
        // waits at the merge's write fence and its write lands afterwards.
        let s = py
            // SAFETY: the view keeps the buffer's memory alive and mapped until it is
            // released after this call; this thread does not write it meanwhile.
            .allow_threads(|| unsafe { advm::merge::merge_raw(addr, len) })
            .map_err(to_py)?;
        match &mut total {
            None => total = Some(s),
            Some(t) => t.add(s),
        }
    }
    drop(view);
    let mut s = total.expect("pieces yields at least one piece");
    s.seconds = t0.elapsed().as_secs_f64();
    stats_dict(py, &s)
}

/// Lets go of the store pages the process-wide client holds that no process maps any
/// more (`advm::merge::trim`); returns the figures as a dict.
#[pyfunction]
fn trim(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    // It reads every process's maps: other threads run on meanwhile.
    let t = py.allow_threads(advm::merge::trim).map_err(to_py)?;
    let d = PyDict::new(py);
    d.set_item("released", t.released)?;
    d.set_item("kept", t.kept)?;
    d.set_item("seconds", t.seconds)?;
    Ok(d)
}

/// The `advm stat` figures of processes measured together (pages they share count
/// once), as a JSON text (the wrapper parses it).
#[pyfunction]
fn stat_json(py: Python<'_>, pids: Vec<i32>) -> PyResult<String> {
    let sample = py.allow_threads(|| advm::stats::measure(&pids, advm::stats::Options::default())).map_err(to_py)?;
    serde_json::to_string(&sample).map_err(|e| PyValueError::new_err(e.to_string()))
}

static ARENA: OnceLock<Result<Arena, String>> = OnceLock::new();

fn arena() -> PyResult<&'static Arena> {
    // Made under the fork gate (as the C API's): a fork by another thread during the
    // first call would leave the child's copy of the once-lock "being made" for ever.
    let made = ARENA.get().unwrap_or_else(|| {
        let _gate = advm::vcopy::ForkGate::hold();
        ARENA.get_or_init(|| Arena::new().map_err(|e| e.to_string()))
    });
    made.as_ref().map_err(|e| PyOSError::new_err(with_address_space_hint(e.clone())))
}

/// A block of the process's virtual-copy arena, freed when the last reference goes.
/// Exposes its bytes, writable, through the buffer protocol.
#[pyclass(module = "advm._advm")]
struct Block {
    addr: HostAddr,
    len: usize,
}

#[pymethods]
impl Block {
    /// Bytes in the block.
    fn __len__(&self) -> usize {
        self.len
    }

    unsafe fn __getbuffer__(slf: PyRefMut<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let (addr, len) = (slf.addr.0, slf.len);
        // SAFETY: the block stays allocated while the exporter object lives, and the
        // view holds a reference to it; PyBuffer_FillInfo checks `flags`.
        let r = unsafe { pyo3::ffi::PyBuffer_FillInfo(view, slf.as_ptr(), addr as *mut _, len as isize, 0, flags) };
        if r != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Ok(a) = arena() {
            let _ = a.free(self.addr);
        }
    }
}

/// A virtual copy of a buffer in the arena: when the source is itself an arena block,
/// its pages are shared copy-on-write; otherwise the bytes are copied once into a new
/// block (whose own copies are then virtual).
#[pyfunction]
fn vcopy_block(obj: &Bound<'_, PyAny>) -> PyResult<Block> {
    let view = View::contiguous(obj)?;
    let (addr, len) = (view.addr(), view.len());
    if len == 0 {
        return Err(PyValueError::new_err("vcopy of an empty buffer"));
    }
    let a = arena()?;
    let src = HostAddr(addr);
    let py = obj.py();
    // The GIL is released for the copy (seconds for a few GiB): other threads run on,
    // as during a NumPy copy. The view keeps the source's memory alive meanwhile.
    if a.touches(src, len) {
        let dst = py.allow_threads(|| a.dup(src, len)).map_err(to_py)?;
        drop(view);
        return Ok(Block { addr: dst, len });
    }
    // Copied a piece at a time, a signal (Ctrl-C) raised between pieces; the block
    // owns the memory from here, so an interrupted copy frees it.
    let block = Block { addr: a.alloc(len).map_err(to_py)?, len };
    for (i, (from, n)) in pieces(addr, len).enumerate() {
        if i > 0 {
            py.check_signals()?;
        }
        let to = HostAddr(block.addr.0 + (from - addr));
        // SAFETY: the view keeps `len` readable bytes at `addr` for this call.
        let bytes = unsafe { std::slice::from_raw_parts(from as *const u8, n) };
        py.allow_threads(|| a.write(to, bytes)).map_err(to_py)?;
    }
    drop(view);
    Ok(block)
}

/// A new arena block of `len` bytes for the caller to fill (`vcopy` of a strided view
/// gathers its elements into it).
#[pyfunction]
fn empty_block(len: usize) -> PyResult<Block> {
    if len == 0 {
        return Err(PyValueError::new_err("an arena block of 0 bytes"));
    }
    let addr = arena()?.alloc(len).map_err(to_py)?;
    Ok(Block { addr, len })
}

/// What the arena did so far (virtual copies, fallbacks), as JSON.
#[pyfunction]
fn vcopy_stats_json() -> PyResult<String> {
    serde_json::to_string(&arena()?.stats()).map_err(|e| PyValueError::new_err(e.to_string()))
}

#[pymodule]
fn _advm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(merge, m)?)?;
    m.add_function(wrap_pyfunction!(trim, m)?)?;
    m.add_function(wrap_pyfunction!(stat_json, m)?)?;
    m.add_function(wrap_pyfunction!(vcopy_block, m)?)?;
    m.add_function(wrap_pyfunction!(empty_block, m)?)?;
    m.add_function(wrap_pyfunction!(vcopy_stats_json, m)?)?;
    m.add_class::<Block>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("__source_id__", advm::SOURCE_ID)?;
    Ok(())
}
