//! Merging an unmodified program: the agent that `advm run --mode merge` starts inside
//! it (libadvm.so in `LD_PRELOAD`; its constructor calls [`start_from_env`]), and in
//! every child it forks (a `fork()` handler).
//!
//! The agent thread merges the process's large private anonymous mappings (the heap
//! and anonymous mmaps of at least `ADVM_MERGE_MIN_BYTES`, default 1 MiB; not stacks,
//! guard pages, shared or file-backed memory, mappings marked `MADV_WIPEONFORK`, nor
//! the agent's own memory) once the program has loaded: when its anonymous resident
//! memory has grown by at least `ADVM_MERGE_MIN_GROWTH` (default 32 MiB) since it
//! started or since the last merge, and then grown by less than 1 MiB for
//! `ADVM_MERGE_AFTER` seconds (default 2).
//! `advm merge PID` asks it to merge now through an abstract UNIX socket,
//! `@advm-merge/<pid>`, open to the same uid and root: a line `merge`, or `lookup`
//! for a merge that maps only pages the store already holds and adds none (cheap, for
//! a program still loading: `advm vm run --merge` sends it while the guest boots).
//!
//! Memory in use is merged chunk by chunk through a serviced fence
//! (`sys::merge_serviced`): a thread that writes a chunk while it is merged goes on at
//! once, and the page it wrote is simply not merged this time. Pages go to the
//! process-wide store ([`super::with_default`]): advmd when it answers, else this
//! process's own. All-zero pages the process holds are not stored but given back
//! under the same fence (a fresh anonymous mapping in their place, as `MADV_DONTNEED`
//! would leave them: they read as zeros and hold nothing until written), except in a
//! locked mapping. What replaces a mapping's pages gets its marks again (the code
//! [`Client::merge`] uses): `MADV_DONTFORK`,
//! `MADV_DONTDUMP`, the lock, and on anonymous memory huge page and KSM advice.
//!
//! A merge leaves merged memory mapped privately from the store's files, and the
//! program goes on writing some of those pages: each write makes a private anonymous
//! copy inside a store mapping. A later merge takes those copies too (only the present
//! anonymous pages there; the store's own pages are left as they are), and the pieces
//! of anonymous memory left between store mappings whatever their size.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use super::client::Landing;
use super::{Client, MergeStats};
use crate::mem::page_size;
use crate::sys::merge::{Locate, Marks, StoreMap, Target};
use crate::sys::merge_serviced::ServicedFence;
use crate::sys::pagemap::{self, Entry, Pagemap};
use crate::sys::procmap;
use crate::{Error, Result};

/// Environment variable that turns the agent on (any value); `advm run --mode merge` sets it.
pub const ENV_AGENT: &str = "ADVM_MERGE_AGENT";
/// Seconds of quiet (anonymous memory grown by less than 1 MiB) before merging.
pub const ENV_AFTER: &str = "ADVM_MERGE_AFTER";
/// Smallest mapping merged, bytes.
pub const ENV_MIN_BYTES: &str = "ADVM_MERGE_MIN_BYTES";
/// Growth of anonymous memory, bytes, that makes a quiet period worth a merge.
pub const ENV_MIN_GROWTH: &str = "ADVM_MERGE_MIN_GROWTH";
/// `0` turns the agent's trims off ([`super::Client::trim`]): the store keeps every
/// page the process was handed until it exits, as before trims.
pub const ENV_TRIM: &str = "ADVM_MERGE_TRIM";
/// A directory where the agent writes `<pid>.json`, the last merge's [`ProcessMerge`]
/// (after a quiet period or on request: `advm merge PID`) with `"totals"`, the
/// [`AgentTotals`] of all its merges so far (for benchmarks and `advm run --stats`;
/// unset: reported nowhere but to `advm merge`).
pub const ENV_REPORT_DIR: &str = "ADVM_MERGE_REPORT_DIR";

/// Chunk merged under one fence: small enough for a snapshot, large enough to batch
/// store requests.
const CHUNK_BYTES: usize = 4 << 20;
/// Growth below this counts as quiet.
const QUIET_BYTES: u64 = 1 << 20;

/// What merging a process's mappings did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ProcessMerge {
    /// Summed over every chunk (`bytes`: of the mappings merged).
    #[serde(flatten)]
    pub stats: MergeStats,
    /// Mappings merged.
    pub mappings: u64,
    /// Of `skipped`: pages written, unmapped or remapped while their chunk was merged.
    pub busy: u64,
    /// Of `skipped`: all-zero pages the process held (resident, not the shared zero
    /// page), given back.
    pub zero_dropped: u64,
    /// Why merging stopped early, if it did (e.g. the process's mapping budget).
    pub stopped: Option<String>,
}

/// What the agents' quiet-period merges did, summed (over one process's merges, or
/// over the processes of [`read_totals`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AgentTotals {
    /// Processes whose agent reported.
    pub processes: u64,
    /// Quiet-period merges run.
    pub merges: u64,
    /// Pages now mapping a page the store already held.
    pub merged: u64,
    /// Pages added to the store.
    pub added: u64,
    /// Pages left as they were (of them: `busy` and `zero_dropped`).
    pub skipped: u64,
    /// Of `skipped`: pages written, unmapped or remapped while being merged.
    pub busy: u64,
    /// Of `skipped`: all-zero pages given back.
    pub zero_dropped: u64,
    /// Bytes of the mappings merged.
    pub bytes: u64,
    /// Wall-clock seconds spent merging.
    pub seconds: f64,
    /// Trims run (after each merge, and when the program unmapped merged memory).
    #[serde(default)]
    pub trims: u64,
    /// Store pages the trims let go (the program no longer mapped them).
    #[serde(default)]
    pub released: u64,
    /// Wall-clock seconds spent trimming.
    #[serde(default)]
    pub trim_seconds: f64,
}

