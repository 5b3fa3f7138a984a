//! `advm vm image build`: the guest, built once from Debian's package registry and
//! cached step by step in the output directory:
//! - `vmlinuz` and the modules from Debian's kernel package (`apt-get download`,
//!   unpacked with `dpkg-deb -x`; nothing is installed on the host);
//! - `initrd.img`: busybox, the virtio/pmem/ext4 modules in dependency order, and an
//!   `/init` that mounts the root from virtio-pmem with `-o dax` or from virtio-blk
//!   (`advm.root=pmem|blk` on the kernel command line), sets up the network and starts
//!   `/app/init` of the root;
//! - `base.qcow2`: a Debian root (`debootstrap --variant=minbase`, with python3) as an
//!   ext4 filesystem with 4 KiB blocks (DAX needs page-sized blocks);
//! - `app.qcow2` over it: only the clusters that adding `/app` changed (a small HTTP
//!   service that reads its data files at start).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::CliError;

/// The virtual size of the guest's disk (a multiple of 128 MiB so that the pmem
/// device is section aligned).
pub const DISK_BYTES: u64 = 512 << 20;

/// Data files the service reads at start: their page cache is what FlexMem shares.
const APP_DATA_FILES: usize = 8;
const APP_DATA_FILE_BYTES: usize = 4 << 20;

/// The modules the initramfs loads (their dependencies come along).
const MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_blk",
    "virtio_net",
    "virtio_pmem",
    "nd_pmem",
    "virtio_balloon",
    "ext4",
    "crc32c_generic",
    "crc32c-intel",
];

/// What a build produced.
#[derive(Debug)]
pub struct Built {
    /// The chain's top layer.
    pub app: PathBuf,
}

fn step(what: &str) {
    eprintln!("advm vm image build: {what}");
}

fn io(what: impl std::fmt::Display, e: std::io::Error) -> CliError {
    CliError::Io(what.to_string(), e)
}

/// Runs a command in `dir`, failing with its stderr tail.
fn sh(dir: &Path, program: &str, args: &[&str]) -> Result<String, CliError> {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| io(format!("running {program} (is it installed? `make deps` installs it)"), e))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect();
        return Err(CliError::Usage(format!(
            "`{program} {}` failed ({}):\n{}",
            args.join(" "),
            out.status,
            tail.join("\n")
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Builds what is missing in `dir` and returns the chain's top.
pub fn build(dir: &Path, mirror: &str) -> Result<Built, CliError> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir.display(), e))?;
    let dir = dir.canonicalize().map_err(|e| io(dir.display(), e))?;
    let kver = kernel(&dir)?;
    initramfs(&dir, &kver)?;
    rootfs(&dir, mirror)?;
    layers(&dir)?;
    step(&format!("done: {}", dir.join("app.qcow2").display()));
    Ok(Built { app: dir.join("app.qcow2") })
}

/// Downloads and unpacks Debian's kernel; returns its version.
fn kernel(dir: &Path) -> Result<String, CliError> {
    let unpacked = dir.join("kernel");
    let kver = || -> Option<String> {
        let entries = std::fs::read_dir(unpacked.join("lib/modules")).ok()?;
        entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).next()
    };
    if let (Some(v), true) = (kver(), dir.join("vmlinuz").exists()) {
        return Ok(v);
    }
    let debs = dir.join("debs");
    std::fs::create_dir_all(&debs).map_err(|e| io(debs.display(), e))?;
    // linux-image-amd64 is a metapackage: the image is its dependency.
    let depends = sh(&debs, "apt-cache", &["depends", "linux-image-amd64"])?;
    let image = depends
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: ").filter(|p| p.starts_with("linux-image-")))
        .ok_or_else(|| {
            CliError::Usage(
                "apt-cache depends linux-image-amd64 names no linux-image-* package (apt-get update?)".into(),
            )
        })?
        .to_string();
    step(&format!("downloading {image}"));
    sh(&debs, "apt-get", &["download", "-q", &image])?;
    let deb = std::fs::read_dir(&debs)
        .map_err(|e| io(debs.display(), e))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{image}_"))))
        .ok_or_else(|| CliError::Usage(format!("apt-get download {image} left no .deb in {}", debs.display())))?;
    step(&format!("unpacking {}", deb.display()));
    sh(dir, "dpkg-deb", &["-x", &deb.to_string_lossy(), &unpacked.to_string_lossy()])?;
    let v = kver().ok_or_else(|| CliError::Usage(format!("{} holds no lib/modules/VERSION", deb.display())))?;
    std::fs::copy(unpacked.join(format!("boot/vmlinuz-{v}")), dir.join("vmlinuz"))
        .map_err(|e| io(format!("copying vmlinuz-{v}"), e))?;
    Ok(v)
}

