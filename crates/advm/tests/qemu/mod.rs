//! What the image tests share: qemu-utils present or a printed skip, a scratch
//! directory, and running qemu-img / qemu-io in it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// True when qemu-img and qemu-io run; else prints why the test skips.
pub fn have_qemu() -> bool {
    let ok = Command::new("qemu-img").arg("--version").output().is_ok_and(|o| o.status.success())
        && Command::new("qemu-io").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipping: qemu-img/qemu-io not found (Debian package qemu-utils)");
    }
    ok
}

/// A scratch directory, removed on drop.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("advm-image-test-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Runs `prog args` in `dir`, asserts it succeeded, returns its stdout.
pub fn run(dir: &Path, prog: &str, args: &[&str]) -> String {
    String::from_utf8(run_bytes(dir, prog, args)).unwrap()
}

/// [`run`] for output that need not be text.
pub fn run_bytes(dir: &Path, prog: &str, args: &[&str]) -> Vec<u8> {
    let mut out = Command::new(prog).args(args).current_dir(dir).output().unwrap();
    // qemu-img times its LUKS key derivation in CPU time and gives up when a busy
    // machine returns no measurable time; that is qemu's hiccup, not ours: try again.
    for _ in 0..5 {
        if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("accurate CPU usage") {
            break;
        }
        // a pause, so the retry does not meet the same burst of load
        std::thread::sleep(std::time::Duration::from_millis(100));
        out = Command::new(prog).args(args).current_dir(dir).output().unwrap();
    }
    assert!(
        out.status.success(),
        "{prog} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A process holding an image open (qemu-io, qemu-system), killed on drop. (Not every
/// test file that includes this module holds an image open.)
#[allow(dead_code)]
pub struct Holder(std::process::Child);

#[allow(dead_code)]
impl Holder {
    /// Starts `prog args` in `dir` and waits (up to 10 s) until it holds an OFD lock
    /// covering byte `byte` of `file`: QEMU has then opened the image.
    pub fn start(dir: &Path, prog: &str, args: &[&str], file: &Path, byte: u64) -> Holder {
        use std::os::unix::fs::MetadataExt;
        use std::process::{Command, Stdio};
        let child = Command::new(prog)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let holder = Holder(child);
        let ino = format!(":{}", fs::metadata(file).unwrap().ino());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            // `N: OFDLCK ADVISORY READ -1 MAJ:MIN:INODE START END`
            let locks = fs::read_to_string("/proc/locks").unwrap();
            let held = locks.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() == 8
                    && f[1] == "OFDLCK"
                    && f[5].ends_with(&ino)
                    && f[6].parse::<u64>().is_ok_and(|s| s <= byte)
                    && f[7].parse::<u64>().is_ok_and(|e| e >= byte)
            });
            if held {
                return holder;
            }
            assert!(std::time::Instant::now() < deadline, "{prog} {args:?} took no lock on byte {byte} in 10 s");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes `bytes` at `at` in the file at `path`.
#[allow(dead_code)]
pub fn patch(path: &Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    fs::OpenOptions::new().write(true).open(path).unwrap().write_all_at(bytes, at).unwrap();
}

/// Removes the backing-format extension of a qcow2 made by qemu-img (its type
/// becomes one nobody knows, which readers skip), as old images without one have.
#[allow(dead_code)]
pub fn strip_backing_format(path: &Path) {
    let bytes = fs::read(path).unwrap();
    let mut at = u32::from_be_bytes(bytes[100..104].try_into().unwrap()) as usize;
    loop {
        let ty = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
        let len = u32::from_be_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        assert_ne!(ty, 0, "no backing format extension in {}", path.display());
        if ty == 0xe279_2aca {
            patch(path, at as u64, &0x0bad_0bad_u32.to_be_bytes());
            return;
        }
        at += 8 + len.div_ceil(8) * 8;
    }
}

/// A loop device over a file, detached on drop.
#[allow(dead_code)]
pub struct LoopDevice(pub String);

#[allow(dead_code)]
impl LoopDevice {
    /// Attaches `file` (read-only when asked); `None`, with the skip printed, where no
    /// loop device can be set up.
    pub fn attach(file: &Path, read_only: bool) -> Option<Self> {
        let mut cmd = Command::new("losetup");
        cmd.args(["-f", "--show"]);
        if read_only {
            cmd.arg("--read-only");
        }
        match cmd.arg(file).output() {
            Ok(o) if o.status.success() => Some(Self(String::from_utf8(o.stdout).unwrap().trim().to_string())),
            Ok(o) => {
                eprintln!("skipped: no loop device here: {}", String::from_utf8_lossy(&o.stderr).trim());
                None
            }
            Err(e) => {
                eprintln!("skipped: losetup: {e}");
                None
            }
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}