impl AgentTotals {
    /// Adds one merge of this process.
    pub fn add(&mut self, r: &ProcessMerge) {
        self.sum(&AgentTotals {
            processes: 0,
            merges: 1,
            merged: r.stats.merged,
            added: r.stats.added,
            skipped: r.stats.skipped,
            busy: r.busy,
            zero_dropped: r.zero_dropped,
            bytes: r.stats.bytes,
            seconds: r.stats.seconds,
            ..Default::default()
        });
        self.processes = 1;
    }

    /// Adds one trim of this process.
    pub fn add_trim(&mut self, t: &super::TrimStats) {
        self.trims += 1;
        self.released += t.released;
        self.trim_seconds += t.seconds;
    }

    fn sum(&mut self, o: &AgentTotals) {
        self.processes += o.processes;
        self.merges += o.merges;
        self.merged += o.merged;
        self.added += o.added;
        self.skipped += o.skipped;
        self.busy += o.busy;
        self.zero_dropped += o.zero_dropped;
        self.bytes += o.bytes;
        self.seconds += o.seconds;
        self.trims += o.trims;
        self.released += o.released;
        self.trim_seconds += o.trim_seconds;
    }
}

/// The totals of every agent that reported into `dir` ([`ENV_REPORT_DIR`]); zero when
/// none did (no quiet period came and nobody asked, or the agent was not started).
pub fn read_totals(dir: &std::path::Path) -> AgentTotals {
    #[derive(serde::Deserialize)]
    struct Report {
        totals: AgentTotals,
    }
    let mut sum = AgentTotals::default();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().extension().is_some_and(|x| x == "json") {
            if let Some(r) = std::fs::read(e.path()).ok().and_then(|b| serde_json::from_slice::<Report>(&b).ok()) {
                sum.sum(&r.totals);
            }
        }
    }
    sum
}

/// The agent's settings.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Quiet period.
    pub after: Duration,
    /// Smallest mapping merged.
    pub min_bytes: u64,
    /// Growth that makes a quiet period worth a merge.
    pub min_growth: u64,
}

impl Settings {
    /// From the `ADVM_MERGE_*` variables, defaults for unset ones.
    pub fn from_env() -> Result<Self> {
        let num = |name: &'static str, default: f64| -> Result<f64> {
            match std::env::var(name) {
                Err(_) => Ok(default),
                Ok(v) => v.trim().parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).ok_or_else(|| {
                    Error::InvalidArgument { what: name, why: format!("{v:?} is not a non-negative number") }
                }),
            }
        };
        Ok(Self {
            after: Duration::from_secs_f64(num(ENV_AFTER, 2.0)?.min(1e6)),
            min_bytes: num(ENV_MIN_BYTES, (1u64 << 20) as f64)? as u64,
            min_growth: num(ENV_MIN_GROWTH, (32u64 << 20) as f64)? as u64,
        })
    }
}

/// The control socket's name for process `pid` (abstract namespace). When another
/// process holds it already (abstract names are open to anyone), the agent binds
/// `<name>/<random>` instead, and [`request`] finds it among the process's own sockets.
pub fn socket_name(pid: u32) -> String {
    format!("advm-merge/{pid}")
}

/// The abstract name of the agent's listening socket in process `pid`: the socket among
/// the process's own descriptors (`/proc/PID/fd`) that listens under [`socket_name`] or
/// a name below it (`/proc/PID/net/unix`). None when that cannot be read (another
/// user's process) or no such socket is open there.
fn listening_name_in(pid: u32) -> Option<String> {
    let inodes: std::collections::HashSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).ok()?;
    let ours = format!("@{}", socket_name(pid));
    table.lines().skip(1).find_map(|line| {
        // Num RefCount Protocol Flags Type St Inode Path; Flags 00010000: listening
        let f: Vec<&str> = line.split_whitespace().collect();
        let (flags, inode, path) = (f.get(3)?, f.get(6)?.parse::<u64>().ok()?, f.get(7)?);
        let listening = u32::from_str_radix(flags, 16).ok()? & 0x0001_0000 != 0;
        let named = *path == ours || path.strip_prefix(ours.as_str()).is_some_and(|rest| rest.starts_with('/'));
        (listening && named && inodes.contains(&inode)).then(|| path[1..].to_string())
    })
}

/// Starts the agent thread when `ADVM_MERGE_AGENT` is set; reports a bad setting or a
/// kernel that cannot fence on stderr and starts nothing.
pub fn start_from_env() {
    if std::env::var_os(ENV_AGENT).is_none() {
        return;
    }
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => return eprintln!("advm merge agent: not started: {e}"),
    };
    if let Err(why) = ServicedFence::available() {
        return eprintln!("advm merge agent: not started: {why}");
    }
    let pid = std::process::id();
    let control = match Control::bind(pid) {
        Ok(c) => c,
        Err(e) => return eprintln!("advm merge agent: not started: control socket @{}: {e}", socket_name(pid)),
    };
    if let Err(e) = std::thread::Builder::new().name("advm-merge".into()).spawn(move || run(control, settings)) {
        return eprintln!("advm merge agent: not started: {e}");
    }
    // The thread does not come along into a forked child (a `multiprocessing` fork or
    // forkserver worker, an `mclapply` worker): each child starts its own. Registering
    // again (in the child) does nothing.
    if let Err(e) = crate::sys::process::at_fork(nothing, nothing, start_in_forked_child) {
        eprintln!("advm merge agent (pid {pid}): forked children will have no agent: {e}");
    }
}

extern "C" fn nothing() {}

/// Run by `fork()` in the child (not by `vfork`, `posix_spawn` or a raw clone, whose
/// children only `exec`, and the program they run starts its agent from the
/// environment): the child's own agent, control socket `@advm-merge/<child pid>`.
extern "C" fn start_in_forked_child() {
    // Never unwind into the program's fork().
    let _ = std::panic::catch_unwind(start_from_env);
}