/// The `depends=` of a module's .modinfo section.
fn module_depends(ko: &Path) -> Result<Vec<String>, CliError> {
    let bytes = std::fs::read(ko).map_err(|e| io(ko.display(), e))?;
    let key = b"\0depends=";
    let Some(at) = bytes.windows(key.len()).position(|w| w == key) else { return Ok(Vec::new()) };
    let rest = &bytes[at + key.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    Ok(String::from_utf8_lossy(&rest[..end]).split(',').filter(|s| !s.is_empty()).map(String::from).collect())
}

/// The modules to load, dependencies first, as paths under the kernel tree.
pub fn module_order(modules_dir: &Path, wanted: &[&str]) -> Result<Vec<PathBuf>, CliError> {
    let mut index = BTreeMap::new();
    let mut stack = vec![modules_dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| io(d.display(), e))?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Some(n) = p.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".ko")) {
                index.insert(n.replace('-', "_"), p);
            }
        }
    }
    fn visit(
        name: &str,
        index: &BTreeMap<String, PathBuf>,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<PathBuf>,
    ) -> Result<(), CliError> {
        let name = name.replace('-', "_");
        if !seen.insert(name.clone()) {
            return Ok(());
        }
        // Built into the kernel: nothing to load.
        let Some(path) = index.get(&name) else { return Ok(()) };
        for d in module_depends(path)? {
            visit(&d, index, seen, order)?;
        }
        order.push(path.clone());
        Ok(())
    }
    let (mut seen, mut order) = (BTreeSet::new(), Vec::new());
    for w in wanted {
        visit(w, &index, &mut seen, &mut order)?;
    }
    Ok(order)
}

/// The initramfs's /init (busybox sh).
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod "/lib/modules/$m" 2>/dev/null; done
root=blk
for a in $(cat /proc/cmdline); do case "$a" in
  advm.root=*) root="${a#advm.root=}";;
  advm.writes=1) rw=1;;
  page_reporting.page_reporting_order=*) order="${a#*=}";;
esac; done
# Linux 6.1 overwrites the reporting order with its default when the balloon registers
# (after the command line set it): set it again.
po=/sys/module/page_reporting/parameters/page_reporting_order
if [ -n "$order" ] && [ -w $po ]; then echo "$order" > $po; fi
if ls /sys/bus/virtio/drivers/virtio_balloon/virtio* >/dev/null 2>&1; then
  echo "advm-init: balloon: free page reporting order $(cat $po)"
