//! [`Batch`]: queued moves and swaps, checked, merged and planned before the first
//! change, then run step by step (and the single-operation entry points).

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Move,
    Swap,
}

/// One queued operation: a move `dst <- src` or a swap `a <-> b` (a = `x`, b = `y`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Op {
    pub(crate) kind: Kind,
    pub(crate) x: usize,
    pub(crate) y: usize,
    pub(crate) len: usize,
    /// Copy bytes (memmove engine) whatever the options say.
    pub(crate) copy: bool,
}

/// Many moves and swaps executed together, in order, with as few kernel calls as the
/// kernel allows (the paper's aggregation):
///
/// - operations whose both ends continue the previous one are merged into one;
/// - all destinations that must be emptied are emptied with one vectored
///   `process_madvise(MADV_DONTNEED)` (one TLB flush), except where an earlier
///   operation of the batch wrote there, which is emptied just before its turn;
/// - destinations that an earlier page move of the batch already vacated are not
///   emptied at all (the compaction pattern: each object moves into the space the
///   previous one left);
/// - then one UFFDIO_MOVE (or mremap) per remaining operation. A move whose ranges
///   overlap (a slide by δ pages) costs one call when sliding down; sliding up, n/δ
///   calls when n/δ ≤ 4, else two calls per 16 MiB through a scratch area (2n entry
///   moves). Page-table work is O(n+δ) either way: never a bounce copy of bytes.
///
/// The result is as if the operations ran one after another.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    ops: Vec<Op>,
    /// How to run it.
    pub options: Options,
}

impl Batch {
    /// An empty batch with default options.
    pub fn new() -> Self {
        Self::default()
    }
    /// An empty batch with `options`.
    pub fn with_options(options: Options) -> Self {
        Self { ops: Vec::new(), options }
    }
    /// Queues a move of `len` bytes from `src` to `dst` (ranges may overlap).
    pub fn push_move(&mut self, dst: HostAddr, src: HostAddr, len: usize) -> &mut Self {
        self.ops.push(Op { kind: Kind::Move, x: dst.0, y: src.0, len, copy: false });
        self
    }
    /// Queues a swap of `len` bytes between `a` and `b` (ranges must not overlap).
    pub fn push_swap(&mut self, a: HostAddr, b: HostAddr, len: usize) -> &mut Self {
        self.ops.push(Op { kind: Kind::Swap, x: a.0, y: b.0, len, copy: false });
        self
    }
    /// As [`Batch::push_move`], but always done by copying bytes (memory whose mappings
    /// someone else keeps records of, such as a virtual-copy arena's blocks: see the
    /// module doc's *Memory owned by an allocator*).
    pub fn push_move_by_copy(&mut self, dst: HostAddr, src: HostAddr, len: usize) -> &mut Self {
        self.ops.push(Op { kind: Kind::Move, x: dst.0, y: src.0, len, copy: true });
        self
    }
    /// As [`Batch::push_swap`], but always done by swapping bytes.
    pub fn push_swap_by_copy(&mut self, a: HostAddr, b: HostAddr, len: usize) -> &mut Self {
        self.ops.push(Op { kind: Kind::Swap, x: a.0, y: b.0, len, copy: true });
        self
    }
    /// Queued operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }
    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    /// Forgets the queued operations (keeps the options).
    pub fn clear(&mut self) {
        self.ops.clear();
    }

    /// Runs the queued operations on memory `mem` grants. Nothing changes unless every
    /// operation's arguments are valid.
    pub fn execute(&self, mem: &mut MemGrant<'_>) -> Result<Outcome> {
        execute(mem, &self.ops, &self.options).map_err(|i| i.error)
    }

    /// As [`Batch::execute`], and on error says how far the batch got ([`Incomplete`]).
    pub fn execute_with_progress(&self, mem: &mut MemGrant<'_>) -> std::result::Result<Outcome, Box<Incomplete>> {
        execute(mem, &self.ops, &self.options)
    }
}

/// Moves `len` bytes from `src` to `dst` (page aligned; the ranges may overlap).
pub fn move_pages(mem: &mut MemGrant<'_>, dst: HostAddr, src: HostAddr, len: usize) -> Result<Outcome> {
    move_pages_with(mem, dst, src, len, &Options::default())
}

/// [`move_pages`] with explicit options.
pub fn move_pages_with(
    mem: &mut MemGrant<'_>,
    dst: HostAddr,
    src: HostAddr,
    len: usize,
    opts: &Options,
) -> Result<Outcome> {
    execute(mem, &[Op { kind: Kind::Move, x: dst.0, y: src.0, len, copy: false }], opts).map_err(|i| i.error)
}