/// The control socket, and its identity (device, inode) when it was bound. A program
/// may close descriptors it did not open (a daemon closing every one above stderr) and
/// get the number back for a socket of its own: the agent then accepted the program's
/// connections (and closed them). So each round first checks that the number is still
/// the agent's socket; when it is not, the number is forgotten (never closed: it is the
/// program's now) and the name bound again, so `advm merge PID` keeps working.
struct Control {
    listener: Option<UnixListener>,
    id: (u64, u64),
}

impl Control {
    fn bind(pid: u32) -> std::io::Result<Self> {
        let bound = |name: &str| UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes())?);
        let listener = match bound(&socket_name(pid)) {
            // Someone holds the plain name (bound first, before this process ran): a
            // name nobody can guess, which `request` finds through /proc/PID/fd.
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                let mut nonce = [0u8; 8];
                crate::sys::merge::random_bytes(&mut nonce).map_err(std::io::Error::other)?;
                bound(&format!("{}/{:016x}", socket_name(pid), u64::from_le_bytes(nonce)))?
            }
            other => other?,
        };
        listener.set_nonblocking(true)?;
        let id = crate::sys::merge::file_id(listener.as_fd()).map_err(std::io::Error::other)?;
        Ok(Self { listener: Some(listener), id })
    }

    /// Serves the requests waiting; their merges count in `totals` as the quiet
    /// period's do, and are followed by a trim.
    fn serve(&mut self, pid: u32, totals: &mut AgentTotals, trims: &mut Trims) {
        let Some(l) = &self.listener else { return };
        if !crate::sys::merge::file_id(l.as_fd()).is_ok_and(|id| id == self.id) {
            use std::os::fd::IntoRawFd;
            let _forgotten = self.listener.take().map(IntoRawFd::into_raw_fd);
            match Self::bind(pid) {
                Ok(c) => *self = c,
                Err(e) => {
                    return eprintln!(
                        "advm merge agent (pid {pid}): the program closed the control socket; binding @{} again: {e}",
                        socket_name(pid)
                    )
                }
            }
        }
        let Some(l) = &self.listener else { return };
        while let Ok((conn, _)) = l.accept() {
            if serve_request(conn, pid, totals) {
                trims.after_merge(pid, totals);
            }
        }
    }
}

