//! The two memory meters side by side, for every memory benchmark.
//!
//! - the distinct-page meter (`advm::stats`, the mmapcopy paper's measure: distinct
//!   physical frames mapped by the measured process), kept for comparison with the paper;
//! - the cgroup meter (`advm::stats::cgroup`): anon + shmem (and page cache) the kernel
//!   charges to a memory cgroup made for the measured program alone.
//!
//! In-process measurements run in a forked child that joins its own group first
//! ([`in_group`]), so the group holds only the measured work. A benchmark fails (after
//! printing its report) when the meters disagree on anon + shmem by more than
//! [`TOLERANCE`].

use std::collections::BTreeMap;

use advm::stats::cgroup::{Group, Usage};
use advm::stats::Sample;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{BenchError, Row};

/// Largest relative disagreement on anon + shmem allowed between the meters.
pub const TOLERANCE: f64 = 0.05;

/// Differences below this many bytes are never a disagreement: at that size the
/// figures are the allocator's and the stack's few pages, not the workload's.
pub const FLOOR_BYTES: f64 = (1 << 20) as f64;

/// Both meters at one instant: the distinct-page meter's anon + shmem and the group's
/// usage (None without a group).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Both {
    /// The distinct-page meter's anon + shmem (held pages included; `Sample::anon_shmem_bytes`), bytes.
    pub distinct: u64,
    /// The cgroup's anon + shmem, bytes.
    pub cgroup: Option<u64>,
    /// The cgroup's page cache, bytes.
    pub page_cache: Option<u64>,
}

impl Both {
    /// Reads both: `sample` is the distinct meter's, `group` the cgroup's.
    pub fn read(sample: &Sample, group: Option<&Group>) -> Result<Self, BenchError> {
        let usage: Option<Usage> = group.map(|g| g.usage()).transpose()?;
        Ok(Self {
            distinct: sample.anon_shmem_bytes,
            cgroup: usage.map(|u| u.anon_shmem_bytes()),
            page_cache: usage.map(|u| u.page_cache_bytes),
        })
    }

    /// `self - before`, each figure (saturating at 0).
    pub fn since(&self, before: &Both) -> Both {
        let sub = |a: Option<u64>, b: Option<u64>| Some(a?.saturating_sub(b?));
        Both {
            distinct: self.distinct.saturating_sub(before.distinct),
            cgroup: sub(self.cgroup, before.cgroup),
            page_cache: sub(self.page_cache, before.page_cache),
        }
    }
}

/// The disagreement message for one figure, or None when the meters agree (within
/// [`TOLERANCE`], or within [`FLOOR_BYTES`]).
pub fn disagreement(what: &str, distinct_bytes: f64, cgroup_bytes: f64) -> Option<String> {
    let diff = (distinct_bytes - cgroup_bytes).abs();
    let larger = distinct_bytes.max(cgroup_bytes);
    if diff <= FLOOR_BYTES || diff <= TOLERANCE * larger {
        return None;
    }
    let mib = |b: f64| b / (1 << 20) as f64;
    Some(format!(
        "{what}: anon+shmem by the distinct-page meter {:.1} MiB, by the cgroup {:.1} MiB: {} by {:.1} MiB ({:.1}%, limit {:.0}%)",
        mib(distinct_bytes),
        mib(cgroup_bytes),
        if cgroup_bytes > distinct_bytes { "the cgroup sees more" } else { "the distinct-page meter sees more" },
        mib(diff),
        100.0 * diff / larger,
        TOLERANCE * 100.0
    ))
}

/// Checks one figure (no cgroup figure: nothing to compare), adding a disagreement to `into`.
pub fn check(into: &mut Vec<String>, what: &str, distinct_bytes: f64, cgroup_bytes: Option<f64>) {
    if let Some(msg) = cgroup_bytes.and_then(|c| disagreement(what, distinct_bytes, c)) {
        into.push(msg);
    }
}

/// What a benchmark part run in a child hands back to the report.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Part {
    /// Rows, in order.
    pub rows: Vec<Row>,
    /// Notes.
    pub notes: Vec<String>,
    /// Configuration entries.
    pub configuration: BTreeMap<String, serde_json::Value>,
    /// Figures on which the meters disagree.
    pub disagreements: Vec<String>,
}

impl Part {
    /// Checks one figure, recording a disagreement.
    pub fn check(&mut self, what: &str, distinct_bytes: f64, cgroup_bytes: Option<f64>) {
        check(&mut self.disagreements, what, distinct_bytes, cgroup_bytes);
    }
}

/// Runs `work` in a forked child inside a fresh memory cgroup `name` and returns what
/// it returned. Without cgroups (not root, not mounted) it runs here with no group, and
/// `unavailable` receives the reason.
pub fn in_group<T: Serialize + DeserializeOwned>(
    name: &str,
    unavailable: &mut Option<String>,
    work: impl FnOnce(Option<&Group>) -> Result<T, BenchError>,
) -> Result<T, BenchError> {
    let group = match Group::create(name) {
        Ok(g) => g,
        Err(e) => {
            *unavailable = Some(format!("cgroup meter unavailable ({e}): distinct-page meter only"));
            return work(None);
        }
    };
    let reply = group.run_in_child(|| {
        let v = work(Some(&group)).map_err(|e| e.to_string())?;
        serde_json::to_vec(&v).map_err(|e| e.to_string())
    })?;
    group.remove()?;
    let bytes = reply.map_err(BenchError::Usage)?;
    serde_json::from_slice(&bytes).map_err(|e| BenchError::Usage(format!("reply of the measured child: {e}")))
}