/// Swaps the contents of `[a, a+len)` and `[b, b+len)` (page aligned, disjoint).
pub fn swap_pages(mem: &mut MemGrant<'_>, a: HostAddr, b: HostAddr, len: usize) -> Result<Outcome> {
    swap_pages_with(mem, a, b, len, &Options::default())
}

/// [`swap_pages`] with explicit options.
pub fn swap_pages_with(
    mem: &mut MemGrant<'_>,
    a: HostAddr,
    b: HostAddr,
    len: usize,
    opts: &Options,
) -> Result<Outcome> {
    execute(mem, &[Op { kind: Kind::Swap, x: a.0, y: b.0, len, copy: false }], opts).map_err(|i| i.error)
}

/// A step of a plan: an operation (possibly merged) with its engine.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    pub(crate) op: Op,
    pub(crate) engine: Engine,
    pub(crate) class: Class,
    /// Index after the last queued operation this step does.
    pub(crate) end: usize,
    /// Whether both ranges lie inside one VMA each, when validation already learnt it
    /// (a lone operation: in a batch, earlier steps may split VMAs).
    pub(crate) one_vma_each: Option<bool>,
}

pub(crate) fn validate(mem: &Grant<'_>, op: &Op, seen: &mut Vec<Vma>) -> Result<Class> {
    let (xn, yn) = match op.kind {
        Kind::Move => ("dst", "src"),
        Kind::Swap => ("a", "b"),
    };
    let x = PageRange::new(xn, op.x, op.len)?;
    let y = PageRange::new(yn, op.y, op.len)?;
    if op.kind == Kind::Swap && x.overlaps(&y) {
        return Err(Error::InvalidArgument {
            what: "b",
            why: format!(
                "swap of {:#x}+{:#x} with {:#x}+{:#x}: the ranges overlap (swap needs disjoint ranges; \
                 to slide a block within a region, move it)",
                op.x, op.len, op.y, op.len
            ),
        });
    }
    for (what, r) in [(xn, x), (yn, y)] {
        if r.start().0 < mem.start() || r.end().0 > mem.end() {
            return Err(Error::InvalidArgument {
                what,
                why: format!(
                    "range {:#x}+{:#x} is outside the granted memory {:#x}-{:#x}",
                    r.start().0,
                    r.len(),
                    mem.start(),
                    mem.end()
                ),
            });
        }
    }
    if op.len == 0 {
        return Ok(Class::AnonPrivate);
    }
    let cx = check_mapped(xn, op.x, op.len, mem.known(), seen)?;
    let cy = check_mapped(yn, op.y, op.len, mem.known(), seen)?;
    Ok(cx.max(cy))
}

/// True when `b` continues `a` on both ends and running them merged equals running
/// them in order.
pub(crate) fn mergeable(a: &Op, b: &Op) -> bool {
    if a.kind != b.kind
        || a.copy != b.copy
        || a.x.checked_add(a.len) != Some(b.x)
        || a.y.checked_add(a.len) != Some(b.y)
    {
        return false;
    }
    match a.kind {
        // a's destination must not be b's source (b would read what a wrote).
        Kind::Move => a.x + a.len <= b.y || a.x >= b.y + b.len,
        Kind::Swap => {
            let (lo, hi) = (a.x.min(a.y), a.x.max(a.y));
            lo + a.len + b.len <= hi
        }
    }
}

