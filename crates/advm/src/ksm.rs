//! KSM as a baseline, and the one place for it: sessions that change the knobs, a
//! knob's value ([`knob`]), the system-wide counters ([`system`]) and ksmd's CPU time
//! ([`ksmd_cpu_seconds`]); `stats` reads its KSM figures from here.
//!
//! The KSM knobs are system-wide, and several users may change them at once
//! (benchmarks, `advm run --mode ksm`, parallel tests). A [`Session`] takes part in a
//! small shared state file under an exclusive `flock`: the first session saves the
//! original settings, every session registers itself, and the last one to end (or the
//! next one to start after all holders died) writes the originals back. Saving and
//! restoring per session would leave KSM on whenever two sessions overlap.
//!
//! A holder is alive while it holds a lock on its own file beside the state file: a
//! process id would not do, since processes in another PID namespace (containers,
//! sandboxes sharing `/run`) have ids this one cannot see, and would be taken for dead.

use crate::sys::lazy::Lazy;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use procfs::process::Process;
use serde::{Deserialize, Serialize};

use crate::sys::ksm;
use crate::{Error, Result};

const KNOBS: [&str; 3] = ["pages_to_scan", "sleep_millisecs", "run"];

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    /// The settings before the first live session, knob by knob.
    saved: Vec<(String, String)>,
    /// Live sessions by token; each holds a lock on [`holder_path`] of its token.
    holders: Vec<String>,
}

/// /run/advm for root, who alone can change KSM (and so holds every session). Another
/// user's sessions never start, but the holder bookkeeping still needs a directory it
/// may write: its own in the temporary directory (/run/advm is root's).
fn state_dir() -> PathBuf {
    let run = PathBuf::from("/run/advm");
    if crate::sys::is_root() && std::fs::create_dir_all(&run).is_ok() {
        return run;
    }
    let tmp = own_state_dir();
    let _ = std::fs::create_dir_all(&tmp);
    tmp
}

/// The state directory of a process that is not root, or cannot make /run/advm.
fn own_state_dir() -> PathBuf {
    std::env::temp_dir().join(format!("advm-{}", crate::sys::euid()))
}

/// The locked state file; the lock is released when this is dropped.
struct Locked {
    file: File,
    path: PathBuf,
}

impl Locked {
    fn open() -> Result<Self> {
        let path = state_dir().join("ksm-sessions.json");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        crate::sys::fs::lock_exclusive(&file)?;
        Ok(Self { file, path })
    }

    fn read(&mut self) -> State {
        let mut text = String::new();
        let _ = self.file.read_to_string(&mut text);
        serde_json::from_str(&text).unwrap_or_default()
    }

    fn write(&mut self, state: &State) -> Result<()> {
        let text = serde_json::to_string(state).expect("state serializes");
        self.file
            .set_len(0)
            .and_then(|_| self.file.seek(SeekFrom::Start(0)))
            .and_then(|_| self.file.write_all(text.as_bytes()))
            .map_err(|e| Error::io(&self.path, e))
    }
}

fn holder_path(token: &str) -> PathBuf {
    state_dir().join(format!("ksm-holder-{token}"))
}

/// Whether the session `token` still runs: its lock file exists and is locked. A
/// file left unlocked (its holder died) is removed.
fn alive(token: &str) -> bool {
    let path = holder_path(token);
    let Ok(file) = File::open(&path) else { return false };
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockShared) {
        Err(_) => true,
        Ok(()) => {
            let _ = std::fs::remove_file(&path);
            false
        }
    }
}

/// A holder file not in the state and not locked for a minute: its session died
/// between making it and registering (a measured child killed at that moment). Younger
/// ones may belong to a session that is just starting.
fn remove_unlisted_dead_holders(listed: &[String]) {
    let Ok(dir) = std::fs::read_dir(state_dir()) else { return };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(token) = name.to_str().and_then(|n| n.strip_prefix("ksm-holder-")) else { continue };
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age >= std::time::Duration::from_secs(60)));
        if old && !listed.iter().any(|h| h == token) {
            // removes the file when nobody holds its lock
            alive(token);
        }
    }
}

fn restore(saved: &[(String, String)]) {
    // `run` is last in KNOBS: scanning stops before the rate changes back.
    for (knob, value) in saved {
        let _ = ksm::write(knob, value);
    }
}

/// A user of KSM's system-wide settings; see the module doc.
#[derive(Debug)]
pub struct Session {
    token: String,
    /// Locked for the session's life: what [`alive`] looks for.
    _alive: File,
}

