//! `advm vm`: the pmem backing as an unmodified program maps it (the shim puts the
//! image plan where the program maps the backend file), a pmem guest booting under the
//! emulator with its root on DAX (when the guest has been built), and clear errors for
//! bad input.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use advm::image::{Image, MapOptions, PmemBacking};

mod common;
use common::{dir, have, run};

const ADVM: &str = env!("CARGO_BIN_EXE_advm");

/// A kernel and an initramfs in `d` that pass `advm vm run`'s checks (a bzImage
/// header's `HdrS` at 0x202; a cpio archive's magic) for runs whose QEMU is a stand-in.
fn boot_files(d: &Path) {
    let mut kernel = vec![0u8; 1024];
    kernel[0x202..0x206].copy_from_slice(b"HdrS");
    std::fs::write(d.join("vmlinuz"), kernel).unwrap();
    std::fs::write(d.join("initrd.img"), b"070701").unwrap();
}

/// A stand-in QEMU at `d/qemu`: the script `body`, executable.
fn stand_in_qemu(d: &Path, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let qemu = d.join("qemu");
    std::fs::write(&qemu, body).unwrap();
    std::fs::set_permissions(&qemu, std::fs::Permissions::from_mode(0o755)).unwrap();
    qemu
}

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

/// Maps the backing like QEMU, writes two pages, holds 64 MiB of other memory, asks the
/// shim for a dump (signal 61) and overwrites the two pages while the copier runs; then
/// says whether the 64 MiB mapping carries MADV_DONTFORK after the dump.
const DUMPER: &str = r#"
import ctypes, mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
d = sys.argv[3]
m = mmap.mmap(fd, int(sys.argv[2]), mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
big = bytearray(b"\x01") * (64 << 20)
# memory the program marks MADV_DONTFORK itself, through madvise() (QEMU's guest RAM)
own = mmap.mmap(-1, 4 << 20, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
own.madvise(mmap.MADV_DONTFORK)
own[:] = b"\x03" * (4 << 20)
m[4096:4100] = b"VMWR"
m[(1 << 20) + 8192:(1 << 20) + 8196] = b"TWO!"
os.kill(os.getpid(), 61)
for i in range(4000):
    m[4096:4100] = b"LATE"
    m[(1 << 20) + 8192:(1 << 20) + 8196] = b"LATE"
    big[i * 4096] = 2
t = time.time()
while not os.path.exists(os.path.join(d, "dump.done")) and time.time() - t < 20:
    time.sleep(0.01)
for a in (ctypes.addressof((ctypes.c_char * 1).from_buffer(big)), ctypes.addressof((ctypes.c_char * 1).from_buffer(own))):
    lo = None
    for line in open("/proc/self/smaps"):
        if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
            s, e = (int(x, 16) for x in line.split()[0].split("-"))
            lo = s if s <= a < e else None
        elif line.startswith("VmFlags") and lo is not None:
            print("dc" if " dc" in line else "no dc")
"#;

#[test]
fn the_shims_dump_copies_the_device_as_at_the_signal_leaves_other_memory_out_and_unmarks_it() {
    // 0: the shim read /proc/self/smaps (which mappings hold pages, which carry `dc`)
    shim_dump("shimdump", None, 0);
}

#[test]
fn the_shims_dump_reads_maps_and_its_own_records_when_asked() {
    // 1: it learnt the program's own marks from its record of the program's madvise()
    // calls and /proc/self/maps (no page-table walk)
    shim_dump("shimdump-maps", Some("ADVM_PMEM_DUMP_MAPS"), 1);
}

/// The same as a user who sees no PFNs in pagemap (uid 65534; as root, the test above
/// is rerun as that user). The shim took the zero page's frame for 0, which every
/// frame reads as then, and left every written cluster out of the dump.
#[test]
fn the_shims_dump_keeps_the_written_clusters_for_a_user_who_sees_no_pfns() {
    use std::os::unix::{fs::PermissionsExt, process::CommandExt};
    if !advm::process::is_root() {
        eprintln!("skipped: the tests above run as this user, who sees no PFNs");
        return;
    }
    let home = std::env::temp_dir().join(format!("advm-test-shimdump-nobody-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o777)).unwrap();
    let test = "the_shims_dump_copies_the_device_as_at_the_signal_leaves_other_memory_out_and_unmarks_it";
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env("XDG_CACHE_HOME", &home)
        .env("HOME", &home)
        .uid(65534)
        .gid(65534)
        .current_dir("/")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&home);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !text.contains("running 1 test") {
        eprintln!("skipped: the test binary cannot run as uid 65534: {text}");
        return;
    }
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

/// The shim's dump of a device in a Python program, with `option` set to 1; `scan`:
/// how the shim must have found what to leave out of the fork (1 maps, 0 smaps).
fn shim_dump(name: &str, option: Option<&str>, scan: u64) {
    if !have("qemu-img") || !have("python3") {
        return;
    }
    let d = dir(name);
    chain(&d.0);
    let image = Image::open(d.0.join("top.qcow2")).unwrap();
    let b = PmemBacking::new(&image, &MapOptions { writable: true, ..Default::default() }, 2 << 20).unwrap();
    let (k, v) = b.env();
    let out = Command::new("python3")
        .args(["-c", DUMPER, &b.backing_path(), &b.size().to_string(), &d.0.display().to_string()])
        .env("LD_PRELOAD", advm_preload::launch::shim_path().unwrap())
        .env("ADVM_MODE", "off")
        .env(advm::image::DUMP_DIR_ENV, &d.0)
        .env(k, v)
        .envs(option.map(|o| (o, "1")))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let read = |n: &str| std::fs::read_to_string(d.0.join(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
    assert_eq!(read("dump.done").trim(), "0", "the copier finished");
    let flags: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(flags, ["no dc", "dc"], "the other memory is unmarked after the fork, the program's own mark kept");
    let clusters: Vec<u64> = read("dump.clusters").lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(clusters, [0, 16], "the two written clusters");
    let raw = std::fs::read(d.0.join("dump.raw")).unwrap();
    assert_eq!(&raw[4096..4100], b"VMWR", "the device as it was at the signal");
    assert_eq!(&raw[(1 << 20) + 8192..(1 << 20) + 8196], b"TWO!");
    // scan, marks, fork, after, ranges, KiB left out (at least the 64 MiB), and the scan
    let timing: Vec<u64> = read("dump.timing").lines().map(|l| l.parse().unwrap()).collect();
    assert!(timing.len() == 7 && timing[4] >= 1 && timing[5] >= 64 << 10, "left out of the fork: {timing:?}");
    assert_eq!(timing[6], scan, "{option:?}: the wrong scan (1 maps, 0 smaps): {timing:?}");
}

/// The mappings of process `pid` that carry `MADV_DONTFORK` (`dc`), with their names.
fn dont_fork_ranges(pid: u64) -> Vec<((usize, usize), String)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut out = Vec::new();
    let mut cur = None;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = head.split_once('-').filter(|_| line.len() > 40) {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                cur = Some(((a, b), line.split_whitespace().nth(5).unwrap_or("").to_string()));
                continue;
            }
        }
        if line.starts_with("VmFlags:") && line.split_whitespace().any(|f| f == "dc") {
            out.extend(cur.take());
        }
    }
    out
}

fn advm(args: &[&str]) -> (bool, String) {
    let out = Command::new(ADVM).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn run_refuses_a_missing_qemu_kernel_or_chain_with_what_is_missing() {
    let d = dir("errors");
    let img = d.0.join("app.qcow2");
    // A missing image is named first (not the kernel that defaults to a file beside it).
    let (okay, e) = advm(&["vm", "run", "--image", img.to_str().unwrap(), "--qemu", "/nonexistent/qemu-system-x86_64"]);
    assert!(!okay && e.contains("app.qcow2: not found"), "{e}");
    // So is a directory (the build's, for its app.qcow2): it said `kernel DIR/../vmlinuz: not found`.
    let (okay, e) = advm(&["vm", "run", "--image", d.0.to_str().unwrap()]);
    assert!(!okay && e.contains(&format!("image {}: is a directory", d.0.display())), "{e}");
    std::fs::write(&img, b"not a qcow2 image").unwrap();
    let (okay, e) = advm(&["vm", "run", "--image", img.to_str().unwrap(), "--qemu", "/nonexistent/qemu-system-x86_64"]);
    assert!(!okay && e.contains("/nonexistent/qemu-system-x86_64: not found"), "{e}");
    if !have("qemu-system-x86_64") {
        return;
    }
    let (okay, e) = advm(&["vm", "run", "--image", img.to_str().unwrap()]);
    assert!(!okay && e.contains("vmlinuz") && e.contains("advm vm image build"), "{e}");
    boot_files(&d.0);
    // A chain whose backing layer is gone: the missing layer is named.
    let base = d.0.join("base.qcow2");
    let made = |args: &[&str]| Command::new("qemu-img").args(args).status().is_ok_and(|s| s.success());
    if made(&["create", "-q", "-f", "qcow2", base.to_str().unwrap(), "64M"])
        && made(&["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base.to_str().unwrap(), img.to_str().unwrap()])
    {
        std::fs::remove_file(&base).unwrap();
        let (okay, e) = advm(&["vm", "run", "--image", img.to_str().unwrap(), "--accel", "tcg"]);
        assert!(!okay && e.contains("base.qcow2"), "the missing layer is named: {e}");
    }
    let (okay, e) = advm(&["vm", "run", "--image", img.to_str().unwrap(), "--accel", "warp"]);
    assert!(!okay && e.contains("--accel warp"), "{e}");
}

/// An overlay a user makes beside their own files over the built guest (`qemu-img
/// create -b ~/.cache/advm/vm/app.qcow2`) has its backing outside its directory: the
/// refusal names `--allow-backing-outside`, and `advm vm run` takes it (it was
/// `advm image`'s flag only: clap refused it as an unexpected argument).
#[test]
fn run_follows_a_backing_file_outside_the_overlays_directory_when_allowed() {
    let (d, base_dir) = (dir("outside"), dir("outside-base"));
    if !have("qemu-img") {
        return;
    }
    let base = base_dir.0.join("app.qcow2");
    run(&base_dir.0, "qemu-img", &["create", "-q", "-f", "qcow2", "app.qcow2", "16M"]);
    run(&d.0, "qemu-img", &["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base.to_str().unwrap(), "my.qcow2"]);
    boot_files(&d.0);
    let img = d.0.join("my.qcow2");
    let vm_run = |extra: &[&str]| {
        let mut args = vec!["vm", "run", "--image", img.to_str().unwrap(), "--accel", "tcg", "--qemu", "/bin/false"];
        args.extend_from_slice(extra);
        let out = Command::new(ADVM).args(&args).env("ADVM_SOCKET", d.0.join("no-advmd.sock")).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (okay, e) = vm_run(&[]);
    assert!(!okay && e.contains("outside") && e.contains("--allow-backing-outside"), "{e}");
    // Allowed, the chain is mapped and QEMU (here /bin/false) is started.
    let (okay, e) = vm_run(&["--allow-backing-outside"]);
    // the failed VM's console and logs are kept, named on stderr: not a test's to keep
    if let Some(kept) = e.lines().find_map(|l| l.strip_prefix("advm vm run: console and logs kept in ")) {
        let _ = std::fs::remove_dir_all(kept.trim());
    }
    assert!(!okay && !e.contains("outside") && !e.contains("unexpected argument") && e.contains("QEMU"), "{e}");
}

/// `--disk blk` of a raw disk (no qcow2 at all, e.g. `qemu-img convert -O raw` of a
/// chain) in a directory whose name has a comma: QEMU is told the top layer's format
/// (it was always `format=qcow2`, and QEMU refused the raw file) and the comma is
/// escaped (QEMU would split the option there). QEMU here is a script that records its
/// arguments.
#[test]
fn blk_names_the_top_layers_format_and_escapes_commas_for_qemu() {
    let d = dir("blk-raw");
    let sub = d.0.join("vm,1");
    std::fs::create_dir(&sub).unwrap();
    boot_files(&sub);
    std::fs::write(sub.join("disk.raw"), vec![0u8; 1 << 20]).unwrap();
    let argv = d.0.join("argv");
    let qemu = stand_in_qemu(&d.0, &format!("#!/bin/sh\nprintf '%s\\n' \"$@\" > {}\nexit 1\n", argv.display()));
    let img = sub.join("disk.raw");
    let out = Command::new(ADVM)
        .args(["vm", "run", "--image", img.to_str().unwrap(), "--disk", "blk", "--accel", "tcg"])
        .args(["--qemu", qemu.to_str().unwrap()])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    if let Some(kept) = e.lines().find_map(|l| l.strip_prefix("advm vm run: console and logs kept in ")) {
        let _ = std::fs::remove_dir_all(kept.trim());
    }
    assert!(!out.status.success() && e.contains("QEMU exited"), "{e}");
    let argv = std::fs::read_to_string(&argv).unwrap();
    let drive = argv.lines().find(|l| l.starts_with("file=")).unwrap_or_else(|| panic!("no -drive: {argv}"));
    let canon = sub.canonicalize().unwrap().join("disk.raw").display().to_string().replace(',', ",,");
    assert_eq!(drive, format!("file={canon},if=none,id=disk0,format=raw,snapshot=on"));
    if !have("qemu-img") {
        return;
    }
    // A top reached through a symlink (`ln -s ~/.cache/advm/vm/app.qcow2 my/`) whose
    // relative backing name then means the file beside the link, as QEMU reads it and
    // as advm mapped it for pmem: QEMU is given the link, not its target (it was given
    // the target, and read the base beside that: another disk).
    let (link_dir, target_dir) = (d.0.join("mine"), d.0.join("cache"));
    for dir in [&link_dir, &target_dir] {
        std::fs::create_dir(dir).unwrap();
        run(dir, "qemu-img", &["create", "-q", "-f", "qcow2", "base.qcow2", "1M"]);
    }
    run(&target_dir, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "app.qcow2"]);
    std::os::unix::fs::symlink(target_dir.join("app.qcow2"), link_dir.join("app.qcow2")).unwrap();
    boot_files(&link_dir);
    let out = Command::new(ADVM)
        .args(["vm", "run", "--image", "app.qcow2", "--disk", "blk", "--accel", "tcg"])
        .args(["--qemu", qemu.to_str().unwrap()])
        .current_dir(&link_dir)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    if let Some(kept) = e.lines().find_map(|l| l.strip_prefix("advm vm run: console and logs kept in ")) {
        let _ = std::fs::remove_dir_all(kept.trim());
    }
    let argv = std::fs::read_to_string(d.0.join("argv")).unwrap();
    let drive = argv.lines().find(|l| l.starts_with("file=")).unwrap_or_else(|| panic!("no -drive: {e} {argv}"));
    let link = link_dir.join("app.qcow2").display().to_string().replace(',', ",,");
    assert_eq!(drive, format!("file={link},if=none,id=disk0,format=qcow2,snapshot=on"));
}

/// Disks refused before QEMU starts say why and leave no work directory "kept" (one
/// was made, empty, and named on stderr): an empty file (a blk guest waited out
/// --timeout with nothing to mount), a chain advm cannot map (an encrypted layer's data).
#[test]
fn an_empty_or_unmappable_disk_is_refused_before_qemu_starts_and_leaves_no_directory() {
    let d = dir("empty-disk");
    boot_files(&d.0);
    let empty = d.0.join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    let vm_run = |img: &Path, disk: &str| {
        let out = Command::new(ADVM)
            .args(["vm", "run", "--image", img.to_str().unwrap(), "--disk", disk])
            .args(["--accel", "tcg", "--qemu", "/bin/false"])
            .env("ADVM_SOCKET", d.0.join("no-advmd.sock"))
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    for disk in ["pmem", "blk"] {
        let (okay, e) = vm_run(&empty, disk);
        assert!(!okay && e.contains("empty.img: the disk's virtual size is 0"), "{disk}: {e}");
        assert!(!e.contains("kept in"), "{disk}: {e}");
    }
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    run(
        &d.0,
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "--object",
            "secret,id=s0,data=pw",
            "-o",
            "encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10",
            "enc.qcow2",
            "4M",
        ],
    );
    run(
        &d.0,
        "qemu-io",
        &[
            "--object",
            "secret,id=s0,data=pw",
            "--image-opts",
            "driver=qcow2,file.filename=enc.qcow2,encrypt.key-secret=s0",
            "-c",
            "write -P 0x11 0 64k",
        ],
    );
    let (okay, e) = vm_run(&d.0.join("enc.qcow2"), "pmem");
    assert!(!okay && e.contains("layer is encrypted (LUKS); decryption is not supported"), "{e}");
    assert!(!e.contains("kept in"), "{e}");
}

/// A compressed image decompresses into memory for the pmem device; over the 256 MiB
/// default the refusal says to raise it with --max-materialised, which `advm vm run`
/// did not have (only `advm image cat` did): a compressed guest image of more than
/// 256 MiB of data could not boot under pmem at all. Here the limit is set below and
/// above a 2 MiB compressed image.
#[test]
fn run_takes_max_materialised_for_compressed_images() {
    let d = dir("materialised");
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    boot_files(&d.0);
    run(&d.0, "qemu-img", &["create", "-q", "-f", "raw", "r.raw", "4M"]);
    run(&d.0, "qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 2M", "r.raw"]);
    run(&d.0, "qemu-img", &["convert", "-c", "-O", "qcow2", "r.raw", "c.qcow2"]);
    let img = d.0.join("c.qcow2");
    let vm_run = |limit: &str| {
        let out = Command::new(ADVM)
            .args(["vm", "run", "--image", img.to_str().unwrap(), "--max-materialised", limit])
            .args(["--accel", "tcg", "--qemu", "/bin/false"])
            .env("ADVM_SOCKET", d.0.join("no-advmd.sock"))
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr).into_owned();
        if let Some(kept) = e.lines().find_map(|l| l.strip_prefix("advm vm run: console and logs kept in ")) {
            let _ = std::fs::remove_dir_all(kept.trim());
        }
        (out.status.success(), e)
    };
    let (okay, e) = vm_run("1048576");
    assert!(!okay && e.contains("would materialise 2097152 bytes") && e.contains("1048576-byte limit"), "{e}");
    // Enough: the device is planned and QEMU (here /bin/false) started.
    let (okay, e) = vm_run("4194304");
    assert!(!okay && !e.contains("materialise") && e.contains("QEMU exited"), "{e}");
}

#[test]
fn accel_kvm_says_why_when_dev_kvm_cannot_run_the_guest() {
    let d = dir("kvm");
    boot_files(&d.0);
    if !have("qemu-system-x86_64") {
        return;
    }
    let hardware = ["kvm_intel", "kvm_amd"].iter().any(|m| Path::new("/sys/module").join(m).exists());
    if hardware {
        eprintln!("skipping: hardware KVM is present, --accel kvm is accepted here");
        return;
    }
    // The image must exist (it is checked first); the accelerator is refused before
    // it is read.
    let img = d.0.join("app.qcow2");
    std::fs::write(&img, b"").unwrap();
    let (okay, e) = advm(&["vm", "run", "--image", img.to_str().unwrap(), "--accel", "kvm"]);
    assert!(!okay && e.contains("/dev/kvm"), "{e}");
}

#[test]
fn dump_of_a_vm_that_is_not_running_says_so() {
    let (okay, e) = advm(&["vm", "dump", "--vm", "999999999", "--out", "/tmp/never.qcow2"]);
    assert!(!okay && e.contains("999999999") && e.contains("advm vm run"), "{e}");
}

/// The guest `advm vm image build` made ($ADVM_VM_IMAGE, or the default cache), brought
/// up to date by `advm vm image build` (instant when it is: every step is cached; a
/// changed initramfs recipe rebuilds only that). `None`, with the reason printed, when
/// it was never built: that takes minutes and the network, not a test's business.
fn built_guest() -> Option<PathBuf> {
    let image = std::env::var_os("ADVM_VM_IMAGE").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(|| PathBuf::from("/var/cache"));
        cache.join("advm/vm/app.qcow2")
    });
    let dir = image.parent()?;
    if !image.exists() || !dir.join("base.qcow2").exists() {
        eprintln!("skipping: {} not built (run `advm vm image build`)", image.display());
        return None;
    }
    let (okay, e) = advm(&["vm", "image", "build", "--out", dir.to_str()?]);
    assert!(okay, "bringing the cached guest up to date: {e}");
    Some(image)
}

/// One HTTP GET to the guest's forwarded port: the body.
/// The service's port in `advm vm run`'s ready line (`ready: http://127.0.0.1:PORT/`).
fn port_of(ready: &str) -> u16 {
    ready.split("127.0.0.1:").nth(1).and_then(|r| r.split('/').next()).unwrap().parse().unwrap()
}

/// Fails the test with `what` and the rest of the VM's stderr, once it has ended.
fn give_up(vm: &mut std::process::Child, err: &mut impl Read, what: &str) -> ! {
    let mut e = String::new();
    let _ = err.read_to_string(&mut e);
    let _ = vm.wait();
    panic!("{what}{e}");
}

fn get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

#[test]
fn a_vm_stopped_by_sigterm_while_it_boots_leaves_no_work_directory() {
    if !have("qemu-system-x86_64") {
        return;
    }
    let Some(image) = built_guest() else { return };
    let mut vm = Command::new(ADVM)
        .args(["vm", "run", "--image", image.to_str().unwrap(), "--disk", "blk", "--accel", "tcg"])
        .args(["--mem", "128", "--timeout", "120"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let workdir = std::env::temp_dir().join(format!("advm-vm-{}", vm.id()));
    let t = std::time::Instant::now();
    while !workdir.join("vm.json").exists() {
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "no {} from advm vm run", workdir.display());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // as a benchmark stops its VMs on Ctrl-C
    advm::process::terminate(vm.id()).unwrap();
    let mut err = String::new();
    vm.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    vm.wait().unwrap();
    assert!(!workdir.exists(), "{} left behind after a SIGTERM: {err}", workdir.display());
}

#[test]
fn a_pmem_guest_boots_under_the_emulator_with_a_read_only_root_on_dax_no_page_cache_and_free_page_reporting() {
    if !have("qemu-system-x86_64") {
        return;
    }
    let Some(image) = built_guest() else { return };
    // as root, in a memory cgroup of its own (--cgroup needs root)
    let cgroup = advm::process::is_root();
    let mut vm = Command::new(ADVM)
        .args(["vm", "run", "--image", image.to_str().unwrap(), "--disk", "pmem", "--accel", "tcg"])
        .args(["--mem", "128", "--timeout", "120"])
        .args(cgroup.then_some("--cgroup"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(vm.stdout.take().unwrap()).read_line(&mut ready).unwrap();
    let mut err = BufReader::new(vm.stderr.take().unwrap());
    if !ready.starts_with("ready:") {
        give_up(&mut vm, &mut err, &format!("the guest did not come up: {ready}"));
    }
    let port = port_of(&ready);
    let meminfo = get(port, "/meminfo");
    // `console: PATH; dump with ...` follows the ready line on stderr.
    let mut line = String::new();
    while !line.starts_with("console: ") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no console line from advm vm run");
    }
    let console = line["console: ".len()..].split(';').next().unwrap().to_string();
    // The guest printed these lines before its service answered.
    let log = std::fs::read_to_string(&console).unwrap();
    advm::process::terminate(vm.id()).unwrap();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(vm.wait().unwrap().success(), "advm vm run failed on SIGTERM: {rest}");
    // A VM that ended cleanly leaves no work directory behind.
    let workdir = Path::new(&console).parent().unwrap();
    assert!(!workdir.exists(), "{} left behind", workdir.display());
    if cgroup {
        // Said at ready, and after QEMU exited: what the guest touched is charged to
        // QEMU's group (guest RAM; the image's pages are page cache, charged to whoever
        // read them first).
        assert!(rest.contains("at ready: anon+shmem "), "{rest}");
        let report = rest.lines().skip_while(|l| !l.starts_with("advm vm run: memory cgroup ")).collect::<Vec<_>>();
        let peak = report
            .iter()
            .find_map(|l| l.trim().strip_prefix("anon+shmem"))
            .and_then(|l| l.split("peak ").nth(1))
            .unwrap_or_else(|| panic!("no cgroup report after QEMU exited: {rest}"));
        let mib = peak.strip_suffix(" MiB").and_then(|n| n.trim().parse::<f64>().ok());
        assert!(mib.is_some_and(|m| m > 8.0 && m < 1024.0), "a booted guest's peak: {peak}");
    }
    let mount = log.lines().find(|l| l.starts_with("advm-init: mounts: ")).unwrap_or_else(|| panic!("{log}"));
    assert!(mount.contains("/dev/pmem0 /newroot ext4") && mount.contains("dax"), "root not on DAX: {mount}");
    // Nothing writes the image: no page of it becomes the VM's own.
    assert!(mount.contains(" ext4 ro,"), "root not read-only: {mount}");
    // The guest hands back what it frees, pages of every size (Linux 6.1 would report
    // only 2 MiB blocks unless the initramfs sets the order again).
    let reporting = log.lines().any(|l| l.trim_end() == "advm-init: balloon: free page reporting order 0");
    assert!(reporting, "{log}");
    let cached = meminfo.lines().find(|l| l.starts_with("Cached:")).unwrap_or_else(|| panic!("{meminfo}"));
    let kib: u64 = cached.split_whitespace().nth(1).unwrap().parse().unwrap();
    // The service read 32 MiB of files and python: through DAX none of it is cached.
    assert!(kib < 1024, "the guest caches its files: {cached}");
}

/// `--cgroup` on a VM refused before QEMU starts: the refusal alone, no report of a
/// group that never held QEMU (one of zeros was printed before the error, as if a VM
/// had been measured).
#[test]
fn a_vm_refused_before_qemu_starts_reports_no_cgroup() {
    if !advm::process::is_root() || !have("qemu-img") {
        return; // --cgroup needs root
    }
    let d = dir("cgroup-refused");
    run(&d.0, "qemu-img", &["create", "-q", "-f", "qcow2", "top.qcow2", "1M"]);
    let top = d.0.join("top.qcow2");
    for json in [false, true] {
        let mut args = vec!["vm", "run", "--image", top.to_str().unwrap(), "--kernel", "/nonexistent", "--cgroup"];
        if json {
            args.push("--json");
        }
        let out = Command::new(ADVM).args(&args).output().unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && e.contains("kernel /nonexistent: not found"), "{e}");
        assert!(!e.contains("memory cgroup") && !e.contains("\"samples\""), "json {json}: {e}");
        if json {
            let exit: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert!(exit["event"] == "exit" && exit["started"] == false && exit["cgroup"].is_null(), "{exit}");
        }
    }
}

#[test]
fn merge_refuses_ksm_and_a_merge_after_or_scope_without_merge_or_out_of_range() {
    let (okay, e) = advm(&["vm", "run", "--image", "/g/app.qcow2", "--merge", "--ksm"]);
    assert!(!okay && e.contains("--merge") && e.contains("--ksm"), "{e}");
    let (okay, e) = advm(&["vm", "run", "--image", "/g/app.qcow2", "--merge-after", "3"]);
    assert!(!okay && e.contains("--merge"), "{e}");
    let (okay, e) = advm(&["vm", "run", "--image", "/g/app.qcow2", "--merge", "--merge-after", "1e9"]);
    assert!(!okay && e.contains("--merge-after 1000000000"), "{e}");
    let (okay, e) = advm(&["vm", "run", "--image", "/g/app.qcow2", "--merge-scope", "ram"]);
    assert!(!okay && e.contains("--merge-scope") && e.contains("--merge"), "{e}");
    let (okay, e) = advm(&["vm", "run", "--image", "/g/app.qcow2", "--merge", "--merge-scope", "all"]);
    assert!(!okay && e.contains("'all'") && e.contains("qemu") && e.contains("ram"), "{e}");
}

#[test]
fn a_merged_pmem_guest_maps_its_ram_from_the_store_and_keeps_answering() {
    if !have("qemu-system-x86_64") {
        return;
    }
    let Some(image) = built_guest() else { return };
    // libadvm.so (the agent QEMU preloads) comes from `cargo build -p advm-capi`.
    let so = Path::new(ADVM).parent().unwrap().join("libadvm.so");
    assert!(so.exists(), "{} missing: run `cargo build -p advm-capi` first (make test does)", so.display());
    let mut vm = Command::new(ADVM)
        .args(["vm", "run", "--image", image.to_str().unwrap(), "--disk", "pmem", "--accel", "tcg"])
        .args(["--mem", "128", "--timeout", "120", "--merge", "--merge-after", "0"])
        // QEMU's own store: no dependence on a daemon on this machine.
        .env("ADVM_SOCKET", "/nonexistent/advmd.sock")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(vm.stdout.take().unwrap());
    let (mut ready, mut merged) = (String::new(), String::new());
    out.read_line(&mut ready).unwrap();
    out.read_line(&mut merged).unwrap();
    let mut err = BufReader::new(vm.stderr.take().unwrap());
    if !merged.starts_with("merged: ") {
        give_up(&mut vm, &mut err, &format!("no merge: {ready}{merged}"));
    }
    let m: serde_json::Value = serde_json::from_str(&merged["merged: ".len()..]).unwrap();
    let port = port_of(&ready);
    let mut line = String::new();
    while !line.starts_with("console: ") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no console line from advm vm run");
    }
    let workdir = Path::new(line["console: ".len()..].split(';').next().unwrap()).parent().unwrap().to_path_buf();
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(workdir.join("vm.json")).unwrap()).unwrap();
    let qemu = info["qemu_pid"].as_u64().unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{qemu}/maps")).unwrap();
    let answer = get(port, "/");
    // A dump of the merged VM: it leaves QEMU's marks as they were.
    let marks_before = dont_fork_ranges(qemu);
    let d = dir("mergeddump");
    let overlay = d.0.join("dump.qcow2");
    let dump = Command::new(ADVM)
        .args(["vm", "dump", "--json", "--vm", &vm.id().to_string(), "--out", overlay.to_str().unwrap()])
        .output()
        .unwrap();
    let (dumped, dump_err) = (dump.status.success(), String::from_utf8_lossy(&dump.stderr).into_owned());
    let marks_after = dont_fork_ranges(qemu);
    advm::process::terminate(vm.id()).unwrap();
    assert!(vm.wait().unwrap().success(), "advm vm run failed on SIGTERM");
    assert!(dumped, "advm vm dump of the merged VM failed: {dump_err}");
    let check = Command::new("qemu-img").args(["check", "-q"]).arg(&overlay).status().unwrap();
    assert!(check.success(), "qemu-img check of the merged VM's dump");
    // `--json`: one object whose figures are those of the overlay written.
    let report: serde_json::Value = serde_json::from_slice(&dump.stdout).unwrap();
    let clusters = report["clusters"].as_u64().unwrap();
    assert_eq!(report["cluster_bytes"], 65536, "{report}");
    assert!(report["pause_ms"].as_f64().unwrap() > 0.0 && report["parts"]["fork_ms"].as_f64().is_some(), "{report}");
    assert!(std::fs::metadata(&overlay).unwrap().len() >= clusters * 65536, "{report}");
    let lost: Vec<_> = marks_before.iter().filter(|m| !marks_after.contains(m)).take(5).collect();
    assert!(
        marks_before == marks_after,
        "the dump changed QEMU's MADV_DONTFORK marks: {} before, {} after; lost e.g. {lost:?}",
        marks_before.len(),
        marks_after.len()
    );
    // The device (the span of QEMU's mappings of the image's layers) is never merged:
    // a page the guest wrote there, once a store page, is a file page to the dump,
    // which left it out (lost).
    let lines: Vec<&str> = maps.lines().collect();
    let layers: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].ends_with(".qcow2")).collect();
    let (first, last) = (layers[0], *layers.last().unwrap());
    let in_device = lines[first..=last].iter().filter(|l| l.contains("advm-merge-local")).count();
    assert_eq!(in_device, 0, "{in_device} store mappings in the pmem device");
    // Guest RAM keeps QEMU's MADV_DONTFORK as store mappings: a fork (the dump's)
    // copies none of their page tables.
    let store_dc: usize =
        marks_before.iter().filter(|(_, name)| name.contains("advm-merge-local")).map(|(r, _)| r.1 - r.0).sum();
    assert!(store_dc >= 8 << 20, "only {store_dc} bytes of store mappings carry QEMU's MADV_DONTFORK");
    // Guest RAM (128 MiB) and QEMU's own blocks of 2 MiB or more (`--merge-scope qemu`,
    // the default): at least its copy of the guest's kernel (vmlinuz, several MiB).
    assert!(m["mappings"].as_u64().unwrap() >= 2, "{m}");
    let kernel = std::fs::metadata(image.with_file_name("vmlinuz")).unwrap().len();
    assert!(m["bytes"].as_u64().unwrap() >= (128u64 << 20) + kernel, "{m}");
    // ... and not the pmem device's zeros (hundreds of MiB of private memory): the
    // shim maps them from /dev/zero, which the agent leaves alone.
    assert!(m["bytes"].as_u64().unwrap() < (128u64 + 96) << 20, "the merge took more than RAM and QEMU's blocks: {m}");
    // A booted guest holds tens of MiB of non-zero pages: all now the store's.
    let stored = m["added"].as_u64().unwrap() + m["merged"].as_u64().unwrap();
    assert!(stored >= 8 << 8, "only {stored} pages went to the store: {m}");
    assert!(m["wall_s"].as_f64().unwrap() > 0.0 && m["agent_cpu_s"].as_f64().is_some(), "{m}");
    assert!(maps.contains("advm-merge-local"), "guest RAM maps no store page:\n{maps}");
    assert!(!answer.is_empty(), "the guest stopped answering after the merge");
}

/// A kernel or initramfs that is not one, and extra QEMU arguments repeating one advm
/// sets itself, are refused before QEMU starts, saying what is wrong (QEMU said "linux
/// kernel too old to load a ram disk" for a text file; `-- -m 512` under pmem made
/// QEMU refuse the device for "not enough space ... for memory devices").
#[test]
fn run_refuses_a_kernel_or_initrd_that_is_not_one_and_extra_arguments_advm_sets() {
    let d = dir("not-a-kernel");
    boot_files(&d.0);
    std::fs::write(d.0.join("disk.raw"), vec![0u8; 1 << 20]).unwrap();
    std::fs::write(d.0.join("notes.txt"), b"not a kernel\n").unwrap();
    let vm_run = |extra: &[&str]| {
        let out = Command::new(ADVM)
            .args(["vm", "run", "--image", d.0.join("disk.raw").to_str().unwrap(), "--accel", "tcg"])
            .args(["--qemu", "/bin/false"])
            .args(extra)
            .env("ADVM_SOCKET", d.0.join("no-advmd.sock"))
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let notes = d.0.join("notes.txt");
    let (okay, e) = vm_run(&["--kernel", notes.to_str().unwrap()]);
    assert!(!okay && e.contains("notes.txt: not a kernel QEMU boots") && e.contains("--kernel"), "{e}");
    let (okay, e) = vm_run(&["--initrd", notes.to_str().unwrap()]);
    assert!(!okay && e.contains("notes.txt: not an initramfs") && e.contains("--initrd"), "{e}");
    let (okay, e) = vm_run(&["--", "-S", "-m", "512"]);
    assert!(!okay && e.contains("extra QEMU argument -m") && e.contains("use --mem"), "{e}");
    for (okay, e) in [vm_run(&["--kernel", notes.to_str().unwrap()]), vm_run(&["--", "-append", "quiet"])] {
        assert!(!okay && !e.contains("kept in"), "refused before anything was made: {e}");
    }
}

/// Stands in for QEMU: answers HTTP on the port `advm vm run` forwards to the guest's
/// service until the file `$FAKE_QEMU_STOP` exists, then exits with status 3.
const FAKE_QEMU: &str = r#"#!/usr/bin/env python3
import os, re, socket, sys, time
port = int(re.search(r"hostfwd=tcp:127.0.0.1:(\d+)-", " ".join(sys.argv)).group(1))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen()
s.settimeout(0.1)
while not os.path.exists(os.environ["FAKE_QEMU_STOP"]):
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    c.recv(4096)
    c.sendall(b"HTTP/1.0 200 OK\r\n\r\nfake guest\n")
    c.close()
sys.exit(3)
"#;

/// After the guest answered: a layer of the chain written in place is reported on
/// stderr (the guest would read the new bytes); QEMU failing then is an error and a
/// non-zero exit (it was printed and advm exited 0); a SIGTERM stops the VM with exit 0
/// and no work directory. QEMU is a stand-in ([`FAKE_QEMU`]): no guest boots.
#[test]
fn after_ready_a_layer_written_in_place_is_reported_and_qemus_failure_is_advms() {
    if !have("qemu-img") || !have("python3") {
        return;
    }
    let d = dir("after-ready");
    boot_files(&d.0);
    run(&d.0, "qemu-img", &["create", "-q", "-f", "raw", "base.raw", "1M"]);
    run(&d.0, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "base.raw", "-F", "raw", "top.qcow2"]);
    let qemu = stand_in_qemu(&d.0, FAKE_QEMU);
    let stop = d.0.join("stop");
    let start = |disk: &str| {
        let mut vm = Command::new(ADVM)
            .args(["vm", "run", "--image", d.0.join("top.qcow2").to_str().unwrap(), "--disk", disk])
            .args(["--accel", "tcg", "--qemu", qemu.to_str().unwrap()])
            .env("ADVM_SOCKET", d.0.join("no-advmd.sock"))
            .env("FAKE_QEMU_STOP", &stop)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut ready = String::new();
        BufReader::new(vm.stdout.take().unwrap()).read_line(&mut ready).unwrap();
        if !ready.starts_with("ready: ") {
            let mut err = vm.stderr.take().unwrap();
            give_up(&mut vm, &mut err, &format!("no ready line ({ready:?}): "));
        }
        vm
    };
    let finish = |mut vm: std::process::Child| {
        let mut err = String::new();
        vm.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = vm.wait().unwrap();
        let workdir = std::env::temp_dir().join(format!("advm-vm-{}", vm.id()));
        let kept = workdir.exists();
        let _ = std::fs::remove_dir_all(&workdir);
        (status, err, kept)
    };
    for disk in ["pmem", "blk"] {
        let _ = std::fs::remove_file(&stop);
        let vm = start(disk);
        // written in place, a tick after the stamps were taken (the ctime is coarse)
        std::thread::sleep(std::time::Duration::from_millis(50));
        std::fs::OpenOptions::new().write(true).open(d.0.join("base.raw")).unwrap().write_all_at(b"new", 4096).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(700));
        std::fs::write(&stop, b"").unwrap();
        let (status, err, kept) = finish(vm);
        assert!(err.contains("warning: layer ") && err.contains("base.raw was written in place"), "{disk}: {err}");
        assert_eq!(err.matches("written in place").count(), 1, "{disk}: once: {err}");
        assert!(err.contains("QEMU exited (exit status: 3) after the guest's service had answered"), "{disk}: {err}");
        assert!(!status.success() && kept, "{disk}: {status}: {err}");
    }
    let _ = std::fs::remove_file(&stop);
    let vm = start("pmem");
    advm::process::terminate(vm.id()).unwrap();
    let (status, err, kept) = finish(vm);
    assert!(status.success() && !kept && !err.contains("written in place"), "{status}: {err}");
}

/// `--json`: every report is one JSON object on a line of stdout (with `--cgroup`, as
/// root, the group's at ready and after QEMU exited), ending with an `exit` event that
/// says how the run ended, also when QEMU failed after ready or the VM was refused
/// before it started; stderr holds no report (it had the cgroup's line at ready and
/// the console's, and `--json` needed `--cgroup`). QEMU is a stand-in ([`FAKE_QEMU`]).
#[test]
fn json_reports_one_object_per_line_on_stdout_and_an_exit_event_last() {
    if !have("python3") {
        return;
    }
    let d = dir("json-events");
    boot_files(&d.0);
    std::fs::write(d.0.join("disk.raw"), vec![0u8; 1 << 20]).unwrap();
    let qemu = stand_in_qemu(&d.0, FAKE_QEMU);
    let stop = d.0.join("stop");
    let cgroup = advm::process::is_root();
    let spawn = |extra: &[&str]| {
        Command::new(ADVM)
            .args(["vm", "run", "--json", "--image", d.0.join("disk.raw").to_str().unwrap(), "--accel", "tcg"])
            .args(["--qemu", qemu.to_str().unwrap()])
            .args(extra)
            .env("ADVM_SOCKET", d.0.join("no-advmd.sock"))
            .env("FAKE_QEMU_STOP", &stop)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let events = |out: &[u8]| -> Vec<serde_json::Value> {
        let text = String::from_utf8_lossy(out);
        text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?} in {text}"))).collect()
    };
    let names =
        |ev: &[serde_json::Value]| ev.iter().map(|e| e["event"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    // pmem: ready, the layer written in place, QEMU failing after ready
    let mut vm = spawn(if cgroup { &["--disk", "pmem", "--cgroup"] } else { &["--disk", "pmem"] });
    let mut out = BufReader::new(vm.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    if !first.contains("\"ready\"") {
        let mut err = vm.stderr.take().unwrap();
        give_up(&mut vm, &mut err, &format!("no ready event ({first:?}): "));
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    std::fs::OpenOptions::new().write(true).open(d.0.join("disk.raw")).unwrap().write_all_at(b"new", 4096).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    std::fs::write(&stop, b"").unwrap();
    let mut rest = Vec::new();
    out.read_to_end(&mut rest).unwrap();
    let mut err = String::new();
    vm.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = vm.wait().unwrap();
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("advm-vm-{}", vm.id())));
    let ev = events(&[first.as_bytes(), &rest].concat());
    let want: &[&str] = if cgroup {
        &["ready", "cgroup_at_ready", "layer_written", "exit"]
    } else {
        &["ready", "layer_written", "exit"]
    };
    assert_eq!(names(&ev), want, "{ev:?}\n{err}");
    let ready = &ev[0];
    assert_eq!(ready["answer"], "fake guest", "{ready}");
    assert_eq!(ready["url"], format!("http://127.0.0.1:{}/", ready["port"]), "{ready}");
    assert!(ready["after_ms"].is_u64() && ready["qemu_pid"].is_u64(), "{ready}");
    assert_eq!(ready["vm"], vm.id(), "the pid `advm vm dump --vm` takes: {ready}");
    assert!(ready["console"].as_str().unwrap().ends_with("/console.log"), "{ready}");
    let written = &ev[want.len() - 2];
    assert!(written["layer"].as_str().unwrap().ends_with("disk.raw") && written["data_file"].is_null(), "{written}");
    let exit = ev.last().unwrap();
    assert!(!status.success() && exit["ok"] == false && exit["ready"] == true && exit["started"] == true, "{exit}");
    assert_eq!(exit["qemu_exit_code"], 3, "{exit}");
    assert!(exit["error"].as_str().unwrap().contains("after the guest's service had answered"), "{exit}");
    assert!(exit["kept"].as_str().unwrap().ends_with(&format!("advm-vm-{}", vm.id())), "{exit}");
    if cgroup {
        assert!(ev[1]["anon_shmem_bytes"].is_u64() && ev[1]["group"].is_string(), "{}", ev[1]);
        assert!(exit["cgroup"]["samples"].as_u64().unwrap() > 0, "{exit}");
    }
    // every event and field is in docs/vm.md's table
    let docs = include_str!("../../../docs/vm.md");
    let table = &docs[docs.find("### Reports for scripts: `--json`").unwrap()..];
    for e in &ev {
        let missing: Vec<&String> =
            e.as_object().unwrap().keys().filter(|k| !table.contains(&format!("`{k}`"))).collect();
        assert!(missing.is_empty() && table.contains(&format!("`{}`", e["event"].as_str().unwrap())), "{missing:?}");
    }
    // stderr: the error and where the logs are, no report
    for report in ["ready", "console: ", "at ready", "written in place", "\"samples\"", "anon+shmem"] {
        assert!(!err.contains(report), "{report:?} on stderr under --json: {err}");
    }
    // blk, --exit-when-ready: ready, then exit (advm stopped QEMU)
    std::fs::remove_file(&stop).unwrap();
    let out = spawn(&["--disk", "blk", "--exit-when-ready"]).wait_with_output().unwrap();
    let ev = events(&out.stdout);
    assert_eq!(names(&ev), ["ready", "exit"], "{ev:?}");
    let exit = &ev[1];
    assert!(out.status.success() && exit["ok"] == true && exit["error"].is_null() && exit["kept"].is_null(), "{exit}");
    assert_eq!(exit["qemu_signal"], 9, "{exit}");
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    // refused before QEMU starts: the exit event alone
    let out = spawn(&["--kernel", "/nonexistent"]).wait_with_output().unwrap();
    let ev = events(&out.stdout);
    assert_eq!(names(&ev), ["exit"], "{ev:?}");
    assert!(!out.status.success() && ev[0]["started"] == false && ev[0]["ready"] == false, "{}", ev[0]);
    assert!(ev[0]["error"].as_str().unwrap().contains("kernel /nonexistent: not found"), "{}", ev[0]);
}

/// Stands in for QEMU: writes the pmem device, mapped as QEMU maps its backend file
/// (`share=off`, under the shim), or the `-drive` option of a blk disk to
/// `$FAKE_QEMU_OUT`, then answers HTTP on the forwarded port.
const DEVICE_QEMU: &str = r#"#!/usr/bin/env python3
import mmap, os, re, socket, sys
out = open(os.environ["FAKE_QEMU_OUT"], "wb")
for a in sys.argv:
    if a.startswith("memory-backend-file,"):
        o = dict(kv.split("=", 1) for kv in a.split(",")[1:])
        m = mmap.mmap(os.open(o["mem-path"], os.O_RDWR), int(o["size"]), mmap.MAP_PRIVATE)
        out.write(m[:])
    if a.startswith("file="):
        out.write(a.encode())
out.close()
port = int(re.search(r"hostfwd=tcp:127.0.0.1:(\d+)-", " ".join(sys.argv)).group(1))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen()
while True:
    c, _ = s.accept()
    c.recv(4096)
    c.sendall(b"HTTP/1.0 200 OK\r\n\r\nfake guest\n")
    c.close()
"#;

/// An image on a block device (an LVM volume) is a disk for `advm vm run` (it said
/// "image /dev/loop0: not found", and a raw layer there failed to map with
/// "lseek(SEEK_DATA): Invalid argument"): pmem maps its bytes, blk hands QEMU the
/// device as a raw disk. QEMU is a stand-in ([`DEVICE_QEMU`]); needs a loop device (root).
#[test]
fn an_image_on_a_block_device_runs_under_pmem_and_blk() {
    if !have("python3") {
        return;
    }
    let d = dir("block-device");
    boot_files(&d.0);
    let disk: Vec<u8> = (0..1u32 << 20).map(|i| (i / 4096 % 251) as u8).collect();
    std::fs::write(d.0.join("disk.raw"), &disk).unwrap();
    let Some(lo) = common::qemu::LoopDevice::attach(&d.0.join("disk.raw"), true) else { return };
    let qemu = stand_in_qemu(&d.0, DEVICE_QEMU);
    let got = d.0.join("device");
    for kind in ["pmem", "blk"] {
        let out = Command::new(ADVM)
            .args(["vm", "run", "--image", &lo.0, "--disk", kind, "--accel", "tcg", "--exit-when-ready"])
            .args(["--qemu", qemu.to_str().unwrap(), "--kernel", d.0.join("vmlinuz").to_str().unwrap()])
            .args(["--initrd", d.0.join("initrd.img").to_str().unwrap()])
            .env("ADVM_SOCKET", d.0.join("no-advmd.sock"))
            .env("FAKE_QEMU_OUT", &got)
            .output()
            .unwrap();
        assert!(out.status.success(), "{kind}: {}", String::from_utf8_lossy(&out.stderr));
        let device = std::fs::read(&got).unwrap();
        if kind == "pmem" {
            assert_eq!(device.len(), 2 << 20, "the device: the disk rounded up to 2 MiB");
            assert!(device[..disk.len()] == disk[..], "the pmem device reads otherwise than {}", lo.0);
        } else {
            let drive = String::from_utf8(device).unwrap();
            assert!(drive.starts_with(&format!("file={},if=none", lo.0)) && drive.contains(",format=raw,"), "{drive}");
        }
    }
}

/// A disk whose pmem device's page structures (64 bytes per 4 KiB page, in guest RAM)
/// would not fit in the guest is refused under pmem before QEMU starts, saying so (a
/// 16 GiB disk under a 160 MiB guest ran out of memory while booting, with a hint that
/// the guest needs 112 MiB; a 1 TiB one failed in QEMU: "Cannot allocate memory", then
/// "phys-bits too low"); blk takes it.
#[test]
fn a_disk_too_large_for_a_pmem_device_in_the_guests_ram_is_refused_naming_mem() {
    if !have("qemu-img") {
        return;
    }
    let d = dir("huge-disk");
    boot_files(&d.0);
    run(&d.0, "qemu-img", &["create", "-q", "-f", "qcow2", "huge.qcow2", "1T"]);
    let qemu = stand_in_qemu(&d.0, "#!/bin/sh\nexec sleep 60\n");
    let vm_run = |disk: &str| {
        Command::new(ADVM)
            .args(["vm", "run", "--image", d.0.join("huge.qcow2").to_str().unwrap(), "--disk", disk])
            .args(["--accel", "tcg", "--mem", "1024", "--timeout", "1", "--qemu", qemu.to_str().unwrap()])
            .env("ADVM_SOCKET", d.0.join("no-advmd.sock"))
            .output()
            .unwrap()
    };
    let out = vm_run("pmem");
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{e}");
    assert!(
        e.contains(
            "--disk pmem: the guest's kernel needs 16384 MiB of its RAM for the page structures of the \
             1099511627776-byte disk (64 bytes per 4 KiB page of the device), more than --mem 1024; give it --mem \
             16488 or more (the guest of `advm vm image build`), or use --disk blk"
        ),
        "{e}"
    );
    assert!(!e.contains("kept in"), "refused before anything started: {e}");
    // blk: QEMU starts (the stand-in never answers: the timeout ends it)
    let out = vm_run("blk");
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("did not answer within 1 s"), "{e}");
    let kept = e.lines().find_map(|l| l.strip_prefix("advm vm run: console and logs kept in ")).unwrap();
    std::fs::remove_dir_all(kept).unwrap();
}

/// An encrypted layer is refused before QEMU starts under both disks, naming it: pmem
/// cannot decrypt its data, and blk's QEMU needs its key, which advm cannot give it
/// (QEMU failed once started: "Parameter 'encrypt.key-secret' is required for cipher").
#[test]
fn an_encrypted_layer_is_refused_before_qemu_starts_under_either_disk() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let d = dir("encrypted");
    boot_files(&d.0);
    let secret = ["--object", "secret,id=k,data=pw"];
    run(
        &d.0,
        "qemu-img",
        &[
            &["create", "-q", "-f", "qcow2"],
            &secret[..],
            &["-o", "encrypt.format=luks,encrypt.key-secret=k,encrypt.iter-time=10", "top.qcow2", "1M"],
        ]
        .concat(),
    );
    run(
        &d.0,
        "qemu-io",
        &[
            &secret[..],
            &["--image-opts", "-c", "write -P 0x44 0 64k", "driver=qcow2,file.filename=top.qcow2,encrypt.key-secret=k"],
        ]
        .concat(),
    );
    let qemu = stand_in_qemu(&d.0, "#!/bin/sh\nexec sleep 60\n");
    let top = d.0.join("top.qcow2");
    for (disk, want) in [
        (
            "pmem",
            "top.qcow2: cannot map guest 0x0+65536 (layer 0): layer is encrypted (LUKS); decryption is not supported"
                .to_string(),
        ),
        (
            "blk",
            format!(
                "--disk blk: layer {} is encrypted (LUKS) and QEMU opens it only with its key, which advm vm run cannot \
                 give it; decrypt the chain first",
                top.display()
            ),
        ),
    ] {
        let out = Command::new(ADVM)
            .args(["vm", "run", "--image", top.to_str().unwrap(), "--disk", disk, "--accel", "tcg"])
            .args(["--timeout", "1", "--qemu", qemu.to_str().unwrap()])
            .env("ADVM_SOCKET", d.0.join("no-advmd.sock"))
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && e.contains(&want) && !e.contains("kept in"), "{disk}: {e}");
    }
}

