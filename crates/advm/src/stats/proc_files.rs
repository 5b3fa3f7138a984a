//! Small /proc and /sys readers for the accounting: smaps_rollup, ksm_stat, KSM
//! counters, ksmd's CPU time.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::OnceLock;

use procfs::process::Process;
use serde::Serialize;

use crate::sys::ksm;
use crate::{Error, Result};

/// RSS/PSS/USS/Swap of one process.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Rollup {
    pub rss_bytes: u64,
    pub pss_bytes: u64,
    pub uss_bytes: u64,
    pub swap_bytes: u64,
}

fn read_relative(process: &Process, name: &str) -> Result<String> {
    let pid = process.pid();
    let mut f = process.open_relative(name).map_err(|e| match e {
        procfs::ProcError::PermissionDenied(_) => Error::PermissionDenied { pid, what: name.to_string() },
        procfs::ProcError::NotFound(_) => Error::ProcessExited { pid },
        other => Error::io(format!("/proc/{pid}/{name}"), std::io::Error::other(other.to_string())),
    })?;
    let mut s = String::new();
    f.read_to_string(&mut s).map_err(|e| Error::io(format!("/proc/{pid}/{name}"), e))?;
    Ok(s)
}

/// Parses `Key:   123 kB` lines into bytes (or plain numbers for lines without a unit).
fn parse_key_values(text: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(|c: char| c == ':' || c.is_whitespace()) else { continue };
        let mut words = rest.split_whitespace();
        let Some(value) = words.next().and_then(|v| v.parse::<i64>().ok()) else { continue };
        let scale = if words.next() == Some("kB") { 1024 } else { 1 };
        out.insert(key.trim().to_string(), value * scale);
    }
    out
}

pub(super) fn smaps_rollup(process: &Process) -> Result<Rollup> {
    let text = read_relative(process, "smaps_rollup")?;
    let kv = parse_key_values(&text);
    let get = |k: &str| kv.get(k).copied().unwrap_or(0).max(0) as u64;
    if text.is_empty() {
        return Err(Error::ProcessExited { pid: process.pid() });
    }
    Ok(Rollup {
        rss_bytes: get("Rss"),
        pss_bytes: get("Pss"),
        uss_bytes: get("Private_Clean") + get("Private_Dirty"),
        swap_bytes: get("Swap"),
    })
}

/// /proc/PID/ksm_stat (Linux 6.1+); empty when absent.
pub(super) fn ksm_stat(process: &Process) -> BTreeMap<String, i64> {
    read_relative(process, "ksm_stat").map(|t| parse_key_values(&t)).unwrap_or_default()
}

/// System-wide KSM state and counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KsmSystem {
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
pub fn ksm_system() -> Option<KsmSystem> {
    if !ksm::available() {
        return None;
    }
    let r = |n| ksm::read(n).unwrap_or(0);
    Some(KsmSystem {
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
    static KSMD: OnceLock<Option<Process>> = OnceLock::new();
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

    #[test]
    fn parses_rollup_and_ksm_stat_lines() {
        let kv = parse_key_values(
            "55d0c0000000-7ffc00000000 ---p 00000000 00:00 0  [rollup]\nRss:   1024 kB\nPss:     512 kB\nksm_rmap_items 7\nksm_merge_any: no\n",
        );
        assert_eq!(kv["Rss"], 1024 * 1024);
        assert_eq!(kv["Pss"], 512 * 1024);
        assert_eq!(kv["ksm_rmap_items"], 7);
        assert!(!kv.contains_key("ksm_merge_any"));
    }
}
