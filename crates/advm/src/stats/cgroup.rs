//! The second memory meter: what the kernel charges to a memory cgroup.
//!
//! The distinct-page meter ([`super::Meter`]) counts the frames a process maps; a page
//! held in a memfd and mapped by nobody, or page cache a reader has dropped, escapes
//! it. The kernel's memory controller charges every page to the group of the process
//! that first touched it, mapped or not, so a group made for one measured run sees all
//! of it. This module makes such a group (a child of the caller's own memory cgroup,
//! under `advm/`), puts the measured program in it before it runs anything (v1 does
//! not move charges of a process that changes groups), reads it, samples it on a
//! thread, and removes it at the end.
//!
//! Figures, from `memory.stat`:
//! - v1: `total_rss` is anonymous memory (swap cache included) and `total_cache` is
//!   page cache *including* shmem; so anon + shmem = `total_rss + total_shmem` and page
//!   cache = `total_cache - total_shmem`.
//! - v2: `anon`, `shmem`, and `file` (which includes shmem); page cache = `file - shmem`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::Aggregate;
use crate::{Error, Result};

/// The sampling interval the issue asks for (the paper samples once a second).
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(50);

/// How long [`Group::remove`] waits for the group's processes to leave before it
/// kills them, and then for the kernel to let the directory go.
const LEAVE_WAIT: Duration = Duration::from_secs(1);
const REMOVE_WAIT: Duration = Duration::from_secs(5);

/// Which cgroup interface the memory controller is mounted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    /// cgroup v1 (`memory` hierarchy).
    V1,
    /// cgroup v2 (unified hierarchy with the memory controller).
    V2,
}

/// Memory charged to a group at one instant, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Anonymous memory (v1 `total_rss`, v2 `anon`).
    pub anon_bytes: u64,
    /// Shared memory: memfd, tmpfs, shared anonymous, SysV.
    pub shmem_bytes: u64,
    /// Page cache of regular files (shmem excluded).
    pub page_cache_bytes: u64,
}

impl Usage {
    /// Anonymous + shared memory: what the distinct-page meter's anon + shmem counts.
    pub fn anon_shmem_bytes(&self) -> u64 {
        self.anon_bytes + self.shmem_bytes
    }

    /// Parses a `memory.stat` (v1 hierarchical `total_*` keys, or v2 keys).
    pub fn from_stat(text: &str) -> Option<(Version, Usage)> {
        let keys: BTreeMap<&str, u64> = text
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k, v.trim().parse().ok()?))
            })
            .collect();
        let get = |k: &str| keys.get(k).copied();
        if let (Some(rss), Some(cache), Some(shmem)) = (get("total_rss"), get("total_cache"), get("total_shmem")) {
            let usage = Usage { anon_bytes: rss, shmem_bytes: shmem, page_cache_bytes: cache.saturating_sub(shmem) };
            return Some((Version::V1, usage));
        }
        let (anon, shmem, file) = (get("anon")?, get("shmem")?, get("file")?);
        Some((
            Version::V2,
            Usage { anon_bytes: anon, shmem_bytes: shmem, page_cache_bytes: file.saturating_sub(shmem) },
        ))
    }
}

/// What a sampled run came to.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The group's directory.
    pub group: PathBuf,
    /// Its interface.
    pub version: Version,
    /// Samples taken.
    pub samples: usize,
    /// Sampling interval, milliseconds.
    pub interval_ms: u64,
    /// Anonymous + shared memory, bytes: mean and peak over the samples.
    pub anon_shmem_bytes: Aggregate,
    /// Page cache, bytes: mean and peak.
    pub page_cache_bytes: Aggregate,
    /// The last sample.
    pub last: Usage,
}

/// A memory cgroup: one made for a measured run (removed when done), or an existing
/// one opened to be read.
#[derive(Debug)]
pub struct Group {
    path: PathBuf,
    version: Version,
    owned: bool,
}