/// The agent loop: answers requests, watches anonymous memory, merges when quiet.
fn run(mut control: Control, s: Settings) {
    let pid = std::process::id();
    let mut since = anon_resident().unwrap_or(0);
    let mut mark = since;
    let mut last_growth = Instant::now();
    let mut totals = AgentTotals::default();
    let on = std::env::var(ENV_TRIM).map_or(true, |v| v.trim() != "0");
    let mut trims = Trims { on, merged: false, checked: Instant::now(), mapped: 0 };
    // The last quiet-period merge, reported again with the totals after a later trim.
    let mut last = None;
    loop {
        // A forked child inherits no thread: this loop only ever runs in `pid`.
        control.serve(pid, &mut totals, &mut trims);
        if trims.tick(pid, &mut totals) {
            if let Some(r) = &last {
                report(pid, r, &totals);
            }
        }
        let Some(now) = anon_resident() else { return };
        if now > mark + QUIET_BYTES {
            mark = now;
            last_growth = Instant::now();
        }
        if mark >= since + s.min_growth && last_growth.elapsed() >= s.after {
            match merge_process(s.min_bytes) {
                Ok(r) => {
                    totals.add(&r);
                    trims.after_merge(pid, &mut totals);
                    report(pid, &r, &totals);
                    last = Some(r);
                }
                Err(e) => eprintln!("advm merge agent (pid {pid}): {e}"),
            }
            since = anon_resident().unwrap_or(0);
            mark = since;
            last_growth = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How often the agent looks whether the program let go of merged memory.
const TRIM_CHECK_EVERY: Duration = Duration::from_secs(1);

/// When the agent trims the process-wide client ([`super::trim`]): after each merge
/// (pages the program wrote and a merge mapped onto other store pages leave their old
/// ones), and when the bytes the process maps privately from the store's files have
/// shrunk since the last look (the program unmapped merged memory: R and NumPy free
/// large arrays with `munmap`). A trim reads every process's maps; the look, every
/// [`TRIM_CHECK_EVERY`], reads this process's only.
struct Trims {
    /// Whether trims are on ([`ENV_TRIM`]).
    on: bool,
    /// Whether this process has merged (before that there is nothing to trim).
    merged: bool,
    checked: Instant,
    /// Bytes mapped privately from store files at the last look.
    mapped: u64,
}

impl Trims {
    fn after_merge(&mut self, pid: u32, totals: &mut AgentTotals) {
        self.merged = self.on;
        if !self.on {
            return;
        }
        self.trim(pid, totals);
    }

    /// Looks, when it is time, and trims if merged memory went; whether it trimmed.
    fn tick(&mut self, pid: u32, totals: &mut AgentTotals) -> bool {
        if !self.merged || self.checked.elapsed() < TRIM_CHECK_EVERY {
            return false;
        }
        self.checked = Instant::now();
        match store_mapped_bytes() {
            Some(now) if now < self.mapped => {
                self.trim(pid, totals);
                true
            }
            Some(now) => {
                self.mapped = now;
                false
            }
            None => false,
        }
    }

    fn trim(&mut self, pid: u32, totals: &mut AgentTotals) {
        match super::trim() {
            Ok(t) => totals.add_trim(&t),
            // An advmd from before trims, or processes whose maps cannot be read: the
            // store keeps the pages until the process exits, as without trims.
            Err(e @ Error::Unsupported { .. }) => {
                eprintln!("advm merge agent (pid {pid}): no more trims: {e}");
                self.on = false;
                self.merged = false;
            }
            Err(e) => eprintln!("advm merge agent (pid {pid}): trim: {e}"),
        }
        self.mapped = store_mapped_bytes().unwrap_or(0);
        self.checked = Instant::now();
    }
}

/// Bytes this process maps privately from the process-wide client's store files.
fn store_mapped_bytes() -> Option<u64> {
    let maps = parse_maps(&std::fs::read_to_string("/proc/self/maps").ok()?);
    super::with_default(|c| {
        Ok(maps
            .iter()
            .filter(|m| !m.anonymous && m.perms.ends_with('p') && c.holds_inode(m.inode))
            .map(|m| (m.end - m.start) as u64)
            .sum())
    })
    .ok()
}

/// Writes `r` and `totals` to `$ADVM_MERGE_REPORT_DIR/<pid>.json` when that is set.
fn report(pid: u32, r: &ProcessMerge, totals: &AgentTotals) {
    let Some(dir) = std::env::var_os(ENV_REPORT_DIR) else { return };
    let path = std::path::Path::new(&dir).join(format!("{pid}.json"));
    let mut v = serde_json::to_value(r).unwrap_or_default();
    v["totals"] = serde_json::to_value(totals).unwrap_or_default();
    if let Err(e) = std::fs::write(&path, v.to_string()) {
        eprintln!("advm merge agent (pid {pid}): writing {}: {e}", path.display());
    }
}

/// One request: a line `merge`, answered with one JSON line; a merge it runs is
/// added to `totals` and reported (`advm run --stats` counts it). Whether it merged.
fn serve_request(conn: UnixStream, pid: u32, totals: &mut AgentTotals) -> bool {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let allowed = crate::sys::fdpass::peer_credentials(&conn)
        .map(|(uid, _, _)| uid == 0 || uid == crate::sys::euid())
        .unwrap_or(false);
    let mut line = String::new();
    let reply = if !allowed {
        serde_json::json!({"ok": false, "error": "only the same uid or root may ask this process to merge"})
    } else if BufReader::new(&conn).read_line(&mut line).is_err() || !matches!(line.trim(), "merge" | "lookup") {
        serde_json::json!({"ok": false, "error": format!("unknown request {:?} (expected \"merge\" or \"lookup\")", line.trim())})
    } else {
        let min_bytes = Settings::from_env().map(|s| s.min_bytes).unwrap_or(1 << 20);
        match merge_process_with(min_bytes, line.trim() == "merge") {
            Ok(r) => {
                totals.add(&r);
                report(pid, &r, totals);
                let mut v = serde_json::to_value(&r).unwrap_or_default();
                v["ok"] = true.into();
                v
            }
            Err(e) => serde_json::json!({"ok": false, "error": e.to_string()}),
        }
    };
    let _ = (&conn).write_all(format!("{reply}\n").as_bytes());
    reply["ok"] == true
}

/// Resident anonymous memory of this process (`/proc/self/statm`: resident - shared).
fn anon_resident() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/statm").ok()?;
    let f: Vec<u64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    Some(f.get(1)?.saturating_sub(*f.get(2)?) * page_size() as u64)
}

/// A mapping line of `/proc/self/maps` the agent cares about.
#[derive(Debug, Clone, PartialEq)]
struct MapLine {
    start: usize,
    end: usize,
    perms: String,
    anonymous: bool,
    inode: u64,
    name: String,
}

fn parse_maps(text: &str) -> Vec<MapLine> {
    text.lines()
        .filter_map(procmap::parse_named)
        .map(|(v, name)| MapLine {
            start: v.start,
            end: v.end,
            perms: v.perms(),
            anonymous: !v.file_backed,
            inode: v.inode,
            name: name.to_string(),
        })
        .collect()
}

/// A mapping to merge, and whether it is one of the store's (mapped by an earlier
/// merge: only its present anonymous pages, copies the program wrote, are merged).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Candidate {
    start: usize,
    end: usize,
    store: bool,
}

/// The mappings to merge: private anonymous read-write ones (unnamed or `[heap]`) of
/// at least `min_bytes`, or of any size right beside a store mapping (a piece of a
/// mapping an earlier merge split), and private read-write mappings of a store file
/// (`is_store(inode)`); except thread stacks (an anonymous mapping right above a guard
/// of at most 16 pages) and mappings holding any address in `exclude`.
fn candidates(maps: &[MapLine], min_bytes: u64, exclude: &[usize], is_store: &dyn Fn(u64) -> bool) -> Vec<Candidate> {
    let ps = page_size();
    let store = |m: &MapLine| !m.anonymous && m.perms == "rw-p" && is_store(m.inode);
    let mut out = Vec::new();
    for (k, m) in maps.iter().enumerate() {
        let beside_store = (k > 0 && maps[k - 1].end == m.start && store(&maps[k - 1]))
            || maps.get(k + 1).is_some_and(|n| n.start == m.end && store(n));
        let anonymous = m.anonymous
            && m.perms == "rw-p"
            && (m.name.is_empty() || m.name == "[heap]")
            && ((m.end - m.start) as u64 >= min_bytes.max(ps as u64) || beside_store);
        let stack = k > 0 && {
            let g = &maps[k - 1];
            g.end == m.start && g.perms == "---p" && g.anonymous && g.end - g.start <= 16 * ps
        };
        let own = exclude.iter().any(|&a| m.start <= a && a < m.end);
        if (anonymous || store(m)) && !stack && !own {
            out.push(Candidate { start: m.start, end: m.end, store: !anonymous });
        }
    }
    out
}

/// Merges this process's large private anonymous mappings now (see the module doc),
/// with the process-wide client.
pub fn merge_process(min_bytes: u64) -> Result<ProcessMerge> {
    merge_process_with(min_bytes, true)
}

/// [`merge_process`], or with `add_new` false a lookup-only merge: pages the store
/// already holds are mapped from it (and all-zero pages given back), pages new to the
/// store stay where they are (counted in `skipped`) and the store does not grow.
pub fn merge_process_with(min_bytes: u64, add_new: bool) -> Result<ProcessMerge> {
    let t0 = Instant::now();
    let mut fence = ServicedFence::new(CHUNK_BYTES).map_err(Error::Sys)?;
    let here = 0u8;
    let mut exclude = fence.own_addresses().to_vec();
    exclude.push(&here as *const u8 as usize);
    exclude.push(&super::DEFAULT as *const _ as usize);
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| Error::Sys(crate::sys::SysError::from_io("read(/proc/self/maps)", &e)))?;
    let maps = parse_maps(&maps);
    let flags = std::fs::read_to_string("/proc/self/smaps").map(|t| vm_flags(&t)).unwrap_or_default();
    let zeros = HeldPages { pagemap: Pagemap::open("self").ok(), zero_pfn: pagemap::zero_pfn() };
    let budget = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|t| t.trim().parse::<usize>().ok())
        .unwrap_or(65530)
        / 2;
    let ps = page_size();
    super::with_default(|c| {
        let todo = candidates(&maps, min_bytes, &exclude, &|inode| c.holds_inode(inode));
        let mut r = ProcessMerge {
            stats: MergeStats {
                merged: 0,
                added: 0,
                skipped: 0,
                refused: 0,
                refusal: None,
                bytes: 0,
                seconds: 0.0,
                phases: Default::default(),
                via: c.via().clone(),
            },
            mappings: 0,
            busy: 0,
            zero_dropped: 0,
            stopped: None,
        };
        'maps: for &Candidate { start, end, store } in &todo {
            let marks = flags.get(&start).map_or_else(Marks::default, |f| Marks::from_vm_flags(f));
            if marks.wipe_on_fork {
                // A store mapping cannot be wiped on fork: merged, a forked child would
                // read the parent's bytes (glibc's arc4random state is so marked).
                continue;
            }
            let mut counted = false;
            let mut a = start;
            while a < end {
                let mut len = (end - a).min(CHUNK_BYTES);
                // In a store mapping only the program's own copies: the stretch from
                // the first to the last present anonymous page of this chunk.
                let only = if store {
                    let Some(own) = zeros.anonymous_of(a, len / ps) else { break };
                    let (Some(first), Some(last)) = (own.iter().position(|&o| o), own.iter().rposition(|&o| o)) else {
                        a += len;
                        continue;
                    };
                    let next = a + len;
                    a += first * ps;
                    len = (last + 1 - first) * ps;
                    Some((own[first..=last].to_vec(), next))
                } else {
                    None
                };
                if !counted {
                    counted = true;
                    r.mappings += 1;
                    r.stats.bytes += (end - start) as u64;
                }
                if procmap::vma_count().unwrap_or(0) >= budget {
                    r.stopped = Some(format!("the process has {budget} mappings, half of vm.max_map_count"));
                    break 'maps;
                }
                let chunk =
                    Chunk { addr: a, len, marks, zeros: &zeros, add_new, only: only.as_ref().map(|o| &o.0[..]) };
                match merge_chunk(c, &mut fence, chunk, &mut r) {
                    // A store file the fence cannot protect (an adopted file that is not
                    // shmem): its copies stay as they are.
                    Err(Error::Sys(_)) if store => r.stats.skipped += (len / ps) as u64,
                    other => other?,
                }
                a = only.map_or(a + len, |o| o.1);
            }
        }
        r.stats.seconds = t0.elapsed().as_secs_f64();
        Ok(r)
    })
}

