//! Repeated sampling: the paper samples once a second and averages the samples.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{Meter, Sample};
use crate::{Error, Result};

/// Mean and maximum of one figure over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Aggregate {
    /// Arithmetic mean of the samples.
    pub mean: f64,
    /// Largest sample.
    pub max: f64,
}

impl Aggregate {
    /// Mean and maximum of `values` (zeros when there are none).
    pub(crate) fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        Self {
            mean: values.iter().sum::<f64>() / values.len() as f64,
            max: values.iter().cloned().fold(f64::MIN, f64::max),
        }
    }
}

/// What a watched run came to.
#[derive(Debug, Clone, Serialize)]
pub struct WatchSummary {
    /// Number of samples taken.
    pub samples: usize,
    /// Wall time watched, seconds.
    pub duration_s: f64,
    /// Requested sampling interval, milliseconds.
    pub interval_ms: u64,
    /// Physical memory (distinct pages, or PSS when PFNs are hidden), bytes.
    pub physical_bytes: Aggregate,
    /// Pages of shmem objects held but not mapped, bytes (part of `physical_bytes`).
    pub held_bytes: Aggregate,
    /// The anon + shmem part of `physical_bytes` (no page cache), bytes.
    pub anon_shmem_bytes: Aggregate,
    /// Distinct mapped pages, when PFNs are visible.
    pub distinct_pages: Option<Aggregate>,
    /// Summed RSS, bytes.
    pub rss_bytes: Aggregate,
    /// Summed PSS, bytes.
    pub pss_bytes: Aggregate,
    /// ksmd CPU seconds spent during the run.
    pub ksmd_cpu_seconds: Option<f64>,
    /// Why the run ended before its duration (e.g. the process exited), if it did.
    pub ended_early: Option<String>,
    /// The last sample.
    pub last: Option<Sample>,
}

/// Samples `meter` every `interval` for `duration` (or until the processes exit when
/// `duration` is `None`), calling `on_sample` after each. A process exiting ends the run
/// early and is reported in the summary, not as an error, once at least one sample was
/// taken; so does `on_sample` returning `ControlFlow::Break` (e.g. the caller's output
/// was closed), with `ended_early` "stopped by the caller".
pub fn watch(
    meter: &mut Meter,
    duration: Option<Duration>,
    interval: Duration,
    mut on_sample: impl FnMut(&Sample) -> ControlFlow<()>,
) -> Result<WatchSummary> {
    let start = Instant::now();
    let ksmd_start = super::ksmd_cpu_seconds();
    let (mut phys, mut distinct, mut rss, mut pss) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut held, mut anon_shmem) = (Vec::new(), Vec::new());
    let mut last = None;
    let mut ended_early = None;
    let mut next = start;
    loop {
        match meter.sample() {
            Ok(s) => {
                phys.push(s.physical_bytes as f64);
                held.push((s.held_pages * s.page_size_bytes) as f64);
                anon_shmem.push(s.anon_shmem_bytes as f64);
                if let Some(d) = s.distinct {
                    distinct.push(d.total as f64);
                }
                rss.push(s.rss_bytes as f64);
                pss.push(s.pss_bytes as f64);
                let flow = on_sample(&s);
                last = Some(s);
                if flow.is_break() {
                    ended_early = Some("stopped by the caller".to_string());
                    break;
                }
            }
            Err(e @ (Error::ProcessExited { .. } | Error::NoSuchProcess { .. })) if last.is_some() => {
                ended_early = Some(e.to_string());
                break;
            }
            Err(e) => return Err(e),
        }
        next += interval;
        let now = Instant::now();
        if duration.is_some_and(|d| next.duration_since(start) > d) {
            break;
        }
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    Ok(WatchSummary {
        samples: phys.len(),
        duration_s: start.elapsed().as_secs_f64(),
        interval_ms: interval.as_millis() as u64,
        physical_bytes: Aggregate::of(&phys),
        held_bytes: Aggregate::of(&held),
        anon_shmem_bytes: Aggregate::of(&anon_shmem),
        distinct_pages: (!distinct.is_empty() && distinct.len() == phys.len()).then(|| Aggregate::of(&distinct)),
        rss_bytes: Aggregate::of(&rss),
        pss_bytes: Aggregate::of(&pss),
        ksmd_cpu_seconds: match (ksmd_start, super::ksmd_cpu_seconds()) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        },
        ended_early,
        last,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregate_mean_and_max() {
        let a = Aggregate::of(&[1.0, 2.0, 6.0]);
        assert_eq!(a, Aggregate { mean: 3.0, max: 6.0 });
        assert_eq!(Aggregate::of(&[]), Aggregate::default());
    }
}
