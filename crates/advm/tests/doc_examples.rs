//! The docs' examples are real programs: each `<!-- example: PATH -->` line in
//! `docs/*.md` is followed by a fenced block that must equal the file PATH byte for byte,
//! every example program is shown in some page, and advm's Rust examples run here
//! (advm-gc's in that crate's tests, the C ones in advm-capi's, the Python one in
//! advm-py's pytest suite).
//!
//! After editing an example, `ADVM_UPDATE_DOC_EXAMPLES=1 cargo test -p advm --test
//! doc_examples` copies the files into the pages.

use std::path::{Path, PathBuf};
use std::process::Command;

/// advm's examples that the docs show, run by [`advm_examples_run`].
const ADVM_EXAMPLES: &[&str] = &["stat", "vcopy", "remap", "pager", "merge", "image"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// One example block of a page: where its fence's content starts and ends (byte
/// offsets into the page), and the file it shows.
struct Shown {
    page: PathBuf,
    line: usize,
    file: String,
    body: std::ops::Range<usize>,
}

fn shown_in(page: &Path, text: &str) -> Vec<Shown> {
    let mut out = Vec::new();
    let mut offset = 0;
    let mut lines = text.split_inclusive('\n').enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        offset += line.len();
        let Some(file) = line.trim().strip_prefix("<!-- example:").and_then(|l| l.strip_suffix("-->")) else {
            continue;
        };
        let fence = lines.next().map(|(_, l)| l).unwrap_or("");
        assert!(
            fence.starts_with("```"),
            "{}:{}: the example marker is not followed by a fence",
            page.display(),
            i + 1
        );
        offset += fence.len();
        let start = offset;
        loop {
            let (_, l) = lines.next().unwrap_or_else(|| panic!("{}:{}: unclosed fence", page.display(), i + 2));
            if l.trim_end() == "```" {
                out.push(Shown {
                    page: page.to_path_buf(),
                    line: i + 1,
                    file: file.trim().to_string(),
                    body: start..offset,
                });
                offset += l.len();
                break;
            }
            offset += l.len();
        }
    }
    out
}

#[test]
fn every_example_block_equals_its_file_and_every_example_is_shown() {
    let root = root();
    let update = std::env::var_os("ADVM_UPDATE_DOC_EXAMPLES").is_some();
    let mut shown = Vec::new();
    let mut stale = Vec::new();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    for page in &pages {
        let mut text = std::fs::read_to_string(page).unwrap();
        let blocks = shown_in(page, &text);
        // back to front, so earlier offsets stay valid while rewriting
        for b in blocks.iter().rev() {
            let file = std::fs::read_to_string(root.join(&b.file))
                .unwrap_or_else(|e| panic!("{}:{}: example {}: {e}", b.page.display(), b.line, b.file));
            if text[b.body.clone()] != *file {
                if update {
                    text.replace_range(b.body.clone(), &file);
                } else {
                    stale.push(format!("{}:{} shows {} as it was", b.page.display(), b.line, b.file));
                }
            }
            shown.push(b.file.clone());
        }
        if update {
            std::fs::write(page, &text).unwrap();
        }
    }
    assert!(
        stale.is_empty(),
        "pages out of date with their examples (ADVM_UPDATE_DOC_EXAMPLES=1 cargo test -p advm --test doc_examples copies them in):\n{}",
        stale.join("\n")
    );
    let mut programs: Vec<String> = ADVM_EXAMPLES.iter().map(|n| format!("crates/advm/examples/{n}.rs")).collect();
    programs.push("crates/advm-gc/examples/gc.rs".into());
    for dir in ["examples/c", "examples/python"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            programs.push(format!("{dir}/{}", e.unwrap().file_name().to_string_lossy()));
        }
    }
    let unshown: Vec<_> = programs.iter().filter(|p| !shown.contains(p)).collect();
    assert!(unshown.is_empty(), "examples no page shows: {unshown:?}");
}

/// Why an example cannot run here, if it cannot.
fn cannot_run(name: &str) -> Option<String> {
    match name {
        "pager" => advm::pager::Pager::new(advm::pager::Config::new(1 << 20)).err().map(|e| e.to_string()),
        "image" => ["qemu-img", "qemu-io"]
            .into_iter()
            .find(|t| Command::new(t).arg("--version").output().is_err())
            .map(|t| format!("no {t} (Debian's qemu-utils)")),
        _ => None,
    }
}

#[test]
fn advm_examples_run() {
    // .../target/<profile>/deps/doc_examples-HASH -> .../target/<profile>/examples
    let dir = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("examples");
    for name in ADVM_EXAMPLES {
        if let Some(why) = cannot_run(name) {
            eprintln!("{name} example skipped: {why}");
            continue;
        }
        let exe = dir.join(name);
        assert!(exe.exists(), "{} missing: cargo test builds the examples", exe.display());
        // The merge example uses this process's own store, never a daemon of the machine.
        let out = Command::new(&exe).env("ADVM_SOCKET", "/nonexistent/advmd.sock").output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "example {name} failed ({}):\n{text}", out.status);
        eprintln!("example {name}: {text}");
    }
}