/// The directory of the caller's own memory cgroup, and the interface it is under.
fn own_memory_cgroup() -> Result<(PathBuf, Version)> {
    let unavailable = |why: String| Error::Unsupported { what: "memory cgroup", why };
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| Error::io("/proc/self/mountinfo", e))?;
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| Error::io("/proc/self/cgroup", e))?;
    // mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
    let mounts: Vec<(String, String, String, String)> = mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            Some((
                pre.get(3)?.to_string(),
                pre.get(4)?.to_string(),
                post.first()?.to_string(),
                post.get(2)?.to_string(),
            ))
        })
        .collect();
    let join = |mount: &str, root: &str, own_path: &str| {
        let rel = own_path.strip_prefix(root).unwrap_or(own_path).trim_start_matches('/');
        Path::new(mount).join(rel)
    };
    if let Some((root, mount, _, _)) =
        mounts.iter().find(|(_, _, fs, opts)| fs == "cgroup" && opts.split(',').any(|o| o == "memory"))
    {
        let line = own
            .lines()
            .find(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "memory")))
            .ok_or_else(|| unavailable("/proc/self/cgroup has no memory line".into()))?;
        let own_path = line.splitn(3, ':').nth(2).unwrap_or("/");
        return Ok((join(mount, root, own_path), Version::V1));
    }
    for (root, mount, fs, _) in &mounts {
        if fs != "cgroup2" {
            continue;
        }
        let controllers = std::fs::read_to_string(Path::new(mount).join("cgroup.controllers")).unwrap_or_default();
        if !controllers.split_whitespace().any(|c| c == "memory") {
            continue;
        }
        let own_path = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/");
        return Ok((join(mount, root, own_path), Version::V2));
    }
    Err(unavailable("no cgroup v1 memory hierarchy and no cgroup2 mount with the memory controller".into()))
}

/// Group names: letters, digits, '-', '_', at most 64 bytes.
fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        what: "cgroup name",
        why: format!("{name:?}: use 1 to 64 letters, digits, '-' or '_'"),
    })
}

/// Removes the groups under `parent` whose creator (the pid in `<name>-<pid>-<n>`) is
/// gone: a run killed outright (SIGKILL) could not remove its own. Processes still in
/// such a group were that run's measured programs and are killed; a group that stays
/// busy is left for the next try.
fn remove_abandoned(parent: &Path, version: Version) {
    let Ok(dir) = std::fs::read_dir(parent) else { return };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.rsplit('-').nth(1)).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !entry.path().is_dir() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = Group { path: entry.path(), version, owned: true }.remove();
    }
}