/// The `VmFlags` of each mapping in /proc/PID/smaps text, by its start address.
pub(super) fn vm_flags(smaps: &str) -> std::collections::HashMap<usize, String> {
    let mut out = std::collections::HashMap::new();
    let mut start = None;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(s) = start.take() {
                out.insert(s, flags.trim().to_string());
            }
        } else if let Some((m, _)) = procmap::parse_named(line) {
            start = Some(m.start);
        }
    }
    out
}

/// Which pages hold memory of their own (present, and not the shared zero page), from
/// this process's pagemap; every page when it cannot be read.
struct HeldPages {
    pagemap: Option<Pagemap>,
    zero_pfn: Option<u64>,
}

impl HeldPages {
    /// The pagemap entries of the `n` pages from `addr`; None when they cannot be read.
    fn entries(&self, addr: usize, n: usize) -> Option<Vec<Entry>> {
        let mut e = vec![0u64; n];
        let p = self.pagemap.as_ref()?;
        p.read((addr / page_size()) as u64, &mut e).ok().filter(|&got| got == n)?;
        Some(e.into_iter().map(Entry).collect())
    }

    fn of(&self, addr: usize, n: usize) -> Vec<bool> {
        match self.entries(addr, n) {
            Some(e) => e.iter().map(|x| x.present() && (self.zero_pfn.is_none() || x.pfn() != self.zero_pfn)).collect(),
            None => vec![true; n],
        }
    }

    /// Which pages are present anonymous pages (in a private file mapping: copies the
    /// program wrote), from this process's pagemap; None when it cannot be read.
    fn anonymous_of(&self, addr: usize, n: usize) -> Option<Vec<bool>> {
        Some(self.entries(addr, n)?.iter().map(|x| x.present() && !x.file_or_shared()).collect())
    }
}

/// One chunk of a candidate mapping, and what it needs besides the fence.
struct Chunk<'a> {
    addr: usize,
    len: usize,
    /// The mapping's marks, set again on what replaces its pages.
    marks: Marks,
    zeros: &'a HeldPages,
    /// Whether pages new to the store are added (false: a lookup-only merge).
    add_new: bool,
    /// In a store mapping, the pages that may be merged (the program's copies); the
    /// others are left as they are. None: every page.
    only: Option<&'a [bool]>,
}