fi
# The root is read-only unless the service writes (advm.writes=1): a read-write ext4
# writes its superblock, journal and inode tables, and every written page of the image
# becomes the VM's own (pmem: a private copy in QEMU; blk: QEMU's temporary overlay).
if [ "$root" = pmem ]; then dev=/dev/pmem0; opts=dax; else dev=/dev/vda; opts=; fi
[ -z "$rw" ] && opts="${opts:+$opts,}ro"
i=0; while [ ! -b "$dev" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
if ! mount -t ext4 ${opts:+-o $opts} "$dev" /newroot; then echo "advm-init: cannot mount $dev"; sleep 1; poweroff -f; fi
echo "advm-init: root $dev mounted${opts:+ with -o $opts}"
grep " /newroot " /proc/mounts | sed 's/^/advm-init: mounts: /'
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
mount --move /proc /newroot/proc 2>/dev/null || umount /proc
umount /sys; umount /dev
exec switch_root /newroot /app/init
"#;

/// What an initrd.img was made from ([`INIT`] and [`MODULES`]), kept beside it: a
/// change rebuilds it.
const INIT_STAMP: &str = "initrd.init";

fn init_stamp() -> String {
    format!("{INIT}\n{}\n", MODULES.join(" "))
}

/// Builds initrd.img (gzip'd newc cpio) unless present with the current [`INIT`].
fn initramfs(dir: &Path, kver: &str) -> Result<(), CliError> {
    let out = dir.join("initrd.img");
    let stamp = dir.join(INIT_STAMP);
    if out.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == init_stamp()) {
        return Ok(());
    }
    step("making initrd.img");
    let stage = dir.join("initramfs");
    let _ = std::fs::remove_dir_all(&stage);
    for d in ["bin", "lib/modules", "proc", "sys", "dev", "newroot"] {
        std::fs::create_dir_all(stage.join(d)).map_err(|e| io(stage.join(d).display(), e))?;
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .ok_or_else(|| CliError::Usage("busybox not found: install busybox-static (`make deps`)".into()))?;
    std::fs::copy(busybox, stage.join("bin/busybox")).map_err(|e| io(busybox.display(), e))?;
    let order = module_order(&dir.join(format!("kernel/lib/modules/{kver}")), MODULES)?;
    let mut names = String::new();
    for ko in &order {
        let name = ko.file_name().expect("a .ko file").to_string_lossy().into_owned();
        std::fs::copy(ko, stage.join("lib/modules").join(&name)).map_err(|e| io(ko.display(), e))?;
        names.push_str(&name);
        names.push('\n');
    }
    write_exec(&stage.join("modules.order"), &names, 0o644)?;
    write_exec(&stage.join("init"), INIT, 0o755)?;
    let tmp = dir.join("initrd.img.tmp");
    let script = format!("find . | cpio -o -H newc --quiet | gzip -1 > '{}'", tmp.display());
    sh(&stage, "sh", &["-c", &script])?;
    std::fs::rename(&tmp, &out).map_err(|e| io(out.display(), e))?;
    std::fs::write(&stamp, init_stamp()).map_err(|e| io(stamp.display(), e))?;
    std::fs::remove_dir_all(&stage).map_err(|e| io(stage.display(), e))?;
    Ok(())
}

fn write_exec(path: &Path, text: &str, mode: u32) -> Result<(), CliError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).map_err(|e| io(path.display(), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| io(path.display(), e))
}

/// debootstrap into rootfs/ unless done before (rootfs.ok).
fn rootfs(dir: &Path, mirror: &str) -> Result<(), CliError> {
    let done = dir.join("rootfs.ok");
    if done.exists() {
        return Ok(());
    }
    step(&format!("debootstrap bookworm from {mirror} (a few minutes)"));
    let root = dir.join("rootfs");
    let _ = std::fs::remove_dir_all(&root);
    sh(dir, "debootstrap", &["--variant=minbase", "--include=python3", "bookworm", &root.to_string_lossy(), mirror])?;
    std::fs::write(&done, "").map_err(|e| io(done.display(), e))
}

/// The service: reads every data file at start (checksums them), then answers HTTP.
const SERVER: &str = r#"import hashlib, http.server, os, threading, time
d = "/app/data"
h = hashlib.sha256()
for n in sorted(os.listdir(d)):
    with open(os.path.join(d, n), "rb") as f:
        h.update(f.read())
