//! Small /proc readers for the accounting: smaps_rollup and ksm_stat (the system-wide
//! KSM counters and ksmd's CPU time are `crate::ksm`'s).

use std::collections::BTreeMap;
use std::io::Read;

use procfs::process::Process;

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
