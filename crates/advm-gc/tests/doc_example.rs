//! docs/gc.md's example (`examples/gc.rs`) runs; advm's `doc_examples` test checks the
//! page shows it as it is.

#[test]
fn the_docs_example_runs() {
    // .../target/<profile>/deps/doc_example-HASH -> .../target/<profile>/examples/gc
    let exe = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("examples/gc");
    assert!(exe.exists(), "{} missing: cargo test builds the examples", exe.display());
    let out = std::process::Command::new(&exe).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the gc example failed ({}):\n{text}", out.status);
    assert!(text.contains("B as pages"), "{text}");
}