/// Ctrl-C or SIGTERM while the guest boots stops the VM on request: exit status 0, no
/// error and no work directory (advm said "QEMU exited ... before the guest's service
/// answered" with an empty console tail and exited 1, as for a guest that failed). QEMU
/// is a stand-in that never answers: no guest boots.
#[test]
fn a_vm_stopped_by_a_signal_while_it_boots_exits_0_without_an_error() {
    if !have("qemu-img") {
        return;
    }
    let d = dir("stop-booting");
    boot_files(&d.0);
    run(&d.0, "qemu-img", &["create", "-q", "-f", "qcow2", "top.qcow2", "1M"]);
    let qemu = stand_in_qemu(&d.0, "#!/bin/sh\nexec sleep 60\n");
    use std::os::unix::process::CommandExt;
    for sig in ["TERM", "INT"] {
        // SIGINT at its default, as in a terminal: a CI runner's background job has it
        // ignored, and advm and the stand-in keep it so (then nothing stopped)
        let mut vm = Command::new("env")
            .args(["--default-signal=INT", ADVM])
            .args(["vm", "run", "--image", d.0.join("top.qcow2").to_str().unwrap(), "--accel", "tcg"])
            .args(["--qemu", qemu.to_str().unwrap()])
            .env("ADVM_SOCKET", d.0.join("no-advmd.sock"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let workdir = std::env::temp_dir().join(format!("advm-vm-{}", vm.id()));
        let t = std::time::Instant::now();
        while !workdir.join("vm.json").exists() {
            assert!(t.elapsed() < std::time::Duration::from_secs(30), "no {} from advm vm run", workdir.display());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // as a supervisor stops it (SIGTERM to advm, which forwards it), and as a
        // terminal's Ctrl-C reaches it (SIGINT to the whole process group)
        let to = if sig == "TERM" { vm.id().to_string() } else { format!("-{}", vm.id()) };
        assert!(Command::new("kill").arg(format!("-{sig}")).arg("--").arg(to).status().unwrap().success());
        let mut err = String::new();
        vm.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = vm.wait().unwrap();
        let kept = workdir.exists();
        let _ = std::fs::remove_dir_all(&workdir);
        assert!(status.success() && !err.contains("advm: "), "signal {sig}: {status}: {err}");
        assert!(!kept, "signal {sig}: {} left behind: {err}", workdir.display());
    }
}
