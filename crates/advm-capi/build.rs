//! The C tests check that libadvm.so is newer than include/ (a stale library would
//! test old code): a header edit must relink it, so cargo watches include/ too.
fn main() {
    println!("cargo:rerun-if-changed=../../include");
}