impl Session {
    /// Starts ksmd scanning `pages_to_scan` pages every `sleep_millisecs` (root only:
    /// [`can_change`] says why not, before anything is touched).
    pub fn start(pages_to_scan: u32, sleep_millisecs: u32) -> Result<Self> {
        can_change()?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        // Unique across PID namespaces too: a process id alone is not.
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let token = format!("{}-{}-{}", std::process::id(), started.as_nanos(), NEXT.fetch_add(1, Ordering::Relaxed));
        let path = holder_path(&token);
        let lock = File::create(&path).map_err(|e| Error::io(&path, e))?;
        crate::sys::fs::lock_exclusive(&lock)?;
        let mut locked = Locked::open()?;
        let mut state = locked.read();
        state.holders.retain(|h| alive(h));
        if state.holders.is_empty() {
            // Either nobody held KSM, or every holder died without ending: put back what
            // the first of them saved, then save afresh.
            restore(&state.saved);
            state.saved = KNOBS.iter().filter_map(|k| Some((k.to_string(), ksm::read_text(k)?))).collect();
        }
        state.holders.push(token.clone());
        locked.write(&state)?;
        let session = Self { token, _alive: lock };
        ksm::write("sleep_millisecs", &sleep_millisecs.to_string())?;
        ksm::write("pages_to_scan", &pages_to_scan.to_string())?;
        ksm::write("run", "1")?;
        Ok(session)
    }

    /// Pauses (`false`) or resumes (`true`) scanning; merged pages stay merged.
    pub fn set_scanning(&self, on: bool) -> Result<()> {
        Ok(ksm::write("run", if on { "1" } else { "0" })?)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let Ok(mut locked) = Locked::open() else { return };
        let mut state = locked.read();
        state.holders.retain(|h| h != &self.token && alive(h));
        if state.holders.is_empty() {
            restore(&state.saved);
            state.saved.clear();
        }
        let _ = locked.write(&state);
        let _ = std::fs::remove_file(holder_path(&self.token));
    }
}

/// Puts back the settings saved by sessions that all died without ending (killed, or
/// a forked child that started one and died of a signal), and forgets them; live
/// sessions (this process's or others') are left alone. Returns whether anything was
/// restored. A session's own end does this already: this is for a caller that
/// outlives sessions which could not end, and before a run that wants KSM as found.
pub fn restore_abandoned() -> Result<bool> {
    let mut locked = Locked::open()?;
    let mut state = locked.read();
    state.holders.retain(|h| alive(h));
    remove_unlisted_dead_holders(&state.holders);
    if !state.holders.is_empty() || state.saved.is_empty() {
        return Ok(false);
    }
    restore(&state.saved);
    state.saved.clear();
    locked.write(&state)?;
    Ok(true)
}

/// True when this kernel has KSM (`/sys/kernel/mm/ksm`).
pub fn available() -> bool {
    ksm::available()
}

/// Whether this process may start a [`Session`]: the kernel has KSM and its knobs are
/// writable, which takes root (or CAP_DAC_OVERRIDE). The error says which is missing;
/// a [`Session::start`] that fails here has touched nothing.
pub fn can_change() -> Result<()> {
    if !ksm::available() {
        return Err(Error::Unsupported { what: "KSM", why: format!("{}/run does not exist", ksm::SYSFS_DIR) });
    }
    if !ksm::writable() {
        return Err(Error::NeedsPrivilege {
            what: "changing KSM's settings (/sys/kernel/mm/ksm)",
            needs: "root (writing the knobs takes uid 0 or CAP_DAC_OVERRIDE)",
            uid: crate::sys::euid(),
        });
    }
    Ok(())
}

/// A KSM knob's value (`run`, `pages_to_scan`, `pages_shared`, ...), when readable.
pub fn knob(name: &str) -> Option<i64> {
    ksm::read(name)
}

/// System-wide KSM state and counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct System {
    /// 0 stopped, 1 running, 2 unmerge all.
    pub run: i64,
    /// Pages scanned per wake-up.
    pub pages_to_scan: i64,
    /// Sleep between wake-ups.
    pub sleep_millisecs: i64,
    /// Shared KSM pages in use.
    pub pages_shared: i64,
    /// Additional mappings of shared pages (the saving).
    pub pages_sharing: i64,
    /// Pages checked but unique.
    pub pages_unshared: i64,
    /// Pages changing too fast to merge.
    pub pages_volatile: i64,
    /// Full scans completed.
    pub full_scans: i64,
    /// Bytes saved minus KSM's own metadata (Linux 6.1+).
    pub general_profit: Option<i64>,
    /// Empty pages merged with the kernel zero page (Linux 6.10+).
    pub ksm_zero_pages: Option<i64>,
}

/// Reads the KSM counters; `None` when the kernel has no KSM.
pub fn system() -> Option<System> {
    if !ksm::available() {
        return None;
    }
    let r = |n| ksm::read(n).unwrap_or(0);
    Some(System {
        run: r("run"),
        pages_to_scan: r("pages_to_scan"),
        sleep_millisecs: r("sleep_millisecs"),
        pages_shared: r("pages_shared"),
        pages_sharing: r("pages_sharing"),
        pages_unshared: r("pages_unshared"),
        pages_volatile: r("pages_volatile"),
        full_scans: r("full_scans"),
        general_profit: ksm::read("general_profit"),
        ksm_zero_pages: ksm::read("ksm_zero_pages"),
    })
}