impl Group {
    /// Makes a fresh memory cgroup `advm/<name>-<pid>-<n>` under the caller's own (so
    /// the limits around the caller still apply). Needs root. Groups left there by
    /// processes that died without removing them are removed first.
    pub fn create(name: &str) -> Result<Self> {
        check_name(name)?;
        let (own, version) = own_memory_cgroup()?;
        if !crate::process::is_root() {
            let why = format!("creating a memory cgroup needs root (running as uid {})", crate::sys::euid());
            return Err(Error::io(own.join("advm"), std::io::Error::new(std::io::ErrorKind::PermissionDenied, why)));
        }
        let parent = own.join("advm");
        if version == Version::V2 {
            // children only get memory.* files when their parent delegates the controller
            for dir in [&own, &parent] {
                let _ = std::fs::create_dir(dir);
                let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+memory");
            }
        }
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let path = parent.join(format!("{name}-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
        let mut tries = 0;
        loop {
            std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
            remove_abandoned(&parent, version);
            match std::fs::create_dir(&path) {
                Ok(()) => break,
                // the parent went with another group's removal in between: make it again
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 3 => tries += 1,
                Err(e) => return Err(Error::io(&path, e)),
            }
        }
        let group = Self { path, version, owned: true };
        // a v2 group without the controller has no memory.stat: say so now
        group.usage()?;
        Ok(group)
    }

    /// Opens an existing group (a directory with a `memory.stat`) to read it; it is
    /// never removed by this handle.
    pub fn open(path: &Path) -> Result<Self> {
        let stat = path.join("memory.stat");
        let text = std::fs::read_to_string(&stat).map_err(|e| Error::io(&stat, e))?;
        let (version, _) = Usage::from_stat(&text).ok_or_else(|| Error::InvalidArgument {
            what: "cgroup",
            why: format!("{}: neither v1 total_rss/total_cache/total_shmem nor v2 anon/shmem/file", stat.display()),
        })?;
        Ok(Self { path: path.to_path_buf(), version, owned: false })
    }

    /// The group's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its interface.
    pub fn version(&self) -> Version {
        self.version
    }

    /// What is charged to the group (and its descendants) now.
    pub fn usage(&self) -> Result<Usage> {
        let stat = self.path.join("memory.stat");
        let text = std::fs::read_to_string(&stat).map_err(|e| Error::io(&stat, e))?;
        Usage::from_stat(&text).map(|(_, u)| u).ok_or_else(|| Error::InvalidArgument {
            what: "cgroup",
            why: format!("{}: no anon/shmem/page-cache keys", stat.display()),
        })
    }

    fn limit_file(&self) -> &'static str {
        match self.version {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        }
    }

    /// The group's memory limit, bytes (`u64::MAX` when unlimited).
    pub fn limit_bytes(&self) -> Result<u64> {
        let f = self.path.join(self.limit_file());
        let text = std::fs::read_to_string(&f).map_err(|e| Error::io(&f, e))?;
        let t = text.trim();
        if t == "max" {
            return Ok(u64::MAX);
        }
        t.parse().map_err(|_| Error::InvalidArgument { what: "cgroup limit", why: format!("{}: {t:?}", f.display()) })
    }

    /// Sets the group's memory limit (memory + page cache, not swap), bytes.
    pub fn set_limit_bytes(&self, bytes: u64) -> Result<()> {
        let f = self.path.join(self.limit_file());
        std::fs::write(&f, bytes.to_string()).map_err(|e| Error::io(&f, e))
    }

    /// Everything charged to the group now, as its limit counts it, bytes (v1
    /// `memory.usage_in_bytes`, v2 `memory.current`).
    pub fn usage_bytes(&self) -> Result<u64> {
        let name = match self.version {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        };
        let f = self.path.join(name);
        let text = std::fs::read_to_string(&f).map_err(|e| Error::io(&f, e))?;
        text.trim()
            .parse()
            .map_err(|_| Error::InvalidArgument { what: "cgroup usage", why: format!("{}: {text:?}", f.display()) })
    }

    /// How many processes the kernel's OOM killer has killed in the group since it was
    /// made (v1 `memory.oom_control`, v2 `memory.events`, key `oom_kill`): a measured
    /// program that died of SIGKILL under a limit was killed for memory if this grew.
    pub fn oom_kills(&self) -> Result<u64> {
        let name = match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        let f = self.path.join(name);
        let text = std::fs::read_to_string(&f).map_err(|e| Error::io(&f, e))?;
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok()).ok_or_else(|| {
            Error::InvalidArgument { what: "cgroup", why: format!("{}: no oom_kill count", f.display()) }
        })
    }

