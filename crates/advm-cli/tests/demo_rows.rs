//! `advm demo --only merge` and `--only pager`: each capability shows one row measured
//! against its baseline.

use std::process::Command;

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

/// The one row of `advm demo --only NAME --json`.
fn demo_row(name: &str) -> serde_json::Value {
    let out = Command::new(ADVM).args(["demo", "--only", name, "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{v}");
    assert_eq!(rows[0]["capability"], name, "{v}");
    rows[0].clone()
}

/// The numbers in `s`, in order.
fn numbers(s: &str) -> Vec<f64> {
    s.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|t| !t.is_empty() && *t != ".")
        .map(|t| t.parse().unwrap())
        .collect()
}

/// Two buffers of the same bytes merged through advmd take about one buffer's memory
/// (the store's pages included), by both meters; unmerged, two.
#[test]
fn demo_merge_row_counts_the_store_and_halves_two_identical_buffers() {
    let row = demo_row("merge");
    let (advm, baseline) = (row["advm"].as_str().unwrap(), row["baseline"].as_str().unwrap());
    // "M MiB (cgroup C MiB) incl. the store; merge T ms (A GB/s adding, G GB/s merging)"
    // Without root there is no cgroup meter (creating a memory cgroup needs root): one meter.
    let meters = if advm::process::is_root() { 2 } else { 1 };
    let a = numbers(advm);
    assert!(advm.contains("incl. the store") && advm.contains("cgroup") == (meters == 2), "{advm}");
    // "no merging: M MiB (cgroup C MiB)"
    let b = numbers(baseline);
    assert!(baseline.starts_with("no merging") && baseline.contains("cgroup") == (meters == 2), "{baseline}");
    if meters == 2 {
        for (merged, unmerged) in a.iter().zip(&b).take(meters) {
            assert!((124.0..140.0).contains(unmerged), "two 64 MiB buffers unmerged: {baseline}");
            assert!((64.0..80.0).contains(merged), "one buffer's pages and the store's: {advm}");
        }
    } else {
        // PSS (PFNs are hidden too): the process's share, 120.8 MiB unmerged in one run as
        // uid 1001 and over 124 MiB in another; merging still about halves it
        assert!(b[0] > 100.0 && a[0] < 0.7 * b[0], "merged {advm}, unmerged {baseline}");
    }
    assert!(a[meters..meters + 3].iter().all(|&x| x > 0.0), "merge time and throughputs: {advm}");
}

/// One copying-collector cycle over a region twice its budget: from-space, marked
/// discardable after the copy, is dropped when evicted, not written, where the same
/// pager told nothing writes it (and reads it back when from-space is reused).
#[test]
fn demo_pager_row_writes_no_discardable_page() {
    let row = demo_row("pager");
    let advm = row["advm"].as_str().unwrap();
    if advm.starts_with("skipped:") {
        eprintln!("{advm}");
        return;
    }
    let baseline = row["baseline"].as_str().unwrap();
    // "W pages written (B), R read back, Z zero-filled, T ms; D evicted pages dropped unwritten"
    let pages = |s: &str, what: &str| -> u64 {
        let at = s.find(what).unwrap_or_else(|| panic!("no {what:?} in {s}"));
        s[..at].trim_end().rsplit([' ', ',', '(', ';', ':']).next().unwrap().parse().unwrap()
    };
    let (told, blind) = (pages(advm, " pages written"), pages(baseline, " pages written"));
    let dropped = pages(advm, " evicted pages dropped");
    // from-space (16 MiB), discardable, is evicted once and never written; the blind
    // pass writes it too (give or take one eviction step, a 64th of the budget), and
    // the needed pages as often as the told one
    let half = (16 << 20) / advm::mem::page_size() as u64;
    assert!(dropped >= half, "{advm}");
    assert!(blind + half / 64 >= told + half, "blind {baseline}, told {advm}");
    assert!(pages(advm, " zero-filled") > pages(baseline, " zero-filled"), "{advm} / {baseline}");
    assert!(row["gain"].as_str().unwrap().contains("fewer pages written"), "{row}");
}