digest = h.hexdigest()
print("advm-guest: read", len(os.listdir(d)), "files, sha256", digest, flush=True)
def writer():
    # advm.writes=1: a guest that keeps writing (for dumps taken while it runs)
    i = 0
    while True:
        with open("/var/tmp/w%02d.bin" % (i % 16), "wb") as f:
            f.write(os.urandom(256 << 10))
            os.fsync(f.fileno())
        i += 1
        time.sleep(0.2)
if "advm.writes=1" in open("/proc/cmdline").read().split():
    threading.Thread(target=writer, daemon=True).start()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/meminfo":
            body = open("/proc/meminfo", "rb").read()
        else:
            body = (digest + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()
"#;

const APP_INIT: &str = "#!/bin/sh\nmount -t sysfs sys /sys\nmount -t devtmpfs dev /dev\nmount -t tmpfs tmp /tmp\n\
echo advm-guest: starting the service\nexec /usr/bin/python3 /app/server.py\n";

/// The runs of 64 KiB clusters where `new` differs from `old` (same length).
fn changed_runs(old: &Path, new: &Path) -> Result<Vec<(u64, u64)>, CliError> {
    use std::os::unix::fs::FileExt;
    const CLUSTER: usize = 64 << 10;
    let a = std::fs::File::open(old).map_err(|e| io(old.display(), e))?;
    let b = std::fs::File::open(new).map_err(|e| io(new.display(), e))?;
    let len = b.metadata().map_err(|e| io(new.display(), e))?.len();
    let (mut x, mut y) = (vec![0u8; CLUSTER], vec![0u8; CLUSTER]);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut at = 0;
    while at < len {
        let n = CLUSTER.min((len - at) as usize);
        a.read_exact_at(&mut x[..n], at).map_err(|e| io(old.display(), e))?;
        b.read_exact_at(&mut y[..n], at).map_err(|e| io(new.display(), e))?;
        if x[..n] != y[..n] {
            match runs.last_mut() {
                Some((s, l)) if *s + *l == at => *l += n as u64,
                _ => runs.push((at, n as u64)),
            }
        }
        at += n as u64;
    }
    Ok(runs)
}

/// Deterministic data that does not compress or deduplicate within a file.
fn app_data(i: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64 + 1);
    (0..APP_DATA_FILE_BYTES / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

/// base.qcow2 from the root, then app.qcow2 holding only what /app adds.
fn layers(dir: &Path) -> Result<(), CliError> {
    if dir.join("app.qcow2").exists() && dir.join("base.qcow2").exists() {
        return Ok(());
    }
    let size = format!("{}M", DISK_BYTES >> 20);
    if !dir.join("base.qcow2").exists() {
        step("making base.qcow2 (ext4, 4 KiB blocks, from the root)");
        let _ = std::fs::remove_file(dir.join("base.raw"));
        sh(dir, "mkfs.ext4", &["-q", "-F", "-b", "4096", "-L", "advm-root", "-d", "rootfs", "base.raw", &size])?;
        sh(dir, "qemu-img", &["convert", "-f", "raw", "-O", "qcow2", "base.raw", "base.qcow2.tmp"])?;
        std::fs::rename(dir.join("base.qcow2.tmp"), dir.join("base.qcow2")).map_err(|e| io("base.qcow2", e))?;
    }
    step("making app.qcow2 (the service and its data over base.qcow2)");
    let stage = dir.join("app-stage");
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(stage.join("data")).map_err(|e| io(stage.display(), e))?;
    write_exec(&stage.join("server.py"), SERVER, 0o644)?;
    write_exec(&stage.join("init"), APP_INIT, 0o755)?;
    // debugfs writes into its current directory.
    let mut cmds = String::from("mkdir /app\ncd /app\nwrite app-stage/server.py server.py\n");
    cmds.push_str("write app-stage/init init\nsif init mode 0100755\nmkdir data\ncd data\n");
    for i in 0..APP_DATA_FILES {
        let name = format!("part{i:02}.bin");
        std::fs::write(stage.join("data").join(&name), app_data(i)).map_err(|e| io(&name, e))?;
        cmds.push_str(&format!("write app-stage/data/{name} {name}\n"));
    }
    std::fs::write(dir.join("app.debugfs"), cmds).map_err(|e| io("app.debugfs", e))?;
    // The base filesystem, copied and changed; base.raw may be gone (a cached base).
    if !dir.join("base.raw").exists() {
        sh(dir, "qemu-img", &["convert", "-f", "qcow2", "-O", "raw", "base.qcow2", "base.raw"])?;
    }
    let _ = std::fs::remove_file(dir.join("app.raw"));
    sh(dir, "cp", &["--sparse=always", "base.raw", "app.raw"])?;
    sh(dir, "debugfs", &["-w", "-f", "app.debugfs", "app.raw"])?;
    let _ = std::fs::remove_file(dir.join("app.qcow2.tmp"));
    sh(dir, "qemu-img", &["create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", "app.qcow2.tmp"])?;
    let runs = changed_runs(&dir.join("base.raw"), &dir.join("app.raw"))?;
    // Each changed run goes in through qemu-io (one session, commands on stdin).
    let chunks = stage.join("runs");
    std::fs::create_dir_all(&chunks).map_err(|e| io(chunks.display(), e))?;
    let app = std::fs::File::open(dir.join("app.raw")).map_err(|e| io("app.raw", e))?;
    let mut script = String::new();
    for (i, &(at, len)) in runs.iter().enumerate() {
        let mut buf = vec![0u8; len as usize];
        std::os::unix::fs::FileExt::read_exact_at(&app, &mut buf, at).map_err(|e| io("app.raw", e))?;
        let f = chunks.join(format!("{i}"));
        std::fs::write(&f, &buf).map_err(|e| io(f.display(), e))?;
        script.push_str(&format!("write -q -s {} {at} {len}\n", f.display()));
    }
    script.push_str("quit\n");
    let mut child = Command::new("qemu-io")
        .args(["-f", "qcow2", "app.qcow2.tmp"])
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| io("running qemu-io (install qemu-utils)", e))?;
    std::io::Write::write_all(child.stdin.as_mut().expect("piped"), script.as_bytes()).map_err(|e| io("qemu-io", e))?;
    let status = child.wait().map_err(|e| io("qemu-io", e))?;
    if !status.success() {
        return Err(CliError::Usage(format!("qemu-io writing the app layer failed ({status})")));
    }
    // The layer must read back exactly as the changed filesystem.
    sh(dir, "qemu-img", &["compare", "-q", "-f", "qcow2", "-F", "raw", "app.qcow2.tmp", "app.raw"])?;
    std::fs::rename(dir.join("app.qcow2.tmp"), dir.join("app.qcow2")).map_err(|e| io("app.qcow2", e))?;
    for f in ["app.raw", "base.raw", "app.debugfs"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    std::fs::remove_dir_all(&stage).map_err(|e| io(stage.display(), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_load_after_their_dependencies_once_each_and_builtins_are_skipped() {
        let d = std::env::temp_dir().join(format!("advm-vm-modules-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("kernel/fs")).unwrap();
        let ko = |name: &str, deps: &str| {
            std::fs::write(
                d.join(format!("kernel/fs/{name}.ko")),
                format!("\x7fELF..\0license=GPL\0depends={deps}\0x"),
            )
            .unwrap();
        };
        ko("ext4", "jbd2,mbcache,crc16");
        ko("jbd2", "");
        ko("mbcache", "");
        ko("crc16", "");
        ko("virtio-pmem", "nd_virtio,libnvdimm");
        ko("nd_virtio", "libnvdimm");
        ko("libnvdimm", "");
        let order: Vec<String> = module_order(&d, &["virtio_pmem", "ext4", "built_in_one"])
            .unwrap()
            .iter()
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(order, ["libnvdimm", "nd_virtio", "virtio-pmem", "jbd2", "mbcache", "crc16", "ext4"]);
    }
}