fn ksmd_process() -> Option<&'static Process> {
    // A read of /proc: looking twice is harmless.
    static KSMD: Lazy<Option<Process>> = Lazy::new();
    KSMD.get_or_init(|| {
        procfs::process::all_processes().ok()?.flatten().find(|p| p.stat().map(|s| s.comm == "ksmd").unwrap_or(false))
    })
    .as_ref()
}

/// ksmd's CPU time (user + system) so far, in seconds; `None` without ksmd.
pub fn ksmd_cpu_seconds() -> Option<f64> {
    let stat = ksmd_process()?.stat().ok()?;
    Some((stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests that start sessions run one at a time: each checks that no other holds one.
    static SESSIONS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn knobs() -> Vec<Option<String>> {
        KNOBS.iter().map(|k| ksm::read_text(k)).collect()
    }

    /// Sessions of other processes alive now.
    fn others() -> usize {
        Locked::open().unwrap().read().holders.into_iter().filter(|h| alive(h)).count()
    }

    /// The tests' turn at sessions, or `None` (the reason printed) when they cannot
    /// run here: no root, no KSM, or another process holding a session.
    fn alone() -> Option<std::sync::MutexGuard<'static, ()>> {
        let one = SESSIONS.lock().unwrap_or_else(|e| e.into_inner());
        if !crate::sys::is_root() || !ksm::available() {
            eprintln!("skipped: needs root and KSM");
            return None;
        }
        if others() > 0 {
            eprintln!("skipped: another process holds a KSM session");
            return None;
        }
        Some(one)
    }

    #[test]
    fn overlapping_sessions_restore_the_original_settings() {
        let Some(_one) = alone() else { return };
        let before = knobs();
        let a = Session::start(1000, 20).unwrap();
        let b = Session::start(100, 20).unwrap();
        assert_eq!(ksm::read("run"), Some(1));
        drop(a);
        assert_eq!(ksm::read("run"), Some(1), "b still holds KSM");
        drop(b);
        if others() > 0 {
            eprintln!("not checked: another process started a KSM session meanwhile");
            return;
        }
        assert_eq!(knobs(), before);
    }

    #[test]
    fn settings_of_a_session_whose_process_died_are_restored_on_request() {
        let Some(_one) = alone() else { return };
        let before = knobs();
        // a measured child that starts a session and dies without ending it
        let pid = crate::sys::process::fork_run(|| {
            std::mem::forget(Session::start(1000, 20).unwrap());
            0
        })
        .unwrap();
        assert_eq!(crate::sys::process::wait_child(pid).unwrap(), 0);
        assert_eq!(ksm::read("run"), Some(1), "the dead session's settings stay");
        assert!(restore_abandoned().unwrap());
        assert_eq!(knobs(), before);
        assert!(!restore_abandoned().unwrap(), "nothing left to restore");
    }

    #[test]
    fn an_unregistered_dead_holder_file_goes_once_a_minute_old() {
        let _one = SESSIONS.lock().unwrap_or_else(|e| e.into_inner());
        let token = format!("test-{}-{}", std::process::id(), line!());
        let path = holder_path(&token);
        let file = File::create(&path).unwrap();
        remove_unlisted_dead_holders(&[]);
        assert!(path.exists(), "a new file may be a session just starting");
        file.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(120)).unwrap();
        drop(file);
        remove_unlisted_dead_holders(&[]);
        assert!(!path.exists(), "an old unlocked holder file stays");
    }

    /// Without root, starting a session says that root is needed and touches nothing
    /// (no holder file): it used to fail with a bare EACCES on /run/advm.
    #[test]
    fn without_root_a_session_says_root_is_needed_and_leaves_nothing() {
        if !ksm::available() {
            eprintln!("skipped: no KSM");
            return;
        }
        let code = crate::sys::process::run_unprivileged(|| {
            // looked at without making the directory: the child is not root
            let holders = || {
                std::fs::read_dir(own_state_dir())
                    .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("ksm-holder-")).count())
                    .unwrap_or(0)
            };
            let before = (own_state_dir().exists(), holders());
            match Session::start(100, 20) {
                Err(Error::NeedsPrivilege { needs, .. })
                    if needs.contains("root") && (own_state_dir().exists(), holders()) == before =>
                {
                    0
                }
                Err(e) => {
                    eprintln!("wrong error or a holder file left: {e}");
                    1
                }
                Ok(_) => 2,
            }
        })
        .unwrap();
        assert_eq!(code, 0);
    }

    #[test]
    fn a_holder_is_alive_while_its_file_is_locked() {
        assert!(!alive("no-such-session"));
        let token = format!("test-{}-{}", std::process::id(), line!());
        let path = holder_path(&token);
        let file = File::create(&path).unwrap();
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive).unwrap();
        assert!(alive(&token), "locked: alive");
        drop(file);
        assert!(!alive(&token), "unlocked (its holder died): dead");
        assert!(!path.exists(), "a dead holder's file is removed");
    }
}