/// Merges one chunk under the fence.
#[allow(unsafe_code)] // the chunk comes from this process's own maps: protect's contract
fn merge_chunk(c: &mut Client, fence: &mut ServicedFence, chunk: Chunk<'_>, r: &mut ProcessMerge) -> Result<()> {
    let ps = page_size();
    let (addr, len) = (chunk.addr, chunk.len);
    let n = len / ps;
    let t0 = Instant::now();
    // SAFETY: `addr..addr+len` lies in one of this process's mappings (read from
    // /proc/self/maps; if it has gone, protect reports it), and this thread writes it
    // only by accident (its allocations), which the servicer absorbs.
    let protected = unsafe { fence.protect(addr, len) }.map_err(Error::Sys)?;
    // Protecting the chunk and taking its snapshot.
    r.stats.phases.fence_s += t0.elapsed().as_secs_f64();
    if !protected {
        r.stats.skipped += n as u64;
        r.busy += n as u64;
        return Ok(());
    }
    let before = r.stats.phases;
    let result = plan_and_map(c, fence, &chunk, r);
    fence.lift();
    // The map phase is what the chunk took beyond the others (as Client::merge counts).
    let p = &mut r.stats.phases;
    let others = (p.fence_s - before.fence_s)
        + (p.hash_s - before.hash_s)
        + (p.lookup_s - before.lookup_s)
        + (p.add_s - before.add_s);
    p.map_s += (t0.elapsed().as_secs_f64() - others).max(0.0);
    result
}

/// Notes where a snapshot's new pages landed; they are mapped with the others, each
/// where it was not written since the snapshot.
struct Noted<'a> {
    snap: &'a [u8],
    targets: Vec<(usize, Option<Target>)>,
}

impl Landing for Noted<'_> {
    fn bytes(&self) -> &[u8] {
        self.snap
    }

    fn landed(&mut self, which: &[usize], targets: &[Option<Target>], _: &StoreMap, _: Locate<'_>) -> Result<()> {
        self.targets.extend(which.iter().copied().zip(targets.iter().copied()));
        Ok(())
    }
}

fn plan_and_map(c: &mut Client, fence: &mut ServicedFence, chunk: &Chunk<'_>, r: &mut ProcessMerge) -> Result<()> {
    let ps = page_size();
    let (addr, n) = (chunk.addr, chunk.len / ps);
    let snap = fence.snapshot();
    let t = Instant::now();
    let (mut want, mut hashes) = c.backend.hasher().hash_nonzero(snap);
    r.stats.phases.hash_s += t.elapsed().as_secs_f64();
    if let Some(only) = chunk.only {
        let (w, h): (Vec<usize>, Vec<u64>) = want.iter().zip(&hashes).filter(|&(&i, _)| only[i]).unzip();
        (want, hashes) = (w, h);
    }
    r.stats.skipped += (n - want.len()) as u64;
    let mut landing = Noted { snap, targets: Vec::new() };
    let resolved = c.backend.resolve(&mut landing, &want, &hashes, chunk.add_new)?;
    r.stats.phases.lookup_s += resolved.lookup_s;
    r.stats.phases.add_s += resolved.add_s;
    if resolved.refusal.is_some() {
        r.stats.refusal = resolved.refusal;
    }
    r.stats.skipped += resolved.not_added as u64;
    // (target, whether it is new to the store)
    let mut target: Vec<Option<(Target, bool)>> = vec![None; n];
    for (&i, slot) in want.iter().zip(&resolved.found) {
        target[i] = slot.map(|s| (Target::Candidate(s), false));
    }
    for (i, slot) in landing.targets {
        match slot {
            Some(t) => target[i] = Some((t, true)),
            None => {
                r.stats.refused += 1;
                r.stats.skipped += 1;
            }
        }
    }
    let view = c.backend.view();
    let store_pages = view.len() / ps;
    view.populate_slots(target.iter().map(|t| match t {
        Some((Target::Candidate(s), _)) => Some(*s),
        _ => None,
    }))
    .map_err(Error::Sys)?;
    // A vouched page was copied from (or compared with) this snapshot by the store,
    // and only pages unwritten since the snapshot are mapped.
    let equal: Vec<Option<(u32, bool)>> = target
        .iter()
        .enumerate()
        .map(|(i, t)| match *t {
            Some((Target::Candidate(s), new)) => ((s as usize) < store_pages
                && snap[i * ps..(i + 1) * ps] == *view.read(s as usize * ps, ps))
            .then_some((s, new)),
            Some((Target::Vouched(s), new)) => ((s as usize) < store_pages).then_some((s, new)),
            None => None,
        })
        .collect();
    for (i, t) in target.iter().enumerate() {
        if t.is_some() && equal[i].is_none() {
            r.stats.skipped += 1;
        }
    }
    let backend = &*c.backend;
    let writable = procmap::query(addr).ok().flatten().is_some_and(|v| v.writable);
    // Under the fence's lock: the range must still be one private mapping, anonymous or
    // the store's, with the writability it had.
    let check = |a: usize, l: usize| {
        procmap::query(a).ok().flatten().is_some_and(|v| {
            v.start <= a
                && a + l <= v.end
                && !v.shared
                && v.readable
                && v.writable == writable
                && (!v.file_backed || c.holds_inode(v.inode))
        })
    };
    let mut mapped = vec![false; n];
    let mut i = 0;
    while i < n {
        let Some((s, _)) = equal[i] else {
            i += 1;
            continue;
        };
        let Some((fd, offset, left)) = backend.locate(s) else {
            r.stats.skipped += 1;
            i += 1;
            continue;
        };
        let mut k = 1;
        while i + k < n && k < left as usize && equal[i + k].is_some_and(|(t, _)| t == s + k as u32) {
            k += 1;
        }
        let mapped = &mut mapped[..k];
        mapped.fill(false);
        fence.map_unwritten(i, k, writable, fd, offset, chunk.marks, &check, mapped).map_err(Error::Sys)?;
        for (e, &m) in equal[i..i + k].iter().zip(mapped.iter()) {
            match (m, e.is_some_and(|(_, new)| new)) {
                (true, true) => r.stats.added += 1,
                (true, false) => r.stats.merged += 1,
                (false, _) => {
                    r.stats.skipped += 1;
                    r.busy += 1;
                }
            }
        }
        i += k;
    }
    if chunk.marks.locked {
        // The program asked these pages to stay resident, zeros or not.
        return Ok(());
    }
    drop_zero_pages(fence, chunk, &want, writable, &check, r)
}

