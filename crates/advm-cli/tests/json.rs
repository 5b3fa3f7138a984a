//! `--json`: every command that has it and runs in a moment prints exactly one JSON
//! document on stdout with the field names its docs page lists, nothing on stderr;
//! with an error, nothing on stdout, the message on stderr, status 1.

#[allow(dead_code)] // the scratch directory only
mod common;

use std::process::Command;

/// Runs `advm args` in `dir`; returns (status, stdout, stderr).
fn advm(dir: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_advm")).args(args).current_dir(dir).output().unwrap();
    let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code().unwrap_or(-1), s(out.stdout), s(out.stderr))
}

/// The one JSON object `advm args` printed, checked to hold `fields`.
fn document(dir: &std::path::Path, args: &[&str], fields: &[&str]) -> serde_json::Value {
    let (code, out, err) = advm(dir, args);
    assert_eq!(code, 0, "advm {args:?}: {err}");
    assert_eq!(err, "", "advm {args:?} wrote on stderr");
    // One document: a stream reader finds exactly one value.
    let values: Vec<serde_json::Value> =
        serde_json::Deserializer::from_str(&out).into_iter().collect::<Result<_, _>>().unwrap_or_else(|e| {
            panic!("advm {args:?}: stdout is not JSON ({e}): {out}");
        });
    assert_eq!(values.len(), 1, "advm {args:?} printed {} JSON documents", values.len());
    let v = values.into_iter().next().unwrap();
    for f in fields {
        assert!(v.get(f).is_some(), "advm {args:?}: no field {f:?} in {v}");
    }
    v
}

/// The memory cgroup this process is in, as a directory (v2, else v1's hierarchy).
fn own_memory_cgroup() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let dir = match controllers {
            "" => format!("/sys/fs/cgroup{path}"),
            c if c.split(',').any(|c| c == "memory") => format!("/sys/fs/cgroup/memory{path}"),
            _ => continue,
        };
        if std::path::Path::new(&dir).is_dir() {
            return Some(dir);
        }
    }
    None
}

#[test]
fn each_json_command_prints_one_document_with_its_documented_fields() {
    let d = common::dir("json");
    std::fs::write(d.0.join("disk.raw"), vec![1u8; 1 << 20]).unwrap();
    document(&d.0, &["doctor", "--json"], &["facts", "checks"]);
    let sample = ["distinct", "anon_shmem_bytes", "held_pages", "mapped_pages", "rss_bytes", "pss_bytes", "ksm"];
    document(&d.0, &["stat", "--json", "self"], &sample);
    document(
        &d.0,
        &["stat", "--json", "--watch", "0.2", "--interval", "50", "self"],
        &["samples", "duration_s", "physical_bytes", "held_bytes", "anon_shmem_bytes", "last"],
    );
    match own_memory_cgroup() {
        Some(g) => {
            document(&d.0, &["stat", "--json", "--cgroup", &g], &["group", "version", "usage", "anon_shmem_bytes"]);
        }
        None => eprintln!("skipping stat --cgroup: no memory cgroup found for this process"),
    }
    let info = document(&d.0, &["image", "info", "--json", "disk.raw"], &["virtual_size_bytes", "layers"]);
    assert_eq!(info["virtual_size_bytes"], 1 << 20);
    let map = document(&d.0, &["image", "map", "--json", "disk.raw"], &["virtual_size_bytes", "extents"]);
    let e = &map["extents"][0];
    for f in ["start", "length", "kind", "depth", "file", "offset"] {
        assert!(e.get(f).is_some(), "no field {f:?} in extent {e}");
    }
    // `bench list --json` printed the text list.
    let (code, out, err) = advm(&d.0, &["bench", "list", "--json"]);
    assert_eq!((code, err.as_str()), (0, ""));
    let list: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let stat = list.iter().find(|b| b["name"] == "stat").unwrap_or_else(|| panic!("no stat in {out}"));
    assert!(stat["description"].is_string() && stat["default_runs"].as_u64() >= Some(1), "{stat}");
}

#[test]
fn a_json_command_that_fails_prints_nothing_on_stdout_and_the_error_on_stderr() {
    let d = common::dir("json-errors");
    for (args, says) in [
        (
            &["image", "info", "--json", "nothere.qcow2"][..],
            "advm: nothere.qcow2: No such file or directory (os error 2)\n",
        ),
        (&["stat", "--json", "0"][..], "advm: "),
    ] {
        let (code, out, err) = advm(&d.0, args);
        assert_eq!((code, out.as_str()), (1, ""), "advm {args:?}: {err}");
        assert!(err.starts_with(says), "advm {args:?}: {err}");
    }
}
