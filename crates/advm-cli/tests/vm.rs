//! `advm vm`: the pmem backing as an unmodified program maps it (the shim puts the
//! image plan where the program maps the backend file), and clear errors for bad input.
//! Booting a guest is too slow for the test suite (see docs/vm.md for how it was run).

use std::path::Path;
use std::process::Command;

use advm::image::{Image, MapOptions, PmemBacking};

mod common;
use common::{dir, have, run};

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

fn chain(d: &Path) {
    run(d, "qemu-img", &["create", "-q", "-f", "raw", "base.raw", "3M"]);
    run(d, "qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 2M", "base.raw"]);
    run(d, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "base.raw", "-F", "raw", "top.qcow2"]);
    run(
        d,
        "qemu-io",
        &["-c", "write -P 0x22 1M 64k", "-c", "write -z 64k 64k", "-c", "write -c -P 0x33 2M 64k", "top.qcow2"],
    );
}

/// Maps the file like QEMU's memory-backend-file (share=off), writes to the mapping,
/// then prints the mapping's bytes.
const MAPPER: &str = r#"
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
m = mmap.mmap(fd, int(sys.argv[2]), mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
m[4096:4100] = b"VMWR"
sys.stdout.buffer.write(m[:])
"#;

#[test]
fn a_program_mapping_the_backing_file_under_the_shim_sees_the_image_and_writes_stay_private() {
    if !have("qemu-img") || !have("python3") {
        return;
    }
    let d = dir("backing");
    chain(&d.0);
    let expected = {
        run(&d.0, "qemu-img", &["convert", "-O", "raw", "top.qcow2", "flat.raw"]);
        std::fs::read(d.0.join("flat.raw")).unwrap()
    };
    let before = std::fs::read(d.0.join("base.raw")).unwrap();
    let image = Image::open(d.0.join("top.qcow2")).unwrap();
    let b = PmemBacking::new(&image, &MapOptions { writable: true, ..Default::default() }, 2 << 20).unwrap();
    assert_eq!(b.size(), 4 << 20);
    let (k, v) = b.env();
    let out = Command::new("python3")
        .args(["-c", MAPPER, &b.backing_path(), &b.size().to_string()])
        .env("LD_PRELOAD", advm_preload::launch::shim_path().unwrap())
        .env("ADVM_MODE", "off")
        .env(k, v)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got = out.stdout;
    assert_eq!(got.len(), 4 << 20);
    assert_eq!(&got[4096..4100], b"VMWR");
    assert_eq!(&got[..4096], &expected[..4096]);
    assert_eq!(&got[4100..expected.len()], &expected[4100..], "the mapping reads as qemu-img's flat image");
    assert!(got[expected.len()..].iter().all(|&x| x == 0), "the padding reads as zeros");
    assert_eq!(std::fs::read(d.0.join("base.raw")).unwrap(), before, "writes never reach a layer");
    // Without the shim the program would see the plan file itself, not the disk.
    let plain = Command::new("python3")
        .args(["-c", MAPPER, &b.backing_path(), &b.size().to_string()])
        .env(k, b.env().1)
        .output()
        .unwrap();
    assert_ne!(&plain.stdout[..8], &got[..8]);
}

fn advm(args: &[&str]) -> (bool, String) {
    let out = Command::new(ADVM).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn run_refuses_a_missing_qemu_kernel_or_chain_with_what_is_missing() {
    let d = dir("errors");
    let img = d.0.join("app.qcow2");
    let (okay, e) = advm(&["vm", "run", "--image", img.to_str().unwrap(), "--qemu", "/nonexistent/qemu-system-x86_64"]);
    assert!(!okay && e.contains("/nonexistent/qemu-system-x86_64: not found"), "{e}");
    if !have("qemu-system-x86_64") {
        return;
    }
    let (okay, e) = advm(&["vm", "run", "--image", img.to_str().unwrap()]);
    assert!(!okay && e.contains("vmlinuz") && e.contains("advm vm image build"), "{e}");
    std::fs::write(d.0.join("vmlinuz"), b"k").unwrap();
    std::fs::write(d.0.join("initrd.img"), b"i").unwrap();
    let (okay, e) = advm(&["vm", "run", "--image", img.to_str().unwrap(), "--accel", "tcg"]);
    assert!(!okay && e.contains("app.qcow2"), "a missing chain is named: {e}");
    let (okay, e) = advm(&["vm", "run", "--image", img.to_str().unwrap(), "--accel", "warp"]);
    assert!(!okay && e.contains("--accel warp"), "{e}");
}

#[test]
fn accel_kvm_says_why_when_dev_kvm_cannot_run_the_guest() {
    let d = dir("kvm");
    std::fs::write(d.0.join("vmlinuz"), b"k").unwrap();
    std::fs::write(d.0.join("initrd.img"), b"i").unwrap();
    if !have("qemu-system-x86_64") {
        return;
    }
    let hardware = ["kvm_intel", "kvm_amd"].iter().any(|m| Path::new("/sys/module").join(m).exists());
    if hardware {
        eprintln!("skipping: hardware KVM is present, --accel kvm is accepted here");
        return;
    }
    let img = d.0.join("app.qcow2");
    let (okay, e) = advm(&["vm", "run", "--image", img.to_str().unwrap(), "--accel", "kvm"]);
    assert!(!okay && e.contains("/dev/kvm"), "{e}");
}

#[test]
fn dump_of_a_vm_that_is_not_running_says_so() {
    let (okay, e) = advm(&["vm", "dump", "--vm", "999999999", "--out", "/tmp/never.qcow2"]);
    assert!(!okay && e.contains("999999999") && e.contains("advm vm run"), "{e}");
}