/// Gives back the chunk's all-zero pages (those `hash_nonzero` left out of `nonzero`)
/// in runs that hold any memory, unless written meanwhile.
fn drop_zero_pages(
    fence: &mut ServicedFence,
    chunk: &Chunk<'_>,
    nonzero: &[usize],
    writable: bool,
    check: &dyn Fn(usize, usize) -> bool,
    r: &mut ProcessMerge,
) -> Result<()> {
    let n = chunk.len / page_size();
    let mut zero = chunk.only.map_or_else(|| vec![true; n], <[bool]>::to_vec);
    for &i in nonzero {
        zero[i] = false;
    }
    let held = chunk.zeros.of(chunk.addr, n);
    let mut dropped = vec![false; n];
    let mut i = 0;
    while i < n {
        if !zero[i] {
            i += 1;
            continue;
        }
        let mut k = 1;
        while i + k < n && zero[i + k] {
            k += 1;
        }
        if held[i..i + k].iter().any(|&h| h) {
            let d = &mut dropped[i..i + k];
            fence.drop_unwritten_zeros(i, k, writable, chunk.marks, check, d).map_err(Error::Sys)?;
            r.zero_dropped += d.iter().zip(&held[i..i + k]).filter(|&(&d, &h)| d && h).count() as u64;
        }
        i += k;
    }
    Ok(())
}

/// Asks process `pid`'s agent to merge now and returns its reply (a JSON object with
/// `ok`); a clear error when `pid` does not run under `advm run --mode merge`.
pub fn request(pid: u32) -> Result<serde_json::Value> {
    request_kind(pid, true)
}

/// [`request`], or with `add_new` false a lookup-only merge (see the module doc).
pub fn request_kind(pid: u32, add_new: bool) -> Result<serde_json::Value> {
    let refuse = |why: String| Error::InvalidArgument { what: "pid", why };
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Err(refuse(format!("no process {pid} is running")));
    }
    // The agent's socket among the process's own, else the plain name (a process
    // whose descriptors this user may not read).
    let name = listening_name_in(pid).unwrap_or_else(|| socket_name(pid));
    let addr =
        SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| refuse(format!("socket name for {pid}: {e}")))?;
    let conn = UnixStream::connect_addr(&addr).map_err(|e| {
        refuse(format!("process {pid} is not running under `advm run --mode merge` (no merge agent at @{name}: {e})"))
    })?;
    // The name is abstract: any process may hold it (bound first, for a pid not yet
    // running). Only an answer from the process's owner or root is its agent's.
    let owner = std::fs::metadata(format!("/proc/{pid}")).map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    let peer = crate::sys::fdpass::peer_credentials(&conn).map(|(uid, _, _)| uid);
    match (owner, peer) {
        (Ok(owner), Ok(peer)) if peer == owner || peer == 0 => {}
        (owner, peer) => {
            return Err(refuse(format!(
                "@{name} is held by {}, not by process {pid}'s owner ({}): not its merge agent",
                peer.map_or_else(|e| format!("an unknown peer ({e})"), |u| format!("uid {u}")),
                owner.map_or_else(|e| format!("unknown: {e}"), |u| format!("uid {u}")),
            )))
        }
    }
    (&conn)
        .write_all(if add_new { &b"merge\n"[..] } else { b"lookup\n" })
        .map_err(|e| refuse(format!("sending the request to process {pid}: {e}")))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line).map_err(|e| refuse(format!("reading process {pid}'s reply: {e}")))?;
    if line.is_empty() {
        // The connection closed unanswered: the program ended during the merge (a JVM
        // whose heap takes longer to merge than it runs), or its agent stopped.
        return Err(refuse(if ended(pid) {
            format!("process {pid} exited before its merge agent answered (the merge was under way)")
        } else {
            format!("process {pid}'s merge agent closed the connection without answering")
        }));
    }
    serde_json::from_str(&line).map_err(|e| refuse(format!("process {pid} replied {line:?}, not JSON: {e}")))
}

