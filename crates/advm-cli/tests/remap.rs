//! `advm bench remap --quick`: runs every section in seconds and reports the targets.

use std::process::Command;

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

#[test]
fn quick_bench_reports_every_section_and_the_targets() {
    let dir = std::env::temp_dir().join(format!("advm-remap-bench-{}", std::process::id()));
    let out = Command::new(ADVM)
        .args(["bench", "remap", "--quick", "--json", "--runs", "1"])
        // A private cache so the test measures the break-even itself.
        .env("XDG_CACHE_HOME", &dir)
        .env_remove(advm_env())
        .output()
        .expect("run advm bench remap");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let rows = report["rows"].as_array().unwrap();
    let section = |r: &serde_json::Value| {
        r["config"]
            .as_array()
            .unwrap()
            .iter()
            .find(|kv| kv[0] == "section")
            .map(|kv| kv[1].as_str().unwrap().to_string())
    };
    let mut seen: Vec<String> = rows.iter().filter_map(section).collect();
    seen.dedup();
    for s in ["break-even", "size", "threads", "alignment", "slide"] {
        assert!(seen.iter().any(|x| x == s), "no {s} rows in {seen:?}");
    }
    let uffd = report["configuration"]["uffd_move"].as_bool().unwrap();
    if uffd {
        assert!(seen.iter().any(|x| x == "batch"));
        assert!(report["configuration"]["targets"]["break_even_cold_1t_pages"].as_u64().is_some());
    }
    let notes: Vec<&str> = report["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(notes.iter().any(|n| n.contains("1 GiB move not measured in --quick")), "{notes:?}");
    // Every figure is a real measurement.
    for r in rows {
        for f in r["figures"].as_array().unwrap() {
            assert!(f["median"].as_f64().is_some_and(|m| m.is_finite() && m > 0.0), "{r}");
        }
    }
}

fn advm_env() -> &'static str {
    "ADVM_REMAP_BREAK_EVEN_PAGES"
}