pub(crate) fn choose(op: &Op, class: Class, opts: &Options, be_pages: usize, have_uffd: bool) -> Result<Engine> {
    let overlap = op.x < op.y + op.len && op.y < op.x + op.len;
    let uffd = have_uffd && class == Class::AnonPrivate;
    let aligned = op.x % PMD_SIZE == 0 && op.y % PMD_SIZE == 0 && op.len % PMD_SIZE == 0 && op.len > 0;
    let mremap_ok = op.kind == Kind::Move && !overlap && class != Class::Shared;
    if op.copy {
        return Ok(Engine::Memmove);
    }
    match opts.engine {
        Choice::Only(Engine::Memmove) => Ok(Engine::Memmove),
        Choice::Only(Engine::UffdMove) if uffd => Ok(Engine::UffdMove),
        // The kernel has the engine but this range is not memory it moves: an argument
        // error (it said "not available on this kernel", which sent readers the wrong way).
        Choice::Only(Engine::UffdMove) if have_uffd => Err(Error::InvalidArgument {
            what: "engine",
            why: "UFFDIO_MOVE moves only private anonymous memory, and this range holds shared or file-backed \
                  mappings"
                .into(),
        }),
        Choice::Only(Engine::UffdMove) => Err(Error::Unsupported {
            what: "UFFDIO_MOVE",
            why: "needs Linux 6.8+ with userfaultfd (and write-protect) available to this process".into(),
        }),
        Choice::Only(Engine::Mremap) if mremap_ok => Ok(Engine::Mremap),
        Choice::Only(Engine::Mremap) => Err(Error::InvalidArgument {
            what: "engine",
            why: "the mremap engine moves disjoint ranges of private memory only (no swaps, no overlapping moves, \
                  no MAP_SHARED)"
                .into(),
        }),
        Choice::Auto => {
            if class == Class::Shared || op.len / page_size() < be_pages {
                Ok(Engine::Memmove)
            } else if mremap_ok && (aligned || !uffd) && mremap_budget_ok() {
                Ok(Engine::Mremap)
            } else if uffd {
                Ok(Engine::UffdMove)
            } else {
                Ok(Engine::Memmove)
            }
        }
    }
}

/// True when a UFFDIO_MOVE move slides up by a small δ, through the scratch area.
pub(crate) fn slides_up_via_scratch(op: &Op) -> bool {
    op.kind == Kind::Move && op.x > op.y && op.x < op.y + op.len && op.len / (op.x - op.y) > 4
}

pub(crate) fn execute(
    mem: &mut MemGrant<'_>,
    ops: &[Op],
    opts: &Options,
) -> std::result::Result<Outcome, Box<Incomplete>> {
    let mut out = Outcome { ops: ops.len(), ..Default::default() };
    let planned = plan(&mem.inner, ops, opts, &mut mem.seen, &mut out);
    // The mappings looked up so far change from here on.
    mem.seen.clear();
    match planned {
        Ok(steps) => run_plan(&mut mem.inner, ops.len(), &steps, opts, &mut out).map(|_| out),
        Err(error) => Err(Box::new(Incomplete { error, completed_ops: 0, memory_changed: false, outcome: out })),
    }
}

/// The planned steps of a batch, with what they need made; nothing changed yet.
pub(crate) struct Plan {
    pub(crate) steps: Vec<Step>,
    pub(crate) k: Option<&'static Userfaultfd>,
}

/// Checks every operation, merges, chooses engines and makes what the steps need
/// (scratch area) before the first change, so that arguments and resources can only
/// fail here.
pub(crate) fn plan(
    mem: &Grant<'_>,
    ops: &[Op],
    opts: &Options,
    seen: &mut Vec<Vma>,
    out: &mut Outcome,
) -> Result<Plan> {
    // 1. Check everything before changing anything (with the mappings the caller
    // already looked up through the grant, if any).
    let mut classes = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        classes.push(validate(mem, op, seen).map_err(|e| match e {
            // In a batch, say which operation: a compaction queues thousands.
            Error::InvalidArgument { what, why } if ops.len() > 1 => {
                Error::InvalidArgument { what, why: format!("operation {i} of a batch of {}: {why}", ops.len()) }
            }
            e => e,
        })?);
    }
    // 2. Merge continuing operations; each keeps the index after its last queued op.
    let mut merged: Vec<(Op, Class, usize)> = Vec::with_capacity(ops.len());
    for (i, (op, class)) in ops.iter().zip(classes).enumerate() {
        // Nothing to do: an empty range, or a move onto itself (it used to be copied).
        if op.len == 0 || (op.kind == Kind::Move && op.x == op.y) {
            continue;
        }
        if let Some((last, lc, end)) = merged.last_mut() {
            if opts.coalesce && mergeable(last, op) {
                last.len += op.len;
                *lc = (*lc).max(class);
                *end = i + 1;
                continue;
            }
        }
        merged.push((*op, class, i + 1));
    }
    out.merged_ops = merged.len();
    let k = uffd();
    let be_pages = opts.break_even_pages.unwrap_or_else(|| breakeven::break_even_pages().0);
    let mut steps = Vec::with_capacity(merged.len());
    for (op, class, end) in &merged {
        let engine = choose(op, *class, opts, be_pages, k.is_some())?;
        steps.push(Step { op: *op, engine, class: *class, end: *end, one_vma_each: None });
    }
    if let [st] = steps.as_mut_slice() {
        if mem.known() == Known::Unchecked {
            let inside_one = |a: usize| seen.iter().any(|v| v.start <= a && a + st.op.len <= v.end);
            st.one_vma_each = Some(inside_one(st.op.x) && inside_one(st.op.y));
        }
    }
    if let Some(k) = k {
        if steps
            .iter()
            .any(|st| st.engine == Engine::UffdMove && (st.op.kind == Kind::Swap || slides_up_via_scratch(&st.op)))
        {
            uffd_scratch_ready(k, out)?;
        }
    }
    Ok(Plan { steps, k })
}