/// Whether `pid` has exited (gone, or a zombie) within 200 ms: its agent's socket closes
/// while the process exits, a moment before it is a zombie.
fn ended(pid: u32) -> bool {
    let t = Instant::now();
    loop {
        let state = procfs::process::Process::new(pid as i32).and_then(|p| p.stat()).map(|s| s.state).ok();
        match state {
            None | Some('Z' | 'X') => return true,
            _ if t.elapsed() >= Duration::from_millis(200) => return false,
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live process has not ended; once killed it has (a zombie until reaped), and so
    /// has one reaped (gone).
    #[test]
    fn ended_tells_a_live_process_from_a_zombie_and_a_gone_one() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        assert!(!ended(pid));
        child.kill().unwrap();
        // a zombie now (not reaped yet), once the kill has landed
        let t = Instant::now();
        while !ended(pid) {
            assert!(t.elapsed() < Duration::from_secs(5), "{pid} never ended after SIGKILL");
        }
        child.wait().unwrap();
        assert!(ended(pid));
    }

    /// Another user holding `@advm-merge/<pid>` (bound first: the name is abstract,
    /// open to anyone) is not taken for `pid`'s agent: its reply used to be printed as
    /// the process's merge.
    #[test]
    fn a_reply_from_another_user_under_the_agents_name_is_refused() {
        if !crate::sys::is_root() {
            eprintln!("skipped: needs root to run the impostor as another uid");
            return;
        }
        let mut target = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = target.id();
        let name = socket_name(pid);
        let impostor = crate::sys::process::fork_unprivileged(|| {
            let Ok(addr) = SocketAddr::from_abstract_name(name.as_bytes()) else { return 1 };
            let Ok(listener) = std::os::unix::net::UnixListener::bind_addr(&addr) else { return 2 };
            if let Ok((mut conn, _)) = listener.accept() {
                let _ = conn.write_all(b"{\"ok\":true,\"merged\":12345}\n");
            }
            0
        })
        .unwrap();
        let t = std::time::Instant::now();
        let got = loop {
            match request(pid) {
                Err(e) if e.to_string().contains("no merge agent") && t.elapsed().as_secs() < 10 => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                r => break r,
            }
        };
        let _ = target.kill();
        let _ = target.wait();
        let _ = crate::sys::process::wait_child(impostor);
        let e = got.expect_err("the impostor's reply was taken").to_string();
        assert!(e.contains("held by uid 65534") && e.contains("not its merge agent"), "{e}");
    }

    /// Someone holding the plain name before the process ran (abstract names are open
    /// to anyone) no longer keeps its agent from listening: the agent binds a name
    /// nobody can guess, and `advm merge PID` finds it among the process's sockets.
    #[test]
    fn an_agent_whose_name_is_taken_listens_under_another_that_requests_find() {
        let pid = std::process::id();
        let squat = format!(
            "import socket, time; s = socket.socket(socket.AF_UNIX); s.bind('\\0{}'); s.listen(); \
             print('bound', flush=True); time.sleep(30)",
            socket_name(pid)
        );
        let Ok(mut squatter) =
            std::process::Command::new("python3").args(["-c", &squat]).stdout(std::process::Stdio::piped()).spawn()
        else {
            eprintln!("skipped: no python3 to hold the name");
            return;
        };
        let mut line = String::new();
        BufReader::new(squatter.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "bound");
        let control = Control::bind(pid).expect("binds another name");
        let found = listening_name_in(pid);
        let _ = squatter.kill();
        let _ = squatter.wait();
        let found = found.expect("the agent's socket among this process's own");
        assert!(found.starts_with(&format!("{}/", socket_name(pid))), "{found}");
        let conn = UnixStream::connect_addr(&SocketAddr::from_abstract_name(found.as_bytes()).unwrap()).unwrap();
        let (_, _, peer) = crate::sys::fdpass::peer_credentials(&conn).unwrap();
        assert_eq!(peer as u32, pid, "connected to this process's listener");
        drop(control);
    }

    /// A connection closed without an answer says why: the process exited during the
    /// merge (a JVM ending while its heap was merged), or its agent closed it. It used to
    /// say `invalid pid: process N replied "", not JSON`.
    #[test]
    fn a_process_that_exits_during_its_merge_is_said_to_have_exited() {
        for exits in [true, false] {
            let target = std::process::Command::new("sleep").arg("30").spawn().unwrap();
            let pid = target.id();
            let addr = SocketAddr::from_abstract_name(socket_name(pid).as_bytes()).unwrap();
            let listener = UnixListener::bind_addr(&addr).unwrap();
            let agent = std::thread::spawn(move || {
                let mut target = target;
                let (conn, _) = listener.accept().unwrap();
                let mut line = String::new();
                BufReader::new(&conn).read_line(&mut line).unwrap();
                if exits {
                    let _ = target.kill();
                    let _ = target.wait();
                }
                drop(conn);
                target
            });
            let e = request(pid).expect_err("no answer came").to_string();
            let mut target = agent.join().unwrap();
            let _ = target.kill();
            let _ = target.wait();
            let want = if exits {
                "exited before its merge agent answered"
            } else {
                "closed the connection without answering"
            };
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn candidates_are_large_private_anonymous_mappings_but_not_stacks_or_own_memory() {
        let text = "\
00400000-00500000 r-xp 00000000 08:01 123 /usr/bin/python3
01000000-03000000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000001000 ---p 00000000 00:00 0
7f0000001000-7f0000801000 rw-p 00000000 00:00 0
7f0001000000-7f0005000000 rw-p 00000000 00:00 0
7f0006000000-7f0007000000 rw-s 00000000 00:01 99 /memfd:x (deleted)
7f0008000000-7f0008010000 rw-p 00000000 00:00 0
7f0009000000-7f000a000000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00800000 rw-p 00000000 00:00 0 [stack]
";
        let maps = parse_maps(text);
        let got = candidates(&maps, 1 << 20, &[0x7f0009000100], &|_| false);
        let got: Vec<_> = got.iter().map(|c| (c.start, c.end, c.store)).collect();
        assert_eq!(got, vec![(0x0100_0000, 0x0300_0000, false), (0x7f00_0100_0000, 0x7f00_0500_0000, false)]);
    }

    #[test]
    fn candidates_include_store_mappings_and_the_small_anonymous_pieces_beside_them() {
        let text = "\
7f0001000000-7f0001010000 rw-p 00000000 00:00 0
7f0001010000-7f0001020000 rw-p 00010000 00:01 77 /memfd:advm-merge-store (deleted)
7f0001020000-7f0001021000 rw-p 00000000 00:00 0
7f0001021000-7f0001022000 r--p 00021000 00:01 77 /memfd:advm-merge-store (deleted)
7f0001030000-7f0001031000 rw-p 00000000 00:00 0
7f0001040000-7f0001041000 rw-p 00000000 00:01 78 /memfd:other (deleted)
7f0001041000-7f0001042000 rw-p 00000000 00:00 0
";
        let maps = parse_maps(text);
        let got = candidates(&maps, 1 << 20, &[], &|inode| inode == 77);
        let got: Vec<_> = got.iter().map(|c| (c.start, c.end, c.store)).collect();
        assert_eq!(
            got,
            vec![
                (0x7f00_0100_0000, 0x7f00_0101_0000, false),
                (0x7f00_0101_0000, 0x7f00_0102_0000, true),
                (0x7f00_0102_0000, 0x7f00_0102_1000, false),
            ]
        );
    }
}