    /// The processes in the group now.
    pub fn pids(&self) -> Result<Vec<i32>> {
        let procs = self.path.join("cgroup.procs");
        let text = std::fs::read_to_string(&procs).map_err(|e| Error::io(&procs, e))?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    fn procs_for_writing(&self) -> Result<OwnedFd> {
        let procs = self.path.join("cgroup.procs");
        let f = std::fs::OpenOptions::new().write(true).open(&procs).map_err(|e| Error::io(&procs, e))?;
        Ok(f.into())
    }

    /// Makes the child `cmd` spawns join this group before it execs, so everything the
    /// program charges lands here.
    pub fn join_at_exec(&self, cmd: &mut Command) -> Result<()> {
        crate::sys::process::join_cgroup_before_exec(cmd, self.procs_for_writing()?);
        Ok(())
    }

    /// Runs `work` in a forked child of this process that joins the group first, and
    /// returns what it returned (its error message as `Err`). For measuring in-process
    /// work alone: pages the child inherits stay charged where they are, pages it
    /// touches are charged here.
    ///
    /// The child has only the calling thread (a plain `fork`):
    /// `work` must not wait for locks other threads may hold (stdio included). It dies
    /// of SIGINT, SIGTERM, SIGHUP and SIGQUIT whatever the caller does with them, and is
    /// killed if the caller dies.
    pub fn run_in_child(
        &self,
        work: impl FnOnce() -> std::result::Result<Vec<u8>, String>,
    ) -> Result<std::result::Result<Vec<u8>, String>> {
        let procs = self.procs_for_writing()?;
        let (mut parent_end, child_end) = UnixStream::pair().map_err(|e| Error::io("socketpair", e))?;
        let parent = rustix::process::getpid();
        let pid = crate::sys::process::fork_run(move || {
            let mut out = child_end;
            // A parent noting stopping signals (to clean up) must still be able to
            // stop its measured child with one.
            let _ = crate::sys::swap::Interrupts::default_in_child();
            // A parent killed outright must not leave its measurement running in a
            // group nobody removes (the parent may have died before this call).
            let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
            if rustix::process::getppid() != Some(parent) {
                return 1;
            }
            let joined = rustix::io::write(&procs, b"0");
            let (tag, body) = match joined {
                Err(e) => (1u8, format!("joining the cgroup: {e}").into_bytes()),
                Ok(_) => match work() {
                    Ok(bytes) => (0, bytes),
                    Err(msg) => (1, msg.into_bytes()),
                },
            };
            let sent = out.write_all(&[tag]).and_then(|()| out.write_all(&body));
            i32::from(sent.is_err())
        })?;
        // the parent's copy of `child_end` went with the closure: EOF comes when the child exits
        let mut reply = Vec::new();
        let read = parent_end.read_to_end(&mut reply);
        let code = crate::sys::process::wait_child(pid)?;
        read.map_err(|e| Error::io("reply of the measured child", e))?;
        match reply.split_first() {
            Some((0, body)) if code == 0 => Ok(Ok(body.to_vec())),
            Some((1, msg)) => Ok(Err(String::from_utf8_lossy(msg).into_owned())),
            _ => Ok(Err(format!("the measured child exited with status {code} without a reply"))),
        }
    }

    /// Starts sampling the group every `interval` on a thread.
    pub fn sample_every(&self, interval: Duration) -> Sampler {
        Sampler::start(self.path.clone(), self.version, interval)
    }

    /// Removes a group this handle made: waits for its processes to leave (killing
    /// those still there after a second: the group belongs to one run; [`Group::release`]
    /// lets them live on elsewhere), then retries the removal while the kernel reports
    /// it busy. A no-op for an opened group.
    pub fn remove(mut self) -> Result<()> {
        let r = self.remove_now();
        self.owned = false;
        r
    }

    /// Removes a group this handle made, first moving the processes still in it (a
    /// measured program's background children) to the caller's own group, the one
    /// they would be in had the program run without this group: they live on, where
    /// [`Group::remove`] kills them. Processes that keep appearing (forking faster than
    /// they are moved) for a second are killed as by `remove`.
    pub fn release(self) -> Result<()> {
        if let Some(own) = self.path.parent().and_then(Path::parent).filter(|_| self.owned) {
            let procs = own.join("cgroup.procs");
            let start = Instant::now();
            while start.elapsed() < LEAVE_WAIT {
                let pids = self.pids().unwrap_or_default();
                if pids.is_empty() {
                    break;
                }
                for pid in pids {
                    // one process per write; one that has exited since is ESRCH
                    let _ = std::fs::write(&procs, pid.to_string());
                }
                // as remove's wait: a pid that does not move yet is not polled flat out
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.remove()
    }

    fn remove_now(&self) -> Result<()> {
        if !self.owned {
            return Ok(());
        }
        let start = Instant::now();
        let mut killed = false;
        loop {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < REMOVE_WAIT => {
                    if !killed && start.elapsed() >= LEAVE_WAIT {
                        for pid in self.pids().unwrap_or_default() {
                            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                            }
                        }
                        killed = true;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(Error::io(&self.path, e)),
            }
        }
        // the shared `advm` parent goes too when this was its last group
        if let Some(parent) = self.path.parent() {
            let _ = std::fs::remove_dir(parent);
        }
        Ok(())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // on error paths too: a cgroup must never outlive its run
        let _ = self.remove_now();
    }
}

/// Samples a group on a thread until [`Sampler::stop`].
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Summary>>,
}

impl Sampler {
    fn start(path: PathBuf, version: Version, interval: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let interval = interval.max(Duration::from_millis(1));
        let thread = std::thread::spawn(move || {
            let group = Group { path, version, owned: false };
            let (mut anon_shmem, mut cache) = (Vec::new(), Vec::new());
            let mut last;
            let mut next = Instant::now();
            loop {
                // one last sample after the stop request, so even a short run has one
                let stopping = flag.load(Ordering::Acquire);
                last = group.usage()?;
                anon_shmem.push(last.anon_shmem_bytes() as f64);
                cache.push(last.page_cache_bytes as f64);
                if stopping {
                    break;
                }
                next += interval;
                // Until the next sample, or until `stop` unparks this thread: a sleep
                // held `stop` for up to an interval (`advm stat --cgroup --watch 1
                // --interval 60000` took 60 s).
                next = next.max(Instant::now());
                loop {
                    let now = Instant::now();
                    if next <= now || flag.load(Ordering::Acquire) {
                        break;
                    }
                    std::thread::park_timeout(next - now);
                }
            }
            Ok(Summary {
                group: group.path.clone(),
                version,
                samples: anon_shmem.len(),
                interval_ms: interval.as_millis() as u64,
                anon_shmem_bytes: Aggregate::of(&anon_shmem),
                page_cache_bytes: Aggregate::of(&cache),
                last,
            })
        });
        Self { stop, thread }
    }

    /// Stops sampling and returns mean and peak.
    pub fn stop(self) -> Result<Summary> {
        self.stop.store(true, Ordering::Release);
        self.thread.thread().unpark();
        self.thread
            .join()
            .unwrap_or_else(|_| Err(Error::Unrecoverable { what: "cgroup sampler", why: "its thread panicked".into() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn v1_anon_shmem_is_rss_plus_shmem_and_cache_excludes_shmem() {
        let text = "cache 100\nrss 7\nshmem 40\ntotal_cache 1000\ntotal_rss 300\ntotal_shmem 400\n";
        let (v, u) = Usage::from_stat(text).unwrap();
        assert_eq!(v, Version::V1);
        assert_eq!(u, Usage { anon_bytes: 300, shmem_bytes: 400, page_cache_bytes: 600 });
        assert_eq!(u.anon_shmem_bytes(), 700);
    }

    #[test]
    fn v2_page_cache_is_file_minus_shmem() {
        let (v, u) = Usage::from_stat("anon 10\nfile 50\nkernel 3\nshmem 20\n").unwrap();
        assert_eq!(v, Version::V2);
        assert_eq!(u, Usage { anon_bytes: 10, shmem_bytes: 20, page_cache_bytes: 30 });
        assert!(Usage::from_stat("nothing 1\n").is_none());
    }

    #[test]
    fn a_group_whose_creator_died_is_removed_by_the_next_create() {
        let probe = match Group::create("test-probe") {
            Ok(g) => g,
            Err(e) => {
                eprintln!("skipped: no memory cgroup here ({e})");
                return;
            }
        };
        let parent = probe.path().parent().unwrap().to_path_buf();
        // a creator that has exited: its pid is free (and not reused this quickly)
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let dead = gone.id();
        gone.wait().unwrap();
        let stale = parent.join(format!("test-killed-{dead}-0"));
        std::fs::create_dir(&stale).unwrap();
        // in a child, as a killed run's measured program would be
        let mut orphan = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        std::fs::write(stale.join("cgroup.procs"), orphan.id().to_string()).unwrap();
        let fresh = Group::create("test-fresh").unwrap();
        assert!(!stale.exists(), "the dead run's group is still there");
        assert!(orphan.wait().unwrap().signal().is_some(), "its program was not killed");
        assert!(probe.path().exists() && fresh.path().exists(), "live groups are kept");
    }

    #[test]
    fn group_names_are_checked() {
        assert!(check_name("bench-r_1").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("../x").is_err());
        assert!(check_name(&"a".repeat(65)).is_err());
    }
}