pub(crate) fn run_plan(
    mem: &mut Grant<'_>,
    n_ops: usize,
    plan: &Plan,
    opts: &Options,
    out: &mut Outcome,
) -> std::result::Result<(), Box<Incomplete>> {
    let (steps, k) = (&plan.steps, plan.k);
    let stopped = |error: Error, completed_ops: usize, out: &Outcome| {
        Box::new(Incomplete { error, completed_ops, memory_changed: true, outcome: *out })
    };
    // A single operation needs no emptying plan: a UFFDIO_MOVE move does not empty its
    // destination first (it tries the move, free when the destination is empty, as
    // after an earlier move vacated it, and only empties it, or copies instead, when
    // the kernel finds pages there); the other engines replace the destination.
    if let [st] = steps.as_slice() {
        let state = if st.op.kind == Kind::Move && st.engine == Engine::UffdMove {
            DstState::Unknown {
                copy_below: match opts.engine {
                    Choice::Auto => opts.break_even_pages.unwrap_or_else(|| breakeven::break_even_pages().1),
                    Choice::Only(_) => 0,
                },
            }
        } else {
            DstState::Empty
        };
        run_step(k, mem, st, state, out).map_err(|e| stopped(e, 0, out))?;
        out.completed_ops = n_ops;
        return Ok(());
    }
    // 3. Plan which destinations to empty: up front (one vectored call) where no
    // earlier step touched them, just in time where an earlier step wrote there, and
    // not at all where an earlier page move left them empty.
    let mut touched = IntervalSet::default();
    let mut emptied = IntervalSet::default();
    let mut upfront: Vec<(usize, usize)> = Vec::new();
    // (step, start, end), in step order: flat, so a batch costs no allocation per step.
    let mut jit: Vec<(usize, usize, usize)> = Vec::new();
    for (i, st) in steps.iter().enumerate() {
        let Op { kind, x, y, len, .. } = st.op;
        if kind == Kind::Move && st.engine == Engine::UffdMove {
            // The part of the destination not covered by its own source (the ranges
            // have equal lengths, so it is one interval).
            let (s, e) = if y <= x && x < y + len {
                (y + len, x + len)
            } else if x < y && y < x + len {
                (x, y)
            } else {
                (x, x + len)
            };
            upfront.extend(touched.outside(s, e));
            for (ts, te) in touched.inside(s, e) {
                jit.extend(emptied.outside(ts, te).map(|(a, b)| (i, a, b)));
            }
        }
        touched.insert(x, x + len);
        touched.insert(y, y + len);
        match (kind, st.engine) {
            (Kind::Move, Engine::UffdMove | Engine::Mremap) => {
                emptied.insert(y, y + len);
                emptied.remove(x, x + len);
            }
            _ => {
                emptied.remove(x, x + len);
                emptied.remove(y, y + len);
            }
        }
    }
    // 4. Run. Intervals are (start, end); zap takes (start, len).
    if !upfront.is_empty() {
        let ranges: Vec<_> = upfront.iter().map(|&(s, e)| (s, e - s)).collect();
        out.syscalls += mem.zap(&ranges).map_err(|e| stopped(e.into(), 0, out))?;
    }
    let mut jit = jit.into_iter().peekable();
    let mut now: Vec<(usize, usize)> = Vec::new();
    for (i, st) in steps.iter().enumerate() {
        now.clear();
        while let Some(&(_, s, e)) = jit.peek().filter(|j| j.0 == i) {
            now.push((s, e - s));
            jit.next();
        }
        let r = if now.is_empty() { Ok(()) } else { mem.zap(&now).map(|c| out.syscalls += c).map_err(Error::from) };
        r.and_then(|_| run_step(k, mem, st, DstState::Empty, out)).map_err(|e| stopped(e, out.completed_ops, out))?;
        out.completed_ops = st.end;
    }
    out.completed_ops = n_ops;
    Ok(())
}
